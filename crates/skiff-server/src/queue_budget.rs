//! The memory skiffd holds for its peers, counted in one place: bytes a
//! client sent on a channel that the command (or a forwarding's
//! destination) has not taken yet, and output read from a command (or a
//! destination) that the connection has not taken yet. One connection may
//! hold at most `MaxConnectionQueue`; all connections together at most
//! `MaxServerQueue` beyond a small reserve each ([`RESERVE`], so that one
//! user filling the server's budget cannot freeze another's typing).
//!
//! The budget is data: [`QueueLimits`] and its pure decisions,
//! [`QueueLimits::window_target`] (how much window the next top-up may
//! grant) and [`QueueLimits::reading`] (whether the connection may read its
//! next packet now, a little later, or only once something was taken). The
//! counts live in [`ServerQueue`] (one per server), [`ConnectionQueue`]
//! (one per connection: what it holds, and per channel what it holds and
//! the window it granted) and [`ChannelQueue`] (what a channel's consumer
//! uses to give bytes back). The handler acts on the decisions.
//!
//! Why it takes both windows and reading: russh tops a channel's window up
//! as each packet arrives, before the command has read it, to one target
//! per connection that the handler may change after each top-up; it offers
//! no way to withhold one channel's window. So skiffd shrinks that target as
//! the connection's queue fills, down to a trickle of [`WINDOW_FLOOR`]
//! bytes, which stops well-behaved clients while the connection's other
//! traffic (window adjustments for output, closes, keepalives) still flows.
//! Past the soft limit, a packet that used a trickle window holds the
//! connection for up to [`PACE`], so that a paused channel costs twenty
//! tiny packets a second rather than a busy loop. Windows already granted
//! when the queue filled are what the quarter of the budget above the soft
//! limit is for. A client that ignores windows meets the hard limit: the
//! connection then reads nothing until commands take their input, and TCP
//! stops the client (a command that waits for its output to go before it
//! reads waits with it: only a client that sent far more than it was
//! granted, or opened very many channels at once, gets there). A packet
//! beyond the window skiffd granted, or larger than the packet size it
//! announced, is a protocol violation: the connection is closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Bytes a connection may hold outside the server's budget: what an
/// interactive session needs, so that it never waits for other
/// connections' queues.
pub const RESERVE: u64 = 256 << 10;

/// The largest channel data packet skiffd announces (and accepts).
pub const MAX_PACKET: u32 = 65535;

/// The window a channel is topped up to while its connection's queue is
/// full: the least russh will still grant (a target of 1 would stop top-ups
/// for good), so that the first packet after the queue drained brings the
/// full window back.
pub const WINDOW_FLOOR: u32 = 2;

/// Past the soft limit the connection reads a packet that only used a
/// trickle window ([`WINDOW_FLOOR`] bytes or fewer) after this long (sooner
/// once the queue drained): a client with input waiting would otherwise
/// trade two-byte packets for two-byte windows as fast as the round trip
/// goes, for as long as the command does not read.
pub const PACE: Duration = Duration::from_millis(100);

/// `MaxConnectionQueue` and `MaxServerQueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// What one connection may hold.
    pub per_connection: u64,
    /// What all connections together may hold beyond [`RESERVE`] each.
    pub total: u64,
}

impl Default for QueueLimits {
    /// 128 MiB per connection: twice what a skiff client keeps sent ahead
    /// of one command ([`skiff_proto::flow::INPUT_CREDIT`]), so that a
    /// command or two that never read their input hold up nothing else on
    /// their connection, with room for 16 MiB windows (400 MB/s per channel
    /// at 40 ms). 512 MiB for the server: four connections filled to the
    /// brim, then every other connection has its [`RESERVE`].
    fn default() -> Self {
        QueueLimits {
            per_connection: 128 << 20,
            total: 512 << 20,
        }
    }
}

/// What holding a packet costs beyond its bytes (its allocation, its place
/// in the queue, its receipt): counted too, so that a client sending tiny
/// packets fills the budget as fast as the memory fills.
pub const PACKET_OVERHEAD: usize = 128;

