//! Accepting connections: TCP_NODELAY on every socket, descriptors kept
//! spare (a connection is turned away at accept when few are left, see
//! `crate::fd_budget`), a cap on connections that have not authenticated
//! yet (MaxStartups; a data-plane stream counts until its token checks
//! out), and a login grace timer. Also the one connection of inetd mode
//! (`skiffd -i`, [`serve_inetd`]), served by the same code. The listener
//! says when a connection that speaks SSH opened and when it ended
//! ([`crate::audit_writer::ConnectionLog`]: sshd's closing line and the
//! `AuditLog`'s `connect` and `disconnect` records).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use russh::keys::Algorithm;
use russh::{cipher, kex, mac, Preferred, SshId};
use skiff_proto::dataplane::Sniff;
use tokio::net::{TcpListener, TcpStream};

use crate::audit_writer::ConnectionLog;
use crate::config::Settings;
use crate::descriptors::Descriptors;
use crate::handler::ConnectionHandler;
use crate::hostkey::HostIdentity;
use crate::penalties::{Admission, Offence, Penalties};
use crate::server_state::ServerState;
use crate::startups::{Pending, Refusal, Startups};
use crate::stream_relay::{FirstBytes, Sniffed};

/// `RekeyLimit ... none`: a time no connection lives to see.
const NO_REKEY_TIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The russh server configuration for these settings and host keys.
///
/// Algorithms: `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers` and `MACs`
/// from the configuration (by default post-quantum hybrid and curve25519
/// key exchange first, AEAD ciphers only, SHA-2 host key signatures; see
/// `skiff_proto::algorithms::SERVER_*`). Strict kex and extension
/// negotiation are always announced. Compression is none or delayed zlib
/// (`skiff_proto::algorithms::COMPRESSION`).
pub fn russh_config(settings: &Settings, host: HostIdentity) -> russh::server::Config {
    use skiff_proto::algorithms::pick;
    let mut kex_names = pick(&settings.kex_algorithms, kex::ALL_KEX_ALGORITHMS);
    kex_names.extend([
        kex::EXTENSION_SUPPORT_AS_SERVER,
        kex::EXTENSION_OPENSSH_STRICT_KEX_AS_SERVER,
    ]);
    let preferred = Preferred {
        kex: Cow::Owned(kex_names),
        key: Cow::Owned(
            settings
                .host_key_algorithms
                .iter()
                .filter_map(|n| Algorithm::new(n).ok())
                .collect(),
        ),
        cipher: Cow::Owned(pick(&settings.ciphers, cipher::ALL_CIPHERS)),
        mac: Cow::Owned(pick(&settings.macs, mac::ALL_MAC_ALGORITHMS)),
        // Never `zlib` before authentication: none, or delayed zlib.
        compression: Cow::Owned(pick(
            &skiff_proto::algorithms::compression(false),
            russh::compression::ALL_COMPRESSION_ALGORITHMS,
        )),
        ..Preferred::default()
    };
    russh::server::Config {
        server_id: SshId::Standard(Cow::Owned(format!("SSH-2.0-{}", crate::SOFTWARE_VERSION))),
        // The handler lists each login's own methods; these are the
        // server's, for russh's defaults.
        methods: {
            let mut m = russh::MethodSet::empty();
            for method in settings.pam.methods() {
                m.push(match method {
                    crate::auth_methods::Method::Password => russh::MethodKind::Password,
                    crate::auth_methods::Method::KeyboardInteractive => {
                        russh::MethodKind::KeyboardInteractive
                    }
                    _ => russh::MethodKind::PublicKey,
                });
            }
            m
        },
        // Rejections take a constant, short time so that an unknown account and
        // a wrong key look alike; the initial "none" probe is answered at once.
        auth_rejection_time: Duration::from_millis(20),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: host.keys,
        certificates: host.certificates,
        preferred,
        // russh counts the client's initial `none` probe as a failed attempt;
        // sshd does not. One more keeps MaxAuthTries meaning what sshd means.
        max_auth_attempts: settings.max_auth_tries + 1,
        inactivity_timeout: None,
        window_size: skiff_proto::window::INITIAL_WINDOW,
        // Large packets cost fewer messages per byte (russh warns above
        // 65535); the queue budget closes connections that send larger.
        maximum_packet_size: crate::queue_budget::MAX_PACKET,
        // RekeyLimit: russh starts a key exchange once either direction
        // has carried `data` bytes, or once `time` has passed.
        limits: russh::Limits::new(
            settings.rekey_limit.data,
            settings.rekey_limit.data,
            settings.rekey_limit.time.unwrap_or(NO_REKEY_TIME),
        ),
        keepalive_interval: settings.client_alive_interval,
        keepalive_max: settings.client_alive_count_max,
        nodelay: true,
        ..Default::default()
    }
}

