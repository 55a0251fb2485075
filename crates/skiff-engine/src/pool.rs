//! A pool of authenticated connections shared by concurrent commands.
//!
//! Commands to the same destination (same user, host, port, identities and
//! host-key policy) run as channels of one warm connection. A server that
//! refuses another channel (OpenSSH's `MaxSessions`, 10 by default) teaches
//! the pool that connection's limit, and the command moves to another
//! connection, opened on demand. Dead connections are dropped and replaced.
//! Only channel opens are retried: once a command has started it is never
//! run twice. A connection with no channels for its persist time (the host's
//! `ControlPersist`, else the pool's default) is closed by [`Pool::close_idle`].
//!
//! A pool made with [`Pool::with_spare_sessions`] (the agent's) also keeps
//! one session channel open ahead on each connection
//! ([`crate::spare_session`]): a command takes it and makes its request at
//! once, and the next spare is opened beside the command. A spare counts
//! against the server's channel limit like a command's channel, and none is
//! opened when the limit leaves no room for it.
//!
//! A command whose local reader stops reading (`skiff exec h cat big | less`,
//! paused) would hold up its whole connection: russh grants window as data
//! arrives and waits for each channel's consumer, so the connection's other
//! channels wait too. A skiffd pauses that command's output when asked (see
//! `skiff_proto::flow` and [`crate::exec`]); other servers cannot be asked,
//! and there the pool notices instead: such a connection with an output
//! write blocked for [`STALL_AFTER`] takes no new channels, and new commands
//! go to another connection.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::connect::{connect, Connection};
use crate::error::{ErrorKind, SkiffError};
use crate::exec::{open_session, run_session, ExecRequest, ExitOutcome, OpenSession, WindowSize};
use crate::settings::ConnectSettings;
use crate::spare_session::{SparePhase, SpareSlot};
use skiff_proto::ssh_config::ControlPersist;

/// Most connections the pool opens to one destination.
pub const MAX_CONNECTIONS_PER_HOST: usize = 64;
/// Channel-open attempts for one command before giving up.
const MAX_OPEN_ATTEMPTS: usize = 16;
/// How long one output write may wait for its local reader before the
/// connection counts as held up and takes no new channels.
pub const STALL_AFTER: Duration = Duration::from_millis(200);

/// A channel [`Pool::exec_announcing_open`] opened: how long opening it
/// took (one round trip to the server, on a warm connection) and what the
/// server identified itself as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOpened {
    pub rtt: Duration,
    pub server: crate::server_id::ServerKind,
    /// The newest data-plane version the server is taken to speak
    /// ([`crate::server_id::ServerId::data_plane`]).
    pub data_plane: u32,
}

impl ChannelOpened {
    /// A channel on `conn` whose open took `rtt`.
    fn on(conn: &Connection, rtt: Duration) -> Self {
        ChannelOpened {
            rtt,
            server: conn.server_id.kind(),
            data_plane: conn.server_id.data_plane(),
        }
    }
}

/// What makes two commands able to share a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    user: String,
    hostname: String,
    port: u16,
    identity_files: Vec<PathBuf>,
    certificate_files: Vec<PathBuf>,
    identities_only: bool,
    identity_agent: Option<PathBuf>,
    known_hosts: Vec<PathBuf>,
    host_key_alias: Option<String>,
    revoked_host_keys: Vec<PathBuf>,
    pubkey_authentication: bool,
    required_rsa_size: u32,
    /// The way to the host (ProxyCommand, or the jump hosts' settings).
    proxy: Option<String>,
    algorithms: skiff_proto::algorithms::Algorithms,
    compression: bool,
    policy: String,
    /// Where the connection comes from.
    source: (
        skiff_proto::ssh_config::AddressFamily,
        Option<std::net::IpAddr>,
        Option<String>,
    ),
}

