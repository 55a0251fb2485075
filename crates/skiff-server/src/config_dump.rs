//! `skiffd -T` and `-G`: the effective configuration printed the way
//! `sshd -T` prints it, one `keyword value` a line, keywords in lower case,
//! in sshd's order, values in sshd's spelling (`yes`/`no`, times in
//! seconds, algorithm lists joined by commas, one line for each value of a
//! repeatable keyword). Every value comes from the [`Settings`] the server
//! would run with; nothing here decides a setting. Also the `-C` connection
//! specification (`user=U,host=H,addr=A,laddr=L,lport=P,rdomain=R`), whose
//! details decide which `Match` blocks apply. Pure: no I/O.
//!
//! Keywords of features skiffd never offers (password, keyboard-interactive,
//! host-based, GSSAPI and Kerberos authentication, X11, tunnels,
//! `~/.ssh/rc`, PAM) are printed as what skiffd does, off, whatever the file
//! says. Other keywords skiffd accepts without acting on (`UseDNS`,
//! `TCPKeepAlive`, ...) are left out, as are sshd's that skiffd has no setting for.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use crate::access::RootLogin;
use crate::auth_methods::AuthMethods;
use crate::config::{AddressFamily, Settings, UnencryptedPolicy};
use crate::forward_policy::GatewayPorts;
use crate::match_block::PartialContext;

/// What `-C` gave (several `-C` add up; a later value of a key wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionSpec {
    pub user: Option<String>,
    /// Accepted for sshd's sake; skiffd matches `Host` against the address.
    pub host: Option<String>,
    pub addr: Option<IpAddr>,
    pub laddr: Option<IpAddr>,
    pub lport: Option<u16>,
    /// Accepted for sshd's sake; skiffd has no routing domains.
    pub rdomain: Option<String>,
}

impl ConnectionSpec {
    /// Adds one `-C` argument: `key=value` pairs separated by commas.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        for pair in spec.split(',') {
            let bad = || format!("-C {spec:?}: invalid connection specification {pair:?}");
            let (key, value) = pair.split_once('=').ok_or_else(bad)?;
            if value.is_empty() {
                return Err(bad());
            }
            let address = |what: &str| {
                value.parse::<IpAddr>().map_err(|_| {
                    format!("-C {spec:?}: {what} must be an IP address, not {value:?}")
                })
            };
            match key {
                "user" => self.user = Some(value.to_string()),
                "host" => self.host = Some(value.to_string()),
                "addr" => self.addr = Some(address("addr")?),
                "laddr" => self.laddr = Some(address("laddr")?),
                "lport" => {
                    self.lport = Some(value.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                        format!("-C {spec:?}: lport must be a port from 1 to 65535, not {value:?}")
                    })?)
                }
                "rdomain" => self.rdomain = Some(value.to_string()),
                _ => {
                    return Err(format!(
                        "-C {spec:?}: unknown key {key:?} (expected user, host, addr, laddr, lport or rdomain)"
                    ))
                }
            }
        }
        Ok(())
    }

    /// The details `Match` criteria are decided on; `groups` are the
    /// user's (looked up by the caller).
    pub fn context(&self, groups: Vec<String>) -> PartialContext {
        PartialContext {
            user: self.user.clone(),
            groups,
            peer: self.addr,
            local: self.laddr,
            local_port: self.lport,
        }
    }
}

/// The settings `-T` prints: without `-C`, the global ones (as sshd, `Match`
/// blocks are not applied); with it, those of a login with its details.
pub fn settings_for(settings: &Settings, spec: Option<&PartialContext>) -> Settings {
    let Some(ctx) = spec else {
        return settings.clone();
    };
    settings
        .for_blocks(|block| block.matches_partial(ctx))
        .unwrap_or_else(|| settings.clone())
}

