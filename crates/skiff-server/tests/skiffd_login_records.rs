//! Login records (issue 23): a skiffd session with a terminal is in utmp
//! while it runs (`who`), in wtmp with its logout once it ends (`last`,
//! `utmpdump`) and in lastlog (`lastlog`), as sshd's are; an interactive
//! login is shown "Last login: ..." and /etc/motd (`PrintLastLog`,
//! `PrintMotd`), except with `~/.hushlogin`; a command without a terminal
//! writes no record; a login as an unknown user is in btmp (`lastb`). Stock `ssh` against a root skiffd, each test with
//! accounts of its own.
//!
//! These use the system's own /var/run/utmp, /var/log/wtmp, /var/log/btmp
//! and /var/log/lastlog. skiffd, like sshd, creates none of them: a fresh
//! container may lack utmp, so [`record_files`] makes any that is missing
//! (root:utmp, 0664; btmp 0660), as the system would at boot. /etc/motd is only read.
//! Records are written off the session's path, so what must appear or go
//! is waited for (bounded), never slept on.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const UTMP: &str = "/var/run/utmp";
const WTMP: &str = "/var/log/wtmp";
const BTMP: &str = "/var/log/btmp";
const LASTLOG: &str = "/var/log/lastlog";
/// How long a record may take to appear: wide, records are written at once.
const RECORD_WAIT: Duration = Duration::from_secs(30);

/// Root (for accounts and records), OpenSSH and the record readers; under
/// CI a missing piece is a failure.
fn can_run() -> bool {
    if !is_root() {
        let msg = "writing login records needs root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return false;
    }
    require_openssh()
        && require_tool("who", "coreutils")
        && require_tool("last", "util-linux")
        && require_tool("utmpdump", "util-linux")
        && require_tool("lastlog", "login")
}

/// Makes the record files a booted system has, when missing: root:utmp
/// (root's group where there is no utmp group), mode 0664 (btmp 0660).
fn record_files() {
    for (path, mode) in [
        (UTMP, 0o664),
        (WTMP, 0o664),
        (LASTLOG, 0o664),
        (BTMP, 0o660),
    ] {
        if Path::new(path).exists() {
            continue;
        }
        // Another test may make it meanwhile: create_new tells.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(_) => {
                let group = if Command::new("getent")
                    .args(["group", "utmp"])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                {
                    "root:utmp"
                } else {
                    "root:root"
                };
                let chown = Command::new("chown").args([group, path]).status();
                assert!(chown.is_ok_and(|s| s.success()), "chown {group} {path}");
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                    .unwrap_or_else(|e| panic!("chmod {path}: {e}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("create {path}: {e}"),
        }
    }
}

/// One record of `utmpdump FILE`: type, pid, line, user, host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: u32,
    pid: u32,
    line: String,
    user: String,
    host: String,
}

/// The records of a utmp-format file, as utmpdump prints them
/// (`[7] [01234] [ts/3] [user    ] [pts/3       ] [host   ] [addr ] [time]`).
fn dump(path: &str) -> Vec<Entry> {
    let out = Run::new("utmpdump")
        .arg(path)
        .timeout(Duration::from_secs(30))
        .run();
    out.expect_code(0, &format!("utmpdump {path}"));
    out.stdout_str()
        .lines()
        .filter_map(|l| {
            let fields: Vec<String> = l
                .split("] [")
                .map(|f| f.trim_matches(|c| c == '[' || c == ']').trim().to_string())
                .collect();
            (fields.len() >= 6).then(|| Entry {
                kind: fields[0].parse().unwrap_or(0),
                pid: fields[1].parse().unwrap_or(0),
                line: fields[4].clone(),
                user: fields[3].clone(),
                host: fields[5].clone(),
            })
        })
        .collect()
}

