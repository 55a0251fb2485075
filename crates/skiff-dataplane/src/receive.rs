//! Receiving files: the control side announces each file (and opens its
//! temporary), the stream threads write chunks at their offsets, and the
//! thread that writes a file's last byte commits it (fsync, mode, times,
//! rename). A chunk may arrive on its stream before its announcement on the
//! control channel: the stream thread then waits for it.
//!
//! The peer is checked, not trusted: an id announced twice, a chunk for an
//! id never announced (once the announcements are over), or bytes past a
//! file's announced size end the transfer; a file still short when every
//! stream has ended is reported by [`FileTable::incomplete`].

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

    /// Writes a chunk; true when it was the file's last byte. A chunk past
    /// the announced size is the peer's error ([`WriteError::Overrun`]).
    fn write(&self, offset: u64, bytes: &[u8]) -> Result<bool, WriteError> {
        offset
            .checked_add(bytes.len() as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| {
                WriteError::Overrun(format!(
                    "{}: the sender wrote past the announced size of {} bytes",
                    self.display, self.size
                ))
            })?;
        {
            let guard = self.file.lock().expect("file lock");
            let Some(f) = guard.as_ref() else {
                return Ok(false); // abandoned: discard
            };
            f.file()
                .write_all_at(bytes, offset)
                .map_err(|e| WriteError::Local(FileError::io(f.temp_path(), &e).to_string()))?;
        }
        let before = self
            .received
            .fetch_add(bytes.len() as u64, Ordering::AcqRel);
        let now = before + bytes.len() as u64;
        if now > self.size {
            // Chunks overlapped: more bytes than the file holds.
            return Err(WriteError::Overrun(format!(
                "{}: the sender sent more than the announced {} bytes",
                self.display, self.size
            )));
        }
        Ok(now == self.size)
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

/// Why a chunk could not be written.
enum WriteError {
    /// The local file (that file fails; the transfer goes on).
    Local(String),
    /// The peer sent bytes the file does not have room for (the transfer fails).
    Overrun(String),
}

/// Why bytes carried on the control channel were refused
/// ([`FileTable::write_inline`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InlineError {
    /// The peer's error: the transfer is over.
    #[error("{0}")]
    Peer(String),
    /// The transfer had already been aborted.
    #[error("the transfer was aborted")]
    Aborted,
}

/// A file's fate, as reported to the control side.
#[derive(Debug)]
pub enum Settled {
    Stored(u32),
    Failed(u32, String),
}

/// What a stream thread found for a chunk's file id.
enum Awaited {
    Open(Arc<Incoming>),
    /// Failed, abandoned or complete: the chunk is discarded.
    Discard,
    /// Announcements are over and this id was never among them.
    Unannounced,
    Aborted,
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
    /// Files settled whose outcome is being reported (the `settled`
    /// callback is running): settled for [`FileTable::wait_settled`] only
    /// once it has returned.
    reporting: usize,
    aborted: bool,
    /// Every entry is announced: a chunk for an unknown id is an error.
    closed: bool,
}

/// An entry id the peer announced a second time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncedTwice(pub u32);

impl std::fmt::Display for AnnouncedTwice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the sender announced entry id {} twice", self.0)
    }
}

impl std::error::Error for AnnouncedTwice {}

/// The files of one transfer, by id.
pub struct FileTable {
    table: Mutex<Table>,
    changed: Condvar,
    settled: Box<dyn Fn(Settled) + Send + Sync>,
    /// Why the transfer was aborted by a stream, when it was.
    reason: Mutex<Option<String>>,
    /// Files being flushed and renamed into place right now.
    committing: std::sync::atomic::AtomicUsize,
    /// Files completed on the control channel, waiting for a commit
    /// thread, and the threads ([`FileTable::write_inline`]).
    inline_commits: Mutex<CommitQueue>,
    /// Signalled when the queue shrinks or a commit thread ends.
    inline_changed: Condvar,
}