/// Keywords of features skiffd never offers, with the value that says so
/// in sshd's terms, at the place sshd prints each (after the keyword named
/// second). Each is one sshd_config keyword skiffd accepts without acting
/// on (see `crate::sshd_only`).
const NEVER_OFFERED: &[(&str, &str)] = &[
    ("ignorerhosts", "yes"),
    ("hostbasedauthentication", "no"),
    ("pubkeyauthentication", "yes"),
    ("kerberosauthentication", "no"),
    ("gssapiauthentication", "no"),
    ("x11forwarding", "no"),
    ("permituserrc", "no"),
    ("permittunnel", "no"),
];

fn never_offered(keyword: &str) -> &'static str {
    NEVER_OFFERED
        .iter()
        .find(|(k, _)| *k == keyword)
        .map(|(_, v)| *v)
        .expect("listed in NEVER_OFFERED")
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn seconds(d: Duration) -> String {
    d.as_secs().to_string()
}

/// `PerSourcePenalties` as sshd prints it: every parameter, times in
/// seconds.
fn penalties(p: &crate::penalties::PenaltyPolicy) -> String {
    use crate::penalties::Overflow;
    let overflow = |o: Overflow| match o {
        Overflow::DenyAll => "deny-all",
        Overflow::Permissive => "permissive",
    };
    format!(
        "crash:{} authfail:{} noauth:{} grace-exceeded:{} refuseconnection:{} max:{} min:{} \
         max-sources4:{} max-sources6:{} overflow:{} overflow6:{}",
        p.crash.as_secs(),
        p.authfail.as_secs(),
        p.noauth.as_secs(),
        p.grace_exceeded.as_secs(),
        p.refuse_connection.as_secs(),
        p.max.as_secs(),
        p.min.as_secs(),
        p.max_sources4,
        p.max_sources6,
        overflow(p.overflow4),
        overflow(p.overflow6),
    )
}

fn or_none<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "none".to_string(), |v| v.to_string())
}

/// A byte count as the size keywords take it (`64M`).
fn size(bytes: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn allow_forwarding(local: bool, remote: bool) -> &'static str {
    match (local, remote) {
        (true, true) => "yes",
        (true, false) => "local",
        (false, true) => "remote",
        (false, false) => "no",
    }
}

