//! Standard input, output and error made blocking for the length of the run.
//!
//! Programs that run an ssh client often hand it non-blocking descriptors
//! (rsync does, by default, for any remote shell but rsh). skiff's readers
//! and writers expect blocking ones, and a write that returns EAGAIN would
//! otherwise end the session. The flags are put back as they were on exit,
//! since a descriptor's flags are shared with every process holding it.

/// The original flags of the descriptors that were non-blocking.
pub struct BlockingStdio {
    changed: Vec<(libc::c_int, libc::c_int)>,
}

impl BlockingStdio {
    /// Clears `O_NONBLOCK` on descriptors 0, 1 and 2 where it is set.
    pub fn enter() -> BlockingStdio {
        let mut changed = Vec::new();
        for fd in 0..=2 {
            // SAFETY: fcntl on a descriptor number; a closed one fails with EBADF.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                // SAFETY: as above; only the O_NONBLOCK bit changes.
                if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } == 0 {
                    changed.push((fd, flags));
                }
            }
        }
        BlockingStdio { changed }
    }

    /// Puts the changed descriptors' flags back.
    pub fn restore(&self) {
        for &(fd, flags) in &self.changed {
            // SAFETY: restores flags read from this descriptor in `enter`.
            unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        }
    }
}
