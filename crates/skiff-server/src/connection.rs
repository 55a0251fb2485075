//! One connection, served from its first byte to its end: the SSH
//! handshake under `LoginGraceTime`, its place among the unauthenticated
//! (`MaxStartups`) given back once it authenticates, a data-plane stream or
//! a client that is not SSH told apart by its first bytes, and how its
//! unauthenticated part ended (for `PerSourcePenalties`). Where it is
//! served is the caller's: a connection process of the listener's
//! (`crate::worker`), or skiffd itself in inetd mode ([`serve_inetd`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use skiff_proto::dataplane::Sniff;
use skiff_proto::worker_wire::Verdict;
use tokio::net::TcpStream;

use crate::audit_writer::ConnectionLog;
use crate::config::Settings;
use crate::handler::ConnectionHandler;
use crate::hostkey::HostIdentity;
use crate::ident_ahead::IdentAhead;
use crate::server_state::ServerState;
use crate::startups::{Pending, Startups};
use crate::stream_relay::{FirstBytes, Sniffed};

/// What the server refuses to start with beyond the configuration's own
/// checks: no host key, a lookup command that cannot run, an `AuditLog`
/// that cannot be opened. The listener checks at start and on `SIGHUP`,
/// the zygote before it forks anything, so that no connection process
/// fails on what the configuration says.
pub fn check(settings: &Settings, host: &HostIdentity) -> Result<()> {
    anyhow::ensure!(!host.keys.is_empty(), "no host key");
    lookup_commands(settings)?;
    if let Some(path) = &settings.audit_log {
        crate::log_file::open_append(path)?;
    }
    Ok(())
}

type LookupCommands = (
    Option<crate::lookup_command::LookupCommand>,
    Option<crate::lookup_command::LookupCommand>,
);

/// `AuthorizedKeysCommand` and `AuthorizedPrincipalsCommand`, checked.
fn lookup_commands(settings: &Settings) -> Result<LookupCommands> {
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
    Ok((keys_command, principals_command))
}

/// The russh configuration and the state all connections share.
pub fn prepare(
    settings: Settings,
    host: HostIdentity,
) -> Result<(Arc<russh::server::Config>, Arc<ServerState>)> {
    anyhow::ensure!(!host.keys.is_empty(), "no host key");
    let (keys_command, principals_command) = lookup_commands(&settings)?;
    let config = Arc::new(crate::listener::russh_config(&settings, host));
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
    // The connection's data-plane streams come as connections of their
    // own, each to a skiffd of its own: they find this one by its pid.
    match crate::stream_route::StreamInbox::bind() {
        Ok(inbox) => {
            state.registry.inbox_listens();
            tokio::spawn(inbox.serve(state.registry.clone()));
        }
        Err(e) => tracing::warn!("no data-plane inbox ({e}): the data plane is refused"),
    }
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
            let local = stream.local_addr().ok();
            // One connection per process: no penalty outlives it.
            let (result, _) = serve_connection(
                Accepted {
                    stream,
                    ahead: IdentAhead::default(),
                },
                peer,
                local,
                config,
                &state,
                pending,
            )
            .await;
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

/// Serves `stream` from `peer` (to `local`) to its end, its log saying
/// when it opened and ended: how it ended, and how its unauthenticated part
/// did (for `PerSourcePenalties`).
pub async fn serve_connection(
    accepted: Accepted,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    config: Arc<russh::server::Config>,
    state: &Arc<ServerState>,
    pending: Pending,
) -> (Result<()>, Verdict) {
    let failures = Arc::new(crate::penalties::FailureCount::default());
    let mut outcome = Outcome::Ended;
    let log = ConnectionLog::new(state.audit.as_ref(), Some(peer), local);
    let result = handle_connection(
        accepted,
        peer,
        config,
        state.clone(),
        pending,
        &mut outcome,
        Watch {
            auth_failures: failures.clone(),
            log: log.clone(),
        },
    )
    .await;
    // The forwarded sockets the connection made go with it, before its
    // process exits.
    if crate::account_fs::removals_pending() {
        let wait = || crate::account_fs::finish_removals(SOCKET_REMOVAL_WAIT);
        let _ = tokio::task::spawn_blocking(wait).await;
    }
    log.ended(&end_reason(&result, outcome));
    (result, outcome.verdict(&failures))
}

/// How long an ended connection waits for its forwarded sockets to be
/// removed (each an unlink, as the account).
const SOCKET_REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// How a connection's unauthenticated part ended, for `PerSourcePenalties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It ended before authenticating.
    Ended,
    /// `LoginGraceTime` ran out first.
    GraceExceeded,
    /// It authenticated (or is a data-plane stream, judged by its token).
    NotPenalised,
}

