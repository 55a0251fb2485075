//! Receiving files: the control side announces each file (and opens its
//! temporary), the stream threads write chunks at their offsets, and the
//! thread that writes a file's last byte commits it (fsync, mode, times,
//! rename). A chunk may arrive on its stream before its announcement on the
//! control channel: the stream thread then waits for it.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use skiff_files::{AtomicFile, FileError, Times};

use crate::stream::{Record, RecordReader, StreamError};

/// A file being received.
pub struct Incoming {
    pub id: u32,
    pub size: u64,
    pub mode: u32,
    pub times: Option<Times>,
    /// What to call the file in messages (the path as the user sees it).
    pub display: String,
    file: Mutex<Option<AtomicFile>>,
    received: AtomicU64,
}

impl Incoming {
    pub fn new(
        id: u32,
        file: AtomicFile,
        size: u64,
        mode: u32,
        times: Option<Times>,
        display: String,
    ) -> Incoming {
        Incoming {
            id,
            size,
            mode,
            times,
            display,
            file: Mutex::new(Some(file)),
            received: AtomicU64::new(0),
        }
    }

    fn write(&self, offset: u64, bytes: &[u8]) -> Result<bool, String> {
        offset
            .checked_add(bytes.len() as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| format!("{}: the sender wrote past the announced size", self.display))?;
        {
            let guard = self.file.lock().expect("file lock");
            let Some(f) = guard.as_ref() else {
                return Ok(false); // abandoned: discard
            };
            f.file()
                .write_all_at(bytes, offset)
                .map_err(|e| FileError::io(f.temp_path(), &e).to_string())?;
        }
        let before = self
            .received
            .fetch_add(bytes.len() as u64, Ordering::AcqRel);
        Ok(before + bytes.len() as u64 == self.size)
    }

    /// Commits the file under its final name.
    fn commit(&self) -> Result<(), FileError> {
        let taken = self.file.lock().expect("file lock").take();
        match taken {
            Some(f) => f.commit(self.mode, self.times),
            None => Ok(()),
        }
    }

    /// Drops the temporary file (an abandoned transfer leaves nothing).
    fn abandon(&self) {
        self.file.lock().expect("file lock").take();
    }
}

/// A file's fate, as reported to the control side.
#[derive(Debug)]
pub enum Settled {
    Stored(u32),
    Failed(u32, String),
}

enum Slot {
    Open(Arc<Incoming>),
    /// Failed or abandoned: its chunks are discarded.
    Dropped,
}

#[derive(Default)]
struct Table {
    slots: HashMap<u32, Slot>,
    /// Files announced and not yet settled.
    pending: usize,
    aborted: bool,
}

/// The files of one transfer, by id.
pub struct FileTable {
    table: Mutex<Table>,
    changed: Condvar,
    settled: Box<dyn Fn(Settled) + Send + Sync>,
    /// Why the transfer was aborted by a stream, when it was.
    reason: Mutex<Option<String>>,
}

impl FileTable {
    /// `settled` is called once per announced file, from whichever thread
    /// settles it.
    pub fn new(settled: impl Fn(Settled) + Send + Sync + 'static) -> Arc<FileTable> {
        Arc::new(FileTable {
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            settled: Box::new(settled),
            reason: Mutex::new(None),
        })
    }

    /// Announces a file. An empty file is committed at once.
    pub fn open(&self, file: Incoming) {
        let id = file.id;
        if file.size == 0 {
            let result = file.commit();
            self.insert(id, Slot::Dropped, false);
            self.report(id, result.map_err(|e| e.to_string()));
            return;
        }
        self.insert(id, Slot::Open(Arc::new(file)), true);
    }

    /// Announces a file that could not be created: its chunks are discarded.
    pub fn refuse(&self, id: u32) {
        self.insert(id, Slot::Dropped, false);
    }

    fn insert(&self, id: u32, slot: Slot, pending: bool) {
        let mut t = self.table.lock().expect("table lock");
        t.slots.insert(id, slot);
        if pending {
            t.pending += 1;
        }
        self.changed.notify_all();
    }

    /// The peer says file `id` failed on its side: drop what we have.
    pub fn abandon(&self, id: u32) -> bool {
        let mut t = self.table.lock().expect("table lock");
        match t.slots.insert(id, Slot::Dropped) {
            Some(Slot::Open(f)) => {
                f.abandon();
                t.pending -= 1;
                self.changed.notify_all();
                true
            }
            _ => false,
        }
    }

    fn report(&self, id: u32, result: Result<(), String>) {
        (self.settled)(match result {
            Ok(()) => Settled::Stored(id),
            Err(e) => Settled::Failed(id, e),
        });
    }

    /// Waits until file `id` is announced; `None` when its chunks are to be
    /// discarded or the transfer was aborted.
    fn wait_for(&self, id: u32) -> Option<Arc<Incoming>> {
        let mut t = self.table.lock().expect("table lock");
        loop {
            if t.aborted {
                return None;
            }
            match t.slots.get(&id) {
                Some(Slot::Open(f)) => return Some(f.clone()),
                Some(Slot::Dropped) => return None,
                None => t = self.changed.wait(t).expect("table lock"),
            }
        }
    }

