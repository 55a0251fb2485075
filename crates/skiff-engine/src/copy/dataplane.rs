//! `skiff cp` to and from skiffd over the data plane: the `transfer@skiff`
//! subsystem carries the key exchange and the control messages inside the
//! authenticated SSH session; the bytes go over extra TCP streams to the
//! same port, in sealed records, one thread per stream. A small copy's
//! files go on that channel alone instead: an upload's when the client
//! reads it whole first (version 2), a download's when the server chooses
//! so after the client offered (version 3, to a skiffd that says it is
//! 0.2.0 or later).
//!
//! A server without the subsystem (a stock sshd, or a skiffd with the data
//! plane off) makes [`copy`] return `Ok(None)`, and the caller uses SFTP.
//!
//! The server is not trusted with what it sends: a download admits only the
//! entries the request names ([`skiff_files::Requested`]), with the modes
//! [`ReceivePolicy::Download`] allows; an id announced twice, bytes past a
//! file's size, data for an entry never announced, a file left short, or a
//! transfer that stops moving for the keepalive budget end the copy, and
//! nothing incomplete is left under a final name. Text from the server is
//! shown through [`skiff_proto::terminal_text`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use skiff_dataplane::{
    offer_tree, read_small_tree, Accepted, Accepting, ChunkQueue, Dialed, FileTable, Offered,
    RecordWriter, Settled, SmallLimits, SmallTree, Stall, StreamError, StreamWatch,
};
use skiff_files::Requested;
use skiff_proto::dataplane::{
    self as dp, ClientMsg, EntryWire, InlineLimits, Keys, Mode, ServerMsg, INLINE_DOWNLOAD_SINCE,
    INLINE_UPLOAD_SINCE, OLDEST_VERSION, SECRET_LEN, TOKEN_LEN,
};
use skiff_proto::terminal_text;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{misbehaved, safe_report, stalled, CopyJob, CopyReport, Direction, Progress};
use crate::busy::Gate;
use crate::error::{ErrorKind, SkiffError};
use crate::Connection;

/// What the user asked of the data plane.
#[derive(Debug, Clone)]
pub struct PlaneOptions {
    pub mode: Mode,
    /// Streams to open; `None` picks from the round-trip time.
    pub streams: Option<u32>,
    /// How long the transfer may go without progress (no byte acknowledged
    /// or received on any stream, no control message) before it fails:
    /// [`crate::ConnectSettings::progress_budget`]. `None` waits for ever.
    pub stall: Option<Duration>,
    /// A fan-out's gate ([`crate::ConnectSettings::pre_auth_gate`]): each
    /// data stream waits for room in it and tells it whether the server let
    /// it in, as the fan-out's connections do.
    pub gate: Option<Arc<Gate>>,
    /// A small upload may travel on the control channel alone, with no
    /// data stream (data plane version 2; see [`INLINE_NEAR`]), and a
    /// skiffd that speaks version 3 may send a small download back on it,
    /// unless the user named a stream count. Turned off to copy again when
    /// a skiffd refused that ([`Attempted::InlineRefused`]).
    pub inline: bool,
}

/// How a data-plane copy on one channel ended.
#[derive(Debug)]
pub enum Attempted {
    Copied(CopyReport),
    /// The server refused a copy on the channel alone (a skiffd older than
    /// version 2 of the data plane refuses that `Hello`, one older than
    /// version 3 a download that offers it): nothing was written, and the
    /// copy goes again on a new channel with [`PlaneOptions::inline`] off.
    InlineRefused,
}

/// The most an upload may hold to travel on the control channel alone, on a
/// path whose round trip is [`NEAR`] or less: there a data stream's setup
/// (a TCP handshake, its token and acknowledgement, a thread) costs more
/// than carrying the bytes on the channel, up to somewhat less than a
/// mebibyte (measured on loopback: a cold copy of 512 KiB 6% faster on the
/// channel than on two streams, of 1 MiB 3% slower; docs/BENCHMARKS.md).
/// The entries bound the files one copy reads whole ahead of time.
pub const INLINE_NEAR: SmallLimits = SmallLimits {
    bytes: 512 << 10,
    entries: 64,
};

/// Bytes an upload may hold to travel on the channel alone on a longer
/// path. There the SSH connection's congestion window is still about that
/// of a fresh TCP connection (its setup moved little data), so a copy much
/// larger than a few of its flights gets to the server sooner on several
/// streams, each with a window of its own, even with the round trip they
/// add.
pub const INLINE_FAR_BYTES: u64 = 128 << 10;

/// The round trip up to which [`INLINE_NEAR`] applies.
pub const NEAR: Duration = Duration::from_millis(2);

/// How much a copy may hold to go on the channel alone on a path whose
/// round trip is `rtt`.
fn inline_limits(rtt: Duration) -> SmallLimits {
    match rtt <= NEAR {
        true => INLINE_NEAR,
        false => SmallLimits {
            bytes: INLINE_FAR_BYTES,
            ..INLINE_NEAR
        },
    }
}

/// Whether a small upload of `bytes` goes on the channel alone on a path
/// whose round trip is `rtt`.
fn fits_inline(bytes: u64, rtt: Duration) -> bool {
    bytes <= inline_limits(rtt).bytes
}

/// Reads an upload whole, on a blocking thread, when it may go on the
/// channel alone and is small enough to ([`INLINE_NEAR`]); the caller
/// settles the round trip's own limit with [`fits_inline`].
fn read_small_upload(
    job: &CopyJob,
    options: &PlaneOptions,
) -> Option<tokio::task::JoinHandle<Option<SmallTree>>> {
    let Direction::Upload { sources, .. } = &job.direction else {
        return None;
    };
    if !options.inline || options.streams.is_some() {
        return None;
    }
    let (sources, recursive) = (sources.clone(), job.recursive);
    Some(tokio::task::spawn_blocking(move || {
        read_small_tree(&sources, recursive, INLINE_NEAR)
    }))
}

/// How often a running transfer checks that it still moves.
const STALL_TICK: Duration = Duration::from_secs(1);

/// How long a download whose streams have all ended waits for the server
/// to account for a file still short (a failure notice, or its transfer
/// process ending) before counting it incomplete.
const LAST_WORD: Duration = Duration::from_secs(2);

/// Chunks queued ahead of the senders.
const QUEUE_CHUNKS: usize = 64;

/// How often progress is reported while bytes move.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// The control channel: framed messages both ways.
struct ControlChannel {
    rd: Box<dyn AsyncRead + Unpin + Send>,
    wr: Box<dyn AsyncWrite + Unpin + Send>,
    buf: Vec<u8>,
    host: String,
}

