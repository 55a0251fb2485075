//! The relay's command line: parse, bind, print the bound address, run.

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use skiff_delay_relay::model::{default_in_flight, Link};
use skiff_delay_relay::relay::{run, Config, EventLog};

/// Forward TCP connections to a target with a fixed delay each way.
///
/// Prints `listening on ADDR` on stdout once it accepts connections.
#[derive(Parser, Debug)]
#[command(name = "skiff-delay-relay")]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where each connection goes (host:port).
    #[arg(long)]
    target: String,
    /// One-way delay in milliseconds (fractions allowed); the round trip is
    /// twice this.
    #[arg(long)]
    delay_ms: f64,
    /// Bytes in flight per direction of each connection before reading
    /// stops (default: 1 GB/s x RTT, at least 4 MiB).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Append a JSON line per event (accept, connect, deliveries, close).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Deliveries per direction logged one by one before coalescing.
    #[arg(long, default_value_t = 2000)]
    log_chunks: u64,
    /// Exit after this many seconds with no connection open.
    #[arg(long)]
    exit_after_idle: Option<f64>,
}

fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{what}: {s} is not a duration"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let link = Link::new(seconds("--delay-ms", args.delay_ms / 1e3)?);
    let exit_after_idle = args
        .exit_after_idle
        .map(|s| seconds("--exit-after-idle", s))
        .transpose()?;
    let cfg = Config {
        target: args.target,
        link,
        in_flight: args
            .max_in_flight
            .unwrap_or_else(|| default_in_flight(&link)),
        detailed_chunks: args.log_chunks,
        exit_after_idle,
    };
    let log = EventLog::open(args.log.as_deref())?;
    // One thread: the relay only waits and copies, and the machines it
    // benchmarks on are small; a second thread would compete with the
    // client and the server it sits between.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
        drop(out);
        run(listener, cfg, log).await
    })
}
