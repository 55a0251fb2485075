//! `PerSourcePenalties` and `PerSourcePenaltyExemptList`, as in sshd 9.8
//! and later: a source network (`PerSourceNetBlockSize`, see
//! [`crate::startups::NetBlock`]) whose connections misbehave (fail to
//! authenticate, exceed `LoginGraceTime`, never try, crash the server)
//! earns a penalty, and while penalised its new connections are refused at
//! accept. Penalties from one network add up to `max`; none is enforced
//! before it reaches `min`. The table holds at most `max-sources4` IPv4
//! and `max-sources6` IPv6 networks; when one is full, `overflow` says
//! whether the soonest-expiring penalty makes room (`permissive`) or every
//! new connection of that family is refused until one expires
//! (`deny-all`). Pure: the listener supplies the clock and the outcomes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::startups::NetBlock;

/// What a connection did to earn a penalty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offence {
    /// The server's work for it failed unexpectedly (a panic).
    Crash,
    /// It ended after one or more failed authentication attempts.
    AuthFail,
    /// It ended after a wrong password or keyboard-interactive answer
    /// (skiffd's own: password guessing costs more than a wrong key).
    PasswordFail,
    /// It ended without attempting authentication.
    NoAuth,
    /// It did not authenticate within `LoginGraceTime`.
    GraceExceeded,
    /// sshd's `RefuseConnection` (which skiffd does not have) refused it.
    RefuseConnection,
}

impl Offence {
    /// The penalty a connection's process reports it earned (`None`: none).
    pub fn of(verdict: skiff_proto::worker_wire::Verdict) -> Option<Offence> {
        use skiff_proto::worker_wire::Verdict;
        match verdict {
            Verdict::Clean => None,
            Verdict::NoAuth => Some(Offence::NoAuth),
            Verdict::AuthFail => Some(Offence::AuthFail),
            Verdict::PasswordFail => Some(Offence::PasswordFail),
            Verdict::GraceExceeded => Some(Offence::GraceExceeded),
        }
    }
}

/// What to do when a family's table is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Refuse every new connection of the family until a penalty expires.
    DenyAll,
    /// Make room by dropping the penalty that expires soonest.
    Permissive,
}

/// The penalty durations and the table's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PenaltyPolicy {
    pub crash: Duration,
    pub authfail: Duration,
    /// skiffd's `passwordfail`: a connection that ended after a wrong
    /// password or keyboard-interactive answer.
    pub passwordfail: Duration,
    pub noauth: Duration,
    pub grace_exceeded: Duration,
    pub refuse_connection: Duration,
    /// The longest a network is refused for, however many penalties.
    pub max: Duration,
    /// Penalties below this are recorded but not enforced.
    pub min: Duration,
    pub max_sources4: usize,
    pub max_sources6: usize,
    pub overflow4: Overflow,
    pub overflow6: Overflow,
}

impl Default for PenaltyPolicy {
    /// sshd's defaults.
    fn default() -> Self {
        PenaltyPolicy {
            crash: Duration::from_secs(90),
            authfail: Duration::from_secs(5),
            passwordfail: PASSWORD_FAIL,
            noauth: Duration::from_secs(1),
            grace_exceeded: Duration::from_secs(10),
            refuse_connection: Duration::from_secs(10),
            max: Duration::from_secs(600),
            min: Duration::from_secs(15),
            max_sources4: 65536,
            max_sources6: 65536,
            overflow4: Overflow::Permissive,
            overflow6: Overflow::Permissive,
        }
    }
}

/// The penalty for a connection that ended after a wrong password: enough
/// that a source can try passwords only once or twice a minute.
pub const PASSWORD_FAIL: Duration = Duration::from_secs(30);

/// Counts what a connection's authentication requests earned: refusals,
/// and among them wrong passwords and keyboard-interactive answers.
#[derive(Debug, Default)]
pub struct FailureCount {
    pub refused: std::sync::atomic::AtomicUsize,
    pub passwords: std::sync::atomic::AtomicUsize,
}

