//! `-G`: the settings skiff would use, as `ssh -G` prints them: one
//! `keyword value` a line, the keyword in lower case, in ssh's order, list
//! keywords (`identityfile`, `sendenv`, the forwardings) one line per entry.
//! Programs parse ssh's output (git asks it whether `-p` is taken, scripts
//! and Ansible read `hostname`, `user`, `port`, `identityfile`,
//! `proxyjump`), so the keywords are ssh's and so is the way each value is
//! written, as given where ssh keeps it as given (`identityfile` with its
//! `%` tokens, `proxyjump`, `proxycommand`), expanded where ssh expands it.
//!
//! Every value is what skiff does. Keywords skiff takes and does not act
//! on are printed as what skiff does instead ([`NOT_IMPLEMENTED`], each
//! with why): `controlmaster false`, `forwardx11 no`, and so on. A few keywords ssh
//! prints only tune a feature skiff does not have, and are left out:
//! `forwardx11timeout`, `xauthlocation` (no X11 forwarding),
//! `tunneldevice` (no tunnel devices), `hostbasedacceptedalgorithms` (no
//! host-based authentication), `gssapikexalgorithms` (no GSSAPI key
//! exchange), `securitykeyprovider` and `pkcs11provider` (no security keys or
//! PKCS#11 tokens but through an agent), `syslogfacility` (skiff never
//! logs to syslog) and `controlpath` (no control sockets).

use std::fmt::Display;
use std::path::Path;

use skiff_engine::ConnectSettings;
use skiff_proto::escape::EscapeChar;
use skiff_proto::forward_spec::{ConnectEnd, ForwardSpec, Listen, ListenEnd};
use skiff_proto::known_hosts::StrictHostKeyChecking;
use skiff_proto::ssh_config::{
    AddKeysToAgent, AddressFamily, Canonicalize, ControlPersist, HostConfig, ProxySpec, RequestTty,
    SessionType,
};

use crate::ssh_args::{SshCommandLine, TtyFlag};

/// ssh's keywords in the order `ssh -G` prints them.
const ORDER: &[&str] = &[
    "host",
    "user",
    "hostname",
    "port",
    "addressfamily",
    "batchmode",
    "canonicalizefallbacklocal",
    "canonicalizehostname",
    "checkhostip",
    "compression",
    "controlmaster",
    "enablesshkeysign",
    "clearallforwardings",
    "exitonforwardfailure",
    "fingerprinthash",
    "forwardx11",
    "forwardx11trusted",
    "gatewayports",
    "gssapiauthentication",
    "gssapikeyexchange",
    "gssapidelegatecredentials",
    "gssapitrustdns",
    "gssapirenewalforcesrekey",
    "hashknownhosts",
    "hostbasedauthentication",
    "identitiesonly",
    "kbdinteractiveauthentication",
    "nohostauthenticationforlocalhost",
    "passwordauthentication",
    "permitlocalcommand",
    "proxyusefdpass",
    "pubkeyauthentication",
    "requesttty",
    "sessiontype",
    "stdinnull",
    "forkafterauthentication",
    "streamlocalbindunlink",
    "stricthostkeychecking",
    "tcpkeepalive",
    "tunnel",
    "verifyhostkeydns",
    "visualhostkey",
    "updatehostkeys",
    "enableescapecommandline",
    "canonicalizemaxdots",
    "connectionattempts",
    "numberofpasswordprompts",
    "serveralivecountmax",
    "serveraliveinterval",
    "requiredrsasize",
    "bindaddress",
    "bindinterface",
    "ciphers",
    "hostkeyalgorithms",
    "hostkeyalias",
    "identityagent",
    "kexalgorithms",
    "casignaturealgorithms",
    "localcommand",
    "remotecommand",
    "loglevel",
    "macs",
    "preferredauthentications",
    "pubkeyacceptedalgorithms",
    "revokedhostkeys",
    "knownhostscommand",
    "dynamicforward",
    "localforward",
    "remoteforward",
    "identityfile",
    "canonicaldomains",
    "certificatefile",
    "globalknownhostsfile",
    "userknownhostsfile",
    "sendenv",
    "setenv",
    "logverbose",
    "permitremoteopen",
    "addkeystoagent",
    "forwardagent",
    "connecttimeout",
    "canonicalizepermittedcnames",
    "controlpersist",
    "escapechar",
    "ipqos",
    "rekeylimit",
    "streamlocalbindmask",
    "proxycommand",
    "proxyjump",
];

