//! Opening an authenticated SSH connection: the way to the server (see
//! [`crate::transport`]), key exchange with skiff's algorithm policy,
//! host-key verification, keepalives, then public-key authentication.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use russh::client::{self, Handle};
use russh::keys::{Algorithm, PublicKeyOrCertificate};
use russh::{cipher, kex, mac, Preferred, SshId};

use crate::error::{ErrorKind, SkiffError};
use crate::hostkeys::{CertificateCheck, HostKeyTrust, KnownHosts};
use crate::identity;
use crate::port_forward::RemoteForwards;
use crate::server_id::{recording, ServerId};
use crate::settings::{ConnectSettings, Proxy};

/// Largest channel data packet we accept: large packets cost fewer
/// messages per byte (russh warns above 65535).
const MAX_PACKET: u32 = 65535;

/// The cap on channel receive windows: `SKIFF_MAX_WINDOW` (e.g. `128M`),
/// else 64 MiB.
pub(crate) fn max_window() -> u32 {
    std::env::var("SKIFF_MAX_WINDOW")
        .ok()
        .and_then(|v| skiff_proto::window::parse_size(&v))
        .unwrap_or(skiff_proto::window::DEFAULT_MAX_WINDOW)
}

/// An authenticated connection.
pub struct Connection {
    pub(crate) handle: Handle<ClientHandler>,
    pub settings: ConnectSettings,
    /// Warnings from connecting that the person should see, such as
    /// "Permanently added ..." for a newly recorded host key.
    pub notices: Vec<String>,
    /// The server address the connection reached (where data-plane
    /// streams go).
    pub peer_addr: Option<std::net::SocketAddr>,
    /// The server's identification line.
    pub server_id: ServerId,
    /// Remote port forwardings (`ssh -R`), which the handler serves.
    pub(crate) remote_forwards: Arc<RemoteForwards>,
    /// How the connection ended, once it has.
    ending: EndWatch,
    /// Whether an `UpdateHostKeys` update is in flight.
    host_keys: crate::host_key_update::Settled,
}

/// Whether a connection has ended, as its handler saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    Open,
    /// Ended, with the reason of the server's disconnect message if one
    /// came (made safe for a terminal).
    Closed(Option<String>),
    /// Ended by an error on our side of the connection: what went wrong.
    Broken(String),
}

impl Connection {
    /// Whether ports may be forwarded through this connection: not when
    /// its host key is not the one known for the host, even though
    /// `StrictHostKeyChecking no` let it through (as ssh).
    pub fn allows_forwarding(&self) -> bool {
        !self.settings.host_key_mismatched
    }

    /// The watch on how this connection ends, for a caller that saw it
    /// fail, or a channel of it.
    pub(crate) fn end_watch(&self) -> EndWatch {
        self.ending.clone()
    }

    /// Asks for a new key exchange now (ssh's `~R`).
    pub async fn rekey(&self) -> Result<(), SkiffError> {
        self.handle.rekey_soon().await.map_err(|e| {
            SkiffError::new(
                ErrorKind::Protocol,
                format!("cannot start a new key exchange: {e}"),
            )
        })
    }

    /// Returns once no `UpdateHostKeys` update of known_hosts is in flight
    /// on this connection (the server's proof awaited, the file written),
    /// or after [`crate::host_key_update::SETTLE_WAIT`]: a command that
    /// ends quickly does not cut short what its connection learnt.
    pub async fn host_keys_settled(&self) {
        self.host_keys.wait().await;
    }

    /// Ends the connection as ssh does: `SSH_MSG_DISCONNECT` ("by
    /// application"), then the socket's write side closed. Waits until
    /// that has gone out (local work, no round trip), so a process that
    /// exits next does not cut it short; the server then logs a client
    /// that left rather than one that vanished mid-connection. Gives up
    /// after [`GOODBYE_WAIT`] in all: on a frozen path the session may
    /// take no message at all (its queue full, its writes stuck).
    pub async fn goodbye(&self) {
        let said_and_gone = async {
            let said = self
                .handle
                .disconnect(russh::Disconnect::ByApplication, "", "en")
                .await;
            if said.is_ok() {
                let mut ending = self.ending.0.clone();
                let _ = ending.wait_for(|e| *e != Ending::Open).await;
            }
        };
        let _ = tokio::time::timeout(GOODBYE_WAIT, said_and_gone).await;
    }