/// What a packet of `len` bytes counts for while it is held.
pub fn packet_cost(len: usize) -> usize {
    len + PACKET_OVERHEAD
}

/// The least either limit may be.
pub const MIN_LIMIT: u64 = 1 << 20;

/// What a connection may do about its next packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Read it.
    Go,
    /// Past the soft limit: read it after [`PACE`] (sooner once the queue
    /// drained) if it is a trickle packet, at once otherwise.
    Pace,
    /// Read nothing until the queue drained below the hard limit.
    Stop,
}

/// Why a client's packet closes its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("a data packet of {len} bytes, larger than the {MAX_PACKET} announced")]
    Oversized { len: usize },
    #[error("{len} bytes of data with only {window} bytes of window granted")]
    BeyondWindow { len: usize, window: u32 },
}

/// The soft limit: from here windows close and reading is paced. The
/// quarter above it takes what clients had been granted before the windows
/// closed (a window granted is used up to one and a half times before the
/// next top-up sees the smaller target).
fn soft(limit: u64) -> u64 {
    limit - limit / 4
}

/// Of what a connection holds, the part drawn from the server's budget.
pub fn pooled(held: u64) -> u64 {
    held.saturating_sub(RESERVE)
}

impl QueueLimits {
    /// What a connection holding `held`, with the server's budget at
    /// `pool` (the sum of every connection's [`pooled`]), may do about its
    /// next packet.
    pub fn reading(&self, held: u64, pool: u64) -> Reading {
        let pooled = held > RESERVE;
        if held > self.per_connection || (pooled && pool > self.total) {
            Reading::Stop
        } else if held >= soft(self.per_connection) || (pooled && pool >= soft(self.total)) {
            Reading::Pace
        } else {
            Reading::Go
        }
    }

    /// The largest window a channel is granted: an eighth of the
    /// connection's budget, so that what was granted before the windows
    /// closed fits in the quarter above the soft limit.
    pub fn largest_window(&self) -> u64 {
        self.per_connection / 8
    }

    /// The window the connection's next top-up may grant, given the one
    /// the path wants (`desired`): no more than [`Self::largest_window`]
    /// and than fits under both soft limits, never less than
    /// [`WINDOW_FLOOR`].
    pub fn window_target(&self, desired: u32, held: u64, pool: u64) -> u32 {
        let own = soft(self.per_connection).saturating_sub(held);
        let shared = RESERVE.saturating_sub(held) + soft(self.total).saturating_sub(pool);
        let room = own.min(shared).min(self.largest_window());
        let target = u64::from(desired).min(room).max(u64::from(WINDOW_FLOOR));
        u32::try_from(target).unwrap_or(u32::MAX)
    }

    /// Parses a limit: a number of bytes with an optional `K`, `M` or `G`
    /// (binary) suffix, at least [`MIN_LIMIT`].
    pub fn parse_limit(value: &str) -> Option<u64> {
        let (digits, unit) = match value.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            Some((i, _)) => value.split_at(i),
            None => (value, ""),
        };
        let n: u64 = digits.parse().ok()?;
        let factor: u64 = match unit.to_ascii_lowercase().as_str() {
            "" => 1,
            "k" => 1 << 10,
            "m" => 1 << 20,
            "g" => 1 << 30,
            _ => return None,
        };
        n.checked_mul(factor).filter(|&b| b >= MIN_LIMIT)
    }
}

