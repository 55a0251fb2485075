//! `UpdateHostKeys`: learning the host keys an OpenSSH server announces after
//! authentication (`hostkeys-00@openssh.com`), once it has proven it holds
//! the new ones (`hostkeys-prove-00@openssh.com`), and recording them in the
//! user's known_hosts; keys it no longer announces are taken out.
//!
//! What to change is decided in [`skiff_proto::known_hosts::update`]; this
//! module does the I/O: reading the user files afresh, asking for and
//! checking the proof's signatures, and replacing a file atomically (a
//! private temporary file beside it, synced, then renamed over it).
//!
//! Only a connection whose host key was found, as a plain key, in a user
//! known_hosts file before this connection takes part (see
//! [`crate::hostkeys::KnownHosts::known_in_user_file`]); the global files are
//! never written.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use russh::keys::signature::Verifier;
use russh::keys::ssh_key::Signature;
use russh::keys::PublicKey;
use skiff_proto::known_hosts::update::{self as plan_update, ProofAlgorithm, Skip};
use skiff_proto::known_hosts::{self, blob_key_type};
use skiff_proto::ssh_config::UpdateHostKeys;

use crate::hostkeys::{FileStamp, KnownHosts};
use crate::settings::ConnectSettings;

/// How long the end of a command waits for an update in flight (the
/// server's proof, then the file written) before leaving it.
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// One connection's part in `UpdateHostKeys`, kept by its handler.
pub(crate) struct Updater {
    /// Whether the host key of this connection earns an update (set when it
    /// is verified).
    trusted: bool,
    /// The server already announced its keys (it may do so once).
    announced: bool,
    /// The session identifier the proof's signatures cover, set once the
    /// key exchange is done.
    session_id: Arc<OnceLock<Vec<u8>>>,
    /// True while an update is in flight.
    busy: Arc<tokio::sync::watch::Sender<bool>>,
}

/// What a [`crate::Connection`] keeps to wait for an update in flight.
#[derive(Clone)]
pub(crate) struct Settled(tokio::sync::watch::Receiver<bool>);

impl Settled {
    /// Returns once no update is in flight, or after [`SETTLE_WAIT`].
    pub(crate) async fn wait(&self) {
        let mut busy = self.0.clone();
        let _ = tokio::time::timeout(SETTLE_WAIT, busy.wait_for(|b| !*b)).await;
    }
}

/// An updater and the connection's end of it; `session_id` is to be filled
/// once the key exchange is done.
pub(crate) fn updater() -> (Updater, Settled, Arc<OnceLock<Vec<u8>>>) {
    let (busy, rx) = tokio::sync::watch::channel(false);
    let session_id = Arc::new(OnceLock::new());
    (
        Updater {
            trusted: false,
            announced: false,
            session_id: session_id.clone(),
            busy: Arc::new(busy),
        },
        Settled(rx),
        session_id,
    )
}

