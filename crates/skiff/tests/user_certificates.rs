//! User certificates: skiff authenticates to a real OpenSSH sshd that
//! trusts a user CA (`TrustedUserCAKeys`) with a certificate found beside
//! the key (`KEY-cert.pub`), named by `CertificateFile`, or held by
//! ssh-agent; RSA certificates sign with SHA-2. The keys used are in no
//! authorized_keys file, so only the certificate can let them in.

use std::fs;
use std::path::{Path, PathBuf};

use skiff_testkit::*;

/// Signs `key`'s public half with `ca` as a user certificate for
/// `principals`, written beside the key as `KEY-cert.pub`.
fn user_certificate(ca: &Key, key: &Key, principals: &str) -> PathBuf {
    sign_user_key(ca, &key.public, "skiff-test-user", principals, &[]);
    let mut cert = key.private.as_os_str().to_owned();
    cert.push("-cert.pub");
    PathBuf::from(cert)
}

/// A fixture, a user CA and sshd trusting it.
fn setup() -> Option<(Fixture, Key, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let line = format!("TrustedUserCAKeys {}", ca.public.display());
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&line]);
    Some((fx, ca, sshd))
}

fn trusting_home(port: u16, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);
    home
}

fn run_as(home: &ClientHome, port: u16, key: &Path, command: &str) -> CmdOutput {
    skiff_exec(home, port, user(), None)
        .key(key)
        .opt("IdentitiesOnly=yes")
        .cmd(command)
        .run()
}

#[test]
fn a_certificate_beside_the_key_or_named_by_certificate_file() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "user certificates");
    let home = trusting_home(port, &fx);

    // The stranger's key alone is refused.
    let out = run_as(&home, port, &fx.stranger_key.private, "echo never");
    out.expect_skiff_failure(&["authentication failed"], &c);

    // Its certificate beside it lets it in.
    let cert = user_certificate(&ca, &fx.stranger_key, user());
    let out = run_as(&home, port, &fx.stranger_key.private, "echo beside");
    out.expect_code(0, &c).expect_stdout("beside\n", &c);
    assert!(
        sshd.log()
            .contains("Accepted certificate ID \"skiff-test-user\""),
        "{c}"
    );

    // Moved away, it is found through CertificateFile.
    let moved = fx.path().join("elsewhere-cert.pub");
    fs::rename(&cert, &moved).unwrap();
    run_as(&home, port, &fx.stranger_key.private, "echo never")
        .expect_skiff_failure(&["authentication failed"], &c);
    let out = skiff_exec(&home, port, user(), None)
        .key(&fx.stranger_key.private)
        .opt("IdentitiesOnly=yes")
        .opt(&format!("CertificateFile={}", moved.display()))
        .cmd("echo configured")
        .run();
    out.expect_code(0, &c).expect_stdout("configured\n", &c);

    // A certificate for another principal does not let the account in, and
    // the failure lists it among what was tried.
    let other = fx.keygen("other_user", KeyType::Ed25519, None);
    user_certificate(&ca, &other, "somebody-else");
    let out = run_as(&home, port, &other.private, "echo never");
    out.expect_skiff_failure(
        &["authentication failed", "certificate \"skiff-test-user\""],
        &c,
    );
}

#[test]
fn an_rsa_certificate_signs_with_sha2() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "RSA user certificate");
    let home = trusting_home(port, &fx);
    let rsa = fx.keygen("rsa_stranger", KeyType::Rsa, None);
    user_certificate(&ca, &rsa, user());
    let out = run_as(&home, port, &rsa.private, "echo rsa-cert");
    out.expect_code(0, &c).expect_stdout("rsa-cert\n", &c);
    // sshd 8.8+ refuses SHA-1 signatures, so this was rsa-sha2-*.
    assert!(sshd.log().contains("RSA-CERT"), "{c}");
}

