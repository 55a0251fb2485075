//! The `skiffd` under test: `Skiffd` and its `SkiffdOptions`, the setups
//! that start one for a [`Fixture`], a run on a configuration it must
//! refuse, and the skiffd (and the `Subsystem` lines naming it) the test
//! account can run.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use super::daemon::{free_port, DaemonCore, Launch};
use super::environment::{is_root, prlimit_bin, require_openssh, skiffd_bin};
use super::files::{tempdir, write_file};
use super::keys::{Fixture, Key};
use super::run::{CmdOutput, Run};

static LAUNCH_SEQ: AtomicU64 = AtomicU64::new(0);

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
    /// The open-file limit (soft, hard) skiffd starts with (set by
    /// `prlimit`, before the wrapper).
    pub open_files: Option<(u64, u64)>,
    /// Start [`account_skiffd`] rather than the skiffd under test, so that
    /// what skiffd runs as the account from its own executable
    /// (`Subsystem sftp internal-sftp ...`) can run whatever the checkout's
    /// directory modes.
    pub account_runnable: bool,
    /// A command line of the test's own (sshd's spellings, say) instead of
    /// the harness's `--listen`, `--authorized-keys` and `--host-key`;
    /// `{port}` in an argument stands for the port skiffd must listen on
    /// at 127.0.0.1.
    pub command_line: Option<Vec<String>>,
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
            account_runnable: false,
            command_line: None,
        }
    }

    /// See [`Self::account_runnable`].
    pub fn account_runnable(mut self) -> Self {
        self.account_runnable = true;
        self
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

    /// Starts skiffd with `args` (see [`Self::command_line`]).
    pub fn command_line<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command_line = Some(args.into_iter().map(Into::into).collect());
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

    /// Sends `signal` to skiffd's listener (`SIGHUP`: read the
    /// configuration again).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal)
            .unwrap_or_else(|e| panic!("kill({pid}, {signal}): {e}"));
    }

    /// Stops the listener as a service manager does (SIGTERM) and waits
    /// for it to exit (bounded); the processes of established connections
    /// carry on. [`Skiffd::start_again`] starts a new listener.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let proc = self.core.proc.as_mut().expect("skiffd is running");
        let deadline = std::time::Instant::now() + crate::daemon::START_TIMEOUT;
        loop {
            match proc.child.try_wait() {
                Ok(Some(status)) => {
                    self.core.proc = None;
                    return status;
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Ok(None) => panic!(
                    "skiffd did not exit within {:?} of SIGTERM",
                    crate::daemon::START_TIMEOUT
                ),
                Err(e) => panic!("wait for skiffd: {e}"),
            }
        }
    }

    /// Starts skiffd again on the same port with the same options, after
    /// [`Skiffd::terminate`] or [`Skiffd::kill`].
    pub fn start_again(&mut self) {
        self.relaunch();
    }

    /// The process ids of skiffd's own processes: the listener, its zygote
    /// and the processes serving connections (or waiting to), not the
    /// commands they started.
    pub fn processes(&self) -> Vec<u32> {
        let mut found = vec![self.pid()];
        let mut i = 0;
        while i < found.len() {
            let parent = found[i];
            for child in children(parent) {
                if is_skiffd_server_process(child) && !found.contains(&child) {
                    found.push(child);
                }
            }
            i += 1;
        }
        found
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

    /// The memory of all skiffd's own processes ([`Skiffd::processes`]),
    /// in bytes: now, their proportional set sizes summed (each page that n
    /// of them share counted 1/n: the forked processes share most of
    /// theirs), and the peak, estimated as that plus how far each one's
    /// resident size ever rose above where it is now (VmHWM - VmRSS: the
    /// memory it held for its peer and gave back).
    pub fn memory(&self) -> (u64, u64) {
        let (mut now, mut peak) = (0, 0);
        for pid in self.processes() {
            // A process may end between the listing and the reads.
            let Ok(rollup) = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
                continue;
            };
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            let pss = kib_field(&rollup, "Pss:").unwrap_or(0);
            let rss = kib_field(&status, "VmRSS:").unwrap_or(0);
            let hwm = kib_field(&status, "VmHWM:").unwrap_or(0);
            now += pss;
            peak += pss + hwm.saturating_sub(rss);
        }
        (now, peak)
    }
}

