//! Host-key verification against OpenSSH known_hosts files: lookup through the
//! sans-IO index in skiff-proto, the StrictHostKeyChecking policy, the
//! interactive question for `ask`, and safe appends of newly accepted keys.
//!
//! Parsed files are cached for the whole process (the agent, or one fan-out
//! run making thousands of connections): each connection only `stat`s the
//! files, a line we append ourselves is added to the cached copy, and the
//! index remembers which hashed lines each host name matched. Only a change
//! made by someone else makes us read a file again.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::certificate::CertType;
use russh::keys::{Certificate, HashAlg, PublicKey};
use skiff_proto::known_hosts::host_cert::{self, CertVerdict, HostCertificate, RevokedKey};
use skiff_proto::known_hosts::{
    self, Decision, HostKeyStatus, KnownHostsFile, StrictHostKeyChecking,
};

use crate::error::{ErrorKind, SkiffError};
use crate::settings::ConnectSettings;

/// What `stat` says about a file, enough to tell that its content changed:
/// a rewrite in place changes the times (and usually the size), a
/// replacement by rename changes the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time, seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Status change time, which no one can set back by hand.
    pub ctime: (i64, i64),
}

impl FileStamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// True when the file changed so shortly before `now` that another change
    /// within the same timestamp tick could leave the stamp as it is.
    pub(crate) fn racy(&self, now: SystemTime) -> bool {
        let whole_seconds = self.mtime.1 == 0 && self.ctime.1 == 0;
        let window = if whole_seconds {
            Duration::from_secs(2)
        } else {
            RACY_WINDOW
        };
        let latest = self.mtime.max(self.ctime);
        let changed = Duration::new(
            u64::try_from(latest.0).unwrap_or(0),
            u32::try_from(latest.1).unwrap_or(0),
        );
        now.duration_since(UNIX_EPOCH)
            .map_or(true, |now| now < changed + window)
    }
}

/// A file read less than this long after it was last changed (on file
/// systems with sub-second timestamps) is read again at the next connection
/// even if its stamp looks the same, because a second change within the
/// same kernel timestamp tick and of the same size would not show in `stat`.
pub const RACY_WINDOW: Duration = Duration::from_millis(50);

/// One known_hosts file as cached for the process.
struct CachedFile {
    state: RwLock<CachedState>,
}

struct CachedState {
    /// What `stat` said about the content in `file`; `None`: no such file.
    stamp: Option<FileStamp>,
    /// Read too soon after a change to trust `stamp` (see [`RACY_WINDOW`]).
    racy: bool,
    file: KnownHostsFile,
}

