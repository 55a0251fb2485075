//! skiffd's memory for what clients send faster than commands read it:
//! bounded per connection (`MaxConnectionQueue`) and for the whole server
//! (`MaxServerQueue`), with stock OpenSSH clients paused and resumed
//! rather than cut off, a command that must write its output before it
//! reads more input never deadlocked, and a client that vanishes while its
//! connection is held noticed.
//!
//! Real skiffd, real clients: `ssh` (one connection, and sessions sharing a
//! ControlMaster connection), and the test peer `stdin_flood`
//! (`tests/peers/`, a russh client that opens many sessions on many
//! connections and writes input as fast as skiffd's windows allow).
//! Memory is skiffd's resident set from /proc; every wait is bounded, and
//! every session a test starts carries a marker in its command line so
//! that whatever is left of them is killed by process id when the test
//! ends.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::*;

const MIB: u64 = 1 << 20;

/// skiffd's defaults (see docs/skiffd-config.md).
const SERVER_BUDGET: u64 = 512 * MIB;
const CONNECTION_BUDGET: u64 = 128 * MIB;
/// What each connection may hold outside the server's budget.
const RESERVE: u64 = 256 << 10;
/// Room above the budgets for skiffd's own memory at these loads (a debug
/// build, hundreds of sessions, the allocator's slack): generous, and far
/// below what skiffd held before it had budgets.
const ALLOWANCE: u64 = 192 * MIB;
/// What skiffd may keep resident above its start once a flood has drained
/// and its sessions are gone (the allocator's free pages are given back;
/// what stays is fragments and skiffd's own growth).
const GIVEN_BACK_WITHIN: u64 = 96 * MIB;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// The session processes one test starts, found by a marker in their
/// command line (the account's `sh -c '...; echo MARKER'`, which leads the
/// session's process group); whatever is left of them is killed on drop.
struct Sessions {
    marker: String,
}

impl Sessions {
    fn new(tag: &str) -> Sessions {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Sessions {
            marker: format!("skiffd-memory-{tag}-{}-{nanos}", std::process::id()),
        }
    }

    /// `command`, marked.
    fn command(&self, command: &str) -> String {
        format!("{command}; echo {}", self.marker)
    }

    /// The account's processes whose command line carries the marker.
    fn pids(&self) -> Vec<i32> {
        let uid = account().uid;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let dir = PathBuf::from(format!("/proc/{pid}"));
                std::fs::metadata(&dir).is_ok_and(|m| m.uid() == uid)
                    && std::fs::read(dir.join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&self.marker))
            })
            .collect()
    }

    /// Waits (at most `within`) until none is left; how many are.
    fn wait_gone(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let left = self.pids().len();
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill(2) on the process group a marked session leads.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// The test peer `stdin_flood`, built as an example of this package.
fn flood_peer() -> PathBuf {
    test_peer(env!("CARGO_MANIFEST_DIR"), "skiff-server", "stdin_flood")
}

#[derive(Default)]
struct Progress {
    ready: bool,
    sent: u64,
    ended: bool,
    stderr: String,
}

/// A running `stdin_flood`: killed (its connections reset) on drop.
struct Flood {
    child: Child,
    progress: Arc<Mutex<Progress>>,
}

impl Flood {
    fn start(port: u16, key: &Key, connections: usize, sessions: usize, command: &str) -> Flood {
        let mut child = Command::new(flood_peer())
            .arg(format!("port={port}"))
            .arg(format!("user={}", user()))
            .arg(format!("key={}", key.private.display()))
            .arg(format!("connections={connections}"))
            .arg(format!("sessions={sessions}"))
            .arg(format!("command={command}"))
            .args(["flood=1", "linger0=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stdin_flood");
        let progress = Arc::new(Mutex::new(Progress::default()));
        let (out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let p = progress.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut p = p.lock().unwrap();
                if line.starts_with("ready ") {
                    p.ready = true;
                } else if let Some(n) = line.strip_prefix("sent ") {
                    p.sent = n.parse().unwrap_or(p.sent);
                }
            }
            p.lock().unwrap().ended = true;
        });
        let p = progress.clone();
        thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            p.lock().unwrap().stderr = text;
        });
        Flood { child, progress }
    }

    /// (ready, input sent so far, ended)
    fn state(&self) -> (bool, u64, bool) {
        let p = self.progress.lock().unwrap();
        (p.ready, p.sent, p.ended)
    }

    fn stderr(&self) -> String {
        self.progress.lock().unwrap().stderr.clone()
    }

    /// Kills the client: its connections are reset, as a crashed client's.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a flood did to skiffd.
