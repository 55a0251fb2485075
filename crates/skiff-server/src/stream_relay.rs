//! skiffd's side of the data plane, in the server process: telling data-plane
//! connections apart from SSH on the shared port ([`Sniffed`]), the relay
//! with each transfer process (policy, stream tokens), and handing an
//! accepted stream's socket to the transfer process that owns its token.
//!
//! The transfer process itself (running as the account, doing the file I/O
//! and the record crypto) is `crate::transfer_process`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, MsgFlags};
use skiff_proto::dataplane::{self as dp, RelayMsg, Sniff, MAGIC, TOKEN_LEN};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Settings;
use crate::ident_ahead::IdentAhead;

/// How long a stream token stays valid.
const TOKEN_LIFETIME: Duration = Duration::from_secs(30);

/// Most streams one transfer may open.
pub const MAX_STREAMS: u32 = 16;

/// How long a data-plane connection may take to present its token, once
/// its magic is in. A client sends the token in the same write as the
/// magic, so this only has to cover a lost segment; until the token checks
/// out the connection counts against `MaxStartups` and
/// `PerSourceMaxStartups`, so a peer that sends the magic and nothing else
/// holds a place (and its descriptors) this long at most.
pub const TOKEN_WAIT: Duration = Duration::from_secs(3);

/// A token waiting for its stream.
struct Pending {
    index: u32,
    peer: IpAddr,
    expires: Instant,
    relay: Arc<AsyncFd<OwnedFd>>,
}

/// Outstanding stream tokens of every transfer on this server (this
/// process: one connection's, or inetd mode's), and whether streams can
/// reach it at all.
#[derive(Default)]
pub struct Registry {
    tokens: Mutex<HashMap<[u8; TOKEN_LEN], Pending>>,
    /// Its inbox listens (`crate::stream_route`): streams that reach
    /// another skiffd process can be handed here. Until then no transfer
    /// is granted streams.
    inbox: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// Streams can be handed to this process from now on.
    pub fn inbox_listens(&self) {
        self.inbox.store(true, std::sync::atomic::Ordering::Release);
    }

    fn takes_streams(&self) -> bool {
        self.inbox.load(std::sync::atomic::Ordering::Acquire)
    }

    fn issue(
        &self,
        count: u32,
        peer: IpAddr,
        relay: &Arc<AsyncFd<OwnedFd>>,
    ) -> Vec<[u8; TOKEN_LEN]> {
        let now = Instant::now();
        let mut map = self.tokens.lock().expect("registry lock");
        map.retain(|_, p| p.expires > now);
        (0..count)
            .map(|index| {
                let mut token = [0u8; TOKEN_LEN];
                rand::fill(&mut token);
                // Whichever skiffd process the stream reaches finds this
                // one by the token (`crate::stream_route`).
                skiff_proto::worker_wire::mark_token(&mut token, std::process::id());
                map.insert(
                    token,
                    Pending {
                        index,
                        peer,
                        expires: now + TOKEN_LIFETIME,
                        relay: relay.clone(),
                    },
                );
                token
            })
            .collect()
    }

    /// Takes a token (single use): its stream index and relay, if it is
    /// known, unexpired and was issued to a session from `peer`.
    fn redeem(
        &self,
        token: &[u8; TOKEN_LEN],
        peer: IpAddr,
    ) -> Result<(u32, Arc<AsyncFd<OwnedFd>>), &'static str> {
        let pending = self.tokens.lock().expect("registry lock").remove(token);
        match pending {
            None => Err("unknown or already used token"),
            Some(p) if p.expires <= Instant::now() => Err("expired token"),
            Some(p) if p.peer != peer => Err("token issued to another peer"),
            Some(p) => Ok((p.index, p.relay)),
        }
    }

    fn forget(&self, relay: &Arc<AsyncFd<OwnedFd>>) {
        self.tokens
            .lock()
            .expect("registry lock")
            .retain(|_, p| !Arc::ptr_eq(&p.relay, relay));
    }
}

