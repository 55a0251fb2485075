//! OpenSSH `known_hosts` files: parsing, indexed host-key lookup, the
//! `StrictHostKeyChecking` decision and formatting of lines to append.
//!
//! The format is the one described in sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT":
//!
//! ```text
//! [@marker] hostnames keytype base64-key [comment]
//! ```
//!
//! * `@cert-authority` marks a CA key trusted to sign host certificates and
//!   `@revoked` marks a key that must never be accepted.
//! * `hostnames` is either a comma-separated list of patterns (`*`, `?`,
//!   `!negation`; a non-default port is written `[host]:port`) or a single
//!   hashed name `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`.
//! * The key blob starts with an SSH string naming its own key type, which must
//!   equal the `keytype` field.
//! * Blank lines and lines starting with `#` are ignored; CRLF is accepted.
//!
//! Everything here is sans-IO: callers read the files, pass their text to
//! [`parse`], look the server key up with [`check`], turn the result into a
//! [`Decision`] with [`decide`] and, when asked to, append the line produced by
//! [`format_entry`]. Randomness (the salt for hashed names) comes from the
//! caller. Malformed lines never abort parsing: they are skipped and reported
//! as [`ParseWarning`]s, as ssh does.
//!
//! A parsed [`KnownHostsFile`] is meant to be kept and shared by a process
//! that connects to many hosts: lookups are indexed, hashed lookups are
//! remembered per name (in memory only), and a line the caller appended to
//! the file can be added with [`KnownHostsFile::extend`] instead of parsing
//! the whole file again.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, STANDARD_PAD_INDIFFERENT};
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::pattern::{has_wildcard, match_list, ListMatch};

#[allow(unsafe_code)] // SIMD intrinsics, after CPU feature detection
mod hashed_lines;
pub mod host_cert;
pub mod update;

use hashed_lines::{sha1_words, HashedLines, KeyedSha1, PaddedName};

/// The SSH port for which host names are written without `[host]:port`.
pub const DEFAULT_PORT: u16 = 22;

/// Prefix of a hashed host name field (the only hash type OpenSSH defines).
const HASH_MAGIC: &str = "|1|";

/// Length of a SHA-1 digest, which is both the salt and the hash length.
const SHA1_LEN: usize = 20;

/// A line marker in front of the host names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    /// `@cert-authority`: the key is a CA trusted to sign host certificates.
    CertAuthority,
    /// `@revoked`: the key must be refused for the matching hosts.
    Revoked,
}

impl Marker {
    /// The marker as written in the file, including the `@`.
    pub fn as_str(self) -> &'static str {
        match self {
            Marker::CertAuthority => "@cert-authority",
            Marker::Revoked => "@revoked",
        }
    }

    fn from_token(token: &str) -> Option<Self> {
        match token {
            "@cert-authority" => Some(Marker::CertAuthority),
            "@revoked" => Some(Marker::Revoked),
            _ => None,
        }
    }
}

impl fmt::Display for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host names field of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostField {
    /// Comma-separated patterns, exactly as written in the file (original case).
    Patterns(Vec<String>),
    /// A hashed name: `|1|base64(salt)|base64(hash)`; both are 20 bytes.
    Hashed {
        /// The HMAC-SHA1 key.
        salt: Vec<u8>,
        /// HMAC-SHA1(key = salt, message = lookup name).
        hash: Vec<u8>,
    },
}

impl HostField {
    /// True when this field applies to `name`, a lookup name as produced by
    /// [`host_port_name`]. A matching `!pattern` excludes the host even if
    /// another pattern matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HostField::Patterns(pats) => {
                let lowered: Vec<String> = pats.iter().map(|p| p.to_ascii_lowercase()).collect();
                match_list(lowered.iter().map(String::as_str), name) == ListMatch::Positive
            }
            HostField::Hashed { salt, hash } => hmac_sha1(salt, name.as_bytes())[..] == hash[..],
        }
    }
}

impl fmt::Display for HostField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostField::Patterns(pats) => f.write_str(&pats.join(",")),
            HostField::Hashed { salt, hash } => write!(
                f,
                "{HASH_MAGIC}{}|{}",
                STANDARD.encode(salt),
                STANDARD.encode(hash)
            ),
        }
    }
}

/// One valid line of a known_hosts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number in the file.
    pub line: usize,
    /// `@cert-authority` / `@revoked`, if present.
    pub marker: Option<Marker>,
    /// The host names (patterns or hashed).
    pub hosts: HostField,
    /// The key type field, e.g. `ssh-ed25519`; equals the type inside the blob.
    pub key_type: String,
    /// The decoded public key blob (SSH wire format).
    pub key_blob: Vec<u8>,
    /// Anything after the key, trimmed; `None` when empty.
    pub comment: Option<String>,
}

impl Entry {
    /// The entry written back as a line, without the trailing newline.
    pub fn to_line(&self) -> String {
        let mut out = String::new();
        if let Some(m) = self.marker {
            out.push_str(m.as_str());
            out.push(' ');
        }
        out.push_str(&self.hosts.to_string());
        out.push(' ');
        out.push_str(&self.key_type);
        out.push(' ');
        out.push_str(&STANDARD.encode(&self.key_blob));
        if let Some(c) = &self.comment {
            out.push(' ');
            out.push_str(c);
        }
        out
    }

    /// `SHA256:...` fingerprint of the entry's key.
    pub fn fingerprint(&self) -> String {
        fingerprint_sha256(&self.key_blob)
    }
}

/// A skipped malformed line. Displays as `{file}:{line}: {message}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct ParseWarning {
    /// The file label given to [`parse`].
    pub file: String,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with the line.
    pub message: String,
}

/// A parsed known_hosts file with a lookup index.
///
/// The index is built from `entries` when the file is parsed (or by
/// [`KnownHostsFile::from_entries`]) and kept up to date by
/// [`KnownHostsFile::extend`]; changing `entries` directly does not update
/// it, so rebuild with `from_entries` if you modify them.
///
/// Lookups take `&self` and may be made from several threads at once: the
/// per-name memo of hashed-entry matches (see [`KnownHostsFile::matching`])
/// has its own lock.
#[derive(Debug, Clone, Default)]
pub struct KnownHostsFile {
    /// Path or other label used in messages (`file:line`).
    pub label: String,
    /// The valid entries in file order.
    pub entries: Vec<Entry>,
    /// Newline characters in the text seen so far: an appended line starts
    /// on line `newlines + 1`.
    newlines: usize,
    index: HostIndex,
}

/// At most this many names are remembered per file (see [`HashedMemo`]);
/// reaching it starts the memo afresh, so that a long-lived process asked
/// about ever new names keeps bounded memory.
const MEMO_LIMIT: usize = 1 << 16;

/// Lookup structure over the entries of one file.
///
/// * Entries whose positive patterns are all literal names are reachable
///   through `exact`, keyed by each lowercased name (the `[host]:port` form is
///   just another literal). Such an entry can only match a lookup name equal
///   to one of those literals, so a hash-map hit is enough to find it; the full
///   pattern list (including any `!negations`) is still checked afterwards.
/// * Entries with at least one positive wildcard pattern are in `scan` and
///   matched linearly; in practice this list is short.
/// * Hashed entries are kept with their HMAC keys already absorbed and are
///   hashed with a name many at a time ([`HashedLines`]). There is no way to
///   find a hashed line without hashing the name with its salt, so the
///   result of that scan is remembered per name in `memo`: a file's
///   first lookup of a name costs one scan, later ones (the same
///   connection's second lookup, or the next connection to that host in a
///   long-lived process) none. A scan may also stop at the first line that
///   settles a question ([`KnownHostsFile::first_hashed`]); the memo then
///   remembers how far it went, and a later scan goes on from there.
#[derive(Debug, Clone, Default)]
struct HostIndex {
    /// Lowercased literal name -> entry indices (ascending, no duplicates).
    exact: HashMap<String, Vec<usize>>,
    /// Entry indices that need a linear pattern match.
    scan: Vec<usize>,
    /// Lowercased pattern lists, parallel to `entries` (empty for hashed).
    lowered: Vec<Vec<String>>,
    /// Hashed entries, with their HMAC keys absorbed.
    hashed: HashedLines,
    /// Key blobs of every `@revoked` entry, whatever its host names.
    revoked: HashSet<Vec<u8>>,
    /// Indices of the `@cert-authority` entries (few, so they are matched
    /// one by one, which hashes a name only with their own salts).
    authorities: Vec<usize>,
    /// Lookup name -> the hashed entries it matches, as far as scanned.
    memo: HashedMemo,
}

/// A hashed entry just added: `(index, salt, hash)`.
type NewHashed = (usize, [u8; SHA1_LEN], [u8; SHA1_LEN]);

/// How far the hashed entries were scanned for one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct HashedScan {
    /// Indices of the entries found so far, ascending.
    hits: Vec<usize>,
    /// Where the scan stopped ([`HashedLines::scan`]'s position); at
    /// [`HashedLines::end`] every hashed entry was looked at.
    next: usize,
}

/// Remembered results of scanning the hashed entries, per lowercased lookup
/// name. Only in memory: writing names or their hashes anywhere would undo
/// what HashKnownHosts is for.
#[derive(Default)]
struct HashedMemo(Mutex<HashMap<String, HashedScan>>);

impl HashedMemo {
    fn map(&self) -> MutexGuard<'_, HashMap<String, HashedScan>> {
        // Every update is a single insert, so a panic elsewhere cannot leave
        // the map half-changed.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The scan remembered for `name`, complete or not.
    fn scan(&self, name: &str) -> HashedScan {
        self.map().get(name).cloned().unwrap_or_default()
    }

    /// The hits for `name` if a scan for it went through every hashed entry.
    #[cfg(test)]
    fn get(&self, name: &str, end: usize) -> Option<Vec<usize>> {
        self.map()
            .get(name)
            .filter(|scan| scan.next >= end)
            .map(|scan| scan.hits.clone())
    }

    /// Remembers `scan` for `name` unless a scan that went further (made
    /// meanwhile by another thread) is remembered already.
    fn insert(&self, name: &str, scan: HashedScan) {
        let mut map = self.map();
        if map.get(name).is_some_and(|known| known.next >= scan.next) {
            return;
        }
        if map.len() >= MEMO_LIMIT {
            map.clear();
        }
        map.insert(name.to_string(), scan);
    }
}

impl Clone for HashedMemo {
    fn clone(&self) -> Self {
        HashedMemo(Mutex::new(self.map().clone()))
    }
}

impl fmt::Debug for HashedMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HashedMemo({} names)", self.map().len())
    }
}

impl HostIndex {
    fn build(entries: &[Entry]) -> Self {
        let mut index = HostIndex::default();
        for (i, entry) in entries.iter().enumerate() {
            index.add(i, entry);
        }
        index
    }

    /// Indexes `entry`, which is `entries[i]`; entries are added in order.
    /// Leaves the memo alone (see [`HostIndex::remember_new_hashed`]).
    fn add(&mut self, i: usize, entry: &Entry) {
        match entry.marker {
            Some(Marker::Revoked) => {
                self.revoked.insert(entry.key_blob.clone());
            }
            Some(Marker::CertAuthority) => self.authorities.push(i),
            None => {}
        }
        match &entry.hosts {
            HostField::Patterns(pats) => {
                let lowered: Vec<String> = pats.iter().map(|p| p.to_ascii_lowercase()).collect();
                let positives = || lowered.iter().filter(|p| !p.starts_with('!'));
                if positives().any(|p| has_wildcard(p)) {
                    self.scan.push(i);
                } else {
                    for p in positives() {
                        let slot = self.exact.entry(p.clone()).or_default();
                        if slot.last() != Some(&i) {
                            slot.push(i);
                        }
                    }
                }
                self.lowered.push(lowered);
            }
            HostField::Hashed { salt, hash } => {
                // The parser only accepts 20-byte salts and hashes.
                let (Ok(salt), Ok(hash)) = (
                    <[u8; SHA1_LEN]>::try_from(salt.as_slice()),
                    <[u8; SHA1_LEN]>::try_from(hash.as_slice()),
                ) else {
                    self.lowered.push(Vec::new());
                    return;
                };
                self.hashed.push(i, &salt, &hash);
                self.lowered.push(Vec::new());
            }
        }
    }

