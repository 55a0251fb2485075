//! `skiff cp` against servers that lie (issue 19): the user's request bounds
//! the names, types and modes that may arrive, server text is made safe
//! before a terminal sees it, and a server that stops talking, or a path
//! that freezes, ends the copy instead of hanging it.
//!
//! The lying servers are real skiffd processes whose subsystems are test
//! peers (`tests/peers/`, built as examples of this package by `cargo test`):
//! `hostile_transfer` stands in for the data plane's transfer process and
//! `hostile_sftp` for the SFTP server (with `DataPlane no`, so `skiff cp`
//! takes SFTP); each is told its scenario on its command line. Frozen paths
//! run a real skiffd behind `tcp_relay`, one process carrying the SSH
//! connection and every data stream, which the test stops with SIGSTOP once
//! the copy's destination temporary exists.
//!
//! Every copy runs with a hard time limit, so a client that hangs fails its
//! test instead of blocking the run. Run as root (as CI does), the remote
//! side is the `skiff-test` account; local files belong to the test.

use std::fs::{self, File, FileTimes};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

/// The longest any copy here may take: a hang shows up as a failure.
const LIMIT: Duration = Duration::from_secs(60);

/// What the hostile peers claim as the modification time of what they send.
const CLAIMED_MTIME: i64 = 1_234_567_890;

/// A local directory's modification time before a copy into it.
const OLD_MTIME: i64 = 1_000_000_000;

/// Keepalive options that notice a silent server within a few seconds.
const FAST_ALIVE: [&str; 4] = ["-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=3"];

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------
// Test peers

/// The test peer `name` (built by `cargo test` as an example of this
/// package), at a path the test account can run.
fn peer(name: &str) -> PathBuf {
    account_test_peer(env!("CARGO_MANIFEST_DIR"), "skiff", name)
}

/// A skiffd with one of its subsystems played by a hostile test peer.
struct Hostile {
    fx: Fixture,
    skiffd: Skiffd,
    /// The peer's config line, for messages.
    config: String,
}

impl Hostile {
    /// skiffd with `hostile_transfer SCENARIO` as its data plane.
    fn data_plane(scenario: &str) -> Option<Hostile> {
        Self::start(|| {
            format!(
                "Subsystem transfer@skiff '{}' {scenario}\n",
                peer("hostile_transfer").display()
            )
        })
    }

    /// [`Self::data_plane`] for `scenario` with streams, then on the
    /// control channel alone (`channel:SCENARIO`); none when OpenSSH's
    /// tools are missing outside CI.
    fn data_planes(scenario: &str) -> Vec<Hostile> {
        [scenario.to_string(), format!("channel:{scenario}")]
            .iter()
            .filter_map(|s| Self::data_plane(s))
            .collect()
    }

    /// skiffd without the data plane, with `hostile_sftp SCENARIO` as its
    /// SFTP server.
    fn sftp(scenario: &str) -> Option<Hostile> {
        Self::start(|| {
            format!(
                "DataPlane no\nSubsystem sftp '{}' {scenario}\n",
                peer("hostile_sftp").display()
            )
        })
    }

    /// skiffd with the `config` text, or `None` when OpenSSH's tools are
    /// missing outside CI (see `require_openssh`).
    fn start(config: impl FnOnce() -> String) -> Option<Hostile> {
        if !require_openssh() {
            return None;
        }
        let config = config();
        let fx = Fixture::new();
        let skiffd = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config),
        );
        Some(Hostile { fx, skiffd, config })
    }

    /// `skiff cp ARGS` to this skiffd (no agent, a scratch HOME and
    /// known_hosts), bounded by [`LIMIT`].
    fn cp(&self, args: &[&str]) -> CmdOutput {
        let scratch = tempdir();
        let mut run = Run::new(skiff_bin())
            .env("HOME", scratch.path())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK");
        for a in cp_options(scratch.path(), &self.fx.client_key, self.skiffd.port()) {
            run = run.arg(a);
        }
        run.args(args).timeout(LIMIT).run()
    }

    fn ctx(&self, what: &str) -> String {
        ctx(&self.skiffd, &format!("{}{what}", self.config))
    }
}

