//! Running one command on a connection: open a session channel, pass the
//! environment, request a pty if asked, then stream stdin to the command and
//! its stdout and stderr back, until the exit status or signal arrives.

use russh::ChannelMsg;
use skiff_proto::flow::{self, PAUSE_OUTPUT, RESUME_OUTPUT};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::connect::Connection;
use crate::error::{ErrorKind, SkiffError};

/// A terminal for the remote command (`-t`).
#[derive(Debug, Clone)]
pub struct PtyRequest {
    pub term: String,
    pub cols: u32,
    pub rows: u32,
    /// `-tt`: a refused terminal is an error rather than a warning.
    pub required: bool,
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// The command line, or the subsystem's name when `subsystem` is set.
    /// Empty (without `subsystem`) asks for the login shell.
    pub command: String,
    /// Start the subsystem named by `command` (such as `sftp`) instead.
    pub subsystem: bool,
    pub env: Vec<(String, String)>,
    pub pty: Option<PtyRequest>,
    /// Stop the command after this long: the remote command is sent TERM,
    /// the channel is closed, and the result is an [`ErrorKind::Timeout`].
    pub timeout: Option<std::time::Duration>,
}

/// How the remote command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    Status(u32),
    Signal {
        name: String,
        core_dumped: bool,
        message: String,
    },
    /// The channel closed without an exit status (e.g. the server dropped it).
    Unknown,
}

impl ExitOutcome {
    /// The exit code a local shell would show: the status, 128+N for signal N
    /// (as a local shell reports it), 255 when unknown or unnamed (as ssh does).
    pub fn exit_code(&self) -> i32 {
        match self {
            ExitOutcome::Status(s) => (*s & 0xff) as i32,
            ExitOutcome::Signal { name, .. } => {
                skiff_proto::signals::number(name).map_or(255, |n| 128 + n)
            }
            ExitOutcome::Unknown => 255,
        }
    }
}

/// A window size change for a pty session.
#[derive(Debug, Clone, Copy)]
pub struct WindowSize {
    pub cols: u32,
    pub rows: u32,
}

/// A session channel opened on a connection, not yet running anything.
pub struct OpenSession {
    channel: russh::Channel<russh::client::Msg>,
    host: String,
    /// The server is a skiffd, which pauses a command's output when asked
    /// (see [`PAUSE_OUTPUT`]).
    pausable: bool,
    /// Ask for the agent to be forwarded (`ForwardAgent`).
    forward_agent: bool,
    /// How the connection ends, to explain a command cut short.
    ending: crate::connect::EndWatch,
}

impl OpenSession {
    /// The opened channel, for callers that start something other than a
    /// command on it (a subsystem such as `sftp`).
    pub(crate) fn into_channel(self) -> russh::Channel<russh::client::Msg> {
        self.channel
    }

    /// The channel, for a keeper that holds it before any request
    /// ([`crate::spare_session`]).
    pub(crate) fn channel_mut(&mut self) -> &mut russh::Channel<russh::client::Msg> {
        &mut self.channel
    }

    /// The host it is open to, for messages.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }
}

/// Opens a session channel. Nothing has run on the server yet, so a caller
/// may retry elsewhere on [`ErrorKind::ChannelRefused`] or a lost connection.
pub async fn open_session(conn: &Connection) -> Result<OpenSession, SkiffError> {
    let host = conn.settings.hostname.clone();
    let channel = match conn.handle.channel_open_session().await {
        Ok(channel) => channel,
        Err(russh::Error::ChannelOpenFailure(reason)) => {
            return Err(SkiffError::new(
                ErrorKind::ChannelRefused,
                format!("{host}: the server refused a session channel ({reason:?})"),
            ))
        }
        // The server may have said why it closed the connection (skiffd
        // refusing a login under /etc/nologin, say).
        Err(other) => {
            return Err(match conn.end_watch().described().await {
                Some(why) => SkiffError::new(ErrorKind::Connect, format!("{host}: {why}")),
                None => SkiffError::new(
                    ErrorKind::Connect,
                    format!("{host}: connection lost: {other}"),
                ),
            });
        }
    };
    Ok(OpenSession {
        channel,
        host,
        pausable: conn.server_id.is_skiffd(),
        forward_agent: conn.settings.forward_agent.is_some(),
        ending: conn.end_watch(),
    })
}

