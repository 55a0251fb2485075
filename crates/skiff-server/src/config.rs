//! skiffd settings and the parser for its configuration file.
//!
//! The file format is a small, sshd_config-like subset: one `Keyword value...`
//! per line, keywords case-insensitive, `#` comments. Parsing is pure (text in,
//! settings or a `file:line` error out); reading the file is the caller's job.
//! See docs/skiffd-config.md for the keyword list.

use std::net::SocketAddr;
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
    /// `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`, `MACs`: names in
    /// preference order (see [`skiff_proto::algorithms`]'s `SERVER_*`).
    pub kex_algorithms: Vec<String>,
    pub host_key_algorithms: Vec<String>,
    pub ciphers: Vec<String>,
    pub macs: Vec<String>,
    pub host_keys: Vec<PathBuf>,
    /// Host certificates for some of the host keys (`HostCertificate`).
    pub host_certificates: Vec<PathBuf>,
    /// CA keys trusted to sign user certificates for every account
    /// (`TrustedUserCAKeys`).
    pub trusted_user_ca_keys: Option<PathBuf>,
    /// Path template (`%h`, `%u`) of the file listing the certificate
    /// principals an account admits (`AuthorizedPrincipalsFile`).
    pub authorized_principals_file: Option<String>,
    /// Public keys that may never authenticate, nor sign certificates
    /// (`RevokedKeys`).
    pub revoked_keys: Option<PathBuf>,
    /// Path template with `%h` and `%u` tokens. A path without tokens applies to every account.
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
    /// Honour `environment=` in authorized_keys.
    pub permit_user_environment: bool,
    pub login_grace_time: Duration,
    pub max_auth_tries: usize,
    /// Unauthenticated connections allowed at once; further ones are dropped.
    pub max_startups: usize,
    pub max_sessions: usize,
    /// Interval of server keepalives to detect dead clients; `None` disables them.
    pub client_alive_interval: Option<Duration>,
    pub client_alive_count_max: usize,
    /// Command line (run through the account's shell, like `exec`) that
    /// serves the `sftp` subsystem; `None` refuses the subsystem. skiffd
    /// sets it to its own `--sftp-server` mode before reading `--config`.
    pub sftp_command: Option<String>,
    /// Command line that serves the skiff data plane (`transfer@skiff`
    /// subsystem); `None` refuses it. skiffd sets it to its own
    /// `--transfer-server` mode before reading `--config`.
    pub transfer_command: Option<String>,
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
    /// `AllowTcpForwarding`, `DisableForwarding`, `PermitOpen`,
    /// `PermitListen`, `GatewayPorts`.
    pub forwarding: crate::forward_policy::ForwardRules,
    /// `ForceCommand`: run instead of what the client asks (`internal-sftp`:
    /// the SFTP server); it also wins over a key's `command=`.
    pub force_command: Option<String>,
    /// `PermitTTY`.
    pub permit_tty: bool,
    /// `ChrootDirectory`: the jail of a login's sessions, tokens (`%h`,
    /// `%u`, `%U`) unexpanded; see [`crate::chroot`].
    pub chroot_directory: Option<String>,
    /// `Banner`: a file whose text is sent to clients before they
    /// authenticate (read at every connection).
    pub banner: Option<PathBuf>,
    /// `RequiredRSASize`: the fewest bits an RSA user key may have.
    pub required_rsa_size: u32,
    /// `Match` blocks with the file they come from, in file order.
    pub matches: Vec<(String, MatchBlock)>,
}

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
            host_keys: Vec::new(),
            host_certificates: Vec::new(),
            trusted_user_ca_keys: None,
            authorized_keys_command: None,
            authorized_keys_command_user: None,
            authorized_principals_command: None,
            authorized_principals_command_user: None,
            access: Default::default(),
            authorized_principals_file: None,
            revoked_keys: None,
            authorized_keys: DEFAULT_AUTHORIZED_KEYS.to_string(),
            accept_env: vec!["LANG".into(), "LC_*".into()],
            permit_user_environment: false,
            login_grace_time: Duration::from_secs(120),
            max_auth_tries: 6,
            max_startups: 100,
            max_sessions: 256,
            client_alive_interval: Some(Duration::from_secs(60)),
            client_alive_count_max: 3,
            sftp_command: None,
            transfer_command: None,
            server_exe: None,
            data_plane: true,
            unencrypted_data_plane: UnencryptedPolicy::Loopback,
            max_channel_window: skiff_proto::window::DEFAULT_MAX_WINDOW,
            forwarding: Default::default(),
            force_command: None,
            permit_tty: true,
            chroot_directory: None,
            banner: None,
            required_rsa_size: 1024,
            matches: Vec::new(),
            kex_algorithms: algorithms::SERVER_KEX.defaults(),
            host_key_algorithms: algorithms::SERVER_HOST_KEY.defaults(),
            ciphers: algorithms::SERVER_CIPHERS.defaults(),
            macs: algorithms::SERVER_MACS.defaults(),
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

