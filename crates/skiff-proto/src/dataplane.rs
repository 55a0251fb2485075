//! The skiff data plane, sans-IO: the record layer (framing, AES-256-GCM
//! sealing in place, nonces, end-of-stream), the key schedule, stream
//! tokens, the control messages exchanged inside the SSH session, and the
//! messages between skiffd and the transfer process it starts.
//!
//! The wire format is specified in `docs/data-plane.md`; this module is its
//! reference implementation. Nothing here does I/O.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use aws_lc_rs::hkdf;

use crate::frame::{split_frame, Reader, WireError, Writer};

/// The SSH subsystem a skiff client asks for to set up the data plane.
pub const SUBSYSTEM: &str = "transfer@skiff";

/// What a data-plane TCP connection sends first, so that skiffd tells it
/// apart from SSH (whose clients begin with `SSH-`).
pub const MAGIC: [u8; 8] = *b"SKIFFDP\x01";

/// Bytes in a stream token.
pub const TOKEN_LEN: usize = 32;

/// Bytes in each side's key-exchange secret.
pub const SECRET_LEN: usize = 32;

/// The largest record payload.
pub const MAX_RECORD: usize = 1 << 20;

/// Bytes in a record header.
pub const RECORD_HEADER: usize = 8;

/// Bytes in an authentication tag.
pub const TAG_LEN: usize = 16;

/// Bytes at the front of a data record's payload naming the file and offset.
pub const CHUNK_HEADER: usize = 12;

/// The newest version of the control protocol this build speaks.
///
/// - Version 2 adds files carried on the control channel itself
///   ([`ClientMsg::Data`]) and `Hello` with no streams (an upload that
///   needs none).
/// - Version 3 lets the server answer a small download on the control
///   channel too ([`ClientMsg::Get`] with `inline` limits, answered by a
///   `Welcome` without tokens and [`ServerMsg::Data`]). A version-3 client
///   sends its request right behind `Hello`, and the server reads it
///   before it answers, to choose.
pub const VERSION: u32 = 3;

/// The first version whose upload may come on the control channel alone.
pub const INLINE_UPLOAD_SINCE: u32 = 2;

/// The first version whose download may come on the control channel.
pub const INLINE_DOWNLOAD_SINCE: u32 = 3;

/// The oldest version a skiffd still serves (and skiff falls back to when
/// a skiffd refuses version 2).
pub const OLDEST_VERSION: u32 = 1;

/// The most file bytes one [`ClientMsg::Data`] carries: well under a
/// control frame's limit, and small enough that a file's bytes interleave
/// with other messages.
pub const INLINE_CHUNK: usize = 64 * 1024;

/// A file's `bytes` as they go on the control channel, whichever end sends
/// them: pieces of at most [`INLINE_CHUNK`], each with its offset (none
/// for an empty file).
pub fn inline_pieces(bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    bytes
        .chunks(INLINE_CHUNK)
        .enumerate()
        .map(|(i, piece)| ((i * INLINE_CHUNK) as u64, piece))
}

/// Records one stream may carry in one direction under one key: far more
/// than any transfer needs, and far below AES-GCM's limits.
pub const MAX_RECORDS_PER_STREAM: u64 = 1 << 32;

/// How bulk bytes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Encrypted and authenticated (AES-256-GCM).
    Aead,
    /// Authenticated only: bytes travel in clear with a GMAC tag.
    Integrity,
    /// Neither: only after authentication, only where policy allows.
    None,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Aead => "aead",
            Mode::Integrity => "integrity",
            Mode::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "aead" => Some(Mode::Aead),
            "integrity" => Some(Mode::Integrity),
            "none" => Some(Mode::None),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            Mode::Aead => 0,
            Mode::Integrity => 1,
            Mode::None => 2,
        }
    }

    fn from_code(c: u8) -> Result<Mode, WireError> {
        match c {
            0 => Ok(Mode::Aead),
            1 => Ok(Mode::Integrity),
            2 => Ok(Mode::None),
            _ => Err(WireError::BadValue("data-plane mode")),
        }
    }

    /// Tag bytes per record in this mode.
    pub fn tag_len(self) -> usize {
        match self {
            Mode::None => 0,
            _ => TAG_LEN,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Payload bytes.
    Data,
    /// The sender's last record on this stream (empty payload).
    End,
    /// Sent once by the server when it takes a stream: proves it holds the keys.
    Ack,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Data => 0,
            RecordKind::End => 1,
            RecordKind::Ack => 2,
        }
    }
}

/// Why a record was refused. Any of these ends the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record length {0} exceeds the limit of {MAX_RECORD} bytes")]
    TooLong(usize),
    #[error("unknown record type {0}")]
    UnknownKind(u8),
    #[error("record header has non-zero reserved bytes")]
    Reserved,
    #[error("an {0} record must be empty")]
    NotEmpty(&'static str),
    #[error("integrity check failed: the record was altered, replayed or reordered")]
    BadTag,
    #[error("record buffer too small")]
    Buffer,
    #[error("too many records on one stream")]
    Exhausted,
}

/// Which end of the data plane a key or sealer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// The two directional keys of one data-plane session.
pub struct Keys {
    client_to_server: [u8; 32],
    server_to_client: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// HKDF output length for a 32-byte key.
struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        32
    }
}

