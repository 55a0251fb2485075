//! One connection's process: forked by the zygote (`crate::zygote`) with
//! the configuration and host keys already read, it starts its runtime,
//! opens what every connection needs (`crate::connection::prepare`) and its
//! data-plane inbox (`crate::stream_route`), tells the listener it is
//! ready, and waits. Once handed a connection it serves that one alone, to
//! its end, and exits; it tells the listener when the client authenticated
//! (its place among the unauthenticated is free) and how the connection's
//! unauthenticated part ended (`PerSourcePenalties`).
//!
//! Nothing a connection does reaches another's process: a panic, a crash, a
//! limit hit or a `kill -9` ends this connection only. The listener is not
//! needed once the connection is handed over: restarting it (or upgrading
//! skiffd) leaves the connection running to its end. A process the listener
//! retires before handing it anything (its socket closes) exits at once.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use skiff_proto::worker_wire::{FromWorker, ToWorker, MAX_MESSAGE};
use tokio::io::unix::AsyncFd;

use crate::config::Settings;
use crate::connection::serve_connection;
use crate::hostkey::HostIdentity;
use crate::hot_code::HotCode;
use crate::ident_ahead::IdentAhead;
use crate::seqpacket::{recv, send, send_blocking};
use crate::startups::Pending;

/// How long an ending process waits for its audit and login records to be
/// written.
const FLUSH_WITHIN: Duration = Duration::from_secs(10);

/// How long an ending process waits for its sessions to end once they are
/// hung up.
const SESSIONS_END_WITHIN: Duration = Duration::from_secs(10);

/// The async runtime's worker threads in a connection process.
const CONNECTION_WORKER_THREADS: usize = 1;

/// Serves the listener on `control` (one connection at most); returns the
/// exit code.
pub fn serve(control: OwnedFd, settings: Settings, host: HostIdentity, hot: &HotCode) -> i32 {
    let starting = crate::warm_start::StartingQuietly::begin();
    // While it waits (and niced): the code a connection runs mapped in
    // now, not a folio at a time during its handshake.
    hot.map_in();
    // One worker thread for one connection, beside the thread that waits
    // in `block_on` (and the blocking pool, started on demand). Measured on
    // two CPUs: a cold exec 0.3 ms faster and 0.4-0.7 ms less CPU than with
    // one worker per CPU, whose start and exit every process paid for; a
    // current-thread runtime serving from `block_on` was slower still
    // (docs/BENCHMARKS.md).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CONNECTION_WORKER_THREADS)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("connection process: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let (code, audit) = runtime.block_on(async {
        // On one of the runtime's threads, as a connection task of the
        // listener's was: russh's session task and the handler's futures
        // then wake each other on the same threads, not across the thread
        // that blocks here (measured: a cold connection served from
        // `block_on` took more context switches and ~1.5 ms longer).
        let served = match tokio::spawn(serve_one(control, settings, host, starting)).await {
            Ok(served) => served,
            Err(e) => {
                tracing::error!("connection process: {e}");
                (1, None)
            }
        };
        // The connection is gone: its sessions hang their commands up and
        // clean after themselves (terminals, login records) on this
        // runtime meanwhile. A command that ignores the hang-up is left
        // running, as by sshd.
        let ended = tokio::task::spawn_blocking(|| {
            crate::backlog::SESSIONS.wait_empty(SESSIONS_END_WITHIN)
        })
        .await;
        if !matches!(ended, Ok(true)) {
            tracing::info!(
                "sessions still running {}s after their connection ended; the process ends without them",
                SESSIONS_END_WITHIN.as_secs()
            );
        }
        served
    });
    if let Some(audit) = audit {
        if !audit.flush(FLUSH_WITHIN) {
            tracing::warn!(
                "audit records still unwritten after {}s; the process ends without them",
                FLUSH_WITHIN.as_secs()
            );
        }
    }
    if !crate::login_writer::flush(FLUSH_WITHIN) {
        tracing::warn!(
            "login records still unwritten after {}s; the process ends without them",
            FLUSH_WITHIN.as_secs()
        );
    }
    // Reads of the client or a command may still wait in blocking threads.
    runtime.shutdown_background();
    code
}

