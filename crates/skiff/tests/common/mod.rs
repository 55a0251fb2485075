//! Shared harness for skiff's integration tests against real OpenSSH.
//!
//! Everything here talks to real programs: `/usr/sbin/sshd`, `ssh`,
//! `ssh-keygen`, `ssh-agent`, `ssh-add` and the `skiff` / `skiffd` binaries
//! built from this package. Nothing is mocked.
//!
//! Rules the harness follows so that tests can run in parallel threads:
//! * network traffic only ever goes to loopback (127.0.0.0/8);
//! * daemons listen on a fresh free port and are polled (bounded) until they
//!   accept connections;
//! * every wait is bounded, every spawned process is killed and reaped on
//!   drop (also when a test panics);
//! * every test gets its own temporary directories.

#![allow(dead_code)]

pub mod skiff_cases;

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Path of the OpenSSH server binary.
pub const SSHD: &str = "/usr/sbin/sshd";
/// Name of the local account the tests log into when running as root.
pub const TEST_USER: &str = "skiff-test";
/// Default limit for a single client invocation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Limit for invocations that move a lot of data (debug builds are slow).
pub const BULK_TIMEOUT: Duration = Duration::from_secs(300);
/// Limit for a daemon to start accepting connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Limit for the 10 MB round trip through remote `cat` (a flow-control
/// deadlock shows up as a hang here).
pub const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(120);
/// Size of the large stdin transfer.
pub const BIG: usize = 100 * 1024 * 1024;

/// Path of the `skiff` client binary under test.
pub fn skiff_bin() -> &'static str {
    env!("CARGO_BIN_EXE_skiff")
}

/// Path of the `skiffd` server binary under test.
pub fn skiffd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_skiffd")
}

// ---------------------------------------------------------------------------
// Environment checks
// ---------------------------------------------------------------------------

/// True when running under CI (`CI=true`, as set by most CI systems).
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "true" || v == "1" || v == "yes"
        })
        .unwrap_or(false)
}

fn on_path(tool: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        fs::metadata(dir.join(tool))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Checks that the OpenSSH programs the tests need are installed.
///
/// Returns `true` when they are. When something is missing: panics under CI
/// (a skipped interoperability test must never look like a pass there),
/// otherwise prints a notice and returns `false` so the caller can return.
pub fn require_openssh() -> bool {
    let mut missing = Vec::new();
    if !Path::new(SSHD).is_file() {
        missing.push(SSHD.to_string());
    }
    for tool in ["ssh", "ssh-keygen", "ssh-agent", "ssh-add", "sha256sum"] {
        if !on_path(tool) {
            missing.push(tool.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "OpenSSH interoperability test needs {} (install openssh-server, openssh-client, coreutils)",
        missing.join(", ")
    );
    if in_ci() {
        panic!("{msg}; CI=true so this test refuses to skip");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    false
}

/// True when the tests run as root (uid 0).
/// Whether `tool` is on PATH. Under CI a missing tool is a failure (the
/// test would otherwise pass without testing anything); elsewhere it prints
/// a notice and returns `false` so the caller can return.
pub fn require_tool(tool: &str, package: &str) -> bool {
    if on_path(tool) {
        return true;
    }
    let msg = format!("test needs {tool} (apt-get install -y {package})");
    if in_ci() {
        panic!("{msg}; CI=true so this test refuses to skip");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    false
}

pub fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        let out = Command::new("id").arg("-u").output().expect("run `id -u`");
        String::from_utf8_lossy(&out.stdout).trim() == "0"
    })
}

/// A directory to make `ChrootDirectory` jails in: every component
/// root-owned and writable by no one else, as a jail's must be (this test
/// binary's temporary directory under target/, else `/run` or `/srv`).
/// `None` when not root.
pub fn jail_base() -> Option<PathBuf> {
    if !is_root() {
        return None;
    }
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let _ = fs::create_dir_all(target_tmp);
    let candidates = [target_tmp, Path::new("/run"), Path::new("/srv")];
    let base = candidates
        .iter()
        .find(|b| skiff_server::chroot::check(b).is_ok())
        .unwrap_or_else(|| panic!("no root-owned, non-writable directory among {candidates:?}"));
    Some(base.to_path_buf())
}

// ---------------------------------------------------------------------------
// Test account
// ---------------------------------------------------------------------------

/// The local account the tests log into.
#[derive(Clone, Debug)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
}

fn getent_passwd(name: &str) -> Option<Account> {
    let out = Command::new("getent")
        .args(["passwd", name])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?;
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || f[0] != name {
        return None;
    }
    Some(Account {
        name: f[0].to_string(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: PathBuf::from(f[5]),
        shell: f[6].to_string(),
    })
}

fn shadow_password_field(name: &str) -> Option<String> {
    let text = fs::read_to_string("/etc/shadow").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split(':');
        (it.next()? == name).then(|| it.next().unwrap_or("").to_string())
    })
}

