//! How many read requests an SFTP download keeps outstanding for one file
//! (sans-IO; [`super::sftp`] does the I/O).
//!
//! A download moves at most the bytes it has asked for per round trip, so
//! a fixed number of reads caps it at `reads × read size / RTT`: 64 reads
//! of 256 KiB are 16 MiB, 160 MB/s at 100 ms. Asking for more than the
//! path carries per round trip gains nothing and costs: the answers queue
//! in the server's buffers (measured, a stock sshd holding 48 MiB of
//! answers spent twice the CPU per GiB and the download at 40 ms RTT fell
//! from 179 to 124 MB/s).
//!
//! So a file starts at the fixed number used before ([`MIN_READS`]) and
//! grows the way a delay-based congestion control would: an answer that
//! came back within a quarter (plus [`GRACE`]) of the quickest answer seen
//! so far (the round trip with no queue) adds a read; one that took more
//! than twice that takes one away, never below the start. The reads of the
//! files in flight together stay within three quarters of the receive
//! window (64 MiB unless `SKIFF_MAX_WINDOW` says otherwise).

use std::time::Duration;

/// Reads outstanding per file at the start, and at least.
pub const MIN_READS: usize = 64;

/// Reads outstanding per file at most, whatever the window.
pub const MAX_READS: usize = 1024;

/// Slack on top of the quickest answer before an answer counts as queued
/// (timer and scheduling noise).
pub const GRACE: Duration = Duration::from_millis(2);

/// The read window of one file being downloaded.
#[derive(Debug, Clone)]
pub struct ReadAhead {
    limit: usize,
    most: usize,
    /// The quickest answer so far: the round trip without a queue.
    quickest: Option<Duration>,
}

impl ReadAhead {
    /// For a file read in `read_len`-byte requests while `files_in_flight`
    /// files (this one included) share a receive window of `window` bytes.
    pub fn new(window: u32, read_len: u32, files_in_flight: usize) -> ReadAhead {
        let share = u64::from(window) / 4 * 3;
        let per_file = share / (u64::from(read_len.max(1)) * files_in_flight.max(1) as u64);
        let most = usize::try_from(per_file)
            .unwrap_or(usize::MAX)
            .clamp(MIN_READS, MAX_READS);
        ReadAhead {
            limit: MIN_READS,
            most,
            quickest: None,
        }
    }

    /// How many reads may be outstanding now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The most [`Self::limit`] can grow to.
    pub fn most(&self) -> usize {
        self.most
    }

    /// A read was answered `latency` after it was sent.
    pub fn answered(&mut self, latency: Duration) {
        let quickest = *self
            .quickest
            .insert(self.quickest.map_or(latency, |q| q.min(latency)));
        if latency <= quickest + quickest / 4 + GRACE {
            self.limit = (self.limit + 1).min(self.most);
        } else if latency > quickest * 2 + GRACE {
            self.limit = self.limit.saturating_sub(1).max(MIN_READS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1024 * 1024;
    const CHUNK: u32 = 256 * 1024;

    #[test]
    fn a_lone_file_may_fill_three_quarters_of_the_window() {
        let r = ReadAhead::new(64 * MIB, CHUNK, 1);
        assert_eq!(r.limit(), MIN_READS);
        assert_eq!(r.most(), 192);
    }

    #[test]
    fn files_in_flight_share_the_window_but_keep_the_floor() {
        assert_eq!(ReadAhead::new(64 * MIB, CHUNK, 2).most(), 96);
        assert_eq!(ReadAhead::new(64 * MIB, CHUNK, 4).most(), MIN_READS);
        assert_eq!(ReadAhead::new(2 * MIB, CHUNK, 1).most(), MIN_READS);
        assert_eq!(ReadAhead::new(64 * MIB, CHUNK, 0).most(), 192);
    }

    #[test]
    fn small_reads_and_huge_windows_stay_bounded() {
        assert_eq!(ReadAhead::new(u32::MAX, 1024, 1).most(), MAX_READS);
        assert_eq!(ReadAhead::new(u32::MAX, 0, 1).most(), MAX_READS);
        assert_eq!(ReadAhead::new(64 * MIB, 32 * 1024, 1).most(), MAX_READS);
    }

    #[test]
    fn answers_near_the_quickest_grow_the_limit_up_to_the_share() {
        let mut r = ReadAhead::new(64 * MIB, CHUNK, 1);
        let rtt = Duration::from_millis(100);
        r.answered(rtt);
        assert_eq!(r.limit(), MIN_READS + 1);
        // Within a quarter of the round trip (plus the grace): still no queue.
        r.answered(Duration::from_millis(126));
        assert_eq!(r.limit(), MIN_READS + 2);
        for _ in 0..1000 {
            r.answered(rtt);
        }
        assert_eq!(r.limit(), r.most());
    }

    #[test]
    fn queued_answers_shrink_it_but_never_below_the_start() {
        let mut r = ReadAhead::new(64 * MIB, CHUNK, 1);
        let rtt = Duration::from_millis(40);
        for _ in 0..10 {
            r.answered(rtt);
        }
        assert_eq!(r.limit(), MIN_READS + 10);
        // Queued, but less than twice the round trip: no change.
        r.answered(Duration::from_millis(70));
        assert_eq!(r.limit(), MIN_READS + 10);
        for _ in 0..3 {
            r.answered(Duration::from_millis(90));
        }
        assert_eq!(r.limit(), MIN_READS + 7);
        for _ in 0..100 {
            r.answered(Duration::from_secs(30));
        }
        assert_eq!(r.limit(), MIN_READS);
    }

    #[test]
    fn a_path_already_full_at_the_start_stays_there() {
        // 64 reads queue behind each other from the first answers on: the
        // later ones take ever longer, and the limit never grows.
        let mut r = ReadAhead::new(64 * MIB, CHUNK, 1);
        for i in 0..64u64 {
            r.answered(Duration::from_millis(41 + 2 * i));
        }
        assert!(r.limit() <= MIN_READS + 4, "grew to {}", r.limit());
        // And a quicker answer later lowers the bar, it does not raise it.
        r.answered(Duration::from_millis(30));
        assert!(r.limit() <= MIN_READS + 5);
    }
}
