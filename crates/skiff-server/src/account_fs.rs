//! Unix-socket work done with an account's rights from inside the server:
//! connecting to a socket (`direct-streamlocal`), making a listening one
//! (`streamlocal-forward`) and removing it again.
//!
//! A root server must not connect or bind with its own rights on a user's
//! behalf: root reaches every socket and may create files anywhere. Each
//! operation therefore runs on a fresh thread with a umask of its own
//! ([`skiff_files::with_private_umask`]) that first takes the account's
//! filesystem identity: its supplementary groups, fsgid and fsuid (raw
//! system calls, which Linux applies to the calling thread alone; the
//! kernel also drops the file-permission capabilities once fsuid is not 0).
//! The server's other threads keep their credentials, and the thread ends
//! with its one operation, so nothing has to be restored.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};

use crate::spawn::Credentials;

/// Whose rights a socket operation uses, and where relative paths start
/// (the account's home directory, as for a login).
#[derive(Debug, Clone)]
pub struct Identity {
    /// `None`: the server's own (it already runs as the account).
    creds: Option<Credentials>,
    home: PathBuf,
}

impl Identity {
    pub fn of(account: &crate::account::Account) -> Identity {
        Identity {
            creds: account.credentials(),
            home: account.home.clone(),
        }
    }
}

/// How many connections a forwarded socket queues before accepting them.
const BACKLOG: i32 = 128;

/// A socket file the server made: which file it was, so that it is removed
/// only while the path still names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadeSocket {
    dev: u64,
    ino: u64,
}

/// Runs `work` on a new thread with `who`'s filesystem identity, in its
/// home directory, with `umask`, and returns its result.
async fn run_as<T, F>(who: Identity, umask: u32, work: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        skiff_files::with_private_umask(umask, move || {
            become_account(&who)?;
            work()
        })
    })
    .await
    .unwrap_or_else(|_| Err(io::Error::other("the account's thread ended early")))
}

/// Gives the calling thread (which has a filesystem context of its own)
/// the account's identity and working directory: its home, else `/`.
fn become_account(who: &Identity) -> io::Result<()> {
    if let Some(c) = &who.creds {
        take_credentials(c)?;
    }
    if std::env::set_current_dir(&who.home).is_err() {
        std::env::set_current_dir("/")?;
    }
    Ok(())
}

/// Gives the calling thread (only) the account's filesystem credentials.
pub(crate) fn take_credentials(c: &Credentials) -> io::Result<()> {
    // SAFETY: raw system calls (not glibc's process-wide wrappers) change
    // this thread's credentials alone; `groups` outlives the call.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, c.groups.len(), c.groups.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, c.gid);
        libc::syscall(libc::SYS_setfsuid, c.uid);
        // setfsuid and setfsgid report nothing; an invalid id asks for the
        // current one without changing it.
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        if fsuid != c.uid || fsgid != c.gid {
            return Err(io::Error::other(format!(
                "cannot take the account's identity (uid {}, gid {})",
                c.uid, c.gid
            )));
        }
    }
    Ok(())
}

fn unix_addr(path: &Path) -> io::Result<UnixAddr> {
    UnixAddr::new(path).map_err(|e| match e {
        nix::errno::Errno::ENAMETOOLONG => io::Error::other("the socket path is too long"),
        e => io::Error::from(e),
    })
}

fn unix_socket() -> io::Result<OwnedFd> {
    Ok(socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?)
}

