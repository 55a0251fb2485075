//! `skiff`: run commands on machines over SSH, compatible with OpenSSH servers
//! and the user's ~/.ssh (config, keys, ssh-agent, known_hosts).

mod cli_exec;
mod demo;
mod terminal;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "skiff",
    version,
    about = "Fast, secure remote execution over SSH"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command on one host (like `ssh host command`).
    Exec(cli_exec::ExecArgs),
    /// Start a throwaway skiffd on loopback and run a few timed commands against it.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Exec(args) => cli_exec::run(args),
        Command::Demo(args) => demo::run(args),
    };
    std::process::exit(code);
}

/// Sets up logging on stderr; `-v` raises the level.
pub(crate) fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "error",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG").unwrap_or_else(|_| {
        let russh = if verbose >= 3 { "debug" } else { "error" };
        tracing_subscriber::EnvFilter::new(format!(
            "skiff={level},skiff_engine={level},skiff_server={level},russh={russh}"
        ))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}
