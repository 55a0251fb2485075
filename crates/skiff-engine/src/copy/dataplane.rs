//! `skiff cp` to and from skiffd over the data plane: the `transfer@skiff`
//! subsystem carries the key exchange and the control messages inside the
//! authenticated SSH session; the bytes go over extra TCP streams to the
//! same port, in sealed records, one thread per stream.
//!
//! A server without the subsystem (a stock sshd, or a skiffd with the data
//! plane off) makes [`copy`] return `Ok(None)`, and the caller uses SFTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use skiff_dataplane::{
    connect_stream, dial, finish_dirs, prepare_entry, ChunkQueue, Dialed, FileTable, Outgoing,
    PendingDir, Prepared, RecordReader, RecordWriter, Settled,
};
use skiff_files::EntryKind;
use skiff_proto::dataplane::{
    self as dp, ClientMsg, EntryWire, Keys, Mode, ServerMsg, SECRET_LEN, TOKEN_LEN, VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{CopyJob, CopyReport, Direction, Progress};
use crate::error::{ErrorKind, SkiffError};
use crate::Connection;

/// What the user asked of the data plane.
#[derive(Debug, Clone, Copy)]
pub struct PlaneOptions {
    pub mode: Mode,
    /// Streams to open; `None` picks from the round-trip time.
    pub streams: Option<u32>,
}

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
    async fn send(&mut self, msg: &ClientMsg) -> Result<(), SkiffError> {
        let bytes = dp::encode_client(msg);
        self.wr.write_all(&bytes).await.map_err(|e| self.lost(&e))?;
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

/// An established data plane: keys, mode, tokens.
struct Session {
    control: ControlChannel,
    keys: Arc<Keys>,
    mode: Mode,
    tokens: Vec<[u8; TOKEN_LEN]>,
    addr: SocketAddr,
    /// `--streams`, if given.
    chosen: Option<u32>,
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

/// Copies over the data plane. `Ok(None)`: the server does not offer it.
pub async fn copy(
    conn: &Connection,
    job: &CopyJob,
    options: &PlaneOptions,
    progress: &dyn Progress,
) -> Result<Option<CopyReport>, SkiffError> {
    let host = conn.settings.hostname.clone();
    let Some(addr) = conn.peer_addr else {
        return Ok(None);
    };
    let mut channel = crate::exec::open_session(conn).await?.into_channel();
    channel
        .request_subsystem(true, dp::SUBSYSTEM)
        .await
        .map_err(|e| {
            SkiffError::new(ErrorKind::Connect, format!("{host}: connection lost: {e}"))
        })?;
    loop {
        match channel.wait().await {
            Some(ChannelMsg::Success) => break,
            Some(ChannelMsg::Failure) | Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                return Ok(None);
            }
            Some(_) => {}
        }
    }
    copy_on(channel.into_stream(), &host, addr, job, options, progress)
        .await
        .map(Some)
}

/// Copies over the data plane, with the `transfer@skiff` subsystem already
/// started on `stream` (a channel the agent holds, say); the data streams
/// go to `addr`, the SSH server's address.
pub async fn copy_on<S>(
    stream: S,
    host: &str,
    addr: SocketAddr,
    job: &CopyJob,
    options: &PlaneOptions,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let host = host.to_string();
    let (rd, wr) = tokio::io::split(stream);
    let mut control = ControlChannel {
        rd: Box::new(rd),
        wr: Box::new(wr),
        buf: Vec::new(),
        host: host.clone(),
    };
    let mut secret = [0u8; SECRET_LEN];
    rand::fill(&mut secret);
    // Without a stream count from the user, ask for up to 8 and use what
    // the round trip suggests (see `dial_streams`).
    let asked = options.streams.unwrap_or(8).clamp(1, 16);
    control
        .send(&ClientMsg::Hello {
            version: VERSION,
            mode: options.mode,
            streams: asked,
            secret,
        })
        .await?;
    let (server_secret, tokens) = match control.recv().await? {
        ServerMsg::Welcome {
            version,
            mode,
            secret,
            tokens,
        } => {
            if version != VERSION
                || mode != options.mode
                || tokens.is_empty()
                || tokens.len() > asked as usize
            {
                return Err(SkiffError::new(
                    ErrorKind::Protocol,
                    format!("{host}: the server answered the data-plane request with other terms (version {version}, mode {mode}, {} streams)", tokens.len()),
                ));
            }
            (secret, tokens)
        }
        ServerMsg::Refused { reason } => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: the server refused the data plane: {reason}"),
            ))
        }
        other => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: unexpected data-plane message {other:?}"),
            ))
        }
    };
    tracing::debug!(
        "{host}: data plane up: mode {}, {} streams",
        options.mode,
        tokens.len()
    );
    let session = Session {
        control,
        keys: Arc::new(dp::derive_keys(&secret, &server_secret, options.mode)),
        mode: options.mode,
        tokens,
        addr,
        chosen: options.streams,
    };
    match &job.direction {
        Direction::Upload { sources, target } => {
            upload(session, sources, target, job, progress).await
        }
        Direction::Download { sources, target } => {
            download(session, sources, target, job, progress).await
        }
    }
}

