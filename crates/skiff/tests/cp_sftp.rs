//! `skiff cp` -> real OpenSSH `sshd` over SFTP.
//!
//! Every test starts its own private sshd (with `Subsystem sftp
//! internal-sftp`) on a free 127.0.0.1 port and runs the `skiff` binary
//! with a private HOME that trusts its host key. Server and client share
//! this machine, so the remote files are checked directly on disk:
//! contents (sha256), modes, mtimes, and that no `.skiff-` temporary is
//! left anywhere. Run as root (as CI does), the remote side is the
//! `skiff-test` account and its files live in directories it owns.

use std::fs::{self, File, FileTimes};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

const SSHD_EXTRA: &[&str] = &["Subsystem sftp internal-sftp"];

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// A private sshd, a client HOME that trusts it, and a scratch directory.
struct Env {
    fx: Fixture,
    sshd: Sshd,
    home: ClientHome,
    root: TempDir,
}

impl Env {
    fn new() -> Option<Env> {
        let (fx, sshd) = sshd_setup(SSHD_EXTRA)?;
        let home = ClientHome::new();
        home.trust(sshd.port(), &fx.host_key);
        Some(Env {
            fx,
            sshd,
            home,
            root: tempdir(),
        })
    }

    /// A fresh directory for the local side.
    fn local_dir(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        fs::create_dir_all(&p).expect("mkdir local");
        p
    }

    /// A fresh directory the remote account owns.
    fn remote_dir(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        fs::create_dir_all(&p).expect("mkdir remote");
        let acct = account();
        std::os::unix::fs::chown(&p, Some(acct.uid), Some(acct.gid)).expect("chown remote dir");
        p
    }

    /// `user@127.0.0.1:path`.
    fn remote(&self, path: &Path) -> String {
        format!("{}@127.0.0.1:{}", user(), path.display())
    }

    /// `skiff cp -F /dev/null -o BatchMode=yes -P PORT -i KEY ARGS...`.
    fn cp(&self, args: &[&str]) -> CmdOutput {
        self.cp_via(self.sshd.port(), args)
    }

    /// [`Env::cp`] to another port (a proxy in front of the sshd).
    fn cp_via(&self, port: u16, args: &[&str]) -> CmdOutput {
        Run::new(skiff_bin())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("DISPLAY")
            .env("HOME", self.home.path())
            .arg("cp")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
            .arg(port.to_string())
            .arg("-i")
            .arg(&self.fx.client_key.private)
            .args(args)
            .timeout(BULK_TIMEOUT)
            .run()
    }

    fn ctx(&self, what: &str) -> String {
        ctx(&self.sshd, what)
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// Every path under `dir` whose name holds skiff's temporary marker.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().contains(".skiff-") {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(temporaries(&path));
        }
    }
    found
}

fn assert_no_temporaries(dir: &Path, c: &str) {
    let left = temporaries(dir);
    assert!(left.is_empty(), "{c}: temporaries left behind: {left:?}");
}

