//! Which I/O errors mean that the other end of a connection went away
//! (closed it, reset it, or vanished) rather than that something was said
//! or done wrong. skiff tells a server that drops a connection it will not
//! authenticate now from a failure; skiffd tells a client that left without
//! a disconnect message from a fault of its own. One list serves both.

use std::io::ErrorKind;

/// Whether an error of this kind, on a connection's socket, is the peer
/// going away.
pub fn is_peer_close(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_or_reset_is_the_peer_going_away_and_nothing_else_is() {
        for kind in [
            ErrorKind::UnexpectedEof,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
        ] {
            assert!(is_peer_close(kind), "{kind:?}");
        }
        for kind in [
            ErrorKind::InvalidData,
            ErrorKind::PermissionDenied,
            ErrorKind::TimedOut,
            ErrorKind::Other,
        ] {
            assert!(!is_peer_close(kind), "{kind:?}");
        }
    }
}