/// Binds every listen address and serves connections until an accept loop fails.
pub async fn serve(settings: Settings, host: HostIdentity) -> Result<()> {
    anyhow::ensure!(!settings.listen.is_empty(), "no listen address");
    let mut listeners = Vec::new();
    let mut failures = Vec::new();
    for addr in &settings.listen {
        match bind(*addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => failures.push(format!("cannot listen on {addr}: {e}")),
        }
    }
    // As sshd: an address that cannot be had is logged; none at all is fatal.
    if listeners.is_empty() {
        anyhow::bail!("{}", failures.join("; "));
    }
    for f in &failures {
        tracing::error!("{f}");
    }
    serve_listeners(listeners, settings, host).await
}

/// A listening socket on `addr`; an IPv6 one takes IPv6 only, so that
/// `0.0.0.0` and `::` can both be listened on, each on its own.
fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv6() {
        let s = tokio::net::TcpSocket::new_v6()?;
        socket2::SockRef::from(&s).set_only_v6(true)?;
        s
    } else {
        tokio::net::TcpSocket::new_v4()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves connections on already bound listeners (`settings.listen` is ignored).
pub async fn serve_listeners(
    listeners: Vec<TcpListener>,
    settings: Settings,
    host: impl Into<HostIdentity>,
) -> Result<()> {
    let (config, state) = prepare(settings, host.into())?;
    let settings = &state.settings;
    // Unless the configuration says otherwise, a source that guesses
    // passwords is turned away for a while.
    let passwords = settings.pam.offers(crate::auth_methods::Method::Password)
        || settings
            .pam
            .offers(crate::auth_methods::Method::KeyboardInteractive);
    let policy = match (
        &settings.per_source_penalties,
        settings.per_source_penalties_set,
    ) {
        (Some(policy), _) => Some(policy.clone()),
        (None, false) if passwords => Some(crate::penalties::PenaltyPolicy::password_guessing()),
        (None, _) => None,
    };
    let penalties = policy.map(|policy| {
        Arc::new(std::sync::Mutex::new(Penalties::new(
            policy,
            settings.per_source_net_block,
            settings.per_source_penalty_exempt.clone(),
        )))
    });
    let startups = Arc::new(Startups::default());
    let descriptors = Arc::new(open_file_headroom()?);
    let mut loops = tokio::task::JoinSet::new();
    for listener in listeners {
        tracing::info!("listening on {}", listener.local_addr()?);
        let (config, state, startups) = (config.clone(), state.clone(), startups.clone());
        let (descriptors, penalties) = (descriptors.clone(), penalties.clone());
        loops.spawn(accept_loop(
            listener,
            config,
            state,
            startups,
            descriptors,
            penalties,
        ));
    }
    match loops.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(e.into()),
        None => Ok(()),
    }
}

