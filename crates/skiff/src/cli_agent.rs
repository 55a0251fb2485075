//! `skiff agent`: start the per-user agent (detached, or in the foreground),
//! or talk to the running one: `status`, `stop`, `forget HOST`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use skiff_proto::agent_wire::{Reply, Request};

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Stay attached to the terminal (logs on stderr) instead of detaching.
    #[arg(long)]
    pub foreground: bool,
    /// Socket directory (default: $XDG_RUNTIME_DIR/skiff, else /tmp/skiff-UID).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Close a connection after this many seconds without commands, unless
    /// the host's ControlPersist says otherwise; exit when none is left
    /// (default 600).
    #[arg(long, value_name = "SECS")]
    pub persist: Option<u64>,
    /// Set by the `skiff` that starts the agent while it holds the spawn lock.
    #[arg(long, hide = true)]
    pub spawned_under_lock: bool,
    /// More logging.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub action: Option<AgentAction>,
}

#[derive(Subcommand, Debug)]
pub enum AgentAction {
    /// Show the agent's connections.
    Status,
    /// Stop the agent (running commands are cut off).
    Stop,
    /// Close and forget the agent's connections to HOST.
    Forget { host: String },
}

pub fn run(args: AgentArgs) -> i32 {
    // A foreground agent (the auto-spawned one writes this to its log file)
    // logs at least at debug level; client actions log as asked.
    let verbose = if args.foreground {
        args.verbose.max(1)
    } else {
        args.verbose
    };
    crate::logging::init(verbose, None);
    let request = match &args.action {
        None => return start(&args),
        Some(AgentAction::Status) => Request::Status,
        Some(AgentAction::Stop) => Request::Stop,
        Some(AgentAction::Forget { host }) => Request::Forget { host: host.clone() },
    };
    let stream = match skiff_agent::client::connect_or_spawn(false) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skiff agent: {e}");
            return 1;
        }
    };
    match skiff_agent::client::request(stream, &request, &[]) {
        Ok(Reply::Status { text }) => {
            print!("{text}");
            0
        }
        Ok(Reply::Done) => 0,
        Ok(other) => {
            eprintln!("skiff agent: unexpected reply {other:?}");
            1
        }
        Err(e) => {
            eprintln!("skiff agent: {e}");
            1
        }
    }
}

fn start(args: &AgentArgs) -> i32 {
    let persist = args
        .persist
        .map(Duration::from_secs)
        .unwrap_or(skiff_agent::daemon::DEFAULT_PERSIST);
    if !args.foreground {
        // Detached start: the same path a first `skiff exec` takes.
        return match skiff_agent::client::connect_or_spawn(true) {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("skiff agent: {e}");
                1
            }
        };
    }
    let dir = match args
        .dir
        .clone()
        .map(Ok)
        .unwrap_or_else(skiff_agent::socket::agent_dir)
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skiff agent: {e}");
            return 1;
        }
    };
    match skiff_agent::daemon::run(&dir, persist, args.spawned_under_lock) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("skiff agent: {e}");
            1
        }
    }
}
