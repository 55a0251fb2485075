//! Session channels up to a running command (OpenSSH's session.c): opening
//! one (`MaxSessions`), the requests that prepare it (`pty-req`, `env`
//! under `AcceptEnv`, `auth-agent-req`, `window-change`, `signal`) and those
//! that start it (`exec`, `shell`, `subsystem` sftp and the skiff data
//! plane). Starting decides the command (a forced command wins and the
//! client's goes to `SSH_ORIGINAL_COMMAND`), its environment
//! (`environment_for`, with [`crate::session_env`]'s rules), its jail
//! (`ChrootDirectory`), the `ExposeAuthInfo` file and how it runs (through
//! the account's shell, or skiffd's own SFTP server directly); an account
//! whose shell runs nothing is answered as that shell would answer.
//!
//! Not here: starting the process as the account (`crate::process`),
//! moving a started session's bytes and reporting its end (`session_io`),
//! and the data plane's relay (`crate::stream_relay`).

use std::sync::Arc;

use russh::server::{ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, Sig};
use skiff_proto::pattern;

use super::auth::Authenticated;
use super::session_io::SessionAudit;
use super::session_io::{run_session_io, Control};
use super::ConnectionHandler;
use crate::account::Account;
use crate::channel_timeout::ChannelKind;
use crate::process::{self, ChildIo, PtySpec, SpawnRequest};
use crate::session_env::Source;

/// A session channel before and after its command starts.
pub(super) struct SessionChannel {
    /// Held until a command starts; then moved into the I/O tasks.
    channel: Option<Channel<Msg>>,
    env: Vec<(String, String)>,
    pty: Option<PtySpec>,
    /// The client asked for its agent to be forwarded to this session.
    agent: Option<std::path::PathBuf>,
    running: Option<Running>,
    /// The channel's count in the connection's queue; moved into the I/O
    /// tasks with the channel.
    queue: Option<Arc<crate::queue_budget::ChannelQueue>>,
    /// The channel's idle clock (`ChannelTimeout`), moved likewise.
    clock: Option<Arc<crate::channel_idle::ChannelClock>>,
    /// The subsystem asked for, when the channel serves one.
    subsystem: Option<String>,
    /// Bytes the client has sent on the channel (for the audit log).
    pub(super) bytes_in: Arc<std::sync::atomic::AtomicU64>,
}

struct Running {
    /// Signals and hang-ups go to the task that owns (and reaps) the process,
    /// so a pid is never signalled after it was reaped and possibly reused.
    /// Dropping the sender hangs the session up.
    control: tokio::sync::mpsc::UnboundedSender<Control>,
    task: tokio::task::JoinHandle<()>,
    pty: Option<Arc<process::PtyMaster>>,
}

/// How many refused environment variables one connection gets a warning
/// line each for; past that, one line says so and the rest go to debug.
const REFUSALS_LOGGED: u32 = 8;

impl ConnectionHandler {
    /// `SSH_CONNECTION`: client address and port, server address and port
    /// (`UNKNOWN 65535` for each when the connection is not a socket).
    fn ssh_connection(&self) -> String {
        if self.peer_unknown {
            return "UNKNOWN 65535 UNKNOWN 65535".into();
        }
        let (p, l) = (self.peer, self.local);
        format!("{} {} {} {}", p.ip(), p.port(), l.ip(), l.port())
    }

    /// `SSH_CLIENT`: client address and port, server port.
    fn ssh_client(&self) -> String {
        if self.peer_unknown {
            return "UNKNOWN 65535 65535".into();
        }
        let (p, l) = (self.peer, self.local);
        format!("{} {} {}", p.ip(), p.port(), l.port())
    }

    /// The `ChrootDirectory` of `account`'s login, expanded and checked;
    /// `None` when there is none. Jailing needs root.
    fn jail_for(&self, account: &Account) -> Result<Option<std::path::PathBuf>, String> {
        let Some(template) = &self.settings().chroot_directory else {
            return Ok(None);
        };
        if !nix::unistd::geteuid().is_root() {
            return Err("skiffd must run as root to jail a login".into());
        }
        let jail = crate::chroot::expand(template, account)?;
        crate::chroot::check(&jail)?;
        Ok(Some(jail))
    }

