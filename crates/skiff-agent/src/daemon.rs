//! The agent daemon: accepts `skiff` processes of the same user on its
//! private socket, receives their stdin/stdout/stderr, runs their commands
//! through one shared connection pool, and answers with the exit code.
//!
//! The agent never asks a person anything: it resolves settings with
//! `BatchMode=yes`, and a connection that would need a decision (a host key
//! under `ask`, a passphrase) is answered with `NeedsUser`, so the CLI
//! connects directly that first time.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use skiff_engine::busy::Gate;
use skiff_engine::fanout::{self, FanoutOptions, RunEvent, Stream};
use skiff_engine::settings::{ClientEnv, Resolver};
use skiff_engine::{Destination, ExecRequest, ExitOutcome, Pool, PtyRequest};
use skiff_proto::agent_wire::{
    self, ControlAction, ControlWire, ExecWire, ForwardWire, HostEnd, Reply, Request, RunWire,
};
use skiff_proto::nodeset;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::socket;

/// How long an unused connection stays open (unless the host's
/// ControlPersist says otherwise), and how long the agent lives with no
/// command running and no connection left.
pub const DEFAULT_PERSIST: Duration = Duration::from_secs(600);

/// Shared daemon state.
struct Agent {
    pool: Arc<Pool>,
    active: AtomicUsize,
    last_activity: std::sync::Mutex<Instant>,
    started: Instant,
    stop: tokio::sync::Notify,
    /// The limit on connections on their way to authentication that the
    /// connections made for one client process share, by its process id
    /// (see [`Agent::gate_for`]).
    gates: std::sync::Mutex<HashMap<i32, Weak<Gate>>>,
}

impl Agent {
    /// The gate of the client process `pid`: the connections the agent
    /// makes for it (a `skiff cp` to a node set sends one request per host)
    /// keep from crowding a server that drops connections before
    /// authentication, as a fan-out's do. A client whose process id is
    /// unknown gets a gate of its own.
    fn gate_for(&self, pid: Option<i32>) -> Arc<Gate> {
        let Some(pid) = pid else {
            return Arc::default();
        };
        let mut gates = self.gates.lock().expect("not poisoned");
        if let Some(gate) = gates.get(&pid).and_then(Weak::upgrade) {
            return gate;
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Gate::default());
        gates.insert(pid, Arc::downgrade(&gate));
        gate
    }
}

/// Commands that may read stdin at once through the agent.
const MAX_STDIN_PUMPS: usize = 4096;

/// How long a hand-started agent waits for a starting one to finish binding.
const BIND_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Runs the agent on `dir` until it is stopped or idle for `persist`.
/// `parent_holds_lock` is set when the `skiff` that spawned us holds the
/// spawn lock; otherwise (a hand-started agent) we take it ourselves around
/// binding, so that two starting agents never both judge the socket stale.
pub fn run(
    dir: &Path,
    persist: Duration,
    parent_holds_lock: bool,
) -> Result<(), socket::SocketError> {
    socket::ensure_private_dir(dir)?;
    let path = socket::socket_path(dir);
    let listener = {
        let _lock = if parent_holds_lock {
            None
        } else {
            Some(socket::lock_spawn(dir, BIND_LOCK_WAIT)?)
        };
        socket::bind_private(&path)?
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err(&path, e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // One per running command with stdin (each stays until its command
        // ends), so the ceiling must sit far above any realistic concurrency.
        .max_blocking_threads(MAX_STDIN_PUMPS)
        .enable_all()
        .build()
        .map_err(|e| io_err(&path, e))?;
    let result = rt.block_on(serve(listener, &path, persist));
    // Stdin pumps end when their commands are dropped; never wait long on one.
    rt.shutdown_timeout(Duration::from_secs(2));
    let _ = std::fs::remove_file(&path);
    result
}

fn io_err(path: &Path, source: std::io::Error) -> socket::SocketError {
    socket::SocketError::Io {
        path: path.to_path_buf(),
        source,
    }
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    path: &Path,
    persist: Duration,
) -> Result<(), socket::SocketError> {
    let listener = tokio::net::UnixListener::from_std(listener).map_err(|e| io_err(path, e))?;
    let agent = Arc::new(Agent {
        pool: Arc::new(Pool::with_spare_sessions(
            skiff_engine::spare_session::SPARE_LIFETIME,
        )),
        active: AtomicUsize::new(0),
        last_activity: std::sync::Mutex::new(Instant::now()),
        started: Instant::now(),
        stop: tokio::sync::Notify::new(),
        gates: std::sync::Mutex::default(),
    });
    tracing::info!(
        "skiff agent listening on {} (pid {})",
        path.display(),
        std::process::id()
    );
    let tick = Duration::from_secs(1)
        .min(persist)
        .max(Duration::from_millis(100));
    let mut idle_check = tokio::time::interval(tick);
    idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    if let Err(e) = client(agent, stream).await {
                        tracing::info!("client ended: {e}");
                    }
                });
            }
            _ = idle_check.tick() => {
                agent.pool.close_idle(persist).await;
                let idle_for = agent.last_activity.lock().expect("not poisoned").elapsed();
                // Connections kept by a longer ControlPersist keep the agent too.
                if agent.active.load(Ordering::SeqCst) == 0
                    && agent.pool.is_empty()
                    && idle_for >= persist
                {
                    tracing::info!("idle for {}s: exiting", idle_for.as_secs());
                    return Ok(());
                }
            }
            _ = agent.stop.notified() => {
                tracing::info!("stop requested: exiting");
                return Ok(());
            }
        }
    }
}

