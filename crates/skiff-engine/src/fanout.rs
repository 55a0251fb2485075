//! Fan-out: the same work on many hosts from one process. At most
//! `parallel` hosts are in progress at once, new connections can be paced
//! to `connect_rate` per second, hosts can be dealt over several runtimes,
//! and every host's notices, output and end come back as [`RunEvent`]s on
//! one channel, so the caller decides how to print them. A failing host
//! never stops the others. A host whose server closes the connection
//! before authentication (too many at once: `MaxStartups`) has its work
//! tried again a few times, as [`crate::busy`] says.
//!
//! What is done on each host is a [`HostWork`]: running a command
//! ([`run_command`], for `skiff run` and the agent's runs), or copying to
//! or from it (`skiff cp` with a node set). A command runs on a connection
//! of its own, closed when it ends, or with a pool (the agent's) on a warm
//! one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use skiff_proto::nodeset;
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, Mutex, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::PollSender;

use crate::busy::retry_pre_auth_drops;
use crate::connect::connect;
use crate::error::{ErrorKind, SkiffError};
use crate::exec::{exec, ExecRequest, ExitOutcome};
use crate::pool::Pool;
use crate::settings::{ConnectSettings, Destination, Resolver};

/// One host to work on: the label it is reported under and its settings
/// (or why they could not be resolved).
pub struct Target {
    pub label: String,
    pub settings: Result<ConnectSettings, SkiffError>,
}

/// Where `host`, one host of a node set, is reached: its own `user@` and
/// `:port` win over `base`'s, which gives everything else.
pub fn host_destination(host: &nodeset::Target, base: &Destination) -> Destination {
    Destination {
        host: host.host.clone(),
        user: host.user.clone().or_else(|| base.user.clone()),
        port: host.port.or(base.port),
        ..base.clone()
    }
}

/// A target for each of `hosts` (see [`host_destination`]), with settings
/// from `resolver`, which was made with `base`'s configuration file and
/// options: the files are read once for all of them, and a host whose
/// settings fail is reported as failed.
pub fn targets(hosts: &[nodeset::Target], base: &Destination, resolver: &Resolver) -> Vec<Target> {
    hosts
        .iter()
        .map(|h| Target {
            label: h.to_string(),
            settings: resolver.resolve(&host_destination(h, base)),
        })
        .collect()
}

/// How to schedule the hosts of a fan-out.
#[derive(Debug, Clone)]
pub struct FanoutOptions {
    /// Hosts in progress at once (at least 1).
    pub parallel: usize,
    /// New connections per second, if limited.
    pub connect_rate: Option<f64>,
    /// Runtimes the hosts are dealt to in turn, each host's work staying on
    /// one; empty: the caller's runtime.
    pub spread: Vec<tokio::runtime::Handle>,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What happened on one host; `host` is the target's index. A host's work
/// succeeds with a `T`: a command's [`ExitOutcome`], a copy's report.
#[derive(Debug)]
pub enum RunEvent<T = ExitOutcome> {
    Output {
        host: usize,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Something the person should see, e.g. a newly recorded host key.
    Notice { host: usize, text: String },
    /// The host is finished: exactly one per target, always last for it.
    Done {
        host: usize,
        result: Result<T, SkiffError>,
        duration: Duration,
    },
}

/// What a fan-out does on each host.
pub trait HostWork: Send + Sync + 'static {
    /// What the work comes to on a host where it succeeds.
    type Output: Send + 'static;

    /// Does the work on host number `host`, connecting with `settings`;
    /// each new connection it opens first waits for `pace`. It may send
    /// `Output` and `Notice` events (the fan-out sends `Done`). When it
    /// fails with [`ErrorKind::Busy`] it is called again, with what is left
    /// of the host's `ConnectTimeout`: it must fail that way only before
    /// anything has run on the server.
    fn run(
        &self,
        host: usize,
        settings: ConnectSettings,
        pace: &Pace,
        events: &mpsc::Sender<RunEvent<Self::Output>>,
    ) -> impl Future<Output = Result<Self::Output, SkiffError>> + Send;
}

/// The pace of a fan-out's new connections (its `connect_rate`).
pub struct Pace(Option<Mutex<tokio::time::Interval>>);

impl Pace {
    fn new(rate: Option<f64>) -> Pace {
        Pace(rate.filter(|r| *r > 0.0).map(|rate| {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            Mutex::new(tick)
        }))
    }

