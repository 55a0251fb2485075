//! Filesystem and socket security for the per-user skiff agent.
//!
//! The agent listens on a Unix socket in a private directory. Everything in
//! this module is about making sure that only the user who owns the agent can
//! ever talk to it:
//!
//! * [`agent_dir`] / [`ensure_private_dir`] pick and verify the directory. An
//!   existing directory that is a symlink, owned by someone else, or has any
//!   group/other permission bits is *refused*, never repaired or used: if an
//!   attacker pre-created it, we must not adopt it.
//! * [`bind_private`] binds the listening socket with mode 0600, replacing a
//!   stale socket file left behind by a dead agent, and refusing to steal the
//!   address of a live one.
//! * [`peer_uid`] / [`check_peer`] verify the connecting process's uid with
//!   `SO_PEERCRED`, so even a mistake in file permissions cannot let another
//!   user in.
//! * [`send_with_fds`] / [`recv_with_fds`] carry bytes plus file descriptors
//!   (`SCM_RIGHTS`), which is how `skiff` hands its stdin/stdout/stderr to the
//!   agent.
//! * [`lock_spawn`] serialises agent start-up, so that many simultaneous first
//!   calls start exactly one agent. Call [`bind_private`] while holding it:
//!   the stale-socket check and the bind are not atomic on their own.
//!
//! Everything here uses blocking `std` types; wrap the results for async use.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice};
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    self, sockopt, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};

/// File name of the agent socket inside the agent directory.
pub const SOCKET_NAME: &str = "agent.sock";
/// File name of the spawn lock inside the agent directory.
pub const LOCK_NAME: &str = "agent.lock";
/// Name of the agent directory inside `$XDG_RUNTIME_DIR`.
const XDG_SUBDIR: &str = "skiff";
/// Largest number of descriptors one message may carry (Linux `SCM_MAX_FD`).
const MAX_FDS_PER_MESSAGE: usize = 253;

/// Why the agent's directory, socket or lock could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// An operating-system error on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The path exists but belongs to another user.
    #[error(
        "{} is owned by uid {owner}, not by the current user; refusing to use it \
         (someone else may have created it). Remove it and try again",
        path.display()
    )]
    NotOwned {
        /// The offending path.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
    },
    /// The path grants permissions to group or others.
    #[error(
        "{} has mode {mode:04o}, which lets other users in; refusing to use it. \
         Run `chmod go-rwx {}` (or remove it) and try again",
        path.display(),
        path.display()
    )]
    TooOpen {
        /// The offending path.
        path: PathBuf,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
    /// The path exists but is not a directory.
    #[error(
        "{} exists but is not a directory; remove it so that skiff can create \
         its private agent directory there",
        .0.display()
    )]
    NotADirectory(PathBuf),
    /// The path is a symbolic link, which is never followed.
    #[error(
        "{} is a symbolic link; refusing to follow it for the skiff agent. \
         Remove the link and try again",
        .0.display()
    )]
    Symlink(PathBuf),
    /// A connection came from a process of another user.
    #[error(
        "refused an agent connection from uid {got}: the agent only serves \
         its own user (uid {expected})"
    )]
    PeerUid {
        /// Our effective uid.
        expected: u32,
        /// The peer's uid.
        got: u32,
    },
    /// Another agent is already listening on the socket.
    #[error("another skiff agent is already listening on {}", .0.display())]
    AddrInUse(PathBuf),
    /// Something other than a socket sits where the socket should be.
    #[error(
        "{} exists but is not a socket; refusing to replace it. Remove it and try again",
        .0.display()
    )]
    NotASocket(PathBuf),
    /// The lock file exists but is not a regular file.
    #[error(
        "{} exists but is not a regular file; remove it and try again",
        .0.display()
    )]
    NotAFile(PathBuf),
    /// The spawn lock stayed held by someone else for the whole wait.
    #[error(
        "timed out after {waited:?} waiting for the lock {} (another skiff is \
         starting the agent); try again, or remove the lock file if no skiff is running",
        path.display()
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// `SO_PEERCRED` failed on a connection.
    #[error(
        "cannot read the credentials of the process on the other end of an agent connection: {0}"
    )]
    PeerCred(#[source] io::Error),
}

