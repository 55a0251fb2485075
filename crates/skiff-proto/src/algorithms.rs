//! The client's algorithm lists and the ssh_config keywords that change them
//! (`KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers`, `MACs`,
//! `CASignatureAlgorithms`).
//!
//! A value is a comma-separated list that replaces the default, or edits it:
//! `+list` appends, `-list` removes, `^list` puts first, as in ssh_config(5).
//! Items may be `*`/`?` patterns over the names skiff supports. The defaults
//! leave out SHA-1, CBC and finite-field groups below 2048 bits; the
//! supported lists have them, for old servers, only when asked for by name.

use crate::pattern::{has_wildcard, wildcard_match};

pub mod query;

/// One algorithm list: its default, and what else may be asked for.
#[derive(Debug, Clone, Copy)]
pub struct AlgorithmList {
    pub keyword: &'static str,
    pub default: &'static [&'static str],
    /// Supported too, but only when a configuration names them.
    pub more: &'static [&'static str],
    /// Names OpenSSH knows for this list that skiff does not implement. A
    /// configuration may name them (a hardened config written for sshd
    /// often does): they are left out of the list, and
    /// [`AlgorithmList::unimplemented_in`] says which, so the caller can
    /// tell the person once. Only a list left empty is an error.
    pub unimplemented: &'static [&'static str],
}

/// Key exchange methods OpenSSH has that skiff does not.
const UNIMPLEMENTED_KEX: &[&str] = &[
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    "mlkem768nistp256-sha256",
    "mlkem1024nistp384-sha384",
];

/// What skiffd lacks beyond [`UNIMPLEMENTED_KEX`]: group exchange, which
/// only the client side has here.
const UNIMPLEMENTED_SERVER_KEX: &[&str] = &[
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    "mlkem768nistp256-sha256",
    "mlkem1024nistp384-sha384",
    "diffie-hellman-group-exchange-sha256",
    "diffie-hellman-group-exchange-sha1",
];

/// Ciphers OpenSSH has that skiff does not.
const UNIMPLEMENTED_CIPHERS: &[&str] = &["3des-cbc"];

/// MACs OpenSSH has (or had) that skiff does not.
const UNIMPLEMENTED_MACS: &[&str] = &[
    "umac-64@openssh.com",
    "umac-128@openssh.com",
    "umac-64-etm@openssh.com",
    "umac-128-etm@openssh.com",
    "hmac-sha1-96",
    "hmac-sha1-96-etm@openssh.com",
    "hmac-md5",
    "hmac-md5-96",
    "hmac-md5-etm@openssh.com",
    "hmac-md5-96-etm@openssh.com",
];

/// Host key and signature algorithms OpenSSH has that skiffd does not sign
/// or accept with.
const UNIMPLEMENTED_SERVER_KEYS: &[&str] = &[
    "ssh-dss",
    "ssh-dss-cert-v01@openssh.com",
    "ssh-rsa",
    "ssh-rsa-cert-v01@openssh.com",
    "sk-ssh-ed25519@openssh.com",
    "sk-ssh-ed25519-cert-v01@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com",
];