impl FailureCount {
    pub fn any(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    pub fn password(&self) -> bool {
        self.passwords.load(std::sync::atomic::Ordering::Relaxed) > 0
    }
}

/// The most networks of one family the table may be told to hold.
pub const MAX_SOURCES_LIMIT: usize = 1 << 20;

impl PenaltyPolicy {
    /// The policy skiffd applies when `PerSourcePenalties` is not set and
    /// passwords are offered: wrong passwords only, at once (no `min`).
    pub fn password_guessing() -> PenaltyPolicy {
        PenaltyPolicy {
            crash: Duration::ZERO,
            authfail: Duration::ZERO,
            passwordfail: PASSWORD_FAIL,
            noauth: Duration::ZERO,
            grace_exceeded: Duration::ZERO,
            refuse_connection: Duration::ZERO,
            min: Duration::ZERO,
            ..PenaltyPolicy::default()
        }
    }

    /// Parses the words after `PerSourcePenalties`: `no` (`None`: off),
    /// `yes` (the defaults), or `NAME:VALUE` words over the defaults.
    pub fn parse(args: &[&str]) -> Result<Option<PenaltyPolicy>, String> {
        match args {
            [] => return Err("PerSourcePenalties needs no, yes or NAME:VALUE words".into()),
            [v] if v.eq_ignore_ascii_case("no") => return Ok(None),
            [v] if v.eq_ignore_ascii_case("yes") => return Ok(Some(PenaltyPolicy::default())),
            _ => {}
        }
        let mut p = PenaltyPolicy::default();
        let mut overflow6 = None;
        for word in args {
            let (name, value) = word.split_once(':').ok_or_else(|| {
                format!("PerSourcePenalties {word:?}: expected NAME:VALUE (e.g. authfail:5s)")
            })?;
            let duration = || {
                crate::config::parse_duration(value)
                    .map_err(|e| format!("PerSourcePenalties {name}: {e}"))
            };
            let sources = || {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SOURCES_LIMIT).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "PerSourcePenalties {name}: expected a number from 1 to {MAX_SOURCES_LIMIT}, not {value:?}"
                        )
                    })
            };
            let overflow = || match value {
                "deny-all" => Ok(Overflow::DenyAll),
                "permissive" => Ok(Overflow::Permissive),
                _ => Err(format!(
                    "PerSourcePenalties {name}: expected deny-all or permissive, not {value:?}"
                )),
            };
            match name {
                "crash" => p.crash = duration()?,
                "authfail" => p.authfail = duration()?,
                "passwordfail" => p.passwordfail = duration()?,
                "noauth" => p.noauth = duration()?,
                "grace-exceeded" => p.grace_exceeded = duration()?,
                "refuseconnection" => p.refuse_connection = duration()?,
                "max" => p.max = duration()?,
                "min" => p.min = duration()?,
                "max-sources4" => p.max_sources4 = sources()?,
                "max-sources6" => p.max_sources6 = sources()?,
                "overflow" => p.overflow4 = overflow()?,
                "overflow6" => overflow6 = Some(overflow()?),
                _ => {
                    return Err(format!(
                        "PerSourcePenalties: unknown penalty {name:?} (crash, authfail, passwordfail, noauth, \
                         grace-exceeded, refuseconnection, max, min, max-sources4, \
                         max-sources6, overflow, overflow6)"
                    ))
                }
            }
        }
        // overflow6 follows overflow unless given.
        p.overflow6 = overflow6.unwrap_or(p.overflow4);
        Ok(Some(p))
    }

    fn duration(&self, offence: Offence) -> Duration {
        match offence {
            Offence::Crash => self.crash,
            Offence::AuthFail => self.authfail,
            Offence::PasswordFail => self.passwordfail,
            Offence::NoAuth => self.noauth,
            Offence::GraceExceeded => self.grace_exceeded,
            Offence::RefuseConnection => self.refuse_connection,
        }
    }
}

