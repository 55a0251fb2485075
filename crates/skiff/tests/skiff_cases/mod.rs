//! skiff client test cases shared by `skiff_to_sshd.rs` (real OpenSSH
//! server) and `skiff_to_skiffd.rs` (our own server).
//!
//! Each case takes the running server and the [`Fixture`] whose
//! authorized_keys the server uses, and asserts real content: exact
//! output, exit codes, checksums, known_hosts entries.
//! [`skiff_client_tests!`](crate::skiff_client_tests) turns every case
//! into a `#[test]` for one kind of server.

use std::fs;
use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// Defines one `#[test]` per shared case, each getting its fixture and
/// server from `$setup()` (which returns `None` to skip, see
/// [`require_openssh`]).
#[macro_export]
macro_rules! skiff_client_tests {
    ($setup:path) => {
        $crate::skiff_client_tests!(@each $setup;
            exec_stdout_stderr => exec_stdout_stderr,
            exec_big_stdin_checksum => exec_big_stdin,
            exec_round_trip_cat => exec_round_trip,
            exec_exit_codes => exec_exit_codes,
            exec_signal_exit_code => exec_signal,
            exec_stdin_null_flag => exec_stdin_null_flag,
            exec_user_env => exec_user_env,
            exec_pty => exec_pty,
            exec_pty_refused => exec_pty_refused,
            client_key_types => client_key_types,
            unknown_key_rejected => unknown_key_rejected,
            hashed_known_hosts => hashed_known_hosts,
            accept_new_hashed => accept_new_hashed,
            strict_yes_unknown_host => strict_yes_unknown_host,
            agent_auth => agent_auth,
            encrypted_key_askpass => encrypted_key_askpass,
            encrypted_key_batch_mode => encrypted_key_batch_mode,
            passphrase_asked_only_for_an_accepted_key => passphrase_asked_only_for_an_accepted_key,
            config_alias_include => config_alias_include,
        );

        #[test]
        fn known_hosts_accept_new_then_changed() {
            let Some((fx, mut server)) = $setup() else {
                return;
            };
            $crate::skiff_cases::known_hosts_accept_new_then_changed(&mut server, &fx);
        }
    };
    (@each $setup:path; $($test:ident => $case:ident,)*) => {
        $(
            #[test]
            fn $test() {
                let Some((fx, server)) = $setup() else { return };
                $crate::skiff_cases::$case(&server, &fx);
            }
        )*
    };
}

/// A client home that already trusts the server's host key.
pub fn trusted_home(server: &dyn Daemon, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    home.trust(server.port(), &fx.host_key);
    home
}

/// stdout and stderr arrive separately and byte-exact.
pub fn exec_stdout_stderr(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .cmd("echo out1; echo err1 >&2; echo out2; printf tail")
        .run();
    let c = ctx(server, "stdout/stderr");
    out.expect_code(0, &c).expect_stdout("out1\nout2\ntail", &c);
    assert_eq!(
        out.stderr, "err1\n",
        "{c}: stderr must hold exactly err1\n{out}"
    );

    // -v diagnostics go to stderr only; stdout stays exact.
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .flag("-v")
        .cmd("echo out1; echo err1 >&2")
        .run();
    let c = ctx(server, "stdout/stderr with -v");
    out.expect_code(0, &c).expect_stdout("out1\n", &c);
    assert!(out.stderr.contains("err1\n"), "{c}\n{out}");
}

/// 100 MB of random stdin reaches the remote `sha256sum` intact.
pub fn exec_big_stdin(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let scratch = tempdir();
    let big = scratch.path().join("big.bin");
    let want = random_file(&big, BIG);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .cmd("sha256sum")
        .input(Input::File(big.clone()))
        .timeout(BULK_TIMEOUT)
        .run();
    let c = ctx(server, "100 MB stdin -> sha256sum");
    out.expect_code(0, &c);
    assert_eq!(
        first_token(&out.stdout),
        want,
        "{c}: checksum mismatch\n{out}"
    );
}

