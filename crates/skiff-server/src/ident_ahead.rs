//! The server's identification line, written by the listener as it accepts
//! a connection rather than by the connection's process once that process
//! has it.
//!
//! A client sends its `KEXINIT` only after it has read the server's line
//! (russh's client does; so does OpenSSH's, `kex_exchange_identification`).
//! Handing a connection to its process costs a wake-up across processes, so
//! the listener writes the line first and the client's next flight is on
//! its way meanwhile. russh then writes the same line again when the
//! process starts the session; [`IdentAhead`] recognises those bytes and
//! reports them written without writing them twice. Pure, no I/O.

/// The server's identification line, as russh writes it
/// (`SSH-2.0-skiffd_VERSION\r\n`).
pub fn identification_line() -> String {
    format!("{}\r\n", identification())
}

/// The server's identification (no line end), as russh's `server_id`.
pub fn identification() -> String {
    format!("SSH-2.0-{}", crate::SOFTWARE_VERSION)
}

/// The bytes of the identification line already written on a connection,
/// to be skipped when russh writes them.
#[derive(Debug, Default)]
pub struct IdentAhead {
    line: Vec<u8>,
    skipped: usize,
}

/// russh wrote something other than the line the listener already wrote
/// (never expected: both come from [`identification`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the session's first bytes differ from the identification line already sent")]
pub struct Mismatch;

/// More of the line was said to be written than the line holds.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{sent} bytes of the identification line said to be written; it has {len}")]
pub struct TooLong {
    pub sent: usize,
    pub len: usize,
}

impl IdentAhead {
    /// `sent` bytes of [`identification_line`] are already written.
    pub fn new(sent: usize) -> Result<IdentAhead, TooLong> {
        let mut line = identification_line().into_bytes();
        if sent > line.len() {
            return Err(TooLong {
                sent,
                len: line.len(),
            });
        }
        line.truncate(sent);
        Ok(IdentAhead { line, skipped: 0 })
    }

    /// Whether bytes are still to be skipped.
    pub fn pending(&self) -> bool {
        self.skipped < self.line.len()
    }

    /// For a write of `buf`: how many of its first bytes were already
    /// written (to be reported written, and not written again); 0 once the
    /// line is behind.
    pub fn skip(&mut self, buf: &[u8]) -> Result<usize, Mismatch> {
        let left = &self.line[self.skipped..];
        let n = left.len().min(buf.len());
        if buf[..n] != left[..n] {
            return Err(Mismatch);
        }
        self.skipped += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_russh_s_server_id_with_its_line_end() {
        let line = identification_line();
        assert!(line.starts_with("SSH-2.0-skiffd_"));
        assert!(line.ends_with("\r\n"));
        assert_eq!(line.trim_end(), identification());
    }

    #[test]
    fn the_whole_line_is_skipped_once_then_writes_pass() {
        let line = identification_line();
        let mut ahead = IdentAhead::new(line.len()).unwrap();
        assert!(ahead.pending());
        assert_eq!(ahead.skip(line.as_bytes()), Ok(line.len()));
        assert!(!ahead.pending());
        assert_eq!(ahead.skip(b"\0\0\x01\x14kexinit"), Ok(0));
    }

    #[test]
    fn a_line_written_in_pieces_is_skipped_in_pieces() {
        let line = identification_line();
        let mut ahead = IdentAhead::new(line.len()).unwrap();
        assert_eq!(ahead.skip(&line.as_bytes()[..5]), Ok(5));
        // The rest of the line and what follows in one write: only the
        // line's part is skipped.
        let mut rest = line.as_bytes()[5..].to_vec();
        rest.extend_from_slice(b"packet");
        assert_eq!(ahead.skip(&rest), Ok(line.len() - 5));
        assert!(!ahead.pending());
    }

    #[test]
    fn a_partly_written_line_skips_only_that_part() {
        let line = identification_line();
        let mut ahead = IdentAhead::new(3).unwrap();
        assert_eq!(ahead.skip(line.as_bytes()), Ok(3));
        assert_eq!(ahead.skip(&line.as_bytes()[3..]), Ok(0));
    }

    #[test]
    fn nothing_written_skips_nothing() {
        let mut ahead = IdentAhead::new(0).unwrap();
        assert!(!ahead.pending());
        assert_eq!(ahead.skip(identification_line().as_bytes()), Ok(0));
    }

    #[test]
    fn other_bytes_are_a_mismatch_and_too_much_is_refused() {
        let line = identification_line();
        let mut ahead = IdentAhead::new(line.len()).unwrap();
        assert_eq!(ahead.skip(b"SSH-2.0-OpenSSH_9.2\r\n"), Err(Mismatch));
        assert_eq!(
            IdentAhead::new(line.len() + 1).unwrap_err(),
            TooLong {
                sent: line.len() + 1,
                len: line.len()
            }
        );
    }
}
