//! ssh's escape sequences for interactive sessions, without I/O: the
//! escape character (`~` by default, `EscapeChar` / `-e`) typed at the
//! start of a line, then one command character. [`EscapeScanner`] filters
//! what the person types: ordinary bytes pass on to the session, and an
//! escape sequence becomes an [`EscapeAction`] for the caller to carry
//! out.

/// The escape character setting: `none` turns escapes off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapeChar {
    None,
    Byte(u8),
}

impl Default for EscapeChar {
    fn default() -> Self {
        EscapeChar::Byte(b'~')
    }
}

/// Parses `EscapeChar` or `-e`: one character, `^X` for a control
/// character, or `none`.
pub fn parse_escape_char(value: &str) -> Result<EscapeChar, String> {
    let bytes = value.as_bytes();
    match bytes {
        _ if value.eq_ignore_ascii_case("none") => Ok(EscapeChar::None),
        [b] if b.is_ascii() => Ok(EscapeChar::Byte(*b)),
        [b'^', c] if c.is_ascii_alphabetic() || b"@[\\]^_".contains(c) => {
            Ok(EscapeChar::Byte(c.to_ascii_uppercase() & 0x1f))
        }
        _ => Err(format!(
            "bad escape character {value:?}: expected one character, ^X or none"
        )),
    }
}

/// How an escape character is written, for `-G` and the help text.
pub fn show_escape_char(e: EscapeChar) -> String {
    match e {
        EscapeChar::None => "none".into(),
        EscapeChar::Byte(b) if b < 0x20 => format!("^{}", (b | 0x40) as char),
        EscapeChar::Byte(b) => (b as char).to_string(),
    }
}

/// What an escape sequence asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapeAction {
    /// `.`: end the connection now.
    Disconnect,
    /// `^Z`: suspend skiff (the session goes on).
    Suspend,
    /// `?`: list the escapes.
    Help,
    /// `R`: ask for a new key exchange.
    Rekey,
}

/// The filter over what is typed. Escapes count only right after the
/// start of input or a line end (`\r` or `\n`), as in ssh.
#[derive(Debug, Clone)]
pub struct EscapeScanner {
    escape: u8,
    at_line_start: bool,
    after_escape: bool,
}

impl EscapeScanner {
    pub fn new(escape: u8) -> EscapeScanner {
        EscapeScanner {
            escape,
            at_line_start: true,
            after_escape: false,
        }
    }

    /// Filters `input`: bytes for the session are appended to `out`. Stops
    /// after the first escape sequence that asks for an action and returns
    /// it with the number of input bytes used, so that the caller can act
    /// before the rest is read (after `.`, say, nothing more is sent).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> (usize, Option<EscapeAction>) {
        for (i, &b) in input.iter().enumerate() {
            if self.after_escape {
                self.after_escape = false;
                let action = match b {
                    b'.' => Some(EscapeAction::Disconnect),
                    0x1a => Some(EscapeAction::Suspend),
                    b'?' => Some(EscapeAction::Help),
                    b'R' => Some(EscapeAction::Rekey),
                    _ => None,
                };
                if let Some(action) = action {
                    // After an escape command the next byte starts a line
                    // again, so `~.` can follow `~?` at once.
                    self.at_line_start = true;
                    return (i + 1, Some(action));
                }
                // `~~` sends one escape character; anything else sends
                // both, as typed.
                if b != self.escape {
                    out.push(self.escape);
                }
                out.push(b);
                self.at_line_start = b == b'\r' || b == b'\n';
                continue;
            }
            if self.at_line_start && b == self.escape {
                self.after_escape = true;
                continue;
            }
            out.push(b);
            self.at_line_start = b == b'\r' || b == b'\n';
        }
        (input.len(), None)
    }
}

