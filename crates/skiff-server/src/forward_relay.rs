//! skiffd's TCP forwarding, once [`crate::forward_policy`] allowed it:
//! `direct-tcpip` channels (ssh -L, -D, -W and jump hosts) connect to the
//! destination and relay; `tcpip-forward` requests (ssh -R) listen and open
//! a `forwarded-tcpip` channel to the client for every connection accepted.
//!
//! Unix-socket forwarding is the same with paths: `direct-streamlocal`
//! channels connect to a socket and `streamlocal-forward` requests listen
//! on one, both with the account's rights (see [`crate::account_fs`]); a
//! socket made this way is removed with its forwarding.
//!
//! Agent forwarding lives here too: a Unix socket in a private directory
//! that the account owns, each connection to it carried to the client as an
//! `auth-agent@openssh.com` channel.
//!
//! Every task belongs to one SSH connection and ends with it, even when the
//! far end of a relay stays open. What a relay holds on the way, both ways,
//! counts in the connection's queue (see [`crate::channel_io`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use russh::server::{ChannelOpenHandle, Handle, Msg};
use russh::{Channel, ChannelOpenFailure};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::account_fs::{self, Identity, MadeSocket};
use crate::channel_idle::{ChannelClock, ConnectionClocks};
use crate::channel_io::{self, OutputSource};
use crate::channel_timeout::ChannelKind;
use crate::forward_policy::BindTo;
use crate::queue_budget::{ChannelQueue, ConnectionQueue};
use std::sync::Arc;

/// What a relay's channel is counted in: the connection's queue and its
/// channel clocks.
type Books = (Arc<ConnectionQueue>, Arc<ConnectionClocks>);

/// How long a `direct-tcpip` connection attempt may take, per address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The forwardings of one SSH connection.
pub struct Forwards {
    /// Dropped with the connection, which ends every task watching it.
    alive: watch::Sender<()>,
    /// Remote forwardings by the address and port the client asked for.
    listeners: HashMap<(String, u32), Vec<JoinHandle<()>>>,
    /// Remote forwardings from Unix sockets, by path.
    sockets: HashMap<String, SocketListener>,
    /// The forwarded agent's socket, made at the first request.
    agent: Option<AgentSocket>,
    /// The connection's queue, which every relay's bytes count in.
    queue: Arc<ConnectionQueue>,
    /// The connection's channel clocks, which every relay's traffic touches.
    clocks: Arc<ConnectionClocks>,
}

/// A forwarded agent's socket: removed, with its directory, when the
/// connection ends.
struct AgentSocket {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
    task: JoinHandle<()>,
}

impl Drop for AgentSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A Unix socket made for a remote forwarding: its accept loop stops and
/// the file is removed (as the account) when it is cancelled or the
/// connection ends.
struct SocketListener {
    path: std::path::PathBuf,
    made: MadeSocket,
    owner: Identity,
    task: JoinHandle<()>,
}

impl Drop for SocketListener {
    fn drop(&mut self) {
        self.task.abort();
        account_fs::remove_in_background(self.owner.clone(), self.path.clone(), self.made);
    }
}

impl Forwards {
    /// No forwardings yet, on a connection counted in `queue`.
    pub fn new(queue: Arc<ConnectionQueue>, clocks: Arc<ConnectionClocks>) -> Self {
        Forwards {
            clocks,
            alive: watch::channel(()).0,
            listeners: HashMap::new(),
            sockets: HashMap::new(),
            agent: None,
            queue,
        }
    }
}

impl Drop for Forwards {
    fn drop(&mut self) {
        for task in self.listeners.values().flatten() {
            task.abort();
        }
    }
}

/// Runs `work` until it ends or the connection `alive` belongs to is gone.
fn spawn_watched<F>(mut alive: watch::Receiver<()>, work: F) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        tokio::select! {
            _ = work => {}
            _ = alive.changed() => {}
        }
    })
}

