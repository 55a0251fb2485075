//! Node sets: the compact host lists that `skiff run` fans a command out to,
//! and the folding of host names back into such lists for its output.
//!
//! A node set is a comma-separated list of elements. Each element is one of:
//!
//! | element | meaning |
//! | --- | --- |
//! | `web1` | one host |
//! | `web[01-20]` | a numeric range; a leading zero on the start pads every number to its width |
//! | `web[1-20/2]` | a range with a step (here 1, 3, ..., 19) |
//! | `web[1-3,7,10-12]` | several ranges and numbers in one pair of brackets |
//! | `rack[1-4]-node[001-128]` | several bracketed fields: every combination |
//! | `127.0.[1-2].[1-250]` | IPv4 octets are ordinary numeric fields |
//! | `root@db[1-3]:2222` | a user and/or a port for every host of the element |
//! | `[fe80::1]:2222`, `[::1]`, `::1` | an IPv6 literal (a bracket holding a `:`), with a port only in the bracketed form |
//! | `@group` | the node set a group is defined as (groups may use other groups) |
//!
//! Everything is pure: group definitions come in through a callback, files come
//! in as text. Errors keep the text and the byte offset of the offending
//! character so they can be shown with a caret under it.
//!
//! # Canonical order
//!
//! [`parse`] returns de-duplicated targets sorted the way [`fold`] lists them:
//! first by the host name's *shape* (the name with every run of digits replaced
//! by a placeholder, compared as text; IPv6 literals come after all names),
//! then by user (none first), then by port (none first), then by the numbers in
//! the name compared as numbers from left to right, and last by how many digits
//! each number was written with (`web1` before `web01`). So `web9` comes before
//! `web10`, and `10.0.0.2` before `10.0.0.10`.
//!
//! # Host identity and exclusion
//!
//! Two targets are the same when user, host and port are all equal as written
//! (`web1` and `WEB1` differ; `web1` and `web01` differ; `web1` and
//! `root@web1` differ). IPv6 addresses are normalised (`[0::1]` is `::1`).
//!
//! [`exclude`] removes a target when an exclusion names the same host and the
//! exclusion's user and port, where it gives them, match: `-x web3` removes
//! `web3`, `root@web3` and `web3:2222`; `-x root@web3` removes only targets for
//! user `root` on `web3` (any port); `-x web3:2222` removes only port 2222.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::Ipv6Addr;

/// The most targets a node set may expand to. Larger sets fail with
/// [`ErrorKind::TooManyTargets`] before anything big is allocated.
pub const MAX_TARGETS: usize = 1_000_000;

/// How deep groups may reference other groups.
pub const MAX_GROUP_DEPTH: usize = 32;

/// The most digits a number in brackets may have. Runs of more digits in a
/// host name are kept as plain text when folding.
pub const MAX_DIGITS: usize = 18;

/// One host to run on, with the user and port given in the node set (if any).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// `user@` prefix, if given.
    pub user: Option<String>,
    /// Host name, IPv4 address or IPv6 address (without brackets).
    pub host: String,
    /// `:port` suffix, if given.
    pub port: Option<u16>,
}

impl Target {
    /// A target with neither user nor port.
    pub fn new(host: impl Into<String>) -> Self {
        Target {
            user: None,
            host: host.into(),
            port: None,
        }
    }

    /// True when the host is an IPv6 address.
    pub fn is_ipv6(&self) -> bool {
        self.host.contains(':')
    }

    /// True when `exclusion` removes this target: same host, and the
    /// exclusion's user and port, where given, are equal to this target's.
    pub fn is_excluded_by(&self, exclusion: &Target) -> bool {
        self.host == exclusion.host
            && exclusion
                .user
                .as_ref()
                .is_none_or(|u| self.user.as_ref() == Some(u))
            && exclusion.port.is_none_or(|p| self.port == Some(p))
    }

    fn sort_key(&self) -> SortKey {
        let (texts, nums) = split_host(&self.host);
        SortKey {
            ipv6: self.is_ipv6(),
            texts,
            user: self.user.clone(),
            port: self.port,
            values: nums.iter().map(|n| n.0).collect(),
            widths: nums.iter().map(|n| n.1).collect(),
        }
    }
}

/// Writes `user@host:port`, bracketing an IPv6 host when a port follows.
fn write_target(
    out: &mut impl fmt::Write,
    user: Option<&str>,
    host: &str,
    port: Option<u16>,
) -> fmt::Result {
    if let Some(user) = user {
        write!(out, "{user}@")?;
    }
    match port {
        Some(port) if host.contains(':') => write!(out, "[{host}]:{port}"),
        Some(port) => write!(out, "{host}:{port}"),
        None => out.write_str(host),
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_target(f, self.user.as_deref(), &self.host, self.port)
    }
}

/// The canonical order described in the module documentation.
impl Ord for Target {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

impl PartialOrd for Target {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A number found in a host name: its value and how many digits it was written with.
type Num = (u64, u8);

/// Sort key of a target; it determines the target exactly, so it agrees with `Eq`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SortKey {
    ipv6: bool,
    texts: Vec<String>,
    user: Option<String>,
    port: Option<u16>,
    values: Vec<u64>,
    widths: Vec<u8>,
}

/// Splits a host name into the text between its numbers and the numbers
/// (`rack1-node02` → `["rack", "-node", ""]`, `[(1, 1), (2, 2)]`). IPv6
/// addresses and digit runs longer than [`MAX_DIGITS`] stay text.
fn split_host(host: &str) -> (Vec<String>, Vec<Num>) {
    if host.contains(':') {
        return (vec![host.to_owned()], Vec::new());
    }
    let bytes = host.as_bytes();
    let mut texts = Vec::new();
    let mut nums = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let digit = bytes[i].is_ascii_digit();
        let j = bytes[i..]
            .iter()
            .position(|b| b.is_ascii_digit() != digit)
            .map_or(bytes.len(), |n| i + n);
        let run = &host[i..j];
        if digit && run.len() <= MAX_DIGITS {
            let value = run.bytes().fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
            nums.push((value, run.len() as u8));
            texts.push(std::mem::take(&mut text));
        } else {
            text.push_str(run);
        }
        i = j;
    }
    texts.push(text);
    (texts, nums)
}

/// Sorts targets into the canonical order and removes duplicates.
pub fn sort_canonical(targets: &mut Vec<Target>) {
    // The same order as `SortKey`, but with each distinct (shape, user) pair
    // ranked once up front, so that sorting compares small keys.
    let split: Vec<(Vec<String>, Vec<Num>)> = targets.iter().map(|t| split_host(&t.host)).collect();
    let mut ranks: BTreeMap<(bool, &[String], Option<&str>), u32> = BTreeMap::new();
    for (t, (texts, _)) in targets.iter().zip(&split) {
        ranks.insert((t.is_ipv6(), texts, t.user.as_deref()), 0);
    }
    for (rank, value) in ranks.values_mut().enumerate() {
        *value = rank as u32;
    }
    // (shape and user rank, port, numbers, digit counts)
    type Key = (u32, Option<u16>, Vec<u64>, Vec<u8>);
    let keys: Vec<Key> = targets
        .iter()
        .zip(&split)
        .map(|(t, (texts, nums))| {
            let rank = ranks[&(t.is_ipv6(), texts.as_slice(), t.user.as_deref())];
            let values = nums.iter().map(|n| n.0).collect();
            (rank, t.port, values, nums.iter().map(|n| n.1).collect())
        })
        .collect();
    drop(ranks);
    let mut keyed: Vec<_> = keys.into_iter().zip(targets.drain(..)).collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    targets.extend(keyed.into_iter().map(|(_, t)| t));
    targets.dedup();
}

/// Removes every target that one of `excluded` matches (see
/// [`Target::is_excluded_by`]). The result may be empty; the caller decides
/// whether that is an error.
pub fn exclude(mut targets: Vec<Target>, excluded: &[Target]) -> Vec<Target> {
    let mut by_host: HashMap<&str, Vec<&Target>> = HashMap::new();
    for x in excluded {
        by_host.entry(x.host.as_str()).or_default().push(x);
    }
    targets.retain(|t| {
        !by_host
            .get(t.host.as_str())
            .is_some_and(|xs| xs.iter().any(|x| t.is_excluded_by(x)))
    });
    targets
}

// ---------------------------------------------------------------------------
// Errors

/// What is wrong with a node set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    #[error("the node set is empty")]
    Empty,
    #[error("empty element (a comma at the start or end, or two in a row)")]
    EmptyElement,
    #[error("expected a host name")]
    ExpectedHost,
    #[error("expected a group name after '@'")]
    ExpectedGroupName,
    #[error("{}", char_message(.0, "a host name"))]
    InvalidChar(char),
    #[error("{}", char_message(.0, "a user name"))]
    InvalidUserChar(char),
    #[error("{}", char_message(.0, "a group name"))]
    InvalidGroupChar(char),
    #[error("{}", char_message(.0, "a port number"))]
    InvalidPortChar(char),
    #[error("a name cannot start with '-'")]
    LeadingDash,
    #[error("a group reference cannot take a user name or a port")]
    GroupWithUserOrPort,
    #[error("'[' is never closed")]
    UnclosedBracket,
    #[error("']' without a matching '['")]
    UnmatchedBracket,
    #[error("brackets cannot be nested")]
    NestedBracket,
    #[error("expected a number after '{0}'")]
    ExpectedNumber(char),
    #[error("expected ',' or ']' in a range, found '{}'", .0.escape_debug())]
    ExpectedCommaOrClose(char),
    #[error("a number in brackets may have at most {MAX_DIGITS} digits")]
    NumberTooLong,
    #[error("the end of the range is zero-padded to a different width than its start")]
    PaddingMismatch,
    #[error("reversed range {0}-{1} (write the smaller number first)")]
    ReversedRange(u64, u64),
    #[error("a step must be at least 1")]
    ZeroStep,
    #[error("a step needs a range, as in [1-9/2]")]
    StepWithoutRange,
    #[error("an IPv6 address in brackets must be the whole host, as in [fe80::1]:22")]
    Ipv6NotWholeHost,
    #[error("invalid IPv6 address")]
    BadIpv6,
    #[error("unexpected ':' (write an IPv6 address with a port as [address]:port)")]
    UnexpectedColon,
    #[error("expected ':' and a port after the IPv6 address")]
    ExpectedPortAfterIpv6,
    #[error("expected a port number after ':'")]
    ExpectedPort,
    #[error("a port must be a number from 1 to 65535")]
    BadPort,
    #[error("unknown group @{0}")]
    UnknownGroup(String),
    #[error("group cycle: @{}", .0.join(" -> @"))]
    GroupCycle(Vec<String>),
    #[error("groups nested more than {MAX_GROUP_DEPTH} deep")]
    GroupsTooDeep,
    #[error("the node set expands to more than {0} hosts")]
    TooManyTargets(usize),
}

