//! Text a peer chose (a server's error message, a file name from a
//! listing, a disconnect reason, a banner), made safe to show on a terminal
//! or to write into a log line.
//!
//! A terminal obeys what it is sent: `ESC [ 1 A ESC [ 2 K` moves up a line
//! and erases it, `OSC 52` writes the clipboard, a carriage return lets a
//! line overwrite itself, and bidirectional overrides make text read in
//! another order than it is stored. Anything that could steer the terminal
//! or hide text is therefore shown escaped, as Rust's `escape_debug` writes
//! it (`\u{1b}[2K`, `\r`, `\u{202e}`), never passed through; the rest of the
//! text, non-ASCII letters included, is left as it is. OpenSSH does the
//! same since 8.0 (with `vis(3)`'s octal spelling).
//!
//! This is the one place that decides what is safe: every front end and
//! every error built from a peer's words goes through [`one_line`] or
//! [`lines`].

use std::borrow::Cow;

/// Characters that steer a terminal or change how text reads without being
/// visible: C0 and C1 controls, DEL, the Unicode line and paragraph
/// separators, and the bidirectional marks, embeddings, overrides and
/// isolates.
fn steers(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn escaped(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| steers(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if steers(c) && !keep(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` for one line of output: every control character (newlines and tabs
/// too) and every invisible direction mark is escaped.
pub fn one_line(s: &str) -> Cow<'_, str> {
    escaped(s, |_| false)
}

/// `s` for text that may span lines (a pre-login banner): as [`one_line`],
/// but newlines and tabs are kept.
pub fn lines(s: &str) -> Cow<'_, str> {
    escaped(s, |c| c == '\n' || c == '\t')
}

/// True when `s` would be shown unchanged by [`one_line`].
pub fn is_plain(s: &str) -> bool {
    !s.chars().any(steers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in [
            "",
            "report.txt",
            "Permission denied",
            "naïve café 日本",
            "a\\b",
        ] {
            assert!(matches!(one_line(s), Cow::Borrowed(x) if x == s), "{s:?}");
            assert!(is_plain(s));
        }
    }

    #[test]
    fn terminal_controls_are_escaped() {
        assert_eq!(
            one_line("ok\u{1b}[1A\u{1b}[2Kgone"),
            "ok\\u{1b}[1A\\u{1b}[2Kgone"
        );
        assert_eq!(one_line("a\rb\nc\td\u{7f}"), "a\\rb\\nc\\td\\u{7f}");
        // C1 CSI, a bell, an OSC 52 clipboard write.
        assert_eq!(one_line("\u{9b}2J\u{7}"), "\\u{9b}2J\\u{7}");
        assert_eq!(one_line("\u{1b}]52;c;aGk=\u{7}"), "\\u{1b}]52;c;aGk=\\u{7}");
        // A right-to-left override that would show "txt.exe" as "exe.txt".
        assert_eq!(one_line("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert!(!is_plain("\u{2066}x"));
    }

    #[test]
    fn lines_keeps_newlines_and_tabs_only() {
        assert_eq!(lines("Welcome\n\tto x\r\n"), "Welcome\n\tto x\\r\n");
        assert_eq!(lines("\u{1b}[31mred\n"), "\\u{1b}[31mred\n");
    }

    proptest! {
        #[test]
        fn nothing_that_steers_survives(s in any::<String>()) {
            let one = one_line(&s);
            prop_assert!(one.chars().all(|c| !steers(c)));
            let multi = lines(&s);
            prop_assert!(multi.chars().all(|c| !steers(c) || c == '\n' || c == '\t'));
            // Text without such characters is never changed.
            if is_plain(&s) {
                prop_assert_eq!(one.as_ref(), s.as_str());
            }
        }
    }
}
