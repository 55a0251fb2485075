//! Command-line options shared by every command that connects somewhere
//! (`skiff exec`, `skiff run`): ssh's -p -l -i -F -o -J, -v, and whether to
//! go through the agent.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Port to connect to (for `run`, a host's own `:port` wins).
    #[arg(short = 'p', value_name = "PORT")]
    pub port: Option<u16>,
    /// User to log in as (for `run`, a host's own `user@` wins).
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
    /// Connect directly instead of through the agent (also SKIFF_AGENT=off).
    #[arg(long = "no-agent")]
    pub no_agent: bool,
}

impl ConnectArgs {
    /// The `-o` options, with `-J` as `ProxyJump` in front (so it wins over
    /// the configuration files, as ssh's -J does).
    pub fn ssh_options(&self) -> Vec<String> {
        with_jump(self.jump.as_deref(), &self.options)
    }

    /// Whether to go through the agent: not with `--no-agent` or SKIFF_AGENT=off.
    pub fn agent_enabled(&self) -> bool {
        crate::route::agent_allowed(self.no_agent)
    }
}

/// `options` with `ProxyJump=JUMP` in front when `jump` is given.
pub fn with_jump(jump: Option<&str>, options: &[String]) -> Vec<String> {
    jump.map(|j| format!("ProxyJump={j}"))
        .into_iter()
        .chain(options.iter().cloned())
        .collect()
}