/// What a relay applies of the server's settings: whether the data plane
/// is on (`DataPlane`) and where it may run unencrypted
/// (`DataPlaneUnencrypted`).
#[derive(Debug, Clone, Copy)]
pub struct RelayPolicy {
    pub data_plane: bool,
    pub unencrypted_data_plane: crate::config::UnencryptedPolicy,
}

impl RelayPolicy {
    pub fn of(settings: &Settings) -> RelayPolicy {
        RelayPolicy {
            data_plane: settings.data_plane,
            unencrypted_data_plane: settings.unencrypted_data_plane,
        }
    }
}

/// How a granted transfer ended, as its relay saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferEnd {
    pub mode: dp::Mode,
    /// Streams granted.
    pub streams: u32,
    /// The transfer process's own account ([`RelayMsg::Report`]), or
    /// `None` when it ended without one (it died, or was killed).
    pub report: Option<dp::TransferReport>,
    /// From the grant to the report (or to the process's end).
    pub duration: Duration,
}

/// Serves one transfer process's requests until it exits: applies the
/// server's policy to the mode the client asked for and issues tokens
/// from `registry`. Once a granted transfer is over (the process reported,
/// or went away without reporting), `ended` hears how it went.
pub fn spawn_relay(
    settings: RelayPolicy,
    registry: Arc<Registry>,
    ours: OwnedFd,
    peer: SocketAddr,
    local: SocketAddr,
    ended: impl FnOnce(TransferEnd) + Send + 'static,
) {
    let mut ended = Some(ended);
    // Set once streams are granted: (mode, streams, when).
    let mut granted: Option<(dp::Mode, u32, Instant)> = None;
    tokio::spawn(async move {
        // SAFETY: the AsyncFd owns the descriptor for as long as it is registered.
        let relay = match unsafe { AsyncFd::register(ours) } {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                tracing::warn!(%peer, "data plane relay: {e}");
                return;
            }
        };
        let mut buf = vec![0u8; 4096];
        // One request per transfer: a process asking again is misbehaving.
        let mut asked = false;
        loop {
            let n = match relay.readable().await {
                Ok(mut guard) => match guard.try_io(|fd| {
                    socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
                        .map_err(io::Error::from)
                }) {
                    Ok(Ok(n)) => n,
                    Ok(Err(_)) => break,
                    Err(_would_block) => continue,
                },
                Err(_) => break,
            };
            if n == 0 {
                break; // the transfer process exited
            }
            let reply = match dp::decode_relay(&buf[..n]) {
                // The process's statistics, after a grant, once; believed
                // for the audit record only.
                Ok(RelayMsg::Report(report)) => {
                    match (granted, ended.take()) {
                        (Some((mode, streams, at)), Some(ended)) => ended(TransferEnd {
                            mode,
                            streams,
                            report: Some(report),
                            duration: at.elapsed(),
                        }),
                        _ => {
                            tracing::warn!(%peer, "data plane relay: a report out of turn; closing");
                            break;
                        }
                    }
                    continue;
                }
                Ok(RelayMsg::Request { .. }) if asked => {
                    tracing::warn!(%peer, "data plane relay: a second request for streams; closing");
                    break;
                }
                Ok(RelayMsg::Request { mode, streams }) => {
                    asked = true;
                    if !settings.data_plane {
                        RelayMsg::Denied {
                            reason: "the data plane is turned off on this server (DataPlane no)"
                                .into(),
                        }
                    } else if streams == 0 {
                        // The files travel on the SSH channel alone: no
                        // token, and nothing leaves the session's
                        // encryption, whatever mode was asked.
                        tracing::debug!(%peer, "data plane: no streams, the channel alone");
                        granted = Some((mode, 0, Instant::now()));
                        RelayMsg::Granted { tokens: Vec::new() }
                    } else if streams > MAX_STREAMS {
                        RelayMsg::Denied {
                            reason: format!(
                                "{streams} streams asked; skiffd allows 1 to {MAX_STREAMS} (or none, for the channel alone)"
                            ),
                        }
                    } else if !registry.takes_streams() {
                        RelayMsg::Denied {
                            reason: "this connection's skiffd process cannot take data-plane streams (see the server's log); copy without the data plane"
                                .into(),
                        }
                    } else if mode != dp::Mode::Aead
                        && !settings
                            .unencrypted_data_plane
                            .allows(peer.ip(), local.ip())
                    {
                        tracing::info!(%peer, "data plane: {mode} refused by DataPlaneUnencrypted policy");
                        RelayMsg::Denied {
                            reason: format!(
                                "mode {mode} refused: skiffd's policy (DataPlaneUnencrypted {}) does not allow unencrypted transfers between {} and {}",
                                match settings.unencrypted_data_plane {
                                    crate::config::UnencryptedPolicy::Loopback => "loopback",
                                    crate::config::UnencryptedPolicy::Any => "yes",
                                    crate::config::UnencryptedPolicy::Never => "no",
                                },
                                peer.ip(),
                                local.ip()
                            ),
                        }
                    } else {
                        tracing::debug!(%peer, "data plane: {streams} streams, mode {mode}");
                        granted = Some((mode, streams, Instant::now()));
                        RelayMsg::Granted {
                            tokens: registry.issue(streams, peer.ip(), &relay),
                        }
                    }
                }
                Ok(other) => {
                    tracing::warn!(%peer, "data plane relay: unexpected {other:?}");
                    break;
                }
                Err(e) => {
                    tracing::warn!(%peer, "data plane relay: {e}");
                    break;
                }
            };
            if send_relay(&relay, &reply, None).await.is_err() {
                break;
            }
        }
        registry.forget(&relay);
        if let (Some((mode, streams, at)), Some(ended)) = (granted, ended.take()) {
            ended(TransferEnd {
                mode,
                streams,
                report: None,
                duration: at.elapsed(),
            });
        }
    });
}