fn char_message(c: &char, place: &str) -> String {
    if c.is_whitespace() {
        format!("whitespace is not allowed in {place}")
    } else if c.is_control() {
        format!("control character U+{:04X} is not allowed", u32::from(*c))
    } else if "!\"$&'()*;<>?\\`{|}~".contains(*c) {
        format!("'{c}' is not allowed in {place} (shell metacharacter)")
    } else {
        format!("'{c}' is not allowed in {place}")
    }
}

/// A node set that could not be parsed or expanded. `Display` shows the text
/// with a caret under the offending character; [`NodeSetError::one_line`]
/// gives a single-line form for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetError {
    /// The text in which the error was found: the node set itself, a group's
    /// definition (see `group`), or a whole line of a file.
    pub input: String,
    /// Byte offset of the offending character in `input` (`input.len()` when
    /// something is missing at the end).
    pub offset: usize,
    /// What is wrong.
    pub kind: ErrorKind,
    /// The group whose definition `input` is, when the error is inside one.
    pub group: Option<String>,
}

impl NodeSetError {
    fn new(input: &str, offset: usize, kind: ErrorKind) -> Self {
        NodeSetError {
            input: input.to_owned(),
            offset,
            kind,
            group: None,
        }
    }

    /// 1-based column (in characters) of the offending character.
    pub fn column(&self) -> usize {
        self.input
            .char_indices()
            .take_while(|(i, _)| *i < self.offset)
            .count()
            + 1
    }

    fn header(&self) -> String {
        let place = match &self.group {
            Some(group) => format!(" in group @{group}"),
            None => String::new(),
        };
        format!(
            "bad node set{place} at column {}: {}",
            self.column(),
            self.kind
        )
    }

    /// The error on one line, quoting the input.
    pub fn one_line(&self) -> String {
        format!("{} (in \"{}\")", self.header(), self.input.escape_debug())
    }

    /// The input around the error (control characters escaped) and the
    /// display column of the offending character in it.
    fn excerpt(&self) -> (String, usize) {
        const HALF: usize = 40;
        let chars: Vec<char> = self.input.chars().collect();
        let col = self.column() - 1;
        let start = if chars.len() > 2 * HALF {
            col.saturating_sub(HALF)
        } else {
            0
        };
        let end = (start + 2 * HALF).min(chars.len());
        let mut line = String::new();
        let mut width = 0;
        let mut caret = None;
        if start > 0 {
            line.push_str("...");
            width += 3;
        }
        for (i, c) in chars[start..end].iter().enumerate() {
            if start + i == col {
                caret = Some(width);
            }
            if c.is_control() {
                let escaped: String = c.escape_debug().collect();
                width += escaped.chars().count();
                line.push_str(&escaped);
            } else {
                width += 1;
                line.push(*c);
            }
        }
        if end < chars.len() {
            line.push_str("...");
        }
        (line, caret.unwrap_or(width))
    }

    /// Moves an error found in `part`, which starts at byte `at` of `whole`,
    /// so that it points into `whole`.
    fn within(mut self, whole: &str, at: usize) -> Self {
        if self.group.is_none() {
            self.input = whole.to_owned();
            self.offset += at;
        }
        self
    }
}

impl fmt::Display for NodeSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (line, caret) = self.excerpt();
        write!(f, "{}\n  {line}\n  {}^", self.header(), " ".repeat(caret))
    }
}

impl std::error::Error for NodeSetError {}

fn err<T>(input: &str, offset: usize, kind: ErrorKind) -> Result<T, NodeSetError> {
    Err(NodeSetError::new(input, offset, kind))
}

// ---------------------------------------------------------------------------
// Syntax

