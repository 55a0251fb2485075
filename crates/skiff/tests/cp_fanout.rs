//! `skiff cp SRC... NODESET:PATH`: one upload to every host of a node set,
//! here two skiffd (data plane) and one OpenSSH sshd (SFTP) named `h1`,
//! `h2`, `h3` in the client's ssh config. They share this machine's
//! filesystem, so the files are checked once; that every host received
//! them is shown by its report line and by each server's log.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use skiff_testkit::*;

/// Three servers and a client home whose config names them h1, h2, h3
/// (and h4, a port nothing listens on).
struct Fleet {
    fx: Fixture,
    skiffd1: Skiffd,
    skiffd2: Skiffd,
    sshd: Sshd,
    home: AgentHome,
}

impl Fleet {
    fn start() -> Fleet {
        let fx = Fixture::new();
        let start_skiffd = || {
            let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
            let config = transfer_subsystem_config().unwrap_or_default();
            if !config.is_empty() {
                opts = opts.config(&config);
            }
            Skiffd::start_with(opts)
        };
        let (skiffd1, skiffd2) = (start_skiffd(), start_skiffd());
        let sshd = Sshd::start(
            &fx.host_key,
            &fx.authorized_keys,
            &["Subsystem sftp internal-sftp"],
        );
        let home = AgentHome::new();
        let mut config = String::new();
        for (name, port) in [
            ("h1", skiffd1.port()),
            ("h2", skiffd2.port()),
            ("h3", sshd.port()),
            ("h4", free_port()),
        ] {
            home.home.trust(port, &fx.host_key);
            config.push_str(&format!(
                "Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {}\n  IdentityFile {}\n  \
                 ConnectTimeout 5\n",
                user(),
                fx.client_key.private.display()
            ));
        }
        write_file(&home.home.ssh_dir().join("config"), &config, 0o600);
        Fleet {
            fx,
            skiffd1,
            skiffd2,
            sshd,
            home,
        }
    }

    /// `skiff cp ARGS` as this client, through the agent or not.
    fn cp(&self, agent: bool, args: &[&str]) -> CmdOutput {
        self.cp_command(agent, args).run()
    }

    /// [`Self::cp`], with passphrases from `askpass`.
    fn cp_with(&self, agent: bool, askpass: &Path, args: &[&str]) -> CmdOutput {
        self.cp_command(agent, args).askpass(askpass).run()
    }

    fn cp_command(&self, agent: bool, args: &[&str]) -> Run {
        Run::new(skiff_bin())
            .env("HOME", self.home.home.path())
            .env_remove("SSH_AUTH_SOCK")
            .env("SKIFF_AGENT", if agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", self.home.runtime.path())
            .env("XDG_STATE_HOME", self.home.home.path().join("state"))
            .arg("cp")
            .args(args)
            .timeout(BULK_TIMEOUT)
    }

    /// A copy of the client's ssh config that names the passphrase-protected
    /// key instead of the plain one.
    fn encrypted_config(&self) -> std::path::PathBuf {
        let home = self.home.home.path();
        let config = home.join("encrypted_config");
        let ssh_config = fs::read_to_string(home.join(".ssh/config")).unwrap();
        write_file(
            &config,
            ssh_config.replace(
                &self.fx.client_key.private.display().to_string(),
                &self.fx.encrypted_key.private.display().to_string(),
            ),
            0o600,
        );
        config
    }

    /// `skiff cp -F CONFIG SRC TARGET` on a pseudo-terminal, without the
    /// agent, where nothing but the terminal can give a passphrase.
    fn cp_on_terminal(&self, config: &Path, src: &Path, target: &str) -> OnTerminal {
        let home = self.home.home.path();
        let mut cmd = std::process::Command::new(skiff_bin());
        cmd.env("HOME", home)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("DISPLAY")
            .env("TERM", "xterm")
            .env("SKIFF_AGENT", "off")
            .env("XDG_RUNTIME_DIR", self.home.runtime.path())
            .env("XDG_STATE_HOME", home.join("state"))
            .args(["cp", "-F"])
            .arg(config)
            .arg(src)
            .arg(target);
        OnTerminal::spawn(cmd)
    }

    fn context(&self) -> String {
        format!(
            "{}\n{}\n{}",
            server_context(&self.skiffd1, "h1 (skiffd)"),
            server_context(&self.skiffd2, "h2 (skiffd)"),
            server_context(&self.sshd, "h3 (sshd)")
        )
    }
}

fn sample_tree(root: &Path) -> String {
    fs::create_dir_all(root.join("sub")).unwrap();
    write_file(&root.join("a.txt"), "alpha\n", 0o644);
    random_file(&root.join("sub/big.bin"), 3 * 1024 * 1024 + 5)
}

#[test]
fn one_upload_to_every_host_of_a_node_set() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let src = tempdir();
    let sum = sample_tree(src.path());

