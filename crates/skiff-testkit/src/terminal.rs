//! A program run on a pseudo-terminal of its own, for what a person at a
//! terminal sees: progress bars, questions, what is drawn over what.

use std::time::{Duration, Instant};

/// A child process on a new pseudo-terminal, which is its controlling
/// terminal and its stdin, stdout and stderr; the terminal's output is collected
/// by a thread until the child has gone.
pub struct OnTerminal {
    child: std::process::Child,
    master: std::fs::File,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    /// Says when the reader has taken everything the terminal showed.
    drained: std::sync::mpsc::Receiver<()>,
}

impl OnTerminal {
    /// Starts `cmd` on a new pseudo-terminal: through util-linux's
    /// `setsid --ctty`, which gives it a session of its own whose
    /// controlling terminal is that one. The environment changes and the
    /// working directory set on `cmd` are kept.
    pub fn spawn(cmd: std::process::Command) -> OnTerminal {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let (master, slave) = (pty.master, pty.slave);
        let mut wrapped = std::process::Command::new("setsid");
        wrapped
            .arg("--ctty")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (name, value) in cmd.get_envs() {
            match value {
                Some(value) => wrapped.env(name, value),
                None => wrapped.env_remove(name),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        let mut cmd = wrapped;
        cmd.stdin(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap());
        let child = cmd.spawn().expect("spawn on a terminal");
        drop(slave);
        let master = std::fs::File::from(master);
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = output.clone();
        let (drained_tx, drained) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once the child and its descendants closed the terminal.
            while let Ok(n) = std::io::Read::read(&mut reader, &mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = drained_tx.send(());
        });
        OnTerminal {
            child,
            master,
            output,
            drained,
        }
    }

    /// Its process id, for signals (`setsid` runs it in its own place,
    /// without a fork: the test's child is not a process group leader).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Everything the terminal has shown so far.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the terminal has shown `text`; its byte offset just after.
    pub fn wait_for(&self, text: &str, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.output();
            if let Some(at) = out.find(text) {
                return at + text.len();
            }
            assert!(
                Instant::now() < deadline,
                "no {text:?} on the terminal:\n{out:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn type_line(&mut self, line: &str) {
        std::io::Write::write_all(&mut self.master, format!("{line}\n").as_bytes()).unwrap();
    }

    /// The exit status, killing the child if it has not ended in time. The
    /// terminal's last output is read before it returns (the child may exit
    /// before the reader has taken what it wrote last).
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let _ = self.drained.recv_timeout(Duration::from_secs(30));
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running after {limit:?}:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
