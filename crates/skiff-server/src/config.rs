//! skiffd settings and the parser for its configuration file.
//!
//! The file format is sshd_config's: one `Keyword value...` per line,
//! keywords case-insensitive, `#` comments, `Include` and `Match`, and, as
//! in sshd, the first value given for a keyword wins (repeatable keywords
//! such as `HostKey` accumulate). Parsing is pure (text in, settings or a
//! `file:line` error out) given the reader for `Include` files that
//! [`apply_config`] takes; [`apply_config_text`] reads them from disk. See
//! docs/skiffd-config.md for the keyword list.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use skiff_proto::algorithms;

use crate::match_block::{MatchBlock, MatchContext};

/// Default authorized_keys location, with `%h` (home) and `%u` (user) tokens.
pub const DEFAULT_AUTHORIZED_KEYS: &str = "%h/.ssh/authorized_keys";

/// Everything skiffd needs to know to serve connections.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: Vec<SocketAddr>,
    /// `AddressFamily`, as read (it has made `listen` already).
    pub address_family: AddressFamily,
    /// `ChannelTimeout`: how long each kind of channel (or, `global`, all
    /// of a connection's) may go without traffic before it is closed.
    pub channel_timeouts: crate::channel_timeout::ChannelTimeouts,
    /// `UnusedConnectionTimeout`: how long an authenticated connection may
    /// have no open channel before it is closed (`None`: no limit).
    pub unused_connection_timeout: Option<Duration>,
    /// What skiffd does instead of sshd keywords it accepts without acting
    /// on (`file:line: keyword: note`), for the log.
    pub config_notes: Vec<String>,
    /// `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`, `MACs`: names in
    /// preference order (see [`skiff_proto::algorithms`]'s `SERVER_*`).
    pub kex_algorithms: Vec<String>,
    pub host_key_algorithms: Vec<String>,
    pub ciphers: Vec<String>,
    pub macs: Vec<String>,
    /// `PubkeyAcceptedAlgorithms`: the signature algorithms user keys and
    /// certificates may use.
    pub pubkey_algorithms: Vec<String>,
    /// `PubkeyAuthOptions`: what every security-key signature must show
    /// (see [`crate::security_keys`]).
    pub pubkey_auth_options: crate::security_keys::PubkeyAuthOptions,
    /// `CASignatureAlgorithms`: what a user certificate's CA may have
    /// signed it with.
    pub ca_signature_algorithms: Vec<String>,
    pub host_keys: Vec<PathBuf>,
    /// Host certificates for some of the host keys (`HostCertificate`).
    pub host_certificates: Vec<PathBuf>,
    /// CA keys trusted to sign user certificates for every account
    /// (`TrustedUserCAKeys`).
    pub trusted_user_ca_keys: Option<PathBuf>,
    /// Path template (`%h`, `%u`) of the file listing the certificate
    /// principals an account admits (`AuthorizedPrincipalsFile`).
    pub authorized_principals_file: Option<String>,
    /// Files of public keys that may never authenticate, nor sign
    /// certificates (`RevokedKeys`; a key in any of them is revoked).
    pub revoked_keys: Vec<PathBuf>,
    /// Path templates with `%h` and `%u` tokens, separated by spaces
    /// (`AuthorizedKeysFile`), or `none`. A path without tokens applies to
    /// every account.
    pub authorized_keys: String,
    /// `AuthorizedKeysCommand`: the program (absolute) and its argument
    /// templates (see [`crate::lookup_command`]).
    pub authorized_keys_command: Option<Vec<String>>,
    /// `AuthorizedKeysCommandUser`: who runs it.
    pub authorized_keys_command_user: Option<String>,
    /// `AuthorizedPrincipalsCommand` and its user, as for keys.
    pub authorized_principals_command: Option<Vec<String>>,
    pub authorized_principals_command_user: Option<String>,
    /// `AllowUsers`, `DenyUsers`, `AllowGroups`, `DenyGroups`, `PermitRootLogin`.
    pub access: crate::access::AccessRules,
    /// Environment variable name patterns a client may set (`LANG LC_*` by default).
    pub accept_env: Vec<String>,
    /// `SetEnv`: variables every session gets, over any other value.
    pub set_env: Vec<(String, String)>,
    /// `ExposeAuthInfo`: tell sessions how the login authenticated.
    pub expose_auth_info: bool,
    /// Honour `environment=` in authorized_keys.
    pub permit_user_environment: bool,
    /// `StrictModes`: account files, and the directories above them, must
    /// be writable by nobody but root and the account (see
    /// [`crate::account_files`]).
    pub strict_modes: bool,
    pub login_grace_time: Duration,
    pub max_auth_tries: usize,
    /// Unauthenticated connections allowed at once; further ones are dropped.
    pub max_startups: usize,
    /// `MaxStartups start:rate:full`: from `start` unauthenticated
    /// connections, new ones are dropped with a probability that starts at
    /// `rate`% and reaches 100% at `max_startups`.
    pub early_drop: Option<(usize, u32)>,
    /// `PerSourceMaxStartups`: unauthenticated connections allowed at once
    /// from one source network; `None`: no limit beyond `max_startups`.
    pub per_source_max_startups: Option<usize>,
    /// `PerSourceNetBlockSize`: which source addresses make one network.
    pub per_source_net_block: crate::startups::NetBlock,
    /// `PerSourcePenalties`: `None` (the default, see docs) is off.
    pub per_source_penalties: Option<crate::penalties::PenaltyPolicy>,
    /// Whether the configuration says `PerSourcePenalties` at all: without
    /// it, skiffd penalises password guessing only (when passwords are
    /// offered).
    pub per_source_penalties_set: bool,
    /// `PerSourcePenaltyExemptList`: address patterns never penalised.
    pub per_source_penalty_exempt: Vec<String>,
    pub max_sessions: usize,
    /// Interval of server keepalives to detect dead clients; `None` disables them.
    pub client_alive_interval: Option<Duration>,
    pub client_alive_count_max: usize,
    /// Command line (run through the account's shell, like `exec`) that
    /// serves the `sftp` subsystem; `None` refuses the subsystem. skiffd
    /// sets it to its own `--sftp-server` mode before reading `--config`.
    pub sftp_command: Option<String>,
    /// `Subsystem sftp internal-sftp ARGS`: the options skiffd's own server
    /// applies when it serves the subsystem (see [`crate::sftp_options`]).
    pub sftp_options: crate::sftp_options::SftpOptions,
    /// Command line that serves the skiff data plane (`transfer@skiff`
    /// subsystem); `None` refuses it. skiffd sets it to its own
    /// `--transfer-server` mode before reading `--config`.
    pub transfer_command: Option<String>,
    /// Every other subsystem (`Subsystem NAME COMMAND`): its name and the
    /// command line run as the account for it, as sshd runs one; `None`
    /// (`Subsystem NAME none`) refuses it. The first line for a name wins.
    pub subsystems: Vec<(String, Option<String>)>,
    /// skiffd's own executable, which serves `internal-sftp` inside a
    /// `ChrootDirectory` jail (it needs nothing from the jail).
    pub server_exe: Option<PathBuf>,
    /// Whether skiff clients may use the data plane at all (`DataPlane`).
    pub data_plane: bool,
    /// Where the data plane may run without encryption (`integrity` and
    /// `none` modes) when a client asks (`DataPlaneUnencrypted`).
    pub unencrypted_data_plane: UnencryptedPolicy,
    /// The largest receive window a channel may grow to (`MaxChannelWindow`).
    pub max_channel_window: u32,
    /// `MaxConnectionQueue` and `MaxServerQueue`: the memory skiffd holds
    /// for one connection's and for all connections' channels.
    pub queue_limits: crate::queue_budget::QueueLimits,
    /// `AllowTcpForwarding`, `DisableForwarding`, `PermitOpen`,
    /// `PermitListen`, `GatewayPorts`.
    pub forwarding: crate::forward_policy::ForwardRules,
    /// `ForceCommand`: run instead of what the client asks (`internal-sftp`:
    /// the SFTP server); it also wins over a key's `command=`.
    pub force_command: Option<String>,
    /// `PermitTTY`.
    pub permit_tty: bool,
    /// `UsePAM`, `PAMServiceName`, `PasswordAuthentication`,
    /// `KbdInteractiveAuthentication` and `PermitEmptyPasswords`: see
    /// [`crate::pam_policy`].
    pub pam: crate::pam_policy::PamSettings,
    /// `PrintMotd`, `PrintLastLog`: what an interactive login is shown
    /// first (see [`crate::login_records`]); global only, as in sshd.
    pub print_motd: bool,
    pub print_last_log: bool,
    /// `ChrootDirectory`: the jail of a login's sessions, tokens (`%h`,
    /// `%u`, `%U`) unexpanded; see [`crate::chroot`].
    pub chroot_directory: Option<String>,
    /// `Banner`: a file whose text is sent to clients before they
    /// authenticate (read at every connection).
    pub banner: Option<PathBuf>,
    /// `RequiredRSASize`: the fewest bits an RSA user key may have.
    pub required_rsa_size: u32,
    /// `AuthenticationMethods`: the methods a login must complete.
    pub authentication_methods: crate::auth_methods::AuthMethods,
    /// `RekeyLimit`: when skiffd starts a new key exchange.
    pub rekey_limit: crate::rekey_limit::RekeyLimit,
    /// `Match` blocks, in file order.
    pub matches: Vec<MatchBlock>,
    /// `LogLevel`: how much skiffd logs (`None`: not set, INFO; the
    /// command line's -d, -v and -q win over it).
    pub log_level: Option<LogLevel>,
    /// `SyslogFacility`: the facility of the lines skiffd sends to syslog
    /// (see [`crate::syslog`]); global only, as in sshd.
    pub syslog_facility: crate::syslog::Facility,
    /// `AuditLog`: the file audit records are appended to (see
    /// [`crate::audit`]); global only.
    pub audit_log: Option<PathBuf>,
}

