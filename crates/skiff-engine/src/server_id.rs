//! The server's SSH identification line (`SSH-2.0-skiffd_0.1.0`, RFC 4253
//! section 4.2), recorded as the connection's first bytes pass through to
//! russh, which keeps it to itself. skiff uses it to tell a skiffd, which
//! understands skiff's extensions, from any other server. The last line a
//! server sent before it (OpenSSH's sshd says `Exceeded MaxStartups` that
//! way before it drops a connection) is kept too, for messages.

use std::sync::{Arc, Mutex, OnceLock};

use crate::read_tap::{ReadTap, Tap};

/// Longest line kept (RFC 4253 allows 255 bytes including CR LF).
const MAX_LINE: usize = 255;

/// The scan of the server's first lines: lines before the identification
/// (RFC 4253 allows them) are skipped, the last one kept.
#[derive(Debug, Default)]
struct Seen {
    line: Vec<u8>,
    /// The last whole line before the identification, without CR LF.
    other: Option<String>,
}

impl Seen {
    /// Looks at `bytes`; the identification line without CR LF once it is
    /// complete.
    fn feed(&mut self, bytes: &[u8]) -> Option<String> {
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                if line.starts_with(b"SSH-") {
                    return Some(String::from_utf8_lossy(line).into_owned());
                }
                self.other = Some(String::from_utf8_lossy(line).into_owned());
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
        None
    }
}

/// What software a server runs, as far as skiff's choices need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// skiffd: it serves the data plane.
    Skiffd,
    /// OpenSSH's sshd.
    OpenSsh,
    /// Any other server, or one whose software is not known.
    Other,
}

/// The agent's protocol carries a [`ServerKind`] as its own type.
impl From<ServerKind> for skiff_proto::agent_wire::ServerKind {
    fn from(kind: ServerKind) -> Self {
        match kind {
            ServerKind::Skiffd => Self::Skiffd,
            ServerKind::OpenSsh => Self::OpenSsh,
            ServerKind::Other => Self::Other,
        }
    }
}

impl From<skiff_proto::agent_wire::ServerKind> for ServerKind {
    fn from(kind: skiff_proto::agent_wire::ServerKind) -> Self {
        use skiff_proto::agent_wire::ServerKind as Wire;
        match kind {
            Wire::Skiffd => Self::Skiffd,
            Wire::OpenSsh => Self::OpenSsh,
            Wire::Other => Self::Other,
        }
    }
}

/// Where a [`Recording`] stream leaves the identification line.
#[derive(Debug, Clone, Default)]
pub struct ServerId {
    line: Arc<OnceLock<String>>,
    /// The last line before the identification, while it has not come.
    before: Arc<Mutex<Option<String>>>,
}

impl ServerId {
    /// The identification line without CR LF, once it has been read.
    pub fn get(&self) -> Option<&str> {
        self.line.get().map(String::as_str)
    }

    /// The last whole line the server sent before its identification
    /// line, without CR LF, as the server wrote it: make it safe before
    /// showing it (`skiff_proto::terminal_text`).
    pub fn line_before(&self) -> Option<String> {
        self.before
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the server is a skiffd (`SSH-2.0-skiffd_...`).
    pub fn is_skiffd(&self) -> bool {
        self.get()
            .is_some_and(|id| id.starts_with("SSH-2.0-skiffd_"))
    }

    /// Whether the server is OpenSSH's sshd (`SSH-2.0-OpenSSH_...`).
    pub fn is_openssh(&self) -> bool {
        self.get()
            .is_some_and(|id| id.starts_with("SSH-2.0-OpenSSH_"))
    }

    /// The newest data-plane version the server is taken to speak, from
    /// its identification line: 0 for a server that is not a skiffd.
    /// skiffd 0.2.0 brought version 3 (a small download on the channel);
    /// an older skiffd is taken to speak version 2, and one that speaks
    /// only version 1 refuses it, after which a copy asks for version 1.
    pub fn data_plane(&self) -> u32 {
        data_plane_of(self.get())
    }

    /// What the identification line says the server is.
    pub fn kind(&self) -> ServerKind {
        if self.is_skiffd() {
            ServerKind::Skiffd
        } else if self.is_openssh() {
            ServerKind::OpenSsh
        } else {
            ServerKind::Other
        }
    }
}

/// [`ServerId::data_plane`] for an identification line.
fn data_plane_of(line: Option<&str>) -> u32 {
    let Some(software) = line.and_then(|l| l.strip_prefix("SSH-2.0-skiffd_")) else {
        return 0;
    };
    // `MAJOR.MINOR.PATCH`, then perhaps a space and comments.
    let mut numbers = software
        .split([' ', '-', '+'])
        .next()
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().ok());
    use skiff_proto::dataplane::{INLINE_DOWNLOAD_SINCE, INLINE_UPLOAD_SINCE};
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (0, 2) => INLINE_DOWNLOAD_SINCE,
        _ => INLINE_UPLOAD_SINCE,
    }
}

