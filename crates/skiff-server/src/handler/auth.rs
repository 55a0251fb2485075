//! Who a connection logs in as (OpenSSH's auth2-pubkey.c and
//! auth2-pubkeyfile.c): the `Banner`, then public keys and user
//! certificates. Every request starts with the account (`crate::account`,
//! the access rules of [`crate::access`]) and the settings of its login
//! (`Match` blocks); the candidate keys come from the account's
//! `AuthorizedKeysFile` entries (read through `crate::account_files`) and
//! `AuthorizedKeysCommand`; a certificate needs a CA (`TrustedUserCAKeys`
//! or a `cert-authority` line) and, where configured, a principal from
//! `AuthorizedPrincipalsFile` or `AuthorizedPrincipalsCommand`.
//! `PubkeyAcceptedAlgorithms`, `RequiredRSASize` and `RevokedKeys` refuse a
//! key before any entry is looked at. A security key (`sk-`) must also
//! meet [`crate::security_keys`] under its line's or certificate's
//! options. A login that succeeds is recorded as [`Authenticated`], with `ForceCommand` and `PermitTTY` applied to its
//! options once; `PermitRootLogin forced-commands-only` and `/etc/nologin`
//! can still refuse it. Each judged request is logged in sshd's words
//! ([`crate::auth_log`]) and recorded in the `AuditLog`.
//!
//! Not here: the file formats and the certificate rules
//! (`skiff_proto::authorized_keys`, `skiff_proto::user_cert`), running the
//! lookup commands ([`crate::lookup_command`]), and what a login may do once
//! in (`session`, `forwarding_requests`).

use std::sync::Arc;

use russh::keys::ssh_key::certificate::CertType;
use russh::keys::{Certificate, PublicKey};
use russh::server::{Auth, PublicKeyOffer, Session, VerifiedPublicKey};
use skiff_proto::authorized_keys::{
    self, AuthorizedKey, AuthorizedPrincipal, KeyOptions, RevokedKeys,
};
use skiff_proto::user_cert;

use super::ConnectionHandler;
use crate::account::{self, Account};
use crate::audit::AuthResult as AuditResult;
use crate::auth_log;
use crate::auth_methods::{Method, Progress, Step};
use crate::config::Settings;
use crate::security_keys;

/// The outcome of a successful authentication.
pub(super) struct Authenticated {
    pub(super) account: Account,
    pub(super) options: KeyOptions,
    /// How it authenticated, as `ExposeAuthInfo` writes it
    /// (`publickey KEYTYPE BASE64`).
    pub(super) credential: String,
    /// `ForceCommand internal-sftp [OPTIONS]` is in force: skiffd's SFTP
    /// server runs directly, not through the account's shell, with these
    /// options.
    pub(super) forced_internal_sftp: Option<crate::sftp_options::SftpOptions>,
}

/// Why an account may not log in: it does not exist (sshd's "Invalid
/// user"), or another reason.
enum CandidateRefusal {
    NoSuchUser,
    Other(String),
}

/// A usable account and the keys its authorized_keys file admits.
pub(super) type UserKeys = (Account, Vec<AuthorizedKey>);

/// A login part-way through `AuthenticationMethods` (a method has
/// succeeded, the lists want more): who, how far, and what the steps so
/// far hold.
pub(super) struct AuthSteps {
    user: String,
    progress: Progress,
    /// The public keys used so far (a certificate counts as its key): as
    /// in sshd, none may serve again.
    used_keys: Vec<Vec<u8>>,
    /// The key options of the steps so far, merged ([`merge_options`]).
    options: KeyOptions,
    /// Their `ExposeAuthInfo` lines.
    credentials: String,
}

