//! Messages with descriptors beside them (`SCM_RIGHTS`) over a
//! non-blocking `SOCK_SEQPACKET` socket, one message per datagram: what
//! skiffd and its helper processes (the PAM session process, the data
//! plane's transfer process) say to each other.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use tokio::io::unix::AsyncFd;

use skiff_proto::pam_session_wire::MAX_MESSAGE;

/// The descriptors a message may carry (stdin, stdout, stderr, fd 3).
const MAX_FDS: usize = 4;

/// Sends `bytes` with `fds` beside them.
pub async fn send(sock: &AsyncFd<OwnedFd>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    loop {
        let mut guard = sock.writable().await?;
        let result = guard.try_io(|inner| {
            let iov = [io::IoSlice::new(bytes)];
            let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
                Vec::new()
            } else {
                vec![ControlMessage::ScmRights(fds)]
            };
            socket::sendmsg::<()>(
                inner.as_raw_fd(),
                &iov,
                &cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        });
        match result {
            Ok(r) => return r.map(|_| ()),
            Err(_would_block) => continue,
        }
    }
}

/// The next message and the descriptors beside it; `None` at the end.
pub async fn recv(sock: &AsyncFd<OwnedFd>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let mut guard = sock.readable().await?;
        let result = guard.try_io(|inner| {
            let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
            let mut iov = [io::IoSliceMut::new(&mut buf)];
            let msg = socket::recvmsg::<()>(
                inner.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
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
        });
        match result {
            Ok(Ok((0, _))) => return Ok(None),
            Ok(Ok((n, fds))) => return Ok(Some((buf[..n].to_vec(), fds))),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
