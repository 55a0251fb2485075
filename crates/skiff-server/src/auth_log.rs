//! The log lines sshd writes about logins, in sshd's own words, so that
//! tools that read sshd's log (fail2ban, logwatch, sshguard) read
//! skiffd's: "Accepted publickey for USER from ADDR port N ssh2: ED25519
//! SHA256:...", "Invalid user USER from ADDR port N", and the rest. Pure:
//! the handler logs what these return. Text a client chose is made
//! printable first, so no user name can start a forged log line.

use std::fmt;
use std::net::SocketAddr;

/// The key type as sshd names it in logs, from its SSH name
/// (`ssh-ed25519` is `ED25519`, `rsa-sha2-512` is `RSA`).
pub fn key_type(ssh_name: &str) -> String {
    let cert = ssh_name.contains("-cert-v01@openssh.com");
    let base = match ssh_name {
        n if n.starts_with("sk-ecdsa-") => "ECDSA-SK",
        n if n.starts_with("sk-ssh-ed25519") => "ED25519-SK",
        n if n.starts_with("ssh-ed25519") => "ED25519",
        n if n.starts_with("ecdsa-sha2-") => "ECDSA",
        n if n.starts_with("ssh-rsa") || n.starts_with("rsa-sha2-") => "RSA",
        n if n.starts_with("ssh-dss") => "DSA",
        n if n.starts_with("ssh-ed448") => "ED448",
        _ => "UNKNOWN",
    };
    match cert {
        true => format!("{base}-CERT"),
        false => base.to_string(),
    }
}

/// What signed in: a key, or a certificate and its CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// [`key_type`]'s name (with `-CERT` for a certificate).
    pub key_type: String,
    /// `SHA256:...` of the key (a certificate's own key).
    pub fingerprint: String,
    pub certificate: Option<crate::audit::CertificateInfo>,
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key_type, self.fingerprint)?;
        if let Some(c) = &self.certificate {
            write!(
                f,
                " ID {} (serial {}) CA {} {}",
                printable(&c.key_id),
                c.serial,
                c.ca_type,
                c.ca_fingerprint
            )?;
        }
        Ok(())
    }
}

/// `s` with control characters escaped (`\n` as `\n`, others `\u{..}`).
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// "from ADDR port N", or "from UNKNOWN port 65535" as sshd says of a
/// connection that is no socket.
struct From(Option<SocketAddr>);

impl fmt::Display for From {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{} port {}", p.ip(), p.port()),
            None => write!(f, "UNKNOWN port 65535"),
        }
    }
}

/// How a login request authenticated: a key (or certificate), a password,
/// or PAM's keyboard-interactive questions.
#[derive(Debug, Clone, Copy)]
pub enum How<'a> {
    Key(&'a Credential),
    Password,
    KeyboardInteractive,
}

impl How<'_> {
    /// The method as sshd's log names it.
    pub fn method(&self) -> &'static str {
        match self {
            How::Key(_) => "publickey",
            How::Password => "password",
            How::KeyboardInteractive => "keyboard-interactive/pam",
        }
    }
}

/// " ssh2: CREDENTIAL" for a key, " ssh2" otherwise.
struct Tail<'a>(How<'a>);

impl fmt::Display for Tail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            How::Key(credential) => write!(f, " ssh2: {credential}"),
            _ => write!(f, " ssh2"),
        }
    }
}

/// "Accepted METHOD for USER from ADDR port N ssh2[: CREDENTIAL]".
pub fn accepted(user: &str, peer: Option<SocketAddr>, how: How<'_>) -> String {
    format!(
        "Accepted {} for {} from {}{}",
        how.method(),
        printable(user),
        From(peer),
        Tail(how)
    )
}

/// "Partial METHOD for USER from ADDR port N ssh2[: CREDENTIAL]" (a step
/// of `AuthenticationMethods`).
pub fn partial(user: &str, peer: Option<SocketAddr>, how: How<'_>) -> String {
    format!(
        "Partial {} for {} from {}{}",
        how.method(),
        printable(user),
        From(peer),
        Tail(how)
    )
}

/// "Failed METHOD for [invalid user ]USER from ADDR port N ssh2[: CREDENTIAL]".
pub fn failed(user: &str, valid: bool, peer: Option<SocketAddr>, how: How<'_>) -> String {
    let invalid = if valid { "" } else { "invalid user " };
    format!(
        "Failed {} for {invalid}{} from {}{}",
        how.method(),
        printable(user),
        From(peer),
        Tail(how)
    )
}

/// "Invalid user USER from ADDR port N".
pub fn invalid_user(user: &str, peer: Option<SocketAddr>) -> String {
    format!("Invalid user {} from {}", printable(user), From(peer))
}

