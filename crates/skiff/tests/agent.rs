//! `skiff exec` through the auto-spawned agent, with real processes, a real
//! Unix socket and real servers: ten simultaneous first calls start exactly
//! one agent; socket and directory modes; output, stdin, exit codes and
//! signals through the agent; many sequential and concurrent warm calls;
//! 50 concurrent calls against OpenSSH sshd with MaxSessions 10; recovery
//! after the agent is SIGKILLed and after the server restarts; stop.
//! Every test uses its own socket directory and stops its own agent.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

fn trust(ah: &AgentHome, server: &dyn Daemon, fx: &Fixture) {
    ah.home.trust(server.port(), &fx.host_key);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

/// Runs `n` calls through the agent at once; call `i` runs `command(i)` and
/// must print `expected(i)` and exit with `code(i)`.
fn concurrent_calls(
    ah: &AgentHome,
    port: u16,
    key: &Key,
    n: i32,
    command: impl Fn(i32) -> String,
    expected: impl Fn(i32) -> (i32, String),
    c: &str,
) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let run = ah.exec(port, key).cmd(&command(i));
            thread::spawn(move || (i, run.run()))
        })
        .collect();
    for h in handles {
        let (i, out) = h.join().expect("thread");
        let (code, stdout) = expected(i);
        out.expect_code(code, c).expect_stdout(&stdout, c);
    }
}

#[test]
fn ten_simultaneous_first_calls_start_exactly_one_agent() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "10 concurrent first calls");
    concurrent_calls(
        &ah,
        d.port(),
        &fx.client_key,
        10,
        |i| format!("echo call-{i}"),
        |i| (0, format!("call-{i}\n")),
        &c,
    );
    assert_eq!(ah.agent_pids().len(), 1, "{c}: exactly one agent must run");
    assert_eq!(mode(&ah.agent_dir()), 0o700, "agent directory mode");
    assert_eq!(
        mode(&ah.agent_dir().join("agent.sock")),
        0o600,
        "agent socket mode"
    );
    // Input through the agent counts as sent, output as received.
    ah.exec(d.port(), &fx.client_key)
        .cmd("cat >/dev/null")
        .input(Input::Bytes(vec![b'x'; 2048]))
        .run()
        .expect_code(0, &c);
    let status = ah.agent_cmd(&["status"]);
    status.expect_code(0, &c);
    let text = status.stdout_str();
    assert!(
        text.contains(&format!("127.0.0.1:{}", d.port())),
        "{c}: status lists the connection\n{status}"
    );
    // Ten outputs of "call-N\n", seven bytes each.
    assert!(
        text.contains("received 70 B  sent 2.0 KiB"),
        "{c}: status counts the bytes each way\n{status}"
    );
}

#[test]
fn output_stdin_exit_codes_and_signals_through_the_agent() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "through the agent");
    let out = ah
        .exec(d.port(), &fx.client_key)
        .cmd("echo out; echo err >&2; exit 7")
        .run();
    out.expect_code(7, &c).expect_stdout("out\n", &c);
    assert_eq!(out.stderr, "err\n", "{c}\n{out}");
    let out = ah
        .exec(d.port(), &fx.client_key)
        .cmd("cat; exit 3")
        .input(Input::Bytes(b"from stdin\n".to_vec()))
        .run();
    out.expect_code(3, &c).expect_stdout("from stdin\n", &c);
    let out = ah.exec(d.port(), &fx.client_key).cmd("kill -9 $$").run();
    out.expect_code(137, &c);
    let out = ah
        .exec(d.port(), &fx.client_key)
        .flag("-n")
        .cmd("cat; echo done")
        .run();
    out.expect_code(0, &c).expect_stdout("done\n", &c);
    assert_eq!(ah.agent_pids().len(), 1, "{c}: the calls used the agent");
}