/// Waits (bounded) until `done` holds, then returns its value.
fn wait_for<T>(what: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + RECORD_WAIT;
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {RECORD_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills and reaps the client when dropped.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An interactive `ssh -tt NAME@127.0.0.1` (a shell, no command), its
/// output lines (CR removed) arriving on a channel.
struct Shell {
    client: Client,
    input: ChildStdin,
    lines: mpsc::Receiver<String>,
    /// Everything read so far.
    seen: Vec<String>,
}

impl Shell {
    fn start(d: &Skiffd, name: &str, key: &Key) -> Shell {
        let mut child = Command::new("ssh")
            .args(["-F", "/dev/null", "-tt", "-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=no"])
            .args(["-o", "UserKnownHostsFile=/dev/null"])
            .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
            .arg("-i")
            .arg(&key.private)
            .args(["-p", &d.port().to_string()])
            .arg(format!("{name}@127.0.0.1"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ssh");
        let input = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim_end_matches('\r').to_string()).is_err() {
                    break;
                }
            }
        });
        Shell {
            client: Client(child),
            input,
            lines,
            seen: Vec::new(),
        }
    }

    /// Runs `command` in the shell and returns its output (one line),
    /// found between markers: the prompt may come before it on its line,
    /// and the terminal echoes the command as typed, where the quotes
    /// split the markers.
    fn run(&mut self, command: &str, c: &str) -> String {
        writeln!(self.input, "printf 'O''UT<%s>T''UO\\n' \"$({command})\"").expect("write to ssh");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "{c}: no output of {command:?} from the shell ({e}); read:\n{}",
                    self.seen.join("\n")
                )
            });
            self.seen.push(line.clone());
            let found = line.find("OUT<").and_then(|at| {
                line[at + 4..]
                    .rfind(">TUO")
                    .map(|end| &line[at + 4..at + 4 + end])
            });
            if let Some(output) = found {
                return output.to_string();
            }
        }
    }

    /// Ends the shell; returns everything it printed.
    fn exit(mut self, c: &str) -> Vec<String> {
        writeln!(self.input, "exit").expect("write to ssh");
        drop(self.input);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.client.0.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => panic!("{c}: ssh did not end: {other:?}"),
            }
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        self.seen
    }
}

/// A shell that prints its terminal and leaves; what it printed.
fn log_in_and_out(d: &Skiffd, name: &str, key: &Key, c: &str) -> Vec<String> {
    let mut shell = Shell::start(d, name, key);
    shell.run("tty", c);
    shell.exit(c)
}

fn mentions_last_login(lines: &[String]) -> bool {
    lines.iter().any(|l| l.contains("Last login: "))
}

/// The first non-blank line of /etc/motd, when there is one.
fn motd_line() -> Option<String> {
    let text = std::fs::read(Path::new("/etc/motd")).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .map(str::trim_end)
        .find(|l| !l.trim().is_empty())
        .map(str::to_string)
}

#[test]
fn a_terminal_session_is_in_utmp_wtmp_and_lastlog_and_the_next_login_is_told() {
    if !can_run() {
        return;
    }
    record_files();
    let acct = TempAccount::create("rec", "/bin/sh");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let c = ctx(&d, &format!("{name}'s first login"));

    let mut shell = Shell::start(&d, &name, &fx.client_key);
    let tty = shell.run("tty", &c);
    assert!(is_pts_path(&tty), "{c}: {tty:?} is not a terminal");
    let line = tty.trim_start_matches("/dev/").to_string();
    // While it runs, utmp has it: `who` lists it, from the client's address.
    let listed = wait_for(&format!("{c}: who lists {name} on {line}"), || {
        let who = Run::new("who").run();
        who.stdout_str()
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&name) && l.contains(&line))
            .map(str::to_string)
    });
    assert!(listed.contains("(127.0.0.1)"), "{c}: who: {listed}");
    let login = dump(UTMP)
        .into_iter()
        .find(|e| e.kind == 7 && e.user == name)
        .unwrap_or_else(|| panic!("{c}: no USER_PROCESS entry for {name} in utmp"));
    assert_eq!(login.line, line, "{c}: {login:?}");
    assert_eq!(login.host, "127.0.0.1", "{c}: {login:?}");
    // The session's process is the one recorded: the shell itself.
    let shell_pid = shell.run("echo $$", &c);
    assert_eq!(
        Some(login.pid),
        shell_pid.trim().parse().ok(),
        "{c}: {login:?}"
    );
    let first = shell.exit(&c);
    assert!(
        !mentions_last_login(&first),
        "{c}: a new account has no last login\n{}",
        first.join("\n")
    );

    // Once it has ended, utmp has the line free, and wtmp has both ends.
    // (Its entry becomes DEAD_PROCESS, or a later login on the line
    // replaces it.)
    wait_for(&format!("{c}: the logout in utmp"), || {
        let entries = dump(UTMP);
        (!entries.iter().any(|e| e.kind == 7 && e.pid == login.pid)).then_some(())
    });
    let who = Run::new("who").run();
    assert!(
        !who.stdout_str()
            .lines()
            .any(|l| l.starts_with(&format!("{name} "))),
        "{c}: who still lists {name}:\n{}",
        who.stdout_str()
    );
    let wtmp = wait_for(&format!("{c}: the logout in wtmp"), || {
        let entries = dump(WTMP);
        let at = entries
            .iter()
            .position(|e| e.kind == 7 && e.user == name && e.line == line)?;
        entries[at..]
            .iter()
            .any(|e| e.kind == 8 && e.line == line && e.pid == login.pid)
            .then_some(entries[at].clone())
    });
    assert_eq!(wtmp.host, "127.0.0.1", "{c}: {wtmp:?}");
    // `last` reads them as one login that has ended.
    let last = Run::new("last").args(["-w", "-f", WTMP, &name]).run();
    last.expect_code(0, &c);
    let session = last
        .stdout_str()
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{c}: last shows no login of {name}:\n{last}"));
    assert!(
        session.contains(&line) && session.contains("127.0.0.1"),
        "{c}: last: {session}"
    );
    assert!(!session.contains("still logged in"), "{c}: last: {session}");
    // lastlog has it too.
    let lastlog = Run::new("lastlog").args(["-u", &name]).run();
    lastlog.expect_code(0, &c);
    let record = lastlog
        .stdout_str()
        .lines()
        .find(|l| l.starts_with(&name))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{c}: lastlog: {lastlog}"));
    assert!(
        record.contains(&line) && record.contains("127.0.0.1"),
        "{c}: lastlog: {record}"
    );

    // The next interactive login is told of it, as with sshd.
    let c = ctx(&d, &format!("{name}'s second login"));
    let second = log_in_and_out(&d, &name, &fx.client_key, &c);
    let told = second
        .iter()
        .find(|l| l.contains("Last login: "))
        .unwrap_or_else(|| panic!("{c}: no Last login line:\n{}", second.join("\n")));
    assert!(told.ends_with(" from 127.0.0.1"), "{c}: {told:?}");
    if let Some(motd) = motd_line() {
        assert!(
            second.iter().any(|l| l.contains(&motd)),
            "{c}: /etc/motd ({motd:?}) not shown:\n{}",
            second.join("\n")
        );
    }
}