/// The [`Tap`] that records the server's identification line (and the
/// last line before it) in a [`ServerId`]; once the identification is found
/// it looks at nothing more.
pub struct IdTap {
    id: ServerId,
    /// The scan, until the line is found.
    seen: Option<Seen>,
}

impl Tap for IdTap {
    fn saw(&mut self, bytes: &[u8]) {
        let Some(seen) = self.seen.as_mut() else {
            return;
        };
        let found = seen.feed(bytes);
        if let Some(other) = seen.other.take() {
            *self
                .id
                .before
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(other);
        }
        if let Some(line) = found {
            let _ = self.id.line.set(line);
            self.seen = None;
        }
    }
}

/// A stream that records the server's identification line in a
/// [`ServerId`] while passing every byte through unchanged.
pub type Recording<S> = ReadTap<S, IdTap>;

/// `inner`, recording the identification line it reads.
pub fn recording<S>(inner: S) -> (Recording<S>, ServerId) {
    let id = ServerId::default();
    let tap = IdTap {
        id: id.clone(),
        seen: Some(Seen::default()),
    };
    (ReadTap::new(inner, tap), id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(chunks: &[&[u8]]) -> Option<String> {
        let mut s = Seen::default();
        chunks.iter().find_map(|c| s.feed(c))
    }

    #[test]
    fn finds_the_identification_across_reads_and_after_other_lines() {
        assert_eq!(
            seen(&[b"SSH-2.0-skif", b"fd_0.1.0\r\n\x00\x00\x01"]).as_deref(),
            Some("SSH-2.0-skiffd_0.1.0")
        );
        assert_eq!(
            seen(&[b"hello there\r\nSSH-2.0-OpenSSH_9.2\r\nbinary"]).as_deref(),
            Some("SSH-2.0-OpenSSH_9.2")
        );
        assert_eq!(seen(&[b"SSH-2.0-no-newline-yet"]), None);
    }

    #[test]
    fn the_data_plane_version_follows_skiffd_s_release() {
        for (line, version) in [
            ("SSH-2.0-OpenSSH_9.2p1 Debian", 0),
            ("SSH-2.0-skiffd_0.1.0", 2),
            ("SSH-2.0-skiffd_0.1.7 comment", 2),
            ("SSH-2.0-skiffd_garbage", 2),
            ("SSH-2.0-skiffd_0.2.0", 3),
            ("SSH-2.0-skiffd_0.2.1-rc1", 3),
            ("SSH-2.0-skiffd_1.0.0 debian", 3),
        ] {
            assert_eq!(data_plane_of(Some(line)), version, "{line}");
        }
        assert_eq!(data_plane_of(None), 0);
        // This build's own server speaks this build's newest version.
        let own = format!("SSH-2.0-skiffd_{}", env!("CARGO_PKG_VERSION"));
        assert_eq!(
            data_plane_of(Some(&own)),
            skiff_proto::dataplane::VERSION,
            "bump the release that marks the data plane's version"
        );
    }

    #[test]
    fn skiffd_is_told_apart() {
        let id = ServerId::default();
        assert!(!id.is_skiffd());
        id.line.set("SSH-2.0-skiffd_0.1.0".into()).unwrap();
        assert!(id.is_skiffd());
        let other = ServerId::default();
        other
            .line
            .set("SSH-2.0-OpenSSH_9.2p1 Debian".into())
            .unwrap();
        assert!(!other.is_skiffd());
        assert_eq!(id.kind(), ServerKind::Skiffd);
        assert_eq!(other.kind(), ServerKind::OpenSsh);
        assert_eq!(ServerId::default().kind(), ServerKind::Other);
        for kind in [ServerKind::Skiffd, ServerKind::OpenSsh, ServerKind::Other] {
            let wire = skiff_proto::agent_wire::ServerKind::from(kind);
            assert_eq!(
                ServerKind::from(wire),
                kind,
                "{kind:?} through the agent's wire"
            );
        }
    }

    #[tokio::test]
    async fn bytes_pass_through_unchanged() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut far, near) = tokio::io::duplex(64);
        let (mut stream, id) = recording(near);
        far.write_all(b"SSH-2.0-skiffd_9\r\nrest").await.unwrap();
        drop(far);
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"SSH-2.0-skiffd_9\r\nrest");
        assert_eq!(id.get(), Some("SSH-2.0-skiffd_9"));
        assert_eq!(id.line_before(), None);
    }

    /// What OpenSSH's sshd sends before it drops a connection over
    /// MaxStartups is kept, for the message.
    #[tokio::test]
    async fn the_last_line_before_a_close_is_kept() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut far, near) = tokio::io::duplex(64);
        let (mut stream, id) = recording(near);
        far.write_all(b"hello\r\nExceeded Max").await.unwrap();
        far.write_all(b"Startups\r\n").await.unwrap();
        drop(far);
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        assert_eq!(id.get(), None);
        assert_eq!(id.line_before().as_deref(), Some("Exceeded MaxStartups"));
    }
}
