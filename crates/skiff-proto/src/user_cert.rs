//! Whether a server admits a user certificate, as sshd decides it.
//!
//! A certificate is admitted when its CA is trusted for the account, either
//! by a `cert-authority` line of the account's authorized_keys (whose
//! `principals=`, `from=` and `expiry-time=` then apply, and whose other
//! options restrict the session) or by the server's `TrustedUserCAKeys`;
//! when it names the account among its principals (or, on a
//! `cert-authority` line with `principals=`, one of those); and when every
//! critical option is one the server enforces: `force-command`,
//! `source-address` and `verify-required`. Its extensions grant what they
//! name: a session without `permit-pty` gets no terminal, and so on;
//! `no-touch-required` waives a security key's touch where the line that
//! admitted the certificate (if any) waives it too.
//!
//! The caller has already checked the CA's signature over the certificate,
//! its validity period and the client's signature with the certified key.
//! Everything here is sans-IO.

use std::net::IpAddr;

use crate::algorithms::CA_SIGNATURE;
use crate::authorized_keys::{self, AuthorizedKey, AuthorizedPrincipal, KeyOptions};

/// What the decision needs to know of a certificate.
#[derive(Debug, Clone, Copy)]
pub struct UserCertificate<'a> {
    /// Certificate type 1 (user); 2 is a host certificate.
    pub is_user_certificate: bool,
    /// The key id, for messages.
    pub key_id: &'a str,
    pub principals: &'a [String],
    /// Critical options, name and value.
    pub critical_options: &'a [(String, String)],
    /// Extension names.
    pub extensions: &'a [String],
    /// The CA key's type and blob.
    pub ca_key_type: &'a str,
    pub ca_blob: &'a [u8],
    /// The algorithm of the CA's signature, e.g. `rsa-sha2-512`.
    pub signature_algorithm: &'a str,
}

/// Who vouched for an admitted certificate, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// A `cert-authority` line of authorized_keys, at this line.
    AuthorizedKeys(usize),
    /// `TrustedUserCAKeys`.
    TrustedUserCaKeys,
    /// `TrustedUserCAKeys`, with the principal at this line of the
    /// account's `AuthorizedPrincipalsFile`.
    PrincipalsFile(usize),
}