#[test]
fn many_sequential_and_concurrent_warm_calls() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "warm calls");
    for i in 0..1000 {
        let out = ah
            .exec(d.port(), &fx.client_key)
            .cmd(&format!("echo seq-{i}"))
            .run();
        out.expect_code(0, &c)
            .expect_stdout(&format!("seq-{i}\n"), &c);
    }
    concurrent_calls(
        &ah,
        d.port(),
        &fx.client_key,
        64,
        |i| format!("sleep 0.2; echo par-{i}; exit {}", i % 5),
        |i| (i % 5, format!("par-{i}\n")),
        &c,
    );
    let status = ah.agent_cmd(&["status"]).stdout_str();
    assert_eq!(
        status.matches(&format!("127.0.0.1:{}", d.port())).count(),
        1,
        "{c}: one warm connection\n{status}"
    );
}

#[test]
fn fifty_concurrent_calls_against_sshd_max_sessions_10() {
    let Some((fx, sshd)) = sshd_setup(&["MaxSessions 10", "MaxStartups 100"]) else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &sshd, &fx);
    let c = ctx(&sshd, "50 concurrent through the agent");
    concurrent_calls(
        &ah,
        sshd.port(),
        &fx.client_key,
        50,
        |i| format!("sleep 0.5; echo job-{i}"),
        |i| (0, format!("job-{i}\n")),
        &c,
    );
}

