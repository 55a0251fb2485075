//! The harness of skiff's integration tests against real OpenSSH, shared by
//! the tests of `skiff` (crates/skiff/tests) and of `skiffd`
//! (crates/skiff-server/tests). Dev-only: no binary links it.
//!
//! Everything here talks to real programs: `/usr/sbin/sshd`, `ssh`,
//! `ssh-keygen`, `ssh-agent`, `ssh-add` and the workspace's `skiff` /
//! `skiffd` binaries, found in the cargo target directory the test runs
//! from (see `environment`). Nothing is mocked.
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
//! so a test file's `use skiff_testkit::*;` sees all of it:
//! * `environment`: the binaries under test and the test peers, `require_*`
//!   gates, root;
//! * `accounts`: the accounts the tests log into;
//! * `files`: temporary directories, files, checksums;
//! * `keys`: keys, known_hosts and authorized_keys lines, certificates,
//!   the [`Fixture`];
//! * `run`: running a program, bounded, with captured output;
//! * `ssh_client`: OpenSSH's `ssh`, `ssh-agent` and `sftp`;
//! * `security_keys`: security keys made with a software key library;
//! * `skiff_client`: `skiff exec`, a client HOME, a test's skiff agent;
//! * `daemon`, `sshd`, `skiffd`: the servers the tests talk to;
//! * `delay_relay`: a long path on loopback in front of one of them;
//! * `echo`: a line echo server, for the far end of a forwarding;
//! * `other_ssh`: dropbear's server and client, PuTTY's tools;
//! * `checks`: assertions on what a login sees;
//! * `terminal`: a program on a pseudo-terminal of its own.

#![forbid(unsafe_code)]

mod accounts;
mod checks;
mod daemon;
mod delay_relay;
mod echo;
mod environment;
mod files;
mod keys;
mod other_ssh;
mod pam_service;
mod run;
mod security_keys;
mod skiff_client;
mod skiffd;
mod ssh_client;
mod sshd;
mod terminal;

pub use self::{
    accounts::*, checks::*, daemon::*, delay_relay::*, echo::*, environment::*, files::*, keys::*,
    other_ssh::*, pam_service::*, run::*, security_keys::*, skiff_client::*, skiffd::*,
    ssh_client::*, sshd::*, terminal::*,
};
