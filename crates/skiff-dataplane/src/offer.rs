//! Offering a tree: the sending side of a copy, whichever end sends (the
//! client uploading, the transfer process serving a download). The sources
//! are walked in scp's order ([`skiff_files::walk`]); each entry whose name
//! can be sent and whose file opens gets the next id, is announced through
//! the caller (which owns the control channel), and its chunks go on the
//! [`ChunkQueue`] for the stream senders. An entry that cannot be sent is
//! reported and skipped: it takes no id, so the receiver never waits for it.

use std::path::{Path, PathBuf};

use skiff_files::{EntryKind, FileError};
use skiff_proto::dataplane::EntryWire;

use crate::send::{ChunkQueue, Outgoing};

/// One step of offering a tree, in walk order.
#[derive(Debug)]
pub enum Offered {
    /// An entry to announce; a file's chunks are queued once the
    /// announcement was taken. `source` is the local path it comes from.
    Entry { wire: EntryWire, source: PathBuf },
    /// A source or entry that cannot be sent (missing, unreadable, a name
    /// that is not UTF-8): what to tell the person. The walk goes on.
    Unsendable(String),
}

/// Walks `sources` (`-r`: `recursive`), hands each step to `announce` and
/// queues every announced file's chunks on `queue`. Stops early when
/// `announce` returns false (the control channel is gone) or the queue is
/// aborted; closes the queue in every case, so the senders finish.
pub fn offer_tree(
    sources: &[PathBuf],
    recursive: bool,
    queue: &ChunkQueue,
    announce: &mut dyn FnMut(Offered) -> bool,
) {
    walk_sendable(sources, recursive, &mut |walked| match walked {
        Walked::Unsendable(why) => announce(Offered::Unsendable(why)),
        Walked::Entry { wire, source, file } => {
            let (id, size) = (wire.id, wire.size);
            announce(Offered::Entry { wire, source })
                && file.is_none_or(|file| queue.push(Outgoing::new(id, file, size)))
        }
    });
    queue.close();
}

/// How much an upload may hold to be read whole ahead of time
/// ([`read_small_tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmallLimits {
    /// File bytes, all files together.
    pub bytes: u64,
    /// Entries, directories included.
    pub entries: usize,
}

/// One entry of a [`SmallTree`]: its announcement (a file's `size` is the
/// number of bytes read), where it comes from, and a file's bytes.
#[derive(Debug)]
pub struct SmallEntry {
    pub wire: EntryWire,
    pub source: PathBuf,
    pub bytes: Vec<u8>,
}

/// An upload read whole, for the control channel: each entry in walk order.
#[derive(Debug, Default)]
pub struct SmallTree {
    pub entries: Vec<SmallEntry>,
    /// What cannot be sent, as [`Offered::Unsendable`] says it.
    pub unsendable: Vec<String>,
    /// File bytes, all files together.
    pub bytes: u64,
}

/// Walks `sources` (`-r`: `recursive`) as [`offer_tree`] does, reading
/// every file whole, or `None` as soon as the walk goes past `limits`
/// (so a large tree costs at most that much reading before the caller
/// sends it the usual way). A file read while it changes is sent as read;
/// one that cannot be read is reported and its id left unused.
pub fn read_small_tree(
    sources: &[PathBuf],
    recursive: bool,
    limits: SmallLimits,
) -> Option<SmallTree> {
    use std::io::Read;
    let mut tree = SmallTree::default();
    let mut fits = true;
    walk_sendable(sources, recursive, &mut |walked| {
        let (mut wire, source, file) = match walked {
            Walked::Unsendable(why) => {
                tree.unsendable.push(why);
                return true;
            }
            Walked::Entry { wire, source, file } => (wire, source, file),
        };
        let room = limits.bytes - tree.bytes;
        if tree.entries.len() >= limits.entries || wire.size > room {
            fits = false;
            return false;
        }
        let mut bytes = Vec::new();
        if let Some(file) = file {
            if let Err(e) = file.take(room + 1).read_to_end(&mut bytes) {
                tree.unsendable.push(FileError::io(&source, &e).to_string());
                return true;
            }
            if bytes.len() as u64 > room {
                fits = false;
                return false;
            }
            wire.size = bytes.len() as u64;
            tree.bytes += wire.size;
        }
        tree.entries.push(SmallEntry {
            wire,
            source,
            bytes,
        });
        true
    });
    fits.then_some(tree)
}

/// One step of walking the sources to send them.
enum Walked {
    /// An entry that can be sent, under the next id, with its file opened
    /// (none for a directory).
    Entry {
        wire: EntryWire,
        source: PathBuf,
        file: Option<std::fs::File>,
    },
    /// A source or entry that cannot be sent, and why: it takes no id, so
    /// the receiver never waits for it.
    Unsendable(String),
}

/// Walks `sources` in scp's order ([`skiff_files::walk`]), numbering the
/// entries that can be sent from 0, and hands each step to `step` until it
/// returns false.
fn walk_sendable(sources: &[PathBuf], recursive: bool, step: &mut dyn FnMut(Walked) -> bool) {
    let mut next_id = 0u32;
    for source in sources {
        for entry in skiff_files::walk(source, recursive) {
            let walked = match entry {
                Err(e) => Walked::Unsendable(e.to_string()),
                Ok(entry) => match sendable(&entry, next_id) {
                    Ok((wire, file)) => {
                        next_id += 1;
                        Walked::Entry {
                            wire,
                            source: entry.source,
                            file,
                        }
                    }
                    Err(why) => Walked::Unsendable(why),
                },
            };
            if !step(walked) {
                return;
            }
        }
    }
}

