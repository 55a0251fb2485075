//! skiff-delay-relay: a TCP relay for benchmarks that imitates a long path.
//! Each accepted connection is forwarded to one target with a fixed delay in
//! each direction, TCP's handshake times, and a bounded number of bytes in
//! flight per direction; an optional event log records, per connection, when
//! it was accepted and connected upstream and when each chunk was delivered.
//! Not part of skiff or skiffd: bench/transfer runs it.
//!
//! [`model`] holds the decisions (when, how much) and no I/O; [`relay`] is
//! the tokio glue around it.

#![forbid(unsafe_code)]

pub mod model;
pub mod relay;
