//! Writes the login records [`crate::login_records`] builds: utmp, wtmp and
//! btmp through glibc's utmpx calls (`pututxline`, `updwtmpx`) and the
//! lastlog file directly, on one thread of their own, so that a slow or locked
//! file never holds up a login (glibc waits up to 10 s for the lock of a
//! utmp file, and its utmp calls share process-wide state). Records are
//! queued in order, a session's logout after its login. Also reads what an
//! interactive login is shown first: the account's lastlog record, its
//! `~/.hushlogin` and `/etc/motd`.
//!
//! As with sshd, a missing utmp, wtmp, btmp or lastlog file is not
//! created, a btmp file others may read is not written, and
//! nothing written here ever fails a login: the first failure of each kind
//! is logged as a warning, later ones at debug level.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::login_records::{self, Kind, LastLog, LocalTime, Login, UtmpFields};

/// glibc's utmp (`_PATH_UTMP`, which its utmpx calls use), wtmp and the
/// lastlog file.
const UTMP: &str = "/var/run/utmp";
const WTMP: &str = "/var/log/wtmp";
const BTMP: &str = "/var/log/btmp";
const LASTLOG: &str = "/var/log/lastlog";
const MOTD: &str = "/etc/motd";
/// The most of /etc/motd shown: it is a notice, not a transfer.
const MOTD_LIMIT: u64 = 64 * 1024;
/// Records waiting for the writer; past that (a file locked for long),
/// new ones are dropped, with a warning.
const QUEUE: usize = 1024;

extern "C" {
    /// glibc's `updwtmpx(3)`: appends an entry to a wtmp file, under its
    /// lock (the `libc` crate does not declare it).
    fn updwtmpx(wtmpx_file: *const libc::c_char, utmpx: *const libc::utmpx);
}

/// What can go wrong, each logged as a warning the first time only.
#[derive(Clone, Copy)]
enum Failure {
    Utmp,
    Wtmp,
    Btmp,
    Lastlog,
    Queue,
}

fn warn_once(failure: Failure, message: std::fmt::Arguments<'_>) {
    static WARNED: [AtomicBool; 5] = [const { AtomicBool::new(false) }; 5];
    if WARNED[failure as usize].swap(true, Ordering::Relaxed) {
        tracing::debug!("login records: {message}");
    } else {
        tracing::warn!(
            "login records: {message} (further failures of this kind are logged at debug level)"
        );
    }
}

enum Job {
    Login {
        login: Login,
        uid: u32,
        time: SystemTime,
    },
    Logout {
        login: Login,
        time: SystemTime,
    },
    Failed(Box<UtmpFields>),
}

/// Records queued and not yet written.
static BACKLOG: crate::backlog::Backlog = crate::backlog::Backlog::new();

/// Waits until the records queued so far are written (`within` at most): a
/// connection's process does before it exits.
pub fn flush(within: std::time::Duration) -> bool {
    BACKLOG.wait_empty(within)
}

/// The writer's queue, its thread started at the first login.
fn queue() -> Option<&'static SyncSender<Job>> {
    static QUEUE_TX: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
    QUEUE_TX
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<Job>(QUEUE);
            let started = std::thread::Builder::new()
                .name("login-records".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        write(job);
                        BACKLOG.done();
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    warn_once(
                        Failure::Queue,
                        format_args!("cannot start the writer thread: {e}; none are written"),
                    );
                    None
                }
            }
        })
        .as_ref()
}

fn send(job: Job) {
    let Some(tx) = queue() else {
        return;
    };
    BACKLOG.add();
    match tx.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Disconnected(_)) => BACKLOG.done(),
        Err(TrySendError::Full(_)) => {
            BACKLOG.done();
            warn_once(
                Failure::Queue,
                format_args!("{QUEUE} records wait for a locked or slow file; this one is dropped"),
            );
        }
    }
}

/// A session with a terminal whose login is recorded; dropping it records
/// the logout.
pub struct LoggedIn {
    login: Option<Login>,
}

impl Drop for LoggedIn {
    fn drop(&mut self) {
        if let Some(login) = self.login.take() {
            send(Job::Logout {
                login,
                time: SystemTime::now(),
            });
        }
    }
}

/// Records `login` (utmp, wtmp, and the account's lastlog record, `uid`'s),
/// now; the returned value records the logout when dropped.
pub fn record_login(login: Login, uid: u32) -> LoggedIn {
    send(Job::Login {
        login: login.clone(),
        uid,
        time: SystemTime::now(),
    });
    LoggedIn { login: Some(login) }
}

/// Records a login as `user`, from `addr`, that failed (in btmp: sshd
/// records one for a user name with no account).
pub fn record_failed(user: &str, addr: Option<std::net::IpAddr>) {
    let pid = i32::try_from(std::process::id()).unwrap_or(0);
    send(Job::Failed(Box::new(login_records::failed_fields(
        user,
        addr,
        pid,
        SystemTime::now(),
    ))));
}

fn write(job: Job) {
    let (login, kind, time) = match &job {
        Job::Login { login, time, .. } => (login, Kind::Login, *time),
        Job::Logout { login, time } => (login, Kind::Logout, *time),
        Job::Failed(entry) => {
            if let Err(e) = write_btmp(entry) {
                warn_once(Failure::Btmp, format_args!("cannot write {BTMP}: {e}"));
            }
            return;
        }
    };
    let entry = login_records::fields(login, kind, time);
    if let Err(e) = write_utmp(&entry) {
        warn_once(
            Failure::Utmp,
            format_args!("cannot write {UTMP} for {}: {e}", login.tty),
        );
    }
    if let Err(e) = write_wtmp(&entry) {
        warn_once(
            Failure::Wtmp,
            format_args!("cannot write {WTMP} for {}: {e}", login.tty),
        );
    }
    if let Job::Login { uid, .. } = job {
        let record = login_records::lastlog_record(
            time,
            login_records::line_of(&login.tty),
            &login_records::host_of(login.addr),
        );
        if let Err(e) = write_lastlog(uid, &record) {
            warn_once(
                Failure::Lastlog,
                format_args!("cannot write {LASTLOG} for uid {uid}: {e}"),
            );
        }
    }
}

