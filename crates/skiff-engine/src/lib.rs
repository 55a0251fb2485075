//! The skiff client engine: settings from OpenSSH configuration, connecting
//! with host-key verification and public-key authentication (key files and
//! ssh-agent), and running commands over russh.
//!
//! The `skiff` binary is a thin layer over this crate; later the agent and the
//! fan-out scheduler reuse the same pieces.

// Only `settings` (the C library's user and host lookups) needs `unsafe`.
#![deny(unsafe_code)]

pub mod busy;
pub mod connect;
pub mod copy;
pub mod error;
pub mod exec;
pub mod fanout;
pub mod host_key_update;
pub mod hostkeys;
mod identity;
mod identity_cache;
pub mod local_command;
pub mod password_auth;
pub mod pool;
pub mod port_forward;
mod private_key;
pub mod prompt_screen;
pub(crate) mod read_tap;
mod revoked_host_keys;
pub mod server_id;
#[allow(unsafe_code)]
pub mod settings;
pub mod spare_session;
pub mod stdio_forward;
pub mod transport;

pub use connect::{connect, Connection};
pub use error::{ErrorKind, SkiffError};
pub use exec::{exec, ExecRequest, ExitOutcome, PtyRequest, WindowSize};
pub use pool::{ChannelOpened, Pool};
pub use server_id::ServerKind;
pub use settings::{ConnectSettings, Destination};
