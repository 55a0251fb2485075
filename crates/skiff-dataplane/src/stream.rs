//! One data-plane stream: a TCP connection carrying sealed records in each
//! direction, and the client's opening of it (magic, token, the server's
//! SSH banner to skip, then the server's authenticated acknowledgement).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use skiff_proto::dataplane::{
    Chunk, Keys, Mode, Opener, RecordError, RecordKind, Sealer, Side, CHUNK_HEADER, MAGIC,
    MAX_RECORD, RECORD_HEADER, TAG_LEN, TOKEN_LEN,
};

/// Bytes of file data in one record.
pub const CHUNK_DATA: usize = MAX_RECORD - CHUNK_HEADER;

const ABORTED: &str = "transfer aborted";

/// Why a stream failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("data stream {stream}: {source}")]
    Io { stream: u32, source: io::Error },
    #[error("data stream {stream}: {source}")]
    Record { stream: u32, source: RecordError },
    #[error("data stream {stream}: {what}")]
    Protocol { stream: u32, what: String },
    /// The server closed the connection before it sent anything: skiffd
    /// turns connections away like that while too many are waiting to
    /// authenticate (`MaxStartups`).
    #[error("data stream {stream}: the server closed it at once (busy: too many connections waiting to authenticate)")]
    Dropped { stream: u32 },
}

impl StreamError {
    fn io(stream: u32, source: io::Error) -> StreamError {
        StreamError::Io { stream, source }
    }

    fn protocol(stream: u32, what: impl Into<String>) -> StreamError {
        StreamError::Protocol {
            stream,
            what: what.into(),
        }
    }

    /// The server had closed the connection by the time something was
    /// written to it (a stream dialed early that waited too long, or one
    /// turned away): the same token may go out on a new connection, since
    /// the server never read it.
    pub fn is_closed_under_us(&self) -> bool {
        matches!(
            self,
            StreamError::Io { source, .. }
                if matches!(
                    source.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                )
        )
    }

    /// True when the peer altered or forged a record.
    pub fn is_integrity(&self) -> bool {
        matches!(
            self,
            StreamError::Record {
                source: RecordError::BadTag,
                ..
            }
        )
    }

    /// The server turned the connection away before saying anything (see
    /// [`StreamError::Dropped`]): another try may get in.
    pub fn is_dropped(&self) -> bool {
        matches!(self, StreamError::Dropped { .. })
    }

    /// A stream that stopped because another one failed (the transfer was
    /// aborted), rather than the failure itself.
    pub fn is_consequence(&self) -> bool {
        matches!(self, StreamError::Protocol { what, .. } if what == ABORTED)
    }

    pub(crate) fn aborted(stream: u32) -> StreamError {
        StreamError::protocol(stream, ABORTED)
    }
}

/// The sending half of a stream.
pub struct RecordWriter {
    sock: TcpStream,
    sealer: Sealer,
    stream: u32,
    buf: Vec<u8>,
}

impl RecordWriter {
    pub fn new(sock: TcpStream, keys: &Keys, side: Side, mode: Mode, stream: u32) -> Self {
        RecordWriter {
            sock,
            sealer: Sealer::new(keys, side, mode, stream),
            stream,
            buf: vec![0u8; RECORD_HEADER + MAX_RECORD + TAG_LEN],
        }
    }

    fn send(&mut self, kind: RecordKind, payload_len: usize) -> Result<(), StreamError> {
        let n = self
            .sealer
            .seal(kind, &mut self.buf, payload_len)
            .map_err(|source| StreamError::Record {
                stream: self.stream,
                source,
            })?;
        self.sock
            .write_all(&self.buf[..n])
            .map_err(|e| StreamError::io(self.stream, e))
    }

