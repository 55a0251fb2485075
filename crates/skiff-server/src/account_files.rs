//! Reading the files an account controls before it is let in
//! (`AuthorizedKeysFile`, `AuthorizedPrincipalsFile`) and the server's own
//! key lists (`TrustedUserCAKeys`, `RevokedKeys`): the way sshd reads them,
//! with limits sshd lacks, and never on an async worker.
//!
//! The rules are data beside the I/O: [`ReadPolicy`] (limits and
//! StrictModes), [`entry_problem`] (who may own and write a file or a
//! directory), [`dirs_to_check`] (which directories StrictModes looks at)
//! and [`text_lines`] (which lines reach a parser). [`read_blocking`] applies
//! them to one path:
//!
//! - The path is opened with `O_PATH`, following symlinks as sshd does (a
//!   dotfiles checkout may hold the real file; the target is what is
//!   checked), and the descriptor's `fstat` decides. Only a regular file is
//!   then opened for reading (`O_NONBLOCK`, `O_NOCTTY`), and only while the
//!   path still names the file that was checked. A FIFO, a directory, a
//!   socket or a device (a symlink to /dev/zero) is refused without ever
//!   being opened.
//! - An account's file is read with the account's filesystem identity
//!   (supplementary groups, fsgid, fsuid, taken by the reading thread alone,
//!   see [`crate::account_fs`]), as sshd reads it: skiffd reads nothing the
//!   account could not read itself, so a symlink to a root-only file is
//!   refused.
//! - StrictModes (unless `StrictModes no`): the file, and every directory
//!   above its real path up to and including the account's home (up to `/`
//!   for a file outside the home), must belong to root or the account and
//!   not be writable by group or others, as sshd's check. As for
//!   `AuthorizedKeysCommand`, a world-writable directory with the sticky bit
//!   (`/tmp`) is accepted: nobody else can replace an entry in it.
//! - A file larger than [`ACCOUNT_FILE_MAX_BYTES`] is refused unread, and
//!   never more than that is read. A line longer than [`MAX_LINE`] bytes, or
//!   not UTF-8, is skipped and named by file and line.
//! - Each read runs on a thread of its own ([`off_worker`]) and may take
//!   [`READ_TIMEOUT`]; a slower one refuses the file, and while
//!   [`MAX_OVERDUE`] reads of one account's files are still hanging (on a
//!   dead network or FUSE mount), further ones are refused at once, so a
//!   stuck filesystem costs a bounded number of threads and other logins
//!   never wait for it.
//! - What a file says reaches the log as one line, escaped
//!   (`terminal_text::one_line`) and cut to [`LOG_CHARS`] characters.
//!
//! A refused file gives nothing; other sources (the other
//! `AuthorizedKeysFile` files, `AuthorizedKeysCommand`) still count, as in
//! sshd. The server's files are read as skiffd, without StrictModes (sshd
//! does not check them either), but with the same file-type, size and time
//! limits.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_proto::terminal_text;

use crate::account::Account;
use crate::lookup_command::Parser;
use crate::spawn::Credentials;

/// Largest account file (authorized_keys, principals) or
/// `TrustedUserCAKeys` read; larger ones are refused unread.
pub const ACCOUNT_FILE_MAX_BYTES: u64 = 8 << 20;
/// Largest `RevokedKeys` read (a KRL of many certificates is bigger than
/// any list of keys).
pub const REVOKED_KEYS_MAX_BYTES: u64 = 64 << 20;
/// Longest line passed to a parser, in bytes (without its newline).
pub const MAX_LINE: usize = 16 << 10;
/// Longest a read may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Reads of one account's files (or of the server's) that may be overdue
/// before further ones are refused without trying.
pub const MAX_OVERDUE: usize = 2;
/// Most characters of anything a file says that reach one log line.
pub const LOG_CHARS: usize = 200;

/// How one file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPolicy {
    /// Larger files are refused unread.
    pub max_bytes: u64,
    /// Longer lines are skipped; `None`: the file is not text (a KRL).
    pub max_line: Option<usize>,
    pub timeout: Duration,
    /// Overdue reads of one reader's files before further ones are refused.
    pub max_overdue: usize,
    /// Check owners and modes of the file and the directories above it.
    pub strict_modes: bool,
}