/// Derives the directional keys from both sides' secrets and the mode
/// (HKDF-SHA256; see the spec for the labels). Binding the mode means a
/// session can never be read with keys meant for another mode.
pub fn derive_keys(
    client_secret: &[u8; SECRET_LEN],
    server_secret: &[u8; SECRET_LEN],
    mode: Mode,
) -> Keys {
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"skiff data plane v1");
    let mut ikm = [0u8; 2 * SECRET_LEN];
    ikm[..SECRET_LEN].copy_from_slice(client_secret);
    ikm[SECRET_LEN..].copy_from_slice(server_secret);
    let prk = salt.extract(&ikm);
    let expand = |label: &[u8]| {
        let info = [label, mode.as_str().as_bytes()];
        let mut out = [0u8; 32];
        prk.expand(&info, KeyLen)
            .and_then(|okm| okm.fill(&mut out))
            .expect("HKDF-SHA256 can produce 32 bytes");
        out
    };
    Keys {
        client_to_server: expand(b"skiff dp client to server key "),
        server_to_client: expand(b"skiff dp server to client key "),
    }
}

fn record_nonce(stream: u32, counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&stream.to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aead_key(bytes: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("32-byte AES-256 key"))
}

/// One direction of one stream: the key, the stream id and the record counter.
struct Direction {
    mode: Mode,
    key: Option<LessSafeKey>,
    stream: u32,
    counter: u64,
}

impl Direction {
    fn new(keys: &Keys, sender: Side, mode: Mode, stream: u32) -> Direction {
        let bytes = match sender {
            Side::Client => &keys.client_to_server,
            Side::Server => &keys.server_to_client,
        };
        Direction {
            mode,
            key: (mode != Mode::None).then(|| aead_key(bytes)),
            stream,
            counter: 0,
        }
    }

    fn next_nonce(&mut self) -> Result<Nonce, RecordError> {
        if self.counter >= MAX_RECORDS_PER_STREAM {
            return Err(RecordError::Exhausted);
        }
        let n = record_nonce(self.stream, self.counter);
        self.counter += 1;
        Ok(n)
    }
}

/// Seals the records one side sends on one stream.
pub struct Sealer(Direction);

impl Sealer {
    /// A sealer for records that `sender` sends on stream `stream`.
    pub fn new(keys: &Keys, sender: Side, mode: Mode, stream: u32) -> Sealer {
        Sealer(Direction::new(keys, sender, mode, stream))
    }

    /// Bytes a record adds around its payload.
    pub fn overhead(&self) -> usize {
        RECORD_HEADER + self.0.mode.tag_len()
    }

    /// Seals a record in place. `buf` holds [`RECORD_HEADER`] bytes of room,
    /// then the payload (`payload_len` bytes), then room for the tag.
    /// Returns how many bytes of `buf` to send.
    pub fn seal(
        &mut self,
        kind: RecordKind,
        buf: &mut [u8],
        payload_len: usize,
    ) -> Result<usize, RecordError> {
        if payload_len > MAX_RECORD {
            return Err(RecordError::TooLong(payload_len));
        }
        if kind != RecordKind::Data && payload_len != 0 {
            return Err(RecordError::NotEmpty("end or ack"));
        }
        let tag_len = self.0.mode.tag_len();
        let total = RECORD_HEADER + payload_len + tag_len;
        if buf.len() < total {
            return Err(RecordError::Buffer);
        }
        let header = encode_header(kind, payload_len);
        buf[..RECORD_HEADER].copy_from_slice(&header);
        let mode = self.0.mode;
        if mode == Mode::None {
            return Ok(total);
        }
        let nonce = self.0.next_nonce()?;
        let key = self.0.key.as_ref().expect("a key in every mode but none");
        let body_end = RECORD_HEADER + payload_len;
        let tag = match mode {
            Mode::Aead => {
                let (head, rest) = buf.split_at_mut(RECORD_HEADER);
                key.seal_in_place_separate_tag(
                    nonce,
                    Aad::from(&head[..]),
                    &mut rest[..payload_len],
                )
            }
            _ => key.seal_in_place_separate_tag(nonce, Aad::from(&buf[..body_end]), &mut []),
        }
        .map_err(|_| RecordError::Buffer)?;
        buf[body_end..total].copy_from_slice(tag.as_ref());
        Ok(total)
    }
}

/// Opens the records one side receives on one stream, in order.
pub struct Opener(Direction);

/// A record header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: RecordKind,
    pub payload_len: usize,
}

impl Opener {
    /// An opener for records that `sender` sent on stream `stream`.
    pub fn new(keys: &Keys, sender: Side, mode: Mode, stream: u32) -> Opener {
        Opener(Direction::new(keys, sender, mode, stream))
    }

    /// Parses a header; the record's remaining bytes are
    /// `payload_len + tag_len()`.
    pub fn header(&self, bytes: &[u8; RECORD_HEADER]) -> Result<Header, RecordError> {
        decode_header(bytes)
    }

    pub fn tag_len(&self) -> usize {
        self.0.mode.tag_len()
    }

