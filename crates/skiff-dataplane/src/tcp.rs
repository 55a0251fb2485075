//! Facts the kernel knows about a TCP connection: its smoothed round-trip
//! time, which sizes SSH channel windows and picks data-plane stream counts.

use std::os::fd::RawFd;
use std::time::Duration;

/// The kernel's TCP_INFO for the connection on `fd`, and how many bytes of
/// it the kernel filled in (older kernels fill in fewer fields).
fn tcp_info(fd: RawFd) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: an all-zero tcp_info is valid; getsockopt writes at most `len` bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live and sized as declared.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((info, len as usize))
}

/// The kernel's smoothed round-trip time of the TCP connection on `fd`.
pub fn rtt(fd: RawFd) -> Option<Duration> {
    let (info, _) = tcp_info(fd)?;
    (info.tcpi_rtt > 0).then(|| Duration::from_micros(u64::from(info.tcpi_rtt)))
}

/// Bytes of the connection on `fd` that the peer acknowledged, plus bytes
/// received from it (Linux 4.1 and later; `None` before).
pub fn bytes_moved(fd: RawFd) -> Option<u64> {
    let (info, len) = tcp_info(fd)?;
    let needed =
        std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    (len >= needed).then(|| info.tcpi_bytes_acked + info.tcpi_bytes_received)
}

/// The next receive-window target of a connection whose channel `channel`
/// is being topped up now (an SSH handler's `adjust_window`), from the
/// larger of the kernel's RTT of the connection's `socket` and a round trip
/// measured at the SSH level (`session_rtt`), which also covers the hops
/// behind a proxy that terminates TCP.
pub fn next_window(
    windows: &mut skiff_proto::window::WindowGrowth,
    socket: Option<&std::os::fd::OwnedFd>,
    session_rtt: Option<std::time::Duration>,
    channel: u32,
    current: u32,
) -> u32 {
    let kernel_rtt = socket.and_then(|s| rtt(std::os::fd::AsRawFd::as_raw_fd(s)));
    let rtt = kernel_rtt.max(session_rtt);
    let next = windows.top_up(channel, current, std::time::Instant::now(), rtt);
    if next != current {
        tracing::debug!("receive window {current} -> {next} bytes (rtt {rtt:?})");
    }
    next
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_connected_socket_has_an_rtt_and_a_file_does_not() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let rtt = super::rtt(c.as_raw_fd()).expect("loopback RTT");
        assert!(rtt < std::time::Duration::from_secs(1), "{rtt:?}");
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(super::rtt(f.as_raw_fd()), None);
    }
}
