//! Channel receive windows sized to the path: a window starts at 2 MiB and
//! doubles, up to a cap, whenever the peer used half of it up in less than
//! a round trip, which is what a sender held back by the window (rather
//! than by the path's bandwidth) looks like. This is what lets one SSH
//! channel fill a long, fat path; on loopback windows never need to grow.
//!
//! Pure bookkeeping: the caller says when a window top-up happens and what
//! the round-trip time is (from TCP_INFO).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The window a channel starts with.
pub const INITIAL_WINDOW: u32 = 2 * 1024 * 1024;

/// The default largest window.
pub const DEFAULT_MAX_WINDOW: u32 = 64 * 1024 * 1024;

/// Round-trip times below this are treated as this (loopback, LAN): no
/// window needs to grow there.
const RTT_FLOOR: Duration = Duration::from_micros(200);

/// Decides the next receive-window target of a connection.
#[derive(Debug)]
pub struct WindowGrowth {
    max: u32,
    /// When each channel's window was last topped up, and whether that
    /// top-up grew the window.
    last_top_up: HashMap<u32, (Instant, bool)>,
}

impl WindowGrowth {
    /// `max` is the cap (at least the initial window).
    pub fn new(max: u32) -> WindowGrowth {
        WindowGrowth {
            max: max.max(INITIAL_WINDOW),
            last_top_up: HashMap::new(),
        }
    }

    /// Called each time channel `channel` has used up half of its window
    /// `current` and gets a top-up. Returns the target window from now on.
    pub fn top_up(
        &mut self,
        channel: u32,
        current: u32,
        now: Instant,
        rtt: Option<Duration>,
    ) -> u32 {
        if self.last_top_up.len() >= 4096 {
            // Channels that closed long ago (the caller may not say).
            self.last_top_up
                .retain(|_, (t, _)| now.saturating_duration_since(*t) < Duration::from_secs(60));
        }
        let previous = self.last_top_up.insert(channel, (now, false));
        let (Some((previous, grew)), Some(rtt)) = (previous, rtt) else {
            return current;
        };
        if grew {
            // A larger target makes the very next packet top the window up
            // again: that top-up says nothing about the sender. Timing
            // starts over from it.
            return current;
        }
        let rtt = rtt.max(RTT_FLOOR);
        let half_window_took = now.saturating_duration_since(previous);
        if half_window_took < rtt && current < self.max {
            self.last_top_up.insert(channel, (now, true));
            current.saturating_mul(2).min(self.max)
        } else {
            current
        }
    }

    /// Forgets a closed channel.
    pub fn closed(&mut self, channel: u32) {
        self.last_top_up.remove(&channel);
    }
}

/// Parses a window size such as `64M`, `128m`, `1G` or `4194304`.
pub fn parse_size(s: &str) -> Option<u32> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let factor: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => return None,
    };
    u32::try_from(n.checked_mul(factor)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn grows_while_the_window_is_what_limits_the_sender() {
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        let t0 = Instant::now();
        let rtt = Some(40 * MS);
        let mut w = INITIAL_WINDOW;
        // First top-up: nothing to compare with yet.
        assert_eq!(g.top_up(0, w, t0, rtt), w);
        // Half a window every 20 ms on a 40 ms path: window-limited, so it
        // doubles up to the cap, and stays there. Each growth is followed at
        // once by the top-up the larger target causes, which is not timed.
        let mut t = t0;
        for _ in 0..10 {
            t += 20 * MS;
            let before = w;
            w = g.top_up(0, w, t, rtt);
            if w != before {
                t += Duration::from_micros(50);
                assert_eq!(g.top_up(0, w, t, rtt), w, "the induced top-up grew it");
            }
        }
        assert_eq!(w, DEFAULT_MAX_WINDOW);
    }

    #[test]
    fn one_slow_half_window_stops_the_growth() {
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        let t0 = Instant::now();
        let rtt = Some(40 * MS);
        g.top_up(4, INITIAL_WINDOW, t0, rtt);
        let w = g.top_up(4, INITIAL_WINDOW, t0 + 20 * MS, rtt);
        assert_eq!(w, 2 * INITIAL_WINDOW);
        // The induced top-up right after, then half of the new window taking
        // longer than a round trip: the path is the limit now.
        assert_eq!(
            g.top_up(4, w, t0 + 20 * MS + Duration::from_micros(30), rtt),
            w
        );
        assert_eq!(g.top_up(4, w, t0 + 70 * MS, rtt), w);
    }

    #[test]
    fn stays_put_when_the_path_is_the_limit_or_rtt_is_unknown() {
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        let t0 = Instant::now();
        g.top_up(1, INITIAL_WINDOW, t0, Some(10 * MS));
        // Half a window took longer than a round trip: bandwidth-limited.
        assert_eq!(
            g.top_up(1, INITIAL_WINDOW, t0 + 15 * MS, Some(10 * MS)),
            INITIAL_WINDOW
        );
        // Loopback: even a fast consumer does not need more.
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        g.top_up(2, INITIAL_WINDOW, t0, Some(Duration::from_micros(20)));
        assert_eq!(
            g.top_up(
                2,
                INITIAL_WINDOW,
                t0 + Duration::from_micros(500),
                Some(Duration::from_micros(20))
            ),
            INITIAL_WINDOW
        );
        // No RTT estimate: no growth.
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        g.top_up(3, INITIAL_WINDOW, t0, None);
        assert_eq!(g.top_up(3, INITIAL_WINDOW, t0 + MS, None), INITIAL_WINDOW);
        // Channels are timed separately, and a closed one starts over.
        let mut g = WindowGrowth::new(DEFAULT_MAX_WINDOW);
        g.top_up(4, INITIAL_WINDOW, t0, Some(40 * MS));
        g.closed(4);
        assert_eq!(
            g.top_up(4, INITIAL_WINDOW, t0 + MS, Some(40 * MS)),
            INITIAL_WINDOW
        );
    }

    #[test]
    fn the_cap_is_respected_and_never_below_the_start() {
        let mut g = WindowGrowth::new(3 * 1024 * 1024);
        let t0 = Instant::now();
        g.top_up(0, INITIAL_WINDOW, t0, Some(40 * MS));
        assert_eq!(
            g.top_up(0, INITIAL_WINDOW, t0 + MS, Some(40 * MS)),
            3 * 1024 * 1024
        );
        let g = WindowGrowth::new(1);
        assert_eq!(g.max, INITIAL_WINDOW);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("128m"), Some(128 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("8G"), None);
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size(""), None);
    }
}
