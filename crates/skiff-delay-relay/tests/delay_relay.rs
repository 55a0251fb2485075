//! The relay binary on loopback, in front of a small echo server that
//! speaks first (as an SSH server does), at 50 ms RTT: the handshake model,
//! one round trip per request/response, bytes intact and in order through a
//! small in-flight budget, the event log, and the exit when idle.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const ONE_WAY_MS: u64 = 25;
const RTT: Duration = Duration::from_millis(2 * ONE_WAY_MS);
/// The longest any single wait may take (a loaded machine is slow, a broken
/// relay hangs).
const WAIT: Duration = Duration::from_secs(30);

/// Kills the relay if the test ends before it exits.
struct Relay(Option<Child>);

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// An echo server on a free loopback port: sends `S` as soon as it accepts,
/// then echoes; reports when it accepted.
fn echo_server() -> (u16, mpsc::Receiver<Instant>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = tx.send(Instant::now());
        s.set_nodelay(true).unwrap();
        s.write_all(b"S").unwrap();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match s.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    });
    (port, rx)
}

/// Starts the relay in front of `target_port`; returns it and its port.
fn start_relay(target_port: u16, log: &std::path::Path) -> (Relay, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skiff-delay-relay"))
        .args(["--listen", "127.0.0.1:0", "--target"])
        .arg(format!("127.0.0.1:{target_port}"))
        .args(["--delay-ms", &ONE_WAY_MS.to_string()])
        // Small, so the bulk exchange below runs into the budget.
        .args([
            "--max-in-flight",
            "65536",
            "--exit-after-idle",
            "0.5",
            "--log",
        ])
        .arg(log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run skiff-delay-relay");
    let stdout = child.stdout.take().unwrap();
    let relay = Relay(Some(child));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(WAIT)
        .expect("the relay says where it listens");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let port = addr.rsplit(':').next().unwrap().parse().unwrap();
    (relay, port)
}

/// Deterministic, non-repeating-looking bytes (xorshift), so a reordering or
/// a lost chunk cannot go unnoticed.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn relay_delays_each_way_models_the_handshake_and_keeps_the_bytes() {
    let dir = std::env::temp_dir().join(format!("skiff-delay-relay-test.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("events.jsonl");
    let _ = std::fs::remove_file(&log);
    let (echo_port, accepted_rx) = echo_server();
    let (mut relay, port) = start_relay(echo_port, &log);

    // The handshake: the client sends at once; the server accepts at 1.5 RTT
    // and its first byte reaches the client at 2 RTT.
    let t0 = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"hello").unwrap();
    let mut greeting = [0u8; 1];
    s.read_exact(&mut greeting).unwrap();
    let first_byte = t0.elapsed();
    assert_eq!(&greeting, b"S");
    let accepted = accepted_rx.recv_timeout(WAIT).unwrap() - t0;
    assert!(
        accepted >= RTT * 3 / 2,
        "the server accepted {accepted:?} after connect, before 1.5 RTT"
    );
    assert!(
        first_byte >= RTT * 2,
        "the server's first byte arrived {first_byte:?} after connect, before 2 RTT"
    );
    let mut echoed = [0u8; 5];
    s.read_exact(&mut echoed).unwrap();
    assert_eq!(
        &echoed, b"hello",
        "what the client sent before the handshake ended"
    );

    // A request answered at once costs at least one round trip.
    let t = Instant::now();
    s.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).unwrap();
    let rt = t.elapsed();
    assert_eq!(&one, b"x");
    assert!(
        rt >= RTT,
        "a request/response took {rt:?}, less than one RTT"
    );

    // 2 MiB each way through a 64 KiB budget: intact and in order, and no
    // faster than the budget allows (64 KiB per one-way delay), so the relay
    // applies back-pressure instead of buffering without bound.
    let data = pattern(2 << 20);
    let t = Instant::now();
    let mut writer = s.try_clone().unwrap();
    let sent = data.clone();
    let w = thread::spawn(move || {
        writer.write_all(&sent).unwrap();
        writer.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut back = Vec::with_capacity(data.len());
    s.read_to_end(&mut back).unwrap();
    w.join().unwrap();
    assert_eq!(back.len(), data.len(), "bytes lost or added");
    assert!(back == data, "bytes changed or reordered");
    let took = t.elapsed().as_secs_f64();
    let floor = data.len() as f64 / (65536.0 / (ONE_WAY_MS as f64 / 1e3));
    assert!(
        took >= floor * 0.9,
        "2 MiB took {took:.2} s through a 64 KiB budget, the budget allows no less than {floor:.2} s"
    );
    drop(s);

    // With no connection left the relay exits on its own.
    let (tx, rx) = mpsc::channel();
    let mut child = relay.0.take().unwrap();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx
        .recv_timeout(WAIT)
        .expect("the relay did not exit after being idle")
        .unwrap();
    assert!(status.success(), "relay exit status {status}");

    // The event log: accepted, connected upstream at 1.5 RTT or later, the
    // first delivery to the client at 2 RTT or later, and the totals.
    let events = std::fs::read_to_string(&log).unwrap();
    let field = |line: &str, key: &str| -> f64 {
        let start = line.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
        let rest = &line[start..];
        let end = rest.find([',', '}']).unwrap();
        rest[..end].parse().unwrap()
    };
    let find = |pat: &str| -> &str {
        events
            .lines()
            .find(|l| l.contains(pat))
            .unwrap_or_else(|| panic!("no {pat} event in {events}"))
    };
    assert!(find("\"ev\":\"accept\"").contains("\"conn\":1"));
    let connect_ms = field(find("\"ev\":\"connect\""), "ms");
    assert!(connect_ms >= 75.0, "upstream connect at {connect_ms} ms");
    let first_s2c = find("\"dir\":\"s2c\"");
    assert!(field(first_s2c, "ms") >= 100.0, "{first_s2c}");
    let total = (5 + 1 + data.len()) as f64;
    for dir in ["c2s", "s2c"] {
        let line = events
            .lines()
            .find(|l| l.contains("\"ev\":\"eof\"") && l.contains(&format!("\"dir\":\"{dir}\"")))
            .unwrap_or_else(|| panic!("no eof for {dir} in {events}"));
        let want = if dir == "s2c" { total + 1.0 } else { total };
        assert_eq!(field(line, "total"), want, "{line}");
    }
    assert!(find("\"ev\":\"close\"").contains("\"conn\":1"));
    let _ = std::fs::remove_dir_all(&dir);
}
