//! skiffd logging to syslog as sshd does (issue 23, "Logging"): started
//! with `-D` and none of `-e`, `-d`, `-E`, skiffd sends its lines to
//! `/dev/log` as `<PRI>TIMESTAMP skiffd[PID]: MESSAGE` datagrams, PRI made
//! of `SyslogFacility` (AUTH by default) and the line's severity; `-e` and
//! `-d` keep the log on stderr; with no syslog listening, skiffd says so
//! once on stderr, keeps serving, and sends again once syslog is back;
//! `skiffd -T` prints `syslogfacility` as `sshd -T` does.
//!
//! skiffd runs in a mount namespace of its own whose `/dev` is an overlay
//! of the real one with `/dev/log` a link to a datagram socket the test
//! reads (the machine's `/dev` and syslog are never touched). The overlay
//! hides `/dev`'s own mounts (`/dev/pts`, `/dev/shm`), so these tests ask
//! for no terminal. They need root (mounts), `unshare` and OpenSSH.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// How long a line may take to arrive.
const WAIT: Duration = Duration::from_secs(20);

/// Whether the test can run: root (for the mount namespace), `unshare`
/// and OpenSSH. Under CI a missing piece is a failure.
fn can_run() -> bool {
    if !is_root() {
        let msg = "a private /dev/log needs root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return false;
    }
    require_tool("unshare", "util-linux") && require_openssh()
}

/// The syslog daemon of skiffd's namespace: a datagram socket the test
/// reads.
struct Syslog {
    socket: UnixDatagram,
}

impl Syslog {
    fn bind(path: &Path) -> Syslog {
        Syslog {
            socket: UnixDatagram::bind(path).expect("bind the syslog socket"),
        }
    }

