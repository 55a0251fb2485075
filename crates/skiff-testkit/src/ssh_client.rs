//! OpenSSH's client programs run against 127.0.0.1: the `ssh` builder
//! (`Ssh`), a private `ssh-agent` (`Agent`), and stock `sftp -b`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::accounts::user;
use super::daemon::{DaemonProc, START_TIMEOUT};
use super::files::tempdir;
use super::keys::Key;
use super::run::{CmdOutput, Input, Run, DEFAULT_TIMEOUT};

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
    /// `BatchMode=yes` (the default: a test never waits on a question).
    batch: bool,
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
        batch: true,
    }
}

/// A stock `ssh` as `user` to 127.0.0.1:`port` with `key` alone, as a
/// [`Command`] for a test that acts on the running client (kills it, say):
/// no config file and no agent, batch mode, any host key accepted and
/// none recorded. The caller adds the remote command and the stdio.
pub fn ssh_command(port: u16, user: &str, key: &Key) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.env_remove("SSH_AUTH_SOCK")
        .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
        .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
        .args(["-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-i")
        .arg(&key.private)
        .arg(format!("{user}@127.0.0.1"));
    cmd
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

    /// Not in BatchMode: ssh may ask for passwords (through `SSH_ASKPASS`,
    /// see [`Self::askpass`]).
    pub fn interactive(mut self) -> Self {
        self.batch = false;
        self
    }

    /// Answers ssh's questions with `program` (`SSH_ASKPASS_REQUIRE=force`),
    /// and allows questions.
    pub fn askpass(self, program: &Path) -> Self {
        self.interactive()
            .env("SSH_ASKPASS", program)
            .env("SSH_ASKPASS_REQUIRE", "force")
    }

    pub fn run(self) -> CmdOutput {
        let scratch = tempdir();
        let mut run = Run::new("ssh")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("SSH_ASKPASS_REQUIRE")
            .env("HOME", scratch.path())
            .args(["-F", "/dev/null"])
            .arg("-o")
            .arg(format!(
                "BatchMode={}",
                if self.batch { "yes" } else { "no" }
            ))
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
        Self::start_with(&[], &[])
    }

    /// `ssh-agent -D -a SOCK ARGS...`, with `env` set for it (and the
    /// helpers it runs).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Agent {
        let dir = tempdir();
        let sock = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .args(args)
            .envs(env.iter().copied())
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

    /// `ssh-add -S PROVIDER KEY`: a security key (unencrypted), signed
    /// with by the agent through the FIDO middleware `provider`.
    pub fn add_security_key(&self, key: &Key, provider: &Path) {
        let path = key.private.to_string_lossy().into_owned();
        let provider = provider.to_string_lossy().into_owned();
        self.ssh_add(&["-S", &provider, &path], None)
            .expect_code(0, "ssh-add -S security key");
    }

    /// `ssh-add -L`: the public keys the agent holds.
    pub fn list(&self) -> String {
        self.ssh_add(&["-L"], None).stdout_str()
    }
}

// ---------------------------------------------------------------------------
// Stock sftp
// ---------------------------------------------------------------------------

/// Stock `sftp -b BATCH` as the test account against 127.0.0.1:`port`
/// with `key`, host keys unchecked.
pub fn stock_sftp_batch(port: u16, key: &Key, batch: &Path) -> CmdOutput {
    stock_sftp_batch_as(port, user(), key, batch)
}

/// [`stock_sftp_batch`] as the account `name`.
pub fn stock_sftp_batch_as(port: u16, name: &str, key: &Key, batch: &Path) -> CmdOutput {
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
        .arg(format!("{name}@127.0.0.1"))
        .run()
}