impl Forwards {
    /// Connects to `host:port` and, once connected, accepts the channel and
    /// relays between the two; a failed connection rejects the channel. Runs
    /// in the background so that the connection's other channels go on.
    pub fn open(
        &self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        host: String,
        port: u16,
        who: String,
    ) {
        let queue = self.queue.channel(channel.id().into());
        let clocks = self.clocks.clone();
        spawn_watched(self.alive.subscribe(), async move {
            match connect(&host, port).await {
                Ok(tcp) => {
                    tracing::info!("{who}: forwarding to {host} port {port}");
                    reply.accept().await;
                    let clock = clocks.channel(ChannelKind::DirectTcpip, channel.id());
                    relay(channel, tcp, queue, clock).await;
                }
                Err(e) => {
                    tracing::info!("{who}: forwarding to {host} port {port} failed: {e}");
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
    }

    /// Connects to the Unix socket at `path` as the account and, once
    /// connected, accepts the channel and relays; a failed connection
    /// rejects it.
    pub fn open_socket(
        &self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        path: String,
        owner: Identity,
        who: String,
    ) {
        let queue = self.queue.channel(channel.id().into());
        let clocks = self.clocks.clone();
        spawn_watched(self.alive.subscribe(), async move {
            match account_fs::connect(owner, path.clone().into()).await {
                Ok(stream) => {
                    tracing::info!("{who}: forwarding to socket {path:?}");
                    reply.accept().await;
                    let clock = clocks.channel(ChannelKind::DirectStreamlocal, channel.id());
                    relay(channel, stream, queue, clock).await;
                }
                Err(e) => {
                    tracing::info!("{who}: forwarding to socket {path:?} failed: {e}");
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
    }

    /// Makes a listening Unix socket at `path` as the account (mode 0777
    /// less `mask`; an existing socket file replaced only with `unlink`).
    /// Each connection accepted is offered to the client as a
    /// `forwarded-streamlocal@openssh.com` channel naming `path`.
    pub async fn listen_socket(
        &mut self,
        handle: Handle,
        path: &str,
        owner: Identity,
        mask: u32,
        unlink: bool,
    ) -> Result<(), String> {
        if self.sockets.contains_key(path) {
            return Err(format!("{path} is already forwarded"));
        }
        let (listener, made) = account_fs::listen(owner.clone(), path.into(), mask, unlink)
            .await
            .map_err(|e| format!("cannot listen on {path}: {e}"))?;
        let alive = self.alive.subscribe();
        let books = (self.queue.clone(), self.clocks.clone());
        let work = socket_accept_loop(listener, handle, path.to_string(), alive.clone(), books);
        let task = spawn_watched(alive, work);
        self.sockets.insert(
            path.to_string(),
            SocketListener {
                path: path.into(),
                made,
                owner,
                task,
            },
        );
        Ok(())
    }

    /// Stops listening on the socket at `path` and removes it; connections
    /// already forwarded go on. `false` when there was no such forwarding.
    pub fn cancel_socket(&mut self, path: &str) -> bool {
        self.sockets.remove(path).is_some()
    }

    /// Listens for a remote forwarding that the client asked for as
    /// `host:port`, where `bind` says; returns the port (chosen by the
    /// system when `port` is 0). Each connection accepted is offered to the
    /// client as a `forwarded-tcpip` channel naming `host` and that port.
    pub async fn listen(
        &mut self,
        handle: Handle,
        bind: &BindTo,
        host: &str,
        port: u32,
    ) -> Result<u32, String> {
        let key = (host.to_string(), port);
        if self.listeners.contains_key(&key) {
            return Err(format!("{host}:{port} is already forwarded"));
        }
        let requested = u16::try_from(port).map_err(|_| format!("bad port {port}"))?;
        let listeners = bind_listeners(bind, requested).await?;
        let bound = listeners[0]
            .local_addr()
            .map_err(|e| format!("no local address: {e}"))?
            .port();
        let tasks = listeners
            .into_iter()
            .map(|listener| {
                let alive = self.alive.subscribe();
                let work = accept_loop(
                    listener,
                    handle.clone(),
                    host.to_string(),
                    bound,
                    alive.clone(),
                    (self.queue.clone(), self.clocks.clone()),
                );
                spawn_watched(alive, work)
            })
            .collect();
        // A request for port 0 is cancelled by the port that was chosen.
        self.listeners
            .insert((host.to_string(), u32::from(bound)), tasks);
        Ok(u32::from(bound))
    }

    /// The path of the forwarded agent's socket for a login as `uid`/`gid`,
    /// made at the first call: `/tmp/skiff-agent-XXXXXXXX/agent.PID`, the
    /// directory 0700 and the socket 0600, both owned by the account. Each
    /// connection to it becomes an `auth-agent@openssh.com` channel.
    pub fn agent_socket(
        &mut self,
        handle: Handle,
        uid: u32,
        gid: u32,
    ) -> std::io::Result<std::path::PathBuf> {
        if let Some(agent) = &self.agent {
            return Ok(agent.path.clone());
        }
        let dir = nix::unistd::mkdtemp("/tmp/skiff-agent-XXXXXXXX")?;
        let path = dir.join(format!("agent.{}", std::process::id()));
        let made = (|| {
            let listener = tokio::net::UnixListener::bind(&path)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            if nix::unistd::geteuid().is_root() {
                let (u, g) = (
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                );
                nix::unistd::chown(&path, u, g)?;
                nix::unistd::chown(&dir, u, g)?;
            }
            Ok::<_, std::io::Error>(listener)
        })();
        let listener = match made {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        let alive = self.alive.subscribe();
        let books = (self.queue.clone(), self.clocks.clone());
        let work = agent_accept_loop(listener, handle, alive.clone(), books);
        let task = spawn_watched(alive, work);
        self.agent = Some(AgentSocket {
            dir,
            path: path.clone(),
            task,
        });
        Ok(path)
    }

    /// Stops listening for `host:port`; connections already forwarded go
    /// on. `false` when there was no such forwarding.
    pub fn cancel(&mut self, host: &str, port: u32) -> bool {
        match self.listeners.remove(&(host.to_string(), port)) {
            Some(tasks) => {
                tasks.iter().for_each(JoinHandle::abort);
                true
            }
            None => false,
        }
    }
}

/// Connects to the first address of `host:port` that answers.
async fn connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(std::io::ErrorKind::TimedOut.into()),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the name has no addresses")))
}

/// The sockets for a remote forwarding: every one must bind to the same
/// port (the first one's when `port` is 0). Loopback takes ::1 only if
/// the machine has IPv6.
async fn bind_listeners(bind: &BindTo, port: u16) -> Result<Vec<TcpListener>, String> {
    let candidates: Vec<(SocketAddr, bool)> = match bind {
        BindTo::Loopback => vec![
            (SocketAddr::from(([127, 0, 0, 1], port)), true),
            (
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
                false,
            ),
        ],
        // Dual-stack where the kernel offers it; IPv4 alone otherwise.
        BindTo::Everywhere => vec![(
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
            false,
        )],
        BindTo::Address(name) => tokio::net::lookup_host((name.as_str(), port))
            .await
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .map(|a| (a, true))
            .collect(),
    };
    let mut listeners: Vec<TcpListener> = Vec::new();
    let mut first_error = None;
    for (mut addr, required) in candidates {
        if let Some(first) = listeners.first() {
            addr.set_port(first.local_addr().map_err(|e| e.to_string())?.port());
        }
        match TcpListener::bind(addr).await {
            Ok(l) => listeners.push(l),
            Err(e) if required && listeners.is_empty() => {
                return Err(format!("cannot listen on {addr}: {e}"))
            }
            Err(e) => {
                first_error.get_or_insert(format!("cannot listen on {addr}: {e}"));
            }
        }
    }
    if listeners.is_empty() && matches!(bind, BindTo::Everywhere) {
        let v4 = SocketAddr::from(([0, 0, 0, 0], port));
        let l = TcpListener::bind(v4)
            .await
            .map_err(|e| format!("cannot listen on {v4}: {e}"))?;
        listeners.push(l);
    }
    if listeners.is_empty() {
        return Err(first_error.unwrap_or_else(|| "no address to listen on".into()));
    }
    Ok(listeners)
}

/// Offers every connection `listener` accepts to the client.
async fn accept_loop(
    listener: TcpListener,
    handle: Handle,
    host: String,
    port: u16,
    alive: watch::Receiver<()>,
    (queue, clocks): Books,
) {
    loop {
        let (tcp, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait instead of spinning.
                tracing::warn!("remote forwarding {host}:{port}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let handle = handle.clone();
        let host = host.clone();
        let (queue, clocks) = (queue.clone(), clocks.clone());
        // Each relay is its own task, so a slow one holds up no other; it
        // ends with its peer or the connection, and outlives a cancel.
        spawn_watched(alive.clone(), async move {
            let opened = handle
                .channel_open_forwarded_tcpip(
                    host.clone(),
                    u32::from(port),
                    from.ip().to_string(),
                    u32::from(from.port()),
                )
                .await;
            match opened {
                Ok(channel) => {
                    let queue = queue.channel(channel.id().into());
                    let clock = clocks.channel(ChannelKind::ForwardedTcpip, channel.id());
                    relay(channel, tcp, queue, clock).await
                }
                Err(e) => tracing::info!(
                    "remote forwarding {host}:{port}: the client refused a connection from {from}: {e}"
                ),
            }
        });
    }
}

/// Carries every connection `listener` accepts to the client, on the
/// channel `open` opens for it; `what` names the socket in logs.
async fn unix_accept_loop<O, F>(
    listener: tokio::net::UnixListener,
    what: String,
    alive: watch::Receiver<()>,
    (queue, clocks): Books,
    kind: ChannelKind,
    open: O,
) where
    O: Fn() -> F,
    F: std::future::Future<Output = Result<Channel<Msg>, russh::Error>> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("{what}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let opening = open();
        let what = what.clone();
        let (queue, clocks) = (queue.clone(), clocks.clone());
        spawn_watched(alive.clone(), async move {
            match opening.await {
                Ok(channel) => {
                    let queue = queue.channel(channel.id().into());
                    let clock = clocks.channel(kind, channel.id());
                    relay(channel, stream, queue, clock).await
                }
                Err(e) => tracing::info!("{what}: the client refused a connection: {e}"),
            }
        });
    }
}

/// Offers every connection to a forwarded Unix socket to the client.
async fn socket_accept_loop(
    listener: tokio::net::UnixListener,
    handle: Handle,
    path: String,
    alive: watch::Receiver<()>,
    books: Books,
) {
    let what = format!("remote forwarding {path}");
    let kind = ChannelKind::ForwardedStreamlocal;
    unix_accept_loop(listener, what, alive, books, kind, move || {
        let (handle, path) = (handle.clone(), path.clone());
        async move { handle.channel_open_forwarded_streamlocal(path).await }
    })
    .await
}

/// Carries every connection to the agent socket to the client.
async fn agent_accept_loop(
    listener: tokio::net::UnixListener,
    handle: Handle,
    alive: watch::Receiver<()>,
    books: Books,
) {
    unix_accept_loop(
        listener,
        "forwarded agent".into(),
        alive,
        books,
        ChannelKind::AgentConnection,
        move || {
            let handle = handle.clone();
            async move { handle.channel_open_agent().await }
        },
    )
    .await
}

/// A relay's far end: a TCP connection or a Unix socket, split in two.
trait Peer {
    type Read: OutputSource + 'static;
    type Write: tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn into_halves(self) -> (Self::Read, Self::Write);
}

impl Peer for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

impl Peer for tokio::net::UnixStream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

/// Copies both ways until both sides have ended (each end-of-file is passed
/// on as one) or the client closes the channel; then closes the channel.
/// What waits on the way counts in `queue`.
async fn relay<P: Peer>(
    channel: Channel<Msg>,
    peer: P,
    queue: Arc<ChannelQueue>,
    clock: Arc<ChannelClock>,
) {
    use tokio::io::AsyncWriteExt;
    let (mut from_peer, mut to_peer) = peer.into_halves();
    let (reader, writer) = channel.split();
    let (fed, mut inbound_done) = tokio::sync::oneshot::channel::<()>();
    // Client to peer; the peer's write side shut once the client's input ends.
    let input_clock = clock.clone();
    let mut inbound = channel_io::spawn_input(
        reader,
        queue.clone(),
        None,
        input_clock,
        |mut rx| async move {
            while let Some((data, receipt)) = rx.recv().await {
                if let Err(e) = to_peer.write_all(&data).await {
                    tracing::debug!("forwarded connection: writing to its far end: {e}");
                    break;
                }
                drop(receipt);
            }
            let _ = to_peer.shutdown().await;
            let _ = fed.send(());
        },
    );
    // Peer to client; the channel's end of file once the peer's data ends.
    let outbound = async {
        let mut to_client = writer.make_writer();
        channel_io::forward_output(&mut from_peer, &mut to_client, None, &queue, &clock).await;
        let _ = writer.eof().await;
    };
    tokio::pin!(outbound);
    let (mut out_done, mut in_done) = (false, false);
    while !(out_done && in_done) {
        tokio::select! {
            _ = &mut outbound, if !out_done => out_done = true,
            _ = &mut inbound_done, if !in_done => in_done = true,
            // The client closed the channel (or the connection ended).
            _ = &mut inbound => break,
        }
    }
    inbound.abort();
    let _ = writer.close().await;
}
