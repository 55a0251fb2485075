//! skiffd's `PerSourcePenalties` and `PerSourcePenaltyExemptList`, with
//! stock OpenSSH `ssh` as the client. Debian's OpenSSH (9.2) has no
//! `PerSourcePenalties` (sshd has it from 9.8), so these test skiffd's side
//! alone: a failed login from 127.0.0.1 gets the next connection refused
//! while the penalty lasts and accepted after it; an exempt source is never
//! refused; a penalty below `min` is not enforced. `noauth:0` keeps the
//! harness's readiness probe (a connection that never authenticates) out
//! of the count.

use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

fn skiffd(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config));
    Some((fx, d))
}

fn login(d: &Skiffd, key: &Key) -> CmdOutput {
    ssh(d.port(), user(), key).args(&["echo", "in"]).run()
}

fn logged_in(out: &CmdOutput) -> bool {
    out.code == 0 && out.stdout_str() == "in\n"
}

/// A failed login (a key the account does not list).
fn fail_login(d: &Skiffd, fx: &Fixture, c: &str) {
    let out = login(d, &fx.stranger_key);
    assert_eq!(out.code, 255, "{c}: the stranger's key\n{out}");
}

#[test]
fn a_failed_login_refuses_the_source_for_the_penalty() {
    let Some((fx, d)) = skiffd("PerSourcePenalties authfail:5s min:5s noauth:0\n") else {
        return;
    };
    let c = || ctx(&d, "PerSourcePenalties authfail:5s min:5s");
    // A good login earns nothing.
    let out = login(&d, &fx.client_key);
    assert!(logged_in(&out), "{}: before\n{out}", c());
    fail_login(&d, &fx, &c());
    let failed_at = Instant::now();
    // At once: closed before the identification string.
    let out = login(&d, &fx.client_key);
    assert!(!logged_in(&out), "{}: within the penalty\n{out}", c());
    assert!(
        out.stderr.contains("kex_exchange_identification")
            || out.stderr.contains("Connection reset")
            || out.stderr.contains("Connection closed"),
        "{}: within the penalty\n{out}",
        c()
    );
    // Accepted again once the penalty is over (polled, within a wide bound).
    let admitted_at = loop {
        let out = login(&d, &fx.client_key);
        if logged_in(&out) {
            break Instant::now();
        }
        assert!(
            failed_at.elapsed() < Duration::from_secs(30),
            "{}: still refused after 30 s\n{out}",
            c()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let refused_for = admitted_at - failed_at;
    assert!(
        refused_for >= Duration::from_secs(4),
        "{}: admitted after {refused_for:?}, before the 5 s penalty was over",
        c()
    );
    // Logged once for the penalty, however many connections it refused.
    let log = d.log();
    assert_eq!(log.matches("(PerSourcePenalties)").count(), 1, "{}", c());
    assert!(
        log.contains("refusing connections from 127.0.0.1"),
        "{}",
        c()
    );
}

#[test]
fn exempt_sources_and_penalties_below_min_are_not_refused() {
    let config = "PerSourcePenalties authfail:30s min:0 noauth:0\n\
                  PerSourcePenaltyExemptList 10.0.0.0/8,127.0.0.1,::1\n";
    let Some((fx, d)) = skiffd(config) else {
        return;
    };
    let c = || ctx(&d, "PerSourcePenaltyExemptList 127.0.0.1");
    fail_login(&d, &fx, &c());
    let out = login(&d, &fx.client_key);
    assert!(logged_in(&out), "{}: exempt\n{out}", c());
    drop(d);

    // sshd's default min (15 s): one 5 s penalty is recorded, not enforced.
    let Some((fx, d)) = skiffd("PerSourcePenalties authfail:5s noauth:0\n") else {
        return;
    };
    let c = || ctx(&d, "PerSourcePenalties authfail:5s (min 15s)");
    fail_login(&d, &fx, &c());
    let out = login(&d, &fx.client_key);
    assert!(logged_in(&out), "{}: below min\n{out}", c());
    // Three more reach it (penalties add up from when each is earned, so
    // three 5 s ones made over a fraction of a second fall just short).
    for _ in 0..3 {
        fail_login(&d, &fx, &c());
    }
    let out = login(&d, &fx.client_key);
    assert!(!logged_in(&out), "{}: 15 s reached\n{out}", c());
}

#[test]
fn bad_penalty_settings_name_the_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("sshd_config");
    for (line, needle) in [
        ("PerSourcePenalties authfail:5x", "authfail"),
        ("PerSourcePenalties sometimes:5s", "unknown penalty"),
        (
            "PerSourcePenalties overflow:maybe",
            "deny-all or permissive",
        ),
        ("PerSourcePenaltyExemptList 10.0.0.0/99", "bad entry"),
    ] {
        write_file(&config, format!("Port 2222\n{line}\n"), 0o644);
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{line}: {out}");
        assert!(
            out.stderr.contains("sshd_config:2") && out.stderr.contains(needle),
            "{line}: {out}"
        );
    }
}