#[test]
fn a_certificate_held_by_ssh_agent() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "agent-held user certificate");
    let home = trusting_home(port, &fx);
    user_certificate(&ca, &fx.stranger_key, user());
    let agent = Agent::start();
    // ssh-add loads KEY-cert.pub along with the key.
    agent.add(&fx.stranger_key);
    assert!(
        agent.list().contains("-cert-v01@openssh.com"),
        "{}",
        agent.list()
    );
    // The key file is gone: only the agent can sign.
    fs::remove_file(&fx.stranger_key.private).unwrap();
    let out = skiff_exec(&home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo from-agent")
        .run();
    out.expect_code(0, &c).expect_stdout("from-agent\n", &c);
    assert!(
        sshd.log()
            .contains("Accepted certificate ID \"skiff-test-user\""),
        "{c}"
    );
}

/// A `CertificateFile` whose private key only ssh-agent holds (not the
/// certificate): the agent is asked to sign by the certified key, as ssh
/// asks it.
#[test]
fn a_certificate_file_whose_key_only_the_agent_holds() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "CertificateFile with the key in ssh-agent");
    let home = trusting_home(port, &fx);
    let beside = user_certificate(&ca, &fx.stranger_key, user());
    // Moved away first, so that ssh-add loads the key alone.
    let cert = fx.path().join("elsewhere-cert.pub");
    fs::rename(&beside, &cert).unwrap();
    let agent = Agent::start();
    agent.add(&fx.stranger_key);
    assert!(!agent.list().contains("CERT"), "{}", agent.list());
    fs::remove_file(&fx.stranger_key.private).unwrap();
    let out = skiff_exec(&home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .opt(&format!("CertificateFile={}", cert.display()))
        .cmd("echo certified")
        .run();
    out.expect_code(0, &c).expect_stdout("certified\n", &c);
    assert!(
        sshd.log()
            .contains("Accepted certificate ID \"skiff-test-user\""),
        "{c}"
    );
}

/// Through the agent: a CertificateFile reaches it (and, being part of
/// what a connection was authenticated with, keeps apart the connections
/// it pools).
#[test]
fn through_the_agent() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "user certificate through the agent");
    let agent = AgentHome::new();
    agent.home.trust(port, &fx.host_key);
    let cert = user_certificate(&ca, &fx.stranger_key, user());
    let moved = fx.path().join("elsewhere-cert.pub");
    fs::rename(&cert, &moved).unwrap();
    let out = agent
        .exec(port, &fx.stranger_key)
        .opt("IdentitiesOnly=yes")
        .opt(&format!("CertificateFile={}", moved.display()))
        .cmd("echo via-agent")
        .run();
    out.expect_code(0, &c).expect_stdout("via-agent\n", &c);
    agent
        .exec(port, &fx.stranger_key)
        .opt("IdentitiesOnly=yes")
        .cmd("echo never")
        .run()
        .expect_skiff_failure(&["authentication failed"], &c);
}

/// Signs `key` with `ca` for `principals`, with extra `ssh-keygen -O`
/// options, as `name-cert.pub` beside a copy of the key named `name`.
fn user_certificate_with(
    fx: &Fixture,
    ca: &Key,
    key: &Key,
    name: &str,
    principals: &str,
    options: &[&str],
) -> Key {
    let more: Vec<&str> = options.iter().flat_map(|o| ["-O", o]).collect();
    user_certificate_copy(fx, ca, key, name, (name, principals), &more)
}

/// Like [`user_certificate_with`] with no options and serial `serial`.
fn user_certificate_with_serial(fx: &Fixture, ca: &Key, key: &Key, name: &str, serial: u64) -> Key {
    let serial = serial.to_string();
    user_certificate_copy(fx, ca, key, name, (name, user()), &["-z", &serial])
}

