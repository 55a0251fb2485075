//! Account policy for key logins, as sshd applies it without PAM: what
//! the shadow database says (a locked password field, an account expiry
//! date), what the login shell allows a session to run, and whether
//! `/etc/nologin` closes the host to everyone but root.
//!
//! The rules are pure functions over plain data ([`shadow_refusal`],
//! [`shell_use`], [`nologin_applies`], [`nologin_message`]); the system is
//! read in one place each, beside them: [`shadow_entry`] asks the C
//! library (`getspnam_r`, so NSS sources count as they do for sshd) and
//! [`read_nologin`] reads the file, bounded and never blocking.
//!
//! Password ageing (`sp_lstchg`, `sp_max`, `sp_inact`) is not consulted:
//! skiffd takes no passwords, and sshd without PAM applies it only to
//! password logins. An account is shut to keys by locking it (`usermod
//! -L`, `passwd -l`) or by an expiry date (`usermod -e`, `chage -E`).

use std::ffi::{CStr, CString};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Where the administrator's "no logins" notice lives. Tests point it
/// elsewhere only through a mount namespace.
pub const NOLOGIN_FILE: &str = "/etc/nologin";

/// How much of the notice is shown to a client.
pub const NOLOGIN_SHOWN: usize = 4096;

/// What the notice says when the file is empty or unreadable.
const NOLOGIN_DEFAULT: &str = "Logins are currently disabled.";

/// The largest buffer handed to `getspnam_r` (an entry is one line).
const SHADOW_BUFFER_MAX: usize = 1 << 20;

/// What the shadow database says about an account, as far as key logins
/// care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowEntry {
    /// The password field (`!...` when locked, `*` for no password).
    pub password: String,
    /// `sp_expire`: the day (counted from 1970-01-01) from which the
    /// account may not log in; `None` when it never expires.
    pub expire_day: Option<i64>,
}

/// The outcome of asking for an account's shadow entry.
#[derive(Debug)]
pub enum ShadowLookup {
    Found(ShadowEntry),
    /// No entry (or, for a server that is not root, none it may read).
    Absent,
    /// The database could not be read.
    Unreadable(io::Error),
}

/// Why the shadow entry (or, without one, the passwd field) forbids every
/// login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShadowRefusal {
    /// The password field starts with `!` (`passwd -l`, `usermod -L`,
    /// useradd's default) or `*LK*`.
    Locked,
    /// The expiry date has come: the account expired on `day`.
    Expired { day: i64 },
}

/// Days since 1970-01-01 (UTC): the unit of shadow dates.
pub fn today() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs() / 86_400) as i64)
        .unwrap_or(0)
}

/// Whether `password` (the shadow or passwd field) and `expire_day` shut
/// the account on `today`. An account is expired from its expiry day on,
/// as chage(1) and PAM count it ("no longer accessible" on that date);
/// sshd without PAM lets it in for that one last day.
pub fn shadow_refusal(
    password: &str,
    expire_day: Option<i64>,
    today: i64,
) -> Option<ShadowRefusal> {
    if password.starts_with('!') || password.starts_with("*LK*") {
        return Some(ShadowRefusal::Locked);
    }
    match expire_day {
        Some(day) if day >= 0 && today >= day => Some(ShadowRefusal::Expired { day }),
        _ => None,
    }
}

/// `day` (counted from 1970-01-01) as `YYYY-MM-DD`, for log lines.
pub fn shadow_date(day: i64) -> String {
    let secs = day.saturating_mul(86_400) as libc::time_t;
    // SAFETY: gmtime_r only writes the tm we own and reads `secs`.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::gmtime_r(&secs, &mut tm).is_null() {
            return format!("day {day}");
        }
        format!(
            "{:04}-{:02}-{:02}",
            i64::from(tm.tm_year) + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    }
}

