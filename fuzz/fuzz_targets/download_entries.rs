//! Fuzz target: a hostile server's entry list against the client's request.
//! The input's first line names the requested sources (separated by `|`,
//! a leading `r` asking for `-r`); each following line is one announced
//! entry (a leading `d` marks a directory). Nothing may panic, and every
//! admitted path must stay inside the destination and (without `-r`) be a
//! single file name; the refusal, made safe for a terminal, must hold no
//! character that steers one.

#![no_main]

use std::path::Component;

use libfuzzer_sys::fuzz_target;
use skiff_files::Requested;
use skiff_proto::terminal_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let Some(first) = lines.next() else {
        return;
    };
    let (recursive, sources) = match first.strip_prefix('r') {
        Some(rest) => (true, rest),
        None => (false, first),
    };
    let sources: Vec<String> = sources.split('|').map(str::to_string).collect();
    let mut requested = Requested::new(&sources, recursive);
    for line in lines.take(256) {
        let (is_dir, rel) = match line.strip_prefix('d') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        match requested.admit(rel, is_dir) {
            Ok(path) => {
                assert!(path.is_relative());
                assert!(path
                    .components()
                    .all(|c| matches!(c, Component::Normal(_))));
                if !recursive {
                    assert!(!is_dir);
                    assert_eq!(path.components().count(), 1);
                }
            }
            Err(refused) => {
                let shown = refused.to_string();
                assert!(terminal_text::is_plain(&terminal_text::one_line(&shown)));
            }
        }
    }
});
