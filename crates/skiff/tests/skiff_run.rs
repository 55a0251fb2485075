//! `skiff run` against real servers: 200 simulated hosts answered by one
//! skiffd listening on 127.0.0.1 … 127.0.0.200 (every 127.x.y.z is local on
//! Linux), named node001 … node200 through a generated ssh_config, plus
//! unreachable names. Checks streamed, grouped (-b) and JSON output, the
//! summary, exit codes, timeouts that end the remote command, concurrent
//! known_hosts recording, per-host output files, bad node sets, the same
//! fan-out against OpenSSH sshd, and a server that drops connections
//! before authentication (MaxStartups).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const HOSTS: u32 = 200;

/// `skiff run` with a private HOME and the given ssh_config.
fn skiff_run(home: &ClientHome, config: &Path, args: &[&str]) -> Run {
    Run::new(skiff_bin())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .arg("run")
        .arg("-F")
        .arg(config)
        .args(args)
        .timeout(Duration::from_secs(120))
}

/// An ssh_config naming node001… after 127.0.0.1…, and node201… after
/// addresses where nothing listens.
fn write_config(dir: &Path, port: u16, key: &Key, policy: &str) -> PathBuf {
    let mut text = String::new();
    for n in 1..=HOSTS {
        text.push_str(&format!("Host node{n:03}\n  HostName 127.0.0.{n}\n"));
    }
    for n in 201..=205 {
        text.push_str(&format!(
            "Host node{n:03}\n  HostName 127.0.1.{}\n",
            n - 200
        ));
    }
    text.push_str(&format!(
        "Host *\n  Port {port}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  \
         StrictHostKeyChecking {policy}\n  ConnectTimeout 90\n",
        user = user(),
        key = key.private.display(),
    ));
    let path = dir.join("ssh_config");
    write_file(&path, text, 0o644);
    path
}

fn skiffd_for_many(fx: &Fixture) -> Skiffd {
    skiffd_for_many_with(fx, 1000)
}

/// A skiffd answering 127.0.0.1-200 that lets `max_startups` connections
/// authenticate at once and drops the others when accepted.
fn skiffd_for_many_with(fx: &Fixture, max_startups: usize) -> Skiffd {
    let opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
        .config(&format!("MaxStartups {max_startups}\n"))
        .also_listen((2..=HOSTS).map(|n| Ipv4Addr::new(127, 0, 0, n as u8)));
    Skiffd::start_with(opts)
}

/// Keys, a skiffd answering 127.0.0.1-200, a client HOME and its ssh_config.
fn many_hosts() -> Option<(Fixture, Skiffd, ClientHome, PathBuf)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d = skiffd_for_many(&fx);
    let home = ClientHome::new();
    let cfg = write_config(home.path(), d.port(), &fx.client_key, "accept-new");
    Some((fx, d, home, cfg))
}

/// Like [`many_hosts`], with a private agent home instead.
fn many_hosts_with_agent() -> Option<(Fixture, Skiffd, AgentHome, PathBuf)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d = skiffd_for_many(&fx);
    let ah = AgentHome::new();
    let cfg = write_config(ah.home.path(), d.port(), &fx.client_key, "accept-new");
    Some((fx, d, ah, cfg))
}

/// Exits 1 on 127.0.0.10-19, hangs on 127.0.0.70-79 (`sleep SECS`), else
/// prints ok. Tests that run at the same time give different SECS, so that
/// each can look for its own leftover sleepers.
fn mixed(secs: &str) -> String {
    format!(
        "set -- $SSH_CONNECTION; case $3 in \
         127.0.0.1?) echo fail; exit 1;; \
         127.0.0.7?) exec sleep {secs};; \
         *) echo ok;; esac"
    )
}
const MIXED_SLEEP: &str = "31.5";

