//! Noticing that a client went away while skiffd is not reading its
//! connection (its queue is full, see [`crate::queue_budget`]): russh only
//! learns of a closed socket by reading it, so a connection that waits for
//! its commands to read their input would otherwise outlive its client, and
//! its commands would never be hung up. This watches a second descriptor
//! of the socket for the peer's close or reset without reading anything.

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Resolves once the socket `socket` (a duplicate of the connection's)
/// reports that the peer closed or reset it; never, when it cannot be
/// watched.
pub async fn hung_up(socket: Option<OwnedFd>) {
    let watched = socket.and_then(|fd| {
        // SAFETY: the AsyncFd owns the descriptor, so it stays open for as
        // long as it is registered.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::ERROR) }.ok()
    });
    let Some(fd) = watched else {
        return std::future::pending().await;
    };
    loop {
        let Ok(mut guard) = fd.ready(Interest::READABLE | Interest::ERROR).await else {
            return std::future::pending().await;
        };
        let ready = guard.ready();
        if ready.is_read_closed() || ready.is_error() {
            return;
        }
        // Only data waiting: nothing to say until the next event.
        guard.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reset_or_a_close_is_noticed_and_waiting_data_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        for reset in [false, true] {
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            std::io::Write::write_all(&mut &client, b"unread").unwrap();
            let watch = tokio::spawn(hung_up(Some(OwnedFd::from(server.try_clone().unwrap()))));
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert!(!watch.is_finished(), "data alone is no hang-up");
            if reset {
                reset_on_close(&client);
            }
            drop(client);
            tokio::time::timeout(std::time::Duration::from_secs(10), watch)
                .await
                .expect("the hang-up is noticed")
                .unwrap();
        }
    }

    /// Makes closing `stream` reset the connection.
    fn reset_on_close(stream: &std::net::TcpStream) {
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &reset).unwrap();
    }
}
