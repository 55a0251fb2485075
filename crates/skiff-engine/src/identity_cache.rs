//! Identity and certificate files read once for a whole set of connections
//! (one `skiff run`, one agent request) instead of once per host: a key's
//! passphrase is asked for once, a missing file is reported once, and the
//! key is decoded once.
//!
//! A cache belongs to the [`crate::settings::Resolver`] that made the
//! settings, so it lives as long as those settings. An established
//! connection keeps none (see [`crate::settings::ConnectSettings`]).
//!
//! A fan-out's password is asked for once too, per user name, and tried on
//! every host that asks for one (as `pssh -A` does).
//!
//! It also keeps a [`PersonClock`]: how long its connections have waited
//! for someone to type a passphrase, which a fan-out leaves out of its
//! authentication deadlines.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::keys::{Certificate, PrivateKey, PublicKey};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Identity and certificate files as read for the connections of one
/// resolver: what loading each private key, certificate and public half
/// gave (`crate::identity` reads them).
pub(crate) type IdentityCache = FileCache<
    Result<Option<Arc<PrivateKey>>, Unusable>,
    Result<Option<Certificate>, String>,
    Option<PublicKey>,
>;

/// Why a key file could not be used, for the failure summary.
#[derive(Clone)]
pub(crate) struct Unusable {
    pub(crate) note: String,
    /// Only because BatchMode forbids asking for its passphrase.
    pub(crate) needs_person: bool,
}

impl From<String> for Unusable {
    fn from(note: String) -> Self {
        Unusable {
            note,
            needs_person: false,
        }
    }
}

/// Cells keyed by file path; each is filled by the first caller and awaited
/// by the others.
type Cells<I, T> = Mutex<HashMap<I, Arc<OnceCell<T>>>>;

/// Outcomes of reading files, by path. `K` is what loading a private key
/// gives, `C` what reading a certificate gives, `P` what reading a key
/// file's public half gives.
pub struct FileCache<K, C, P> {
    /// By path and BatchMode: whether a passphrase may be asked for changes
    /// the outcome of loading an encrypted key.
    keys: Cells<(PathBuf, bool), K>,
    certificates: Cells<PathBuf, C>,
    public_keys: Cells<PathBuf, P>,
    /// By user name: the password a fan-out asked for once.
    passwords: Cells<String, SharedPassword>,
    person: PersonClock,
}

/// A password asked for once, or why none could be read.
pub(crate) type SharedPassword = Result<Arc<zeroize::Zeroizing<String>>, String>;

impl<K, C, P> Default for FileCache<K, C, P> {
    fn default() -> Self {
        FileCache {
            keys: Mutex::new(HashMap::new()),
            certificates: Mutex::new(HashMap::new()),
            public_keys: Mutex::new(HashMap::new()),
            passwords: Mutex::new(HashMap::new()),
            person: PersonClock::default(),
        }
    }
}

/// Time spent waiting for a person (a passphrase prompt), summed over the
/// prompts of one cache, and how many prompts are open now.
#[derive(Debug, Default)]
pub struct PersonClock {
    open: AtomicUsize,
    spent_micros: AtomicU64,
}

/// An open prompt: its time is added to the clock when it is dropped.
pub struct Waiting<'a> {
    clock: &'a PersonClock,
    since: Instant,
}

impl PersonClock {
    /// Marks a prompt open until the returned guard is dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        self.open.fetch_add(1, Ordering::SeqCst);
        Waiting {
            clock: self,
            since: Instant::now(),
        }
    }

    /// Whether a prompt is open now.
    pub fn is_waiting(&self) -> bool {
        self.open.load(Ordering::SeqCst) > 0
    }

    /// The time closed prompts have taken so far.
    pub fn spent(&self) -> Duration {
        Duration::from_micros(self.spent_micros.load(Ordering::SeqCst))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let micros = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        // Added before the prompt counts as closed, so that nobody sees it
        // neither open nor spent.
        self.clock.spent_micros.fetch_add(micros, Ordering::SeqCst);
        self.clock.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<K, C, P> std::fmt::Debug for FileCache<K, C, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        let keys = self.keys.lock().map_or(0, |m| m.len());
        let certificates = self.certificates.lock().map_or(0, |m| m.len());
        let public_keys = self.public_keys.lock().map_or(0, |m| m.len());
        f.debug_struct("FileCache")
            .field("keys", &keys)
            .field("certificates", &certificates)
            .field("public_keys", &public_keys)
            .finish()
    }
}

fn cell<I: std::hash::Hash + Eq, T>(cells: &Cells<I, T>, id: I) -> Arc<OnceCell<T>> {
    let mut map = cells.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(id).or_default().clone()
}