impl CachedFile {
    // Writers only add whole parsed lines; a panic cannot leave half of one.
    fn read(&self) -> RwLockReadGuard<'_, CachedState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, CachedState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The cache entry for one path.
#[derive(Default)]
struct Slot {
    /// The newest reading of the file. Held while checking and (re)reading
    /// it, so that concurrent connections read a changed file once (other
    /// paths are not held up), and across our own append and its addition
    /// to the cached copy, so that neither another connection's check nor
    /// this process's other appends can come in between and take our line
    /// for someone else's change.
    current: Mutex<Option<Arc<CachedFile>>>,
    /// The stamp right after our last append. A file whose stamp is this
    /// last changed by our own hand, with content we know, so reading it
    /// soon after is not racy. Held only briefly, nothing taken inside it.
    own_append: Mutex<Option<FileStamp>>,
    /// How many times the file was read and parsed whole.
    parses: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves its data whole (plain assignments,
    // or whole parsed lines added), so a panic elsewhere cannot corrupt it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Path -> slot. The map lock is only held to find a slot.
fn slot(path: &Path) -> Arc<Slot> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Arc<Slot>>>> = OnceLock::new();
    let mut map = lock(CACHE.get_or_init(Default::default));
    map.entry(path.to_path_buf()).or_default().clone()
}

/// How many times this process has read and parsed `path` whole (lines it
/// appended itself are not counted: they are added to the cached copy).
pub fn known_hosts_parses(path: &Path) -> u64 {
    slot(path).parses.load(Ordering::Relaxed)
}

/// The cached reading of `path`, read again if the file changed since.
/// A missing file is cached as empty; an unreadable one is skipped with a
/// warning and not cached.
fn cached(path: &Path) -> Option<Arc<CachedFile>> {
    let slot = slot(path);
    let mut current = lock(&slot.current);
    let stamp = match std::fs::metadata(path) {
        Ok(meta) => Some(FileStamp::of(&meta)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("cannot read {}: {e}", path.display());
            return None;
        }
    };
    if let Some(c) = current.as_ref() {
        let state = c.read();
        if state.stamp == stamp && !state.racy {
            return Some(c.clone());
        }
    }
    let label = path.display().to_string();
    let state = match read_whole(path) {
        Ok(Some((stamp, text, steady))) => {
            slot.parses.fetch_add(1, Ordering::Relaxed);
            let (file, warnings) = known_hosts::parse(&label, &text);
            for w in warnings {
                tracing::warn!("{w}");
            }
            let ours = *lock(&slot.own_append) == Some(stamp);
            CachedState {
                stamp: Some(stamp),
                racy: !steady || (!ours && stamp.racy(SystemTime::now())),
                file,
            }
        }
        Ok(None) => CachedState {
            stamp: None,
            racy: false,
            file: KnownHostsFile::new(&label),
        },
        Err(e) => {
            tracing::warn!("cannot read {}: {e}", path.display());
            *current = None;
            return None;
        }
    };
    let fresh = Arc::new(CachedFile {
        state: RwLock::new(state),
    });
    *current = Some(fresh.clone());
    Some(fresh)
}

/// The file's text, the stamp of what was read, and whether the two surely
/// belong together (the file did not change while it was read); `None`
/// when there is no such file.
fn read_whole(path: &Path) -> std::io::Result<Option<(FileStamp, String, bool)>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let before = FileStamp::of(&file.metadata()?);
    let mut text = String::with_capacity(usize::try_from(before.size).unwrap_or(0));
    file.read_to_string(&mut text)?;
    let after = FileStamp::of(&file.metadata()?);
    let steady = before == after && u64::try_from(text.len()).is_ok_and(|n| n == after.size);
    Ok(Some((after, text, steady)))
}

/// Appends `line` (see [`append_line`]) and adds it to the cached copy, if
/// the cache held exactly the content the line was appended to and nothing
/// else was written meanwhile; otherwise (or after a racy read) the next
/// connection reads the file again. `written_for` is the lookup name the
/// line records.
fn append_and_note(path: &Path, line: &str, written_for: &str) -> std::io::Result<()> {
    let slot = slot(path);
    let current = lock(&slot.current);
    let appended = append_line(path, line)?;
    let (before, after) = (appended.before, appended.after);
    *lock(&slot.own_append) = Some(after);
    let Some(c) = current.as_ref() else {
        return Ok(());
    };
    let mut state = c.write();
    let had_before = match state.stamp {
        Some(stamp) => stamp == before,
        // Missing when last looked at; created (empty) since.
        None => before.size == 0,
    };
    let only_ours = (after.dev, after.ino) == (before.dev, before.ino)
        && u64::try_from(appended.text.len()).is_ok_and(|n| before.size + n == after.size);
    if had_before && only_ours && !state.racy {
        for w in state.file.extend(&appended.text, Some(written_for)) {
            tracing::warn!("{w}");
        }
        state.stamp = Some(after);
    }
    Ok(())
}

/// Runs `f` (which replaces `path` by a rename, say) with this process's
/// appends to `path` held off, so that none lands in the file being
/// replaced and is lost.
pub(crate) fn holding_appends<R>(path: &Path, f: impl FnOnce() -> R) -> R {
    let slot = slot(path);
    let _current = lock(&slot.current);
    f()
}

/// The known_hosts files for one connection attempt: shared, cached
/// readings (see the module documentation).
pub struct KnownHosts {
    files: Vec<Arc<CachedFile>>,
    /// How many of `files`, at the front, are user files.
    user_files: usize,
    /// Where new keys are recorded: the first user file.
    record_to: Option<PathBuf>,
    /// `KnownHostsCommand`, key tokens still to expand.
    command: Option<String>,
    /// Warnings for the person who ran the command ("Permanently added ...").
    /// Collected rather than printed: the agent and the fan-out runner
    /// deliver them to the right terminal or host record.
    notices: std::sync::Mutex<Vec<String>>,
}

/// How a host certificate fared (see [`KnownHosts::verify_certificate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateCheck {
    /// A `@cert-authority` line vouches for it and its signature verifies.
    Trusted,
    /// Not trusted, for this reason: as ssh does, the key inside is then
    /// checked as a plain host key.
    Untrusted(String),
}

