//! skiff under ssh's own command line (`skiff ssh`, or skiff run through a
//! `skiff-ssh` symlink), driven by real programs that run `ssh`: rsync `-e`,
//! git `GIT_SSH`, OpenSSH's sftp and scp `-S`, and another ssh's
//! `ProxyCommand` (`-W`), against skiffd and OpenSSH sshd.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use skiff_testkit::*;

/// A `skiff-ssh` symlink to the skiff under test: programs that take an ssh
/// program's path (GIT_SSH, scp -S) run it as is.
struct Shim {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn shim() -> Shim {
    let dir = tempdir();
    let path = dir.path().join("skiff-ssh");
    let target = fs::canonicalize(skiff_bin()).expect("skiff binary");
    std::os::unix::fs::symlink(target, &path).expect("symlink");
    Shim { _dir: dir, path }
}

/// A user of skiff: a home whose `~/.ssh/config` names the server `box`
/// (with its port, user and key) and whose known_hosts trusts it, and a
/// private agent directory. `agent` says whether skiff goes through the
/// agent (which it starts itself).
struct User {
    agent_home: AgentHome,
    agent: bool,
}

impl User {
    fn new(server: &dyn Daemon, fx: &Fixture, agent: bool) -> User {
        let agent_home = AgentHome::new();
        name_server_box(&agent_home.home, server, fx);
        User { agent_home, agent }
    }

    fn home(&self) -> &Path {
        self.agent_home.home.path()
    }

    /// `program` run by this user: their HOME, none of the caller's agents.
    fn run(&self, program: impl AsRef<std::ffi::OsStr>) -> Run {
        Run::new(program)
            .env("HOME", self.home())
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("DISPLAY")
            .env("SKIFF_AGENT", if self.agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", self.agent_home.runtime.path())
            .env("XDG_STATE_HOME", self.home().join("state"))
            .timeout(BULK_TIMEOUT)
    }
}

/// A skiffd that serves the `sftp` subsystem to the test account.
fn skiffd_serving_sftp(fx: &Fixture) -> Skiffd {
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if let Some(config) = sftp_subsystem_config() {
        opts = opts.config(&config);
    }
    Skiffd::start_with(opts)
}

/// How many logins `server` has accepted so far.
fn logins(server: &dyn Daemon) -> usize {
    // skiffd: "accepted publickey"; sshd: "Accepted publickey".
    server
        .log()
        .to_ascii_lowercase()
        .matches("accepted publickey")
        .count()
}

/// One server and one user of it, for a case that runs against each server.
struct Case<'a> {
    server: &'a dyn Daemon,
    /// Whether the user goes through skiff's agent.
    agent: bool,
    u: User,
    shim: Shim,
    /// What to say in assertion messages (with the server's log).
    c: String,
}

/// Runs `case` against both servers, each with how its user connects: to
/// skiffd through the agent, to sshd directly.
fn each_server(mut case: impl FnMut(&Case)) {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let with = |server: &dyn Daemon, agent: bool, what: &str, case: &mut dyn FnMut(&Case)| {
        case(&Case {
            server,
            agent,
            u: User::new(server, &fx, agent),
            shim: shim(),
            c: server_context(server, what),
        })
    };
    let d = skiffd_serving_sftp(&fx);
    with(&d, true, "skiffd, through the agent", &mut case);
    drop(d);
    let sshd = Sshd::start(
        &fx.host_key,
        &fx.authorized_keys,
        &["Subsystem sftp internal-sftp"],
    );
    with(&sshd, false, "sshd, direct", &mut case);
}

/// Relative path -> contents of every file under `root`.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, fs::read(&path).expect("read")));
            }
        }
    }
    out.sort();
    out
}

fn sample_tree(root: &Path) {
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    random_file(&root.join("big.bin"), 3 * 1024 * 1024 + 7);
    write_file(&root.join("a.txt"), "alpha\n", 0o644);
    write_file(&root.join("sub/run.sh"), "#!/bin/sh\necho hi\n", 0o755);
    write_file(&root.join("sub/deeper/empty"), "", 0o600);
}

