//! `UpdateHostKeys`: what to change in the user's known_hosts files when a
//! server announces its host keys after authentication (OpenSSH's
//! `hostkeys-00@openssh.com`), and the wire pieces of the proof the client
//! asks for (`hostkeys-prove-00@openssh.com`), as OpenSSH's PROTOCOL file
//! describes them.
//!
//! The rules follow ssh's: an update is only considered when the key that
//! signed this session was found in a user known_hosts file (the caller
//! checks that). Then [`plan`] compares the announced keys with the user
//! files' lines for the host, and gives up ([`Skip`]) when a line it would
//! have to rewrite is one ssh would not rewrite either: a `@cert-authority`
//! or `@revoked` line, a host pattern with wildcards or negation, or a list
//! of more than two names; and when an announced or deprecated key is also
//! recorded under another name. Keys the host's lines do not hold yet must be
//! proven by the server before [`rewrite`] adds them; keys the lines hold and
//! the server no longer announces are removed.
//!
//! Everything here is sans-IO and crypto-free: the caller verifies the
//! proof's signatures, reads the files, and writes what [`rewrite`] returns
//! (atomically) in place of what it read.

use std::borrow::Borrow;
use std::fmt;

use super::{
    blob_key_type, fingerprint_sha256, format_entry, parse_line, Entry, HostField, KnownHostsFile,
    DEFAULT_PORT,
};

/// The global request a server announces its host keys with.
pub const ANNOUNCE_REQUEST: &str = "hostkeys-00@openssh.com";

/// The global request asking the server to prove it holds host keys.
pub const PROVE_REQUEST: &str = "hostkeys-prove-00@openssh.com";

/// Why known_hosts is left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The server announced the same key twice.
    DuplicateKey { fingerprint: String },
    /// A line for the host that an update may not rewrite: a marker, a
    /// wildcard or negated pattern, or more than two names.
    ComplexLine { file: String, line: usize },
    /// An announced key is recorded for another name too.
    KeyUnderOtherName { file: String, line: usize },
    /// A key the server no longer announces is recorded for another name
    /// too; removing it for this host only would leave the names disagreeing.
    OldKeyUnderOtherName { file: String, line: usize },
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::DuplicateKey { fingerprint } => {
                write!(f, "the server announced host key {fingerprint} twice")
            }
            Skip::ComplexLine { file, line } => write!(
                f,
                "{file}:{line} is a @cert-authority/@revoked line, a wildcard or negated pattern, or a list of more than two names"
            ),
            Skip::KeyUnderOtherName { file, line } => write!(
                f,
                "{file}:{line} records one of the announced keys under another name"
            ),
            Skip::OldKeyUnderOtherName { file, line } => write!(
                f,
                "{file}:{line} records a key the server no longer has under another name"
            ),
        }
    }
}

/// What an update would change, decided by [`plan`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Indices (into the announced keys) of the keys no line of the host
    /// records yet: the server must prove it holds them before they are added.
    pub new: Vec<usize>,
    /// Keys recorded for the host that the server did not announce, in
    /// file order, each once.
    pub deprecated: Vec<Vec<u8>>,
}

impl Plan {
    /// True when known_hosts already says what the server announced.
    pub fn is_empty(&self) -> bool {
        self.new.is_empty() && self.deprecated.is_empty()
    }
}

/// Whether a host field is one an update may rewrite: a single name or
/// hashed name, or two names (ssh's `host,address`), without wildcards or
/// negation.
fn simple_hosts(hosts: &HostField) -> bool {
    match hosts {
        HostField::Hashed { .. } => true,
        HostField::Patterns(pats) => {
            pats.len() <= 2
                && pats
                    .iter()
                    .all(|p| !p.is_empty() && !p.contains(['*', '?', '!']))
        }
    }
}

/// Whether `entry` is the host's line (as lookups see it: `name` is a
/// [`super::host_port_name`]).
fn for_host(entry: &Entry, name: &str) -> bool {
    entry.hosts.matches(name)
}

