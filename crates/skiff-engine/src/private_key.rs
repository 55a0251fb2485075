//! Private key files, decoded as russh decodes them, and also the OpenSSH
//! keys its decoder refuses though OpenSSH wrote them: an ECDSA scalar
//! stored shorter than its field (one P-256 key in 256; see
//! [`skiff_proto::openssh_key`]). Such a key is decrypted here when it has a
//! passphrase, repaired, and decoded again. Tested end to end with
//! ssh-keygen's keys in `crates/skiff/tests/short_ecdsa_keys.rs`.

use russh::keys::{Error, PrivateKey};
use skiff_proto::openssh_key;
use zeroize::Zeroizing;

/// The private key in `text`, decrypted with `passphrase` if it needs one.
pub fn decode(text: &str, passphrase: Option<&str>) -> Result<PrivateKey, Error> {
    match russh::keys::decode_secret_key(text, passphrase) {
        Ok(key) => Ok(key),
        Err(refused) => repaired(text, passphrase).ok_or(refused),
    }
}

/// The key in `text` with its ECDSA scalar widened; `None` when there is
/// nothing to repair, or the passphrase is missing or wrong.
fn repaired(text: &str, passphrase: Option<&str>) -> Option<PrivateKey> {
    let bytes = Zeroizing::new(openssh_key::armored_body(text)?);
    let container = openssh_key::parse(&bytes)?;
    let section = if container.cipher == b"none" {
        openssh_key::widen_ecdsa_scalar(container.private_section)?
    } else {
        // ssh-key parses an encrypted container without looking inside.
        let sealed = PrivateKey::from_bytes(&bytes).ok()?;
        let (key, iv) = sealed
            .kdf()
            .derive_key_and_iv(sealed.cipher(), passphrase?)
            .ok()?;
        let mut plain = Zeroizing::new(container.private_section.to_vec());
        // Without their tag, AEAD-sealed keys fail here and stay refused.
        sealed.cipher().decrypt(&key, &iv, &mut plain, None).ok()?;
        openssh_key::widen_ecdsa_scalar(&plain)?
    };
    let section = Zeroizing::new(section);
    let rebuilt = Zeroizing::new(openssh_key::unencrypted(container.public_key, &section));
    PrivateKey::from_bytes(&rebuilt).ok()
}
