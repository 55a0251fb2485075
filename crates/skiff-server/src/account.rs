//! Local accounts that skiffd may serve: passwd lookup, locked-account and
//! shell checks, and the group list needed to drop privileges in a child.
//!
//! As root skiffd serves any usable account; as an ordinary user it serves
//! only that user. Every refusal looks the same to the client as a wrong key.

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

/// Why an account cannot log in (logged by the server, never told to the client).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    NoSuchUser,
    NotServedUser,
    Locked,
    NoShell,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NoSuchUser => "no such account",
            Refusal::NotServedUser => "skiffd is not running as root and serves only its own user",
            Refusal::Locked => "account is locked",
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
    if is_locked(&user) {
        return Err(Refusal::Locked);
    }
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

/// A password field starting with `!` marks a locked account (as `passwd -l`
/// and useradd do); `*` alone means "no password" and stays usable for keys.
fn is_locked(user: &User) -> bool {
    let field =
        shadow_password(&user.name).unwrap_or_else(|| user.passwd.to_string_lossy().into_owned());
    field.starts_with('!') || field.starts_with("*LK*")
}

fn shadow_password(name: &str) -> Option<String> {
    let text = std::fs::read_to_string("/etc/shadow").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then(|| fields.next().unwrap_or("").to_string())
    })
}

fn shell_usable(shell: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let base = shell.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if base == "nologin" || base == "false" {
        return false;
    }
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
    fn nologin_shells_are_refused() {
        assert!(!shell_usable(Path::new("/usr/sbin/nologin")));
        assert!(!shell_usable(Path::new("/bin/false")));
        assert!(!shell_usable(Path::new("/nonexistent/shell")));
        assert!(shell_usable(Path::new("/bin/sh")));
    }
}
