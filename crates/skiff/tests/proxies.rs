//! ProxyJump (`-J`) and ProxyCommand against real OpenSSH: a private sshd
//! is the jump host, and the destination is another sshd or a skiffd.
//! Every jump host refuses forwarding except to the ports the test allows
//! (`PermitOpen`), so a command that works went through it.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use skiff_testkit::*;

/// A jump host (sshd) that forwards only to `permit_open`, and a client
/// home whose default identity is the fixture's client key (jump hosts
/// take no `-i`: that is for the destination, as with ssh) and which knows
/// the jump host's key.
struct Jump {
    sshd: Sshd,
    home: ClientHome,
}

impl Jump {
    fn start(fx: &Fixture, permit_open: &str) -> Jump {
        let line = format!("PermitOpen {permit_open}");
        let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&line]);
        let home = ClientHome::new();
        let id = home.ssh_dir().join("id_ed25519");
        fs::copy(&fx.client_key.private, &id).unwrap();
        fs::set_permissions(&id, fs::Permissions::from_mode(0o600)).unwrap();
        home.trust(sshd.port(), &fx.host_key);
        Jump { sshd, home }
    }

    /// `user@127.0.0.1:PORT` for `-J`.
    fn spec(&self) -> String {
        format!("{}@127.0.0.1:{}", user(), self.sshd.port())
    }
}

fn target_sshd(fx: &Fixture) -> Sshd {
    Sshd::start(&fx.host_key, &fx.authorized_keys, &[])
}

/// An sshd destination, a jump host that forwards only to it (by address
/// or as localhost) and knows its key, and both servers' logs for messages.
fn jump_to_sshd(fx: &Fixture) -> (Sshd, Jump, String) {
    let target = target_sshd(fx);
    let port = target.port();
    let jump = Jump::start(fx, &format!("127.0.0.1:{port} localhost:{port}"));
    jump.home.trust(port, &fx.host_key);
    let c = format!(
        "{}\n{}",
        server_context(&jump.sshd, "jump host"),
        server_context(&target, "destination")
    );
    (target, jump, c)
}

#[test]
fn exec_and_run_through_a_jump_host() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let (target, jump, c) = jump_to_sshd(&fx);
    let port = target.port();

    let out = skiff_exec(&jump.home, port, user(), Some(&fx.client_key))
        .flag("-J")
        .flag(&jump.spec())
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo through; echo $SSH_CONNECTION")
        .run();
    out.expect_code(0, &c);
    let text = out.stdout_str();
    assert!(text.starts_with("through\n127.0.0.1 "), "{c}\n{out}");
    assert!(
        jump.sshd.log().contains("Accepted publickey"),
        "{c}: skiff never logged in to the jump host"
    );

    // The same in ~/.ssh/config, through `skiff run` to two names the jump
    // host resolves.
    write_file(
        &jump.home.ssh_dir().join("config"),
        format!(
            "Host bastion\n  HostName 127.0.0.1\n  Port {}\n  User {}\nHost * !bastion\n  ProxyJump bastion\n",
            jump.sshd.port(),
            user()
        ),
        0o600,
    );
    let logins = |sshd: &Sshd| sshd.log().matches("Accepted publickey").count();
    let before = logins(&jump.sshd);
    let out = Run::new(skiff_bin())
        .env("HOME", jump.home.path())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .args(["run", "-i"])
        .arg(&fx.client_key.private)
        .args(["-l", user(), "-p", &port.to_string(), "-b"])
        .args(["127.0.0.1,localhost", "echo", "fanned"])
        .run();
    out.expect_code(0, &c);
    assert!(out.stdout_str().contains("fanned"), "{c}\n{out}");
    // Both hosts went through one login to the jump host.
    assert_eq!(logins(&jump.sshd), before + 1, "{c}\n{out}");

    // A destination the jump host will not forward to: the jump host says
    // no, and the message says which one.
    let closed = free_port();
    let out = skiff_exec(&jump.home, closed, user(), Some(&fx.client_key))
        .flag("-J")
        .flag(&jump.spec())
        .cmd("echo never")
        .run();
    out.expect_skiff_failure(
        &[
            &format!("jump host {}", jump.spec()),
            "could not open a connection",
        ],
        &c,
    );

    // A jump host that refuses us is reported as the jump host's failure.
    let out = skiff_exec(&ClientHome::new(), port, user(), Some(&fx.client_key))
        .flag("-J")
        .flag(&jump.spec())
        .opt("StrictHostKeyChecking=accept-new")
        .cmd("echo never")
        .run();
    out.expect_skiff_failure(&["jump host", "authentication failed"], &c);
}

