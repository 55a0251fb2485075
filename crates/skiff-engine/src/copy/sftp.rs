//! The SFTP backend of `skiff cp`: works with any SSH server that has the
//! `sftp` subsystem (stock OpenSSH, skiffd).
//!
//! * Started in one flight behind a server that reads requests in order
//!   (OpenSSH's sftp-server, skiffd's): `INIT`, the `limits@openssh.com`
//!   question and the copy's first requests (the target's `stat`, a
//!   temporary's `open`) go out together, and `VERSION` is awaited only
//!   where what it settles is needed ([`Sftp::start`]).
//! * Pipelined: up to [`REQUESTS_PER_FILE`] writes of up to 256 KiB (or the
//!   server's `limits@openssh.com` values) are outstanding per file, reads
//!   as many as [`super::read_ahead`] allows (64, and more while the
//!   answers show the path has room), and up to [`FILES_AT_ONCE`] files move at once, so
//!   throughput is not bound by round trips.
//! * Uploads big enough to gain from it ([`super::sftp_channels`] decides)
//!   are spread over several SFTP channels of the same connection, each
//!   with its own window (a stock sshd's is 2 MiB per channel): files take
//!   turns starting on each, and a large file is written through several
//!   at once, each channel opening the same temporary file and writing its
//!   own chunks at their offsets. The file's first channel checks its size
//!   (`fstat`), syncs and renames it only after every channel's writes for
//!   it succeeded. A channel the server refuses (`MaxSessions`, say) is
//!   done without; [`MoreChannels`] opens them.
//! * Atomic on both sides: a remote file is written under a temporary name
//!   in its target directory (`.<name>.skiff-<random>`), fsynced when the
//!   server offers `fsync@openssh.com`, and renamed over the final name with
//!   `posix-rename@openssh.com` (plain rename otherwise); local files are
//!   written through [`skiff_files::AtomicFile`]. An interrupted copy never
//!   leaves a truncated file under the final name. Each remote temporary
//!   is in the copy's [`Temporaries`] from just before it is created until
//!   it is renamed or removed, so that a copy stopped from outside can have
//!   it removed; a file that fails removes its own.
//! * scp's semantics: target placement, `-r`, `-p` (mode and times; SFTP
//!   carries whole seconds), symlinks followed, relative remote paths
//!   relative to the login directory, `~/` accepted.
//! * Errors: a file that fails is reported (one line naming it) and the
//!   rest goes on; a lost connection or SFTP session ends the copy with an
//!   error.
//! * The server is not trusted: a download admits only what the request
//!   names ([`skiff_files::Requested`]: a listing that names an entry twice
//!   ends the copy), modes follow [`ReceivePolicy::Download`] (no set-id or
//!   sticky bits; directories that existed keep their mode and times), a
//!   read answered with more bytes than asked for ends the copy, and the
//!   server's words reach the report through [`skiff_proto::terminal_text`].

use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use russh::ChannelMsg;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::client::rawsession::Limits;
use russh_sftp::client::{Config, RawSftpSession};
use russh_sftp::protocol::{FileAttributes, OpenFlags, Packet, Status, StatusCode};
use skiff_files::{
    AtomicFile, Entry, EntryKind, FileError, MadeDir, Placement, ReceivePolicy, Requested, Times,
};
use skiff_proto::terminal_text;

use super::leftovers::Temporaries;
use super::read_ahead::ReadAhead;
use super::sftp_channels;
use super::watchdog::Heard;
use super::{misbehaved, safe_report, CopyJob, CopyReport, Direction, Progress};
use crate::connect::Connection;
use crate::error::{ErrorKind, SkiffError};

/// Largest read or write request (OpenSSH's sftp-server allows 256 KiB
/// packets and says so through `limits@openssh.com`).
const MAX_CHUNK: u32 = 256 * 1024;
/// Write size for servers that do not state their limits (SFTP servers
/// must accept 32 KiB).
const SAFE_WRITE_CHUNK: u32 = 32 * 1024;
/// Read size for servers that do not state their limits (a server may
/// answer with less; short reads are handled).
const SAFE_READ_CHUNK: u32 = 64 * 1024;
/// Outstanding write requests per file (reads: [`super::read_ahead`]).
pub const REQUESTS_PER_FILE: usize = 64;
/// Files copied at the same time (small files are round-trip bound).
pub const FILES_AT_ONCE: usize = 4;
/// Chunks read ahead from a local file, or queued for writing to one.
const LOCAL_QUEUE: usize = 16;
/// How long one SFTP request may take (an fsync of a large file is slow; a
/// dead peer is caught sooner by the connection's keepalives).
const REQUEST_TIMEOUT_SECS: u64 = 300;
/// Largest SFTP packet accepted from the server.
const MAX_INCOMING_PACKET: u32 = 1024 * 1024 + 1024;
/// Longest part of a name kept in a temporary name.
const MAX_NAME_IN_TEMP: usize = 200;

/// How often the first SFTP channel is asked for again after the server
/// refused it (see [`Sftp::open`]).
const FIRST_CHANNEL_RETRIES: u32 = 3;

const POSIX_RENAME: &str = "posix-rename@openssh.com";

/// Downloads take from the server only what [`ReceivePolicy::Download`] allows.
const POLICY: ReceivePolicy = ReceivePolicy::Download;

/// A stream that carries an SFTP session (a channel with the subsystem
/// started, or the agent's end of one).
pub trait SftpStream:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> SftpStream for T {}

/// Opens more SFTP channels to the server a copy talks to, for an upload
/// spread over several.
pub trait MoreChannels: Send + Sync {
    /// One more channel with the `sftp` subsystem started; `Err` (why, for
    /// a debug line) when the server or the path refused it.
    fn open(&self) -> futures::future::BoxFuture<'_, Result<Box<dyn SftpStream>, String>>;
}

/// More channels on a connection this process holds.
struct DirectChannels<'c>(&'c Connection);

impl MoreChannels for DirectChannels<'_> {
    fn open(&self) -> futures::future::BoxFuture<'_, Result<Box<dyn SftpStream>, String>> {
        Box::pin(async move {
            let channel = open_subsystem(self.0).await.map_err(|e| e.to_string())?;
            Ok(Box::new(channel.into_stream()) as Box<dyn SftpStream>)
        })
    }
}

/// Copies `job` over SFTP on `conn`; an upload uses up to `channels`
/// channels ([`sftp_channels::DEFAULT_CHANNELS`] when `None`).
/// The copy fails once the server has sent nothing for the connection's
/// keepalive budget ([`crate::ConnectSettings::progress_budget`]). An
/// upload's temporaries are in `temps` while they are being written; any
/// still there when the copy ends (one that failed as a whole) are removed
/// before this returns, those of a copy dropped unfinished are the
/// caller's to remove ([`Temporaries::remove_all`]).
pub async fn copy(
    conn: &Connection,
    job: &CopyJob,
    channels: Option<usize>,
    progress: &dyn Progress,
    temps: &Temporaries,
) -> Result<CopyReport, SkiffError> {
    let heard = Heard::default();
    let direct = DirectChannels(conn);
    let temps = &temps.one_copy();
    let copying = async {
        let mut sftp = Sftp::open(conn, &heard, temps).await?;
        sftp.more = Some(&direct);
        sftp.channels = channels;
        run(sftp, job, progress).await
    };
    let host = &conn.settings.original_host;
    let copied = heard
        .watch(copying, conn.settings.progress_budget(), host)
        .await;
    finish(copied, temps).await
}

/// A copy that ended in an error (the watchdog's, say, which drops the
/// copy mid-file, or a lost session, which drops the files in flight)
/// leaves no temporary of its own behind that can still be removed.
async fn finish(
    copied: Result<CopyReport, SkiffError>,
    temps: &Temporaries,
) -> Result<CopyReport, SkiffError> {
    if temps.has_own() {
        let cleanup = temps.remove_own().await;
        for left in &cleanup.left {
            tracing::debug!("temporary not removed: {left}");
        }
    }
    copied
}

