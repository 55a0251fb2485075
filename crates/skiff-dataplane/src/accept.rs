//! Accepting entries: the receiving side's control half, whichever end
//! receives (the client downloading, the transfer process taking an
//! upload). Each announced entry is checked before anything is made for it:
//! an id announced twice ends the transfer, and so does (on a download) an
//! entry the request did not name ([`Requested`]); a name that would leave
//! the target, or a file or directory that cannot be made here, fails alone.
//! A file that passes gets its temporary in the [`FileTable`], which the
//! stream threads fill ([`crate::receive`]); a directory is created now and,
//! with `-p`, given its mode and times once everything is in
//! ([`Accepting::finish`]). Modes follow the [`ReceivePolicy`] of the side.

use std::path::PathBuf;

use skiff_files::{AtomicFile, MadeDir, Placement, ReceivePolicy, Requested, Times, Unrequested};
use skiff_proto::dataplane::EntryWire;

use crate::receive::{AnnouncedTwice, FileTable, Incoming};

/// What became of an announced entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A file now expected on the streams: its size and its path as shown.
    File(u64, String),
    /// A directory, created (or there already).
    Dir,
    /// The entry cannot be received (a bad name, a directory or file that
    /// cannot be created); its chunks are discarded. The message says why.
    Failed(String),
}

/// An announcement that ends the transfer: the peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misbehaved {
    #[error(transparent)]
    AnnouncedTwice(#[from] AnnouncedTwice),
    #[error(transparent)]
    Unrequested(#[from] Unrequested),
}

/// A directory whose mode and times (`-p`) are applied once its contents
/// are in.
struct PendingDir {
    path: PathBuf,
    mode: u32,
    times: Option<Times>,
}

/// The receiving side of one transfer's announcements.
pub struct Accepting<'a> {
    table: &'a FileTable,
    placement: &'a Placement,
    preserve: bool,
    policy: ReceivePolicy,
    /// A download's request: only what it names is admitted.
    requested: Option<Requested>,
    dirs: Vec<PendingDir>,
}

impl<'a> Accepting<'a> {
    /// skiffd's end of an upload: the account's own client names the entries.
    pub fn upload(table: &'a FileTable, placement: &'a Placement, preserve: bool) -> Self {
        Accepting {
            table,
            placement,
            preserve,
            policy: ReceivePolicy::Upload,
            requested: None,
            dirs: Vec::new(),
        }
    }

    /// The client's end of a download: a server we do not trust, admitted
    /// only for what `requested` names.
    pub fn download(
        table: &'a FileTable,
        placement: &'a Placement,
        preserve: bool,
        requested: Requested,
    ) -> Self {
        Accepting {
            table,
            placement,
            preserve,
            policy: ReceivePolicy::Download,
            requested: Some(requested),
            dirs: Vec::new(),
        }
    }

    /// Takes one announced entry.
    pub fn entry(&mut self, e: &EntryWire) -> Result<Accepted, Misbehaved> {
        if self.table.knows(e.id) {
            return Err(AnnouncedTwice(e.id).into());
        }
        let rel = match &mut self.requested {
            Some(requested) => requested.admit(&e.rel, e.is_dir)?,
            None => match skiff_files::safe_relative(&e.rel) {
                Ok(r) => r,
                Err(err) => {
                    self.table.refuse(e.id)?;
                    return Ok(Accepted::Failed(err.to_string()));
                }
            },
        };
        let path = self.placement.path_for(&rel);
        let times = self.preserve.then_some(Times {
            atime: e.atime,
            atime_nsec: e.atime_nsec,
            mtime: e.mtime,
            mtime_nsec: e.mtime_nsec,
        });
        if e.is_dir {
            self.table.refuse(e.id)?;
            let mode = self.policy.dir_mode(e.mode, self.preserve);
            return Ok(match skiff_files::make_dir(&path, mode) {
                Ok(made) => {
                    if self.preserve
                        && (made == MadeDir::Created || self.policy.finishes_existing_dirs())
                    {
                        self.dirs.push(PendingDir { path, mode, times });
                    }
                    Accepted::Dir
                }
                Err(err) => Accepted::Failed(err.to_string()),
            });
        }
        match AtomicFile::create(&path) {
            Ok(f) => {
                let mode = self
                    .policy
                    .file_mode(e.mode, self.preserve, f.replaced_mode());
                let display = path.display().to_string();
                let incoming = Incoming::new(e.id, f, e.size, mode, times, display.clone());
                self.table.open(incoming)?;
                Ok(Accepted::File(e.size, display))
            }
            Err(err) => {
                self.table.refuse(e.id)?;
                Ok(Accepted::Failed(err.to_string()))
            }
        }
    }

    /// Once everything is in: applies the remembered directories' modes and
    /// times (`-p`), deepest first. One message per directory that failed.
    pub fn finish(self) -> Vec<String> {
        self.dirs
            .iter()
            .rev()
            .filter_map(|d| skiff_files::finish_dir(&d.path, d.mode, d.times).err())
            .map(|e| e.to_string())
            .collect()
    }
}