/// `LogLevel`, as sshd spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Quiet,
    Fatal,
    Error,
    Info,
    Verbose,
    Debug1,
    Debug2,
    Debug3,
}

impl LogLevel {
    /// Reads sshd's names (any case; `DEBUG` is `DEBUG1`).
    pub fn parse(value: &str) -> Result<LogLevel, String> {
        Ok(match value.to_ascii_uppercase().as_str() {
            "QUIET" => LogLevel::Quiet,
            "FATAL" => LogLevel::Fatal,
            "ERROR" => LogLevel::Error,
            "INFO" => LogLevel::Info,
            "VERBOSE" => LogLevel::Verbose,
            "DEBUG" | "DEBUG1" => LogLevel::Debug1,
            "DEBUG2" => LogLevel::Debug2,
            "DEBUG3" => LogLevel::Debug3,
            _ => {
                return Err(format!(
                    "LogLevel must be QUIET, FATAL, ERROR, INFO, VERBOSE, DEBUG, DEBUG1, DEBUG2 \
                     or DEBUG3, not {value:?}"
                ))
            }
        })
    }

    /// The name `sshd -T` prints for it.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Quiet => "QUIET",
            LogLevel::Fatal => "FATAL",
            LogLevel::Error => "ERROR",
            LogLevel::Info => "INFO",
            LogLevel::Verbose => "VERBOSE",
            LogLevel::Debug1 => "DEBUG",
            LogLevel::Debug2 => "DEBUG2",
            LogLevel::Debug3 => "DEBUG3",
        }
    }

    /// The `tracing` level skiffd logs at. skiffd has no level between
    /// info and debug: its info lines already say what sshd adds at
    /// VERBOSE (failed keys, refusal reasons).
    pub fn tracing_level(self) -> &'static str {
        match self {
            LogLevel::Quiet => "off",
            LogLevel::Fatal | LogLevel::Error => "error",
            LogLevel::Info | LogLevel::Verbose => "info",
            LogLevel::Debug1 => "debug",
            LogLevel::Debug2 | LogLevel::Debug3 => "trace",
        }
    }
}

/// `AddressFamily`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    Any,
    Inet,
    Inet6,
}

/// What reading one file's lines remembers beyond the settings: the
/// listen lines that wait for the whole file (sshd takes `Port`,
/// `ListenAddress` and `AddressFamily` in any order), and whether the
/// default `AcceptEnv` list has been replaced yet.
#[derive(Debug, Clone)]
struct FileState {
    /// `Port` lines: the ports of `ListenAddress` lines without one, and,
    /// with no `ListenAddress`, of every address.
    ports: Vec<u16>,
    /// `ListenAddress` lines without a port.
    listen_bare: Vec<IpAddr>,
    /// `AddressFamily`: which of 0.0.0.0 and :: a `Port` alone listens on.
    address_family: AddressFamily,
    accept_env_seen: bool,
    /// Names a `Subsystem` line has set: the first line for a name wins.
    subsystems_named: Vec<String>,
}

impl Default for FileState {
    fn default() -> Self {
        FileState {
            ports: Vec::new(),
            listen_bare: Vec::new(),
            address_family: AddressFamily::Any,
            accept_env_seen: false,
            subsystems_named: Vec::new(),
        }
    }
}

/// Where a configuration line comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub line: usize,
}

/// The port of a `ListenAddress` without one when no `Port` is given
/// (sshd's would be 22; skiffd does not take a privileged port unasked).
pub const DEFAULT_PORT: u16 = 2222;

/// How deep `Include` files may nest.
const MAX_INCLUDE_DEPTH: usize = 16;

/// Keywords that may be given more than once, each line adding to the
/// last; every other keyword keeps its first value, as in sshd.
const REPEATABLE: &[&str] = &[
    "acceptenv",
    "allowgroups",
    "allowusers",
    "denygroups",
    "denyusers",
    "hostcertificate",
    "hostkey",
    "listenaddress",
    "port",
    "subsystem",
];

/// Reads the files an `Include` argument names, as `(label, text)` in
/// lexical order; the error is the reason.
pub type IncludeFn<'a> = dyn FnMut(&str) -> Result<Vec<(String, String)>, String> + 'a;

/// Where skiffd lets a client turn data-plane encryption off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnencryptedPolicy {
    /// Only when both ends of the connection are loopback addresses.
    Loopback,
    /// On any network (for trusted networks only).
    Any,
    /// Never.
    Never,
}

impl UnencryptedPolicy {
    /// Whether this policy allows turning encryption off on a connection
    /// between these addresses.
    pub fn allows(self, peer: std::net::IpAddr, local: std::net::IpAddr) -> bool {
        match self {
            UnencryptedPolicy::Any => true,
            UnencryptedPolicy::Never => false,
            UnencryptedPolicy::Loopback => is_loopback(peer) && is_loopback(local),
        }
    }
}

/// Loopback, counting IPv4-mapped IPv6 loopback addresses too.
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: Vec::new(),
            address_family: AddressFamily::Any,
            channel_timeouts: Default::default(),
            unused_connection_timeout: None,
            config_notes: Vec::new(),
            host_keys: Vec::new(),
            host_certificates: Vec::new(),
            trusted_user_ca_keys: None,
            authorized_keys_command: None,
            authorized_keys_command_user: None,
            authorized_principals_command: None,
            authorized_principals_command_user: None,
            access: Default::default(),
            authorized_principals_file: None,
            revoked_keys: Vec::new(),
            authorized_keys: DEFAULT_AUTHORIZED_KEYS.to_string(),
            accept_env: vec!["LANG".into(), "LC_*".into()],
            set_env: Vec::new(),
            expose_auth_info: false,
            permit_user_environment: false,
            strict_modes: true,
            login_grace_time: Duration::from_secs(120),
            max_auth_tries: 6,
            max_startups: 100,
            early_drop: None,
            per_source_max_startups: None,
            per_source_net_block: Default::default(),
            per_source_penalties: None,
            per_source_penalties_set: false,
            per_source_penalty_exempt: Vec::new(),
            max_sessions: 256,
            client_alive_interval: Some(Duration::from_secs(60)),
            client_alive_count_max: 3,
            sftp_command: None,
            sftp_options: Default::default(),
            transfer_command: None,
            subsystems: Vec::new(),
            server_exe: None,
            data_plane: true,
            unencrypted_data_plane: UnencryptedPolicy::Loopback,
            max_channel_window: skiff_proto::window::DEFAULT_MAX_WINDOW,
            queue_limits: Default::default(),
            forwarding: Default::default(),
            force_command: None,
            permit_tty: true,
            pam: Default::default(),
            print_motd: true,
            print_last_log: true,
            chroot_directory: None,
            banner: None,
            required_rsa_size: 1024,
            authentication_methods: Default::default(),
            rekey_limit: Default::default(),
            matches: Vec::new(),
            log_level: None,
            syslog_facility: Default::default(),
            audit_log: None,
            kex_algorithms: algorithms::SERVER_KEX.defaults(),
            host_key_algorithms: algorithms::SERVER_HOST_KEY.defaults(),
            ciphers: algorithms::SERVER_CIPHERS.defaults(),
            macs: algorithms::SERVER_MACS.defaults(),
            pubkey_algorithms: algorithms::SERVER_PUBKEY.defaults(),
            pubkey_auth_options: Default::default(),
            ca_signature_algorithms: algorithms::SERVER_CA_SIGNATURE.defaults(),
        }
    }
}

/// A configuration error, with the file and line it comes from.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Applies a configuration file on top of `settings`, reading the files
/// its `Include` lines name from disk (see [`read_included`]).
pub fn apply_config_text(
    settings: &mut Settings,
    file: &str,
    text: &str,
) -> Result<(), ConfigError> {
    apply_config(settings, file, text, &mut read_included)
}

/// What skiffd's command line adds to the configuration file, as sshd's
/// does: its lines (`-o`, and the options that stand for a keyword) are
/// read before the file's, so that they win, and `-p` ports replace every
/// `Port` line.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    pub lines: Vec<String>,
    pub ports: Vec<u16>,
}

/// How errors name the command line's lines (`command line:N`: its Nth).
pub const COMMAND_LINE: &str = "command line";

/// Applies the command line's settings and then, when given, a
/// configuration file (`(label, text)`), as one configuration: the first
/// value of a keyword wins, as within one file. `Match` and `Include`
/// are refused on the command line, as in sshd.
pub fn apply_config_with(
    settings: &mut Settings,
    command_line: &CommandLine,
    file: Option<(&str, &str)>,
    include: &mut IncludeFn<'_>,
) -> Result<(), ConfigError> {
    let mut global = Vec::new();
    let mut blocks: Vec<MatchBlock> = Vec::new();
    for (index, line) in command_line.lines.iter().enumerate() {
        let err = |message: String| ConfigError {
            file: COMMAND_LINE.to_string(),
            line: index + 1,
            message,
        };
        let keyword = split_keyword(line.trim()).0.to_ascii_lowercase();
        if keyword == "match" || keyword == "include" || line.contains(['\n', '\r']) {
            return Err(err(format!("{line:?} cannot be given on the command line")));
        }
        // One line: no Include to read, no block to start.
        let (mut read, mut lines) = (|_: &str| Ok(Vec::new()), Vec::new());
        collect_lines(
            COMMAND_LINE,
            line,
            &mut read,
            0,
            None,
            &mut lines,
            &mut blocks,
        )?;
        global.extend(lines.into_iter().map(|(mut origin, line)| {
            origin.line = index + 1;
            (origin, line)
        }));
    }
    if let Some((file, text)) = file {
        collect_lines(file, text, include, 0, None, &mut global, &mut blocks)?;
    }
    let mut state = apply_lines(settings, &global)?;
    if !command_line.ports.is_empty() {
        state.ports = command_line.ports.clone();
    }
    settings.settle_listen(state);
    for block in &blocks {
        let mut scratch = settings.clone();
        apply_lines(&mut scratch, &block.lines)?;
    }
    settings.matches.extend(blocks);
    Ok(())
}