/// Decides whether `user`, connecting from `peer`, may log in with `cert`.
/// `authorized` is the account's authorized_keys, `trusted` the server's
/// `TrustedUserCAKeys`, `principals_file` the account's
/// `AuthorizedPrincipalsFile` when one is configured (empty when it is
/// missing): for a `TrustedUserCAKeys` CA, a certificate principal must
/// then be listed there instead of the account's name. `now` is Unix time,
/// `utc_offset` the local zone's offset in seconds (for `expiry-time`).
/// `ca_signatures` are the signature algorithms a CA may have used
/// (`CASignatureAlgorithms`; never RSA with SHA-1). On success, the options
/// the session runs under.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    authorized: &[AuthorizedKey],
    trusted: &[AuthorizedKey],
    principals_file: Option<&[AuthorizedPrincipal]>,
    user: &str,
    cert: &UserCertificate<'_>,
    ca_signatures: &[String],
    peer: IpAddr,
    now: i64,
    utc_offset: i64,
) -> Result<(KeyOptions, Authority), String> {
    let id = cert.key_id;
    if !cert.is_user_certificate {
        return Err(format!("certificate {id:?} is a host certificate"));
    }
    let alg = cert.signature_algorithm;
    if !ca_signatures.iter().any(|a| a == alg) || !CA_SIGNATURE.default.contains(&alg) {
        let sha1 = if alg == "ssh-rsa" {
            " (RSA with SHA-1 is never accepted)"
        } else {
            ""
        };
        return Err(format!(
            "certificate {id:?} is signed with {alg}, which CASignatureAlgorithms leaves out{sha1}"
        ));
    }
    let line = authorized_keys::find_cert_authority(authorized, cert.ca_key_type, cert.ca_blob);
    let in_trusted = trusted
        .iter()
        .any(|k| !k.options.cert_authority && k.key_blob == cert.ca_blob);
    let (mut options, authority) = match (line, in_trusted) {
        (Some(line), _) => {
            let o = &line.options;
            let what = format!("the cert-authority line {}", line.line);
            line_allows(o, &what, peer, now, utc_offset)?;
            let named = match &o.principals {
                // One of the line's names must be among the certificate's.
                Some(allowed) => cert.principals.iter().any(|p| allowed.contains(p)),
                // Without principals=, the account's name; a certificate
                // listing no principals is valid for any (as in sshd).
                None => cert.principals.is_empty() || cert.principals.iter().any(|p| p == user),
            };
            if !named {
                return Err(format!(
                    "certificate {id:?} names none of the principals the cert-authority line {} allows ({})",
                    line.line,
                    cert.principals.join(", ")
                ));
            }
            (o.clone(), Authority::AuthorizedKeys(line.line))
        }
        (None, true) => match principals_file {
            // TrustedUserCAKeys: the account's name must be listed...
            None => {
                if !cert.principals.iter().any(|p| p == user) {
                    return Err(format!(
                        "{user} is not among the principals of certificate {id:?} ({})",
                        cert.principals.join(", ")
                    ));
                }
                (KeyOptions::default(), Authority::TrustedUserCaKeys)
            }
            // ...or, with a principals file, one of the names in it.
            Some(allowed) => {
                let entry = allowed
                    .iter()
                    .find(|a| cert.principals.contains(&a.name))
                    .ok_or_else(|| {
                        format!(
                            "none of the principals of certificate {id:?} ({}) is in {user}'s AuthorizedPrincipalsFile",
                            cert.principals.join(", ")
                        )
                    })?;
                let what = format!("the AuthorizedPrincipalsFile line {}", entry.line);
                line_allows(&entry.options, &what, peer, now, utc_offset)?;
                (entry.options.clone(), Authority::PrincipalsFile(entry.line))
            }
        },
        (None, false) => {
            return Err(format!(
                "certificate {id:?} is signed by a CA that is trusted neither in authorized_keys nor in TrustedUserCAKeys"
            ))
        }
    };
    // What admitted the certificate says nothing about the session.
    options.cert_authority = false;
    options.principals = None;
    for (name, value) in cert.critical_options {
        match name.as_str() {
            "force-command" => match &options.command {
                Some(existing) if existing != value => {
                    return Err(format!(
                        "certificate {id:?} forces a command and authorized_keys forces another"
                    ))
                }
                _ => options.command = Some(value.clone()),
            },
            // A security key's signature must show user verification
            // (checked by the server with the signature; for other keys,
            // as in sshd, it asks nothing).
            "verify-required" => options.verify_required = true,
            "source-address" => {
                let blocks: Vec<String> = value.split(',').map(|b| b.trim().to_owned()).collect();
                let well_formed = blocks
                    .iter()
                    .all(|b| !b.is_empty() && !b.starts_with('!') && !b.contains(['*', '?']));
                if !well_formed || !authorized_keys::from_allows(&blocks, peer, None) {
                    return Err(format!(
                        "certificate {id:?} is valid only from {value}, not from {peer}"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "certificate {id:?} has the critical option {other:?}, which skiffd does not enforce"
                ))
            }
        }
    }
    let has = |e: &str| cert.extensions.iter().any(|x| x == e);
    // A security key may sign without a touch only where both the
    // certificate (its `no-touch-required` extension) and the line that
    // admitted it, if any, allow it, as sshd merges them.
    options.no_touch_required = has("no-touch-required")
        && (authority == Authority::TrustedUserCaKeys || options.no_touch_required);
    options.no_pty |= !has("permit-pty");
    options.no_port_forwarding |= !has("permit-port-forwarding");
    options.no_agent_forwarding |= !has("permit-agent-forwarding");
    options.no_x11_forwarding |= !has("permit-X11-forwarding");
    options.no_user_rc |= !has("permit-user-rc");
    Ok((options, authority))
}

/// Whether a line's `from=` and `expiry-time=` let `peer` in now.
fn line_allows(
    options: &KeyOptions,
    what: &str,
    peer: IpAddr,
    now: i64,
    utc_offset: i64,
) -> Result<(), String> {
    if let Some(from) = &options.from {
        if !authorized_keys::from_allows(from, peer, None) {
            return Err(format!("{what} does not allow {peer} (from=)"));
        }
    }
    if authorized_keys::is_expired(options, now, utc_offset) {
        return Err(format!("{what} has expired (expiry-time=)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authorized_keys::parse;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;

    use crate::test_keys::ed25519_blob as blob;

    fn key_line(options: &str, key: &[u8]) -> String {
        format!("{options} ssh-ed25519 {}\n", STANDARD.encode(key))
            .trim_start()
            .to_owned()
    }

    struct Cert {
        principals: Vec<String>,
        critical: Vec<(String, String)>,
        extensions: Vec<String>,
        ca: Vec<u8>,
    }

    impl Cert {
        fn new(principals: &[&str]) -> Self {
            Cert {
                principals: principals.iter().map(|p| p.to_string()).collect(),
                critical: Vec::new(),
                extensions: ["permit-pty", "permit-user-rc"]
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
                ca: blob(1),
            }
        }

        fn view(&self) -> UserCertificate<'_> {
            UserCertificate {
                is_user_certificate: true,
                key_id: "alice@laptop",
                principals: &self.principals,
                critical_options: &self.critical,
                extensions: &self.extensions,
                ca_key_type: "ssh-ed25519",
                ca_blob: &self.ca,
                signature_algorithm: "ssh-ed25519",
            }
        }
    }

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const NOW: i64 = 1_800_000_000;

    /// The default `CASignatureAlgorithms`.
    fn ca() -> Vec<String> {
        CA_SIGNATURE.defaults()
    }

    fn admit_with(
        authorized: &str,
        trusted: &str,
        user: &str,
        cert: &UserCertificate<'_>,
    ) -> Result<(KeyOptions, Authority), String> {
        let (ak, w1) = parse("ak", authorized);
        let (tk, w2) = parse("ca", trusted);
        assert!(w1.is_empty() && w2.is_empty(), "{w1:?} {w2:?}");
        admit(&ak, &tk, None, user, cert, &ca(), LOOPBACK, NOW, 0)
    }

    #[test]
    fn a_cert_authority_line_admits_the_named_account_with_its_restrictions() {
        let c = Cert::new(&["alice", "ops"]);
        let ak = key_line("cert-authority,no-port-forwarding", &c.ca);
        let (options, authority) = admit_with(&ak, "", "alice", &c.view()).unwrap();
        assert_eq!(authority, Authority::AuthorizedKeys(1));
        assert!(options.no_port_forwarding && !options.cert_authority);
        // Extensions not granted are taken away; granted ones stay.
        assert!(!options.no_pty && !options.no_user_rc);
        assert!(options.no_agent_forwarding && options.no_x11_forwarding);
        let err = admit_with(&ak, "", "bob", &c.view()).unwrap_err();
        assert!(err.contains("names none of the principals"), "{err}");
        // principals= replaces the account name.
        let ak = key_line("cert-authority,principals=\"ops,dba\"", &c.ca);
        assert!(admit_with(&ak, "", "bob", &c.view()).is_ok());
        let other = Cert::new(&["alice"]);
        assert!(admit_with(&ak, "", "alice", &other.view()).is_err());
        // A certificate with no principals, on a line without principals=.
        let any = Cert::new(&[]);
        let ak = key_line("cert-authority", &any.ca);
        assert!(admit_with(&ak, "", "anyone", &any.view()).is_ok());
    }

    #[test]
    fn the_ca_must_be_trusted_and_the_line_must_allow_the_client() {
        let c = Cert::new(&["alice"]);
        // The CA's key as a plain authorized key is not a CA.
        let err = admit_with(&key_line("", &c.ca), "", "alice", &c.view()).unwrap_err();
        assert!(err.contains("trusted neither"), "{err}");
        let ak = key_line("cert-authority,from=\"10.0.0.0/8\"", &c.ca);
        assert!(admit_with(&ak, "", "alice", &c.view())
            .unwrap_err()
            .contains("from="));
        let ak = key_line("cert-authority,expiry-time=\"20200101\"", &c.ca);
        assert!(admit_with(&ak, "", "alice", &c.view())
            .unwrap_err()
            .contains("expired"));
        let user_as_host = UserCertificate {
            is_user_certificate: false,
            ..c.view()
        };
        let ak = key_line("cert-authority", &c.ca);
        assert!(admit_with(&ak, "", "alice", &user_as_host).is_err());
        let sha1 = UserCertificate {
            signature_algorithm: "ssh-rsa",
            ..c.view()
        };
        assert!(admit_with(&ak, "", "alice", &sha1)
            .unwrap_err()
            .contains("SHA-1"));
        // A narrower CASignatureAlgorithms leaves the CA's algorithm out.
        let (ak, _) = parse("ak", &ak);
        let narrow = ["rsa-sha2-512".to_string()];
        let err = admit(
            &ak,
            &[],
            None,
            "alice",
            &c.view(),
            &narrow,
            LOOPBACK,
            NOW,
            0,
        )
        .unwrap_err();
        assert!(err.contains("CASignatureAlgorithms"), "{err}");
    }

    #[test]
    fn trusted_user_ca_keys_need_the_account_among_the_principals() {
        let c = Cert::new(&["alice"]);
        let trusted = key_line("", &c.ca);
        let (options, authority) = admit_with("", &trusted, "alice", &c.view()).unwrap();
        assert_eq!(authority, Authority::TrustedUserCaKeys);
        assert!(options.command.is_none() && !options.no_pty);
        assert!(admit_with("", &trusted, "bob", &c.view()).is_err());
        // Here a certificate without principals is valid for no one.
        let none = Cert::new(&[]);
        assert!(admit_with("", &key_line("", &none.ca), "alice", &none.view()).is_err());
    }

    #[test]
    fn a_principals_file_replaces_the_account_name() {
        let (tk, _) = parse("ca", &key_line("", &blob(1)));
        let (file, w) = authorized_keys::parse_principals(
            "ap",
            "dba\ncommand=\"uptime\",from=\"127.0.0.0/8\" ops\nfrom=\"10.0.0.0/8\" web\n",
        );
        assert!(w.is_empty(), "{w:?}");
        let with = |c: &Cert| {
            admit(
                &[],
                &tk,
                Some(&file),
                "alice",
                &c.view(),
                &ca(),
                LOOPBACK,
                NOW,
                0,
            )
        };
        // The account's own name is not enough any more.
        assert!(with(&Cert::new(&["alice"]))
            .unwrap_err()
            .contains("AuthorizedPrincipalsFile"));
        let (options, authority) = with(&Cert::new(&["alice", "ops"])).unwrap();
        assert_eq!(authority, Authority::PrincipalsFile(2));
        assert_eq!(options.command.as_deref(), Some("uptime"));
        assert!(with(&Cert::new(&["web"])).unwrap_err().contains("from="));
        // A configured file that is missing admits no one.
        let none = admit(
            &[],
            &tk,
            Some(&[]),
            "alice",
            &Cert::new(&["alice"]).view(),
            &ca(),
            LOOPBACK,
            NOW,
            0,
        );
        assert!(none.is_err());
    }

    #[test]
    fn critical_options_are_enforced_or_refused() {
        let trusted = key_line("", &blob(1));
        let mut c = Cert::new(&["alice"]);
        c.critical = vec![("force-command".into(), "uptime".into())];
        let (options, _) = admit_with("", &trusted, "alice", &c.view()).unwrap();
        assert_eq!(options.command.as_deref(), Some("uptime"));
        // The same command on the line is fine, another one is not.
        let same = key_line("cert-authority,command=\"uptime\"", &c.ca);
        assert!(admit_with(&same, "", "alice", &c.view()).is_ok());
        let other = key_line("cert-authority,command=\"date\"", &c.ca);
        assert!(admit_with(&other, "", "alice", &c.view()).is_err());

        c.critical = vec![("source-address".into(), "192.0.2.0/24, 127.0.0.0/8".into())];
        assert!(admit_with("", &trusted, "alice", &c.view()).is_ok());
        c.critical = vec![("source-address".into(), "192.0.2.0/24".into())];
        let err = admit_with("", &trusted, "alice", &c.view()).unwrap_err();
        assert!(err.contains("valid only from 192.0.2.0/24"), "{err}");
        c.critical = vec![("source-address".into(), "*".into())];
        assert!(admit_with("", &trusted, "alice", &c.view()).is_err());

        c.critical = vec![("verify-required".into(), String::new())];
        let (options, _) = admit_with("", &trusted, "alice", &c.view()).unwrap();
        assert!(options.verify_required);
        c.critical = vec![("no-such-option".into(), String::new())];
        let err = admit_with("", &trusted, "alice", &c.view()).unwrap_err();
        assert!(err.contains("does not enforce"), "{err}");
    }

    #[test]
    fn no_touch_required_needs_the_certificate_and_the_line() {
        let trusted = key_line("", &blob(1));
        let mut c = Cert::new(&["alice"]);
        let (options, _) = admit_with("", &trusted, "alice", &c.view()).unwrap();
        assert!(!options.no_touch_required && !options.verify_required);
        c.extensions.push("no-touch-required".into());
        // TrustedUserCAKeys: the certificate alone says it.
        let (options, _) = admit_with("", &trusted, "alice", &c.view()).unwrap();
        assert!(options.no_touch_required);
        // A cert-authority line must say it too.
        let line = key_line("cert-authority", &c.ca);
        let (options, _) = admit_with(&line, "", "alice", &c.view()).unwrap();
        assert!(!options.no_touch_required);
        let line = key_line("cert-authority,no-touch-required", &c.ca);
        let (options, _) = admit_with(&line, "", "alice", &c.view()).unwrap();
        assert!(options.no_touch_required);
        // The line alone does not.
        c.extensions.retain(|e| e != "no-touch-required");
        let (options, _) = admit_with(&line, "", "alice", &c.view()).unwrap();
        assert!(!options.no_touch_required);
        // verify-required on the line stays.
        let line = key_line("cert-authority,verify-required", &c.ca);
        let (options, _) = admit_with(&line, "", "alice", &c.view()).unwrap();
        assert!(options.verify_required);
    }
}
