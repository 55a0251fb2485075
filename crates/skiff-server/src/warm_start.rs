//! What keeps a connection process's start off its connection's path,
//! beyond what the zygote did before forking it (`crate::rehearsal`): it
//! starts at a low priority ([`StartingQuietly`]) so as not to slow the
//! connections being served meanwhile, raised at once when a connection
//! waits for it ([`hurry`]).
//!
//! The code a connection runs is mapped in while the process waits by
//! `crate::hot_code`.

/// The niceness a connection process starts at: it gets the CPU only when
/// nothing of normal priority (a connection being served, its commands)
/// wants it, without being starved outright as under `SCHED_IDLE`.
const STARTING_NICENESS: libc::c_int = 19;

/// A connection process's start (its runtime, the program's code mapped in,
/// its share of the configuration) at the lowest priority, so that it does
/// not slow the connection another process is serving meanwhile: every
/// connection handed over starts the next process, at once or shortly
/// after (`crate::worker_pool`). Measured on two
/// CPUs (docs/BENCHMARKS.md), a cold exec was about 0.8 ms faster. When a
/// connection has to wait for a process, the listener raises the ones
/// starting ([`hurry`]), so a busy host does not keep it waiting.
///
/// Only a root skiffd does this: lowering a niceness back takes
/// `CAP_SYS_NICE`, and a process must not serve its connection niced.
pub struct StartingQuietly {
    niced: bool,
}

impl StartingQuietly {
    /// Lowers this thread's priority (threads started from it inherit it).
    pub fn begin() -> StartingQuietly {
        if !nix::unistd::geteuid().is_root() {
            return StartingQuietly { niced: false };
        }
        // SAFETY: setpriority only changes the scheduling weight of this
        // thread (PRIO_PROCESS with 0 is the calling thread on Linux).
        let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, STARTING_NICENESS) } == 0;
        StartingQuietly { niced }
    }

    /// The process is ready to serve: every thread back to niceness 0.
    pub fn done(self) {
        if !self.niced {
            return;
        }
        if let Err(e) = normal_priority("self") {
            tracing::warn!(
                "connection process {}: cannot restore its priority: {e}",
                std::process::id()
            );
        }
    }
}

/// Raises a starting connection process (`pid`, one of this skiffd's) to
/// normal priority: a connection waits for it, so it is no longer starting
/// in the background. Best effort: a process that is gone, or a skiffd that
/// did not lower it, changes nothing.
pub fn hurry(pid: i32) {
    if let Err(e) = normal_priority(&pid.to_string()) {
        tracing::debug!("connection process {pid}: cannot raise its priority: {e}");
    }
}

/// Every thread of the process `/proc/<proc>` at niceness 0.
fn normal_priority(proc: &str) -> std::io::Result<()> {
    for task in std::fs::read_dir(format!("/proc/{proc}/task"))? {
        let Ok(tid) = task?.file_name().to_string_lossy().parse::<libc::id_t>() else {
            continue;
        };
        // SAFETY: setpriority only changes the scheduling weight of one
        // thread of a skiffd process.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