#[test]
fn hushlogin_and_the_print_settings_quiet_an_interactive_login() {
    if !can_run() {
        return;
    }
    record_files();
    let acct = TempAccount::create("hush", "/bin/sh");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let c = ctx(&d, &format!("{name}: a first login"));
    log_in_and_out(&d, &name, &fx.client_key, &c);
    wait_for(&format!("{c}: in lastlog"), || {
        let out = Run::new("lastlog").args(["-u", &name]).run();
        out.stdout_str().contains("127.0.0.1").then_some(())
    });
    let motd = motd_line();

    // Told, with both settings on (the defaults)...
    let c = ctx(&d, &format!("{name}: PrintMotd and PrintLastLog yes"));
    let told = log_in_and_out(&d, &name, &fx.client_key, &c);
    assert!(mentions_last_login(&told), "{c}:\n{}", told.join("\n"));
    let shows_motd = |lines: &[String]| {
        motd.as_ref()
            .is_some_and(|m| lines.iter().any(|l| l.contains(m.as_str())))
    };
    assert_eq!(
        shows_motd(&told),
        motd.is_some(),
        "{c}:\n{}",
        told.join("\n")
    );

    // ...not with ~/.hushlogin,
    let hush = acct.account.home.join(".hushlogin");
    write_file(&hush, "", 0o644);
    std::os::unix::fs::chown(&hush, Some(acct.account.uid), Some(acct.account.gid)).unwrap();
    let c = ctx(&d, &format!("{name}: with ~/.hushlogin"));
    let quiet = log_in_and_out(&d, &name, &fx.client_key, &c);
    assert!(!mentions_last_login(&quiet), "{c}:\n{}", quiet.join("\n"));
    assert!(!shows_motd(&quiet), "{c}:\n{}", quiet.join("\n"));
    std::fs::remove_file(&hush).unwrap();
    drop(d);

    // ...and each setting turns its part off.
    for (config, last_login, shown_motd) in [
        ("PrintLastLog no\n", false, motd.is_some()),
        ("PrintMotd no\n", true, false),
    ] {
        let d = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config),
        );
        let c = ctx(&d, &format!("{name}: {}", config.trim()));
        let lines = log_in_and_out(&d, &name, &fx.client_key, &c);
        assert_eq!(
            mentions_last_login(&lines),
            last_login,
            "{c}:\n{}",
            lines.join("\n")
        );
        assert_eq!(shows_motd(&lines), shown_motd, "{c}:\n{}", lines.join("\n"));
    }
}

