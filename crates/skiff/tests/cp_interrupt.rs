//! A `skiff cp` upload to a real OpenSSH `sshd` (over SFTP) that is
//! stopped by a signal, or whose file fails half-way, leaves no temporary
//! (`.NAME.skiff-XXXX`) in the target directory, and never touches the
//! file under the final name.
//!
//! Each test's sshd runs `Subsystem sftp WRAPPER`: a script that notes
//! each start, then feeds OpenSSH's `sftp-server` through a pacer (a perl
//! loop, ~30 MB/s per channel) that writes its own pid down, so that a
//! large upload is still running when the test sees its temporary appear
//! (polled, bounded) and signals skiff, and so that a test can freeze the
//! server's input (SIGSTOP on the pacers) to play a server that no longer
//! answers. Server and client share this machine, so the target directory
//! is looked at on disk.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

const MIB: u64 = 1024 * 1024;

/// Longest any wait here takes (a loaded machine is slow, not stuck).
const PATIENCE: Duration = Duration::from_secs(60);

/// Where each file a test uploads comes from: large and sparse (zeros are
/// read fast; the pacer keeps the upload going for many seconds).
const BIG: u64 = 2048 * MIB;

/// How the test's sftp-server is started.
enum Server {
    /// Fed through the pacer.
    Paced,
    /// Unpaced, with files limited to this many KiB (`ulimit -f`): a write
    /// beyond fails with an SFTP error, as on a full disk.
    FileLimit(u64),
}

/// A private sshd whose sftp subsystem is wrapped (see the top), a client
/// HOME that trusts it, and a scratch directory.
struct Env {
    fx: Fixture,
    sshd: Sshd,
    home: ClientHome,
    root: TempDir,
    /// One line per SFTP channel started.
    starts: PathBuf,
    /// The pacers' pids.
    pacers: PathBuf,
    /// Holds the wrapper, `starts` and `pacers`.
    _wrapping: TempDir,
}

impl Env {
    fn new(server: Server) -> Option<Env> {
        if !require_openssh() || !require_tool("perl", "perl-base") {
            return None;
        }
        let scripted = sshd_with_sftp_script(
            |dir, real| {
                let (starts, pacers) = (dir.join("starts"), dir.join("pacers"));
                write_file(&starts, "", 0o666);
                write_file(&pacers, "", 0o666);
                let run = match server {
                    // 64 KiB, then 2 ms: about 30 MB/s per channel.
                    Server::Paced => format!(
                        "perl -e 'open(my $p, \">>\", \"{}\") or die; print $p \"$$\\n\"; close $p; \
                         while (sysread(STDIN, my $b, 65536)) {{ syswrite(STDOUT, $b) or exit; \
                         select(undef, undef, undef, 0.002) }}' | '{real}' \"$@\"\n",
                        pacers.display()
                    ),
                    // In 1024-byte blocks (bash) or 512-byte ones (dash): either
                    // way well below the file sent. SIGXFSZ ignored, so the write
                    // fails rather than the server dying.
                    Server::FileLimit(kib) => format!(
                        "trap '' XFSZ\nulimit -f {kib}\nexec '{real}' \"$@\"\n",
                        kib = kib
                    ),
                };
                format!("echo started >> '{}'\n{run}", starts.display())
            },
            &[],
        )?;
        Some(Env {
            starts: scripted.dir.path().join("starts"),
            pacers: scripted.dir.path().join("pacers"),
            fx: scripted.fx,
            sshd: scripted.sshd,
            home: scripted.home,
            root: tempdir(),
            _wrapping: scripted.dir,
        })
    }

    /// SFTP channels started so far.
    fn channels(&self) -> usize {
        fs::read_to_string(&self.starts)
            .expect("read the starts")
            .lines()
            .count()
    }

