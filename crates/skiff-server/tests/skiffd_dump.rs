//! skiffd's command line as scripts written for sshd use it (issue 22,
//! server item 5): `skiffd -T` prints what `/usr/sbin/sshd -T` prints for
//! the same configuration and `-C` connection (compared keyword by
//! keyword for the keywords both print, except where skiffd deliberately
//! differs, listed below with the reason), and sshd's `-D -e -p -o -E -h`
//! start a skiffd that stock `ssh` logs in to.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use skiff_testkit::*;

/// A dump's values by keyword, in the order printed.
type Dump = BTreeMap<String, Vec<String>>;

fn parse(out: &CmdOutput, what: &str) -> Dump {
    out.expect_code(0, what);
    let mut dump = Dump::new();
    for line in out.stdout_str().lines() {
        let (keyword, value) = line.split_once(' ').unwrap_or((line, ""));
        dump.entry(keyword.to_string())
            .or_default()
            .push(value.to_string());
    }
    dump
}

/// `PROGRAM -T -f CONFIG -h KEY [-C SPEC]`, bounded.
fn dump(program: &str, config: &Path, host_key: &Key, spec: Option<&str>) -> Dump {
    dump_with(program, config, host_key, spec, &[])
}

/// [`dump`] with more options.
fn dump_with(
    program: &str,
    config: &Path,
    host_key: &Key,
    spec: Option<&str>,
    more: &[&str],
) -> Dump {
    privsep_dir();
    let mut run = Run::new(program)
        .args(more)
        .arg("-T")
        .arg("-f")
        .arg(config)
        .arg("-h")
        .arg(&host_key.private)
        .timeout(Duration::from_secs(30));
    if let Some(spec) = spec {
        run = run.args(["-C", spec]);
    }
    let out = run.run();
    parse(
        &out,
        &format!("{program} -T -f {} -C {spec:?}", config.display()),
    )
}

/// Where skiffd deliberately prints something else than sshd, and why.
const DIFFERENT_DEFAULTS: &[(&str, &str)] = &[
    ("port", "skiffd listens on 127.0.0.1:2222 unless told otherwise, not on port 22 everywhere"),
    ("listenaddress", "the same"),
    ("maxsessions", "skiffd's default is 256 sessions (skiff run multiplexes), sshd's 10"),
    ("clientaliveinterval", "skiffd checks for dead clients every 60 s by default; sshd never"),
    ("maxstartups", "skiffd has no random early drop by default (100:30:100), so fan-outs are not thinned; sshd 10:30:100"),
    ("authorizedkeysfile", "skiffd reads %h/.ssh/authorized_keys only (no authorized_keys2)"),
    ("ciphers", "skiffd offers AEAD ciphers only by default, and has no umac"),
    ("macs", "the same: no umac, no SHA-1 by default"),
    ("kexalgorithms", "skiffd has no sntrup761 nor group exchange, and leaves NIST curves out by default"),
    ("hostkeyalgorithms", "skiffd signs with plain keys (no -cert or sk- names)"),
    ("pubkeyacceptedalgorithms", "skiffd lists each key type beside its certificate type, in another order"),
    ("permituserrc", "skiffd never runs ~/.ssh/rc"),
    ("rekeylimit", "skiffd re-keys after 1 GiB or an hour by default; sshd after a cipher-dependent amount, with no time limit"),
];

/// What a configuration (on top of the defaults') sets to what skiffd does
/// not do, and so prints as off.
const NEVER_OFFERED: &[(&str, &str)] = &[("x11forwarding", "skiffd never forwards X11")];

/// The keywords of `lists` (whose reasons they give).
fn keywords<'a>(lists: &[&[(&'a str, &str)]]) -> Vec<&'a str> {
    lists
        .iter()
        .flat_map(|l| l.iter().map(|(k, _)| *k))
        .collect()
}

