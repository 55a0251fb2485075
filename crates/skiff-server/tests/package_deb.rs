//! The Debian package (packaging/build-deb) on this machine, as an
//! administrator would use it: `dpkg -i`, the packaged `skiffd -t` on the
//! packaged configuration, the unit's ExecStart line started by hand on a
//! free loopback port (no systemd here), a login with stock `ssh` that
//! checks sshd's host key, the manual pages rendered by `man -l`,
//! `systemd-analyze verify` of the units, then `dpkg -r` (no skiffd left
//! running, conffiles kept) and `dpkg -P` (conffiles and enablement gone).
//!
//! The package comes from `SKIFF_DEB` (.ci/run builds it and sets it).
//! Unset: under CI=true the test fails, elsewhere it says why and returns.
//! It installs and purges the package `skiff`, so it refuses to run where
//! that package is installed already; it purges it again when it fails.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use skiff_testkit::*;

const PACKAGE: &str = "skiff";
const SKIFFD: &str = "/usr/sbin/skiffd";
const CONFIG: &str = "/etc/skiffd/skiffd_config";
const PAM_SERVICE: &str = "/etc/pam.d/skiffd";
const UNIT: &str = "/lib/systemd/system/skiffd.service";
const SOCKET_UNIT: &str = "/lib/systemd/system/skiffd.socket";
const HOST_KEY: &str = "/etc/ssh/ssh_host_ed25519_key";

/// The .deb to test, or `None` (after a notice) when the test cannot run
/// here; under CI a missing prerequisite is a failure.
fn package_under_test() -> Option<PathBuf> {
    let refuse = |why: &str| -> Option<PathBuf> {
        if in_ci() {
            panic!("{why}; CI=true so this test refuses to skip");
        }
        eprintln!("NOTICE: skipping the package test: {why}");
        None
    };
    let Some(deb) = std::env::var_os("SKIFF_DEB") else {
        return refuse("SKIFF_DEB is not set (build the package with packaging/build-deb and set SKIFF_DEB to the .deb it prints)");
    };
    if !is_root() {
        return refuse("dpkg -i needs root");
    }
    if !require_openssh() || !require_tool("dpkg", "dpkg") {
        return None;
    }
    let deb = PathBuf::from(deb);
    assert!(deb.is_file(), "SKIFF_DEB={} is not a file", deb.display());
    Some(deb)
}

/// `dpkg-query`'s status of the package: `None` when dpkg knows nothing
/// of it (never installed, or purged).
fn package_status() -> Option<String> {
    let out = Run::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .run();
    let status = out.stdout_str().trim().to_string();
    (out.code == 0 && !status.ends_with("not-installed")).then_some(status)
}

/// The package installed for the test: purged on drop, so that a failing
/// test leaves nothing behind (the purge's prerm also stops any skiffd).
struct Installed;

