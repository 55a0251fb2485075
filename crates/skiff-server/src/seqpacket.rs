//! Messages with descriptors beside them (`SCM_RIGHTS`) over a
//! `SOCK_SEQPACKET` socket, one message per datagram: what skiffd's
//! processes (the listener, its zygote and connection processes, the PAM
//! session process, the data plane's transfer process) say to each other.
//! Async on non-blocking sockets, or blocking where no runtime runs (the
//! zygote).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use tokio::io::unix::AsyncFd;

/// The descriptors a message may carry (stdin, stdout, stderr, fd 3).
const MAX_FDS: usize = 4;

/// A connected pair of non-blocking, close-on-exec `SOCK_SEQPACKET`
/// sockets: (this process's end, the other process's end).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socket::socketpair(
        socket::AddressFamily::Unix,
        socket::SockType::SeqPacket,
        None,
        socket::SockFlag::SOCK_CLOEXEC | socket::SockFlag::SOCK_NONBLOCK,
    )?)
}

/// One `sendmsg` of `bytes` with `fds` beside them.
fn send_now(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let iov = [io::IoSlice::new(bytes)];
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(fds)]
    };
    socket::sendmsg::<()>(fd, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map(|_| ())
        .map_err(io::Error::from)
}

/// One `recvmsg` into `buf`: the length read (0 at the end) and the
/// descriptors beside it. A message longer than `buf` is an error (the
/// kernel has dropped its tail), as are descriptors that did not fit.
fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let max = buf.len();
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just gave us these descriptors.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message longer than {max} bytes"),
        ));
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message with more than {MAX_FDS} descriptors"),
        ));
    }
    Ok((msg.bytes, fds))
}

/// Sends `bytes` with `fds` beside them on a blocking socket (or one whose
/// buffer is known to have room: a message that does not fit fails with
/// `WouldBlock` rather than waiting).
pub fn send_blocking(sock: &impl AsRawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    loop {
        match send_now(sock.as_raw_fd(), bytes, fds) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// The next message on a blocking socket, of at most `max` bytes (its
/// protocol's limit: the buffer is that size, so a small one costs no
/// fresh pages), and the descriptors beside it; `None` at the end.
pub fn recv_blocking(
    sock: &impl AsRawFd,
    max: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; max];
    loop {
        match recv_now(sock.as_raw_fd(), &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok((0, _)) => return Ok(None),
            Ok((n, fds)) => return Ok(Some((buf[..n].to_vec(), fds))),
        }
    }
}

/// Sends `bytes` with `fds` beside them.
pub async fn send(sock: &AsyncFd<OwnedFd>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    loop {
        let mut guard = sock.writable().await?;
        match guard.try_io(|inner| send_now(inner.as_raw_fd(), bytes, fds)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// The next message and the descriptors beside it; `None` at the end.
pub async fn recv(
    sock: &AsyncFd<OwnedFd>,
    max: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; max];
    loop {
        let mut guard = sock.readable().await?;
        match guard.try_io(|inner| recv_now(inner.as_raw_fd(), &mut buf)) {
            Ok(Ok((0, _))) => return Ok(None),
            Ok(Ok((n, fds))) => return Ok(Some((buf[..n].to_vec(), fds))),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_up_to_the_limit_arrives_whole_with_its_descriptors() {
        let (a, b) = pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        send_blocking(&a, &[7u8; 64], &[r.as_raw_fd()]).unwrap();
        let (bytes, fds) = recv_blocking(&b, 64).unwrap().expect("a message");
        assert_eq!(bytes, vec![7u8; 64]);
        assert_eq!(fds.len(), 1);
        // The descriptor is the pipe's read end: what is written arrives.
        nix::unistd::write(&w, b"x").unwrap();
        let mut got = [0u8; 1];
        assert_eq!(nix::unistd::read(&fds[0], &mut got).unwrap(), 1);
        assert_eq!(&got, b"x");
    }

    #[test]
    fn a_message_over_the_limit_is_refused_not_cut_short() {
        let (a, b) = pair().unwrap();
        send_blocking(&a, &[1u8; 65], &[]).unwrap();
        let e = recv_blocking(&b, 64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // The next message is read as usual.
        send_blocking(&a, b"next", &[]).unwrap();
        let (bytes, _) = recv_blocking(&b, 64).unwrap().expect("a message");
        assert_eq!(bytes, b"next");
    }

    #[test]
    fn the_end_of_the_peer_is_none() {
        let (a, b) = pair().unwrap();
        drop(a);
        assert!(recv_blocking(&b, 64).unwrap().is_none());
    }
}
