//! `ChannelTimeout` as data: which channel types are closed after how long
//! without traffic, as sshd_config(5) describes it. Pure: the configuration
//! parser builds a [`ChannelTimeouts`] from a line's words, and the
//! connection's clocks ([`crate::channel_idle`]) ask it for the interval of
//! each channel they open.
//!
//! Each word is `type=interval`. `type` is a channel type name, possibly
//! with `*`/`?` wildcards (the first word whose pattern matches a channel's
//! type decides), or `global`, which no wildcard matches: the interval
//! after which every open channel is closed when none of them carried any
//! traffic. An interval of zero means no timeout. `none` alone is no
//! timeout at all (the default).

use std::time::Duration;

use skiff_proto::pattern::wildcard_match;

/// The channel types skiffd serves, by the names `ChannelTimeout` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    Session,
    DirectTcpip,
    DirectStreamlocal,
    ForwardedTcpip,
    ForwardedStreamlocal,
    AgentConnection,
}

impl ChannelKind {
    /// The SSH channel type name (that of the channel's open message).
    pub fn name(self) -> &'static str {
        match self {
            ChannelKind::Session => "session",
            ChannelKind::DirectTcpip => "direct-tcpip",
            ChannelKind::DirectStreamlocal => "direct-streamlocal@openssh.com",
            ChannelKind::ForwardedTcpip => "forwarded-tcpip",
            ChannelKind::ForwardedStreamlocal => "forwarded-streamlocal@openssh.com",
            ChannelKind::AgentConnection => "agent-connection",
        }
    }
}

/// A `ChannelTimeout` line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelTimeouts {
    /// Type patterns and their intervals, in the order given.
    by_type: Vec<(String, Duration)>,
    global: Option<Duration>,
}

/// Why a `ChannelTimeout` line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelTimeoutError {
    #[error("ChannelTimeout needs type=interval words (or none)")]
    Empty,
    #[error("ChannelTimeout {0:?}: expected type=interval")]
    NotAPair(String),
    #[error("ChannelTimeout {word:?}: {reason}")]
    BadInterval { word: String, reason: String },
    #[error("ChannelTimeout: none cannot be combined with type=interval words")]
    NoneWithOthers,
}

impl ChannelTimeouts {
    /// Parses the words of a `ChannelTimeout` line.
    pub fn parse(words: &[&str]) -> Result<ChannelTimeouts, ChannelTimeoutError> {
        match words {
            [] => return Err(ChannelTimeoutError::Empty),
            [none] if none.eq_ignore_ascii_case("none") => return Ok(ChannelTimeouts::default()),
            _ => {}
        }
        let mut parsed = ChannelTimeouts::default();
        for word in words {
            if word.eq_ignore_ascii_case("none") {
                return Err(ChannelTimeoutError::NoneWithOthers);
            }
            let Some((kind, interval)) = word.split_once('=') else {
                return Err(ChannelTimeoutError::NotAPair(word.to_string()));
            };
            if kind.is_empty() || interval.is_empty() {
                return Err(ChannelTimeoutError::NotAPair(word.to_string()));
            }
            let interval = crate::config::parse_duration(interval).map_err(|reason| {
                ChannelTimeoutError::BadInterval {
                    word: word.to_string(),
                    reason,
                }
            })?;
            if kind == "global" {
                // As with types, the first one given counts.
                if parsed.global.is_none() {
                    parsed.global = Some(interval);
                }
            } else {
                parsed.by_type.push((kind.to_string(), interval));
            }
        }
        parsed.global = parsed.global.filter(|d| !d.is_zero());
        Ok(parsed)
    }

    /// How long a channel of this kind may go without traffic; `None` for
    /// no limit.
    pub fn for_kind(&self, kind: ChannelKind) -> Option<Duration> {
        self.by_type
            .iter()
            .find(|(pattern, _)| wildcard_match(pattern, kind.name()))
            .map(|(_, d)| *d)
            .filter(|d| !d.is_zero())
    }

    /// How long all of a connection's channels may go without traffic
    /// before every one of them is closed (`global`).
    pub fn global(&self) -> Option<Duration> {
        self.global
    }

    /// The line's words as `TYPE=SECONDS`, `global` last (for `skiffd -T`).
    pub fn words(&self) -> Vec<String> {
        self.by_type
            .iter()
            .map(|(t, d)| (t.as_str(), d))
            .chain(self.global.as_ref().map(|d| ("global", d)))
            .map(|(t, d)| format!("{t}={}", d.as_secs()))
            .collect()
    }

