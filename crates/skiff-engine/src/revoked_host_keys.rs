//! `RevokedHostKeys`: host keys, and host certificates when the file is a
//! key revocation list (KRL), that are refused whatever known_hosts says.
//!
//! The file is a list of public keys or a KRL (see
//! [`skiff_proto::authorized_keys::parse_revoked_keys`]). It is read again
//! whenever it changes, so an agent that runs for days sees a new
//! revocation at its next connection. As with ssh, a file that is missing,
//! unreadable or not understood in full refuses every host key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use russh::keys::{HashAlg, PublicKey, PublicKeyOrCertificate};
use skiff_proto::authorized_keys::{parse_revoked_keys, RevokedKeys};
use skiff_proto::krl::CertificateRef;

use crate::error::{ErrorKind, SkiffError};
use crate::hostkeys::FileStamp;
use crate::settings::ConnectSettings;

/// The last reading of each file, with the stamp it was read at.
type Cache = HashMap<PathBuf, (FileStamp, Arc<RevokedKeys>)>;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: std::sync::OnceLock<Mutex<Cache>> = std::sync::OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// The list in `path`, from the cache when the file has not changed.
fn load(path: &Path) -> Result<Arc<RevokedKeys>, String> {
    let label = path.display().to_string();
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| FileStamp::of(&m))
            .map_err(|e| format!("{label}: {e}"))
    };
    let before = stamp(path)?;
    if let Some((seen, list)) = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(path)
    {
        if *seen == before && !before.racy(SystemTime::now()) {
            return Ok(list.clone());
        }
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{label}: {e}"))?;
    let (list, warnings) = parse_revoked_keys(&label, &bytes)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    let list = Arc::new(list);
    // Kept only if nothing changed while it was read.
    if stamp(path).is_ok_and(|after| after == before) {
        cache()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(path.to_path_buf(), (before, list.clone()));
    }
    Ok(list)
}

/// Refuses the server's host key or certificate if a `RevokedHostKeys`
/// file revokes it (a certificate: its key, its CA, its serial or key ID),
/// or if one of those files cannot be used.
pub fn check(settings: &ConnectSettings, key: &PublicKeyOrCertificate) -> Result<(), SkiffError> {
    for path in &settings.revoked_host_keys {
        check_one(settings, path, key)?;
    }
    Ok(())
}

/// [`check`] against one file.
fn check_one(
    settings: &ConnectSettings,
    path: &Path,
    key: &PublicKeyOrCertificate,
) -> Result<(), SkiffError> {
    let (host, port) = settings.host_key_name();
    let name = skiff_proto::known_hosts::host_port_name(host, port);
    let refuse = |what: String| {
        SkiffError::new(
            ErrorKind::HostKey,
            format!("{name}: host key verification failed: {what}; refusing to connect"),
        )
    };
    let list = load(path).map_err(|why| {
        refuse(format!(
            "RevokedHostKeys cannot be used ({why}), so no host key is accepted"
        ))
    })?;
    let blob = |k: PublicKey| {
        k.to_bytes().map_err(|e| {
            SkiffError::new(
                ErrorKind::Protocol,
                format!("{name}: server sent an unusable host key: {e}"),
            )
        })
    };
    let (revoked, key) = match key {
        PublicKeyOrCertificate::PublicKey { key, .. } => {
            (list.revokes_key(&blob(key.clone())?), key.clone())
        }
        PublicKeyOrCertificate::Certificate(cert) => {
            let key = PublicKey::from(cert.public_key().clone());
            let ca = blob(PublicKey::from(cert.signature_key().clone()))?;
            let cert_ref = CertificateRef {
                ca_key: &ca,
                serial: cert.serial(),
                key_id: cert.key_id(),
            };
            (
                list.revokes_certificate(&blob(key.clone())?, &cert_ref),
                key,
            )
        }
    };
    if revoked {
        return Err(refuse(format!(
            "its host key ({}) is revoked by {}",
            key.fingerprint(HashAlg::Sha256),
            path.display()
        )));
    }
    Ok(())
}
