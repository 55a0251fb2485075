//! Turning a destination plus the user's OpenSSH client configuration into
//! concrete connection settings: reads `-o` options, the user's config
//! (`~/.ssh/config` or `-F FILE`) and `/etc/ssh/ssh_config`, follows `Include`
//! (with `~` and globs), applies defaults and expands `%` tokens.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use skiff_proto::known_hosts::StrictHostKeyChecking;
use skiff_proto::ssh_config::{
    self, ConfigError, ConfigFile, HostConfig, MatchContext, ProxySpec, TokenContext,
};

use crate::error::{ErrorKind, SkiffError};
use crate::identity_cache::IdentityCache;

/// What the command line says, before configuration is applied.
#[derive(Debug, Clone, Default)]
pub struct Destination {
    /// Host as given (possibly a `Host` alias from the config).
    pub host: String,
    pub user: Option<String>,
    pub port: Option<u16>,
    /// `-i` files, tried before configured ones.
    pub identity_files: Vec<PathBuf>,
    /// `-F FILE`: replaces ~/.ssh/config and skips /etc/ssh/ssh_config. `none` reads no file.
    pub config_file: Option<PathBuf>,
    /// `-o Keyword=Value` options, highest precedence.
    pub options: Vec<String>,
}

/// Everything needed to connect and authenticate.
#[derive(Debug, Clone)]
pub struct ConnectSettings {
    /// The name used for known_hosts and messages (HostName, else the given host).
    pub hostname: String,
    pub original_host: String,
    pub port: u16,
    pub user: String,
    pub identity_files: Vec<PathBuf>,
    /// `CertificateFile`s, offered with the keys they certify.
    pub certificate_files: Vec<PathBuf>,
    pub identities_only: bool,
    /// Identity files as read for the other connections of the same
    /// resolver (one run). None once connected: a live connection keeps no
    /// private keys.
    pub(crate) identity_cache: Option<Arc<IdentityCache>>,
    /// A fan-out's limit on its connections on their way to authentication
    /// ([`crate::busy::Gate`]), shared by its hosts; none for a single
    /// connection, a jump host, or a live connection.
    pub(crate) pre_auth_gate: Option<Arc<crate::busy::Gate>>,
    /// None means no agent (IdentityAgent none, or SSH_AUTH_SOCK unset).
    pub identity_agent: Option<PathBuf>,
    /// `SecurityKeyProvider`, as given (`internal`: none): skiff
    /// signs with security keys only through ssh-agent and names it in the
    /// `ssh-add` command it suggests for a key file it cannot use.
    pub security_key_provider: Option<String>,
    /// `RequiredRSASize`: the fewest bits an RSA host key or identity may
    /// have (default 1024, as ssh).
    pub required_rsa_size: u32,
    /// `ForwardAgent` (`-A`): the agent socket to offer the server's
    /// sessions (`yes`: SSH_AUTH_SOCK's); None: no forwarding.
    pub forward_agent: Option<PathBuf>,
    pub user_known_hosts: Vec<PathBuf>,
    pub global_known_hosts: Vec<PathBuf>,
    pub strict_host_key_checking: StrictHostKeyChecking,
    pub hash_known_hosts: bool,
    /// `UpdateHostKeys`: learn the host keys the server announces after
    /// login (see [`crate::host_key_update`]). Default, as ssh: `Yes`
    /// unless `UserKnownHostsFile` is set (skiff never verifies host keys
    /// through DNS, ssh's other reason to default to `No`).
    pub update_host_keys: skiff_proto::ssh_config::UpdateHostKeys,
    /// `HostKeyAlias`: the name host keys are looked up and recorded under.
    pub host_key_alias: Option<String>,
    /// `RevokedHostKeys`: files of host keys and host certificates refused
    /// whatever known_hosts says (revoked in any one: refused).
    pub revoked_host_keys: Vec<PathBuf>,
    /// `KnownHostsCommand`, with the connection's tokens expanded and the
    /// key's (`%H %I %K %k %t %f`) left for [`crate::hostkeys`].
    pub known_hosts_command: Option<String>,
    /// `ProxyCommand` / `ProxyJump`: how to reach the host when not
    /// directly.
    pub proxy: Option<Proxy>,
    /// Key exchange, host key, cipher and MAC algorithms, in preference order.
    pub algorithms: skiff_proto::algorithms::Algorithms,
    pub connect_timeout: Duration,
    /// `AddressFamily` (`-4`, `-6`).
    pub address_family: skiff_proto::ssh_config::AddressFamily,
    /// `BindAddress` (`-b`): the local address to connect from.
    pub bind_address: Option<std::net::IpAddr>,
    /// `BindInterface` (`-B`): connect from this interface's address.
    pub bind_interface: Option<String>,
    pub server_alive_interval: Option<Duration>,
    pub server_alive_count_max: usize,
    pub batch_mode: bool,
    /// `Compression` (ssh's `-C`): delayed zlib asked for ahead of none.
    pub compression: bool,
    /// A connection of a fan-out (`skiff run`, see [`Resolver::for_fan_out`]):
    /// host-key questions are refused as under BatchMode, while a key's
    /// passphrase may still be asked for, once for all hosts, with the time
    /// spent typing it left out of the authentication deadline.
    pub fan_out: bool,
    /// `PubkeyAuthentication` (default yes).
    pub pubkey_authentication: bool,
    /// `PasswordAuthentication` (default yes, as ssh).
    pub password_authentication: bool,
    /// `KbdInteractiveAuthentication` (default yes, as ssh).
    pub kbd_interactive_authentication: bool,
    /// Set on a connection whose host key is not the one known for the
    /// host, let through by `StrictHostKeyChecking no`: no password or
    /// keyboard-interactive answer goes to it (see
    /// [`ConnectSettings::guarded_for_a_changed_host_key`]).
    pub host_key_mismatched: bool,
    /// `PreferredAuthentications`: the methods in the order tried (default
    /// publickey, keyboard-interactive, password).
    pub preferred_authentications: Vec<crate::password_auth::AuthMethod>,
    /// `NumberOfPasswordPrompts` (default 3): tries of a password or of
    /// keyboard-interactive answers.
    pub number_of_password_prompts: u32,
    /// Where `RefuseConnection yes` was set for this host: connecting is
    /// then an error.
    pub refused_by: Option<String>,
    /// `RequestTTY` (default `auto`: a terminal for a login shell run from one).
    pub request_tty: skiff_proto::ssh_config::RequestTty,
    /// `RemoteCommand`, tokens expanded: run when no command is given.
    pub remote_command: Option<String>,
    /// `StdinNull`: read no input (as `-n`).
    pub stdin_null: bool,
    /// `LocalCommand`, tokens expanded, when `PermitLocalCommand yes`
    /// (else None): run locally once the session's connection is up.
    pub local_command: Option<String>,
    /// `SessionType` (default: a command or the login shell).
    pub session_type: skiff_proto::ssh_config::SessionType,
    /// Whether informational notices (such as "Permanently added ... to the
    /// list of known hosts") are shown: not at `LogLevel` QUIET, FATAL or ERROR.
    pub show_notices: bool,
    pub send_env: Vec<String>,
    pub set_env: Vec<(String, String)>,
    /// How long a pooled connection may stay idle (None: the agent's default).
    pub control_persist: Option<skiff_proto::ssh_config::ControlPersist>,
    /// `LocalForward`, `RemoteForward`, `DynamicForward` (set up by `skiff
    /// ssh` only: `skiff exec` and `skiff run` do not forward).
    pub forwards: Vec<skiff_proto::forward_spec::ForwardSpec>,
    /// `ClearAllForwardings`: no forwarding at all, the command line's too.
    pub clear_all_forwardings: bool,
    /// `ExitOnForwardFailure`: a forwarding that cannot be set up ends the
    /// program (else it is a warning).
    pub exit_on_forward_failure: bool,
    /// `GatewayPorts`: local forwardings without a bind address listen on
    /// every address instead of loopback.
    pub gateway_ports: bool,
    /// `StreamLocalBindMask` (default 0177): mode bits a local
    /// forwarding's Unix socket does not get.
    pub stream_local_bind_mask: u32,
    /// `StreamLocalBindUnlink`: a local forwarding replaces an existing
    /// socket file at its path.
    pub stream_local_bind_unlink: bool,
    /// `AddKeysToAgent`: whether a key read from a file is handed to
    /// ssh-agent once it has signed in.
    pub add_keys_to_agent: skiff_proto::ssh_config::AddKeysToAgent,
    /// `EscapeChar` (default `~`): starts an escape sequence in a session
    /// with a terminal.
    pub escape_char: skiff_proto::escape::EscapeChar,
    /// Keywords skiff accepts but does not act on, with where they were set (for -v).
    pub ignored: Vec<(String, String)>,
}

