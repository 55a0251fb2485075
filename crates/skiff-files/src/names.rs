//! Checking names and relative paths that come from a peer (a directory
//! listing, a path in a transfer header) before they are joined to a local
//! destination: nothing a peer sends may reach outside that destination.

use std::path::{Component, Path, PathBuf};

use crate::error::FileError;

/// Rejects a relative path received from a peer that would escape the
/// destination: absolute, with a `..` component, empty (or only `.`), or
/// containing NUL. `.` components and repeated slashes are dropped.
pub fn safe_relative(rel: &str) -> Result<PathBuf, FileError> {
    let refuse = |why: &str| Err(FileError::new(rel, format!("unsafe path from peer: {why}")));
    if rel.is_empty() {
        return refuse("empty");
    }
    if rel.contains('\0') {
        return refuse("contains NUL");
    }
    if rel.starts_with('/') {
        return refuse("absolute");
    }
    let mut out = PathBuf::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return refuse("contains `..`"),
            Component::RootDir | Component::Prefix(_) => return refuse("absolute"),
        }
    }
    if out.as_os_str().is_empty() {
        return refuse("names no file");
    }
    Ok(out)
}

/// Checks one name of a directory listing received from a peer: a single
/// component, not `.` or `..`, no `/` and no NUL.
pub fn safe_name(name: &str) -> Result<&str, FileError> {
    let bad =
        name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0');
    if bad {
        return Err(FileError::new(
            name,
            "unsafe file name from peer (not a single path component)",
        ));
    }
    Ok(name)
}

/// A host's label (`web01`, `ops@db:2222`, `[::1]:22`) as one local file
/// name, for the places a fan-out keeps hosts apart on disk (`skiff cp
/// NODESET:PATH DIR` into `DIR/LABEL/`, `skiff run --outdir` into
/// `DIR/LABEL.out`). The result is always a single path component, never
/// `.`, `..` or empty, and two different labels never give the same name:
/// `%` becomes `%25`, `/` `%2F`, NUL and other control characters `%XX` for
/// each of their UTF-8 bytes, a label that is all `.` or `..` becomes `%2E`
/// or `%2E%2E`, and an empty one `%`. Ordinary labels are unchanged.
pub fn label_file_name(label: &str) -> String {
    match label {
        "" => return "%".to_string(),
        "." => return "%2E".to_string(),
        ".." => return "%2E%2E".to_string(),
        _ => {}
    }
    let mut out = String::with_capacity(label.len());
    for c in label.chars() {
        if c == '%' || c == '/' || c.is_control() {
            let mut bytes = [0u8; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ordinary_labels_are_their_own_names() {
        for label in [
            "web01",
            "user@host:2222",
            "[::1]",
            "[::1]:22",
            "a.b-c_d",
            "...",
            ".hidden",
            "a..b",
            "nœud-é",
        ] {
            assert_eq!(label_file_name(label), label);
        }
    }

    #[test]
    fn labels_that_are_not_one_component_are_escaped() {
        assert_eq!(label_file_name("."), "%2E");
        assert_eq!(label_file_name(".."), "%2E%2E");
        assert_eq!(label_file_name(""), "%");
        assert_eq!(label_file_name("a/b"), "a%2Fb");
        assert_eq!(label_file_name("../x"), "..%2Fx");
        assert_eq!(label_file_name("a\0b"), "a%00b");
        assert_eq!(label_file_name("100%"), "100%25");
        // Escapes cannot be forged: a literal `%2E` is not `.`.
        assert_eq!(label_file_name("%2E"), "%252E");
        assert_eq!(label_file_name("%"), "%25");
        // Control characters, C1 ones by their UTF-8 bytes.
        assert_eq!(label_file_name("a\u{1b}[2J\n"), "a%1B[2J%0A");
        assert_eq!(label_file_name("\u{7f}\u{9b}"), "%7F%C2%9B");
    }

    /// The label a name was made from (the inverse of `label_file_name`).
    fn decode(name: &str) -> Option<String> {
        match name {
            "%" => return Some(String::new()),
            "%2E" => return Some(".".into()),
            "%2E%2E" => return Some("..".into()),
            _ => {}
        }
        let mut bytes = Vec::new();
        let mut rest = name.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &tail[2..];
            } else {
                bytes.push(b);
                rest = tail;
            }
        }
        String::from_utf8(bytes).ok()
    }

    fn one_safe_component(name: &str) -> bool {
        !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.contains('\0')
            && safe_name(name).is_ok()
    }

    proptest! {
        #[test]
        fn every_label_is_one_safe_component(label in any::<String>()) {
            let name = label_file_name(&label);
            prop_assert!(one_safe_component(&name), "{:?} -> {:?}", label, name);
            prop_assert!(!name.chars().any(char::is_control), "{:?} -> {:?}", label, name);
        }

        #[test]
        fn different_labels_get_different_names(
            a in "[./%\\x00\\x1b a-c]{0,6}",
            b in "[./%\\x00\\x1b a-c]{0,6}",
        ) {
            if a != b {
                prop_assert_ne!(label_file_name(&a), label_file_name(&b));
            }
        }

        /// Every name decodes back to its label: no two labels share one.
        #[test]
        fn names_decode_back_to_their_labels(label in any::<String>()) {
            prop_assert_eq!(decode(&label_file_name(&label)), Some(label));
        }
    }

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(safe_relative("a").unwrap(), PathBuf::from("a"));
        assert_eq!(safe_relative("a/b/c").unwrap(), PathBuf::from("a/b/c"));
        assert_eq!(safe_relative("./a//b/.").unwrap(), PathBuf::from("a/b"));
        assert_eq!(
            safe_relative("a..b/..c").unwrap(),
            PathBuf::from("a..b/..c")
        );
        assert_eq!(safe_relative(".hidden").unwrap(), PathBuf::from(".hidden"));
    }

    #[test]
    fn rejects_escapes() {
        for bad in [
            "",
            ".",
            "./",
            "/etc/passwd",
            "//x",
            "..",
            "../x",
            "a/../b",
            "a/..",
            "a\0b",
            "a/./../..",
        ] {
            let e = safe_relative(bad).expect_err(bad);
            assert!(e.message.starts_with("unsafe path"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn single_names() {
        assert_eq!(safe_name("file.txt").unwrap(), "file.txt");
        assert_eq!(safe_name("...").unwrap(), "...");
        for bad in ["", ".", "..", "a/b", "/", "a\0"] {
            assert!(safe_name(bad).is_err(), "{bad:?}");
        }
    }
}
