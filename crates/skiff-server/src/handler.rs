//! The per-connection SSH handler: public-key authentication against the
//! account's authorized_keys (options enforced), then session channels
//! (`exec`, `shell`, `subsystem` sftp, `pty-req`, `env`, `signal`,
//! `window-change`) and TCP forwarding (see [`crate::forwarding`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use russh::keys::ssh_key::certificate::CertType;
use russh::keys::{Certificate, PublicKey};
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, ChannelOpenFailure, Pty, Sig};
use skiff_proto::authorized_keys::{
    self, AuthorizedKey, AuthorizedPrincipal, KeyOptions, RevokedKeys,
};
use skiff_proto::pattern;
use skiff_proto::user_cert;
use tokio::io::AsyncWriteExt;

use crate::account::{self, Account};
use crate::config::Settings;
use crate::process::{self, ChildIo, PtySpec, SpawnRequest};
use crate::session_env::Source;

/// State shared by every connection of one server.
pub struct ServerState {
    pub settings: Settings,
    /// `AuthorizedKeysCommand`, checked at start.
    pub keys_command: Option<crate::lookup_command::LookupCommand>,
    /// `AuthorizedPrincipalsCommand`, checked at start.
    pub principals_command: Option<crate::lookup_command::LookupCommand>,
    /// Outstanding data-plane stream tokens.
    pub registry: crate::dataplane::Registry,
    /// What all connections hold for their peers (`MaxServerQueue`).
    pub queues: Arc<crate::queue_budget::ServerQueue>,
}

/// The outcome of a successful authentication.
struct Authenticated {
    account: Account,
    options: KeyOptions,
    /// How it authenticated, as `ExposeAuthInfo` writes it
    /// (`publickey KEYTYPE BASE64`).
    credential: String,
    /// `ForceCommand internal-sftp` is in force: skiffd's SFTP server runs
    /// directly, not through the account's shell.
    forced_internal_sftp: bool,
}

/// A session channel before and after its command starts.
struct SessionChannel {
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
}

struct Running {
    /// Signals and hang-ups go to the task that owns (and reaps) the process,
    /// so a pid is never signalled after it was reaped and possibly reused.
    /// Dropping the sender hangs the session up.
    control: tokio::sync::mpsc::UnboundedSender<Control>,
    task: tokio::task::JoinHandle<()>,
    pty: Option<Arc<process::PtyMaster>>,
}

/// What the connection asks of a running session's process.
enum Control {
    Signal(i32),
    /// Stop (`true`) or resume reading the command's output, as a skiff
    /// client asks while its local reader is behind.
    PauseOutput(bool),
    /// Report to the client how much input the command has read
    /// ([`skiff_proto::flow::INPUT_ACKS`]).
    InputAcks,
}

/// A usable account and the keys its authorized_keys file admits.
type UserKeys = (Account, Vec<AuthorizedKey>);

/// One client connection.
pub struct ConnectionHandler {
    state: Arc<ServerState>,
    peer: SocketAddr,
    local: SocketAddr,
    /// Set once authentication succeeds; read by the login-grace timer.
    authenticated_flag: tokio::sync::watch::Sender<bool>,
    /// authorized_keys of the user being authenticated (cached across offers).
    candidate: Option<(String, Option<UserKeys>)>,
    /// The last `AuthorizedKeysCommand` answer: user, key blob, entries.
    command_answer: Option<(String, Vec<u8>, Vec<AuthorizedKey>)>,
    auth: Option<Authenticated>,
    channels: HashMap<ChannelId, SessionChannel>,
    /// A second handle on the socket, for the kernel's RTT estimate.
    socket: Option<std::os::fd::OwnedFd>,
    windows: skiff_proto::window::WindowGrowth,
    /// The window the path wants (before the queue's limits shrink it).
    desired_window: u32,
    /// What this connection holds for its peer (`MaxConnectionQueue`).
    queue: Arc<crate::queue_budget::ConnectionQueue>,
    /// When a public-key probe was answered "acceptable" (`PK_OK`).
    probe_answered: Option<std::time::Instant>,
    /// The SSH-level round trip: from that answer to the signed request.
    /// Unlike the kernel's RTT it spans any proxy that terminates TCP in
    /// between (a jump host, say); it also holds the client's signing time,
    /// which only makes windows grow sooner.
    session_rtt: Option<std::time::Duration>,
    /// TCP forwardings (`direct-tcpip` relays, `tcpip-forward` listeners).
    forwards: crate::forwarding::Forwards,
    /// The `ExposeAuthInfo` file, made at the first session.
    auth_info: Option<crate::auth_info::AuthInfoFile>,
    /// The account name whose login settings are in force, and those
    /// settings when `Match` blocks change them (see [`Self::settings`]).
    effective: Option<(String, Option<Arc<Settings>>)>,
    /// The notice of `/etc/nologin` for a login it refuses: sent as the
    /// reason for disconnecting once the client has proved its key.
    nologin_refusal: Option<String>,
}

impl ConnectionHandler {
    pub fn new(
        state: Arc<ServerState>,
        peer: SocketAddr,
        local: SocketAddr,
        authenticated_flag: tokio::sync::watch::Sender<bool>,
    ) -> Self {
        let queue = crate::queue_budget::ConnectionQueue::new(state.queues.clone());
        ConnectionHandler {
            peer,
            local,
            authenticated_flag,
            candidate: None,
            command_answer: None,
            auth: None,
            channels: HashMap::new(),
            socket: None,
            windows: skiff_proto::window::WindowGrowth::new(state.settings.max_channel_window),
            desired_window: skiff_proto::window::INITIAL_WINDOW,
            probe_answered: None,
            session_rtt: None,
            forwards: crate::forwarding::Forwards::new(queue.clone()),
            queue,
            auth_info: None,
            effective: None,
            nologin_refusal: None,
            state,
        }
    }

    /// Lets channel windows grow with the connection's round-trip time.
    pub fn with_socket(mut self, socket: std::os::fd::OwnedFd) -> Self {
        self.socket = Some(socket);
        self
    }

    /// The account `user` names, if it may log in at all from this peer
    /// (see [`account::lookup`] and [`crate::access`]).
    fn admissible_account(&mut self, user: &str) -> Result<Account, String> {
        let acct = account::lookup(user).map_err(|r| r.to_string())?;
        self.enter_login_settings(&acct);
        let access = &self.settings().access;
        let groups = if access.allow_groups.is_empty() && access.deny_groups.is_empty() {
            Vec::new()
        } else {
            group_names(&acct)
        };
        match access.refusal(user, acct.uid, &groups, self.peer.ip()) {
            Some(why) => Err(why),
            None => Ok(acct),
        }
    }