/// How to reach a host other than by a direct TCP connection.
#[derive(Debug, Clone)]
pub enum Proxy {
    /// A shell command (tokens expanded) whose standard input and output
    /// carry the connection.
    Command(String),
    /// A `direct-tcpip` channel through an SSH connection to this jump host
    /// (which may itself be reached through a proxy).
    Jump(Box<ConnectSettings>),
}

/// Most jump hosts one connection may pass through (a guard against
/// configurations whose jump hosts jump through each other).
pub const MAX_JUMPS: usize = 8;

impl ConnectSettings {
    /// These settings for a connection whose host key is not the one
    /// known for the host, let through by `StrictHostKeyChecking no` (as
    /// ssh does then): no password or keyboard-interactive answer goes to
    /// it, no agent is forwarded to it, and it teaches no host keys (no
    /// port is forwarded through it either: see
    /// [`crate::Connection::allows_forwarding`]). Also returns what was
    /// turned off, one line each, for the person to see.
    pub(crate) fn guarded_for_a_changed_host_key(&self) -> (ConnectSettings, Vec<String>) {
        let mut guarded = self.clone();
        guarded.host_key_mismatched = true;
        let mut said = Vec::new();
        let mut off = |on: bool, what: &str| {
            if on {
                said.push(format!(
                    "{what} is disabled to avoid man-in-the-middle attacks."
                ));
            }
        };
        off(self.password_authentication, "Password authentication");
        off(
            self.kbd_interactive_authentication,
            "Keyboard-interactive authentication",
        );
        off(self.forward_agent.is_some(), "Agent forwarding");
        guarded.forward_agent = None;
        guarded.update_host_keys = skiff_proto::ssh_config::UpdateHostKeys::No;
        (guarded, said)
    }

