//! User authentication: the methods in `PreferredAuthentications` order
//! (public keys, then keyboard-interactive and password from
//! [`crate::password_auth`]), and the error saying what was tried.
//!
//! Public keys: identities from ssh-agent and key files,
//! tried in OpenSSH's order, with passphrases read from the terminal or
//! SSH_ASKPASS (never under BatchMode), and only for a key the server has
//! accepted (a key file is offered by its public half). A key's user
//! certificates (its
//! `KEY-cert.pub`, a `CertificateFile`, or one the agent holds) are offered
//! just before the key itself. Security keys (FIDO, `sk-`) sign only
//! through ssh-agent: a security-key file the agent does not hold is not
//! offered, and the error says how to load it there.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::client::{AuthResult, Handle, Handler};
use russh::keys::agent::client::AgentClient;
use russh::keys::agent::AgentIdentity;
use russh::keys::signature::Signer as _;
use russh::keys::ssh_encoding::Encode;
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::private::KeypairData;
use russh::keys::ssh_key::public::KeyData;
use russh::keys::ssh_key::Signature;
use russh::keys::{Algorithm, Certificate, HashAlg, PrivateKey, PublicKey};
use russh::{MethodKind, MethodSet};

use crate::error::{ErrorKind, SkiffError};
use crate::identity_cache::Unusable;
use crate::password_auth::{self, Asking, AuthMethod};
use crate::settings::ConnectSettings;

/// What was tried and what the server answered, for the error that ends
/// authentication when no method completes it.
#[derive(Default)]
struct Attempts {
    /// The methods tried, in order.
    methods: Vec<AuthMethod>,
    /// What each method other than public keys came to ("password refused
    /// 3 times"), in order.
    outcomes: Vec<String>,
    /// The keys offered, in order.
    tried: Vec<String>,
    /// What the server accepted as one step of several (`partial success`:
    /// for instance `AuthenticationMethods publickey,publickey`).
    partial: Vec<String>,
    /// The methods the server last said may go on.
    remaining: Option<MethodSet>,
}

impl Attempts {
    fn trying(&mut self, method: AuthMethod) {
        if !self.methods.contains(&method) {
            self.methods.push(method);
        }
    }

    /// Whether the server takes `method` now (not known yet: it may).
    fn server_takes(&self, method: AuthMethod) -> bool {
        self.remaining
            .as_ref()
            .is_none_or(|m| m.contains(&method.kind()))
    }

    /// What a password or keyboard-interactive run came to.
    fn other_answered(
        &mut self,
        method: AuthMethod,
        answer: Option<(MethodSet, bool)>,
        note: String,
    ) {
        if let Some((remaining, partial)) = answer {
            self.remaining = Some(remaining);
            if partial {
                self.partial.push(method.name().to_string());
            }
        }
        if !note.is_empty() {
            self.outcomes.push(note);
        }
    }

    fn offering(&mut self, what: String) {
        self.tried.push(what);
    }

    /// The server refused (or partly accepted) what was offered last.
    fn answered(&mut self, remaining: MethodSet, partial_success: bool) {
        if partial_success {
            if let Some(last) = self.tried.last() {
                self.partial.push(last.clone());
            }
        }
        self.remaining = Some(remaining);
    }

    /// Whether offering another key can still help: not once the server
    /// has said public keys are no longer among the ways in.
    fn keys_may_go_on(&self) -> bool {
        self.remaining
            .as_ref()
            .is_none_or(|m| m.contains(&MethodKind::PublicKey))
    }

    /// What became of the keys offered; `passed_over`: some key was
    /// left out, with a note saying why.
    fn describe_keys(&self, passed_over: bool) -> String {
        let remaining = self.remaining_names();
        let keys_partial: Vec<&String> = self
            .partial
            .iter()
            .filter(|p| self.tried.contains(p))
            .collect();
        if !keys_partial.is_empty() {
            let others: Vec<&str> = self
                .tried
                .iter()
                .filter(|t| !self.partial.contains(t))
                .map(String::as_str)
                .collect();
            let mut msg = format!(
                "the server accepted {} as one step but requires more (it goes on with: {})",
                keys_partial
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                remaining.as_deref().unwrap_or("nothing")
            );
            if self.keys_may_go_on() {
                if others.is_empty() {
                    msg.push_str(", and skiff had no other key to offer");
                } else {
                    msg.push_str(&format!(
                        ", and accepted none of the other keys: {}",
                        others.join(", ")
                    ));
                }
            }
            return msg;
        }
        if !self.keys_may_go_on() {
            return format!(
                "the server takes no public key here (it takes: {})",
                remaining.as_deref().unwrap_or("other methods")
            );
        }
        if self.tried.is_empty() && passed_over {
            "no usable key".to_string()
        } else if self.tried.is_empty() {
            "no usable key (no ssh-agent keys, no readable identity files)".to_string()
        } else {
            format!("the server accepted none of: {}", self.tried.join(", "))
        }
    }

