//! skiff against a stock OpenSSH sshd where ssh's behaviour is the
//! reference (issue 22): a server that ends the login after MaxAuthTries
//! refusals is reported as doing so, a path that corrupts a packet is
//! reported as ssh reports it ("Corrupted MAC"), the first of -l and
//! -o User wins as in ssh, and -E sends diagnostics to a file.

use std::time::Duration;

use skiff_testkit::*;

/// A home that trusts `sshd`'s host key.
fn trusting(port: u16, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);
    home
}

#[test]
fn a_login_ended_after_max_auth_tries_says_so() {
    let Some((fx, sshd)) = sshd_setup(&["MaxAuthTries 2"]) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "MaxAuthTries 2, three unknown keys");
    let home = trusting(port, &fx);
    let (a, b) = (
        fx.keygen("unknown_a", KeyType::Ed25519, None),
        fx.keygen("unknown_b", KeyType::Ed25519, None),
    );
    let out = skiff_exec(&home, port, user(), Some(&fx.stranger_key))
        .key(&a.private)
        .key(&b.private)
        .opt("IdentitiesOnly=yes")
        .cmd("true")
        .run();
    out.expect_skiff_failure(
        &[
            "authentication failed",
            "the server closed the connection: Too many authentication failures",
        ],
        &c,
    );
    assert!(!out.stderr.contains("event loop"), "{c}\n{out}");
}

#[test]
fn a_corrupted_packet_is_reported_as_a_bad_mac() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "a path that flips a bit of the server's data");
    let home = trusting(port, &fx);
    let flip = test_peer(env!("CARGO_MANIFEST_DIR"), "skiff", "flip_byte");
    // Far into the command's output, so the flipped byte is in an
    // encrypted packet whatever the key exchange's size.
    let proxy = format!("ProxyCommand={} 127.0.0.1:{port} 100000", flip.display());
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt(&proxy)
        .cmd("head -c 400000 /dev/zero")
        .timeout(Duration::from_secs(60))
        .run();
    assert_eq!(out.code, 255, "{c}\n{out}");
    assert!(
        out.stderr
            .contains("connection lost: Corrupted MAC on input"),
        "{c}\n{out}"
    );
    // The bytes before the bad packet arrived; not all of them.
    assert!(out.stdout.len() < 400_000, "{c}\n{out}");
}

#[test]
fn the_first_user_on_the_command_line_wins_as_in_ssh() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "-o User before -l");
    let home = trusting(port, &fx);
    let skiff_ssh = |args: &[&str]| {
        Run::new(skiff_bin())
            .env("SKIFF_AGENT", "off")
            .env("HOME", home.path())
            .args(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes"])
            .arg("-i")
            .arg(&fx.client_key.private)
            .args(["-p", &port.to_string()])
            .args(args)
            .run()
    };
    // The right user first: -l's wrong one is not used.
    skiff_ssh(&[
        "-o",
        &format!("User={}", user()),
        "-l",
        "nobody-here",
        "127.0.0.1",
        "whoami",
    ])
    .expect_code(0, &c)
    .expect_stdout(&format!("{}\n", user()), &c);
    // And over the destination's user@.
    skiff_ssh(&["-l", user(), "nobody-here@127.0.0.1", "whoami"])
        .expect_code(0, &c)
        .expect_stdout(&format!("{}\n", user()), &c);
}

#[test]
fn diagnostics_go_to_the_file_dash_e_names() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "skiff ssh -E FILE -v");
    let home = trusting(port, &fx);
    let log = home.path().join("skiff.log");
    let out = Run::new(skiff_bin())
        .env("SKIFF_AGENT", "off")
        .env("HOME", home.path())
        .args(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-v", "-E"])
        .arg(&log)
        .arg("-i")
        .arg(&fx.client_key.private)
        .args(["-p", &port.to_string(), "127.0.0.1", "echo", "fine"])
        .run();
    out.expect_code(0, &c).expect_stdout("fine\n", &c);
    assert!(!out.stderr.contains("DEBUG"), "{c}\n{out}");
    let written = std::fs::read_to_string(&log).expect("the log file");
    assert!(written.contains("DEBUG connecting to"), "{c}\n{written}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{c}");
}

#[test]
fn two_keys_where_the_server_requires_two() {
    let Some((fx, sshd)) = sshd_setup(&["AuthenticationMethods publickey,publickey"]) else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "AuthenticationMethods publickey,publickey");
    let home = trusting(port, &fx);
    // Two authorized keys: the first is a partial success, the second ends it.
    skiff_exec(&home, port, user(), Some(&fx.client_key))
        .key(&fx.ecdsa_key.private)
        .opt("IdentitiesOnly=yes")
        .cmd("echo in")
        .run()
        .expect_code(0, &c)
        .expect_stdout("in\n", &c);
    // One authorized key and a stranger: the error says the first step
    // passed and what the server wants next.
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .key(&fx.stranger_key.private)
        .opt("IdentitiesOnly=yes")
        .cmd("echo in")
        .run();
    out.expect_skiff_failure(
        &[
            "authentication failed (publickey)",
            &format!(
                "the server accepted {} as one step but requires more (it goes on with: publickey)",
                fx.client_key.private.display()
            ),
            &format!(
                "accepted none of the other keys: {}",
                fx.stranger_key.private.display()
            ),
        ],
        &c,
    );
}
