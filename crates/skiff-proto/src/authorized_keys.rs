//! Parser for OpenSSH `authorized_keys` files, including per-key options.
//!
//! Each non-blank, non-comment line has the shape
//! `[options] keytype base64-key [comment]` (see sshd(8), "AUTHORIZED_KEYS
//! FILE FORMAT"). Options are a comma-separated list of `name` or
//! `name="value"` items; values may contain commas and blanks, and `\"`
//! stands for a literal quote. Option names are case-insensitive.
//!
//! Everything here is sans-IO: [`parse`] takes the file text plus a label used
//! in warnings, and time checks take "now" and the local UTC offset from the
//! caller. A line that cannot be used safely (unknown or malformed option, bad
//! key data, key type mismatch, ...) is skipped with a [`ParseWarning`]; the
//! remaining lines are still honoured, like sshd does.
//!
//! Enforcement is the caller's job: [`find`] picks the first line for a
//! presented key, [`from_allows`] evaluates `from=`, [`is_expired`] evaluates
//! `expiry-time=`, and the remaining [`KeyOptions`] fields describe the
//! restrictions to apply to the session.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use base64::Engine as _;

use crate::pattern::{match_list, ListMatch};

/// Public key types accepted in the key type field. Whether the server
/// actually supports a type is decided elsewhere.
pub const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// True when `s` is one of [`KEY_TYPES`].
pub fn is_key_type(s: &str) -> bool {
    KEY_TYPES.contains(&s)
}

/// A problem found on one line; the line was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseWarning {
    /// The label passed to [`parse`] (usually the file path).
    pub file: String,
    /// 1-based line number.
    pub line: usize,
    /// Human-readable description.
    pub message: String,
}

impl fmt::Display for ParseWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for ParseWarning {}

/// Options given in front of a key. `Default` is "no options": everything
/// permitted, no forced command, no restrictions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyOptions {
    /// `command="..."`: forced command (never empty).
    pub command: Option<String>,
    /// `from="pattern-list"`: host/IP patterns, see [`from_allows`]. CIDR
    /// entries were validated at parse time.
    pub from: Option<Vec<String>>,
    /// `environment="NAME=value"` in file order; for a repeated NAME only the
    /// first is kept. Only to be applied if the server permits user environment.
    pub environment: Vec<(String, String)>,
    /// `expiry-time="YYYYMMDD[HHMM[SS]][Z]"`, see [`is_expired`].
    pub expiry_time: Option<ExpiryTime>,
    /// `no-pty` / `restrict` (cleared again by a later `pty`).
    pub no_pty: bool,
    /// `no-port-forwarding` / `restrict` (cleared by a later `port-forwarding`).
    pub no_port_forwarding: bool,
    /// `no-agent-forwarding` / `restrict` (cleared by a later `agent-forwarding`).
    pub no_agent_forwarding: bool,
    /// `no-x11-forwarding` / `restrict` (cleared by a later `x11-forwarding`).
    pub no_x11_forwarding: bool,
    /// `no-user-rc` / `restrict` (cleared by a later `user-rc`).
    pub no_user_rc: bool,
    /// `permitopen="host:port"` values as written (may repeat). Host may be
    /// `[v6addr]` or `*`; port is a number or `*`. See [`split_host_port`].
    pub permit_open: Vec<String>,
    /// `permitlisten="[host:]port"` values as written (may repeat).
    pub permit_listen: Vec<String>,
    /// `principals="a,b"` (certificate principals, exact match, no wildcards).
    pub principals: Option<Vec<String>>,
    /// `cert-authority`: the key is a CA trusted to sign user certificates.
    pub cert_authority: bool,
    /// `no-touch-required` (FIDO keys: user presence not required).
    pub no_touch_required: bool,
    /// `verify-required` (FIDO keys: user verification, e.g. PIN, required).
    pub verify_required: bool,
    /// `tunnel="n"`: forced tun device, a decimal number or `any`.
    pub tunnel: Option<String>,
}

/// One usable line of an authorized_keys file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizedKey {
    /// 1-based line number in the file.
    pub line: usize,
    /// Parsed options (all defaults when the line had none).
    pub options: KeyOptions,
    /// Key type field, one of [`KEY_TYPES`]; equals the type inside the blob.
    pub key_type: String,
    /// Decoded public key blob (SSH wire format, type string first).
    pub key_blob: Vec<u8>,
    /// Trailing comment, trimmed; `None` when absent.
    pub comment: Option<String>,
}

/// Parses a whole authorized_keys file.
///
/// Lines end with `\n` (a trailing `\r` is ignored). Blank lines and lines
/// whose first non-blank character is `#` are skipped silently. Lines with an
/// unknown option, a malformed option (bad quoting, empty or repeated
/// command, bad expiry, bad environment `NAME=value`, malformed CIDR in
/// `from=`, ...), an unsupported key type, bad base64 or a key type that does
/// not match the key data are skipped with a warning naming `label:line`;
/// all other lines are returned.
pub fn parse(label: &str, text: &str) -> (Vec<AuthorizedKey>, Vec<ParseWarning>) {
    parse_lines(label, text, parse_line)
}

/// Every line of `text` through `parse_line`, keeping the entries and
/// turning errors into warnings that name `label:line`.
fn parse_lines<T>(
    label: &str,
    text: &str,
    parse_line: impl Fn(&str, usize) -> Result<Option<T>, String>,
) -> (Vec<T>, Vec<ParseWarning>) {
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    for (idx, raw) in text.split('\n').enumerate() {
        let line_no = idx + 1;
        match parse_line(raw, line_no) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(message) => warnings.push(ParseWarning {
                file: label.to_string(),
                line: line_no,
                message,
            }),
        }
    }
    (entries, warnings)
}

/// A `RevokedKeys` file: a list of public keys (text, as in
/// authorized_keys, options not needed) or an OpenSSH key revocation list
/// (KRL, binary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokedKeys {
    Listed(std::collections::HashSet<Vec<u8>>),
    Krl(crate::krl::Krl),
}

impl RevokedKeys {
    /// Whether the plain key `blob` may not be used.
    pub fn revokes_key(&self, blob: &[u8]) -> bool {
        match self {
            RevokedKeys::Listed(set) => set.contains(blob),
            RevokedKeys::Krl(krl) => krl.revokes_key(blob),
        }
    }

    /// Whether a certificate for the key `key_blob` may not be used: that
    /// key or the CA's is revoked, or (in a KRL) its serial or key ID.
    pub fn revokes_certificate(
        &self,
        key_blob: &[u8],
        cert: &crate::krl::CertificateRef<'_>,
    ) -> bool {
        self.revokes_key(key_blob)
            || match self {
                RevokedKeys::Listed(set) => set.contains(cert.ca_key),
                RevokedKeys::Krl(krl) => krl.revokes_certificate(cert),
            }
    }
}