    /// The methods the server last said may go on, comma-separated.
    fn remaining_names(&self) -> Option<String> {
        self.remaining.as_ref().map(|m| {
            m.iter()
                .map(<&'static str>::from)
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The error's text after "authentication failed (METHODS): ": what
    /// each method tried came to, then why each other method the server
    /// takes was not tried (`untried`).
    fn describe(&self, untried: &[String], passed_over: bool) -> String {
        let mut parts = Vec::new();
        if self.methods.contains(&AuthMethod::PublicKey) {
            parts.push(self.describe_keys(passed_over));
        }
        let others_partial: Vec<&str> = self
            .partial
            .iter()
            .filter(|p| !self.tried.contains(p))
            .map(String::as_str)
            .collect();
        if !others_partial.is_empty() {
            parts.push(format!(
                "the server accepted {} as one step but requires more (it goes on with: {})",
                others_partial.join(", "),
                self.remaining_names().as_deref().unwrap_or("nothing")
            ));
        }
        parts.extend(self.outcomes.iter().cloned());
        if self.methods.is_empty() {
            parts.push(match self.remaining_names() {
                Some(r) => format!("nothing to try (the server takes: {r})"),
                None => "nothing to try".to_string(),
            });
        }
        parts.extend(untried.iter().cloned());
        parts.join("; ")
    }
}

/// Why skiff passes over a method of `PreferredAuthentications`, whatever
/// the server says: the one place that decides it, for trying and for the
/// error.
fn passed_over(method: AuthMethod, settings: &ConnectSettings, asking: Asking) -> Option<String> {
    let (enabled, keyword) = match method {
        AuthMethod::PublicKey => (settings.pubkey_authentication, "PubkeyAuthentication"),
        AuthMethod::KeyboardInteractive => (
            settings.kbd_interactive_authentication,
            "KbdInteractiveAuthentication",
        ),
        AuthMethod::Password => (settings.password_authentication, "PasswordAuthentication"),
    };
    if !enabled {
        return Some(format!("{keyword} is off for this host"));
    }
    if method == AuthMethod::PublicKey {
        return None;
    }
    if settings.host_key_mismatched {
        return Some(
            "not sent to a host whose key is not the one known for it \
             (StrictHostKeyChecking no let it through)"
                .to_string(),
        );
    }
    if let Some(why) = asking.why_not() {
        return Some(why.to_string());
    }
    (settings.number_of_password_prompts == 0).then(|| "NumberOfPasswordPrompts is 0".to_string())
}

/// Why `name`, a method the server takes, was not tried; `None` if
/// nothing kept skiff from it.
fn why_not_tried(name: &str, settings: &ConnectSettings, asking: Asking) -> Option<String> {
    let Some(method) = password_auth::method_order(Some(&[name.to_string()]))
        .first()
        .copied()
    else {
        return Some(format!("{name}: skiff does not do this method"));
    };
    if let Some(why) = passed_over(method, settings, asking) {
        return Some(format!("{name}: {why}"));
    }
    (!settings.preferred_authentications.contains(&method))
        .then(|| format!("{name}: not in PreferredAuthentications"))
}

/// Asks the server which methods it takes (the `none` method, as ssh
/// starts with), into `attempts`. `Ok(true)`: it takes none at all, and
/// the user is in.
async fn ask_what_the_server_takes<H: Handler>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
    attempts: &mut Attempts,
) -> Result<bool, SkiffError> {
    match handle.authenticate_none(&settings.user).await {
        Ok(AuthResult::Success) => Ok(true),
        Ok(AuthResult::Failure {
            remaining_methods, ..
        }) => {
            attempts.remaining = Some(remaining_methods);
            Ok(false)
        }
        Err(e) => Err(SkiffError::new(
            ErrorKind::Connect,
            format!(
                "{}: connection lost during authentication: {e}",
                settings.hostname
            ),
        )),
    }
}

/// Authenticates `handle` as `settings.user` with the methods of
/// `PreferredAuthentications` in order, each while the server takes it,
/// or explains what was tried.
pub async fn authenticate<H: Handler>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
) -> Result<(), SkiffError> {
    let asking = password_auth::asking(settings.batch_mode, settings.fan_out);
    let mut attempts = Attempts::default();
    let mut notes = Vec::new();
    // Set when a method was passed over only because nobody may answer.
    let mut needs_person = false;
    for &method in &settings.preferred_authentications {
        if passed_over(method, settings, asking).is_some() {
            continue;
        }
        if method != AuthMethod::PublicKey && attempts.remaining.is_none() {
            // Asks the server what it takes before asking a person anything.
            if ask_what_the_server_takes(handle, settings, &mut attempts).await? {
                return Ok(());
            }
        }
        if !attempts.server_takes(method) {
            continue;
        }
        tracing::debug!("{}: trying {}", settings.hostname, method.name());
        attempts.trying(method);
        let outcome = match method {
            AuthMethod::PublicKey => {
                if publickey(
                    handle,
                    settings,
                    &mut attempts,
                    &mut notes,
                    &mut needs_person,
                )
                .await?
                {
                    return Ok(());
                }
                continue;
            }
            AuthMethod::Password => password_auth::password(handle, settings).await?,
            AuthMethod::KeyboardInteractive => {
                password_auth::keyboard_interactive(handle, settings).await?
            }
        };
        match outcome {
            password_auth::Outcome::Success => return Ok(()),
            password_auth::Outcome::Failed { answer, note } => {
                attempts.other_answered(method, answer, note)
            }
        }
    }
    if attempts.remaining.is_none()
        && !handle.is_closed()
        && ask_what_the_server_takes(handle, settings, &mut attempts).await?
    {
        // No method was tried (no key at all), and the server wants none.
        return Ok(());
    }
    let untried: Vec<String> = attempts
        .remaining
        .iter()
        .flat_map(|m| m.iter())
        .map(<&'static str>::from)
        .filter(|name| !attempts.methods.iter().any(|m| m.name() == *name))
        .filter_map(|name| why_not_tried(name, settings, asking))
        .collect();
    if asking == Asking::BatchMode && attempts.remaining.is_some() {
        // A method the server takes that only BatchMode passed over: a
        // person could answer it (the agent hands such a login back).
        needs_person |= settings.preferred_authentications.iter().any(|&m| {
            m != AuthMethod::PublicKey
                && attempts.server_takes(m)
                && passed_over(m, settings, Asking::Person).is_none()
        });
    }
    let tried: Vec<&str> = attempts.methods.iter().map(|m| m.name()).collect();
    let mut msg = if tried.is_empty() {
        format!(
            "{}@{}: authentication failed: ",
            settings.user, settings.hostname
        )
    } else {
        format!(
            "{}@{}: authentication failed ({}): ",
            settings.user,
            settings.hostname,
            tried.join(",")
        )
    };
    msg.push_str(&attempts.describe(&untried, !notes.is_empty()));
    for n in &notes {
        msg.push_str("; ");
        msg.push_str(n);
    }
    // Where no key was offered for a reason given, the reason says it all.
    let only_passed_over = attempts.tried.is_empty() && !notes.is_empty();
    if attempts.methods == [AuthMethod::PublicKey] && !only_passed_over {
        msg.push_str("; check the key is in the account's authorized_keys, or pass -i KEY");
    }
    let err = SkiffError::new(ErrorKind::Auth, msg);
    Err(if needs_person {
        err.needing_person()
    } else {
        err
    })
}

/// One thing to try, in order.
enum Candidate {
    Agent(PublicKey),
    File { path: PathBuf },
}

/// A key file's public half, read from `KEY.pub`, else from the key file
/// itself: an OpenSSH key keeps it in the clear even when the private half
/// is encrypted; an older (PEM) key must be unencrypted to give it.
fn read_file_public_key(path: &Path) -> Option<PublicKey> {
    let mut pub_path = path.as_os_str().to_owned();
    pub_path.push(".pub");
    if let Ok(text) = std::fs::read_to_string(&pub_path) {
        if let Ok(k) = PublicKey::from_openssh(text.trim()) {
            return Some(k);
        }
    }
    let text = std::fs::read_to_string(path).ok()?;
    let in_container = skiff_proto::openssh_key::armored_body(&text).and_then(|bytes| {
        let blob = skiff_proto::openssh_key::parse(&bytes)?.public_key;
        PublicKey::from_bytes(blob).ok()
    });
    in_container.or_else(|| {
        crate::private_key::decode(&text, None)
            .ok()
            .map(|k| k.public_key().clone())
    })
}

/// [`read_file_public_key`], through the settings' cache when they have one.
async fn file_public_key(path: &Path, settings: &ConnectSettings) -> Option<PublicKey> {
    match &settings.identity_cache {
        Some(cache) => cache.public_key(path, || read_file_public_key(path)).await,
        None => read_file_public_key(path),
    }
}

/// A user certificate and where it came from, for messages.
struct UserCertificate {
    cert: Certificate,
    from: String,
    /// ssh-agent holds the certificate itself (it signs by it), rather than
    /// a file naming it.
    in_agent: bool,
}

/// Reads an OpenSSH certificate file. `Ok(None)`: no such file.
fn read_certificate(path: &Path) -> Result<Option<Certificate>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    match Certificate::from_openssh(text.trim()) {
        Ok(c) if c.cert_type() == CertType::User => Ok(Some(c)),
        Ok(_) => Err(format!(
            "{} is a host certificate, not a user certificate",
            path.display()
        )),
        Err(e) => Err(format!(
            "{} is not an OpenSSH certificate: {e}",
            path.display()
        )),
    }
}

/// [`load_private_key`], through the settings' cache when they have one.
///
/// In a fan-out that may ask for a passphrase, the load runs on a blocking
/// thread, so that the hosts sharing this runtime thread keep going while a
/// person types, and its time is kept on the cache's person clock.
async fn private_key(
    path: &Path,
    settings: &ConnectSettings,
) -> Result<Option<Arc<PrivateKey>>, Unusable> {
    let batch_mode = settings.batch_mode;
    let Some(cache) = &settings.identity_cache else {
        return load_private_key(path, batch_mode);
    };
    let load = || async {
        if batch_mode || !settings.fan_out {
            return load_private_key(path, batch_mode);
        }
        let (owned, clock_owner) = (path.to_path_buf(), cache.clone());
        tokio::task::spawn_blocking(move || {
            let _waiting = clock_owner.person().waiting();
            load_private_key(&owned, false)
        })
        .await
        .unwrap_or_else(|e| Err(format!("{}: loading failed: {e}", path.display()).into()))
    };
    cache.key(path, batch_mode, load).await
}

/// [`read_certificate`], through the settings' cache when they have one.
async fn certificate(
    path: &Path,
    settings: &ConnectSettings,
) -> Result<Option<Certificate>, String> {
    match &settings.identity_cache {
        Some(cache) => cache.certificate(path, || read_certificate(path)).await,
        None => read_certificate(path),
    }
}

/// `KEY-cert.pub`, beside a key file.
fn certificate_beside(key_path: &Path) -> PathBuf {
    let mut p = key_path.as_os_str().to_owned();
    p.push("-cert.pub");
    PathBuf::from(p)
}

/// The certificates in `pool` for `key`, in order.
fn certificates_for<'a>(
    pool: &'a [UserCertificate],
    key: &'a KeyData,
) -> impl Iterator<Item = &'a UserCertificate> {
    pool.iter().filter(move |c| c.cert.public_key() == key)
}

