//! skiffd's `AuditLog` and sshd-style login lines, driven by stock
//! OpenSSH `ssh` and `sftp`: a scripted set of connections (an exec that
//! exits 3, a shell on a pty, an sftp batch, a forwarded connection, a
//! login with a stranger's key) leaves exactly the expected JSON records,
//! in order, per connection, in a 0600 file; skiffd's "Accepted publickey"
//! and "Connection closed by authenticating user" lines read as real
//! sshd's do for the same logins; `LogLevel` sets how much skiffd logs
//! unless the command line says otherwise.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// The audit log's records, once `want` `disconnect` records are in it
/// (the writer is a thread of its own: it may lag the clients a little).
fn records(path: &Path, want: usize, d: &Skiffd) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\n{}", ctx(d, "audit")))
            })
            .collect();
        let ended = lines.iter().filter(|r| r["event"] == "disconnect").count();
        if ended >= want || Instant::now() > deadline {
            assert_eq!(ended, want, "{text}\n{}", ctx(d, "disconnect records"));
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A skiffd writing its `AuditLog` to the returned path, in the returned
/// directory (kept while the test runs).
fn audited_skiffd() -> (Fixture, tempfile::TempDir, std::path::PathBuf, Skiffd) {
    let fx = Fixture::new();
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let config = format!("AuditLog {}\n", audit.display());
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    (fx, dir, audit, d)
}

/// The records grouped by connection, connections in order of their first
/// record.
fn by_connection(records: &[Value]) -> Vec<Vec<&Value>> {
    let mut groups: Vec<(String, Vec<&Value>)> = Vec::new();
    for r in records {
        let id = r["conn"].as_str().expect("conn id").to_string();
        match groups.iter_mut().find(|(g, _)| *g == id) {
            Some((_, g)) => g.push(r),
            None => groups.push((id, vec![r])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

fn events(group: &[&Value]) -> Vec<String> {
    group
        .iter()
        .map(|r| r["event"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The line of `log` that contains `needle`, from `needle` on, with its
/// client port replaced by `N` (ports differ between two logins).
fn line_shape(log: &str, needle: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains(needle))?;
    let from = &line[line.find(needle)?..];
    let words: Vec<String> = from
        .split(' ')
        .scan(false, |after_port, w| {
            let out = if *after_port {
                "N".to_string()
            } else {
                w.to_string()
            };
            *after_port = w == "port";
            Some(out)
        })
        .collect();
    Some(words.join(" "))
}

#[test]
fn a_scripted_session_leaves_the_expected_records() {
    if !require_openssh() {
        return;
    }
    let (fx, dir, audit, d) = audited_skiffd();
    let c = |what: &str| ctx(&d, what);
    let me = user();

    // 1. An exec that exits 3.
    ssh(d.port(), me, &fx.client_key)
        .args(&["exit 3"])
        .run()
        .expect_code(3, &c("exec"));
    // 2. A shell on a pty.
    let shell = ssh(d.port(), me, &fx.client_key)
        .flag("-tt")
        .input(Input::Bytes(b"echo on-a-pty; exit 0\n".to_vec()))
        .run();
    shell.expect_code(0, &c("shell with pty"));
    assert!(
        shell.stdout_str().contains("on-a-pty"),
        "{}",
        c("shell output")
    );
    // 3. An sftp batch.
    let batch = dir.path().join("batch");
    std::fs::write(&batch, "pwd\n").unwrap();
    stock_sftp_batch(d.port(), &fx.client_key, &batch).expect_code(0, &c("sftp"));
    // 4. A forwarded TCP connection (direct-tcpip, as -L makes), used once.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let target_port = target.local_addr().unwrap().port();
    let answer = std::thread::spawn(move || {
        let (mut s, _) = target.accept().unwrap();
        s.write_all(b"hello\n").unwrap();
    });
    let forwarded = ssh(d.port(), me, &fx.client_key)
        .flag("-W")
        .flag(&format!("127.0.0.1:{target_port}"))
        .run();
    answer.join().unwrap();
    forwarded.expect_stdout("hello\n", &c("forwarded connection"));
    // 5. A stranger's key.
    ssh(d.port(), me, &fx.stranger_key)
        .run()
        .expect_code(255, &c("stranger's key"));

    let all = records(&audit, 5, &d);
    let mode = file_mode(&audit);
    assert_eq!(mode & 0o777, 0o600, "audit log mode {mode:o}");
    let groups = by_connection(&all);
    assert_eq!(groups.len(), 5, "{all:#?}");
    let fingerprint = fx.client_key.fingerprint();
    for g in &groups {
        assert_eq!(g[0]["event"], "connect", "{g:#?}");
        for r in g {
            assert_eq!(r["peer"], "127.0.0.1");
            assert!(r["port"].as_u64().is_some_and(|p| p > 0), "{r}");
            let time = r["time"].as_str().unwrap();
            assert!(time.ends_with('Z') && time.contains('T'), "{time}");
        }
    }
    let success = |g: &[&Value]| {
        let auth = g
            .iter()
            .find(|r| r["event"] == "auth")
            .expect("auth record");
        assert_eq!(auth["result"], "success", "{auth}");
        assert_eq!(auth["user"], me);
        assert_eq!(auth["method"], "publickey");
        assert_eq!(auth["key_type"], "ED25519");
        assert_eq!(auth["fingerprint"], fingerprint.as_str());
    };

    let exec = &groups[0];
    assert_eq!(events(exec), ["connect", "auth", "session", "disconnect"]);
    success(exec);
    assert_eq!(exec[2]["kind"], "exec");
    assert_eq!(exec[2]["requested"], "exit 3");
    assert_eq!(exec[2]["forced"], Value::Null);
    assert_eq!(exec[2]["exit"], 3);
    assert_eq!(exec[2]["pty"], false);
    assert_eq!(exec[3]["user"], me);

    let shell = &groups[1];
    assert_eq!(events(shell), ["connect", "auth", "session", "disconnect"]);
    success(shell);
    assert_eq!(shell[2]["kind"], "shell");
    assert_eq!(shell[2]["requested"], Value::Null);
    assert_eq!(shell[2]["pty"], true);
    assert_eq!(shell[2]["exit"], 0);
    assert!(shell[2]["bytes_in"].as_u64().unwrap() >= 20, "{}", shell[2]);
    assert!(shell[2]["bytes_out"].as_u64().unwrap() >= 8, "{}", shell[2]);

    let sftp = &groups[2];
    assert_eq!(
        events(sftp),
        ["connect", "auth", "subsystem", "session", "disconnect"]
    );
    success(sftp);
    assert_eq!(sftp[2]["name"], "sftp");
    assert_eq!(sftp[3]["kind"], "subsystem");
    assert_eq!(sftp[3]["requested"], "sftp");
    assert!(sftp[3]["bytes_out"].as_u64().unwrap() > 0, "{}", sftp[3]);

    let forward = &groups[3];
    assert_eq!(
        events(forward),
        ["connect", "auth", "forward", "disconnect"]
    );
    success(forward);
    assert_eq!(forward[2]["kind"], "direct-tcpip");
    assert_eq!(
        forward[2]["target"],
        format!("127.0.0.1:{target_port}").as_str()
    );

    let stranger = &groups[4];
    assert_eq!(events(stranger), ["connect", "auth", "disconnect"]);
    assert_eq!(stranger[1]["result"], "failure");
    assert_eq!(
        stranger[1]["fingerprint"],
        fx.stranger_key.fingerprint().as_str()
    );
    assert_eq!(stranger[2]["user"], me);
    // Nothing secret: no key material in any record.
    let text = std::fs::read_to_string(&audit).unwrap();
    let material = fx.client_key.key_material();
    let blob = material.split(' ').nth(1).unwrap();
    assert!(!text.contains(blob), "key material in the audit log");
}

/// A client that says goodbye (skiff sends `SSH_MSG_DISCONNECT` at its
/// end, as ssh does) leaves a `disconnect` record of "connection closed";
/// one killed mid-session (the kernel closes its socket, no goodbye) one
/// that says so, and skiffd does not log that end as an error.
#[test]
fn a_client_killed_mid_session_is_told_from_one_that_said_goodbye() {
    if !require_openssh() {
        return;
    }
    let (fx, _dir, audit, d) = audited_skiffd();
    let c = |what: &str| ctx(&d, what);

    // 1. skiff, to its end.
    let home = ClientHome::new();
    skiff_cmd(&home, d.port(), user(), &fx.client_key, "true").expect_code(0, &c("skiff"));
    records(&audit, 1, &d);

    // 2. A stock ssh killed once its command runs.
    let mut ssh = ssh_command(d.port(), user(), &fx.client_key)
        .arg("echo started; exec sleep 60")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn ssh");
    let mut first = String::new();
    let stdout = ssh.stdout.take().expect("piped stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first)
        .expect("read ssh's output");
    assert_eq!(first, "started\n", "{}", c("the command's first line"));
    ssh.kill().expect("kill ssh");
    ssh.wait().expect("reap ssh");

    let all = records(&audit, 2, &d);
    let ended: Vec<&Value> = all.iter().filter(|r| r["event"] == "disconnect").collect();
    let reasons: Vec<&str> = ended
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        reasons,
        [
            "connection closed",
            "closed by the client without a disconnect message"
        ],
        "{all:#?}"
    );
    // Neither end is logged as an error (the readiness probe's bare
    // connection, before any identification, may be).
    let log = d.log();
    for r in &ended {
        let peer = format!("127.0.0.1:{}", r["port"]);
        assert!(
            !log.lines()
                .any(|l| l.contains("connection ended") && l.contains(&peer)),
            "{}",
            c(&format!("{peer}'s end logged as an error"))
        );
    }
}

#[test]
fn login_lines_read_as_sshds() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let me = user();
    for port in [d.port(), sshd.port()] {
        ssh(port, me, &fx.client_key)
            .args(&["true"])
            .run()
            .expect_code(0, &ctx(&d, "login"));
        ssh(port, me, &fx.stranger_key)
            .args(&["true"])
            .run()
            .expect_code(255, &ctx(&d, "stranger"));
    }
    let accepted = format!("Accepted publickey for {me} from");
    let closed = format!("Connection closed by authenticating user {me} ");
    let wait = |server: &dyn Daemon, needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = line_shape(&server.log(), needle) {
                return line;
            }
            assert!(Instant::now() < deadline, "{}", ctx(server, needle));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let ours = wait(&d, &accepted);
    let theirs = wait(&sshd, &accepted);
    assert_eq!(ours, theirs, "{}", ctx(&d, "Accepted line"));
    assert!(
        ours.ends_with(&format!("ssh2: ED25519 {}", fx.client_key.fingerprint())),
        "{ours}"
    );
    assert_eq!(wait(&d, &closed), wait(&sshd, &closed));
    let failed = format!("Failed publickey for {me} from");
    assert_eq!(wait(&d, &failed), wait(&sshd, &failed));
}

#[test]
fn log_level_sets_what_is_logged_unless_the_command_line_says() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let quiet = |verbose: bool| {
        let mut opts =
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("LogLevel ERROR\n");
        opts.verbose = verbose;
        opts
    };
    let accepted = format!("Accepted publickey for {}", user());
    // LogLevel ERROR: no login lines.
    let d = Skiffd::start_with(quiet(false));
    ssh(d.port(), user(), &fx.client_key)
        .args(&["true"])
        .run()
        .expect_code(0, &ctx(&d, "login"));
    // -v on the command line wins over LogLevel.
    let loud = Skiffd::start_with(quiet(true));
    ssh(loud.port(), user(), &fx.client_key)
        .args(&["true"])
        .run()
        .expect_code(0, &ctx(&loud, "login"));
    // The login line is written while the login is judged, before ssh
    // can have ended.
    assert!(
        loud.log().contains(&accepted),
        "{}",
        ctx(&loud, "-v wins over LogLevel")
    );
    assert!(
        !d.log().contains(&accepted),
        "{}",
        ctx(&d, "LogLevel ERROR")
    );
    // A bad value, and an AuditLog that is no absolute path, name the
    // file and line.
    let dir = tempdir();
    for (text, says) in [
        ("LogLevel LOUD\n", "LogLevel must be"),
        ("AuditLog audit.log\n", "AuditLog must be an absolute path"),
        (
            "Match User x\nAuditLog /tmp/a.log\n",
            "cannot be used inside a Match block",
        ),
    ] {
        let config = dir.path().join("bad_config");
        std::fs::write(&config, text).unwrap();
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{text}");
        let err = &out.stderr;
        assert!(err.contains(says) && err.contains("bad_config:"), "{err}");
    }
    // -T prints both as sshd spells them.
    let config = dir.path().join("config");
    std::fs::write(&config, "LogLevel debug1\nAuditLog /var/log/skiffd.audit\n").unwrap();
    let out = Run::new(skiffd_bin())
        .arg("-T")
        .arg("-f")
        .arg(&config)
        .arg("-h")
        .arg(&fx.host_key.private)
        .run();
    out.expect_code(0, "skiffd -T");
    let printed = out.stdout_str();
    assert!(printed.lines().any(|l| l == "loglevel DEBUG"), "{printed}");
    assert!(
        printed
            .lines()
            .any(|l| l == "auditlog /var/log/skiffd.audit"),
        "{printed}"
    );
}

#[test]
fn certificate_logins_read_as_sshds_and_are_audited() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let me = user();
    let certified = user_certificate_copy(
        &fx,
        &ca,
        &fx.stranger_key,
        "certified",
        ("cert-id-7", me),
        &["-z", "7"],
    );
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let trusted = format!("TrustedUserCAKeys {}", ca.public.display());
    let config = format!("{trusted}\nAuditLog {}\n", audit.display());
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&trusted]);
    for port in [d.port(), sshd.port()] {
        ssh(port, me, &certified)
            .args(&["true"])
            .run()
            .expect_code(0, &ctx(&d, "certificate login"));
    }
    let accepted = format!("Accepted publickey for {me} from");
    let ours = line_shape(&d.log(), &accepted).unwrap_or_else(|| panic!("{}", ctx(&d, "no line")));
    let theirs =
        line_shape(&sshd.log(), &accepted).unwrap_or_else(|| panic!("{}", ctx(&sshd, "no line")));
    assert_eq!(ours, theirs);
    let ca_fingerprint = ca.fingerprint();
    assert!(
        ours.ends_with(&format!(
            "ID cert-id-7 (serial 7) CA ED25519 {ca_fingerprint}"
        )),
        "{ours}"
    );
    let all = records(&audit, 1, &d);
    // ssh may offer the plain key first: skiffd, trusting a CA, lets any
    // key's probe on and refuses its signature (a failure record).
    let auths: Vec<&Value> = all.iter().filter(|r| r["event"] == "auth").collect();
    let auth = auths.last().expect("auth record");
    assert!(
        auths[..auths.len() - 1]
            .iter()
            .all(|a| a["result"] == "failure" && a["key_type"] == "ED25519"),
        "{auths:#?}"
    );
    assert_eq!(auth["result"], "success");
    assert_eq!(auth["key_type"], "ED25519-CERT");
    assert_eq!(auth["fingerprint"], fx.stranger_key.fingerprint().as_str());
    assert_eq!(auth["certificate"]["key_id"], "cert-id-7");
    assert_eq!(auth["certificate"]["serial"], 7);
    assert_eq!(auth["certificate"]["ca_type"], "ED25519");
    assert_eq!(
        auth["certificate"]["ca_fingerprint"],
        ca_fingerprint.as_str()
    );
}

#[test]
fn a_data_plane_copy_leaves_a_transfer_record() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str(&format!("AuditLog {}\n", audit.display()));
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let local = dir.path().join("payload");
    random_file(&local, 300_000);
    let rdir = account_dir();
    let target = format!("{}@127.0.0.1:{}", user(), rdir.path().display());
    skiff_cp(
        d.port(),
        &fx.client_key,
        &[
            "--cipher",
            "integrity",
            "--streams",
            "1",
            &local.display().to_string(),
            &target,
        ],
    )
    .expect_code(0, &ctx(&d, "skiff cp"));
    // The transfer record is written when the transfer process reports its
    // end, and the session's when its channel closes: either may reach
    // skiffd after the connection's end, in either order.
    let deadline = Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = records(&audit, 1, &d);
        let has = |event: &str| all.iter().any(|r| r["event"] == event);
        if (has("transfer") && has("session")) || Instant::now() > deadline {
            break all;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let transfer: Vec<&Value> = all.iter().filter(|r| r["event"] == "transfer").collect();
    assert_eq!(transfer.len(), 1, "{all:#?}");
    assert_eq!(transfer[0]["mode"], "integrity");
    assert_eq!(transfer[0]["user"], user());
    assert!(transfer[0]["streams"].as_u64().is_some_and(|n| n >= 1));
    let session = all
        .iter()
        .find(|r| r["event"] == "session")
        .expect("session record");
    assert_eq!(session["kind"], "subsystem");
    assert_eq!(session["requested"], "transfer@skiff");
}
