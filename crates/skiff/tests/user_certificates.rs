//! User certificates: skiff authenticates to a real OpenSSH sshd that
//! trusts a user CA (`TrustedUserCAKeys`) with a certificate found beside
//! the key (`KEY-cert.pub`), named by `CertificateFile`, or held by
//! ssh-agent; RSA certificates sign with SHA-2. The keys used are in no
//! authorized_keys file, so only the certificate can let them in.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Signs `key`'s public half with `ca` as a user certificate for
/// `principals`, written beside the key as `KEY-cert.pub`.
fn user_certificate(ca: &Key, key: &Key, principals: &str) -> PathBuf {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-s"])
        .arg(&ca.private)
        .args(["-I", "skiff-test-user", "-n", principals, "-V", "-5m:+1h"])
        .arg(&key.public)
        .output()
        .expect("run ssh-keygen -s");
    assert!(
        out.status.success(),
        "ssh-keygen -s failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cert = key.private.as_os_str().to_owned();
    cert.push("-cert.pub");
    PathBuf::from(cert)
}

/// A fixture, a user CA and sshd trusting it.
fn setup() -> Option<(Fixture, Key, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let line = format!("TrustedUserCAKeys {}", ca.public.display());
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&line]);
    Some((fx, ca, sshd))
}

fn trusting_home(port: u16, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);
    home
}

fn run_as(home: &ClientHome, port: u16, key: &Path, command: &str) -> CmdOutput {
    skiff_exec(home, port, user(), None)
        .key(key)
        .opt("IdentitiesOnly=yes")
        .cmd(command)
        .run()
}

#[test]
fn a_certificate_beside_the_key_or_named_by_certificate_file() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "user certificates");
    let home = trusting_home(port, &fx);

    // The stranger's key alone is refused.
    let out = run_as(&home, port, &fx.stranger_key.private, "echo never");
    out.expect_skiff_failure(&["authentication failed"], &c);

    // Its certificate beside it lets it in.
    let cert = user_certificate(&ca, &fx.stranger_key, user());
    let out = run_as(&home, port, &fx.stranger_key.private, "echo beside");
    out.expect_code(0, &c).expect_stdout("beside\n", &c);
    assert!(
        sshd.log()
            .contains("Accepted certificate ID \"skiff-test-user\""),
        "{c}"
    );

    // Moved away, it is found through CertificateFile.
    let moved = fx.path().join("elsewhere-cert.pub");
    fs::rename(&cert, &moved).unwrap();
    run_as(&home, port, &fx.stranger_key.private, "echo never")
        .expect_skiff_failure(&["authentication failed"], &c);
    let out = skiff_exec(&home, port, user(), None)
        .key(&fx.stranger_key.private)
        .opt("IdentitiesOnly=yes")
        .opt(&format!("CertificateFile={}", moved.display()))
        .cmd("echo configured")
        .run();
    out.expect_code(0, &c).expect_stdout("configured\n", &c);

    // A certificate for another principal does not let the account in, and
    // the failure lists it among what was tried.
    let other = fx.keygen("other_user", KeyType::Ed25519, None);
    user_certificate(&ca, &other, "somebody-else");
    let out = run_as(&home, port, &other.private, "echo never");
    out.expect_skiff_failure(
        &["authentication failed", "certificate \"skiff-test-user\""],
        &c,
    );
}

#[test]
fn an_rsa_certificate_signs_with_sha2() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "RSA user certificate");
    let home = trusting_home(port, &fx);
    let rsa = fx.keygen("rsa_stranger", KeyType::Rsa, None);
    user_certificate(&ca, &rsa, user());
    let out = run_as(&home, port, &rsa.private, "echo rsa-cert");
    out.expect_code(0, &c).expect_stdout("rsa-cert\n", &c);
    // sshd 8.8+ refuses SHA-1 signatures, so this was rsa-sha2-*.
    assert!(sshd.log().contains("RSA-CERT"), "{c}");
}

#[test]
fn a_certificate_held_by_ssh_agent() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "agent-held user certificate");
    let home = trusting_home(port, &fx);
    user_certificate(&ca, &fx.stranger_key, user());
    let agent = Agent::start();
    // ssh-add loads KEY-cert.pub along with the key.
    agent.add(&fx.stranger_key);
    assert!(
        agent.list().contains("-cert-v01@openssh.com"),
        "{}",
        agent.list()
    );
    // The key file is gone: only the agent can sign.
    fs::remove_file(&fx.stranger_key.private).unwrap();
    let out = skiff_exec(&home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo from-agent")
        .run();
    out.expect_code(0, &c).expect_stdout("from-agent\n", &c);
    assert!(
        sshd.log()
            .contains("Accepted certificate ID \"skiff-test-user\""),
        "{c}"
    );
}

/// Through the agent: a CertificateFile reaches it (and, being part of
/// what a connection was authenticated with, keeps apart the connections
/// it pools).
#[test]
fn through_the_agent() {
    let Some((fx, ca, sshd)) = setup() else {
        return;
    };
    let port = sshd.port();
    let c = server_context(&sshd, "user certificate through the agent");
    let agent = AgentHome::new();
    agent.home.trust(port, &fx.host_key);
    let cert = user_certificate(&ca, &fx.stranger_key, user());
    let moved = fx.path().join("elsewhere-cert.pub");
    fs::rename(&cert, &moved).unwrap();
    let out = agent
        .exec(port, &fx.stranger_key)
        .opt("IdentitiesOnly=yes")
        .opt(&format!("CertificateFile={}", moved.display()))
        .cmd("echo via-agent")
        .run();
    out.expect_code(0, &c).expect_stdout("via-agent\n", &c);
    agent
        .exec(port, &fx.stranger_key)
        .opt("IdentitiesOnly=yes")
        .cmd("echo never")
        .run()
        .expect_skiff_failure(&["authentication failed"], &c);
}