/// The jump host and the destination log in with the same encrypted key:
/// its passphrase is asked for once.
#[test]
fn one_passphrase_serves_the_jump_host_and_the_destination() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let (target, jump, c) = jump_to_sshd(&fx);
    let port = target.port();
    fs::remove_file(jump.home.ssh_dir().join("id_ed25519")).unwrap();
    let config = jump.home.path().join("ssh_config");
    write_file(
        &config,
        format!(
            "Host *\n  IdentityFile {}\n  IdentitiesOnly yes\n",
            fx.encrypted_key.private.display()
        ),
        0o600,
    );
    let marker = jump.home.path().join("askpass-calls");
    let askpass = askpass_script(jump.home.path(), PASSPHRASE, &marker);
    let out = skiff_exec(&jump.home, port, user(), None)
        .config(&config)
        .interactive()
        .flag("-J")
        .flag(&jump.spec())
        .opt("StrictHostKeyChecking=yes")
        .askpass(&askpass)
        .cmd("echo through")
        .run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout_str(), "through\n", "{c}\n{out}");
    assert!(
        jump.sshd.log().contains("Accepted publickey"),
        "{c}: skiff never logged in to the jump host"
    );
    let calls = fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        calls.lines().count(),
        1,
        "{c}: one prompt for two logins\n{calls}\n{out}"
    );
    assert!(calls.contains("client_encrypted"), "{c}: {calls}");
}

#[test]
fn jump_hosts_that_jump_through_each_other_are_a_config_error() {
    let home = ClientHome::new();
    write_file(
        &home.ssh_dir().join("config"),
        "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n",
        0o600,
    );
    let out = SkiffExec::new(&home, "a").user_config().cmd("true").run();
    out.expect_skiff_failure(&["ProxyJump", "loop"], "ProxyJump loop");
}

#[test]
fn copy_through_a_jump_host_to_skiffd() {
    let Some((fx, skiffd)) = skiffd_setup() else {
        return;
    };
    let port = skiffd.port();
    let jump = Jump::start(&fx, &format!("127.0.0.1:{port}"));
    jump.home.trust(port, &fx.host_key);
    let c = server_context(&skiffd, "cp through a jump host");
    let src = fx.path().join("payload");
    let sum = random_file(&src, 3 * 1024 * 1024 + 7);
    let remote_dir = tempdir();
    fs::set_permissions(remote_dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let remote = remote_dir.path().join("copied");
    let out = Run::new(skiff_bin())
        .env("HOME", jump.home.path())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .args(["cp", "-q", "-F", "/dev/null", "-J", &jump.spec(), "-P"])
        .arg(port.to_string())
        .arg("-i")
        .arg(&fx.client_key.private)
        .arg(&src)
        .arg(format!("{}@127.0.0.1:{}", user(), remote.display()))
        .run();
    out.expect_code(0, &c);
    let copied = std::process::Command::new("sha256sum")
        .arg(&remote)
        .output()
        .expect("run sha256sum");
    assert_eq!(first_token(&copied.stdout), sum, "{c}\n{out}");
}

#[test]
fn proxy_command_runs_openssh_as_the_transport() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let target = target_sshd(&fx);
    let port = target.port();
    let jump = Jump::start(&fx, &format!("127.0.0.1:{port}"));
    jump.home.trust(port, &fx.host_key);
    let c = server_context(&target, "ProxyCommand");
    let proxy = format!(
        "ProxyCommand=ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no \
         -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {} -p {} -W %h:%p {}@127.0.0.1",
        fx.client_key.private.display(),
        jump.sshd.port(),
        user()
    );
    let out = skiff_exec(&jump.home, port, user(), Some(&fx.client_key))
        .opt(&proxy)
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo proxied")
        .run();
    out.expect_code(0, &c).expect_stdout("proxied\n", &c);

    // A command that exits at once: the failure names it.
    let out = skiff_exec(&jump.home, port, user(), Some(&fx.client_key))
        .opt("ProxyCommand=false")
        .cmd("echo never")
        .run();
    out.expect_skiff_failure(&["ProxyCommand \"false\""], &c);
}
