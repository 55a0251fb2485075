//! Starting a session's command as the account: a clean environment (which
//! one is [`crate::session_env`]'s decision), the account's shell, the home
//! directory, privileges dropped in the child (setgroups, setgid, setuid)
//! and either pipes or a pseudo-terminal (handed to the account for the
//! session, see [`crate::pty_owner`]). The low-level start (clone,
//! credentials, exec) is in [`crate::spawn`].

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::pty::{openpty, Winsize};
use nix::sys::termios::{self, SetArg};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use skiff_proto::signals;

use crate::account::Account;
use crate::session_env;
use crate::spawn::{self, ChildProcess};

/// What the client asked for with `pty-req`.
#[derive(Debug, Clone)]
pub struct PtySpec {
    pub term: String,
    pub cols: u32,
    pub rows: u32,
    pub pix_width: u32,
    pub pix_height: u32,
    pub modes: Vec<(russh::Pty, u32)>,
}

/// What to run and how.
pub struct SpawnRequest<'a> {
    pub account: &'a Account,
    /// `None` starts an interactive login shell.
    pub command: Option<&'a str>,
    pub env: Vec<(String, String)>,
    pub pty: Option<&'a PtySpec>,
    /// Becomes the child's fd 3 (the transfer process's socket to skiffd).
    pub extra: Option<RawFd>,
    /// A `ChrootDirectory` jail (checked already) to run the command in.
    pub jail: Option<Jail<'a>>,
    /// skiffd's own executable, to run its SFTP server directly instead
    /// of `command` through the account's shell (`ForceCommand
    /// internal-sftp` outside a jail).
    pub direct_sftp: Option<&'a Path>,
    /// The `--sftp-options` argument for skiffd's own SFTP server when it
    /// starts directly or enters a jail itself (through the shell, the
    /// command line carries it).
    pub sftp_options: Option<&'a str>,
    /// The connection's PAM session (`UsePAM yes`): the process starts
    /// there, with PAM's environment.
    pub pam: Option<&'a Arc<crate::pam_session::PamSession>>,
}

/// Where a jailed command runs.
pub struct Jail<'a> {
    pub root: &'a Path,
    /// skiffd's own executable, when the command is its SFTP server: that
    /// starts as root outside the jail, enters it and drops to the account
    /// itself, so the jail needs no program or library of its own.
    pub internal_sftp: Option<&'a Path>,
}

/// The child's standard streams.
pub enum ChildIo {
    Pipes {
        stdin: pipe::Sender,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    Pty(Arc<PtyMaster>),
}

/// A started session process: skiffd's own child, or one of its PAM
/// session's ([`crate::pam_session`]).
pub enum SessionChild {
    Own(ChildProcess),
    InPamSession(crate::pam_session::RemoteChild),
}

impl SessionChild {
    pub fn id(&self) -> Option<u32> {
        match self {
            SessionChild::Own(c) => c.id(),
            SessionChild::InPamSession(c) => c.id(),
        }
    }

    pub fn signal(&self, sig: libc::c_int, group: bool) {
        match self {
            SessionChild::Own(c) => c.signal(sig, group),
            SessionChild::InPamSession(c) => c.signal(sig, group),
        }
    }

    pub async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        match self {
            SessionChild::Own(c) => c.wait().await,
            SessionChild::InPamSession(c) => c.wait().await,
        }
    }
}

/// Starts `plan`: in the PAM session when there is one, else as skiffd's
/// own child.
async fn start_child(
    plan: spawn::Plan<'_>,
    pam: Option<&Arc<crate::pam_session::PamSession>>,
) -> io::Result<SessionChild> {
    match pam {
        None => spawn::spawn(plan).map(SessionChild::Own),
        Some(session) => {
            let mut fds = plan.stdio.to_vec();
            fds.extend(plan.extra);
            let wire = crate::pam_session::wire_plan(&plan);
            session
                .spawn(wire, &fds)
                .await
                .map(SessionChild::InPamSession)
        }
    }
}