/// Files completed by bytes on the control channel that may be committed
/// at once, on as many threads.
pub const INLINE_COMMITS: usize = 4;

/// Completed files that may wait for a commit thread before the reader of
/// the channel waits too: what it holds open is bounded.
const INLINE_QUEUE: usize = 2 * INLINE_COMMITS;

/// Files completed on the channel, in the order they completed, and the
/// threads committing them (at most [`INLINE_COMMITS`]), each of which
/// takes files from the front until none is left.
#[derive(Default)]
struct CommitQueue {
    waiting: std::collections::VecDeque<Arc<Incoming>>,
    threads: usize,
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
            committing: Default::default(),
            inline_commits: Default::default(),
            inline_changed: Condvar::new(),
        })
    }

    /// True when `id` was announced already.
    pub fn knows(&self, id: u32) -> bool {
        self.table
            .lock()
            .expect("table lock")
            .slots
            .contains_key(&id)
    }

    /// Announces a file. An empty file is committed at once. An id
    /// announced before is refused (the file's temporary is dropped).
    pub fn open(&self, file: Incoming) -> Result<(), AnnouncedTwice> {
        let id = file.id;
        if self.table.lock().expect("table lock").aborted {
            // The transfer is over: the temporary goes with `file`.
            return Ok(());
        }
        if file.size == 0 {
            self.insert(id, Slot::Dropped, false)?;
            let result = file.commit();
            self.report(id, result.map_err(|e| e.to_string()));
            return Ok(());
        }
        self.insert(id, Slot::Open(Arc::new(file)), true)
    }

    /// Announces an entry whose chunks are to be discarded: a file that
    /// could not be created, or a directory (which has none).
    pub fn refuse(&self, id: u32) -> Result<(), AnnouncedTwice> {
        self.insert(id, Slot::Dropped, false)
    }

    fn insert(&self, id: u32, slot: Slot, pending: bool) -> Result<(), AnnouncedTwice> {
        let mut t = self.table.lock().expect("table lock");
        if t.slots.contains_key(&id) {
            return Err(AnnouncedTwice(id));
        }
        t.slots.insert(id, slot);
        if pending {
            t.pending += 1;
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Every entry has been announced: from now on a chunk for an id that
    /// never was is the peer's error, instead of one to wait for.
    pub fn close_announcements(&self) {
        self.table.lock().expect("table lock").closed = true;
        self.changed.notify_all();
    }

    /// The files announced and not complete, each dropped (its temporary
    /// removed) and described (`path (N of M bytes)`). Called once every
    /// stream has ended: what is missing will not come. A file with all its
    /// bytes is not among them: it is being committed, and
    /// [`Self::wait_settled`] waits for it.
    pub fn incomplete(&self) -> Vec<String> {
        let mut t = self.table.lock().expect("table lock");
        let mut short = Vec::new();
        // A file with all its bytes is being committed (on a thread of its
        // own, for bytes from the control channel): it settles on its own.
        let mut committing = 0;
        for slot in t.slots.values_mut() {
            let Slot::Open(f) = slot else { continue };
            let received = f.received.load(Ordering::Acquire);
            if received == f.size {
                committing += 1;
                continue;
            }
            f.abandon();
            short.push(format!("{} ({received} of {} bytes)", f.display, f.size));
            *slot = Slot::Dropped;
        }
        t.pending = committing;
        self.changed.notify_all();
        short.sort();
        short
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

    /// Waits until file `id` is announced.
    fn wait_for(&self, id: u32) -> Awaited {
        let mut t = self.table.lock().expect("table lock");
        loop {
            if t.aborted {
                return Awaited::Aborted;
            }
            match t.slots.get(&id) {
                Some(Slot::Open(f)) => return Awaited::Open(f.clone()),
                Some(Slot::Dropped) => return Awaited::Discard,
                None if t.closed => return Awaited::Unannounced,
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
            t.reporting += 1;
        }
        self.report(file.id, result);
        let mut t = self.table.lock().expect("table lock");
        t.reporting -= 1;
        self.changed.notify_all();
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

    /// Files announced and not settled yet.
    pub fn pending(&self) -> usize {
        self.table.lock().expect("table lock").pending
    }

    /// True while a file is being flushed to disk and renamed into place:
    /// progress, though no byte moves on the streams.
    pub fn committing(&self) -> bool {
        self.committing.load(Ordering::Relaxed) > 0
    }

    /// The stream failure that aborted the transfer, if one did.
    pub fn abort_reason(&self) -> Option<String> {
        self.reason.lock().expect("reason lock").clone()
    }

    /// Waits until every announced file is settled (or the transfer aborted).
    /// Returns false when aborted.
    pub fn wait_settled(&self) -> bool {
        let mut t = self.table.lock().expect("table lock");
        while (t.pending > 0 || t.reporting > 0) && !t.aborted {
            t = self.changed.wait(t).expect("table lock");
        }
        !t.aborted
    }

    /// Writes bytes of an announced `file` at `offset`: `Ok(true)` when
    /// they were its last, and it is to be committed ([`Self::commit`]). A
    /// local failure fails that file alone (`Ok(false)`); `Err` is the
    /// peer's error (bytes past the file's size), which ends the transfer.
    fn take(
        &self,
        file: &Incoming,
        offset: u64,
        bytes: &[u8],
        received: &(dyn Fn(u64) + Sync),
    ) -> Result<bool, String> {
        match file.write(offset, bytes) {
            Ok(last) => {
                received(bytes.len() as u64);
                Ok(last)
            }
            Err(WriteError::Local(e)) => {
                file.abandon();
                self.finish(file, Err(e));
                Ok(false)
            }
            Err(WriteError::Overrun(what)) => Err(what),
        }
    }

    /// Commits a complete file (fsync, mode, times, rename) and reports it.
    fn commit(&self, file: &Incoming) {
        self.committing.fetch_add(1, Ordering::Relaxed);
        let result = file.commit().map_err(|e| e.to_string());
        {
            // Under the table's lock, so that `wait_commits` cannot miss it.
            let _t = self.table.lock().expect("table lock");
            self.committing.fetch_sub(1, Ordering::Relaxed);
            self.changed.notify_all();
        }
        self.finish(file, result);
    }

    /// [`Self::abort`], then [`Self::wait_commits`]: what to call before
    /// the process exits or the transfer returns after a failure.
    pub fn abort_and_wait(&self) {
        self.abort();
        self.wait_commits();
    }

    /// Waits until no file is being committed, on any thread. An abort
    /// drops every temporary it can reach, but not one whose commit has
    /// begun: that commit ends with the file under its final name, unless
    /// the process exits first, which would leave its temporary behind.
    /// Whoever ends the process or the transfer after an abort calls this
    /// first.
    pub fn wait_commits(&self) {
        let mut q = self.inline_commits.lock().expect("commit queue lock");
        while q.threads > 0 {
            q = self.inline_changed.wait(q).expect("commit queue lock");
        }
        drop(q);
        // A stream receiver commits on its own thread.
        let mut t = self.table.lock().expect("table lock");
        while self.committing.load(Ordering::Relaxed) > 0 {
            t = self.changed.wait(t).expect("table lock");
        }
    }

    /// Bytes of file `id` that came on the control channel (version 2's
    /// `Data`), behind the file's announcement on the same channel: an id
    /// not announced by then is the peer's error, as are bytes past the
    /// file's size. Either ends the transfer (every file not complete is
    /// dropped) and is returned; a local failure fails that file alone.
    ///
    /// A file these bytes complete is committed by one of up to
    /// [`INLINE_COMMITS`] threads, so that the channel is read on while
    /// earlier files are flushed to disk, as the threads of several
    /// streams would; while [`INLINE_QUEUE`] completed files already wait
    /// for one, the caller waits too. [`Self::wait_settled`] waits for
    /// them.
    pub fn write_inline(
        self: &Arc<Self>,
        id: u32,
        offset: u64,
        bytes: &[u8],
        received: &(dyn Fn(u64) + Sync),
    ) -> Result<(), InlineError> {
        let file = {
            let t = self.table.lock().expect("table lock");
            if t.aborted {
                return Err(InlineError::Aborted);
            }
            match t.slots.get(&id) {
                Some(Slot::Open(f)) => f.clone(),
                // Failed or abandoned: its bytes are discarded.
                Some(Slot::Dropped) => return Ok(()),
                None => {
                    drop(t);
                    return Err(self.fail_inline(format!(
                        "data for entry id {id}, which was not announced before it"
                    )));
                }
            }
        };
        let last = self
            .take(&file, offset, bytes, received)
            .map_err(|what| self.fail_inline(what))?;
        if last {
            self.queue_commit(file);
        }
        Ok(())
    }

    /// Hands a complete file to the commit threads, starting one if fewer
    /// than [`INLINE_COMMITS`] run; waits while the queue is full.
    fn queue_commit(self: &Arc<Self>, file: Arc<Incoming>) {
        let mut q = self.inline_commits.lock().expect("commit queue lock");
        while q.waiting.len() >= INLINE_QUEUE {
            q = self.inline_changed.wait(q).expect("commit queue lock");
        }
        q.waiting.push_back(file);
        if q.threads < INLINE_COMMITS {
            q.threads += 1;
            let table = self.clone();
            std::thread::spawn(move || table.commit_queued());
        }
    }

    /// A commit thread: commits queued files until none is left.
    fn commit_queued(&self) {
        loop {
            let next = {
                let mut q = self.inline_commits.lock().expect("commit queue lock");
                let next = q.waiting.pop_front();
                if next.is_none() {
                    q.threads -= 1;
                }
                self.inline_changed.notify_all();
                next
            };
            match next {
                Some(file) => self.commit(&file),
                None => return,
            }
        }
    }

    /// Ends the transfer for a peer's error in inline data.
    fn fail_inline(&self, what: String) -> InlineError {
        self.abort_because(|| what.clone());
        InlineError::Peer(what)
    }

    /// Aborts the transfer, keeping `why` as its reason unless an earlier
    /// failure already gave one.
    fn abort_because(&self, why: impl FnOnce() -> String) {
        self.reason
            .lock()
            .expect("reason lock")
            .get_or_insert_with(why);
        self.abort();
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
            let file = match self.wait_for(chunk.file) {
                Awaited::Open(file) => file,
                Awaited::Discard => continue,
                Awaited::Aborted => break Err(StreamError::aborted(stream)),
                Awaited::Unannounced => {
                    break Err(StreamError::Protocol {
                        stream,
                        what: format!(
                            "data for entry id {}, which was never announced",
                            chunk.file
                        ),
                    })
                }
            };
            match self.take(&file, chunk.offset, bytes, received) {
                Ok(true) => self.commit(&file),
                Ok(false) => {}
                Err(what) => break Err(StreamError::Protocol { stream, what }),
            }
        };
        if let Err(e) = &result {
            self.abort_because(|| e.to_string());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::RecordWriter;
    use skiff_proto::dataplane::{derive_keys, Mode, Side};
    use std::net::{TcpListener, TcpStream};
    use std::path::Path;

    /// A writer and a reader joined by a loopback TCP stream.
    fn stream_pair() -> (RecordWriter, RecordReader) {
        let keys = derive_keys(&[1; 32], &[2; 32], Mode::Aead);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        (
            RecordWriter::new(tx, &keys, Side::Server, Mode::Aead, 0),
            RecordReader::new(rx, &keys, Side::Server, Mode::Aead, 0),
        )
    }

    fn source(dir: &Path, bytes: &[u8]) -> std::fs::File {
        let p = dir.join("source");
        std::fs::write(&p, bytes).unwrap();
        std::fs::File::open(p).unwrap()
    }

    fn incoming(dir: &Path, id: u32, size: u64) -> Incoming {
        let path = dir.join(format!("f{id}"));
        let f = AtomicFile::create(&path).unwrap();
        Incoming::new(id, f, size, 0o644, None, path.display().to_string())
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "source")
            .collect();
        v.sort();
        v
    }

    fn table() -> Arc<FileTable> {
        FileTable::new(|_| {})
    }

    #[test]
    fn an_id_announced_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        t.open(incoming(dir.path(), 1, 5)).unwrap();
        assert_eq!(
            t.open(incoming(dir.path(), 1, 5)).unwrap_err(),
            AnnouncedTwice(1)
        );
        assert_eq!(t.refuse(1).unwrap_err(), AnnouncedTwice(1));
        t.refuse(2).unwrap();
        assert_eq!(t.refuse(2).unwrap_err(), AnnouncedTwice(2));
        // The refused second file left no temporary behind.
        t.abort();
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn a_file_announced_after_an_abort_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        t.abort();
        t.open(incoming(dir.path(), 1, 5)).unwrap();
        t.open(incoming(dir.path(), 2, 0)).unwrap();
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn a_chunk_waits_for_its_announcement_until_they_are_over() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        let (mut w, r) = stream_pair();
        let src = source(dir.path(), b"hello");
        w.send_chunk(7, &src, 0, 5).unwrap();
        w.send_chunk(9, &src, 0, 5).unwrap();
        w.send_end().unwrap();
        let receiver = {
            let t = t.clone();
            std::thread::spawn(move || t.run_receiver(r, &|_| {}))
        };
        // Announced after its bytes were sent: written once it is.
        t.open(incoming(dir.path(), 7, 5)).unwrap();
        // Id 9 never is.
        t.close_announcements();
        let e = receiver.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("never announced"), "{e}");
        assert_eq!(std::fs::read(dir.path().join("f7")).unwrap(), b"hello");
    }

    #[test]
    fn inline_bytes_commit_a_file_and_drop_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let settled = Arc::new(Mutex::new(Vec::new()));
        let t = {
            let settled = settled.clone();
            FileTable::new(move |s| settled.lock().unwrap().push(format!("{s:?}")))
        };
        t.open(incoming(dir.path(), 1, 5)).unwrap();
        t.refuse(2).unwrap();
        t.write_inline(1, 0, b"he", &|_| {}).unwrap();
        // A refused entry's bytes are discarded.
        t.write_inline(2, 0, b"zzz", &|_| {}).unwrap();
        assert_eq!(t.pending(), 1);
        t.write_inline(1, 2, b"llo", &|_| {}).unwrap();
        // Committed on a thread of its own: settled once that is done.
        assert!(t.wait_settled());
        assert_eq!(std::fs::read(dir.path().join("f1")).unwrap(), b"hello");
        assert_eq!(*settled.lock().unwrap(), ["Stored(1)"]);
    }

    #[test]
    fn more_inline_files_than_commit_threads_are_all_stored() {
        let dir = tempfile::tempdir().unwrap();
        let stored = Arc::new(AtomicU64::new(0));
        let t = {
            let stored = stored.clone();
            FileTable::new(move |s| {
                assert!(matches!(s, Settled::Stored(_)), "{s:?}");
                stored.fetch_add(1, Ordering::Relaxed);
            })
        };
        let n = 3 * INLINE_COMMITS as u32;
        for id in 0..n {
            t.open(incoming(dir.path(), id, 3)).unwrap();
            t.write_inline(id, 0, b"abc", &|_| {}).unwrap();
        }
        // Asked right away, while commits may still run: none of these is
        // short, and none is dropped.
        assert!(t.incomplete().is_empty());
        assert!(t.wait_settled());
        assert_eq!(stored.load(Ordering::Relaxed), u64::from(n));
        for id in 0..n {
            assert_eq!(
                std::fs::read(dir.path().join(format!("f{id}"))).unwrap(),
                b"abc"
            );
        }
    }

    /// An abort while files complete on the channel are being committed:
    /// once `abort_and_wait` returns, each of them is either under its final
    /// name or gone, never a temporary (a process that exits then leaves
    /// nothing half done).
    #[test]
    fn an_abort_waits_for_the_commits_it_cannot_stop() {
        for round in 0..50 {
            let dir = tempfile::tempdir().unwrap();
            let t = table();
            for id in 0..INLINE_COMMITS as u32 {
                t.open(incoming(dir.path(), id, 3)).unwrap();
                t.write_inline(id, 0, b"abc", &|_| {}).unwrap();
            }
            t.abort_and_wait();
            for name in names(dir.path()) {
                assert!(
                    name.starts_with('f') && !name.contains('.'),
                    "round {round}: {name} left: {:?}",
                    names(dir.path())
                );
            }
        }
    }

    #[test]
    fn inline_bytes_for_an_unannounced_id_or_past_the_size_end_the_transfer() {
        for (id, offset, what) in [(3, 0, "not announced"), (1, 4, "past the announced size")] {
            let dir = tempfile::tempdir().unwrap();
            let t = table();
            t.open(incoming(dir.path(), 1, 5)).unwrap();
            match t.write_inline(id, offset, b"xy", &|_| {}) {
                Err(InlineError::Peer(e)) => assert!(e.contains(what), "{e}"),
                other => panic!("{id}@{offset}: {other:?}"),
            }
            assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
            assert!(!t.wait_settled(), "the transfer is aborted");
            assert_eq!(
                t.abort_reason().as_deref().map(|r| r.contains(what)),
                Some(true)
            );
            assert_eq!(
                t.write_inline(1, 0, b"x", &|_| {}),
                Err(InlineError::Aborted)
            );
        }
    }

    #[test]
    fn bytes_past_the_announced_size_end_the_transfer() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        t.open(incoming(dir.path(), 1, 10)).unwrap();
        let (mut w, r) = stream_pair();
        let src = source(dir.path(), &[b'x'; 20]);
        w.send_chunk(1, &src, 0, 20).unwrap();
        w.send_end().unwrap();
        let e = t.run_receiver(r, &|_| {}).unwrap_err();
        assert!(e.to_string().contains("past the announced size"), "{e}");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
        assert!(!t.wait_settled(), "the transfer is aborted");
    }

    #[test]
    fn a_file_left_short_is_reported_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let settled = Arc::new(Mutex::new(Vec::new()));
        let t = {
            let settled = settled.clone();
            FileTable::new(move |s| settled.lock().unwrap().push(format!("{s:?}")))
        };
        t.open(incoming(dir.path(), 1, 100)).unwrap();
        t.open(incoming(dir.path(), 2, 3)).unwrap();
        let (mut w, r) = stream_pair();
        let src = source(dir.path(), &[b'y'; 50]);
        w.send_chunk(1, &src, 0, 50).unwrap();
        w.send_chunk(2, &src, 0, 3).unwrap();
        w.send_end().unwrap();
        t.close_announcements();
        t.run_receiver(r, &|_| {}).unwrap();
        let short = t.incomplete();
        assert_eq!(short.len(), 1, "{short:?}");
        assert!(short[0].ends_with("f1 (50 of 100 bytes)"), "{short:?}");
        assert!(t.wait_settled());
        // The complete file is in; the short one left nothing.
        assert_eq!(names(dir.path()), ["f2"]);
        assert_eq!(*settled.lock().unwrap(), ["Stored(2)"]);
    }
}