    /// Puts the settings of a login as `acct` in force, working them out
    /// once per account name.
    fn enter_login_settings(&mut self, acct: &Account) {
        if self
            .effective
            .as_ref()
            .is_some_and(|(name, _)| *name == acct.name)
        {
            return;
        }
        self.effective = Some((acct.name.clone(), self.login_settings(acct)));
    }

    /// The settings that apply to a login as `acct`: the server's, with
    /// its matching `Match` blocks on top (`None`: the server's as they are).
    fn login_settings(&self, acct: &Account) -> Option<Arc<Settings>> {
        let global = &self.state.settings;
        if global.matches.is_empty() {
            return None;
        }
        let groups = group_names(acct);
        let ctx = crate::match_block::MatchContext {
            user: &acct.name,
            groups: &groups,
            peer: self.peer.ip(),
            local: self.local.ip(),
            local_port: self.local.port(),
        };
        global.for_login(&ctx).map(Arc::new)
    }

    /// The settings in force: those of the login being authenticated (or
    /// done), else the server's.
    fn settings(&self) -> &Settings {
        self.effective
            .as_ref()
            .and_then(|(_, s)| s.as_deref())
            .unwrap_or(&self.state.settings)
    }

    /// Why `user` may not sign in with a key whose signature algorithm is
    /// one of `names`: none of them is in the login's
    /// `PubkeyAcceptedAlgorithms` (which never holds RSA with SHA-1).
    fn algorithm_refusal(&mut self, user: &str, names: &[&str]) -> Option<String> {
        // The account's Match blocks may narrow the list: prepare_candidate
        // has put its settings in force.
        debug_assert!(self.candidate.as_ref().is_some_and(|(u, _)| u == user));
        let accepted = &self.settings().pubkey_algorithms;
        if names.iter().any(|n| accepted.iter().any(|a| a == n)) {
            None
        } else {
            Some(format!(
                "{} is not among PubkeyAcceptedAlgorithms",
                names.join(" or ")
            ))
        }
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

    /// Why Unix-socket forwarding is refused: `rules`' reason, or a jailed
    /// login's (its sockets would be outside the jail).
    fn socket_refusal(&self, rules: Option<String>) -> Option<String> {
        if self.settings().chroot_directory.is_some() {
            return Some("the login is jailed (ChrootDirectory)".into());
        }
        rules
    }

    /// The login asking for a forwarding, and how logs name it ("user from
    /// peer"); `None` before authentication.
    fn forwarder(&self) -> Option<(&Authenticated, String)> {
        let auth = self.auth.as_ref()?;
        Some((auth, format!("{} from {}", auth.account.name, self.peer)))
    }

    /// Loads (once per user name) the account and its authorized keys,
    /// the files read off the async workers ([`crate::account_files`]).
    /// Every authentication request starts here.
    async fn prepare_candidate(&mut self, user: &str) {
        if self.candidate.as_ref().map(|(u, _)| u.as_str()) == Some(user) {
            return;
        }
        let loaded = match self.admissible_account(user) {
            Ok(acct) => {
                // Every file `AuthorizedKeysFile` names, in order; `none`
                // names none.
                let templates = self.settings().authorized_keys.clone();
                let strict_modes = self.state.settings.strict_modes;
                let mut keys = Vec::new();
                for t in templates.split_whitespace().filter(|t| *t != "none") {
                    let path = authorized_keys_path(t, &acct);
                    let parse = authorized_keys::parse;
                    keys.extend(crate::account_files::load(path, &acct, strict_modes, parse).await);
                }
                Some((acct, keys))
            }
            Err(why) => {
                tracing::info!(peer = %self.peer, user, "refusing login: {why}");
                None
            }
        };
        self.candidate = Some((user.to_string(), loaded));
    }

    /// The account `user` names and its authorized keys, as
    /// [`Self::prepare_candidate`] loaded them; `None` when the account may
    /// not log in (or was not prepared).
    fn load_candidate(&self, user: &str) -> Option<&UserKeys> {
        self.candidate
            .as_ref()
            .filter(|(u, _)| u == user)
            .and_then(|(_, c)| c.as_ref())
    }

    /// The entries `AuthorizedKeysCommand` prints for `user` and `key`
    /// (none without the command, or when the account's file already lists
    /// the key). Run once per user and key on a connection: the probe and
    /// the signed request share the answer.
    async fn command_keys(&mut self, user: &str, key: &PublicKey) -> Vec<AuthorizedKey> {
        let Some(command) = self.state.keys_command.clone() else {
            return Vec::new();
        };
        let Ok(blob) = key.to_bytes() else {
            return Vec::new();
        };
        if let Some((u, b, keys)) = &self.command_answer {
            if u == user && *b == blob {
                return keys.clone();
            }
        }
        let key_type = key.algorithm().as_str().to_string();
        let Some((acct, file_keys)) = self.load_candidate(user) else {
            return Vec::new();
        };
        if authorized_keys::find(file_keys, &key_type, &blob).is_some() {
            return Vec::new();
        }
        let acct = acct.clone();
        let openssh = key.to_openssh().unwrap_or_default();
        let base64 = openssh.split_whitespace().nth(1).unwrap_or_default();
        let fingerprint = key.fingerprint(russh::keys::HashAlg::Sha256).to_string();
        let home = acct.home.to_string_lossy().into_owned();
        let tokens = crate::lookup_command::Tokens {
            user: &acct.name,
            home: &home,
            uid: acct.uid,
            key_type: &key_type,
            key_base64: base64,
            fingerprint: &fingerprint,
            certificate: None,
        };
        let keys = command.keys(&acct, &tokens).await;
        self.command_answer = Some((user.to_string(), blob, keys.clone()));
        keys
    }

    /// The principals `AuthorizedPrincipalsCommand` prints for `user` and
    /// `certificate`; `None` without the command or the account.
    async fn command_principals(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Option<Vec<AuthorizedPrincipal>> {
        let command = self.state.principals_command.clone()?;
        let acct = self.load_candidate(user)?.0.clone();
        let openssh = certificate.to_openssh().unwrap_or_default();
        let mut fields = openssh.split_whitespace();
        let (cert_type, cert_base64) = (
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
        );
        let key = PublicKey::from(certificate.public_key().clone());
        let ca = PublicKey::from(certificate.signature_key().clone());
        let ca_openssh = ca.to_openssh().unwrap_or_default();
        let ca_base64 = ca_openssh.split_whitespace().nth(1).unwrap_or_default();
        let sha256 = russh::keys::HashAlg::Sha256;
        let (fingerprint, ca_fingerprint) = (
            key.fingerprint(sha256).to_string(),
            ca.fingerprint(sha256).to_string(),
        );
        let home = acct.home.to_string_lossy().into_owned();
        let ca_type = ca.algorithm();
        let tokens = crate::lookup_command::Tokens {
            user: &acct.name,
            home: &home,
            uid: acct.uid,
            key_type: cert_type,
            key_base64: cert_base64,
            fingerprint: &fingerprint,
            certificate: Some(crate::lookup_command::CertificateTokens {
                key_id: certificate.key_id(),
                serial: certificate.serial(),
                ca_type: ca_type.as_str(),
                ca_base64,
                ca_fingerprint: &ca_fingerprint,
            }),
        };
        Some(command.principals(&acct, &tokens).await)
    }

    /// The authorized_keys entry (from the account's file, else from
    /// `command_keys`) that admits `key` from this peer now, if any.
    async fn admitting_entry(
        &mut self,
        user: &str,
        key: &PublicKey,
        command_keys: &[AuthorizedKey],
    ) -> Option<(Account, KeyOptions)> {
        let blob = key.to_bytes().ok()?;
        // The account first: its settings (Match blocks) say which
        // RevokedKeys applies.
        self.load_candidate(user)?;
        if let Some(why) = self.rsa_too_small(&blob) {
            tracing::info!(peer = %self.peer, user, "key refused: {why}");
            return None;
        }
        let revoked_keys = self.settings().revoked_keys.clone();
        if let Some(why) = revoked(revoked_keys, |list| list.revokes_key(&blob)).await {
            tracing::info!(peer = %self.peer, user, "key refused: {why}");
            return None;
        }
        let key_type = key.algorithm().as_str().to_string();
        let peer_ip = self.peer.ip();
        let peer = self.peer;
        let (acct, keys) = self.load_candidate(user)?;
        let entry = authorized_keys::find(keys, &key_type, &blob)
            .or_else(|| authorized_keys::find(command_keys, &key_type, &blob))?;
        let opts = &entry.options;
        if let Some(from) = &opts.from {
            if !authorized_keys::from_allows(from, peer_ip, None) {
                tracing::info!(%peer, user, line = entry.line, "key refused: from= does not allow {peer_ip}");
                return None;
            }
        }
        if authorized_keys::is_expired(opts, unix_now(), local_utc_offset()) {
            tracing::info!(%peer, user, line = entry.line, "key refused: expiry-time has passed");
            return None;
        }
        Some((acct.clone(), opts.clone()))
    }

    /// Records a successful login (a key or a certificate) as `account`,
    /// whose sessions run under `options`.
    fn logged_in(&mut self, account: Account, mut options: KeyOptions, credential: String) -> Auth {
        self.enter_login_settings(&account);
        if account.uid == 0
            && self.settings().access.root_login == crate::access::RootLogin::ForcedCommandsOnly
            && options.command.is_none()
        {
            tracing::info!(peer = %self.peer, user = %account.name,
                "refusing login: PermitRootLogin forced-commands-only, and the key forces no command");
            return publickey_only();
        }
        if crate::account_policy::nologin_applies(account.uid) {
            let path = std::path::Path::new(crate::account_policy::NOLOGIN_FILE);
            if let Some(notice) = crate::account_policy::read_nologin(path) {
                tracing::info!(peer = %self.peer, user = %account.name,
                    "refusing login: {} exists (only root may log in)", path.display());
                // russh can send a reason only once the login is accepted:
                // auth_succeeded disconnects at once, before any channel.
                self.nologin_refusal = Some(notice);
                self.candidate = None;
                return Auth::Accept;
            }
        }
        // The server's ForceCommand wins over the key's command=, and
        // PermitTTY no over its pty permission, as in sshd.
        let settings = self.settings();
        let forced_internal_sftp = settings.force_command.as_deref() == Some("internal-sftp");
        if let Some(forced) = &settings.force_command {
            options.command = Some(match (forced.as_str(), &settings.sftp_command) {
                ("internal-sftp", Some(sftp)) => sftp.clone(),
                _ => forced.clone(),
            });
        }
        options.no_pty |= !settings.permit_tty;
        self.auth = Some(Authenticated {
            account,
            options,
            credential,
            forced_internal_sftp,
        });
        self.candidate = None;
        self.session_rtt = self.probe_answered.take().map(|t| t.elapsed());
        self.authenticated_flag.send_replace(true);
        Auth::Accept
    }

    /// Why an RSA key is too small under `RequiredRSASize`.
    fn rsa_too_small(&self, blob: &[u8]) -> Option<String> {
        let bits = skiff_proto::known_hosts::rsa_modulus_bits(blob)?;
        let required = self.settings().required_rsa_size;
        (bits < required)
            .then(|| format!("RSA key of {bits} bits, fewer than RequiredRSASize ({required})"))
    }

    /// Whether some CA may sign certificates for `user`: `TrustedUserCAKeys`
    /// (then for every user name, existing or not, so that the answer to a
    /// probe says nothing about which accounts exist), or a `cert-authority`
    /// line in the account's authorized_keys.
    fn trusts_a_user_ca(&mut self, user: &str) -> bool {
        if self.state.settings.trusted_user_ca_keys.is_some() {
            return true;
        }
        let own_ca = self
            .load_candidate(user)
            .is_some_and(|(_, keys)| keys.iter().any(|k| k.options.cert_authority));
        // A Match block may trust a CA for this login only.
        own_ca || (self.candidate_loaded(user) && self.settings().trusted_user_ca_keys.is_some())
    }

    /// Whether `user`'s account was found usable (and [`Self::settings`]
    /// are its settings).
    fn candidate_loaded(&self, user: &str) -> bool {
        self.candidate
            .as_ref()
            .is_some_and(|(u, c)| u == user && c.is_some())
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
            (
                "SSH_CONNECTION",
                format!(
                    "{} {} {} {}",
                    self.peer.ip(),
                    self.peer.port(),
                    self.local.ip(),
                    self.local.port()
                ),
            ),
            (
                "SSH_CLIENT",
                format!(
                    "{} {} {}",
                    self.peer.ip(),
                    self.peer.port(),
                    self.local.port()
                ),
            ),
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
        tracing::warn!(peer = %self.peer, user = %user, "{line}");
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

    /// Starts the command (or shell) for a channel and wires its I/O.
    fn start(
        &mut self,
        id: ChannelId,
        requested: Option<String>,
        session: &mut Session,
        extra: Option<&std::os::fd::OwnedFd>,
    ) -> Result<(), russh::Error> {
        self.expose_auth_info();
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
        // The configured SFTP server, when it is skiffd's own: in a jail it
        // starts as root outside and enters the jail itself.
        let settings = self.settings();
        let internal_sftp = match (&command, &settings.sftp_command) {
            (Some(c), Some(sftp)) if jail.is_some() && c == sftp => {
                crate::sftp::internal_server_exe(c).filter(|exe| {
                    crate::lookup_command::check_program(exe)
                        .inspect_err(|why| {
                            tracing::warn!("the SFTP server cannot serve a jail: {why}")
                        })
                        .is_ok()
                })
            }
            _ => None,
        };
        // ForceCommand internal-sftp outside a jail: skiffd's own SFTP
        // server, started without the account's shell, as sshd's is.
        let direct_sftp = match (&command, &settings.sftp_command) {
            (Some(c), Some(sftp)) if jail.is_none() && auth.forced_internal_sftp && c == sftp => {
                crate::sftp::internal_server_exe(c)
            }
            _ => None,
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
        });
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(peer = %self.peer, user = %auth.account.name, "cannot start session command: {e}");
                return session.channel_failure(id);
            }
        };
        tracing::info!(peer = %self.peer, user = %auth.account.name, pid = spawned.pid,
            "session started{}", if command.is_some() { " (exec)" } else { " (shell)" });
        let chan = self.channels.get_mut(&id).expect("checked above");
        let channel = chan.channel.take().expect("checked above");
        let queue = chan
            .queue
            .take()
            .unwrap_or_else(|| self.queue.channel(id.into()));
        let pty = match &spawned.io {
            ChildIo::Pty(m) => Some(m.clone()),
            ChildIo::Pipes { .. } => None,
        };
        let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
        session.channel_success(id)?;
        let task = tokio::spawn(run_session_io(
            channel,
            spawned,
            session.handle(),
            control_rx,
            queue,
        ));
        chan.running = Some(Running { control, task, pty });
        Ok(())
    }