    fn environment_for(
        &self,
        auth: &Authenticated,
        chan: &SessionChannel,
        original: Option<&str>,
    ) -> Vec<(String, String)> {
        let acct = &auth.account;
        let path = if acct.uid == 0 {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        } else {
            "/usr/local/bin:/usr/bin:/bin:/usr/games"
        };
        let mut env: Vec<(String, String)> = chan.env.clone();
        if self.settings().permit_user_environment {
            env.extend(
                auth.options
                    .environment
                    .iter()
                    .filter(|(name, _)| self.env_allowed(Source::KeyOption, name))
                    .cloned(),
            );
        }
        let fixed = [
            ("USER", acct.name.clone()),
            ("LOGNAME", acct.name.clone()),
            ("HOME", acct.home.to_string_lossy().into_owned()),
            ("SHELL", acct.shell.to_string_lossy().into_owned()),
            ("PATH", path.to_string()),
            ("SSH_CONNECTION", self.ssh_connection()),
            ("SSH_CLIENT", self.ssh_client()),
        ];
        for (k, v) in fixed {
            set_var(&mut env, k, v);
        }
        // SetEnv wins over everything else, as in sshd.
        for (k, v) in &self.settings().set_env {
            set_var(&mut env, k, v.clone());
        }
        if let Some(pty) = &chan.pty {
            set_var(&mut env, "TERM", pty.term.clone());
        }
        if let Some(orig) = original {
            set_var(&mut env, "SSH_ORIGINAL_COMMAND", orig.to_string());
        }
        if let Some(socket) = &chan.agent {
            set_var(&mut env, "SSH_AUTH_SOCK", socket.display().to_string());
        }
        if let Some(info) = &self.auth_info {
            set_var(&mut env, "SSH_USER_AUTH", info.path().display().to_string());
        }
        env
    }

    /// Whether `name`, from `source`, may reach a session (see
    /// [`crate::session_env::refusal`]); a refusal is logged.
    fn env_allowed(&self, source: Source, name: &str) -> bool {
        let Some(why) = crate::session_env::refusal(name) else {
            return true;
        };
        let user = self.auth.as_ref().map_or("", |a| a.account.name.as_str());
        let line = crate::session_env::refused_message(source, name, why);
        // A client may send as many `env` requests as it likes: the first
        // few refusals are worth a warning each, the rest one line.
        let refusals = self.env_refusals.get().saturating_add(1);
        self.env_refusals.set(refusals);
        match refusals {
            n if n <= REFUSALS_LOGGED => tracing::warn!(peer = %self.peer, user = %user, "{line}"),
            n if n == REFUSALS_LOGGED + 1 => tracing::warn!(peer = %self.peer, user = %user,
                "more refused environment variables on this connection; no longer logged one by one"),
            _ => tracing::debug!(peer = %self.peer, user = %user, "{line}"),
        }
        false
    }

    /// Makes the `ExposeAuthInfo` file at the login's first session, when
    /// its settings ask for one; a failure is logged and the session goes
    /// on without it.
    fn expose_auth_info(&mut self) {
        if self.auth_info.is_some() || !self.settings().expose_auth_info {
            return;
        }
        let Some(auth) = &self.auth else {
            return;
        };
        let acct = &auth.account;
        match crate::auth_info::AuthInfoFile::create(&auth.credential, acct.uid, acct.gid) {
            Ok(file) => self.auth_info = Some(file),
            Err(e) => {
                tracing::warn!(peer = %self.peer, user = %acct.name, "ExposeAuthInfo: cannot write the file: {e}")
            }
        }
    }