/// Runs an account-management command, tolerating lock contention with
/// other test processes by retrying until `done()` holds (bounded).
fn retry_admin(what: &str, args: &[&str], done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while !done() {
        if Instant::now() > deadline {
            panic!("{what} did not take effect within 30 s; last output: {last}");
        }
        match Command::new(args[0]).args(&args[1..]).output() {
            Ok(out) => {
                last = format!(
                    "exit {:?}: {}{}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Err(e) => last = format!("spawn failed: {e}"),
        }
        if done() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A local account as `ensure_account` sets it up.
#[derive(Clone, Copy, Debug)]
pub struct AccountSpec<'a> {
    pub name: &'a str,
    /// Login shell (`/bin/sh`, `/usr/sbin/nologin`, ...).
    pub shell: &'a str,
    /// The /etc/shadow password field: `*` (no password, usable for keys)
    /// or `!` (locked).
    pub password: &'a str,
}

/// Creates (as root) the account `spec.name` with home `/home/NAME` unless
/// it exists, then makes its shell and password field match `spec`.
/// Idempotent, and safe when several test processes race for it.
pub fn ensure_account(spec: AccountSpec<'_>) -> Account {
    let AccountSpec {
        name,
        shell,
        password,
    } = spec;
    assert!(is_root(), "creating account {name} needs root");
    let home = format!("/home/{name}");
    // useradd fails with "already exists" when another test binary won the
    // race, or with "cannot lock /etc/passwd" while one is busy: both are
    // fine, we simply re-check.
    retry_admin(
        &format!("useradd {name}"),
        &["useradd", "-m", "-d", &home, "-s", shell, name],
        || getent_passwd(name).is_some(),
    );
    // `!` (locked) makes sshd refuse even public-key logins with UsePAM no.
    retry_admin(
        &format!("usermod -p '{password}' {name}"),
        &["usermod", "-p", password, name],
        || shadow_password_field(name).as_deref() == Some(password),
    );
    retry_admin(
        &format!("usermod -s {shell} {name}"),
        &["usermod", "-s", shell, name],
        || getent_passwd(name).is_some_and(|a| a.shell == shell),
    );
    let acct = getent_passwd(name).unwrap_or_else(|| panic!("{name} account exists"));
    if !acct.home.is_dir() {
        fs::create_dir_all(&acct.home).unwrap_or_else(|e| panic!("create {name} home: {e}"));
        let owner = format!("{}:{}", acct.uid, acct.gid);
        let st = Command::new("chown")
            .arg(&owner)
            .arg(&acct.home)
            .status()
            .expect("run chown");
        assert!(st.success(), "chown {owner} {}", acct.home.display());
    }
    acct
}

/// An account a test makes for itself, with a unique name, its own home
/// and password field `*` (usable for keys), removed (home and all) when
/// dropped. Needs root.
pub struct TempAccount {
    pub account: Account,
}

impl TempAccount {
    /// A new account `skt-TAG-PID-N` whose login shell is `shell`.
    pub fn create(tag: &str, shell: &str) -> TempAccount {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "skt-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        assert!(name.len() <= 32, "account name {name} is too long");
        assert!(no_such_account(&name), "{name} exists already");
        let account = ensure_account(AccountSpec {
            name: &name,
            shell,
            password: "*",
        });
        TempAccount { account }
    }

    pub fn name(&self) -> &str {
        &self.account.name
    }

    /// Runs an account-management command (`usermod ...`) on it until
    /// `done()` holds (bounded; other tests may hold the lock on the
    /// account files meanwhile).
    pub fn admin(&self, args: &[&str], done: impl Fn() -> bool) {
        retry_admin(&args.join(" "), args, done);
    }
}

impl Drop for TempAccount {
    fn drop(&mut self) {
        // Never panic here (this also runs while a test fails).
        let name = self.account.name.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !no_such_account(&name) && Instant::now() < deadline {
            let _ = Command::new("userdel")
                .args(["-r", "-f", &name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !no_such_account(&name) {
                thread::sleep(Duration::from_millis(100));
            }
        }
        if !no_such_account(&name) {
            eprintln!("WARNING: could not remove the test account {name}");
        }
    }
}

/// The fields of `name`'s /etc/shadow line (name first).
pub fn shadow_fields(name: &str) -> Option<Vec<String>> {
    let text = fs::read_to_string("/etc/shadow").ok()?;
    text.lines().find_map(|l| {
        let fields: Vec<String> = l.split(':').map(str::to_string).collect();
        (fields.first().map(String::as_str) == Some(name)).then_some(fields)
    })
}

/// True when no passwd entry (local or from NSS) exists for `name`.
pub fn no_such_account(name: &str) -> bool {
    getent_passwd(name).is_none()
}

/// The account to log into: `skiff-test` when running as root (created on
/// first use), otherwise the current user.
pub fn account() -> &'static Account {
    static ACCOUNT: OnceLock<Account> = OnceLock::new();
    ACCOUNT.get_or_init(|| {
        if is_root() {
            ensure_account(AccountSpec {
                name: TEST_USER,
                shell: "/bin/sh",
                password: "*",
            })
        } else {
            let out = Command::new("id")
                .arg("-un")
                .output()
                .expect("run `id -un`");
            let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
            getent_passwd(&name).unwrap_or_else(|| panic!("no passwd entry for {name}"))
        }
    })
}

// ---------------------------------------------------------------------------
// Files, directories and keys
// ---------------------------------------------------------------------------

/// A fresh temporary directory with mode 0755, so that files in it can be
/// read by the test account (sshd reads authorized_keys as that user).
pub fn tempdir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("skiff-it-")
        .tempdir()
        .expect("create temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    dir
}

/// Writes `contents` to `path` and sets its mode.
pub fn write_file(path: &Path, contents: impl AsRef<[u8]>, mode: u32) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Mode bits (permission part) of a file.
pub fn file_mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Key algorithms ssh-keygen can generate for the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    Ed25519,
    Rsa,
    Ecdsa,
}

impl KeyType {
    pub fn keygen_name(self) -> &'static str {
        match self {
            KeyType::Ed25519 => "ed25519",
            KeyType::Rsa => "rsa",
            KeyType::Ecdsa => "ecdsa",
        }
    }

    pub const ALL: [KeyType; 3] = [KeyType::Ed25519, KeyType::Rsa, KeyType::Ecdsa];
}

/// A key pair generated by `ssh-keygen`.
#[derive(Clone, Debug)]
pub struct Key {
    pub private: PathBuf,
    pub public: PathBuf,
    pub kind: KeyType,
}

impl Key {
    /// The `.pub` file's content, trimmed (`type base64 comment`).
    pub fn pub_line(&self) -> String {
        fs::read_to_string(&self.public)
            .unwrap_or_else(|e| panic!("read {}: {e}", self.public.display()))
            .trim()
            .to_string()
    }

    /// `type base64`, without the comment: what known_hosts and
    /// authorized_keys lines carry.
    pub fn key_material(&self) -> String {
        let line = self.pub_line();
        let mut it = line.split_whitespace();
        format!(
            "{} {}",
            it.next().expect("key type"),
            it.next().expect("key blob")
        )
    }

    /// The `SHA256:...` fingerprint, as printed by `ssh-keygen -l`.
    pub fn fingerprint(&self) -> String {
        let out = Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(&self.public)
            .output()
            .expect("run ssh-keygen -l");
        assert!(out.status.success(), "ssh-keygen -l failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split_whitespace()
            .find(|t| t.starts_with("SHA256:"))
            .unwrap_or_else(|| panic!("no fingerprint in {text:?}"))
            .to_string()
    }
}

/// Generates a key pair `dir/name` (+ `.pub`) with `ssh-keygen`, encrypted
/// with `passphrase` when one is given.
pub fn keygen(dir: &Path, name: &str, kind: KeyType, passphrase: Option<&str>) -> Key {
    let private = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-N",
            passphrase.unwrap_or(""),
            "-t",
            kind.keygen_name(),
        ])
        .args(["-C", &format!("skiff-test-{name}"), "-f"])
        .arg(&private)
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen -t {} -f {} failed: {}",
        kind.keygen_name(),
        private.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let public = dir.join(format!("{name}.pub"));
    fs::set_permissions(&public, fs::Permissions::from_mode(0o644)).expect("chmod .pub");
    Key {
        private,
        public,
        kind,
    }
}

/// Writes an authorized_keys file (mode 0644) with the given lines.
pub fn write_authorized_keys(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    write_file(path, text, 0o644);
}

/// The `host` field OpenSSH uses in known_hosts for 127.0.0.1:`port`.
pub fn known_hosts_name(port: u16) -> String {
    if port == 22 {
        "127.0.0.1".to_string()
    } else {
        format!("[127.0.0.1]:{port}")
    }
}

/// A plain (unhashed) known_hosts line for `key` served on 127.0.0.1:`port`.
pub fn known_hosts_line(port: u16, key: &Key) -> String {
    format!("{} {}", known_hosts_name(port), key.key_material())
}

/// The entries `ssh-keygen -F` finds for 127.0.0.1:`port` in a known_hosts
/// file (works for hashed and plain entries). Comment lines are dropped.
pub fn known_hosts_lookup(file: &Path, port: u16) -> Vec<String> {
    let out = Command::new("ssh-keygen")
        .arg("-F")
        .arg(known_hosts_name(port))
        .arg("-f")
        .arg(file)
        .output()
        .expect("run ssh-keygen -F");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Key material (`type base64`) of a known_hosts line.
pub fn known_hosts_entry_key(line: &str) -> String {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert!(f.len() >= 3, "malformed known_hosts line {line:?}");
    // A marker such as @cert-authority would shift the fields; skiff never
    // writes one, so treat it as an error.
    assert!(!f[0].starts_with('@'), "unexpected marker in {line:?}");
    format!("{} {}", f[1], f[2])
}

/// Writes `size` bytes from /dev/urandom to `path` and returns their
/// SHA-256 (hex), computed by the local `sha256sum`.
pub fn random_file(path: &Path, size: usize) -> String {
    let mut src = File::open("/dev/urandom").expect("open /dev/urandom");
    let mut dst = File::create(path).expect("create random file");
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len());
        src.read_exact(&mut buf[..n]).expect("read /dev/urandom");
        dst.write_all(&buf[..n]).expect("write random file");
        left -= n;
    }
    dst.sync_all().ok();
    drop(dst);
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum failed");
    first_token(&out.stdout)
}

/// SHA-256 (hex) of a file, by the local `sha256sum`.
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    first_token(&out.stdout)
}

