//! OpenSSH client configuration (`ssh_config(5)`): parsing, host resolution
//! and `%`-token expansion, without any I/O.
//!
//! The flow mirrors `ssh`:
//!
//! 1. [`parse`] turns the text of one file into a [`ConfigFile`]; [`parse_options`]
//!    does the same for `-o` options (label `"command line"`, line = index + 1).
//!    Syntax and value errors (bad quoting, missing or malformed arguments, bad
//!    `Match` criteria) are reported here as `file:line: message`, for every line,
//!    whether or not its block would apply — as `ssh` does.
//! 2. [`resolve`] applies a list of files in order (for example
//!    `[command line, ~/.ssh/config, /etc/ssh/ssh_config]`) for one destination and
//!    returns a [`HostConfig`]. The first value obtained for a single-valued keyword
//!    wins; `IdentityFile`, `CertificateFile`, `SendEnv` and `SetEnv` accumulate.
//! 3. [`expand_tokens`] expands `%h`, `%p`, `~/` and friends in values such as
//!    `IdentityFile` once the connection parameters are known.
//!
//! Semantics worth knowing:
//!
//! * Lines are `Keyword arguments` or `Keyword=arguments`; keywords are
//!   case-insensitive. Arguments are split on whitespace; `"…"` and `'…'` quote
//!   (quotes are removed, spaces kept), `\"`, `\'`, `\\` and (outside quotes) `\ `
//!   are escapes, and an unquoted word starting with `#` begins a comment.
//! * Unknown keywords are reported by [`resolve`], not [`parse`], because an
//!   `IgnoreUnknown` that covers them may come from an earlier file or from `-o`.
//!   As in `ssh`, this happens for every unknown line reached (active block or
//!   not) unless it matches the `IgnoreUnknown` value in force at that point.
//!   Keywords that `ssh` accepts but skiff does not implement are recorded in
//!   [`HostConfig::ignored`] (only when their block applies).
//! * `Host` patterns are matched, case-insensitively, against the destination
//!   given on the command line ([`MatchContext::original_host`]). `Match host`
//!   uses the `HostName` resolved so far (with `%h` expanded), falling back to
//!   [`MatchContext::host`]; `Match originalhost` uses the original name.
//!   `Match user` uses [`MatchContext::remote_user`] (the command-line user), else
//!   the `User` resolved so far, else [`MatchContext::local_user`].
//! * Two passes: when a `Match` line using `final` is reached during the first
//!   pass, the files are evaluated a second time, as `ssh` does. The second pass
//!   keeps everything set by the first (first value still wins), `Match final`
//!   and `Match canonical` are true in it (both are false in the first pass), and
//!   `Host` lines are matched against the resolved host name (the `HostName`
//!   value, else [`MatchContext::host`]) — the name `ssh` would use after
//!   canonicalisation. Without `Match final` or canonicalisation there is a
//!   single pass.
//! * `CanonicalizeHostname yes` (not through a proxy) or `always`: after the
//!   first pass, a name with at most `CanonicalizeMaxDots` dots (default 1)
//!   that is not an address is tried with each of `CanonicalDomains` in
//!   turn; the first that the caller's `lookup` resolves becomes the host
//!   name, and the second pass runs with it. A name ending in a dot is
//!   taken as it is, without the dot. When nothing resolves and
//!   `CanonicalizeFallbackLocal no` is set, [`HostConfig::unresolved`] says
//!   so and the caller refuses to connect.
//! * `Match exec` runs its command through the caller's callback
//!   ([`resolve_with_exec`]; the parser stays free of I/O), only when every
//!   criterion before it on the line matched; it matches when the command
//!   exits 0. Without a callback, and for `localnetwork`, `sessiontype`,
//!   `command` and `version`, which cannot be evaluated here, a `Match` line
//!   using them (negated or not) never matches, and `"Match exec"` (etc.) is
//!   recorded in [`HostConfig::ignored`].
//! * `Include` may appear anywhere but not on the command line. Its arguments are
//!   handed, one by one, to the caller's `include` closure (which does the globbing,
//!   `~` and relative-path handling and file reading). Included files start in
//!   the including block's state, their own `Host`/`Match` blocks end with the
//!   file, and, as in `ssh`, files included from a block that does not apply are
//!   still read (so their errors surface) but nothing in them applies. Nesting
//!   deeper than [`MAX_INCLUDE_DEPTH`] is an error naming the `Include` line.
//! * `HostName` may contain `%h` and `%%` only; [`HostConfig::hostname`] is
//!   returned with them expanded. Other values are returned verbatim and should
//!   be passed through [`expand_tokens`] where `ssh` expands tokens.
//! * `UserKnownHostsFile`/`GlobalKnownHostsFile` entries equal to `none` are
//!   dropped, so `Some(vec![])` means "no files".

use crate::algorithms;
use crate::pattern::{match_list, wildcard_match, ListMatch};

/// Label used for options given with `-o` (see [`parse_options`]).
pub const COMMAND_LINE_LABEL: &str = "command line";

/// Maximum nesting of `Include` directives before [`resolve`] gives up.
pub const MAX_INCLUDE_DEPTH: usize = 16;

/// Largest time value accepted (matches `ssh`'s `INT_MAX` limit).
const MAX_TIME: u64 = i32::MAX as u64;

/// A configuration error, located at a file and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct ConfigError {
    /// Label of the file (a path, or `"command line"`).
    pub file: String,
    /// 1-based line number (for `-o` options, the option's 1-based index).
    pub line: usize,
    /// Human-readable description.
    pub message: String,
}

impl ConfigError {
    fn new(file: &str, line: usize, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            message: message.into(),
        }
    }
}

/// `StrictHostKeyChecking` values (shared with the known_hosts policy).
pub use crate::known_hosts::StrictHostKeyChecking;

/// `UpdateHostKeys`: whether to learn the host keys a server announces
/// after authentication (OpenSSH's `hostkeys-00@openssh.com`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateHostKeys {
    Yes,
    No,
    /// Ask before changing known_hosts; skiff never asks in the middle of
    /// a session, so this acts as `No` (see README.md).
    Ask,
}

impl UpdateHostKeys {
    /// The value as `ssh -G` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateHostKeys::Yes => "true",
            UpdateHostKeys::No => "false",
            UpdateHostKeys::Ask => "ask",
        }
    }
}

/// `AddKeysToAgent`: what to do with a key read from a file once it has
/// signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddKeysToAgent {
    No,
    /// Add it, asking the agent to confirm each use with `confirm`, and to
    /// forget it after `lifetime` seconds.
    Yes {
        confirm: bool,
        lifetime: Option<u32>,
    },
    /// Ask first (needs an askpass program).
    Ask,
}

/// `ControlPersist` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlPersist {
    /// `no`: the master closes with its initial client.
    No,
    /// `yes` (or a time of `0`): the master stays until told to exit.
    Yes,
    /// The master stays for this many idle seconds (never 0).
    Duration(u64),
}

/// How to reach a host other than by a direct TCP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxySpec {
    /// `ProxyCommand`: a shell command (tokens not yet expanded) whose
    /// standard input and output carry the connection.
    Command(String),
    /// `ProxyJump`: jump hosts, as written (see [`parse_jump_hosts`]).
    Jump(String),
    /// `ProxyCommand none` / `ProxyJump none`: connect directly.
    None,
}

/// One `ProxyJump` hop: `[user@]host[:port]` or `ssh://[user@]host[:port]`,
/// with `[addr]` brackets around an IPv6 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpHost {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

/// Parses a `ProxyJump` value: hops separated by commas, first hop first.
pub fn parse_jump_hosts(value: &str) -> Result<Vec<JumpHost>, String> {
    value.split(',').map(parse_jump_host).collect()
}

fn parse_jump_host(hop: &str) -> Result<JumpHost, String> {
    let bad = |why: &str| format!("bad jump host {hop:?}: {why}");
    let spec = hop.strip_prefix("ssh://").unwrap_or(hop);
    let (user, host_port) = match spec.rsplit_once('@') {
        Some((u, rest)) if !u.is_empty() => (Some(u.to_owned()), rest),
        Some(_) => return Err(bad("empty user name")),
        None => (None, spec),
    };
    let (host, port) = if let Some(inner) = host_port.strip_prefix('[') {
        let (addr, after) = inner.split_once(']').ok_or_else(|| bad("missing \"]\""))?;
        match after {
            "" => (addr, None),
            p => (
                addr,
                Some(p.strip_prefix(':').ok_or_else(|| bad("junk after \"]\""))?),
            ),
        }
    } else {
        match host_port.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(bad("no host name"));
    }
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?,
        ),
        None => None,
    };
    Ok(JumpHost {
        user,
        host: host.to_owned(),
        port,
    })
}

/// `SessionType` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    /// A command, or the login shell.
    Default,
    /// The command names a subsystem (as `ssh -s`).
    Subsystem,
    /// No session at all (as `ssh -N`).
    None,
}

/// `AddressFamily`: which addresses of the host to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AddressFamily {
    #[default]
    Any,
    Inet,
    Inet6,
}

impl AddressFamily {
    /// Whether `addr` is of this family.
    pub fn admits(self, addr: &std::net::IpAddr) -> bool {
        match self {
            AddressFamily::Any => true,
            AddressFamily::Inet => addr.is_ipv4(),
            AddressFamily::Inet6 => addr.is_ipv6(),
        }
    }
}

/// `RequestTTY` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestTty {
    /// `no`/`false`: never request a TTY.
    No,
    /// `yes`/`true`: request a TTY when stdin is a terminal.
    Yes,
    /// `force`: always request a TTY.
    Force,
    /// `auto`: request a TTY when opening a login session.
    Auto,
}

/// The parsed lines of one configuration file, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    label: String,
    lines: Vec<Line>,
}