/// User key signature algorithms OpenSSH has that skiffd does not accept:
/// DSA, RSA with SHA-1, and WebAuthn signatures.
const UNIMPLEMENTED_SERVER_PUBKEY: &[&str] = &[
    "ssh-dss",
    "ssh-dss-cert-v01@openssh.com",
    "ssh-rsa",
    "ssh-rsa-cert-v01@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Host key algorithms the client leaves out. Certificate names change
/// nothing: skiff asks for host certificates whenever known_hosts trusts a
/// CA for the host (`@cert-authority`), of the types the list names.
const UNIMPLEMENTED_HOST_KEY: &[&str] = &[
    "ssh-dss",
    "ssh-dss-cert-v01@openssh.com",
    "ssh-rsa-cert-v01@openssh.com",
    "ssh-ed25519-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ecdsa-sha2-nistp384-cert-v01@openssh.com",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    "rsa-sha2-256-cert-v01@openssh.com",
    "rsa-sha2-512-cert-v01@openssh.com",
    "sk-ssh-ed25519@openssh.com",
    "sk-ssh-ed25519-cert-v01@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com",
];

/// CA signature algorithms OpenSSH has that the client does not check.
const UNIMPLEMENTED_CA_SIGNATURE: &[&str] =
    &["ssh-dss", "webauthn-sk-ecdsa-sha2-nistp256@openssh.com"];

/// Key exchange. The post-quantum hybrid comes first.
pub const KEX: AlgorithmList = AlgorithmList {
    keyword: "KexAlgorithms",
    default: &[
        "mlkem768x25519-sha256",
        "curve25519-sha256",
        "curve25519-sha256@libssh.org",
        "ecdh-sha2-nistp256",
        "ecdh-sha2-nistp384",
        "ecdh-sha2-nistp521",
        "diffie-hellman-group-exchange-sha256",
        "diffie-hellman-group16-sha512",
        "diffie-hellman-group14-sha256",
    ],
    more: &[
        "diffie-hellman-group15-sha512",
        "diffie-hellman-group17-sha512",
        "diffie-hellman-group18-sha512",
        "diffie-hellman-group14-sha1",
        "diffie-hellman-group-exchange-sha1",
        "diffie-hellman-group1-sha1",
    ],
    unimplemented: UNIMPLEMENTED_KEX,
};

/// Host key signature algorithms (certificates follow the same list).
pub const HOST_KEY: AlgorithmList = AlgorithmList {
    keyword: "HostKeyAlgorithms",
    default: &[
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "rsa-sha2-512",
        "rsa-sha2-256",
    ],
    more: &["ssh-rsa"],
    unimplemented: UNIMPLEMENTED_HOST_KEY,
};

/// Ciphers.
pub const CIPHERS: AlgorithmList = AlgorithmList {
    keyword: "Ciphers",
    default: &[
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes256-ctr",
        "aes128-ctr",
    ],
    more: &["aes192-ctr", "aes256-cbc", "aes192-cbc", "aes128-cbc"],
    unimplemented: UNIMPLEMENTED_CIPHERS,
};

/// MACs (used only with the non-AEAD ciphers).
pub const MACS: AlgorithmList = AlgorithmList {
    keyword: "MACs",
    default: &[
        "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com",
        "hmac-sha2-256",
        "hmac-sha2-512",
    ],
    more: &["hmac-sha1-etm@openssh.com", "hmac-sha1"],
    unimplemented: UNIMPLEMENTED_MACS,
};

/// Signature algorithms a CA may have signed a host certificate with:
/// OpenSSH's default, which leaves out `ssh-rsa` (RSA with SHA-1).
pub const CA_SIGNATURE: AlgorithmList = AlgorithmList {
    keyword: "CASignatureAlgorithms",
    default: &[
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
        "rsa-sha2-512",
        "rsa-sha2-256",
    ],
    more: &["ssh-rsa"],
    unimplemented: UNIMPLEMENTED_CA_SIGNATURE,
};

/// The signature algorithms skiffd accepts from user keys and user
/// certificates (`PubkeyAcceptedAlgorithms` in its configuration). RSA
/// with SHA-1 (`ssh-rsa`) is not supported at all. Security keys (`sk-`)
/// are in the list, as in sshd's; what their signatures must show is
/// skiffd's `security_keys`.
pub const SERVER_PUBKEY: AlgorithmList = AlgorithmList {
    keyword: "PubkeyAcceptedAlgorithms",
    default: &[
        "ssh-ed25519",
        "ssh-ed25519-cert-v01@openssh.com",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp256-cert-v01@openssh.com",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp384-cert-v01@openssh.com",
        "ecdsa-sha2-nistp521",
        "ecdsa-sha2-nistp521-cert-v01@openssh.com",
        "sk-ssh-ed25519@openssh.com",
        "sk-ssh-ed25519-cert-v01@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
        "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com",
        "rsa-sha2-512",
        "rsa-sha2-512-cert-v01@openssh.com",
        "rsa-sha2-256",
        "rsa-sha2-256-cert-v01@openssh.com",
    ],
    more: &[],
    unimplemented: UNIMPLEMENTED_SERVER_PUBKEY,
};

/// What a CA may have signed a user certificate with, for skiffd
/// (`CASignatureAlgorithms`): the client's default, and nothing weaker.
pub const SERVER_CA_SIGNATURE: AlgorithmList = AlgorithmList {
    keyword: "CASignatureAlgorithms",
    default: CA_SIGNATURE.default,
    more: &[],
    unimplemented: UNIMPLEMENTED_SERVER_KEYS,
};

/// skiffd's key exchange (`KexAlgorithms` in its configuration). The
/// group-exchange methods are client-only here. The NIST-curve ECDH
/// methods are available by name but not offered by default: every client
/// that has them also has curve25519, and auditors (ssh-audit) fail a
/// server that offers them.
pub const SERVER_KEX: AlgorithmList = AlgorithmList {
    keyword: "KexAlgorithms",
    default: &[
        "mlkem768x25519-sha256",
        "curve25519-sha256",
        "curve25519-sha256@libssh.org",
        "diffie-hellman-group16-sha512",
        "diffie-hellman-group14-sha256",
    ],
    more: &[
        "ecdh-sha2-nistp256",
        "ecdh-sha2-nistp384",
        "ecdh-sha2-nistp521",
        "diffie-hellman-group15-sha512",
        "diffie-hellman-group17-sha512",
        "diffie-hellman-group18-sha512",
        "diffie-hellman-group14-sha1",
        "diffie-hellman-group1-sha1",
    ],
    unimplemented: UNIMPLEMENTED_SERVER_KEX,
};

/// skiffd's host key signature algorithms (`HostKeyAlgorithms`).
pub const SERVER_HOST_KEY: AlgorithmList = AlgorithmList {
    keyword: "HostKeyAlgorithms",
    default: HOST_KEY.default,
    more: HOST_KEY.more,
    // skiffd offers its host keys as plain keys through this list, and a
    // host certificate whenever `HostCertificate` names one, so the
    // certificate names change nothing here either.
    unimplemented: UNIMPLEMENTED_HOST_KEY,
};

/// skiffd's ciphers (`Ciphers`): AEAD only unless asked for.
pub const SERVER_CIPHERS: AlgorithmList = AlgorithmList {
    keyword: "Ciphers",
    default: &[
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
    ],
    more: &[
        "aes256-ctr",
        "aes192-ctr",
        "aes128-ctr",
        "aes256-cbc",
        "aes192-cbc",
        "aes128-cbc",
    ],
    unimplemented: UNIMPLEMENTED_CIPHERS,
};

/// skiffd's MACs (`MACs`): encrypt-then-MAC SHA-2 unless asked for.
pub const SERVER_MACS: AlgorithmList = AlgorithmList {
    keyword: "MACs",
    default: &[
        "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com",
    ],
    more: &[
        "hmac-sha2-256",
        "hmac-sha2-512",
        "hmac-sha1-etm@openssh.com",
        "hmac-sha1",
    ],
    unimplemented: UNIMPLEMENTED_MACS,
};

/// Compression, for both skiff and skiffd, in order of preference: none,
/// or `zlib@openssh.com`, which starts only once the user has
/// authenticated. Plain `zlib` (RFC 4253), which compresses from the end
/// of the key exchange and so exposes the decompressor to anyone who can
/// connect, is never offered.
pub const COMPRESSION: &[&str] = &["none", "zlib@openssh.com"];

/// [`COMPRESSION`] as owned names, for [`pick`]; `wanted` (a client's
/// `Compression yes`) puts `zlib@openssh.com` first.
pub fn compression(wanted: bool) -> Vec<String> {
    let mut names: Vec<String> = COMPRESSION.iter().map(|s| s.to_string()).collect();
    if wanted {
        names.reverse();
    }
    names
}

/// The entries of `known` (an SSH library's algorithm names) that `names`
/// lists, in the order of `names`; names it does not know are left out.
pub fn pick<N: Copy + AsRef<str>>(names: &[String], known: &[&N]) -> Vec<N> {
    names
        .iter()
        .filter_map(|n| known.iter().find(|k| k.as_ref() == n).map(|k| **k))
        .collect()
}

impl AlgorithmList {
    /// The default, as owned names.
    pub fn defaults(&self) -> Vec<String> {
        self.default.iter().map(|s| s.to_string()).collect()
    }

    /// Every name that may be asked for: the default, then the others.
    pub fn supported(&self) -> impl Iterator<Item = &'static str> {
        self.default.iter().chain(self.more).copied()
    }

    /// The list a `value` of this keyword asks for.
    pub fn resolve(&self, value: &str) -> Result<Vec<String>, String> {
        let keyword = self.keyword;
        let (mode, list) = match value.chars().next() {
            Some(c @ ('+' | '-' | '^')) => (Some(c), &value[1..]),
            _ => (None, value),
        };
        let items: Vec<&str> = list.split(',').map(str::trim).collect();
        if items.iter().any(|i| i.is_empty()) {
            return Err(format!("{keyword}: empty name in {value:?}"));
        }
        let in_default = |name: &&str| items.iter().any(|p| wildcard_match(p, name));
        let result: Vec<String> = match mode {
            Some('-') => self
                .default
                .iter()
                .filter(|n| !in_default(n))
                .map(|n| n.to_string())
                .collect(),
            _ => {
                let named = self.expand(&items)?;
                let mut out: Vec<String> = Vec::new();
                let mut push = |n: &str| {
                    if !out.iter().any(|o| o == n) {
                        out.push(n.to_string());
                    }
                };
                match mode {
                    Some('+') => self.default.iter().chain(&named).for_each(|n| push(n)),
                    Some('^') => named.iter().chain(self.default).for_each(|n| push(n)),
                    _ => named.iter().for_each(|n| push(n)),
                }
                out
            }
        };
        if result.is_empty() {
            return Err(format!("{keyword}: {value:?} leaves no algorithm"));
        }
        Ok(result)
    }

    /// The names in `value` (a keyword's value, as for
    /// [`AlgorithmList::resolve`]) that OpenSSH knows and this list does
    /// not implement: what `resolve` leaves out without an error.
    pub fn unimplemented_in(&self, value: &str) -> Vec<&'static str> {
        let list = value.trim_start_matches(['+', '-', '^']);
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim) {
            if let Some(name) = self.unimplemented.iter().find(|n| **n == item) {
                if !out.contains(name) {
                    out.push(*name);
                }
            }
        }
        out
    }

    /// The supported names `items` stand for, in order; an exact name skiff
    /// does not support is an error unless OpenSSH knows it
    /// ([`AlgorithmList::unimplemented`]: left out), a pattern matching
    /// nothing is not.
    fn expand(&self, items: &[&str]) -> Result<Vec<&'static str>, String> {
        let mut out = Vec::new();
        for item in items {
            if has_wildcard(item) {
                out.extend(self.supported().filter(|n| wildcard_match(item, n)));
            } else if self.unimplemented.contains(item) && !self.supported().any(|n| n == *item) {
                continue;
            } else {
                let found = self.supported().find(|n| n == item).ok_or_else(|| {
                    format!(
                        "{}: unsupported algorithm {item:?} (supported: {})",
                        self.keyword,
                        self.supported().collect::<Vec<_>>().join(",")
                    )
                })?;
                out.push(found);
            }
        }
        Ok(out)
    }
}