/// Compares the host keys the server announced (`announced`, key blobs)
/// with the lines of the user's known_hosts files (`user_files`, in
/// configured order) for `name` (from [`super::host_port_name`]).
pub fn plan<F: Borrow<KnownHostsFile>>(
    user_files: &[F],
    name: &str,
    announced: &[Vec<u8>],
) -> Result<Plan, Skip> {
    for (i, key) in announced.iter().enumerate() {
        if announced[..i].contains(key) {
            return Err(Skip::DuplicateKey {
                fingerprint: fingerprint_sha256(key),
            });
        }
    }
    let mut known = vec![false; announced.len()];
    let mut deprecated: Vec<Vec<u8>> = Vec::new();
    // The host's lines come from the file's index (hashed names matched
    // once per name); the other lines are only compared by key.
    let mine: Vec<Vec<&Entry>> = user_files
        .iter()
        .map(|f| f.borrow().matching(name))
        .collect();
    let others = |file: usize| {
        let f: &KnownHostsFile = user_files[file].borrow();
        let mine = &mine[file];
        f.entries
            .iter()
            .filter(move |e| !mine.iter().any(|m| std::ptr::eq(*m, *e)))
    };
    for (i, entries) in mine.iter().enumerate() {
        let label = &user_files[i].borrow().label;
        for entry in entries {
            if entry.marker.is_some() || !simple_hosts(&entry.hosts) {
                return Err(Skip::ComplexLine {
                    file: label.clone(),
                    line: entry.line,
                });
            }
            match announced.iter().position(|k| *k == entry.key_blob) {
                Some(k) => known[k] = true,
                None if !deprecated.contains(&entry.key_blob) => {
                    deprecated.push(entry.key_blob.clone());
                }
                None => {}
            }
        }
        if let Some(e) = others(i).find(|e| announced.contains(&e.key_blob)) {
            return Err(Skip::KeyUnderOtherName {
                file: label.clone(),
                line: e.line,
            });
        }
    }
    for (i, file) in user_files.iter().enumerate() {
        if let Some(e) = others(i).find(|e| deprecated.contains(&e.key_blob)) {
            return Err(Skip::OldKeyUnderOtherName {
                file: file.borrow().label.clone(),
                line: e.line,
            });
        }
    }
    Ok(Plan {
        new: (0..announced.len()).filter(|&i| !known[i]).collect(),
        deprecated,
    })
}

/// A known_hosts text with an update applied (see [`rewrite`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    /// The whole new text of the file.
    pub text: String,
    /// Line numbers (in the text read) of the lines taken out.
    pub removed: Vec<usize>,
    /// The keys appended, as given in `add`.
    pub added: Vec<Vec<u8>>,
}

