//! Who may log in at all, before any key is looked at: `DenyUsers`,
//! `AllowUsers`, `DenyGroups`, `AllowGroups` (checked in that order, as
//! sshd does) and `PermitRootLogin`. The rules are data and a pure check;
//! the handler supplies the account's groups and the peer's address.

use std::net::IpAddr;

use skiff_proto::authorized_keys::from_allows;
use skiff_proto::pattern::wildcard_match;

/// `PermitRootLogin`: `prohibit-password` (and its old name
/// `without-password`) admits root with keys only; `yes` with a password
/// too (through PAM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RootLogin {
    /// Any method.
    Yes,
    #[default]
    Keys,
    /// Only with a key (or certificate) that forces a command.
    ForcedCommandsOnly,
    No,
}

impl RootLogin {
    /// Whether root may log in by password or keyboard-interactive.
    pub fn admits_root_by_password(self) -> bool {
        self == RootLogin::Yes
    }

    pub fn parse(value: &str) -> Result<RootLogin, String> {
        match value.to_ascii_lowercase().as_str() {
            "yes" => Ok(RootLogin::Yes),
            "prohibit-password" | "without-password" => Ok(RootLogin::Keys),
            "forced-commands-only" => Ok(RootLogin::ForcedCommandsOnly),
            "no" => Ok(RootLogin::No),
            _ => Err(format!(
                "PermitRootLogin: expected yes, prohibit-password, forced-commands-only or no, got {value:?}"
            )),
        }
    }
}

/// The access rules of one server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    /// Patterns `USER` or `USER@HOST` (HOST: address patterns or CIDR).
    pub allow_users: Vec<String>,
    pub deny_users: Vec<String>,
    /// Group name patterns.
    pub allow_groups: Vec<String>,
    pub deny_groups: Vec<String>,
    pub root_login: RootLogin,
}

/// Whether a `USER` or `USER@HOST` pattern matches `user` from `ip`.
fn user_pattern_matches(pattern: &str, user: &str, ip: IpAddr) -> bool {
    match pattern.rsplit_once('@') {
        Some((u, host)) => wildcard_match(u, user) && from_allows(&[host.to_string()], ip, None),
        None => wildcard_match(pattern, user),
    }
}

impl AccessRules {
    /// Why `user` (uid `uid`, member of `groups`) may not log in from
    /// `ip`; `None` when it may.
    pub fn refusal(&self, user: &str, uid: u32, groups: &[String], ip: IpAddr) -> Option<String> {
        if uid == 0 && self.root_login == RootLogin::No {
            return Some("PermitRootLogin no".into());
        }
        if let Some(p) = self
            .deny_users
            .iter()
            .find(|p| user_pattern_matches(p, user, ip))
        {
            return Some(format!("listed in DenyUsers ({p})"));
        }
        if !self.allow_users.is_empty()
            && !self
                .allow_users
                .iter()
                .any(|p| user_pattern_matches(p, user, ip))
        {
            return Some("not listed in AllowUsers".into());
        }
        let in_group = |patterns: &[String]| {
            patterns
                .iter()
                .find(|p| groups.iter().any(|g| wildcard_match(p, g)))
                .cloned()
        };
        if let Some(p) = in_group(&self.deny_groups) {
            return Some(format!("a group is listed in DenyGroups ({p})"));
        }
        if !self.allow_groups.is_empty() && in_group(&self.allow_groups).is_none() {
            return Some("no group is listed in AllowGroups".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_rules_admit_everyone() {
        let r = AccessRules::default();
        assert_eq!(r.refusal("root", 0, &[], ip("10.0.0.1")), None);
    }

    #[test]
    fn users_deny_first_then_allow() {
        let r = AccessRules {
            allow_users: vec!["ops*".into(), "deploy@10.0.0.0/8".into()],
            deny_users: vec!["ops-old".into()],
            ..AccessRules::default()
        };
        let g = groups(&["staff"]);
        assert_eq!(r.refusal("ops1", 1000, &g, ip("192.0.2.1")), None);
        assert!(r.refusal("ops-old", 1000, &g, ip("192.0.2.1")).is_some());
        assert_eq!(r.refusal("deploy", 1001, &g, ip("10.1.2.3")), None);
        assert!(r.refusal("deploy", 1001, &g, ip("192.0.2.1")).is_some());
        assert!(r.refusal("alice", 1002, &g, ip("10.1.2.3")).is_some());
    }

    #[test]
    fn groups_after_users() {
        let r = AccessRules {
            allow_groups: vec!["ssh-*".into()],
            deny_groups: vec!["contractors".into()],
            ..AccessRules::default()
        };
        let any = ip("127.0.0.1");
        assert_eq!(r.refusal("a", 1, &groups(&["ssh-users"]), any), None);
        assert!(r
            .refusal("a", 1, &groups(&["ssh-users", "contractors"]), any)
            .is_some());
        assert!(r.refusal("a", 1, &groups(&["staff"]), any).is_some());
    }

    #[test]
    fn root_login_settings() {
        assert_eq!(RootLogin::parse("yes"), Ok(RootLogin::Yes));
        assert!(RootLogin::Yes.admits_root_by_password());
        assert!(!RootLogin::Keys.admits_root_by_password());
        assert_eq!(RootLogin::parse("prohibit-password"), Ok(RootLogin::Keys));
        assert_eq!(RootLogin::parse("without-password"), Ok(RootLogin::Keys));
        assert_eq!(
            RootLogin::parse("forced-commands-only"),
            Ok(RootLogin::ForcedCommandsOnly)
        );
        assert!(RootLogin::parse("maybe").is_err());
        let r = AccessRules {
            root_login: RootLogin::No,
            ..AccessRules::default()
        };
        assert!(r.refusal("root", 0, &[], ip("127.0.0.1")).is_some());
        // Another name for uid 0 is root too.
        assert!(r.refusal("toor", 0, &[], ip("127.0.0.1")).is_some());
        assert_eq!(r.refusal("alice", 1000, &[], ip("127.0.0.1")), None);
    }
}