fn to_utmpx(entry: &UtmpFields) -> libc::utmpx {
    // SAFETY: utmpx is plain data (integers and byte arrays), for which
    // all zeroes is a valid value: what glibc's callers start from too.
    let mut ut: libc::utmpx = unsafe { std::mem::zeroed() };
    ut.ut_type = match entry.kind {
        Kind::Login => libc::USER_PROCESS,
        Kind::Logout => libc::DEAD_PROCESS,
        Kind::Failed => libc::LOGIN_PROCESS,
    };
    ut.ut_pid = entry.pid;
    let copy = |to: &mut [libc::c_char], from: &[u8]| {
        for (t, f) in to.iter_mut().zip(from) {
            *t = *f as libc::c_char;
        }
    };
    copy(&mut ut.ut_line, &entry.line);
    copy(&mut ut.ut_id, &entry.id);
    copy(&mut ut.ut_user, &entry.user);
    copy(&mut ut.ut_host, &entry.host);
    // The field's own integer types: 32-bit on x86_64, where it is kept
    // so for 32-bit compatibility (microseconds fit in any of them).
    ut.ut_tv.tv_sec = entry.seconds.try_into().unwrap_or(0);
    #[allow(clippy::unnecessary_cast)]
    {
        ut.ut_tv.tv_usec = entry.micros as _;
    }
    for (i, word) in entry.addr.chunks_exact(4).enumerate() {
        ut.ut_addr_v6[i] = i32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
    }
    ut
}

/// Puts the entry in utmp, replacing the line's earlier one.
fn write_utmp(entry: &UtmpFields) -> io::Result<()> {
    let ut = to_utmpx(entry);
    // SAFETY: these calls share glibc's process-wide utmp state; this
    // module's one writer thread is the only caller in skiffd. `ut` is a
    // valid utmpx that outlives the call, and pututxline copies it.
    unsafe {
        libc::setutxent();
        let result = if libc::pututxline(&ut).is_null() {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
        libc::endutxent();
        result
    }
}

/// Appends the entry to wtmp, which must exist (as with sshd).
fn write_wtmp(entry: &UtmpFields) -> io::Result<()> {
    // updwtmpx says nothing of failure: check first what can be checked.
    nix::unistd::access(WTMP, nix::unistd::AccessFlags::W_OK).map_err(io::Error::from)?;
    append(WTMP, entry);
    Ok(())
}

/// Appends the entry to a wtmp-format file (glibc locks it meanwhile).
fn append(path: &str, entry: &UtmpFields) {
    let ut = to_utmpx(entry);
    let path = CString::new(path).expect("no NUL in the path");
    // SAFETY: `path` is a NUL-terminated string and `ut` a valid utmpx,
    // both alive for the call, which only reads them.
    unsafe { updwtmpx(path.as_ptr(), &ut) };
}

/// Appends the entry to btmp, which must exist and be private.
fn write_btmp(entry: &UtmpFields) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(BTMP)?;
    if !meta.is_file() || !login_records::btmp_private(meta.uid(), meta.mode()) {
        return Err(io::Error::other(
            "not a regular file of root's closed to others; not written",
        ));
    }
    append(BTMP, entry);
    Ok(())
}

/// Writes uid's lastlog record, in a lastlog file that exists.
fn write_lastlog(uid: u32, record: &[u8]) -> io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(LASTLOG)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    file.write_all_at(record, login_records::lastlog_offset(uid))
}

/// uid's lastlog record: when and whence the account last logged in;
/// `None` when it never did, or the file is missing or unreadable.
pub fn last_login(uid: u32) -> Option<LastLog> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(LASTLOG)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut record = [0u8; login_records::LASTLOG_RECORD];
    file.read_exact_at(&mut record, login_records::lastlog_offset(uid))
        .ok()?;
    login_records::parse_lastlog(&record)
}

/// Whether the account asked for quiet logins (`~/.hushlogin` exists).
pub fn hushed(home: &Path) -> bool {
    home.join(".hushlogin").exists()
}

/// /etc/motd, up to [`MOTD_LIMIT`]; `None` when there is none (or it is
/// not a regular file).
pub fn motd() -> Option<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(MOTD)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = Vec::new();
    file.take(MOTD_LIMIT).read_to_end(&mut text).ok()?;
    Some(text)
}

/// `seconds` since the epoch in the local time zone, as ctime(3) shows it.
pub fn local_time(seconds: u32) -> Option<LocalTime> {
    let time = libc::time_t::from(seconds);
    // SAFETY: tm is plain data; localtime_r fills it from `time`, both
    // valid for the call, and is thread-safe.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&time, &mut tm).is_null() {
            return None;
        }
        tm
    };
    Some(LocalTime {
        year: tm.tm_year + 1900,
        month: u32::try_from(tm.tm_mon).ok()?,
        day: u32::try_from(tm.tm_mday).ok()?,
        weekday: u32::try_from(tm.tm_wday).ok()?,
        hour: u32::try_from(tm.tm_hour).ok()?,
        minute: u32::try_from(tm.tm_min).ok()?,
        second: u32::try_from(tm.tm_sec).ok()?,
    })
}