    /// Returns once the connection has ended (the server closed it, or
    /// keepalives found it dead).
    pub async fn closed(&self) {
        while !self.handle.is_closed() {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

/// How a connection ended, as its handler saw it (cheap to clone; what a
/// channel of the connection keeps to explain its own end).
#[derive(Clone)]
pub(crate) struct EndWatch(tokio::sync::watch::Receiver<Ending>);

/// How long [`Connection::goodbye`] waits for its disconnect message to go
/// out.
const GOODBYE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a caller that saw the connection fail waits for its handler to
/// learn how it ended.
const END_NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl EndWatch {
    /// How the connection ended, for the person, once it has (waiting at
    /// most [`END_NOTICE_WAIT`]): the server's reason when it sent one, or
    /// what broke it on our side; `None` when neither is known.
    pub(crate) async fn described(&self) -> Option<String> {
        let mut ending = self.0.clone();
        let waited = tokio::time::timeout(END_NOTICE_WAIT, ending.wait_for(|e| *e != Ending::Open));
        let ended = waited.await.ok()?.ok()?.clone();
        match ended {
            Ending::Closed(Some(reason)) => {
                Some(format!("the server closed the connection: {reason}"))
            }
            Ending::Broken(why) => Some(format!("connection lost: {why}")),
            _ => None,
        }
    }
}

/// What a connection that ended with `e` is said to have died of: a
/// packet that failed its integrity check in ssh's words ("Corrupted MAC
/// on input"), as it tells of a path that alters bytes.
fn broken_by(e: &russh::Error) -> String {
    match e {
        russh::Error::PacketAuth | russh::Error::DecryptionError => {
            "Corrupted MAC on input (a packet failed its integrity check)".into()
        }
        other => other.to_string(),
    }
}

/// russh client callbacks: host-key verification.
pub struct ClientHandler {
    settings: ConnectSettings,
    known_hosts: Arc<KnownHosts>,
    /// Why the host key was refused, for the error message.
    refusal: Arc<Mutex<Option<SkiffError>>>,
    /// The key types the host-key algorithms were ordered by, when some
    /// hashed entries were left out of that order (see
    /// [`KnownHosts::preferred_key_types`]).
    partial_order: Option<Vec<String>>,
    /// Set when the key exchange should be done again with every known type
    /// first ([`KnownHosts::order_missed_a_type`]).
    order_again: Arc<AtomicBool>,
    /// Set when the host key is not the one known for the host and
    /// `StrictHostKeyChecking no` let it through
    /// ([`crate::hostkeys::HostKeyTrust::Mismatched`]).
    mismatched: Arc<AtomicBool>,
    /// Where the server's `forwarded-tcpip` channels go.
    remote_forwards: Arc<RemoteForwards>,
    /// Told when the connection ends (see [`EndWatch::described`]).
    ending: tokio::sync::watch::Sender<Ending>,
    /// `UpdateHostKeys`: the server's announced host keys.
    update: crate::host_key_update::Updater,
}

impl client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn disconnected(
        &mut self,
        reason: client::DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        match reason {
            client::DisconnectReason::ReceivedDisconnect(info) => {
                let text = info.message.replace("\r\n", "\n");
                let text = text.trim_end();
                let shown = (!text.is_empty())
                    .then(|| skiff_proto::terminal_text::lines(text).into_owned());
                self.ending.send_replace(Ending::Closed(shown));
                Ok(())
            }
            client::DisconnectReason::Error(e) => {
                self.ending.send_replace(Ending::Broken(broken_by(&e)));
                Err(e)
            }
        }
    }

    async fn openssh_ext_host_keys_announced(
        &mut self,
        keys: Vec<russh::keys::PublicKey>,
        session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.update
            .announced(&self.settings, &self.known_hosts, keys, session);
        Ok(())
    }

    async fn auth_banner(
        &mut self,
        banner: &str,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        // Shown as ssh shows it, unless notices are off (LogLevel QUIET,
        // FATAL, ERROR). The server's text must not drive the terminal:
        // control characters other than newlines and tabs are shown escaped
        // (a CRLF line end is only a line end).
        if self.settings.show_notices {
            let text = banner.replace("\r\n", "\n");
            let shown = skiff_proto::terminal_text::lines(text.trim_end_matches('\n'));
            self.known_hosts.notice(shown.into_owned());
        }
        Ok(())
    }

    async fn server_channel_open_agent_forward(
        &mut self,
        channel: russh::Channel<client::Msg>,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        match self.settings.forward_agent.clone() {
            Some(socket) => crate::port_forward::forwarded_agent(channel, socket, reply),
            None => {
                tracing::warn!(
                    "the server opened an agent channel, but no agent is forwarded; refused"
                );
                refuse(reply);
            }
        }
        Ok(())
    }

    // Channels a server may open but skiff never asks for: refused (russh
    // would accept them and leave them open).
    async fn server_channel_open_session(
        &mut self,
        _channel: russh::Channel<client::Msg>,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        refuse(reply);
        Ok(())
    }

    async fn server_channel_open_direct_tcpip(
        &mut self,
        _channel: russh::Channel<client::Msg>,
        _host_to_connect: &str,
        _port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        refuse(reply);
        Ok(())
    }

    async fn server_channel_open_x11(
        &mut self,
        _channel: russh::Channel<client::Msg>,
        _originator_address: &str,
        _originator_port: u32,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        refuse(reply);
        Ok(())
    }

    async fn server_channel_open_forwarded_streamlocal(
        &mut self,
        channel: russh::Channel<client::Msg>,
        socket_path: &str,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.remote_forwards
            .incoming_socket(channel, socket_path, reply);
        Ok(())
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: russh::Channel<client::Msg>,
        connected_address: &str,
        connected_port: u32,
        originator_address: &str,
        originator_port: u32,
        reply: client::ChannelOpenHandle,
        _session: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.remote_forwards.incoming(
            channel,
            connected_address,
            connected_port,
            format!("{originator_address} port {originator_port}"),
            reply,
        );
        Ok(())
    }

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        // A host certificate from a CA we trust settles it. One we do not
        // trust leaves the key inside it, checked as a plain host key (as
        // ssh does); the reason is shown whatever the outcome.
        if let Err(refused) = crate::revoked_host_keys::check(&self.settings, key) {
            *self.refusal.lock().expect("not poisoned") = Some(refused);
            return Ok(false);
        }
        // The host key itself, inside a certificate or not.
        let public = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => {
                russh::keys::PublicKey::from(cert.public_key().clone())
            }
        };
        if let Some(bits) = public
            .to_bytes()
            .ok()
            .and_then(|b| skiff_proto::known_hosts::rsa_modulus_bits(&b))
            .filter(|&bits| bits < self.settings.required_rsa_size)
        {
            let (host, port) = self.settings.host_key_name();
            *self.refusal.lock().expect("not poisoned") = Some(SkiffError::new(
                ErrorKind::HostKey,
                format!(
                    "{}: the server's RSA host key has {bits} bits, fewer than RequiredRSASize ({}); refusing to connect",
                    skiff_proto::known_hosts::host_port_name(host, port),
                    self.settings.required_rsa_size
                ),
            ));
            return Ok(false);
        }
        let mut untrusted_certificate = None;
        if let PublicKeyOrCertificate::Certificate(cert) = key {
            match self.known_hosts.verify_certificate(&self.settings, cert) {
                Ok(CertificateCheck::Trusted) => return Ok(true),
                Ok(CertificateCheck::Untrusted(reason)) => untrusted_certificate = Some(reason),
                Err(refused) => {
                    *self.refusal.lock().expect("not poisoned") = Some(refused);
                    return Ok(false);
                }
            }
        }
        let (host, port) = self.settings.host_key_name();
        if let Some(partial_types) = &self.partial_order {
            if self
                .known_hosts
                .order_missed_a_type(host, port, &public, partial_types)
            {
                self.order_again.store(true, Ordering::Relaxed);
                return Ok(false);
            }
        }
        // Whether the key earns UpdateHostKeys: known in a user file before
        // this verification (which may record it), and not a certificate.
        if self.settings.update_host_keys == skiff_proto::ssh_config::UpdateHostKeys::Yes
            && untrusted_certificate.is_none()
        {
            let known = self.known_hosts.known_in_user_file(&self.settings, &public);
            self.update.host_key_checked(known);
        }
        // Usually a lookup and perhaps a one-line append: cheap enough to run
        // here. Only the `ask` policy may block on the terminal, and then the
        // user is the bottleneck anyway.
        let verdict = self.known_hosts.verify(&self.settings, &public);
        let name = skiff_proto::known_hosts::host_port_name(host, port);
        if let Ok(HostKeyTrust::Mismatched) = verdict {
            self.mismatched.store(true, Ordering::Relaxed);
            // Not even an agent channel the server opens unasked.
            self.settings.forward_agent = None;
        }
        match (verdict, untrusted_certificate) {
            (Ok(_), None) => Ok(true),
            (Ok(_), Some(reason)) => {
                self.known_hosts.notice(format!(
                    "Warning: {name}: host certificate not trusted: {reason}; its key is known, continuing"
                ));
                Ok(true)
            }
            (Err(mut e), reason) => {
                if let Some(reason) = reason {
                    let message = format!("host certificate not trusted: {reason}; {}", e.message);
                    e = e.with_message(message);
                }
                *self.refusal.lock().expect("not poisoned") = Some(e);
                Ok(false)
            }
        }
    }
}

