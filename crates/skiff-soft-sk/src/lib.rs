//! A software security key, for tests only: a library OpenSSH loads as its
//! FIDO middleware (`SecurityKeyProvider`, `ssh-keygen -w`, `ssh-add -S`),
//! speaking the middleware interface of OpenSSH's `sk-api.h` (version
//! 0x000a0000, OpenSSH 9.1 and later) without any hardware.
//!
//! It makes `ed25519-sk` and `ecdsa-sk` keys and signs as an authenticator
//! does: over the authenticator data (SHA-256 of the application, a flags
//! byte, a big-endian counter) followed by the SHA-256 of what it is asked
//! to sign. Nobody touches anything: the flags are those the key asks for
//! (user presence unless it was made `no-touch-required`, verification
//! with `verify-required`), or, when set, `SKIFF_SOFT_SK_FLAGS` (for
//! example `0x00`: a signature without a touch). The counter is
//! `SKIFF_SOFT_SK_COUNTER` when set, else counts up from 1 in each process.
//! With `SKIFF_SOFT_SK_LOG` set to a file, each signature appends a line
//! to it.
//!
//! **Never use it for real keys:** the key handle, which OpenSSH stores in
//! the private key file, holds the private key itself. `publish = false`.
//!
//! The signing is here, free of the C interface, which is `ffi`.

#![deny(unsafe_op_in_unsafe_fn)]

use aws_lc_rs::digest;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING,
};

mod ffi;

/// The middleware interface version this library implements.
pub const API_VERSION: u32 = 0x000a_0000;
/// The flag of a signature made with a person present (a touch).
pub const USER_PRESENCE: u8 = 0x01;
/// The flag of a signature made after verifying the person (PIN).
pub const USER_VERIFICATION: u8 = 0x04;
/// The environment variable that sets every signature's flags.
pub const FLAGS_VAR: &str = "SKIFF_SOFT_SK_FLAGS";
/// The environment variable that sets every signature's counter.
pub const COUNTER_VAR: &str = "SKIFF_SOFT_SK_COUNTER";
/// The environment variable naming a file each signature appends a line
/// to (`signed FLAGS COUNTER`), so that a test sees when a key was asked
/// to sign.
pub const LOG_VAR: &str = "SKIFF_SOFT_SK_LOG";

/// What starts every key handle this library makes, before the algorithm
/// byte and the private key (PKCS#8).
const HANDLE_MARK: &[u8] = b"skiff-soft-sk/1";

/// The key types, with their numbers in the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `SSH_SK_ECDSA` (0): `sk-ecdsa-sha2-nistp256@openssh.com`.
    EcdsaP256,
    /// `SSH_SK_ED25519` (1): `sk-ssh-ed25519@openssh.com`.
    Ed25519,
}

impl Algorithm {
    /// The algorithm numbered `code` in the interface.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::EcdsaP256),
            1 => Some(Self::Ed25519),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::EcdsaP256 => 0,
            Self::Ed25519 => 1,
        }
    }
}

/// Why a request fails, as the interface's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// `SSH_SK_ERR_GENERAL` (-1): a bad argument or handle, a failure.
    General,
    /// `SSH_SK_ERR_UNSUPPORTED` (-2): an algorithm this key does not have.
    Unsupported,
}

impl Error {
    /// The interface's code.
    pub fn code(self) -> i32 {
        match self {
            Self::General => -1,
            Self::Unsupported => -2,
        }
    }
}

/// A new key: its public key as OpenSSH wants it (32 bytes for Ed25519,
/// an uncompressed point for P-256) and its handle.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub public_key: Vec<u8>,
    pub key_handle: Vec<u8>,
}

/// A signature as the interface returns it: for Ed25519, the signature in
/// `sig_r` and nothing in `sig_s`; for ECDSA, the big-endian `r` and `s`.
#[derive(Debug, Clone)]
pub struct Signed {
    pub flags: u8,
    pub counter: u32,
    pub sig_r: Vec<u8>,
    pub sig_s: Vec<u8>,
}

/// Makes a key of `alg`.
pub fn enroll(alg: Algorithm) -> Result<Enrolled, Error> {
    let (public_key, pkcs8) = match alg {
        Algorithm::Ed25519 => {
            let pair = Ed25519KeyPair::generate().map_err(|_| Error::General)?;
            let pkcs8 = pair.to_pkcs8v1().map_err(|_| Error::General)?;
            (pair.public_key().as_ref().to_vec(), pkcs8)
        }
        Algorithm::EcdsaP256 => {
            let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING)
                .map_err(|_| Error::General)?;
            let pkcs8 = pair.to_pkcs8v1().map_err(|_| Error::General)?;
            (pair.public_key().as_ref().to_vec(), pkcs8)
        }
    };
    let mut key_handle = HANDLE_MARK.to_vec();
    key_handle.push(alg.code());
    key_handle.extend_from_slice(pkcs8.as_ref());
    Ok(Enrolled {
        public_key,
        key_handle,
    })
}

/// What an authenticator signs: its data (SHA-256 of `application`,
/// `flags`, `counter`) and the SHA-256 of `data`.
pub fn signed_data(application: &[u8], flags: u8, counter: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 1 + 4 + 32);
    out.extend_from_slice(digest::digest(&digest::SHA256, application).as_ref());
    out.push(flags);
    out.extend_from_slice(&counter.to_be_bytes());
    out.extend_from_slice(digest::digest(&digest::SHA256, data).as_ref());
    out
}