struct Plateau {
    base: u64,
    peak: u64,
    sent: u64,
    took: Duration,
    /// Whether every session's command had started.
    ready: bool,
}

/// Waits until `flood`'s input stopped going in (no more for 3 s; a
/// server whose budget is full may hold back sessions not started yet), sampling skiffd's memory meanwhile; fails as soon
/// as skiffd's peak passes `bound`, or after `within`.
fn until_plateau(d: &Skiffd, flood: &Flood, base: u64, bound: u64, within: Duration) -> Plateau {
    let start = Instant::now();
    let (mut last_sent, mut since) = (0, Instant::now());
    loop {
        thread::sleep(Duration::from_millis(250));
        let (_, peak) = d.memory();
        let (ready, sent, ended) = flood.state();
        let c = server_context(d, "flooding skiffd");
        assert!(
            peak <= bound,
            "{c}\nskiffd's memory reached {} (started at {}, bound {}) with {} of input taken",
            mib(peak),
            mib(base),
            mib(bound),
            mib(sent)
        );
        assert!(!ended, "{c}\nstdin_flood ended: {}", flood.stderr());
        if sent != last_sent || sent == 0 {
            (last_sent, since) = (sent, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(3) {
            return Plateau {
                base,
                peak,
                sent,
                took: start.elapsed(),
                ready,
            };
        }
        assert!(
            start.elapsed() < within,
            "{c}\nthe input never stopped going in within {within:?}: {} taken, skiffd at {}",
            mib(sent),
            mib(peak)
        );
    }
}

/// 64 connections of 4 sessions each, every one writing to a command that
/// never reads: skiffd takes up to its server budget (plus each
/// connection's reserve) and then nothing more, and once the client is gone
/// every command is hung up. Before the budget each channel queued 64 MiB:
/// 16 GiB here.
#[test]
fn input_for_commands_that_never_read_stays_within_the_server_budget() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let sessions = Sessions::new("server");
    let (base, _) = d.memory();
    let bound = base + SERVER_BUDGET + 64 * RESERVE + ALLOWANCE;
    let mut flood = Flood::start(
        d.port(),
        &fx.client_key,
        64,
        4,
        &sessions.command("sleep 3600"),
    );
    let p = until_plateau(&d, &flood, base, bound, Duration::from_secs(300));
    eprintln!(
        "64 connections x 4 sessions: skiffd from {} to a peak of {} (bound {}), {} of input taken, plateau after {:?}, every command started: {}",
        mib(p.base),
        mib(p.peak),
        mib(bound),
        mib(p.sent),
        p.took,
        p.ready
    );
    assert!(
        p.sent >= SERVER_BUDGET / 2,
        "skiffd took only {} of input",
        mib(p.sent)
    );
    flood.kill();
    let left = sessions.wait_gone(Duration::from_secs(60));
    assert_eq!(
        left,
        0,
        "{}",
        server_context(&d, "session processes left after the client went")
    );
    // The flood drained: skiffd gives the memory back to the system rather
    // than keep its peak resident. Before, it stayed at the peak.
    let given_back = base + GIVEN_BACK_WITHIN;
    let deadline = Instant::now() + Duration::from_secs(60);
    let rss = loop {
        let (rss, _) = d.memory();
        if rss <= given_back || Instant::now() >= deadline {
            break rss;
        }
        thread::sleep(Duration::from_millis(250));
    };
    eprintln!(
        "after the flood: skiffd at {} (peak {})",
        mib(rss),
        mib(p.peak)
    );
    assert!(
        rss <= given_back,
        "{}",
        server_context(
            &d,
            &format!(
                "skiffd kept {} resident after the flood drained (peak {}, base {})",
                mib(rss),
                mib(p.peak),
                mib(base)
            )
        )
    );
}

/// One client whose 100 sessions' first windows alone (2 MiB each) are
/// more than its connection's budget: skiffd stops reading that connection
/// and, when the client vanishes meanwhile (its connection reset), notices
/// it without reading and hangs the commands up. Before, such a connection
/// stayed until its commands ended.
#[test]
fn a_client_that_vanishes_while_its_connection_is_held_is_noticed() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let sessions = Sessions::new("vanish");
    let (base, _) = d.memory();
    let bound = base + CONNECTION_BUDGET + ALLOWANCE;
    let mut flood = Flood::start(
        d.port(),
        &fx.client_key,
        1,
        100,
        &sessions.command("sleep 3600"),
    );
    let p = until_plateau(&d, &flood, base, bound, Duration::from_secs(180));
    eprintln!(
        "1 connection x 100 sessions: skiffd from {} to a peak of {}, {} of input taken",
        mib(p.base),
        mib(p.peak),
        mib(p.sent)
    );
    flood.kill();
    let left = sessions.wait_gone(Duration::from_secs(30));
    let c = server_context(&d, "a client reset while its connection was held");
    assert_eq!(left, 0, "{c}\n{left} session processes left");
    let log = d.log();
    assert!(
        log.contains("queue full") && log.contains("the client went away"),
        "{c}\nexpected the connection to have been held, then the client's leaving noticed"
    );
}