/// How long a client has to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads one request (with any attached fds) from a client, without
/// leaving the runtime: the socket is non-blocking and `recvmsg` runs when
/// it is readable.
async fn read_request(stream: &tokio::net::UnixStream) -> std::io::Result<(Request, Vec<OwnedFd>)> {
    let mut buf = Vec::new();
    let mut fds = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some((req, _)) = agent_wire::decode_request(&buf).map_err(std::io::Error::other)? {
            return Ok((req, fds));
        }
        let (n, mut got) = stream
            .async_io(tokio::io::Interest::READABLE, || {
                socket::recv_with_fds(stream, &mut chunk, 3)
            })
            .await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "client closed the socket",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        fds.append(&mut got);
    }
}

async fn client(agent: Arc<Agent>, mut stream: tokio::net::UnixStream) -> std::io::Result<()> {
    if let Err(e) = socket::check_peer(&stream) {
        tracing::warn!("refused a client: {e}");
        return Ok(());
    }
    let pid = stream.peer_cred().ok().and_then(|c| c.pid());
    let (request, fds) = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&stream))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "client sent no complete request in time",
            )
        })??;
    // `SubsystemOn`, `SubsystemKind` and `SubsystemServer` are `Subsystem`
    // whose `Opened` also says what the server is (whether it is a skiffd;
    // what it is; and which data plane it speaks).
    let announcement = match &request {
        Request::SubsystemOn(_) => Announcement::Skiffd,
        Request::SubsystemKind(_) => Announcement::Kind,
        Request::SubsystemServer(_) => Announcement::Server,
        _ => Announcement::Plain,
    };
    let reply = match request {
        Request::Hello { .. } => Reply::Hello {
            version: agent_wire::PROTOCOL_VERSION,
            pid: std::process::id(),
        },
        Request::Status => Reply::Status {
            text: status_text(&agent),
        },
        Request::Stop => {
            agent.stop.notify_one();
            Reply::Done
        }
        Request::Forget { host } => {
            let n = agent.pool.forget(&host.to_ascii_lowercase());
            Reply::Status {
                text: format!("forgot {n} destination(s) for {host}\n"),
            }
        }
        Request::Control(wire) => control(&agent, wire),
        Request::WindowChange { .. } => Reply::Failed {
            kind: 5,
            message: "window change without a session".into(),
        },
        Request::Run(wire) => {
            agent.active.fetch_add(1, Ordering::SeqCst);
            let reply = run_fanout(&agent, wire, &mut stream).await;
            agent.active.fetch_sub(1, Ordering::SeqCst);
            *agent.last_activity.lock().expect("not poisoned") = Instant::now();
            match reply {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!("fan-out client went away ({e}); its commands were stopped");
                    return Ok(());
                }
            }
        }
        Request::Forward(wire) => {
            let (resize_tx, _) = tokio::sync::mpsc::channel(1);
            let work = forward(&agent, wire, fds, agent.gate_for(pid));
            match attended(&agent, &stream, resize_tx, work).await {
                Some(r) => r,
                None => {
                    tracing::info!("client went away; its forwarding was closed");
                    return Ok(());
                }
            }
        }
        Request::Exec(wire) => {
            let (resize_tx, resize_rx) = tokio::sync::mpsc::channel(8);
            let resize = wire.pty.is_some().then_some(resize_rx);
            let work = exec(
                &agent,
                wire,
                fds,
                Started::Resize(resize),
                agent.gate_for(pid),
            );
            match attended(&agent, &stream, resize_tx, work).await {
                Some(r) => r,
                None => {
                    tracing::info!("client went away; its command's channel was closed");
                    return Ok(());
                }
            }
        }
        Request::Subsystem(wire)
        | Request::SubsystemOn(wire)
        | Request::SubsystemKind(wire)
        | Request::SubsystemServer(wire) => {
            let (resize_tx, _) = tokio::sync::mpsc::channel(1);
            let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
            let work = exec(
                &agent,
                wire,
                fds,
                Started::Announce(opened_tx),
                agent.gate_for(pid),
            );
            // `Opened` goes to the client while the subsystem runs. The
            // final reply waits for it: the sender goes with `work`, so
            // announcing ends by then, and never halfway through a frame.
            let announce = async {
                if let Ok(opened) = opened_rx.await {
                    let reply = announcement.reply(opened);
                    let frame = agent_wire::encode_reply(&reply);
                    if write_shared(&stream, &frame).await.is_err() {
                        tracing::debug!("could not tell the client its channel is open");
                    }
                }
            };
            let work = async { tokio::join!(work, announce).0 };
            match attended(&agent, &stream, resize_tx, work).await {
                Some(r) => r,
                None => {
                    tracing::info!("client went away; its subsystem's channel was closed");
                    return Ok(());
                }
            }
        }
    };
    stream.write_all(&agent_wire::encode_reply(&reply)).await?;
    stream.flush().await
}

