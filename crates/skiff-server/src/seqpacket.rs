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

use skiff_proto::pam_session_wire::MAX_MESSAGE;

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
/// descriptors beside it.
fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
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

/// The next message on a blocking socket and the descriptors beside it;
/// `None` at the end.
pub fn recv_blocking(sock: &impl AsRawFd) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
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
pub async fn recv(sock: &AsyncFd<OwnedFd>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
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