/// A started session process.
pub struct Spawned {
    pub child: SessionChild,
    pub pid: i32,
    pub io: ChildIo,
    /// Its terminal's path (`/dev/pts/N`), when it has one.
    pub tty: Option<String>,
}

/// Starts the process. Must be called from within a tokio runtime.
pub async fn spawn(req: SpawnRequest<'_>) -> io::Result<Spawned> {
    let acct = req.account;
    let login_name;
    let mut program = acct.shell.as_path();
    let mut args: Vec<&OsStr> = match req.command {
        Some(c) => vec![acct.shell.as_os_str(), OsStr::new("-c"), OsStr::new(c)],
        None => {
            let base = acct
                .shell
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sh".into());
            login_name = format!("-{base}");
            vec![OsStr::new(&login_name)]
        }
    };
    // Like sshd's internal-sftp, skiffd's own server needs no shell (and
    // the account's may run nothing).
    if let Some(exe) = req.direct_sftp {
        program = exe;
        args = vec![exe.as_os_str(), OsStr::new("--sftp-server")];
        if let Some(options) = req.sftp_options {
            args.extend([OsStr::new("--sftp-options"), OsStr::new(options)]);
        }
    }
    let mut credentials = acct.credentials();
    let mut root = None;
    let jailed_start: PathBuf;
    let drop_to;
    let cwd = match &req.jail {
        None if acct.home.is_dir() => acct.home.as_path(),
        None => {
            tracing::warn!(user = %acct.name, "home directory {} missing; starting in /", acct.home.display());
            Path::new("/")
        }
        Some(Jail {
            root: jail,
            internal_sftp: Some(exe),
        }) => {
            // The SFTP server enters the jail and drops privileges itself.
            drop_to = crate::chroot::DropTo {
                uid: acct.uid,
                gid: acct.gid,
                groups: acct.groups.clone(),
            }
            .to_arg();
            program = exe;
            args = vec![
                exe.as_os_str(),
                OsStr::new("--sftp-server"),
                OsStr::new("--chroot"),
                jail.as_os_str(),
                OsStr::new("--drop-to"),
                OsStr::new(&drop_to),
                OsStr::new("--home"),
                acct.home.as_os_str(),
            ];
            if let Some(options) = req.sftp_options {
                args.extend([OsStr::new("--sftp-options"), OsStr::new(options)]);
            }
            credentials = None;
            Path::new("/")
        }
        Some(Jail {
            root: jail,
            internal_sftp: None,
        }) => {
            root = Some(*jail);
            jailed_start = crate::chroot::start_dir(jail, &acct.home);
            jailed_start.as_path()
        }
    };
    // The session's environment only for a program that is the account
    // when it is executed; the jailed SFTP server gets the fixed one.
    let start = session_env::Start::for_session(credentials.is_some());
    let pty = req.pty.map(open_pty).transpose()?;
    // The terminal's name, as sshd gives it (`SSH_TTY=/dev/pts/N`), to a
    // program that gets the session's environment.
    let tty_name = pty
        .as_ref()
        .and_then(|(_, slave)| nix::unistd::ttyname(slave).ok())
        .map(|path| path.to_string_lossy().into_owned());
    let mut env = session_env::exec_environment(start, &req.env);
    // PAM's environment (pam_env, pam_systemd) comes last and wins, as in
    // sshd.
    if let (Some(pam), session_env::Start::AsAccount) = (req.pam, start) {
        for (k, v) in pam.env() {
            env.retain(|(name, _)| *name != k.as_str());
            env.push((k.as_str(), v.as_str()));
        }
    }
    if let Some(name) = tty_name
        .as_ref()
        .filter(|_| start == session_env::Start::AsAccount)
    {
        env.retain(|(k, _)| *k != "SSH_TTY");
        env.push(("SSH_TTY", name));
    }
    let plan = |stdio: [RawFd; 3], controlling_tty: bool| spawn::Plan {
        program,
        args: args.clone(),
        env: env.clone(),
        cwd,
        root,
        stdio,
        extra: req.extra,
        controlling_tty,
        credentials: credentials.clone(),
    };

    let (child, io) = match pty {
        Some((master, slave)) => {
            let mut master = PtyMaster::new(master)?;
            // A root server gives the terminal to the account for the
            // session. Should anything below fail, dropping `master` gives
            // it back while the terminal is still open.
            if acct.credentials().is_some() {
                let to = crate::pty_owner::grant(acct.uid, acct.gid, crate::pty_owner::tty_group());
                let lease = crate::pty_owner::hand_over(&slave, to).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot give the terminal to the account: {e}"),
                    )
                })?;
                master.lease = Some(lease);
            }
            let fd = slave.as_raw_fd();
            let child = start_child(plan([fd, fd, fd], true), req.pam).await?;
            drop(slave); // only the child holds the terminal now, so EOF shows as EIO
            (child, ChildIo::Pty(Arc::new(master)))
        }
        None => {
            let (in_r, in_w) = spawn::pipe()?;
            widen_input_pipe(&in_w);
            let (out_r, out_w) = spawn::pipe()?;
            let (err_r, err_w) = spawn::pipe()?;
            let child = start_child(
                plan(
                    [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
                    false,
                ),
                req.pam,
            )
            .await?;
            drop((in_r, out_w, err_w));
            let io = ChildIo::Pipes {
                stdin: pipe::Sender::from_owned_fd(in_w)?,
                stdout: pipe::Receiver::from_owned_fd(out_r)?,
                stderr: pipe::Receiver::from_owned_fd(err_r)?,
            };
            (child, io)
        }
    };
    let pid = child.id().map(|p| p as i32).unwrap_or(-1);
    Ok(Spawned {
        child,
        pid,
        io,
        tty: tty_name,
    })
}