impl ConnectionHandler {
    /// The account `user` names, if it may log in at all from this peer
    /// (see [`account::lookup`] and [`crate::access`]).
    fn admissible_account(&mut self, user: &str) -> Result<Account, CandidateRefusal> {
        let acct = account::lookup(user).map_err(|r| match r {
            account::Refusal::NoSuchUser => CandidateRefusal::NoSuchUser,
            other => CandidateRefusal::Other(other.to_string()),
        })?;
        self.enter_login_settings(&acct);
        let access = &self.settings().access;
        let groups = if access.allow_groups.is_empty() && access.deny_groups.is_empty() {
            Vec::new()
        } else {
            group_names(&acct)
        };
        match access.refusal(user, acct.uid, &groups, self.peer.ip()) {
            Some(why) => Err(CandidateRefusal::Other(why)),
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

    /// Loads (once per user name) the account and its authorized keys,
    /// the files read off the async workers ([`crate::account_files`]).
    /// Every authentication request starts here.
    pub(super) async fn prepare_candidate(&mut self, user: &str) {
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
                match why {
                    CandidateRefusal::NoSuchUser => {
                        tracing::info!("{}", auth_log::invalid_user(user, self.log.peer()));
                        // In btmp, as sshd records one (`lastb` shows it).
                        let addr = self.log.peer().map(|p| p.ip());
                        crate::login_writer::record_failed(user, addr);
                    }
                    CandidateRefusal::Other(why) => {
                        tracing::info!(peer = %self.peer, user, "refusing login: {why}")
                    }
                }
                None
            }
        };
        self.log.set_who(auth_log::Who::Authenticating {
            user: user.to_string(),
            valid: loaded.is_some(),
        });
        self.candidate = Some((user.to_string(), loaded));
    }

