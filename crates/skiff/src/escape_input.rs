//! Escape sequences in a terminal session (`~.`, `~^Z`, `~?`, `~R`): a
//! thread reads what the person types, carries out the escapes
//! ([`skiff_proto::escape`] recognises them) and passes everything else on
//! through a pipe, which the session reads as its input. The session is
//! the same whether it runs here or through the agent: only the pipe's
//! other end changes.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use skiff_proto::escape::{help_text, show_escape_char, EscapeAction, EscapeChar, EscapeScanner};

/// What an escape asks of the session, beyond the terminal itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `~.`: end the session now; the input ends after it.
    Disconnect,
    /// `~R`: a new key exchange.
    Rekey,
}

/// Where requests go: the session, when the connection is this process's
/// own. Without one (the agent's connection), `~.` ends the process and
/// `~R` is declined.
pub type Requests = Option<tokio::sync::mpsc::UnboundedSender<Request>>;

/// The session's input with escapes taken out, when they apply: `setting`
/// is not `none` and a remote terminal is on a local one (`raw` is the
/// local terminal, in raw mode), as in ssh. `None` means the session reads
/// stdin itself: escapes do not apply, or the reading thread could not
/// start (said on stderr).
pub fn filtered_stdin(
    setting: EscapeChar,
    remote_terminal: bool,
    raw: Option<&crate::terminal::RawMode>,
    requests: Requests,
) -> Option<OwnedFd> {
    let EscapeChar::Byte(byte) = setting else {
        return None;
    };
    if !remote_terminal {
        return None;
    }
    start(byte, raw.map(crate::terminal::RawMode::saved), requests)
        .inspect_err(|e| eprintln!("skiff: warning: escape sequences are off: {e}"))
        .ok()
}

/// Starts the reading thread; returns the pipe end the session reads.
/// `terminal` is the terminal's settings from before raw mode, restored
/// while skiff is suspended.
fn start(escape: u8, terminal: Option<libc::termios>, requests: Requests) -> io::Result<OwnedFd> {
    let (reader, writer) = pipe()?;
    std::thread::Builder::new()
        .name("skiff-escapes".into())
        .spawn(move || run(escape, terminal, requests, std::fs::File::from(writer)))?;
    Ok(reader)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which we then own.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        use std::os::fd::FromRawFd;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Copies stdin to `out`, less the escapes, until stdin ends, the session
/// stops reading, or `~.`.
fn run(escape: u8, terminal: Option<libc::termios>, requests: Requests, mut out: std::fs::File) {
    let mut scanner = EscapeScanner::new(escape);
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 4096];
    let mut filtered = Vec::with_capacity(buf.len());
    loop {
        if !wait_for_input(&out) {
            return;
        }
        let n = match stdin.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            filtered.clear();
            let (used, action) = scanner.feed(rest, &mut filtered);
            rest = &rest[used..];
            if out.write_all(&filtered).is_err() {
                return;
            }
            match action {
                None => {}
                Some(EscapeAction::Disconnect) => {
                    match &requests {
                        Some(session) => {
                            let _ = session.send(Request::Disconnect);
                        }
                        None => end_process(terminal.as_ref()),
                    }
                    return;
                }
                Some(EscapeAction::Help) => say(&help_text(escape)),
                Some(EscapeAction::Suspend) => suspend(terminal.as_ref()),
                Some(EscapeAction::Rekey) => match &requests {
                    Some(session) => {
                        let _ = session.send(Request::Rekey);
                    }
                    None => say(&format!(
                        "{}R: the connection is the agent's, which rekeys on its own schedule\r\n",
                        show_escape_char(EscapeChar::Byte(escape))
                    )),
                },
            }
        }
    }
}

/// Waits until stdin has something to read (`true`) or the session has
/// closed its end of the pipe (`false`): then nothing more is read, so
/// what is typed next goes to whoever reads the terminal after skiff.
fn wait_for_input(out: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        },
        // A pipe's write end reports POLLERR once its reader is gone.
        libc::pollfd {
            fd: out.as_raw_fd(),
            events: 0,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: poll on two pollfd structs we own.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents != 0 {
            return true;
        }
    }
}

/// `~.` on the agent's connection: this process is the session's only
/// local end, so it ends, with the terminal restored; the agent closes the
/// channel when this process goes.
fn end_process(terminal: Option<&libc::termios>) -> ! {
    if let Some(saved) = terminal {
        // SAFETY: restores the settings saved before raw mode.
        unsafe {
            libc::tcsetattr(0, libc::TCSADRAIN, saved);
        }
    }
    eprintln!("\nConnection closed.");
    std::process::exit(255)
}

/// A line on the terminal, which is in raw mode.
fn say(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// `~^Z`: stops skiff as a shell job would be stopped, with the terminal's
/// own settings while stopped and raw mode again once continued.
fn suspend(terminal: Option<&libc::termios>) {
    say("[suspend skiff]\r\n");
    // SAFETY: tcgetattr/tcsetattr on fd 0 with termios values we own;
    // kill sends SIGTSTP to this process, which stops it until SIGCONT.
    unsafe {
        let mut raw: libc::termios = std::mem::zeroed();
        let have_raw = libc::tcgetattr(0, &mut raw) == 0;
        if let Some(saved) = terminal {
            libc::tcsetattr(0, libc::TCSADRAIN, saved);
        }
        libc::kill(libc::getpid(), libc::SIGTSTP);
        if have_raw {
            libc::tcsetattr(0, libc::TCSADRAIN, &raw);
        }
    }
}
