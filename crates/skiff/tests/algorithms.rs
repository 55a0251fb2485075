//! KexAlgorithms, Ciphers and MACs against a real OpenSSH sshd that speaks
//! only legacy algorithms: skiff's defaults refuse it, with a message that
//! says so, and reach it once the configuration asks for them by name.

use skiff_testkit::*;

/// An sshd that offers only SHA-1 key exchange, CBC and HMAC-SHA1.
const LEGACY_SSHD: &[&str] = &[
    "KexAlgorithms diffie-hellman-group14-sha1",
    "Ciphers aes128-cbc",
    "MACs hmac-sha1",
];

#[test]
fn legacy_algorithms_only_when_asked_for() {
    let Some((fx, sshd)) = sshd_setup(LEGACY_SSHD) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "legacy sshd");
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);

    let out = skiff_cmd(&home, port, user(), &fx.client_key, "echo never");
    out.expect_skiff_failure(&["handshake failed"], &c);

    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt("KexAlgorithms=+diffie-hellman-group14-sha1")
        .opt("Ciphers=^aes128-cbc")
        .opt("MACs=+hmac-sha1")
        .cmd("echo legacy")
        .run();
    out.expect_code(0, &c).expect_stdout("legacy\n", &c);

    // The same from ~/.ssh/config, for this host only.
    write_file(
        &home.ssh_dir().join("config"),
        format!(
            "Host old\n  HostName 127.0.0.1\n  Port {port}\n  KexAlgorithms diffie-hellman-group14-sha1\n  \
             Ciphers aes*-cbc\n  MACs hmac-sha1*\n"
        ),
        0o600,
    );
    let out = SkiffExec::new(&home, &format!("{}@old", user()))
        .user_config()
        .key(&fx.client_key.private)
        .cmd("echo configured")
        .run();
    out.expect_code(0, &c).expect_stdout("configured\n", &c);
}

#[test]
fn unknown_algorithms_are_configuration_errors() {
    let home = ClientHome::new();
    let out = SkiffExec::new(&home, "somewhere")
        .opt("Ciphers=aes128-gcm@openssh.com,blowfish-cbc")
        .cmd("true")
        .run();
    out.expect_skiff_failure(
        &[
            "command line",
            "Ciphers",
            "unsupported algorithm \"blowfish-cbc\"",
        ],
        "bad Ciphers",
    );
    let out = SkiffExec::new(&home, "somewhere")
        .opt("KexAlgorithms=-*")
        .cmd("true")
        .run();
    out.expect_skiff_failure(
        &["KexAlgorithms", "leaves no algorithm"],
        "empty KexAlgorithms",
    );
}

/// skiffd's own `KexAlgorithms`, `Ciphers`, `MACs` and `HostKeyAlgorithms`:
/// stock ssh negotiates what skiffd's configuration allows and nothing
/// else; a non-AEAD cipher is offered only when the configuration names it.
#[test]
fn skiffd_offers_what_its_configuration_lists() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let start = |config: &str| {
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config))
    };
    let ssh_with = |d: &Skiffd, opts: &[&str]| {
        let mut s = ssh(d.port(), user(), &fx.client_key).log_level("DEBUG1");
        for o in opts {
            s = s.opt(o);
        }
        s.args(&["echo", "in"]).run()
    };
    let refused = |d: &Skiffd, opt: &str, c: &str| {
        let out = ssh_with(d, &[opt]);
        assert_eq!(out.code, 255, "{c}: {opt} must fail\n{out}");
        assert!(out.stderr.contains("no matching"), "{c}: {opt}\n{out}");
    };

    // By default: AEAD ciphers only.
    let d = start("");
    let c = server_context(&d, "skiffd, default lists");
    refused(&d, "Ciphers=aes256-ctr", &c);

    let d = start(
        "KexAlgorithms curve25519-sha256\nCiphers aes256-ctr\nMACs hmac-sha2-512-etm@openssh.com\n",
    );
    let c = server_context(&d, "skiffd with algorithm lists");
    // Stock ssh's defaults meet the only algorithms listed.
    let out = ssh_with(&d, &[]);
    out.expect_code(0, &c).expect_stdout("in\n", &c);
    assert!(
        out.stderr.contains("kex: algorithm: curve25519-sha256")
            && out
                .stderr
                .contains("cipher: aes256-ctr MAC: hmac-sha2-512-etm@openssh.com"),
        "{c}: negotiated\n{out}"
    );
    // What skiffd no longer offers cannot be had.
    for opt in [
        "KexAlgorithms=ecdh-sha2-nistp256",
        "Ciphers=aes128-gcm@openssh.com",
        "MACs=hmac-sha2-256-etm@openssh.com",
    ] {
        refused(&d, opt, &c);
    }

    // Host key algorithms: an ed25519 host key with only RSA signatures
    // allowed leaves nothing to agree on.
    let d = start("HostKeyAlgorithms rsa-sha2-512,rsa-sha2-256\n");
    let c = server_context(&d, "skiffd, RSA host key algorithms only");
    let out = ssh_with(&d, &[]);
    assert_eq!(out.code, 255, "{c}\n{out}");
    assert!(
        out.stderr.contains("no matching host key type"),
        "{c}\n{out}"
    );
}

