//! `skiff ssh -O check|stop|exit` against a real OpenSSH sshd: the agent
//! stands in for ssh's control master. `check` answers 0 ("Master running")
//! once the agent holds a live connection for the destination, computed as
//! the command line gives it (user@host, `-l`, `-p`), and 255 before; `stop`
//! makes the agent forget it (0), after which `check` says 255 again.
//! `forward`/`cancel`/`proxy` are refused with a clear error.

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// `skiff ssh ARGS` through this test's agent, with the options `AgentHome::exec`
/// gives `skiff exec` (so both name the same destination).
fn skiff_ssh(ah: &AgentHome, fx: &Fixture, args: &[&str]) -> CmdOutput {
    Run::new(skiff_bin())
        .env("HOME", ah.home.path())
        .env("SKIFF_AGENT", "on")
        .env("XDG_RUNTIME_DIR", ah.runtime.path())
        .env("XDG_STATE_HOME", ah.home.path().join("state"))
        .env_remove("SSH_AUTH_SOCK")
        .args(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-i"])
        .arg(&fx.client_key.private)
        .args(args)
        .run()
}

#[test]
fn check_and_stop_follow_the_agents_connection_to_sshd() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let ah = AgentHome::new();
    ah.home.trust(sshd.port(), &fx.host_key);
    let c = ctx(&sshd, "-O check/stop through the agent");
    let port = sshd.port().to_string();
    let at = format!("{}@127.0.0.1", user());
    let check = |extra: &[&str]| {
        let mut args = vec!["-O", "check"];
        args.extend_from_slice(extra);
        skiff_ssh(&ah, &fx, &args)
    };

    // No agent yet: nothing to check, and none is started for it.
    let out = check(&["-p", &port, &at]);
    out.expect_code(255, &c);
    assert!(ah.agent_pids().is_empty(), "{c}: -O check started an agent");

    // An agent with no connection to this destination: still 255.
    ah.agent_cmd(&[]).expect_code(0, &c);
    let out = check(&["-p", &port, &at]);
    out.expect_code(255, &c);
    assert!(!out.stderr.contains("Master running"), "{c}\n{out}");

    // After a command through the agent: 0, with the agent's pid.
    ah.exec(sshd.port(), &fx.client_key)
        .cmd("echo warm")
        .run()
        .expect_code(0, &c)
        .expect_stdout("warm\n", &c);
    let pids = ah.agent_pids();
    assert_eq!(pids.len(), 1, "{c}: one agent");
    let out = check(&["-p", &port, &at]);
    out.expect_code(0, &c);
    assert_eq!(
        out.stderr.trim_end(),
        format!("Master running (pid={})", pids[0]),
        "{c}\n{out}"
    );
    // The same destination spelled with -l and a port after it.
    check(&["-l", user(), "127.0.0.1", "-p", &port]).expect_code(0, &c);
    // Another destination (another port, another user) has no connection.
    check(&["-p", "1", &at]).expect_code(255, &c);
    check(&["-p", &port, "nobody-here@127.0.0.1"]).expect_code(255, &c);

    // stop: forgotten; check says so; stop again has nothing to stop.
    let out = skiff_ssh(&ah, &fx, &["-O", "stop", "-p", &port, &at]);
    out.expect_code(0, &c);
    assert!(
        out.stderr.contains("Stop listening request sent."),
        "{c}\n{out}"
    );
    check(&["-p", &port, &at]).expect_code(255, &c);
    skiff_ssh(&ah, &fx, &["-O", "stop", "-p", &port, &at]).expect_code(255, &c);
    let status = ah.agent_cmd(&["status"]);
    assert!(
        !status.stdout_str().contains(&format!("127.0.0.1:{port}")),
        "{c}: the agent still lists the connection\n{status}"
    );

    // A new command connects anew; exit forgets it as stop does.
    ah.exec(sshd.port(), &fx.client_key)
        .cmd("true")
        .run()
        .expect_code(0, &c);
    check(&["-p", &port, &at]).expect_code(0, &c);
    let out = skiff_ssh(&ah, &fx, &["-O", "exit", "-p", &port, &at]);
    out.expect_code(0, &c);
    assert!(out.stderr.contains("Exit request sent."), "{c}\n{out}");
    check(&["-p", &port, &at]).expect_code(255, &c);
}

#[test]
fn control_commands_skiff_cannot_serve_are_refused_clearly() {
    let home = ClientHome::new();
    for cmd in ["forward", "cancel", "proxy"] {
        let out = Run::new(skiff_bin())
            .env("HOME", home.path())
            .args(["ssh", "-F", "/dev/null", "-O", cmd, "somewhere"])
            .run();
        out.expect_code(255, cmd);
        assert!(
            out.stderr.contains("-O") && out.stderr.contains("not supported by skiff"),
            "{cmd}\n{out}"
        );
    }
    let out = Run::new(skiff_bin())
        .env("HOME", home.path())
        .args(["ssh", "-F", "/dev/null", "-O", "bogus", "somewhere"])
        .run();
    out.expect_code(255, "bogus");
    assert!(out.stderr.contains("invalid control command"), "{out}");
}
