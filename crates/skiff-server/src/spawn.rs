//! Starting a child process cheaply from a large, multi-threaded server.
//!
//! `fork()` copies the whole address space's page tables and then makes the
//! server pay copy-on-write faults for every page it touches afterwards; for a
//! command as short as `true` that is a large share of the cost. Like
//! `posix_spawn`, this module starts the child with `clone(CLONE_VM |
//! CLONE_VFORK)`: the child borrows the server's memory and a private stack
//! until it calls `execve`, while the calling thread waits. Unlike
//! `posix_spawn` it can also drop privileges (setgroups, setgid, setuid) and
//! take a controlling terminal, which a login session needs.
//!
//! Everything the child uses is prepared before the clone. The child makes
//! only system calls, credential changes as raw syscalls (glibc's wrappers
//! would try to synchronise every thread of the server), and reports a
//! failure through the shared plan before `_exit`.
//!
//! The child is returned as a [`ChildProcess`] built on a pidfd: waiting is
//! an async readiness wait, and the pid stays ours (never reused) until we
//! reap it.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

/// Credentials the child takes before `execve`.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

/// What to start.
pub struct Plan<'a> {
    pub program: &'a Path,
    /// `argv[0]` first.
    pub args: Vec<&'a OsStr>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(&'a str, &'a str)>,
    pub cwd: &'a Path,
    /// A directory the child makes its root (`ChrootDirectory`) before it
    /// changes to `cwd`, which is then inside it.
    pub root: Option<&'a Path>,
    /// Descriptors that become the child's 0, 1 and 2.
    pub stdio: [RawFd; 3],
    /// A descriptor that becomes the child's 3 (the transfer process's
    /// socket to skiffd); every other descriptor is closed.
    pub extra: Option<RawFd>,
    /// Start a new session (always) and make fd 0 its controlling terminal.
    pub controlling_tty: bool,
    /// `None` keeps the server's own credentials.
    pub credentials: Option<Credentials>,
}

/// Everything the child reads, laid out before the clone.
struct Prepared {
    program: CString,
    argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    root: Option<CString>,
    stdio: [RawFd; 3],
    extra: Option<RawFd>,
    controlling_tty: bool,
    credentials: Option<Credentials>,
    /// The open-file limit skiffd was started with, when it raised its own
    /// (see `crate::descriptors`).
    open_files: Option<libc::rlimit>,
    /// Set by the child before it exits on failure: (step, errno).
    failure: [libc::c_int; 2],
}

/// The step that failed in the child, for the error message.
const STEPS: [&str; 8] = [
    "",
    "set up standard streams",
    "start a session",
    "take the terminal",
    "change directory",
    "drop privileges",
    "execute",
    "change the root directory",
];