#[derive(Debug, Clone, PartialEq, Eq)]
enum Element {
    /// `@name`; `at` is the offset of the `@`.
    Group {
        name: String,
        at: usize,
    },
    Hosts(HostSpec),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HostSpec {
    user: Option<String>,
    host: HostPattern,
    port: Option<u16>,
    /// Offset of the element's first character.
    at: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Normalised address, with its `%zone` if any.
    Ipv6(String),
    /// Text and bracketed ranges, in order.
    Name(Vec<Part>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Range(Vec<RangeItem>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RangeItem {
    start: u64,
    end: u64,
    step: u64,
    /// Minimum number of digits (1 when not zero-padded).
    width: usize,
}

impl RangeItem {
    fn len(&self) -> u64 {
        (self.end - self.start) / self.step + 1
    }
}

impl HostSpec {
    /// Number of hosts the element names, counting overlaps twice; `None`
    /// when that does not fit in a `u64`.
    fn count(&self) -> Option<u64> {
        let HostPattern::Name(parts) = &self.host else {
            return Some(1);
        };
        parts.iter().try_fold(1u64, |total, part| match part {
            Part::Text(_) => Some(total),
            Part::Range(items) => {
                let n = items
                    .iter()
                    .try_fold(0u64, |sum, item| sum.checked_add(item.len()))?;
                total.checked_mul(n)
            }
        })
    }

    /// The host names of the element (call only after checking `count`).
    fn host_names(&self) -> Vec<String> {
        let parts = match &self.host {
            HostPattern::Ipv6(address) => return vec![address.clone()],
            HostPattern::Name(parts) => parts,
        };
        let mut names = vec![String::new()];
        for part in parts {
            match part {
                Part::Text(text) => names.iter_mut().for_each(|n| n.push_str(text)),
                Part::Range(items) => {
                    let mut next = Vec::new();
                    for name in &names {
                        for item in items {
                            let mut v = item.start;
                            loop {
                                next.push(format!("{name}{v:0w$}", w = item.width));
                                match v.checked_add(item.step) {
                                    Some(n) if n <= item.end => v = n,
                                    _ => break,
                                }
                            }
                        }
                    }
                    names = next;
                }
            }
        }
        names
    }
}

fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '-' | '_' | '.')
        || (!c.is_ascii() && c.is_alphanumeric())
}

fn is_user_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Group names use the same characters as user names.
fn is_group_char(c: char) -> bool {
    is_user_char(c)
}

/// Parses a node set into elements without expanding anything.
fn parse_elements(input: &str) -> Result<Vec<Element>, NodeSetError> {
    if input.is_empty() {
        return err(input, 0, ErrorKind::Empty);
    }
    let mut elements = Vec::new();
    let mut start = 0;
    loop {
        let end = element_end(input, start);
        if end == start {
            return err(input, start, ErrorKind::EmptyElement);
        }
        elements.push(parse_element(input, start, end)?);
        if end == input.len() {
            return Ok(elements);
        }
        start = end + 1;
    }
}

/// Offset of the comma (outside brackets) that ends the element starting at `from`.
fn element_end(input: &str, from: usize) -> usize {
    let mut depth = 0usize;
    for (i, b) in input.bytes().enumerate().skip(from) {
        match b {
            b'[' => depth += 1,
            b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => return i,
            _ => {}
        }
    }
    input.len()
}

fn parse_element(input: &str, start: usize, end: usize) -> Result<Element, NodeSetError> {
    let text = &input[start..end];
    if let Some(name) = text.strip_prefix('@') {
        check_word(input, start + 1, end, is_group_char, |c| match c {
            ':' | '@' => ErrorKind::GroupWithUserOrPort,
            c => ErrorKind::InvalidGroupChar(c),
        })?;
        if name.is_empty() {
            return err(input, end, ErrorKind::ExpectedGroupName);
        }
        return Ok(Element::Group {
            name: name.to_owned(),
            at: start,
        });
    }
    let (user, host_start) = match text.find('@') {
        Some(i) => {
            check_word(
                input,
                start,
                start + i,
                is_user_char,
                ErrorKind::InvalidUserChar,
            )?;
            (Some(text[..i].to_owned()), start + i + 1)
        }
        None => (None, start),
    };
    if input[host_start..end].starts_with('@') {
        return err(input, host_start, ErrorKind::GroupWithUserOrPort);
    }
    let (host, port) = parse_host_port(input, host_start, end)?;
    Ok(Element::Hosts(HostSpec {
        user,
        host,
        port,
        at: start,
    }))
}

/// Checks that `input[start..end]` does not start with '-' and only has
/// characters that `ok` accepts.
fn check_word(
    input: &str,
    start: usize,
    end: usize,
    ok: fn(char) -> bool,
    bad: impl Fn(char) -> ErrorKind,
) -> Result<(), NodeSetError> {
    if input[start..end].starts_with('-') {
        return err(input, start, ErrorKind::LeadingDash);
    }
    match input[start..end].char_indices().find(|&(_, c)| !ok(c)) {
        Some((i, c)) => err(input, start + i, bad(c)),
        None => Ok(()),
    }
}

fn parse_host_port(
    input: &str,
    start: usize,
    end: usize,
) -> Result<(HostPattern, Option<u16>), NodeSetError> {
    let text = &input[start..end];
    if start == end {
        return err(input, start, ErrorKind::ExpectedHost);
    }
    // `[address]` or `[address]:port`.
    if let Some(close) = text.strip_prefix('[').and_then(|t| t.find(']')) {
        let content = &text[1..close + 1];
        if content.contains(':') {
            let Some(address) = ipv6(content) else {
                return err(input, start + 1, ErrorKind::BadIpv6);
            };
            let after = start + close + 2;
            let port = if after == end {
                None
            } else if input[after..end].starts_with(':') {
                Some(parse_port(input, after + 1, end)?)
            } else {
                return err(input, after, ErrorKind::ExpectedPortAfterIpv6);
            };
            return Ok((HostPattern::Ipv6(address), port));
        }
    }
    // A bare IPv6 address (it cannot take a port).
    if !text.contains('[') && text.matches(':').count() >= 2 {
        if let Some(address) = ipv6(text) {
            return Ok((HostPattern::Ipv6(address), None));
        }
        let second = text.match_indices(':').nth(1).map_or(0, |(i, _)| i);
        return err(input, start + second, ErrorKind::UnexpectedColon);
    }
    let (parts, stop) = parse_name(input, start, end)?;
    let port = if stop < end {
        Some(parse_port(input, stop + 1, end)?)
    } else {
        None
    };
    Ok((HostPattern::Name(parts), port))
}

/// Parses `address` or `address%zone` into its normalised form.
fn ipv6(text: &str) -> Option<String> {
    let (address, zone) = match text.split_once('%') {
        Some((a, z)) => (a, Some(z)),
        None => (text, None),
    };
    let address: Ipv6Addr = address.parse().ok()?;
    match zone {
        None => Some(address.to_string()),
        Some(z) if !z.is_empty() && z.chars().all(is_user_char) => Some(format!("{address}%{z}")),
        Some(_) => None,
    }
}

/// Parses host text and bracketed ranges up to `end` or a ':'; returns the
/// parts and the offset where it stopped.
fn parse_name(input: &str, start: usize, end: usize) -> Result<(Vec<Part>, usize), NodeSetError> {
    if input[start..end].starts_with('-') {
        return err(input, start, ErrorKind::LeadingDash);
    }
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut i = start;
    while i < end {
        let Some(c) = input[i..end].chars().next() else {
            break;
        };
        match c {
            ':' => break,
            '[' => {
                let Some(close) = input[i + 1..end].find(']').map(|n| i + 1 + n) else {
                    return err(input, i, ErrorKind::UnclosedBracket);
                };
                let content = &input[i + 1..close];
                if let Some(inner) = content.find('[') {
                    return err(input, i + 1 + inner, ErrorKind::NestedBracket);
                }
                if content.contains(':') {
                    return err(input, i, ErrorKind::Ipv6NotWholeHost);
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Range(parse_range(input, i + 1, close)?));
                i = close + 1;
                continue;
            }
            ']' => return err(input, i, ErrorKind::UnmatchedBracket),
            c if is_host_char(c) => text.push(c),
            c => return err(input, i, ErrorKind::InvalidChar(c)),
        }
        i += c.len_utf8();
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    if parts.is_empty() {
        return err(input, start, ErrorKind::ExpectedHost);
    }
    Ok((parts, i))
}

/// Reads the digits starting at `at` (before `end`), which must be followed by
/// at least one; `after` is the character before them, for the message.
fn parse_digits(input: &str, at: usize, end: usize, after: char) -> Result<&str, NodeSetError> {
    let len = input.as_bytes()[at..end]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if len == 0 {
        return err(input, at, ErrorKind::ExpectedNumber(after));
    }
    if len > MAX_DIGITS {
        return err(input, at, ErrorKind::NumberTooLong);
    }
    Ok(&input[at..at + len])
}

fn number(digits: &str) -> u64 {
    digits
        .bytes()
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'))
}

fn is_padded(digits: &str) -> bool {
    digits.len() > 1 && digits.starts_with('0')
}

/// Parses the inside of `[...]`: `input[start..end]`.
fn parse_range(input: &str, start: usize, end: usize) -> Result<Vec<RangeItem>, NodeSetError> {
    let bytes = input.as_bytes();
    let mut items = Vec::new();
    let mut i = start;
    let mut after = '[';
    loop {
        let item_at = i;
        let first = parse_digits(input, i, end, after)?;
        i += first.len();
        let mut last = first;
        let mut step = 1;
        if bytes.get(i) == Some(&b'-') && i < end {
            let last_at = i + 1;
            last = parse_digits(input, last_at, end, '-')?;
            i = last_at + last.len();
            if is_padded(last) && last.len() != first.len() {
                return err(input, last_at, ErrorKind::PaddingMismatch);
            }
            if bytes.get(i) == Some(&b'/') && i < end {
                let step_digits = parse_digits(input, i + 1, end, '/')?;
                step = number(step_digits);
                if step == 0 {
                    return err(input, i + 1, ErrorKind::ZeroStep);
                }
                i += 1 + step_digits.len();
            }
        } else if bytes.get(i) == Some(&b'/') && i < end {
            return err(input, i, ErrorKind::StepWithoutRange);
        }
        let (lo, hi) = (number(first), number(last));
        if lo > hi {
            return err(input, item_at, ErrorKind::ReversedRange(lo, hi));
        }
        items.push(RangeItem {
            start: lo,
            end: hi,
            step,
            width: if is_padded(first) { first.len() } else { 1 },
        });
        if i == end {
            return Ok(items);
        }
        if bytes[i] != b',' {
            let c = input[i..].chars().next().unwrap_or(']');
            return err(input, i, ErrorKind::ExpectedCommaOrClose(c));
        }
        after = ',';
        i += 1;
    }
}

fn parse_port(input: &str, start: usize, end: usize) -> Result<u16, NodeSetError> {
    if start == end {
        return err(input, start, ErrorKind::ExpectedPort);
    }
    let digits = &input[start..end];
    if let Some((i, c)) = digits.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        return err(input, start + i, ErrorKind::InvalidPortChar(c));
    }
    match digits.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => err(input, start, ErrorKind::BadPort),
    }
}

// ---------------------------------------------------------------------------
// Expansion

/// Expands node sets, remembering groups it has already expanded.
struct Expander<'a> {
    groups: &'a dyn Fn(&str) -> Option<String>,
    limit: usize,
    cache: HashMap<String, Vec<Target>>,
    /// Groups being expanded, outermost first.
    stack: Vec<String>,
}

impl<'a> Expander<'a> {
    fn new(groups: &'a dyn Fn(&str) -> Option<String>, limit: usize) -> Self {
        Expander {
            groups,
            limit,
            cache: HashMap::new(),
            stack: Vec::new(),
        }
    }

    /// Expands `text` into sorted, de-duplicated targets.
    fn expand(&mut self, text: &str) -> Result<Vec<Target>, NodeSetError> {
        let mut set = HashSet::new();
        for element in parse_elements(text)? {
            match element {
                Element::Group { name, at } => {
                    let limit = self.limit;
                    for target in self.group(&name, text, at)? {
                        set.insert(target.clone());
                        if set.len() > limit {
                            return err(text, at, ErrorKind::TooManyTargets(limit));
                        }
                    }
                }
                Element::Hosts(spec) => {
                    let too_many = ErrorKind::TooManyTargets(self.limit);
                    if spec.count().is_none_or(|n| n > self.limit as u64) {
                        return err(text, spec.at, too_many);
                    }
                    for host in spec.host_names() {
                        set.insert(Target {
                            user: spec.user.clone(),
                            host,
                            port: spec.port,
                        });
                    }
                    if set.len() > self.limit {
                        return err(text, spec.at, too_many);
                    }
                }
            }
        }
        let mut targets: Vec<Target> = set.into_iter().collect();
        sort_canonical(&mut targets);
        Ok(targets)
    }

    /// The targets of group `name`, referenced at `at` in `text`.
    fn group(&mut self, name: &str, text: &str, at: usize) -> Result<&[Target], NodeSetError> {
        if !self.cache.contains_key(name) {
            if let Some(pos) = self.stack.iter().position(|g| g == name) {
                let mut cycle = self.stack[pos..].to_vec();
                cycle.push(name.to_owned());
                return err(text, at, ErrorKind::GroupCycle(cycle));
            }
            if self.stack.len() >= MAX_GROUP_DEPTH {
                return err(text, at, ErrorKind::GroupsTooDeep);
            }
            let Some(definition) = (self.groups)(name) else {
                return err(text, at, ErrorKind::UnknownGroup(name.to_owned()));
            };
            self.stack.push(name.to_owned());
            let expanded = self.expand(&definition).map_err(|mut e| {
                e.group.get_or_insert_with(|| name.to_owned());
                e
            });
            self.stack.pop();
            self.cache.insert(name.to_owned(), expanded?);
        }
        Ok(self.cache.get(name).map_or(&[], Vec::as_slice))
    }
}

/// A groups callback that knows no groups.
pub fn no_groups(_name: &str) -> Option<String> {
    None
}

