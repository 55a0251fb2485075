//! Data-plane streams between skiffd's processes. Each connection is
//! served in a process of its own (`crate::worker`), but a transfer's
//! streams are new TCP connections that may reach any of them (or the
//! listener). The stream's token names the process whose transfer issued it
//! (`skiff_proto::worker_wire::token_owner`), and every connection process
//! listens on an abstract Unix socket named after its pid
//! ([`StreamInbox`]), where another skiffd process hands it the stream
//! ([`hand_over`]); the owner checks the token as for a stream that
//! reached it directly (`crate::stream_relay::deliver`).
//!
//! Abstract sockets have no file permissions, so both ends check who is on
//! the other: the inbox takes streams only from processes of its own user
//! id (root, for a root skiffd), and [`hand_over`] gives a stream only to
//! the process the token names, of that same user id, so a local user who
//! took the name first is neither handed streams nor believed.
//! The names survive a restart of the listener: an established
//! connection's transfers keep working under a new listener.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
use skiff_proto::dataplane::TOKEN_LEN;
use skiff_proto::worker_wire::StreamHandoff;
use tokio::io::unix::AsyncFd;

use crate::stream_relay::Registry;

/// The abstract socket name of the process `pid`'s inbox.
fn inbox_name(pid: u32) -> Vec<u8> {
    format!("skiffd-stream-{pid}").into_bytes()
}

/// Why a stream could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// No skiffd process by that pid takes streams: the token is not one
    /// skiffd issued, or its connection is over.
    #[error("unknown or already used token (it names process {0}, which takes no streams: {1})")]
    NoInbox(u32, nix::Error),
    #[error("the inbox of process {owner} is held by process {holder} (uid {uid}), not skiffd's")]
    Impostor { owner: u32, holder: i32, uid: u32 },
    #[error("cannot hand it to process {0}: {1}")]
    Io(u32, io::Error),
}

/// Hands `stream` (whose token was read off it) to the skiffd process
/// `owner`, after checking that process holds the inbox.
pub async fn hand_over(
    owner: u32,
    token: [u8; TOKEN_LEN],
    peer: SocketAddr,
    stream: OwnedFd,
) -> Result<(), HandOverError> {
    tokio::task::spawn_blocking(move || hand_over_blocking(owner, token, peer, stream))
        .await
        .map_err(|e| HandOverError::Io(owner, io::Error::other(e)))?
}

fn hand_over_blocking(
    owner: u32,
    token: [u8; TOKEN_LEN],
    peer: SocketAddr,
    stream: OwnedFd,
) -> Result<(), HandOverError> {
    let sock = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| HandOverError::Io(owner, e.into()))?;
    let addr = UnixAddr::new_abstract(&inbox_name(owner))
        .map_err(|e| HandOverError::Io(owner, e.into()))?;
    socket::connect(sock.as_raw_fd(), &addr).map_err(|e| HandOverError::NoInbox(owner, e))?;
    let cred = socket::getsockopt(&sock, sockopt::PeerCredentials)
        .map_err(|e| HandOverError::Io(owner, e.into()))?;
    if i64::from(cred.pid()) != i64::from(owner) || cred.uid() != nix::unistd::geteuid().as_raw() {
        return Err(HandOverError::Impostor {
            owner,
            holder: cred.pid(),
            uid: cred.uid(),
        });
    }
    let msg = StreamHandoff { token, peer }.encode();
    let fds = [stream.as_raw_fd()];
    socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[io::IoSlice::new(&msg)],
        &[socket::ControlMessage::ScmRights(&fds)],
        socket::MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| HandOverError::Io(owner, e.into()))?;
    Ok(())
}

/// This process's inbox: streams other skiffd processes hand it.
pub struct StreamInbox {
    listener: AsyncFd<OwnedFd>,
}