/// Runs `req` on a new channel of `conn`, copying `stdin` (if any) to the
/// command and its output to `stdout`/`stderr`. `resize` delivers
/// window-size changes for pty sessions.
pub async fn exec<I, O, E>(
    conn: &Connection,
    req: &ExecRequest,
    stdin: Option<I>,
    stdout: O,
    stderr: E,
    resize: Option<tokio::sync::mpsc::Receiver<WindowSize>>,
) -> Result<ExitOutcome, SkiffError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let session = open_session(conn).await?;
    let outcome = run_session(session, req, stdin, stdout, stderr, resize).await;
    // A command that ends at once must not cut short what the connection
    // is learning about the server's host keys.
    conn.host_keys_settled().await;
    outcome
}

/// Runs `req` on an opened session channel (see [`exec`]).
pub async fn run_session<I, O, E>(
    session: OpenSession,
    req: &ExecRequest,
    stdin: Option<I>,
    mut stdout: O,
    mut stderr: E,
    mut resize: Option<tokio::sync::mpsc::Receiver<WindowSize>>,
) -> Result<ExitOutcome, SkiffError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let OpenSession {
        channel,
        host,
        pausable,
        forward_agent,
        ending,
    } = session;
    let lost = |e: &dyn std::fmt::Display| {
        SkiffError::new(ErrorKind::Connect, format!("{host}: connection lost: {e}"))
    };
    for (k, v) in &req.env {
        channel
            .set_env(false, k.as_str(), v.as_str())
            .await
            .map_err(|e| lost(&e))?;
    }
    // Requests that want a reply get them in order: the agent and the pty
    // (if asked for), then exec.
    let mut pending_replies = std::collections::VecDeque::new();
    if forward_agent && !req.subsystem {
        channel.agent_forward(true).await.map_err(|e| lost(&e))?;
        pending_replies.push_back(Request::Agent);
    }
    if let Some(pty) = &req.pty {
        channel
            .request_pty(true, &pty.term, pty.cols, pty.rows, 0, 0, &[])
            .await
            .map_err(|e| lost(&e))?;
        pending_replies.push_back(Request::Pty);
    }
    pending_replies.push_back(Request::Exec);
    if req.subsystem {
        channel
            .request_subsystem(true, &req.command)
            .await
            .map_err(|e| lost(&e))?;
    } else if req.command.is_empty() {
        // No command: the account's login shell, as ssh does.
        channel.request_shell(true).await.map_err(|e| lost(&e))?;
    } else {
        channel
            .exec(true, req.command.as_bytes())
            .await
            .map_err(|e| lost(&e))?;
    }
    // A skiffd reports how much input the command has read, so that input
    // waiting for a command that does not read holds up nothing else.
    let input_reports = pausable && stdin.is_some();
    if input_reports {
        channel
            .signal(russh::Sig::Custom(flow::INPUT_ACKS.into()))
            .await
            .map_err(|e| lost(&e))?;
    }
    let (acked_tx, acked) = tokio::sync::watch::channel(None::<u64>);
    let (mut reader, writer) = channel.split();

    // stdin -> channel, respecting the remote window; EOF when stdin ends.
    let writer = std::sync::Arc::new(writer);
    // If this future is dropped before the command ends (the caller gave up:
    // a timeout, or the agent's client went away), close the channel so the
    // server ends the command instead of letting it run on.
    let mut close_guard = CloseOnDrop(Some(writer.clone()));
    let input_writer = writer.clone();
    let input = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            let mut tx = input_writer.make_writer();
            let _ = send_input(&mut stdin, &mut tx, acked).await;
            let _ = tx.flush().await;
        }
        let _ = input_writer.eof().await;
    });

    let mut outcome = ExitOutcome::Unknown;
    let mut closed = false;
    let mut exec_refused = false;
    // Whether anything came from the command or about its request.
    let mut heard = false;
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    // Output waits here for the local reader while the channel's messages
    // keep being taken, so that a slow reader holds up neither the exit
    // status nor, through russh's per-channel queue, the connection's other
    // channels. A skiffd is asked to pause the command's output while much
    // is queued; other servers cannot be, and past `queue_limit` the
    // channel stops taking messages (russh then holds up the connection,
    // as before this queue).
    let mut out = OutputQueue::default();
    let mut err = OutputQueue::default();
    let mut paused = false;
    let queue_limit = if pausable {
        QUEUE_LIMIT_PAUSABLE
    } else {
        QUEUE_LIMIT
    };
    let sigpipe = || ExitOutcome::Signal {
        name: "PIPE".into(),
        core_dumped: false,
        message: String::new(),
    };
    loop {
        let queued = out.bytes + err.bytes;
        if pausable && !paused && queued >= PAUSE_OUTPUT_AT {
            paused = true;
            let _ = writer.signal(russh::Sig::Custom(PAUSE_OUTPUT.into())).await;
        } else if paused && queued <= RESUME_OUTPUT_AT {
            paused = false;
            let _ = writer
                .signal(russh::Sig::Custom(RESUME_OUTPUT.into()))
                .await;
        }
        let event = tokio::select! {
            msg = reader.wait(), if queued < queue_limit => Event::Message(msg),
            done = write_step(out.front(), &mut stdout), if out.has_work() => Event::Stdout(done),
            done = write_step(err.front(), &mut stderr), if err.has_work() => Event::Stderr(done),
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => Event::TimedOut,
            Some(ws) = async { match resize.as_mut() { Some(r) => r.recv().await, None => std::future::pending().await } } => Event::Resize(ws),
        };
        let msg = match event {
            Event::Message(msg) => msg,
            Event::Stdout(Ok((n, flushed))) => {
                if !flushed && n == 0 {
                    return Err(local_io("stdout", std::io::ErrorKind::WriteZero.into()));
                }
                out.written(n, flushed);
                continue;
            }
            Event::Stdout(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                // The local reader went away (`skiff exec h yes | head -1`): stop
                // quietly and report what a local program would, death by SIGPIPE.
                close_guard.disarm();
                let _ = writer.close().await;
                input.abort();
                return Ok(sigpipe());
            }
            Event::Stdout(Err(e)) => return Err(local_io("stdout", e)),
            Event::Stderr(Ok((n, flushed))) if flushed || n > 0 => {
                err.written(n, flushed);
                continue;
            }
            Event::Stderr(_) => {
                // A closed local stderr is not worth failing the command for.
                err = OutputQueue::default();
                continue;
            }
            Event::TimedOut => {
                // Ask the command to stop, then hang up: skiffd also sends
                // SIGHUP to what is left when the channel closes.
                close_guard.disarm();
                let _ = writer.signal(russh::Sig::TERM).await;
                let _ = writer.close().await;
                input.abort();
                return Err(SkiffError::new(
                    ErrorKind::Timeout,
                    format!(
                        "{host}: command timed out after {}s; sent TERM and closed the channel",
                        req.timeout.unwrap_or_default().as_secs_f64()
                    ),
                ));
            }
            Event::Resize(ws) => {
                let _ = writer.window_change(ws.cols, ws.rows, 0, 0).await;
                continue;
            }
        };
        let Some(msg) = msg else { break };
        heard |= !matches!(
            msg,
            ChannelMsg::Close | ChannelMsg::Eof | ChannelMsg::WindowAdjusted { .. }
        );
        match msg {
            ChannelMsg::Data { data } => out.push(data),
            ChannelMsg::ExtendedData { data, ext: 1 } => err.push(data),
            ChannelMsg::ExtendedData {
                data,
                ext: flow::INPUT_CONSUMED,
            } if input_reports => {
                if let Some(total) = flow::decode_consumed(&data) {
                    acked_tx.send_replace(Some(total));
                }
            }
            ChannelMsg::ExitStatus { exit_status } => outcome = ExitOutcome::Status(exit_status),
            ChannelMsg::ExitSignal {
                signal_name,
                core_dumped,
                error_message,
                ..
            } => {
                outcome = ExitOutcome::Signal {
                    name: sig_name(&signal_name),
                    core_dumped,
                    message: error_message,
                }
            }
            ChannelMsg::Success => {
                pending_replies.pop_front();
            }
            ChannelMsg::Failure => match pending_replies.pop_front() {
                Some(Request::Pty) if req.pty.as_ref().is_some_and(|p| p.required) => {
                    close_guard.disarm();
                    let _ = writer.close().await;
                    input.abort();
                    return Err(SkiffError::new(
                        ErrorKind::Protocol,
                        format!("{host}: PTY allocation request failed (the server or the key's options refuse a terminal)"),
                    ));
                }
                Some(Request::Pty) => err.push(bytes::Bytes::from_static(
                    b"skiff: PTY allocation request failed; running without a terminal\r\n",
                )),
                Some(Request::Agent) => err.push(bytes::Bytes::from_static(if req.pty.is_some() {
                    b"skiff: the server refused agent forwarding\r\n"
                } else {
                    b"skiff: the server refused agent forwarding\n"
                })),
                _ => {
                    // Like ssh: a refused exec (or subsystem) ends the
                    // session; the server need not close the channel.
                    exec_refused = true;
                    closed = true;
                    let _ = writer.close().await;
                    break;
                }
            },
            ChannelMsg::Close => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    // What is still queued goes out before the outcome is told.
    let drained = out.drain(&mut stdout).await;
    if drained.is_ok() {
        let _ = err.drain(&mut stderr).await;
    }
    input.abort();
    close_guard.disarm();
    match drained {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(sigpipe()),
        Err(e) => return Err(local_io("stdout", e)),
        Ok(()) => {}
    }
    if !closed && outcome == ExitOutcome::Unknown {
        // The channel vanished without a close: the connection is gone,
        // and may have said why.
        let why = ending.described().await;
        return Err(SkiffError::new(
            ErrorKind::Connect,
            match why {
                Some(why) => format!("{host}: {why} before the command finished"),
                None => format!(
                    "{host}: connection lost before the command finished (the server closed it or stopped answering keepalives)"
                ),
            },
        ));
    }
    if closed && !heard && pending_replies.contains(&Request::Exec) {
        // The server closed the channel without answering the request (a
        // channel it had timed out as the request went out, say): nothing
        // ran, so the caller may run the command on another channel.
        return Err(SkiffError::new(
            ErrorKind::ClosedBeforeStart,
            format!("{host}: the server closed the channel before answering the request"),
        ));
    }
    if exec_refused && outcome == ExitOutcome::Unknown {
        return Err(SkiffError::new(
            ErrorKind::Refused,
            if req.subsystem {
                format!("{host}: the server refused the {} subsystem", req.command)
            } else if req.command.is_empty() {
                format!("{host}: the server refused to start a shell")
            } else {
                format!("{host}: the server refused to run the command")
            },
        ));
    }
    Ok(outcome)
}

/// Closes a channel when dropped while still armed.
struct CloseOnDrop(Option<std::sync::Arc<russh::ChannelWriteHalf<russh::client::Msg>>>);

impl CloseOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let (Some(writer), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                let _ = writer.close().await;
            });
        }
    }
}