/// Expands a node set into targets, de-duplicated and in canonical order (see
/// the module documentation). `groups` returns the definition of a group
/// (itself a node set) by name, or `None` for an unknown group. The result is
/// never empty.
pub fn parse(
    input: &str,
    groups: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Target>, NodeSetError> {
    parse_with_limit(input, groups, MAX_TARGETS)
}

/// [`parse`] with a cap other than [`MAX_TARGETS`].
pub fn parse_with_limit(
    input: &str,
    groups: &dyn Fn(&str) -> Option<String>,
    max_targets: usize,
) -> Result<Vec<Target>, NodeSetError> {
    Expander::new(groups, max_targets).expand(input)
}

/// Parses the display form of exactly one target.
fn parse_one(name: &str) -> Option<Target> {
    parse_with_limit(name, &no_groups, 1).ok()?.pop()
}

// ---------------------------------------------------------------------------
// Folding

/// Folds host display strings (`host`, `user@host:port`, `[v6]:port`, ...)
/// into a node set. The result is canonical (the same set of names in any
/// order or with repeats gives the same string) and [`parse`] expands it back
/// to exactly the targets the names denote.
///
/// Names with the same shape, user and port are folded together, across all
/// their numeric fields (`rack[1-2]-node[1-3]`); zero padding is kept
/// (`web[01-10]`, `web[9-10]`, `web[1,01]`). Steps are never used. A name
/// that is not the display form of one target is appended as it is, after
/// the folded part; empty names are ignored.
pub fn fold(names: &[impl AsRef<str>]) -> String {
    let mut targets = Vec::new();
    let mut verbatim = BTreeSet::new();
    for name in names.iter().map(AsRef::as_ref).filter(|n| !n.is_empty()) {
        match parse_one(name) {
            Some(target) => targets.push(target),
            None => {
                verbatim.insert(name);
            }
        }
    }
    let folded = fold_targets(&targets);
    let parts: Vec<&str> = std::iter::once(folded.as_str())
        .filter(|f| !f.is_empty())
        .chain(verbatim)
        .collect();
    parts.join(",")
}

/// Folds targets into a node set, as [`fold`] does with their display forms.
/// An empty slice gives an empty string.
pub fn fold_targets(targets: &[Target]) -> String {
    type Shape = (bool, Vec<String>, Option<String>, Option<u16>);
    let mut shapes: BTreeMap<Shape, BTreeSet<Vec<Num>>> = BTreeMap::new();
    for t in targets {
        let (texts, nums) = split_host(&t.host);
        shapes
            .entry((t.is_ipv6(), texts, t.user.clone(), t.port))
            .or_default()
            .insert(nums);
    }
    let mut elements = Vec::new();
    for ((_, texts, user, port), members) in shapes {
        for fields in merge_boxes(members) {
            let mut host = String::new();
            for (i, text) in texts.iter().enumerate() {
                host.push_str(text);
                if let Some(field) = fields.get(i) {
                    host.push_str(&fold_field(field));
                }
            }
            let mut element = String::new();
            // Writing to a String cannot fail.
            let _ = write_target(&mut element, user.as_deref(), &host, port);
            elements.push(element);
        }
    }
    elements.join(",")
}

/// Covers a set of number vectors exactly with disjoint "boxes" (one set of
/// numbers per field, standing for every combination). Starting from one box
/// per member, boxes that agree on every field but one are merged, last field
/// first, until nothing merges any more.
fn merge_boxes(members: BTreeSet<Vec<Num>>) -> Vec<Vec<Vec<Num>>> {
    let dims = members.first().map_or(0, Vec::len);
    let mut boxes: Vec<Vec<Vec<Num>>> = members
        .into_iter()
        .map(|m| m.into_iter().map(|n| vec![n]).collect())
        .collect();
    loop {
        let mut merged = false;
        for d in (0..dims).rev() {
            let count = boxes.len();
            let mut by_rest: BTreeMap<Vec<Vec<Num>>, BTreeSet<Num>> = BTreeMap::new();
            for mut b in std::mem::take(&mut boxes) {
                let field = std::mem::take(&mut b[d]);
                by_rest.entry(b).or_default().extend(field);
            }
            merged |= by_rest.len() < count;
            boxes = by_rest
                .into_iter()
                .map(|(mut b, field)| {
                    b[d] = field.into_iter().collect();
                    b
                })
                .collect();
        }
        if !merged {
            // List boxes by their first host, in canonical order.
            boxes.sort_by_cached_key(|b| {
                let first: Vec<Num> = b.iter().filter_map(|f| f.first().copied()).collect();
                let values: Vec<u64> = first.iter().map(|n| n.0).collect();
                (values, first)
            });
            return boxes;
        }
    }
}

fn digit_count(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |n| n as usize + 1)
}

fn padded(v: u64, width: u8) -> String {
    format!("{v:0w$}", w = usize::from(width))
}

/// Writes one numeric field: the number itself, or a bracketed list of
/// ranges. Numbers written without leading zeros form unpadded ranges;
/// zero-padded ones form ranges of their width, which continue past the
/// padded numbers (`[08-11]`) unless an unpadded range already reaches there.
fn fold_field(nums: &[Num]) -> String {
    if let [(v, w)] = nums {
        return padded(*v, *w);
    }
    let mut natural = BTreeSet::new();
    let mut by_width: BTreeMap<u8, BTreeSet<u64>> = BTreeMap::new();
    for &(v, w) in nums {
        if usize::from(w) == digit_count(v) {
            natural.insert(v);
        } else {
            by_width.entry(w).or_default().insert(v);
        }
    }
    let mut items = Vec::new();
    for (w, mut set) in by_width {
        // The last padded number of this width: 9 for "09", 99 for "099".
        let top = 10u64.pow(u32::from(w) - 1) - 1;
        if set.contains(&top) && !natural.contains(&top) {
            let mut v = top + 1;
            while natural.remove(&v) {
                set.insert(v);
                v += 1;
            }
        }
        push_runs(&mut items, &set, w);
    }
    push_runs(&mut items, &natural, 1);
    items.sort_unstable_by_key(|&(start, w, _)| (start, w));
    let body: Vec<String> = items
        .iter()
        .map(|&(start, w, end)| {
            if start == end {
                padded(start, w)
            } else {
                format!("{}-{}", padded(start, w), padded(end, w))
            }
        })
        .collect();
    format!("[{}]", body.join(","))
}

/// Appends the runs of consecutive numbers in `set` as `(start, width, end)`.
fn push_runs(items: &mut Vec<(u64, u8, u64)>, set: &BTreeSet<u64>, width: u8) {
    for &v in set {
        match items.last_mut() {
            Some((_, w, end)) if *w == width && *end + 1 == v => *end = v,
            _ => items.push((v, width, v)),
        }
    }
}

// ---------------------------------------------------------------------------
// Files

/// The part of a file line before any `#` comment, trimmed, with its offset
/// in the line; `None` for a blank or comment-only line.
fn line_content(raw: &str) -> Option<(&str, usize)> {
    let content = raw.split('#').next().unwrap_or("");
    let value = content.trim();
    if value.is_empty() {
        return None;
    }
    Some((value, content.len() - content.trim_start().len()))
}

/// Groups read from a groups file (`name: node set` lines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    /// Name → (definition, 1-based line).
    defs: BTreeMap<String, (String, usize)>,
}

impl Groups {
    /// The definition of group `name` (without the `@`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.defs.get(name).map(|(value, _)| value.as_str())
    }

    /// [`Groups::get`] in the form [`parse`] takes:
    /// `parse(text, &|name| groups.lookup(name))`.
    pub fn lookup(&self, name: &str) -> Option<String> {
        self.get(name).map(str::to_owned)
    }

    /// The line on which group `name` is defined.
    pub fn line(&self, name: &str) -> Option<usize> {
        self.defs.get(name).map(|(_, line)| *line)
    }

    /// Group names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.defs.keys().map(String::as_str)
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.defs.len()
    }

    /// True when there are no groups.
    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }
}

/// An error in a groups file, located at a file and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupsError {
    /// A line that is not `name: node set`, or a bad or repeated name.
    #[error("{file}:{line}: {message}")]
    Invalid {
        file: String,
        line: usize,
        message: String,
    },
    /// A definition that does not parse, or names an unknown group, or is
    /// part of a cycle. The error's input is the whole line.
    #[error("{file}:{line}: {error}")]
    NodeSet {
        file: String,
        line: usize,
        error: NodeSetError,
    },
}

/// One definition of a groups file, kept for the checks across definitions.
struct GroupLine<'a> {
    name: String,
    /// 1-based line number.
    line: usize,
    /// The whole line, for errors.
    raw: &'a str,
    /// Groups the definition uses, with the offset of their `@` in `raw`.
    refs: Vec<(String, usize)>,
}

/// Parses a groups file: one `name: node set` per line, `#` starts a comment,
/// blank lines are ignored. Every definition is checked here: its syntax, that
/// the groups it uses are defined in the file, that there are no cycles and
/// no nesting deeper than [`MAX_GROUP_DEPTH`]. (How many hosts a group
/// expands to is only checked when it is used.)
pub fn parse_groups_file(text: &str, file_name: &str) -> Result<Groups, GroupsError> {
    let invalid = |line: usize, message: String| GroupsError::Invalid {
        file: file_name.to_owned(),
        line,
        message,
    };
    let mut groups = Groups::default();
    let mut order = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let Some((content, at)) = line_content(raw) else {
            continue;
        };
        let Some((name, value)) = content.split_once(':') else {
            return Err(invalid(
                line,
                format!(
                    "expected 'name: node set', found \"{}\"",
                    content.escape_debug()
                ),
            ));
        };
        let name = name.trim();
        if name.is_empty() || !name.chars().all(is_group_char) || name.starts_with('-') {
            return Err(invalid(
                line,
                format!(
                    "invalid group name \"{}\" (use letters, digits, '.', '_' and '-')",
                    name.escape_debug()
                ),
            ));
        }
        if let Some(previous) = groups.line(name) {
            return Err(invalid(
                line,
                format!("group @{name} is already defined on line {previous}"),
            ));
        }
        let value_at = at + content.len() - value.trim_start().len();
        let value = value.trim();
        if value.is_empty() {
            return Err(invalid(line, format!("group @{name} has no hosts")));
        }
        let elements = parse_elements(value).map_err(|e| GroupsError::NodeSet {
            file: file_name.to_owned(),
            line,
            error: e.within(raw, value_at),
        })?;
        let refs = elements
            .into_iter()
            .filter_map(|e| match e {
                Element::Group { name, at } => Some((name, value_at + at)),
                Element::Hosts(_) => None,
            })
            .collect();
        groups
            .defs
            .insert(name.to_owned(), (value.to_owned(), line));
        order.push(GroupLine {
            name: name.to_owned(),
            line,
            raw,
            refs,
        });
    }
    check_group_graph(&order, file_name)?;
    Ok(groups)
}