/// Applies an update to the text of one user known_hosts file: takes out
/// the lines for `name` whose key is not in `keep` (the keys the server holds:
/// those announced and already known, and those it proved), and appends a
/// line for each key of `add` that no remaining line for `name` holds. The
/// other lines stay byte for byte. `salts[i]`, when given, hashes the name on
/// the line for `add[i]` (fresh random bytes from the caller, for
/// `HashKnownHosts`); a key without one is written under the plain name.
///
/// `Ok(None)`: nothing to change. The text is checked again as
/// [`plan`] checked it (it may have changed since): a line for the host that
/// may not be rewritten gives up.
pub fn rewrite(
    label: &str,
    text: &str,
    name: &str,
    keep: &[Vec<u8>],
    add: &[Vec<u8>],
    salts: &[[u8; 20]],
) -> Result<Option<Rewrite>, Skip> {
    let mut out = String::with_capacity(text.len() + add.len() * 128);
    let mut removed = Vec::new();
    let mut present: Vec<&[u8]> = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();
    for (idx, raw) in text.split_inclusive('\n').enumerate() {
        let line_no = idx + 1;
        let content = raw.strip_suffix('\n').unwrap_or(raw);
        let content = content.strip_suffix('\r').unwrap_or(content);
        let content = match idx {
            0 => content.strip_prefix('\u{feff}').unwrap_or(content),
            _ => content,
        };
        let entry = match parse_line(content, line_no) {
            Ok(Some(entry)) if for_host(&entry, name) => entry,
            // Other hosts' lines, comments, and lines ssh would skip as
            // malformed: kept as they are.
            _ => {
                out.push_str(raw);
                continue;
            }
        };
        if entry.marker.is_some() || !simple_hosts(&entry.hosts) {
            return Err(Skip::ComplexLine {
                file: label.to_string(),
                line: line_no,
            });
        }
        if keep.contains(&entry.key_blob) {
            out.push_str(raw);
            entries.push(entry);
        } else {
            removed.push(line_no);
        }
    }
    for e in &entries {
        present.push(&e.key_blob);
    }
    let mut added = Vec::new();
    for (i, key) in add.iter().enumerate() {
        if present.contains(&key.as_slice()) || added.contains(key) {
            continue;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let key_type = blob_key_type(key).unwrap_or("");
        // `name` is already a lookup name: with the default port it is
        // written as it is.
        out.push_str(&format_entry(
            name,
            DEFAULT_PORT,
            key_type,
            key,
            salts.get(i),
        ));
        added.push(key.clone());
    }
    if removed.is_empty() && added.is_empty() {
        return Ok(None);
    }
    Ok(Some(Rewrite {
        text: out,
        removed,
        added,
    }))
}

/// The data of a `hostkeys-prove-00@openssh.com` request for these key
/// blobs: each as an SSH string, in order.
pub fn prove_request_data<K: AsRef<[u8]>>(keys: &[K]) -> Vec<u8> {
    let mut out = Vec::new();
    for key in keys {
        put_string(&mut out, key.as_ref());
    }
    out
}

/// What the server signs to prove it holds `key_blob`: the request name,
/// the session identifier and the key, each as an SSH string.
pub fn signed_data(session_id: &[u8], key_blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, PROVE_REQUEST.as_bytes());
    put_string(&mut out, session_id);
    put_string(&mut out, key_blob);
    out
}

/// A malformed proof reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the reply holds {found} signatures where {wanted} were asked for")]
    Count { wanted: usize, found: usize },
    #[error("the reply is cut short")]
    Truncated,
}

/// The signature blobs of a proof reply asked for `wanted` keys, in the
/// order the keys were asked for.
pub fn split_proof(reply: &[u8], wanted: usize) -> Result<Vec<&[u8]>, ProofError> {
    let mut rest = reply;
    let mut out = Vec::with_capacity(wanted);
    while !rest.is_empty() {
        let (sig, after) = take_string(rest).ok_or(ProofError::Truncated)?;
        out.push(sig);
        rest = after;
    }
    if out.len() != wanted {
        return Err(ProofError::Count {
            wanted,
            found: out.len(),
        });
    }
    Ok(out)
}

/// The algorithm named at the start of a signature blob.
pub fn signature_algorithm(signature: &[u8]) -> Option<&str> {
    let (name, _) = take_string(signature)?;
    std::str::from_utf8(name).ok()
}

/// How a proof's signature algorithm suits the key it proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofAlgorithm {
    /// The key's own algorithm (for RSA keys, `rsa-sha2-256`/`-512`): the
    /// signature is to be verified.
    Fit,
    /// An RSA key signing with SHA-1 (`ssh-rsa`): the key is not learnt,
    /// the rest of the proof still counts (as in ssh).
    Weak,
    /// Not an algorithm of that key: the proof is not valid.
    Wrong,
}

/// Judges the algorithm a proof for a key of `key_type` was signed with.
pub fn proof_algorithm(key_type: &str, algorithm: &str) -> ProofAlgorithm {
    match (key_type, algorithm) {
        ("ssh-rsa", "rsa-sha2-256" | "rsa-sha2-512") => ProofAlgorithm::Fit,
        ("ssh-rsa", "ssh-rsa") => ProofAlgorithm::Weak,
        (key, alg) if key == alg => ProofAlgorithm::Fit,
        _ => ProofAlgorithm::Wrong,
    }
}