/// Sends one relay message, with a socket passed alongside when given.
async fn send_relay(relay: &AsyncFd<OwnedFd>, msg: &RelayMsg, fd: Option<RawFd>) -> io::Result<()> {
    let fds: Vec<RawFd> = fd.into_iter().collect();
    crate::seqpacket::send(relay, &dp::encode_relay(msg), &fds).await
}

/// Serves a connection that began with the data-plane magic: reads its
/// token and hands the socket to the transfer process that owns the token,
/// through the connection process that issued it when that is another
/// ([`crate::stream_route`]). Anything wrong closes the connection.
/// `unauthenticated` is the connection's place among those not yet
/// authenticated: it is given back once the token is in (checked here, or
/// handed to its owner, which checks it), and otherwise when the connection
/// closes.
pub async fn accept_stream(
    registry: &Registry,
    mut stream: TcpStream,
    peer: SocketAddr,
    mut unauthenticated: crate::startups::Pending,
) {
    let token = read_token(&mut stream, peer).await;
    let Some(token) = token else {
        return;
    };
    let owner = skiff_proto::worker_wire::token_owner(&token);
    if owner == std::process::id() {
        unauthenticated.release();
        deliver(registry, &token, stream.as_raw_fd(), peer).await;
        return;
    }
    // A second descriptor goes to the owner; this one is closed once the
    // outcome is logged.
    let handed = match stream.as_fd().try_clone_to_owned() {
        Ok(socket) => crate::stream_route::hand_over(owner, token, peer, socket).await,
        Err(e) => Err(crate::stream_route::HandOverError::Io(owner, e)),
    };
    unauthenticated.release();
    if let Err(e) = handed {
        tracing::warn!(%peer, "data-plane connection refused: {e}");
    }
    drop(stream);
}

/// Hands a data-plane stream whose token was issued here to its transfer
/// process, if the token checks out (logged otherwise). The caller's
/// descriptor stays the caller's to close; the transfer process gets its
/// own.
pub async fn deliver(
    registry: &Registry,
    token: &[u8; TOKEN_LEN],
    stream: RawFd,
    peer: SocketAddr,
) {
    let (index, relay) = match registry.redeem(token, peer.ip()) {
        Ok(x) => x,
        Err(why) => {
            tracing::warn!(%peer, "data-plane connection refused: {why}");
            return;
        }
    };
    if let Err(e) = send_relay(&relay, &RelayMsg::Stream { index }, Some(stream)).await {
        tracing::info!(%peer, "data-plane stream {index}: the transfer process is gone: {e}");
    }
}

