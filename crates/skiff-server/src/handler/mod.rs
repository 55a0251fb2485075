//! The per-connection SSH handler: public-key authentication against the
//! account's authorized_keys (options enforced), then session channels
//! (`exec`, `shell`, `subsystem` sftp, `pty-req`, `env`, `signal`,
//! `window-change`) and TCP forwarding (see [`crate::forward_relay`]).
//!
//! russh has one type answer every callback: [`ConnectionHandler`] holds
//! what a connection keeps between messages, and its `Handler` impl here
//! only hands each callback to the module that does the work, as OpenSSH
//! splits its server into files:
//!
//! - `auth`: who logs in, and with which options (auth2-pubkey.c and
//!   auth2-pubkeyfile.c);
//! - `session`: session channels and their requests, up to a started
//!   command (session.c);
//! - `session_io`: a started session's bytes, signals, flow control and
//!   exit, and what the connection reads for its channels (serverloop.c);
//! - `forwarding_requests`: the client's forwarding requests, ruled on
//!   before `crate::forward_relay` carries them out.
//!
//! Not here: what all connections share (`crate::server_state`), and
//! accepting connections, MaxStartups and the login grace timer
//! (`crate::listener`).

mod auth;
mod forwarding_requests;
mod pam_auth;
mod session;
mod session_io;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use russh::keys::Certificate;
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, Pty, Sig};
use skiff_proto::authorized_keys::AuthorizedKey;

use auth::{AuthSteps, Authenticated, UserKeys};
use session::SessionChannel;

use crate::config::Settings;
use crate::process::PtySpec;
use crate::server_state::ServerState;

pub use auth::authorized_keys_path;

/// One client connection.
pub struct ConnectionHandler {
    state: Arc<ServerState>,
    peer: SocketAddr,
    local: SocketAddr,
    /// Neither address is known (inetd mode on pipes): `peer` and `local`
    /// are placeholders, and sessions are told `UNKNOWN`.
    peer_unknown: bool,
    /// Set once authentication succeeds; read by the login-grace timer.
    authenticated_flag: tokio::sync::watch::Sender<bool>,
    /// authorized_keys of the user being authenticated (cached across offers).
    candidate: Option<(String, Option<UserKeys>)>,
    /// The last `AuthorizedKeysCommand` answer: user, key blob, entries.
    command_answer: Option<(String, Vec<u8>, Vec<AuthorizedKey>)>,
    auth: Option<Authenticated>,
    /// `AuthenticationMethods` steps done so far (after a partial success).
    auth_steps: Option<AuthSteps>,
    /// Authentication requests refused on this connection (shared with
    /// the listener, which penalises a source whose connection ends after
    /// one: `PerSourcePenalties authfail`).
    auth_failures: Arc<crate::penalties::FailureCount>,
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
    /// When each open channel last carried data (`ChannelTimeout`,
    /// `UnusedConnectionTimeout`).
    clocks: Arc<crate::channel_idle::ConnectionClocks>,
    /// TCP forwardings (`direct-tcpip` relays, `tcpip-forward` listeners).
    forwards: crate::forward_relay::Forwards,
    /// The `ExposeAuthInfo` file, made at the first session.
    auth_info: Option<crate::auth_info::AuthInfoFile>,
    /// The account name whose login settings are in force, and those
    /// settings when `Match` blocks change them (see [`Self::settings`]).
    effective: Option<(String, Option<Arc<Settings>>)>,
    /// The notice of `/etc/nologin` for a login it refuses: sent as the
    /// reason for disconnecting once the client has proved its key.
    nologin_refusal: Option<String>,
    /// Refused environment variables logged on this connection so far
    /// (see `session::REFUSALS_LOGGED`).
    env_refusals: std::cell::Cell<u32>,
    /// The login's PAM transaction (`UsePAM yes`), started when first
    /// needed.
    pam: Option<crate::pam::PamLogin>,
    /// How many questions the keyboard-interactive round in progress asked.
    kbd_round: Option<usize>,
    /// An expired password was changed (or its change tried) on this
    /// connection: it is not asked for again.
    password_changed: bool,
    /// PAM's session for the login's commands (`UsePAM yes`), opened at
    /// the first; closed when the connection ends and this is dropped.
    pam_session: Option<Arc<crate::pam_session::PamSession>>,
    /// Its audit records and who it is, for the line sshd logs when a
    /// connection ends ([`crate::audit_writer::ConnectionLog`]).
    log: Arc<crate::audit_writer::ConnectionLog>,
}

