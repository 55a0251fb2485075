//! Host certificates judged against known_hosts, as ssh judges them.
//!
//! A server may prove its identity with a host certificate
//! (`*-cert-v01@openssh.com`) instead of a bare key. The client trusts it when
//! a `@cert-authority` line that applies to the host holds the key that
//! signed it, and the certificate itself is fit for this host: a host (not a
//! user) certificate, inside its validity period, listing the host among its
//! principals (or listing none), with no critical options, signed with an
//! algorithm `CASignatureAlgorithms` allows. A `@revoked` line for the CA key
//! or for the certified key refuses it outright.
//!
//! Everything here is sans-IO and crypto-free: the caller decodes the
//! certificate into [`HostCertificate`] and, once this module says
//! [`CertVerdict::Trusted`], still verifies the CA's signature over it.

use std::borrow::Borrow;

use super::{cert_authorities, fingerprint_sha256, host_port_name, revoked, Found, KnownHostsFile};
#[cfg(test)]
use crate::algorithms::CA_SIGNATURE;
use crate::pattern::wildcard_match;

/// What the checks need to know of a certificate the server presented.
#[derive(Debug, Clone, Copy)]
pub struct HostCertificate<'a> {
    /// Certificate type 2 (host); 1 is a user certificate.
    pub is_host_certificate: bool,
    /// The key id the CA wrote into it, for messages.
    pub key_id: &'a str,
    /// The hosts it is valid for; empty means any host.
    pub principals: &'a [String],
    /// Valid from this Unix time on...
    pub valid_after: u64,
    /// ...until just before this one (`u64::MAX`: forever).
    pub valid_before: u64,
    /// Names of its critical options.
    pub critical_options: &'a [String],
    /// The certified key's blob (the key that signed the key exchange).
    pub key_blob: &'a [u8],
    /// The CA key's blob.
    pub ca_blob: &'a [u8],
    /// The algorithm of the CA's signature, e.g. `ssh-ed25519` or `rsa-sha2-512`.
    pub signature_algorithm: &'a str,
}

/// Which key a `@revoked` line named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokedKey {
    /// The key that signed the certificate.
    Authority,
    /// The host key inside the certificate.
    HostKey,
}

/// The outcome of [`check_host_certificate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertVerdict<'a> {
    /// A `@cert-authority` line (this one) vouches for the signing key and
    /// the certificate is fit for the host. The caller must still verify
    /// the signature with that key before trusting the certificate.
    Trusted(Found<'a>),
    /// A `@revoked` line names the CA key or the certified key: refuse the
    /// server, without looking at its plain key.
    Revoked { found: Found<'a>, key: RevokedKey },
    /// Not trusted, for this reason. ssh then checks the certified key as a
    /// plain host key.
    Untrusted(String),
}

/// Whether a `@cert-authority` line applies to `host`/`port` at all, in
/// which case the key exchange should ask for certificates.
pub fn authority_applies<F: Borrow<KnownHostsFile>>(files: &[F], host: &str, port: u16) -> bool {
    !cert_authorities(files, host, port).is_empty()
}

/// Judges `cert`, presented by `host`/`port` (the known_hosts lookup name),
/// at Unix time `now`. `principal` is the name the certificate must list:
/// the host name without a port (or the `HostKeyAlias`). Principals may be
/// `*`/`?` patterns, as ssh allows for host certificates.
///
/// Revocation is checked first, then the authority, then the certificate's
/// own fields, so the reason given is the most fundamental one.
pub fn check_host_certificate<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    principal: &str,
    cert: &HostCertificate<'_>,
    allowed_signatures: &[&str],
    now: u64,
) -> CertVerdict<'a> {
    for (blob, key) in [
        (cert.ca_blob, RevokedKey::Authority),
        (cert.key_blob, RevokedKey::HostKey),
    ] {
        // The set of revoked blobs is indexed; the host match (which may
        // hash the name) is only needed when the key is in it.
        if files.iter().any(|f| f.borrow().revokes_anywhere(blob)) {
            if let Some(found) = revoked(files, host, port, blob) {
                return CertVerdict::Revoked { found, key };
            }
        }
    }
    let authority = cert_authorities(files, host, port)
        .into_iter()
        .find(|found| found.entry.key_blob == cert.ca_blob);
    let Some(authority) = authority else {
        return CertVerdict::Untrusted(format!(
            "no @cert-authority line for {} holds the key that signed it ({})",
            host_port_name(host, port),
            fingerprint_sha256(cert.ca_blob)
        ));
    };
    match certificate_unfit(cert, principal, allowed_signatures, now) {
        Some(reason) => CertVerdict::Untrusted(reason),
        None => CertVerdict::Trusted(authority),
    }
}