#[test]
fn rsync_runs_skiff_as_its_remote_shell() {
    if !require_tool("rsync", "rsync") {
        return;
    }
    each_server(|k| {
        let (server, u, shim, c) = (k.server, &k.u, &k.shim, &k.c);
        let src = tempdir();
        sample_tree(src.path());
        let remote = account_dir();
        let before = logins(server);
        let rsync = |args: &[&str]| u.run("rsync").arg("-e").arg(&shim.path).args(args).run();
        let up = rsync(&[
            "-a",
            &format!("{}/", src.path().display()),
            &format!("box:{}/", remote.path().display()),
        ]);
        up.expect_code(0, &format!("{c}: rsync upload"));
        assert_eq!(tree(src.path()), tree(remote.path()), "{c}: uploaded tree");

        // A change goes across as rsync's delta.
        write_file(&src.path().join("a.txt"), "alpha, changed\n", 0o644);
        rsync(&[
            "-a",
            &format!("{}/", src.path().display()),
            &format!("box:{}/", remote.path().display()),
        ])
        .expect_code(0, &format!("{c}: rsync update"));
        assert_eq!(
            fs::read_to_string(remote.path().join("a.txt")).unwrap(),
            "alpha, changed\n",
            "{c}"
        );

        let back = tempdir();
        rsync(&[
            "-a",
            &format!("box:{}/", remote.path().display()),
            &format!("{}/", back.path().display()),
        ])
        .expect_code(0, &format!("{c}: rsync download"));
        assert_eq!(tree(src.path()), tree(back.path()), "{c}: downloaded tree");
        let mode = file_mode(&back.path().join("sub/run.sh"));
        assert_eq!(mode & 0o777, 0o755, "{c}: rsync -a kept the mode");

        let used = logins(server) - before;
        if k.agent {
            // Three rsync runs, one connection: the agent's, kept warm.
            assert_eq!(used, 1, "{c}: logins for three rsync runs");
        } else {
            assert_eq!(used, 3, "{c}: logins for three rsync runs");
        }
    });
}

/// `git` with GIT_SSH pointing at skiff-ssh: git asks `skiff-ssh -G` whether
/// it takes OpenSSH's options (it must, for the port in the URL), then
/// clones, pushes and fetches through it.
#[test]
fn git_clones_and_pushes_through_skiff() {
    if !require_tool("git", "git") {
        return;
    }
    each_server(|k| {
        let (server, u, shim, c) = (k.server, &k.u, &k.shim, &k.c);
        let remote = account_dir();
        let repo = remote.path().join("repo.git");
        let git = |dir: &Path, args: &[&str]| {
            u.run("git")
                .arg("-C")
                .arg(dir)
                .args(args)
                .env("GIT_SSH", &shim.path)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_AUTHOR_NAME", "skiff test")
                .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
                .env("GIT_COMMITTER_NAME", "skiff test")
                .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
                .run()
        };
        git(remote.path(), &["init", "-q", "--bare", "repo.git"])
            .expect_code(0, &format!("{c}: git init --bare"));
        if is_root() {
            let a = account();
            let out = Command::new("chown")
                .arg("-R")
                .arg(format!("{}:{}", a.uid, a.gid))
                .arg(&repo)
                .output()
                .expect("chown");
            assert!(out.status.success(), "chown -R the bare repository");
        }
        // The URL carries the port, which git passes on only to an ssh
        // that answers `-G`.
        let url = format!("ssh://box:{}{}", server.port(), repo.display());
        let work = tempdir();
        git(work.path(), &["clone", "-q", &url, "clone"]).expect_code(0, &format!("{c}: clone"));
        let clone = work.path().join("clone");
        write_file(&clone.join("README"), "pushed through skiff\n", 0o644);
        git(&clone, &["add", "README"]).expect_code(0, c);
        git(&clone, &["commit", "-q", "-m", "first"]).expect_code(0, c);
        git(&clone, &["push", "-q", "origin", "HEAD:refs/heads/main"])
            .expect_code(0, &format!("{c}: push"));

        let again = tempdir();
        git(again.path(), &["clone", "-q", "-b", "main", &url, "again"])
            .expect_code(0, &format!("{c}: second clone"));
        assert_eq!(
            fs::read_to_string(again.path().join("again/README")).unwrap(),
            "pushed through skiff\n",
            "{c}: the pushed commit came back"
        );
    });
}