/// Reads the files an `Include` argument names: a relative path is under
/// /etc/ssh, as in sshd; `*` and `?` expand, in lexical order; a pattern
/// that matches nothing is no error.
pub fn read_included(pattern: &str) -> Result<Vec<(String, String)>, String> {
    let path = std::path::Path::new("/etc/ssh").join(pattern);
    let mut paths = skiff_files::glob_paths(&path);
    paths.sort();
    let mut files = Vec::new();
    for p in paths {
        match std::fs::read_to_string(&p) {
            Ok(text) => files.push((p.display().to_string(), text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {}: {e}", p.display())),
        }
    }
    Ok(files)
}

/// Applies a configuration file on top of `settings`; `include` reads the
/// files of its `Include` lines.
///
/// The first value of a keyword wins, except for [`REPEATABLE`] ones,
/// which accumulate (the first `AcceptEnv` line replaces the default list).
/// Later lines for a keyword already set are still checked.
///
/// `Match` blocks are checked here (each of their lines must be valid and
/// allowed in a block) and kept in [`Settings::matches`], to be applied per
/// login by [`Settings::for_login`]. A `Match` inside an included file ends
/// with that file.
pub fn apply_config(
    settings: &mut Settings,
    file: &str,
    text: &str,
    include: &mut IncludeFn<'_>,
) -> Result<(), ConfigError> {
    apply_config_with(
        settings,
        &CommandLine::default(),
        Some((file, text)),
        include,
    )
}

/// Sorts the lines of `text` (and of the files it includes) into global
/// lines and `Match` blocks. `block` is the block in force where `text`
/// starts (for a file included inside one).
fn collect_lines(
    file: &str,
    text: &str,
    include: &mut IncludeFn<'_>,
    depth: usize,
    mut block: Option<usize>,
    global: &mut Vec<(Origin, String)>,
    blocks: &mut Vec<MatchBlock>,
) -> Result<(), ConfigError> {
    for (index, raw) in text.lines().enumerate() {
        let origin = Origin {
            file: file.to_string(),
            line: index + 1,
        };
        let err = |message: String| ConfigError {
            file: file.to_string(),
            line: index + 1,
            message,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keyword, _) = split_keyword(line);
        let lower = keyword.to_ascii_lowercase();
        // ForceCommand keeps its whole line, as in sshd (a shell reads it).
        let line = match lower.as_str() {
            "forcecommand" => line,
            _ => skiff_proto::ssh_config::without_comment(line),
        };
        let (keyword, rest) = split_keyword(line);
        if lower == "match" {
            let args: Vec<&str> = rest.split_whitespace().collect();
            blocks.push(MatchBlock::parse(&args).map_err(err)?);
            block = Some(blocks.len() - 1);
            continue;
        }
        if lower == "include" {
            if rest.is_empty() {
                return Err(err("Include needs a file name or pattern".into()));
            }
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(err(format!(
                    "Include nested deeper than {MAX_INCLUDE_DEPTH} files"
                )));
            }
            for pattern in rest.split_whitespace() {
                for (label, text) in include(pattern).map_err(err)? {
                    collect_lines(&label, &text, include, depth + 1, block, global, blocks)?;
                }
            }
            continue;
        }
        match block {
            Some(i) => {
                let allowed = crate::match_block::ALLOWED_IN_MATCH.contains(&lower.as_str())
                    || crate::sshd_only::verdict(&lower, &[]).is_some();
                if !allowed {
                    return Err(err(format!(
                        "{keyword} cannot be used inside a Match block"
                    )));
                }
                blocks[i].lines.push((origin, line.to_string()));
            }
            None => global.push((origin, line.to_string())),
        }
    }
    Ok(())
}

/// A line's keyword and the rest (`Keyword value`, `Keyword=value`).
fn split_keyword(line: &str) -> (&str, &str) {
    match line.split_once(|c: char| c.is_whitespace() || c == '=') {
        Some((k, r)) => (
            k,
            r.trim_start_matches(|c: char| c.is_whitespace() || c == '='),
        ),
        None => (line, ""),
    }
}

/// A block's lines, without those whose keyword is in `skip` (lowercase).
fn block_lines(block: &MatchBlock, skip: &[String]) -> Vec<(Origin, String)> {
    block
        .lines
        .iter()
        .filter(|(_, line)| !skip.contains(&split_keyword(line).0.to_ascii_lowercase()))
        .cloned()
        .collect()
}

impl Settings {
    /// The settings for one login: these, with the lines of every `Match`
    /// block that matches `ctx` on top. As in sshd, the first matching
    /// block to set a keyword wins. `None` when no block matches.
    pub fn for_login(&self, ctx: &MatchContext<'_>) -> Option<Settings> {
        self.for_blocks(|block| block.matches(ctx))
    }

    /// The settings with the lines of every `Match` block for which
    /// `applies` holds on top, as [`Settings::for_login`] (which decides
    /// with a login's details; `skiffd -T -C` with what it is given).
    pub fn for_blocks(&self, applies: impl Fn(&MatchBlock) -> bool) -> Option<Settings> {
        let mut matching = self.matches.iter().filter(|b| applies(b)).peekable();
        matching.peek()?;
        let mut effective = self.clone();
        effective.matches.clear();
        let mut set: Vec<String> = Vec::new();
        for block in matching {
            let lines = block_lines(block, &set);
            // Checked when the file was read; cannot fail here.
            if let Err(e) = apply_lines(&mut effective, &lines) {
                tracing::warn!("{e}");
            }
            set.extend(
                block
                    .lines
                    .iter()
                    .map(|(_, l)| split_keyword(l).0.to_ascii_lowercase()),
            );
        }
        Some(effective)
    }
}

/// Applies settings lines (trimmed, no `Match` or `Include`): the first
/// value of each keyword wins (see [`REPEATABLE`]); later ones are only
/// checked.
fn apply_lines(
    settings: &mut Settings,
    lines: &[(Origin, String)],
) -> Result<FileState, ConfigError> {
    let mut seen: Vec<String> = Vec::new();
    let mut state = FileState::default();
    for (origin, line) in lines {
        let lower = split_keyword(line).0.to_ascii_lowercase();
        if REPEATABLE.contains(&lower.as_str()) || !seen.contains(&lower) {
            apply_line(settings, &mut state, origin, line)?;
            seen.push(lower);
        } else {
            let (mut scratch, mut scratch_state) = (settings.clone(), state.clone());
            apply_line(&mut scratch, &mut scratch_state, origin, line)?;
        }
    }
    Ok(state)
}

/// Applies one settings line.
fn apply_line(
    settings: &mut Settings,
    state: &mut FileState,
    origin: &Origin,
    line: &str,
) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError {
        file: origin.file.clone(),
        line: origin.line,
        message,
    };
    let (keyword, rest) = split_keyword(line);
    let args: Vec<&str> = rest.split_whitespace().collect();
    let one = || -> Result<&str, ConfigError> {
        match args.as_slice() {
            [v] => Ok(*v),
            [] => Err(err(format!("{keyword} needs a value"))),
            _ => Err(err(format!("{keyword} takes exactly one value"))),
        }
    };
    // An algorithm list; names OpenSSH has and skiffd lacks are left out,
    // with a note (logged once at start), as long as something is left.
    let algorithm_list = |list: &algorithms::AlgorithmList,
                          value: &str,
                          settings: &mut Settings|
     -> Result<Vec<String>, ConfigError> {
        let names = list.resolve(value).map_err(err)?;
        let left_out = list.unimplemented_in(value);
        if !left_out.is_empty() {
            settings.config_notes.push(format!(
                "{}:{}: {keyword}: {} not implemented by skiffd; not offered",
                origin.file,
                origin.line,
                left_out.join(",")
            ));
        }
        Ok(names)
    };
    match keyword.to_ascii_lowercase().as_str() {
        "listenaddress" => {
            let v = one()?;
            match v.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
                Ok(ip) if !v.contains("]:") => state.listen_bare.push(ip),
                _ => settings.listen.push(parse_listen(v).map_err(err)?),
            }
        }
        "port" => {
            let v = one()?;
            let port = v
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| err(format!("Port must be from 1 to 65535, not {v:?}")))?;
            state.ports.push(port);
        }
        "addressfamily" => {
            state.address_family = match one()?.to_ascii_lowercase().as_str() {
                "any" => AddressFamily::Any,
                "inet" => AddressFamily::Inet,
                "inet6" => AddressFamily::Inet6,
                v => {
                    return Err(err(format!(
                        "AddressFamily must be any, inet or inet6, not {v:?}"
                    )))
                }
            }
        }
        "hostkey" => settings.host_keys.push(PathBuf::from(one()?)),
        "kexalgorithms" => {
            settings.kex_algorithms = algorithm_list(&algorithms::SERVER_KEX, one()?, settings)?
        }
        "hostkeyalgorithms" => {
            settings.host_key_algorithms =
                algorithm_list(&algorithms::SERVER_HOST_KEY, one()?, settings)?
        }
        "ciphers" => {
            settings.ciphers = algorithm_list(&algorithms::SERVER_CIPHERS, one()?, settings)?
        }
        "macs" => settings.macs = algorithm_list(&algorithms::SERVER_MACS, one()?, settings)?,
        "pubkeyacceptedalgorithms" | "pubkeyacceptedkeytypes" => {
            settings.pubkey_algorithms =
                algorithm_list(&algorithms::SERVER_PUBKEY, one()?, settings)?
        }
        "pubkeyauthoptions" => {
            settings.pubkey_auth_options = crate::security_keys::PubkeyAuthOptions::parse(&args)
                .map_err(|e| err(e.to_string()))?
        }
        "casignaturealgorithms" => {
            settings.ca_signature_algorithms =
                algorithm_list(&algorithms::SERVER_CA_SIGNATURE, one()?, settings)?
        }
        "hostcertificate" => settings.host_certificates.push(PathBuf::from(one()?)),
        // Several files, as recent OpenSSH: a key listed in any is revoked.
        "revokedkeys" => {
            settings.revoked_keys = match args.as_slice() {
                [] => return Err(err("RevokedKeys needs a file (or none)".into())),
                ["none"] => Vec::new(),
                paths if paths.contains(&"none") => {
                    return Err(err("RevokedKeys: none cannot be listed with files".into()))
                }
                paths => paths.iter().map(PathBuf::from).collect(),
            }
        }
        "authorizedprincipalsfile" => {
            settings.authorized_principals_file = match one()? {
                "none" => None,
                template => Some(template.to_string()),
            }
        }
        "trustedusercakeys" => {
            settings.trusted_user_ca_keys = match one()? {
                "none" => None,
                path => Some(PathBuf::from(path)),
            }
        }
        "authorizedkeysfile" => {
            if args.is_empty() {
                return Err(err("AuthorizedKeysFile needs a file (or none)".into()));
            }
            settings.authorized_keys = args.join(" ");
        }
        "authorizedkeyscommand" | "authorizedprincipalscommand" => {
            use crate::lookup_command::{parse_command_line, KEYS_TOKENS, PRINCIPALS_TOKENS};
            let keys = keyword.eq_ignore_ascii_case("authorizedkeyscommand");
            let (name, tokens) = if keys {
                ("AuthorizedKeysCommand", KEYS_TOKENS)
            } else {
                ("AuthorizedPrincipalsCommand", PRINCIPALS_TOKENS)
            };
            let argv = match rest.trim() {
                "none" => None,
                value => Some(parse_command_line(name, value, tokens).map_err(err)?),
            };
            if keys {
                settings.authorized_keys_command = argv;
            } else {
                settings.authorized_principals_command = argv;
            }
        }
        "authorizedprincipalscommanduser" => {
            settings.authorized_principals_command_user = Some(one()?.to_string())
        }
        "allowusers" | "denyusers" | "allowgroups" | "denygroups" => {
            if args.is_empty() {
                return Err(err(format!("{keyword} needs at least one pattern")));
            }
            let access = &mut settings.access;
            let list = match keyword.to_ascii_lowercase().as_str() {
                "allowusers" => &mut access.allow_users,
                "denyusers" => &mut access.deny_users,
                "allowgroups" => &mut access.allow_groups,
                _ => &mut access.deny_groups,
            };
            list.extend(args.iter().map(|s| s.to_string()));
        }
        "permitrootlogin" => {
            settings.access.root_login = crate::access::RootLogin::parse(one()?).map_err(err)?
        }
        "authorizedkeyscommanduser" => {
            settings.authorized_keys_command_user = Some(one()?.to_string())
        }
        "acceptenv" => {
            if args.is_empty() {
                return Err(err("AcceptEnv needs at least one pattern".into()));
            }
            if !state.accept_env_seen {
                settings.accept_env.clear();
                state.accept_env_seen = true;
            }
            settings
                .accept_env
                .extend(args.iter().map(|s| s.to_string()));
        }
        "exposeauthinfo" => settings.expose_auth_info = parse_yes_no(one()?).map_err(err)?,
        "setenv" => {
            let words = skiff_proto::ssh_config::split_args(rest)
                .map_err(|e| err(format!("SetEnv: {e}")))?;
            if words.is_empty() {
                return Err(err("SetEnv needs NAME=VALUE".into()));
            }
            let mut vars = Vec::new();
            for word in words {
                match word.split_once('=') {
                    // A name given twice keeps its first value, as in sshd.
                    Some((name, _)) if vars.iter().any(|(n, _)| n == name) => {}
                    Some((name, value))
                        if !name.is_empty() && !name.contains(char::is_whitespace) =>
                    {
                        vars.push((name.to_string(), value.to_string()))
                    }
                    _ => return Err(err(format!("SetEnv: expected NAME=VALUE, got {word:?}"))),
                }
            }
            settings.set_env = vars;
        }
        "permituserenvironment" => {
            settings.permit_user_environment = parse_yes_no(one()?).map_err(err)?
        }
        "rekeylimit" => {
            settings.rekey_limit =
                crate::rekey_limit::RekeyLimit::parse(&args, settings.rekey_limit).map_err(err)?
        }
        "authenticationmethods" => {
            settings.authentication_methods =
                crate::auth_methods::AuthMethods::parse(&args).map_err(|e| err(e.to_string()))?
        }
        "strictmodes" => settings.strict_modes = parse_yes_no(one()?).map_err(err)?,
        "printmotd" => settings.print_motd = parse_yes_no(one()?).map_err(err)?,
        "printlastlog" => settings.print_last_log = parse_yes_no(one()?).map_err(err)?,
        "persourcemaxstartups" => {
            settings.per_source_max_startups = match one()? {
                v if v.eq_ignore_ascii_case("none") => None,
                v => Some(parse_count(v).map_err(err)?),
            }
        }
        "persourcenetblocksize" => {
            settings.per_source_net_block =
                crate::startups::NetBlock::parse(one()?).map_err(err)?;
        }
        "persourcepenalties" => {
            settings.per_source_penalties =
                crate::penalties::PenaltyPolicy::parse(&args).map_err(err)?;
            settings.per_source_penalties_set = true;
        }
        "persourcepenaltyexemptlist" => {
            settings.per_source_penalty_exempt =
                crate::penalties::parse_exempt_list(one()?).map_err(err)?
        }
        "logingracetime" => settings.login_grace_time = parse_duration(one()?).map_err(err)?,
        "maxauthtries" => settings.max_auth_tries = parse_count(one()?).map_err(err)?,
        "maxstartups" => {
            // `full`, or sshd's `start:rate:full` with random early drop.
            let v = one()?;
            match v.split(':').collect::<Vec<_>>().as_slice() {
                [full] => {
                    settings.max_startups = parse_count(full).map_err(err)?;
                    settings.early_drop = None;
                }
                [start, rate, full] => {
                    let start = parse_count(start).map_err(err)?;
                    let full = parse_count(full).map_err(err)?;
                    let rate = rate.parse::<u32>().ok().filter(|r| *r <= 100);
                    match rate {
                            Some(rate) if start <= full => {
                                settings.max_startups = full;
                                settings.early_drop = Some((start, rate));
                            }
                            _ => {
                                return Err(err(format!(
                                    "MaxStartups {v:?}: expected start:rate:full with start <= full and a rate from 0 to 100"
                                )))
                            }
                        }
                }
                _ => {
                    return Err(err(format!(
                        "MaxStartups {v:?}: expected a number or start:rate:full"
                    )))
                }
            }
        }
        "maxsessions" => settings.max_sessions = parse_count(one()?).map_err(err)?,
        "clientaliveinterval" => {
            let d = parse_duration(one()?).map_err(err)?;
            settings.client_alive_interval = (!d.is_zero()).then_some(d);
        }
        "channeltimeout" => {
            settings.channel_timeouts = crate::channel_timeout::ChannelTimeouts::parse(&args)
                .map_err(|e| err(e.to_string()))?
        }
        "unusedconnectiontimeout" => {
            settings.unused_connection_timeout = match one()? {
                v if v.eq_ignore_ascii_case("none") => None,
                v => Some(parse_duration(v).map_err(err)?).filter(|d| !d.is_zero()),
            }
        }
        "clientalivecountmax" => {
            settings.client_alive_count_max = parse_count(one()?).map_err(err)?
        }
        "subsystem" => {
            // `Subsystem sftp COMMAND...`: the rest of the line is the
            // command, as in sshd_config; `none` turns SFTP off.
            let Some((name, command)) = rest.split_once(char::is_whitespace) else {
                return Err(err("Subsystem needs a name and a command".into()));
            };
            let mut options = Default::default();
            let command = match command.trim() {
                "" => return Err(err("Subsystem needs a name and a command".into())),
                "none" => None,
                // sshd's name for its built-in server: skiffd's own, with
                // sftp-server's options.
                c if name == "sftp" && crate::sftp_options::internal_sftp_command(c).is_some() => {
                    options = crate::sftp_options::internal_sftp_command(c)
                        .expect("checked above")
                        .map_err(|e| err(format!("Subsystem sftp internal-sftp: {e}")))?;
                    Some(
                        settings
                            .server_exe
                            .as_deref()
                            .and_then(crate::sftp::subsystem_command)
                            .ok_or_else(|| {
                                err("internal-sftp: skiffd cannot name its own executable".into())
                            })?,
                    )
                }
                c => Some(c.to_string()),
            };
            if state.subsystems_named.iter().any(|n| n == name) {
                return Ok(());
            }
            state.subsystems_named.push(name.to_string());
            match name {
                "sftp" => {
                    settings.sftp_command = command;
                    settings.sftp_options = options;
                }
                skiff_proto::dataplane::SUBSYSTEM => settings.transfer_command = command,
                _ => {
                    settings.subsystems.retain(|(n, _)| n != name);
                    settings.subsystems.push((name.to_string(), command));
                }
            }
        }
        "maxchannelwindow" => {
            let v = one()?;
            settings.max_channel_window = skiff_proto::window::parse_size(v)
                .filter(|&n| n >= skiff_proto::window::INITIAL_WINDOW)
                .ok_or_else(|| {
                    err(format!(
                        "MaxChannelWindow must be a size from 2M to 4095M (e.g. 64M), not {v:?}"
                    ))
                })?;
        }
        "maxconnectionqueue" | "maxserverqueue" => {
            let per_connection = keyword.eq_ignore_ascii_case("maxconnectionqueue");
            let name = if per_connection {
                "MaxConnectionQueue"
            } else {
                "MaxServerQueue"
            };
            let v = one()?;
            let limit = crate::queue_budget::QueueLimits::parse_limit(v).ok_or_else(|| {
                err(format!(
                    "{name} must be a size of at least 1M (e.g. 64M or 1G), not {v:?}"
                ))
            })?;
            if per_connection {
                settings.queue_limits.per_connection = limit;
            } else {
                settings.queue_limits.total = limit;
            }
        }
        "allowtcpforwarding" => {
            let rules = &mut settings.forwarding;
            (rules.local, rules.remote) =
                crate::forward_policy::parse_allow_forwarding("AllowTcpForwarding", one()?)
                    .map_err(err)?;
        }
        "allowstreamlocalforwarding" => {
            let rules = &mut settings.forwarding;
            (rules.stream_local, rules.stream_remote) =
                crate::forward_policy::parse_allow_forwarding("AllowStreamLocalForwarding", one()?)
                    .map_err(err)?;
        }
        "streamlocalbindmask" => {
            settings.forwarding.bind_mask =
                skiff_proto::forward_spec::parse_bind_mask(one()?).map_err(err)?
        }
        "streamlocalbindunlink" => {
            settings.forwarding.bind_unlink = parse_yes_no(one()?).map_err(err)?
        }
        "allowagentforwarding" => settings.forwarding.agent = parse_yes_no(one()?).map_err(err)?,
        "disableforwarding" => settings.forwarding.disabled = parse_yes_no(one()?).map_err(err)?,
        "permitopen" | "permitlisten" => {
            let listen = keyword.eq_ignore_ascii_case("permitlisten");
            let list = crate::forward_policy::PermitList::parse(&args, listen)
                .map_err(|e| err(format!("{keyword}: {e}")))?;
            if listen {
                settings.forwarding.permit_listen = list;
            } else {
                settings.forwarding.permit_open = list;
            }
        }
        "gatewayports" => {
            settings.forwarding.gateway_ports =
                crate::forward_policy::GatewayPorts::parse(one()?).map_err(err)?
        }
        "forcecommand" => {
            settings.force_command = match rest.trim() {
                "" => return Err(err("ForceCommand needs a command (or none)".into())),
                "none" => None,
                command => {
                    // internal-sftp's options are checked now, not at login.
                    if let Some(Err(e)) = crate::sftp_options::internal_sftp_command(command) {
                        return Err(err(format!("ForceCommand internal-sftp: {e}")));
                    }
                    Some(command.to_string())
                }
            }
        }
        "permittty" => settings.permit_tty = parse_yes_no(one()?).map_err(err)?,
        "usepam" => settings.pam.use_pam = parse_yes_no(one()?).map_err(err)?,
        "pamservicename" => {
            settings.pam.service = crate::pam_policy::service_name(one()?).map_err(err)?
        }
        "passwordauthentication" => settings.pam.password = parse_yes_no(one()?).map_err(err)?,
        // ChallengeResponseAuthentication is its older name, as in sshd.
        "kbdinteractiveauthentication" | "challengeresponseauthentication" => {
            settings.pam.keyboard_interactive = parse_yes_no(one()?).map_err(err)?
        }
        "permitemptypasswords" => {
            settings.pam.permit_empty_passwords = parse_yes_no(one()?).map_err(err)?
        }
        "chrootdirectory" => {
            settings.chroot_directory = match one()? {
                "none" => None,
                path if path.starts_with('/') || path.starts_with("%h") => Some(path.to_string()),
                path => {
                    return Err(err(format!(
                        "ChrootDirectory must be an absolute path (or none), not {path:?}"
                    )))
                }
            }
        }
        "banner" => {
            settings.banner = match one()? {
                "none" => None,
                path => Some(PathBuf::from(path)),
            }
        }
        "requiredrsasize" => {
            let v = one()?;
            settings.required_rsa_size = v
                .parse()
                .ok()
                .filter(|b| (1024..=16384).contains(b))
                .ok_or_else(|| {
                    err(format!(
                        "RequiredRSASize must be a number of bits from 1024 to 16384, not {v:?}"
                    ))
                })?;
        }
        "dataplane" => settings.data_plane = parse_yes_no(one()?).map_err(err)?,
        "loglevel" => settings.log_level = Some(LogLevel::parse(one()?).map_err(err)?),
        "syslogfacility" => {
            settings.syslog_facility = crate::syslog::Facility::parse(one()?).map_err(err)?
        }
        "auditlog" => {
            settings.audit_log = match one()? {
                "none" => None,
                path if path.starts_with('/') => Some(PathBuf::from(path)),
                path => {
                    return Err(err(format!(
                        "AuditLog must be an absolute path (or none), not {path:?}"
                    )))
                }
            }
        }
        "dataplaneunencrypted" => {
            settings.unencrypted_data_plane = match one()?.to_ascii_lowercase().as_str() {
                "loopback" => UnencryptedPolicy::Loopback,
                "yes" => UnencryptedPolicy::Any,
                "no" => UnencryptedPolicy::Never,
                v => {
                    return Err(err(format!(
                        "DataPlaneUnencrypted must be loopback, yes or no, not {v:?}"
                    )))
                }
            };
        }
        other => {
            let args: Vec<&str> = rest.split_whitespace().collect();
            match crate::sshd_only::verdict(other, &args) {
                Some(crate::sshd_only::Verdict::Fine) => {}
                Some(crate::sshd_only::Verdict::Noted(note)) => settings.config_notes.push(
                    format!("{}:{}: {keyword}: {note}", origin.file, origin.line),
                ),
                Some(crate::sshd_only::Verdict::Refused(message)) => return Err(err(message)),
                None => return Err(err(format!("unknown keyword {keyword:?}"))),
            }
        }
    }
    Ok(())
}

