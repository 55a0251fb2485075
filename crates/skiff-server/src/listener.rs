//! The listener: binds the listen addresses (or takes the sockets systemd
//! passes, `LISTEN_FDS`), turns away at accept what must be (a penalised
//! source, `PerSourcePenalties`; too many unauthenticated connections,
//! `MaxStartups`; too few descriptors left, `crate::fd_budget`) and hands
//! every other connection to a process of its own (`crate::worker_pool`),
//! which serves it to its end (`crate::connection`). A data-plane stream
//! whose first bytes are already in goes straight to the process that owns
//! it (`crate::stream_route`). `SIGHUP` reads the configuration again for
//! new connections, keeping the old one when the new one does not load;
//! the service manager hears when skiffd is ready and reloading
//! (`crate::service_manager`). Also the russh configuration every
//! connection process uses ([`russh_config`]).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use russh::keys::Algorithm;
use russh::{cipher, kex, mac, Preferred, SshId};
use skiff_proto::dataplane::Sniff;
use tokio::net::{TcpListener, TcpStream};

use crate::config::Settings;
use crate::descriptors::Descriptors;
use crate::hostkey::HostIdentity;
use crate::penalties::{Admission, Penalties};
use crate::startups::{Pending, Refusal, Startups};
use crate::worker_pool::{lock, Assignment, Launch, SharedPenalties, WorkerPool};

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
        server_id: SshId::Standard(Cow::Owned(crate::ident_ahead::identification())),
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

/// Reads the configuration again, for `SIGHUP`: the settings, checked as
/// at start (host keys included), or why they cannot be used.
pub type Reload = Box<dyn Fn() -> Result<Settings>>;

/// Binds every listen address (or takes the sockets systemd passed) and
/// serves connections until an accept loop fails.
pub async fn serve(settings: Settings, reload: Reload) -> Result<()> {
    let listeners = match crate::service_manager::passed_listeners()? {
        Some(passed) => {
            tracing::info!(
                "serving {} socket(s) passed by the service manager",
                passed.len()
            );
            passed
        }
        None => bind_all(&settings)?,
    };
    serve_listeners(listeners, settings, reload).await
}

