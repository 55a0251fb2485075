//! Port forwarding over one connection, as `ssh -L`, `-R` and `-D` do:
//! local listeners whose connections the server makes (`direct-tcpip`,
//! `direct-streamlocal`), a SOCKS 4/5 listener that learns the destination
//! from each client (`skiff_proto::socks`), and listeners on the server
//! (TCP ports or Unix sockets) whose connections come back as
//! `forwarded-tcpip` or `forwarded-streamlocal` channels that skiff
//! connects onward, to a fixed destination or, for `-R port` alone, to
//! where each connection's SOCKS request says.
//!
//! Every forwarded connection is counted, so that the program can wait for
//! those still open before it exits, as ssh does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::Msg;
use russh::{Channel, ChannelOpenFailure};
use skiff_proto::forward_spec::{ConnectEnd, ForwardSpec, Listen, ListenEnd};
use skiff_proto::{socks, terminal_text};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::{Connection, ErrorKind, SkiffError};

/// Relay buffer size in each direction.
const RELAY_BUFFER: usize = 64 * 1024;
/// How long a SOCKS client has to say where it wants to go.
const SOCKS_HANDSHAKE: Duration = Duration::from_secs(30);
/// How long connecting onward for a remote forwarding may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// Forwarded connections still open.
#[derive(Default)]
pub struct OpenCount {
    open: AtomicUsize,
    changed: Notify,
}

/// Held while a forwarded connection is open.
struct OpenGuard(Arc<OpenCount>);

impl OpenCount {
    fn enter(self: &Arc<Self>) -> OpenGuard {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(self.clone())
    }

