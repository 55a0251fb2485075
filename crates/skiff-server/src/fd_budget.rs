//! Descriptor headroom as policy: how many file descriptors skiffd keeps
//! spare for the work it has already taken on, when a new connection is
//! turned away at accept for want of them, how fresh the count of open
//! descriptors must be to decide that, and how often a refusal is logged.
//! Pure data and decisions; counting, limits and sockets are
//! `crate::descriptors`' and the listener's.
//!
//! Every connection costs descriptors (its socket, and more for sessions,
//! pipes, ptys, forwardings, data-plane relays). When the process runs out,
//! whatever needs one next fails: a command that cannot get its pipes, an
//! authorized_keys file that cannot be opened. The listener asks before it
//! takes a connection, so running short turns away newcomers instead.

use std::time::{Duration, Instant};

/// The fewest descriptors kept spare, whatever the limit.
pub const MIN_RESERVE: u64 = 32;
/// The most kept spare: past this, a larger limit is all for connections.
pub const MAX_RESERVE: u64 = 1024;
/// What one accepted connection is taken to open besides its socket
/// before the count is taken again (skiffd's own handle on the socket,
/// and the handshake's).
pub const PER_CONNECTION: u64 = 3;
/// A count older than this is taken again at the next accept.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Near the limit a count is taken again at every accept, but not more
/// often than this; in between the estimate (which only grows) decides.
pub const NEAR_REFRESH: Duration = Duration::from_millis(20);
/// Refusals for want of descriptors are logged at most this often, each
/// line saying how many there were since the last.
pub const LOG_EVERY: Duration = Duration::from_secs(1);

/// The open-file limit and the part of it kept for work already taken on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    pub limit: u64,
    pub reserve: u64,
}

impl Headroom {
    /// An eighth of `limit`, between [`MIN_RESERVE`] and [`MAX_RESERVE`],
    /// and never more than half of it.
    pub fn for_limit(limit: u64) -> Headroom {
        let reserve = (limit / 8).clamp(MIN_RESERVE, MAX_RESERVE).min(limit / 2);
        Headroom { limit, reserve }
    }

    /// Whether a new connection may be taken with `open` descriptors open
    /// (its own socket included).
    pub fn admits(&self, open: u64) -> bool {
        open.saturating_add(self.reserve) <= self.limit
    }

    /// Whether `open` is close enough to the limit that the count must be
    /// fresh to decide.
    fn near(&self, open: u64) -> bool {
        open.saturating_add(2 * self.reserve) > self.limit
    }
}

/// What the listener knows of how many descriptors are open: the last
/// count, when it was taken, and the connections taken since.
#[derive(Debug, Clone, Default)]
pub struct Gauge {
    counted: u64,
    at: Option<Instant>,
    taken_since: u64,
}

impl Gauge {
    /// An estimate that errs high: the last count plus
    /// [`PER_CONNECTION`] for each connection taken since, and at least one
    /// more than `accepted_fd` (descriptors are handed out lowest first, so
    /// every one below it is open).
    pub fn estimate(&self, accepted_fd: u64) -> u64 {
        let counted = self
            .counted
            .saturating_add(self.taken_since.saturating_mul(PER_CONNECTION));
        counted.max(accepted_fd.saturating_add(1))
    }

    /// Whether to count again before deciding at `now`, given `estimate`.
    pub fn must_count(&self, headroom: &Headroom, estimate: u64, now: Instant) -> bool {
        let Some(at) = self.at else {
            return true;
        };
        let age = now.saturating_duration_since(at);
        age >= REFRESH || (headroom.near(estimate) && age >= NEAR_REFRESH)
    }

    /// A fresh count, taken at `now`.
    pub fn counted(&mut self, open: u64, now: Instant) {
        self.counted = open;
        self.at = Some(now);
        self.taken_since = 0;
    }

    /// A connection was taken.
    pub fn took(&mut self) {
        self.taken_since = self.taken_since.saturating_add(1);
    }
}

/// Logs a kind of event at most once per [`LOG_EVERY`].
#[derive(Debug, Clone, Default)]
pub struct LogEvery {
    last: Option<Instant>,
    unlogged: u64,
}

impl LogEvery {
    /// One more event at `now`: `Some(n)` when a line is due, `n` being the
    /// events since the last line (this one included); `None` otherwise.
    pub fn event(&mut self, now: Instant) -> Option<u64> {
        self.unlogged = self.unlogged.saturating_add(1);
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= LOG_EVERY);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_scales_with_the_limit_within_bounds() {
        assert_eq!(Headroom::for_limit(1024).reserve, 128);
        assert_eq!(Headroom::for_limit(128).reserve, MIN_RESERVE);
        assert_eq!(Headroom::for_limit(1 << 20).reserve, MAX_RESERVE);
        // A tiny limit keeps half for connections.
        assert_eq!(Headroom::for_limit(40).reserve, 20);
        let h = Headroom::for_limit(1024);
        assert!(h.admits(896));
        assert!(!h.admits(897));
        assert!(!h.admits(u64::MAX));
    }

    #[test]
    fn counts_are_taken_when_stale_or_near_the_limit() {
        let h = Headroom::for_limit(1024);
        let t0 = Instant::now();
        let mut g = Gauge::default();
        assert!(g.must_count(&h, 0, t0), "never counted");
        g.counted(100, t0);
        // Far from the limit: the estimate serves until the count is stale.
        g.took();
        g.took();
        assert_eq!(g.estimate(7), 100 + 2 * PER_CONNECTION);
        assert!(!g.must_count(&h, 106, t0 + REFRESH / 2));
        assert!(g.must_count(&h, 106, t0 + REFRESH));
        // The descriptor just handed out bounds the count from below.
        assert_eq!(g.estimate(500), 501);
        // Near the limit: counted again, but not at every accept.
        assert!(!g.must_count(&h, 800, t0 + NEAR_REFRESH / 2));
        assert!(g.must_count(&h, 800, t0 + NEAR_REFRESH));
        g.counted(50, t0 + NEAR_REFRESH);
        assert_eq!(g.estimate(3), 50);
    }

    #[test]
    fn refusals_are_logged_once_a_second_with_a_count() {
        let t0 = Instant::now();
        let mut log = LogEvery::default();
        assert_eq!(log.event(t0), Some(1));
        for i in 1..100 {
            assert_eq!(log.event(t0 + Duration::from_millis(i * 5)), None);
        }
        assert_eq!(log.event(t0 + LOG_EVERY), Some(100));
        assert_eq!(log.event(t0 + LOG_EVERY * 3), Some(1));
    }
}
