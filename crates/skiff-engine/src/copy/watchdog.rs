//! Keeping an SFTP copy from waiting for ever on a server that went quiet.
//! The connection's keepalives catch a dead path, but a server that answers
//! them and nothing else would hold the copy until each request's own
//! timeout. So every byte the server sends on the SFTP channel is counted
//! ([`Heard::listen`]), and the copy fails once nothing has arrived for the
//! keepalive budget ([`Heard::watch`]) while it was not busy with its own
//! disk ([`Heard::busy`]: an fsync of a large file may take a while).

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use skiff_dataplane::Stall;

use crate::error::SkiffError;
use crate::read_tap::{ReadTap, Tap};

/// How often the watch looks.
const TICK: Duration = Duration::from_secs(1);

/// What the server sent, and whether the copy is busy on its own side.
#[derive(Clone, Default)]
pub(crate) struct Heard {
    bytes: Arc<AtomicU64>,
    busy: Arc<AtomicUsize>,
}

impl Heard {
    /// `stream`, with what it reads counted.
    pub(crate) fn listen<S>(&self, stream: S) -> Listened<S> {
        ReadTap::new(stream, Counted(self.bytes.clone()))
    }

    /// Marks local work (a commit) that is progress though nothing is heard,
    /// until the guard is dropped.
    pub(crate) fn busy(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.busy.clone())
    }

    /// Runs `copy`, failing it once nothing was heard for `budget` (never
    /// with `None`). Dropping the copy removes its local temporaries.
    pub(crate) async fn watch<T>(
        &self,
        copy: impl Future<Output = Result<T, SkiffError>>,
        budget: Option<Duration>,
        host: &str,
    ) -> Result<T, SkiffError> {
        if budget.is_none() {
            return copy.await;
        }
        tokio::pin!(copy);
        // tokio's clock, which tests can pause and advance.
        let now = || tokio::time::Instant::now().into_std();
        let mut stall = Stall::new(budget, now());
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                done = &mut copy => return done,
                _ = tick.tick() => {
                    let now = now();
                    if self.busy.load(Ordering::Relaxed) > 0 {
                        stall.progress(now);
                    }
                    if let Some(idle) = stall.check(self.bytes.load(Ordering::Relaxed), now) {
                        return Err(super::stalled(host, idle));
                    }
                }
            }
        }
    }
}

/// Local work in progress (see [`Heard::busy`]).
pub(crate) struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts what a [`Listened`] stream reads into [`Heard`].
pub(crate) struct Counted(Arc<AtomicU64>);

impl Tap for Counted {
    fn saw(&mut self, bytes: &[u8]) {
        self.0.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
}

/// A stream whose reads are counted into [`Heard`].
pub(crate) type Listened<S> = ReadTap<S, Counted>;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_quiet_server_fails_the_copy_and_a_busy_client_does_not() {
        let heard = Heard::default();
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = heard.listen(ours);
        // The server talks for a while, then goes quiet.
        let talk = tokio::spawn(async move {
            for _ in 0..5 {
                theirs.write_all(b"x").await.unwrap();
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            theirs
        });
        let copy = async {
            let mut b = [0u8; 1];
            loop {
                ours.read_exact(&mut b).await.map_err(|e| {
                    SkiffError::new(crate::error::ErrorKind::Connect, e.to_string())
                })?;
            }
            #[allow(unreachable_code)]
            Ok::<(), SkiffError>(())
        };
        let started = tokio::time::Instant::now();
        let e = heard
            .watch(copy, Some(Duration::from_secs(5)), "h")
            .await
            .unwrap_err();
        assert!(e.message.contains("no progress"), "{e}");
        // Heard every 2 s for 8 s, then 5 s of quiet (and a tick).
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(13) && took <= Duration::from_secs(16),
            "{took:?}"
        );
        drop(talk.await.unwrap());

        // Busy on its own disk: not a stall.
        let guard = heard.busy();
        let done = heard
            .watch(
                async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<_, SkiffError>(7)
                },
                Some(Duration::from_secs(5)),
                "h",
            )
            .await
            .unwrap();
        assert_eq!(done, 7);
        drop(guard);
    }
}
