//! The zygote: a process that has read the configuration and the host keys
//! (the listener started it as `skiffd ... --zygote`, with the socket to
//! the listener as fd 3) and forks one connection process
//! (`crate::worker`) each time the listener asks. Forking a process that
//! is ready costs a fraction of a millisecond, where starting skiffd anew
//! would read, parse and check everything again; and the listener keeps a
//! few such processes waiting, so a connection never waits for one.
//!
//! The zygote stays single-threaded (no async runtime, no writer threads),
//! which is what makes `fork` safe here: each child builds its own runtime.
//! It reaps its children between requests and at least once a second, so
//! that their CPU time is counted in its own (`cutime`, as a listener's
//! children's is in the listener's). On a `SIGHUP` the listener starts a new zygote with the
//! new configuration and ends this one by closing its socket: the processes
//! it forked go on serving their connections.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult};
use skiff_proto::worker_wire::{FromZygote, ToZygote, MAX_MESSAGE};

use crate::config::Settings;
use crate::hostkey::HostIdentity;
use crate::seqpacket::{recv_blocking, send_blocking};

/// The descriptor the listener passes the zygote's socket as.
pub const CONTROL_FD: i32 = 3;

/// The socket to the listener (fd 3), taken once.
pub fn control_socket() -> OwnedFd {
    // SAFETY: the listener passes its socket as fd 3, and nothing else in
    // this process opened or owns that descriptor.
    unsafe { OwnedFd::from_raw_fd(CONTROL_FD) }
}

/// Tells the listener the configuration could not be loaded (it keeps the
/// one it has), and returns the exit code.
pub fn refuse(control: OwnedFd, why: &str) -> i32 {
    let _ = send_blocking(&control, &FromZygote::Failed(why.to_string()).encode(), &[]);
    1
}

/// Serves the listener until it closes the socket: a forked connection
/// process for every request. Returns in the parent with its exit code,
/// and in each child with the child's (after it served its connection).
pub fn serve(control: OwnedFd, settings: Settings, host: HostIdentity) -> i32 {
    // Woken at least once a second to reap children.
    let tick = nix::sys::time::TimeVal::new(1, 0);
    if let Err(e) =
        nix::sys::socket::setsockopt(&control, nix::sys::socket::sockopt::ReceiveTimeout, &tick)
    {
        return refuse(control, &format!("cannot set a receive timeout: {e}"));
    }
    // MaxServerQueue counts every connection process's queues together.
    if let Err(e) = crate::queue_budget::share_across_processes() {
        return refuse(control, &format!("cannot share the queue budget: {e}"));
    }
    // Each connection process may open as many descriptors as allowed.
    if let Err(e) = crate::descriptors::raise_open_file_limit() {
        tracing::warn!("cannot raise the open-file limit: {e}");
    }
    warm_up(&settings, &host);
    // The code the rehearsal ran: what each connection process maps in.
    let hot = crate::hot_code::HotCode::of_this_process();
    tracing::debug!(
        "zygote: {} KiB of code for each connection process to map in",
        hot.bytes() / 1024
    );
    if send_blocking(&control, &FromZygote::Ready.encode(), &[]).is_err() {
        return 1;
    }
    loop {
        reap();
        let (bytes, mut fds) = match recv_blocking(&control, MAX_MESSAGE) {
            Ok(Some(m)) => m,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            // The listener closed the socket (a new configuration, or it
            // ended): forked processes carry on without this one.
            Ok(None) => return 0,
            Err(e) => {
                tracing::error!("zygote: {e}");
                return 1;
            }
        };
        let reply = match (ToZygote::decode(&bytes), fds.len()) {
            (Ok(ToZygote::Spawn), 1) => {
                let socket = fds.pop().expect("one descriptor");
                // SAFETY: this process is single-threaded (no runtime, no
                // threads were started), so the child may go on running
                // ordinary code after the fork.
                match unsafe { fork() } {
                    Ok(ForkResult::Child) => {
                        drop(control);
                        return crate::worker::serve(socket, settings, host, &hot);
                    }
                    Ok(ForkResult::Parent { child }) => FromZygote::Spawned {
                        pid: child.as_raw(),
                    },
                    Err(e) => FromZygote::NotSpawned(format!("fork: {e}")),
                }
            }
            (Ok(ToZygote::Spawn), n) => FromZygote::NotSpawned(format!(
                "a spawn request with {n} descriptors (one expected)"
            )),
            (Err(e), _) => FromZygote::NotSpawned(format!("a malformed request: {e}")),
        };
        drop(fds);
        if let Err(e) = send_blocking(&control, &reply.encode(), &[]) {
            tracing::error!("zygote: cannot answer the listener: {e}");
            return 1;
        }
    }
}

/// Reaps every child that has exited, without waiting.
fn reap() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// What every connection process would otherwise do first on its own,
/// done once here so that every process forked after inherits it: the C
/// library loads its name-service modules (`/etc/nsswitch.conf`: files,
/// systemd, ...) at the first account lookup, and a first key exchange
/// probes the CPU and builds what it needs (`crate::rehearsal`).
fn warm_up(settings: &Settings, host: &HostIdentity) {
    let _ = crate::account::lookup("root");
    if let Err(e) = crate::rehearsal::rehearse(settings, host) {
        tracing::debug!(
            "zygote: no key-exchange rehearsal ({e}); connection processes do it first"
        );
    }
    // fork() is only safe while this process has one thread.
    if let Some(n) = crate::rehearsal::threads().filter(|&n| n != 1) {
        tracing::warn!("zygote: {n} threads after warming up (one expected)");
    }
}