    for agent in [false, true] {
        let remote = account_dir();
        let target = format!("h[1-3]:{}/", remote.path().display());
        let out = fleet.cp(agent, &["-r", &src.path().display().to_string(), &target]);
        let c = format!("{}\nthrough the agent: {agent}", fleet.context());
        out.expect_code(0, &c);
        // One line per host on stdout, in any order, and a summary.
        let stdout = out.stdout_str();
        let mut lines: Vec<&str> = stdout.lines().collect();
        lines.sort();
        let want: Vec<String> = ["h1", "h2", "h3"]
            .iter()
            .map(|h| format!("{h}: 2 files, {} bytes", 6 + 3 * 1024 * 1024 + 5))
            .collect();
        assert_eq!(lines, want, "{c}\n{out}");
        assert!(out.stderr.contains("copied to 3 of 3 hosts"), "{c}\n{out}");
        let copied = remote.path().join(src.path().file_name().unwrap());
        assert_eq!(sha256(&copied.join("sub/big.bin")), sum, "{c}");
        assert_eq!(fs::read_to_string(copied.join("a.txt")).unwrap(), "alpha\n");
    }
    // Each server did its share: the data plane on both skiffd, SFTP on sshd.
    for d in [&fleet.skiffd1, &fleet.skiffd2] {
        assert!(
            d.log().contains("data plane:"),
            "{}",
            server_context(d, "skiffd")
        );
    }
    assert!(
        fleet.sshd.log().contains("subsystem 'sftp'"),
        "{}",
        server_context(&fleet.sshd, "h3 (sshd)")
    );
}

/// A key that needs a passphrase has it asked for once for every host,
/// with the agent (which defers to a direct connection) and without.
#[test]
fn a_passphrase_is_asked_for_once_for_every_host() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let src = tempdir();
    write_file(&src.path().join("p.txt"), "pass\n", 0o644);
    let home = fleet.home.home.path();
    let config = fleet.encrypted_config();
    let marker = home.join("askpass-calls");
    let askpass = askpass_script(home, PASSPHRASE, &marker);
    for agent in [false, true] {
        let _ = fs::remove_file(&marker);
        let remote = account_dir();
        let target = format!("h[1-3]:{}/", remote.path().display());
        let c = format!("{}\nthrough the agent: {agent}", fleet.context());
        let out = fleet.cp_with(
            agent,
            &askpass,
            &[
                "-F",
                &config.display().to_string(),
                &src.path().join("p.txt").display().to_string(),
                &target,
            ],
        );
        out.expect_code(0, &c);
        assert!(out.stderr.contains("copied to 3 of 3 hosts"), "{c}\n{out}");
        assert_eq!(
            fs::read_to_string(remote.path().join("p.txt")).unwrap(),
            "pass\n"
        );
        let calls = fs::read_to_string(&marker).unwrap_or_default();
        assert_eq!(calls.lines().count(), 1, "{c}: asked once\n{calls}\n{out}");
    }
}

#[test]
fn hosts_that_fail_are_named_and_the_others_go_on() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let src = tempdir();
    let file = src.path().join("f");
    write_file(&file, "payload\n", 0o644);
    let remote = account_dir();

    // h4 has nothing listening: reported, exit 255; h1 and h3 still copy.
    let target = format!("h1,h3,h4:{}/f", remote.path().display());
    let out = fleet.cp(false, &[&file.display().to_string(), &target]);
    let c = fleet.context();
    out.expect_code(255, &c);
    let stdout = out.stdout_str();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["h1: 1 files, 8 bytes", "h3: 1 files, 8 bytes"],
        "{c}\n{out}"
    );
    assert!(out.stderr.contains("skiff: h4: "), "{c}\n{out}");
    assert!(
        out.stderr
            .contains("not copied (no connection, host key or login) (1): h4"),
        "{c}\n{out}"
    );
    assert_eq!(
        fs::read_to_string(remote.path().join("f")).unwrap(),
        "payload\n"
    );

    // A target directory that does not exist: every host fails that file.
    let target = format!("h[1-3]:{}/no/such/dir/", remote.path().display());
    let out = fleet.cp(false, &[&file.display().to_string(), &target]);
    let c = fleet.context();
    assert_ne!(out.code, 0, "{c}\n{out}");
    for h in ["h1", "h2", "h3"] {
        assert!(
            out.stderr.contains(&format!("skiff: {h}: ")),
            "{c}: {h} named\n{out}"
        );
    }

    drop(fleet.fx);
}