/// Checks that every group used is defined, that no group uses itself
/// (directly or not) and that nesting stays within [`MAX_GROUP_DEPTH`].
fn check_group_graph(order: &[GroupLine], file_name: &str) -> Result<(), GroupsError> {
    let error_at = |def: &GroupLine, at: usize, kind: ErrorKind| GroupsError::NodeSet {
        file: file_name.to_owned(),
        line: def.line,
        error: NodeSetError::new(def.raw, at, kind),
    };
    // Every referenced group exists.
    let index: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, def)| (def.name.as_str(), i))
        .collect();
    let mut edges: Vec<Vec<(usize, usize)>> = Vec::with_capacity(order.len());
    for def in order {
        let mut out = Vec::new();
        for (name, at) in &def.refs {
            match index.get(name.as_str()) {
                Some(&target) => out.push((target, *at)),
                None => return Err(error_at(def, *at, ErrorKind::UnknownGroup(name.clone()))),
            }
        }
        edges.push(out);
    }

    // No cycles and no nesting deeper than MAX_GROUP_DEPTH: an iterative
    // depth-first walk (0 = not seen, 1 = on the path, 2 = done).
    let mut state = vec![0u8; order.len()];
    let mut height = vec![0usize; order.len()];
    for root in 0..order.len() {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(&(node, next)) = path.last() {
            if let Some(&(child, at)) = edges[node].get(next) {
                let top = path.len() - 1;
                path[top].1 += 1;
                match state[child] {
                    0 => {
                        state[child] = 1;
                        path.push((child, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(n, _)| n == child).unwrap_or(0);
                        let mut cycle: Vec<String> = path[from..]
                            .iter()
                            .map(|&(n, _)| order[n].name.clone())
                            .collect();
                        cycle.push(order[child].name.clone());
                        return Err(error_at(&order[node], at, ErrorKind::GroupCycle(cycle)));
                    }
                    _ => {}
                }
            } else {
                let h = 1 + edges[node]
                    .iter()
                    .map(|&(c, _)| height[c])
                    .max()
                    .unwrap_or(0);
                if h > MAX_GROUP_DEPTH {
                    let def = &order[node];
                    return Err(GroupsError::Invalid {
                        file: file_name.to_owned(),
                        line: def.line,
                        message: format!(
                            "group @{} nests groups more than {MAX_GROUP_DEPTH} deep",
                            def.name
                        ),
                    });
                }
                height[node] = h;
                state[node] = 2;
                path.pop();
            }
        }
    }
    Ok(())
}

/// An error in a hosts file (`-f FILE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostsFileError {
    /// A line that does not expand. The error's input is the whole line,
    /// unless the error is inside a group's definition.
    #[error("{file}:{line}: {error}")]
    NodeSet {
        file: String,
        line: usize,
        error: NodeSetError,
    },
    /// The file names no hosts at all.
    #[error("{file}: no hosts in the file")]
    Empty { file: String },
}

