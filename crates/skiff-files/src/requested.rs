//! What a download may bring: the client's request, not the server, decides
//! which entries may arrive. Every entry a server announces (over the data
//! plane, or found walking it over SFTP) is admitted here before anything
//! is created for it.
//!
//! - Without `-r`, each requested source brings exactly one file, named as
//!   the source is (`logs/app.log` brings `app.log`); a directory, a second
//!   entry, or any other name is refused.
//! - With `-r`, a source brings itself and, when it is a directory, entries
//!   under it; an entry is admitted only once the directory holding it was.
//! - Sources arrive in the order they were asked for, each at most once, and
//!   no path arrives twice.
//! - A source whose name only the server can tell (`.`, `..`, `~`, `~user`,
//!   `/`, empty) may arrive under any single safe name.
//!
//! Names are checked with [`crate::safe_relative`] first, so nothing
//! admitted can point outside the destination. Pure logic, no I/O.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::hash::BuildHasher;
use std::path::{Component, Path, PathBuf};

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Absolute, with `..`, empty, or with NUL (the detail says which).
    UnsafePath(String),
    /// Not one of the requested sources, or not in the order asked.
    NotASource,
    /// A directory where a file was asked for (no `-r`).
    DirectoryWithoutRecursive,
    /// Below a requested source that is not a directory, or below none.
    OutsideTheTree,
    /// Inside a directory that was not announced before it.
    BeforeItsDirectory,
    /// The same path was announced before.
    Twice,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::UnsafePath(what) => write!(f, "unsafe path: {what}"),
            Why::NotASource => f.write_str("it is none of the requested sources"),
            Why::DirectoryWithoutRecursive => {
                f.write_str("a directory where a file was asked for (no -r)")
            }
            Why::OutsideTheTree => f.write_str("it is outside the requested directories"),
            Why::BeforeItsDirectory => f.write_str("its directory was not announced first"),
            Why::Twice => f.write_str("the same path was announced twice"),
        }
    }
}

/// An entry the client did not ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrequested {
    /// The entry's path as the server sent it.
    pub entry: String,
    pub why: Why,
}

impl fmt::Display for Unrequested {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server sent {:?}, which was not asked for ({})",
            self.entry, self.why
        )
    }
}

impl std::error::Error for Unrequested {}

/// The name a requested source arrives under.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Named(OsString),
    /// The server resolves the name (the last component of `.` and the like).
    AnyName,
}

impl Expected {
    /// The name a source typed as `typed` (a path on the server, as the
    /// user gave it) is copied under: its last component, as both ends
    /// compute it; `None` when only the server can tell.
    fn of(typed: &str) -> Expected {
        let path = typed.strip_prefix("~/").unwrap_or(typed);
        // `~` and `~user` are home directories the server expands.
        if path.starts_with('~') && !path.contains('/') {
            return Expected::AnyName;
        }
        match Path::new(path).file_name() {
            Some(name) => Expected::Named(name.to_os_string()),
            None => Expected::AnyName,
        }
    }

    fn admits(&self, name: &std::ffi::OsStr) -> bool {
        match self {
            Expected::Named(n) => n == name,
            Expected::AnyName => true,
        }
    }
}

/// The entries admitted so far of one download.
#[derive(Debug)]
pub struct Requested {
    sources: Vec<Expected>,
    recursive: bool,
    /// The first source that may still arrive.
    next: usize,
    /// Which sources arrived.
    arrived: Vec<bool>,
    /// The source being received: its name, and whether it is a directory.
    current: Option<(OsString, bool)>,
    /// Directories admitted under the current source (the source included),
    /// relative to the destination root.
    dirs: HashSet<PathBuf>,
    /// Hashes of every admitted path, to refuse a path announced twice
    /// without keeping every name of a large tree.
    seen: HashSet<u64>,
    hasher: std::collections::hash_map::RandomState,
}

impl Requested {
    /// A download of `sources` (as typed, one per requested remote path),
    /// with or without `-r`.
    pub fn new(sources: &[String], recursive: bool) -> Requested {
        Requested {
            sources: sources.iter().map(|s| Expected::of(s)).collect(),
            recursive,
            next: 0,
            arrived: vec![false; sources.len()],
            current: None,
            dirs: HashSet::new(),
            seen: HashSet::new(),
            hasher: Default::default(),
        }
    }

    /// Admits an announced entry (`rel` as the server sent it, relative to
    /// the destination root and starting with the source's name), returning
    /// its checked relative path, or refuses it.
    pub fn admit(&mut self, rel: &str, is_dir: bool) -> Result<PathBuf, Unrequested> {
        let refuse = |why| Unrequested {
            entry: rel.to_string(),
            why,
        };
        let path =
            crate::safe_relative(rel).map_err(|e| refuse(Why::UnsafePath(e.message.clone())))?;
        let mut parts = path.components();
        let Some(Component::Normal(top)) = parts.next() else {
            return Err(refuse(Why::UnsafePath("names no file".into())));
        };
        let below = parts.as_path();
        if below.as_os_str().is_empty() {
            self.admit_source(top, is_dir).map_err(refuse)?;
        } else {
            self.admit_inside(top, &path).map_err(refuse)?;
        }
        if !self.seen.insert(self.hash_of(&path)) {
            return Err(refuse(Why::Twice));
        }
        if is_dir {
            self.dirs.insert(path.clone());
        }
        Ok(path)
    }