    /// Reads `len` bytes of `file` at `offset` straight into the record
    /// buffer and sends them as one record. A file that became shorter is an
    /// `UnexpectedEof` error (for that file, not the stream).
    pub fn send_chunk(
        &mut self,
        file_id: u32,
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> Result<(), ChunkError> {
        assert!(len <= CHUNK_DATA);
        let mut head = [0u8; CHUNK_HEADER];
        Chunk {
            file: file_id,
            offset,
        }
        .encode(&mut head);
        let start = RECORD_HEADER + CHUNK_HEADER;
        self.buf[RECORD_HEADER..start].copy_from_slice(&head);
        file.read_exact_at(&mut self.buf[start..start + len], offset)
            .map_err(ChunkError::File)?;
        self.send(RecordKind::Data, CHUNK_HEADER + len)
            .map_err(ChunkError::Stream)
    }

    /// The authenticated end of this direction.
    pub fn send_end(&mut self) -> Result<(), StreamError> {
        self.send(RecordKind::End, 0)?;
        let _ = self.sock.flush();
        Ok(())
    }

    pub fn send_ack(&mut self) -> Result<(), StreamError> {
        self.send(RecordKind::Ack, 0)
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The stream's socket, for a [`crate::StreamWatch`].
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// Sending a chunk failed: reading the file (that file fails) or the stream
/// (the transfer fails).
#[derive(Debug)]
pub enum ChunkError {
    File(io::Error),
    Stream(StreamError),
}

/// A record as received.
#[derive(Debug)]
pub enum Record<'a> {
    Data(Chunk, &'a [u8]),
    End,
    Ack,
}

/// The receiving half of a stream.
pub struct RecordReader {
    sock: TcpStream,
    opener: Opener,
    stream: u32,
    buf: Vec<u8>,
}

impl RecordReader {
    pub fn new(sock: TcpStream, keys: &Keys, sender: Side, mode: Mode, stream: u32) -> Self {
        RecordReader {
            sock,
            opener: Opener::new(keys, sender, mode, stream),
            stream,
            buf: vec![0u8; RECORD_HEADER + MAX_RECORD + TAG_LEN],
        }
    }

    /// The next record. A connection that ends before an `End` record is an
    /// error: truncation never passes for a complete transfer.
    pub fn next_record(&mut self) -> Result<Record<'_>, StreamError> {
        let stream = self.stream;
        let mut head = [0u8; RECORD_HEADER];
        self.sock.read_exact(&mut head).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                StreamError::protocol(stream, "connection closed before the end-of-stream record")
            } else {
                StreamError::io(stream, e)
            }
        })?;
        let header = self
            .opener
            .header(&head)
            .map_err(|source| StreamError::Record { stream, source })?;
        let total = RECORD_HEADER + header.payload_len + self.opener.tag_len();
        self.buf[..RECORD_HEADER].copy_from_slice(&head);
        self.sock
            .read_exact(&mut self.buf[RECORD_HEADER..total])
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    StreamError::protocol(stream, "connection closed in the middle of a record")
                }
                _ => StreamError::io(stream, e),
            })?;
        let (header, payload) = self
            .opener
            .open(&mut self.buf[..total])
            .map_err(|source| StreamError::Record { stream, source })?;
        Ok(match header.kind {
            RecordKind::End => Record::End,
            RecordKind::Ack => Record::Ack,
            RecordKind::Data => {
                let (chunk, bytes) = Chunk::decode(payload).ok_or_else(|| {
                    StreamError::protocol(stream, "data record shorter than its chunk header")
                })?;
                Record::Data(chunk, bytes)
            }
        })
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The stream's socket, for a [`crate::StreamWatch`].
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }
}

/// How long the client waits for a stream's acknowledgement.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// Connects stream `index` to a skiffd at `addr` and sends the magic, which
/// is the same for every stream: a client may dial before it holds the
/// stream's token (while the server's `Welcome` is on its way), and present
/// the token once it comes. skiffd waits 3 s after the magic for the token
/// (`TOKEN_WAIT`); [`Dialed::age`] tells whether that is still safe.
pub fn dial(addr: SocketAddr, index: u32) -> Result<Dialed, StreamError> {
    let dialed = connect(addr, index)?;
    (&dialed.sock)
        .write_all(&MAGIC)
        .map_err(|e| StreamError::io(index, e))?;
    Ok(Dialed {
        magic_sent: true,
        ..dialed
    })
}

/// Connects stream `index` to a skiffd at `addr`, the token at hand: the
/// magic goes out with it, in one write, when it is presented.
pub fn connect(addr: SocketAddr, index: u32) -> Result<Dialed, StreamError> {
    let io = |e| StreamError::io(index, e);
    let dialed_at = std::time::Instant::now();
    let sock = TcpStream::connect_timeout(&addr, OPEN_TIMEOUT).map_err(io)?;
    sock.set_nodelay(true).map_err(io)?;
    Ok(Dialed {
        sock,
        index,
        dialed_at,
        magic_sent: false,
    })
}

/// A stream connected, waiting for its token.
#[derive(Debug)]
pub struct Dialed {
    sock: TcpStream,
    index: u32,
    dialed_at: std::time::Instant,
    /// Whether the magic went out at once ([`dial`]).
    magic_sent: bool,
}

impl Dialed {
    /// How long ago the dial began (before the connection was made, so the
    /// server's 3 s wait for the token began no earlier).
    pub fn age(&self) -> Duration {
        self.dialed_at.elapsed()
    }

