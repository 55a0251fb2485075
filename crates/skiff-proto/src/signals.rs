//! Signal names as they appear in SSH `signal` and `exit-signal` messages
//! (RFC 4254 section 6.10: the name without "SIG"), and their Linux numbers.

/// Signal numbers for the names used in SSH `signal` and `exit-signal` messages.
pub fn number(name: &str) -> Option<i32> {
    SIGNALS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// The SSH name (without "SIG") of a signal number.
pub fn name(num: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, v)| *v == num)
        .map(|(n, _)| n.to_string())
        .unwrap_or_else(|| format!("SIG{num}"))
}

const SIGNALS: &[(&str, i32)] = &[
    ("ABRT", 6),
    ("ALRM", 14),
    ("FPE", 8),
    ("HUP", 1),
    ("ILL", 4),
    ("INT", 2),
    ("KILL", 9),
    ("PIPE", 13),
    ("QUIT", 3),
    ("SEGV", 11),
    ("TERM", 15),
    ("USR1", 10),
    ("USR2", 12),
    ("BUS", 7),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("WINCH", 28),
    ("SYS", 31),
    ("TRAP", 5),
    ("XCPU", 24),
    ("XFSZ", 25),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        for &(n, v) in SIGNALS {
            assert_eq!(number(n), Some(v));
            assert_eq!(name(v), n);
        }
        assert_eq!(number("KILL"), Some(9));
        assert_eq!(number("NOPE"), None);
        assert_eq!(name(64), "SIG64");
    }
}