/// The russh configuration and the state all connections share.
fn prepare(
    settings: Settings,
    host: HostIdentity,
) -> Result<(Arc<russh::server::Config>, Arc<ServerState>)> {
    anyhow::ensure!(!host.keys.is_empty(), "no host key");
    let config = Arc::new(russh_config(&settings, host));
    use crate::lookup_command::LookupCommand;
    let keys_command = LookupCommand::new(
        "AuthorizedKeysCommand",
        settings.authorized_keys_command.as_ref(),
        settings.authorized_keys_command_user.as_ref(),
    )
    .map_err(anyhow::Error::msg)?;
    let principals_command = LookupCommand::new(
        "AuthorizedPrincipalsCommand",
        settings.authorized_principals_command.as_ref(),
        settings.authorized_principals_command_user.as_ref(),
    )
    .map_err(anyhow::Error::msg)?;
    let audit = match &settings.audit_log {
        Some(path) => Some(crate::audit_writer::AuditLog::open(path)?),
        None => None,
    };
    let state = Arc::new(ServerState {
        audit,
        keys_command,
        principals_command,
        queues: crate::queue_budget::ServerQueue::new(settings.queue_limits),
        settings,
        registry: Default::default(),
    });
    Ok((config, state))
}

/// Serves the one connection that stdin and stdout are, then returns
/// (`skiffd -i`, for inetd or socket activation with `Accept=yes`). When
/// stdin is a TCP socket it is the connection, both ways, and its peer is
/// the client; otherwise (pipes, as from `ProxyCommand`) stdin is read and
/// stdout written, and the client is unknown, as sshd reports it
/// (`SSH_CONNECTION` is `UNKNOWN 65535 UNKNOWN 65535`). LoginGraceTime
/// applies as on a listener.
pub async fn serve_inetd(settings: Settings, host: HostIdentity) -> Result<()> {
    use std::os::fd::AsFd;
    let (config, state) = prepare(settings, host)?;
    let startups = Arc::new(Startups::default());
    let stdin = std::io::stdin().as_fd().try_clone_to_owned()?;
    let peer = socket2::SockRef::from(&stdin)
        .peer_addr()
        .ok()
        .and_then(|a| a.as_socket());
    let admit = |ip: std::net::IpAddr| {
        let settings = &state.settings;
        startups
            .admit(ip, settings.per_source_net_block, None, |_| false)
            .map_err(|_| anyhow::anyhow!("cannot count the connection"))
    };
    match peer {
        Some(peer) => {
            let pending = admit(peer.ip())?;
            let stream = taken_over(stdin)?;
            tracing::info!(%peer, "inetd mode: serving the connection on stdin");
            // One connection per process: no penalty outlives it.
            let mut outcome = Outcome::Ended;
            let log =
                ConnectionLog::new(state.audit.as_ref(), Some(peer), stream.local_addr().ok());
            let result = handle_connection(
                stream,
                peer,
                config,
                state.clone(),
                pending,
                &mut outcome,
                Watch {
                    auth_failures: Default::default(),
                    log: log.clone(),
                },
            )
            .await;
            log.ended(&end_reason(&result, outcome));
            result
        }
        None => {
            drop(stdin);
            let unknown = SocketAddr::from(([0, 0, 0, 0], 65535));
            let pending = admit(unknown.ip())?;
            tracing::info!("inetd mode: serving the connection on stdin and stdout (peer unknown)");
            let stdio = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
            let grace = state.settings.login_grace_time;
            let deadline = tokio::time::Instant::now() + grace;
            let (auth_tx, auth_rx) = tokio::sync::watch::channel(false);
            let log = ConnectionLog::new(state.audit.as_ref(), None, None);
            let handler = ConnectionHandler::new(state.clone(), unknown, unknown, auth_tx)
                .with_unknown_peer()
                .with_log(log.clone());
            let session = tokio::time::timeout_at(
                deadline,
                russh::server::run_stream(config, stdio, handler),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no SSH identification within LoginGraceTime"))??;
            log.opened();
            let ended = |result: Result<()>, outcome| {
                log.ended(&end_reason(&result, outcome));
                result
            };
            match until_authenticated(session, auth_rx, deadline, pending).await {
                Login::Goes(session, _) => ended(session.await.map_err(Into::into), Outcome::Ended),
                Login::Ended(result, _) => ended(result.map_err(Into::into), Outcome::Ended),
                Login::GraceExpired => {
                    log.ended(&end_reason(&Ok(()), Outcome::GraceExceeded));
                    // The connection ends with the process.
                    tracing::info!(
                        "login grace time ({}s) expired before authentication",
                        grace.as_secs()
                    );
                    Ok(())
                }
            }
        }
    }
}

/// How the pre-authentication part of a connection ended.
enum Login<S> {
    /// Authenticated (`true`: its place among the unauthenticated given
    /// back), or the handler is gone: the session goes on to its end.
    Goes(std::pin::Pin<Box<S>>, bool),
    /// The connection ended first, with this outcome (`true`: after
    /// authenticating).
    Ended(Result<(), russh::Error>, bool),
    /// LoginGraceTime ran out first.
    GraceExpired,
}

/// Waits for the client to authenticate, or the connection to end, until
/// `deadline` (LoginGraceTime).
async fn until_authenticated<S>(
    session: S,
    mut auth_rx: tokio::sync::watch::Receiver<bool>,
    deadline: tokio::time::Instant,
    mut guard: Pending,
) -> Login<S>
where
    S: std::future::Future<Output = Result<(), russh::Error>>,
{
    let mut session = Box::pin(session);
    // Ok(true): authenticated. Ok(false): the connection ended first. Err: grace expired.
    let authed = tokio::select! {
        biased;
        result = &mut session => return Login::Ended(result, *auth_rx.borrow()),
        authed = tokio::time::timeout_at(deadline, async { auth_rx.wait_for(|a| *a).await.is_ok() }) => authed,
    };
    match authed {
        Ok(true) => {
            guard.release();
            Login::Goes(session, true)
        }
        Ok(false) => Login::Goes(session, false),
        Err(_) => Login::GraceExpired,
    }
}

/// Raises the soft open-file limit to the hard one (logged), and the
/// headroom kept under it.
fn open_file_headroom() -> Result<Descriptors> {
    match crate::descriptors::raise_open_file_limit() {
        Ok(l) if l.now > l.before => tracing::info!(
            "open-file limit raised from {} to {} (hard limit {})",
            l.before,
            l.now,
            l.hard
        ),
        Ok(l) => tracing::info!("open-file limit {} (hard limit {})", l.now, l.hard),
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    let descriptors = Descriptors::new(crate::descriptors::open_file_limit()?);
    let h = descriptors.headroom();
    tracing::debug!(
        "{} descriptors kept spare: new connections are refused past {}",
        h.reserve,
        h.limit - h.reserve
    );
    Ok(descriptors)
}

async fn accept_loop(
    listener: TcpListener,
    config: Arc<russh::server::Config>,
    state: Arc<ServerState>,
    startups: Arc<Startups>,
    descriptors: Arc<Descriptors>,
    penalties: Option<SharedPenalties>,
) -> Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: log, back off briefly, keep serving.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A penalised source is turned away before anything else: the
        // socket is closed unanswered.
        if let Some(p) = &penalties {
            let admission = lock(p).admit(peer.ip(), std::time::Instant::now());
            match admission {
                Admission::Admit => {}
                Admission::Penalised { network, left, log } => {
                    if log {
                        tracing::warn!(%peer, "refusing connections from {network} for {}s (PerSourcePenalties)", left.as_secs() + 1);
                    }
                    continue;
                }
                Admission::Overflow { log } => {
                    if log {
                        tracing::warn!(%peer, "refusing new connections: the PerSourcePenalties table is full (overflow deny-all)");
                    }
                    continue;
                }
            }
        }
        let settings = &state.settings;
        let admitted = startups.admit(
            peer.ip(),
            settings.per_source_net_block,
            settings.per_source_max_startups,
            |waiting| {
                let chance = settings.drop_chance(waiting);
                chance > 0.0 && (chance >= 1.0 || rand::random::<f64>() < chance)
            },
        );
        let pending = match admitted {
            Ok(pending) => pending,
            Err(Refusal::Total(waiting)) => {
                tracing::warn!(%peer, "dropping connection: {waiting} unauthenticated connections (MaxStartups)");
                continue;
            }
            Err(Refusal::Source { network, waiting }) => {
                tracing::warn!(%peer, "dropping connection: {waiting} unauthenticated connections from {network} (PerSourceMaxStartups)");
                continue;
            }
        };
        // Also closed before a byte is written (its place given back).
        if let Err(short) = descriptors.admit(std::os::fd::AsRawFd::as_raw_fd(&stream)) {
            if let Some(refused) = short.log_due {
                tracing::warn!(
                    %peer,
                    "dropping new connections: {} of {} file descriptors open, {} kept for connections already served ({refused} dropped since the last such line)",
                    short.open,
                    short.headroom.limit,
                    short.headroom.reserve
                );
            }
            continue;
        }
        let (config, state) = (config.clone(), state.clone());
        let served = tokio::spawn(async move {
            let failures = Arc::new(crate::penalties::FailureCount::default());
            let mut outcome = Outcome::Ended;
            let log =
                ConnectionLog::new(state.audit.as_ref(), Some(peer), stream.local_addr().ok());
            let served = handle_connection(
                stream,
                peer,
                config,
                state,
                pending,
                &mut outcome,
                Watch {
                    auth_failures: failures.clone(),
                    log: log.clone(),
                },
            );
            let result = served.await;
            if let Err(e) = &result {
                tracing::info!(%peer, "connection ended: {e}");
            }
            log.ended(&end_reason(&result, outcome));
            outcome.offence(&failures)
        });
        if let Some(p) = penalties.clone() {
            // Judged once the connection is over, a panic included.
            tokio::spawn(async move {
                let offence = match served.await {
                    Ok(offence) => offence,
                    Err(e) if e.is_panic() => Some(Offence::Crash),
                    Err(_) => None,
                };
                if let Some(offence) = offence {
                    lock(&p).penalise(peer.ip(), offence, std::time::Instant::now());
                    tracing::debug!(%peer, "penalty recorded: {offence:?}");
                }
            });
        }
    }
}

