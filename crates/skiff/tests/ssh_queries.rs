//! `skiff ssh -G` and `skiff ssh -Q` beside OpenSSH's `ssh -G` and `ssh -Q`
//! on this machine: scripts, Ansible and git parse what ssh prints there,
//! and ask `ssh -Q` what a client supports before using it.
//!
//! `-G` is run by both on the same small configurations (`-F`, so nothing
//! in ~/.ssh is read); every keyword both print must have the same value,
//! but for the differences listed below, each with its reason. A new
//! difference fails the test, and so does a keyword ssh prints that skiff
//! does not (but for those listed) or the other way round.
//!
//! `-Q`: every name skiff prints for a query is one ssh prints for it
//! (skiff may support fewer, never a name OpenSSH does not know), but for
//! the few listed, and the queries people use are not empty.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn skiff_ssh(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
        .arg("ssh")
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .env("SKIFF_AGENT", "off")
        .output()
        .expect("run skiff")
}

fn openssh(args: &[&str]) -> Output {
    Command::new("ssh")
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .output()
        .expect("run ssh")
}

/// Whether OpenSSH's client is here to compare with (under `CI=true` its
/// absence is a failure, not a skip).
fn have_openssh() -> bool {
    skiff_testkit::require_tool("ssh", "openssh-client")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A -G output as keyword (lower-cased: ssh 9 prints
/// `canonicalizePermittedcnames`) → its values, one per line printed.
fn keywords(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        map.entry(k.to_ascii_lowercase())
            .or_default()
            .push(v.to_string());
    }
    map
}

/// A keyword whose value is skiff's own on purpose.
struct Differs {
    keyword: &'static str,
    /// What skiff prints (lines joined with `\n`); empty: skiff's value is
    /// not pinned here (a long algorithm list).
    skiff: &'static str,
    why: &'static str,
}

/// Differences whatever the configuration says.
const ALWAYS: &[Differs] = &[
    Differs {
        keyword: "forwardx11trusted",
        skiff: "no",
        why: "skiff forwards no X11 at all (Debian's ssh defaults to yes, OpenSSH to no)",
    },
    Differs {
        keyword: "tcpkeepalive",
        skiff: "no",
        why: "skiff sets no SO_KEEPALIVE; ServerAliveInterval notices a dead peer",
    },
    Differs {
        keyword: "ipqos",
        skiff: "none none",
        why: "skiff leaves the system's type of service alone",
    },
    Differs {
        keyword: "rekeylimit",
        skiff: "1073741824 3600",
        why: "russh's limits: new keys after 1 GiB either way or an hour",
    },
    Differs {
        keyword: "pubkeyacceptedalgorithms",
        skiff: "",
        why: "what skiff signs in with: no security keys (sk-) of its own",
    },
];

/// Differences of skiff's defaults, where the configuration leaves the
/// keyword unset (README: "Defaults that differ from ssh").
const DEFAULTS: &[Differs] = &[
    Differs {
        keyword: "stricthostkeychecking",
        skiff: "accept-new",
        why: "skiff records a new host's key without asking",
    },
    Differs {
        keyword: "connecttimeout",
        skiff: "30",
        why: "a dead address never hangs skiff",
    },
    Differs {
        keyword: "serveraliveinterval",
        skiff: "15",
        why: "a dead peer is noticed",
    },
    Differs {
        keyword: "controlpersist",
        skiff: "600",
        why: "skiff's agent keeps an idle connection 10 minutes",
    },
    Differs {
        keyword: "identityfile",
        skiff: "~/.ssh/id_rsa\n~/.ssh/id_ecdsa\n~/.ssh/id_ecdsa_sk\n~/.ssh/id_ed25519\n~/.ssh/id_ed25519_sk",
        why: "no DSA or XMSS keys (ssh also tries ~/.ssh/id_xmss and ~/.ssh/id_dsa)",
    },
    Differs {
        keyword: "ciphers",
        skiff: "",
        why: "skiff's default lists (README: no SHA-1, CBC or small groups; AEAD first)",
    },
    Differs {
        keyword: "macs",
        skiff: "",
        why: "skiff's default lists; skiff has no umac",
    },
    Differs {
        keyword: "kexalgorithms",
        skiff: "",
        why: "skiff's default lists: mlkem768x25519 rather than sntrup761",
    },
    Differs {
        keyword: "hostkeyalgorithms",
        skiff: "",
        why: "certificates are asked for when known_hosts trusts a CA, not by name",
    },
];

/// Keywords ssh prints and skiff leaves out: they only tune something
/// skiff does not have.
const ONLY_SSH: &[(&str, &str)] = &[
    ("forwardx11timeout", "no X11 forwarding"),
    ("xauthlocation", "no X11 forwarding"),
    ("tunneldevice", "no tunnel devices"),
    (
        "hostbasedacceptedalgorithms",
        "no host-based authentication",
    ),
    (
        "gssapikexalgorithms",
        "no GSSAPI key exchange (a Debian patch)",
    ),
    ("securitykeyprovider", "no security keys but an agent's"),
    ("syslogfacility", "skiff never logs to syslog"),
];

struct Case {
    name: &'static str,
    config: String,
    args: Vec<String>,
    /// Differences of this case's own.
    differs: &'static [Differs],
}

impl Case {
    /// Whether the configuration or the command line sets `keyword`.
    fn sets(&self, keyword: &str) -> bool {
        let flags: &[(&str, &str)] = &[("ciphers", "-c"), ("macs", "-m"), ("identityfile", "-i")];
        self.config.lines().any(|l| {
            l.trim_start()
                .to_ascii_lowercase()
                .starts_with(&format!("{keyword} "))
        }) || self.args.iter().any(|a| {
            a.to_ascii_lowercase().starts_with(&format!("{keyword}="))
                || flags.contains(&(keyword, a.as_str()))
        })
    }
}

/// Runs `ssh -G` and `skiff ssh -G` on `case`; the differences found
/// that are not allowed.
fn compare(dir: &Path, case: &Case) -> Vec<String> {
    let file = dir.join(format!("{}.config", case.name));
    std::fs::write(&file, &case.config).unwrap();
    let mut args = vec!["-F".to_string(), file.display().to_string(), "-G".into()];
    args.extend(case.args.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let theirs = openssh(&args);
    let ours = skiff_ssh(&args);
    assert!(
        theirs.status.success(),
        "{}: ssh -G failed: {}",
        case.name,
        String::from_utf8_lossy(&theirs.stderr)
    );
    assert!(
        ours.status.success(),
        "{}: skiff ssh -G failed: {}",
        case.name,
        String::from_utf8_lossy(&ours.stderr)
    );
    let (theirs, ours) = (keywords(&stdout(&theirs)), keywords(&stdout(&ours)));
    let mut problems = Vec::new();
    for (keyword, ssh_values) in &theirs {
        let Some(skiff_values) = ours.get(keyword) else {
            if !ONLY_SSH.iter().any(|(k, _)| k == keyword) {
                problems.push(format!("{keyword}: ssh prints it, skiff does not"));
            }
            continue;
        };
        let skiff_value = skiff_values.join("\n");
        let allowed = ALWAYS
            .iter()
            .chain(case.differs)
            .chain(DEFAULTS.iter().filter(|d| !case.sets(d.keyword)))
            .find(|d| d.keyword == keyword);
        match allowed {
            Some(d) if d.skiff.is_empty() || d.skiff == skiff_value => {}
            Some(d) => problems.push(format!(
                "{keyword}: skiff prints {skiff_value:?}, expected {:?} ({})",
                d.skiff, d.why
            )),
            None if ssh_values == skiff_values => {}
            None => problems.push(format!(
                "{keyword}: ssh {:?}, skiff {skiff_value:?}",
                ssh_values.join("\n")
            )),
        }
    }
    for keyword in ours.keys().filter(|k| !theirs.contains_key(*k)) {
        problems.push(format!("{keyword}: skiff prints it, ssh does not"));
    }
    problems
        .into_iter()
        .map(|p| format!("{}: {p}", case.name))
        .collect()
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn print_config_matches_openssh() {
    if !have_openssh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let key = dir.path().join("key");
    std::fs::write(&key, "").unwrap();
    let known = format!("UserKnownHostsFile {d}/known_hosts\n");
    let cases = [
        Case {
            name: "defaults",
            config: known.clone(),
            args: words("plain"),
            differs: &[],
        },
        Case {
            name: "a host block",
            config: format!(
                "Host web\n  HostName 10.0.0.5\n  User deploy\n  Port 2200\n  \
                 IdentityFile ~/keys/%r@%h\n  IdentityFile {d}/second\n  \
                 CertificateFile {d}/cert-%h.pub\n  IdentitiesOnly yes\n  \
                 ProxyJump jump1,ops@jump2:2201\n  ServerAliveInterval 7\n  \
                 ServerAliveCountMax 5\n  StrictHostKeyChecking yes\n  \
                 Ciphers aes128-ctr,aes256-gcm@openssh.com\n  MACs hmac-sha2-256\n  \
                 KexAlgorithms curve25519-sha256,diffie-hellman-group14-sha256\n  \
                 HostKeyAlgorithms ssh-ed25519,rsa-sha2-512\n  \
                 CASignatureAlgorithms ssh-ed25519\n  ConnectTimeout 12\n  \
                 AddressFamily inet\n  BindAddress 127.0.0.1\n  BatchMode yes\n  \
                 HostKeyAlias webalias\n  HashKnownHosts yes\n  RequiredRSASize 2048\n  \
                 GlobalKnownHostsFile {d}/global %h\n  RevokedHostKeys {d}/revoked\n  \
                 KnownHostsCommand /bin/echo %H\n  RequestTTY force\n  \
                 RemoteCommand echo %h %p\n  SendEnv LANG LC_*\n  SetEnv A=1 B=2\n  \
                 LocalForward 8080 localhost:80\n  LocalForward 127.0.0.1:8081 [::1]:81\n  \
                 RemoteForward 9090 127.0.0.1:90\n  RemoteForward 9091\n  \
                 DynamicForward 1080\n  ExitOnForwardFailure yes\n  GatewayPorts yes\n  \
                 EscapeChar ^X\n  StreamLocalBindMask 0117\n  StreamLocalBindUnlink yes\n  \
                 IdentityAgent none\n  ForwardAgent yes\n  AddKeysToAgent confirm 1h\n  \
                 ControlPersist 10m\n  LogLevel ERROR\n  CanonicalDomains example.com\n  \
                 CanonicalizeMaxDots 2\n  StdinNull yes\n  SessionType subsystem\n  \
                 PubkeyAuthentication no\n  PasswordAuthentication no\n  \
                 KbdInteractiveAuthentication no\n  NumberOfPasswordPrompts 1\n  \
                 PreferredAuthentications keyboard-interactive,password,publickey\n\
                 Host *\n  {known}"
            ),
            args: words("web"),
            differs: &[],
        },
        Case {
            name: "a proxy command and other values",
            config: format!(
                "Host pc\n  ProxyCommand nc %h %p\n  StrictHostKeyChecking accept-new\n  \
                 ForwardAgent {d}/agent.sock\n  IdentityAgent {d}/agent.sock\n  \
                 AddKeysToAgent 1h\n  ControlPersist no\n  EscapeChar none\n  \
                 RequestTTY no\n  SessionType none\n  ConnectTimeout 0\n  \
                 ServerAliveInterval 0\n  LogLevel DEBUG1\n  CanonicalizeHostname always\n  \
                 ClearAllForwardings yes\n  LocalForward 1 h:2\n  \
                 ChallengeResponseAuthentication no\n  {known}"
            ),
            args: words("pc"),
            differs: &[Differs {
                keyword: "connecttimeout",
                skiff: "30",
                why: "ConnectTimeout 0 keeps skiff's 30 s rather than the system's (README)",
            }],
        },
        Case {
            name: "the command line",
            config: format!("Host box\n  ProxyJump from-config\n  {known}"),
            args: vec![
                "-p".into(),
                "2222".into(),
                "-l".into(),
                "bob".into(),
                "-i".into(),
                key.display().to_string(),
                "-J".into(),
                "a,b@c:3".into(),
                "-o".into(),
                "ServerAliveInterval=5".into(),
                "-o".into(),
                "StrictHostKeyChecking=no".into(),
                "-c".into(),
                "aes256-ctr".into(),
                "-m".into(),
                "hmac-sha2-512".into(),
                "-4".into(),
                "-A".into(),
                "-g".into(),
                "-f".into(),
                "-N".into(),
                "-tt".into(),
                "-e".into(),
                "%".into(),
                "-L".into(),
                "5000:db:5432".into(),
                "-R".into(),
                "[::1]:6000:localhost:22".into(),
                "-D".into(),
                "7000".into(),
                "box".into(),
            ],
            differs: &[],
        },
        Case {
            name: "-W, -vv and -n",
            config: format!("Host box\n  LocalForward 1 h:2\n  {known}"),
            args: words("-W dest:80 -vv -n box"),
            differs: &[],
        },
        Case {
            name: "-s and -T",
            config: known.clone(),
            args: words("-s -T -q box sftp"),
            differs: &[],
        },
    ];
    let problems: Vec<String> = cases.iter().flat_map(|c| compare(dir.path(), c)).collect();
    assert!(
        problems.is_empty(),
        "skiff ssh -G differs from ssh -G:\n{}",
        problems.join("\n")
    );
}

/// Names skiff lists that this OpenSSH does not, each a real name.
const EXTRA_NAMES: &[(&str, &str)] = &[
    (
        "mlkem768x25519-sha256",
        "OpenSSH's post-quantum key exchange since 9.9",
    ),
    (
        "diffie-hellman-group15-sha512",
        "RFC 8268's 3072-bit group, which OpenSSH does not have",
    ),
    (
        "diffie-hellman-group17-sha512",
        "RFC 8268's 6144-bit group, which OpenSSH does not have",
    ),
];

/// Queries of newer OpenSSH (9.6 on) that an older one refuses, with the
/// query whose names they are among there.
const NEWER_QUERIES: &[(&str, &str)] = &[("key-ca-sign", "sig"), ("CASignatureAlgorithms", "sig")];

fn lines(out: &Output) -> Vec<String> {
    stdout(out).lines().map(str::to_string).collect()
}

#[test]
fn queries_list_what_openssh_knows() {
    if !have_openssh() {
        return;
    }
    let help = skiff_ssh(&["-Q", "help"]);
    assert!(help.status.success(), "{help:?}");
    let ssh_help = lines(&openssh(&["-Q", "help"]));
    let mut queries = lines(&help);
    for q in &queries {
        assert!(
            ssh_help.contains(q) || NEWER_QUERIES.iter().any(|(n, _)| n == q),
            "skiff ssh -Q help lists {q:?}, ssh does not"
        );
    }
    for alias in [
        "Ciphers",
        "MACs",
        "KexAlgorithms",
        "HostKeyAlgorithms",
        "PubkeyAcceptedAlgorithms",
        "PubkeyAcceptedKeyTypes",
        "HostbasedAcceptedAlgorithms",
        "HostbasedKeyTypes",
        "CASignatureAlgorithms",
        "kexalgorithms",
    ] {
        queries.push(alias.to_string());
    }
    let mut problems = Vec::new();
    for q in &queries {
        let ours = skiff_ssh(&["-Q", q]);
        assert!(ours.status.success(), "skiff ssh -Q {q}: {ours:?}");
        let mut theirs = openssh(&["-Q", q]);
        if !theirs.status.success() {
            let Some((_, instead)) = NEWER_QUERIES.iter().find(|(n, _)| n == q) else {
                problems.push(format!("{q}: ssh refuses the query, skiff answers it"));
                continue;
            };
            theirs = openssh(&["-Q", instead]);
        }
        let known = lines(&theirs);
        for name in lines(&ours) {
            if !known.contains(&name) && !EXTRA_NAMES.iter().any(|(n, _)| *n == name) {
                problems.push(format!("{q}: skiff lists {name:?}, ssh does not"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    for q in [
        "cipher",
        "cipher-auth",
        "mac",
        "kex",
        "key",
        "key-plain",
        "key-cert",
        "key-sig",
        "sig",
        "compression",
        "Ciphers",
        "MACs",
        "KexAlgorithms",
        "HostKeyAlgorithms",
        "PubkeyAcceptedAlgorithms",
    ] {
        assert!(!lines(&skiff_ssh(&["-Q", q])).is_empty(), "-Q {q} is empty");
    }
    assert_eq!(lines(&skiff_ssh(&["-Q", "protocol-version"])), ["2"]);
    // A query needs no destination, and ends the command line's work
    // where it stands, as ssh's does.
    let out = skiff_ssh(&["-Q", "cipher", "host", "command"]);
    assert_eq!(lines(&out), lines(&skiff_ssh(&["-Q", "cipher"])));
}

#[test]
fn an_unknown_query_is_an_error_as_in_ssh() {
    for q in ["bogus", "CIPHER", "cipher_auth"] {
        let out = skiff_ssh(&["-Q", q]);
        assert_eq!(out.status.code(), Some(255), "{q}: {out:?}");
        assert!(out.stdout.is_empty(), "{q}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("Unsupported query \"{q}\"")), "{err}");
        if have_openssh() {
            assert_eq!(openssh(&["-Q", q]).status.code(), Some(255), "ssh -Q {q}");
        }
    }
    let out = skiff_ssh(&["-Q"]);
    assert_eq!(out.status.code(), Some(255), "{out:?}");
}