    /// The pacers started so far.
    fn pacer_pids(&self) -> Vec<i32> {
        fs::read_to_string(&self.pacers)
            .expect("read the pacers")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sends `signal` to every pacer.
    fn signal_pacers(&self, signal: i32) {
        for pid in self.pacer_pids() {
            // SAFETY: kill(2) on a pid the pacer wrote down itself; the
            // pacers live until the test's sshd goes.
            unsafe { libc::kill(pid, signal) };
        }
    }

    fn source(&self, size: u64) -> PathBuf {
        sparse_source(self.root.path(), size)
    }

    fn remote_dir(&self, name: &str) -> PathBuf {
        remote_dir(self.root.path(), name)
    }

    fn old_file(&self, path: &Path) -> String {
        old_file(path)
    }

    fn remote(&self, path: &Path) -> String {
        remote(path)
    }

    /// `skiff cp -q ... ARGS` to this sshd (see [`spawn_cp`]).
    fn spawn_cp(&self, agent: Option<&AgentHome>, args: &[&str]) -> Running {
        spawn_cp(&self.home, self.sshd.port(), &self.fx, agent, args)
    }

    /// `skiff cp -q --no-agent ARGS`, run to its end.
    fn cp(&self, args: &[&str]) -> (Option<i32>, String) {
        self.spawn_cp(None, args).wait(PATIENCE, "skiff cp")
    }

    fn ctx(&self, what: &str) -> String {
        format!(
            "{}\nSFTP channels started: {}",
            ctx(&self.sshd, what),
            self.channels()
        )
    }
}

/// `skiff cp ... ARGS` to the server on `port` that trusts `fx`'s client
/// key (without the agent unless `agent` says where it lives), quiet (`-q`)
/// or with its progress bar.
fn cp_command(
    home: &ClientHome,
    port: u16,
    fx: &Fixture,
    agent: Option<&AgentHome>,
    quiet: bool,
    args: &[&str],
) -> Command {
    let mut cmd = Command::new(skiff_bin());
    match agent {
        Some(ah) => cmd
            .env("SKIFF_AGENT", "on")
            .env("XDG_RUNTIME_DIR", ah.runtime.path())
            .env("XDG_STATE_HOME", ah.home.path().join("state")),
        None => cmd.env("SKIFF_AGENT", "off"),
    };
    cmd.env_remove("SSH_AUTH_SOCK")
        .env_remove("SSH_ASKPASS")
        .env_remove("DISPLAY")
        .env("HOME", home.path())
        .arg("cp")
        .args(quiet.then_some("-q"))
        .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
        .arg(port.to_string())
        .arg("-i")
        .arg(&fx.client_key.private)
        .args(args);
    cmd
}

/// `skiff cp -q ... ARGS` (see [`cp_command`]), started.
fn spawn_cp(
    home: &ClientHome,
    port: u16,
    fx: &Fixture,
    agent: Option<&AgentHome>,
    args: &[&str],
) -> Running {
    let child = cp_command(home, port, fx, agent, true, args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff cp");
    Running::new(child)
}

/// A running `skiff`, its stderr gathered by a thread; killed and reaped
/// on drop.
struct Running {
    child: Child,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Running {
    fn new(mut child: Child) -> Running {
        let mut pipe = child.stderr.take().expect("stderr piped");
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        });
        Running {
            child,
            stderr: Some(stderr),
        }
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Its exit code (`None`: killed by a signal) and stderr, waiting at
    /// most `limit`.
    fn wait(mut self, limit: Duration, what: &str) -> (Option<i32>, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "{what}: skiff did not end");
            thread::sleep(Duration::from_millis(10));
        };
        let stderr = self.stderr.take().map(|t| t.join().unwrap_or_default());
        (status.code(), stderr.unwrap_or_default())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sparse source file of `size` bytes in `root/src`.
fn sparse_source(root: &Path, size: u64) -> PathBuf {
    let dir = root.join("src");
    fs::create_dir_all(&dir).expect("mkdir src");
    let path = dir.join("big");
    fs::File::create(&path)
        .and_then(|f| f.set_len(size))
        .expect("make the source");
    path
}

/// A fresh directory `root/name` the remote account owns.
fn remote_dir(root: &Path, name: &str) -> PathBuf {
    let p = root.join(name);
    fs::create_dir_all(&p).expect("mkdir remote");
    let acct = account();
    std::os::unix::fs::chown(&p, Some(acct.uid), Some(acct.gid)).expect("chown remote dir");
    p
}

/// A file the remote account owns, with random contents; their sum.
fn old_file(path: &Path) -> String {
    let sum = random_file(path, 64 * 1024);
    let acct = account();
    std::os::unix::fs::chown(path, Some(acct.uid), Some(acct.gid)).expect("chown old file");
    sum
}

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// The names in `dir` that hold skiff's temporary marker.
fn temporaries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.') && n.contains(".skiff-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (bounded) until `ready` holds while skiff still runs.
fn wait_for(skiff: &mut Running, c: &str, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ready() {
        assert!(skiff.is_running(), "{c}: skiff ended before {what}");
        assert!(Instant::now() < deadline, "{c}: no {what} in {PATIENCE:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// What an upload into `dir` is stopped at, and how.
struct Stop<'a> {
    env: &'a Env,
    dir: PathBuf,
    /// Through this agent (else `--no-agent`).
    agent: Option<&'a AgentHome>,
    /// `--streams`, if given.
    streams: Option<&'a str>,
    /// Wait until this many SFTP channels have started.
    channels: usize,
    /// The target's host as a node set of one (`127.0.0.[1]`).
    node_set: bool,
}

impl Stop<'_> {
    /// Starts `skiff cp BIG DIR/big`, waits until its temporary is in DIR
    /// (and the channels asked for are open), sends SIGINT and waits for
    /// skiff to end; its exit code and stderr.
    fn run(&self, c: &str) -> (Option<i32>, String) {
        let source = self.env.source(BIG);
        let mut target = self.env.remote(&self.dir.join("big"));
        if self.node_set {
            target = target.replacen("@127.0.0.1:", "@127.0.0.[1]:", 1);
        }
        let mut args: Vec<&str> = Vec::new();
        if let Some(n) = self.streams {
            args.extend(["--streams", n]);
        }
        args.extend([s(&source), &target]);
        let mut skiff = self.env.spawn_cp(self.agent, &args);
        wait_for(&mut skiff, c, "temporary", || {
            !temporaries(&self.dir).is_empty()
        });
        wait_for(&mut skiff, c, "channels", || {
            self.env.channels() >= self.channels
        });
        skiff.signal(libc::SIGINT);
        skiff.wait(PATIENCE, c)
    }
}

/// Checks what an interrupted upload into `dir` left: exit 130 with the
/// line saying so, no temporary, and `dir/big` as before (`old`: its sum,
/// `None`: absent).
fn check_stopped(dir: &Path, outcome: &(Option<i32>, String), old: Option<&str>, c: &str) {
    let (code, stderr) = outcome;
    assert_eq!(*code, Some(130), "{c}: exit status\n{stderr}");
    assert!(
        stderr.contains("interrupted"),
        "{c}: says it was interrupted\n{stderr}"
    );
    assert!(
        !stderr.contains("temporary not removed"),
        "{c}: every temporary was removable\n{stderr}"
    );
    let left = temporaries(dir);
    assert!(left.is_empty(), "{c}: temporaries left: {left:?}\n{stderr}");
    let target = dir.join("big");
    match old {
        Some(sum) => assert_eq!(&sha256(&target), sum, "{c}: the old file was touched"),
        None => assert!(!target.exists(), "{c}: a file under the final name"),
    }
}

/// `--no-agent`, one channel: the temporary goes, the old file stays.
#[test]
fn an_interrupted_upload_removes_its_temporary() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("one");
    let old = env.old_file(&dir.join("big"));
    let stop = Stop {
        env: &env,
        dir: dir.clone(),
        agent: None,
        streams: Some("1"),
        channels: 1,
        node_set: false,
    };
    let c = env.ctx("SIGINT during a one-channel upload");
    let outcome = stop.run(&c);
    check_stopped(&dir, &outcome, Some(&old), &env.ctx(&c));
    assert_eq!(env.channels(), 1, "{}", env.ctx("--streams 1"));
}

/// `--no-agent`, a file written through several channels at once.
#[test]
fn an_interrupted_upload_over_several_channels_removes_its_temporary() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("several");
    let stop = Stop {
        env: &env,
        dir: dir.clone(),
        agent: None,
        streams: None,
        channels: 3,
        node_set: false,
    };
    let c = env.ctx("SIGINT during an upload over several channels");
    let outcome = stop.run(&c);
    check_stopped(&dir, &outcome, None, &env.ctx(&c));
}

/// Through the agent (its channels, several of them), the same.
#[test]
fn an_interrupted_upload_through_the_agent_removes_its_temporary() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let ah = AgentHome::new();
    let dir = env.remote_dir("agent");
    let old = env.old_file(&dir.join("big"));
    let stop = Stop {
        env: &env,
        dir: dir.clone(),
        agent: Some(&ah),
        streams: None,
        channels: 3,
        node_set: false,
    };
    let c = env.ctx("SIGINT during an upload through the agent");
    let outcome = stop.run(&c);
    let c = env.ctx(&c);
    check_stopped(&dir, &outcome, Some(&old), &c);
    assert_eq!(ah.agent_pids().len(), 1, "{c}: the agent carried the copy");
    assert_eq!(
        env.sshd.log().matches("Accepted publickey for").count(),
        1,
        "{c}: one connection, the agent's"
    );
}

