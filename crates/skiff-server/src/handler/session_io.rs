//! A started session's life (OpenSSH's serverloop.c): bytes between the
//! channel and the command's pipes or terminal, signals and hang-ups
//! delivered by the task that owns (and reaps) the process, a skiff
//! client's flow control (pausing output, reporting input read, see
//! `skiff_proto::flow`), and the exit status or signal reported before the
//! channel closes, with the session's `AuditLog` record (its bytes each
//! way counted here). On the connection's side: counting what arrives against
//! the queues (`received`), holding off reading while they are full, the
//! window each channel is topped up to, and forgetting a closed channel.
//!
//! Not here: deciding what to start (`session`), the queue accounting
//! itself ([`crate::queue_budget`]) and the pumps that move channel bytes
//! with it counted (`crate::channel_io`).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use russh::server::{Msg, Session};
use russh::{Channel, ChannelId};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::ConnectionHandler;
use crate::process::{self, ChildIo};

/// What the connection asks of a running session's process.
pub(super) enum Control {
    Signal(i32),
    /// Stop (`true`) or resume reading the command's output, as a skiff
    /// client asks while its local reader is behind.
    PauseOutput(bool),
    /// Report to the client how much input the command has read
    /// ([`skiff_proto::flow::INPUT_ACKS`]).
    InputAcks,
}

impl ConnectionHandler {
    /// Counts a packet of `len` bytes that arrived on `channel` in the
    /// connection's queue, then holds off reading the next one while the
    /// queue is (nearly) full (see [`crate::queue_budget`]). A packet that
    /// breaks the protocol, or a client that went away meanwhile, ends the
    /// connection.
    pub(super) async fn received(
        &mut self,
        channel: ChannelId,
        len: usize,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        use crate::queue_budget::Reading;
        if let Some(chan) = self.channels.get(&channel) {
            chan.bytes_in
                .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let window = u32::try_from(session.sender_window_size(channel)).unwrap_or(u32::MAX);
        let initial = session.config().window_size;
        match self.queue.receive(channel.into(), len, window, initial) {
            Ok(Reading::Go) => Ok(()),
            Ok(reading) => {
                if reading == Reading::Stop {
                    tracing::debug!(peer = %self.peer, held = self.queue.held(),
                        "queue full: not reading the connection until its commands read their input");
                }
                let socket = &self.socket;
                let gone = || {
                    crate::peer_hangup::hung_up(socket.as_ref().and_then(|s| s.try_clone().ok()))
                };
                if self.queue.hold_off(gone).await {
                    Ok(())
                } else {
                    tracing::info!(peer = %self.peer,
                        "the client went away while its connection waited for its commands to read their input");
                    Err(russh::Error::HUP)
                }
            }
            Err(violation) => {
                tracing::warn!(peer = %self.peer, "closing the connection: {violation}");
                Err(russh::Error::Inconsistent)
            }
        }
    }

    /// The window the next top-up grants: what the path wants, shrunk to
    /// the room left in the connection's and the server's queues.
    pub(super) fn next_window(&mut self, channel: ChannelId) -> u32 {
        let socket = self.socket.as_ref();
        self.desired_window = skiff_dataplane::tcp::next_window(
            &mut self.windows,
            socket,
            self.session_rtt,
            channel.into(),
            self.desired_window,
        );
        self.queue.window_target(self.desired_window)
    }

    /// Forgets a closed channel: its session, its window and its count
    /// in the connection's queue.
    pub(super) fn channel_closed(&mut self, channel: ChannelId) {
        // Dropping the session's control sender hangs up a command that still runs.
        self.channels.remove(&channel);
        self.windows.closed(channel.into());
        self.queue.closed(channel.into());
    }
}

/// Moves bytes between the channel and the process until both ends are done,
/// then reports the exit status (or signal) and closes the channel.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_session_io(
    channel: Channel<Msg>,
    spawned: process::Spawned,
    handle: russh::server::Handle,
    mut control: tokio::sync::mpsc::UnboundedReceiver<Control>,
    queue: Arc<crate::queue_budget::ChannelQueue>,
    clock: Arc<crate::channel_idle::ChannelClock>,
    audit: Option<SessionAudit>,
    login: Option<crate::login_writer::LoggedIn>,
) {
    use crate::channel_io::{forward_output, spawn_input};
    let bytes_out = Arc::new(AtomicU64::new(0));
    let id = channel.id();
    let (reader, writer) = channel.split();
    let mut child = spawned.child;
    let terminal = match &spawned.io {
        ChildIo::Pty(master) => Some(master.clone()),
        ChildIo::Pipes { .. } => None,
    };
    let pty = terminal.is_some();
    let (pause, paused) = tokio::sync::watch::channel(false);
    let (consumed, consumed_rx) = tokio::sync::watch::channel(0u64);
    let consumed = Arc::new(consumed);
    let mut flow = SessionFlow {
        pause,
        reports: Some((handle.clone(), id, consumed_rx)),
        reporter: None,
    };
    let (input_clock, output_clock) = (clock.clone(), clock.clone());
    let (input, output): (
        _,
        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) = match spawned.io {
        ChildIo::Pipes {
            stdin,
            mut stdout,
            mut stderr,
        } => {
            let reports = Some(consumed.clone());
            let input = spawn_input(
                reader,
                queue.clone(),
                reports,
                input_clock,
                move |mut rx| async move {
                    let mut stdin = stdin;
                    // Dropping the pipe is what delivers EOF to the command.
                    while let Some((data, permit)) = rx.recv().await {
                        if stdin.write_all(&data).await.is_err() {
                            break;
                        }
                        drop(permit);
                    }
                },
            );
            let mut out_writer = Counted::new(writer.make_writer(), &bytes_out);
            let mut err_writer = Counted::new(writer.make_writer_ext(Some(1)), &bytes_out);
            let output = async move {
                tokio::join!(
                    forward_output(
                        &mut stdout,
                        &mut out_writer,
                        Some(paused.clone()),
                        &queue,
                        &output_clock
                    ),
                    forward_output(
                        &mut stderr,
                        &mut err_writer,
                        Some(paused),
                        &queue,
                        &output_clock
                    ),
                );
            };
            (input, Box::pin(output))
        }
        ChildIo::Pty(mut master) => {
            let input_master = master.clone();
            let reports = Some(consumed.clone());
            let input = spawn_input(
                reader,
                queue.clone(),
                reports,
                input_clock,
                move |mut rx| async move {
                    while let Some((data, permit)) = rx.recv().await {
                        if input_master.write_all(&data).await.is_err() {
                            break;
                        }
                        drop(permit);
                    }
                },
            );
            let mut out_writer = Counted::new(writer.make_writer(), &bytes_out);
            let output = async move {
                forward_output(
                    &mut master,
                    &mut out_writer,
                    Some(paused),
                    &queue,
                    &output_clock,
                )
                .await;
            };
            (input, Box::pin(output))
        }
    };
    let drain = pty.then(|| PtyDrain::new(bytes_out.clone()));
    let status = supervise(&mut child, output, &mut control, &mut flow, drain, &clock).await;
    // The session is over: its logout is recorded, and its terminal goes
    // back to whoever had it, as with sshd, before the client hears the
    // exit status.
    drop(login);
    if let Some(terminal) = terminal {
        terminal.give_back();
    }
    drop(flow);
    if let Some(audit) = audit {
        audit.ended(&status, bytes_out.load(Ordering::Relaxed));
    }
    finish(&writer, &handle, id, status).await;
    input.abort();
}

