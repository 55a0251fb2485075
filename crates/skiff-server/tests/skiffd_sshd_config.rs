//! Configurations written for sshd, served by skiffd as sshd serves them,
//! seen from stock OpenSSH `ssh` (issue 22): comments after a value,
//! algorithm names OpenSSH has and skiffd does not implement, `SetEnv`
//! with a name twice, several `RevokedKeys` files, `AuthorizedKeysFile`
//! patterns, any `Subsystem`, and a client whose first line is not an SSH
//! identification string.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use skiff_testkit::*;

/// A fixture and a skiffd with `config` as its --config file, serving the
/// authorized_keys `authorized` (a path or a pattern).
fn serve(fx: &Fixture, config: &str, authorized: &Path) -> Skiffd {
    Skiffd::start_with(SkiffdOptions::new(&fx.host_key, authorized).config(config))
}

#[test]
fn a_configuration_written_for_sshd_starts_and_serves() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = "\
# Hardened the way ssh-audit suggests for sshd.
KexAlgorithms sntrup761x25519-sha512@openssh.com,curve25519-sha256,diffie-hellman-group-exchange-sha256 # post-quantum first
Ciphers 3des-cbc,aes128-gcm@openssh.com
MACs umac-128-etm@openssh.com,hmac-sha2-256-etm@openssh.com
PubkeyAcceptedAlgorithms ssh-ed25519,ssh-rsa,rsa-sha2-512
PermitOpen 127.0.0.1:1 # only the test port
SetEnv GREETING=first GREETING=second   # sshd keeps the first
MaxSessions 4	#	tabs too
";
    let d = serve(&fx, config, &fx.authorized_keys);
    let c = server_context(&d, "an sshd_config with comments and OpenSSH-only names");
    ssh(d.port(), user(), &fx.client_key)
        .args(&["echo $GREETING"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("first\n", &c);
    // What was left out is said once, naming the line.
    let log = d.log();
    for left_out in [
        "KexAlgorithms: sntrup761x25519-sha512@openssh.com,diffie-hellman-group-exchange-sha256 not implemented by skiffd",
        "Ciphers: 3des-cbc not implemented by skiffd",
        "MACs: umac-128-etm@openssh.com not implemented by skiffd",
        "PubkeyAcceptedAlgorithms: ssh-rsa not implemented by skiffd",
    ] {
        assert_eq!(log.matches(left_out).count(), 1, "{left_out}\n{c}");
    }
    // RSA keys still sign in with SHA-2; the list kept rsa-sha2-512.
    ssh(d.port(), user(), &fx.rsa_key)
        .args(&["true"])
        .run()
        .expect_code(0, &c);
}

#[test]
fn revoked_keys_may_name_several_files() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let (first, second) = (fx.path().join("revoked1"), fx.path().join("revoked2"));
    write_file(&first, fx.ecdsa_key.pub_line() + "\n", 0o644);
    write_file(&second, fx.rsa_key.pub_line() + "\n", 0o644);
    let config = format!("RevokedKeys {} {}\n", first.display(), second.display());
    let d = serve(&fx, &config, &fx.authorized_keys);
    let c = server_context(&d, "RevokedKeys with two files");
    ssh(d.port(), user(), &fx.client_key)
        .args(&["true"])
        .run()
        .expect_code(0, &c);
    for revoked in [&fx.ecdsa_key, &fx.rsa_key] {
        let out = ssh(d.port(), user(), revoked).args(&["true"]).run();
        assert_eq!(out.code, 255, "{c}\n{out}");
    }
    assert!(d.log().contains("revoked in"), "{c}");
}

#[test]
fn authorized_keys_file_patterns_read_every_file_they_match() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let dir = fx.path().join("keys");
    std::fs::create_dir(&dir).expect("mkdir");
    let me = user();
    write_file(
        &dir.join(format!("authorized_keys_{me}_laptop")),
        fx.client_key.pub_line() + "\n",
        0o644,
    );
    write_file(
        &dir.join(format!("authorized_keys_{me}_ci")),
        fx.rsa_key.pub_line() + "\n",
        0o644,
    );
    // Another account's file matches no pattern of this one.
    write_file(
        &dir.join("authorized_keys_someone_else_x"),
        fx.ecdsa_key.pub_line() + "\n",
        0o644,
    );
    let pattern = dir.join("authorized_keys_%u_*");
    let d = serve(&fx, "", &pattern);
    let c = server_context(&d, "AuthorizedKeysFile with a pattern");
    for key in [&fx.client_key, &fx.rsa_key] {
        ssh(d.port(), me, key)
            .args(&["echo in"])
            .run()
            .expect_code(0, &c)
            .expect_stdout("in\n", &c);
    }
    let out = ssh(d.port(), me, &fx.ecdsa_key).args(&["true"]).run();
    assert_eq!(out.code, 255, "{c}\n{out}");
}

#[test]
fn any_subsystem_runs_its_command_as_the_account() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = "Subsystem shout /usr/bin/tr a-z A-Z\nSubsystem off none\n";
    let d = serve(&fx, config, &fx.authorized_keys);
    let c = server_context(&d, "Subsystem NAME COMMAND");
    ssh(d.port(), user(), &fx.client_key)
        .flag("-s")
        .args(&["shout"])
        .input(Input::Bytes(b"quiet please\n".to_vec()))
        .run()
        .expect_code(0, &c)
        .expect_stdout("QUIET PLEASE\n", &c);
    for refused in ["off", "unknown"] {
        let out = ssh(d.port(), user(), &fx.client_key)
            .flag("-s")
            .args(&[refused])
            .run();
        assert_ne!(out.code, 0, "{refused}: {c}\n{out}");
    }
}

/// What a connection that sends `first` reads before skiffd closes it (at
/// most 15 s).
fn answer_to(port: u16, first: &[u8]) -> Vec<u8> {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    sock.write_all(first).expect("write");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match sock.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset after the answer (unread bytes at the close) ends it too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            // A signal (SO_RCVTIMEO reads are never restarted).
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading skiffd's answer: {e} (so far {got:?})"),
        }
    }
    panic!("skiffd kept the connection open: {got:?}");
}

#[test]
fn a_client_that_is_not_ssh_is_told_so_and_closed() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = serve(&fx, "", &fx.authorized_keys);
    let c = server_context(&d, "a first line that is not SSH-");
    // `echo | nc host port`, and a web client.
    for first in [&b"\n"[..], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"] {
        let got = String::from_utf8_lossy(&answer_to(d.port(), first)).into_owned();
        assert!(got.starts_with("SSH-2.0-skiffd"), "{got:?}\n{c}");
        assert!(
            got.ends_with("\r\nInvalid SSH identification string.\r\n"),
            "{got:?}\n{c}"
        );
    }
    // An SSH client is still served.
    ssh(d.port(), user(), &fx.client_key)
        .args(&["true"])
        .run()
        .expect_code(0, &c);
}
