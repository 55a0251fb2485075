//! The throwaway skiffd `skiff demo` talks to: the `skiffd` binary beside
//! this `skiff`, started on a free loopback port with the demo's keys,
//! waited for (bounded) until it accepts connections, and killed when
//! dropped. Its log (warnings and errors, unless `SKIFF_LOG` asks for
//! more) goes to a file in the demo's private directory and is shown when
//! it holds anything.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long skiffd may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running skiffd on 127.0.0.1: killed and reaped on drop.
pub(super) struct DemoSkiffd {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl DemoSkiffd {
    /// Starts the skiffd next to this executable with `host_key`, serving
    /// the keys in `authorized_keys`, its log in `dir`. A port is chosen
    /// free and then bound by skiffd, so another process may take it in
    /// between: three ports are tried.
    pub(super) async fn start(
        dir: &Path,
        host_key: &Path,
        authorized_keys: &Path,
    ) -> anyhow::Result<DemoSkiffd> {
        let exe = skiffd_exe()?;
        let mut last = None;
        for attempt in 1..=3 {
            let port = free_port()?;
            let log = dir.join(format!("skiffd-{attempt}.log"));
            let file = std::fs::File::create(&log)
                .with_context(|| format!("cannot create {}", log.display()))?;
            let mut command = Command::new(&exe);
            command
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--host-key")
                .arg(host_key)
                .arg("--authorized-keys")
                .arg(authorized_keys)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file);
            if std::env::var_os("SKIFF_LOG").is_none() {
                // As quiet as the rest of the demo: warnings and errors.
                command.env("SKIFF_LOG", "warn");
            }
            let child = command
                .spawn()
                .with_context(|| format!("cannot start {}", exe.display()))?;
            let mut server = DemoSkiffd { child, port, log };
            match server.wait_until_listening().await {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("three attempts"))
    }

    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// What skiffd logged so far.
    pub(super) fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Polls until 127.0.0.1:port accepts a connection while skiffd keeps
    /// running, at most [`START_TIMEOUT`].
    async fn wait_until_listening(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            self.check_running()?;
            let probe = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(addr),
            );
            if let Ok(Ok(_)) = probe.await {
                // Our skiffd answered, not a process that took the port
                // in between: ours is still running.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return self.check_running();
            }
            if Instant::now() >= deadline {
                bail!(
                    "skiffd was not accepting connections on 127.0.0.1:{} after {START_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => bail!(
                "skiffd exited ({status}) on 127.0.0.1:{}; its log:\n{}",
                self.port,
                self.log()
            ),
        }
    }
}

impl Drop for DemoSkiffd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `skiffd` beside this `skiff` (both are built into the same target
/// directory, and installed side by side).
fn skiffd_exe() -> anyhow::Result<PathBuf> {
    let skiff = std::env::current_exe().context("cannot find skiff's own executable")?;
    let skiffd = skiff.with_file_name("skiffd");
    if !skiffd.is_file() {
        bail!(
            "{} is missing: the demo runs the skiffd next to skiff; build it with \
             `cargo build --release --bin skiffd`",
            skiffd.display()
        );
    }
    Ok(skiffd)
}

/// A port on 127.0.0.1 that is free now.
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
