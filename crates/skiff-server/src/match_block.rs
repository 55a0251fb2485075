//! sshd_config's `Match` blocks for skiffd: the criteria (`User`, `Group`,
//! `Address`, `LocalAddress`, `LocalPort`, `Host`, `Version`, `All`, each negatable
//! with `!`), their evaluation for one login, and which keywords a block
//! may set. Pure: the configuration parser collects the blocks
//! ([`crate::config`]), the handler supplies who is logging in from where.

use std::net::IpAddr;

use skiff_proto::authorized_keys::from_allows;
use skiff_proto::pattern::{match_list, ListMatch};

/// Keywords a `Match` block may set (lowercase): those that can differ by
/// user or address once the connection is up. Listeners, host keys,
/// algorithms and the lookup commands are the server's alone.
pub const ALLOWED_IN_MATCH: &[&str] = &[
    "acceptenv",
    "allowagentforwarding",
    "allowgroups",
    "allowstreamlocalforwarding",
    "allowtcpforwarding",
    "allowusers",
    "authenticationmethods",
    "authorizedkeysfile",
    "authorizedprincipalsfile",
    "challengeresponseauthentication",
    "channeltimeout",
    "chrootdirectory",
    "dataplane",
    "dataplaneunencrypted",
    "denygroups",
    "denyusers",
    "disableforwarding",
    "exposeauthinfo",
    "forcecommand",
    "gatewayports",
    "kbdinteractiveauthentication",
    "maxchannelwindow",
    "maxsessions",
    "passwordauthentication",
    "permitemptypasswords",
    "permitlisten",
    "permitopen",
    "permitrootlogin",
    "permittty",
    "permituserenvironment",
    "pubkeyacceptedalgorithms",
    "pubkeyacceptedkeytypes",
    "pubkeyauthoptions",
    "rekeylimit",
    "revokedkeys",
    "setenv",
    "trustedusercakeys",
    "unusedconnectiontimeout",
];

/// What a block's criteria are matched against.
#[derive(Debug, Clone)]
pub struct MatchContext<'a> {
    pub user: &'a str,
    /// The account's groups (primary and supplementary) by name.
    pub groups: &'a [String],
    pub peer: IpAddr,
    pub local: IpAddr,
    pub local_port: u16,
}

/// A login's details as `skiffd -T -C` gives them: any may be missing,
/// and a criterion on a missing one does not hold, as in sshd's test mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialContext {
    pub user: Option<String>,
    /// The user's groups, when the user is known.
    pub groups: Vec<String>,
    pub peer: Option<IpAddr>,
    pub local: Option<IpAddr>,
    pub local_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Criterion {
    All,
    User(Vec<String>),
    Group(Vec<String>),
    /// Client address patterns or CIDR (as `from=`).
    Address(Vec<String>),
    LocalAddress(Vec<String>),
    LocalPort(Vec<String>),
    /// skiffd does no reverse lookups: `Host` is matched against the
    /// client's address, as sshd does with `UseDNS no`.
    Host(Vec<String>),
    /// Patterns for skiffd's own version, [`crate::SOFTWARE_VERSION`]
    /// (sshd's, OpenSSH 10.0 on, match `OpenSSH_10.0` and the like).
    Version(Vec<String>),
}

/// One `Match` line and the lines under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchBlock {
    criteria: Vec<Criterion>,
    /// Where each setting in the block comes from, and the line.
    pub lines: Vec<(crate::config::Origin, String)>,
}

