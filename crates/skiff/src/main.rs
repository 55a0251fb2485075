//! `skiff`: run commands on machines over SSH, compatible with OpenSSH servers
//! and the user's ~/.ssh (config, keys, ssh-agent, known_hosts).

mod background;
mod cli_agent;
mod cli_connect;
mod cli_exec;
mod cli_run;
mod cli_ssh;
mod cp;
mod demo;
mod escape_input;
mod groups;
mod heap;
mod logging;
mod remote_command;
mod route;
mod run_output;
mod run_threads;
mod ssh_args;
mod stdio;
mod terminal;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Run a command on many hosts at once (node sets like web[01-20], @group).
    Run(cli_run::RunArgs),
    /// Copy files to or from a host (scp syntax: [user@]host:path).
    Cp(cp::CpArgs),
    /// ssh's own command line, for programs that run `ssh` (also what skiff
    /// does when run as `ssh` or `skiff-ssh`); see README.
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Ssh {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Start a throwaway skiffd on loopback and run a few timed commands against it.
    Demo(demo::DemoArgs),
    /// The per-user agent that keeps connections warm (started automatically).
    Agent(cli_agent::AgentArgs),
}

fn main() {
    let stdio = stdio::BlockingStdio::enter();
    let exit = |code: i32| -> ! {
        stdio.restore();
        std::process::exit(code)
    };
    // Run under the name `ssh` or `skiff-ssh`, or as `skiff ssh`: ssh's
    // command line, parsed as ssh parses it rather than by clap.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let program = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("skiff");
    if matches!(program, "ssh" | "skiff-ssh") {
        exit(cli_ssh::main(argv.split_off(1)));
    }
    if argv.get(1).is_some_and(|a| a == "ssh") {
        exit(cli_ssh::main(argv.split_off(2)));
    }
    // `skiff --generate-docs DIR` (hidden): the manual pages and shell
    // completions, for packaging/build-deb.
    if let Some(code) = skiff_docgen::generate_if_asked(&argv, Cli::command, "1") {
        exit(code);
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Exec(args) => cli_exec::run(args),
        Command::Run(args) => cli_run::run(args),
        Command::Cp(args) => cp::run(args),
        Command::Demo(args) => demo::run(args),
        // Handled above; reached only if clap saw it some other way.
        Command::Ssh { args } => cli_ssh::main(args.into_iter().map(Into::into).collect()),
        Command::Agent(args) => cli_agent::run(args),
    };
    exit(code);
}