impl Installed {
    fn install(deb: &Path) -> Installed {
        if let Some(status) = package_status() {
            panic!("package {PACKAGE} is already on this machine ({status}); this test installs and purges it: remove it first (dpkg -P {PACKAGE})");
        }
        let installed = Installed;
        let out = Run::new("dpkg")
            .arg("-i")
            .arg(deb)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .timeout(Duration::from_secs(120))
            .run();
        assert_eq!(
            out.code,
            0,
            "dpkg -i {}: {}{}",
            deb.display(),
            out.stdout_str(),
            out.stderr
        );
        installed
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if package_status().is_some() {
            let _ = Command::new("dpkg")
                .args(["-P", PACKAGE])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A process started by the test: killed and reaped on drop.
struct Started {
    child: Option<Child>,
    log: PathBuf,
}

impl Started {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for the process to end, returning how it ended.
    fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The unit's `KEY=` values, in order (`ExecStart`, not `ExecStartPre`).
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim().to_string())
        .collect()
}

/// Starts the unit's ExecStart line as systemd would (no quoting in the
/// packaged unit: words split on spaces), logging to stderr, on
/// 127.0.0.1:`port` only, and waits (bounded) until it accepts
/// connections.
fn start_exec_start(exec_start: &str, port: u16, log: PathBuf) -> Started {
    let words: Vec<&str> = exec_start.split_whitespace().collect();
    assert_eq!(words.first(), Some(&SKIFFD), "ExecStart={exec_start}");
    let child = Command::new(words[0])
        .args(&words[1..])
        .args(["-e", "-o", &format!("ListenAddress=127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("start {exec_start}: {e}"));
    let mut started = Started {
        child: Some(child),
        log,
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = started.wait_for_exit(Duration::ZERO) {
            panic!(
                "{exec_start} exited ({status}) before listening:\n{}",
                started.log()
            );
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return started;
        }
        assert!(
            Instant::now() < deadline,
            "{exec_start} did not listen on {addr} within 30 s:\n{}",
            started.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `key` in `account`'s own ~/.ssh/authorized_keys (skiffd's default
/// AuthorizedKeysFile), owned by the account, with the modes StrictModes
/// wants.
fn authorize(account: &Account, key: &Key) {
    let ssh_dir = account.home.join(".ssh");
    fs::create_dir_all(&ssh_dir).expect("create ~/.ssh");
    fs::set_permissions(&ssh_dir, fs::Permissions::from_mode(0o700)).expect("chmod ~/.ssh");
    let file = ssh_dir.join("authorized_keys");
    write_file(&file, format!("{}\n", key.pub_line()), 0o600);
    for path in [&ssh_dir, &file] {
        chown(path, Some(account.uid), Some(account.gid)).expect("chown");
    }
}

/// Pids of the processes whose executable is /usr/sbin/skiffd (deleted or
/// not).
fn skiffd_processes() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let exe = fs::read_link(e.path().join("exe")).ok()?;
            let exe = exe.to_string_lossy();
            (exe == SKIFFD || exe == format!("{SKIFFD} (deleted)")).then_some(pid)
        })
        .collect()
}

/// The files of the package (`dpkg-deb -c`), as absolute paths.
fn package_files(deb: &Path) -> Vec<String> {
    let out = Run::new("dpkg-deb").arg("-c").arg(deb).run();
    out.expect_code(0, "dpkg-deb -c");
    out.stdout_str()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

/// What the .deb holds and declares, before it is installed.
fn check_package_contents(deb: &Path) {
    let files = package_files(deb);
    for expected in [
        "/usr/bin/skiff",
        SKIFFD,
        UNIT,
        SOCKET_UNIT,
        CONFIG,
        PAM_SERVICE,
        "/usr/share/man/man1/skiff.1.gz",
        "/usr/share/man/man1/skiff-exec.1.gz",
        "/usr/share/man/man1/skiff-run.1.gz",
        "/usr/share/man/man1/skiff-cp.1.gz",
        "/usr/share/man/man1/skiff-agent.1.gz",
        "/usr/share/man/man8/skiffd.8.gz",
        "/usr/share/man/man5/skiffd_config.5.gz",
        "/usr/share/bash-completion/completions/skiff",
        "/usr/share/bash-completion/completions/skiffd",
        "/usr/share/zsh/vendor-completions/_skiff",
        "/usr/share/zsh/vendor-completions/_skiffd",
        "/usr/share/fish/vendor_completions.d/skiff.fish",
        "/usr/share/fish/vendor_completions.d/skiffd.fish",
        "/usr/share/doc/skiff/copyright",
    ] {
        assert!(
            files.iter().any(|f| f == expected),
            "{expected} is not in the package: {files:#?}"
        );
    }
    let depends = Run::new("dpkg-deb").arg("-f").arg(deb).arg("Depends").run();
    depends.expect_code(0, "dpkg-deb -f Depends");
    let depends = depends.stdout_str();
    for library in ["libc6", "libpam0g"] {
        assert!(
            depends.split(',').any(|d| d.trim().starts_with(library)),
            "Depends lacks {library}: {depends}"
        );
    }
    let conffiles = Run::new("dpkg-deb")
        .arg("--info")
        .arg(deb)
        .arg("conffiles")
        .run();
    conffiles.expect_code(0, "dpkg-deb --info conffiles");
    let conffiles = conffiles.stdout_str();
    for conffile in [CONFIG, PAM_SERVICE] {
        assert!(
            conffiles.lines().any(|l| l.trim() == conffile),
            "{conffile} is not a conffile: {conffiles}"
        );
    }
}

/// The installed manual pages render without warnings, and neither they
/// nor the completions mention skiffd's or skiff's hidden options.
fn check_manual_pages() {
    let pages = [
        (
            "/usr/share/man/man1/skiff.1.gz",
            "Fast, secure remote execution",
        ),
        (
            "/usr/share/man/man1/skiff-exec.1.gz",
            "Run a command on one host",
        ),
        ("/usr/share/man/man8/skiffd.8.gz", "skiff SSH server"),
        ("/usr/share/man/man5/skiffd_config.5.gz", "PAMServiceName"),
    ];
    let hidden = [
        "pam-session",
        "sftp-server",
        "generate-docs",
        "spawned-under-lock",
    ];
    // Each with a word of its command line: skiffd's --host-key, skiff's
    // `exec` subcommand.
    let completions = [
        ("/usr/share/bash-completion/completions/skiffd", "host-key"),
        ("/usr/share/zsh/vendor-completions/_skiffd", "host-key"),
        (
            "/usr/share/fish/vendor_completions.d/skiffd.fish",
            "host-key",
        ),
        ("/usr/share/bash-completion/completions/skiff", "exec"),
        ("/usr/share/zsh/vendor-completions/_skiff", "exec"),
        ("/usr/share/fish/vendor_completions.d/skiff.fish", "exec"),
    ];
    for (file, word) in completions {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(word), "{file} lacks {word}");
        for word in hidden {
            assert!(!text.contains(word), "{file} mentions {word}");
        }
    }
    if !require_tool("man", "man-db") {
        return;
    }
    for (page, expected) in pages {
        let out = Run::new("man")
            .arg("-l")
            .arg(page)
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env("MANWIDTH", "100")
            .env("LANG", "C.UTF-8")
            .run();
        let context = format!("man -l {page}: {}", out.stderr);
        out.expect_code(0, &context);
        let text = out.stdout_str();
        // man renders bold by overstriking when writing to a pipe.
        let plain = strip_overstrike(&text);
        assert!(
            plain.contains(expected),
            "{context}: no {expected:?} in\n{plain}"
        );
        assert!(!out.stderr.contains("warning"), "{context}: troff warnings");
        // skiffd_config(5) is the reference's prose, which describes the
        // internal processes; the others are the command lines.
        if !page.contains("man5") {
            for word in hidden {
                assert!(!plain.contains(word), "{page} mentions {word}");
            }
        }
    }
}

/// Text without the `X\bX` (bold) and `_\bX` (underline) of nroff output.
fn strip_overstrike(text: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in text.chars() {
        if c == '\u{8}' {
            out.pop();
            continue;
        }
        out.push(c);
    }
    out.into_iter().collect()
}

/// `systemd-analyze verify` finds nothing wrong with the installed units
/// (it checks the commands and the Documentation= pages exist too).
fn check_units_verify() {
    if !require_tool("systemd-analyze", "systemd") {
        return;
    }
    let out = Run::new("systemd-analyze")
        .args(["verify", UNIT, SOCKET_UNIT])
        .timeout(Duration::from_secs(60))
        .run();
    assert_eq!(
        out.code,
        0,
        "systemd-analyze verify: {}{}",
        out.stdout_str(),
        out.stderr
    );
    let complaints: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("skiffd"))
        .collect();
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify: {complaints:?}"
    );
}

#[test]
fn the_package_installs_serves_logins_and_removes_cleanly() {
    let Some(deb) = package_under_test() else {
        return;
    };
    check_package_contents(&deb);
    let installed = Installed::install(&deb);
    assert_eq!(
        package_status().as_deref(),
        Some("install ok installed"),
        "after dpkg -i"
    );

    // Enabled on first install (links only, which needs no running
    // systemd), so the purge below has a link to take away.
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/skiffd.service");
    if Path::new("/usr/bin/systemctl").exists() || Path::new("/bin/systemctl").exists() {
        assert!(
            fs::read_link(wants).is_ok_and(|target| target == Path::new(UNIT)),
            "dpkg -i did not enable skiffd.service ({})",
            wants.display()
        );
    }

    // The packaged check of the packaged configuration.
    let check = Run::new(SKIFFD).args(["-t", "-f", CONFIG]).run();
    check.expect_code(0, &format!("{SKIFFD} -t -f {CONFIG}: {}", check.stderr));

    let unit = fs::read_to_string(UNIT).expect("installed unit");
    for line in ["Type=notify", "KillMode=process", "Restart=on-failure"] {
        assert!(
            unit.lines().any(|l| l.trim() == line),
            "{UNIT} lacks {line}"
        );
    }
    let exec_start = unit_values(&unit, "ExecStart");
    assert_eq!(
        exec_start.len(),
        1,
        "one ExecStart= in {UNIT}: {exec_start:?}"
    );
    let checks = unit_values(&unit, "ExecStartPre");
    assert_eq!(checks, [format!("{SKIFFD} -t -f {CONFIG}")], "{UNIT}");

    // The unit's command, started by hand on a free loopback port.
    let scratch = tempdir();
    let port = free_port();
    let mut server = start_exec_start(&exec_start[0], port, scratch.path().join("skiffd.log"));

    // A login with stock ssh as a new account, by key, checking that
    // skiffd presents the host's own (sshd's) ed25519 key, and that the
    // packaged PAM service's session stack ran (pam_loginuid set the
    // session's login uid to the account's).
    let account = TempAccount::create("pkg", "/bin/sh");
    let client_key = keygen(scratch.path(), "client", KeyType::Ed25519, None);
    authorize(&account.account, &client_key);
    let host_key = Key {
        private: PathBuf::from(HOST_KEY),
        public: PathBuf::from(format!("{HOST_KEY}.pub")),
        kind: KeyType::Ed25519,
    };
    let known_hosts = scratch.path().join("known_hosts");
    write_file(
        &known_hosts,
        format!("{}\n", known_hosts_line(port, &host_key)),
        0o600,
    );
    let out = ssh(port, account.name(), &client_key)
        .known_hosts(&known_hosts)
        .args(&["id -un; cat /proc/self/loginuid; echo; echo logged-in"])
        .run();
    assert_eq!(
        out.code,
        0,
        "ssh to the packaged skiffd: {}\n--- skiffd log ---\n{}",
        out.stderr,
        server.log()
    );
    assert_eq!(
        out.stdout_str(),
        format!("{}\n{}\nlogged-in\n", account.name(), account.account.uid),
        "{}",
        server.log()
    );

    check_manual_pages();
    check_units_verify();

    // dpkg -r: the prerm stops the skiffd we started (no systemd here),
    // and the conffiles stay.
    let removed = Run::new("dpkg")
        .args(["-r", PACKAGE])
        .timeout(Duration::from_secs(120))
        .run();
    assert_eq!(
        removed.code,
        0,
        "dpkg -r: {}{}",
        removed.stdout_str(),
        removed.stderr
    );
    let ended = server.wait_for_exit(Duration::from_secs(30));
    assert!(
        ended.is_some(),
        "dpkg -r left the started skiffd running:\n{}",
        server.log()
    );
    let left = skiffd_processes();
    assert!(
        left.is_empty(),
        "processes of {SKIFFD} after dpkg -r: {left:?}"
    );
    assert!(!Path::new(SKIFFD).exists(), "{SKIFFD} after dpkg -r");
    assert!(!Path::new(UNIT).exists(), "{UNIT} after dpkg -r");
    assert_eq!(
        package_status().as_deref(),
        Some("deinstall ok config-files"),
        "after dpkg -r"
    );
    for conffile in [CONFIG, PAM_SERVICE] {
        assert!(Path::new(conffile).is_file(), "dpkg -r removed {conffile}");
    }

    // dpkg -P: the conffiles and the unit's enablement go.
    let purged = Run::new("dpkg")
        .args(["-P", PACKAGE])
        .timeout(Duration::from_secs(120))
        .run();
    assert_eq!(
        purged.code,
        0,
        "dpkg -P: {}{}",
        purged.stdout_str(),
        purged.stderr
    );
    assert_eq!(
        package_status(),
        None,
        "dpkg still knows {PACKAGE} after dpkg -P"
    );
    for gone in [Path::new(CONFIG), Path::new(PAM_SERVICE), wants] {
        assert!(
            fs::symlink_metadata(gone).is_err(),
            "{} is still there after dpkg -P",
            gone.display()
        );
    }
    drop(installed);
}
