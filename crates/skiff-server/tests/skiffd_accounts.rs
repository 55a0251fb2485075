//! skiffd's account policy and session terminals, against real skiffd
//! running as root and stock OpenSSH clients: an expired account is refused
//! (and an unexpired one served), `/etc/nologin` keeps everyone but root
//! out and shows its notice, an account whose shell is `nologin` runs no
//! command yet can still use an SFTP-only login, and a session's terminal
//! belongs to the account until the session ends.
//!
//! Every test makes its own accounts (unique names, removed afterwards);
//! `/etc/nologin` exists only inside a private mount namespace that skiffd
//! runs in. These need root, as CI has: elsewhere they skip with a notice.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// Whether the test can run: root (to make accounts) and OpenSSH. Under
/// CI a missing piece is a failure.
fn can_run() -> bool {
    if !is_root() {
        let msg = "making test accounts needs root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return false;
    }
    require_openssh()
}

/// `ssh NAME@127.0.0.1 COMMAND` with the fixture's client key.
fn login(d: &Skiffd, name: &str, key: &Key, command: &str) -> CmdOutput {
    ssh(d.port(), name, key).args(&[command]).run()
}

/// The `sp_expire` field of `name`'s shadow line.
fn expire_field(name: &str) -> Option<String> {
    shadow_fields(name).and_then(|f| f.get(7).cloned())
}

#[test]
fn expired_accounts_are_refused_and_unexpired_ones_log_in() {
    if !can_run() {
        return;
    }
    let acct = TempAccount::create("exp", "/bin/sh");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);

    let logs_in = |what: &str| {
        let c = ctx(&d, &format!("{name}: {what}"));
        login(&d, &name, &fx.client_key, "echo in")
            .expect_code(0, &c)
            .expect_stdout("in\n", &c);
    };
    let refused = |what: &str, date: &str| {
        let c = ctx(&d, &format!("{name}: {what}"));
        let out = login(&d, &name, &fx.client_key, "echo in");
        out.expect_code(255, &c).expect_stdout("", &c);
        assert!(
            out.stderr.contains("Permission denied (publickey)"),
            "{c}: refused like a wrong key\n{out}"
        );
        let needle = format!("refusing login: account has expired (its expiry date is {date})");
        assert!(
            d.log()
                .lines()
                .any(|l| l.contains(&needle) && l.contains(&name)),
            "{c}: skiffd must log {needle:?}"
        );
    };

    logs_in("no expiry date");
    // An expiry date to come changes nothing.
    acct.admin(&["usermod", "-e", "2999-01-01", &name], || {
        expire_field(&name).is_some_and(|f| !f.is_empty() && f != "1")
    });
    logs_in("expiry date in 2999");

    acct.admin(&["usermod", "-e", "1", &name], || {
        expire_field(&name).as_deref() == Some("1")
    });
    refused("usermod -e 1", "1970-01-02");

    acct.admin(&["chage", "-E", "0", &name], || {
        expire_field(&name).as_deref() == Some("0")
    });
    refused("chage -E 0", "1970-01-01");

    // Lifting the date lets the account in again.
    acct.admin(&["chage", "-E", "-1", &name], || {
        expire_field(&name).as_deref() == Some("")
    });
    logs_in("expiry date removed");
}

/// The skiffd wrapper that runs it in a mount namespace of its own, where
/// `/etc` is an overlay of the real one holding `/etc/nologin` with
/// `notice` (the real `/etc` is never touched).
fn nologin_namespace(scratch: &Path, notice: &[u8]) -> Vec<String> {
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    std::fs::create_dir(&upper).unwrap();
    std::fs::create_dir(&work).unwrap();
    let notice_file = scratch.join("notice");
    write_file(&notice_file, notice, 0o644);
    let script = format!(
        "set -e; mount -t overlay skiff-test-etc -o lowerdir=/etc,upperdir={},workdir={} /etc; \
         cp {} /etc/nologin; exec \"$@\"",
        upper.display(),
        work.display(),
        notice_file.display()
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

#[test]
fn nologin_file_keeps_everyone_but_root_out_and_shows_its_notice() {
    if !can_run() || !require_tool("unshare", "util-linux") {
        return;
    }
    assert!(
        !Path::new("/etc/nologin").exists(),
        "/etc/nologin exists on this machine: every login test would fail"
    );
    let acct = TempAccount::create("nol", "/bin/sh");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let scratch = tempdir();
    let notice = b"Down for maintenance until 18:00.\nAsk ops@example.org.\n\x1b[2Jgone?\n";
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .wrapped("unshare", nologin_namespace(scratch.path(), notice)),
    );
    assert!(
        !Path::new("/etc/nologin").exists(),
        "the notice leaked out of skiffd's namespace"
    );

    let c = ctx(&d, &format!("{name} while /etc/nologin exists"));
    let out = login(&d, &name, &fx.client_key, "echo in");
    out.expect_code(255, &c).expect_stdout("", &c);
    for line in [
        "Down for maintenance until 18:00.\nAsk ops@example.org.\n",
        "\\u{1b}[2Jgone?",
    ] {
        assert!(
            out.stderr.contains(line),
            "{c}: ssh must show {line:?}\n{out}"
        );
    }
    assert!(
        !out.stderr.contains('\x1b'),
        "{c}: the notice's control bytes reached the terminal\n{out}"
    );
    assert!(
        d.log()
            .lines()
            .any(|l| l.contains("refusing login: /etc/nologin exists") && l.contains(&name)),
        "{c}: skiffd must log the reason"
    );

    // skiff shows the notice too (on one line, as its errors are).
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let out = skiff_exec(&home, d.port(), &name, Some(&fx.client_key))
        .cmd("echo in")
        .run();
    let c = ctx(&d, &format!("skiff as {name} while /etc/nologin exists"));
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(
        out.stderr.contains(
            "the server closed the connection: Down for maintenance until 18:00.\\nAsk ops@example.org."
        ),
        "{c}\n{out}"
    );

    // The notice is for those who proved their key, not for anyone.
    let c = ctx(&d, &format!("{name} with a wrong key"));
    let out = login(&d, &name, &fx.stranger_key, "echo in");
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains("Permission denied (publickey)") && !out.stderr.contains("maintenance"),
        "{c}\n{out}"
    );

    // Root may still log in, as with sshd.
    let c = ctx(&d, "root while /etc/nologin exists");
    login(
        &d,
        "root",
        &fx.client_key,
        "echo in; test -e /etc/nologin && echo closed",
    )
    .expect_code(0, &c)
    .expect_stdout("in\nclosed\n", &c);
}