impl PoolKey {
    pub fn of(s: &ConnectSettings) -> Self {
        PoolKey {
            user: s.user.clone(),
            hostname: s.hostname.clone(),
            port: s.port,
            identity_files: s.identity_files.clone(),
            certificate_files: s.certificate_files.clone(),
            identities_only: s.identities_only,
            identity_agent: s.identity_agent.clone(),
            known_hosts: s
                .user_known_hosts
                .iter()
                .chain(&s.global_known_hosts)
                .cloned()
                .collect(),
            host_key_alias: s.host_key_alias.clone(),
            revoked_host_keys: s.revoked_host_keys.clone(),
            pubkey_authentication: s.pubkey_authentication,
            required_rsa_size: s.required_rsa_size,
            proxy: s.proxy.as_ref().map(|p| format!("{p:?}")),
            algorithms: s.algorithms.clone(),
            compression: s.compression,
            policy: crate::hostkeys::policy_name(s.strict_host_key_checking).to_string(),
            source: (s.address_family, s.bind_address, s.bind_interface.clone()),
        }
    }
}

/// One connection and what the pool knows about its capacity.
struct Member {
    conn: Connection,
    /// Channels currently open on it.
    open: AtomicUsize,
    /// Channels the server allows at once, learned from a refusal.
    limit: AtomicUsize,
    opened_at: Instant,
    /// When the last channel closed; None while channels are open.
    idle_since: Mutex<Option<Instant>>,
    /// How long it may stay idle: `None` means the pool's default,
    /// `Some(None)` forever (`ControlPersist yes`).
    persist: Option<Option<Duration>>,
    /// Command output received and input sent over it, in bytes.
    received: AtomicU64,
    sent: AtomicU64,
    /// Output writes waiting for their local reader: writer id → since when.
    blocked_writes: Mutex<HashMap<u64, Instant>>,
    /// A session channel opened ahead for the next command (pools made
    /// with [`Pool::with_spare_sessions`]).
    spare: Arc<SpareSlot>,
    /// The quickest channel open seen on it, in microseconds (`u64::MAX`
    /// before the first): the round trip a command on a spare reports.
    open_rtt_us: AtomicU64,
}

impl Member {
    fn new(conn: Connection) -> Self {
        let persist = match conn.settings.control_persist {
            None => None,
            Some(ControlPersist::No) => Some(Some(Duration::ZERO)),
            Some(ControlPersist::Yes) => Some(None),
            Some(ControlPersist::Duration(secs)) => Some(Some(Duration::from_secs(secs))),
        };
        Member {
            conn,
            open: AtomicUsize::new(1),
            limit: AtomicUsize::new(usize::MAX),
            opened_at: Instant::now(),
            idle_since: Mutex::new(None),
            persist,
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            blocked_writes: Mutex::new(HashMap::new()),
            spare: Arc::default(),
            open_rtt_us: AtomicU64::new(u64::MAX),
        }
    }

    /// Notes how long a channel open took.
    fn note_open_rtt(&self, rtt: Duration) {
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX - 1);
        self.open_rtt_us.fetch_min(us, Ordering::Relaxed);
    }

    /// The quickest channel open seen on it (zero before the first).
    fn open_rtt(&self) -> Duration {
        match self.open_rtt_us.load(Ordering::Relaxed) {
            u64::MAX => Duration::ZERO,
            us => Duration::from_micros(us),
        }
    }

    /// Channels it holds on the server: the commands' and a spare's.
    fn server_channels(&self) -> usize {
        self.open.load(Ordering::SeqCst) + usize::from(self.spare.holds_channel())
    }

    /// The server refused a channel asked for on it (a command's, whose
    /// slot is taken, or a spare's, being opened): its limit is what it
    /// holds besides that one, at least one. Returns that.
    fn learn_limit_from_refusal(&self) -> usize {
        let others = self.server_channels().saturating_sub(1).max(1);
        self.limit.fetch_min(others, Ordering::SeqCst);
        others
    }

    fn has_room(&self) -> bool {
        !self.conn.handle.is_closed()
            && self.server_channels() < self.limit.load(Ordering::SeqCst)
            && !self.held_up(Instant::now())
    }

    /// Whether a command's local reader has kept an output write waiting
    /// for [`STALL_AFTER`] or more at `now`. Never on a connection to a
    /// skiffd: it pauses a command's output when its reader is behind (see
    /// `skiff_proto::flow`), so a slow reader holds up no other channel.
    fn held_up(&self, now: Instant) -> bool {
        if self.conn.server_id.is_skiffd() {
            return false;
        }
        self.blocked_writes
            .lock()
            .expect("not poisoned")
            .values()
            .any(|since| now.saturating_duration_since(*since) >= STALL_AFTER)
    }

    /// Takes a channel slot; the caller holds the destination's member lock,
    /// so an idle check cannot close the connection in between.
    fn take_slot(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
        *self.idle_since.lock().expect("not poisoned") = None;
    }

    /// Whether it has been idle longer than it may be, at `now`.
    fn expired(&self, now: Instant, default_persist: Duration) -> bool {
        if self.open.load(Ordering::SeqCst) != 0 {
            return false;
        }
        let Some(since) = *self.idle_since.lock().expect("not poisoned") else {
            return false;
        };
        match self.persist.unwrap_or(Some(default_persist)) {
            None => false,
            Some(limit) => now.saturating_duration_since(since) >= limit,
        }
    }
}

