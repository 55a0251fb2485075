//! skiffd's limits and policies (docs/skiffd-config.md), seen from outside:
//! MaxSessions through real OpenSSH connection multiplexing, LoginGraceTime
//! and MaxStartups with raw TCP connections, refused accounts, the
//! algorithm policy as `ssh -vvv` reports it, the generated host key, and
//! configuration errors.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// skiffd with `config` as its --config file, serving a fresh fixture.
fn skiffd_with_config(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config));
    Some((fx, d))
}

/// Polls (bounded) until the server's log satisfies `cond`.
fn wait_for_log(server: &dyn Daemon, what: &str, limit: Duration, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + limit;
    while !cond(&server.log()) {
        assert!(
            Instant::now() < deadline,
            "{}",
            ctx(
                server,
                &format!("timed out after {limit:?} waiting for: {what}")
            )
        );
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// MaxSessions, through an OpenSSH ControlMaster
// ---------------------------------------------------------------------------

/// `ssh -M -S SOCK -o ControlPersist=yes -N -f` connected to a server:
/// one SSH connection that later `ssh -S SOCK` invocations open sessions
/// on. Stopped with `ssh -S SOCK -O exit` on drop (and, should it still be
/// there, killed by its pid).
struct MuxMaster {
    sock: PathBuf,
    port: u16,
    pid: Option<u32>,
    _dir: tempfile::TempDir,
}

impl MuxMaster {
    fn start(port: u16, key: &Key) -> MuxMaster {
        let dir = tempdir();
        let sock = dir.path().join("ctl");
        let sock_arg = sock.to_str().expect("utf-8 temp path").to_string();
        let mut master = MuxMaster {
            sock,
            port,
            pid: None,
            _dir: dir,
        };
        // -f: ssh goes to the background after authenticating, with its
        // stdio on /dev/null, so this returns once the master is up.
        ssh(port, user(), key)
            .flag("-M")
            .flag("-S")
            .flag(&sock_arg)
            .opt("ControlPersist=yes")
            .flag("-N")
            .flag("-f")
            .timeout(Duration::from_secs(30))
            .run()
            .expect_code(0, "start the ControlMaster");
        let check = master.control("check");
        check.expect_code(0, "ssh -O check");
        // "Master running (pid=1234)"
        master.pid = check
            .stderr
            .split("pid=")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|n| n.trim().parse().ok());
        assert!(master.pid.is_some(), "no master pid in {check}");
        master
    }

    fn sock_arg(&self) -> &str {
        self.sock.to_str().expect("utf-8 temp path")
    }

    /// `ssh -S SOCK -O COMMAND`.
    fn control(&self, command: &str) -> CmdOutput {
        Run::new("ssh")
            .args(["-F", "/dev/null", "-S", self.sock_arg(), "-O", command])
            .args(["-p", &self.port.to_string()])
            .arg(format!("{}@127.0.0.1", user()))
            .timeout(Duration::from_secs(20))
            .run()
    }

    /// `ssh -S SOCK user@127.0.0.1 command`: a session on the master's
    /// connection. If the master cannot get a session, ssh falls back to a
    /// connection of its own, so these use a key the server does not know:
    /// the fallback then fails and cannot hide a refusal.
    fn session(&self, stranger: &Key, command: &str) -> CmdOutput {
        ssh(self.port, user(), stranger)
            .flag("-S")
            .flag(self.sock_arg())
            .args(&[command])
            .timeout(Duration::from_secs(60))
            .run()
    }
}

impl Drop for MuxMaster {
    fn drop(&mut self) {
        // Never panic here (this also runs while a test fails).
        let spawned = Command::new("ssh")
            .args(["-F", "/dev/null", "-S"])
            .arg(&self.sock)
            .args(["-O", "exit", "-p", &self.port.to_string(), "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = spawned {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let Some(pid) = self.pid else { return };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let deadline = Instant::now() + Duration::from_secs(3);
        while proc_dir.exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let comm = fs::read_to_string(proc_dir.join("comm")).unwrap_or_default();
        if comm.trim() == "ssh" {
            let _ = Command::new("kill")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `MaxSessions 2`: two sessions run at once on one multiplexed
/// connection; a third, opened while they run, is refused by skiffd.
#[test]
fn max_sessions_refuses_a_third_concurrent_session() {
    let Some((fx, d)) = skiffd_with_config("MaxSessions 2\n") else {
        return;
    };
    let master = MuxMaster::start(d.port(), &fx.client_key);
    thread::scope(|s| {
        let running: Vec<_> = (0..2)
            .map(|i| {
                let (master, key) = (&master, &fx.stranger_key);
                s.spawn(move || master.session(key, &format!("sleep 5; echo long-{i}")))
            })
            .collect();
        wait_for_log(&d, "two sessions started", Duration::from_secs(20), |log| {
            log.matches("session started").count() >= 2
        });

        let third = master.session(&fx.stranger_key, "echo should-not-run");
        let c = ctx(&d, "third session while two run (MaxSessions 2)");
        third.expect_code(255, &c).expect_stdout("", &c);
        assert!(
            third.stderr.contains("Session open refused by peer"),
            "{c}: the session must be refused on the master's connection\n{third}"
        );
        assert!(
            d.log()
                .contains("refusing session: MaxSessions (2) reached"),
            "{c}: skiffd must log the reason"
        );

        for (i, h) in running.into_iter().enumerate() {
            let out = h.join().expect("session thread panicked");
            out.expect_code(0, &ctx(&d, &format!("long session {i}")))
                .expect_stdout(&format!("long-{i}\n"), "long session");
        }
    });
    // Only the master ever authenticated: the sessions went through it.
    assert_eq!(
        d.log().matches("Accepted publickey for").count(),
        1,
        "{}",
        ctx(&d, "one authentication expected")
    );
}

/// MaxSessions limits sessions open at once (as sshd's does), not the
/// number a connection runs in its lifetime: after two sessions have
/// finished, a third on the same connection must be accepted.
#[test]
fn max_sessions_counts_only_open_sessions() {
    let Some((fx, d)) = skiffd_with_config("MaxSessions 2\n") else {
        return;
    };
    let master = MuxMaster::start(d.port(), &fx.client_key);
    for i in 0..4 {
        let out = master.session(&fx.stranger_key, &format!("echo seq-{i}"));
        out.expect_code(0, &ctx(&d, &format!("sequential session {i} of 4")))
            .expect_stdout(&format!("seq-{i}\n"), "sequential session");
    }
}

// ---------------------------------------------------------------------------
// LoginGraceTime and MaxStartups, with raw TCP
// ---------------------------------------------------------------------------

fn tcp_connect(port: u16) -> TcpStream {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// A connection to 127.0.0.1:`port` from the local address `source`.
fn tcp_connect_from(source: Ipv4Addr, port: u16) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((source, 0)))
            .unwrap_or_else(|e| panic!("bind {source}: {e}"));
        let connecting = socket.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        let stream = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect from {source}: {e}"));
        let stream = stream.into_std().expect("std stream");
        stream.set_nonblocking(false).expect("blocking");
        stream
    })
}

/// What a server did on a connection while we watched.
#[derive(Debug)]
struct Watched {
    received: Vec<u8>,
    /// Time from the start of watching until the server closed the
    /// connection; `None` when it was still open at the end.
    closed_after: Option<Duration>,
}

impl Watched {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.received).into_owned()
    }
}

/// Reads from `stream` until the server closes it (EOF or reset), `stop`
/// holds for what was received, or `limit` has passed since `since`.
fn watch(
    stream: &mut TcpStream,
    since: Instant,
    limit: Duration,
    stop: impl Fn(&[u8]) -> bool,
) -> Watched {
    let deadline = since + limit;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stop(&received) {
            return Watched {
                received,
                closed_after: None,
            };
        }
        stream
            .set_read_timeout(Some(left))
            .expect("set read timeout");
        match stream.read(&mut buf) {
            Ok(0) => {
                return Watched {
                    received,
                    closed_after: Some(since.elapsed()),
                }
            }
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return Watched {
                    received,
                    closed_after: Some(since.elapsed()),
                }
            }
            Err(e) => panic!("read from server: {e}"),
        }
    }
}