/// First whitespace-separated token of some output, e.g. a sha256sum hash.
pub fn first_token(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// An `SSH_ASKPASS` program that appends its arguments to `marker` and
/// prints `passphrase`.
pub fn askpass_script(dir: &Path, passphrase: &str, marker: &Path) -> PathBuf {
    assert!(
        passphrase.chars().all(|c| c.is_ascii_alphanumeric()),
        "keep test passphrases shell-safe"
    );
    let path = dir.join("askpass.sh");
    let text = format!(
        "#!/bin/sh\necho \"askpass called: $*\" >> '{}'\necho {passphrase}\n",
        marker.display()
    );
    write_file(&path, text, 0o755);
    path
}

// ---------------------------------------------------------------------------
// Running client commands
// ---------------------------------------------------------------------------

/// What a client invocation gets on stdin.
#[derive(Clone, Debug)]
pub enum Input {
    Null,
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// Result of one client invocation.
pub struct CmdOutput {
    /// Exit code; death by signal N is reported as 128+N like a shell does.
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// The command line, for assertion messages.
    pub label: String,
}

impl CmdOutput {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Panics (with the full output) unless the exit code is `code`.
    pub fn expect_code(&self, code: i32, context: &str) -> &Self {
        assert_eq!(
            self.code, code,
            "{context}: expected exit code {code}\n{self}"
        );
        self
    }

    /// Panics unless stdout is exactly `expected`.
    pub fn expect_stdout(&self, expected: &str, context: &str) -> &Self {
        assert_eq!(
            self.stdout_str(),
            expected,
            "{context}: unexpected stdout\n{self}"
        );
        self
    }

    /// Non-empty stderr lines.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Asserts skiff's failure contract: exit code 255, nothing on stdout
    /// and exactly one stderr line, starting with `skiff: ` and containing
    /// every needle (case-insensitive).
    pub fn expect_skiff_failure(&self, needles: &[&str], context: &str) -> &Self {
        self.expect_code(255, context);
        assert!(
            self.stdout.is_empty(),
            "{context}: nothing should reach stdout\n{self}"
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "{context}: expected exactly one stderr line\n{self}"
        );
        assert!(
            lines[0].starts_with("skiff: "),
            "{context}: stderr line must start with `skiff: `\n{self}"
        );
        let lower = lines[0].to_lowercase();
        for n in needles {
            assert!(
                lower.contains(&n.to_lowercase()),
                "{context}: stderr should mention {n:?}\n{self}"
            );
        }
        self
    }
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [{} bytes total]", &s[..end], s.len())
}

impl fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.label)?;
        writeln!(f, "exit code: {}", self.code)?;
        match std::str::from_utf8(&self.stdout) {
            Ok(text) => writeln!(f, "stdout: {:?}", clip(text, 2000))?,
            Err(_) => {
                let head: String = self
                    .stdout
                    .iter()
                    .take(32)
                    .map(|b| format!("{b:02x}"))
                    .collect();
                writeln!(
                    f,
                    "stdout: <{} bytes of binary data, starting {head}>",
                    self.stdout.len()
                )?
            }
        }
        write!(f, "stderr: {:?}", clip(&self.stderr, 4000))
    }
}

impl fmt::Debug for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Kills and reaps a child when dropped (including during a panic).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command with a bounded run time and captured output.
pub struct Run {
    cmd: Command,
    input: Input,
    timeout: Duration,
}

impl Run {
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Run {
            cmd: Command::new(program),
            input: Input::Null,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(a);
        self
    }

    pub fn args<I, S>(mut self, a: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(a);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
        self.cmd.env_remove(k);
        self
    }

    /// Passphrases come from `program` (`SSH_ASKPASS`, forced).
    pub fn askpass(self, program: &Path) -> Self {
        self.env("SSH_ASKPASS", program)
            .env("SSH_ASKPASS_REQUIRE", "force")
    }

    pub fn input(mut self, input: Input) -> Self {
        self.input = input;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Runs the command to completion. Panics if it cannot be spawned or
    /// does not finish within the timeout (it is killed first).
    pub fn run(self) -> CmdOutput {
        let Run {
            mut cmd,
            input,
            timeout,
        } = self;
        let label = describe(&cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut bytes = None;
        match input {
            Input::Null => {
                cmd.stdin(Stdio::null());
            }
            Input::Bytes(b) => {
                cmd.stdin(Stdio::piped());
                bytes = Some(b);
            }
            Input::File(p) => {
                let f = File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
                cmd.stdin(f);
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {label}: {e}"));
        let mut guard = KillOnDrop(child);
        if let Some(b) = bytes {
            let mut stdin = guard.0.stdin.take().expect("piped stdin");
            // The child may exit without reading everything: a broken pipe
            // is not an error here.
            thread::spawn(move || {
                let _ = stdin.write_all(&b);
            });
        }
        let out_buf = Arc::new(Mutex::new(Vec::new()));
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done_rx) = mpsc::channel::<()>();
        spawn_reader(guard.0.stdout.take(), out_buf.clone(), done_tx.clone());
        spawn_reader(guard.0.stderr.take(), err_buf.clone(), done_tx);

        let deadline = Instant::now() + timeout;
        let status = loop {
            match guard.0.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(e) => panic!("waiting for {label}: {e}"),
            }
            if Instant::now() >= deadline {
                let _ = guard.0.kill();
                let _ = guard.0.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(10));
        };
        // Both readers finish once every holder of the pipes is gone.
        let grace = Instant::now() + Duration::from_secs(10);
        let mut finished = 0;
        while finished < 2 {
            let left = grace.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(()) => finished += 1,
                Err(_) => break,
            }
        }
        let snapshot = CmdOutput {
            code: status.map(exit_code).unwrap_or(-1),
            stdout: out_buf.lock().unwrap().clone(),
            stderr: String::from_utf8_lossy(&err_buf.lock().unwrap()).into_owned(),
            label,
        };
        if status.is_none() {
            panic!("timed out after {timeout:?} (killed)\n{snapshot}");
        }
        if finished < 2 {
            panic!("process exited but its output pipes stayed open for 10 s (a descendant holds them)\n{snapshot}");
        }
        snapshot
    }
}

fn spawn_reader<R: Read + Send + 'static>(
    src: Option<R>,
    buf: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Sender<()>,
) {
    thread::spawn(move || {
        if let Some(mut src) = src {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match src.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
        }
        let _ = done.send(());
    });
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            parts.push(format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            parts.push(a.into_owned());
        }
    }
    parts.join(" ")
}

// ---------------------------------------------------------------------------
// OpenSSH client
// ---------------------------------------------------------------------------

/// Builder for a real OpenSSH `ssh` invocation against 127.0.0.1.
///
/// Always passes `-F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes
/// -o LogLevel=ERROR` (see [`Ssh::log_level`]); host keys are not checked (a private, throw-away
/// known_hosts) unless [`Ssh::known_hosts`] is used, which switches to
/// `StrictHostKeyChecking=yes`.
pub struct Ssh {
    port: u16,
    user: String,
    keys: Vec<PathBuf>,
    options: Vec<OsString>,
    command: Vec<OsString>,
    known_hosts: Option<PathBuf>,
    input: Input,
    timeout: Duration,
    env: Vec<(OsString, OsString)>,
    log_level: String,
}

/// An `ssh` invocation as `user` on 127.0.0.1:`port` authenticating with `key`.
pub fn ssh(port: u16, user: &str, key: &Key) -> Ssh {
    Ssh {
        port,
        user: user.to_string(),
        keys: vec![key.private.clone()],
        options: Vec::new(),
        command: Vec::new(),
        known_hosts: None,
        input: Input::Null,
        timeout: DEFAULT_TIMEOUT,
        env: Vec::new(),
        log_level: "ERROR".to_string(),
    }
}

/// Runs `ssh ... user@127.0.0.1 args...` and returns its result.
pub fn ssh_cmd(port: u16, user: &str, key: &Key, args: &[&str]) -> CmdOutput {
    ssh(port, user, key).args(args).run()
}

