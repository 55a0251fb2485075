//! Fuzz target: the OpenSSH private-key container and its repair. Parsing
//! never panics; a repaired section is well formed, padded to 8, and has
//! nothing left to repair; a repaired container parses back to the same
//! public key.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::openssh_key::{parse, repair_unencrypted, unencrypted, widen_ecdsa_scalar};

fuzz_target!(|data: &[u8]| {
    if let Some(wide) = widen_ecdsa_scalar(data) {
        assert_eq!(wide.len() % 8, 0);
        assert!(widen_ecdsa_scalar(&wide).is_none());
    }
    // The same bytes as a private section inside a container, and as one.
    for bytes in [unencrypted(b"public", data), data.to_vec()] {
        let Some(container) = parse(&bytes) else {
            continue;
        };
        if let Some(repaired) = repair_unencrypted(&bytes) {
            let again = parse(&repaired).expect("a repaired container parses");
            assert_eq!(again.public_key, container.public_key);
            assert!(repair_unencrypted(&repaired).is_none());
        }
    }
});