/// What a command's stdin pipe holds (the kernel's default is 64 KiB).
/// With one async worker thread per connection process, the session's
/// decryption and its writes into the pipe take turns on one thread, and a
/// 64 KiB pipe made it wait for the command every two packets: SSH-channel
/// uploads into skiffd ran ~7% below the single-process skiffd's; with
/// 1 MiB they run above it (256 KiB was not enough; docs/BENCHMARKS.md).
/// Bytes in the pipe are input the command has not read, outside
/// `MaxConnectionQueue`: at most this much per session.
pub const INPUT_PIPE_CAPACITY: usize = 1 << 20;

/// Gives a command's stdin pipe [`INPUT_PIPE_CAPACITY`]. A kernel that
/// refuses (an unprivileged skiffd past the user's pipe allowance) leaves
/// the default, which only costs speed.
fn widen_input_pipe(write_end: &OwnedFd) {
    use nix::fcntl::{fcntl, FcntlArg};
    if let Err(e) = fcntl(
        write_end,
        FcntlArg::F_SETPIPE_SZ(INPUT_PIPE_CAPACITY as i32),
    ) {
        tracing::debug!("a command's stdin pipe keeps the kernel's default size: {e}");
    }
}

fn winsize(cols: u32, rows: u32, pw: u32, ph: u32) -> Winsize {
    let clamp = |v: u32| v.min(u16::MAX as u32) as u16;
    Winsize {
        ws_row: clamp(rows),
        ws_col: clamp(cols),
        ws_xpixel: clamp(pw),
        ws_ypixel: clamp(ph),
    }
}

fn open_pty(spec: &PtySpec) -> io::Result<(OwnedFd, OwnedFd)> {
    let ws = winsize(spec.cols, spec.rows, spec.pix_width, spec.pix_height);
    let pair = openpty(Some(&ws), None).map_err(io::Error::from)?;
    if !spec.modes.is_empty() {
        let mut t = termios::tcgetattr(&pair.slave).map_err(io::Error::from)?;
        apply_modes(&mut t, &spec.modes);
        termios::tcsetattr(&pair.slave, SetArg::TCSANOW, &t).map_err(io::Error::from)?;
    }
    Ok((pair.master, pair.slave))
}

