//! A connection's channel clocks: when each open channel last carried
//! data (either way), for `ChannelTimeout` (close a channel, or with
//! `global` all of them, after an interval without traffic) and
//! `UnusedConnectionTimeout` (close a connection that has had no open
//! channel for an interval since it authenticated). The intervals are
//! data ([`crate::channel_timeout`]); this module only keeps time.
//!
//! A channel is open, here, from the moment skiffd accepts it (or the
//! client confirms one skiffd opened) until what serves it lets go of its
//! [`ChannelClock`], or its timeout closes it. The pumps of
//! [`crate::channel_io`] touch the clock for every packet each way.
//! Forwarding listeners (`ssh -R`) are not channels and keep nothing open.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use russh::server::Handle;
use russh::ChannelId;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::channel_timeout::{ChannelKind, ChannelTimeouts};

/// The clocks of one connection's channels.
pub struct ConnectionClocks {
    /// The client, for the log.
    peer: std::net::SocketAddr,
    /// Times are kept as milliseconds since this instant.
    base: Instant,
    /// The last traffic on any channel (for `global`).
    last_any: AtomicU64,
    /// The channels open now, by id.
    open: Mutex<HashMap<ChannelId, Weak<ChannelClock>>>,
    /// How many channels are open (for `UnusedConnectionTimeout`).
    count: watch::Sender<usize>,
    /// Set once the client has authenticated.
    policy: OnceLock<Policy>,
    /// The connection-wide watchdogs, stopped with the connection.
    watchdogs: Mutex<Vec<AbortHandle>>,
}

struct Policy {
    timeouts: ChannelTimeouts,
    handle: Handle,
}

/// One open channel's clock, held by what serves the channel.
pub struct ChannelClock {
    id: ChannelId,
    last: AtomicU64,
    /// Set when the channel is closed for idleness: its pumps stop.
    expired: watch::Sender<bool>,
    connection: Arc<ConnectionClocks>,
    watchdog: Option<AbortHandle>,
}

impl ConnectionClocks {
    pub fn new(peer: std::net::SocketAddr) -> Arc<ConnectionClocks> {
        Arc::new(ConnectionClocks {
            peer,
            base: Instant::now(),
            last_any: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            count: watch::channel(0).0,
            policy: OnceLock::new(),
            watchdogs: Mutex::new(Vec::new()),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, millis: u64) -> Instant {
        self.base + Duration::from_millis(millis)
    }

    /// Starts keeping time for an authenticated login: `timeouts` for its
    /// channels, `unused` for the connection (`None`: no limit). The
    /// connection's watchdogs start here (only the first call counts).
    pub fn start(
        self: &Arc<Self>,
        timeouts: ChannelTimeouts,
        unused: Option<Duration>,
        handle: Handle,
    ) {
        let global = timeouts.global();
        if self
            .policy
            .set(Policy {
                timeouts,
                handle: handle.clone(),
            })
            .is_err()
        {
            return;
        }
        self.last_any.store(self.now(), Ordering::Relaxed);
        let mut watchdogs = self.watchdogs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(interval) = unused {
            let count = self.count.subscribe();
            let task = watch_unused(count, interval, handle.clone(), self.peer);
            watchdogs.push(tokio::spawn(task).abort_handle());
        }
        if let Some(interval) = global {
            let task = watch_all(Arc::downgrade(self), interval, handle);
            watchdogs.push(tokio::spawn(task).abort_handle());
        }
    }

    /// The clock of a channel that has just opened; its own watchdog
    /// closes it after the interval `ChannelTimeout` gives its kind.
    pub fn channel(self: &Arc<Self>, kind: ChannelKind, id: ChannelId) -> Arc<ChannelClock> {
        let now = self.now();
        self.last_any.store(now, Ordering::Relaxed);
        let limit = self.policy.get().and_then(|p| {
            p.timeouts
                .for_kind(kind)
                .map(|interval| (interval, p.handle.clone()))
        });
        let clock = Arc::new_cyclic(|weak: &Weak<ChannelClock>| ChannelClock {
            id,
            last: AtomicU64::new(now),
            expired: watch::channel(false).0,
            connection: self.clone(),
            watchdog: limit.map(|(interval, handle)| {
                let task = watch_channel(weak.clone(), kind, interval, handle);
                tokio::spawn(task).abort_handle()
            }),
        });
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(id, Arc::downgrade(&clock));
        self.count.send_replace(open.len());
        clock
    }

    /// Takes `clock` off the open channels (if it is still there); `true`
    /// when it was.
    fn forget(&self, clock: &ChannelClock) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let ours = open
            .get(&clock.id)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), clock));
        if ours {
            open.remove(&clock.id);
            self.count.send_replace(open.len());
        }
        ours
    }

    /// Takes every channel off, marking each expired; returns their ids.
    fn expire_all(&self) -> Vec<ChannelId> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let ids = open
            .drain()
            .map(|(id, clock)| {
                if let Some(clock) = clock.upgrade() {
                    clock.expired.send_replace(true);
                }
                id
            })
            .collect();
        self.count.send_replace(0);
        ids
    }
}