/// `cp` and its hermetic options (no agent, known_hosts in `scratch`, host
/// keys accepted, `key`) to 127.0.0.1:`port`.
fn cp_options(scratch: &Path, key: &Key, port: u16) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = [
        "cp",
        "--no-agent",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "ConnectTimeout=10",
    ]
    .iter()
    .map(Into::into)
    .collect();
    v.push(
        format!(
            "-oUserKnownHostsFile={}",
            scratch.join("known_hosts").display()
        )
        .into(),
    );
    v.push("-i".into());
    v.push(key.private.clone().into());
    v.push("-P".into());
    v.push(port.to_string().into());
    v
}

/// `user@127.0.0.1:path`.
fn remote(path: &str) -> String {
    format!("{}@127.0.0.1:{path}", user())
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

// ---------------------------------------------------------------------------
// Checks

/// Paths under `dir` (at any depth) whose names hold skiff's temporary marker.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().contains(".skiff-") {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

fn assert_no_temporaries(dir: &Path, c: &str) {
    let left = temporaries(dir);
    assert!(left.is_empty(), "temporaries left behind: {left:?}\n{c}");
}

/// Everything under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            found.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Exit status `code` and every needle in stderr.
fn expect_failure(out: &CmdOutput, code: i32, needles: &[&str], c: &str) {
    expect_status(out, code, c);
    for n in needles {
        assert!(out.stderr.contains(n), "stderr should say {n:?}\n{c}");
    }
}

/// Exit status `code`. (`c` holds the output and the server's log.)
fn expect_status(out: &CmdOutput, code: i32, c: &str) {
    assert_eq!(out.code, code, "expected exit status {code}\n{c}");
}

/// No byte of server text steers the terminal: no ESC and no carriage
/// return reach stderr, and the escape sequence is shown spelled out.
fn expect_escaped(out: &CmdOutput, c: &str) {
    assert!(
        !out.stderr.contains('\x1b'),
        "an ESC byte reached stderr\n{c}"
    );
    assert!(
        !out.stderr.contains('\r'),
        "a carriage return reached stderr\n{c}"
    );
    assert!(
        !out.stdout.contains(&0x1b),
        "an ESC byte reached stdout\n{c}"
    );
    assert!(
        out.stderr.contains(r"\u{1b}[2K"),
        "stderr should show the escape sequence escaped (\\u{{1b}}[2K)\n{c}"
    );
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mode()
        & 0o7777
}

fn mtime_of(path: &Path) -> i64 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mtime()
}

fn set_mtime(path: &Path, secs: i64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64);
    File::open(path)
        .and_then(|f| f.set_times(FileTimes::new().set_modified(t).set_accessed(t)))
        .unwrap_or_else(|e| panic!("set times of {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// A directory that existed before the copy keeps its mode, and its
/// modification time is not the server's: either the old one or one the
/// kernel gave it when the copy added entries (never set by skiff).
fn expect_existing_dir_untouched(dir: &Path, copy_started: i64, c: &str) {
    let mode = mode_of(dir);
    assert_eq!(
        mode,
        0o700,
        "the existing directory {} was chmod'ed to {mode:o}\n{c}",
        dir.display()
    );
    let mtime = mtime_of(dir);
    assert!(
        mtime == OLD_MTIME || mtime >= copy_started,
        "the existing directory {} got mtime {mtime} (was {OLD_MTIME}, the server claims {CLAIMED_MTIME})\n{c}",
        dir.display()
    );
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        - 1
}

// ---------------------------------------------------------------------------
// Data plane: names, types and modes

/// Asked for `report.txt` without -r, the server also sends `.bashrc`, a
/// `.ssh` directory and `.ssh/authorized_keys`: the copy fails naming the
/// first stray entry, nothing stray is written, and the existing
/// authorized_keys keeps its content and mode.
#[test]
fn data_plane_refuses_files_that_were_not_asked_for() {
    for h in Hostile::data_planes("extra-files") {
        let dir = tempdir();
        let ssh = dir.path().join(".ssh");
        fs::create_dir(&ssh).unwrap();
        set_mode(&ssh, 0o700);
        let keys = ssh.join("authorized_keys");
        let mine = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMine mine@here\n";
        write_file(&keys, mine, 0o600);
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("extra-files\n{out}"));
        let mut wrong = Vec::new();
        if dir.path().join(".bashrc").exists() {
            wrong.push(".bashrc was written".to_string());
        }
        if fs::read_to_string(&keys).unwrap() != mine {
            wrong.push("authorized_keys was replaced".into());
        }
        for (path, mode) in [(&keys, 0o600), (&ssh, 0o700)] {
            if mode_of(path) != mode {
                wrong.push(format!("{} is now {:o}", path.display(), mode_of(path)));
            }
        }
        let left = temporaries(dir.path());
        if !left.is_empty() {
            wrong.push(format!("temporaries left: {left:?}"));
        }
        assert!(wrong.is_empty(), "{}\n{c}", wrong.join("; "));
        expect_failure(&out, 255, &[".bashrc", "not asked for"], &c);
    }
}

/// Asked for the file `report.txt`, the server announces a directory of
/// that name: refused, and nothing is created.
#[test]
fn data_plane_refuses_a_directory_for_a_file() {
    for h in Hostile::data_planes("dir-for-file") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("dir-for-file\n{out}"));
        assert_eq!(
            listing(dir.path()),
            Vec::<String>::new(),
            "something was created\n{c}"
        );
        expect_failure(&out, 255, &["not asked for"], &c);
    }
}