#[test]
fn only_sessions_with_a_terminal_are_recorded_and_only_shells_are_told() {
    if !can_run() {
        return;
    }
    record_files();
    let acct = TempAccount::create("nopty", "/bin/sh");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);

    // A command without a terminal, then one with a terminal: records are
    // written in order, so once the second's logout is in wtmp, anything
    // the first wrote would be there too.
    let c = ctx(&d, &format!("{name}: exec without a terminal"));
    ssh(d.port(), &name, &fx.client_key)
        .args(&["echo no-terminal"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("no-terminal\n", &c);
    let c = ctx(&d, &format!("{name}: a command with a terminal"));
    let with_terminal = || {
        let out = ssh(d.port(), &name, &fx.client_key)
            .flag("-tt")
            .args(&["tty"])
            .run();
        out.expect_code(0, &c);
        let tty = out.stdout_str().trim().to_string();
        assert!(is_pts_path(&tty), "{c}: {out}");
        (out, tty.trim_start_matches("/dev/").to_string())
    };
    let (_, line) = with_terminal();
    let ours = wait_for(&format!("{c}: its login and logout in wtmp"), || {
        let entries = dump(WTMP);
        let logins: Vec<Entry> = entries.iter().filter(|e| e.user == name).cloned().collect();
        let login = logins.last()?;
        entries
            .iter()
            .any(|e| e.kind == 8 && e.line == login.line && e.pid == login.pid)
            .then_some(logins)
    });
    assert_eq!(ours.len(), 1, "{c}: only the terminal's login: {ours:#?}");
    assert_eq!(ours[0].line, line, "{c}: {ours:#?}");
    // A command is not greeted, though there is now a last login to tell of.
    wait_for(&format!("{c}: in lastlog"), || {
        let out = Run::new("lastlog").args(["-u", &name]).run();
        out.stdout_str().contains("127.0.0.1").then_some(())
    });
    let (out, _) = with_terminal();
    assert!(
        !out.stdout_str().contains("Last login: "),
        "{c}: a command is not told of the last login\n{out}"
    );
}

#[test]
fn a_login_as_an_unknown_user_is_in_btmp() {
    if !can_run() {
        return;
    }
    record_files();
    let name = format!("skt-nobody-{}", std::process::id());
    assert!(no_such_account(&name), "{name} exists");
    let fx = Fixture::new();
    let d = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    let c = ctx(&d, &format!("{name}, who has no account"));
    ssh(d.port(), &name, &fx.client_key)
        .args(&["true"])
        .run()
        .expect_code(255, &c);
    let failed = wait_for(&format!("{c}: in btmp"), || {
        dump(BTMP).into_iter().find(|e| e.user == name)
    });
    assert_eq!(failed.kind, 6, "{c}: LOGIN_PROCESS: {failed:?}");
    assert_eq!(failed.line, "ssh:notty", "{c}: {failed:?}");
    assert_eq!(failed.host, "127.0.0.1", "{c}: {failed:?}");
    // The connection's own process, as sshd's: not the listener.
    assert!(
        failed.pid > 0 && failed.pid != d.pid(),
        "{c}: the connection process's pid: {failed:?}"
    );
}

#[test]
fn a_wrong_password_is_in_btmp() {
    if !can_run() || !require_tool("chpasswd", "passwd") {
        return;
    }
    record_files();
    let service = PamService::new(
        "btmp",
        "auth required pam_unix.so\naccount required pam_unix.so\n",
    );
    let acct = TempAccount::with_password("btmp", "/bin/sh", "Right0ne");
    let name = acct.name().to_string();
    let fx = Fixture::new();
    let config = format!("UsePAM yes\nPAMServiceName {}\n", service.name());
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let scratch = tempdir();
    let marker = scratch.path().join("questions");
    let script = askpass_script(scratch.path(), "Wr0ngOne", &marker);
    let c = ctx(&d, &format!("{name}, wrong password"));
    ssh(d.port(), &name, &fx.client_key)
        .askpass(&script)
        .opt("PubkeyAuthentication=no")
        .opt("PreferredAuthentications=password")
        .opt("NumberOfPasswordPrompts=1")
        .args(&["true"])
        .run()
        .expect_code(255, &c);
    let failed = wait_for(&format!("{c}: in btmp"), || {
        dump(BTMP).into_iter().find(|e| e.user == name)
    });
    assert_eq!(failed.line, "ssh:notty", "{c}: {failed:?}");
    assert_eq!(failed.host, "127.0.0.1", "{c}: {failed:?}");
}