/// Connections to one destination.
#[derive(Default)]
struct Destination {
    members: Mutex<Vec<Arc<Member>>>,
    /// Serialises connecting, so a burst of first commands opens one connection.
    connecting: tokio::sync::Mutex<()>,
}

impl Destination {
    /// A live member with room for another channel, reserving a slot on it.
    fn reserve(&self) -> Option<Arc<Member>> {
        let mut members = self.members.lock().expect("not poisoned");
        members.retain(|m| !m.conn.handle.is_closed());
        let m = members.iter().find(|m| m.has_room())?.clone();
        m.take_slot();
        Some(m)
    }

    fn len(&self) -> usize {
        self.members.lock().expect("not poisoned").len()
    }

    /// A live member's parked spare, claimed, with a slot reserved on that
    /// member for the command. `refused` says of a connection that the
    /// command cannot use it at all (the data plane on a server that is not
    /// a skiffd): its spare is left for another command.
    fn claim_spare(
        &self,
        refused: impl Fn(&Member) -> bool,
    ) -> Option<(Arc<Member>, crate::spare_session::Claim)> {
        let mut members = self.members.lock().expect("not poisoned");
        members.retain(|m| !m.conn.handle.is_closed());
        let now = Instant::now();
        members
            .iter()
            .filter(|m| !m.held_up(now) && !refused(m))
            .find_map(|m| {
                let claim = m.spare.claim()?;
                m.take_slot();
                Some((m.clone(), claim))
            })
    }
}

/// Opens one channel on a connection (see [`Pool::open_channel`]).
type Opener<'a, T> = dyn for<'c> Fn(&'c Connection) -> futures::future::BoxFuture<'c, Result<T, SkiffError>>
    + Send
    + Sync
    + 'a;

/// A session channel [`Pool::open`] got for a command.
struct Opened {
    session: OpenSession,
    channel: ChannelOpened,
    slot: Slot,
    notices: Vec<String>,
    /// It is a spare, opened ahead ([`crate::spare_session`]), and was
    /// parked this long.
    spare_age: Option<Duration>,
}

/// A channel slot on a member, released when the command ends.
struct Slot(Arc<Member>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut idle_since = self.0.idle_since.lock().expect("not poisoned");
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            *idle_since = Some(Instant::now());
        }
    }
}

/// A snapshot of one pooled connection, for status displays.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub destination: String,
    pub open_channels: usize,
    pub learned_limit: Option<usize>,
    pub age: Duration,
    /// How long it has had no channels; None while in use.
    pub idle: Option<Duration>,
    /// Command output received over it, in bytes.
    pub bytes_received: u64,
    /// Command input sent over it, in bytes.
    pub bytes_sent: u64,
    /// A command's local reader is holding it up: it takes no new channels.
    pub held_up: bool,
    /// A session channel is open ahead for the next command.
    pub spare: bool,
    /// Commands that started on a channel opened ahead.
    pub spares_taken: u64,
}

