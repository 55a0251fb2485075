//! The CLI side of the agent: find (or start) the agent, hand it this
//! process's stdin, stdout and stderr with the command, and wait for the
//! exit code. Everything here is blocking; one request per connection.

use skiff_engine::{ChannelOpened, ServerKind};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use skiff_proto::agent_wire::{
    self, ControlAction, ControlWire, ExecWire, ForwardWire, HostEnd, Reply, Request, RunWire,
};
use skiff_proto::terminal_text;

use crate::socket;

/// What became of a request sent to the agent.
#[derive(Debug)]
pub enum Outcome {
    Reply(Reply),
    /// No agent could be reached or started (the reason, for -v).
    Unavailable(String),
}

/// How long a first call waits for a freshly spawned agent to listen.
const SPAWN_WAIT: Duration = Duration::from_secs(5);

/// Connects to the running agent, starting one (exactly one, under a lock)
/// when `spawn` is set and none answers.
pub fn connect_or_spawn(spawn: bool) -> Result<UnixStream, String> {
    let dir = socket::agent_dir().map_err(|e| e.to_string())?;
    let path = socket::socket_path(&dir);
    if let Ok(s) = UnixStream::connect(&path) {
        return Ok(s);
    }
    if !spawn {
        return Err(format!("no agent listening on {}", path.display()));
    }
    let _lock = socket::lock_spawn(&dir, SPAWN_WAIT).map_err(|e| e.to_string())?;
    // Another first call may have started it while we waited for the lock.
    if let Ok(s) = UnixStream::connect(&path) {
        return Ok(s);
    }
    spawn_agent(&dir)?;
    let deadline = Instant::now() + SPAWN_WAIT;
    loop {
        match UnixStream::connect(&path) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "started an agent but it is not listening on {}: {e}",
                    path.display()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The agent's log file: `$XDG_STATE_HOME/skiff/agent.log`, else `~/.local/state/skiff/agent.log`.
pub fn log_path() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| skiff_engine::settings::home_dir().join(".local/state"));
    base.join("skiff/agent.log")
}

/// Starts `skiff agent --foreground` detached (new session, stdin from
/// /dev/null, output to the log file).
fn spawn_agent(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    use std::os::unix::process::CommandExt;
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the skiff executable: {e}"))?;
    let log = log_path();
    if let Some(parent) = log.parent() {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent);
    }
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)
        .map_err(|e| format!("cannot open agent log {}: {e}", log.display()))?;
    let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("agent")
        .arg("--foreground")
        .arg("--dir")
        .arg(dir)
        .arg("--spawned-under-lock")
        .stdin(std::process::Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    // SAFETY: setsid is async-signal-safe; it detaches the agent from our
    // terminal and process group so it outlives this command.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| format!("cannot start the agent: {e}"))?;
    Ok(())
}