/// Parses `PerSourcePenaltyExemptList`: comma-separated address patterns
/// (`*` and `?` wildcards, `!` negation) and CIDR blocks.
pub fn parse_exempt_list(value: &str) -> Result<Vec<String>, String> {
    let mut list = Vec::new();
    for entry in value.split(',') {
        let bare = entry.strip_prefix('!').unwrap_or(entry);
        let bad = || format!("PerSourcePenaltyExemptList: bad entry {entry:?}");
        if bare.is_empty() {
            return Err(bad());
        }
        if let Some((addr, bits)) = bare.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let bits: u8 = bits.parse().map_err(|_| bad())?;
            if bits > if addr.is_ipv4() { 32 } else { 128 } {
                return Err(bad());
            }
        }
        list.push(entry.to_string());
    }
    Ok(list)
}

/// Whether a new connection may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// Its network is penalised for `left` more; `log` is true the first
    /// time this penalty refuses a connection.
    Penalised {
        network: IpAddr,
        left: Duration,
        log: bool,
    },
    /// The family's table is full (`overflow deny-all`); `log` as above.
    Overflow {
        log: bool,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    expires: Instant,
    /// The penalty has reached `min`.
    active: bool,
    /// A refusal under it has been logged.
    logged: bool,
}

/// The penalties in force, by source network.
#[derive(Debug)]
pub struct Penalties {
    policy: PenaltyPolicy,
    block: NetBlock,
    /// `PerSourcePenaltyExemptList` patterns (addresses, `*`, CIDR).
    exempt: Vec<String>,
    v4: HashMap<IpAddr, Entry>,
    v6: HashMap<IpAddr, Entry>,
    /// A full table under `deny-all`, and whether that was logged.
    v4_overflow: Option<bool>,
    v6_overflow: Option<bool>,
}

impl Penalties {
    pub fn new(policy: PenaltyPolicy, block: NetBlock, exempt: Vec<String>) -> Penalties {
        Penalties {
            policy,
            block,
            exempt,
            v4: HashMap::new(),
            v6: HashMap::new(),
            v4_overflow: None,
            v6_overflow: None,
        }
    }

    fn exempt(&self, peer: IpAddr) -> bool {
        !self.exempt.is_empty()
            && skiff_proto::authorized_keys::from_allows(&self.exempt, peer, None)
    }

    /// The family's table, its limit, overflow mode and overflow state.
    fn family(
        &mut self,
        network: IpAddr,
    ) -> (
        &mut HashMap<IpAddr, Entry>,
        usize,
        Overflow,
        &mut Option<bool>,
    ) {
        if network.is_ipv4() {
            let p = &self.policy;
            (
                &mut self.v4,
                p.max_sources4,
                p.overflow4,
                &mut self.v4_overflow,
            )
        } else {
            let p = &self.policy;
            (
                &mut self.v6,
                p.max_sources6,
                p.overflow6,
                &mut self.v6_overflow,
            )
        }
    }

    /// Whether a connection from `peer` may go on at `now`.
    pub fn admit(&mut self, peer: IpAddr, now: Instant) -> Admission {
        if self.exempt(peer) {
            return Admission::Admit;
        }
        let network = self.block.network(peer);
        let (table, limit, _, overflow) = self.family(network);
        if let Some(logged) = overflow {
            table.retain(|_, e| e.expires > now);
            if table.len() >= limit {
                let log = !*logged;
                *logged = true;
                return Admission::Overflow { log };
            }
            *overflow = None;
        }
        match table.get_mut(&network) {
            Some(e) if e.expires <= now => {
                table.remove(&network);
                Admission::Admit
            }
            Some(e) if e.active => {
                let log = !e.logged;
                e.logged = true;
                Admission::Penalised {
                    network,
                    left: e.expires - now,
                    log,
                }
            }
            _ => Admission::Admit,
        }
    }

