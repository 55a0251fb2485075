//! The skiff data plane's stream I/O, shared by `skiff` (client) and the
//! transfer process skiffd starts as the account (server): record streams
//! over TCP sealed in place ([`stream`]), the queue that spreads file chunks
//! over several streams ([`send`]), and the table that writes received
//! chunks into files and commits each one when it is complete ([`receive`]),
//! and the watch that notices a transfer that stopped moving ([`watch`]).
//!
//! Blocking std I/O on one thread per stream: a stream is a bulk pipe, and a
//! thread blocked in `read`/`write` is the cheapest way to keep it full.
//! The wire format lives in `skiff_proto::dataplane` (docs/data-plane.md).

// Only `tcp` (TCP_INFO through getsockopt) needs `unsafe`.
#![deny(unsafe_code)]

pub mod receive;
pub mod send;
pub mod stream;
#[allow(unsafe_code)]
pub mod tcp;
pub mod watch;

pub use receive::{
    finish_dirs, prepare_entry, AnnouncedTwice, FileTable, Incoming, PendingDir, Prepared, Settled,
};
pub use send::{ChunkQueue, Outgoing};
pub use stream::{
    connect_stream, open_stream, RecordReader, RecordWriter, StreamError, Unacknowledged,
};
pub use watch::{Stall, StreamWatch};
