//! The SFTP file server behind the `sftp` subsystem (`skiffd --sftp-server`).
//!
//! skiffd never touches files for a client in its own (often root) process:
//! for the `sftp` subsystem it starts `skiffd --sftp-server` as the account,
//! through the account's shell exactly like an `exec` request (privileges
//! dropped, clean environment, working directory = home). That process runs
//! [`serve_stdio`]: SFTP version 3 on stdin/stdout, as OpenSSH's `sftp` and
//! `scp` (SFTP mode, the default since OpenSSH 9.0) speak it, until stdin
//! ends. Relative paths start at the working directory, i.e. the home.
//!
//! Besides the version 3 requests it offers OpenSSH's extensions
//! `posix-rename@openssh.com`, `hardlink@openssh.com`, `fsync@openssh.com`,
//! `statvfs@openssh.com`, `fstatvfs@openssh.com`, `limits@openssh.com` and
//! `expand-path@openssh.com`. Packet framing and encoding come from
//! russh-sftp; this module is the file-system side ([`Files`], plain
//! blocking calls: russh-sftp answers requests one at a time anyway) and
//! the small pure helpers it uses (error and flag mapping, `ls -l` lines),
//! which are tested without a server.
//!
//! `internal-sftp` options ([`crate::sftp_options`]) reach it as one
//! hidden `--sftp-options` argument: [`serve_stdio`] sets the umask and
//! start directory, and the protocol side refuses what they refuse with
//! SSH_FX_PERMISSION_DENIED before touching anything.
//!
//! Limits: at most [`MAX_HANDLES`] files and directories open at once, reads
//! of at most [`MAX_READ`] bytes, client packets of at most [`MAX_PACKET`]
//! bytes. File names travel as UTF-8 (russh-sftp's strings): a name that is
//! not valid UTF-8 is shown with replacement characters and cannot be opened.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, Metadata, ReadDir};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;
use russh_sftp::extensions::{LimitsExtension, Statvfs};
use russh_sftp::protocol::{
    Attrs, Data, ExtendedReply, File as NameEntry, FileAttributes, Handle, Name, OpenFlags, Packet,
    Status, StatusCode, Version,
};
use russh_sftp::server::StatusReply;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sftp_options::{Request, ServerOptions};

/// Files and directories a client may hold open at once.
pub const MAX_HANDLES: usize = 256;
/// Largest packet accepted from the client (OpenSSH's sftp-server limit).
pub const MAX_PACKET: u32 = 256 * 1024;
/// Largest read answered in one `SSH_FXP_DATA` (shorter reads are legal).
pub const MAX_READ: u32 = MAX_PACKET - 1024;
/// Entries per `SSH_FXP_NAME` answer to `readdir`.
const READDIR_BATCH: usize = 100;

/// The command line that runs `exe` as the SFTP server, for the account's
/// shell: `'EXE' --sftp-server`. `None` when the path is not UTF-8.
pub fn subsystem_command(exe: &Path) -> Option<String> {
    let exe = exe.to_str()?;
    Some(format!("{} --sftp-server", shell_quote(exe)))
}

/// [`subsystem_command`]'s `command` line with a session's options (as
/// [`ServerOptions::to_arg`] writes them), for the account's shell.
pub fn with_options(command: &str, options_arg: &str) -> String {
    format!("{command} --sftp-options {}", shell_quote(options_arg))
}

/// The executable of an SFTP command line in the form
/// [`subsystem_command`] makes (`'EXE' --sftp-server`): skiffd's own
/// server, which can serve a `ChrootDirectory` jail from outside it.
pub fn internal_server_exe(command: &str) -> Option<PathBuf> {
    let quoted = command.strip_suffix(" --sftp-server")?;
    let inner = quoted.strip_prefix('\'')?.strip_suffix('\'')?;
    let exe = inner.replace(r"'\''", "'");
    // Any other lone quote would end the word early.
    if inner.replace(r"'\''", "").contains('\'') || !exe.starts_with('/') {
        return None;
    }
    Some(PathBuf::from(exe))
}

/// Quotes `s` as one word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Serves SFTP on stdin/stdout until stdin ends (or stdout breaks), as
/// `options` say: their umask, start directory (when it cannot be entered
/// the session stays in the home directory, as sshd's does) and refusals.
pub fn serve_stdio(options: ServerOptions) -> io::Result<()> {
    keep_freed_memory();
    if let Some(mask) = options.umask {
        nix::sys::stat::umask(Mode::from_bits_truncate(mask as libc::mode_t));
    }
    if let Some(dir) = &options.start_dir {
        let _ = std::env::set_current_dir(dir);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // The pipes register with the runtime's reactor: build them inside it.
    runtime.block_on(async { serve(Stdio::new(), options).await });
    // A stdin read may still be parked in a blocking thread: do not wait for it.
    runtime.shutdown_background();
    Ok(())
}

/// Every read and write allocates a buffer of up to a packet (256 KiB) and
/// frees it a moment later. With glibc's defaults such buffers are mapped
/// and unmapped (or the heap trimmed) each time, and every new page costs a
/// fault and a zeroing. This process serves one client: keep freed memory
/// for the next request instead (peak use stays a few packets).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 * 1024 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    }
}

/// Serves SFTP on `stream` until it ends, refusing what `policy` refuses.
pub async fn serve<S>(stream: S, policy: ServerOptions)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let session = Session {
        files: Files::new(),
        policy,
        _done: done,
    };
    let config = russh_sftp::server::Config {
        max_client_packet_len: MAX_PACKET,
    };
    russh_sftp::server::run_with_config(stream, session, config).await;
    // russh-sftp runs the session in a task of its own and drops it (and
    // with it `done`) when the stream ends.
    let _ = finished.await;
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

type Reply<T> = Result<T, StatusReply>;

/// The SFTP status code for a system error: a missing file or path component
/// is "no such file", refused access "permission denied", malformed names
/// "bad message", what the system cannot do "unsupported", and anything else
/// (including "exists" and "not empty") a plain failure, as OpenSSH's server.
pub fn status_code(e: &io::Error) -> StatusCode {
    if let Some(errno) = e.raw_os_error() {
        return match errno {
            libc::ENOENT | libc::ENOTDIR | libc::ELOOP => StatusCode::NoSuchFile,
            libc::EPERM | libc::EACCES | libc::EROFS => StatusCode::PermissionDenied,
            libc::EINVAL | libc::ENAMETOOLONG => StatusCode::BadMessage,
            libc::ENOSYS | libc::EOPNOTSUPP => StatusCode::OpUnsupported,
            _ => StatusCode::Failure,
        };
    }
    match e.kind() {
        io::ErrorKind::NotFound => StatusCode::NoSuchFile,
        io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => StatusCode::BadMessage,
        io::ErrorKind::Unsupported => StatusCode::OpUnsupported,
        _ => StatusCode::Failure,
    }
}

/// A status reply for `e`, with the system's message (without "(os error N)").
fn io_reply(e: io::Error) -> StatusReply {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    StatusReply::new(status_code(&e)).with_message(text)
}

fn errno_reply(e: nix::errno::Errno) -> StatusReply {
    io_reply(io::Error::from(e))
}

