//! Fuzz target: arbitrary bytes through the SOCKS handshake parsers, fed
//! whole and cut at every length, and arbitrary text through the -L/-R/-D
//! specification parsers. Nothing may panic; a parsed message never claims
//! more bytes than it was given.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::{forward_spec, socks};

fn check<T>(data: &[u8], parse: fn(&[u8]) -> socks::Parsed<T>) {
    for end in 0..=data.len().min(64) {
        if let Ok(Some((_, used))) = parse(&data[..end]) {
            assert!(used <= end);
        }
    }
    if let Ok(Some((_, used))) = parse(data) {
        assert!(used <= data.len());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, socks::parse_opening);
    check(data, socks::parse_socks5_request);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = forward_spec::parse_forward(text, false);
        let _ = forward_spec::parse_forward(text, true);
        if let Ok(spec) = forward_spec::parse_dynamic(text) {
            let _ = spec.to_string();
        }
    }
});