/// The `skiff:` lines and the summary of a run's stderr, for failure messages.
fn errors(out: &CmdOutput) -> String {
    out.stderr
        .lines()
        .filter(|l| l.contains("skiff"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn fan_out_to_two_hundred_hosts_with_mixed_outcomes() {
    let Some((_fx, d, home, cfg)) = many_hosts() else {
        return;
    };
    let c = ctx(&d, "skiff run over 205 hosts");

    let out = skiff_run(
        &home,
        &cfg,
        // Debug builds on a loaded 2-core CI machine: keep handshakes few at once.
        &[
            "-j",
            "40",
            "--timeout",
            "10",
            "node[001-205]",
            "--",
            &mixed(MIXED_SLEEP),
        ],
    )
    .run();
    out.expect_code(255, &c);
    let stdout = out.stdout_str();
    let mut ok = 0;
    for n in 1..=HOSTS {
        let line = match n {
            10..=19 => format!("node{n:03}: fail"),
            70..=79 => continue,
            _ => format!("node{n:03}: ok"),
        };
        assert!(
            stdout.lines().any(|l| l == line),
            "{c}: missing {line:?}; errors:\n{}",
            errors(&out)
        );
        ok += 1;
    }
    assert_eq!(
        stdout.lines().count(),
        ok,
        "{c}: one line per answering host\n{out}"
    );
    for expected in [
        "skiff run: 205 hosts: 180 ok, 10 failed, 15 with errors",
        "  exit 1 (10): node[010-019]",
        "  timeout (10): node[070-079]",
        "  unreachable (5): node[201-205]",
    ] {
        assert!(
            out.stderr.lines().any(|l| l == expected),
            "{c}: summary line {expected:?} missing\n{out}"
        );
    }
    // Every reachable host's key was recorded exactly once, by concurrent appends.
    let kh = std::fs::read_to_string(home.known_hosts()).expect("known_hosts");
    assert_eq!(
        kh.lines().count(),
        HOSTS as usize,
        "{c}: one line per host\n{kh}"
    );
    for n in 1..=HOSTS {
        let name = format!("[127.0.0.{n}]:{} ", d.port());
        assert_eq!(
            kh.lines().filter(|l| l.starts_with(&name)).count(),
            1,
            "{c}: {name} recorded once"
        );
    }
    // The timed-out commands were stopped, not left running.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = std::process::Command::new("pgrep")
            .args(["-f", &format!("sleep {MIXED_SLEEP}")])
            .output()
            .expect("pgrep");
        if left.stdout.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{c}: timed-out remote commands still run: {}",
            String::from_utf8_lossy(&left.stdout)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn grouped_json_and_outdir_output() {
    let Some((_fx, d, home, cfg)) = many_hosts() else {
        return;
    };
    let c = ctx(&d, "skiff run -b / --json / --outdir");

    let out = skiff_run(&home, &cfg, &["-b", "node[001-030]", &mixed(MIXED_SLEEP)]).run();
    out.expect_code(1, &c);
    let expected = "---------------------\nnode[001-009,020-030]\n---------------------\nok\n\
                    ---------------\nnode[010-019]\n---------------\nfail\n";
    assert_eq!(out.stdout_str(), expected, "{c}\n{out}");

    let out = skiff_run(
        &home,
        &cfg,
        &[
            "--json",
            "-x",
            "node[003-200]",
            "node[001-005],node201",
            "echo out; echo err >&2; exit 4",
        ],
    )
    .run();
    out.expect_code(255, &c);
    let mut hosts = Vec::new();
    for line in out.stdout_str().lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("valid JSON line");
        hosts.push(v["host"].as_str().unwrap().to_string());
        if v["host"] == "node201" {
            assert!(v["exit_code"].is_null(), "{c}: {line}");
            assert_eq!(v["error"]["kind"], "unreachable", "{c}: {line}");
        } else {
            assert_eq!(v["exit_code"], 4, "{c}: {line}");
            assert_eq!(v["stdout"], "out\n", "{c}: {line}");
            assert_eq!(v["stderr"], "err\n", "{c}: {line}");
            assert!(v["error"].is_null(), "{c}: {line}");
            assert!(v["duration_ms"].as_f64().unwrap() > 0.0, "{c}: {line}");
        }
    }
    hosts.sort();
    assert_eq!(
        hosts,
        ["node001", "node002", "node201"],
        "{c}: -x applied\n{out}"
    );

    let dir = home.path().join("outdir");
    let out = skiff_run(
        &home,
        &cfg,
        &[
            "--outdir",
            dir.to_str().unwrap(),
            "-q",
            "node[001-003]",
            "echo from; echo e >&2",
        ],
    )
    .run();
    out.expect_code(0, &c);
    let mut err_lines: Vec<&str> = out.stderr.lines().collect();
    err_lines.sort();
    assert_eq!(
        err_lines,
        ["node001: e", "node002: e", "node003: e"],
        "{c}: -q leaves only the hosts' stderr\n{out}"
    );
    for n in 1..=3 {
        let o = std::fs::read_to_string(dir.join(format!("node00{n}.out"))).expect("out file");
        assert_eq!(o, "from\n", "{c}");
        let e = std::fs::read_to_string(dir.join(format!("node00{n}.err"))).expect("err file");
        assert_eq!(e, "e\n", "{c}");
    }
}

#[test]
fn bad_host_sets_are_refused_with_a_pointer() {
    let home = ClientHome::new();
    let cfg = home.path().join("empty_config");
    write_file(&cfg, "", 0o644);
    let out = skiff_run(&home, &cfg, &["web[1-", "true"]).run();
    out.expect_code(255, "unbalanced bracket");
    assert!(
        out.stderr.contains("web[1-") && out.stderr.contains('^'),
        "the error shows the set and points into it\n{out}"
    );
    let out = skiff_run(&home, &cfg, &["-x", "a[1-3]", "a[1-3]", "true"]).run();
    out.expect_code(255, "empty set");
    assert!(out.stderr.contains("empty"), "{out}");
    let out = skiff_run(&home, &cfg, &["@nosuchgroup", "true"]).run();
    out.expect_code(255, "unknown group");
    assert!(out.stderr.contains("nosuchgroup"), "{out}");
}

#[test]
fn groups_file_and_hosts_file() {
    let Some((_fx, d, home, cfg)) = many_hosts() else {
        return;
    };
    let c = ctx(&d, "groups and hosts files");
    let groups = home.path().join("config/skiff/groups");
    std::fs::create_dir_all(groups.parent().unwrap()).unwrap();
    write_file(
        &groups,
        "# racks\nweb: node[001-003]\ndb: node[010-011]\n",
        0o644,
    );
    let out = skiff_run(&home, &cfg, &["-q", "@web,@db", "echo hi"]).run();
    out.expect_code(0, &c);
    let stdout = out.stdout_str();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "node001: hi",
            "node002: hi",
            "node003: hi",
            "node010: hi",
            "node011: hi"
        ],
        "{c}\n{out}"
    );
    let list = home.path().join("hosts");
    write_file(
        &list,
        "# two hosts\nnode004\n\nnode[005]  # trailing comment\n",
        0o644,
    );
    let out = skiff_run(
        &home,
        &cfg,
        &["-q", "-f", list.to_str().unwrap(), "echo hi"],
    )
    .run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout_str().lines().count(), 2, "{c}\n{out}");
    write_file(&list, "node004\nnode[7-\n", 0o644);
    let out = skiff_run(&home, &cfg, &["-f", list.to_str().unwrap(), "echo hi"]).run();
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains(":2"),
        "{c}: names the file and line\n{out}"
    );
}