/// Applies RFC 4254 section 8 terminal modes to a termios structure.
fn apply_modes(t: &mut termios::Termios, modes: &[(russh::Pty, u32)]) {
    use nix::sys::termios::{
        ControlFlags as C, InputFlags as I, LocalFlags as L, OutputFlags as O,
        SpecialCharacterIndices as S,
    };
    use russh::Pty;
    for &(mode, value) in modes {
        let on = value != 0;
        let cc = |t: &mut termios::Termios, idx: S| t.control_chars[idx as usize] = value as u8;
        match mode {
            Pty::VINTR => cc(t, S::VINTR),
            Pty::VQUIT => cc(t, S::VQUIT),
            Pty::VERASE => cc(t, S::VERASE),
            Pty::VKILL => cc(t, S::VKILL),
            Pty::VEOF => cc(t, S::VEOF),
            Pty::VEOL => cc(t, S::VEOL),
            Pty::VEOL2 => cc(t, S::VEOL2),
            Pty::VSTART => cc(t, S::VSTART),
            Pty::VSTOP => cc(t, S::VSTOP),
            Pty::VSUSP => cc(t, S::VSUSP),
            Pty::VREPRINT => cc(t, S::VREPRINT),
            Pty::VWERASE => cc(t, S::VWERASE),
            Pty::VLNEXT => cc(t, S::VLNEXT),
            Pty::VDISCARD => cc(t, S::VDISCARD),
            Pty::IGNPAR => t.input_flags.set(I::IGNPAR, on),
            Pty::PARMRK => t.input_flags.set(I::PARMRK, on),
            Pty::INPCK => t.input_flags.set(I::INPCK, on),
            Pty::ISTRIP => t.input_flags.set(I::ISTRIP, on),
            Pty::INLCR => t.input_flags.set(I::INLCR, on),
            Pty::IGNCR => t.input_flags.set(I::IGNCR, on),
            Pty::ICRNL => t.input_flags.set(I::ICRNL, on),
            Pty::IUCLC => t.input_flags.set(I::IUCLC, on),
            Pty::IXON => t.input_flags.set(I::IXON, on),
            Pty::IXANY => t.input_flags.set(I::IXANY, on),
            Pty::IXOFF => t.input_flags.set(I::IXOFF, on),
            Pty::IMAXBEL => t.input_flags.set(I::IMAXBEL, on),
            Pty::IUTF8 => t.input_flags.set(I::IUTF8, on),
            Pty::ISIG => t.local_flags.set(L::ISIG, on),
            Pty::ICANON => t.local_flags.set(L::ICANON, on),
            Pty::ECHO => t.local_flags.set(L::ECHO, on),
            Pty::ECHOE => t.local_flags.set(L::ECHOE, on),
            Pty::ECHOK => t.local_flags.set(L::ECHOK, on),
            Pty::ECHONL => t.local_flags.set(L::ECHONL, on),
            Pty::NOFLSH => t.local_flags.set(L::NOFLSH, on),
            Pty::TOSTOP => t.local_flags.set(L::TOSTOP, on),
            Pty::IEXTEN => t.local_flags.set(L::IEXTEN, on),
            Pty::ECHOCTL => t.local_flags.set(L::ECHOCTL, on),
            Pty::ECHOKE => t.local_flags.set(L::ECHOKE, on),
            Pty::PENDIN => t.local_flags.set(L::PENDIN, on),
            Pty::OPOST => t.output_flags.set(O::OPOST, on),
            Pty::OLCUC => t.output_flags.set(O::OLCUC, on),
            Pty::ONLCR => t.output_flags.set(O::ONLCR, on),
            Pty::OCRNL => t.output_flags.set(O::OCRNL, on),
            Pty::ONOCR => t.output_flags.set(O::ONOCR, on),
            Pty::ONLRET => t.output_flags.set(O::ONLRET, on),
            Pty::CS7 => {
                t.control_flags.remove(C::CSIZE);
                t.control_flags.insert(if on { C::CS7 } else { C::CS8 });
            }
            Pty::CS8 => {
                t.control_flags.remove(C::CSIZE);
                t.control_flags.insert(if on { C::CS8 } else { C::CS7 });
            }
            Pty::PARENB => t.control_flags.set(C::PARENB, on),
            Pty::PARODD => t.control_flags.set(C::PARODD, on),
            _ => {}
        }
    }
}

