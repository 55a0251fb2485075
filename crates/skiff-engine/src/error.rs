//! Client errors: a kind (what failed) and one line telling the user what
//! happened and what to do. Every kind maps to exit status 255, as in ssh.

use std::fmt;

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
    /// The command ran longer than its time limit and was stopped.
    Timeout,
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
            ErrorKind::Timeout => "timeout",
        }
    }
}

/// A user-facing error.
#[derive(Debug, Clone)]
pub struct SkiffError {
    pub kind: ErrorKind,
    pub message: String,
    /// A person could settle this (an unknown host key to confirm, a key
    /// passphrase to type) where it was refused only for lack of one
    /// (BatchMode). The agent hands such calls back to the CLI.
    pub needs_person: bool,
}

impl SkiffError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        SkiffError {
            kind,
            message: message.into(),
            needs_person: false,
        }
    }

    /// Marks the error as one a person could settle (see [`SkiffError::needs_person`]).
    pub fn needing_person(mut self) -> Self {
        self.needs_person = true;
        self
    }
}

impl fmt::Display for SkiffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SkiffError {}