    /// Datagrams, in order, until one makes `last` true (at most
    /// [`WAIT`]); panics with what came when none does.
    fn until(&self, last: impl Fn(&str) -> bool, what: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {what} in {WAIT:?}; got:\n{got:#?}");
            self.socket.set_read_timeout(Some(left)).unwrap();
            match self.socket.recv(&mut buf) {
                Ok(n) => {
                    let line = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let done = last(&line);
                    got.push(line);
                    if done {
                        return got;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("reading the syslog socket: {e}"),
            }
        }
    }

    /// The datagrams already queued (a datagram skiffd sent is queued
    /// before its send returns).
    fn queued(&self) -> Vec<String> {
        self.socket.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = self.socket.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        self.socket.set_nonblocking(false).unwrap();
        got
    }
}

/// `unshare` arguments running skiffd where `/dev/log` links to `socket`.
fn dev_log_namespace(scratch: &Path, socket: &Path) -> Vec<String> {
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    std::fs::create_dir(&upper).unwrap();
    std::fs::create_dir(&work).unwrap();
    let script = format!(
        "set -e; mount -t overlay skiff-test-dev -o lowerdir=/dev,upperdir={},workdir={} /dev; \
         rm -f /dev/log; ln -s {} /dev/log; exec \"$@\"",
        upper.display(),
        work.display(),
        socket.display()
    );
    [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "sh",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A skiffd started as sshd is under a service manager (`-D`, sshd's
/// options), with `flags` and `config`, in a namespace whose `/dev/log` is
/// `socket`.
fn start(
    fx: &Fixture,
    scratch: &Path,
    socket: &Path,
    flags: &[&str],
    config: Option<&str>,
) -> Skiffd {
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-p".to_string(),
        "{port}".to_string(),
        "-o".to_string(),
        "ListenAddress 127.0.0.1".to_string(),
        "-o".to_string(),
        format!("AuthorizedKeysFile={}", fx.authorized_keys.display()),
        "-h".to_string(),
        fx.host_key.private.display().to_string(),
    ]);
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
        .command_line(args)
        .wrapped("unshare", dev_log_namespace(scratch, socket));
    opts.verbose = false;
    if let Some(text) = config {
        opts = opts.config(text);
    }
    Skiffd::start_with(opts)
}

/// Stock `ssh` runs `echo in` as the test account.
fn log_in(d: &Skiffd, fx: &Fixture, what: &str) {
    let c = ctx(d, what);
    ssh(d.port(), user(), &fx.client_key)
        .args(&["echo in"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("in\n", &c);
}

/// The login line sshd logs for the test account (up to the port).
fn accepted() -> String {
    format!("Accepted publickey for {} from 127.0.0.1 port ", user())
}

/// Checks `line` is `<PRI>Mmm dd hh:mm:ss skiffd[PID]: ...` and returns
/// the message.
/// The message of a syslog line with PRI `pri` from skiffd: from the
/// process `pid` when given (the listener), else from any (a connection's
/// own process logs its login).
fn message(line: &str, pri: u8, pid: Option<u32>) -> &str {
    let head = format!("<{pri}>");
    let rest = line
        .strip_prefix(&head)
        .unwrap_or_else(|| panic!("PRI {head} expected: {line:?}"));
    // RFC 3164's timestamp: `Nov 26 07:01:02` or `Nov  6 07:01:02`.
    let (stamp, rest) = rest.split_at(15);
    let b = stamp.as_bytes();
    assert!(
        b[..3].iter().all(u8::is_ascii_alphabetic)
            && b[3] == b' '
            && (b[4] == b' ' || b[4].is_ascii_digit())
            && b[5].is_ascii_digit()
            && b[6] == b' '
            && b[9] == b':'
            && b[12] == b':',
        "timestamp: {line:?}"
    );
    let tagged = rest
        .strip_prefix(" skiffd[")
        .and_then(|r| r.split_once("]: "))
        .filter(|(p, _)| p.parse::<u32>().is_ok());
    match (tagged, pid) {
        (Some((p, message)), Some(pid)) if p == pid.to_string() => message,
        (Some((_, message)), None) => message,
        _ => panic!(
            "tag skiffd[{}] expected: {line:?}",
            pid.map_or("PID".into(), |p| p.to_string())
        ),
    }
}

#[test]
fn with_dash_capital_d_logins_are_logged_to_syslog() {
    if !can_run() {
        return;
    }
    let fx = Fixture::new();
    let scratch = tempdir();
    let socket = scratch.path().join("dev-log");
    let syslog = Syslog::bind(&socket);
    let d = start(&fx, scratch.path(), &socket, &["-D"], None);
    log_in(&d, &fx, "ssh to skiffd -D");

    let lines = syslog.until(|l| l.contains(&accepted()), "Accepted publickey line");
    // Every line is one syslog message: PRI, time, tag, no colour, one line.
    for line in &lines {
        assert!(!line.contains(['\x1b', '\n']), "{line:?}");
        message(line, 38, None);
    }
    // The login is logged by the connection's own process, as sshd's.
    let login = message(lines.last().unwrap(), 38, None);
    assert!(
        !lines
            .last()
            .unwrap()
            .contains(&format!("skiffd[{}]", d.pid())),
        "{lines:#?}"
    );
    let (_, after) = login.split_once(" port ").unwrap();
    let (port, key) = after.split_once(' ').unwrap();
    assert!(port.parse::<u16>().is_ok(), "{login}");
    assert!(
        key.starts_with("ssh2: ED25519 SHA256:"),
        "sshd's words: {login}"
    );
    let listening = format!("listening on 127.0.0.1:{}", d.port());
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&listening)
                && message(l, 38, Some(d.pid())).starts_with("listening")),
        "{listening}, from the listener? {lines:#?}"
    );
    // Nothing on stderr.
    assert!(
        !d.log().contains("Accepted publickey"),
        "stderr: {}",
        d.log()
    );
}

#[test]
fn syslog_facility_sets_the_facility() {
    if !can_run() {
        return;
    }
    let fx = Fixture::new();
    let scratch = tempdir();
    let socket = scratch.path().join("dev-log");
    let syslog = Syslog::bind(&socket);
    let config = "SyslogFacility local3\n";
    let d = start(&fx, scratch.path(), &socket, &["-D"], Some(config));
    log_in(&d, &fx, "ssh to skiffd -D with SyslogFacility LOCAL3");
    let lines = syslog.until(|l| l.contains(&accepted()), "Accepted publickey line");
    // LOCAL3 is 19: 19 * 8 + 6 (info).
    let login = message(lines.last().unwrap(), 158, None);
    assert!(login.starts_with(&accepted()), "{login}");
}

#[test]
fn dash_e_and_dash_d_keep_the_log_on_stderr() {
    if !can_run() {
        return;
    }
    let fx = Fixture::new();
    for flag in ["-e", "-d"] {
        let scratch = tempdir();
        let socket = scratch.path().join("dev-log");
        let syslog = Syslog::bind(&socket);
        let d = start(&fx, scratch.path(), &socket, &["-D", flag], None);
        log_in(&d, &fx, &format!("ssh to skiffd -D {flag}"));
        // The login line is logged before the command runs, so before ssh
        // ends.
        let log = d.log();
        assert!(log.contains(&accepted()), "-D {flag}: stderr:\n{log}");
        let sent = syslog.queued();
        assert!(sent.is_empty(), "-D {flag}: sent to syslog: {sent:#?}");
    }
}

#[test]
fn without_syslog_skiffd_says_so_once_and_sends_again_when_it_is_back() {
    if !can_run() {
        return;
    }
    let fx = Fixture::new();
    let scratch = tempdir();
    // `/dev/log` links to a socket that is not there yet.
    let socket = scratch.path().join("dev-log");
    let d = start(&fx, scratch.path(), &socket, &["-D"], None);
    log_in(&d, &fx, "ssh to skiffd -D with no syslog");
    log_in(&d, &fx, "ssh to skiffd -D with no syslog, again");
    let log = d.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot log to syslog at /dev/log"))
        .collect();
    assert_eq!(said.len(), 1, "said once: stderr:\n{log}");
    assert!(!log.contains("Accepted publickey"), "stderr:\n{log}");

    // Syslog starts: the listener's next line reaches it (a SIGHUP makes
    // it log one), after a count of those it lost; and logins are logged
    // again.
    let syslog = Syslog::bind(&socket);
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let lines = syslog.until(
        |l| l.contains("reading the configuration again"),
        "the SIGHUP line",
    );
    let note = message(&lines[0], 36, Some(d.pid()));
    let (count, rest) = note.split_once(' ').unwrap();
    assert!(
        count.parse::<u64>().is_ok_and(|n| n >= 2)
            && rest == "log lines were dropped while syslog could not take them",
        "{lines:#?}"
    );
    log_in(&d, &fx, "ssh to skiffd -D once syslog is there");
    syslog.until(|l| l.contains(&accepted()), "Accepted publickey line");
    assert_eq!(d.log(), log, "nothing more on stderr");
}

/// `PROGRAM -T -f CONFIG -h KEY`, bounded.
fn dump(program: &str, config: &Path, key: &Key) -> CmdOutput {
    privsep_dir();
    Run::new(program)
        .arg("-T")
        .arg("-f")
        .arg(config)
        .arg("-h")
        .arg(&key.private)
        .timeout(Duration::from_secs(30))
        .run()
}

fn config_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    write_file(&path, text, 0o644);
    path
}

#[test]
fn dash_capital_t_prints_syslogfacility_as_sshd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    for (text, want) in [
        ("", "AUTH"),
        ("SyslogFacility local3\n", "LOCAL3"),
        ("SyslogFacility AUTHPRIV\n", "AUTHPRIV"),
        ("SyslogFacility Daemon\nSyslogFacility USER\n", "DAEMON"),
    ] {
        let config = config_file(fx.path(), "sshd_config", text);
        let line = format!("syslogfacility {want}");
        for program in [SSHD, skiffd_bin()] {
            let out = dump(program, &config, &fx.host_key);
            out.expect_code(0, &format!("{program} -T with {text:?}"));
            assert!(
                out.stdout_str().lines().any(|l| l == line),
                "{program} with {text:?}: {line}?\n{out}"
            );
        }
    }
    // A bad facility, and one inside Match (global only), are errors.
    for (name, text) in [
        ("bad_facility", "MaxSessions 4\nSyslogFacility LOCAL9\n"),
        (
            "in_match",
            "MaxSessions 4\nMatch User nobody\n  SyslogFacility USER\n",
        ),
    ] {
        let config = config_file(fx.path(), name, text);
        for program in [SSHD, skiffd_bin()] {
            let out = dump(program, &config, &fx.host_key);
            assert_ne!(out.code, 0, "{program} with {text:?}\n{out}");
        }
        let out = dump(skiffd_bin(), &config, &fx.host_key);
        let at = format!("{name}:{}:", text.lines().count());
        assert!(
            out.stderr_lines()
                .iter()
                .any(|l| l.contains(&at) && l.contains("SyslogFacility")),
            "{at}\n{out}"
        );
    }
}