impl ControlChannel {
    /// `early`: bytes from the server already read off the channel.
    fn new<S>(stream: S, host: &str, early: Vec<u8>) -> ControlChannel
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(stream);
        ControlChannel {
            rd: Box::new(rd),
            wr: Box::new(wr),
            buf: early,
            host: host.to_string(),
        }
    }

    async fn send(&mut self, msg: &ClientMsg) -> Result<(), SkiffError> {
        self.send_bytes(&dp::encode_client(msg)).await
    }

    async fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), SkiffError> {
        self.wr.write_all(bytes).await.map_err(|e| self.lost(&e))?;
        self.wr.flush().await.map_err(|e| self.lost(&e))
    }

    async fn recv(&mut self) -> Result<ServerMsg, SkiffError> {
        loop {
            match dp::decode_server(&self.buf) {
                Ok(Some((msg, used))) => {
                    self.buf.drain(..used);
                    return Ok(msg);
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(SkiffError::new(
                        ErrorKind::Protocol,
                        format!("{}: bad data-plane control message: {e}", self.host),
                    ))
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.rd.read(&mut chunk).await.map_err(|e| self.lost(&e))?;
            if n == 0 {
                return Err(self.lost(&"the transfer process ended"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn lost(&self, e: &dyn std::fmt::Display) -> SkiffError {
        SkiffError::new(
            ErrorKind::Connect,
            format!("{}: data-plane control channel lost: {e}", self.host),
        )
    }
}

/// An established data plane: keys, mode, tokens, and the stream count
/// both sides agreed on.
struct Session {
    control: ControlChannel,
    keys: Arc<Keys>,
    mode: Mode,
    tokens: Vec<[u8; TOKEN_LEN]>,
    addr: SocketAddr,
    streams: u32,
    stall: Option<Duration>,
    gate: Option<Arc<Gate>>,
    /// Streams dialed while the server's `Welcome` was on its way.
    early: Vec<EarlyDial>,
}

/// A server's own words (a reason, a failure), made safe to show.
fn server_text(s: &str) -> String {
    terminal_text::one_line(s).into_owned()
}

/// A watch on `sockets`; a socket that cannot be watched is left out (its
/// thread still ends with the transfer's other streams).
fn watch_of<'a>(sockets: impl Iterator<Item = &'a std::net::TcpStream>) -> StreamWatch {
    let mut watch = StreamWatch::new();
    for s in sockets {
        if let Err(e) = watch.add(s) {
            tracing::debug!("cannot watch a data stream: {e}");
        }
    }
    watch
}

/// Streams to use when the user did not say: more on long paths, where one
/// TCP stream's window growth is the bottleneck.
fn default_streams(rtt: Duration) -> u32 {
    match rtt.as_millis() {
        0..=2 => 2,
        3..=20 => 4,
        _ => 8,
    }
}

/// The transfer request itself (`Put` or `Get`) for `streams` streams; a
/// download the server may send on the channel alone when it holds no
/// more than `inline`.
fn request(job: &CopyJob, streams: u32, inline: Option<InlineLimits>) -> ClientMsg {
    match &job.direction {
        Direction::Upload { sources, target } => ClientMsg::Put {
            target: target.clone(),
            sources: sources.len() as u32,
            recursive: job.recursive,
            preserve: job.preserve,
            streams,
        },
        Direction::Download { sources, .. } => ClientMsg::Get {
            sources: sources.clone(),
            recursive: job.recursive,
            preserve: job.preserve,
            streams,
            inline,
        },
    }
}

/// The client's opening messages. The round trip is already known (from
/// opening the channel), so the request goes out with `Hello` and the
/// stream count is settled without waiting for the server's answer (the
/// server grants at most what was asked, and both sides then use the
/// smaller of the request and the grant). A small upload goes whole behind
/// them, on the channel, with no stream; a download may offer the server
/// to come back that way.
struct Opening {
    secret: [u8; SECRET_LEN],
    /// The data plane version of `Hello`.
    version: u32,
    /// The stream count asked for in `Hello` and in the request.
    requested: u32,
    /// Streams to dial before the server's answer.
    dial_early: u32,
    bytes: Vec<u8>,
    /// An upload sent whole on the channel.
    inline: Option<InlineUpload>,
}

/// What the client keeps of an upload sent on the channel, to account for
/// the server's answers.
struct InlineUpload {
    /// File id to size and local path.
    files: std::collections::HashMap<u32, (u64, String)>,
    /// File bytes, all files together.
    bytes: u64,
    /// What could not be sent.
    unsendable: Vec<String>,
}

impl Opening {
    /// The opening for `job` on a path whose round trip is `rtt`, to a
    /// server that speaks data plane versions up to `server_version`
    /// (0: not a skiffd); `small` is the upload read whole
    /// ([`read_small_upload`]), if it was.
    async fn new(
        job: &CopyJob,
        options: &PlaneOptions,
        rtt: Duration,
        server_version: u32,
        small: Option<tokio::task::JoinHandle<Option<SmallTree>>>,
    ) -> Opening {
        let small = match small {
            Some(reading) => reading.await.ok().flatten(),
            None => None,
        };
        match small.filter(|tree| fits_inline(tree.bytes, rtt)) {
            Some(tree) => Opening::inline(job, options, tree),
            None => Opening::with_streams(job, options, rtt, server_version),
        }
    }

    /// Streams carry the files, unless a download is small enough for
    /// the server to send it on the channel, which it may when it speaks
    /// version 3 and the user named no stream count.
    fn with_streams(
        job: &CopyJob,
        options: &PlaneOptions,
        rtt: Duration,
        server_version: u32,
    ) -> Opening {
        let requested = options
            .streams
            .unwrap_or_else(|| default_streams(rtt))
            .clamp(1, MAX_STREAMS);
        let offer = matches!(job.direction, Direction::Download { .. })
            && options.inline
            && options.streams.is_none()
            && server_version >= INLINE_DOWNLOAD_SINCE;
        if !offer {
            return Opening::begin(job, options, OLDEST_VERSION, requested, None);
        }
        let limits = inline_limits(rtt);
        let mut opening = Opening::begin(
            job,
            options,
            INLINE_DOWNLOAD_SINCE,
            requested,
            Some(InlineLimits {
                bytes: limits.bytes,
                entries: limits.entries as u32,
            }),
        );
        // Near, a stream dialed for a download that comes on the channel
        // costs more than dialing one after the answer.
        if rtt <= NEAR {
            opening.dial_early = 0;
        }
        opening
    }

    /// The whole upload on the channel: `Hello` with no streams, the
    /// request, every entry followed by its file's bytes, the end.
    fn inline(job: &CopyJob, options: &PlaneOptions, tree: SmallTree) -> Opening {
        let mut opening = Opening::begin(job, options, INLINE_UPLOAD_SINCE, 0, None);
        let mut files = std::collections::HashMap::new();
        for entry in tree.entries {
            let id = entry.wire.id;
            if !entry.wire.is_dir {
                files.insert(id, (entry.wire.size, entry.source.display().to_string()));
            }
            let pieces = dp::inline_pieces(&entry.bytes).map(|(offset, piece)| ClientMsg::Data {
                id,
                offset,
                bytes: piece.to_vec(),
            });
            for msg in std::iter::once(ClientMsg::Entry(entry.wire)).chain(pieces) {
                opening.bytes.extend_from_slice(&dp::encode_client(&msg));
            }
        }
        opening
            .bytes
            .extend_from_slice(&dp::encode_client(&ClientMsg::PutEnd));
        opening.inline = Some(InlineUpload {
            files,
            bytes: tree.bytes,
            unsendable: tree.unsendable,
        });
        opening
    }

    /// `Hello` in `version` and the request. A copy speaks the oldest
    /// version that has what it uses, so that every skiffd that can serve
    /// it does.
    fn begin(
        job: &CopyJob,
        options: &PlaneOptions,
        version: u32,
        requested: u32,
        inline: Option<InlineLimits>,
    ) -> Opening {
        let mut secret = [0u8; SECRET_LEN];
        rand::fill(&mut secret);
        let mut bytes = dp::encode_client(&ClientMsg::Hello {
            version,
            mode: options.mode,
            streams: requested,
            secret,
        });
        bytes.extend_from_slice(&dp::encode_client(&request(job, requested, inline)));
        Opening {
            secret,
            version,
            requested,
            dial_early: requested,
            bytes,
            inline: None,
        }
    }

    /// Whether the server may answer with no stream: it must, for an
    /// upload sent on the channel; it may, for a download that offered it.
    fn streams_fit(&self, granted: usize) -> bool {
        match (self.requested, self.version >= INLINE_DOWNLOAD_SINCE) {
            (0, _) => granted == 0,
            (asked, true) => granted <= asked as usize,
            (asked, false) => granted > 0 && granted <= asked as usize,
        }
    }
}

/// The most streams a client asks for.
const MAX_STREAMS: u32 = 16;

/// Copies over the data plane. `Ok(None)`: the server does not offer it.
///
/// The subsystem request, `Hello` and the transfer request leave together:
/// the channel opening has just measured the round trip, which picks the
/// stream count, or whether a small upload goes whole with them. A skiffd
/// that refuses the latter gets the copy again, with streams, on a new
/// channel.
pub async fn copy(
    conn: &Connection,
    job: &CopyJob,
    options: &PlaneOptions,
    progress: &dyn Progress,
) -> Result<Option<CopyReport>, SkiffError> {
    if !served_by(&conn.server_id) {
        return Ok(None);
    }
    let mut options = std::borrow::Cow::Borrowed(options);
    loop {
        match attempt(conn, job, &options, progress).await? {
            Some(Attempted::Copied(report)) => return Ok(Some(report)),
            None => return Ok(None),
            // Only a copy on the channel alone is refused so, and the next
            // try asks for streams.
            Some(Attempted::InlineRefused) => {
                tracing::debug!(
                    "{}: the server refused a copy on the channel alone; copying with streams",
                    conn.settings.hostname
                );
                options.to_mut().inline = false;
            }
        }
    }
}

/// One try of [`copy`], on a channel of its own.
async fn attempt(
    conn: &Connection,
    job: &CopyJob,
    options: &PlaneOptions,
    progress: &dyn Progress,
) -> Result<Option<Attempted>, SkiffError> {
    let host = conn.settings.hostname.clone();
    let Some(addr) = conn.peer_addr else {
        return Ok(None);
    };
    let placement = match local_placement(job) {
        Ok(p) => p,
        Err(report) => return Ok(Some(Attempted::Copied(report))),
    };
    let lost = |e: russh::Error| {
        SkiffError::new(ErrorKind::Connect, format!("{host}: connection lost: {e}"))
    };
    // A small upload is read while the channel opens.
    let small = read_small_upload(job, options);
    let opened = std::time::Instant::now();
    let mut channel = crate::exec::open_session(conn).await?.into_channel();
    let server_version = conn.server_id.data_plane();
    let opening = Opening::new(job, options, opened.elapsed(), server_version, small).await;
    channel
        .request_subsystem(true, dp::SUBSYSTEM)
        .await
        .map_err(lost)?;
    // A skiffd: checked above.
    let early = dial_early(addr, opening.dial_early, options, true);
    // The opening messages go out while the reply is awaited. They wait for
    // window if there is none yet: OpenSSH grants a session channel's window
    // only once its command or subsystem has started.
    let sending = {
        let mut writer = channel.make_writer();
        let bytes = opening.bytes.clone();
        tokio::spawn(async move {
            writer.write_all(&bytes).await?;
            writer.flush().await
        })
    };
    // Whatever the transfer process says before the reply is read is kept.
    let mut early_bytes = Vec::new();
    loop {
        match channel.wait().await {
            Some(ChannelMsg::Success) => break,
            Some(ChannelMsg::Failure) | Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                sending.abort();
                // Closed, not just dropped: the server counts an open
                // session against its `MaxSessions` (1 leaves no room for
                // the SFTP channel that follows).
                let _ = channel.close().await;
                return Ok(None);
            }
            Some(ChannelMsg::Data { data }) => early_bytes.extend_from_slice(&data),
            Some(_) => {}
        }
    }
    match sending.await {
        Ok(Ok(())) => {}
        // An older skiffd that refused an upload on the channel alone
        // may have closed the channel before taking all of it: its
        // refusal is read below.
        Ok(Err(_)) if opening.version > OLDEST_VERSION => {}
        Ok(Err(e)) => {
            return Err(SkiffError::new(
                ErrorKind::Connect,
                format!("{host}: connection lost: {e}"),
            ))
        }
        Err(e) => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: sending the data-plane request failed: {e}"),
            ))
        }
    }
    let control = ControlChannel::new(channel.into_stream(), &host, early_bytes);
    run(
        control, opening, early, addr, job, options, placement, progress,
    )
    .await
    .map(Some)
}

/// Copies over the data plane, with the `transfer@skiff` subsystem already
/// asked for on `stream` (a channel the agent holds, say); the data streams
/// go to `addr`, the SSH server's address. `opened`: the round trip
/// measured opening the channel picks the stream count (or a small upload
/// goes whole on the channel), and the streams are dialed while the
/// request is on its way when the server is a skiffd. When the server
/// refuses a small upload on the channel alone
/// ([`Attempted::InlineRefused`]), the caller asks for a new channel and
/// calls again with [`PlaneOptions::inline`] off.
pub async fn copy_on<S>(
    stream: S,
    host: &str,
    addr: SocketAddr,
    job: &CopyJob,
    options: &PlaneOptions,
    opened: crate::ChannelOpened,
    progress: &dyn Progress,
) -> Result<Attempted, SkiffError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let placement = match local_placement(job) {
        Ok(p) => p,
        Err(report) => return Ok(Attempted::Copied(report)),
    };
    let small = read_small_upload(job, options);
    let opening = Opening::new(job, options, opened.rtt, opened.data_plane, small).await;
    let mut control = ControlChannel::new(stream, host, Vec::new());
    match control.send_bytes(&opening.bytes).await {
        // As in `attempt`: a refusal may have closed the channel early.
        Err(_) if opening.version > OLDEST_VERSION => {}
        sent => sent?,
    }
    let skiffd = opened.server == crate::server_id::ServerKind::Skiffd;
    let early = dial_early(addr, opening.dial_early, options, skiffd);
    run(
        control, opening, early, addr, job, options, placement, progress,
    )
    .await
}