    /// Indices of entries that apply to the lowercased lookup `name`, ascending.
    fn lookup(&self, name: &str) -> Vec<usize> {
        let mut out = self.lookup_plain(name);
        out.extend(self.hashed_until(name, |_| false).hits);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The hashed entries that `name` matches, scanned (or taken from the
    /// memo) only until `enough` holds for the entries found so far, and
    /// remembered. The result is complete when its `next` is
    /// [`HashedLines::end`].
    fn hashed_until(&self, name: &str, enough: impl Fn(&[usize]) -> bool) -> HashedScan {
        let end = self.hashed.end();
        let mut scan = self.memo.scan(name);
        if scan.next >= end || enough(&scan.hits) {
            return scan;
        }
        scan.next = self
            .hashed
            .scan(name, scan.next, &mut scan.hits, &mut |hits| enough(hits));
        self.memo.insert(name, scan.clone());
        scan
    }

    /// Indices of the entries that are not hashed and apply to the
    /// lowercased lookup `name`, ascending.
    fn lookup_plain(&self, name: &str) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        if let Some(v) = self.exact.get(name) {
            out.extend(v.iter().copied().filter(|&i| self.patterns_match(i, name)));
        }
        out.extend(
            self.scan
                .iter()
                .copied()
                .filter(|&i| self.patterns_match(i, name)),
        );
        out.sort_unstable();
        out
    }

    /// The hashed entries that `name` matches, ascending, without the memo.
    #[cfg(test)]
    fn scan_hashed(&self, name: &str) -> Vec<usize> {
        self.hashed.matching(name)
    }

    /// Brings the memo up to date after the hashed entries `new` were added
    /// (`(index, salt, hash)`, ascending by index, all after every older
    /// entry) to hashed lines that had `blocks_before` blocks.
    ///
    /// A scan that stopped part way stopped before the last of those blocks
    /// at the latest, where the new lines start, so it finds them when it
    /// goes on. Complete scans are brought up to date here. `written_for`,
    /// when given, is the lowercased name the new lines are believed to
    /// hash: it is checked, and an entry that hashes it can match no other
    /// name (that would take an HMAC-SHA1 collision), so only that name's
    /// memo changes. Entries that do not hash it are tested against every
    /// remembered name.
    fn remember_new_hashed(
        &mut self,
        new: &[NewHashed],
        blocks_before: usize,
        written_for: Option<&str>,
    ) {
        let end = self.hashed.end();
        let memo = self
            .memo
            .0
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let mut complete: HashMap<&str, &mut HashedScan> = memo
            .iter_mut()
            .filter(|(_, scan)| scan.next >= blocks_before)
            .map(|(name, scan)| (name.as_str(), scan))
            .collect();
        if complete.is_empty() {
            return;
        }
        for &(i, salt, hash) in new {
            let key = KeyedSha1::new(&salt);
            let hash = sha1_words(&hash);
            let hashes = |name: &str| key.mac(&PaddedName::new(name)) == hash;
            // Pushing keeps the lists ascending: new entries come last.
            if let Some(name) = written_for.filter(|n| hashes(n)) {
                if let Some(scan) = complete.get_mut(name) {
                    scan.hits.push(i);
                }
                continue;
            }
            for (name, scan) in complete.iter_mut() {
                if hashes(name) {
                    scan.hits.push(i);
                }
            }
        }
        for scan in complete.into_values() {
            scan.next = end;
        }
    }

    fn patterns_match(&self, i: usize, name: &str) -> bool {
        self.lowered
            .get(i)
            .is_some_and(|pats| match_list(pats.iter().map(String::as_str), name).is_match())
    }
}

impl KnownHostsFile {
    /// An empty file with the given label.
    pub fn new(label: &str) -> Self {
        Self::from_entries(label, Vec::new())
    }

    /// Builds a file (and its index) from already-parsed entries. Lines
    /// added later by [`KnownHostsFile::extend`] are numbered from the last
    /// entry's line on.
    pub fn from_entries(label: &str, entries: Vec<Entry>) -> Self {
        let index = HostIndex::build(&entries);
        KnownHostsFile {
            label: label.to_string(),
            newlines: entries.last().map_or(0, |e| e.line),
            entries,
            index,
        }
    }

    /// All entries (any marker) that apply to `name`, a lookup name as
    /// produced by [`host_port_name`], in file order.
    ///
    /// Which hashed entries match is remembered per name (in memory only),
    /// so only the first lookup of a name hashes it with every salt.
    pub fn matching(&self, name: &str) -> Vec<&Entry> {
        let name = name.to_ascii_lowercase();
        self.index
            .lookup(&name)
            .into_iter()
            .filter_map(|i| self.entries.get(i))
            .collect()
    }

    /// The entries that are not hashed and apply to `name` (as for
    /// [`KnownHostsFile::matching`]), in file order. Costs no hashing.
    pub fn matching_plain(&self, name: &str) -> Vec<&Entry> {
        let name = name.to_ascii_lowercase();
        self.index
            .lookup_plain(&name)
            .into_iter()
            .filter_map(|i| self.entries.get(i))
            .collect()
    }

    /// The first hashed entry, in file order, that applies to `name` (a
    /// lookup name as for [`KnownHostsFile::matching`]) and satisfies
    /// `wanted`. The scan of the hashed entries stops there; how far it
    /// went is remembered, so that a later lookup of the name goes on from
    /// that point instead of starting again.
    pub fn first_hashed(&self, name: &str, wanted: impl Fn(&Entry) -> bool) -> Option<&Entry> {
        let name = name.to_ascii_lowercase();
        let wanted_at = |i: usize| self.entries.get(i).filter(|e| wanted(e));
        self.index
            .hashed_until(&name, |hits| hits.iter().any(|&i| wanted_at(i).is_some()))
            .hits
            .into_iter()
            .find_map(wanted_at)
    }

    /// The `@cert-authority` entries that apply to `name` (a lookup name as
    /// for [`KnownHostsFile::matching`]), in file order. Hashes the name only
    /// with those entries' salts.
    pub fn cert_authorities_for(&self, name: &str) -> Vec<&Entry> {
        if self.index.authorities.is_empty() {
            return Vec::new();
        }
        let name = name.to_ascii_lowercase();
        self.index
            .authorities
            .iter()
            .filter_map(|&i| self.entries.get(i).map(|e| (i, e)))
            .filter(|(i, e)| match &e.hosts {
                // Patterns were lowercased once, when the file was indexed.
                HostField::Patterns(_) => self.index.patterns_match(*i, &name),
                HostField::Hashed { .. } => e.hosts.matches(&name),
            })
            .map(|(_, e)| e)
            .collect()
    }

    /// Whether the file has hashed host names.
    pub fn has_hashed(&self) -> bool {
        !self.index.hashed.is_empty()
    }

    /// Whether some `@revoked` entry, for any host, holds this key blob.
    pub fn revokes_anywhere(&self, key_blob: &[u8]) -> bool {
        self.index.revoked.contains(key_blob)
    }

    /// Adds the lines in `text`, which was appended to the file after the text
    /// parsed so far (for example a line from [`format_entry`], with a newline
    /// in front if the file did not end with one), without re-reading the
    /// rest. Line numbers continue the file's; malformed lines are skipped
    /// with a warning, as by [`parse`].
    ///
    /// `written_for` is the lookup name ([`host_port_name`]) the new lines
    /// were written for, if known: a hashed line is then checked against that
    /// one name only when updating the memo of hashed lookups, instead of
    /// against every name looked up so far. A wrong hint costs time, never a
    /// wrong answer.
    pub fn extend(&mut self, text: &str, written_for: Option<&str>) -> Vec<ParseWarning> {
        let first = self.entries.len();
        let blocks_before = self.index.hashed.end();
        let mut warnings = Vec::new();
        self.newlines += parse_lines(
            &self.label,
            text,
            self.newlines,
            &mut self.entries,
            &mut warnings,
        );
        let mut new_hashed: Vec<NewHashed> = Vec::new();
        for (i, entry) in self.entries.iter().enumerate().skip(first) {
            self.index.add(i, entry);
            if let HostField::Hashed { salt, hash } = &entry.hosts {
                if let (Ok(salt), Ok(hash)) = (salt[..].try_into(), hash[..].try_into()) {
                    new_hashed.push((i, salt, hash));
                }
            }
        }
        let hint = written_for.map(str::to_ascii_lowercase);
        self.index
            .remember_new_hashed(&new_hashed, blocks_before, hint.as_deref());
        warnings
    }
}

/// Parses a known_hosts file. `label` (usually the path) is used in warnings
/// and in [`Found::file`].
///
/// Malformed lines are skipped with a warning (as ssh does), never a panic; the
/// rest of the file still counts.
pub fn parse(label: &str, text: &str) -> (KnownHostsFile, Vec<ParseWarning>) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    let newlines = parse_lines(label, text, 0, &mut entries, &mut warnings);
    let mut file = KnownHostsFile::from_entries(label, entries);
    file.newlines = newlines;
    (file, warnings)
}

/// Parses the lines of `text`, numbering them from `after + 1`, into
/// `entries` and `warnings`; returns the number of newlines in `text`.
fn parse_lines(
    label: &str,
    text: &str,
    after: usize,
    entries: &mut Vec<Entry>,
    warnings: &mut Vec<ParseWarning>,
) -> usize {
    let mut newlines = 0;
    for (idx, raw) in text.split('\n').enumerate() {
        newlines = idx;
        let line_no = after + idx + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        match parse_line(line, line_no) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(message) => warnings.push(ParseWarning {
                file: label.to_string(),
                line: line_no,
                message,
            }),
        }
    }
    newlines
}