/// A server that no longer reads (its input frozen) keeps the user
/// waiting no longer than skiff's short limit: skiff ends, names the
/// temporary it could not remove, and the old file is untouched.
#[test]
fn a_server_that_does_not_answer_does_not_hold_the_stop() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("frozen");
    let old = env.old_file(&dir.join("big"));
    let source = env.source(BIG);
    let target = env.remote(&dir.join("big"));
    let c = env.ctx("SIGINT with the server's input frozen");
    let mut skiff = env.spawn_cp(None, &["--streams", "1", s(&source), &target]);
    wait_for(&mut skiff, &c, "temporary", || {
        !temporaries(&dir).is_empty()
    });
    env.signal_pacers(libc::SIGSTOP);
    let stopped = Instant::now();
    skiff.signal(libc::SIGINT);
    let (code, stderr) = skiff.wait(PATIENCE, &c);
    let took = stopped.elapsed();
    // Looked at while the server is still frozen: the close and remove
    // skiff sent may sit in the pipe to the stopped pacer, and go through
    // once it runs again (skiff gone by then, as a slow server would do).
    let left = temporaries(&dir);
    let old_now = sha256(&dir.join("big"));
    env.signal_pacers(libc::SIGCONT);
    let c = env.ctx(&c);
    assert_eq!(code, Some(130), "{c}: exit status\n{stderr}");
    // The limit is 2.5 s; a loaded machine gets slack, but nowhere near
    // the 300 s an SFTP request may otherwise wait.
    assert!(took < Duration::from_secs(15), "{c}: took {took:?}");
    assert_eq!(left.len(), 1, "{c}: {left:?}");
    assert!(
        stderr.contains("temporary not removed") && stderr.contains(&left[0]),
        "{c}: names the temporary left\n{stderr}"
    );
    assert_eq!(old_now, old, "{c}: the old file was touched");
}

