//! ECDSA keys whose private scalar OpenSSH stored short (a top byte of zero:
//! one P-256 key in 256). ssh and sshd use them; the decoder skiff is built
//! on refused them, so skiffd could not load such a host key and skiff could
//! not use such an identity. Checked with real ssh-keygen keys, stock ssh,
//! skiffd, and a passphrase-protected copy.

use std::path::Path;

use skiff_proto::openssh_key;
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// Whether the unencrypted key file at `path` has a short ECDSA scalar.
fn has_short_scalar(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).expect("read key");
    openssh_key::armored_body(&text)
        .and_then(|body| openssh_key::repair_unencrypted(&body))
        .is_some()
}

/// P-256 keys from ssh-keygen until one has a short scalar (at most 4,000
/// tries; one in 256 is expected, so about one run in 10^7 finds none and
/// says so).
fn short_scalar_key(dir: &Path, name: &str) -> Key {
    for _ in 0..4000 {
        let key = keygen(dir, name, KeyType::Ecdsa, None);
        if has_short_scalar(&key.private) {
            return key;
        }
        std::fs::remove_file(&key.private).unwrap();
        std::fs::remove_file(&key.public).unwrap();
    }
    panic!("no short-scalar P-256 key in 4000 tries (one in 256 expected)");
}

#[test]
fn keys_with_a_short_ecdsa_scalar_work_on_both_sides() {
    if !require_openssh() {
        return;
    }
    let dir = tempdir();
    let host_key = short_scalar_key(dir.path(), "host");
    let client_key = short_scalar_key(dir.path(), "client");
    let authorized = dir.path().join("authorized_keys");
    write_authorized_keys(&authorized, &[client_key.pub_line()]);
    let d = Skiffd::start(&host_key, &authorized);
    let c = ctx(&d, "short ECDSA scalars");

    // skiffd serves with the host key; stock ssh checks it against
    // known_hosts and logs in.
    let home = ClientHome::new();
    home.trust(d.port(), &host_key);
    let out = ssh(d.port(), user(), &client_key)
        .known_hosts(&home.known_hosts())
        .opt("StrictHostKeyChecking=yes")
        .args(&["echo ssh-ok"])
        .run();
    out.expect_code(0, &c).expect_stdout("ssh-ok\n", &c);

    // skiff logs in with the identity.
    let out = skiff_exec(&home, d.port(), user(), Some(&client_key))
        .opt("IdentitiesOnly=yes")
        .cmd("echo skiff-ok")
        .run();
    out.expect_code(0, &c).expect_stdout("skiff-ok\n", &c);

    // And with the same key under a passphrase, decrypted by skiff.
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-p", "-P", "", "-N", PASSPHRASE, "-f"])
        .arg(&client_key.private)
        .status()
        .expect("run ssh-keygen -p");
    assert!(status.success(), "ssh-keygen -p failed");
    // skiff with the passphrase from an askpass program answering `given`.
    let marker = dir.path().join("askpass.log");
    let exec_with = |given: &str, command: &str| {
        let askpass = askpass_script(dir.path(), given, &marker);
        skiff_exec(&home, d.port(), user(), Some(&client_key))
            .interactive()
            .opt("IdentitiesOnly=yes")
            .askpass(&askpass)
            .cmd(command)
            .run()
    };
    let out = exec_with(PASSPHRASE, "echo unlocked");
    out.expect_code(0, &c).expect_stdout("unlocked\n", &c);
    assert!(marker.exists(), "{c}: the passphrase was asked for");

    // A wrong passphrase is still refused.
    let out = exec_with("wrongpassphrase", "echo never");
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}\n{out}");
}
