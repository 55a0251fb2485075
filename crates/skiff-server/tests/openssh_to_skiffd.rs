//! Stock OpenSSH `ssh` client -> skiffd server.
//!
//! Every test starts its own skiffd on a free 127.0.0.1 port and drives it
//! with the real `ssh` binary (`-F /dev/null`, BatchMode, IdentitiesOnly).
//! Expectations follow what `ssh` does against a real sshd (checked in
//! `crates/skiff/tests/skiff_to_sshd.rs::harness_sanity` and by hand),
//! e.g. signal death -> 255.

use std::fs;

use skiff_testkit::server_context as ctx;
use skiff_testkit::skiffd_setup as setup;
use skiff_testkit::*;

#[test]
fn exec_stdout_stderr() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh_cmd(
        d.port(),
        user(),
        &fx.client_key,
        &["echo out1; echo err1 >&2; echo out2; printf tail"],
    );
    let c = ctx(&d, "stdout/stderr");
    out.expect_code(0, &c).expect_stdout("out1\nout2\ntail", &c);
    assert_eq!(out.stderr, "err1\n", "{c}\n{out}");
}

/// 100 MB of random stdin -> remote sha256sum.
#[test]
fn exec_big_stdin_checksum() {
    let Some((fx, d)) = setup() else { return };
    let scratch = tempdir();
    let big = scratch.path().join("big.bin");
    let want = random_file(&big, BIG);
    let out = ssh(d.port(), user(), &fx.client_key)
        .args(&["sha256sum"])
        .input(Input::File(big.clone()))
        .timeout(BULK_TIMEOUT)
        .run();
    let c = ctx(&d, "100 MB stdin -> sha256sum");
    out.expect_code(0, &c);
    assert_eq!(
        first_token(&out.stdout),
        want,
        "{c}: checksum mismatch\n{out}"
    );
}

/// A command's stdin is a pipe of 1 MiB, not the kernel's 64 KiB: with
/// one async worker per connection process, the smaller pipe made uploads
/// through a channel wait on the command every two packets. The command
/// asks the kernel (`F_GETPIPE_SZ` is 1032; perl is in Debian's base
/// system).
#[test]
fn a_commands_stdin_pipe_holds_a_mebibyte() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh_cmd(
        d.port(),
        user(),
        &fx.client_key,
        &["perl -e 'print fcntl(STDIN, 1032, 0)'"],
    );
    let c = ctx(&d, "stdin pipe size");
    out.expect_code(0, &c).expect_stdout("1048576", &c);
}

/// 10 MB round trip through remote cat (stdin and stdout flowing at once).
#[test]
fn exec_round_trip_cat() {
    let Some((fx, d)) = setup() else { return };
    let scratch = tempdir();
    let mid = scratch.path().join("mid.bin");
    random_file(&mid, 10 * 1024 * 1024);
    let data = fs::read(&mid).expect("read mid.bin");
    let out = ssh(d.port(), user(), &fx.client_key)
        .args(&["cat"])
        .input(Input::File(mid.clone()))
        .timeout(ROUND_TRIP_TIMEOUT)
        .run();
    let c = ctx(&d, "10 MB round trip through cat");
    out.expect_code(0, &c);
    assert_eq!(out.stdout.len(), data.len(), "{c}: length differs\n{out}");
    assert!(out.stdout == data, "{c}: content differs");
}

#[test]
fn exec_exit_codes() {
    let Some((fx, d)) = setup() else { return };
    for (cmd, code) in [("true", 0), ("false", 1), ("exit 7", 7)] {
        ssh_cmd(d.port(), user(), &fx.client_key, &[cmd])
            .expect_code(code, &ctx(&d, cmd))
            .expect_stdout("", cmd);
    }
}

/// Remote death by signal: ssh exits 255 (its convention when it gets
/// exit-signal instead of exit-status) and prints nothing; with -v we can
/// see that skiffd really sent an exit-signal request.
#[test]
fn exec_signal() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh_cmd(d.port(), user(), &fx.client_key, &["kill -9 $$"]);
    let c = ctx(&d, "kill -9");
    out.expect_code(255, &c).expect_stdout("", &c);
    assert_eq!(
        out.stderr, "",
        "{c}: ssh prints nothing for signal death\n{out}"
    );

    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-v")
        .args(&["kill -9 $$"])
        .run();
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains("rtype exit-signal"),
        "{c}: skiffd must send an exit-signal channel request\n{out}"
    );
}

