//! Fuzz target: arbitrary bytes (lossy UTF-8) through the authorized_keys
//! parser and its helpers. Nothing may panic, and basic invariants must hold.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use skiff_proto::authorized_keys::{
    find, find_cert_authority, from_allows, is_expired, parse, split_host_port,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (keys, warnings) = parse("fuzz", &text);
    let line_count = text.split('\n').count();

    for w in &warnings {
        assert!(w.line >= 1 && w.line <= line_count);
        let _ = w.to_string();
    }

    let ips = [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, 2)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()),
    ];
    for k in &keys {
        assert!(k.line >= 1 && k.line <= line_count);
        let hit = if k.options.cert_authority {
            find_cert_authority(&keys, &k.key_type, &k.key_blob)
        } else {
            find(&keys, &k.key_type, &k.key_blob)
        };
        // The first matching line can never come after this one.
        assert!(hit.is_some_and(|h| h.line <= k.line));

        if let Some(from) = &k.options.from {
            for ip in ips {
                let _ = from_allows(from, ip, None);
                let _ = from_allows(from, ip, Some("Host.Example.COM"));
            }
        }
        for v in k.options.permit_open.iter().chain(&k.options.permit_listen) {
            assert!(split_host_port(v).is_some());
        }
        if let Some(t) = k.options.expiry_time {
            let _ = t.to_string();
            let _ = t.to_unix(-50_400);
            let _ = t.to_unix(50_400);
        }
        let _ = is_expired(&k.options, 0, 0);
        let _ = is_expired(&k.options, i64::MAX, i64::MIN);
        let _ = is_expired(&k.options, i64::MIN, i64::MAX);
    }

    let _ = find(&keys, "ssh-ed25519", data);
    let _ = find(&keys, "rsa-sha2-256", data);
});