/// Splits off the next whitespace-delimited token: `(token, rest)`.
fn next_token(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    if s.is_empty() {
        return None;
    }
    let end = s.find(|c: char| c.is_ascii_whitespace()).unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

/// Parses one line: `Ok(None)` for blank/comment lines, `Err(message)` for
/// malformed ones.
fn parse_line(line: &str, line_no: usize) -> Result<Option<Entry>, String> {
    let trimmed = line.trim_start_matches(|c: char| c.is_ascii_whitespace());
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let (mut token, mut rest) = next_token(trimmed).ok_or("empty line")?;
    let mut marker = None;
    if token.starts_with('@') {
        marker =
            Some(Marker::from_token(token).ok_or_else(|| format!("unknown marker {token:?}"))?);
        (token, rest) = next_token(rest).ok_or("missing host names after marker")?;
    }
    let hosts = parse_host_field(token)?;
    let (key_type, rest) = next_token(rest).ok_or("missing key type")?;
    let (key_b64, rest) = next_token(rest).ok_or("missing key")?;
    let key_blob = STANDARD_PAD_INDIFFERENT
        .decode(key_b64)
        .map_err(|e| format!("invalid base64 in key: {e}"))?;
    let blob_type =
        blob_key_type(&key_blob).ok_or("key blob does not start with a key type name")?;
    if blob_type != key_type {
        return Err(format!(
            "key type mismatch: field says {key_type:?} but the key is {blob_type:?}"
        ));
    }
    let comment = rest.trim();
    Ok(Some(Entry {
        line: line_no,
        marker,
        hosts,
        key_type: key_type.to_string(),
        key_blob,
        comment: (!comment.is_empty()).then(|| comment.to_string()),
    }))
}

fn parse_host_field(field: &str) -> Result<HostField, String> {
    if !field.starts_with('|') {
        return Ok(HostField::Patterns(
            field.split(',').map(str::to_string).collect(),
        ));
    }
    let bad = || format!("invalid hashed host name {field:?} (expected |1|salt|hash)");
    let body = field.strip_prefix(HASH_MAGIC).ok_or_else(bad)?;
    let (salt_b64, hash_b64) = body.split_once('|').ok_or_else(bad)?;
    let salt = STANDARD_PAD_INDIFFERENT
        .decode(salt_b64)
        .map_err(|_| bad())?;
    let hash = STANDARD_PAD_INDIFFERENT
        .decode(hash_b64)
        .map_err(|_| bad())?;
    if salt.len() != SHA1_LEN || hash.len() != SHA1_LEN {
        return Err(bad());
    }
    Ok(HostField::Hashed { salt, hash })
}

/// The key type name at the start of an SSH public key blob (an SSH string:
/// big-endian u32 length, then the bytes), if well formed.
pub fn blob_key_type(blob: &[u8]) -> Option<&str> {
    let len_bytes: [u8; 4] = blob.get(..4)?.try_into().ok()?;
    let len = usize::try_from(u32::from_be_bytes(len_bytes)).ok()?;
    let name = blob.get(4..4usize.checked_add(len)?)?;
    std::str::from_utf8(name).ok()
}

/// The size in bits of an `ssh-rsa` key's modulus, from its blob
/// (`string "ssh-rsa", mpint e, mpint n`); `None` for other keys or a
/// malformed blob. For `RequiredRSASize`.
pub fn rsa_modulus_bits(blob: &[u8]) -> Option<u32> {
    fn field(rest: &[u8]) -> Option<(&[u8], &[u8])> {
        let len_bytes: [u8; 4] = rest.get(..4)?.try_into().ok()?;
        let len = usize::try_from(u32::from_be_bytes(len_bytes)).ok()?;
        let end = 4usize.checked_add(len)?;
        Some((rest.get(4..end)?, rest.get(end..)?))
    }
    let (name, rest) = field(blob)?;
    if name != b"ssh-rsa" {
        return None;
    }
    let (_e, rest) = field(rest)?;
    let (n, _) = field(rest)?;
    let significant = n.iter().position(|&b| b != 0).map(|i| &n[i..])?;
    let top_bits = 8 - significant[0].leading_zeros();
    u32::try_from(significant.len() - 1)
        .ok()?
        .checked_mul(8)?
        .checked_add(top_bits)
}

/// The lookup name for a host and port: `host` for port 22 (or 0, meaning
/// default), `[host]:port` otherwise; always ASCII-lowercased.
pub fn host_port_name(host: &str, port: u16) -> String {
    let host = host.to_ascii_lowercase();
    if port == DEFAULT_PORT || port == 0 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

/// The name as shown to users: like [`host_port_name`] but keeping case.
fn display_name(host: &str, port: u16) -> String {
    if port == DEFAULT_PORT || port == 0 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// Where an entry was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found<'a> {
    /// The file label.
    pub file: &'a str,
    /// 1-based line number.
    pub line: usize,
    /// The entry itself.
    pub entry: &'a Entry,
}

impl<'a> Found<'a> {
    /// `entry`, one of `file`'s entries.
    fn of(file: &'a KnownHostsFile, entry: &'a Entry) -> Self {
        Found {
            file: &file.label,
            line: entry.line,
            entry,
        }
    }
}

impl fmt::Display for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Result of looking a server host key up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyStatus<'a> {
    /// The exact key is recorded for this host (first match in file order).
    Known(Found<'a>),
    /// The key is listed `@revoked` for this host.
    Revoked(Found<'a>),
    /// Keys of the same type family are recorded for this host, but none equals
    /// the offered key.
    Changed {
        /// The recorded keys of the same family, in lookup order.
        old: Vec<Found<'a>>,
    },
    /// Only keys of other types are recorded for this host. OpenSSH counts
    /// any recorded key that differs as a changed key, whatever its type,
    /// and so does [`decide`]: a server that no longer shows the type it
    /// was known by may be someone else.
    OtherTypesKnown(Vec<Found<'a>>),
    /// Nothing is recorded for this host.
    Unknown,
}

/// Normalises a key or signature algorithm name to the key type it belongs
/// to, so that e.g. `rsa-sha2-512` and certificate types compare with the
/// plain key type. ECDSA curves stay distinct, as in OpenSSH.
fn key_family(key_type: &str) -> String {
    let plain = match key_type.strip_suffix("-cert-v01@openssh.com") {
        Some(base) if base.starts_with("sk-") => format!("{base}@openssh.com"),
        Some(base) => base.to_string(),
        None => key_type.to_string(),
    };
    match plain.as_str() {
        "rsa-sha2-256" | "rsa-sha2-512" => "ssh-rsa".to_string(),
        _ => plain,
    }
}

/// Short user-facing key type name (`ED25519`, `RSA`, `ECDSA`, ...).
pub fn key_type_label(key_type: &str) -> String {
    let family = key_family(key_type);
    let label = match family.as_str() {
        "ssh-rsa" => "RSA",
        "ssh-dss" => "DSA",
        "ssh-ed25519" => "ED25519",
        "ssh-ed448" => "ED448",
        "sk-ssh-ed25519@openssh.com" => "ED25519-SK",
        "sk-ecdsa-sha2-nistp256@openssh.com" => "ECDSA-SK",
        f if f.starts_with("ecdsa-sha2-") => "ECDSA",
        other => other,
    };
    label.to_string()
}

/// Type of the offered key: the one inside the blob if readable, else the
/// caller's `key_type`.
fn offered_type<'b>(key_type: &'b str, key_blob: &'b [u8]) -> &'b str {
    blob_key_type(key_blob).unwrap_or(key_type)
}

/// All entries (any marker) in `files` that apply to `host`/`port`, in file
/// order, files in the given order.
///
/// Here and in [`check`], [`cert_authorities`] and [`revoked`], `files` may
/// hold the files themselves (`&[KnownHostsFile]`) or references to them
/// (`&[&KnownHostsFile]`, e.g. files shared between connections behind locks).
pub fn lookup<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
) -> Vec<Found<'a>> {
    found_in(files, host, port, KnownHostsFile::matching)
}

/// Like [`lookup`], but only the entries whose host names are not hashed:
/// no HMAC is computed.
pub fn lookup_plain<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
) -> Vec<Found<'a>> {
    found_in(files, host, port, KnownHostsFile::matching_plain)
}

/// The entries `matching` picks for `host`/`port` in each file, in order.
fn found_in<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    matching: impl Fn(&'a KnownHostsFile, &str) -> Vec<&'a Entry>,
) -> Vec<Found<'a>> {
    let name = host_port_name(host, port);
    files
        .iter()
        .map(Borrow::borrow)
        .flat_map(|file: &'a KnownHostsFile| {
            matching(file, &name)
                .into_iter()
                .map(move |entry| Found::of(file, entry))
        })
        .collect()
}

/// The first hashed entry for `host`/`port` that satisfies `wanted`, in
/// the first file that has one, scanning each file's hashed entries only as
/// far as that entry (see [`KnownHostsFile::first_hashed`]).
pub fn first_hashed<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    wanted: impl Fn(&Entry) -> bool,
) -> Option<Found<'a>> {
    let name = host_port_name(host, port);
    files.iter().map(Borrow::borrow).find_map(|file| {
        file.first_hashed(&name, &wanted)
            .map(|entry| Found::of(file, entry))
    })
}

/// [`HostKeyStatus::Known`] if an entry for this host holds exactly this
/// key and no `@revoked` entry anywhere holds it; `None` when only a full
/// [`check`] can tell.
///
/// Whatever the other entries say, such a key is known: [`check`] ranks an
/// exact match above everything but `@revoked`, and a revocation, hashed or
/// not, is found here by its key blob. So the entries that are not hashed
/// are looked at first, which costs no hashing, and then each file's hashed
/// entries only up to the first that holds the key ([`first_hashed`]): on
/// average half of them instead of all, when the key is known.
fn known_at_least_cost<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    key_blob: &[u8],
) -> Option<HostKeyStatus<'a>> {
    if files.iter().any(|f| f.borrow().revokes_anywhere(key_blob)) {
        return None;
    }
    let holds_key = |e: &Entry| e.marker.is_none() && e.key_blob == key_blob;
    lookup_plain(files, host, port)
        .into_iter()
        .find(|f| holds_key(f.entry))
        .or_else(|| first_hashed(files, host, port, holds_key))
        .map(HostKeyStatus::Known)
}

/// Looks up the server key across several files in order (user files, then
/// global files, as ssh does).
///
/// `@revoked` for this exact key wins over everything; then an exact match
/// gives [`HostKeyStatus::Known`]; then any plain entry for this host with the
/// same key type family but a different key gives [`HostKeyStatus::Changed`];
/// else plain entries with other key types give
/// [`HostKeyStatus::OtherTypesKnown`]; else [`HostKeyStatus::Unknown`].
/// `@cert-authority` entries are not host keys and are ignored here; see
/// [`cert_authorities`]. Keys are compared by their blobs; `key_type` is only
/// used for the family when the blob does not name its type.
///
/// When a plain entry holds the key, hashed entries are not looked at and
/// the `Known` entry reported is that plain one. Otherwise hashed entries
/// are hashed only up to the first that holds the key, if one does
/// ([`known_at_least_cost`]); only a key that is not known takes them all.
pub fn check<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    key_type: &str,
    key_blob: &[u8],
) -> HostKeyStatus<'a> {
    known_at_least_cost(files, host, port, key_blob)
        .unwrap_or_else(|| check_every_entry(files, host, port, key_type, key_blob))
}

/// [`check`] by looking at every entry that applies, hashed ones included.
fn check_every_entry<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    key_type: &str,
    key_blob: &[u8],
) -> HostKeyStatus<'a> {
    let family = key_family(offered_type(key_type, key_blob));
    let mut known = None;
    let mut changed = Vec::new();
    let mut other = Vec::new();
    for found in lookup(files, host, port) {
        let entry = found.entry;
        match entry.marker {
            Some(Marker::Revoked) => {
                if entry.key_blob == key_blob {
                    return HostKeyStatus::Revoked(found);
                }
            }
            Some(Marker::CertAuthority) => {}
            None => {
                if entry.key_blob == key_blob {
                    known.get_or_insert(found);
                } else if key_family(&entry.key_type) == family {
                    changed.push(found);
                } else {
                    other.push(found);
                }
            }
        }
    }
    if let Some(found) = known {
        HostKeyStatus::Known(found)
    } else if !changed.is_empty() {
        HostKeyStatus::Changed { old: changed }
    } else if !other.is_empty() {
        HostKeyStatus::OtherTypesKnown(other)
    } else {
        HostKeyStatus::Unknown
    }
}

/// `@cert-authority` entries that apply to `host`/`port`, in order. Used to
/// validate host certificates (see [`host_cert`]).
pub fn cert_authorities<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
) -> Vec<Found<'a>> {
    found_in(files, host, port, KnownHostsFile::cert_authorities_for)
}