/// Signs `data` for `application` with the key in `key_handle`, reporting
/// `flags` and `counter`.
pub fn sign(
    alg: Algorithm,
    data: &[u8],
    application: &[u8],
    key_handle: &[u8],
    flags: u8,
    counter: u32,
) -> Result<Signed, Error> {
    let rest = key_handle.strip_prefix(HANDLE_MARK).ok_or(Error::General)?;
    let (&code, pkcs8) = rest.split_first().ok_or(Error::General)?;
    if code != alg.code() {
        return Err(Error::General);
    }
    let message = signed_data(application, flags, counter, data);
    let (sig_r, sig_s) = match alg {
        Algorithm::Ed25519 => {
            let pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|_| Error::General)?;
            (pair.sign(&message).as_ref().to_vec(), Vec::new())
        }
        Algorithm::EcdsaP256 => {
            let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8)
                .map_err(|_| Error::General)?;
            let sig = pair
                .sign(&SystemRandom::new(), &message)
                .map_err(|_| Error::General)?;
            let (r, s) = sig.as_ref().split_at(32);
            (r.to_vec(), s.to_vec())
        }
    };
    Ok(Signed {
        flags,
        counter,
        sig_r,
        sig_s,
    })
}

/// The flags a signature reports: `SKIFF_SOFT_SK_FLAGS` (`0x..` or
/// decimal) when set, else those the key asks for (`requested`: presence,
/// verification). A value that is not a byte is an error, not a guess.
pub fn flags(requested: u8, setting: Option<&str>) -> Result<u8, Error> {
    let Some(text) = setting else {
        return Ok(requested & (USER_PRESENCE | USER_VERIFICATION));
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => text.parse::<u8>(),
    };
    parsed.map_err(|_| Error::General)
}

/// The line a signature appends to the `SKIFF_SOFT_SK_LOG` file.
pub fn log_line(signed: &Signed) -> String {
    format!("signed 0x{:02x} {}\n", signed.flags, signed.counter)
}

/// The counter of the next signature: `SKIFF_SOFT_SK_COUNTER` when set
/// (`setting`), else one more than the last in this process.
pub fn counter(setting: Option<&str>) -> Result<u32, Error> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    match setting {
        Some(text) => text.trim().parse().map_err(|_| Error::General),
        None => Ok(NEXT.fetch_add(1, Ordering::Relaxed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ED25519};

    #[test]
    fn ed25519_signatures_verify_over_the_authenticator_data() {
        let key = enroll(Algorithm::Ed25519).unwrap();
        assert_eq!(key.public_key.len(), 32);
        let signed = sign(
            Algorithm::Ed25519,
            b"request",
            b"ssh:",
            &key.key_handle,
            0x05,
            9,
        )
        .unwrap();
        assert_eq!((signed.flags, signed.counter), (0x05, 9));
        assert!(signed.sig_s.is_empty());
        let public = UnparsedPublicKey::new(&ED25519, &key.public_key);
        let message = signed_data(b"ssh:", 0x05, 9, b"request");
        public.verify(&message, &signed.sig_r).unwrap();
        // The flags are signed: other flags do not verify.
        let forged = signed_data(b"ssh:", 0x01, 9, b"request");
        assert!(public.verify(&forged, &signed.sig_r).is_err());
    }

    #[test]
    fn ecdsa_signatures_verify_and_handles_are_checked() {
        let key = enroll(Algorithm::EcdsaP256).unwrap();
        assert_eq!((key.public_key.len(), key.public_key[0]), (65, 4));
        let signed = sign(
            Algorithm::EcdsaP256,
            b"data",
            b"ssh:",
            &key.key_handle,
            0x01,
            1,
        )
        .unwrap();
        let rs = [signed.sig_r.as_slice(), signed.sig_s.as_slice()].concat();
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &key.public_key);
        public
            .verify(&signed_data(b"ssh:", 0x01, 1, b"data"), &rs)
            .unwrap();
        // A handle of the other type, or of nobody, signs nothing.
        assert_eq!(
            sign(Algorithm::Ed25519, b"d", b"ssh:", &key.key_handle, 1, 1).unwrap_err(),
            Error::General
        );
        assert!(sign(Algorithm::Ed25519, b"d", b"ssh:", b"garbage", 1, 1).is_err());
    }

    #[test]
    fn flags_and_counter_settings() {
        assert_eq!(flags(0x01, None), Ok(0x01));
        assert_eq!(flags(0x25, None), Ok(0x05));
        assert_eq!(flags(0x01, Some("0x00")), Ok(0x00));
        assert_eq!(flags(0x00, Some("5")), Ok(0x05));
        assert_eq!(flags(0x00, Some("0x100")), Err(Error::General));
        assert_eq!(flags(0x00, Some("touch")), Err(Error::General));
        assert_eq!(counter(Some("42")), Ok(42));
        let a = counter(None).unwrap();
        assert!(counter(None).unwrap() > a);
        assert_eq!(Algorithm::from_code(1), Some(Algorithm::Ed25519));
        assert_eq!(Algorithm::from_code(7), None);
    }
}
