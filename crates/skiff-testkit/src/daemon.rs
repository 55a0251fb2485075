//! What every server the tests run shares: the `Daemon` trait the tests
//! talk to, a free loopback port, starting the process and waiting
//! (bounded) until it accepts connections, its log, and restarting it with
//! another host key. `sshd.rs` and `skiffd.rs` build on it.

use std::fs::{self, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::files::tempdir;
use super::keys::Key;
use super::run::clip;

/// Limit for a daemon to start accepting connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A server the tests talk to.
pub trait Daemon {
    /// Port on 127.0.0.1.
    fn port(&self) -> u16;
    /// Everything the daemon logged so far.
    fn log(&self) -> String;
    /// Stops the daemon and starts it again on the same port, presenting
    /// `key` as its (only) host key.
    fn restart_with_host_key(&mut self, key: &Key);
}

/// `what`, followed by the server's log so far (clipped), for assertion
/// messages.
pub fn server_context(server: &dyn Daemon, what: &str) -> String {
    format!("{what}\n--- server log ---\n{}", clip(&server.log(), 8000))
}

/// Asks the kernel for a currently free port on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// A running daemon process: killed and reaped on drop.
pub(super) struct DaemonProc {
    pub(super) child: Child,
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Startup {
    Ready,
    /// The process exited before accepting connections.
    Exited(ExitStatus),
    TimedOut,
}

/// Polls until 127.0.0.1:`port` accepts a connection and `ready()` holds,
/// while the daemon keeps running. Bounded by [`START_TIMEOUT`].
fn wait_until_listening(proc: &mut DaemonProc, port: u16, ready: impl Fn() -> bool) -> Startup {
    let deadline = Instant::now() + START_TIMEOUT;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        if let Ok(Some(st)) = proc.child.try_wait() {
            return Startup::Exited(st);
        }
        if ready() && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            // Make sure it is our daemon that answered and not a process
            // that grabbed the port in between: ours must still be alive.
            thread::sleep(Duration::from_millis(50));
            if let Ok(Some(st)) = proc.child.try_wait() {
                return Startup::Exited(st);
            }
            return Startup::Ready;
        }
        if Instant::now() >= deadline {
            return Startup::TimedOut;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// What every daemon the harness runs has: a name for messages, a port, a
/// private directory, a log file that collects the output of every start,
/// and the running process.
pub(super) struct DaemonCore {
    name: &'static str,
    pub(super) port: u16,
    pub(super) dir: TempDir,
    log_path: PathBuf,
    pub(super) proc: Option<DaemonProc>,
}

impl DaemonCore {
    pub(super) fn new(name: &'static str) -> Self {
        let dir = tempdir();
        let log_path = dir.path().join(format!("{name}.log"));
        DaemonCore {
            name,
            port: 0,
            dir,
            log_path,
            proc: None,
        }
    }

    fn log(&self) -> String {
        read_lossy(&self.log_path)
    }

    /// Spawns `cmd` (stdin from /dev/null, stdout and stderr appended to
    /// the log) and waits until it accepts connections on the port and,
    /// when a `marker` is given, has logged it during this start.
    pub(super) fn spawn(&mut self, mut cmd: Command, marker: Option<&str>) -> Result<(), String> {
        let offset = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0) as usize;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("open {} log: {e}", self.name));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.name))?;
        let mut proc = DaemonProc { child };
        let ready = || {
            marker.is_none_or(|m| {
                read_lossy(&self.log_path)
                    .get(offset..)
                    .unwrap_or("")
                    .contains(m)
            })
        };
        let (name, port) = (self.name, self.port);
        match wait_until_listening(&mut proc, port, ready) {
            Startup::Ready => {
                self.proc = Some(proc);
                Ok(())
            }
            Startup::Exited(st) => Err(format!(
                "{name} exited early ({st}) on port {port}; log:\n{}",
                self.log()
            )),
            Startup::TimedOut => Err(format!(
                "{name} not accepting on port {port} after {START_TIMEOUT:?}; log:\n{}",
                self.log()
            )),
        }
    }
}

/// How the harness starts and restarts one kind of daemon.
pub(super) trait Launch {
    fn core(&self) -> &DaemonCore;
    fn core_mut(&mut self) -> &mut DaemonCore;
    /// Starts the daemon on `core().port` with the current settings.
    fn launch(&mut self) -> Result<(), String>;
    /// Makes `key` the only host key for the next launch.
    fn set_only_host_key(&mut self, key: &Key);

    /// Starts the daemon on a free port, trying three ports (another
    /// process may take a port between the probe and the bind).
    fn start_on_free_port(&mut self) {
        let mut last = String::new();
        for _ in 0..3 {
            self.core_mut().port = free_port();
            match self.launch() {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        panic!("{} did not start (3 attempts): {last}", self.core().name);
    }

    /// Stops the daemon and starts it again on the same port.
    fn relaunch(&mut self) {
        self.core_mut().proc = None; // kill + wait
        if let Err(e) = self.launch() {
            panic!("{} restart failed: {e}", self.core().name);
        }
    }
}

impl<D: Launch> Daemon for D {
    fn port(&self) -> u16 {
        self.core().port
    }

    fn log(&self) -> String {
        self.core().log()
    }

    fn restart_with_host_key(&mut self, key: &Key) {
        self.set_only_host_key(key);
        self.relaunch();
    }
}