/// Signs user-authentication requests with a key file's private key, as
/// russh asks a signer (as it asks ssh-agent) once the server has accepted
/// the public key offered: the request followed by the signature as an SSH
/// string. The private key is loaded, and its passphrase asked for, only
/// then, as ssh does: a key the server refuses costs no question.
struct FileSigner<'a> {
    path: &'a Path,
    settings: &'a ConnectSettings,
    /// The public key offered, which the private key must match.
    offered: KeyData,
    loaded: Option<Arc<PrivateKey>>,
    /// Why the private key could not be loaded, once tried.
    unusable: Option<Unusable>,
}

#[derive(Debug, thiserror::Error)]
enum FileSignError {
    #[error("the connection is gone")]
    Send(#[from] russh::SendError),
    #[error("{0}")]
    Unusable(String),
    #[error("cannot sign: {0}")]
    Sign(#[from] russh::keys::signature::Error),
    #[error("cannot encode the signature: {0}")]
    Encoding(#[from] russh::keys::ssh_encoding::Error),
}

impl FileSigner<'_> {
    /// The private key, loaded on first use.
    async fn key(&mut self) -> Result<Arc<PrivateKey>, FileSignError> {
        if let Some(key) = &self.loaded {
            return Ok(key.clone());
        }
        if let Some(failure) = &self.unusable {
            return Err(FileSignError::Unusable(failure.note.clone()));
        }
        let failure = match private_key(self.path, self.settings).await {
            Ok(Some(key)) if key.public_key().key_data() == &self.offered => {
                self.loaded = Some(key.clone());
                return Ok(key);
            }
            Ok(Some(_)) => Unusable::from(format!(
                "{}: the private key does not match its public key ({}.pub)",
                self.path.display(),
                self.path.display()
            )),
            Ok(None) => Unusable::from(format!("{} is gone", self.path.display())),
            Err(unusable) => unusable,
        };
        let error = FileSignError::Unusable(failure.note.clone());
        self.unusable = Some(failure);
        Err(error)
    }
}

impl russh::Signer for FileSigner<'_> {
    type Error = FileSignError;

    async fn auth_sign(
        &mut self,
        _key: &AgentIdentity,
        hash_alg: Option<HashAlg>,
        mut to_sign: Vec<u8>,
    ) -> Result<Vec<u8>, Self::Error> {
        let key = self.key().await?;
        let signature: Signature = match key.key_data() {
            // RSA signs with the SHA-2 hash the server accepts.
            KeypairData::Rsa(rsa) => (rsa, hash_alg).try_sign(&to_sign)?,
            _ => key.try_sign(&to_sign)?,
        };
        signature.encode_vec()?.encode(&mut to_sign)?;
        Ok(to_sign)
    }
}

/// Signs a certificate's authentication request with the agent's key for
/// it, asking the agent by the certified public key (as ssh does), so that
/// a `CertificateFile` works when only its private key is in the agent: an
/// agent asked by the certificate signs only if it holds the certificate.
struct CertifiedKeySigner<'a>(&'a mut AgentClient<tokio::net::UnixStream>);

