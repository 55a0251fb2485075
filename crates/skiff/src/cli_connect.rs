//! Command-line options shared by every command that connects somewhere
//! (`skiff exec`, `skiff run`, `skiff cp`): ssh's -l -i -F -o -J, -v, and
//! whether to go through the agent. The port is each command's own: ssh's
//! `-p` for `exec` and `run`, scp's `-P` for `cp` (whose `-p` keeps modes
//! and times).

use std::path::PathBuf;

use clap::Args;
use skiff_engine::Destination;

#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// User to log in as (for `run` and `cp`, a host's own `user@` wins).
    #[arg(short = 'l', value_name = "USER")]
    pub login: Option<String>,
    /// Identity (private key) file; repeatable, tried in order.
    #[arg(short = 'i', value_name = "KEY")]
    pub identity: Vec<PathBuf>,
    /// Client configuration file instead of ~/.ssh/config (system config is then skipped).
    #[arg(short = 'F', value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// ssh_config option, e.g. -o StrictHostKeyChecking=yes; repeatable.
    #[arg(short = 'o', value_name = "Keyword=Value")]
    pub options: Vec<String>,
    /// Connect through these jump hosts, first to last (ProxyJump).
    #[arg(short = 'J', value_name = "[user@]host[:port],...")]
    pub jump: Option<String>,
    /// More diagnostics on stderr (repeatable).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Append diagnostics (warnings, and what -v adds) to FILE instead of
    /// stderr, as ssh's -E does.
    #[arg(short = 'E', value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Connect directly instead of through the agent (also SKIFF_AGENT=off).
    #[arg(long = "no-agent")]
    pub no_agent: bool,
}

impl ConnectArgs {
    /// The `-o` options, with `-J` as `ProxyJump` in front (so it wins over
    /// the configuration files, as ssh's -J does).
    pub fn ssh_options(&self) -> Vec<String> {
        self.jump
            .iter()
            .map(|j| format!("ProxyJump={j}"))
            .chain(self.options.iter().cloned())
            .collect()
    }

    /// Whether to go through the agent: not with `--no-agent` or SKIFF_AGENT=off.
    pub fn agent_enabled(&self) -> bool {
        crate::route::agent_allowed(self.no_agent)
    }

    /// Where these options and the command's `port` say to connect, but
    /// the host: `-l`'s user, keys, configuration file and options.
    pub fn destination(&self, port: Option<u16>) -> Destination {
        Destination {
            host: String::new(),
            user: self.login.clone(),
            port,
            identity_files: self.identity.clone(),
            config_file: self.config.clone(),
            options: self.ssh_options(),
        }
    }
}