/// The `@revoked` entry for exactly this key blob that applies to
/// `host`/`port`, if any (e.g. to check a certificate's CA key).
pub fn revoked<'a, F: Borrow<KnownHostsFile>>(
    files: &'a [F],
    host: &str,
    port: u16,
    key_blob: &[u8],
) -> Option<Found<'a>> {
    lookup(files, host, port)
        .into_iter()
        .find(|f| f.entry.marker == Some(Marker::Revoked) && f.entry.key_blob == key_blob)
}

/// A key blob in base64, as known_hosts and authorized_keys write it.
pub fn key_base64(key_blob: &[u8]) -> String {
    STANDARD.encode(key_blob)
}

/// `SHA256:` followed by unpadded base64 of SHA-256(blob), as `ssh-keygen -l`.
pub fn fingerprint_sha256(key_blob: &[u8]) -> String {
    format!(
        "SHA256:{}",
        STANDARD_NO_PAD.encode(Sha256::digest(key_blob))
    )
}

fn hmac_sha1(key: &[u8], msg: &[u8]) -> [u8; SHA1_LEN] {
    // HMAC accepts keys of any length, so this cannot fail; an all-zero MAC
    // would simply never match anything.
    let Ok(mut mac) = <Hmac<Sha1> as KeyInit>::new_from_slice(key) else {
        return [0; SHA1_LEN];
    };
    mac.update(msg);
    let mut out = [0u8; SHA1_LEN];
    out.copy_from_slice(&mac.finalize().into_bytes());
    out
}

/// Hashed host name field `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`.
/// `name` should be a lookup name from [`host_port_name`]; it is
/// ASCII-lowercased here too, since lookups always use lowercase names.
pub fn hash_name(name: &str, salt: &[u8; 20]) -> String {
    let name = name.to_ascii_lowercase();
    let mac = hmac_sha1(salt, name.as_bytes());
    format!(
        "{HASH_MAGIC}{}|{}",
        STANDARD.encode(salt),
        STANDARD.encode(mac)
    )
}

/// A line to append to known_hosts: `name keytype base64\n`, with the name
/// hashed when `salt` is given (fresh random bytes from the caller).
///
/// The key type written is the one named inside `key_blob` when readable (so a
/// signature algorithm such as `rsa-sha2-512` passed as `key_type` still
/// produces a valid `ssh-rsa` line), otherwise `key_type`.
pub fn format_entry(
    host: &str,
    port: u16,
    key_type: &str,
    key_blob: &[u8],
    salt: Option<&[u8; 20]>,
) -> String {
    let name = host_port_name(host, port);
    let hosts = match salt {
        Some(salt) => hash_name(&name, salt),
        None => name,
    };
    format!(
        "{hosts} {} {}\n",
        offered_type(key_type, key_blob),
        STANDARD.encode(key_blob)
    )
}

/// The `StrictHostKeyChecking` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StrictHostKeyChecking {
    /// Never accept unknown or changed keys.
    Yes,
    /// Record unknown keys automatically; refuse changed ones.
    AcceptNew,
    /// Record unknown keys; accept changed keys with a warning (not recorded).
    No,
    /// Ask the user about unknown keys; refuse changed ones. OpenSSH's default.
    #[default]
    Ask,
}

impl StrictHostKeyChecking {
    /// Parses an ssh_config value (`yes`/`true`, `no`/`false`/`off`, `ask`,
    /// `accept-new`), case-insensitively.
    pub fn from_config_value(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "yes" | "true" => Some(Self::Yes),
            "no" | "false" | "off" => Some(Self::No),
            "ask" => Some(Self::Ask),
            "accept-new" => Some(Self::AcceptNew),
            _ => None,
        }
    }
}

/// What to do with the server's host key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Continue; nothing to record.
    Accept,
    /// Continue and append [`format_entry`] to the user's known_hosts file.
    AcceptAndRecord,
    /// Continue without recording, but show this (multi-line) warning first.
    AcceptWithWarning(String),
    /// Abort the connection, showing this (multi-line) message.
    Refuse(String),
    /// `Ask` policy and an unknown host: prompt on the terminal (see
    /// [`ask_prompt`] and [`ask_answer`]), then record if the user agrees.
    AskUser,
}

const BANNER_RULE: &str = "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@";

fn banner(title: &str) -> String {
    let inner = BANNER_RULE.len() - 2;
    format!("{BANNER_RULE}\n@{title:^inner$}@\n{BANNER_RULE}\n")
}

/// Quotes for a POSIX shell command line.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn describe_found(found: &Found<'_>) -> String {
    format!(
        "  {} key {} in {}",
        key_type_label(&found.entry.key_type),
        found.entry.fingerprint(),
        found
    )
}

/// Decides what to do with a looked-up host key, following OpenSSH:
///
/// * `Known` -> [`Decision::Accept`].
/// * `Revoked` -> [`Decision::Refuse`] under every policy; names `file:line`.
/// * `Changed` and `OtherTypesKnown` (a key of another type recorded, as
///   OpenSSH counts it) -> `Refuse` for `Yes`/`AcceptNew`/`Ask`;
///   [`Decision::AcceptWithWarning`] (not recorded) for `No`. The message
///   gives the offered and recorded fingerprints, `file:line` of the old
///   entries and the `ssh-keygen -R` command to remove them.
/// * `Unknown` -> `Yes`: `Refuse` with the fingerprint and how to add the
///   key; `AcceptNew`/`No`: [`Decision::AcceptAndRecord`]; `Ask`:
///   [`Decision::AskUser`].
pub fn decide(
    status: &HostKeyStatus<'_>,
    policy: StrictHostKeyChecking,
    host: &str,
    port: u16,
    key_type: &str,
    key_blob: &[u8],
) -> Decision {
    use StrictHostKeyChecking as P;
    let shown = display_name(host, port);
    let ktype = offered_type(key_type, key_blob);
    let label = key_type_label(ktype);
    let fp = fingerprint_sha256(key_blob);
    match status {
        HostKeyStatus::Known(_) => Decision::Accept,
        HostKeyStatus::Revoked(found) => {
            let mut msg = banner("WARNING: REVOKED HOST KEY DETECTED!");
            msg.push_str(&format!(
                "The {label} host key offered by {shown} has been revoked.\n\
                 Someone may be using a stolen key to impersonate this host.\n\
                 Offered key fingerprint: {fp}\n\
                 Revocation entry: {found}\n\
                 Host key verification failed."
            ));
            Decision::Refuse(msg)
        }
        HostKeyStatus::Changed { old } | HostKeyStatus::OtherTypesKnown(old) => {
            let recorded = match status {
                HostKeyStatus::Changed { .. } => "the key recorded for it",
                _ => "the keys of other types recorded for it",
            };
            let mut msg = banner("WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!");
            msg.push_str(&format!(
                "The {label} host key offered by {shown} does not match {recorded}.\n\
                 Someone may be intercepting this connection (man-in-the-middle attack),\n\
                 or the host key may simply have been replaced.\n\
                 Offered key fingerprint: {fp}\n\
                 Recorded key(s):\n"
            ));
            for found in old {
                msg.push_str(&describe_found(found));
                msg.push('\n');
            }
            msg.push_str(
                "Verify the new fingerprint with the host's administrator. If the change is\n\
                 legitimate, remove the old entry and connect again:\n",
            );
            let name = host_port_name(host, port);
            let mut files: Vec<&str> = Vec::new();
            for found in old {
                if !files.contains(&found.file) {
                    files.push(found.file);
                }
            }
            for file in files {
                msg.push_str(&format!(
                    "  ssh-keygen -f {} -R {}\n",
                    sh_quote(file),
                    sh_quote(&name)
                ));
            }
            if policy == P::No {
                msg.push_str(
                    "StrictHostKeyChecking=no: continuing anyway; the new key was NOT recorded.",
                );
                Decision::AcceptWithWarning(msg)
            } else {
                msg.push_str(&format!(
                    "Host key for {shown} has changed and strict checking refuses it.\n\
                     Host key verification failed."
                ));
                Decision::Refuse(msg)
            }
        }
        HostKeyStatus::Unknown => match policy {
            P::AcceptNew | P::No => Decision::AcceptAndRecord,
            P::Ask => Decision::AskUser,
            P::Yes => {
                let mut msg = format!(
                    "No {label} host key is known for {shown} and StrictHostKeyChecking is yes.\n\
                     The server offered a key with fingerprint {fp}\n"
                );
                let line = format_entry(host, port, key_type, key_blob, None);
                msg.push_str(&format!(
                    "After verifying the fingerprint with the host's administrator, either connect\n\
                     once with -o StrictHostKeyChecking=accept-new, or add this line to your\n\
                     known_hosts file:\n  {}\n\
                     Host key verification failed.",
                    line.trim_end()
                ));
                Decision::Refuse(msg)
            }
        },
    }
}

/// The terminal prompt for [`Decision::AskUser`], ending with the question
/// (no trailing newline).
pub fn ask_prompt(host: &str, port: u16, key_type: &str, key_blob: &[u8]) -> String {
    let shown = display_name(host, port);
    let label = key_type_label(offered_type(key_type, key_blob));
    let mut msg = format!(
        "The authenticity of host '{shown}' can't be established.\n\
         {label} key fingerprint is {}.\n",
        fingerprint_sha256(key_blob)
    );
    msg.push_str("Are you sure you want to continue connecting (yes/no/[fingerprint])? ");
    msg
}

