//! A test peer: a TCP relay in one process, so that a test can freeze a
//! whole network path at once with SIGSTOP (and let it go with SIGCONT).
//!
//! `tcp_relay TARGET [BYTES_PER_SECOND]` listens on 127.0.0.1 (a port the
//! kernel picks), prints that port on stdout as one line, and forwards every
//! connection it accepts to TARGET (`host:port`), both ways, until either side
//! closes. With BYTES_PER_SECOND, every byte it forwards, in either
//! direction and on any connection, draws from one shared budget refilled at
//! that rate, so a large copy through it takes a predictable while.
//!
//! skiff dials its data-plane streams to the address its SSH connection
//! reached, so pointing `skiff cp` at the relay sends the SSH connection and
//! every data stream through this one process: stopping it freezes them all
//! with their sockets open, as a dead router or a suspended laptop would.
//! Plain threads, blocking I/O; loopback only; no state beyond the budget.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes forwarded per read.
const PIECE: usize = 64 * 1024;

/// The shared allowance of bytes per second.
struct Budget {
    rate: u64,
    state: Mutex<(f64, Instant)>,
}

impl Budget {
    fn new(rate: u64) -> Budget {
        Budget {
            rate,
            state: Mutex::new((0.0, Instant::now())),
        }
    }

    /// Waits until `n` bytes may go (`n` at most one piece).
    fn take(&self, n: usize) {
        loop {
            let wait = {
                let mut st = self.state.lock().expect("budget lock");
                let now = Instant::now();
                // At most a tenth of a second's worth may gather while idle.
                let cap = (self.rate as f64 / 10.0).max(PIECE as f64);
                st.0 = (st.0 + now.duration_since(st.1).as_secs_f64() * self.rate as f64).min(cap);
                st.1 = now;
                if st.0 >= n as f64 {
                    st.0 -= n as f64;
                    return;
                }
                Duration::from_secs_f64((n as f64 - st.0) / self.rate as f64)
            };
            // Pacing the bytes, not synchronising with anything.
            std::thread::sleep(wait.min(Duration::from_millis(50)));
        }
    }
}

/// Copies `from` to `to` until `from` ends, then passes the end on.
fn pump(mut from: TcpStream, mut to: TcpStream, budget: Option<Arc<Budget>>) {
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(b) = &budget {
            b.take(n);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

fn serve(client: TcpStream, target: &str, budget: Option<Arc<Budget>>) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let b2 = budget.clone();
    std::thread::spawn(move || pump(client, server, budget));
    std::thread::spawn(move || pump(s2, c2, b2));
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(target) = args.get(1).cloned() else {
        eprintln!("usage: tcp_relay HOST:PORT [BYTES_PER_SECOND]");
        std::process::exit(2);
    };
    let budget = match args.get(2).map(|r| r.parse::<u64>()) {
        None => None,
        Some(Ok(r)) if r > 0 => Some(Arc::new(Budget::new(r))),
        Some(_) => {
            eprintln!("tcp_relay: BYTES_PER_SECOND must be a positive number");
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("local address").port();
    println!("{port}");
    let _ = io::stdout().flush();
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        if let Err(e) = serve(client, &target, budget.clone()) {
            eprintln!("tcp_relay: cannot reach {target}: {e}");
        }
    }
}
