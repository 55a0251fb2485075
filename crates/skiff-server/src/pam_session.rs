//! PAM's session for one connection, in a process of its own.
//!
//! `pam_setcred` and `pam_open_session` change the process that calls
//! them: pam_limits sets its resource limits, pam_loginuid its audit login
//! uid, pam_systemd moves it into the user's session (a control group),
//! pam_keyinit gives it a session keyring, pam_namespace a mount
//! namespace. sshd calls them in the process that then starts the
//! session's commands, so every command inherits all of it. skiffd serves
//! every connection from one process, so with `UsePAM yes` each logged-in
//! connection gets a session process (`skiffd --pam-session`, root, a
//! child of skiffd) that opens PAM's session at the first command and
//! starts every command of the connection (shells, commands, subsystems,
//! transfer processes) as its own children, with the descriptors skiffd
//! passes it; skiffd relays signals and learns exit statuses through it.
//! When the connection ends skiffd closes the socket: the session process
//! closes PAM's session (`pam_close_session`, `pam_setcred(DELETE)`,
//! `pam_end`) and exits. The messages are [`skiff_proto::pam_session_wire`]'s.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::seqpacket::{recv, send};
use crate::spawn;
use skiff_proto::pam_session_wire::{FromSession, SpawnPlan, ToSession, MAX_MESSAGE};

/// What skiffd holds of a connection's open PAM session. Dropping it
/// (the connection ended, and no command of it runs) stops the reader and
/// closes the socket, which closes PAM's session.
pub struct PamSession {
    sock: Arc<AsyncFd<OwnedFd>>,
    /// One request at a time: the answers come in order.
    requests: tokio::sync::Mutex<()>,
    waiters: Arc<Waiters>,
    /// PAM's environment (pam_env, pam_systemd's XDG_RUNTIME_DIR).
    env: Vec<(String, String)>,
    messages: Mutex<Vec<String>>,
    _stop_reader: oneshot::Sender<()>,
    _process: spawn::ChildProcess,
}

/// Who waits for what the session process says: the request in progress,
/// and each running command's exit.
#[derive(Default)]
struct Waiters {
    answer: Mutex<Option<oneshot::Sender<Answer>>>,
    exits: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
}

/// An answer to a request, with what the reader set up for it.
enum Answer {
    Message(FromSession),
    Started(i32, oneshot::Receiver<ExitStatus>),
}