/// Binds every listen address: as sshd, an address that cannot be had is
/// logged; none at all is fatal.
fn bind_all(settings: &Settings) -> Result<Vec<TcpListener>> {
    anyhow::ensure!(!settings.listen.is_empty(), "no listen address");
    let mut listeners = Vec::new();
    let mut failures = Vec::new();
    for addr in &settings.listen {
        match bind(*addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => failures.push(format!("cannot listen on {addr}: {e}")),
        }
    }
    if listeners.is_empty() {
        anyhow::bail!("{}", failures.join("; "));
    }
    for f in &failures {
        tracing::error!("{f}");
    }
    Ok(listeners)
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

/// What the accept loops decide by: the settings in force and the
/// penalty table that goes with them (both replaced on a reload).
struct AdmissionRules {
    settings: Settings,
    penalties: Option<SharedPenalties>,
}

/// The penalty table for `settings`: `PerSourcePenalties`, or unless the
/// configuration says otherwise, a source that guesses passwords is turned
/// away for a while.
fn penalty_table(settings: &Settings) -> Option<SharedPenalties> {
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
    policy.map(|policy| {
        Arc::new(Mutex::new(Penalties::new(
            policy,
            settings.per_source_net_block,
            settings.per_source_penalty_exempt.clone(),
        )))
    })
}

/// What every accept loop shares.
struct Shared {
    admission: std::sync::RwLock<Arc<AdmissionRules>>,
    startups: Arc<Startups>,
    descriptors: Descriptors,
    pool: Arc<WorkerPool>,
}

impl Shared {
    fn admission(&self) -> Arc<AdmissionRules> {
        self.admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Serves connections on already bound listeners (`settings.listen` is ignored).
pub async fn serve_listeners(
    listeners: Vec<TcpListener>,
    settings: Settings,
    reload: Reload,
) -> Result<()> {
    let pool = WorkerPool::start(Launch::this_process()).await?;
    let shared = Arc::new(Shared {
        admission: std::sync::RwLock::new(Arc::new(AdmissionRules {
            penalties: penalty_table(&settings),
            settings,
        })),
        startups: Arc::new(Startups::default()),
        descriptors: open_file_headroom()?,
        pool,
    });
    let mut loops = tokio::task::JoinSet::new();
    for listener in listeners {
        tracing::info!("listening on {}", listener.local_addr()?);
        loops.spawn(accept_loop(listener, shared.clone()));
    }
    crate::service_manager::notify(&format!("READY=1\nMAINPID={}", std::process::id()));
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    let mut terms = signal(SignalKind::terminate())?;
    let mut interrupts = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            // The listener alone ends: established connections carry on in
            // their own processes; those waiting for one exit.
            _ = terms.recv() => {
                tracing::info!("Received signal 15; terminating.");
                crate::service_manager::notify("STOPPING=1");
                return Ok(());
            }
            _ = interrupts.recv() => {
                tracing::info!("Received signal 2; terminating.");
                return Ok(());
            }
            ended = loops.join_next() => return match ended {
                Some(Ok(r)) => r,
                Some(Err(e)) => Err(e.into()),
                None => Ok(()),
            },
            _ = hangups.recv() => {
                crate::service_manager::notify("RELOADING=1");
                reload_settings(&shared, &reload).await;
                crate::service_manager::notify("READY=1");
            }
        }
    }
}

/// `SIGHUP`: the configuration read again, for new connections; on any
/// failure the one in force stays.
async fn reload_settings(shared: &Shared, reload: &Reload) {
    tracing::info!("SIGHUP: reading the configuration again");
    let settings = match reload() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("configuration not reloaded, the one in force stays: {e:#}");
            return;
        }
    };
    if let Err(e) = shared.pool.reload().await {
        tracing::error!("configuration not reloaded, the one in force stays: {e}");
        return;
    }
    let old = shared.admission();
    if old.settings.listen != settings.listen {
        tracing::warn!("the listen addresses changed: they take effect when skiffd restarts");
    }
    *shared.admission.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(AdmissionRules {
        penalties: penalty_table(&settings),
        settings,
    });
    tracing::info!("configuration reloaded: new connections use it");
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

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) -> Result<()> {
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
        let admission = shared.admission();
        // A penalised source is turned away before anything else: the
        // socket is closed unanswered.
        if let Some(p) = &admission.penalties {
            let verdict = lock(p).admit(peer.ip(), std::time::Instant::now());
            match verdict {
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
        let settings = &admission.settings;
        let admitted = shared.startups.admit(
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
        if let Err(short) = shared
            .descriptors
            .admit(std::os::fd::AsRawFd::as_raw_fd(&stream))
        {
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
        let (pool, penalties) = (shared.pool.clone(), admission.penalties.clone());
        tokio::spawn(dispatch(stream, peer, pending, pool, penalties));
    }
}

/// How long a connection may wait for a process to serve it (when more
/// arrive at once than are kept ready).
const DISPATCH_WITHIN: Duration = Duration::from_secs(30);

/// Hands an admitted connection to a process of its own; a data-plane
/// stream whose first bytes are in goes to the process that owns it.
async fn dispatch(
    stream: TcpStream,
    peer: SocketAddr,
    pending: Pending,
    pool: Arc<WorkerPool>,
    penalties: Option<SharedPenalties>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, "TCP_NODELAY: {e}");
    }
    if starts_with_data_plane_magic(&stream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        // What a connection process writes first, whatever the client is:
        // the data plane's client reads past it.
        let banner = crate::ident_ahead::identification_line();
        let mut magic = [0u8; skiff_proto::dataplane::MAGIC.len()];
        if stream.write_all(banner.as_bytes()).await.is_ok()
            && stream.read_exact(&mut magic).await.is_ok()
        {
            let registry = crate::stream_relay::Registry::default();
            crate::stream_relay::accept_stream(&registry, stream, peer, pending).await;
        }
        return;
    }
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(%peer, "{e}");
            return;
        }
    };
    // The identification line goes out now, not once the connection's
    // process has it: the client's next flight (its KEXINIT) travels while
    // the connection is handed over (`crate::ident_ahead`). A fresh
    // socket takes these few bytes at once; whatever it did not take, the
    // process writes.
    let ident_sent = stream
        .try_write(crate::ident_ahead::identification_line().as_bytes())
        .unwrap_or(0);
    let mut socket: OwnedFd = match stream.into_std() {
        Ok(s) => s.into(),
        Err(e) => {
            tracing::debug!(%peer, "{e}");
            return;
        }
    };
    let mut assignment = Assignment {
        pending,
        peer,
        penalties,
    };
    loop {
        let Some(worker) = pool.take(DISPATCH_WITHIN).await else {
            tracing::error!(%peer, "dropping connection: no connection process ready within {}s", DISPATCH_WITHIN.as_secs());
            return;
        };
        match worker.serve(socket, peer, local, ident_sent as u32, assignment) {
            Ok(()) => return,
            // That process was gone: the next one.
            Err((s, a)) => (socket, assignment) = (s, a),
        }
    }
}

/// Whether the data-plane magic is already waiting on `stream` (a peek: SSH
/// and anything not yet arrived go to a connection process, which tells
/// them apart itself).
fn starts_with_data_plane_magic(stream: &TcpStream) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut buf = [0u8; skiff_proto::dataplane::MAGIC.len()];
    let fd = std::os::fd::AsRawFd::as_raw_fd(stream);
    match recv(fd, &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(n) if n == buf.len() => skiff_proto::dataplane::sniff(&buf) == Sniff::DataPlane,
        _ => false,
    }
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