/// 10 MB round-trip through remote `cat` byte for byte (stdin and stdout
/// flowing at the same time).
pub fn exec_round_trip(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let scratch = tempdir();
    let mid = scratch.path().join("mid.bin");
    random_file(&mid, 10 * 1024 * 1024);
    let data = fs::read(&mid).expect("read mid.bin");
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .cmd("cat")
        .input(Input::File(mid.clone()))
        .timeout(ROUND_TRIP_TIMEOUT)
        .run();
    let c = ctx(server, "10 MB round trip through cat");
    out.expect_code(0, &c);
    assert_eq!(out.stdout.len(), data.len(), "{c}: length differs\n{out}");
    assert!(out.stdout == data, "{c}: content differs");
}

/// The remote exit status becomes skiff's exit code; `--`, command words
/// and `-l USER` work.
pub fn exec_exit_codes(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let port = server.port();
    for (cmd, code) in [("true", 0), ("false", 1), ("exit 7", 7), ("exit 255", 255)] {
        let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
            .cmd(cmd)
            .run();
        out.expect_code(code, &ctx(server, cmd))
            .expect_stdout("", cmd);
    }

    // Command words are joined with spaces, as ssh does.
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .dashdash()
        .args(&["echo", "a", "b"])
        .run();
    out.expect_code(0, &ctx(server, "-- echo a b"))
        .expect_stdout("a b\n", "-- echo a b");
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .dashdash()
        .args(&["exit", "42"])
        .run();
    out.expect_code(42, &ctx(server, "-- exit 42"));

    // -l USER with a bare host.
    let out = SkiffExec::new(&home, "127.0.0.1")
        .port(port)
        .login(user())
        .key(&fx.client_key.private)
        .cmd("id -un; exit 3")
        .run();
    out.expect_code(3, &ctx(server, "-l USER"))
        .expect_stdout(&format!("{}\n", user()), "-l USER");
}

/// Death by signal N gives exit code 128+N.
pub fn exec_signal(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    for (cmd, code) in [("kill -9 $$", 137), ("kill -TERM $$", 143)] {
        let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
            .cmd(cmd)
            .run();
        out.expect_code(code, &ctx(server, cmd))
            .expect_stdout("", cmd);
    }
}

/// Without `-n` stdin is forwarded; with `-n` the remote sees EOF at once.
pub fn exec_stdin_null_flag(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .cmd("cat; echo done")
        .input(Input::Bytes(b"hello\n".to_vec()))
        .run();
    out.expect_code(0, &ctx(server, "stdin forwarded"))
        .expect_stdout("hello\ndone\n", "stdin forwarded");
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .flag("-n")
        .cmd("cat; echo done")
        .input(Input::Bytes(b"hello\n".to_vec()))
        .run();
    out.expect_code(0, &ctx(server, "-n"))
        .expect_stdout("done\n", "-n");
}

/// The command runs as the account, with its login environment.
pub fn exec_user_env(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .cmd(USER_ENV_SCRIPT)
        .run();
    check_user_env(&out, server.port(), &ctx(server, "user environment"));
}

/// `-tt` forces a pseudo-terminal without a local one and passes TERM;
/// `-t` alone does not (stdin is not a terminal), nor does no flag.
pub fn exec_pty(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let run = |flag: Option<&str>| {
        let mut exec = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
            .env("TERM", "xterm")
            .cmd("tty; echo $TERM");
        if let Some(f) = flag {
            exec = exec.flag(f);
        }
        exec.run()
    };

    let out = run(Some("-tt"));
    let c = ctx(server, "skiff exec -tt");
    out.expect_code(0, &c);
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert_eq!(lines.len(), 2, "{c}: expected two lines\n{out}");
    assert!(is_pts_path(lines[0]), "{c}: expected /dev/pts/N\n{out}");
    assert_eq!(lines[1], "xterm", "{c}: TERM\n{out}");
    assert!(
        text.contains("\r\n"),
        "{c}: a pty turns \\n into \\r\\n\n{out}"
    );

    assert_eq!(out.stderr, "", "{c}: nothing on skiff's stderr\n{out}");

    // Without a pty the server sets no TERM.
    let out = run(Some("-t"));
    let c = ctx(server, "skiff exec -t without a local terminal");
    out.expect_code(0, &c).expect_stdout("not a tty\n\n", &c);
    assert!(
        out.stderr
            .contains("Pseudo-terminal will not be allocated because stdin is not a terminal"),
        "{c}: skiff should say why there is no pty\n{out}"
    );

    let out = run(None);
    let c = ctx(server, "skiff exec without -t");
    out.expect_code(0, &c).expect_stdout("not a tty\n\n", &c);
    assert_eq!(out.stderr, "", "{c}\n{out}");
}