/// Compares the keywords both print but those in `skip` (each listed
/// above with its reason); returns how many were compared.
fn compare(sshd: &Dump, skiffd: &Dump, skip: &[&str], what: &str) -> usize {
    let skipped = |k: &str| skip.contains(&k);
    let mut compared = 0;
    let mut wrong = Vec::new();
    for (keyword, theirs) in sshd {
        let Some(ours) = skiffd.get(keyword) else {
            continue;
        };
        if skipped(keyword) {
            continue;
        }
        let (mut theirs, mut ours) = (theirs.clone(), ours.clone());
        match keyword.as_str() {
            // Listeners come in another order; the set is what counts.
            "listenaddress" | "port" => {
                theirs.sort();
                ours.sort();
            }
            // skiffd also serves its own data plane's subsystem.
            "subsystem" => ours.retain(|s| !s.starts_with("transfer@skiff ")),
            _ => {}
        }
        compared += 1;
        if theirs != ours {
            wrong.push(format!("{keyword}: sshd {theirs:?}, skiffd {ours:?}"));
        }
    }
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    compared
}

/// A directory with a configuration file written in it.
fn config_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    write_file(&path, text, 0o644);
    path
}

#[test]
fn defaults_print_as_sshd_prints_them() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = config_file(fx.path(), "empty_config", "");
    let sshd = dump(SSHD, &config, &fx.host_key, None);
    let skiffd = dump(skiffd_bin(), &config, &fx.host_key, None);
    let n = compare(&sshd, &skiffd, &keywords(&[DIFFERENT_DEFAULTS]), "defaults");
    assert!(n >= 40, "only {n} keywords compared");
    assert_eq!(skiffd["listenaddress"], ["127.0.0.1:2222"]);
    assert_eq!(
        skiffd["hostkey"],
        [fx.host_key.private.display().to_string()]
    );
}

#[test]
fn a_debian_style_configuration_prints_as_sshd_prints_it() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let drop_in = fx.path().join("sshd_config.d");
    std::fs::create_dir(&drop_in).expect("mkdir");
    config_file(
        &drop_in,
        "50-hardening.conf",
        "PermitRootLogin no\nMaxAuthTries 3\nPasswordAuthentication no\n",
    );
    let text = format!(
        "# Debian's sshd_config, with the usual hardening.\n\
         Include {}/*.conf\n\
         Port 2022\n\
         AddressFamily inet\n\
         ListenAddress 127.0.0.1\n\
         PermitRootLogin prohibit-password\n\
         LoginGraceTime 30\n\
         MaxSessions 4\n\
         RekeyLimit 512M 30m\n\
         UnusedConnectionTimeout 10m\n\
         AuthenticationMethods publickey,publickey publickey\n\
         ClientAliveInterval 300\n\
         ClientAliveCountMax 2\n\
         MaxStartups 10:30:60\n\
         PerSourceMaxStartups 4\n\
         PerSourceNetBlockSize 24:64\n\
         AuthorizedKeysFile .ssh/authorized_keys\n\
         KbdInteractiveAuthentication no\n\
         UsePAM yes\n\
         AllowAgentForwarding no\n\
         AllowTcpForwarding local\n\
         AllowStreamLocalForwarding no\n\
         GatewayPorts clientspecified\n\
         X11Forwarding yes\n\
         PrintMotd no\n\
         PermitTTY yes\n\
         StreamLocalBindMask 0117\n\
         Banner /etc/issue.net\n\
         AcceptEnv LANG LC_*\n\
         AcceptEnv COLORTERM\n\
         SetEnv TZ=UTC\n\
         AllowGroups staff sudo\n\
         DenyUsers guest nobody\n\
         PermitOpen 127.0.0.1:5432 db.example:*\n\
         TrustedUserCAKeys /etc/ssh/user_ca.pub\n\
         AuthorizedPrincipalsFile /etc/ssh/principals/%u\n\
         Ciphers aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr\n\
         MACs hmac-sha2-512-etm@openssh.com,hmac-sha2-256-etm@openssh.com\n\
         KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org,diffie-hellman-group16-sha512\n\
         HostKeyAlgorithms ssh-ed25519,rsa-sha2-512,rsa-sha2-256\n\
         PubkeyAcceptedAlgorithms ssh-ed25519,ecdsa-sha2-nistp256,rsa-sha2-512\n\
         CASignatureAlgorithms ssh-ed25519,rsa-sha2-512\n\
         Subsystem sftp /usr/lib/openssh/sftp-server\n\
         Match User anoncvs\n\
         \tX11Forwarding no\n\
         \tAllowTcpForwarding no\n\
         \tPermitTTY no\n\
         \tForceCommand cvs server\n",
        drop_in.display()
    );
    let config = config_file(fx.path(), "sshd_config", &text);
    for spec in [None, Some("user=anoncvs,host=192.0.2.1,addr=192.0.2.1")] {
        let sshd = dump(SSHD, &config, &fx.host_key, spec);
        let skiffd = dump(skiffd_bin(), &config, &fx.host_key, spec);
        let what = format!("Debian-style, -C {spec:?}");
        // Everything with a different default is set here, but this.
        let mut skip = keywords(&[NEVER_OFFERED]);
        skip.push("permituserrc");
        let n = compare(&sshd, &skiffd, &skip, &what);
        assert!(n >= 50, "{what}: only {n} keywords compared");
        // The drop-in came first and won, in both.
        assert_eq!(skiffd["permitrootlogin"], ["no"]);
        assert_eq!(skiffd["maxauthtries"], ["3"]);
        let forwarding = if spec.is_some() { "no" } else { "local" };
        assert_eq!(skiffd["allowtcpforwarding"], [forwarding], "{what}");
    }
}