/// The penalty table all listeners share.
type SharedPenalties = Arc<std::sync::Mutex<Penalties>>;

fn lock(p: &SharedPenalties) -> std::sync::MutexGuard<'_, Penalties> {
    p.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How a connection's unauthenticated part ended, for `PerSourcePenalties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It ended before authenticating.
    Ended,
    /// `LoginGraceTime` ran out first.
    GraceExceeded,
    /// It authenticated (or is a data-plane stream, judged by its token).
    NotPenalised,
}

impl Outcome {
    /// The penalty it earns, given the authentication requests refused.
    fn offence(self, failed: &crate::penalties::FailureCount) -> Option<Offence> {
        match self {
            Outcome::NotPenalised => None,
            Outcome::GraceExceeded => Some(Offence::GraceExceeded),
            Outcome::Ended if failed.password() => Some(Offence::PasswordFail),
            Outcome::Ended if failed.any() => Some(Offence::AuthFail),
            Outcome::Ended => Some(Offence::NoAuth),
        }
    }
}

/// What the listener keeps of a connection its handler serves: the
/// authentication requests refused (`PerSourcePenalties authfail`) and its
/// log, which says when it opened and ended.
struct Watch {
    auth_failures: Arc<crate::penalties::FailureCount>,
    log: Arc<ConnectionLog>,
}

