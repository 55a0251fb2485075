//! skiffd's `RekeyLimit`, seen from stock OpenSSH `ssh -vvv`: with
//! `RekeyLimit 1M`, a few MiB either way make skiffd start new key
//! exchanges (ssh logs each KEXINIT it receives) and the data arrives
//! intact; without the setting, the same transfer needs only the first.

use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const MIB: usize = 1 << 20;

fn skiffd(config: Option<&str>) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if let Some(text) = config {
        opts = opts.config(text);
    }
    let d = Skiffd::start_with(opts);
    Some((fx, d))
}

/// How many key exchanges the server began or answered, as ssh logs them.
fn kexinits_received(out: &CmdOutput) -> usize {
    out.stderr.matches("SSH2_MSG_KEXINIT received").count()
}

/// `ssh -vvv` running `command` with `input` on its stdin.
fn run(d: &Skiffd, fx: &Fixture, command: &str, input: Input) -> CmdOutput {
    ssh(d.port(), user(), &fx.client_key)
        .log_level("DEBUG3")
        .input(input)
        .timeout(Duration::from_secs(120))
        .args(&[command])
        .run()
}

#[test]
fn a_data_limit_makes_skiffd_rekey_both_ways() {
    let Some((fx, d)) = skiffd(Some("RekeyLimit 1M\n")) else {
        return;
    };
    let c = |what: &str| ctx(&d, &format!("RekeyLimit 1M: {what}"));
    // In: 4 MiB to the server, which counts them (and checks them).
    let upload = fx.path().join("upload");
    let digest = random_file(&upload, 4 * MIB);
    let out = run(&d, &fx, "sha256sum", Input::File(upload));
    out.expect_code(0, &c("upload"));
    assert_eq!(first_token(&out.stdout), digest, "{}", c("upload digest"));
    let n = kexinits_received(&out);
    assert!(n >= 3, "{}: {n} KEXINIT received\n{out}", c("upload"));
    // Out: 4 MiB from the server.
    let out = run(
        &d,
        &fx,
        "dd if=/dev/zero bs=65536 count=64 2>/dev/null",
        Input::Null,
    );
    out.expect_code(0, &c("download"));
    assert_eq!(out.stdout.len(), 4 * MIB, "{}", c("download length"));
    assert!(
        out.stdout.iter().all(|b| *b == 0),
        "{}",
        c("download bytes")
    );
    let n = kexinits_received(&out);
    assert!(n >= 3, "{}: {n} KEXINIT received\n{out}", c("download"));
}

#[test]
fn without_a_limit_the_same_transfer_keeps_its_first_keys() {
    let Some((fx, d)) = skiffd(None) else {
        return;
    };
    let c = |what: &str| ctx(&d, &format!("no RekeyLimit: {what}"));
    let upload = fx.path().join("upload");
    let digest = random_file(&upload, 4 * MIB);
    let out = run(&d, &fx, "sha256sum", Input::File(upload));
    out.expect_code(0, &c("upload"));
    assert_eq!(first_token(&out.stdout), digest, "{}", c("upload digest"));
    assert_eq!(kexinits_received(&out), 1, "{}\n{out}", c("upload"));
}

#[test]
fn bad_rekey_limits_name_the_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("sshd_config");
    for (line, needle) in [
        ("RekeyLimit 8", "at least 16"),
        ("RekeyLimit 1M 1y", "time"),
        ("RekeyLimit", "RekeyLimit"),
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