impl Drop for ConnectionClocks {
    fn drop(&mut self) {
        let watchdogs = self.watchdogs.get_mut().unwrap_or_else(|p| p.into_inner());
        for w in watchdogs.drain(..) {
            w.abort();
        }
    }
}

impl ChannelClock {
    /// Returns once the channel has been closed for idleness (never,
    /// otherwise): what serves it then stops, as sshd closes the
    /// descriptors of a channel it times out.
    pub async fn expired(&self) {
        let mut expired = self.expired.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = expired.wait_for(|e| *e).await;
    }

    /// Notes traffic on the channel (either way).
    pub fn touch(&self) {
        let now = self.connection.now();
        self.last.store(now, Ordering::Relaxed);
        self.connection.last_any.store(now, Ordering::Relaxed);
    }
}

impl Drop for ChannelClock {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        self.connection.forget(self);
    }
}

/// Closes the channel once it has carried nothing for `interval`; ends
/// when the channel closes otherwise.
async fn watch_channel(
    clock: Weak<ChannelClock>,
    kind: ChannelKind,
    interval: Duration,
    handle: Handle,
) {
    let mut due = Instant::now() + interval;
    loop {
        tokio::time::sleep_until(due).await;
        let Some(c) = clock.upgrade() else { return };
        let idle_until = c.connection.at(c.last.load(Ordering::Relaxed)) + interval;
        if Instant::now() < idle_until {
            due = idle_until;
            continue;
        }
        if !c.connection.forget(&c) {
            return; // already closed (by `global`)
        }
        c.expired.send_replace(true);
        tracing::info!(
            peer = %c.connection.peer,
            "closing {} channel {} after {}s without traffic (ChannelTimeout)",
            kind.name(),
            c.id,
            interval.as_secs()
        );
        let id = c.id;
        drop(c);
        let _ = handle.eof(id).await;
        let _ = handle.close(id).await;
        return;
    }
}

/// Closes every open channel once none has carried anything for
/// `interval` (`ChannelTimeout global=`).
async fn watch_all(clocks: Weak<ConnectionClocks>, interval: Duration, handle: Handle) {
    let mut due = Instant::now() + interval;
    loop {
        tokio::time::sleep_until(due).await;
        let Some(c) = clocks.upgrade() else { return };
        let idle_until = c.at(c.last_any.load(Ordering::Relaxed)) + interval;
        if Instant::now() < idle_until {
            due = idle_until;
            continue;
        }
        let ids = c.expire_all();
        c.last_any.store(c.now(), Ordering::Relaxed);
        let peer = c.peer;
        drop(c);
        if !ids.is_empty() {
            tracing::info!(
                %peer,
                "closing {} channel(s) after {}s without traffic on any (ChannelTimeout global)",
                ids.len(),
                interval.as_secs()
            );
        }
        for id in ids {
            let _ = handle.eof(id).await;
            let _ = handle.close(id).await;
        }
        due = Instant::now() + interval;
    }
}

/// Ends the connection once it has had no open channel for `interval`
/// (`UnusedConnectionTimeout`).
async fn watch_unused(
    mut count: watch::Receiver<usize>,
    interval: Duration,
    handle: Handle,
    peer: std::net::SocketAddr,
) {
    loop {
        if count.wait_for(|n| *n == 0).await.is_err() {
            return;
        }
        let used = tokio::time::timeout(interval, count.wait_for(|n| *n > 0)).await;
        match used.map(|r| r.is_ok()) {
            Ok(true) => continue,
            Ok(false) => return,
            Err(_) => {
                tracing::info!(
                    %peer,
                    "closing the connection: no open channel for {}s (UnusedConnectionTimeout)",
                    interval.as_secs()
                );
                let _ = handle
                    .disconnect(
                        russh::Disconnect::ByApplication,
                        "no open channels".into(),
                        String::new(),
                    )
                    .await;
                return;
            }
        }
    }
}