impl PamSession {
    /// Starts `exe --pam-session` and opens PAM's session (service,
    /// account, the client's address, the terminal or `ssh`).
    pub async fn open(
        exe: &Path,
        service: &str,
        user: &str,
        rhost: Option<String>,
        tty: &str,
    ) -> Result<Arc<PamSession>, String> {
        let (ours, theirs) = crate::seqpacket::pair().map_err(|e| format!("socketpair: {e}"))?;
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| format!("/dev/null: {e}"))?;
        let process = spawn::spawn(spawn::Plan {
            program: exe,
            args: vec![exe.as_os_str(), std::ffi::OsStr::new("--pam-session")],
            env: vec![("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")],
            cwd: Path::new("/"),
            root: None,
            stdio: [null.as_raw_fd(), null.as_raw_fd(), 2],
            extra: Some(theirs.as_raw_fd()),
            controlling_tty: false,
            credentials: None,
        })
        .map_err(|e| format!("cannot start the PAM session process: {e}"))?;
        drop(theirs);
        // SAFETY: `ours` is a socket this function made and owns; the
        // AsyncFd owns it from here.
        let sock = unsafe { AsyncFd::register(ours) }.map_err(|e| e.to_string())?;
        let open = ToSession::Open {
            service: service.to_string(),
            user: user.to_string(),
            rhost,
            tty: tty.to_string(),
        };
        send(&sock, &open.encode(), &[])
            .await
            .map_err(|e| format!("PAM session process: {e}"))?;
        let (env, messages) = match recv(&sock, MAX_MESSAGE).await {
            Ok(Some((bytes, _))) => match FromSession::decode(&bytes) {
                Ok(FromSession::Opened { env, messages }) => (env, messages),
                Ok(FromSession::Refused(why)) => return Err(why),
                Ok(other) => return Err(format!("unexpected answer {other:?}")),
                Err(e) => return Err(format!("bad answer: {e}")),
            },
            Ok(None) => return Err("the PAM session process ended".into()),
            Err(e) => return Err(format!("PAM session process: {e}")),
        };
        let sock = Arc::new(sock);
        let waiters = Arc::new(Waiters::default());
        let (stop_reader, stop) = oneshot::channel();
        tokio::spawn(read_answers(sock.clone(), waiters.clone(), stop));
        Ok(Arc::new(PamSession {
            sock,
            requests: tokio::sync::Mutex::new(()),
            waiters,
            env,
            messages: Mutex::new(messages),
            _stop_reader: stop_reader,
            _process: process,
        }))
    }

    /// PAM's environment for the session's commands.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// What PAM's modules said while the session opened, once.
    pub fn take_messages(&self) -> Vec<String> {
        std::mem::take(&mut *self.messages.lock().expect("messages lock"))
    }

    /// Starts `plan` in the session, its standard streams (and fd 3)
    /// being `fds`.
    pub async fn spawn(
        self: &Arc<Self>,
        plan: SpawnPlan,
        fds: &[RawFd],
    ) -> io::Result<RemoteChild> {
        let _one_at_a_time = self.requests.lock().await;
        let (tx, rx) = oneshot::channel();
        *self.waiters.answer.lock().expect("answer lock") = Some(tx);
        send(&self.sock, &ToSession::Spawn(plan).encode(), fds).await?;
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the PAM session process ended");
        match rx.await.map_err(|_| gone())? {
            Answer::Started(pid, exit) => Ok(RemoteChild {
                pid,
                session: self.clone(),
                exit: Some(exit),
                status: None,
            }),
            Answer::Message(FromSession::NotStarted(why)) => Err(io::Error::other(why)),
            Answer::Message(other) => Err(io::Error::other(format!("unexpected answer {other:?}"))),
        }
    }

    async fn signal(&self, pid: i32, signal: i32, group: bool) {
        let msg = ToSession::Signal { pid, signal, group };
        let _ = send(&self.sock, &msg.encode(), &[]).await;
    }
}

/// Hands each answer to its request, and each exit status to its
/// command's waiter, until the session process ends or `stop` (the
/// session was dropped).
async fn read_answers(
    sock: Arc<AsyncFd<OwnedFd>>,
    waiters: Arc<Waiters>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let next = tokio::select! {
            _ = &mut stop => return,
            next = recv(&sock, MAX_MESSAGE) => next,
        };
        let msg = match next {
            Ok(Some((bytes, _))) => match FromSession::decode(&bytes) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("PAM session process: bad message: {e}");
                    continue;
                }
            },
            _ => {
                // Gone: every waiter learns it by its sender dropping.
                waiters.answer.lock().expect("answer lock").take();
                waiters.exits.lock().expect("exits lock").clear();
                return;
            }
        };
        match msg {
            FromSession::Exited { pid, status } => {
                if let Some(tx) = waiters.exits.lock().expect("exits lock").remove(&pid) {
                    let _ = tx.send(ExitStatus::from_raw(status));
                }
            }
            FromSession::Started { pid } => {
                let (tx, rx) = oneshot::channel();
                waiters.exits.lock().expect("exits lock").insert(pid, tx);
                if let Some(waiter) = waiters.answer.lock().expect("answer lock").take() {
                    let _ = waiter.send(Answer::Started(pid, rx));
                }
            }
            other => {
                if let Some(waiter) = waiters.answer.lock().expect("answer lock").take() {
                    let _ = waiter.send(Answer::Message(other));
                }
            }
        }
    }
}

/// A command started in the PAM session process: its pid, and its exit
/// status once the session process has reaped it.
pub struct RemoteChild {
    pid: i32,
    session: Arc<PamSession>,
    exit: Option<oneshot::Receiver<ExitStatus>>,
    status: Option<ExitStatus>,
}

