//! `skiff cp`'s progress bar on stderr, which steps aside while the
//! engine asks a person something.

use std::io::Write;
use std::sync::Arc;

use skiff_engine::copy::Progress;
use skiff_engine::prompt_screen;
use skiff_proto::terminal_text::one_line;

/// A progress bar on stderr: bytes, rate and time left. It steps aside
/// whenever the engine asks a person something (a passphrase, a host key),
/// for as long as it lives. Until the first size is known its total is
/// unknown, and the bar is drawn empty (a total of 0 would draw it full).
pub(crate) struct Bar(
    pub(crate) indicatif::ProgressBar,
    // Held for its drop, which ends the stepping aside.
    #[allow(dead_code)] prompt_screen::Registration,
    /// Serialises the first sizing against other sizes added at once.
    std::sync::Mutex<()>,
);

/// How often the bar is redrawn when no bytes move, so that its rate and
/// time left stay true during a stall.
const BAR_TICK: std::time::Duration = std::time::Duration::from_millis(250);

impl Bar {
    pub(crate) fn new() -> Bar {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        let style = indicatif::ProgressStyle::with_template(
            "{wide_msg} {bytes}/{total_bytes} [{bar:24}] {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(BAR_TICK);
        let registration = prompt_screen::hide_while_prompting(Arc::new(BarOnStderr(bar.clone())));
        Bar(bar, registration, std::sync::Mutex::new(()))
    }
}

/// The bar as the engine's prompts see it.
struct BarOnStderr(indicatif::ProgressBar);

impl prompt_screen::TerminalDrawing for BarOnStderr {
    fn hide(&self) {
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::hidden());
        // The bar's last drawing is still on the line the question goes to.
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(b"\r\x1b[2K");
        let _ = stderr.flush();
    }

    fn show(&self) {
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
}

impl Progress for Bar {
    fn add_total(&self, bytes: u64) {
        let _one_at_a_time = self.2.lock().unwrap_or_else(|p| p.into_inner());
        match self.0.length() {
            None => self.0.set_length(bytes),
            Some(_) => self.0.inc_length(bytes),
        }
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }

    fn file_done(&self, path: &str) {
        // A name the server chose, for a download.
        self.0.set_message(one_line(path).into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_shows_a_servers_file_name_escaped() {
        let bar = Bar::new();
        bar.file_done("logs/\u{1b}[1A\u{1b}[2Kok\r.txt");
        assert_eq!(bar.0.message(), "logs/\\u{1b}[1A\\u{1b}[2Kok\\r.txt");
        bar.file_done("logs/plain.txt");
        assert_eq!(bar.0.message(), "logs/plain.txt");
    }
}