    /// These settings without the resolver's identity cache (jump hosts'
    /// included) and fan-out gate, for keeping beside a live connection.
    pub(crate) fn without_identity_cache(&self) -> ConnectSettings {
        let mut kept = self.clone();
        kept.identity_cache = None;
        kept.pre_auth_gate = None;
        if let Some(Proxy::Jump(hop)) = &kept.proxy {
            kept.proxy = Some(Proxy::Jump(Box::new(hop.without_identity_cache())));
        }
        kept
    }

    /// The fan-out's gate on connections on their way to authentication,
    /// if these settings belong to a fan-out: a copy's data-plane streams,
    /// which a server counts like logins until it sees what they are, pass
    /// through it too.
    pub fn pre_auth_gate(&self) -> Option<Arc<crate::busy::Gate>> {
        self.pre_auth_gate.clone()
    }

    /// How long a transfer may go without any byte moving or any message
    /// arriving before it is given up: the keepalive budget
    /// (`ServerAliveInterval` × `ServerAliveCountMax`, 45 s by default);
    /// `None` when keepalives are off, as ssh then waits for ever.
    pub fn progress_budget(&self) -> Option<Duration> {
        self.server_alive_interval
            .map(|i| i.saturating_mul(self.server_alive_count_max.max(1) as u32))
    }

    /// The host and port host keys are looked up and recorded under:
    /// `HostKeyAlias` (without a port, as ssh does), else the host name and
    /// port.
    pub fn host_key_name(&self) -> (&str, u16) {
        match &self.host_key_alias {
            Some(alias) => (alias, skiff_proto::known_hosts::DEFAULT_PORT),
            None => (&self.hostname, self.port),
        }
    }
}

/// Default connect timeout when ConnectTimeout is unset: a dead address must
/// not hang the client for the kernel's two-minute SYN retry budget.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default keepalive when ServerAliveInterval is unset, so that a peer that
/// vanished is noticed after about a minute instead of never.
pub const DEFAULT_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// One field of the passwd entry for our uid.
fn passwd_field(field: fn(&libc::passwd) -> *const libc::c_char) -> Option<String> {
    // SAFETY: getpwuid returns a pointer into static storage or null; the
    // field pointer is read before any other passwd call can overwrite it.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if pw.is_null() {
            return None;
        }
        let ptr = field(&*pw);
        if ptr.is_null() {
            return None;
        }
        let value = std::ffi::CStr::from_ptr(ptr).to_string_lossy().into_owned();
        (!value.is_empty()).then_some(value)
    }
}