fn cstring(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

impl Prepared {
    fn new(plan: Plan<'_>) -> io::Result<Box<Prepared>> {
        let program = cstring(plan.program.as_os_str().as_bytes(), "program path")?;
        let argv = plan
            .args
            .iter()
            .map(|a| cstring(a.as_bytes(), "an argument"))
            .collect::<io::Result<Vec<_>>>()?;
        let envp = plan
            .env
            .iter()
            .map(|(k, v)| cstring(format!("{k}={v}").as_bytes(), "an environment variable"))
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = cstring(plan.cwd.as_os_str().as_bytes(), "the directory")?;
        let root = plan
            .root
            .map(|r| cstring(r.as_os_str().as_bytes(), "the root directory"))
            .transpose()?;
        let mut prepared = Box::new(Prepared {
            program,
            argv,
            argv_ptrs: Vec::new(),
            envp,
            envp_ptrs: Vec::new(),
            cwd,
            root,
            stdio: plan.stdio,
            extra: plan.extra,
            controlling_tty: plan.controlling_tty,
            credentials: plan.credentials,
            open_files: crate::descriptors::child_open_file_limit(),
            failure: [0, 0],
        });
        prepared.argv_ptrs = prepared.argv.iter().map(|c| c.as_ptr()).collect();
        prepared.argv_ptrs.push(std::ptr::null());
        prepared.envp_ptrs = prepared.envp.iter().map(|c| c.as_ptr()).collect();
        prepared.envp_ptrs.push(std::ptr::null());
        Ok(prepared)
    }
}

/// Stack for the child between clone and execve. It only runs
/// [`child_main`], a few frames deep.
const CHILD_STACK: usize = 64 * 1024;

/// One past the highest signal number on Linux.
const NSIG: libc::c_int = 65;

/// The kernel's `struct sigaction` for `rt_sigaction` (x86-64 and aarch64
/// layout: handler, flags, restorer, 64-bit mask).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Runs in the child, on its own stack, sharing the parent's memory. Only
/// system calls from here on; any failure is written to the plan.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the Prepared the parent keeps alive (and does not
    // touch) until this child has exec'd or exited.
    let p = unsafe { &mut *(arg as *mut Prepared) };
    let fail = |p: &mut Prepared, step: libc::c_int| -> libc::c_int {
        // SAFETY: reading errno of this (borrowed) thread context.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: the parent reads `failure` only after this task is gone.
        unsafe {
            std::ptr::write_volatile(&mut p.failure, [step, errno]);
            libc::syscall(libc::SYS_exit, 127);
        }
        127
    };
    // SAFETY: plain system calls on values prepared before the clone.
    unsafe {
        // Handlers installed by the server must not run here (they would run
        // on the server's memory), and the command starts with default
        // dispositions, SIGPIPE included, and an empty mask.
        // The raw system call, because glibc refuses to touch the two
        // signals it reserves, which must not stay ignored either.
        let default_action = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for sig in 1..NSIG {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &default_action as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            );
        }
        // Move the sources above 3 first, so that dup2 onto 0..3 can never
        // clobber one we still need.
        let mut high = [-1 as RawFd; 4];
        for (i, fd) in p.stdio.iter().chain(p.extra.iter()).enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 4);
            if high[i] < 0 {
                return fail(p, 1);
            }
        }
        for (i, fd) in high.iter().enumerate() {
            if *fd >= 0 && libc::dup2(*fd, i as RawFd) < 0 {
                return fail(p, 1);
            }
        }
        // Nothing else the server holds reaches the command.
        let first_closed: u32 = if p.extra.is_some() { 4 } else { 3 };
        libc::syscall(
            libc::SYS_close_range,
            first_closed,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if libc::setsid() < 0 {
            return fail(p, 2);
        }
        if p.controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return fail(p, 3);
        }
        if let Some(root) = &p.root {
            if libc::chroot(root.as_ptr()) < 0 {
                return fail(p, 7);
            }
        }
        if libc::chdir(p.cwd.as_ptr()) < 0 {
            return fail(p, 4);
        }
        // Lowering a soft limit cannot fail for want of privilege; if it
        // fails at all, the command runs with skiffd's.
        if let Some(lim) = &p.open_files {
            libc::setrlimit(libc::RLIMIT_NOFILE, lim);
        }
        if let Some(c) = &p.credentials {
            if libc::syscall(libc::SYS_setgroups, c.groups.len(), c.groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setgid, c.gid) < 0
                || libc::syscall(libc::SYS_setuid, c.uid) < 0
            {
                return fail(p, 5);
            }
            // Defence in depth: regaining root must be impossible now.
            if c.uid != 0 && libc::syscall(libc::SYS_setuid, 0) == 0 {
                *libc::__errno_location() = libc::EPERM;
                return fail(p, 5);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(
            p.program.as_ptr(),
            p.argv_ptrs.as_ptr(),
            p.envp_ptrs.as_ptr(),
        );
        fail(p, 6)
    }
}