#[test]
fn fan_out_against_openssh_sshd() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let home = ClientHome::new();
    home.trust(sshd.port(), &fx.host_key);
    let mut text = String::new();
    for n in 1..=6 {
        text.push_str(&format!("Host h{n}\n  HostName 127.0.0.1\n"));
    }
    text.push_str(&format!(
        "Host *\n  Port {}\n  User {}\n  IdentityFile {}\n  StrictHostKeyChecking yes\n",
        sshd.port(),
        user(),
        fx.client_key.private.display()
    ));
    let cfg = home.path().join("ssh_config");
    write_file(&cfg, text, 0o644);
    let c = ctx(&sshd, "skiff run against sshd");
    // sshd's default MaxStartups (10:30:100) may drop bursts; stay below it.
    let out = skiff_run(
        &home,
        &cfg,
        &["-j", "5", "-b", "h[1-6]", "echo same; exit 2"],
    )
    .run();
    out.expect_code(2, &c);
    assert!(
        out.stdout_str().contains("h[1-6]\n---------------\nsame\n"),
        "{c}\n{out}"
    );
    assert!(
        out.stderr.lines().any(|l| l == "  exit 2 (6): h[1-6]"),
        "{c}\n{out}"
    );
}

/// `skiff run` through this test's own agent.
fn run_via_agent(ah: &AgentHome, config: &Path, args: &[&str]) -> Run {
    skiff_run(&ah.home, config, args)
        .env("SKIFF_AGENT", "on")
        .env("XDG_RUNTIME_DIR", ah.runtime.path())
        .env("XDG_STATE_HOME", ah.home.path().join("state"))
}