impl ReadPolicy {
    /// An account's authorized_keys or principals file.
    pub fn account_file(strict_modes: bool) -> ReadPolicy {
        ReadPolicy {
            max_bytes: ACCOUNT_FILE_MAX_BYTES,
            max_line: Some(MAX_LINE),
            timeout: READ_TIMEOUT,
            max_overdue: MAX_OVERDUE,
            strict_modes,
        }
    }

    /// A file named in the server's configuration, at most `max_bytes`;
    /// `text` files have their lines checked.
    pub fn server_file(max_bytes: u64, text: bool) -> ReadPolicy {
        ReadPolicy {
            max_bytes,
            max_line: text.then_some(MAX_LINE),
            timeout: READ_TIMEOUT,
            max_overdue: MAX_OVERDUE,
            strict_modes: false,
        }
    }
}

/// What a path names when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl FileKind {
    /// `None` for a regular file.
    pub fn of(t: std::fs::FileType) -> Option<FileKind> {
        let kind = if t.is_file() {
            return None;
        } else if t.is_dir() {
            FileKind::Directory
        } else if t.is_fifo() {
            FileKind::Fifo
        } else if t.is_socket() {
            FileKind::Socket
        } else if t.is_char_device() {
            FileKind::CharDevice
        } else if t.is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::Other
        };
        Some(kind)
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Other => "not a file",
        })
    }
}

/// Which entry StrictModes found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    File,
    Directory,
}

/// What StrictModes found wrong with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Owned by this uid, neither root nor the account.
    Owner(u32),
    /// Writable by group or others (these permission bits).
    Writable(u32),
    /// It could not be looked at.
    CannotStat(io::ErrorKind),
}

/// Why a file was not used.
#[derive(Debug)]
pub enum Refusal {
    /// There is no such file (not an error: the next source is tried).
    Missing,
    Open(io::Error),
    NotRegular(FileKind),
    /// Larger than `max` bytes (`size`, as far as known).
    TooLarge {
        size: u64,
        max: u64,
    },
    /// StrictModes: this entry, at its real path, may be changed by others.
    Unsafe {
        path: PathBuf,
        entry: Entry,
        problem: Problem,
    },
    /// The path named another file by the time it was opened for reading.
    Replaced,
    Read(io::Error),
    TimedOut(Duration),
    /// This many earlier reads for the same reader are still hanging.
    Overdue(usize),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing => f.write_str("no such file"),
            Refusal::Open(e) => write!(f, "cannot open it: {e}"),
            Refusal::NotRegular(kind) => write!(f, "not a regular file ({kind})"),
            Refusal::TooLarge { size, max } => {
                write!(f, "larger than {} MiB ({size} bytes)", max >> 20)
            }
            Refusal::Unsafe {
                path,
                entry,
                problem,
            } => {
                let entry = match entry {
                    Entry::File => "file",
                    Entry::Directory => "directory",
                };
                let path = clip(&path.to_string_lossy());
                write!(f, "bad ownership or modes (StrictModes): {entry} {path} ")?;
                match problem {
                    Problem::Owner(uid) => {
                        write!(f, "is owned by uid {uid}, neither root nor the account")
                    }
                    Problem::Writable(mode) => {
                        write!(f, "is writable by group or others (mode {mode:04o})")
                    }
                    Problem::CannotStat(kind) => write!(f, "cannot be checked: {kind}"),
                }
            }
            Refusal::Replaced => f.write_str("it was replaced while being opened"),
            Refusal::Read(e) => write!(f, "cannot read it: {e}"),
            Refusal::TimedOut(t) => write!(f, "reading it took longer than {t:?}"),
            Refusal::Overdue(n) => write!(
                f,
                "{n} earlier reads of this account's files have not finished"
            ),
        }
    }
}

/// StrictModes' rule for one entry owned by `owner` with `mode`, where
/// `account` may own it besides root: what is wrong with it, if anything.
/// A directory that is sticky may be writable by others (`/tmp`).
pub fn entry_problem(owner: u32, mode: u32, account: u32, entry: Entry) -> Option<Problem> {
    if owner != 0 && owner != account {
        return Some(Problem::Owner(owner));
    }
    let sticky_dir = entry == Entry::Directory && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky_dir {
        return Some(Problem::Writable(mode & 0o7777));
    }
    None
}