/// Asks the C library for `name`'s shadow entry. A server that is not
/// root may not read the database: that is [`ShadowLookup::Absent`].
pub fn shadow_entry(name: &str) -> ShadowLookup {
    let Ok(cname) = CString::new(name) else {
        return ShadowLookup::Absent;
    };
    let mut buf: Vec<libc::c_char> = vec![0; 4096];
    loop {
        // SAFETY: an all-zero spwd (null pointers, zero numbers) is a valid value.
        let mut entry: libc::spwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::spwd = std::ptr::null_mut();
        // SAFETY: every pointer is to memory we own for the call: the
        // NUL-terminated name, the entry, `buf` with its true length, and
        // the result pointer. The strings the entry points to live in `buf`.
        let rc = unsafe {
            libc::getspnam_r(
                cname.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE && buf.len() < SHADOW_BUFFER_MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc == 0 && !found.is_null() {
            let password = if entry.sp_pwdp.is_null() {
                String::new()
            } else {
                // SAFETY: getspnam_r set sp_pwdp to a NUL-terminated string
                // inside `buf`, which is still alive and unchanged.
                unsafe { CStr::from_ptr(entry.sp_pwdp) }
                    .to_string_lossy()
                    .into_owned()
            };
            let expire_day = (entry.sp_expire >= 0).then_some(entry.sp_expire as i64);
            return ShadowLookup::Found(ShadowEntry {
                password,
                expire_day,
            });
        }
        return match rc {
            0 | libc::ENOENT => ShadowLookup::Absent,
            libc::EACCES | libc::EPERM if !nix::unistd::geteuid().is_root() => ShadowLookup::Absent,
            errno => ShadowLookup::Unreadable(io::Error::from_raw_os_error(errno)),
        };
    }
}

/// What a login shell lets a session run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellUse {
    /// Commands and interactive shells.
    Commands,
    /// Nothing: `nologin` or `false`, set to keep the account from running
    /// anything. The account still authenticates (sshd's behaviour), so
    /// that forwarding and skiffd's own SFTP server, which need no shell,
    /// work where the configuration allows them.
    Nothing,
}

/// How `shell` (an existing, executable file) is used. `/etc/shells` is
/// not consulted, as sshd does not.
pub fn shell_use(shell: &Path) -> ShellUse {
    match shell.file_name().and_then(|n| n.to_str()) {
        Some("nologin" | "false") => ShellUse::Nothing,
        _ => ShellUse::Commands,
    }
}

/// What a session refused because the shell runs nothing shows on its
/// standard error (the words of nologin(8), which sshd's users see).
pub const NO_SHELL_NOTICE: &str = "This account is currently not available.";

/// Whether a notice in `/etc/nologin` keeps `uid` out: everyone but root.
pub fn nologin_applies(uid: u32) -> bool {
    uid != 0
}

/// The notice to show a client for the contents of `/etc/nologin`: at
/// most [`NOLOGIN_SHOWN`] bytes, as text, with terminal controls other than
/// newlines and tabs escaped, and a default for an empty file.
pub fn nologin_message(contents: &[u8]) -> String {
    let shown = &contents[..contents.len().min(NOLOGIN_SHOWN)];
    let text = String::from_utf8_lossy(shown).replace("\r\n", "\n");
    let text = text.trim_end();
    if text.is_empty() {
        return NOLOGIN_DEFAULT.to_string();
    }
    skiff_proto::terminal_text::lines(text).into_owned()
}

/// The notice of `path` (see [`nologin_message`]) when it exists, as
/// anything (sshd asks `stat` only whether it is there; a dangling symbolic
/// link is not); `None` when it does not. Read without blocking (a FIFO
/// there cannot hold a login up) and bounded.
pub fn read_nologin(path: &Path) -> Option<String> {
    if std::fs::metadata(path).is_err() {
        return None;
    }
    let mut contents = Vec::new();
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .and_then(|file| {
            let regular = file.metadata()?.is_file();
            if regular {
                file.take(NOLOGIN_SHOWN as u64).read_to_end(&mut contents)?;
            }
            Ok(())
        });
    if let Err(e) = read {
        tracing::warn!("{} exists but cannot be read: {e}", path.display());
    }
    Some(nologin_message(&contents))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_and_expiry() {
        let today = 20_000;
        assert_eq!(shadow_refusal("*", None, today), None);
        assert_eq!(shadow_refusal("$y$j9T$abc", None, today), None);
        assert_eq!(shadow_refusal("", None, today), None);
        for locked in ["!", "!!", "!$y$j9T$abc", "*LK*", "*LK*$6$x"] {
            assert_eq!(
                shadow_refusal(locked, None, today),
                Some(ShadowRefusal::Locked),
                "{locked}"
            );
        }
        // `usermod -e 1` and `chage -E 0`: long expired.
        for day in [0, 1] {
            assert_eq!(
                shadow_refusal("*", Some(day), today),
                Some(ShadowRefusal::Expired { day })
            );
        }
        // Expired on its expiry day, not before.
        assert_eq!(
            shadow_refusal("*", Some(today), today),
            Some(ShadowRefusal::Expired { day: today })
        );
        assert_eq!(shadow_refusal("*", Some(today + 1), today), None);
        // -1 (and any negative value) means never.
        assert_eq!(shadow_refusal("*", Some(-1), today), None);
        // A lock is reported before an expiry.
        assert_eq!(
            shadow_refusal("!", Some(1), today),
            Some(ShadowRefusal::Locked)
        );
    }

    #[test]
    fn shadow_dates() {
        assert_eq!(shadow_date(0), "1970-01-01");
        assert_eq!(shadow_date(1), "1970-01-02");
        assert_eq!(shadow_date(19_723), "2024-01-01");
        assert!(today() > 19_723);
    }

    #[test]
    fn shells_that_run_nothing() {
        for shell in [
            "/usr/sbin/nologin",
            "/sbin/nologin",
            "/bin/false",
            "/usr/bin/false",
        ] {
            assert_eq!(shell_use(Path::new(shell)), ShellUse::Nothing, "{shell}");
        }
        for shell in ["/bin/sh", "/bin/bash", "/usr/bin/zsh", "/usr/bin/tmux"] {
            assert_eq!(shell_use(Path::new(shell)), ShellUse::Commands, "{shell}");
        }
    }

    #[test]
    fn nologin_notice_is_bounded_escaped_and_never_empty() {
        assert!(nologin_applies(1000));
        assert!(!nologin_applies(0));
        assert_eq!(nologin_message(b""), NOLOGIN_DEFAULT);
        assert_eq!(nologin_message(b"\n \n"), NOLOGIN_DEFAULT);
        assert_eq!(
            nologin_message(b"Down for maintenance\r\nuntil 18:00\n"),
            "Down for maintenance\nuntil 18:00"
        );
        assert_eq!(
            nologin_message(b"bad \x1b[2J\x07 text"),
            "bad \\u{1b}[2J\\u{7} text"
        );
        let long = vec![b'x'; NOLOGIN_SHOWN * 3];
        assert_eq!(nologin_message(&long).len(), NOLOGIN_SHOWN);
        // A multi-byte character cut at the bound is replaced, not split.
        let mut cut = vec![b'y'; NOLOGIN_SHOWN - 1];
        cut.extend_from_slice("é".as_bytes());
        assert!(nologin_message(&cut).ends_with('\u{fffd}'));
    }

    #[test]
    fn reads_the_notice_of_a_file_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nologin");
        assert_eq!(read_nologin(&path), None);
        std::fs::write(&path, b"closed\n").unwrap();
        assert_eq!(read_nologin(&path).as_deref(), Some("closed"));
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read_nologin(&path).as_deref(), Some(NOLOGIN_DEFAULT));
        // A FIFO neither blocks nor is read; it still closes the host.
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(read_nologin(&path).as_deref(), Some(NOLOGIN_DEFAULT));
        // So does a directory.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(read_nologin(&path).as_deref(), Some(NOLOGIN_DEFAULT));
        // A symbolic link counts by what it names.
        std::fs::remove_dir(&path).unwrap();
        let target = dir.path().join("target");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert_eq!(read_nologin(&path), None);
        std::fs::write(&target, b"via a link\n").unwrap();
        assert_eq!(read_nologin(&path).as_deref(), Some("via a link"));
    }

    #[test]
    fn shadow_entries_of_missing_accounts_are_absent() {
        assert!(matches!(
            shadow_entry("no-such-user-skiff-xyz"),
            ShadowLookup::Absent
        ));
        assert!(matches!(shadow_entry("bad\0name"), ShadowLookup::Absent));
        if nix::unistd::geteuid().is_root() {
            // Every Debian system has root in /etc/shadow.
            assert!(matches!(shadow_entry("root"), ShadowLookup::Found(_)));
        }
    }
}