fn pooled_connections(ah: &AgentHome, port: u16) -> usize {
    let status = ah.agent_cmd(&["status"]).stdout_str();
    status
        .lines()
        .filter(|l| l.contains(&format!(":{port} ")))
        .count()
}

#[test]
fn fan_out_through_the_agent_reuses_warm_connections() {
    let Some((_fx, d, ah, cfg)) = many_hosts_with_agent() else {
        return;
    };
    let c = ctx(&d, "skiff run through the agent");

    let out = run_via_agent(
        &ah,
        &cfg,
        &[
            "-j",
            "40",
            "--timeout",
            "10",
            "node[001-100]",
            &mixed("32.5"),
        ],
    )
    .run();
    out.expect_code(124, &c);
    let stdout = out.stdout_str();
    for (host, line) in [("node001", "ok"), ("node015", "fail"), ("node100", "ok")] {
        assert!(
            stdout.lines().any(|l| l == format!("{host}: {line}")),
            "{c}: {host} {line}\n{}",
            errors(&out)
        );
    }
    assert!(
        out.stderr
            .lines()
            .any(|l| l == "  timeout (10): node[070-079]"),
        "{c}\n{}",
        errors(&out)
    );
    assert!(
        out.stderr.contains("node001: Warning: Permanently added"),
        "{c}: first-time keys are reported per host\n{}",
        errors(&out)
    );
    assert_eq!(ah.agent_pids().len(), 1, "{c}: it went through the agent");
    let before = pooled_connections(&ah, d.port());
    assert!(
        before >= 100,
        "{c}: the agent keeps the connections ({before})"
    );

    let out = run_via_agent(&ah, &cfg, &["--json", "node[001-100]", "echo hi"]).run();
    out.expect_code(0, &c);
    let lines: Vec<serde_json::Value> = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 100, "{c}\n{out}");
    assert!(
        lines
            .iter()
            .all(|v| v["exit_code"] == 0 && v["stdout"] == "hi\n"),
        "{c}\n{out}"
    );
    assert_eq!(
        pooled_connections(&ah, d.port()),
        before,
        "{c}: the second run used the warm connections"
    );
    assert!(
        !out.stderr.contains("Permanently added"),
        "{c}: nothing new to record\n{out}"
    );
}

#[test]
fn fan_out_reports_every_host_when_the_agent_dies() {
    let Some((_fx, d, ah, cfg)) = many_hosts_with_agent() else {
        return;
    };
    let c = ctx(&d, "agent killed during skiff run");
    let run = run_via_agent(&ah, &cfg, &["node[001-010]", "sleep 20; echo late"]);
    let handle = std::thread::spawn(move || run.run());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pooled_connections(&ah, d.port()) < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "{c}: connections never opened"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in ah.agent_pids() {
        // SAFETY: kill(2) on this test's agent.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let started = std::time::Instant::now();
    let out = handle.join().expect("thread");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{c}: skiff run must not wait for commands the agent can no longer report"
    );
    out.expect_code(255, &c);
    assert!(!out.stdout_str().contains("late"), "{c}\n{out}");
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("  protocol (10): node[001-010]")),
        "{c}: every host is accounted for\n{out}"
    );
    assert!(out.stderr.contains("agent went away"), "{c}\n{out}");
}

