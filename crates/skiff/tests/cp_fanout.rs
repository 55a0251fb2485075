//! `skiff cp SRC... NODESET:PATH`: one upload to every host of a node set,
//! here two skiffd (data plane) and one OpenSSH sshd (SFTP) named `h1`,
//! `h2`, `h3` in the client's ssh config. They share this machine's
//! filesystem, so the files are checked once; that every host received
//! them is shown by its report line and by each server's log.

mod common;

use std::fs;
use std::path::Path;

use common::*;

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
    let config = home.join("encrypted_config");
    let ssh_config = fs::read_to_string(home.join(".ssh/config")).unwrap();
    write_file(
        &config,
        ssh_config.replace(
            &fleet.fx.client_key.private.display().to_string(),
            &fleet.fx.encrypted_key.private.display().to_string(),
        ),
        0o600,
    );
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