/// Copies `job` over an SFTP subsystem already started on `stream` (a
/// channel the agent holds, say). `host` names the server in messages,
/// `server` says what it runs (as far as known); `stall` is how long the server may stay silent (see [`copy`]); an
/// upload may add up to `channels` − 1 channels from `more`; its
/// temporaries are in `temps` (see [`copy`]).
#[allow(clippy::too_many_arguments)]
pub async fn copy_on<S>(
    stream: S,
    host: &str,
    server: crate::ServerKind,
    job: &CopyJob,
    stall: Option<std::time::Duration>,
    more: Option<&dyn MoreChannels>,
    channels: Option<usize>,
    progress: &dyn Progress,
    temps: &Temporaries,
) -> Result<CopyReport, SkiffError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let heard = Heard::default();
    let temps = &temps.one_copy();
    let copying = async {
        let mut sftp = Sftp::start(
            heard.listen(stream),
            host.to_string(),
            None,
            AskLimits::for_server(server),
            &heard,
            temps,
        )
        .await?;
        sftp.more = more;
        sftp.channels = channels;
        run(sftp, job, progress).await
    };
    let copied = heard.watch(copying, stall, host).await;
    finish(copied, temps).await
}

/// When the server's `limits@openssh.com` (the largest read and write) is
/// asked for. A client normally waits for `VERSION` (which lists the
/// extensions) before its first request, and some SFTP servers refuse a
/// request that comes earlier. OpenSSH's sftp-server and skiffd's answer
/// requests in order whatever came before, so behind an sshd or a skiffd
/// the question goes out with `INIT`, in the same flight, saving one round
/// trip at the start of every SFTP copy. If `VERSION` then does not list
/// the extension, the early answer (an error) is ignored. Through an agent
/// that does not say what software the server runs (older than
/// `agent_wire::SUBSYSTEM_KIND_SINCE`), a copy asks after `VERSION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AskLimits {
    WithInit,
    AfterVersion,
}

impl AskLimits {
    fn for_server(server: crate::ServerKind) -> AskLimits {
        match server {
            crate::ServerKind::OpenSsh | crate::ServerKind::Skiffd => AskLimits::WithInit,
            crate::ServerKind::Other => AskLimits::AfterVersion,
        }
    }
}

/// How every SFTP session of a copy is run.
fn session_config() -> Config {
    Config {
        max_packet_len: MAX_INCOMING_PACKET,
        request_timeout_secs: REQUEST_TIMEOUT_SECS,
        ..Config::default()
    }
}

/// Opens a session channel on `conn` and starts the `sftp` subsystem on it.
async fn open_subsystem(
    conn: &Connection,
) -> Result<russh::Channel<russh::client::Msg>, SkiffError> {
    let host = &conn.settings.original_host;
    let lost = |e: &dyn std::fmt::Display| {
        SkiffError::new(ErrorKind::Connect, format!("{host}: connection lost: {e}"))
    };
    let mut channel = crate::exec::open_session(conn).await?.into_channel();
    channel
        .request_subsystem(true, "sftp")
        .await
        .map_err(|e| lost(&e))?;
    loop {
        match channel.wait().await {
            Some(ChannelMsg::Success) => return Ok(channel),
            Some(ChannelMsg::Failure) => {
                let why = "the server refused the sftp subsystem (is SFTP enabled there?)";
                return Err(SkiffError::new(
                    ErrorKind::Refused,
                    format!("{host}: {why}"),
                ));
            }
            Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                return Err(lost(&"the channel closed before SFTP started"))
            }
            Some(_) => {}
        }
    }
}

async fn run(
    sftp: Sftp<'_>,
    job: &CopyJob,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let result = match &job.direction {
        Direction::Upload { sources, target } => sftp.upload(sources, target, job, progress).await,
        Direction::Download { sources, target } => {
            sftp.download(sources, target, job, progress).await
        }
    };
    let _ = sftp.raw.close_session();
    result.map(safe_report)
}

/// How one operation failed.
enum Fail {
    /// This file or directory failed (a line naming it); the copy goes on.
    File(String),
    /// The connection or the SFTP session is gone; the copy ends.
    Fatal(SkiffError),
}

/// What a remote path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RemoteKind {
    File,
    Dir,
    Symlink,
    Other,
}

fn kind_of(attrs: &FileAttributes) -> RemoteKind {
    match attrs.permissions.map(|p| p & 0o170000) {
        // A server that sends no permissions sends no type either: a file.
        None | Some(0o100000) => RemoteKind::File,
        Some(0o040000) => RemoteKind::Dir,
        Some(0o120000) => RemoteKind::Symlink,
        Some(_) => RemoteKind::Other,
    }
}

/// One entry of a remote source tree (see [`skiff_files::Entry`]).
#[derive(Debug, Clone)]
struct RemoteEntry {
    path: String,
    rel: PathBuf,
    kind: EntryKind,
    size: u64,
    mode: u32,
    atime: u32,
    mtime: u32,
}

impl RemoteEntry {
    fn new(path: String, rel: PathBuf, kind: EntryKind, attrs: &FileAttributes) -> Self {
        RemoteEntry {
            path,
            rel,
            kind,
            size: if kind == EntryKind::File {
                attrs.size.unwrap_or(0)
            } else {
                0
            },
            mode: attrs
                .permissions
                .map_or(if kind == EntryKind::Dir { 0o755 } else { 0o644 }, |p| {
                    p & 0o7777
                }),
            atime: attrs.atime.or(attrs.mtime).unwrap_or(0),
            mtime: attrs.mtime.unwrap_or(0),
        }
    }

    fn times(&self) -> Times {
        Times {
            atime: self.atime as i64,
            atime_nsec: 0,
            mtime: self.mtime as i64,
            mtime_nsec: 0,
        }
    }
}

/// SFTP v3 carries times as unsigned 32-bit seconds.
fn wire_time(secs: i64) -> u32 {
    secs.clamp(0, u32::MAX as i64) as u32
}

/// `base` joined with a relative path, as a remote path string.
fn remote_join(base: &str, rel: &Path) -> Result<String, String> {
    let rel = rel.to_str().ok_or_else(|| {
        format!(
            "{}: file name is not UTF-8; SFTP cannot carry it",
            rel.display()
        )
    })?;
    Ok(if base.is_empty() || base == "." {
        rel.to_string()
    } else if base.ends_with('/') {
        format!("{base}{rel}")
    } else {
        format!("{base}/{rel}")
    })
}

/// A placement's path for `rel`, as a remote path string.
fn remote_path_for(placement: &Placement, rel: &Path) -> Result<String, String> {
    let p = placement.path_for(rel);
    p.to_str().map(str::to_string).ok_or_else(|| {
        format!(
            "{}: file name is not UTF-8; SFTP cannot carry it",
            p.display()
        )
    })
}

/// The temporary name an upload to `path` is written under: in the same
/// directory, `.<name>.skiff-<random>`.
fn remote_temp_name(path: &str) -> String {
    let (dir, name) = match path.rfind('/') {
        Some(i) => path.split_at(i + 1),
        None => ("", path),
    };
    let mut cut = name.len().min(MAX_NAME_IN_TEMP);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut random = [0u8; 6];
    rand::fill(&mut random);
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{dir}.{}{}{hex}", &name[..cut], skiff_files::TEMP_MARKER)
}

/// The last component of a remote path, if it names something by itself.
fn remote_last_component(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or(trimmed);
    (!last.is_empty() && last != "." && last != ".." && last != "~").then_some(last)
}

/// SSH wire strings, for extension requests.
fn ssh_strings(parts: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p.as_bytes());
    }
    out
}

fn status_text(s: &Status) -> String {
    if s.error_message.trim().is_empty() {
        s.status_code.to_string()
    } else {
        terminal_text::one_line(s.error_message.trim()).into_owned()
    }
}

fn is_under(rel: &Path, failed: &[PathBuf]) -> bool {
    failed.iter().any(|f| rel.starts_with(f))
}

/// Where an upload's sources go when that does not wait for the
/// target's `stat`: into `dir/` (or `.`, `..`, `dir/.`, `dir/..`), which
/// can only be a directory; one file as the target's name, which is right
/// unless the target is a directory. `None`: look first (several sources,
/// a tree).
fn guess_placement(target: &str, entries: &[Entry], source_count: usize) -> Option<Placement> {
    let last = target.rsplit('/').next().unwrap_or(target);
    if source_count == 0 {
        None
    } else if matches!(last, "" | "." | "..") {
        Some(Placement::IntoDir(PathBuf::from(target)))
    } else if let [only] = entries {
        (source_count == 1 && only.kind == EntryKind::File)
            .then(|| Placement::AsName(PathBuf::from(target)))
    } else {
        None
    }
}