/// Parses a `RevokedKeys` file. A KRL that cannot be fully understood, or
/// a file that is neither a KRL nor text, is an error, so that the caller
/// can refuse every key rather than none.
pub fn parse_revoked_keys(
    label: &str,
    bytes: &[u8],
) -> Result<(RevokedKeys, Vec<ParseWarning>), String> {
    if bytes.starts_with(b"SSHKRL\n") {
        return crate::krl::Krl::parse(bytes)
            .map(|krl| (RevokedKeys::Krl(krl), Vec::new()))
            .map_err(|e| format!("{label}: key revocation list: {e}"));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| {
        format!("{label} is neither a list of public keys nor a key revocation list")
    })?;
    let (keys, warnings) = parse(label, text);
    Ok((
        RevokedKeys::Listed(keys.into_iter().map(|k| k.key_blob).collect()),
        warnings,
    ))
}

/// One usable line of an `AuthorizedPrincipalsFile`: a certificate
/// principal the account admits, with the options in front of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizedPrincipal {
    /// 1-based line number in the file.
    pub line: usize,
    pub options: KeyOptions,
    pub name: String,
}

/// Parses an `AuthorizedPrincipalsFile`: one principal a line, preceded by
/// authorized_keys options when the line has more than one word (as in
/// sshd). Blank and `#` lines are skipped; bad lines are skipped with a
/// warning naming `label:line`.
pub fn parse_principals(label: &str, text: &str) -> (Vec<AuthorizedPrincipal>, Vec<ParseWarning>) {
    parse_lines(label, text, |raw, line| {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let s = skip_blanks(raw).trim_end_matches([' ', '\t']);
        if s.is_empty() || s.starts_with('#') {
            return Ok(None);
        }
        let (options, name) = if s.contains([' ', '\t']) {
            let (options, rest) = parse_options(s).map_err(|e| explain_option_error(s, e))?;
            (options, skip_blanks(rest))
        } else {
            (KeyOptions::default(), s)
        };
        if name.contains([' ', '\t']) {
            return Err(format!("more than one principal name: `{name}`"));
        }
        Ok(Some(AuthorizedPrincipal {
            line,
            options,
            name: name.to_string(),
        }))
    })
}

/// Parses a single line (without its `\n`; a trailing `\r` is ignored).
///
/// Returns `Ok(None)` for blank and comment lines and `Err(message)` when the
/// line must be skipped.
pub fn parse_line(line: &str, line_no: usize) -> Result<Option<AuthorizedKey>, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let s = skip_blanks(line);
    if s.is_empty() || s.starts_with('#') {
        return Ok(None);
    }

    let (options, rest) = if is_key_type(first_token(s)) {
        (KeyOptions::default(), s)
    } else {
        match parse_options(s) {
            Ok(v) => v,
            Err(e) => return Err(explain_option_error(s, e)),
        }
    };

    let rest = skip_blanks(rest);
    let key_type = first_token(rest);
    if key_type.is_empty() {
        return Err("missing key type after options".to_string());
    }
    if !is_key_type(key_type) {
        return Err(format!("unsupported key type `{key_type}`"));
    }
    let rest = skip_blanks(&rest[key_type.len()..]);
    let data = first_token(rest);
    if data.is_empty() {
        return Err(format!("missing key data after `{key_type}`"));
    }
    let comment = rest[data.len()..].trim_matches([' ', '\t']);

    let key_blob = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(data)
        .map_err(|e| format!("invalid base64 key data: {e}"))?;
    check_blob(key_type, &key_blob)?;

    Ok(Some(AuthorizedKey {
        line: line_no,
        options,
        key_type: key_type.to_string(),
        key_blob,
        comment: (!comment.is_empty()).then(|| comment.to_string()),
    }))
}

/// Returns the first line whose (non-`cert-authority`) key equals the given
/// public key. `key_type` is the public key's type (the string at the start of
/// the blob); the RSA signature algorithm names `rsa-sha2-256` and
/// `rsa-sha2-512` are accepted as aliases for `ssh-rsa`.
pub fn find<'a>(
    keys: &'a [AuthorizedKey],
    key_type: &str,
    key_blob: &[u8],
) -> Option<&'a AuthorizedKey> {
    let key_type = canonical_key_type(key_type);
    keys.iter()
        .find(|k| !k.options.cert_authority && k.key_type == key_type && k.key_blob == key_blob)
}

/// Like [`find`], but only considers `cert-authority` lines: use it with the
/// signing CA key of a presented user certificate.
pub fn find_cert_authority<'a>(
    keys: &'a [AuthorizedKey],
    ca_key_type: &str,
    ca_key_blob: &[u8],
) -> Option<&'a AuthorizedKey> {
    let ca_key_type = canonical_key_type(ca_key_type);
    keys.iter().find(|k| {
        k.options.cert_authority && k.key_type == ca_key_type && k.key_blob == ca_key_blob
    })
}

fn canonical_key_type(t: &str) -> &str {
    match t {
        "rsa-sha2-256" | "rsa-sha2-512" => "ssh-rsa",
        other => other,
    }
}

/// Evaluates a `from=` pattern list for a client.
///
/// Patterns are wildcard patterns (`*`, `?`) optionally prefixed with `!`, or
/// CIDR blocks `addr/len` (IPv4 or IPv6, also negatable). Wildcard patterns
/// are matched against the client's IP address in text form and, when given,
/// against its host name (both compared lowercased); CIDR blocks are matched
/// against the address only. An IPv4-mapped IPv6 address is treated as the
/// IPv4 address. Any matching negated pattern denies; otherwise at least one
/// positive match is required. A malformed CIDR (only possible if the list
/// was not produced by [`parse`]) denies.
pub fn from_allows(patterns: &[String], client_ip: IpAddr, client_hostname: Option<&str>) -> bool {
    let ip = normalize_ip(client_ip);
    let ip_text = ip.to_string();
    let mut positive = false;

    let mut wild: Vec<String> = Vec::new();
    for raw in patterns {
        let (negated, pat) = match raw.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, raw.as_str()),
        };
        if pat.is_empty() {
            continue;
        }
        if pat.contains('/') {
            let Some((net, len)) = parse_cidr(pat) else {
                return false;
            };
            if cidr_contains(net, len, ip) {
                if negated {
                    return false;
                }
                positive = true;
            }
        } else {
            wild.push(raw.to_ascii_lowercase());
        }
    }

    let mut outcomes = vec![match_list(wild.iter().map(String::as_str), &ip_text)];
    if let Some(host) = client_hostname {
        let host = host.to_ascii_lowercase();
        outcomes.push(match_list(wild.iter().map(String::as_str), &host));
    }
    for outcome in outcomes {
        match outcome {
            ListMatch::Negated => return false,
            ListMatch::Positive => positive = true,
            ListMatch::NoMatch => {}
        }
    }
    positive
}

/// True when the key's `expiry-time` has been reached: `now_unix >= expiry`.
/// Keys without `expiry-time` never expire. `local_utc_offset_secs` is the
/// local zone's offset east of UTC (e.g. `3600` for UTC+1) and is used for
/// expiry times written without a trailing `Z`.
pub fn is_expired(opts: &KeyOptions, now_unix: i64, local_utc_offset_secs: i64) -> bool {
    opts.expiry_time
        .is_some_and(|e| now_unix >= e.to_unix(local_utc_offset_secs))
}