impl Outcome {
    /// What it tells the listener, given the authentication requests
    /// refused ([`crate::penalties::Offence::of`] turns that into a penalty).
    pub fn verdict(self, failed: &crate::penalties::FailureCount) -> Verdict {
        match self {
            Outcome::NotPenalised => Verdict::Clean,
            Outcome::GraceExceeded => Verdict::GraceExceeded,
            Outcome::Ended if failed.password() => Verdict::PasswordFail,
            Outcome::Ended if failed.any() => Verdict::AuthFail,
            Outcome::Ended => Verdict::NoAuth,
        }
    }
}

/// What the caller keeps of a connection its handler serves: the
/// authentication requests refused (`PerSourcePenalties authfail`) and its
/// log, which says when it opened and ended.
pub struct Watch {
    pub auth_failures: Arc<crate::penalties::FailureCount>,
    pub log: Arc<ConnectionLog>,
}

/// Why a connection ended, for its `disconnect` audit record.
pub fn end_reason(result: &Result<()>, outcome: Outcome) -> String {
    match (result, outcome) {
        (_, Outcome::GraceExceeded) => "LoginGraceTime expired".into(),
        (Ok(()), _) => "connection closed".into(),
        (Err(e), _) if closed_by_client(e) => CLOSED_WITHOUT_GOODBYE.into(),
        (Err(e), _) => format!("{e:#}"),
    }
}

/// The `disconnect` reason of a connection the client closed (or reset)
/// without `SSH_MSG_DISCONNECT`.
pub const CLOSED_WITHOUT_GOODBYE: &str = "closed by the client without a disconnect message";

/// Whether a connection ended because the client closed or reset it
/// without a disconnect message: how a killed client ends (and how a
/// careless one leaves), not a fault of skiffd's.
pub fn closed_by_client(e: &anyhow::Error) -> bool {
    let peer_closed = |io: &std::io::Error| skiff_proto::peer_close::is_peer_close(io.kind());
    e.chain().any(|cause| {
        if let Some(russh::Error::IO(io)) = cause.downcast_ref::<russh::Error>() {
            return peer_closed(io);
        }
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(peer_closed)
    })
}

/// What a connection that does not begin with an SSH identification line
/// is told before it is closed (sshd's words).
const INVALID_IDENTIFICATION: &[u8] = b"Invalid SSH identification string.\r\n";

/// The connection's socket, served from here once russh has given up on
/// it (a data-plane stream, or a client that is not SSH).
pub fn taken_over(socket: std::os::fd::OwnedFd) -> std::io::Result<TcpStream> {
    let std_stream = std::net::TcpStream::from(socket);
    std_stream.set_nonblocking(true)?;
    TcpStream::from_std(std_stream)
}

/// An accepted connection as its process gets it: the socket, and what
/// of the identification line the listener already wrote on it.
pub struct Accepted {
    pub stream: TcpStream,
    pub ahead: IdentAhead,
}

pub async fn handle_connection(
    accepted: Accepted,
    peer: SocketAddr,
    config: Arc<russh::server::Config>,
    state: Arc<ServerState>,
    guard: Pending,
    outcome: &mut Outcome,
    watch: Watch,
) -> Result<()> {
    let Watch { auth_failures, log } = watch;
    let Accepted { stream, ahead } = accepted;
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
    let sniffed = Sniffed::new(stream, first_bytes.clone(), ahead);
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
