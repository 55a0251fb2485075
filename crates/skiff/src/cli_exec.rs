//! `skiff exec`: the command-line front end for running one command on one
//! host ([`crate::remote_command`] runs it). Exit status is the remote
//! command's; 255 means skiff itself failed.

use clap::Args;

use crate::cli_connect::ConnectArgs;
use crate::remote_command::{run_invocation, Invocation, TtyFlag};

#[derive(Args, Debug, Clone)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    /// Port to connect to.
    #[arg(short = 'p', value_name = "PORT")]
    pub port: Option<u16>,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Read stdin from /dev/null.
    #[arg(short = 'n')]
    pub no_stdin: bool,
    /// Allocate a pseudo-terminal; twice forces it even without a local terminal.
    #[arg(short = 't', action = clap::ArgAction::Count)]
    pub tty: u8,
    /// [user@]host
    pub destination: String,
    /// Command and arguments, joined with spaces as ssh does.
    #[arg(required = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl From<ExecArgs> for Invocation {
    fn from(args: ExecArgs) -> Self {
        Invocation {
            command: args.command.join(" "),
            conn: args.conn,
            port: args.port,
            destination: args.destination,
            subsystem: false,
            no_stdin: args.no_stdin,
            tty: match args.tty {
                0 => TtyFlag::Unset,
                n => TtyFlag::Request(n),
            },
        }
    }
}

pub fn run(args: ExecArgs) -> i32 {
    run_invocation(args.into())
}