/// Refuses a channel the server opened, without holding up the connection.
fn refuse(reply: client::ChannelOpenHandle) {
    tokio::spawn(reply.reject(russh::ChannelOpenFailure::AdministrativelyProhibited));
}

/// The configured host key algorithms, those of key types already recorded
/// in known_hosts first (in the configured order otherwise), so that a known
/// key is offered when the server has several, as ssh does.
fn host_key_order(configured: &[String], known_types: &[String]) -> Vec<Algorithm> {
    let mut all: Vec<Algorithm> = configured
        .iter()
        .filter_map(|name| Algorithm::new(name).ok())
        .collect();
    let family = |a: &Algorithm| match a {
        Algorithm::Rsa { .. } => "ssh-rsa".to_string(),
        other => other.as_str().to_string(),
    };
    all.sort_by_key(|a| {
        let f = family(a);
        known_types
            .iter()
            .position(|t| *t == f)
            .unwrap_or(usize::MAX)
    });
    all
}

/// russh's names for `names`, in order, with `extra` (pseudo-algorithms
/// that announce extensions) at the end. Names russh does not know are
/// left out; skiff-proto's supported lists hold only names it knows.
fn russh_names<N: Copy + AsRef<str> + 'static>(
    names: &[String],
    known: &[&'static N],
    extra: &[N],
) -> Vec<N> {
    let mut picked = skiff_proto::algorithms::pick(names, known);
    picked.extend_from_slice(extra);
    picked
}