/// OpenSSH's own sftp and scp with `-S skiff-ssh`: their subsystem request
/// (`-s ... sftp`) goes through skiff.
#[test]
fn openssh_sftp_and_scp_use_skiff_as_their_ssh() {
    each_server(|k| {
        let (u, shim, c) = (&k.u, &k.shim, &k.c);
        let local = tempdir();
        let src = local.path().join("data.bin");
        let sum = random_file(&src, 2 * 1024 * 1024 + 3);
        let remote = account_dir();

        let batch = local.path().join("batch");
        write_file(
            &batch,
            format!(
                "put {} {}/via-sftp\nget {}/via-sftp {}/back-sftp\n",
                src.display(),
                remote.path().display(),
                remote.path().display(),
                local.path().display()
            ),
            0o644,
        );
        u.run("sftp")
            .arg("-S")
            .arg(&shim.path)
            .arg("-b")
            .arg(&batch)
            .arg("box")
            .run()
            .expect_code(0, &format!("{c}: sftp -S"));
        assert_eq!(
            sha256(&local.path().join("back-sftp")),
            sum,
            "{c}: sftp round trip"
        );

        let scp =
            |from: &dyn AsRef<std::ffi::OsStr>, to: &dyn AsRef<std::ffi::OsStr>, what: &str| {
                u.run("scp")
                    .arg("-S")
                    .arg(&shim.path)
                    .arg(from)
                    .arg(to)
                    .run()
                    .expect_code(0, &format!("{c}: scp -S {what}"));
            };
        let remote_copy = remote.path().join("via-scp");
        scp(&src, &format!("box:{}", remote_copy.display()), "upload");
        assert_eq!(sha256(&remote_copy), sum, "{c}: scp upload");
        let back = local.path().join("back-scp");
        scp(&format!("box:{}", remote_copy.display()), &back, "download");
        assert_eq!(sha256(&back), sum, "{c}: scp download");
    });
}

/// Without a command, ssh starts the account's login shell: read from
/// stdin without a terminal, or with one under `-tt`.
#[test]
fn no_command_starts_the_login_shell() {
    each_server(|k| {
        let (u, c) = (&k.u, &k.c);
        let out = u
            .run(skiff_bin())
            .args(["ssh", "box"])
            .input(Input::Bytes(
                b"echo from-the-shell; test -t 0 || echo no-terminal; exit 7\n".to_vec(),
            ))
            .run();
        out.expect_code(7, &format!("{c}: shell without a terminal"));
        assert_eq!(
            out.stdout_str(),
            "from-the-shell\nno-terminal\n",
            "{c}\n{out}"
        );

        let out = u
            .run(skiff_bin())
            .args(["ssh", "-tt", "box"])
            .input(Input::Bytes(b"tty; exit 3\n".to_vec()))
            .run();
        out.expect_code(3, &format!("{c}: shell with -tt"));
        assert!(
            out.stdout_str().split_whitespace().any(is_pts_path),
            "{c}: the shell runs on a pseudo-terminal\n{out}"
        );
    });
}