#[derive(Debug, thiserror::Error)]
enum AgentSignError {
    #[error("the connection is gone")]
    Send(#[from] russh::SendError),
    #[error("ssh-agent could not sign: {0}")]
    Agent(#[from] russh::keys::Error),
}

impl russh::Signer for CertifiedKeySigner<'_> {
    type Error = AgentSignError;

    async fn auth_sign(
        &mut self,
        key: &AgentIdentity,
        hash_alg: Option<HashAlg>,
        to_sign: Vec<u8>,
    ) -> Result<Vec<u8>, Self::Error> {
        let plain = match key {
            AgentIdentity::Certificate {
                certificate,
                comment,
            } => AgentIdentity::PublicKey {
                key: PublicKey::from(certificate.public_key().clone()),
                comment: comment.clone(),
            },
            other => other.clone(),
        };
        Ok(self.0.sign_request(&plain, hash_alg, to_sign).await?)
    }
}

/// Whether keys of `alg` are security keys (FIDO, `sk-`), which only their
/// authenticator can sign with.
fn is_security_key(alg: &Algorithm) -> bool {
    matches!(alg, Algorithm::SkEd25519 | Algorithm::SkEcdsaSha2NistP256)
}

/// What to do with the security-key file at `path` that ssh-agent does not
/// hold: load it there (with the configured `SecurityKeyProvider`).
fn security_key_file_note(path: &Path, provider: Option<&str>) -> String {
    let provider = provider.map(|p| format!("-S {p} ")).unwrap_or_default();
    format!(
        "{} is a security-key (FIDO) key, which skiff signs with only through ssh-agent: \
         load it there with `ssh-add {provider}{}`",
        path.display(),
        path.display()
    )
}

/// Offers `cert` for `settings.user`, signing with `signer`. `Ok(true)`:
/// authenticated. Errors are notes for the summary.
async fn offer_certificate<H: Handler, S: russh::Signer>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
    cert: &UserCertificate,
    hash: Option<HashAlg>,
    signer: &mut S,
    attempts: &mut Attempts,
) -> Result<bool, String>
where
    S::Error: std::fmt::Display,
{
    attempts.offering(format!(
        "certificate {:?} ({})",
        cert.cert.key_id(),
        cert.from
    ));
    match handle
        .authenticate_certificate_with(&settings.user, cert.cert.clone(), hash, signer)
        .await
    {
        Ok(AuthResult::Success) => Ok(true),
        Ok(AuthResult::Failure {
            remaining_methods,
            partial_success,
        }) => {
            attempts.answered(remaining_methods, partial_success);
            Ok(false)
        }
        Err(e) => Err(format!("certificate {:?}: {e}", cert.cert.key_id())),
    }
}