impl Ssh {
    /// An option placed before the destination (`-tt`, `-v`, ...).
    pub fn flag(mut self, f: &str) -> Self {
        self.options.push(f.into());
        self
    }

    /// `-o keyword=value`.
    pub fn opt(mut self, o: &str) -> Self {
        self.options.push("-o".into());
        self.options.push(o.into());
        self
    }

    /// Remote command words (after the destination).
    pub fn args(mut self, a: &[&str]) -> Self {
        self.command.extend(a.iter().map(OsString::from));
        self
    }

    pub fn known_hosts(mut self, path: &Path) -> Self {
        self.known_hosts = Some(path.to_path_buf());
        self
    }

    pub fn input(mut self, i: Input) -> Self {
        self.input = i;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Self {
        self.env.push((k.into(), v.as_ref().to_os_string()));
        self
    }

    /// `-o LogLevel=LEVEL` instead of `ERROR` (e.g. `INFO` shows why a
    /// negotiation failed). `-v` flags raise it further.
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = level.to_string();
        self
    }

    pub fn run(self) -> CmdOutput {
        let scratch = tempdir();
        let mut run = Run::new("ssh")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("SSH_ASKPASS_REQUIRE")
            .env("HOME", scratch.path())
            .args(["-F", "/dev/null"])
            .args(["-o", "BatchMode=yes"])
            .args(["-o", "IdentitiesOnly=yes"])
            .arg("-o")
            .arg(format!("LogLevel={}", self.log_level))
            .args(["-o", "ConnectTimeout=10"]);
        match &self.known_hosts {
            Some(kh) => {
                run = run
                    .args(["-o", "StrictHostKeyChecking=yes"])
                    .arg(format!("-oUserKnownHostsFile={}", kh.display()));
            }
            None => {
                run = run.args(["-o", "StrictHostKeyChecking=no"]).arg(format!(
                    "-oUserKnownHostsFile={}",
                    scratch.path().join("known_hosts").display()
                ));
            }
        }
        for k in &self.keys {
            run = run.arg("-i").arg(k);
        }
        for (k, v) in &self.env {
            run = run.env(k, v);
        }
        let out = run
            .args(&self.options)
            .args(["-p", &self.port.to_string()])
            .arg(format!("{}@127.0.0.1", self.user))
            .args(&self.command)
            .input(self.input)
            .timeout(self.timeout)
            .run();
        drop(scratch);
        out
    }
}

// ---------------------------------------------------------------------------
// skiff client
// ---------------------------------------------------------------------------

/// A private HOME for one skiff invocation (or a few): `~/.ssh` (0700) is
/// the test's own.
pub struct ClientHome {
    dir: TempDir,
}