impl RemoteChild {
    /// The pid, or `None` once it has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Sends `sig` to the command (`group`: its process group) through the
    /// session process, which alone may know the pid is still its child.
    pub fn signal(&self, sig: libc::c_int, group: bool) {
        if self.status.is_some() {
            return;
        }
        let (session, pid) = (self.session.clone(), self.pid);
        tokio::spawn(async move { session.signal(pid, sig, group).await });
    }

    /// Waits for the command to end.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        let rx = self.exit.as_mut().expect("unreaped child has a receiver");
        let st = rx.await.map_err(|_| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the PAM session process ended")
        })?;
        self.status = Some(st);
        self.exit = None;
        Ok(st)
    }
}

/// `skiffd --pam-session`: the session process, serving skiffd on fd 3.
/// Returns the exit code.
pub fn serve() -> i32 {
    // SAFETY: skiffd passes the socket as fd 3 and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(3) };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skiffd --pam-session: {e}");
            return 1;
        }
    };
    match runtime.block_on(session_main(sock)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("skiffd --pam-session: {e}");
            1
        }
    }
}

/// PAM's conversation in the session process: nobody can be asked
/// anything; messages are kept for skiffd.
#[derive(Default, Clone)]
struct Notes(std::rc::Rc<std::cell::RefCell<Vec<String>>>);

impl pam_client::ConversationHandler for Notes {
    fn prompt_echo_on(
        &mut self,
        _: &std::ffi::CStr,
    ) -> Result<std::ffi::CString, pam_client::ErrorCode> {
        Err(pam_client::ErrorCode::CONV_ERR)
    }
    fn prompt_echo_off(
        &mut self,
        _: &std::ffi::CStr,
    ) -> Result<std::ffi::CString, pam_client::ErrorCode> {
        Err(pam_client::ErrorCode::CONV_ERR)
    }
    fn text_info(&mut self, msg: &std::ffi::CStr) {
        self.0.borrow_mut().push(msg.to_string_lossy().into_owned());
    }
    fn error_msg(&mut self, msg: &std::ffi::CStr) {
        self.0.borrow_mut().push(msg.to_string_lossy().into_owned());
    }
}

