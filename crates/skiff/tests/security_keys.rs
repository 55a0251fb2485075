//! Security keys (FIDO): skiff signs in with `ed25519-sk` and `ecdsa-sk`
//! keys and their certificates held by ssh-agent, which signs through its
//! FIDO middleware, here a software security key (`skiff-soft-sk`, loaded
//! with `ssh-add -S`). A security-key file the agent does not hold is not
//! offered, and the error says how to load it there (with the
//! `SecurityKeyProvider` given).

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

fn trusting_home(port: u16, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    home.trust(port, &fx.host_key);
    home
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

/// `skiff exec` as the test account through the agent at `agent`, with no
/// key file of its own.
fn via_agent(home: &ClientHome, port: u16, agent: &Agent, word: &str) -> CmdOutput {
    skiff_exec(home, port, user(), None)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd(&format!("echo {word}"))
        .run()
}

#[test]
fn agent_held_security_keys_to_stock_sshd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ed = sk_keygen(fx.path(), "sk_ed", KeyType::Ed25519Sk, &[]);
    let ecdsa = sk_keygen(fx.path(), "sk_ecdsa", KeyType::EcdsaSk, &[]);
    // Plain lines: sshd requires a touch, so the signatures that get in
    // carried one.
    fx.set_authorized(&[ed.pub_line(), ecdsa.pub_line()]);
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let port = sshd.port();
    let home = trusting_home(port, &fx);

    for (key, kind) in [(&ed, "ED25519-SK"), (&ecdsa, "ECDSA-SK")] {
        let agent = sk_agent(None);
        agent.add_security_key(key, soft_sk_library());
        let c = ctx(&sshd, &format!("{kind} in ssh-agent"));
        let out = via_agent(&home, port, &agent, "touched");
        out.expect_code(0, &c).expect_stdout("touched\n", &c);
        let accepted = format!("Accepted publickey for {}", user());
        logged(&sshd, &[&accepted, &format!("ssh2: {kind} SHA256:")], kind);
    }

    // An agent whose key signs without a touch gets nobody in: sshd checks
    // the flags skiff passed on.
    let untouched = sk_agent(Some("0x00"));
    untouched.add_security_key(&ed, soft_sk_library());
    let c = ctx(&sshd, "no touch");
    via_agent(&home, port, &untouched, "never")
        .expect_skiff_failure(&["authentication failed", "agent key SHA256:"], &c);
    logged(
        &sshd,
        &["user presence (authenticator touch) requirement not met"],
        "no touch",
    );
}

#[test]
fn an_agent_held_security_key_certificate_to_stock_sshd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let key = sk_keygen(fx.path(), "sk_cert", KeyType::Ed25519Sk, &[]);
    sign_user_key(&ca, &key.public, "sk-user", user(), &[]);
    // Only the certificate lets the key in.
    fx.set_authorized(&[]);
    let trusted = format!("TrustedUserCAKeys {}", ca.public.display());
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&trusted]);
    let port = sshd.port();
    let agent = sk_agent(None);
    // ssh-add loads KEY-cert.pub along with the key.
    agent.add_security_key(&key, soft_sk_library());
    assert!(
        agent.list().contains("sk-ssh-ed25519-cert-v01@openssh.com"),
        "{}",
        agent.list()
    );
    let c = ctx(&sshd, "sk certificate in ssh-agent");
    let out = via_agent(&trusting_home(port, &fx), port, &agent, "certified");
    out.expect_code(0, &c).expect_stdout("certified\n", &c);
    logged(
        &sshd,
        &["Accepted certificate ID \"sk-user\""],
        "sk certificate",
    );
}

#[test]
fn an_agent_held_security_key_to_skiffd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let key = sk_keygen(fx.path(), "sk", KeyType::Ed25519Sk, &["no-touch-required"]);
    // skiffd admits a security key only where no flag is required.
    fx.set_authorized(&[format!("no-touch-required {}", key.pub_line())]);
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let port = d.port();
    let agent = sk_agent(None);
    agent.add_security_key(&key, soft_sk_library());
    let c = ctx(&d, "sk key in ssh-agent to skiffd");
    let out = via_agent(&trusting_home(port, &fx), port, &agent, "in");
    out.expect_code(0, &c).expect_stdout("in\n", &c);
    logged(&d, &["ED25519-SK SHA256:"], "sk key to skiffd");
}

#[test]
fn a_security_key_file_without_the_agent_says_to_load_it_there() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let key = sk_keygen(fx.path(), "sk", KeyType::Ed25519Sk, &[]);
    fx.set_authorized(&[key.pub_line()]);
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let port = sshd.port();
    let home = trusting_home(port, &fx);
    let path = key.private.display().to_string();
    let c = ctx(&sshd, "sk key file, no agent");

    let out = skiff_exec(&home, port, user(), Some(&key))
        .opt("IdentitiesOnly=yes")
        .cmd("echo never")
        .run();
    out.expect_skiff_failure(
        &[
            "authentication failed",
            "security-key (fido) key",
            &format!("`ssh-add {path}`"),
        ],
        &c,
    );

    // With SecurityKeyProvider (-o), the command names it; an agent that
    // does not hold the key changes nothing.
    let lib = soft_sk_library().display().to_string();
    let agent = sk_agent(None);
    let out = skiff_exec(&home, port, user(), Some(&key))
        .opt("IdentitiesOnly=yes")
        .opt(&format!("SecurityKeyProvider={lib}"))
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo never")
        .run();
    out.expect_skiff_failure(&[&format!("`ssh-add -S {lib} {path}`")], &c);

    // Loaded as the error says, it signs in.
    agent.add_security_key(&key, soft_sk_library());
    let out = skiff_exec(&home, port, user(), Some(&key))
        .opt("IdentitiesOnly=yes")
        .env("SSH_AUTH_SOCK", &agent.sock)
        .cmd("echo loaded")
        .run();
    out.expect_code(0, &c).expect_stdout("loaded\n", &c);
}