impl ConfigFile {
    /// The label given to [`parse`] (used in errors and [`HostConfig::ignored`]).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Number of directives (comments and blank lines are not counted).
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// True when the file holds no directive.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    line: usize,
    directive: Directive,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Directive {
    /// Lowercased patterns, possibly `!`-negated.
    Host(Vec<String>),
    Match(Vec<Criterion>),
    Include(Vec<String>),
    /// Lowercased comma-separated pattern list.
    IgnoreUnknown(String),
    HostName(String),
    Port(u16),
    User(String),
    IdentityFile(String),
    CertificateFile(String),
    IdentitiesOnly(bool),
    IdentityAgent(String),
    SecurityKeyProvider(String),
    UserKnownHostsFile(Vec<String>),
    GlobalKnownHostsFile(Vec<String>),
    StrictHostKeyChecking(StrictHostKeyChecking),
    HashKnownHosts(bool),
    UpdateHostKeys(UpdateHostKeys),
    HostKeyAlias(String),
    /// `RevokedHostKeys`: its files, unexpanded.
    RevokedHostKeys(Vec<String>),
    /// An algorithm list, already resolved against the default.
    KexAlgorithms(Vec<String>),
    HostKeyAlgorithms(Vec<String>),
    Ciphers(Vec<String>),
    Macs(Vec<String>),
    CaSignatureAlgorithms(Vec<String>),
    ConnectTimeout(u64),
    AddressFamily(AddressFamily),
    RequiredRsaSize(u32),
    /// `ForwardAgent`: `yes`, `no`, a socket path or `$VAR`, as written.
    ForwardAgent(String),
    /// `KnownHostsCommand`, as written (`none`: None).
    KnownHostsCommand(Option<String>),
    /// `BindAddress`: a numeric address.
    BindAddress(std::net::IpAddr),
    BindInterface(String),
    ServerAliveInterval(u64),
    ServerAliveCountMax(u32),
    BatchMode(bool),
    /// `Compression`: ask for `zlib@openssh.com` first.
    Compression(bool),
    PubkeyAuthentication(bool),
    /// `PasswordAuthentication`.
    PasswordAuthentication(bool),
    /// `KbdInteractiveAuthentication` (and its old name
    /// `ChallengeResponseAuthentication`).
    KbdInteractiveAuthentication(bool),
    /// `PreferredAuthentications`: method names in order, as written.
    PreferredAuthentications(Vec<String>),
    /// `NumberOfPasswordPrompts`.
    NumberOfPasswordPrompts(u32),
    RefuseConnection(bool),
    ControlPersist(ControlPersist),
    SendEnv(Vec<String>),
    SetEnv(Vec<(String, String)>),
    RequestTty(RequestTty),
    /// `RemoteCommand`, kept as written (tokens not yet expanded); `None`
    /// for `none`.
    RemoteCommand(Option<String>),
    /// `LocalCommand`, kept as written (tokens not yet expanded).
    LocalCommand(String),
    PermitLocalCommand(bool),
    StdinNull(bool),
    SessionType(SessionType),
    /// `ProxyCommand` or `ProxyJump`: they share one slot, the first wins.
    Proxy(ProxySpec),
    LogLevel(String),
    Tag(String),
    /// `LocalForward`, `RemoteForward`, `DynamicForward`: they accumulate.
    Forward(crate::forward_spec::ForwardSpec),
    ClearAllForwardings(bool),
    ExitOnForwardFailure(bool),
    GatewayPorts(bool),
    StreamLocalBindMask(u32),
    StreamLocalBindUnlink(bool),
    EscapeChar(crate::escape::EscapeChar),
    CanonicalizeHostname(Canonicalize),
    CanonicalDomains(Vec<String>),
    CanonicalizeMaxDots(u32),
    CanonicalizeFallbackLocal(bool),
    AddKeysToAgent(AddKeysToAgent),
    /// A real `ssh_config` keyword that skiff does not implement (canonical spelling).
    Ignored(&'static str),
    /// A keyword nobody knows (as written).
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Criterion {
    negated: bool,
    kind: CriterionKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum CriterionKind {
    All,
    Canonical,
    Final,
    Host(Vec<String>),
    OriginalHost(Vec<String>),
    User(Vec<String>),
    LocalUser(Vec<String>),
    Tagged(Vec<String>),
    /// `exec "command"`: the command as written (tokens unexpanded), run
    /// by the caller's [`ExecFn`].
    Exec(String),
    /// Needs I/O or session information skiff does not have here.
    Unevaluable(&'static str),
}

/// Keywords skiff implements (or, for `Tag`, whose only effect it implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kw {
    Host,
    Match,
    Include,
    IgnoreUnknown,
    HostName,
    Port,
    User,
    IdentityFile,
    CertificateFile,
    IdentitiesOnly,
    IdentityAgent,
    SecurityKeyProvider,
    UserKnownHostsFile,
    GlobalKnownHostsFile,
    StrictHostKeyChecking,
    HashKnownHosts,
    UpdateHostKeys,
    HostKeyAlias,
    RevokedHostKeys,
    KexAlgorithms,
    HostKeyAlgorithms,
    Ciphers,
    Macs,
    CaSignatureAlgorithms,
    ConnectTimeout,
    AddressFamily,
    RequiredRsaSize,
    ForwardAgent,
    KnownHostsCommand,
    BindAddress,
    BindInterface,
    ServerAliveInterval,
    ServerAliveCountMax,
    BatchMode,
    Compression,
    PubkeyAuthentication,
    PasswordAuthentication,
    KbdInteractiveAuthentication,
    PreferredAuthentications,
    NumberOfPasswordPrompts,
    RefuseConnection,
    ControlPersist,
    SendEnv,
    SetEnv,
    RequestTty,
    RemoteCommand,
    LocalCommand,
    PermitLocalCommand,
    StdinNull,
    SessionType,
    ProxyCommand,
    ProxyJump,
    LogLevel,
    Tag,
    LocalForward,
    RemoteForward,
    DynamicForward,
    ClearAllForwardings,
    ExitOnForwardFailure,
    GatewayPorts,
    StreamLocalBindMask,
    StreamLocalBindUnlink,
    EscapeChar,
    CanonicalizeHostname,
    CanonicalDomains,
    CanonicalizeMaxDots,
    CanonicalizeFallbackLocal,
    AddKeysToAgent,
}

const SUPPORTED: &[(&str, Kw)] = &[
    ("Host", Kw::Host),
    ("Match", Kw::Match),
    ("Include", Kw::Include),
    ("IgnoreUnknown", Kw::IgnoreUnknown),
    ("HostName", Kw::HostName),
    ("Port", Kw::Port),
    ("User", Kw::User),
    ("IdentityFile", Kw::IdentityFile),
    ("CertificateFile", Kw::CertificateFile),
    ("IdentitiesOnly", Kw::IdentitiesOnly),
    ("IdentityAgent", Kw::IdentityAgent),
    ("SecurityKeyProvider", Kw::SecurityKeyProvider),
    ("UserKnownHostsFile", Kw::UserKnownHostsFile),
    ("GlobalKnownHostsFile", Kw::GlobalKnownHostsFile),
    ("StrictHostKeyChecking", Kw::StrictHostKeyChecking),
    ("HashKnownHosts", Kw::HashKnownHosts),
    ("UpdateHostKeys", Kw::UpdateHostKeys),
    ("HostKeyAlias", Kw::HostKeyAlias),
    ("RevokedHostKeys", Kw::RevokedHostKeys),
    ("KexAlgorithms", Kw::KexAlgorithms),
    ("HostKeyAlgorithms", Kw::HostKeyAlgorithms),
    ("Ciphers", Kw::Ciphers),
    ("MACs", Kw::Macs),
    ("CASignatureAlgorithms", Kw::CaSignatureAlgorithms),
    ("ConnectTimeout", Kw::ConnectTimeout),
    ("AddressFamily", Kw::AddressFamily),
    ("RequiredRSASize", Kw::RequiredRsaSize),
    ("ForwardAgent", Kw::ForwardAgent),
    ("KnownHostsCommand", Kw::KnownHostsCommand),
    ("BindAddress", Kw::BindAddress),
    ("BindInterface", Kw::BindInterface),
    ("ServerAliveInterval", Kw::ServerAliveInterval),
    ("ServerAliveCountMax", Kw::ServerAliveCountMax),
    ("BatchMode", Kw::BatchMode),
    ("Compression", Kw::Compression),
    ("PubkeyAuthentication", Kw::PubkeyAuthentication),
    ("PasswordAuthentication", Kw::PasswordAuthentication),
    (
        "KbdInteractiveAuthentication",
        Kw::KbdInteractiveAuthentication,
    ),
    // ssh's older name for the same setting.
    (
        "ChallengeResponseAuthentication",
        Kw::KbdInteractiveAuthentication,
    ),
    ("PreferredAuthentications", Kw::PreferredAuthentications),
    ("NumberOfPasswordPrompts", Kw::NumberOfPasswordPrompts),
    ("RefuseConnection", Kw::RefuseConnection),
    ("ControlPersist", Kw::ControlPersist),
    ("SendEnv", Kw::SendEnv),
    ("SetEnv", Kw::SetEnv),
    ("RequestTTY", Kw::RequestTty),
    ("ProxyCommand", Kw::ProxyCommand),
    ("RemoteCommand", Kw::RemoteCommand),
    ("LocalCommand", Kw::LocalCommand),
    ("PermitLocalCommand", Kw::PermitLocalCommand),
    ("StdinNull", Kw::StdinNull),
    ("SessionType", Kw::SessionType),
    ("ProxyJump", Kw::ProxyJump),
    ("LogLevel", Kw::LogLevel),
    ("Tag", Kw::Tag),
    ("LocalForward", Kw::LocalForward),
    ("RemoteForward", Kw::RemoteForward),
    ("DynamicForward", Kw::DynamicForward),
    ("ClearAllForwardings", Kw::ClearAllForwardings),
    ("ExitOnForwardFailure", Kw::ExitOnForwardFailure),
    ("GatewayPorts", Kw::GatewayPorts),
    ("StreamLocalBindMask", Kw::StreamLocalBindMask),
    ("StreamLocalBindUnlink", Kw::StreamLocalBindUnlink),
    ("EscapeChar", Kw::EscapeChar),
    ("CanonicalizeHostname", Kw::CanonicalizeHostname),
    ("CanonicalDomains", Kw::CanonicalDomains),
    ("CanonicalizeMaxDots", Kw::CanonicalizeMaxDots),
    ("CanonicalizeFallbackLocal", Kw::CanonicalizeFallbackLocal),
    ("AddKeysToAgent", Kw::AddKeysToAgent),
];

/// Keywords accepted by OpenSSH's `ssh` (including deprecated ones it still
/// tolerates, and common vendor additions such as Apple's `UseKeychain` and the
/// GSSAPI key-exchange patches) that skiff does not implement.
const IGNORED: &[&str] = &[
    "AFSTokenPassing",
    "CanonicalizePermittedCNAMEs",
    "ChannelTimeout",
    "CheckHostIP",
    "Cipher",
    "CompressionLevel",
    "ConnectionAttempts",
    "ControlMaster",
    "ControlPath",
    "DSAAuthentication",
    "EnableEscapeCommandline",
    "EnableSSHKeysign",
    "FallBackToRsh",
    "FingerprintHash",
    "ForkAfterAuthentication",
    "ForwardX11",
    "ForwardX11Timeout",
    "ForwardX11Trusted",
    "GlobalKnownHostsFile2",
    "GSSAPIAuthentication",
    "GSSAPIClientIdentity",
    "GSSAPIDelegateCredentials",
    "GSSAPIKeyExchange",
    "GSSAPIKexAlgorithms",
    "GSSAPIRenewalForcesRekey",
    "GSSAPIServerIdentity",
    "GSSAPITrustDns",
    "HostbasedAcceptedAlgorithms",
    "HostbasedAuthentication",
    "HostbasedKeyTypes",
    "IPQoS",
    "KbdInteractiveDevices",
    "KeepAlive",
    "KerberosAuthentication",
    "KerberosTGTPassing",
    "LogVerbose",
    "NoHostAuthenticationForLocalhost",
    "ObscureKeystrokeTiming",
    "PermitRemoteOpen",
    "PKCS11Provider",
    "Protocol",
    "ProxyUseFdpass",
    "PubkeyAcceptedAlgorithms",
    "PubkeyAcceptedKeyTypes",
    "RekeyLimit",
    "RhostsRSAAuthentication",
    "RSAAuthentication",
    "SKeyAuthentication",
    "SmartcardDevice",
    "SyslogFacility",
    "TCPKeepAlive",
    "Tunnel",
    "TunnelDevice",
    "UseBlacklistedKeys",
    "UseKeychain",
    "UsePrivilegedPort",
    "UserKnownHostsFile2",
    "UseRoaming",
    "VerifyHostKeyDNS",
    "VersionAddendum",
    "VisualHostKey",
    "WarnWeakCrypto",
    "XAuthLocation",
];

enum Keyword {
    Supported(&'static str, Kw),
    Ignored(&'static str),
    Unknown,
}

fn lookup_keyword(word: &str) -> Keyword {
    if let Some(&(name, kw)) = SUPPORTED
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(word))
    {
        return Keyword::Supported(name, kw);
    }
    match IGNORED.iter().find(|name| name.eq_ignore_ascii_case(word)) {
        Some(name) => Keyword::Ignored(name),
        None => Keyword::Unknown,
    }
}

/// Whitespace as `ssh` sees it in configuration lines.
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Parses the text of one configuration file. `file_label` names the file in
/// errors and in [`HostConfig::ignored`].
pub fn parse(file_label: &str, text: &str) -> Result<ConfigFile, ConfigError> {
    let mut lines = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        let directive =
            parse_line(raw, false).map_err(|m| ConfigError::new(file_label, line, m))?;
        if let Some(directive) = directive {
            lines.push(Line { line, directive });
        }
    }
    Ok(ConfigFile {
        label: file_label.to_owned(),
        lines,
    })
}

/// Parses `-o` options (`Keyword=Value` or `Keyword Value`), one per element.
/// The result is labelled `"command line"`, with line = index + 1. `Host`,
/// `Match` and `Include` are refused, as `ssh` does.
pub fn parse_options(options: &[String]) -> Result<ConfigFile, ConfigError> {
    let mut lines = Vec::new();
    for (idx, raw) in options.iter().enumerate() {
        let line = idx + 1;
        let directive =
            parse_line(raw, true).map_err(|m| ConfigError::new(COMMAND_LINE_LABEL, line, m))?;
        if let Some(directive) = directive {
            lines.push(Line { line, directive });
        }
    }
    Ok(ConfigFile {
        label: COMMAND_LINE_LABEL.to_owned(),
        lines,
    })
}

/// Parses one line; `Ok(None)` for blank lines and comments.
fn parse_line(raw: &str, command_line: bool) -> Result<Option<Directive>, String> {
    let s = raw.trim_start_matches(is_ws);
    if s.is_empty() || s.starts_with('#') {
        return Ok(None);
    }
    let end = s.find(|c: char| is_ws(c) || c == '=').unwrap_or(s.len());
    let (word, rest) = s.split_at(end);
    if word.is_empty() {
        return Err("missing keyword before \"=\"".to_owned());
    }
    let rest = rest.trim_start_matches(is_ws);
    let rest = rest.strip_prefix('=').unwrap_or(rest);
    let args = split_args(rest)?;
    match lookup_keyword(word) {
        Keyword::Supported(name, kw) => {
            if args.is_empty() {
                return Err(format!("{name}: missing argument"));
            }
            if command_line && matches!(kw, Kw::Host | Kw::Match | Kw::Include) {
                return Err(format!("{name} is not supported as a command-line option"));
            }
            if kw == Kw::RemoteCommand {
                // The rest of the line is the remote command, kept as written.
                return Ok(Some(Directive::RemoteCommand(match args.as_slice() {
                    [none] if none.eq_ignore_ascii_case("none") => None,
                    _ => Some(rest.trim_end_matches(is_ws).to_owned()),
                })));
            }
            if kw == Kw::LocalCommand {
                // A local shell command, kept as written.
                return Ok(Some(Directive::LocalCommand(
                    rest.trim_end_matches(is_ws).to_owned(),
                )));
            }
            if kw == Kw::KnownHostsCommand {
                // A shell command too, kept as written.
                return Ok(Some(Directive::KnownHostsCommand(match args.as_slice() {
                    [none] if none.eq_ignore_ascii_case("none") => None,
                    _ => Some(rest.trim_end_matches(is_ws).to_owned()),
                })));
            }
            if kw == Kw::ProxyCommand {
                // The rest of the line is a shell command, kept as written.
                return Ok(Some(Directive::Proxy(match args.as_slice() {
                    [none] if none.eq_ignore_ascii_case("none") => ProxySpec::None,
                    _ => ProxySpec::Command(rest.trim_end_matches(is_ws).to_owned()),
                })));
            }
            parse_directive(kw, name, args).map(Some)
        }
        Keyword::Ignored(name) => {
            if args.is_empty() {
                return Err(format!("{name}: missing argument"));
            }
            Ok(Some(Directive::Ignored(name)))
        }
        Keyword::Unknown => {
            if args.is_empty() {
                return Err(format!("{word}: missing argument"));
            }
            Ok(Some(Directive::Unknown(word.to_owned())))
        }
    }
}

/// `line` without its trailing comment, as ssh and sshd read their
/// configurations: an unquoted word that starts with `#` ends the line, so
/// `PermitOpen 127.0.0.1:1 # why` is `PermitOpen 127.0.0.1:1`; a `#` inside a
/// word (`a#b`), quoted, or after a backslash is kept.
pub fn without_comment(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    let mut word_start = true;
    for (i, c) in line.char_indices() {
        let literal = std::mem::take(&mut escaped);
        match (quote, c) {
            _ if literal => {}
            (_, '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if word_start => return line[..i].trim_end_matches(is_ws),
            _ => {}
        }
        word_start = quote.is_none() && !literal && is_ws(c);
    }
    line
}

/// Splits arguments the way `ssh` does: whitespace-separated words, `"` and `'`
/// quoting, backslash escapes for quotes, backslash and (unquoted) blanks, and
/// an unquoted word starting with `#` ending the line ([`without_comment`]).
pub fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut chars = without_comment(s).chars().peekable();
    loop {
        while chars.next_if(|&c| is_ws(c)).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.peek() {
                    Some(&n)
                        if matches!(n, '"' | '\'' | '\\')
                            || (quote.is_none() && matches!(n, ' ' | '\t')) =>
                    {
                        word.push(n);
                        chars.next();
                    }
                    _ => word.push('\\'),
                },
                '"' | '\'' => match quote {
                    None => quote = Some(c),
                    Some(q) if q == c => quote = None,
                    Some(_) => word.push(c),
                },
                c if quote.is_none() && is_ws(c) => break,
                c => word.push(c),
            }
        }
        if let Some(q) = quote {
            return Err(format!("unterminated quote ({q})"));
        }
        args.push(word);
    }
    Ok(args)
}

fn single(name: &str, args: Vec<String>) -> Result<String, String> {
    let mut it = args.into_iter();
    let first = it
        .next()
        .ok_or_else(|| format!("{name}: missing argument"))?;
    if let Some(extra) = it.next() {
        return Err(format!("{name}: unexpected extra argument \"{extra}\""));
    }
    if first.is_empty() {
        return Err(format!("{name}: missing argument (empty value)"));
    }
    Ok(first)
}

fn non_empty(name: &str, args: Vec<String>) -> Result<Vec<String>, String> {
    if args.is_empty() {
        return Err(format!("{name}: missing argument"));
    }
    if args.iter().any(String::is_empty) {
        return Err(format!("{name}: empty argument"));
    }
    Ok(args)
}

fn parse_flag(name: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(format!(
            "{name}: expected \"yes\" or \"no\", got \"{value}\""
        )),
    }
}

/// Parses a time value as `ssh` does: a plain number of seconds, or a sequence
/// of numbers each followed by an optional unit (`s`, `m`, `h`, `d`, `w`), e.g.
/// `90`, `1m30s`, `1h30`.
fn parse_time(value: &str) -> Option<u64> {
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let mut n: u64 = 0;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            n = n.checked_mul(10)?.checked_add(u64::from(bytes[i] - b'0'))?;
            n = n.min(MAX_TIME + 1);
            i += 1;
        }
        if i == start {
            return None;
        }
        let mult = match bytes.get(i) {
            None => 1,
            Some(b's' | b'S') => 1,
            Some(b'm' | b'M') => 60,
            Some(b'h' | b'H') => 60 * 60,
            Some(b'd' | b'D') => 24 * 60 * 60,
            Some(b'w' | b'W') => 7 * 24 * 60 * 60,
            Some(_) => return None,
        };
        if i < bytes.len() {
            i += 1;
        }
        total = total.checked_add(n.checked_mul(mult)?)?;
        if total > MAX_TIME {
            return None;
        }
    }
    Some(total)
}

fn parse_time_arg(name: &str, value: &str) -> Result<u64, String> {
    parse_time(value).ok_or_else(|| {
        format!("{name}: invalid time value \"{value}\" (expected seconds, or e.g. 30s, 5m, 1h)")
    })
}

fn parse_u32(name: &str, value: &str) -> Result<u32, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse::<u32>() {
            return Ok(n);
        }
    }
    Err(format!("{name}: invalid number \"{value}\""))
}

fn parse_port(value: &str) -> Result<u16, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse::<u16>() {
            if n != 0 {
                return Ok(n);
            }
        }
    }
    Err(format!("Port: invalid port \"{value}\" (must be 1-65535)"))
}

fn check_hostname_tokens(value: &str) -> Result<(), String> {
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('h' | '%') => {}
                Some(t) => {
                    return Err(format!(
                        "HostName: unknown token %{t} (only %h and %% are allowed)"
                    ))
                }
                None => return Err("HostName: incomplete token (trailing %)".to_owned()),
            }
        }
    }
    Ok(())
}