    /// Starts the transfer process for the skiff data plane: skiffd's own
    /// `--transfer-server` run as the account (never inside the server),
    /// with a socket to skiffd as its fd 3 for tokens and streams. Refused
    /// (so the client falls back to SFTP) when the data plane is off, under
    /// a forced command (which must run instead, as for any subsystem), and
    /// on a channel with a pty.
    fn start_transfer(&mut self, id: ChannelId, session: &mut Session) -> Result<(), russh::Error> {
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
                    && settings.chroot_directory.is_none() =>
            {
                c.clone()
            }
            _ => {
                tracing::info!(peer = %self.peer, "data plane refused (off, forced command, pty or ChrootDirectory)");
                return session.channel_failure(id);
            }
        };
        let (ours, theirs) = match crate::dataplane::relay_pair() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(peer = %self.peer, "data plane: cannot make a socket pair: {e}");
                return session.channel_failure(id);
            }
        };
        tracing::debug!(peer = %self.peer, "subsystem {}: {command}", skiff_proto::dataplane::SUBSYSTEM);
        self.start(id, Some(command), session, Some(&theirs))?;
        drop(theirs);
        if self.channels.get(&id).is_some_and(|c| c.running.is_some()) {
            crate::dataplane::spawn_relay(self.state.clone(), ours, self.peer, self.local);
        }
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

