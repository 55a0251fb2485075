//! The skiff data plane's two ends, shared by `skiff` (client) and the
//! transfer process skiffd starts as the account (server), so that an
//! upload and a download run the same code whichever side sends:
//! - sending: walking the sources and announcing each entry ([`offer`]),
//!   and the queue that spreads file chunks over several streams ([`send`]);
//! - receiving: checking each announced entry and making its file or
//!   directory ([`accept`]), and the table that writes received chunks into
//!   files and commits each one when it is complete ([`receive`]);
//! - record streams over TCP sealed in place ([`stream`]), and the watch
//!   that notices a transfer that stopped moving ([`watch`]).
//!
//! Only the control channel differs between the two sides (an async SSH
//! channel in the client, stdin/stdout in the transfer process): each side
//! keeps its own talk and calls these for everything else.
//!
//! Blocking std I/O on one thread per stream: a stream is a bulk pipe, and a
//! thread blocked in `read`/`write` is the cheapest way to keep it full.
//! The wire format lives in `skiff_proto::dataplane` (docs/data-plane.md).

// Only `tcp` (TCP_INFO through getsockopt) needs `unsafe`.
#![deny(unsafe_code)]

pub mod accept;
pub mod offer;
pub mod receive;
pub mod send;
pub mod stream;
#[allow(unsafe_code)]
pub mod tcp;
pub mod watch;

pub use accept::{Accepted, Accepting, Misbehaved};
pub use offer::{
    offer_tree, read_small_tree, source_path, Offered, SmallEntry, SmallLimits, SmallTree,
};
pub use receive::{AnnouncedTwice, FileTable, Incoming, InlineError, Settled, INLINE_COMMITS};
pub use send::{ChunkQueue, Outgoing};
pub use stream::{connect, dial, Dialed, RecordReader, RecordWriter, StreamError, Unacknowledged};
pub use watch::{Stall, StreamWatch};
