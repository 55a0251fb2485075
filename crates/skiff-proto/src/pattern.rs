//! OpenSSH-style wildcard patterns (`*`, `?`) and pattern lists with `!` negation.
//!
//! Used by ssh_config `Host`/`Match`, known_hosts host fields and the
//! authorized_keys `from=` option. Matching is byte-wise and case-sensitive;
//! callers lowercase host names first, as OpenSSH does.

/// Returns true when `text` matches `pattern`, where `*` matches any run of
/// bytes (including none) and `?` matches exactly one byte.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    // Position of the last `*` seen in the pattern and the text index it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Outcome of matching a text against a list of patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMatch {
    /// No pattern matched.
    NoMatch,
    /// At least one positive pattern matched and no negated one did.
    Positive,
    /// A negated pattern (`!pat`) matched: this overrides any positive match.
    Negated,
}

impl ListMatch {
    /// True only for [`ListMatch::Positive`].
    pub fn is_match(self) -> bool {
        self == ListMatch::Positive
    }
}

/// Matches `text` against patterns, each optionally prefixed with `!`.
/// A matching negated pattern wins over every positive one, as in OpenSSH.
pub fn match_list<'a, I>(patterns: I, text: &str) -> ListMatch
where
    I: IntoIterator<Item = &'a str>,
{
    let mut result = ListMatch::NoMatch;
    for pat in patterns {
        if let Some(neg) = pat.strip_prefix('!') {
            if wildcard_match(neg, text) {
                return ListMatch::Negated;
            }
        } else if wildcard_match(pat, text) {
            result = ListMatch::Positive;
        }
    }
    result
}

/// True when the pattern contains a wildcard character.
pub fn has_wildcard(pattern: &str) -> bool {
    pattern.bytes().any(|c| c == b'*' || c == b'?')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("*", "anything"));
        assert!(wildcard_match("web?", "web1"));
        assert!(!wildcard_match("web?", "web"));
        assert!(!wildcard_match("web?", "web12"));
        assert!(wildcard_match("*.example.com", "a.b.example.com"));
        assert!(!wildcard_match("*.example.com", "example.com"));
        assert!(wildcard_match("a*b*c", "aXXbYYc"));
        assert!(!wildcard_match("a*b*c", "aXXbYY"));
        assert!(wildcard_match("10.0.*.1", "10.0.255.1"));
        assert!(wildcard_match("", ""));
        assert!(!wildcard_match("", "x"));
        assert!(wildcard_match("**a", "a"));
    }

    #[test]
    fn lists_with_negation() {
        let pats = ["*.corp", "!secret.corp"];
        assert_eq!(match_list(pats, "db.corp"), ListMatch::Positive);
        assert_eq!(match_list(pats, "secret.corp"), ListMatch::Negated);
        assert_eq!(match_list(pats, "db.home"), ListMatch::NoMatch);
        // A negation alone never produces a positive match.
        assert_eq!(match_list(["!x"], "y"), ListMatch::NoMatch);
    }
}