/// Applies the lines of a configuration file on top of `settings`.
///
/// Repeatable keywords (`ListenAddress`, `HostKey`, `HostCertificate`, `AcceptEnv`) accumulate;
/// the first `AcceptEnv` line replaces the default list.
///
/// `Match` blocks are checked here (each of their lines must be valid and
/// allowed in a block) and kept in [`Settings::matches`], to be applied per
/// login by [`Settings::for_login`].
pub fn apply_config_text(
    settings: &mut Settings,
    file: &str,
    text: &str,
) -> Result<(), ConfigError> {
    let mut global = Vec::new();
    let mut blocks: Vec<MatchBlock> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let err = |message: String| ConfigError {
            file: file.to_string(),
            line: line_no,
            message,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keyword, rest) = split_keyword(line);
        if keyword.eq_ignore_ascii_case("match") {
            let args: Vec<&str> = rest.split_whitespace().collect();
            blocks.push(MatchBlock::parse(&args).map_err(err)?);
            continue;
        }
        match blocks.last_mut() {
            Some(block) => {
                let lower = keyword.to_ascii_lowercase();
                if !crate::match_block::ALLOWED_IN_MATCH.contains(&lower.as_str()) {
                    return Err(err(format!(
                        "{keyword} cannot be used inside a Match block"
                    )));
                }
                block.lines.push((line_no, line.to_string()));
            }
            None => global.push((line_no, line)),
        }
    }
    apply_lines(settings, file, global)?;
    for block in &blocks {
        let mut scratch = settings.clone();
        apply_lines(&mut scratch, file, block_lines(block, &[]))?;
    }
    settings
        .matches
        .extend(blocks.into_iter().map(|b| (file.to_string(), b)));
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
fn block_lines<'a>(block: &'a MatchBlock, skip: &[String]) -> Vec<(usize, &'a str)> {
    block
        .lines
        .iter()
        .filter(|(_, line)| !skip.contains(&split_keyword(line).0.to_ascii_lowercase()))
        .map(|(n, line)| (*n, line.as_str()))
        .collect()
}