/// Starts `plan`. Returns once the child has called `execve` (or failed
/// before it, which is returned as the error). Must be called within a
/// tokio runtime.
pub fn spawn(plan: Plan<'_>) -> io::Result<ChildProcess> {
    let mut prepared = Prepared::new(plan)?;
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down from the (16-byte aligned) top.
    let top = {
        let end = stack.as_mut_ptr() as usize + stack.len();
        (end & !0xf) as *mut libc::c_void
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: all signals are blocked across the clone so no handler runs on
    // the child's borrowed memory before it resets them; the child only runs
    // `child_main`, and CLONE_VFORK keeps this thread (and so `prepared` and
    // `stack`) waiting until the child has exec'd or exited.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (&mut *prepared as *mut Prepared).cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    // SAFETY: CLONE_PIDFD stored a new descriptor (close-on-exec) that we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // SAFETY: the child is gone or exec'd: nothing else writes `failure` now.
    let [step, errno] = unsafe { std::ptr::read_volatile(&prepared.failure) };
    if step != 0 {
        reap_blocking(pid);
        let step = STEPS.get(step as usize).copied().unwrap_or("start");
        let err = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(
            err.kind(),
            format!("cannot {step} for the command: {err}"),
        ));
    }
    // SAFETY: we own the pidfd, and it stays open as long as the AsyncFd.
    let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)? };
    Ok(ChildProcess {
        pid,
        pidfd: Some(pidfd),
        status: None,
    })
}

/// Waits for (and reaps) a child that is known to have exited or be about to.
fn reap_blocking(pid: libc::pid_t) -> Option<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Some(status);
        }
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// A started child. Its pid cannot be reused until [`ChildProcess::wait`]
/// has returned, so signalling it before then never hits a stranger.
pub struct ChildProcess {
    pid: libc::pid_t,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl ChildProcess {
    /// The pid, or `None` once the child has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Sends `sig` to the child (`group`: to its whole process group, which
    /// it leads). Does nothing once it has been reaped.
    pub fn signal(&self, sig: libc::c_int, group: bool) {
        if self.status.is_some() {
            return;
        }
        let target = if group { -self.pid } else { self.pid };
        // SAFETY: kill(2) on our own unreaped child (or the group it leads).
        unsafe { libc::kill(target, sig) };
    }

    /// Waits for the child to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        let fd = self.pidfd.as_ref().expect("unreaped child has a pidfd");
        loop {
            let mut guard = fd.readable().await?;
            let mut raw = 0;
            // SAFETY: non-blocking waitpid on our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
            if r == self.pid {
                let st = ExitStatus::from_raw(raw);
                self.status = Some(st);
                self.pidfd = None;
                return Ok(st);
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            guard.clear_ready();
        }
    }
}

impl Drop for ChildProcess {
    /// A child dropped before it was reaped is reaped in the background, so
    /// it never lingers as a zombie.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let Some(fd) = self.pidfd.take() else { return };
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let mut child = ChildProcess {
                        pid,
                        pidfd: Some(fd),
                        status: None,
                    };
                    let _ = child.wait().await;
                });
            }
            Err(_) => {
                std::thread::spawn(move || {
                    let _fd = fd;
                    reap_blocking(pid);
                });
            }
        }
    }
}