/// The russh client configuration for these settings. With `certificates`,
/// host certificates are asked for ahead of plain keys.
pub fn russh_config(
    settings: &ConnectSettings,
    known_types: &[String],
    certificates: bool,
) -> client::Config {
    let algorithms = &settings.algorithms;
    let key_order = host_key_order(&algorithms.host_key, known_types);
    let preferred = Preferred {
        kex: Cow::Owned(russh_names(
            &algorithms.kex,
            kex::ALL_KEX_ALGORITHMS,
            &[
                kex::EXTENSION_SUPPORT_AS_CLIENT,
                kex::EXTENSION_OPENSSH_STRICT_KEX_AS_CLIENT,
            ],
        )),
        host_key_certificates: if certificates {
            Cow::Owned(key_order.clone())
        } else {
            Cow::Borrowed(&[])
        },
        key: Cow::Owned(key_order),
        cipher: Cow::Owned(russh_names(&algorithms.ciphers, cipher::ALL_CIPHERS, &[])),
        mac: Cow::Owned(russh_names(&algorithms.macs, mac::ALL_MAC_ALGORITHMS, &[])),
        // none first unless Compression asks for zlib; delayed zlib at
        // most, never `zlib` before the server is authenticated to us and
        // we to it.
        compression: Cow::Owned(russh_names(
            &skiff_proto::algorithms::compression(settings.compression),
            russh::compression::ALL_COMPRESSION_ALGORITHMS,
            &[],
        )),
    };
    client::Config {
        client_id: SshId::Standard(Cow::Owned(format!(
            "SSH-2.0-skiff_{}",
            env!("CARGO_PKG_VERSION")
        ))),
        preferred,
        // russh's client tops every window up to this value whatever
        // `adjust_window` returns, so the receive window cannot grow here:
        // advertise the cap from the start. Only the receiver needs a large
        // window for a long path (downloads from a stock sshd); memory stays
        // bounded by russh's per-channel queue, not by the window.
        window_size: max_window(),
        maximum_packet_size: MAX_PACKET,
        keepalive_interval: settings.server_alive_interval,
        keepalive_max: settings.server_alive_count_max,
        inactivity_timeout: None,
        nodelay: true,
        ..Default::default()
    }
}

