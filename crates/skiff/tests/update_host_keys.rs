//! `UpdateHostKeys` against a real OpenSSH `sshd` with two host keys
//! (ed25519 and ECDSA): after a login verified by a known_hosts line, skiff
//! learns the key it did not know (once the server proved it holds it) and
//! drops a recorded key the server no longer has; with `UpdateHostKeys no`,
//! a wildcard line for the host, or a key only accepted on first use,
//! known_hosts stays as it was. Other lines are kept byte for byte, and
//! OpenSSH's own `ssh` reads the result. The agent path learns the same way.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use skiff_testkit::*;

/// A fixture and an sshd serving its ed25519 host key and an ECDSA one.
fn two_key_server() -> Option<(Fixture, Key, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let ecdsa = fx.keygen("host_ecdsa", KeyType::Ecdsa, None);
    let extra = format!("HostKey {}", ecdsa.private.display());
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&extra]);
    Some((fx, ecdsa, sshd))
}

/// Lines about other hosts (and a comment, a blank line, a CRLF line, a
/// line skiff cannot parse) that an update must leave exactly as they are.
fn bystanders(fx: &Fixture) -> String {
    format!(
        "# my hosts\r\nother.example {}\n\n[other.example]:2222 {}\r\nnot a known_hosts line\n",
        fx.stranger_key.key_material(),
        fx.client_key.key_material()
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The key material (`type base64`) of every entry ssh-keygen finds for the server.
fn recorded(path: &Path, port: u16) -> Vec<String> {
    known_hosts_lookup(path, port)
        .iter()
        .map(|l| known_hosts_entry_key(l))
        .collect()
}

fn run_true(home: &ClientHome, port: u16, fx: &Fixture, opts: &[&str]) -> CmdOutput {
    let mut exec = skiff_exec(home, port, user(), Some(&fx.client_key));
    for o in opts {
        exec = exec.opt(o);
    }
    exec.cmd("echo ran").run()
}

#[test]
fn learns_the_servers_other_key_and_ssh_can_use_it() {
    let Some((fx, ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let home = ClientHome::new();
    let kh = home.known_hosts();
    let before = format!(
        "{}{}\n",
        bystanders(&fx),
        known_hosts_line(port, &fx.host_key)
    );
    write_file(&kh, &before, 0o644);
    let c = format!("--- sshd log ---\n{}", sshd.log());

    let out = run_true(&home, port, &fx, &["UpdateHostKeys=yes"]);
    out.expect_code(0, &c).expect_stdout("ran\n", &c);
    let after = read(&kh);
    assert!(
        after.starts_with(&before),
        "other lines changed:\n{before:?}\n{after:?}"
    );
    assert_eq!(
        after[before.len()..],
        format!("{}\n", known_hosts_line(port, &ecdsa)),
        "{c}\n{out}"
    );
    let mode = std::fs::metadata(&kh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the rewritten file is private");

    // The learnt key verifies the server when it is the only one allowed,
    // for skiff and for OpenSSH's ssh.
    let only_ecdsa = [
        "HostKeyAlgorithms=ecdsa-sha2-nistp256",
        "StrictHostKeyChecking=yes",
    ];
    run_true(&home, port, &fx, &only_ecdsa)
        .expect_code(0, &c)
        .expect_stdout("ran\n", &c);
    // The ed25519 key, left out of this connection's algorithms, is still
    // the server's: its line stays.
    assert_eq!(read(&kh), after);
    let mut theirs = ssh(port, user(), &fx.client_key).known_hosts(&kh);
    for o in only_ecdsa {
        theirs = theirs.opt(o);
    }
    theirs.args(&["echo", "ran"]).run().expect_code(0, &c);
    // Nothing more to learn: the file stays as it is.
    run_true(&home, port, &fx, &["UpdateHostKeys=yes"]).expect_code(0, &c);
    assert_eq!(read(&kh), after);
}

/// With no `-F` file and no `UserKnownHostsFile`, `UpdateHostKeys` is on
/// (as in ssh), and `HashKnownHosts yes` hashes the name it writes.
#[test]
fn on_by_default_and_hashed_when_asked() {
    let Some((fx, ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);
    let before = read(&home.known_hosts());
    let c = format!("--- sshd log ---\n{}", sshd.log());
    run_true(&home, port, &fx, &["HashKnownHosts=yes"]).expect_code(0, &c);
    let after = read(&home.known_hosts());
    let added = after.strip_prefix(&before).expect("old lines kept");
    assert!(added.starts_with("|1|"), "hashed name: {added:?}");
    let mut keys = recorded(&home.known_hosts(), port);
    keys.sort();
    let mut want = vec![fx.host_key.key_material(), ecdsa.key_material()];
    want.sort();
    assert_eq!(keys, want);
}

#[test]
fn a_key_the_server_no_longer_has_is_removed() {
    let Some((fx, ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let retired = fx.keygen("retired_host", KeyType::Ed25519, None);
    let home = ClientHome::new();
    let kh = home.known_hosts();
    let current = known_hosts_line(port, &fx.host_key);
    let others = bystanders(&fx);
    // Both server keys known, and one it no longer has, among other lines.
    let text = format!(
        "{others}{current}\n{}\n# tail\n{}\n",
        known_hosts_line(port, &retired),
        known_hosts_line(port, &ecdsa)
    );
    write_file(&kh, &text, 0o600);
    let c = format!("--- sshd log ---\n{}", sshd.log());
    run_true(&home, port, &fx, &["UpdateHostKeys=yes"]).expect_code(0, &c);
    let want = format!(
        "{others}{current}\n# tail\n{}\n",
        known_hosts_line(port, &ecdsa)
    );
    assert_eq!(read(&kh), want);

    // Removed and added at once: the retired key out, the new key in.
    write_file(
        &kh,
        format!("{current}\n{}\n", known_hosts_line(port, &retired)),
        0o600,
    );
    run_true(&home, port, &fx, &["UpdateHostKeys=yes"]).expect_code(0, &c);
    assert_eq!(
        read(&kh),
        format!("{current}\n{}\n", known_hosts_line(port, &ecdsa))
    );
}

#[test]
fn nothing_changes_when_off_or_when_a_line_is_a_pattern() {
    let Some((fx, _ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let retired = fx.keygen("retired_host", KeyType::Ed25519, None);
    let c = format!("--- sshd log ---\n{}", sshd.log());
    let current = known_hosts_line(port, &fx.host_key);
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "UpdateHostKeys no",
            format!("{current}\n{}\n", known_hosts_line(port, &retired)),
            vec!["UpdateHostKeys=no"],
        ),
        (
            "UpdateHostKeys ask (never asked in a session)",
            format!("{current}\n"),
            vec!["UpdateHostKeys=ask"],
        ),
        (
            "a wildcard line for the host",
            format!("{current}\n[127.0.0.*]:{port} {}\n", retired.key_material()),
            vec!["UpdateHostKeys=yes"],
        ),
        (
            "a line of three names",
            format!(
                "[127.0.0.1]:{port},a.example,b.example {}\n",
                fx.host_key.key_material()
            ),
            vec!["UpdateHostKeys=yes"],
        ),
    ];
    for (what, text, opts) in cases {
        let home = ClientHome::new();
        write_file(&home.known_hosts(), &text, 0o600);
        run_true(&home, port, &fx, &opts).expect_code(0, &format!("{what}\n{c}"));
        assert_eq!(read(&home.known_hosts()), text, "{what}");
    }

    // UserKnownHostsFile set: off unless asked for, as in ssh.
    let home = ClientHome::new();
    let kh = home.path().join("my_known_hosts");
    write_file(&kh, format!("{current}\n"), 0o600);
    let file_opt = format!("UserKnownHostsFile={}", kh.display());
    run_true(&home, port, &fx, &[&file_opt]).expect_code(0, &c);
    assert_eq!(read(&kh), format!("{current}\n"));
    run_true(&home, port, &fx, &[&file_opt, "UpdateHostKeys=yes"]).expect_code(0, &c);
    assert_eq!(recorded(&kh, port).len(), 2, "{}", read(&kh));
}

/// A key accepted on first use (accept-new) is recorded, but does not make
/// the server's other keys trusted in the same connection, as in ssh.
#[test]
fn a_first_use_learns_nothing_more() {
    let Some((fx, _ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let home = ClientHome::new();
    let c = format!("--- sshd log ---\n{}", sshd.log());
    run_true(
        &home,
        port,
        &fx,
        &["UpdateHostKeys=yes", "StrictHostKeyChecking=accept-new"],
    )
    .expect_code(0, &c);
    assert_eq!(
        recorded(&home.known_hosts(), port),
        vec![fx.host_key.key_material()]
    );
}

/// Through the agent (a warm connection serves the command) the key is
/// learnt the same way, by the time the command is reported done.
#[test]
fn the_agent_learns_the_same_way() {
    let Some((fx, ecdsa, sshd)) = two_key_server() else {
        return;
    };
    let port = sshd.port();
    let ah = AgentHome::new();
    ah.home.trust(port, &fx.host_key);
    let c = format!("--- sshd log ---\n{}", sshd.log());
    ah.exec(port, &fx.client_key)
        .opt("UpdateHostKeys=yes")
        .cmd("echo ran")
        .run()
        .expect_code(0, &c)
        .expect_stdout("ran\n", &c);
    let mut keys = recorded(&ah.home.known_hosts(), port);
    keys.sort();
    let mut want = vec![fx.host_key.key_material(), ecdsa.key_material()];
    want.sort();
    assert_eq!(keys, want);
}