/// The directories StrictModes checks above `file` (a real path), nearest
/// first: every parent up to and including `home` (also a real path) when
/// the file is under it, else up to `/`.
pub fn dirs_to_check(file: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for dir in file.ancestors().skip(1) {
        if dir.as_os_str().is_empty() {
            break;
        }
        dirs.push(dir.to_path_buf());
        if Some(dir) == home {
            break;
        }
    }
    dirs
}

/// Why a line was not passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineProblem {
    /// Longer than the limit (this many bytes).
    TooLong(usize),
    NotUtf8,
}

/// A line left out, by 1-based number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkippedLine {
    pub line: usize,
    pub problem: LineProblem,
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineProblem::TooLong(n) => write!(f, "line of {n} bytes, longer than {MAX_LINE} bytes"),
            LineProblem::NotUtf8 => f.write_str("line is not UTF-8"),
        }
    }
}

/// `bytes` as text for a line parser, in place: every line over
/// `max_line` bytes, or not UTF-8, is blanked (so the lines after it keep
/// their numbers) and reported.
pub fn text_lines(mut bytes: Vec<u8>, max_line: usize) -> (String, Vec<SkippedLine>) {
    let mut skipped = Vec::new();
    let mut start = 0;
    let mut number = 0;
    while start < bytes.len() {
        number += 1;
        let end = bytes[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| start + i);
        let line = &bytes[start..end];
        let problem = if line.len() > max_line {
            Some(LineProblem::TooLong(line.len()))
        } else if std::str::from_utf8(line).is_err() {
            Some(LineProblem::NotUtf8)
        } else {
            None
        };
        if let Some(problem) = problem {
            bytes[start..end].fill(b' ');
            skipped.push(SkippedLine {
                line: number,
                problem,
            });
        }
        start = end + 1;
    }
    // Every line is now UTF-8, and so is the whole.
    let text = String::from_utf8(bytes).unwrap_or_default();
    (text, skipped)
}

/// `s` for a log line: escaped, and cut to [`LOG_CHARS`] characters
/// (with `…` when cut).
pub fn clip(s: &str) -> String {
    let head: String = s.chars().take(LOG_CHARS + 1).collect();
    let escaped = terminal_text::one_line(&head);
    let mut out: String = escaped.chars().take(LOG_CHARS).collect();
    if escaped.chars().nth(LOG_CHARS).is_some() {
        out.push('…');
    }
    out
}

// ---------------------------------------------------------------------------
// I/O
// ---------------------------------------------------------------------------

/// Whose rights a read uses, and whose files StrictModes accepts.
#[derive(Debug, Clone)]
pub struct Reader {
    /// Taken by the reading thread; `None`: skiffd's own.
    creds: Option<Credentials>,
    /// Who may own the file and its directories besides root.
    uid: u32,
    /// Where StrictModes' walk up stops.
    home: Option<PathBuf>,
    /// Whose overdue reads count together.
    key: OverdueKey,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum OverdueKey {
    Account(u32),
    Server,
}

impl Reader {
    /// The account, with its rights (when skiffd is root).
    pub fn account(acct: &Account) -> Reader {
        Reader {
            creds: acct.credentials(),
            uid: acct.uid,
            home: Some(acct.home.clone()),
            key: OverdueKey::Account(acct.uid),
        }
    }