    /// The account `user` names and its authorized keys, as
    /// [`Self::prepare_candidate`] loaded them; `None` when the account may
    /// not log in (or was not prepared).
    pub(super) fn load_candidate(&self, user: &str) -> Option<&UserKeys> {
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
            // A client of unknown address (inetd mode on pipes) meets no
            // from= restriction.
            if self.peer_unknown {
                tracing::info!(
                    user,
                    line = entry.line,
                    "key refused: from= and the client's address is unknown"
                );
                return None;
            }
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

    /// Why `user` may not use `method` (with the key `blob`, for public
    /// keys) at this stage of `AuthenticationMethods`: after a partial
    /// success the user name may not change, a key already used does not
    /// count again, and the method must come next in some list.
    pub(super) fn step_refusal(
        &self,
        user: &str,
        method: Method,
        blob: Option<&[u8]>,
    ) -> Option<String> {
        match &self.auth_steps {
            Some(steps) if steps.user != user => {
                Some("the user name changed after a partial authentication".into())
            }
            Some(steps) if blob.is_some_and(|b| steps.used_keys.iter().any(|k| k == b)) => {
                Some("this key has already been used (AuthenticationMethods)".into())
            }
            Some(steps) if !steps.progress.allows(method) => Some(format!(
                "{method} does not come next (AuthenticationMethods)"
            )),
            _ => None,
        }
    }

    /// The methods a client may try now: those `AuthenticationMethods`
    /// lets come next that the login's settings offer.
    fn offered_next(&self) -> Vec<Method> {
        let settings = self.settings();
        let next = match &self.auth_steps {
            Some(steps) => steps.progress.next_methods(),
            None => settings.authentication_methods.start().next_methods(),
        };
        next.into_iter()
            .filter(|m| settings.pam.offers(*m))
            .collect()
    }

    /// A refusal that lists the methods left to try.
    pub(super) fn refused(&self) -> Auth {
        Auth::Reject {
            proceed_with_methods: Some(method_set(&self.offered_next())),
            partial_success: false,
        }
    }

    /// Records a successful step by `method` (for a key or a certificate,
    /// whose key is `key_blob`) as `account`, whose sessions run under
    /// `options`: a partial success while `AuthenticationMethods` wants
    /// more, else the login, once PAM's account check (`UsePAM`) agrees.
    pub(super) async fn logged_in(
        &mut self,
        account: Account,
        options: KeyOptions,
        credential: String,
        method: Method,
        key_blob: Option<Vec<u8>>,
    ) -> Auth {
        self.enter_login_settings(&account);
        if let Some(why) = self.step_refusal(&account.name, method, key_blob.as_deref()) {
            tracing::info!(peer = %self.peer, user = %account.name, "{method} refused: {why}");
            return self.refused();
        }
        // Worked on a copy: a refusal below leaves the steps as they were.
        let (mut progress, earlier) = match &self.auth_steps {
            Some(steps) => (
                steps.progress.clone(),
                Some((steps.options.clone(), steps.credentials.clone())),
            ),
            None => (self.settings().authentication_methods.start(), None),
        };
        let step = progress.record(method);
        let (mut options, credential) = match earlier {
            None => (options, credential),
            Some((before, lines)) => match merge_options(before, options) {
                Ok(merged) => (merged, lines + &credential),
                Err(why) => {
                    tracing::info!(peer = %self.peer, user = %account.name, "key refused: {why}");
                    return self.refused();
                }
            },
        };
        match step {
            Step::Complete => {}
            Step::NotAllowed => return self.refused(),
            Step::Partial(next) => {
                tracing::info!(peer = %self.peer, user = %account.name,
                    "partial authentication: {method} accepted, {} to follow (AuthenticationMethods)",
                    next.iter().map(|m| m.name()).collect::<Vec<_>>().join(" or "));
                let steps = self.auth_steps.get_or_insert_with(|| AuthSteps {
                    user: account.name.clone(),
                    progress: progress.clone(),
                    used_keys: Vec::new(),
                    options: KeyOptions::default(),
                    credentials: String::new(),
                });
                steps.progress = progress;
                steps.used_keys.extend(key_blob);
                steps.options = options;
                steps.credentials = credential;
                // What comes next, as the login's settings offer it.
                return Auth::Reject {
                    proceed_with_methods: Some(method_set(&self.offered_next())),
                    partial_success: true,
                };
            }
        }
        if account.uid == 0
            && self.settings().access.root_login == crate::access::RootLogin::ForcedCommandsOnly
            && options.command.is_none()
        {
            tracing::info!(peer = %self.peer, user = %account.name,
                "refusing login: PermitRootLogin forced-commands-only, and the key forces no command");
            return self.refused();
        }
        if self.settings().pam.use_pam {
            let peer = self.log.peer();
            if let Err(e) = self.pam_for(&account.name).account().await {
                tracing::info!("{}", crate::pam::account_refusal(&account.name, peer, &e));
                return self.refused();
            }
        }
        self.auth_steps = None;
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
        // `internal-sftp [OPTIONS]` forced by ForceCommand (its options
        // were checked when the configuration was read) or by the key's
        // `command=`, as sshd: skiffd's own SFTP server. A key's command
        // with options the server does not take stays a shell command
        // (which fails) rather than a server with fewer restrictions.
        let forced = settings
            .force_command
            .clone()
            .or_else(|| options.command.clone());
        let forced_internal_sftp = forced
            .as_deref()
            .and_then(crate::sftp_options::internal_sftp_command)
            .and_then(|parsed| {
                parsed
                    .map_err(|e| {
                        tracing::info!(peer = %self.peer, user = %account.name,
                            "forced internal-sftp refused: {e}")
                    })
                    .ok()
            });
        if let Some(forced) = forced {
            options.command = Some(match &forced_internal_sftp {
                Some(_) => settings.internal_sftp_command().unwrap_or(forced),
                None => forced,
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

    /// Why a signature by a key of `algorithm` may not log in under
    /// `options` (its authorized_keys line, or its certificate's): for a
    /// security key, a flag the login requires that skiffd cannot see
    /// (see [`security_keys`]); `None` for other keys. `signed`: a
    /// signature was verified (else the key is only offered), whose
    /// counter and flags sshd would log.
    fn security_key_refusal(
        &self,
        algorithm: &str,
        options: &KeyOptions,
        signed: bool,
    ) -> Option<security_keys::Refusal> {
        if !security_keys::is_security_key(algorithm) {
            return None;
        }
        let needs = security_keys::required(self.settings().pubkey_auth_options, options);
        // russh 0.65 verifies the flags and counter with the signature but
        // does not pass them on.
        let flags = security_keys::Flags::Hidden;
        if signed {
            tracing::debug!(peer = %self.peer, "{algorithm}: {}", security_keys::debug_line(flags));
        }
        security_keys::check(needs, flags).err()
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

    /// The `Banner` file, shown before authentication.
    pub(super) fn banner(&mut self) -> Result<Option<String>, russh::Error> {
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

    /// Once a login is accepted: ends the connection of one that
    /// `/etc/nologin` refused (see [`Self::logged_in`]).
    pub(super) fn disconnect_if_nologin(
        &mut self,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        // A login `/etc/nologin` refuses: its notice is the reason given,
        // as sshd gives PAM's, and no channel is ever served (no account is
        // set). ssh shows it as "Received disconnect from ...: NOTICE".
        if let Some(notice) = self.nologin_refusal.take() {
            session.disconnect(russh::Disconnect::NoMoreAuthMethodsAvailable, &notice, "en")?;
        }
        Ok(())
    }

    /// Answers a probe ("would this key do?"): `PK_OK` for a key the
    /// account admits, or any key where a CA is trusted.
    pub(super) async fn key_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, russh::Error> {
        self.prepare_candidate(user).await;
        if let Some(why) = self.algorithm_refusal(user, &[offer.algorithm.as_str()]) {
            tracing::info!(peer = %self.peer, user, "refusing the key: {why}");
            return Ok(self.refused());
        }
        if let Some(why) = offer
            .public_key
            .to_bytes()
            .ok()
            .and_then(|blob| self.step_refusal(user, Method::PublicKey, Some(&blob)))
        {
            tracing::info!(peer = %self.peer, user, "refusing the key: {why}");
            return Ok(self.refused());
        }
        let command_keys = self.command_keys(user, offer.public_key).await;
        let algorithm = offer.algorithm.as_str();
        let admitted = self
            .admitting_entry(user, offer.public_key, &command_keys)
            .await
            // A security key its line admits but whose signature would be
            // refused is refused now, before anyone is asked to touch it.
            .filter(|(_, options)| match self.security_key_refusal(algorithm, options, false) {
                Some(why) => {
                    tracing::info!(peer = %self.peer, user, "key refused: {why}");
                    false
                }
                None => true,
            })
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
            let credential = key_credential(offer.public_key);
            let refused = self.refused();
            self.judged(user, auth_log::How::Key(&credential), &refused);
            refused
        })
    }

    /// Logs the outcome of a public-key request (`auth`) for `user` with
    /// `credential` as sshd does, and records it in the audit log.
    pub(super) fn judged(&self, user: &str, how: auth_log::How<'_>, auth: &Auth) {
        let peer = self.log.peer();
        let key = match how {
            auth_log::How::Key(credential) => Some(credential),
            _ => None,
        };
        let result = match auth {
            Auth::Accept => {
                tracing::info!("{}", auth_log::accepted(user, peer, how));
                self.log.set_who(auth_log::Who::LoggedIn(user.to_string()));
                AuditResult::Success
            }
            Auth::Reject {
                partial_success: true,
                ..
            } => {
                tracing::info!("{}", auth_log::partial(user, peer, how));
                AuditResult::Partial
            }
            _ => {
                // The account's candidacy (valid or not) was settled by
                // prepare_candidate for this user name.
                let valid = self
                    .candidate
                    .as_ref()
                    .is_none_or(|(u, c)| u != user || c.is_some());
                tracing::info!("{}", auth_log::failed(user, valid, peer, how));
                AuditResult::Failure
            }
        };
        if self.log.auditing() {
            self.log
                .record(crate::audit::Event::Auth(crate::audit::AuthRecord {
                    user: user.to_string(),
                    method: match how {
                        auth_log::How::Key(_) => "publickey",
                        auth_log::How::Password => "password",
                        auth_log::How::KeyboardInteractive => "keyboard-interactive",
                    }
                    .into(),
                    key_type: key.map(|c| c.key_type.clone()),
                    fingerprint: key.map(|c| c.fingerprint.clone()),
                    certificate: key.and_then(|c| c.certificate.clone()),
                    result,
                }));
        }
    }

    /// Judges a signed request with a user certificate.
    pub(super) async fn certificate_login(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, russh::Error> {
        let auth = self.judge_certificate(user, certificate).await?;
        self.judged(
            user,
            auth_log::How::Key(&certificate_credential(certificate)),
            &auth,
        );
        Ok(auth)
    }

    async fn judge_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, russh::Error> {
        // russh has checked the CA's signature over the certificate, its
        // validity period and the client's signature with its key.
        let peer = self.peer;
        // The account first: its settings (Match blocks) say which CAs,
        // principals and revocations apply.
        self.prepare_candidate(user).await;
        if self.load_candidate(user).is_none() {
            return Ok(self.refused());
        }
        let cert_algorithms = certificate_algorithms(certificate.algorithm());
        let names: Vec<&str> = cert_algorithms.iter().map(String::as_str).collect();
        if let Some(why) = self.algorithm_refusal(user, &names) {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(self.refused());
        }
        let Ok(ca_blob) =
            russh::keys::PublicKey::from(certificate.signature_key().clone()).to_bytes()
        else {
            return Ok(self.refused());
        };
        let Ok(key_blob) = PublicKey::from(certificate.public_key().clone()).to_bytes() else {
            return Ok(self.refused());
        };
        let cert = skiff_proto::krl::CertificateRef {
            ca_key: &ca_blob,
            serial: certificate.serial(),
            key_id: certificate.key_id(),
        };
        if let Some(why) = self.rsa_too_small(&key_blob) {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(self.refused());
        }
        let revoked_keys = self.settings().revoked_keys.clone();
        if let Some(why) = revoked(revoked_keys, |list| {
            list.revokes_certificate(&key_blob, &cert)
        })
        .await
        {
            tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
            return Ok(self.refused());
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
            return Ok(self.refused());
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
                let key_type = certificate.algorithm();
                if let Some(why) = self.security_key_refusal(key_type.as_str(), &options, true) {
                    tracing::info!(%peer, user, id = certificate.key_id(), "certificate refused: {why}");
                    return Ok(self.refused());
                }
                tracing::debug!(%peer, user, id = certificate.key_id(), via = ?authority, "certificate admitted");
                let account = account.clone();
                Ok(self
                    .key_accepted(account, options, certificate.to_openssh(), key_blob)
                    .await)
            }
            Err(why) => {
                tracing::info!(%peer, user, "certificate refused: {why}");
                Ok(self.refused())
            }
        }
    }

    /// A key or certificate (OpenSSH form `openssh`, key `key_blob`) that
    /// passed every check: the login, or its next step.
    async fn key_accepted(
        &mut self,
        account: Account,
        options: KeyOptions,
        openssh: Result<String, russh::keys::ssh_key::Error>,
        key_blob: Vec<u8>,
    ) -> Auth {
        let credential = credential_line(openssh);
        self.logged_in(
            account,
            options,
            credential,
            Method::PublicKey,
            Some(key_blob),
        )
        .await
    }

    /// Judges a signed request with a plain public key.
    pub(super) async fn key_login(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, russh::Error> {
        let credential = key_credential(key.public_key);
        let auth = self.judge_key(user, key).await?;
        self.judged(user, auth_log::How::Key(&credential), &auth);
        Ok(auth)
    }

    async fn judge_key(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, russh::Error> {
        self.prepare_candidate(user).await;
        if let Some(why) = self.algorithm_refusal(user, &[key.algorithm.as_str()]) {
            tracing::info!(peer = %self.peer, user, "refusing the key: {why}");
            return Ok(self.refused());
        }
        let command_keys = self.command_keys(user, key.public_key).await;
        match self
            .admitting_entry(user, key.public_key, &command_keys)
            .await
        {
            Some((account, options)) => {
                if let Some(why) = self.security_key_refusal(key.algorithm.as_str(), &options, true)
                {
                    tracing::info!(peer = %self.peer, user, "key refused: {why}");
                    return Ok(self.refused());
                }
                let key_blob = key.public_key.to_bytes().unwrap_or_default();
                Ok(self
                    .key_accepted(account, options, key.public_key.to_openssh(), key_blob)
                    .await)
            }
            None => Ok(self.refused()),
        }
    }
}

/// How a plain key appears in sshd's log lines and the audit log.
fn key_credential(key: &PublicKey) -> auth_log::Credential {
    auth_log::Credential {
        key_type: auth_log::key_type(key.algorithm().as_str()),
        fingerprint: key.fingerprint(russh::keys::HashAlg::Sha256).to_string(),
        certificate: None,
    }
}

/// How a certificate appears there: its key's type and fingerprint, its
/// ID, serial and CA.
fn certificate_credential(certificate: &Certificate) -> auth_log::Credential {
    let key = PublicKey::from(certificate.public_key().clone());
    let ca = PublicKey::from(certificate.signature_key().clone());
    let sha256 = russh::keys::HashAlg::Sha256;
    auth_log::Credential {
        key_type: format!("{}-CERT", auth_log::key_type(key.algorithm().as_str())),
        fingerprint: key.fingerprint(sha256).to_string(),
        certificate: Some(crate::audit::CertificateInfo {
            key_id: certificate.key_id().to_string(),
            serial: certificate.serial(),
            ca_type: auth_log::key_type(ca.algorithm().as_str()),
            ca_fingerprint: ca.fingerprint(sha256).to_string(),
        }),
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
        other => vec![other.to_certificate_type()],
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

/// The methods a client may try next, as russh sends them.
fn method_set(methods: &[Method]) -> russh::MethodSet {
    let mut set = russh::MethodSet::empty();
    for m in methods {
        set.push(match m {
            Method::PublicKey => russh::MethodKind::PublicKey,
            Method::Password => russh::MethodKind::Password,
            Method::KeyboardInteractive => russh::MethodKind::KeyboardInteractive,
            Method::HostBased => russh::MethodKind::HostBased,
            Method::GssapiWithMic => russh::MethodKind::GssapiWithMic,
            Method::None => russh::MethodKind::None,
        });
    }
    set
}

/// The options a login authenticated by two keys runs under: whatever
/// either restricts stays restricted (`no-*` flags; `permitopen` and
/// `permitlisten` lists, where both have one, only what both allow); a
/// forced command may come from one key only, or the same from both;
/// `environment=` keeps the first value of each name.
fn merge_options(first: KeyOptions, next: KeyOptions) -> Result<KeyOptions, String> {
    let command = match (first.command, next.command) {
        (Some(a), Some(b)) if a != b => {
            return Err("the keys force different commands (command=)".into())
        }
        (a, b) => a.or(b),
    };
    let both = |a: Vec<String>, b: Vec<String>| match (a.is_empty(), b.is_empty()) {
        (true, _) => b,
        (_, true) => a,
        _ => a.into_iter().filter(|x| b.contains(x)).collect(),
    };
    // Both lists non-empty with nothing in common: nothing is allowed,
    // which an empty list would not say.
    let no_common = |a: &[String], b: &[String]| {
        !a.is_empty() && !b.is_empty() && !a.iter().any(|x| b.contains(x))
    };
    let no_open = no_common(&first.permit_open, &next.permit_open);
    let no_listen = no_common(&first.permit_listen, &next.permit_listen);
    let mut environment = first.environment;
    for (name, value) in next.environment {
        if !environment.iter().any(|(n, _)| *n == name) {
            environment.push((name, value));
        }
    }
    Ok(KeyOptions {
        command,
        from: first.from.or(next.from),
        environment,
        expiry_time: first.expiry_time.or(next.expiry_time),
        no_pty: first.no_pty || next.no_pty,
        no_port_forwarding: first.no_port_forwarding
            || next.no_port_forwarding
            || no_open
            || no_listen,
        no_agent_forwarding: first.no_agent_forwarding || next.no_agent_forwarding,
        no_x11_forwarding: first.no_x11_forwarding || next.no_x11_forwarding,
        no_user_rc: first.no_user_rc || next.no_user_rc,
        permit_open: both(first.permit_open, next.permit_open),
        permit_listen: both(first.permit_listen, next.permit_listen),
        principals: first.principals.or(next.principals),
        cert_authority: false,
        no_touch_required: first.no_touch_required && next.no_touch_required,
        verify_required: first.verify_required || next.verify_required,
        tunnel: first.tunnel.or(next.tunnel),
    })
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
/// the `RevokedKeys` files at `paths`: one lists it, or one cannot be read
/// (then no key may be used, as with sshd). Read at every check, off the
/// async workers ([`crate::account_files`]), so that a revocation takes
/// effect at once.
async fn revoked(
    paths: Vec<std::path::PathBuf>,
    is_revoked: impl Fn(&RevokedKeys) -> bool,
) -> Option<String> {
    for path in paths {
        if let Some(why) = revoked_in(&path, &is_revoked).await {
            return Some(why);
        }
    }
    None
}

/// [`revoked`] for one file.
async fn revoked_in(
    path: &std::path::Path,
    is_revoked: &impl Fn(&RevokedKeys) -> bool,
) -> Option<String> {
    use crate::account_files::{clip, read_server_file, REVOKED_KEYS_MAX_BYTES};
    let label = path.display().to_string();
    let bytes = match read_server_file(path, REVOKED_KEYS_MAX_BYTES).await {
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
    acct.group_names()
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
    fn security_keys_and_their_certificates_are_accepted_by_default() {
        let accepted = crate::config::Settings::default().pubkey_algorithms;
        for key in [Algorithm::SkEd25519, Algorithm::SkEcdsaSha2NistP256] {
            assert!(accepted.iter().any(|n| n == key.as_str()), "{key:?}");
            let cert = certificate_algorithms(key);
            assert!(cert[0].starts_with("sk-") && cert[0].ends_with("-cert-v01@openssh.com"));
            assert!(accepted.contains(&cert[0]), "{cert:?}");
        }
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