fn io_err(path: &Path, source: impl Into<io::Error>) -> SocketError {
    SocketError::Io {
        path: path.to_path_buf(),
        source: source.into(),
    }
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The agent's directory: `$XDG_RUNTIME_DIR/skiff` when `XDG_RUNTIME_DIR` is
/// set and usable (an absolute path to a real directory, owned by us, not
/// group/world-writable), else `/tmp/skiff-<uid>`. Created 0700 if missing.
///
/// An existing directory that is a symlink, not owned by the effective uid,
/// or has any group/other permission bits is refused (error), never fixed up
/// or used.
pub fn agent_dir() -> Result<PathBuf, SocketError> {
    agent_dir_in(std::env::var_os("XDG_RUNTIME_DIR"), Path::new("/tmp"))
}

/// [`agent_dir`] with the environment and the fallback base made explicit.
fn agent_dir_in(xdg_runtime_dir: Option<OsString>, tmp: &Path) -> Result<PathBuf, SocketError> {
    let dir = choose_agent_dir(xdg_runtime_dir, tmp, euid());
    ensure_private_dir(&dir)?;
    Ok(dir)
}

fn choose_agent_dir(xdg_runtime_dir: Option<OsString>, tmp: &Path, uid: u32) -> PathBuf {
    if let Some(xdg) = xdg_runtime_dir {
        let xdg = PathBuf::from(xdg);
        if runtime_dir_usable(&xdg, uid) {
            return xdg.join(XDG_SUBDIR);
        }
    }
    tmp.join(format!("skiff-{uid}"))
}

fn runtime_dir_usable(path: &Path, uid: u32) -> bool {
    if !path.is_absolute() {
        return false;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) => meta.file_type().is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0,
        Err(_) => false,
    }
}

/// Makes sure `path` is a private directory of ours: creates it with mode
/// 0700 if it is missing (its parent must exist), otherwise checks that it is
/// a real directory (not a symlink), owned by the effective uid, with no
/// group/other permission bits. Never changes an existing directory.
pub fn ensure_private_dir(path: &Path) -> Result<(), SocketError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => return check_private_dir(path, &meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, e)),
    }
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {
            // mkdir applies the umask, which can only remove bits from 0700;
            // give the owner back full access to the directory we just made.
            // O_NOFOLLOW + fchmod so that we only ever touch that directory.
            let dir = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| io_err(path, e))?;
            let meta = dir.metadata().map_err(|e| io_err(path, e))?;
            if meta.uid() == euid() && meta.mode() & 0o7777 != 0o700 {
                dir.set_permissions(fs::Permissions::from_mode(0o700))
                    .map_err(|e| io_err(path, e))?;
            }
        }
        // Somebody created it between our lstat and mkdir: check what is there.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(path, e)),
    }
    let meta = fs::symlink_metadata(path).map_err(|e| io_err(path, e))?;
    check_private_dir(path, &meta)
}

fn check_private_dir(path: &Path, meta: &fs::Metadata) -> Result<(), SocketError> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        return Err(SocketError::Symlink(path.to_path_buf()));
    }
    if !file_type.is_dir() {
        return Err(SocketError::NotADirectory(path.to_path_buf()));
    }
    check_owner_and_mode(path, meta)
}

fn check_owner_and_mode(path: &Path, meta: &fs::Metadata) -> Result<(), SocketError> {
    if meta.uid() != euid() {
        return Err(SocketError::NotOwned {
            path: path.to_path_buf(),
            owner: meta.uid(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SocketError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Path of the socket inside the agent directory: `<dir>/agent.sock`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Binds the agent's listening socket at `path` with mode 0600.
///
/// The socket is bound, chmod'ed to 0600 and only then put into listening
/// state, so there is no moment at which anyone could connect to a more open
/// socket (connecting to a bound but not listening socket is refused); the
/// socket also lives in a 0700 directory. The umask is not touched (it is
/// process-wide and would race with other threads).
///
/// A stale socket file (connecting to it fails with `ECONNREFUSED`) is removed
/// first; a live one gives [`SocketError::AddrInUse`]; anything that is not a
/// socket gives [`SocketError::NotASocket`]. Hold [`lock_spawn`] around this
/// call so that two starting agents cannot both decide the socket is stale.
pub fn bind_private(path: &Path) -> Result<UnixListener, SocketError> {
    remove_stale_socket(path)?;

    let addr = UnixAddr::new(path).map_err(|e| io_err(path, e))?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io_err(path, e))?;
    match socket::bind(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        Err(Errno::EADDRINUSE) => return Err(SocketError::AddrInUse(path.to_path_buf())),
        Err(e) => return Err(io_err(path, e)),
    }
    // The socket file is ours from here on: remove it again on failure.
    let finish = || -> Result<(), SocketError> {
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))
            .map_err(|e| io_err(path, e))?;
        socket::listen(&fd, Backlog::MAXCONN).map_err(|e| io_err(path, e))
    };
    if let Err(e) = finish() {
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
}

/// Removes `path` if it is a socket nobody listens on.
fn remove_stale_socket(path: &Path) -> Result<(), SocketError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_path_buf()));
    }
    // Non-blocking connect: a live agent with a full backlog answers EAGAIN
    // instead of making us wait.
    let addr = UnixAddr::new(path).map_err(|e| io_err(path, e))?;
    let probe = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| io_err(path, e))?;
    match socket::connect(probe.as_raw_fd(), &addr) {
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => {
            Err(SocketError::AddrInUse(path.to_path_buf()))
        }
        Err(Errno::ECONNREFUSED) => match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(path, e)),
        },
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(io_err(path, e)),
    }
}

