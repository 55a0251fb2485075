//! Writing copied files and directories: a file is written under a
//! temporary name in its final directory and renamed over the final name
//! only once it is complete and on disk, so an interrupted copy never leaves
//! a truncated file where the real one belongs. Also directory creation,
//! modes, times and the process umask.

use std::ffi::{CString, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::FileError;

/// What every temporary name contains: `.<name>.skiff-<random>`.
pub const TEMP_MARKER: &str = ".skiff-";

/// Longest part of the final name kept in a temporary name (names are
/// limited to 255 bytes on most file systems).
const MAX_NAME_IN_TEMP: usize = 200;

/// Access and modification times (seconds and nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    pub atime: i64,
    pub atime_nsec: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
}

impl Times {
    fn timespecs(&self) -> [libc::timespec; 2] {
        let ts = |sec: i64, nsec: u32| libc::timespec {
            tv_sec: sec as libc::time_t,
            tv_nsec: nsec.min(999_999_999) as _,
        };
        [
            ts(self.atime, self.atime_nsec),
            ts(self.mtime, self.mtime_nsec),
        ]
    }
}

/// A file being written: data goes to a temporary file in the final
/// directory (`.<name>.skiff-<random>`, mode 0600 while written); `commit`
/// fsyncs it, sets mode (and, when given, atime/mtime), renames it over the
/// final name and fsyncs the directory. Dropped without commit, the
/// temporary is removed: an interrupted copy never leaves a truncated file
/// under the final name.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    temp: PathBuf,
    final_path: PathBuf,
    /// The regular file found under the final name when the temporary was
    /// made, which the commit replaces.
    replaced: Option<Replaced>,
    done: bool,
}

/// What is kept of a file a copy replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replaced {
    mode: u32,
    uid: u32,
    gid: u32,
}

impl Replaced {
    /// The regular file at `path`, if there is one (a symlink there is
    /// replaced itself, not followed).
    fn at(path: &Path) -> Option<Replaced> {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::symlink_metadata(path).ok()?;
        meta.file_type().is_file().then(|| Replaced {
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        })
    }
}