/// Expands `%h` and `%%` in a `HostName` value already checked by
/// [`check_hostname_tokens`].
fn expand_hostname(value: &str, original_host: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('h') => out.push_str(original_host),
                Some(other) => out.push(other),
                None => out.push('%'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn known_hosts_files(name: &str, args: Vec<String>) -> Result<Vec<String>, String> {
    let files = non_empty(name, args)?;
    Ok(files.into_iter().filter(|f| f != "none").collect())
}

fn parse_directive(kw: Kw, name: &'static str, args: Vec<String>) -> Result<Directive, String> {
    Ok(match kw {
        Kw::Host => Directive::Host(
            non_empty(name, args)?
                .into_iter()
                .map(|p| p.to_ascii_lowercase())
                .collect(),
        ),
        Kw::Match => Directive::Match(parse_match(&args)?),
        Kw::Include => Directive::Include(non_empty(name, args)?),
        Kw::IgnoreUnknown => Directive::IgnoreUnknown(single(name, args)?.to_ascii_lowercase()),
        Kw::HostName => {
            let v = single(name, args)?;
            check_hostname_tokens(&v)?;
            Directive::HostName(v)
        }
        Kw::Port => Directive::Port(parse_port(&single(name, args)?)?),
        Kw::User => Directive::User(single(name, args)?),
        Kw::IdentityFile => Directive::IdentityFile(single(name, args)?),
        Kw::CertificateFile => Directive::CertificateFile(single(name, args)?),
        Kw::IdentitiesOnly => Directive::IdentitiesOnly(parse_flag(name, &single(name, args)?)?),
        Kw::IdentityAgent => Directive::IdentityAgent(single(name, args)?),
        Kw::SecurityKeyProvider => Directive::SecurityKeyProvider(single(name, args)?),
        Kw::UserKnownHostsFile => Directive::UserKnownHostsFile(known_hosts_files(name, args)?),
        Kw::GlobalKnownHostsFile => Directive::GlobalKnownHostsFile(known_hosts_files(name, args)?),
        Kw::StrictHostKeyChecking => {
            let v = single(name, args)?;
            Directive::StrictHostKeyChecking(match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => StrictHostKeyChecking::Yes,
                "no" | "off" | "false" => StrictHostKeyChecking::No,
                "ask" => StrictHostKeyChecking::Ask,
                "accept-new" => StrictHostKeyChecking::AcceptNew,
                _ => {
                    return Err(format!(
                        "{name}: expected yes, no, ask, accept-new or off, got \"{v}\""
                    ))
                }
            })
        }
        Kw::HashKnownHosts => Directive::HashKnownHosts(parse_flag(name, &single(name, args)?)?),
        Kw::UpdateHostKeys => {
            let v = single(name, args)?;
            Directive::UpdateHostKeys(match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => UpdateHostKeys::Yes,
                "no" | "false" => UpdateHostKeys::No,
                "ask" => UpdateHostKeys::Ask,
                _ => return Err(format!("{name}: expected yes, no or ask, got \"{v}\"")),
            })
        }
        // parse_line keeps the command as written; this is the same
        // command rebuilt from its words.
        Kw::ProxyCommand => Directive::Proxy(ProxySpec::Command(args.join(" "))),
        Kw::RemoteCommand => Directive::RemoteCommand(Some(args.join(" "))),
        Kw::LocalCommand => Directive::LocalCommand(args.join(" ")),
        Kw::PermitLocalCommand => {
            Directive::PermitLocalCommand(parse_flag(name, &single(name, args)?)?)
        }
        Kw::StdinNull => Directive::StdinNull(parse_flag(name, &single(name, args)?)?),
        Kw::SessionType => {
            let v = single(name, args)?;
            Directive::SessionType(match v.to_ascii_lowercase().as_str() {
                "default" => SessionType::Default,
                "subsystem" => SessionType::Subsystem,
                "none" => SessionType::None,
                _ => {
                    return Err(format!(
                        "{name}: expected default, subsystem or none, got \"{v}\""
                    ))
                }
            })
        }
        Kw::ProxyJump => {
            let v = single(name, args)?;
            Directive::Proxy(if v.eq_ignore_ascii_case("none") {
                ProxySpec::None
            } else {
                parse_jump_hosts(&v).map_err(|e| format!("{name}: {e}"))?;
                ProxySpec::Jump(v)
            })
        }
        Kw::KexAlgorithms => {
            Directive::KexAlgorithms(algorithms::KEX.resolve(&single(name, args)?)?)
        }
        Kw::HostKeyAlgorithms => {
            Directive::HostKeyAlgorithms(algorithms::HOST_KEY.resolve(&single(name, args)?)?)
        }
        Kw::Ciphers => Directive::Ciphers(algorithms::CIPHERS.resolve(&single(name, args)?)?),
        Kw::Macs => Directive::Macs(algorithms::MACS.resolve(&single(name, args)?)?),
        Kw::CaSignatureAlgorithms => Directive::CaSignatureAlgorithms(
            algorithms::CA_SIGNATURE.resolve(&single(name, args)?)?,
        ),
        Kw::HostKeyAlias => Directive::HostKeyAlias(single(name, args)?.to_ascii_lowercase()),
        Kw::RevokedHostKeys => {
            if args.is_empty() || args.iter().any(String::is_empty) {
                return Err(format!("{name}: missing argument"));
            }
            if args.len() > 1 && args.iter().any(|a| a == "none") {
                return Err(format!("{name}: none cannot be listed with files"));
            }
            Directive::RevokedHostKeys(args)
        }
        Kw::AddressFamily => {
            let v = single(name, args)?;
            Directive::AddressFamily(match v.to_ascii_lowercase().as_str() {
                "any" => AddressFamily::Any,
                "inet" => AddressFamily::Inet,
                "inet6" => AddressFamily::Inet6,
                _ => return Err(format!("{name}: expected any, inet or inet6, got \"{v}\"")),
            })
        }
        Kw::BindAddress => {
            let v = single(name, args)?;
            let ip = v
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| format!("{name}: \"{v}\" is not an IP address"))?;
            Directive::BindAddress(ip)
        }
        Kw::BindInterface => Directive::BindInterface(single(name, args)?),
        Kw::RequiredRsaSize => {
            let v = single(name, args)?;
            match v.parse::<u32>() {
                Ok(bits) if (1024..=16384).contains(&bits) => Directive::RequiredRsaSize(bits),
                _ => {
                    return Err(format!(
                        "{name}: expected a number of bits from 1024 to 16384, got \"{v}\""
                    ))
                }
            }
        }
        Kw::ForwardAgent => {
            let v = single(name, args)?;
            match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => Directive::ForwardAgent("yes".into()),
                "no" | "false" => Directive::ForwardAgent("no".into()),
                _ => Directive::ForwardAgent(v),
            }
        }
        // Kept as written by parse_line.
        Kw::KnownHostsCommand => Directive::KnownHostsCommand(Some(args.join(" "))),
        Kw::ConnectTimeout => {
            Directive::ConnectTimeout(parse_time_arg(name, &single(name, args)?)?)
        }
        Kw::ServerAliveInterval => {
            Directive::ServerAliveInterval(parse_time_arg(name, &single(name, args)?)?)
        }
        Kw::ServerAliveCountMax => {
            Directive::ServerAliveCountMax(parse_u32(name, &single(name, args)?)?)
        }
        Kw::BatchMode => Directive::BatchMode(parse_flag(name, &single(name, args)?)?),
        Kw::Compression => Directive::Compression(parse_flag(name, &single(name, args)?)?),
        Kw::PubkeyAuthentication => {
            // OpenSSH 8.9 also takes `unbound` and `host-bound`, both "yes" here.
            let v = single(name, args)?;
            Directive::PubkeyAuthentication(match v.to_ascii_lowercase().as_str() {
                "unbound" | "host-bound" => true,
                _ => parse_flag(name, &v)?,
            })
        }
        Kw::PasswordAuthentication => {
            Directive::PasswordAuthentication(parse_flag(name, &single(name, args)?)?)
        }
        Kw::KbdInteractiveAuthentication => {
            Directive::KbdInteractiveAuthentication(parse_flag(name, &single(name, args)?)?)
        }
        Kw::PreferredAuthentications => {
            let v = single(name, args)?;
            let methods: Vec<String> = v.split(',').map(str::to_string).collect();
            if methods.iter().any(String::is_empty) {
                return Err(format!("{name}: empty method name in \"{v}\""));
            }
            Directive::PreferredAuthentications(methods)
        }
        Kw::NumberOfPasswordPrompts => {
            Directive::NumberOfPasswordPrompts(parse_u32(name, &single(name, args)?)?)
        }
        Kw::RefuseConnection => {
            Directive::RefuseConnection(parse_flag(name, &single(name, args)?)?)
        }
        Kw::ControlPersist => {
            let v = single(name, args)?;
            Directive::ControlPersist(match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => ControlPersist::Yes,
                "no" | "false" => ControlPersist::No,
                _ => match parse_time(&v) {
                    Some(0) => ControlPersist::Yes,
                    Some(secs) => ControlPersist::Duration(secs),
                    None => {
                        return Err(format!(
                            "{name}: expected yes, no or a time (e.g. 10m), got \"{v}\""
                        ))
                    }
                },
            })
        }
        Kw::LocalForward | Kw::RemoteForward => {
            use crate::forward_spec::parse_forward;
            // `[bind:]port host:hostport`: the same fields as -L/-R.
            let remote = kw == Kw::RemoteForward;
            let spec = match args.as_slice() {
                [listen, target] => format!("{listen}:{target}"),
                [listen] if remote => listen.clone(),
                _ => {
                    return Err(format!(
                        "{name}: expected [bind_address:]port host:hostport (or a socket path at either end)"
                    ))
                }
            };
            Directive::Forward(parse_forward(&spec, remote).map_err(|e| format!("{name}: {e}"))?)
        }
        Kw::DynamicForward => match crate::forward_spec::parse_dynamic(&single(name, args)?) {
            Ok(f) => Directive::Forward(f),
            Err(e) if e.unsupported => Directive::Ignored("DynamicForward"),
            Err(e) => return Err(format!("{name}: {e}")),
        },
        Kw::ClearAllForwardings => {
            Directive::ClearAllForwardings(parse_flag(name, &single(name, args)?)?)
        }
        Kw::ExitOnForwardFailure => {
            Directive::ExitOnForwardFailure(parse_flag(name, &single(name, args)?)?)
        }
        Kw::GatewayPorts => Directive::GatewayPorts(parse_flag(name, &single(name, args)?)?),
        Kw::StreamLocalBindMask => Directive::StreamLocalBindMask(
            crate::forward_spec::parse_bind_mask(&single(name, args)?)?,
        ),
        Kw::CanonicalizeHostname => {
            let v = single(name, args)?;
            Directive::CanonicalizeHostname(match v.to_ascii_lowercase().as_str() {
                "no" | "false" | "none" => Canonicalize::No,
                "yes" | "true" => Canonicalize::Yes,
                "always" => Canonicalize::Always,
                _ => return Err(format!("{name}: expected yes, no or always, got \"{v}\"")),
            })
        }
        Kw::CanonicalDomains => {
            if args.is_empty() {
                return Err(format!("{name}: expected one or more domains"));
            }
            if let Some(bad) = args.iter().find(|d| {
                d.is_empty()
                    || d.starts_with('.')
                    || !d
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
            }) {
                return Err(format!("{name}: \"{bad}\" is not a domain name"));
            }
            if args.iter().any(|d| d == "none") {
                Directive::CanonicalDomains(Vec::new())
            } else {
                Directive::CanonicalDomains(
                    args.iter()
                        .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
                        .collect(),
                )
            }
        }
        Kw::CanonicalizeMaxDots => {
            let v = single(name, args)?;
            Directive::CanonicalizeMaxDots(
                v.parse()
                    .map_err(|_| format!("{name}: expected a number, got \"{v}\""))?,
            )
        }
        Kw::AddKeysToAgent => {
            // `yes`, `no`, `ask`, `confirm`, a time, or `confirm` and a time.
            let bad = || {
                format!(
                    "{name}: expected yes, no, ask, confirm or a time (e.g. 1h), got \"{}\"",
                    args.join(" ")
                )
            };
            let lower: Vec<String> = args.iter().map(|a| a.to_ascii_lowercase()).collect();
            let lifetime = |v: &str| -> Result<Option<u32>, String> {
                match parse_time(v) {
                    Some(0) => Ok(None),
                    Some(secs) => u32::try_from(secs).map(Some).map_err(|_| bad()),
                    None => Err(bad()),
                }
            };
            Directive::AddKeysToAgent(
                match lower
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .as_slice()
                {
                    ["no" | "false"] => AddKeysToAgent::No,
                    ["yes" | "true"] => AddKeysToAgent::Yes {
                        confirm: false,
                        lifetime: None,
                    },
                    ["ask"] => AddKeysToAgent::Ask,
                    ["confirm"] => AddKeysToAgent::Yes {
                        confirm: true,
                        lifetime: None,
                    },
                    ["confirm", time] => AddKeysToAgent::Yes {
                        confirm: true,
                        lifetime: lifetime(time)?,
                    },
                    [time] => AddKeysToAgent::Yes {
                        confirm: false,
                        lifetime: lifetime(time)?,
                    },
                    _ => return Err(bad()),
                },
            )
        }
        Kw::CanonicalizeFallbackLocal => {
            Directive::CanonicalizeFallbackLocal(parse_flag(name, &single(name, args)?)?)
        }
        Kw::EscapeChar => Directive::EscapeChar(
            crate::escape::parse_escape_char(&single(name, args)?)
                .map_err(|e| format!("{name}: {e}"))?,
        ),
        Kw::StreamLocalBindUnlink => {
            Directive::StreamLocalBindUnlink(parse_flag(name, &single(name, args)?)?)
        }
        Kw::SendEnv => {
            let pats = non_empty(name, args)?;
            if let Some(bad) = pats.iter().find(|p| p.contains('=')) {
                return Err(format!(
                    "{name}: invalid environment variable pattern \"{bad}\" (contains '=')"
                ));
            }
            Directive::SendEnv(pats)
        }
        Kw::SetEnv => {
            let mut vars = Vec::new();
            for arg in non_empty(name, args)? {
                match arg.split_once('=') {
                    Some((k, v)) if !k.is_empty() => vars.push((k.to_owned(), v.to_owned())),
                    _ => return Err(format!("{name}: expected NAME=VALUE, got \"{arg}\"")),
                }
            }
            Directive::SetEnv(vars)
        }
        Kw::RequestTty => {
            let v = single(name, args)?;
            Directive::RequestTty(match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => RequestTty::Yes,
                "no" | "false" => RequestTty::No,
                "force" => RequestTty::Force,
                "auto" => RequestTty::Auto,
                _ => {
                    return Err(format!(
                        "{name}: expected yes, no, force or auto, got \"{v}\""
                    ))
                }
            })
        }
        Kw::LogLevel => {
            let v = single(name, args)?;
            // SILENT is QUIET's other name (the one `ssh -G` prints).
            let upper = match v.to_ascii_uppercase() {
                silent if silent == "SILENT" => "QUIET".to_string(),
                upper => upper,
            };
            const LEVELS: &[&str] = &[
                "QUIET", "FATAL", "ERROR", "INFO", "VERBOSE", "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3",
            ];
            if !LEVELS.contains(&upper.as_str()) {
                return Err(format!(
                    "{name}: unknown log level \"{v}\" (expected one of {})",
                    LEVELS.join(", ")
                ));
            }
            Directive::LogLevel(upper)
        }
        Kw::Tag => Directive::Tag(single(name, args)?),
    })
}

fn parse_match(args: &[String]) -> Result<Vec<Criterion>, String> {
    if args.is_empty() {
        return Err("Match: missing criteria".to_owned());
    }
    let mut out = Vec::new();
    let mut rest = args.iter();
    while let Some(raw) = rest.next() {
        let (negated, word) = match raw.strip_prefix('!') {
            Some(name) => (true, name),
            None => (false, raw.as_str()),
        };
        // `criterion=value` is the same as `criterion value` (OpenSSH 10).
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (word, None),
        };
        let lname = name.to_ascii_lowercase();
        if inline.is_some() && matches!(lname.as_str(), "all" | "canonical" | "final") {
            return Err(format!("Match: \"{name}\" takes no argument"));
        }
        let kind = match lname.as_str() {
            "all" => CriterionKind::All,
            "canonical" => CriterionKind::Canonical,
            "final" => CriterionKind::Final,
            "host" | "originalhost" | "user" | "localuser" | "tagged" | "exec" | "localnetwork"
            | "sessiontype" | "command" | "version" => {
                let arg = inline
                    .or_else(|| rest.next().map(String::as_str))
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("Match: missing argument for \"{name}\""))?;
                let list = |lower: bool| -> Vec<String> {
                    arg.split(',')
                        .map(|p| {
                            if lower {
                                p.to_ascii_lowercase()
                            } else {
                                p.to_owned()
                            }
                        })
                        .collect()
                };
                match lname.as_str() {
                    "host" => CriterionKind::Host(list(true)),
                    "originalhost" => CriterionKind::OriginalHost(list(true)),
                    "user" => CriterionKind::User(list(false)),
                    "localuser" => CriterionKind::LocalUser(list(false)),
                    "tagged" => CriterionKind::Tagged(list(false)),
                    "exec" => CriterionKind::Exec(arg.to_owned()),
                    "localnetwork" => CriterionKind::Unevaluable("localnetwork"),
                    "sessiontype" => CriterionKind::Unevaluable("sessiontype"),
                    "command" => CriterionKind::Unevaluable("command"),
                    _ => CriterionKind::Unevaluable("version"),
                }
            }
            _ => return Err(format!("Match: unsupported criterion \"{name}\"")),
        };
        out.push(Criterion { negated, kind });
    }
    let has_all = out.iter().any(|c| c.kind == CriterionKind::All);
    let has_other = out.iter().any(|c| {
        !matches!(
            c.kind,
            CriterionKind::All | CriterionKind::Canonical | CriterionKind::Final
        )
    });
    if has_all && has_other {
        return Err(
            "Match: \"all\" cannot be combined with criteria other than \"canonical\" or \"final\""
                .to_owned(),
        );
    }
    Ok(out)
}

/// What the destination looks like while matching `Host` and `Match` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchContext {
    /// The destination as given on the command line (`Host`, `Match originalhost`).
    pub original_host: String,
    /// The destination host for `Match host` until a `HostName` is found
    /// (normally the same as `original_host`).
    pub host: String,
    /// User given on the command line (`user@host` or `-l`), if any.
    pub remote_user: Option<String>,
    /// Name of the local user (`Match localuser`, default for `Match user`).
    pub local_user: String,
}