/// Queued output at which a skiffd is asked to pause the command's output,
/// and at which it is asked to go on.
const PAUSE_OUTPUT_AT: usize = 1 << 20;
const RESUME_OUTPUT_AT: usize = 256 << 10;

/// Queued output past which a channel stops taking messages. Toward a
/// skiffd it is above what may still be in flight once the output is paused
/// (a channel window, at most 64 MiB unless raised); toward other servers it
/// bounds the memory one slow reader can take.
const QUEUE_LIMIT_PAUSABLE: usize = 160 << 20;
const QUEUE_LIMIT: usize = 8 << 20;

/// Copies `stdin` to the channel. Once the server reports how much input
/// the command has read (`acked`, see [`flow::INPUT_ACKS`]), at most
/// [`flow::INPUT_CREDIT`] bytes are sent ahead of it; before any report (or
/// from servers that send none) only the channel window limits it.
async fn send_input<I, W>(
    stdin: &mut I,
    tx: &mut W,
    mut acked: tokio::sync::watch::Receiver<Option<u64>>,
) -> std::io::Result<()>
where
    I: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    loop {
        let n = stdin.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        // An error means the reports ended with the channel: nothing to wait for.
        let _ = acked
            .wait_for(|read| read.is_none_or(|r| sent.saturating_sub(r) < flow::INPUT_CREDIT))
            .await;
        tx.write_all(&buf[..n]).await?;
        sent += n as u64;
    }
}