/// Dials the first stream, whose TCP handshake measures the round trip,
/// and decides how many streams to use (`--streams`, else by RTT; never
/// more than the server granted). Unused tokens expire on the server.
async fn dial_first(s: &Session) -> Result<(Dialed, u32), SkiffError> {
    let (addr, token) = (s.addr, s.tokens[0]);
    let first = tokio::task::spawn_blocking(move || dial(addr, &token, 0))
        .await
        .map_err(|e| SkiffError::new(ErrorKind::Protocol, format!("stream thread failed: {e}")))?
        .map_err(|e| SkiffError::new(ErrorKind::Connect, format!("{}: {e}", s.control.host)))?;
    let n = s
        .chosen
        .unwrap_or_else(|| default_streams(first.connect_time))
        .clamp(1, s.tokens.len() as u32);
    tracing::debug!(
        "{}: {n} streams (connect took {:?})",
        s.control.host,
        first.connect_time
    );
    Ok((first, n))
}

/// Dials the other streams and waits for every acknowledgement (on
/// blocking threads, in parallel).
async fn open_streams(
    s: &Session,
    first: Dialed,
    n: u32,
) -> Result<Vec<(RecordWriter, RecordReader)>, SkiffError> {
    let mut opening = Vec::new();
    let (keys, mode) = (s.keys.clone(), s.mode);
    opening.push(tokio::task::spawn_blocking(move || {
        first.finish(&keys, mode)
    }));
    for (i, token) in s.tokens.iter().enumerate().take(n as usize).skip(1) {
        let (addr, token, keys, mode) = (s.addr, *token, s.keys.clone(), s.mode);
        opening.push(tokio::task::spawn_blocking(move || {
            connect_stream(addr, &token, &keys, mode, i as u32)
        }));
    }
    let mut out = Vec::new();
    for o in opening {
        let stream = o
            .await
            .map_err(|e| {
                SkiffError::new(ErrorKind::Protocol, format!("stream thread failed: {e}"))
            })?
            .map_err(|e| SkiffError::new(ErrorKind::Connect, format!("{}: {e}", s.control.host)))?;
        out.push(stream);
    }
    Ok(out)
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
    target: &str,
    job: &CopyJob,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let host = s.control.host.clone();
    let (first, n) = dial_first(&s).await?;
    s.control
        .send(&ClientMsg::Put {
            target: target.to_string(),
            sources: sources.len() as u32,
            recursive: job.recursive,
            preserve: job.preserve,
            streams: n,
        })
        .await?;
    let mut report = CopyReport::default();
    match s.control.recv().await? {
        ServerMsg::Ready => {}
        ServerMsg::Failed { message, .. } => {
            report.failures.push(message);
            return Ok(report);
        }
        other => {
            return Err(SkiffError::new(
                ErrorKind::Protocol,
                format!("{host}: unexpected {other:?}"),
            ))
        }
    }
    let streams = open_streams(&s, first, n).await?;
    let counter = Arc::new(Counter::default());
    let queue = ChunkQueue::new(QUEUE_CHUNKS);
    let read_failures = Arc::new(Mutex::new(Vec::<(u32, String)>::new()));
    let mut senders = Vec::new();
    for (writer, reader) in streams {
        drop(reader);
        let (queue, counter, read_failures) =
            (queue.clone(), counter.clone(), read_failures.clone());
        senders.push(std::thread::spawn(move || {
            let sent = |n: u64| {
                counter.total.fetch_add(n, Ordering::Relaxed);
            };
            let failed = |id: u32, e: std::io::Error| {
                read_failures
                    .lock()
                    .expect("lock")
                    .push((id, e.to_string()))
            };
            queue.run_sender(writer, &sent, &failed)
        }));
    }
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
    let mut tick = tokio::time::interval(PROGRESS_TICK);
    let mut producing = true;
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
            msg = s.control.recv() => match msg {
                Ok(ServerMsg::Stored { id }) => {
                    if let Some((size, path)) = sizes.lock().expect("lock").remove(&id) {
                        report.files += 1;
                        report.bytes += size;
                        progress.file_done(&path);
                    }
                }
                Ok(ServerMsg::Failed { id: u32::MAX, message }) => report.failures.push(message),
                Ok(ServerMsg::Failed { id, message }) => {
                    sizes.lock().expect("lock").remove(&id);
                    report.failures.push(message);
                }
                Ok(ServerMsg::Done) => break Ok(()),
                Ok(other) => break Err(SkiffError::new(ErrorKind::Protocol, format!("{host}: unexpected {other:?}"))),
                Err(e) => break Err(e),
            },
            _ = tick.tick() => counter.flush(progress),
        }
    };
    counter.flush(progress);
    if outcome.is_err() {
        queue.abort();
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
    match (outcome, stream_error) {
        (Ok(()), None) => {}
        (Ok(()), Some(e)) => return Err(stream_failed(&host, e)),
        (Err(e), _) => {
            // The server's own account of why (an integrity failure, say)
            // is the better message when it sent one.
            if let Some(reason) = report.failures.last() {
                return Err(stream_failed(&host, reason));
            }
            return Err(e);
        }
    }
    Ok(report)
}

