//! How skiffd reads the files an account controls (authorized_keys and
//! `AuthorizedPrincipalsFile`) and the server's own key lists
//! (`RevokedKeys`), seen from outside with stock `ssh` and throwaway
//! accounts: only regular files are read (a FIFO, a directory, a socket or
//! a symlink to a device is refused), a file over 8 MiB is refused unread,
//! a line over 16 KiB is skipped, `StrictModes` checks the file and every
//! directory above it up to the home, the file is read with the account's
//! rights, and none of this holds up another account's login or grows
//! skiffd's memory. Every refusal is logged with the path and the reason,
//! escaped and shortened.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// How long another account's login may take while a bad file is tried.
/// A cold login with stock ssh to a debug skiffd takes 0.1–0.3 s here; a
/// server whose workers are blocked never answers at all.
const OTHER_LOGIN_LIMIT: Duration = Duration::from_secs(3);
/// The most resident memory skiffd may reach in these tests.
const MAX_SKIFFD_RSS_KB: u64 = 200 * 1024;
/// Longer log lines mean skiffd logged what a file says unshortened.
const MAX_LOG_LINE: usize = 1000;

// ---------------------------------------------------------------------------
// Throwaway accounts
// ---------------------------------------------------------------------------

/// An account made for one test (unique name, home `/home/NAME`), removed
/// with its home on drop.
struct TempAccount {
    acct: Account,
}

impl TempAccount {
    /// `None` (the test returns) when OpenSSH is missing or the tests do
    /// not run as root, outside CI; under CI both are failures.
    fn new(tag: &str) -> Option<TempAccount> {
        if !require_openssh() {
            return None;
        }
        if !is_root() {
            let msg = "creating test accounts needs root";
            assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
            eprintln!("NOTICE: skipping test: {msg}");
            return None;
        }
        let name = format!("skf-{tag}-{}", std::process::id());
        let acct = ensure_account(AccountSpec {
            name: &name,
            shell: "/bin/sh",
            password: "*",
        });
        Some(TempAccount { acct })
    }

    fn name(&self) -> &str {
        &self.acct.name
    }

    fn home(&self) -> &Path {
        &self.acct.home
    }

    fn ssh_dir(&self) -> PathBuf {
        self.home().join(".ssh")
    }

    fn authorized_keys(&self) -> PathBuf {
        self.ssh_dir().join("authorized_keys")
    }