/// One write of `front` to `w`, or a flush when `front` is empty: the bytes
/// written, or `(0, true)` for a flush. Dropped before it completes, it has
/// written nothing (tokio's `write` guarantees that).
async fn write_step<W: AsyncWrite + Unpin>(
    front: &[u8],
    w: &mut W,
) -> std::io::Result<(usize, bool)> {
    if front.is_empty() {
        w.flush().await.map(|()| (0, true))
    } else {
        w.write(front).await.map(|n| (n, false))
    }
}

/// What woke the channel loop in [`run_session`].
enum Event {
    Message(Option<ChannelMsg>),
    /// A write (bytes written) or a flush (`true`) of the local stdout.
    Stdout(std::io::Result<(usize, bool)>),
    Stderr(std::io::Result<(usize, bool)>),
    TimedOut,
    Resize(WindowSize),
}

/// Output waiting for a local reader. Writes go through `write` (which
/// writes all or nothing of what it reports, so a write dropped by
/// `select!` loses no byte) from the first chunk's unwritten part.
#[derive(Default)]
struct OutputQueue {
    chunks: std::collections::VecDeque<bytes::Bytes>,
    /// Bytes of the first chunk already written.
    offset: usize,
    /// Bytes queued and not yet written.
    bytes: usize,
    /// Something was written since the last flush.
    unflushed: bool,
}