/// A second SIGINT while skiff waits for a server that does not answer
/// ends the wait at once, saying how many temporaries were left. (The
/// signal is sent again and again until skiff ends: the first may come
/// before skiff listens for another.)
#[test]
fn a_second_interrupt_does_not_wait_for_the_server() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("twice");
    let source = env.source(BIG);
    let target = env.remote(&dir.join("big"));
    let c = env.ctx("two SIGINTs with the server's input frozen");
    let mut skiff = env.spawn_cp(None, &["--streams", "1", s(&source), &target]);
    wait_for(&mut skiff, &c, "temporary", || {
        !temporaries(&dir).is_empty()
    });
    env.signal_pacers(libc::SIGSTOP);
    let deadline = Instant::now() + PATIENCE;
    while skiff.is_running() {
        assert!(Instant::now() < deadline, "{c}: skiff did not end");
        skiff.signal(libc::SIGINT);
        thread::sleep(Duration::from_millis(20));
    }
    let (code, stderr) = skiff.wait(PATIENCE, &c);
    env.signal_pacers(libc::SIGCONT);
    let c = env.ctx(&c);
    assert_eq!(code, Some(130), "{c}: exit status\n{stderr}");
    assert!(
        stderr.contains("interrupted again; 1 temporary file(s) left on the server"),
        "{c}: says what it did not wait for\n{stderr}"
    );
}