    /// Verifies (and in `aead` mode decrypts) a whole record in place:
    /// `record` is the header, payload and tag. Returns the payload.
    pub fn open<'a>(
        &mut self,
        record: &'a mut [u8],
    ) -> Result<(Header, &'a mut [u8]), RecordError> {
        let mut head = [0u8; RECORD_HEADER];
        head.copy_from_slice(record.get(..RECORD_HEADER).ok_or(RecordError::Buffer)?);
        let header = decode_header(&head)?;
        let tag_len = self.0.mode.tag_len();
        let body_end = RECORD_HEADER + header.payload_len;
        if record.len() != body_end + tag_len {
            return Err(RecordError::Buffer);
        }
        match self.0.mode {
            Mode::None => {}
            Mode::Aead => {
                let nonce = self.0.next_nonce()?;
                let key = self.0.key.as_ref().expect("key");
                let (aad, rest) = record.split_at_mut(RECORD_HEADER);
                let (payload, tag) = rest.split_at_mut(header.payload_len);
                key.open_in_place_separate_tag(nonce, Aad::from(&aad[..]), tag, payload)
                    .map_err(|_| RecordError::BadTag)?;
            }
            Mode::Integrity => {
                let nonce = self.0.next_nonce()?;
                let key = self.0.key.as_ref().expect("key");
                let (aad, tag) = record.split_at_mut(body_end);
                key.open_in_place_separate_tag(nonce, Aad::from(&aad[..]), tag, &mut [])
                    .map_err(|_| RecordError::BadTag)?;
            }
        }
        Ok((header, &mut record[RECORD_HEADER..body_end]))
    }
}

fn encode_header(kind: RecordKind, payload_len: usize) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    h[..4].copy_from_slice(&(payload_len as u32).to_be_bytes());
    h[4] = kind.code();
    h
}

fn decode_header(h: &[u8; RECORD_HEADER]) -> Result<Header, RecordError> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len > MAX_RECORD {
        return Err(RecordError::TooLong(len));
    }
    let kind = match h[4] {
        0 => RecordKind::Data,
        1 => RecordKind::End,
        2 => RecordKind::Ack,
        k => return Err(RecordError::UnknownKind(k)),
    };
    if h[5..] != [0, 0, 0] {
        return Err(RecordError::Reserved);
    }
    if kind != RecordKind::Data && len != 0 {
        return Err(RecordError::NotEmpty(if kind == RecordKind::End {
            "end"
        } else {
            "ack"
        }));
    }
    Ok(Header {
        kind,
        payload_len: len,
    })
}

/// Where a data record's bytes belong: written at the front of its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub file: u32,
    pub offset: u64,
}

impl Chunk {
    pub fn encode(self, out: &mut [u8; CHUNK_HEADER]) {
        out[..4].copy_from_slice(&self.file.to_be_bytes());
        out[4..].copy_from_slice(&self.offset.to_be_bytes());
    }

    /// Splits a data payload into its chunk header and bytes.
    pub fn decode(payload: &[u8]) -> Option<(Chunk, &[u8])> {
        let head = payload.get(..CHUNK_HEADER)?;
        let file = u32::from_be_bytes(head[..4].try_into().ok()?);
        let offset = u64::from_be_bytes(head[4..].try_into().ok()?);
        Some((Chunk { file, offset }, &payload[CHUNK_HEADER..]))
    }
}

// ---------------------------------------------------------------------------
// Control messages (inside the SSH channel)

/// A file or directory of a copy, as announced on the control channel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntryWire {
    /// Numbers files for data records; directories get one too.
    pub id: u32,
    /// Path relative to the destination root, `/`-separated.
    pub rel: String,
    pub is_dir: bool,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub atime: i64,
    pub atime_nsec: u32,
}

/// Client to server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMsg {
    Hello {
        version: u32,
        mode: Mode,
        streams: u32,
        secret: [u8; SECRET_LEN],
    },
    /// Start an upload into `target` (scp's placement rules).
    Put {
        target: String,
        sources: u32,
        recursive: bool,
        preserve: bool,
        /// Streams the client will open (at most the tokens granted).
        streams: u32,
    },
    /// One entry of an upload; a file's bytes follow on the streams.
    Entry(EntryWire),
    /// No more entries.
    PutEnd,
    /// Bytes of file `id` at `offset`, carried on the control channel
    /// itself (version 2) instead of a data stream: at most
    /// [`INLINE_CHUNK`] of them. The entry is announced before its bytes.
    Data {
        id: u32,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Start a download.
    Get {
        sources: Vec<String>,
        recursive: bool,
        preserve: bool,
        /// Streams the client will open (at most the tokens granted).
        streams: u32,
        /// Version 3: the server may answer on the control channel alone
        /// when the download holds no more than this.
        inline: Option<InlineLimits>,
    },
}

/// How much a download may hold for the server to send it on the control
/// channel alone ([`ClientMsg::Get`]): the client picks from the path's
/// round trip, and the server reads no more than this ahead of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineLimits {
    /// File bytes, all files together.
    pub bytes: u64,
    /// Entries, directories included.
    pub entries: u32,
}

/// Server to client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMsg {
    Welcome {
        version: u32,
        mode: Mode,
        secret: [u8; SECRET_LEN],
        tokens: Vec<[u8; TOKEN_LEN]>,
    },
    /// The data plane (or this operation) cannot go ahead.
    Refused { reason: String },
    /// A `Put` target is usable; entries may follow.
    Ready,
    /// An entry of a download; a file's bytes follow on the streams.
    Entry(EntryWire),
    /// A file or source failed (`id` is `u32::MAX` when no entry was announced).
    Failed { id: u32, message: String },
    /// Upload: the file `id` is complete under its final name.
    Stored { id: u32 },
    /// Upload: everything is settled. Download: no more entries.
    Done,
    /// Download, version 3: bytes of file `id` at `offset` on the control
    /// channel (a `Welcome` without tokens said so), at most
    /// [`INLINE_CHUNK`]. The entry is announced before its bytes.
    Data {
        id: u32,
        offset: u64,
        bytes: Vec<u8>,
    },
}