    /// skiffd itself, for the files its configuration names.
    pub fn server() -> Reader {
        let uid = nix::unistd::geteuid().as_raw();
        Reader {
            creds: None,
            uid,
            home: None,
            key: OverdueKey::Server,
        }
    }
}

/// Opens, checks and reads `path` (see the module documentation): its
/// bytes, at most `policy.max_bytes`. Blocking; runs on the reading thread
/// with `reader`'s rights already taken.
pub fn read_blocking(
    path: &Path,
    reader: &Reader,
    policy: &ReadPolicy,
) -> Result<Vec<u8>, Refusal> {
    // O_PATH opens nothing: no FIFO waits for a writer, no device is touched.
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .map_err(open_error)?;
    let meta = handle.metadata().map_err(Refusal::Open)?;
    if let Some(kind) = FileKind::of(meta.file_type()) {
        return Err(Refusal::NotRegular(kind));
    }
    if policy.strict_modes {
        check_secure_path(path, &meta, reader)?;
    }
    if meta.len() > policy.max_bytes {
        return Err(Refusal::TooLarge {
            size: meta.len(),
            max: policy.max_bytes,
        });
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(open_error)?;
    let opened = file.metadata().map_err(Refusal::Read)?;
    if !same_file(&opened, &meta) {
        return Err(Refusal::Replaced);
    }
    read_bounded(&file, opened.len(), policy.max_bytes)
}

/// At most `max` bytes of `file`; more refuses it.
fn read_bounded(file: &File, size: u64, max: u64) -> Result<Vec<u8>, Refusal> {
    let mut bytes = Vec::with_capacity(size.min(max) as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(Refusal::Read)?;
    if bytes.len() as u64 > max {
        return Err(Refusal::TooLarge {
            size: size.max(bytes.len() as u64),
            max,
        });
    }
    Ok(bytes)
}

fn open_error(e: io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => Refusal::Missing,
        _ => Refusal::Open(e),
    }
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.file_type().is_file() && (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// StrictModes on the file `meta` describes (opened from `path`) and the
/// directories above its real path.
fn check_secure_path(path: &Path, meta: &Metadata, reader: &Reader) -> Result<(), Refusal> {
    let real = std::fs::canonicalize(path).map_err(open_error)?;
    let real_meta = std::fs::metadata(&real).map_err(open_error)?;
    if !same_file(&real_meta, meta) {
        return Err(Refusal::Replaced);
    }
    let unsafe_entry = |path: &Path, entry, problem| Refusal::Unsafe {
        path: path.to_path_buf(),
        entry,
        problem,
    };
    if let Some(problem) = entry_problem(meta.uid(), meta.mode(), reader.uid, Entry::File) {
        return Err(unsafe_entry(&real, Entry::File, problem));
    }
    let home = reader
        .home
        .as_deref()
        .and_then(|h| std::fs::canonicalize(h).ok());
    for dir in dirs_to_check(&real, home.as_deref()) {
        let m = std::fs::metadata(&dir)
            .map_err(|e| unsafe_entry(&dir, Entry::Directory, Problem::CannotStat(e.kind())))?;
        if let Some(problem) = entry_problem(m.uid(), m.mode(), reader.uid, Entry::Directory) {
            return Err(unsafe_entry(&dir, Entry::Directory, problem));
        }
    }
    Ok(())
}

/// How many reads of each reader are overdue (timed out, still running).
static OVERDUE: Mutex<BTreeMap<OverdueKey, usize>> = Mutex::new(BTreeMap::new());

fn overdue() -> std::sync::MutexGuard<'static, BTreeMap<OverdueKey, usize>> {
    OVERDUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// One read's progress, changed only under [`OVERDUE`]'s lock.
#[derive(Default)]
struct Progress {
    finished: AtomicBool,
    overdue: AtomicBool,
}

/// One read, with the rights it takes, for a thread of its own.
type ReadJob = Box<dyn FnOnce() + Send>;

/// A reading thread started ahead of need, waiting for its one read.
struct SpareReader(Mutex<Option<std::sync::mpsc::Sender<ReadJob>>>);

/// The process's spare reader ([`start_spare_reader`]).
static SPARE_READER: SpareReader = SpareReader(Mutex::new(None));

fn reading_thread() -> std::thread::Builder {
    std::thread::Builder::new().name("skiffd-read".into())
}

impl SpareReader {
    /// Starts the thread the next read will run on (replacing a spare not
    /// used yet, whose thread then ends): its id.
    fn start(&self) -> io::Result<std::thread::ThreadId> {
        let (tx, rx) = std::sync::mpsc::channel::<ReadJob>();
        let thread = reading_thread().spawn(move || {
            if let Ok(read) = rx.recv() {
                read();
            }
        })?;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        Ok(thread.thread().id())
    }

    /// Runs `read` on the spare thread if one waits, else on a new one.
    fn run(&self, read: ReadJob) -> io::Result<()> {
        let spare = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        let read = match spare {
            Some(tx) => match tx.send(read) {
                Ok(()) => return Ok(()),
                // The spare is gone (it cannot be, short of a panic).
                Err(std::sync::mpsc::SendError(read)) => read,
            },
            None => read,
        };
        reading_thread().spawn(read).map(drop)
    }
}

/// Starts the thread the next read will run on, so that starting it is not
/// part of that read's time: a connection's process calls this while it
/// waits to be handed its connection, whose login reads `authorized_keys`
/// first. The thread has no rights of its own until the read takes them,
/// and ends with that read, as every reading thread does.
pub fn start_spare_reader() -> io::Result<()> {
    SPARE_READER.start().map(drop)
}

/// Runs `work` on a thread of its own (the spare one if it waits, else a
/// new one) that first takes `reader`'s rights (a thread's own: it ends
/// with the work, so nothing is restored), and waits at most
/// `policy.timeout` for it without blocking an async worker.
pub async fn off_worker<T, F>(reader: &Reader, policy: &ReadPolicy, work: F) -> Result<T, Refusal>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Refusal> + Send + 'static,
{
    let key = reader.key;
    let hanging = overdue().get(&key).copied().unwrap_or(0);
    if hanging >= policy.max_overdue {
        return Err(Refusal::Overdue(hanging));
    }
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let progress = Arc::new(Progress::default());
    let theirs = progress.clone();
    let creds = reader.creds.clone();
    let read: ReadJob = Box::new(move || {
        let result = match &creds {
            Some(c) => crate::account_fs::take_credentials(c)
                .map_err(Refusal::Open)
                .and_then(|()| work()),
            None => work(),
        };
        let _ = tx.send(result);
        let mut counts = overdue();
        theirs.finished.store(true, Ordering::Relaxed);
        if theirs.overdue.load(Ordering::Relaxed) {
            if let Some(n) = counts.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&key);
                }
            }
        }
    });
    SPARE_READER.run(read).map_err(Refusal::Read)?;
    match tokio::time::timeout(policy.timeout, &mut rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Refusal::Read(io::Error::other(
            "the reading thread ended early",
        ))),
        Err(_) => {
            let mut counts = overdue();
            if progress.finished.load(Ordering::Relaxed) {
                drop(counts);
                return rx.try_recv().unwrap_or_else(|_| {
                    Err(Refusal::Read(io::Error::other(
                        "the reading thread ended early",
                    )))
                });
            }
            progress.overdue.store(true, Ordering::Relaxed);
            *counts.entry(key).or_insert(0) += 1;
            Err(Refusal::TimedOut(policy.timeout))
        }
    }
}