/// The pool. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Pool {
    destinations: Mutex<HashMap<PoolKey, Arc<Destination>>>,
    /// Keep a session channel open ahead on each connection, for at most
    /// this long ([`crate::spare_session`]).
    spares: Option<Duration>,
}

impl Pool {
    pub fn new() -> Self {
        Self::default()
    }

    /// A pool that keeps one session channel open ahead of need on each of
    /// its connections, so that a command on a warm connection makes its
    /// request at once instead of opening a channel first: one round trip
    /// fewer for each command but a connection's first
    /// ([`crate::spare_session`]). A spare not used within `lifetime` is
    /// closed. The agent's pool is one, with
    /// [`crate::spare_session::SPARE_LIFETIME`].
    pub fn with_spare_sessions(lifetime: Duration) -> Self {
        Pool {
            spares: Some(lifetime),
            ..Self::default()
        }
    }

    fn destination(&self, key: PoolKey) -> Arc<Destination> {
        self.destinations
            .lock()
            .expect("not poisoned")
            .entry(key)
            .or_default()
            .clone()
    }

    /// Live connections to the destination of `settings`.
    pub fn connection_count(&self, settings: &ConnectSettings) -> usize {
        let map = self.destinations.lock().expect("not poisoned");
        map.get(&PoolKey::of(settings)).map_or(0, |d| d.len())
    }

