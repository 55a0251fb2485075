//! Servers that close connections before authentication because too many
//! are authenticating at once: sshd's and skiffd's `MaxStartups`, a busy
//! bastion. [`crate::connect`] reports such a close as [`ErrorKind::Busy`].
//! A fan-out (`skiff run`, `skiff cp` to a node set) then does two things:
//!
//! - it tries that host again after a short pause, doubled after each drop
//!   and jittered, so that hosts dropped together do not all come back
//!   together; a few times ([`PRE_AUTH_DROPS`]), never past the host's
//!   `ConnectTimeout` counted from its first try
//!   ([`retry_pre_auth_drops`]);
//! - it lets fewer of its connections be on their way to authentication at
//!   once ([`Gate`]), about as many as were getting through, so that `-j`
//!   far above a server's `MaxStartups` settles near it instead of having
//!   most tries dropped (the tries alone would run out long before a few
//!   hundred hosts got through ten places).
//!
//! A single connection (`skiff exec`) tries once, as ssh does. Nothing else
//! is tried again: a refused TCP connection (nothing listens), a name that
//! does not resolve, a refused host key or login are answers, not a crowd.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{ErrorKind, SkiffError};
use crate::settings::ConnectSettings;

/// How often, and after which pauses, a dropped connection is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Tries in all, the first included.
    pub tries: u32,
    /// The pause after the first drop, before jitter; each later one is
    /// twice the one before.
    pub first: Duration,
    /// The longest pause, before jitter.
    pub cap: Duration,
    /// Time the next try must have before the deadline once its pause is
    /// over; with less left, the drop is reported instead.
    pub min_try: Duration,
}

/// Pre-authentication drops in a fan-out: at most 6 tries, after pauses of
/// about 50, 100, 200, 400 and 800 ms, each between half and one and a
/// half times that.
pub const PRE_AUTH_DROPS: Backoff = Backoff {
    tries: 6,
    first: Duration::from_millis(50),
    cap: Duration::from_secs(1),
    min_try: Duration::from_secs(1),
};

impl Backoff {
    /// The pause after `failed` failed tries (1 or more), jittered by
    /// `unit` (from `[0, 1)`: 0 halves the pause, towards 1 it is one and
    /// a half times as long). `None` when no try is left.
    pub fn pause(&self, failed: u32, unit: f64) -> Option<Duration> {
        if failed == 0 || failed >= self.tries {
            return None;
        }
        let doubling = 1u32.checked_shl(failed - 1).unwrap_or(u32::MAX);
        let nominal = self.first.saturating_mul(doubling).min(self.cap);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        Some(nominal.mul_f64(0.5 + unit))
    }

    /// The pause before the next try, at `now`, after `failed` failed
    /// tries: `None` when no try is left or the next one would not have
    /// [`Backoff::min_try`] before `deadline`.
    pub fn next(
        &self,
        failed: u32,
        unit: f64,
        now: Instant,
        deadline: Instant,
    ) -> Option<Duration> {
        let pause = self.pause(failed, unit)?;
        (now + pause + self.min_try <= deadline).then_some(pause)
    }
}

/// Runs `attempt` with `settings`, and again after the pauses of
/// [`PRE_AUTH_DROPS`] while it fails with [`ErrorKind::Busy`] and the
/// host's `ConnectTimeout`, counted from the first try, leaves room. A
/// later try gets what is left of that time as its `ConnectTimeout`. The
/// last drop's message says how many tries were made.
///
/// Only for work that fails as `Busy` before anything has run on the
/// server: connecting, or a command or copy whose connection could not be
/// made. Every other outcome is returned as it is.
pub async fn retry_pre_auth_drops<T, F, Fut>(
    settings: &ConnectSettings,
    mut attempt: F,
) -> Result<T, SkiffError>
where
    F: FnMut(ConnectSettings) -> Fut,
    Fut: Future<Output = Result<T, SkiffError>>,
{
    let start = Instant::now();
    let deadline = start + settings.connect_timeout;
    let mut this_try = settings.clone();
    let mut failed = 0;
    loop {
        let dropped = match attempt(this_try.clone()).await {
            Err(e) if e.kind == ErrorKind::Busy => e,
            done => return done,
        };
        failed += 1;
        let Some(pause) = PRE_AUTH_DROPS.next(failed, rand::random(), Instant::now(), deadline)
        else {
            if failed == 1 {
                return Err(dropped);
            }
            return Err(SkiffError {
                message: format!(
                    "{}; tried {failed} times in {:.1}s",
                    dropped.message,
                    start.elapsed().as_secs_f64()
                ),
                ..dropped
            });
        };
        tracing::debug!(
            "{}: closed before authentication (try {failed}); trying again in {} ms",
            settings.hostname,
            pause.as_millis()
        );
        tokio::time::sleep(pause).await;
        this_try.connect_timeout = deadline.saturating_duration_since(Instant::now());
    }
}