impl Settings {
    /// The command serving subsystem `name` when the configuration names
    /// one other than sftp and the data plane (`Subsystem NAME COMMAND`).
    pub fn subsystem(&self, name: &str) -> Option<&str> {
        self.subsystems
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, command)| command.as_deref())
    }

    /// The command line of skiffd's own SFTP server, which `ForceCommand
    /// internal-sftp` runs whatever `Subsystem sftp` says (as sshd's
    /// built-in one): the `sftp` subsystem's when that is skiffd's server
    /// (perhaps a copy the accounts can run), else skiffd's executable's.
    pub fn internal_sftp_command(&self) -> Option<String> {
        self.sftp_command
            .clone()
            .filter(|c| crate::sftp::internal_server_exe(c).is_some())
            .or_else(|| {
                self.server_exe
                    .as_deref()
                    .and_then(crate::sftp::subsystem_command)
            })
    }
}

impl Settings {
    /// The chance (0 to 1) that a new connection is dropped while
    /// `unauthenticated` others are still authenticating (`MaxStartups`).
    pub fn drop_chance(&self, unauthenticated: usize) -> f64 {
        let full = self.max_startups;
        if unauthenticated >= full {
            return 1.0;
        }
        match self.early_drop {
            Some((start, rate)) if unauthenticated >= start => {
                let rate = f64::from(rate) / 100.0;
                let span = (full - start).max(1) as f64;
                rate + (1.0 - rate) * (unauthenticated - start) as f64 / span
            }
            _ => 0.0,
        }
    }

