//! skiffd as a library: an SSH server built on russh that serves local accounts
//! to any SSH client (OpenSSH included).
//!
//! [`serve`] binds the listeners and runs until the process ends. The pieces:
//! [`config`] (settings and their file format), [`hostkey`] (host keys),
//! [`account`] (who may log in), [`lookup_command`] (`AuthorizedKeysCommand`, `AuthorizedPrincipalsCommand`), `handler` (authentication and sessions) and
//! `process` (starting commands as the account, with pipes or a pty), on top
//! of `spawn` (a vfork-style process start that can drop privileges).
//! [`sftp`] is the file server that the `sftp` subsystem runs as the account
//! (`skiffd --sftp-server`), never inside the server process; [`chroot`]
//! jails logins (`ChrootDirectory`). `account_fs` connects to and makes
//! Unix sockets with an account's rights; `sshd_only` rules on sshd
//! keywords skiffd accepts without acting on. [`startups`] counts
//! connections that have not authenticated (data-plane streams until their
//! token checks out); [`fd_budget`] keeps descriptors spare for work already
//! taken on, which `descriptors` measures.

pub mod access;
pub mod account;
mod account_fs;
mod auth_info;
pub mod chroot;
pub mod config;
mod dataplane;
mod descriptors;
pub mod fd_budget;
pub mod forward_policy;
mod forwarding;
mod handler;
pub mod hostkey;
mod listener;
pub mod lookup_command;
pub mod match_block;
mod process;
pub mod sftp;
mod spawn;
mod sshd_only;
pub mod startups;
pub mod transfer;

pub use handler::authorized_keys_path;
pub use listener::{russh_config, serve, serve_listeners};
