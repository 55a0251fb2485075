//! Host certificates, both ways, against real OpenSSH.
//!
//! * skiff -> sshd with `HostCertificate`: trusted through a
//!   `@cert-authority` line alone; principals, validity and `@revoked`
//!   enforced; an untrusted certificate falls back to the plain key, as ssh
//!   does; `HostKeyAlias` names the principal.
//! * OpenSSH `ssh` and skiff -> skiffd with `HostCertificate`.
//! * skiffd refuses certificates it cannot present.
//!
//! Certificates are made by `ssh-keygen -s` with a throwaway CA.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use skiff_testkit::*;

/// Signs a copy of `host_key`'s public half named `name` with `ca` as a
/// host certificate (`-h`) for `principals` (none: `-n` left out, valid for
/// any host) and `validity` (`ssh-keygen -V`), with `more` ssh-keygen
/// arguments, and returns its path.
fn host_certificate(
    fx: &Fixture,
    ca: &Key,
    host_key: &Key,
    name: &str,
    principals: Option<&str>,
    validity: &str,
    more: &[&str],
) -> PathBuf {
    let public = fx.path().join(format!("{name}.pub"));
    fs::copy(&host_key.public, &public).expect("copy host public key");
    let mut cmd = Command::new("ssh-keygen");
    cmd.args(["-q", "-s"])
        .arg(&ca.private)
        .args(["-I", name, "-h", "-V", validity])
        .args(more);
    if let Some(p) = principals {
        cmd.args(["-n", p]);
    }
    let out = cmd.arg(&public).output().expect("run ssh-keygen -s");
    assert!(
        out.status.success(),
        "ssh-keygen -s failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fx.path().join(format!("{name}-cert.pub"))
}

/// With only `ca` known, `skiff exec` to `port` is refused for an
/// untrusted certificate, saying `why`.
fn refused_with_only_the_ca(fx: &Fixture, ca: &Key, port: u16, why: &str, c: &str) {
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", ca)]);
    strict_skiff(&home, port, fx)
        .cmd("echo never")
        .run()
        .expect_skiff_failure(&["host certificate not trusted", why], c);
}

/// `@cert-authority PATTERNS CA-KEY`.
fn authority_line(patterns: &str, ca: &Key) -> String {
    format!("@cert-authority {patterns} {}", ca.key_material())
}

fn write_known_hosts(home: &ClientHome, lines: &[String]) -> String {
    let text = lines.join("\n") + "\n";
    write_file(&home.known_hosts(), &text, 0o600);
    text
}

/// `skiff exec` as the test account with StrictHostKeyChecking=yes.
fn strict_skiff(home: &ClientHome, port: u16, fx: &Fixture) -> SkiffExec {
    skiff_exec(home, port, user(), Some(&fx.client_key)).opt("StrictHostKeyChecking=yes")
}

/// sshd presenting a certificate for its host key.
fn sshd_with_certificate(fx: &Fixture, cert: &Path) -> Sshd {
    let line = format!("HostCertificate {}", cert.display());
    Sshd::start(&fx.host_key, &fx.authorized_keys, &[&line])
}

/// A fixture, a host CA, and a certificate from that CA for the fixture's
/// host key (see [`host_certificate`]); `None` when OpenSSH is missing
/// outside CI.
fn certified(
    name: &str,
    principals: Option<&str>,
    validity: &str,
) -> Option<(Fixture, Key, PathBuf)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("host_ca", KeyType::Ed25519, None);
    let cert = host_certificate(&fx, &ca, &fx.host_key, name, principals, validity, &[]);
    Some((fx, ca, cert))
}

/// [`certified`], and sshd presenting the certificate.
fn certified_sshd(
    name: &str,
    principals: Option<&str>,
    validity: &str,
) -> Option<(Fixture, Key, Sshd)> {
    let (fx, ca, cert) = certified(name, principals, validity)?;
    let sshd = sshd_with_certificate(&fx, &cert);
    Some((fx, ca, sshd))
}

