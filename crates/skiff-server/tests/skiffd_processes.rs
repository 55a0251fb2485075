//! skiffd's process model, with stock OpenSSH `ssh` as the client: every
//! connection is served by a process of its own, so killing one leaves the
//! others running; stopping the listener (SIGTERM, as a service manager
//! does) and starting a new one leaves established sessions running to
//! their normal end with their exit status, and new logins work; SIGHUP
//! reads the configuration again for new connections only, and keeps the
//! one in force when the new one is broken.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// How long a line, an exit or a log line may take to come.
const WITHIN: Duration = Duration::from_secs(30);

/// A running `ssh` session whose input the test writes and whose output
/// lines it reads.
struct Live {
    child: Child,
    input: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Live {
    fn start(port: u16, name: &str, key: &Key, command: &str) -> Live {
        let mut child = Command::new("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=no"])
            .args(["-o", "UserKnownHostsFile=/dev/null"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
            .arg("-i")
            .arg(&key.private)
            .args(["-p", &port.to_string()])
            .arg(format!("{name}@127.0.0.1"))
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ssh");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let input = child.stdin.take();
        Live {
            child,
            input,
            lines,
        }
    }

    /// The next line of output, waited for.
    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(WITHIN)
            .unwrap_or_else(|e| panic!("{what}: no line within {WITHIN:?} ({e})"))
    }

    /// Writes `text` and a newline.
    fn say(&mut self, text: &str) {
        let input = self.input.as_mut().expect("input open");
        writeln!(input, "{text}").expect("write to ssh");
        input.flush().expect("flush");
    }

    /// Writes a line and reads it back (the session runs `cat`).
    fn echoes(&mut self, text: &str) -> bool {
        self.say(text);
        self.lines.recv_timeout(WITHIN).ok().as_deref() == Some(text)
    }

    /// Closes its input and waits for ssh's exit code (bounded).
    fn finish(mut self) -> Option<i32> {
        self.input.take();
        self.exit_code()
    }

    /// Waits for ssh's exit code (bounded).
    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + WITHIN;
        loop {
            match self.child.try_wait().expect("wait for ssh") {
                Some(status) => return status.code(),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => panic!("ssh still running after {WITHIN:?}"),
            }
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn skiffd(config: Option<&str>) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if let Some(text) = config {
        opts = opts.config(text);
    }
    Some((fx, Skiffd::start_with(opts)))
}

fn logs_in(d: &Skiffd, name: &str, key: &Key) -> bool {
    let out = ssh(d.port(), name, key).args(&["echo", "in"]).run();
    out.code == 0 && out.stdout_str() == "in\n"
}

/// Waits until skiffd's log holds `needle` `count` times.
fn wait_for_log(d: &Skiffd, needle: &str, count: usize, what: &str) {
    let deadline = Instant::now() + WITHIN;
    while d.log().matches(needle).count() < count {
        assert!(
            Instant::now() < deadline,
            "{}",
            ctx(d, &format!("{what}: no {needle:?} in the log"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The command line of process `pid`, its arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn each_connection_has_its_own_process_and_killing_one_spares_the_others() {
    let Some((fx, d)) = skiffd(None) else {
        return;
    };
    let c = |what: &str| ctx(&d, what);
    // The command's parent is the process serving its connection.
    let mut a = Live::start(d.port(), user(), &fx.client_key, "echo $PPID; exec cat");
    let mut b = Live::start(d.port(), user(), &fx.client_key, "echo $PPID; exec cat");
    let a_pid: u32 = a.line("connection a").parse().expect("a pid");
    let b_pid: u32 = b.line("connection b").parse().expect("b pid");
    assert_ne!(a_pid, b_pid, "{}", c("two connections, one process"));
    for pid in [a_pid, b_pid] {
        assert_ne!(pid, d.pid(), "{}", c("served by the listener itself"));
        assert!(
            d.processes().contains(&pid),
            "{}",
            c(&format!(
                "process {pid} ({}) is not one of skiffd's: {:?}",
                cmdline(pid),
                d.processes()
            ))
        );
    }
    assert!(
        a.echoes("a before"),
        "{}",
        c("connection a before the kill")
    );
    assert!(
        b.echoes("b before"),
        "{}",
        c("connection b before the kill")
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a_pid as i32), Signal::SIGKILL)
        .expect("kill a's process");
    assert_eq!(
        a.exit_code(),
        Some(255),
        "{}",
        c("ssh of the killed connection")
    );
    assert!(
        b.echoes("b after"),
        "{}",
        c("connection b after a's process was killed")
    );
    assert_eq!(b.finish(), Some(0), "{}", c("connection b's end"));
    assert!(logs_in(&d, user(), &fx.client_key), "{}", c("a new login"));
}

#[test]
fn restarting_the_listener_keeps_established_sessions_to_their_end() {
    let Some((fx, mut d)) = skiffd(None) else {
        return;
    };
    // One session waits (as `sleep` would) until told, then exits 7; the
    // other streams what it is sent back.
    let mut waiting = Live::start(
        d.port(),
        user(),
        &fx.client_key,
        "echo waiting; read go; sleep 0.2; exit 7",
    );
    let mut streaming = Live::start(d.port(), user(), &fx.client_key, "exec cat");
    assert_eq!(waiting.line("the waiting session"), "waiting");
    assert!(
        streaming.echoes("before"),
        "{}",
        ctx(&d, "streaming before")
    );
    let old = d.pid();
    let status = d.terminate();
    assert!(
        status.success(),
        "{}",
        ctx(&d, &format!("the listener's exit after SIGTERM: {status}"))
    );
    assert!(
        streaming.echoes("between"),
        "{}",
        ctx(&d, "streaming with no listener running")
    );
    d.start_again();
    assert_ne!(d.pid(), old);
    assert!(
        streaming.echoes("after"),
        "{}",
        ctx(&d, "streaming after the restart")
    );
    waiting.say("go");
    assert_eq!(
        waiting.exit_code(),
        Some(7),
        "{}",
        ctx(&d, "the waiting session's exit status")
    );
    assert_eq!(
        streaming.finish(),
        Some(0),
        "{}",
        ctx(&d, "streaming's end")
    );
    assert!(
        logs_in(&d, user(), &fx.client_key),
        "{}",
        ctx(&d, "a new login after the restart")
    );
    assert!(d.log().contains("Received signal 15; terminating."));
}

#[test]
fn sighup_applies_a_new_configuration_to_new_connections_only() {
    if !require_openssh() {
        return;
    }
    let alice = TempAccount::create("skpra", "/bin/sh");
    let bob = TempAccount::create("skprb", "/bin/sh");
    let fx = Fixture::new();
    let config = fx.dir.path().join("skiffd_config");
    let keys = fx.authorized_keys.clone();
    let write_config = |text: &str| std::fs::write(&config, text).expect("write config");
    write_config(&format!("AllowUsers {}\n", alice.name()));
    let d = Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &keys).command_line([
        "--listen".to_string(),
        "127.0.0.1:{port}".to_string(),
        "--host-key".to_string(),
        fx.host_key.private.display().to_string(),
        "--authorized-keys".to_string(),
        keys.display().to_string(),
        "--config".to_string(),
        config.display().to_string(),
    ]));
    let c = |what: &str| ctx(&d, what);
    assert!(
        logs_in(&d, alice.name(), &fx.client_key),
        "{}",
        c("alice, allowed")
    );
    assert!(
        !logs_in(&d, bob.name(), &fx.client_key),
        "{}",
        c("bob, not allowed yet")
    );
    let mut alices = Live::start(d.port(), alice.name(), &fx.client_key, "exec cat");
    assert!(
        alices.echoes("before"),
        "{}",
        c("alice's session before the reload")
    );

    write_config(&format!("AllowUsers {}\n", bob.name()));
    d.signal(Signal::SIGHUP);
    wait_for_log(&d, "configuration reloaded", 1, "the first SIGHUP");
    assert!(
        logs_in(&d, bob.name(), &fx.client_key),
        "{}",
        c("bob, allowed now")
    );
    assert!(
        !logs_in(&d, alice.name(), &fx.client_key),
        "{}",
        c("alice, no longer allowed")
    );
    assert!(
        alices.echoes("after"),
        "{}",
        c("alice's established session after the reload")
    );

    write_config("AllowUsers\nThisIsNoKeyword yes\n");
    d.signal(Signal::SIGHUP);
    wait_for_log(
        &d,
        "configuration not reloaded",
        1,
        "the broken file's SIGHUP",
    );
    assert!(
        logs_in(&d, bob.name(), &fx.client_key),
        "{}",
        c("bob, after a broken file (the old configuration stays)")
    );
    assert!(
        !logs_in(&d, alice.name(), &fx.client_key),
        "{}",
        c("alice, after a broken file")
    );
    assert_eq!(alices.finish(), Some(0), "{}", c("alice's session's end"));
}

/// The niceness of every thread of process `pid` (field 19 of each
/// `/proc/PID/task/TID/stat`).
fn thread_niceness(pid: u32) -> Vec<i64> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads") {
        let stat = std::fs::read_to_string(task.expect("a thread").path().join("stat"))
            .expect("a thread's stat");
        let after_name = &stat[stat.rfind(')').expect("stat's name") + 1..];
        let nice = after_name
            .split_whitespace()
            .nth(16)
            .expect("stat's niceness field");
        found.push(nice.parse().expect("a niceness"));
    }
    found
}

/// Connection processes start at a low priority (so as not to slow the
/// connections being served meanwhile), but serve theirs, and start its
/// commands, at normal priority.
#[test]
fn a_connection_and_its_command_run_at_normal_priority() {
    let Some((fx, d)) = skiffd(None) else {
        return;
    };
    let a = Live::start(d.port(), user(), &fx.client_key, "echo $PPID $$; exec cat");
    let line = a.line("the connection's pids");
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    let (server, command) = (pids[0], pids[1]);
    assert!(
        d.processes().contains(&server),
        "{}",
        ctx(&d, &format!("{server} is not one of skiffd's processes"))
    );
    for (what, pid) in [("the connection process", server), ("the command", command)] {
        let nice = thread_niceness(pid);
        assert!(
            nice.iter().all(|&n| n == 0),
            "{}",
            ctx(&d, &format!("{what} ({pid}) runs niced: {nice:?}"))
        );
    }
    assert_eq!(a.finish(), Some(0), "{}", ctx(&d, "the connection's end"));
}

/// Processes stopped with SIGSTOP, continued when dropped (also when an
/// assertion fails first).
struct Stopped(Vec<u32>);

impl Stopped {
    fn all(pids: Vec<u32>) -> Stopped {
        for &pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP);
        }
        Stopped(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
    }
}

/// The listener writes the identification line as it accepts, so a
/// client's next flight is on its way while the connection is handed to
/// its process: with every other skiffd process stopped (the zygote, the
/// ready connection processes), the line still comes. Once they continue,
/// the handshake goes on without the line written twice: a raw client
/// reads a binary packet next, and stock ssh logs in.
#[test]
fn the_listener_sends_the_identification_line_before_the_handover() {
    use std::io::Read;
    let Some((fx, d)) = skiffd(None) else {
        return;
    };
    assert!(
        logs_in(&d, user(), &fx.client_key),
        "{}",
        ctx(&d, "a first login")
    );
    let others: Vec<u32> = d
        .processes()
        .into_iter()
        .filter(|&p| p != d.pid())
        .collect();
    assert!(
        !others.is_empty(),
        "{}",
        ctx(&d, "no zygote or connection process found")
    );
    let stopped = Stopped::all(others);

    let mut raw = std::net::TcpStream::connect(("127.0.0.1", d.port())).expect("connect");
    raw.set_read_timeout(Some(WITHIN)).expect("read timeout");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 255 && !line.ends_with(b"\n") {
        match raw.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    assert!(
        line.starts_with("SSH-2.0-skiffd_") && line.ends_with("\r\n"),
        "{}",
        ctx(
            &d,
            &format!("identification line with every other process stopped: {line:?}")
        )
    );
    // Stock ssh reads the line and sends its KEXINIT meanwhile.
    let live = Live::start(d.port(), user(), &fx.client_key, "echo after");
    drop(stopped);

    raw.write_all(b"SSH-2.0-rawclient_1.0\r\n")
        .expect("send an identification");
    let mut head = [0u8; 6];
    raw.read_exact(&mut head)
        .expect("the server's first packet");
    assert!(
        !head.starts_with(b"SSH-"),
        "{}",
        ctx(&d, "the identification line came twice")
    );
    let length = u32::from_be_bytes(head[..4].try_into().unwrap());
    assert!(
        (16..=35_000).contains(&length) && head[5] == 20,
        "{}",
        ctx(
            &d,
            &format!("not a KEXINIT packet after the line: {head:?}")
        )
    );
    assert_eq!(
        live.line("ssh's output"),
        "after",
        "{}",
        ctx(&d, "ssh after the handover")
    );
    let mut live = live;
    assert_eq!(live.exit_code(), Some(0), "{}", ctx(&d, "ssh's exit"));
}