/// A download's local target, checked before anything goes on the wire; the
/// error is the copy's report.
fn local_placement(job: &CopyJob) -> Result<Option<skiff_files::Placement>, CopyReport> {
    match &job.direction {
        Direction::Upload { .. } => Ok(None),
        Direction::Download { sources, target } => {
            skiff_files::resolve_target(target, sources.len())
                .map(Some)
                .map_err(|e| CopyReport {
                    failures: vec![e.to_string()],
                    ..CopyReport::default()
                })
        }
    }
}

/// The rest of the opening exchange (the server's `Welcome`), then the
/// transfer.
#[allow(clippy::too_many_arguments)]
async fn run(
    mut control: ControlChannel,
    opening: Opening,
    early: Vec<EarlyDial>,
    addr: SocketAddr,
    job: &CopyJob,
    options: &PlaneOptions,
    placement: Option<skiff_files::Placement>,
    progress: &dyn Progress,
) -> Result<Attempted, SkiffError> {
    let host = control.host.clone();
    let (server_secret, tokens) = match control.recv().await? {
        ServerMsg::Welcome {
            version,
            mode,
            secret,
            tokens,
        } => {
            if version != opening.version
                || mode != options.mode
                || !opening.streams_fit(tokens.len())
            {
                return Err(SkiffError::new(
                    ErrorKind::Protocol,
                    format!("{host}: the server answered the data-plane request with other terms (version {version}, mode {mode}, {} streams)", tokens.len()),
                ));
            }
            (secret, tokens)
        }
        // Only a copy that may go on the channel alone speaks more than
        // version 1; every skiffd serves version 1.
        ServerMsg::Refused { .. } if opening.version > OLDEST_VERSION => {
            return Ok(Attempted::InlineRefused)
        }
        ServerMsg::Refused { reason } => {
            return Err(SkiffError::new(
                ErrorKind::Refused,
                format!(
                    "{host}: the server refused the data plane: {}",
                    server_text(&reason)
                ),
            ))
        }
        other => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: unexpected data-plane message {other:?}"),
            ))
        }
    };
    let granted = tokens.len() as u32;
    let streams = opening.requested.min(granted);
    tracing::debug!(
        "{host}: data plane up: mode {}, {streams} of {granted} streams",
        options.mode
    );
    let session = Session {
        control,
        keys: Arc::new(dp::derive_keys(
            &opening.secret,
            &server_secret,
            options.mode,
        )),
        mode: options.mode,
        tokens,
        addr,
        streams,
        stall: options.stall,
        gate: options.gate.clone(),
        early,
    };
    let copied = match (&job.direction, placement, opening.inline) {
        (Direction::Upload { .. }, _, Some(sent)) => settle_inline(session, sent, progress).await,
        (Direction::Upload { sources, .. }, _, None) => {
            upload(session, sources, job, progress).await
        }
        (Direction::Download { sources, .. }, Some(placement), _) => {
            download(session, sources, job, placement, progress).await
        }
        (Direction::Download { .. }, None, _) => {
            unreachable!("a download's placement is resolved first")
        }
    };
    copied.map(safe_report).map(Attempted::Copied)
}

