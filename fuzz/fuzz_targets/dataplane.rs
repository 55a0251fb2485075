//! Fuzz the data plane's decoders: control messages both ways and relay
//! messages must never panic and must re-encode to the bytes they came
//! from; record opening must never panic, and in the authenticated modes
//! must refuse anything that was not sealed with the session's keys.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::dataplane::{
    decode_client, decode_relay, decode_server, derive_keys, encode_client, encode_relay,
    encode_server, Mode, Opener, Side, RECORD_HEADER,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((msg, used))) = decode_client(data) {
        assert_eq!(encode_client(&msg), &data[..used]);
    }
    if let Ok(Some((msg, used))) = decode_server(data) {
        assert_eq!(encode_server(&msg), &data[..used]);
    }
    if let Ok(msg) = decode_relay(data) {
        assert_eq!(encode_relay(&msg), data);
    }
    for mode in [Mode::Aead, Mode::Integrity, Mode::None] {
        let keys = derive_keys(&[7; 32], &[9; 32], mode);
        let mut opener = Opener::new(&keys, Side::Client, mode, 0);
        let mut record = data.to_vec();
        let opened = opener.open(&mut record);
        if mode != Mode::None && data.len() >= RECORD_HEADER {
            // Forging a tag by chance is beyond any fuzzer's reach.
            assert!(opened.is_err());
        }
    }
});