/// A key with `no-pty`: the server refuses the pty that `-tt` asks for.
/// As with OpenSSH's `ssh -tt`, a forced terminal that is refused is fatal:
/// exit 255, one `skiff: ` line, and the command does not run.
pub fn exec_pty_refused(server: &dyn Daemon, fx: &Fixture) {
    // Both servers read authorized_keys at each login.
    let [no_pty] = fx.keys_with_options([("no_pty", "no-pty")]);
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&no_pty))
        .opt("IdentitiesOnly=yes")
        .flag("-tt")
        .env("TERM", "xterm")
        .cmd("echo ran")
        .run();
    let c = ctx(server, "skiff exec -tt with a no-pty key");
    out.expect_code(255, &c).expect_stdout("", &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one error line expected\n{out}");
    assert!(
        lines[0].starts_with("skiff: ") && lines[0].contains("PTY allocation request failed"),
        "{c}: skiff must report the refused pty\n{out}"
    );
}

/// RSA and ECDSA client keys work as well as ed25519.
pub fn client_key_types(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    for key in [&fx.client_key, &fx.rsa_key, &fx.ecdsa_key] {
        let what = format!("{:?} client key", key.kind);
        let out = skiff_exec(&home, server.port(), user(), Some(key))
            .opt("IdentitiesOnly=yes")
            .cmd("echo key-ok")
            .run();
        out.expect_code(0, &ctx(server, &what))
            .expect_stdout("key-ok\n", &what);
    }
}

/// A key the server does not know: exit 255, one `skiff: ` line about
/// authentication, command not run.
pub fn unknown_key_rejected(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.stranger_key))
        .opt("IdentitiesOnly=yes")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["authentication"], &ctx(server, "unknown key"));
}

/// Default StrictHostKeyChecking=accept-new records the host key in a new
/// ~/.ssh/known_hosts (0600); a later host key change is refused with both
/// fingerprints and the file:line of the stored entry.
pub fn known_hosts_accept_new_then_changed(server: &mut dyn Daemon, fx: &Fixture) {
    let home = ClientHome::new();
    let kh = home.known_hosts();
    let port = server.port();
    assert!(!kh.exists());

    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .cmd("echo first")
        .run();
    out.expect_code(0, &ctx(server, "accept-new first contact"))
        .expect_stdout("first\n", "accept-new first contact");
    assert!(kh.is_file(), "accept-new must create {}", kh.display());
    assert_eq!(
        format!("{:o}", file_mode(&kh)),
        "600",
        "known_hosts must be created 0600"
    );
    let entries = known_hosts_lookup(&kh, port);
    assert_eq!(
        entries.len(),
        1,
        "exactly one entry for {} expected in:\n{}",
        known_hosts_name(port),
        fs::read_to_string(&kh).unwrap_or_default()
    );
    assert_eq!(
        known_hosts_entry_key(&entries[0]),
        fx.host_key.key_material(),
        "recorded key must be the server's host key"
    );

    // Second contact: known key, nothing appended.
    let before = fs::read(&kh).expect("read known_hosts");
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .cmd("echo second")
        .run();
    out.expect_code(0, &ctx(server, "known host"))
        .expect_stdout("second\n", "known host");
    assert_eq!(
        fs::read(&kh).expect("read known_hosts"),
        before,
        "known_hosts must not change for a known host"
    );

    // Push the entry to line 2 so that the reported line number means
    // something (comment lines count, as in OpenSSH).
    let mut text = b"# skiff test comment\n".to_vec();
    text.extend_from_slice(&before);
    write_file(&kh, &text, 0o600);

    let new_key = fx.keygen(&format!("host_rotated_{port}"), KeyType::Ed25519, None);
    server.restart_with_host_key(&new_key);
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .cmd("echo should-not-run")
        .run();
    let c = ctx(server, "changed host key");
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}: command must not run\n{out}");
    let old_fp = fx.host_key.fingerprint();
    let new_fp = new_key.fingerprint();
    assert!(
        out.stderr.contains(&old_fp),
        "{c}: old fingerprint {old_fp} missing\n{out}"
    );
    assert!(
        out.stderr.contains(&new_fp),
        "{c}: new fingerprint {new_fp} missing\n{out}"
    );
    let abs = format!("{}:2", kh.display());
    assert!(
        out.stderr.contains(&abs) || out.stderr.contains("~/.ssh/known_hosts:2"),
        "{c}: stderr must name {abs}\n{out}"
    );
    assert!(
        out.stderr_lines()
            .iter()
            .any(|l| l.starts_with("skiff: ") && l.to_lowercase().contains("host key")),
        "{c}: expected a `skiff: ` line about the host key\n{out}"
    );
    assert_eq!(
        fs::read(&kh).expect("read known_hosts"),
        text,
        "{c}: known_hosts must not be modified on mismatch"
    );
}