/// Identity files are read once per run, not once per host: a missing
/// `-i` file is reported once, and a key that needs a passphrase has it
/// asked for once, for every host (never under the user's BatchMode).
#[test]
fn a_run_reads_each_identity_file_once() {
    let Some((fx, d, home, cfg)) = many_hosts() else {
        return;
    };
    let c = ctx(&d, "identity files read once per run");
    let missing = home.path().join("no-such-key");
    let out = skiff_run(
        &home,
        &cfg,
        &["-i", missing.to_str().unwrap(), "node[001-040]", "echo hi"],
    )
    .run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout_str().lines().count(), 40, "{c}\n{out}");
    assert_eq!(
        out.stderr.matches("not accessible").count(),
        1,
        "{c}: the missing identity file is reported once\n{out}"
    );

    let cfg = write_config(home.path(), d.port(), &fx.encrypted_key, "accept-new");
    let marker = home.path().join("askpass-calls");
    let askpass = askpass_script(home.path(), PASSPHRASE, &marker);
    let out = skiff_run(&home, &cfg, &["-q", "-j", "8", "node[001-030]", "echo hi"])
        .askpass(&askpass)
        .run();
    out.expect_code(0, &c);
    assert_eq!(out.stdout_str().lines().count(), 30, "{c}\n{out}");
    let calls = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        calls.lines().count(),
        1,
        "{c}: one passphrase serves every host\n{calls}\n{out}"
    );
    assert!(calls.contains("client_encrypted"), "{c}: {calls}");

    // The user's BatchMode still forbids asking.
    std::fs::remove_file(&marker).unwrap();
    let out = skiff_run(
        &home,
        &cfg,
        &["-q", "-o", "BatchMode=yes", "node[001-010]", "echo hi"],
    )
    .askpass(&askpass)
    .run();
    out.expect_code(255, &c);
    assert_eq!(
        out.stderr.matches("BatchMode is on").count(),
        10,
        "{c}: every host says why\n{out}"
    );
    assert!(!marker.exists(), "{c}: BatchMode never prompts\n{out}");
}

/// Through the agent, which may not ask anyone anything, hosts that need a
/// key's passphrase are run directly afterwards, with the passphrase asked
/// for once.
#[test]
fn a_run_through_the_agent_asks_for_a_passphrase_once() {
    let Some((fx, d, ah, _)) = many_hosts_with_agent() else {
        return;
    };
    let c = ctx(&d, "passphrase through the agent");
    let cfg = write_config(ah.home.path(), d.port(), &fx.encrypted_key, "accept-new");
    let marker = ah.home.path().join("askpass-calls");
    let askpass = askpass_script(ah.home.path(), PASSPHRASE, &marker);
    let out = run_via_agent(&ah, &cfg, &["-j", "8", "node[001-020]", "echo hi"])
        .askpass(&askpass)
        .run();
    out.expect_code(0, &c);
    for n in 1..=20 {
        assert!(
            out.stdout_str()
                .lines()
                .any(|l| l == format!("node{n:03}: hi")),
            "{c}: node{n:03}\n{out}"
        );
    }
    assert!(
        out.stderr.contains("ok (20): node[001-020]"),
        "{c}: the summary counts each host once\n{out}"
    );
    let calls = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(calls.lines().count(), 1, "{c}: asked once\n{calls}\n{out}");
    assert!(
        !ah.agent_pids().is_empty(),
        "{c}: the run did go through the agent\n{out}"
    );
}