/// Sends one request (with `fds` attached) and reads the reply.
pub fn request(stream: UnixStream, req: &Request, fds: &[BorrowedFd<'_>]) -> Result<Reply, String> {
    request_with(stream, req, fds, &mut || None)
}

/// Like [`request`]; while waiting, `poll_resize` is asked (every 100 ms or
/// so) for a new window size to send to the agent.
pub fn request_with(
    stream: UnixStream,
    req: &Request,
    fds: &[BorrowedFd<'_>],
    poll_resize: &mut dyn FnMut() -> Option<(u32, u32)>,
) -> Result<Reply, String> {
    request_announced(stream, req, fds, poll_resize, &mut |_| {})
}

/// Like [`request_with`]; an `Opened` or `OpenedOn` reply on the way goes
/// to `opened` and the final reply is returned.
/// What an agent's `Opened` reply says of the channel. An agent older than
/// [`agent_wire::SUBSYSTEM_SERVER_SINCE`] does not say which data plane a
/// skiffd speaks: it is taken to be version 2, as for a skiffd that does
/// not say.
fn announced(rtt_us: u64, server: ServerKind, data_plane: Option<u32>) -> ChannelOpened {
    let data_plane = data_plane.unwrap_or(match server {
        ServerKind::Skiffd => skiff_proto::dataplane::INLINE_UPLOAD_SINCE,
        _ => 0,
    });
    ChannelOpened {
        rtt: Duration::from_micros(rtt_us),
        server,
        data_plane,
    }
}

fn request_announced(
    mut stream: UnixStream,
    req: &Request,
    fds: &[BorrowedFd<'_>],
    poll_resize: &mut dyn FnMut() -> Option<(u32, u32)>,
    opened: &mut dyn FnMut(ChannelOpened),
) -> Result<Reply, String> {
    let frame = agent_wire::encode_request(req);
    socket::send_with_fds(&stream, &frame, fds)
        .map_err(|e| format!("cannot talk to the agent: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| format!("cannot talk to the agent: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        while let Some((reply, used)) =
            agent_wire::decode_reply(&buf).map_err(|e| format!("bad reply from the agent: {e}"))?
        {
            match reply {
                // An agent older than `SUBSYSTEM_SERVER_SINCE` says less
                // of what the server is (older than `SUBSYSTEM_ON_SINCE`,
                // nothing).
                Reply::Opened { rtt_us } => {
                    buf.drain(..used);
                    opened(announced(rtt_us, ServerKind::Other, None));
                }
                Reply::OpenedOn { rtt_us, skiffd } => {
                    buf.drain(..used);
                    let server = match skiffd {
                        true => ServerKind::Skiffd,
                        false => ServerKind::Other,
                    };
                    opened(announced(rtt_us, server, None));
                }
                Reply::OpenedKind { rtt_us, server } => {
                    buf.drain(..used);
                    opened(announced(rtt_us, server.into(), None));
                }
                Reply::OpenedServer {
                    rtt_us,
                    server,
                    data_plane,
                } => {
                    buf.drain(..used);
                    opened(announced(rtt_us, server.into(), Some(data_plane)));
                }
                last => return Ok(made_safe(last)),
            }
        }
        if let Some((cols, rows)) = poll_resize() {
            let frame = agent_wire::encode_request(&Request::WindowChange { cols, rows });
            let _ = stream.write_all(&frame);
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(format!("lost the agent: {e}")),
        };
        if n == 0 {
            return Err(
                "the agent went away before the command finished (it may have been killed)".into(),
            );
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Runs a command through the agent with this process's stdio, or
/// `input` in place of stdin. `poll_resize` reports terminal size changes
/// for pty sessions.
pub fn exec(
    wire: ExecWire,
    spawn: bool,
    input: Option<BorrowedFd<'_>>,
    poll_resize: &mut dyn FnMut() -> Option<(u32, u32)>,
) -> Outcome {
    let stream = match connect_or_spawn(spawn) {
        Ok(s) => s,
        Err(why) => return Outcome::Unavailable(why),
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let _ = std::io::stdout().flush();
    let fds = [
        input.unwrap_or(stdin.as_fd()),
        stdout.as_fd(),
        stderr.as_fd(),
    ];
    answered(request_with(
        stream,
        &Request::Exec(wire),
        &fds,
        poll_resize,
    ))
}

/// `ssh -W` through the agent with this process's stdin and stdout (and
/// stderr for notices). An agent that cannot be reached, or one too old to
/// forward (asked first, before any input is read), is `Unavailable`: the
/// caller then connects directly.
pub fn forward(wire: ForwardWire, spawn: bool) -> Outcome {
    match agent_version(spawn) {
        Ok((version, _)) if version >= agent_wire::FORWARD_SINCE => {}
        Ok((version, pid)) => {
            return Outcome::Unavailable(format!(
                "the running agent (pid {pid}) speaks version {version}, too old to forward"
            ))
        }
        Err(why) => return Outcome::Unavailable(why),
    }
    let stream = match connect_or_spawn(false) {
        Ok(s) => s,
        Err(why) => return Outcome::Unavailable(why),
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let fds = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    answered(request_with(
        stream,
        &Request::Forward(wire),
        &fds,
        &mut || None,
    ))
}

/// What the agent said to an `ssh -O` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Controlled {
    /// The agent (process `pid`) had `live` connections to the destination.
    Answered { pid: u32, live: u32 },
    /// No agent is running (none is started for this).
    NoAgent(String),
    /// The agent could not answer (too old, or the destination does not
    /// resolve): why.
    Failed(String),
}

/// `ssh -O check|stop|exit` for the destination of `wire`, asked of the
/// running agent; none is started for it.
pub fn control(wire: ExecWire, action: ControlAction) -> Controlled {
    let pid = match agent_version(false) {
        Ok((version, pid)) if version >= agent_wire::CONTROL_SINCE => pid,
        Ok((version, pid)) => {
            return Controlled::Failed(format!(
                "the running agent (pid {pid}) speaks version {version}, too old for control commands; restart it with `skiff agent stop`"
            ))
        }
        Err(why) => return Controlled::NoAgent(why),
    };
    let reply = connect_or_spawn(false).and_then(|s| {
        request(
            s,
            &Request::Control(ControlWire { base: wire, action }),
            &[],
        )
    });
    match reply {
        Ok(Reply::Controlled { live }) => Controlled::Answered { pid, live },
        Ok(Reply::Failed { message, .. }) => Controlled::Failed(message),
        Ok(other) => Controlled::Failed(format!("unexpected reply from the agent: {other:?}")),
        Err(why) => Controlled::Failed(why),
    }
}

/// The outcome of a request the agent was reached for: its reply, or a
/// connection failure when the agent went away.
fn answered(reply: Result<Reply, String>) -> Outcome {
    match reply {
        Ok(reply) => Outcome::Reply(reply),
        Err(e) => Outcome::Reply(Reply::Failed {
            kind: 2,
            message: e,
        }),
    }
}

/// The protocol version and pid of the agent (started first when `spawn`
/// is set and none answers).
fn agent_version(spawn: bool) -> Result<(u32, u32), String> {
    let hello = connect_or_spawn(spawn).and_then(|s| {
        request(
            s,
            &Request::Hello {
                version: agent_wire::PROTOCOL_VERSION,
            },
            &[],
        )
    });
    match hello {
        Ok(Reply::Hello { version, pid }) => Ok((version, pid)),
        Ok(other) => Err(format!("unexpected reply to hello: {other:?}")),
        Err(why) => Err(why),
    }
}

/// Starts a subsystem (`wire.command`) through the agent (started when none
/// answers) with `io` as the channel's stdin and stdout and this process's
/// stderr as its stderr: the caller speaks the subsystem's protocol on the
/// other end of `io` (how `skiff cp` uses the agent's warm connection).
/// Tells `opened` once the channel is open, before a byte of `io` is
/// relayed, with the round trip the agent measured opening it and whether
/// the server is a skiffd; `opened` is
/// not called when no channel could be opened. Blocks until the channel
/// ends; the reply is `Exit`, or `Failed` (kind `refused` when the server
/// would not start the subsystem). An agent older than
/// [`agent_wire::REFUSED_KIND_SINCE`] is `Unavailable`.
pub fn subsystem_announced(
    wire: ExecWire,
    io: BorrowedFd<'_>,
    opened: &mut dyn FnMut(ChannelOpened),
) -> Outcome {
    let version = match agent_version(true) {
        Ok((version, _)) => version,
        Err(why) => return Outcome::Unavailable(why),
    };
    if version < agent_wire::REFUSED_KIND_SINCE {
        return Outcome::Unavailable(format!(
            "the running agent speaks version {version}, too old for copies (it cannot say that a subsystem was refused)"
        ));
    }
    let stream = match connect_or_spawn(false) {
        Ok(s) => s,
        Err(why) => return Outcome::Unavailable(why),
    };
    let stderr = std::io::stderr();
    let fds = [io, io, stderr.as_fd()];
    let req = if version >= agent_wire::SUBSYSTEM_SERVER_SINCE {
        Request::SubsystemServer(wire)
    } else if version >= agent_wire::SUBSYSTEM_KIND_SINCE {
        Request::SubsystemKind(wire)
    } else if version >= agent_wire::SUBSYSTEM_ON_SINCE {
        Request::SubsystemOn(wire)
    } else {
        Request::Subsystem(wire)
    };
    answered(request_announced(stream, &req, &fds, &mut || None, opened))
}

/// Runs a fan-out through the agent (`stream` from [`connect_or_spawn`]):
/// sends `wire`, then hands every reply
/// to `on_reply` as it arrives, until the final `Done` (or `Failed`), which
/// is returned. `on_reply` returning false stops early (the socket is then
/// closed and the agent stops the remaining commands).
pub fn run(
    mut stream: UnixStream,
    wire: RunWire,
    on_reply: &mut dyn FnMut(Reply) -> bool,
) -> Result<Reply, RunError> {
    let frame = agent_wire::encode_request(&Request::Run(wire));
    stream
        .write_all(&frame)
        .map_err(|e| RunError::Unavailable(format!("cannot talk to the agent: {e}")))?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let mut used = 0;
        while let Some((reply, n)) = agent_wire::decode_reply(&buf[used..])
            .map_err(|e| RunError::Lost(format!("bad reply from the agent: {e}")))?
        {
            used += n;
            match reply {
                Reply::Done | Reply::Failed { .. } => return Ok(made_safe(reply)),
                other => {
                    if !on_reply(made_safe(other)) {
                        return Ok(Reply::Done);
                    }
                }
            }
        }
        buf.drain(..used);
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(RunError::Lost(format!("lost the agent: {e}"))),
        };
        if n == 0 {
            return Err(RunError::Lost(
                "the agent went away before the run finished (it may have been killed)".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `reply` with its text made safe to show on a terminal: the agent's
/// messages are often a server's words (a refusal, a banner, a signal's
/// name), and the CLI prints them. Command output is left as it came.
pub fn made_safe(reply: Reply) -> Reply {
    fn line(text: String) -> String {
        match terminal_text::one_line(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(escaped) => escaped,
        }
    }
    fn lines(text: String) -> String {
        match terminal_text::lines(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(escaped) => escaped,
        }
    }
    match reply {
        Reply::Failed { kind, message } => Reply::Failed {
            kind,
            message: line(message),
        },
        Reply::NeedsUser { message } => Reply::NeedsUser {
            message: line(message),
        },
        Reply::Status { text } => Reply::Status { text: lines(text) },
        Reply::RunNotice { host, text } => Reply::RunNotice {
            host,
            text: lines(text),
        },
        Reply::RunDone {
            host,
            end,
            duration_us,
        } => Reply::RunDone {
            host,
            end: match end {
                HostEnd::Signal(name) => HostEnd::Signal(line(name)),
                HostEnd::Failed { kind, message } => HostEnd::Failed {
                    kind,
                    message: line(message),
                },
                HostEnd::NeedsUser { kind, message } => HostEnd::NeedsUser {
                    kind,
                    message: line(message),
                },
                other @ (HostEnd::Status(_) | HostEnd::Unknown) => other,
            },
            duration_us,
        },
        other @ (Reply::Hello { .. }
        | Reply::Exit { .. }
        | Reply::Done
        | Reply::RunOutput { .. }
        | Reply::Opened { .. }
        | Reply::OpenedOn { .. }
        | Reply::OpenedKind { .. }
        | Reply::OpenedServer { .. }
        | Reply::Controlled { .. }) => other,
    }
}

/// Why a fan-out through the agent did not complete.
#[derive(Debug)]
pub enum RunError {
    /// No agent could be reached or started; nothing ran.
    Unavailable(String),
    /// The agent went away mid-run; some commands may have run.
    Lost(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_messages_are_made_safe_and_output_is_not() {
        let failed = Reply::Failed {
            kind: 5,
            message: "h1: refused \u{1b}[1A\u{1b}[2K".into(),
        };
        assert_eq!(
            made_safe(failed),
            Reply::Failed {
                kind: 5,
                message: "h1: refused \\u{1b}[1A\\u{1b}[2K".into()
            }
        );
        let notice = Reply::RunNotice {
            host: 3,
            text: "Welcome\n\u{1b}]52;c;aGk=\u{7}".into(),
        };
        assert_eq!(
            made_safe(notice),
            Reply::RunNotice {
                host: 3,
                text: "Welcome\n\\u{1b}]52;c;aGk=\\u{7}".into()
            }
        );
        let done = Reply::RunDone {
            host: 1,
            end: HostEnd::Failed {
                kind: 2,
                message: "bye\r".into(),
            },
            duration_us: 7,
        };
        assert_eq!(
            made_safe(done),
            Reply::RunDone {
                host: 1,
                end: HostEnd::Failed {
                    kind: 2,
                    message: "bye\\r".into()
                },
                duration_us: 7,
            }
        );
        let signal = Reply::RunDone {
            host: 1,
            end: HostEnd::Signal("TERM\u{9b}2J".into()),
            duration_us: 7,
        };
        assert!(matches!(
            made_safe(signal),
            Reply::RunDone { end: HostEnd::Signal(name), .. } if name == "TERM\\u{9b}2J"
        ));
        // The command's own bytes pass through.
        let output = Reply::RunOutput {
            host: 0,
            stream: 1,
            data: b"\x1b[31mred\x1b[0m\n".to_vec(),
        };
        assert_eq!(made_safe(output.clone()), output);
    }
}