    /// Every pooled connection, for `status` output.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let map = self.destinations.lock().expect("not poisoned");
        let mut out = Vec::new();
        for (key, dest) in map.iter() {
            for m in dest.members.lock().expect("not poisoned").iter() {
                let limit = m.limit.load(Ordering::SeqCst);
                out.push(ConnectionInfo {
                    destination: format!("{}@{}:{}", key.user, key.hostname, key.port),
                    open_channels: m.open.load(Ordering::SeqCst),
                    learned_limit: (limit != usize::MAX).then_some(limit),
                    age: m.opened_at.elapsed(),
                    idle: m
                        .idle_since
                        .lock()
                        .expect("not poisoned")
                        .map(|t| t.elapsed()),
                    bytes_received: m.received.load(Ordering::Relaxed),
                    bytes_sent: m.sent.load(Ordering::Relaxed),
                    held_up: m.held_up(Instant::now()),
                    spare: m.spare.phase() == SparePhase::Ready,
                    spares_taken: m.spare.taken(),
                });
            }
        }
        out
    }

    /// Live connections to the destination of `settings` (what `ssh -O
    /// check` asks of a master).
    pub fn live_connections(&self, settings: &ConnectSettings) -> usize {
        let map = self.destinations.lock().expect("not poisoned");
        map.get(&PoolKey::of(settings)).map_or(0, |d| {
            let members = d.members.lock().expect("not poisoned");
            members
                .iter()
                .filter(|m| !m.conn.handle.is_closed())
                .count()
        })
    }

    /// Forgets the connections to the destination of `settings` (`ssh -O
    /// stop`): idle ones close now, busy ones once their commands end, and
    /// the next command connects anew. Returns how many were live.
    pub fn forget_destination(&self, settings: &ConnectSettings) -> usize {
        let live = self.live_connections(settings);
        let mut map = self.destinations.lock().expect("not poisoned");
        map.remove(&PoolKey::of(settings));
        live
    }

    /// Closes and forgets every connection to `hostname` (all users and ports).
    pub fn forget(&self, hostname: &str) -> usize {
        let mut map = self.destinations.lock().expect("not poisoned");
        let before = map.len();
        map.retain(|k, _| k.hostname != hostname);
        before - map.len()
    }

    /// Number of pooled connections, all destinations together.
    pub fn len(&self) -> usize {
        let map = self.destinations.lock().expect("not poisoned");
        map.values().map(|d| d.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes connections that have had no channels for longer than their
    /// persist time (`default_persist` unless the host's ControlPersist says
    /// otherwise) and connections that died. Returns how many were closed.
    pub async fn close_idle(&self, default_persist: Duration) -> usize {
        let now = Instant::now();
        let mut closing = Vec::new();
        {
            let map = self.destinations.lock().expect("not poisoned");
            for dest in map.values() {
                let mut members = dest.members.lock().expect("not poisoned");
                members.retain(|m| {
                    let dead = m.conn.handle.is_closed();
                    if dead || m.expired(now, default_persist) {
                        closing.push(m.clone());
                        false
                    } else {
                        true
                    }
                });
            }
        }
        let count = closing.len();
        for m in closing {
            if !m.conn.handle.is_closed() {
                tracing::info!(
                    "closing idle connection to {}@{}:{}",
                    m.conn.settings.user,
                    m.conn.settings.hostname,
                    m.conn.settings.port
                );
                let _ = m
                    .conn
                    .handle
                    .disconnect(russh::Disconnect::ByApplication, "idle", "en")
                    .await;
            }
        }
        count
    }

    /// Opens a session channel to the destination, on a pooled connection
    /// when one has room, otherwise on a new one. Also returns how long the
    /// channel open took (one round trip, the connecting left out) and the
    /// notices of a connection opened for it (a newly recorded host key,
    /// say), which belong to this command's user. A spare is taken when
    /// `spare` allows and one is parked.
    async fn open(
        &self,
        settings: &ConnectSettings,
        req: &ExecRequest,
        spare: bool,
    ) -> Result<Opened, SkiffError> {
        let data_plane = req.subsystem && req.command == skiff_proto::dataplane::SUBSYSTEM;
        if spare && self.spares.is_some() {
            if let Some(taken) = self.take_spare(settings, data_plane).await {
                return Ok(taken);
            }
        }
        let ((session, channel), slot, notices) = self
            .open_channel(settings, &|conn| {
                Box::pin(async move {
                    if let Some(refusal) = data_plane.then(|| not_skiffd(conn)).flatten() {
                        return Err(refusal);
                    }
                    let started = Instant::now();
                    let session = open_session(conn).await?;
                    Ok((session, ChannelOpened::on(conn, started.elapsed())))
                })
            })
            .await?;
        slot.0.note_open_rtt(channel.rtt);
        self.open_spare(&slot.0);
        Ok(Opened {
            session,
            channel,
            slot,
            notices,
            spare_age: None,
        })
    }

    /// A session on a spare channel of a connection to the destination,
    /// when one is parked; `None` sends the command to open its own. The
    /// round trip it reports is the quickest channel open seen on that
    /// connection, as none was made now.
    async fn take_spare(&self, settings: &ConnectSettings, data_plane: bool) -> Option<Opened> {
        let dest = self.destination(PoolKey::of(settings));
        // Each claim empties a slot, so this ends; a keeper that has let
        // its spare go just sends the command on.
        for _ in 0..MAX_CONNECTIONS_PER_HOST {
            let (member, claim) =
                dest.claim_spare(|m| data_plane && not_skiffd(&m.conn).is_some())?;
            let slot = Slot(member.clone());
            let Some(taken) = claim.session().await else {
                continue;
            };
            let channel = ChannelOpened::on(&member.conn, member.open_rtt());
            self.open_spare(&member);
            return Some(Opened {
                session: taken.session,
                channel,
                slot,
                notices: Vec::new(),
                spare_age: Some(taken.age),
            });
        }
        None
    }

    /// Opens a spare session channel on `member` in the background, when
    /// this pool keeps spares, the member has none, and the server's
    /// channel limit leaves room for it. A refusal teaches the member its
    /// limit, as a command's would.
    fn open_spare(&self, member: &Arc<Member>) {
        let Some(lifetime) = self.spares else {
            return;
        };
        if member.spare.keep_for(lifetime, member.open_rtt()).is_none()
            || member.open.load(Ordering::SeqCst) >= member.limit.load(Ordering::SeqCst)
            || !member.spare.begin_opening()
        {
            return;
        }
        let member = member.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match open_session(&member.conn).await {
                Ok(mut session) => {
                    member.note_open_rtt(started.elapsed());
                    // What the server was seen to allow may have changed
                    // while the channel opened.
                    match member.spare.keep_for(lifetime, member.open_rtt()) {
                        Some(keep) => member.spare.park(session, keep),
                        None => {
                            member.spare.opening_failed();
                            let _ = session.channel_mut().close().await;
                        }
                    }
                }
                Err(e) => {
                    if e.kind == ErrorKind::ChannelRefused {
                        member.learn_limit_from_refusal();
                    }
                    tracing::debug!("no spare session channel: {e}");
                    member.spare.opening_failed();
                }
            }
        });
    }

    /// Waits until no spare is being opened on the connections to the
    /// destination of `settings`, and says whether one of them has a spare
    /// parked. For tests and status, which want to see a spare settle.
    pub async fn spare_settled(&self, settings: &ConnectSettings) -> bool {
        let mut ready = false;
        for slot in self.spare_slots(settings) {
            ready |= slot.settled().await;
        }
        ready
    }

    /// Waits until none of the connections to the destination of
    /// `settings` has a spare parked (claimed, closed by the server, or
    /// expired).
    pub async fn spare_gone(&self, settings: &ConnectSettings) {
        for slot in self.spare_slots(settings) {
            slot.gone().await;
        }
    }

    fn spare_slots(&self, settings: &ConnectSettings) -> Vec<Arc<SpareSlot>> {
        let dest = self.destination(PoolKey::of(settings));
        let members = dest.members.lock().expect("not poisoned");
        members.iter().map(|m| m.spare.clone()).collect()
    }

    /// Opens a channel with `opener`, on a pooled connection when one has
    /// room, otherwise on a new one. A refusal of kind
    /// [`ErrorKind::ChannelRefused`] teaches the connection its limit and
    /// tries another; a pooled connection found dead is replaced.
    async fn open_channel<T>(
        &self,
        settings: &ConnectSettings,
        opener: &Opener<'_, T>,
    ) -> Result<(T, Slot, Vec<String>), SkiffError> {
        let dest = self.destination(PoolKey::of(settings));
        let mut last_err = None;
        let mut notices = Vec::new();
        for _ in 0..MAX_OPEN_ATTEMPTS {
            let member = match dest.reserve() {
                Some(m) => m,
                None => {
                    let _guard = dest.connecting.lock().await;
                    // Someone may have connected while we waited.
                    match dest.reserve() {
                        Some(m) => m,
                        None => {
                            if dest.len() >= MAX_CONNECTIONS_PER_HOST {
                                return Err(last_err.unwrap_or_else(|| {
                                    SkiffError::new(
                                        ErrorKind::ChannelRefused,
                                        format!(
                                            "{}: {MAX_CONNECTIONS_PER_HOST} connections are all busy",
                                            settings.hostname
                                        ),
                                    )
                                }));
                            }
                            let mut conn = connect(settings).await?;
                            notices.append(&mut conn.notices);
                            let m = Arc::new(Member::new(conn));
                            dest.members.lock().expect("not poisoned").push(m.clone());
                            m
                        }
                    }
                }
            };
            let slot = Slot(member.clone());
            match opener(&member.conn).await {
                Ok(session) => return Ok((session, slot, notices)),
                Err(e) if e.kind == ErrorKind::ChannelRefused => {
                    let others = member.learn_limit_from_refusal();
                    tracing::debug!(
                        "{}: channel refused with {others} open; using another connection",
                        settings.hostname
                    );
                    last_err = Some(e);
                }
                Err(e) if e.kind == ErrorKind::Connect => {
                    tracing::debug!(
                        "{}: pooled connection lost; reconnecting",
                        settings.hostname
                    );
                    dest.members
                        .lock()
                        .expect("not poisoned")
                        .retain(|m| !Arc::ptr_eq(m, &member));
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err
            .unwrap_or_else(|| SkiffError::new(ErrorKind::Protocol, "no channel could be opened")))
    }

    /// Runs one command through the pool (see [`crate::exec::exec`]).
    /// Notices from a connection opened for it are written to `stderr` first.
    ///
    /// A command without input or terminal that started on a spare which
    /// the server closed without answering the request (its own timeout
    /// for idle channels, meeting the request on the way) runs again on a
    /// channel of its own: nothing ran, and nothing was read or written.
    pub async fn exec<I, O, E>(
        &self,
        settings: &ConnectSettings,
        req: &ExecRequest,
        stdin: Option<I>,
        stdout: O,
        stderr: E,
        resize: Option<tokio::sync::mpsc::Receiver<WindowSize>>,
    ) -> Result<ExitOutcome, SkiffError>
    where
        I: AsyncRead + Unpin + Send + 'static,
        O: AsyncWrite + Unpin,
        E: AsyncWrite + Unpin,
    {
        let opened = self.open(settings, req, true).await?;
        if opened.spare_age.is_none() || stdin.is_some() || resize.is_some() {
            return self
                .run_opened(opened, req, stdin, stdout, stderr, resize)
                .await;
        }
        let (mut stdout, mut stderr) = (stdout, stderr);
        let first = self
            .run_opened(opened, req, None::<I>, &mut stdout, &mut stderr, None)
            .await;
        match first {
            Err(e) if e.kind == ErrorKind::ClosedBeforeStart => {
                tracing::debug!("{e}; running the command on a channel of its own");
                let opened = self.open(settings, req, false).await?;
                self.run_opened(opened, req, None::<I>, stdout, stderr, None)
                    .await
            }
            other => other,
        }
    }

    /// As [`Pool::exec`] without a terminal, and tells `opened` how long
    /// the channel took to open (a round trip to the server, measured on a
    /// warm connection) and what the server is as soon as it is open, before the command or
    /// subsystem is asked for. The caller can then pick what depends on the
    /// round trip, such as the data plane's stream count, without another.
    ///
    /// Unlike [`Pool::exec`], a request that met a spare the server closed
    /// is not made again here: its input has been read. It fails with
    /// [`ErrorKind::ClosedBeforeStart`], and a caller that holds what it
    /// sent (a copy) may send it again.
    pub async fn exec_announcing_open<I, O, E>(
        &self,
        settings: &ConnectSettings,
        req: &ExecRequest,
        stdin: Option<I>,
        stdout: O,
        stderr: E,
        opened: tokio::sync::oneshot::Sender<ChannelOpened>,
    ) -> Result<ExitOutcome, SkiffError>
    where
        I: AsyncRead + Unpin + Send + 'static,
        O: AsyncWrite + Unpin,
        E: AsyncWrite + Unpin,
    {
        let channel = self.open(settings, req, true).await?;
        let _ = opened.send(channel.channel);
        self.run_opened(channel, req, stdin, stdout, stderr, None)
            .await
    }

    /// Runs `req` on a channel [`Pool::open`] opened. A request that met a
    /// spare the server closed on the way
    /// ([`ErrorKind::ClosedBeforeStart`]) teaches the connection how long
    /// the server keeps an unused channel; whoever can makes it again.
    async fn run_opened<I, O, E>(
        &self,
        Opened {
            session,
            slot,
            notices,
            spare_age,
            ..
        }: Opened,
        req: &ExecRequest,
        stdin: Option<I>,
        stdout: O,
        stderr: E,
        resize: Option<tokio::sync::mpsc::Receiver<WindowSize>>,
    ) -> Result<ExitOutcome, SkiffError>
    where
        I: AsyncRead + Unpin + Send + 'static,
        O: AsyncWrite + Unpin,
        E: AsyncWrite + Unpin,
    {
        let member = &slot.0;
        let stdout = Counted::new(stdout, member);
        let mut stderr = Counted::new(stderr, member);
        let stdin = stdin.map(|i| Counted::new(i, member));
        if !notices.is_empty() {
            // A terminal in raw mode needs the carriage return.
            let eol = if req.pty.is_some() { "\r\n" } else { "\n" };
            let text: String = notices.iter().map(|n| format!("{n}{eol}")).collect();
            let _ = stderr.write_all(text.as_bytes()).await;
            let _ = stderr.flush().await;
        }
        let outcome = run_session(session, req, stdin, stdout, stderr, resize).await;
        if let (Err(e), Some(age)) = (&outcome, spare_age) {
            if e.kind == ErrorKind::ClosedBeforeStart {
                member.spare.learn_idle_limit(age);
            }
        }
        // As a direct `exec` does: what the connection is learning about the
        // server's host keys is written before the command is reported done.
        member.conn.host_keys_settled().await;
        outcome
    }

    /// `ssh -W host:port` on a pooled connection (see
    /// [`crate::stdio_forward::forward_stdio`]). Notices from a connection opened
    /// for it are written to `notices_to` first.
    pub async fn forward_stdio<I, O, E>(
        &self,
        settings: &ConnectSettings,
        host: &str,
        port: u16,
        input: I,
        output: O,
        mut notices_to: E,
    ) -> Result<(), SkiffError>
    where
        I: AsyncRead + Unpin + Send + 'static,
        O: AsyncWrite + Unpin,
        E: AsyncWrite + Unpin,
    {
        let (channel, slot, notices) = self
            .open_channel(settings, &|conn| {
                let host = host.to_string();
                Box::pin(async move { crate::stdio_forward::open_direct(conn, &host, port).await })
            })
            .await?;
        if !notices.is_empty() {
            let text: String = notices.iter().map(|n| format!("{n}\n")).collect();
            let _ = notices_to.write_all(text.as_bytes()).await;
            let _ = notices_to.flush().await;
        }
        let member = &slot.0;
        let input = Counted::new(input, member);
        let output = Counted::new(output, member);
        let name = &member.conn.settings.hostname;
        crate::stdio_forward::relay_stdio(channel, name, host, port, input, output).await
    }
}

/// The refusal of the data plane's subsystem on a connection to a server
/// that cannot serve it ([`crate::copy::dataplane::served_by`]), made
/// before a channel is opened.
fn not_skiffd(conn: &Connection) -> Option<SkiffError> {
    (!crate::copy::dataplane::served_by(&conn.server_id)).then(|| {
        SkiffError::new(
            ErrorKind::Refused,
            format!(
                "{}: not a skiffd, so no skiff data plane",
                conn.settings.hostname
            ),
        )
    })
}

/// A command's stream that adds what passes through it to its connection's
/// byte counters (output written: received; input read: sent), and reports
/// output writes that wait for the local reader (see [`STALL_AFTER`]).
struct Counted<T> {
    inner: T,
    member: Arc<Member>,
    /// This writer's key in the member's blocked writes, while one waits.
    id: u64,
    waiting: bool,
}

/// Ids for [`Counted`] writers.
static NEXT_WRITER: AtomicU64 = AtomicU64::new(0);

impl<T> Counted<T> {
    fn new(inner: T, member: &Arc<Member>) -> Self {
        Counted {
            inner,
            member: member.clone(),
            id: NEXT_WRITER.fetch_add(1, Ordering::Relaxed),
            waiting: false,
        }
    }

    /// Notes whether the last write or flush had to wait.
    fn note<R>(&mut self, polled: &Poll<R>) {
        match (polled.is_pending(), self.waiting) {
            (true, false) => {
                self.waiting = true;
                self.member
                    .blocked_writes
                    .lock()
                    .expect("not poisoned")
                    .insert(self.id, Instant::now());
            }
            (false, true) => self.stop_waiting(),
            _ => {}
        }
    }

    fn stop_waiting(&mut self) {
        self.waiting = false;
        self.member
            .blocked_writes
            .lock()
            .expect("not poisoned")
            .remove(&self.id);
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        if self.waiting {
            self.stop_waiting();
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.member.received.fetch_add(*n as u64, Ordering::Relaxed);
        }
        self.note(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(&polled);
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let n = buf.filled().len() - before;
            self.member.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}
