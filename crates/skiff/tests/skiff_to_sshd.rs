//! skiff client -> real OpenSSH `sshd`.
//!
//! Every test starts its own private sshd on a free 127.0.0.1 port (see
//! `common::Sshd`) and runs the `skiff` binary against it with a private
//! HOME. `harness_sanity` checks the fixture with OpenSSH's own `ssh`, so a
//! failure there points at the harness or the host, not at skiff.

mod common;

use common::skiff_cases as cases;
use common::*;

/// sshd config lines for the skiff tests: nothing special is needed.
const SSHD_EXTRA: &[&str] = &[];

fn setup() -> Option<(Fixture, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, SSHD_EXTRA);
    Some((fx, sshd))
}

/// The fixture works with stock OpenSSH on both ends: login as the test
/// account, exact output, exit codes, host key as configured, rejection of
/// an unknown key.
#[test]
fn harness_sanity() {
    let Some((fx, sshd)) = setup() else { return };
    let acct = account();
    let port = sshd.port();

    let out = ssh_cmd(
        port,
        &acct.name,
        &fx.client_key,
        &["echo out; echo err >&2; id -un; exit 5"],
    );
    let c = format!("ssh -> sshd\n--- sshd log ---\n{}", sshd.log());
    out.expect_code(5, &c)
        .expect_stdout(&format!("out\n{}\n", acct.name), &c);
    assert_eq!(out.stderr, "err\n", "{c}\n{out}");

    // sshd presents exactly the host key we configured.
    let kh = fx.path().join("sanity_known_hosts");
    write_file(
        &kh,
        format!("{}\n", known_hosts_line(port, &fx.host_key)),
        0o644,
    );
    ssh(port, &acct.name, &fx.client_key)
        .known_hosts(&kh)
        .args(&["true"])
        .run()
        .expect_code(0, &c);

    // An unknown key is refused.
    let out = ssh_cmd(port, &acct.name, &fx.stranger_key, &["true"]);
    out.expect_code(255, &c);
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");

    // Signal death: OpenSSH's ssh reports 255.
    ssh_cmd(port, &acct.name, &fx.client_key, &["kill -9 $$"]).expect_code(255, &c);
}

#[test]
fn exec_stdout_stderr() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_stdout_stderr(&sshd, &fx);
}

#[test]
fn exec_big_stdin_checksum() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_big_stdin(&sshd, &fx);
}

#[test]
fn exec_round_trip_cat() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_round_trip(&sshd, &fx);
}

#[test]
fn exec_exit_codes() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_exit_codes(&sshd, &fx);
}

#[test]
fn exec_signal_exit_code() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_signal(&sshd, &fx);
}

#[test]
fn exec_stdin_null_flag() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_stdin_null_flag(&sshd, &fx);
}

#[test]
fn exec_user_env() {
    let Some((fx, sshd)) = setup() else { return };
    cases::exec_user_env(&sshd, &fx);
}

#[test]
fn client_key_types() {
    let Some((fx, sshd)) = setup() else { return };
    cases::client_key_types(&sshd, &fx);
}

#[test]
fn unknown_key_rejected() {
    let Some((fx, sshd)) = setup() else { return };
    cases::unknown_key_rejected(&sshd, &fx);
}

/// Nothing listens on the port: exit 255 with one line about connecting.
#[test]
fn connection_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let home = ClientHome::new();
    let port = free_port();
    let out = skiff_exec(&home, port, &account().name, Some(&fx.client_key))
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["connect"], "connection refused");
}

#[test]
fn known_hosts_accept_new_then_changed() {
    let Some((fx, mut sshd)) = setup() else {
        return;
    };
    cases::known_hosts_accept_new_then_changed(&mut sshd, &fx);
}

#[test]
fn hashed_known_hosts() {
    let Some((fx, sshd)) = setup() else { return };
    cases::hashed_known_hosts(&sshd, &fx);
}

#[test]
fn accept_new_hashed() {
    let Some((fx, sshd)) = setup() else { return };
    cases::accept_new_hashed(&sshd, &fx);
}

#[test]
fn strict_yes_unknown_host() {
    let Some((fx, sshd)) = setup() else { return };
    cases::strict_yes_unknown_host(&sshd, &fx);
}

#[test]
fn agent_auth() {
    let Some((fx, sshd)) = setup() else { return };
    cases::agent_auth(&sshd, &fx);
}

#[test]
fn encrypted_key_askpass() {
    let Some((fx, sshd)) = setup() else { return };
    cases::encrypted_key_askpass(&sshd, &fx);
}

#[test]
fn encrypted_key_batch_mode() {
    let Some((fx, sshd)) = setup() else { return };
    cases::encrypted_key_batch_mode(&sshd, &fx);
}

#[test]
fn config_alias_include() {
    let Some((fx, sshd)) = setup() else { return };
    cases::config_alias_include(&sshd, &fx);
}
