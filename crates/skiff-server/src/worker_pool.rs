//! The listener's connection processes: a zygote (`crate::zygote`, skiffd
//! started again with `--zygote`, holding the configuration) forks them, a
//! few wait ready at all times ([`IDLE_TARGET`]), and each accepted
//! connection goes to one ([`WorkerPool::take`], [`Worker::serve`]). A
//! connection thus never waits for a process to start, and is served in a
//! process of its own. The process replacing the one taken starts a moment
//! later ([`REFILL_AFTER`]) while others are ready, so that its start does
//! not run during the key exchange of the connection that took it.
//!
//! Each handed-over connection is watched until its process ends: its place
//! among the unauthenticated (`MaxStartups`) is given back when the process
//! says the client authenticated, or when it ends; what the process
//! reports of the unauthenticated part decides a `PerSourcePenalties`
//! penalty (a process that ends unannounced before authentication counts as
//! a crash).
//!
//! [`WorkerPool::reload`] (`SIGHUP`) starts a zygote with the configuration
//! as it now reads: if it loads, the processes waiting with the old one are
//! retired and new connections get the new configuration; if not, the
//! error is logged and everything stays as it was. Connections already
//! handed over keep the configuration they started with.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_proto::worker_wire::{FromWorker, FromZygote, ToWorker, ToZygote, MAX_MESSAGE};
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, Notify};

use crate::penalties::{Offence, Penalties};
use crate::seqpacket::{pair, recv, send};
use crate::startups::Pending;

/// Connection processes kept ready.
pub const IDLE_TARGET: usize = 4;

/// How long after a connection takes a ready process the one replacing it
/// is started, while at least [`SPARE_FOR_LATER`] others are still ready.
/// Started at once, the zygote's fork and the new process's start ran
/// during that connection's key exchange, on the same CPUs: measured on two
/// CPUs with cold execs 40 ms apart, a cold exec was 0.58 ms faster with
/// the start put off (docs/BENCHMARKS.md). Back-to-back execs gain nothing
/// (every moment has a connection) and lose nothing.
const REFILL_AFTER: Duration = Duration::from_millis(25);

/// Ready processes left that let a refill wait [`REFILL_AFTER`]; with
/// fewer, a burst of connections could find none, so it starts at once.
const SPARE_FOR_LATER: usize = 2;

/// When to start the processes that bring the pool back to
/// [`IDLE_TARGET`], once a connection took one and `left` are ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refill {
    Now,
    After(Duration),
}

fn refill_when(left: usize) -> Refill {
    if left >= SPARE_FOR_LATER {
        Refill::After(REFILL_AFTER)
    } else {
        Refill::Now
    }
}

/// How long a new zygote or connection process may take to say it is ready.
const START_WITHIN: Duration = Duration::from_secs(30);

/// The penalty table all listeners share.
pub type SharedPenalties = Arc<Mutex<Penalties>>;

pub fn lock(p: &SharedPenalties) -> std::sync::MutexGuard<'_, Penalties> {
    p.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How to start a zygote: this executable, with the listener's own
/// arguments (the configuration is read the same way) and `--zygote`.
#[derive(Debug, Clone)]
pub struct Launch {
    pub exe: PathBuf,
    pub args: Vec<OsString>,
}

impl Launch {
    /// The running skiffd, started again.
    pub fn this_process() -> Launch {
        Launch {
            // The running binary even after an upgrade replaced the file:
            // a listener and its zygotes always speak the same protocol.
            exe: PathBuf::from("/proc/self/exe"),
            args: std::env::args_os().collect(),
        }
    }
}

/// Why the pool could not get a zygote.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error("cannot start skiffd's zygote: {0}")]
    Start(std::io::Error),
    #[error("{0}")]
    Refused(String),
    #[error("skiffd's zygote ended before it was ready (see its log lines above)")]
    Ended,
    #[error("skiffd's zygote did not get ready within {}s", START_WITHIN.as_secs())]
    Slow,
    #[error("skiffd's zygote: {0}")]
    Protocol(String),
}

/// A running zygote.
struct Zygote {
    control: AsyncFd<OwnedFd>,
    /// One request at a time: answers come in order.
    requests: tokio::sync::Mutex<()>,
    generation: u64,
    _process: crate::spawn::ChildProcess,
}