/// Clears the busy flag when dropped, however the update ended.
struct BusyGuard(Arc<tokio::sync::watch::Sender<bool>>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Updater {
    /// Notes whether the connection's host key earns an update: called with
    /// the verdict of [`crate::hostkeys::KnownHosts::known_in_user_file`]
    /// taken before the key was verified (a key recorded by that
    /// verification, on first use, does not count), `false` for a host
    /// certificate.
    pub(crate) fn host_key_checked(&mut self, trusted: bool) {
        // A key exchange again later checks the same key; the first counts.
        if !self.announced {
            self.trusted = self.trusted || trusted;
        }
    }

    /// The server announced `keys` (inside the connection's handler):
    /// decides what to do, asks `session` for the proof the new keys need,
    /// and leaves checking it and writing known_hosts to a task.
    pub(crate) fn announced(
        &mut self,
        settings: &ConnectSettings,
        known: &KnownHosts,
        keys: Vec<PublicKey>,
        session: &mut russh::client::Session,
    ) {
        if std::mem::replace(&mut self.announced, true) {
            tracing::debug!("the server announced its host keys again; ignored");
            return;
        }
        match settings.update_host_keys {
            UpdateHostKeys::No => return,
            UpdateHostKeys::Ask => {
                tracing::debug!(
                    "UpdateHostKeys ask: skiff does not ask during a session; known_hosts is left as it is"
                );
                return;
            }
            UpdateHostKeys::Yes => {}
        }
        if !self.trusted {
            tracing::debug!(
                "UpdateHostKeys: the host key was not found in a user known_hosts file before this connection; not learning the server's other keys"
            );
            return;
        }
        let (host, port) = settings.host_key_name();
        let name = known_hosts::host_port_name(host, port);
        let (announced, wanted) = acceptable(settings, &keys);
        if announced.is_empty() {
            tracing::debug!("{name}: the server announced no usable host keys");
            return;
        }
        // Decided on this process's reading of the files (read again only
        // if they changed); each file is read afresh before it is rewritten.
        let plan = match known.with_user_files(|files| plan_update::plan(files, &name, &announced))
        {
            Ok(plan) => plan,
            Err(skip) => {
                tracing::debug!("{name}: UpdateHostKeys: known_hosts left as it is: {skip}");
                return;
            }
        };
        if plan.is_empty() {
            tracing::debug!("{name}: known_hosts already holds the server's host keys");
            return;
        }
        let job = Job {
            name,
            user_files: settings.user_known_hosts.clone(),
            hash: settings.hash_known_hosts,
            new: plan
                .new
                .iter()
                .filter(|&&i| wanted[i])
                .map(|&i| announced[i].clone())
                .collect(),
            already_known: announced
                .iter()
                .enumerate()
                .filter(|(i, _)| !plan.new.contains(i))
                .map(|(_, k)| k.clone())
                .collect(),
        };
        if job.new.is_empty() {
            // Only keys to take out: the announcement, under the key this
            // session verified, is all the proof needed (as ssh does).
            job.apply(&[]);
            return;
        }
        let Some(session_id) = self.session_id.get().cloned() else {
            tracing::debug!(
                "{}: no session identifier to check a proof against",
                job.name
            );
            return;
        };
        let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
        let data = plan_update::prove_request_data(&job.new);
        if let Err(e) =
            session.send_global_request(Some(reply_tx), plan_update::PROVE_REQUEST, &data)
        {
            tracing::debug!("{}: cannot ask for the host keys' proof: {e}", job.name);
            return;
        }
        self.busy.send_replace(true);
        let guard = BusyGuard(self.busy.clone());
        tokio::spawn(async move {
            let _guard = guard;
            let reply = match reply_rx.await {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    tracing::warn!(
                        "{}: the server refused to prove it holds its new host keys; known_hosts is left as it is",
                        job.name
                    );
                    return;
                }
                Err(_) => {
                    tracing::debug!(
                        "{}: the connection ended before the host keys' proof",
                        job.name
                    );
                    return;
                }
            };
            match proven(&session_id, &job.new, &reply) {
                Ok(proven) => job.apply(&proven),
                Err(why) => tracing::warn!(
                    "{}: the server's proof of its new host keys is not valid ({why}); known_hosts is left as it is",
                    job.name
                ),
            }
        });
    }
}

/// The announced keys as blobs, and for each whether it may be learnt:
/// allowed by `HostKeyAlgorithms`, and of at least `RequiredRSASize` bits
/// if RSA. A key that may not be learnt still counts as the server's: the
/// line of a recorded key of a type this connection leaves out (`-o
/// HostKeyAlgorithms=...`) is not taken for a key the server gave up.
fn acceptable(settings: &ConnectSettings, keys: &[PublicKey]) -> (Vec<Vec<u8>>, Vec<bool>) {
    let (mut blobs, mut wanted) = (Vec::new(), Vec::new());
    for key in keys {
        let Ok(blob) = key.to_bytes() else { continue };
        let Some(key_type) = blob_key_type(&blob) else {
            continue;
        };
        let allowed =
            plan_update::accepted_by_host_key_algorithms(key_type, &settings.algorithms.host_key);
        if !allowed {
            tracing::debug!("announced {key_type} host key not allowed by HostKeyAlgorithms");
        }
        let long_enough =
            known_hosts::rsa_modulus_bits(&blob).is_none_or(|b| b >= settings.required_rsa_size);
        if !long_enough {
            tracing::debug!("announced RSA host key shorter than RequiredRSASize");
        }
        blobs.push(blob);
        wanted.push(allowed && long_enough);
    }
    (blobs, wanted)
}

