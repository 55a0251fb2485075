//! Fan-out: one command on many hosts from one process and one tokio
//! runtime. At most `parallel` hosts are in progress at once, new
//! connections can be paced to `connect_rate` per second, and every host's
//! output, notices and result come back as [`RunEvent`]s on one channel, so
//! the caller decides how to print them. A failing host never stops the
//! others. Without a pool each host gets a connection of its own, closed
//! when its command ends; with one (the agent's), connections stay warm.
//! Either way a host whose server closes the connection before
//! authentication (too many at once: `MaxStartups`) is tried again a few
//! times, as [`crate::busy`] says.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, Mutex, Semaphore};
use tokio_util::sync::PollSender;

use crate::busy::retry_pre_auth_drops;
use crate::connect::connect;
use crate::error::{ErrorKind, SkiffError};
use crate::exec::{exec, ExecRequest, ExitOutcome};
use crate::pool::Pool;
use crate::settings::ConnectSettings;

/// One host to run on: the label it is reported under and its settings
/// (or why they could not be resolved).
pub struct Target {
    pub label: String,
    pub settings: Result<ConnectSettings, SkiffError>,
}

/// How to run the fan-out.
#[derive(Debug, Clone)]
pub struct FanoutOptions {
    /// Hosts in progress at once (at least 1).
    pub parallel: usize,
    /// New connections per second, if limited.
    pub connect_rate: Option<f64>,
    /// The command (its `timeout` applies per host).
    pub request: ExecRequest,
    /// Runtimes the hosts are dealt to in turn, each host's connection
    /// staying on one; empty: the caller's runtime.
    pub spread: Vec<tokio::runtime::Handle>,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What happened on one host; `host` is the target's index.
#[derive(Debug)]
pub enum RunEvent {
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
        result: Result<ExitOutcome, SkiffError>,
        duration: Duration,
    },
}

/// Runs the request on every target, sending events to `events`. Returns
/// when every target has its `Done` event. If the receiver goes away the
/// remaining hosts are still finished (their output is dropped); to stop
/// them, drop this future (each running command's channel is then closed).
pub async fn fan_out(
    targets: Vec<Target>,
    opts: FanoutOptions,
    pool: Option<Arc<Pool>>,
    events: mpsc::Sender<RunEvent>,
) {
    let permits = Arc::new(Semaphore::new(opts.parallel.max(1)));
    let pacer = opts.connect_rate.filter(|r| *r > 0.0).map(|rate| {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Arc::new(Mutex::new(tick))
    });
    let request = Arc::new(opts.request);
    let mut running = tokio::task::JoinSet::new();
    for (host, target) in targets.into_iter().enumerate() {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let events = events.clone();
        let pacer = pacer.clone();
        let request = request.clone();
        let pool = pool.clone();
        let task = async move {
            let _permit = permit;
            let start = Instant::now();
            let result = match pool {
                Some(pool) => {
                    run_pooled(host, target, &request, &pool, pacer.as_deref(), &events).await
                }
                None => run_one(host, target, &request, pacer.as_deref(), &events).await,
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

async fn run_one(
    host: usize,
    target: Target,
    request: &ExecRequest,
    pacer: Option<&Mutex<tokio::time::Interval>>,
    events: &mpsc::Sender<RunEvent>,
) -> Result<ExitOutcome, SkiffError> {
    let settings = target.settings?;
    let mut conn = retry_pre_auth_drops(&settings, |settings| async move {
        if let Some(pacer) = pacer {
            pacer.lock().await.tick().await;
        }
        connect(&settings).await
    })
    .await?;
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
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        conn.handle
            .disconnect(russh::Disconnect::ByApplication, "", "en"),
    )
    .await;
    result
}

/// Runs on a pooled connection (opened if needed, left open afterwards).
/// Notices about a connection opened for it arrive on its stderr. The pool
/// fails with [`ErrorKind::Busy`] only when it could not connect, before
/// any channel opened, so trying again never runs the command twice.
async fn run_pooled(
    host: usize,
    target: Target,
    request: &ExecRequest,
    pool: &Pool,
    pacer: Option<&Mutex<tokio::time::Interval>>,
    events: &mpsc::Sender<RunEvent>,
) -> Result<ExitOutcome, SkiffError> {
    let settings = target.settings?;
    retry_pre_auth_drops(&settings, |settings| async move {
        if let Some(pacer) = pacer {
            if pool.connection_count(&settings) == 0 {
                pacer.lock().await.tick().await;
            }
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
    })
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