impl Zygote {
    async fn start(launch: &Launch, generation: u64) -> Result<Zygote, ZygoteError> {
        let (ours, theirs) = pair().map_err(ZygoteError::Start)?;
        // The zygote's end blocks: it has no runtime.
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )
        .map_err(|e| ZygoteError::Start(e.into()))?;
        let mut args: Vec<&std::ffi::OsStr> = launch.args.iter().map(|a| a.as_os_str()).collect();
        args.push(std::ffi::OsStr::new("--zygote"));
        // The listener's environment, but what the service manager meant
        // for the listener alone.
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "NOTIFY_SOCKET" | "LISTEN_PID" | "LISTEN_FDS" | "LISTEN_FDNAMES"
                )
            })
            .collect();
        let null = std::fs::OpenOptions::new()
            .read(true)
            .open("/dev/null")
            .map_err(ZygoteError::Start)?;
        let process = crate::spawn::spawn(crate::spawn::Plan {
            program: &launch.exe,
            args,
            env: env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            cwd: std::path::Path::new("/"),
            root: None,
            stdio: [null.as_raw_fd(), 1, 2],
            extra: Some(theirs.as_raw_fd()),
            controlling_tty: false,
            credentials: None,
        })
        .map_err(ZygoteError::Start)?;
        drop(theirs);
        // SAFETY: the AsyncFd owns our end of the pair from here.
        let control =
            unsafe { AsyncFd::register(ours) }.map_err(|e| ZygoteError::Start(e.into()))?;
        let first = tokio::time::timeout(START_WITHIN, recv(&control, MAX_MESSAGE))
            .await
            .map_err(|_| ZygoteError::Slow)?;
        match first {
            Ok(Some((bytes, _))) => match FromZygote::decode(&bytes) {
                Ok(FromZygote::Ready) => {}
                Ok(FromZygote::Failed(why)) => return Err(ZygoteError::Refused(why)),
                Ok(other) => return Err(ZygoteError::Protocol(format!("{other:?} first"))),
                Err(e) => return Err(ZygoteError::Protocol(e.to_string())),
            },
            Ok(None) => return Err(ZygoteError::Ended),
            Err(e) => return Err(ZygoteError::Protocol(e.to_string())),
        }
        Ok(Zygote {
            control,
            requests: tokio::sync::Mutex::new(()),
            generation,
            _process: process,
        })
    }

    /// Forks a connection process that serves `socket`; its pid.
    async fn spawn(&self, socket: &OwnedFd) -> Result<i32, String> {
        let _turn = self.requests.lock().await;
        send(
            &self.control,
            &ToZygote::Spawn.encode(),
            &[socket.as_raw_fd()],
        )
        .await
        .map_err(|e| e.to_string())?;
        match recv(&self.control, MAX_MESSAGE).await {
            Ok(Some((bytes, _))) => match FromZygote::decode(&bytes) {
                Ok(FromZygote::Spawned { pid }) => Ok(pid),
                Ok(FromZygote::NotSpawned(why)) => Err(why),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e.to_string()),
            },
            Ok(None) => Err("the zygote ended".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A ready connection process.
pub struct Worker {
    pid: i32,
    generation: u64,
    control: Arc<AsyncFd<OwnedFd>>,
    alive: Arc<AtomicBool>,
    assign: oneshot::Sender<Assignment>,
}

/// What the listener keeps of a handed-over connection.
pub struct Assignment {
    pub pending: Pending,
    pub peer: SocketAddr,
    pub penalties: Option<SharedPenalties>,
}

impl Worker {
    /// Hands the process `stream` and what the listener keeps of it. The
    /// stream is returned when the process is gone, for another one.
    /// `ident_sent`: the bytes of the identification line already
    /// written on it.
    pub fn serve(
        self,
        stream: OwnedFd,
        peer: SocketAddr,
        local: SocketAddr,
        ident_sent: u32,
        assignment: Assignment,
    ) -> Result<(), (OwnedFd, Assignment)> {
        let msg = ToWorker::Serve {
            peer,
            local,
            ident_sent,
        }
        .encode();
        // Its socket was idle, so the message fits: never waits.
        if let Err(e) =
            crate::seqpacket::send_blocking(self.control.get_ref(), &msg, &[stream.as_raw_fd()])
        {
            tracing::debug!(%peer, "connection process {} is gone: {e}", self.pid);
            return Err((stream, assignment));
        }
        if let Err(assignment) = self.assign.send(assignment) {
            // It ended right after taking the connection: nothing to watch.
            tracing::info!(%peer, "connection process {} ended at once", self.pid);
            drop(assignment);
        }
        Ok(())
    }
}

struct PoolState {
    zygote: Option<Arc<Zygote>>,
    generation: u64,
    idle: VecDeque<Worker>,
    starting: usize,
    /// Forked processes not ready yet: they start at a low priority
    /// ([`crate::warm_start::StartingQuietly`]), raised when a connection
    /// waits for one.
    launching: Vec<i32>,
    /// Connections waiting for a process.
    waiting: usize,
    /// Processes that failed to start in a row: starting more waits
    /// ([`retry_delay`]) rather than spinning.
    failures: u32,
    paused: bool,
    /// A refill is on its way ([`WorkerPool::refill`]).
    refill_due: bool,
}

/// How long to wait before starting processes again after `failures`
/// failed in a row: from 100 ms, doubling, at most 5 s.
fn retry_delay(failures: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << failures.min(6))).min(Duration::from_secs(5))
}

