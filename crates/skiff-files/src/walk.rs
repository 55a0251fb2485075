//! Walking one command-line source the way scp does: a file is one entry; a
//! directory (only with `-r`) is itself, then its contents, depth first and
//! in name order. Symlinks are followed; a symlink that leads back to a
//! directory being walked is reported and not followed. Every error belongs
//! to one path and the walk goes on past it.

use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::FileError;

/// What kind of entry a walk yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
}

/// One entry of a source tree, in walk order (a directory before its contents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Full local path to read.
    pub source: PathBuf,
    /// Path relative to the destination root, starting with the source's own
    /// base name (copying dir `a` yields `a`, `a/x`, `a/sub`, `a/sub/y`).
    pub rel: PathBuf,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits only (0o7777).
    pub mode: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub atime: i64,
    pub atime_nsec: u32,
}

impl Entry {
    fn from_metadata(source: PathBuf, rel: PathBuf, kind: EntryKind, meta: &Metadata) -> Entry {
        Entry {
            source,
            rel,
            kind,
            size: if kind == EntryKind::File {
                meta.len()
            } else {
                0
            },
            mode: meta.mode() & 0o7777,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
            atime: meta.atime(),
            atime_nsec: meta.atime_nsec().clamp(0, 999_999_999) as u32,
        }
    }

    /// The entry's access and modification times, for `-p`.
    pub fn times(&self) -> crate::Times {
        crate::Times {
            atime: self.atime,
            atime_nsec: self.atime_nsec,
            mtime: self.mtime,
            mtime_nsec: self.mtime_nsec,
        }
    }
}

/// Walks one command-line source. Without `recursive` a directory is an
/// error for that source ("<path>: is a directory (use -r)"). Symlinks are
/// followed (like scp); a directory loop is reported, not followed. Errors
/// are per entry and the walk goes on.
pub fn walk(source: &Path, recursive: bool) -> Walk {
    Walk {
        root: Some(source.to_path_buf()),
        recursive,
        stack: Vec::new(),
    }
}

/// The iterator [`walk`] returns.
pub struct Walk {
    root: Option<PathBuf>,
    recursive: bool,
    stack: Vec<Frame>,
}

/// A directory being walked: what is left of its listing.
struct Frame {
    dir: PathBuf,
    rel: PathBuf,
    id: (u64, u64),
    names: std::vec::IntoIter<OsString>,
}

/// The name a source is copied under: its last component, or for `.` and
/// the like, the last component of its canonical path.
fn source_name(source: &Path) -> Result<OsString, FileError> {
    if let Some(name) = source.file_name() {
        return Ok(name.to_os_string());
    }
    let real = fs::canonicalize(source).map_err(|e| FileError::io(source, &e))?;
    real.file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| FileError::new(source, "cannot copy a file system root by name"))
}

impl Walk {
    fn start(&mut self, source: PathBuf) -> Option<Result<Entry, FileError>> {
        let name = match source_name(&source) {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        self.visit(source, PathBuf::from(name), true)
    }

    /// Stats `path` (following symlinks) and turns it into an entry,
    /// entering it when it is a directory.
    fn visit(
        &mut self,
        path: PathBuf,
        rel: PathBuf,
        is_root: bool,
    ) -> Option<Result<Entry, FileError>> {
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => return Some(Err(FileError::io(&path, &e))),
        };
        let file_type = meta.file_type();
        if file_type.is_file() {
            return Some(Ok(Entry::from_metadata(path, rel, EntryKind::File, &meta)));
        }
        if !file_type.is_dir() {
            let what = if file_type.is_fifo() {
                "a FIFO"
            } else if file_type.is_socket() {
                "a socket"
            } else if file_type.is_block_device() || file_type.is_char_device() {
                "a device"
            } else {
                "not a regular file"
            };
            let message = if what.starts_with("not") {
                what.to_string()
            } else {
                format!("not a regular file ({what})")
            };
            return Some(Err(FileError::new(path, message)));
        }
        if is_root && !self.recursive {
            return Some(Err(FileError::new(path, "is a directory (use -r)")));
        }
        let id = (meta.dev(), meta.ino());
        if let Some(frame) = self.stack.iter().find(|f| f.id == id) {
            return Some(Err(FileError::new(
                &path,
                format!(
                    "directory loop (the same directory as {}); not followed",
                    frame.dir.display()
                ),
            )));
        }
        let mut names = Vec::new();
        let listing = fs::read_dir(&path).and_then(|entries| {
            for entry in entries {
                names.push(entry?.file_name());
            }
            Ok(())
        });
        if let Err(e) = listing {
            return Some(Err(FileError::io(&path, &e)));
        }
        names.sort();
        let entry = Entry::from_metadata(path.clone(), rel.clone(), EntryKind::Dir, &meta);
        self.stack.push(Frame {
            dir: path,
            rel,
            id,
            names: names.into_iter(),
        });
        Some(Ok(entry))
    }
}