const CM_HELLO: u8 = 1;
const CM_PUT: u8 = 2;
const CM_ENTRY: u8 = 3;
const CM_PUT_END: u8 = 4;
const CM_GET: u8 = 5;
const CM_DATA: u8 = 6;
const CM_GET_INLINE: u8 = 7;

const SM_WELCOME: u8 = 1;
const SM_REFUSED: u8 = 2;
const SM_READY: u8 = 3;
const SM_ENTRY: u8 = 4;
const SM_FAILED: u8 = 5;
const SM_STORED: u8 = 6;
const SM_DONE: u8 = 7;
const SM_DATA: u8 = 8;

fn write_entry(w: &mut Writer, e: &EntryWire) {
    w.u32(e.id);
    w.str(&e.rel);
    w.bool(e.is_dir);
    w.u64(e.size);
    w.u32(e.mode);
    w.u64(e.mtime as u64);
    w.u32(e.mtime_nsec);
    w.u64(e.atime as u64);
    w.u32(e.atime_nsec);
}

fn read_entry(r: &mut Reader<'_>) -> Result<EntryWire, WireError> {
    Ok(EntryWire {
        id: r.u32()?,
        rel: r.str()?,
        is_dir: r.bool("directory flag")?,
        size: r.u64()?,
        mode: r.u32()?,
        mtime: r.u64()? as i64,
        mtime_nsec: r.u32()?,
        atime: r.u64()? as i64,
        atime_nsec: r.u32()?,
    })
}

fn read_array<const N: usize>(r: &mut Reader<'_>) -> Result<[u8; N], WireError> {
    r.array::<N>()
}

pub fn encode_client(msg: &ClientMsg) -> Vec<u8> {
    let w = match msg {
        ClientMsg::Hello {
            version,
            mode,
            streams,
            secret,
        } => {
            let mut w = Writer::new(CM_HELLO);
            w.u32(*version);
            w.u8(mode.code());
            w.u32(*streams);
            w.raw(secret);
            w
        }
        ClientMsg::Put {
            target,
            sources,
            recursive,
            preserve,
            streams,
        } => {
            let mut w = Writer::new(CM_PUT);
            w.str(target);
            w.u32(*sources);
            w.bool(*recursive);
            w.bool(*preserve);
            w.u32(*streams);
            w
        }
        ClientMsg::Entry(e) => {
            let mut w = Writer::new(CM_ENTRY);
            write_entry(&mut w, e);
            w
        }
        ClientMsg::PutEnd => Writer::new(CM_PUT_END),
        ClientMsg::Data { id, offset, bytes } => {
            let mut w = Writer::new(CM_DATA);
            w.u32(*id);
            w.u64(*offset);
            w.bytes(bytes);
            w
        }
        ClientMsg::Get {
            sources,
            recursive,
            preserve,
            streams,
            inline,
        } => {
            // Without limits, the version-1 message every skiffd reads.
            let mut w = Writer::new(match inline {
                None => CM_GET,
                Some(_) => CM_GET_INLINE,
            });
            w.strs(sources);
            w.bool(*recursive);
            w.bool(*preserve);
            w.u32(*streams);
            if let Some(limits) = inline {
                w.u64(limits.bytes);
                w.u32(limits.entries);
            }
            w
        }
    };
    w.finish()
}

/// Decodes one client message from the front of `buf`: `Ok(None)` needs
/// more bytes, `Ok(Some((msg, used)))` took `used` bytes.
pub fn decode_client(buf: &[u8]) -> Result<Option<(ClientMsg, usize)>, WireError> {
    let Some((body, used)) = split_frame(buf)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let msg = match r.u8()? {
        CM_HELLO => ClientMsg::Hello {
            version: r.u32()?,
            mode: Mode::from_code(r.u8()?)?,
            streams: r.u32()?,
            secret: read_array(&mut r)?,
        },
        CM_PUT => ClientMsg::Put {
            target: r.str()?,
            sources: r.u32()?,
            recursive: r.bool("recursive flag")?,
            preserve: r.bool("preserve flag")?,
            streams: r.u32()?,
        },
        CM_ENTRY => ClientMsg::Entry(read_entry(&mut r)?),
        CM_PUT_END => ClientMsg::PutEnd,
        CM_DATA => {
            let (id, offset, bytes) = (r.u32()?, r.u64()?, r.bytes()?);
            if bytes.len() > INLINE_CHUNK {
                return Err(WireError::BadValue("inline data length"));
            }
            ClientMsg::Data { id, offset, bytes }
        }
        tag @ (CM_GET | CM_GET_INLINE) => ClientMsg::Get {
            sources: r.strs()?,
            recursive: r.bool("recursive flag")?,
            preserve: r.bool("preserve flag")?,
            streams: r.u32()?,
            inline: match tag {
                CM_GET => None,
                _ => Some(InlineLimits {
                    bytes: r.u64()?,
                    entries: r.u32()?,
                }),
            },
        },
        tag => return Err(WireError::UnknownTag(tag)),
    };
    r.end()?;
    Ok(Some((msg, used)))
}