#[test]
fn skiffd_refuses_unknown_algorithms_naming_the_line() {
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    write_file(
        &config,
        "# algorithms\nCiphers aes128-gcm@openssh.com,blowfish-cbc\n",
        0o644,
    );
    let out = skiffd_with_bad_config(&fx.host_key, &config);
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains(&format!("{}:2", config.display()))
            && out
                .stderr
                .contains("unsupported algorithm \"blowfish-cbc\""),
        "skiffd names the file, the line and the name\n{out}"
    );
}

/// `RequiredRSASize`: skiff refuses a smaller RSA host key and does not
/// offer a smaller RSA identity; skiffd refuses a smaller RSA user key.
/// (ssh-keygen makes 3072-bit keys; 4096 is asked for.)
#[test]
fn required_rsa_size_on_both_sides() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let rsa_host = fx.keygen("host_rsa", KeyType::Rsa, None);
    let rsa_server = Skiffd::start_with(SkiffdOptions::new(&rsa_host, &fx.authorized_keys));
    let home = ClientHome::new();
    home.trust(rsa_server.port(), &rsa_host);
    let c = server_context(&rsa_server, "RSA host key");
    skiff_exec(&home, rsa_server.port(), user(), Some(&fx.client_key))
        .cmd("echo ok")
        .run()
        .expect_code(0, &c)
        .expect_stdout("ok\n", &c);
    skiff_exec(&home, rsa_server.port(), user(), Some(&fx.client_key))
        .opt("RequiredRSASize=4096")
        .cmd("echo ok")
        .run()
        .expect_skiff_failure(&["3072 bits", "RequiredRSASize (4096)"], "small host key");

    // An RSA identity below the size is not offered.
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    home.trust(d.port(), &fx.host_key);
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.rsa_key))
        .opt("IdentitiesOnly=yes")
        .opt("RequiredRSASize=4096")
        .cmd("true")
        .run();
    out.expect_skiff_failure(&["RequiredRSASize"], "small identity");
    assert!(
        !d.log().contains("accepted publickey"),
        "{}",
        server_context(&d, "no login")
    );

    // skiffd refuses it when its own RequiredRSASize says so.
    let strict = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("RequiredRSASize 4096\n"),
    );
    let out = ssh_cmd(strict.port(), user(), &fx.rsa_key, &["true"]);
    assert_eq!(out.code, 255, "{out}");
    assert!(
        strict.log().contains("fewer than RequiredRSASize (4096)"),
        "{}",
        server_context(&strict, "skiffd RequiredRSASize")
    );
    ssh_cmd(strict.port(), user(), &fx.client_key, &["true"]).expect_code(0, "ed25519 still works");
}

/// `PubkeyAcceptedAlgorithms` narrows the user keys skiffd accepts, for
/// every login or per `Match` block, as sshd's does.
#[test]
fn skiffd_accepts_only_the_listed_user_key_algorithms() {
    let config = "PubkeyAcceptedAlgorithms ssh-ed25519,ecdsa-sha2-*\n\
                  Match User someone-else\n  PubkeyAcceptedAlgorithms rsa-sha2-*\n";
    let Some((fx, [], d)) = skiffd_configured(Some(config), []) else {
        return;
    };
    let c = || server_context(&d, "PubkeyAcceptedAlgorithms");
    let login = |d: &Skiffd, key: &Key| ssh(d.port(), user(), key).args(&["echo in"]).run();
    for key in [&fx.client_key, &fx.ecdsa_key] {
        login(&d, key)
            .expect_code(0, &c())
            .expect_stdout("in\n", &c());
    }
    let out = login(&d, &fx.rsa_key);
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(
        d.log()
            .contains("rsa-sha2-512 is not among PubkeyAcceptedAlgorithms"),
        "{}",
        c()
    );
    drop(d);

    // A Match block for this user narrows it further.
    let config = format!(
        "Match User {}\n  PubkeyAcceptedAlgorithms ssh-ed25519\n",
        user()
    );
    let Some((fx, [], d)) = skiffd_configured(Some(&config), []) else {
        return;
    };
    let c = || server_context(&d, "PubkeyAcceptedAlgorithms in a Match block");
    login(&d, &fx.client_key).expect_code(0, &c());
    let out = login(&d, &fx.ecdsa_key);
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(
        d.log()
            .contains("ecdsa-sha2-nistp256 is not among PubkeyAcceptedAlgorithms"),
        "{}",
        c()
    );
}
