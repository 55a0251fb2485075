//! The `skiff` client under test: a private HOME (`ClientHome`), the
//! `skiff exec` builder (`SkiffExec`), naming a server `box` in
//! `~/.ssh/config`, and a private runtime directory for one test's agent
//! (`AgentHome`).

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::accounts::user;
use super::daemon::Daemon;
use super::environment::skiff_bin;
use super::files::{tempdir, write_file};
use super::keys::{known_hosts_line, Fixture, Key};
use super::run::{CmdOutput, Input, Run, BULK_TIMEOUT, DEFAULT_TIMEOUT};

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

// ---------------------------------------------------------------------------
// skiff's agent
// ---------------------------------------------------------------------------

/// A private runtime directory (XDG_RUNTIME_DIR) for one test's agent; the
/// agent is stopped, and if need be killed, on drop.
pub struct AgentHome {
    pub runtime: tempfile::TempDir,
    pub home: ClientHome,
}

impl Default for AgentHome {
    fn default() -> Self {
        Self::new()
    }
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
            // A leftover agent of this test.
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// `skiff cp` with hermetic options (no agent, no config, a throwaway
/// known_hosts), as the test account, to `port`.
pub fn skiff_cp(port: u16, key: &Key, args: &[&str]) -> CmdOutput {
    skiff_cp_env(port, key, &[], args)
}

/// `skiff cp ARGS` through the agent of `ah` (started for the first copy,
/// kept for the next), to 127.0.0.1:`port`, bounded by [`BULK_TIMEOUT`].
pub fn skiff_cp_via_agent(ah: &AgentHome, port: u16, key: &Key, args: &[&str]) -> CmdOutput {
    skiff_cp_in(ah.home.path(), Some(ah.runtime.path()), port, key, args)
}

/// [`skiff_cp_via_agent`] with `env` set as well (`SKIFF_LOG`, say).
pub fn skiff_cp_via_agent_env(
    ah: &AgentHome,
    port: u16,
    key: &Key,
    env: &[(&str, &str)],
    args: &[&str],
) -> CmdOutput {
    let mut run = cp_command(ah.home.path(), Some(ah.runtime.path()), port, key);
    for (name, value) in env {
        run = run.env(name, value);
    }
    run.args(args).run()
}

/// `skiff cp ARGS` with HOME `home` (its known_hosts there, host keys
/// accepted), through the agent whose runtime directory is `runtime`
/// (none: directly), to 127.0.0.1:`port`, bounded by [`BULK_TIMEOUT`].
pub fn skiff_cp_in(
    home: &Path,
    runtime: Option<&Path>,
    port: u16,
    key: &Key,
    args: &[&str],
) -> CmdOutput {
    cp_command(home, runtime, port, key).args(args).run()
}

/// [`skiff_cp`] with `env` set as well (`SKIFF_LOG`, say).
pub fn skiff_cp_env(port: u16, key: &Key, env: &[(&str, &str)], args: &[&str]) -> CmdOutput {
    let scratch = tempdir();
    let mut run = cp_command(scratch.path(), None, port, key);
    for (name, value) in env {
        run = run.env(name, value);
    }
    run.args(args).run()
}

/// `skiff cp` with its hermetic options and no arguments yet, as
/// [`skiff_cp_in`] describes.
fn cp_command(home: &Path, runtime: Option<&Path>, port: u16, key: &Key) -> Run {
    let run = Run::new(skiff_bin())
        .env("HOME", home)
        .env_remove("SSH_AUTH_SOCK")
        .env("XDG_STATE_HOME", home.join("state"));
    let run = match runtime {
        Some(dir) => run.env("SKIFF_AGENT", "on").env("XDG_RUNTIME_DIR", dir),
        None => run.env("SKIFF_AGENT", "off"),
    };
    run.args(["cp", "-F", "/dev/null", "-o", "BatchMode=yes"])
        .args(["-o", "StrictHostKeyChecking=no", "-o", "ConnectTimeout=10"])
        .arg(format!(
            "-oUserKnownHostsFile={}",
            home.join("known_hosts").display()
        ))
        .arg("-i")
        .arg(&key.private)
        .args(["-P", &port.to_string()])
        .timeout(BULK_TIMEOUT)
}