    /// Gives `path` (not what a symlink points to) to the account.
    fn own(&self, path: &Path) {
        std::os::unix::fs::lchown(path, Some(self.acct.uid), Some(self.acct.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }

    /// The layout sshd wants: `~` 0755 and `~/.ssh` 0700, the account's,
    /// holding nothing but `authorized_keys` (0600) listing `key`.
    fn set_keys(&self, key: &Key) {
        self.reset_ssh_dir();
        write_authorized_keys(&self.authorized_keys(), &[key.pub_line()]);
        chmod(&self.authorized_keys(), 0o600);
        self.own(&self.authorized_keys());
    }

    /// `~` 0755 and an empty `~/.ssh` 0700, both the account's.
    fn reset_ssh_dir(&self) {
        let dir = self.ssh_dir();
        if fs::symlink_metadata(&dir).is_ok() {
            fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("rm -r {}: {e}", dir.display()));
        }
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        chmod(&dir, 0o700);
        self.own(&dir);
        chmod(self.home(), 0o755);
        self.own(self.home());
    }

    /// Replaces `~/.ssh/authorized_keys` with whatever `make` puts at the
    /// path it is given.
    fn replace_keys(&self, make: impl FnOnce(&Path)) {
        self.reset_ssh_dir();
        make(&self.authorized_keys());
    }
}

impl Drop for TempAccount {
    fn drop(&mut self) {
        // userdel waits for the passwd lock other test processes may hold:
        // retried, bounded.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !no_such_account(self.name()) && Instant::now() < deadline {
            let _ = Command::new("userdel")
                .args(["-r", self.name()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !no_such_account(self.name()) {
                thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = fs::remove_dir_all(&self.acct.home);
    }
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

// ---------------------------------------------------------------------------
// The server and logins in flight
// ---------------------------------------------------------------------------

/// skiffd reading `~/.ssh/authorized_keys`, then `FIXTURE/keys/%u`, which
/// lists the fixture's client key for the shared test account only; the
/// throwaway accounts sign in with `account_key`.
struct Server {
    fx: Fixture,
    d: Skiffd,
    account_key: Key,
}

fn server(config: &str) -> Server {
    let fx = Fixture::new();
    let keys = fx.path().join("keys");
    fs::create_dir(&keys).expect("mkdir keys");
    chmod(&keys, 0o755);
    write_authorized_keys(&keys.join(user()), &[fx.client_key.pub_line()]);
    let files = format!("%h/.ssh/authorized_keys {}/%u", keys.display());
    let mut opts = SkiffdOptions::new(&fx.host_key, Path::new(&files));
    if !config.is_empty() {
        opts = opts.config(config);
    }
    let d = Skiffd::start_with(opts);
    let account_key = fx.keygen("account_key", KeyType::Ed25519, None);
    Server { fx, d, account_key }
}

impl Server {
    fn port(&self) -> u16 {
        self.d.port()
    }

    fn login(&self, name: &str, key: &Key) -> CmdOutput {
        ssh(self.port(), name, key).args(&["echo", "in"]).run()
    }

    /// A login as `name` with `key` succeeds.
    fn expect_login(&self, name: &str, key: &Key, what: &str) {
        let c = ctx(&self.d, what);
        self.login(name, key)
            .expect_code(0, &c)
            .expect_stdout("in\n", &c);
    }

    /// A login as `name` with `key` is refused.
    fn expect_refused(&self, name: &str, key: &Key, what: &str) {
        let out = self.login(name, key);
        let c = ctx(&self.d, what);
        out.expect_code(255, &c).expect_stdout("", &c);
        assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");
    }

    /// `n` logins as `bad` with `key` at once, each of them refused; while
    /// they are in flight (each has offered its key), a login of the shared
    /// test account succeeds within [`OTHER_LOGIN_LIMIT`].
    fn refused_without_holding_up_others(&self, bad: &str, key: &Key, n: usize, what: &str) {
        let mut attempts: Vec<Attempt> = (0..n)
            .map(|_| Attempt::start(self.port(), bad, key))
            .collect();
        for a in &mut attempts {
            a.wait_for("Offering public key", Duration::from_secs(10))
                .unwrap_or_else(|e| {
                    panic!(
                        "{}",
                        ctx(
                            &self.d,
                            &format!(
                                "{what}: a login as {bad} did not get to offer its key \
                                 (the server is held up): {e}"
                            )
                        )
                    )
                });
        }
        let started = Instant::now();
        let other = Attempt::start(self.port(), user(), &self.fx.client_key);
        let (code, stderr) = other.finish(OTHER_LOGIN_LIMIT);
        let took = started.elapsed();
        assert_eq!(
            code,
            Some(0),
            "{}",
            ctx(
                &self.d,
                &format!(
                    "{what}: another account's login must succeed within {OTHER_LOGIN_LIMIT:?} \
                     while {n} logins as {bad} are in flight (exit {code:?} after {took:?}; \
                     None: still running, the server is held up)\n{stderr}"
                )
            )
        );
        eprintln!("{what}: another account logged in in {took:?} beside {n} bad logins");
        for a in attempts {
            let (code, stderr) = a.finish(Duration::from_secs(30));
            assert_eq!(
                code,
                Some(255),
                "{}",
                ctx(
                    &self.d,
                    &format!("{what}: the login as {bad} must be refused\n{stderr}")
                )
            );
            assert!(stderr.contains("Permission denied"), "{what}: {stderr}");
        }
    }

    /// Waits (bounded) until a log line names `name` and holds every one of
    /// `parts`.
    fn expect_logged(&self, name: &str, parts: &[&str], what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.d.log();
            let hit = log
                .lines()
                .find(|l| l.contains(name) && parts.iter().all(|p| l.contains(p)));
            if let Some(line) = hit {
                eprintln!("{what}: logged: {line}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}",
                ctx(
                    &self.d,
                    &format!("{what}: no log line for {name} with {parts:?}")
                )
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every log line is short: what files say is shortened before it is
    /// logged.
    fn expect_short_log_lines(&self, what: &str) {
        let log = self.d.log();
        if let Some(long) = log.lines().find(|l| l.len() > MAX_LOG_LINE) {
            panic!(
                "{what}: a log line of {} bytes (at most {MAX_LOG_LINE} expected): {}...",
                long.len(),
                long.chars().take(300).collect::<String>()
            );
        }
    }

    /// skiffd's peak resident memory (VmHWM), in kB.
    fn peak_rss_kb(&self) -> u64 {
        self.d.memory().1 / 1024
    }
}

/// A stock `ssh -v` login running in the background (`true` as the
/// command), its debug output read line by line; killed on drop.
struct Attempt {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    _home: tempfile::TempDir,
}

impl Attempt {
    fn start(port: u16, user: &str, key: &Key) -> Attempt {
        let home = tempdir();
        let mut child = Command::new("ssh")
            .env("HOME", home.path())
            .env_remove("SSH_AUTH_SOCK")
            .args(["-F", "/dev/null", "-v"])
            .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .args(["-o", "StrictHostKeyChecking=no"])
            .args([
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "ConnectTimeout=10",
            ])
            .arg("-i")
            .arg(&key.private)
            .args(["-p", &port.to_string()])
            .arg(format!("{user}@127.0.0.1"))
            .arg("true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ssh");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Attempt {
            child,
            lines,
            seen: Vec::new(),
            _home: home,
        }
    }

    /// Waits until ssh prints a line holding `needle`.
    fn wait_for(&mut self, needle: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.seen.push(line);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => {
                    return Err(format!(
                        "ssh never printed {needle:?} within {limit:?}:\n{}",
                        self.seen.join("\n")
                    ))
                }
            }
        }
    }

    /// The exit code within `limit` (`None`: still running, then killed),
    /// and everything ssh printed.
    fn finish(mut self, limit: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + limit;
        let code = loop {
            if let Some(st) = self.child.try_wait().expect("wait for ssh") {
                break st.code();
            }
            if Instant::now() >= deadline {
                break None;
            }
            thread::sleep(Duration::from_millis(5));
        };
        if code.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The pipe closes with ssh: the rest of its output is there.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (code, self.seen.join("\n"))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo")
        .arg("-m")
        .arg("600")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// An authorized_keys that is a FIFO used to block the async worker that
/// opened it until someone wrote to the FIFO: three such logins stopped
/// skiffd from answering anyone. Now it is refused at once, and another
/// account logs in meanwhile.
#[test]
fn an_authorized_keys_fifo_is_refused_without_holding_up_the_server() {
    let Some(bad) = TempAccount::new("fifo") else {
        return;
    };
    let s = server("");
    bad.set_keys(&s.account_key);
    s.expect_login(
        bad.name(),
        &s.account_key,
        "control: a regular authorized_keys",
    );

    bad.replace_keys(|p| {
        mkfifo(p);
        bad.own(p);
    });
    s.refused_without_holding_up_others(bad.name(), &s.account_key, 3, "FIFO");
    let path = bad.authorized_keys().display().to_string();
    s.expect_logged(bad.name(), &[&path, "not a regular file", "FIFO"], "FIFO");
    let rss = s.peak_rss_kb();
    assert!(rss < MAX_SKIFFD_RSS_KB, "skiffd reached {rss} kB");

    // Only that file is ignored: the account's next AuthorizedKeysFile
    // still counts, as in sshd.
    let second = s.fx.path().join("keys").join(bad.name());
    write_authorized_keys(&second, &[s.account_key.pub_line()]);
    s.expect_login(
        bad.name(),
        &s.account_key,
        "the FIFO beside a good second file",
    );
}

/// A directory, a Unix socket and a symlink to /dev/zero are not read as
/// authorized_keys (only regular files are); each refusal names the path
/// and what it is.
#[test]
fn directories_sockets_and_devices_are_refused_as_authorized_keys() {
    let Some(bad) = TempAccount::new("kind") else {
        return;
    };
    let s = server("");
    let path = bad.authorized_keys().display().to_string();

    bad.replace_keys(|p| {
        fs::create_dir(p).expect("mkdir authorized_keys");
        chmod(p, 0o700);
        bad.own(p);
    });
    s.refused_without_holding_up_others(bad.name(), &s.account_key, 3, "directory");
    s.expect_logged(
        bad.name(),
        &[&path, "not a regular file", "directory"],
        "directory",
    );

    let mut listener = None;
    bad.replace_keys(|p| {
        listener = Some(std::os::unix::net::UnixListener::bind(p).expect("bind socket"));
        bad.own(p);
    });
    s.refused_without_holding_up_others(bad.name(), &s.account_key, 3, "socket");
    s.expect_logged(
        bad.name(),
        &[&path, "not a regular file", "socket"],
        "socket",
    );
    drop(listener);

    bad.replace_keys(|p| {
        symlink("/dev/zero", p).expect("symlink to /dev/zero");
        bad.own(p);
    });
    s.refused_without_holding_up_others(bad.name(), &s.account_key, 3, "symlink to /dev/zero");
    s.expect_logged(
        bad.name(),
        &[&path, "not a regular file", "character device"],
        "symlink to /dev/zero",
    );
    let rss = s.peak_rss_kb();
    assert!(rss < MAX_SKIFFD_RSS_KB, "skiffd reached {rss} kB");
}

/// A 1 GiB (sparse) authorized_keys is refused without being read: skiffd
/// stays small and logs one short line, not the file.
#[test]
fn an_oversized_authorized_keys_is_refused_unread() {
    let Some(bad) = TempAccount::new("big") else {
        return;
    };
    let s = server("");
    bad.replace_keys(|p| {
        let f = fs::File::create(p).expect("create authorized_keys");
        f.set_len(1 << 30).expect("make it 1 GiB (sparse)");
        chmod(p, 0o600);
        bad.own(p);
    });
    s.refused_without_holding_up_others(bad.name(), &s.account_key, 1, "1 GiB authorized_keys");
    // Memory first: with the whole file read, the log would be gigabytes.
    let rss = s.peak_rss_kb();
    assert!(
        rss < MAX_SKIFFD_RSS_KB,
        "skiffd reached {rss} kB while refusing a 1 GiB authorized_keys"
    );
    let path = bad.authorized_keys().display().to_string();
    s.expect_logged(
        bad.name(),
        &[&path, "larger than 8 MiB"],
        "1 GiB authorized_keys",
    );
    s.expect_short_log_lines("1 GiB authorized_keys");
}

/// Lines over 16 KiB are skipped (named by file:line, not shown), what a
/// bad line says is logged shortened and with control characters escaped,
/// and the good lines around them still count.
#[test]
fn long_and_hostile_lines_are_skipped_and_logged_short() {
    let Some(acct) = TempAccount::new("lines") else {
        return;
    };
    let s = server("");
    acct.set_keys(&s.account_key);
    let path = acct.authorized_keys();
    let text = format!(
        "# keys\n{}\n\u{1b}[31mred{} AAAA\n{}\n",
        "A".repeat(20 * 1024),
        "Z".repeat(8 * 1024),
        s.account_key.pub_line()
    );
    write_file(&path, text, 0o600);
    acct.own(&path);
    s.expect_login(
        acct.name(),
        &s.account_key,
        "the good line after the bad ones",
    );
    let label = path.display().to_string();
    s.expect_logged(
        acct.name(),
        &[&format!("{label}:2"), "longer than 16384 bytes"],
        "long line",
    );
    s.expect_logged(
        acct.name(),
        &[&format!("{label}:3"), "\\u{1b}[31mred"],
        "hostile line",
    );
    // (The log has colours of its own: look for the file's escape.)
    assert!(
        !s.d.log().contains("\u{1b}[31mred"),
        "{}",
        ctx(&s.d, "the file's escape sequence was logged raw")
    );
    s.expect_short_log_lines("long lines");
}

/// StrictModes (the default): the file, `~/.ssh` and `~` must each belong
/// to root or the account and be writable by nobody else; anything else
/// refuses the file, naming what is wrong. Put right, the same file works.
#[test]
fn strict_modes_check_the_file_and_every_directory_up_to_the_home() {
    let Some(bad) = TempAccount::new("modes") else {
        return;
    };
    let s = server("");
    let key = &s.account_key;
    bad.set_keys(key);
    s.expect_login(bad.name(), key, "control: sshd's layout");
    let home = bad.home().display().to_string();
    let ssh_dir = bad.ssh_dir().display().to_string();
    let file = bad.authorized_keys().display().to_string();

    chmod(&bad.ssh_dir(), 0o777);
    s.refused_without_holding_up_others(bad.name(), key, 1, "~/.ssh 0777");
    s.expect_logged(
        bad.name(),
        &[
            &file,
            &format!("directory {ssh_dir} "),
            "writable by group or others",
        ],
        "~/.ssh 0777",
    );

    bad.set_keys(key);
    chmod(bad.home(), 0o777);
    s.refused_without_holding_up_others(bad.name(), key, 1, "~ 0777");
    s.expect_logged(
        bad.name(),
        &[
            &file,
            &format!("directory {home} "),
            "writable by group or others",
        ],
        "~ 0777",
    );

    bad.set_keys(key);
    chmod(bad.home(), 0o775);
    s.expect_refused(bad.name(), key, "~ 0775");

    bad.set_keys(key);
    chmod(&bad.ssh_dir(), 0o755);
    std::os::unix::fs::lchown(bad.ssh_dir(), Some(65534), None).expect("chown ~/.ssh");
    s.expect_refused(bad.name(), key, "~/.ssh owned by someone else");
    s.expect_logged(
        bad.name(),
        &[
            &file,
            &format!("directory {ssh_dir} "),
            "owned by uid 65534",
        ],
        "~/.ssh owned by uid 65534",
    );

    bad.set_keys(key);
    chmod(&bad.authorized_keys(), 0o620);
    s.expect_refused(bad.name(), key, "authorized_keys group-writable");
    s.expect_logged(
        bad.name(),
        &[&format!("file {file} "), "writable by group or others"],
        "authorized_keys 0620",
    );

    bad.set_keys(key);
    s.expect_login(bad.name(), key, "put right again");
}

/// `StrictModes no` (sshd's meaning) reads the file whoever may write it
/// or the directories above it; it still reads only regular files.
#[test]
fn strict_modes_no_accepts_writable_parents_but_not_a_fifo() {
    let Some(acct) = TempAccount::new("lax") else {
        return;
    };
    let s = server("StrictModes no\n");
    let key = &s.account_key;
    acct.set_keys(key);
    chmod(acct.home(), 0o777);
    chmod(&acct.ssh_dir(), 0o777);
    chmod(&acct.authorized_keys(), 0o666);
    s.expect_login(
        acct.name(),
        key,
        "StrictModes no: writable file and parents",
    );

    acct.replace_keys(|p| {
        mkfifo(p);
        acct.own(p);
    });
    s.refused_without_holding_up_others(acct.name(), key, 3, "StrictModes no: FIFO");
    let path = acct.authorized_keys().display().to_string();
    s.expect_logged(acct.name(), &[&path, "FIFO"], "StrictModes no: FIFO");
}

/// The file is read with the account's rights, as sshd reads it: a
/// symlink to a file only root may read is refused (the account cannot
/// read it, so skiffd does not either), a symlink to a readable file in a
/// safe place is followed, and a symlink into a directory others may write
/// is refused, naming that directory.
#[test]
fn authorized_keys_is_read_with_the_account_rights_through_symlinks() {
    let Some(acct) = TempAccount::new("link") else {
        return;
    };
    let s = server("");
    let key = &s.account_key;
    let elsewhere = tempdir();

    let root_only = elsewhere.path().join("root-only");
    write_file(&root_only, key.pub_line() + "\n", 0o600);
    acct.replace_keys(|p| {
        symlink(&root_only, p).expect("symlink");
        acct.own(p);
    });
    s.expect_refused(acct.name(), key, "symlink to a file only root may read");
    let path = acct.authorized_keys().display().to_string();
    s.expect_logged(
        acct.name(),
        &[&path, "Permission denied"],
        "root-only target",
    );

    let readable = elsewhere.path().join("readable");
    write_file(&readable, key.pub_line() + "\n", 0o644);
    acct.replace_keys(|p| {
        symlink(&readable, p).expect("symlink");
        acct.own(p);
    });
    s.expect_login(
        acct.name(),
        key,
        "symlink to a readable file in a safe place",
    );

    let open = elsewhere.path().join("open");
    fs::create_dir(&open).expect("mkdir open");
    chmod(&open, 0o777);
    let target = open.join("keys");
    write_file(&target, key.pub_line() + "\n", 0o644);
    acct.own(&target);
    acct.replace_keys(|p| {
        symlink(&target, p).expect("symlink");
        acct.own(p);
    });
    s.expect_refused(acct.name(), key, "symlink into a world-writable directory");
    s.expect_logged(
        acct.name(),
        &[
            &path,
            &format!("directory {} ", open.display()),
            "writable by group or others",
        ],
        "world-writable target directory",
    );
}

/// `AuthorizedPrincipalsFile` goes through the same reader: a FIFO there
/// refuses the certificate at once, without holding up anyone else.
#[test]
fn an_authorized_principals_fifo_is_refused_without_holding_up_the_server() {
    let Some(acct) = TempAccount::new("princ") else {
        return;
    };
    let fx0 = Fixture::new();
    let ca = fx0.keygen("user_ca", KeyType::Ed25519, None);
    let s = server(&format!(
        "TrustedUserCAKeys {}\nAuthorizedPrincipalsFile %h/.ssh/principals\n",
        ca.public.display()
    ));
    let cert = user_certificate_copy(
        &s.fx,
        &ca,
        &s.fx.stranger_key,
        "certified",
        ("id", "ops"),
        &[],
    );
    acct.reset_ssh_dir();
    let principals = acct.ssh_dir().join("principals");
    write_file(&principals, "ops\n", 0o600);
    acct.own(&principals);
    s.expect_login(acct.name(), &cert, "control: a regular principals file");

    fs::remove_file(&principals).expect("rm principals");
    mkfifo(&principals);
    acct.own(&principals);
    s.refused_without_holding_up_others(acct.name(), &cert, 3, "principals FIFO");
    let path = principals.display().to_string();
    s.expect_logged(
        acct.name(),
        &[&path, "not a regular file", "FIFO"],
        "principals FIFO",
    );
}

/// The server's `RevokedKeys` is read at every check: a FIFO there (an
/// administrator's mistake) refuses every key at once, as an unreadable
/// file does, instead of stopping skiffd from answering.
#[test]
fn a_revoked_keys_fifo_refuses_every_key_without_holding_up_the_server() {
    if !require_openssh() {
        return;
    }
    let dir = tempdir();
    let fifo = dir.path().join("revoked");
    mkfifo(&fifo);
    let s = server(&format!("RevokedKeys {}\n", fifo.display()));
    let mut attempts: Vec<Attempt> = (0..3)
        .map(|_| Attempt::start(s.port(), user(), &s.fx.client_key))
        .collect();
    for a in &mut attempts {
        a.wait_for("Offering public key", Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{}", ctx(&s.d, &format!("held up: {e}"))));
    }
    let started = Instant::now();
    for a in attempts {
        let left = (started + OTHER_LOGIN_LIMIT).saturating_duration_since(Instant::now());
        let (code, out) = a.finish(left);
        assert_eq!(
            code,
            Some(255),
            "{}",
            ctx(
                &s.d,
                &format!("refused within {OTHER_LOGIN_LIMIT:?} (None: held up)\n{out}")
            )
        );
    }
    let path = fifo.display().to_string();
    s.expect_logged(
        "RevokedKeys",
        &[&path, "not a regular file", "FIFO"],
        "RevokedKeys FIFO",
    );
}

/// The same for `TrustedUserCAKeys`, read at every certificate login: a
/// FIFO there trusts no CA (the certificate is refused at once), and plain
/// keys still log in meanwhile.
#[test]
fn a_trusted_user_ca_keys_fifo_trusts_no_ca_without_holding_up_the_server() {
    if !require_openssh() {
        return;
    }
    let dir = tempdir();
    let fifo = dir.path().join("cas");
    mkfifo(&fifo);
    let s = server(&format!("TrustedUserCAKeys {}\n", fifo.display()));
    let ca = s.fx.keygen("user_ca", KeyType::Ed25519, None);
    let cert = user_certificate_copy(
        &s.fx,
        &ca,
        &s.fx.stranger_key,
        "certified",
        ("id", user()),
        &[],
    );
    s.refused_without_holding_up_others(user(), &cert, 3, "TrustedUserCAKeys FIFO");
    let path = fifo.display().to_string();
    s.expect_logged(
        "TrustedUserCAKeys",
        &[&path, "not a regular file", "FIFO"],
        "TrustedUserCAKeys FIFO",
    );
}