/// skiffd trusting a user CA, server-wide (`TrustedUserCAKeys`) or through
/// a `cert-authority` line of the account's authorized_keys.
fn skiffd_trusting(fx: &Fixture, ca: &Key, server_wide: bool) -> Skiffd {
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if server_wide {
        opts = opts.config(&format!("TrustedUserCAKeys {}\n", ca.public.display()));
    } else {
        fx.authorize_extra(&[format!("cert-authority {}", ca.key_material())]);
    }
    Skiffd::start_with(opts)
}

#[test]
fn skiffd_admits_certificates_from_trusted_cas() {
    if !require_openssh() {
        return;
    }
    for server_wide in [true, false] {
        let fx = Fixture::new();
        let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
        let skiffd = skiffd_trusting(&fx, &ca, server_wide);
        let port = skiffd.port();
        let c = server_context(
            &skiffd,
            &format!("skiffd, TrustedUserCAKeys: {server_wide}"),
        );
        let home = trusting_home(port, &fx);

        // Stock ssh offers KEY-cert.pub with the key.
        let alice = user_certificate_with(&fx, &ca, &fx.stranger_key, "alice", user(), &[]);
        let out = ssh(port, user(), &alice)
            .known_hosts(&home.known_hosts())
            .args(&["echo", "ssh-cert"])
            .run();
        out.expect_code(0, &c).expect_stdout("ssh-cert\n", &c);
        assert!(skiffd.log().contains("ssh2: ED25519-CERT SHA256:"), "{c}");

        // And skiff.
        let out = run_as(&home, port, &alice.private, "echo skiff-cert");
        out.expect_code(0, &c).expect_stdout("skiff-cert\n", &c);

        // Without its certificate the same key is refused, although
        // skiffd lets any key's probe through where a CA is trusted.
        let out = ssh(port, user(), &fx.stranger_key)
            .known_hosts(&home.known_hosts())
            .args(&["echo", "never"])
            .run();
        out.expect_code(255, &c);

        // Another principal, another CA, a source address elsewhere.
        let bob = user_certificate_with(&fx, &ca, &fx.stranger_key, "bob", "bob", &[]);
        let rogue_ca = fx.keygen("rogue_ca", KeyType::Ed25519, None);
        let rogue = user_certificate_with(&fx, &rogue_ca, &fx.stranger_key, "rogue", user(), &[]);
        let far = user_certificate_with(
            &fx,
            &ca,
            &fx.stranger_key,
            "far",
            user(),
            &["source-address=192.0.2.0/24"],
        );
        for key in [&bob, &rogue, &far] {
            let out = ssh(port, user(), key)
                .known_hosts(&home.known_hosts())
                .args(&["echo", "never"])
                .run();
            out.expect_code(255, &c);
            assert_eq!(out.stdout_str(), "", "{c}\n{out}");
        }
        let log = skiffd.log();
        assert!(log.contains("certificate refused"), "{c}");

        // Where the CA is server-wide, an unsigned offer gets the same answer
        // for an account that exists and for one that does not.
        if server_wide {
            for who in [user(), "no-such-account-here"] {
                let out = ssh(port, who, &fx.stranger_key)
                    .known_hosts(&home.known_hosts())
                    .log_level("DEBUG1")
                    .args(&["echo", "never"])
                    .run();
                out.expect_code(255, &c);
                assert!(
                    out.stderr.contains("Server accepts key"),
                    "{c}: the offer for {who} was answered differently\n{out}"
                );
            }
        }
    }
}

