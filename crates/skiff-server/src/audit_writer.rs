//! Appends audit records ([`crate::audit`]) to the `AuditLog` file: opened
//! as the `-E` log is ([`crate::log_file`]: 0600, a regular file, no
//! foreign symlink), each line handed to one `write(2)` on an `O_APPEND`
//! descriptor, so records of concurrent connections never interleave.
//! A dedicated thread writes; connections only put the encoded line on a
//! bounded queue, never waiting: when the queue is full the record is
//! dropped and counted, and a warning says how many were lost.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::audit::{Entry, Event};
use crate::auth_log::Who;

/// Records queued at most before new ones are dropped.
const QUEUE: usize = 4096;

/// The audit log all connections share.
#[derive(Debug)]
pub struct AuditLog {
    queue: SyncSender<Vec<u8>>,
    dropped: AtomicU64,
    /// Records queued and not yet written.
    backlog: Arc<crate::backlog::Backlog>,
}

impl AuditLog {
    /// Opens `path` and starts the writer thread.
    pub fn open(path: &Path) -> Result<Arc<AuditLog>, crate::log_file::LogFileError> {
        let mut file = crate::log_file::open_append(path)?;
        let (queue, lines) = sync_channel::<Vec<u8>>(QUEUE);
        let shown = path.display().to_string();
        let backlog = Arc::new(crate::backlog::Backlog::default());
        let written = backlog.clone();
        let spawned = std::thread::Builder::new()
            .name("skiffd-audit".into())
            .spawn(move || {
                for line in lines {
                    // One write per record: O_APPEND puts it whole at the end.
                    match file.write(&line) {
                        Ok(n) if n == line.len() => {}
                        Ok(n) => tracing::warn!(
                            "audit log {shown}: short write ({n} of {} bytes)",
                            line.len()
                        ),
                        Err(e) => tracing::warn!("audit log {shown}: {e}"),
                    }
                    written.done();
                }
            });
        if let Err(e) = spawned {
            return Err(crate::log_file::LogFileError::Open {
                path: path.to_path_buf(),
                source: e,
            });
        }
        Ok(Arc::new(AuditLog {
            queue,
            dropped: AtomicU64::new(0),
            backlog,
        }))
    }

    /// Waits until the records queued so far are written (`within` at
    /// most): a connection's process does before it exits.
    pub fn flush(&self, within: std::time::Duration) -> bool {
        self.backlog.wait_empty(within)
    }

    /// Queues `entry`, or drops it when the writer is that far behind.
    pub fn record(&self, entry: &Entry) {
        self.backlog.add();
        match self.queue.try_send(entry.encode()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.backlog.done();
                let lost = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if lost.is_power_of_two() {
                    tracing::warn!("audit log is behind: {lost} records dropped so far");
                }
            }
        }
    }
}

/// What one connection logs about itself beyond its callbacks' lines:
/// its audit records (under its id), who it is as far as authentication
/// has got, and the line sshd writes when a connection ends. The listener
/// says when it opened and ended; the handler says who it is.
#[derive(Debug)]
pub struct ConnectionLog {
    audit: Option<Arc<AuditLog>>,
    id: String,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    started: Instant,
    /// Whether the `connect` record is out, and who the connection is;
    /// the lock also keeps `connect` first among its records.
    state: Mutex<(bool, Who)>,
}

impl ConnectionLog {
    /// A connection from `peer` to `local` (`None`: unknown, inetd on
    /// pipes); nothing is logged until it [`Self::opened`].
    pub fn new(
        audit: Option<&Arc<AuditLog>>,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
    ) -> Arc<ConnectionLog> {
        Arc::new(ConnectionLog {
            audit: audit.cloned(),
            id: format!("{:016x}", rand::random::<u64>()),
            peer,
            local,
            started: Instant::now(),
            state: Mutex::new((false, Who::Nobody)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, Who)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection speaks SSH: writes its `connect` record (once).
    pub fn opened(&self) {
        let mut state = self.lock();
        self.open_locked(&mut state);
    }

    fn open_locked(&self, state: &mut (bool, Who)) {
        if !state.0 {
            state.0 = true;
            self.write(Event::Connect {
                local: self.local.map(|l| l.to_string()),
            });
        }
    }

    fn write(&self, event: Event) {
        if let Some(log) = &self.audit {
            log.record(&Entry::new(SystemTime::now(), &self.id, self.peer, event));
        }
    }

    /// Records `event` (after `connect`).
    pub fn record(&self, event: Event) {
        let mut state = self.lock();
        self.open_locked(&mut state);
        self.write(event);
    }

    /// Whether anything goes to an audit log (records cost work to make).
    pub fn auditing(&self) -> bool {
        self.audit.is_some()
    }

    /// Who the connection now is (see [`Who`]).
    pub fn set_who(&self, who: Who) {
        let mut state = self.lock();
        self.open_locked(&mut state);
        state.1 = who;
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The connection is over: sshd's line for it ("Connection closed by
    /// ... `[preauth]`", "Disconnected from user ...") and the `disconnect`
    /// record, if it ever spoke SSH.
    pub fn ended(&self, reason: &str) {
        let state = self.lock();
        if !state.0 {
            return;
        }
        tracing::info!("{}", crate::auth_log::closed(&state.1, self.peer));
        let user = match &state.1 {
            Who::Nobody => None,
            Who::Authenticating { user, .. } | Who::LoggedIn(user) => Some(user.clone()),
        };
        self.write(Event::Disconnect {
            user,
            duration_ms: crate::audit::millis(self.started.elapsed()),
            reason: reason.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_arrive_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).unwrap();
        let conn = ConnectionLog::new(Some(&log), Some("127.0.0.1:9".parse().unwrap()), None);
        for i in 0..50 {
            conn.record(Event::Subsystem {
                user: format!("u{i}\n"),
                name: "sftp".into(),
            });
        }
        conn.ended("test");
        let want = 52;
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        let text = loop {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.lines().count() >= want || Instant::now() > deadline {
                break text;
            }
            std::thread::yield_now();
        };
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), want);
        assert_eq!(lines[0]["event"], "connect");
        assert_eq!(lines[50]["user"], "u49\n");
        assert_eq!(lines[51]["event"], "disconnect");
        assert!(lines.iter().all(|l| l["conn"] == lines[0]["conn"]));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