/// The server's side: the limits, and what all connections hold beyond
/// their reserve.
#[derive(Debug)]
pub struct ServerQueue {
    limits: QueueLimits,
    /// What every connection holds beyond its reserve: of all skiffd's
    /// connection processes when they share the count
    /// ([`share_across_processes`]), else of this process's.
    total: Total,
    /// What this process's connections hold beyond their reserve, and how
    /// high that has been since the allocator last gave memory back.
    own: Mutex<Pool>,
    /// Woken whenever this process's part of the pool shrinks.
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Pool {
    bytes: u64,
    drain: Drain,
}

/// Where the total is counted.
#[derive(Debug)]
enum Total {
    Own(AtomicU64),
    Shared(&'static AtomicU64),
}

impl Total {
    fn get(&self) -> &AtomicU64 {
        match self {
            Total::Own(t) => t,
            Total::Shared(t) => t,
        }
    }
}

/// The count every connection process of one zygote shares: one word of
/// memory mapped shared before the zygote forks them.
static CROSS_PROCESS: std::sync::OnceLock<&'static AtomicU64> = std::sync::OnceLock::new();

/// Makes every [`ServerQueue`] of this process, and of the processes it
/// forks from now on, count into one shared total (`MaxServerQueue` holds
/// across connection processes). Called once, by the zygote, before any
/// fork.
pub fn share_across_processes() -> std::io::Result<()> {
    use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
    let len = std::num::NonZeroUsize::new(std::mem::size_of::<AtomicU64>()).expect("not zero");
    // SAFETY: a new anonymous mapping, placed by the kernel where nothing
    // else is; it is never unmapped, so the reference below lives as long
    // as the process (and, shared, in every child forked after this).
    let ptr = unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
        )
    }?;
    // SAFETY: the mapping is page-aligned (so aligned for an AtomicU64),
    // zero-filled (a valid 0), at least 8 bytes long, and only ever used
    // through atomic operations.
    let total: &'static AtomicU64 = unsafe { &*(ptr.as_ptr() as *const AtomicU64) };
    CROSS_PROCESS
        .set(total)
        .map_err(|_| std::io::Error::other("the queue total is already shared"))
}

impl ServerQueue {
    pub fn new(limits: QueueLimits) -> Arc<ServerQueue> {
        let total = match CROSS_PROCESS.get() {
            Some(shared) => Total::Shared(shared),
            None => Total::Own(AtomicU64::new(0)),
        };
        Arc::new(ServerQueue {
            limits,
            total,
            own: Mutex::new(Pool::default()),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// What all connections hold beyond their reserve.
    pub fn pooled(&self) -> u64 {
        self.total.get().load(Ordering::Acquire)
    }

    /// Whether other processes' connections count into the total too (their
    /// releases then wake no one here: a stopped connection looks again
    /// every [`PACE`]).
    fn shared(&self) -> bool {
        matches!(self.total, Total::Shared(_))
    }

    /// Moves this process's part of the pool from `before` to `after`;
    /// true when that drained a flood (see [`Drain`]).
    fn repool(&self, before: u64, after: u64) -> bool {
        if after > before {
            self.total.get().fetch_add(after - before, Ordering::AcqRel);
        } else {
            let down = before - after;
            let _ = self
                .total
                .get()
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    Some(t.saturating_sub(down))
                });
        }
        let mut own = self.own.lock().expect("queue pool lock");
        own.bytes = (own.bytes + after).saturating_sub(before);
        let bytes = own.bytes;
        own.drain.note(bytes)
    }
}

/// How far the pool must have risen before its draining gives memory back
/// to the system.
pub const GIVE_BACK_AFTER: u64 = 32 << 20;

/// Notices a flood that has drained: the pool fell by at least
/// [`GIVE_BACK_AFTER`] from its high, to an eighth of it or less. The
/// allocator keeps what the queued bytes were freed into, so skiffd would
/// otherwise keep its peak resident for good (and, flood after flood, a
/// little more as the heap fragments).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    high: u64,
}

impl Drain {
    /// Notes the pool's size; true when it has just drained (the high then
    /// starts again from here, so a flood gives memory back a few times at
    /// most as it drains).
    pub fn note(&mut self, pooled: u64) -> bool {
        if pooled > self.high {
            self.high = pooled;
            false
        } else if self.high - pooled >= GIVE_BACK_AFTER && pooled <= self.high / 8 {
            self.high = pooled;
            true
        } else {
            false
        }
    }
}