/// Stock `sftp -b` with `commands` as `name`.
fn sftp_as(d: &Skiffd, name: &str, key: &Key, scratch: &Path, commands: &[String]) -> CmdOutput {
    let batch = scratch.join("batch");
    write_file(&batch, commands.join("\n") + "\n", 0o644);
    stock_sftp_batch_as(d.port(), name, key, &batch)
}

#[test]
fn a_nologin_shell_runs_nothing_but_sftp_only_logins_still_work() {
    if !can_run() {
        return;
    }
    let acct = TempAccount::create("nsh", "/usr/sbin/nologin");
    let name = acct.name().to_string();
    let home = acct.account.home.clone();
    let fx = Fixture::new();
    let scratch = tempdir();
    let sftp_config = sftp_subsystem_config().unwrap_or_default();

    // No ForceCommand: the account authenticates, and every command,
    // shell or subsystem that would go through its shell is refused with
    // nologin's words.
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&sftp_config),
    );
    let c = ctx(&d, &format!("{name} (nologin) runs a command"));
    let marker = home.join("ran");
    let out = login(
        &d,
        &name,
        &fx.client_key,
        &format!("touch {}", marker.display()),
    );
    out.expect_code(1, &c).expect_stdout("", &c);
    assert!(
        out.stderr
            .contains("This account is currently not available."),
        "{c}: the client is told why\n{out}"
    );
    assert!(!marker.exists(), "{c}: the command ran");
    assert!(
        d.log().lines().any(|l| l
            .contains("refusing session: the account's shell /usr/sbin/nologin runs nothing")
            && l.contains(&name)),
        "{c}: skiffd must log the reason"
    );
    let c = ctx(
        &d,
        &format!("{name} (nologin) asks for a terminal and a shell"),
    );
    let out = ssh(d.port(), &name, &fx.client_key).flag("-tt").run();
    out.expect_code(1, &c);
    assert!(
        out.stdout_str()
            .contains("This account is currently not available.")
            || out
                .stderr
                .contains("This account is currently not available."),
        "{c}\n{out}"
    );
    let c = ctx(
        &d,
        &format!("{name} (nologin) without ForceCommand asks for SFTP"),
    );
    let out = sftp_as(&d, &name, &fx.client_key, scratch.path(), &["pwd".into()]);
    assert_ne!(out.code, 0, "{c}\n{out}");
    drop(d);

    // ForceCommand internal-sftp: skiffd's SFTP server needs no shell.
    let config = format!("{sftp_config}Match User {name}\n  ForceCommand internal-sftp\n");
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let c = ctx(
        &d,
        &format!("{name} (nologin) with ForceCommand internal-sftp"),
    );
    let (sent, got) = (scratch.path().join("sent"), scratch.path().join("got"));
    write_file(&sent, "uploaded\n", 0o644);
    let out = sftp_as(
        &d,
        &name,
        &fx.client_key,
        scratch.path(),
        &[
            format!("put {} up.txt", sent.display()),
            format!("get up.txt {}", got.display()),
            "pwd".into(),
        ],
    );
    out.expect_code(0, &c);
    assert!(
        out.stdout_str()
            .contains(&format!("Remote working directory: {}", home.display())),
        "{c}: starts in the home directory\n{out}"
    );
    let landed = home.join("up.txt");
    assert_eq!(
        std::fs::read_to_string(&landed).unwrap(),
        "uploaded\n",
        "{c}"
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "uploaded\n", "{c}");
    assert_eq!(
        std::fs::metadata(&landed).unwrap().uid(),
        acct.account.uid,
        "{c}: written as the account"
    );
    drop(d);

    // The same in a ChrootDirectory jail.
    let jail = tempfile::Builder::new()
        .prefix("skiff-jail-")
        .tempdir_in(jail_base().expect("root"))
        .expect("make a jail");
    std::fs::set_permissions(jail.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let upload = jail.path().join("upload");
    std::fs::create_dir(&upload).unwrap();
    std::os::unix::fs::chown(&upload, Some(acct.account.uid), Some(acct.account.gid)).unwrap();
    let config = format!(
        "{sftp_config}Match User {name}\n  ChrootDirectory {}\n  ForceCommand internal-sftp\n",
        jail.path().display()
    );
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let c = ctx(
        &d,
        &format!("{name} (nologin) jailed with ForceCommand internal-sftp"),
    );
    let out = sftp_as(
        &d,
        &name,
        &fx.client_key,
        scratch.path(),
        &[format!("put {} /upload/in-jail.txt", sent.display())],
    );
    out.expect_code(0, &c);
    assert_eq!(
        std::fs::read_to_string(upload.join("in-jail.txt")).unwrap(),
        "uploaded\n",
        "{c}"
    );
}

