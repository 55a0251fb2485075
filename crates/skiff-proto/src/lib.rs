//! Sans-IO protocol and file-format logic for skiff.
//!
//! Everything here is pure: functions take text or bytes and return values or
//! errors that name the file and line. No sockets, no files, no tokio, so all of
//! it can be unit-tested and fuzzed (see `fuzz/`).

// Only the SIMD scan of hashed known_hosts lines needs `unsafe`.
#![deny(unsafe_code)]

pub mod agent_wire;
pub mod algorithms;
pub mod authorized_keys;
pub mod dataplane;
pub mod escape;
pub mod flow;
pub mod forward_spec;
pub mod frame;
pub mod known_hosts;
pub mod krl;
pub mod nodeset;
pub mod openssh_key;
pub mod pam_session_wire;
pub mod pattern;
pub mod peer_close;
pub mod signals;
pub mod socks;
pub mod ssh_config;
pub mod terminal_text;
#[cfg(test)]
mod test_keys;
pub mod user_cert;
pub mod window;
mod wire_codec;
pub mod worker_wire;