    /// Waits until a new connection may be opened.
    pub async fn new_connection(&self) {
        if let Some(tick) = &self.0 {
            tick.lock().await.tick().await;
        }
    }
}

/// Does `work` on every target, sending events to `events`, until every
/// target has its `Done` event (`None`) or `stop` finishes first
/// (`Some` of its output): the work of every host still in progress is
/// then stopped, dropped before this returns, and those hosts get no
/// `Done`. If the receiver goes away the remaining hosts are still
/// finished (their events are dropped). Dropping this future stops every
/// host's work too, though not before it returns.
pub async fn fan_out<W: HostWork, S>(
    targets: Vec<Target>,
    opts: FanoutOptions,
    work: Arc<W>,
    events: mpsc::Sender<RunEvent<W::Output>>,
    stop: impl Future<Output = S>,
) -> Option<S> {
    let mut running = JoinSet::new();
    let stopped = tokio::select! {
        () = start_all(targets, opts, work, events, &mut running) => None,
        s = stop => Some(s),
    };
    if stopped.is_some() {
        running.shutdown().await;
    }
    stopped
}

/// Starts each target's work as a permit frees up, and waits for all.
async fn start_all<W: HostWork>(
    targets: Vec<Target>,
    opts: FanoutOptions,
    work: Arc<W>,
    events: mpsc::Sender<RunEvent<W::Output>>,
    running: &mut JoinSet<()>,
) {
    let permits = Arc::new(Semaphore::new(opts.parallel.max(1)));
    let pace = Arc::new(Pace::new(opts.connect_rate));
    for (host, target) in targets.into_iter().enumerate() {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let events = events.clone();
        let pace = pace.clone();
        let work = work.clone();
        let task = async move {
            let _permit = permit;
            let start = Instant::now();
            let result = match target.settings {
                Ok(settings) => {
                    retry_pre_auth_drops(&settings, |settings| {
                        work.run(host, settings, &pace, &events)
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            let _ = events
                .send(RunEvent::Done {
                    host,
                    result,
                    duration: start.elapsed(),
                })
                .await;
        };
        match opts.spread.get(host % opts.spread.len().max(1)) {
            Some(runtime) => running.spawn_on(task, runtime),
            None => running.spawn(task),
        };
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// Runs the request on every target, on connections from `pool` (the
/// agent's) or, without one, on a connection of its own for each host;
/// see [`fan_out`] and [`RunCommand`].
pub async fn run_command(
    targets: Vec<Target>,
    opts: FanoutOptions,
    request: ExecRequest,
    pool: Option<Arc<Pool>>,
    events: mpsc::Sender<RunEvent>,
) {
    let work = Arc::new(RunCommand { request, pool });
    fan_out(targets, opts, work, events, std::future::pending::<()>()).await;
}

/// One command on each host (its `timeout` applies per host). Without a
/// pool each host gets a connection of its own, closed when its command
/// ends; with one (the agent's) connections stay warm.
pub struct RunCommand {
    pub request: ExecRequest,
    pub pool: Option<Arc<Pool>>,
}

impl HostWork for RunCommand {
    type Output = ExitOutcome;

    async fn run(
        &self,
        host: usize,
        settings: ConnectSettings,
        pace: &Pace,
        events: &mpsc::Sender<RunEvent>,
    ) -> Result<ExitOutcome, SkiffError> {
        match &self.pool {
            Some(pool) => run_pooled(host, settings, &self.request, pool, pace, events).await,
            None => run_one(host, settings, &self.request, pace, events).await,
        }
    }
}

async fn run_one(
    host: usize,
    settings: ConnectSettings,
    request: &ExecRequest,
    pace: &Pace,
    events: &mpsc::Sender<RunEvent>,
) -> Result<ExitOutcome, SkiffError> {
    pace.new_connection().await;
    let mut conn = connect(&settings).await?;
    for text in conn.notices.drain(..) {
        let _ = events.send(RunEvent::Notice { host, text }).await;
    }
    let stdout = EventWriter::new(host, Stream::Stdout, events);
    let stderr = EventWriter::new(host, Stream::Stderr, events);
    let result = exec(
        &conn,
        request,
        None::<tokio::io::Empty>,
        stdout,
        stderr,
        None,
    )
    .await;
    // Done with this host: say goodbye rather than just dropping the socket.
    conn.goodbye().await;
    result
}

/// Runs on a pooled connection (opened if needed, left open afterwards).
/// Notices about a connection opened for it arrive on its stderr. The pool
/// fails with [`ErrorKind::Busy`] only when it could not connect, before
/// any channel opened, so trying again never runs the command twice.
async fn run_pooled(
    host: usize,
    settings: ConnectSettings,
    request: &ExecRequest,
    pool: &Pool,
    pace: &Pace,
    events: &mpsc::Sender<RunEvent>,
) -> Result<ExitOutcome, SkiffError> {
    if pool.connection_count(&settings) == 0 {
        pace.new_connection().await;
    }
    let stdout = EventWriter::new(host, Stream::Stdout, events);
    let stderr = EventWriter::new(host, Stream::Stderr, events);
    pool.exec(
        &settings,
        request,
        None::<tokio::io::Empty>,
        stdout,
        stderr,
        None,
    )
    .await
}

/// An output stream of one host, turned into [`RunEvent::Output`] events.
/// Waits when the channel is full, so a slow printer slows the hosts down
/// instead of buffering without bound. A closed receiver swallows output.
struct EventWriter {
    host: usize,
    stream: Stream,
    tx: PollSender<RunEvent>,
}

impl EventWriter {
    fn new(host: usize, stream: Stream, events: &mpsc::Sender<RunEvent>) -> Self {
        EventWriter {
            host,
            stream,
            tx: PollSender::new(events.clone()),
        }
    }
}

impl AsyncWrite for EventWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        match self.tx.poll_reserve(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(Ok(buf.len())),
            Poll::Ready(Ok(())) => {}
        }
        let event = RunEvent::Output {
            host: self.host,
            stream: self.stream,
            data: buf.to_vec(),
        };
        let _ = self.tx.send_item(event);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The exit code of a whole fan-out, from each host's result: 0 when all
/// succeeded; 255 when any host was unreachable or refused us (connection,
/// host key, authentication, configuration or protocol failures); otherwise
/// the highest remote exit code, with a timed-out host counting as 124 (as
/// `timeout(1)` reports).
pub fn overall_exit_code<'a>(
    results: impl IntoIterator<Item = &'a Result<ExitOutcome, SkiffError>>,
) -> i32 {
    let mut code = 0;
    for r in results {
        let c = match r {
            Ok(outcome) => outcome.exit_code(),
            Err(e) if e.kind == ErrorKind::Timeout => 124,
            Err(_) => return 255,
        };
        code = code.max(c);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: ErrorKind) -> Result<ExitOutcome, SkiffError> {
        Err(SkiffError::new(kind, "x"))
    }

    #[test]
    fn overall_exit_code_rules() {
        let ok = Ok(ExitOutcome::Status(0));
        let one = Ok(ExitOutcome::Status(1));
        let seven = Ok(ExitOutcome::Status(7));
        assert_eq!(overall_exit_code([&ok, &ok]), 0);
        assert_eq!(overall_exit_code([&ok, &one, &seven]), 7);
        assert_eq!(overall_exit_code([&one, &err(ErrorKind::Timeout)]), 124);
        assert_eq!(overall_exit_code([&seven, &err(ErrorKind::Connect)]), 255);
        assert_eq!(overall_exit_code([&ok, &err(ErrorKind::Auth)]), 255);
        assert_eq!(overall_exit_code(std::iter::empty()), 0);
    }
}
