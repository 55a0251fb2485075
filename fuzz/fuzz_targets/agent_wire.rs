//! Fuzz the agent wire codec: arbitrary bytes fed to `decode_request` and
//! `decode_reply` (advancing by `consumed` until an error or a partial frame)
//! must never panic, and every decoded message must re-encode to exactly the
//! bytes it was decoded from and decode back to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::agent_wire::{
    decode_reply, decode_request, encode_reply, encode_request, WireError, MAX_FRAME,
};

/// Walks `data` frame by frame with `decode`, checking each message with `encode`.
fn walk<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<Option<(T, usize)>, WireError>,
    encode: fn(&T) -> Vec<u8>,
) {
    let mut pos = 0;
    loop {
        let rest = &data[pos..];
        match decode(rest) {
            Ok(Some((msg, consumed))) => {
                assert!(consumed >= 5 && consumed <= rest.len() && consumed <= MAX_FRAME + 4);
                let frame = encode(&msg);
                assert_eq!(frame, &rest[..consumed], "{msg:?}");
                assert_eq!(decode(&frame), Ok(Some((msg, consumed))));
                pos += consumed;
            }
            Ok(None) => {
                // Only a partial frame is left: every prefix also needs more.
                assert!(decode(&rest[..rest.len() / 2]) == Ok(None));
                break;
            }
            Err(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    walk(data, decode_request, encode_request);
    walk(data, decode_reply, encode_reply);
});