/// Public-key authentication as `settings.user`: `Ok(true)` once logged
/// in; `Ok(false)` when no key did it, with what was offered in `attempts`
/// and `notes`, and `needs_person` set when a key was skipped only because
/// nobody may type its passphrase.
async fn publickey<H: Handler>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
    attempts: &mut Attempts,
    notes: &mut Vec<String>,
    needs_person: &mut bool,
) -> Result<bool, SkiffError> {
    let mut agent = match &settings.identity_agent {
        Some(sock) => match AgentClient::connect_uds(sock).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::debug!("cannot use ssh-agent at {}: {e}", sock.display());
                None
            }
        },
        None => None,
    };
    let agent_ids = match agent.as_mut() {
        Some(a) => a.request_identities().await.unwrap_or_default(),
        None => Vec::new(),
    };
    let mut agent_keys: Vec<PublicKey> = Vec::new();
    // Certificates configured, then those the agent holds: offered with
    // the key they certify, after that key's own `KEY-cert.pub`.
    let mut certificates = Vec::new();
    for path in &settings.certificate_files {
        match certificate(path, settings).await {
            Ok(Some(cert)) => certificates.push(UserCertificate {
                cert,
                from: path.display().to_string(),
                in_agent: false,
            }),
            Ok(None) => notes.push(format!("certificate file {} not found", path.display())),
            Err(note) => notes.push(note),
        }
    }
    for id in agent_ids {
        match id {
            AgentIdentity::PublicKey { key, .. } => agent_keys.push(key),
            AgentIdentity::Certificate { certificate, .. } => {
                if certificate.cert_type() == CertType::User {
                    certificates.push(UserCertificate {
                        cert: certificate,
                        from: "ssh-agent".to_string(),
                        in_agent: true,
                    });
                }
            }
        }
    }

    // OpenSSH order: configured identities the agent holds (in config order),
    // then the agent's other keys (unless IdentitiesOnly), then key files.
    let mut candidates = Vec::new();
    let mut files_left = Vec::new();
    for path in &settings.identity_files {
        // A file's public half matters only to match it with an agent key;
        // without agent keys, skip reading (or decoding) it on every connect.
        let public = if agent_keys.is_empty() {
            None
        } else {
            file_public_key(path, settings).await
        };
        match public {
            Some(pk) if agent_keys.iter().any(|a| a.key_data() == pk.key_data()) => {
                candidates.push(Candidate::Agent(pk))
            }
            _ => files_left.push(path.clone()),
        }
    }
    if !settings.identities_only {
        for k in &agent_keys {
            let already = candidates
                .iter()
                .any(|c| matches!(c, Candidate::Agent(p) if p.key_data() == k.key_data()));
            if !already {
                candidates.push(Candidate::Agent(k.clone()));
            }
        }
    }
    candidates.extend(files_left.into_iter().map(|path| Candidate::File { path }));

    // Learnt on the first RSA key only: asking waits for the server's
    // extension info, a round trip that other keys do not need.
    let mut rsa_hash = None;
    for cand in candidates {
        if !attempts.keys_may_go_on() {
            break;
        }
        match cand {
            Candidate::Agent(key) => {
                let Some(agent) = agent.as_mut() else {
                    continue;
                };
                if let Some(why) = rsa_too_small(settings, &key) {
                    notes.push(format!(
                        "agent key {}: {why}",
                        key.fingerprint(HashAlg::Sha256)
                    ));
                    continue;
                }
                let hash = match signature_hash(&key.algorithm(), &mut rsa_hash, handle).await {
                    Ok(h) => h,
                    Err(why) => {
                        notes.push(format!(
                            "agent key {}: {why}",
                            key.fingerprint(HashAlg::Sha256)
                        ));
                        continue;
                    }
                };
                for cert in certificates_for(&certificates, key.key_data()) {
                    let offered = match cert.in_agent {
                        // The agent holds the certificate: it signs by it.
                        true => {
                            offer_certificate(handle, settings, cert, hash, agent, attempts).await
                        }
                        false => {
                            let mut signer = CertifiedKeySigner(&mut *agent);
                            offer_certificate(handle, settings, cert, hash, &mut signer, attempts)
                                .await
                        }
                    };
                    match offered {
                        Ok(true) => return Ok(true),
                        Ok(false) => {}
                        Err(note) => notes.push(note),
                    }
                }
                if !attempts.keys_may_go_on() {
                    break;
                }
                attempts.offering(format!("agent key {}", key.fingerprint(HashAlg::Sha256)));
                match handle
                    .authenticate_publickey_with(&settings.user, key.clone(), hash, agent)
                    .await
                {
                    Ok(AuthResult::Success) => return Ok(true),
                    Ok(AuthResult::Failure {
                        remaining_methods,
                        partial_success,
                    }) => attempts.answered(remaining_methods, partial_success),
                    Err(e) => notes.push(format!("ssh-agent could not sign: {e}")),
                }
            }
            Candidate::File { path } => {
                // Offered by its public half; the private half is loaded
                // when the server accepts it. A key whose public half cannot
                // be read without decrypting it (an encrypted PEM key) is
                // loaded first.
                let (public, loaded) = match file_public_key(&path, settings).await {
                    Some(public) => (public, None),
                    None => match private_key(&path, settings).await {
                        Ok(Some(k)) => (k.public_key().clone(), Some(k)),
                        Ok(None) => continue,
                        Err(unusable) => {
                            *needs_person |= unusable.needs_person;
                            notes.push(unusable.note);
                            continue;
                        }
                    },
                };
                if let Some(why) = rsa_too_small(settings, &public) {
                    notes.push(format!("{}: {why}", path.display()));
                    continue;
                }
                if is_security_key(&public.algorithm()) {
                    // Only the agent (through its FIDO middleware) can sign
                    // with it: not offered, so nobody is asked to touch a
                    // key for nothing.
                    notes.push(security_key_file_note(
                        &path,
                        settings.security_key_provider.as_deref(),
                    ));
                    continue;
                }
                let hash = match signature_hash(&public.algorithm(), &mut rsa_hash, handle).await {
                    Ok(h) => h,
                    Err(why) => {
                        notes.push(format!("{}: {why}", path.display()));
                        continue;
                    }
                };
                let beside_path = certificate_beside(&path);
                let beside = match certificate(&beside_path, settings).await {
                    Ok(found) => found.map(|cert| UserCertificate {
                        cert,
                        from: beside_path.display().to_string(),
                        in_agent: false,
                    }),
                    Err(note) => {
                        notes.push(note);
                        None
                    }
                };
                let offered = public.key_data().clone();
                let mut signer = FileSigner {
                    path: &path,
                    settings,
                    offered: offered.clone(),
                    loaded,
                    unusable: None,
                };
                for cert in beside
                    .iter()
                    .filter(|c| c.cert.public_key() == &offered)
                    .chain(certificates_for(&certificates, &offered))
                {
                    match offer_certificate(handle, settings, cert, hash, &mut signer, attempts)
                        .await
                    {
                        Ok(true) => return Ok(true),
                        Ok(false) => {}
                        Err(note) => notes.push(note),
                    }
                }
                if !attempts.keys_may_go_on() {
                    break;
                }
                attempts.offering(path.display().to_string());
                match handle
                    .authenticate_publickey_with(&settings.user, public, hash, &mut signer)
                    .await
                {
                    Ok(AuthResult::Success) => {
                        if let Some(key) = &signer.loaded {
                            add_to_agent(settings, agent.as_mut(), key, &path).await;
                        }
                        return Ok(true);
                    }
                    Ok(AuthResult::Failure {
                        remaining_methods,
                        partial_success,
                    }) => attempts.answered(remaining_methods, partial_success),
                    Err(FileSignError::Send(e)) => {
                        return Err(SkiffError::new(
                            ErrorKind::Connect,
                            format!(
                                "{}: connection lost during authentication: {e}",
                                settings.hostname
                            ),
                        ))
                    }
                    Err(e) => notes.push(format!("{}: {e}", path.display())),
                }
                if let Some(unusable) = &signer.unusable {
                    *needs_person |= unusable.needs_person;
                }
            }
        }
    }
    Ok(false)
}