/// A comma-separated pattern list.
fn patterns(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

impl MatchBlock {
    /// Parses the words after `Match`.
    pub fn parse(args: &[&str]) -> Result<MatchBlock, String> {
        let mut criteria = Vec::new();
        let mut words = args.iter();
        while let Some(word) = words.next() {
            let lower = word.to_ascii_lowercase();
            if lower == "all" {
                if !criteria.is_empty() || args.len() > 1 {
                    return Err("Match all cannot be combined with other criteria".into());
                }
                criteria.push(Criterion::All);
                continue;
            }
            let value = words
                .next()
                .ok_or_else(|| format!("Match {word} needs a pattern list"))?;
            let list = patterns(value);
            if list.is_empty() {
                return Err(format!("Match {word} needs a pattern list"));
            }
            criteria.push(match lower.as_str() {
                "user" => Criterion::User(list),
                "group" => Criterion::Group(list),
                "address" | "localaddress" => {
                    for p in &list {
                        let p = p.strip_prefix('!').unwrap_or(p);
                        if p.contains('/') && p.parse::<ipnet_like::Cidr>().is_err() {
                            return Err(format!("Match {word}: bad CIDR {p:?}"));
                        }
                    }
                    if lower == "address" {
                        Criterion::Address(list)
                    } else {
                        Criterion::LocalAddress(list)
                    }
                }
                "localport" => {
                    if let Some(bad) = list
                        .iter()
                        .map(|p| p.strip_prefix('!').unwrap_or(p))
                        .find(|p| p.parse::<u16>().is_err())
                    {
                        return Err(format!("Match LocalPort: bad port {bad:?}"));
                    }
                    Criterion::LocalPort(list)
                }
                "host" => Criterion::Host(list),
                "version" => Criterion::Version(list),
                _ => {
                    return Err(format!(
                        "unsupported Match criterion {word:?} (skiffd knows User, Group, Address, \
                         LocalAddress, LocalPort, Host, Version and All)"
                    ))
                }
            });
        }
        if criteria.is_empty() {
            return Err("Match needs criteria (or `all`)".into());
        }
        Ok(MatchBlock {
            criteria,
            lines: Vec::new(),
        })
    }

    /// Whether every criterion holds for `ctx`.
    pub fn matches(&self, ctx: &MatchContext<'_>) -> bool {
        self.holds(
            Some(ctx.user),
            ctx.groups,
            Some(ctx.peer),
            Some(ctx.local),
            Some(ctx.local_port),
        )
    }

    /// Whether every criterion holds for what is known of a login; one on
    /// a detail `ctx` lacks does not (`skiffd -T -C`).
    pub fn matches_partial(&self, ctx: &PartialContext) -> bool {
        self.holds(
            ctx.user.as_deref(),
            &ctx.groups,
            ctx.peer,
            ctx.local,
            ctx.local_port,
        )
    }

    fn holds(
        &self,
        user: Option<&str>,
        groups: &[String],
        peer: Option<IpAddr>,
        local: Option<IpAddr>,
        local_port: Option<u16>,
    ) -> bool {
        let outcome =
            |list: &[String], text: &str| match_list(list.iter().map(String::as_str), text);
        let list_hit = |list: &[String], text: &str| outcome(list, text).is_match();
        self.criteria.iter().all(|c| match c {
            Criterion::All => true,
            Criterion::User(list) => user.is_some_and(|u| list_hit(list, u)),
            Criterion::Group(list) => {
                // A negated group excludes its members; otherwise one group
                // that matches is enough.
                let outcomes: Vec<ListMatch> = groups.iter().map(|g| outcome(list, g)).collect();
                user.is_some()
                    && !outcomes.contains(&ListMatch::Negated)
                    && outcomes.contains(&ListMatch::Positive)
            }
            Criterion::Address(list) | Criterion::Host(list) => {
                peer.is_some_and(|ip| from_allows(list, ip, None))
            }
            Criterion::LocalAddress(list) => local.is_some_and(|ip| from_allows(list, ip, None)),
            Criterion::LocalPort(list) => {
                local_port.is_some_and(|p| list_hit(list, &p.to_string()))
            }
            Criterion::Version(list) => list_hit(list, crate::SOFTWARE_VERSION),
        })
    }
}

/// A CIDR syntax check (the matching itself is `from_allows`').
mod ipnet_like {
    pub struct Cidr;

    impl std::str::FromStr for Cidr {
        type Err = ();
        fn from_str(s: &str) -> Result<Self, ()> {
            let (addr, bits) = s.split_once('/').ok_or(())?;
            let ip: std::net::IpAddr = addr.parse().map_err(|_| ())?;
            let bits: u8 = bits.parse().map_err(|_| ())?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            (bits <= max).then_some(Cidr).ok_or(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(user: &'a str, groups: &'a [String], peer: &str) -> MatchContext<'a> {
        MatchContext {
            user,
            groups,
            peer: peer.parse().unwrap(),
            local: "127.0.0.1".parse().unwrap(),
            local_port: 2222,
        }
    }

    fn block(line: &str) -> MatchBlock {
        let words: Vec<&str> = line.split_whitespace().collect();
        MatchBlock::parse(&words).unwrap()
    }

    #[test]
    fn criteria_all_must_hold() {
        let groups = vec!["staff".to_string(), "sftp".to_string()];
        let none: Vec<String> = Vec::new();
        let b = block("User alice,bob* Address 10.0.0.0/8,!10.9.9.9");
        assert!(b.matches(&ctx("alice", &none, "10.1.2.3")));
        assert!(b.matches(&ctx("bobby", &none, "10.1.2.3")));
        assert!(!b.matches(&ctx("carol", &none, "10.1.2.3")));
        assert!(!b.matches(&ctx("alice", &none, "192.168.1.1")));
        assert!(!b.matches(&ctx("alice", &none, "10.9.9.9")));

        let b = block("Group sftp");
        assert!(b.matches(&ctx("x", &groups, "1.2.3.4")));
        assert!(!b.matches(&ctx("x", &none, "1.2.3.4")));
        let b = block("Group *,!staff");
        assert!(!b.matches(&ctx("x", &groups, "1.2.3.4")));
        let b = block("User !root,* LocalPort 2222");
        assert!(b.matches(&ctx("x", &none, "1.2.3.4")));
        assert!(!b.matches(&ctx("root", &none, "1.2.3.4")));
        let b = block("LocalPort 22");
        assert!(!b.matches(&ctx("x", &none, "1.2.3.4")));
        let b = block("Host 127.0.0.*");
        assert!(b.matches(&ctx("x", &none, "127.0.0.9")));
        assert!(block("all").matches(&ctx("x", &none, "::1")));
        let b = block("LocalAddress 127.0.0.1");
        assert!(b.matches(&ctx("x", &none, "::1")));
    }

    #[test]
    fn a_missing_detail_fails_its_criterion() {
        let known = PartialContext {
            user: Some("alice".into()),
            peer: Some("10.1.2.3".parse().unwrap()),
            ..PartialContext::default()
        };
        assert!(block("User alice Address 10.0.0.0/8").matches_partial(&known));
        assert!(block("All").matches_partial(&known));
        // Negated or not, a criterion on what -C did not give fails.
        for line in ["LocalPort 22", "LocalAddress !10.0.0.1", "Group *"] {
            assert!(!block(line).matches_partial(&known), "{line}");
        }
        let nobody = PartialContext::default();
        assert!(!block("User !root").matches_partial(&nobody));
        assert!(!block("Host *").matches_partial(&nobody));
    }

    #[test]
    fn version_matches_skiffds_own() {
        let none: Vec<String> = Vec::new();
        let c = ctx("x", &none, "10.0.0.1");
        assert!(crate::SOFTWARE_VERSION.starts_with("skiffd_"));
        assert!(block("Version skiffd_*").matches(&c));
        assert!(block(&format!("Version {}", crate::SOFTWARE_VERSION)).matches(&c));
        assert!(!block("Version OpenSSH_*").matches(&c));
        assert!(!block("Version !skiffd_*,*").matches(&c));
        assert!(!block("User x Version OpenSSH_10.*").matches(&c));
    }

    #[test]
    fn bad_match_lines_say_why() {
        for (line, needle) in [
            ("", "criteria"),
            ("User", "pattern list"),
            ("Tagged x", "unsupported Match criterion"),
            ("All User x", "cannot be combined"),
            ("Address 10.0.0.0/99", "CIDR"),
            ("LocalPort http", "bad port"),
            ("User ,", "pattern list"),
        ] {
            let words: Vec<&str> = line.split_whitespace().collect();
            let e = MatchBlock::parse(&words).unwrap_err();
            assert!(e.contains(needle), "{line:?}: {e}");
        }
    }
}