fn failure(message: &str) -> StatusReply {
    StatusCode::Failure.with_message(message)
}

fn eof() -> StatusReply {
    StatusCode::Eof.with_message("End of file")
}

fn ok_status(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Success".to_string(),
        language_tag: "en".to_string(),
    }
}

// ---------------------------------------------------------------------------
// Pure helpers
// ---------------------------------------------------------------------------

/// open(2) flags for SFTP `pflags`: read/write pick the access mode (read
/// when neither is given), the rest map one to one. Never a controlling
/// terminal, never inherited.
pub fn open_flags(p: OpenFlags) -> OFlag {
    let mut flags = match (p.contains(OpenFlags::READ), p.contains(OpenFlags::WRITE)) {
        (true, true) => OFlag::O_RDWR,
        (false, true) => OFlag::O_WRONLY,
        _ => OFlag::O_RDONLY,
    };
    for (sftp, posix) in [
        (OpenFlags::APPEND, OFlag::O_APPEND),
        (OpenFlags::CREATE, OFlag::O_CREAT),
        (OpenFlags::TRUNCATE, OFlag::O_TRUNC),
        (OpenFlags::EXCLUDE, OFlag::O_EXCL),
    ] {
        if p.contains(sftp) {
            flags |= posix;
        }
    }
    flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY
}

/// A time for SFTP v3's unsigned 32-bit fields.
fn sftp_time(t: i64) -> u32 {
    t.clamp(0, u32::MAX as i64) as u32
}

/// SFTP attributes of a file: size, owner, full mode (type and
/// permissions), access and modification times.
pub fn attributes(m: &Metadata) -> FileAttributes {
    FileAttributes {
        size: Some(m.size()),
        uid: Some(m.uid()),
        user: None,
        gid: Some(m.gid()),
        group: None,
        permissions: Some(m.mode()),
        atime: Some(sftp_time(m.atime())),
        mtime: Some(sftp_time(m.mtime())),
    }
}

/// `ls -l`'s mode column: the type letter and rwx bits with set-id and
/// sticky bits (`drwxr-sr-t`).
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let special = [
        (libc::S_ISUID, 's', 'S'),
        (libc::S_ISGID, 's', 'S'),
        (libc::S_ISVTX, 't', 'T'),
    ];
    for (i, (bit, with_x, without_x)) in special.into_iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let rwx = (mode >> shift) & 7;
        s.push(if rwx & 4 != 0 { 'r' } else { '-' });
        s.push(if rwx & 2 != 0 { 'w' } else { '-' });
        s.push(match (mode & bit != 0, rwx & 1 != 0) {
            (true, true) => with_x,
            (true, false) => without_x,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// A broken-down local time, as `ls` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i64,
    /// 0 = January.
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
}

/// `ls -l`'s time column: `Mon dd HH:MM` for the last six months, else
/// `Mon dd  YYYY`.
pub fn ls_time(t: LocalTime, recent: bool) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.get(t.month as usize).copied().unwrap_or("???");
    if recent {
        format!("{month} {:>2} {:02}:{:02}", t.day, t.hour, t.minute)
    } else {
        format!("{month} {:>2}  {}", t.day, t.year)
    }
}

/// A line as `ls -l` prints it (and OpenSSH's sftp-server sends as the long
/// name): mode, links, owner, group, size, time, name.
pub fn long_name(
    name: &str,
    m: &Metadata,
    user: &str,
    group: &str,
    time: LocalTime,
    now: i64,
) -> String {
    let mtime = m.mtime();
    let recent = mtime <= now && now - mtime < 365 * 24 * 60 * 60 / 2;
    format!(
        "{} {:>4} {:<8} {:<8} {:>8} {} {}",
        mode_string(m.mode()),
        m.nlink(),
        user,
        group,
        m.size(),
        ls_time(time, recent),
        name
    )
}

fn local_time(t: i64) -> LocalTime {
    let t = t as libc::time_t;
    // SAFETY: localtime_r fills the tm we own; a zeroed tm is valid.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return LocalTime {
                year: 1970,
                month: 0,
                day: 1,
                hour: 0,
                minute: 0,
            };
        }
        tm
    };
    LocalTime {
        year: tm.tm_year as i64 + 1900,
        month: tm.tm_mon as u32,
        day: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        minute: tm.tm_min as u32,
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Renames without replacing: SFTP v3's `rename` fails when `new` exists.
fn rename_no_replace(old: &Path, new: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    };
    let (o, n) = (c(old)?, c(new)?);
    // SAFETY: renameat2(2) with two NUL-terminated paths we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            o.as_ptr(),
            libc::AT_FDCWD,
            n.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // The file system (or kernel) cannot refuse atomically: check, then
        // rename, as OpenSSH's server does when link(2) is not available.
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
            if fs::symlink_metadata(new).is_ok() {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            fs::rename(old, new)
        }
        _ => Err(e),
    }
}

/// The absolute, symlink-free form of `path` (relative to the working
/// directory; empty means `.`). The last component need not exist, so that
/// clients can resolve the name of a file they are about to create.
pub fn real_path(path: &str) -> io::Result<PathBuf> {
    let p = Path::new(if path.is_empty() { "." } else { path });
    match fs::canonicalize(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Some(name) = p.file_name() else {
                return Err(e);
            };
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Ok(fs::canonicalize(parent)?.join(name))
        }
        other => other,
    }
}

/// Expands `~` and `~user` at the start of `path` to a home directory
/// (`$HOME`, else the working directory, for `~`).
fn expand_tilde(path: &str) -> io::Result<String> {
    let Some(rest) = path.strip_prefix('~') else {
        return Ok(path.to_string());
    };
    let (user, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let home = if user.is_empty() {
        match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h),
            _ => std::env::current_dir()?,
        }
    } else {
        match nix::unistd::User::from_name(user) {
            Ok(Some(u)) => u.dir,
            _ => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    };
    Ok(format!("{}{tail}", home.to_string_lossy()))
}

// ---------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------

/// What a handle refers to.
enum Opened {
    File(File),
    Dir(DirListing),
}

struct DirListing {
    path: PathBuf,
    entries: ReadDir,
    /// `.` and `..` already listed (0, 1 or 2).
    dots: u8,
    finished: bool,
}

/// Open files and directories by handle string, at most `cap` at once.
/// Handle strings are never reused within a session.
struct Handles {
    open: HashMap<String, Opened>,
    next: u64,
    cap: usize,
}

impl Handles {
    fn new(cap: usize) -> Self {
        Handles {
            open: HashMap::new(),
            next: 0,
            cap,
        }
    }

    fn check_room(&self) -> Reply<()> {
        if self.open.len() >= self.cap {
            return Err(failure(&format!(
                "too many open handles (at most {})",
                self.cap
            )));
        }
        Ok(())
    }

    fn insert(&mut self, item: Opened) -> Reply<String> {
        self.check_room()?;
        self.next += 1;
        let handle = self.next.to_string();
        self.open.insert(handle.clone(), item);
        Ok(handle)
    }

    fn get_mut(&mut self, handle: &str) -> Reply<&mut Opened> {
        self.open
            .get_mut(handle)
            .ok_or_else(|| failure("invalid handle"))
    }