impl ConnectionHandler {
    /// Counts a packet of `len` bytes that arrived on `channel` in the
    /// connection's queue, then holds off reading the next one while the
    /// queue is (nearly) full (see [`crate::queue_budget`]). A packet that
    /// breaks the protocol, or a client that went away meanwhile, ends the
    /// connection.
    async fn received(
        &mut self,
        channel: ChannelId,
        len: usize,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        use crate::queue_budget::Reading;
        let window = u32::try_from(session.sender_window_size(channel)).unwrap_or(u32::MAX);
        let initial = session.config().window_size;
        match self.queue.receive(channel.into(), len, window, initial) {
            Ok(Reading::Go) => Ok(()),
            Ok(reading) => {
                if reading == Reading::Stop {
                    tracing::debug!(peer = %self.peer, held = self.queue.held(),
                        "queue full: not reading the connection until its commands read their input");
                }
                let socket = &self.socket;
                let gone = || {
                    crate::peer_hangup::hung_up(socket.as_ref().and_then(|s| s.try_clone().ok()))
                };
                if self.queue.hold_off(gone).await {
                    Ok(())
                } else {
                    tracing::info!(peer = %self.peer,
                        "the client went away while its connection waited for its commands to read their input");
                    Err(russh::Error::HUP)
                }
            }
            Err(violation) => {
                tracing::warn!(peer = %self.peer, "closing the connection: {violation}");
                Err(russh::Error::Inconsistent)
            }
        }
    }
}

fn set_var(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value));
}