/// Whether `HostKeyAlgorithms` (`configured`) lets a key of `key_type` be a
/// host key: an RSA key through either SHA-2 RSA algorithm.
pub fn accepted_by_host_key_algorithms(key_type: &str, configured: &[String]) -> bool {
    let has = |n: &str| configured.iter().any(|c| c == n);
    match key_type {
        "ssh-rsa" => has("rsa-sha2-256") || has("rsa-sha2-512") || has("ssh-rsa"),
        other => has(other),
    }
}

/// `SHA256:` fingerprint and key type of a blob, for messages.
pub fn describe_key(blob: &[u8]) -> String {
    format!(
        "{} {}",
        blob_key_type(blob).unwrap_or("unknown"),
        fingerprint_sha256(blob)
    )
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s);
}

fn take_string(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    let rest = &b[4..];
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::super::{hash_name, host_port_name, parse};
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;

    /// A syntactically valid key blob of `key_type` with a distinct body.
    fn key(key_type: &str, n: u8) -> Vec<u8> {
        let mut b = Vec::new();
        put_string(&mut b, key_type.as_bytes());
        put_string(&mut b, &[n; 32]);
        b
    }

    fn line(hosts: &str, k: &[u8]) -> String {
        format!(
            "{hosts} {} {}\n",
            blob_key_type(k).unwrap(),
            STANDARD.encode(k)
        )
    }

    fn plan_for(text: &str, name: &str, announced: &[Vec<u8>]) -> Result<Plan, Skip> {
        let (file, _) = parse("kh", text);
        plan(&[file], name, announced)
    }

    #[test]
    fn new_keys_are_to_prove_and_missing_ones_are_deprecated() {
        let (ed, ec, old) = (
            key("ssh-ed25519", 1),
            key("ecdsa-sha2-nistp256", 2),
            key("ssh-ed25519", 3),
        );
        let text = format!(
            "{}{}{}",
            line("host", &ed),
            line("other", &key("ssh-ed25519", 9)),
            line("host", &old)
        );
        let p = plan_for(&text, "host", &[ed.clone(), ec.clone()]).unwrap();
        assert_eq!(p.new, vec![1]);
        assert_eq!(p.deprecated, vec![old.clone()]);
        assert!(!p.is_empty());
        let p = plan_for(&line("host", &ed), "host", std::slice::from_ref(&ed)).unwrap();
        assert!(p.is_empty());
    }

    #[test]
    fn lines_ssh_would_not_rewrite_stop_the_update() {
        let (ed, ec) = (key("ssh-ed25519", 1), key("ecdsa-sha2-nistp256", 2));
        for hosts in ["ho*", "host,a,b", "h?st", "host,!bad"] {
            let text = line(hosts, &ed);
            assert_eq!(
                plan_for(&text, "host", &[ed.clone(), ec.clone()]),
                Err(Skip::ComplexLine {
                    file: "kh".into(),
                    line: 1
                }),
                "{hosts}"
            );
        }
        let text = format!(
            "{}@cert-authority host {}",
            line("host", &ed),
            line("", &ec).trim_start()
        );
        assert_eq!(
            plan_for(&text, "host", &[ed.clone(), ec.clone()]),
            Err(Skip::ComplexLine {
                file: "kh".into(),
                line: 2
            })
        );
        // Two names (ssh's host,address) and hashed names are fine.
        assert!(plan_for(
            &line("host,10.0.0.1", &ed),
            "host",
            std::slice::from_ref(&ed)
        )
        .is_ok());
        let hashed = hash_name("host", &[7; 20]);
        let p = plan_for(&line(&hashed, &ed), "host", &[ed.clone(), ec.clone()]).unwrap();
        assert_eq!(p.new, vec![1]);
    }

    #[test]
    fn keys_under_other_names_stop_the_update() {
        let (ed, ec, old) = (
            key("ssh-ed25519", 1),
            key("ecdsa-sha2-nistp256", 2),
            key("ssh-ed25519", 3),
        );
        let text = format!("{}{}", line("host", &ed), line("alias", &ec));
        assert_eq!(
            plan_for(&text, "host", &[ed.clone(), ec.clone()]),
            Err(Skip::KeyUnderOtherName {
                file: "kh".into(),
                line: 2
            })
        );
        let text = format!(
            "{}{}{}",
            line("host", &ed),
            line("host", &old),
            line("alias", &old)
        );
        assert_eq!(
            plan_for(&text, "host", std::slice::from_ref(&ed)),
            Err(Skip::OldKeyUnderOtherName {
                file: "kh".into(),
                line: 3
            })
        );
        assert!(matches!(
            plan_for("", "host", &[ed.clone(), ed.clone()]),
            Err(Skip::DuplicateKey { .. })
        ));
    }

    #[test]
    fn ports_are_part_of_the_name() {
        let (ed, ec) = (key("ssh-ed25519", 1), key("ecdsa-sha2-nistp256", 2));
        let name = host_port_name("Host", 2222);
        let text = format!("{}{}", line("host", &ec), line("[host]:2222", &ed));
        // The port-22 line holds the other key under another name.
        assert!(matches!(
            plan_for(&text, &name, &[ed.clone(), ec.clone()]),
            Err(Skip::KeyUnderOtherName { line: 1, .. })
        ));
        let p = plan_for(&line("[host]:2222", &ed), &name, &[ed.clone(), ec.clone()]).unwrap();
        assert_eq!(p.new, vec![1]);
    }

    #[test]
    fn rewrite_keeps_other_lines_byte_for_byte() {
        let (ed, ec, old) = (
            key("ssh-ed25519", 1),
            key("ecdsa-sha2-nistp256", 2),
            key("ssh-ed25519", 3),
        );
        let other = "# a comment\r\nother ssh-ed25519 AAAA-not-a-key  trailing\n\n";
        let text = format!(
            "{}{other}{}zz {}",
            line("host", &ed),
            line("host", &old),
            line("", &ec).trim_start().trim_end()
        );
        let r = rewrite(
            "kh",
            &text,
            "host",
            &[ed.clone(), ec.clone()],
            std::slice::from_ref(&ec),
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.removed, vec![5]);
        assert_eq!(r.added, vec![ec.clone()]);
        let want = format!(
            "{}{other}zz {}\n{}",
            line("host", &ed),
            line("", &ec).trim_start().trim_end(),
            line("host", &ec)
        );
        assert_eq!(r.text, want);
        // Applying it again changes nothing.
        assert_eq!(
            rewrite(
                "kh",
                &r.text,
                "host",
                &[ed.clone(), ec.clone()],
                std::slice::from_ref(&ec),
                &[]
            ),
            Ok(None)
        );
    }

    #[test]
    fn rewrite_hashes_names_when_given_salts() {
        let ec = key("ecdsa-sha2-nistp256", 2);
        let name = host_port_name("host", 2222);
        let r = rewrite(
            "kh",
            "",
            &name,
            std::slice::from_ref(&ec),
            std::slice::from_ref(&ec),
            &[[5; 20]],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.text, line(&hash_name(&name, &[5; 20]), &ec));
        let (file, warnings) = parse("kh", &r.text);
        assert!(warnings.is_empty());
        assert!(file.entries[0].hosts.matches(&name));
    }

    #[test]
    fn rewrite_gives_up_on_lines_it_may_not_touch() {
        let (ed, ec) = (key("ssh-ed25519", 1), key("ecdsa-sha2-nistp256", 2));
        let text = format!("{}{}", line("host", &ed), line("*", &ec));
        assert_eq!(
            rewrite(
                "kh",
                &text,
                "host",
                std::slice::from_ref(&ed),
                std::slice::from_ref(&ec),
                &[]
            ),
            Err(Skip::ComplexLine {
                file: "kh".into(),
                line: 2
            })
        );
    }

    #[test]
    fn proof_pieces() {
        let (ed, ec) = (key("ssh-ed25519", 1), key("ecdsa-sha2-nistp256", 2));
        let data = prove_request_data(&[&ed, &ec]);
        assert_eq!(data.len(), 8 + ed.len() + ec.len());
        let mut sig = Vec::new();
        put_string(&mut sig, b"ssh-ed25519");
        put_string(&mut sig, &[0; 64]);
        let mut reply = Vec::new();
        put_string(&mut reply, &sig);
        put_string(&mut reply, &sig);
        let sigs = split_proof(&reply, 2).unwrap();
        assert_eq!(sigs, vec![&sig[..], &sig[..]]);
        assert_eq!(signature_algorithm(sigs[0]), Some("ssh-ed25519"));
        assert_eq!(
            split_proof(&reply, 1),
            Err(ProofError::Count {
                wanted: 1,
                found: 2
            })
        );
        assert_eq!(
            split_proof(&reply[..reply.len() - 1], 2),
            Err(ProofError::Truncated)
        );
        let signed = signed_data(b"sid", &ed);
        assert!(signed.starts_with(&[0, 0, 0, 29]));
        assert!(signed.ends_with(&ed));
        assert_eq!(
            proof_algorithm("ssh-rsa", "rsa-sha2-512"),
            ProofAlgorithm::Fit
        );
        assert_eq!(proof_algorithm("ssh-rsa", "ssh-rsa"), ProofAlgorithm::Weak);
        assert_eq!(
            proof_algorithm("ssh-ed25519", "ssh-ed25519"),
            ProofAlgorithm::Fit
        );
        assert_eq!(
            proof_algorithm("ssh-ed25519", "ssh-rsa"),
            ProofAlgorithm::Wrong
        );
        assert_eq!(
            proof_algorithm("ssh-rsa", "rsa-sha2-999"),
            ProofAlgorithm::Wrong
        );
        let configured = vec!["ssh-ed25519".to_string(), "rsa-sha2-256".to_string()];
        assert!(accepted_by_host_key_algorithms("ssh-rsa", &configured));
        assert!(!accepted_by_host_key_algorithms(
            "ecdsa-sha2-nistp256",
            &configured
        ));
    }

    /// Nothing panics on arbitrary input, and a rewrite keeps every line it
    /// does not remove, byte for byte and in order, ahead of what it adds.
    #[test]
    fn arbitrary_text_is_handled() {
        use proptest::prelude::*;
        let (ed, ec) = (key("ssh-ed25519", 1), key("ecdsa-sha2-nistp256", 2));
        let lines = prop_oneof![
            Just(line("host", &ed)),
            Just(line("host", &ec)),
            Just(line("other", &ec)),
            Just(line("host,h2", &ec).replace('\n', "\r\n")),
            Just(line("*", &ed)),
            "[a-z#@ |,*\r\n]{0,20}",
        ];
        let texts = proptest::collection::vec(lines, 0..6).prop_map(|v| v.concat());
        proptest!(|(text in texts, reply in proptest::collection::vec(any::<u8>(), 0..40))| {
            let _ = split_proof(&reply, 2);
            let _ = signature_algorithm(&reply);
            let _ = plan_for(&text, "host", std::slice::from_ref(&ed));
            if let Ok(Some(r)) = rewrite("kh", &text, "host", std::slice::from_ref(&ed), std::slice::from_ref(&ed), &[]) {
                let kept: String = text
                    .split_inclusive('\n')
                    .enumerate()
                    .filter(|(i, _)| !r.removed.contains(&(i + 1)))
                    .map(|(_, l)| l)
                    .collect();
                prop_assert!(r.text.starts_with(&kept), "{:?} -> {:?}", text, r.text);
                let (file, _) = parse("kh", &r.text);
                let for_host: Vec<&Vec<u8>> = file
                    .entries
                    .iter()
                    .filter(|e| e.hosts.matches("host"))
                    .map(|e| &e.key_blob)
                    .collect();
                prop_assert!(for_host.iter().all(|k| **k == ed), "{:?}", r.text);
                prop_assert!(!for_host.is_empty());
            }
        });
    }
}