fn has_line(received: &[u8]) -> bool {
    received.contains(&b'\n')
}

/// Connects and reads skiffd's identification line. Retries (bounded by
/// `limit`) while connections are dropped before it, which happens as long
/// as earlier connections (e.g. the harness's readiness probe) still count
/// against MaxStartups.
fn connect_with_banner(d: &Skiffd, limit: Duration) -> TcpStream {
    connect_with_banner_from(d, Ipv4Addr::LOCALHOST, limit)
}

/// [`connect_with_banner`] from the local address `source`.
fn connect_with_banner_from(d: &Skiffd, source: Ipv4Addr, limit: Duration) -> TcpStream {
    let deadline = Instant::now() + limit;
    loop {
        let mut stream = tcp_connect_from(source, d.port());
        let seen = watch(
            &mut stream,
            Instant::now(),
            Duration::from_secs(3),
            has_line,
        );
        if seen.text().starts_with("SSH-2.0-skiffd") {
            return stream;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            ctx(
                d,
                &format!("no banner within {limit:?}; last attempt: {seen:?}")
            )
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Opens a connection to `d` (LoginGraceTime 2), sends `hello` if given and
/// nothing else, and checks that skiffd identifies itself and then closes
/// the connection after about 2 s.
fn expect_closed_by_grace_time(d: &Skiffd, what: &str, hello: Option<&[u8]>) {
    let start = Instant::now();
    let mut conn = tcp_connect(d.port());
    if let Some(line) = hello {
        conn.write_all(line).expect("send identification");
    }
    let seen = watch(&mut conn, start, Duration::from_secs(8), |_| false);
    let c = ctx(d, &format!("LoginGraceTime 2, {what}: {seen:?}"));
    assert!(
        seen.text().starts_with("SSH-2.0-skiffd"),
        "{c}: skiffd identifies itself first"
    );
    let after = seen
        .closed_after
        .unwrap_or_else(|| panic!("{c}: connection still open after 8 s"));
    assert!(
        after >= Duration::from_millis(1500) && after <= Duration::from_secs(6),
        "{c}: closed after {after:?}, expected about 2 s"
    );
}

/// `LoginGraceTime 2`: a connection that sends nothing is closed after
/// about 2 s, while one to a skiffd with the default (120 s) stays open.
#[test]
fn login_grace_time_closes_silent_connections() {
    let Some((fx, d)) = skiffd_with_config("LoginGraceTime 2\n") else {
        return;
    };
    let default = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let control_start = Instant::now();
    let mut control = tcp_connect(default.port());

    expect_closed_by_grace_time(&d, "silent client", None);
    // Logged right after the connection is closed.
    wait_for_log(&d, "the expiry is logged", Duration::from_secs(5), |log| {
        log.contains("no SSH identification within LoginGraceTime")
    });

    let limit = Duration::from_secs(3).saturating_sub(control_start.elapsed());
    let seen = watch(&mut control, Instant::now(), limit, |_| false);
    assert!(
        seen.closed_after.is_none() && seen.text().starts_with("SSH-2.0-skiffd"),
        "{}",
        ctx(
            &default,
            &format!("default LoginGraceTime: closed within 3 s: {seen:?}")
        )
    );
}

/// `LoginGraceTime 2`: a client that sends its identification line and
/// then stalls in the key exchange is closed after about 2 s too (else
/// such connections would stay open for good and, no longer counted as
/// unauthenticated, get round MaxStartups).
#[test]
fn login_grace_time_closes_connections_stalled_in_key_exchange() {
    let Some((_fx, d)) = skiffd_with_config("LoginGraceTime 2\n") else {
        return;
    };
    expect_closed_by_grace_time(
        &d,
        "identification line only",
        Some(b"SSH-2.0-skiff_probe\r\n"),
    );
}

/// `MaxStartups 3`: with three unauthenticated connections open, a fourth
/// is closed at once without a banner; once the three are gone, new
/// connections are served again.
#[test]
fn max_startups_drops_excess_unauthenticated_connections() {
    let Some((_fx, d)) = skiffd_with_config("MaxStartups 3\n") else {
        return;
    };
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| connect_with_banner(&d, Duration::from_secs(10)))
        .collect();

    expect_dropped_from(
        &d,
        Ipv4Addr::LOCALHOST,
        "fourth connection with MaxStartups 3",
        "unauthenticated connections (MaxStartups)",
    );

    // The three held connections were not disturbed.
    for conn in &mut held {
        let seen = watch(conn, Instant::now(), Duration::from_millis(100), |_| false);
        assert!(
            seen.closed_after.is_none(),
            "{}",
            ctx(&d, "held connection")
        );
    }
    drop(held);
    connect_with_banner(&d, Duration::from_secs(10));
}

/// A connection from `source` that skiffd must close at once, unanswered,
/// logging `reason`.
fn expect_dropped_from(d: &Skiffd, source: Ipv4Addr, what: &str, reason: &str) {
    let start = Instant::now();
    let mut conn = tcp_connect_from(source, d.port());
    let seen = watch(&mut conn, start, Duration::from_secs(5), |_| false);
    let c = ctx(d, &format!("{what}: {seen:?}"));
    assert!(seen.received.is_empty(), "{c}: no banner expected");
    let after = seen
        .closed_after
        .unwrap_or_else(|| panic!("{c}: still open after 5 s"));
    assert!(
        after < Duration::from_secs(2),
        "{c}: closed only after {after:?}"
    );
    wait_for_log(d, reason, Duration::from_secs(5), |log| {
        log.contains(reason)
    });
}

/// `PerSourceMaxStartups 2`: two unauthenticated connections from
/// 127.0.0.1 use up its share, so a third from it is closed at once, while
/// 127.0.0.2 is still served; once they are gone 127.0.0.1 is served again.
/// With `PerSourceNetBlockSize 8` the two addresses are one source.
#[test]
fn per_source_max_startups_limits_each_source_network() {
    let Some((fx, d)) = skiffd_with_config("PerSourceMaxStartups 2\n") else {
        return;
    };
    let (first, second) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let held: Vec<TcpStream> = (0..2)
        .map(|_| connect_with_banner_from(&d, first, Duration::from_secs(10)))
        .collect();
    expect_dropped_from(
        &d,
        first,
        "third connection from 127.0.0.1",
        "unauthenticated connections from 127.0.0.1 (PerSourceMaxStartups)",
    );
    let _other = connect_with_banner_from(&d, second, Duration::from_secs(10));
    drop(held);
    connect_with_banner_from(&d, first, Duration::from_secs(10));

    let wide = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config("PerSourceMaxStartups 1\nPerSourceNetBlockSize 8\n"),
    );
    let _held = connect_with_banner_from(&wide, first, Duration::from_secs(10));
    expect_dropped_from(
        &wide,
        second,
        "127.0.0.2 in 127.0.0.0/8 with one connection from it open",
        "unauthenticated connections from 127.0.0.0 (PerSourceMaxStartups)",
    );
}

// ---------------------------------------------------------------------------
// Accounts that may not log in
// ---------------------------------------------------------------------------

/// A locked account, an account whose shell does not exist and a missing
/// account get exactly the answer a wrong key gets, although the key is
/// authorized for them; skiffd logs the real reason. (An account whose
/// shell is `nologin` authenticates and runs nothing: skiffd_accounts.rs.)
#[test]
fn refused_accounts_look_like_a_wrong_key() {
    if !require_openssh() {
        return;
    }
    if !is_root() {
        let msg = "creating test accounts needs root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return;
    }
    ensure_account(AccountSpec {
        name: "skiff-locked",
        shell: "/bin/sh",
        password: "!",
    });
    let no_shell = TempAccount::create("nosh", "/nonexistent/skiff-shell");
    let missing = "skiff-no-such-user";
    assert!(no_such_account(missing), "{missing} must not exist");

    // One authorized_keys file (--authorized-keys) serves every account.
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let port = d.port();
    let attempt = |name: &str, key: &Key| {
        ssh(port, name, key)
            .flag("-v")
            .args(&["echo should-not-run"])
            .run()
    };
    // The answers that reach the client, with the user name neutralized.
    let answers = |out: &CmdOutput, name: &str| -> Vec<String> {
        out.stderr
            .lines()
            .filter(|l| {
                !l.starts_with("debug1: ")
                    || l.contains("Authentications that can continue")
                    || l.contains("Server accepts key")
                    || l.contains("Authenticated")
            })
            .filter(|l| !l.starts_with("OpenSSH_"))
            .map(|l| l.trim_end_matches('\r').replace(name, "USER"))
            .collect()
    };

    ssh_cmd(port, user(), &fx.client_key, &["echo key-works"])
        .expect_code(0, &ctx(&d, "control: the key is authorized"))
        .expect_stdout("key-works\n", "control");
    let wrong = attempt(user(), &fx.stranger_key);
    let c = ctx(&d, "wrong key");
    wrong.expect_code(255, &c).expect_stdout("", &c);
    let expected = answers(&wrong, user());
    assert!(
        expected
            .iter()
            .any(|l| l.ends_with("USER@127.0.0.1: Permission denied (publickey).")),
        "{c}\n{wrong}"
    );

    // A missing account is logged in sshd's words ("Invalid user NAME").
    for (name, reason) in [
        ("skiff-locked", "refusing login: account is locked"),
        (
            no_shell.name(),
            "refusing login: account has no usable login shell",
        ),
        (missing, "Invalid user"),
    ] {
        let out = attempt(name, &fx.client_key);
        let c = ctx(&d, &format!("login as {name}"));
        out.expect_code(255, &c).expect_stdout("", &c);
        assert_eq!(
            answers(&out, name),
            expected,
            "{c}: must look exactly like a wrong key\n{out}"
        );
        assert!(
            d.log()
                .lines()
                .any(|l| l.contains(reason) && l.contains(name)),
            "{c}: skiffd must log {reason:?} for {name}"
        );
    }
}

// ---------------------------------------------------------------------------
// Algorithms
// ---------------------------------------------------------------------------

/// One side's KEXINIT proposal as `ssh -vv` prints it.
#[derive(Debug, Default)]
struct Proposal {
    kex: Vec<String>,
    host_keys: Vec<String>,
    ciphers_ctos: Vec<String>,
    ciphers_stoc: Vec<String>,
    macs_ctos: Vec<String>,
    macs_stoc: Vec<String>,
}

/// The client's and the server's proposals from `ssh -vv` output.
fn proposals(debug: &str) -> (Proposal, Proposal) {
    let (mut client, mut server) = (Proposal::default(), Proposal::default());
    let mut current: Option<&mut Proposal> = None;
    for line in debug.lines() {
        let line = line.trim_end_matches('\r');
        if line.ends_with("local client KEXINIT proposal") {
            current = Some(&mut client);
            continue;
        }
        if line.ends_with("peer server KEXINIT proposal") {
            current = Some(&mut server);
            continue;
        }
        let Some(p) = current.as_deref_mut() else {
            continue;
        };
        let Some((key, value)) = line
            .strip_prefix("debug2: ")
            .and_then(|rest| rest.split_once(": "))
        else {
            continue;
        };
        let list = value.split(',').map(str::to_string).collect();
        match key {
            "KEX algorithms" => p.kex = list,
            "host key algorithms" => p.host_keys = list,
            "ciphers ctos" => p.ciphers_ctos = list,
            "ciphers stoc" => p.ciphers_stoc = list,
            "MACs ctos" => p.macs_ctos = list,
            "MACs stoc" => p.macs_stoc = list,
            _ => {}
        }
    }
    (client, server)
}

/// The value after `prefix` on the first line that has it.
fn debug_value<'a>(debug: &'a str, prefix: &str) -> Option<&'a str> {
    debug
        .lines()
        .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.trim_end()))
}