/// LANG / LC_* are accepted by default; other names are not. AcceptEnv in
/// the --config file adds names.
#[test]
fn env_passing() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt("SetEnv=LC_FOO=bar LANG=C.UTF-8 SKIFF_NOT_ALLOWED=x")
        .args(&[r#"echo "$LC_FOO|$LANG|${SKIFF_NOT_ALLOWED-unset}""#])
        .run();
    out.expect_code(0, &ctx(&d, "SetEnv"))
        .expect_stdout("bar|C.UTF-8|unset\n", "SetEnv");

    // SendEnv takes the value from ssh's own environment.
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt("SendEnv=LC_SKIFF_SENT")
        .env("LC_SKIFF_SENT", "from-env")
        .args(&[r#"echo "$LC_SKIFF_SENT""#])
        .run();
    out.expect_code(0, &ctx(&d, "SendEnv"))
        .expect_stdout("from-env\n", "SendEnv");

    let d2 = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("AcceptEnv SKIFF_CUSTOM\n"),
    );
    let out = ssh(d2.port(), user(), &fx.client_key)
        .opt("SetEnv=SKIFF_CUSTOM=yes SKIFF_OTHER=no")
        .args(&[r#"echo "$SKIFF_CUSTOM|${SKIFF_OTHER-unset}""#])
        .run();
    out.expect_code(0, &ctx(&d2, "AcceptEnv from --config"))
        .expect_stdout("yes|unset\n", "AcceptEnv from --config");
}

/// `ssh -tt` gets a pseudo-terminal; without it there is none.
#[test]
fn pty_allocation() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-tt")
        .args(&["tty; test -t 0 && echo stdin-is-tty"])
        .run();
    let c = ctx(&d, "ssh -tt");
    out.expect_code(0, &c);
    let text = out.stdout_str();
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    let tty = lines.next().unwrap_or("");
    let n = tty.strip_prefix("/dev/pts/").unwrap_or("");
    assert!(
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        "{c}: expected /dev/pts/N\n{out}"
    );
    assert_eq!(lines.next(), Some("stdin-is-tty"), "{c}\n{out}");
    assert!(
        text.contains("\r\n"),
        "{c}: a pty turns \\n into \\r\\n\n{out}"
    );

    let out = ssh_cmd(d.port(), user(), &fx.client_key, &["tty"]);
    out.expect_code(1, &ctx(&d, "no -t"))
        .expect_stdout("not a tty\n", "no -t");
}

/// `no-pty` and `restrict` keys: the pty request is refused (ssh -tt then
/// gives up exactly as it does against sshd).
#[test]
fn no_pty_and_restrict_options() {
    let Some((_fx, [no_pty, restricted], d)) =
        skiffd_with_keys([("no_pty", "no-pty"), ("restricted", "restrict")])
    else {
        return;
    };
    for key in [&no_pty, &restricted] {
        let what = format!("-tt with {}", key.private.display());
        let out = ssh(d.port(), user(), key).flag("-tt").args(&["tty"]).run();
        let c = ctx(&d, &what);
        assert!(!out.stdout_str().contains("/dev/pts/"), "{c}\n{out}");
        out.expect_code(255, &c);
        assert!(
            out.stderr.contains("PTY allocation request failed"),
            "{c}\n{out}"
        );
        // Commands still work without a pty.
        ssh_cmd(d.port(), user(), key, &["echo plain"])
            .expect_code(0, &c)
            .expect_stdout("plain\n", &c);
    }
}

/// `command="..."` forces the command; the requested one is in
/// SSH_ORIGINAL_COMMAND.
#[test]
fn forced_command() {
    let Some((fx, [forced], d)) = skiffd_with_keys([("forced", FORCED_ECHO)]) else {
        return;
    };
    ssh_cmd(d.port(), user(), &forced, &["hello world"])
        .expect_code(0, &ctx(&d, "forced command"))
        .expect_stdout("forced hello world\n", "forced command");
    // The plain key on the same server is not affected.
    ssh_cmd(d.port(), user(), &fx.client_key, &["echo normal"])
        .expect_code(0, &ctx(&d, "unforced key"))
        .expect_stdout("normal\n", "unforced key");
}

/// `from="10.9.9.9"` does not match 127.0.0.1: the key is refused.
#[test]
fn from_restriction_rejected() {
    let Some((_fx, [limited, loopback], d)) = skiffd_with_keys(FROM_LIMITED_AND_LOOPBACK) else {
        return;
    };
    let out = ssh_cmd(d.port(), user(), &limited, &["echo should-not-run"]);
    let c = ctx(&d, "from=10.9.9.9");
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");
    ssh_cmd(d.port(), user(), &loopback, &["echo loopback-ok"])
        .expect_code(0, &ctx(&d, "from=127.0.0.1"))
        .expect_stdout("loopback-ok\n", "from=127.0.0.1");
}

#[test]
fn unknown_key_rejected() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh_cmd(d.port(), user(), &fx.stranger_key, &["echo should-not-run"]);
    let c = ctx(&d, "unknown key");
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");
}

/// The command runs as the account with USER/LOGNAME/HOME/SHELL/PATH and
/// SSH_CONNECTION/SSH_CLIENT set.
#[test]
fn user_env() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh_cmd(d.port(), user(), &fx.client_key, &[USER_ENV_SCRIPT]);
    check_user_env(&out, d.port(), &ctx(&d, "user environment"));
}

/// RSA (rsa-sha2-*) and ECDSA client keys are accepted too.
#[test]
fn client_key_types() {
    let Some((fx, d)) = setup() else { return };
    for key in [&fx.client_key, &fx.rsa_key, &fx.ecdsa_key] {
        let what = format!("{:?} client key", key.kind);
        ssh_cmd(d.port(), user(), key, &["echo key-ok"])
            .expect_code(0, &ctx(&d, &what))
            .expect_stdout("key-ok\n", &what);
    }
}

/// skiffd presents the configured host keys: ssh with
/// StrictHostKeyChecking=yes accepts each one when it is the one asked for,
/// and refuses a server whose key is not in known_hosts.
#[test]
fn host_keys_presented() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let rsa_host = fx.keygen("host_rsa", KeyType::Rsa, None);
    let ecdsa_host = fx.keygen("host_ecdsa", KeyType::Ecdsa, None);
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .host_key(&rsa_host)
            .host_key(&ecdsa_host),
    );
    let port = d.port();
    for (key, algs) in [
        (&fx.host_key, "ssh-ed25519"),
        (&rsa_host, "rsa-sha2-512,rsa-sha2-256"),
        (&ecdsa_host, "ecdsa-sha2-nistp256"),
    ] {
        let kh = fx.path().join(format!("kh_{algs}"));
        write_file(&kh, format!("{}\n", known_hosts_line(port, key)), 0o644);
        ssh(port, user(), &fx.client_key)
            .known_hosts(&kh)
            .opt(&format!("HostKeyAlgorithms={algs}"))
            .args(&["echo hostkey-ok"])
            .run()
            .expect_code(0, &ctx(&d, algs))
            .expect_stdout("hostkey-ok\n", algs);
    }

    let kh = fx.path().join("kh_wrong");
    write_file(
        &kh,
        format!("{}\n", known_hosts_line(port, &fx.stranger_key)),
        0o644,
    );
    let out = ssh(port, user(), &fx.client_key)
        .known_hosts(&kh)
        .opt("HostKeyAlgorithms=ssh-ed25519")
        .args(&["echo should-not-run"])
        .run();
    out.expect_code(255, &ctx(&d, "wrong host key"))
        .expect_stdout("", "wrong host key");
    assert!(
        out.stderr.contains("HOST IDENTIFICATION HAS CHANGED"),
        "ssh must see a different host key\n{out}"
    );
}

