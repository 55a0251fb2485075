//! How an SFTP upload is spread over several channels of one SSH
//! connection (sans-IO; [`super::sftp`] does the I/O).
//!
//! A stock sshd gives each session channel a fixed 2 MiB window, so one
//! channel uploads at most 2 MiB per round trip. Each SFTP channel (a
//! session with the `sftp` subsystem, a server process of its own) has its
//! own window: an upload over N channels moves up to N windows per round
//! trip. A channel costs a few round trips to open (all opened at once)
//! and a process on the server, so a job gets extra channels only when it
//! is big enough to gain from them. Every number that decides how many
//! channels a job, or one file, uses is here.

/// Channels an upload uses at most unless `--streams` says otherwise
/// (sshd's default `MaxSessions` is 10, and the connection may carry
/// other sessions; refused channels are done without).
pub const DEFAULT_CHANNELS: usize = 8;

/// Bytes a job must bring per channel for that channel to be opened: at
/// 2 MiB per round trip an extra channel has paid for its opening (about
/// three round trips) after a few windows.
pub const BYTES_PER_CHANNEL: u64 = 8 * 1024 * 1024;

/// A job smaller than this uses one channel, whatever its file count
/// says (a few MiB move in a few round trips anyway).
pub const MIN_BYTES_FOR_MORE: u64 = 2 * BYTES_PER_CHANNEL;

/// Files a job must bring per channel, for jobs of many small files (each
/// costs round trips of its own: open, write, fsync, close, rename).
pub const FILES_PER_CHANNEL: u64 = 32;

/// Bytes of one file per channel it is written through: a file is split
/// over more channels only when each gets at least this much.
pub const BYTES_PER_FILE_LANE: u64 = 4 * 1024 * 1024;

/// Write requests outstanding per channel a file uses (256 KiB each: a
/// little more than sshd's 2 MiB window, so the window never waits for
/// the next request).
pub const REQUESTS_PER_LANE: usize = 12;

/// How many channels (the first included, so at least 1) an upload of
/// `files` files of `bytes` bytes in all uses, at most `cap` (`--streams`,
/// else [`DEFAULT_CHANNELS`]).
pub fn upload_channels(bytes: u64, files: u64, cap: Option<usize>) -> usize {
    let cap = cap.unwrap_or(DEFAULT_CHANNELS).max(1);
    let by_bytes = if bytes < MIN_BYTES_FOR_MORE {
        1
    } else {
        bytes / BYTES_PER_CHANNEL
    };
    let by_files = files / FILES_PER_CHANNEL;
    let wanted = by_bytes.max(by_files).max(1);
    usize::try_from(wanted).unwrap_or(usize::MAX).min(cap)
}

/// How many of the `channels` open a file of `size` bytes is written
/// through (its first channel included).
pub fn lanes_for_file(size: u64, channels: usize) -> usize {
    let by_size = usize::try_from(size / BYTES_PER_FILE_LANE).unwrap_or(usize::MAX);
    by_size.clamp(1, channels.max(1))
}

/// Write requests a file written through `lanes` channels keeps
/// outstanding in all (`one_lane` for a single channel, as before).
pub fn requests_for_file(lanes: usize, one_lane: usize) -> usize {
    one_lane.max(REQUESTS_PER_LANE * lanes)
}

/// Files uploaded at once over `channels` channels (`one_channel` for a
/// single channel, as before): one per channel at least, so that many
/// small files spread over all of them.
pub fn files_at_once(channels: usize, one_channel: usize) -> usize {
    one_channel.max(channels)
}

/// Which of `channels` channels the `nth` file of a job starts on (its
/// first channel opens, verifies, syncs and renames it; the next
/// [`lanes_for_file`] − 1 channels in turn help write it).
pub fn home_channel(nth: usize, channels: usize) -> usize {
    nth % channels.max(1)
}

/// The channels a file starting on `home` is written through.
pub fn file_lanes(home: usize, lanes: usize, channels: usize) -> impl Iterator<Item = usize> {
    let channels = channels.max(1);
    (0..lanes.min(channels)).map(move |i| (home + i) % channels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn small_jobs_use_one_channel() {
        assert_eq!(upload_channels(0, 0, None), 1);
        assert_eq!(upload_channels(MIB, 1, None), 1);
        assert_eq!(upload_channels(15 * MIB, 1, None), 1);
        assert_eq!(upload_channels(15 * MIB, 40, None), 1);
    }

    #[test]
    fn large_jobs_use_more_up_to_the_cap() {
        assert_eq!(upload_channels(16 * MIB, 1, None), 2);
        assert_eq!(upload_channels(48 * MIB, 1, None), 6);
        assert_eq!(upload_channels(1024 * MIB, 1, None), DEFAULT_CHANNELS);
        assert_eq!(upload_channels(1024 * MIB, 1, Some(3)), 3);
        assert_eq!(upload_channels(1024 * MIB, 1, Some(16)), 16);
        assert_eq!(upload_channels(1024 * MIB, 1, Some(1)), 1);
        // A cap of 0 is taken as 1: the first channel is always there.
        assert_eq!(upload_channels(1024 * MIB, 1, Some(0)), 1);
        assert_eq!(upload_channels(u64::MAX, u64::MAX, None), DEFAULT_CHANNELS);
    }

    #[test]
    fn many_files_use_more_channels() {
        assert_eq!(upload_channels(20 * MIB, 1000, None), 8);
        assert_eq!(upload_channels(20 * MIB, 100, None), 3);
        assert_eq!(upload_channels(20 * MIB, 10, None), 2);
    }

    #[test]
    fn a_file_is_split_only_when_each_part_is_worth_it() {
        assert_eq!(lanes_for_file(0, 8), 1);
        assert_eq!(lanes_for_file(3 * MIB, 8), 1);
        assert_eq!(lanes_for_file(8 * MIB, 8), 2);
        assert_eq!(lanes_for_file(48 * MIB, 8), 8);
        assert_eq!(lanes_for_file(48 * MIB, 3), 3);
        assert_eq!(lanes_for_file(48 * MIB, 0), 1);
    }

    #[test]
    fn requests_and_files_grow_with_channels() {
        assert_eq!(requests_for_file(1, 64), 64);
        assert_eq!(requests_for_file(8, 64), 96);
        assert_eq!(files_at_once(1, 4), 4);
        assert_eq!(files_at_once(8, 4), 8);
    }

    #[test]
    fn files_take_turns_and_lanes_wrap() {
        assert_eq!(home_channel(0, 3), 0);
        assert_eq!(home_channel(4, 3), 1);
        assert_eq!(home_channel(4, 0), 0);
        assert_eq!(file_lanes(2, 3, 4).collect::<Vec<_>>(), [2, 3, 0]);
        assert_eq!(file_lanes(0, 9, 2).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(file_lanes(0, 1, 1).collect::<Vec<_>>(), [0]);
    }
}