/// The settings that apply to one destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// `HostName`, with `%h` and `%%` expanded.
    pub hostname: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    /// Every `IdentityFile` that applies, in order, without duplicates (unexpanded).
    pub identity_files: Vec<String>,
    /// Every `CertificateFile` that applies, in order, without duplicates
    /// (unexpanded).
    pub certificate_files: Vec<String>,
    pub identities_only: Option<bool>,
    /// Unexpanded; may be `none` or `SSH_AUTH_SOCK`.
    pub identity_agent: Option<String>,
    /// `SecurityKeyProvider`: the FIDO middleware ssh would load. skiff
    /// signs with security keys only through ssh-agent, and names it when
    /// saying how to load such a key there.
    pub security_key_provider: Option<String>,
    /// Unexpanded; `Some(vec![])` means `none`.
    pub user_known_hosts_files: Option<Vec<String>>,
    /// Unexpanded; `Some(vec![])` means `none`.
    pub global_known_hosts_files: Option<Vec<String>>,
    pub strict_host_key_checking: Option<StrictHostKeyChecking>,
    pub hash_known_hosts: Option<bool>,
    /// `UpdateHostKeys`; unset means ssh's default (see the engine's settings).
    pub update_host_keys: Option<UpdateHostKeys>,
    /// `HostKeyAlias`, lowercased: the name host keys are looked up and
    /// recorded under instead of the host name (and without a port).
    pub host_key_alias: Option<String>,
    /// `RevokedHostKeys`: its files, unexpanded (`none` alone: no file). A
    /// key revoked in any of them is refused.
    pub revoked_host_keys: Option<Vec<String>>,
    /// `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`, `MACs`, resolved
    /// against skiff's defaults (see [`crate::algorithms`]).
    pub kex_algorithms: Option<Vec<String>>,
    pub host_key_algorithms: Option<Vec<String>>,
    pub ciphers: Option<Vec<String>>,
    pub macs: Option<Vec<String>>,
    pub ca_signature_algorithms: Option<Vec<String>>,
    /// Seconds.
    pub connect_timeout: Option<u64>,
    pub address_family: Option<AddressFamily>,
    pub required_rsa_size: Option<u32>,
    /// `ForwardAgent`: `yes`, `no`, or a socket path or `$VAR` (unexpanded).
    pub forward_agent: Option<String>,
    /// `KnownHostsCommand`, unexpanded; `Some(None)` for `none`.
    pub known_hosts_command: Option<Option<String>>,
    pub bind_address: Option<std::net::IpAddr>,
    pub bind_interface: Option<String>,
    /// Seconds; 0 disables keep-alives.
    pub server_alive_interval: Option<u64>,
    pub server_alive_count_max: Option<u32>,
    pub batch_mode: Option<bool>,
    /// `Compression` (ssh's `-C`).
    pub compression: Option<bool>,
    pub pubkey_authentication: Option<bool>,
    pub password_authentication: Option<bool>,
    pub kbd_interactive_authentication: Option<bool>,
    /// `PreferredAuthentications`: method names in order, as written.
    pub preferred_authentications: Option<Vec<String>>,
    pub number_of_password_prompts: Option<u32>,
    /// `RefuseConnection yes`: connecting is an error (with where it was set).
    pub refuse_connection: Option<(bool, String)>,
    pub control_persist: Option<ControlPersist>,
    /// `SendEnv` patterns, accumulated; `-pattern` removes earlier matching entries.
    pub send_env: Vec<String>,
    /// `SetEnv` variables, accumulated; the first value for a name wins.
    pub set_env: Vec<(String, String)>,
    pub request_tty: Option<RequestTty>,
    /// `RemoteCommand`, unexpanded; `Some(None)` for `none`.
    pub remote_command: Option<Option<String>>,
    /// `LocalCommand`, unexpanded: run locally once connected, only under
    /// `PermitLocalCommand yes`.
    pub local_command: Option<String>,
    pub permit_local_command: Option<bool>,
    pub stdin_null: Option<bool>,
    pub session_type: Option<SessionType>,
    /// `ProxyCommand` or `ProxyJump`, whichever came first.
    pub proxy: Option<ProxySpec>,
    /// Upper-case level name (`QUIET`, `FATAL`, `ERROR`, `INFO`, `VERBOSE`, `DEBUG`, `DEBUG1`-`DEBUG3`).
    pub log_level: Option<String>,
    /// `LocalForward`, `RemoteForward`, `DynamicForward`, accumulated
    /// without duplicates.
    pub forwards: Vec<crate::forward_spec::ForwardSpec>,
    pub clear_all_forwardings: Option<bool>,
    pub exit_on_forward_failure: Option<bool>,
    pub gateway_ports: Option<bool>,
    /// `StreamLocalBindMask`: mode bits a local forwarding's socket does not get.
    pub stream_local_bind_mask: Option<u32>,
    /// `StreamLocalBindUnlink`: replace an existing socket file.
    pub stream_local_bind_unlink: Option<bool>,
    /// `EscapeChar`: what starts an escape sequence in a terminal session.
    pub escape_char: Option<crate::escape::EscapeChar>,
    pub canonicalize_hostname: Option<Canonicalize>,
    /// `CanonicalDomains`, lowercased, without trailing dots.
    pub canonical_domains: Option<Vec<String>>,
    pub canonicalize_max_dots: Option<u32>,
    pub canonicalize_fallback_local: Option<bool>,
    pub add_keys_to_agent: Option<AddKeysToAgent>,
    /// The name canonicalisation could not resolve in any of
    /// `CanonicalDomains` under `CanonicalizeFallbackLocal no`: the
    /// caller must not connect.
    pub unresolved: Option<String>,
    /// `(keyword, "file:line")` for applicable `ssh` options that skiff does not
    /// implement (and `"Match exec"` etc. for unevaluable criteria), for `-v`.
    pub ignored: Vec<(String, String)>,
}

/// The `include` callback of [`resolve`]: `(argument, including file label)` to
/// the parsed files the argument designates, in lexical order.
pub type IncludeFn<'a> = dyn FnMut(&str, &str) -> Result<Vec<ConfigFile>, ConfigError> + 'a;

/// Resolves the configuration for one destination.
///
/// `files` are applied in order (e.g. `[command line, user config, system
/// config]`); within and across them the first value obtained for a
/// single-valued keyword wins, while `IdentityFile`, `SendEnv` and `SetEnv`
/// accumulate. `include` is called for each `Include` argument (whitespace-split,
/// unexpanded: it may contain globs, `~` and relative paths) with the label of
/// the including file, and returns the parsed files it designates, in lexical
/// order; its errors are returned unchanged. See the module documentation for
/// matching and two-pass semantics.
pub fn resolve(
    files: &[ConfigFile],
    ctx: &MatchContext,
    include: &mut IncludeFn<'_>,
) -> Result<HostConfig, ConfigError> {
    resolve_canonical(files, ctx, include, &mut |_| false)
}

/// `CanonicalizeHostname`'s setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canonicalize {
    No,
    /// Unless the connection goes through a proxy.
    Yes,
    /// Even through a proxy.
    Always,
}

/// What canonicalisation makes of a host name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonicalName {
    /// Not a name to canonicalise (an address, or too many dots).
    Unchanged,
    Found(String),
    /// Searched for in every domain, and not found.
    NotFound,
}

/// Canonicalises `host` with `domains`; `lookup` says whether a name
/// resolves.
pub fn canonical_name(
    host: &str,
    domains: &[String],
    max_dots: u32,
    lookup: &mut dyn FnMut(&str) -> bool,
) -> CanonicalName {
    let unbracketed = host.trim_start_matches('[').trim_end_matches(']');
    if unbracketed.parse::<std::net::IpAddr>().is_ok() || host.is_empty() {
        return CanonicalName::Unchanged;
    }
    // Already fully qualified: as it is, less the root's dot.
    if let Some(fqdn) = host.strip_suffix('.') {
        return CanonicalName::Found(fqdn.to_string());
    }
    let dots = host.matches('.').count();
    if dots > max_dots as usize || domains.is_empty() {
        return CanonicalName::Unchanged;
    }
    for domain in domains {
        let candidate = format!("{host}.{domain}");
        if lookup(&candidate) {
            return CanonicalName::Found(candidate);
        }
    }
    CanonicalName::NotFound
}

/// [`resolve`], with host-name canonicalisation (see the module
/// documentation): `lookup` says whether a name resolves. `Match exec`
/// never matches here (see [`resolve_with_exec`]).
pub fn resolve_canonical(
    files: &[ConfigFile],
    ctx: &MatchContext,
    include: &mut IncludeFn<'_>,
    lookup: &mut dyn FnMut(&str) -> bool,
) -> Result<HostConfig, ConfigError> {
    resolve_evaluating(files, ctx, include, lookup, None)
}

/// What a `Match exec` line asks the caller to run, with what the
/// configuration has settled so far for its `%`-tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchExec<'a> {
    /// The command as written, tokens not yet expanded.
    pub command: &'a str,
    /// `%h`: the `HostName` so far, else the destination host.
    pub host: &'a str,
    /// `%n`: the destination as given.
    pub original_host: &'a str,
    /// `%r`: the user `Match user` would see.
    pub user: &'a str,
    /// `Port` so far (a command-line port wins over it; 22 when neither).
    pub port: Option<u16>,
}

/// The `exec` callback of [`resolve_with_exec`]: runs a `Match exec`
/// command; `Ok(true)` when it exited 0. An error (the command could not
/// be run at all) is reported at the `Match` line.
pub type ExecFn<'a> = dyn FnMut(&MatchExec<'_>) -> Result<bool, String> + 'a;

/// [`resolve_canonical`], with `Match exec` commands run by `exec`. As in
/// ssh, a command runs only when every criterion before it on its line
/// matched, in order, and again in the second pass.
pub fn resolve_with_exec(
    files: &[ConfigFile],
    ctx: &MatchContext,
    include: &mut IncludeFn<'_>,
    lookup: &mut dyn FnMut(&str) -> bool,
    exec: &mut ExecFn<'_>,
) -> Result<HostConfig, ConfigError> {
    resolve_evaluating(files, ctx, include, lookup, Some(exec))
}

fn resolve_evaluating(
    files: &[ConfigFile],
    ctx: &MatchContext,
    include: &mut IncludeFn<'_>,
    lookup: &mut dyn FnMut(&str) -> bool,
    exec: Option<&mut ExecFn<'_>>,
) -> Result<HostConfig, ConfigError> {
    let mut r = Resolver {
        ctx,
        include,
        exec,
        cfg: HostConfig::default(),
        ignore_unknown: None,
        tag: None,
        final_pass: false,
        want_final_pass: false,
        host_line_target: ctx.original_host.to_ascii_lowercase(),
    };
    for file in files {
        r.process_file(file, true, false, 0)?;
    }
    let mode = r.cfg.canonicalize_hostname.unwrap_or(Canonicalize::No);
    if mode == Canonicalize::Always || (mode == Canonicalize::Yes && r.cfg.proxy.is_none()) {
        let host = r.effective_host().to_string();
        let domains = r.cfg.canonical_domains.clone().unwrap_or_default();
        let max_dots = r.cfg.canonicalize_max_dots.unwrap_or(1);
        match canonical_name(&host, &domains, max_dots, lookup) {
            CanonicalName::Found(name) => r.cfg.hostname = Some(name),
            CanonicalName::NotFound if r.cfg.canonicalize_fallback_local == Some(false) => {
                r.cfg.unresolved = Some(host)
            }
            CanonicalName::NotFound | CanonicalName::Unchanged => {}
        }
        r.want_final_pass = true;
    }
    if r.want_final_pass {
        r.final_pass = true;
        r.host_line_target = r.effective_host().to_ascii_lowercase();
        for file in files {
            r.process_file(file, true, false, 0)?;
        }
    }
    Ok(r.cfg)
}

struct Resolver<'a, 'b, 'c> {
    ctx: &'a MatchContext,
    include: &'a mut IncludeFn<'b>,
    /// Runs `Match exec` commands; without it they never match.
    exec: Option<&'a mut ExecFn<'c>>,
    cfg: HostConfig,
    /// Lowercased `IgnoreUnknown` pattern list.
    ignore_unknown: Option<String>,
    tag: Option<String>,
    final_pass: bool,
    want_final_pass: bool,
    /// Lowercased name `Host` lines are matched against.
    host_line_target: String,
}

impl Resolver<'_, '_, '_> {
    /// `active`: whether lines before the first `Host`/`Match` apply.
    /// `never_match`: the file was included from a block that does not apply,
    /// so nothing in it may apply.
    fn process_file(
        &mut self,
        file: &ConfigFile,
        active: bool,
        never_match: bool,
        depth: usize,
    ) -> Result<(), ConfigError> {
        let mut active = active && !never_match;
        for line in &file.lines {
            match &line.directive {
                Directive::Host(patterns) => {
                    active = !never_match
                        && match_list(patterns.iter().map(String::as_str), &self.host_line_target)
                            == ListMatch::Positive;
                }
                Directive::Match(criteria) => {
                    active = self.eval_match(criteria, never_match, file, line.line)?;
                }
                Directive::Include(args) => {
                    if depth >= MAX_INCLUDE_DEPTH {
                        return Err(ConfigError::new(
                            &file.label,
                            line.line,
                            format!(
                                "Include nested more than {MAX_INCLUDE_DEPTH} levels deep \
                                 (is a file including itself?)"
                            ),
                        ));
                    }
                    for arg in args {
                        let included = (self.include)(arg, &file.label)?;
                        for inc in &included {
                            self.process_file(inc, active, !active, depth + 1)?;
                        }
                    }
                }
                Directive::Unknown(word) => {
                    let lower = word.to_ascii_lowercase();
                    let ignored = self
                        .ignore_unknown
                        .as_deref()
                        .is_some_and(|pats| match_list(pats.split(','), &lower).is_match());
                    if !ignored {
                        return Err(ConfigError::new(
                            &file.label,
                            line.line,
                            format!(
                                "unknown configuration option \"{word}\" \
                                 (list it in IgnoreUnknown to skip it)"
                            ),
                        ));
                    }
                }
                other => {
                    if active {
                        self.apply(other, file, line.line);
                    }
                }
            }
        }
        Ok(())
    }

    /// The host `Match host` sees: the `HostName` so far, else the context's host.
    fn effective_host(&self) -> &str {
        self.cfg.hostname.as_deref().unwrap_or(&self.ctx.host)
    }

    fn eval_match(
        &mut self,
        criteria: &[Criterion],
        never_match: bool,
        file: &ConfigFile,
        line: usize,
    ) -> Result<bool, ConfigError> {
        let mut result = true;
        for c in criteria {
            if c.kind == CriterionKind::Final {
                self.want_final_pass = true;
            }
            let value = match &c.kind {
                CriterionKind::All => true,
                CriterionKind::Canonical | CriterionKind::Final => self.final_pass,
                CriterionKind::Host(pats) => {
                    let host = self.effective_host().to_ascii_lowercase();
                    list_matches(pats, &host)
                }
                CriterionKind::OriginalHost(pats) => {
                    list_matches(pats, &self.ctx.original_host.to_ascii_lowercase())
                }
                CriterionKind::User(pats) => {
                    let user = self
                        .ctx
                        .remote_user
                        .as_deref()
                        .or(self.cfg.user.as_deref())
                        .unwrap_or(&self.ctx.local_user);
                    list_matches(pats, user)
                }
                CriterionKind::LocalUser(pats) => list_matches(pats, &self.ctx.local_user),
                CriterionKind::Tagged(pats) => {
                    list_matches(pats, self.tag.as_deref().unwrap_or(""))
                }
                CriterionKind::Exec(command) => {
                    // Run only when everything before it matched, as ssh
                    // does: a command may be slow, or have effects.
                    if !result || never_match {
                        continue;
                    }
                    let Some(exec) = self.exec.as_mut() else {
                        let loc = format!("{}:{}", file.label, line);
                        push_ignored(&mut self.cfg.ignored, "Match exec", loc);
                        result = false;
                        continue;
                    };
                    let user = self
                        .ctx
                        .remote_user
                        .as_deref()
                        .or(self.cfg.user.as_deref())
                        .unwrap_or(&self.ctx.local_user);
                    let host = self.cfg.hostname.as_deref().unwrap_or(&self.ctx.host);
                    let probe = MatchExec {
                        command,
                        host,
                        original_host: &self.ctx.original_host,
                        user,
                        port: self.cfg.port,
                    };
                    exec(&probe).map_err(|e| {
                        ConfigError::new(
                            &file.label,
                            line,
                            format!("Match exec \"{command}\": {e}"),
                        )
                    })?
                }
                CriterionKind::Unevaluable(what) => {
                    // ssh would only run it if everything before it matched.
                    if result && !never_match {
                        let loc = format!("{}:{}", file.label, line);
                        push_ignored(&mut self.cfg.ignored, &format!("Match {what}"), loc);
                    }
                    result = false;
                    continue;
                }
            };
            if value == c.negated {
                result = false;
            }
        }
        Ok(result && !never_match)
    }

    fn apply(&mut self, directive: &Directive, file: &ConfigFile, line: usize) {
        fn first<T: Clone>(slot: &mut Option<T>, value: &T) {
            if slot.is_none() {
                *slot = Some(value.clone());
            }
        }
        let cfg = &mut self.cfg;
        match directive {
            Directive::IgnoreUnknown(v) => first(&mut self.ignore_unknown, v),
            Directive::Tag(v) => first(&mut self.tag, v),
            Directive::HostName(v) => {
                if cfg.hostname.is_none() {
                    cfg.hostname = Some(expand_hostname(v, &self.ctx.original_host));
                }
            }
            Directive::Port(v) => first(&mut cfg.port, v),
            Directive::User(v) => first(&mut cfg.user, v),
            Directive::IdentityFile(v) => {
                if !cfg.identity_files.contains(v) {
                    cfg.identity_files.push(v.clone());
                }
            }
            Directive::CertificateFile(v) => {
                if !cfg.certificate_files.contains(v) {
                    cfg.certificate_files.push(v.clone());
                }
            }
            Directive::IdentitiesOnly(v) => first(&mut cfg.identities_only, v),
            Directive::IdentityAgent(v) => first(&mut cfg.identity_agent, v),
            Directive::SecurityKeyProvider(v) => first(&mut cfg.security_key_provider, v),
            Directive::UserKnownHostsFile(v) => first(&mut cfg.user_known_hosts_files, v),
            Directive::GlobalKnownHostsFile(v) => first(&mut cfg.global_known_hosts_files, v),
            Directive::StrictHostKeyChecking(v) => first(&mut cfg.strict_host_key_checking, v),
            Directive::HashKnownHosts(v) => first(&mut cfg.hash_known_hosts, v),
            Directive::UpdateHostKeys(v) => first(&mut cfg.update_host_keys, v),
            Directive::HostKeyAlias(v) => first(&mut cfg.host_key_alias, v),
            Directive::RevokedHostKeys(v) => first(&mut cfg.revoked_host_keys, v),
            Directive::KexAlgorithms(v) => first(&mut cfg.kex_algorithms, v),
            Directive::HostKeyAlgorithms(v) => first(&mut cfg.host_key_algorithms, v),
            Directive::Ciphers(v) => first(&mut cfg.ciphers, v),
            Directive::Macs(v) => first(&mut cfg.macs, v),
            Directive::CaSignatureAlgorithms(v) => first(&mut cfg.ca_signature_algorithms, v),
            Directive::Proxy(v) => first(&mut cfg.proxy, v),
            Directive::ConnectTimeout(v) => first(&mut cfg.connect_timeout, v),
            Directive::AddressFamily(v) => first(&mut cfg.address_family, v),
            Directive::RequiredRsaSize(v) => first(&mut cfg.required_rsa_size, v),
            Directive::ForwardAgent(v) => first(&mut cfg.forward_agent, v),
            Directive::KnownHostsCommand(v) => first(&mut cfg.known_hosts_command, v),
            Directive::BindAddress(v) => first(&mut cfg.bind_address, v),
            Directive::BindInterface(v) => first(&mut cfg.bind_interface, v),
            Directive::ServerAliveInterval(v) => first(&mut cfg.server_alive_interval, v),
            Directive::ServerAliveCountMax(v) => first(&mut cfg.server_alive_count_max, v),
            Directive::BatchMode(v) => first(&mut cfg.batch_mode, v),
            Directive::Compression(v) => first(&mut cfg.compression, v),
            Directive::PubkeyAuthentication(v) => first(&mut cfg.pubkey_authentication, v),
            Directive::PasswordAuthentication(v) => first(&mut cfg.password_authentication, v),
            Directive::KbdInteractiveAuthentication(v) => {
                first(&mut cfg.kbd_interactive_authentication, v)
            }
            Directive::PreferredAuthentications(v) => first(&mut cfg.preferred_authentications, v),
            Directive::NumberOfPasswordPrompts(v) => first(&mut cfg.number_of_password_prompts, v),
            Directive::RefuseConnection(v) => {
                let at = format!("{}:{}", file.label, line);
                first(&mut cfg.refuse_connection, &(*v, at))
            }
            Directive::ControlPersist(v) => first(&mut cfg.control_persist, v),
            Directive::SendEnv(patterns) => {
                for p in patterns {
                    if let Some(remove) = p.strip_prefix('-') {
                        cfg.send_env.retain(|e| !wildcard_match(remove, e));
                    } else if !cfg.send_env.contains(p) {
                        cfg.send_env.push(p.clone());
                    }
                }
            }
            Directive::SetEnv(vars) => {
                for (k, v) in vars {
                    if !cfg.set_env.iter().any(|(ek, _)| ek == k) {
                        cfg.set_env.push((k.clone(), v.clone()));
                    }
                }
            }
            Directive::RequestTty(v) => first(&mut cfg.request_tty, v),
            Directive::RemoteCommand(v) => first(&mut cfg.remote_command, v),
            Directive::LocalCommand(v) => first(&mut cfg.local_command, v),
            Directive::PermitLocalCommand(v) => first(&mut cfg.permit_local_command, v),
            Directive::StdinNull(v) => first(&mut cfg.stdin_null, v),
            Directive::SessionType(v) => first(&mut cfg.session_type, v),
            Directive::LogLevel(v) => first(&mut cfg.log_level, v),
            Directive::Forward(f) => {
                if !cfg.forwards.contains(f) {
                    cfg.forwards.push(f.clone());
                }
            }
            Directive::ClearAllForwardings(v) => first(&mut cfg.clear_all_forwardings, v),
            Directive::ExitOnForwardFailure(v) => first(&mut cfg.exit_on_forward_failure, v),
            Directive::GatewayPorts(v) => first(&mut cfg.gateway_ports, v),
            Directive::StreamLocalBindMask(v) => first(&mut cfg.stream_local_bind_mask, v),
            Directive::StreamLocalBindUnlink(v) => first(&mut cfg.stream_local_bind_unlink, v),
            Directive::EscapeChar(v) => first(&mut cfg.escape_char, v),
            Directive::CanonicalizeHostname(v) => first(&mut cfg.canonicalize_hostname, v),
            Directive::CanonicalDomains(v) => first(&mut cfg.canonical_domains, v),
            Directive::CanonicalizeMaxDots(v) => first(&mut cfg.canonicalize_max_dots, v),
            Directive::CanonicalizeFallbackLocal(v) => {
                first(&mut cfg.canonicalize_fallback_local, v)
            }
            Directive::AddKeysToAgent(v) => first(&mut cfg.add_keys_to_agent, v),
            Directive::Ignored(name) => {
                let loc = format!("{}:{}", file.label, line);
                push_ignored(&mut cfg.ignored, name, loc);
            }
            // Handled by `process_file`.
            Directive::Host(_)
            | Directive::Match(_)
            | Directive::Include(_)
            | Directive::Unknown(_) => {}
        }
    }
}

