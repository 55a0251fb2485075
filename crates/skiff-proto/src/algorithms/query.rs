//! `ssh -Q`: the names of the algorithms the client supports, by query.
//!
//! The queries are OpenSSH's (`ssh -Q help` lists them), and so are their
//! aliases, the ssh_config and sshd_config keywords that take an algorithm
//! list (in any case). Each answer is what skiff implements, never a name
//! OpenSSH would not print for the same query: skiff may know fewer.

use super::{CA_SIGNATURE, CIPHERS, COMPRESSION, HOST_KEY, KEX, MACS};

/// The queries, as `-Q help` lists them.
pub const QUERIES: &[&str] = &[
    "cipher",
    "cipher-auth",
    "compression",
    "kex",
    "kex-gss",
    "key",
    "key-ca-sign",
    "key-cert",
    "key-plain",
    "key-sig",
    "mac",
    "protocol-version",
    "sig",
];

/// Public key types the client verifies host keys of and signs in with.
/// Security-key (`sk-`) keys need a token that skiff cannot talk to, and
/// DSA keys are gone from OpenSSH's defaults and from skiff.
pub const KEY_PLAIN: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// Certificate types: host certificates trusted through `@cert-authority`
/// and user certificates offered with their keys, one per [`KEY_PLAIN`]
/// type.
pub const KEY_CERT: &[&str] = &[
    "ssh-ed25519-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ecdsa-sha2-nistp384-cert-v01@openssh.com",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    "ssh-rsa-cert-v01@openssh.com",
];

/// RSA's SHA-2 signature algorithms, as plain keys and certificates sign.
const RSA_SHA2: &[&str] = &[
    "rsa-sha2-256",
    "rsa-sha2-256-cert-v01@openssh.com",
    "rsa-sha2-512",
    "rsa-sha2-512-cert-v01@openssh.com",
];

/// The algorithms the client signs in with (what `PubkeyAcceptedAlgorithms`
/// would list; skiff takes the keyword and does not act on it): every key
/// and certificate type of [`KEY_PLAIN`] and [`KEY_CERT`], RSA with SHA-2
/// only. skiffd accepts these and security keys (`sk-`, which skiff signs
/// with only through ssh-agent).
pub const CLIENT_PUBKEY: &[&str] = &[
    "ssh-ed25519",
    "ssh-ed25519-cert-v01@openssh.com",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp384-cert-v01@openssh.com",
    "ecdsa-sha2-nistp521",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com",
    "rsa-sha2-512",
    "rsa-sha2-512-cert-v01@openssh.com",
    "rsa-sha2-256",
    "rsa-sha2-256-cert-v01@openssh.com",
];

/// The ciphers that authenticate what they encrypt (no MAC is used with them).
const AEAD: &[&str] = &[
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
];

/// What `query` lists, one name a line; `None` for a query OpenSSH does not
/// have either.
pub fn answer(query: &str) -> Option<Vec<&'static str>> {
    let names: Vec<&'static str> = match query {
        "help" => QUERIES.to_vec(),
        "cipher" => CIPHERS.supported().collect(),
        "cipher-auth" => CIPHERS.supported().filter(|c| AEAD.contains(c)).collect(),
        "compression" => COMPRESSION.to_vec(),
        "kex" => KEX.supported().collect(),
        // skiff does no GSSAPI key exchange.
        "kex-gss" => Vec::new(),
        "key" => KEY_PLAIN
            .iter()
            .zip(KEY_CERT)
            .flat_map(|(plain, cert)| [*plain, *cert])
            .collect(),
        "key-ca-sign" => CA_SIGNATURE.supported().collect(),
        "key-cert" => KEY_CERT.to_vec(),
        "key-plain" => KEY_PLAIN.to_vec(),
        "key-sig" => {
            let mut all = answer("key")?;
            all.extend(RSA_SHA2);
            all
        }
        "mac" => MACS.supported().collect(),
        "protocol-version" => vec!["2"],
        "sig" => signature_algorithms(),
        _ => return keyword_answer(query),
    };
    Some(names)
}