/// What a skiff client's flow control asks of a session
/// ([`skiff_proto::flow`]).
struct SessionFlow {
    /// Output reading is paused while this is `true`.
    pause: tokio::sync::watch::Sender<bool>,
    /// What input reports need (the connection, the channel and the count
    /// of input read), until the client asks for them.
    reports: Option<(
        russh::server::Handle,
        ChannelId,
        tokio::sync::watch::Receiver<u64>,
    )>,
    /// The task sending them, once asked.
    reporter: Option<tokio::task::JoinHandle<()>>,
}

impl SessionFlow {
    /// Starts the input reports, the first time they are asked for.
    fn start_reports(&mut self) {
        if let Some((handle, id, consumed)) = self.reports.take() {
            self.reporter = Some(tokio::spawn(send_input_reports(handle, id, consumed)));
        }
    }
}

impl Drop for SessionFlow {
    fn drop(&mut self) {
        if let Some(reporter) = self.reporter.take() {
            reporter.abort();
        }
    }
}

/// Tells the client how many input bytes the command has read
/// (`consumed`): at once, then after every
/// [`skiff_proto::flow::INPUT_ACK_STEP`] bytes.
async fn send_input_reports(
    handle: russh::server::Handle,
    id: ChannelId,
    mut consumed: tokio::sync::watch::Receiver<u64>,
) {
    use skiff_proto::flow;
    let mut reported: Option<u64> = None;
    loop {
        let total = *consumed.borrow_and_update();
        if reported.is_none_or(|r| total.saturating_sub(r) >= flow::INPUT_ACK_STEP) {
            let report = bytes::Bytes::copy_from_slice(&flow::encode_consumed(total));
            if handle
                .extended_data(id, flow::INPUT_CONSUMED, report)
                .await
                .is_err()
            {
                return;
            }
            reported = Some(total);
        }
        if consumed.changed().await.is_err() {
            return;
        }
    }
}

