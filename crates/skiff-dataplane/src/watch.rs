//! Watching a transfer for progress, and stopping it. The stream threads
//! block in `read` and `write`; a path that freezes (a dead link, a stopped
//! proxy, a server that goes quiet) would hold them there until the kernel
//! gives up, many minutes later. The async side of a transfer therefore
//! keeps a [`StreamWatch`] on its streams: the kernel's count of bytes
//! acknowledged and received on each socket shows whether anything moved
//! (without a cost per record), and [`StreamWatch::cut`] shuts every socket
//! down, which makes the blocked threads return at once. [`Stall`] decides,
//! from those counts and the control channel's messages, when a transfer
//! has gone without progress for longer than its budget.

use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The streams of one transfer, watched from outside their threads.
#[derive(Debug, Default)]
pub struct StreamWatch {
    socks: Vec<TcpStream>,
}

impl StreamWatch {
    pub fn new() -> StreamWatch {
        StreamWatch::default()
    }

    /// Watches `sock` too (through a duplicate of its descriptor).
    pub fn add(&mut self, sock: &TcpStream) -> std::io::Result<()> {
        self.socks.push(sock.try_clone()?);
        Ok(())
    }

    /// Bytes the peer acknowledged plus bytes received, over every stream:
    /// a number that grows while anything moves.
    pub fn bytes_moved(&self) -> u64 {
        self.socks
            .iter()
            .filter_map(|s| crate::tcp::bytes_moved(s.as_raw_fd()))
            .sum()
    }

    /// Shuts every stream down: threads blocked on them return (reads see
    /// the end, writes fail), and the peer sees the connections end.
    pub fn cut(&self) {
        for s in &self.socks {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// How long a transfer may go without progress: the connection's keepalive
/// budget (`ServerAliveInterval` × `ServerAliveCountMax`). `None` waits for
/// ever, as ssh does with keepalives off.
#[derive(Debug, Clone)]
pub struct Stall {
    budget: Option<Duration>,
    moved: u64,
    since: Instant,
}

impl Stall {
    pub fn new(budget: Option<Duration>, now: Instant) -> Stall {
        Stall {
            budget,
            moved: 0,
            since: now,
        }
    }

    /// Something happened (a control message): the clock starts again.
    pub fn progress(&mut self, now: Instant) {
        self.since = now;
    }

    /// Takes the latest [`StreamWatch::bytes_moved`]; returns how long the
    /// transfer has gone without progress when that is past the budget.
    pub fn check(&mut self, moved: u64, now: Instant) -> Option<Duration> {
        if moved != self.moved {
            self.moved = moved;
            self.since = now;
        }
        let idle = now.saturating_duration_since(self.since);
        self.budget.filter(|b| idle > *b).map(|_| idle)
    }

    pub fn budget(&self) -> Option<Duration> {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_stall_is_time_without_bytes_or_messages() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut stall = Stall::new(Some(Duration::from_secs(45)), t0);
        assert_eq!(stall.check(0, s(30)), None);
        assert_eq!(stall.check(10, s(40)), None); // bytes moved: clock restarts at 40
        assert_eq!(stall.check(10, s(80)), None);
        stall.progress(s(84)); // a control message
        assert_eq!(stall.check(10, s(120)), None);
        assert_eq!(stall.check(10, s(130)), Some(Duration::from_secs(46)));
        // No budget: never.
        let mut never = Stall::new(None, t0);
        assert_eq!(never.check(0, s(100_000)), None);
    }

    #[test]
    fn bytes_are_counted_and_a_cut_unblocks_a_reader() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let mut watch = StreamWatch::new();
        watch.add(&c).unwrap();
        let before = watch.bytes_moved();
        server.write_all(&[7u8; 1000]).unwrap();
        let mut buf = [0u8; 1000];
        c.read_exact(&mut buf).unwrap();
        c.write_all(b"x").unwrap();
        // The peer's acknowledgement of our byte may take a moment; what
        // we received counts at once.
        assert!(watch.bytes_moved() >= before + 1000);
        let reader = std::thread::spawn(move || c.read(&mut [0u8; 16]));
        watch.cut();
        // Returns (end of stream) instead of blocking for ever.
        assert_eq!(reader.join().unwrap().unwrap(), 0);
        drop(server);
    }
}