    fn finish(&self, file: &Incoming, result: Result<(), String>) {
        {
            let mut t = self.table.lock().expect("table lock");
            if !matches!(t.slots.insert(file.id, Slot::Dropped), Some(Slot::Open(_))) {
                return; // abandoned meanwhile
            }
            t.pending -= 1;
            self.changed.notify_all();
        }
        self.report(file.id, result);
    }

    /// Ends the transfer: every file not yet complete is dropped (its
    /// temporary removed) and waiting threads return.
    pub fn abort(&self) {
        let mut t = self.table.lock().expect("table lock");
        t.aborted = true;
        for slot in t.slots.values() {
            if let Slot::Open(f) = slot {
                f.abandon();
            }
        }
        t.slots.clear();
        t.pending = 0;
        self.changed.notify_all();
    }

    /// The stream failure that aborted the transfer, if one did.
    pub fn abort_reason(&self) -> Option<String> {
        self.reason.lock().expect("reason lock").clone()
    }

    /// Waits until every announced file is settled (or the transfer aborted).
    /// Returns false when aborted.
    pub fn wait_settled(&self) -> bool {
        let mut t = self.table.lock().expect("table lock");
        while t.pending > 0 && !t.aborted {
            t = self.changed.wait(t).expect("table lock");
        }
        !t.aborted
    }

    /// One stream's receiver: writes chunks until the end-of-stream record.
    /// `received(bytes)` reports progress. A stream error (a bad tag, a
    /// truncated stream) aborts the whole transfer and is returned.
    pub fn run_receiver(
        &self,
        mut reader: RecordReader,
        received: &(dyn Fn(u64) + Sync),
    ) -> Result<(), StreamError> {
        let stream = reader.stream();
        let result = loop {
            let (chunk, bytes) = match reader.next_record() {
                Ok(Record::Data(c, b)) => (c, b),
                Ok(Record::End) => break Ok(()),
                Ok(Record::Ack) => {
                    break Err(StreamError::Protocol {
                        stream,
                        what: "unexpected acknowledgement record".into(),
                    })
                }
                Err(e) => break Err(e),
            };
            let Some(file) = self.wait_for(chunk.file) else {
                if self.table.lock().expect("table lock").aborted {
                    break Err(StreamError::aborted(stream));
                }
                continue;
            };
            match file.write(chunk.offset, bytes) {
                Ok(false) => received(bytes.len() as u64),
                Ok(true) => {
                    received(bytes.len() as u64);
                    let result = file.commit().map_err(|e| e.to_string());
                    self.finish(&file, result);
                }
                Err(e) => {
                    file.abandon();
                    self.finish(&file, Err(e));
                }
            }
        };
        if let Err(e) = &result {
            self.reason
                .lock()
                .expect("reason lock")
                .get_or_insert_with(|| e.to_string());
            self.abort();
        }
        result
    }
}

/// A directory whose mode and times (`-p`) are applied once its contents
/// are in.
pub type PendingDir = (std::path::PathBuf, u32, Option<Times>);

/// What became of an announced entry on the receiving side.
#[derive(Debug)]
pub enum Prepared {
    /// A file now expected on the streams: its size and its path as shown.
    File(u64, String),
    /// A directory, created.
    Dir,
    /// The entry cannot be received (a bad name, a directory or file that
    /// cannot be created); its chunks are discarded.
    Failed(String),
}

/// Prepares the local side of an announced entry: checks the peer's
/// relative path, then creates the directory (remembered in `dirs` for `-p`)
/// or opens the file's temporary in `table`. Without `-p` modes follow the
/// umask, as a new file's would.
pub fn prepare_entry(
    table: &FileTable,
    placement: &skiff_files::Placement,
    e: &skiff_proto::dataplane::EntryWire,
    preserve: bool,
    dirs: &mut Vec<PendingDir>,
) -> Prepared {
    let rel = match skiff_files::safe_relative(&e.rel) {
        Ok(r) => r,
        Err(err) => {
            table.refuse(e.id);
            return Prepared::Failed(err.to_string());
        }
    };
    let path = placement.path_for(&rel);
    let times = preserve.then_some(Times {
        atime: e.atime,
        atime_nsec: e.atime_nsec,
        mtime: e.mtime,
        mtime_nsec: e.mtime_nsec,
    });
    let mode = if preserve {
        e.mode & 0o7777
    } else {
        skiff_files::apply_umask(e.mode & 0o777)
    };
    if e.is_dir {
        return match skiff_files::make_dir(&path, mode) {
            Ok(()) => {
                if preserve {
                    dirs.push((path, mode, times));
                }
                Prepared::Dir
            }
            Err(err) => Prepared::Failed(err.to_string()),
        };
    }
    match AtomicFile::create(&path) {
        Ok(f) => {
            let display = path.display().to_string();
            table.open(Incoming::new(e.id, f, e.size, mode, times, display.clone()));
            Prepared::File(e.size, display)
        }
        Err(err) => {
            table.refuse(e.id);
            Prepared::Failed(err.to_string())
        }
    }
}

/// Applies the remembered directories' modes and times, deepest first.
/// Returns one message per directory that failed.
pub fn finish_dirs(dirs: &[PendingDir]) -> Vec<String> {
    dirs.iter()
        .rev()
        .filter_map(|(path, mode, times)| skiff_files::finish_dir(path, *mode, *times).err())
        .map(|e| e.to_string())
        .collect()
}