/// Reads the account's file at `path` (a real path, tokens expanded) and
/// parses it with `parse`, off the async workers; logs every refusal and
/// skipped or bad line. A refused or missing file gives nothing.
///
/// A path with `*` or `?` (`authorized_keys_%u_*`, as sshd allows) stands
/// for the files it matches, listed with the account's rights and read in
/// name order, at most [`MAX_GLOB_FILES`] of them.
pub async fn load<T: Send + 'static>(
    path: String,
    acct: &Account,
    strict_modes: bool,
    parse: Parser<T>,
) -> Vec<T> {
    if !skiff_proto::pattern::has_wildcard(&path) {
        return load_one(path, acct, strict_modes, parse).await;
    }
    let reader = Reader::account(acct);
    let policy = ReadPolicy::account_file(strict_modes);
    let pattern = PathBuf::from(&path);
    let listed = off_worker(&reader, &policy, move || {
        let mut found = skiff_files::glob_paths(&pattern);
        found.sort();
        Ok(found)
    })
    .await;
    let mut found = match listed {
        Ok(found) => found,
        Err(why) => {
            tracing::warn!(user = %acct.name, "ignoring {}: {why}", clip(&path));
            return Vec::new();
        }
    };
    if found.len() > MAX_GLOB_FILES {
        tracing::warn!(
            user = %acct.name,
            "{} matches {} files; reading the first {MAX_GLOB_FILES}",
            clip(&path),
            found.len()
        );
        found.truncate(MAX_GLOB_FILES);
    }
    let mut items = Vec::new();
    for file in found {
        let file = file.to_string_lossy().into_owned();
        items.extend(load_one(file, acct, strict_modes, parse).await);
    }
    items
}