/// An entry hashed by `ssh-keygen -H` is honoured, and a hashed entry for
/// another host:port does not match.
pub fn hashed_known_hosts(server: &dyn Daemon, fx: &Fixture) {
    let home = ClientHome::new();
    let port = server.port();
    let hash = |name: &str, host_port: u16| {
        let path = home.path().join(name);
        write_file(
            &path,
            format!("{}\n", known_hosts_line(host_port, &fx.host_key)),
            0o600,
        );
        let out = Run::new("ssh-keygen").arg("-H").arg("-f").arg(&path).run();
        out.expect_code(0, "ssh-keygen -H");
        let text = fs::read_to_string(&path).expect("read hashed file");
        assert!(
            text.starts_with("|1|") && !text.contains("127.0.0.1"),
            "ssh-keygen -H did not hash: {text:?}"
        );
        path
    };
    let good = hash("kh_hashed", port);
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt(&format!("UserKnownHostsFile={}", good.display()))
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo hashed-ok")
        .run();
    out.expect_code(0, &ctx(server, "hashed known_hosts"))
        .expect_stdout("hashed-ok\n", "hashed known_hosts");

    let other_port = if port == 65535 { 65534 } else { port + 1 };
    let wrong = hash("kh_hashed_other", other_port);
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt(&format!("UserKnownHostsFile={}", wrong.display()))
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["host key"], &ctx(server, "hashed entry for another port"));
}

/// `-o HashKnownHosts=yes` with accept-new records a hashed entry.
pub fn accept_new_hashed(server: &dyn Daemon, fx: &Fixture) {
    let home = ClientHome::new();
    let port = server.port();
    let kh = home.path().join("kh_new");
    let out = skiff_exec(&home, port, user(), Some(&fx.client_key))
        .opt(&format!("UserKnownHostsFile={}", kh.display()))
        .opt("StrictHostKeyChecking=accept-new")
        .opt("HashKnownHosts=yes")
        .cmd("echo hashed-new")
        .run();
    out.expect_code(0, &ctx(server, "HashKnownHosts=yes"))
        .expect_stdout("hashed-new\n", "HashKnownHosts=yes");
    let text = fs::read_to_string(&kh).expect("known_hosts written");
    assert!(
        text.starts_with("|1|") && !text.contains("127.0.0.1"),
        "entry must be hashed: {text:?}"
    );
    let entries = known_hosts_lookup(&kh, port);
    assert_eq!(
        entries.len(),
        1,
        "ssh-keygen -F must find the hashed entry: {text:?}"
    );
    assert_eq!(
        known_hosts_entry_key(&entries[0]),
        fx.host_key.key_material()
    );
}

/// StrictHostKeyChecking=yes with an empty known_hosts refuses to connect
/// and writes nothing.
pub fn strict_yes_unknown_host(server: &dyn Daemon, fx: &Fixture) {
    let home = ClientHome::new();
    let kh = home.known_hosts();
    write_file(&kh, "", 0o600);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.client_key))
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["host key"], &ctx(server, "StrictHostKeyChecking=yes"));
    assert_eq!(
        fs::read(&kh).expect("read known_hosts"),
        b"",
        "known_hosts must stay empty"
    );
}