/// Connects to the Unix socket at `path` as the account.
pub async fn connect(who: Identity, path: PathBuf) -> io::Result<tokio::net::UnixStream> {
    let fd = run_as(who, 0o077, move || {
        let fd = unix_socket()?;
        match socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &unix_addr(&path)?) {
            Ok(()) => Ok(fd),
            // A Unix socket connects at once or not at all.
            Err(nix::errno::Errno::EAGAIN) => Err(io::Error::other(
                "the socket's queue of connections is full",
            )),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// Makes a listening Unix socket at `path` as the account, its mode 0777
/// less `mask`. An existing file is an error, unless `unlink` is set and it
/// is a socket, which is then replaced.
pub async fn listen(
    who: Identity,
    path: PathBuf,
    mask: u32,
    unlink: bool,
) -> io::Result<(tokio::net::UnixListener, MadeSocket)> {
    let (fd, made) = run_as(who, mask & 0o777, move || {
        if unlink {
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                if meta.file_type().is_socket() {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        let fd = unix_socket()?;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        socket::bind(raw, &unix_addr(&path)?)?;
        let meta = std::fs::symlink_metadata(&path)?;
        let made = MadeSocket {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if let Err(e) = socket::listen(&fd, Backlog::new(BACKLOG).expect("a valid backlog")) {
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }
        Ok((fd, made))
    })
    .await?;
    let listener = tokio::net::UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))?;
    Ok((listener, made))
}

/// Removals started by [`remove_in_background`] and not finished yet, and
/// the signal that one has finished: a connection's process waits for
/// them before it exits ([`finish_removals`]), or a socket dropped with
/// the connection would outlive it.
static REMOVING: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// Counts one removal in [`REMOVING`] while it lives.
struct Removing;

impl Removing {
    fn start() -> Removing {
        *REMOVING.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Removing
    }
}

impl Drop for Removing {
    fn drop(&mut self) {
        let mut left = REMOVING.0.lock().unwrap_or_else(|p| p.into_inner());
        *left = left.saturating_sub(1);
        REMOVING.1.notify_all();
    }
}

/// Whether a removal [`remove_in_background`] started is still running.
pub fn removals_pending() -> bool {
    *REMOVING.0.lock().unwrap_or_else(|p| p.into_inner()) > 0
}

/// Waits, at most `limit`, for the removals [`remove_in_background`]
/// started to finish: the connection's process calls it when the
/// connection has ended, before it exits.
pub fn finish_removals(limit: std::time::Duration) {
    let left = REMOVING.0.lock().unwrap_or_else(|p| p.into_inner());
    let (left, waited) = REMOVING
        .1
        .wait_timeout_while(left, limit, |left| *left > 0)
        .unwrap_or_else(|p| p.into_inner());
    if waited.timed_out() {
        tracing::warn!("{} forwarded socket(s) not removed within {limit:?}", *left);
    }
}

/// Removes the socket file at `path` as the account, if it is still the
/// one `made` describes. Runs in the background (see [`finish_removals`]);
/// failures only log.
pub fn remove_in_background(who: Identity, path: PathBuf, made: MadeSocket) {
    let work = move || -> io::Result<()> {
        become_account(&who)?;
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_socket() && meta.dev() == made.dev && meta.ino() == made.ino {
            std::fs::remove_file(&path)?;
        }
        Ok(())
    };
    // A plain thread: this runs from Drop, perhaps outside the runtime.
    let removing = Removing::start();
    let spawned = std::thread::Builder::new()
        .name("skiffd-remove-socket".into())
        .spawn(move || {
            let _removing = removing;
            if let Err(e) = skiff_files::with_private_umask(0o077, work) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::debug!("cannot remove a forwarded socket: {e}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a thread to remove a forwarded socket: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The server's own identity, with `home` for relative paths.
    fn me(home: &Path) -> Identity {
        Identity {
            creds: None,
            home: home.to_path_buf(),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn listens_with_the_mask_connects_and_removes_only_its_own_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        runtime().block_on(async {
            let (listener, _) = listen(me(dir.path()), path.clone(), 0o177, false)
                .await
                .unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            // The server's own umask is untouched by the thread's.
            // SAFETY: umask(2) takes a mode and cannot fail; the second
            // call puts back what the first read.
            let mine = unsafe { libc::umask(0o022) };
            // SAFETY: as above.
            unsafe { libc::umask(mine) };
            assert_ne!(mine, 0o177);

            let client = connect(me(dir.path()), path.clone()).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            drop((client, accepted));

            // An existing file is not replaced without `unlink`.
            let e = listen(me(dir.path()), path.clone(), 0o177, false)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
            drop(listener);
            let (_again, made_again) = listen(me(dir.path()), path.clone(), 0o177, true)
                .await
                .unwrap();
            // Once the removals are waited for (as a connection's process
            // does before it exits), the socket is gone.
            remove_in_background(me(dir.path()), path.clone(), made_again);
            finish_removals(std::time::Duration::from_secs(30));
            assert!(!path.exists(), "not removed");
            // Something else at the path now: it stays.
            std::fs::write(&path, b"someone else's").unwrap();
            remove_in_background(me(dir.path()), path.clone(), made_again);
            finish_removals(std::time::Duration::from_secs(30));
            assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        });
    }

    #[test]
    fn unlink_replaces_only_sockets_and_long_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep").unwrap();
        runtime().block_on(async {
            let e = listen(me(dir.path()), file.clone(), 0o177, true)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
            assert_eq!(std::fs::read(&file).unwrap(), b"keep");

            let long = dir.path().join("x".repeat(120));
            let e = listen(me(dir.path()), long.clone(), 0o177, false)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("too long"), "{e}");
            let e = connect(me(dir.path()), long).await.unwrap_err();
            assert!(e.to_string().contains("too long"), "{e}");
            let e = connect(me(dir.path()), dir.path().join("absent"))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

            // A relative path starts at the home directory.
            let (_l, _) = listen(me(dir.path()), "rel.sock".into(), 0o177, false)
                .await
                .unwrap();
            assert!(dir.path().join("rel.sock").exists());
            connect(me(dir.path()), "rel.sock".into()).await.unwrap();
        });
    }

    #[test]
    fn connects_with_the_account_rights_not_the_server_rights() {
        if !nix::unistd::geteuid().is_root() {
            return; // only root can take another identity
        }
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        let creds = Credentials {
            uid: nobody.uid.as_raw(),
            gid: nobody.gid.as_raw(),
            groups: vec![nobody.gid.as_raw()],
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("root-only.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        runtime().block_on(async {
            let nobody = Identity {
                creds: Some(creds),
                home: "/".into(),
            };
            let e = connect(nobody.clone(), path.clone()).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            // The server thread itself still has root's rights.
            connect(me(dir.path()), path.clone()).await.unwrap();
            // And cannot make files where the account may not.
            let e = listen(nobody, dir.path().join("new.sock"), 0o177, false)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        });
    }
}