    /// Records that a connection from `peer` ended with `offence` at `now`.
    pub fn penalise(&mut self, peer: IpAddr, offence: Offence, now: Instant) {
        let amount = self.policy.duration(offence);
        if amount.is_zero() || self.exempt(peer) {
            return;
        }
        let (max, min) = (self.policy.max, self.policy.min);
        let network = self.block.network(peer);
        let (table, limit, mode, overflow) = self.family(network);
        let cap = now + max;
        if let Some(e) = table.get_mut(&network) {
            // Adds to a penalty still running; one that has run out starts
            // again.
            let base = if e.expires > now { e.expires } else { now };
            e.expires = (base + amount).min(cap);
            if !e.active && e.expires - now >= min {
                e.active = true;
                e.logged = false;
            }
            return;
        }
        if table.len() >= limit {
            table.retain(|_, e| e.expires > now);
        }
        if table.len() >= limit {
            match mode {
                Overflow::DenyAll => {
                    overflow.get_or_insert(false);
                    return;
                }
                Overflow::Permissive => {
                    let soonest = table.iter().min_by_key(|(_, e)| e.expires).map(|(n, _)| *n);
                    if let Some(n) = soonest {
                        table.remove(&n);
                    }
                }
            }
        }
        let expires = now + amount.min(max);
        table.insert(
            network,
            Entry {
                expires,
                active: expires - now >= min,
                logged: false,
            },
        );
    }

