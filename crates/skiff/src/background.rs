//! `ssh -f`: go to the background once connected. The first process
//! starts the same command line again, detached (its own session, input
//! from /dev/null), with a pipe whose write end the second one names in
//! `SKIFF_SSH_READY_FD`. The second connects, authenticates and sets up its
//! forwardings, then writes `ok` and closes the pipe; the first then exits
//! 0. If the second fails first, the first exits with its status, so a
//! script sees a failed connection as ssh -f shows it.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

const READY_FD_VAR: &str = "SKIFF_SSH_READY_FD";

/// The second process's promise to say when it is ready.
pub struct ReadySignal(OwnedFd);

impl ReadySignal {
    /// Tells the first process that the connection is up; it then exits.
    pub fn ready(self) {
        let mut pipe = std::fs::File::from(self.0);
        let _ = std::io::Write::write_all(&mut pipe, b"ok\n");
    }
}

/// In the second process: the readiness pipe named in the environment
/// (taken once; the variable is removed so nothing started later sees it).
pub fn take_ready_signal() -> Option<ReadySignal> {
    let value = std::env::var(READY_FD_VAR).ok()?;
    std::env::remove_var(READY_FD_VAR);
    let fd: i32 = value.parse().ok().filter(|fd| *fd > 2)?;
    // The descriptor must be open, and a pipe (not something reused).
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    // Not to be inherited by anything this process starts.
    // SAFETY: fcntl on a descriptor just checked to be open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the first process passed this descriptor for us alone, and it
    // was just checked to be an open pipe.
    Some(ReadySignal(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// In the first process: starts `skiff ssh ARGS` again in the background
/// and returns the exit status to leave with.
pub fn go(args: &[String]) -> i32 {
    match start(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("skiff: cannot go to the background: {e}");
            255
        }
    }
}

fn start(args: &[String]) -> std::io::Result<i32> {
    let (mut reader, writer) = std::io::pipe()?;
    let write_fd = writer.as_raw_fd();
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .arg("ssh")
        .args(args)
        .env(READY_FD_VAR, write_fd.to_string())
        .stdin(std::process::Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let flags = libc::fcntl(write_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(write_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    drop(writer);
    let mut said = String::new();
    let _ = reader.read_to_string(&mut said);
    if said.starts_with("ok") {
        return Ok(0);
    }
    let status = child.wait()?;
    Ok(status.code().unwrap_or(255))
}