/// The text of `path` and its stamp from before it was read (so a change
/// while reading shows as a changed stamp); `None` when there is no such
/// file or it cannot be read.
fn read_with_stamp(path: &Path) -> Option<(String, FileStamp)> {
    let read = || -> std::io::Result<(String, FileStamp)> {
        let mut file = std::fs::File::open(path)?;
        let stamp = FileStamp::of(&file.metadata()?);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text)?;
        Ok((text, stamp))
    };
    match read() {
        Ok(read) => Some(read),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("UpdateHostKeys: cannot read {}: {e}", path.display());
            None
        }
    }
}

/// Checks the proof `reply` (one signature per key of `new`, over
/// [`plan_update::signed_data`]): the keys proven, in order. An RSA key
/// proven with a SHA-1 signature is left out, as ssh does; a signature
/// that does not verify fails the whole proof.
fn proven(session_id: &[u8], new: &[Vec<u8>], reply: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let signatures = plan_update::split_proof(reply, new.len()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (blob, signature) in new.iter().zip(signatures) {
        let key_type = blob_key_type(blob).unwrap_or_default();
        let algorithm = plan_update::signature_algorithm(signature).unwrap_or_default();
        match plan_update::proof_algorithm(key_type, algorithm) {
            ProofAlgorithm::Fit => {}
            ProofAlgorithm::Weak => {
                tracing::debug!("{key_type} host key proven with a SHA-1 signature; not learnt");
                continue;
            }
            ProofAlgorithm::Wrong => {
                return Err(format!(
                    "a {key_type} key proven with a {algorithm:?} signature"
                ))
            }
        }
        let key = PublicKey::from_bytes(blob).map_err(|e| format!("{key_type} key: {e}"))?;
        let signature =
            Signature::try_from(signature).map_err(|e| format!("{key_type} signature: {e}"))?;
        Verifier::verify(
            &key,
            &plan_update::signed_data(session_id, blob),
            &signature,
        )
        .map_err(|_| format!("bad signature for {}", plan_update::describe_key(blob)))?;
        out.push(blob.clone());
    }
    Ok(out)
}

/// An update decided on, waiting for the proof of `new`.
struct Job {
    /// The host's lookup name.
    name: String,
    user_files: Vec<PathBuf>,
    hash: bool,
    /// Announced keys no line records yet.
    new: Vec<Vec<u8>>,
    /// Announced keys already recorded.
    already_known: Vec<Vec<u8>>,
}

impl Job {
    /// Rewrites the user files: the host's lines for keys other than the
    /// known and `proven` ones out of each, the `proven` keys into the
    /// first one.
    fn apply(&self, proven: &[Vec<u8>]) {
        let mut keep = self.already_known.clone();
        keep.extend_from_slice(proven);
        for (i, path) in self.user_files.iter().enumerate() {
            let add = if i == 0 { proven } else { &[] };
            match replace_file(path, &self.name, &keep, add, self.hash) {
                Ok(Some(r)) => {
                    for key in &r.added {
                        tracing::info!(
                            "{}: learnt new host key {} (added to {})",
                            self.name,
                            plan_update::describe_key(key),
                            path.display()
                        );
                    }
                    for line in &r.removed {
                        tracing::info!(
                            "{}: removed {}:{line}, a host key the server no longer has",
                            self.name,
                            path.display()
                        );
                    }
                }
                Ok(None) => {}
                Err(UpdateError::Skipped(skip)) => {
                    tracing::debug!(
                        "{}: UpdateHostKeys: {} left as it is: {skip}",
                        self.name,
                        path.display()
                    );
                    return;
                }
                Err(UpdateError::Io(e)) => {
                    tracing::warn!("{}: could not update {}: {e}", self.name, path.display());
                    return;
                }
            }
        }
    }
}

/// Why a file was not rewritten.
#[derive(Debug)]
enum UpdateError {
    Skipped(Skip),
    Io(std::io::Error),
}

impl From<std::io::Error> for UpdateError {
    fn from(e: std::io::Error) -> Self {
        UpdateError::Io(e)
    }
}

/// How many times a file that changed while we rewrote it is tried again.
const ATTEMPTS: usize = 3;

/// Rewrites `path` (see [`plan_update::rewrite`]): a missing file is left
/// missing (as ssh does); the new text goes to a private temporary file in
/// the same directory, synced, then renamed over the file, so a reader sees
/// the old file or the new one, never part of one. A file that changed
/// while it was being rewritten is read again.
fn replace_file(
    path: &Path,
    name: &str,
    keep: &[Vec<u8>],
    add: &[Vec<u8>],
    hash: bool,
) -> Result<Option<plan_update::Rewrite>, UpdateError> {
    // Write beside the file itself, not beside a symbolic link to it.
    let target = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(path)?,
        Ok(_) => path.to_path_buf(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let label = path.display().to_string();
    for _ in 0..ATTEMPTS {
        let done = crate::hostkeys::holding_appends(path, || -> Result<_, UpdateError> {
            let Some((text, stamp)) = read_with_stamp(&target) else {
                return Ok(Some(None));
            };
            let salts: Vec<[u8; 20]> = if hash {
                add.iter()
                    .map(|_| {
                        let mut s = [0u8; 20];
                        rand::fill(&mut s);
                        s
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let rewrite = plan_update::rewrite(&label, &text, name, keep, add, &salts)
                .map_err(UpdateError::Skipped)?;
            let Some(rewrite) = rewrite else {
                return Ok(Some(None));
            };
            if write_replacing(&target, &rewrite.text, stamp)? {
                Ok(Some(Some(rewrite)))
            } else {
                Ok(None)
            }
        })?;
        if let Some(result) = done {
            return Ok(result);
        }
    }
    Err(UpdateError::Io(std::io::Error::other(
        "it kept changing while being rewritten",
    )))
}

/// Writes `text` to a new private file beside `target`, syncs it, and
/// renames it over `target` if `target` is still as it was read (`read`);
/// `false` (and nothing changed) if it is not.
fn write_replacing(target: &Path, text: &str, read: FileStamp) -> std::io::Result<bool> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "known_hosts".into());
    let mut tmp = None;
    for _ in 0..16 {
        let mut suffix = [0u8; 6];
        rand::fill(&mut suffix);
        let hex: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        let candidate = dir.join(format!(".{file_name}.skiff-{hex}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&candidate)
        {
            Ok(f) => {
                tmp = Some((candidate, f));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    let Some((tmp_path, mut file)) = tmp else {
        return Err(std::io::Error::other("no free temporary file name"));
    };
    let written = (|| {
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        let now = FileStamp::of(&std::fs::metadata(target)?);
        if now != read {
            return Ok(false);
        }
        std::fs::rename(&tmp_path, target)?;
        // The rename itself is durable once the directory is synced.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(true)
    })();
    if !matches!(written, Ok(true)) {
        let _ = std::fs::remove_file(&tmp_path);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh::keys::{Algorithm, PrivateKey};
    use std::os::unix::fs::PermissionsExt;

    fn blob(k: &PrivateKey) -> Vec<u8> {
        k.public_key().to_bytes().unwrap()
    }

    fn sign(k: &PrivateKey, session_id: &[u8]) -> Vec<u8> {
        use russh::keys::signature::Signer;
        let data = plan_update::signed_data(session_id, &blob(k));
        let sig: Signature = k.try_sign(&data).unwrap();
        russh::keys::ssh_encoding::Encode::encode_vec(&sig).unwrap()
    }

    fn reply(sigs: &[Vec<u8>]) -> Vec<u8> {
        plan_update::prove_request_data(sigs)
    }

    #[test]
    fn proofs_are_checked_against_the_session() {
        let mut rng = rand::rng();
        let a = PrivateKey::random(&mut rng, Algorithm::Ed25519).unwrap();
        let b = PrivateKey::random(
            &mut rng,
            Algorithm::Ecdsa {
                curve: russh::keys::EcdsaCurve::NistP256,
            },
        )
        .unwrap();
        let new = vec![blob(&a), blob(&b)];
        let good = reply(&[sign(&a, b"sid"), sign(&b, b"sid")]);
        assert_eq!(proven(b"sid", &new, &good).unwrap(), new);
        // Signed for another session, or in the wrong order, or one short.
        assert!(proven(b"other", &new, &good).is_err());
        let swapped = reply(&[sign(&b, b"sid"), sign(&a, b"sid")]);
        assert!(proven(b"sid", &new, &swapped).is_err());
        assert!(proven(b"sid", &new, &reply(&[sign(&a, b"sid")])).is_err());
    }

    #[test]
    fn replacing_keeps_a_private_whole_file_and_leaves_a_changed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        std::fs::write(&path, "a ssh-ed25519 AAAA\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let stamp = FileStamp::of(&std::fs::metadata(&path).unwrap());
        assert!(write_replacing(&path, "b\n", stamp).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Stale stamp: nothing replaced, no temporary file left behind.
        assert!(!write_replacing(&path, "c\n", stamp).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