/// A file whose upload fails half-way (the server's write fails) removes
/// its temporary, and the copy says which file failed (exit 1).
#[test]
fn a_failed_upload_removes_its_temporary() {
    let Some(env) = Env::new(Server::FileLimit(4096)) else {
        return;
    };
    let source = env.source(32 * MIB);
    for (name, streams) in [("one", "1"), ("several", "8")] {
        let dir = env.remote_dir(name);
        let old = env.old_file(&dir.join("big"));
        let fresh = dir.join("fresh");
        let c = env.ctx(&format!("{name}: upload past the server's file limit"));
        for (target, before) in [(dir.join("big"), Some(old.as_str())), (fresh, None)] {
            let (code, stderr) = env.cp(&["--streams", streams, s(&source), &env.remote(&target)]);
            assert_eq!(code, Some(1), "{c}: exit status\n{stderr}");
            assert!(stderr.contains(s(&target)), "{c}: names the file\n{stderr}");
            let left = temporaries(&dir);
            assert!(left.is_empty(), "{c}: temporaries left: {left:?}");
            match before {
                Some(sum) => assert_eq!(sha256(&target), sum, "{c}: the old file was touched"),
                None => assert!(!target.exists(), "{c}: a partial file"),
            }
        }
    }
}

/// An upload to a node set (of one host, `--no-agent`): each host's copy
/// holds its own connection, and its temporaries go all the same.
#[test]
fn an_interrupted_upload_to_a_node_set_removes_its_temporary() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("set");
    let old = env.old_file(&dir.join("big"));
    let stop = Stop {
        env: &env,
        dir: dir.clone(),
        agent: None,
        streams: None,
        channels: 3,
        node_set: true,
    };
    let c = env.ctx("SIGINT during an upload to a node set");
    let outcome = stop.run(&c);
    check_stopped(&dir, &outcome, Some(&old), &env.ctx(&c));
}