/// Runs `work` (a command or a forwarding) while its client stays: the CLI
/// sends nothing more but window changes, and EOF on its socket means it is
/// gone (killed, Ctrl-C); `None` then, and dropping `work` closes its
/// channel. Counts as activity for the agent's idle timer.
async fn attended(
    agent: &Agent,
    stream: &tokio::net::UnixStream,
    resize: tokio::sync::mpsc::Sender<skiff_engine::WindowSize>,
    work: impl std::future::Future<Output = Reply>,
) -> Option<Reply> {
    agent.active.fetch_add(1, Ordering::SeqCst);
    let reply = tokio::select! {
        reply = work => Some(reply),
        _ = follow_client(stream, resize) => None,
    };
    agent.active.fetch_sub(1, Ordering::SeqCst);
    *agent.last_activity.lock().expect("not poisoned") = Instant::now();
    reply
}

/// Relays window changes the client sends while its command runs, and
/// resolves when the client closes its end of the socket.
async fn follow_client(
    stream: &tokio::net::UnixStream,
    resize: tokio::sync::mpsc::Sender<skiff_engine::WindowSize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
        loop {
            match agent_wire::decode_request(&buf) {
                Ok(Some((Request::WindowChange { cols, rows }, used))) => {
                    buf.drain(..used);
                    let _ = resize.try_send(skiff_engine::WindowSize { cols, rows });
                }
                Ok(Some((other, used))) => {
                    buf.drain(..used);
                    tracing::debug!("ignoring {other:?} during a command");
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("bad message from a client: {e}");
                    return;
                }
            }
        }
    }
}

fn status_text(agent: &Agent) -> String {
    let mut text = format!(
        "skiff agent pid {}, up {}s, {} command(s) running\n",
        std::process::id(),
        agent.started.elapsed().as_secs(),
        agent.active.load(Ordering::SeqCst)
    );
    let conns = agent.pool.connections();
    if conns.is_empty() {
        text.push_str("no connections\n");
    }
    for c in conns {
        text.push_str(&format!(
            "{}  age {}s  open channels {}{}  received {}  sent {}{}{}{}\n",
            c.destination,
            c.age.as_secs(),
            c.open_channels,
            if c.spare { " (+1 spare)" } else { "" },
            human_bytes(c.bytes_received),
            human_bytes(c.bytes_sent),
            c.idle
                .map(|i| format!("  idle {}s", i.as_secs()))
                .unwrap_or_default(),
            c.learned_limit
                .map(|l| format!("  (server limit {l})"))
                .unwrap_or_default(),
            if c.held_up {
                "  (held up by a slow reader: new commands use another connection)"
            } else {
                ""
            }
        ));
    }
    text
}