    /// A source itself: the next requested source (in order) of that name.
    fn admit_source(&mut self, name: &std::ffi::OsStr, is_dir: bool) -> Result<(), Why> {
        let Some(offset) = self.sources[self.next..]
            .iter()
            .position(|e| e.admits(name))
        else {
            let again = self.sources[..self.next]
                .iter()
                .zip(&self.arrived)
                .any(|(e, &arrived)| arrived && *e == Expected::Named(name.to_os_string()));
            return Err(if again { Why::Twice } else { Why::NotASource });
        };
        if is_dir && !self.recursive {
            return Err(Why::DirectoryWithoutRecursive);
        }
        self.arrived[self.next + offset] = true;
        self.next += offset + 1;
        self.current = Some((name.to_os_string(), is_dir));
        // Paths of one source may repeat another's (`a/x` and `b/x` both
        // arrive as `x`), so what counts as seen starts again.
        self.seen.clear();
        self.dirs.clear();
        if is_dir {
            self.dirs.insert(PathBuf::from(name));
        }
        Ok(())
    }

    /// An entry below the current source, in a directory already admitted.
    fn admit_inside(&self, top: &std::ffi::OsStr, path: &Path) -> Result<(), Why> {
        match &self.current {
            Some((name, true)) if self.recursive && name == top => {}
            _ => return Err(Why::OutsideTheTree),
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        if !self.dirs.contains(parent) {
            return Err(Why::BeforeItsDirectory);
        }
        Ok(())
    }

    fn hash_of(&self, path: &Path) -> u64 {
        self.hasher.hash_one(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(sources: &[&str], recursive: bool) -> Requested {
        let sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
        Requested::new(&sources, recursive)
    }

    fn why(r: Result<PathBuf, Unrequested>) -> Why {
        r.expect_err("refused").why
    }

    #[test]
    fn one_file_per_source_without_r() {
        let mut r = req(&["reports/report.txt"], false);
        assert_eq!(
            r.admit("report.txt", false).unwrap(),
            PathBuf::from("report.txt")
        );
        // Anything more: the review's extra files.
        assert_eq!(why(r.admit(".bashrc", false)), Why::NotASource);
        assert_eq!(why(r.admit(".ssh", true)), Why::NotASource);
        assert_eq!(
            why(r.admit(".ssh/authorized_keys", false)),
            Why::OutsideTheTree
        );
        assert_eq!(why(r.admit("report.txt", false)), Why::Twice);
    }

    #[test]
    fn a_directory_needs_r() {
        let mut r = req(&["report.txt"], false);
        assert_eq!(
            why(r.admit("report.txt", true)),
            Why::DirectoryWithoutRecursive
        );
        let mut r = req(&["tree"], true);
        r.admit("tree", true).unwrap();
    }

    #[test]
    fn sources_come_in_order_each_once() {
        let mut r = req(&["a", "b", "c"], false);
        r.admit("a", false).unwrap();
        // b failed on the server and was skipped: c may come.
        r.admit("c", false).unwrap();
        assert_eq!(why(r.admit("b", false)), Why::NotASource);
        // Two sources of one name both arrive.
        let mut r = req(&["x/f", "y/f"], false);
        r.admit("f", false).unwrap();
        r.admit("f", false).unwrap();
        assert_eq!(why(r.admit("f", false)), Why::Twice);
    }

    #[test]
    fn a_tree_brings_only_what_is_under_it() {
        let mut r = req(&["/srv/tree/"], true);
        r.admit("tree", true).unwrap();
        r.admit("tree/a", false).unwrap();
        r.admit("tree/sub", true).unwrap();
        r.admit("tree/sub/b", false).unwrap();
        r.admit("tree/.ssh", true).unwrap();
        assert_eq!(why(r.admit("other", true)), Why::NotASource);
        assert_eq!(why(r.admit("other/x", false)), Why::OutsideTheTree);
        assert_eq!(
            why(r.admit("tree/nosuch/x", false)),
            Why::BeforeItsDirectory
        );
        // A file is not a directory to put things in.
        assert_eq!(why(r.admit("tree/a/x", false)), Why::BeforeItsDirectory);
        assert_eq!(why(r.admit("tree/sub/b", false)), Why::Twice);
        assert_eq!(why(r.admit("tree/sub", true)), Why::Twice);
        assert_eq!(why(r.admit("tree/../x", false)), {
            Why::UnsafePath("unsafe path from peer: contains `..`".into())
        });
        assert!(matches!(
            why(r.admit("/etc/passwd", false)),
            Why::UnsafePath(_)
        ));
    }

    #[test]
    fn a_file_source_has_nothing_under_it_even_with_r() {
        let mut r = req(&["f", "d"], true);
        r.admit("f", false).unwrap();
        assert_eq!(why(r.admit("f/x", false)), Why::OutsideTheTree);
        r.admit("d", true).unwrap();
        r.admit("d/x", false).unwrap();
        // f's turn is over.
        assert_eq!(why(r.admit("f", false)), Why::Twice);
    }

    #[test]
    fn names_only_the_server_knows() {
        for typed in [".", "", "~", "~alice", "..", "/", "a/.."] {
            let mut r = req(&[typed], true);
            r.admit("home", true)
                .unwrap_or_else(|e| panic!("{typed:?}: {e}"));
            r.admit("home/x", false).unwrap();
        }
        for (typed, name) in [
            ("~/notes.txt", "notes.txt"),
            ("dir/", "dir"),
            ("dir/.", "dir"),
            ("/var/log/app.log", "app.log"),
        ] {
            let mut r = req(&[typed], false);
            assert_eq!(why(r.admit("other", false)), Why::NotASource, "{typed}");
            r.admit(name, false).unwrap();
        }
    }

    #[test]
    fn the_message_names_the_entry() {
        let mut r = req(&["report.txt"], false);
        let e = r.admit(".bashrc", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the server sent \".bashrc\", which was not asked for (it is none of the requested sources)"
        );
    }
}