/// What [`KnownHosts::verify`] let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKeyTrust {
    /// Known, vouched for, or new and accepted (recorded, or by a person).
    Verified,
    /// Not the key known for the host, let through by
    /// `StrictHostKeyChecking no` with a warning. As in ssh, such a
    /// connection gets no password, no keyboard-interactive answer, no
    /// forwarded agent and no forwarding
    /// ([`ConnectSettings::guarded_for_a_changed_host_key`]).
    Mismatched,
}

/// What to do after looking the key up, once the files are released.
enum Next {
    Done(Result<HostKeyTrust, SkiffError>),
    Record,
    Ask(String),
}

impl KnownHosts {
    /// The configured files as this process last read them, reading a file
    /// again only if it changed (a `stat` per file otherwise). Missing files
    /// count as empty; malformed lines are skipped with a warning naming
    /// file:line, when the file is read.
    pub fn load(settings: &ConnectSettings) -> Self {
        let mut files: Vec<_> = settings
            .user_known_hosts
            .iter()
            .filter_map(|path| cached(path))
            .collect();
        let user_files = files.len();
        files.extend(
            settings
                .global_known_hosts
                .iter()
                .filter_map(|path| cached(path)),
        );
        KnownHosts {
            files,
            user_files,
            record_to: settings.user_known_hosts.first().cloned(),
            command: settings.known_hosts_command.clone(),
            notices: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on the files, in configured order, read-locked; the locks
    /// are released after. They are taken in one order for the whole
    /// process (by address), each once even if a file is configured twice,
    /// so that connections holding several while others append can never
    /// wait on each other in a circle.
    fn with_files<R>(&self, f: impl FnOnce(&[&KnownHostsFile]) -> R) -> R {
        let mut order: Vec<&Arc<CachedFile>> = self.files.iter().collect();
        order.sort_by_key(|c| Arc::as_ptr(c));
        order.dedup_by_key(|c| Arc::as_ptr(c));
        let guards: Vec<_> = order.iter().map(|c| (Arc::as_ptr(c), c.read())).collect();
        let files: Vec<&KnownHostsFile> = self
            .files
            .iter()
            .filter_map(|c| {
                let guard = guards.iter().find(|(p, _)| *p == Arc::as_ptr(c));
                guard.map(|(_, g)| &g.file)
            })
            .collect();
        f(&files)
    }

    /// [`Self::with_files`], with the lines `KnownHostsCommand` printed for
    /// this key after them.
    fn with_all_files<R>(
        &self,
        from_command: Option<&KnownHostsFile>,
        f: impl FnOnce(&[&KnownHostsFile]) -> R,
    ) -> R {
        self.with_files(|files| {
            let mut all = files.to_vec();
            all.extend(from_command);
            f(&all)
        })
    }

    /// Runs `KnownHostsCommand` (if any) for the key `key_type`/`blob` the
    /// server presented, through the shell, and reads what it prints as
    /// known_hosts lines. A command that fails gives no lines, and a
    /// warning that is also returned (for a refusal to mention); its
    /// standard error is the person's.
    fn command_lines(
        &self,
        settings: &ConnectSettings,
        key_type: &str,
        blob: &[u8],
    ) -> (Option<KnownHostsFile>, Option<String>) {
        let failed = |why: String| {
            self.notice(format!("skiff: warning: {why}"));
            (None, Some(why))
        };
        let Some(template) = self.command.as_ref() else {
            return (None, None);
        };
        let (host, port) = settings.host_key_name();
        let searched = known_hosts::host_port_name(host, port);
        let alias = settings
            .host_key_alias
            .clone()
            .unwrap_or_else(|| settings.original_host.clone());
        let key = known_hosts::key_base64(blob);
        let fingerprint = known_hosts::fingerprint_sha256(blob);
        let values = [
            ('H', searched.as_str()),
            ('I', "HOSTNAME"),
            ('K', key.as_str()),
            ('k', alias.as_str()),
            ('t', key_type),
            ('f', fingerprint.as_str()),
        ];
        let command = match skiff_proto::ssh_config::expand_late_tokens(template, &values) {
            Ok(c) => c,
            Err(e) => return failed(format!("KnownHostsCommand: {e}")),
        };
        let output = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&command)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .output();
        let label = format!("KnownHostsCommand {command:?}");
        match output {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                let (file, warnings) = known_hosts::parse(&label, &text);
                for w in warnings {
                    self.notice(format!("skiff: warning: {w}"));
                }
                (Some(file), None)
            }
            Ok(out) => failed(format!(
                "{label} failed ({}); its output is not used",
                out.status
            )),
            Err(e) => failed(format!("cannot run {label}: {e}")),
        }
    }