/// A temporary name beside `final_path`.
fn temp_name(final_path: &Path) -> Result<PathBuf, FileError> {
    let name = final_path
        .file_name()
        .ok_or_else(|| FileError::new(final_path, "not a file name"))?;
    let mut random = [0u8; 6];
    rand::fill(&mut random);
    let bytes = name.as_bytes();
    let kept = &bytes[..bytes.len().min(MAX_NAME_IN_TEMP)];
    let mut temp = Vec::with_capacity(kept.len() + 24);
    temp.push(b'.');
    temp.extend_from_slice(kept);
    temp.extend_from_slice(TEMP_MARKER.as_bytes());
    for b in random {
        temp.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    Ok(final_path.with_file_name(OsString::from_vec(temp)))
}

impl AtomicFile {
    /// Creates the temporary file for `final_path` (which is not touched
    /// until [`AtomicFile::commit`]).
    pub fn create(final_path: &Path) -> Result<AtomicFile, FileError> {
        let mut attempts = 0;
        loop {
            let temp = temp_name(final_path)?;
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&temp);
            match opened {
                Ok(file) => {
                    return Ok(AtomicFile {
                        file,
                        temp,
                        final_path: final_path.to_path_buf(),
                        replaced: Replaced::at(final_path),
                        done: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => {
                    attempts += 1;
                }
                // The error names the final path: that is what the person asked for.
                Err(e) => return Err(FileError::io(final_path, &e)),
            }
        }
    }

    /// The open temporary file, for `write_at` / `write_all`.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the data goes until commit.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// The name the file gets on commit.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// The permission bits (set-id and sticky included) of the regular file
    /// this one replaces, if the final name held one when it was created.
    pub fn replaced_mode(&self) -> Option<u32> {
        self.replaced.map(|r| r.mode)
    }

    /// Sets the temporary file's length (truncating or extending with zeros).
    pub fn set_len(&self, len: u64) -> Result<(), FileError> {
        self.file
            .set_len(len)
            .map_err(|e| FileError::io(&self.final_path, &e))
    }

    /// Makes the file durable and visible under its final name, with exactly
    /// `mode` (permission bits; no umask is applied here, see [`apply_umask`])
    /// and, when given, the access and modification times. A file it
    /// replaces keeps its owner and group where this process may give them
    /// (as root), as a copy written into it would.
    pub fn commit(mut self, mode: u32, times: Option<Times>) -> Result<(), FileError> {
        let fail = |e: io::Error| FileError::io(&self.final_path, &e);
        if let Some(old) = self.replaced {
            // SAFETY: geteuid cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            if root {
                // Before the mode: a change of owner clears set-id bits.
                std::os::unix::fs::fchown(&self.file, Some(old.uid), Some(old.gid))
                    .map_err(fail)?;
            }
        }
        self.file
            .set_permissions(fs::Permissions::from_mode(mode & 0o7777))
            .map_err(fail)?;
        if let Some(times) = times {
            let ts = times.timespecs();
            // SAFETY: futimens on our open descriptor with two valid timespecs.
            let rc = unsafe { libc::futimens(self.file.as_raw_fd(), ts.as_ptr()) };
            if rc != 0 {
                return Err(fail(io::Error::last_os_error()));
            }
        }
        self.file.sync_all().map_err(fail)?;
        fs::rename(&self.temp, &self.final_path).map_err(fail)?;
        self.done = true;
        sync_dir(parent_of(&self.final_path)).map_err(fail)?;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// The directory holding `path` (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// fsync of a directory, so that a rename in it survives a crash.
fn sync_dir(dir: &Path) -> io::Result<()> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    match d.sync_all() {
        // Some file systems cannot sync a directory; the data is synced anyway.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// Whether [`make_dir`] made the directory or found it in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadeDir {
    Created,
    Existed,
}

/// Creates a directory for a copied tree (ok if it exists as a directory).
/// It is created with `mode` plus owner rwx, so its contents can be written
/// whatever the source's mode; with `preserve`, the exact mode and times are
/// applied by [`finish_dir`] after its contents are written.
pub fn make_dir(path: &Path, mode: u32) -> Result<MadeDir, FileError> {
    match fs::DirBuilder::new()
        .mode((mode & 0o777) | 0o700)
        .create(path)
    {
        Ok(()) => Ok(MadeDir::Created),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(MadeDir::Existed),
            Ok(_) => Err(FileError::new(
                path,
                "exists and is not a directory (os error 17)",
            )),
            Err(e) => Err(FileError::io(path, &e)),
        },
        Err(e) => Err(FileError::io(path, &e)),
    }
}

/// Sets a copied directory's mode (exactly, no umask) and, when given, its times.
pub fn finish_dir(path: &Path, mode: u32, times: Option<Times>) -> Result<(), FileError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| FileError::io(path, &e))?;
    if let Some(times) = times {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| FileError::new(path, "path contains NUL"))?;
        let ts = times.timespecs();
        // SAFETY: utimensat with a NUL-terminated path and two valid timespecs.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
        if rc != 0 {
            return Err(FileError::io(path, &io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The process umask, read without changing it (from /proc where it can,
/// since setting it, even briefly, races with other threads creating files).
pub fn umask() -> u32 {
    static UMASK: OnceLock<u32> = OnceLock::new();
    *UMASK.get_or_init(|| {
        let from_proc = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        });
        from_proc.unwrap_or_else(|| {
            // SAFETY: umask(2) cannot fail; the old value is restored at once.
            unsafe {
                let old = libc::umask(0o022);
                libc::umask(old);
                old as u32
            }
        })
    })
}

/// The mode a new file gets without `-p`, as with scp and sftp: the source's
/// permission bits (no set-id or sticky bits) less the umask.
pub fn apply_umask(mode: u32) -> u32 {
    mode & 0o777 & !umask()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_the_final_file_with_mode_and_times() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("out.bin");
        fs::write(&dst, b"old contents that are longer").unwrap();
        let f = AtomicFile::create(&dst).unwrap();
        let temp = f.temp_path().to_path_buf();
        let temp_name = temp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(temp_name.starts_with(".out.bin.skiff-"), "{temp_name}");
        assert_eq!(fs::metadata(&temp).unwrap().mode() & 0o7777, 0o600);
        // The final file is untouched while the copy runs.
        f.file().write_at(b"world", 6).unwrap();
        f.file().write_at(b"hello ", 0).unwrap();
        assert_eq!(fs::read(&dst).unwrap(), b"old contents that are longer");
        let times = Times {
            atime: 1_000_000_000,
            atime_nsec: 5,
            mtime: 1_234_567_890,
            mtime_nsec: 123_456_789,
        };
        f.commit(0o640, Some(times)).unwrap();
        // Metadata first: reading the file may update its atime (relatime).
        let meta = fs::metadata(&dst).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o640);
        assert_eq!(meta.mtime(), 1_234_567_890);
        assert_eq!(meta.mtime_nsec(), 123_456_789);
        assert_eq!(meta.atime(), 1_000_000_000);
        assert_eq!(fs::read(&dst).unwrap(), b"hello world");
        assert_eq!(names_in(tmp.path()), ["out.bin"]);
    }

    #[test]
    fn drop_without_commit_removes_the_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("keep");
        fs::write(&dst, b"original").unwrap();
        {
            let f = AtomicFile::create(&dst).unwrap();
            f.file().write_at(b"partial", 0).unwrap();
            f.set_len(1 << 20).unwrap();
            assert_eq!(names_in(tmp.path()).len(), 2);
        }
        assert_eq!(names_in(tmp.path()), ["keep"]);
        assert_eq!(fs::read(&dst).unwrap(), b"original");
        // A new file that is never committed never appears.
        drop(AtomicFile::create(&tmp.path().join("new")).unwrap());
        assert_eq!(names_in(tmp.path()), ["keep"]);
    }

    #[test]
    fn set_len_and_empty_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("sparse");
        let f = AtomicFile::create(&dst).unwrap();
        f.set_len(4096).unwrap();
        f.commit(0o644, None).unwrap();
        assert_eq!(fs::metadata(&dst).unwrap().len(), 4096);
        let empty = tmp.path().join("empty");
        AtomicFile::create(&empty)
            .unwrap()
            .commit(0o600, None)
            .unwrap();
        assert_eq!(fs::metadata(&empty).unwrap().len(), 0);
    }

    #[test]
    fn a_replaced_file_is_remembered_with_its_owner() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("config");
        fs::write(&dst, b"old").unwrap();
        fs::set_permissions(&dst, fs::Permissions::from_mode(0o4640)).unwrap();
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            std::os::unix::fs::chown(&dst, Some(4321), Some(4322)).unwrap();
        }
        let before = fs::metadata(&dst).unwrap();
        let f = AtomicFile::create(&dst).unwrap();
        assert_eq!(f.replaced_mode(), Some(0o4640 & before.mode() & 0o7777));
        f.file().write_at(b"new", 0).unwrap();
        f.commit(0o640, None).unwrap();
        let after = fs::metadata(&dst).unwrap();
        assert_eq!(fs::read(&dst).unwrap(), b"new");
        assert_eq!(after.mode() & 0o7777, 0o640);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        // Nothing there, or a symlink (replaced itself): nothing to keep.
        assert_eq!(
            AtomicFile::create(&tmp.path().join("new"))
                .unwrap()
                .replaced_mode(),
            None
        );
        std::os::unix::fs::symlink(&dst, tmp.path().join("link")).unwrap();
        assert_eq!(
            AtomicFile::create(&tmp.path().join("link"))
                .unwrap()
                .replaced_mode(),
            None
        );
    }

    #[test]
    fn exact_mode_bits_including_setid() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("tool");
        AtomicFile::create(&dst)
            .unwrap()
            .commit(0o2755, None)
            .unwrap();
        assert_eq!(fs::metadata(&dst).unwrap().mode() & 0o7777, 0o2755);
    }

    #[test]
    fn create_fails_in_a_missing_directory_naming_the_final_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("no/such/dir/file");
        let e = AtomicFile::create(&dst).unwrap_err();
        assert_eq!(e.path, dst);
        assert!(e.message.contains("No such file or directory"), "{e}");
    }

    #[test]
    fn long_names_get_a_short_enough_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("n".repeat(250));
        let f = AtomicFile::create(&dst).unwrap();
        f.commit(0o644, None).unwrap();
        assert!(dst.exists());
        assert_eq!(names_in(tmp.path()).len(), 1);
    }

    #[test]
    fn commit_failure_leaves_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        // The final name is an existing directory: rename fails.
        let dst = tmp.path().join("taken");
        fs::create_dir(&dst).unwrap();
        fs::write(dst.join("inside"), b"x").unwrap();
        let f = AtomicFile::create(&dst).unwrap();
        assert!(f.commit(0o644, None).is_err());
        assert_eq!(names_in(tmp.path()), ["taken"]);
    }

    #[test]
    fn directories_are_made_then_finished() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        assert_eq!(make_dir(&d, 0o500).unwrap(), MadeDir::Created);
        // Writable while its contents are copied.
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o700, 0o700);
        fs::write(d.join("f"), b"x").unwrap();
        assert_eq!(make_dir(&d, 0o500).unwrap(), MadeDir::Existed); // exists: fine
        let times = Times {
            atime: 1_500_000_000,
            atime_nsec: 0,
            mtime: 1_400_000_000,
            mtime_nsec: 42,
        };
        finish_dir(&d, 0o1755, Some(times)).unwrap();
        let meta = fs::metadata(&d).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o1755);
        assert_eq!(meta.mtime(), 1_400_000_000);
        assert_eq!(meta.mtime_nsec(), 42);
        // A file in the way is an error.
        let f = tmp.path().join("file");
        fs::write(&f, b"x").unwrap();
        let e = make_dir(&f, 0o755).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn umask_is_read_without_changing_it() {
        let before = umask();
        assert_eq!(before, umask());
        assert_eq!(apply_umask(0o4777), 0o777 & !before);
    }
}
