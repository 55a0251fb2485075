//! skiff against dropbear's server, the SSH server of routers, containers
//! and rescue images: commands (status, output, input, a large output),
//! and copies both ways over SFTP (dropbear runs OpenSSH's sftp-server),
//! on skiff's own connection and through the agent. The host key is
//! checked against known_hosts as for any server.
//!
//! Run as root (as CI does): dropbear serves a temporary account of the
//! test's own, whose `~/.ssh/authorized_keys` it reads.

use std::path::Path;

use skiff_testkit::*;

/// A dropbear presenting the fixture's host key, an account it lets the
/// fixture's client key into, and a client HOME that trusts it.
struct Env {
    fx: Fixture,
    dropbear: Dropbear,
    account: TempAccount,
    home: ClientHome,
}

impl Env {
    fn new(tag: &str) -> Option<Env> {
        if !require_dropbear() || !require_openssh() {
            return None;
        }
        let fx = Fixture::new();
        let account = TempAccount::create(tag, "/bin/sh");
        authorize_in_home(
            &account.account,
            &[
                fx.client_key.pub_line(),
                fx.rsa_key.pub_line(),
                fx.ecdsa_key.pub_line(),
            ],
        );
        let dropbear = Dropbear::start(&fx.host_key);
        let home = ClientHome::new();
        home.trust(dropbear.port(), &fx.host_key);
        Some(Env {
            fx,
            dropbear,
            account,
            home,
        })
    }

    fn exec(&self, command: &str) -> SkiffExec {
        skiff_exec(
            &self.home,
            self.dropbear.port(),
            self.account.name(),
            Some(&self.fx.client_key),
        )
        .cmd(command)
    }

    fn remote(&self, path: &Path) -> String {
        format!("{}@127.0.0.1:{}", self.account.name(), path.display())
    }

    fn ctx(&self, what: &str) -> String {
        server_context(&self.dropbear, what)
    }
}

#[test]
fn commands_run_on_dropbear_with_their_status_output_and_input() {
    let Some(env) = Env::new("dbx") else {
        return;
    };
    let c = env.ctx("a command that writes both ways and exits 3");
    let out = env.exec("echo out; echo err >&2; id -un; exit 3").run();
    out.expect_code(3, &c);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("out\n{}\n", env.account.name()),
        "{c}"
    );
    assert_eq!(out.stderr, "err\n", "{c}");

    let c = env.ctx("input through cat");
    let input: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let out = env.exec("cat").input(Input::Bytes(input.clone())).run();
    out.expect_code(0, &c);
    assert!(out.stdout == input, "{c}: {} bytes back", out.stdout.len());

    // More than dropbear's channel window, so its window adjustments and
    // skiff's are both exercised.
    let c = env.ctx("a large output");
    let out = env.exec("head -c 20000000 /dev/zero").run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout.len(), 20_000_000, "{c}");
    assert!(out.stdout.iter().all(|&b| b == 0), "{c}");
}

#[test]
fn copies_go_both_ways_to_dropbear_over_sftp_directly_and_through_the_agent() {
    let Some(env) = Env::new("dbc") else {
        return;
    };
    let work = tempdir();
    let src = work.path().join("src");
    let sum = random_file(&src, 3_000_000);
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).expect("mkdir");
    let leaf_sum = random_file(&tree.join("a/b/leaf"), 70_000);
    let top_sum = random_file(&tree.join("top"), 10);
    let ah = AgentHome::new();
    let port = env.dropbear.port();
    let key = &env.fx.client_key;
    for via_agent in [false, true] {
        let how = if via_agent {
            "through the agent"
        } else {
            "directly"
        };
        let cp = |args: &[&str]| match via_agent {
            true => skiff_cp_via_agent(&ah, port, key, args),
            false => skiff_cp(port, key, args),
        };
        let into = env.account.account.home.join(format!("in-{via_agent}"));
        let c = env.ctx(&format!("upload {how}"));
        cp(&[s(&src), &env.remote(&into)]).expect_code(0, &c);
        assert_eq!(sha256(&into), sum, "{c}");

        let back = work.path().join(format!("back-{via_agent}"));
        let c = env.ctx(&format!("download {how}"));
        cp(&[&env.remote(&into), s(&back)]).expect_code(0, &c);
        assert_eq!(sha256(&back), sum, "{c}");

        let remote_tree = env.account.account.home.join(format!("tree-{via_agent}"));
        let c = env.ctx(&format!("a tree up {how}"));
        cp(&["-r", s(&tree), &env.remote(&remote_tree)]).expect_code(0, &c);
        assert_eq!(sha256(&remote_tree.join("a/b/leaf")), leaf_sum, "{c}");
        assert_eq!(sha256(&remote_tree.join("top")), top_sum, "{c}");

        let c = env.ctx(&format!("a missing file {how}"));
        let missing = env.account.account.home.join("missing");
        let out = cp(&[&env.remote(&missing), s(&work.path().join("nothing"))]);
        out.expect_code(1, &c);
        assert!(out.stderr.contains("missing"), "{c}: names the file\n{out}");
    }
    assert_eq!(ah.agent_pids().len(), 1, "an agent carried the copies");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// `skiff ssh -W` (a direct-tcpip channel) and `-R` (dropbear listens,