    /// The warnings gathered so far, emptying the list.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().expect("not poisoned"))
    }

    /// Adds a warning for the person who ran the command. Parts of it may
    /// be a server's words (a banner, a certificate's principals), so
    /// anything but newlines and tabs that could steer a terminal is shown
    /// escaped.
    pub fn notice(&self, text: String) {
        let text = match skiff_proto::terminal_text::lines(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(escaped) => escaped,
        };
        self.notices.lock().expect("not poisoned").push(text);
    }

    /// Whether `key` is recorded for this host, as a plain host key, in a
    /// user known_hosts file: the only way a key earns `UpdateHostKeys` (not
    /// through the global files, `KnownHostsCommand`, a certificate, or a
    /// first use accepted now).
    pub fn known_in_user_file(&self, settings: &ConnectSettings, key: &PublicKey) -> bool {
        let Ok(blob) = key.to_bytes() else {
            return false;
        };
        let key_type = key.algorithm().as_str().to_string();
        let (host, port) = settings.host_key_name();
        self.with_user_files(|user| {
            matches!(
                known_hosts::check(user, host, port, &key_type, &blob),
                HostKeyStatus::Known(_)
            )
        })
    }

    /// [`Self::with_files`] for the user files only.
    pub(crate) fn with_user_files<R>(&self, f: impl FnOnce(&[&KnownHostsFile]) -> R) -> R {
        self.with_files(|files| f(&files[..self.user_files.min(files.len())]))
    }

    /// Key types already recorded for this host, most trusted first, so the
    /// key exchange can prefer a host key we can verify (as ssh does).
    pub fn known_key_types(&self, host: &str, port: u16) -> Vec<String> {
        self.with_files(|files| host_key_types(known_hosts::lookup(files, host, port)))
    }

    /// Like [`KnownHosts::known_key_types`], but cheaper: from the entries
    /// that are not hashed when there are any, which costs no hashing, else
    /// from the first hashed host-key entry for the host, which hashes the
    /// name only with the salts up to that line. Then `hashed_left_out` is
    /// true if other hashed entries may know other types; see
    /// [`KnownHosts::order_missed_a_type`]. Only a host with no entry at all
    /// costs a look at every hashed entry.
    pub fn preferred_key_types(&self, host: &str, port: u16) -> KeyTypeOrder {
        self.with_files(|files| {
            let types = host_key_types(known_hosts::lookup_plain(files, host, port));
            if !types.is_empty() {
                return KeyTypeOrder {
                    types,
                    hashed_left_out: files.iter().any(|f| f.has_hashed()),
                };
            }
            match known_hosts::first_hashed(files, host, port, |e| e.marker.is_none()) {
                Some(first) => KeyTypeOrder {
                    types: host_key_types(vec![first]),
                    hashed_left_out: true,
                },
                // Every hashed entry was looked at, and none is a host key.
                None => KeyTypeOrder {
                    types: Vec::new(),
                    hashed_left_out: false,
                },
            }
        })
    }

    /// After a key exchange ordered by `partial_types` (a
    /// [`KnownHosts::preferred_key_types`] with some hashed entries left out):
    /// whether the server's `key` is not known while hashed entries know
    /// types that order did not prefer. Ordering by every type might then
    /// have chosen a key that is known, so the caller should connect again
    /// with [`KnownHosts::known_key_types`].
    pub fn order_missed_a_type(
        &self,
        host: &str,
        port: u16,
        key: &PublicKey,
        partial_types: &[String],
    ) -> bool {
        let Ok(blob) = key.to_bytes() else {
            return false;
        };
        let key_type = key.algorithm().as_str().to_string();
        self.with_files(|files| {
            if let HostKeyStatus::Known(_) = known_hosts::check(files, host, port, &key_type, &blob)
            {
                return false;
            }
            host_key_types(known_hosts::lookup(files, host, port))
                .iter()
                .any(|t| !partial_types.contains(t))
        })
    }

    /// Whether a `@cert-authority` line applies to this host, so that the key
    /// exchange should ask the server for a host certificate.
    pub fn wants_certificates(&self, settings: &ConnectSettings) -> bool {
        let (host, port) = settings.host_key_name();
        self.with_files(|files| host_cert::authority_applies(files, host, port))
    }

    /// Judges the host certificate the server presented against the
    /// `@cert-authority` and `@revoked` lines (see
    /// [`host_cert::check_host_certificate`]), then verifies the CA's
    /// signature over it. A revoked CA or host key is an error: the server
    /// is refused outright.
    pub fn verify_certificate(
        &self,
        settings: &ConnectSettings,
        cert: &Certificate,
    ) -> Result<CertificateCheck, SkiffError> {
        let (host, port) = settings.host_key_name();
        let unusable = |e: russh::keys::ssh_key::Error| {
            SkiffError::new(
                ErrorKind::Protocol,
                format!("server sent an unusable host certificate: {e}"),
            )
        };
        let key_blob = PublicKey::from(cert.public_key().clone())
            .to_bytes()
            .map_err(unusable)?;
        let ca_blob = PublicKey::from(cert.signature_key().clone())
            .to_bytes()
            .map_err(unusable)?;
        let critical_options: Vec<String> = cert.critical_options().keys().cloned().collect();
        let signature_algorithm = cert.signature().algorithm();
        let facts = HostCertificate {
            is_host_certificate: cert.cert_type() == CertType::Host,
            key_id: cert.key_id(),
            principals: cert.valid_principals(),
            valid_after: cert.valid_after(),
            valid_before: cert.valid_before(),
            critical_options: &critical_options,
            key_blob: &key_blob,
            ca_blob: &ca_blob,
            signature_algorithm: signature_algorithm.as_str(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = known_hosts::host_port_name(host, port);
        let allowed: Vec<&str> = settings
            .algorithms
            .ca_signature
            .iter()
            .map(String::as_str)
            .collect();
        let (from_command, _) = self.command_lines(settings, cert.algorithm().as_str(), &key_blob);
        let verdict = self.with_all_files(from_command.as_ref(), |files| {
            match host_cert::check_host_certificate(
                files,
                host,
                port,
                host,
                &facts,
                &allowed,
                now,
            ) {
                CertVerdict::Trusted(found) => Ok(found.to_string()),
                CertVerdict::Untrusted(reason) => Err(Ok(reason)),
                CertVerdict::Revoked { found, key } => {
                    let (what, blob) = match key {
                        RevokedKey::Authority => ("the CA key that signed its certificate", &ca_blob),
                        RevokedKey::HostKey => ("its host key", &key_blob),
                    };
                    Err(Err(SkiffError::new(
                        ErrorKind::HostKey,
                        format!(
                            "{name}: host key verification failed: {what} ({}) is marked @revoked at {found}; refusing to connect",
                            known_hosts::fingerprint_sha256(blob)
                        ),
                    )))
                }
            }
        });
        let authority = match verdict {
            Ok(authority) => authority,
            Err(Ok(reason)) => return Ok(CertificateCheck::Untrusted(reason)),
            Err(Err(refused)) => return Err(refused),
        };
        // Every field checked; what is left is whether that CA signed it.
        let ca_fingerprint = cert.signature_key().fingerprint(HashAlg::Sha256);
        if cert.validate_at(now, [&ca_fingerprint]).is_err() {
            return Ok(CertificateCheck::Untrusted(format!(
                "the signature on certificate {:?} does not verify with the CA key at {authority}",
                cert.key_id()
            )));
        }
        tracing::debug!(
            "{name}: host certificate {:?} signed by the CA at {authority}",
            cert.key_id()
        );
        Ok(CertificateCheck::Trusted)
    }

    /// Applies the policy to the key the server presented.
    pub fn verify(
        &self,
        settings: &ConnectSettings,
        key: &PublicKey,
    ) -> Result<HostKeyTrust, SkiffError> {
        let blob = key.to_bytes().map_err(|e| {
            SkiffError::new(
                ErrorKind::Protocol,
                format!("server sent an unusable host key: {e}"),
            )
        })?;
        let key_type = key.algorithm().as_str().to_string();
        let (host, port) = settings.host_key_name();
        let (from_command, command_failure) = self.command_lines(settings, &key_type, &blob);
        // A refusal says when the command that could have vouched failed.
        let refuse = |msg: String| {
            let msg = match &command_failure {
                Some(why) => format!("{msg} ({why})"),
                None => msg,
            };
            SkiffError::new(ErrorKind::HostKey, msg)
        };
        // Decide with the files read-locked; record (which takes a write
        // lock) and ask (which waits for a person) after releasing them.
        let next = self.with_all_files(from_command.as_ref(), |files| {
            let status = known_hosts::check(files, host, port, &key_type, &blob);
            match known_hosts::decide(
                &status,
                settings.strict_host_key_checking,
                host,
                port,
                &key_type,
                &blob,
            ) {
                Decision::Accept => Next::Done(Ok(HostKeyTrust::Verified)),
                Decision::AcceptWithWarning(w) => {
                    self.notice(w);
                    Next::Done(Ok(HostKeyTrust::Mismatched))
                }
                Decision::Refuse(detail) => {
                    tracing::debug!("{detail}");
                    Next::Done(Err(refuse(one_line_refusal(
                        &status, settings, &key_type, &blob,
                    ))))
                }
                Decision::AcceptAndRecord => Next::Record,
                Decision::AskUser if settings.batch_mode || settings.fan_out => {
                    let why = if settings.batch_mode {
                        "BatchMode is on"
                    } else {
                        "a fan-out asks no host-key questions"
                    };
                    Next::Done(Err(refuse(format!(
                        "host key for {} is not known and {why} ({}); add it to known_hosts or use -o StrictHostKeyChecking=accept-new",
                        known_hosts::host_port_name(host, port),
                        known_hosts::fingerprint_sha256(&blob)
                    ))
                    .needing_person()))
                }
                Decision::AskUser => {
                    Next::Ask(known_hosts::ask_prompt(host, port, &key_type, &blob))
                }
            }
        });
        match next {
            Next::Done(result) => result,
            Next::Record => self
                .record(settings, &key_type, &blob)
                .map(|()| HostKeyTrust::Verified),
            Next::Ask(prompt) => {
                if crate::prompt_screen::while_prompting(|| ask_on_terminal(&prompt, &blob))? {
                    self.record(settings, &key_type, &blob)
                        .map(|()| HostKeyTrust::Verified)
                } else {
                    Err(refuse(format!(
                        "host key verification failed: you declined the key of {host}"
                    )))
                }
            }
        }
    }

    fn record(
        &self,
        settings: &ConnectSettings,
        key_type: &str,
        blob: &[u8],
    ) -> Result<(), SkiffError> {
        let Some(path) = &self.record_to else {
            return Ok(());
        };
        let salt = settings.hash_known_hosts.then(|| {
            let mut s = [0u8; 20];
            rand::fill(&mut s);
            s
        });
        let (host, port) = settings.host_key_name();
        let line = known_hosts::format_entry(host, port, key_type, blob, salt.as_ref());
        let name = known_hosts::host_port_name(host, port);
        match append_and_note(path, &line, &name) {
            Ok(()) => self.notice(format!(
                "Warning: Permanently added '{name}' ({}) to the list of known hosts.",
                known_hosts::key_type_label(key_type)
            )),
            // Not being able to record is not a reason to refuse a key the policy accepts.
            Err(e) => self.notice(format!(
                "skiff: warning: could not add the host key to {}: {e}",
                path.display()
            )),
        }
        Ok(())
    }
}

/// What [`append_line`] did: the file's stamp just before and just after the
/// write, and the exact text written (the line, plus a newline in front when
/// the file did not end with one).
#[derive(Debug, Clone)]
pub struct Appended {
    pub before: FileStamp,
    pub after: FileStamp,
    pub text: String,
}

/// Appends one line with a single write, creating the file 0600 (and its
/// directory 0700) when missing and adding a newline first if the file
/// does not end with one. Existing content is never rewritten. A regular
/// file is flushed to disk; anything else (`UserKnownHostsFile /dev/null`,
/// the usual way of keeping nothing, whose data cannot be synced) just
/// takes the write, as OpenSSH's does.
pub fn append_line(path: &Path, line: &str) -> std::io::Result<Appended> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    let before = FileStamp::of(&file.metadata()?);
    let len = before.size;
    let mut text = String::with_capacity(line.len() + 1);
    if len > 0 {
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            text.push('\n');
        }
    }
    text.push_str(line);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    file.write_all(text.as_bytes())?;
    let written = file.metadata()?;
    if written.is_file() {
        file.sync_data()?;
    }
    let after = FileStamp::of(&written);
    Ok(Appended {
        before,
        after,
        text,
    })
}

