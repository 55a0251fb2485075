//! Where sources land, with scp's rule: several sources need the target to
//! be an existing directory and go into it; a single source goes into the
//! target when it is an existing directory, and otherwise becomes the target
//! (a directory copied with `-r` to a new name is created under that name,
//! as `scp -r dir host:new` and `cp -r dir new` do).

use std::io;
use std::path::{Path, PathBuf};

use crate::error::FileError;

/// Where the entries of the sources go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Into this existing directory: `rel` is joined to it.
    IntoDir(PathBuf),
    /// The single source becomes this path (a file, or a directory root).
    AsName(PathBuf),
}

impl Placement {
    /// The destination of an entry whose walk path is `rel` (which starts
    /// with the source's own name).
    pub fn path_for(&self, rel: &Path) -> PathBuf {
        match self {
            Placement::IntoDir(dir) => dir.join(rel),
            Placement::AsName(name) => {
                let mut components = rel.components();
                components.next();
                let rest = components.as_path();
                if rest.as_os_str().is_empty() {
                    name.clone()
                } else {
                    name.join(rest)
                }
            }
        }
    }

    /// The directory or name this placement starts from.
    pub fn base(&self) -> &Path {
        match self {
            Placement::IntoDir(p) | Placement::AsName(p) => p,
        }
    }
}

/// scp's rule, given what is known about `target`: `Some(true)` when it is an
/// existing directory, `Some(false)` when it exists as something else, `None`
/// when it does not exist. Used for local targets by [`resolve_target`] and
/// for remote ones by callers that `stat` over the wire.
pub fn place(
    target: &Path,
    target_is_dir: Option<bool>,
    source_count: usize,
) -> Result<Placement, FileError> {
    if source_count == 0 {
        return Err(FileError::new(target, "nothing to copy (no source)"));
    }
    match target_is_dir {
        Some(true) => Ok(Placement::IntoDir(target.to_path_buf())),
        Some(false) if source_count > 1 => Err(FileError::io(
            target,
            &io::Error::from_raw_os_error(libc::ENOTDIR),
        )),
        None if source_count > 1 => Err(FileError::new(
            target,
            "No such directory (several sources need an existing target directory)",
        )),
        _ if ends_with_slash(target) => Err(FileError::new(
            target,
            if target_is_dir.is_some() {
                "Not a directory"
            } else {
                "No such directory"
            },
        )),
        _ => Ok(Placement::AsName(target.to_path_buf())),
    }
}

/// Where `source_count` sources land for the local `target` (see [`place`]).
/// Symlinks to directories count as directories.
pub fn resolve_target(target: &Path, source_count: usize) -> Result<Placement, FileError> {
    let target_is_dir = match std::fs::metadata(target) {
        Ok(meta) => Some(meta.is_dir()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(FileError::io(target, &e)),
    };
    place(target, target_is_dir, source_count)
}

/// `dir/` (or `dir/.`) asks for a directory even when the path does not say so otherwise.
fn ends_with_slash(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    bytes.ends_with(b"/") || bytes.ends_with(b"/.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_for_into_dir_and_as_name() {
        let into = Placement::IntoDir("/dst".into());
        assert_eq!(into.path_for(Path::new("a")), PathBuf::from("/dst/a"));
        assert_eq!(
            into.path_for(Path::new("a/x/y")),
            PathBuf::from("/dst/a/x/y")
        );
        let named = Placement::AsName("/dst/new".into());
        assert_eq!(named.path_for(Path::new("a")), PathBuf::from("/dst/new"));
        assert_eq!(
            named.path_for(Path::new("a/x/y")),
            PathBuf::from("/dst/new/x/y")
        );
    }

    #[test]
    fn scp_rules_on_real_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let missing = tmp.path().join("missing");

        // An existing directory takes any number of sources.
        assert_eq!(
            resolve_target(&dir, 1).unwrap(),
            Placement::IntoDir(dir.clone())
        );
        assert_eq!(
            resolve_target(&dir, 3).unwrap(),
            Placement::IntoDir(dir.clone())
        );
        // A single source replaces a file or takes a new name.
        assert_eq!(
            resolve_target(&file, 1).unwrap(),
            Placement::AsName(file.clone())
        );
        assert_eq!(
            resolve_target(&missing, 1).unwrap(),
            Placement::AsName(missing.clone())
        );
        // Several sources need a directory.
        let e = resolve_target(&file, 2).unwrap_err();
        assert!(e.to_string().contains("Not a directory"), "{e}");
        let e = resolve_target(&missing, 2).unwrap_err();
        assert!(e.to_string().contains("No such directory"), "{e}");
        // `missing/` asks for a directory that is not there.
        let slash = PathBuf::from(format!("{}/", missing.display()));
        assert!(resolve_target(&slash, 1).is_err());
        let dir_slash = PathBuf::from(format!("{}/", dir.display()));
        assert_eq!(
            resolve_target(&dir_slash, 1).unwrap(),
            Placement::IntoDir(dir_slash.clone())
        );
        // No source at all.
        assert!(resolve_target(&dir, 0).is_err());
    }

    #[test]
    fn symlink_to_directory_is_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(
            resolve_target(&link, 2).unwrap(),
            Placement::IntoDir(link.clone())
        );
    }
}