/// `1234` → `1.2 KiB`, for status lines.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The client's stdin, stdout and stderr, as sent with the request.
fn stdio_fds(fds: Vec<OwnedFd>) -> Result<[OwnedFd; 3], Reply> {
    fds.try_into().map_err(|v: Vec<OwnedFd>| Reply::Failed {
        kind: 5,
        message: format!("expected 3 file descriptors, got {}", v.len()),
    })
}

/// Which reply tells a client that its subsystem's channel is open, by
/// the request it sent.
#[derive(Debug, Clone, Copy)]
enum Announcement {
    /// `Opened` (for `Subsystem`).
    Plain,
    /// `OpenedOn` (for `SubsystemOn`).
    Skiffd,
    /// `OpenedKind` (for `SubsystemKind`).
    Kind,
    /// `OpenedServer` (for `SubsystemServer`).
    Server,
}

impl Announcement {
    fn reply(self, opened: skiff_engine::ChannelOpened) -> Reply {
        use skiff_engine::ServerKind;
        let rtt_us = u64::try_from(opened.rtt.as_micros()).unwrap_or(u64::MAX);
        match self {
            Announcement::Plain => Reply::Opened { rtt_us },
            Announcement::Skiffd => Reply::OpenedOn {
                rtt_us,
                skiffd: opened.server == ServerKind::Skiffd,
            },
            Announcement::Kind => Reply::OpenedKind {
                rtt_us,
                server: opened.server.into(),
            },
            Announcement::Server => Reply::OpenedServer {
                rtt_us,
                server: opened.server.into(),
                data_plane: opened.data_plane,
            },
        }
    }
}

/// What a client's command gets besides its stdio: window changes (`Exec`),
/// or someone to tell when its channel is open (`Subsystem`): how long
/// opening it took, and whether the server is a skiffd.
enum Started {
    Resize(Option<tokio::sync::mpsc::Receiver<skiff_engine::WindowSize>>),
    Announce(tokio::sync::oneshot::Sender<skiff_engine::ChannelOpened>),
}