/// Interprets the user's answer to [`ask_prompt`]: `Some(true)` for `yes` or
/// the exact fingerprint of the offered key, `Some(false)` for `no`, `None`
/// otherwise (ask again: "Please type 'yes', 'no' or the fingerprint: ").
pub fn ask_answer(answer: &str, key_blob: &[u8]) -> Option<bool> {
    let answer = answer.trim();
    if answer.eq_ignore_ascii_case("yes") {
        Some(true)
    } else if answer.eq_ignore_ascii_case("no") {
        Some(false)
    } else if answer == fingerprint_sha256(key_blob) {
        Some(true)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake public key blob: SSH string type name + SSH string payload.
    fn blob(key_type: &str, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(key_type.len() as u32).to_be_bytes());
        b.extend_from_slice(key_type.as_bytes());
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    fn ed(n: u8) -> Vec<u8> {
        blob("ssh-ed25519", &[n; 32])
    }

    fn rsa(n: u8) -> Vec<u8> {
        blob("ssh-rsa", &[n; 64])
    }

    fn b64(b: &[u8]) -> String {
        STANDARD.encode(b)
    }

    fn line(hosts: &str, key: &[u8]) -> String {
        let kt = blob_key_type(key).unwrap();
        format!("{hosts} {kt} {}\n", b64(key))
    }

    fn parse_ok(label: &str, text: &str) -> KnownHostsFile {
        let (f, w) = parse(label, text);
        assert!(w.is_empty(), "unexpected warnings: {w:?}");
        f
    }

    fn status_line(s: &HostKeyStatus<'_>) -> Option<usize> {
        match s {
            HostKeyStatus::Known(f) | HostKeyStatus::Revoked(f) => Some(f.line),
            _ => None,
        }
    }

    #[test]
    fn host_port_names() {
        assert_eq!(host_port_name("Example.COM", 22), "example.com");
        assert_eq!(host_port_name("Example.COM", 0), "example.com");
        assert_eq!(host_port_name("Example.COM", 2222), "[example.com]:2222");
        assert_eq!(host_port_name("::1", 2222), "[::1]:2222");
    }

    #[test]
    fn plain_entry_and_fields() {
        let key = ed(1);
        let text = format!(
            "# comment\n\n   \nexample.com ssh-ed25519 {} my comment  here \n",
            b64(&key)
        );
        let f = parse_ok("kh", &text);
        assert_eq!(f.entries.len(), 1);
        let e = &f.entries[0];
        assert_eq!(e.line, 4);
        assert_eq!(e.marker, None);
        assert_eq!(e.hosts, HostField::Patterns(vec!["example.com".into()]));
        assert_eq!(e.key_type, "ssh-ed25519");
        assert_eq!(e.key_blob, key);
        assert_eq!(e.comment.as_deref(), Some("my comment  here"));
        assert_eq!(
            e.to_line(),
            format!("example.com ssh-ed25519 {} my comment  here", b64(&key))
        );

        let files = [f];
        let s = check(&files, "EXAMPLE.com", 22, "ssh-ed25519", &key);
        assert_eq!(status_line(&s), Some(4));
        assert!(matches!(s, HostKeyStatus::Known(f) if f.file == "kh"));
        assert_eq!(
            check(&files, "other.com", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        // Port 22 entries do not apply to other ports.
        assert_eq!(
            check(&files, "example.com", 2222, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn case_insensitive_patterns() {
        let key = ed(1);
        let files = [parse_ok("kh", &line("Example.COM,*.Corp.NET", &key))];
        for h in ["example.com", "EXAMPLE.COM", "db.corp.net", "DB.CORP.NET"] {
            assert!(matches!(
                check(&files, h, 22, "ssh-ed25519", &key),
                HostKeyStatus::Known(_)
            ));
        }
    }

    #[test]
    fn comma_list() {
        let key = ed(2);
        let files = [parse_ok("kh", &line("a.example,b.example,10.0.0.1", &key))];
        for h in ["a.example", "b.example", "10.0.0.1"] {
            assert!(
                matches!(
                    check(&files, h, 22, "ssh-ed25519", &key),
                    HostKeyStatus::Known(_)
                ),
                "{h}"
            );
        }
        assert_eq!(
            check(&files, "c.example", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn bracketed_port() {
        let key = ed(3);
        let files = [parse_ok("kh", &line("[example.com]:2222,other", &key))];
        assert!(matches!(
            check(&files, "example.com", 2222, "ssh-ed25519", &key),
            HostKeyStatus::Known(_)
        ));
        assert_eq!(
            check(&files, "example.com", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        assert_eq!(
            check(&files, "example.com", 2223, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        // A wildcard pattern is matched against the [host]:port form.
        let files = [parse_ok("kh", &line("[*.example.com]:*", &key))];
        assert!(matches!(
            check(&files, "a.example.com", 2200, "ssh-ed25519", &key),
            HostKeyStatus::Known(_)
        ));
        assert_eq!(
            check(&files, "a.example.com", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn wildcards_and_negation() {
        let key = ed(4);
        let text = line("*.corp,!secret.corp,web?", &key);
        let files = [parse_ok("kh", &text)];
        let known = |h: &str| {
            matches!(
                check(&files, h, 22, "ssh-ed25519", &key),
                HostKeyStatus::Known(_)
            )
        };
        assert!(known("db.corp"));
        assert!(known("web1"));
        assert!(!known("secret.corp"));
        assert!(!known("web12"));
        assert!(!known("corp"));

        // Negation on a line of literal names (indexed, but still verified).
        let files = [parse_ok("kh", &line("a.host,b.host,!a.host", &key))];
        assert_eq!(
            check(&files, "a.host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        assert!(matches!(
            check(&files, "b.host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Known(_)
        ));
        // A negation alone matches nothing.
        let files = [parse_ok("kh", &line("!x", &key))];
        assert_eq!(
            check(&files, "y", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        // Negated wildcard on a literal line.
        let files = [parse_ok("kh", &line("db.internal,!*.internal", &key))];
        assert_eq!(
            check(&files, "db.internal", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn hashed_entries() {
        let key = ed(5);
        let salt = [7u8; 20];
        let salt2 = [9u8; 20];
        let text = format!(
            "{}{}",
            format_entry("Host.Example", 22, "ssh-ed25519", &key, Some(&salt)),
            format_entry("host.example", 2222, "ssh-ed25519", &key, Some(&salt2)),
        );
        let f = parse_ok("kh", &text);
        assert!(matches!(f.entries[0].hosts, HostField::Hashed { .. }));
        assert!(f.entries[0].hosts.matches("host.example"));
        let files = [f];
        let s = check(&files, "host.example", 22, "ssh-ed25519", &key);
        assert_eq!(status_line(&s), Some(1));
        let s = check(&files, "HOST.example", 2222, "ssh-ed25519", &key);
        assert_eq!(status_line(&s), Some(2));
        assert_eq!(
            check(&files, "host.example", 2200, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        assert_eq!(
            check(&files, "other", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
        // Round trip of the hosts field.
        assert_eq!(
            files[0].entries[0].to_line() + "\n",
            text.lines().next().unwrap().to_string() + "\n"
        );
    }

    #[test]
    fn hashed_fixed_vector() {
        // Salt 0x00..0x13; HMAC-SHA1 computed independently (Python hmac).
        let salt: [u8; 20] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            hash_name("example.com", &salt),
            "|1|AAECAwQFBgcICQoLDA0ODxAREhM=|nnUK16ANsXd3hL31YfAkGOluSjU="
        );
        assert_eq!(
            hash_name("[example.com]:2222", &salt),
            "|1|AAECAwQFBgcICQoLDA0ODxAREhM=|Wgcx+Fm+LmaWwC7rQ80eIf2uHe0="
        );
        // Case-insensitive: the name is lowercased before hashing.
        assert_eq!(
            hash_name("EXAMPLE.com", &salt),
            hash_name("example.com", &salt)
        );
        let key = ed(0);
        assert_eq!(
            format_entry("example.com", 22, "ssh-ed25519", &key, Some(&salt)),
            format!(
                "|1|AAECAwQFBgcICQoLDA0ODxAREhM=|nnUK16ANsXd3hL31YfAkGOluSjU= ssh-ed25519 {}\n",
                b64(&key)
            )
        );
        assert_eq!(
            format_entry("Example.com", 22, "ssh-ed25519", &key, None),
            format!("example.com ssh-ed25519 {}\n", b64(&key))
        );
        assert_eq!(
            format_entry("example.com", 2222, "ssh-ed25519", &key, None),
            format!("[example.com]:2222 ssh-ed25519 {}\n", b64(&key))
        );
    }

    #[test]
    fn format_entry_uses_blob_type() {
        let key = rsa(1);
        let l = format_entry("h", 22, "rsa-sha2-512", &key, None);
        assert!(l.starts_with("h ssh-rsa "));
        let files = [parse_ok("kh", &l)];
        assert!(matches!(
            check(&files, "h", 22, "rsa-sha2-512", &key),
            HostKeyStatus::Known(_)
        ));
    }

    #[test]
    fn fingerprint_format() {
        // SHA-256 of the empty string, unpadded base64.
        assert_eq!(
            fingerprint_sha256(b""),
            "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"
        );
    }

    /// Lines produced by OpenSSH (`ssh-keygen -H`) and the fingerprint printed
    /// by `ssh-keygen -l` for that key.
    #[test]
    fn openssh_generated_vectors() {
        let text = "\
|1|Q4mxpA673VCnK35/mvKzT15LceQ=|wj/tkBEDwFfdYa91UQsBcF6s1qY= ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAFbZVNwgyx3Mo3f8bh5exU7rNrdajhkKHKNjAhT65VM
|1|+WfmiYf6gGpnXBNy3LAH7hMr7wQ=|sgOoHkjSEafNR6PB4tjVFZGBQQQ= ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAFbZVNwgyx3Mo3f8bh5exU7rNrdajhkKHKNjAhT65VM
";
        let f = parse_ok("kh", text);
        let key = f.entries[0].key_blob.clone();
        assert_eq!(
            fingerprint_sha256(&key),
            "SHA256:FAYfjnEN/nvlSQYVHHI+5gMn5TDIPlE8a9++BgoWIFM"
        );
        let files = [f];
        assert_eq!(
            status_line(&check(&files, "example.com", 22, "ssh-ed25519", &key)),
            Some(1)
        );
        assert_eq!(
            status_line(&check(&files, "Example.com", 2222, "ssh-ed25519", &key)),
            Some(2)
        );
        // Our hashing reproduces OpenSSH's for the same salt.
        let HostField::Hashed { salt, .. } = &files[0].entries[1].hosts else {
            panic!()
        };
        let salt: [u8; 20] = salt.as_slice().try_into().unwrap();
        assert_eq!(
            format_entry("example.com", 2222, "ssh-ed25519", &key, Some(&salt)),
            text.lines().nth(1).unwrap().to_string() + "\n"
        );
    }

    /// A plain line with the offered key settles the check without hashing
    /// the name (its memo stays empty); any other answer hashes it.
    #[test]
    fn a_plain_match_is_not_hashed() {
        let mut rng = TestRng(11);
        let mut text = line("a", &ed(1));
        for i in 0..40u8 {
            text.push_str(&format_entry(
                &format!("h{i}"),
                22,
                "ssh-ed25519",
                &ed(i),
                Some(&rng.salt()),
            ));
        }
        text.push_str(&format_entry(
            "a",
            22,
            "ssh-ed25519",
            &ed(1),
            Some(&rng.salt()),
        ));
        let files = [parse_ok("kh", &text)];
        assert!(matches!(
            check(&files, "a", 22, "ssh-ed25519", &ed(1)),
            HostKeyStatus::Known(f) if f.line == 1
        ));
        assert_eq!(
            files[0].index.memo.get("a", files[0].index.hashed.end()),
            None
        );
        assert!(matches!(
            check(&files, "a", 22, "ssh-ed25519", &ed(2)),
            HostKeyStatus::Changed { .. }
        ));
        assert_eq!(
            files[0].index.memo.get("a", files[0].index.hashed.end()),
            Some(vec![41])
        );
    }

    /// A revocation is found by its key even when it is hashed or sits in
    /// another file, so the shortcut never hides it.
    #[test]
    fn a_hashed_revocation_still_wins_over_a_plain_line() {
        let key = ed(6);
        let revoked = format!(
            "@revoked {}",
            format_entry("host", 22, "ssh-ed25519", &key, Some(&[5; 20]))
        );
        let plain = parse_ok("user", &line("host", &key));
        let same_file = [parse_ok("kh", &format!("{}{revoked}", line("host", &key)))];
        assert!(matches!(
            check(&same_file, "host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Revoked(f) if f.line == 2
        ));
        let two_files = [plain.clone(), parse_ok("global", &revoked)];
        assert!(matches!(
            check(&two_files, "host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Revoked(f) if f.file == "global"
        ));
        // Revoked for another host only: still known here.
        let elsewhere = format!(
            "@revoked {}",
            format_entry("other", 22, "ssh-ed25519", &key, Some(&[5; 20]))
        );
        let files = [plain, parse_ok("global", &elsewhere)];
        assert!(matches!(
            check(&files, "host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Known(f) if f.file == "user"
        ));
    }

    /// `check` with its shortcut answers as looking at every entry does, for
    /// files mixing plain, hashed, wildcard and revoked lines.
    #[test]
    fn check_answers_like_every_entry() {
        let mut rng = TestRng(99);
        let hosts = ["a", "b", "c.example", "d"];
        for round in 0..300 {
            let mut text = String::new();
            for _ in 0..(rng.next() % 8) {
                let host = hosts[rng.next() as usize % hosts.len()];
                let key = if rng.next().is_multiple_of(3) {
                    rsa(rng.next() as u8 % 3)
                } else {
                    ed(rng.next() as u8 % 3)
                };
                let key_type = blob_key_type(&key).unwrap_or_default().to_string();
                let hashed = rng.next().is_multiple_of(2);
                let salt = rng.salt();
                let mut entry = match rng.next() % 5 {
                    0 => format!("*.example,d {key_type} {}\n", b64(&key)),
                    _ => format_entry(host, 22, &key_type, &key, hashed.then_some(&salt)),
                };
                if rng.next().is_multiple_of(6) {
                    entry = format!("@revoked {entry}");
                }
                text.push_str(&entry);
            }
            let files = [parse_ok("kh", &text)];
            for host in hosts {
                for key in [ed(0), ed(1), ed(2), rsa(0), rsa(1)] {
                    let key_type = blob_key_type(&key).unwrap_or_default().to_string();
                    let fast = check(&files, host, 22, &key_type, &key);
                    let full = check_every_entry(&files, host, 22, &key_type, &key);
                    assert_eq!(
                        std::mem::discriminant(&fast),
                        std::mem::discriminant(&full),
                        "round {round}, {host}: {fast:?} vs {full:?}\n{text}"
                    );
                    if !matches!(fast, HostKeyStatus::Known(_)) {
                        assert_eq!(fast, full, "round {round}, {host}\n{text}");
                    }
                }
            }
        }
    }

    #[test]
    fn revoked_wins() {
        let key = ed(6);
        let text = format!(
            "{}@revoked * ssh-ed25519 {}\n",
            line("host", &key),
            b64(&key)
        );
        let files = [parse_ok("/etc/kh", &text)];
        let s = check(&files, "host", 22, "ssh-ed25519", &key);
        assert!(matches!(s, HostKeyStatus::Revoked(f) if f.line == 2));
        for policy in [
            StrictHostKeyChecking::Yes,
            StrictHostKeyChecking::AcceptNew,
            StrictHostKeyChecking::No,
            StrictHostKeyChecking::Ask,
        ] {
            match decide(&s, policy, "host", 22, "ssh-ed25519", &key) {
                Decision::Refuse(msg) => {
                    assert!(msg.contains("/etc/kh:2"), "{msg}");
                    assert!(msg.contains("REVOKED"), "{msg}");
                    assert!(msg.contains(&fingerprint_sha256(&key)), "{msg}");
                }
                d => panic!("{d:?}"),
            }
        }
        // A revoked entry for another key is not a host key for this host.
        let other = ed(7);
        assert_eq!(
            check(&files, "host", 22, "ssh-ed25519", &other),
            HostKeyStatus::Changed {
                old: vec![Found {
                    file: "/etc/kh",
                    line: 1,
                    entry: &files[0].entries[0]
                }]
            }
        );
        assert_eq!(
            revoked(&files, "anything", 22, &key).map(|f| f.line),
            Some(2)
        );
        assert_eq!(revoked(&files, "anything", 22, &other), None);
        // Revoked in a later (global) file still wins over Known in the first.
        let user = parse_ok("user", &line("host", &key));
        let global = parse_ok(
            "global",
            &format!("@revoked host ssh-ed25519 {}\n", b64(&key)),
        );
        let files = [user, global];
        assert!(matches!(
            check(&files, "host", 22, "ssh-ed25519", &key),
            HostKeyStatus::Revoked(f) if f.file == "global"
        ));
    }

    #[test]
    fn cert_authority_ignored_for_plain_keys() {
        let ca = ed(8);
        let text = format!("@cert-authority *.example.com ssh-ed25519 {}\n", b64(&ca));
        let files = [parse_ok("kh", &text)];
        assert_eq!(files[0].entries[0].marker, Some(Marker::CertAuthority));
        assert_eq!(
            check(&files, "a.example.com", 22, "ssh-ed25519", &ca),
            HostKeyStatus::Unknown
        );
        assert_eq!(
            check(&files, "a.example.com", 22, "ssh-ed25519", &ed(9)),
            HostKeyStatus::Unknown
        );
        let cas = cert_authorities(&files, "a.example.com", 22);
        assert_eq!(cas.len(), 1);
        assert_eq!(cas[0].entry.key_blob, ca);
        assert!(cert_authorities(&files, "a.example.org", 22).is_empty());
    }

    #[test]
    fn changed_key_message() {
        let old = ed(10);
        let new = ed(11);
        let text = format!("# hdr\n{}", line("server.example", &old));
        let files = [parse_ok("/home/u/.ssh/known_hosts", &text)];
        let s = check(&files, "server.example", 22, "ssh-ed25519", &new);
        let HostKeyStatus::Changed { old: olds } = &s else {
            panic!("{s:?}")
        };
        assert_eq!(olds.len(), 1);
        assert_eq!(olds[0].line, 2);
        for policy in [
            StrictHostKeyChecking::Yes,
            StrictHostKeyChecking::AcceptNew,
            StrictHostKeyChecking::Ask,
        ] {
            let Decision::Refuse(msg) =
                decide(&s, policy, "server.example", 22, "ssh-ed25519", &new)
            else {
                panic!("{policy:?} should refuse")
            };
            assert!(msg.contains("CHANGED"), "{msg}");
            assert!(msg.contains(&fingerprint_sha256(&new)), "{msg}");
            assert!(msg.contains(&fingerprint_sha256(&old)), "{msg}");
            assert!(msg.contains("/home/u/.ssh/known_hosts:2"), "{msg}");
            assert!(
                msg.contains("ssh-keygen -f '/home/u/.ssh/known_hosts' -R 'server.example'"),
                "{msg}"
            );
            assert!(msg.contains("verification failed"), "{msg}");
        }
        let Decision::AcceptWithWarning(msg) = decide(
            &s,
            StrictHostKeyChecking::No,
            "server.example",
            22,
            "ssh-ed25519",
            &new,
        ) else {
            panic!("No should accept with warning")
        };
        assert!(msg.contains(&fingerprint_sha256(&old)));
        assert!(msg.contains("NOT recorded"));

        // Non-default port: the removal command names [host]:port.
        let files = [parse_ok("kh", &line("[server.example]:2222", &old))];
        let s = check(&files, "server.example", 2222, "ssh-ed25519", &new);
        let Decision::Refuse(msg) = decide(
            &s,
            StrictHostKeyChecking::Yes,
            "server.example",
            2222,
            "ssh-ed25519",
            &new,
        ) else {
            panic!()
        };
        assert!(msg.contains("-R '[server.example]:2222'"), "{msg}");
    }

    #[test]
    fn rsa_signature_names_are_same_family() {
        let old = rsa(1);
        let new = rsa(2);
        let files = [parse_ok("kh", &line("h", &old))];
        assert!(matches!(
            check(&files, "h", 22, "rsa-sha2-256", &new),
            HostKeyStatus::Changed { .. }
        ));
        assert_eq!(key_family("rsa-sha2-512-cert-v01@openssh.com"), "ssh-rsa");
        assert_eq!(
            key_family("sk-ssh-ed25519-cert-v01@openssh.com"),
            "sk-ssh-ed25519@openssh.com"
        );
        assert_ne!(
            key_family("ecdsa-sha2-nistp256"),
            key_family("ecdsa-sha2-nistp384")
        );
        assert_eq!(key_type_label("ecdsa-sha2-nistp384"), "ECDSA");
    }

    #[test]
    fn other_types_known() {
        let r = rsa(3);
        let e = ed(12);
        let files = [parse_ok("kh", &line("h", &r))];
        let s = check(&files, "h", 22, "ssh-ed25519", &e);
        let HostKeyStatus::OtherTypesKnown(others) = &s else {
            panic!("{s:?}")
        };
        assert_eq!(others[0].line, 1);
        // As OpenSSH: a recorded key of another type is a changed key, so
        // only `no` goes on (and records nothing).
        for policy in [
            StrictHostKeyChecking::AcceptNew,
            StrictHostKeyChecking::Ask,
            StrictHostKeyChecking::Yes,
        ] {
            let Decision::Refuse(msg) = decide(&s, policy, "h", 22, "ssh-ed25519", &e) else {
                panic!("{policy:?}")
            };
            assert!(msg.contains("HAS CHANGED"), "{msg}");
            assert!(msg.contains("keys of other types"), "{msg}");
            assert!(msg.contains(&fingerprint_sha256(&e)), "{msg}");
            assert!(msg.contains("kh:1"), "{msg}");
            assert!(msg.contains("ssh-keygen -f 'kh' -R 'h'"), "{msg}");
        }
        let Decision::AcceptWithWarning(msg) =
            decide(&s, StrictHostKeyChecking::No, "h", 22, "ssh-ed25519", &e)
        else {
            panic!()
        };
        assert!(msg.contains("NOT recorded"), "{msg}");
    }

    #[test]
    fn unknown_decisions() {
        let key = ed(13);
        let s = HostKeyStatus::Unknown;
        let d = |p| decide(&s, p, "new.host", 2222, "ssh-ed25519", &key);
        assert_eq!(
            d(StrictHostKeyChecking::AcceptNew),
            Decision::AcceptAndRecord
        );
        assert_eq!(d(StrictHostKeyChecking::No), Decision::AcceptAndRecord);
        assert_eq!(d(StrictHostKeyChecking::Ask), Decision::AskUser);
        let Decision::Refuse(msg) = d(StrictHostKeyChecking::Yes) else {
            panic!()
        };
        assert!(msg.contains("[new.host]:2222"), "{msg}");
        assert!(msg.contains(&fingerprint_sha256(&key)), "{msg}");
        assert!(msg.contains("accept-new"), "{msg}");
        let prompt = ask_prompt("new.host", 2222, "ssh-ed25519", &key);
        assert!(prompt.starts_with("The authenticity of host '[new.host]:2222'"));
        assert!(prompt.contains("ED25519 key fingerprint is"));
        assert_eq!(ask_answer(" yes\n", &key), Some(true));
        assert_eq!(ask_answer("NO", &key), Some(false));
        assert_eq!(ask_answer(&fingerprint_sha256(&key), &key), Some(true));
        assert_eq!(ask_answer("SHA256:nope", &key), None);
        assert_eq!(ask_answer("y", &key), None);

        let files = [parse_ok("kh", &line("new.host", &key))];
        let s = check(&files, "new.host", 22, "ssh-ed25519", &key);
        for p in [
            StrictHostKeyChecking::Yes,
            StrictHostKeyChecking::AcceptNew,
            StrictHostKeyChecking::No,
            StrictHostKeyChecking::Ask,
        ] {
            assert_eq!(
                decide(&s, p, "new.host", 22, "ssh-ed25519", &key),
                Decision::Accept
            );
        }
    }

    #[test]
    fn strict_policy_values() {
        use StrictHostKeyChecking as P;
        assert_eq!(P::from_config_value("yes"), Some(P::Yes));
        assert_eq!(P::from_config_value("True"), Some(P::Yes));
        assert_eq!(P::from_config_value("off"), Some(P::No));
        assert_eq!(P::from_config_value("no"), Some(P::No));
        assert_eq!(P::from_config_value("accept-new"), Some(P::AcceptNew));
        assert_eq!(P::from_config_value("ask"), Some(P::Ask));
        assert_eq!(P::from_config_value("maybe"), None);
        assert_eq!(P::default(), P::Ask);
    }

    #[test]
    fn multiple_files_in_order() {
        let k1 = ed(20);
        let k2 = ed(21);
        let user = parse_ok("user", &line("h", &k1));
        let global = parse_ok("global", &format!("# g\n{}", line("h", &k2)));
        let files = [user, global];
        assert!(matches!(
            check(&files, "h", 22, "ssh-ed25519", &k1),
            HostKeyStatus::Known(f) if f.file == "user" && f.line == 1
        ));
        assert!(matches!(
            check(&files, "h", 22, "ssh-ed25519", &k2),
            HostKeyStatus::Known(f) if f.file == "global" && f.line == 2
        ));
        let s = check(&files, "h", 22, "ssh-ed25519", &ed(22));
        let HostKeyStatus::Changed { old } = s else {
            panic!()
        };
        let locs: Vec<String> = old.iter().map(|f| f.to_string()).collect();
        assert_eq!(locs, ["user:1", "global:2"]);
        // The same key recorded twice: the first occurrence is reported.
        let files = [
            parse_ok("a", &line("h", &k1)),
            parse_ok("b", &line("h", &k1)),
        ];
        assert!(matches!(
            check(&files, "h", 22, "ssh-ed25519", &k1),
            HostKeyStatus::Known(f) if f.file == "a"
        ));
        assert_eq!(lookup(&files, "h", 22).len(), 2);
        assert_eq!(
            check::<KnownHostsFile>(&[], "h", 22, "ssh-ed25519", &k1),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn malformed_lines_warn_and_continue() {
        let key = ed(30);
        let k = b64(&key);
        let text = [
            format!("good1 ssh-ed25519 {k}"),               // 1
            "bad1 ssh-ed25519 !!!notbase64!!!".to_string(), // 2
            format!("bad2 ssh-rsa {k}"),                    // 3 type mismatch
            "bad3".to_string(),                             // 4 missing key type
            "bad4 ssh-ed25519".to_string(),                 // 5 missing key
            format!("|1|notvalid|x= ssh-ed25519 {k}"),      // 6 bad hash
            format!("|2|AAAA|AAAA ssh-ed25519 {k}"),        // 7 unknown hash type
            format!("@bogus h ssh-ed25519 {k}"),            // 8 unknown marker
            "@revoked".to_string(),                         // 9 marker only
            format!("bad5 ssh-ed25519 {}", b64(b"\0\0\0")), // 10 blob too short
            format!("|1|{}|{} ssh-ed25519 {k}", b64(&[1; 19]), b64(&[2; 20])), // 11 short salt
            format!("good2 ssh-ed25519 {k}"),               // 12
        ]
        .join("\n");
        let (f, warnings) = parse("kh", &text);
        let lines: Vec<usize> = warnings.iter().map(|w| w.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8, 9, 10, 11], "{warnings:#?}");
        assert!(warnings.iter().all(|w| w.file == "kh"));
        assert!(warnings[0].message.contains("base64"));
        assert!(warnings[1].message.contains("mismatch"));
        assert!(warnings[1].to_string().starts_with("kh:3: "));
        assert!(warnings[2].message.contains("key type"));
        assert!(warnings[3].message.contains("missing key"));
        assert!(warnings[4].message.contains("hashed"));
        assert!(warnings[6].message.contains("@bogus"));
        assert_eq!(f.entries.len(), 2);
        assert_eq!(f.entries[0].line, 1);
        assert_eq!(f.entries[1].line, 12);
        let files = [f];
        assert!(matches!(
            check(&files, "good2", 22, "ssh-ed25519", &key),
            HostKeyStatus::Known(f) if f.line == 12
        ));
        assert_eq!(
            check(&files, "bad2", 22, "ssh-ed25519", &key),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn crlf_and_whitespace() {
        let key = ed(31);
        let text = format!(
            "\u{feff}# c\r\n\r\n  host1\tssh-ed25519   {}  c1\r\n@revoked\thost2 ssh-ed25519 {}\r\n",
            b64(&key),
            b64(&key)
        );
        let f = parse_ok("kh", &text);
        assert_eq!(f.entries.len(), 2);
        assert_eq!(f.entries[0].line, 3);
        assert_eq!(f.entries[0].comment.as_deref(), Some("c1"));
        assert_eq!(f.entries[1].comment, None);
        assert_eq!(f.entries[1].marker, Some(Marker::Revoked));
        let files = [f];
        assert!(matches!(
            check(&files, "host1", 22, "ssh-ed25519", &key),
            HostKeyStatus::Known(_)
        ));
        assert!(matches!(
            check(&files, "host2", 22, "ssh-ed25519", &key),
            HostKeyStatus::Revoked(f) if f.line == 4
        ));
    }

    #[test]
    fn unpadded_base64_key_accepted() {
        let key = ed(32);
        let unpadded = STANDARD_NO_PAD.encode(&key);
        let f = parse_ok("kh", &format!("h ssh-ed25519 {unpadded}\n"));
        assert_eq!(f.entries[0].key_blob, key);
    }

    #[test]
    fn large_file_uses_index() {
        let mut text = String::new();
        for i in 0..10_000u32 {
            let mut payload = [0u8; 32];
            payload[..4].copy_from_slice(&i.to_be_bytes());
            let key = blob("ssh-ed25519", &payload);
            text.push_str(&line(
                &format!("host{i}.example.com,10.{}.{}.1", i / 256, i % 256),
                &key,
            ));
        }
        text.push_str(&line("*.wild.example", &ed(1)));
        let f = parse_ok("big", &text);
        assert_eq!(f.entries.len(), 10_001);
        // Literal names are all in the hash map, only the wildcard line is scanned.
        assert_eq!(f.index.exact.len(), 20_000);
        assert_eq!(f.index.scan, [10_000]);
        assert!(f.index.hashed.is_empty());
        assert_eq!(f.index.exact["host5000.example.com"], [5000]);
        assert_eq!(f.index.lookup("host5000.example.com"), [5000]);

        let mut payload = [0u8; 32];
        payload[..4].copy_from_slice(&5000u32.to_be_bytes());
        let key = blob("ssh-ed25519", &payload);
        let files = [f];
        let start = std::time::Instant::now();
        for _ in 0..1000 {
            assert!(matches!(
                check(&files, "HOST5000.example.com", 22, "ssh-ed25519", &key),
                HostKeyStatus::Known(f) if f.line == 5001
            ));
        }
        // 1000 indexed lookups are far below a second even in debug builds;
        // 1000 linear scans of 10k entries would not be.
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        assert!(matches!(
            check(&files, "10.19.136.1", 22, "ssh-ed25519", &key),
            HostKeyStatus::Known(f) if f.line == 5001
        ));
    }

    #[test]
    fn hashed_lines_sharing_a_salt() {
        let salt = [3u8; 20];
        let text = format!(
            "{}{}{}",
            format_entry("a", 22, "ssh-ed25519", &ed(1), Some(&salt)),
            format_entry("b", 22, "ssh-ed25519", &ed(2), Some(&salt)),
            format_entry("c", 22, "ssh-ed25519", &ed(3), Some(&[4u8; 20])),
        );
        let f = parse_ok("kh", &text);
        assert_eq!(f.index.hashed.len(), 3);
        assert_eq!(f.index.lookup("a"), [0]);
        assert_eq!(f.index.lookup("b"), [1]);
        assert_eq!(f.index.lookup("c"), [2]);
        assert!(f.index.lookup("d").is_empty());
    }

    /// Deterministic pseudo-random bytes for the tests below and those of
    /// `hashed_lines`.
    pub(super) struct TestRng(pub(super) u64);

    impl TestRng {
        pub(super) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        pub(super) fn salt(&mut self) -> [u8; 20] {
            let mut s = [0u8; 20];
            for b in &mut s {
                *b = self.next() as u8;
            }
            s
        }
    }

    /// Matching entries found by testing every entry on its own: no index,
    /// no memo.
    fn brute_force(f: &KnownHostsFile, name: &str) -> Vec<usize> {
        let name = name.to_ascii_lowercase();
        f.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.hosts.matches(&name))
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn memoized_hashed_lookups_match_unmemoized() {
        let mut rng = TestRng(0x9e37_79b9_7f4a_7c15);
        let mut text = String::new();
        let names: Vec<String> = (0..60)
            .map(|i| match i % 3 {
                0 => format!("h{i}.example"),
                1 => format!("[h{i}.example]:2222"),
                _ => format!("10.0.{i}.1"),
            })
            .collect();
        for (i, name) in names.iter().enumerate() {
            let salt = rng.salt();
            // Some names twice (two keys), one pair of lines sharing a salt.
            let shared = [7u8; 20];
            let salt = if i < 2 { &shared } else { &salt };
            text.push_str(&format!(
                "{} ssh-ed25519 {}\n",
                hash_name(name, salt),
                b64(&ed(i as u8))
            ));
            if i % 5 == 0 {
                text.push_str(&format!(
                    "{} ssh-rsa {}\n",
                    hash_name(name, &rng.salt()),
                    b64(&rsa(i as u8))
                ));
            }
        }
        text.push_str(&line("plain.example,h3.example", &ed(200)));
        text.push_str(&line("*.example", &ed(201)));
        let f = parse_ok("kh", &text);
        let mut probes: Vec<String> = names.clone();
        probes.extend((0..40).map(|i| format!("other{}.example", rng.next() % 1000 + i)));
        probes.push("H3.EXAMPLE".into());
        probes.push("plain.example".into());
        for round in 0..2 {
            for name in &probes {
                let lower = name.to_ascii_lowercase();
                let expected = brute_force(&f, name);
                assert_eq!(f.index.lookup(&lower), expected, "{name} round {round}");
                let memoized = f
                    .index
                    .memo
                    .get(&lower, f.index.hashed.end())
                    .expect("remembered");
                assert_eq!(memoized, f.index.scan_hashed(&lower), "{name}");
            }
        }
        let distinct: std::collections::HashSet<String> =
            probes.iter().map(|p| p.to_ascii_lowercase()).collect();
        assert_eq!(f.index.memo.map().len(), distinct.len());
        // Two hashed lines and *.example.
        assert_eq!(f.matching("h0.example").len(), 3);
        // A clone answers the same, memo included.
        let g = f.clone();
        assert_eq!(g.index.memo.map().len(), f.index.memo.map().len());
        assert_eq!(g.matching("[h1.example]:2222")[0].line, 3);
    }

    #[test]
    fn extend_continues_line_numbers() {
        let k = ed(50);
        // File ending without a newline: the caller adds one before its line.
        let mut f = parse_ok("kh", &format!("# c\n{}", line("a", &k).trim_end()));
        assert_eq!(f.entries[0].line, 2);
        let w = f.extend(&format!("\n{}", line("b", &k)), Some("b"));
        assert!(w.is_empty());
        assert_eq!(f.matching("b")[0].line, 3);
        let w = f.extend(&format!("{}bad line\n", line("c", &k)), None);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].line, 5);
        assert_eq!(w[0].file, "kh");
        assert_eq!(f.matching("c")[0].line, 4);
        // Same as parsing everything at once.
        let whole = format!(
            "# c\n{}\n{}{}bad line\n",
            line("a", &k).trim_end(),
            line("b", &k),
            line("c", &k)
        );
        let (g, _) = parse("kh", &whole);
        assert_eq!(f.entries, g.entries);
        // An empty file and from_entries.
        let mut e = KnownHostsFile::new("e");
        e.extend(&line("x", &k), None);
        assert_eq!(e.matching("x")[0].line, 1);
        let mut h = KnownHostsFile::from_entries("h", g.entries.clone());
        h.extend(&line("y", &k), None);
        assert_eq!(h.matching("y")[0].line, 5);
    }

    /// A file of `lines` entries for a few hosts, most of them hashed, with
    /// an occasional `@revoked` or `@cert-authority` line.
    fn mixed_hashed_file(rng: &mut TestRng, hosts: &[&str], lines: usize) -> String {
        let mut text = String::new();
        for _ in 0..lines {
            let host = hosts[rng.next() as usize % hosts.len()];
            let key = if rng.next().is_multiple_of(4) {
                rsa(rng.next() as u8 % 3)
            } else {
                ed(rng.next() as u8 % 4)
            };
            let key_type = blob_key_type(&key).unwrap_or_default().to_string();
            let salt = rng.salt();
            let hashed = !rng.next().is_multiple_of(5);
            let entry = format_entry(host, 22, &key_type, &key, hashed.then_some(&salt));
            text.push_str(&match rng.next() % 12 {
                0 => format!("@revoked {entry}"),
                1 => format!("@cert-authority {entry}"),
                _ => entry,
            });
        }
        text
    }

    /// Lookups that stop at the first hashed line that settles them, and
    /// later lookups that go on from there, in any order and across files
    /// of several blocks, answer as if every entry had been looked at.
    #[test]
    fn scans_stopped_early_and_resumed_answer_like_full_ones() {
        let mut rng = TestRng(0xfeed_5eed);
        let hosts = ["a", "b", "c.example", "d", "e"];
        let keys = [ed(0), ed(1), ed(2), ed(3), rsa(0), rsa(1)];
        for round in 0..40 {
            let sizes = [rng.next() as usize % 90, rng.next() as usize % 40];
            let texts = sizes.map(|n| mixed_hashed_file(&mut rng, &hosts, n));
            let files = [parse_ok("one", &texts[0]), parse_ok("two", &texts[1])];
            for _ in 0..30 {
                let host = hosts[rng.next() as usize % hosts.len()];
                // Fresh copies have an empty memo: they scan everything.
                let fresh = [parse_ok("one", &texts[0]), parse_ok("two", &texts[1])];
                match rng.next() % 4 {
                    0 => {
                        let key = &keys[rng.next() as usize % keys.len()];
                        let key_type = blob_key_type(key).unwrap_or_default().to_string();
                        let fast = check(&files, host, 22, &key_type, key);
                        let full = check_every_entry(&fresh, host, 22, &key_type, key);
                        match (&fast, &full) {
                            (HostKeyStatus::Known(a), HostKeyStatus::Known(b)) => {
                                assert_eq!(a.entry.key_blob, b.entry.key_blob)
                            }
                            _ => assert_eq!(fast, full, "round {round}, {host}"),
                        }
                    }
                    1 => {
                        let got = first_hashed(&files, host, 22, |e| e.marker.is_none());
                        let want = lookup(&fresh, host, 22).into_iter().find(|f| {
                            f.entry.marker.is_none()
                                && matches!(f.entry.hosts, HostField::Hashed { .. })
                        });
                        assert_eq!(
                            got.map(|f| (f.file, f.line)),
                            want.map(|f| (f.file, f.line))
                        );
                    }
                    2 => {
                        let got: Vec<usize> =
                            lookup(&files, host, 22).iter().map(|f| f.line).collect();
                        let want: Vec<usize> =
                            lookup(&fresh, host, 22).iter().map(|f| f.line).collect();
                        assert_eq!(got, want, "round {round}, {host}");
                    }
                    _ => {
                        for (f, g) in files.iter().zip(&fresh) {
                            let name = host_port_name(host, 22);
                            let memo = f.index.memo.scan(&name);
                            let full = g.index.scan_hashed(&name);
                            // What the memo holds is a prefix of the full answer.
                            assert_eq!(memo.hits[..], full[..memo.hits.len()], "{host}");
                            if memo.next >= f.index.hashed.end() {
                                assert_eq!(memo.hits, full);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A known key on a hashed line is found without hashing the name with
    /// the salts of the lines after it; a key that is not known still takes
    /// every line into account.
    #[test]
    fn a_known_hashed_key_stops_the_scan() {
        let mut rng = TestRng(5);
        let mut text = String::new();
        for i in 0..200u32 {
            let name = if i == 37 {
                "target".to_string()
            } else {
                format!("other{i}")
            };
            let key = if i == 37 { ed(1) } else { ed(2) };
            text.push_str(&format_entry(
                &name,
                22,
                "ssh-ed25519",
                &key,
                Some(&rng.salt()),
            ));
        }
        text.push_str(&format_entry(
            "target",
            22,
            "ssh-rsa",
            &rsa(1),
            Some(&rng.salt()),
        ));
        let files = [parse_ok("kh", &text)];
        let end = files[0].index.hashed.end();
        assert!(matches!(
            check(&files, "target", 22, "ssh-ed25519", &ed(1)),
            HostKeyStatus::Known(f) if f.line == 38
        ));
        let after_known = files[0].index.memo.scan("target");
        assert_eq!(after_known.hits, vec![37]);
        assert_eq!(after_known.next, 37 / 16 + 1);
        assert!(after_known.next < end);
        // The first line's type orders the key exchange, from the same scan.
        let first = first_hashed(&files, "target", 22, |e| e.marker.is_none());
        assert_eq!(first.map(|f| f.line), Some(38));
        assert_eq!(files[0].index.memo.scan("target"), after_known);
        // Another ed25519 key: changed, found by going on to the end.
        assert!(matches!(
            check(&files, "target", 22, "ssh-ed25519", &ed(3)),
            HostKeyStatus::Changed { old } if old.len() == 1 && old[0].line == 38
        ));
        let done = files[0].index.memo.scan("target");
        assert_eq!((done.hits, done.next), (vec![37, 200], end));
    }

    /// Lines appended after a scan stopped part way are found when it goes
    /// on, and lines appended after a complete scan are added to it.
    #[test]
    fn extend_after_a_stopped_scan() {
        let mut rng = TestRng(11);
        let mut text = String::new();
        // 40 lines: the third block is half full when more are appended.
        for i in 0..40u32 {
            let name = if i == 3 { "early" } else { "filler" };
            text.push_str(&format_entry(
                name,
                22,
                "ssh-ed25519",
                &ed(i as u8),
                Some(&rng.salt()),
            ));
        }
        let (mut f, _) = parse("kh", &text);
        let files = std::slice::from_ref(&f);
        assert!(first_hashed(files, "early", 22, |_| true).is_some());
        assert_eq!(f.index.memo.scan("early").next, 1);
        assert!(lookup(files, "late", 22).is_empty());
        for (name, key) in [("early", 50), ("late", 51)] {
            let salt = rng.salt();
            f.extend(
                &format_entry(name, 22, "ssh-ed25519", &ed(key), Some(&salt)),
                Some(name),
            );
        }
        for name in ["early", "late", "filler"] {
            assert_eq!(f.index.lookup(name), brute_force(&f, name), "{name}");
        }
        assert_eq!(f.index.memo.scan("late").hits, vec![41]);
        assert_eq!(f.index.memo.scan("early").hits, vec![3, 40]);
    }

    #[test]
    fn extend_updates_memo() {
        let mut rng = TestRng(42);
        let mut text = String::new();
        for i in 0..50 {
            let salt = if i == 0 { [1; 20] } else { rng.salt() };
            text.push_str(&format_entry(
                &format!("old{i}"),
                22,
                "ssh-ed25519",
                &ed(i),
                Some(&salt),
            ));
        }
        let mut f = parse_ok("kh", &text);
        let names = [
            "new1",
            "new2",
            "[new3]:2200",
            "new4",
            "new6",
            "old7",
            "nobody",
        ];
        for n in names {
            f.matching(n);
        }
        // Hint right, hint wrong, no hint, and a plain line.
        f.extend(
            &format_entry("new1", 22, "ssh-ed25519", &ed(101), Some(&rng.salt())),
            Some("NEW1"),
        );
        f.extend(
            &format_entry("new2", 22, "ssh-ed25519", &ed(102), Some(&rng.salt())),
            Some("new1"),
        );
        f.extend(
            &format!(
                "{}{}",
                format_entry("new3", 2200, "ssh-ed25519", &ed(103), Some(&rng.salt())),
                format_entry("old7", 22, "ssh-rsa", &rsa(7), Some(&rng.salt())),
            ),
            None,
        );
        f.extend(
            &format_entry("new4", 22, "ssh-ed25519", &ed(104), None),
            None,
        );
        // A salt some older line already uses.
        f.extend(
            &format_entry("new6", 22, "ssh-ed25519", &ed(106), Some(&[1; 20])),
            Some("new6"),
        );
        for n in names.iter().chain(&["new5", "old8", "old0"]) {
            let lower = n.to_ascii_lowercase();
            assert_eq!(f.index.lookup(&lower), brute_force(&f, n), "{n}");
            assert_eq!(
                f.index.memo.get(&lower, f.index.hashed.end()),
                Some(f.index.scan_hashed(&lower)),
                "{n}"
            );
        }
        assert_eq!(f.matching("new1")[0].line, 51);
        assert_eq!(f.matching("new2")[0].line, 52);
        assert_eq!(f.matching("[new3]:2200")[0].line, 53);
        let old7: Vec<usize> = f.matching("old7").iter().map(|e| e.line).collect();
        assert_eq!(old7, [8, 54]);
        assert_eq!(f.matching("new4")[0].line, 55);
        assert_eq!(f.matching("new6")[0].line, 56);
        assert!(f.matching("nobody").is_empty());
        let files = [&f];
        assert!(matches!(
            check(&files, "new2", 22, "ssh-ed25519", &ed(102)),
            HostKeyStatus::Known(found) if found.line == 52
        ));
    }

    #[test]
    fn from_entries_rebuilds_index() {
        let key = ed(40);
        let f = parse_ok("kh", &line("h", &key));
        let mut entries = f.entries.clone();
        entries[0].hosts = HostField::Patterns(vec!["g".into()]);
        let g = KnownHostsFile::from_entries("kh", entries);
        assert_eq!(g.matching("g").len(), 1);
        assert!(g.matching("h").is_empty());
        assert!(KnownHostsFile::new("x").matching("h").is_empty());
    }

    #[test]
    fn rsa_modulus_sizes() {
        let blob = |n: &[u8]| {
            let mut b = Vec::new();
            for field in [&b"ssh-rsa"[..], &[1, 0, 1], n] {
                b.extend_from_slice(&(field.len() as u32).to_be_bytes());
                b.extend_from_slice(field);
            }
            b
        };
        // A leading zero byte keeps a modulus with its top bit set positive.
        let mut n2048 = vec![0u8];
        n2048.extend(std::iter::repeat_n(0xffu8, 256));
        assert_eq!(rsa_modulus_bits(&blob(&n2048)), Some(2048));
        assert_eq!(rsa_modulus_bits(&blob(&[0x01, 0xff])), Some(9));
        assert_eq!(rsa_modulus_bits(&blob(&[0, 0])), None);
        assert_eq!(rsa_modulus_bits(&crate::test_keys::ed25519_blob(7)), None);
        let mut truncated = blob(&n2048);
        truncated.truncate(40);
        assert_eq!(rsa_modulus_bits(&truncated), None);
    }

    #[test]
    fn blob_key_type_edge_cases() {
        assert_eq!(blob_key_type(b""), None);
        assert_eq!(blob_key_type(b"\0\0\0"), None);
        assert_eq!(blob_key_type(b"\xff\xff\xff\xffabc"), None);
        assert_eq!(blob_key_type(b"\0\0\0\x02ab"), Some("ab"));
        assert_eq!(blob_key_type(b"\0\0\0\x02\xff\xfe"), None);
    }
}
