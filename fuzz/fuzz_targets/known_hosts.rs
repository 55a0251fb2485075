//! Fuzz the known_hosts parser and lookup: arbitrary bytes (lossily decoded
//! as UTF-8) must never make `parse`, `check`, `first_hashed`, `decide` or
//! the formatters panic, and every parsed entry must round-trip through
//! `to_line`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::known_hosts::{
    self, ask_prompt, check, decide, format_entry, parse, Decision, HostKeyStatus,
    StrictHostKeyChecking,
};

const POLICIES: [StrictHostKeyChecking; 4] = [
    StrictHostKeyChecking::Yes,
    StrictHostKeyChecking::AcceptNew,
    StrictHostKeyChecking::No,
    StrictHostKeyChecking::Ask,
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (file, _warnings) = parse("fuzz", &text);

    // Every accepted entry re-serialises to a line that parses to the same entry.
    for entry in &file.entries {
        // (Leading newline: a BOM at the very start of a file is dropped.)
        let (again, warnings) = parse("again", &format!("\n{}", entry.to_line()));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(again.entries.len(), 1);
        let mut e = again.entries[0].clone();
        e.line = entry.line;
        assert_eq!(&e, entry);
    }

    // A fixed fake key plus the keys found in the file.
    let fixed: &[u8] = b"\0\0\0\x0bssh-ed25519\0\0\0\x20aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut keys: Vec<(String, Vec<u8>)> = vec![("ssh-ed25519".into(), fixed.to_vec())];
    keys.extend(
        file.entries
            .iter()
            .take(4)
            .map(|e| (e.key_type.clone(), e.key_blob.clone())),
    );
    let files = [file];

    // Hosts: fixed ones plus a host name taken from the input itself.
    let from_input: String = text.chars().take(40).collect();
    let hosts = ["example.com", "10.0.0.1", "", from_input.as_str()];
    for host in hosts {
        for port in [22u16, 2222] {
            let _ = known_hosts::cert_authorities(&files, host, port);
            // A scan that stops early finds an entry a full lookup finds too.
            if let Some(first) = known_hosts::first_hashed(&files, host, port, |_| true) {
                let all = known_hosts::lookup(&files, host, port);
                assert!(all.iter().any(|f| f.line == first.line));
            }
            for (kt, blob) in &keys {
                let status = check(&files, host, port, kt, blob);
                if let HostKeyStatus::Known(found) = &status {
                    assert_eq!(&found.entry.key_blob, blob);
                }
                for policy in POLICIES {
                    let d = decide(&status, policy, host, port, kt, blob);
                    if matches!(status, HostKeyStatus::Revoked(_)) {
                        assert!(matches!(d, Decision::Refuse(_)));
                    }
                    // A key that differs from the recorded ones, whatever
                    // their type, is never recorded nor asked about.
                    if matches!(
                        status,
                        HostKeyStatus::Changed { .. } | HostKeyStatus::OtherTypesKnown(_)
                    ) {
                        assert!(!matches!(d, Decision::AcceptAndRecord | Decision::AskUser));
                    }
                }
                let _ = ask_prompt(host, port, kt, blob);
                let _ = known_hosts::revoked(&files, host, port, blob);
            }
        }
    }

    // A recorded line for a well-formed host is found again, hashed or not.
    for (kt, blob) in &keys {
        for salt in [None, Some(&[5u8; 20])] {
            let line = format_entry("example.com", 2222, kt, blob, salt);
            let (f, warnings) = parse("rec", &line);
            assert!(warnings.is_empty(), "{line:?}: {warnings:?}");
            let files = [f];
            assert!(matches!(
                check(&files, "example.com", 2222, kt, blob),
                HostKeyStatus::Known(_)
            ));
        }
    }
});