/// Signing through ssh-agent: via SSH_AUTH_SOCK, via IdentityAgent=PATH,
/// and IdentityAgent=none disables the agent.
pub fn agent_auth(server: &dyn Daemon, fx: &Fixture) {
    let agent = Agent::start();
    agent.add(&fx.client_key);
    assert!(agent.list().contains(&fx.client_key.key_material()));
    let home = trusted_home(server, fx);
    let port = server.port();

    let out = skiff_exec(&home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo via-agent")
        .run();
    out.expect_code(0, &ctx(server, "SSH_AUTH_SOCK"))
        .expect_stdout("via-agent\n", "SSH_AUTH_SOCK");

    let out = skiff_exec(&home, port, user(), None)
        .opt(&format!("IdentityAgent={}", agent.sock.display()))
        .cmd("echo via-identity-agent")
        .run();
    out.expect_code(0, &ctx(server, "IdentityAgent=PATH"))
        .expect_stdout("via-identity-agent\n", "IdentityAgent=PATH");

    let out = skiff_exec(&home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .opt("IdentityAgent=none")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["authentication"], &ctx(server, "IdentityAgent=none"));
}

/// An encrypted key unlocked through SSH_ASKPASS with
/// SSH_ASKPASS_REQUIRE=force; a wrong passphrase fails with 255.
pub fn encrypted_key_askpass(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    // Runs `command` with an askpass program answering `passphrase`;
    // returns the result and whether the program was called.
    let run_with = |passphrase: &str, command: &str| {
        let dir = tempdir();
        let marker = dir.path().join("askpass.log");
        let script = askpass_script(dir.path(), passphrase, &marker);
        let out = skiff_exec(&home, server.port(), user(), Some(&fx.encrypted_key))
            .interactive()
            .opt("IdentitiesOnly=yes")
            .askpass(&script)
            .cmd(command)
            .run();
        let called = fs::read_to_string(&marker)
            .unwrap_or_default()
            .contains("askpass called");
        (out, called)
    };

    let (out, called) = run_with(PASSPHRASE, "echo unlocked");
    out.expect_code(0, &ctx(server, "askpass"))
        .expect_stdout("unlocked\n", "askpass");
    assert!(called, "askpass program was not run");

    let (out, _) = run_with("wrongpassphrase", "echo should-not-run");
    let c = ctx(server, "askpass wrong passphrase");
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}\n{out}");
    assert!(
        out.stderr_lines().iter().any(|l| l.starts_with("skiff: ")),
        "{c}: expected a `skiff: ` error line\n{out}"
    );
}

/// As with ssh, a key file is offered by its public half and its
/// passphrase asked for only once the server accepts it: an encrypted key
/// the server does not know costs no question, and an encrypted key
/// without a `.pub` beside it is offered from the key file's clear public
/// section.
pub fn passphrase_asked_only_for_an_accepted_key(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let dir = tempdir();
    let marker = dir.path().join("askpass.log");
    let script = askpass_script(dir.path(), PASSPHRASE, &marker);
    let unknown = keygen(
        dir.path(),
        "unknown_encrypted",
        KeyType::Ed25519,
        Some(PASSPHRASE),
    );
    let out = skiff_exec(&home, server.port(), user(), Some(&unknown))
        .key(&fx.client_key.private)
        .interactive()
        .opt("IdentitiesOnly=yes")
        .askpass(&script)
        .cmd("echo second-key")
        .run();
    let c = ctx(server, "unknown encrypted key first");
    out.expect_code(0, &c).expect_stdout("second-key\n", &c);
    assert!(
        !marker.exists(),
        "{c}: no passphrase asked for a key the server refused\n{out}"
    );

    let lone = dir.path().join("lone_encrypted");
    fs::copy(&fx.encrypted_key.private, &lone).unwrap();
    fs::set_permissions(&lone, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = skiff_exec(&home, server.port(), user(), None)
        .key(&lone)
        .interactive()
        .opt("IdentitiesOnly=yes")
        .askpass(&script)
        .cmd("echo lone-key")
        .run();
    let c = ctx(server, "encrypted key without .pub");
    out.expect_code(0, &c).expect_stdout("lone-key\n", &c);
    let calls = fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(calls.lines().count(), 1, "{c}: asked once\n{calls}\n{out}");

    // A `.pub` that belongs to another key: the server accepts what was
    // offered, and skiff refuses to sign with a key that does not match it.
    let mismatched = dir.path().join("mismatched");
    fs::copy(&fx.stranger_key.private, &mismatched).unwrap();
    fs::copy(&fx.client_key.public, dir.path().join("mismatched.pub")).unwrap();
    let out = skiff_exec(&home, server.port(), user(), None)
        .key(&mismatched)
        .opt("IdentitiesOnly=yes")
        .cmd("echo should-not-run")
        .run();
    let c = ctx(server, "private key not matching its .pub");
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}\n{out}");
    assert!(
        out.stderr.contains("does not match its public key"),
        "{c}\n{out}"
    );
}