/// Moves bytes between the channel and the process until both ends are done,
/// then reports the exit status (or signal) and closes the channel.
async fn run_session_io(
    channel: Channel<Msg>,
    spawned: process::Spawned,
    handle: russh::server::Handle,
    mut control: tokio::sync::mpsc::UnboundedReceiver<Control>,
    queue: Arc<crate::queue_budget::ChannelQueue>,
) {
    use crate::channel_io::{forward_output, spawn_input};
    let id = channel.id();
    let (reader, writer) = channel.split();
    let mut child = spawned.child;
    let terminal = match &spawned.io {
        ChildIo::Pty(master) => Some(master.clone()),
        ChildIo::Pipes { .. } => None,
    };
    let pty = terminal.is_some();
    let (pause, paused) = tokio::sync::watch::channel(false);
    let (consumed, consumed_rx) = tokio::sync::watch::channel(0u64);
    let consumed = Arc::new(consumed);
    let mut flow = SessionFlow {
        pause,
        reports: Some((handle.clone(), id, consumed_rx)),
        reporter: None,
    };
    let (input, output): (
        _,
        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) = match spawned.io {
        ChildIo::Pipes {
            stdin,
            mut stdout,
            mut stderr,
        } => {
            let reports = Some(consumed.clone());
            let input = spawn_input(reader, queue.clone(), reports, move |mut rx| async move {
                let mut stdin = stdin;
                // Dropping the pipe is what delivers EOF to the command.
                while let Some((data, permit)) = rx.recv().await {
                    if stdin.write_all(&data).await.is_err() {
                        break;
                    }
                    drop(permit);
                }
            });
            let mut out_writer = writer.make_writer();
            let mut err_writer = writer.make_writer_ext(Some(1));
            let output = async move {
                tokio::join!(
                    forward_output(&mut stdout, &mut out_writer, Some(paused.clone()), &queue),
                    forward_output(&mut stderr, &mut err_writer, Some(paused), &queue),
                );
            };
            (input, Box::pin(output))
        }
        ChildIo::Pty(mut master) => {
            let input_master = master.clone();
            let reports = Some(consumed.clone());
            let input = spawn_input(reader, queue.clone(), reports, move |mut rx| async move {
                while let Some((data, permit)) = rx.recv().await {
                    if input_master.write_all(&data).await.is_err() {
                        break;
                    }
                    drop(permit);
                }
            });
            let mut out_writer = writer.make_writer();
            let output = async move {
                forward_output(&mut master, &mut out_writer, Some(paused), &queue).await;
            };
            (input, Box::pin(output))
        }
    };
    let status = supervise(&mut child, output, &mut control, &mut flow, pty).await;
    // The session is over: its terminal goes back to whoever had it, as
    // with sshd, before the client hears the exit status.
    if let Some(terminal) = terminal {
        terminal.give_back();
    }
    drop(flow);
    finish(&writer, &handle, id, status).await;
    input.abort();
}

/// What a skiff client's flow control asks of a session
/// ([`skiff_proto::flow`]).
struct SessionFlow {
    /// Output reading is paused while this is `true`.
    pause: tokio::sync::watch::Sender<bool>,
    /// What input reports need (the connection, the channel and the count
    /// of input read), until the client asks for them.
    reports: Option<(
        russh::server::Handle,
        ChannelId,
        tokio::sync::watch::Receiver<u64>,
    )>,
    /// The task sending them, once asked.
    reporter: Option<tokio::task::JoinHandle<()>>,
}

impl SessionFlow {
    /// Starts the input reports, the first time they are asked for.
    fn start_reports(&mut self) {
        if let Some((handle, id, consumed)) = self.reports.take() {
            self.reporter = Some(tokio::spawn(send_input_reports(handle, id, consumed)));
        }
    }
}

impl Drop for SessionFlow {
    fn drop(&mut self) {
        if let Some(reporter) = self.reporter.take() {
            reporter.abort();
        }
    }
}

/// Tells the client how many input bytes the command has read
/// (`consumed`): at once, then after every
/// [`skiff_proto::flow::INPUT_ACK_STEP`] bytes.
async fn send_input_reports(
    handle: russh::server::Handle,
    id: ChannelId,
    mut consumed: tokio::sync::watch::Receiver<u64>,
) {
    use skiff_proto::flow;
    let mut reported: Option<u64> = None;
    loop {
        let total = *consumed.borrow_and_update();
        if reported.is_none_or(|r| total.saturating_sub(r) >= flow::INPUT_ACK_STEP) {
            let report = bytes::Bytes::copy_from_slice(&flow::encode_consumed(total));
            if handle
                .extended_data(id, flow::INPUT_CONSUMED, report)
                .await
                .is_err()
            {
                return;
            }
            reported = Some(total);
        }
        if consumed.changed().await.is_err() {
            return;
        }
    }
}

/// Waits for the output to end and the process to exit, delivering signals
/// meanwhile. When the connection lets go of the session (channel closed or
/// connection gone) while the process runs, its process group gets SIGHUP.
async fn supervise(
    child: &mut crate::spawn::ChildProcess,
    output: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    control: &mut tokio::sync::mpsc::UnboundedReceiver<Control>,
    flow: &mut SessionFlow,
    pty: bool,
) -> std::io::Result<std::process::ExitStatus> {
    let mut output = output;
    let mut output_done = false;
    let mut status = None;
    let mut connected = true;
    // A terminal reads EOF only when its last holder closes it; a background
    // job may keep it open, so after the shell exits allow a short drain.
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        if output_done {
            if let Some(st) = status.take() {
                return st;
            }
        }
        tokio::select! {
            _ = &mut output, if !output_done => output_done = true,
            st = child.wait(), if status.is_none() => {
                if pty {
                    drain_until = Some(tokio::time::Instant::now() + std::time::Duration::from_millis(200));
                }
                status = Some(st);
            }
            _ = async { tokio::time::sleep_until(drain_until.expect("guarded")).await }, if drain_until.is_some() && !output_done => {
                output_done = true;
            }
            msg = control.recv(), if connected => {
                // Signals reach only our own, not yet reaped, child (or the
                // process group it leads): a reused pid is never signalled.
                match msg {
                    Some(Control::Signal(sig)) => child.signal(sig, false),
                    Some(Control::PauseOutput(on)) => {
                        flow.pause.send_replace(on);
                    }
                    Some(Control::InputAcks) => flow.start_reports(),
                    None => {
                        // Nobody is left to resume a paused output.
                        flow.pause.send_replace(false);
                        connected = false;
                        child.signal(libc::SIGHUP, true);
                    }
                }
            }
        }
    }
}

async fn finish(
    writer: &russh::ChannelWriteHalf<Msg>,
    handle: &russh::server::Handle,
    id: ChannelId,
    status: std::io::Result<std::process::ExitStatus>,
) {
    use std::os::unix::process::ExitStatusExt;
    let _ = writer.eof().await;
    match status {
        Ok(st) => {
            if let Some(code) = st.code() {
                let _ = writer.exit_status(code as u32).await;
            } else if let Some(sig) = st.signal() {
                let _ = handle
                    .exit_signal_request(
                        id,
                        process::number_to_sig(sig),
                        st.core_dumped(),
                        String::new(),
                        String::new(),
                    )
                    .await;
            }
        }
        Err(e) => {
            tracing::warn!("waiting for session process failed: {e}");
            let _ = writer.exit_status(255).await;
        }
    }
    let _ = writer.close().await;
}

impl russh::server::Handler for ConnectionHandler {
    type Error = russh::Error;