/// `environment="..."` applies only with `PermitUserEnvironment yes`.
#[test]
fn environment_option() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let [env_key] = fx.keys_with_options([("env_key", "environment=\"SKIFF_UENV=hello\"")]);
    let cmd = r#"echo "${SKIFF_UENV-unset}""#;

    let permitted = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("PermitUserEnvironment yes\n"),
    );
    ssh_cmd(permitted.port(), user(), &env_key, &[cmd])
        .expect_code(0, &ctx(&permitted, "PermitUserEnvironment yes"))
        .expect_stdout("hello\n", "PermitUserEnvironment yes");

    let default = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    ssh_cmd(default.port(), user(), &env_key, &[cmd])
        .expect_code(0, &ctx(&default, "PermitUserEnvironment default"))
        .expect_stdout("unset\n", "PermitUserEnvironment default (no)");
}

/// `expiry-time=` in the past refuses the key; in the future it works.
#[test]
fn expiry_time_option() {
    let Some((_fx, [expired, valid], d)) = skiffd_with_keys([
        ("expired", "expiry-time=\"20000101\""),
        ("valid", "expiry-time=\"209912312359\""),
    ]) else {
        return;
    };
    let out = ssh_cmd(d.port(), user(), &expired, &["echo should-not-run"]);
    let c = ctx(&d, "expired key");
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");
    ssh_cmd(d.port(), user(), &valid, &["echo not-expired"])
        .expect_code(0, &ctx(&d, "future expiry"))
        .expect_stdout("not-expired\n", "future expiry");
}
