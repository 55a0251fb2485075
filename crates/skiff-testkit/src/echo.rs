//! A line echo server on 127.0.0.1 that a test owns, for the far end of a
//! forwarding: every line is answered with `echo: LINE` until the client
//! ends its side, then the connection closes. It serves until the test
//! process ends, and counts the connections it took.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// What [`Echo`] answers to the lines `one` and `two`.
pub const TWO_ECHOES: &str = "echo: one\necho: two\n";

/// A running line echo server.
pub struct Echo {
    pub port: u16,
    connections: Arc<AtomicUsize>,
}

/// Starts a line echo server on a free port of 127.0.0.1.
pub fn echo_server() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
    let port = listener
        .local_addr()
        .expect("the echo server's address")
        .port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let out = stream.try_clone().expect("clone the stream");
            thread::spawn(move || echo_lines(stream, out));
        }
    });
    Echo { port, connections }
}

/// Answers every line read from `input` with `echo: LINE` on `out`.
pub fn echo_lines(input: impl std::io::Read, mut out: impl Write) {
    for line in BufReader::new(input).lines() {
        let Ok(line) = line else { break };
        if writeln!(out, "echo: {line}").is_err() {
            break;
        }
    }
}

impl Echo {
    /// Connections taken so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A remote command (bash, on this machine) that connects to
/// 127.0.0.1:`port`, sends `one` and `two` and prints the two lines that
/// come back: the application at the far end of a remote forwarding. A
/// client may ask for the forwarding and start the command in either
/// order, so the connection is tried again for up to 30 s (exit 7 then).
pub fn talk_to_command(port: u16) -> String {
    format!(
        "bash -c 'for i in $(seq 300); do exec 3<>/dev/tcp/127.0.0.1/{port} && break; sleep 0.1; done 2>/dev/null; \
         [ -e /dev/fd/3 ] || exit 7; printf \"one\\ntwo\\n\" >&3; head -n 2 <&3'"
    )
}