/// The most files one pattern in `AuthorizedKeysFile` or
/// `AuthorizedPrincipalsFile` is read from.
pub const MAX_GLOB_FILES: usize = 64;

/// [`load`] for one real path.
async fn load_one<T: Send + 'static>(
    path: String,
    acct: &Account,
    strict_modes: bool,
    parse: Parser<T>,
) -> Vec<T> {
    let reader = Reader::account(acct);
    let policy = ReadPolicy::account_file(strict_modes);
    let user = &acct.name;
    match read_list(path.clone(), &reader, &policy, parse, Some(user)).await {
        Ok(items) => items,
        Err(Refusal::Missing) => {
            tracing::debug!(user = %user, "no {}", clip(&path));
            Vec::new()
        }
        Err(why) => {
            tracing::warn!(user = %user, "ignoring {}: {why}", clip(&path));
            Vec::new()
        }
    }
}

/// A text list the server's configuration names (`TrustedUserCAKeys`), as
/// [`load`] reads an account's file but as skiffd and without StrictModes.
pub async fn load_server_list<T: Send + 'static>(
    path: &Path,
    parse: Parser<T>,
) -> Result<Vec<T>, Refusal> {
    let policy = ReadPolicy::server_file(ACCOUNT_FILE_MAX_BYTES, true);
    let path = path.to_string_lossy().into_owned();
    read_list(path, &Reader::server(), &policy, parse, None).await
}

/// A binary file the server's configuration names (`RevokedKeys`), at
/// most `max_bytes`.
pub async fn read_server_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, Refusal> {
    let policy = ReadPolicy::server_file(max_bytes, false);
    let reader = Reader::server();
    let path = path.to_path_buf();
    let thread_reader = reader.clone();
    off_worker(&reader, &policy, move || {
        read_blocking(&path, &thread_reader, &policy)
    })
    .await
}

/// Reads and parses a text list on the reading thread, and logs its
/// skipped and bad lines (naming `user`, for an account's file).
async fn read_list<T: Send + 'static>(
    path: String,
    reader: &Reader,
    policy: &ReadPolicy,
    parse: Parser<T>,
    user: Option<&str>,
) -> Result<Vec<T>, Refusal> {
    let thread_reader = reader.clone();
    let thread_policy = *policy;
    let label = path.clone();
    let (items, skipped, warnings) = off_worker(reader, policy, move || {
        let bytes = read_blocking(Path::new(&label), &thread_reader, &thread_policy)?;
        let (text, skipped) = text_lines(bytes, thread_policy.max_line.unwrap_or(usize::MAX));
        let (items, warnings) = parse(&label, &text);
        Ok((items, skipped, warnings))
    })
    .await?;
    let path = clip(&path);
    for s in skipped {
        warn_about(user, &format!("{path}:{}: skipped: {}", s.line, s.problem));
    }
    for w in warnings {
        warn_about(user, &format!("{path}:{}: {}", w.line, clip(&w.message)));
    }
    Ok(items)
}

