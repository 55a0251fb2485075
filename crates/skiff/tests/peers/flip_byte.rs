//! A test peer used as a `ProxyCommand`: `flip_byte HOST:PORT OFFSET`
//! connects to HOST:PORT and relays stdin to it and its replies to stdout,
//! flipping one bit of the reply byte at OFFSET (counted from the first
//! byte the server sent), as a faulty path would. Loopback only; it ends
//! when either side does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(target), Some(Ok(offset))) = (args.get(1), args.get(2).map(|o| o.parse::<u64>()))
    else {
        eprintln!("usage: flip_byte HOST:PORT OFFSET");
        std::process::exit(2);
    };
    let server = TcpStream::connect(target).expect("connect to the server");
    let mut upstream = server.try_clone().expect("clone the socket");
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || upstream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = upstream.shutdown(Shutdown::Write);
    });
    let mut downstream = server;
    let mut stdout = std::io::stdout();
    let mut seen = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = downstream.read(&mut buf) {
        if n == 0 {
            break;
        }
        if (seen..seen + n as u64).contains(&offset) {
            buf[(offset - seen) as usize] ^= 0x40;
        }
        seen += n as u64;
        if stdout
            .write_all(&buf[..n])
            .and_then(|_| stdout.flush())
            .is_err()
        {
            break;
        }
    }
}