impl OutputQueue {
    fn push(&mut self, data: bytes::Bytes) {
        if !data.is_empty() {
            self.bytes += data.len();
            self.chunks.push_back(data);
        }
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Something to write, or to flush.
    fn has_work(&self) -> bool {
        !self.is_empty() || self.unflushed
    }

    /// The unwritten part of the first chunk (empty when nothing is queued).
    fn front(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| &c[self.offset..])
    }

    /// `n` bytes of [`OutputQueue::front`] were written, or (`flushed`)
    /// everything written was flushed.
    fn written(&mut self, n: usize, flushed: bool) {
        if flushed {
            self.unflushed = false;
            return;
        }
        self.offset += n;
        self.bytes -= n;
        self.unflushed = true;
        if self.chunks.front().is_some_and(|c| self.offset >= c.len()) {
            self.chunks.pop_front();
            self.offset = 0;
        }
    }

    /// Writes and flushes everything queued.
    async fn drain<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        while !self.is_empty() {
            let n = w.write(self.front()).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.written(n, false);
        }
        if self.unflushed {
            w.flush().await?;
            self.unflushed = false;
        }
        Ok(())
    }
}

/// Channel requests that wait for a reply, in the order they were sent.
#[derive(PartialEq)]
enum Request {
    Agent,
    Pty,
    Exec,
}

fn local_io(what: &str, e: std::io::Error) -> SkiffError {
    SkiffError::new(
        ErrorKind::Protocol,
        format!("cannot write to local {what}: {e}"),
    )
}

fn sig_name(sig: &russh::Sig) -> String {
    match sig {
        russh::Sig::Custom(name) => name.clone(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(ExitOutcome::Status(7).exit_code(), 7);
        let killed = ExitOutcome::Signal {
            name: "KILL".into(),
            core_dumped: false,
            message: String::new(),
        };
        assert_eq!(killed.exit_code(), 137);
        assert_eq!(ExitOutcome::Unknown.exit_code(), 255);
        assert_eq!(sig_name(&russh::Sig::TERM), "TERM");
        assert_eq!(sig_name(&russh::Sig::Custom("USR2".into())), "USR2");
    }
}