pub fn encode_server(msg: &ServerMsg) -> Vec<u8> {
    let w = match msg {
        ServerMsg::Welcome {
            version,
            mode,
            secret,
            tokens,
        } => {
            let mut w = Writer::new(SM_WELCOME);
            w.u32(*version);
            w.u8(mode.code());
            w.raw(secret);
            w.len(tokens.len());
            for t in tokens {
                w.raw(t);
            }
            w
        }
        ServerMsg::Refused { reason } => {
            let mut w = Writer::new(SM_REFUSED);
            w.str(reason);
            w
        }
        ServerMsg::Ready => Writer::new(SM_READY),
        ServerMsg::Entry(e) => {
            let mut w = Writer::new(SM_ENTRY);
            write_entry(&mut w, e);
            w
        }
        ServerMsg::Failed { id, message } => {
            let mut w = Writer::new(SM_FAILED);
            w.u32(*id);
            w.str(message);
            w
        }
        ServerMsg::Stored { id } => {
            let mut w = Writer::new(SM_STORED);
            w.u32(*id);
            w
        }
        ServerMsg::Done => Writer::new(SM_DONE),
        ServerMsg::Data { id, offset, bytes } => {
            let mut w = Writer::new(SM_DATA);
            w.u32(*id);
            w.u64(*offset);
            w.bytes(bytes);
            w
        }
    };
    w.finish()
}

/// Decodes one server message from the front of `buf` (as [`decode_client`]).
pub fn decode_server(buf: &[u8]) -> Result<Option<(ServerMsg, usize)>, WireError> {
    let Some((body, used)) = split_frame(buf)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let msg = match r.u8()? {
        SM_WELCOME => {
            let version = r.u32()?;
            let mode = Mode::from_code(r.u8()?)?;
            let secret = read_array(&mut r)?;
            let n = r.count(TOKEN_LEN)?;
            let mut tokens = Vec::with_capacity(n);
            for _ in 0..n {
                tokens.push(read_array(&mut r)?);
            }
            ServerMsg::Welcome {
                version,
                mode,
                secret,
                tokens,
            }
        }
        SM_REFUSED => ServerMsg::Refused { reason: r.str()? },
        SM_READY => ServerMsg::Ready,
        SM_ENTRY => ServerMsg::Entry(read_entry(&mut r)?),
        SM_FAILED => ServerMsg::Failed {
            id: r.u32()?,
            message: r.str()?,
        },
        SM_STORED => ServerMsg::Stored { id: r.u32()? },
        SM_DONE => ServerMsg::Done,
        SM_DATA => {
            let (id, offset, bytes) = (r.u32()?, r.u64()?, r.bytes()?);
            if bytes.len() > INLINE_CHUNK {
                return Err(WireError::BadValue("inline data length"));
            }
            ServerMsg::Data { id, offset, bytes }
        }
        tag => return Err(WireError::UnknownTag(tag)),
    };
    r.end()?;
    Ok(Some((msg, used)))
}

// ---------------------------------------------------------------------------
// skiffd <-> transfer process (a Unix socket; streams travel as passed fds)

/// Messages on the socket between skiffd and the transfer process it
/// starts as the account. The process asks for streams; skiffd applies its
/// policy, issues tokens, and later passes each accepted stream's socket
/// (with `Stream`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayMsg {
    /// Process to skiffd: the client asks for `streams` streams in `mode`.
    Request { mode: Mode, streams: u32 },
    /// skiffd to process: granted, with one token per stream.
    Granted { tokens: Vec<[u8; TOKEN_LEN]> },
    /// skiffd to process: refused by policy.
    Denied { reason: String },
    /// skiffd to process: the socket passed alongside is stream `index`.
    Stream { index: u32 },
    /// Process to skiffd, once, when the transfer is over: what it moved,
    /// for the audit log. Statistics only: skiffd trusts it for nothing else.
    Report(TransferReport),
}

/// Which way a transfer's files went, seen from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferDirection {
    /// Client to server (`skiff cp LOCAL HOST:PATH`).
    Upload,
    /// Server to client.
    Download,
}

impl TransferDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            TransferDirection::Upload => "upload",
            TransferDirection::Download => "download",
        }
    }

    fn code(self) -> u8 {
        match self {
            TransferDirection::Upload => 0,
            TransferDirection::Download => 1,
        }
    }

    fn from_code(c: u8) -> Result<TransferDirection, WireError> {
        match c {
            0 => Ok(TransferDirection::Upload),
            1 => Ok(TransferDirection::Download),
            _ => Err(WireError::BadValue("transfer direction")),
        }
    }
}

/// A transfer process's account of a finished transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferReport {
    pub direction: TransferDirection,
    /// Files transferred in full (stored, for an upload; read and sent,
    /// for a download).
    pub files: u64,
    /// File bytes carried by the data streams (written, for an upload;
    /// sent, for a download).
    pub bytes: u64,
    /// Files that failed.
    pub failed: u64,
    /// Whether the transfer ran to its end with nothing failed.
    pub completed: bool,
}

const RM_REQUEST: u8 = 1;
const RM_GRANTED: u8 = 2;
const RM_DENIED: u8 = 3;
const RM_STREAM: u8 = 4;
const RM_REPORT: u8 = 5;

pub fn encode_relay(msg: &RelayMsg) -> Vec<u8> {
    let w = match msg {
        RelayMsg::Request { mode, streams } => {
            let mut w = Writer::new(RM_REQUEST);
            w.u8(mode.code());
            w.u32(*streams);
            w
        }
        RelayMsg::Granted { tokens } => {
            let mut w = Writer::new(RM_GRANTED);
            w.len(tokens.len());
            for t in tokens {
                w.raw(t);
            }
            w
        }
        RelayMsg::Denied { reason } => {
            let mut w = Writer::new(RM_DENIED);
            w.str(reason);
            w
        }
        RelayMsg::Stream { index } => {
            let mut w = Writer::new(RM_STREAM);
            w.u32(*index);
            w
        }
        RelayMsg::Report(r) => {
            let mut w = Writer::new(RM_REPORT);
            w.u8(r.direction.code());
            w.u64(r.files);
            w.u64(r.bytes);
            w.u64(r.failed);
            w.bool(r.completed);
            w
        }
    };
    w.finish()
}