/// Owner, group and permission bits of a file.
fn ownership(meta: &std::fs::Metadata) -> (u32, u32, u32) {
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

/// Owner, group and mode the kernel gives a new terminal a root process
/// opens here (what a session's terminal is given back as).
fn fresh_terminal_ownership() -> (u32, u32, u32) {
    // SAFETY: posix_openpt returns a new descriptor we own (closed below);
    // unlockpt and ptsname_r only use it, ptsname_r writes into `name`
    // within its length.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let mut name = [0 as libc::c_char; 128];
        let ok = libc::unlockpt(fd) == 0 && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0;
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        let meta = std::fs::metadata(&path);
        libc::close(fd);
        assert!(ok, "unlockpt or ptsname_r failed");
        ownership(&meta.unwrap_or_else(|e| panic!("stat {path}: {e}")))
    }
}

#[test]
fn a_session_terminal_belongs_to_the_account_until_the_session_ends() {
    if !can_run() {
        return;
    }
    let acct = TempAccount::create("pty", "/bin/sh");
    let name = acct.name().to_string();
    let tty_gid = Command::new("getent")
        .args(["group", "tty"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split(':')
                .nth(2)
                .and_then(|g| g.trim().parse::<u32>().ok())
        });
    let (group, group_name, mode) = match tty_gid {
        Some(gid) => (gid, "tty".to_string(), 0o620),
        None => (acct.account.gid, name.clone(), 0o600),
    };
    let found = fresh_terminal_ownership();
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let c = ctx(&d, &format!("{name}'s terminal"));

    // The session reports its terminal, then waits for a line.
    let child = Command::new("ssh")
        .args(["-F", "/dev/null", "-tt", "-o", "BatchMode=yes"])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
        .arg("-i")
        .arg(&fx.client_key.private)
        .args(["-p", &d.port().to_string()])
        .arg(format!("{name}@127.0.0.1"))
        .arg("stat -c '%U %G %a' \"$(tty)\"; tty; echo \"SSH_TTY=$SSH_TTY\"; read line; echo bye")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ssh");
    let mut child = Reaped(child);
    let child = &mut child.0;
    let (lines_tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx
                .send(line.trim_end_matches('\r').to_string())
                .is_err()
            {
                break;
            }
        }
    });
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{c}: no line from the session: {e}"))
    };
    let owner = next();
    let path = next();
    assert!(is_pts_path(&path), "{c}: {path:?} is not a terminal");
    // As sshd, the session is told its terminal's name.
    assert_eq!(next(), format!("SSH_TTY={path}"), "{c}: SSH_TTY");
    assert_eq!(
        owner,
        format!("{name} {group_name} {mode:o}"),
        "{c}: stat of the session's own terminal"
    );

    // Hold the device (not open as a terminal) to see it after the
    // session, even once its name is gone or names another terminal.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(&path)
        .unwrap_or_else(|e| panic!("{c}: open {path}: {e}"));
    assert_eq!(
        ownership(&held.metadata().unwrap()),
        (acct.account.uid, group, mode),
        "{c}: during the session"
    );

    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"done\n").unwrap();
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "{c}: the session did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{c}: ssh exited with {status}");
    // Given back before the client heard the session end.
    assert_eq!(
        ownership(&held.metadata().unwrap()),
        found,
        "{c}: after the session the terminal is as the kernel made it"
    );
}

/// A child process killed and reaped when dropped, if it still runs (a
/// test that fails halfway must not leave ssh behind).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