/// Reads a data-plane connection's token, waiting [`TOKEN_WAIT`] at most;
/// `None` (logged) when the connection is to be closed.
pub async fn read_token(stream: &mut TcpStream, peer: SocketAddr) -> Option<[u8; TOKEN_LEN]> {
    let mut token = [0u8; TOKEN_LEN];
    match tokio::time::timeout(TOKEN_WAIT, stream.read_exact(&mut token)).await {
        Ok(Ok(_)) => Some(token),
        // A client dials its streams while its request is on the way, and
        // closes them unused when the files came on the channel instead.
        Ok(Err(_)) => {
            tracing::debug!(%peer, "data-plane connection closed before its token");
            None
        }
        Err(_) => {
            tracing::info!(%peer, "data-plane connection closed: no token within {}s", TOKEN_WAIT.as_secs());
            None
        }
    }
}

/// A TCP connection whose first bytes are checked before SSH sees them.
/// SSH clients (which begin with `SSH-`) pass through untouched, and the
/// server's identification line is written as usual. A connection that
/// begins with the data-plane magic, or with anything that is not an SSH
/// identification line, makes the first read fail and records what it was
/// in the [`FirstBytes`], so the caller can take the socket over (a data
/// stream) or answer it as sshd does (the server has written only its
/// identification line).
pub struct Sniffed {
    inner: TcpStream,
    state: SniffState,
    verdict: FirstBytes,
    ahead: IdentAhead,
}

/// What a [`Sniffed`] connection turned out to be, once its first read
/// failed because of it: [`Sniff::DataPlane`] or [`Sniff::NotSsh`].
#[derive(Clone, Default)]
pub struct FirstBytes(Arc<std::sync::OnceLock<Sniff>>);

impl FirstBytes {
    pub fn get(&self) -> Option<Sniff> {
        self.0.get().copied()
    }
}

enum SniffState {
    Sniffing(Vec<u8>),
    Replaying(Vec<u8>, usize),
    Passing,
}

impl Sniffed {
    /// `ahead`: what of the identification line the listener already
    /// wrote, not written again ([`crate::ident_ahead`]).
    pub fn new(inner: TcpStream, verdict: FirstBytes, ahead: IdentAhead) -> Sniffed {
        Sniffed {
            inner,
            state: SniffState::Sniffing(Vec::with_capacity(MAGIC.len())),
            verdict,
            ahead,
        }
    }

