//! What skiffd says to, and takes from, a service manager (systemd):
//! readiness and reloads (`sd_notify`'s datagrams to `NOTIFY_SOCKET`, for
//! `Type=notify`), and the listening sockets of socket activation
//! (`LISTEN_PID`, `LISTEN_FDS`: descriptors 3 onwards, for a
//! `skiffd.socket` with `Accept=no`). Without those variables it does
//! nothing. The variables are meant for the listener alone and are not
//! passed on to the processes it starts.

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};
use tokio::net::TcpListener;

/// The first descriptor socket activation passes.
const LISTEN_FDS_START: i32 = 3;

/// Tells the service manager `state` (`READY=1`, `RELOADING=1`, ...), when
/// one listens. Failures are logged, never fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        use std::os::linux::net::SocketAddrExt;
        let sock = std::os::unix::net::UnixDatagram::unbound()?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name)?,
            None => std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(&path))?,
        };
        sock.send_to_addr(state.as_bytes(), &addr)?;
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::warn!("cannot notify the service manager ({state:?}): {e}");
    }
}

/// The listening sockets the service manager passed, if it passed any to
/// this process.
pub fn passed_listeners() -> Result<Option<Vec<TcpListener>>> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = match (for_us, std::env::var("LISTEN_FDS")) {
        (true, Ok(n)) => n
            .parse::<i32>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .with_context(|| format!("LISTEN_FDS={n}: not a number of sockets"))?,
        _ => return Ok(None),
    };
    let mut listeners = Vec::new();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + count {
        // SAFETY: socket activation hands this process descriptors 3 to
        // 3 + LISTEN_FDS - 1, which nothing else in it owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let sock = socket2::Socket::from(owned);
        let listening = sock.r#type().ok() == Some(socket2::Type::STREAM)
            && sock.local_addr().ok().and_then(|a| a.as_socket()).is_some();
        if !listening {
            bail!("descriptor {fd} passed by the service manager is not a listening TCP socket (skiffd.socket needs ListenStream= with an address and Accept=no)");
        }
        sock.set_cloexec(true)?;
        sock.set_nonblocking(true)?;
        listeners.push(TcpListener::from_std(std::net::TcpListener::from(sock))?);
    }
    Ok(Some(listeners))
}