#[test]
fn match_blocks_apply_for_the_connection_given_with_dash_capital_c() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = config_file(
        fx.path(),
        "sshd_config",
        "Port 2022\nListenAddress 127.0.0.1\nMaxSessions 8\n\
         Match User alice\n  MaxSessions 2\n  PermitTTY no\n  ForceCommand internal-sftp\n\
         Match Address 10.0.0.0/8,!10.9.9.9\n  AllowTcpForwarding no\n  MaxSessions 3\n  ExposeAuthInfo yes\n\
         Match LocalPort 2022 User bob\n  PermitOpen 127.0.0.1:8080\n  AuthorizedKeysFile /etc/ssh/keys/%u\n\
         Match LocalAddress 127.0.0.2\n  AllowAgentForwarding no\n\
         Match Host 192.0.2.*\n  DisableForwarding yes\n  PermitListen 9000\n",
    );
    // sshd 9.2 refuses a `Match LocalPort` without `lport` in -C (and -T
    // without -C); skiffd takes the criterion as not met. Each spec here
    // has one.
    let specs = [
        "user=alice,host=10.1.2.3,addr=10.1.2.3,lport=22",
        "user=alice,host=10.9.9.9,addr=10.9.9.9,lport=22",
        "user=bob,host=192.0.2.7,addr=192.0.2.7,laddr=127.0.0.1,lport=2022",
        "user=bob,host=192.0.2.7,addr=192.0.2.7,lport=22",
        "user=carol,host=10.2.2.2,addr=10.2.2.2,laddr=127.0.0.2,lport=22",
    ];
    let mut seen = Vec::new();
    for spec in specs.map(Some) {
        let sshd = dump(SSHD, &config, &fx.host_key, spec);
        let skiffd = dump(skiffd_bin(), &config, &fx.host_key, spec);
        let what = format!("Match blocks, -C {spec:?}");
        let mut skip = keywords(&[DIFFERENT_DEFAULTS]);
        skip.retain(|k| !["port", "listenaddress", "maxsessions"].contains(k));
        compare(&sshd, &skiffd, &skip, &what);
        seen.push(skiffd["maxsessions"][0].clone());
    }
    // The blocks made a difference, and the first to set a keyword won.
    assert_eq!(seen, ["2", "2", "8", "8", "3"]);
    // Without -C, no block applies.
    let skiffd = dump(skiffd_bin(), &config, &fx.host_key, None);
    assert_eq!(skiffd["maxsessions"], ["8"]);
}

#[test]
fn sshd_options_change_the_configuration_as_in_sshd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = config_file(
        fx.path(),
        "sshd_config",
        "Port 22\nListenAddress 127.0.0.1\nMaxSessions 9\nLoginGraceTime 60\nAddressFamily inet6\n",
    );
    // -p replaces the Port line, -o and -g win over the file's lines, -4
    // over its AddressFamily.
    let more = [
        "-4",
        "-g",
        "33",
        "-p",
        "2200",
        "-p",
        "2201",
        "-o",
        "MaxSessions=3",
        "-o",
        "AcceptEnv FOO BAR_*",
    ];
    let sshd = dump_with(SSHD, &config, &fx.host_key, None, &more);
    let skiffd = dump_with(skiffd_bin(), &config, &fx.host_key, None, &more);
    let mut skip = keywords(&[DIFFERENT_DEFAULTS]);
    skip.retain(|k| !["port", "listenaddress", "maxsessions"].contains(k));
    compare(&sshd, &skiffd, &skip, "sshd's options");
    assert_eq!(skiffd["port"], ["2200", "2201"]);
    assert_eq!(skiffd["maxsessions"], ["3"]);
    assert_eq!(skiffd["logingracetime"], ["33"]);
    assert_eq!(skiffd["addressfamily"], ["inet"]);
    assert_eq!(skiffd["acceptenv"], ["FOO", "BAR_*"]);
}