/// An `expiry-time` value: `YYYYMMDD`, `YYYYMMDDHHMM` or `YYYYMMDDHHMMSS`,
/// optionally followed by `Z` to mean UTC (otherwise local time). Omitted
/// time fields are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpiryTime {
    /// Four-digit year.
    pub year: u16,
    /// 1..=12.
    pub month: u8,
    /// 1..=days in month.
    pub day: u8,
    /// 0..=23.
    pub hour: u8,
    /// 0..=59.
    pub minute: u8,
    /// 0..=59.
    pub second: u8,
    /// True when written with a trailing `Z`.
    pub utc: bool,
}

impl ExpiryTime {
    /// Parses the textual form; `None` when malformed or out of range.
    pub fn parse(s: &str) -> Option<Self> {
        let (digits, utc) = match s.strip_suffix(['Z', 'z']) {
            Some(d) => (d, true),
            None => (s, false),
        };
        if !matches!(digits.len(), 8 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let num = |range: std::ops::Range<usize>| -> u16 {
            digits.as_bytes()[range]
                .iter()
                .fold(0u16, |acc, b| acc * 10 + u16::from(b - b'0'))
        };
        let field = |start: usize| -> u8 {
            if start + 2 <= digits.len() {
                num(start..start + 2) as u8
            } else {
                0
            }
        };
        let t = ExpiryTime {
            year: num(0..4),
            month: num(4..6) as u8,
            day: num(6..8) as u8,
            hour: field(8),
            minute: field(10),
            second: field(12),
            utc,
        };
        let valid = (1..=12).contains(&t.month)
            && t.day >= 1
            && t.day <= days_in_month(t.year, t.month)
            && t.hour <= 23
            && t.minute <= 59
            && t.second <= 59;
        valid.then_some(t)
    }

    /// Seconds since the Unix epoch. Times without `Z` are local times and are
    /// converted with `local_utc_offset_secs` (seconds east of UTC); times
    /// with `Z` ignore it.
    pub fn to_unix(&self, local_utc_offset_secs: i64) -> i64 {
        let days = days_from_civil(
            i64::from(self.year),
            i64::from(self.month),
            i64::from(self.day),
        );
        let secs = days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second);
        if self.utc {
            secs
        } else {
            secs.saturating_sub(local_utc_offset_secs)
        }
    }
}

impl FromStr for ExpiryTime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ExpiryTime::parse(s).ok_or_else(|| format!("invalid expiry time `{s}`"))
    }
}

impl fmt::Display for ExpiryTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}{:02}{:02}{:02}{:02}{:02}{}",
            self.year,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            if self.utc { "Z" } else { "" }
        )
    }
}

/// Splits a `permitopen`/`permitlisten` value into host and port.
///
/// Accepts `host:port`, `[v6addr]:port` and (host omitted) `port`; the port is
/// `*` or a number in 1..=65535. Brackets are removed from the host.
pub fn split_host_port(spec: &str) -> Option<(Option<&str>, &str)> {
    let (host, port) = if let Some(rest) = spec.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (Some(host), after.strip_prefix(':')?)
    } else if let Some((host, port)) = spec.split_once(':') {
        (Some(host), port)
    } else {
        (None, spec)
    };
    if host.is_some_and(|h| h.is_empty() || h.contains(['[', ']'])) {
        return None;
    }
    let port_ok = port == "*"
        || (!port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && matches!(port.parse::<u32>(), Ok(1..=65535)));
    port_ok.then_some((host, port))
}

// ---------------------------------------------------------------------------
// Line scanning and option parsing.

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn skip_blanks(s: &str) -> &str {
    s.trim_start_matches([' ', '\t'])
}

/// The text up to the first blank (or the end).
fn first_token(s: &str) -> &str {
    let end = s.bytes().position(is_blank).unwrap_or(s.len());
    &s[..end]
}

/// Gives a clearer message when the "options" were really an unsupported key
/// type such as `ssh-dss AAAA...`.
fn explain_option_error(s: &str, err: String) -> String {
    let first = first_token(s);
    let second = first_token(skip_blanks(&s[first.len()..]));
    let looks_like_type = !first.is_empty()
        && !first.contains(['=', ',', '"'])
        && first.bytes().all(|b| b.is_ascii_graphic());
    if looks_like_type && second.starts_with("AAAA") {
        format!("unsupported key type `{first}`")
    } else {
        err
    }
}

/// Parses the option list at the start of `s`; returns the options and the
/// text after the list (starting at the blank that ended it).
fn parse_options(s: &str) -> Result<(KeyOptions, &str), String> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut opts = KeyOptions::default();
    loop {
        let start = pos;
        while pos < b.len() && !matches!(b[pos], b'=' | b',' | b'"' | b' ' | b'\t') {
            pos += 1;
        }
        let name = &s[start..pos];
        if name.is_empty() {
            return Err(match b.get(pos) {
                Some(b'"') => "unexpected quote in options".to_string(),
                _ => "empty option name".to_string(),
            });
        }
        let value = if b.get(pos) == Some(&b'=') {
            pos += 1;
            if b.get(pos) != Some(&b'"') {
                return Err(format!("value of option `{name}` must be quoted"));
            }
            pos += 1;
            let mut value = String::new();
            let mut seg = pos;
            loop {
                match b.get(pos) {
                    None => return Err(format!("missing closing quote in option `{name}`")),
                    Some(b'\\') if b.get(pos + 1) == Some(&b'"') => {
                        value.push_str(&s[seg..pos]);
                        value.push('"');
                        pos += 2;
                        seg = pos;
                    }
                    Some(b'"') => {
                        value.push_str(&s[seg..pos]);
                        pos += 1;
                        break;
                    }
                    Some(_) => pos += 1,
                }
            }
            Some(value)
        } else {
            None
        };
        apply_option(&mut opts, name, value)?;
        match b.get(pos) {
            Some(b',') => pos += 1,
            Some(&c) if is_blank(c) => return Ok((opts, &s[pos..])),
            None => return Err("missing key after options".to_string()),
            Some(_) => return Err(format!("unexpected character after option `{name}`")),
        }
    }
}