/// The connecting process's uid, via `SO_PEERCRED` (the credentials of the
/// peer at the time it called `connect`/`socketpair`).
pub fn peer_uid<S: AsFd>(stream: &S) -> Result<u32, SocketError> {
    socket::getsockopt(stream, sockopt::PeerCredentials)
        .map(|cred| cred.uid())
        .map_err(|e| SocketError::PeerCred(e.into()))
}

/// Fails with [`SocketError::PeerUid`] unless the peer's uid equals our
/// effective uid.
pub fn check_peer<S: AsFd>(stream: &S) -> Result<(), SocketError> {
    let got = peer_uid(stream)?;
    let expected = euid();
    if got == expected {
        Ok(())
    } else {
        Err(SocketError::PeerUid { expected, got })
    }
}

/// Sends `bytes` in one `sendmsg` with `fds` attached as `SCM_RIGHTS` (`fds`
/// may be empty). If the kernel takes only part of the bytes, the rest is
/// written without re-sending the descriptors. The descriptors arrive with
/// the first byte of `bytes`.
///
/// `bytes` must not be empty when `fds` is not (a stream socket cannot carry
/// descriptors without data); at most 253 descriptors per call. Meant for
/// blocking streams: on a non-blocking one a `WouldBlock` after a partial
/// send leaves the message half-written. Never raises `SIGPIPE`
/// (`MSG_NOSIGNAL`); a closed peer gives `BrokenPipe`.
pub fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if bytes.is_empty() {
        if fds.is_empty() {
            return Ok(());
        }
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot pass file descriptors without at least one byte of data",
        ));
    }
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot pass more than {MAX_FDS_PER_MESSAGE} file descriptors in one message"),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    let iov = [IoSlice::new(bytes)];

    let mut sent = loop {
        match socket::sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => break n,
            // Nothing was sent, descriptors included: retry as a whole.
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    while sent < bytes.len() {
        match socket::send(stream.as_raw_fd(), &bytes[sent..], MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One `recvmsg` into `buf`, returning the number of bytes read and the
/// descriptors that came with them, owned and close-on-exec
/// (`MSG_CMSG_CLOEXEC`). At most `max_fds` descriptors are accepted; any
/// extra ones are closed (by the kernel when they do not fit the control
/// buffer, by us otherwise). 0 bytes means end of file. `buf` must not be
/// empty (a 0-byte read could not be told apart from end of file).
pub fn recv_with_fds<S: AsRawFd>(
    stream: &S,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_with_fds needs a non-empty buffer",
        ));
    }
    let max_fds = max_fds.min(MAX_FDS_PER_MESSAGE);
    let space = if max_fds == 0 {
        0
    } else {
        // SAFETY: CMSG_SPACE is pure arithmetic.
        unsafe { libc::CMSG_SPACE((max_fds * mem::size_of::<RawFd>()) as u32) as usize }
    };
    // u64 elements keep the control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(mem::size_of::<u64>())];

    let (n, msg) = loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: an all-zero msghdr is valid (no name, no iov, no control).
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if space > 0 {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
        }
        // SAFETY: msg points at `buf` and `control`, both live and at least
        // as long as the lengths given.
        let r = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break (r as usize, msg);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };

    let mut fds = Vec::new();
    if space > 0 {
        // SAFETY: the kernel filled `control` and set msg_controllen; the
        // CMSG_* macros stay within it. Every descriptor in an SCM_RIGHTS
        // message was installed in our table for us alone, so we own it.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let hdr = std::ptr::read_unaligned(cmsg);
                if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    let len = (hdr.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    for i in 0..len / mem::size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    // CMSG_SPACE rounds up, so the kernel may have fitted more than asked.
    fds.truncate(max_fds);
    Ok((n, fds))
}

/// Takes an exclusive advisory lock (`flock`) on `<dir>/agent.lock`, creating
/// it with mode 0600. The lock is held while the returned `File` lives.
/// Waits up to `wait` (polling) while someone else holds it, then fails with
/// [`SocketError::LockTimeout`]; `Duration::ZERO` tries once.
///
/// The lock file must be a regular file (not a symlink) owned by us with no
/// group/other permission bits. Used so that many simultaneous first calls
/// start exactly one agent.
pub fn lock_spawn(dir: &Path, wait: Duration) -> Result<File, SocketError> {
    let path = dir.join(LOCK_NAME);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        // O_NONBLOCK: a FIFO planted here must not hang the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                SocketError::Symlink(path.clone())
            } else {
                io_err(&path, e)
            }
        })?;
    let meta = file.metadata().map_err(|e| io_err(&path, e))?;
    if !meta.file_type().is_file() {
        return Err(SocketError::NotAFile(path));
    }
    check_owner_and_mode(&path, &meta)?;

    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {}
            _ => return Err(io_err(&path, err)),
        }
        let elapsed = start.elapsed();
        if elapsed >= wait {
            return Err(SocketError::LockTimeout { path, waited: wait });
        }
        std::thread::sleep(pause.min(wait - elapsed));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    const NOBODY: u32 = 65534;

    fn is_root() -> bool {
        euid() == 0
    }

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn private_tempdir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn missing_dir_is_created_0700() {
        let tmp = private_tempdir();
        let dir = tmp.path().join("agent");
        ensure_private_dir(&dir).unwrap();
        let meta = fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, 0o700);
        assert_eq!(meta.uid(), euid());
        // A second call accepts the directory as it is.
        ensure_private_dir(&dir).unwrap();
    }

    #[test]
    fn missing_parent_is_an_io_error() {
        let tmp = private_tempdir();
        let dir = tmp.path().join("no/such/parent");
        match ensure_private_dir(&dir) {
            Err(SocketError::Io { path, source }) => {
                assert_eq!(path, dir);
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected Io error, got {other:?}"),
        }
    }

    #[test]
    fn existing_open_dir_is_refused_and_left_alone() {
        let tmp = private_tempdir();
        for mode in [0o755, 0o750, 0o701, 0o710, 0o1777] {
            let dir = tmp.path().join(format!("d{mode:o}"));
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            match ensure_private_dir(&dir) {
                Err(SocketError::TooOpen { path, mode: got }) => {
                    assert_eq!(path, dir);
                    assert_eq!(got, mode);
                }
                other => panic!("mode {mode:o}: expected TooOpen, got {other:?}"),
            }
            assert_eq!(
                mode_of(&dir),
                mode,
                "refused directory must not be fixed up"
            );
        }
    }

    #[test]
    fn dir_owned_by_another_uid_is_refused() {
        if !is_root() {
            eprintln!("note: not root, skipping the other-owner check of ensure_private_dir");
            return;
        }
        let tmp = private_tempdir();
        let dir = tmp.path().join("theirs");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        match ensure_private_dir(&dir) {
            Err(SocketError::NotOwned { path, owner }) => {
                assert_eq!(path, dir);
                assert_eq!(owner, NOBODY);
            }
            other => panic!("expected NotOwned, got {other:?}"),
        }
        let meta = fs::symlink_metadata(&dir).unwrap();
        assert_eq!(meta.uid(), NOBODY, "refused directory must not be fixed up");
    }

    #[test]
    fn symlinked_dir_is_refused() {
        let tmp = private_tempdir();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        match ensure_private_dir(&link) {
            Err(SocketError::Symlink(path)) => assert_eq!(path, link),
            other => panic!("expected Symlink, got {other:?}"),
        }
        // A dangling symlink is refused too, not created through.
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            ensure_private_dir(&dangling),
            Err(SocketError::Symlink(_))
        ));
        assert!(!tmp.path().join("nowhere").exists());
    }

    #[test]
    fn non_directory_is_refused() {
        let tmp = private_tempdir();
        let file = tmp.path().join("file");
        fs::write(&file, b"x").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        match ensure_private_dir(&file) {
            Err(SocketError::NotADirectory(path)) => assert_eq!(path, file),
            other => panic!("expected NotADirectory, got {other:?}"),
        }
    }

    #[test]
    fn agent_dir_prefers_a_usable_xdg_runtime_dir() {
        let tmp = private_tempdir();
        let xdg = tmp.path().join("run");
        fs::create_dir(&xdg).unwrap();
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
        let fallback = tmp.path().join("tmp");
        fs::create_dir(&fallback).unwrap();

        let dir = agent_dir_in(Some(xdg.clone().into()), &fallback).unwrap();
        assert_eq!(dir, xdg.join("skiff"));
        assert_eq!(mode_of(&dir), 0o700);
    }

    #[test]
    fn agent_dir_falls_back_to_tmp() {
        let tmp = private_tempdir();
        let fallback = tmp.path().join("tmp");
        fs::create_dir(&fallback).unwrap();
        let expected = fallback.join(format!("skiff-{}", euid()));

        // Unset, empty and relative values.
        assert_eq!(agent_dir_in(None, &fallback).unwrap(), expected);
        assert_eq!(agent_dir_in(Some("".into()), &fallback).unwrap(), expected);
        assert_eq!(
            agent_dir_in(Some("relative/run".into()), &fallback).unwrap(),
            expected
        );
        assert_eq!(mode_of(&expected), 0o700);

        // Missing directory.
        let missing = tmp.path().join("missing");
        assert_eq!(
            agent_dir_in(Some(missing.clone().into()), &fallback).unwrap(),
            expected
        );
        assert!(!missing.exists());

        // World-writable runtime dir.
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            agent_dir_in(Some(open.clone().into()), &fallback).unwrap(),
            expected
        );
        assert!(!open.join("skiff").exists());

        // Symlinked runtime dir.
        let good = tmp.path().join("good");
        fs::create_dir(&good).unwrap();
        fs::set_permissions(&good, fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(
            agent_dir_in(Some(link.into()), &fallback).unwrap(),
            expected
        );
        assert!(!good.join("skiff").exists());

        if is_root() {
            let theirs = tmp.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
            assert_eq!(
                agent_dir_in(Some(theirs.into()), &fallback).unwrap(),
                expected
            );
        } else {
            eprintln!("note: not root, skipping the other-owner XDG_RUNTIME_DIR check");
        }
    }

    #[test]
    fn agent_dir_refuses_a_bad_existing_agent_dir() {
        let tmp = private_tempdir();
        let fallback = tmp.path().join("tmp");
        fs::create_dir(&fallback).unwrap();
        let planted = fallback.join(format!("skiff-{}", euid()));
        fs::create_dir(&planted).unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            agent_dir_in(None, &fallback),
            Err(SocketError::TooOpen { mode: 0o777, .. })
        ));

        // A bad skiff dir inside a good XDG_RUNTIME_DIR is refused, not skipped.
        let xdg = tmp.path().join("run");
        fs::create_dir(&xdg).unwrap();
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&planted, xdg.join("skiff")).unwrap();
        assert!(matches!(
            agent_dir_in(Some(xdg.into()), &fallback),
            Err(SocketError::Symlink(_))
        ));
    }

    #[test]
    fn socket_path_is_agent_sock_in_dir() {
        assert_eq!(
            socket_path(Path::new("/run/user/1000/skiff")),
            PathBuf::from("/run/user/1000/skiff/agent.sock")
        );
    }

    #[test]
    fn bound_socket_is_0600_and_accepts() {
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        let listener = bind_private(&path).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o600);

        let mut client = UnixStream::connect(&path).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    /// A Unix stream socket bound at `path`, not listening.
    fn bound_unix_socket(path: &Path) -> OwnedFd {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::bind(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
        fd
    }

    #[test]
    fn stale_socket_is_removed_and_rebind_works() {
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        // A socket file that nobody listens on: bound, never listened on.
        // (Binding, listening and closing would race with other tests: a
        // child forked meanwhile holds the listener until it execs.)
        let fd = bound_unix_socket(&path);
        drop(fd);
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        let err = UnixStream::connect(&path).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED));

        let listener = bind_private(&path).unwrap();
        assert_eq!(mode_of(&path), 0o600);
        let _client = UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
    }

    #[test]
    fn stale_socket_of_a_dead_process_is_removed() {
        // A socket bound by another process that then exited.
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        let status = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg("import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        let listener = bind_private(&path).unwrap();
        let _client = UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
    }

    #[test]
    fn live_socket_is_addr_in_use() {
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        let listener = bind_private(&path).unwrap();
        match bind_private(&path) {
            Err(SocketError::AddrInUse(p)) => assert_eq!(p, path),
            other => panic!("expected AddrInUse, got {other:?}"),
        }
        // The live agent is untouched and still reachable.
        let _client = UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
    }

    #[test]
    fn live_socket_with_full_backlog_is_addr_in_use_without_blocking() {
        let tmp = private_tempdir();
        let path = tmp.path().join("busy.sock");
        // Listener with a tiny backlog that never accepts.
        let fd = bound_unix_socket(&path);
        socket::listen(&fd, Backlog::new(0).unwrap()).unwrap();
        let mut fillers = Vec::new();
        for _ in 0..4 {
            let s = socket::socket(
                AddressFamily::Unix,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                None,
            )
            .unwrap();
            let _ = socket::connect(s.as_raw_fd(), &UnixAddr::new(&path).unwrap());
            fillers.push(s);
        }
        let start = Instant::now();
        assert!(matches!(
            bind_private(&path),
            Err(SocketError::AddrInUse(_))
        ));
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn non_socket_at_socket_path_is_refused() {
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        fs::write(&path, b"important").unwrap();
        match bind_private(&path) {
            Err(SocketError::NotASocket(p)) => assert_eq!(p, path),
            other => panic!("expected NotASocket, got {other:?}"),
        }
        assert_eq!(fs::read(&path).unwrap(), b"important");

        let link = tmp.path().join("link.sock");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            bind_private(&link),
            Err(SocketError::NotASocket(_))
        ));
    }

    #[test]
    fn peer_uid_of_socketpair_and_connection_is_ours() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a).unwrap(), euid());
        assert_eq!(peer_uid(&b).unwrap(), euid());
        check_peer(&a).unwrap();

        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        let listener = bind_private(&path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(peer_uid(&server).unwrap(), euid());
        assert_eq!(peer_uid(&client).unwrap(), euid());
        check_peer(&server).unwrap();
    }

    #[test]
    fn peer_uid_of_a_non_socket_fails() {
        let file = tempfile::tempfile().unwrap();
        let stream = UnixStream::from(OwnedFd::from(file));
        assert!(matches!(peer_uid(&stream), Err(SocketError::PeerCred(_))));
    }

    #[test]
    fn check_peer_refuses_another_uid() {
        if !is_root() {
            eprintln!("note: not root, skipping the check_peer test with a uid {NOBODY} client");
            return;
        }
        // Test-only: a temp dir and socket that uid 65534 can reach.
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let path = socket_path(tmp.path());
        let listener = bind_private(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        listener.set_nonblocking(true).unwrap();

        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
                "/usr/bin/python3",
                "-c",
                "import os, socket, sys\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.connect(sys.argv[1])\n\
                 s.sendall(str(os.getuid()).encode() + b'\\n')\n\
                 s.recv(1)\n",
            ])
            .arg(&path)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();

        let deadline = Instant::now() + Duration::from_secs(20);
        let server = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(status) = child.try_wait().unwrap() {
                        let mut err = String::new();
                        child
                            .stderr
                            .take()
                            .unwrap()
                            .read_to_string(&mut err)
                            .unwrap();
                        panic!("client exited early ({status}): {err}");
                    }
                    assert!(Instant::now() < deadline, "client never connected");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        server.set_nonblocking(false).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut line = String::new();
        BufReader::new(&server).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), NOBODY.to_string());

        assert_eq!(peer_uid(&server).unwrap(), NOBODY);
        match check_peer(&server) {
            Err(SocketError::PeerUid { expected, got }) => {
                assert_eq!(expected, euid());
                assert_eq!(got, NOBODY);
            }
            other => panic!("expected PeerUid, got {other:?}"),
        }
        drop(server);
        let status = child.wait().unwrap();
        assert!(status.success(), "client failed: {status}");
    }

    fn fd_flags(fd: BorrowedFd<'_>) -> libc::c_int {
        // SAFETY: F_GETFD on a live descriptor.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(r >= 0);
        r
    }

    #[test]
    fn fds_pass_and_work() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut pipe_r, pipe_w) = io::pipe().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"file contents").unwrap();

        send_with_fds(&a, b"hello", &[pipe_w.as_fd(), file.as_fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf, 4).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 2);
        for fd in &fds {
            assert_ne!(fd.as_raw_fd(), pipe_w.as_raw_fd());
            assert_ne!(fd.as_raw_fd(), file.as_raw_fd());
            assert_ne!(
                fd_flags(fd.as_fd()) & libc::FD_CLOEXEC,
                0,
                "not close-on-exec"
            );
        }
        let mut fds = fds.into_iter();
        let mut got_w = File::from(fds.next().unwrap());
        let got_file = File::from(fds.next().unwrap());

        // Write through the received pipe end; read from the original.
        got_w.write_all(b"through the pipe").unwrap();
        drop(got_w);
        drop(pipe_w);
        let mut out = String::new();
        pipe_r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "through the pipe");

        // The received file descriptor is the same open file.
        let mut contents = vec![0u8; 13];
        got_file.read_exact_at(&mut contents, 0).unwrap();
        assert_eq!(contents, b"file contents");
        got_file.write_all_at(b"FILE", 0).unwrap();
        file.seek(SeekFrom::Start(0)).unwrap();
        let mut all = String::new();
        file.read_to_string(&mut all).unwrap();
        assert_eq!(all, "FILE contents");
    }

    #[test]
    fn fds_pass_to_another_process() {
        // The child receives a pipe's write end and writes through it.
        let tmp = private_tempdir();
        let path = socket_path(tmp.path());
        let listener = bind_private(&path).unwrap();
        let mut child = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(
                "import os, socket, sys\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.connect(sys.argv[1])\n\
                 msg, fds, flags, addr = socket.recv_fds(s, 100, 4)\n\
                 os.write(fds[0], b'child got ' + msg)\n\
                 s.sendall(b'done')\n",
            )
            .arg(&path)
            .spawn()
            .unwrap();
        let (server, _) = listener.accept().unwrap();
        check_peer(&server).unwrap();
        let (mut pipe_r, pipe_w) = io::pipe().unwrap();
        send_with_fds(&server, b"fd", &[pipe_w.as_fd()]).unwrap();
        drop(pipe_w);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&server, &mut buf, 1).unwrap();
        assert_eq!(&buf[..n], b"done");
        assert!(fds.is_empty());
        assert!(child.wait().unwrap().success());
        let mut out = String::new();
        pipe_r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "child got fd");
    }

    /// Reads from `r` without blocking forever: true when it is at EOF.
    fn at_eof(r: &mut io::PipeReader) -> bool {
        let mut pfd = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 100) };
        if n <= 0 {
            return false;
        }
        let mut b = [0u8; 1];
        r.read(&mut b).unwrap() == 0
    }

    #[test]
    fn max_fds_is_honoured_and_extras_closed() {
        for max in [0usize, 1, 2] {
            let (a, b) = UnixStream::pair().unwrap();
            let mut pipes: Vec<_> = (0..4).map(|_| io::pipe().unwrap()).collect();
            let writers: Vec<BorrowedFd<'_>> = pipes.iter().map(|(_, w)| w.as_fd()).collect();
            send_with_fds(&a, b"x", &writers).unwrap();
            drop(writers);
            let mut buf = [0u8; 8];
            let (n, fds) = recv_with_fds(&b, &mut buf, max).unwrap();
            assert_eq!(n, 1);
            assert_eq!(fds.len(), max, "max_fds {max}");

            // Drop our own writers: only the received copies keep pipes open.
            let mut readers: Vec<_> = pipes.drain(..).map(|(r, _w)| r).collect();
            for (i, r) in readers.iter_mut().enumerate() {
                if i < max {
                    assert!(!at_eof(r), "pipe {i} should still have a writer");
                } else {
                    assert!(at_eof(r), "pipe {i}: extra fd was not closed (max {max})");
                }
            }
            for (i, fd) in fds.into_iter().enumerate() {
                let mut w = File::from(fd);
                w.write_all(&[b'0' + i as u8]).unwrap();
                drop(w);
                let mut out = Vec::new();
                readers[i].read_to_end(&mut out).unwrap();
                assert_eq!(out, [b'0' + i as u8]);
            }
        }
    }

    #[test]
    fn no_fds_and_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, b"plain", &[]).unwrap();
        send_with_fds(&a, b"", &[]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf, 8).unwrap();
        assert_eq!(&buf[..n], b"plain");
        assert!(fds.is_empty());
        drop(a);
        let (n, fds) = recv_with_fds(&b, &mut buf, 8).unwrap();
        assert_eq!(n, 0);
        assert!(fds.is_empty());
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let err = send_with_fds(&a, b"", &[file.as_fd()]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = recv_with_fds(&b, &mut [], 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let many: Vec<BorrowedFd<'_>> = (0..254).map(|_| file.as_fd()).collect();
        let err = send_with_fds(&a, b"x", &many).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn send_to_closed_peer_is_broken_pipe_not_sigpipe() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let err = send_with_fds(&a, b"x", &[]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn large_message_with_fd_arrives_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut fds = Vec::new();
            let mut buf = vec![0u8; 65536];
            loop {
                let (n, mut f) = recv_with_fds(&b, &mut buf, 2).unwrap();
                if n == 0 {
                    break;
                }
                if !f.is_empty() {
                    assert!(got.is_empty(), "fd must come with the first bytes");
                }
                fds.append(&mut f);
                got.extend_from_slice(&buf[..n]);
            }
            (got, fds)
        });
        let (_r, w) = io::pipe().unwrap();
        send_with_fds(&a, &data, &[w.as_fd()]).unwrap();
        drop(a);
        let (got, fds) = reader.join().unwrap();
        assert_eq!(fds.len(), 1, "fd sent exactly once");
        assert!(got == expected, "data corrupted");
    }

    #[test]
    fn lock_is_exclusive_and_times_out() {
        let tmp = private_tempdir();
        let first = lock_spawn(tmp.path(), Duration::from_secs(1)).unwrap();
        let lock_path = tmp.path().join(LOCK_NAME);
        let meta = fs::symlink_metadata(&lock_path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);

        let start = Instant::now();
        match lock_spawn(tmp.path(), Duration::from_millis(300)) {
            Err(SocketError::LockTimeout { path, waited }) => {
                assert_eq!(path, lock_path);
                assert_eq!(waited, Duration::from_millis(300));
            }
            other => panic!("expected LockTimeout, got {other:?}"),
        }
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert!(matches!(
            lock_spawn(tmp.path(), Duration::ZERO),
            Err(SocketError::LockTimeout { .. })
        ));

        // Another process sees the lock too.
        let status = Command::new("flock")
            .args(["-n", "-E", "7"])
            .arg(&lock_path)
            .arg("true")
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(7));

        drop(first);
        let _second = lock_spawn(tmp.path(), Duration::ZERO).unwrap();
    }

    #[test]
    fn lock_waits_for_another_process() {
        let tmp = private_tempdir();
        let lock_path = tmp.path().join(LOCK_NAME);
        // Let lock_spawn create the file with the right mode first.
        drop(lock_spawn(tmp.path(), Duration::ZERO).unwrap());
        let mut child = Command::new("flock")
            .arg(&lock_path)
            .args(["-c", "echo locked; sleep 0.5"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "locked\n");
        let start = Instant::now();
        let _lock = lock_spawn(tmp.path(), Duration::from_secs(20)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn ten_simultaneous_callers_spawn_once() {
        let tmp = private_tempdir();
        let dir = Arc::new(tmp.path().to_path_buf());
        let spawned = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(10));
        let threads: Vec<_> = (0..10)
            .map(|_| {
                let (dir, spawned, barrier) = (dir.clone(), spawned.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let _lock = lock_spawn(&dir, Duration::from_secs(20)).unwrap();
                    // "Start the agent" unless someone already did.
                    let sock = socket_path(&dir);
                    if UnixStream::connect(&sock).is_err() {
                        let listener = bind_private(&sock).unwrap();
                        spawned.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        return Some(listener);
                    }
                    None
                })
            })
            .collect();
        let listeners: Vec<_> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(spawned.load(Ordering::SeqCst), 1);
        assert_eq!(listeners.len(), 1);
    }

    #[test]
    fn bad_lock_files_are_refused() {
        let tmp = private_tempdir();
        let lock_path = tmp.path().join(LOCK_NAME);

        let target = tmp.path().join("target");
        fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, &lock_path).unwrap();
        assert!(matches!(
            lock_spawn(tmp.path(), Duration::ZERO),
            Err(SocketError::Symlink(_))
        ));
        fs::remove_file(&lock_path).unwrap();

        fs::write(&lock_path, b"").unwrap();
        fs::set_permissions(&lock_path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            lock_spawn(tmp.path(), Duration::ZERO),
            Err(SocketError::TooOpen { mode: 0o644, .. })
        ));
        fs::remove_file(&lock_path).unwrap();

        fs::create_dir(&lock_path).unwrap();
        assert!(lock_spawn(tmp.path(), Duration::ZERO).is_err());
        fs::remove_dir(&lock_path).unwrap();

        nix::unistd::mkfifo(&lock_path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            lock_spawn(tmp.path(), Duration::ZERO),
            Err(SocketError::NotAFile(_))
        ));
        fs::remove_file(&lock_path).unwrap();

        if is_root() {
            fs::write(&lock_path, b"").unwrap();
            fs::set_permissions(&lock_path, fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&lock_path, Some(NOBODY), Some(NOBODY)).unwrap();
            assert!(matches!(
                lock_spawn(tmp.path(), Duration::ZERO),
                Err(SocketError::NotOwned { owner: NOBODY, .. })
            ));
        } else {
            eprintln!("note: not root, skipping the other-owner lock file check");
        }
    }

    #[test]
    fn errors_name_the_path() {
        let e = SocketError::TooOpen {
            path: "/tmp/skiff-1000".into(),
            mode: 0o755,
        };
        let msg = e.to_string();
        assert!(msg.contains("/tmp/skiff-1000") && msg.contains("0755") && msg.contains("chmod"));
        let e = SocketError::NotOwned {
            path: "/tmp/skiff-1000".into(),
            owner: 0,
        };
        assert!(e.to_string().contains("/tmp/skiff-1000"));
        let e = SocketError::PeerUid {
            expected: 1000,
            got: 65534,
        };
        assert!(e.to_string().contains("65534"));
    }
}
