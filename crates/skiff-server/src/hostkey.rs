//! Host keys: loading the configured ones (and host certificates for them),
//! or creating skiffd's own ed25519 key in its state directory on first start
//! and reusing it afterwards.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, Certificate, PrivateKey};

/// What skiffd proves its identity with: its host keys, and host
/// certificates (signed by a CA clients trust) for some of them.
#[derive(Debug, Clone, Default)]
pub struct HostIdentity {
    pub keys: Vec<PrivateKey>,
    pub certificates: Vec<Certificate>,
}

impl From<Vec<PrivateKey>> for HostIdentity {
    fn from(keys: Vec<PrivateKey>) -> Self {
        HostIdentity {
            keys,
            certificates: Vec::new(),
        }
    }
}

/// The state directory: `$XDG_STATE_HOME/skiffd`, else `~/.local/state/skiffd`.
pub fn default_state_dir() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("skiffd"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither XDG_STATE_HOME nor HOME is set; pass --host-key")?;
    Ok(PathBuf::from(home).join(".local/state/skiffd"))
}

/// An unencrypted OpenSSH key whose ECDSA scalar OpenSSH stored short (one
/// P-256 key in 256), which ssh-key refuses: rebuilt at full width.
fn repaired(text: &str) -> Option<PrivateKey> {
    use skiff_proto::openssh_key::{armored_body, repair_unencrypted};
    let body = zeroize::Zeroizing::new(armored_body(text)?);
    let bytes = zeroize::Zeroizing::new(repair_unencrypted(&body)?);
    PrivateKey::from_bytes(&bytes).ok()
}

/// Loads every configured host key; fails naming the file that could not be used.
pub fn load_host_keys(paths: &[PathBuf]) -> Result<Vec<PrivateKey>> {
    paths
        .iter()
        .map(|p| {
            let text = fs::read_to_string(p)
                .with_context(|| format!("cannot read host key {}", p.display()))?;
            let key = PrivateKey::from_openssh(text.trim_end())
                .or_else(|refused| repaired(&text).ok_or(refused))
                .with_context(|| format!("{}: not an OpenSSH private key", p.display()))?;
            if key.is_encrypted() {
                bail!(
                    "{}: host key is passphrase-protected; skiffd needs an unencrypted host key",
                    p.display()
                );
            }
            Ok(key)
        })
        .collect()
}

/// Loads host certificates (`HostCertificate`, OpenSSH's `*-cert.pub`
/// files); fails naming the file when one is unreadable, is a user
/// certificate, or certifies none of `keys`.
pub fn load_host_certificates(paths: &[PathBuf], keys: &[PrivateKey]) -> Result<Vec<Certificate>> {
    paths
        .iter()
        .map(|p| {
            let text = fs::read_to_string(p)
                .with_context(|| format!("cannot read host certificate {}", p.display()))?;
            let cert = Certificate::from_openssh(text.trim())
                .with_context(|| format!("{}: not an OpenSSH certificate", p.display()))?;
            if cert.cert_type() != CertType::Host {
                bail!(
                    "{}: a user certificate, not a host certificate (sign with ssh-keygen -h)",
                    p.display()
                );
            }
            if !keys
                .iter()
                .any(|k| k.public_key().key_data() == cert.public_key())
            {
                bail!(
                    "{}: certifies a key that is not one of skiffd's host keys",
                    p.display()
                );
            }
            Ok(cert)
        })
        .collect()
}

/// Where skiffd's own host key is in its state directory.
pub fn default_host_key(state_dir: &Path) -> PathBuf {
    state_dir.join("ssh_host_ed25519_key")
}

/// Returns the path of skiffd's own ed25519 host key in `state_dir`, creating
/// the directory (0700) and the key (0600, written atomically) when missing.
pub fn ensure_default_host_key(state_dir: &Path) -> Result<PathBuf> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .with_context(|| format!("cannot create state directory {}", state_dir.display()))?;
    let path = default_host_key(state_dir);
    if path.exists() {
        return Ok(path);
    }
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .context("cannot generate an ed25519 host key")?;
    let pem = key
        .to_openssh(LineEnding::LF)
        .context("cannot encode host key")?;
    write_atomically(&path, pem.as_bytes(), 0o600)?;
    let public = key
        .public_key()
        .to_openssh()
        .context("cannot encode public host key")?;
    write_atomically(
        &path.with_extension("pub"),
        format!("{public}\n").as_bytes(),
        0o644,
    )?;
    tracing::info!("generated host key {}", path.display());
    Ok(path)
}

/// Writes `bytes` to a fresh temporary file beside `path` with `mode`, fsyncs,
/// and renames it into place, so readers see the old file or the whole new one.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .context("target path has no file name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_once_with_private_modes_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state/skiffd");
        let p1 = ensure_default_host_key(&state).unwrap();
        let first = fs::read(&p1).unwrap();
        assert_eq!(
            fs::metadata(&p1).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(&state).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let p2 = ensure_default_host_key(&state).unwrap();
        assert_eq!(p1, p2);
        assert_eq!(
            first,
            fs::read(&p2).unwrap(),
            "key must be reused, not regenerated"
        );
        let keys = load_host_keys(&[p1]).unwrap();
        assert_eq!(keys[0].algorithm(), Algorithm::Ed25519);
    }

    #[test]
    fn unreadable_or_garbage_key_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad_key");
        fs::write(&bad, "not a key").unwrap();
        let err = load_host_keys(std::slice::from_ref(&bad))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad_key"), "{err}");
        let missing = dir.path().join("missing");
        let err = load_host_keys(&[missing]).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
