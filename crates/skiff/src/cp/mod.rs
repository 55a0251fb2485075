//! `skiff cp`: copy files and directories to or from one host, with scp's
//! syntax (`[user@]host:path`, `-r`, `-p`, `-P PORT`), or to every host of
//! a node set (`web[01-20]:path`, see [`many_hosts`]). Exit status: 0 when
//! every file was copied, 1 when any failed (each named on stderr), 255
//! when skiff could not connect or authenticate, 128+N when stopped by
//! signal N (after the remote temporaries of files not complete were
//! removed: [`stopped`]).
//!
//! This module holds the command line and the dispatch; [`plan`] reads the
//! paths into a job and a destination, [`one_host`] copies to or from one
//! host (through the agent or directly), [`many_hosts`] to or from a node
//! set, and [`progress`] draws the bar. Which transport carries the bytes
//! (the skiff data plane, else SFTP) is the engine's decision
//! (`skiff_engine::copy::copy`).

mod many_hosts;
mod one_host;
mod plan;
mod progress;

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use skiff_engine::copy::{Cleanup, CopyReport, Temporaries};
use skiff_proto::terminal_text::one_line;

use crate::cli_connect::ConnectArgs;
use crate::groups::GroupsArgs;

use plan::{plan, Planned};

#[derive(Args, Debug, Clone)]
#[command(override_usage = "skiff cp [OPTIONS] SRC... DST")]
pub struct CpArgs {
    /// Copy directories and their contents.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Keep modes and access/modification times.
    #[arg(short = 'p')]
    pub preserve: bool,
    /// Port to connect to (scp's -P).
    #[arg(short = 'P', value_name = "PORT")]
    pub port: Option<u16>,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// No progress bar.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Parallel data-plane streams, 1 to 16 (skiffd). Default: 2, 4 or 8 for
    /// round trips up to 2 ms, up to 20 ms, or longer, and none for a small
    /// copy (up to 512 KiB and 64 entries within 2 ms, 128 KiB beyond),
    /// which goes on the SSH channel itself (a download so, from skiffd
    /// 0.2.0 or later). Uploads over SFTP (other
    /// servers) use at most N channels (default 8), more only for jobs of
    /// 16 MiB or more.
    #[arg(long = "streams", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub streams: Option<u16>,
    /// Data-plane protection (skiffd only; integrity and none need the server's consent).
    #[arg(long = "cipher", value_enum, default_value_t = CipherMode::Aead)]
    pub cipher: CipherMode,
    /// Copying to a node set: hosts in progress at once.
    #[arg(short = 'j', long = "parallel", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: u16,
    #[command(flatten)]
    pub groups: GroupsArgs,
    /// SRC... DST: sources, then the target; one side is `[user@]host:path`
    /// (a target's host may be a node set: `web[01-20]:path`, `@group:path`).
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
}

/// How data-plane records are protected (`--cipher`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherMode {
    /// Encrypted and authenticated (AES-GCM).
    Aead,
    /// Authenticated, not encrypted.
    Integrity,
    /// Neither (loopback or trusted networks, when the server allows it).
    None,
}

/// The data-plane parameters of one copy.
#[derive(Debug, Clone)]
pub struct PlaneOptions {
    pub streams: Option<u16>,
    pub cipher: CipherMode,
}

pub fn run(args: CpArgs) -> i32 {
    crate::heap::keep_freed_buffers();
    crate::logging::init_for_copy(args.conn.verbose, args.conn.log_file.as_deref());
    let plan = match plan(&args) {
        Ok(Planned::One(p)) => p,
        Ok(Planned::Many(many)) => return many_hosts::run(&args, many),
        Err(message) => {
            eprintln!("skiff: {message}");
            return 255;
        }
    };
    let settings = match skiff_engine::settings::resolve(&plan.destination) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skiff: {e}");
            return 255;
        }
    };
    let Some(runtime) = copy_runtime() else {
        return 255;
    };
    let plane = plane_of(&args);
    let show_bar = !args.quiet && std::io::stderr().is_terminal();
    let use_agent = agent_wanted(&args);
    let result = runtime.block_on(one_host::cp_main(
        &plan, settings, &plane, show_bar, use_agent,
    ));
    runtime.shutdown_background();
    match result {
        Ok(Finish::Interrupted(signal, removal)) => report_stop(signal, &removal),
        Ok(Finish::Done(report)) => {
            tracing::debug!(
                "copied {} files and {} directories, {} bytes; {} failed",
                report.files,
                report.dirs,
                report.bytes,
                report.failures.len()
            );
            // Each names a path (perhaps one the server listed) and may
            // carry the server's own words.
            for failure in &report.failures {
                eprintln!("skiff: {}", one_line(failure));
            }
            if report.failures.is_empty() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("skiff: {e}");
            255
        }
    }
}

/// The runtime copies run on: two workers, so that the SSH session's
/// crypto runs beside the copy loop. `None` (said on stderr) if it cannot
/// start.
pub(crate) fn copy_runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("skiff: cannot start the async runtime: {e}"))
        .ok()
}

/// The data-plane options `args` ask for.
pub(crate) fn plane_of(args: &CpArgs) -> PlaneOptions {
    PlaneOptions {
        streams: args.streams,
        cipher: args.cipher,
    }
}

/// Whether to copy through the agent: not with `--no-agent` or SKIFF_AGENT=off.
pub(crate) fn agent_wanted(args: &CpArgs) -> bool {
    args.conn.agent_enabled()
}

/// How a copy ended, short of an error.
enum Finish {
    Done(CopyReport),
    /// Stopped by this signal (INT, TERM or HUP), and what became of the
    /// remote temporaries.
    Interrupted(i32, Removal),
}

/// What became of a stopped copy's remote temporaries.
pub(crate) enum Removal {
    /// Removed, or named as left (the engine's time limit ran out).
    Done(Cleanup),
    /// A second signal came first: these many were not waited for.
    Skipped(usize),
}

/// A copy was stopped by `signal` (its future dropped): removes the remote
/// temporaries it left, for as long as the engine allows, unless another
/// signal says not to wait.
async fn stopped(signal: i32, temps: &Temporaries) -> Finish {
    Finish::Interrupted(signal, remove_temporaries(temps).await)
}

/// See [`stopped`].
pub(crate) async fn remove_temporaries(temps: &Temporaries) -> Removal {
    let live = temps.len();
    if live == 0 {
        return Removal::Done(Cleanup::default());
    }
    tokio::select! {
        cleanup = temps.remove_all() => Removal::Done(cleanup),
        _ = interrupted() => Removal::Skipped(live),
    }
}

/// Says that the copy was stopped by `signal`, and what is left on the
/// server; the exit status (128 + signal).
pub(crate) fn report_stop(signal: i32, removal: &Removal) -> i32 {
    // Files not complete were never renamed into place, and their local
    // temporaries are gone.
    eprintln!("skiff: interrupted; files not yet complete were not written");
    match removal {
        Removal::Done(cleanup) => {
            for left in &cleanup.left {
                eprintln!("skiff: temporary not removed: {}", one_line(left));
            }
        }
        Removal::Skipped(n) => {
            eprintln!("skiff: interrupted again; {n} temporary file(s) left on the server")
        }
    }
    128 + signal
}

/// Waits for SIGINT, SIGTERM or SIGHUP and returns its number.
pub(crate) async fn interrupted() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => libc::SIGINT,
        _ = term.recv() => libc::SIGTERM,
        _ = hup.recv() => libc::SIGHUP,
    }
}