/// The configuration as `sshd -T` prints it.
pub fn render(s: &Settings) -> String {
    let mut out = String::new();
    let mut line = |keyword: &str, value: &str| {
        let _ = writeln!(out, "{keyword} {value}");
    };
    // Listening: the ports of the addresses listened on, each once.
    let mut ports: Vec<u16> = Vec::new();
    for addr in &s.listen {
        if !ports.contains(&addr.port()) {
            ports.push(addr.port());
        }
    }
    for port in ports {
        line("port", &port.to_string());
    }
    line(
        "addressfamily",
        match s.address_family {
            AddressFamily::Any => "any",
            AddressFamily::Inet => "inet",
            AddressFamily::Inet6 => "inet6",
        },
    );
    for addr in &s.listen {
        line("listenaddress", &addr.to_string());
    }
    line("usepam", yes_no(s.pam.use_pam));
    line("pamservicename", &s.pam.service);
    line("logingracetime", &seconds(s.login_grace_time));
    line("maxauthtries", &s.max_auth_tries.to_string());
    line("maxsessions", &s.max_sessions.to_string());
    line(
        "clientaliveinterval",
        &s.client_alive_interval.map_or("0".into(), seconds),
    );
    line("clientalivecountmax", &s.client_alive_count_max.to_string());
    line("requiredrsasize", &s.required_rsa_size.to_string());
    line(
        "streamlocalbindmask",
        &format!("{:04o}", s.forwarding.bind_mask),
    );
    line(
        "permitrootlogin",
        // sshd prints prohibit-password by its older name.
        match s.access.root_login {
            RootLogin::Yes => "yes",
            RootLogin::Keys => "without-password",
            RootLogin::ForcedCommandsOnly => "forced-commands-only",
            RootLogin::No => "no",
        },
    );
    for keyword in [
        "ignorerhosts",
        "hostbasedauthentication",
        "pubkeyauthentication",
        "kerberosauthentication",
        "gssapiauthentication",
    ] {
        line(keyword, never_offered(keyword));
    }
    line("passwordauthentication", yes_no(s.pam.password));
    line(
        "kbdinteractiveauthentication",
        yes_no(s.pam.keyboard_interactive),
    );
    line("printmotd", yes_no(s.print_motd));
    line("printlastlog", yes_no(s.print_last_log));
    line("x11forwarding", never_offered("x11forwarding"));
    line("permittty", yes_no(s.permit_tty));
    line("permituserrc", never_offered("permituserrc"));
    line("strictmodes", yes_no(s.strict_modes));
    line("permitemptypasswords", yes_no(s.pam.permit_empty_passwords));
    let f = &s.forwarding;
    line(
        "gatewayports",
        match f.gateway_ports {
            GatewayPorts::No => "no",
            GatewayPorts::Yes => "yes",
            GatewayPorts::ClientSpecified => "clientspecified",
        },
    );
    line("allowtcpforwarding", allow_forwarding(f.local, f.remote));
    line("allowagentforwarding", yes_no(f.agent));
    line("disableforwarding", yes_no(f.disabled));
    line(
        "allowstreamlocalforwarding",
        allow_forwarding(f.stream_local, f.stream_remote),
    );
    line("streamlocalbindunlink", yes_no(f.bind_unlink));
    line("exposeauthinfo", yes_no(s.expose_auth_info));
    line("ciphers", &s.ciphers.join(","));
    line("macs", &s.macs.join(","));
    line("banner", &or_none(s.banner.as_ref().map(|p| p.display())));
    line("forcecommand", &or_none(s.force_command.as_ref()));
    line("chrootdirectory", &or_none(s.chroot_directory.as_ref()));
    line(
        "trustedusercakeys",
        &or_none(s.trusted_user_ca_keys.as_ref().map(|p| p.display())),
    );
    let revoked: Vec<String> = s
        .revoked_keys
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    line(
        "revokedkeys",
        &or_none((!revoked.is_empty()).then(|| revoked.join(" "))),
    );
    line(
        "authorizedprincipalsfile",
        &or_none(s.authorized_principals_file.as_ref()),
    );
    line(
        "authorizedkeyscommand",
        &or_none(s.authorized_keys_command.as_ref().map(|a| a.join(" "))),
    );
    line(
        "authorizedkeyscommanduser",
        &or_none(s.authorized_keys_command_user.as_ref()),
    );
    line(
        "authorizedprincipalscommand",
        &or_none(
            s.authorized_principals_command
                .as_ref()
                .map(|a| a.join(" ")),
        ),
    );
    line(
        "authorizedprincipalscommanduser",
        &or_none(s.authorized_principals_command_user.as_ref()),
    );
    line("kexalgorithms", &s.kex_algorithms.join(","));
    line(
        "casignaturealgorithms",
        &s.ca_signature_algorithms.join(","),
    );
    line("hostkeyalgorithms", &s.host_key_algorithms.join(","));
    line("pubkeyacceptedalgorithms", &s.pubkey_algorithms.join(","));
    line("pubkeyauthoptions", &s.pubkey_auth_options.dump());
    line(
        "loglevel",
        s.log_level.unwrap_or(crate::config::LogLevel::Info).name(),
    );
    line("syslogfacility", &s.syslog_facility.name());
    line("authorizedkeysfile", &s.authorized_keys);
    for key in &s.host_keys {
        line("hostkey", &key.display().to_string());
    }
    for cert in &s.host_certificates {
        line("hostcertificate", &cert.display().to_string());
    }
    let a = &s.access;
    for (keyword, patterns) in [
        ("allowusers", &a.allow_users),
        ("denyusers", &a.deny_users),
        ("allowgroups", &a.allow_groups),
        ("denygroups", &a.deny_groups),
        ("acceptenv", &s.accept_env),
    ] {
        for pattern in patterns {
            line(keyword, pattern);
        }
    }
    for (name, value) in &s.set_env {
        line("setenv", &format!("{name}={value}"));
    }
    let subsystems = [
        ("sftp", s.sftp_command.as_deref()),
        (
            skiff_proto::dataplane::SUBSYSTEM,
            s.transfer_command.as_deref(),
        ),
    ]
    .into_iter()
    .chain(s.subsystems.iter().map(|(n, c)| (n.as_str(), c.as_deref())));
    for (name, command) in subsystems {
        if let Some(command) = command {
            line("subsystem", &format!("{name} {command}"));
        }
    }
    // sshd always prints start:rate:full; start = full is no early drop.
    let (start, rate) = s.early_drop.unwrap_or((s.max_startups, 30));
    line("maxstartups", &format!("{start}:{rate}:{}", s.max_startups));
    line("persourcemaxstartups", &or_none(s.per_source_max_startups));
    let block = s.per_source_net_block;
    line(
        "persourcenetblocksize",
        &format!("{}:{}", block.v4_bits, block.v6_bits),
    );
    line(
        "persourcepenalties",
        &match &s.per_source_penalties {
            None => "no".to_string(),
            Some(p) => penalties(p),
        },
    );
    line(
        "persourcepenaltyexemptlist",
        &match s.per_source_penalty_exempt.as_slice() {
            [] => "none".to_string(),
            list => list.join(","),
        },
    );
    line(
        "authenticationmethods",
        &match &s.authentication_methods {
            AuthMethods::Any => "any".to_string(),
            AuthMethods::Lists(lists) => lists
                .iter()
                .map(|l| l.iter().map(|m| m.name()).collect::<Vec<_>>().join(","))
                .collect::<Vec<_>>()
                .join(" "),
        },
    );
    line(
        "unusedconnectiontimeout",
        &s.unused_connection_timeout
            .map_or("none".to_string(), |t| t.as_secs().to_string()),
    );
    // As sshd 9.2: printed only when set.
    if !s.channel_timeouts.is_none() {
        line("channeltimeout", &s.channel_timeouts.words().join(" "));
    }
    line(
        "rekeylimit",
        &format!(
            "{} {}",
            s.rekey_limit.data,
            s.rekey_limit.time.map_or(0, |t| t.as_secs())
        ),
    );
    line("permittunnel", never_offered("permittunnel"));
    line("permitopen", &f.permit_open.to_string());
    line("permitlisten", &f.permit_listen.to_string());
    line("permituserenvironment", yes_no(s.permit_user_environment));
    // skiffd's own keywords.
    line("dataplane", yes_no(s.data_plane));
    line(
        "dataplaneunencrypted",
        match s.unencrypted_data_plane {
            UnencryptedPolicy::Loopback => "loopback",
            UnencryptedPolicy::Any => "yes",
            UnencryptedPolicy::Never => "no",
        },
    );
    line("maxchannelwindow", &size(u64::from(s.max_channel_window)));
    line("maxconnectionqueue", &size(s.queue_limits.per_connection));
    line("maxserverqueue", &size(s.queue_limits.total));
    line(
        "auditlog",
        &or_none(s.audit_log.as_ref().map(|p| p.display())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::apply_config_text;

    /// The printed value(s) of `keyword`.
    fn values(dump: &str, keyword: &str) -> Vec<String> {
        dump.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| *k == keyword)
            .map(|(_, v)| v.to_string())
            .collect()
    }

    fn dump(text: &str) -> String {
        let mut s = Settings::default();
        apply_config_text(&mut s, "f", text).unwrap();
        render(&s)
    }

    #[test]
    fn defaults_in_sshd_spelling() {
        let d = dump("");
        for (keyword, value) in [
            ("addressfamily", "any"),
            ("logingracetime", "120"),
            ("clientaliveinterval", "60"),
            ("streamlocalbindmask", "0177"),
            ("permitrootlogin", "without-password"),
            ("pubkeyauthentication", "yes"),
            ("gatewayports", "no"),
            ("allowtcpforwarding", "yes"),
            ("banner", "none"),
            ("revokedkeys", "none"),
            ("maxstartups", "100:30:100"),
            ("persourcemaxstartups", "none"),
            ("persourcenetblocksize", "32:128"),
            ("permitopen", "any"),
            ("maxchannelwindow", "64M"),
            ("dataplaneunencrypted", "loopback"),
            ("printmotd", "yes"),
            ("printlastlog", "yes"),
        ] {
            assert_eq!(values(&d, keyword), [value], "{keyword}\n{d}");
        }
        assert_eq!(values(&d, "acceptenv"), ["LANG", "LC_*"]);
        assert!(values(&d, "port").is_empty(), "no listener yet");
        assert!(d.lines().all(|l| {
            let (k, v) = l.split_once(' ').expect("keyword value");
            k == k.to_ascii_lowercase() && !v.is_empty()
        }));
    }

    #[test]
    fn configured_values_in_sshd_spelling() {
        let d = dump(
            "Port 2022\nPort 2023\nListenAddress 127.0.0.1\nAddressFamily inet\n\
             LoginGraceTime 1m30s\nClientAliveInterval 0\nMaxStartups 10:30:60\n\
             PermitRootLogin forced-commands-only\nAllowTcpForwarding local\n\
             AllowStreamLocalForwarding remote\nGatewayPorts clientspecified\n\
             PermitOpen db:5432 [::1]:*\nPermitListen 5000\nStreamLocalBindMask 0117\n\
             Ciphers aes128-gcm@openssh.com,aes256-ctr\nAllowUsers alice bob@10.0.0.0/8\n\
             SetEnv A=1 \"B=two words\"\nAuthorizedKeysCommand /usr/bin/keys %u %f\n\
             Subsystem netconf /usr/bin/netconf\nSubsystem off none\nRevokedKeys /a /b\n\
             PerSourceNetBlockSize 24:64\nMaxChannelWindow 3000000\n\
             PrintMotd no\nPrintLastLog no\n",
        );
        for (keyword, expected) in [
            ("port", &["2022", "2023"][..]),
            ("listenaddress", &["127.0.0.1:2022", "127.0.0.1:2023"]),
            ("addressfamily", &["inet"]),
            ("logingracetime", &["90"]),
            ("clientaliveinterval", &["0"]),
            ("maxstartups", &["10:30:60"]),
            ("permitrootlogin", &["forced-commands-only"]),
            ("allowtcpforwarding", &["local"]),
            ("allowstreamlocalforwarding", &["remote"]),
            ("gatewayports", &["clientspecified"]),
            ("permitopen", &["db:5432 [::1]:*"]),
            ("permitlisten", &["*:5000"]),
            ("streamlocalbindmask", &["0117"]),
            ("ciphers", &["aes128-gcm@openssh.com,aes256-ctr"]),
            ("allowusers", &["alice", "bob@10.0.0.0/8"]),
            ("setenv", &["A=1", "B=two words"]),
            ("authorizedkeyscommand", &["/usr/bin/keys %u %f"]),
            ("subsystem", &["netconf /usr/bin/netconf"]),
            ("revokedkeys", &["/a /b"]),
            ("persourcenetblocksize", &["24:64"]),
            ("maxchannelwindow", &["3000000"]),
            ("printmotd", &["no"]),
            ("printlastlog", &["no"]),
        ] {
            assert_eq!(values(&d, keyword), expected, "{keyword}\n{d}");
        }
        // IPv6 listeners in brackets.
        let d = dump("ListenAddress [::1]:2200\n");
        assert_eq!(values(&d, "listenaddress"), ["[::1]:2200"]);
        assert_eq!(values(&d, "port"), ["2200"]);
    }

    #[test]
    fn match_blocks_apply_only_with_a_connection_spec() {
        let mut s = Settings::default();
        apply_config_text(
            &mut s,
            "f",
            "MaxSessions 5\nMatch User alice\n  MaxSessions 2\n\
             Match Address 10.0.0.0/8\n  MaxSessions 3\n  PermitTTY no\n\
             Match LocalPort 22\n  AllowAgentForwarding no\n",
        )
        .unwrap();
        let printed = |spec: Option<&str>| {
            let ctx = spec.map(|spec| {
                let mut c = ConnectionSpec::default();
                c.add(spec).unwrap();
                c.context(Vec::new())
            });
            render(&settings_for(&s, ctx.as_ref()))
        };
        let d = printed(None);
        assert_eq!(values(&d, "maxsessions"), ["5"]);
        let d = printed(Some("user=alice,host=h,addr=10.1.2.3"));
        assert_eq!(values(&d, "maxsessions"), ["2"], "the first block wins");
        assert_eq!(values(&d, "permittty"), ["no"]);
        assert_eq!(values(&d, "allowagentforwarding"), ["yes"], "no lport");
        let d = printed(Some("user=bob,addr=10.1.2.3,lport=22,laddr=127.0.0.1"));
        assert_eq!(values(&d, "maxsessions"), ["3"]);
        assert_eq!(values(&d, "allowagentforwarding"), ["no"]);
        let d = printed(Some("addr=192.0.2.1"));
        assert_eq!(values(&d, "maxsessions"), ["5"]);
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        use crate::config::{apply_config_with, CommandLine};
        let file = "Port 22\nMaxSessions 9\nListenAddress 127.0.0.1\nAddressFamily inet6\n";
        let mut no_include = |_: &str| Ok(Vec::new());
        let mut s = Settings::default();
        let command_line = CommandLine {
            lines: vec!["AddressFamily inet".into(), "MaxSessions=3".into()],
            ports: vec![2200, 2201],
        };
        apply_config_with(&mut s, &command_line, Some(("f", file)), &mut no_include).unwrap();
        let d = render(&s);
        assert_eq!(values(&d, "maxsessions"), ["3"]);
        assert_eq!(values(&d, "addressfamily"), ["inet"]);
        // -p replaced the file's Port line; ListenAddress took its ports.
        assert_eq!(values(&d, "port"), ["2200", "2201"]);
        assert_eq!(
            values(&d, "listenaddress"),
            ["127.0.0.1:2200", "127.0.0.1:2201"]
        );
        for (bad, line) in [
            (vec!["MaxSessions 2", "Bogus 1"], 2),
            (vec!["Match User x"], 1),
            (vec!["Include /etc/ssh/x"], 1),
        ] {
            let command_line = CommandLine {
                lines: bad.iter().map(|l| l.to_string()).collect(),
                ports: Vec::new(),
            };
            let e = apply_config_with(
                &mut Settings::default(),
                &command_line,
                None,
                &mut no_include,
            )
            .unwrap_err();
            assert_eq!((e.file.as_str(), e.line), ("command line", line), "{e}");
        }
    }

    #[test]
    fn connection_specs_are_checked() {
        let mut c = ConnectionSpec::default();
        c.add("user=u,host=h.example,addr=::1").unwrap();
        c.add("laddr=127.0.0.1,lport=2222,rdomain=r").unwrap();
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.addr, Some("::1".parse().unwrap()));
        assert_eq!(c.lport, Some(2222));
        for bad in [
            "user",
            "user=",
            "bogus=1",
            "addr=host.example",
            "lport=0",
            "lport=x",
        ] {
            assert!(ConnectionSpec::default().add(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn what_is_printed_as_off_is_never_offered() {
        use crate::sshd_only::{verdict, Verdict};
        for (keyword, _) in NEVER_OFFERED {
            // Turning it on is accepted and noted as doing nothing (or,
            // for public keys, what skiffd does anyway).
            let on = verdict(keyword, &["yes"]);
            assert!(
                matches!(on, Some(Verdict::Noted(_)) | Some(Verdict::Fine)),
                "{keyword}: {on:?}"
            );
        }
        assert_eq!(
            verdict("pubkeyauthentication", &["yes"]),
            Some(Verdict::Fine)
        );
    }

    #[test]
    fn sizes_read_back() {
        assert_eq!(size(64 << 20), "64M");
        assert_eq!(size(2 << 30), "2G");
        assert_eq!(size(1536), "1536");
        assert_eq!(size(3 << 10), "3K");
    }
}