/// The help text for `~?`, lines ending in `\r\n` for a raw terminal.
pub fn help_text(e: u8) -> String {
    let e = show_escape_char(EscapeChar::Byte(e));
    let lines = [
        "Supported escape sequences:".to_string(),
        format!(" {e}.   - terminate the connection"),
        format!(" {e}R   - request a new key exchange"),
        format!(" {e}^Z  - suspend skiff"),
        format!(" {e}?   - this message"),
        format!(" {e}{e}   - send the escape character by typing it twice"),
        "(Note that escapes are only recognized immediately after newline.)".to_string(),
    ];
    let mut text = lines.join("\r\n");
    text.push_str("\r\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` whole, collecting the output and every action.
    fn run(input: &[u8]) -> (Vec<u8>, Vec<EscapeAction>) {
        let mut s = EscapeScanner::new(b'~');
        let (mut out, mut actions, mut rest) = (Vec::new(), Vec::new(), input);
        while !rest.is_empty() {
            let (used, action) = s.feed(rest, &mut out);
            actions.extend(action);
            rest = &rest[used..];
        }
        (out, actions)
    }

    #[test]
    fn escapes_count_only_at_the_start_of_a_line() {
        assert_eq!(run(b"~."), (vec![], vec![EscapeAction::Disconnect]));
        assert_eq!(
            run(b"ls\r~."),
            (b"ls\r".to_vec(), vec![EscapeAction::Disconnect])
        );
        assert_eq!(run(b"ls\n~?"), (b"ls\n".to_vec(), vec![EscapeAction::Help]));
        // Mid-line, a tilde is just a tilde.
        assert_eq!(run(b"cd ~.\r"), (b"cd ~.\r".to_vec(), vec![]));
        assert_eq!(run(b"a~R"), (b"a~R".to_vec(), vec![]));
    }

    #[test]
    fn doubled_and_unknown_escapes_are_sent() {
        assert_eq!(run(b"~~"), (b"~".to_vec(), vec![]));
        // After `~~` the line has started: a further `~.` is text.
        assert_eq!(run(b"~~~."), (b"~~.".to_vec(), vec![]));
        assert_eq!(run(b"~x"), (b"~x".to_vec(), vec![]));
        assert_eq!(
            run(b"~\r~."),
            (b"~\r".to_vec(), vec![EscapeAction::Disconnect])
        );
    }

    #[test]
    fn each_action_and_what_follows_it() {
        assert_eq!(
            run(b"~?~.").1,
            [EscapeAction::Help, EscapeAction::Disconnect]
        );
        assert_eq!(run(b"~\x1a").1, [EscapeAction::Suspend]);
        // Escapes skiff does not do are sent as typed.
        assert_eq!(run(b"~#"), (b"~#".to_vec(), vec![]));
        assert_eq!(run(b"~R").1, [EscapeAction::Rekey]);
        // The scanner stops at an action; the caller sees what is left.
        let mut s = EscapeScanner::new(b'~');
        let mut out = Vec::new();
        assert_eq!(
            s.feed(b"x\r~.after", &mut out),
            (4, Some(EscapeAction::Disconnect))
        );
        assert_eq!(out, b"x\r");
    }

    #[test]
    fn a_sequence_split_across_reads_still_counts() {
        let mut s = EscapeScanner::new(b'~');
        let mut out = Vec::new();
        assert_eq!(s.feed(b"\r~", &mut out), (2, None));
        assert_eq!(s.feed(b".", &mut out), (1, Some(EscapeAction::Disconnect)));
        assert_eq!(out, b"\r");
    }

    #[test]
    fn other_escape_characters() {
        let mut s = EscapeScanner::new(0x1d); // ^]
        let mut out = Vec::new();
        assert_eq!(s.feed(b"~.", &mut out), (2, None));
        assert_eq!(out, b"~.");
        let mut s = EscapeScanner::new(0x1d);
        assert_eq!(
            s.feed(b"\x1d.", &mut Vec::new()).1,
            Some(EscapeAction::Disconnect)
        );
    }

    #[test]
    fn parsing_and_showing() {
        assert_eq!(parse_escape_char("~"), Ok(EscapeChar::Byte(b'~')));
        assert_eq!(parse_escape_char("none"), Ok(EscapeChar::None));
        assert_eq!(parse_escape_char("^]"), Ok(EscapeChar::Byte(0x1d)));
        assert_eq!(parse_escape_char("^a"), Ok(EscapeChar::Byte(1)));
        for bad in ["", "ab", "^1", "é", "^~"] {
            assert!(parse_escape_char(bad).is_err(), "{bad}");
        }
        assert_eq!(show_escape_char(EscapeChar::Byte(0x1d)), "^]");
        assert_eq!(show_escape_char(EscapeChar::Byte(b'~')), "~");
        assert_eq!(show_escape_char(EscapeChar::None), "none");
        assert!(help_text(b'~').contains(" ~.   - terminate"));
        assert!(help_text(b'~').ends_with("\r\n"));
    }
}