/// The rest of an upload sent whole on the channel: the server's answers,
/// as each file is stored or fails, up to its `Done`. Nothing moves but
/// control messages, so the transfer stalls when they stop for the
/// keepalive budget.
async fn settle_inline(
    mut s: Session,
    mut sent: InlineUpload,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let host = s.control.host.clone();
    let mut report = CopyReport {
        failures: std::mem::take(&mut sent.unsendable),
        ..CopyReport::default()
    };
    progress.add_total(sent.bytes);
    let mut stall = Stall::new(s.stall, std::time::Instant::now());
    let mut tick = tokio::time::interval(STALL_TICK);
    // Why the server gave up on the whole transfer, if it said.
    let mut server_reason = None;
    loop {
        tokio::select! {
            msg = s.control.recv() => {
                stall.progress(std::time::Instant::now());
                let msg = msg.map(|m| {
                    let take = |id| sent.files.remove(&id);
                    upload_answer(m, take, &mut report, &mut server_reason, progress)
                });
                match msg {
                    // No stream counts the bytes as they go.
                    Ok(Answer::Stored(size)) => progress.advance(size),
                    Ok(Answer::Settled) | Ok(Answer::Other(ServerMsg::Ready)) => {}
                    Ok(Answer::Other(ServerMsg::Done)) => return Ok(report),
                    Ok(Answer::Other(other)) => {
                        return Err(misbehaved(&host, format_args!("unexpected {other:?}")))
                    }
                    // The server's own account of why it ended (bytes it
                    // refused, say) is the better message when it sent one.
                    Err(e) => return Err(match server_reason {
                        Some(reason) => stream_failed(&host, reason),
                        None => e,
                    }),
                }
            },
            _ = tick.tick() => {
                if let Some(idle) = stall.check(0, std::time::Instant::now()) {
                    return Err(stalled(&host, idle));
                }
            }
        }
    }
}

/// Streams being opened: every one dialed at once, each on its own thread.
type PendingStreams<T> = Vec<tokio::task::JoinHandle<Result<T, StreamError>>>;

/// How long after the tokens were issued a stream turned away may still be
/// dialed again (skiffd's tokens live 30 s).
const REDIAL_WINDOW: Duration = Duration::from_secs(20);

/// A stream being dialed before its token has come.
type EarlyDial = tokio::task::JoinHandle<Result<Dialed, StreamError>>;

/// How old a stream dialed early may be when its token comes: skiffd closes
/// a data-plane connection whose token has not come 3 s after its magic
/// (`TOKEN_WAIT`), and the token still has to travel. An older one is
/// closed and the stream dialed again.
const EARLY_DIAL_FRESH: Duration = Duration::from_secs(2);

/// Whether `server` can serve the data plane: only a skiffd does (its
/// streams come to skiffd's port, which routes them). No other server is
/// asked: that would cost a channel and a refused request, two round
/// trips, for nothing.
pub(crate) fn served_by(server: &crate::server_id::ServerId) -> bool {
    server.is_skiffd()
}

/// Dials `count` streams to a skiffd at `addr` at once, each on its own
/// thread, while the server's `Welcome` (with their tokens) is on its way:
/// the TCP handshake's round trip then overlaps the request's. Only when
/// the server identified itself as a skiffd (`skiffd`: another server would
/// log the magic as a bad identification line), and not in a fan-out, whose
/// gate counts every connection waiting on a host.
fn dial_early(
    addr: SocketAddr,
    count: u32,
    options: &PlaneOptions,
    skiffd: bool,
) -> Vec<EarlyDial> {
    if !skiffd || options.gate.is_some() {
        return Vec::new();
    }
    (0..count)
        .map(|i| tokio::task::spawn_blocking(move || skiff_dataplane::dial(addr, i)))
        .collect()
}