/// A connection whose keys are exchanged, not yet authenticated.
struct Handshake {
    handle: client::Handle<ClientHandler>,
    /// The host key was let through although it is not the known one.
    host_key_mismatched: bool,
    peer_addr: Option<SocketAddr>,
    server_id: ServerId,
    remote_forwards: Arc<RemoteForwards>,
    ending: EndWatch,
    host_keys: crate::host_key_update::Settled,
}

/// Capacity of the read buffer under russh, in bytes: every handshake
/// packet fits, and reads of a bulk packet's body bypass it.
const READ_BUFFER: usize = 8 * 1024;

/// TCP connection and key exchange with the host-key algorithms ordered by
/// `known_types`; the host key is verified on the way. `None` when the
/// handler asks for another exchange with every known type first (only
/// possible with `partial_order`, see [`ClientHandler::partial_order`]).
async fn handshake(
    settings: &ConnectSettings,
    known_hosts: &Arc<KnownHosts>,
    known_types: &[String],
    partial_order: Option<Vec<String>>,
) -> Result<Option<Handshake>, SkiffError> {
    let certificates = known_hosts.wants_certificates(settings);
    let config = Arc::new(russh_config(settings, known_types, certificates));
    let transport = crate::transport::open(settings).await?;
    for notice in transport.notices {
        known_hosts.notice(notice);
    }
    let (peer_addr, route) = (transport.peer_addr, transport.route);
    // russh reads each packet as a 4-byte length and then the rest: without
    // a buffer that is two or three system calls per packet. The buffer
    // serves small reads only; bulk reads larger than it go straight through.
    let buffered = tokio::io::BufReader::with_capacity(READ_BUFFER, transport.stream);
    let (stream, server_id) = recording(buffered);
    let refusal = Arc::new(Mutex::new(None));
    let order_again = Arc::new(AtomicBool::new(false));
    let mismatched = Arc::new(AtomicBool::new(false));
    let remote_forwards = Arc::new(RemoteForwards::default());
    let (ending_tx, ending) = tokio::sync::watch::channel(Ending::Open);
    let (update, host_keys, session_id) = crate::host_key_update::updater();
    let handler = ClientHandler {
        update,
        settings: settings.without_identity_cache(),
        known_hosts: known_hosts.clone(),
        refusal: refusal.clone(),
        partial_order,
        order_again: order_again.clone(),
        mismatched: mismatched.clone(),
        remote_forwards: remote_forwards.clone(),
        ending: ending_tx,
    };
    // Key exchange must also finish in bounded time: a server that accepts TCP
    // and then says nothing must not hang us.
    let kex_budget = settings.connect_timeout;
    let result =
        tokio::time::timeout(kex_budget, client::connect_stream(config, stream, handler)).await;
    match result {
        Ok(Ok(handle)) => {
            // What a host key's proof is signed over (UpdateHostKeys).
            if let Some(binding) = handle.agent_session_binding() {
                let _ = session_id.set(binding.session_id().to_vec());
            }
            Ok(Some(Handshake {
                handle,
                host_key_mismatched: mismatched.load(Ordering::Relaxed),
                peer_addr,
                server_id,
                remote_forwards,
                ending: EndWatch(ending),
                host_keys,
            }))
        }
        Ok(Err(_)) if order_again.load(Ordering::Relaxed) => Ok(None),
        Ok(Err(e)) => {
            if let Some(refused) = refusal.lock().expect("not poisoned").take() {
                return Err(refused);
            }
            // A ProxyCommand that ends looks the same as a server that
            // closed, but may be anything (`nc` finding nothing listening).
            let proxy_command = matches!(settings.proxy, Some(Proxy::Command(_)));
            if closed_by_server(&e) && !proxy_command {
                let said = server_id
                    .line_before()
                    .map(|line| format!(" (\"{}\")", skiff_proto::terminal_text::one_line(&line)))
                    .unwrap_or_default();
                return Err(SkiffError::new(
                    ErrorKind::Busy,
                    format!(
                        "{} port {}{route}: the server closed the connection before \
                         authentication{said}; it may be busy (MaxStartups)",
                        settings.hostname, settings.port
                    ),
                ));
            }
            Err(SkiffError::new(
                ErrorKind::Connect,
                format!(
                    "{} port {}{route}: SSH handshake failed: {e}",
                    settings.hostname, settings.port
                ),
            ))
        }
        Err(_) => Err(SkiffError::new(
            ErrorKind::Connect,
            format!(
                "{} port {}{route}: no SSH handshake within {}s; is an SSH server listening there?",
                settings.hostname,
                settings.port,
                kex_budget.as_secs()
            ),
        )),
    }
}