/// Asks the yes/no/fingerprint question on the controlling terminal.
fn ask_on_terminal(prompt: &str, blob: &[u8]) -> Result<bool, SkiffError> {
    let no_tty = |e: std::io::Error| {
        SkiffError::new(
            ErrorKind::HostKey,
            format!("host key is not known and there is no terminal to ask on ({e}); use -o StrictHostKeyChecking=accept-new or add it to known_hosts"),
        )
    };
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(no_tty)?;
    let mut reader = std::io::BufReader::new(tty.try_clone().map_err(no_tty)?);
    write!(tty, "{prompt}").map_err(no_tty)?;
    for _ in 0..3 {
        let mut answer = String::new();
        std::io::BufRead::read_line(&mut reader, &mut answer).map_err(no_tty)?;
        if let Some(yes) = known_hosts::ask_answer(&answer, blob) {
            return Ok(yes);
        }
        write!(tty, "Please type 'yes', 'no' or the fingerprint: ").map_err(no_tty)?;
    }
    Ok(false)
}

/// One line that says what was refused, with fingerprints and file:line, and what to do.
fn one_line_refusal(
    status: &HostKeyStatus<'_>,
    settings: &ConnectSettings,
    key_type: &str,
    blob: &[u8],
) -> String {
    let (host, port) = settings.host_key_name();
    let name = known_hosts::host_port_name(host, port);
    let label = known_hosts::key_type_label(key_type);
    let fp = known_hosts::fingerprint_sha256(blob);
    match status {
        HostKeyStatus::Revoked(found) => format!(
            "{name}: host key verification failed: the {label} key {fp} is marked @revoked at {found}; refusing to connect"
        ),
        HostKeyStatus::Changed { old } | HostKeyStatus::OtherTypesKnown(old) => {
            let olds: Vec<String> = old.iter().map(|f| format!("{} {} at {f}", known_hosts::key_type_label(&f.entry.key_type), f.entry.fingerprint())).collect();
            let files: Vec<&str> = old.iter().map(|f| f.file).collect();
            format!(
                "{name}: host key verification failed: REMOTE HOST KEY HAS CHANGED (someone may be intercepting the connection): \
                 the server offered {label} {fp}, known_hosts has {}; if the change is expected, remove the old entry with \
                 ssh-keygen -f '{}' -R '{name}'",
                olds.join(", "),
                files.first().copied().unwrap_or("~/.ssh/known_hosts")
            )
        }
        _ => format!(
            "{name}: host key verification failed: no {label} host key is known for this host and StrictHostKeyChecking is yes \
             (the server offered {fp}); after checking the fingerprint, connect once with -o StrictHostKeyChecking=accept-new"
        ),
    }
}