/// `AddKeysToAgent`: hands `key`, read from `path`, to ssh-agent once it
/// has signed in, with the configured constraints. Without an agent there
/// is nothing to do; a failure is only a note.
async fn add_to_agent(
    settings: &ConnectSettings,
    agent: Option<&mut AgentClient<tokio::net::UnixStream>>,
    key: &PrivateKey,
    path: &Path,
) {
    use skiff_proto::ssh_config::AddKeysToAgent;
    let (confirm, lifetime) = match settings.add_keys_to_agent {
        AddKeysToAgent::No => return,
        AddKeysToAgent::Ask => {
            tracing::info!(
                "AddKeysToAgent ask: skiff does not ask; {} was not added to ssh-agent",
                path.display()
            );
            return;
        }
        AddKeysToAgent::Yes { confirm, lifetime } => (confirm, lifetime),
    };
    let Some(agent) = agent else {
        tracing::debug!("AddKeysToAgent: no ssh-agent to add {} to", path.display());
        return;
    };
    let mut constraints = Vec::new();
    if confirm {
        constraints.push(russh::keys::agent::Constraint::Confirm);
    }
    if let Some(seconds) = lifetime {
        constraints.push(russh::keys::agent::Constraint::KeyLifetime { seconds });
    }
    match agent.add_identity(key, &constraints).await {
        Ok(()) => tracing::debug!("added {} to ssh-agent", path.display()),
        Err(e) => tracing::warn!("cannot add {} to ssh-agent: {e}", path.display()),
    }
}

