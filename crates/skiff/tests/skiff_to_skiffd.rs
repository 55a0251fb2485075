//! skiff client -> skiffd server.
//!
//! The same client cases as `skiff_to_sshd.rs`, against our own server,
//! plus server-side behaviour seen through skiff: forced commands, `from=`
//! rejection and many concurrent execs.

mod common;

use std::thread;

use common::skiff_cases as cases;
use common::*;

fn setup() -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    Some((fx, d))
}

fn ctx(d: &Skiffd, what: &str) -> String {
    format!("{what}\n--- skiffd log ---\n{}", d.log())
}

#[test]
fn exec_stdout_stderr() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_stdout_stderr(&d, &fx);
}

#[test]
fn exec_big_stdin_checksum() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_big_stdin(&d, &fx);
}

#[test]
fn exec_round_trip_cat() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_round_trip(&d, &fx);
}

#[test]
fn exec_exit_codes() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_exit_codes(&d, &fx);
}

#[test]
fn exec_signal_exit_code() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_signal(&d, &fx);
}

#[test]
fn exec_stdin_null_flag() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_stdin_null_flag(&d, &fx);
}

#[test]
fn exec_user_env() {
    let Some((fx, d)) = setup() else { return };
    cases::exec_user_env(&d, &fx);
}

#[test]
fn client_key_types() {
    let Some((fx, d)) = setup() else { return };
    cases::client_key_types(&d, &fx);
}

#[test]
fn unknown_key_rejected() {
    let Some((fx, d)) = setup() else { return };
    cases::unknown_key_rejected(&d, &fx);
}

#[test]
fn known_hosts_accept_new_then_changed() {
    let Some((fx, mut d)) = setup() else { return };
    cases::known_hosts_accept_new_then_changed(&mut d, &fx);
}

#[test]
fn hashed_known_hosts() {
    let Some((fx, d)) = setup() else { return };
    cases::hashed_known_hosts(&d, &fx);
}

#[test]
fn accept_new_hashed() {
    let Some((fx, d)) = setup() else { return };
    cases::accept_new_hashed(&d, &fx);
}

#[test]
fn strict_yes_unknown_host() {
    let Some((fx, d)) = setup() else { return };
    cases::strict_yes_unknown_host(&d, &fx);
}

#[test]
fn agent_auth() {
    let Some((fx, d)) = setup() else { return };
    cases::agent_auth(&d, &fx);
}

#[test]
fn encrypted_key_askpass() {
    let Some((fx, d)) = setup() else { return };
    cases::encrypted_key_askpass(&d, &fx);
}

#[test]
fn encrypted_key_batch_mode() {
    let Some((fx, d)) = setup() else { return };
    cases::encrypted_key_batch_mode(&d, &fx);
}

#[test]
fn config_alias_include() {
    let Some((fx, d)) = setup() else { return };
    cases::config_alias_include(&d, &fx);
}

/// `command="..."` replaces the requested command, which is available as
/// SSH_ORIGINAL_COMMAND.
#[test]
fn forced_command() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let forced = fx.keygen("forced", KeyType::Ed25519, None);
    fx.authorize_extra(&[format!(
        "command=\"echo forced $SSH_ORIGINAL_COMMAND\" {}",
        forced.pub_line()
    )]);
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);

    let out = skiff_exec(&home, d.port(), &account().name, Some(&forced))
        .opt("IdentitiesOnly=yes")
        .cmd("hello world")
        .run();
    out.expect_code(0, &ctx(&d, "forced command"))
        .expect_stdout("forced hello world\n", "forced command");

    // The forced command's exit status is what the client gets, whatever
    // was asked for.
    let out = skiff_exec(&home, d.port(), &account().name, Some(&forced))
        .opt("IdentitiesOnly=yes")
        .cmd("exit 9")
        .run();
    out.expect_code(0, &ctx(&d, "forced command ignores requested exit"))
        .expect_stdout("forced exit 9\n", "forced command ignores requested exit");
}

/// A key restricted with `from="10.9.9.9"` cannot log in from 127.0.0.1,
/// while an unrestricted key on the same server can.
#[test]
fn from_restriction_rejected() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let limited = fx.keygen("from_limited", KeyType::Ed25519, None);
    let loopback = fx.keygen("from_loopback", KeyType::Ed25519, None);
    fx.authorize_extra(&[
        format!("from=\"10.9.9.9\" {}", limited.pub_line()),
        format!("from=\"127.0.0.1\" {}", loopback.pub_line()),
    ]);
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);

    let out = skiff_exec(&home, d.port(), &account().name, Some(&limited))
        .opt("IdentitiesOnly=yes")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["authentication"], &ctx(&d, "from=10.9.9.9"));

    let out = skiff_exec(&home, d.port(), &account().name, Some(&loopback))
        .opt("IdentitiesOnly=yes")
        .cmd("echo loopback-ok")
        .run();
    out.expect_code(0, &ctx(&d, "from=127.0.0.1"))
        .expect_stdout("loopback-ok\n", "from=127.0.0.1");
}

/// 20 skiff processes at once, each with its own connection, all get their
/// own output and exit code.
#[test]
fn concurrent_execs() {
    if !require_openssh() {
        return;
    }
    const N: usize = 20;
    let fx = Fixture::new();
    // Keep skiffd from shedding unauthenticated connections on purpose.
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("MaxStartups 100\n"),
    );
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let results: Vec<CmdOutput> = thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let (home, fx, port) = (&home, &fx, d.port());
                s.spawn(move || {
                    skiff_exec(home, port, &account().name, Some(&fx.client_key))
                        .cmd(&format!(
                            "echo start-{i}; sleep 1; head -c 100000 /dev/zero | wc -c; exit {}",
                            i % 5
                        ))
                        .run()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("skiff thread panicked"))
            .collect()
    });
    for (i, out) in results.iter().enumerate() {
        let what = format!("concurrent exec #{i}");
        out.expect_code((i % 5) as i32, &ctx(&d, &what))
            .expect_stdout(&format!("start-{i}\n100000\n"), &what);
    }
}