impl StreamInbox {
    /// Listens on this process's name. Fails when the name is taken (by
    /// whoever: the process then takes no handed streams, and says so).
    pub fn bind() -> io::Result<StreamInbox> {
        let sock = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        let addr = UnixAddr::new_abstract(&inbox_name(std::process::id()))?;
        socket::bind(sock.as_raw_fd(), &addr)?;
        socket::listen(&sock, socket::Backlog::new(64).map_err(io::Error::from)?)?;
        Ok(StreamInbox {
            // SAFETY: the AsyncFd owns the listening socket from here.
            listener: unsafe { AsyncFd::register(sock) }?,
        })
    }

    /// Takes streams until the process ends, delivering each to its
    /// transfer process through `registry`.
    pub async fn serve(self, registry: Arc<Registry>) {
        let own_uid = nix::unistd::geteuid().as_raw();
        loop {
            let accepted = match self.listener.readable().await {
                Ok(mut guard) => match guard.try_io(|l| {
                    socket::accept4(
                        l.as_raw_fd(),
                        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                    )
                    .map_err(io::Error::from)
                }) {
                    Ok(r) => r,
                    Err(_would_block) => continue,
                },
                Err(e) => {
                    tracing::warn!("data-plane inbox: {e}");
                    return;
                }
            };
            let conn = match accepted {
                // SAFETY: accept4 just returned this descriptor, owned by nobody else.
                Ok(fd) => unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
                Err(e) => {
                    tracing::debug!("data-plane inbox: accept: {e}");
                    continue;
                }
            };
            match socket::getsockopt(&conn.as_fd(), sockopt::PeerCredentials) {
                Ok(cred) if cred.uid() == own_uid => {}
                Ok(cred) => {
                    tracing::warn!(
                        "data-plane inbox: refused a hand-over from process {} (uid {})",
                        cred.pid(),
                        cred.uid()
                    );
                    continue;
                }
                Err(e) => {
                    tracing::debug!("data-plane inbox: {e}");
                    continue;
                }
            }
            let registry = registry.clone();
            tokio::spawn(async move {
                // SAFETY: the AsyncFd owns the accepted socket from here.
                let Ok(conn) = (unsafe { AsyncFd::register(conn) }) else {
                    return;
                };
                let (bytes, fds) = match crate::seqpacket::recv(
                    &conn,
                    skiff_proto::worker_wire::MAX_MESSAGE,
                )
                .await
                {
                    Ok(Some(m)) => m,
                    _ => return,
                };
                let (Ok(handoff), [stream]) = (StreamHandoff::decode(&bytes), fds.as_slice())
                else {
                    tracing::warn!("data-plane inbox: a malformed hand-over");
                    return;
                };
                crate::stream_relay::deliver(
                    &registry,
                    &handoff.token,
                    stream.as_raw_fd(),
                    handoff.peer,
                )
                .await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket under another process's inbox name is not handed the
    /// stream: the credentials show who holds it.
    #[tokio::test]
    async fn a_taken_inbox_name_is_not_believed() {
        // A name no skiffd process has: pids stay below 2^22.
        let owner = std::process::id() + (1 << 23);
        let squatter = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        let addr = UnixAddr::new_abstract(&inbox_name(owner)).unwrap();
        socket::bind(squatter.as_raw_fd(), &addr).unwrap();
        socket::listen(&squatter, socket::Backlog::new(4).unwrap()).unwrap();
        let (stream, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let handed = hand_over(owner, [0; TOKEN_LEN], peer, stream.into()).await;
        match handed {
            Err(HandOverError::Impostor {
                owner: o, holder, ..
            }) => {
                assert_eq!(o, owner);
                assert_eq!(holder as u32, std::process::id());
            }
            other => panic!("handed to an impostor: {other:?}"),
        }
    }

    /// No process by that name: the token is as good as unknown.
    #[tokio::test]
    async fn a_token_of_no_process_is_refused() {
        let owner = std::process::id() + (1 << 23) + 1;
        let (stream, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let handed = hand_over(owner, [0; TOKEN_LEN], peer, stream.into()).await;
        assert!(
            matches!(handed, Err(HandOverError::NoInbox(o, _)) if o == owner),
            "{handed:?}"
        );
    }
}
