//! skiff client -> real OpenSSH `sshd`.
//!
//! Every test starts its own private sshd on a free 127.0.0.1 port (see
//! `skiff_testkit::Sshd`) and runs the `skiff` binary against it with a private
//! HOME. `harness_sanity` checks the fixture with OpenSSH's own `ssh`, so a
//! failure there points at the harness or the host, not at skiff. Failures
//! that need no SSH server at all (nothing listening, a silent peer, a bad
//! config file) are tested here too.

mod skiff_cases;

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::*;

/// sshd config lines for the skiff tests: nothing special is needed.
const SSHD_EXTRA: &[&str] = &[];

fn setup() -> Option<(Fixture, Sshd)> {
    sshd_setup(SSHD_EXTRA)
}

skiff_client_tests!(setup);

/// The fixture works with stock OpenSSH on both ends: login as the test
/// account, exact output, exit codes, host key as configured, rejection of
/// an unknown key.
#[test]
fn harness_sanity() {
    let Some((fx, sshd)) = setup() else { return };
    let acct = account();
    let port = sshd.port();

    let out = ssh_cmd(
        port,
        &acct.name,
        &fx.client_key,
        &["echo out; echo err >&2; id -un; exit 5"],
    );
    let c = format!("ssh -> sshd\n--- sshd log ---\n{}", sshd.log());
    out.expect_code(5, &c)
        .expect_stdout(&format!("out\n{}\n", acct.name), &c);
    assert_eq!(out.stderr, "err\n", "{c}\n{out}");

    // sshd presents exactly the host key we configured.
    let kh = fx.path().join("sanity_known_hosts");
    write_file(
        &kh,
        format!("{}\n", known_hosts_line(port, &fx.host_key)),
        0o644,
    );
    ssh(port, &acct.name, &fx.client_key)
        .known_hosts(&kh)
        .args(&["true"])
        .run()
        .expect_code(0, &c);

    // An unknown key is refused.
    let out = ssh_cmd(port, &acct.name, &fx.stranger_key, &["true"]);
    out.expect_code(255, &c);
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");

    // Signal death: OpenSSH's ssh reports 255.
    ssh_cmd(port, &acct.name, &fx.client_key, &["kill -9 $$"]).expect_code(255, &c);
}

/// Nothing listens on the port: exit 255 with one line about connecting.
#[test]
fn connection_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let home = ClientHome::new();
    let port = free_port();
    let out = skiff_exec(&home, port, &account().name, Some(&fx.client_key))
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["connect"], "connection refused");
}

/// A malformed line in the `-F` file: exit 255 and one `skiff: ` line
/// naming FILE:LINE, before any connection is tried.
#[test]
fn bad_config_names_file_and_line() {
    let home = ClientHome::new();
    let cfg = home.path().join("bad.conf");
    write_file(&cfg, "Host *\n    Port notanumber\n", 0o600);
    let out = SkiffExec::new(&home, "skiff-nowhere.invalid")
        .config(&cfg)
        .cmd("true")
        .timeout(Duration::from_secs(20))
        .run();
    out.expect_skiff_failure(
        &[&format!("{}:2", cfg.display()), "port"],
        "malformed -F file",
    );
}

/// Accepts TCP connections on 127.0.0.1 and never sends a byte; the
/// connections are held until it is dropped.
struct SilentServer {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SilentServer {
    fn start() -> SilentServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().expect("local addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = mpsc::channel::<()>();
        let count = accepted.clone();
        let thread = thread::spawn(move || {
            let mut held = Vec::new();
            // Bounded even if the test forgets to drop it.
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                match stopped.recv_timeout(Duration::from_millis(20)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
                while let Ok((conn, _)) = listener.accept() {
                    count.fetch_add(1, Ordering::SeqCst);
                    held.push(conn);
                }
            }
        });
        SilentServer {
            port,
            accepted,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A server that accepts TCP and then says nothing: skiff gives up in
/// bounded time (the handshake has its own deadline), exit 255 with one
/// line about the handshake.
#[test]
fn silent_server_times_out() {
    let server = SilentServer::start();
    let home = ClientHome::new();
    let start = Instant::now();
    let out = SkiffExec::new(&home, &format!("{}@127.0.0.1", user()))
        .port(server.port)
        .opt("ConnectTimeout=2")
        .cmd("true")
        .timeout(Duration::from_secs(60))
        .run();
    let took = start.elapsed();
    let c = format!("silent server, ConnectTimeout=2, gave up after {took:?}");
    out.expect_skiff_failure(&[], &c);
    let line = out.stderr_lines()[0].to_lowercase();
    assert!(
        line.contains("handshake") || line.contains("timed out") || line.contains("timeout"),
        "{c}: the error should say what timed out\n{out}"
    );
    assert!(took < Duration::from_secs(15), "{c}\n{out}");
    assert_eq!(
        server.accepted.load(Ordering::SeqCst),
        1,
        "{c}: skiff must have reached the server"
    );
}