fn apply_option(opts: &mut KeyOptions, name: &str, value: Option<String>) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let flag = |v: &Option<String>| -> Result<(), String> {
        match v {
            Some(_) => Err(format!("option `{name}` does not take a value")),
            None => Ok(()),
        }
    };
    let valued = |v: Option<String>| -> Result<String, String> {
        v.ok_or_else(|| format!("option `{name}` requires a value"))
    };
    match lower.as_str() {
        "restrict" => {
            flag(&value)?;
            opts.no_pty = true;
            opts.no_port_forwarding = true;
            opts.no_agent_forwarding = true;
            opts.no_x11_forwarding = true;
            opts.no_user_rc = true;
        }
        "no-pty" | "pty" => {
            flag(&value)?;
            opts.no_pty = lower.starts_with("no-");
        }
        "no-port-forwarding" | "port-forwarding" => {
            flag(&value)?;
            opts.no_port_forwarding = lower.starts_with("no-");
        }
        "no-agent-forwarding" | "agent-forwarding" => {
            flag(&value)?;
            opts.no_agent_forwarding = lower.starts_with("no-");
        }
        "no-x11-forwarding" | "x11-forwarding" => {
            flag(&value)?;
            opts.no_x11_forwarding = lower.starts_with("no-");
        }
        "no-user-rc" | "user-rc" => {
            flag(&value)?;
            opts.no_user_rc = lower.starts_with("no-");
        }
        "cert-authority" => {
            flag(&value)?;
            opts.cert_authority = true;
        }
        "no-touch-required" => {
            flag(&value)?;
            opts.no_touch_required = true;
        }
        "verify-required" => {
            flag(&value)?;
            opts.verify_required = true;
        }
        "command" => {
            let v = valued(value)?;
            if opts.command.is_some() {
                return Err("multiple `command` options".to_string());
            }
            if v.is_empty() {
                return Err("empty `command` option".to_string());
            }
            opts.command = Some(v);
        }
        "environment" => {
            let v = valued(value)?;
            let (key, val) = v
                .split_once('=')
                .ok_or_else(|| format!("environment `{v}` is not NAME=value"))?;
            if !valid_env_name(key) {
                return Err(format!("invalid environment variable name `{key}`"));
            }
            if !opts.environment.iter().any(|(k, _)| k == key) {
                opts.environment.push((key.to_string(), val.to_string()));
            }
        }
        "from" => {
            let v = valued(value)?;
            if opts.from.is_some() {
                return Err("multiple `from` options".to_string());
            }
            let list: Vec<String> = v.split(',').map(str::to_string).collect();
            for p in &list {
                let pat = p.strip_prefix('!').unwrap_or(p);
                if pat.contains('/') && parse_cidr(pat).is_none() {
                    return Err(format!("malformed CIDR `{pat}` in `from` option"));
                }
            }
            opts.from = Some(list);
        }
        "expiry-time" => {
            let v = valued(value)?;
            if opts.expiry_time.is_some() {
                return Err("multiple `expiry-time` options".to_string());
            }
            opts.expiry_time = Some(v.parse()?);
        }
        "principals" => {
            let v = valued(value)?;
            if opts.principals.is_some() {
                return Err("multiple `principals` options".to_string());
            }
            opts.principals = Some(
                v.split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
        "permitopen" => {
            let v = valued(value)?;
            match split_host_port(&v) {
                Some((Some(_), _)) => opts.permit_open.push(v),
                _ => return Err(format!("invalid `permitopen` value `{v}` (want host:port)")),
            }
        }
        "permitlisten" => {
            let v = valued(value)?;
            if split_host_port(&v).is_none() {
                return Err(format!(
                    "invalid `permitlisten` value `{v}` (want [host:]port)"
                ));
            }
            opts.permit_listen.push(v);
        }
        "tunnel" => {
            let v = valued(value)?;
            if opts.tunnel.is_some() {
                return Err("multiple `tunnel` options".to_string());
            }
            let ok = v.eq_ignore_ascii_case("any")
                || (!v.is_empty()
                    && v.bytes().all(|b| b.is_ascii_digit())
                    && v.parse::<u32>().is_ok_and(|n| n < 0x7fff_ffff));
            if !ok {
                return Err(format!("invalid `tunnel` value `{v}`"));
            }
            opts.tunnel = Some(v);
        }
        _ => return Err(format!("unknown option `{name}`")),
    }
    Ok(())
}

/// Environment names: a letter or `_`, then letters, digits or `_`.
fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

// ---------------------------------------------------------------------------
// Key blob checks.

/// Reads SSH wire-format strings (u32 big-endian length + bytes).
struct BlobReader<'a> {
    rest: &'a [u8],
}

impl<'a> BlobReader<'a> {
    fn string(&mut self) -> Option<&'a [u8]> {
        if self.rest.len() < 4 {
            return None;
        }
        let (len, rest) = self.rest.split_at(4);
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if rest.len() < len {
            return None;
        }
        let (s, rest) = rest.split_at(len);
        self.rest = rest;
        Some(s)
    }
}

/// Checks that the blob starts with `key_type` and is a well-formed public key
/// of that type with no trailing data.
fn check_blob(key_type: &str, blob: &[u8]) -> Result<(), String> {
    let mut r = BlobReader { rest: blob };
    let inner = r
        .string()
        .ok_or_else(|| "malformed key data (no key type)".to_string())?;
    if inner != key_type.as_bytes() {
        return Err(format!(
            "key type mismatch: line says `{key_type}` but key data is `{}`",
            String::from_utf8_lossy(inner)
        ));
    }
    let ec_point = |r: &mut BlobReader<'_>, curve: &str, point_len: usize| -> Option<()> {
        let name = r.string()?;
        let q = r.string()?;
        (name == curve.as_bytes() && q.len() == point_len && q[0] == 0x04).then_some(())
    };
    let ok = match key_type {
        "ssh-ed25519" => r.string().is_some_and(|k| k.len() == 32),
        "sk-ssh-ed25519@openssh.com" => {
            r.string().is_some_and(|k| k.len() == 32) && r.string().is_some()
        }
        "ecdsa-sha2-nistp256" => ec_point(&mut r, "nistp256", 65).is_some(),
        "ecdsa-sha2-nistp384" => ec_point(&mut r, "nistp384", 97).is_some(),
        "ecdsa-sha2-nistp521" => ec_point(&mut r, "nistp521", 133).is_some(),
        "sk-ecdsa-sha2-nistp256@openssh.com" => {
            ec_point(&mut r, "nistp256", 65).is_some() && r.string().is_some()
        }
        "ssh-rsa" => {
            let e = r.string();
            let n = r.string();
            e.is_some_and(|e| !e.is_empty()) && n.is_some_and(|n| !n.is_empty())
        }
        _ => false,
    };
    if !ok {
        return Err(format!("malformed `{key_type}` key data"));
    }
    if !r.rest.is_empty() {
        return Err(format!("trailing data after `{key_type}` key"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Addresses and dates.

fn normalize_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// Parses `addr/len`; `None` when the address or length is invalid.
fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

fn cidr_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            (u32::from(n) & mask) == (u32::from(a) & mask)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            (u128::from(n) & mask) == (u128::from(a) & mask)
        }
        _ => false,
    }
}