/// The user's home directory: `$HOME`, else the passwd entry.
pub fn home_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    passwd_field(|pw| pw.pw_dir).map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// The local user name: passwd entry for our uid, else `$USER`.
pub fn local_user() -> String {
    passwd_field(|pw| pw.pw_name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// The user's login shell from the passwd database (what an SSH server runs).
pub fn login_shell() -> String {
    passwd_field(|pw| pw.pw_shell).unwrap_or_else(|| "/bin/sh".into())
}

fn local_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Whether `name` resolves to an address, for `CanonicalizeHostname`.
fn name_resolves(name: &str) -> bool {
    use std::net::ToSocketAddrs;
    (name, 0u16)
        .to_socket_addrs()
        .is_ok_and(|mut addrs| addrs.next().is_some())
}

/// Refuses a host or user name from the command line that a `%`-token
/// would put into a shell command as shell syntax (`host;rm -rf ~`).
fn check_shell_safe(dest: &Destination) -> Result<(), String> {
    if !ssh_config::shell_safe_name(&dest.host) {
        return Err(format!(
            "the host name {:?} has characters a shell command would run; refusing to run one with it",
            dest.host
        ));
    }
    match &dest.user {
        Some(user) if !ssh_config::shell_safe_name(user) => Err(format!(
            "the user name {user:?} has characters a shell command would run; refusing to run one with it"
        )),
        _ => Ok(()),
    }
}

/// `LocalCommand` with its tokens expanded: those of other commands, and
/// `%C` (the connection hash), `%j` (`ProxyJump`), `%k` (`HostKeyAlias`,
/// else the host) and `%T` (`NONE`: skiff opens no tunnel device).
fn local_command(
    command: &str,
    tokens: &TokenContext,
    cfg: &HostConfig,
) -> Result<String, SkiffError> {
    let jump = match &cfg.proxy {
        Some(ProxySpec::Jump(hops)) => hops.as_str(),
        _ => "",
    };
    let alias = cfg.host_key_alias.as_deref().unwrap_or(&tokens.host);
    let hash = ssh_config::connection_hash(
        &tokens.local_hostname,
        &tokens.host,
        tokens.port,
        &tokens.remote_user,
        jump,
    );
    ssh_config::expand_tokens_keeping(command, tokens, "CjkT")
        .and_then(|c| {
            ssh_config::expand_late_tokens(
                &c,
                &[('C', &hash), ('j', jump), ('k', alias), ('T', "NONE")],
            )
        })
        .map_err(|e| {
            SkiffError::new(
                ErrorKind::Config,
                format!("bad LocalCommand {command:?}: {e}"),
            )
        })
}

fn config_error(e: ConfigError) -> SkiffError {
    SkiffError::new(ErrorKind::Config, format!("bad configuration: {e}"))
}

/// Reads and parses one config file; a missing file is `Ok(None)`.
fn read_config(path: &Path) -> Result<Option<ConfigFile>, SkiffError> {
    match std::fs::read_to_string(path) {
        Ok(text) => ssh_config::parse(&path.display().to_string(), &text)
            .map(Some)
            .map_err(config_error),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SkiffError::new(
            ErrorKind::Config,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

/// Expands one `Include` argument to the files it names, in lexical order.
/// Relative paths are taken from ~/.ssh for user files and /etc/ssh for system ones.
fn include_files(arg: &str, from_label: &str, home: &Path) -> Result<Vec<ConfigFile>, ConfigError> {
    let expanded = if let Some(rest) = arg.strip_prefix("~/") {
        home.join(rest)
    } else if arg == "~" {
        home.to_path_buf()
    } else if arg.starts_with('/') {
        PathBuf::from(arg)
    } else if from_label.starts_with("/etc/ssh") {
        Path::new("/etc/ssh").join(arg)
    } else {
        home.join(".ssh").join(arg)
    };
    let mut paths = skiff_files::glob_paths(&expanded);
    paths.sort();
    let mut files = Vec::new();
    for p in paths {
        match std::fs::read_to_string(&p) {
            Ok(text) => files.push(ssh_config::parse(&p.display().to_string(), &text)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {}
            Err(e) => {
                return Err(ConfigError {
                    file: from_label.to_string(),
                    line: 0,
                    message: format!("cannot read included file {}: {e}", p.display()),
                })
            }
        }
    }
    Ok(files)
}

/// The parts of a client process's environment that configuration depends on.
/// The agent resolves settings for many CLI processes, so it cannot use its own.
#[derive(Debug, Clone, Default)]
pub struct ClientEnv {
    pub vars: Vec<(String, String)>,
}

impl ClientEnv {
    /// The variables settings resolution reads, taken from this process.
    pub const NAMES: [&'static str; 3] = ["HOME", "SSH_AUTH_SOCK", "USER"];

    pub fn from_process() -> Self {
        let vars = Self::NAMES
            .iter()
            .filter_map(|n| std::env::var(n).ok().map(|v| (n.to_string(), v)))
            .collect();
        ClientEnv { vars }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// Resolves the settings for `dest`, reading configuration from the usual places.
pub fn resolve(dest: &Destination) -> Result<ConnectSettings, SkiffError> {
    resolve_for(dest, &ClientEnv::from_process())
}

/// Like [`resolve`], for a client whose environment is `env`.
pub fn resolve_for(dest: &Destination, env: &ClientEnv) -> Result<ConnectSettings, SkiffError> {
    Resolver::new(dest.config_file.as_deref(), &dest.options, env)?.resolve(dest)
}

/// Like [`resolve`], with the configuration the settings were made from,
/// values as written (`ssh -G` prints some keywords that way: the
/// `IdentityFile`s with their `%` tokens, `ProxyJump` as given).
pub fn resolve_with_config(
    dest: &Destination,
) -> Result<(ConnectSettings, HostConfig), SkiffError> {
    let resolver = Resolver::new(
        dest.config_file.as_deref(),
        &dest.options,
        &ClientEnv::from_process(),
    )?;
    let cfg = resolver.host_config(dest, &resolver.files)?;
    let settings = resolver.settle_hops(dest, cfg.clone(), 0)?;
    Ok((settings, cfg))
}

/// Settings for many destinations that share the configuration files and
/// `-o` options (a fan-out): the files are read and parsed once.
pub struct Resolver {
    files: Vec<ConfigFile>,
    options: Vec<String>,
    config_file: Option<PathBuf>,
    home: PathBuf,
    local_user: String,
    local_hostname: String,
    uid: u32,
    env: ClientEnv,
    /// Shared by every connection resolved here.
    identity_cache: Arc<IdentityCache>,
    /// See [`ConnectSettings::fan_out`].
    fan_out: bool,
    /// Shared by every connection resolved here, in a fan-out.
    pre_auth_gate: Option<Arc<crate::busy::Gate>>,
}

impl Resolver {
    /// Reads `config_file` (or ~/.ssh/config and /etc/ssh/ssh_config) and
    /// parses `options`.
    pub fn new(
        config_file: Option<&Path>,
        options: &[String],
        env: &ClientEnv,
    ) -> Result<Self, SkiffError> {
        let home = env.get("HOME").map_or_else(home_dir, PathBuf::from);
        let mut files = vec![ssh_config::parse_options(options).map_err(config_error)?];
        match config_file {
            Some(p) if p.as_os_str() == "none" => {}
            Some(p) => files.push(read_config(p)?.ok_or_else(|| {
                SkiffError::new(
                    ErrorKind::Config,
                    format!("cannot read config file {}: no such file", p.display()),
                )
            })?),
            None => {
                files.extend(read_config(&home.join(".ssh/config"))?);
                files.extend(read_config(Path::new("/etc/ssh/ssh_config"))?);
            }
        }
        Ok(Resolver {
            files,
            options: options.to_vec(),
            config_file: config_file.map(Path::to_path_buf),
            home,
            local_user: local_user(),
            local_hostname: local_hostname(),
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            env: env.clone(),
            identity_cache: Arc::default(),
            fan_out: false,
            pre_auth_gate: None,
        })
    }

    /// Makes every connection resolved here one of a fan-out (see
    /// [`ConnectSettings::fan_out`]), sharing one [`crate::busy::Gate`].
    pub fn for_fan_out(mut self) -> Self {
        self.fan_out = true;
        self.pre_auth_gate.get_or_insert_with(Arc::default);
        self
    }

    /// Makes every connection resolved here (jump hosts' aside) pass
    /// through `gate`, with the other connections that share it: how the
    /// agent keeps the connections it makes for one client process, such as
    /// a `skiff cp` to a node set, from crowding a busy server.
    pub fn sharing_pre_auth_gate(mut self, gate: Arc<crate::busy::Gate>) -> Self {
        self.pre_auth_gate = Some(gate);
        self
    }

    /// The settings for `dest`, whose `config_file` and `options` must be
    /// the ones this resolver was made with.
    pub fn resolve(&self, dest: &Destination) -> Result<ConnectSettings, SkiffError> {
        debug_assert!(dest.options == self.options && dest.config_file == self.config_file);
        self.resolve_in(dest, &self.files, 0)
    }

    /// The settings for `dest` from `files`; `jumps` is how many jump
    /// hosts lead to it.
    fn resolve_in(
        &self,
        dest: &Destination,
        files: &[ConfigFile],
        jumps: usize,
    ) -> Result<ConnectSettings, SkiffError> {
        let cfg = self.host_config(dest, files)?;
        self.settle_hops(dest, cfg, jumps)
    }

    /// The configuration `files` give `dest`.
    fn host_config(
        &self,
        dest: &Destination,
        files: &[ConfigFile],
    ) -> Result<HostConfig, SkiffError> {
        let ctx = MatchContext {
            original_host: dest.host.to_ascii_lowercase(),
            host: dest.host.to_ascii_lowercase(),
            remote_user: dest.user.clone(),
            local_user: self.local_user.clone(),
        };
        let cfg = ssh_config::resolve_with_exec(
            files,
            &ctx,
            &mut |arg, from| include_files(arg, from, &self.home),
            &mut name_resolves,
            &mut |probe| self.match_exec(dest, probe),
        )
        .map_err(config_error)?;
        if let Some(host) = &cfg.unresolved {
            return Err(SkiffError::new(
                ErrorKind::Connect,
                format!("could not resolve host \"{host}\" in any of CanonicalDomains (CanonicalizeFallbackLocal no)"),
            ));
        }
        Ok(cfg)
    }

    /// Runs a `Match exec` command for `dest`, its tokens expanded with
    /// what the configuration has settled so far.
    fn match_exec(
        &self,
        dest: &Destination,
        probe: &ssh_config::MatchExec<'_>,
    ) -> Result<bool, String> {
        check_shell_safe(dest)?;
        let host = probe.host.to_ascii_lowercase();
        let port = dest.port.or(probe.port).unwrap_or(22);
        let tokens = TokenContext {
            host: host.clone(),
            original_host: probe.original_host.to_string(),
            remote_user: probe.user.to_string(),
            local_user: self.local_user.clone(),
            port,
            home: self.home.to_string_lossy().into_owned(),
            local_hostname: self.local_hostname.clone(),
            uid: self.uid,
        };
        let hash = ssh_config::connection_hash(&self.local_hostname, &host, port, probe.user, "");
        let command = ssh_config::expand_tokens_keeping(probe.command, &tokens, "Ck")
            .and_then(|c| ssh_config::expand_late_tokens(&c, &[('C', &hash), ('k', &host)]))?;
        crate::local_command::match_exec(&command)
    }

    /// The settings for `dest` from its configuration `cfg`, its jump hosts
    /// resolved; `jumps` is how many jump hosts lead to it.
    fn settle_hops(
        &self,
        dest: &Destination,
        cfg: HostConfig,
        jumps: usize,
    ) -> Result<ConnectSettings, SkiffError> {
        let jump = match &cfg.proxy {
            Some(ProxySpec::Jump(hops)) => Some(hops.clone()),
            _ => None,
        };
        let mut settings = self.settle(dest, cfg)?;
        if jumps > 0 {
            // A jump host is connected to inside its destination's place
            // in the gate.
            settings.pre_auth_gate = None;
        }
        if let Some(hops) = jump {
            settings.proxy = Some(Proxy::Jump(Box::new(self.jump_chain(&hops, jumps)?)));
        }
        Ok(settings)
    }

    /// The last of the `ProxyJump` hops in `value`, reached through the
    /// ones before it. Each hop takes its settings from the configuration
    /// files (not from `-o` or `-i`, which are for the destination, as with
    /// ssh); the first hop may have a proxy of its own.
    fn jump_chain(&self, value: &str, jumps: usize) -> Result<ConnectSettings, SkiffError> {
        let hops = ssh_config::parse_jump_hosts(value)
            .map_err(|e| SkiffError::new(ErrorKind::Config, format!("ProxyJump: {e}")))?;
        let mut via: Option<ConnectSettings> = None;
        for (n, hop) in hops.iter().enumerate() {
            if jumps + n >= MAX_JUMPS {
                return Err(SkiffError::new(
                    ErrorKind::Config,
                    format!(
                        "ProxyJump: more than {MAX_JUMPS} jump hosts on the way to {}; do the jump hosts' own ProxyJump settings loop?",
                        hop.host
                    ),
                ));
            }
            let dest = Destination {
                host: hop.host.clone(),
                user: hop.user.clone(),
                port: hop.port,
                identity_files: Vec::new(),
                config_file: self.config_file.clone(),
                options: Vec::new(),
            };
            // files[0] holds the -o options.
            let mut settings = self.resolve_in(&dest, &self.files[1..], jumps + n + 1)?;
            if let Some(previous) = via.take() {
                settings.proxy = Some(Proxy::Jump(Box::new(previous)));
            }
            via = Some(settings);
        }
        via.ok_or_else(|| SkiffError::new(ErrorKind::Config, "ProxyJump: no jump host"))
    }
}

impl Resolver {
    /// The settings for `dest` from its resolved configuration `cfg`.
    fn settle(&self, dest: &Destination, cfg: HostConfig) -> Result<ConnectSettings, SkiffError> {
        let (home, local_user, env) = (self.home.as_path(), self.local_user.as_str(), &self.env);
        let hostname = cfg
            .hostname
            .clone()
            .unwrap_or_else(|| dest.host.clone())
            .to_ascii_lowercase();
        let port = dest.port.or(cfg.port).unwrap_or(22);
        let user = dest
            .user
            .clone()
            .or(cfg.user.clone())
            .unwrap_or_else(|| local_user.to_string());
        let tokens = TokenContext {
            host: hostname.clone(),
            original_host: dest.host.clone(),
            remote_user: user.clone(),
            local_user: local_user.to_string(),
            port,
            home: home.to_string_lossy().into_owned(),
            local_hostname: self.local_hostname.clone(),
            uid: self.uid,
        };
        let expand = |s: &str| -> Result<PathBuf, SkiffError> {
            ssh_config::expand_tokens(s, &tokens)
                .map(PathBuf::from)
                .map_err(|e| {
                    SkiffError::new(
                        ErrorKind::Config,
                        format!("bad path {s:?} in configuration: {e}"),
                    )
                })
        };

        let mut identity_files = dest.identity_files.clone();
        for f in &cfg.identity_files {
            identity_files.push(expand(f)?);
        }
        let certificate_files = cfg
            .certificate_files
            .iter()
            .map(|f| expand(f))
            .collect::<Result<Vec<_>, _>>()?;
        let default_identities = identity_files.is_empty();
        if default_identities {
            for name in [
                "id_rsa",
                "id_ecdsa",
                "id_ecdsa_sk",
                "id_ed25519",
                "id_ed25519_sk",
            ] {
                identity_files.push(home.join(".ssh").join(name));
            }
        }

        // `$VAR`: the client's variable (the agent carries the CLI's), else ours.
        let from_env = |name: &str| {
            env.get(name).map(PathBuf::from).or_else(|| {
                std::env::var_os(name)
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
            })
        };
        let identity_agent = match cfg.identity_agent.as_deref() {
            Some("none") => None,
            Some("SSH_AUTH_SOCK") | None => env.get("SSH_AUTH_SOCK").map(PathBuf::from),
            Some(v) if v.starts_with('$') => from_env(&v[1..]),
            Some(v) => Some(expand(v)?),
        };
        let forward_agent = match cfg.forward_agent.as_deref() {
            None | Some("no") => None,
            Some("yes") => env.get("SSH_AUTH_SOCK").map(PathBuf::from),
            Some(v) if v.starts_with('$') => from_env(&v[1..]),
            Some(v) => Some(expand(v)?),
        };

        let user_known_hosts = match &cfg.user_known_hosts_files {
            Some(list) => list.iter().map(|f| expand(f)).collect::<Result<_, _>>()?,
            None => vec![
                home.join(".ssh/known_hosts"),
                home.join(".ssh/known_hosts2"),
            ],
        };
        let global_known_hosts = match &cfg.global_known_hosts_files {
            Some(list) => list.iter().map(|f| expand(f)).collect::<Result<_, _>>()?,
            None => vec![
                PathBuf::from("/etc/ssh/ssh_known_hosts"),
                PathBuf::from("/etc/ssh/ssh_known_hosts2"),
            ],
        };

        let alive = match cfg.server_alive_interval {
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
            None => Some(DEFAULT_ALIVE_INTERVAL),
        };

        Ok(ConnectSettings {
            identity_cache: Some(self.identity_cache.clone()),
            pre_auth_gate: self.pre_auth_gate.clone(),
            hostname,
            original_host: dest.host.clone(),
            port,
            user,
            identity_files,
            certificate_files,
            identities_only: cfg.identities_only.unwrap_or(false),
            identity_agent,
            security_key_provider: cfg
                .security_key_provider
                .clone()
                .filter(|p| p != "internal"),
            forward_agent,
            required_rsa_size: cfg.required_rsa_size.unwrap_or(1024),
            user_known_hosts,
            global_known_hosts,
            strict_host_key_checking: cfg
                .strict_host_key_checking
                .unwrap_or(StrictHostKeyChecking::AcceptNew),
            hash_known_hosts: cfg.hash_known_hosts.unwrap_or(false),
            update_host_keys: cfg
                .update_host_keys
                .unwrap_or(match cfg.user_known_hosts_files {
                    None => skiff_proto::ssh_config::UpdateHostKeys::Yes,
                    Some(_) => skiff_proto::ssh_config::UpdateHostKeys::No,
                }),
            host_key_alias: cfg.host_key_alias.clone(),
            revoked_host_keys: match cfg.revoked_host_keys.as_deref() {
                None => Vec::new(),
                Some([none]) if none == "none" => Vec::new(),
                Some(files) => files.iter().map(|f| expand(f)).collect::<Result<_, _>>()?,
            },
            algorithms: {
                let d = skiff_proto::algorithms::Algorithms::default();
                skiff_proto::algorithms::Algorithms {
                    kex: cfg.kex_algorithms.clone().unwrap_or(d.kex),
                    host_key: cfg.host_key_algorithms.clone().unwrap_or(d.host_key),
                    ciphers: cfg.ciphers.clone().unwrap_or(d.ciphers),
                    macs: cfg.macs.clone().unwrap_or(d.macs),
                    ca_signature: cfg
                        .ca_signature_algorithms
                        .clone()
                        .unwrap_or(d.ca_signature),
                }
            },
            known_hosts_command: match cfg.known_hosts_command.clone().flatten() {
                Some(command) => Some(
                    ssh_config::expand_tokens_keeping(&command, &tokens, "HIKktf").map_err(
                        |e| {
                            SkiffError::new(
                                ErrorKind::Config,
                                format!("bad KnownHostsCommand {command:?}: {e}"),
                            )
                        },
                    )?,
                ),
                None => None,
            },
            proxy: match &cfg.proxy {
                Some(ProxySpec::Command(command)) => Some(Proxy::Command({
                    // Its tokens reach a shell, as LocalCommand's do.
                    check_shell_safe(dest).map_err(|e| {
                        SkiffError::new(ErrorKind::Config, format!("ProxyCommand: {e}"))
                    })?;
                    ssh_config::expand_tokens(command, &tokens).map_err(|e| {
                        SkiffError::new(
                            ErrorKind::Config,
                            format!("bad ProxyCommand {command:?}: {e}"),
                        )
                    })?
                })),
                // Jump hosts are resolved by the caller, which has the files.
                _ => None,
            },
            address_family: cfg.address_family.unwrap_or_default(),
            bind_address: cfg.bind_address,
            bind_interface: cfg.bind_interface.clone(),
            connect_timeout: cfg
                .connect_timeout
                .filter(|&s| s > 0)
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            server_alive_interval: alive,
            server_alive_count_max: cfg.server_alive_count_max.unwrap_or(3).max(1) as usize,
            batch_mode: cfg.batch_mode.unwrap_or(false),
            compression: cfg.compression.unwrap_or(false),
            fan_out: self.fan_out,
            pubkey_authentication: cfg.pubkey_authentication.unwrap_or(true),
            password_authentication: cfg.password_authentication.unwrap_or(true),
            kbd_interactive_authentication: cfg.kbd_interactive_authentication.unwrap_or(true),
            host_key_mismatched: false,
            preferred_authentications: crate::password_auth::method_order(
                cfg.preferred_authentications.as_deref(),
            ),
            number_of_password_prompts: cfg.number_of_password_prompts.unwrap_or(3),
            refused_by: cfg
                .refuse_connection
                .clone()
                .and_then(|(refuse, at)| refuse.then_some(at)),
            remote_command: match cfg.remote_command.clone().flatten() {
                Some(command) => {
                    Some(ssh_config::expand_tokens(&command, &tokens).map_err(|e| {
                        SkiffError::new(
                            ErrorKind::Config,
                            format!("bad RemoteCommand {command:?}: {e}"),
                        )
                    })?)
                }
                None => None,
            },
            stdin_null: cfg.stdin_null.unwrap_or(false),
            local_command: match (&cfg.local_command, cfg.permit_local_command) {
                (Some(command), Some(true)) => {
                    check_shell_safe(dest).map_err(|e| {
                        SkiffError::new(ErrorKind::Config, format!("LocalCommand: {e}"))
                    })?;
                    Some(local_command(command, &tokens, &cfg)?)
                }
                _ => None,
            },
            session_type: cfg
                .session_type
                .unwrap_or(skiff_proto::ssh_config::SessionType::Default),
            request_tty: cfg
                .request_tty
                .unwrap_or(skiff_proto::ssh_config::RequestTty::Auto),
            show_notices: !matches!(cfg.log_level.as_deref(), Some("QUIET" | "FATAL" | "ERROR")),
            send_env: cfg.send_env.clone(),
            set_env: cfg.set_env.clone(),
            control_persist: cfg.control_persist,
            forwards: cfg.forwards.clone(),
            clear_all_forwardings: cfg.clear_all_forwardings.unwrap_or(false),
            exit_on_forward_failure: cfg.exit_on_forward_failure.unwrap_or(false),
            gateway_ports: cfg.gateway_ports.unwrap_or(false),
            stream_local_bind_mask: cfg.stream_local_bind_mask.unwrap_or(0o177),
            stream_local_bind_unlink: cfg.stream_local_bind_unlink.unwrap_or(false),
            escape_char: cfg.escape_char.unwrap_or_default(),
            add_keys_to_agent: cfg
                .add_keys_to_agent
                .unwrap_or(skiff_proto::ssh_config::AddKeysToAgent::No),
            ignored: cfg.ignored.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_include_expands_in_lexical_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("conf.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("b.conf"), "Host b\n  Port 2\n").unwrap();
        std::fs::write(d.join("a.conf"), "Host a\n  Port 1\n").unwrap();
        std::fs::write(d.join(".hidden.conf"), "Bogus line\n").unwrap();
        let files = include_files(&format!("{}/*.conf", d.display()), "x", dir.path()).unwrap();
        let labels: Vec<_> = files.iter().map(|f| f.label().to_string()).collect();
        assert_eq!(labels.len(), 2);
        assert!(
            labels[0].ends_with("a.conf") && labels[1].ends_with("b.conf"),
            "{labels:?}"
        );
    }

    #[test]
    fn resolves_alias_with_tokens_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "Host web\n  HostName 127.0.0.1\n  Port 2200\n  User deploy\n  IdentityFile ~/keys/%r@%h\n\
             UserKnownHostsFile %d/kh/%h_%p\n",
        )
        .unwrap();
        let dest = Destination {
            host: "web".into(),
            config_file: Some(cfg),
            ..Default::default()
        };
        let s = resolve(&dest).unwrap();
        assert_eq!(
            (s.hostname.as_str(), s.port, s.user.as_str()),
            ("127.0.0.1", 2200, "deploy")
        );
        let home = home_dir();
        assert_eq!(s.identity_files, vec![home.join("keys/deploy@127.0.0.1")]);
        assert_eq!(s.user_known_hosts, vec![home.join("kh/127.0.0.1_2200")]);
        assert_eq!(s.strict_host_key_checking, StrictHostKeyChecking::AcceptNew);
    }

    #[test]
    fn command_line_options_win_and_errors_name_the_line() {
        let dest = Destination {
            host: "h".into(),
            config_file: Some("none".into()),
            options: vec!["Port=2022".into(), "Port 9".into()],
            ..Default::default()
        };
        assert_eq!(resolve(&dest).unwrap().port, 2022);
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(&cfg, "Host *\n  Port notanumber\n").unwrap();
        let dest = Destination {
            host: "h".into(),
            config_file: Some(cfg.clone()),
            ..Default::default()
        };
        let err = resolve(&dest).unwrap_err().to_string();
        assert!(err.contains(&format!("{}:2", cfg.display())), "{err}");
    }

    #[test]
    fn jump_hosts_chain_from_the_config_and_proxy_commands_expand() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "Host db\n  HostName 10.0.0.5\n  ProxyJump me@outer:2201,inner\n\
             Host outer\n  HostName 192.0.2.1\n  ProxyCommand nc -X connect %h %p\n\
             Host inner\n  User ops\n  IdentityFile ~/inner-key\n\
             Host web\n  ProxyCommand ssh -W %h:%p -l %r gw\n",
        )
        .unwrap();
        let dest = |host: &str, options: Vec<String>| Destination {
            host: host.into(),
            user: Some("admin".into()),
            config_file: Some(cfg.clone()),
            options,
            ..Default::default()
        };
        // -o options are for the destination only.
        let s = resolve(&dest("db", vec!["Port=2022".into()])).unwrap();
        assert_eq!((s.hostname.as_str(), s.port), ("10.0.0.5", 2022));
        let Some(Proxy::Jump(inner)) = &s.proxy else {
            panic!("{:?}", s.proxy)
        };
        assert_eq!(
            (inner.hostname.as_str(), inner.port, inner.user.as_str()),
            ("inner", 22, "ops")
        );
        assert_eq!(inner.identity_files, vec![home_dir().join("inner-key")]);
        let Some(Proxy::Jump(outer)) = &inner.proxy else {
            panic!("{:?}", inner.proxy)
        };
        assert_eq!(
            (outer.hostname.as_str(), outer.port, outer.user.as_str()),
            ("192.0.2.1", 2201, "me")
        );
        let Some(Proxy::Command(command)) = &outer.proxy else {
            panic!("{:?}", outer.proxy)
        };
        assert_eq!(command, "nc -X connect 192.0.2.1 2201");
        let s = resolve(&dest("web", vec![])).unwrap();
        let Some(Proxy::Command(command)) = &s.proxy else {
            panic!("{:?}", s.proxy)
        };
        assert_eq!(command, "ssh -W web:22 -l admin gw");
        // -J on the command line wins over the file.
        let s = resolve(&dest("web", vec!["ProxyJump=inner".into()])).unwrap();
        assert!(matches!(&s.proxy, Some(Proxy::Jump(j)) if j.hostname == "inner"));
        // A name that would be shell syntax in the command is refused.
        let mut d = dest("web", vec!["ProxyCommand=nc %h %p".into()]);
        d.host = "web;touch /tmp/x".into();
        let err = resolve(&d).unwrap_err().to_string();
        assert!(err.contains("ProxyCommand: the host name"), "{err}");
        let mut d = dest("web", vec![]);
        d.user = Some("$(id)".into());
        let err = resolve(&d).unwrap_err().to_string();
        assert!(err.contains("ProxyCommand: the user name"), "{err}");
    }
}
