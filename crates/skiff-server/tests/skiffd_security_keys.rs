//! Security keys (FIDO) against skiffd, with stock `ssh` signing through a
//! software security key (`skiff-soft-sk`, loaded as its
//! `SecurityKeyProvider`) whose signatures carry the flags the test asks
//! for: user presence (0x01, a touch) and verification (0x04, a PIN).
//!
//! First the same keys against stock sshd, which shows the software key
//! signs as a real one does (sshd checks its flags). Then skiffd: russh
//! verifies a security key's signature but does not pass its flags on, so
//! skiffd admits a security key only where no flag is required
//! (`no-touch-required` on its line or certificate, no `verify-required`,
//! no `PubkeyAuthOptions`), and refuses every other, saying why, before
//! the key is asked to sign.

use std::path::Path;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// What a run of ssh with a security key came to, and how many times
/// the key was asked to sign (a person would have touched it as often).
struct SkRun {
    out: CmdOutput,
    signatures: usize,
}

/// Stock ssh as the test account with security key `key` (and `more`
/// options), the software key library as its provider, its signatures
/// carrying `flags` (the key's own when `None`), running `echo WORD`.
fn sk_ssh_with(port: u16, key: &Key, flags: Option<&str>, more: &[String], word: &str) -> SkRun {
    let scratch = tempdir();
    let log = scratch.path().join("signatures");
    let provider = format!("SecurityKeyProvider={}", soft_sk_library().display());
    let mut run = ssh(port, user(), key)
        .opt(&provider)
        .env(SOFT_SK_LOG, &log)
        .args(&["echo", word]);
    for o in more {
        run = run.opt(o);
    }
    if let Some(f) = flags {
        run = run.env(SOFT_SK_FLAGS, f);
    }
    let out = run.run();
    let signatures = std::fs::read_to_string(&log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    SkRun { out, signatures }
}

fn sk_ssh(port: u16, key: &Key, flags: Option<&str>, word: &str) -> SkRun {
    sk_ssh_with(port, key, flags, &[], word)
}

/// An authorized_keys line for `key` with `options`.
fn line(options: &str, key: &Key) -> String {
    format!("{options} {}", key.pub_line()).trim().to_string()
}

/// Asserts that `server` has logged every one of `needles`, showing its
/// log as it is now.
fn logged(server: &dyn Daemon, needles: &[&str], what: &str) {
    let log = server.log();
    for n in needles {
        assert!(
            log.contains(n),
            "{}",
            ctx(server, &format!("{what}: no {n:?}"))
        );
    }
}

/// In, the key having signed once.
fn logged_in(run: &SkRun, word: &str, c: &str) {
    run.out
        .expect_code(0, c)
        .expect_stdout(&format!("{word}\n"), c);
    assert_eq!(run.signatures, 1, "{c}\n{}", run.out);
}

/// Refused, after the key signed `signatures` times.
fn refused(run: &SkRun, signatures: usize, c: &str) {
    run.out.expect_code(255, c);
    assert!(
        run.out.stderr.contains("Permission denied"),
        "{c}\n{}",
        run.out
    );
    assert_eq!(run.signatures, signatures, "{c}\n{}", run.out);
}

/// The software key signs as a security key does, flags included: stock
/// sshd refuses a signature without a touch unless the line says
/// `no-touch-required`, and one without verification under
/// `verify-required`.
#[test]
fn stock_sshd_checks_the_software_keys_flags() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let touch = sk_keygen(fx.path(), "sk_touch", KeyType::Ed25519Sk, &[]);
    let waived = sk_keygen(fx.path(), "sk_waived", KeyType::EcdsaSk, &[]);
    let verify = sk_keygen(fx.path(), "sk_verify", KeyType::Ed25519Sk, &[]);
    fx.set_authorized(&[
        line("", &touch),
        line("no-touch-required", &waived),
        line("verify-required", &verify),
    ]);
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let port = sshd.port();

    let c = ctx(&sshd, "a touch, where one is required");
    logged_in(&sk_ssh(port, &touch, None, "touched"), "touched", &c);
    let c = ctx(&sshd, "no touch, where one is required");
    refused(&sk_ssh(port, &touch, Some("0x00"), "never"), 1, &c);
    logged(
        &sshd,
        &["user presence (authenticator touch) requirement not met"],
        "no touch",
    );
    let c = ctx(&sshd, "no touch, no-touch-required");
    logged_in(&sk_ssh(port, &waived, Some("0x00"), "waived"), "waived", &c);
    logged(&sshd, &["ssh2: ECDSA-SK SHA256:"], "no-touch-required");
    let c = ctx(&sshd, "verify-required");
    refused(&sk_ssh(port, &verify, Some("0x01"), "never"), 1, &c);
    logged_in(
        &sk_ssh(port, &verify, Some("0x05"), "verified"),
        "verified",
        &c,
    );
}

/// skiffd with `config`, serving the fixture's authorized_keys.
fn skiffd(fx: &Fixture, config: &str) -> Skiffd {
    Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config))
}

