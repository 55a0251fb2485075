//! Fuzz the messages between skiffd's listener, its zygote and its
//! connection processes: decoding must never panic, and what decodes must
//! encode to bytes that decode to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::worker_wire::{FromWorker, FromZygote, StreamHandoff, ToWorker, ToZygote};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ToZygote::decode(data) {
        assert_eq!(ToZygote::decode(&msg.encode()), Ok(msg));
    }
    if let Ok(msg) = FromZygote::decode(data) {
        assert_eq!(FromZygote::decode(&msg.encode()), Ok(msg));
    }
    if let Ok(msg) = ToWorker::decode(data) {
        assert_eq!(ToWorker::decode(&msg.encode()), Ok(msg));
    }
    if let Ok(msg) = FromWorker::decode(data) {
        assert_eq!(FromWorker::decode(&msg.encode()), Ok(msg));
    }
    if let Ok(msg) = StreamHandoff::decode(data) {
        assert_eq!(StreamHandoff::decode(&msg.encode()), Ok(msg));
    }
});