impl Default for ClientHome {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientHome {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("skiff-home-")
            .tempdir()
            .expect("create client home");
        let ssh = dir.path().join(".ssh");
        fs::create_dir(&ssh).expect("mkdir ~/.ssh");
        fs::set_permissions(&ssh, fs::Permissions::from_mode(0o700)).expect("chmod ~/.ssh");
        ClientHome { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn ssh_dir(&self) -> PathBuf {
        self.dir.path().join(".ssh")
    }

    /// `~/.ssh/known_hosts`.
    pub fn known_hosts(&self) -> PathBuf {
        self.ssh_dir().join("known_hosts")
    }

    /// Appends a plain known_hosts entry for `key` on 127.0.0.1:`port` to
    /// `~/.ssh/known_hosts` (mode 0600).
    pub fn trust(&self, port: u16, key: &Key) {
        let path = self.known_hosts();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open known_hosts");
        writeln!(f, "{}", known_hosts_line(port, key)).expect("write known_hosts");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod known_hosts");
    }
}

/// Builder for `skiff exec [options] destination [--] command...`.
///
/// Defaults: `-F /dev/null` (hermetic; see [`SkiffExec::user_config`]),
/// `-o BatchMode=yes` (see [`SkiffExec::interactive`]), HOME = the
/// [`ClientHome`], and SSH_AUTH_SOCK / SSH_ASKPASS* removed from the
/// environment unless set with [`SkiffExec::env`].
pub struct SkiffExec {
    home: PathBuf,
    config: Option<PathBuf>,
    batch: bool,
    flags: Vec<OsString>,
    options: Vec<String>,
    keys: Vec<PathBuf>,
    port: Option<u16>,
    login: Option<String>,
    destination: String,
    dashdash: bool,
    command: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    input: Input,
    timeout: Duration,
}

/// `skiff exec -p PORT [-i KEY] USER@127.0.0.1 ...` with a private HOME.
pub fn skiff_exec(home: &ClientHome, port: u16, user: &str, key: Option<&Key>) -> SkiffExec {
    let mut s = SkiffExec::new(home, &format!("{user}@127.0.0.1"));
    s.port = Some(port);
    if let Some(k) = key {
        s.keys.push(k.private.clone());
    }
    s
}

/// Runs `skiff exec ... USER@127.0.0.1 command` (key given with `-i`, known
/// hosts as set up in `home`) and returns its result.
pub fn skiff_cmd(home: &ClientHome, port: u16, user: &str, key: &Key, command: &str) -> CmdOutput {
    skiff_exec(home, port, user, Some(key)).cmd(command).run()
}

impl SkiffExec {
    /// A bare `skiff exec DESTINATION` (no -p, no -i).
    pub fn new(home: &ClientHome, destination: &str) -> Self {
        SkiffExec {
            home: home.path().to_path_buf(),
            config: Some(PathBuf::from("/dev/null")),
            batch: true,
            flags: Vec::new(),
            options: Vec::new(),
            keys: Vec::new(),
            port: None,
            login: None,
            destination: destination.to_string(),
            dashdash: false,
            command: Vec::new(),
            env: Vec::new(),
            input: Input::Null,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Do not pass `-F`: skiff reads ~/.ssh/config and /etc/ssh/ssh_config.
    pub fn user_config(mut self) -> Self {
        self.config = None;
        self
    }

    /// `-F path`.
    pub fn config(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }

    /// Do not pass `-o BatchMode=yes`.
    pub fn interactive(mut self) -> Self {
        self.batch = false;
        self
    }

    /// A flag such as `-n`, `-t` or `-v`.
    pub fn flag(mut self, f: &str) -> Self {
        self.flags.push(f.into());
        self
    }

    /// `-o keyword=value`.
    pub fn opt(mut self, o: &str) -> Self {
        self.options.push(o.to_string());
        self
    }

    /// An extra `-i path`.
    pub fn key(mut self, path: &Path) -> Self {
        self.keys.push(path.to_path_buf());
        self
    }

    /// Remove any `-i` given so far.
    pub fn no_keys(mut self) -> Self {
        self.keys.clear();
        self
    }

    /// `-p port`.
    pub fn port(mut self, p: u16) -> Self {
        self.port = Some(p);
        self
    }

    /// `-l user`.
    pub fn login(mut self, user: &str) -> Self {
        self.login = Some(user.to_string());
        self
    }

    pub fn destination(mut self, d: &str) -> Self {
        self.destination = d.to_string();
        self
    }

    /// Put `--` between the destination and the command.
    pub fn dashdash(mut self) -> Self {
        self.dashdash = true;
        self
    }

    /// The remote command as a single word (a shell command line).
    pub fn cmd(mut self, c: &str) -> Self {
        self.command = vec![c.into()];
        self
    }

    /// The remote command as several words.
    pub fn args(mut self, a: &[&str]) -> Self {
        self.command = a.iter().map(OsString::from).collect();
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Self {
        self.env.push((k.into(), v.as_ref().to_os_string()));
        self
    }

    /// Passphrases come from `program` (`SSH_ASKPASS`, forced).
    pub fn askpass(self, program: &Path) -> Self {
        self.env("SSH_ASKPASS", program)
            .env("SSH_ASKPASS_REQUIRE", "force")
    }

    pub fn input(mut self, i: Input) -> Self {
        self.input = i;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    pub fn run(self) -> CmdOutput {
        let mut run = Run::new(skiff_bin())
            // The direct path by default; the agent has its own tests, each
            // with a private socket directory and an agent it stops itself.
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_AGENT_PID")
            .env_remove("SSH_ASKPASS")
            .env_remove("SSH_ASKPASS_REQUIRE")
            .env_remove("DISPLAY")
            .env("HOME", &self.home)
            .arg("exec");
        for (k, v) in &self.env {
            run = run.env(k, v);
        }
        if let Some(cfg) = &self.config {
            run = run.arg("-F").arg(cfg);
        }
        if self.batch {
            run = run.args(["-o", "BatchMode=yes"]);
        }
        for o in &self.options {
            run = run.arg("-o").arg(o);
        }
        for k in &self.keys {
            run = run.arg("-i").arg(k);
        }
        if let Some(p) = self.port {
            run = run.arg("-p").arg(p.to_string());
        }
        if let Some(l) = &self.login {
            run = run.arg("-l").arg(l);
        }
        run = run.args(&self.flags).arg(&self.destination);
        if self.dashdash {
            run = run.arg("--");
        }
        run.args(&self.command)
            .input(self.input)
            .timeout(self.timeout)
            .run()
    }
}

// ---------------------------------------------------------------------------
// Daemons
// ---------------------------------------------------------------------------

/// A server the tests talk to.
pub trait Daemon {
    /// Port on 127.0.0.1.
    fn port(&self) -> u16;
    /// Everything the daemon logged so far.
    fn log(&self) -> String;
    /// Stops the daemon and starts it again on the same port, presenting
    /// `key` as its (only) host key.
    fn restart_with_host_key(&mut self, key: &Key);
}

/// `what`, followed by the server's log so far (clipped), for assertion
/// messages.
pub fn server_context(server: &dyn Daemon, what: &str) -> String {
    format!("{what}\n--- server log ---\n{}", clip(&server.log(), 8000))
}

/// Asks the kernel for a currently free port on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// A running daemon process: killed and reaped on drop.
struct DaemonProc {
    child: Child,
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Startup {
    Ready,
    /// The process exited before accepting connections.
    Exited(ExitStatus),
    TimedOut,
}

/// Polls until 127.0.0.1:`port` accepts a connection and `ready()` holds,
/// while the daemon keeps running. Bounded by [`START_TIMEOUT`].
fn wait_until_listening(proc: &mut DaemonProc, port: u16, ready: impl Fn() -> bool) -> Startup {
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        if let Ok(Some(st)) = proc.child.try_wait() {
            return Startup::Exited(st);
        }
        if ready() && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            // Make sure it is our daemon that answered and not a process
            // that grabbed the port in between: ours must still be alive.
            thread::sleep(Duration::from_millis(50));
            if let Ok(Some(st)) = proc.child.try_wait() {
                return Startup::Exited(st);
            }
            return Startup::Ready;
        }
        if Instant::now() >= deadline {
            return Startup::TimedOut;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

static LAUNCH_SEQ: AtomicU64 = AtomicU64::new(0);

/// What every daemon the harness runs has: a name for messages, a port, a
/// private directory, a log file that collects the output of every start,
/// and the running process.
struct DaemonCore {
    name: &'static str,
    port: u16,
    dir: TempDir,
    log_path: PathBuf,
    proc: Option<DaemonProc>,
}

impl DaemonCore {
    fn new(name: &'static str) -> Self {
        let dir = tempdir();
        let log_path = dir.path().join(format!("{name}.log"));
        DaemonCore {
            name,
            port: 0,
            dir,
            log_path,
            proc: None,
        }
    }

    fn log(&self) -> String {
        read_lossy(&self.log_path)
    }

    /// Spawns `cmd` (stdin from /dev/null, stdout and stderr appended to
    /// the log) and waits until it accepts connections on the port and,
    /// when a `marker` is given, has logged it during this start.
    fn spawn(&mut self, mut cmd: Command, marker: Option<&str>) -> Result<(), String> {
        let offset = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0) as usize;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("open {} log: {e}", self.name));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.name))?;
        let mut proc = DaemonProc { child };
        let ready = || {
            marker.is_none_or(|m| {
                read_lossy(&self.log_path)
                    .get(offset..)
                    .unwrap_or("")
                    .contains(m)
            })
        };
        let (name, port) = (self.name, self.port);
        match wait_until_listening(&mut proc, port, ready) {
            Startup::Ready => {
                self.proc = Some(proc);
                Ok(())
            }
            Startup::Exited(st) => Err(format!(
                "{name} exited early ({st}) on port {port}; log:\n{}",
                self.log()
            )),
            Startup::TimedOut => Err(format!(
                "{name} not accepting on port {port} after {START_TIMEOUT:?}; log:\n{}",
                self.log()
            )),
        }
    }
}

/// How the harness starts and restarts one kind of daemon.
trait Launch {
    fn core(&self) -> &DaemonCore;
    fn core_mut(&mut self) -> &mut DaemonCore;
    /// Starts the daemon on `core().port` with the current settings.
    fn launch(&mut self) -> Result<(), String>;
    /// Makes `key` the only host key for the next launch.
    fn set_only_host_key(&mut self, key: &Key);

    /// Starts the daemon on a free port, trying three ports (another
    /// process may take a port between the probe and the bind).
    fn start_on_free_port(&mut self) {
        let mut last = String::new();
        for _ in 0..3 {
            self.core_mut().port = free_port();
            match self.launch() {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        panic!("{} did not start (3 attempts): {last}", self.core().name);
    }

    /// Stops the daemon and starts it again on the same port.
    fn relaunch(&mut self) {
        self.core_mut().proc = None; // kill + wait
        if let Err(e) = self.launch() {
            panic!("{} restart failed: {e}", self.core().name);
        }
    }
}

impl<D: Launch> Daemon for D {
    fn port(&self) -> u16 {
        self.core().port
    }

    fn log(&self) -> String {
        self.core().log()
    }

    fn restart_with_host_key(&mut self, key: &Key) {
        self.set_only_host_key(key);
        self.relaunch();
    }
}

/// A private OpenSSH `sshd` on 127.0.0.1, killed on drop.
pub struct Sshd {
    core: DaemonCore,
    host_key: PathBuf,
    authorized_keys: PathBuf,
    extra: Vec<String>,
}

impl Sshd {
    /// Starts sshd with one host key, an AuthorizedKeysFile and extra
    /// sshd_config lines (e.g. `"AcceptEnv LC_*"`).
    pub fn start(host_key: &Key, authorized_keys: &Path, extra: &[&str]) -> Sshd {
        let mut sshd = Sshd {
            core: DaemonCore::new("sshd"),
            host_key: host_key.private.clone(),
            authorized_keys: authorized_keys.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        if is_root() {
            fs::create_dir_all("/run/sshd").expect("mkdir -p /run/sshd");
            fs::set_permissions("/run/sshd", fs::Permissions::from_mode(0o755))
                .expect("chmod /run/sshd");
        }
        sshd.start_on_free_port();
        sshd
    }

    pub fn config_path(&self) -> PathBuf {
        self.core.dir.path().join("sshd_config")
    }
}

impl Launch for Sshd {
    fn core(&self) -> &DaemonCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DaemonCore {
        &mut self.core
    }

    fn set_only_host_key(&mut self, key: &Key) {
        self.host_key = key.private.clone();
    }

    fn launch(&mut self) -> Result<(), String> {
        let port = self.core.port;
        let mut cfg = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nUsePAM no\nStrictModes no\n\
             AuthorizedKeysFile {}\nPidFile none\nLogLevel VERBOSE\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n",
            self.host_key.display(),
            self.authorized_keys.display()
        );
        for l in &self.extra {
            cfg.push_str(l);
            cfg.push('\n');
        }
        let cfg_path = self.config_path();
        write_file(&cfg_path, cfg, 0o644);
        let mut cmd = Command::new(SSHD);
        cmd.arg("-D").arg("-e").arg("-f").arg(&cfg_path);
        let marker = format!("Server listening on 127.0.0.1 port {port}.");
        self.core.spawn(cmd, Some(&marker))
    }
}

/// Options for [`Skiffd::start_with`].
#[derive(Clone, Debug)]
pub struct SkiffdOptions {
    /// `--host-key` arguments; none lets skiffd create its own key in its
    /// state directory ([`Skiffd::state_home`]).
    pub host_keys: Vec<PathBuf>,
    pub authorized_keys: PathBuf,
    /// Content of the `--config` file, if any.
    pub config: Option<String>,
    pub verbose: bool,
    /// More addresses to listen on, with the same port as 127.0.0.1 (on
    /// Linux every 127.x.y.z is a local address).
    pub also_listen: Vec<std::net::Ipv4Addr>,
    /// A program and its arguments that start skiffd, whose own command
    /// line follows them (`unshare --mount ...`); empty: skiffd itself.
    pub wrapper: Vec<OsString>,
    /// The open-file limit (soft, hard) skiffd starts with.
    pub open_files: Option<(u64, u64)>,
}

impl SkiffdOptions {
    pub fn new(host_key: &Key, authorized_keys: &Path) -> Self {
        SkiffdOptions {
            host_keys: vec![host_key.private.clone()],
            authorized_keys: authorized_keys.to_path_buf(),
            config: None,
            verbose: true,
            also_listen: Vec::new(),
            wrapper: Vec::new(),
            open_files: None,
        }
    }

    /// Starts skiffd through `program` and `args` (see [`Self::wrapper`]).
    pub fn wrapped<I, S>(mut self, program: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.wrapper = std::iter::once(OsString::from(program))
            .chain(args.into_iter().map(|a| a.as_ref().to_os_string()))
            .collect();
        self
    }

    pub fn open_files(mut self, soft: u64, hard: u64) -> Self {
        self.open_files = Some((soft, hard));
        self
    }

    pub fn also_listen(mut self, addrs: impl IntoIterator<Item = std::net::Ipv4Addr>) -> Self {
        self.also_listen.extend(addrs);
        self
    }

    pub fn config(mut self, text: &str) -> Self {
        self.config = Some(text.to_string());
        self
    }

    pub fn host_key(mut self, key: &Key) -> Self {
        self.host_keys.push(key.private.clone());
        self
    }

    /// No `--host-key`: skiffd uses (and on first start creates) the key
    /// in `$XDG_STATE_HOME/skiffd`.
    pub fn own_host_key(mut self) -> Self {
        self.host_keys.clear();
        self
    }
}

/// A `skiffd` on 127.0.0.1, killed on drop.
pub struct Skiffd {
    core: DaemonCore,
    opts: SkiffdOptions,
}

impl Skiffd {
    /// `skiffd --listen 127.0.0.1:PORT --host-key KEY --authorized-keys PATH -v`.
    pub fn start(host_key: &Key, authorized_keys: &Path) -> Skiffd {
        Self::start_with(SkiffdOptions::new(host_key, authorized_keys))
    }

    pub fn start_with(opts: SkiffdOptions) -> Skiffd {
        let mut d = Skiffd {
            core: DaemonCore::new("skiffd"),
            opts,
        };
        fs::create_dir(d.state_home()).expect("mkdir state");
        d.start_on_free_port();
        d
    }

    /// The `XDG_STATE_HOME` skiffd runs with (a private directory).
    pub fn state_home(&self) -> PathBuf {
        self.core.dir.path().join("state")
    }

    /// Stops skiffd and starts it again on the same port with the same
    /// options.
    pub fn restart(&mut self) {
        self.relaunch();
    }

    /// Kills skiffd (SIGKILL) and reaps it; its session processes live on
    /// until their connections end, as with sshd.
    pub fn kill(&mut self) {
        self.core.proc.take();
    }

    /// The running skiffd's process id.
    pub fn pid(&self) -> u32 {
        self.core
            .proc
            .as_ref()
            .expect("skiffd is running")
            .child
            .id()
    }
}

impl Launch for Skiffd {
    fn core(&self) -> &DaemonCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DaemonCore {
        &mut self.core
    }

    fn set_only_host_key(&mut self, key: &Key) {
        self.opts.host_keys = vec![key.private.clone()];
    }

    fn launch(&mut self) -> Result<(), String> {
        let seq = LAUNCH_SEQ.fetch_add(1, Ordering::Relaxed);
        let mut cmd = match self.opts.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(skiffd_bin());
                cmd
            }
            None => Command::new(skiffd_bin()),
        };
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.core.port))
            .arg("--authorized-keys")
            .arg(&self.opts.authorized_keys);
        for addr in &self.opts.also_listen {
            cmd.arg("--listen")
                .arg(format!("{addr}:{}", self.core.port));
        }
        for k in &self.opts.host_keys {
            cmd.arg("--host-key").arg(k);
        }
        if let Some(text) = &self.opts.config {
            let path = self.core.dir.path().join(format!("skiffd-{seq}.conf"));
            write_file(&path, text, 0o644);
            cmd.arg("--config").arg(path);
        }
        if self.opts.verbose {
            cmd.arg("-v");
        }
        cmd.env("XDG_STATE_HOME", self.state_home());
        if let Some((soft, hard)) = self.opts.open_files {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: the closure makes one system call (async-signal-safe)
            // on a value copied in before the fork.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        self.core.spawn(cmd, None)
    }
}

// ---------------------------------------------------------------------------
// Test setups shared by the test files
// ---------------------------------------------------------------------------

/// Name of the account the tests log into.
pub fn user() -> &'static str {
    &account().name
}

/// Makes `home` trust `server` and name it `box` in `~/.ssh/config`, with
/// its port, the test account and the fixture's client key.
pub fn name_server_box(home: &ClientHome, server: &dyn Daemon, fx: &Fixture) {
    home.trust(server.port(), &fx.host_key);
    write_file(
        &home.ssh_dir().join("config"),
        format!(
            "Host box\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  BatchMode yes\n  ConnectTimeout 10\n",
            server.port(),
            user(),
            fx.client_key.private.display()
        ),
        0o600,
    );
}

/// A [`Fixture`] and a skiffd serving its keys, or `None` when OpenSSH is
/// missing outside CI (see [`require_openssh`]).
pub fn skiffd_setup() -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    Some((fx, d))
}

/// Like [`skiffd_setup`], with extra keys authorized with options (see
/// [`Fixture::keys_with_options`]) before skiffd starts.
pub fn skiffd_with_keys<const N: usize>(
    specs: [(&str, &str); N],
) -> Option<(Fixture, [Key; N], Skiffd)> {
    skiffd_configured(None, specs)
}

/// Like [`skiffd_with_keys`], with `config` (when given) as skiffd's
/// --config file.
pub fn skiffd_configured<const N: usize>(
    config: Option<&str>,
    specs: [(&str, &str); N],
) -> Option<(Fixture, [Key; N], Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let keys = fx.keys_with_options(specs);
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if let Some(text) = config {
        opts = opts.config(text);
    }
    let d = Skiffd::start_with(opts);
    Some((fx, keys, d))
}

/// A [`Fixture`] and a private sshd serving its keys (plus `extra`
/// sshd_config lines), or `None` as for [`skiffd_setup`].
pub fn sshd_setup(extra: &[&str]) -> Option<(Fixture, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, extra);
    Some((fx, sshd))
}

