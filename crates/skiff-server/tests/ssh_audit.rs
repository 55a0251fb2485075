//! What a default skiffd offers before authentication, as an auditor and
//! stock clients see it: `ssh-audit` finds nothing to fail (no NIST-curve
//! key exchange by default) and no compression that starts before
//! authentication, and `ssh -C` still gets delayed zlib.

use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A default skiffd (its own generated ed25519 host key, no configuration
/// file) passes `ssh-audit`: no `[fail]` line, and compression, if any,
/// only `zlib@openssh.com` (delayed until after authentication).
#[test]
fn default_skiffd_passes_ssh_audit() {
    if !require_tool("ssh-audit", "ssh-audit") {
        return;
    }
    let fx = Fixture::new();
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).own_host_key());
    let out = Run::new("ssh-audit")
        .args(["-n", "-t", "30", "-p", &d.port().to_string(), "127.0.0.1"])
        .timeout(Duration::from_secs(90))
        .run();
    let stdout = out.stdout_str();
    let report = format!("ssh-audit exited {}:\n{stdout}{}", out.code, out.stderr);
    assert!(
        stdout.contains("(gen) banner: SSH-2.0-skiffd_"),
        "{}",
        ctx(&d, &format!("ssh-audit did not reach skiffd\n{report}"))
    );
    let failed: Vec<&str> = stdout.lines().filter(|l| l.contains("[fail]")).collect();
    assert!(
        failed.is_empty(),
        "{}",
        ctx(
            &d,
            &format!(
                "ssh-audit fails skiffd on:\n{}\n{report}",
                failed.join("\n")
            )
        )
    );
    // "(gen) compression: enabled (zlib, zlib@openssh.com)", or "disabled".
    let compression = stdout
        .lines()
        .find(|l| l.starts_with("(gen) compression:"))
        .unwrap_or_else(|| panic!("no compression line\n{report}"));
    let offered: Vec<&str> = compression
        .split(['(', ')', ','])
        .skip(3)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        offered.iter().all(|m| *m == "zlib@openssh.com"),
        "compression before authentication offered: {offered:?}\n{report}"
    );
}

/// Stock `ssh -C` still compresses with skiffd: `zlib@openssh.com` is
/// agreed in both directions, starts once authenticated, and a command's
/// output comes through whole.
#[test]
fn ssh_compression_starts_after_authentication() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let c = ctx(&d, "ssh -C");
    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-C")
        .log_level("DEBUG2")
        .args(&["head -c 3000000 /dev/zero | tr '\\0' a | sha256sum"])
        .timeout(Duration::from_secs(60))
        .run();
    out.expect_code(0, &c);
    let expected = {
        let local = tempdir();
        let p = local.path().join("a");
        write_file(&p, vec![b'a'; 3_000_000], 0o600);
        sha256(&p)
    };
    assert_eq!(first_token(&out.stdout), expected, "{c}\n{out}");
    for direction in ["client->server", "server->client"] {
        assert!(
            out.stderr
                .lines()
                .any(|l| l.contains(&format!("kex: {direction}"))
                    && l.contains("compression: zlib@openssh.com")),
            "{c}: {direction} compression\n{out}"
        );
    }
    assert!(
        out.stderr.contains("Enabling compression"),
        "{c}: compression started\n{out}"
    );
}