/// A fan-out asks no host-key questions: under StrictHostKeyChecking ask,
/// an unknown host key is refused for each host without a prompt.
#[test]
fn a_run_asks_no_host_key_questions() {
    let Some((fx, d, home, _)) = many_hosts() else {
        return;
    };
    let c = ctx(&d, "unknown host keys in a fan-out");
    let cfg = write_config(home.path(), d.port(), &fx.client_key, "ask");
    let out = skiff_run(&home, &cfg, &["-q", "node[001-005]", "echo hi"]).run();
    out.expect_code(255, &c);
    assert_eq!(
        out.stderr
            .matches("is not known and a fan-out asks no host-key questions")
            .count(),
        5,
        "{c}: every host says why\n{out}"
    );
    assert!(out.stdout_str().is_empty(), "{c}\n{out}");
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `--outdir`: hosts named `.`, `..` and `...` (through ssh_config `Host`
/// entries) get files of their own in DIR, none of them shared and nothing
/// outside DIR; a host name with a `/` (from a hosts file) is refused
/// before DIR is made.
#[test]
fn outdir_files_of_dot_hosts_stay_apart_and_inside() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let cfg = home.path().join("dots_config");
    write_file(
        &cfg,
        format!(
            "Host . .. ...\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n",
            d.port(),
            user(),
            fx.client_key.private.display()
        ),
        0o644,
    );
    let c = ctx(&d, "--outdir with hosts . .. ...");
    let parent = tempdir();
    let dir = parent.path().join("out");
    let out = skiff_run(
        &home,
        &cfg,
        &[
            "--outdir",
            dir.to_str().unwrap(),
            "-q",
            ".,..,...",
            "echo \"$SSH_CONNECTION\" | cut -d' ' -f2; echo e >&2",
        ],
    )
    .run();
    out.expect_code(0, &c);
    assert_eq!(entries(parent.path()), ["out"], "{c}: outside DIR\n{out}");
    assert_eq!(
        entries(&dir),
        [
            "%2E%2E.err",
            "%2E%2E.out",
            "%2E.err",
            "%2E.out",
            "....err",
            "....out"
        ],
        "{c}\n{out}"
    );
    for name in ["%2E", "%2E%2E", "..."] {
        let o = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
        assert!(o.ends_with('\n') && o.len() > 1, "{c}: {name}.out: {o:?}");
        let e = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap();
        assert_eq!(e, "e\n", "{c}: {name}.err");
    }

    let hosts = home.path().join("hosts");
    write_file(&hosts, "...\na/b\n", 0o644);
    let refused = parent.path().join("refused");
    let out = skiff_run(
        &home,
        &cfg,
        &[
            "--outdir",
            refused.to_str().unwrap(),
            "-f",
            hosts.to_str().unwrap(),
            "true",
        ],
    )
    .run();
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains("'/' is not allowed in a host name"),
        "{c}: the refusal says why\n{out}"
    );
    assert_eq!(entries(parent.path()), ["out"], "{c}: nothing made\n{out}");
}

/// How many connections skiffd dropped before authentication (MaxStartups).
fn dropped_for_max_startups(d: &Skiffd) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains("dropping connection") && l.contains("(MaxStartups)"))
        .count()
}

/// A skiffd that lets 10 connections authenticate at once drops the rest of
/// `-j 64` when it accepts them. Those drops are tried again after a short
/// pause, so every one of 200 hosts runs the command, directly and through
/// the agent.
#[test]
fn pre_authentication_drops_are_tried_again() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd_for_many_with(&fx, 10);
    let ah = AgentHome::new();
    let cfg = write_config(ah.home.path(), d.port(), &fx.client_key, "accept-new");
    let expect_all_ok = |out: &CmdOutput, c: &str| {
        let summary: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with("skiff run: ") || l.starts_with("  "))
            .collect();
        assert_eq!(
            summary,
            [
                "skiff run: 200 hosts: 200 ok, 0 failed, 0 with errors",
                "  ok (200): node[001-200]"
            ],
            "{c}\nexit code {}; first errors:\n{}",
            out.code,
            errors(out).lines().take(5).collect::<Vec<_>>().join("\n")
        );
        out.expect_code(0, c);
        let stdout = out.stdout_str();
        for n in 1..=HOSTS {
            let line = format!("node{n:03}: ok");
            assert!(stdout.lines().any(|l| l == line), "{c}: {line:?} missing");
        }
    };

    let c = ctx(&d, "skiff run -j 64 against MaxStartups 10");
    let out = skiff_run(&ah.home, &cfg, &["-j", "64", "node[001-200]", "echo ok"]).run();
    let direct_drops = dropped_for_max_startups(&d);
    expect_all_ok(&out, &c);
    assert!(
        direct_drops > 0,
        "{c}: skiffd dropped nothing, so nothing was tried again"
    );

    let c = ctx(
        &d,
        "skiff run -j 64 through the agent against MaxStartups 10",
    );
    let out = run_via_agent(&ah, &cfg, &["-j", "64", "node[001-200]", "echo ok"]).run();
    expect_all_ok(&out, &c);
    assert!(
        dropped_for_max_startups(&d) > direct_drops,
        "{c}: skiffd dropped none of the agent's connections"
    );
    assert_eq!(ah.agent_pids().len(), 1, "{c}: it went through the agent");
}