/// Parses a hosts file: one host or node set per line, `#` starts a comment,
/// blank lines are ignored. Returns the union of all lines, de-duplicated and
/// in canonical order; a file without any host is an error.
pub fn parse_hosts_file(
    text: &str,
    file_name: &str,
    groups: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Target>, HostsFileError> {
    let mut expander = Expander::new(groups, MAX_TARGETS);
    let mut all = HashSet::new();
    for (index, raw) in text.lines().enumerate() {
        let Some((content, at)) = line_content(raw) else {
            continue;
        };
        let line_error = |error: NodeSetError| HostsFileError::NodeSet {
            file: file_name.to_owned(),
            line: index + 1,
            error: error.within(raw, at),
        };
        all.extend(expander.expand(content).map_err(line_error)?);
        if all.len() > MAX_TARGETS {
            let kind = ErrorKind::TooManyTargets(MAX_TARGETS);
            return Err(line_error(NodeSetError::new(content, 0, kind)));
        }
    }
    if all.is_empty() {
        return Err(HostsFileError::Empty {
            file: file_name.to_owned(),
        });
    }
    let mut targets: Vec<Target> = all.into_iter().collect();
    sort_canonical(&mut targets);
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;

    fn hosts(input: &str) -> Vec<String> {
        match parse(input, &no_groups) {
            Ok(targets) => targets.iter().map(ToString::to_string).collect(),
            Err(e) => panic!("{input:?}: {e}"),
        }
    }

    fn error(input: &str) -> NodeSetError {
        parse(input, &no_groups).expect_err(input)
    }

    fn defined<'a>(defs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            defs.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    // --- Expansion -------------------------------------------------------

    #[test]
    fn comma_lists_and_single_hosts() {
        assert_eq!(hosts("web1,db1"), ["db1", "web1"]);
        assert_eq!(hosts("example.com"), ["example.com"]);
        assert_eq!(hosts("my_host-2.lan."), ["my_host-2.lan."]);
    }

    #[test]
    fn padded_and_unpadded_ranges() {
        assert_eq!(hosts("web[01-03]"), ["web01", "web02", "web03"]);
        assert_eq!(hosts("web[08-11]"), ["web08", "web09", "web10", "web11"]);
        assert_eq!(hosts("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(hosts("web[9-11]"), ["web9", "web10", "web11"]);
        assert_eq!(hosts("web[0-1]"), ["web0", "web1"]);
        assert_eq!(hosts("web[00-01]"), ["web00", "web01"]);
        assert_eq!(hosts("web[001-010]").len(), 10);
        assert_eq!(parse("web[01-20]", &no_groups).unwrap().len(), 20);
    }

    #[test]
    fn steps() {
        assert_eq!(hosts("web[1-9/4]"), ["web1", "web5", "web9"]);
        assert_eq!(hosts("web[1-10/3]"), ["web1", "web4", "web7", "web10"]);
        assert_eq!(hosts("web[1-10/4]"), ["web1", "web5", "web9"]);
        assert_eq!(hosts("web[2-2/5]"), ["web2"]);
        assert_eq!(hosts("web[01-05/2]"), ["web01", "web03", "web05"]);
        assert_eq!(parse("web[1-20/2]", &no_groups).unwrap().len(), 10);
    }

    #[test]
    fn lists_inside_brackets() {
        assert_eq!(
            hosts("web[1-3,7,10-12]"),
            ["web1", "web2", "web3", "web7", "web10", "web11", "web12"]
        );
        assert_eq!(hosts("web[3,1,2,1]"), ["web1", "web2", "web3"]);
        assert_eq!(hosts("web[1,01]"), ["web1", "web01"]);
    }

    #[test]
    fn several_fields_in_one_name() {
        assert_eq!(
            hosts("rack[1-2]-node[001-002]"),
            [
                "rack1-node001",
                "rack1-node002",
                "rack2-node001",
                "rack2-node002"
            ]
        );
        assert_eq!(
            parse("rack[1-4]-node[001-128]", &no_groups).unwrap().len(),
            512
        );
        assert_eq!(hosts("n[1-2]x[1-2]y"), ["n1x1y", "n1x2y", "n2x1y", "n2x2y"]);
    }

    #[test]
    fn ipv4_octets_as_ranges() {
        let all = hosts("127.0.[1-2].[1-250]");
        assert_eq!(all.len(), 500);
        assert_eq!(all[0], "127.0.1.1");
        assert_eq!(all[249], "127.0.1.250");
        assert_eq!(all[250], "127.0.2.1");
    }

    #[test]
    fn brackets_anywhere_in_a_name() {
        assert_eq!(hosts("web[5]"), ["web5"]);
        assert_eq!(hosts("web[007]"), ["web007"]);
        assert_eq!(hosts("[1-2].example"), ["1.example", "2.example"]);
        assert_eq!(hosts("web1[0-2]"), ["web10", "web11", "web12"]);
        assert_eq!(hosts("[1-2]"), ["1", "2"]);
    }

    #[test]
    fn users_and_ports() {
        assert_eq!(
            hosts("root@db[1-3]:2222,web1"),
            ["root@db1:2222", "root@db2:2222", "root@db3:2222", "web1"]
        );
        let t = parse("root@db1:2222", &no_groups).unwrap();
        assert_eq!(
            t,
            [Target {
                user: Some("root".into()),
                host: "db1".into(),
                port: Some(2222)
            }]
        );
        assert_eq!(hosts("web1:22"), ["web1:22"]);
        assert_eq!(hosts("web1:022"), ["web1:22"]);
        assert_eq!(hosts("a.b-c_d@h"), ["a.b-c_d@h"]);
        assert_eq!(hosts("web1:65535"), ["web1:65535"]);
    }

    #[test]
    fn ipv6_literals() {
        assert_eq!(hosts("[::1]"), ["::1"]);
        assert_eq!(hosts("::1"), ["::1"]);
        assert_eq!(hosts("[fe80::1]:2222"), ["[fe80::1]:2222"]);
        assert_eq!(hosts("root@[::1]:22"), ["root@[::1]:22"]);
        assert_eq!(hosts("root@::1"), ["root@::1"]);
        assert_eq!(hosts("[0:0:0:0:0:0:0:1],::1"), ["::1"]);
        assert_eq!(hosts("[FE80::A]"), ["fe80::a"]);
        assert_eq!(hosts("fe80::1%eth0"), ["fe80::1%eth0"]);
        assert_eq!(hosts("[fe80::1%eth0]:22"), ["[fe80::1%eth0]:22"]);
        assert_eq!(hosts("::ffff:10.0.0.1"), ["::ffff:10.0.0.1"]);
        let t = &parse("[fe80::1]:2222", &no_groups).unwrap()[0];
        assert_eq!((t.host.as_str(), t.port), ("fe80::1", Some(2222)));
        assert!(t.is_ipv6());
        assert_eq!(hosts("web[1-2],[::1]:22"), ["web1", "web2", "[::1]:22"]);
    }

    #[test]
    fn canonical_order() {
        assert_eq!(
            hosts("::1,web10,root@web1,web9,db2,web1:22,web1,web01,10.0.0.10,10.0.0.2"),
            [
                "10.0.0.2",
                "10.0.0.10",
                "db2",
                "web1",
                "web01",
                "web9",
                "web10",
                "web1:22",
                "root@web1",
                "::1"
            ]
        );
        assert_eq!(hosts("web,web1"), ["web", "web1"]);
        assert_eq!(hosts("a2b,a10b,a1"), ["a1", "a2b", "a10b"]);
    }

    #[test]
    fn duplicates_are_removed() {
        assert_eq!(hosts("web1,web[1-2],web1"), ["web1", "web2"]);
        assert_eq!(
            hosts("web1,root@web1,web1:22"),
            ["web1", "web1:22", "root@web1"]
        );
        let targets = parse("web[1-3,2-4]", &no_groups).unwrap();
        assert_eq!(targets.len(), 4);
    }

    #[test]
    fn ord_agrees_with_the_canonical_order() {
        let targets = parse("b1,a10,a9,root@a1,a01,a1:22,::1,x", &no_groups).unwrap();
        let mut sorted = targets.clone();
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, targets);
        let set: BTreeSet<Target> = targets.iter().cloned().collect();
        assert_eq!(set.into_iter().collect::<Vec<_>>(), targets);
        assert_eq!(
            Target::new("a").cmp(&Target::new("a")),
            std::cmp::Ordering::Equal
        );
    }

    #[test]
    fn target_display() {
        let t = |user: Option<&str>, host: &str, port| Target {
            user: user.map(str::to_owned),
            host: host.into(),
            port,
        };
        assert_eq!(t(None, "web1", None).to_string(), "web1");
        assert_eq!(t(Some("u"), "web1", Some(22)).to_string(), "u@web1:22");
        assert_eq!(
            t(Some("u"), "fe80::1", Some(22)).to_string(),
            "u@[fe80::1]:22"
        );
        assert_eq!(t(Some("u"), "fe80::1", None).to_string(), "u@fe80::1");
        assert_eq!(t(None, "::1", Some(2222)).to_string(), "[::1]:2222");
    }

    // --- Errors ----------------------------------------------------------

    #[test]
    fn error_points_at_the_offending_character() {
        let e = error("web[1-]");
        assert_eq!(e.offset, 6);
        assert_eq!(e.column(), 7);
        assert_eq!(
            e.to_string(),
            "bad node set at column 7: expected a number after '-'\n  web[1-]\n        ^"
        );
        assert_eq!(
            e.one_line(),
            "bad node set at column 7: expected a number after '-' (in \"web[1-]\")"
        );
    }

    #[test]
    fn error_kinds_and_offsets() {
        use ErrorKind::*;
        let cases: Vec<(&str, ErrorKind, usize)> = vec![
            ("", Empty, 0),
            ("a,,b", EmptyElement, 2),
            (",a", EmptyElement, 0),
            ("a,", EmptyElement, 2),
            ("web[1-3", UnclosedBracket, 3),
            ("web[1-3,db1", UnclosedBracket, 3),
            ("web1]", UnmatchedBracket, 4),
            ("web[1-[2]]", NestedBracket, 6),
            ("web[5-1]", ReversedRange(5, 1), 4),
            ("web[1,5-1]", ReversedRange(5, 1), 6),
            ("web[1-5/0]", ZeroStep, 8),
            ("web[3/2]", StepWithoutRange, 5),
            ("web[]", ExpectedNumber('['), 4),
            ("web[1,]", ExpectedNumber(','), 6),
            ("web[1-3/]", ExpectedNumber('/'), 8),
            ("web[a]", ExpectedNumber('['), 4),
            ("web[-3]", ExpectedNumber('['), 4),
            ("web[1-3x]", ExpectedCommaOrClose('x'), 7),
            ("web[1-3-5]", ExpectedCommaOrClose('-'), 7),
            ("web[1-010]", PaddingMismatch, 6),
            ("web[001-01]", PaddingMismatch, 8),
            ("web[1234567890123456789]", NumberTooLong, 4),
            ("web1:0", BadPort, 5),
            ("web1:65536", BadPort, 5),
            ("web1:99999999999", BadPort, 5),
            ("web1:", ExpectedPort, 5),
            ("web1:2x", InvalidPortChar('x'), 6),
            ("web1:[22-23]", InvalidPortChar('['), 5),
            ("web 1", InvalidChar(' '), 3),
            ("web1;rm", InvalidChar(';'), 4),
            ("a|b", InvalidChar('|'), 1),
            ("$x", InvalidChar('$'), 0),
            ("`x`", InvalidChar('`'), 0),
            ("a\u{7}", InvalidChar('\u{7}'), 1),
            ("a\nb", InvalidChar('\n'), 1),
            ("a*", InvalidChar('*'), 1),
            ("web1,x!", InvalidChar('!'), 6),
            ("-oProxyCommand", LeadingDash, 0),
            ("-x@h", LeadingDash, 0),
            ("r oot@h", InvalidUserChar(' '), 1),
            ("r[1]@h", InvalidUserChar('['), 1),
            ("@", ExpectedGroupName, 1),
            ("a,@", ExpectedGroupName, 3),
            ("@we b", InvalidGroupChar(' '), 3),
            ("@web[1-2]", InvalidGroupChar('['), 4),
            ("root@@web", GroupWithUserOrPort, 5),
            ("@web:22", GroupWithUserOrPort, 4),
            ("@nope", UnknownGroup("nope".into()), 0),
            ("web1,@nope", UnknownGroup("nope".into()), 5),
            ("web[1:2]", Ipv6NotWholeHost, 3),
            ("[::g]", BadIpv6, 1),
            ("[fe80::1%]", BadIpv6, 1),
            ("[::1]x", ExpectedPortAfterIpv6, 5),
            ("[::1]:", ExpectedPort, 6),
            ("[::1]:0", BadPort, 6),
            ("web1:22:33", UnexpectedColon, 7),
            ("web1::", UnexpectedColon, 5),
            (":22", ExpectedHost, 0),
            ("root@", ExpectedHost, 5),
            ("root@:22", ExpectedHost, 5),
            ("a@b@c", InvalidChar('@'), 3),
            ("[", UnclosedBracket, 0),
        ];
        for (input, kind, offset) in cases {
            let e = error(input);
            assert_eq!((&e.kind, e.offset), (&kind, offset), "{input:?}: {e}");
            assert_eq!(e.input, input);
            assert!(e.group.is_none());
            // Rendering never panics and always has the caret line.
            assert_eq!(e.to_string().lines().count(), 3, "{input:?}");
            assert!(!e.one_line().contains('\n'));
        }
    }

    #[test]
    fn error_messages() {
        let kinds = [
            ("web 1", "whitespace is not allowed in a host name"),
            (
                "a;b",
                "';' is not allowed in a host name (shell metacharacter)",
            ),
            ("a\u{7}", "control character U+0007 is not allowed"),
            ("a+b", "'+' is not allowed in a host name"),
            (
                "web[5-1]",
                "reversed range 5-1 (write the smaller number first)",
            ),
        ];
        for (input, message) in kinds {
            assert_eq!(error(input).kind.to_string(), message, "{input:?}");
        }
        let rendered = [
            ("", "bad node set at column 1: the node set is empty\n  \n  ^"),
            (
                "a,",
                "bad node set at column 3: empty element (a comma at the start or end, or two in a row)\n  a,\n    ^",
            ),
        ];
        for (input, text) in rendered {
            assert_eq!(error(input).to_string(), text, "{input:?}");
        }
    }

    #[test]
    fn error_rendering_escapes_control_characters() {
        let e = error("a\tb;");
        assert_eq!(e.offset, 1);
        assert_eq!(e.to_string().lines().nth(1), Some("  a\\tb;"));
        assert_eq!(e.to_string().lines().nth(2), Some("   ^"));
        let e = error("ab\tc;d");
        assert_eq!(e.to_string().lines().nth(2), Some("    ^"));
        // After an escaped character the caret moves by the escape's width.
        let e = error("web[1-3]\u{1b}");
        assert_eq!(e.to_string().lines().nth(1), Some("  web[1-3]\\u{1b}"));
        assert_eq!(e.to_string().lines().nth(2), Some("          ^"));
        assert_eq!(
            e.one_line(),
            format!(
                "{} (in \"web[1-3]\\u{{1b}}\")",
                e.to_string().lines().next().unwrap()
            )
        );
    }

    #[test]
    fn error_rendering_counts_characters_not_bytes() {
        let e = error("héllo wörld");
        assert_eq!(e.offset, 6);
        assert_eq!(e.column(), 6);
        assert_eq!(e.to_string().lines().nth(2), Some("       ^"));
    }

    #[test]
    fn error_rendering_shows_a_window_of_long_input() {
        let input = format!("{};{}", "x".repeat(200), "y".repeat(200));
        let e = error(&input);
        assert_eq!(e.column(), 201);
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("  ...x") && lines[1].ends_with("y..."));
        let caret = lines[2].len() - 1;
        assert_eq!(&lines[1][caret..caret + 1], ";");
        assert!(lines[1].len() < 100);
    }

    #[test]
    fn unicode_letters_are_host_characters() {
        assert_eq!(hosts("bücher[1-2]"), ["bücher1", "bücher2"]);
    }

    // --- Size cap --------------------------------------------------------

    #[test]
    fn huge_ranges_fail_fast() {
        let start = std::time::Instant::now();
        let e = error("n[1-999999999]");
        assert_eq!(
            (e.kind, e.offset),
            (ErrorKind::TooManyTargets(MAX_TARGETS), 0)
        );
        let e = error("web1,n[1-1000][1-1000][1-1000]");
        assert_eq!(
            (e.kind, e.offset),
            (ErrorKind::TooManyTargets(MAX_TARGETS), 5)
        );
        // The product overflows u64: still a clean error.
        let e = error("n[0-999999999999999999][0-999999999999999999][0-999999999999999999]");
        assert_eq!(e.kind, ErrorKind::TooManyTargets(MAX_TARGETS));
        let e = error("n[1-999999999999999999,1-999999999999999999]");
        assert_eq!(e.kind, ErrorKind::TooManyTargets(MAX_TARGETS));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(
            error("n[1-999999999]").kind.to_string(),
            "the node set expands to more than 1000000 hosts"
        );
    }

    #[test]
    fn custom_limit() {
        assert_eq!(
            parse_with_limit("n[1-10]", &no_groups, 10).unwrap().len(),
            10
        );
        let e = parse_with_limit("n[1-10]", &no_groups, 9).unwrap_err();
        assert_eq!((e.kind, e.offset), (ErrorKind::TooManyTargets(9), 0));
        let e = parse_with_limit("a,b,c", &no_groups, 2).unwrap_err();
        assert_eq!((e.kind, e.offset), (ErrorKind::TooManyTargets(2), 4));
        // Duplicates do not count twice.
        assert_eq!(
            parse_with_limit("a1,a1,a[1-1]", &no_groups, 1)
                .unwrap()
                .len(),
            1
        );
        let defs = [("g", "n[1-6]")];
        let groups = defined(&defs);
        assert_eq!(parse_with_limit("@g,@g,n3", &groups, 6).unwrap().len(), 6);
        let e = parse_with_limit("@g,m1", &groups, 6).unwrap_err();
        assert_eq!((e.kind, e.offset), (ErrorKind::TooManyTargets(6), 3));
        let e = parse_with_limit("m1,@g", &groups, 6).unwrap_err();
        assert_eq!((e.kind, e.offset), (ErrorKind::TooManyTargets(6), 3));
        let e = parse_with_limit("@g", &groups, 5).unwrap_err();
        assert_eq!(e.group.as_deref(), Some("g"));
    }

    // --- Groups ----------------------------------------------------------

    #[test]
    fn groups_expand_and_nest() {
        let defs = [
            ("web", "web[1-2]"),
            ("all", "@web,db1"),
            ("ops", "root@@all"),
        ];
        let groups = defined(&defs);
        let expanded: Vec<String> = parse("@all,web3", &groups)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(expanded, ["db1", "web1", "web2", "web3"]);
        let e = parse("@ops", &groups).unwrap_err();
        assert_eq!(e.kind, ErrorKind::GroupWithUserOrPort);
        assert_eq!(e.group.as_deref(), Some("ops"));
    }

    #[test]
    fn each_group_is_looked_up_once() {
        let calls = Cell::new(0);
        let groups = |name: &str| {
            calls.set(calls.get() + 1);
            match name {
                "a" => Some("a1,@b,@b".to_owned()),
                "b" => Some("b[1-3]".to_owned()),
                _ => None,
            }
        };
        assert_eq!(parse("@a,@b,@a", &groups).unwrap().len(), 4);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn unknown_group_inside_a_group() {
        let defs = [("all", "@web,@nope"), ("web", "w1")];
        let e = parse("x,@all", &defined(&defs)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownGroup("nope".into()));
        assert_eq!((e.input.as_str(), e.offset), ("@web,@nope", 5));
        assert_eq!(e.group.as_deref(), Some("all"));
        assert_eq!(
            e.to_string(),
            "bad node set in group @all at column 6: unknown group @nope\n  @web,@nope\n       ^"
        );
    }

    #[test]
    fn group_cycles() {
        let defs = [("a", "@b"), ("b", "x,@a")];
        let e = parse("@a", &defined(&defs)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::GroupCycle(strings(&["a", "b", "a"])));
        assert_eq!((e.input.as_str(), e.offset), ("x,@a", 2));
        assert_eq!(e.group.as_deref(), Some("b"));
        assert!(e.to_string().contains("group cycle: @a -> @b -> @a"));

        let defs = [("a", "a1,@a")];
        let e = parse("@a", &defined(&defs)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::GroupCycle(strings(&["a", "a"])));

        // A group used twice is not a cycle.
        let defs = [("a", "@b,@c"), ("b", "@c"), ("c", "c1")];
        assert_eq!(hosts_with("@a", &defs), ["c1"]);
    }

    fn hosts_with(input: &str, defs: &[(&str, &str)]) -> Vec<String> {
        parse(input, &defined(defs))
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn deeply_nested_groups_are_refused() {
        let names: Vec<String> = (0..=MAX_GROUP_DEPTH).map(|i| format!("g{i}")).collect();
        let groups = |name: &str| {
            let i: usize = name.strip_prefix('g')?.parse().ok()?;
            Some(if i + 1 < names.len() {
                format!("@g{}", i + 1)
            } else {
                "leaf".to_owned()
            })
        };
        let e = parse("@g0", &groups).unwrap_err();
        assert_eq!(e.kind, ErrorKind::GroupsTooDeep);
        // Exactly MAX_GROUP_DEPTH levels are fine.
        assert_eq!(parse("@g1", &groups).unwrap().len(), 1);
    }

    #[test]
    fn errors_inside_group_definitions() {
        let defs = [("web", "web[1-]"), ("empty", ""), ("outer", "@web")];
        let e = parse("@outer", &defined(&defs)).unwrap_err();
        assert_eq!(e.group.as_deref(), Some("web"));
        assert_eq!((e.input.as_str(), e.offset), ("web[1-]", 6));
        assert!(e
            .to_string()
            .starts_with("bad node set in group @web at column 7:"));
        let e = parse("@empty", &defined(&defs)).unwrap_err();
        assert_eq!(
            (e.kind, e.group.as_deref()),
            (ErrorKind::Empty, Some("empty"))
        );
    }

    // --- Exclusion -------------------------------------------------------

    #[test]
    fn exclusion_by_host_user_and_port() {
        let all = parse(
            "web[1-4],root@web3,web3:2222,alice@web2:22,root@web2",
            &no_groups,
        )
        .unwrap();
        let left = |x: &str| -> Vec<String> {
            let excluded = parse(x, &no_groups).unwrap();
            exclude(all.clone(), &excluded)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            left("web3"),
            ["web1", "web2", "web4", "alice@web2:22", "root@web2"]
        );
        assert_eq!(
            left("root@web[2-3]"),
            ["web1", "web2", "web3", "web4", "web3:2222", "alice@web2:22"]
        );
        assert_eq!(
            left("web2:22"),
            [
                "web1",
                "web2",
                "web3",
                "web4",
                "web3:2222",
                "root@web2",
                "root@web3"
            ]
        );
        assert_eq!(left("web[1-4]"), Vec::<String>::new());
        assert_eq!(left("web9").len(), all.len());
        assert!(Target::new("web1").is_excluded_by(&Target::new("web1")));
        assert!(!Target::new("web1").is_excluded_by(&Target::new("web01")));
    }

    // --- Folding ---------------------------------------------------------

    fn names(input: &str) -> Vec<String> {
        hosts(input)
    }

    #[test]
    fn fold_examples() {
        let web: Vec<String> = (1..=10).map(|i| format!("web{i:02}")).collect();
        assert_eq!(fold(&web), "web[01-10]");
        assert_eq!(fold(&["web9", "web10"]), "web[9-10]");
        assert_eq!(fold(&["web1", "web01"]), "web[1,01]");
        assert_eq!(fold(&names("web[01-07,09]")), "web[01-07,09]");
        assert_eq!(
            fold(&[
                "rack1-node1",
                "rack1-node2",
                "rack1-node3",
                "rack2-node1",
                "rack2-node2",
                "rack2-node3"
            ]),
            "rack[1-2]-node[1-3]"
        );
        assert_eq!(fold(&names("127.0.[1-2].[1-250]")), "127.0.[1-2].[1-250]");
        assert_eq!(
            fold(&names("root@db[1-3]:2222,web1")),
            "root@db[1-3]:2222,web1"
        );
        assert_eq!(fold(&["web1", "web3"]), "web[1,3]");
        assert_eq!(fold(&["web2"]), "web2");
        assert_eq!(fold(&["b", "a", "a"]), "a,b");
        assert_eq!(fold(&Vec::<String>::new()), "");
    }

    #[test]
    fn fold_zero_padding() {
        let cases: &[(&[&str], &str)] = &[
            (&["web9", "web09", "web10"], "web[9-10,09]"),
            (&["web08", "web09", "web10", "web11"], "web[08-11]"),
            (&["web08", "web100"], "web[08,100]"),
            (&["n0", "n00", "n000"], "n[0,00,000]"),
            (&["n098", "n099", "n100"], "n[098-100]"),
            (&["n09", "n10", "n099", "n100"], "n[09-10,099-100]"),
            (&["n1", "n01", "n2", "n02", "n10"], "n[1-2,01-02,10]"),
            (&["n007"], "n007"),
            (&["n1", "n10", "n100"], "n[1,10,100]"),
        ];
        for (input, folded) in cases {
            assert_eq!(fold(input), *folded, "{input:?}");
            assert_round_trip(input);
        }
    }

    #[test]
    fn fold_partial_boxes() {
        assert_eq!(
            fold(&names("rack1-node[1-3],rack2-node[1-2]")),
            "rack1-node[1-3],rack2-node[1-2]"
        );
        assert_eq!(
            fold(&names("rack[1-2]-node[1-3],rack3-node1")),
            "rack[1-2]-node[1-3],rack3-node1"
        );
        assert_eq!(fold(&names("a[1-3]b[1-3]c[1-3]")), "a[1-3]b[1-3]c[1-3]");
    }

    #[test]
    fn fold_users_ports_and_ipv6() {
        assert_eq!(
            fold(&[
                "web1:22",
                "web2:22",
                "root@web1",
                "web1",
                "web2",
                "root@web2"
            ]),
            "web[1-2],web[1-2]:22,root@web[1-2]"
        );
        assert_eq!(
            fold(&["[::1]:22", "::1", "fe80::2", "[fe80::1]", "web1"]),
            "web1,::1,[::1]:22,fe80::1,fe80::2"
        );
        assert_round_trip(&["[::1]:22", "root@::1", "fe80::1%eth0", "[fe80::1%eth0]:2"]);
    }

    #[test]
    fn fold_keeps_names_that_are_not_one_target() {
        assert_eq!(
            fold(&["web1", "bad host", "web2", "", "web[3-4]"]),
            "web[1-2],bad host,web[3-4]"
        );
    }

    #[test]
    fn fold_leaves_long_digit_runs_alone() {
        let input = [
            "a1234567890123456789",
            "a1234567890123456790",
            "b123456789012345678",
            "b123456789012345679",
        ];
        assert_eq!(
            fold(&input),
            "a1234567890123456789,a1234567890123456790,b[123456789012345678-123456789012345679]"
        );
        assert_round_trip(&input);
    }

    #[test]
    fn fold_targets_matches_fold() {
        let targets = parse("root@db[1-3]:2222,web[01-10],[::1]:22", &no_groups).unwrap();
        let displayed: Vec<String> = targets.iter().map(ToString::to_string).collect();
        assert_eq!(fold_targets(&targets), fold(&displayed));
        assert_eq!(fold_targets(&[]), "");
    }

    fn assert_round_trip(names: &[impl AsRef<str>]) {
        let folded = fold(names);
        let mut expected: Vec<Target> = names
            .iter()
            .map(|n| parse_one(n.as_ref()).unwrap_or_else(|| panic!("{}", n.as_ref())))
            .collect();
        sort_canonical(&mut expected);
        assert_eq!(parse(&folded, &no_groups).unwrap(), expected, "{folded}");
    }

    // --- Files -----------------------------------------------------------

    const GROUPS: &str = "\
# skiff groups
web: web[01-03]   # front ends
db: root@db[1-2]:2222

all: @web,@db,other
later: @defined_below
defined_below: x1
";

    #[test]
    fn groups_file() {
        let groups = parse_groups_file(GROUPS, "groups").unwrap();
        assert_eq!(groups.len(), 5);
        assert!(!groups.is_empty());
        assert_eq!(groups.get("web"), Some("web[01-03]"));
        assert_eq!(groups.line("db"), Some(3));
        assert_eq!(groups.get("nope"), None);
        assert_eq!(
            groups.names().collect::<Vec<_>>(),
            ["all", "db", "defined_below", "later", "web"]
        );
        let all = parse("@all", &|n| groups.lookup(n)).unwrap();
        assert_eq!(fold_targets(&all), "root@db[1-2]:2222,other,web[01-03]");
        assert!(parse_groups_file("", "g").unwrap().is_empty());
        assert!(parse_groups_file("# only\n\n", "g").unwrap().is_empty());
    }

    fn groups_error(text: &str) -> GroupsError {
        parse_groups_file(text, "groups").expect_err(text)
    }

    #[test]
    fn groups_file_line_errors() {
        let cases = [
            (
                "a: x\nno colon here\n",
                "groups:2: expected 'name: node set', found \"no colon here\"",
            ),
            (
                "we b: x",
                "groups:1: invalid group name \"we b\" (use letters, digits, '.', '_' and '-')",
            ),
            (
                ": x",
                "groups:1: invalid group name \"\" (use letters, digits, '.', '_' and '-')",
            ),
            (
                "-a: x",
                "groups:1: invalid group name \"-a\" (use letters, digits, '.', '_' and '-')",
            ),
            (
                "a: x\n\na: y",
                "groups:3: group @a is already defined on line 1",
            ),
            ("a:   # nothing", "groups:1: group @a has no hosts"),
        ];
        for (text, message) in cases {
            assert_eq!(groups_error(text).to_string(), message, "{text:?}");
        }
    }

    #[test]
    fn groups_file_node_set_errors_point_into_the_line() {
        let e = groups_error("ok: x\nweb:  web[1-]  # broken\n");
        let GroupsError::NodeSet { line, error, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*line, 2);
        assert_eq!(error.input, "web:  web[1-]  # broken");
        assert_eq!(error.offset, 12);
        assert_eq!(
            e.to_string(),
            "groups:2: bad node set at column 13: expected a number after '-'\n  web:  web[1-]  # broken\n              ^"
        );

        let e = groups_error("a: x,@b\nb: @nope");
        let GroupsError::NodeSet { line, error, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!((*line, error.offset), (2, 3));
        assert_eq!(error.kind, ErrorKind::UnknownGroup("nope".into()));
    }

    #[test]
    fn groups_file_cycles_and_depth() {
        let e = groups_error("a: @b\nb: x,@c\nc: @a\n");
        let GroupsError::NodeSet { line, error, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*line, 3);
        assert_eq!(
            error.kind,
            ErrorKind::GroupCycle(strings(&["a", "b", "c", "a"]))
        );
        assert_eq!(error.offset, 3);

        let e = groups_error("a: a1,@a");
        assert!(e.to_string().contains("group cycle: @a -> @a"), "{e}");

        // A diamond is fine.
        assert!(parse_groups_file("a: @b,@c\nb: @d\nc: @d\nd: d1", "g").is_ok());

        let mut deep: String = (0..MAX_GROUP_DEPTH)
            .map(|i| format!("g{i}: @g{}\n", i + 1))
            .collect();
        deep.push_str(&format!("g{MAX_GROUP_DEPTH}: leaf\n"));
        let e = groups_error(&deep);
        assert_eq!(
            e.to_string(),
            format!("groups:1: group @g0 nests groups more than {MAX_GROUP_DEPTH} deep")
        );
        // One level less loads and expands.
        let ok = parse_groups_file(deep.split_once('\n').unwrap().1, "g").unwrap();
        assert_eq!(
            parse("@g1", &|n| ok.lookup(n)).unwrap(),
            [Target::new("leaf")]
        );
    }

    #[test]
    fn hosts_file() {
        let groups = parse_groups_file(GROUPS, "groups").unwrap();
        let text = "# targets\nweb[1-2]\n\n  root@db1:22   # primary\r\n@db\nweb1\n";
        let targets = parse_hosts_file(text, "hosts", &|n| groups.lookup(n)).unwrap();
        assert_eq!(
            fold_targets(&targets),
            "root@db1:22,root@db[1-2]:2222,web[1-2]"
        );
    }

    #[test]
    fn hosts_file_errors() {
        let e = parse_hosts_file("web1\n  web[5-1]  # x\n", "hosts", &no_groups).unwrap_err();
        let HostsFileError::NodeSet { line, error, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!((*line, error.offset), (2, 6));
        assert_eq!(
            e.to_string(),
            "hosts:2: bad node set at column 7: reversed range 5-1 (write the smaller number first)\n    web[5-1]  # x\n        ^"
        );

        let e = parse_hosts_file("# nothing\n\n   \n", "hosts", &no_groups).unwrap_err();
        assert_eq!(e.to_string(), "hosts: no hosts in the file");
        assert!(matches!(e, HostsFileError::Empty { .. }));

        // An error inside a group keeps pointing into the group's definition.
        let defs = [("g", "a,,b")];
        let e = parse_hosts_file("x\n@g\n", "hosts", &defined(&defs)).unwrap_err();
        let HostsFileError::NodeSet { line, error, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!((*line, error.input.as_str(), error.offset), (2, "a,,b", 2));
        assert_eq!(error.group.as_deref(), Some("g"));
    }

    // --- Properties ------------------------------------------------------

    /// A number written with 0 to 3 digits of zero padding.
    fn number() -> impl Strategy<Value = String> {
        (0u64..130, 0usize..4).prop_map(|(v, w)| format!("{v:0w$}"))
    }

    fn host() -> impl Strategy<Value = String> {
        let prefix = prop::sample::select(vec!["web", "db", "rack", "n", "", "10.0.", "x-"]);
        let second = prop::option::of((prop::sample::select(vec!["-node", ".", "x"]), number()));
        let name = (prefix, number(), second).prop_map(|(p, n, second)| match second {
            Some((sep, m)) => format!("{p}{n}{sep}{m}"),
            None => format!("{p}{n}"),
        });
        let ipv6 = prop::sample::select(vec!["::1", "fe80::1", "fe80::2"]).prop_map(str::to_owned);
        prop_oneof![8 => name, 1 => ipv6]
    }

    fn target_name() -> impl Strategy<Value = String> {
        let user = prop::sample::select(vec![None, Some("root"), Some("alice")]);
        let port = prop::sample::select(vec![None, Some(22u16), Some(2222)]);
        (user, host(), port).prop_map(|(user, host, port)| {
            Target {
                user: user.map(str::to_owned),
                host,
                port,
            }
            .to_string()
        })
    }

    fn name_sets() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(target_name(), 1..40)
    }

    proptest! {
        #[test]
        fn fold_round_trips(names in name_sets()) {
            let folded = fold(&names);
            let mut expected: Vec<Target> = names.iter().map(|n| parse_one(n).unwrap()).collect();
            sort_canonical(&mut expected);
            let again = parse(&folded, &no_groups);
            prop_assert_eq!(again, Ok(expected), "{}", folded);
        }

        #[test]
        fn fold_ignores_order_and_repeats(
            (names, shuffled) in name_sets().prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
        ) {
            let mut repeated = shuffled.clone();
            repeated.extend(shuffled.iter().take(3).cloned());
            prop_assert_eq!(fold(&names), fold(&repeated));
        }

        #[test]
        fn fold_of_expansion_is_stable(names in name_sets()) {
            let folded = fold(&names);
            let expanded = parse(&folded, &no_groups).unwrap();
            prop_assert_eq!(fold_targets(&expanded), folded.clone());
            let displayed: Vec<String> = expanded.iter().map(ToString::to_string).collect();
            prop_assert_eq!(fold(&displayed), folded);
        }

        #[test]
        fn parse_output_is_sorted_and_unique(names in name_sets()) {
            let targets = parse(&names.join(","), &no_groups).unwrap();
            prop_assert!(targets.windows(2).all(|w| w[0] < w[1]));
        }

        #[test]
        fn arbitrary_text_never_panics(text in "[a-c0-9\\[\\]:,@/%.\\- ]{0,24}") {
            match parse_with_limit(&text, &no_groups, 1000) {
                Ok(targets) => {
                    let folded = fold_targets(&targets);
                    prop_assert_eq!(parse(&folded, &no_groups).unwrap(), targets);
                }
                Err(e) => {
                    prop_assert!(e.offset <= e.input.len());
                    let _ = (e.to_string(), e.one_line());
                }
            }
        }
    }
}