/// The lists for one connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Algorithms {
    pub kex: Vec<String>,
    pub host_key: Vec<String>,
    pub ciphers: Vec<String>,
    pub macs: Vec<String>,
    pub ca_signature: Vec<String>,
}

impl Default for Algorithms {
    fn default() -> Self {
        Algorithms {
            kex: KEX.defaults(),
            host_key: HOST_KEY.defaults(),
            ciphers: CIPHERS.defaults(),
            macs: MACS.defaults(),
            ca_signature: CA_SIGNATURE.defaults(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_append_remove_and_prepend() {
        assert_eq!(
            CIPHERS
                .resolve("aes256-ctr,aes128-gcm@openssh.com")
                .unwrap(),
            ["aes256-ctr", "aes128-gcm@openssh.com"]
        );
        let plus = KEX.resolve("+diffie-hellman-group14-sha1").unwrap();
        assert_eq!(plus.len(), KEX.default.len() + 1);
        assert_eq!(plus.last().unwrap(), "diffie-hellman-group14-sha1");
        let minus = KEX.resolve("-mlkem*,ecdh-*").unwrap();
        assert_eq!(minus[0], "curve25519-sha256");
        assert!(minus
            .iter()
            .all(|n| !n.starts_with("ecdh") && !n.starts_with("mlkem")));
        let caret = HOST_KEY.resolve("^ssh-rsa,rsa-sha2-512").unwrap();
        assert_eq!(&caret[..3], ["ssh-rsa", "rsa-sha2-512", "ssh-ed25519"]);
        assert_eq!(caret.len(), HOST_KEY.default.len() + 1);
        // Patterns expand over the supported names, in their order.
        assert_eq!(
            MACS.resolve("hmac-sha1*").unwrap(),
            ["hmac-sha1-etm@openssh.com", "hmac-sha1"]
        );
        // Adding what is already there changes nothing.
        assert_eq!(MACS.resolve("+hmac-sha2-256").unwrap(), MACS.defaults());
    }

    #[test]
    fn bad_values_are_errors() {
        let err = CIPHERS.resolve("aes128-gcm,blowfish-cbc").unwrap_err();
        assert!(
            err.starts_with("Ciphers: unsupported algorithm \"aes128-gcm\""),
            "{err}"
        );
        assert!(KEX
            .resolve("-*")
            .unwrap_err()
            .contains("leaves no algorithm"));
        assert!(MACS
            .resolve("hmac-sha2-256,,hmac-sha1")
            .unwrap_err()
            .contains("empty name"));
        assert!(HOST_KEY.resolve("+").is_err());
        assert!(HOST_KEY
            .resolve("nothing*")
            .unwrap_err()
            .contains("leaves no algorithm"));
    }

    /// What ssh-audit fails a server for is not in skiffd's defaults, and
    /// compression never starts before authentication.
    #[test]
    fn server_defaults_pass_an_audit() {
        for name in SERVER_KEX.default {
            assert!(!name.starts_with("ecdh-sha2-nistp"), "{name}");
        }
        assert!(SERVER_KEX.supported().any(|n| n == "ecdh-sha2-nistp256"));
        assert_eq!(COMPRESSION, ["none", "zlib@openssh.com"]);
    }

    #[test]
    fn names_openssh_knows_are_left_out_of_skiffds_lists_not_refused() {
        let value = "sntrup761x25519-sha512@openssh.com,curve25519-sha256,diffie-hellman-group-exchange-sha256";
        assert_eq!(SERVER_KEX.resolve(value).unwrap(), ["curve25519-sha256"]);
        assert_eq!(
            SERVER_KEX.unimplemented_in(value),
            [
                "sntrup761x25519-sha512@openssh.com",
                "diffie-hellman-group-exchange-sha256"
            ]
        );
        assert_eq!(
            SERVER_CIPHERS.resolve("+3des-cbc").unwrap(),
            SERVER_CIPHERS.defaults()
        );
        assert_eq!(
            SERVER_MACS
                .resolve("umac-128-etm@openssh.com,hmac-sha2-256-etm@openssh.com")
                .unwrap(),
            ["hmac-sha2-256-etm@openssh.com"]
        );
        assert_eq!(
            SERVER_PUBKEY.resolve("ssh-ed25519,ssh-rsa").unwrap(),
            ["ssh-ed25519"]
        );
        assert_eq!(
            SERVER_PUBKEY.unimplemented_in("ssh-ed25519,ssh-rsa"),
            ["ssh-rsa"]
        );
        // A list of nothing but such names is still an error, and so is a
        // name OpenSSH does not know either.
        assert!(SERVER_MACS
            .resolve("umac-64@openssh.com")
            .unwrap_err()
            .contains("leaves no algorithm"));
        assert!(SERVER_CIPHERS
            .resolve("aes128-gcm@openssh.com,blowfish-cbc")
            .unwrap_err()
            .contains("unsupported algorithm \"blowfish-cbc\""));
        // Patterns never reach them.
        assert!(SERVER_MACS.unimplemented_in("umac-*").is_empty());
        // The client's lists too: a hardened ssh_config (ssh-audit's, say)
        // names post-quantum, umac and certificate algorithms.
        assert_eq!(
            HOST_KEY
                .resolve("ssh-ed25519-cert-v01@openssh.com,ssh-ed25519,rsa-sha2-512-cert-v01@openssh.com")
                .unwrap(),
            ["ssh-ed25519"]
        );
        assert_eq!(
            KEX.resolve("sntrup761x25519-sha512@openssh.com,curve25519-sha256")
                .unwrap(),
            ["curve25519-sha256"]
        );
    }

    #[test]
    fn defaults_leave_out_legacy() {
        for list in [KEX, HOST_KEY, CIPHERS, MACS, CA_SIGNATURE] {
            for name in list.default {
                assert!(!name.contains("sha1") && !name.ends_with("-cbc") && *name != "ssh-rsa");
            }
        }
    }
}
