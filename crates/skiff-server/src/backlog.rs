//! A count of jobs not yet done that a process about to exit can wait on:
//! a connection process lets its sessions hang their commands up and clean
//! after themselves ([`SESSIONS`]), and flushes its audit and login records,
//! before it ends.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The sessions of this process still running (their supervising tasks).
pub static SESSIONS: Backlog = Backlog::new();

#[derive(Debug, Default)]
pub struct Backlog {
    count: Mutex<usize>,
    emptied: Condvar,
}

impl Backlog {
    pub const fn new() -> Backlog {
        Backlog {
            count: Mutex::new(0),
            emptied: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more job queued.
    pub fn add(&self) {
        *self.lock() += 1;
    }

    /// One more job, done when the returned guard is dropped (however the
    /// job ends).
    pub fn counted(&'static self) -> Counted {
        self.add();
        Counted(self)
    }

    /// One job done (or dropped).
    pub fn done(&self) {
        let mut n = self.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.emptied.notify_all();
        }
    }

    /// Waits until every queued job is done, for `within` at most; false
    /// when some are still waiting.
    pub fn wait_empty(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut n = self.lock();
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = match self.emptied.wait_timeout(n, left) {
                Ok((n, _)) => n,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
}

/// A job of a [`Backlog`], done when dropped.
#[derive(Debug)]
pub struct Counted(&'static Backlog);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_for_the_last_job_and_no_longer() {
        let b = Arc::new(Backlog::default());
        assert!(b.wait_empty(Duration::ZERO), "nothing queued");
        b.add();
        b.add();
        assert!(!b.wait_empty(Duration::from_millis(10)), "two pending");
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || {
                b.done();
                b.done();
            })
        };
        assert!(b.wait_empty(Duration::from_secs(30)));
        writer.join().unwrap();
    }
}