    /// How many networks the tables hold (IPv4, IPv6).
    pub fn tracked(&self) -> (usize, usize) {
        (self.v4.len(), self.v6.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(line: &str) -> PenaltyPolicy {
        let words: Vec<&str> = line.split_whitespace().collect();
        PenaltyPolicy::parse(&words).unwrap().unwrap()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn refused(p: &mut Penalties, peer: &str, now: Instant) -> bool {
        p.admit(ip(peer), now) != Admission::Admit
    }

    #[test]
    fn parsing() {
        assert_eq!(PenaltyPolicy::parse(&["no"]), Ok(None));
        assert_eq!(
            PenaltyPolicy::parse(&["yes"]),
            Ok(Some(PenaltyPolicy::default()))
        );
        let p = policy("authfail:1m crash:2m max:1h min:0 max-sources4:10 overflow:deny-all");
        assert_eq!(
            (p.authfail, p.crash, p.max, p.min),
            (secs(60), secs(120), secs(3600), secs(0))
        );
        assert_eq!(p.max_sources4, 10);
        assert_eq!(p.max_sources6, 65536);
        assert_eq!(
            (p.overflow4, p.overflow6),
            (Overflow::DenyAll, Overflow::DenyAll)
        );
        let p = policy("overflow:deny-all overflow6:permissive noauth:0 grace-exceeded:20s refuseconnection:3s");
        assert_eq!(
            (p.overflow4, p.overflow6),
            (Overflow::DenyAll, Overflow::Permissive)
        );
        assert_eq!(
            (p.noauth, p.grace_exceeded, p.refuse_connection),
            (secs(0), secs(20), secs(3))
        );
        for bad in [
            &[][..],
            &["authfail"],
            &["authfail:x"],
            &["bogus:5s"],
            &["max-sources4:0"],
            &["max-sources6:99999999"],
            &["overflow:maybe"],
            &["no", "authfail:5s"],
        ] {
            assert!(PenaltyPolicy::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exempt_lists() {
        assert_eq!(
            parse_exempt_list("127.0.0.1,10.0.0.0/8,::1,192.168.*").unwrap(),
            ["127.0.0.1", "10.0.0.0/8", "::1", "192.168.*"]
        );
        for bad in ["", "a,,b", "10.0.0.0/33", "x/8", "::/129"] {
            assert!(parse_exempt_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn penalties_add_up_to_max_and_are_enforced_from_min() {
        let t0 = Instant::now();
        let mut p = Penalties::new(
            policy("authfail:5s min:15s max:20s"),
            NetBlock::default(),
            vec![],
        );
        p.penalise(ip("192.0.2.1"), Offence::AuthFail, t0);
        p.penalise(ip("192.0.2.1"), Offence::AuthFail, t0);
        // 10 s: below min, not enforced.
        assert!(!refused(&mut p, "192.0.2.1", t0));
        p.penalise(ip("192.0.2.1"), Offence::AuthFail, t0);
        // 15 s: enforced, logged once.
        assert_eq!(
            p.admit(ip("192.0.2.1"), t0),
            Admission::Penalised {
                network: ip("192.0.2.1"),
                left: secs(15),
                log: true
            }
        );
        assert!(matches!(
            p.admit(ip("192.0.2.1"), t0),
            Admission::Penalised { log: false, .. }
        ));
        // Another address is not affected.
        assert!(!refused(&mut p, "192.0.2.2", t0));
        // Capped at max.
        for _ in 0..10 {
            p.penalise(ip("192.0.2.1"), Offence::AuthFail, t0);
        }
        assert!(refused(&mut p, "192.0.2.1", t0 + secs(19)));
        assert!(!refused(&mut p, "192.0.2.1", t0 + secs(20)));
        assert_eq!(p.tracked(), (0, 0), "an expired penalty is dropped");
    }

    #[test]
    fn net_blocks_exemptions_and_zero_penalties() {
        let t0 = Instant::now();
        let block = NetBlock::parse("24:64").unwrap();
        let exempt = vec!["10.9.9.0/24".to_string(), "2001:db8::1".to_string()];
        let mut p = Penalties::new(policy("authfail:30s noauth:0"), block, exempt);
        p.penalise(ip("10.0.0.1"), Offence::AuthFail, t0);
        assert!(refused(&mut p, "10.0.0.200", t0), "same /24");
        assert!(!refused(&mut p, "10.0.1.1", t0));
        // Exempt sources are neither penalised nor refused.
        p.penalise(ip("10.9.9.9"), Offence::AuthFail, t0);
        assert!(!refused(&mut p, "10.9.9.9", t0));
        p.penalise(ip("2001:db8::2"), Offence::AuthFail, t0);
        assert!(refused(&mut p, "2001:db8::ffff", t0), "same /64");
        assert!(
            !refused(&mut p, "2001:db8::1", t0),
            "exempt address in the penalised /64"
        );
        // A zero penalty records nothing.
        p.penalise(ip("10.0.5.5"), Offence::NoAuth, t0);
        assert!(!refused(&mut p, "10.0.5.5", t0));
        assert_eq!(p.tracked(), (1, 1));
        // IPv4 in IPv6 counts as IPv4.
        assert!(refused(&mut p, "::ffff:10.0.0.7", t0));
    }

    #[test]
    fn a_full_table_overflows_as_configured() {
        let t0 = Instant::now();
        let line = "authfail:30s min:0 max-sources4:2 max-sources6:1 overflow:deny-all overflow6:permissive";
        let mut p = Penalties::new(policy(line), NetBlock::default(), vec!["192.0.2.99".into()]);
        p.penalise(ip("192.0.2.1"), Offence::AuthFail, t0);
        p.penalise(ip("192.0.2.2"), Offence::AuthFail, t0 + secs(1));
        p.penalise(ip("192.0.2.3"), Offence::AuthFail, t0 + secs(2));
        assert_eq!(p.tracked().0, 2, "bounded");
        // deny-all: every IPv4 source but the exempt one, logged once.
        assert_eq!(
            p.admit(ip("198.51.100.1"), t0 + secs(2)),
            Admission::Overflow { log: true }
        );
        assert_eq!(
            p.admit(ip("198.51.100.2"), t0 + secs(2)),
            Admission::Overflow { log: false }
        );
        assert!(!refused(&mut p, "192.0.2.99", t0 + secs(2)));
        // IPv6 is separate.
        assert!(!refused(&mut p, "2001:db8::1", t0 + secs(2)));
        // Once the first penalty runs out, the table has room again.
        assert!(!refused(&mut p, "198.51.100.1", t0 + secs(30)));
        assert!(refused(&mut p, "192.0.2.2", t0 + secs(30)));
        // permissive: the soonest to expire makes room.
        p.penalise(ip("2001:db8::1"), Offence::AuthFail, t0);
        p.penalise(ip("2001:db8::2"), Offence::AuthFail, t0 + secs(1));
        assert_eq!(p.tracked().1, 1);
        assert!(!refused(&mut p, "2001:db8::1", t0 + secs(1)));
        assert!(refused(&mut p, "2001:db8::2", t0 + secs(1)));
    }
}
