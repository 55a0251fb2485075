//! skiffd: an SSH server built on russh that serves local accounts to any
//! SSH client (OpenSSH included). The library is all of it but the command
//! line, which is the `skiffd` binary's (`src/bin/skiffd.rs`).
//!
//! [`serve`] binds the listeners and runs until the process ends. The pieces:
//! [`config`] (settings and their file format; [`config_dump`] prints
//! them as `sshd -T` does), [`hostkey`] (host keys), [`log_file`] (the
//! `-E` file), [`syslog`] (the log sent to syslog, and where skiffd logs),
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
//! (`skiffd --sftp-server`), never inside the server process, under the
//! `internal-sftp` options [`sftp_options`] parses and checks; [`chroot`]
//! jails logins (`ChrootDirectory`); [`session_env`] decides which
//! environment each started program gets. `account_files` reads
//! authorized_keys, principals and key lists (regular files only, bounded,
//! mode-checked, off the async workers); `account_fs` connects to and makes
//! Unix sockets with an account's rights; `sshd_only` rules on sshd
//! keywords skiffd accepts without acting on; [`auth_methods`] is the
//! `AuthenticationMethods` policy, [`security_keys`] what a security key's
//! signature must show (`PubkeyAuthOptions`). [`queue_budget`] counts the
//! memory held for peers (`MaxConnectionQueue`, `MaxServerQueue`) and
//! `channel_io` moves channel bytes with it counted. [`channel_timeout`]
//! says how long a channel may go without traffic (`ChannelTimeout`), and
//! `channel_idle` keeps the time and closes idle channels and unused
//! connections (`UnusedConnectionTimeout`). [`startups`] counts
//! connections that have not authenticated (data-plane streams until their
//! token checks out), [`penalties`] the sources refused for a while after
//! misbehaving (`PerSourcePenalties`); [`fd_budget`] keeps descriptors spare for work
//! already taken on, which `descriptors` measures. [`auth_log`] words the
//! login lines as sshd does; [`audit`] holds the records of the `AuditLog`
//! and [`audit_writer`] appends them. [`login_records`] builds the utmp,
//! wtmp and lastlog records of sessions with a terminal and what an
//! interactive login is shown first, which `login_writer` writes and reads.

pub mod access;
pub mod account;
mod account_files;
mod account_fs;
pub mod account_policy;
pub mod audit;
pub mod audit_writer;
mod auth_info;
pub mod auth_log;
pub mod auth_methods;
mod backlog;
mod channel_idle;
mod channel_io;
pub mod channel_timeout;
pub mod chroot;
pub mod config;
pub mod config_dump;
mod connection;
mod descriptors;
pub mod fd_budget;
pub mod forward_policy;
mod forward_relay;
mod handler;
pub mod hostkey;
mod hot_code;
mod ident_ahead;
mod listener;
pub mod log_file;
pub mod login_records;
mod login_writer;
pub mod lookup_command;
pub mod match_block;
pub mod pam;
pub mod pam_policy;
pub mod pam_session;
mod peer_hangup;
pub mod penalties;
mod process;
mod pty_owner;
pub mod queue_budget;
mod rehearsal;
pub mod rekey_limit;
pub mod security_keys;
mod seqpacket;
mod server_state;
pub mod service_manager;
pub mod session_env;
pub mod sftp;
pub mod sftp_options;
mod spawn;
mod sshd_only;
pub mod startups;
mod stream_relay;
mod stream_route;
pub mod syslog;
pub mod transfer_process;
mod warm_start;
mod worker;
mod worker_pool;
pub mod zygote;

pub use handler::authorized_keys_path;

/// skiffd's software version as its identification string carries it
/// (`SSH-2.0-skiffd_X.Y.Z`), and as `Match version` matches it.
pub const SOFTWARE_VERSION: &str = concat!("skiffd_", env!("CARGO_PKG_VERSION"));
pub use connection::{check, serve_inetd};
pub use listener::{russh_config, serve, serve_listeners, Reload};
