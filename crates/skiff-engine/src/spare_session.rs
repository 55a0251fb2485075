//! A session channel opened ahead of need on a pooled connection, so that
//! the next command on that connection starts with its request instead of
//! a `CHANNEL_OPEN` and a wait for the confirmation: on a long path, one
//! round trip of the two a warm `exec` costs.
//!
//! Each pooled connection has one [`SpareSlot`]. The pool opens a spare
//! when a command takes a channel (so a burst of commands finds one ready
//! each time), never more than one per connection, and only while the
//! server's channel limit leaves room for it. An opened spare is parked
//! with a keeper task that holds the channel until a command claims it,
//! and lets it go:
//!
//! - when the server closes it (skiffd's `ChannelTimeout`, say): the
//!   next command opens a channel of its own, as without spares, and the
//!   server's timeout is not worked around by opening another at once.
//!   The slot learns how long the server keeps an unused channel (the
//!   spare's age when the close came), and later spares on that
//!   connection are let go a round trip and an eighth of that time before
//!   the server would close them; where that leaves less than
//!   [`MIN_KEEP`], the connection keeps no spare;
//! - after its lifetime ([`SPARE_LIFETIME`] in the agent), closing it itself, so that a server's
//!   `UnusedConnectionTimeout` still sees an idle connection with no
//!   channel and can close it (two minutes later than without a spare);
//! - when the connection leaves the pool (the slot is dropped).
//!
//! A spare carries nothing before it is claimed: no request has been made
//! on it, so a command that finds it gone has lost nothing and opens its
//! own channel. The only message a server sends on such a channel before
//! closing it is a window adjustment, which russh applies by itself. A
//! server may still close a spare while a command's request is on its way
//! (before the slot has learned its limit): the command then ends with
//! [`crate::ErrorKind::ClosedBeforeStart`], nothing having run, and the
//! pool runs a command without input again on a channel of its own
//! ([`crate::Pool::exec`]); a copy, which holds what it sent, is sent
//! again by the copy itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::exec::OpenSession;

/// How long a parked spare is kept before the keeper closes it, unless
/// the pool says otherwise.
pub const SPARE_LIFETIME: Duration = Duration::from_secs(120);

/// The shortest time worth keeping a spare for: a server that closes
/// unused channels sooner than this (and a round trip) gets none.
pub const MIN_KEEP: Duration = Duration::from_millis(100);

/// Where a connection's spare is, as [`SpareSlot::phase`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparePhase {
    /// No spare, none being opened.
    Empty,
    /// A `CHANNEL_OPEN` is in flight.
    Opening,
    /// A spare is parked and can be claimed.
    Ready,
}

/// A spare handed to a command.
pub struct Taken {
    pub session: OpenSession,
    /// How long it had been parked.
    pub age: Duration,
}

/// A request to the keeper for its session: the keeper answers on it.
type TakeRequest = oneshot::Sender<Taken>;

enum State {
    Empty,
    Opening,
    Ready {
        /// Which keeper holds it (so a keeper that ends clears only its own).
        keeper: u64,
        take: oneshot::Sender<TakeRequest>,
    },
}

impl State {
    fn phase(&self) -> SparePhase {
        match self {
            State::Empty => SparePhase::Empty,
            State::Opening => SparePhase::Opening,
            State::Ready { .. } => SparePhase::Ready,
        }
    }
}

/// One connection's spare session channel (see the module documentation).
pub struct SpareSlot {
    state: Mutex<State>,
    phase: watch::Sender<SparePhase>,
    keepers: AtomicU64,
    /// Spares claimed by commands since the connection opened.
    taken: AtomicU64,
    /// The shortest time the server was seen to keep an unused channel.
    idle_limit: Mutex<Option<Duration>>,
}

impl Default for SpareSlot {
    fn default() -> Self {
        SpareSlot {
            state: Mutex::new(State::Empty),
            phase: watch::Sender::new(SparePhase::Empty),
            keepers: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            idle_limit: Mutex::new(None),
        }
    }
}

/// A spare claimed by [`SpareSlot::claim`], not yet handed over.
pub struct Claim(oneshot::Sender<TakeRequest>);