/// Stream `index` as dialed early, if it connected and is still fresh
/// enough to present its token on; anything else is dropped (closing it)
/// and the stream is dialed again.
async fn still_usable(index: u32, early: Option<EarlyDial>) -> Option<Dialed> {
    match early?.await {
        Ok(Ok(dialed)) if dialed.age() < EARLY_DIAL_FRESH => {
            tracing::debug!("data stream {index}: dialed while the request was on its way");
            Some(dialed)
        }
        Ok(Ok(_)) => {
            tracing::debug!(
                "data stream {index}: dialed early, but its token came too late; dialing again"
            );
            None
        }
        Ok(Err(e)) => {
            tracing::debug!("data stream {index}: dialing early failed ({e}); dialing again");
            None
        }
        Err(_) => None,
    }
}

/// Opens every stream of the session: each presents its token with `open`
/// (which, for [`Dialed::present`], also waits for the acknowledgement) on
/// the connection dialed early for it, or on one dialed now.
///
/// A stream the server turns away before it says anything (skiffd does that
/// while too many connections wait to authenticate: `MaxStartups`) never
/// reached its token, so it is dialed again after the pauses of
/// [`crate::busy::PRE_AUTH_DROPS`], within [`REDIAL_WINDOW`]. In a fan-out
/// each try first waits for room in the fan-out's gate and tells it whether
/// the server let the stream in, as the fan-out's connections do.
fn dial_streams<T, F>(s: &mut Session, open: F) -> PendingStreams<T>
where
    T: Send + 'static,
    F: Fn(Dialed, &[u8; TOKEN_LEN], &Keys, Mode) -> Result<T, StreamError>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let deadline = tokio::time::Instant::now() + REDIAL_WINDOW;
    // Streams dialed early beyond those granted are closed here.
    let mut early = std::mem::take(&mut s.early).into_iter();
    (0..s.streams)
        .map(|i| {
            let (addr, token, keys, mode) = (s.addr, s.tokens[i as usize], s.keys.clone(), s.mode);
            let (gate, open) = (s.gate.clone(), open.clone());
            let early = early.next();
            tokio::spawn(async move {
                let mut dropped = 0;
                let mut dialed = still_usable(i, early).await;
                loop {
                    let pass = match &gate {
                        Some(gate) => Some(gate.enter().await),
                        None => None,
                    };
                    let (keys, open, ready) = (keys.clone(), open.clone(), dialed.take());
                    let opened = tokio::task::spawn_blocking(move || {
                        if let Some(dialed) = ready {
                            match open(dialed, &token, &keys, mode) {
                                // Closed by the server before the token got
                                // there, so it is still unused.
                                Err(e) if e.is_closed_under_us() => tracing::debug!(
                                    "data stream {i}: the connection dialed early was closed ({e}); dialing again"
                                ),
                                opened => return opened,
                            }
                        }
                        open(skiff_dataplane::connect(addr, i)?, &token, &keys, mode)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Err(StreamError::Protocol {
                            stream: i,
                            what: format!("stream thread failed: {e}"),
                        })
                    });
                    let e = match opened {
                        Ok(stream) => {
                            if let Some(pass) = pass {
                                pass.authenticated();
                            }
                            return Ok(stream);
                        }
                        Err(e) if e.is_dropped() => e,
                        Err(e) => return Err(e),
                    };
                    if let Some(pass) = pass {
                        pass.dropped();
                    }
                    dropped += 1;
                    let now = tokio::time::Instant::now();
                    let Some(pause) =
                        crate::busy::PRE_AUTH_DROPS.next(dropped, rand::random(), now, deadline)
                    else {
                        return Err(e);
                    };
                    tracing::debug!(
                        "data stream {i} turned away (try {dropped}); again in {pause:?}"
                    );
                    tokio::time::sleep(pause).await;
                }
            })
        })
        .collect()
}

