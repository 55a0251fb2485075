//! Fuzz `UpdateHostKeys`' decisions (skiff_proto::known_hosts::update):
//! arbitrary known_hosts text and proof replies must never make `plan`,
//! `rewrite`, `split_proof` or `signature_algorithm` panic, and a rewrite
//! keeps every line it does not remove, byte for byte and in order, ahead
//! of what it adds, leaving the host with exactly the keys it was told to
//! keep or add.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::known_hosts::update::{plan, rewrite, signature_algorithm, split_proof};
use skiff_proto::known_hosts::{host_port_name, parse};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = split_proof(data, 2);
    let _ = signature_algorithm(data);
    let (file, _) = parse("fuzz", &text);
    // The file's own keys, and a fixed one, as the server's announcement.
    let fixed: &[u8] = b"\0\0\0\x0bssh-ed25519\0\0\0\x20aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut announced: Vec<Vec<u8>> = vec![fixed.to_vec()];
    for e in file.entries.iter().take(3) {
        if !announced.contains(&e.key_blob) {
            announced.push(e.key_blob.clone());
        }
    }
    let names = [host_port_name("example.com", 22), host_port_name("10.0.0.1", 2222)];
    let files = [file];
    for name in &names {
        if let Ok(p) = plan(&files, name, &announced) {
            assert!(p.new.iter().all(|&i| i < announced.len()));
        }
        let keep = &announced[1..];
        let add = &announced[..1];
        let Ok(Some(r)) = rewrite("fuzz", &text, name, keep, add, &[[3; 20]]) else {
            continue;
        };
        let kept: String = text
            .split_inclusive('\n')
            .enumerate()
            .filter(|(i, _)| !r.removed.contains(&(i + 1)))
            .map(|(_, l)| l)
            .collect();
        assert!(r.text.starts_with(&kept));
        let (after, _) = parse("after", &r.text);
        for e in after.matching(name) {
            assert!(keep.contains(&e.key_blob) || add.contains(&e.key_blob));
        }
    }
});