/// `skiff cp NODESET:PATH DIR`: every host's files land in `DIR/HOST/`.
#[test]
fn gathering_from_a_node_set_keeps_hosts_apart() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let remote = account_dir();
    write_file(&remote.path().join("app.log"), "log line\n", 0o644);
    fs::create_dir(remote.path().join("conf.d")).unwrap();
    write_file(&remote.path().join("conf.d/x.conf"), "x=1\n", 0o644);
    let local = tempdir();
    let out = fleet.cp(
        true,
        &[
            "-r",
            &format!("h[1-3]:{}/app.log", remote.path().display()),
            &format!("h[1-3]:{}/conf.d", remote.path().display()),
            &local.path().display().to_string(),
        ],
    );
    let c = fleet.context();
    out.expect_code(0, &c);
    for h in ["h1", "h2", "h3"] {
        let dir = local.path().join(h);
        assert_eq!(
            fs::read_to_string(dir.join("app.log")).unwrap_or_default(),
            "log line\n",
            "{c}: {h}'s copy\n{out}"
        );
        assert_eq!(
            fs::read_to_string(dir.join("conf.d/x.conf")).unwrap_or_default(),
            "x=1\n",
            "{c}: {h}'s tree\n{out}"
        );
    }
    // Sources from different sets: refused before connecting.
    let out = fleet.cp(false, &["h[1-2]:/etc/hostname", "h3:/etc/hostname", "."]);
    out.expect_code(255, "sources from different hosts");
    assert!(out.stderr.contains("same host"), "{out}");
}

/// On a terminal, the progress bar of a copy to many hosts steps aside
/// while the passphrase is asked for: nothing is drawn over the question
/// until it is answered (the bar redraws itself four times a second).
#[test]
fn the_progress_bar_does_not_draw_over_a_passphrase_prompt() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let src = tempdir();
    write_file(&src.path().join("p.txt"), "pass\n", 0o644);
    let config = fleet.encrypted_config();
    let remote = account_dir();
    let mut term = fleet.cp_on_terminal(
        &config,
        &src.path().join("p.txt"),
        &format!("h[1-3]:{}/", remote.path().display()),
    );
    let asked = term.wait_for("Enter passphrase for key", Duration::from_secs(60));
    // Long enough for several redraws of a bar that did not step aside.
    std::thread::sleep(Duration::from_millis(1500));
    let while_asked = term.output()[asked..].to_string();
    term.type_line(PASSPHRASE);
    let status = term.wait(Duration::from_secs(120));
    let all = term.output();
    let c = format!("{}\nterminal:\n{all:?}", fleet.context());
    assert!(
        !while_asked.contains("ETA") && !while_asked.contains("hosts"),
        "drawn while the question was open: {while_asked:?}\n{c}"
    );
    assert!(status.success(), "{status}\n{c}");
    assert!(all.contains("copied to 3 of 3 hosts"), "{c}");
    // Before any size is known the bar is empty, not drawn as done.
    assert!(!all.contains("0 B/0 B [="), "{c}");
    assert_eq!(
        fs::read_to_string(remote.path().join("p.txt")).unwrap(),
        "pass\n"
    );
}