/// The hash to sign with for a key of this algorithm (only RSA has a choice),
/// or why the key cannot be used with this server. `rsa_hash` remembers the
/// server's answer once asked.
/// Why an RSA key is too small to offer under `RequiredRSASize`.
fn rsa_too_small(settings: &ConnectSettings, key: &PublicKey) -> Option<String> {
    let bits = skiff_proto::known_hosts::rsa_modulus_bits(&key.to_bytes().ok()?)?;
    (bits < settings.required_rsa_size).then(|| {
        format!(
            "RSA key of {bits} bits, fewer than RequiredRSASize ({}); not offered",
            settings.required_rsa_size
        )
    })
}

async fn signature_hash<H: Handler>(
    alg: &Algorithm,
    rsa_hash: &mut Option<Option<HashAlg>>,
    handle: &Handle<H>,
) -> Result<Option<HashAlg>, &'static str> {
    if !matches!(alg, Algorithm::Rsa { .. }) {
        return Ok(None);
    }
    let accepted = match *rsa_hash {
        Some(h) => h,
        None => {
            // RSA keys sign with SHA-2. A server that announces only
            // `ssh-rsa` (SHA-1) gets no RSA attempt at all; one that
            // announces nothing gets rsa-sha2-512.
            let h = match handle.best_supported_rsa_hash().await {
                Ok(Some(h)) => h,
                _ => Some(HashAlg::Sha512),
            };
            *rsa_hash = Some(h);
            h
        }
    };
    hash_for(alg, accepted)
}

/// The hash to sign with for a key of this algorithm, given the SHA-2 hash
/// the server accepts for RSA (if any), or why the key cannot be used.
fn hash_for(alg: &Algorithm, rsa_hash: Option<HashAlg>) -> Result<Option<HashAlg>, &'static str> {
    match alg {
        Algorithm::Rsa { .. } => rsa_hash
            .map(Some)
            .ok_or("RSA key not tried: the server accepts RSA only with SHA-1 signatures"),
        _ => Ok(None),
    }
}

/// Loads a private key file. `Ok(None)`: the file does not exist (a default
/// identity). `Err`: it cannot be used, with the reason for the summary.
fn load_private_key(path: &Path, batch_mode: bool) -> Result<Option<Arc<PrivateKey>>, Unusable> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !is_default_identity(path) {
                eprintln!(
                    "skiff: warning: identity file {} not accessible: no such file",
                    path.display()
                );
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display()).into()),
    };
    match crate::private_key::decode(&text, None) {
        Ok(k) => return Ok(Some(Arc::new(k))),
        Err(russh::keys::Error::KeyIsEncrypted) => {}
        Err(e) => {
            return Err(format!("{} is not a usable private key: {e}", path.display()).into())
        }
    }
    if batch_mode {
        return Err(Unusable {
            note: format!(
                "{} needs a passphrase and BatchMode is on (add it to ssh-agent with ssh-add)",
                path.display()
            ),
            needs_person: true,
        });
    }
    // One prompt at a time: connections of a fan-out may need two keys at once.
    static PROMPTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = PROMPTING.lock().unwrap_or_else(|p| p.into_inner());
    crate::prompt_screen::while_prompting(|| ask_and_decode(path, &text))
}

/// Asks for the passphrase of the encrypted key `text` (read from `path`)
/// up to three times.
fn ask_and_decode(path: &Path, text: &str) -> Result<Option<Arc<PrivateKey>>, Unusable> {
    for attempt in 0..3 {
        let prompt = format!("Enter passphrase for key '{}': ", path.display());
        let pass = match read_passphrase(&prompt) {
            Ok(p) => p,
            Err(e) => {
                return Err(format!(
                    "{} needs a passphrase and none could be read: {e}",
                    path.display()
                )
                .into())
            }
        };
        if pass.is_empty() && attempt == 0 {
            // An empty answer skips the key, as ssh does.
            return Ok(None);
        }
        match crate::private_key::decode(text, Some(pass.as_str())) {
            Ok(k) => return Ok(Some(Arc::new(k))),
            Err(_) => eprintln!("Bad passphrase, try again for {}", path.display()),
        }
    }
    Err(format!("wrong passphrase for {}", path.display()).into())
}

