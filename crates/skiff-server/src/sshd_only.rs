//! sshd_config keywords that skiffd accepts without acting on, so that a
//! stock sshd_config (Debian's has `X11Forwarding yes`) can be served as
//! it is. Each is accepted only where ignoring it can never widen access:
//! cosmetic and logging settings, and features skiffd never offers (X11,
//! tunnels, GSSAPI), whatever their value. Anything that would
//! narrow access if honoured, such as `PubkeyAuthentication no`, stays an
//! error (`AuthenticationMethods` is skiffd's own: [`crate::auth_methods`]).
//! Pure: no I/O.

/// What skiffd makes of a keyword it does not implement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do: the value is what skiffd does anyway.
    Fine,
    /// Accepted; the note says what skiffd does instead (logged once).
    Noted(String),
    /// Refused: the line is an error with this message.
    Refused(String),
}

/// Keywords with no bearing on who gets in or what they may do.
/// (`LogLevel` is read by the configuration; listed here, it is also
/// accepted inside `Match`, where it changes nothing.)
const COSMETIC: &[&str] = &[
    "compression",
    "debianbanner",
    "ipqos",
    "loglevel",
    "logverbose",
    "modulifile",
    "pidfile",
    "protocol",
    "tcpkeepalive",
    "usedns",
    "useprivilegeseparation",
    "versionaddendum",
];

/// Features skiffd never offers: whatever their setting, it stays off.
const NEVER_OFFERED: &[(&str, &str)] = &[
    ("gssapiauthentication", "GSSAPI authentication"),
    ("gssapicleanupcredentials", "GSSAPI authentication"),
    ("gssapistrictacceptorcheck", "GSSAPI authentication"),
    ("hostbasedauthentication", "host-based authentication"),
    (
        "hostbasedusesnamefrompacketonly",
        "host-based authentication",
    ),
    ("ignorerhosts", "host-based authentication"),
    ("ignoreuserknownhosts", "host-based authentication"),
    ("kerberosauthentication", "Kerberos authentication"),
    ("kerberosgetafstoken", "Kerberos authentication"),
    ("kerberosorlocalpasswd", "Kerberos authentication"),
    ("kerberosticketcleanup", "Kerberos authentication"),
    ("permittunnel", "tun device forwarding"),
    ("permituserrc", "~/.ssh/rc files"),
    ("x11displayoffset", "X11 forwarding"),
    ("x11forwarding", "X11 forwarding"),
    ("x11uselocalhost", "X11 forwarding"),
    ("xauthlocation", "X11 forwarding"),
];

/// Whether `value` turns something on.
fn enables(value: &str) -> bool {
    !matches!(
        value.to_ascii_lowercase().as_str(),
        "no" | "none" | "false" | "off" | ""
    )
}

/// The verdict on `keyword` (lowercase) with its `args`, or `None` when it
/// is not one of these keywords.
pub fn verdict(keyword: &str, args: &[&str]) -> Option<Verdict> {
    let first = args.first().copied().unwrap_or("");
    if COSMETIC.contains(&keyword) {
        return Some(Verdict::Fine);
    }
    if let Some((_, feature)) = NEVER_OFFERED.iter().find(|(k, _)| *k == keyword) {
        return Some(if enables(first) && !keyword.starts_with("ignore") {
            Verdict::Noted(format!("skiffd does not offer {feature}; it stays off"))
        } else {
            Verdict::Fine
        });
    }
    Some(match keyword {
        "pubkeyauthentication" if enables(first) => Verdict::Fine,
        "pubkeyauthentication" => Verdict::Refused(
            "PubkeyAuthentication no: skiffd authenticates with public keys only".into(),
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_defaults_are_accepted() {
        assert_eq!(verdict("usedns", &["no"]), Some(Verdict::Fine));
        // Read by the configuration: skiffd acts on them.
        assert_eq!(verdict("printmotd", &["no"]), None);
        assert_eq!(verdict("printlastlog", &["no"]), None);
        assert_eq!(
            verdict("gssapiauthentication", &["no"]),
            Some(Verdict::Fine)
        );
        assert!(
            matches!(verdict("x11forwarding", &["yes"]), Some(Verdict::Noted(n)) if n.contains("X11"))
        );
        assert_eq!(verdict("x11forwarding", &["no"]), Some(Verdict::Fine));
        assert_eq!(verdict("ignorerhosts", &["yes"]), Some(Verdict::Fine));
    }

    #[test]
    fn what_would_narrow_access_is_refused() {
        assert!(matches!(
            verdict("pubkeyauthentication", &["no"]),
            Some(Verdict::Refused(_))
        ));
        assert_eq!(
            verdict("pubkeyauthentication", &["yes"]),
            Some(Verdict::Fine)
        );
        assert_eq!(verdict("pubkeyacceptedalgorithms", &["ssh-ed25519"]), None);
        assert_eq!(verdict("nosuchkeyword", &[]), None);
    }
}
