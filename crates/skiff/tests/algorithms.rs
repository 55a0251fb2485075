//! KexAlgorithms, Ciphers and MACs against a real OpenSSH sshd that speaks
//! only legacy algorithms: skiff's defaults refuse it, with a message that
//! says so, and reach it once the configuration asks for them by name.

mod common;

use common::*;

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