/// Whether a key exchange ended because the server closed the connection
/// (or reset it, or said SSH_MSG_DISCONNECT) rather than because of
/// something it or we said: how servers drop connections they will not
/// authenticate now (see [`ErrorKind::Busy`]).
fn closed_by_server(e: &russh::Error) -> bool {
    match e {
        // The end of the stream before the identification or the key
        // exchange's end, or a disconnect message during it.
        russh::Error::Disconnect | russh::Error::HUP => true,
        russh::Error::IO(io) => skiff_proto::peer_close::is_peer_close(io.kind()),
        _ => false,
    }
}

/// Connects, verifies the host key and authenticates.
pub async fn connect(settings: &ConnectSettings) -> Result<Connection, SkiffError> {
    for (keyword, place) in &settings.ignored {
        tracing::debug!("{place}: {keyword} is not supported by skiff; ignored");
    }
    if let Some(place) = &settings.refused_by {
        return Err(SkiffError::new(
            ErrorKind::Config,
            format!(
                "{}: not connecting: RefuseConnection yes at {place}",
                settings.original_host
            ),
        ));
    }
    // In a fan-out, wait for room among its connections on their way to
    // authentication, and tell the gate how this one ended.
    let Some(gate) = &settings.pre_auth_gate else {
        return authenticated(settings).await;
    };
    let pass = gate.enter().await;
    let connected = authenticated(settings).await;
    match &connected {
        Ok(_) => pass.authenticated(),
        Err(e) if e.kind == ErrorKind::Busy => pass.dropped(),
        Err(_) => drop(pass),
    }
    connected
}