/// Who a connection that ended was: nobody yet, someone authenticating
/// (valid account or not), or a logged-in user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    Nobody,
    Authenticating { user: String, valid: bool },
    LoggedIn(String),
}

/// The line for a connection that ended: "Connection closed by
/// authenticating user USER ADDR port N `[preauth]`" (or "invalid user",
/// or no user at all), "Disconnected from user USER ADDR port N" after a
/// login.
pub fn closed(who: &Who, peer: Option<SocketAddr>) -> String {
    let at = match peer {
        Some(p) => format!("{} port {}", p.ip(), p.port()),
        None => "UNKNOWN port 65535".to_string(),
    };
    match who {
        Who::Nobody => format!("Connection closed by {at} [preauth]"),
        Who::Authenticating { user, valid: true } => format!(
            "Connection closed by authenticating user {} {at} [preauth]",
            printable(user)
        ),
        Who::Authenticating { user, valid: false } => format!(
            "Connection closed by invalid user {} {at} [preauth]",
            printable(user)
        ),
        Who::LoggedIn(user) => format!("Disconnected from user {} {at}", printable(user)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Option<SocketAddr> {
        Some("127.0.0.1:50022".parse().unwrap())
    }

    fn key() -> Credential {
        Credential {
            key_type: key_type("ssh-ed25519"),
            fingerprint: "SHA256:abc".into(),
            certificate: None,
        }
    }

    #[test]
    fn key_types_as_sshd_names_them() {
        assert_eq!(key_type("ssh-ed25519"), "ED25519");
        assert_eq!(key_type("rsa-sha2-512"), "RSA");
        assert_eq!(key_type("ecdsa-sha2-nistp256"), "ECDSA");
        assert_eq!(key_type("ssh-ed25519-cert-v01@openssh.com"), "ED25519-CERT");
        assert_eq!(key_type("rsa-sha2-256-cert-v01@openssh.com"), "RSA-CERT");
        assert_eq!(key_type("sk-ssh-ed25519@openssh.com"), "ED25519-SK");
    }

    #[test]
    fn lines_in_sshd_words() {
        assert_eq!(
            accepted("alice", peer(), How::Key(&key())),
            "Accepted publickey for alice from 127.0.0.1 port 50022 ssh2: ED25519 SHA256:abc"
        );
        let cert = Credential {
            key_type: key_type("ssh-ed25519-cert-v01@openssh.com"),
            fingerprint: "SHA256:abc".into(),
            certificate: Some(crate::audit::CertificateInfo {
                key_id: "alice-id".into(),
                serial: 42,
                ca_type: "ED25519".into(),
                ca_fingerprint: "SHA256:ca".into(),
            }),
        };
        assert_eq!(
            accepted("alice", peer(), How::Key(&cert)),
            "Accepted publickey for alice from 127.0.0.1 port 50022 ssh2: ED25519-CERT SHA256:abc ID alice-id (serial 42) CA ED25519 SHA256:ca"
        );
        assert_eq!(
            failed("bob", false, peer(), How::Key(&key())),
            "Failed publickey for invalid user bob from 127.0.0.1 port 50022 ssh2: ED25519 SHA256:abc"
        );
        assert_eq!(
            accepted("alice", peer(), How::Password),
            "Accepted password for alice from 127.0.0.1 port 50022 ssh2"
        );
        assert_eq!(
            failed("bob", true, peer(), How::KeyboardInteractive),
            "Failed keyboard-interactive/pam for bob from 127.0.0.1 port 50022 ssh2"
        );
        assert_eq!(
            partial("alice", peer(), How::Password),
            "Partial password for alice from 127.0.0.1 port 50022 ssh2"
        );
        assert_eq!(
            invalid_user("bob", peer()),
            "Invalid user bob from 127.0.0.1 port 50022"
        );
        let who = Who::Authenticating {
            user: "root".into(),
            valid: true,
        };
        assert_eq!(
            closed(&who, peer()),
            "Connection closed by authenticating user root 127.0.0.1 port 50022 [preauth]"
        );
        assert_eq!(
            closed(&Who::LoggedIn("root".into()), peer()),
            "Disconnected from user root 127.0.0.1 port 50022"
        );
        assert_eq!(
            closed(&Who::Nobody, None),
            "Connection closed by UNKNOWN port 65535 [preauth]"
        );
    }

    #[test]
    fn a_user_name_cannot_forge_a_line() {
        let line = invalid_user("x\nAccepted publickey for root", peer());
        assert!(!line.contains('\n'));
        assert!(line.starts_with("Invalid user x\\nAccepted"));
    }
}
