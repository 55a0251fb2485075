//! Fuzz target: typed bytes through the escape-sequence filter, whole and
//! cut at an arbitrary point. The cut never changes what is sent or which
//! escapes are found, each call uses what it says it used, and input
//! without the escape character passes unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::escape::{EscapeAction, EscapeScanner};

/// Feeds `chunks` in turn; returns what was sent and the actions found.
fn run(escape: u8, chunks: &[&[u8]]) -> (Vec<u8>, Vec<EscapeAction>) {
    let mut scanner = EscapeScanner::new(escape);
    let (mut out, mut actions) = (Vec::new(), Vec::new());
    for chunk in chunks {
        let mut rest = *chunk;
        while !rest.is_empty() {
            let (used, action) = scanner.feed(rest, &mut out);
            assert!(used >= 1 && used <= rest.len());
            actions.extend(action);
            rest = &rest[used..];
        }
    }
    (out, actions)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, typed)) = data.split_first() else {
        return;
    };
    let escape = if first == 0 { b'~' } else { first };
    let whole = run(escape, &[typed]);
    let cut = usize::from(first) % (typed.len() + 1);
    assert_eq!(whole, run(escape, &[&typed[..cut], &typed[cut..]]));
    if !typed.contains(&escape) {
        assert_eq!(whole.0, typed);
        assert!(whole.1.is_empty());
    }
});