    /// For a write of `buf`: the part of it already written ahead, if any.
    fn written_ahead(&mut self, buf: &[u8]) -> Option<io::Result<usize>> {
        if !self.ahead.pending() {
            return None;
        }
        match self.ahead.skip(buf) {
            Ok(0) => None,
            Ok(n) => Some(Ok(n)),
            Err(e) => Some(Err(io::Error::new(io::ErrorKind::InvalidData, e))),
        }
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                SniffState::Sniffing(seen) => {
                    // Never read past the magic: what follows belongs to
                    // whoever takes the connection.
                    let mut tmp = [0u8; MAGIC.len()];
                    let want = MAGIC.len() - seen.len();
                    let mut rb = ReadBuf::new(&mut tmp[..want]);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {}
                    }
                    let got = rb.filled();
                    if got.is_empty() {
                        let seen = std::mem::take(seen);
                        this.state = SniffState::Replaying(seen, 0);
                        continue;
                    }
                    seen.extend_from_slice(got);
                    match dp::sniff(seen) {
                        Sniff::Undecided => continue,
                        Sniff::Ssh => {
                            let seen = std::mem::take(seen);
                            this.state = SniffState::Replaying(seen, 0);
                        }
                        other => {
                            let _ = this.verdict.0.set(other);
                            return Poll::Ready(Err(io::Error::other(match other {
                                Sniff::DataPlane => "data-plane connection",
                                _ => "not an SSH client",
                            })));
                        }
                    }
                }
                SniffState::Replaying(bytes, pos) => {
                    if *pos >= bytes.len() {
                        let empty = bytes.is_empty();
                        this.state = SniffState::Passing;
                        if empty {
                            return Poll::Ready(Ok(())); // EOF before anything
                        }
                        continue;
                    }
                    let n = (bytes.len() - *pos).min(out.remaining());
                    out.put_slice(&bytes[*pos..*pos + n]);
                    *pos += n;
                    return Poll::Ready(Ok(()));
                }
                SniffState::Passing => return Pin::new(&mut this.inner).poll_read(cx, out),
            }
        }
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(done) = self.written_ahead(buf) {
            return Poll::Ready(done);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.ahead.pending() {
            if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
                if let Some(done) = self.written_ahead(first) {
                    return Poll::Ready(done);
                }
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay() -> Arc<AsyncFd<OwnedFd>> {
        let (ours, _theirs) = crate::seqpacket::pair().expect("socketpair");
        // SAFETY: the AsyncFd owns the descriptor for as long as it is registered.
        Arc::new(unsafe { AsyncFd::register(ours) }.expect("AsyncFd"))
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 8));

    /// Each token names its stream, and opens it once.
    #[tokio::test]
    async fn a_token_is_good_for_one_stream_once() {
        let registry = Registry::default();
        let relay = relay();
        let tokens = registry.issue(3, CLIENT, &relay);
        assert_eq!(tokens.len(), 3);
        assert!(tokens[0] != tokens[1] && tokens[1] != tokens[2]);
        for (i, token) in tokens.iter().enumerate() {
            let (index, to) = registry.redeem(token, CLIENT).expect("first use");
            assert_eq!(index, i as u32);
            assert!(Arc::ptr_eq(&to, &relay));
        }
        assert_eq!(
            registry.redeem(&tokens[1], CLIENT).err(),
            Some("unknown or already used token")
        );
        assert!(registry.redeem(&[0u8; TOKEN_LEN], CLIENT).is_err());
    }

    /// A token shown from an address other than the SSH client's is
    /// refused, and spent: the stream it was for can no longer be opened.
    #[tokio::test]
    async fn a_token_is_bound_to_the_client_address() {
        let registry = Registry::default();
        let relay = relay();
        let tokens = registry.issue(1, CLIENT, &relay);
        assert_eq!(
            registry.redeem(&tokens[0], OTHER).err(),
            Some("token issued to another peer")
        );
        assert!(registry.redeem(&tokens[0], CLIENT).is_err());
    }

    /// An expired token opens nothing, and issuing drops expired ones.
    #[tokio::test]
    async fn expired_tokens_are_refused_and_dropped() {
        let registry = Registry::default();
        let relay = relay();
        let stale = [7u8; TOKEN_LEN];
        let plant = || {
            let expired = Pending {
                index: 0,
                peer: CLIENT,
                expires: Instant::now(),
                relay: relay.clone(),
            };
            registry.tokens.lock().unwrap().insert(stale, expired);
        };
        plant();
        assert_eq!(registry.redeem(&stale, CLIENT).err(), Some("expired token"));
        plant();
        registry.issue(1, CLIENT, &relay);
        assert!(!registry.tokens.lock().unwrap().contains_key(&stale));
    }

    /// The transfer process's side of a relay, for tests.
    struct Process(AsyncFd<OwnedFd>);

    impl Process {
        async fn send(&self, msg: RelayMsg) {
            send_relay(&self.0, &msg, None).await.expect("send");
        }

        /// The next message, or `None` once skiffd closed the relay.
        async fn recv(&self) -> Option<RelayMsg> {
            let mut buf = vec![0u8; 4096];
            loop {
                let mut guard = self.0.readable().await.expect("readable");
                if let Ok(r) = guard.try_io(|fd| {
                    socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
                        .map_err(io::Error::from)
                }) {
                    let n = r.expect("recv");
                    return (n > 0).then(|| dp::decode_relay(&buf[..n]).expect("decode"));
                }
            }
        }
    }

    /// A relay on loopback (where every mode is allowed) and what it says
    /// when its transfer ends.
    fn spawn_loopback() -> (Process, tokio::sync::oneshot::Receiver<TransferEnd>) {
        let policy = RelayPolicy {
            data_plane: true,
            unencrypted_data_plane: crate::config::UnencryptedPolicy::Loopback,
        };
        let (ours, theirs) = crate::seqpacket::pair().expect("socketpair");
        let at: SocketAddr = "127.0.0.1:2222".parse().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let registry = Arc::new(Registry::default());
        registry.inbox_listens();
        spawn_relay(policy, registry, ours, at, at, move |end| {
            let _ = tx.send(end);
        });
        // SAFETY: the AsyncFd owns the descriptor for as long as it is registered.
        let process = Process(unsafe { AsyncFd::register(theirs) }.expect("AsyncFd"));
        (process, rx)
    }

    async fn granted(process: &Process) {
        process
            .send(RelayMsg::Request {
                mode: dp::Mode::Integrity,
                streams: 2,
            })
            .await;
        assert!(matches!(
            process.recv().await,
            Some(RelayMsg::Granted { tokens }) if tokens.len() == 2
        ));
    }

    /// A process whose inbox does not listen cannot be handed streams: its
    /// transfers are refused with a reason, not granted tokens no stream
    /// could redeem.
    #[tokio::test]
    async fn no_streams_are_granted_without_an_inbox() {
        let policy = RelayPolicy {
            data_plane: true,
            unencrypted_data_plane: crate::config::UnencryptedPolicy::Loopback,
        };
        let (ours, theirs) = crate::seqpacket::pair().expect("socketpair");
        let at: SocketAddr = "127.0.0.1:2222".parse().unwrap();
        spawn_relay(policy, Arc::default(), ours, at, at, |_| {});
        // SAFETY: the AsyncFd owns the descriptor for as long as it is registered.
        let process = Process(unsafe { AsyncFd::register(theirs) }.expect("AsyncFd"));
        process
            .send(RelayMsg::Request {
                mode: dp::Mode::Aead,
                streams: 2,
            })
            .await;
        assert!(matches!(
            process.recv().await,
            Some(RelayMsg::Denied { reason }) if reason.contains("cannot take data-plane streams")
        ));
    }

    /// A granted transfer's end carries the process's report; one whose
    /// process goes without reporting ends with none; a report before any
    /// grant is refused (the relay closes) and ends nothing.
    #[tokio::test]
    async fn a_transfer_ends_with_its_processs_report_or_without_one() {
        let report = dp::TransferReport {
            direction: dp::TransferDirection::Upload,
            files: 2,
            bytes: 12345,
            failed: 0,
            completed: true,
        };
        let (process, ended) = spawn_loopback();
        granted(&process).await;
        process.send(RelayMsg::Report(report)).await;
        let end = ended.await.expect("ended");
        assert_eq!(end.mode, dp::Mode::Integrity);
        assert_eq!(end.streams, 2);
        assert_eq!(end.report, Some(report));

        let (process, ended) = spawn_loopback();
        granted(&process).await;
        drop(process);
        let end = ended.await.expect("ended");
        assert_eq!(end.report, None);
        assert_eq!(end.streams, 2);

        let (process, ended) = spawn_loopback();
        process.send(RelayMsg::Report(report)).await;
        assert_eq!(process.recv().await, None, "the relay closes");
        assert!(ended.await.is_err(), "nothing was granted, nothing ended");
    }

    /// When a transfer ends, its unused tokens go with it; another
    /// transfer's stay.
    #[tokio::test]
    async fn a_finished_transfer_takes_its_tokens_along() {
        let registry = Registry::default();
        let (ended, running) = (relay(), relay());
        let gone = registry.issue(2, CLIENT, &ended);
        let kept = registry.issue(1, CLIENT, &running);
        registry.forget(&ended);
        assert!(gone.iter().all(|t| registry.redeem(t, CLIENT).is_err()));
        assert!(registry.redeem(&kept[0], CLIENT).is_ok());
    }
}