/// Waits for the streams [`dial_streams`] opens.
async fn streams_opened<T>(host: &str, opening: PendingStreams<T>) -> Result<Vec<T>, SkiffError> {
    let mut out = Vec::new();
    let mut failed = None;
    for o in opening {
        match o.await {
            Ok(Ok(stream)) => out.push(stream),
            Ok(Err(e)) => {
                failed.get_or_insert_with(|| stream_not_opened(host, &e));
            }
            Err(e) => {
                failed.get_or_insert_with(|| {
                    SkiffError::new(ErrorKind::Protocol, format!("stream thread failed: {e}"))
                });
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// A stream that could not be opened. One the server turned away before
/// saying anything is [`ErrorKind::Busy`], as a connection dropped before
/// authentication is: a fan-out tries the host again.
fn stream_not_opened(host: &str, e: &StreamError) -> SkiffError {
    let kind = if e.is_dropped() {
        ErrorKind::Busy
    } else {
        ErrorKind::Connect
    };
    SkiffError::new(kind, format!("{host}: {e}"))
}

/// An upload stream: its writer, and the acknowledgement still to read when
/// records go out before it (aead only: they are sealed, so nobody but the
/// transfer process can read them; in the unencrypted modes nothing is
/// sent before the server has proved it holds the keys).
type UploadStream = (RecordWriter, Option<skiff_dataplane::Unacknowledged>);

/// Opens an upload's streams. Alone, in `aead` mode, records go out right
/// behind the token (a round trip saved); in a fan-out every stream waits
/// for its acknowledgement first, so that one the server turned away is
/// known before any record was spent on it and can be dialed again.
fn dial_upload_streams(s: &mut Session) -> PendingStreams<UploadStream> {
    if s.mode == Mode::Aead && s.gate.is_none() {
        dial_streams(
            s,
            |dialed: Dialed, token: &[u8; TOKEN_LEN], keys: &Keys, mode| {
                dialed
                    .present_early(token, keys, mode)
                    .map(|(w, pending)| (w, Some(pending)))
            },
        )
    } else {
        dial_streams(
            s,
            |dialed: Dialed, token: &[u8; TOKEN_LEN], keys: &Keys, mode| {
                dialed
                    .present(token, keys, mode)
                    .map(|(w, _reader)| (w, None))
            },
        )
    }
}

/// Bytes moved by the stream threads, reported to `progress` from the async side.
#[derive(Default)]
struct Counter {
    total: AtomicU64,
    reported: AtomicU64,
}

impl Counter {
    fn flush(&self, progress: &dyn Progress) {
        let now = self.total.load(Ordering::Relaxed);
        let before = self.reported.swap(now, Ordering::Relaxed);
        if now > before {
            progress.advance(now - before);
        }
    }
}

/// Keeps the error that explains a failed transfer: the first stream's own
/// failure rather than the others that stopped because of it.
fn keep_cause(kept: &mut Option<skiff_dataplane::StreamError>, e: skiff_dataplane::StreamError) {
    if kept
        .as_ref()
        .is_none_or(|k| k.is_consequence() && !e.is_consequence())
    {
        *kept = Some(e);
    }
}

fn stream_failed(host: &str, e: impl std::fmt::Display) -> SkiffError {
    SkiffError::new(ErrorKind::Protocol, format!("{host}: transfer failed: {e}"))
}

/// What the producer thread tells the async side.
enum Produced {
    Msg(ClientMsg),
    Total(u64),
    Failure(String),
}

async fn upload(
    mut s: Session,
    sources: &[PathBuf],
    job: &CopyJob,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let host = s.control.host.clone();
    let pending = dial_upload_streams(&mut s);
    let mut report = CopyReport::default();
    match s.control.recv().await? {
        ServerMsg::Ready => {}
        ServerMsg::Failed { message, .. } => {
            // The server refused the target and is ending: the streams
            // it will never take close with it.
            report.failures.push(server_text(&message));
            let _ = streams_opened(&host, pending).await;
            return Ok(report);
        }
        other => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: unexpected {other:?}"),
            ))
        }
    }
    let streams = streams_opened(&host, pending).await?;
    let watch = watch_of(streams.iter().map(|(w, _)| w.socket()));
    let mut stall = Stall::new(s.stall, std::time::Instant::now());
    let counter = Arc::new(Counter::default());
    let queue = ChunkQueue::new(QUEUE_CHUNKS);
    let read_failures = Arc::new(Mutex::new(Vec::<(u32, String)>::new()));
    // A stream the server never acknowledges (it refused the token) stops
    // the transfer at once: the server does not know about it.
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel::<SkiffError>();
    let mut senders = Vec::new();
    for (writer, unacknowledged) in streams {
        let (queue, counter, read_failures, refused_tx) = (
            queue.clone(),
            counter.clone(),
            read_failures.clone(),
            refused_tx.clone(),
        );
        let host = host.clone();
        senders.push(std::thread::spawn(move || {
            let ack = unacknowledged.map(|pending| {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    let acked = pending.acknowledged().map(drop);
                    if let Err(e) = &acked {
                        // Told before the other streams stop, so it is
                        // there to explain their failures.
                        let _ = refused_tx.send(stream_not_opened(&host, e));
                        queue.abort();
                    }
                    acked
                })
            });
            let sent = |n: u64| {
                counter.total.fetch_add(n, Ordering::Relaxed);
            };
            let failed = |id: u32, e: std::io::Error| {
                read_failures
                    .lock()
                    .expect("lock")
                    .push((id, e.to_string()))
            };
            let result = queue.run_sender(writer, &sent, &failed);
            match ack.map(|t| t.join()) {
                Some(Ok(Err(e))) => Err(e),
                _ => result,
            }
        }));
    }
    drop(refused_tx);
    // The producer walks the sources on its own thread: announcing an
    // entry goes through the async control channel, its chunks through
    // the queue.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Produced>();
    let sizes = Arc::new(Mutex::new(
        std::collections::HashMap::<u32, (u64, String)>::new(),
    ));
    let producer = {
        let (queue, sources, recursive, sizes) = (
            queue.clone(),
            sources.to_vec(),
            job.recursive,
            sizes.clone(),
        );
        std::thread::spawn(move || produce(&queue, &sources, recursive, &tx, &sizes))
    };
    let mut tick = tokio::time::interval(PROGRESS_TICK.min(STALL_TICK));
    let mut producing = true;
    // Why the server gave up on the whole transfer, if it said.
    let mut server_reason = None;
    // A stream the server refused: the cause of everything else that failed.
    let mut refusal = None;
    // Nothing moved for the budget: what fails after the streams are cut
    // is a consequence.
    let mut gave_up = false;
    let outcome: Result<(), SkiffError> = loop {
        tokio::select! {
            produced = rx.recv(), if producing => match produced {
                Some(Produced::Msg(m)) => {
                    let end = m == ClientMsg::PutEnd;
                    if let Err(e) = s.control.send(&m).await {
                        break Err(e);
                    }
                    if end {
                        producing = false;
                    }
                }
                Some(Produced::Total(n)) => progress.add_total(n),
                Some(Produced::Failure(f)) => report.failures.push(f),
                None => producing = false,
            },
            msg = s.control.recv() => {
                stall.progress(std::time::Instant::now());
                let msg = msg.map(|m| {
                    let take = |id| sizes.lock().expect("lock").remove(&id);
                    upload_answer(m, take, &mut report, &mut server_reason, progress)
                });
                match msg {
                    Ok(Answer::Stored(_) | Answer::Settled) => {}
                    Ok(Answer::Other(ServerMsg::Done)) => break Ok(()),
                    Ok(Answer::Other(other)) => {
                        break Err(misbehaved(&host, format_args!("unexpected {other:?}")))
                    }
                    Err(e) => break Err(e),
                }
            },
            Some(reason) = refused_rx.recv() => {
                // A server that gave up on the transfer (a record failed its
                // check) closes its streams, and records still unread there
                // make the close a reset, which can take the stream's
                // acknowledgement with it: that looks like a refusal. The
                // server's own reason, if it sends one now, is the cause.
                if let Some(message) = server_last_word(&mut s.control).await {
                    server_reason = Some(message.clone());
                    report.failures.push(message);
                } else {
                    refusal = Some(reason);
                }
                break Err(SkiffError::new(ErrorKind::Connect, format!("{host}: refused")));
            }
            _ = tick.tick() => {
                counter.flush(progress);
                if let Some(idle) = stall.check(watch.bytes_moved(), std::time::Instant::now()) {
                    gave_up = true;
                    break Err(stalled(&host, idle));
                }
            }
        }
    };
    counter.flush(progress);
    if outcome.is_err() {
        // Senders blocked on a frozen path return once their sockets are down.
        queue.abort();
        watch.cut();
    }
    let mut stream_error = None;
    for t in senders {
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || t.join())
            .await
            .unwrap_or(Ok(Ok(())))
        {
            keep_cause(&mut stream_error, e);
        }
    }
    let _ = tokio::task::spawn_blocking(move || producer.join()).await;
    for (_, e) in read_failures.lock().expect("lock").drain(..) {
        report.failures.push(e);
    }
    // The refusal may be reported after the server's complaint about the
    // other streams, which stopped because of it (the senders are joined
    // now, so a refusal is queued if there was one).
    let refusal = match server_reason {
        // The server said why it ended the transfer: refusals after that
        // are its closing.
        Some(_) => None,
        None => refusal.or_else(|| refused_rx.try_recv().ok().filter(|_| !gave_up)),
    };
    if let Some(refused) = refusal {
        return Err(refused);
    }
    match (outcome, stream_error) {
        (Ok(()), None) => {}
        (Ok(()), Some(e)) => return Err(stream_failed(&host, e)),
        (Err(e), _) => {
            // The server's own account of why (an integrity failure, say)
            // is the better message when it sent one.
            if let Some(reason) = &server_reason {
                return Err(stream_failed(&host, reason));
            }
            return Err(e);
        }
    }
    Ok(report)
}

/// An upload's server answer, once [`upload_answer`] has applied it.
enum Answer {
    /// A file of this many bytes is stored under its final name.
    Stored(u64),
    /// A file, or the whole transfer, failed: in the report.
    Settled,
    /// Anything else, for the caller.
    Other(ServerMsg),
}