const AEAD: [&str; 3] = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
];

/// What `ssh -vvv` shows: skiffd offers only modern algorithms, the key
/// exchange is the client's first choice among them (mlkem768x25519-sha256
/// or curve25519-sha256), the cipher an AEAD one, and strict KEX is used.
#[test]
fn negotiates_modern_algorithms_with_strict_kex() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-vvv")
        .args(&["echo negotiated"])
        .run();
    let c = ctx(&d, "ssh -vvv");
    out.expect_code(0, &c).expect_stdout("negotiated\n", &c);
    let debug = &out.stderr;
    let (client, server) = proposals(debug);
    assert!(
        !client.kex.is_empty() && !server.kex.is_empty(),
        "{c}: no KEXINIT proposals in the debug output\n{out}"
    );

    // What skiffd offers (docs/skiffd-config.md, "Algorithms").
    assert_eq!(server.ciphers_ctos, AEAD, "{c}: server ciphers\n{out}");
    assert_eq!(server.ciphers_stoc, AEAD, "{c}: server ciphers\n{out}");
    assert_eq!(
        server.kex.first().map(String::as_str),
        Some("mlkem768x25519-sha256"),
        "{c}: skiffd prefers the hybrid post-quantum key exchange\n{out}"
    );
    assert_eq!(
        server.kex.get(1).map(String::as_str),
        Some("curve25519-sha256"),
        "{c}\n{out}"
    );
    for alg in server
        .kex
        .iter()
        .chain(&server.macs_ctos)
        .chain(&server.macs_stoc)
    {
        assert!(
            !alg.contains("sha1") && !alg.contains("group1-") && !alg.contains("md5"),
            "{c}: skiffd offers the weak algorithm {alg}\n{out}"
        );
    }
    assert_eq!(server.host_keys, ["ssh-ed25519"], "{c}\n{out}");

    // What was negotiated: the client's first key exchange that the
    // server offers too.
    let pseudo = |a: &&String| a.starts_with("ext-info-") || a.starts_with("kex-strict-");
    let expected_kex = client
        .kex
        .iter()
        .filter(|a| !pseudo(a))
        .find(|a| server.kex.contains(a))
        .unwrap_or_else(|| panic!("{c}: no common key exchange\n{out}"));
    let kex = debug_value(debug, "kex: algorithm: ").unwrap_or("");
    assert_eq!(kex, expected_kex, "{c}: negotiated key exchange\n{out}");
    assert!(
        ["mlkem768x25519-sha256", "curve25519-sha256"].contains(&kex),
        "{c}: unexpected key exchange {kex}\n{out}"
    );
    for dir in ["server->client", "client->server"] {
        let line = debug_value(debug, &format!("kex: {dir} cipher: ")).unwrap_or("");
        let cipher = line.split_whitespace().next().unwrap_or("");
        assert!(AEAD.contains(&cipher), "{c}: {dir} cipher {line:?}\n{out}");
        assert!(
            line.contains("MAC: <implicit>"),
            "{c}: an AEAD cipher needs no MAC\n{out}"
        );
    }

    // Strict KEX (the Terrapin countermeasure): offered by skiffd, and
    // used when this OpenSSH supports it too (9.6+, or a backport).
    assert!(
        server
            .kex
            .iter()
            .any(|a| a == "kex-strict-s-v00@openssh.com"),
        "{c}: skiffd must offer strict KEX\n{out}"
    );
    if client
        .kex
        .iter()
        .any(|a| a == "kex-strict-c-v00@openssh.com")
    {
        for marker in [
            "will use strict KEX ordering",
            "resetting send seqnr",
            "resetting read seqnr",
        ] {
            assert!(
                debug.contains(marker),
                "{c}: strict KEX marker {marker:?} missing\n{out}"
            );
        }
    } else {
        eprintln!("NOTICE: this OpenSSH does not offer strict KEX; not checking its use");
    }
}