#[test]
fn skiffd_enforces_a_certificates_forced_command_and_extensions() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let skiffd = skiffd_trusting(&fx, &ca, true);
    let port = skiffd.port();
    let c = server_context(&skiffd, "forced command");
    let home = trusting_home(port, &fx);
    let forced = user_certificate_with(
        &fx,
        &ca,
        &fx.stranger_key,
        "forced",
        user(),
        &["force-command=echo forced $SSH_ORIGINAL_COMMAND"],
    );
    let out = ssh(port, user(), &forced)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "asked"])
        .run();
    out.expect_code(0, &c)
        .expect_stdout("forced echo asked\n", &c);

    // `clear` drops every extension, permit-pty included.
    let bare = user_certificate_with(&fx, &ca, &fx.stranger_key, "bare", user(), &["clear"]);
    let out = ssh(port, user(), &bare)
        .known_hosts(&home.known_hosts())
        .flag("-tt")
        .args(&["tty"])
        .run();
    assert!(
        out.stderr.contains("PTY allocation request failed")
            && !is_pts_path(out.stdout_str().trim_end()),
        "{c}: a certificate without permit-pty got a terminal\n{out}"
    );
    // With permit-pty (ssh-keygen's default extensions) it gets one.
    let full = user_certificate_with(&fx, &ca, &fx.stranger_key, "full", user(), &[]);
    let out = ssh(port, user(), &full)
        .known_hosts(&home.known_hosts())
        .flag("-tt")
        .args(&["tty"])
        .run();
    out.expect_code(0, &c);
    assert!(is_pts_path(out.stdout_str().trim_end()), "{c}\n{out}");
}

/// With an AuthorizedPrincipalsFile, a certificate from a TrustedUserCAKeys
/// CA must carry one of the principals the file lists (with its options),
/// not the account's name.
#[test]
fn skiffd_maps_principals_through_a_principals_file() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let principals = fx.path().join("principals");
    write_file(
        &principals,
        "# who may log in\ncommand=\"echo as-ops\" ops\n",
        0o644,
    );
    let opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&format!(
        "TrustedUserCAKeys {}\nAuthorizedPrincipalsFile {}\n",
        ca.public.display(),
        principals.display()
    ));
    let skiffd = Skiffd::start_with(opts);
    let port = skiffd.port();
    let c = server_context(&skiffd, "AuthorizedPrincipalsFile");
    let home = trusting_home(port, &fx);

    let ops = user_certificate_with(&fx, &ca, &fx.stranger_key, "ops", "ops", &[]);
    let out = ssh(port, user(), &ops)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "asked"])
        .run();
    out.expect_code(0, &c).expect_stdout("as-ops\n", &c);

    // The account's own name no longer lets a certificate in.
    let named = user_certificate_with(&fx, &ca, &fx.stranger_key, "named", user(), &[]);
    let out = ssh(port, user(), &named)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "never"])
        .run();
    out.expect_code(255, &c);
    assert!(skiffd.log().contains("AuthorizedPrincipalsFile"), "{c}");
}

/// skiffd trusting `ca` (TrustedUserCAKeys) with `RevokedKeys revoked`, and
/// a client home that knows its host key.
fn skiffd_revoking(fx: &Fixture, ca: &Key, revoked: &Path) -> (Skiffd, ClientHome) {
    let opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&format!(
        "TrustedUserCAKeys {}\nRevokedKeys {}\n",
        ca.public.display(),
        revoked.display()
    ));
    let skiffd = Skiffd::start_with(opts);
    let home = trusting_home(skiffd.port(), fx);
    (skiffd, home)
}

/// Stock ssh logs in to `skiffd` with `key` and runs `echo in`.
fn login_to(skiffd: &Skiffd, home: &ClientHome, key: &Key) -> CmdOutput {
    ssh(skiffd.port(), user(), key)
        .known_hosts(&home.known_hosts())
        .args(&["echo", "in"])
        .run()
}

