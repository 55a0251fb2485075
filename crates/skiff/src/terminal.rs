//! The local terminal for `-t` sessions: its size, raw mode (restored on
//! drop) and window-size changes (SIGWINCH).

use skiff_engine::WindowSize;

/// Columns and rows of the terminal on stdin, if it is one.
pub fn window_size() -> Option<(u32, u32)> {
    // SAFETY: TIOCGWINSZ fills the winsize we own.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 {
            Some((ws.ws_col as u32, ws.ws_row as u32))
        } else {
            None
        }
    }
}

/// The terminal in raw mode; the saved settings come back on drop.
pub struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    pub fn enter() -> Option<RawMode> {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with termios structs we own.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSADRAIN, &raw) != 0 {
                return None;
            }
            Some(RawMode { saved })
        }
    }

    /// The terminal's settings from before raw mode.
    pub fn saved(&self) -> libc::termios {
        self.saved
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings saved in `enter`.
        unsafe {
            libc::tcsetattr(0, libc::TCSADRAIN, &self.saved);
        }
    }
}

/// A stream of new window sizes, fed by SIGWINCH.
pub fn watch_resize() -> Option<tokio::sync::mpsc::Receiver<WindowSize>> {
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while winch.recv().await.is_some() {
            if let Some((cols, rows)) = window_size() {
                if tx.send(WindowSize { cols, rows }).await.is_err() {
                    break;
                }
            }
        }
    });
    Some(rx)
}

static WINCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_winch(_: libc::c_int) {
    WINCH.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// For blocking code (the agent client): a SIGWINCH handler that only sets a
/// flag, and a poll that returns the new size once per change.
pub fn install_winch_flag() -> impl FnMut() -> Option<(u32, u32)> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGWINCH, on_winch as *const () as libc::sighandler_t);
    }
    || {
        if WINCH.swap(false, std::sync::atomic::Ordering::SeqCst) {
            window_size()
        } else {
            None
        }
    }
}