/// The server side of a pseudo-terminal, readable and writable without
/// blocking the runtime. When a root server handed the terminal to the
/// account, it is given back at the end of the session, at the latest
/// when this is dropped, before the terminal closes.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
    lease: Option<crate::pty_owner::Lease>,
}

impl Drop for PtyMaster {
    fn drop(&mut self) {
        // Runs before the descriptor closes: the device is still ours.
        self.give_back();
    }
}

impl PtyMaster {
    /// Gives the terminal back to whoever had it before the session (see
    /// [`crate::pty_owner`]); only the first call acts.
    pub fn give_back(&self) {
        if let Some(lease) = &self.lease {
            lease.give_back();
        }
    }

    fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags =
            nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
        // SAFETY: we own the fd and it stays open for the lifetime of the AsyncFd.
        Ok(PtyMaster {
            fd: unsafe { AsyncFd::register(fd)? },
            lease: None,
        })
    }

    /// Waits until the terminal has output to read (or was closed).
    pub async fn readable(&self) -> io::Result<()> {
        self.fd.readable().await.map(drop)
    }

    /// Reads terminal output; `Ok(0)` once every holder of the terminal closed it.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                // SAFETY: `buf` is valid for writes of `buf.len()` bytes and
                // the descriptor is the terminal this AsyncFd owns.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` to the terminal (the program's input).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                // SAFETY: `data` is valid for reads of `data.len()` bytes and
                // the descriptor is the terminal this AsyncFd owns.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Tells the kernel the new window size; it signals SIGWINCH to the foreground job.
    pub fn resize(&self, cols: u32, rows: u32, pw: u32, ph: u32) -> io::Result<()> {
        let ws = winsize(cols, rows, pw, ph);
        // SAFETY: TIOCSWINSZ reads one Winsize from the pointer we pass.
        let r = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Converts russh's signal type to a number.
pub fn sig_to_number(sig: &russh::Sig) -> Option<i32> {
    use russh::Sig;
    Some(match sig {
        Sig::ABRT => libc::SIGABRT,
        Sig::ALRM => libc::SIGALRM,
        Sig::FPE => libc::SIGFPE,
        Sig::HUP => libc::SIGHUP,
        Sig::ILL => libc::SIGILL,
        Sig::INT => libc::SIGINT,
        Sig::KILL => libc::SIGKILL,
        Sig::PIPE => libc::SIGPIPE,
        Sig::QUIT => libc::SIGQUIT,
        Sig::SEGV => libc::SIGSEGV,
        Sig::TERM => libc::SIGTERM,
        Sig::USR1 => libc::SIGUSR1,
        Sig::Custom(name) => return signals::number(name),
    })
}

/// Converts a signal number to russh's signal type.
pub fn number_to_sig(num: i32) -> russh::Sig {
    use russh::Sig;
    match num {
        libc::SIGABRT => Sig::ABRT,
        libc::SIGALRM => Sig::ALRM,
        libc::SIGFPE => Sig::FPE,
        libc::SIGHUP => Sig::HUP,
        libc::SIGILL => Sig::ILL,
        libc::SIGINT => Sig::INT,
        libc::SIGKILL => Sig::KILL,
        libc::SIGPIPE => Sig::PIPE,
        libc::SIGQUIT => Sig::QUIT,
        libc::SIGSEGV => Sig::SEGV,
        libc::SIGTERM => Sig::TERM,
        libc::SIGUSR1 => Sig::USR1,
        other => Sig::Custom(signals::name(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn russh_signals_round_trip() {
        for num in [
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGKILL,
            libc::SIGTERM,
            libc::SIGUSR2,
            libc::SIGWINCH,
        ] {
            assert_eq!(sig_to_number(&number_to_sig(num)), Some(num));
        }
        assert_eq!(sig_to_number(&russh::Sig::Custom("NOPE".into())), None);
    }
}