/// RevokedKeys: a listed key may not log in, nor may a certificate for it
/// or one signed by a listed CA; an unreadable list refuses every key.
#[test]
fn skiffd_refuses_revoked_keys() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let revoked = fx.path().join("revoked_keys");
    write_file(&revoked, format!("{}\n", fx.client_key.pub_line()), 0o644);
    let (skiffd, home) = skiffd_revoking(&fx, &ca, &revoked);
    let c = server_context(&skiffd, "RevokedKeys");
    let login = |key: &Key| login_to(&skiffd, &home, key);

    // An authorized key that is revoked, next to one that is not.
    login(&fx.client_key).expect_code(255, &c);
    login(&fx.ecdsa_key).expect_code(0, &c);
    assert!(skiffd.log().contains("revoked in"), "{c}");

    // A certificate is refused when its key or its CA is revoked.
    let good = user_certificate_with(&fx, &ca, &fx.stranger_key, "good", user(), &[]);
    login(&good).expect_code(0, &c);
    let of_revoked = user_certificate_with(&fx, &ca, &fx.client_key, "of-revoked", user(), &[]);
    login(&of_revoked).expect_code(255, &c);
    write_file(&revoked, format!("{}\n", ca.pub_line()), 0o644);
    login(&good).expect_code(255, &c);

    // A list skiffd cannot read (here, gone) refuses every key.
    std::fs::remove_file(&revoked).unwrap();
    login(&fx.ecdsa_key).expect_code(255, &c);
    assert!(skiffd.log().contains("refusing every key"), "{c}");
}

/// RevokedKeys as an OpenSSH key revocation list made by `ssh-keygen -k`:
/// certificates revoked by serial (ranges, a single serial, and scattered
/// serials, which ssh-keygen stores as a bitmap) and by key ID; plain keys
/// by their public key and by their SHA-256 hash. A list skiffd cannot read
/// in full refuses every key.
#[test]
fn skiffd_reads_key_revocation_lists() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let scattered: Vec<String> = (1000..1300)
        .step_by(3)
        .map(|s| format!("serial: {s}\n"))
        .collect();
    let spec = fx.path().join("krl-spec");
    write_file(
        &spec,
        format!(
            "serial: 10-20\nserial: 100\nserial: 5000-900000\n{}id: lost-laptop\nkey: {}\nhash: {}\n",
            scattered.concat(),
            fx.ecdsa_key.pub_line(),
            fx.rsa_key.fingerprint()
        ),
        0o644,
    );
    let krl = fx.path().join("revoked.krl");
    make_krl(&krl, Some(&ca), &spec);
    let (skiffd, home) = skiffd_revoking(&fx, &ca, &krl);
    let c = server_context(&skiffd, "RevokedKeys KRL");
    let login = |key: &Key| login_to(&skiffd, &home, key).code;

    // Plain keys: revoked by key and by hash, next to one that is not.
    assert_eq!(login(&fx.ecdsa_key), 255, "{c}: revoked by key");
    assert_eq!(login(&fx.rsa_key), 255, "{c}: revoked by hash");
    assert_eq!(login(&fx.client_key), 0, "{c}: not revoked");

    // Certificates by serial and by key ID.
    for (serial, revoked) in [
        (9, false),
        (10, true),
        (15, true),
        (20, true),
        (21, false),
        (100, true),
        (1000, true),
        (1003, true),
        (1004, false),
        (1297, true),
        (1300, false),
        (4999, false),
        (5000, true),
        (900_000, true),
        (900_001, false),
    ] {
        let name = format!("serial-{serial}");
        let cert = user_certificate_with_serial(&fx, &ca, &fx.stranger_key, &name, serial);
        let expected = if revoked { 255 } else { 0 };
        assert_eq!(login(&cert), expected, "{c}: certificate serial {serial}");
    }
    let lost = user_certificate_with(&fx, &ca, &fx.stranger_key, "lost-laptop", user(), &[]);
    assert_eq!(login(&lost), 255, "{c}: revoked key ID");
    assert!(skiffd.log().contains("revoked in"), "{c}");

    // A KRL cut short cannot be read in full: every key is refused.
    let bytes = fs::read(&krl).unwrap();
    fs::write(&krl, &bytes[..bytes.len() - 3]).unwrap();
    assert_eq!(login(&fx.client_key), 255, "{c}: truncated KRL");
    assert!(
        skiffd.log().contains("key revocation list: truncated"),
        "{c}: the log says why"
    );
}