/// Asked for the tree `tree` with -r, the server adds `other/x` beside it:
/// refused, and `other` is not created.
#[test]
fn data_plane_refuses_entries_outside_the_tree() {
    for h in Hostile::data_planes("outside-tree") {
        let dir = tempdir();
        let out = h.cp(&["-r", &remote("tree"), s(dir.path())]);
        let c = h.ctx(&format!("outside-tree\n{out}"));
        assert!(
            !dir.path().join("other").exists(),
            "other/ was created\n{c}"
        );
        assert_no_temporaries(dir.path(), &c);
        expect_failure(&out, 255, &["not asked for"], &c);
    }
}

/// A file announced with mode 6755 (0o104755 in SFTP's attributes) arrives
/// without set-id bits: exactly 0755 with -p, and within 0777 without.
fn set_id_bits_dropped(h: &Hostile, what: &str) {
    for preserve in [false, true] {
        let dir = tempdir();
        let mut args = vec![];
        if preserve {
            args.push("-p");
        }
        let src = remote("report.txt");
        args.extend([src.as_str(), s(dir.path())]);
        let out = h.cp(&args);
        let c = h.ctx(&format!("{what}, -p {preserve}\n{out}"));
        expect_status(&out, 0, &c);
        let mode = mode_of(&dir.path().join("report.txt"));
        assert_eq!(mode & 0o7000, 0, "mode {mode:o}\n{c}");
        if preserve {
            assert_eq!(mode, 0o755, "mode {mode:o}\n{c}");
        }
    }
}

#[test]
fn data_plane_drops_set_id_bits_from_files() {
    for h in Hostile::data_planes("setuid") {
        set_id_bits_dropped(&h, "setuid");
    }
}

/// With -r, a directory announced with mode 1777 gets no sticky bit and
/// the 6755 file in it no set-id bits, with and without -p.
#[test]
fn data_plane_drops_set_id_and_sticky_bits_from_trees() {
    for h in Hostile::data_planes("setuid") {
        for preserve in [false, true] {
            let dir = tempdir();
            let mut args = vec!["-r"];
            if preserve {
                args.push("-p");
            }
            let src = remote("tree");
            args.extend([src.as_str(), s(dir.path())]);
            let out = h.cp(&args);
            let c = h.ctx(&format!("setuid tree, -p {preserve}\n{out}"));
            expect_status(&out, 0, &c);
            let tree = dir.path().join("tree");
            let dmode = mode_of(&tree);
            assert_eq!(dmode & 0o7000, 0, "directory mode {dmode:o}\n{c}");
            let fmode = mode_of(&tree.join("report.txt"));
            assert_eq!(fmode & 0o7000, 0, "file mode {fmode:o}\n{c}");
            if preserve {
                assert_eq!(fmode, 0o755, "file mode {fmode:o}\n{c}");
            }
        }
    }
}

