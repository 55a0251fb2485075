//! The local accounts the tests log into: the shared test account
//! (`skiff-test` when running as root, else the current user), accounts a
//! test makes for itself (`TempAccount`), and a scratch directory the test
//! account owns.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::environment::is_root;
use super::files::tempdir;

/// Name of the local account the tests log into when running as root.
pub const TEST_USER: &str = "skiff-test";

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

    /// A new account (as [`Self::create`]) whose password is `password`,
    /// set through `chpasswd`.
    pub fn with_password(tag: &str, shell: &str, password: &str) -> TempAccount {
        let acct = TempAccount::create(tag, shell);
        let before = shadow_fields(acct.name()).and_then(|f| f.get(1).cloned());
        let line = format!("{}:{password}\n", acct.name());
        // chpasswd takes the lock on /etc/shadow: retried while another
        // test process holds it, until the password field has changed.
        acct.admin(&["true"], || {
            let Ok(mut child) = Command::new("chpasswd")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            else {
                return false;
            };
            use std::io::Write;
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(line.as_bytes());
            }
            let _ = child.wait();
            shadow_fields(acct.name()).and_then(|f| f.get(1).cloned()) != before
        });
        acct
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

/// Name of the account the tests log into.
pub fn user() -> &'static str {
    &account().name
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