fn is_default_identity(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let in_ssh_dir = path
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == ".ssh");
    in_ssh_dir
        && [
            "id_rsa",
            "id_ecdsa",
            "id_ecdsa_sk",
            "id_ed25519",
            "id_ed25519_sk",
        ]
        .contains(&name)
}

/// Reads a passphrase, on the terminal or through SSH_ASKPASS as
/// [`password_auth::ask`] decides.
fn read_passphrase(prompt: &str) -> std::io::Result<zeroize::Zeroizing<String>> {
    password_auth::ask(prompt, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsa_never_signs_with_sha1() {
        let rsa = Algorithm::Rsa { hash: None };
        assert_eq!(
            hash_for(&rsa, Some(HashAlg::Sha512)),
            Ok(Some(HashAlg::Sha512))
        );
        assert!(hash_for(&rsa, None).is_err());
        assert_eq!(hash_for(&Algorithm::Ed25519, None), Ok(None));
    }

    #[test]
    fn security_key_files_say_to_use_the_agent() {
        assert!(is_security_key(&Algorithm::SkEd25519));
        assert!(is_security_key(&Algorithm::SkEcdsaSha2NistP256));
        assert!(!is_security_key(&Algorithm::Ed25519));
        let plain = security_key_file_note(Path::new("/h/.ssh/id_ed25519_sk"), None);
        assert!(plain.contains("`ssh-add /h/.ssh/id_ed25519_sk`"), "{plain}");
        let with = security_key_file_note(Path::new("k"), Some("/usr/lib/sk.so"));
        assert!(with.contains("`ssh-add -S /usr/lib/sk.so k`"), "{with}");
    }

    #[test]
    fn default_identities_are_recognised() {
        assert!(is_default_identity(Path::new("/home/u/.ssh/id_ed25519")));
        assert!(!is_default_identity(Path::new("/home/u/keys/id_ed25519")));
        assert!(!is_default_identity(Path::new("/home/u/.ssh/deploy")));
    }

    fn methods(names: &[MethodKind]) -> MethodSet {
        MethodSet::from(names)
    }

    #[test]
    fn attempts_say_what_the_server_answered() {
        let mut a = Attempts::default();
        a.trying(AuthMethod::PublicKey);
        assert_eq!(
            a.describe(&[], false),
            "no usable key (no ssh-agent keys, no readable identity files)"
        );
        a.offering("k1".into());
        a.answered(methods(&[MethodKind::PublicKey]), false);
        assert_eq!(a.describe(&[], false), "the server accepted none of: k1");

        // A first step accepted, nothing else to offer.
        let mut a = Attempts::default();
        a.trying(AuthMethod::PublicKey);
        a.offering("k1".into());
        a.answered(methods(&[MethodKind::PublicKey]), true);
        assert!(a.keys_may_go_on());
        assert_eq!(
            a.describe(&[], false),
            "the server accepted k1 as one step but requires more (it goes on with: publickey), and skiff had no other key to offer"
        );
        a.offering("k2".into());
        a.answered(methods(&[MethodKind::PublicKey]), false);
        assert!(a
            .describe(&[], false)
            .ends_with("accepted none of the other keys: k2"));

        // A first step accepted, the next one a password refused.
        let mut a = Attempts::default();
        a.trying(AuthMethod::PublicKey);
        a.offering("k1".into());
        a.answered(methods(&[MethodKind::Password]), true);
        assert!(!a.keys_may_go_on());
        assert!(a.server_takes(AuthMethod::Password));
        assert!(!a.server_takes(AuthMethod::KeyboardInteractive));
        a.trying(AuthMethod::Password);
        a.other_answered(
            AuthMethod::Password,
            Some((methods(&[MethodKind::Password]), false)),
            "password refused 3 times".into(),
        );
        assert_eq!(
            a.describe(&[], false),
            "the server accepted k1 as one step but requires more (it goes on with: password); password refused 3 times"
        );

        // A server that takes no keys at all, and a password nobody was
        // asked for.
        let mut a = Attempts::default();
        a.trying(AuthMethod::PublicKey);
        a.offering("k1".into());
        a.answered(methods(&[MethodKind::Password]), false);
        assert_eq!(
            a.describe(&["password: BatchMode is on".into()], false),
            "the server takes no public key here (it takes: password); password: BatchMode is on"
        );

        // Nothing tried at all.
        let a = Attempts {
            remaining: Some(methods(&[MethodKind::PublicKey])),
            ..Default::default()
        };
        assert_eq!(
            a.describe(&["publickey: PubkeyAuthentication is off for this host".into()], false),
            "nothing to try (the server takes: publickey); publickey: PubkeyAuthentication is off for this host"
        );
    }
}