/// TCP connection (or proxy), key exchange, host-key check and
/// authentication.
async fn authenticated(settings: &ConnectSettings) -> Result<Connection, SkiffError> {
    let known_hosts = Arc::new(KnownHosts::load(settings));
    let (key_host, key_port) = settings.host_key_name();
    let order = known_hosts.preferred_key_types(key_host, key_port);
    let partial_order = order.hashed_left_out.then(|| order.types.clone());
    let first = handshake(settings, &known_hosts, &order.types, partial_order).await?;
    let Handshake {
        mut handle,
        host_key_mismatched,
        peer_addr,
        server_id,
        remote_forwards,
        ending,
        host_keys,
    } = match first {
        Some(done) => done,
        None => {
            tracing::debug!(
                "{}: the server's key is not among the known_hosts entries the key \
                 exchange was ordered by; exchanging keys again with every known type",
                settings.hostname
            );
            let every_type = known_hosts.known_key_types(key_host, key_port);
            handshake(settings, &known_hosts, &every_type, None)
                .await?
                .ok_or_else(|| {
                    SkiffError::new(
                        ErrorKind::Protocol,
                        format!("{}: host key exchange did not settle", settings.hostname),
                    )
                })?
        }
    };
    // A changed key let through (`StrictHostKeyChecking no`) is told no
    // secret and trusted with nothing, as ssh does.
    let guarded;
    let settings = if host_key_mismatched {
        let said;
        (guarded, said) = settings.guarded_for_a_changed_host_key();
        for line in said {
            known_hosts.notice(line);
        }
        &guarded
    } else {
        settings
    };
    let kex_budget = settings.connect_timeout;
    let late = || {
        SkiffError::new(
            ErrorKind::Auth,
            format!(
                "{}: authentication did not finish within {}s",
                settings.hostname,
                kex_budget.as_secs()
            ),
        )
    };
    let authenticating = match (&settings.identity_cache, settings.batch_mode) {
        (_, true) => {
            tokio::time::timeout(kex_budget, identity::authenticate(&mut handle, settings))
                .await
                .map_err(|_| late())?
        }
        (Some(cache), false) if settings.fan_out => within_budget_but_for_prompts(
            kex_budget,
            cache.person(),
            identity::authenticate(&mut handle, settings),
        )
        .await
        .ok_or_else(late)?,
        // A person may be typing a passphrase: no deadline; keepalives catch a dead peer.
        _ => identity::authenticate(&mut handle, settings).await,
    };
    if let Err(e) = authenticating {
        // A login that ended with the connection says why: sshd's "Too
        // many authentication failures" once MaxAuthTries keys were
        // refused, or a packet that failed its integrity check (a refusal
        // seen then may be the broken connection's, not the server's).
        let connection_ended = e.kind == ErrorKind::Connect || handle.is_closed();
        let why = match connection_ended {
            true => ending.described().await,
            false => None,
        };
        let e = match why {
            Some(why) => SkiffError::new(
                ErrorKind::Auth,
                format!(
                    "{}@{}: authentication failed: {why}",
                    settings.user, settings.hostname
                ),
            ),
            None => e,
        };
        // The warning a changed key let through carries is shown with a
        // connection's notices, which a failed login never gets to: its
        // error says it instead.
        if settings.host_key_mismatched {
            let message = format!(
                "{}; beware: the server's host key is not the one known for it \
                 (StrictHostKeyChecking no let it through)",
                e.message
            );
            return Err(e.with_message(message));
        }
        return Err(e);
    }
    Ok(Connection {
        handle,
        settings: settings.without_identity_cache(),
        notices: if settings.show_notices {
            known_hosts.take_notices()
        } else {
            Vec::new()
        },
        peer_addr,
        server_id,
        remote_forwards,
        ending,
        host_keys,
    })
}

