//! Local accounts that skiffd may serve: passwd lookup, the account policy
//! of [`crate::account_policy`] (locked and expired accounts), the shell
//! check, and the group list needed to drop privileges in a child.
//!
//! As root skiffd serves any usable account; as an ordinary user it serves
//! only that user. Every refusal looks the same to the client as a wrong key.
//! An account whose shell is `nologin` or `false` is usable: its sessions
//! run nothing through that shell (see [`crate::account_policy::ShellUse`]).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User};

/// A usable local account, resolved once per authentication attempt.
#[derive(Debug, Clone)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, computed before fork (initgroups is not fork-safe).
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

impl Account {
    /// The credentials to take to act as the account: `None` when the
    /// server is not root and so already runs as it.
    pub(crate) fn credentials(&self) -> Option<crate::spawn::Credentials> {
        Uid::effective()
            .is_root()
            .then(|| crate::spawn::Credentials {
                uid: self.uid,
                gid: self.gid,
                groups: self.groups.clone(),
            })
    }
}

impl Account {
    /// The names of the account's groups, primary first: what `Match
    /// Group` is decided on.
    pub fn group_names(&self) -> Vec<String> {
        std::iter::once(self.gid)
            .chain(self.groups.iter().copied())
            .filter_map(|g| {
                nix::unistd::Group::from_gid(Gid::from_raw(g))
                    .ok()
                    .flatten()
            })
            .map(|g| g.name)
            .collect()
    }
}

/// Why an account cannot log in (logged by the server, never told to the client).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    NoSuchUser,
    NotServedUser,
    Locked,
    /// The shadow expiry date (`sp_expire`, a day from 1970-01-01) has come.
    Expired {
        day: i64,
    },
    /// The shadow database could not be read, so locks and expiry are
    /// unknown (a root server refuses rather than guess).
    ShadowUnreadable,
    NoShell,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NoSuchUser => "no such account",
            Refusal::NotServedUser => "skiffd is not running as root and serves only its own user",
            Refusal::Locked => "account is locked",
            Refusal::Expired { day } => {
                return write!(
                    f,
                    "account has expired (its expiry date is {})",
                    crate::account_policy::shadow_date(*day)
                )
            }
            Refusal::ShadowUnreadable => "the shadow database cannot be read",
            Refusal::NoShell => "account has no usable login shell",
        })
    }
}

/// Looks up `name` and checks that it may log in.
pub fn lookup(name: &str) -> Result<Account, Refusal> {
    let user = User::from_name(name)
        .ok()
        .flatten()
        .ok_or(Refusal::NoSuchUser)?;
    let me = Uid::effective();
    if !me.is_root() && user.uid != me {
        return Err(Refusal::NotServedUser);
    }
    shadow_check(&user)?;
    let shell = if user.shell.as_os_str().is_empty() {
        PathBuf::from("/bin/sh")
    } else {
        user.shell.clone()
    };
    if !shell_usable(&shell) {
        return Err(Refusal::NoShell);
    }
    let groups = if me.is_root() {
        let cname = CString::new(name).map_err(|_| Refusal::NoSuchUser)?;
        nix::unistd::getgrouplist(&cname, user.gid)
            .map(|g| g.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|_| vec![user.gid.as_raw()])
    } else {
        Vec::new()
    };
    Ok(Account {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        groups,
        home: user.dir,
        shell,
    })
}

/// Whether the shadow entry (or, without one, the passwd field) shuts the
/// account: locked (`!` or `*LK*`; `*` alone means "no password" and stays
/// usable for keys) or expired.
fn shadow_check(user: &User) -> Result<(), Refusal> {
    use crate::account_policy::{self as policy, ShadowLookup, ShadowRefusal};
    let (password, expire_day) = match policy::shadow_entry(&user.name) {
        ShadowLookup::Found(entry) => (entry.password, entry.expire_day),
        ShadowLookup::Absent => (user.passwd.to_string_lossy().into_owned(), None),
        ShadowLookup::Unreadable(e) => {
            tracing::error!("cannot read the shadow entry of {}: {e}", user.name);
            return Err(Refusal::ShadowUnreadable);
        }
    };
    match policy::shadow_refusal(&password, expire_day, policy::today()) {
        None => Ok(()),
        Some(ShadowRefusal::Locked) => Err(Refusal::Locked),
        Some(ShadowRefusal::Expired { day }) => Err(Refusal::Expired { day }),
    }
}

/// Whether `shell` exists and may be run, as sshd requires of every
/// account's shell. `nologin` and `false` pass: they authenticate, and
/// run nothing (see [`crate::account_policy::shell_use`]).
fn shell_usable(shell: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(shell)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_user_is_served_and_strangers_are_not() {
        let me = User::from_uid(Uid::effective()).unwrap().unwrap();
        match lookup(&me.name) {
            Ok(acct) => assert_eq!(acct.uid, me.uid.as_raw()),
            // A CI container may run as an account without a usable shell.
            Err(r) => assert!(matches!(r, Refusal::NoShell | Refusal::Locked), "{r}"),
        }
        assert_eq!(
            lookup("no-such-user-skiff-xyz").unwrap_err(),
            Refusal::NoSuchUser
        );
    }

    #[test]
    fn missing_shells_are_refused_and_nologin_ones_are_not() {
        assert!(shell_usable(Path::new("/usr/sbin/nologin")));
        assert!(shell_usable(Path::new("/bin/false")));
        assert!(!shell_usable(Path::new("/nonexistent/shell")));
        assert!(!shell_usable(Path::new("/etc/passwd")));
        assert!(!shell_usable(Path::new("/bin")));
        assert!(shell_usable(Path::new("/bin/sh")));
    }
}