/// The listener's connection processes.
pub struct WorkerPool {
    launch: Launch,
    state: Mutex<PoolState>,
    ready: Notify,
}

impl WorkerPool {
    /// Starts the zygote and the first ready processes.
    pub async fn start(launch: Launch) -> Result<Arc<WorkerPool>, ZygoteError> {
        let zygote = Zygote::start(&launch, 1).await?;
        let pool = Arc::new(WorkerPool {
            launch,
            state: Mutex::new(PoolState {
                zygote: Some(Arc::new(zygote)),
                generation: 1,
                idle: VecDeque::new(),
                starting: 0,
                launching: Vec::new(),
                waiting: 0,
                failures: 0,
                paused: false,
                refill_due: false,
            }),
            ready: Notify::new(),
        });
        pool.fill();
        Ok(pool)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts processes until [`IDLE_TARGET`] are ready or starting.
    fn fill(self: &Arc<Self>) {
        let mut st = self.lock();
        let Some(zygote) = st.zygote.clone() else {
            return;
        };
        while !st.paused && st.idle.len() + st.starting < IDLE_TARGET {
            st.starting += 1;
            let (pool, zygote) = (self.clone(), zygote.clone());
            tokio::spawn(async move {
                let started = start_worker(&pool, &zygote).await;
                let mut st = pool.lock();
                st.starting -= 1;
                match started {
                    Ok(worker) if worker.generation == st.generation => {
                        st.failures = 0;
                        st.idle.push_back(worker);
                        drop(st);
                        pool.ready.notify_one();
                    }
                    // Started for a configuration replaced meanwhile: retired.
                    Ok(_) => {}
                    Err(e) => {
                        st.failures = st.failures.saturating_add(1);
                        let delay = retry_delay(st.failures);
                        tracing::error!(
                            "cannot start a connection process: {e} (trying again in {} ms)",
                            delay.as_millis()
                        );
                        pool.fill_after(&mut st, delay, |s| &mut s.paused);
                        // The zygote is unusable: start another (once).
                        let zygote_failed = matches!(e, StartError::Zygote(_));
                        if zygote_failed
                            && st.zygote.as_ref().is_some_and(|z| Arc::ptr_eq(z, &zygote))
                        {
                            st.zygote = None;
                            drop(st);
                            let pool = pool.clone();
                            tokio::spawn(async move { pool.restart_zygote().await });
                        }
                    }
                }
            });
        }
    }

    /// Brings the pool back to [`IDLE_TARGET`] after a connection took a
    /// process: now, or shortly after ([`refill_when`]).
    fn refill(self: &Arc<Self>) {
        let mut st = self.lock();
        match refill_when(st.idle.len()) {
            Refill::Now => {
                drop(st);
                self.fill();
            }
            Refill::After(delay) => self.fill_after(&mut st, delay, |s| &mut s.refill_due),
        }
    }

    /// Fills the pool `delay` from now, unless a fill for the same reason
    /// is already on its way: `due` picks the state's flag that says so
    /// (set here, cleared just before that fill).
    fn fill_after(
        self: &Arc<Self>,
        st: &mut PoolState,
        delay: Duration,
        due: fn(&mut PoolState) -> &mut bool,
    ) {
        if std::mem::replace(due(st), true) {
            return;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            *due(&mut pool.lock()) = false;
            pool.fill();
        });
    }

