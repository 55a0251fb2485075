//! `skiff cp`: what to copy (a [`CopyJob`]), how progress is reported, and
//! what came of it (a [`CopyReport`]), whatever backend carries the bytes.
//! The SFTP backend ([`sftp`]) works with any SSH server; local files are
//! walked, placed and written with `skiff_files`.

pub mod dataplane;
pub mod sftp;

use std::path::PathBuf;

/// Which way the files go, and between which paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// Local sources to a remote target path as typed (relative to the
    /// remote login directory unless absolute; empty means that directory).
    Upload {
        sources: Vec<PathBuf>,
        target: String,
    },
    /// Remote sources (as typed, relative to the login directory unless
    /// absolute) to a local target.
    Download {
        sources: Vec<String>,
        target: PathBuf,
    },
}

/// One `skiff cp` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    pub direction: Direction,
    /// `-r`: copy directories and their contents.
    pub recursive: bool,
    /// `-p`: keep modes (exactly) and access/modification times.
    pub preserve: bool,
}

/// Receives progress while a copy runs (a progress bar, or nothing).
pub trait Progress: Send + Sync {
    /// More bytes are going to be copied (called as sources are found).
    fn add_total(&self, bytes: u64);
    /// This many more bytes have been copied.
    fn advance(&self, bytes: u64);
    /// A file is complete under its final name (`path` as shown to the user).
    fn file_done(&self, path: &str);
}

/// A [`Progress`] that shows nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn add_total(&self, _bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn file_done(&self, _path: &str) {}
}

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Files copied completely.
    pub files: u64,
    /// Directories created (or found in place) for copied trees.
    pub dirs: u64,
    /// Bytes of file data copied.
    pub bytes: u64,
    /// One human line per failed file or directory, naming the path.
    pub failures: Vec<String>,
}