fn list_matches(patterns: &[String], text: &str) -> bool {
    match_list(patterns.iter().map(String::as_str), text) == ListMatch::Positive
}

fn push_ignored(ignored: &mut Vec<(String, String)>, keyword: &str, location: String) {
    if !ignored.iter().any(|(k, l)| k == keyword && *l == location) {
        ignored.push((keyword.to_owned(), location));
    }
}

/// Values for [`expand_tokens`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenContext {
    /// `%h`: the remote host name, after `HostName`.
    pub host: String,
    /// `%n`: the host name as given on the command line.
    pub original_host: String,
    /// `%r`: the remote user name.
    pub remote_user: String,
    /// `%u`: the local user name.
    pub local_user: String,
    /// `%p`: the remote port.
    pub port: u16,
    /// `%d` and leading `~`: the local user's home directory.
    pub home: String,
    /// `%l`: the local host name including its domain; `%L` is the part
    /// before the first dot.
    pub local_hostname: String,
    /// `%i`: the local user id.
    pub uid: u32,
}

/// Expands a leading `~` or `~/` (to the home directory) and the tokens `%h`,
/// `%n`, `%r`, `%u`, `%p`, `%d`, `%l`, `%L`, `%i` and `%%`. Any other token, a
/// trailing `%`, or `~user` is an error whose message names the problem.
pub fn expand_tokens(s: &str, ctx: &TokenContext) -> Result<String, String> {
    expand_tokens_keeping(s, ctx, "")
}

/// [`expand_tokens`], leaving the tokens named in `kept` (e.g. `"kt"` for
/// `%k` and `%t`) as they are, and `%%` as `%%`, for a later pass that
/// knows their values (see [`expand_late_tokens`]).
pub fn expand_tokens_keeping(s: &str, ctx: &TokenContext, kept: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    if let Some(after) = s.strip_prefix('~') {
        if after.is_empty() {
            return Ok(ctx.home.clone());
        }
        match after.strip_prefix('/') {
            Some(tail) => {
                out.push_str(ctx.home.trim_end_matches('/'));
                out.push('/');
                rest = tail;
            }
            None => {
                let user = after.split('/').next().unwrap_or(after);
                return Err(format!(
                    "cannot expand \"~{user}\" in \"{s}\": only ~ and ~/ are supported"
                ));
            }
        }
    }
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(t) if !kept.is_empty() && (t == '%' || kept.contains(t)) => {
                out.push('%');
                out.push(t);
            }
            Some('%') => out.push('%'),
            Some('h') => out.push_str(&ctx.host),
            Some('n') => out.push_str(&ctx.original_host),
            Some('r') => out.push_str(&ctx.remote_user),
            Some('u') => out.push_str(&ctx.local_user),
            Some('p') => out.push_str(&ctx.port.to_string()),
            Some('d') => out.push_str(&ctx.home),
            Some('l') => out.push_str(&ctx.local_hostname),
            Some('L') => out.push_str(
                ctx.local_hostname
                    .split('.')
                    .next()
                    .unwrap_or(&ctx.local_hostname),
            ),
            Some('i') => out.push_str(&ctx.uid.to_string()),
            Some(t) => return Err(format!("unknown token %{t} in \"{s}\"")),
            None => return Err(format!("incomplete token (trailing %) in \"{s}\"")),
        }
    }
    Ok(out)
}

/// Whether a host or user name given on the command line may be put into
/// a shell command through a `%`-token (`Match exec`, `LocalCommand`): not
/// with a quote, `$`, `` ` ``, `\`, `;`, `&`, `|`, `<`, `>`, parentheses,
/// braces, whitespace or a control character, nor with a leading `-`. ssh
/// refuses such names on its command line for the same reason.
pub fn shell_safe_name(name: &str) -> bool {
    !name.starts_with('-')
        && !name.chars().any(|c| {
            c.is_whitespace()
                || c.is_control()
                || matches!(
                    c,
                    '\'' | '"'
                        | '`'
                        | '$'
                        | '\\'
                        | ';'
                        | '&'
                        | '|'
                        | '<'
                        | '>'
                        | '('
                        | ')'
                        | '{'
                        | '}'
                )
        })
}

