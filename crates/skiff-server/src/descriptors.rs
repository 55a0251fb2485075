//! Descriptor headroom, the I/O side: raising the soft open-file limit
//! (`RLIMIT_NOFILE`) to the hard one when skiffd starts, giving the
//! processes skiffd starts the limit it was started with, counting the
//! descriptors open in the process, and the tracker the accept loops ask
//! before they take a connection. What is decided from those numbers is
//! `crate::fd_budget`'s.

use std::io;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::fd_budget::{Gauge, Headroom, LogEvery};

/// The open-file limits before and after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit skiffd was started with.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    pub hard: u64,
}

/// The limit skiffd was started with, for the processes it starts (set
/// once, when the limit is raised).
static STARTED_WITH: OnceLock<libc::rlimit> = OnceLock::new();

fn get_limit() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

fn set_limit(lim: &libc::rlimit) -> io::Result<()> {
    // SAFETY: setrlimit reads one rlimit from a struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's soft open-file limit to its hard limit (or, when
/// the kernel will not take that, to `fs.nr_open`), and remembers the
/// limit it had for [`child_open_file_limit`].
pub fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let start = get_limit()?;
    let _ = STARTED_WITH.set(start);
    let mut result = OpenFileLimit {
        before: start.rlim_cur,
        now: start.rlim_cur,
        hard: start.rlim_max,
    };
    if start.rlim_cur >= start.rlim_max {
        return Ok(result);
    }
    let wanted = libc::rlimit {
        rlim_cur: start.rlim_max,
        rlim_max: start.rlim_max,
    };
    if let Err(e) = set_limit(&wanted) {
        // An unlimited hard limit is more than a process may open.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
            .filter(|n| *n > start.rlim_cur && *n < start.rlim_max)
            .ok_or(e)?;
        set_limit(&libc::rlimit {
            rlim_cur: nr_open,
            rlim_max: start.rlim_max,
        })?;
    }
    result.now = get_limit()?.rlim_cur;
    Ok(result)
}

/// The open-file limit a process skiffd starts gets: the one skiffd was
/// started with (as under sshd), not the raised one, which would make
/// programs that walk every possible descriptor slow. `None` when skiffd
/// did not change its own.
pub fn child_open_file_limit() -> Option<libc::rlimit> {
    let started = STARTED_WITH.get()?;
    let now = get_limit().ok()?;
    (now.rlim_cur != started.rlim_cur).then_some(libc::rlimit {
        rlim_cur: started.rlim_cur.min(now.rlim_max),
        rlim_max: now.rlim_max,
    })
}

/// How many descriptors this process has open: the entries of
/// `/proc/self/fd`, less the one that lists them. Out of descriptors, the
/// listing cannot be opened; that is an error of kind
/// [`io::ErrorKind::Other`] with `EMFILE`/`ENFILE` as its OS code.
pub fn open_descriptors() -> io::Result<u64> {
    let mut n: u64 = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        entry?;
        n += 1;
    }
    Ok(n.saturating_sub(1))
}

/// The current soft open-file limit.
pub fn open_file_limit() -> io::Result<u64> {
    Ok(get_limit()?.rlim_cur)
}

/// Why a connection was turned away at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    /// Descriptors open (or, between counts, an estimate that errs high).
    pub open: u64,
    pub headroom: Headroom,
    /// When a log line is due: the refusals since the last one.
    pub log_due: Option<u64>,
}

/// The accept loops' view of the descriptors, shared by every listener.
#[derive(Debug)]
pub struct Descriptors {
    headroom: Headroom,
    state: Mutex<(Gauge, LogEvery)>,
}

impl Descriptors {
    /// For a process whose soft open-file limit is `limit`.
    pub fn new(limit: u64) -> Descriptors {
        Descriptors {
            headroom: Headroom::for_limit(limit),
            state: Mutex::default(),
        }
    }

    pub fn headroom(&self) -> Headroom {
        self.headroom
    }

    /// Whether the connection just accepted as descriptor `fd` may be
    /// taken on; counts the open descriptors when the last count is stale
    /// or the limit is near.
    pub fn admit(&self, fd: std::os::fd::RawFd) -> Result<(), Short> {
        let now = Instant::now();
        let fd = u64::try_from(fd).unwrap_or(0);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (gauge, log) = &mut *state;
        let mut open = gauge.estimate(fd);
        if gauge.must_count(&self.headroom, open, now) {
            open = match open_descriptors() {
                Ok(n) => n.max(fd.saturating_add(1)),
                // No descriptor left even to look: as full as it gets.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    self.headroom.limit
                }
                // No /proc (skiffd in a jail of its own): the lower bound
                // the descriptor's number gives is all there is.
                Err(_) => fd.saturating_add(1),
            };
            gauge.counted(open, now);
        }
        if self.headroom.admits(open) {
            gauge.took();
            return Ok(());
        }
        Err(Short {
            open,
            headroom: self.headroom,
            log_due: log.event(now),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn counting_sees_the_descriptors_held() {
        let held: Vec<_> = (0..200)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        // Other tests' threads open and close files too; ours are there.
        assert!(open_descriptors().unwrap() >= 200);
        assert!(open_file_limit().unwrap() >= 203);
        drop(held);
    }

    #[test]
    fn a_full_process_is_refused_and_the_refusal_logged_once() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_raw_fd();
        // A limit the open descriptors already fill.
        let d = Descriptors::new(u64::try_from(fd).unwrap() + 2);
        let first = d.admit(fd).unwrap_err();
        assert_eq!(first.log_due, Some(1));
        let second = d.admit(fd).unwrap_err();
        assert_eq!(second.log_due, None);
        // Plenty of room.
        let roomy = Descriptors::new(1 << 20);
        assert!(roomy.admit(fd).is_ok());
    }
}