/// Walks the sources, announcing each entry and queueing file chunks.
fn produce(
    queue: &ChunkQueue,
    sources: &[PathBuf],
    recursive: bool,
    tx: &tokio::sync::mpsc::UnboundedSender<Produced>,
    sizes: &Mutex<std::collections::HashMap<u32, (u64, String)>>,
) {
    let mut next_id = 0u32;
    'sources: for source in sources {
        for entry in skiff_files::walk(source, recursive) {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(Produced::Failure(e.to_string()));
                    continue;
                }
            };
            let Some(rel) = entry.rel.to_str() else {
                let _ = tx.send(Produced::Failure(format!(
                    "{}: name is not UTF-8; not copied",
                    entry.source.display()
                )));
                continue;
            };
            let is_dir = entry.kind == EntryKind::Dir;
            let file = if is_dir {
                None
            } else {
                match std::fs::File::open(&entry.source) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let _ = tx.send(Produced::Failure(
                            skiff_files::FileError::io(&entry.source, &e).to_string(),
                        ));
                        continue;
                    }
                }
            };
            let id = next_id;
            next_id += 1;
            if !is_dir {
                sizes
                    .lock()
                    .expect("lock")
                    .insert(id, (entry.size, entry.source.display().to_string()));
                let _ = tx.send(Produced::Total(entry.size));
            }
            let wire = EntryWire {
                id,
                rel: rel.to_string(),
                is_dir,
                size: entry.size,
                mode: entry.mode,
                mtime: entry.mtime,
                mtime_nsec: entry.mtime_nsec,
                atime: entry.atime,
                atime_nsec: entry.atime_nsec,
            };
            if tx.send(Produced::Msg(ClientMsg::Entry(wire))).is_err() {
                break 'sources;
            }
            if let Some(f) = file {
                if !queue.push(Outgoing::new(id, f, entry.size)) {
                    break 'sources;
                }
            }
        }
    }
    queue.close();
    let _ = tx.send(Produced::Msg(ClientMsg::PutEnd));
}