/// Forcing algorithms skiffd does not offer fails during negotiation.
#[test]
fn refuses_weak_algorithms() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    for (opts, reason) in [
        (&["Ciphers=aes128-cbc"][..], "no matching cipher found"),
        (
            &["KexAlgorithms=diffie-hellman-group14-sha1"][..],
            "no matching key exchange method found",
        ),
        // The cipher is refused first; with an AEAD cipher no MAC is used
        // at all.
        (
            &["MACs=hmac-sha1", "Ciphers=aes128-ctr"][..],
            "no matching cipher found",
        ),
    ] {
        let mut run = ssh(d.port(), user(), &fx.client_key).log_level("INFO");
        for o in opts {
            run = run.opt(o);
        }
        let out = run.args(&["echo should-not-run"]).run();
        let c = ctx(&d, &format!("ssh -o {}", opts.join(" -o ")));
        out.expect_code(255, &c).expect_stdout("", &c);
        assert!(
            out.stderr.contains("Unable to negotiate") && out.stderr.contains(reason),
            "{c}: expected {reason:?}\n{out}"
        );
    }
}

// ---------------------------------------------------------------------------
// Host key and configuration
// ---------------------------------------------------------------------------

/// `ssh-keygen -y -f KEY`: the public key (type and base64) of a private
/// key file.
fn public_of(private: &Path) -> String {
    let out = Run::new("ssh-keygen")
        .arg("-y")
        .arg("-f")
        .arg(private)
        .run();
    out.expect_code(0, "ssh-keygen -y");
    let text = out.stdout_str();
    let mut it = text.split_whitespace();
    format!("{} {}", it.next().unwrap_or(""), it.next().unwrap_or(""))
}