#[test]
fn skiff_trusts_a_certificate_from_a_listed_authority() {
    let Some((fx, ca, sshd)) = certified_sshd("any-host", None, "-5m:+1h") else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "skiff -> sshd with a host certificate");

    // Only the CA is known: no line holds the host key itself.
    let home = ClientHome::new();
    let text = write_known_hosts(&home, &[authority_line("*", &ca)]);
    let out = strict_skiff(&home, port, &fx).cmd("echo certified").run();
    out.expect_code(0, &c).expect_stdout("certified\n", &c);
    assert_eq!(out.stderr, "", "{c}\n{out}");
    assert_eq!(
        fs::read_to_string(home.known_hosts()).unwrap(),
        text,
        "{c}: a trusted certificate adds nothing to known_hosts"
    );

    // The authority must apply to the host: patterns for other hosts (or
    // ports) do not vouch for this one. No certificate is asked for then,
    // and the plain key is unknown.
    let home = ClientHome::new();
    write_known_hosts(
        &home,
        &[authority_line(
            &format!("*.example.test,[127.0.0.1]:{}", port + 1),
            &ca,
        )],
    );
    strict_skiff(&home, port, &fx)
        .cmd("echo never")
        .run()
        .expect_skiff_failure(&["no ED25519 host key is known"], &c);

    // The same through `skiff run`, with the authority listed for exactly
    // this host and port (ssh-keygen -H leaves marker lines unhashed; hashed
    // ones are covered by skiff-proto's tests).
    let home = ClientHome::new();
    let kh = fx.path().join("run_known_hosts");
    write_file(
        &kh,
        authority_line(&known_hosts_name(port), &ca) + "\n",
        0o600,
    );
    let out = Run::new(skiff_bin())
        .env("HOME", home.path())
        .args(["run", "--no-agent", "-F", "/dev/null", "-i"])
        .arg(&fx.client_key.private)
        .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", kh.display()))
        .args([
            "-l",
            user(),
            "-p",
            &port.to_string(),
            "127.0.0.1",
            "echo",
            "fanned",
        ])
        .run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout_str(), "127.0.0.1: fanned\n", "{c}\n{out}");
}

#[test]
fn principals_and_host_key_alias() {
    let Some((fx, ca, sshd)) = certified_sshd("web1", Some("web1.example.test,web1"), "-5m:+1h")
    else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "principals");
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", &ca)]);

    // Connecting to 127.0.0.1, which the certificate does not list.
    strict_skiff(&home, port, &fx)
        .cmd("echo never")
        .run()
        .expect_skiff_failure(
            &[
                "host certificate not trusted",
                "127.0.0.1 is not among the principals",
                "web1",
            ],
            &c,
        );

    // HostKeyAlias names the host keys are checked under, so also the
    // principal; ssh does the same.
    let out = strict_skiff(&home, port, &fx)
        .opt("HostKeyAlias=web1.example.test")
        .cmd("echo aliased")
        .run();
    out.expect_code(0, &c).expect_stdout("aliased\n", &c);
    let out = ssh(port, user(), &fx.client_key)
        .known_hosts(&home.known_hosts())
        .opt("HostKeyAlias=web1.example.test")
        .args(&["echo", "ssh-agrees"])
        .run();
    out.expect_code(0, &c).expect_stdout("ssh-agrees\n", &c);

    // Through ~/.ssh/config too, and the authority's patterns see the alias.
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*.example.test", &ca)]);
    write_file(
        &home.ssh_dir().join("config"),
        format!(
            "Host web1\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias web1.example.test\n"
        ),
        0o600,
    );
    let out = SkiffExec::new(&home, &format!("{}@web1", user()))
        .user_config()
        .key(&fx.client_key.private)
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo via-config")
        .run();
    out.expect_code(0, &c).expect_stdout("via-config\n", &c);
}

#[test]
fn an_untrusted_certificate_falls_back_to_the_plain_key() {
    let Some((fx, ca, sshd)) = certified_sshd("old", None, "20200101:20200201") else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "expired host certificate");

    // Only the CA is known: refused, saying why the certificate failed.
    refused_with_only_the_ca(&fx, &ca, port, "expired at 2020-02-01", &c);

    // The plain key is known as well: connected, with a warning.
    let home = ClientHome::new();
    write_known_hosts(
        &home,
        &[
            authority_line("*", &ca),
            known_hosts_line(port, &fx.host_key),
        ],
    );
    let out = strict_skiff(&home, port, &fx).cmd("echo plain").run();
    out.expect_code(0, &c).expect_stdout("plain\n", &c);
    assert!(
        out.stderr.contains("host certificate not trusted") && out.stderr.contains("expired"),
        "{c}: the fallback should be reported\n{out}"
    );

    // A certificate signed by a CA nobody listed: accept-new records the
    // plain key inside it, as ssh does, and the next connection knows it.
    let other_ca = fx.keygen("other_ca", KeyType::Ed25519, None);
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", &other_ca)]);
    let cert = host_certificate(&fx, &ca, &fx.host_key, "fresh", None, "-5m:+1h", &[]);
    let sshd = sshd_with_certificate(&fx, &cert);
    let port = sshd.port();
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt("StrictHostKeyChecking=accept-new")
        .cmd("echo recorded")
        .run();
    out.expect_code(0, &c).expect_stdout("recorded\n", &c);
    let recorded: Vec<String> = known_hosts_lookup(&home.known_hosts(), port)
        .into_iter()
        .filter(|l| !l.starts_with('@'))
        .collect();
    assert_eq!(recorded.len(), 1, "{c}: {recorded:?}\n{out}");
    assert_eq!(
        known_hosts_entry_key(&recorded[0]),
        fx.host_key.key_material()
    );
}