fn set_mtime(path: &Path, secs: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    File::open(path)
        .and_then(|f| f.set_times(FileTimes::new().set_modified(t).set_accessed(t)))
        .unwrap_or_else(|e| panic!("set times of {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

const SIZES: [(&str, usize); 5] = [
    ("empty", 0),
    ("one", 1),
    ("mib_minus_1", MIB - 1),
    ("mib_plus_1", MIB + 1),
    ("twenty_mib", 20 * MIB),
];

/// Random files of 0 B, 1 B, 1 MiB ± 1 and 20 MiB go up and come back
/// byte-exact, several sources at once into a directory and one file under
/// a new name; modes without -p never gain bits; no temporary remains.
#[test]
fn upload_and_download_round_trips() {
    let Some(env) = Env::new() else { return };
    let src = env.local_dir("src");
    let up = env.remote_dir("up");
    let down = env.local_dir("down");
    let mut sums = Vec::new();
    let mut args: Vec<String> = Vec::new();
    for (i, (name, size)) in SIZES.iter().enumerate() {
        let p = src.join(name);
        sums.push(random_file(&p, *size));
        set_mode(&p, [0o644, 0o600, 0o640, 0o755, 0o444][i]);
        args.push(s(&p).to_string());
    }
    args.push(format!("{}/", env.remote(&up)));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = env.ctx("upload of five files into a directory");
    env.cp(&argv).expect_code(0, &c);
    for ((name, _), sum) in SIZES.iter().zip(&sums) {
        let remote = up.join(name);
        assert_eq!(&sha256(&remote), sum, "{c}: {name} differs after upload");
        let (from, to) = (file_mode(&src.join(name)), file_mode(&remote));
        assert_eq!(
            to & !from,
            0,
            "{c}: {name}: mode {to:o} has bits {from:o} lacks"
        );
        assert_eq!(
            fs::metadata(&remote).unwrap().uid(),
            account().uid,
            "{c}: {name} must belong to the remote account"
        );
    }
    assert_no_temporaries(&up, &c);

    // And back, several remote sources into a local directory.
    let mut args: Vec<String> = SIZES
        .iter()
        .map(|(name, _)| env.remote(&up.join(name)))
        .collect();
    args.push(s(&down).to_string());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = env.ctx("download of five files into a directory");
    env.cp(&argv).expect_code(0, &c);
    for ((name, _), sum) in SIZES.iter().zip(&sums) {
        assert_eq!(
            &sha256(&down.join(name)),
            sum,
            "{c}: {name} differs after download"
        );
    }
    assert_no_temporaries(&down, &c);

    // One file under a new name, each way, replacing an existing file.
    let renamed = up.join("renamed");
    fs::write(&renamed, b"old contents").unwrap();
    let c = env.ctx("upload under a new name");
    env.cp(&[s(&src.join("mib_plus_1")), &env.remote(&renamed)])
        .expect_code(0, &c);
    assert_eq!(sha256(&renamed), sums[3], "{c}");
    let back = down.join("back");
    let c = env.ctx("download under a new name");
    env.cp(&[&env.remote(&renamed), s(&back)])
        .expect_code(0, &c);
    assert_eq!(sha256(&back), sums[3], "{c}");
    assert_no_temporaries(&up, &c);
    assert_no_temporaries(&down, &c);
}

/// A file far larger than the 64 reads of 256 KiB a download starts with
/// arrives whole while its read window changes (copy/read_ahead.rs's
/// unit tests check how it changes; how far it grows here depends on the
/// machine's timing).
#[test]
fn a_large_download_arrives_whole() {
    let Some(env) = Env::new() else { return };
    let remote = env.remote_dir("big");
    let down = env.local_dir("down");
    let sum = random_file(&remote.join("big"), 48 * MIB);
    let c = env.ctx("download of one 48 MiB file");
    let out = env.cp(&["-v", &env.remote(&remote.join("big")), s(&down)]);
    out.expect_code(0, &c);
    assert_eq!(sha256(&down.join("big")), sum, "{c}");
    assert!(
        out.stderr.contains("reads of") && out.stderr.contains("outstanding"),
        "{c}: no read-ahead line in the log:\n{}",
        out.stderr
    );
    assert_no_temporaries(&down, &c);
}

/// A tree with `-r -p` keeps every mode and mtime both ways, including a
/// directory without write permission and a followed symlink; a
/// directory's mtime is set after its contents are written.
#[test]
fn tree_recursive_preserve() {
    let Some(env) = Env::new() else { return };
    let local = env.local_dir("local");
    let tree = local.join("tree");
    fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    fs::create_dir_all(tree.join("readonly")).unwrap();
    let files = [
        ("a.txt", 10 * KIB, 0o640),
        ("sub/run.sh", 3 * KIB, 0o750),
        ("sub/deeper/z", 300 * KIB + 7, 0o600),
        ("readonly/in", 5, 0o444),
        ("empty", 0, 0o604),
    ];
    let mut sums = Vec::new();
    for (i, (rel, size, mode)) in files.iter().enumerate() {
        let p = tree.join(rel);
        sums.push(random_file(&p, *size));
        set_mode(&p, *mode);
        set_mtime(&p, 1_000_000_000 + i as u64 * 86_400);
    }
    std::os::unix::fs::symlink("a.txt", tree.join("link")).unwrap();
    let dirs = [
        ("", 0o751, 1_100_000_000),
        ("sub", 0o700, 1_200_000_000),
        ("sub/deeper", 0o755, 1_300_000_000),
        ("readonly", 0o555, 1_400_000_000),
    ];
    // Deepest first: setting a child's time does not touch its parent's,
    // but creating the symlink above did.
    for (rel, mode, mtime) in dirs.iter().rev() {
        let p = tree.join(rel);
        set_mtime(&p, *mtime);
        set_mode(&p, *mode);
    }

    let remote = env.remote_dir("remote");
    let c = env.ctx("upload -r -p");
    env.cp(&["-r", "-p", s(&tree), &env.remote(&remote)])
        .expect_code(0, &c);
    let check = |root: &Path, c: &str| {
        for (i, (rel, _, mode)) in files.iter().enumerate() {
            let p = root.join(rel);
            assert_eq!(sha256(&p), sums[i], "{c}: {rel} contents");
            let meta = fs::metadata(&p).unwrap();
            assert_eq!(meta.mode() & 0o7777, *mode, "{c}: {rel} mode");
            assert_eq!(
                meta.mtime(),
                1_000_000_000 + i as i64 * 86_400,
                "{c}: {rel} mtime"
            );
        }
        // The symlink arrives as a copy of what it points to.
        let link = root.join("link");
        assert!(
            fs::symlink_metadata(&link).unwrap().is_file(),
            "{c}: link must be a regular file"
        );
        assert_eq!(sha256(&link), sums[0], "{c}: link contents");
        for (rel, mode, mtime) in dirs {
            let meta = fs::metadata(root.join(rel)).unwrap();
            assert!(meta.is_dir(), "{c}: {rel:?} must be a directory");
            assert_eq!(meta.mode() & 0o7777, mode, "{c}: dir {rel:?} mode");
            assert_eq!(meta.mtime(), mtime as i64, "{c}: dir {rel:?} mtime");
        }
    };
    check(&remote.join("tree"), &c);
    assert_no_temporaries(&remote, &c);

    // Back under a new name: the target does not exist, so it becomes the tree.
    let back = local.join("back");
    let c = env.ctx("download -r -p to a new name");
    env.cp(&["-r", "-p", &env.remote(&remote.join("tree")), s(&back)])
        .expect_code(0, &c);
    check(&back, &c);
    assert_no_temporaries(&local, &c);

    // Without -r a directory is refused, by name, and nothing is created.
    let c = env.ctx("directory without -r");
    let out = env.cp(&[&env.remote(&remote.join("tree")), s(&local.join("nor"))]);
    out.expect_code(1, &c);
    assert!(out.stderr.contains("is a directory"), "{c}\n{out}");
    assert!(!local.join("nor").exists(), "{c}");
    // Let the temp dir be cleaned up.
    set_mode(&remote.join("tree/readonly"), 0o755);
}

/// Several sources need an existing directory; the error names the target.
#[test]
fn several_sources_need_a_directory() {
    let Some(env) = Env::new() else { return };
    let src = env.local_dir("src");
    fs::write(src.join("a"), b"a").unwrap();
    fs::write(src.join("b"), b"b").unwrap();
    let remote = env.remote_dir("remote");
    let target = remote.join("nodir");
    let c = env.ctx("two sources to a missing directory");
    let out = env.cp(&[s(&src.join("a")), s(&src.join("b")), &env.remote(&target)]);
    out.expect_code(1, &c);
    assert!(out.stderr.contains("nodir"), "{c}\n{out}");
    assert!(!target.exists(), "{c}");

    let c = env.ctx("two remote sources to a local file");
    let local_file = src.join("a");
    let out = env.cp(&[
        &env.remote(&remote.join("x")),
        &env.remote(&remote.join("y")),
        s(&local_file),
    ]);
    out.expect_code(1, &c);
    assert!(out.stderr.contains("Not a directory"), "{c}\n{out}");
    assert_eq!(fs::read(&local_file).unwrap(), b"a", "{c}");
}

/// A missing source is reported by name, with exit 1, and the other
/// sources are still copied, both ways.
#[test]
fn missing_source_reported_others_copied() {
    let Some(env) = Env::new() else { return };
    let src = env.local_dir("src");
    let sum_a = random_file(&src.join("a"), 100 * KIB);
    let sum_b = random_file(&src.join("b"), 3);
    let missing = src.join("missing");
    let remote = env.remote_dir("remote");
    let c = env.ctx("upload with a missing source");
    let out = env.cp(&[
        s(&src.join("a")),
        s(&missing),
        s(&src.join("b")),
        &env.remote(&remote),
    ]);
    out.expect_code(1, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one failure line\n{out}");
    assert!(
        lines[0].starts_with("skiff: ") && lines[0].contains(s(&missing)),
        "{c}\n{out}"
    );
    assert!(lines[0].contains("No such file"), "{c}\n{out}");
    assert_eq!(sha256(&remote.join("a")), sum_a, "{c}");
    assert_eq!(sha256(&remote.join("b")), sum_b, "{c}");

    let down = env.local_dir("down");
    let c = env.ctx("download with a missing source");
    let out = env.cp(&[
        &env.remote(&remote.join("a")),
        &env.remote(&remote.join("missing")),
        &env.remote(&remote.join("b")),
        s(&down),
    ]);
    out.expect_code(1, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one failure line\n{out}");
    assert!(
        lines[0].starts_with("skiff: ")
            && lines[0].contains(&format!("{}/missing", remote.display())),
        "{c}\n{out}"
    );
    assert_eq!(sha256(&down.join("a")), sum_a, "{c}");
    assert_eq!(sha256(&down.join("b")), sum_b, "{c}");
    assert!(!down.join("missing").exists(), "{c}");
    assert_no_temporaries(&down, &c);
    assert_no_temporaries(&remote, &c);
}

/// A destination file the remote account may not replace fails alone
/// (exit 1, named), keeps its contents, leaves no temporary, and the other
/// files are copied; an unreadable remote source likewise on download.
#[test]
fn permission_denied_fails_alone() {
    let Some(env) = Env::new() else { return };
    let src = env.local_dir("src");
    let sum_x = random_file(&src.join("x"), 64 * KIB);
    random_file(&src.join("locked"), 2 * MIB);
    let sum_y = random_file(&src.join("y"), 1);

    // A directory everyone may write to, but where (sticky bit) only a
    // file's owner may replace it; `locked` belongs to someone else. As
    // another user than root, a file in a read-only directory does it.
    let remote = env.remote_dir("remote");
    let target = if is_root() {
        let d = env.local_dir("shared");
        set_mode(&d, 0o1777);
        d
    } else {
        remote.clone()
    };
    let locked = target.join("locked");
    fs::write(&locked, b"precious").unwrap();
    let upload_to = if is_root() {
        target.clone()
    } else {
        let ro = remote.join("ro");
        fs::create_dir(&ro).unwrap();
        fs::write(ro.join("locked"), b"precious").unwrap();
        set_mode(&ro, 0o555);
        ro
    };
    let c = env.ctx("upload over a file the account may not replace");
    let out = if is_root() {
        env.cp(&[
            s(&src.join("x")),
            s(&src.join("locked")),
            s(&src.join("y")),
            &env.remote(&upload_to),
        ])
    } else {
        env.cp(&[s(&src.join("locked")), &env.remote(&upload_to)])
    };
    out.expect_code(1, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one failure line\n{out}");
    assert!(
        lines[0].contains("locked") && lines[0].to_lowercase().contains("permission denied"),
        "{c}\n{out}"
    );
    assert_eq!(
        fs::read(upload_to.join("locked")).unwrap(),
        b"precious",
        "{c}"
    );
    if is_root() {
        assert_eq!(sha256(&target.join("x")), sum_x, "{c}");
        assert_eq!(sha256(&target.join("y")), sum_y, "{c}");
    }
    assert_no_temporaries(&upload_to, &c);

    // An unreadable remote source.
    fs::copy(src.join("x"), remote.join("x")).unwrap();
    fs::copy(src.join("y"), remote.join("y")).unwrap();
    let secret = remote.join("secret");
    fs::write(&secret, b"secret").unwrap();
    set_mode(&secret, 0o000);
    if !is_root() {
        // Owned by the account itself: mode 000 is enough.
    } else {
        std::os::unix::fs::chown(&secret, Some(0), Some(0)).unwrap();
    }
    let down = env.local_dir("down");
    let c = env.ctx("download with an unreadable source");
    let out = env.cp(&[
        &env.remote(&remote.join("x")),
        &env.remote(&secret),
        &env.remote(&remote.join("y")),
        s(&down),
    ]);
    out.expect_code(1, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one failure line\n{out}");
    assert!(
        lines[0].contains("secret") && lines[0].to_lowercase().contains("permission denied"),
        "{c}\n{out}"
    );
    assert_eq!(sha256(&down.join("x")), sum_x, "{c}");
    assert_eq!(sha256(&down.join("y")), sum_y, "{c}");
    assert!(!down.join("secret").exists(), "{c}");
    assert_no_temporaries(&down, &c);
    if !is_root() {
        set_mode(&upload_to, 0o755);
    }
}

/// Nothing listens: exit 255 and one line about connecting.
#[test]
fn connection_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let home = ClientHome::new();
    let dir = tempdir();
    let out = Run::new(skiff_bin())
        .env("SKIFF_AGENT", "off")
        .env("HOME", home.path())
        .args(["cp", "-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
        .arg(free_port().to_string())
        .arg("-i")
        .arg(&fx.client_key.private)
        .arg(format!("{}@127.0.0.1:x", user()))
        .arg(dir.path())
        .run();
    out.expect_skiff_failure(&["connect", "refused"], "connection refused");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing may be created"
    );
}

/// Two local paths, or two remote ones, are refused before connecting.
#[test]
fn local_to_local_and_remote_to_remote_are_refused() {
    let home = ClientHome::new();
    let run = |args: &[&str]| {
        Run::new(skiff_bin())
            .env("SKIFF_AGENT", "off")
            .env("HOME", home.path())
            .arg("cp")
            .args(args)
            .run()
    };
    let out = run(&["/etc/hostname", "/tmp/nowhere-skiff"]);
    out.expect_skiff_failure(&["use cp"], "local to local");
    let out = run(&["a@h1:x", "b@h2:y"]);
    out.expect_skiff_failure(&["remote"], "remote to remote");
}

/// A TCP proxy on 127.0.0.1 for one connection to `server_port`, which
/// cuts the connection (both ways) once `limit` bytes have gone in the
/// watched direction.
struct CuttingProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Server to client (a download).
    Down,
    /// Client to server (an upload).
    Up,
}

impl CuttingProxy {
    fn start(server_port: u16, watch: Watch, limit: u64) -> CuttingProxy {
        Self::start_paced(server_port, watch, limit, Duration::ZERO)
    }

    /// Like [`CuttingProxy::start`], pausing `pause` after every read in
    /// the watched direction (a slow link).
    fn start_paced(server_port: u16, watch: Watch, limit: u64, pause: Duration) -> CuttingProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking proxy");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cut_flag = cut.clone();
        let thread = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            let client = loop {
                match listener.accept() {
                    Ok((c, _)) => break c,
                    Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                    Err(_) => return,
                }
            };
            client.set_nonblocking(false).unwrap();
            let server =
                TcpStream::connect((Ipv4Addr::LOCALHOST, server_port)).expect("proxy connect");
            let pump = |mut from: TcpStream,
                        mut to: TcpStream,
                        limit: Option<u64>,
                        cut: Arc<AtomicBool>| {
                thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut total = 0u64;
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        total += n as u64;
                        if limit.is_some_and(|l| total > l) {
                            cut.store(true, Ordering::SeqCst);
                            break;
                        }
                        if limit.is_some() && !pause.is_zero() {
                            thread::sleep(pause);
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = from.shutdown(Shutdown::Both);
                    let _ = to.shutdown(Shutdown::Both);
                })
            };
            let (down_limit, up_limit) = match watch {
                Watch::Down => (Some(limit), None),
                Watch::Up => (None, Some(limit)),
            };
            let a = pump(
                server.try_clone().unwrap(),
                client.try_clone().unwrap(),
                down_limit,
                cut_flag.clone(),
            );
            let b = pump(client, server, up_limit, cut_flag);
            let _ = a.join();
            let _ = b.join();
        });
        CuttingProxy {
            port,
            cut,
            thread: Some(thread),
        }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        // The pumps end when either side closes; skiff has exited by now.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The connection drops in the middle of a transfer: exit 255 with one
/// line, and no file (truncated or not) appears under the final name; the
/// local side also keeps no temporary.
#[test]
fn connection_lost_mid_transfer() {
    let Some(env) = Env::new() else { return };
    let remote = env.remote_dir("remote");
    let big = remote.join("big");
    random_file(&big, 20 * MIB);
    let down = env.local_dir("down");

    let proxy = CuttingProxy::start(env.sshd.port(), Watch::Down, 6 * MIB as u64);
    env.home.trust(proxy.port, &env.fx.host_key);
    let c = env.ctx("download cut after 6 MiB");
    let out = env.cp_via(proxy.port, &[&env.remote(&big), s(&down.join("big"))]);
    assert!(
        proxy.cut.load(Ordering::SeqCst),
        "{c}: the proxy never cut\n{out}"
    );
    drop(proxy);
    out.expect_code(255, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one error line\n{out}");
    assert!(lines[0].starts_with("skiff: "), "{c}\n{out}");
    assert!(
        !down.join("big").exists(),
        "{c}: no file under the final name"
    );
    assert_no_temporaries(&down, &c);

    let src = env.local_dir("src");
    random_file(&src.join("up"), 20 * MIB);
    let proxy = CuttingProxy::start(env.sshd.port(), Watch::Up, 6 * MIB as u64);
    env.home.trust(proxy.port, &env.fx.host_key);
    let c = env.ctx("upload cut after 6 MiB");
    let out = env.cp_via(proxy.port, &[s(&src.join("up")), &env.remote(&remote)]);
    assert!(
        proxy.cut.load(Ordering::SeqCst),
        "{c}: the proxy never cut\n{out}"
    );
    drop(proxy);
    out.expect_code(255, &c);
    assert_eq!(out.stderr_lines().len(), 1, "{c}: one error line\n{out}");
    // The server may keep the temporary (nobody is left to remove it), but
    // never a file under the final name.
    assert!(
        !remote.join("up").exists(),
        "{c}: no file under the final name"
    );
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A relative remote path starts in the login directory, as with scp;
/// `~/` means the same; `host:` alone is that directory.
#[test]
fn relative_paths_start_in_the_login_directory() {
    let Some(env) = Env::new() else { return };
    let acct = account();
    let name = format!("skiff-cp-test-{}-{}", std::process::id(), env.sshd.port());
    let dir = acct.home.join(&name);
    fs::create_dir_all(&dir).expect("mkdir in the account's home");
    std::os::unix::fs::chown(&dir, Some(acct.uid), Some(acct.gid)).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let src = env.local_dir("src");
    let sum_a = random_file(&src.join("a"), 777);
    let sum_b = random_file(&src.join("b"), 70 * KIB);
    let host = format!("{}@127.0.0.1", user());

    let c = env.ctx("upload to a relative path");
    env.cp(&[s(&src.join("a")), &format!("{host}:{name}/")])
        .expect_code(0, &c);
    assert_eq!(sha256(&dir.join("a")), sum_a, "{c}");
    let c = env.ctx("upload to ~/path");
    env.cp(&[s(&src.join("b")), &format!("{host}:~/{name}/b2")])
        .expect_code(0, &c);
    assert_eq!(sha256(&dir.join("b2")), sum_b, "{c}");

    let down = env.local_dir("down");
    let c = env.ctx("download -r of a relative directory");
    env.cp(&["-r", &format!("{host}:{name}"), s(&down)])
        .expect_code(0, &c);
    assert_eq!(sha256(&down.join(&name).join("a")), sum_a, "{c}");
    assert_eq!(sha256(&down.join(&name).join("b2")), sum_b, "{c}");
    let c = env.ctx("download from ~/path");
    env.cp(&[&format!("{host}:~/{name}/a"), s(&down.join("a"))])
        .expect_code(0, &c);
    assert_eq!(sha256(&down.join("a")), sum_a, "{c}");
}

/// A remote symlink that leads back to a directory being copied is
/// reported (exit 1) and not followed; the rest of the tree is copied.
#[test]
fn remote_directory_loop_is_reported() {
    let Some(env) = Env::new() else { return };
    let remote = env.remote_dir("remote");
    let tree = remote.join("loopy");
    fs::create_dir_all(tree.join("sub")).unwrap();
    let sum = random_file(&tree.join("sub/f"), 1000);
    std::os::unix::fs::symlink("..", tree.join("sub/back")).unwrap();
    let down = env.local_dir("down");
    let c = env.ctx("download -r of a tree with a loop");
    let out = env.cp(&["-r", &env.remote(&tree), s(&down)]);
    out.expect_code(1, &c);
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{c}: one failure line\n{out}");
    assert!(
        lines[0].contains("directory loop") && lines[0].contains("sub/back"),
        "{c}\n{out}"
    );
    assert_eq!(sha256(&down.join("loopy/sub/f")), sum, "{c}");
    assert!(!down.join("loopy/sub/back").exists(), "{c}");
}

/// Kills and reaps a child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGINT in the middle of a download: exit 130, one line saying so, and
/// neither the file nor its temporary is left behind.
#[test]
fn interrupt_leaves_nothing_behind() {
    let Some(env) = Env::new() else { return };
    interrupt_a_download(&env, |big| env.remote(big), Path::new("big"));
}

/// The same for a download from a node set (of one host), each of whose
/// hosts' files go into a directory of its own.
#[test]
fn interrupting_a_fan_out_leaves_nothing_behind() {
    let Some(env) = Env::new() else { return };
    let from_set = |big: &Path| format!("{}@127.0.0.[1]:{}", user(), big.display());
    interrupt_a_download(&env, from_set, Path::new("127.0.0.1/big"));
}

/// Interrupts `skiff cp SOURCE(big) DOWN/` once its temporary shows, and
/// checks that `DOWN/written` is not there.
fn interrupt_a_download(env: &Env, source: impl Fn(&Path) -> String, written: &Path) {
    let remote = env.remote_dir("remote");
    let big = remote.join("big");
    random_file(&big, 20 * MIB);
    let down = env.local_dir("down");
    // About 6 MB/s: the copy is still running when the signal comes.
    let proxy = CuttingProxy::start_paced(
        env.sshd.port(),
        Watch::Down,
        u64::MAX,
        Duration::from_millis(10),
    );
    env.home.trust(proxy.port, &env.fx.host_key);
    let child = Command::new(skiff_bin())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .env("HOME", env.home.path())
        .args(["cp", "-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
        .arg(proxy.port.to_string())
        .arg("-i")
        .arg(&env.fx.client_key.private)
        .arg(source(&big))
        .arg(&down)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn skiff cp");
    let mut child = ChildGuard(child);
    let c = env.ctx("download interrupted by SIGINT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while temporaries(&down).is_empty() {
        assert!(Instant::now() < deadline, "{c}: no temporary appeared");
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "{c}: skiff ended before the signal"
        );
        thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "{c}: skiff did not stop");
        thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(130), "{c}: {status:?}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{c}\n{stderr}");
    assert!(
        !down.join(written).exists(),
        "{c}: no file under the final name"
    );
    assert_no_temporaries(&down, &c);
    drop(child);
    drop(proxy);
}