    /// After a zygote failed: a new one with the configuration as it reads
    /// now, retried every few seconds until one starts.
    async fn restart_zygote(self: Arc<Self>) {
        loop {
            let generation = self.lock().generation + 1;
            match Zygote::start(&self.launch, generation).await {
                Ok(z) => {
                    self.install(z);
                    return;
                }
                Err(e) => {
                    tracing::error!("{e}; retrying in 5s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    }

    /// Makes `zygote` the one new processes come from, retiring those
    /// waiting (their sockets close, and they exit).
    fn install(self: &Arc<Self>, zygote: Zygote) {
        let mut st = self.lock();
        st.failures = 0;
        st.generation = zygote.generation;
        st.zygote = Some(Arc::new(zygote));
        let retired = std::mem::take(&mut st.idle);
        drop(st);
        drop(retired);
        self.fill();
    }

    /// Reads the configuration again (`SIGHUP`): on success new connections
    /// get it; on failure nothing changes. Either way it is logged.
    pub async fn reload(self: &Arc<Self>) -> Result<(), ZygoteError> {
        let generation = self.lock().generation + 1;
        let zygote = Zygote::start(&self.launch, generation).await?;
        self.install(zygote);
        Ok(())
    }

    /// A ready process for a new connection, waiting for one to start when
    /// none is (`within` at most).
    pub async fn take(self: &Arc<Self>, within: Duration) -> Option<Worker> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.ready.notified();
            let found = {
                let mut st = self.lock();
                let mut found = None;
                while let Some(w) = st.idle.pop_front() {
                    if w.alive.load(Ordering::Acquire) && w.generation == st.generation {
                        found = Some(w);
                        break;
                    }
                }
                found
            };
            if found.is_some() {
                self.refill();
                return found;
            }
            self.fill();
            // A connection waits: the processes starting get the CPU now.
            let waiting = Waiting::begin(self);
            for &pid in &waiting.launching {
                crate::warm_start::hurry(pid);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// Why a connection process could not be started.
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// The zygote failed to fork it (or is gone): another zygote is needed.
    #[error("the zygote: {0}")]
    Zygote(String),
    /// It was forked but did not get ready.
    #[error("{0}")]
    Process(String),
}

/// Asks `zygote` for a process and waits until it says it is ready.
async fn start_worker(pool: &WorkerPool, zygote: &Zygote) -> Result<Worker, StartError> {
    let (ours, theirs) = pair().map_err(|e| StartError::Process(format!("socketpair: {e}")))?;
    let pid = zygote.spawn(&theirs).await.map_err(StartError::Zygote)?;
    // The process has its own: ours closed, its end is seen when it ends.
    drop(theirs);
    let launching = Launching::begin(pool, pid);
    if launching.hurry {
        crate::warm_start::hurry(pid);
    }
    let started = start_watching(pid, zygote.generation, ours).await;
    drop(launching);
    started.map_err(StartError::Process)
}

/// A connection waiting in [`WorkerPool::take`], counted while it waits
/// (whatever ends the wait, the future dropped included).
struct Waiting<'a> {
    pool: &'a WorkerPool,
    /// The processes starting when it began to wait.
    launching: Vec<i32>,
}

impl<'a> Waiting<'a> {
    fn begin(pool: &'a WorkerPool) -> Waiting<'a> {
        let mut st = pool.lock();
        st.waiting += 1;
        let launching = st.launching.clone();
        Waiting { pool, launching }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pool.lock().waiting -= 1;
    }
}

/// A forked process not ready yet, listed while it starts (whatever ends
/// the start), so that a waiting connection can raise it.
struct Launching<'a> {
    pool: &'a WorkerPool,
    pid: i32,
    /// A connection was already waiting when it was forked.
    hurry: bool,
}

impl<'a> Launching<'a> {
    fn begin(pool: &'a WorkerPool, pid: i32) -> Launching<'a> {
        let mut st = pool.lock();
        st.launching.push(pid);
        let hurry = st.waiting > 0;
        Launching { pool, pid, hurry }
    }
}

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        let pid = self.pid;
        self.pool.lock().launching.retain(|&p| p != pid);
    }
}

/// Waits until the process `pid` says on `ours` that it is ready.
async fn start_watching(pid: i32, generation: u64, ours: OwnedFd) -> Result<Worker, String> {
    // SAFETY: the AsyncFd owns our end of the pair from here.
    let control = unsafe { AsyncFd::register(ours) }.map_err(|e| e.to_string())?;
    let ready = tokio::time::timeout(START_WITHIN, recv(&control, MAX_MESSAGE))
        .await
        .map_err(|_| format!("process {pid} not ready within {}s", START_WITHIN.as_secs()))?;
    match ready {
        Ok(Some((bytes, _))) if FromWorker::decode(&bytes) == Ok(FromWorker::Ready) => {}
        Ok(Some(_)) => return Err(format!("process {pid}: a message out of turn")),
        Ok(None) => return Err(format!("process {pid} ended before it was ready")),
        Err(e) => return Err(format!("process {pid}: {e}")),
    }
    let control = Arc::new(control);
    let alive = Arc::new(AtomicBool::new(true));
    let (assign, assigned) = oneshot::channel();
    tokio::spawn(watch(pid, control.clone(), alive.clone(), assigned));
    Ok(Worker {
        pid,
        generation,
        control,
        alive,
        assign,
    })
}

/// Watches a connection process: while it waits, for its end; once it has
/// a connection, for what it says of it, until it ends.
async fn watch(
    pid: i32,
    control: Arc<AsyncFd<OwnedFd>>,
    alive: Arc<AtomicBool>,
    assigned: oneshot::Receiver<Assignment>,
) {
    // A message while waiting can only be the connection's first, read
    // before the assignment (sent right after the connection) arrived.
    let mut assigned = assigned;
    let waited = tokio::select! {
        biased;
        a = &mut assigned => Ok(a.ok()),
        m = recv(&control, MAX_MESSAGE) => Err(m),
    };
    let (assignment, early) = match waited {
        Ok(a) => (a, None),
        Err(Ok(Some((bytes, _)))) => (assigned.await.ok(), Some(bytes)),
        Err(_) => (None, None),
    };
    let Some(Assignment {
        mut pending,
        peer,
        penalties,
    }) = assignment
    else {
        // Retired, or gone while it waited.
        alive.store(false, Ordering::Release);
        return;
    };
    let mut authenticated = false;
    let mut verdict = None;
    let mut next = early;
    loop {
        let bytes = match next.take() {
            Some(b) => b,
            None => match recv(&control, MAX_MESSAGE).await {
                Ok(Some((b, _))) => b,
                Ok(None) | Err(_) => break,
            },
        };
        match FromWorker::decode(&bytes) {
            Ok(FromWorker::Authenticated) => {
                authenticated = true;
                pending.release();
            }
            Ok(FromWorker::Ended(v)) => verdict = Some(v),
            Ok(FromWorker::Ready) | Err(_) => {
                tracing::warn!(%peer, "connection process {pid}: a message out of turn");
            }
        }
    }
    drop(pending);
    let offence = match verdict {
        Some(v) => Offence::of(v),
        None if authenticated => {
            tracing::info!(%peer, "connection process {pid} ended without a report (killed?)");
            None
        }
        None => {
            tracing::warn!(%peer, "connection process {pid} ended before authentication without a report (crashed or killed)");
            Some(Offence::Crash)
        }
    };
    if let (Some(offence), Some(p)) = (offence, penalties) {
        lock(&p).penalise(peer.ip(), offence, std::time::Instant::now());
        tracing::debug!(%peer, "penalty recorded: {offence:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_waits_only_while_spares_are_ready() {
        assert_eq!(refill_when(IDLE_TARGET - 1), Refill::After(REFILL_AFTER));
        assert_eq!(refill_when(SPARE_FOR_LATER), Refill::After(REFILL_AFTER));
        assert_eq!(refill_when(SPARE_FOR_LATER - 1), Refill::Now);
        assert_eq!(refill_when(0), Refill::Now);
    }
}