async fn session_main(sock: OwnedFd) -> io::Result<()> {
    // SAFETY: fd 3 is the socket skiffd passed, owned from here by the
    // AsyncFd alone.
    let sock = unsafe { AsyncFd::register(sock) }?;
    let Some((first, _)) = recv(&sock, MAX_MESSAGE).await? else {
        return Ok(());
    };
    let (service, user, rhost, tty) = match ToSession::decode(&first) {
        Ok(ToSession::Open {
            service,
            user,
            rhost,
            tty,
        }) => (service, user, rhost, tty),
        other => return Err(io::Error::other(format!("expected Open, got {other:?}"))),
    };
    let notes = Notes::default();
    let started =
        pam_client::Context::new(&service, Some(&user), notes.clone()).and_then(|mut ctx| {
            if let Some(rhost) = &rhost {
                ctx.set_rhost(Some(rhost))?;
            }
            ctx.set_tty(Some(&tty))?;
            Ok(ctx)
        });
    let mut ctx = match started {
        Ok(ctx) => ctx,
        Err(e) => {
            let why = FromSession::Refused(format!("PAM service {service}: {e}"));
            return send(&sock, &why.encode(), &[]).await;
        }
    };
    let session = match ctx.open_session(pam_client::Flag::NONE) {
        Ok(s) => s,
        Err(e) => {
            let why = FromSession::Refused(format!("PAM session: {e}"));
            return send(&sock, &why.encode(), &[]).await;
        }
    };
    let env: Vec<(String, String)> = session
        .envlist()
        .iter_tuples()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let messages = std::mem::take(&mut *notes.0.borrow_mut());
    send(&sock, &FromSession::Opened { env, messages }.encode(), &[]).await?;

    // The commands not yet reaped: only these may be signalled, so a pid
    // the kernel has handed to someone else never is.
    let mut live: std::collections::HashSet<i32> = Default::default();
    let mut exits = futures::stream::FuturesUnordered::new();
    loop {
        tokio::select! {
            next = recv(&sock, MAX_MESSAGE) => {
                let Some((bytes, fds)) = next? else {
                    break;
                };
                match ToSession::decode(&bytes) {
                    Ok(ToSession::Spawn(plan)) => {
                        let answer = match start(&plan, &fds) {
                            Ok(mut child) => {
                                let pid = child.id().map_or(-1, |p| p as i32);
                                live.insert(pid);
                                exits.push(async move {
                                    let status = child.wait().await;
                                    (pid, status.map_or(-1, |s| s.into_raw()))
                                });
                                FromSession::Started { pid }
                            }
                            Err(e) => FromSession::NotStarted(e.to_string()),
                        };
                        drop(fds);
                        send(&sock, &answer.encode(), &[]).await?;
                    }
                    Ok(ToSession::Signal { pid, signal, group }) => {
                        if live.contains(&pid) {
                            let target = if group { -pid } else { pid };
                            // SAFETY: kill(2) on our own unreaped child
                            // (or the process group it leads).
                            unsafe { libc::kill(target, signal) };
                        }
                    }
                    Ok(ToSession::Open { .. }) | Err(_) => {
                        eprintln!("skiffd --pam-session: unexpected message from skiffd");
                    }
                }
            }
            Some((pid, status)) = futures::StreamExt::next(&mut exits) => {
                live.remove(&pid);
                send(&sock, &FromSession::Exited { pid, status }.encode(), &[]).await?;
            }
        }
    }
    // The connection ended: PAM's session closes (commands still running
    // go on, as with sshd).
    if let Err(e) = session.close(pam_client::Flag::NONE) {
        eprintln!("skiffd --pam-session: closing PAM's session: {e}");
    }
    Ok(())
}

/// Starts `plan` with `fds` as its standard streams (and fd 3).
fn start(plan: &SpawnPlan, fds: &[OwnedFd]) -> io::Result<spawn::ChildProcess> {
    let want = if plan.extra { 4 } else { 3 };
    if fds.len() != want {
        return Err(io::Error::other(format!(
            "{} descriptors for a command that needs {want}",
            fds.len()
        )));
    }
    let os = |b: &[u8]| std::ffi::OsStr::from_bytes(b).to_os_string();
    let program = std::path::PathBuf::from(os(&plan.program));
    let args: Vec<std::ffi::OsString> = plan.args.iter().map(|a| os(a)).collect();
    let cwd = std::path::PathBuf::from(os(&plan.cwd));
    let root = plan.root.as_ref().map(|r| std::path::PathBuf::from(os(r)));
    spawn::spawn(spawn::Plan {
        program: &program,
        args: args.iter().map(|a| a.as_os_str()).collect(),
        env: plan
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        cwd: &cwd,
        root: root.as_deref(),
        stdio: [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()],
        extra: fds.get(3).map(|f| f.as_raw_fd()),
        controlling_tty: plan.controlling_tty,
        credentials: plan
            .credentials
            .as_ref()
            .map(|(uid, gid, groups)| spawn::Credentials {
                uid: *uid,
                gid: *gid,
                groups: groups.clone(),
            }),
    })
}

/// `plan` as the session process takes it.
pub fn wire_plan(plan: &spawn::Plan<'_>) -> SpawnPlan {
    SpawnPlan {
        program: plan.program.as_os_str().as_bytes().to_vec(),
        args: plan.args.iter().map(|a| a.as_bytes().to_vec()).collect(),
        env: plan
            .env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cwd: plan.cwd.as_os_str().as_bytes().to_vec(),
        root: plan.root.map(|r| r.as_os_str().as_bytes().to_vec()),
        controlling_tty: plan.controlling_tty,
        credentials: plan
            .credentials
            .as_ref()
            .map(|c| (c.uid, c.gid, c.groups.clone())),
        extra: plan.extra.is_some(),
    }
}
