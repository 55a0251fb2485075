//! Client errors: a kind (what failed) and one line telling the user what
//! happened and what to do. Every kind maps to exit status 255, as in ssh.
//!
//! A message is often built from a server's words (a refusal, a disconnect
//! reason, a file name it listed), so it is made safe to show at
//! construction: [`SkiffError::new`] and [`SkiffError::with_message`] escape
//! whatever could steer a terminal ([`skiff_proto::terminal_text::one_line`]),
//! and whoever prints or logs an error gets that safe text.

use std::borrow::Cow;
use std::fmt;

use skiff_proto::terminal_text;

/// What went wrong, for exit codes, summaries and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad configuration or command line (names file:line where it can).
    Config,
    /// Name resolution, TCP connect, timeout, or the connection dropped.
    Connect,
    /// The server accepted the connection and closed it before
    /// authentication, before or during the key exchange: how sshd and
    /// skiffd drop connections beyond `MaxStartups`, and how a busy bastion
    /// answers. Another try a moment later may get in (see [`crate::busy`]).
    Busy,
    /// The server's host key was refused (unknown, changed or revoked).
    HostKey,
    /// No identity was accepted.
    Auth,
    /// The server misbehaved or refused a request.
    Protocol,
    /// The server refused to open another session channel on this connection
    /// (e.g. OpenSSH's MaxSessions); another connection may succeed.
    ChannelRefused,
    /// The server closed a session channel without answering its command's
    /// request and without a word from the command: nothing ran, and the
    /// command may be run on another channel (the pool does, for a channel
    /// it had opened ahead, when no input was sent).
    ClosedBeforeStart,
    /// The command ran longer than its time limit and was stopped.
    Timeout,
    /// The server refused a request on an authenticated connection: a
    /// subsystem (`sftp`, skiff's data plane), a shell, a command, or a
    /// data-plane mode. A copy whose server refuses the data-plane
    /// subsystem falls back to SFTP.
    Refused,
}

impl ErrorKind {
    /// A short lowercase name, for summaries and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Connect => "unreachable",
            ErrorKind::Busy => "refused-busy",
            ErrorKind::HostKey => "host-key",
            ErrorKind::Auth => "auth",
            ErrorKind::Protocol => "protocol",
            ErrorKind::ChannelRefused => "channel-refused",
            ErrorKind::ClosedBeforeStart => "closed-before-start",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Refused => "refused",
        }
    }
}

/// A user-facing error.
#[derive(Debug, Clone)]
pub struct SkiffError {
    pub kind: ErrorKind,
    /// One line, safe to show on a terminal or in a log: set it through
    /// [`SkiffError::new`] or [`SkiffError::with_message`], which escape
    /// control characters, never by assignment.
    pub message: String,
    /// A person could settle this (an unknown host key to confirm, a key
    /// passphrase to type) where it was refused only for lack of one
    /// (BatchMode). The agent hands such calls back to the CLI.
    pub needs_person: bool,
}

impl SkiffError {
    /// An error of `kind` saying `message`, with anything in it that could
    /// steer a terminal (escape sequences, carriage returns, newlines,
    /// direction overrides) shown escaped.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        SkiffError {
            kind,
            message: safe_line(message.into()),
            needs_person: false,
        }
    }

    /// The same error (kind, [`SkiffError::needs_person`]) saying `message`
    /// instead, made safe as [`SkiffError::new`] does.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = safe_line(message.into());
        self
    }

    /// Marks the error as one a person could settle (see [`SkiffError::needs_person`]).
    pub fn needing_person(mut self) -> Self {
        self.needs_person = true;
        self
    }
}

/// `text` as [`terminal_text::one_line`] shows it, without copying text
/// that needs no escaping.
fn safe_line(text: String) -> String {
    match terminal_text::one_line(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(escaped) => escaped,
    }
}

impl fmt::Display for SkiffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Escaped again in case the field was assigned directly; text
        // already escaped is left as it is.
        f.write_str(&terminal_text::one_line(&self.message))
    }
}

impl std::error::Error for SkiffError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_words_are_escaped_at_construction() {
        let e = SkiffError::new(
            ErrorKind::Protocol,
            "h1: refused: \u{1b}[1A\u{1b}[2Kall good\rnext",
        );
        assert_eq!(
            e.message,
            "h1: refused: \\u{1b}[1A\\u{1b}[2Kall good\\rnext"
        );
        assert_eq!(e.to_string(), e.message);
        assert!(!e.message.contains('\u{1b}'));
        // Plain messages are kept exactly.
        let plain = SkiffError::new(ErrorKind::Auth, "h1: Permission denied (publickey)");
        assert_eq!(plain.message, "h1: Permission denied (publickey)");
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = SkiffError::new(ErrorKind::Connect, "bye\u{1b}]52;c;aGk=\u{7}\n");
        let twice = SkiffError::new(once.kind, once.message.clone());
        assert_eq!(once.message, twice.message);
        assert_eq!(once.to_string(), twice.to_string());
    }

    #[test]
    fn a_new_message_is_escaped_and_keeps_the_rest() {
        let e = SkiffError::new(ErrorKind::HostKey, "unknown key")
            .needing_person()
            .with_message("certificate \u{202e}txt.exe; unknown key");
        assert_eq!(e.kind, ErrorKind::HostKey);
        assert!(e.needs_person);
        assert_eq!(e.message, "certificate \\u{202e}txt.exe; unknown key");
    }

    #[test]
    fn display_escapes_a_message_assigned_directly() {
        let mut e = SkiffError::new(ErrorKind::Protocol, "x");
        e.message = "a\u{1b}[2Jb".into();
        assert_eq!(e.to_string(), "a\\u{1b}[2Jb");
    }
}