/// A server whose room for unauthenticated connections is always full, as
/// OpenSSH's sshd answers past MaxStartups: every connection is accepted,
/// told "Exceeded MaxStartups" and closed. Counts the connections.
struct AlwaysFull {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AlwaysFull {
    fn start() -> AlwaysFull {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, stopping) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut stream) = stream {
                    count.fetch_add(1, Ordering::SeqCst);
                    // The client's identification is read first, so that
                    // closing sends no reset that could overtake the words.
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut line = String::new();
                    let _ = std::io::BufRead::read_line(
                        &mut std::io::BufReader::new(&stream),
                        &mut line,
                    );
                    let _ = stream.write_all(b"Exceeded MaxStartups\r\n");
                }
            }
        });
        AlwaysFull {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    /// Connections accepted so far. Each one skiff made and saw closed
    /// was accepted first, so once skiff has exited the count is whole.
    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for AlwaysFull {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A host that still drops the connection before authentication after a
/// few tries is reported as `refused-busy`, apart from unreachable hosts,
/// with how many tries were made; `skiff exec` tries once, as ssh does.
#[test]
fn a_host_that_stays_busy_is_reported_refused_busy() {
    let full = AlwaysFull::start();
    let home = ClientHome::new();
    let cfg = home.path().join("ssh_config");
    write_file(
        &cfg,
        format!(
            "Host busy*\n  HostName 127.0.0.1\n  Port {}\n\
             Host nothing\n  HostName 127.0.1.1\n  Port {}\n\
             Host *\n  User nobody\n  IdentitiesOnly yes\n  BatchMode yes\n",
            full.port, full.port
        ),
        0o644,
    );
    let tries = skiff_engine::busy::PRE_AUTH_DROPS.tries as usize;

    let out = skiff_run(&home, &cfg, &["--json", "busy[1-2],nothing", "true"]).run();
    out.expect_code(255, "a busy host fails the run");
    let mut kinds = Vec::new();
    for line in out.stdout_str().lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let message = v["error"]["message"]
            .as_str()
            .expect("an error")
            .to_string();
        kinds.push((v["host"].to_string(), v["error"]["kind"].to_string()));
        if v["host"] != "nothing" {
            assert!(
                message.contains(
                    "closed the connection before authentication (\"Exceeded MaxStartups\")"
                ) && message.contains(&format!("tried {tries} times in ")),
                "{message}"
            );
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("\"busy1\"".to_string(), "\"refused-busy\"".to_string()),
            ("\"busy2\"".to_string(), "\"refused-busy\"".to_string()),
            ("\"nothing\"".to_string(), "\"unreachable\"".to_string()),
        ],
        "{out}"
    );
    assert!(
        out.stderr
            .lines()
            .any(|l| l == "  refused-busy (2): busy[1-2]"),
        "{out}"
    );
    assert_eq!(
        full.accepted(),
        2 * tries,
        "each busy host tried {tries} times"
    );

    let before = full.accepted();
    let out = SkiffExec::new(&home, "busy1")
        .config(&cfg)
        .cmd("true")
        .run();
    out.expect_code(255, "skiff exec to a busy host");
    assert!(
        out.stderr
            .contains("closed the connection before authentication")
            && !out.stderr.contains("tried"),
        "{out}"
    );
    assert_eq!(full.accepted() - before, 1, "skiff exec tries once");
}