/// A command that writes its output before it reads more input (`gzip`),
/// fed faster than it reads: skiffd must keep passing the client's window
/// adjustments on while the input waits, or the command waits for its
/// output forever. Before the budget skiffd stopped reading the connection
/// once 64 MiB were queued, and this hung.
#[test]
fn a_command_that_writes_before_it_reads_more_is_not_deadlocked() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let dir = tempdir();
    let input = dir.path().join("random");
    let size = 192 * MIB as usize;
    random_file(&input, size);
    let c = server_context(&d, "ssh ... gzip -1 < 192 MiB");
    let out = ssh(d.port(), user(), &fx.client_key)
        .args(&["gzip -1"])
        .input(Input::File(input))
        .timeout(Duration::from_secs(240))
        .run();
    out.expect_code(0, &c);
    // Random bytes do not shrink: all of it came back, compressed.
    assert!(
        out.stdout.len() >= size && out.stdout.starts_with(&[0x1f, 0x8b]),
        "{c}\n{} bytes of output",
        out.stdout.len()
    );
}

/// Eight sessions multiplexed on one OpenSSH connection (ControlMaster),
/// each sending 40 MiB to a command that reads it only after 8 s: skiffd
/// holds no more than the connection's budget meanwhile (the client's
/// windows close), then every command reads all of its input. Before, each
/// channel queued all of its 40 MiB.
#[test]
fn openssh_sessions_on_one_connection_wait_within_its_budget_then_finish() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let dir = tempdir();
    let input = dir.path().join("input");
    let size = 40 * MIB as usize;
    random_file(&input, size);
    let control = dir.path().join("ctl");
    let control_opt = format!("ControlPath={}", control.display());
    let home = tempdir();
    let mut master = Command::new("ssh")
        .env("HOME", home.path())
        .env_remove("SSH_AUTH_SOCK")
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .args(["-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"])
        .arg(format!(
            "-oUserKnownHostsFile={}",
            home.path().join("known_hosts").display()
        ))
        .arg("-i")
        .arg(&fx.client_key.private)
        .args(["-M", "-N", "-o", &control_opt, "-p", &d.port().to_string()])
        .arg(format!("{}@127.0.0.1", user()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the ControlMaster");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !control.exists() {
        assert!(
            Instant::now() < deadline,
            "{}",
            server_context(&d, "the ControlMaster never connected")
        );
        assert!(
            master.try_wait().unwrap().is_none(),
            "the ControlMaster exited"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (base, _) = d.memory();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (port, key, input) = (d.port(), fx.client_key.clone(), input.clone());
            let opt = control_opt.clone();
            thread::spawn(move || {
                ssh(port, user(), &key)
                    .opt(&opt)
                    .opt("ControlMaster=no")
                    .args(&["sleep 8; wc -c"])
                    .input(Input::File(input))
                    .timeout(Duration::from_secs(240))
                    .run()
            })
        })
        .collect();
    let outs: Vec<CmdOutput> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    let (_, peak) = d.memory();
    let _ = master.kill();
    let _ = master.wait();
    let c = server_context(&d, "8 sessions on one ControlMaster connection");
    for out in &outs {
        out.expect_code(0, &c)
            .expect_stdout(&format!("{size}\n"), &c);
    }
    eprintln!(
        "8 x 40 MiB on one connection: skiffd from {} to a peak of {}",
        mib(base),
        mib(peak)
    );
    assert!(
        peak <= base + CONNECTION_BUDGET + ALLOWANCE / 3,
        "{c}\nskiffd's memory reached {} (from {}) for one connection",
        mib(peak),
        mib(base)
    );
}