impl Claim {
    /// The parked session, or `None` when its keeper let it go in the
    /// meantime (the server closed it, or it expired).
    pub async fn session(self) -> Option<Taken> {
        let (tx, rx) = oneshot::channel();
        self.0.send(tx).ok()?;
        rx.await.ok()
    }
}

impl SpareSlot {
    /// Puts `next` in `current` (the state, locked by the caller) and
    /// tells the phase's watchers, under that lock so that the two agree;
    /// returns what was there.
    fn replace(&self, current: &mut State, next: State) -> State {
        self.phase.send_replace(next.phase());
        std::mem::replace(current, next)
    }

    fn set(&self, state: State) {
        let mut current = self.state.lock().expect("not poisoned");
        self.replace(&mut current, state);
    }

    /// Where the spare is now.
    pub fn phase(&self) -> SparePhase {
        *self.phase.borrow()
    }

    /// Spares claimed by commands so far.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// Notes that the server closed an unused channel (or one whose request
    /// was on its way) after `seen`.
    pub fn learn_idle_limit(&self, seen: Duration) {
        let mut limit = self.idle_limit.lock().expect("not poisoned");
        *limit = Some(limit.map_or(seen, |l| l.min(seen)));
    }

    /// How long to keep a spare on a connection whose round trip is `rtt`,
    /// given the pool's `lifetime`: shorter than the server was seen to keep
    /// an unused channel by a round trip and an eighth, so that a command
    /// claiming it at the last moment still reaches it open; `None` when
    /// that leaves less than [`MIN_KEEP`].
    pub fn keep_for(&self, lifetime: Duration, rtt: Duration) -> Option<Duration> {
        match *self.idle_limit.lock().expect("not poisoned") {
            None => Some(lifetime),
            Some(limit) => {
                let keep = limit.saturating_sub(rtt.saturating_mul(2) + limit / 8);
                (keep >= MIN_KEEP).then(|| keep.min(lifetime))
            }
        }
    }

    /// Whether a channel is held for the spare on the server, or about to
    /// be: it counts against the server's channel limit.
    pub fn holds_channel(&self) -> bool {
        !matches!(*self.state.lock().expect("not poisoned"), State::Empty)
    }

    /// Takes the right to open a spare: true (and the slot is `Opening`)
    /// only when it was empty.
    pub fn begin_opening(&self) -> bool {
        let mut state = self.state.lock().expect("not poisoned");
        if !matches!(*state, State::Empty) {
            return false;
        }
        self.replace(&mut state, State::Opening);
        true
    }

    /// The open that [`SpareSlot::begin_opening`] allowed failed.
    pub fn opening_failed(&self) {
        self.set(State::Empty);
    }