/// A host that finishes while another host's passphrase is being asked for
/// prints its line after the question, not in the middle of it. `h1` (the
/// plain key) is reached through a ProxyCommand that waits a second, so it
/// finishes while `h2`'s key (the encrypted one) waits for its passphrase.
#[test]
fn a_host_that_finishes_during_a_passphrase_question_reports_after_it() {
    if !require_openssh() {
        return;
    }
    let fleet = Fleet::start();
    let src = tempdir();
    write_file(&src.path().join("q.txt"), "quiet\n", 0o644);
    let home = fleet.home.home.path();
    let config = home.join("mixed_config");
    let host = |name: &str, port: u16, key: &Key, extra: &str| {
        format!(
            "Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {}\n  IdentityFile {}\n{extra}",
            user(),
            key.private.display()
        )
    };
    // A plain TCP relay (bash's /dev/tcp) after a second's wait.
    let slow_way =
        "  ProxyCommand bash -c 'sleep 1; exec 3<>/dev/tcp/%h/%p; cat <&3 & exec cat >&3'\n";
    write_file(
        &config,
        host("h1", fleet.skiffd1.port(), &fleet.fx.client_key, slow_way)
            + &host("h2", fleet.skiffd2.port(), &fleet.fx.encrypted_key, ""),
        0o600,
    );
    let remote = account_dir();
    let copied = remote.path().join("q.txt");
    let mut term = fleet.cp_on_terminal(
        &config,
        &src.path().join("q.txt"),
        &format!("h[1-2]:{}/", remote.path().display()),
    );
    let asked = term.wait_for("Enter passphrase for key", Duration::from_secs(60));
    // h1 finishes meanwhile: its copy lands while the question is open.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !copied.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let h1_done_during_question = copied.exists();
    std::thread::sleep(Duration::from_millis(500));
    let while_asked = term.output()[asked..].to_string();
    term.type_line(PASSPHRASE);
    let status = term.wait(Duration::from_secs(120));
    let all = term.output();
    let c = format!("{}\nterminal:\n{all:?}", fleet.context());
    assert!(
        h1_done_during_question,
        "h1 did not finish during the question\n{c}"
    );
    // A host's report starts with its name and a colon; the question
    // itself names the key's path, whose random temp-dir part may hold
    // "h1" by chance, so a bare "h1" proves nothing.
    assert!(
        !while_asked.contains("h1: "),
        "h1 reported in the middle of the question: {while_asked:?}\n{c}"
    );
    assert!(status.success(), "{status}\n{c}");
    let after = &all[asked..];
    assert!(after.contains("h1: 1 files, 6 bytes"), "{c}");
    assert!(after.contains("h2: 1 files, 6 bytes"), "{c}");
    assert!(all.contains("copied to 2 of 2 hosts"), "{c}");
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Hosts named `.` and `..` (reachable through ssh_config `Host` entries)
/// gather into `DIR/%2E/` and `DIR/%2E%2E/`, never into `DIR` itself or
/// its parent, directly and through the agent; a host name with a `/` (from
/// a groups file) is refused before anything is written.
#[test]
fn gathering_never_writes_outside_the_directory() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    let config = transfer_subsystem_config().unwrap_or_default();
    if !config.is_empty() {
        opts = opts.config(&config);
    }
    let d = Skiffd::start_with(opts);
    let ah = AgentHome::new();
    ah.home.trust(d.port(), &fx.host_key);
    write_file(
        &ah.home.ssh_dir().join("config"),
        format!(
            "Host . .. evil\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             ConnectTimeout 5\n",
            d.port(),
            user(),
            fx.client_key.private.display()
        ),
        0o600,
    );
    let groups = ah.home.path().join("groups");
    write_file(&groups, "bad: evil,a/b\n", 0o644);
    let remote = account_dir();
    write_file(&remote.path().join("f"), "from the server\n", 0o644);
    let cp = |agent: bool, args: &[&str]| {
        Run::new(skiff_bin())
            .env("HOME", ah.home.path())
            .env_remove("SSH_AUTH_SOCK")
            .env("SKIFF_AGENT", if agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", ah.runtime.path())
            .env("XDG_STATE_HOME", ah.home.path().join("state"))
            .arg("cp")
            .args(args)
            .timeout(BULK_TIMEOUT)
            .run()
    };
    for agent in [false, true] {
        let c = server_context(
            &d,
            &format!("gathering from . and .., through the agent: {agent}"),
        );
        let parent = tempdir();
        let dir = parent.path().join("out");
        fs::create_dir(&dir).unwrap();
        let source = format!(".,..,evil:{}/f", remote.path().display());
        let out = cp(agent, &[&source, &dir.display().to_string()]);
        out.expect_code(0, &c);
        assert_eq!(entries(parent.path()), ["out"], "{c}: outside DIR\n{out}");
        assert_eq!(entries(&dir), ["%2E", "%2E%2E", "evil"], "{c}\n{out}");
        for host in ["%2E", "%2E%2E", "evil"] {
            assert_eq!(
                fs::read_to_string(dir.join(host).join("f")).unwrap_or_default(),
                "from the server\n",
                "{c}: {host}'s copy\n{out}"
            );
        }

        let source = format!("@bad:{}/f", remote.path().display());
        let out = cp(
            agent,
            &[
                "--groups",
                &groups.display().to_string(),
                &source,
                &dir.join("again").display().to_string(),
            ],
        );
        out.expect_code(255, &c);
        assert!(
            out.stderr.contains("'/' is not allowed in a host name"),
            "{c}: the refusal says why\n{out}"
        );
        assert_eq!(entries(parent.path()), ["out"], "{c}\n{out}");
        assert_eq!(entries(&dir), ["%2E", "%2E%2E", "evil"], "{c}\n{out}");
    }
}

/// A gather from 40 names of one busy server (each its own host, by
/// HostKeyAlias) at `-j 40`, directly and through the agent, with
/// `options` on the command line: every host's file arrives, and the
/// server's log shows that it dropped connections both times (`drops`
/// counts them so far).
fn gather_from_a_busy_server(
    fx: &Fixture,
    port: u16,
    options: &[&str],
    drops: &dyn Fn() -> usize,
    what: &str,
) {
    const HOSTS: u8 = 40;
    let home = AgentHome::new();
    let mut config = String::new();
    for n in 1..=HOSTS {
        config.push_str(&format!("Host n{n:02}\n  HostKeyAlias n{n:02}\n"));
    }
    config.push_str(&format!(
        "Host *\n  HostName 127.0.0.1\n  Port {port}\n  User {}\n  IdentityFile {}\n  \
         IdentitiesOnly yes\n  StrictHostKeyChecking accept-new\n  ConnectTimeout 60\n",
        user(),
        fx.client_key.private.display()
    ));
    write_file(&home.home.ssh_dir().join("config"), &config, 0o600);
    let remote = account_dir();
    write_file(&remote.path().join("app.log"), "log line\n", 0o644);
    let run = |agent: bool| {
        let local = tempdir();
        let out = Run::new(skiff_bin())
            .env("HOME", home.home.path())
            .env_remove("SSH_AUTH_SOCK")
            .env("SKIFF_AGENT", if agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", home.runtime.path())
            .env("XDG_STATE_HOME", home.home.path().join("state"))
            .args(["cp", "-q", "-j", "40"])
            .args(options)
            .arg(format!("n[01-{HOSTS}]:{}/app.log", remote.path().display()))
            .arg(local.path())
            .timeout(BULK_TIMEOUT)
            .run();
        let c = format!("{what}: gather through the agent: {agent}");
        let errors: Vec<&str> = out.stderr.lines().filter(|l| l.contains("skiff")).collect();
        assert!(
            out.stderr
                .contains(&format!("copied from {HOSTS} of {HOSTS} hosts")),
            "{c}\nexit code {}; errors:\n{}",
            out.code,
            errors[..errors.len().min(6)].join("\n")
        );
        out.expect_code(0, &c);
        for n in 1..=HOSTS {
            let copy = local.path().join(format!("n{n:02}/app.log"));
            assert_eq!(
                fs::read_to_string(&copy).unwrap_or_default(),
                "log line\n",
                "{c}: {}",
                copy.display()
            );
        }
    };
    run(false);
    let direct = drops();
    assert!(
        direct > 0,
        "{what} dropped nothing, so nothing was tried again"
    );
    run(true);
    assert!(
        drops() > direct,
        "{what} dropped none of the agent's connections"
    );
}

/// An OpenSSH sshd that lets 4 connections authenticate at once says
/// "Exceeded MaxStartups" to the rest of `-j 40` and closes them. Those
/// hosts are tried again, so a gather from 40 names of it (SFTP) gets every
/// host's file, directly and through the agent.
#[test]
fn pre_authentication_drops_are_tried_again() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let sshd = Sshd::start(
        &fx.host_key,
        &fx.authorized_keys,
        &["MaxStartups 4", "Subsystem sftp internal-sftp"],
    );
    let drops = || {
        sshd.log()
            .lines()
            .filter(|l| l.contains("past MaxStartups"))
            .count()
    };
    gather_from_a_busy_server(&fx, sshd.port(), &[], &drops, "sshd");
}

/// skiffd with `MaxStartups 4` closes the excess of `-j 40` at once, SSH
/// connections and data-plane streams alike (a stream counts until its
/// first bytes show what it is). A data stream turned away like that fails
/// its copy as a busy server, and the host is tried again: every host's
/// file arrives over the data plane. The copy names a stream count, so
/// that its small file takes a stream instead of the channel alone.
#[test]
fn data_streams_dropped_by_a_busy_skiffd_are_tried_again() {
    let fx = Fixture::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("MaxStartups 4\n"),
    );
    let drops = || {
        d.log()
            .lines()
            .filter(|l| l.contains("dropping connection") && l.contains("(MaxStartups)"))
            .count()
    };
    gather_from_a_busy_server(&fx, d.port(), &["--streams", "1"], &drops, "skiffd");
    assert!(
        d.log().contains("data plane: 1 streams"),
        "{}",
        server_context(&d, "the copies did not use data-plane streams")
    );
}