/// Without --host-key skiffd creates an ed25519 key (0600, directory 0700)
/// in $XDG_STATE_HOME/skiffd, serves it, and reuses it after a restart.
#[test]
fn generated_host_key_is_private_and_reused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let mut d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).own_host_key());
    let dir = d.state_home().join("skiffd");
    let key = dir.join("ssh_host_ed25519_key");
    let c = ctx(&d, "generated host key");
    assert!(key.is_file(), "{c}: {} missing", key.display());
    assert_eq!(format!("{:o}", file_mode(&key)), "600", "{c}: key mode");
    assert_eq!(format!("{:o}", file_mode(&dir)), "700", "{c}: dir mode");
    let public = public_of(&key);
    assert!(public.starts_with("ssh-ed25519 "), "{c}: {public}");
    let pub_file = fs::read_to_string(dir.join("ssh_host_ed25519_key.pub")).unwrap_or_default();
    assert!(
        pub_file.starts_with(&public),
        "{c}: .pub file {pub_file:?} does not match the key"
    );
    let bytes = fs::read(&key).expect("read host key");

    // ssh with StrictHostKeyChecking=yes and only this key trusted.
    let kh = fx.path().join("kh_generated");
    write_file(
        &kh,
        format!("{} {public}\n", known_hosts_name(d.port())),
        0o644,
    );
    let connect = |d: &Skiffd, what: &str| {
        ssh(d.port(), user(), &fx.client_key)
            .known_hosts(&kh)
            .opt("HostKeyAlgorithms=ssh-ed25519")
            .args(&["echo host-ok"])
            .run()
            .expect_code(0, &ctx(d, what))
            .expect_stdout("host-ok\n", what);
    };
    connect(&d, "first start serves the generated key");

    d.restart();
    connect(&d, "after a restart the same key is served");
    assert_eq!(
        fs::read(&key).expect("read host key"),
        bytes,
        "{}",
        ctx(&d, "the key file must not change")
    );
    assert_eq!(
        d.log().matches("generated host key").count(),
        1,
        "{}",
        ctx(&d, "the key is generated once")
    );
}