    async fn authentication_banner(&mut self) -> Result<Option<String>, Self::Error> {
        let Some(path) = &self.state.settings.banner else {
            return Ok(None);
        };
        // At most 64 KiB, as text: a banner is a notice, not a transfer.
        match std::fs::read(path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64 * 1024)]);
                Ok(Some(text.into_owned()))
            }
            Err(e) => {
                tracing::warn!("cannot read Banner {}: {e}", path.display());
                Ok(None)
            }
        }
    }

    async fn auth_succeeded(&mut self, session: &mut Session) -> Result<(), Self::Error> {
        // A login `/etc/nologin` refuses: its notice is the reason given,
        // as sshd gives PAM's, and no channel is ever served (no account is
        // set). ssh shows it as "Received disconnect from ...: NOTICE".
        if let Some(notice) = self.nologin_refusal.take() {
            session.disconnect(russh::Disconnect::NoMoreAuthMethodsAvailable, &notice, "en")?;
        }
        Ok(())
    }

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(publickey_only())
    }

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        self.prepare_candidate(user).await;
        if let Some(why) = self.algorithm_refusal(user, &[offer.algorithm.as_str()]) {
            tracing::info!(peer = %self.peer, user, "refusing the key: {why}");
            return Ok(publickey_only());
        }
        let command_keys = self.command_keys(user, offer.public_key).await;
        let admitted = self
            .admitting_entry(user, offer.public_key, &command_keys)
            .await
            .is_some()
            // russh does not say whether a probe is for a certificate, so
            // where a CA is trusted every key may go on to sign: the signed
            // request is judged in full (auth_publickey or
            // auth_openssh_certificate).
            || self.trusts_a_user_ca(user);
        Ok(if admitted {
            self.probe_answered = Some(std::time::Instant::now());
            Auth::Accept
        } else {
            publickey_only()
        })
    }

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        // russh has checked the CA's signature over the certificate, its
        // validity period and the client's signature with its key.
        let peer = self.peer;
        // The account first: its settings (Match blocks) say which CAs,
        // principals and revocations apply.
        self.prepare_candidate(user).await;
        if self.load_candidate(user).is_none() {
            return Ok(publickey_only());
        }
        let cert_algorithms = certificate_algorithms(certificate.algorithm());
        let names: Vec<&str> = cert_algorithms.iter().map(String::as_str).collect();
        if let Some(why) = self.algorithm_refusal(user, &names) {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(publickey_only());
        }
        let Ok(ca_blob) =
            russh::keys::PublicKey::from(certificate.signature_key().clone()).to_bytes()
        else {
            return Ok(publickey_only());
        };
        let Ok(key_blob) = PublicKey::from(certificate.public_key().clone()).to_bytes() else {
            return Ok(publickey_only());
        };
        let cert = skiff_proto::krl::CertificateRef {
            ca_key: &ca_blob,
            serial: certificate.serial(),
            key_id: certificate.key_id(),
        };
        if let Some(why) = self.rsa_too_small(&key_blob) {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(publickey_only());
        }
        let revoked_keys = self.settings().revoked_keys.clone();
        if let Some(why) = revoked(revoked_keys, |list| {
            list.revokes_certificate(&key_blob, &cert)
        })
        .await
        {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(publickey_only());
        }
        let command_principals = self.command_principals(user, certificate).await;
        let trusted = trusted_user_cas(self.settings().trusted_user_ca_keys.clone()).await;
        let principals_template = self.settings().authorized_principals_file.clone();
        let ca_signatures = self.settings().ca_signature_algorithms.clone();
        let strict_modes = self.state.settings.strict_modes;
        let principals_file = match (principals_template, self.load_candidate(user)) {
            (Some(template), Some((account, _))) => {
                let path = authorized_keys_path(&template, account);
                let account = account.clone();
                let parse = authorized_keys::parse_principals;
                Some(crate::account_files::load(path, &account, strict_modes, parse).await)
            }
            _ => None,
        };
        let Some((account, keys)) = self.load_candidate(user) else {
            return Ok(publickey_only());
        };
        // With either set, the certificate must carry a principal one lists.
        let principals = match (principals_file, command_principals) {
            (None, None) => None,
            (file, command) => Some(
                file.into_iter()
                    .flatten()
                    .chain(command.into_iter().flatten())
                    .collect::<Vec<_>>(),
            ),
        };
        let ca_key_type = certificate.signature_key().algorithm();
        let critical: Vec<(String, String)> = certificate
            .critical_options()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let extensions: Vec<String> = certificate.extensions().keys().cloned().collect();
        let signature_algorithm = certificate.signature().algorithm();
        let view = user_cert::UserCertificate {
            is_user_certificate: certificate.cert_type() == CertType::User,
            key_id: certificate.key_id(),
            principals: certificate.valid_principals(),
            critical_options: &critical,
            extensions: &extensions,
            ca_key_type: ca_key_type.as_str(),
            ca_blob: &ca_blob,
            signature_algorithm: signature_algorithm.as_str(),
        };
        match user_cert::admit(
            keys,
            &trusted,
            principals.as_deref(),
            user,
            &view,
            &ca_signatures,
            peer.ip(),
            unix_now(),
            local_utc_offset(),
        ) {
            Ok((options, authority)) => {
                tracing::info!(%peer, user, id = certificate.key_id(), serial = certificate.serial(),
                    ca = %certificate.signature_key().fingerprint(Default::default()),
                    via = ?authority, "accepted certificate");
                let account = account.clone();
                let credential = credential_line(certificate.to_openssh());
                Ok(self.logged_in(account, options, credential))
            }
            Err(why) => {
                tracing::info!(%peer, user, "certificate refused: {why}");
                Ok(publickey_only())
            }
        }
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        self.prepare_candidate(user).await;
        if let Some(why) = self.algorithm_refusal(user, &[key.algorithm.as_str()]) {
            tracing::info!(peer = %self.peer, user, "refusing the key: {why}");
            return Ok(publickey_only());
        }
        let command_keys = self.command_keys(user, key.public_key).await;
        match self
            .admitting_entry(user, key.public_key, &command_keys)
            .await
        {
            Some((account, options)) => {
                tracing::info!(peer = %self.peer, user, key = %key.public_key.fingerprint(Default::default()),
                    "accepted publickey");
                let credential = credential_line(key.public_key.to_openssh());
                Ok(self.logged_in(account, options, credential))
            }
            None => Ok(publickey_only()),
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
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
        self.channels.insert(
            channel.id(),
            SessionChannel {
                channel: Some(channel),
                env: Vec::new(),
                pty: None,
                agent: None,
                running: None,
                queue: Some(queue),
            },
        );
        reply.accept().await;
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some((auth, who)) = self.forwarder() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let rules = &self.settings().forwarding;
        let refusal = rules.open_refusal(&auth.options, host_to_connect, port_to_connect);
        match (refusal, u16::try_from(port_to_connect)) {
            (None, Ok(port)) => {
                self.forwards
                    .open(channel, reply, host_to_connect.to_string(), port, who)
            }
            (refusal, _) => {
                let why = refusal.unwrap_or_else(|| "not a TCP port".into());
                tracing::info!(
                    "{who}: refusing forwarding to {host_to_connect} port {port_to_connect}: {why}"
                );
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
            }
        }
        Ok(())
    }

    async fn channel_open_direct_streamlocal(
        &mut self,
        channel: Channel<Msg>,
        socket_path: &str,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some((auth, who)) = self.forwarder() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        match self.socket_refusal(
            self.settings()
                .forwarding
                .socket_open_refusal(&auth.options),
        ) {
            None => self.forwards.open_socket(
                channel,
                reply,
                socket_path.to_string(),
                crate::account_fs::Identity::of(&auth.account),
                who,
            ),
            Some(why) => {
                tracing::info!("{who}: refusing forwarding to socket {socket_path:?}: {why}");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
            }
        }
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Some((auth, who)) = self.forwarder() else {
            return Ok(false);
        };
        let rules = &self.settings().forwarding;
        let listened = match rules.listen_plan(&auth.options, auth.account.uid, address, *port) {
            Ok(bind) => {
                self.forwards
                    .listen(session.handle(), &bind, address, *port)
                    .await
            }
            Err(refusal) => Err(refusal),
        };
        match listened {
            Ok(bound) => {
                tracing::info!("{who}: remote forwarding from {address:?} port {bound}");
                *port = bound;
                Ok(true)
            }
            Err(why) => {
                tracing::info!(
                    "{who}: refusing remote forwarding from {address:?} port {port}: {why}"
                );
                Ok(false)
            }
        }
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(self.forwards.cancel(address, port))
    }

    async fn streamlocal_forward(
        &mut self,
        socket_path: &str,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Some((auth, who)) = self.forwarder() else {
            return Ok(false);
        };
        let rules = &self.settings().forwarding;
        let listened = match self.socket_refusal(rules.socket_listen_refusal(&auth.options)) {
            None => {
                let (mask, unlink) = (rules.bind_mask, rules.bind_unlink);
                let owner = crate::account_fs::Identity::of(&auth.account);
                self.forwards
                    .listen_socket(session.handle(), socket_path, owner, mask, unlink)
                    .await
            }
            Some(refusal) => Err(refusal),
        };
        match listened {
            Ok(()) => {
                tracing::info!("{who}: remote forwarding from socket {socket_path:?}");
                Ok(true)
            }
            Err(why) => {
                tracing::info!(
                    "{who}: refusing remote forwarding from socket {socket_path:?}: {why}"
                );
                Ok(false)
            }
        }
    }

    async fn cancel_streamlocal_forward(
        &mut self,
        socket_path: &str,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(self.forwards.cancel_socket(socket_path))
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Dropping the session's control sender hangs up a command that still runs.
        self.channels.remove(&channel);
        self.windows.closed(channel.into());
        self.queue.closed(channel.into());
        Ok(())
    }

    async fn channel_open_confirmation(
        &mut self,
        id: ChannelId,
        _max_packet_size: u32,
        _window_size: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // A channel skiffd opened (a forwarded connection, the agent): its
        // data counts from the first packet.
        self.queue.register(id.into());
        Ok(())
    }

    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.received(channel, data.len(), session).await
    }

    async fn extended_data(
        &mut self,
        channel: ChannelId,
        _code: u32,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.received(channel, data.len(), session).await
    }

    /// The window the next top-up grants: what the path wants, shrunk to
    /// the room left in the connection's and the server's queues.
    fn adjust_window(&mut self, channel: ChannelId, _current: u32) -> u32 {
        let socket = self.socket.as_ref();
        self.desired_window = skiff_dataplane::tcp::next_window(
            &mut self.windows,
            socket,
            self.session_rtt,
            channel.into(),
            self.desired_window,
        );
        self.queue.window_target(self.desired_window)
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        term: &str,
        col_width: u32,
        row_height: u32,
        pix_width: u32,
        pix_height: u32,
        modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let allowed = self.auth.as_ref().is_some_and(|a| !a.options.no_pty);
        match self.channels.get_mut(&channel) {
            Some(chan) if allowed && chan.running.is_none() => {
                chan.pty = Some(PtySpec {
                    term: term.to_string(),
                    cols: col_width,
                    rows: row_height,
                    pix_width,
                    pix_height,
                    modes: modes.to_vec(),
                });
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

    async fn agent_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
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

    async fn env_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
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

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(data).into_owned();
        self.start(channel, Some(command), session, None)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start(channel, None, session, None)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Like sshd, a subsystem is a command run as the account (the SFTP
        // server never runs inside skiffd); a forced command replaces it and
        // sees it in SSH_ORIGINAL_COMMAND.
        match (name, &self.settings().sftp_command) {
            ("sftp", Some(command)) => {
                tracing::debug!(peer = %self.peer, "subsystem sftp: {command}");
                let command = command.clone();
                self.start(channel, Some(command), session, None)
            }
            (skiff_proto::dataplane::SUBSYSTEM, _) => self.start_transfer(channel, session),
            _ => {
                tracing::info!(peer = %self.peer, "subsystem {name:?} is not available");
                session.channel_failure(channel)
            }
        }
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        col_width: u32,
        row_height: u32,
        pix_width: u32,
        pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(chan) = self.channels.get_mut(&channel) {
            if let Some(pty) = chan.running.as_ref().and_then(|r| r.pty.as_ref()) {
                let _ = pty.resize(col_width, row_height, pix_width, pix_height);
            } else if let Some(spec) = chan.pty.as_mut() {
                spec.cols = col_width;
                spec.rows = row_height;
            }
        }
        Ok(())
    }

    async fn signal(
        &mut self,
        channel: ChannelId,
        signal: Sig,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
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

/// User signatures skiffd accepts: ed25519, ecdsa, rsa-sha2-256/512. Plain
/// `ssh-rsa` means SHA-1 and is refused (OpenSSH refuses it by default too).
/// The `PubkeyAcceptedAlgorithms` names a user certificate of this key
/// type may be signed in with: for RSA, either SHA-2 variant.
fn certificate_algorithms(key: russh::keys::Algorithm) -> Vec<String> {
    match key {
        russh::keys::Algorithm::Rsa { .. } => vec![
            "rsa-sha2-512-cert-v01@openssh.com".into(),
            "rsa-sha2-256-cert-v01@openssh.com".into(),
        ],
        other => vec![format!("{}-cert-v01@openssh.com", other.as_str())],
    }
}

/// `publickey KEYTYPE BASE64` from a key's (or certificate's) OpenSSH
/// public form, without its comment.
fn credential_line(openssh: Result<String, russh::keys::ssh_key::Error>) -> String {
    let text = openssh.unwrap_or_default();
    let mut fields = text.split_whitespace();
    match (fields.next(), fields.next()) {
        (Some(kind), Some(blob)) => format!("publickey {kind} {blob}\n"),
        _ => "publickey\n".to_string(),
    }
}

fn publickey_only() -> Auth {
    let mut methods = russh::MethodSet::empty();
    methods.push(russh::MethodKind::PublicKey);
    Auth::Reject {
        proceed_with_methods: Some(methods),
        partial_success: false,
    }
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

/// Expands `%h`, `%u` and `%%` in the authorized_keys path template.
pub fn authorized_keys_path(template: &str, acct: &Account) -> String {
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(&acct.home.to_string_lossy()),
            Some('u') => out.push_str(&acct.name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    if !out.starts_with('/') {
        // sshd reads relative paths from the home directory.
        out = format!("{}/{}", acct.home.to_string_lossy(), out);
    }
    out
}

/// Why a key (or certificate) may not be used, as `is_revoked` says of
/// the `RevokedKeys` file at `path`: it is listed, or the file cannot be
/// read (then no key may be used, as with sshd). Read at every check, off
/// the async workers ([`crate::account_files`]), so that a revocation takes
/// effect at once.
async fn revoked(
    path: Option<std::path::PathBuf>,
    is_revoked: impl Fn(&RevokedKeys) -> bool,
) -> Option<String> {
    use crate::account_files::{clip, read_server_file, REVOKED_KEYS_MAX_BYTES};
    let path = path?;
    let label = path.display().to_string();
    let bytes = match read_server_file(&path, REVOKED_KEYS_MAX_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let label = clip(&label);
            tracing::error!("cannot read RevokedKeys {label}: {e}; refusing every key");
            return Some(format!("RevokedKeys {label} cannot be read"));
        }
    };
    match authorized_keys::parse_revoked_keys(&label, &bytes) {
        Ok((revoked, warnings)) => {
            for w in warnings {
                tracing::warn!("{}", clip(&w.to_string()));
            }
            is_revoked(&revoked).then(|| format!("revoked in {}", clip(&label)))
        }
        Err(e) => {
            tracing::error!("{}; refusing every key", clip(&e.to_string()));
            Some(format!("RevokedKeys {} is unusable", clip(&label)))
        }
    }
}

/// The server's `TrustedUserCAKeys` at `path`, read now (so a changed file
/// takes effect at the next login, as authorized_keys does), off the async
/// workers.
async fn trusted_user_cas(path: Option<std::path::PathBuf>) -> Vec<AuthorizedKey> {
    let Some(path) = path else {
        return Vec::new();
    };
    match crate::account_files::load_server_list(&path, authorized_keys::parse).await {
        Ok(keys) => keys,
        Err(e) => {
            let label = crate::account_files::clip(&path.display().to_string());
            tracing::warn!("cannot read TrustedUserCAKeys {label}: {e}");
            Vec::new()
        }
    }
}

/// The names of the account's primary and supplementary groups.
fn group_names(acct: &Account) -> Vec<String> {
    std::iter::once(acct.gid)
        .chain(acct.groups.iter().copied())
        .filter_map(|g| {
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(g))
                .ok()
                .flatten()
        })
        .map(|g| g.name)
        .collect()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The local timezone's offset from UTC in seconds, for `expiry-time` without `Z`.
fn local_utc_offset() -> i64 {
    let now = unix_now() as libc::time_t;
    // SAFETY: localtime_r fills the tm we own.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            0
        } else {
            tm.tm_gmtoff
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh::keys::{Algorithm, EcdsaCurve, HashAlg};
    use std::path::PathBuf;

    #[test]
    fn sha1_rsa_and_dsa_are_not_accepted_by_default() {
        let accepted = crate::config::Settings::default().pubkey_algorithms;
        let ok = |a: Algorithm| accepted.iter().any(|n| n == a.as_str());
        assert!(!ok(Algorithm::Rsa { hash: None }));
        assert!(ok(Algorithm::Rsa {
            hash: Some(HashAlg::Sha256)
        }));
        assert!(ok(Algorithm::Rsa {
            hash: Some(HashAlg::Sha512)
        }));
        assert!(ok(Algorithm::Ed25519));
        assert!(ok(Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP256
        }));
        assert!(!ok(Algorithm::Dsa));
        assert_eq!(
            certificate_algorithms(Algorithm::Ed25519),
            ["ssh-ed25519-cert-v01@openssh.com"]
        );
        let rsa = certificate_algorithms(Algorithm::Rsa { hash: None });
        assert!(rsa.iter().all(|n| accepted.contains(n)), "{rsa:?}");
    }

    #[test]
    fn authorized_keys_path_tokens() {
        let acct = Account {
            name: "alice".into(),
            uid: 1000,
            gid: 1000,
            groups: vec![],
            home: PathBuf::from("/home/alice"),
            shell: PathBuf::from("/bin/sh"),
        };
        assert_eq!(
            authorized_keys_path("%h/.ssh/authorized_keys", &acct),
            "/home/alice/.ssh/authorized_keys"
        );
        assert_eq!(
            authorized_keys_path("/etc/keys/%u", &acct),
            "/etc/keys/alice"
        );
        assert_eq!(
            authorized_keys_path("/etc/keys/100%%", &acct),
            "/etc/keys/100%"
        );
        assert_eq!(
            authorized_keys_path(".ssh/ak", &acct),
            "/home/alice/.ssh/ak"
        );
        assert_eq!(authorized_keys_path("/shared/keys", &acct), "/shared/keys");
    }
}