#[test]
fn a_bad_configuration_fails_as_with_sshd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = config_file(fx.path(), "bad_config", "MaxSessions 4\nMaxSessions many\n");
    privsep_dir();
    for program in [SSHD, skiffd_bin()] {
        let out = Run::new(program)
            .arg("-T")
            .arg("-f")
            .arg(&config)
            .arg("-h")
            .arg(&fx.host_key.private)
            .timeout(Duration::from_secs(30))
            .run();
        assert_ne!(out.code, 0, "{program}\n{out}");
        assert!(out.stdout_str().is_empty(), "{program}\n{out}");
    }
    let out = Run::new(skiffd_bin())
        .arg("-T")
        .arg("-f")
        .arg(&config)
        .arg("-h")
        .arg(&fx.host_key.private)
        .run();
    assert!(
        out.stderr_lines()
            .iter()
            .any(|l| l.contains("bad_config:2:")),
        "{out}"
    );
    // -T checks the host keys; -G does not.
    let missing = fx.path().join("no_such_key");
    let good = config_file(fx.path(), "good_config", "MaxSessions 4\n");
    let run = |flag: &str| {
        Run::new(skiffd_bin())
            .arg(flag)
            .arg("-f")
            .arg(&good)
            .arg("-h")
            .arg(&missing)
            .run()
    };
    assert_ne!(run("-T").code, 0);
    let out = run("-G");
    out.expect_code(0, "skiffd -G with a missing host key");
    assert!(out.stdout_str().contains("\nmaxsessions 4\n"), "{out}");
    // sshd-only flags skiffd does not have are refused, saying so.
    let out = Run::new(skiffd_bin()).arg("-i").run();
    assert_ne!(out.code, 0);
    assert!(
        out.stderr_lines().iter().any(|l| l.contains("inetd")),
        "{out}"
    );
}

#[test]
fn sshd_options_start_a_skiffd_that_ssh_logs_in_to() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let log = fx.path().join("skiffd.log");
    let config = "SetEnv GREETING=from-file\nMaxSessions 4\n";
    let args = vec![
        "-D".to_string(),
        "-e".to_string(),
        "-p".to_string(),
        "{port}".to_string(),
        "-o".to_string(),
        "ListenAddress 127.0.0.1".to_string(),
        "-o".to_string(),
        format!("AuthorizedKeysFile={}", fx.authorized_keys.display()),
        "-o".to_string(),
        "SetEnv GREETING=from-command-line".to_string(),
        "-h".to_string(),
        fx.host_key.private.display().to_string(),
        "-d".to_string(),
        "-E".to_string(),
        log.display().to_string(),
    ];
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
        .config(config)
        .command_line(args);
    opts.verbose = false;
    let d = Skiffd::start_with(opts);
    let c = server_context(&d, "skiffd -D -e -p -o -h -d -E");
    // -o won over the file's line.
    ssh(d.port(), user(), &fx.client_key)
        .args(&["echo $GREETING"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("from-command-line\n", &c);
    // The log went to the -E file, 0600, and not to stderr.
    let text = std::fs::read_to_string(&log).expect("read the -E log");
    // -p and -o ListenAddress made the listener; -d asked for debug lines.
    let listening = format!("listening on 127.0.0.1:{}", d.port());
    assert!(
        text.contains(&listening),
        "{listening}? the -E log:\n{text}"
    );
    assert!(text.contains(" DEBUG "), "-d: the -E log:\n{text}");
    assert_eq!(file_mode(&log) & 0o777, 0o600);
    assert!(d.log().trim().is_empty(), "stderr: {}", d.log());
}