fn is_leap(year: u16) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 for a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Count years from March so the leap day is the last day of the year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400; // 0..=399
    let month_from_march = (month + 9) % 12; // March = 0 .. February = 11
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719_468 days separate 0000-03-01 from 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIM+IPPvLeePp4+ZlUBrBaEraBDc4jkKMYyu2CRcPpxVA";
    const P256: &str = "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPPIZTNiUHe1fN+lDj0YY75wqyVNeLkjdk8r4s2boxgf8yC5sjQS+U7RojBAmf1vzRHtptOPem3tE20lsa/GFkE=";
    const P521: &str = "AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBAAOoKtSZvfhW4D9UoRmK2vRfGaxE+8hYz5B4pMhR0R4qBQSNt47ogP55jVRMF6EBXISCP/mBUtG0aHl9AX4c1mWxwCQ996sT1Cch16h3X/g/+cvXiQ3O/5pSbPRC82P5SVD3ypCA+BdasA+g/mn0RQzZiNLJcyQQjUg1WE+/lGFSc78gw==";
    const RSA: &str = "AAAAB3NzaC1yc2EAAAADAQABAAABgQCQLZYoTx5f4RyqYDuiODZE+rTFd2EpJJ65PjJu87nyFj3vr2XklOwiGH9Q1a88P5CVhnEGTezi7xlK3w7ishz9Ee6PntDPrTVBJd7K9a24y+H47tR8Gaq+w+oXwS/mlPJP9CRya62su7fqi8Q6ismcH0Yv9Jzz2b8x9MJ5HLdQDVk5Vx7IdIVFZHD7UnnwPFMTNXz5c6Vxiw25SKwqp0nm4pu7vl+PObdgq1D94f85YZrc93ThWIB99D66djjAMEjus7dsxVgv2Zkriopqbrap3nfaRHYR+LYRHDZf/spLlDLi5akxMZoEfMA6SXRuZRM4bKlYFrlL49y+gYxeqELhRtM95zNDXCX6vWEFqfFNBWZEDhiGnQH2q3wKkzs0GLEiLK3ZSyw+Ss8XOHmU7dwn89+m7zJ8h2bOfqzHDnfgwm935y0PqN8PLlDux4KIqtpNKOC2QaPY7FM7inKIWta29uwuhdkyWdCqx4zRGxqnRfqByYayBMBCgWt/Mirp9gE=";

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn ssh_string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s);
    }

    fn blob(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            ssh_string(&mut out, p);
        }
        out
    }

    fn ed_blob(fill: u8) -> Vec<u8> {
        blob(&[b"ssh-ed25519", &[fill; 32]])
    }

    fn ed_line(fill: u8) -> String {
        format!("ssh-ed25519 {}", b64(&ed_blob(fill)))
    }

    fn one(line: &str) -> AuthorizedKey {
        let (keys, warnings) = parse("ak", line);
        assert!(warnings.is_empty(), "unexpected warnings: {warnings:?}");
        assert_eq!(keys.len(), 1, "line: {line}");
        keys.into_iter().next().unwrap()
    }

    fn opts(options: &str) -> KeyOptions {
        one(&format!("{options} {}", ed_line(1))).options
    }

    fn warn(line: &str) -> String {
        let (keys, warnings) = parse("ak", line);
        assert!(keys.is_empty(), "line should be skipped: {line}");
        assert_eq!(warnings.len(), 1, "line: {line}");
        warnings[0].message.clone()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_keys_of_every_type() {
        let sk_ed = blob(&[b"sk-ssh-ed25519@openssh.com", &[7; 32], b"ssh:"]);
        let mut point = vec![4u8];
        point.extend_from_slice(&[9; 64]);
        let sk_ec = blob(&[
            b"sk-ecdsa-sha2-nistp256@openssh.com",
            b"nistp256",
            &point,
            b"ssh:",
        ]);
        let mut p384 = vec![4u8];
        p384.extend_from_slice(&[3; 96]);
        let ec384 = blob(&[b"ecdsa-sha2-nistp384", b"nistp384", &p384]);
        let text = format!(
            "ssh-ed25519 {ED} test@ed25519\n\
             ecdsa-sha2-nistp256 {P256} test@ecdsa\n\
             ecdsa-sha2-nistp384 {}\n\
             ecdsa-sha2-nistp521 {P521} e521\n\
             ssh-rsa {RSA} test@rsa\n\
             sk-ssh-ed25519@openssh.com {} yubi\n\
             sk-ecdsa-sha2-nistp256@openssh.com {}   spaced   comment  \n",
            b64(&ec384),
            b64(&sk_ed),
            b64(&sk_ec)
        );
        let (keys, warnings) = parse("ak", &text);
        assert!(warnings.is_empty(), "{warnings:?}");
        let types: Vec<&str> = keys.iter().map(|k| k.key_type.as_str()).collect();
        assert_eq!(types, KEY_TYPES);
        assert_eq!(keys[0].comment.as_deref(), Some("test@ed25519"));
        assert_eq!(keys[0].line, 1);
        assert_eq!(keys[0].options, KeyOptions::default());
        assert_eq!(keys[2].comment, None);
        assert_eq!(keys[5].key_blob, sk_ed);
        assert_eq!(keys[6].comment.as_deref(), Some("spaced   comment"));
        assert_eq!(keys[6].line, 7);
    }

    #[test]
    fn comments_blank_lines_and_crlf() {
        let text = format!(
            "# a comment\r\n\r\n   \t\n  # indented comment\n{}\r\n\t{} with comment\r\n",
            ed_line(1),
            ed_line(2)
        );
        let (keys, warnings) = parse("ak", &text);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].line, 5);
        assert_eq!(keys[0].comment, None);
        assert_eq!(keys[0].key_blob, ed_blob(1));
        assert_eq!(keys[1].line, 6);
        assert_eq!(keys[1].comment.as_deref(), Some("with comment"));
        // CRLF on an options line too.
        let k = one(&format!("no-pty,command=\"x\" {}\r\n", ed_line(3)));
        assert!(k.options.no_pty);
        assert_eq!(k.options.command.as_deref(), Some("x"));
        assert_eq!(k.comment, None);
    }

    #[test]
    fn flag_options() {
        let o = opts(
            "no-pty,no-port-forwarding,no-agent-forwarding,no-x11-forwarding,no-user-rc,\
             cert-authority,no-touch-required,verify-required",
        );
        assert!(o.no_pty && o.no_port_forwarding && o.no_agent_forwarding);
        assert!(o.no_x11_forwarding && o.no_user_rc);
        assert!(o.cert_authority && o.no_touch_required && o.verify_required);
        assert_eq!(o.command, None);

        let o = opts("no-pty");
        assert!(o.no_pty);
        assert!(!o.no_port_forwarding && !o.no_agent_forwarding && !o.no_x11_forwarding);
        assert!(!o.no_user_rc && !o.cert_authority);
    }

    #[test]
    fn option_names_are_case_insensitive() {
        let o = opts("No-PTY,COMMAND=\"ls\",Restrict,X11-Forwarding");
        assert!(o.no_pty);
        assert_eq!(o.command.as_deref(), Some("ls"));
        assert!(!o.no_x11_forwarding);
        assert!(o.no_agent_forwarding);
    }

    #[test]
    fn restrict_and_reenable() {
        let o = opts("restrict");
        assert!(o.no_pty && o.no_port_forwarding && o.no_agent_forwarding);
        assert!(o.no_x11_forwarding && o.no_user_rc);

        let o = opts("restrict,pty");
        assert!(!o.no_pty);
        assert!(o.no_port_forwarding && o.no_agent_forwarding && o.no_x11_forwarding);
        assert!(o.no_user_rc);

        let o = opts("restrict,port-forwarding,agent-forwarding,x11-forwarding,user-rc");
        assert!(o.no_pty);
        assert!(!o.no_port_forwarding && !o.no_agent_forwarding);
        assert!(!o.no_x11_forwarding && !o.no_user_rc);

        // Order matters: a later restrict wins over an earlier pty.
        let o = opts("pty,restrict");
        assert!(o.no_pty);
        // And a later no-pty wins over an earlier pty.
        let o = opts("restrict,pty,no-pty");
        assert!(o.no_pty);
    }

    #[test]
    fn command_quoting() {
        let o = opts(r#"command="echo \"hi, there\"; ls -l /tmp""#);
        assert_eq!(
            o.command.as_deref(),
            Some(r#"echo "hi, there"; ls -l /tmp"#)
        );

        // Other backslashes are kept literally.
        let o = opts(r#"command="a\\b\n""#);
        assert_eq!(o.command.as_deref(), Some(r"a\\b\n"));

        // Commas and blanks in a value do not end the option list.
        let k = one(&format!(
            r#"command="x, y  z",no-pty {} trailing comment"#,
            ed_line(4)
        ));
        assert_eq!(k.options.command.as_deref(), Some("x, y  z"));
        assert!(k.options.no_pty);
        assert_eq!(k.comment.as_deref(), Some("trailing comment"));
        assert_eq!(k.key_blob, ed_blob(4));
    }

    #[test]
    fn command_errors() {
        assert!(warn(&format!(r#"command="" {}"#, ed_line(1))).contains("empty"));
        assert!(warn(&format!(r#"command="a",command="b" {}"#, ed_line(1))).contains("multiple"));
        assert!(warn(&format!(r#"command="unterminated {}"#, ed_line(1))).contains("quote"));
        assert!(warn(&format!(r#"command=unquoted {}"#, ed_line(1))).contains("quoted"));
        assert!(warn(&format!(r#"command {}"#, ed_line(1))).contains("requires a value"));
        assert!(warn(&format!(r#"no-pty="x" {}"#, ed_line(1))).contains("does not take"));
        assert!(warn(&format!(r#"command="a"x {}"#, ed_line(1))).contains("unexpected"));
        assert!(warn(&format!(r#"no-pty,,no-x11-forwarding {}"#, ed_line(1))).contains("empty"));
        assert!(warn(&format!(r#"no-pty, {}"#, ed_line(1))).contains("empty"));
        assert!(warn(r#"command="only options""#).contains("missing key"));
    }

    #[test]
    fn environment_option() {
        let o = opts(
            r#"environment="FOO=bar baz",environment="_X1=a=b,c",environment="EMPTY=",environment="FOO=second""#,
        );
        assert_eq!(
            o.environment,
            vec![
                ("FOO".to_string(), "bar baz".to_string()),
                ("_X1".to_string(), "a=b,c".to_string()),
                ("EMPTY".to_string(), String::new()),
            ]
        );
        for bad in ["NOEQUALS", "=value", "1ABC=x", "A-B=x", "A B=x"] {
            let msg = warn(&format!(r#"environment="{bad}" {}"#, ed_line(1)));
            assert!(msg.contains("environment"), "{bad}: {msg}");
        }
    }

    #[test]
    fn permit_open_listen_principals_tunnel() {
        let o = opts(
            r#"permitopen="localhost:80",permitopen="[::1]:*",permitlisten="8080",permitlisten="0.0.0.0:2222",principals="alice,bob",tunnel="3""#,
        );
        assert_eq!(o.permit_open, strings(&["localhost:80", "[::1]:*"]));
        assert_eq!(o.permit_listen, strings(&["8080", "0.0.0.0:2222"]));
        assert_eq!(o.principals, Some(strings(&["alice", "bob"])));
        assert_eq!(o.tunnel.as_deref(), Some("3"));
        assert_eq!(split_host_port("[::1]:*"), Some((Some("::1"), "*")));
        assert_eq!(split_host_port("8080"), Some((None, "8080")));
        assert_eq!(split_host_port("h:0"), None);
        assert_eq!(split_host_port("h:65536"), None);

        for bad in [
            r#"permitopen="nohost""#,
            r#"permitopen="host:""#,
            r#"permitopen="host:http""#,
            r#"permitlisten="99999""#,
            r#"tunnel="x""#,
            r#"principals="a",principals="b""#,
        ] {
            warn(&format!("{bad} {}", ed_line(1)));
        }
    }

    #[test]
    fn from_option_matching() {
        let o = opts(
            r#"from="*.example.com,!bad.example.com,10.1.2.*,192.168.0.0/16,2001:db8::/32,!192.168.66.0/24""#,
        );
        let from = o.from.unwrap();
        assert_eq!(from.len(), 6);
        let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
        let other = v4(203, 0, 113, 9);

        // Host name wildcard, lowercased.
        assert!(from_allows(&from, other, Some("Web.Example.COM")));
        assert!(!from_allows(&from, other, Some("example.org")));
        assert!(!from_allows(&from, other, None));
        // Negated host wins.
        assert!(!from_allows(&from, other, Some("bad.example.com")));
        assert!(!from_allows(
            &from,
            v4(192, 168, 1, 1),
            Some("bad.example.com")
        ));
        // IP wildcard against the text form.
        assert!(from_allows(&from, v4(10, 1, 2, 77), None));
        assert!(!from_allows(&from, v4(10, 1, 3, 77), None));
        // CIDR v4, with a negated inner block.
        assert!(from_allows(&from, v4(192, 168, 200, 1), None));
        assert!(!from_allows(
            &from,
            v4(192, 168, 66, 1),
            Some("x.example.com")
        ));
        assert!(!from_allows(&from, v4(192, 169, 0, 1), None));
        // CIDR v6.
        let v6: IpAddr = "2001:db8:ffff::1".parse().unwrap();
        assert!(from_allows(&from, v6, None));
        let v6_out: IpAddr = "2001:db9::1".parse().unwrap();
        assert!(!from_allows(&from, v6_out, None));
        // IPv4-mapped IPv6 client addresses are treated as IPv4.
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 168, 3, 4).to_ipv6_mapped());
        assert!(from_allows(&from, mapped, None));

        // Only a negation: never a positive match.
        let neg = strings(&["!10.0.0.1"]);
        assert!(!from_allows(&neg, v4(10, 0, 0, 2), None));
        // Exact IPv6 text, non-CIDR host bits, /0 and /128.
        let v6list = strings(&["::1", "fe80::/10"]);
        assert!(from_allows(&v6list, IpAddr::V6(Ipv6Addr::LOCALHOST), None));
        assert!(from_allows(&v6list, "fe80::abcd".parse().unwrap(), None));
        assert!(from_allows(&strings(&["0.0.0.0/0"]), other, None));
        assert!(from_allows(
            &strings(&["10.9.8.7/8"]),
            v4(10, 1, 1, 1),
            None
        ));
        assert!(from_allows(
            &strings(&["::2/128"]),
            "::2".parse().unwrap(),
            None
        ));
        assert!(!from_allows(
            &strings(&["::2/128"]),
            "::3".parse().unwrap(),
            None
        ));
        // A v4 block never matches a v6 client and vice versa.
        assert!(!from_allows(&strings(&["0.0.0.0/0"]), v6, None));
        assert!(!from_allows(&strings(&["::/0"]), other, None));
        // Malformed CIDR handed in directly: deny.
        assert!(!from_allows(&strings(&["*", "10.0.0.0/33"]), other, None));
        // Host patterns are compared case-insensitively.
        assert!(from_allows(
            &strings(&["*.EXAMPLE.com"]),
            other,
            Some("a.example.COM")
        ));
    }

    #[test]
    fn from_option_malformed_cidr() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0/8",
            "10.0.0.*/8",
            "2001:db8::/129",
            "2001:db8::/x",
            "!fe80::zz/10",
            "10.0.0.0/8/8",
        ] {
            let msg = warn(&format!(r#"from="{bad}" {}"#, ed_line(1)));
            assert!(msg.contains("CIDR"), "{bad}: {msg}");
        }
        assert!(warn(&format!(r#"from="a",from="b" {}"#, ed_line(1))).contains("multiple"));
    }

    #[test]
    fn expiry_time_parsing() {
        let t = ExpiryTime::parse("20240229").unwrap();
        assert_eq!(
            (t.year, t.month, t.day, t.hour, t.minute, t.second),
            (2024, 2, 29, 0, 0, 0)
        );
        assert!(!t.utc);
        let t = ExpiryTime::parse("202402291234Z").unwrap();
        assert_eq!((t.hour, t.minute, t.second, t.utc), (12, 34, 0, true));
        let t: ExpiryTime = "20240229123456".parse().unwrap();
        assert_eq!(t.second, 56);
        assert_eq!(t.to_string(), "20240229123456");
        for bad in [
            "",
            "2024",
            "2024022",
            "202402291",
            "20240229123",
            "2024022912345",
            "202402291234567",
            "20230229",
            "20241301",
            "20240001",
            "20240100",
            "20240431",
            "202401012400",
            "202401012360",
            "20240101235960",
            "2024-01-01",
            "20240101Z1",
            "ZZ",
            "+2024010",
        ] {
            assert_eq!(ExpiryTime::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn expiry_time_to_unix() {
        let unix = |s: &str, off| ExpiryTime::parse(s).unwrap().to_unix(off);
        assert_eq!(unix("19700101Z", 0), 0);
        assert_eq!(unix("19700101Z", 3600), 0); // Z ignores the offset.
        assert_eq!(unix("20000301Z", 0), 951_868_800);
        assert_eq!(unix("20240229123456Z", 0), 1_709_210_096);
        assert_eq!(unix("20380119031408Z", 0), 2_147_483_648);
        assert_eq!(unix("19691231235959Z", 0), -1);
        assert_eq!(unix("99991231235959Z", 0), 253_402_300_799);
        assert_eq!(unix("21000301Z", 0), 4_107_542_400);
        // Local time: 12:34:56 at UTC+2 is 10:34:56 UTC.
        assert_eq!(unix("20240229123456", 7200), 1_709_210_096 - 7200);
        // UTC-5.
        assert_eq!(unix("20240229123456", -18000), 1_709_210_096 + 18000);
    }

    #[test]
    fn expiry_option_and_is_expired() {
        let o = opts(r#"expiry-time="20240229123456Z""#);
        let exp = 1_709_210_096;
        assert!(!is_expired(&o, exp - 1, 0));
        assert!(is_expired(&o, exp, 0));
        assert!(is_expired(&o, exp + 1, 3600));

        // Local time, offset +1h: expiry is one hour earlier in UTC.
        let o = opts(r#"EXPIRY-TIME="20240229123456""#);
        assert!(!is_expired(&o, exp - 3601, 3600));
        assert!(is_expired(&o, exp - 3600, 3600));
        assert!(!is_expired(&o, exp - 1, 0));

        // Past and future dates relative to a fixed "now".
        let now = 1_700_000_000; // 2023-11-14
        assert!(is_expired(&opts(r#"expiry-time="20200101""#), now, 0));
        assert!(!is_expired(&opts(r#"expiry-time="20300101Z""#), now, 0));
        // No expiry: never expired.
        assert!(!is_expired(&KeyOptions::default(), i64::MAX, 0));

        assert!(warn(&format!(r#"expiry-time="20241301" {}"#, ed_line(1))).contains("expiry"));
        assert!(warn(&format!(r#"expiry-time="tomorrow" {}"#, ed_line(1))).contains("expiry"));
        assert!(warn(&format!(
            r#"expiry-time="20300101",expiry-time="20310101" {}"#,
            ed_line(1)
        ))
        .contains("multiple"));
    }

    #[test]
    fn unknown_option_skips_only_that_line() {
        let text = format!(
            "{}\n# comment\nno-pty,frobnicate {} bad\n{} next\n",
            ed_line(1),
            ed_line(2),
            ed_line(3)
        );
        let (keys, warnings) = parse("/home/u/.ssh/authorized_keys", &text);
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].line, 1);
        assert_eq!(keys[1].line, 4);
        assert_eq!(keys[1].comment.as_deref(), Some("next"));
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].line, 3);
        assert_eq!(warnings[0].file, "/home/u/.ssh/authorized_keys");
        assert!(warnings[0].message.contains("frobnicate"));
        assert!(warnings[0]
            .to_string()
            .starts_with("/home/u/.ssh/authorized_keys:3: unknown option"));
        assert!(find(&keys, "ssh-ed25519", &ed_blob(2)).is_none());
        assert!(find(&keys, "ssh-ed25519", &ed_blob(3)).is_some());
    }

    #[test]
    fn key_data_errors() {
        // Type field differs from the type inside the blob.
        let msg = warn(&format!("ssh-rsa {ED}"));
        assert!(msg.contains("mismatch"), "{msg}");
        let msg = warn(&format!("no-pty ecdsa-sha2-nistp384 {P256}"));
        assert!(msg.contains("mismatch"), "{msg}");
        // Bad base64.
        assert!(warn("ssh-ed25519 AAAA!!!!").contains("base64"));
        assert!(warn("ssh-ed25519 A").contains("base64"));
        // Missing data / type.
        assert!(warn("ssh-ed25519").contains("missing key data"));
        assert!(warn("no-pty ").contains("missing key type"));
        // Unsupported types.
        assert!(warn("ssh-dss AAAAB3NzaC1kc3MAAACBAP comment")
            .contains("unsupported key type `ssh-dss`"));
        assert!(warn(&format!("no-pty ssh-dss {ED}")).contains("unsupported key type"));
        // Structurally malformed blobs.
        let short = blob(&[b"ssh-ed25519", &[1; 31]]);
        assert!(warn(&format!("ssh-ed25519 {}", b64(&short))).contains("malformed"));
        let mut trailing = ed_blob(1);
        trailing.push(0);
        assert!(warn(&format!("ssh-ed25519 {}", b64(&trailing))).contains("trailing"));
        let wrong_curve = blob(&[b"ecdsa-sha2-nistp256", b"nistp384", &[4; 65]]);
        assert!(warn(&format!("ecdsa-sha2-nistp256 {}", b64(&wrong_curve))).contains("malformed"));
        let truncated = &ed_blob(1)[..20];
        assert!(warn(&format!("ssh-ed25519 {}", b64(truncated))).contains("malformed"));
        assert!(warn(&format!("ssh-ed25519 {}", b64(b"\0\0"))).contains("malformed"));
    }

    #[test]
    fn base64_padding_is_optional() {
        let k = one(&format!(
            "ecdsa-sha2-nistp256 {}",
            P256.trim_end_matches('=')
        ));
        assert_eq!(k.key_type, "ecdsa-sha2-nistp256");
    }

    #[test]
    fn revoked_key_lists() {
        let text = format!("# gone\n{}\nnot a key\n{}\n", ed_line(1), ed_line(2));
        let (revoked, warnings) = parse_revoked_keys("rk", text.as_bytes()).unwrap();
        let RevokedKeys::Listed(set) = &revoked else {
            panic!("a text list: {revoked:?}");
        };
        assert_eq!(set.len(), 2);
        assert!(revoked.revokes_key(&ed_blob(1)) && revoked.revokes_key(&ed_blob(2)));
        assert!(!revoked.revokes_key(&ed_blob(3)));
        fn cert(ca: &[u8]) -> crate::krl::CertificateRef<'_> {
            crate::krl::CertificateRef {
                ca_key: ca,
                serial: 1,
                key_id: "id",
            }
        }
        // A certificate for a listed key, or from a listed CA.
        assert!(revoked.revokes_certificate(&ed_blob(1), &cert(b"ca")));
        assert!(revoked.revokes_certificate(&ed_blob(3), &cert(&ed_blob(2))));
        assert!(!revoked.revokes_certificate(&ed_blob(3), &cert(b"ca")));
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].line, 3);
        // A truncated KRL is an error that says what the file is.
        let krl = parse_revoked_keys("rk", b"SSHKRL\n\0\0\0\0\x01").unwrap_err();
        assert!(krl.contains("rk: key revocation list: truncated"), "{krl}");
        assert!(parse_revoked_keys("rk", &[0xff, 0xfe]).is_err());
    }

    #[test]
    fn principals_files() {
        let text = "# admins\nalice\n\ncommand=\"uptime\",from=\"10.0.0.0/8\" monitoring \r\n\
                    bogus-option ops\nno-pty two names\n  \tdba\n";
        let (list, warnings) = parse_principals("ap", text);
        let names: Vec<(&str, usize)> = list.iter().map(|p| (p.name.as_str(), p.line)).collect();
        assert_eq!(names, [("alice", 2), ("monitoring", 4), ("dba", 7)]);
        assert_eq!(list[1].options.command.as_deref(), Some("uptime"));
        assert_eq!(
            list[1].options.from.as_deref(),
            Some(&["10.0.0.0/8".to_string()][..])
        );
        assert_eq!(list[0].options, KeyOptions::default());
        let lines: Vec<usize> = warnings.iter().map(|w| w.line).collect();
        assert_eq!(lines, [5, 6]);
        assert!(warnings.iter().all(|w| w.file == "ap"));
        assert!(
            warnings[1].message.contains("more than one principal"),
            "{:?}",
            warnings[1]
        );
    }

    #[test]
    fn find_first_match_and_cert_authority() {
        let text = format!(
            "cert-authority {ca}\nno-pty {a} first\n{a} second\n{b}\n{ca} plain\nssh-rsa {RSA}\n",
            ca = ed_line(9),
            a = ed_line(1),
            b = ed_line(2)
        );
        let (keys, warnings) = parse("ak", &text);
        assert!(warnings.is_empty(), "{warnings:?}");
        let hit = find(&keys, "ssh-ed25519", &ed_blob(1)).unwrap();
        assert_eq!(hit.line, 2);
        assert!(hit.options.no_pty);
        assert_eq!(find(&keys, "ssh-ed25519", &ed_blob(2)).unwrap().line, 4);
        // The CA key as a plain key only matches the non-CA line.
        assert_eq!(find(&keys, "ssh-ed25519", &ed_blob(9)).unwrap().line, 5);
        assert_eq!(
            find_cert_authority(&keys, "ssh-ed25519", &ed_blob(9))
                .unwrap()
                .line,
            1
        );
        assert!(find_cert_authority(&keys, "ssh-ed25519", &ed_blob(1)).is_none());
        // Wrong type or unknown blob.
        assert!(find(&keys, "ssh-rsa", &ed_blob(1)).is_none());
        assert!(find(&keys, "ssh-ed25519", &ed_blob(3)).is_none());
        // RSA signature algorithm names resolve to ssh-rsa.
        let rsa_blob = base64::engine::general_purpose::STANDARD
            .decode(RSA)
            .unwrap();
        assert_eq!(find(&keys, "rsa-sha2-512", &rsa_blob).unwrap().line, 6);
        assert_eq!(find(&keys, "ssh-rsa", &rsa_blob).unwrap().line, 6);
        // Only cert-authority lines: plain keys never match.
        let (ca_only, _) = parse("ak", &format!("cert-authority {}", ed_line(1)));
        assert!(find(&ca_only, "ssh-ed25519", &ed_blob(1)).is_none());
    }

    #[test]
    fn everything_on_one_line() {
        let line = format!(
            r#"restrict,pty,command="/usr/bin/backup --dir \"/srv/a b\"",from="10.0.0.0/8,!10.6.6.6",environment="MODE=ro",expiry-time="20991231Z",permitopen="db:5432",permitlisten="localhost:9000",principals="ops",no-touch-required,verify-required {} the comment"#,
            ed_line(5)
        );
        let k = one(&line);
        let o = &k.options;
        assert!(!o.no_pty && o.no_port_forwarding && o.no_agent_forwarding);
        assert!(o.no_x11_forwarding && o.no_user_rc);
        assert_eq!(
            o.command.as_deref(),
            Some(r#"/usr/bin/backup --dir "/srv/a b""#)
        );
        assert_eq!(o.from, Some(strings(&["10.0.0.0/8", "!10.6.6.6"])));
        assert_eq!(o.environment, vec![("MODE".to_string(), "ro".to_string())]);
        assert_eq!(o.expiry_time.unwrap().to_string(), "20991231000000Z");
        assert_eq!(o.permit_open, strings(&["db:5432"]));
        assert_eq!(o.permit_listen, strings(&["localhost:9000"]));
        assert_eq!(o.principals, Some(strings(&["ops"])));
        assert!(o.no_touch_required && o.verify_required && !o.cert_authority);
        assert_eq!(k.comment.as_deref(), Some("the comment"));
        assert!(from_allows(
            o.from.as_ref().unwrap(),
            "10.1.1.1".parse().unwrap(),
            None
        ));
        assert!(!from_allows(
            o.from.as_ref().unwrap(),
            "10.6.6.6".parse().unwrap(),
            None
        ));
    }

    #[test]
    fn warning_display() {
        let w = ParseWarning {
            file: "f".into(),
            line: 7,
            message: "m".into(),
        };
        assert_eq!(w.to_string(), "f:7: m");
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        for s in [
            "",
            "\n\n\r\n",
            "\"",
            "=",
            ",",
            "a=\"\\",
            "a=\"\\\"",
            "command=\"é\\\"ü\" ssh-ed25519 AAAA",
            "ssh-ed25519 \u{00e9}\u{00e9}",
            "restrict\tssh-ed25519",
            "\u{feff}ssh-ed25519 AAAA",
        ] {
            let _ = parse("x", s);
        }
        let k = one(&format!("command=\"é \\\"ü\\\" ñ\"\t{}", ed_line(1)));
        assert_eq!(k.options.command.as_deref(), Some("é \"ü\" ñ"));
    }
}