impl Iterator for Walk {
    type Item = Result<Entry, FileError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(root) = self.root.take() {
            return self.start(root);
        }
        loop {
            let frame = self.stack.last_mut()?;
            let Some(name) = frame.names.next() else {
                self.stack.pop();
                continue;
            };
            let path = frame.dir.join(&name);
            let rel = frame.rel.join(&name);
            return self.visit(path, rel, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn rels(items: &[Result<Entry, FileError>]) -> Vec<String> {
        items
            .iter()
            .map(|r| match r {
                Ok(e) => format!(
                    "{}{}",
                    e.rel.display(),
                    if e.kind == EntryKind::Dir { "/" } else { "" }
                ),
                Err(e) => format!("ERR {e}"),
            })
            .collect()
    }

    fn tree() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        fs::create_dir_all(a.join("sub/deeper")).unwrap();
        fs::create_dir_all(a.join("empty")).unwrap();
        fs::write(a.join("x"), b"hello").unwrap();
        fs::write(a.join("sub/y"), b"").unwrap();
        fs::write(a.join("sub/deeper/z"), b"zz").unwrap();
        fs::write(a.join("b"), b"bb").unwrap();
        tmp
    }

    #[test]
    fn order_and_relative_paths() {
        let tmp = tree();
        let items: Vec<_> = walk(&tmp.path().join("a"), true).collect();
        assert_eq!(
            rels(&items),
            [
                "a/",
                "a/b",
                "a/empty/",
                "a/sub/",
                "a/sub/deeper/",
                "a/sub/deeper/z",
                "a/sub/y",
                "a/x"
            ]
        );
        let x = items
            .iter()
            .flatten()
            .find(|e| e.rel == Path::new("a/x"))
            .unwrap();
        assert_eq!(x.source, tmp.path().join("a/x"));
        assert_eq!(x.size, 5);
        assert_eq!(x.kind, EntryKind::File);
        // A trailing slash or `/.` names the same directory.
        let slash = PathBuf::from(format!("{}/a/", tmp.path().display()));
        assert_eq!(rels(&walk(&slash, true).collect::<Vec<_>>())[0], "a/");
    }

    #[test]
    fn modes_sizes_and_times_come_from_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        fs::write(&f, vec![7u8; 1234]).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o4751)).unwrap();
        let meta = fs::metadata(&f).unwrap();
        let e = walk(&f, false).next().unwrap().unwrap();
        assert_eq!(e.rel, PathBuf::from("f"));
        assert_eq!(e.size, 1234);
        assert_eq!(e.mode, 0o4751);
        assert_eq!(e.mtime, meta.mtime());
        assert_eq!(e.mtime_nsec as i64, meta.mtime_nsec());
        assert_eq!(e.atime, meta.atime());
    }

    #[test]
    fn directory_without_recursive_is_an_error() {
        let tmp = tree();
        let items: Vec<_> = walk(&tmp.path().join("a"), false).collect();
        assert_eq!(items.len(), 1);
        let e = items[0].as_ref().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: is a directory (use -r)",
                tmp.path().join("a").display()
            )
        );
    }

    #[test]
    fn missing_source_is_one_error() {
        let tmp = tempfile::tempdir().unwrap();
        let items: Vec<_> = walk(&tmp.path().join("nope"), true).collect();
        assert_eq!(items.len(), 1);
        let e = items[0].as_ref().unwrap_err();
        assert!(e.to_string().contains("No such file or directory"), "{e}");
    }

    #[test]
    fn symlinks_are_followed_and_loops_reported() {
        let tmp = tree();
        let a = tmp.path().join("a");
        std::os::unix::fs::symlink(&a, a.join("sub/loop")).unwrap();
        std::os::unix::fs::symlink(a.join("x"), a.join("xlink")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("gone"), a.join("dangling")).unwrap();
        let items: Vec<_> = walk(&a, true).collect();
        let got = rels(&items);
        assert!(got.contains(&"a/xlink".to_string()), "{got:?}");
        let looped: Vec<_> = got
            .iter()
            .filter(|l| l.contains("directory loop"))
            .collect();
        assert_eq!(looped.len(), 1, "{got:?}");
        assert!(looped[0].contains("sub/loop"), "{got:?}");
        assert!(
            got.iter()
                .any(|l| l.starts_with("ERR") && l.contains("dangling")),
            "{got:?}"
        );
        // The walk went on after the errors.
        assert_eq!(got.last().unwrap(), "a/xlink");
    }

    #[test]
    fn unreadable_directory_is_reported_and_the_walk_goes_on() {
        let tmp = tree();
        let a = tmp.path().join("a");
        let sub = a.join("sub");
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o000)).unwrap();
        let can_read = fs::read_dir(&sub).is_ok(); // root reads anyway
        let items: Vec<_> = walk(&a, true).collect();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o755)).unwrap();
        let got = rels(&items);
        if !can_read {
            assert!(
                got.iter()
                    .any(|l| l.starts_with("ERR") && l.contains("sub")),
                "{got:?}"
            );
            assert!(!got.contains(&"a/sub/".to_string()), "{got:?}");
        }
        assert_eq!(got.last().unwrap(), "a/x");
    }

    #[test]
    fn dot_is_named_after_the_directory() {
        let tmp = tree();
        let dot = tmp.path().join("a/sub/.");
        let first = walk(&dot, true).next().unwrap().unwrap();
        assert_eq!(first.rel, PathBuf::from("sub"));
        let first = walk(&tmp.path().join("a/sub/deeper/.."), true)
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(first.rel, PathBuf::from("sub"));
        assert!(walk(Path::new("/"), true).next().unwrap().is_err());
    }

    #[test]
    fn fifo_is_not_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path in our temp dir.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = walk(&fifo, false).next().unwrap().unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
    }
}
