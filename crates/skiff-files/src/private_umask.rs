//! Creating files with a umask of one's own in a multi-threaded process.
//! umask(2) belongs to the whole process, so setting it around a `bind` or
//! `open` races with every other thread that creates files. Instead the
//! work runs on a fresh thread that first leaves the shared filesystem
//! context (`unshare(CLONE_FS)`), so its umask is its alone, and that
//! thread ends with the work.

use std::io;

/// Runs `work` on a new thread whose umask is `umask` (and whose other
/// filesystem state, such as the working directory, is private too), and
/// waits for its result. Blocks the caller: async code calls it from
/// `spawn_blocking`, or directly for work as short as a `bind`.
pub fn with_private_umask<T, F>(umask: u32, work: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    std::thread::Builder::new()
        .name("skiff-private-umask".into())
        .spawn(move || {
            // SAFETY: plain system calls that affect the calling thread
            // only once unshare(CLONE_FS) has given it its own fs context.
            unsafe {
                if libc::unshare(libc::CLONE_FS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::umask((umask & 0o777) as libc::mode_t);
            }
            work()
        })?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the file-creating thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_umask_applies_to_the_work_and_not_to_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = {
            let path = path.clone();
            with_private_umask(0o177, move || std::os::unix::net::UnixListener::bind(path)).unwrap()
        };
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(listener);

        let file = dir.path().join("f");
        with_private_umask(0o027, {
            let file = file.clone();
            move || std::fs::write(file, b"x")
        })
        .unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);

        // The process's own umask is what it was.
        let ours = crate::umask();
        // SAFETY: reads and restores the umask at once.
        let now = unsafe {
            let old = libc::umask(0o022);
            libc::umask(old);
            old as u32
        };
        assert_eq!(now, ours);
        let e = with_private_umask(0o077, || -> io::Result<()> { Err(io::Error::other("no")) })
            .unwrap_err();
        assert_eq!(e.to_string(), "no");
    }
}