/// Writes all of `bytes` to a socket that another task reads from.
async fn write_shared(stream: &tokio::net::UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs one command for a client, using the client's stdio fds; a
/// connection made for it passes through `gate`.
async fn exec(
    agent: &Agent,
    wire: ExecWire,
    fds: Vec<OwnedFd>,
    started: Started,
    gate: Arc<Gate>,
) -> Reply {
    let [stdin_fd, stdout_fd, stderr_fd] = match stdio_fds(fds) {
        Ok(a) => a,
        Err(reply) => return reply,
    };
    let settings = match settings_of(&wire, gate) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let req = ExecRequest {
        command: wire.command.clone(),
        subsystem: wire.subsystem,
        env: wire.env.clone(),
        pty: wire.pty.as_ref().map(|p| PtyRequest {
            term: p.term.clone(),
            cols: p.cols,
            rows: p.rows,
            required: p.required,
        }),
        timeout: None,
    };
    let stdout = tokio::fs::File::from_std(std::fs::File::from(stdout_fd));
    let stderr = tokio::fs::File::from_std(std::fs::File::from(stderr_fd));
    // A client whose stdin is /dev/null needs no pump: the command gets EOF
    // at once either way.
    let (stdin, cancel) = if wire.no_stdin || is_dev_null(&stdin_fd) {
        (None, None)
    } else {
        let (reader, cancel) = stdin_pump(stdin_fd);
        (Some(reader), Some(cancel))
    };
    let result = match started {
        Started::Resize(resize) => {
            agent
                .pool
                .exec(&settings, &req, stdin, stdout, stderr, resize)
                .await
        }
        Started::Announce(opened) => {
            agent
                .pool
                .exec_announcing_open(&settings, &req, stdin, stdout, stderr, opened)
                .await
        }
    };
    drop(cancel);
    match result {
        Ok(outcome) => Reply::Exit {
            code: outcome.exit_code(),
        },
        Err(e) => failed(e),
    }
}

/// The client's destination, resolved as the client would, but with
/// `BatchMode=yes` and `ForwardAgent=no` first (first value wins): the
/// agent never prompts, and its shared connections forward no agent. A
/// connection made to it passes through `gate`.
fn settings_of(
    wire: &ExecWire,
    gate: Arc<Gate>,
) -> Result<skiff_engine::ConnectSettings, skiff_engine::SkiffError> {
    // Nor does it forward anyone's ssh-agent over a shared connection.
    let mut options = vec!["BatchMode=yes".to_string(), "ForwardAgent=no".to_string()];
    options.extend(wire.options.iter().cloned());
    let dest = Destination {
        host: wire.host.clone(),
        user: wire.user.clone(),
        port: wire.port,
        identity_files: wire.identity_files.iter().map(PathBuf::from).collect(),
        config_file: wire.config_file.as_ref().map(PathBuf::from),
        options,
    };
    let env = ClientEnv {
        vars: wire.client_env.clone(),
    };
    Resolver::new(dest.config_file.as_deref(), &dest.options, &env)?
        .sharing_pre_auth_gate(gate)
        .resolve(&dest)
}

/// `ssh -O check|stop|exit`: the pool says which of its connections are
/// the destination's, as it does for a command to it.
fn control(agent: &Agent, wire: ControlWire) -> Reply {
    let settings = match settings_of(&wire.base, Arc::default()) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let live = match wire.action {
        ControlAction::Check => agent.pool.live_connections(&settings),
        ControlAction::Stop => {
            let live = agent.pool.forget_destination(&settings);
            tracing::info!(
                "forgot {live} connection(s) to {}@{}:{} as asked",
                settings.user,
                settings.hostname,
                settings.port
            );
            live
        }
    };
    Reply::Controlled {
        live: u32::try_from(live).unwrap_or(u32::MAX),
    }
}

/// `ssh -W` on a pooled connection, with the client's stdin, stdout and
/// stderr (for notices).
async fn forward(agent: &Agent, wire: ForwardWire, fds: Vec<OwnedFd>, gate: Arc<Gate>) -> Reply {
    let [stdin_fd, stdout_fd, stderr_fd] = match stdio_fds(fds) {
        Ok(a) => a,
        Err(reply) => return reply,
    };
    let settings = match settings_of(&wire.base, gate) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let stdout = tokio::fs::File::from_std(std::fs::File::from(stdout_fd));
    let stderr = tokio::fs::File::from_std(std::fs::File::from(stderr_fd));
    let (stdin, cancel) = stdin_pump(stdin_fd);
    let result = agent
        .pool
        .forward_stdio(
            &settings,
            &wire.to_host,
            wire.to_port,
            stdin,
            stdout,
            stderr,
        )
        .await;
    drop(cancel);
    match result {
        Ok(()) => Reply::Exit { code: 0 },
        Err(e) => failed(e),
    }
}

fn failed(e: skiff_engine::SkiffError) -> Reply {
    // A person could settle these: the CLI retries directly, where it may ask.
    if e.needs_person {
        Reply::NeedsUser { message: e.message }
    } else {
        Reply::Failed {
            kind: crate::wire_kind(e.kind),
            message: e.message,
        }
    }
}

/// Runs a fan-out on the pool, streaming each host's output and end to the
/// client as they happen, and answers `Done` at the end. An error means the
/// client went away; dropping the fan-out then closes every running command.
async fn run_fanout(
    agent: &Arc<Agent>,
    wire: RunWire,
    stream: &mut tokio::net::UnixStream,
) -> std::io::Result<Reply> {
    let hosts = match nodeset::parse(&wire.hosts, &|_| None) {
        Ok(h) => h,
        Err(e) => {
            return Ok(Reply::Failed {
                kind: crate::wire_kind(skiff_engine::ErrorKind::Config),
                message: e.to_string(),
            })
        }
    };
    let base = &wire.base;
    let env = ClientEnv {
        vars: base.client_env.clone(),
    };
    let mut options = vec!["BatchMode=yes".to_string()];
    options.extend(base.options.iter().cloned());
    let config_file = base.config_file.as_ref().map(PathBuf::from);
    // A fan-out: under BatchMode it asks nothing either way, and its hosts
    // share one limit on connections a busy server would drop.
    let resolver = match Resolver::new(config_file.as_deref(), &options, &env) {
        Ok(r) => r.for_fan_out(),
        Err(e) => return Ok(failed(e)),
    };
    let targets = fanout::targets(
        &hosts,
        &Destination {
            host: String::new(),
            user: base.user.clone(),
            port: base.port,
            identity_files: base.identity_files.iter().map(PathBuf::from).collect(),
            config_file,
            options,
        },
        &resolver,
    );
    let opts = FanoutOptions {
        parallel: (wire.parallel as usize).max(1),
        connect_rate: (wire.rate_milli > 0).then(|| f64::from(wire.rate_milli) / 1000.0),
        spread: Vec::new(),
    };
    let request = ExecRequest {
        command: base.command.clone(),
        env: base.env.clone(),
        pty: None,
        timeout: (wire.timeout_ms > 0).then(|| Duration::from_millis(wire.timeout_ms)),
        subsystem: false,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(256);
    let run = fanout::run_command(targets, opts, request, Some(agent.pool.clone()), tx);
    tokio::pin!(run);
    let (mut from_client, mut to_client) = stream.split();
    let mut finished = false;
    let mut probe = [0u8; 64];
    loop {
        tokio::select! {
            _ = &mut run, if !finished => finished = true,
            event = rx.recv() => match event {
                Some(event) => {
                    to_client
                        .write_all(&agent_wire::encode_reply(&event_reply(event)))
                        .await?
                }
                None => break,
            },
            // The client sends nothing during a run: data or EOF means it is gone.
            _ = from_client.read(&mut probe) => {
                return Err(std::io::Error::other("client closed the socket"));
            }
        }
    }
    Ok(Reply::Done)
}

fn event_reply(event: RunEvent) -> Reply {
    match event {
        RunEvent::Output { host, stream, data } => Reply::RunOutput {
            host: host as u32,
            stream: match stream {
                Stream::Stdout => 1,
                Stream::Stderr => 2,
            },
            data,
        },
        RunEvent::Notice { host, text } => Reply::RunNotice {
            host: host as u32,
            text,
        },
        RunEvent::Done {
            host,
            result,
            duration,
        } => Reply::RunDone {
            host: host as u32,
            end: match result {
                Ok(ExitOutcome::Status(code)) => HostEnd::Status(code),
                Ok(ExitOutcome::Signal { name, .. }) => HostEnd::Signal(name),
                Ok(ExitOutcome::Unknown) => HostEnd::Unknown,
                Err(e) if e.needs_person => HostEnd::NeedsUser {
                    kind: crate::wire_kind(e.kind),
                    message: e.message,
                },
                Err(e) => HostEnd::Failed {
                    kind: crate::wire_kind(e.kind),
                    message: e.message,
                },
            },
            duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
        },
    }
}

/// True when `fd` is the null device (`< /dev/null`, `-n`, hyperfine, cron).
fn is_dev_null(fd: &OwnedFd) -> bool {
    match nix::sys::stat::fstat(fd) {
        Ok(st) => (st.st_mode & libc::S_IFMT) == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3),
        Err(_) => false,
    }
}

/// Ends the stdin pump when dropped: the pump stops reading at once, so the
/// agent never consumes input meant for whatever reads that fd next.
pub struct CancelPump {
    _write_end: OwnedFd,
}

/// Copies the client's stdin into an in-process pipe from a thread that
/// polls the fd together with a cancel pipe, so it does not change the
/// (shared) file description's blocking mode and stops promptly.
fn stdin_pump(fd: OwnedFd) -> (tokio::io::DuplexStream, CancelPump) {
    let (reader, mut writer) = tokio::io::duplex(256 * 1024);
    let (cancel_r, cancel_w) = nix::unistd::pipe().expect("pipe for the stdin pump");
    let handle = tokio::runtime::Handle::current();
    // A pooled blocking thread: no thread is created per command once warm.
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: cancel_r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on two fds we own, for the array we own.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if fds[1].revents != 0 {
                break; // cancelled: the command is over
            }
            // SAFETY: read into our buffer from a fd we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break; // EOF or error: the remote side sees EOF
            }
            if handle
                .block_on(writer.write_all(&buf[..n as usize]))
                .is_err()
            {
                break;
            }
        }
    });
    (
        reader,
        CancelPump {
            _write_end: cancel_w,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn byte_counts_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }
}