/// skiff connects what comes in) through dropbear, to a line echo server.
#[test]
fn skiff_ssh_forwards_both_ways_through_dropbear() {
    let Some(env) = Env::new("dbf") else {
        return;
    };
    let echo = echo_server();
    let ssh = |args: &[&str]| {
        Run::new(skiff_bin())
            .env("HOME", env.home.path())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
            .args(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-i"])
            .arg(&env.fx.client_key.private)
            .args(["-p", &env.dropbear.port().to_string()])
            .args(args)
    };
    let dest = format!("{}@127.0.0.1", env.account.name());
    let c = env.ctx("skiff ssh -W through dropbear");
    ssh(&["-W", &format!("127.0.0.1:{}", echo.port), &dest])
        .input(Input::Bytes(b"one\ntwo\n".to_vec()))
        .run()
        .expect_code(0, &c)
        .expect_stdout(TWO_ECHOES, &c);

    let c = env.ctx("skiff ssh -R through dropbear");
    let remote = free_port();
    ssh(&[
        "-o",
        "ExitOnForwardFailure=yes",
        "-R",
        &format!("127.0.0.1:{remote}:127.0.0.1:{}", echo.port),
        &dest,
        &talk_to_command(remote),
    ])
    .run()
    .expect_code(0, &c)
    .expect_stdout(TWO_ECHOES, &c);
    assert_eq!(echo.connections(), 2, "{c}");
}

/// RSA (with SHA-2 signatures) and ECDSA keys, as dropbear's host key and
/// as skiff's user key, each checked the usual way.
#[test]
fn rsa_and_ecdsa_keys_work_both_as_host_and_as_user_keys() {
    let Some(mut env) = Env::new("dbk") else {
        return;
    };
    let [rsa, ecdsa] = [env.fx.rsa_key.clone(), env.fx.ecdsa_key.clone()];
    for key in [&rsa, &ecdsa] {
        let what = format!("{:?}", key.kind);
        env.dropbear.restart_with_host_key(key);
        let home = ClientHome::new();
        home.trust(env.dropbear.port(), key);
        let c = env.ctx(&format!("{what} host key, {what} user key"));
        skiff_exec(&home, env.dropbear.port(), env.account.name(), Some(key))
            .cmd("echo in")
            .run()
            .expect_code(0, &c)
            .expect_stdout("in\n", &c);
    }
    // dropbear now shows an ECDSA key where known_hosts holds an Ed25519
    // one: a changed key, refused under the default (accept-new) and not
    // recorded, as OpenSSH's ssh refuses it.
    let c = env.ctx("a host key of another type than the known one");
    let known = std::fs::read(env.home.known_hosts()).expect("read known_hosts");
    let out = env.exec("echo in").run();
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}: nothing ran\n{out}");
    assert!(out.stderr.contains("HAS CHANGED"), "{c}\n{out}");
    assert_eq!(
        std::fs::read(env.home.known_hosts()).expect("read known_hosts"),
        known,
        "{c}: nothing recorded"
    );
    let theirs = Run::new("ssh")
        .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-o"])
        .arg(format!(
            "UserKnownHostsFile={}",
            env.home.known_hosts().display()
        ))
        .args(["-o", "StrictHostKeyChecking=accept-new", "-i"])
        .arg(&env.fx.client_key.private)
        .args(["-p", &env.dropbear.port().to_string()])
        .arg(format!("{}@127.0.0.1", env.account.name()))
        .arg("echo in")
        .run();
    assert_eq!(theirs.code, 255, "{c}: ssh refuses it too\n{theirs}");
}