/// An encrypted key under BatchMode without an agent: exit 255 and a
/// message about the passphrase. With the key loaded into an agent the
/// same invocation succeeds.
pub fn encrypted_key_batch_mode(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.encrypted_key))
        .opt("IdentitiesOnly=yes")
        .cmd("echo should-not-run")
        .run();
    let c = ctx(server, "encrypted key, BatchMode, no agent");
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}\n{out}");
    assert!(
        out.stderr_lines().iter().any(|l| l.starts_with("skiff: ")),
        "{c}: expected a `skiff: ` error line\n{out}"
    );
    assert!(
        out.stderr.to_lowercase().contains("passphrase"),
        "{c}: message must mention the passphrase\n{out}"
    );

    let agent = Agent::start();
    let dir = tempdir();
    let script = askpass_script(dir.path(), PASSPHRASE, &dir.path().join("log"));
    agent.add_encrypted(&fx.encrypted_key, &script);
    let out = skiff_exec(&home, server.port(), user(), Some(&fx.encrypted_key))
        .opt("IdentitiesOnly=yes")
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo agent-signed")
        .run();
    out.expect_code(0, &ctx(server, "encrypted key, BatchMode, agent holds it"))
        .expect_stdout("agent-signed\n", "encrypted key via agent");
}

/// `skiff exec ALIAS cmd` resolves HostName/Port/User from ~/.ssh/config
/// and IdentityFile from a file pulled in with `Include`; `-F FILE` works
/// too.
pub fn config_alias_include(server: &dyn Daemon, fx: &Fixture) {
    let home = trusted_home(server, fx);
    let port = server.port();
    let ssh_dir = home.ssh_dir();
    write_file(
        &ssh_dir.join("config"),
        format!(
            "# skiff test config\n\
             Include extra.conf\n\
             \n\
             Host skiff-alias\n\
             \x20   HostName 127.0.0.1\n\
             \x20   Port {port}\n\
             \x20   User {user}\n\
             \x20   StrictHostKeyChecking yes\n",
            user = user()
        ),
        0o600,
    );
    // Relative Include paths are resolved against ~/.ssh, as in OpenSSH.
    write_file(
        &ssh_dir.join("extra.conf"),
        format!(
            "Host skiff-alias\n    IdentityFile {}\n    IdentitiesOnly yes\n",
            fx.client_key.private.display()
        ),
        0o600,
    );
    let out = SkiffExec::new(&home, "skiff-alias")
        .user_config()
        .cmd("echo alias-ok; id -un")
        .run();
    out.expect_code(0, &ctx(server, "~/.ssh/config alias + Include"))
        .expect_stdout(&format!("alias-ok\n{}\n", user()), "config alias");

    let alt = home.path().join("alt.conf");
    write_file(
        &alt,
        format!(
            "Host skiff-alt\n    HostName 127.0.0.1\n    Port {port}\n    User {}\n    IdentityFile {}\n    IdentitiesOnly yes\n    StrictHostKeyChecking yes\n",
            user(),
            fx.client_key.private.display()
        ),
        0o600,
    );
    let out = SkiffExec::new(&home, "skiff-alt")
        .config(&alt)
        .cmd("echo alt-ok")
        .timeout(Duration::from_secs(60))
        .run();
    out.expect_code(0, &ctx(server, "-F FILE"))
        .expect_stdout("alt-ok\n", "-F FILE");
}