#[test]
fn a_revoked_authority_or_host_key_is_refused_outright() {
    let Some((fx, ca, sshd)) = certified_sshd("revoked", None, "-5m:+1h") else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "revoked");
    for (revoked, what) in [(&ca, "CA key"), (&fx.host_key, "its host key")] {
        // Even with the plain key known, and with accept-new.
        let home = ClientHome::new();
        write_known_hosts(
            &home,
            &[
                authority_line("*", &ca),
                known_hosts_line(port, &fx.host_key),
                format!("@revoked * {}", revoked.key_material()),
            ],
        );
        skiff_exec(&home, port, user(), Some(&fx.client_key))
            .opt("StrictHostKeyChecking=accept-new")
            .cmd("echo never")
            .run()
            .expect_skiff_failure(&["@revoked", what, &revoked.fingerprint()], &c);
    }
}

#[test]
fn skiffd_presents_a_host_certificate_to_ssh_and_skiff() {
    let Some((fx, ca, cert)) = certified("skiffd", Some("127.0.0.1"), "-5m:+1h") else {
        return;
    };
    let opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
        .config(&format!("HostCertificate {}\n", cert.display()));
    let skiffd = Skiffd::start_with(opts);
    let port = skiffd.port();
    let c = server_context(&skiffd, "skiffd with a host certificate");
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", &ca)]);

    let out = ssh(port, user(), &fx.client_key)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "from-ssh"])
        .run();
    out.expect_code(0, &c).expect_stdout("from-ssh\n", &c);

    let out = strict_skiff(&home, port, &fx).cmd("echo from-skiff").run();
    out.expect_code(0, &c).expect_stdout("from-skiff\n", &c);
    assert_eq!(out.stderr, "", "{c}\n{out}");

    // Without the CA, ssh sees an unknown host (the certificate proves
    // nothing to it) and refuses under StrictHostKeyChecking=yes.
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", &fx.stranger_key)]);
    let out = ssh(port, user(), &fx.client_key)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "never"])
        .run();
    out.expect_code(255, &c);
}

#[test]
fn skiffd_refuses_certificates_it_cannot_present() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("host_ca", KeyType::Ed25519, None);
    // A certificate for another key, and a user certificate for this one.
    let other = host_certificate(&fx, &ca, &fx.stranger_key, "other", None, "-5m:+1h", &[]);
    let user_cert_pub = fx.path().join("as-user.pub");
    fs::copy(&fx.host_key.public, &user_cert_pub).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-q", "-s"])
        .arg(&ca.private)
        .args(["-I", "as-user"])
        .arg(&user_cert_pub)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let user_cert = fx.path().join("as-user-cert.pub");
    for (cert, needle) in [
        (&other, "not one of skiffd's host keys"),
        (&user_cert, "a user certificate"),
    ] {
        let config = fx.path().join("skiffd.conf");
        write_file(
            &config,
            format!("HostCertificate {}\n", cert.display()),
            0o644,
        );
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{out}");
        assert!(
            out.stderr.contains(needle) && out.stderr.contains(&cert.display().to_string()),
            "skiffd should name the file and say {needle:?}\n{out}"
        );
    }
}

/// Through the agent, which resolves the configuration itself: the CA,
/// HostKeyAlias and a user certificate beside the key all reach it.
#[test]
fn through_the_agent() {
    let Some((fx, ca, sshd)) = certified_sshd("web1", Some("web1.example.test"), "-5m:+1h") else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "host certificate through the agent");
    let agent = AgentHome::new();
    write_known_hosts(&agent.home, &[authority_line("*.example.test", &ca)]);
    for round in ["first", "warm"] {
        let out = agent
            .exec(port, &fx.client_key)
            .opt("StrictHostKeyChecking=yes")
            .opt("HostKeyAlias=web1.example.test")
            .cmd(&format!("echo {round}"))
            .run();
        out.expect_code(0, &c)
            .expect_stdout(&format!("{round}\n"), &c);
    }
    // Without the alias no authority applies to 127.0.0.1, whose key is
    // unknown: the pooled connection, verified under the alias, must not
    // be reused for it.
    agent
        .exec(port, &fx.client_key)
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo never")
        .run()
        .expect_skiff_failure(&["no ED25519 host key is known"], &c);
}

