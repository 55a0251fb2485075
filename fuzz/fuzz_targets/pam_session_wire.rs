//! Fuzz the messages between skiffd and its PAM session process: decoding
//! must never panic, and what decodes must encode to bytes that decode to
//! the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::pam_session_wire::{FromSession, ToSession};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ToSession::decode(data) {
        assert_eq!(ToSession::decode(&msg.encode()), Ok(msg));
    }
    if let Ok(msg) = FromSession::decode(data) {
        assert_eq!(FromSession::decode(&msg.encode()), Ok(msg));
    }
});