/// `-r -p` into an existing `tree` (0700, old mtime): the server's mode
/// (0777) and time are not applied to it; the directory the copy creates
/// gets the server's 0750.
fn existing_directories_left_alone(h: &Hostile, what: &str) {
    let dir = tempdir();
    let tree = dir.path().join("tree");
    fs::create_dir(&tree).unwrap();
    set_mode(&tree, 0o700);
    set_mtime(&tree, OLD_MTIME);
    let started = now_secs();
    let out = h.cp(&["-r", "-p", &remote("tree"), s(dir.path())]);
    let c = h.ctx(&format!("{what}\n{out}"));
    expect_status(&out, 0, &c);
    expect_existing_dir_untouched(&tree, started, &c);
    let new = tree.join("new");
    assert!(new.is_dir(), "tree/new was not created\n{c}");
    assert_eq!(mode_of(&new), 0o750, "tree/new mode\n{c}");
    assert!(tree.join("top.txt").is_file(), "tree/top.txt\n{c}");
    assert!(new.join("inner.txt").is_file(), "tree/new/inner.txt\n{c}");
}

#[test]
fn data_plane_leaves_existing_directories_alone() {
    for h in Hostile::data_planes("chmod-existing") {
        existing_directories_left_alone(&h, "chmod-existing");
    }
}

// ---------------------------------------------------------------------------
// Data plane: ids, sizes, silence

/// Two entries with one id end the copy (instead of waiting forever for a
/// file that can never settle).
#[test]
fn data_plane_refuses_an_id_used_twice() {
    for h in Hostile::data_planes("duplicate-id") {
        let dir = tempdir();
        let out = h.cp(&[&remote("a"), &remote("b"), s(dir.path())]);
        let c = h.ctx(&format!("duplicate-id\n{out}"));
        expect_failure(&out, 255, &["twice"], &c);
        assert_no_temporaries(dir.path(), &c);
    }
}

/// A chunk past a file's announced size ends the copy; nothing is written.
#[test]
fn data_plane_refuses_bytes_past_the_announced_size() {
    for h in Hostile::data_planes("oversize") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("oversize\n{out}"));
        assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
        assert_no_temporaries(dir.path(), &c);
        expect_failure(&out, 255, &["past the announced size"], &c);
    }
}

/// Every stream ends and `Done` comes while a file still misses half its
/// bytes: the copy fails at once (not a hang); nothing is written.
#[test]
fn data_plane_fails_when_streams_end_before_a_file_is_complete() {
    for h in Hostile::data_planes("short-end") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("short-end\n{out}"));
        expect_failure(&out, 255, &["ended before"], &c);
        assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
        assert_no_temporaries(dir.path(), &c);
    }
}

/// Bytes of a file never announced end the copy, before the file asked
/// for lands; nothing is written.
#[test]
fn data_plane_refuses_bytes_of_a_file_never_announced() {
    for h in Hostile::data_planes("unannounced") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("unannounced\n{out}"));
        expect_failure(&out, 255, &["entry id 5", "announced"], &c);
        assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
        assert_no_temporaries(dir.path(), &c);
    }
}

/// A server that granted streams and sends a file's bytes on the control
/// channel all the same breaks the protocol: the copy ends, nothing is
/// written.
#[test]
fn data_plane_refuses_bytes_on_the_channel_beside_streams() {
    let Some(h) = Hostile::data_plane("data-with-streams") else {
        return;
    };
    let dir = tempdir();
    let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
    let c = h.ctx(&format!("data-with-streams\n{out}"));
    expect_failure(&out, 255, &["unexpected Data"], &c);
    assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
    assert_no_temporaries(dir.path(), &c);
}

/// A server that takes the streams and then says nothing, holding
/// everything open: with 1 s keepalives the copy gives up well within the
/// limit, saying it made no progress.
#[test]
fn data_plane_gives_up_on_a_silent_server() {
    let Some(h) = Hostile::data_plane("stall") else {
        return;
    };
    let dir = tempdir();
    let mut args = FAST_ALIVE.to_vec();
    let src = remote("report.txt");
    args.extend([src.as_str(), s(dir.path())]);
    let started = Instant::now();
    let out = h.cp(&args);
    let took = started.elapsed();
    let c = h.ctx(&format!("stall\n{out}"));
    expect_failure(&out, 255, &["no progress"], &c);
    assert!(took < Duration::from_secs(30), "took {took:?}\n{c}");
    assert_no_temporaries(dir.path(), &c);
}