// ---------------------------------------------------------------------------
// Checks shared by the test files
// ---------------------------------------------------------------------------

/// A remote command that prints the login environment, one item a line:
/// USER, LOGNAME, HOME, SHELL, SSH_CONNECTION, SSH_CLIENT, `id -un`,
/// `id -u`, and `path-set` when PATH is set. See [`check_user_env`].
pub const USER_ENV_SCRIPT: &str = r#"printf '%s\n' "$USER" "$LOGNAME" "$HOME" "$SHELL" "$SSH_CONNECTION" "$SSH_CLIENT"; id -un; id -u; test -n "$PATH" && echo path-set"#;

/// Checks the output of [`USER_ENV_SCRIPT`] run as [`account`] over a
/// connection to 127.0.0.1:`port`: exit 0 and every item as expected.
pub fn check_user_env(out: &CmdOutput, port: u16, c: &str) {
    let acct = account();
    out.expect_code(0, c);
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 9, "{c}: unexpected output\n{out}");
    assert_eq!(lines[0], acct.name, "{c}: USER\n{out}");
    assert_eq!(lines[1], acct.name, "{c}: LOGNAME\n{out}");
    assert_eq!(lines[2], acct.home.to_string_lossy(), "{c}: HOME\n{out}");
    assert_eq!(lines[3], acct.shell, "{c}: SHELL\n{out}");
    check_ssh_connection(lines[4], lines[5], port, c);
    assert_eq!(lines[6], acct.name, "{c}: id -un\n{out}");
    assert_eq!(lines[7], acct.uid.to_string(), "{c}: id -u\n{out}");
    assert_eq!(lines[8], "path-set", "{c}: PATH\n{out}");
}

