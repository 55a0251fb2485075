//! `skiffd -i` (inetd mode) with stock OpenSSH `ssh`: one connection on
//! stdin/stdout, then exit. On pipes (`ProxyCommand`) the client is
//! unknown and sessions say so as sshd does; on a socket (handed over as
//! stdin and stdout, as inetd or systemd's `Accept=yes` do) the client's
//! real address shows. LoginGraceTime still applies.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use skiff_testkit::*;

/// skiffd -i's command line (without stdin/stdout), logging with -v.
fn inetd_command(fx: &Fixture, config: &Path) -> Vec<String> {
    vec![
        skiffd_bin().to_string(),
        "-i".into(),
        "-v".into(),
        "-f".into(),
        config.display().to_string(),
        "--host-key".into(),
        fx.host_key.private.display().to_string(),
        "--authorized-keys".into(),
        fx.authorized_keys.display().to_string(),
    ]
}

/// Waits (bounded) for `child` to exit; `None` if it is still running
/// after `limit` (it is then killed).
fn exits_within(mut child: Child, limit: Duration) -> Option<ExitStatus> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
        child
    });
    match rx.recv_timeout(limit) {
        Ok(status) => {
            let _ = waiter.join();
            status.ok()
        }
        Err(_) => {
            // Still running: kill it by its own pid, then reap.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            let _ = rx.recv_timeout(Duration::from_secs(10));
            None
        }
    }
}

#[test]
fn proxy_command_logs_in_with_an_unknown_peer() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    write_file(&config, "LoginGraceTime 30\n", 0o644);
    let proxy = inetd_command(&fx, &config).join(" ");
    let out = ssh(free_port(), user(), &fx.client_key)
        .opt(&format!("ProxyCommand={proxy}"))
        .args(&["echo $SSH_CONNECTION; echo $SSH_CLIENT; id -un"])
        .run();
    let context = format!("skiffd -i as ProxyCommand: {}", out.stderr);
    out.expect_code(0, &context).expect_stdout(
        &format!(
            "UNKNOWN 65535 UNKNOWN 65535\nUNKNOWN 65535 65535\n{}\n",
            user()
        ),
        &context,
    );
}

#[test]
fn a_key_restricted_by_from_is_refused_when_the_peer_is_unknown() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    // Any IPv4 or IPv6 address: still not an unknown one.
    let [limited] = fx.keys_with_options([("limited", "from=\"0.0.0.0/0,::/0\"")]);
    let config = fx.path().join("skiffd.conf");
    write_file(&config, "LoginGraceTime 30\n", 0o644);
    let proxy = inetd_command(&fx, &config).join(" ");
    let out = ssh(free_port(), user(), &limited)
        .opt(&format!("ProxyCommand={proxy}"))
        .args(&["true"])
        .run();
    assert_eq!(out.code, 255, "from= key over pipes: {}", out.stderr);
    assert!(
        out.stderr.contains("client's address is unknown"),
        "{}",
        out.stderr
    );
}

/// An inetd for one connection on a fresh port: the accepted socket
/// becomes skiffd's stdin and stdout, and its stderr too when `log` is
/// `None` (as inetd does). Returns the port and the thread that hands
/// over skiffd's process once it is started.
fn inetd_once(
    fx: &Fixture,
    config: &Path,
    log: Option<File>,
) -> (u16, std::thread::JoinHandle<Child>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let command = inetd_command(fx, config);
    let inetd = std::thread::spawn(move || -> Child {
        let (socket, _) = listener.accept().expect("accept");
        let socket = OwnedFd::from(socket);
        let out = socket.try_clone().expect("dup");
        let err = match log {
            Some(file) => Stdio::from(file),
            None => Stdio::from(socket.try_clone().expect("dup")),
        };
        Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::from(socket))
            .stdout(Stdio::from(out))
            .stderr(err)
            .spawn()
            .expect("spawn skiffd -i")
    });
    (port, inetd)
}

#[test]
fn a_socket_on_stdin_shows_the_real_peer_and_skiffd_exits_after_it() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    write_file(&config, "LoginGraceTime 30\n", 0o644);
    let log_path = fx.path().join("skiffd.log");
    let log = File::create(&log_path).expect("log file");
    let (port, inetd) = inetd_once(&fx, &config, Some(log));
    let out = ssh(port, user(), &fx.client_key)
        .args(&["echo $SSH_CONNECTION; id -un"])
        .run();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let context = format!(
        "skiffd -i on a socket; ssh: {}; skiffd: {}",
        out.stderr,
        log()
    );
    out.expect_code(0, &context);
    let stdout = out.stdout_str();
    let mut lines = stdout.lines();
    let conn: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    assert_eq!(lines.next(), Some(user()), "{context}");
    assert_eq!(conn.len(), 4, "SSH_CONNECTION {conn:?}: {context}");
    assert_eq!(conn[0], "127.0.0.1", "{context}");
    assert!(conn[1].parse::<u16>().is_ok_and(|p| p != port), "{context}");
    assert_eq!(conn[2], "127.0.0.1", "{context}");
    assert_eq!(conn[3], port.to_string(), "{context}");
    // One connection served: skiffd is gone once it ended.
    let child = inetd.join().expect("inetd thread");
    let status = exits_within(child, Duration::from_secs(20));
    assert!(
        status.is_some(),
        "skiffd -i still runs after its connection: {}",
        log()
    );
    assert!(
        log().contains(&format!("127.0.0.1:{}", conn[1])),
        "the log names the peer: {}",
        log()
    );
}

#[test]
fn nothing_is_logged_into_the_connection_when_stderr_is_the_socket() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    write_file(&config, "LoginGraceTime 30\n", 0o644);
    // skiffd runs with -v: a single log line would break the SSH stream.
    let (port, inetd) = inetd_once(&fx, &config, None);
    let out = ssh(port, user(), &fx.client_key).args(&["id -un"]).run();
    let context = format!("skiffd -i -v with stderr on the socket: {}", out.stderr);
    out.expect_code(0, &context)
        .expect_stdout(&format!("{}\n", user()), &context);
    let child = inetd.join().expect("inetd thread");
    assert!(
        exits_within(child, Duration::from_secs(20)).is_some(),
        "{context}"
    );
}

#[test]
fn login_grace_time_applies_in_inetd_mode() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    write_file(&config, "LoginGraceTime 2\n", 0o644);
    let command = inetd_command(&fx, &config);
    // A client that connects and never says a word: stdin stays open.
    let child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn skiffd -i");
    let status = exits_within(child, Duration::from_secs(20));
    assert!(status.is_some(), "skiffd -i outlived LoginGraceTime 2");
}
