//! The remote temporaries of SFTP uploads in progress, kept in one place
//! so that a copy stopped from outside (Ctrl-C, SIGTERM: its future is
//! dropped, so its own clean-up never runs) can still have them removed.
//!
//! The SFTP backend adds each temporary name just before it asks the
//! server to create it, together with the session that asks, and settles
//! it once it is renamed into place or removed by the backend's own
//! clean-up after a failure. Whatever is still there when the caller
//! calls [`Temporaries::remove_all`] is removed over that same session:
//! the remove then queues behind the create on that channel, so the
//! server cannot see them in the other order. Only the exact names this
//! process made (random per file) are ever removed: nothing is globbed.
//!
//! One registry serves every host of a copy (a node set's too); each
//! host's SFTP copy works through a handle of its own
//! ([`Temporaries::one_copy`]), so that one that fails as a whole removes
//! its own temporaries and never another host's, still being written.
//!
//! [`Registry`] is the bookkeeping alone (no I/O); [`Temporaries`] holds
//! one of SFTP sessions and does the removing, bounded by
//! [`CLEANUP_LIMIT`] in all.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh_sftp::client::error::Error as SftpError;
use russh_sftp::client::RawSftpSession;
use russh_sftp::protocol::StatusCode;

/// How long removing every temporary left may take in all: a server that
/// does not answer by then keeps its temporaries (they are named to the
/// user), and the user is not kept waiting.
pub const CLEANUP_LIMIT: Duration = Duration::from_millis(2500);

/// Which entry of a [`Registry`] an upload settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// Which copy (one host's) a temporary belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyId(u64);

/// Live temporaries: each with the copy it belongs to, the host it is on
/// (for messages), its exact path there, and the session `S` that created
/// it.
#[derive(Debug)]
pub struct Registry<S> {
    next: u64,
    live: BTreeMap<Ticket, (CopyId, String, String, S)>,
}

impl<S> Default for Registry<S> {
    fn default() -> Self {
        Registry {
            next: 0,
            live: BTreeMap::new(),
        }
    }
}

impl<S> Registry<S> {
    /// A number for one more copy (none of whose temporaries is live yet).
    pub fn new_copy(&mut self) -> CopyId {
        self.next += 1;
        CopyId(self.next)
    }

    /// `path` on `host` is about to be created through `session`, by `copy`.
    pub fn add(&mut self, copy: CopyId, host: &str, path: &str, session: S) -> Ticket {
        self.next += 1;
        let ticket = Ticket(self.next);
        self.live
            .insert(ticket, (copy, host.to_string(), path.to_string(), session));
        ticket
    }

    /// The temporary `ticket` names is gone (renamed into place, or removed
    /// by the upload itself): nothing more to do for it.
    pub fn settle(&mut self, ticket: Ticket) {
        self.live.remove(&ticket);
    }

    /// How many temporaries are live.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Whether `copy` has a live temporary.
    pub fn has(&self, copy: CopyId) -> bool {
        self.live.values().any(|(c, ..)| *c == copy)
    }

    /// Every live temporary (of `copy` only, if given), oldest first,
    /// leaving none of them behind (so that nothing keeps their sessions
    /// open once they are dealt with).
    pub fn take(&mut self, copy: Option<CopyId>) -> Vec<(String, String, S)> {
        let (taken, kept) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|(_, (c, ..))| copy.is_none_or(|wanted| *c == wanted));
        self.live = kept;
        taken
            .into_values()
            .map(|(_, host, path, session)| (host, path, session))
            .collect()
    }
}

/// What [`Temporaries::remove_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Temporaries removed (or found gone already).
    pub removed: usize,
    /// `host:path` of each that may still be on its server, with why.
    pub left: Vec<String>,
}

/// The remote temporaries of one `skiff cp` (all its hosts): cheap to
/// clone, every clone the same registry. Make one per `skiff cp` and pass
/// it to [`super::copy`] (or [`super::sftp::copy_on`]) for each host; after
/// the copy was stopped, call [`Temporaries::remove_all`] before exiting.
#[derive(Clone, Default)]
pub struct Temporaries {
    inner: Arc<Mutex<Registry<Arc<RawSftpSession>>>>,
    /// The one host's copy this handle adds for ([`Temporaries::one_copy`]).
    copy: Option<CopyId>,
}

impl std::fmt::Debug for Temporaries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Temporaries")
            .field("live", &self.len())
            .finish()
    }
}

impl Temporaries {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry<Arc<RawSftpSession>>> {
        // A panic elsewhere while it was held leaves the map itself sound.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle on the same registry for one host's copy: what it adds is
    /// its own ([`Temporaries::remove_own`]).
    pub(crate) fn one_copy(&self) -> Temporaries {
        Temporaries {
            inner: self.inner.clone(),
            copy: Some(self.registry().new_copy()),
        }
    }

    /// `path` on `host` is about to be created through `session`. (A
    /// handle that is not [`Temporaries::one_copy`]'s adds as a copy of
    /// its own.)
    pub(crate) fn add(&self, host: &str, path: &str, session: &Arc<RawSftpSession>) -> Ticket {
        let mut registry = self.registry();
        let copy = self.copy.unwrap_or_else(|| registry.new_copy());
        registry.add(copy, host, path, session.clone())
    }