async fn download(
    mut s: Session,
    sources: &[String],
    target: &Path,
    job: &CopyJob,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let host = s.control.host.clone();
    let mut report = CopyReport::default();
    let placement = match skiff_files::resolve_target(target, sources.len()) {
        Ok(p) => p,
        Err(e) => {
            report.failures.push(e.to_string());
            return Ok(report);
        }
    };
    let (first, n) = dial_first(&s).await?;
    s.control
        .send(&ClientMsg::Get {
            sources: sources.to_vec(),
            recursive: job.recursive,
            preserve: job.preserve,
            streams: n,
        })
        .await?;
    let streams = open_streams(&s, first, n).await?;
    let settled = Arc::new(Mutex::new(Vec::<Settled>::new()));
    let table = {
        let settled = settled.clone();
        FileTable::new(move |x| settled.lock().expect("lock").push(x))
    };
    let counter = Arc::new(Counter::default());
    let mut receivers = Vec::new();
    for (writer, reader) in streams {
        drop(writer);
        let (table, counter) = (table.clone(), counter.clone());
        receivers.push(std::thread::spawn(move || {
            table.run_receiver(reader, &|n| {
                counter.total.fetch_add(n, Ordering::Relaxed);
            })
        }));
    }
    let mut names = std::collections::HashMap::<u32, (u64, String)>::new();
    let mut dirs: Vec<PendingDir> = Vec::new();
    let mut tick = tokio::time::interval(PROGRESS_TICK);
    let outcome: Result<(), SkiffError> = loop {
        tokio::select! {
            msg = s.control.recv() => match msg {
                Ok(ServerMsg::Entry(e)) => {
                    match prepare_entry(&table, &placement, &e, job.preserve, &mut dirs) {
                        Prepared::File(size, path) => {
                            progress.add_total(size);
                            names.insert(e.id, (size, path));
                        }
                        Prepared::Dir => report.dirs += 1,
                        Prepared::Failed(message) => report.failures.push(message),
                    }
                }
                Ok(ServerMsg::Failed { id, message }) => {
                    if id != u32::MAX {
                        table.abandon(id);
                        names.remove(&id);
                    }
                    report.failures.push(message);
                }
                Ok(ServerMsg::Done) => break Ok(()),
                Ok(other) => break Err(SkiffError::new(ErrorKind::Protocol, format!("{host}: unexpected {other:?}"))),
                Err(e) => break Err(e),
            },
            _ = tick.tick() => counter.flush(progress),
        }
    };
    if let Err(e) = outcome {
        table.abort();
        return Err(e);
    }
    // Every entry is announced; wait for the bytes, reporting progress. A
    // late failure message from a sender may still come on the channel.
    let waiter = {
        let table = table.clone();
        tokio::task::spawn_blocking(move || table.wait_settled())
    };
    tokio::pin!(waiter);
    let all_settled = loop {
        tokio::select! {
            done = &mut waiter => break done.unwrap_or(false),
            msg = s.control.recv() => match msg {
                Ok(ServerMsg::Failed { id, message }) => {
                    if id != u32::MAX {
                        table.abandon(id);
                        names.remove(&id);
                    }
                    report.failures.push(message);
                }
                Ok(_) => {}
                Err(_) => {
                    // The server finished (or died): the streams tell which.
                    break tokio::task::spawn_blocking({
                        let table = table.clone();
                        move || table.wait_settled()
                    })
                    .await
                    .unwrap_or(false);
                }
            },
            _ = tick.tick() => counter.flush(progress),
        }
    };
    counter.flush(progress);
    let mut stream_error = None;
    for t in receivers {
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || t.join())
            .await
            .unwrap_or(Ok(Ok(())))
        {
            keep_cause(&mut stream_error, e);
        }
    }
    if let Some(e) = stream_error {
        table.abort();
        return Err(stream_failed(&host, e));
    }
    if !all_settled {
        return Err(stream_failed(&host, "the transfer was aborted"));
    }
    for x in settled.lock().expect("lock").drain(..) {
        match x {
            Settled::Stored(id) => {
                if let Some((size, path)) = names.remove(&id) {
                    report.files += 1;
                    report.bytes += size;
                    progress.file_done(&path);
                }
            }
            Settled::Failed(_, message) => report.failures.push(message),
        }
    }
    report.failures.extend(finish_dirs(&dirs));
    Ok(report)
}