/// Whether files may be written where an upload placed them: at once, or
/// once the server's answer about the target has shown that the placement
/// guessed before it was right (the temporaries are created meanwhile,
/// so that their `open` goes out with the target's `stat`).
struct TargetGate(Option<tokio::sync::watch::Receiver<Option<bool>>>);

impl TargetGate {
    /// Files may be written at once.
    fn open() -> TargetGate {
        TargetGate(None)
    }

    /// Files wait for the verdict sent on the returned sender.
    fn pending() -> (tokio::sync::watch::Sender<Option<bool>>, TargetGate) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (tx, TargetGate(Some(rx)))
    }

    /// Waits for the verdict: `false` when the guess was wrong (or no
    /// verdict will come).
    async fn allows(&self) -> bool {
        let Some(rx) = &self.0 else { return true };
        let mut rx = rx.clone();
        let verdict = match rx.wait_for(Option::is_some).await {
            Ok(v) => *v == Some(true),
            Err(_) => false,
        };
        verdict
    }
}

/// Where an upload goes: the placement of its sources, the gate its
/// files pass before they are written, and how many channels it wants.
#[derive(Clone, Copy)]
struct Upload<'a> {
    placement: &'a Placement,
    gate: &'a TargetGate,
    wanted: usize,
}

/// An upload's target as typed (made ready for the server), with how
/// many sources go there and how many channels the upload wants.
#[derive(Clone, Copy)]
struct Target<'a> {
    target: &'a str,
    source_count: usize,
    wanted: usize,
}

/// An SFTP session on a connection, with what the server offers.
/// `each` of `files`, `at_once` at a time, each outcome as it ends. (A function of its own so that a copy's future is `Send`: rustc
/// cannot tell that of such a closure over borrowed entries written in
/// place.)
fn files_at_once<'s, T, Fut>(
    files: Vec<T>,
    at_once: usize,
    each: impl FnMut(T) -> Fut + Send + 's,
) -> impl futures::Stream<Item = Fut::Output> + Send + 's
where
    T: Send + 's,
    Fut: std::future::Future + Send + 's,
    Fut::Output: Send,
{
    futures::stream::iter(files.into_iter().map(each)).buffer_unordered(at_once)
}

/// What `VERSION` (and `limits@openssh.com`) settled for a session.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    /// The server's `limits@openssh.com`, for extra channels.
    limits: Option<Limits>,
    read_len: u32,
    write_len: u32,
    posix_rename: bool,
    fsync: bool,
    expand_path: bool,
}

/// `INIT`, `VERSION` and, when the server states them, its limits.
/// Requests are sent when this is first polled: `INIT`, then (`WithInit`)
/// the limits question.
async fn negotiate(
    raw: Arc<RawSftpSession>,
    host: String,
    ask: AskLimits,
) -> Result<Negotiated, SkiffError> {
    let sftp_failed = |e: SftpError| {
        // The channel gave out (I/O) or the server broke the protocol.
        let kind = match e {
            SftpError::IO(_) => ErrorKind::Connect,
            _ => ErrorKind::Protocol,
        };
        SkiffError::new(kind, format!("{host}: SFTP session failed to start: {e}"))
    };
    let (version, early) = match ask {
        // Both go out in this order when first polled: one flight.
        AskLimits::WithInit => {
            let (version, limits) = tokio::join!(raw.init(), raw.limits());
            (version, limits.ok())
        }
        AskLimits::AfterVersion => (raw.init().await, None),
    };
    let version = version.map_err(sftp_failed)?;
    let has = |name: &str| version.extensions.contains_key(name);
    let (mut read_len, mut write_len) = (SAFE_READ_CHUNK, SAFE_WRITE_CHUNK);
    let mut stated: Option<Limits> = None;
    if has(russh_sftp::extensions::LIMITS) {
        let limits = match early {
            Some(limits) => limits,
            None => raw.limits().await.map_err(sftp_failed)?,
        };
        // Leave room for the request header within the packet limit.
        let by_packet = (limits.max_packet_len > 1024).then(|| limits.max_packet_len - 1024);
        let cap = |stated: u64| {
            let mut n = MAX_CHUNK as u64;
            if stated > 0 {
                n = n.min(stated);
            }
            if let Some(p) = by_packet {
                n = n.min(p);
            }
            n.max(1024) as u32
        };
        read_len = cap(limits.max_read_len);
        write_len = cap(limits.max_write_len);
        stated = Some(limits.into());
    }
    tracing::debug!(
        "sftp: version {}, read {read_len} B, write {write_len} B, extensions {:?}",
        version.version,
        version.extensions.keys().collect::<Vec<_>>()
    );
    Ok(Negotiated {
        limits: stated,
        read_len,
        write_len,
        posix_rename: has(POSIX_RENAME),
        fsync: has(russh_sftp::extensions::FSYNC),
        expand_path: has(russh_sftp::extensions::EXPAND_PATH),
    })
}

/// A session's negotiation: a task under way (see [`Sftp::start`]) until
/// someone needs what it settles, then settled once for all. Shared, so
/// that a request given up while it waited (a file of a wrongly guessed
/// placement, dropped) takes nothing from the others that wait.
type Negotiation =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<Negotiated, SkiffError>>>;

struct Sftp<'a> {
    /// The connection, when this process holds it (not through the agent).
    conn: Option<&'a Connection>,
    /// Shared with `temps` while a temporary it created is live.
    raw: Arc<RawSftpSession>,
    /// Where an upload's extra channels come from (none: one channel).
    more: Option<&'a dyn MoreChannels>,
    /// `--streams`: most channels an upload uses.
    channels: Option<usize>,
    host: String,
    /// What `VERSION` settles, asked for with `INIT` and awaited only where
    /// needed (see [`Sftp::start`]).
    negotiation: Negotiation,
    /// What the server sent, for the copy's watchdog.
    heard: Heard,
    /// The remote temporaries being written.
    temps: &'a Temporaries,
}