/// Decodes a relay message (one per datagram: the whole buffer).
pub fn decode_relay(buf: &[u8]) -> Result<RelayMsg, WireError> {
    let (body, used) = split_frame(buf)?.ok_or(WireError::Truncated)?;
    if used != buf.len() {
        return Err(WireError::Trailing(buf.len() - used));
    }
    let mut r = Reader { buf: body };
    let msg = match r.u8()? {
        RM_REQUEST => RelayMsg::Request {
            mode: Mode::from_code(r.u8()?)?,
            streams: r.u32()?,
        },
        RM_GRANTED => {
            let n = r.count(TOKEN_LEN)?;
            let mut tokens = Vec::with_capacity(n);
            for _ in 0..n {
                tokens.push(read_array(&mut r)?);
            }
            RelayMsg::Granted { tokens }
        }
        RM_DENIED => RelayMsg::Denied { reason: r.str()? },
        RM_STREAM => RelayMsg::Stream { index: r.u32()? },
        RM_REPORT => RelayMsg::Report(TransferReport {
            direction: TransferDirection::from_code(r.u8()?)?,
            files: r.u64()?,
            bytes: r.u64()?,
            failed: r.u64()?,
            completed: r.bool("completed")?,
        }),
        tag => return Err(WireError::UnknownTag(tag)),
    };
    r.end()?;
    Ok(msg)
}

/// What a connection's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    /// Too few bytes to tell.
    Undecided,
    /// The data-plane magic: a stream token follows.
    DataPlane,
    /// An SSH client's identification line (`SSH-`).
    Ssh,
    /// Neither: not an SSH client (`echo | nc`, an HTTP probe). sshd
    /// answers "Invalid SSH identification string" and closes.
    NotSsh,
}

/// How every SSH client's identification line begins (RFC 4253 4.2; a
/// client sends no other lines before it).
const SSH_PREFIX: &[u8] = b"SSH-";