/// Converts the config policy for display in -v output.
pub fn policy_name(p: StrictHostKeyChecking) -> &'static str {
    match p {
        StrictHostKeyChecking::Yes => "yes",
        StrictHostKeyChecking::AcceptNew => "accept-new",
        StrictHostKeyChecking::No => "no",
        StrictHostKeyChecking::Ask => "ask",
    }
}

/// Key types to prefer in a key exchange (see
/// [`KnownHosts::preferred_key_types`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTypeOrder {
    /// Recorded key types, in file order.
    pub types: Vec<String>,
    /// Hashed entries were not looked at and may know more types.
    pub hashed_left_out: bool,
}

/// The key types of the host-key entries (no marker) among `found`, first
/// appearance first.
fn host_key_types(found: Vec<known_hosts::Found<'_>>) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    for f in found {
        if f.entry.marker.is_none() && !types.contains(&f.entry.key_type) {
            types.push(f.entry.key_type.clone());
        }
    }
    types
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn recently_changed_files_are_racy() {
        let at = |secs: i64, nanos: i64| FileStamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: (secs - 100, nanos),
            ctime: (secs, nanos),
        };
        let now = UNIX_EPOCH + Duration::new(1_000_000, 500_000_000);
        assert!(at(1_000_000, 480_000_000).racy(now));
        assert!(!at(1_000_000, 400_000_000).racy(now));
        assert!(!at(999_999, 1).racy(now));
        // Whole-second timestamps: the file system may round by a second or two.
        assert!(at(999_999, 0).racy(now));
        assert!(!at(999_997, 0).racy(now));
        // A clock before the epoch or a stamp from the future: never trusted.
        assert!(at(1_000_001, 0).racy(now));
        assert!(at(5, 5).racy(UNIX_EPOCH - Duration::from_secs(1)));
    }

    #[test]
    fn appending_to_dev_null_keeps_nothing_and_is_no_error() {
        let appended = append_line(Path::new("/dev/null"), "a ssh-ed25519 AAAA\n").unwrap();
        assert_eq!(appended.text, "a ssh-ed25519 AAAA\n");
        assert_eq!(appended.after.size, 0);
    }

    #[test]
    fn append_creates_private_file_and_repairs_missing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_hosts");
        append_line(&path, "a ssh-ed25519 AAAA\n").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"b ssh-ed25519 BBBB")
            .unwrap();
        append_line(&path, "c ssh-ed25519 CCCC\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a ssh-ed25519 AAAA\nb ssh-ed25519 BBBB\nc ssh-ed25519 CCCC\n"
        );
    }
}