/// Keywords skiff does not implement, printed as what skiff does: keyword,
/// value, and why that is what skiff does.
const NOT_IMPLEMENTED: &[(&str, &str, &str)] = &[
    (
        "checkhostip",
        "no",
        "the address is not looked up in known_hosts",
    ),
    (
        "controlmaster",
        "false",
        "skiff's agent shares connections instead",
    ),
    ("enablesshkeysign", "no", "no host-based authentication"),
    (
        "fingerprinthash",
        "SHA256",
        "fingerprints are always SHA-256",
    ),
    ("forwardx11", "no", "X11 channels are refused"),
    (
        "forwardx11trusted",
        "no",
        "no X11 forwarding: nothing from the server gets the display",
    ),
    ("gssapiauthentication", "no", "no GSSAPI"),
    ("gssapikeyexchange", "no", "no GSSAPI"),
    ("gssapidelegatecredentials", "no", "no GSSAPI"),
    ("gssapitrustdns", "no", "no GSSAPI"),
    ("gssapirenewalforcesrekey", "no", "no GSSAPI"),
    (
        "hostbasedauthentication",
        "no",
        "skiff signs in with keys only",
    ),
    (
        "nohostauthenticationforlocalhost",
        "no",
        "localhost's key is checked like any other",
    ),
    (
        "proxyusefdpass",
        "no",
        "a ProxyCommand's own input and output carry the connection",
    ),
    (
        "tcpkeepalive",
        "no",
        "no SO_KEEPALIVE; ServerAliveInterval notices a dead peer",
    ),
    ("tunnel", "false", "no tunnel devices"),
    ("verifyhostkeydns", "false", "no SSHFP lookups"),
    ("visualhostkey", "no", "no key art"),
    (
        "enableescapecommandline",
        "no",
        "there is no `~C` command line",
    ),
    ("connectionattempts", "1", "each address is tried once"),
    ("logverbose", "none", "no LogVerbose"),
    (
        "permitremoteopen",
        "any",
        "a `-R port` SOCKS forwarding connects wherever its clients ask",
    ),
    (
        "canonicalizepermittedcnames",
        "none",
        "CNAMEs are not followed",
    ),
    (
        "ipqos",
        "none none",
        "the system's type of service is left alone",
    ),
];