/// Asks the C library's allocator to return the free pages of its heaps to
/// the system, on a thread of its own (it walks every arena, which takes a
/// few milliseconds after a large flood).
fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| {
                // SAFETY: malloc_trim only walks the allocator's own free
                // lists, under its own locks; it takes no pointer from us.
                unsafe { libc::malloc_trim(0) };
            });
        if let Err(e) = spawned {
            tracing::debug!("cannot start a thread to give memory back: {e}");
        }
    }
}

/// One connection's counts.
#[derive(Debug)]
pub struct ConnectionQueue {
    server: Arc<ServerQueue>,
    ledger: Mutex<Ledger>,
    /// Woken whenever the connection gives bytes back.
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Bytes held. A consumer may give bytes back a moment before the
    /// handler has counted them (russh hands a packet to the channel before
    /// it calls the handler), so this may dip below zero briefly.
    held: i64,
    channels: HashMap<u32, ChannelEntry>,
}

#[derive(Debug)]
struct ChannelEntry {
    held: i64,
    /// The window the client has left, as of its last packet (`None`:
    /// the initial window, no packet yet).
    window: Option<u32>,
    /// The consumer's handle, while there is one.
    handle: Weak<ChannelQueue>,
}

impl ChannelEntry {
    fn new() -> ChannelEntry {
        ChannelEntry {
            held: 0,
            window: None,
            handle: Weak::new(),
        }
    }
}

fn counted(held: i64) -> u64 {
    u64::try_from(held).unwrap_or(0)
}

