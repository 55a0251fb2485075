//! Running a program with a bounded run time and captured output (`Run`,
//! its `Input` and `CmdOutput`), and the time limits the tests use.

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Default limit for a single client invocation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Limit for invocations that move a lot of data (debug builds are slow).
pub const BULK_TIMEOUT: Duration = Duration::from_secs(300);

/// Limit for the 10 MB round trip through remote `cat` (a flow-control
/// deadlock shows up as a hang here).
pub const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(120);
/// Size of the large stdin transfer.
pub const BIG: usize = 100 * 1024 * 1024;

/// What a client invocation gets on stdin.
#[derive(Clone, Debug)]
pub enum Input {
    Null,
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// Result of one client invocation.
pub struct CmdOutput {
    /// Exit code; death by signal N is reported as 128+N like a shell does.
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// The command line, for assertion messages.
    pub label: String,
}

impl CmdOutput {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Panics (with the full output) unless the exit code is `code`.
    pub fn expect_code(&self, code: i32, context: &str) -> &Self {
        assert_eq!(
            self.code, code,
            "{context}: expected exit code {code}\n{self}"
        );
        self
    }

    /// Panics unless stdout is exactly `expected`.
    pub fn expect_stdout(&self, expected: &str, context: &str) -> &Self {
        assert_eq!(
            self.stdout_str(),
            expected,
            "{context}: unexpected stdout\n{self}"
        );
        self
    }

    /// Non-empty stderr lines.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Asserts skiff's failure contract: exit code 255, nothing on stdout
    /// and exactly one stderr line, starting with `skiff: ` and containing
    /// every needle (case-insensitive).
    pub fn expect_skiff_failure(&self, needles: &[&str], context: &str) -> &Self {
        self.expect_code(255, context);
        assert!(
            self.stdout.is_empty(),
            "{context}: nothing should reach stdout\n{self}"
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "{context}: expected exactly one stderr line\n{self}"
        );
        assert!(
            lines[0].starts_with("skiff: "),
            "{context}: stderr line must start with `skiff: `\n{self}"
        );
        let lower = lines[0].to_lowercase();
        for n in needles {
            assert!(
                lower.contains(&n.to_lowercase()),
                "{context}: stderr should mention {n:?}\n{self}"
            );
        }
        self
    }
}

pub(super) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [{} bytes total]", &s[..end], s.len())
}

impl fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: {}", self.label)?;
        writeln!(f, "exit code: {}", self.code)?;
        match std::str::from_utf8(&self.stdout) {
            Ok(text) => writeln!(f, "stdout: {:?}", clip(text, 2000))?,
            Err(_) => {
                let head: String = self
                    .stdout
                    .iter()
                    .take(32)
                    .map(|b| format!("{b:02x}"))
                    .collect();
                writeln!(
                    f,
                    "stdout: <{} bytes of binary data, starting {head}>",
                    self.stdout.len()
                )?
            }
        }
        write!(f, "stderr: {:?}", clip(&self.stderr, 4000))
    }
}

impl fmt::Debug for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Kills and reaps a child when dropped (including during a panic).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command with a bounded run time and captured output.
pub struct Run {
    cmd: Command,
    input: Input,
    timeout: Duration,
    /// Where stdout goes instead of the captured output ([`Run::stdout_to`]).
    stdout_file: Option<PathBuf>,
}

impl Run {
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Run {
            cmd: Command::new(program),
            input: Input::Null,
            timeout: DEFAULT_TIMEOUT,
            stdout_file: None,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(a);
        self
    }

    pub fn args<I, S>(mut self, a: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(a);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
        self.cmd.env_remove(k);
        self
    }

    /// Passphrases come from `program` (`SSH_ASKPASS`, forced).
    pub fn askpass(self, program: &Path) -> Self {
        self.env("SSH_ASKPASS", program)
            .env("SSH_ASKPASS_REQUIRE", "force")
    }

    pub fn input(mut self, input: Input) -> Self {
        self.input = input;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Writes stdout into the file at `path` (created or truncated), never
    /// blocking the command: the captured stdout stays empty. For large
    /// outputs, and for clients that misbehave behind a pipe read slowly.
    pub fn stdout_to(mut self, path: &Path) -> Self {
        self.stdout_file = Some(path.to_path_buf());
        self
    }

    /// Runs the command to completion. Panics if it cannot be spawned or
    /// does not finish within the timeout (it is killed first).
    pub fn run(self) -> CmdOutput {
        let Run {
            mut cmd,
            input,
            timeout,
            stdout_file,
        } = self;
        let label = describe(&cmd);
        match &stdout_file {
            Some(path) => {
                let f =
                    File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
                cmd.stdout(f)
            }
            None => cmd.stdout(Stdio::piped()),
        };
        cmd.stderr(Stdio::piped());
        let mut bytes = None;
        match input {
            Input::Null => {
                cmd.stdin(Stdio::null());
            }
            Input::Bytes(b) => {
                cmd.stdin(Stdio::piped());
                bytes = Some(b);
            }
            Input::File(p) => {
                let f = File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
                cmd.stdin(f);
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {label}: {e}"));
        let mut guard = KillOnDrop(child);
        if let Some(b) = bytes {
            let mut stdin = guard.0.stdin.take().expect("piped stdin");
            // The child may exit without reading everything: a broken pipe
            // is not an error here.
            thread::spawn(move || {
                let _ = stdin.write_all(&b);
            });
        }
        let out_buf = Arc::new(Mutex::new(Vec::new()));
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done_rx) = mpsc::channel::<()>();
        spawn_reader(guard.0.stdout.take(), out_buf.clone(), done_tx.clone());
        spawn_reader(guard.0.stderr.take(), err_buf.clone(), done_tx);

        let deadline = Instant::now() + timeout;
        let status = loop {
            match guard.0.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(e) => panic!("waiting for {label}: {e}"),
            }
            if Instant::now() >= deadline {
                let _ = guard.0.kill();
                let _ = guard.0.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(10));
        };
        // Both readers finish once every holder of the pipes is gone.
        let grace = Instant::now() + Duration::from_secs(10);
        let mut finished = 0;
        while finished < 2 {
            let left = grace.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(()) => finished += 1,
                Err(_) => break,
            }
        }
        let snapshot = CmdOutput {
            code: status.map(exit_code).unwrap_or(-1),
            stdout: out_buf.lock().unwrap().clone(),
            stderr: String::from_utf8_lossy(&err_buf.lock().unwrap()).into_owned(),
            label,
        };
        if status.is_none() {
            panic!("timed out after {timeout:?} (killed)\n{snapshot}");
        }
        if finished < 2 {
            panic!("process exited but its output pipes stayed open for 10 s (a descendant holds them)\n{snapshot}");
        }
        snapshot
    }
}

fn spawn_reader<R: Read + Send + 'static>(
    src: Option<R>,
    buf: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Sender<()>,
) {
    thread::spawn(move || {
        if let Some(mut src) = src {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match src.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
        }
        let _ = done.send(());
    });
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            parts.push(format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            parts.push(a.into_owned());
        }
    }
    parts.join(" ")
}
