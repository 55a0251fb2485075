//! skiffd's channel windows behind a proxy that terminates TCP: the kernel's
//! RTT on skiffd's socket is the loopback hop to the proxy, so only the
//! round trip measured at the SSH level shows the path's real latency. An
//! upload through a relay that delays every byte by 20 ms each way must
//! still make skiffd's receive window grow.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::*;

const MIB: usize = 1 << 20;

/// A TCP relay on loopback that holds every chunk for `delay` before passing
/// it on, in both directions (so a round trip through it takes twice
/// `delay`). Accepts connections until dropped; every thread stops once its
/// connection ends or the relay is dropped, and within two minutes anyway.
struct DelayRelay {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayRelay {
    fn start(upstream: u16, delay: Duration) -> DelayRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).expect("blocking");
                let server = TcpStream::connect(("127.0.0.1", upstream)).expect("upstream");
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    delayed_pipe(from, to, delay, flag.clone());
                }
            }
        });
        DelayRelay { port, stop }
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
fn delayed_pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration, stop: Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    from.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let reader_stop = stop.clone();
    thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut buf = vec![0u8; 256 * 1024];
        while !reader_stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut
                        || e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        // Dropping `tx` lets the writer finish what is queued, then stop.
    });
    thread::spawn(move || {
        while let Ok((due, chunk)) = rx.recv_timeout(Duration::from_secs(120)) {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Sends `size` bytes to `cat > /dev/null` through the relay and returns
/// skiffd's window lines for that connection.
fn upload_through(relay: &DelayRelay, fx: &Fixture, d: &Skiffd, size: usize) -> Vec<String> {
    let home = ClientHome::new();
    home.trust(relay.port, &fx.host_key);
    let dir = tempdir();
    let file = dir.path().join("payload");
    random_file(&file, size);
    let before = d.log().lines().count();
    let c = server_context(d, "upload through a 40 ms relay");
    skiff_exec(&home, relay.port, user(), Some(&fx.client_key))
        .cmd("cat > /dev/null")
        .input(Input::File(file))
        .timeout(Duration::from_secs(60))
        .run()
        .expect_code(0, &c);
    d.log()
        .lines()
        .skip(before)
        .filter(|l| l.contains("receive window"))
        .map(str::to_string)
        .collect()
}

#[test]
fn receive_windows_grow_behind_a_proxy_that_hides_the_latency() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let relay = DelayRelay::start(d.port(), Duration::from_millis(20));
    let lines = upload_through(&relay, &fx, &d, 48 * MIB);
    let c = server_context(&d, "window growth behind a 40 ms relay");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("receive window 2097152 -> 4194304")),
        "{c}: skiffd's window never grew past its initial 2 MiB:\n{}",
        lines.join("\n")
    );
}
