//! Spreading files over streams: the producer (walking the sources) queues
//! each file's chunks; one sender thread per stream takes the next chunk,
//! reads it straight into its record buffer and sends it. The queue is
//! bounded, so a tree of a million files never holds a million open files.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex};

use crate::stream::{ChunkError, RecordWriter, StreamError, CHUNK_DATA};

/// A file whose bytes are being sent.
pub struct Outgoing {
    pub id: u32,
    pub file: File,
    pub size: u64,
    /// Set when reading the file failed; its remaining chunks are skipped.
    failed: std::sync::atomic::AtomicBool,
}

impl Outgoing {
    pub fn new(id: u32, file: File, size: u64) -> Arc<Outgoing> {
        Arc::new(Outgoing {
            id,
            file,
            size,
            failed: Default::default(),
        })
    }
}

struct Chunk {
    file: Arc<Outgoing>,
    offset: u64,
    len: usize,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<Chunk>,
    closed: bool,
    aborted: bool,
}

/// The chunks waiting to be sent, shared by the producer and the senders.
pub struct ChunkQueue {
    state: Mutex<State>,
    changed: Condvar,
    limit: usize,
}

impl ChunkQueue {
    /// A queue that holds at most `limit` chunks before `push` waits.
    pub fn new(limit: usize) -> Arc<ChunkQueue> {
        Arc::new(ChunkQueue {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            limit: limit.max(1),
        })
    }

    /// Queues every chunk of `file` (none for an empty file), waiting while
    /// the queue is full. Returns false once the queue was aborted.
    pub fn push(&self, file: Arc<Outgoing>) -> bool {
        let mut offset = 0;
        while offset < file.size {
            let len = (file.size - offset).min(CHUNK_DATA as u64) as usize;
            let mut st = self.state.lock().expect("queue lock");
            while st.chunks.len() >= self.limit && !st.aborted {
                st = self.changed.wait(st).expect("queue lock");
            }
            if st.aborted {
                return false;
            }
            st.chunks.push_back(Chunk {
                file: file.clone(),
                offset,
                len,
            });
            self.changed.notify_all();
            offset += len as u64;
        }
        true
    }

    /// No more files: senders finish once the queue is empty.
    pub fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.changed.notify_all();
    }

    /// Stops everything: producers and senders return at once.
    pub fn abort(&self) {
        let mut st = self.state.lock().expect("queue lock");
        st.aborted = true;
        st.chunks.clear();
        self.changed.notify_all();
    }

    /// Chunks waiting now.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().expect("queue lock").chunks.len()
    }

    /// True once the producer said it has no more files.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().expect("queue lock").closed
    }

    fn pop(&self) -> Option<Chunk> {
        let mut st = self.state.lock().expect("queue lock");
        loop {
            if st.aborted {
                return None;
            }
            if let Some(c) = st.chunks.pop_front() {
                self.changed.notify_all();
                return Some(c);
            }
            if st.closed {
                return None;
            }
            st = self.changed.wait(st).expect("queue lock");
        }
    }

    /// One stream's sender: sends chunks until the queue is closed and
    /// empty, then the end-of-stream record. `sent(bytes)` reports progress;
    /// `file_failed(id, error)` reports a file that could not be read (it is
    /// reported once; its other chunks are skipped). A stream error aborts
    /// the queue and is returned.
    pub fn run_sender(
        &self,
        mut writer: RecordWriter,
        sent: &(dyn Fn(u64) + Sync),
        file_failed: &(dyn Fn(u32, std::io::Error) + Sync),
    ) -> Result<(), StreamError> {
        while let Some(c) = self.pop() {
            if c.file.failed.load(std::sync::atomic::Ordering::Relaxed) {
                continue;
            }
            match writer.send_chunk(c.file.id, &c.file.file, c.offset, c.len) {
                Ok(()) => sent(c.len as u64),
                Err(ChunkError::File(e)) => {
                    if !c
                        .file
                        .failed
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        file_failed(c.file.id, e);
                    }
                }
                Err(ChunkError::Stream(e)) => {
                    self.abort();
                    return Err(e);
                }
            }
        }
        if self.state.lock().expect("queue lock").aborted {
            return Err(StreamError::aborted(writer.stream()));
        }
        writer.send_end().inspect_err(|_| self.abort())
    }
}