    fn file(&mut self, handle: &str) -> Reply<&File> {
        match self.get_mut(handle)? {
            Opened::File(f) => Ok(f),
            Opened::Dir(_) => Err(failure("handle is a directory, not a file")),
        }
    }

    fn remove(&mut self, handle: &str) -> Reply<Opened> {
        self.open
            .remove(handle)
            .ok_or_else(|| failure("invalid handle"))
    }
}

/// User and group names for long names, looked up once per id.
#[derive(Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(
                || match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
                    Ok(Some(u)) => u.name,
                    _ => uid.to_string(),
                },
            )
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
                    Ok(Some(g)) => g.name,
                    _ => gid.to_string(),
                }
            })
            .clone()
    }
}

// ---------------------------------------------------------------------------
// The file-system side
// ---------------------------------------------------------------------------

/// Where attribute changes go: a path (following symlinks) or an open file.
enum Target<'a> {
    Path(&'a Path),
    File(&'a File),
}

/// One SFTP session's files: every request as a plain blocking call.
pub struct Files {
    handles: Handles,
    names: Names,
}

impl Default for Files {
    fn default() -> Self {
        Self::new()
    }
}

impl Files {
    pub fn new() -> Self {
        Files {
            handles: Handles::new(MAX_HANDLES),
            names: Names::default(),
        }
    }

    /// Opens (and with CREATE makes, mode from `attrs` or 0666 less the
    /// umask) a file; returns its handle.
    pub fn open(&mut self, path: &str, pflags: OpenFlags, attrs: &FileAttributes) -> Reply<String> {
        self.handles.check_room()?;
        let mode = attrs.permissions.map_or(0o666, |p| p & 0o7777);
        let fd = nix::fcntl::open(
            Path::new(path),
            open_flags(pflags),
            Mode::from_bits_truncate(mode as libc::mode_t),
        )
        .map_err(errno_reply)?;
        self.handles.insert(Opened::File(File::from(fd)))
    }

    pub fn close(&mut self, handle: &str) -> Reply<()> {
        self.handles.remove(handle).map(drop)
    }

    /// Up to `len` bytes (at most [`MAX_READ`]) at `offset`; EOF past the end.
    pub fn read(&mut self, handle: &str, offset: u64, len: u32) -> Reply<Vec<u8>> {
        let file = self.handles.file(handle)?;
        let mut buf = vec![0u8; len.min(MAX_READ) as usize];
        let n = loop {
            match file.read_at(&mut buf, offset) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_reply(e)),
            }
        };
        if n == 0 && !buf.is_empty() {
            return Err(eof());
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// Writes all of `data` at `offset` (at the end for APPEND handles).
    pub fn write(&mut self, handle: &str, offset: u64, data: &[u8]) -> Reply<()> {
        let file = self.handles.file(handle)?;
        file.write_all_at(data, offset).map_err(io_reply)
    }

    /// Attributes of `path`, following a final symlink when `follow`.
    pub fn stat(&mut self, path: &str, follow: bool) -> Reply<FileAttributes> {
        let m = if follow {
            fs::metadata(path)
        } else {
            fs::symlink_metadata(path)
        };
        m.map(|m| attributes(&m)).map_err(io_reply)
    }

    pub fn fstat(&mut self, handle: &str) -> Reply<FileAttributes> {
        let m = match self.handles.get_mut(handle)? {
            Opened::File(f) => f.metadata(),
            Opened::Dir(d) => fs::metadata(&d.path),
        };
        m.map(|m| attributes(&m)).map_err(io_reply)
    }

    pub fn setstat(&mut self, path: &str, attrs: &FileAttributes) -> Reply<()> {
        apply_attributes(Target::Path(Path::new(path)), attrs)
    }

    pub fn fsetstat(&mut self, handle: &str, attrs: &FileAttributes) -> Reply<()> {
        match self.handles.get_mut(handle)? {
            Opened::File(f) => apply_attributes(Target::File(f), attrs),
            Opened::Dir(d) => apply_attributes(Target::Path(&d.path), attrs),
        }
    }

    pub fn opendir(&mut self, path: &str) -> Reply<String> {
        self.handles.check_room()?;
        let entries = fs::read_dir(path).map_err(io_reply)?;
        self.handles.insert(Opened::Dir(DirListing {
            path: PathBuf::from(path),
            entries,
            dots: 0,
            finished: false,
        }))
    }

    /// The next entries (`.` and `..` first), up to a batch; EOF once done.
    pub fn readdir(&mut self, handle: &str) -> Reply<Vec<NameEntry>> {
        let Opened::Dir(dir) = self.handles.get_mut(handle)? else {
            return Err(failure("handle is a file, not a directory"));
        };
        let mut found: Vec<(String, Metadata)> = Vec::new();
        while dir.dots < 2 {
            let name = if dir.dots == 0 { "." } else { ".." };
            dir.dots += 1;
            if let Ok(m) = fs::symlink_metadata(dir.path.join(name)) {
                found.push((name.to_string(), m));
            }
        }
        while found.len() < READDIR_BATCH && !dir.finished {
            match dir.entries.next() {
                Some(Ok(entry)) => {
                    // An entry removed meanwhile is simply left out.
                    if let Ok(m) = entry.metadata() {
                        found.push((entry.file_name().to_string_lossy().into_owned(), m));
                    }
                }
                Some(Err(e)) => {
                    dir.finished = true;
                    if found.is_empty() {
                        return Err(io_reply(e));
                    }
                }
                None => dir.finished = true,
            }
        }
        if found.is_empty() {
            return Err(eof());
        }
        let now = unix_now();
        Ok(found
            .into_iter()
            .map(|(name, m)| {
                let user = self.names.user(m.uid());
                let group = self.names.group(m.gid());
                let longname = long_name(&name, &m, &user, &group, local_time(m.mtime()), now);
                NameEntry {
                    filename: name,
                    longname,
                    attrs: attributes(&m),
                }
            })
            .collect())
    }

    pub fn remove(&mut self, path: &str) -> Reply<()> {
        fs::remove_file(path).map_err(io_reply)
    }

    /// Makes a directory, mode from `attrs` or 0777 (less the umask).
    pub fn mkdir(&mut self, path: &str, attrs: &FileAttributes) -> Reply<()> {
        let mode = attrs.permissions.map_or(0o777, |p| p & 0o7777);
        fs::DirBuilder::new()
            .mode(mode)
            .create(path)
            .map_err(io_reply)
    }

    pub fn rmdir(&mut self, path: &str) -> Reply<()> {
        fs::remove_dir(path).map_err(io_reply)
    }

    pub fn realpath(&mut self, path: &str) -> Reply<String> {
        real_path(path).map(|p| path_string(&p)).map_err(io_reply)
    }

    /// SFTP v3 rename: fails when `new` exists.
    pub fn rename(&mut self, old: &str, new: &str) -> Reply<()> {
        rename_no_replace(Path::new(old), Path::new(new)).map_err(io_reply)
    }

    /// rename(2): replaces `new` atomically (posix-rename@openssh.com).
    pub fn posix_rename(&mut self, old: &str, new: &str) -> Reply<()> {
        fs::rename(old, new).map_err(io_reply)
    }

    pub fn hardlink(&mut self, old: &str, new: &str) -> Reply<()> {
        fs::hard_link(old, new).map_err(io_reply)
    }

    pub fn readlink(&mut self, path: &str) -> Reply<String> {
        fs::read_link(path)
            .map(|p| path_string(&p))
            .map_err(io_reply)
    }

    /// Makes `link` point at `target`. (OpenSSH's client sends these two in
    /// the opposite order to the SFTP draft; its order is the one that
    /// counts in practice, and the caller passes them accordingly.)
    pub fn symlink(&mut self, target: &str, link: &str) -> Reply<()> {
        std::os::unix::fs::symlink(target, link).map_err(io_reply)
    }

    pub fn fsync(&mut self, handle: &str) -> Reply<()> {
        self.handles.file(handle)?.sync_all().map_err(io_reply)
    }

    /// `~` expansion, then [`real_path`] (expand-path@openssh.com).
    pub fn expand_path(&mut self, path: &str) -> Reply<String> {
        let expanded = expand_tilde(path).map_err(io_reply)?;
        self.realpath(&expanded)
    }

    /// File-system figures for `df` (statvfs@openssh.com).
    pub fn statvfs(&mut self, path: &str) -> Reply<Statvfs> {
        nix::sys::statvfs::statvfs(Path::new(path))
            .map(|v| statvfs_reply(&v))
            .map_err(errno_reply)
    }

    pub fn fstatvfs(&mut self, handle: &str) -> Reply<Statvfs> {
        let v = match self.handles.get_mut(handle)? {
            Opened::File(f) => nix::sys::statvfs::fstatvfs(f.as_fd()),
            Opened::Dir(d) => nix::sys::statvfs::statvfs(&d.path),
        };
        v.map(|v| statvfs_reply(&v)).map_err(errno_reply)
    }

    #[cfg(test)]
    fn open_handles(&self) -> usize {
        self.handles.open.len()
    }
}

// The casts matter where c_ulong and the block counts are 32-bit.
#[allow(clippy::unnecessary_cast)]
fn statvfs_reply(v: &nix::sys::statvfs::Statvfs) -> Statvfs {
    use nix::sys::statvfs::FsFlags;
    // The extension's own flag bits: 1 read-only, 2 no set-id.
    let flags = v.flags();
    let flags = u64::from(flags.contains(FsFlags::ST_RDONLY))
        | (u64::from(flags.contains(FsFlags::ST_NOSUID)) << 1);
    Statvfs {
        block_size: v.block_size() as u64,
        fragment_size: v.fragment_size() as u64,
        blocks: v.blocks() as u64,
        blocks_free: v.blocks_free() as u64,
        blocks_avail: v.blocks_available() as u64,
        inodes: v.files() as u64,
        inodes_free: v.files_free() as u64,
        inodes_avail: v.files_available() as u64,
        fs_id: v.filesystem_id() as u64,
        flags,
        name_max: v.name_max() as u64,
    }
}

fn extended_reply<E>(id: u32, encoded: Result<bytes::Bytes, E>) -> Reply<Packet> {
    let data = encoded
        .map_err(|_| failure("cannot encode the reply"))?
        .to_vec();
    Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
}

/// Applies the attributes present in `attrs` in OpenSSH's order: size,
/// permissions, times, owner. Every change is tried; the first error is
/// the answer.
fn apply_attributes(target: Target<'_>, attrs: &FileAttributes) -> Reply<()> {
    let mut result: io::Result<()> = Ok(());
    let mut step = |r: io::Result<()>| {
        if result.is_ok() {
            result = r;
        }
    };
    if let Some(size) = attrs.size {
        step(match target {
            Target::Path(p) => i64::try_from(size)
                .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))
                .and_then(|size| nix::unistd::truncate(p, size).map_err(io::Error::from)),
            Target::File(f) => f.set_len(size),
        });
    }
    if let Some(perm) = attrs.permissions {
        let perm = fs::Permissions::from_mode(perm & 0o7777);
        step(match target {
            Target::Path(p) => fs::set_permissions(p, perm),
            Target::File(f) => f.set_permissions(perm),
        });
    }
    if attrs.atime.is_some() || attrs.mtime.is_some() {
        let time = |t: Option<u32>| t.map_or(TimeSpec::UTIME_OMIT, |t| TimeSpec::new(t as i64, 0));
        let (atime, mtime) = (time(attrs.atime), time(attrs.mtime));
        step(
            match target {
                Target::Path(p) => nix::sys::stat::utimensat(
                    nix::fcntl::AT_FDCWD,
                    p,
                    &atime,
                    &mtime,
                    UtimensatFlags::FollowSymlink,
                ),
                Target::File(f) => nix::sys::stat::futimens(f.as_fd(), &atime, &mtime),
            }
            .map_err(io::Error::from),
        );
    }
    if attrs.uid.is_some() || attrs.gid.is_some() {
        step(match target {
            Target::Path(p) => std::os::unix::fs::chown(p, attrs.uid, attrs.gid),
            Target::File(f) => std::os::unix::fs::fchown(f, attrs.uid, attrs.gid),
        });
    }
    result.map_err(io_reply)
}

