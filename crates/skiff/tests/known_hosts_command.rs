//! `KnownHostsCommand`: host keys from a program (an inventory service,
//! say) next to the known_hosts files, as ssh takes them. The program here
//! is a shell script that logs its arguments and prints a known_hosts line
//! chosen by the test; the server is skiffd.

use std::path::{Path, PathBuf};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A script that appends its arguments to `log` and prints `answer`'s
/// contents (exit status from `status`, 0 when the file is missing).
fn lookup_script(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let script = dir.join("lookup");
    let log = dir.join("lookup.log");
    let answer = dir.join("answer");
    let status = dir.join("status");
    write_file(
        &script,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\ncat '{}' 2>/dev/null\nexit $(cat '{}' 2>/dev/null || echo 0)\n",
            log.display(),
            answer.display(),
            status.display()
        ),
        0o755,
    );
    (script, log, answer, status)
}

#[test]
fn host_keys_from_a_command() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let home = ClientHome::new();
    let (script, log, answer, status) = lookup_script(fx.path());
    let command = format!("KnownHostsCommand={} %H %I %t %f %k %p", script.display());
    let run = || {
        skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
            .opt("StrictHostKeyChecking=yes")
            .opt(&command)
            .cmd("echo in")
            .run()
    };
    let c = || ctx(&d, "KnownHostsCommand");

    // The program vouches for the key: no known_hosts entry is needed.
    write_file(
        &answer,
        known_hosts_line(d.port(), &fx.host_key) + "\n",
        0o644,
    );
    run().expect_code(0, &c()).expect_stdout("in\n", &c());
    let logged = std::fs::read_to_string(&log).unwrap();
    let expected = format!(
        "{} HOSTNAME ssh-ed25519 {} 127.0.0.1 {}\n",
        known_hosts_name(d.port()),
        fx.host_key.fingerprint(),
        d.port()
    );
    assert_eq!(logged, expected, "{}", c());
    assert!(
        !home.known_hosts().exists()
            || std::fs::read_to_string(home.known_hosts())
                .unwrap()
                .is_empty(),
        "keys from the program are not recorded"
    );

    // Another key for the host: the server's key has changed.
    let other = fx.keygen("other_host", KeyType::Ed25519, None);
    write_file(&answer, known_hosts_line(d.port(), &other) + "\n", 0o644);
    let out = run();
    out.expect_code(255, &c());
    assert!(
        out.stderr.to_ascii_lowercase().contains("changed"),
        "{}\n{out}",
        c()
    );

    // A failing program vouches for nothing, and says so.
    write_file(
        &answer,
        known_hosts_line(d.port(), &fx.host_key) + "\n",
        0o644,
    );
    write_file(&status, "3\n", 0o644);
    let out = run();
    out.expect_code(255, &c());
    assert!(out.stderr.contains("KnownHostsCommand"), "{}\n{out}", c());
    assert!(out.stderr.contains("exit status: 3"), "{}\n{out}", c());

    // The files still count: a key there is enough when the program fails.
    home.trust(d.port(), &fx.host_key);
    run().expect_code(0, &c()).expect_stdout("in\n", &c());

    // An unknown token is a configuration error before connecting.
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
        .opt("KnownHostsCommand=/bin/true %Z")
        .cmd("true")
        .run();
    out.expect_skiff_failure(&["KnownHostsCommand", "%Z"], "bad token");
}
