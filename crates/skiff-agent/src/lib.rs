//! The skiff agent: a per-user daemon on a private Unix socket that keeps
//! authenticated connections warm and runs commands for `skiff` processes,
//! which hand it their stdin, stdout and stderr (SCM_RIGHTS).
//!
//! [`socket`] holds the filesystem and socket security (0700 directory,
//! 0600 socket, peer uid check, fd passing, the spawn lock); [`daemon`] the
//! agent itself; [`client`] what the `skiff` CLI uses to reach it.

pub mod client;
pub mod daemon;
pub mod socket;

use skiff_engine::ErrorKind;

/// An error kind as the agent protocol numbers it (see `agent_wire::Reply::Failed`).
pub fn wire_kind(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Config => 1,
        ErrorKind::Connect => 2,
        ErrorKind::HostKey => 3,
        ErrorKind::Auth => 4,
        ErrorKind::Protocol => 5,
        ErrorKind::ChannelRefused => 6,
        ErrorKind::Timeout => 7,
        ErrorKind::Busy => 8,
        ErrorKind::Refused => 9,
        ErrorKind::ClosedBeforeStart => 10,
    }
}

/// The error kind for a protocol number; unknown numbers count as protocol errors.
pub fn kind_from_wire(code: u8) -> ErrorKind {
    match code {
        1 => ErrorKind::Config,
        2 => ErrorKind::Connect,
        3 => ErrorKind::HostKey,
        4 => ErrorKind::Auth,
        6 => ErrorKind::ChannelRefused,
        7 => ErrorKind::Timeout,
        8 => ErrorKind::Busy,
        9 => ErrorKind::Refused,
        10 => ErrorKind::ClosedBeforeStart,
        _ => ErrorKind::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_survive_the_wire() {
        for kind in [
            ErrorKind::Config,
            ErrorKind::Connect,
            ErrorKind::HostKey,
            ErrorKind::Auth,
            ErrorKind::Protocol,
            ErrorKind::ChannelRefused,
            ErrorKind::Timeout,
            ErrorKind::Busy,
            ErrorKind::Refused,
            ErrorKind::ClosedBeforeStart,
        ] {
            assert_eq!(kind_from_wire(wire_kind(kind)), kind);
        }
        assert_eq!(kind_from_wire(0), ErrorKind::Protocol);
        assert_eq!(kind_from_wire(200), ErrorKind::Protocol);
    }
}
