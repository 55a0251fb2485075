//! skiffd's `ChannelTimeout` and `UnusedConnectionTimeout`, driven by
//! stock OpenSSH `ssh`: an idle session is closed and a talking one is
//! not; an idle `direct-tcpip` channel (`ssh -W` to a destination that
//! says nothing) is closed; `global` closes when every channel is idle; a
//! connection with no channel (`ssh -N`) is closed, one with a session is
//! not.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// How long a closed-for-idleness client may take to go, at most: far
/// below the 30 s its command would run, far above the 2 s timeouts.
const GONE_WITHIN: Duration = Duration::from_secs(20);

fn skiffd_with(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config));
    Some((fx, d))
}

/// Runs `ssh` and returns its result and how long it took.
fn timed(s: Ssh) -> (CmdOutput, Duration) {
    let start = Instant::now();
    let out = s.run();
    (out, start.elapsed())
}

#[test]
fn an_idle_session_is_closed_and_a_talking_one_is_not() {
    let Some((fx, d)) = skiffd_with("ChannelTimeout session=2s\n") else {
        return;
    };
    let c = |what: &str| ctx(&d, what);
    let (out, took) = timed(
        ssh(d.port(), user(), &fx.client_key)
            .args(&["sleep", "30"])
            .timeout(Duration::from_secs(60)),
    );
    assert!(
        took < GONE_WITHIN && took >= Duration::from_secs(2),
        "an idle session lasted {took:?}: {}",
        c("ChannelTimeout session=2s")
    );
    assert_ne!(
        out.code,
        0,
        "no exit status after a timeout: {}",
        c("idle session")
    );
    assert!(
        d.log().contains("closing session channel"),
        "{}",
        c("the log says why")
    );
    // Output every half second for 4 s: twice the timeout, never idle for it.
    let talking = "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.5; done";
    ssh(d.port(), user(), &fx.client_key)
        .args(&[talking])
        .run()
        .expect_code(0, &c("talking session"))
        .expect_stdout("1\n2\n3\n4\n5\n6\n7\n8\n", &c("talking session"));
}

#[test]
fn an_idle_session_with_open_input_is_closed_and_its_command_ends() {
    let Some((fx, d)) = skiffd_with("ChannelTimeout session=2s\n") else {
        return;
    };
    // Like an idle shell: the client's input stays open, nothing is typed.
    let mut child = Command::new("ssh")
        .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
        .args(["-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null"])
        .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
        .arg("-i")
        .arg(&fx.client_key.private)
        .args(["-p", &d.port().to_string()])
        .arg(format!("{}@127.0.0.1", user()))
        .arg("echo $$; exec cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ssh");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok));
        // The rest (none expected) until ssh exits.
        let _ = tx.send(lines.next().and_then(Result::ok));
    });
    let c = ctx(&d, "ChannelTimeout session=2s, idle input");
    let pid: u32 = rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .flatten()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid from the session: {c}"));
    // ssh's stdout ends when the server closes the channel.
    let ended = rx.recv_timeout(GONE_WITHIN);
    let _ = child.kill();
    let _ = child.wait();
    assert!(ended.is_ok(), "the idle session was not closed: {c}");
    // The command (`cat`, waiting on its input) lost its input and its
    // terminal-less session was hung up: it is gone.
    let proc_dir = format!("/proc/{pid}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&proc_dir).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !std::path::Path::new(&proc_dir).exists(),
        "the session's command {pid} still runs: {c}"
    );
}

#[test]
fn an_idle_direct_tcpip_channel_is_closed() {
    // Sessions are not limited: only the forwarding's channel type is.
    let Some((fx, d)) = skiffd_with("ChannelTimeout direct-tcpip=2s session=0\n") else {
        return;
    };
    // A destination that accepts and then says nothing, holding the
    // connection open until the test ends.
    let destination = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = destination.local_addr().expect("addr").port();
    let holder = std::thread::spawn(move || -> Option<TcpStream> {
        destination.accept().ok().map(|(s, _)| s)
    });
    let target = format!("127.0.0.1:{port}");
    let (out, took) = timed(
        ssh(d.port(), user(), &fx.client_key)
            .flag("-W")
            .flag(&target)
            .timeout(Duration::from_secs(60)),
    );
    let c = ctx(&d, "ChannelTimeout direct-tcpip=2s, ssh -W");
    assert!(
        took < GONE_WITHIN,
        "an idle forwarding lasted {took:?}: {c}"
    );
    assert!(holder.join().expect("holder").is_some(), "{c}");
    assert!(d.log().contains("closing direct-tcpip channel"), "{c}");
    let _ = out;
}

#[test]
fn global_closes_channels_when_all_are_idle() {
    let Some((fx, d)) = skiffd_with("ChannelTimeout global=2s\n") else {
        return;
    };
    let (_, took) = timed(
        ssh(d.port(), user(), &fx.client_key)
            .args(&["sleep", "30"])
            .timeout(Duration::from_secs(60)),
    );
    let c = ctx(&d, "ChannelTimeout global=2s");
    assert!(took < GONE_WITHIN, "an idle session lasted {took:?}: {c}");
    assert!(d.log().contains("ChannelTimeout global"), "{c}");
}

#[test]
fn a_connection_without_channels_is_closed_in_a_match_block_too() {
    let config = format!("Match User {}\n  UnusedConnectionTimeout 2s\n", user());
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = |what: &str| ctx(&d, what);
    // ssh -N opens no channel: the connection goes after 2 s.
    let (out, took) = timed(
        ssh(d.port(), user(), &fx.client_key)
            .flag("-N")
            .timeout(Duration::from_secs(60)),
    );
    assert!(
        took < GONE_WITHIN && took >= Duration::from_secs(2),
        "ssh -N lasted {took:?}: {}",
        c("-N")
    );
    assert_eq!(out.code, 255, "{}", c("ssh -N"));
    assert!(
        d.log().contains("UnusedConnectionTimeout"),
        "{}",
        c("the log says why")
    );
    // A session that stays silent for longer than the timeout keeps the
    // connection: the timeout is about channels, not traffic.
    ssh(d.port(), user(), &fx.client_key)
        .args(&["sleep 4; echo done"])
        .run()
        .expect_code(0, &c("a session outlives UnusedConnectionTimeout"))
        .expect_stdout("done\n", &c("a session outlives UnusedConnectionTimeout"));
}

#[test]
fn bad_timeouts_are_refused_with_file_and_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    for (line, needle) in [
        ("ChannelTimeout session", "expected type=interval"),
        ("ChannelTimeout session=5x", "bad time value"),
        ("UnusedConnectionTimeout soon", "bad time value"),
    ] {
        let path = fx.path().join("bad.conf");
        write_file(&path, format!("# a comment\n{line}\n"), 0o644);
        let out = skiffd_with_bad_config(&fx.host_key, &path);
        assert_ne!(out.code, 0, "{line} accepted");
        assert!(
            out.stderr.contains(":2:") && out.stderr.contains(needle),
            "{line}: {}",
            out.stderr
        );
    }
}