/// Classifies the first bytes a server received on a connection.
pub fn sniff(first: &[u8]) -> Sniff {
    let prefix_of = |whole: &[u8]| {
        let n = first.len().min(whole.len());
        first[..n] == whole[..n]
    };
    match (prefix_of(&MAGIC), prefix_of(SSH_PREFIX)) {
        (true, _) if first.len() >= MAGIC.len() => Sniff::DataPlane,
        (_, true) if first.len() >= SSH_PREFIX.len() => Sniff::Ssh,
        (false, false) => Sniff::NotSsh,
        _ => Sniff::Undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(mode: Mode) -> Keys {
        derive_keys(&[1; 32], &[2; 32], mode)
    }

    /// Seals `payload` as a data record and returns the wire bytes.
    fn sealed(s: &mut Sealer, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; RECORD_HEADER + payload.len() + TAG_LEN];
        buf[RECORD_HEADER..RECORD_HEADER + payload.len()].copy_from_slice(payload);
        let n = s.seal(RecordKind::Data, &mut buf, payload.len()).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn records_round_trip_in_every_mode() {
        for mode in [Mode::Aead, Mode::Integrity, Mode::None] {
            let k = keys(mode);
            let mut s = Sealer::new(&k, Side::Client, mode, 3);
            let mut o = Opener::new(&k, Side::Client, mode, 3);
            for payload in [&b""[..], b"x", &vec![7u8; MAX_RECORD]] {
                let mut wire = sealed(&mut s, payload);
                assert_eq!(wire.len(), RECORD_HEADER + payload.len() + mode.tag_len());
                if mode == Mode::Aead && payload.len() > 8 {
                    assert_ne!(
                        &wire[RECORD_HEADER..RECORD_HEADER + 8],
                        &payload[..8],
                        "aead encrypts"
                    );
                }
                if mode == Mode::Integrity {
                    assert_eq!(
                        &wire[RECORD_HEADER..RECORD_HEADER + payload.len()],
                        payload,
                        "integrity is clear"
                    );
                }
                let (h, p) = o.open(&mut wire).unwrap();
                assert_eq!(h.kind, RecordKind::Data);
                assert_eq!(p, payload, "{mode}");
            }
            let mut end = vec![0u8; RECORD_HEADER + TAG_LEN];
            let n = s.seal(RecordKind::End, &mut end, 0).unwrap();
            let (h, _) = o.open(&mut end[..n]).unwrap();
            assert_eq!(h.kind, RecordKind::End);
        }
    }

    #[test]
    fn any_flipped_bit_is_caught_when_authenticated() {
        for mode in [Mode::Aead, Mode::Integrity] {
            let k = keys(mode);
            let payload = b"the quick brown fox";
            let clean = sealed(&mut Sealer::new(&k, Side::Server, mode, 0), payload);
            for i in 0..clean.len() {
                let mut bad = clean.clone();
                bad[i] ^= 0x01;
                let mut o = Opener::new(&k, Side::Server, mode, 0);
                let r = o.open(&mut bad);
                assert!(r.is_err(), "{mode}: flipping byte {i} went unnoticed");
            }
        }
    }

    #[test]
    fn replay_reorder_wrong_stream_direction_or_mode_fail() {
        let k = keys(Mode::Aead);
        let mut s = Sealer::new(&k, Side::Client, Mode::Aead, 1);
        let first = sealed(&mut s, b"one");
        let second = sealed(&mut s, b"two");
        // Replaying the first record where the second belongs.
        let mut o = Opener::new(&k, Side::Client, Mode::Aead, 1);
        o.open(&mut first.clone()).unwrap();
        assert_eq!(o.open(&mut first.clone()).unwrap_err(), RecordError::BadTag);
        // Reordered.
        let mut o = Opener::new(&k, Side::Client, Mode::Aead, 1);
        assert_eq!(
            o.open(&mut second.clone()).unwrap_err(),
            RecordError::BadTag
        );
        // Another stream id.
        let mut o = Opener::new(&k, Side::Client, Mode::Aead, 2);
        assert_eq!(o.open(&mut first.clone()).unwrap_err(), RecordError::BadTag);
        // The other direction's key.
        let mut o = Opener::new(&k, Side::Server, Mode::Aead, 1);
        assert_eq!(o.open(&mut first.clone()).unwrap_err(), RecordError::BadTag);
        // Keys for another mode.
        let k2 = keys(Mode::Integrity);
        let mut o = Opener::new(&k2, Side::Client, Mode::Aead, 1);
        assert_eq!(o.open(&mut first.clone()).unwrap_err(), RecordError::BadTag);
        // Different secrets.
        let k3 = derive_keys(&[1; 32], &[3; 32], Mode::Aead);
        let mut o = Opener::new(&k3, Side::Client, Mode::Aead, 1);
        assert_eq!(o.open(&mut first.clone()).unwrap_err(), RecordError::BadTag);
    }

    #[test]
    fn headers_are_checked() {
        let o = Opener::new(&keys(Mode::None), Side::Client, Mode::None, 0);
        let mut h = encode_header(RecordKind::Data, MAX_RECORD);
        assert!(o.header(&h).is_ok());
        h[..4].copy_from_slice(&((MAX_RECORD + 1) as u32).to_be_bytes());
        assert_eq!(
            o.header(&h).unwrap_err(),
            RecordError::TooLong(MAX_RECORD + 1)
        );
        let mut h = encode_header(RecordKind::Data, 1);
        h[4] = 9;
        assert_eq!(o.header(&h).unwrap_err(), RecordError::UnknownKind(9));
        let mut h = encode_header(RecordKind::Data, 1);
        h[7] = 1;
        assert_eq!(o.header(&h).unwrap_err(), RecordError::Reserved);
        let mut h = encode_header(RecordKind::End, 0);
        h[3] = 1;
        assert!(matches!(
            o.header(&h).unwrap_err(),
            RecordError::NotEmpty(_)
        ));
        let mut s = Sealer::new(&keys(Mode::None), Side::Client, Mode::None, 0);
        let mut buf = vec![0u8; 64];
        assert!(s.seal(RecordKind::Ack, &mut buf, 3).is_err());
        assert_eq!(
            s.seal(RecordKind::Data, &mut buf, 60).unwrap_err(),
            RecordError::Buffer
        );
    }

    #[test]
    fn chunk_headers_round_trip() {
        let mut b = [0u8; CHUNK_HEADER];
        Chunk {
            file: 7,
            offset: 1 << 40,
        }
        .encode(&mut b);
        let mut payload = b.to_vec();
        payload.extend_from_slice(b"data");
        let (c, rest) = Chunk::decode(&payload).unwrap();
        assert_eq!(
            c,
            Chunk {
                file: 7,
                offset: 1 << 40
            }
        );
        assert_eq!(rest, b"data");
        assert!(Chunk::decode(&payload[..11]).is_none());
    }

    #[test]
    fn inline_data_longer_than_a_chunk_is_refused() {
        let mut bytes = encode_client(&ClientMsg::Data {
            id: 1,
            offset: 0,
            bytes: vec![0; INLINE_CHUNK + 1],
        });
        assert_eq!(
            decode_client(&bytes),
            Err(WireError::BadValue("inline data length"))
        );
        // A length field that runs past the frame is truncation, not a
        // large allocation.
        let at = 4 + 1 + 4 + 8;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_client(&bytes), Err(WireError::Truncated));
    }

    #[test]
    fn a_download_without_inline_limits_is_the_message_every_skiffd_reads() {
        let get = |inline| ClientMsg::Get {
            sources: vec!["f".into()],
            recursive: false,
            preserve: false,
            streams: 2,
            inline,
        };
        let plain = encode_client(&get(None));
        assert_eq!(plain[4], CM_GET);
        let limits = InlineLimits {
            bytes: 1,
            entries: 1,
        };
        let offered = encode_client(&get(Some(limits)));
        assert_eq!(offered[4], CM_GET_INLINE);
        // The same fields, then the limits.
        assert_eq!(offered[5..plain.len()], plain[5..]);
        assert_eq!(offered.len(), plain.len() + 12);
    }

    #[test]
    fn a_file_goes_on_the_channel_in_pieces_of_a_chunk_with_their_offsets() {
        assert_eq!(inline_pieces(&[]).count(), 0);
        let bytes: Vec<u8> = (0..2 * INLINE_CHUNK + 5).map(|i| i as u8).collect();
        let pieces: Vec<(u64, usize)> = inline_pieces(&bytes).map(|(o, p)| (o, p.len())).collect();
        let chunk = INLINE_CHUNK as u64;
        assert_eq!(
            pieces,
            [(0, INLINE_CHUNK), (chunk, INLINE_CHUNK), (2 * chunk, 5)]
        );
        let joined: Vec<u8> = inline_pieces(&bytes)
            .flat_map(|(_, p)| p.to_vec())
            .collect();
        assert_eq!(joined, bytes);
    }

    #[test]
    fn server_data_longer_than_a_chunk_is_refused() {
        let bytes = encode_server(&ServerMsg::Data {
            id: 1,
            offset: 0,
            bytes: vec![0; INLINE_CHUNK + 1],
        });
        assert_eq!(
            decode_server(&bytes),
            Err(WireError::BadValue("inline data length"))
        );
    }

    #[test]
    fn control_messages_round_trip_and_reject_garbage() {
        let entry = EntryWire {
            id: 4,
            rel: "a/b c".into(),
            is_dir: false,
            size: 1 << 33,
            mode: 0o644,
            mtime: -5,
            mtime_nsec: 999,
            atime: 1_700_000_000,
            atime_nsec: 1,
        };
        let client = [
            ClientMsg::Hello {
                version: VERSION,
                mode: Mode::Integrity,
                streams: 4,
                secret: [9; 32],
            },
            ClientMsg::Put {
                target: "dir".into(),
                sources: 2,
                recursive: true,
                preserve: false,
                streams: 3,
            },
            ClientMsg::Entry(entry.clone()),
            ClientMsg::Data {
                id: 4,
                offset: 1 << 35,
                bytes: b"file bytes".to_vec(),
            },
            ClientMsg::Data {
                id: 0,
                offset: 0,
                bytes: vec![7; INLINE_CHUNK],
            },
            ClientMsg::PutEnd,
            ClientMsg::Get {
                sources: vec!["x".into(), "y z".into()],
                recursive: false,
                preserve: true,
                streams: 1,
                inline: None,
            },
            ClientMsg::Get {
                sources: vec!["x".into()],
                recursive: true,
                preserve: false,
                streams: 8,
                inline: Some(InlineLimits {
                    bytes: 128 << 10,
                    entries: 64,
                }),
            },
        ];
        for m in &client {
            let bytes = encode_client(m);
            assert_eq!(
                decode_client(&bytes).unwrap(),
                Some((m.clone(), bytes.len()))
            );
            assert_eq!(decode_client(&bytes[..bytes.len() - 1]).unwrap(), None);
        }
        let server = [
            ServerMsg::Welcome {
                version: 1,
                mode: Mode::None,
                secret: [3; 32],
                tokens: vec![[1; 32], [2; 32]],
            },
            ServerMsg::Refused {
                reason: "no".into(),
            },
            ServerMsg::Ready,
            ServerMsg::Entry(entry),
            ServerMsg::Failed {
                id: u32::MAX,
                message: "gone".into(),
            },
            ServerMsg::Stored { id: 3 },
            ServerMsg::Done,
            ServerMsg::Data {
                id: 2,
                offset: 1 << 16,
                bytes: vec![5; INLINE_CHUNK],
            },
        ];
        for m in &server {
            let bytes = encode_server(m);
            assert_eq!(
                decode_server(&bytes).unwrap(),
                Some((m.clone(), bytes.len()))
            );
        }
        for m in [
            RelayMsg::Request {
                mode: Mode::Aead,
                streams: 8,
            },
            RelayMsg::Granted {
                tokens: vec![[5; 32]],
            },
            RelayMsg::Denied {
                reason: "policy".into(),
            },
            RelayMsg::Stream { index: 2 },
            RelayMsg::Report(TransferReport {
                direction: TransferDirection::Download,
                files: 3,
                bytes: 1 << 40,
                failed: 1,
                completed: false,
            }),
        ] {
            assert_eq!(decode_relay(&encode_relay(&m)).unwrap(), m);
        }
        // A direction that is neither way.
        let mut report = encode_relay(&RelayMsg::Report(TransferReport {
            direction: TransferDirection::Upload,
            files: 0,
            bytes: 0,
            failed: 0,
            completed: true,
        }));
        report[5] = 9;
        assert!(decode_relay(&report).is_err());
        // A bad mode byte, an unknown tag, trailing bytes.
        let mut hello = encode_client(&client[0]);
        hello[4 + 1 + 4] = 7;
        assert!(decode_client(&hello).is_err());
        assert_eq!(
            decode_server(&[0, 0, 0, 1, 99]).unwrap_err(),
            WireError::UnknownTag(99)
        );
        assert!(decode_relay(&[0, 0, 0, 2, RM_STREAM, 0]).is_err());
        // A token count the frame cannot hold.
        assert!(decode_relay(&[0, 0, 0, 5, RM_GRANTED, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn sniffing_tells_ssh_from_the_data_plane() {
        assert_eq!(sniff(b""), Sniff::Undecided);
        assert_eq!(sniff(b"SKIFF"), Sniff::Undecided);
        assert_eq!(sniff(&MAGIC), Sniff::DataPlane);
        assert_eq!(sniff(b"SSH-2.0-OpenSSH_9.2"), Sniff::Ssh);
        assert_eq!(sniff(b"SSH-"), Sniff::Ssh);
        assert_eq!(sniff(b"SS"), Sniff::Undecided);
        assert_eq!(sniff(b"S"), Sniff::Undecided);
        assert_eq!(sniff(b"SKIFFX"), Sniff::NotSsh);
        assert_eq!(sniff(b"\n"), Sniff::NotSsh);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Sniff::NotSsh);
        assert_eq!(sniff(b"SSX"), Sniff::NotSsh);
    }
}