#[test]
fn skiffd_admits_a_security_key_only_where_no_flag_is_required() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    // A key made no-touch-required asks its authenticator for no touch.
    let ed = sk_keygen(
        fx.path(),
        "sk_ed",
        KeyType::Ed25519Sk,
        &["no-touch-required"],
    );
    let ecdsa = sk_keygen(fx.path(), "sk_ecdsa", KeyType::EcdsaSk, &[]);
    let touch = sk_keygen(fx.path(), "sk_touch", KeyType::Ed25519Sk, &[]);
    let verify = sk_keygen(fx.path(), "sk_verify", KeyType::Ed25519Sk, &[]);
    fx.set_authorized(&[
        line("no-touch-required", &ed),
        line("no-touch-required", &ecdsa),
        line("", &touch),
        line("no-touch-required,verify-required", &verify),
    ]);
    let d = skiffd(&fx, "");
    let port = d.port();

    // No flag required: in, whatever the flags (skiffd cannot see them,
    // and sshd does not look either).
    let c = ctx(&d, "ed25519-sk, no-touch-required");
    logged_in(&sk_ssh(port, &ed, None, "ed"), "ed", &c);
    logged(
        &d,
        &["Accepted publickey for", "ED25519-SK SHA256:"],
        "ed25519-sk",
    );
    let c = ctx(&d, "ecdsa-sk, no-touch-required, touched");
    logged_in(&sk_ssh(port, &ecdsa, Some("0x01"), "ecdsa"), "ecdsa", &c);
    logged(&d, &["ECDSA-SK SHA256:"], "ecdsa-sk");

    // A touch required: refused, touched or not, and said why, before
    // the key is asked to sign (nobody touches it for nothing).
    for flags in ["0x01", "0x00"] {
        let c = ctx(&d, &format!("touch required, flags {flags}"));
        refused(&sk_ssh(port, &touch, Some(flags), "never"), 0, &c);
    }
    logged(
        &d,
        &["requires user presence (touch), and skiffd cannot check"],
        "touch required",
    );
    // verify-required: refused, even with a PIN.
    let c = ctx(&d, "verify-required");
    refused(&sk_ssh(port, &verify, Some("0x05"), "never"), 0, &c);
    logged(&d, &["requires user verification"], "verify-required");
}

#[test]
fn pubkey_auth_options_void_no_touch_required() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let key = sk_keygen(fx.path(), "sk", KeyType::Ed25519Sk, &["no-touch-required"]);
    fx.set_authorized(&[line("no-touch-required", &key)]);
    for (config, needs) in [
        ("PubkeyAuthOptions touch-required\n", "user presence"),
        ("PubkeyAuthOptions verify-required\n", "user verification"),
    ] {
        let d = skiffd(&fx, config);
        let c = ctx(&d, config);
        refused(&sk_ssh(d.port(), &key, Some("0x05"), "never"), 0, &c);
        logged(&d, &[&format!("requires {needs}")], config);
    }
    // Taken out of PubkeyAcceptedAlgorithms, security keys are refused
    // whatever their line says.
    let d = skiffd(&fx, "PubkeyAcceptedAlgorithms ssh-ed25519\n");
    let c = ctx(&d, "no sk- algorithm accepted");
    refused(&sk_ssh(d.port(), &key, None, "never"), 0, &c);
    logged(
        &d,
        &["not among PubkeyAcceptedAlgorithms"],
        "no sk- algorithm",
    );
    // A value sshd does not know is an error naming the line.
    let bad = fx.path().join("bad_config");
    write_file(&bad, "PubkeyAuthOptions touch\n", 0o644);
    let out = skiffd_with_bad_config(&fx.host_key, &bad);
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains(":1:") && out.stderr.contains("unsupported option \"touch\""),
        "{out}"
    );
}

/// A security key's user certificate, from a CA in `TrustedUserCAKeys`:
/// admitted when the CA waived the touch (`-O no-touch-required`), refused
/// otherwise.
#[test]
fn a_security_key_certificate_from_a_trusted_ca() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let waived = sk_keygen(
        fx.path(),
        "sk_waived",
        KeyType::Ed25519Sk,
        &["no-touch-required"],
    );
    let touch = sk_keygen(fx.path(), "sk_touch", KeyType::EcdsaSk, &[]);
    sign_user_key(
        &ca,
        &waived.public,
        "sk-waived",
        user(),
        &["-O", "no-touch-required"],
    );
    sign_user_key(&ca, &touch.public, "sk-touch", user(), &[]);
    // Neither key is in authorized_keys: only the certificates can do.
    let config = format!("TrustedUserCAKeys {}\n", ca.public.display());
    let d = skiffd(&fx, &config);
    let port = d.port();

    let c = ctx(&d, "sk certificate with no-touch-required");
    let cert = format!("CertificateFile={}", cert_path(&waived.private).display());
    logged_in(
        &sk_ssh_with(port, &waived, None, &[cert], "certified"),
        "certified",
        &c,
    );
    logged(
        &d,
        &[
            "Accepted publickey for",
            "ED25519-SK-CERT SHA256:",
            "ID sk-waived",
        ],
        "sk certificate",
    );

    // russh does not say whether a probe is for a certificate, and where a
    // CA is trusted skiffd lets every key go on to sign: the key signs for
    // its certificate, refused, then for itself, refused too.
    let c = ctx(&d, "sk certificate requiring a touch");
    let cert = format!("CertificateFile={}", cert_path(&touch.private).display());
    refused(&sk_ssh_with(port, &touch, None, &[cert], "never"), 2, &c);
    logged(
        &d,
        &["certificate refused", "cannot check"],
        "sk certificate, touch",
    );
}

/// `KEY-cert.pub`, where ssh-keygen -s writes a key's certificate.
fn cert_path(private: &Path) -> std::path::PathBuf {
    let mut p = private.as_os_str().to_owned();
    p.push("-cert.pub");
    p.into()
}
