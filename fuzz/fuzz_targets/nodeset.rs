//! Fuzz the node set parser and folder: arbitrary bytes (lossily decoded as
//! UTF-8) must never make `parse`, `fold` or the file parsers panic; errors
//! must point inside their input; every set that expands must fold to a
//! string that expands back to exactly the same targets, and folding that
//! again must give the same string.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_proto::nodeset::{
    fold, fold_targets, no_groups, parse, parse_groups_file, parse_hosts_file, parse_with_limit,
    ErrorKind, HostsFileError, NodeSetError,
};

/// Keeps each input cheap: a few thousand targets are plenty to explore folding.
const LIMIT: usize = 5_000;

fn groups(name: &str) -> Option<String> {
    let definition = match name {
        "web" => "web[01-12/3],root@web[9-10]:2222",
        "db" => "db[1-3].example,[fe80::1]:22",
        "all" => "@web,@db,10.0.[0-1].[1-5]",
        "loop" => "x1,@loop",
        "broken" => "b[2-1]",
        _ => return None,
    };
    Some(definition.to_owned())
}

fn check_error(e: &NodeSetError) {
    assert!(e.offset <= e.input.len(), "{e:?}");
    assert!(e.input.is_char_boundary(e.offset), "{e:?}");
    assert_eq!(e.to_string().lines().count(), 3, "{e:?}");
    assert!(!e.one_line().contains('\n'));
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    match parse_with_limit(&text, &groups, LIMIT) {
        Ok(targets) => {
            assert!(!targets.is_empty());
            assert!(targets.windows(2).all(|w| w[0] < w[1]), "not sorted/unique");
            let folded = fold_targets(&targets);
            let again = parse(&folded, &no_groups)
                .unwrap_or_else(|e| panic!("fold of {text:?} gave {folded:?}, which fails: {e}"));
            assert_eq!(again, targets, "{folded}");
            assert_eq!(fold_targets(&again), folded);
            let displayed: Vec<String> = targets.iter().map(ToString::to_string).collect();
            assert_eq!(fold(&displayed), folded);
        }
        Err(e) => check_error(&e),
    }

    // Lines of the input as host names: folding must not panic, and is canonical.
    let mut names: Vec<&str> = text.lines().take(64).collect();
    let folded = fold(&names);
    names.reverse();
    assert_eq!(fold(&names), folded);

    // The same text as a groups file and as a hosts file.
    if let Ok(file_groups) = parse_groups_file(&text, "groups") {
        for name in file_groups.names().take(4) {
            match parse_with_limit(&format!("@{name}"), &|n| file_groups.lookup(n), LIMIT) {
                Ok(targets) => assert!(!targets.is_empty()),
                // Only the size cap can fail for a checked groups file.
                Err(e) => assert!(matches!(e.kind, ErrorKind::TooManyTargets(_)), "{e}"),
            }
        }
    }
    // (Only when no line is over LIMIT: the file parser's own cap is MAX_TARGETS.)
    let small = text.lines().all(|line| {
        let content = line.split('#').next().unwrap_or("").trim();
        content.is_empty()
            || !matches!(
                parse_with_limit(content, &groups, LIMIT),
                Err(NodeSetError {
                    kind: ErrorKind::TooManyTargets(_),
                    ..
                })
            )
    });
    if small {
        match parse_hosts_file(&text, "hosts", &groups) {
            Ok(targets) => assert!(!targets.is_empty()),
            Err(HostsFileError::NodeSet { error, .. }) => check_error(&error),
            Err(_) => {}
        }
    }
});