/// Runs `work` with `budget` to finish, not counting the time `clock`
/// records a person being asked for a passphrase (another host's prompt
/// included: this host may be waiting for the same key). `None`: out of
/// time.
async fn within_budget_but_for_prompts<T>(
    budget: std::time::Duration,
    clock: &crate::identity_cache::PersonClock,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    /// How often an open prompt is looked at again.
    const WHILE_ASKING: std::time::Duration = std::time::Duration::from_millis(250);
    let start = tokio::time::Instant::now();
    let spent_before = clock.spent();
    let mut deadline = start + budget;
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Some(done),
            () = tokio::time::sleep_until(deadline) => {
                let now = tokio::time::Instant::now();
                let allowed = start + budget + clock.spent().saturating_sub(spent_before);
                if clock.is_waiting() {
                    deadline = allowed.max(now + WHILE_ASKING);
                } else if allowed > now {
                    deadline = allowed;
                } else {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::algorithms::{CIPHERS, HOST_KEY, KEX, MACS};

    fn owned<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        names.into_iter().map(|n| n.to_string()).collect()
    }

    /// A fan-out's authentication deadline leaves out the time a person
    /// spends typing a passphrase, this host's or another's, and holds
    /// otherwise.
    #[tokio::test(start_paused = true)]
    async fn prompts_do_not_count_against_the_authentication_deadline() {
        use crate::identity_cache::PersonClock;
        use std::time::Duration;
        let budget = Duration::from_secs(10);
        let clock = PersonClock::default();
        let work = |secs| tokio::time::sleep(Duration::from_secs(secs));

        // Nobody asked: the budget holds.
        assert!(within_budget_but_for_prompts(budget, &clock, work(9))
            .await
            .is_some());
        assert!(within_budget_but_for_prompts(budget, &clock, work(11))
            .await
            .is_none());

        // A prompt open from 5 s to 35 s, past the budget: 40 s of work
        // may take 10 s plus the 30 s the person took, and no more.
        let prompt = |clock| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _open = PersonClock::waiting(clock);
            tokio::time::sleep(Duration::from_secs(30)).await;
        };
        let (done, ()) = tokio::join!(
            within_budget_but_for_prompts(budget, &clock, work(39)),
            prompt(&clock)
        );
        assert!(done.is_some(), "the prompt's 30 s are not counted");
        let (done, ()) = tokio::join!(
            within_budget_but_for_prompts(budget, &clock, work(41)),
            prompt(&clock)
        );
        assert!(done.is_none(), "the rest of the budget still holds");
    }

    /// Every name skiff lets a configuration ask for is one russh knows, so
    /// none is silently dropped on the way to the key exchange.
    #[test]
    fn every_supported_algorithm_reaches_russh() {
        let kex = russh_names(&owned(KEX.supported()), kex::ALL_KEX_ALGORITHMS, &[]);
        assert_eq!(kex.len(), KEX.supported().count());
        let ciphers = russh_names(&owned(CIPHERS.supported()), cipher::ALL_CIPHERS, &[]);
        assert_eq!(ciphers.len(), CIPHERS.supported().count());
        let macs = russh_names(&owned(MACS.supported()), mac::ALL_MAC_ALGORITHMS, &[]);
        assert_eq!(macs.len(), MACS.supported().count());
        let keys = host_key_order(&owned(HOST_KEY.supported()), &[]);
        let names: Vec<&str> = keys.iter().map(Algorithm::as_str).collect();
        assert_eq!(names, HOST_KEY.supported().collect::<Vec<_>>());
    }

    /// skiff asks for no compression, and accepts at most delayed zlib:
    /// never plain `zlib`, which would decompress before authentication.
    #[test]
    fn compression_is_none_or_delayed_zlib() {
        let dest = crate::settings::Destination {
            host: "example".into(),
            config_file: Some("none".into()),
            ..Default::default()
        };
        let env = crate::settings::ClientEnv {
            vars: vec![("HOME".into(), "/nonexistent".into())],
        };
        let settings = crate::settings::resolve_for(&dest, &env).expect("settings");
        let offered = |settings: &crate::ConnectSettings| -> Vec<String> {
            let config = russh_config(settings, &[], false);
            let names = config.preferred.compression.iter();
            names.map(|n| n.as_ref().to_string()).collect()
        };
        assert_eq!(offered(&settings), ["none", "zlib@openssh.com"]);
        // Compression yes (-C): delayed zlib first, none still acceptable.
        let settings = crate::ConnectSettings {
            compression: true,
            ..settings
        };
        assert_eq!(offered(&settings), ["zlib@openssh.com", "none"]);
    }

    #[test]
    fn known_key_types_come_first_in_the_configured_order() {
        let configured = owned([
            "ssh-ed25519",
            "rsa-sha2-512",
            "rsa-sha2-256",
            "ecdsa-sha2-nistp256",
        ]);
        let order = host_key_order(&configured, &["ssh-rsa".to_string()]);
        let names: Vec<&str> = order.iter().map(Algorithm::as_str).collect();
        assert_eq!(
            names,
            [
                "rsa-sha2-512",
                "rsa-sha2-256",
                "ssh-ed25519",
                "ecdsa-sha2-nistp256"
            ]
        );
    }
}