    /// Claims the parked spare, if there is one; the slot is empty after.
    pub fn claim(&self) -> Option<Claim> {
        let mut state = self.state.lock().expect("not poisoned");
        if !matches!(*state, State::Ready { .. }) {
            return None;
        }
        let State::Ready { take, .. } = self.replace(&mut state, State::Empty) else {
            unreachable!("checked above")
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(Claim(take))
    }

    /// Parks `session`, just opened, with a keeper of its own that closes
    /// it after `lifetime` unless it is claimed first (see
    /// [`SpareSlot::keep_for`]).
    pub fn park(self: &Arc<Self>, session: OpenSession, lifetime: Duration) {
        let keeper = self.keepers.fetch_add(1, Ordering::Relaxed);
        let (take, taken) = oneshot::channel();
        self.set(State::Ready { keeper, take });
        tokio::spawn(keep(Arc::downgrade(self), keeper, session, taken, lifetime));
    }

    /// Waits until no spare is being opened, and says whether one is
    /// parked.
    pub async fn settled(&self) -> bool {
        let mut phase = self.phase.subscribe();
        let settled = phase
            .wait_for(|p| *p != SparePhase::Opening)
            .await
            .map(|p| *p)
            .unwrap_or(SparePhase::Empty);
        settled == SparePhase::Ready
    }

    /// Waits until no spare is parked (it was claimed, or let go).
    pub async fn gone(&self) {
        let mut phase = self.phase.subscribe();
        let _ = phase.wait_for(|p| *p != SparePhase::Ready).await;
    }
}

/// What woke a keeper.
enum Event {
    /// A command claimed the spare (`None`: the slot was dropped).
    Claimed(Option<TakeRequest>),
    Message(Option<russh::ChannelMsg>),
    Expired,
}

/// Holds `session` until it is claimed, closed by the server, expired, or
/// its slot is dropped; in all but the first case the channel is closed.
async fn keep(
    slot: Weak<SpareSlot>,
    keeper: u64,
    mut session: OpenSession,
    mut taken: oneshot::Receiver<TakeRequest>,
    lifetime: Duration,
) {
    let parked = tokio::time::Instant::now();
    let expiry = tokio::time::sleep(lifetime);
    tokio::pin!(expiry);
    let close = loop {
        let event = tokio::select! {
            request = &mut taken => Event::Claimed(request.ok()),
            message = session.channel_mut().wait() => Event::Message(message),
            () = &mut expiry => Event::Expired,
        };
        match event {
            Event::Claimed(Some(reply)) => {
                let age = parked.elapsed();
                match reply.send(Taken { session, age }) {
                    Ok(()) => return,
                    // The claimer gave up: the spare is no one's now.
                    Err(back) => break Some(back.session),
                }
            }
            // The slot is gone with its connection.
            Event::Claimed(None) | Event::Expired => break Some(session),
            Event::Message(Some(russh::ChannelMsg::WindowAdjusted { .. })) => continue,
            Event::Message(Some(other)) => {
                let age = parked.elapsed();
                tracing::debug!(
                    "{}: the server ended an unused session channel after {age:?}: {other:?}",
                    session.host()
                );
                if let Some(slot) = slot.upgrade() {
                    slot.learn_idle_limit(age);
                }
                break Some(session);
            }
            // russh has dropped the channel: the connection is gone.
            Event::Message(None) => break None,
        }
    };
    if let Some(slot) = slot.upgrade() {
        let mut state = slot.state.lock().expect("not poisoned");
        if matches!(*state, State::Ready { keeper: k, .. } if k == keeper) {
            slot.replace(&mut state, State::Empty);
        }
    }
    if let Some(mut session) = close {
        let _ = session.channel_mut().close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn with_nothing_learned_a_spare_lives_the_pools_lifetime() {
        let slot = SpareSlot::default();
        assert_eq!(slot.keep_for(SPARE_LIFETIME, 40 * MS), Some(SPARE_LIFETIME));
    }

    #[test]
    fn a_learned_limit_keeps_spares_a_round_trip_and_an_eighth_shorter() {
        let slot = SpareSlot::default();
        slot.learn_idle_limit(4000 * MS);
        // 4 s - (2 x 100 ms + 500 ms)
        assert_eq!(slot.keep_for(SPARE_LIFETIME, 100 * MS), Some(3300 * MS));
        // The pool's own lifetime still bounds it.
        assert_eq!(slot.keep_for(1000 * MS, 100 * MS), Some(1000 * MS));
        // A later, shorter close wins; a longer one changes nothing.
        slot.learn_idle_limit(2000 * MS);
        slot.learn_idle_limit(9000 * MS);
        assert_eq!(
            slot.keep_for(SPARE_LIFETIME, Duration::ZERO),
            Some(1750 * MS)
        );
    }

    #[test]
    fn a_server_that_closes_unused_channels_quickly_gets_no_spare() {
        let slot = SpareSlot::default();
        slot.learn_idle_limit(200 * MS);
        // 200 ms - (100 ms + 25 ms) leaves 75 ms, under MIN_KEEP.
        assert_eq!(slot.keep_for(SPARE_LIFETIME, 50 * MS), None);
        // A path too long for the limit: nothing left at all.
        assert_eq!(slot.keep_for(SPARE_LIFETIME, 500 * MS), None);
    }

    #[test]
    fn claiming_empties_the_slot_once() {
        let slot = SpareSlot::default();
        assert!(slot.claim().is_none(), "nothing parked");
        assert!(slot.begin_opening());
        assert!(!slot.begin_opening(), "one opening at a time");
        assert!(slot.holds_channel());
        assert_eq!(slot.phase(), SparePhase::Opening);
        slot.opening_failed();
        assert!(!slot.holds_channel());
        assert_eq!(slot.phase(), SparePhase::Empty);
        assert_eq!(slot.taken(), 0);
    }
}