    /// Turns the `Port` and bare `ListenAddress` lines of a file into listen
    /// addresses: each bare address on every port (or [`DEFAULT_PORT`]),
    /// and, with ports but no `ListenAddress` at all, every address of
    /// `AddressFamily` on them, as sshd does.
    fn settle_listen(&mut self, state: FileState) {
        let FileState {
            ports,
            listen_bare: bare,
            address_family,
            ..
        } = state;
        self.address_family = address_family;
        let each_port: Vec<u16> = if ports.is_empty() {
            vec![DEFAULT_PORT]
        } else {
            ports.clone()
        };
        for ip in &bare {
            self.listen
                .extend(each_port.iter().map(|p| SocketAddr::new(*ip, *p)));
        }
        if self.listen.is_empty() {
            let any: Vec<IpAddr> = match address_family {
                AddressFamily::Any => vec![
                    std::net::Ipv4Addr::UNSPECIFIED.into(),
                    std::net::Ipv6Addr::UNSPECIFIED.into(),
                ],
                AddressFamily::Inet => vec![std::net::Ipv4Addr::UNSPECIFIED.into()],
                AddressFamily::Inet6 => vec![std::net::Ipv6Addr::UNSPECIFIED.into()],
            };
            for p in &ports {
                self.listen
                    .extend(any.iter().map(|ip| SocketAddr::new(*ip, *p)));
            }
        }
    }
}

/// Parses `ADDR:PORT`, `[V6]:PORT`, or a bare address (port 2222).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = s
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
    {
        return Ok(SocketAddr::new(ip, 2222));
    }
    Err(format!(
        "bad listen address {s:?}: expected ADDR:PORT such as 127.0.0.1:2222 or [::1]:2222"
    ))
}

fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("expected yes or no, got {s:?}")),
    }
}

fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a positive number, got {s:?}")),
    }
}