/// How many connections of one fan-out may be on their way to
/// authentication at once: from the start of the TCP connection (when a
/// server starts counting it against `MaxStartups`) until it has
/// authenticated or failed.
///
/// Unlimited until a server closes one of them before authentication. The
/// limit is then the number of this fan-out's connections that were ahead
/// of the dropped one (entered before it and not yet through): what the
/// server let in before it turned this one away (at least one). A later
/// drop may lower it further. Once as many connections have authenticated
/// since as the limit allows, each further one raises it by one: against a
/// server that is full this finds its room again at the cost of about one
/// drop per round, and after drops from one host that refuses everyone
/// the fan-out soon has its width back.
///
/// Shared by every host of a fan-out through its settings
/// ([`crate::settings::Resolver::for_fan_out`]), and by the connections
/// the agent makes for one client process
/// ([`crate::settings::Resolver::sharing_pre_auth_gate`]); jump hosts'
/// connections do not pass through it (they are made inside their
/// destination's place).
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    /// Woken when a connection leaves or the limit rises.
    room: Notify,
}

#[derive(Debug, Default)]
struct GateState {
    /// `None`: no drop seen yet.
    limit: Option<usize>,
    /// The tickets of the connections inside, in the order they entered.
    inside: BTreeSet<u64>,
    next_ticket: u64,
    /// Connections authenticated since the limit was last lowered.
    authenticated: usize,
}

/// One connection's place in a [`Gate`], given back when dropped.
pub struct Pass {
    gate: Arc<Gate>,
    ticket: u64,
}

// Settings are printed with `{:?}` to tell jump hosts apart: the gate's
// state must not show.
impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until there is room, and takes it.
    pub async fn enter(self: &Arc<Self>) -> Pass {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.state();
                if state.limit.is_none_or(|limit| state.inside.len() < limit) {
                    let ticket = state.next_ticket;
                    state.next_ticket += 1;
                    state.inside.insert(ticket);
                    return Pass {
                        gate: self.clone(),
                        ticket,
                    };
                }
            }
            room.await;
        }
    }

    /// The current limit, if any (for tests and logs).
    pub fn limit(&self) -> Option<usize> {
        self.state().limit
    }
}

impl Pass {
    /// The connection was closed before authentication: at most as many as
    /// were ahead of it may be on their way now.
    pub fn dropped(self) {
        let mut state = self.gate.state();
        let ahead = state.inside.range(..self.ticket).count().max(1);
        if state.limit.is_none_or(|limit| ahead < limit) {
            tracing::debug!(
                "a server dropped a connection before authentication: at most {ahead} at once now"
            );
            state.limit = Some(ahead);
            state.authenticated = 0;
        }
        drop(state); // before `self` gives its place back
    }