    /// Presents `token`, skips the SSH identification line skiffd writes on
    /// every connection, and waits for the server's acknowledgement record
    /// (which proves the server holds the session keys). Returns the two
    /// halves.
    pub fn present(
        self,
        token: &[u8; TOKEN_LEN],
        keys: &Keys,
        mode: Mode,
    ) -> Result<(RecordWriter, RecordReader), StreamError> {
        let (writer, pending) = self.present_early(token, keys, mode)?;
        Ok((writer, pending.acknowledged()?))
    }

    /// Presents `token` without waiting for the acknowledgement. Records
    /// the writer sends before it are sealed with the session's keys, so
    /// only the transfer process can open them; the caller must still see
    /// [`Unacknowledged::acknowledged`] succeed before it counts the
    /// transfer as done.
    pub fn present_early(
        self,
        token: &[u8; TOKEN_LEN],
        keys: &Keys,
        mode: Mode,
    ) -> Result<(RecordWriter, Unacknowledged), StreamError> {
        let Dialed {
            sock,
            index,
            magic_sent,
            ..
        } = self;
        let io = |e| StreamError::io(index, e);
        let mut hello = Vec::with_capacity(MAGIC.len() + TOKEN_LEN);
        if !magic_sent {
            hello.extend_from_slice(&MAGIC);
        }
        hello.extend_from_slice(token);
        (&sock).write_all(&hello).map_err(io)?;
        sock.set_read_timeout(Some(OPEN_TIMEOUT)).map_err(io)?;
        let reader = RecordReader::new(
            sock.try_clone().map_err(io)?,
            keys,
            Side::Server,
            mode,
            index,
        );
        let writer = RecordWriter::new(sock, keys, Side::Client, mode, index);
        Ok((writer, Unacknowledged { reader }))
    }
}

/// A stream whose token went out and whose acknowledgement is not read yet.
pub struct Unacknowledged {
    reader: RecordReader,
}

impl Unacknowledged {
    /// Waits (at most 15 s) for the server's acknowledgement record and
    /// returns the stream's reading half.
    pub fn acknowledged(mut self) -> Result<RecordReader, StreamError> {
        let index = self.reader.stream;
        let io = |e| StreamError::io(index, e);
        let refused = || {
            StreamError::protocol(
                index,
                "the server refused the stream (unknown, used or expired token, or another peer)",
            )
        };
        skip_banner(&self.reader.sock).map_err(|e| match e {
            Banner::Dropped => StreamError::Dropped { stream: index },
            Banner::NotSsh => {
                StreamError::protocol(index, "the server did not identify as an SSH server")
            }
            Banner::Io(e) => match e.kind() {
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => refused(),
                _ => io(e),
            },
        })?;
        match self.reader.next_record() {
            Ok(Record::Ack) => {}
            Ok(_) => {
                return Err(StreamError::protocol(
                    index,
                    "the server did not acknowledge the stream",
                ))
            }
            Err(StreamError::Protocol { .. }) => return Err(refused()),
            // Records already sent make a refusing server reset the
            // connection rather than just close it.
            Err(StreamError::Io { source, .. })
                if source.kind() == io::ErrorKind::ConnectionReset =>
            {
                return Err(refused())
            }
            Err(e) => return Err(e),
        }
        self.reader.sock.set_read_timeout(None).map_err(io)?;
        Ok(self.reader)
    }
}

/// Why the server's identification line was not there.
enum Banner {
    /// Closed (or reset) before a single byte: turned away.
    Dropped,
    /// Something other than `SSH-...`.
    NotSsh,
    Io(io::Error),
}

/// Reads and discards skiffd's `SSH-...\r\n` identification line, byte by
/// byte so nothing after it is consumed (it is short and sent once).
fn skip_banner(mut sock: &TcpStream) -> Result<(), Banner> {
    let mut line = Vec::with_capacity(64);
    loop {
        let mut b = [0u8; 1];
        match sock.read(&mut b) {
            // Nothing at all came: turned away before the identification
            // (a refused token is closed only after it).
            Ok(0) if line.is_empty() => return Err(Banner::Dropped),
            Err(e) if line.is_empty() && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Banner::Dropped)
            }
            Ok(0) => {
                return Err(Banner::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before the server's identification",
                )))
            }
            Ok(_) => {}
            // A read with a timeout is not restarted after a signal (nor
            // after the process was stopped and continued, Ctrl-Z and
            // `fg`): read again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Banner::Io(e)),
        }
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
        if line.len() > 255 {
            break;
        }
    }
    if !line.starts_with(b"SSH-") || line.len() > 255 {
        return Err(Banner::NotSsh);
    }
    Ok(())
}