impl Settings {
    /// The settings for one login: these, with the lines of every `Match`
    /// block that matches `ctx` on top. As in sshd, the first matching
    /// block to set a keyword wins. `None` when no block matches.
    pub fn for_login(&self, ctx: &MatchContext<'_>) -> Option<Settings> {
        let mut matching = self
            .matches
            .iter()
            .filter(|(_, b)| b.matches(ctx))
            .peekable();
        matching.peek()?;
        let mut effective = self.clone();
        effective.matches.clear();
        let mut set: Vec<String> = Vec::new();
        for (file, block) in matching {
            let lines = block_lines(block, &set);
            // Checked when the file was read; cannot fail here.
            if let Err(e) = apply_lines(&mut effective, file, lines) {
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

/// Applies settings lines (`(line number, trimmed line)`, no `Match`).
fn apply_lines(
    settings: &mut Settings,
    file: &str,
    lines: Vec<(usize, &str)>,
) -> Result<(), ConfigError> {
    let mut accept_env_seen = false;
    for (line_no, line) in lines {
        let err = |message: String| ConfigError {
            file: file.to_string(),
            line: line_no,
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
        match keyword.to_ascii_lowercase().as_str() {
            "listenaddress" => {
                let v = one()?;
                settings.listen.push(parse_listen(v).map_err(err)?);
            }
            "hostkey" => settings.host_keys.push(PathBuf::from(one()?)),
            "kexalgorithms" => {
                settings.kex_algorithms = algorithms::SERVER_KEX.resolve(one()?).map_err(err)?
            }
            "hostkeyalgorithms" => {
                settings.host_key_algorithms =
                    algorithms::SERVER_HOST_KEY.resolve(one()?).map_err(err)?
            }
            "ciphers" => {
                settings.ciphers = algorithms::SERVER_CIPHERS.resolve(one()?).map_err(err)?
            }
            "macs" => settings.macs = algorithms::SERVER_MACS.resolve(one()?).map_err(err)?,
            "hostcertificate" => settings.host_certificates.push(PathBuf::from(one()?)),
            "revokedkeys" => {
                settings.revoked_keys = match one()? {
                    "none" => None,
                    path => Some(PathBuf::from(path)),
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
            "authorizedkeysfile" => settings.authorized_keys = one()?.to_string(),
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
                if !accept_env_seen {
                    settings.accept_env.clear();
                    accept_env_seen = true;
                }
                settings
                    .accept_env
                    .extend(args.iter().map(|s| s.to_string()));
            }
            "permituserenvironment" => {
                settings.permit_user_environment = parse_yes_no(one()?).map_err(err)?
            }
            "logingracetime" => settings.login_grace_time = parse_duration(one()?).map_err(err)?,
            "maxauthtries" => settings.max_auth_tries = parse_count(one()?).map_err(err)?,
            "maxstartups" => {
                // sshd's "start:rate:full" form: skiff honours the hard limit ("full", or the single number).
                let v = one()?;
                let full = v.rsplit(':').next().unwrap_or(v);
                settings.max_startups = parse_count(full).map_err(err)?;
            }
            "maxsessions" => settings.max_sessions = parse_count(one()?).map_err(err)?,
            "clientaliveinterval" => {
                let d = parse_duration(one()?).map_err(err)?;
                settings.client_alive_interval = (!d.is_zero()).then_some(d);
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
                let command = match command.trim() {
                    "" => return Err(err("Subsystem needs a name and a command".into())),
                    "none" => None,
                    // sshd's name for its built-in server: skiffd's own.
                    "internal-sftp" if name == "sftp" => Some(
                        settings
                            .server_exe
                            .as_deref()
                            .and_then(crate::sftp::subsystem_command)
                            .ok_or_else(|| {
                                err("internal-sftp: skiffd cannot name its own executable".into())
                            })?,
                    ),
                    c => Some(c.to_string()),
                };
                match name {
                    "sftp" => settings.sftp_command = command,
                    skiff_proto::dataplane::SUBSYSTEM => settings.transfer_command = command,
                    _ => {
                        return Err(err(format!(
                            "unsupported subsystem {name:?}: only sftp and {} can be configured",
                            skiff_proto::dataplane::SUBSYSTEM
                        )))
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
            "allowtcpforwarding" => {
                let rules = &mut settings.forwarding;
                (rules.local, rules.remote) =
                    crate::forward_policy::parse_allow_forwarding("AllowTcpForwarding", one()?)
                        .map_err(err)?;
            }
            "allowstreamlocalforwarding" => {
                let rules = &mut settings.forwarding;
                (rules.stream_local, rules.stream_remote) =
                    crate::forward_policy::parse_allow_forwarding(
                        "AllowStreamLocalForwarding",
                        one()?,
                    )
                    .map_err(err)?;
            }
            "streamlocalbindmask" => {
                settings.forwarding.bind_mask =
                    skiff_proto::forward_spec::parse_bind_mask(one()?).map_err(err)?
            }
            "streamlocalbindunlink" => {
                settings.forwarding.bind_unlink = parse_yes_no(one()?).map_err(err)?
            }
            "allowagentforwarding" => {
                settings.forwarding.agent = parse_yes_no(one()?).map_err(err)?
            }
            "disableforwarding" => {
                settings.forwarding.disabled = parse_yes_no(one()?).map_err(err)?
            }
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
                    command => Some(command.to_string()),
                }
            }
            "permittty" => settings.permit_tty = parse_yes_no(one()?).map_err(err)?,
            "chrootdirectory" => {
                settings.chroot_directory = match one()? {
                    "none" => None,
                    path if path.starts_with('/') || path.starts_with("%h") => {
                        Some(path.to_string())
                    }
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
            _ => return Err(err(format!("unknown keyword {keyword:?}"))),
        }
    }
    Ok(())
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
        let e = apply_config_text(&mut s, "c", "Subsystem other /bin/x").unwrap_err();
        assert!(e.to_string().contains("only sftp"), "{e}");
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
    fn durations() {
        assert_eq!(parse_duration("120").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h2m3s").unwrap(), Duration::from_secs(3723));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }
}