/// `ssh -o ProxyCommand='skiff-ssh -W %h:%p jump'`: stock ssh reaches a
/// server through a jump host (an sshd that forwards only there) with skiff
/// carrying the connection, directly and on the agent's warm connection.
#[test]
fn w_carries_another_sshs_connection() {
    let Some((fx, target)) = sshd_setup(&[]) else {
        return;
    };
    let permit = format!("PermitOpen 127.0.0.1:{}", target.port());
    let jump = Sshd::start(&fx.host_key, &fx.authorized_keys, &[&permit]);
    let u = User::new(&jump, &fx, false);
    let shim = shim();
    let c = || {
        format!(
            "{}\n{}",
            server_context(&jump, "jump host"),
            server_context(&target, "target")
        )
    };
    // Stock ssh to the target, carried by `skiff-ssh -W TARGET box`.
    let through = |agent: bool, target_spec: &str, command: &[&str]| {
        let proxy = format!(
            "ProxyCommand={} -F {} -W {target_spec} box",
            shim.path.display(),
            u.home().join(".ssh/config").display()
        );
        ssh(target.port(), user(), &fx.client_key)
            .opt(&proxy)
            .env("HOME", u.home())
            .env("SKIFF_AGENT", if agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", u.agent_home.runtime.path())
            .env("XDG_STATE_HOME", u.home().join("state"))
            .args(command)
            .run()
    };
    through(false, "%h:%p", &["echo", "through", "the", "jump"])
        .expect_code(0, &c())
        .expect_stdout("through the jump\n", &c());

    // A port the jump host does not forward to: the error names it.
    for agent in [false, true] {
        let out = through(agent, "127.0.0.1:1", &["true"]);
        assert_ne!(out.code, 0, "{}\n{out}", c());
        assert!(
            out.stderr
                .contains("could not open a connection to 127.0.0.1 port 1"),
            "{}: the refused forward is named (agent: {agent})\n{out}",
            c()
        );
    }

    // Through the agent: three stock ssh runs, one login on the jump host
    // (the agent logged in for the refused forward above and kept it).
    let logins = || jump.log().matches("Accepted publickey").count();
    let before = logins();
    for n in 0..3 {
        through(true, "%h:%p", &["echo", &format!("warm{n}")])
            .expect_code(0, &c())
            .expect_stdout(&format!("warm{n}\n"), &c());
    }
    assert_eq!(
        logins(),
        before,
        "{}: the agent's connection was reused",
        c()
    );
    let status = u.agent_home.agent_cmd(&["status"]);
    assert!(status.stdout_str().contains("127.0.0.1"), "{status}");
}

#[test]
fn command_line_details() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd_serving_sftp(&fx);
    let u = User::new(&d, &fx, false);
    let shim = shim();
    let c = server_context(&d, "skiffd");

    // The symlink and the subcommand are the same program.
    let out = u.run(&shim.path).args(["box", "echo", "a", "b"]).run();
    out.expect_code(0, &c).expect_stdout("a b\n", &c);
    let out = u
        .run(skiff_bin())
        .args([
            "ssh",
            "-l",
            user(),
            "box",
            "-p",
            &d.port().to_string(),
            "echo",
            "-n",
            "x",
        ])
        .run();
    out.expect_code(0, &c).expect_stdout("x", &c);

    // -G prints what the configuration resolves to.
    let out = u.run(&shim.path).args(["-G", "-p", "2", "box"]).run();
    out.expect_code(0, "-G");
    let text = out.stdout_str();
    for line in [
        "hostname 127.0.0.1".to_string(),
        "port 2".to_string(),
        format!("user {}", user()),
        format!("identityfile {}", fx.client_key.private.display()),
        "batchmode yes".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "-G lacks {line:?}\n{out}");
    }

    // RefuseConnection in the configuration: an error naming where, and
    // no connection.
    let config = u.home().join(".ssh/config");
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str("Host shut\n  HostName 127.0.0.1\n  RefuseConnection yes\n");
    write_file(&config, &text, 0o600);
    let before = d.log().matches("connection").count();
    let out = u
        .run(&shim.path)
        .args(["-p", &d.port().to_string(), "shut", "true"])
        .run();
    out.expect_code(255, "RefuseConnection");
    assert!(
        out.stderr.contains("RefuseConnection yes at") && out.stderr.contains("config:"),
        "{out}"
    );
    assert_eq!(
        d.log().matches("connection").count(),
        before,
        "{c}: RefuseConnection must not connect"
    );

    // RemoteCommand (tokens expanded) runs when no command is given, and
    // with a command it is an error; StdinNull reads no input; SessionType
    // none is not supported.
    text.push_str(&format!(
        "Host rc\n  HostName 127.0.0.1\n  RemoteCommand echo remote \"%h\"\n\
         Host quiet\n  HostName 127.0.0.1\n  StdinNull yes\n\
         Host nosession\n  HostName 127.0.0.1\n  SessionType none\n\
         Host rc quiet nosession\n  Port {}\n  User {}\n  IdentityFile {}\n  BatchMode yes\n",
        d.port(),
        user(),
        fx.client_key.private.display()
    ));
    write_file(&config, &text, 0o600);
    u.run(&shim.path)
        .arg("rc")
        .run()
        .expect_code(0, &c)
        .expect_stdout("remote 127.0.0.1\n", &c);
    let out = u.run(&shim.path).args(["rc", "true"]).run();
    out.expect_code(255, "RemoteCommand and a command");
    assert!(out.stderr.contains("RemoteCommand"), "{out}");
    u.run(&shim.path)
        .args(["-o", "RemoteCommand=none", "rc", "echo", "given"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("given\n", &c);
    u.run(&shim.path)
        .args(["quiet", "cat"])
        .input(Input::Bytes(b"never read\n".to_vec()))
        .run()
        .expect_code(0, &c)
        .expect_stdout("", &c);
    let out = u.run(&shim.path).args(["nosession", "true"]).run();
    out.expect_code(255, "SessionType none");
    assert!(out.stderr.contains("SessionType none"), "{out}");
    // PubkeyAuthentication no: no key is offered, so skiff cannot log in.
    let before = d.log().matches("publickey").count();
    let out = u
        .run(&shim.path)
        .args(["-o", "PubkeyAuthentication=no", "box", "true"])
        .run();
    out.expect_code(255, "PubkeyAuthentication no");
    assert!(out.stderr.contains("PubkeyAuthentication is off"), "{out}");
    assert_eq!(
        d.log().matches("publickey").count(),
        before,
        "{c}: no key offered"
    );

    // What skiff does not do is an error that says so, before connecting.
    let out = u.run(&shim.path).args(["-M", "box", "true"]).run();
    out.expect_code(255, "-M");
    assert!(
        out.stderr.contains("-M (connection sharing as a master"),
        "{out}"
    );
    let out = u.run(&shim.path).args(["-D", "/tmp/x.sock", "box"]).run();
    out.expect_code(255, "-D with a socket");
    assert!(
        out.stderr
            .contains("Unix-socket forwarding is not supported"),
        "{out}"
    );
    let out = u.run(&shim.path).args(["-s", "box"]).run();
    out.expect_code(255, "-s without a name");
    // -X is accepted with a warning (the remote side sees no display).
    let out = u.run(&shim.path).args(["-X", "box", "true"]).run();
    out.expect_code(0, &c);
    assert!(out.stderr.contains("X11 forwarding"), "{out}");

    // A first contact records the host key and says so; -q keeps quiet.
    let fresh = User::new(&d, &fx, false);
    fs::remove_file(fresh.home().join(".ssh/known_hosts")).unwrap();
    let out = fresh.run(&shim.path).args(["-q", "box", "true"]).run();
    out.expect_code(0, &c);
    assert_eq!(out.stderr, "", "-q: nothing on stderr\n{out}");
    assert_eq!(
        known_hosts_lookup(&fresh.home().join(".ssh/known_hosts"), d.port()).len(),
        1,
        "-q still records the key"
    );
    let fresh = User::new(&d, &fx, false);
    fs::remove_file(fresh.home().join(".ssh/known_hosts")).unwrap();
    let out = fresh.run(&shim.path).args(["box", "true"]).run();
    out.expect_code(0, &c);
    assert!(out.stderr.contains("Permanently added"), "{out}");

    // -s runs a subsystem: skiffd's sftp server answers the SFTP version
    // exchange (SSH_FXP_INIT, version 3) with SSH_FXP_VERSION.
    let init = [0u8, 0, 0, 5, 1, 0, 0, 0, 3];
    let out = u
        .run(&shim.path)
        .args(["-s", "box", "sftp"])
        .input(Input::Bytes(init.to_vec()))
        .run();
    out.expect_code(0, &c);
    assert!(
        out.stdout.len() >= 9 && out.stdout[4] == 2,
        "{c}: an SSH_FXP_VERSION reply\n{out}"
    );
}

/// distcc with `DISTCC_SSH` pointing at skiff-ssh: each compile job runs
/// `distccd --inetd` on the remote host through skiff (seed 000's case).
/// Through the agent, every job shares one warm connection.
#[test]
fn distcc_compiles_through_skiff() {
    if !(require_tool("distcc", "distcc") && require_tool("cc", "build-essential")) {
        return;
    }
    each_server(|k| {
        let (server, u, shim, c) = (k.server, &k.u, &k.shim, &k.c);
        let work = tempdir();
        let state = tempdir();
        let before = logins(server);
        for n in 0..3 {
            let src = work.path().join(format!("unit{n}.c"));
            write_file(
                &src,
                format!("int unit{n}(int x) {{ return x * {n} + 1; }}\n"),
                0o644,
            );
            let out = u
                .run("distcc")
                .args(["cc", "-c"])
                .arg(&src)
                .arg("-o")
                .arg(work.path().join(format!("unit{n}.o")))
                .env("DISTCC_HOSTS", "@box/1")
                .env("DISTCC_SSH", &shim.path)
                .env("DISTCC_DIR", state.path())
                // A job that fails remotely must fail, not be compiled here.
                .env("DISTCC_FALLBACK", "0")
                .env("DISTCC_SKIP_LOCAL_RETRY", "1")
                .env("DISTCC_VERBOSE", "1")
                .run();
            out.expect_code(0, &format!("{c}: distcc job {n}"));
            // The object file is the one the remote distccd sent back.
            let obj = work.path().join(format!("unit{n}.o"));
            assert!(
                out.stderr
                    .contains(&format!("{} box distccd --inetd", shim.path.display()))
                    && out
                        .stderr
                        .contains(&format!("bytes to file {}", obj.display())),
                "{c}: distcc compiled remotely through skiff-ssh\n{out}"
            );
            let written = fs::metadata(&obj);
            assert!(written.is_ok_and(|m| m.len() > 0), "{c}: unit{n}.o written");
        }
        let used = logins(server) - before;
        assert_eq!(
            used,
            if k.agent { 1 } else { 3 },
            "{c}: logins for three distcc jobs"
        );
    });
}

/// `-b`/`BindAddress`, `-B`/`BindInterface` and `-4`/`-6`/`AddressFamily`
/// choose where the connection comes from and which addresses it goes to.
#[test]
fn source_address_and_address_family() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let u = User::new(&d, &fx, false);
    let c = || server_context(&d, "skiffd");
    let client_ip = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["box", "echo $SSH_CLIENT"]);
        let out = u.run(skiff_bin()).arg("ssh").args(&all).run();
        out.expect_code(0, &c());
        out.stdout_str()
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(client_ip(&["-b", "127.0.0.3"]), "127.0.0.3");
    assert_eq!(client_ip(&["-o", "BindAddress=127.0.0.4"]), "127.0.0.4");
    assert_eq!(client_ip(&["-B", "lo", "-4"]), "127.0.0.1");

    let out = u
        .run(skiff_bin())
        .args(["ssh", "-B", "nosuch0", "box", "true"])
        .run();
    out.expect_skiff_failure(&["BindInterface nosuch0"], "a missing interface");
    // The server has an IPv4 address only.
    let out = u.run(skiff_bin()).args(["ssh", "-6", "box", "true"]).run();
    out.expect_skiff_failure(&["AddressFamily"], "no IPv6 address");

    let out = u
        .run(skiff_bin())
        .args(["ssh", "-G", "-4", "-b", "127.0.0.3", "box"])
        .run();
    let text = out.stdout_str();
    assert!(
        text.contains("addressfamily inet\n") && text.contains("bindaddress 127.0.0.3\n"),
        "{text}"
    );
}