/// Checks `SSH_CONNECTION` ("cip cport sip sport") and `SSH_CLIENT`
/// ("cip cport sport") for a loopback connection to `port`.
pub fn check_ssh_connection(conn: &str, client: &str, port: u16, c: &str) {
    let f: Vec<&str> = conn.split(' ').collect();
    assert_eq!(f.len(), 4, "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[0], "127.0.0.1", "{c}: SSH_CONNECTION={conn:?}");
    let cport: u16 = f[1]
        .parse()
        .unwrap_or_else(|_| panic!("{c}: SSH_CONNECTION client port {conn:?}"));
    assert_ne!(cport, 0, "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[2], "127.0.0.1", "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[3], port.to_string(), "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(
        client,
        format!("127.0.0.1 {cport} {port}"),
        "{c}: SSH_CLIENT must match SSH_CONNECTION ({conn:?})"
    );
}

/// `ssh-keygen -s CA -I ID -n PRINCIPALS -V -5m:+1h MORE PUBLIC`: a user
/// certificate for `public`, written beside it as `...-cert.pub`.
pub fn sign_user_key(ca: &Key, public: &Path, id: &str, principals: &str, more: &[&str]) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-s"])
        .arg(&ca.private)
        .args(["-I", id, "-n", principals, "-V", "-5m:+1h"])
        .args(more)
        .arg(public)
        .output()
        .expect("run ssh-keygen -s");
    assert!(
        out.status.success(),
        "ssh-keygen -s: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A copy of `key` named `name` in the fixture, with `name-cert.pub`
/// beside it (see [`sign_user_key`]; `more` such as `-O OPTION` or `-z
/// SERIAL`).
pub fn user_certificate_copy(
    fx: &Fixture,
    ca: &Key,
    key: &Key,
    name: &str,
    (id, principals): (&str, &str),
    more: &[&str],
) -> Key {
    let private = fx.path().join(name);
    fs::copy(&key.private, &private).expect("copy the private key");
    let public = fx.path().join(format!("{name}.pub"));
    fs::copy(&key.public, &public).expect("copy the public key");
    sign_user_key(ca, &public, id, principals, more);
    Key {
        private,
        public,
        kind: key.kind,
    }
}

/// Writes the key revocation list `krl` from the `ssh-keygen -k`
/// specification file `spec` (lines `serial:`, `id:`, `key:`, `hash:`),
/// with `ca` as the CA its certificate lines are for.
pub fn make_krl(krl: &Path, ca: Option<&Key>, spec: &Path) {
    let mut cmd = Command::new("ssh-keygen");
    cmd.args(["-q", "-k", "-f"]).arg(krl);
    if let Some(ca) = ca {
        cmd.arg("-s").arg(&ca.public);
    }
    let out = cmd.arg(spec).output().expect("run ssh-keygen -k");
    assert!(
        out.status.success(),
        "ssh-keygen -k: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs skiffd with `config` and `host_key` on a free port, for a
/// configuration it must refuse: returns once it exits (at most 20 s).
pub fn skiffd_with_bad_config(host_key: &Key, config: &Path) -> CmdOutput {
    Run::new(skiffd_bin())
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--host-key")
        .arg(&host_key.private)
        .arg("--config")
        .arg(config)
        .timeout(Duration::from_secs(20))
        .run()
}

/// A scratch directory the test account owns (when the tests run as root
/// and log in as that account), for remote commands to write in.
pub fn account_dir() -> TempDir {
    let dir = tempdir();
    if is_root() {
        let acct = account();
        std::os::unix::fs::chown(dir.path(), Some(acct.uid), Some(acct.gid))
            .expect("chown account dir");
    }
    dir
}

/// True when `line` (a `tty` output line, `\r` allowed at the end) is a
/// pseudo-terminal path `/dev/pts/N`.
pub fn is_pts_path(line: &str) -> bool {
    let n = line
        .trim_end_matches('\r')
        .strip_prefix("/dev/pts/")
        .unwrap_or("");
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
}

// ---------------------------------------------------------------------------
// ssh-agent
// ---------------------------------------------------------------------------

/// A private `ssh-agent -D -a SOCK`, killed on drop.
pub struct Agent {
    pub sock: PathBuf,
    _dir: TempDir,
    proc: DaemonProc,
}

impl Agent {
    pub fn start() -> Agent {
        let dir = tempdir();
        let sock = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ssh-agent");
        let mut agent = Agent {
            sock,
            _dir: dir,
            proc: DaemonProc { child },
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(st)) = agent.proc.child.try_wait() {
                panic!("ssh-agent exited early: {st}");
            }
            // `ssh-add -l` exits 2 when it cannot reach the agent, 1 when
            // the agent holds no identities.
            if agent.sock.exists() && agent.ssh_add(&["-l"], None).code != 2 {
                return agent;
            }
            assert!(
                Instant::now() < deadline,
                "ssh-agent not ready after {START_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn ssh_add(&self, args: &[&str], askpass: Option<&Path>) -> CmdOutput {
        let mut run = Run::new("ssh-add")
            .env("SSH_AUTH_SOCK", &self.sock)
            .env_remove("DISPLAY")
            .args(args)
            .timeout(Duration::from_secs(30));
        if let Some(p) = askpass {
            run = run.askpass(p);
        }
        run.run()
    }

    /// `ssh-add KEY` (unencrypted key).
    pub fn add(&self, key: &Key) {
        let path = key.private.to_string_lossy().into_owned();
        self.ssh_add(&[&path], None)
            .expect_code(0, "ssh-add unencrypted key");
    }

    /// `ssh-add KEY` for an encrypted key, the passphrase coming from an
    /// askpass program.
    pub fn add_encrypted(&self, key: &Key, askpass: &Path) {
        let path = key.private.to_string_lossy().into_owned();
        self.ssh_add(&[&path], Some(askpass))
            .expect_code(0, "ssh-add encrypted key");
    }

    /// `ssh-add -L`: the public keys the agent holds.
    pub fn list(&self) -> String {
        self.ssh_add(&["-L"], None).stdout_str()
    }
}

// ---------------------------------------------------------------------------
// Common fixture: keys + authorized_keys in one directory
// ---------------------------------------------------------------------------

/// authorized_keys options of a key whose forced command echoes
/// `forced` and the requested command (see [`Fixture::keys_with_options`]).
pub const FORCED_ECHO: &str = "command=\"echo forced $SSH_ORIGINAL_COMMAND\"";

/// Two keys for [`Fixture::keys_with_options`]: one only usable from
/// 10.9.9.9 (so never from the tests), one only from 127.0.0.1.
pub const FROM_LIMITED_AND_LOOPBACK: [(&str, &str); 2] = [
    ("from_limited", "from=\"10.9.9.9\""),
    ("from_loopback", "from=\"127.0.0.1\""),
];

/// Passphrase of [`Fixture::encrypted_key`].
pub const PASSPHRASE: &str = "skiffpass123";

/// A directory holding a host key, several client keys and an
/// authorized_keys file. Every client key except `stranger_key` is
/// authorized; generate extra keys and call [`Fixture::set_authorized`]
/// *before* starting a server.
pub struct Fixture {
    pub dir: TempDir,
    pub host_key: Key,
    /// Unencrypted ed25519 key.
    pub client_key: Key,
    pub rsa_key: Key,
    pub ecdsa_key: Key,
    /// ed25519 key encrypted with [`PASSPHRASE`].
    pub encrypted_key: Key,
    /// A key that is in no authorized_keys file.
    pub stranger_key: Key,
    pub authorized_keys: PathBuf,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempdir();
        let p = dir.path();
        let fx = Fixture {
            host_key: keygen(p, "host_ed25519", KeyType::Ed25519, None),
            client_key: keygen(p, "client_ed25519", KeyType::Ed25519, None),
            rsa_key: keygen(p, "client_rsa", KeyType::Rsa, None),
            ecdsa_key: keygen(p, "client_ecdsa", KeyType::Ecdsa, None),
            encrypted_key: keygen(p, "client_encrypted", KeyType::Ed25519, Some(PASSPHRASE)),
            stranger_key: keygen(p, "stranger", KeyType::Ed25519, None),
            authorized_keys: p.join("authorized_keys"),
            dir,
        };
        fx.set_authorized(&fx.standard_authorized_lines());
        fx
    }

    /// authorized_keys lines for every key except the stranger's.
    pub fn standard_authorized_lines(&self) -> Vec<String> {
        [
            &self.client_key,
            &self.rsa_key,
            &self.ecdsa_key,
            &self.encrypted_key,
        ]
        .iter()
        .map(|k| k.pub_line())
        .collect()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A further key pair in the fixture directory.
    pub fn keygen(&self, name: &str, kind: KeyType, passphrase: Option<&str>) -> Key {
        keygen(self.dir.path(), name, kind, passphrase)
    }

    /// Replaces authorized_keys.
    pub fn set_authorized(&self, lines: &[String]) {
        write_authorized_keys(&self.authorized_keys, lines);
    }

    /// Replaces authorized_keys with the standard lines plus `extra`.
    pub fn authorize_extra(&self, extra: &[String]) {
        let mut lines = self.standard_authorized_lines();
        lines.extend(extra.iter().cloned());
        self.set_authorized(&lines);
    }

    /// Generates one ed25519 key per `(name, options)` and replaces
    /// authorized_keys with the standard lines plus `options KEY` for each
    /// (e.g. `("forced", "command=\"echo hi\"")`).
    pub fn keys_with_options<const N: usize>(&self, specs: [(&str, &str); N]) -> [Key; N] {
        let keys = specs.map(|(name, _)| self.keygen(name, KeyType::Ed25519, None));
        let lines: Vec<String> = specs
            .iter()
            .zip(&keys)
            .map(|((_, options), key)| format!("{options} {}", key.pub_line()))
            .collect();
        self.authorize_extra(&lines);
        keys
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------
// The agent
// ---------------------------------------------------------------------------

/// A private runtime directory (XDG_RUNTIME_DIR) for one test's agent; the
/// agent is stopped, and if need be killed, on drop.
pub struct AgentHome {
    pub runtime: tempfile::TempDir,
    pub home: ClientHome,
}

impl AgentHome {
    pub fn new() -> Self {
        let runtime = tempfile::Builder::new()
            .prefix("skiff-rt-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        AgentHome {
            runtime,
            home: ClientHome::new(),
        }
    }

    pub fn agent_dir(&self) -> PathBuf {
        self.runtime.path().join("skiff")
    }

    /// `skiff exec` through this test's agent.
    pub fn exec(&self, port: u16, key: &Key) -> SkiffExec {
        skiff_exec(&self.home, port, user(), Some(key))
            .env("SKIFF_AGENT", "on")
            .env("XDG_RUNTIME_DIR", self.runtime.path())
            .env("XDG_STATE_HOME", self.home.path().join("state"))
    }

    /// `skiff agent ARGS` for this test's agent.
    pub fn agent_cmd(&self, args: &[&str]) -> CmdOutput {
        Run::new(skiff_bin())
            .arg("agent")
            .args(args)
            .env("HOME", self.home.path())
            .env("XDG_RUNTIME_DIR", self.runtime.path())
            .timeout(Duration::from_secs(20))
            .run()
    }

    /// PIDs of agent processes serving this test's directory.
    pub fn agent_pids(&self) -> Vec<u32> {
        let pattern = format!("agent --foreground --dir {}", self.agent_dir().display());
        let out = Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .expect("pgrep");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for AgentHome {
    fn drop(&mut self) {
        let _ = self.agent_cmd(&["stop"]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.agent_pids().is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        for pid in self.agent_pids() {
            // SAFETY: kill(2) on a leftover agent of this test.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

// ---------------------------------------------------------------------------
// skiffd helper modes run as the test account
// ---------------------------------------------------------------------------

/// True when every directory above `path` lets others through and `path`
/// lets others run it: the test account can then start this skiffd.
pub fn runnable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mode = |p: &Path| fs::metadata(p).map(|m| m.mode()).unwrap_or(0);
    mode(path) & 0o005 == 0o005 && path.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
}

/// The skiffd the test account can run: the one under test, or (when a
/// directory above it is closed to others, a checkout under a private home
/// say) a copy in a directory it can reach.
pub fn account_skiffd() -> &'static Path {
    static EXE: OnceLock<(Option<TempDir>, PathBuf)> = OnceLock::new();
    let (_, path) = EXE.get_or_init(|| {
        let bin = PathBuf::from(skiffd_bin());
        if !is_root() || runnable_by_others(&bin) {
            return (None, bin);
        }
        let dir = tempdir();
        let copy = dir.path().join("skiffd");
        fs::copy(&bin, &copy).expect("copy skiffd");
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod skiffd copy");
        (Some(dir), copy)
    });
    path
}

/// The `--config` text skiffd needs to serve SFTP here: nothing when the
/// default (skiffd's own path) works, else a `Subsystem sftp` line naming
/// the copy.
pub fn sftp_subsystem_config() -> Option<String> {
    let exe = account_skiffd();
    (exe != Path::new(skiffd_bin()))
        .then(|| format!("Subsystem sftp '{}' --sftp-server\n", exe.display()))
}

/// Stock `sftp -b BATCH` as the test account against 127.0.0.1:`port`
/// with `key`, host keys unchecked.
pub fn stock_sftp_batch(port: u16, key: &Key, batch: &Path) -> CmdOutput {
    Run::new("sftp")
        .args(["-F", "/dev/null", "-b"])
        .arg(batch)
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-i")
        .arg(&key.private)
        .args(["-P", &port.to_string()])
        .arg(format!("{}@127.0.0.1", user()))
        .run()
}

/// Like [`sftp_subsystem_config`], for the data plane's `transfer@skiff`.
pub fn transfer_subsystem_config() -> Option<String> {
    let exe = account_skiffd();
    (exe != Path::new(skiffd_bin())).then(|| {
        format!(
            "Subsystem transfer@skiff '{}' --transfer-server\n",
            exe.display()
        )
    })
}