/// A small upload goes on the channel alone and asks for no stream; a
/// server that hands it a stream token all the same is answering another
/// request, and the copy fails.
#[test]
fn data_plane_refuses_tokens_it_did_not_ask_for() {
    let Some(h) = Hostile::data_plane("tokens-for-inline") else {
        return;
    };
    let dir = tempdir();
    let src = dir.path().join("small");
    write_file(&src, "a small upload\n", 0o644);
    let out = h.cp(&[s(&src), &remote("dst")]);
    let c = h.ctx(&format!("tokens-for-inline\n{out}"));
    expect_failure(&out, 255, &["other terms"], &c);
}

// ---------------------------------------------------------------------------
// Data plane: server text on the terminal

/// A refusal whose reason steers the terminal is shown escaped.
#[test]
fn data_plane_escapes_a_refusal_reason() {
    let Some(h) = Hostile::data_plane("refused-escapes") else {
        return;
    };
    let dir = tempdir();
    let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
    let c = h.ctx(&format!("refused-escapes\n{out}"));
    expect_status(&out, 255, &c);
    expect_escaped(&out, &c);
}

/// A transfer-wide failure message that steers the terminal is shown
/// escaped.
#[test]
fn data_plane_escapes_a_failure_message() {
    for h in Hostile::data_planes("failed-escapes") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("failed-escapes\n{out}"));
        assert_ne!(out.code, 0, "a failure is not a success\n{c}");
        expect_escaped(&out, &c);
    }
}

/// An entry nobody asked for, whose name steers the terminal: refused,
/// named escaped, and not written.
#[test]
fn data_plane_escapes_a_stray_entry_name() {
    for h in Hostile::data_planes("name-escapes") {
        let dir = tempdir();
        let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
        let c = h.ctx(&format!("name-escapes\n{out}"));
        let stray: Vec<String> = listing(dir.path())
            .into_iter()
            .filter(|n| n.contains('\x1b'))
            .collect();
        assert!(stray.is_empty(), "written: {stray:?}\n{c}");
        assert_no_temporaries(dir.path(), &c);
        expect_failure(&out, 255, &["not asked for"], &c);
        expect_escaped(&out, &c);
    }
}

// ---------------------------------------------------------------------------
// SFTP

/// A directory listing that names `a` twice ends the copy.
#[test]
fn sftp_refuses_a_name_listed_twice() {
    let Some(h) = Hostile::sftp("dup-names") else {
        return;
    };
    let dir = tempdir();
    let out = h.cp(&["-r", &remote("tree"), s(dir.path())]);
    let c = h.ctx(&format!(
        "sftp dup-names\n{out}\nwritten: {:?}",
        listing(dir.path())
    ));
    expect_failure(&out, 255, &["twice"], &c);
    assert_no_temporaries(dir.path(), &c);
}

#[test]
fn sftp_drops_set_id_bits() {
    if let Some(h) = Hostile::sftp("setuid") {
        set_id_bits_dropped(&h, "sftp setuid");
    }
}

#[test]
fn sftp_leaves_existing_directories_alone() {
    if let Some(h) = Hostile::sftp("chmod-existing") {
        existing_directories_left_alone(&h, "sftp chmod-existing");
    }
}

/// A READ answer longer than the request ends the copy; nothing written.
#[test]
fn sftp_refuses_a_read_reply_longer_than_asked() {
    let Some(h) = Hostile::sftp("oversize-read") else {
        return;
    };
    let dir = tempdir();
    let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
    let c = h.ctx(&format!("sftp oversize-read\n{out}"));
    assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
    assert_no_temporaries(dir.path(), &c);
    expect_failure(&out, 255, &["more than"], &c);
}

/// A failure status whose message steers the terminal is shown escaped;
/// the file fails, the copy exits 1.
#[test]
fn sftp_escapes_status_messages() {
    let Some(h) = Hostile::sftp("escapes") else {
        return;
    };
    let dir = tempdir();
    let out = h.cp(&[&remote("report.txt"), s(dir.path())]);
    let c = h.ctx(&format!("sftp escapes\n{out}"));
    expect_status(&out, 1, &c);
    expect_escaped(&out, &c);
    assert!(!dir.path().join("report.txt").exists(), "file written\n{c}");
}

// ---------------------------------------------------------------------------
// Frozen paths

/// `tcp_relay` in front of a server: SIGCONT'ed and killed when dropped,
/// also when an assertion fails first.
struct Relay {
    child: Child,
    port: u16,
}

