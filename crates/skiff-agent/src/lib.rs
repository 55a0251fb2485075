//! The skiff agent: a per-user daemon on a private Unix socket that keeps
//! authenticated connections warm and runs commands for `skiff` processes,
//! which hand it their stdin, stdout and stderr (SCM_RIGHTS).
//!
//! [`socket`] holds the filesystem and socket security (0700 directory,
//! 0600 socket, peer uid check, fd passing, the spawn lock); [`daemon`] the
//! agent itself; [`client`] what the `skiff` CLI uses to reach it.

pub mod client;
pub mod daemon;
pub mod socket;