/// Applies an upload's `Stored` or `Failed` to `report`: `take` hands
/// over, and forgets, the size and local path of the file the server
/// settled; a failure of the whole transfer is kept in `server_reason` as
/// well, as its cause.
fn upload_answer(
    msg: ServerMsg,
    take: impl FnOnce(u32) -> Option<(u64, String)>,
    report: &mut CopyReport,
    server_reason: &mut Option<String>,
    progress: &dyn Progress,
) -> Answer {
    match msg {
        ServerMsg::Stored { id } => match take(id) {
            Some((size, path)) => {
                report.files += 1;
                report.bytes += size;
                progress.file_done(&path);
                Answer::Stored(size)
            }
            None => Answer::Settled,
        },
        ServerMsg::Failed {
            id: u32::MAX,
            message,
        } => {
            let message = server_text(&message);
            *server_reason = Some(message.clone());
            report.failures.push(message);
            Answer::Settled
        }
        ServerMsg::Failed { id, message } => {
            take(id);
            report.failures.push(server_text(&message));
            Answer::Settled
        }
        other => Answer::Other(other),
    }
}

/// The server's reason for ending a whole transfer, if it gives one within
/// [`LAST_WORD`]; `None` once the control channel ends or stays quiet.
/// Anything else it says meanwhile is passed over: the transfer is ending.
async fn server_last_word(control: &mut ControlChannel) -> Option<String> {
    let deadline = tokio::time::Instant::now() + LAST_WORD;
    loop {
        match tokio::time::timeout_at(deadline, control.recv()).await {
            Ok(Ok(ServerMsg::Failed {
                id: u32::MAX,
                message,
            })) => return Some(server_text(&message)),
            Ok(Ok(_)) => continue,
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

/// Walks the sources, announcing each entry and queueing file chunks.
fn produce(
    queue: &ChunkQueue,
    sources: &[PathBuf],
    recursive: bool,
    tx: &tokio::sync::mpsc::UnboundedSender<Produced>,
    sizes: &Mutex<std::collections::HashMap<u32, (u64, String)>>,
) {
    offer_tree(sources, recursive, queue, &mut |offered| match offered {
        Offered::Entry { wire, source } => {
            if !wire.is_dir {
                sizes
                    .lock()
                    .expect("lock")
                    .insert(wire.id, (wire.size, source.display().to_string()));
                let _ = tx.send(Produced::Total(wire.size));
            }
            tx.send(Produced::Msg(ClientMsg::Entry(wire))).is_ok()
        }
        Offered::Unsendable(why) => tx.send(Produced::Failure(why)).is_ok(),
    });
    let _ = tx.send(Produced::Msg(ClientMsg::PutEnd));
}

/// How a download's receiving thread ended.
type ReceiverEnd = Result<(), StreamError>;

async fn download(
    s: Session,
    sources: &[String],
    job: &CopyJob,
    placement: skiff_files::Placement,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let settled = Arc::new(Mutex::new(Vec::<Settled>::new()));
    let table = {
        let settled = settled.clone();
        FileTable::new(move |x| settled.lock().expect("lock").push(x))
    };
    let received = receive(s, sources, job, placement, progress, &table, &settled).await;
    if received.is_err() {
        // A download that fails returns only once none of its commits can
        // be cut short (which would leave a temporary behind).
        let table = table.clone();
        let _ = tokio::task::spawn_blocking(move || table.wait_commits()).await;
    }
    received
}

/// [`download`] into `table`, whose files' fates come to `settled`.
async fn receive(
    mut s: Session,
    sources: &[String],
    job: &CopyJob,
    placement: skiff_files::Placement,
    progress: &dyn Progress,
    table: &Arc<FileTable>,
    settled: &Mutex<Vec<Settled>>,
) -> Result<CopyReport, SkiffError> {
    let host = s.control.host.clone();
    let streams = streams_opened(
        &host,
        dial_streams(
            &mut s,
            |dialed: Dialed, token: &[u8; TOKEN_LEN], keys: &Keys, mode| {
                dialed.present(token, keys, mode)
            },
        ),
    )
    .await?;
    let watch = watch_of(streams.iter().map(|(_, r)| r.socket()));
    let counter = Arc::new(Counter::default());
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel::<ReceiverEnd>();
    let mut receiving = streams.len();
    for (writer, reader) in streams {
        drop(writer);
        let (table, counter, ended_tx) = (table.clone(), counter.clone(), ended_tx.clone());
        std::thread::spawn(move || {
            let end = table.run_receiver(reader, &|n| {
                counter.total.fetch_add(n, Ordering::Relaxed);
            });
            let _ = ended_tx.send(end);
        });
    }
    drop(ended_tx);
    let mut admitted = Admitted {
        host: &host,
        accepting: Accepting::download(
            table,
            &placement,
            job.preserve,
            Requested::new(sources, job.recursive),
        ),
        table,
        names: std::collections::HashMap::new(),
        report: CopyReport::default(),
    };
    let mut stall = Stall::new(s.stall, std::time::Instant::now());
    let mut tick = tokio::time::interval(PROGRESS_TICK.min(STALL_TICK));
    // Entries come until `Done`. Once every stream has ended too, the copy
    // is over when every file is settled; a file the server failed to read
    // may be reported on the channel a moment after the streams ended (the
    // channel runs through skiffd, the streams do not), so a file still
    // short waits for that, or for the transfer process to end, a little.
    let mut announcing = true;
    let mut control_open = true;
    let mut stream_error = None;
    let mut last_word: Option<tokio::time::Instant> = None;
    let outcome: Result<(), SkiffError> = loop {
        if !announcing && receiving == 0 {
            if !control_open || table.pending() == 0 {
                break Ok(());
            }
            last_word.get_or_insert_with(|| tokio::time::Instant::now() + LAST_WORD);
        }
        tokio::select! {
            _ = async { tokio::time::sleep_until(last_word.expect("guarded")).await }, if last_word.is_some() => break Ok(()),
            msg = s.control.recv(), if control_open => {
                stall.progress(std::time::Instant::now());
                match msg {
                    Ok(ServerMsg::Entry(e)) if announcing => {
                        if let Err(e) = admitted.entry(&e, progress) {
                            break Err(e);
                        }
                    }
                    Ok(ServerMsg::Failed { id, message }) => admitted.failed(id, &message),
                    // Bytes on the channel: only when the server chose to
                    // send the download so, granting no stream.
                    Ok(ServerMsg::Data { id, offset, bytes }) if s.streams == 0 => {
                        let counted = |n| {
                            counter.total.fetch_add(n, Ordering::Relaxed);
                        };
                        if let Err(e) = table.write_inline(id, offset, &bytes, &counted) {
                            break Err(misbehaved(&host, e));
                        }
                    }
                    Ok(ServerMsg::Done) if announcing => {
                        announcing = false;
                        table.close_announcements();
                    }
                    Ok(other) => break Err(misbehaved(&host, format_args!("unexpected {other:?}"))),
                    // The transfer process ends once it has sent everything.
                    Err(_) if !announcing => control_open = false,
                    Err(e) => break Err(e),
                }
            },
            Some(end) = ended_rx.recv() => {
                receiving -= 1;
                if let Err(e) = end {
                    keep_cause(&mut stream_error, e);
                    break Err(SkiffError::new(ErrorKind::Protocol, format!("{host}: transfer failed")));
                }
            }
            _ = tick.tick() => {
                counter.flush(progress);
                let now = std::time::Instant::now();
                if table.committing() {
                    stall.progress(now);
                }
                if let Some(idle) = stall.check(watch.bytes_moved(), now) {
                    break Err(stalled(&host, idle));
                }
            }
        }
    };
    counter.flush(progress);
    if let Err(e) = outcome {
        // Every temporary goes; threads blocked on the streams return.
        table.abort();
        watch.cut();
        let stream_failed_first = stream_error.is_some();
        while let Some(end) = ended_rx.recv().await {
            // Streams cut for another reason fail as a consequence.
            if let (Err(e), true) = (end, stream_failed_first) {
                keep_cause(&mut stream_error, e);
            }
        }
        return Err(match stream_error {
            Some(cause) => stream_failed(&host, cause),
            None => e,
        });
    }
    // Every stream has ended and the server has said all it will: a file
    // still short will not be completed.
    let short = table.incomplete();
    if let Some(first) = short.first() {
        let more = match short.len() {
            1 => String::new(),
            n => format!(" (and {} more files)", n - 1),
        };
        let ended = match s.streams {
            0 => "the server's answer",
            _ => "the server's streams",
        };
        return Err(misbehaved(
            &host,
            format_args!(
                "{ended} ended before all of {} arrived{more}",
                server_text(first)
            ),
        ));
    }
    // Files completed on the channel may still be committing, on the
    // table's commit threads.
    let committed = {
        let table = table.clone();
        tokio::task::spawn_blocking(move || table.wait_settled()).await
    };
    if !matches!(committed, Ok(true)) {
        return Err(stream_failed(
            &host,
            table
                .abort_reason()
                .unwrap_or_else(|| "the download was aborted".into()),
        ));
    }
    let Admitted {
        accepting,
        mut names,
        mut report,
        ..
    } = admitted;
    for x in settled.lock().expect("lock").drain(..) {
        match x {
            Settled::Stored(id) => {
                if let Some((size, path)) = names.remove(&id) {
                    report.files += 1;
                    report.bytes += size;
                    progress.file_done(&path);
                }
            }
            Settled::Failed(_, message) => report.failures.push(server_text(&message)),
        }
    }
    report.failures.extend(accepting.finish());
    Ok(report)
}

/// A download's entries so far: what was made for each, and the per-file
/// outcome.
struct Admitted<'a> {
    host: &'a str,
    accepting: Accepting<'a>,
    table: &'a FileTable,
    /// Files expected on the streams: size and path as shown.
    names: std::collections::HashMap<u32, (u64, String)>,
    report: CopyReport,
}

impl Admitted<'_> {
    /// Takes an announced entry: an id seen before, or an entry the request
    /// does not name, ends the copy; a file or directory that cannot be
    /// made here fails alone.
    fn entry(&mut self, e: &EntryWire, progress: &dyn Progress) -> Result<(), SkiffError> {
        let accepted = self
            .accepting
            .entry(e)
            .map_err(|broke| misbehaved(self.host, broke))?;
        match accepted {
            Accepted::File(size, path) => {
                progress.add_total(size);
                self.names.insert(e.id, (size, path));
            }
            Accepted::Dir => self.report.dirs += 1,
            Accepted::Failed(message) => self.report.failures.push(server_text(&message)),
        }
        Ok(())
    }

    /// The server could not send a source or file.
    fn failed(&mut self, id: u32, message: &str) {
        if id != u32::MAX {
            self.table.abandon(id);
            self.names.remove(&id);
        }
        self.report.failures.push(server_text(message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(streams: Option<u32>) -> PlaneOptions {
        PlaneOptions {
            mode: Mode::Aead,
            streams,
            stall: None,
            gate: None,
            inline: true,
        }
    }

    fn download() -> CopyJob {
        CopyJob {
            direction: Direction::Download {
                sources: vec!["etc/conf".into()],
                target: PathBuf::from("."),
            },
            recursive: true,
            preserve: false,
        }
    }

    /// The request the opening carries, decoded.
    fn request_of(opening: &Opening) -> ClientMsg {
        let (_, hello) = dp::decode_client(&opening.bytes).unwrap().unwrap();
        let (request, used) = dp::decode_client(&opening.bytes[hello..]).unwrap().unwrap();
        assert_eq!(hello + used, opening.bytes.len(), "Hello and the request");
        request
    }

    fn offered(opening: &Opening) -> Option<InlineLimits> {
        match request_of(opening) {
            ClientMsg::Get { inline, .. } => inline,
            other => panic!("{other:?}"),
        }
    }

    const NEAR_RTT: Duration = Duration::from_micros(300);
    const FAR_RTT: Duration = Duration::from_millis(40);

    #[test]
    fn a_download_offers_the_channel_only_to_a_server_that_speaks_version_three() {
        let job = download();
        let near = Opening::with_streams(&job, &options(None), NEAR_RTT, INLINE_DOWNLOAD_SINCE);
        assert_eq!(near.version, INLINE_DOWNLOAD_SINCE);
        assert_eq!(
            offered(&near),
            Some(InlineLimits {
                bytes: INLINE_NEAR.bytes,
                entries: INLINE_NEAR.entries as u32
            })
        );
        // Near, nothing is dialed before the answer; the streams asked for
        // are still the default.
        assert_eq!((near.requested, near.dial_early), (2, 0));

        let far = Opening::with_streams(&job, &options(None), FAR_RTT, INLINE_DOWNLOAD_SINCE);
        assert_eq!(offered(&far).map(|l| l.bytes), Some(INLINE_FAR_BYTES));
        assert_eq!((far.requested, far.dial_early), (8, 8));

        // An older skiffd, a named stream count, or a retry after a
        // refusal: version 1, no offer.
        let older = Opening::with_streams(&job, &options(None), NEAR_RTT, INLINE_UPLOAD_SINCE);
        let named = Opening::with_streams(&job, &options(Some(3)), NEAR_RTT, 3);
        let mut off = options(None);
        off.inline = false;
        let retry = Opening::with_streams(&job, &off, NEAR_RTT, 3);
        for o in [&older, &named, &retry] {
            assert_eq!(o.version, OLDEST_VERSION);
            assert_eq!(offered(o), None);
            assert_eq!(o.dial_early, o.requested);
        }
        assert_eq!(named.requested, 3);
    }

    #[test]
    fn the_answer_must_fit_what_was_asked() {
        let job = download();
        let offering = Opening::with_streams(&job, &options(None), NEAR_RTT, 3);
        assert!(offering.streams_fit(0), "the server chose the channel");
        assert!(offering.streams_fit(2));
        assert!(!offering.streams_fit(3));
        let plain = Opening::with_streams(&job, &options(None), NEAR_RTT, 2);
        assert!(!plain.streams_fit(0), "a version-1 download needs streams");
        assert!(plain.streams_fit(1));
        let upload = Opening::begin(&job, &options(None), INLINE_UPLOAD_SINCE, 0, None);
        assert!(upload.streams_fit(0));
        assert!(
            !upload.streams_fit(1),
            "a token for an upload on the channel"
        );
    }
}