impl Relay {
    /// A relay to 127.0.0.1:`target` passing `rate` bytes a second.
    fn start(target: u16, rate: usize) -> Relay {
        let mut child = Command::new(peer("tcp_relay"))
            .arg(format!("127.0.0.1:{target}"))
            .arg(rate.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tcp_relay");
        let stdout = child.stdout.take().expect("relay stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        // The guard exists before anything can fail.
        let mut relay = Relay { child, port: 0 };
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .expect("tcp_relay prints its port");
        relay.port = line.trim().parse().expect("tcp_relay's port");
        relay
    }

    /// Stops the relay: every connection through it freezes, open.
    fn freeze(&self) {
        // SAFETY: kill(2) on the relay this test started (not yet reaped).
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
        assert_eq!(rc, 0, "SIGSTOP to tcp_relay");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the relay this test started (not yet reaped).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `skiff cp` running in the background, killed when dropped.
struct Background {
    child: Child,
    stderr: Arc<Mutex<Vec<u8>>>,
    label: String,
    _home: TempDir,
}

impl Background {
    fn start((mut cmd, label, home): (Command, String, TempDir)) -> Background {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start skiff cp");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Background {
            child,
            stderr,
            label,
            _home: home,
        }
    }

    /// What the copy printed so far, and its command line.
    fn describe(&self) -> String {
        format!(
            "{}\nstderr: {:?}",
            self.label,
            String::from_utf8_lossy(&self.stderr.lock().unwrap())
        )
    }

    /// The exit code if the process has ended.
    fn exit_code(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let st = self.child.try_wait().expect("wait for skiff")?;
        Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Size of the file a frozen copy moves, and the relay's rate: the copy
/// would take about ten seconds, so it is always mid-file when frozen.
const FROZEN_SIZE: usize = 200 * MIB;
const FROZEN_RATE: usize = 20 * MIB;

/// A real skiffd (client-alive checks every second; `extra` config)
/// behind a rate-limited relay.
fn frozen_setup(extra: &str) -> Option<(Fixture, Skiffd, Relay)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str("ClientAliveInterval 1\nClientAliveCountMax 3\n");
    config.push_str(extra);
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let relay = Relay::start(d.port(), FROZEN_RATE);
    Some((fx, d, relay))
}

/// `skiff cp ARGS` through the relay with 1 s keepalives: the command, a
/// label for messages, and its scratch HOME.
fn frozen_cp(fx: &Fixture, relay: &Relay, args: &[&str]) -> (Command, String, TempDir) {
    let scratch = tempdir();
    let mut cmd = Command::new(skiff_bin());
    cmd.env("HOME", scratch.path())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .args(cp_options(scratch.path(), &fx.client_key, relay.port))
        .args(FAST_ALIVE)
        .args(args);
    let label = format!("skiff cp via relay port {}: {}", relay.port, args.join(" "));
    (cmd, label, scratch)
}

/// Starts `cp`, waits (polling, bounded) for its destination temporary
/// to appear in `temp_dir`, and freezes the path at that moment.
fn start_and_freeze(
    relay: &Relay,
    cp: (Command, String, TempDir),
    temp_dir: &Path,
    c: &str,
) -> Background {
    let mut cp = Background::start(cp);
    let deadline = Instant::now() + LIMIT;
    while temporaries(temp_dir).is_empty() {
        if let Some(code) = cp.exit_code() {
            panic!(
                "the copy ended ({code}) before its temporary appeared in {}\n{}\n{c}",
                temp_dir.display(),
                cp.describe()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no temporary in {} within {LIMIT:?}\n{}\n{c}",
            temp_dir.display(),
            cp.describe()
        );
        thread::sleep(Duration::from_millis(10));
    }
    relay.freeze();
    cp
}

/// After the freeze: waits (bounded by [`LIMIT`], polling) until the copy
/// has ended and `server_dir`, when given, holds no temporary, and returns
/// every way that did not happen: still running, an exit status other than
/// 255, a temporary left on the server.
fn outcome_after_freeze(cp: &mut Background, server_dir: Option<&Path>) -> Vec<String> {
    let frozen = Instant::now();
    let deadline = frozen + LIMIT;
    let mut ended = None;
    loop {
        if ended.is_none() {
            ended = cp.exit_code().map(|code| (code, frozen.elapsed()));
        }
        let server_clean = server_dir.is_none_or(|d| temporaries(d).is_empty());
        if (ended.is_some() && server_clean) || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if let Some((code, after)) = ended {
        eprintln!("{}: exit {code}, {after:?} after the freeze", cp.label);
    }
    let mut wrong = Vec::new();
    match ended {
        None => wrong.push(format!(
            "skiff cp still running {LIMIT:?} after the path froze (a hang)"
        )),
        Some((255, _)) => {}
        Some((code, after)) => wrong.push(format!(
            "skiff cp exited {code} ({after:?} after the freeze), not 255"
        )),
    }
    if let Some(dir) = server_dir {
        let left = temporaries(dir);
        if !left.is_empty() {
            wrong.push(format!(
                "the server's temporaries are still there {LIMIT:?} after the freeze: {left:?}"
            ));
        }
    }
    wrong
}

/// Checks shared by the frozen copies: the file the copy would have
/// replaced is unchanged and no temporary is left in `local`.
fn frozen_leftovers(old: &Path, local: &Path, wrong: &mut Vec<String>) {
    let now = fs::read_to_string(old).unwrap_or_else(|e| format!("<{e}>"));
    if now != OLD_CONTENTS {
        wrong.push(format!("{} changed to {now:?}", old.display()));
    }
    let left = temporaries(local);
    if !left.is_empty() {
        wrong.push(format!("local temporaries left: {left:?}"));
    }
}

/// What the destination held before a frozen copy.
const OLD_CONTENTS: &str = "the old contents\n";

fn expect_nothing_wrong(wrong: &[String], cp: &Background, d: &Skiffd, c: &str) {
    assert!(
        wrong.is_empty(),
        "{c}: {}\n{}",
        wrong.join("; "),
        ctx(d, &cp.describe())
    );
}

/// Which way a frozen-path case copies, and over what.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Upload,
    Download,
}

#[derive(Clone, Copy, PartialEq)]
enum Plane {
    Data,
    Sftp,
}

/// A 200 MiB copy whose path freezes mid-file: skiff exits 255 in time, the
/// file it would replace is unchanged and no local temporary remains. Over
/// the data plane an upload's server side (which notices the dead client
/// within seconds) removes its temporary too; an SFTP server cannot know
/// its file is one, so that temporary stays.
fn frozen_case(way: Way, plane: Plane, c: &str) {
    let extra = match plane {
        Plane::Data => "",
        Plane::Sftp => "DataPlane no\n",
    };
    let Some((fx, d, relay)) = frozen_setup(extra) else {
        return;
    };
    let local = tempdir();
    let rdir = account_dir();
    let (from, to) = match way {
        Way::Upload => (local.path(), rdir.path()),
        Way::Download => (rdir.path(), local.path()),
    };
    let src = from.join("big.bin");
    random_file(&src, FROZEN_SIZE);
    let old = to.join("big.bin");
    write_file(&old, OLD_CONTENTS, 0o644);
    let (source, target) = match way {
        Way::Upload => (s(&src).to_string(), remote(s(rdir.path()))),
        Way::Download => (remote(s(&src)), s(local.path()).to_string()),
    };
    let cp = frozen_cp(&fx, &relay, &[&source, &target]);
    let mut cp = start_and_freeze(&relay, cp, to, c);
    let server_side = (way == Way::Upload && plane == Plane::Data).then_some(rdir.path());
    let mut wrong = outcome_after_freeze(&mut cp, server_side);
    frozen_leftovers(&old, local.path(), &mut wrong);
    let (used, name) = match plane {
        Plane::Data => ("mode aead", "the data plane"),
        Plane::Sftp => ("subsystem sftp", "SFTP"),
    };
    if !d.log().contains(used) {
        wrong.push(format!("the copy did not use {name}"));
    }
    expect_nothing_wrong(&wrong, &cp, &d, c);
}

#[test]
fn frozen_path_ends_a_data_plane_upload() {
    frozen_case(Way::Upload, Plane::Data, "frozen data-plane upload");
}

#[test]
fn frozen_path_ends_a_data_plane_download() {
    frozen_case(Way::Download, Plane::Data, "frozen data-plane download");
}

#[test]
fn frozen_path_ends_an_sftp_download() {
    frozen_case(Way::Download, Plane::Sftp, "frozen SFTP download");
}

#[test]
fn frozen_path_ends_an_sftp_upload() {
    frozen_case(Way::Upload, Plane::Sftp, "frozen SFTP upload");
}
