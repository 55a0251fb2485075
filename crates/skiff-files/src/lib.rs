//! Local files for `skiff cp`, whatever carries the bytes (SFTP or the skiff
//! data plane): walking a source tree the way scp does, deciding where
//! sources land, writing files so that an interrupted copy never leaves a
//! truncated file under its final name, creating directories and applying
//! modes and times, checking relative paths received from a peer, and
//! deciding what a download may bring ([`Requested`]) and which modes
//! received files get ([`ReceivePolicy`]).
//!
//! `with_private_umask` creates files (or sockets) under a umask of its
//! own without touching the process's.
//!
//! Blocking std I/O throughout: async callers use `spawn_blocking` (or call
//! it directly for cheap operations such as a `stat`).

mod atomic;
mod error;
mod glob;
mod names;
mod private_umask;
mod receiving;
mod requested;
mod target;
mod walk;

pub use atomic::{
    apply_umask, finish_dir, make_dir, umask, AtomicFile, MadeDir, Times, TEMP_MARKER,
};
pub use error::FileError;
pub use glob::glob_paths;
pub use names::{label_file_name, safe_name, safe_relative};
pub use private_umask::with_private_umask;
pub use receiving::ReceivePolicy;
pub use requested::{Requested, Unrequested, Why};
pub use target::{place, resolve_target, Placement};
pub use walk::{walk, Entry, EntryKind, Walk};