impl ConnectionQueue {
    pub fn new(server: Arc<ServerQueue>) -> Arc<ConnectionQueue> {
        Arc::new(ConnectionQueue {
            server,
            ledger: Mutex::new(Ledger::default()),
            freed: tokio::sync::Notify::new(),
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().expect("connection queue lock")
    }

    /// Adds `delta` (may be negative) to what `channel` and the connection
    /// hold, keeping the server's pool in step; wakes waiters on a decrease.
    fn change(&self, ledger: &mut Ledger, channel: u32, delta: i64) {
        if delta == 0 {
            return;
        }
        if let Some(entry) = ledger.channels.get_mut(&channel) {
            entry.held += delta;
        }
        let before = pooled(counted(ledger.held));
        ledger.held += delta;
        let after = pooled(counted(ledger.held));
        if before != after && self.server.repool(before, after) {
            give_back_freed_memory();
        }
        if after < before {
            self.server.freed.notify_waiters();
        }
        if delta < 0 {
            self.freed.notify_waiters();
        }
    }

    /// Starts counting `channel`, a channel just opened (by either side),
    /// before any data can arrive on it.
    pub fn register(&self, channel: u32) {
        self.ledger()
            .channels
            .entry(channel)
            .or_insert_with(ChannelEntry::new);
    }

    /// The handle `channel`'s consumer gives bytes back with: the one
    /// already made, or a new one. The channel is forgotten (and whatever
    /// it still holds given back) when the last handle is dropped.
    pub fn channel(self: &Arc<Self>, channel: u32) -> Arc<ChannelQueue> {
        let mut ledger = self.ledger();
        let entry = ledger
            .channels
            .entry(channel)
            .or_insert_with(ChannelEntry::new);
        if let Some(handle) = entry.handle.upgrade() {
            return handle;
        }
        let handle = Arc::new(ChannelQueue {
            connection: self.clone(),
            channel,
        });
        entry.handle = Arc::downgrade(&handle);
        handle
    }

    /// The client closed `channel`: forgets it unless a consumer still
    /// holds its handle (which then gives its bytes back as it finishes).
    pub fn closed(&self, channel: u32) {
        let mut ledger = self.ledger();
        let orphan = ledger
            .channels
            .get(&channel)
            .is_some_and(|e| e.handle.strong_count() == 0);
        if orphan {
            let held = ledger.channels.get(&channel).map_or(0, |e| e.held);
            self.change(&mut ledger, channel, -held);
            ledger.channels.remove(&channel);
        }
    }

    /// Counts a packet of `len` bytes that arrived on `channel`, after which
    /// russh says the client has `window_after` bytes of window left
    /// (`initial_window`: what every channel starts with). Returns what the
    /// connection may do about its next packet, or why the packet breaks
    /// the protocol. Packets on channels that are not counted (whose
    /// consumer is gone, so russh drops them) count for nothing.
    pub fn receive(
        &self,
        channel: u32,
        len: usize,
        window_after: u32,
        initial_window: u32,
    ) -> Result<Reading, Violation> {
        if len > MAX_PACKET as usize {
            return Err(Violation::Oversized { len });
        }
        let mut ledger = self.ledger();
        let Some(entry) = ledger.channels.get_mut(&channel) else {
            drop(ledger);
            return Ok(self.reading());
        };
        let window = entry.window.unwrap_or(initial_window);
        if len > window as usize {
            return Err(Violation::BeyondWindow { len, window });
        }
        entry.window = Some(window_after);
        self.change(&mut ledger, channel, packet_cost(len) as i64);
        let held = counted(ledger.held);
        drop(ledger);
        Ok(
            match self.server.limits.reading(held, self.server.pooled()) {
                Reading::Pace if len > WINDOW_FLOOR as usize => Reading::Go,
                reading => reading,
            },
        )
    }

    /// What the connection may do about its next packet now.
    pub fn reading(&self) -> Reading {
        let held = counted(self.ledger().held);
        self.server.limits.reading(held, self.server.pooled())
    }

    /// The window the connection's next top-up may grant (see
    /// [`QueueLimits::window_target`]).
    pub fn window_target(&self, desired: u32) -> u32 {
        let held = counted(self.ledger().held);
        self.server
            .limits
            .window_target(desired, held, self.server.pooled())
    }

    /// What the connection holds now.
    pub fn held(&self) -> u64 {
        counted(self.ledger().held)
    }

    /// Waits until the connection may read its next packet: at once when
    /// [`Reading::Go`], after at most [`PACE`] when paced, and, when
    /// stopped, until consumers gave enough back or `gone` resolves (the
    /// peer went away; then `false`).
    pub async fn hold_off<F>(&self, gone: impl FnOnce() -> F) -> bool
    where
        F: std::future::Future<Output = ()>,
    {
        let paced_until = tokio::time::Instant::now() + PACE;
        let mut gone_watch = None;
        let mut gone = Some(gone);
        loop {
            let own = self.freed.notified();
            let shared = self.server.freed.notified();
            tokio::pin!(own, shared);
            own.as_mut().enable();
            shared.as_mut().enable();
            let paced = match self.reading() {
                Reading::Go => return true,
                Reading::Pace if tokio::time::Instant::now() >= paced_until => return true,
                Reading::Pace => true,
                Reading::Stop => false,
            };
            if !paced && gone_watch.is_none() {
                if let Some(make) = gone.take() {
                    gone_watch = Some(Box::pin(make()));
                }
            }
            let gone_now = async {
                match gone_watch.as_mut() {
                    Some(watch) => watch.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            let deadline = async {
                if paced {
                    tokio::time::sleep_until(paced_until).await
                } else if self.server.shared() {
                    tokio::time::sleep(PACE).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = own => {}
                _ = shared => {}
                _ = deadline => {}
                _ = gone_now => return false,
            }
        }
    }
}

/// A channel's consumer's handle on its bytes: input it took and gives
/// back, output it holds while the connection takes it.
#[derive(Debug)]
pub struct ChannelQueue {
    connection: Arc<ConnectionQueue>,
    channel: u32,
}

impl ChannelQueue {
    /// Gives back what a packet of `len` input bytes counted for, once the
    /// consumer passed it on (or dropped it).
    pub fn release_packet(&self, len: usize) {
        self.release(packet_cost(len));
    }

    /// Gives back `n` counted bytes.
    fn release(&self, n: usize) {
        let mut ledger = self.connection.ledger();
        self.connection
            .change(&mut ledger, self.channel, -(n as i64));
    }

    /// Counts `n` bytes of output (or of a buffer for it) until the
    /// returned guard is dropped. Output is never refused: each stream
    /// holds at most one buffer, and its consumer must never wait for
    /// input to drain (the command may be waiting for its output to go).
    pub fn hold(self: &Arc<Self>, n: usize) -> Held {
        let mut ledger = self.connection.ledger();
        self.connection.change(&mut ledger, self.channel, n as i64);
        Held {
            queue: self.clone(),
            n,
        }
    }
}

impl Drop for ChannelQueue {
    fn drop(&mut self) {
        let mut ledger = self.connection.ledger();
        // Unless a new handle took the channel over while this one was
        // going (its entry is then that handle's).
        let mine = ledger
            .channels
            .get(&self.channel)
            .is_some_and(|e| std::ptr::eq(e.handle.as_ptr(), self));
        if mine {
            let held = ledger.channels.get(&self.channel).map_or(0, |e| e.held);
            self.connection.change(&mut ledger, self.channel, -held);
            ledger.channels.remove(&self.channel);
        }
    }
}

/// Output bytes counted until dropped (see [`ChannelQueue::hold`]).
#[derive(Debug)]
pub struct Held {
    queue: Arc<ChannelQueue>,
    n: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.queue.release(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn limits() -> QueueLimits {
        QueueLimits::default()
    }

    #[test]
    fn a_drained_flood_gives_memory_back_once() {
        let mut d = Drain::default();
        assert!(!d.note(0));
        // A small rise and fall is not a flood.
        assert!(!d.note(GIVE_BACK_AFTER / 2));
        assert!(!d.note(0));
        for step in 1..=8 {
            assert!(!d.note(step * 64 * MIB));
        }
        assert!(!d.note(100 * MIB), "not drained to an eighth yet");
        assert!(d.note(64 * MIB), "an eighth of 512 MiB");
        assert!(!d.note(60 * MIB), "not another 32 MiB freed");
        assert!(d.note(0), "the last 64 MiB");
        assert!(!d.note(0));
        assert!(!d.note(GIVE_BACK_AFTER));
        assert!(d.note(0), "the next flood");
    }

    #[test]
    fn defaults_and_parsing() {
        assert_eq!(limits().per_connection, 128 * MIB);
        assert_eq!(limits().total, 512 * MIB);
        assert_eq!(QueueLimits::parse_limit("64M"), Some(64 * MIB));
        assert_eq!(QueueLimits::parse_limit("2g"), Some(2 << 30));
        assert_eq!(QueueLimits::parse_limit("1024k"), Some(MIB));
        assert_eq!(QueueLimits::parse_limit("1048576"), Some(MIB));
        for bad in [
            "",
            "M",
            "1023k",
            "12x",
            "-1M",
            "99999999999999999999G",
            "1.5M",
        ] {
            assert_eq!(QueueLimits::parse_limit(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reading_goes_paces_then_stops_as_a_connection_fills() {
        let l = limits();
        assert_eq!(l.reading(0, 0), Reading::Go);
        assert_eq!(l.reading(96 * MIB - 1, 0), Reading::Go);
        assert_eq!(l.reading(96 * MIB, 0), Reading::Pace);
        assert_eq!(l.reading(128 * MIB, 0), Reading::Pace);
        assert_eq!(l.reading(128 * MIB + 1, 0), Reading::Stop);
    }

    #[test]
    fn the_server_budget_binds_only_beyond_the_reserve() {
        let l = limits();
        let full = 512 * MIB + 1;
        // An interactive session within its reserve reads on.
        assert_eq!(l.reading(RESERVE, full), Reading::Go);
        assert_eq!(l.reading(RESERVE + 1, full), Reading::Stop);
        assert_eq!(l.reading(MIB, 384 * MIB), Reading::Pace);
        assert_eq!(l.reading(MIB, 383 * MIB), Reading::Go);
    }

    #[test]
    fn windows_shrink_to_the_room_left_and_never_below_the_floor() {
        let l = limits();
        let want = 2 << 20;
        assert_eq!(l.window_target(want, 0, 0), want);
        assert_eq!(l.window_target(want, 95 * MIB, 0), MIB as u32);
        assert_eq!(l.window_target(want, 96 * MIB, 0), WINDOW_FLOOR);
        assert_eq!(l.window_target(want, 200 * MIB, 0), WINDOW_FLOOR);
        // The server's budget: a connection may still use its reserve.
        assert_eq!(l.window_target(want, 0, 384 * MIB), RESERVE as u32);
        assert_eq!(l.window_target(want, MIB, 384 * MIB), WINDOW_FLOOR);
        assert_eq!(l.window_target(want, MIB, 383 * MIB), MIB as u32);
        // A path that wants less gets what it wants; one that wants more
        // gets an eighth of the connection's budget at most.
        assert_eq!(l.window_target(4096, 0, 0), 4096);
        assert_eq!(l.window_target(64 << 20, 0, 0), 16 << 20);
    }

    fn server(per_connection: u64, total: u64) -> Arc<ServerQueue> {
        ServerQueue::new(QueueLimits {
            per_connection,
            total,
        })
    }

    #[test]
    fn counts_follow_input_taken_and_given_back() {
        let server = server(8 * MIB, 16 * MIB);
        let conn = ConnectionQueue::new(server.clone());
        conn.register(1);
        let window = 2 << 20;
        let handle = conn.channel(1);
        assert_eq!(
            conn.receive(1, 32 << 10, window - (32 << 10), window),
            Ok(Reading::Go)
        );
        assert_eq!(conn.held(), packet_cost(32 << 10) as u64);
        handle.release_packet(32 << 10);
        assert_eq!(conn.held(), 0);
        // Given back before it was counted (the consumer was quick): the
        // count comes out right once the handler counts it.
        handle.release_packet(100);
        conn.receive(1, 100, window, window).unwrap();
        assert_eq!(conn.held(), 0);
        assert_eq!(server.pooled(), 0);
    }

    #[test]
    fn a_full_connection_is_paced_then_stopped_and_its_pool_share_counted() {
        let server = server(4 * MIB, 16 * MIB);
        let conn = ConnectionQueue::new(server.clone());
        let handle = conn.channel(7);
        let packet = 32 << 10;
        let mut reading = Reading::Go;
        let mut packets = 0u64;
        while reading != Reading::Stop {
            // A client that ignores nothing: the window russh reports stays
            // ahead of each packet.
            reading = conn.receive(7, packet, 1 << 30, 1 << 30).unwrap();
            packets += 1;
            assert!(packets <= 129, "never stopped");
        }
        let held = packets * packet_cost(packet) as u64;
        assert!(held > 4 * MIB && held - 4 * MIB <= packet_cost(packet) as u64);
        assert_eq!(conn.held(), held);
        assert_eq!(server.pooled(), held - RESERVE);
        // Dropping the consumer gives everything back.
        drop(handle);
        assert_eq!((conn.held(), server.pooled()), (0, 0));
        // The channel is forgotten: later packets count for nothing.
        conn.receive(7, packet, 1 << 30, 1 << 30).unwrap();
        assert_eq!(conn.held(), 0);
    }

    #[test]
    fn past_the_soft_limit_only_trickle_packets_are_paced() {
        let conn = ConnectionQueue::new(server(4 * MIB, 16 * MIB));
        let _handle = conn.channel(5);
        let mut packets = 0;
        while conn.reading() == Reading::Go {
            assert_eq!(conn.receive(5, 32 << 10, 1 << 30, 1 << 30), Ok(Reading::Go));
            packets += 1;
        }
        assert_eq!(packets, 96, "the soft limit is 3 MiB");
        // What was granted before may still come, at once.
        assert_eq!(conn.receive(5, 1000, 1 << 30, 1 << 30), Ok(Reading::Go));
        // A packet that used a trickle window waits.
        assert_eq!(
            conn.receive(5, WINDOW_FLOOR as usize, 1 << 30, 1 << 30),
            Ok(Reading::Pace)
        );
    }

    #[test]
    fn protocol_violations_are_named() {
        let conn = ConnectionQueue::new(server(8 * MIB, 16 * MIB));
        conn.register(3);
        assert_eq!(
            conn.receive(3, MAX_PACKET as usize + 1, 0, 1 << 20),
            Err(Violation::Oversized {
                len: MAX_PACKET as usize + 1
            })
        );
        // 1000 bytes of a 1500-byte initial window, then 600 more.
        conn.receive(3, 1000, 500, 1500).unwrap();
        assert_eq!(
            conn.receive(3, 600, 500, 1500),
            Err(Violation::BeyondWindow {
                len: 600,
                window: 500
            })
        );
        // Within the window topped up again, fine.
        conn.receive(3, 500, 4096, 1500).unwrap();
        conn.receive(3, 4096, 0, 1500).unwrap();
    }

    #[test]
    fn output_holds_count_until_dropped_and_orphans_are_forgotten_on_close() {
        let server = server(8 * MIB, 16 * MIB);
        let conn = ConnectionQueue::new(server.clone());
        let handle = conn.channel(2);
        let held = handle.hold(32 << 10);
        assert_eq!(conn.held(), 32 << 10);
        drop(held);
        assert_eq!(conn.held(), 0);
        // A channel no consumer took (its data sits in russh's queue until
        // the client closes it).
        conn.register(9);
        conn.receive(9, 1000, 0, 1 << 20).unwrap();
        assert_eq!(conn.held(), packet_cost(1000) as u64);
        conn.closed(9);
        assert_eq!(conn.held(), 0);
        // A client close while the consumer still works leaves its count.
        conn.receive(2, 500, 0, 1 << 20).unwrap();
        conn.closed(2);
        assert_eq!(conn.held(), packet_cost(500) as u64);
        drop(handle);
        assert_eq!(conn.held(), 0);
    }

    #[test]
    fn two_connections_share_the_server_budget() {
        let server = server(4 * MIB, 4 * MIB);
        let (a, b) = (
            ConnectionQueue::new(server.clone()),
            ConnectionQueue::new(server.clone()),
        );
        let (ha, _hb) = (a.channel(1), b.channel(1));
        for _ in 0..96 {
            a.receive(1, 32 << 10, 1 << 30, 1 << 30).unwrap();
        }
        assert_eq!(a.held(), 96 * packet_cost(32 << 10) as u64);
        // b is within its reserve: it goes on.
        assert_eq!(b.receive(1, 1000, 1 << 30, 1 << 30), Ok(Reading::Go));
        for _ in 0..32 {
            b.receive(1, 32 << 10, 1 << 30, 1 << 30).unwrap();
        }
        // Past its reserve, the server's budget is spent (3.5 MiB of the
        // pool's soft limit of 3): b is paced while a still holds it.
        assert_eq!(b.reading(), Reading::Pace);
        ha.release(96 * (32 << 10));
        assert_eq!(b.reading(), Reading::Go);
    }

    #[tokio::test]
    async fn hold_off_waits_for_room_or_for_the_peer_to_go() {
        let server = server(MIB, 4 * MIB);
        let conn = ConnectionQueue::new(server);
        let handle = conn.channel(1);
        let fill = |packets: usize| {
            for _ in 0..packets {
                conn.receive(1, 32 << 10, 1 << 30, 1 << 30).unwrap();
            }
        };
        fill(33);
        assert_eq!(conn.reading(), Reading::Stop);
        // Stopped, nothing but room or the peer's leaving ends it.
        let waiting = {
            let conn = conn.clone();
            tokio::spawn(async move { conn.hold_off(std::future::pending).await })
        };
        tokio::time::sleep(PACE * 4).await;
        assert!(!waiting.is_finished());
        handle.release(33 * (32 << 10));
        assert!(waiting.await.unwrap(), "room was made");
        // Gone: returns false.
        fill(33);
        assert!(!conn.hold_off(|| async {}).await);
        // Paced (968 KiB held, soft limit 768 KiB): at most PACE.
        handle.release(96 << 10);
        assert_eq!(conn.reading(), Reading::Pace);
        let start = std::time::Instant::now();
        assert!(conn.hold_off(std::future::pending).await);
        let took = start.elapsed();
        assert!(took >= PACE && took < PACE * 20, "{took:?}");
    }
}