/// A `Name:   123 kB` field of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// The children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` is a skiffd listener, zygote or connection process (its
/// command line names no helper mode of skiffd's).
fn is_skiffd_server_process(pid: u32) -> bool {
    let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let own = exe.file_name().is_some_and(|n| n == "skiffd");
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let helper = cmdline.split(|b| *b == 0).any(|arg| {
        matches!(
            arg,
            b"--pam-session" | b"--sftp-server" | b"--transfer-server"
        )
    });
    own && !helper
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
        // The open-file limit is set by util-linux's `prlimit`, which then
        // runs the rest of the command line (the wrapper, or skiffd).
        let limit = self.opts.open_files.map(|(soft, hard)| {
            [
                OsString::from(prlimit_bin()),
                OsString::from(format!("--nofile={soft}:{hard}")),
                OsString::from("--"),
            ]
        });
        let mut program = limit
            .iter()
            .flatten()
            .chain(&self.opts.wrapper)
            .cloned()
            .chain(std::iter::once(match self.opts.account_runnable {
                true => account_skiffd().as_os_str().to_owned(),
                false => OsString::from(skiffd_bin()),
            }));
        let mut cmd = Command::new(program.next().expect("a program"));
        cmd.args(program);
        // The log level is the test's choice (-v, LogLevel), not the
        // developer's environment's.
        cmd.env_remove("SKIFF_LOG");
        if let Some(args) = &self.opts.command_line {
            let port = self.core.port.to_string();
            cmd.args(args.iter().map(|a| a.replace("{port}", &port)));
        } else {
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
        self.core.spawn(cmd, None)
    }
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

/// The test peer `name` of `package` ([`crate::test_peer`]) at a path the
/// test account can run: the one built, or (run as root, when a directory
/// above it is closed to others) a copy, made once per peer and test
/// process, in a directory it can reach.
pub fn account_test_peer(manifest_dir: &str, package: &str, name: &str) -> PathBuf {
    /// Copies the test account can run, by peer name, in one directory.
    #[derive(Default)]
    struct Copies {
        dir: Option<TempDir>,
        made: Vec<(String, PathBuf)>,
    }
    static COPIES: OnceLock<std::sync::Mutex<Copies>> = OnceLock::new();
    let built = crate::test_peer(manifest_dir, package, name);
    if !is_root() || runnable_by_others(&built) {
        return built;
    }
    let mut copies = COPIES.get_or_init(Default::default).lock().unwrap();
    if let Some((_, p)) = copies.made.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let dir = copies.dir.get_or_insert_with(tempdir).path().to_path_buf();
    let copy = dir.join(name);
    fs::copy(&built, &copy).expect("copy test peer");
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod test peer");
    copies.made.push((name.to_string(), copy.clone()));
    copy
}

/// The records of `event` in the `AuditLog` of `d` at `path`, once there
/// are `want` of them (30 s at most; then there must be exactly `want`).
/// A line that is not JSON fails the test.
pub fn audit_events(path: &Path, event: &str, want: usize, d: &Skiffd) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = fs::read_to_string(path).unwrap_or_default();
        let found: Vec<serde_json::Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| {
                    panic!(
                        "not JSON ({e}): {l:?}\n{}",
                        crate::server_context(d, "audit")
                    )
                })
            })
            .filter(|r| r["event"] == event)
            .collect();
        if found.len() >= want || std::time::Instant::now() > deadline {
            assert_eq!(
                found.len(),
                want,
                "{text}\n{}",
                crate::server_context(d, &format!("{event} records"))
            );
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `--config` text skiffd needs to serve SFTP here: nothing when the
/// default (skiffd's own path) works, else a `Subsystem sftp` line naming
/// the copy.
pub fn sftp_subsystem_config() -> Option<String> {
    let exe = account_skiffd();
    (exe != Path::new(skiffd_bin()))
        .then(|| format!("Subsystem sftp '{}' --sftp-server\n", exe.display()))
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