    /// The connection's PAM session (`UsePAM yes`), opened at its first
    /// command; `Err` when PAM refuses it (logged), and then no command
    /// runs, as with sshd.
    async fn pam_session(&mut self) -> Result<Option<Arc<crate::pam_session::PamSession>>, ()> {
        if !self.settings().pam.use_pam {
            return Ok(None);
        }
        if let Some(open) = &self.pam_session {
            return Ok(Some(open.clone()));
        }
        let Some(auth) = &self.auth else {
            return Err(());
        };
        let user = auth.account.name.clone();
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::warn!(peer = %self.peer, user, "PAM session: cannot find skiffd's executable: {e}");
                return Err(());
            }
        };
        let rhost = (!self.peer_unknown).then(|| self.peer.ip().to_string());
        let service = self.settings().pam.service.clone();
        match crate::pam_session::PamSession::open(&exe, &service, &user, rhost, "ssh").await {
            Ok(open) => {
                self.pam_session = Some(open.clone());
                Ok(Some(open))
            }
            Err(why) => {
                tracing::warn!(peer = %self.peer, user, "refusing session: PAM session setup failed: {why}");
                Err(())
            }
        }
    }

    /// Starts the command (or shell) for a channel and wires its I/O.
    pub(super) async fn start(
        &mut self,
        id: ChannelId,
        requested: Option<String>,
        session: &mut Session,
        extra: Option<&std::os::fd::OwnedFd>,
    ) -> Result<(), russh::Error> {
        self.expose_auth_info();
        let Ok(pam) = self.pam_session().await else {
            return session.channel_failure(id);
        };
        let Some(auth) = self.auth.as_ref() else {
            return session.channel_failure(id);
        };
        let Some(chan) = self.channels.get(&id) else {
            return session.channel_failure(id);
        };
        if chan.running.is_some() || chan.channel.is_none() {
            return session.channel_failure(id);
        }
        // A forced command replaces whatever the client asked for.
        let (command, original) = match &auth.options.command {
            Some(forced) => (Some(forced.clone()), requested.clone()),
            None => (requested.clone(), None),
        };
        let env = self.environment_for(auth, chan, original.as_deref());
        let jail = match self.jail_for(&auth.account) {
            Ok(jail) => jail,
            Err(why) => {
                tracing::warn!(peer = %self.peer, user = %auth.account.name, "refusing session: ChrootDirectory: {why}");
                return session.channel_failure(id);
            }
        };
        // skiffd's own SFTP server, when that is what runs: the forced
        // internal-sftp, or the sftp subsystem's command when it is skiffd's
        // server. In a jail it starts as root outside and enters the jail
        // itself; forced outside a jail it starts without the account's
        // shell, as sshd's does.
        let settings = self.settings();
        let own_sftp = match (&command, &auth.forced_internal_sftp) {
            (Some(c), Some(options)) => Some((c, options)),
            (Some(c), None) if settings.sftp_command.as_ref() == Some(c) => {
                Some((c, &settings.sftp_options))
            }
            _ => None,
        }
        .and_then(|(c, options)| crate::sftp::internal_server_exe(c).map(|exe| (exe, options)));
        // Its options for this account (`-d` tokens expanded), as the one
        // argument the server reads them from.
        let sftp_options = match own_sftp.as_ref().map(|(_, options)| {
            options.for_login(&auth.account.home.to_string_lossy(), &auth.account.name)
        }) {
            None => None,
            Some(Ok(options)) => (!options.is_empty()).then(|| options.to_arg()),
            Some(Err(e)) => {
                tracing::warn!(peer = %self.peer, user = %auth.account.name, "refusing session: internal-sftp: {e}");
                return session.channel_failure(id);
            }
        };
        let internal_sftp = own_sftp
            .as_ref()
            .filter(|_| jail.is_some())
            .map(|(exe, _)| exe.clone())
            .filter(|exe| {
                crate::lookup_command::check_program(exe)
                    .inspect_err(|why| tracing::warn!("the SFTP server cannot serve a jail: {why}"))
                    .is_ok()
            });
        let direct_sftp = own_sftp
            .filter(|_| jail.is_none() && auth.forced_internal_sftp.is_some())
            .map(|(exe, _)| exe);
        // Through the shell, the options go on the server's command line.
        let command = match (command, &sftp_options) {
            (Some(c), Some(arg)) => Some(crate::sftp::with_options(&c, arg)),
            (command, _) => command,
        };
        // Anything else runs through the account's shell, which for a
        // `nologin` or `false` account runs nothing.
        let through_shell = internal_sftp.is_none() && direct_sftp.is_none();
        if through_shell
            && crate::account_policy::shell_use(&auth.account.shell)
                == crate::account_policy::ShellUse::Nothing
        {
            tracing::info!(peer = %self.peer, user = %auth.account.name,
                "refusing session: the account's shell {} runs nothing",
                auth.account.shell.display());
            if extra.is_some() {
                // The data plane: the client falls back to SFTP.
                return session.channel_failure(id);
            }
            let pty = chan.pty.is_some();
            if let Some(chan) = self.channels.get_mut(&id) {
                chan.channel = None;
            }
            return refuse_without_shell(session, id, pty);
        }
        let spawned = process::spawn(SpawnRequest {
            account: &auth.account,
            command: command.as_deref(),
            env,
            pty: chan.pty.as_ref(),
            extra: extra.map(std::os::fd::AsRawFd::as_raw_fd),
            jail: jail.as_deref().map(|root| process::Jail {
                root,
                internal_sftp: internal_sftp.as_deref(),
            }),
            direct_sftp: direct_sftp.as_deref(),
            sftp_options: sftp_options.as_deref(),
            pam: pam.as_ref(),
        })
        .await;
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(peer = %self.peer, user = %auth.account.name, "cannot start session command: {e}");
                return session.channel_failure(id);
            }
        };
        tracing::info!(peer = %self.peer, user = %auth.account.name, pid = spawned.pid,
            "session started{}", if command.is_some() { " (exec)" } else { " (shell)" });
        let (login, greeting) = self.log_in(&auth.account, &spawned, command.is_some());
        let audit = self.session_audit(id, requested);
        let chan = self.channels.get_mut(&id).expect("checked above");
        let channel = chan.channel.take().expect("checked above");
        let queue = chan
            .queue
            .take()
            .unwrap_or_else(|| self.queue.channel(id.into()));
        let clock = chan
            .clock
            .take()
            .unwrap_or_else(|| self.clocks.channel(ChannelKind::Session, id));
        let pty = match &spawned.io {
            ChildIo::Pty(m) => Some(m.clone()),
            ChildIo::Pipes { .. } => None,
        };
        let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
        let session_handle = session.handle();
        session.channel_success(id)?;
        if !greeting.is_empty() {
            // Before anything the session's output sends.
            session.data(id, greeting)?;
        }
        // Counted until it is over, so that a connection's process hangs
        // its sessions up and cleans after them before it exits.
        let running = crate::backlog::SESSIONS.counted();
        let task = tokio::spawn(async move {
            let _running = running;
            run_session_io(
                channel,
                spawned,
                session_handle,
                control_rx,
                queue,
                clock,
                audit,
                login,
            )
            .await
        });
        chan.running = Some(Running { control, task, pty });
        Ok(())
    }

    /// A session with a terminal is a login, as sshd records one (utmp,
    /// wtmp, lastlog; the logout when the returned value is dropped), and
    /// a shell on it (no `command`) is shown what `PrintLastLog` and
    /// `PrintMotd` ask for first, unless the account has `~/.hushlogin`.
    fn log_in(
        &self,
        account: &Account,
        spawned: &process::Spawned,
        command: bool,
    ) -> (Option<crate::login_writer::LoggedIn>, Vec<u8>) {
        use crate::{login_records, login_writer};
        let Some(tty) = &spawned.tty else {
            return (None, Vec::new());
        };
        let settings = self.settings();
        let wanted = login_records::Greeting {
            last_login: settings.print_last_log,
            motd: settings.print_motd,
        };
        let interactive =
            login_records::greets(true, command, || login_writer::hushed(&account.home));
        let greets = (wanted.last_login || wanted.motd) && interactive;
        // What PAM's session modules said (pam_motd, pam_mail), shown to
        // the first interactive login of the connection, before skiffd's
        // own lines, as sshd shows them.
        let mut text: Vec<u8> = Vec::new();
        if let Some(pam) = self.pam_session.as_ref().filter(|_| interactive) {
            for m in pam.take_messages() {
                text.extend(login_records::on_terminal(format!("{m}\n").as_bytes()));
            }
        }
        // Read before this login replaces it.
        let last = (greets && wanted.last_login)
            .then(|| login_writer::last_login(account.uid))
            .flatten();
        let login = login_writer::record_login(
            login_records::Login {
                tty: tty.clone(),
                user: account.name.clone(),
                addr: (!self.peer_unknown).then(|| self.peer.ip()),
                pid: spawned.pid,
            },
            account.uid,
        );
        if !greets {
            return (Some(login), text);
        }
        let when = last
            .as_ref()
            .and_then(|l| login_writer::local_time(l.time).map(|t| login_records::ctime_text(&t)));
        let motd = wanted.motd.then(login_writer::motd).flatten();
        text.extend(login_records::greeting_text(
            wanted,
            last.as_ref().zip(when.as_deref()),
            motd.as_deref(),
        ));
        (Some(login), text)
    }

    /// What the audit log will say of the session starting on `id`
    /// (`requested`: what the client asked to run): its `subsystem` record
    /// now, and what its `session` record needs once it ends.
    fn session_audit(&self, id: ChannelId, requested: Option<String>) -> Option<SessionAudit> {
        if !self.log.auditing() {
            return None;
        }
        let auth = self.auth.as_ref()?;
        let chan = self.channels.get(&id)?;
        let user = auth.account.name.clone();
        let (kind, requested) = match &chan.subsystem {
            Some(name) => {
                self.log.record(crate::audit::Event::Subsystem {
                    user: user.clone(),
                    name: name.clone(),
                });
                (crate::audit::SessionKind::Subsystem, Some(name.clone()))
            }
            None if requested.is_some() => (crate::audit::SessionKind::Exec, requested),
            None => (crate::audit::SessionKind::Shell, None),
        };
        Some(SessionAudit {
            log: self.log.clone(),
            user,
            kind,
            requested,
            forced: auth.options.command.clone(),
            pty: chan.pty.is_some(),
            started: std::time::Instant::now(),
            bytes_in: chan.bytes_in.clone(),
        })
    }

    /// Starts the transfer process for the skiff data plane: skiffd's own
    /// `--transfer-server` run as the account (never inside the server),
    /// with a socket to skiffd as its fd 3 for tokens and streams. Refused
    /// (so the client falls back to SFTP) when the data plane is off, under
    /// a forced command (which must run instead, as for any subsystem), when
    /// `Subsystem sftp internal-sftp` has options that shape file access
    /// (`-R`, `-P`, `-u`...: SFTP honours them, the data plane could not),
    /// and on a channel with a pty.
    async fn start_transfer(
        &mut self,
        id: ChannelId,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let settings = self.settings();
        let forced = self
            .auth
            .as_ref()
            .is_some_and(|a| a.options.command.is_some());
        let has_pty = self.channels.get(&id).is_some_and(|c| c.pty.is_some());
        let command = match &settings.transfer_command {
            Some(c)
                if settings.data_plane
                    && !forced
                    && !has_pty
                    && !settings.sftp_options.shape_files()
                    && settings.chroot_directory.is_none() =>
            {
                c.clone()
            }
            _ => {
                tracing::info!(peer = %self.peer, "data plane refused (off, forced command, internal-sftp options, pty or ChrootDirectory)");
                return session.channel_failure(id);
            }
        };
        // The login's own settings: `Match` blocks may set `DataPlane` and
        // `DataPlaneUnencrypted`.
        let policy = crate::stream_relay::RelayPolicy::of(settings);
        let (ours, theirs) = match crate::seqpacket::pair() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(peer = %self.peer, "data plane: cannot make a socket pair: {e}");
                return session.channel_failure(id);
            }
        };
        tracing::debug!(peer = %self.peer, "subsystem {}: {command}", skiff_proto::dataplane::SUBSYSTEM);
        self.start(id, Some(command), session, Some(&theirs))
            .await?;
        drop(theirs);
        if self.channels.get(&id).is_some_and(|c| c.running.is_some()) {
            let registry = self.state.registry.clone();
            let log = self.log.clone();
            let user = self.auth.as_ref().map(|a| a.account.name.clone());
            let ended = move |end: crate::stream_relay::TransferEnd| {
                if log.auditing() {
                    log.record(crate::audit::Event::Transfer(
                        crate::audit::TransferRecord::ended(user.unwrap_or_default(), &end),
                    ));
                }
            };
            crate::stream_relay::spawn_relay(policy, registry, ours, self.peer, self.local, ended);
        }
        Ok(())
    }

    /// Opens a session channel for a logged-in client, within
    /// `MaxSessions`.
    pub(super) async fn open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
    ) -> Result<(), russh::Error> {
        if self.auth.is_none() {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        // russh does not report the client's answering close for channels we
        // closed first, so forget sessions whose command has finished here.
        self.channels
            .retain(|_, c| c.running.as_ref().is_none_or(|r| !r.task.is_finished()));
        if self.channels.len() >= self.settings().max_sessions {
            tracing::info!(peer = %self.peer, "refusing session: MaxSessions ({}) reached", self.settings().max_sessions);
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        }
        let queue = self.queue.channel(channel.id().into());
        let clock = self.clocks.channel(ChannelKind::Session, channel.id());
        self.channels.insert(
            channel.id(),
            SessionChannel {
                channel: Some(channel),
                env: Vec::new(),
                pty: None,
                agent: None,
                running: None,
                queue: Some(queue),
                clock: Some(clock),
                subsystem: None,
                bytes_in: Default::default(),
            },
        );
        reply.accept().await;
        Ok(())
    }

    /// A terminal for the session (`pty-req`), unless the key's options
    /// or `PermitTTY` forbid one.
    pub(super) fn pty_requested(
        &mut self,
        channel: ChannelId,
        spec: PtySpec,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let allowed = self.auth.as_ref().is_some_and(|a| !a.options.no_pty);
        match self.channels.get_mut(&channel) {
            Some(chan) if allowed && chan.running.is_none() => {
                chan.pty = Some(spec);
                session.channel_success(channel)
            }
            _ => {
                if !allowed {
                    tracing::info!(peer = %self.peer, "pty refused by authorized_keys option");
                }
                session.channel_failure(channel)
            }
        }
    }

    /// Agent forwarding for the session (`auth-agent-req`): a socket the
    /// session's `SSH_AUTH_SOCK` names.
    pub(super) fn agent_requested(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<bool, russh::Error> {
        let Some((auth, who)) = self.forwarder() else {
            return Ok(false);
        };
        if let Some(why) = self.settings().forwarding.agent_refusal(&auth.options) {
            tracing::info!("{who}: refusing agent forwarding: {why}");
            return Ok(false);
        }
        let (uid, gid) = (auth.account.uid, auth.account.gid);
        let Some(chan) = self.channels.get(&channel) else {
            return Ok(false);
        };
        if chan.running.is_some() {
            return Ok(false);
        }
        match self.forwards.agent_socket(session.handle(), uid, gid) {
            Ok(path) => {
                tracing::info!("{who}: agent forwarded at {}", path.display());
                if let Some(chan) = self.channels.get_mut(&channel) {
                    chan.agent = Some(path);
                }
                Ok(true)
            }
            Err(e) => {
                tracing::warn!("{who}: cannot make the forwarded agent's socket: {e}");
                Ok(false)
            }
        }
    }

    /// A variable the client sets (`env`), kept when `AcceptEnv` matches
    /// it and no rule forbids it.
    pub(super) fn env_requested(
        &mut self,
        channel: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let accepted = self
            .settings()
            .accept_env
            .iter()
            .any(|p| pattern::wildcard_match(p, name));
        let accepted = accepted && self.env_allowed(Source::Client, name);
        match self.channels.get_mut(&channel) {
            Some(chan) if accepted && chan.running.is_none() && valid_env_name(name) => {
                set_var(&mut chan.env, name, value.to_string());
                session.channel_success(channel)
            }
            _ => {
                tracing::debug!(peer = %self.peer, "ignoring environment variable {name:?}");
                session.channel_failure(channel)
            }
        }
    }

    /// Starts a subsystem: `sftp`, the skiff data plane, or one the
    /// configuration names (`Subsystem NAME COMMAND`).
    pub(super) async fn subsystem_requested(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        // Like sshd, a subsystem is a command run as the account (the SFTP
        // server never runs inside skiffd); a forced command replaces it and
        // sees it in SSH_ORIGINAL_COMMAND.
        if let Some(chan) = self.channels.get_mut(&channel) {
            chan.subsystem = Some(name.to_string());
        }
        match (name, &self.settings().sftp_command) {
            ("sftp", Some(command)) => {
                tracing::debug!(peer = %self.peer, "subsystem sftp: {command}");
                let command = command.clone();
                self.start(channel, Some(command), session, None).await
            }
            (skiff_proto::dataplane::SUBSYSTEM, _) => self.start_transfer(channel, session).await,
            _ => match self.settings().subsystem(name) {
                Some(command) => {
                    tracing::debug!(peer = %self.peer, "subsystem {name:?}: {command}");
                    let command = command.to_string();
                    self.start(channel, Some(command), session, None).await
                }
                None => {
                    tracing::info!(peer = %self.peer, "subsystem {name:?} is not available");
                    session.channel_failure(channel)
                }
            },
        }
    }

    /// The client's terminal changed size (`window-change`); `size` is
    /// (columns, rows, width and height in pixels), as the request gives it.
    pub(super) fn window_changed(&mut self, channel: ChannelId, size: (u32, u32, u32, u32)) {
        let (col_width, row_height, pix_width, pix_height) = size;
        if let Some(chan) = self.channels.get_mut(&channel) {
            if let Some(pty) = chan.running.as_ref().and_then(|r| r.pty.as_ref()) {
                let _ = pty.resize(col_width, row_height, pix_width, pix_height);
            } else if let Some(spec) = chan.pty.as_mut() {
                spec.cols = col_width;
                spec.rows = row_height;
            }
        }
    }

    /// A signal for the session's command, or a skiff client's flow
    /// control, passed to the task that owns the process.
    pub(super) fn signal_requested(
        &mut self,
        channel: ChannelId,
        signal: Sig,
    ) -> Result<(), russh::Error> {
        let running = self.channels.get(&channel).and_then(|c| c.running.as_ref());
        let Some(r) = running else {
            return Ok(());
        };
        let control = match &signal {
            Sig::Custom(name) if name == skiff_proto::flow::PAUSE_OUTPUT => {
                Control::PauseOutput(true)
            }
            Sig::Custom(name) if name == skiff_proto::flow::RESUME_OUTPUT => {
                Control::PauseOutput(false)
            }
            Sig::Custom(name) if name == skiff_proto::flow::INPUT_ACKS => Control::InputAcks,
            other => match process::sig_to_number(other) {
                Some(num) => Control::Signal(num),
                None => return Ok(()),
            },
        };
        let _ = r.control.send(control);
        Ok(())
    }
}

/// Answers a session whose account's shell runs nothing as that shell
/// would: the request succeeds, nologin's words go to standard error, and
/// the session ends with status 1.
fn refuse_without_shell(
    session: &mut Session,
    id: ChannelId,
    pty: bool,
) -> Result<(), russh::Error> {
    let end = if pty { "\r\n" } else { "\n" };
    let notice = format!("{}{end}", crate::account_policy::NO_SHELL_NOTICE);
    session.channel_success(id)?;
    session.extended_data(id, 1, notice.into_bytes())?;
    session.exit_status_request(id, 1)?;
    session.eof(id)?;
    session.close(id)
}

fn set_var(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value));
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}
