//! Shared harness for skiff's integration tests against real OpenSSH.
//!
//! Everything here talks to real programs: `/usr/sbin/sshd`, `ssh`,
//! `ssh-keygen`, `ssh-agent`, `ssh-add` and the `skiff` / `skiffd` binaries
//! built from this package. Nothing is mocked.
//!
//! Rules the harness follows so that tests can run in parallel threads:
//! * network traffic only ever goes to loopback (127.0.0.0/8);
//! * daemons listen on a fresh free port and are polled (bounded) until they
//!   accept connections;
//! * every wait is bounded, every spawned process is killed and reaped on
//!   drop (also when a test panics);
//! * every test gets its own temporary directories.
//!
//! The harness is split by what it sets up; everything is re-exported here,
//! so a test file's `use common::*;` sees all of it:
//! * `environment`: the binaries under test, `require_*` gates, root;
//! * `accounts`: the accounts the tests log into;
//! * `files`: temporary directories, files, checksums;
//! * `keys`: keys, known_hosts and authorized_keys lines, certificates,
//!   the [`Fixture`];
//! * `run`: running a program, bounded, with captured output;
//! * `ssh_client`: OpenSSH's `ssh`, `ssh-agent` and `sftp`;
//! * `skiff_client`: `skiff exec`, a client HOME, a test's skiff agent;
//! * `daemon`, `sshd`, `skiffd`: the servers the tests talk to;
//! * `checks`: assertions on what a login sees;
//! * `skiff_cases`: client cases shared by `skiff_to_sshd.rs` and
//!   `skiff_to_skiffd.rs`.

#![allow(dead_code)]

pub mod skiff_cases;

mod accounts;
mod checks;
mod daemon;
mod environment;
mod files;
mod keys;
mod run;
mod skiff_client;
mod skiffd;
mod ssh_client;
mod sshd;

// Each test file uses a part of the harness: a re-export it leaves unused
// is no mistake.
#[allow(unused_imports)]
pub use self::{
    accounts::*, checks::*, daemon::*, environment::*, files::*, keys::*, run::*, skiff_client::*,
    skiffd::*, ssh_client::*, sshd::*,
};
