//! skiffd: an SSH server built on russh that serves local accounts to any
//! SSH client (OpenSSH included). The library is all of it but the command
//! line, which is the `skiffd` binary's (`src/bin/skiffd.rs`).
//!
//! [`serve`] binds the listeners and runs until the process ends. The pieces:
//! [`config`] (settings and their file format), [`hostkey`] (host keys),
//! [`account`] (who may log in), [`lookup_command`]
//! (`AuthorizedKeysCommand`, `AuthorizedPrincipalsCommand`), `handler` (one
//! connection: russh's callbacks, each handed to `handler::auth` for
//! authentication, `handler::session` for starting sessions,
//! `handler::session_io` for a started session's I/O and flow control, or
//! `handler::forwarding_requests`), `server_state` (what all connections
//! share) and `process` (starting commands as the account, with pipes or a
//! pty), on top of `spawn` (a vfork-style process start that can drop
//! privileges).
//! [`account_policy`] is what makes an account usable (locks, expiry,
//! shells that run nothing, `/etc/nologin`); `pty_owner` hands a session's
//! terminal to the account and back.
//! [`sftp`] is the file server that the `sftp` subsystem runs as the account
//! (`skiffd --sftp-server`), never inside the server process; [`chroot`]
//! jails logins (`ChrootDirectory`); [`session_env`] decides which
//! environment each started program gets. `account_files` reads
//! authorized_keys, principals and key lists (regular files only, bounded,
//! mode-checked, off the async workers); `account_fs` connects to and makes
//! Unix sockets with an account's rights; `sshd_only` rules on sshd
//! keywords skiffd accepts without acting on. [`queue_budget`] counts the
//! memory held for peers (`MaxConnectionQueue`, `MaxServerQueue`) and
//! `channel_io` moves channel bytes with it counted. [`channel_timeout`]
//! says how long a channel may go without traffic (`ChannelTimeout`), and
//! `channel_idle` keeps the time and closes idle channels and unused
//! connections (`UnusedConnectionTimeout`). [`startups`] counts
//! connections that have not authenticated (data-plane streams until their
//! token checks out); [`fd_budget`] keeps descriptors spare for work
//! already taken on, which `descriptors` measures.

pub mod access;
pub mod account;
mod account_files;
mod account_fs;
pub mod account_policy;
mod auth_info;
mod channel_idle;
mod channel_io;
pub mod channel_timeout;
pub mod chroot;
pub mod config;
mod descriptors;
pub mod fd_budget;
pub mod forward_policy;
mod forward_relay;
mod handler;
pub mod hostkey;
mod listener;
pub mod lookup_command;
pub mod match_block;
mod peer_hangup;
mod process;
mod pty_owner;
pub mod queue_budget;
mod server_state;
pub mod session_env;
pub mod sftp;
mod spawn;
mod sshd_only;
pub mod startups;
mod stream_relay;
pub mod transfer_process;

pub use handler::authorized_keys_path;
pub use listener::{russh_config, serve, serve_inetd, serve_listeners};
