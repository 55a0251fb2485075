//! Key material for unit tests: syntactically valid public key blobs that
//! need no key generation.

/// An ed25519 public key blob (SSH wire format) whose 32 key bytes are all
/// `fill`.
pub fn ed25519_blob(fill: u8) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&11u32.to_be_bytes());
    b.extend_from_slice(b"ssh-ed25519");
    b.extend_from_slice(&32u32.to_be_bytes());
    b.extend_from_slice(&[fill; 32]);
    b
}