/// A bad value stops skiffd at once with `FILE:LINE:` on stderr.
#[test]
fn bad_config_value_names_file_and_line() {
    let scratch = tempdir();
    let conf = scratch.path().join("skiffd.conf");
    write_file(
        &conf,
        "# skiffd test config\nLoginGraceTime 30\nMaxSessions zero\n",
        0o644,
    );
    let start = Instant::now();
    let out = Run::new(skiffd_bin())
        .arg("--config")
        .arg(&conf)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .env("XDG_STATE_HOME", scratch.path().join("state"))
        .timeout(Duration::from_secs(20))
        .run();
    let took = start.elapsed();
    assert_ne!(out.code, 0, "skiffd must refuse the config\n{out}");
    assert!(took < Duration::from_secs(5), "took {took:?}\n{out}");
    let lines = out.stderr_lines();
    let want = format!("{}:3: ", conf.display());
    assert!(
        lines.len() == 1 && lines[0].starts_with("skiffd: ") && lines[0].contains(&want),
        "expected one line naming {want:?}\n{out}"
    );
    assert!(
        lines[0].contains("\"zero\""),
        "the bad value is quoted\n{out}"
    );
}

// ---------------------------------------------------------------------------
// authorized_keys lines skiffd cannot honour, and MaxAuthTries
// ---------------------------------------------------------------------------

