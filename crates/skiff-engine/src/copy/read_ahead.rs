//! How many read requests an SFTP download keeps outstanding for one file
//! (sans-IO; [`super::sftp`] does the I/O).
//!
//! A download moves at most the bytes it has asked for per round trip, so
//! a fixed number of reads caps it at `reads × read size / RTT`: 64 reads
//! of 256 KiB are 16 MiB, 160 MB/s at 100 ms. What the server may send
//! ahead is bounded anyway by this side's receive window (64 MiB unless
//! `SKIFF_MAX_WINDOW` says otherwise), so a file may keep up to its share
//! of three quarters of the window outstanding, the files in flight
//! sharing it.
//!
//! It gets there the way a delay-based congestion control would: it starts
//! at the fixed number used before ([`MIN_READS`]) and adds a read for each
//! answer that came back quickly ([`FAST`]); an answer that took long
//! ([`SLOW`]: the reads queue behind each other on a slow link) takes one
//! away, never below the start. On a slow link the reads would otherwise
//! wait in the server's queue long enough to run into the request time
//! limit.

use std::time::Duration;

/// Reads outstanding per file at the start, and at least.
pub const MIN_READS: usize = 64;

/// Reads outstanding per file at most, whatever the window.
pub const MAX_READS: usize = 1024;

/// An answer this quick lets one more read be outstanding.
pub const FAST: Duration = Duration::from_secs(1);

/// An answer this slow takes one away.
pub const SLOW: Duration = Duration::from_secs(2);

/// The read window of one file being downloaded.
#[derive(Debug, Clone)]
pub struct ReadAhead {
    limit: usize,
    most: usize,
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
        if latency <= FAST {
            self.limit = (self.limit + 1).min(self.most);
        } else if latency >= SLOW {
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
    fn quick_answers_grow_the_limit_up_to_the_share() {
        let mut r = ReadAhead::new(64 * MIB, CHUNK, 1);
        r.answered(Duration::from_millis(100));
        assert_eq!(r.limit(), MIN_READS + 1);
        for _ in 0..1000 {
            r.answered(FAST);
        }
        assert_eq!(r.limit(), r.most());
    }

    #[test]
    fn slow_answers_shrink_it_but_never_below_the_start() {
        let mut r = ReadAhead::new(64 * MIB, CHUNK, 1);
        for _ in 0..10 {
            r.answered(Duration::from_millis(50));
        }
        assert_eq!(r.limit(), MIN_READS + 10);
        // Between quick and slow: no change.
        r.answered(Duration::from_millis(1500));
        assert_eq!(r.limit(), MIN_READS + 10);
        for _ in 0..3 {
            r.answered(SLOW);
        }
        assert_eq!(r.limit(), MIN_READS + 7);
        for _ in 0..100 {
            r.answered(Duration::from_secs(30));
        }
        assert_eq!(r.limit(), MIN_READS);
    }
}