/// A CA that signed with RSA/SHA-1 (`ssh-rsa`) is refused by default, as
/// OpenSSH's CASignatureAlgorithms does, and accepted when asked for.
#[test]
fn sha1_ca_signatures_only_when_asked_for() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("rsa_ca", KeyType::Rsa, None);
    let cert = host_certificate(
        &fx,
        &ca,
        &fx.host_key,
        "sha1",
        None,
        "-5m:+1h",
        &["-t", "ssh-rsa"],
    );
    let sshd = sshd_with_certificate(&fx, &cert);
    let port = sshd.port();
    let c = server_context(&sshd, "SHA-1 CA signature");
    refused_with_only_the_ca(&fx, &ca, port, "CASignatureAlgorithms", &c);
    let home = ClientHome::new();
    write_known_hosts(&home, &[authority_line("*", &ca)]);
    let out = strict_skiff(&home, port, &fx)
        .opt("CASignatureAlgorithms=+ssh-rsa")
        .cmd("echo allowed")
        .run();
    out.expect_code(0, &c).expect_stdout("allowed\n", &c);
}

/// RevokedHostKeys, a list of keys or a key revocation list (KRL): a
/// revoked host key, or a host certificate revoked by serial, is refused
/// although known_hosts trusts it; a file that is missing refuses every
/// host, as in ssh.
#[test]
fn revoked_host_keys_are_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("host_ca", KeyType::Ed25519, None);
    let cert = host_certificate(
        &fx,
        &ca,
        &fx.host_key,
        "serial-7",
        None,
        "-5m:+1h",
        &["-z", "7"],
    );
    let sshd = sshd_with_certificate(&fx, &cert);
    let port = sshd.port();
    let c = server_context(&sshd, "RevokedHostKeys");
    // Trusted both ways: the CA vouches for the certificate, and the plain
    // key is known.
    let home = ClientHome::new();
    write_known_hosts(
        &home,
        &[
            authority_line("*", &ca),
            known_hosts_line(port, &fx.host_key),
        ],
    );
    let with_list = |list: &Path| {
        strict_skiff(&home, port, &fx)
            .opt(&format!("RevokedHostKeys={}", list.display()))
            .cmd("echo in")
            .run()
    };
    let refused = &["host key verification failed", "revoked by"];

    let krl = |name: &str, spec: &str| {
        let spec_file = fx.path().join(format!("{name}.spec"));
        write_file(&spec_file, spec, 0o644);
        let path = fx.path().join(name);
        make_krl(&path, Some(&ca), &spec_file);
        path
    };
    // Another serial revoked: the certificate passes.
    with_list(&krl("serial-8.krl", "serial: 8\n"))
        .expect_code(0, &c)
        .expect_stdout("in\n", &c);
    // Its serial revoked: refused, although the CA and the key are trusted.
    with_list(&krl("serial-7.krl", "serial: 7\n")).expect_skiff_failure(refused, &c);
    // The host key revoked by its hash.
    let by_hash = krl(
        "hash.krl",
        &format!("hash: {}\n", fx.host_key.fingerprint()),
    );
    with_list(&by_hash).expect_skiff_failure(refused, &c);
    // A text list naming the host key.
    let listed = fx.path().join("revoked-hosts");
    write_file(&listed, format!("{}\n", fx.host_key.pub_line()), 0o644);
    with_list(&listed).expect_skiff_failure(refused, &c);
    // Without the CA in known_hosts skiff asks for the plain key: it is
    // refused too.
    let plain_home = ClientHome::new();
    plain_home.trust(port, &fx.host_key);
    strict_skiff(&plain_home, port, &fx)
        .opt(&format!("RevokedHostKeys={}", listed.display()))
        .cmd("echo never")
        .run()
        .expect_skiff_failure(refused, &c);
    // A missing file refuses every host.
    with_list(&fx.path().join("no-such-file")).expect_skiff_failure(
        &[
            "host key verification failed",
            "RevokedHostKeys cannot be used",
        ],
        &c,
    );
}