/// Parses sshd time formats: `90`, `90s`, `2m`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("bad time value {s:?}: use seconds or forms like 30s, 2m, 1h");
    if s.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            'w' => 604800,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        number.clear();
    }
    if !number.is_empty() {
        let n: u64 = number.parse().map_err(|_| bad())?;
        total = total.checked_add(n).ok_or_else(bad)?;
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_proto::algorithms::{SERVER_CA_SIGNATURE, SERVER_PUBKEY};

    #[test]
    fn user_key_and_ca_signature_algorithms() {
        let mut s = Settings::default();
        assert!(!s.pubkey_algorithms.iter().any(|a| a.starts_with("ssh-rsa")));
        apply_config_text(
            &mut s,
            "f",
            "PubkeyAcceptedKeyTypes -rsa-sha2-*\nCASignatureAlgorithms ssh-ed25519\n",
        )
        .unwrap();
        assert!(s.pubkey_algorithms.iter().all(|a| !a.starts_with("rsa-")));
        assert!(s
            .pubkey_algorithms
            .contains(&"ssh-ed25519-cert-v01@openssh.com".to_string()));
        assert_eq!(s.ca_signature_algorithms, ["ssh-ed25519"]);
        // RSA with SHA-1 is never accepted: asking for it adds nothing
        // (with a note), and asking for nothing else is an error.
        for (line, default) in [
            (
                "PubkeyAcceptedAlgorithms +ssh-rsa",
                SERVER_PUBKEY.defaults(),
            ),
            (
                "CASignatureAlgorithms +ssh-rsa",
                SERVER_CA_SIGNATURE.defaults(),
            ),
        ] {
            let mut s = Settings::default();
            apply_config_text(&mut s, "f", line).unwrap();
            let list = match line.starts_with("Pubkey") {
                true => &s.pubkey_algorithms,
                false => &s.ca_signature_algorithms,
            };
            assert_eq!(*list, default, "{line}");
            assert!(
                s.config_notes[0].contains("ssh-rsa not implemented"),
                "{:?}",
                s.config_notes
            );
        }
        for bad in [
            "PubkeyAcceptedAlgorithms ssh-rsa",
            "CASignatureAlgorithms ssh-rsa-cert-v01@openssh.com",
        ] {
            let e = apply_config_text(&mut Settings::default(), "f", bad).unwrap_err();
            assert!(e.message.contains("leaves no algorithm"), "{e}");
        }
    }

    #[test]
    fn a_word_starting_with_a_hash_ends_the_line() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "c",
            "PermitOpen 127.0.0.1:1 # comment\nMaxSessions 3 # three\nForceCommand echo hi # kept\n",
        )
        .unwrap();
        assert_eq!(s.max_sessions, 3);
        assert_eq!(s.force_command.as_deref(), Some("echo hi # kept"));
    }

    #[test]
    fn revoked_keys_may_name_several_files_or_none() {
        let mut s = Settings::default();
        apply_config_text(&mut s, "c", "RevokedKeys /a /b\n").unwrap();
        assert_eq!(s.revoked_keys, [PathBuf::from("/a"), PathBuf::from("/b")]);
        let mut s = Settings::default();
        apply_config_text(&mut s, "c", "RevokedKeys none\n").unwrap();
        assert!(s.revoked_keys.is_empty());
        let mut s = Settings::default();
        assert!(apply_config_text(&mut s, "c", "RevokedKeys /a none\n").is_err());
    }

    #[test]
    fn algorithm_names_openssh_has_are_noted_not_refused() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "cfg",
            "KexAlgorithms sntrup761x25519-sha512@openssh.com,curve25519-sha256\nMACs umac-128-etm@openssh.com,hmac-sha2-256-etm@openssh.com\nPubkeyAcceptedAlgorithms ssh-ed25519,ssh-rsa\nCiphers 3des-cbc,aes128-gcm@openssh.com\n",
        )
        .unwrap();
        assert_eq!(s.kex_algorithms, ["curve25519-sha256"]);
        assert_eq!(s.macs, ["hmac-sha2-256-etm@openssh.com"]);
        assert_eq!(s.pubkey_algorithms, ["ssh-ed25519"]);
        assert_eq!(s.ciphers, ["aes128-gcm@openssh.com"]);
        assert_eq!(s.config_notes.len(), 4, "{:?}", s.config_notes);
        assert!(
            s.config_notes[0].starts_with(
                "cfg:1: KexAlgorithms: sntrup761x25519-sha512@openssh.com not implemented"
            ),
            "{:?}",
            s.config_notes
        );
        // Nothing left is still an error.
        let mut s = Settings::default();
        let e = apply_config_text(&mut s, "cfg", "MACs umac-64@openssh.com\n").unwrap_err();
        assert!(e.to_string().contains("leaves no algorithm"), "{e}");
    }

    #[test]
    fn set_env_keeps_the_first_value_of_a_name() {
        let mut s = Settings::default();
        apply_config_text(&mut s, "c", "SetEnv NAME=a OTHER=x NAME=b\n").unwrap();
        assert_eq!(
            s.set_env,
            [
                ("NAME".to_string(), "a".to_string()),
                ("OTHER".into(), "x".into())
            ]
        );
    }

    #[test]
    fn set_env_takes_quoted_values() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "f",
            "SetEnv TZ=UTC \"GREETING=hello there\"\nSetEnv X=1\n",
        )
        .unwrap();
        assert_eq!(
            s.set_env,
            [
                ("TZ".to_string(), "UTC".to_string()),
                ("GREETING".to_string(), "hello there".to_string())
            ]
        );
        for bad in ["SetEnv", "SetEnv NOVALUE", "SetEnv =x", "SetEnv \"A=1"] {
            assert!(
                apply_config_text(&mut Settings::default(), "f", bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn authorized_keys_files_may_be_several() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "f",
            "AuthorizedKeysFile .ssh/authorized_keys .ssh/authorized_keys2\n",
        )
        .unwrap();
        assert_eq!(
            s.authorized_keys,
            ".ssh/authorized_keys .ssh/authorized_keys2"
        );
        assert!(apply_config_text(&mut s, "f", "AuthorizedKeysFile\n").is_err());
    }

    #[test]
    fn per_source_startup_keywords() {
        let mut s = Settings::default();
        assert_eq!(s.per_source_max_startups, None);
        apply_config_text(
            &mut s,
            "f",
            "PerSourceMaxStartups 3\nPerSourceNetBlockSize 24:48\nPerSourcePenalties no\n",
        )
        .unwrap();
        assert_eq!(s.per_source_max_startups, Some(3));
        assert_eq!(
            (
                s.per_source_net_block.v4_bits,
                s.per_source_net_block.v6_bits
            ),
            (24, 48)
        );
        let mut s = Settings::default();
        apply_config_text(&mut s, "f", "PerSourceMaxStartups none\n").unwrap();
        assert_eq!(s.per_source_max_startups, None);
        for bad in [
            "PerSourceMaxStartups 0",
            "PerSourceMaxStartups lots",
            "PerSourceNetBlockSize 33",
            "PerSourceNetBlockSize 24:200",
            "PerSourcePenalties authfail:5x",
            "PerSourcePenaltyExemptList 10.0.0.0/40",
        ] {
            let e = apply_config_text(&mut Settings::default(), "f", bad).unwrap_err();
            assert!(e.to_string().contains("f:1"), "{bad}: {e}");
        }
    }

    #[test]
    fn max_startups_drops_early_with_rising_chance() {
        let mut s = Settings::default();
        assert_eq!((s.drop_chance(99), s.drop_chance(100)), (0.0, 1.0));
        apply_config_text(&mut s, "f", "MaxStartups 10:30:60\n").unwrap();
        assert_eq!(s.drop_chance(9), 0.0);
        assert!((s.drop_chance(10) - 0.3).abs() < 1e-9);
        assert!((s.drop_chance(35) - 0.65).abs() < 1e-9);
        assert_eq!(s.drop_chance(60), 1.0);
        for bad in [
            "MaxStartups 10:130:60",
            "MaxStartups 70:30:60",
            "MaxStartups 1:2",
            "MaxStartups x",
        ] {
            assert!(
                apply_config_text(&mut Settings::default(), "f", bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_first_value_wins_and_repeatable_keywords_add_up() {
        let mut s = Settings::default();
        let text = "PermitRootLogin no\nPermitRootLogin yes\nMaxSessions 3\nMaxSessions 9\n\
                    HostKey /a\nHostKey /b\nAllowUsers ann\nAllowUsers bob\n";
        apply_config_text(&mut s, "f", text).unwrap();
        assert_eq!(s.access.root_login, crate::access::RootLogin::No);
        assert_eq!(s.max_sessions, 3);
        assert_eq!(s.host_keys, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(s.access.allow_users, ["ann", "bob"]);
        // A later value that is not used is still checked.
        let e = apply_config_text(
            &mut Settings::default(),
            "f",
            "MaxSessions 3\nMaxSessions x\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn includes_come_first_and_their_match_blocks_end_with_them() {
        let files = [
            (
                "/etc/ssh/sshd_config.d/10-first.conf",
                "PermitTTY no\nMatch User ann\n  MaxSessions 1\n",
            ),
            (
                "/etc/ssh/sshd_config.d/20-second.conf",
                "PermitTTY yes\nMaxAuthTries 2\n",
            ),
        ];
        let mut include = |pattern: &str| -> Result<Vec<(String, String)>, String> {
            assert_eq!(pattern, "sshd_config.d/*.conf");
            Ok(files
                .iter()
                .map(|(l, t)| (l.to_string(), t.to_string()))
                .collect())
        };
        let mut s = Settings::default();
        let text = "Include sshd_config.d/*.conf\nPermitTTY yes\nMaxSessions 5\n";
        apply_config(&mut s, "/etc/ssh/sshd_config", text, &mut include).unwrap();
        // The drop-in's value came first; the main file's MaxSessions is
        // global, not part of the drop-in's Match block.
        assert!(!s.permit_tty);
        assert_eq!(s.max_auth_tries, 2);
        assert_eq!(s.max_sessions, 5);
        assert_eq!(s.matches.len(), 1);
        assert_eq!(s.matches[0].lines[0].0.file, files[0].0);
        // Errors name the included file and its line.
        let mut bad = |_: &str| {
            Ok(vec![(
                "/etc/ssh/x.conf".to_string(),
                "#\nNoSuchThing 1\n".to_string(),
            )])
        };
        let e = apply_config(
            &mut Settings::default(),
            "main",
            "Include x.conf\n",
            &mut bad,
        )
        .unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("/etc/ssh/x.conf", 2), "{e}");
        // A file that includes itself stops at the depth limit.
        let mut itself = |_: &str| Ok(vec![("loop".to_string(), "Include loop\n".to_string())]);
        let e = apply_config(
            &mut Settings::default(),
            "loop",
            "Include loop\n",
            &mut itself,
        )
        .unwrap_err();
        assert!(e.message.contains("nested"), "{e}");
    }

    #[test]
    fn ports_and_bare_listen_addresses_combine() {
        let listen = |text: &str| {
            let mut s = Settings::default();
            apply_config_text(&mut s, "f", text).unwrap();
            s.listen.iter().map(|a| a.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(listen("Port 22\n"), ["0.0.0.0:22", "[::]:22"]);
        assert_eq!(
            listen("AddressFamily inet\nPort 22\nPort 2022\n"),
            ["0.0.0.0:22", "0.0.0.0:2022"]
        );
        assert_eq!(
            listen("ListenAddress 10.0.0.1\nListenAddress [::1]:99\nPort 22\n"),
            ["[::1]:99", "10.0.0.1:22"]
        );
        assert_eq!(listen("ListenAddress ::1\n"), ["[::1]:2222"]);
        assert!(listen("").is_empty());
        for bad in ["Port 0", "Port http", "AddressFamily ipx"] {
            assert!(
                apply_config_text(&mut Settings::default(), "f", bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_debian_sshd_config_is_served_as_it_is() {
        let text = "Include /nonexistent/sshd_config.d/*.conf\nKbdInteractiveAuthentication no\n\
                    UsePAM yes\nX11Forwarding yes\nPrintMotd no\nAcceptEnv LANG LC_*\n\
                    Subsystem\tsftp\t/usr/lib/openssh/sftp-server\n\
                    Match User anoncvs\n\tX11Forwarding no\n\tAllowTcpForwarding no\n";
        let mut s = Settings::default();
        apply_config_text(&mut s, "sshd_config", text).unwrap();
        assert_eq!(
            s.sftp_command.as_deref(),
            Some("/usr/lib/openssh/sftp-server")
        );
        assert_eq!(s.config_notes.len(), 1, "{:?}", s.config_notes);
        assert!(
            s.config_notes[0].starts_with("sshd_config:4: X11Forwarding:"),
            "{:?}",
            s.config_notes
        );
        // PAM as Debian's file asks: passwords through PAM, no
        // keyboard-interactive.
        assert!(s.pam.use_pam && s.pam.password && !s.pam.keyboard_interactive);
        for refused in [
            "PubkeyAuthentication no",
            "AuthenticationMethods publickey,hostbased",
        ] {
            let e = apply_config_text(&mut Settings::default(), "f", refused).unwrap_err();
            assert!(e.message.contains("public"), "{e}");
        }
    }

    #[test]
    fn match_blocks_apply_per_login_first_value_wins() {
        use crate::match_block::MatchContext;
        let mut s = Settings::default();
        let text = "MaxSessions 5\nPermitTTY yes\n\
                    Match User alice\n  MaxSessions 2\n  AcceptEnv A\n  AcceptEnv B\n\
                    Match all\n  MaxSessions 9\n  PermitTTY no\n  ForceCommand internal-sftp\n";
        apply_config_text(&mut s, "f", text).unwrap();
        assert_eq!(
            (s.max_sessions, s.permit_tty, s.matches.len()),
            (5, true, 2)
        );
        let groups = Vec::new();
        let ctx = |user| MatchContext {
            user,
            groups: &groups,
            peer: "127.0.0.1".parse().unwrap(),
            local: "127.0.0.1".parse().unwrap(),
            local_port: 22,
        };
        let alice = s.for_login(&ctx("alice")).unwrap();
        assert_eq!(alice.max_sessions, 2);
        assert_eq!(alice.accept_env, ["A", "B"]);
        assert!(!alice.permit_tty);
        assert_eq!(alice.force_command.as_deref(), Some("internal-sftp"));
        assert!(alice.matches.is_empty());
        let bob = s.for_login(&ctx("bob")).unwrap();
        assert_eq!(bob.max_sessions, 9);
        assert_eq!(bob.accept_env, ["LANG", "LC_*"]);

        let mut s = Settings::default();
        apply_config_text(&mut s, "f", "Match User carol\n  MaxSessions 1\n").unwrap();
        assert!(s.for_login(&ctx("dave")).is_none());
        let e = apply_config_text(&mut s, "f", "Match User x\n  HostKey /k\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("inside a Match block"), "{e}");
    }

    #[test]
    fn forwarding_keywords() {
        use crate::forward_policy::{GatewayPorts, PermitList};
        let mut s = Settings::default();
        assert!(s.forwarding.local && s.forwarding.remote && !s.forwarding.disabled);
        let text = "AllowTcpForwarding local\nPermitOpen db:5432 [::1]:*\n\
                    PermitListen none\nGatewayPorts clientspecified\nDisableForwarding no\n\
                    AllowStreamLocalForwarding remote\nStreamLocalBindMask 0117\n\
                    StreamLocalBindUnlink yes\n";
        apply_config_text(&mut s, "f", text).unwrap();
        let f = &s.forwarding;
        assert!(f.local && !f.remote && !f.disabled);
        assert!(!f.stream_local && f.stream_remote && f.bind_unlink);
        assert_eq!(f.bind_mask, 0o117);
        assert!(matches!(&f.permit_open, PermitList::Only(e) if e.len() == 2));
        assert_eq!(f.permit_listen, PermitList::None);
        assert_eq!(f.gateway_ports, GatewayPorts::ClientSpecified);
        for (bad, word) in [
            ("AllowTcpForwarding sometimes", "AllowTcpForwarding"),
            ("PermitOpen 5432", "5432"),
            ("PermitListen", "PermitListen"),
            ("GatewayPorts maybe", "GatewayPorts"),
            (
                "AllowStreamLocalForwarding maybe",
                "AllowStreamLocalForwarding",
            ),
            ("StreamLocalBindMask 999", "StreamLocalBindMask"),
            ("StreamLocalBindUnlink sometimes", "sometimes"),
        ] {
            let e = apply_config_text(&mut s, "f", &format!("#\n{bad}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{bad}");
            assert!(e.to_string().contains(word), "{e}");
        }
    }

    #[test]
    fn algorithm_lists_replace_or_edit_the_defaults() {
        let mut s = Settings::default();
        assert_eq!(s.ciphers, algorithms::SERVER_CIPHERS.defaults());
        let text = "Ciphers +aes256-ctr\nMACs hmac-sha2-512-etm@openssh.com\n\
                    KexAlgorithms -mlkem*\nHostKeyAlgorithms ^rsa-sha2-512\n";
        apply_config_text(&mut s, "f", text).unwrap();
        assert_eq!(s.ciphers.last().map(String::as_str), Some("aes256-ctr"));
        assert_eq!(s.macs, ["hmac-sha2-512-etm@openssh.com"]);
        assert!(!s.kex_algorithms.iter().any(|k| k.starts_with("mlkem")));
        assert_eq!(s.host_key_algorithms[0], "rsa-sha2-512");
        let e = apply_config_text(&mut s, "f", "\nCiphers des-cbc\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("des-cbc"), "{e}");
        assert!(apply_config_text(&mut s, "f", "MACs -*\n").is_err());
    }

    #[test]
    fn strict_modes_default_on_and_global_only() {
        let mut s = Settings::default();
        assert!(s.strict_modes);
        apply_config_text(&mut s, "f", "StrictModes no\nStrictModes yes\n").unwrap();
        assert!(!s.strict_modes, "the first value wins");
        assert!(apply_config_text(&mut Settings::default(), "f", "StrictModes maybe\n").is_err());
        let e = apply_config_text(
            &mut Settings::default(),
            "f",
            "Match User alice\nStrictModes no\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 2, "{e}");
    }

    #[test]
    fn login_messages_default_on_and_global_only() {
        let mut s = Settings::default();
        assert!(s.print_motd && s.print_last_log);
        apply_config_text(
            &mut s,
            "f",
            "PrintMotd no\nPrintLastLog no\nPrintMotd yes\n",
        )
        .unwrap();
        assert!(!s.print_motd, "the first value wins");
        assert!(!s.print_last_log);
        assert!(apply_config_text(&mut Settings::default(), "f", "PrintLastLog often\n").is_err());
        for keyword in ["PrintMotd", "PrintLastLog"] {
            let text = format!("Match User alice\n{keyword} no\n");
            let e = apply_config_text(&mut Settings::default(), "f", &text).unwrap_err();
            assert_eq!(e.line, 2, "{e}");
            assert!(e.message.contains("inside a Match block"), "{e}");
        }
    }

    #[test]
    fn parses_keywords_and_accumulates() {
        let mut s = Settings::default();
        let text = "# comment\nListenAddress 127.0.0.1:2022\nlistenaddress [::1]:2022\n\
                    AcceptEnv FOO BAR_*\nAcceptEnv BAZ\nPermitUserEnvironment yes\n\
                    MaxStartups 10:30:60\nLoginGraceTime 1m30s\nMaxSessions=32\n";
        apply_config_text(&mut s, "f", text).unwrap();
        assert_eq!(s.listen.len(), 2);
        assert_eq!(s.accept_env, vec!["FOO", "BAR_*", "BAZ"]);
        assert!(s.permit_user_environment);
        assert_eq!(s.max_startups, 60);
        assert_eq!(s.login_grace_time, Duration::from_secs(90));
        assert_eq!(s.max_sessions, 32);
    }

    #[test]
    fn errors_name_file_and_line() {
        let mut s = Settings::default();
        let e = apply_config_text(&mut s, "/etc/skiffd.conf", "\nMaxSessions 0\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/skiffd.conf:2: expected a positive number, got \"0\""
        );
        let e = apply_config_text(&mut s, "c", "Bogus 1").unwrap_err();
        assert!(e.to_string().starts_with("c:1: unknown keyword"));
        let e = apply_config_text(&mut s, "c", "ListenAddress nowhere").unwrap_err();
        assert!(e.to_string().contains("bad listen address"));
        let e = apply_config_text(&mut s, "c", "HostKey").unwrap_err();
        assert_eq!(e.to_string(), "c:1: HostKey needs a value");
        let e = apply_config_text(&mut s, "c", "\nHostCertificate a b").unwrap_err();
        assert_eq!(
            e.to_string(),
            "c:2: HostCertificate takes exactly one value"
        );
    }

    #[test]
    fn host_certificates_accumulate() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "c",
            "HostCertificate /etc/a-cert.pub\nhostcertificate /etc/b-cert.pub\n",
        )
        .unwrap();
        assert_eq!(
            s.host_certificates,
            [
                PathBuf::from("/etc/a-cert.pub"),
                PathBuf::from("/etc/b-cert.pub")
            ]
        );
    }

    #[test]
    fn internal_sftp_options_are_checked_when_read() {
        let mut s = Settings {
            server_exe: Some("/usr/sbin/skiffd".into()),
            ..Settings::default()
        };
        apply_config_text(
            &mut s,
            "c",
            "Subsystem sftp internal-sftp -u 022 -d %d/in\nForceCommand internal-sftp -R -P remove\n",
        )
        .unwrap();
        assert_eq!(
            s.sftp_command.as_deref(),
            Some("'/usr/sbin/skiffd' --sftp-server")
        );
        assert_eq!(s.sftp_options.umask, Some(0o022));
        assert_eq!(s.sftp_options.start_dir.as_deref(), Some("%d/in"));
        assert_eq!(
            s.force_command.as_deref(),
            Some("internal-sftp -R -P remove")
        );
        // The forced server is skiffd's own whatever serves the subsystem.
        assert_eq!(
            s.internal_sftp_command().as_deref(),
            Some("'/usr/sbin/skiffd' --sftp-server")
        );
        apply_config_text(
            &mut s,
            "c",
            "Subsystem sftp /usr/lib/openssh/sftp-server -R\n",
        )
        .unwrap();
        assert_eq!(
            s.sftp_options,
            Default::default(),
            "options go with the line"
        );
        assert_eq!(
            s.internal_sftp_command().as_deref(),
            Some("'/usr/sbin/skiffd' --sftp-server")
        );
        // Bad options fail the file at their line, in a Match block too.
        for (text, line, needle) in [
            ("#\nSubsystem sftp internal-sftp -u 9x\n", 2, "-u \"9x\""),
            ("ForceCommand internal-sftp -P erase\n", 1, "\"erase\""),
            ("Match User x\n  ForceCommand internal-sftp -z\n", 2, "-z"),
            ("ForceCommand internal-sftp -d %h\n", 1, "%h"),
        ] {
            let e = apply_config_text(&mut Settings::default(), "f.conf", text).unwrap_err();
            assert_eq!((e.file.as_str(), e.line), ("f.conf", line), "{e}");
            assert!(e.message.contains(needle), "{e}");
        }
        // A command that merely starts with the name is a shell command.
        apply_config_text(&mut s, "c", "ForceCommand internal-sftpd -z\n").unwrap();
    }

    #[test]
    fn the_first_subsystem_line_for_a_name_wins() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "c",
            "Subsystem sftp /first\nSubsystem sftp /second\nSubsystem x /x1\nSubsystem x /x2\n",
        )
        .unwrap();
        assert_eq!(s.sftp_command.as_deref(), Some("/first"));
        assert_eq!(s.subsystem("x"), Some("/x1"));
    }

    #[test]
    fn subsystem_sftp() {
        let mut s = Settings {
            sftp_command: Some("builtin".into()),
            ..Settings::default()
        };
        apply_config_text(
            &mut s,
            "c",
            "Subsystem  sftp  '/opt/my skiffd' --sftp-server\n",
        )
        .unwrap();
        assert_eq!(
            s.sftp_command.as_deref(),
            Some("'/opt/my skiffd' --sftp-server")
        );
        apply_config_text(&mut s, "c", "subsystem=sftp none").unwrap();
        assert_eq!(s.sftp_command, None);
        // sshd's internal-sftp names skiffd's own server.
        let e = apply_config_text(&mut s, "c", "Subsystem sftp internal-sftp").unwrap_err();
        assert!(e.message.contains("internal-sftp"), "{e}");
        s.server_exe = Some("/usr/sbin/skiffd".into());
        apply_config_text(&mut s, "c", "Subsystem sftp internal-sftp").unwrap();
        assert_eq!(
            s.sftp_command.as_deref(),
            Some("'/usr/sbin/skiffd' --sftp-server")
        );
        apply_config_text(&mut s, "c", "ChrootDirectory /srv/jail/%u\n").unwrap();
        assert_eq!(s.chroot_directory.as_deref(), Some("/srv/jail/%u"));
        apply_config_text(&mut s, "c", "ChrootDirectory none\n").unwrap();
        assert_eq!(s.chroot_directory, None);
        let e = apply_config_text(&mut s, "c", "#\nChrootDirectory jail\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("absolute"), "{e}");
        let e = apply_config_text(&mut s, "c", "Subsystem sftp").unwrap_err();
        assert_eq!(e.to_string(), "c:1: Subsystem needs a name and a command");
        // Any other name runs its command, as in sshd; the first line wins.
        apply_config_text(
            &mut s,
            "c",
            "Subsystem netconf /usr/bin/netconf --stdio\nSubsystem netconf /other\nSubsystem off none\n",
        )
        .unwrap();
        assert_eq!(
            s.subsystems,
            [
                (
                    "netconf".to_string(),
                    Some("/usr/bin/netconf --stdio".to_string())
                ),
                ("off".to_string(), None)
            ]
        );
        apply_config_text(&mut s, "c", "Subsystem transfer@skiff /x --transfer-server").unwrap();
        assert_eq!(s.transfer_command.as_deref(), Some("/x --transfer-server"));
    }

    #[test]
    fn data_plane_policy() {
        let mut s = Settings::default();
        assert!(s.data_plane);
        assert_eq!(s.unencrypted_data_plane, UnencryptedPolicy::Loopback);
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: std::net::IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let lan: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        assert!(UnencryptedPolicy::Loopback.allows(lo, lo6));
        assert!(!UnencryptedPolicy::Loopback.allows(lan, lo));
        assert!(!UnencryptedPolicy::Loopback.allows(lo, lan));
        assert!(UnencryptedPolicy::Any.allows(lan, lan));
        assert!(!UnencryptedPolicy::Never.allows(lo, lo));
        apply_config_text(&mut s, "c", "DataPlane no\nDataPlaneUnencrypted yes\n").unwrap();
        assert!(!s.data_plane);
        assert_eq!(s.unencrypted_data_plane, UnencryptedPolicy::Any);
        apply_config_text(&mut s, "c", "MaxChannelWindow 128M").unwrap();
        assert_eq!(s.max_channel_window, 128 << 20);
        let e = apply_config_text(&mut s, "g", "MaxChannelWindow 1M").unwrap_err();
        assert!(
            e.to_string().starts_with("g:1: MaxChannelWindow must be"),
            "{e}"
        );
        let e = apply_config_text(&mut s, "f", "DataPlaneUnencrypted maybe").unwrap_err();
        assert_eq!(
            e.to_string(),
            "f:1: DataPlaneUnencrypted must be loopback, yes or no, not \"maybe\""
        );
    }

    #[test]
    fn queue_limits() {
        let mut s = Settings::default();
        assert_eq!(s.queue_limits, crate::queue_budget::QueueLimits::default());
        apply_config_text(
            &mut s,
            "c",
            "MaxConnectionQueue 8M\nmaxserverqueue=2G\nMaxConnectionQueue 1G\n",
        )
        .unwrap();
        assert_eq!(
            (s.queue_limits.per_connection, s.queue_limits.total),
            (8 << 20, 2 << 30)
        );
        let e = apply_config_text(&mut s, "q", "MaxServerQueue 512k").unwrap_err();
        assert_eq!(
            e.to_string(),
            "q:1: MaxServerQueue must be a size of at least 1M (e.g. 64M or 1G), not \"512k\""
        );
        let e = apply_config_text(&mut s, "q", "\nMaxConnectionQueue lots").unwrap_err();
        assert!(
            e.to_string().starts_with("q:2: MaxConnectionQueue must be"),
            "{e}"
        );
        // Not a login setting.
        let e = apply_config_text(&mut s, "m", "Match User x\n  MaxServerQueue 1G\n").unwrap_err();
        assert!(e.to_string().contains("MaxServerQueue"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }
}