#[test]
fn recovers_after_the_agent_is_killed_and_after_a_server_restart() {
    let Some((fx, mut d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "agent recovery");
    ah.exec(d.port(), &fx.client_key)
        .cmd("true")
        .run()
        .expect_code(0, &c);
    let first = ah.agent_pids();
    assert_eq!(first.len(), 1, "{c}");
    // A command in flight when the agent dies: the CLI must not hang.
    let running = ah.exec(d.port(), &fx.client_key).cmd("sleep 5; echo late");
    let waiter = thread::spawn(move || running.run());
    thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) on this test's agent.
    unsafe { libc::kill(first[0] as i32, libc::SIGKILL) };
    let started = Instant::now();
    let out = waiter.join().expect("thread");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{c}: the CLI noticed the dead agent promptly"
    );
    out.expect_skiff_failure(&["agent"], &c);
    // The next call starts a fresh agent (the stale socket is cleaned up).
    let out = ah.exec(d.port(), &fx.client_key).cmd("echo fresh").run();
    out.expect_code(0, &c).expect_stdout("fresh\n", &c);
    let second = ah.agent_pids();
    assert_eq!(second.len(), 1, "{c}");
    assert_ne!(second, first, "{c}: a new agent process");
    // The server restarts: the agent's warm connection dies and is replaced.
    d.restart();
    let out = ah
        .exec(d.port(), &fx.client_key)
        .cmd("echo after-restart")
        .run();
    out.expect_code(0, &c).expect_stdout("after-restart\n", &c);
    // `stop` ends the agent.
    ah.agent_cmd(&["stop"]).expect_code(0, &c);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ah.agent_pids().is_empty() {
        assert!(
            Instant::now() < deadline,
            "{c}: agent still running after stop"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A CLI killed mid-command (as by Ctrl-C twice, or a crash): the agent
/// closes that command's channel, and skiffd hangs the command up, so it
/// does not run on. The marker sleep duration identifies the remote process.
/// Starts `skiff exec -n ... command` through the agent in the background,
/// its stdout going to `stdout`.
fn spawn_through_agent(
    ah: &AgentHome,
    port: u16,
    key: &Key,
    command: &str,
    stdout: std::process::Stdio,
) -> std::process::Child {
    Command::new(skiff_bin())
        .args(["exec", "-F", "/dev/null", "-o", "BatchMode=yes", "-n", "-i"])
        .arg(&key.private)
        .args([
            "-p",
            &port.to_string(),
            &format!("{}@127.0.0.1", user()),
            command,
        ])
        .env("HOME", ah.home.path())
        .env("SKIFF_AGENT", "on")
        .env("XDG_RUNTIME_DIR", ah.runtime.path())
        .stdout(stdout)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn skiff")
}

#[test]
fn killing_the_cli_ends_its_remote_command() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "CLI killed mid-command");
    ah.exec(d.port(), &fx.client_key)
        .cmd("true")
        .run()
        .expect_code(0, &c);
    let marker = "sleep 47.25";
    let remote_alive = || {
        let out = Command::new("pgrep")
            .args(["-f", marker])
            .output()
            .expect("pgrep");
        !out.stdout.is_empty()
    };
    let mut cli = spawn_through_agent(
        &ah,
        d.port(),
        &fx.client_key,
        marker,
        std::process::Stdio::null(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !remote_alive() {
        assert!(
            Instant::now() < deadline,
            "{c}: the remote command never started"
        );
        thread::sleep(Duration::from_millis(50));
    }
    cli.kill().expect("kill the CLI");
    let _ = cli.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while remote_alive() {
        assert!(
            Instant::now() < deadline,
            "{c}: the remote command outlived its CLI by 10 s"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // The agent itself is fine and keeps serving.
    let out = ah
        .exec(d.port(), &fx.client_key)
        .cmd("echo still-here")
        .run();
    out.expect_code(0, &c).expect_stdout("still-here\n", &c);
}

/// `-tt` through the agent: the remote command gets a terminal and TERM;
/// a key with `no-pty` makes the forced terminal fail cleanly, as directly.
#[test]
fn forced_terminal_through_the_agent() {
    let Some((fx, [no_pty], d)) = skiffd_with_keys([("no_pty", "no-pty")]) else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "-tt through the agent");
    let out = ah
        .exec(d.port(), &fx.client_key)
        .flag("-tt")
        .env("TERM", "xterm")
        .cmd("tty; echo term=$TERM")
        .run();
    out.expect_code(0, &c);
    let text = out.stdout_str().replace('\r', "");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2 && is_pts_path(lines[0]),
        "{c}: a pty path first\n{out}"
    );
    assert_eq!(lines[1], "term=xterm", "{c}\n{out}");
    assert_eq!(ah.agent_pids().len(), 1, "{c}: it went through the agent");
    let out = ah
        .exec(d.port(), &no_pty)
        .opt("IdentitiesOnly=yes")
        .flag("-tt")
        .cmd("echo ran")
        .run();
    out.expect_skiff_failure(&["PTY allocation request failed"], &c);
}

/// A decision only a person can make (an unknown host under
/// StrictHostKeyChecking=ask) is never taken by the agent: it hands the call
/// back and the CLI asks itself. With no terminal here the CLI then refuses,
/// with its own message (the agent's would name BatchMode), and nothing is
/// recorded.
#[test]
fn agent_hands_person_decisions_back_to_the_cli() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    let c = ctx(&d, "unknown host under ask, through the agent");
    let out = ah
        .exec(d.port(), &fx.client_key)
        .interactive()
        .opt("StrictHostKeyChecking=ask")
        .cmd("echo ran")
        .run();
    out.expect_skiff_failure(&["no terminal to ask"], &c);
    assert!(
        !out.stderr.contains("BatchMode"),
        "{c}: the CLI, not the agent, answered\n{out}"
    );
    assert_eq!(
        ah.agent_pids().len(),
        1,
        "{c}: the call went to the agent first"
    );
    assert!(
        !ah.home.known_hosts().exists()
            || std::fs::read_to_string(ah.home.known_hosts())
                .unwrap()
                .is_empty(),
        "{c}: nothing may be recorded without a person's yes"
    );
}

#[test]
fn idle_agent_exits_on_its_own() {
    if !require_openssh() {
        return;
    }
    let ah = AgentHome::new();
    std::fs::create_dir(ah.agent_dir()).expect("mkdir");
    std::fs::set_permissions(ah.agent_dir(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let mut child = Command::new(skiff_bin())
        .args(["agent", "--foreground", "--persist", "1", "--dir"])
        .arg(ah.agent_dir())
        .env("HOME", ah.home.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn agent");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agent with --persist 1 did not exit within 15 s");
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "idle exit is a clean exit: {status}");
    assert!(
        !ah.agent_dir().join("agent.sock").exists(),
        "socket removed on exit"
    );
}

/// Starts `skiff agent --foreground --persist SECS` on this test's directory
/// by hand (as a user would) and waits until it listens.
fn start_agent_by_hand(ah: &AgentHome, persist_secs: u32) -> std::process::Child {
    std::fs::create_dir_all(ah.agent_dir()).expect("mkdir");
    std::fs::set_permissions(ah.agent_dir(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let child = Command::new(skiff_bin())
        .args(["agent", "--foreground", "--persist"])
        .arg(persist_secs.to_string())
        .arg("--dir")
        .arg(ah.agent_dir())
        .env("HOME", ah.home.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn agent");
    let sock = ah.agent_dir().join("agent.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "agent did not listen within 10 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Polls `skiff agent status` until `done(stdout)` or the time is up.
fn wait_for_status(ah: &AgentHome, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let status = ah.agent_cmd(&["status"]).stdout_str();
        if done(&status) || Instant::now() >= deadline {
            return status;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn idle_connection_closes_after_the_hosts_control_persist() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "ControlPersist 1 under an agent persisting 60 s");
    let mut agent = start_agent_by_hand(&ah, 60);
    ah.exec(d.port(), &fx.client_key)
        .opt("ControlPersist=1")
        .cmd("echo one")
        .run()
        .expect_code(0, &c)
        .expect_stdout("one\n", &c);
    let dest = format!("127.0.0.1:{}", d.port());
    let status = ah.agent_cmd(&["status"]).stdout_str();
    assert!(status.contains(&dest), "{c}: connection pooled\n{status}");
    let status = wait_for_status(&ah, Duration::from_secs(10), |s| {
        s.contains("no connections")
    });
    assert!(
        status.contains("no connections"),
        "{c}: the idle connection must be closed after about 1 s\n{status}"
    );
    assert!(
        agent.try_wait().expect("wait").is_none(),
        "{c}: the agent itself persists 60 s"
    );
    // The next call simply reconnects.
    ah.exec(d.port(), &fx.client_key)
        .cmd("echo two")
        .run()
        .expect_code(0, &c)
        .expect_stdout("two\n", &c);
}

#[test]
fn control_persist_yes_keeps_the_connection_and_the_agent() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "ControlPersist yes under an agent persisting 1 s");
    let mut agent = start_agent_by_hand(&ah, 1);
    ah.exec(d.port(), &fx.client_key)
        .opt("ControlPersist=yes")
        .cmd("echo kept")
        .run()
        .expect_code(0, &c)
        .expect_stdout("kept\n", &c);
    thread::sleep(Duration::from_secs(3));
    assert!(
        agent.try_wait().expect("wait").is_none(),
        "{c}: an agent holding a ControlPersist=yes connection must not exit"
    );
    let status = ah.agent_cmd(&["status"]).stdout_str();
    assert!(
        status.contains(&format!("127.0.0.1:{}", d.port())) && status.contains("idle"),
        "{c}: the idle connection is kept and shown as idle\n{status}"
    );
}

#[test]
fn first_time_host_key_notice_reaches_the_callers_terminal() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    let c = ctx(&d, "accept-new through the agent");
    let out = ah
        .exec(d.port(), &fx.client_key)
        .opt("StrictHostKeyChecking=accept-new")
        .cmd("echo hi")
        .run();
    out.expect_code(0, &c).expect_stdout("hi\n", &c);
    assert!(
        out.stderr.contains("Permanently added")
            && out.stderr.contains(&known_hosts_name(d.port())),
        "{c}: the caller must see that the key was recorded\n{out}"
    );
    assert_eq!(ah.agent_pids().len(), 1, "{c}: it went through the agent");
    assert_eq!(
        known_hosts_lookup(&ah.home.known_hosts(), d.port()).len(),
        1,
        "{c}: the key was recorded once"
    );
    // The second call is warm and silent.
    let out = ah.exec(d.port(), &fx.client_key).cmd("echo again").run();
    out.expect_code(0, &c).expect_stdout("again\n", &c);
    assert_eq!(
        out.stderr, "",
        "{c}: nothing to report the second time\n{out}"
    );
}

/// A private tmux server (its own socket), killed on drop.
struct Tmux {
    dir: tempfile::TempDir,
}

impl Tmux {
    fn new() -> Self {
        Tmux { dir: tempdir() }
    }

    fn cmd(&self, args: &[&str]) -> CmdOutput {
        Run::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("sock"))
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .timeout(Duration::from_secs(10))
            .run()
    }

    /// "ROWS COLS" of the only pane.
    fn pane_size(&self) -> String {
        let out = self.cmd(&["display-message", "-p", "#{pane_height} #{pane_width}"]);
        out.expect_code(0, "tmux display-message");
        out.stdout_str().trim().to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// Waits for `path` to hold a line starting with `prefix` and returns the rest.
fn wait_for_line(path: &Path, prefix: &str, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with(prefix)) {
            return Some(
                line[prefix.len()..]
                    .trim_end_matches('\r')
                    .trim()
                    .to_string(),
            );
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// A script for a tmux pane: `skiff exec -tt` of `remote` on `d` with
/// `ah`'s home (through the agent or not), its output in `work/out` and its
/// exit status in `work/rc`; the pane then stays alive (up to 60 s) for
/// checks after skiff has ended.
fn skiff_in_a_pane(
    work: &tempfile::TempDir,
    ah: &AgentHome,
    fx: &Fixture,
    d: &Skiffd,
    through_agent: bool,
    remote: &str,
) -> std::path::PathBuf {
    let script = work.path().join("run.sh");
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let text = format!(
        "#!/bin/sh\nexport HOME={home} XDG_RUNTIME_DIR={rt} XDG_STATE_HOME={home}/state \
         SKIFF_AGENT={agent} TERM=xterm\nunset SSH_AUTH_SOCK\n\
         {skiff} exec -F /dev/null -o BatchMode=yes -i {key} -p {port} -tt {user}@127.0.0.1 {remote} >{out} 2>&1\n\
         echo $? >{rc}\nexec sleep 60\n",
        home = quote(&ah.home.path().display().to_string()),
        rt = quote(&ah.runtime.path().display().to_string()),
        agent = if through_agent { "on" } else { "off" },
        skiff = quote(skiff_bin()),
        key = quote(&fx.client_key.private.display().to_string()),
        port = d.port(),
        user = user(),
        remote = quote(remote),
        out = quote(&work.path().join("out").display().to_string()),
        rc = quote(&work.path().join("rc").display().to_string()),
    );
    write_file(&script, text, 0o700);
    script
}

/// Resizes a real terminal (a tmux pane) while `skiff exec -tt` runs and
/// checks that the remote pty follows, directly and through the agent.
#[test]
fn window_changes_reach_the_remote_terminal() {
    if !require_tool("tmux", "tmux") {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    for through_agent in [false, true] {
        let ah = AgentHome::new();
        trust(&ah, &d, &fx);
        let c = ctx(
            &d,
            &format!("window change, through the agent: {through_agent}"),
        );
        let work = tempdir();
        let out = work.path().join("out");
        let rc = work.path().join("rc");
        // The remote side reports its size, waits (bounded) for it to change,
        // and reports it again.
        let remote = "a=$(stty size); echo \"first $a\"; i=0; \
             while [ \"$(stty size)\" = \"$a\" ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; \
             echo \"second $(stty size)\"";
        let script = skiff_in_a_pane(&work, &ah, &fx, &d, through_agent, remote);
        let tmux = Tmux::new();
        tmux.cmd(&[
            "new-session",
            "-d",
            "-x",
            "100",
            "-y",
            "30",
            &format!("sh {}", script.display()),
        ])
        .expect_code(0, &c);
        let before = tmux.pane_size();
        let first = wait_for_line(&out, "first ", Duration::from_secs(20));
        assert_eq!(
            first.as_deref(),
            Some(before.as_str()),
            "{c}: the remote pty starts at the pane's size\n{}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        tmux.cmd(&["resize-window", "-x", "120", "-y", "40"])
            .expect_code(0, &c);
        let after = tmux.pane_size();
        assert_ne!(before, after, "{c}: tmux resized the pane");
        let second = wait_for_line(&out, "second ", Duration::from_secs(20));
        assert_eq!(
            second.as_deref(),
            Some(after.as_str()),
            "{c}: the remote pty follows the resize\n{}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        let code = wait_for_line(&rc, "", Duration::from_secs(10));
        assert_eq!(code.as_deref(), Some("0"), "{c}: skiff exits 0");
        assert_eq!(
            ah.agent_pids().len(),
            usize::from(through_agent),
            "{c}: the agent is used exactly when asked"
        );
    }
}

/// Types into a real terminal (a tmux pane) running `skiff exec -tt`:
/// `~~` sends one tilde, a tilde mid-line is text, `~?` prints the escapes
/// without sending anything, and `~.` ends skiff with 255 at once, directly
/// and through the agent (where the agent reads a pipe and skiff the
/// terminal).
#[test]
fn escape_sequences_in_a_terminal_session() {
    if !require_tool("tmux", "tmux") {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    for through_agent in [false, true] {
        let ah = AgentHome::new();
        trust(&ah, &d, &fx);
        let c = ctx(&d, &format!("escapes, through the agent: {through_agent}"));
        let work = tempdir();
        let remote_dir = account_dir();
        let typed = remote_dir.path().join("typed");
        let (out, rc) = (work.path().join("out"), work.path().join("rc"));
        // The remote side says it is ready, then keeps what arrives.
        let remote = format!("echo ready; exec cat > {}", typed.display());
        let script = skiff_in_a_pane(&work, &ah, &fx, &d, through_agent, &remote);
        let tmux = Tmux::new();
        tmux.cmd(&[
            "new-session",
            "-d",
            "-s",
            "esc",
            &format!("sh {}", script.display()),
        ])
        .expect_code(0, &c);
        let shown = || std::fs::read_to_string(&out).unwrap_or_default();
        assert!(
            wait_for_line(&out, "ready", Duration::from_secs(20)).is_some(),
            "{c}: the session did not start\n{}",
            shown()
        );
        let keys = |literal: &str| {
            tmux.cmd(&["send-keys", "-t", "esc", "-l", literal])
                .expect_code(0, &c);
            tmux.cmd(&["send-keys", "-t", "esc", "Enter"])
                .expect_code(0, &c);
        };
        keys("~~one");
        keys("two~.three");
        // What reached the remote command, once it has all of it.
        let deadline = Instant::now() + Duration::from_secs(20);
        let expected = "~one\ntwo~.three\n";
        while std::fs::read_to_string(&typed).unwrap_or_default() != expected {
            assert!(
                Instant::now() < deadline,
                "{c}: the remote side got {:?}\n{}",
                std::fs::read_to_string(&typed).unwrap_or_default(),
                shown()
            );
            thread::sleep(Duration::from_millis(50));
        }
        tmux.cmd(&["send-keys", "-t", "esc", "-l", "~?"])
            .expect_code(0, &c);
        let help = wait_for_line(&out, "Supported escape sequences", Duration::from_secs(20));
        assert!(help.is_some(), "{c}: no help for ~?\n{}", shown());
        tmux.cmd(&["send-keys", "-t", "esc", "-l", "~."])
            .expect_code(0, &c);
        let code = wait_for_line(&rc, "", Duration::from_secs(20));
        assert_eq!(
            code.as_deref(),
            Some("255"),
            "{c}: ~. ends skiff\n{}",
            shown()
        );
        assert!(shown().contains("closed."), "{c}\n{}", shown());
        // Neither escape reached the remote side.
        assert_eq!(
            std::fs::read_to_string(&typed).unwrap_or_default(),
            expected,
            "{c}"
        );
        assert_eq!(
            ah.agent_pids().len(),
            usize::from(through_agent),
            "{c}: the agent is used exactly when asked"
        );
    }
}

/// Starts 256 MiB of output through the agent into a pipe this test never
/// reads, runs five more commands to the same host through the agent, and
/// returns `agent status` and the number of connections it lists.
fn later_commands_beside_a_stopped_reader(
    ah: &AgentHome,
    server: &dyn Daemon,
    fx: &Fixture,
    c: &str,
) -> (String, usize) {
    ah.exec(server.port(), &fx.client_key)
        .cmd("true")
        .run()
        .expect_code(0, c);
    let mut stuck = spawn_through_agent(
        ah,
        server.port(),
        &fx.client_key,
        "head -c 268435456 /dev/zero",
        std::process::Stdio::piped(),
    );
    // Let the pipe fill and the output back up.
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..5 {
        ah.exec(server.port(), &fx.client_key)
            .cmd(&format!("echo later-{i}"))
            .timeout(Duration::from_secs(30))
            .run()
            .expect_code(0, c)
            .expect_stdout(&format!("later-{i}\n"), c);
    }
    let status = ah.agent_cmd(&["status"]).stdout_str();
    let _ = stuck.kill();
    let _ = stuck.wait();
    let connections = status
        .lines()
        .filter(|l| l.contains("open channels"))
        .count();
    (status, connections)
}

/// Toward an OpenSSH sshd, a command whose local reader stops reading holds
/// up its connection (russh waits for each channel's consumer before it
/// reads the next packet, and sshd cannot be asked to pause). The agent
/// notices the blocked output and sends later commands to the same host over
/// another connection, so they still run.
#[test]
fn later_commands_do_not_wait_for_a_stopped_reader_on_sshd() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &sshd, &fx);
    let c = ctx(&sshd, "a stopped reader on one channel, sshd");
    let (status, connections) = later_commands_beside_a_stopped_reader(&ah, &sshd, &fx, &c);
    assert!(
        status.contains("held up"),
        "{c}: the agent did not notice the blocked output:\n{status}"
    );
    assert!(
        connections >= 2,
        "{c}: expected a second connection next to the held-up one:\n{status}"
    );
}

/// Toward skiffd the agent asks it to pause the stopped reader's output, so
/// the connection is not held up and later commands share it.
#[test]
fn later_commands_share_a_connection_with_a_stopped_reader_on_skiffd() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let c = ctx(&d, "a stopped reader on one channel, skiffd");
    let (status, connections) = later_commands_beside_a_stopped_reader(&ah, &d, &fx, &c);
    assert!(!status.contains("held up"), "{c}:\n{status}");
    assert_eq!(connections, 1, "{c}: one connection for all:\n{status}");
}

/// Sends `req` to this test's agent with `fds` attached and returns the
/// socket the replies come back on.
fn ask_agent(
    ah: &AgentHome,
    req: &skiff_proto::agent_wire::Request,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::os::unix::net::UnixStream {
    let sock = std::os::unix::net::UnixStream::connect(ah.agent_dir().join("agent.sock"))
        .expect("connect to the agent");
    skiff_agent::socket::send_with_fds(&sock, &skiff_proto::agent_wire::encode_request(req), fds)
        .expect("send the request");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    sock
}

/// Reads one whole reply from the agent.
fn next_reply(
    sock: &mut std::os::unix::net::UnixStream,
    buf: &mut Vec<u8>,
) -> skiff_proto::agent_wire::Reply {
    use std::io::Read;
    loop {
        if let Some((reply, used)) =
            skiff_proto::agent_wire::decode_reply(buf).expect("a well-formed reply")
        {
            buf.drain(..used);
            return reply;
        }
        let mut chunk = [0u8; 4096];
        let n = sock.read(&mut chunk).expect("read a reply");
        assert!(n > 0, "the agent closed the socket before replying");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A `Subsystem` request is answered with `Opened` (and the round trip the
/// agent measured) as soon as the channel is open, before anything of the
/// subsystem is relayed; the channel then carries the subsystem (here the
/// data plane's opening exchange with skiffd), and the final reply follows
/// when it ends. Where no channel can be opened, no `Opened` comes: the
/// only reply is the failure. (`skiff cp` through the agent waits for
/// `Opened` and sends its transfer request with `Hello`.)
#[test]
fn the_agent_says_when_a_subsystem_channel_is_open() {
    use skiff_proto::agent_wire::{ExecWire, Reply, Request};
    use skiff_proto::dataplane as dp;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let ah = AgentHome::new();
    trust(&ah, &d, &fx);
    let mut agent = start_agent_by_hand(&ah, 60);
    let wire = |port: u16| ExecWire {
        host: "127.0.0.1".into(),
        user: Some(user().into()),
        port: Some(port),
        identity_files: vec![fx.client_key.private.display().to_string()],
        config_file: Some("/dev/null".into()),
        options: vec!["BatchMode=yes".into()],
        command: dp::SUBSYSTEM.into(),
        client_env: vec![("HOME".into(), ah.home.path().display().to_string())],
        subsystem: true,
        ..Default::default()
    };
    let c = ctx(&d, "subsystem through the agent");
    let devnull = std::fs::File::open("/dev/null").expect("/dev/null");
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let mut sock = ask_agent(
        &ah,
        &Request::Subsystem(wire(d.port())),
        &[theirs.as_fd(), theirs.as_fd(), devnull.as_fd()],
    );
    drop(theirs);
    let mut buf = Vec::new();
    match next_reply(&mut sock, &mut buf) {
        Reply::Opened { rtt_us } => assert!(
            rtt_us > 0 && rtt_us < 30_000_000,
            "{c}: a measured round trip, got {rtt_us} µs"
        ),
        other => panic!("{c}: the first reply is {other:?}, not Opened"),
    }
    // The channel is live: the data plane's Hello gets its Welcome (in
    // version 1, which answers before the request comes).
    ours.write_all(&dp::encode_client(&dp::ClientMsg::Hello {
        version: dp::OLDEST_VERSION,
        mode: dp::Mode::Aead,
        streams: 1,
        secret: [7; dp::SECRET_LEN],
    }))
    .expect("send Hello");
    ours.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut got = Vec::new();
    let welcome = loop {
        if let Some((msg, _)) = dp::decode_server(&got).expect("a well-formed server message") {
            break msg;
        }
        let mut chunk = [0u8; 4096];
        let n = ours.read(&mut chunk).expect("read the server's answer");
        assert!(n > 0, "{c}: the channel ended before the server answered");
        got.extend_from_slice(&chunk[..n]);
    };
    match welcome {
        dp::ServerMsg::Welcome { tokens, mode, .. } => {
            assert_eq!(tokens.len(), 1, "{c}");
            assert_eq!(mode, dp::Mode::Aead, "{c}");
        }
        other => panic!("{c}: the server answered {other:?}"),
    }
    // Hanging up ends the channel; the final reply follows.
    drop(ours);
    match next_reply(&mut sock, &mut buf) {
        Reply::Exit { .. } => {}
        other => panic!("{c}: the final reply is {other:?}"),
    }

    // Nothing listens here: no channel, so no Opened, only the failure.
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let mut sock = ask_agent(
        &ah,
        &Request::Subsystem(wire(free_port())),
        &[theirs.as_fd(), theirs.as_fd(), devnull.as_fd()],
    );
    drop(theirs);
    let mut buf = Vec::new();
    match next_reply(&mut sock, &mut buf) {
        Reply::Failed { kind, .. } => assert_eq!(kind, 2, "{c}: a connection failure"),
        other => panic!("{c}: unreachable host answered with {other:?}"),
    }
    let _ = agent.kill();
    let _ = agent.wait();
}
