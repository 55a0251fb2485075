//! What keeps a connection process's start off its connection's path,
//! beyond what the zygote did before forking it: while it waits for a
//! connection it maps the program's code in ([`prefault_code`]), which a
//! forked process would otherwise fault in page by page as its first
//! handshake runs (the page tables of file mappings are not copied by
//! `fork`).

/// Maps in every executable mapping of the process now (its page tables
/// filled from the page cache: `MADV_POPULATE_READ`, Linux 5.14), so that
/// running that code later takes no page faults. Best effort: an older
/// kernel refuses and nothing changes.
pub fn prefault_code() {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.contains('x') {
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
        if end <= start {
            continue;
        }
        // SAFETY: MADV_POPULATE_READ only reads pages of a mapping this
        // process has (the range comes from its own /proc/self/maps); it
        // changes no memory contents.
        let _ = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_READ,
            )
        };
    }
}