/// The lines being printed, as keyword and value.
#[derive(Default)]
struct Lines(Vec<(&'static str, String)>);

impl Lines {
    fn put(&mut self, keyword: &'static str, value: impl Display) {
        self.0.push((keyword, value.to_string()));
    }

    fn put_all<T: Display>(&mut self, keyword: &'static str, values: impl IntoIterator<Item = T>) {
        for v in values {
            self.put(keyword, v);
        }
    }

    fn put_some(&mut self, keyword: &'static str, value: Option<impl Display>) {
        if let Some(v) = value {
            self.put(keyword, v);
        }
    }

    /// The lines in ssh's order (those of one keyword in theirs).
    fn text(mut self) -> String {
        let rank = |k: &str| ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len());
        self.0.sort_by_key(|(k, _)| rank(k));
        self.0.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Paths on one line, space-separated; `none` for none.
fn path_list(paths: &[impl AsRef<Path>]) -> String {
    if paths.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = paths
        .iter()
        .map(|p| p.as_ref().display().to_string())
        .collect();
    shown.join(" ")
}

/// The settings `s` (from configuration `cfg`) with what the command line
/// `line` adds (`-i`, `-L`/`-R`/`-D`, `-n`, `-t`/`-T`, `-N`, `-s`, `-f`,
/// `-W`, `-v`), as `ssh -G` prints them.
pub fn describe(s: &ConnectSettings, cfg: &HostConfig, line: &SshCommandLine) -> String {
    let stdio = line.forward_stdio.is_some();
    let mut out = Lines::default();
    for (keyword, value, _why) in NOT_IMPLEMENTED {
        out.put(keyword, value);
    }
    out.put("host", &s.original_host);
    out.put("user", &s.user);
    out.put("hostname", &s.hostname);
    out.put("port", s.port);
    out.put(
        "addressfamily",
        match s.address_family {
            AddressFamily::Any => "any",
            AddressFamily::Inet => "inet",
            AddressFamily::Inet6 => "inet6",
        },
    );
    out.put("batchmode", yes_no(s.batch_mode));
    out.put("compression", yes_no(s.compression));
    out.put(
        "canonicalizefallbacklocal",
        yes_no(cfg.canonicalize_fallback_local.unwrap_or(true)),
    );
    out.put(
        "canonicalizehostname",
        match cfg.canonicalize_hostname.unwrap_or(Canonicalize::No) {
            Canonicalize::No => "false",
            Canonicalize::Yes => "true",
            Canonicalize::Always => "always",
        },
    );
    out.put(
        "clearallforwardings",
        yes_no(s.clear_all_forwardings || stdio),
    );
    out.put(
        "exitonforwardfailure",
        yes_no(s.exit_on_forward_failure || stdio),
    );
    out.put("gatewayports", yes_no(s.gateway_ports));
    out.put("hashknownhosts", yes_no(s.hash_known_hosts));
    out.put("updatehostkeys", s.update_host_keys.as_str());
    out.put("identitiesonly", yes_no(s.identities_only));
    out.put(
        "pubkeyauthentication",
        if s.pubkey_authentication {
            "true"
        } else {
            "false"
        },
    );
    out.put(
        "kbdinteractiveauthentication",
        yes_no(s.kbd_interactive_authentication),
    );
    out.put("passwordauthentication", yes_no(s.password_authentication));
    out.put("numberofpasswordprompts", s.number_of_password_prompts);
    // As ssh: only when set, as written.
    out.put_some(
        "preferredauthentications",
        cfg.preferred_authentications.as_ref().map(|m| m.join(",")),
    );
    out.put("requesttty", request_tty(s.request_tty, line.tty, stdio));
    out.put("sessiontype", session_type(s.session_type, line, stdio));
    out.put(
        "stdinnull",
        yes_no(s.stdin_null || line.no_stdin || line.background || stdio),
    );
    out.put("forkafterauthentication", yes_no(line.background));
    out.put("streamlocalbindunlink", yes_no(s.stream_local_bind_unlink));
    out.put(
        "stricthostkeychecking",
        match s.strict_host_key_checking {
            StrictHostKeyChecking::Yes => "true",
            StrictHostKeyChecking::No => "false",
            StrictHostKeyChecking::AcceptNew => "accept-new",
            StrictHostKeyChecking::Ask => "ask",
        },
    );
    out.put(
        "canonicalizemaxdots",
        cfg.canonicalize_max_dots.unwrap_or(1),
    );
    out.put("serveralivecountmax", s.server_alive_count_max);
    out.put(
        "serveraliveinterval",
        s.server_alive_interval.map_or(0, |d| d.as_secs()),
    );
    out.put("requiredrsasize", s.required_rsa_size);
    out.put_some("bindaddress", s.bind_address);
    out.put_some("bindinterface", s.bind_interface.as_ref());
    let a = &s.algorithms;
    out.put("ciphers", a.ciphers.join(","));
    out.put("hostkeyalgorithms", a.host_key.join(","));
    out.put_some("hostkeyalias", s.host_key_alias.as_ref());
    out.put_some("identityagent", identity_agent(s, cfg));
    out.put("kexalgorithms", a.kex.join(","));
    out.put("casignaturealgorithms", a.ca_signature.join(","));
    out.put(
        "permitlocalcommand",
        yes_no(cfg.permit_local_command.unwrap_or(false)),
    );
    // As written, as ssh prints it.
    out.put_some("localcommand", cfg.local_command.as_ref());
    out.put_some("remotecommand", s.remote_command.as_ref());
    out.put("loglevel", log_level(cfg, line.verbose));
    out.put("macs", a.macs.join(","));
    // Not implemented as a keyword: what skiff signs in with.
    out.put(
        "pubkeyacceptedalgorithms",
        skiff_proto::algorithms::query::CLIENT_PUBKEY.join(","),
    );
    out.put_some(
        "revokedhostkeys",
        cfg.revoked_host_keys
            .as_ref()
            .filter(|files| *files != &["none"])
            .map(|files| files.join(" ")),
    );
    out.put_some(
        "knownhostscommand",
        cfg.known_hosts_command.clone().flatten(),
    );
    put_forwards(&mut out, s, line, stdio);
    out.put_all("identityfile", identity_files(s, cfg, line));
    out.put(
        "canonicaldomains",
        match cfg.canonical_domains.as_deref() {
            None | Some([]) => "none".to_string(),
            Some(domains) => domains.join(" "),
        },
    );
    out.put_all("certificatefile", &cfg.certificate_files);
    out.put(
        "globalknownhostsfile",
        match &cfg.global_known_hosts_files {
            Some(files) => path_list(files),
            None => path_list(&s.global_known_hosts),
        },
    );
    out.put("userknownhostsfile", path_list(&s.user_known_hosts));
    out.put_all("sendenv", &s.send_env);
    out.put_all("setenv", s.set_env.iter().map(|(k, v)| format!("{k}={v}")));
    out.put("addkeystoagent", add_keys_to_agent(s.add_keys_to_agent));
    out.put("forwardagent", forward_agent(s, cfg));
    out.put("connecttimeout", s.connect_timeout.as_secs());
    out.put("controlpersist", control_persist(cfg.control_persist));
    out.put("escapechar", escape_char(s.escape_char));
    // Not implemented as a keyword: russh's limits, new keys after 1 GiB
    // either way or an hour.
    let limits = russh::Limits::default();
    out.put(
        "rekeylimit",
        format!(
            "{} {}",
            limits.rekey_write_limit.max(limits.rekey_read_limit),
            limits.rekey_time_limit.as_secs()
        ),
    );
    out.put(
        "streamlocalbindmask",
        format!("0{:o}", s.stream_local_bind_mask),
    );
    match &cfg.proxy {
        Some(ProxySpec::Command(command)) => out.put("proxycommand", command),
        Some(ProxySpec::Jump(hops)) => out.put("proxyjump", hops),
        Some(ProxySpec::None) | None => {}
    }
    out.text()
}

fn request_tty(configured: RequestTty, flag: TtyFlag, stdio: bool) -> &'static str {
    let effective = match flag {
        _ if stdio => RequestTty::No,
        TtyFlag::Disable => RequestTty::No,
        TtyFlag::Request(1) => RequestTty::Yes,
        TtyFlag::Request(_) => RequestTty::Force,
        TtyFlag::Unset => configured,
    };
    match effective {
        RequestTty::No => "false",
        RequestTty::Yes => "true",
        RequestTty::Force => "force",
        RequestTty::Auto => "auto",
    }
}

fn session_type(configured: SessionType, line: &SshCommandLine, stdio: bool) -> &'static str {
    let effective = if line.no_command || stdio {
        SessionType::None
    } else if line.subsystem {
        SessionType::Subsystem
    } else {
        configured
    };
    match effective {
        SessionType::Default => "default",
        SessionType::Subsystem => "subsystem",
        SessionType::None => "none",
    }
}

/// `IdentityAgent` when configured: `none`, `SSH_AUTH_SOCK` and `$VAR` as
/// written, a path expanded.
fn identity_agent(s: &ConnectSettings, cfg: &HostConfig) -> Option<String> {
    let v = cfg.identity_agent.as_deref()?;
    if v == "none" || v == "SSH_AUTH_SOCK" || v.starts_with('$') {
        return Some(v.to_string());
    }
    Some(path_list(s.identity_agent.as_slice()))
}

/// `ForwardAgent`: `yes`, `no`, `$VAR` as written, a path expanded.
fn forward_agent(s: &ConnectSettings, cfg: &HostConfig) -> String {
    match cfg.forward_agent.as_deref() {
        None => "no".into(),
        Some(v) if v == "yes" || v == "no" || v.starts_with('$') => v.into(),
        Some(_) => path_list(s.forward_agent.as_slice()),
    }
}

/// ssh's names: `SILENT` for QUIET, `DEBUG` for DEBUG1; `-v` wins over
/// the configuration.
fn log_level(cfg: &HostConfig, verbose: u8) -> &str {
    match verbose {
        0 => match cfg.log_level.as_deref() {
            None => "INFO",
            Some("QUIET") => "SILENT",
            Some("DEBUG1") => "DEBUG",
            Some(level) => level,
        },
        1 => "DEBUG",
        2 => "DEBUG2",
        _ => "DEBUG3",
    }
}

fn add_keys_to_agent(a: AddKeysToAgent) -> String {
    match a {
        // `ask` is not supported: the key is not added.
        AddKeysToAgent::No | AddKeysToAgent::Ask => "false".into(),
        AddKeysToAgent::Yes {
            confirm: false,
            lifetime: None,
        } => "true".into(),
        AddKeysToAgent::Yes {
            confirm: true,
            lifetime: None,
        } => "confirm".into(),
        AddKeysToAgent::Yes {
            confirm,
            lifetime: Some(secs),
        } => format!("{}{secs}", if confirm { "confirm " } else { "" }),
    }
}

/// How long the agent keeps an idle connection: the host's
/// `ControlPersist`, else the agent's own 10 minutes.
fn control_persist(configured: Option<ControlPersist>) -> String {
    match configured {
        Some(ControlPersist::No) => "no".into(),
        Some(ControlPersist::Yes) => "yes".into(),
        Some(ControlPersist::Duration(secs)) => secs.to_string(),
        None => skiff_agent::daemon::DEFAULT_PERSIST.as_secs().to_string(),
    }
}

/// As ssh writes it: a control character as `\^X`.
fn escape_char(e: EscapeChar) -> String {
    match e {
        EscapeChar::Byte(b) if b < 0x20 || b == 0x7f => format!("\\^{}", (b ^ 0x40) as char),
        other => skiff_proto::escape::show_escape_char(other),
    }
}

/// `-i` files as given, then the configuration's as written; with
/// neither, the defaults, under `~`.
fn identity_files(s: &ConnectSettings, cfg: &HostConfig, line: &SshCommandLine) -> Vec<String> {
    let given: Vec<String> = line
        .identity
        .iter()
        .map(|p| p.display().to_string())
        .chain(cfg.identity_files.iter().cloned())
        .collect();
    if !given.is_empty() {
        return given;
    }
    s.identity_files
        .iter()
        .filter_map(|p| p.file_name())
        .map(|name| format!("~/.ssh/{}", name.to_string_lossy()))
        .collect()
}

/// The forwardings, the command line's first, as ssh groups them:
/// dynamic, local, remote. None when they are all cleared.
fn put_forwards(out: &mut Lines, s: &ConnectSettings, line: &SshCommandLine, stdio: bool) {
    if s.clear_all_forwardings || stdio {
        return;
    }
    let mut all: Vec<&ForwardSpec> = Vec::new();
    for f in line.forwards.iter().chain(&s.forwards) {
        if !all.contains(&f) {
            all.push(f);
        }
    }
    let listen = |l: &Listen| match &l.bind {
        None => l.port.to_string(),
        Some(bind) => format!("[{bind}]:{}", l.port),
    };
    let listen_end = |l: &ListenEnd| match l {
        ListenEnd::Tcp(l) => listen(l),
        ListenEnd::Unix(path) => path.clone(),
    };
    let connect_end = |c: &ConnectEnd| match c {
        ConnectEnd::Tcp(host, port) => format!("[{host}]:{port}"),
        ConnectEnd::Unix(path) => path.clone(),
    };
    let mut dynamic = Vec::new();
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for f in all {
        match f {
            ForwardSpec::Dynamic { listen: l } => dynamic.push(listen(l)),
            ForwardSpec::Local {
                listen: l,
                host,
                port,
            } => local.push(format!("{} [{host}]:{port}", listen(l))),
            ForwardSpec::LocalUnix { from, to } => {
                local.push(format!("{} {}", listen_end(from), connect_end(to)))
            }
            ForwardSpec::Remote {
                listen: l,
                host,
                port,
            } => remote.push(format!("{} [{host}]:{port}", listen(l))),
            ForwardSpec::RemoteUnix { from, to } => {
                remote.push(format!("{} {}", listen_end(from), connect_end(to)))
            }
            // ssh writes a SOCKS forwarding's missing destination so.
            ForwardSpec::RemoteDynamic { listen: l } => {
                remote.push(format!("{} [socks]:0", listen(l)))
            }
        }
    }
    out.put_all("dynamicforward", dynamic);
    out.put_all("localforward", local);
    out.put_all("remoteforward", remote);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(config: &str, args: &[&str]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, config).unwrap();
        let mut words: Vec<String> = vec!["-F".into(), file.display().to_string()];
        words.extend(args.iter().map(|a| a.to_string()));
        let line = crate::ssh_args::parse(&words).unwrap();
        let dest = crate::remote_command::destination(&super::super::invocation(line.clone()));
        let (s, cfg) = skiff_engine::settings::resolve_with_config(&dest).unwrap();
        describe(&s, &cfg, &line)
    }

    fn value<'a>(text: &'a str, keyword: &str) -> Vec<&'a str> {
        text.lines()
            .filter_map(|l| l.strip_prefix(keyword)?.strip_prefix(' '))
            .collect()
    }

    #[test]
    fn keywords_as_ssh_writes_them() {
        let text = shown(
            "Host web\n  HostName 10.0.0.5\n  User deploy\n  Port 2200\n  \
             IdentityFile ~/keys/%r@%h\n  ProxyJump jump1,ops@jump2:2201\n  \
             StrictHostKeyChecking yes\n  EscapeChar ^X\n  AddKeysToAgent confirm 1h\n  \
             ControlPersist 10m\n  LogLevel quiet\n  SetEnv A=1\n",
            &["web"],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            &lines[..4],
            ["host web", "user deploy", "hostname 10.0.0.5", "port 2200"]
        );
        for (keyword, expected) in [
            ("identityfile", "~/keys/%r@%h"),
            ("proxyjump", "jump1,ops@jump2:2201"),
            ("stricthostkeychecking", "true"),
            ("escapechar", "\\^X"),
            ("addkeystoagent", "confirm 3600"),
            ("controlpersist", "600"),
            ("loglevel", "SILENT"),
            ("setenv", "A=1"),
            ("passwordauthentication", "yes"),
            ("kbdinteractiveauthentication", "yes"),
            ("numberofpasswordprompts", "3"),
            ("controlmaster", "false"),
            ("pubkeyauthentication", "true"),
            ("canonicaldomains", "none"),
        ] {
            assert_eq!(value(&text, keyword), [expected], "{keyword}\n{text}");
        }
        // Every line is a lower-case keyword of ssh's and a value.
        assert!(NOT_IMPLEMENTED.iter().all(|(k, _, _)| ORDER.contains(k)));
        for l in text.lines() {
            let (k, v) = l.split_once(' ').unwrap();
            assert!(ORDER.contains(&k), "{l}");
            assert!(
                k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{l}"
            );
            assert!(!v.is_empty(), "{l}");
        }
    }

    #[test]
    fn the_command_line_counts() {
        let text = shown(
            "Host b\n  LocalForward 8080 localhost:80\n  IdentityFile /k\n",
            &[
                "-i",
                "rel-key",
                "-f",
                "-N",
                "-tt",
                "-vv",
                "-L",
                "127.0.0.1:1:[::1]:2",
                "-R",
                "9091",
                "-D",
                "1080",
                "-J",
                "j",
                "b",
            ],
        );
        for (keyword, expected) in [
            ("identityfile", &["rel-key", "/k"][..]),
            ("forkafterauthentication", &["yes"]),
            ("stdinnull", &["yes"]),
            ("sessiontype", &["none"]),
            ("requesttty", &["force"]),
            ("loglevel", &["DEBUG2"]),
            (
                "localforward",
                &["[127.0.0.1]:1 [::1]:2", "8080 [localhost]:80"],
            ),
            ("remoteforward", &["9091 [socks]:0"]),
            ("dynamicforward", &["1080"]),
            ("proxyjump", &["j"]),
        ] {
            assert_eq!(value(&text, keyword), expected, "{keyword}\n{text}");
        }
        // -W clears the forwardings and asks for no terminal.
        let text = shown("Host b\n  LocalForward 1 h:2\n", &["-W", "h:3", "b"]);
        assert!(value(&text, "localforward").is_empty(), "{text}");
        for (keyword, expected) in [
            ("clearallforwardings", "yes"),
            ("exitonforwardfailure", "yes"),
            ("requesttty", "false"),
            ("sessiontype", "none"),
        ] {
            assert_eq!(value(&text, keyword), [expected], "{keyword}\n{text}");
        }
    }

    #[test]
    fn defaults_are_skiffs() {
        let text = shown("", &["plain"]);
        let home = skiff_engine::settings::home_dir();
        for (keyword, expected) in [
            ("stricthostkeychecking", "accept-new".to_string()),
            ("connecttimeout", "30".into()),
            ("serveraliveinterval", "15".into()),
            ("forwardagent", "no".into()),
            (
                "globalknownhostsfile",
                "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2".into(),
            ),
            (
                "userknownhostsfile",
                format!(
                    "{} {}",
                    home.join(".ssh/known_hosts").display(),
                    home.join(".ssh/known_hosts2").display()
                ),
            ),
            ("rekeylimit", "1073741824 3600".into()),
        ] {
            assert_eq!(
                value(&text, keyword),
                [expected.as_str()],
                "{keyword}\n{text}"
            );
        }
        assert_eq!(value(&text, "identityfile")[0], "~/.ssh/id_rsa");
        assert!(value(&text, "proxyjump").is_empty());
        assert!(value(&text, "identityagent").is_empty());
    }
}