// ---------------------------------------------------------------------------
// The protocol side
// ---------------------------------------------------------------------------

/// The russh-sftp handler: decodes nothing itself, answers from [`Files`]
/// what `policy` (`internal-sftp` options) does not refuse.
struct Session {
    files: Files,
    policy: ServerOptions,
    /// Dropped with the session, which tells [`serve`] it has ended.
    _done: tokio::sync::oneshot::Sender<()>,
}

impl Session {
    fn permit(&self, request: Request) -> Reply<()> {
        if self.policy.refuses(request) {
            return Err(refused(&self.policy, request));
        }
        Ok(())
    }
}

/// The answer to a request the server's options refuse, saying which
/// option (clients such as skiff show it).
fn refused(policy: &ServerOptions, request: Request) -> StatusReply {
    let why = if policy.refused.contains(&request) {
        format!("Permission denied: this server refuses {request} requests")
    } else {
        "Permission denied: this server is read-only".to_string()
    };
    StatusCode::PermissionDenied.with_message(why)
}

fn one_name(id: u32, name: String) -> Name {
    Name {
        id,
        files: vec![NameEntry {
            longname: name.clone(),
            filename: name,
            attrs: FileAttributes::empty(),
        }],
    }
}

/// The `N` strings an extension request carries (each a u32 length and
/// bytes, read as UTF-8 like russh-sftp's own strings).
pub fn extension_strings<const N: usize>(data: &[u8]) -> Reply<[String; N]> {
    let malformed = || StatusCode::BadMessage.with_message("malformed extension request");
    let mut rest = data;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for slot in out.iter_mut() {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(malformed)?;
        let len = u32::from_be_bytes(*len) as usize;
        if tail.len() < len {
            return Err(malformed());
        }
        *slot = String::from_utf8_lossy(&tail[..len]).into_owned();
        rest = &tail[len..];
    }
    Ok(out)
}