/// Why the certificate's own fields make it unfit for `principal` at `now`.
fn certificate_unfit(
    cert: &HostCertificate<'_>,
    principal: &str,
    allowed_signatures: &[&str],
    now: u64,
) -> Option<String> {
    if !cert.is_host_certificate {
        return Some(format!(
            "certificate {:?} is a user certificate, not a host certificate",
            cert.key_id
        ));
    }
    if !allowed_signatures.contains(&cert.signature_algorithm) {
        return Some(format!(
            "certificate {:?} is signed with {}, which CASignatureAlgorithms does not allow",
            cert.key_id, cert.signature_algorithm
        ));
    }
    if now < cert.valid_after {
        return Some(format!(
            "certificate {:?} is not valid before {}",
            cert.key_id,
            format_utc(cert.valid_after)
        ));
    }
    if now >= cert.valid_before {
        return Some(format!(
            "certificate {:?} expired at {}",
            cert.key_id,
            format_utc(cert.valid_before)
        ));
    }
    let wanted = principal.to_ascii_lowercase();
    let listed = cert.principals.is_empty()
        || cert
            .principals
            .iter()
            .any(|p| wildcard_match(&p.to_ascii_lowercase(), &wanted));
    if !listed {
        return Some(format!(
            "{principal} is not among the principals of certificate {:?} ({})",
            cert.key_id,
            cert.principals.join(", ")
        ));
    }
    if !cert.critical_options.is_empty() {
        return Some(format!(
            "certificate {:?} has critical options, which host certificates cannot honour ({})",
            cert.key_id,
            cert.critical_options.join(", ")
        ));
    }
    None
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a Unix time.
fn format_utc(secs: u64) -> String {
    let days = secs / 86_400;
    let rest = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Count from 0000-03-01, so that the leap day ends each 4-year cycle,
    // in eras of 400 years (146,097 days).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::known_hosts::parse;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;

    /// An ed25519 public key blob with the given 32 key bytes.
    use crate::test_keys::ed25519_blob as blob;

    fn line(marker: &str, hosts: &str, key: &[u8]) -> String {
        format!("{marker} {hosts} ssh-ed25519 {}\n", STANDARD.encode(key))
    }

    const NOW: u64 = 1_800_000_000;

    struct Fixture {
        principals: Vec<String>,
        critical: Vec<String>,
        ca: Vec<u8>,
        key: Vec<u8>,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                principals: vec!["web1.example.com".into()],
                critical: Vec::new(),
                ca: blob(7),
                key: blob(9),
            }
        }

        fn cert(&self) -> HostCertificate<'_> {
            HostCertificate {
                is_host_certificate: true,
                key_id: "web1",
                principals: &self.principals,
                valid_after: NOW - 10,
                valid_before: NOW + 10,
                critical_options: &self.critical,
                key_blob: &self.key,
                ca_blob: &self.ca,
                signature_algorithm: "ssh-ed25519",
            }
        }
    }

    fn judge<'a>(
        file: &'a KnownHostsFile,
        host: &str,
        cert: &HostCertificate<'_>,
        now: u64,
    ) -> CertVerdict<'a> {
        check_host_certificate(
            std::slice::from_ref(file),
            host,
            22,
            host,
            cert,
            CA_SIGNATURE.default,
            now,
        )
    }

    fn untrusted_because(verdict: CertVerdict<'_>, needle: &str) {
        match verdict {
            CertVerdict::Untrusted(reason) => {
                assert!(reason.contains(needle), "{reason:?} lacks {needle:?}")
            }
            other => panic!("expected Untrusted({needle}), got {other:?}"),
        }
    }

    #[test]
    fn a_fit_certificate_from_a_listed_authority_is_trusted() {
        let f = Fixture::new();
        let text = line("@cert-authority", "*.example.com", &f.ca);
        let (file, warnings) = parse("kh", &text);
        assert!(warnings.is_empty());
        match judge(&file, "web1.example.com", &f.cert(), NOW) {
            CertVerdict::Trusted(found) => assert_eq!(found.line, 1),
            other => panic!("{other:?}"),
        }
        assert!(authority_applies(
            std::slice::from_ref(&file),
            "web1.example.com",
            22
        ));
        assert!(!authority_applies(
            std::slice::from_ref(&file),
            "web1.example.org",
            22
        ));
    }

    #[test]
    fn the_authority_must_apply_to_the_host_and_hold_the_signing_key() {
        let f = Fixture::new();
        let (file, _) = parse("kh", &line("@cert-authority", "*.example.org", &f.ca));
        untrusted_because(
            judge(&file, "web1.example.com", &f.cert(), NOW),
            "no @cert-authority line for web1.example.com",
        );
        // The right hosts, another CA key; and the CA key as a plain host key.
        let text = line("@cert-authority", "*.example.com", &blob(8))
            + &format!("web1.example.com ssh-ed25519 {}\n", STANDARD.encode(&f.ca));
        let (file, _) = parse("kh", &text);
        untrusted_because(
            judge(&file, "web1.example.com", &f.cert(), NOW),
            &fingerprint_sha256(&f.ca),
        );
        // A non-default port is part of the name the patterns see.
        let (file, _) = parse(
            "kh",
            &line("@cert-authority", "[web1.example.com]:2222", &f.ca),
        );
        let files = std::slice::from_ref(&file);
        let verdict = check_host_certificate(
            files,
            "web1.example.com",
            2222,
            "web1.example.com",
            &f.cert(),
            CA_SIGNATURE.default,
            NOW,
        );
        assert!(matches!(verdict, CertVerdict::Trusted(_)), "{verdict:?}");
        untrusted_because(
            judge(&file, "web1.example.com", &f.cert(), NOW),
            "no @cert-authority",
        );
    }

    #[test]
    fn a_hashed_authority_line_is_found() {
        let f = Fixture::new();
        let hashed = super::super::hash_name("web1.example.com", &[3; 20]);
        let (file, _) = parse("kh", &line("@cert-authority", &hashed, &f.ca));
        assert!(matches!(
            judge(&file, "web1.example.com", &f.cert(), NOW),
            CertVerdict::Trusted(_)
        ));
        untrusted_because(
            judge(&file, "web2.example.com", &f.cert(), NOW),
            "no @cert-authority",
        );
    }

    #[test]
    fn revoking_the_authority_or_the_host_key_refuses_outright() {
        let f = Fixture::new();
        let base = line("@cert-authority", "*", &f.ca);
        for (revoked_blob, which) in [
            (&f.ca, RevokedKey::Authority),
            (&f.key, RevokedKey::HostKey),
        ] {
            let text = base.clone() + &line("@revoked", "*", revoked_blob);
            let (file, _) = parse("kh", &text);
            match judge(&file, "web1.example.com", &f.cert(), NOW) {
                CertVerdict::Revoked { found, key } => {
                    assert_eq!((found.line, key), (2, which));
                }
                other => panic!("{other:?}"),
            }
        }
        // A revocation for other hosts does not apply here.
        let text = base + &line("@revoked", "*.example.org", &f.ca);
        let (file, _) = parse("kh", &text);
        assert!(matches!(
            judge(&file, "web1.example.com", &f.cert(), NOW),
            CertVerdict::Trusted(_)
        ));
    }

    #[test]
    fn the_certificates_own_fields_must_fit() {
        let f = Fixture::new();
        let (file, _) = parse("kh", &line("@cert-authority", "*", &f.ca));
        let user = HostCertificate {
            is_host_certificate: false,
            ..f.cert()
        };
        untrusted_because(
            judge(&file, "web1.example.com", &user, NOW),
            "user certificate",
        );
        untrusted_because(
            judge(&file, "web1.example.com", &f.cert(), NOW - 11),
            "not valid before",
        );
        untrusted_because(
            judge(&file, "web1.example.com", &f.cert(), NOW + 10),
            "expired at",
        );
        untrusted_because(
            judge(&file, "web2.example.com", &f.cert(), NOW),
            "web2.example.com is not among the principals",
        );
        let sha1 = HostCertificate {
            signature_algorithm: "ssh-rsa",
            ..f.cert()
        };
        untrusted_because(
            judge(&file, "web1.example.com", &sha1, NOW),
            "CASignatureAlgorithms",
        );
        let critical = vec!["force-command".to_string()];
        let with_options = HostCertificate {
            critical_options: &critical,
            ..f.cert()
        };
        untrusted_because(
            judge(&file, "web1.example.com", &with_options, NOW),
            "force-command",
        );
    }

    #[test]
    fn principals_may_be_patterns_or_absent() {
        let f = Fixture::new();
        let (file, _) = parse("kh", &line("@cert-authority", "*", &f.ca));
        let patterns = vec![
            "db?.example.com".to_string(),
            "*.WEB.example.com".to_string(),
        ];
        let cert = HostCertificate {
            principals: &patterns,
            ..f.cert()
        };
        for host in [
            "db1.example.com",
            "a.b.web.example.com",
            "A.Web.Example.Com",
        ] {
            assert!(
                matches!(judge(&file, host, &cert, NOW), CertVerdict::Trusted(_)),
                "{host}"
            );
        }
        untrusted_because(judge(&file, "db12.example.com", &cert, NOW), "principals");
        let cert = HostCertificate {
            principals: &[],
            ..f.cert()
        };
        assert!(matches!(
            judge(&file, "anything.example.net", &cert, NOW),
            CertVerdict::Trusted(_)
        ));
    }

    #[test]
    fn dates_are_shown_in_utc() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_800_000_000), "2027-01-15 08:00:00 UTC");
        assert_eq!(format_utc(4_107_542_399), "2100-02-28 23:59:59 UTC");
    }
}