/// Why a connection ended, for its `disconnect` audit record.
fn end_reason(result: &Result<()>, outcome: Outcome) -> String {
    match (result, outcome) {
        (_, Outcome::GraceExceeded) => "LoginGraceTime expired".into(),
        (Ok(()), _) => "connection closed".into(),
        (Err(e), _) => format!("{e:#}"),
    }
}

/// What a connection that does not begin with an SSH identification line
/// is told before it is closed (sshd's words).
const INVALID_IDENTIFICATION: &[u8] = b"Invalid SSH identification string.\r\n";

/// The connection's socket, served from here once russh has given up on
/// it (a data-plane stream, or a client that is not SSH).
fn taken_over(socket: std::os::fd::OwnedFd) -> std::io::Result<TcpStream> {
    let std_stream = std::net::TcpStream::from(socket);
    std_stream.set_nonblocking(true)?;
    TcpStream::from_std(std_stream)
}

async fn handle_connection(
    stream: TcpStream,
    peer: SocketAddr,
    config: Arc<russh::server::Config>,
    state: Arc<ServerState>,
    guard: Pending,
    outcome: &mut Outcome,
    watch: Watch,
) -> Result<()> {
    let Watch { auth_failures, log } = watch;
    stream.set_nodelay(true)?;
    let local = stream.local_addr()?;
    // A second handle on the socket, so the connection can be shut down from
    // here even while russh owns the stream (a dup, so fd reuse is no risk).
    let socket = std::os::fd::AsFd::as_fd(&stream).try_clone_to_owned()?;
    let grace = state.settings.login_grace_time;
    let deadline = tokio::time::Instant::now() + grace;
    let (auth_tx, auth_rx) = tokio::sync::watch::channel(false);
    let handler = ConnectionHandler::new(state.clone(), peer, local, auth_tx)
        .with_socket(socket.try_clone()?)
        .with_auth_failures(auth_failures)
        .with_log(log.clone());
    // Data-plane streams share the port: the sniffer sees their magic
    // before SSH would, and the socket is then served from `socket`.
    let first_bytes = FirstBytes::default();
    let sniffed = Sniffed::new(stream, first_bytes.clone());
    let started = tokio::time::timeout_at(
        deadline,
        russh::server::run_stream(config, sniffed, handler),
    )
    .await
    .map_err(|_| {
        *outcome = Outcome::GraceExceeded;
        anyhow::anyhow!("no SSH identification within LoginGraceTime")
    })?;
    let session = match started {
        Ok(session) => {
            log.opened();
            session
        }
        Err(_) if first_bytes.get() == Some(Sniff::NotSsh) => {
            // As sshd: say so after the identification line, and close.
            tracing::info!(%peer, "not an SSH client: invalid identification string");
            let mut stream = taken_over(socket)?;
            let answer = tokio::io::AsyncWriteExt::write_all(&mut stream, INVALID_IDENTIFICATION);
            let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
            return Ok(());
        }
        Err(_) if first_bytes.get() == Some(Sniff::DataPlane) => {
            // Still unauthenticated: it counts until its token checks out.
            *outcome = Outcome::NotPenalised;
            let stream = taken_over(socket)?;
            crate::stream_relay::accept_stream(&state.registry, stream, peer, guard).await;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let session = match until_authenticated(session, auth_rx, deadline, guard).await {
        Login::Goes(session, authenticated) => {
            if authenticated {
                *outcome = Outcome::NotPenalised;
            }
            session
        }
        Login::Ended(result, authenticated) => {
            if authenticated {
                *outcome = Outcome::NotPenalised;
            }
            return result.map_err(Into::into);
        }
        Login::GraceExpired => {
            *outcome = Outcome::GraceExceeded;
            tracing::info!(%peer, "login grace time ({}s) expired before authentication", grace.as_secs());
            // Wherever the handshake stands (even mid key exchange), end it now.
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                nix::sys::socket::Shutdown::Both,
            );
            return Ok(());
        }
    };
    drop(socket);
    session.await.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::algorithms::{
        pick, AlgorithmList, SERVER_CIPHERS, SERVER_HOST_KEY, SERVER_KEX, SERVER_MACS,
    };

    fn all(list: &AlgorithmList) -> Vec<String> {
        list.supported().map(str::to_string).collect()
    }

    /// Every name skiffd's configuration accepts is one russh knows.
    #[test]
    fn every_server_algorithm_reaches_russh() {
        let n = |l: &AlgorithmList| l.supported().count();
        assert_eq!(
            pick(&all(&SERVER_KEX), kex::ALL_KEX_ALGORITHMS).len(),
            n(&SERVER_KEX)
        );
        assert_eq!(
            pick(&all(&SERVER_CIPHERS), cipher::ALL_CIPHERS).len(),
            n(&SERVER_CIPHERS)
        );
        assert_eq!(
            pick(&all(&SERVER_MACS), mac::ALL_MAC_ALGORITHMS).len(),
            n(&SERVER_MACS)
        );
        for name in SERVER_HOST_KEY.supported() {
            assert!(Algorithm::new(name).is_ok(), "{name}");
        }
    }
}