impl russh_sftp::server::Handler for Session {
    type Error = StatusReply;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported.with_message("operation not supported")
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        let mut version = Version::new();
        for (name, v) in [
            ("posix-rename@openssh.com", "1"),
            ("hardlink@openssh.com", "1"),
            ("fsync@openssh.com", "1"),
            ("statvfs@openssh.com", "2"),
            ("fstatvfs@openssh.com", "2"),
            ("limits@openssh.com", "1"),
            ("expand-path@openssh.com", "1"),
        ] {
            version.extensions.insert(name.to_string(), v.to_string());
        }
        Ok(version)
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let writes = pflags.intersects(
            OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::APPEND,
        );
        if self.policy.refuses_open(writes) {
            return Err(refused(&self.policy, Request::Open));
        }
        let handle = self.files.open(&filename, pflags, &attrs)?;
        Ok(Handle { id, handle })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        self.permit(Request::Close)?;
        self.files.close(&handle)?;
        Ok(ok_status(id))
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        self.permit(Request::Read)?;
        let data = self.files.read(&handle, offset, len)?;
        Ok(Data { id, data })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Write)?;
        self.files.write(&handle, offset, &data)?;
        Ok(ok_status(id))
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        self.permit(Request::Lstat)?;
        let attrs = self.files.stat(&path, false)?;
        Ok(Attrs { id, attrs })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        self.permit(Request::Fstat)?;
        let attrs = self.files.fstat(&handle)?;
        Ok(Attrs { id, attrs })
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Setstat)?;
        self.files.setstat(&path, &attrs)?;
        Ok(ok_status(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Fsetstat)?;
        self.files.fsetstat(&handle, &attrs)?;
        Ok(ok_status(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        self.permit(Request::Opendir)?;
        let handle = self.files.opendir(&path)?;
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        self.permit(Request::Readdir)?;
        let files = self.files.readdir(&handle)?;
        Ok(Name { id, files })
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        self.permit(Request::Remove)?;
        self.files.remove(&filename)?;
        Ok(ok_status(id))
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Mkdir)?;
        self.files.mkdir(&path, &attrs)?;
        Ok(ok_status(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        self.permit(Request::Rmdir)?;
        self.files.rmdir(&path)?;
        Ok(ok_status(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        self.permit(Request::Realpath)?;
        let resolved = self.files.realpath(&path)?;
        Ok(one_name(id, resolved))
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        self.permit(Request::Stat)?;
        let attrs = self.files.stat(&path, true)?;
        Ok(Attrs { id, attrs })
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Rename)?;
        self.files.rename(&oldpath, &newpath)?;
        Ok(ok_status(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        self.permit(Request::Readlink)?;
        let target = self.files.readlink(&path)?;
        Ok(one_name(id, target))
    }

    /// OpenSSH sends the link's target first and the new link's path second
    /// (the reverse of the draft, whose names russh-sftp uses).
    async fn symlink(
        &mut self,
        id: u32,
        linkpath: String,
        targetpath: String,
    ) -> Result<Status, Self::Error> {
        self.permit(Request::Symlink)?;
        self.files.symlink(&linkpath, &targetpath)?;
        Ok(ok_status(id))
    }

    async fn extended(
        &mut self,
        id: u32,
        request: String,
        data: Vec<u8>,
    ) -> Result<Packet, Self::Error> {
        if let Some(r) = Request::from_extension(&request) {
            self.permit(r)?;
        }
        match request.as_str() {
            "posix-rename@openssh.com" => {
                let [old, new] = extension_strings(&data)?;
                self.files.posix_rename(&old, &new)?;
            }
            "hardlink@openssh.com" => {
                let [old, new] = extension_strings(&data)?;
                self.files.hardlink(&old, &new)?;
            }
            "fsync@openssh.com" => {
                let [handle] = extension_strings(&data)?;
                self.files.fsync(&handle)?;
            }
            "expand-path@openssh.com" => {
                let [path] = extension_strings(&data)?;
                let resolved = self.files.expand_path(&path)?;
                return Ok(Packet::Name(one_name(id, resolved)));
            }
            "statvfs@openssh.com" => {
                let [path] = extension_strings(&data)?;
                let v = self.files.statvfs(&path)?;
                return extended_reply(id, russh_sftp::ser::to_bytes(&v));
            }
            "fstatvfs@openssh.com" => {
                let [handle] = extension_strings(&data)?;
                let v = self.files.fstatvfs(&handle)?;
                return extended_reply(id, russh_sftp::ser::to_bytes(&v));
            }
            "limits@openssh.com" => {
                let limits = LimitsExtension {
                    max_packet_len: MAX_PACKET as u64,
                    max_read_len: MAX_READ as u64,
                    max_write_len: MAX_READ as u64,
                    max_open_handles: MAX_HANDLES as u64,
                };
                return extended_reply(id, russh_sftp::ser::to_bytes(&limits));
            }
            _ => {
                return Err(StatusCode::OpUnsupported
                    .with_message(format!("extension {request:?} not supported")))
            }
        }
        Ok(Packet::Status(ok_status(id)))
    }
}

// ---------------------------------------------------------------------------
// stdin/stdout as one stream
// ---------------------------------------------------------------------------

/// stdin and stdout as one stream. An I/O error on either ends the input,
/// so the session stops instead of retrying a broken pipe.
struct Stdio {
    input: tokio::io::BufReader<Box<dyn AsyncRead + Unpin + Send>>,
    output: Box<dyn AsyncWrite + Unpin + Send>,
    broken: bool,
}

impl Stdio {
    /// Pipes from skiffd (the usual case) are read and written in place by
    /// the runtime; anything else (a terminal, a file) goes through tokio's
    /// stdin and stdout, which hand every read and write to another thread.
    fn new() -> Self {
        use tokio::net::unix::pipe;
        let input: Box<dyn AsyncRead + Unpin + Send> =
            match dup_std(0).and_then(pipe::Receiver::from_owned_fd) {
                Ok(pipe) => Box::new(pipe),
                Err(_) => Box::new(tokio::io::stdin()),
            };
        let output: Box<dyn AsyncWrite + Unpin + Send> =
            match dup_std(1).and_then(pipe::Sender::from_owned_fd) {
                Ok(pipe) => Box::new(pipe),
                Err(_) => Box::new(tokio::io::stdout()),
            };
        Stdio {
            input: tokio::io::BufReader::with_capacity(256 * 1024, input),
            output,
            broken: false,
        }
    }
}

/// A second descriptor for standard input or output (fd 0 or 1).
fn dup_std(fd: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: fd 0 and fd 1 stay open for the life of the process; the
    // borrow only lasts for the dup.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned()
}

impl AsyncRead for Stdio {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.input).poll_read(cx, buf) {
            Poll::Ready(Err(_)) => {
                this.broken = true;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Stdio {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.output).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &r {
            this.broken = true;
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.output).poll_flush(cx);
        if let Poll::Ready(Err(_)) = &r {
            this.broken = true;
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().output).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn code(r: Reply<impl std::fmt::Debug>) -> StatusCode {
        r.expect_err("expected an error status").status_code
    }

    fn create() -> OpenFlags {
        OpenFlags::READ | OpenFlags::WRITE | OpenFlags::CREATE
    }

    fn s(p: &Path) -> String {
        p.to_str().expect("utf-8 temp path").to_string()
    }

    #[test]
    fn internal_server_commands_are_recognised() {
        for exe in ["/usr/sbin/skiffd", "/opt/my skiffd", "/opt/it's/skiffd"] {
            let command = subsystem_command(Path::new(exe)).unwrap();
            assert_eq!(internal_server_exe(&command), Some(PathBuf::from(exe)));
        }
        for other in [
            "/usr/lib/openssh/sftp-server",
            "'/x' --sftp-server --more",
            "'/x'; rm -rf / #' --sftp-server",
            "'x' --sftp-server",
            "/x --sftp-server",
        ] {
            assert_eq!(internal_server_exe(other), None, "{other}");
        }
    }

    #[test]
    fn errors_map_to_status_codes() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(status_code(&os(libc::ENOENT)), StatusCode::NoSuchFile);
        assert_eq!(status_code(&os(libc::ENOTDIR)), StatusCode::NoSuchFile);
        assert_eq!(status_code(&os(libc::EACCES)), StatusCode::PermissionDenied);
        assert_eq!(status_code(&os(libc::EPERM)), StatusCode::PermissionDenied);
        assert_eq!(status_code(&os(libc::EROFS)), StatusCode::PermissionDenied);
        assert_eq!(status_code(&os(libc::EEXIST)), StatusCode::Failure);
        assert_eq!(status_code(&os(libc::ENOTEMPTY)), StatusCode::Failure);
        assert_eq!(status_code(&os(libc::ENOSPC)), StatusCode::Failure);
        assert_eq!(status_code(&os(libc::EINVAL)), StatusCode::BadMessage);
        assert_eq!(status_code(&os(libc::ENOSYS)), StatusCode::OpUnsupported);
        let kind = |k| io::Error::new(k, "x");
        assert_eq!(
            status_code(&kind(io::ErrorKind::NotFound)),
            StatusCode::NoSuchFile
        );
        assert_eq!(
            status_code(&kind(io::ErrorKind::PermissionDenied)),
            StatusCode::PermissionDenied
        );
        assert_eq!(
            status_code(&kind(io::ErrorKind::InvalidInput)),
            StatusCode::BadMessage
        );
        assert_eq!(
            status_code(&kind(io::ErrorKind::Other)),
            StatusCode::Failure
        );
        let reply = io_reply(os(libc::ENOENT));
        assert_eq!(
            reply.error_message.as_deref(),
            Some("No such file or directory")
        );
    }

    #[test]
    fn open_flags_follow_posix() {
        let base = OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        assert_eq!(open_flags(OpenFlags::READ), OFlag::O_RDONLY | base);
        assert_eq!(open_flags(OpenFlags::empty()), OFlag::O_RDONLY | base);
        assert_eq!(open_flags(OpenFlags::WRITE), OFlag::O_WRONLY | base);
        assert_eq!(
            open_flags(OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | base
        );
        assert_eq!(
            open_flags(create() | OpenFlags::EXCLUDE | OpenFlags::APPEND),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_APPEND | base
        );
    }

    #[test]
    fn ls_columns() {
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(mode_string(0o120777), "lrwxrwxrwx");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o102644), "-rw-r-Sr--");
        assert_eq!(mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(mode_string(0o041776), "drwxrwxrwT");
        assert_eq!(mode_string(0o010600), "prw-------");
        let t = LocalTime {
            year: 2024,
            month: 2,
            day: 5,
            hour: 9,
            minute: 7,
        };
        assert_eq!(ls_time(t, true), "Mar  5 09:07");
        assert_eq!(ls_time(t, false), "Mar  5  2024");

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"12345").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let m = fs::metadata(&f).unwrap();
        let line = long_name("f", &m, "alice", "staff", t, m.mtime() + 10);
        assert_eq!(
            line,
            "-rw-r-----    1 alice    staff           5 Mar  5 09:07 f"
        );
        let old = long_name("f", &m, "alice", "staff", t, m.mtime() + 200 * 86400);
        assert!(old.ends_with("Mar  5  2024 f"), "{old}");
    }

    #[test]
    fn extension_strings_parse_and_refuse_short_data() {
        let mut data = Vec::new();
        for word in ["old", "nëw"] {
            data.extend_from_slice(&(word.len() as u32).to_be_bytes());
            data.extend_from_slice(word.as_bytes());
        }
        let [a, b] = extension_strings(&data).unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("old", "nëw"));
        assert_eq!(code(extension_strings::<3>(&data)), StatusCode::BadMessage);
        assert_eq!(
            code(extension_strings::<1>(&[0, 0, 1])),
            StatusCode::BadMessage
        );
        assert_eq!(
            code(extension_strings::<1>(&[0, 0, 0, 9, b'x'])),
            StatusCode::BadMessage
        );
    }

    #[test]
    fn subsystem_command_quotes_the_path() {
        assert_eq!(
            subsystem_command(Path::new("/usr/bin/skiffd")).unwrap(),
            "'/usr/bin/skiffd' --sftp-server"
        );
        assert_eq!(
            subsystem_command(Path::new("/opt/it's here/skiffd")).unwrap(),
            r"'/opt/it'\''s here/skiffd' --sftp-server"
        );
    }

    #[test]
    fn files_open_write_read_stat_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = s(&dir.path().join("f"));
        let mut files = Files::new();
        let attrs = FileAttributes {
            permissions: Some(0o600),
            ..Default::default()
        };
        let h = files.open(&p, create(), &attrs).unwrap();
        files.write(&h, 0, b"hello").unwrap();
        files.write(&h, 10, b"world").unwrap();
        assert_eq!(files.read(&h, 0, 5).unwrap(), b"hello");
        assert_eq!(files.read(&h, 5, 100).unwrap(), b"\0\0\0\0\0world");
        assert_eq!(code(files.read(&h, 15, 10)), StatusCode::Eof);
        let a = files.fstat(&h).unwrap();
        assert_eq!(a.size, Some(15));
        assert_eq!(a.permissions.unwrap() & 0o7777, 0o600);
        assert_eq!(a.permissions.unwrap() & libc::S_IFMT, libc::S_IFREG);
        let m = fs::metadata(&p).unwrap();
        assert_eq!(a.uid, Some(m.uid()));
        assert_eq!(a.gid, Some(m.gid()));
        assert_eq!(a.mtime, Some(m.mtime() as u32));
        files.close(&h).unwrap();
        assert_eq!(code(files.close(&h)), StatusCode::Failure);
        assert_eq!(code(files.read(&h, 0, 1)), StatusCode::Failure);

        // EXCL on an existing file; no CREATE on a missing one.
        let excl = create() | OpenFlags::EXCLUDE;
        assert_eq!(code(files.open(&p, excl, &attrs)), StatusCode::Failure);
        let missing = s(&dir.path().join("missing"));
        assert_eq!(
            code(files.open(&missing, OpenFlags::READ, &attrs)),
            StatusCode::NoSuchFile
        );
        // TRUNCATE empties; APPEND writes at the end whatever the offset.
        let flags = OpenFlags::WRITE | OpenFlags::TRUNCATE;
        let h = files.open(&p, flags, &attrs).unwrap();
        assert_eq!(files.fstat(&h).unwrap().size, Some(0));
        files.close(&h).unwrap();
        let h = files
            .open(&p, OpenFlags::WRITE | OpenFlags::APPEND, &attrs)
            .unwrap();
        files.write(&h, 0, b"ab").unwrap();
        files.write(&h, 0, b"cd").unwrap();
        files.close(&h).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"abcd");
        assert_eq!(files.open_handles(), 0);
    }

    #[test]
    fn setstat_changes_size_mode_times() {
        let dir = tempfile::tempdir().unwrap();
        let p = s(&dir.path().join("f"));
        fs::write(&p, b"0123456789").unwrap();
        let mut files = Files::new();
        let change = FileAttributes {
            size: Some(4),
            permissions: Some(0o100751),
            atime: Some(1_000_000_000),
            mtime: Some(1_200_000_000),
            ..Default::default()
        };
        files.setstat(&p, &change).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m.mode() & 0o7777, 0o751);
        assert_eq!((m.atime(), m.mtime()), (1_000_000_000, 1_200_000_000));

        let h = files
            .open(&p, OpenFlags::WRITE, &FileAttributes::default())
            .unwrap();
        let change = FileAttributes {
            size: Some(0),
            permissions: Some(0o600),
            mtime: Some(1_300_000_000),
            atime: Some(1_300_000_001),
            // Giving a file to its own owner and group is always allowed.
            uid: Some(m.uid()),
            gid: Some(m.gid()),
            ..Default::default()
        };
        files.fsetstat(&h, &change).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!(
            (m.len(), m.mode() & 0o7777, m.mtime()),
            (0, 0o600, 1_300_000_000)
        );
        assert_eq!(
            code(files.setstat(&s(&dir.path().join("nope")), &change)),
            StatusCode::NoSuchFile
        );
        assert_eq!(code(files.fsetstat("999", &change)), StatusCode::Failure);
    }

    #[test]
    fn directories_list_in_batches_with_long_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        let mut files = Files::new();
        files
            .mkdir(
                &s(&d),
                &FileAttributes {
                    permissions: Some(0o700),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        for i in 0..250 {
            fs::write(d.join(format!("f{i:03}")), b"x").unwrap();
        }
        let h = files.opendir(&s(&d)).unwrap();
        assert_eq!(code(files.read(&h, 0, 1)), StatusCode::Failure);
        let mut names = Vec::new();
        loop {
            match files.readdir(&h) {
                Ok(batch) => {
                    assert!(!batch.is_empty() && batch.len() <= READDIR_BATCH);
                    for e in batch {
                        assert!(
                            e.longname.ends_with(&format!(" {}", e.filename)),
                            "{}",
                            e.longname
                        );
                        names.push(e.filename);
                    }
                }
                Err(e) => {
                    assert_eq!(e.status_code, StatusCode::Eof);
                    break;
                }
            }
        }
        assert_eq!(names.len(), 252);
        assert_eq!(&names[..2], [".", ".."]);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 252);
        assert_eq!(code(files.readdir(&h)), StatusCode::Eof);
        files.close(&h).unwrap();

        assert_eq!(code(files.rmdir(&s(&d))), StatusCode::Failure); // not empty
        assert_eq!(code(files.remove(&s(&d))), StatusCode::Failure); // a directory
        assert_eq!(
            code(files.opendir(&s(&d.join("f000")))),
            StatusCode::NoSuchFile
        );
        assert_eq!(
            code(files.mkdir(&s(&d), &FileAttributes::default())),
            StatusCode::Failure
        );
    }

    #[test]
    fn rename_link_and_paths() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let (a, b, c) = (base.join("a"), base.join("b"), base.join("c"));
        fs::write(&a, b"A").unwrap();
        fs::write(&b, b"B").unwrap();
        let mut files = Files::new();
        // Plain rename refuses to replace; posix-rename replaces.
        assert_eq!(code(files.rename(&s(&a), &s(&b))), StatusCode::Failure);
        files.rename(&s(&a), &s(&c)).unwrap();
        files.posix_rename(&s(&c), &s(&b)).unwrap();
        assert_eq!(fs::read(&b).unwrap(), b"A");
        assert!(!a.exists() && !c.exists());
        files.hardlink(&s(&b), &s(&a)).unwrap();
        assert_eq!(fs::metadata(&a).unwrap().nlink(), 2);

        let link = base.join("l");
        files.symlink(&s(&b), &s(&link)).unwrap();
        assert_eq!(files.readlink(&s(&link)).unwrap(), s(&b));
        assert_eq!(
            files.stat(&s(&link), false).unwrap().permissions.unwrap() & libc::S_IFMT,
            libc::S_IFLNK
        );
        assert_eq!(files.stat(&s(&link), true).unwrap().size, Some(1));
        assert_eq!(files.realpath(&s(&link)).unwrap(), s(&b));
        // The last component may be missing; an earlier one may not.
        assert_eq!(
            files.realpath(&s(&base.join("new"))).unwrap(),
            s(&base.join("new"))
        );
        assert_eq!(
            files
                .realpath(&format!("{}/x/../new", s(&base)))
                .map_err(|e| e.status_code),
            Err(StatusCode::NoSuchFile)
        );
        fs::create_dir(base.join("sub")).unwrap();
        assert_eq!(
            files.realpath(&format!("{}/./sub/../b", s(&base))).unwrap(),
            s(&b)
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(files.realpath("").unwrap(), s(&cwd));
        assert_eq!(files.realpath(".").unwrap(), s(&cwd));
        assert_eq!(files.expand_path("/").unwrap(), "/");
        files.remove(&s(&link)).unwrap();
        assert_eq!(code(files.remove(&s(&link))), StatusCode::NoSuchFile);
        assert_eq!(code(files.readlink(&s(&b))), StatusCode::BadMessage); // EINVAL: not a link
    }

    #[test]
    fn handles_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let p = s(&dir.path().join("f"));
        fs::write(&p, b"x").unwrap();
        let mut files = Files::new();
        let none = FileAttributes::default();
        let handles: Vec<String> = (0..MAX_HANDLES)
            .map(|_| files.open(&p, OpenFlags::READ, &none).unwrap())
            .collect();
        assert_eq!(
            code(files.open(&p, OpenFlags::READ, &none)),
            StatusCode::Failure
        );
        assert_eq!(code(files.opendir(&s(dir.path()))), StatusCode::Failure);
        // Refused before creating anything.
        let other = s(&dir.path().join("g"));
        assert_eq!(
            code(files.open(&other, create(), &none)),
            StatusCode::Failure
        );
        assert!(!Path::new(&other).exists());
        files.close(&handles[7]).unwrap();
        let again = files.open(&p, OpenFlags::READ, &none).unwrap();
        assert!(!handles.contains(&again), "handle strings are not reused");
        assert_eq!(code(files.read("not-a-handle", 0, 1)), StatusCode::Failure);
        assert_eq!(code(files.fsync("")), StatusCode::Failure);
    }

    // -- the protocol, over an in-memory stream --

    const FXP_INIT: u8 = 1;
    const FXP_OPEN: u8 = 3;
    const FXP_READ: u8 = 5;
    const FXP_REALPATH: u8 = 16;
    const FXP_STATUS: u8 = 101;
    const FXP_NAME: u8 = 104;
    const FXP_EXTENDED: u8 = 200;
    const FXP_EXTENDED_REPLY: u8 = 201;
    const FXP_VERSION: u8 = 2;

    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s);
    }

    /// A framed packet: length, type, request id (unless INIT), body.
    fn packet(kind: u8, id: u32, body: &[u8]) -> Vec<u8> {
        let mut payload = vec![kind];
        if kind != FXP_INIT {
            payload.extend_from_slice(&id.to_be_bytes());
        }
        payload.extend_from_slice(body);
        let mut out = (payload.len() as u32).to_be_bytes().to_vec();
        out.extend(payload);
        out
    }

    async fn reply(stream: &mut tokio::io::DuplexStream) -> (u8, Vec<u8>) {
        let len = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_u32())
            .await
            .expect("a reply in time")
            .expect("a reply");
        let mut buf = vec![0; len as usize];
        stream.read_exact(&mut buf).await.unwrap();
        (buf[0], buf[1..].to_vec())
    }

    /// The status code of a STATUS reply for request `id`.
    fn status_of(kind: u8, body: &[u8], id: u32) -> u32 {
        assert_eq!(kind, FXP_STATUS, "expected a status, got type {kind}");
        assert_eq!(&body[..4], id.to_be_bytes());
        u32::from_be_bytes(body[4..8].try_into().unwrap())
    }

    #[tokio::test]
    async fn protocol_survives_malformed_input_and_ends_at_eof() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(serve(server, ServerOptions::default()));

        client
            .write_all(&packet(FXP_INIT, 0, &3u32.to_be_bytes()))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(kind, FXP_VERSION);
        assert_eq!(&body[..4], 3u32.to_be_bytes());
        let text = String::from_utf8_lossy(&body);
        for ext in [
            "posix-rename@openssh.com",
            "fsync@openssh.com",
            "limits@openssh.com",
        ] {
            assert!(text.contains(ext), "VERSION lacks {ext}");
        }

        // An unknown packet type, a truncated body, a string longer than
        // the packet: each answered with BAD_MESSAGE, nothing more.
        client.write_all(&packet(99, 1, b"junk")).await.unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 0), StatusCode::BadMessage as u32);
        client
            .write_all(&packet(FXP_READ, 2, &[0, 0]))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 0), StatusCode::BadMessage as u32);
        client
            .write_all(&packet(FXP_OPEN, 3, &[0xff, 0xff, 0xff, 0xff, b'a']))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 0), StatusCode::BadMessage as u32);
        client.write_all(&[0, 0, 0, 0]).await.unwrap(); // an empty packet
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 0), StatusCode::BadMessage as u32);

        // A read on a handle that was never opened.
        let mut body = Vec::new();
        string(&mut body, b"42");
        body.extend_from_slice(&0u64.to_be_bytes());
        body.extend_from_slice(&10u32.to_be_bytes());
        client.write_all(&packet(FXP_READ, 4, &body)).await.unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 4), StatusCode::Failure as u32);

        // Unknown extension, malformed extension data, and limits.
        let mut body = Vec::new();
        string(&mut body, b"nonsense@example.com");
        client
            .write_all(&packet(FXP_EXTENDED, 5, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 5), StatusCode::OpUnsupported as u32);
        let mut body = Vec::new();
        string(&mut body, b"posix-rename@openssh.com");
        body.extend_from_slice(&[0, 0, 0, 5, b'a']);
        client
            .write_all(&packet(FXP_EXTENDED, 6, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 6), StatusCode::BadMessage as u32);
        let mut body = Vec::new();
        string(&mut body, b"limits@openssh.com");
        client
            .write_all(&packet(FXP_EXTENDED, 7, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(kind, FXP_EXTENDED_REPLY);
        assert_eq!(body.len(), 4 + 32);
        assert_eq!(&body[4..12], (MAX_PACKET as u64).to_be_bytes());
        assert_eq!(&body[28..36], (MAX_HANDLES as u64).to_be_bytes());

        // Still serving: realpath of "/".
        let mut body = Vec::new();
        string(&mut body, b"/");
        client
            .write_all(&packet(FXP_REALPATH, 8, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(kind, FXP_NAME);
        assert_eq!(&body[..8], [0, 0, 0, 8, 0, 0, 0, 1]);
        assert_eq!(&body[8..13], [0, 0, 0, 1, b'/']);

        // A packet over the limit, then end of input: serve returns.
        client
            .write_all(&(MAX_PACKET + 1).to_be_bytes())
            .await
            .unwrap();
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .expect("serve ends at EOF")
            .expect("no panic");
    }

    #[tokio::test]
    async fn refused_requests_get_permission_denied_and_change_nothing() {
        const FXP_REMOVE: u8 = 13;
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept");
        fs::write(&kept, "x").unwrap();
        let policy = ServerOptions {
            read_only: true,
            refused: vec![Request::Realpath],
            ..ServerOptions::default()
        };
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(serve(server, policy));
        client
            .write_all(&packet(FXP_INIT, 0, &3u32.to_be_bytes()))
            .await
            .unwrap();
        assert_eq!(reply(&mut client).await.0, FXP_VERSION);
        let denied = StatusCode::PermissionDenied as u32;

        // Opening to create (pflags WRITE|CREAT, no attributes).
        let made = dir.path().join("made");
        let mut body = Vec::new();
        string(&mut body, made.to_str().unwrap().as_bytes());
        body.extend_from_slice(&(0x02u32 | 0x08).to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        client.write_all(&packet(FXP_OPEN, 1, &body)).await.unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 1), denied);
        assert!(!made.exists());
        // Removing, a modifying extension, and a request -P/-p refuse.
        let mut body = Vec::new();
        string(&mut body, kept.to_str().unwrap().as_bytes());
        client
            .write_all(&packet(FXP_REMOVE, 2, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 2), denied);
        let mut body = Vec::new();
        string(&mut body, b"posix-rename@openssh.com");
        string(&mut body, kept.to_str().unwrap().as_bytes());
        string(&mut body, made.to_str().unwrap().as_bytes());
        client
            .write_all(&packet(FXP_EXTENDED, 3, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 3), denied);
        let mut body = Vec::new();
        string(&mut body, b"/");
        client
            .write_all(&packet(FXP_REALPATH, 4, &body))
            .await
            .unwrap();
        let (kind, body) = reply(&mut client).await;
        assert_eq!(status_of(kind, &body, 4), denied);
        assert!(kept.exists() && !made.exists());
        // Reading is served.
        let mut body = Vec::new();
        string(&mut body, kept.to_str().unwrap().as_bytes());
        body.extend_from_slice(&0x01u32.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        client.write_all(&packet(FXP_OPEN, 5, &body)).await.unwrap();
        assert_eq!(reply(&mut client).await.0, 102, "a HANDLE");
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .expect("serve ends at EOF")
            .expect("no panic");
    }
}