    /// The connection authenticated: once a round of them (the limit) has
    /// since the last drop, each raises the limit by one.
    pub fn authenticated(self) {
        let mut state = self.gate.state();
        if let Some(limit) = state.limit {
            state.authenticated += 1;
            if state.authenticated > limit {
                state.limit = Some(limit + 1);
            }
        }
        drop(state); // before `self` gives its place back, waking the next
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.state().inside.remove(&self.ticket);
        self.gate.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_from_the_first_within_half_and_one_and_a_half_times() {
        let b = PRE_AUTH_DROPS;
        for (failed, nominal) in [(1, 50), (2, 100), (3, 200), (4, 400), (5, 800)] {
            let nominal = MS * nominal;
            assert_eq!(b.pause(failed, 0.0), Some(nominal / 2), "try {failed}");
            assert_eq!(b.pause(failed, 0.5), Some(nominal), "try {failed}");
            let longest = b.pause(failed, 0.999_999).unwrap();
            assert!(
                longest < nominal * 3 / 2 && longest > nominal,
                "try {failed}"
            );
        }
        // Out-of-range jitter stays within the same bounds.
        assert_eq!(b.pause(1, -3.0), Some(MS * 25));
        assert_eq!(b.pause(1, 7.0), Some(MS * 75));
        assert_eq!(b.pause(1, f64::NAN), Some(MS * 50));
    }

    #[test]
    fn the_tries_are_bounded_and_the_pauses_capped() {
        let b = PRE_AUTH_DROPS;
        assert_eq!(b.pause(0, 0.5), None, "nothing failed yet");
        assert_eq!(b.pause(b.tries, 0.5), None, "the last try was made");
        assert_eq!(b.pause(u32::MAX, 0.5), None);
        let long = Backoff {
            tries: 40,
            ..PRE_AUTH_DROPS
        };
        for failed in 1..40 {
            assert!(long.pause(failed, 0.999).unwrap() < long.cap * 3 / 2);
        }
        assert_eq!(long.pause(39, 0.5), Some(long.cap));
        // Every pause of a whole run, at their longest, adds up to a few seconds.
        let total: Duration = (1..b.tries).filter_map(|f| b.pause(f, 0.999_999)).sum();
        assert!(total < Duration::from_millis(2330), "{total:?}");
    }

    #[test]
    fn no_pause_runs_into_the_deadline() {
        let b = PRE_AUTH_DROPS;
        let now = Instant::now();
        // The pause and a whole try fit: go on.
        assert_eq!(
            b.next(1, 0.5, now, now + MS * 50 + b.min_try),
            Some(MS * 50)
        );
        // One millisecond less: give up rather than start a try cut short.
        assert_eq!(b.next(1, 0.5, now, now + MS * 49 + b.min_try), None);
        assert_eq!(b.next(1, 0.5, now, now), None);
        assert_eq!(
            b.next(b.tries, 0.0, now, now + Duration::from_secs(60)),
            None
        );
    }

    /// Whether a connection could enter now.
    fn room(gate: &Arc<Gate>) -> bool {
        use futures::FutureExt;
        gate.enter().now_or_never().is_some()
    }

    /// The gate lets everyone in until a drop; then as many as were ahead
    /// of the dropped connection, one more after each round of logins.
    #[tokio::test]
    async fn the_gate_settles_at_what_got_through() {
        let gate = Arc::new(Gate::default());
        let mut inside = Vec::new();
        for _ in 0..20 {
            inside.push(gate.enter().await);
        }
        assert_eq!(gate.limit(), None, "no drop yet: no limit");
        assert!(room(&gate));

        // The eleventh to enter is dropped: ten were ahead of it.
        inside.remove(10).dropped();
        assert_eq!(gate.limit(), Some(10));
        // The last one too, with eighteen ahead: no higher.
        inside.pop().expect("inside").dropped();
        assert_eq!(gate.limit(), Some(10));
        assert!(!room(&gate), "18 inside, 10 allowed");

        // Nine log in: one place is free.
        for _ in 0..9 {
            inside.remove(0).authenticated();
        }
        assert_eq!(inside.len(), 9);
        inside.push(gate.enter().await);
        assert!(!room(&gate));
        // The tenth login completes the round; the next ones each raise
        // the limit by one.
        inside.remove(0).authenticated();
        assert_eq!(gate.limit(), Some(10));
        inside.push(gate.enter().await);
        assert!(!room(&gate));
        inside.remove(0).authenticated();
        assert_eq!(gate.limit(), Some(11));
        inside.remove(0).authenticated();
        assert_eq!(gate.limit(), Some(12));
        for _ in 0..4 {
            inside.push(gate.enter().await);
        }
        assert_eq!(inside.len(), 12);
        assert!(!room(&gate));

        // A drop with fewer ahead lowers it; other failures change nothing.
        inside.remove(3).dropped();
        assert_eq!(gate.limit(), Some(3));
        drop(inside.pop());
        assert_eq!(gate.limit(), Some(3));
        // Leaving wakes a connection waiting for room.
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter().await.authenticated() }
        });
        inside.truncate(2);
        waiting.await.expect("entered once there was room");
    }

    /// The first drop of a fan-out ahead of everyone leaves room for one.
    #[test]
    fn the_gate_keeps_room_for_one() {
        use futures::FutureExt;
        let gate = Arc::new(Gate::default());
        let first = gate.enter().now_or_never().expect("room");
        first.dropped();
        assert_eq!(gate.limit(), Some(1));
        let one = gate.enter().now_or_never().expect("room for one");
        assert!(!room(&gate));
        drop(one);
        assert!(room(&gate));
    }

    fn settings(timeout: Duration) -> ConnectSettings {
        let mut s = crate::settings::Resolver::new(
            Some(std::path::Path::new("none")),
            &[],
            &crate::settings::ClientEnv::default(),
        )
        .expect("resolver")
        .resolve(&crate::settings::Destination {
            host: "busy.example".into(),
            user: Some("u".into()),
            port: None,
            identity_files: Vec::new(),
            config_file: Some("none".into()),
            options: Vec::new(),
        })
        .expect("settings");
        s.connect_timeout = timeout;
        s
    }

    /// Always dropped: tried [`PRE_AUTH_DROPS`]`.tries` times, each later
    /// try with what is left of ConnectTimeout, and the drop is reported
    /// with the count, well within ConnectTimeout.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_always_drops_is_tried_a_few_times_then_reported() {
        let budget = Duration::from_secs(30);
        let start = Instant::now();
        let mut budgets = Vec::new();
        let result: Result<(), _> = retry_pre_auth_drops(&settings(budget), |s| {
            budgets.push((start.elapsed(), s.connect_timeout));
            async { Err(SkiffError::new(ErrorKind::Busy, "closed")) }
        })
        .await;
        let e = result.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Busy);
        assert_eq!(budgets.len(), PRE_AUTH_DROPS.tries as usize);
        assert!(
            e.message.starts_with("closed; tried 6 times in "),
            "{}",
            e.message
        );
        for (at, timeout) in &budgets {
            assert_eq!(*at + *timeout, budget, "each try ends by the deadline");
        }
        let (last_at, _) = budgets.last().unwrap();
        assert!(*last_at >= MS * 775 && *last_at < MS * 2325, "{last_at:?}");
    }

    /// A short ConnectTimeout leaves room for fewer tries.
    #[tokio::test(start_paused = true)]
    async fn the_connect_timeout_bounds_the_tries() {
        let mut tries = 0;
        let start = Instant::now();
        let result: Result<(), _> =
            retry_pre_auth_drops(&settings(Duration::from_millis(1200)), |_| {
                tries += 1;
                async { Err(SkiffError::new(ErrorKind::Busy, "closed")) }
            })
            .await;
        assert!(result.is_err());
        // 1.2 s leave a second for a try only after the first pauses (at
        // most 25+50+100 ms at their shortest).
        assert!((2..=4).contains(&tries), "{tries} tries");
        assert!(
            start.elapsed() <= Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );
    }

    /// Success after drops, and any other failure, end the tries at once.
    #[tokio::test(start_paused = true)]
    async fn only_drops_are_tried_again() {
        let mut tries = 0;
        let got = retry_pre_auth_drops(&settings(Duration::from_secs(30)), |_| {
            tries += 1;
            let n = tries;
            async move {
                match n {
                    1 | 2 => Err(SkiffError::new(ErrorKind::Busy, "closed")),
                    _ => Ok(n),
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), 3);

        for kind in [
            ErrorKind::Connect,
            ErrorKind::Auth,
            ErrorKind::HostKey,
            ErrorKind::Config,
            ErrorKind::Protocol,
            ErrorKind::Timeout,
        ] {
            let mut tries = 0;
            let got: Result<(), _> =
                retry_pre_auth_drops(&settings(Duration::from_secs(30)), |_| {
                    tries += 1;
                    async move { Err(SkiffError::new(kind, "no")) }
                })
                .await;
            assert_eq!(got.unwrap_err().message, "no");
            assert_eq!(tries, 1, "{kind:?} is not tried again");
        }
    }
}