/// What an ended connection leaves to flush.
type Audit = Option<Arc<crate::audit_writer::AuditLog>>;

/// Serves the listener until it hands over a connection, and that
/// connection to its end: the exit code, and the audit log to flush.
async fn serve_one(
    control: OwnedFd,
    settings: Settings,
    host: HostIdentity,
    starting: crate::warm_start::StartingQuietly,
) -> (i32, Audit) {
    if let Err(e) = nix::fcntl::fcntl(
        &control,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    ) {
        tracing::error!("connection process: {e}");
        return (1, None);
    }
    let inbox = match crate::stream_route::StreamInbox::bind() {
        Ok(inbox) => Some(inbox),
        Err(e) => {
            tracing::warn!(
                "connection process {}: no data-plane inbox ({e}); this connection is refused the data plane",
                std::process::id()
            );
            None
        }
    };
    let (config, state) = match crate::connection::prepare(settings, host) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!("connection process: {e:#}");
            return (1, None);
        }
    };
    if let Some(inbox) = inbox {
        state.registry.inbox_listens();
        tokio::spawn(inbox.serve(state.registry.clone()));
    }
    // The login's first read (`authorized_keys`) then finds its thread
    // already started.
    if let Err(e) = crate::account_files::start_spare_reader() {
        tracing::debug!("connection process: no reading thread started ahead: {e}");
    }
    // A plain descriptor for the "authenticated" note, which is sent from
    // wherever the handshake stands.
    let tell = match control.try_clone() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("connection process: {e}");
            return (1, None);
        }
    };
    // SAFETY: the AsyncFd owns the socket to the listener from here.
    let control = match unsafe { AsyncFd::register(control) } {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("connection process: {e}");
            return (1, None);
        }
    };
    starting.done();
    if send(&control, &FromWorker::Ready.encode(), &[])
        .await
        .is_err()
    {
        return (0, None);
    }
    let (peer, local, ident_sent, socket) = match recv(&control, MAX_MESSAGE).await {
        // Retired before it served anything.
        Ok(None) | Err(_) => return (0, None),
        Ok(Some((bytes, mut fds))) => match (ToWorker::decode(&bytes), fds.len()) {
            (
                Ok(ToWorker::Serve {
                    peer,
                    local,
                    ident_sent,
                }),
                1,
            ) => (peer, local, ident_sent, fds.pop().expect("one descriptor")),
            (decoded, n) => {
                tracing::error!(
                    "connection process: a malformed request from the listener ({decoded:?}, {n} descriptors)"
                );
                return (1, None);
            }
        },
    };
    let ahead = match IdentAhead::new(ident_sent as usize) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(%peer, "connection process: a malformed request from the listener: {e}");
            return (1, None);
        }
    };
    let stream = match crate::connection::taken_over(socket) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, "connection process: {e}");
            return (1, None);
        }
    };
    let pending = Pending::counted_elsewhere(move || {
        let _ = send_blocking(&tell, &FromWorker::Authenticated.encode(), &[]);
    });
    // A second descriptor keeps the connection open until the listener
    // has heard how it ended: a client that failed to log in sees the
    // close only once its penalty is on its way to the listener.
    let held = std::os::fd::AsFd::as_fd(&stream).try_clone_to_owned().ok();
    let (result, verdict) = serve_connection(
        crate::connection::Accepted { stream, ahead },
        peer,
        Some(local),
        config,
        &state,
        pending,
    )
    .await;
    match &result {
        // sshd's "Disconnected from user …" (or its pre-authentication
        // line) has said it already.
        Err(e) if crate::connection::closed_by_client(e) => {
            tracing::debug!(%peer, "connection closed by the client without a disconnect message");
        }
        Err(e) => tracing::info!(%peer, "connection ended: {e}"),
        Ok(()) => {}
    }
    let _ = send(&control, &FromWorker::Ended(verdict).encode(), &[]).await;
    drop(held);
    (0, state.audit.clone())
}