    /// Whether no channel ever times out.
    pub fn is_none(&self) -> bool {
        self.global.is_none() && self.by_type.iter().all(|(_, d)| d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> ChannelTimeouts {
        let words: Vec<&str> = line.split_whitespace().collect();
        ChannelTimeouts::parse(&words).unwrap()
    }

    const ALL: [ChannelKind; 6] = [
        ChannelKind::Session,
        ChannelKind::DirectTcpip,
        ChannelKind::DirectStreamlocal,
        ChannelKind::ForwardedTcpip,
        ChannelKind::ForwardedStreamlocal,
        ChannelKind::AgentConnection,
    ];

    #[test]
    fn one_type() {
        let t = parse("session=2s");
        assert_eq!(
            t.for_kind(ChannelKind::Session),
            Some(Duration::from_secs(2))
        );
        assert_eq!(t.for_kind(ChannelKind::DirectTcpip), None);
        assert_eq!(t.global(), None);
        assert!(!t.is_none());
    }

    #[test]
    fn several_types_and_time_units() {
        let t = parse("direct-tcpip=1m session=1h30m agent-connection=15");
        assert_eq!(
            t.for_kind(ChannelKind::DirectTcpip),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            t.for_kind(ChannelKind::Session),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            t.for_kind(ChannelKind::AgentConnection),
            Some(Duration::from_secs(15))
        );
        assert_eq!(t.for_kind(ChannelKind::ForwardedTcpip), None);
    }

    #[test]
    fn wildcards_match_types_and_the_first_match_decides() {
        let t = parse("*-tcpip=10 session=0 *=5m");
        assert_eq!(
            t.for_kind(ChannelKind::DirectTcpip),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            t.for_kind(ChannelKind::ForwardedTcpip),
            Some(Duration::from_secs(10))
        );
        // session=0 comes before `*`: sessions never time out.
        assert_eq!(t.for_kind(ChannelKind::Session), None);
        assert_eq!(
            t.for_kind(ChannelKind::DirectStreamlocal),
            Some(Duration::from_secs(300))
        );
        let t = parse("*streamlocal@openssh.com=7");
        assert_eq!(
            t.for_kind(ChannelKind::ForwardedStreamlocal),
            Some(Duration::from_secs(7))
        );
        assert_eq!(t.for_kind(ChannelKind::Session), None);
    }

    #[test]
    fn global_is_its_own_and_no_wildcard_matches_it() {
        let t = parse("*=1m");
        assert_eq!(t.global(), None);
        for kind in ALL {
            assert_eq!(t.for_kind(kind), Some(Duration::from_secs(60)));
        }
        let t = parse("global=30s");
        assert_eq!(t.global(), Some(Duration::from_secs(30)));
        for kind in ALL {
            assert_eq!(t.for_kind(kind), None, "{kind:?}");
        }
        assert!(parse("global=0").is_none());
    }

    #[test]
    fn none_and_zero_mean_no_timeout() {
        assert!(parse("none").is_none());
        assert!(parse("NONE").is_none());
        assert!(parse("session=0").is_none());
        assert_eq!(parse("session=0").for_kind(ChannelKind::Session), None);
        assert!(ChannelTimeouts::default().is_none());
    }

    /// In a configuration file: the first line wins, as in sshd, and both
    /// keywords may be set per login in a `Match` block.
    #[test]
    fn in_the_configuration_file() {
        use crate::config::{apply_config_text, Settings};
        use crate::match_block::MatchContext;
        let mut s = Settings::default();
        let text = "ChannelTimeout session=5 direct-tcpip=1m\n\
                    ChannelTimeout session=9\n\
                    UnusedConnectionTimeout none\n\
                    Match User alice\n  ChannelTimeout *=30s\n  UnusedConnectionTimeout 2m\n";
        apply_config_text(&mut s, "f", text).unwrap();
        let secs = Duration::from_secs;
        assert_eq!(
            s.channel_timeouts.for_kind(ChannelKind::Session),
            Some(secs(5))
        );
        assert_eq!(
            s.channel_timeouts.for_kind(ChannelKind::DirectTcpip),
            Some(secs(60))
        );
        assert_eq!(s.unused_connection_timeout, None);
        let groups = Vec::new();
        let ctx = |user| MatchContext {
            user,
            groups: &groups,
            peer: "127.0.0.1".parse().unwrap(),
            local: "127.0.0.1".parse().unwrap(),
            local_port: 22,
        };
        let alice = s.for_login(&ctx("alice")).unwrap();
        assert_eq!(
            alice.channel_timeouts.for_kind(ChannelKind::ForwardedTcpip),
            Some(secs(30))
        );
        assert_eq!(alice.unused_connection_timeout, Some(secs(120)));
        assert!(Settings::default().channel_timeouts.is_none());
        assert_eq!(Settings::default().unused_connection_timeout, None);
        let err = apply_config_text(&mut Settings::default(), "f", "\nChannelTimeout session\n")
            .unwrap_err();
        assert_eq!(err.line, 2);
    }

    #[test]
    fn bad_lines_are_refused() {
        let err = |line: &str| {
            let words: Vec<&str> = line.split_whitespace().collect();
            ChannelTimeouts::parse(&words).unwrap_err()
        };
        assert_eq!(err(""), ChannelTimeoutError::Empty);
        assert_eq!(
            err("session"),
            ChannelTimeoutError::NotAPair("session".into())
        );
        assert_eq!(err("=5"), ChannelTimeoutError::NotAPair("=5".into()));
        assert_eq!(
            err("session="),
            ChannelTimeoutError::NotAPair("session=".into())
        );
        assert!(matches!(
            err("session=5x"),
            ChannelTimeoutError::BadInterval { .. }
        ));
        assert!(matches!(
            err("session=-1"),
            ChannelTimeoutError::BadInterval { .. }
        ));
        assert_eq!(err("none session=5"), ChannelTimeoutError::NoneWithOthers);
    }
}