/// Makes a pipe whose ends are both close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the array with two new descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    fn plan<'a>(args: &'a [&'a str], stdio: [RawFd; 3]) -> Plan<'a> {
        Plan {
            program: Path::new("/bin/sh"),
            args: args.iter().map(OsStr::new).collect(),
            env: vec![("SKIFF_SPAWN_TEST", "value 1")],
            cwd: Path::new("/"),
            root: None,
            stdio,
            extra: None,
            controlling_tty: false,
            credentials: None,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn output_of(args: &[&str]) -> (String, ExitStatus) {
        let rt = runtime();
        rt.block_on(async {
            let (out_r, out_w) = pipe().unwrap();
            let null = std::fs::File::open("/dev/null").unwrap();
            let mut child = spawn(plan(
                args,
                [null.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()],
            ))
            .unwrap();
            drop(out_w);
            let mut text = String::new();
            std::fs::File::from(out_r)
                .read_to_string(&mut text)
                .unwrap();
            let st = child.wait().await.unwrap();
            assert_eq!(child.id(), None, "a reaped child has no pid");
            (text, st)
        })
    }

    #[test]
    fn runs_with_the_given_environment_directory_and_streams() {
        let (text, st) = output_of(&[
            "sh",
            "-c",
            "echo \"$SKIFF_SPAWN_TEST\"; pwd; echo err >&2; exit 3",
        ]);
        assert_eq!(text, "value 1\n/\nerr\n");
        assert_eq!(st.code(), Some(3));
    }

    #[test]
    fn the_child_leads_a_new_session_with_default_signals() {
        // SIGPIPE is ignored in Rust programs; the command must see it at its
        // default, and it must not share our session.
        let (text, st) = output_of(&[
            "sh",
            "-c",
            "grep -E '^(SigIgn|SigBlk)' /proc/self/status; ps -o sid= -p $$; echo $$",
        ]);
        assert!(st.success(), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "SigBlk:\t0000000000000000", "{text}");
        assert_eq!(lines[1], "SigIgn:\t0000000000000000", "{text}");
        assert_eq!(
            lines[2].trim(),
            lines[3].trim(),
            "session id is the shell's pid"
        );
    }

    #[test]
    fn server_descriptors_do_not_reach_the_command() {
        let (_keep_r, keep_w) = pipe().unwrap();
        // Clear close-on-exec on one descriptor, as a careless library might.
        // SAFETY: fcntl(2) on a descriptor this test owns, changing flags only.
        unsafe { libc::fcntl(keep_w.as_raw_fd(), libc::F_SETFD, 0) };
        let (text, st) = output_of(&["sh", "-c", "ls /proc/self/fd | sort -n | tr '\\n' ' '"]);
        assert!(st.success());
        // 0, 1, 2 and the directory ls itself opens.
        assert_eq!(text.split_whitespace().count(), 4, "{text}");
    }

    #[test]
    fn signals_and_exit_by_signal() {
        let rt = runtime();
        rt.block_on(async {
            let null = std::fs::File::open("/dev/null").unwrap();
            let n = null.as_raw_fd();
            let mut child = spawn(plan(&["sh", "-c", "sleep 30"], [n, n, n])).unwrap();
            assert!(child.id().is_some());
            child.signal(libc::SIGTERM, true);
            let st = child.wait().await.unwrap();
            assert_eq!(st.signal(), Some(libc::SIGTERM));
            // After reaping, signalling is a no-op, never a stray kill.
            child.signal(libc::SIGKILL, true);
        });
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_child() {
        let rt = runtime();
        rt.block_on(async {
            let null = std::fs::File::open("/dev/null").unwrap();
            let n = null.as_raw_fd();
            let mut p = plan(&["x"], [n, n, n]);
            p.program = Path::new("/nonexistent/skiff-test-program");
            let err = spawn(p).err().expect("spawn of a missing program fails");
            assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
            assert!(err.to_string().contains("execute"), "{err}");
            let mut p = plan(&["sh", "-c", "true"], [n, n, n]);
            p.cwd = Path::new("/nonexistent/dir");
            let err = spawn(p).err().expect("a missing directory fails");
            assert!(err.to_string().contains("change directory"), "{err}");
        });
    }

    #[test]
    fn dropping_an_unreaped_child_reaps_it() {
        let rt = runtime();
        let pid = rt.block_on(async {
            let null = std::fs::File::open("/dev/null").unwrap();
            let n = null.as_raw_fd();
            let child = spawn(plan(&["sh", "-c", "exit 0"], [n, n, n])).unwrap();
            let pid = child.id().unwrap() as i32;
            drop(child);
            // Give the background reaper a moment.
            for _ in 0..200 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
            }
            pid
        });
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} was left as a zombie"
        );
    }
}