impl<K: Clone, C: Clone, P: Clone> FileCache<K, C, P> {
    /// The outcome of loading the private key at `path` under `batch_mode`:
    /// `load` runs for the first caller only; callers meanwhile wait for its
    /// outcome.
    pub async fn key<F: Future<Output = K>>(
        &self,
        path: &Path,
        batch_mode: bool,
        load: impl FnOnce() -> F,
    ) -> K {
        let cell = cell(&self.keys, (path.to_path_buf(), batch_mode));
        cell.get_or_init(load).await.clone()
    }

    /// The password for `user`, asked for by the first connection that
    /// needs one (`ask`); the others wait for that answer and reuse it.
    pub(crate) async fn password<F: Future<Output = SharedPassword>>(
        &self,
        user: &str,
        ask: impl FnOnce() -> F,
    ) -> SharedPassword {
        let cell = cell(&self.passwords, user.to_string());
        cell.get_or_init(ask).await.clone()
    }

    /// The time this cache's connections have waited for a person.
    pub fn person(&self) -> &PersonClock {
        &self.person
    }

    /// The outcome of reading the certificate at `path`, as for [`Self::key`].
    pub async fn certificate(&self, path: &Path, read: impl FnOnce() -> C) -> C {
        let cell = cell(&self.certificates, path.to_path_buf());
        cell.get_or_init(|| async move { read() }).await.clone()
    }

    /// The public half of the key file at `path`, as for [`Self::key`].
    pub async fn public_key(&self, path: &Path, read: impl FnOnce() -> P) -> P {
        let cell = cell(&self.public_keys, path.to_path_buf());
        cell.get_or_init(|| async move { read() }).await.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn each_path_is_loaded_once_and_paths_are_separate() {
        let cache: FileCache<Result<u32, String>, Option<u8>, Option<u16>> = FileCache::default();
        let loads = AtomicUsize::new(0);
        let load = |v| {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok(v)
        };
        assert_eq!(
            cache
                .key(Path::new("/a"), false, || async { load(1) })
                .await,
            Ok(1)
        );
        assert_eq!(
            cache
                .key(Path::new("/a"), false, || async { load(2) })
                .await,
            Ok(1)
        );
        assert_eq!(
            cache
                .key(Path::new("/b"), false, || async { load(3) })
                .await,
            Ok(3)
        );
        assert_eq!(loads.load(Ordering::SeqCst), 2);
        // Errors are kept too: a refused passphrase is not asked again.
        assert_eq!(
            cache
                .key(Path::new("/c"), false, || async {
                    Err("wrong passphrase".into())
                })
                .await,
            Err("wrong passphrase".to_string())
        );
        assert_eq!(
            cache
                .key(Path::new("/c"), false, || async { load(4) })
                .await,
            Err("wrong passphrase".to_string())
        );
        // Certificates are cached apart from keys, even at the same path.
        assert_eq!(
            cache.certificate(Path::new("/a"), || Some(7)).await,
            Some(7)
        );
        assert_eq!(cache.certificate(Path::new("/a"), || None).await, Some(7));
        // So are public halves.
        assert_eq!(cache.public_key(Path::new("/a"), || Some(9)).await, Some(9));
        assert_eq!(cache.public_key(Path::new("/a"), || None).await, Some(9));
        // BatchMode's outcome is kept apart from an interactive one.
        assert_eq!(
            cache.key(Path::new("/a"), true, || async { load(5) }).await,
            Ok(5)
        );
        assert_eq!(loads.load(Ordering::SeqCst), 3);
        assert_eq!(
            format!("{cache:?}"),
            "FileCache { keys: 4, certificates: 1, public_keys: 1 }"
        );
    }

    #[test]
    fn the_person_clock_sums_closed_prompts() {
        let clock = PersonClock::default();
        assert!(!clock.is_waiting());
        assert_eq!(clock.spent(), Duration::ZERO);
        let first = clock.waiting();
        let second = clock.waiting();
        std::thread::sleep(Duration::from_millis(30));
        assert!(clock.is_waiting());
        assert_eq!(
            clock.spent(),
            Duration::ZERO,
            "open prompts are not spent yet"
        );
        drop(first);
        assert!(clock.is_waiting(), "one prompt is still open");
        let after_first = clock.spent();
        assert!(after_first >= Duration::from_millis(30), "{after_first:?}");
        drop(second);
        assert!(!clock.is_waiting());
        assert!(clock.spent() >= after_first + Duration::from_millis(30));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_share_one_load() {
        let cache = Arc::new(FileCache::<u32, (), ()>::default());
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (cache, loads) = (cache.clone(), loads.clone());
            tasks.spawn(async move {
                cache
                    .key(Path::new("/k"), false, || async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        42
                    })
                    .await
            });
        }
        while let Some(v) = tasks.join_next().await {
            assert_eq!(v.unwrap(), 42);
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }
}