/// How long a terminal session's output is still read once its command
/// has exited: a terminal reads EOF only when its last holder closes it,
/// and a background job may keep it open. The reading goes on while output
/// still moves ([`PtyDrain::QUIET`] without a byte ends it), up to
/// [`PtyDrain::AT_MOST`] in all, so that a loaded machine, where the
/// output's task may not run for a while, does not cut the command's last
/// lines short.
struct PtyDrain {
    sent: Arc<AtomicU64>,
    seen: u64,
    /// Once the command has exited: the next look, and the last one.
    window: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

impl PtyDrain {
    /// No output for this long after the command's exit ends the session.
    const QUIET: std::time::Duration = std::time::Duration::from_millis(200);
    /// The most a session waits for its terminal after the command's exit.
    const AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);

    fn new(sent: Arc<AtomicU64>) -> PtyDrain {
        PtyDrain {
            sent,
            seen: 0,
            window: None,
        }
    }

    /// The command exited: the drain starts.
    fn start(&mut self, now: tokio::time::Instant) {
        self.seen = self.sent.load(Ordering::Relaxed);
        self.window = Some((now + Self::QUIET, now + Self::AT_MOST));
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.window.map(|(next, _)| next)
    }

    /// The deadline came: true when the drain is over (nothing moved since
    /// the last look, or the whole allowance is spent), else it is pushed on.
    fn quiet_for(&mut self, now: tokio::time::Instant) -> bool {
        let sent = self.sent.load(Ordering::Relaxed);
        let moved = sent != self.seen;
        self.seen = sent;
        match &mut self.window {
            Some((next, last)) if moved && now < *last => {
                *next = (now + Self::QUIET).min(*last);
                false
            }
            _ => true,
        }
    }
}

/// Waits for the output to end and the process to exit, delivering signals
/// meanwhile. When the connection lets go of the session (channel closed,
/// also for idleness, or connection gone) while the process runs, its
/// process group gets SIGHUP.
async fn supervise(
    child: &mut crate::process::SessionChild,
    output: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    control: &mut tokio::sync::mpsc::UnboundedReceiver<Control>,
    flow: &mut SessionFlow,
    mut drain: Option<PtyDrain>,
    clock: &crate::channel_idle::ChannelClock,
) -> std::io::Result<std::process::ExitStatus> {
    let expired = clock.expired();
    tokio::pin!(expired);
    let mut output = output;
    let mut output_done = false;
    let mut status = None;
    let mut connected = true;
    loop {
        if output_done {
            if let Some(st) = status.take() {
                return st;
            }
        }
        let drain_deadline = drain.as_ref().and_then(PtyDrain::deadline);
        tokio::select! {
            // Output first: when it can move and the drain's deadline has
            // come too, the output is read.
            biased;
            _ = &mut output, if !output_done => output_done = true,
            st = child.wait(), if status.is_none() => {
                if let Some(d) = drain.as_mut() {
                    d.start(tokio::time::Instant::now());
                }
                status = Some(st);
            }
            _ = async { tokio::time::sleep_until(drain_deadline.expect("guarded")).await }, if drain_deadline.is_some() && !output_done => {
                if drain.as_mut().is_some_and(|d| d.quiet_for(tokio::time::Instant::now())) {
                    output_done = true;
                }
            }
            () = &mut expired, if connected => {
                connected = false;
                hang_up(child, flow);
            }
            msg = control.recv(), if connected => {
                // Signals reach only our own, not yet reaped, child (or the
                // process group it leads): a reused pid is never signalled.
                match msg {
                    Some(Control::Signal(sig)) => child.signal(sig, false),
                    Some(Control::PauseOutput(on)) => {
                        flow.pause.send_replace(on);
                    }
                    Some(Control::InputAcks) => flow.start_reports(),
                    None => {
                        connected = false;
                        hang_up(child, flow);
                    }
                }
            }
        }
    }
}