    /// Waits until no forwarded connection is open.
    pub async fn idle(&self) {
        loop {
            let changed = self.changed.notified();
            if self.open.load(Ordering::SeqCst) == 0 {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// Where the server listens for a remote forwarding, as asked (and, for
/// port 0, the port it chose).
enum RemoteListen {
    Tcp {
        address: String,
        requested_port: u32,
        bound_port: u32,
    },
    Unix(String),
}

/// A remote forwarding the server agreed to (or is being asked for): where
/// it listens and where its connections go.
struct RemoteEntry {
    listen: RemoteListen,
    to: Target,
}

/// The remote forwardings of one connection, shared with its russh handler,
/// which receives their connections.
#[derive(Default)]
pub struct RemoteForwards {
    entries: Mutex<Vec<RemoteEntry>>,
    pub(crate) open: Arc<OpenCount>,
}

impl RemoteForwards {
    /// Where a channel for the listener `matches` picks should go.
    fn target(&self, matches: impl Fn(&RemoteListen) -> bool) -> Option<Target> {
        let entries = self.entries.lock().expect("not poisoned");
        entries
            .iter()
            .find(|e| matches(&e.listen))
            .map(|e| e.to.clone())
    }

    fn add(&self, listen: RemoteListen, to: Target) {
        let mut entries = self.entries.lock().expect("not poisoned");
        entries.push(RemoteEntry { listen, to });
    }

    fn remove(&self, matches: impl Fn(&RemoteListen) -> bool) {
        let mut entries = self.entries.lock().expect("not poisoned");
        entries.retain(|e| !matches(&e.listen));
    }

    /// Takes a `forwarded-tcpip` channel the server opened for a listener
    /// on `address:port`; refuses one for a forwarding never asked for.
    /// A server may name the port it chose, or the 0 that was asked for.
    pub(crate) fn incoming(
        self: &Arc<Self>,
        channel: Channel<Msg>,
        address: &str,
        port: u32,
        origin: String,
        reply: russh::client::ChannelOpenHandle,
    ) {
        let to = self.target(|l| match l {
            RemoteListen::Tcp {
                address: a,
                requested_port,
                bound_port,
            } => a == address && (*bound_port == port || *requested_port == port),
            RemoteListen::Unix(_) => false,
        });
        // Both come from the server and end up in messages.
        let origin = terminal_text::one_line(&origin).into_owned();
        match to {
            Some(to) => self.serve(channel, to, origin, reply),
            None => refuse_unasked(reply, &format!("{address}:{port}")),
        }
    }

    /// Takes a `forwarded-streamlocal` channel the server opened for its
    /// socket at `path`; refuses one for a forwarding never asked for.
    pub(crate) fn incoming_socket(
        self: &Arc<Self>,
        channel: Channel<Msg>,
        path: &str,
        reply: russh::client::ChannelOpenHandle,
    ) {
        let to = self.target(|l| matches!(l, RemoteListen::Unix(p) if p == path));
        match to {
            Some(to) => self.serve(channel, to, format!("a connection to {path}"), reply),
            None => refuse_unasked(reply, path),
        }
    }

    /// Connects onward (to the fixed destination, or where the SOCKS
    /// request on the channel says), then relays.
    fn serve(
        self: &Arc<Self>,
        channel: Channel<Msg>,
        to: Target,
        origin: String,
        reply: russh::client::ChannelOpenHandle,
    ) {
        let guard = self.open.enter();
        tokio::spawn(async move {
            let _guard = guard;
            match to {
                Target::Fixed(to) => match connect_here(&to).await {
                    Ok(stream) => {
                        reply.accept().await;
                        relay_stream(channel.into_stream(), stream).await;
                    }
                    Err(e) => {
                        eprintln!(
                            "skiff: remote forwarding: connecting to {to} for {origin} failed: {e}"
                        );
                        reply.reject(ChannelOpenFailure::ConnectFailed).await;
                    }
                },
                Target::Socks => {
                    reply.accept().await;
                    let who = format!("remote dynamic forwarding for {origin}");
                    socks_serve(channel.into_stream(), &who, |request| {
                        let to = ConnectEnd::Tcp(request.host.clone(), request.port);
                        async move { connect_here(&to).await.map_err(|e| e.to_string()) }
                    })
                    .await;
                }
            }
        });
    }
}

/// Refuses a channel for a listener skiff never asked the server for.
fn refuse_unasked(reply: russh::client::ChannelOpenHandle, what: &str) {
    tracing::warn!(
        "the server offered a connection for {}, which was never forwarded; refused",
        terminal_text::one_line(what)
    );
    tokio::spawn(reply.reject(ChannelOpenFailure::AdministrativelyProhibited));
}

/// Connects from here to `to`, within [`CONNECT_TIMEOUT`].
async fn connect_here(to: &ConnectEnd) -> std::io::Result<Box<dyn Stream>> {
    let connecting = async {
        Ok::<Box<dyn Stream>, std::io::Error>(match to {
            ConnectEnd::Tcp(host, port) => {
                let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
            ConnectEnd::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
        })
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// An `auth-agent@openssh.com` channel the server opened for a session
/// that asked for agent forwarding: connected to the local agent at
/// `socket`, then relayed; refused when the agent cannot be reached.
pub(crate) fn forwarded_agent(
    channel: Channel<Msg>,
    socket: std::path::PathBuf,
    reply: russh::client::ChannelOpenHandle,
) {
    tokio::spawn(async move {
        match tokio::net::UnixStream::connect(&socket).await {
            Ok(mut agent) => {
                reply.accept().await;
                let mut channel = channel.into_stream();
                let _ = tokio::io::copy_bidirectional(&mut agent, &mut channel).await;
            }
            Err(e) => {
                tracing::warn!("forwarded agent: cannot reach {}: {e}", socket.display());
                reply.reject(ChannelOpenFailure::ConnectFailed).await;
            }
        }
    });
}

/// The forwardings set up on a connection; [`Forwarding::finish`] stops
/// listening and waits for the connections still open.
pub struct Forwarding {
    listeners: Vec<JoinHandle<()>>,
    /// Unix sockets made for local forwardings, removed at the end.
    sockets: Vec<std::path::PathBuf>,
    open: Arc<OpenCount>,
}

impl Forwarding {
    /// Stops accepting and waits until every forwarded connection (local,
    /// dynamic and remote) has closed.
    pub async fn finish(self) {
        for l in &self.listeners {
            l.abort();
        }
        self.open.idle().await;
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for path in &self.sockets {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// How local forwardings listen.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// `GatewayPorts`: listeners without a bind address listen on every
    /// address.
    pub gateway_ports: bool,
    /// `StreamLocalBindMask`: mode bits a Unix socket does not get.
    pub bind_mask: u32,
    /// `StreamLocalBindUnlink`: replace an existing socket file.
    pub bind_unlink: bool,
}

impl ListenOptions {
    pub fn from_settings(s: &crate::settings::ConnectSettings) -> ListenOptions {
        ListenOptions {
            gateway_ports: s.gateway_ports,
            bind_mask: s.stream_local_bind_mask,
            bind_unlink: s.stream_local_bind_unlink,
        }
    }
}

/// Sets up `specs` on `conn`. A forwarding that cannot be set up gives an
/// error naming it, in `failures`; the others go on (the caller decides,
/// per `ExitOnForwardFailure`, whether that ends the program). Messages
/// for the person (a port the server chose) are returned in `notices`.
/// Through a connection whose host key is not the known one (let through
/// by `StrictHostKeyChecking no`), nothing is forwarded, and that is one
/// failure, as in ssh.
pub async fn start(
    conn: &Arc<Connection>,
    specs: &[ForwardSpec],
    options: ListenOptions,
) -> (Forwarding, Vec<SkiffError>, Vec<String>) {
    let gateway_ports = options.gateway_ports;
    let open = conn.remote_forwards.open.clone();
    let mut forwarding = Forwarding {
        listeners: Vec::new(),
        sockets: Vec::new(),
        open: open.clone(),
    };
    let mut failures = Vec::new();
    let mut notices = Vec::new();
    if !conn.allows_forwarding() {
        if !specs.is_empty() {
            // A failure: `ExitOnForwardFailure` then ends the program, as
            // in ssh; otherwise it is a warning and the session goes on.
            failures.push(SkiffError::new(
                ErrorKind::Connect,
                "port forwarding is disabled to avoid man-in-the-middle attacks \
                 (the host key is not the one known for this host)",
            ));
        }
        return (forwarding, failures, notices);
    }
    for spec in specs {
        let failed = |why: String| SkiffError::new(ErrorKind::Connect, format!("{spec}: {why}"));
        match spec {
            ForwardSpec::Local { listen, host, port } => match bind(listen, gateway_ports).await {
                Ok(sockets) => {
                    for socket in sockets {
                        let target = Target::Fixed(ConnectEnd::Tcp(host.clone(), *port));
                        forwarding.listeners.push(tokio::spawn(accept_loop(
                            Listener::Tcp(socket),
                            conn.clone(),
                            target,
                            open.clone(),
                        )));
                    }
                }
                Err(e) => failures.push(failed(e)),
            },
            ForwardSpec::Dynamic { listen } => match bind(listen, gateway_ports).await {
                Ok(sockets) => {
                    for socket in sockets {
                        forwarding.listeners.push(tokio::spawn(accept_loop(
                            Listener::Tcp(socket),
                            conn.clone(),
                            Target::Socks,
                            open.clone(),
                        )));
                    }
                }
                Err(e) => failures.push(failed(e)),
            },
            ForwardSpec::LocalUnix { from, to } => {
                let listeners = match from {
                    ListenEnd::Tcp(listen) => bind(listen, gateway_ports)
                        .await
                        .map(|l| l.into_iter().map(Listener::Tcp).collect::<Vec<_>>()),
                    ListenEnd::Unix(path) => bind_unix(path, options).map(|l| {
                        forwarding.sockets.push(std::path::PathBuf::from(path));
                        vec![Listener::Unix(l)]
                    }),
                };
                match listeners {
                    Ok(listeners) => {
                        for socket in listeners {
                            forwarding.listeners.push(tokio::spawn(accept_loop(
                                socket,
                                conn.clone(),
                                Target::Fixed(to.clone()),
                                open.clone(),
                            )));
                        }
                    }
                    Err(e) => failures.push(failed(e)),
                }
            }
            ForwardSpec::Remote { listen, host, port } => {
                let to = Target::Fixed(ConnectEnd::Tcp(host.clone(), *port));
                let asked = listen_remote_tcp(conn, listen, to).await.map_err(failed);
                let announced = format!("remote forward to {host}:{port}");
                record_remote(asked, &announced, &mut notices, &mut failures);
            }
            ForwardSpec::RemoteDynamic { listen } => {
                let asked = listen_remote_tcp(conn, listen, Target::Socks)
                    .await
                    .map_err(failed);
                record_remote(asked, "remote SOCKS proxy", &mut notices, &mut failures);
            }
            ForwardSpec::RemoteUnix { from, to } => {
                let target = Target::Fixed(to.clone());
                let asked = match from {
                    ListenEnd::Tcp(listen) => listen_remote_tcp(conn, listen, target).await,
                    ListenEnd::Unix(path) => listen_remote_socket(conn, path, target)
                        .await
                        .map(|()| None),
                };
                let announced = format!("remote forward to {to}");
                record_remote(
                    asked.map_err(failed),
                    &announced,
                    &mut notices,
                    &mut failures,
                );
            }
        }
    }
    (forwarding, failures, notices)
}

/// Records what came of asking the server to listen: the port it chose
/// for 0 is announced ("Allocated port N for `announced`"), a refusal is a
/// failure.
fn record_remote(
    asked: Result<Option<u32>, SkiffError>,
    announced: &str,
    notices: &mut Vec<String>,
    failures: &mut Vec<SkiffError>,
) {
    match asked {
        Ok(Some(bound)) => notices.push(format!("Allocated port {bound} for {announced}")),
        Ok(None) => {}
        Err(e) => failures.push(e),
    }
}

/// Asks the server to listen on `listen` (as ssh: no address means
/// loopback on the server, `*` every address; the server's GatewayPorts
/// has the last word) for connections that go `to`. Returns the port the
/// server chose when 0 was asked for.
async fn listen_remote_tcp(
    conn: &Connection,
    listen: &Listen,
    to: Target,
) -> Result<Option<u32>, String> {
    let address = match listen.bind.as_deref() {
        None => "localhost".to_string(),
        Some("*") => String::new(),
        Some(a) => a.to_string(),
    };
    let requested = u32::from(listen.port);
    // Registered first: the server may send a connection before its reply.
    let forwards = &conn.remote_forwards;
    forwards.add(
        RemoteListen::Tcp {
            address: address.clone(),
            requested_port: requested,
            bound_port: requested,
        },
        to,
    );
    let this_one = |l: &RemoteListen| {
        matches!(l, RemoteListen::Tcp { address: a, requested_port, bound_port }
            if *a == address && *requested_port == requested && *bound_port == requested)
    };
    match conn.handle.tcpip_forward(address.clone(), requested).await {
        Ok(bound) if requested == 0 => {
            let mut entries = forwards.entries.lock().expect("not poisoned");
            if let Some(RemoteListen::Tcp { bound_port, .. }) = entries
                .iter_mut()
                .map(|e| &mut e.listen)
                .find(|l| this_one(l))
            {
                *bound_port = bound;
            }
            Ok(Some(bound))
        }
        Ok(_) => Ok(None),
        Err(e) => {
            forwards.remove(this_one);
            Err(format!(
                "the server refused to listen on port {}: {e}",
                listen.port
            ))
        }
    }
}

/// Asks the server to listen on a Unix socket at `path` for connections
/// that go `to`.
async fn listen_remote_socket(conn: &Connection, path: &str, to: Target) -> Result<(), String> {
    let forwards = &conn.remote_forwards;
    let this_one = |l: &RemoteListen| matches!(l, RemoteListen::Unix(p) if p == path);
    if forwards.target(this_one).is_some() {
        return Err(format!("{path} is already forwarded"));
    }
    forwards.add(RemoteListen::Unix(path.to_string()), to);
    match conn.handle.streamlocal_forward(path).await {
        Ok(()) => Ok(()),
        Err(e) => {
            forwards.remove(this_one);
            Err(format!("the server refused to listen on {path}: {e}"))
        }
    }
}

/// Where a forwarded connection goes.
#[derive(Clone)]
enum Target {
    Fixed(ConnectEnd),
    /// Each client says, in a SOCKS handshake.
    Socks,
}

/// A local listening socket, TCP or Unix.
enum Listener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

/// A connection accepted by a [`Listener`].
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Listener {
    /// The next connection and where it comes from (a Unix socket's
    /// connections are reported to the server as 127.0.0.1 port 0).
    async fn accept(&self) -> std::io::Result<(Box<dyn Stream>, SocketAddr)> {
        match self {
            Listener::Tcp(l) => {
                let (tcp, from) = l.accept().await?;
                let _ = tcp.set_nodelay(true);
                Ok((Box::new(tcp), from))
            }
            Listener::Unix(l) => {
                let (unix, _) = l.accept().await?;
                Ok((Box::new(unix), SocketAddr::from(([127, 0, 0, 1], 0))))
            }
        }
    }
}

/// A Unix socket for a local forwarding, its mode 0777 less
/// `StreamLocalBindMask` (0600 by default). An existing file is replaced
/// only under `StreamLocalBindUnlink`, and only if it is a socket.
fn bind_unix(path: &str, options: ListenOptions) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    if options.bind_unlink {
        let existing = std::fs::symlink_metadata(path);
        if existing.is_ok_and(|m| m.file_type().is_socket()) {
            std::fs::remove_file(path).map_err(|e| format!("cannot remove {path}: {e}"))?;
        }
    }
    // The mask applies from the moment the socket exists: no window in
    // which the process umask's mode lets others connect.
    let owned = path.to_string();
    let listener = skiff_files::with_private_umask(options.bind_mask, move || {
        let l = std::os::unix::net::UnixListener::bind(owned)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .map_err(|e| format!("cannot listen on {path}: {e}"))?;
    tokio::net::UnixListener::from_std(listener)
        .map_err(|e| format!("cannot listen on {path}: {e}"))
}

/// The sockets for a local listener: loopback (127.0.0.1 and, where the
/// machine has it, ::1) by default, every address for `*` or an empty bind
/// address (or no bind address under `GatewayPorts yes`), else the
/// addresses `bind` names. With port 0 the first socket's port is used for
/// the rest.
async fn bind(listen: &Listen, gateway_ports: bool) -> Result<Vec<TcpListener>, String> {
    let addresses: Vec<SocketAddr> = match listen.bind.as_deref() {
        None if !gateway_ports => loopback(listen.port),
        Some("localhost") => loopback(listen.port),
        None | Some("") | Some("*") => vec![
            SocketAddr::from(([0, 0, 0, 0], listen.port)),
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, listen.port)),
        ],
        Some(name) => tokio::net::lookup_host((name, listen.port))
            .await
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .collect(),
    };
    let mut sockets: Vec<TcpListener> = Vec::new();
    let mut first_error = None;
    for mut addr in addresses {
        if let Some(first) = sockets.first() {
            addr.set_port(first.local_addr().map_err(|e| e.to_string())?.port());
        }
        let socket = if addr.is_ipv6() {
            // IPv6 only, so that it does not clash with the IPv4 socket.
            tokio::net::TcpSocket::new_v6().and_then(|s| {
                socket2::SockRef::from(&s).set_only_v6(true)?;
                s.set_reuseaddr(true)?;
                s.bind(addr)?;
                s.listen(128)
            })
        } else {
            tokio::net::TcpSocket::new_v4().and_then(|s| {
                s.set_reuseaddr(true)?;
                s.bind(addr)?;
                s.listen(128)
            })
        };
        match socket {
            Ok(s) => sockets.push(s),
            Err(e) => {
                first_error.get_or_insert(format!("cannot listen on {addr}: {e}"));
            }
        }
    }
    if sockets.is_empty() {
        return Err(first_error.unwrap_or_else(|| "no address to listen on".into()));
    }
    Ok(sockets)
}

fn loopback(port: u16) -> Vec<SocketAddr> {
    vec![
        SocketAddr::from(([127, 0, 0, 1], port)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
    ]
}

async fn accept_loop(
    socket: Listener,
    conn: Arc<Connection>,
    target: Target,
    open: Arc<OpenCount>,
) {
    loop {
        let (stream, from) = match socket.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("forwarding: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let guard = open.enter();
        let conn = conn.clone();
        let target = target.clone();
        tokio::spawn(async move {
            let _guard = guard;
            match target {
                Target::Fixed(to) => forward_one(&conn, stream, from, &to).await,
                Target::Socks => socks_one(&conn, stream, from).await,
            }
        });
    }
}

/// Opens a `direct-tcpip` channel to `host:port` for `from`.
async fn open_direct(
    conn: &Connection,
    from: SocketAddr,
    host: &str,
    port: u16,
) -> Result<Channel<Msg>, russh::Error> {
    conn.handle
        .channel_open_direct_tcpip(
            host,
            u32::from(port),
            from.ip().to_string(),
            u32::from(from.port()),
        )
        .await
}

async fn forward_one(
    conn: &Connection,
    stream: Box<dyn Stream>,
    from: SocketAddr,
    to: &ConnectEnd,
) {
    let opened = match to {
        ConnectEnd::Tcp(host, port) => open_direct(conn, from, host, *port).await,
        ConnectEnd::Unix(path) => {
            conn.handle
                .channel_open_direct_streamlocal(path.as_str())
                .await
        }
    };
    match opened {
        Ok(channel) => relay_stream(channel.into_stream(), stream).await,
        Err(e) => eprintln!("skiff: forwarding {from} to {to}: {}", open_failure(&e)),
    }
}

/// The server's reason for refusing a channel, as ssh words it.
fn open_failure(e: &russh::Error) -> String {
    match e {
        russh::Error::ChannelOpenFailure(reason) => {
            format!(
                "the server refused: {}",
                crate::stdio_forward::refusal_text(reason)
            )
        }
        other => format!("{other}"),
    }
}

/// Reads one handshake message with `parse`, keeping any bytes after it.
async fn read_message<S, T>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    parse: fn(&[u8]) -> socks::Parsed<T>,
) -> Result<T, Option<socks::SocksError>>
where
    S: AsyncRead + Unpin,
{
    loop {
        match parse(buf) {
            Ok(Some((value, used))) => {
                buf.drain(..used);
                return Ok(value);
            }
            Ok(None) => {}
            Err(e) => return Err(Some(e)),
        }
        let mut chunk = [0u8; 512];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The SOCKS side of one connection: the request, then a `direct-tcpip`
/// channel to where it asks.
async fn socks_handshake<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<socks::Request, (u8, Option<socks::SocksError>)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match read_message(stream, buf, socks::parse_opening).await {
        Ok(socks::Opening::Socks4(request)) => Ok(request),
        Ok(socks::Opening::Socks5 { no_auth_offered }) => {
            let _ = stream
                .write_all(&socks::method_reply(no_auth_offered))
                .await;
            if !no_auth_offered {
                return Err((0, Some(socks::SocksError::Malformed("no usable method"))));
            }
            read_message(stream, buf, socks::parse_socks5_request)
                .await
                .map_err(|e| (5, e))
        }
        Err(e) => Err((0, e)),
    }
}

/// Serves one SOCKS client on `client`: reads its request, connects with
/// `open`, answers, then relays (bytes the client sent after its request
/// go first). `who` names the forwarding in messages.
async fn socks_serve<C, O, F, T>(mut client: C, who: &str, open: O)
where
    C: AsyncRead + AsyncWrite + Unpin,
    O: FnOnce(&socks::Request) -> F,
    F: std::future::Future<Output = Result<T, String>>,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let handshake =
        tokio::time::timeout(SOCKS_HANDSHAKE, socks_handshake(&mut client, &mut buf)).await;
    let request = match handshake {
        Ok(Ok(r)) => r,
        Ok(Err((version, error))) => {
            if version != 0 {
                let _ = client
                    .write_all(&socks::failure_reply(version, error.as_ref()))
                    .await;
            }
            if let Some(e) = error {
                eprintln!("skiff: {who}: {e}");
            }
            return;
        }
        Err(_) => {
            eprintln!("skiff: {who}: no SOCKS request within {SOCKS_HANDSHAKE:?}");
            return;
        }
    };
    match open(&request).await {
        Ok(mut target) => {
            if client
                .write_all(&socks::success_reply(request.version))
                .await
                .is_err()
            {
                return;
            }
            if !buf.is_empty() && target.write_all(&buf).await.is_err() {
                return;
            }
            relay_stream(target, client).await;
        }
        Err(why) => {
            let _ = client
                .write_all(&socks::failure_reply(request.version, None))
                .await;
            eprintln!(
                "skiff: {who} to {} port {}: {}",
                terminal_text::one_line(&request.host),
                request.port,
                terminal_text::one_line(&why)
            );
        }
    }
}

/// A local SOCKS client: each request becomes a `direct-tcpip` channel.
async fn socks_one(conn: &Connection, client: Box<dyn Stream>, from: SocketAddr) {
    let who = format!("dynamic forwarding for {from}");
    socks_serve(client, &who, |request| {
        let (host, port) = (request.host.clone(), request.port);
        async move {
            open_direct(conn, from, &host, port)
                .await
                .map(Channel::into_stream)
                .map_err(|e| open_failure(&e))
        }
    })
    .await
}

/// Copies both ways until both sides have ended, each end of file passed
/// on; a channel closes when its stream is dropped.
async fn relay_stream<C, S>(mut channel: C, mut tcp: S)
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    if let Err(e) =
        tokio::io::copy_bidirectional_with_sizes(&mut channel, &mut tcp, RELAY_BUFFER, RELAY_BUFFER)
            .await
    {
        tracing::debug!("forwarded connection ended: {e}");
    }
}