/// The announcement for `entry` under `id`, with its file opened (none for
/// a directory), or why it cannot be sent.
fn sendable(
    entry: &skiff_files::Entry,
    id: u32,
) -> Result<(EntryWire, Option<std::fs::File>), String> {
    let Some(rel) = entry.rel.to_str() else {
        return Err(format!(
            "{}: name is not UTF-8; not copied",
            entry.source.display()
        ));
    };
    let is_dir = entry.kind == EntryKind::Dir;
    let file = match is_dir {
        true => None,
        false => Some(
            std::fs::File::open(&entry.source)
                .map_err(|e| FileError::io(&entry.source, &e).to_string())?,
        ),
    };
    let wire = EntryWire {
        id,
        rel: rel.to_string(),
        is_dir,
        size: entry.size,
        mode: entry.mode,
        mtime: entry.mtime,
        mtime_nsec: entry.mtime_nsec,
        atime: entry.atime,
        atime_nsec: entry.atime_nsec,
    };
    Ok((wire, file))
}

/// A source as the peer named it: an empty name is the current directory.
pub fn source_path(name: &str) -> &Path {
    Path::new(if name.is_empty() { "." } else { name })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn offered(sources: &[PathBuf], recursive: bool) -> Vec<String> {
        let queue = ChunkQueue::new(1024);
        let mut seen = Vec::new();
        offer_tree(sources, recursive, &queue, &mut |o| {
            seen.push(match o {
                Offered::Entry { wire, .. } => format!("{} {} {}", wire.id, wire.rel, wire.size),
                Offered::Unsendable(why) => format!("! {why}"),
            });
            true
        });
        seen
    }

    /// `root/d` holding `a` (3 bytes), a name that is not UTF-8, and `c`
    /// (5 bytes).
    fn mixed_tree(root: &Path) -> PathBuf {
        let d = root.join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("a"), b"abc").unwrap();
        std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"b\xff")), b"x").unwrap();
        std::fs::write(d.join("c"), b"hello").unwrap();
        d
    }

    #[test]
    fn entries_that_cannot_be_sent_take_no_id() {
        let dir = tempfile::tempdir().unwrap();
        let d = mixed_tree(dir.path());
        let seen = offered(&[d.clone(), dir.path().join("missing")], true);
        assert_eq!(seen.len(), 5, "{seen:?}");
        assert_eq!(&seen[..2], ["0 d 0", "1 d/a 3"]);
        assert!(
            seen[2].starts_with("! ") && seen[2].contains("not UTF-8"),
            "{seen:?}"
        );
        assert_eq!(seen[3], "2 d/c 5");
        assert!(
            seen[4].starts_with("! ") && seen[4].contains("missing"),
            "{seen:?}"
        );
    }

    #[test]
    fn a_refused_announcement_stops_the_walk_and_closes_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(dir.path().join(n), b"12").unwrap();
        }
        let sources: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| dir.path().join(n)).collect();
        let queue = ChunkQueue::new(1024);
        let mut announced = 0;
        offer_tree(&sources, false, &queue, &mut |_| {
            announced += 1;
            announced < 2
        });
        assert_eq!(announced, 2);
        // Only the first file's chunk was queued, and the queue is closed:
        // a sender drains it and ends.
        assert_eq!(queue.queued(), 1);
        assert!(queue.is_closed());
    }

    #[test]
    fn a_small_tree_is_read_whole_in_walk_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = mixed_tree(dir.path());
        let limits = SmallLimits {
            bytes: 8,
            entries: 3,
        };
        let tree = read_small_tree(&[d.clone(), dir.path().join("missing")], true, limits)
            .expect("within the limits");
        let seen: Vec<_> = tree
            .entries
            .iter()
            .map(|e| {
                (
                    e.wire.id,
                    e.wire.rel.as_str(),
                    e.wire.size,
                    e.bytes.as_slice(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (0, "d", 0, &b""[..]),
                (1, "d/a", 3, &b"abc"[..]),
                (2, "d/c", 5, &b"hello"[..])
            ]
        );
        assert_eq!(tree.bytes, 8);
        assert_eq!(tree.unsendable.len(), 2, "{:?}", tree.unsendable);
        assert!(tree.unsendable[0].contains("not UTF-8"));
        assert!(tree.unsendable[1].contains("missing"));
    }

    #[test]
    fn a_tree_past_either_limit_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        for (n, len) in [("a", 5usize), ("b", 5)] {
            std::fs::write(dir.path().join(n), vec![1u8; len]).unwrap();
        }
        let sources: Vec<PathBuf> = ["a", "b"].iter().map(|n| dir.path().join(n)).collect();
        let fits = SmallLimits {
            bytes: 10,
            entries: 2,
        };
        assert_eq!(read_small_tree(&sources, false, fits).unwrap().bytes, 10);
        let fewer_bytes = SmallLimits { bytes: 9, ..fits };
        assert!(read_small_tree(&sources, false, fewer_bytes).is_none());
        let fewer_entries = SmallLimits { entries: 1, ..fits };
        assert!(read_small_tree(&sources, false, fewer_entries).is_none());
    }

    #[test]
    fn an_empty_source_name_is_the_current_directory() {
        assert_eq!(source_path(""), Path::new("."));
        assert_eq!(source_path("x/y"), Path::new("x/y"));
    }
}