/// The session has lost its channel: its process group gets SIGHUP.
fn hang_up(child: &mut crate::process::SessionChild, flow: &mut SessionFlow) {
    // Nobody is left to resume a paused output.
    flow.pause.send_replace(false);
    child.signal(libc::SIGHUP, true);
}

async fn finish(
    writer: &russh::ChannelWriteHalf<Msg>,
    handle: &russh::server::Handle,
    id: ChannelId,
    status: std::io::Result<std::process::ExitStatus>,
) {
    use std::os::unix::process::ExitStatusExt;
    let _ = writer.eof().await;
    match status {
        Ok(st) => {
            if let Some(code) = st.code() {
                let _ = writer.exit_status(code as u32).await;
            } else if let Some(sig) = st.signal() {
                let _ = handle
                    .exit_signal_request(
                        id,
                        process::number_to_sig(sig),
                        st.core_dumped(),
                        String::new(),
                        String::new(),
                    )
                    .await;
            }
        }
        Err(e) => {
            tracing::warn!("waiting for session process failed: {e}");
            let _ = writer.exit_status(255).await;
        }
    }
    let _ = writer.close().await;
}

/// What a session's `session` audit record says besides how it ended
/// (see `ConnectionHandler::session_audit`).
pub(super) struct SessionAudit {
    pub(super) log: Arc<crate::audit_writer::ConnectionLog>,
    pub(super) user: String,
    pub(super) kind: crate::audit::SessionKind,
    pub(super) requested: Option<String>,
    pub(super) forced: Option<String>,
    pub(super) pty: bool,
    pub(super) started: std::time::Instant,
    pub(super) bytes_in: Arc<AtomicU64>,
}

impl SessionAudit {
    /// Records the session, which ended with `status` having sent
    /// `bytes_out` bytes.
    fn ended(self, status: &std::io::Result<std::process::ExitStatus>, bytes_out: u64) {
        use crate::audit::Ending;
        use std::os::unix::process::ExitStatusExt;
        let ending = match status {
            Ok(st) => match (st.code(), st.signal()) {
                (Some(code), _) => Ending::Exit(code),
                (None, Some(sig)) => Ending::Signal(sig),
                (None, None) => Ending::StatusUnknown(true),
            },
            Err(_) => Ending::StatusUnknown(true),
        };
        self.log
            .record(crate::audit::Event::Session(crate::audit::SessionRecord {
                user: self.user,
                kind: self.kind,
                requested: self.requested,
                forced: self.forced,
                pty: self.pty,
                ending,
                duration_ms: crate::audit::millis(self.started.elapsed()),
                bytes_in: self.bytes_in.load(Ordering::Relaxed),
                bytes_out,
            }));
    }
}

/// A writer that counts the bytes written through it.
struct Counted<W> {
    inner: W,
    count: Arc<AtomicU64>,
}

impl<W> Counted<W> {
    fn new(inner: W, count: &Arc<AtomicU64>) -> Self {
        Counted {
            inner,
            count: count.clone(),
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.count.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_terminals_drain_goes_on_while_output_moves_and_no_longer() {
        let sent = Arc::new(AtomicU64::new(0));
        let mut drain = PtyDrain::new(sent.clone());
        assert_eq!(drain.deadline(), None, "no drain before the exit");
        let exit = tokio::time::Instant::now();
        drain.start(exit);
        assert_eq!(drain.deadline(), Some(exit + PtyDrain::QUIET));
        // Output moved since the exit: the drain goes on.
        sent.fetch_add(100, Ordering::Relaxed);
        let first = exit + PtyDrain::QUIET;
        assert!(!drain.quiet_for(first));
        assert_eq!(drain.deadline(), Some(first + PtyDrain::QUIET));
        // Nothing since: it ends.
        assert!(drain.quiet_for(first + PtyDrain::QUIET));
    }

    #[test]
    fn a_terminals_drain_ends_when_its_allowance_is_spent() {
        let sent = Arc::new(AtomicU64::new(0));
        let mut drain = PtyDrain::new(sent.clone());
        let exit = tokio::time::Instant::now();
        drain.start(exit);
        let mut looks = 0;
        let now = loop {
            let now = drain.deadline().expect("a deadline while draining");
            sent.fetch_add(1, Ordering::Relaxed); // a job that never stops writing
            looks += 1;
            if drain.quiet_for(now) {
                break now;
            }
            assert!(looks < 100, "the drain never ended");
        };
        assert!(now >= exit + PtyDrain::AT_MOST - Duration::from_millis(1));
        assert!(now <= exit + PtyDrain::AT_MOST);
    }
}