/// Logs `line` (already made safe), with the account it concerns.
fn warn_about(user: Option<&str>, line: &str) {
    match user {
        Some(user) => tracing::warn!(user = %user, "{line}"),
        None => tracing::warn!("{line}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_modes_accept_root_or_the_account_and_nobody_else_writing() {
        let (me, other) = (1000, 1001);
        for entry in [Entry::File, Entry::Directory] {
            assert_eq!(entry_problem(me, 0o100600, me, entry), None);
            assert_eq!(entry_problem(0, 0o100644, me, entry), None);
            assert_eq!(
                entry_problem(other, 0o100644, me, entry),
                Some(Problem::Owner(other))
            );
            assert_eq!(
                entry_problem(me, 0o100664, me, entry),
                Some(Problem::Writable(0o664))
            );
            assert_eq!(
                entry_problem(0, 0o100646, me, entry),
                Some(Problem::Writable(0o646))
            );
        }
        // /tmp: world-writable, sticky, root's.
        assert_eq!(entry_problem(0, 0o41777, me, Entry::Directory), None);
        assert_eq!(
            entry_problem(0, 0o40777, me, Entry::Directory),
            Some(Problem::Writable(0o777))
        );
        assert_eq!(
            entry_problem(0, 0o101666, me, Entry::File),
            Some(Problem::Writable(0o1666))
        );
        assert_eq!(
            entry_problem(other, 0o41777, me, Entry::Directory),
            Some(Problem::Owner(other))
        );
    }

    #[test]
    fn the_walk_stops_at_the_home_or_the_root() {
        let p = |s: &str| PathBuf::from(s);
        let home = p("/home/alice");
        assert_eq!(
            dirs_to_check(&p("/home/alice/.ssh/authorized_keys"), Some(&home)),
            [p("/home/alice/.ssh"), p("/home/alice")]
        );
        assert_eq!(
            dirs_to_check(&p("/etc/ssh/keys/alice"), Some(&home)),
            [p("/etc/ssh/keys"), p("/etc/ssh"), p("/etc"), p("/")]
        );
        assert_eq!(
            dirs_to_check(&p("/home/alicex/keys"), Some(&home)),
            [p("/home/alicex"), p("/home"), p("/")]
        );
        assert_eq!(dirs_to_check(&p("/keys"), None), [p("/")]);
    }

    #[test]
    fn long_and_non_utf8_lines_are_blanked_and_numbered() {
        let mut bytes = b"# ok\n".to_vec();
        bytes.extend(vec![b'A'; 40]);
        bytes.extend(b"\nbad \xff byte\nlast line");
        let (text, skipped) = text_lines(bytes, 32);
        let lines: Vec<&str> = text.split('\n').collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "# ok");
        assert!(lines[1].trim().is_empty() && lines[1].len() == 40);
        assert!(lines[2].trim().is_empty());
        assert_eq!(lines[3], "last line");
        assert_eq!(
            skipped,
            [
                SkippedLine {
                    line: 2,
                    problem: LineProblem::TooLong(40)
                },
                SkippedLine {
                    line: 3,
                    problem: LineProblem::NotUtf8
                }
            ]
        );
        let (text, skipped) = text_lines(b"a\r\n\nb\n".to_vec(), 32);
        assert_eq!(text, "a\r\n\nb\n");
        assert!(skipped.is_empty());
        let exact = vec![b'x'; 32];
        assert!(text_lines(exact, 32).1.is_empty());
    }

    #[test]
    fn log_text_is_escaped_and_cut() {
        assert_eq!(clip("plain"), "plain");
        assert_eq!(clip("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        let long = "x".repeat(5000);
        let cut = clip(&long);
        assert_eq!(cut.chars().count(), LOG_CHARS + 1);
        assert!(cut.ends_with('…'));
        // Escapes count towards the limit: 5000 of them stay short.
        let hostile = "\u{1b}".repeat(5000);
        assert!(clip(&hostile).chars().count() <= LOG_CHARS + 1);
    }

    #[test]
    fn refusals_say_what_and_where() {
        let unsafe_dir = Refusal::Unsafe {
            path: PathBuf::from("/home/alice/.ssh"),
            entry: Entry::Directory,
            problem: Problem::Writable(0o777),
        };
        assert_eq!(
            unsafe_dir.to_string(),
            "bad ownership or modes (StrictModes): directory /home/alice/.ssh is writable by \
             group or others (mode 0777)"
        );
        assert_eq!(
            Refusal::NotRegular(FileKind::Fifo).to_string(),
            "not a regular file (a FIFO)"
        );
        assert_eq!(
            Refusal::TooLarge {
                size: 1 << 30,
                max: ACCOUNT_FILE_MAX_BYTES
            }
            .to_string(),
            "larger than 8 MiB (1073741824 bytes)"
        );
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn me(dir: &Path) -> Reader {
        Reader {
            creds: None,
            uid: nix::unistd::geteuid().as_raw(),
            home: Some(dir.to_path_buf()),
            // A key no other test uses.
            key: OverdueKey::Account(u32::MAX - 1),
        }
    }

    /// A thread started ahead runs the next read; the one after gets a
    /// thread of its own (rights taken by a read die with its thread).
    #[test]
    fn a_spare_reader_takes_the_next_read_and_only_that_one() {
        let spare = SpareReader(Mutex::new(None));
        let started = spare.start().expect("start the spare");
        let ran_on = || {
            let (tx, rx) = std::sync::mpsc::channel();
            spare
                .run(Box::new(move || {
                    let me = std::thread::current();
                    let _ = tx.send((me.id(), me.name().map(str::to_owned)));
                }))
                .expect("run a read");
            rx.recv_timeout(Duration::from_secs(60))
                .expect("the read ran")
        };
        let (first, name) = ran_on();
        assert_eq!(first, started, "the first read runs on the spare");
        assert_eq!(name.as_deref(), Some("skiffd-read"));
        let (second, name) = ran_on();
        assert_ne!(second, started, "a thread serves one read, then ends");
        assert_eq!(name.as_deref(), Some("skiffd-read"));
    }

    /// A read that hangs is given up after the timeout without holding up
    /// the caller; while `max_overdue` hang, the next is refused at once,
    /// and once they finish, reads go ahead again.
    #[test]
    fn hanging_reads_time_out_and_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let reader = me(dir.path());
        let policy = ReadPolicy {
            timeout: Duration::from_millis(200),
            ..ReadPolicy::account_file(true)
        };
        let rt = runtime();
        let mut releases = Vec::new();
        for _ in 0..policy.max_overdue {
            let (release, wait) = std::sync::mpsc::channel::<()>();
            releases.push(release);
            let got = rt.block_on(off_worker(&reader, &policy, move || {
                let _ = wait.recv();
                Ok(())
            }));
            assert!(matches!(got, Err(Refusal::TimedOut(_))), "{got:?}");
        }
        let started = std::time::Instant::now();
        let got = rt.block_on(off_worker(&reader, &policy, || Ok(())));
        assert!(
            matches!(got, Err(Refusal::Overdue(n)) if n == policy.max_overdue),
            "{got:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(100));
        // Another reader is not affected.
        let other = Reader {
            key: OverdueKey::Account(u32::MAX - 2),
            ..reader.clone()
        };
        assert!(rt.block_on(off_worker(&other, &policy, || Ok(()))).is_ok());
        drop(releases);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while overdue().contains_key(&reader.key) {
            assert!(
                std::time::Instant::now() < deadline,
                "overdue reads never ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(rt.block_on(off_worker(&reader, &policy, || Ok(()))).is_ok());
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let reader = me(dir.path());
        let policy = ReadPolicy {
            max_bytes: 64,
            ..ReadPolicy::account_file(false)
        };
        let read = |p: &Path| read_blocking(p, &reader, &policy);
        let file = dir.path().join("keys");
        std::fs::write(&file, "ssh-ed25519 AAAA\n").unwrap();
        assert_eq!(read(&file).unwrap(), b"ssh-ed25519 AAAA\n");
        assert!(matches!(
            read(&dir.path().join("none")),
            Err(Refusal::Missing)
        ));
        assert!(matches!(
            read(dir.path()),
            Err(Refusal::NotRegular(FileKind::Directory))
        ));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            read(&fifo),
            Err(Refusal::NotRegular(FileKind::Fifo))
        ));
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read(&zero),
            Err(Refusal::NotRegular(FileKind::CharDevice))
        ));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'#'; 65]).unwrap();
        assert!(matches!(
            read(&big),
            Err(Refusal::TooLarge { size: 65, max: 64 })
        ));
    }

    #[test]
    fn strict_modes_name_the_directory_others_may_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let ssh = home.join(".ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        let file = ssh.join("authorized_keys");
        std::fs::write(&file, "").unwrap();
        for (p, mode) in [(&home, 0o755), (&ssh, 0o700), (&file, 0o600)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let reader = me(&home);
        let policy = ReadPolicy::account_file(true);
        assert!(read_blocking(&file, &reader, &policy).is_ok());
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o777)).unwrap();
        match read_blocking(&file, &reader, &policy) {
            Err(Refusal::Unsafe {
                path,
                entry: Entry::Directory,
                problem: Problem::Writable(0o777),
            }) => assert_eq!(path, std::fs::canonicalize(&ssh).unwrap()),
            other => panic!("{other:?}"),
        }
        let lax = ReadPolicy::account_file(false);
        assert!(read_blocking(&file, &reader, &lax).is_ok());
    }
}