/// A key whose line carries an option skiffd does not know is unusable
/// (a restriction it cannot enforce must not be silently dropped), the log
/// names the file and line, and the other lines of the file still work.
#[test]
fn unknown_authorized_keys_option_disables_that_key_and_names_the_line() {
    let Some((fx, [odd], d)) = skiffd_with_keys([("odd_option", "no-pty,frobnicate")]) else {
        return;
    };
    let out = ssh(d.port(), user(), &odd).args(&["echo", "ran"]).run();
    let c = ctx(&d, "key with an unknown option");
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains("Permission denied (publickey)"),
        "{c}\n{out}"
    );
    let line = fs::read_to_string(&fx.authorized_keys)
        .expect("authorized_keys")
        .lines()
        .position(|l| l.contains("frobnicate"))
        .expect("the odd line is in the file")
        + 1;
    let needle = format!("{}:{line}", fx.authorized_keys.display());
    wait_for_log(&d, &needle, Duration::from_secs(5), |log| {
        log.contains(&needle) && log.contains("frobnicate")
    });
    // The plain key on another line of the same file is unaffected.
    let ok = ssh(d.port(), user(), &fx.client_key)
        .args(&["echo", "ran"])
        .run();
    ok.expect_code(0, &c).expect_stdout("ran\n", &c);
}

/// With `MaxAuthTries 2`, a client that offers two wrong keys before the
/// right one is cut off; with the right key among the first two it gets in.
#[test]
fn max_auth_tries_limits_failed_attempts() {
    let Some((fx, d)) = skiffd_with_config("MaxAuthTries 2\n") else {
        return;
    };
    let wrong1 = fx.keygen("wrong1", KeyType::Ed25519, None);
    let wrong2 = fx.keygen("wrong2", KeyType::Ed25519, None);
    let good = fx.client_key.private.display().to_string();
    let c = ctx(&d, "MaxAuthTries 2");
    // ssh offers its identities in command-line order.
    let out = ssh(d.port(), user(), &wrong1)
        .flag("-i")
        .flag(&wrong2.private.display().to_string())
        .flag("-i")
        .flag(&good)
        .args(&["echo", "ran"])
        .run();
    out.expect_code(255, &c).expect_stdout("", &c);
    let out = ssh(d.port(), user(), &wrong1)
        .flag("-i")
        .flag(&good)
        .args(&["echo", "ran"])
        .run();
    out.expect_code(0, &c).expect_stdout("ran\n", &c);
}