/// `%C`: the hex SHA-1 of `%l%h%p%r%j` (local host name, remote host,
/// port, remote user, `ProxyJump`), as ssh computes it.
pub fn connection_hash(
    local_hostname: &str,
    host: &str,
    port: u16,
    user: &str,
    jump: &str,
) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(format!("{local_hostname}{host}{port}{user}{jump}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The second pass after [`expand_tokens_keeping`]: `%X` for each
/// `(X, value)` in `values`, and `%%` to `%`. Any other token is an error.
pub fn expand_late_tokens(s: &str, values: &[(char, &str)]) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(t) => match values.iter().find(|(k, _)| *k == t) {
                Some((_, v)) => out.push_str(v),
                None => return Err(format!("unknown token %{t} in \"{s}\"")),
            },
            None => return Err(format!("incomplete token (trailing %) in \"{s}\"")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn tokens_can_be_left_for_a_later_pass() {
        let ctx = TokenContext {
            host: "h.example".into(),
            original_host: "h".into(),
            remote_user: "bob".into(),
            local_user: "alice".into(),
            port: 2222,
            home: "/home/alice".into(),
            local_hostname: "me.local".into(),
            uid: 1000,
        };
        let first = expand_tokens_keeping("lookup %h:%p %k %t %%k %H", &ctx, "ktH").unwrap();
        assert_eq!(first, "lookup h.example:2222 %k %t %%k %H");
        let second =
            expand_late_tokens(&first, &[('k', "AAAA"), ('t', "ssh-ed25519"), ('H', "h")]).unwrap();
        assert_eq!(second, "lookup h.example:2222 AAAA ssh-ed25519 %k h");
        assert!(expand_late_tokens("%x", &[]).unwrap_err().contains("%x"));
        assert!(expand_tokens_keeping("%x", &ctx, "k").is_err());
    }

    fn ctx(host: &str) -> MatchContext {
        MatchContext {
            original_host: host.to_owned(),
            host: host.to_owned(),
            remote_user: None,
            local_user: "alice".to_owned(),
        }
    }

    fn no_include(_: &str, _: &str) -> Result<Vec<ConfigFile>, ConfigError> {
        Ok(Vec::new())
    }

    /// Resolves a single file for `host` with no includes.
    fn res(text: &str, host: &str) -> HostConfig {
        let file = parse("cfg", text).unwrap();
        resolve(&[file], &ctx(host), &mut no_include).unwrap()
    }

    fn res_err(text: &str, host: &str) -> String {
        let file = parse("cfg", text).unwrap();
        resolve(&[file], &ctx(host), &mut no_include)
            .unwrap_err()
            .to_string()
    }

    fn parse_err(text: &str) -> String {
        parse("cfg", text).unwrap_err().to_string()
    }

    #[test]
    fn security_key_provider_is_read_first_value_wins() {
        let cfg = res(
            "Host h\n  SecurityKeyProvider /usr/lib/sk.so\nHost *\n  SecurityKeyProvider internal\n",
            "h",
        );
        assert_eq!(cfg.security_key_provider.as_deref(), Some("/usr/lib/sk.so"));
        assert_eq!(res("", "h").security_key_provider, None);
        assert!(parse_err("SecurityKeyProvider\n").contains("cfg:1"));
    }

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// An include closure serving files from a map of path -> text.
    fn fs_include(
        files: &HashMap<&str, &str>,
        calls: &mut Vec<(String, String)>,
        arg: &str,
        from: &str,
    ) -> Result<Vec<ConfigFile>, ConfigError> {
        calls.push((arg.to_owned(), from.to_owned()));
        match files.get(arg) {
            Some(text) => Ok(vec![parse(arg, text)?]),
            None => Ok(Vec::new()),
        }
    }

    // ---- lexical syntax ----

    #[test]
    fn error_display_names_file_and_line() {
        let e = ConfigError::new("a/b", 7, "oops");
        assert_eq!(e.to_string(), "a/b:7: oops");
        let _: &dyn std::error::Error = &e;
    }

    #[test]
    fn separators_case_and_comments() {
        let c = res(
            "# comment\n\n   \nPORT 2222\nuser=bob\n\tHostName = real.example.com  # trailing\nBatchMode\t= yes\n",
            "x",
        );
        assert_eq!(c.port, Some(2222));
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(c.hostname.as_deref(), Some("real.example.com"));
        assert_eq!(c.batch_mode, Some(true));
    }

    #[test]
    fn crlf_line_endings() {
        let c = res("Port 22\r\nUser bob\r\n", "x");
        assert_eq!(c.port, Some(22));
        assert_eq!(c.user.as_deref(), Some("bob"));
    }

    #[test]
    fn quoted_arguments() {
        let c = res(
            "IdentityFile \"~/my keys/id ed25519\"\nIdentityFile 'single quoted'\nIdentityFile a\"b c\"d\nIdentityFile esc\\\"aped\nIdentityFile \"has # hash\"\n",
            "x",
        );
        assert_eq!(
            c.identity_files,
            vec![
                "~/my keys/id ed25519",
                "single quoted",
                "ab cd",
                "esc\"aped",
                "has # hash"
            ]
        );
    }

    #[test]
    fn backslash_not_before_special_is_literal() {
        let c = res("IdentityFile C:\\Users\\me\\key\n", "x");
        assert_eq!(c.identity_files, vec!["C:\\Users\\me\\key"]);
    }

    #[test]
    fn unterminated_quote_is_error_with_location() {
        assert_eq!(
            parse_err("Port 22\n\nIdentityFile \"~/.ssh/id\n"),
            "cfg:3: unterminated quote (\")"
        );
        // Even for keywords skiff ignores, and for unknown keywords.
        assert!(parse_err("ProxyCommand sh -c 'nc %h\n").starts_with("cfg:1: unterminated quote"));
        assert!(parse_err("Bogus \"x\n").starts_with("cfg:1: unterminated quote"));
    }

    #[test]
    fn missing_keyword_before_equals() {
        assert_eq!(parse_err("= 22\n"), "cfg:1: missing keyword before \"=\"");
    }

    #[test]
    fn line_numbers_count_blank_and_comment_lines() {
        let e = parse_err("# one\n\nHost x\n  # four\n  Port nope\n");
        assert_eq!(e, "cfg:5: Port: invalid port \"nope\" (must be 1-65535)");
    }

    // ---- value validation ----

    #[test]
    fn bad_ports() {
        for bad in ["0", "65536", "abc", "-1", "+22", "22x", "99999999999"] {
            let e = parse_err(&format!("Port {bad}\n"));
            assert_eq!(
                e,
                format!("cfg:1: Port: invalid port \"{bad}\" (must be 1-65535)")
            );
        }
        assert_eq!(res("Port 65535\n", "x").port, Some(65535));
        assert_eq!(res("Port 1\n", "x").port, Some(1));
    }

    #[test]
    fn missing_argument() {
        assert_eq!(parse_err("Port\n"), "cfg:1: Port: missing argument");
        assert_eq!(
            parse_err("Host a\n  User\n"),
            "cfg:2: User: missing argument"
        );
        assert_eq!(parse_err("Port # c\n"), "cfg:1: Port: missing argument");
        assert_eq!(parse_err("port=\n"), "cfg:1: Port: missing argument");
        assert_eq!(
            parse_err("HostName \"\"\n"),
            "cfg:1: HostName: missing argument (empty value)"
        );
        assert_eq!(parse_err("Host\n"), "cfg:1: Host: missing argument");
        assert_eq!(
            parse_err("ForwardAgent\n"),
            "cfg:1: ForwardAgent: missing argument"
        );
        assert_eq!(
            parse_err("Frobnicate\n"),
            "cfg:1: Frobnicate: missing argument"
        );
        assert_eq!(
            parse_err("UserKnownHostsFile a \"\"\n"),
            "cfg:1: UserKnownHostsFile: empty argument"
        );
    }

    #[test]
    fn extra_argument() {
        assert_eq!(
            parse_err("User bob carol\n"),
            "cfg:1: User: unexpected extra argument \"carol\""
        );
        assert_eq!(
            parse_err("IdentityFile a b\n"),
            "cfg:1: IdentityFile: unexpected extra argument \"b\""
        );
    }

    #[test]
    fn host_key_alias_is_lowercased_and_first_wins() {
        let text = "Host web*\n  HostKeyAlias Web1.Example.TEST\nHost *\n  HostKeyAlias other\n";
        assert_eq!(
            res(text, "web1").host_key_alias.as_deref(),
            Some("web1.example.test")
        );
        assert_eq!(res(text, "db1").host_key_alias.as_deref(), Some("other"));
        assert_eq!(res("Port 22\n", "x").host_key_alias, None);
        assert_eq!(
            parse_err("HostKeyAlias a b\n"),
            "cfg:1: HostKeyAlias: unexpected extra argument \"b\""
        );
    }

    #[test]
    fn flags() {
        assert_eq!(res("BatchMode no\n", "x").batch_mode, Some(false));
        assert_eq!(res("BatchMode TRUE\n", "x").batch_mode, Some(true));
        assert_eq!(res("Compression yes\n", "x").compression, Some(true));
        assert!(res("Compression yes\n", "x").ignored.is_empty());
        assert_eq!(
            res("IdentitiesOnly false\n", "x").identities_only,
            Some(false)
        );
        assert_eq!(
            res("HashKnownHosts Yes\n", "x").hash_known_hosts,
            Some(true)
        );
        assert_eq!(
            parse_err("\nBatchMode maybe\n"),
            "cfg:2: BatchMode: expected \"yes\" or \"no\", got \"maybe\""
        );
    }

    #[test]
    fn time_values() {
        assert_eq!(parse_time("10"), Some(10));
        assert_eq!(parse_time("10s"), Some(10));
        assert_eq!(parse_time("1m"), Some(60));
        assert_eq!(parse_time("1h30m"), Some(5400));
        assert_eq!(parse_time("1h30"), Some(3630));
        assert_eq!(parse_time("2d"), Some(172_800));
        assert_eq!(parse_time("1W"), Some(604_800));
        assert_eq!(parse_time("0"), Some(0));
        assert_eq!(parse_time(""), None);
        assert_eq!(parse_time("s"), None);
        assert_eq!(parse_time("10x"), None);
        assert_eq!(parse_time("-1"), None);
        assert_eq!(parse_time("1 m"), None);
        assert_eq!(parse_time("2147483647"), Some(2_147_483_647));
        assert_eq!(parse_time("2147483648"), None);
        assert_eq!(parse_time("99999999999999999999999999w"), None);
        assert_eq!(parse_time("10000000w"), None);

        let c = res(
            "ConnectTimeout 1m\nServerAliveInterval 15\nServerAliveCountMax 3\n",
            "x",
        );
        assert_eq!(c.connect_timeout, Some(60));
        assert_eq!(c.server_alive_interval, Some(15));
        assert_eq!(c.server_alive_count_max, Some(3));
        assert_eq!(
            parse_err("ConnectTimeout soon\n"),
            "cfg:1: ConnectTimeout: invalid time value \"soon\" (expected seconds, or e.g. 30s, 5m, 1h)"
        );
        assert_eq!(
            parse_err("ServerAliveCountMax 3s\n"),
            "cfg:1: ServerAliveCountMax: invalid number \"3s\""
        );
    }

    #[test]
    fn control_persist() {
        let cp = |v: &str| res(&format!("ControlPersist {v}\n"), "x").control_persist;
        assert_eq!(cp("yes"), Some(ControlPersist::Yes));
        assert_eq!(cp("no"), Some(ControlPersist::No));
        assert_eq!(cp("0"), Some(ControlPersist::Yes));
        assert_eq!(cp("10m"), Some(ControlPersist::Duration(600)));
        assert_eq!(cp("30"), Some(ControlPersist::Duration(30)));
        assert!(parse_err("ControlPersist forever\n").starts_with("cfg:1: ControlPersist:"));
    }

    #[test]
    fn update_host_keys() {
        let u = |v: &str| res(&format!("UpdateHostKeys {v}\n"), "x").update_host_keys;
        assert_eq!(u("yes"), Some(UpdateHostKeys::Yes));
        assert_eq!(u("True"), Some(UpdateHostKeys::Yes));
        assert_eq!(u("no"), Some(UpdateHostKeys::No));
        assert_eq!(u("false"), Some(UpdateHostKeys::No));
        assert_eq!(u("ask"), Some(UpdateHostKeys::Ask));
        assert_eq!(res("Port 2\n", "x").update_host_keys, None);
        assert_eq!(
            parse_err("UpdateHostKeys sometimes\n"),
            "cfg:1: UpdateHostKeys: expected yes, no or ask, got \"sometimes\""
        );
    }

    #[test]
    fn strict_host_key_checking() {
        let s =
            |v: &str| res(&format!("StrictHostKeyChecking {v}\n"), "x").strict_host_key_checking;
        assert_eq!(s("yes"), Some(StrictHostKeyChecking::Yes));
        assert_eq!(s("no"), Some(StrictHostKeyChecking::No));
        assert_eq!(s("off"), Some(StrictHostKeyChecking::No));
        assert_eq!(s("ask"), Some(StrictHostKeyChecking::Ask));
        assert_eq!(s("accept-new"), Some(StrictHostKeyChecking::AcceptNew));
        assert_eq!(s("Accept-New"), Some(StrictHostKeyChecking::AcceptNew));
        assert_eq!(
            parse_err("StrictHostKeyChecking sometimes\n"),
            "cfg:1: StrictHostKeyChecking: expected yes, no, ask, accept-new or off, got \"sometimes\""
        );
    }

    #[test]
    fn remote_command_session_type_and_stdin_null() {
        let c = res(
            "Host x\n  RemoteCommand tmux new -A -s \"main %h\"\n  StdinNull yes\n  SessionType subsystem\n",
            "x",
        );
        assert_eq!(
            c.remote_command,
            Some(Some("tmux new -A -s \"main %h\"".to_string()))
        );
        assert_eq!(c.stdin_null, Some(true));
        assert_eq!(c.session_type, Some(SessionType::Subsystem));
        assert_eq!(res("RemoteCommand none\n", "x").remote_command, Some(None));
        assert!(
            parse_err("SessionType sometimes\n").contains("expected default, subsystem or none")
        );
    }

    #[test]
    fn refuse_connection_records_where() {
        let c = res(
            "Host x\n  RefuseConnection yes\nHost *\n  RefuseConnection no\n",
            "x",
        );
        assert_eq!(c.refuse_connection, Some((true, "cfg:2".to_string())));
        let c = res("Host x\n  RefuseConnection yes\n", "y");
        assert_eq!(c.refuse_connection, None);
    }

    #[test]
    fn revoked_host_keys_first_value_wins() {
        let c = res(
            "Host x\n  RevokedHostKeys ~/.ssh/revoked.krl\nHost *\n  RevokedHostKeys /etc/other\n",
            "x",
        );
        assert_eq!(c.revoked_host_keys.unwrap(), ["~/.ssh/revoked.krl"]);
        let c = res("RevokedHostKeys /a ~/b\nRevokedHostKeys /c\n", "x");
        assert_eq!(c.revoked_host_keys.unwrap(), ["/a", "~/b"]);
        assert_eq!(
            parse_err("RevokedHostKeys /a none\n"),
            "cfg:1: RevokedHostKeys: none cannot be listed with files"
        );
    }

    #[test]
    fn request_tty_and_log_level() {
        let c = res("RequestTTY force\nLogLevel debug2\n", "x");
        assert_eq!(c.request_tty, Some(RequestTty::Force));
        assert_eq!(c.log_level.as_deref(), Some("DEBUG2"));
        assert_eq!(
            res("requesttty auto\n", "x").request_tty,
            Some(RequestTty::Auto)
        );
        assert!(parse_err("RequestTTY always\n").starts_with("cfg:1: RequestTTY:"));
        assert!(parse_err("LogLevel LOUD\n").starts_with("cfg:1: LogLevel: unknown log level"));
        assert_eq!(
            res("LogLevel silent\n", "x").log_level.as_deref(),
            Some("QUIET")
        );
    }

    #[test]
    fn known_hosts_files() {
        let c = res(
            "UserKnownHostsFile ~/.ssh/known_hosts \"~/.ssh/known hosts 2\"\nGlobalKnownHostsFile none\n",
            "x",
        );
        assert_eq!(
            c.user_known_hosts_files,
            Some(vec![
                "~/.ssh/known_hosts".to_owned(),
                "~/.ssh/known hosts 2".to_owned()
            ])
        );
        assert_eq!(c.global_known_hosts_files, Some(vec![]));
    }

    #[test]
    fn send_env_accumulates_and_removes() {
        let c = res(
            "SendEnv LANG LC_*\nHost x\n  SendEnv FOO LANG\n  SendEnv -LC_*\nHost *\n  SendEnv BAR\n",
            "x",
        );
        assert_eq!(c.send_env, vec!["LANG", "FOO", "BAR"]);
        assert_eq!(
            parse_err("SendEnv A=b\n"),
            "cfg:1: SendEnv: invalid environment variable pattern \"A=b\" (contains '=')"
        );
    }

    #[test]
    fn set_env_accumulates_first_value_per_name_wins() {
        let c = res(
            "SetEnv A=1 \"B=two words\"\nHost *\n  SetEnv A=overridden C= D=x=y\n",
            "x",
        );
        assert_eq!(
            c.set_env,
            vec![
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "two words".to_owned()),
                ("C".to_owned(), String::new()),
                ("D".to_owned(), "x=y".to_owned()),
            ]
        );
        assert_eq!(
            parse_err("SetEnv FOO\n"),
            "cfg:1: SetEnv: expected NAME=VALUE, got \"FOO\""
        );
        assert_eq!(
            parse_err("SetEnv A=1 =x\n"),
            "cfg:1: SetEnv: expected NAME=VALUE, got \"=x\""
        );
    }

    // ---- unknown and ignored keywords ----

    #[test]
    fn unknown_keyword_is_error_at_resolve() {
        let text = "Port 22\nHost other\n  Frobnicate yes\n";
        // Parsing succeeds; the error comes from resolve, even in an inactive block.
        assert!(parse("cfg", text).is_ok());
        assert_eq!(
            res_err(text, "x"),
            "cfg:3: unknown configuration option \"Frobnicate\" (list it in IgnoreUnknown to skip it)"
        );
    }

    #[test]
    fn ignore_unknown_is_honoured() {
        let c = res(
            "IgnoreUnknown frob*,Other\nFrobnicate yes\nOTHER 1\nPort 22\n",
            "x",
        );
        assert_eq!(c.port, Some(22));
        // IgnoreUnknown only covers lines after it.
        assert!(res_err("Frobnicate yes\nIgnoreUnknown Frobnicate\n", "x").starts_with("cfg:1:"));
        // An IgnoreUnknown in a block that does not apply is not set.
        assert!(res_err(
            "Host other\n IgnoreUnknown Frobnicate\nHost *\n Frobnicate 1\n",
            "x"
        )
        .starts_with("cfg:4:"));
        // Negated pattern.
        assert!(res_err("IgnoreUnknown *,!frobnicate\nFrobnicate 1\n", "x").starts_with("cfg:2:"));
    }

    #[test]
    fn password_and_keyboard_interactive_settings_are_read() {
        let c = res(
            "PasswordAuthentication no\nChallengeResponseAuthentication no\n\
             KbdInteractiveAuthentication yes\nPreferredAuthentications password,publickey\n\
             NumberOfPasswordPrompts 1\n",
            "x",
        );
        assert_eq!(c.password_authentication, Some(false));
        // The old name and the new set one thing: the first value wins.
        assert_eq!(c.kbd_interactive_authentication, Some(false));
        assert_eq!(
            c.preferred_authentications,
            Some(vec!["password".to_string(), "publickey".to_string()])
        );
        assert_eq!(c.number_of_password_prompts, Some(1));
        assert!(c.ignored.is_empty());
        assert_eq!(
            parse_err("NumberOfPasswordPrompts three\n"),
            "cfg:1: NumberOfPasswordPrompts: invalid number \"three\""
        );
        assert!(parse_err("PreferredAuthentications password,,publickey\n").starts_with("cfg:1:"));
        assert!(parse_err("PasswordAuthentication maybe\n").starts_with("cfg:1:"));
    }

    #[test]
    fn ignore_unknown_from_command_line_covers_later_files() {
        let cmd = parse_options(&opts(&["IgnoreUnknown=UseFancyThing"])).unwrap();
        let user = parse("user", "UseFancyThing yes\nPort 2\n").unwrap();
        let c = resolve(&[cmd, user], &ctx("x"), &mut no_include).unwrap();
        assert_eq!(c.port, Some(2));
    }

    #[test]
    fn ignored_keywords_are_recorded_when_active() {
        let c = res(
            "CheckHostIP yes\nHost other\n  CheckHostIP yes\nHost *\n  forwardx11 yes\n  UseKeychain yes\n  CheckHostIP no\n",
            "x",
        );
        assert_eq!(
            c.ignored,
            vec![
                ("CheckHostIP".to_owned(), "cfg:1".to_owned()),
                ("ForwardX11".to_owned(), "cfg:5".to_owned()),
                ("UseKeychain".to_owned(), "cfg:6".to_owned()),
                ("CheckHostIP".to_owned(), "cfg:7".to_owned()),
            ]
        );
    }

    #[test]
    fn ignored_list_is_well_formed() {
        for name in IGNORED {
            assert!(
                matches!(lookup_keyword(name), Keyword::Ignored(n) if n == *name),
                "{name} is duplicated or shadowed by a supported keyword"
            );
        }
    }

    // ---- Host blocks and precedence ----

    #[test]
    fn forwardings_accumulate_in_every_form() {
        use crate::forward_spec::ForwardSpec;
        let text = "Host web\n  LocalForward 8080 db:5432\n  ExitOnForwardFailure yes\n\
                    Host *\n  LocalForward 8080 db:5432\n  RemoteForward 127.0.0.1:9000 localhost:80\n\
                    DynamicForward 1080\n  RemoteForward /tmp/s /run/x.sock\n  GatewayPorts no\n\
                    ExitOnForwardFailure no\n  ClearAllForwardings no\n  RemoteForward 1081\n";
        let c = res(text, "web");
        let shown: Vec<String> = c.forwards.iter().map(ForwardSpec::to_string).collect();
        assert_eq!(
            shown,
            [
                "-L 8080:db:5432",
                "-R 127.0.0.1:9000:localhost:80",
                "-D 1080",
                "-R /tmp/s:/run/x.sock",
                "-R 1081"
            ]
        );
        assert_eq!(c.exit_on_forward_failure, Some(true));
        assert_eq!(c.gateway_ports, Some(false));
        assert_eq!(c.clear_all_forwardings, Some(false));
        assert!(c.ignored.is_empty(), "{:?}", c.ignored);
        let c = res("StreamLocalBindMask 0117\nStreamLocalBindUnlink yes\n", "x");
        assert_eq!(c.stream_local_bind_mask, Some(0o117));
        assert_eq!(c.stream_local_bind_unlink, Some(true));
        assert!(parse_err("StreamLocalBindMask rw\n").contains("StreamLocalBindMask"));
        use crate::escape::EscapeChar;
        assert_eq!(
            res("EscapeChar ^]\n", "x").escape_char,
            Some(EscapeChar::Byte(0x1d))
        );
        assert_eq!(
            res("EscapeChar none\n", "x").escape_char,
            Some(EscapeChar::None)
        );
        assert!(parse_err("EscapeChar ab\n").contains("EscapeChar"));
        assert!(parse_err("LocalForward 8080\n").contains("LocalForward"));
        assert!(parse_err("LocalForward 8080 db:0\n").contains("not a port"));
        assert!(parse_err("DynamicForward x\n").contains("DynamicForward"));
    }

    /// Resolves `text` for `host` with canonicalisation, where `known`
    /// names resolve.
    fn res_canonical(text: &str, host: &str, known: &[&str]) -> HostConfig {
        let file = parse("cfg", text).unwrap();
        resolve_canonical(&[file], &ctx(host), &mut no_include, &mut |n| {
            known.contains(&n)
        })
        .unwrap()
    }

    #[test]
    fn canonicalisation_finds_the_name_and_applies_its_blocks() {
        let text = "CanonicalizeHostname yes\nCanonicalDomains corp.example example.org\n\
                    Host web.example.org\n  Port 2200\nMatch canonical host web.example.org\n  User canon\n\
                    Host web\n  IdentityFile ~/.ssh/first-pass\n";
        let c = res_canonical(text, "web", &["web.example.org"]);
        assert_eq!(c.hostname.as_deref(), Some("web.example.org"));
        assert_eq!(c.port, Some(2200));
        assert_eq!(c.user.as_deref(), Some("canon"));
        // The first pass still counted for the name as given.
        assert_eq!(c.identity_files.len(), 1);
        // The first domain that resolves wins.
        let c = res_canonical(text, "web", &["web.corp.example", "web.example.org"]);
        assert_eq!(c.hostname.as_deref(), Some("web.corp.example"));
        // Nothing resolves: the name stays, unless fallback is off.
        let c = res_canonical(text, "web", &[]);
        assert_eq!(c.hostname, None);
        assert_eq!(c.unresolved, None);
        let strict = format!("CanonicalizeFallbackLocal no\n{text}");
        let c = res_canonical(&strict, "web", &[]);
        assert_eq!(c.unresolved.as_deref(), Some("web"));
    }

    #[test]
    fn canonicalisation_leaves_what_it_should_alone() {
        let on = "CanonicalizeHostname yes\nCanonicalDomains example.org\nCanonicalizeFallbackLocal no\n";
        let all = &[
            "db.example.org",
            "a.b.c.example.org",
            "10.0.0.1.example.org",
        ];
        // Addresses, names with more dots than allowed, names that end in a dot.
        for (host, want) in [
            ("10.0.0.1", None),
            ("::1", None),
            ("a.b.c", None),
            ("db.", Some("db")),
        ] {
            let c = res_canonical(on, host, all);
            assert_eq!(c.hostname.as_deref(), want, "{host}");
            assert_eq!(c.unresolved, None, "{host}");
        }
        let c = res_canonical(&format!("CanonicalizeMaxDots 2\n{on}"), "a.b.c", all);
        assert_eq!(c.hostname.as_deref(), Some("a.b.c.example.org"));
        // `yes` skips proxied connections, `always` does not; `no` is off.
        let proxied = "ProxyJump bastion\nCanonicalDomains example.org\nCanonicalizeHostname ";
        let c = res_canonical(&format!("{proxied}yes\n"), "db", all);
        assert_eq!(c.hostname, None);
        let c = res_canonical(&format!("{proxied}always\n"), "db", all);
        assert_eq!(c.hostname.as_deref(), Some("db.example.org"));
        let c = res_canonical(
            "CanonicalizeHostname no\nCanonicalDomains example.org\n",
            "db",
            all,
        );
        assert_eq!(c.hostname, None);
        // HostName is what is canonicalised.
        let c = res_canonical(&format!("{on}Host alias\n  HostName db\n"), "alias", all);
        assert_eq!(c.hostname.as_deref(), Some("db.example.org"));
        for bad in [
            "CanonicalizeHostname maybe\n",
            "CanonicalDomains\n",
            "CanonicalDomains .example.org\n",
            "CanonicalizeMaxDots many\n",
        ] {
            assert!(parse_err(bad).contains("Canonical"), "{bad}");
        }
    }

    #[test]
    fn add_keys_to_agent_values() {
        let v = |text: &str| res(&format!("AddKeysToAgent {text}\n"), "x").add_keys_to_agent;
        assert_eq!(v("no"), Some(AddKeysToAgent::No));
        assert_eq!(
            v("yes"),
            Some(AddKeysToAgent::Yes {
                confirm: false,
                lifetime: None
            })
        );
        assert_eq!(v("ask"), Some(AddKeysToAgent::Ask));
        assert_eq!(
            v("confirm"),
            Some(AddKeysToAgent::Yes {
                confirm: true,
                lifetime: None
            })
        );
        assert_eq!(
            v("1h"),
            Some(AddKeysToAgent::Yes {
                confirm: false,
                lifetime: Some(3600)
            })
        );
        assert_eq!(
            v("confirm 10m"),
            Some(AddKeysToAgent::Yes {
                confirm: true,
                lifetime: Some(600)
            })
        );
        for bad in ["maybe", "confirm soon", "yes 1h"] {
            assert!(
                parse_err(&format!("AddKeysToAgent {bad}\n")).contains("AddKeysToAgent"),
                "{bad}"
            );
        }
    }

    #[test]
    fn address_family_and_bind_settings() {
        let c = res(
            "AddressFamily inet6\nBindAddress [::1]\nBindInterface lo\nBindAddress 10.0.0.1\n",
            "x",
        );
        assert_eq!(c.address_family, Some(AddressFamily::Inet6));
        assert_eq!(c.bind_address, Some("::1".parse().unwrap()));
        assert_eq!(c.bind_interface.as_deref(), Some("lo"));
        assert!(parse_err("AddressFamily ipx\n").contains("AddressFamily"));
        assert_eq!(
            res("RequiredRSASize 3072\n", "x").required_rsa_size,
            Some(3072)
        );
        assert!(parse_err("RequiredRSASize 512\n").contains("1024"));
        assert!(parse_err("BindAddress host.example\n").contains("not an IP address"));
    }

    #[test]
    fn first_value_wins() {
        let text = "Host web\n  User first\n  Port 1000\nHost *\n  User second\n  Port 2000\n  ConnectTimeout 5\n";
        let c = res(text, "web");
        assert_eq!(c.user.as_deref(), Some("first"));
        assert_eq!(c.port, Some(1000));
        assert_eq!(c.connect_timeout, Some(5));
        let c = res(text, "db");
        assert_eq!(c.user.as_deref(), Some("second"));
        assert_eq!(c.port, Some(2000));
    }

    #[test]
    fn files_apply_in_order() {
        let cmd = parse_options(&opts(&["Port=3000", "User cmd"])).unwrap();
        let user = parse("~/.ssh/config", "Port 2000\nHostName user.example\n").unwrap();
        let system = parse(
            "/etc/ssh/ssh_config",
            "Port 1000\nHostName sys.example\nConnectTimeout 9\n",
        )
        .unwrap();
        let c = resolve(&[cmd, user, system], &ctx("x"), &mut no_include).unwrap();
        assert_eq!(c.port, Some(3000));
        assert_eq!(c.user.as_deref(), Some("cmd"));
        assert_eq!(c.hostname.as_deref(), Some("user.example"));
        assert_eq!(c.connect_timeout, Some(9));
    }

    #[test]
    fn host_blocks_do_not_leak_between_files() {
        let a = parse("a", "Host other\n").unwrap();
        let b = parse("b", "Port 7\n").unwrap();
        let c = resolve(&[a, b], &ctx("x"), &mut no_include).unwrap();
        assert_eq!(c.port, Some(7));
    }

    #[test]
    fn identity_files_accumulate() {
        let c = res(
            "IdentityFile ~/.ssh/a\nHost web*\n  IdentityFile ~/.ssh/b\nHost nope\n  IdentityFile ~/.ssh/c\nHost *\n  IdentityFile ~/.ssh/d\n  IdentityFile ~/.ssh/a\n",
            "web1",
        );
        assert_eq!(c.identity_files, vec!["~/.ssh/a", "~/.ssh/b", "~/.ssh/d"]);
    }

    #[test]
    fn proxy_command_and_jump_share_one_slot() {
        let c = res(
            "Host a\n  ProxyCommand ssh -W '%h:%p' \"bastion\"  \nHost *\n  ProxyJump b\n",
            "a",
        );
        assert_eq!(
            c.proxy,
            Some(ProxySpec::Command("ssh -W '%h:%p' \"bastion\"".into()))
        );
        assert_eq!(
            res(
                "Host *\n  ProxyJump u@b:2222,ssh://c\n  ProxyCommand x\n",
                "a"
            )
            .proxy,
            Some(ProxySpec::Jump("u@b:2222,ssh://c".into()))
        );
        assert_eq!(
            res("Host a\n  ProxyJump none\nHost *\n  ProxyJump b\n", "a").proxy,
            Some(ProxySpec::None)
        );
        assert_eq!(res("ProxyCommand=NONE\n", "a").proxy, Some(ProxySpec::None));
        assert_eq!(res("Port 1\n", "a").proxy, None);
        assert!(parse_err("ProxyJump b:99999\n").starts_with("cfg:1: ProxyJump: bad jump host"));
        assert!(parse_err("ProxyJump a,,b\n").contains("no host name"));
    }

    #[test]
    fn jump_hosts_parse() {
        let hop = |user: Option<&str>, host: &str, port: Option<u16>| JumpHost {
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            parse_jump_hosts("bastion,me@b2:2200,ssh://ops@[::1]:22,[fe80::1]").unwrap(),
            vec![
                hop(None, "bastion", None),
                hop(Some("me"), "b2", Some(2200)),
                hop(Some("ops"), "::1", Some(22)),
                hop(None, "fe80::1", None),
            ]
        );
        for bad in ["", "@h", "h:", "h:0", "[::1", "[::1]x", "a b", "h:port"] {
            assert!(parse_jump_hosts(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn certificate_files_accumulate() {
        let c = res(
            "CertificateFile ~/.ssh/a-cert.pub\nHost web*\n  CertificateFile %d/.ssh/b-cert.pub\nHost *\n  CertificateFile ~/.ssh/a-cert.pub\n",
            "web1",
        );
        assert_eq!(
            c.certificate_files,
            vec!["~/.ssh/a-cert.pub", "%d/.ssh/b-cert.pub"]
        );
        assert!(c.ignored.iter().all(|(k, _)| k != "CertificateFile"));
    }

    #[test]
    fn host_patterns_and_negation() {
        let text = "Host *.corp !secret.corp\n  User corp\nHost *\n  User default\n";
        assert_eq!(res(text, "db.corp").user.as_deref(), Some("corp"));
        assert_eq!(res(text, "secret.corp").user.as_deref(), Some("default"));
        assert_eq!(res(text, "db.home").user.as_deref(), Some("default"));
        // A negation alone never matches.
        assert_eq!(res("Host !foo\n  Port 1\n", "bar").port, None);
        // Several patterns, and `?`.
        let text = "Host a b web?\n  Port 5\n";
        assert_eq!(res(text, "b").port, Some(5));
        assert_eq!(res(text, "web7").port, Some(5));
        assert_eq!(res(text, "web10").port, None);
    }

    #[test]
    fn host_matching_is_case_insensitive() {
        assert_eq!(
            res("Host Web.Example\n  Port 5\n", "WEB.example").port,
            Some(5)
        );
    }

    #[test]
    fn host_matches_original_name_not_hostname() {
        let text = "Host alias\n  HostName real.example\nHost real.example\n  Port 99\n";
        let c = res(text, "alias");
        assert_eq!(c.hostname.as_deref(), Some("real.example"));
        assert_eq!(c.port, None);
    }

    #[test]
    fn hostname_tokens() {
        let c = res("Host *\n  HostName %h.internal.example\n", "web");
        assert_eq!(c.hostname.as_deref(), Some("web.internal.example"));
        let c = res("HostName 100%%-%h\n", "x");
        assert_eq!(c.hostname.as_deref(), Some("100%-x"));
        assert_eq!(
            parse_err("HostName %p.example\n"),
            "cfg:1: HostName: unknown token %p (only %h and %% are allowed)"
        );
        assert_eq!(
            parse_err("HostName foo%\n"),
            "cfg:1: HostName: incomplete token (trailing %)"
        );
    }

    // ---- Match ----

    #[test]
    fn match_host_vs_originalhost() {
        let text = "Host alias\n  HostName real.example\nMatch host real.example\n  Port 1\nMatch originalhost alias\n  User o\nMatch host alias\n  IdentityFile never\nMatch originalhost real.example\n  IdentityFile never2\n";
        let c = res(text, "alias");
        assert_eq!(c.port, Some(1));
        assert_eq!(c.user.as_deref(), Some("o"));
        assert!(c.identity_files.is_empty());
    }

    #[test]
    fn match_host_uses_context_host_without_hostname() {
        let mut m = ctx("alias");
        m.host = "given.example".to_owned();
        let file = parse("cfg", "Match host given.example\n  Port 4\n").unwrap();
        let c = resolve(&[file], &m, &mut no_include).unwrap();
        assert_eq!(c.port, Some(4));
    }

    #[test]
    fn match_lists_and_negation() {
        let text = "Match host a,b*,!bad\n  Port 1\nMatch !host c\n  User notc\n";
        assert_eq!(res(text, "a").port, Some(1));
        assert_eq!(res(text, "bee").port, Some(1));
        assert_eq!(res(text, "bad").port, None);
        assert_eq!(res(text, "z").port, None);
        assert_eq!(res(text, "c").user, None);
        assert_eq!(res(text, "d").user.as_deref(), Some("notc"));
    }

    #[test]
    fn match_criteria_are_anded() {
        let text = "Match host web* localuser alice\n  Port 1\nMatch host web* localuser bob\n  User bob\n";
        let c = res(text, "web1");
        assert_eq!(c.port, Some(1));
        assert_eq!(c.user, None);
    }

    #[test]
    fn match_user() {
        let text = "Match user root\n  Port 1\nMatch User alice\n  IdentityFile local\n";
        // Defaults to the local user.
        let c = res(text, "x");
        assert_eq!(c.port, None);
        assert_eq!(c.identity_files, vec!["local"]);
        // Command-line user wins.
        let mut m = ctx("x");
        m.remote_user = Some("root".to_owned());
        let c = resolve(&[parse("cfg", text).unwrap()], &m, &mut no_include).unwrap();
        assert_eq!(c.port, Some(1));
        assert!(c.identity_files.is_empty());
        // Otherwise a User set earlier in the config.
        let c = res("User root\nMatch user root\n  Port 1\n", "x");
        assert_eq!(c.port, Some(1));
    }

    #[test]
    fn match_all_and_case() {
        assert_eq!(res("Host nope\nMATCH ALL\n  Port 3\n", "x").port, Some(3));
        assert_eq!(res("Match !all\n  Port 3\n", "x").port, None);
        assert_eq!(
            parse_err("Match all host x\n"),
            "cfg:1: Match: \"all\" cannot be combined with criteria other than \"canonical\" or \"final\""
        );
    }

    #[test]
    fn a_word_starting_with_a_hash_ends_the_line() {
        for (line, kept) in [
            ("PermitOpen 127.0.0.1:1 # why", "PermitOpen 127.0.0.1:1"),
            ("Port 22\t#\tcomment", "Port 22"),
            ("#", ""),
            ("Banner /etc/a#b", "Banner /etc/a#b"),
            ("SetEnv A=\"x # y\" # z", "SetEnv A=\"x # y\""),
            ("SetEnv A='#' B=1", "SetEnv A='#' B=1"),
            ("SetEnv A=\\ #x", "SetEnv A=\\ #x"),
            ("Port 22", "Port 22"),
        ] {
            assert_eq!(without_comment(line), kept, "{line:?}");
        }
        assert_eq!(split_args("a 'b # c' # d").unwrap(), ["a", "b # c"]);
        assert_eq!(split_args("x\\ #y").unwrap(), ["x #y"]);
    }

    #[test]
    fn match_criterion_equals_value() {
        let text = "Match host=b,c\n  Port 1\nMatch !originalhost=b\n  User notb\n";
        assert_eq!(res(text, "b").port, Some(1));
        assert_eq!(res(text, "c").port, Some(1));
        assert_eq!(res(text, "x").port, None);
        assert_eq!(res(text, "b").user, None);
        assert_eq!(res(text, "x").user.as_deref(), Some("notb"));
        assert_eq!(
            parse_err("Match host=\n"),
            "cfg:1: Match: missing argument for \"host\""
        );
        assert_eq!(
            parse_err("Match all=x\n"),
            "cfg:1: Match: \"all\" takes no argument"
        );
    }

    #[test]
    fn match_errors() {
        assert_eq!(
            parse_err("Host a\nMatch hots x\n"),
            "cfg:2: Match: unsupported criterion \"hots\""
        );
        assert_eq!(
            parse_err("Match host\n"),
            "cfg:1: Match: missing argument for \"host\""
        );
        assert_eq!(parse_err("Match\n"), "cfg:1: Match: missing argument");
        assert_eq!(
            parse_err("Match exec\n"),
            "cfg:1: Match: missing argument for \"exec\""
        );
        assert_eq!(
            parse_err("Match !\n"),
            "cfg:1: Match: unsupported criterion \"\""
        );
    }

    #[test]
    fn match_exec_never_matches_and_is_recorded() {
        let text = "Match exec \"test -f /x\"\n  Port 1\nMatch !exec true\n  User u\nMatch host nope exec true\n  Port 2\n";
        let c = res(text, "x");
        assert_eq!(c.port, None);
        assert_eq!(c.user, None);
        assert_eq!(
            c.ignored,
            vec![
                ("Match exec".to_owned(), "cfg:1".to_owned()),
                ("Match exec".to_owned(), "cfg:3".to_owned()),
            ]
        );
        let c = res("Match localnetwork 10.0.0.0/8\n  Port 1\n", "x");
        assert_eq!(c.port, None);
        assert_eq!(c.ignored[0].0, "Match localnetwork");
    }

    #[test]
    fn match_tagged() {
        let text = "Tag work\nMatch tagged work\n  User w\nMatch tagged home\n  Port 1\n";
        let c = res(text, "x");
        assert_eq!(c.user.as_deref(), Some("w"));
        assert_eq!(c.port, None);
        let cmd = parse_options(&opts(&["Tag=home"])).unwrap();
        let c = resolve(
            &[cmd, parse("cfg", text).unwrap()],
            &ctx("x"),
            &mut no_include,
        )
        .unwrap();
        assert_eq!(c.port, Some(1));
        assert_eq!(c.user, None);
    }

    #[test]
    fn no_final_pass_without_match_final() {
        let text = "Host alias\n  HostName real.example\nHost real.example\n  Port 99\nMatch canonical\n  User c\n";
        let c = res(text, "alias");
        assert_eq!(c.port, None);
        assert_eq!(c.user, None);
    }

    #[test]
    fn match_final_triggers_second_pass() {
        let text = "Host alias\n  HostName real.example\n  User first\nHost real.example\n  Port 99\n  User second\nMatch final\n  IdentityFile final-key\nMatch canonical\n  ConnectTimeout 7\nMatch !final\n  IdentityFile first-pass-key\n";
        let c = res(text, "alias");
        // Second pass matches Host lines against the resolved name.
        assert_eq!(c.port, Some(99));
        // Values from the first pass are kept.
        assert_eq!(c.user.as_deref(), Some("first"));
        assert_eq!(c.hostname.as_deref(), Some("real.example"));
        assert_eq!(c.connect_timeout, Some(7));
        assert_eq!(c.identity_files, vec!["first-pass-key", "final-key"]);
    }

    #[test]
    fn final_pass_does_not_duplicate() {
        let text = "SendEnv LANG\nSetEnv A=1\nIdentityFile k\nCheckHostIP yes\nMatch final\n";
        let c = res(text, "x");
        assert_eq!(c.send_env, vec!["LANG"]);
        assert_eq!(c.set_env.len(), 1);
        assert_eq!(c.identity_files, vec!["k"]);
        assert_eq!(
            c.ignored,
            vec![("CheckHostIP".to_owned(), "cfg:4".to_owned())]
        );
    }

    // ---- Include ----

    #[test]
    fn include_applies_and_is_scoped() {
        let files = HashMap::from([("inc.conf", "User from-include\nHost other\n  Port 1\n")]);
        let mut calls = Vec::new();
        let main = parse(
            "main",
            "Include inc.conf\nPort 2\nHost *\n  IdentityFile k\n",
        )
        .unwrap();
        let c = resolve(&[main], &ctx("x"), &mut |a, f| {
            fs_include(&files, &mut calls, a, f)
        })
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("from-include"));
        // The included file's `Host other` does not swallow the includer's lines.
        assert_eq!(c.port, Some(2));
        assert_eq!(c.identity_files, vec!["k"]);
        assert_eq!(calls, vec![("inc.conf".to_owned(), "main".to_owned())]);
    }

    #[test]
    fn include_inside_blocks() {
        let files = HashMap::from([
            ("web.conf", "Port 80\nCheckHostIP yes\n"),
            ("db.conf", "Port 5432\n"),
        ]);
        let text = "Host web\n  Include web.conf\nHost db\n  Include db.conf\nHost *\n  Port 22\n";
        let run = |host: &str| {
            let mut calls = Vec::new();
            let c = resolve(&[parse("main", text).unwrap()], &ctx(host), &mut |a, f| {
                fs_include(&files, &mut calls, a, f)
            })
            .unwrap();
            (c, calls)
        };
        let (c, calls) = run("web");
        assert_eq!(c.port, Some(80));
        assert_eq!(
            c.ignored,
            vec![("CheckHostIP".to_owned(), "web.conf:2".to_owned())]
        );
        // Files under inactive blocks are still read (as ssh does) but do not apply.
        assert_eq!(calls.len(), 2);
        let (c, _) = run("db");
        assert_eq!(c.port, Some(5432));
        assert!(c.ignored.is_empty());
        let (c, _) = run("other");
        assert_eq!(c.port, Some(22));
    }

    #[test]
    fn inactive_include_cannot_activate_itself() {
        let files = HashMap::from([("inc", "Host *\n  Port 1\nMatch all\n  User u\n")]);
        let mut calls = Vec::new();
        let main = parse("main", "Host nope\n  Include inc\n").unwrap();
        let c = resolve(&[main], &ctx("x"), &mut |a, f| {
            fs_include(&files, &mut calls, a, f)
        })
        .unwrap();
        assert_eq!(c.port, None);
        assert_eq!(c.user, None);
    }

    #[test]
    fn include_errors_surface_even_when_inactive() {
        let files = HashMap::from([("inc", "Bogus 1\n")]);
        let mut calls = Vec::new();
        let main = parse("main", "Host nope\n  Include inc\n").unwrap();
        let e = resolve(&[main], &ctx("x"), &mut |a, f| {
            fs_include(&files, &mut calls, a, f)
        })
        .unwrap_err();
        assert_eq!(e.file, "inc");
        assert_eq!(e.line, 1);
    }

    #[test]
    fn include_multiple_arguments_and_results() {
        let mut seen = Vec::new();
        let main = parse("main", "Include a \"b c\"\n").unwrap();
        let c = resolve(&[main], &ctx("x"), &mut |arg, _| {
            seen.push(arg.to_owned());
            if arg == "a" {
                Ok(vec![
                    parse("a1", "IdentityFile one\n")?,
                    parse("a2", "IdentityFile two\n")?,
                ])
            } else {
                Ok(vec![parse("bc", "IdentityFile three\n")?])
            }
        })
        .unwrap();
        assert_eq!(seen, vec!["a", "b c"]);
        assert_eq!(c.identity_files, vec!["one", "two", "three"]);
    }

    #[test]
    fn include_closure_errors_propagate() {
        let main = parse("main", "Include x\n").unwrap();
        let e = resolve(&[main], &ctx("x"), &mut |_, _| {
            Err(ConfigError::new("x", 3, "permission denied"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "x:3: permission denied");
        // Syntax errors in an included file keep that file's location.
        let main = parse("main", "Include x\n").unwrap();
        let e = resolve(&[main], &ctx("x"), &mut |_, _| {
            Ok(vec![parse("x", "\nPort 0\n")?])
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "x:2: Port: invalid port \"0\" (must be 1-65535)"
        );
    }

    #[test]
    fn include_loop_is_reported() {
        let mut calls = 0;
        let main = parse("main", "Port 1\nInclude self\n").unwrap();
        let e = resolve(&[main], &ctx("x"), &mut |_, _| {
            calls += 1;
            Ok(vec![parse("self", "# me again\nInclude self\n")?])
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "self:2: Include nested more than 16 levels deep (is a file including itself?)"
        );
        assert_eq!(calls, MAX_INCLUDE_DEPTH);
    }

    #[test]
    fn include_with_match_final_in_included_file() {
        let files = HashMap::from([("inc", "Match final\n  Port 8\n")]);
        let mut calls = Vec::new();
        let main = parse("main", "Include inc\n").unwrap();
        let c = resolve(&[main], &ctx("x"), &mut |a, f| {
            fs_include(&files, &mut calls, a, f)
        })
        .unwrap();
        assert_eq!(c.port, Some(8));
        assert_eq!(calls.len(), 2);
    }

    // ---- command line ----

    #[test]
    fn command_line_options() {
        let f = parse_options(&opts(&[
            "Port=2200",
            "user bob",
            "  ",
            "# nothing",
            "HostName = h",
        ]))
        .unwrap();
        assert_eq!(f.label(), "command line");
        assert_eq!(f.len(), 3);
        let c = resolve(&[f], &ctx("x"), &mut no_include).unwrap();
        assert_eq!(c.port, Some(2200));
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert_eq!(c.hostname.as_deref(), Some("h"));
    }

    #[test]
    fn command_line_errors_name_option_index() {
        let e = parse_options(&opts(&["Port=22", "Port=x"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command line:2: Port: invalid port \"x\" (must be 1-65535)"
        );
        let e = parse_options(&opts(&["Include=foo"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command line:1: Include is not supported as a command-line option"
        );
        assert!(parse_options(&opts(&["Host foo"])).is_err());
        assert!(parse_options(&opts(&["Match all"])).is_err());
        let f = parse_options(&opts(&["Bogus=1"])).unwrap();
        let e = resolve(&[f], &ctx("x"), &mut no_include).unwrap_err();
        assert_eq!(e.file, "command line");
        assert_eq!(e.line, 1);
    }

    #[test]
    fn empty_inputs() {
        let f = parse("empty", "").unwrap();
        assert!(f.is_empty());
        assert_eq!(
            resolve(&[f], &ctx("x"), &mut no_include).unwrap(),
            HostConfig::default()
        );
        assert_eq!(
            resolve(&[], &ctx("x"), &mut no_include).unwrap(),
            HostConfig::default()
        );
    }

    // ---- token expansion ----

    fn tctx() -> TokenContext {
        TokenContext {
            host: "real.example.com".to_owned(),
            original_host: "alias".to_owned(),
            remote_user: "bob".to_owned(),
            local_user: "alice".to_owned(),
            port: 2222,
            home: "/home/alice".to_owned(),
            local_hostname: "laptop.lan".to_owned(),
            uid: 1000,
        }
    }

    #[test]
    fn expand_all_tokens() {
        assert_eq!(
            expand_tokens("%h %n %r %u %p %d %l %L %i %%", &tctx()).unwrap(),
            "real.example.com alias bob alice 2222 /home/alice laptop.lan laptop 1000 %"
        );
        assert_eq!(
            expand_tokens("~/.ssh/id_%h_%r", &tctx()).unwrap(),
            "/home/alice/.ssh/id_real.example.com_bob"
        );
        assert_eq!(expand_tokens("~", &tctx()).unwrap(), "/home/alice");
        assert_eq!(expand_tokens("plain", &tctx()).unwrap(), "plain");
        assert_eq!(expand_tokens("", &tctx()).unwrap(), "");
        assert_eq!(expand_tokens("a~b", &tctx()).unwrap(), "a~b");
        assert_eq!(expand_tokens("%%h", &tctx()).unwrap(), "%h");
        let mut t = tctx();
        t.home = "/".to_owned();
        assert_eq!(expand_tokens("~/x", &t).unwrap(), "/x");
        t.local_hostname = "nodots".to_owned();
        assert_eq!(expand_tokens("%L", &t).unwrap(), "nodots");
    }

    #[test]
    fn expand_errors() {
        assert_eq!(
            expand_tokens("/tmp/%C", &tctx()).unwrap_err(),
            "unknown token %C in \"/tmp/%C\""
        );
        assert_eq!(
            expand_tokens("abc%", &tctx()).unwrap_err(),
            "incomplete token (trailing %) in \"abc%\""
        );
        assert_eq!(
            expand_tokens("~bob/.ssh/id", &tctx()).unwrap_err(),
            "cannot expand \"~bob\" in \"~bob/.ssh/id\": only ~ and ~/ are supported"
        );
    }

    #[test]
    fn expansion_does_not_rescan_substituted_text() {
        let mut t = tctx();
        t.host = "%p".to_owned();
        assert_eq!(expand_tokens("%h", &t).unwrap(), "%p");
    }
}

/// `Match exec` through a fake runner, and `LocalCommand`/`PermitLocalCommand`.
#[cfg(test)]
mod match_exec_tests {
    use super::*;

    fn ctx(host: &str) -> MatchContext {
        MatchContext {
            original_host: host.into(),
            host: host.into(),
            remote_user: None,
            local_user: "alice".into(),
        }
    }

    /// Resolves `text` for `host` with a runner that records each command
    /// (with its token values) and answers from `answer`.
    fn run(
        text: &str,
        host: &str,
        answer: &dyn Fn(&str) -> Result<bool, String>,
    ) -> (Result<HostConfig, ConfigError>, Vec<String>) {
        let file = parse("cfg", text).unwrap();
        let mut ran = Vec::new();
        let result = resolve_with_exec(
            &[file],
            &ctx(host),
            &mut |_, _| Ok(Vec::new()),
            &mut |_| false,
            &mut |probe: &MatchExec<'_>| {
                ran.push(format!(
                    "{} [{} {} {} {:?}]",
                    probe.command, probe.host, probe.original_host, probe.user, probe.port
                ));
                answer(probe.command)
            },
        );
        (result, ran)
    }

    #[test]
    fn exec_matches_on_success_and_sees_what_is_settled_so_far() {
        let text = "Host web\n  HostName web.example\n  Port 2200\n  User bob\n\
                    Match exec \"test -e %h\"\n  IdentityFile yes-key\n\
                    Match exec false\n  IdentityFile no-key\n";
        let (cfg, ran) = run(text, "web", &|c| Ok(c.starts_with("test")));
        let cfg = cfg.unwrap();
        assert_eq!(cfg.identity_files, vec!["yes-key".to_string()]);
        assert_eq!(
            ran,
            vec![
                "test -e %h [web.example web bob Some(2200)]".to_string(),
                "false [web.example web bob Some(2200)]".to_string(),
            ]
        );
    }

    #[test]
    fn exec_runs_only_when_what_comes_before_it_matched() {
        let text = "Match host other exec one\n  Port 1\n\
                    Match exec two host other\n  Port 2\n\
                    Match !exec three\n  User notthree\n";
        let (cfg, ran) = run(text, "web", &|_| Ok(true));
        let cfg = cfg.unwrap();
        // `one` is skipped (host did not match); `two` runs, then host
        // fails; `three` runs and, negated, does not match.
        assert_eq!(ran.len(), 2, "{ran:?}");
        assert!(ran[0].starts_with("two ") && ran[1].starts_with("three "));
        assert_eq!((cfg.port, cfg.user), (None, None));
        let (cfg, _) = run("Match !exec fails\n  User negated\n", "web", &|_| Ok(false));
        assert_eq!(cfg.unwrap().user.as_deref(), Some("negated"));
    }

    #[test]
    fn exec_in_a_block_that_cannot_apply_is_not_run() {
        let text = "Host elsewhere\n  Include x\nMatch exec ok\n  Port 7\n";
        let (cfg, ran) = run(text, "web", &|_| Ok(true));
        assert_eq!(cfg.unwrap().port, Some(7));
        assert_eq!(ran.len(), 1);
    }

    #[test]
    fn exec_failing_to_run_is_an_error_at_its_line() {
        let (cfg, _) = run("Host *\n  Port 3\nMatch exec boom\n", "web", &|_| {
            Err("cannot start /bin/sh".into())
        });
        assert_eq!(
            cfg.unwrap_err().to_string(),
            "cfg:3: Match exec \"boom\": cannot start /bin/sh"
        );
    }

    #[test]
    fn exec_runs_again_in_the_final_pass() {
        let text = "Match final exec check\n  Port 9\n";
        let (cfg, ran) = run(text, "web", &|_| Ok(true));
        assert_eq!(cfg.unwrap().port, Some(9));
        assert_eq!(ran.len(), 1, "only the final pass gets past `final`");
        let (cfg, ran) = run("Match exec check\n  Port 8\nMatch final\n", "web", &|_| {
            Ok(true)
        });
        assert_eq!(cfg.unwrap().port, Some(8));
        assert_eq!(ran.len(), 2, "{ran:?}");
    }

    #[test]
    fn without_a_runner_exec_never_matches_and_is_reported() {
        let file = parse("cfg", "Match exec true\n  Port 1\n").unwrap();
        let cfg = resolve(&[file], &ctx("web"), &mut |_, _| Ok(Vec::new())).unwrap();
        assert_eq!(cfg.port, None);
        assert_eq!(
            cfg.ignored,
            vec![("Match exec".to_string(), "cfg:1".to_string())]
        );
    }

    #[test]
    fn exec_keeps_its_command_whole() {
        let (_, ran) = run("Match exec \"a,b c\"\n", "web", &|_| Ok(false));
        assert!(ran[0].starts_with("a,b c ["), "{ran:?}");
        let (_, ran) = run("Match exec=true\n", "web", &|_| Ok(false));
        assert!(ran[0].starts_with("true ["), "{ran:?}");
    }

    #[test]
    fn local_command_is_kept_as_written_and_permit_is_a_flag() {
        let text = "Host *\n  LocalCommand echo %h  > \"/tmp/x y\"\n  PermitLocalCommand yes\n";
        let file = parse("cfg", text).unwrap();
        let cfg = resolve(&[file], &ctx("web"), &mut |_, _| Ok(Vec::new())).unwrap();
        assert_eq!(
            cfg.local_command.as_deref(),
            Some("echo %h  > \"/tmp/x y\"")
        );
        assert_eq!(cfg.permit_local_command, Some(true));
        assert!(cfg.ignored.is_empty(), "{:?}", cfg.ignored);
        let opts = parse_options(&["PermitLocalCommand=no".to_string()]).unwrap();
        let cfg = resolve(&[opts], &ctx("web"), &mut |_, _| Ok(Vec::new())).unwrap();
        assert_eq!(cfg.permit_local_command, Some(false));
        assert!(parse("cfg", "PermitLocalCommand maybe\n").is_err());
    }
}

#[cfg(test)]
mod connection_hash_tests {
    #[test]
    fn names_with_shell_syntax_are_not_shell_safe() {
        for ok in [
            "web01",
            "db.example.org",
            "u@h",
            "[::1]",
            "deploy_user",
            "a+b",
            "a-b",
        ] {
            assert!(super::shell_safe_name(ok), "{ok}");
        }
        for bad in [
            "a;b", "a$(id)", "a`id`", "a b", "a|b", "a&b", "a>b", "x'y", "x\"y", "a\\b", "-oProxy",
            "a\nb", "{a,b}",
        ] {
            assert!(!super::shell_safe_name(bad), "{bad}");
        }
    }

    #[test]
    fn connection_hash_is_sha1_of_the_joined_fields() {
        // As `ssh -G -o ControlPath=%C bob@example.com` prints it on host "vm".
        assert_eq!(
            super::connection_hash("vm", "example.com", 22, "bob", ""),
            "6e8198ae26a6d7ef13abfa783129eb54d6d6bb13"
        );
    }
}
