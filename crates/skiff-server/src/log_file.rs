//! The file `skiffd -E FILE` logs to instead of stderr, as sshd's `-E`:
//! appended to, created with mode 0600 (a log names accounts, addresses
//! and keys), and only ever a regular file. A symlink in its place is
//! followed only when it belongs to skiffd's own user or to root, one link
//! at a time, so a link someone else planted (in `/tmp`, say) cannot make
//! a root skiffd append to a file of their choosing.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Links followed at most, as the kernel's own limit is about.
const MAX_LINKS: usize = 8;

/// Why the log file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogFileError {
    #[error("cannot open log file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("log file {path} is a symlink owned by uid {owner}: not followed (only links of skiffd's user or root are)")]
    ForeignSymlink { path: PathBuf, owner: u32 },
    #[error("log file {path} changed while it was opened")]
    Changed { path: PathBuf },
    #[error("log file {path}: more than {MAX_LINKS} symlinks")]
    TooManyLinks { path: PathBuf },
    #[error("log file {path} is not a regular file")]
    NotRegular { path: PathBuf },
}

/// Opens `path` for appending (see the module's rules).
pub fn open_append(path: &Path) -> Result<File, LogFileError> {
    let me = nix::unistd::Uid::effective().as_raw();
    let open_error = |path: &Path, source| LogFileError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut current = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let opened = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            // A FIFO must not hold skiffd up, nor a symlink be followed unseen.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&current);
        match opened {
            Ok(file) => {
                let meta = file.metadata().map_err(|e| open_error(&current, e))?;
                if !meta.file_type().is_file() {
                    return Err(LogFileError::NotRegular { path: current });
                }
                return Ok(file);
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                let link =
                    std::fs::symlink_metadata(&current).map_err(|e| open_error(&current, e))?;
                if link.uid() != me && link.uid() != 0 {
                    return Err(LogFileError::ForeignSymlink {
                        path: current,
                        owner: link.uid(),
                    });
                }
                let target = std::fs::read_link(&current).map_err(|e| open_error(&current, e))?;
                // A link's text never changes; the same link still being
                // there means the text read is that of the link checked.
                let again =
                    std::fs::symlink_metadata(&current).map_err(|e| open_error(&current, e))?;
                if (again.dev(), again.ino()) != (link.dev(), link.ino()) {
                    return Err(LogFileError::Changed { path: current });
                }
                current = match current.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Err(e) => return Err(open_error(&current, e)),
        }
    }
    Err(LogFileError::TooManyLinks {
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    #[test]
    fn created_0600_and_appended_to() {
        let dir = tempdir();
        let path = dir.path().join("skiffd.log");
        writeln!(open_append(&path).unwrap(), "one").unwrap();
        writeln!(open_append(&path).unwrap(), "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn own_symlinks_are_followed_foreign_ones_are_not() {
        let dir = tempdir();
        let target = dir.path().join("real.log");
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink("real.log", &link).unwrap();
        writeln!(open_append(&link).unwrap(), "via link").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "via link\n");
        if nix::unistd::Uid::effective().is_root() {
            // A link that belongs to someone else (nobody).
            std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
            let e = open_append(&link).unwrap_err();
            assert!(
                matches!(e, LogFileError::ForeignSymlink { owner: 65534, .. }),
                "{e}"
            );
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "via link\n");
        }
        let looping = dir.path().join("loop.log");
        std::os::unix::fs::symlink("loop.log", &looping).unwrap();
        let e = open_append(&looping).unwrap_err();
        assert!(matches!(e, LogFileError::TooManyLinks { .. }), "{e}");
    }

    #[test]
    fn only_a_regular_file() {
        let dir = tempdir();
        let e = open_append(dir.path()).unwrap_err();
        assert!(
            matches!(
                e,
                LogFileError::Open { .. } | LogFileError::NotRegular { .. }
            ),
            "{e}"
        );
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // No reader: refused at once instead of waiting for one.
        assert!(open_append(&fifo).is_err());
    }
}