    /// The temporary is renamed into place or was removed.
    pub(crate) fn settle(&self, ticket: Ticket) {
        self.registry().settle(ticket);
    }

    /// How many temporaries are live.
    pub fn len(&self) -> usize {
        self.registry().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.registry().is_empty()
    }

    /// Whether this handle's copy ([`Temporaries::one_copy`]) has a live
    /// temporary.
    pub(crate) fn has_own(&self) -> bool {
        self.copy.is_some_and(|c| self.registry().has(c))
    }

    /// [`Temporaries::remove_all`] for this handle's copy only.
    pub(crate) async fn remove_own(&self) -> Cleanup {
        match self.copy {
            Some(copy) => self.remove(Some(copy)).await,
            None => Cleanup::default(),
        }
    }

    /// Removes every live temporary (every host's) over the session that
    /// created it, all at once, for at most [`CLEANUP_LIMIT`]; then
    /// forgets them all, so their sessions close. A name the server no
    /// longer has counts as removed (it was renamed into place just before
    /// the stop, or never created).
    pub async fn remove_all(&self) -> Cleanup {
        self.remove(None).await
    }

    async fn remove(&self, copy: Option<CopyId>) -> Cleanup {
        let live = self.registry().take(copy);
        if live.is_empty() {
            return Cleanup::default();
        }
        tracing::debug!("removing {} remote temporaries", live.len());
        let removing = live.iter().map(|(host, path, session)| async move {
            let outcome = match session.remove(path.as_str()).await {
                Ok(_) => Ok(()),
                Err(SftpError::Status(s)) if s.status_code == StatusCode::NoSuchFile => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            (host, path, outcome)
        });
        let mut report = Cleanup::default();
        let all = futures::future::join_all(removing);
        match tokio::time::timeout(CLEANUP_LIMIT, all).await {
            Ok(outcomes) => {
                for (host, path, outcome) in outcomes {
                    match outcome {
                        Ok(()) => report.removed += 1,
                        Err(why) => report.left.push(format!("{host}:{path} ({why})")),
                    }
                }
            }
            Err(_) => {
                // Which ones finished in time is not known: name them all.
                let secs = CLEANUP_LIMIT.as_secs_f32();
                report.left = live
                    .iter()
                    .map(|(host, path, _)| format!("{host}:{path} (no answer within {secs} s)"))
                    .collect();
            }
        }
        for (_, _, session) in &live {
            let _ = session.close_session();
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_temporaries_are_not_removed() {
        let mut r = Registry::default();
        let one = r.new_copy();
        let a = r.add(one, "h", "d/.a.skiff-01", 1);
        let b = r.add(one, "h", "d/.b.skiff-02", 2);
        let c = r.add(one, "g", "/x/.c.skiff-03", 1);
        assert_eq!(r.len(), 3);
        r.settle(b);
        // Settling twice (a clean-up after a failure, then again) is harmless.
        r.settle(b);
        assert_eq!(
            r.take(None),
            [
                ("h".to_string(), "d/.a.skiff-01".to_string(), 1),
                ("g".to_string(), "/x/.c.skiff-03".to_string(), 1)
            ]
        );
        // Taken means gone: a second clean-up has nothing to do, and
        // settling an entry already taken changes nothing.
        assert!(r.is_empty());
        assert!(r.take(None).is_empty());
        r.settle(a);
        r.settle(c);
        assert!(r.is_empty());
    }

    #[test]
    fn one_copy_takes_only_its_own() {
        let mut r = Registry::default();
        let (one, two) = (r.new_copy(), r.new_copy());
        assert_ne!(one, two);
        r.add(one, "a", "p1", ());
        r.add(two, "b", "p2", ());
        r.add(one, "a", "p3", ());
        assert!(r.has(one) && r.has(two));
        let names = |v: Vec<(String, String, ())>| v.into_iter().map(|e| e.1).collect::<Vec<_>>();
        assert_eq!(names(r.take(Some(one))), ["p1", "p3"]);
        assert!(!r.has(one));
        assert_eq!(r.len(), 1);
        assert_eq!(names(r.take(None)), ["p2"]);
    }

    #[test]
    fn tickets_are_never_reused() {
        let mut r = Registry::default();
        let copy = r.new_copy();
        let a = r.add(copy, "h", "p", ());
        r.settle(a);
        let b = r.add(copy, "h", "p", ());
        assert_ne!(a, b);
        // The old ticket does not settle the new entry with the same name.
        r.settle(a);
        assert_eq!(r.len(), 1);
    }

    #[tokio::test]
    async fn nothing_live_is_nothing_to_do() {
        let t = Temporaries::new();
        assert!(t.is_empty());
        assert_eq!(t.remove_all().await, Cleanup::default());
        let own = t.one_copy();
        assert!(!own.has_own());
        assert_eq!(own.remove_own().await, Cleanup::default());
    }
}
