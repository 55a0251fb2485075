//! Fuzz target: arbitrary bytes through the KRL parser (with and without the
//! magic in front). Nothing may panic; a parsed list answers queries.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::krl::{CertificateRef, Krl, MAGIC};

fuzz_target!(|data: &[u8]| {
    let mut with_magic = MAGIC.to_vec();
    with_magic.extend_from_slice(data);
    for bytes in [data, &with_magic[..]] {
        let Ok(krl) = Krl::parse(bytes) else {
            continue;
        };
        let _ = krl.revokes_key(data);
        for serial in [0, 1, u64::MAX, data.len() as u64] {
            let cert = CertificateRef {
                ca_key: data,
                serial,
                key_id: "id",
            };
            let _ = krl.revokes_certificate(&cert);
        }
    }
});