/// An upload to skiffd stopped by SIGINT: over the data plane (`plane`)
/// skiffd's transfer process writes the temporary, sees the client leave
/// and removes it itself (soon after: polled); over SFTP (`DataPlane no`)
/// skiff removes it, as with sshd.
fn interrupt_an_upload_to_skiffd(plane: bool) {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str(&sftp_subsystem_config().unwrap_or_default());
    if !plane {
        config.push_str("DataPlane no\n");
    }
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if !config.is_empty() {
        opts = opts.config(&config);
    }
    let d = Skiffd::start_with(opts);
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let root = tempdir();
    let dir = remote_dir(root.path(), "skiffd");
    let old = old_file(&dir.join("big"));
    // Sparse: read fast, but still seconds of copying at loopback speed.
    let source = sparse_source(root.path(), 4 * BIG);
    let target = remote(&dir.join("big"));
    let how = if plane { "the data plane" } else { "SFTP" };
    let c = ctx(&d, &format!("SIGINT during an upload to skiffd over {how}"));
    let mut skiff = spawn_cp(&home, d.port(), &fx, None, &[s(&source), &target]);
    wait_for(&mut skiff, &c, "temporary", || {
        !temporaries(&dir).is_empty()
    });
    skiff.signal(libc::SIGINT);
    let (code, stderr) = skiff.wait(PATIENCE, &c);
    let c = ctx(&d, &c);
    assert_eq!(code, Some(130), "{c}: exit status\n{stderr}");
    let log = d.log();
    let used = if plane { "mode aead" } else { "subsystem sftp" };
    assert!(log.contains(used), "{c}: used {how}");
    if plane {
        let deadline = Instant::now() + PATIENCE;
        while !temporaries(&dir).is_empty() {
            let left = temporaries(&dir);
            assert!(Instant::now() < deadline, "{c}: skiffd kept {left:?}");
            thread::sleep(Duration::from_millis(20));
        }
    } else {
        let left = temporaries(&dir);
        assert!(left.is_empty(), "{c}: temporaries left: {left:?}\n{stderr}");
    }
    assert_eq!(
        sha256(&dir.join("big")),
        old,
        "{c}: the old file was touched"
    );
}

#[test]
fn an_interrupted_data_plane_upload_leaves_no_temporary_on_skiffd() {
    interrupt_an_upload_to_skiffd(true);
}

#[test]
fn an_interrupted_sftp_upload_to_skiffd_removes_its_temporary() {
    interrupt_an_upload_to_skiffd(false);
}

/// On a terminal, an interrupted copy takes its progress bar away before it
/// says so: "skiff: interrupted" starts its own line, with no bar drawn
/// before it on that line.
#[test]
fn an_interrupted_copy_on_a_terminal_clears_its_progress_bar() {
    let Some(env) = Env::new(Server::Paced) else {
        return;
    };
    let dir = env.remote_dir("terminal");
    let source = env.source(BIG);
    let target = env.remote(&dir.join("big"));
    let mut cmd = cp_command(
        &env.home,
        env.sshd.port(),
        &env.fx,
        None,
        false,
        &["--streams", "1", s(&source), &target],
    );
    cmd.env("TERM", "xterm");
    let mut term = OnTerminal::spawn(cmd);
    let c = env.ctx("SIGINT during an upload on a terminal");
    // The bar is drawn, and the upload is under way.
    term.wait_for("ETA", PATIENCE);
    let deadline = Instant::now() + PATIENCE;
    while temporaries(&dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{c}: no temporary\n{:?}",
            term.output()
        );
        thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on the test's own child, not yet reaped.
    unsafe { libc::kill(term.pid(), libc::SIGINT) };
    let status = term.wait(PATIENCE);
    let shown = term.output();
    assert_eq!(status.code(), Some(130), "{c}\n{shown:?}");
    let said = shown
        .find("skiff: interrupted")
        .unwrap_or_else(|| panic!("{c}: says it was interrupted\n{shown:?}"));
    // What is on that line before it: the terminal's line starts after the
    // last carriage return or newline, and a cleared line is erased (ESC [2K).
    let line_start = shown[..said].rfind(['\r', '\n']).map_or(0, |i| i + 1);
    let on_its_line = &shown[line_start..said];
    assert!(
        on_its_line.is_empty()
            || on_its_line
                .chars()
                .all(|ch| ch == '\u{1b}' || "[0123456789K".contains(ch)),
        "{c}: the bar is still on the line of the message: {on_its_line:?}\n{shown:?}"
    );
    let last_bar = shown[..said].rfind("ETA").expect("the bar was drawn");
    assert!(
        shown[last_bar..said].contains("\u{1b}[2K"),
        "{c}: the bar was not cleared before the message\n{shown:?}"
    );
    assert!(temporaries(&dir).is_empty(), "{c}: temporaries left");
}