/// The ssh_config and sshd_config keywords that take algorithm lists, as
/// aliases: what that keyword accepts in skiff.
fn keyword_answer(keyword: &str) -> Option<Vec<&'static str>> {
    let is = |name: &str| keyword.eq_ignore_ascii_case(name);
    if is("Ciphers") {
        answer("cipher")
    } else if is("MACs") {
        answer("mac")
    } else if is("KexAlgorithms") {
        answer("kex")
    } else if is("CASignatureAlgorithms") {
        answer("key-ca-sign")
    } else if is("HostKeyAlgorithms") {
        Some(HOST_KEY.supported().collect())
    } else if is("PubkeyAcceptedAlgorithms") || is("PubkeyAcceptedKeyTypes") {
        Some(CLIENT_PUBKEY.to_vec())
    } else if is("HostbasedAcceptedAlgorithms") || is("HostbasedKeyTypes") {
        // skiff does no host-based authentication.
        Some(Vec::new())
    } else {
        None
    }
}

/// Every signature algorithm skiff verifies or signs with: host keys'
/// (`HostKeyAlgorithms`) and CAs' (`CASignatureAlgorithms`), in
/// OpenSSH's order of key types.
fn signature_algorithms() -> Vec<&'static str> {
    const ORDER: &[&str] = &[
        "ssh-ed25519",
        "sk-ssh-ed25519@openssh.com",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ecdsa-sha2-nistp256@openssh.com",
        "ssh-rsa",
        "rsa-sha2-256",
        "rsa-sha2-512",
    ];
    let known = |name: &&str| {
        HOST_KEY.supported().any(|n| n == *name) || CA_SIGNATURE.supported().any(|n| n == *name)
    };
    ORDER.iter().copied().filter(known).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_answers_and_others_do_not() {
        for q in QUERIES.iter().chain(&["help"]) {
            assert!(answer(q).is_some(), "{q}");
        }
        for q in ["bogus", "CIPHER", "cipher_auth", "Compression", ""] {
            assert_eq!(answer(q), None, "{q}");
        }
        assert_eq!(answer("protocol-version").unwrap(), ["2"]);
        assert_eq!(answer("help").unwrap(), QUERIES);
        assert!(answer("kex-gss").unwrap().is_empty());
    }

    #[test]
    fn aliases_are_keywords_in_any_case() {
        assert_eq!(answer("ciphers"), answer("cipher"));
        assert_eq!(answer("MACS"), answer("mac"));
        assert_eq!(answer("KexAlgorithms"), answer("kex"));
        assert_eq!(answer("casignaturealgorithms"), answer("key-ca-sign"));
        assert_eq!(
            answer("HostKeyAlgorithms").unwrap(),
            HOST_KEY.supported().collect::<Vec<_>>()
        );
        assert_eq!(
            answer("PubkeyAcceptedKeyTypes"),
            answer("PubkeyAcceptedAlgorithms")
        );
    }

    #[test]
    fn lists_hold_together() {
        let key = answer("key").unwrap();
        let plain = answer("key-plain").unwrap();
        let cert = answer("key-cert").unwrap();
        assert_eq!(key.len(), plain.len() + cert.len());
        assert!(plain.iter().chain(&cert).all(|k| key.contains(k)));
        assert!(cert.iter().all(|c| c.contains("-cert-v01@")));
        assert!(plain.iter().all(|c| !c.contains("-cert-")));
        let key_sig = answer("key-sig").unwrap();
        assert!(key.iter().all(|k| key_sig.contains(k)));
        assert!(key_sig.contains(&"rsa-sha2-512"));
        let sig = answer("sig").unwrap();
        for name in HOST_KEY.supported().chain(CA_SIGNATURE.supported()) {
            assert!(sig.contains(&name), "{name}");
        }
        let auth = answer("cipher-auth").unwrap();
        assert_eq!(auth.len(), 3);
        assert!(!auth.contains(&"aes128-ctr"));
        // What the client signs in with is a key-sig name, SHA-1 aside.
        assert!(CLIENT_PUBKEY.iter().all(|a| key_sig.contains(a)));
        assert!(!CLIENT_PUBKEY.contains(&"ssh-rsa"));
        // Nothing skiff lacks is listed.
        for (list, query) in [(KEX, "kex"), (CIPHERS, "cipher"), (MACS, "mac")] {
            let shown = answer(query).unwrap();
            assert!(list.unimplemented.iter().all(|n| !shown.contains(n)));
        }
    }
}
