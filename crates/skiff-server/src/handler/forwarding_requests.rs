//! The client's forwarding requests, ruled on for the login: `direct-tcpip`
//! and `direct-streamlocal` channels, `tcpip-forward` and
//! `streamlocal-forward` listeners (cancelling one needs no ruling: the
//! handler passes it on). The rules are [`crate::forward_policy`]'s, with
//! the key's options; a jailed login gets no Unix-socket forwarding.
//!
//! Not here: the relays and listeners themselves (`crate::forward_relay`),
//! and agent forwarding, which a session asks for (`session`).

use russh::server::{ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelOpenFailure};

use super::auth::Authenticated;
use super::ConnectionHandler;

impl ConnectionHandler {
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
    pub(super) fn forwarder(&self) -> Option<(&Authenticated, String)> {
        let auth = self.auth.as_ref()?;
        Some((auth, format!("{} from {}", auth.account.name, self.peer)))
    }

    /// Records a forwarding of `kind` to (or listening on) `target` that
    /// the rules let through.
    fn audit_forward(&self, user: &str, kind: &str, target: String) {
        if self.log.auditing() {
            self.log
                .record(crate::audit::Event::Forward(crate::audit::ForwardRecord {
                    user: user.to_string(),
                    kind: kind.to_string(),
                    target,
                }));
        }
    }

    /// A `direct-tcpip` channel: a connection to `host_to_connect`.
    pub(super) async fn open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        reply: ChannelOpenHandle,
    ) -> Result<(), russh::Error> {
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
                let target = format!("{host_to_connect}:{port}");
                self.audit_forward(&auth.account.name, "direct-tcpip", target);
                self.forwards
                    .open(channel, reply, host_to_connect.to_string(), port, who)
            }
            (refusal, _) => {
                let why = refusal.unwrap_or_else(|| "not a TCP port".into());
                let what = format!("{host_to_connect} port {port_to_connect}");
                refuse_open(reply, &who, &what, &why).await;
            }
        }
        Ok(())
    }

    /// A `direct-streamlocal` channel: a connection to a Unix socket,
    /// made with the account's rights.
    pub(super) async fn open_direct_streamlocal(
        &mut self,
        channel: Channel<Msg>,
        socket_path: &str,
        reply: ChannelOpenHandle,
    ) -> Result<(), russh::Error> {
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
            None => {
                let target = socket_path.to_string();
                self.audit_forward(&auth.account.name, "direct-streamlocal", target);
                self.forwards.open_socket(
                    channel,
                    reply,
                    socket_path.to_string(),
                    crate::account_fs::Identity::of(&auth.account),
                    who,
                )
            }
            Some(why) => {
                let what = format!("socket {socket_path:?}");
                refuse_open(reply, &who, &what, &why).await;
            }
        }
        Ok(())
    }

    /// `tcpip-forward`: listens for the client (port 0: a port of the
    /// system's choosing, written back to `port`).
    pub(super) async fn listen_tcpip(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, russh::Error> {
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
        if let Ok(bound) = listened {
            *port = bound;
            let user = self.auth.as_ref().map(|a| a.account.name.clone());
            let target = format!("{address}:{bound}");
            self.audit_forward(&user.unwrap_or_default(), "tcpip-forward", target);
        }
        Ok(ruled(&who, &format!("{address:?} port {port}"), listened))
    }

    /// `streamlocal-forward`: a Unix socket listening for the client,
    /// made with the account's rights.
    pub(super) async fn listen_streamlocal(
        &mut self,
        socket_path: &str,
        session: &mut Session,
    ) -> Result<bool, russh::Error> {
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
        if listened.is_ok() {
            let user = self.auth.as_ref().map(|a| a.account.name.clone());
            let target = socket_path.to_string();
            self.audit_forward(&user.unwrap_or_default(), "streamlocal-forward", target);
        }
        Ok(ruled(&who, &format!("socket {socket_path:?}"), listened))
    }
}

/// Turns down a forwarding channel, saying in the log who asked for `what`
/// and why not.
async fn refuse_open(reply: ChannelOpenHandle, who: &str, what: &str, why: &str) {
    tracing::info!("{who}: refusing forwarding to {what}: {why}");
    reply
        .reject(ChannelOpenFailure::AdministrativelyProhibited)
        .await;
}

/// Logs how a listening request for `what` (with the port bound, once
/// known) went; true when it is listening.
fn ruled<T>(who: &str, what: &str, listened: Result<T, String>) -> bool {
    match listened {
        Ok(_) => {
            tracing::info!("{who}: remote forwarding from {what}");
            true
        }
        Err(why) => {
            tracing::info!("{who}: refusing remote forwarding from {what}: {why}");
            false
        }
    }
}
