//! The program's code that a connection will run, mapped in while a
//! connection process waits rather than faulted in during its client's
//! handshake.
//!
//! `fork` does not copy the page tables of file mappings, so a forked
//! process faults its code in as it runs it, on its connection's path
//! (measured: ~0.25 ms of faults per cold exec). Mapping all of the code in
//! with `MADV_POPULATE_READ`, which walks it page by page, cost each process
//! ~0.65 ms of CPU and was dropped. A read fault maps the whole page-cache
//! folio it falls in, so reading one byte per page of the code that
//! matters is far cheaper: the zygote records, once it has rehearsed a key
//! exchange and a login (`crate::rehearsal`), which pages of code are
//! present in its own page tables (`/proc/self/pagemap`) as [`HotCode`],
//! and each process it forks reads those while it waits. Measured: a cold
//! exec 0.49 ms faster back to back, 0.70 ms with idle time between execs,
//! for no measurable CPU (docs/BENCHMARKS.md).
//!
//! The parsing of `/proc/self/maps` and of pagemap entries is pure and
//! tested here; reading those two files is the only I/O.

use std::ops::Range;

/// A pagemap entry's "present" bit.
const PRESENT: u64 = 1 << 63;

/// Address ranges of code, each a run of pages that were present.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HotCode {
    ranges: Vec<Range<usize>>,
}

impl HotCode {
    /// The code pages present in this process's page tables now. Empty
    /// when they cannot be read (the processes then fault their code in
    /// as they run it).
    pub fn of_this_process() -> HotCode {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return HotCode::default();
        };
        let Ok(mut pagemap) = std::fs::File::open("/proc/self/pagemap") else {
            return HotCode::default();
        };
        let page = page_size();
        let mut ranges = Vec::new();
        for mapping in executable_mappings(&maps) {
            let pages = (mapping.end - mapping.start) / page;
            let mut raw = vec![0u8; pages * 8];
            let offset = (mapping.start / page * 8) as u64;
            if pagemap.seek(SeekFrom::Start(offset)).is_err()
                || pagemap.read_exact(&mut raw).is_err()
            {
                continue;
            }
            let entries: Vec<u64> = raw
                .chunks_exact(8)
                .map(|e| u64::from_ne_bytes(e.try_into().expect("8 bytes")))
                .collect();
            ranges.extend(present_runs(mapping.start, page, &entries));
        }
        HotCode { ranges }
    }

    /// How many bytes of code this covers.
    pub fn bytes(&self) -> usize {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Maps these pages in by reading a byte of each: a fault maps the
    /// whole page-cache folio it falls in, so most reads find their page
    /// mapped already. (`MADV_POPULATE_READ` does the same page by page,
    /// and cost ~0.65 ms for all the code.)
    pub fn map_in(&self) {
        let page = page_size();
        for r in &self.ranges {
            let mut at = r.start;
            while at < r.end {
                // SAFETY: the range is part of a readable, executable
                // mapping of this process (from /proc/self/maps, as in the
                // zygote this process was forked from, with the same
                // mappings); reading a byte of it changes nothing.
                unsafe { std::ptr::read_volatile(at as *const u8) };
                at += page;
            }
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The address ranges of the executable mappings in a `/proc/PID/maps`
/// text. Lines that do not parse are skipped.
fn executable_mappings(maps: &str) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        // Readable and executable: code that a read may touch.
        if !(perms.contains('r') && perms.contains('x')) {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        if end > start {
            found.push(start..end);
        }
    }
    found
}

/// The runs of present pages among `entries` (one pagemap entry per page,
/// the first at `start`), as address ranges.
fn present_runs(start: usize, page: usize, entries: &[u64]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if entry & PRESENT == 0 {
            continue;
        }
        let at = start + i * page;
        match runs.last_mut() {
            Some(last) if last.end == at => last.end = at + page,
            _ => runs.push(at..at + page),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_executable_mappings_are_taken() {
        let maps = "\
55d0c0000000-55d0c0100000 r--p 00000000 fd:01 123 /usr/sbin/skiffd
55d0c0100000-55d0c0900000 r-xp 00100000 fd:01 123 /usr/sbin/skiffd
55d0c0900000-55d0c0a00000 rw-p 00900000 fd:01 123 /usr/sbin/skiffd
7f0000000000-7f0000001000 --xp 00000000 00:00 0
7f0000003000-7f0000004000 r-xp 00000000 00:00 0
garbage line
7f0000002000-7f0000001000 r-xp 00000000 00:00 0
";
        assert_eq!(
            executable_mappings(maps),
            vec![
                0x55d0c0100000..0x55d0c0900000,
                0x7f0000003000..0x7f0000004000
            ]
        );
    }

    #[test]
    fn present_pages_make_runs() {
        let p = PRESENT;
        let entries = [p, p | 42, 0, p, 0, 0, p, p, p];
        assert_eq!(
            present_runs(0x1000, 0x1000, &entries),
            vec![0x1000..0x3000, 0x4000..0x5000, 0x7000..0xa000]
        );
        assert!(present_runs(0, 0x1000, &[0, 0, 0]).is_empty());
    }

    /// This very test has run code, so some of it is present.
    #[test]
    fn this_process_has_hot_code() {
        let hot = HotCode::of_this_process();
        assert!(hot.bytes() > 0, "{hot:?}");
        hot.map_in();
    }
}
