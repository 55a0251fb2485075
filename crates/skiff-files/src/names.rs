//! Checking names and relative paths that come from a peer (a directory
//! listing, a path in a transfer header) before they are joined to a local
//! destination: nothing a peer sends may reach outside that destination.

use std::path::{Component, Path, PathBuf};

use crate::error::FileError;

/// Rejects a relative path received from a peer that would escape the
/// destination: absolute, with a `..` component, empty (or only `.`), or
/// containing NUL. `.` components and repeated slashes are dropped.
pub fn safe_relative(rel: &str) -> Result<PathBuf, FileError> {
    let refuse = |why: &str| Err(FileError::new(rel, format!("unsafe path from peer: {why}")));
    if rel.is_empty() {
        return refuse("empty");
    }
    if rel.contains('\0') {
        return refuse("contains NUL");
    }
    if rel.starts_with('/') {
        return refuse("absolute");
    }
    let mut out = PathBuf::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return refuse("contains `..`"),
            Component::RootDir | Component::Prefix(_) => return refuse("absolute"),
        }
    }
    if out.as_os_str().is_empty() {
        return refuse("names no file");
    }
    Ok(out)
}

/// Checks one name of a directory listing received from a peer: a single
/// component, not `.` or `..`, no `/` and no NUL.
pub fn safe_name(name: &str) -> Result<&str, FileError> {
    let bad =
        name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0');
    if bad {
        return Err(FileError::new(
            name,
            "unsafe file name from peer (not a single path component)",
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(safe_relative("a").unwrap(), PathBuf::from("a"));
        assert_eq!(safe_relative("a/b/c").unwrap(), PathBuf::from("a/b/c"));
        assert_eq!(safe_relative("./a//b/.").unwrap(), PathBuf::from("a/b"));
        assert_eq!(
            safe_relative("a..b/..c").unwrap(),
            PathBuf::from("a..b/..c")
        );
        assert_eq!(safe_relative(".hidden").unwrap(), PathBuf::from(".hidden"));
    }

    #[test]
    fn rejects_escapes() {
        for bad in [
            "",
            ".",
            "./",
            "/etc/passwd",
            "//x",
            "..",
            "../x",
            "a/../b",
            "a/..",
            "a\0b",
            "a/./../..",
        ] {
            let e = safe_relative(bad).expect_err(bad);
            assert!(e.message.starts_with("unsafe path"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn single_names() {
        assert_eq!(safe_name("file.txt").unwrap(), "file.txt");
        assert_eq!(safe_name("...").unwrap(), "...");
        for bad in ["", ".", "..", "a/b", "/", "a\0"] {
            assert!(safe_name(bad).is_err(), "{bad:?}");
        }
    }
}