impl<'a> Sftp<'a> {
    /// Opens a session channel, starts the `sftp` subsystem and negotiates.
    async fn open(
        conn: &'a Connection,
        heard: &Heard,
        temps: &'a Temporaries,
    ) -> Result<Sftp<'a>, SkiffError> {
        // Paths are shown as `host:path` with the host as typed.
        let host = conn.settings.original_host.clone();
        // The data-plane probe's channel, refused a moment ago, may still
        // count against the server's `MaxSessions` until the server has
        // seen it closed: the server's refusal of this one comes after it
        // saw that close, so asking again then can succeed.
        let mut attempts = 0;
        let channel = loop {
            match open_subsystem(conn).await {
                Err(e)
                    if e.kind == ErrorKind::ChannelRefused && attempts < FIRST_CHANNEL_RETRIES =>
                {
                    attempts += 1;
                    tracing::debug!("{host}: {e}; asking again");
                }
                other => break other?,
            }
        };
        let ask = AskLimits::for_server(conn.server_id.kind());
        Self::start(
            heard.listen(channel.into_stream()),
            host,
            Some(conn),
            ask,
            heard,
            temps,
        )
        .await
    }

    /// Starts SFTP on a stream where the subsystem has started: `INIT` (and,
    /// behind a server that answers in order, the `limits@openssh.com`
    /// question) goes out now, and `VERSION` is awaited only where what it
    /// settles is needed ([`Sftp::negotiated`]: chunk sizes, extensions).
    /// So the first requests of a copy (the target's `stat`, a temporary's
    /// `open`) go out in the same flight as `INIT` behind such a server,
    /// which reads them in order after it: one round trip fewer. Behind any
    /// other server, `VERSION` comes first, as the protocol asks.
    async fn start<S>(
        stream: S,
        host: String,
        conn: Option<&'a Connection>,
        ask: AskLimits,
        heard: &Heard,
        temps: &'a Temporaries,
    ) -> Result<Sftp<'a>, SkiffError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let raw = Arc::new(RawSftpSession::new_with_config(stream, session_config()));
        let mut negotiating: futures::future::BoxFuture<'static, _> =
            Box::pin(negotiate(raw.clone(), host.clone(), ask));
        // The first poll sends `INIT` (and the question): before anything
        // else. Then the negotiation runs as a task of its own, so that it
        // outlives a copy dropped before `VERSION` came (Ctrl-C early in an
        // upload): the SFTP client takes a `VERSION` nobody waits for as a
        // broken session and ends it, and the clean-up that removes the
        // copy's temporaries over this session would then fail.
        let negotiation = match futures::poll!(negotiating.as_mut()) {
            std::task::Poll::Ready(settled) => futures::future::ready(settled).boxed(),
            std::task::Poll::Pending => {
                let host = host.clone();
                tokio::spawn(negotiating)
                    .map(move |joined| {
                        joined.unwrap_or_else(|e| {
                            Err(SkiffError::new(
                                ErrorKind::Protocol,
                                format!("{host}: SFTP session failed to start: {e}"),
                            ))
                        })
                    })
                    .boxed()
            }
        }
        .shared();
        let sftp = Sftp {
            conn,
            raw,
            more: None,
            channels: None,
            host,
            negotiation,
            heard: heard.clone(),
            temps,
        };
        if ask == AskLimits::AfterVersion {
            sftp.negotiated().await?;
        }
        Ok(sftp)
    }

    /// What `VERSION` settled, waiting for it the first time.
    async fn negotiated(&self) -> Result<Negotiated, SkiffError> {
        self.negotiation.clone().await
    }

    /// Sorts an SFTP error on `path` into a per-file failure or the end of the session.
    fn fail(&self, path: &str, e: SftpError) -> Fail {
        match e {
            SftpError::Status(s)
                if !matches!(
                    s.status_code,
                    StatusCode::NoConnection | StatusCode::ConnectionLost
                ) =>
            {
                Fail::File(format!("{}:{path}: {}", self.host, status_text(&s)))
            }
            SftpError::Limited(m) => Fail::File(format!("{}:{path}: {m}", self.host)),
            other => Fail::Fatal(self.lost(&other)),
        }
    }

    fn lost(&self, e: &dyn std::fmt::Display) -> SkiffError {
        let message = if self.conn.is_none_or(|c| c.handle.is_closed()) {
            format!(
                "{}: connection lost during the copy; files not complete were not written",
                self.host
            )
        } else {
            format!("{}: SFTP session failed: {e}", self.host)
        };
        SkiffError::new(ErrorKind::Connect, message)
    }

    /// A remote path as typed, made ready for the server: empty is the login
    /// directory, `~/x` is `x` there, `~user/x` is expanded when the server can.
    async fn remote_path(&self, typed: &str) -> Result<String, SkiffError> {
        if typed.is_empty() || typed == "~" {
            return Ok(".".into());
        }
        if let Some(rest) = typed.strip_prefix("~/") {
            let rest = rest.trim_start_matches('/');
            return Ok(if rest.is_empty() {
                ".".into()
            } else {
                rest.into()
            });
        }
        if typed.starts_with('~') && self.negotiated().await?.expand_path {
            match self.raw.expand_path(typed).await {
                Ok(name) => {
                    if let Some(f) = name.files.first() {
                        return Ok(f.filename.clone());
                    }
                }
                Err(SftpError::Status(_)) => {}
                Err(e) => return Err(self.lost(&e)),
            }
        }
        Ok(typed.to_string())
    }

    /// `stat` (following symlinks): `Ok(None)` when the server says it cannot.
    async fn stat(&self, path: &str) -> Result<Result<FileAttributes, String>, SkiffError> {
        match self.raw.stat(path).await {
            Ok(a) => Ok(Ok(a.attrs)),
            Err(e) => match self.fail(path, e) {
                Fail::File(m) => Ok(Err(m)),
                Fail::Fatal(e) => Err(e),
            },
        }
    }

    // -----------------------------------------------------------------
    // Upload
    // -----------------------------------------------------------------

    async fn upload(
        &self,
        sources: &[PathBuf],
        target: &str,
        job: &CopyJob,
        progress: &dyn Progress,
    ) -> Result<CopyReport, SkiffError> {
        let mut report = CopyReport::default();
        let (recursive, list) = (job.recursive, sources.to_vec());
        let walked = tokio::task::spawn_blocking(move || {
            list.iter()
                .flat_map(|s| skiff_files::walk(s, recursive))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| SkiffError::new(ErrorKind::Protocol, format!("walking sources: {e}")))?;
        let mut entries: Vec<Entry> = Vec::new();
        for item in walked {
            match item {
                Ok(e) => entries.push(e),
                Err(e) => report.failures.push(e.to_string()),
            }
        }
        let (bytes, count) = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .fold((0u64, 0u64), |(b, n), e| (b.saturating_add(e.size), n + 1));
        progress.add_total(bytes);

        let wanted = sftp_channels::upload_channels(bytes, count, self.channels);
        let target = self.remote_path(target).await?;
        let to = Target {
            target: &target,
            source_count: sources.len(),
            wanted,
        };
        let made = match guess_placement(&target, &entries, sources.len()) {
            Some(guess) => {
                self.send_guessed(&entries, to, guess, job, progress, &mut report)
                    .await?
            }
            None => {
                let target_is_dir = self.target_is_dir(&target).await?;
                self.send_to(&entries, to, target_is_dir, job, progress, &mut report)
                    .await?
            }
        };

        if job.preserve {
            // Deepest first, so setting a parent's time is not undone by its children.
            for (remote, e) in made.iter().rev() {
                let attrs = FileAttributes {
                    permissions: Some(e.mode & 0o7777),
                    atime: Some(wire_time(e.atime)),
                    mtime: Some(wire_time(e.mtime)),
                    ..FileAttributes::empty()
                };
                if let Err(err) = self.raw.setstat(remote.as_str(), attrs).await {
                    match self.fail(remote, err) {
                        Fail::File(m) => report.failures.push(m),
                        Fail::Fatal(err) => return Err(err),
                    }
                }
            }
        }
        Ok(report)
    }

    /// Uploads to `to.target` placed as `guess`, without waiting to hear
    /// what the target is: the `stat` goes out first and the directories
    /// and the first files' temporaries are asked for in the same flight.
    /// No file is written before the answer (see [`TargetGate`]). When it
    /// says the guess was wrong, the temporaries created are removed, what
    /// the files said is dropped, and the upload goes on as if it had
    /// looked first: placed by what the target is, or failed as it would
    /// have been.
    async fn send_guessed<'e>(
        &self,
        entries: &'e [Entry],
        to: Target<'_>,
        guess: Placement,
        job: &CopyJob,
        progress: &dyn Progress,
        report: &mut CopyReport,
    ) -> Result<Vec<(String, &'e Entry)>, SkiffError> {
        let before = (
            report.failures.len(),
            report.files,
            report.bytes,
            report.dirs,
        );
        let (tell, gate) = TargetGate::pending();
        let right = |is_dir: Option<bool>| match guess {
            Placement::IntoDir(_) => is_dir == Some(true),
            Placement::AsName(_) => is_dir != Some(true),
        };
        let looking = async {
            let is_dir = self.target_is_dir(to.target).await;
            let _ = tell.send(Some(matches!(is_dir, Ok(d) if right(d))));
            is_dir
        };
        let upload = Upload {
            placement: &guess,
            gate: &gate,
            wanted: to.wanted,
        };
        // `looking` is polled first: its `stat` goes out before the rest.
        let (looked, sent) = tokio::join!(
            looking,
            self.send_placed(entries, upload, job, progress, report)
        );
        let target_is_dir = looked?;
        let made = sent?;
        if right(target_is_dir) {
            return Ok(made);
        }
        tracing::debug!(
            "{}:{}: placed wrongly before its stat; again",
            self.host,
            to.target
        );
        let (failures, files, bytes, dirs) = before;
        report.failures.truncate(failures);
        (report.files, report.bytes, report.dirs) = (files, bytes, dirs);
        self.send_to(entries, to, target_is_dir, job, progress, report)
            .await
    }

    /// Uploads to `to.target`, known to be a directory or not
    /// (`target_is_dir`, see [`skiff_files::place`]).
    async fn send_to<'e>(
        &self,
        entries: &'e [Entry],
        to: Target<'_>,
        target_is_dir: Option<bool>,
        job: &CopyJob,
        progress: &dyn Progress,
        report: &mut CopyReport,
    ) -> Result<Vec<(String, &'e Entry)>, SkiffError> {
        match skiff_files::place(Path::new(to.target), target_is_dir, to.source_count) {
            Ok(placement) => {
                let gate = TargetGate::open();
                let upload = Upload {
                    placement: &placement,
                    gate: &gate,
                    wanted: to.wanted,
                };
                self.send_placed(entries, upload, job, progress, report)
                    .await
            }
            Err(e) => {
                report.failures.push(format!("{}:{e}", self.host));
                Ok(Vec::new())
            }
        }
    }

    /// Whether `target` is a directory: `None` when the server cannot say
    /// (it does not exist, say).
    async fn target_is_dir(&self, target: &str) -> Result<Option<bool>, SkiffError> {
        Ok(self
            .stat(target)
            .await?
            .ok()
            .map(|attrs| kind_of(&attrs) == RemoteKind::Dir))
    }

    /// Makes the directories and sends the files of an upload placed as
    /// `to` says; extra channels open meanwhile. The directories made.
    async fn send_placed<'e>(
        &self,
        entries: &'e [Entry],
        to: Upload<'_>,
        job: &CopyJob,
        progress: &dyn Progress,
        report: &mut CopyReport,
    ) -> Result<Vec<(String, &'e Entry)>, SkiffError> {
        // Extra channels open while the directories are made on the first.
        let (extras, prepared) = tokio::join!(
            self.open_extras(to.wanted - 1),
            self.prepare_upload(entries, to.placement, report)
        );
        let sent = match prepared {
            Ok((made, files)) => self
                .upload_files(files, &extras, to.gate, job, progress, report)
                .await
                .map(|()| made),
            Err(err) => Err(err),
        };
        for raw in &extras {
            let _ = raw.close_session();
        }
        sent
    }

    /// Up to `n` more SFTP sessions, all opened at once; those the server
    /// refuses (or that fail to start) are done without.
    async fn open_extras(&self, n: usize) -> Vec<Arc<RawSftpSession>> {
        let Some(more) = self.more.filter(|_| n > 0) else {
            return Vec::new();
        };
        let opening = (0..n).map(|_| async move {
            let stream = more.open().await?;
            let raw = RawSftpSession::new_with_config(self.heard.listen(stream), session_config());
            raw.init().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(raw)
        });
        let mut extras = Vec::new();
        for opened in futures::future::join_all(opening).await {
            match opened {
                Ok(mut raw) => {
                    if let Ok(Negotiated {
                        limits: Some(limits),
                        ..
                    }) = self.negotiated().await
                    {
                        raw.set_limits(limits);
                    }
                    extras.push(Arc::new(raw));
                }
                Err(why) => {
                    tracing::debug!("{}: one more SFTP channel not opened: {why}", self.host)
                }
            }
        }
        tracing::debug!(
            "{}: uploading over {} SFTP channels ({} asked for)",
            self.host,
            extras.len() + 1,
            n + 1
        );
        extras
    }

    /// Makes the directories of an upload placed by `placement` (failures
    /// go to `report`): the directories made and the files to send.
    #[allow(clippy::type_complexity)]
    async fn prepare_upload<'e>(
        &self,
        entries: &'e [Entry],
        placement: &Placement,
        report: &mut CopyReport,
    ) -> Result<(Vec<(String, &'e Entry)>, Vec<(&'e Entry, String)>), SkiffError> {
        // Directories first, in walk order (parents before children).
        let mut failed: Vec<PathBuf> = Vec::new();
        let mut made: Vec<(String, &Entry)> = Vec::new();
        for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
            if is_under(&e.rel, &failed) {
                continue;
            }
            let outcome = match remote_path_for(placement, &e.rel) {
                Ok(remote) => self.make_remote_dir(&remote, e.mode).await.map(|()| remote),
                Err(m) => Err(Fail::File(m)),
            };
            match outcome {
                Ok(remote) => {
                    report.dirs += 1;
                    made.push((remote, e));
                }
                Err(Fail::File(m)) => {
                    report.failures.push(m);
                    failed.push(e.rel.clone());
                }
                Err(Fail::Fatal(err)) => return Err(err),
            }
        }

        let mut files = Vec::new();
        for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
            if is_under(&e.rel, &failed) {
                continue;
            }
            match remote_path_for(placement, &e.rel) {
                Ok(remote) => files.push((e, remote)),
                Err(m) => report.failures.push(m),
            }
        }
        Ok((made, files))
    }

    /// Sends `files`, each starting on one of the channels in turn and
    /// written through as many as [`sftp_channels::lanes_for_file`] says.
    async fn upload_files(
        &self,
        files: Vec<(&Entry, String)>,
        extras: &[Arc<RawSftpSession>],
        gate: &TargetGate,
        job: &CopyJob,
        progress: &dyn Progress,
        report: &mut CopyReport,
    ) -> Result<(), SkiffError> {
        let sessions: Vec<&Arc<RawSftpSession>> =
            std::iter::once(&self.raw).chain(extras).collect();
        let channels = sessions.len();
        let sessions = &sessions;
        let at_once = sftp_channels::files_at_once(channels, FILES_AT_ONCE);
        let numbered: Vec<_> = files.into_iter().enumerate().collect();
        let mut running = files_at_once(numbered, at_once, |(nth, (e, remote))| async move {
            let home = sftp_channels::home_channel(nth, channels);
            let lanes: Vec<&Arc<RawSftpSession>> = sftp_channels::file_lanes(
                home,
                sftp_channels::lanes_for_file(e.size, channels),
                channels,
            )
            .map(|i| sessions[i])
            .collect();
            let r = self
                .upload_file(e, &remote, job.preserve, progress, &lanes, gate)
                .await;
            (remote, r)
        });
        while let Some((remote, result)) = running.next().await {
            match result {
                Ok(n) => {
                    report.files += 1;
                    report.bytes += n;
                    progress.file_done(&format!("{}:{remote}", self.host));
                }
                Err(Fail::File(m)) => report.failures.push(m),
                Err(Fail::Fatal(err)) => return Err(err),
            }
        }
        Ok(())
    }

    /// Creates a remote directory for a copied tree (fine if one is there).
    async fn make_remote_dir(&self, remote: &str, mode: u32) -> Result<(), Fail> {
        let attrs = FileAttributes {
            permissions: Some((mode & 0o777) | 0o700),
            ..FileAttributes::empty()
        };
        let err = match self.raw.mkdir(remote, attrs).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let first = self.fail(remote, err);
        if let Fail::Fatal(_) = first {
            return Err(first);
        }
        match self.stat(remote).await {
            Ok(Ok(a)) if kind_of(&a) == RemoteKind::Dir => Ok(()),
            Ok(Ok(_)) => Err(Fail::File(format!(
                "{}:{remote}: exists and is not a directory",
                self.host
            ))),
            Ok(Err(_)) => Err(first),
            Err(e) => Err(Fail::Fatal(e)),
        }
    }

    /// Uploads one file to a temporary name beside `remote` through
    /// `lanes` (the first creates, checks, syncs and renames it; the others
    /// only write), then renames it into place. Returns the bytes sent.
    async fn upload_file(
        &self,
        e: &Entry,
        remote: &str,
        preserve: bool,
        progress: &dyn Progress,
        lanes: &[&Arc<RawSftpSession>],
        gate: &TargetGate,
    ) -> Result<u64, Fail> {
        let local_fail = |err: io::Error| Fail::File(FileError::io(&e.source, &err).to_string());
        let file = std::fs::File::open(&e.source).map_err(local_fail)?;
        let (home, others) = match lanes.split_first() {
            Some((home, others)) => (*home, others),
            None => (&self.raw, &[][..]),
        };
        let temp = remote_temp_name(remote);
        // Live from before the server is asked to create it: a stop at any
        // point after this has it removed (see `leftovers`).
        let ticket = self.temps.add(&self.host, &temp, home);
        let result = self
            .write_temp(
                file, e, &temp, remote, preserve, progress, home, others, gate,
            )
            .await;
        self.temps.settle(ticket);
        result
    }

    /// [`Sftp::upload_file`] once its temporary is named: creates it on
    /// `home`, writes it through `home` and `others`, renames it into
    /// place; a failure removes it (best effort).
    #[allow(clippy::too_many_arguments)]
    async fn write_temp(
        &self,
        file: std::fs::File,
        e: &Entry,
        temp: &str,
        remote: &str,
        preserve: bool,
        progress: &dyn Progress,
        home: &RawSftpSession,
        others: &[&Arc<RawSftpSession>],
        gate: &TargetGate,
    ) -> Result<u64, Fail> {
        let attrs = FileAttributes {
            permissions: Some(e.mode & 0o777),
            ..FileAttributes::empty()
        };
        let flags = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE;
        let handle = match home.open(temp, flags, attrs).await {
            Ok(h) => h.handle,
            Err(err) => return Err(self.fail(remote, err)),
        };
        if !gate.allows().await {
            let _ = home.close(handle.as_str()).await;
            let _ = home.remove(temp).await;
            return Err(Fail::File(format!(
                "{}:{remote}: placed before the target's stat, wrongly",
                self.host
            )));
        }
        // The other channels open the file the first one made (never
        // creating it: once it is removed, none can bring it back).
        let mut helpers: Vec<(&RawSftpSession, String)> = Vec::new();
        let mut result = Ok(0);
        let opening = others.iter().map(|raw| async move {
            let opened = raw.open(temp, OpenFlags::WRITE, FileAttributes::empty());
            (&***raw, opened.await)
        });
        for (raw, opened) in futures::future::join_all(opening).await {
            match opened {
                Ok(h) => helpers.push((raw, h.handle)),
                Err(err) => match self.fail(remote, err) {
                    Fail::File(m) => {
                        tracing::debug!("{m}: written through one channel fewer")
                    }
                    fatal => result = Err(fatal),
                },
            }
        }
        let mut closed = false;
        if result.is_ok() {
            result = self
                .send_file(
                    file,
                    home,
                    &handle,
                    &mut helpers,
                    &mut closed,
                    e,
                    temp,
                    remote,
                    preserve,
                    progress,
                )
                .await;
        }
        if result.is_err() {
            // Best effort: nothing may remain under the temporary name (a
            // lost connection takes the open handles with it).
            let cleanup = helpers
                .iter()
                .map(|(raw, h)| raw.close(h.as_str()))
                .collect::<Vec<_>>();
            let _ = futures::future::join_all(cleanup).await;
            if !closed {
                let _ = home.close(handle.as_str()).await;
            }
            let _ = home.remove(temp).await;
        }
        result
    }

    /// Writes `file` through `home`'s `handle` and the `helpers` (each
    /// chunk to the channel with the fewest outstanding), then, once every
    /// write succeeded and the helpers' handles are closed, checks the
    /// size, syncs, closes and renames on `home`.
    #[allow(clippy::too_many_arguments)]
    async fn send_file(
        &self,
        mut file: std::fs::File,
        home: &RawSftpSession,
        handle: &str,
        helpers: &mut Vec<(&RawSftpSession, String)>,
        closed: &mut bool,
        e: &Entry,
        temp: &str,
        remote: &str,
        preserve: bool,
        progress: &dyn Progress,
    ) -> Result<u64, Fail> {
        let local_fail = |err: io::Error| Fail::File(FileError::io(&e.source, &err).to_string());
        // A thread reads the local file ahead of the network.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<io::Result<(u64, Vec<u8>)>>(LOCAL_QUEUE);
        let chunk = self.negotiated().await.map_err(Fail::Fatal)?.write_len as usize;
        let reader = tokio::task::spawn_blocking(move || {
            let mut offset = 0u64;
            loop {
                let mut buf = vec![0u8; chunk];
                let mut filled = 0;
                while filled < chunk {
                    match file.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        Err(err) => {
                            let _ = tx.blocking_send(Err(err));
                            return;
                        }
                    }
                }
                if filled == 0 {
                    return;
                }
                buf.truncate(filled);
                if tx.blocking_send(Ok((offset, buf))).is_err() {
                    return;
                }
                offset += filled as u64;
                if filled < chunk {
                    return;
                }
            }
        });

        let writers: Vec<(&RawSftpSession, &str)> = std::iter::once((home, handle))
            .chain(helpers.iter().map(|(raw, h)| (*raw, h.as_str())))
            .collect();
        let most = sftp_channels::requests_for_file(writers.len(), REQUESTS_PER_FILE);
        let mut outstanding = vec![0usize; writers.len()];
        let mut inflight = FuturesUnordered::new();
        let mut eof = false;
        let mut sent = 0u64;
        loop {
            tokio::select! {
                biased;
                Some((lane, done)) = inflight.next(), if !inflight.is_empty() => {
                    let (lane, done): (usize, Result<u64, SftpError>) = (lane, done);
                    outstanding[lane] -= 1;
                    let n = done.map_err(|err| self.fail(remote, err))?;
                    sent += n;
                    progress.advance(n);
                }
                msg = rx.recv(), if !eof && inflight.len() < most => match msg {
                    None => eof = true,
                    Some(Err(err)) => return Err(local_fail(err)),
                    Some(Ok((offset, data))) => {
                        let n = data.len() as u64;
                        let lane = (0..writers.len())
                            .min_by_key(|&i| outstanding[i])
                            .unwrap_or(0);
                        outstanding[lane] += 1;
                        let (raw, h) = writers[lane];
                        inflight.push(async move { (lane, raw.write(h, offset, data).await.map(|_| n)) });
                    }
                },
                else => break,
            }
        }
        let _ = reader.await;
        drop(inflight);

        // Every write is answered; the helpers are done with the file.
        let closing = helpers
            .iter()
            .map(|(raw, h)| raw.close(h.as_str()))
            .collect::<Vec<_>>();
        let closes = futures::future::join_all(closing).await;
        helpers.clear();
        for c in closes {
            c.map_err(|err| self.fail(remote, err))?;
        }

        if preserve {
            let attrs = FileAttributes {
                permissions: Some(e.mode & 0o7777),
                atime: Some(wire_time(e.atime)),
                mtime: Some(wire_time(e.mtime)),
                ..FileAttributes::empty()
            };
            home.fsetstat(handle, attrs)
                .await
                .map_err(|err| self.fail(remote, err))?;
        }
        // What the server holds must be what was read, before it may
        // replace anything.
        let held = home
            .fstat(handle)
            .await
            .map_err(|err| self.fail(remote, err))?
            .attrs
            .size;
        if let Some(held) = held.filter(|&h| h != sent) {
            return Err(Fail::File(format!(
                "{}:{remote}: the server holds {held} bytes of the {sent} sent; not put in place",
                self.host
            )));
        }
        if self.negotiated().await.map_err(Fail::Fatal)?.fsync {
            match home.fsync(handle).await {
                Ok(_) => {}
                Err(SftpError::Status(s)) if s.status_code == StatusCode::OpUnsupported => {}
                Err(err) => return Err(self.fail(remote, err)),
            }
        }
        *closed = true;
        home.close(handle)
            .await
            .map_err(|err| self.fail(remote, err))?;
        self.rename_over(home, temp, remote).await?;
        Ok(sent)
    }

    /// Renames `temp` over `target` on `raw`, replacing it atomically where
    /// the server can.
    async fn rename_over(
        &self,
        raw: &RawSftpSession,
        temp: &str,
        target: &str,
    ) -> Result<(), Fail> {
        if self.negotiated().await.map_err(Fail::Fatal)?.posix_rename {
            let reply = raw
                .extended(POSIX_RENAME, ssh_strings(&[temp, target]))
                .await;
            return match reply {
                Ok(Packet::Status(s)) if s.status_code == StatusCode::Ok => Ok(()),
                Ok(Packet::Status(s)) => Err(self.fail(target, SftpError::Status(s))),
                Ok(_) => Err(self.fail(target, SftpError::UnexpectedPacket)),
                Err(err) => Err(self.fail(target, err)),
            };
        }
        // SFTP v3 rename refuses an existing target: make room first.
        match raw.rename(temp, target).await {
            Ok(_) => Ok(()),
            Err(SftpError::Status(first)) => {
                if let Ok(Ok(attrs)) = self.stat(target).await {
                    if kind_of(&attrs) != RemoteKind::Dir && raw.remove(target).await.is_ok() {
                        return raw
                            .rename(temp, target)
                            .await
                            .map(|_| ())
                            .map_err(|err| self.fail(target, err));
                    }
                }
                Err(self.fail(target, SftpError::Status(first)))
            }
            Err(err) => Err(self.fail(target, err)),
        }
    }

    // -----------------------------------------------------------------
    // Download
    // -----------------------------------------------------------------

    async fn download(
        &self,
        sources: &[String],
        target: &Path,
        job: &CopyJob,
        progress: &dyn Progress,
    ) -> Result<CopyReport, SkiffError> {
        let mut report = CopyReport::default();
        let placement = match skiff_files::resolve_target(target, sources.len()) {
            Ok(p) => p,
            Err(e) => {
                report.failures.push(e.to_string());
                return Ok(report);
            }
        };
        let mut entries = Vec::new();
        for source in sources {
            self.walk_remote(source, job.recursive, &mut entries, &mut report.failures)
                .await?;
        }
        // Built from the request's names and the server's listings: each
        // must still be one the request admits, and none may come twice.
        let mut requested = Requested::new(sources, job.recursive);
        for e in &entries {
            let rel = e.rel.to_str().unwrap_or_default();
            requested
                .admit(rel, e.kind == EntryKind::Dir)
                .map_err(|u| misbehaved(&self.host, u))?;
        }
        progress.add_total(
            entries
                .iter()
                .filter(|e| e.kind == EntryKind::File)
                .map(|e| e.size)
                .sum(),
        );

        let mut failed: Vec<PathBuf> = Vec::new();
        let mut made: Vec<(PathBuf, &RemoteEntry)> = Vec::new();
        for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
            if is_under(&e.rel, &failed) {
                continue;
            }
            let local = placement.path_for(&e.rel);
            let mode = POLICY.dir_mode(e.mode, job.preserve);
            match skiff_files::make_dir(&local, mode) {
                Ok(made_dir) => {
                    report.dirs += 1;
                    // `-p` sets what this copy created, not what was there.
                    if made_dir == MadeDir::Created || POLICY.finishes_existing_dirs() {
                        made.push((local, e));
                    }
                }
                Err(err) => {
                    report.failures.push(err.to_string());
                    failed.push(e.rel.clone());
                }
            }
        }

        let files: Vec<(&RemoteEntry, PathBuf)> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File && !is_under(&e.rel, &failed))
            .map(|e| (e, placement.path_for(&e.rel)))
            .collect();
        let (window, in_flight) = (crate::connect::max_window(), files.len().min(FILES_AT_ONCE));
        let read_len = self.negotiated().await?.read_len;
        let mut running = files_at_once(files, FILES_AT_ONCE, |(e, local)| async move {
            let reads = ReadAhead::new(window, read_len, in_flight);
            let r = self
                .download_file(e, &local, job.preserve, reads, progress)
                .await;
            (local, r)
        });
        while let Some((local, result)) = running.next().await {
            match result {
                Ok(n) => {
                    report.files += 1;
                    report.bytes += n;
                    progress.file_done(&local.display().to_string());
                }
                Err(Fail::File(m)) => report.failures.push(m),
                Err(Fail::Fatal(err)) => return Err(err),
            }
        }
        drop(running);

        if job.preserve {
            for (local, e) in made.iter().rev() {
                let mode = POLICY.dir_mode(e.mode, true);
                if let Err(err) = skiff_files::finish_dir(local, mode, Some(e.times())) {
                    report.failures.push(err.to_string());
                }
            }
        }
        Ok(report)
    }

    /// Lists one remote source into `out` (a directory before its contents;
    /// symlinks followed, loops reported). Per-path problems go to `failures`.
    async fn walk_remote(
        &self,
        typed: &str,
        recursive: bool,
        out: &mut Vec<RemoteEntry>,
        failures: &mut Vec<String>,
    ) -> Result<(), SkiffError> {
        let path = self.remote_path(typed).await?;
        let attrs = match self.stat(&path).await? {
            Ok(a) => a,
            Err(m) => {
                failures.push(m);
                return Ok(());
            }
        };
        let name = match remote_last_component(&path) {
            Some(n) => n.to_string(),
            None => match self.raw.realpath(path.as_str()).await {
                Ok(n) => match n
                    .files
                    .first()
                    .and_then(|f| remote_last_component(&f.filename))
                {
                    Some(n) => n.to_string(),
                    None => {
                        failures.push(format!(
                            "{}:{typed}: cannot copy a file system root by name",
                            self.host
                        ));
                        return Ok(());
                    }
                },
                Err(e) => {
                    match self.fail(&path, e) {
                        Fail::File(m) => failures.push(m),
                        Fail::Fatal(e) => return Err(e),
                    }
                    return Ok(());
                }
            },
        };
        if let Err(e) = skiff_files::safe_name(&name) {
            failures.push(format!("{}:{e}", self.host));
            return Ok(());
        }
        match kind_of(&attrs) {
            RemoteKind::File => {
                out.push(RemoteEntry::new(path, name.into(), EntryKind::File, &attrs));
                Ok(())
            }
            RemoteKind::Dir if !recursive => {
                failures.push(format!("{}:{path}: is a directory (use -r)", self.host));
                Ok(())
            }
            RemoteKind::Dir => {
                self.walk_remote_dir(path, name.into(), attrs, out, failures)
                    .await
            }
            _ => {
                failures.push(format!("{}:{path}: not a regular file", self.host));
                Ok(())
            }
        }
    }

    async fn walk_remote_dir(
        &self,
        root: String,
        root_rel: PathBuf,
        root_attrs: FileAttributes,
        out: &mut Vec<RemoteEntry>,
        failures: &mut Vec<String>,
    ) -> Result<(), SkiffError> {
        struct Pending {
            path: String,
            rel: PathBuf,
            attrs: FileAttributes,
            /// Canonical paths of the directories above it.
            ancestors: Vec<String>,
        }
        let mut stack = vec![Pending {
            path: root,
            rel: root_rel,
            attrs: root_attrs,
            ancestors: Vec::new(),
        }];
        while let Some(dir) = stack.pop() {
            let canonical = match self.raw.realpath(dir.path.as_str()).await {
                Ok(n) => n.files.first().map(|f| f.filename.clone()),
                Err(e) => match self.fail(&dir.path, e) {
                    Fail::File(m) => {
                        failures.push(m);
                        continue;
                    }
                    Fail::Fatal(e) => return Err(e),
                },
            };
            let canonical = canonical.unwrap_or_else(|| dir.path.clone());
            if dir.ancestors.contains(&canonical) {
                failures.push(format!(
                    "{}:{}: directory loop (the same directory as {canonical}); not followed",
                    self.host, dir.path
                ));
                continue;
            }
            let listing = match self.list_dir(&dir.path).await? {
                Ok(l) => l,
                Err(m) => {
                    failures.push(m);
                    continue;
                }
            };
            out.push(RemoteEntry::new(
                dir.path.clone(),
                dir.rel.clone(),
                EntryKind::Dir,
                &dir.attrs,
            ));
            let mut ancestors = dir.ancestors.clone();
            ancestors.push(canonical);
            let mut subdirs = Vec::new();
            for (name, mut attrs) in listing {
                let child = match remote_join(&dir.path, Path::new(&name)) {
                    Ok(c) => c,
                    Err(m) => {
                        failures.push(format!("{}:{m}", self.host));
                        continue;
                    }
                };
                if kind_of(&attrs) == RemoteKind::Symlink {
                    attrs = match self.stat(&child).await? {
                        Ok(a) => a,
                        Err(m) => {
                            failures.push(m);
                            continue;
                        }
                    };
                }
                let rel = dir.rel.join(&name);
                match kind_of(&attrs) {
                    RemoteKind::File => {
                        out.push(RemoteEntry::new(child, rel, EntryKind::File, &attrs))
                    }
                    RemoteKind::Dir => subdirs.push(Pending {
                        path: child,
                        rel,
                        attrs,
                        ancestors: ancestors.clone(),
                    }),
                    _ => failures.push(format!("{}:{child}: not a regular file", self.host)),
                }
            }
            // Popped in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// The names (checked, sorted, without `.` and `..`) and attributes in a
    /// remote directory.
    async fn list_dir(
        &self,
        path: &str,
    ) -> Result<Result<Vec<(String, FileAttributes)>, String>, SkiffError> {
        let handle = match self.raw.opendir(path).await {
            Ok(h) => h.handle,
            Err(e) => {
                return match self.fail(path, e) {
                    Fail::File(m) => Ok(Err(m)),
                    Fail::Fatal(e) => Err(e),
                }
            }
        };
        let mut names = Vec::new();
        let mut problem = None;
        loop {
            match self.raw.readdir(handle.as_str()).await {
                Ok(batch) => {
                    for f in batch.files {
                        if f.filename == "." || f.filename == ".." {
                            continue;
                        }
                        match skiff_files::safe_name(&f.filename) {
                            Ok(_) => names.push((f.filename, f.attrs)),
                            Err(e) => problem = Some(format!("{}:{path}: {e}", self.host)),
                        }
                    }
                }
                Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => break,
                Err(e) => match self.fail(path, e) {
                    Fail::File(m) => {
                        problem = Some(m);
                        break;
                    }
                    Fail::Fatal(e) => return Err(e),
                },
            }
        }
        let _ = self.raw.close(handle.as_str()).await;
        if let Some(m) = problem {
            return Ok(Err(m));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = names.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(misbehaved(
                &self.host,
                format_args!("{path}: the server listed {:?} twice", pair[0].0),
            ));
        }
        Ok(Ok(names))
    }

    /// Downloads one file into an [`AtomicFile`] for `local`. Returns the
    /// bytes received.
    async fn download_file(
        &self,
        e: &RemoteEntry,
        local: &Path,
        preserve: bool,
        reads: ReadAhead,
        progress: &dyn Progress,
    ) -> Result<u64, Fail> {
        let local_fail = |err: FileError| Fail::File(err.to_string());
        let handle = match self
            .raw
            .open(e.path.as_str(), OpenFlags::READ, FileAttributes::empty())
            .await
        {
            Ok(h) => h.handle,
            Err(err) => return Err(self.fail(&e.path, err)),
        };
        let result = match AtomicFile::create(local) {
            Ok(atomic) => {
                self.receive_file(&handle, e, atomic, preserve, reads, progress)
                    .await
            }
            Err(err) => Err(local_fail(err)),
        };
        if !matches!(result, Err(Fail::Fatal(_))) {
            let _ = self.raw.close(handle.as_str()).await;
        }
        result
    }

    async fn receive_file(
        &self,
        handle: &str,
        e: &RemoteEntry,
        atomic: AtomicFile,
        preserve: bool,
        mut reads: ReadAhead,
        progress: &dyn Progress,
    ) -> Result<u64, Fail> {
        let local = atomic.final_path().to_path_buf();
        let local_fail = |err: io::Error| Fail::File(FileError::io(&local, &err).to_string());
        let file = atomic.file().try_clone().map_err(local_fail)?;
        // A thread writes what arrives, at its offset.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, Vec<u8>)>(LOCAL_QUEUE);
        let writer = tokio::task::spawn_blocking(move || -> io::Result<()> {
            while let Some((offset, data)) = rx.blocking_recv() {
                file.write_all_at(&data, offset)?;
            }
            Ok(())
        });

        let chunk = self.negotiated().await.map_err(Fail::Fatal)?.read_len;
        let size = e.size;
        let mut next = 0u64; // next offset to ask for below `size`
        let mut again: std::collections::VecDeque<(u64, u32)> = Default::default();
        let mut probe_at = size; // reading on past the expected end, one request at a time
        let mut probing = false;
        let mut eof_at: Option<u64> = None;
        let mut received = 0u64;
        let mut inflight = FuturesUnordered::new();
        let raw = &self.raw;
        let read = |offset: u64, len: u32, probe: bool| async move {
            let sent = std::time::Instant::now();
            let reply = raw.read(handle, offset, len).await;
            (offset, len, probe, sent.elapsed(), reply)
        };
        let mut writer_gone = false;
        let mut most_outstanding = 0;
        loop {
            while inflight.len() < reads.limit() {
                let limit = eof_at.unwrap_or(u64::MAX);
                if let Some(pos) = again.iter().position(|(o, _)| *o < limit) {
                    let (o, l) = again.remove(pos).expect("position is valid");
                    inflight.push(read(o, l, false));
                } else if eof_at.is_none() && next < size {
                    let len = (size - next).min(chunk as u64) as u32;
                    inflight.push(read(next, len, false));
                    next += len as u64;
                } else if eof_at.is_none() && !probing {
                    inflight.push(read(probe_at, chunk, true));
                    probing = true;
                } else {
                    break;
                }
            }
            most_outstanding = most_outstanding.max(inflight.len());
            let Some((offset, len, probe, latency, reply)) = inflight.next().await else {
                break;
            };
            reads.answered(latency);
            if probe {
                probing = false;
            }
            match reply {
                Ok(data) if data.data.len() as u64 > u64::from(len) => {
                    return Err(Fail::Fatal(misbehaved(
                        &self.host,
                        format_args!(
                            "{}: the server answered a read of {len} bytes with {}, more than asked for",
                            terminal_text::one_line(&e.path),
                            data.data.len()
                        ),
                    )));
                }
                Ok(data) if !data.data.is_empty() => {
                    let n = data.data.len() as u64;
                    if tx.send((offset, data.data)).await.is_err() {
                        writer_gone = true;
                        break;
                    }
                    received += n;
                    progress.advance(n);
                    if probe {
                        probe_at = offset + n;
                    } else if n < len as u64 {
                        again.push_back((offset + n, len - n as u32));
                    }
                }
                Ok(_) => eof_at = Some(eof_at.map_or(offset, |x| x.min(offset))),
                Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => {
                    eof_at = Some(eof_at.map_or(offset, |x| x.min(offset)));
                }
                Err(err) => return Err(self.fail(&e.path, err)),
            }
        }
        drop(tx);
        tracing::debug!(
            "sftp: {}: up to {most_outstanding} reads of {chunk} B outstanding (at most {})",
            terminal_text::one_line(&e.path),
            reads.most()
        );
        let wrote = writer.await.unwrap_or_else(|j| Err(io::Error::other(j)));
        if let Err(err) = wrote {
            return Err(local_fail(err));
        }
        if writer_gone {
            return Err(local_fail(io::Error::other("writer stopped")));
        }
        let mode = POLICY.file_mode(e.mode, preserve, atomic.replaced_mode());
        let times = preserve.then(|| e.times());
        // Flushing a large file to disk is progress, though nothing is heard.
        let _busy = self.heard.busy();
        let committed = tokio::task::spawn_blocking(move || atomic.commit(mode, times))
            .await
            .unwrap_or_else(|j| Err(FileError::new(&local, j.to_string())));
        committed.map_err(|err| Fail::File(err.to_string()))?;
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_sit_beside_the_target() {
        let t = remote_temp_name("dir/sub/file.txt");
        assert!(t.starts_with("dir/sub/.file.txt.skiff-"), "{t}");
        assert_eq!(t.len(), "dir/sub/.file.txt.skiff-".len() + 12);
        let t = remote_temp_name("file");
        assert!(t.starts_with(".file.skiff-"), "{t}");
        let t = remote_temp_name("/abs/x");
        assert!(t.starts_with("/abs/.x.skiff-"), "{t}");
        let long = "é".repeat(150);
        let t = remote_temp_name(&long);
        assert!(t.len() < 240, "{}", t.len());
        assert_ne!(remote_temp_name("a"), remote_temp_name("a"));
    }

    #[test]
    fn joins_and_last_components() {
        assert_eq!(remote_join(".", Path::new("a/b")).unwrap(), "a/b");
        assert_eq!(remote_join("", Path::new("a")).unwrap(), "a");
        assert_eq!(remote_join("/", Path::new("a")).unwrap(), "/a");
        assert_eq!(remote_join("x/y", Path::new("a")).unwrap(), "x/y/a");
        assert_eq!(remote_last_component("a/b/"), Some("b"));
        assert_eq!(remote_last_component("b"), Some("b"));
        assert_eq!(remote_last_component("/"), None);
        assert_eq!(remote_last_component("."), None);
        assert_eq!(remote_last_component("a/.."), None);
    }

    #[test]
    fn kinds_from_mode_bits() {
        let attrs = |p: Option<u32>| FileAttributes {
            permissions: p,
            ..FileAttributes::empty()
        };
        assert_eq!(kind_of(&attrs(Some(0o100644))), RemoteKind::File);
        assert_eq!(kind_of(&attrs(Some(0o040755))), RemoteKind::Dir);
        assert_eq!(kind_of(&attrs(Some(0o120777))), RemoteKind::Symlink);
        assert_eq!(kind_of(&attrs(Some(0o140755))), RemoteKind::Other); // socket
        assert_eq!(kind_of(&attrs(Some(0o010644))), RemoteKind::Other); // fifo
        assert_eq!(kind_of(&attrs(None)), RemoteKind::File);
    }

    #[test]
    fn wire_encoding() {
        assert_eq!(
            ssh_strings(&["ab", ""]),
            [0, 0, 0, 2, b'a', b'b', 0, 0, 0, 0]
        );
        assert_eq!(wire_time(-5), 0);
        assert_eq!(wire_time(1 << 40), u32::MAX);
        assert_eq!(wire_time(1_700_000_000), 1_700_000_000);
    }
}