impl ConnectionHandler {
    pub fn new(
        state: Arc<ServerState>,
        peer: SocketAddr,
        local: SocketAddr,
        authenticated_flag: tokio::sync::watch::Sender<bool>,
    ) -> Self {
        let queue = crate::queue_budget::ConnectionQueue::new(state.queues.clone());
        let clocks = crate::channel_idle::ConnectionClocks::new(peer);
        let log =
            crate::audit_writer::ConnectionLog::new(state.audit.as_ref(), Some(peer), Some(local));
        ConnectionHandler {
            log,
            peer,
            local,
            peer_unknown: false,
            authenticated_flag,
            candidate: None,
            command_answer: None,
            auth: None,
            auth_steps: None,
            auth_failures: Default::default(),
            channels: HashMap::new(),
            socket: None,
            windows: skiff_proto::window::WindowGrowth::new(state.settings.max_channel_window),
            desired_window: skiff_proto::window::INITIAL_WINDOW,
            probe_answered: None,
            session_rtt: None,
            forwards: crate::forward_relay::Forwards::new(queue.clone(), clocks.clone()),
            clocks,
            queue,
            auth_info: None,
            effective: None,
            nologin_refusal: None,
            env_refusals: std::cell::Cell::new(0),
            pam: None,
            kbd_round: None,
            password_changed: false,
            pam_session: None,
            state,
        }
    }

    /// Logs through `log` (the listener's, which says when the connection
    /// opened and ended).
    pub fn with_log(mut self, log: Arc<crate::audit_writer::ConnectionLog>) -> Self {
        self.log = log;
        self
    }

    /// Counts refused authentication requests in `counter`.
    pub fn with_auth_failures(mut self, counter: Arc<crate::penalties::FailureCount>) -> Self {
        self.auth_failures = counter;
        self
    }

    /// `auth`, counted when it refuses (a partial success is no failure).
    fn counted(&self, auth: Auth) -> Auth {
        if matches!(
            auth,
            Auth::Reject {
                partial_success: false,
                ..
            }
        ) {
            self.auth_failures
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        auth
    }

    /// Counts a wrong password or keyboard-interactive answer
    /// (`PerSourcePenalties passwordfail`).
    fn password_failed(&self) {
        self.auth_failures
            .passwords
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The connection is not a socket (inetd mode on pipes): the addresses
    /// given are placeholders, and sessions see `UNKNOWN` for both ends.
    pub fn with_unknown_peer(mut self) -> Self {
        self.peer_unknown = true;
        self
    }

    /// Lets channel windows grow with the connection's round-trip time.
    pub fn with_socket(mut self, socket: std::os::fd::OwnedFd) -> Self {
        self.socket = Some(socket);
        self
    }

    /// The settings in force: those of the login being authenticated (or
    /// done), else the server's.
    fn settings(&self) -> &Settings {
        self.effective
            .as_ref()
            .and_then(|(_, s)| s.as_deref())
            .unwrap_or(&self.state.settings)
    }
}

impl russh::server::Handler for ConnectionHandler {
    type Error = russh::Error;

    async fn authentication_banner(&mut self) -> Result<Option<String>, Self::Error> {
        self.banner()
    }

    async fn auth_succeeded(&mut self, session: &mut Session) -> Result<(), Self::Error> {
        // The login's own settings (after `Match`) time its channels.
        let settings = self.settings();
        self.clocks.start(
            settings.channel_timeouts.clone(),
            settings.unused_connection_timeout,
            session.handle(),
        );
        self.disconnect_if_nologin(session)
    }

    async fn auth_none(&mut self, user: &str) -> Result<Auth, Self::Error> {
        // The methods listed are the login's (its Match blocks may turn
        // passwords on or off).
        self.prepare_candidate(user).await;
        Ok(self.refused())
    }

    async fn auth_password(&mut self, user: &str, password: &str) -> Result<Auth, Self::Error> {
        let auth = self.password_login(user, password).await?;
        Ok(self.counted(auth))
    }

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        user: &str,
        _submethods: &str,
        response: Option<russh::server::Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        let answers = response.map(|r| r.collect::<Vec<_>>());
        let auth = self.interactive_login(user, answers).await?;
        Ok(self.counted(auth))
    }

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        let auth = self.key_offered(user, offer).await?;
        Ok(self.counted(auth))
    }

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        let auth = self.certificate_login(user, certificate).await?;
        Ok(self.counted(auth))
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        let auth = self.key_login(user, key).await?;
        Ok(self.counted(auth))
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.open_session(channel, reply).await
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
        self.open_direct_tcpip(channel, host_to_connect, port_to_connect, reply)
            .await
    }

    async fn channel_open_direct_streamlocal(
        &mut self,
        channel: Channel<Msg>,
        socket_path: &str,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.open_direct_streamlocal(channel, socket_path, reply)
            .await
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        self.listen_tcpip(address, port, session).await
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
        self.listen_streamlocal(socket_path, session).await
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
        self.channel_closed(channel);
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

    fn adjust_window(&mut self, channel: ChannelId, _current: u32) -> u32 {
        self.next_window(channel)
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
        let spec = PtySpec {
            term: term.to_string(),
            cols: col_width,
            rows: row_height,
            pix_width,
            pix_height,
            modes: modes.to_vec(),
        };
        self.pty_requested(channel, spec, session)
    }

    async fn agent_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        self.agent_requested(channel, session)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.env_requested(channel, name, value, session)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(data).into_owned();
        self.start(channel, Some(command), session, None).await
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start(channel, None, session, None).await
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.subsystem_requested(channel, name, session).await
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
        let size = (col_width, row_height, pix_width, pix_height);
        self.window_changed(channel, size);
        Ok(())
    }

    async fn signal(
        &mut self,
        channel: ChannelId,
        signal: Sig,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.signal_requested(channel, signal)
    }
}