/// AllowUsers, DenyUsers, AllowGroups, DenyGroups and PermitRootLogin
/// decide who may log in at all, whatever the key; a refusal is logged.
#[test]
fn access_rules_decide_who_may_log_in() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let [forced] = fx.keys_with_options([("forced", "command=\"echo forced\"")]);
    let group = {
        let out = Command::new("id").args(["-gn", user()]).output().unwrap();
        assert!(out.status.success(), "id -gn");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let u = user();
    let login =
        |d: &Skiffd, name: &str, key: &Key| ssh(d.port(), name, key).args(&["echo", "in"]).run();
    let mut cases = vec![
        (format!("AllowUsers {u}"), u.to_string(), 0),
        (
            "AllowUsers someone-else nobody*".to_string(),
            u.to_string(),
            255,
        ),
        (format!("DenyUsers {u}"), u.to_string(), 255),
        (format!("AllowUsers {u}@127.0.0.1"), u.to_string(), 0),
        (format!("AllowUsers {u}@10.0.0.0/8"), u.to_string(), 255),
        (format!("AllowUsers *\nDenyUsers {u}"), u.to_string(), 255),
        (format!("AllowGroups {group}"), u.to_string(), 0),
        (
            "AllowGroups no-such-group-skiff".to_string(),
            u.to_string(),
            255,
        ),
        (format!("DenyGroups {group}"), u.to_string(), 255),
    ];
    if is_root() {
        cases.push(("PermitRootLogin prohibit-password".into(), "root".into(), 0));
        cases.push(("PermitRootLogin no".into(), "root".into(), 255));
        cases.push((
            "PermitRootLogin forced-commands-only".into(),
            "root".into(),
            255,
        ));
    }
    for (config, name, code) in cases {
        let d = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&format!("{config}\n")),
        );
        let c = ctx(&d, &format!("{config:?} as {name}"));
        let out = login(&d, &name, &fx.client_key);
        assert_eq!(out.code, code, "{c}\n{out}");
        if code == 0 {
            out.expect_stdout("in\n", &c);
        } else {
            assert!(
                d.log().contains("refusing login"),
                "{c}: the reason is logged"
            );
        }
        if config == "PermitRootLogin forced-commands-only" {
            // A key that forces a command lets root in, running it.
            login(&d, "root", &forced)
                .expect_code(0, &c)
                .expect_stdout("forced\n", &c);
        }
    }
}

#[test]
fn bad_access_rules_stop_skiffd() {
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    for (text, needle) in [
        ("AllowUsers\n", "needs at least one pattern"),
        ("PermitRootLogin sometimes\n", "PermitRootLogin: expected"),
    ] {
        write_file(&config, text, 0o644);
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{text:?}\n{out}");
        assert!(
            out.stderr.contains(needle) && out.stderr.contains(":1"),
            "{text:?}: expected {needle:?} and the line\n{out}"
        );
    }
}

/// `Banner`: skiffd sends the file's text before authentication; stock
/// ssh and skiff both show it, and skiff shows terminal control bytes in
/// it escaped and keeps quiet under `LogLevel ERROR`.
#[test]
fn banner_is_sent_before_authentication() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let banner = fx.path().join("banner");
    write_file(&banner, "Authorized use only\n\x1b[2Jcleared?\n", 0o644);
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config(&format!("Banner {}\n", banner.display())),
    );
    let c = ctx(&d, "Banner");
    let out = ssh(d.port(), user(), &fx.client_key)
        .log_level("INFO")
        .args(&["true"])
        .run();
    out.expect_code(0, &c);
    assert!(out.stderr.contains("Authorized use only"), "{c}\n{out}");

    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
        .cmd("true")
        .run();
    out.expect_code(0, &c);
    assert!(out.stderr.contains("Authorized use only"), "{c}\n{out}");
    assert!(out.stderr.contains("\\u{1b}[2Jcleared?"), "{c}\n{out}");
    assert!(
        !out.stderr.contains('\x1b'),
        "{c}: control bytes reach the terminal\n{out}"
    );
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
        .opt("LogLevel=ERROR")
        .cmd("true")
        .run();
    out.expect_code(0, &c);
    assert_eq!(out.stderr, "", "{c}\n{out}");
}

/// `AuthorizedKeysFile` may name several files (sshd's default names two):
/// each is read in turn, and a missing one is no error.
#[test]
fn several_authorized_keys_files_are_read_in_turn() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let (first, second) = (fx.path().join("keys1"), fx.path().join("keys2"));
    write_file(&first, fx.client_key.pub_line() + "\n", 0o644);
    write_file(&second, fx.rsa_key.pub_line() + "\n", 0o644);
    let files = format!(
        "{} {} {}",
        fx.path().join("missing").display(),
        first.display(),
        second.display()
    );
    let d = Skiffd::start_with(SkiffdOptions::new(&fx.host_key, Path::new(&files)));
    let c = server_context(&d, "several AuthorizedKeysFile files");
    for key in [&fx.client_key, &fx.rsa_key] {
        ssh(d.port(), user(), key)
            .args(&["echo in"])
            .run()
            .expect_code(0, &c)
            .expect_stdout("in\n", &c);
    }
    let out = ssh(d.port(), user(), &fx.ecdsa_key).args(&["true"]).run();
    assert_eq!(out.code, 255, "{c}\n{out}");
}