/// `CanonicalizeHostname`: a short name is tried in each of
/// `CanonicalDomains`; the first that resolves is the host, and its own
/// `Host` block applies in the second pass. (The only names every machine
/// resolves are addresses, so `127.0.0` in domain `1` stands in for `web`
/// in `example.org`.)
#[test]
fn canonicalized_host_names_pick_up_their_own_blocks() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let c = || server_context(&d, "CanonicalizeHostname");
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let config = |extra: &str| {
        format!(
            "CanonicalizeHostname yes\nCanonicalizeMaxDots 2\n{extra}\
             Host 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
             BatchMode yes\n  ConnectTimeout 10\n",
            d.port(),
            user(),
            fx.client_key.private.display()
        )
    };
    let skiff = || {
        Run::new(skiff_bin())
            .env("HOME", home.path())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
    };
    let ssh_config = home.ssh_dir().join("config");
    write_file(
        &ssh_config,
        config("CanonicalDomains nowhere.invalid 1\n"),
        0o600,
    );
    skiff()
        .args(["ssh", "127.0.0", "echo", "canonical"])
        .run()
        .expect_code(0, &c())
        .expect_stdout("canonical\n", &c());
    let shown = skiff().args(["ssh", "-G", "127.0.0"]).run();
    assert!(
        shown.stdout_str().contains("hostname 127.0.0.1\n")
            && shown.stdout_str().contains(&format!("port {}\n", d.port())),
        "{}",
        shown
    );

    // Nothing resolves: without fallback, skiff refuses before connecting.
    write_file(
        &ssh_config,
        config("CanonicalDomains nowhere.invalid\nCanonicalizeFallbackLocal no\n"),
        0o600,
    );
    let out = skiff().args(["ssh", "127.0.0", "true"]).run();
    out.expect_skiff_failure(&["could not resolve host \"127.0.0\""], "no fallback");
}
