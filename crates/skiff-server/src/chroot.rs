//! `ChrootDirectory`: jailing a login's sessions in a directory, as sshd
//! does. The path's tokens (`%h` home, `%u` user name, `%U` uid, `%%`) are
//! expanded for the account, and every component of the result must be a
//! directory owned by root and writable by no one else: otherwise the
//! account could swap a component and escape. A command then starts with
//! that directory as its root, in the account's home inside it (else `/`).
//!
//! `internal-sftp` needs no program inside the jail: skiffd's SFTP server
//! starts as root with the jail on its command line, enters it, drops to
//! the account, and only then reads a request ([`enter`]). Its executable
//! must then pass the checks of any program skiffd runs as root (those of
//! `AuthorizedKeysCommand`).

use std::io;
use std::path::{Path, PathBuf};

use crate::account::Account;

/// What the checks need to know of one path component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    pub is_dir: bool,
    pub uid: u32,
    pub mode: u32,
}

/// Expands `template`'s tokens for `account`. The result must be absolute.
pub fn expand(template: &str, account: &Account) -> Result<PathBuf, String> {
    let (home, uid) = (account.home.to_string_lossy(), account.uid.to_string());
    let tokens = [
        ('h', home.as_ref()),
        ('u', account.name.as_str()),
        ('U', uid.as_str()),
    ];
    let out = skiff_proto::ssh_config::expand_late_tokens(template, &tokens)?;
    let path = PathBuf::from(out);
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    Ok(path)
}

/// Checks every component of `jail`, from `/` down, with `stat`; the first
/// bad one is named in the error.
pub fn check_with(
    jail: &Path,
    mut stat: impl FnMut(&Path) -> io::Result<Component>,
) -> Result<(), String> {
    let mut prefix = PathBuf::new();
    for part in jail.components() {
        prefix.push(part);
        let c = stat(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
        if !c.is_dir {
            return Err(format!("{} is not a directory", prefix.display()));
        }
        if c.uid != 0 || c.mode & 0o022 != 0 {
            return Err(format!(
                "bad ownership or modes for {}: it must be owned by root and writable by no one else",
                prefix.display()
            ));
        }
    }
    Ok(())
}

/// [`check_with`] on this machine's files (following symbolic links, as
/// `chroot` does).
pub fn check(jail: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    check_with(jail, |p| {
        let m = std::fs::metadata(p)?;
        Ok(Component {
            is_dir: m.is_dir(),
            uid: m.uid(),
            mode: m.mode(),
        })
    })
}

/// The directory a jailed command starts in, as seen inside the jail: the
/// home directory if the jail has it, else `/`.
pub fn start_dir(jail: &Path, home: &Path) -> PathBuf {
    let inside = jail.join(home.strip_prefix("/").unwrap_or(home));
    if inside.is_dir() {
        home.to_path_buf()
    } else {
        PathBuf::from("/")
    }
}

/// Who a process becomes after entering a jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropTo {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl DropTo {
    /// `UID:GID:G1,G2,...` (no groups after the second colon: none).
    pub fn parse(s: &str) -> Result<DropTo, String> {
        let bad = || format!("expected UID:GID:GROUPS, got {s:?}");
        let mut parts = s.splitn(3, ':');
        let number = |p: Option<&str>| p.and_then(|v| v.parse::<u32>().ok()).ok_or_else(bad);
        let uid = number(parts.next())?;
        let gid = number(parts.next())?;
        let groups = match parts.next() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|g| g.parse::<u32>().map_err(|_| bad()))
                .collect::<Result<_, _>>()?,
        };
        Ok(DropTo { uid, gid, groups })
    }

    pub fn to_arg(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }
}

/// Enters `jail` (which must pass [`check`]), changes to `home` inside it
/// (else `/`), and becomes `who` for good. For a process that is still
/// single-threaded and has read nothing from the client yet.
pub fn enter(jail: &Path, home: &Path, who: &DropTo) -> io::Result<()> {
    check(jail).map_err(io::Error::other)?;
    let start = start_dir(jail, home);
    nix::unistd::chroot(jail)?;
    nix::unistd::chdir(&start)?;
    let gids: Vec<nix::unistd::Gid> = who
        .groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&gids)?;
    nix::unistd::setgid(nix::unistd::Gid::from_raw(who.gid))?;
    nix::unistd::setuid(nix::unistd::Uid::from_raw(who.uid))?;
    if who.uid != 0 && nix::unistd::setuid(nix::unistd::Uid::from_raw(0)).is_ok() {
        return Err(io::Error::other(
            "root could be regained after dropping privileges",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn account() -> Account {
        Account {
            name: "ann".into(),
            uid: 1001,
            gid: 1001,
            groups: vec![1001],
            home: "/home/ann".into(),
            shell: "/bin/sh".into(),
        }
    }

    #[test]
    fn tokens_expand_and_the_result_is_absolute() {
        let a = account();
        assert_eq!(expand("/jail/%u", &a), Ok("/jail/ann".into()));
        assert_eq!(expand("%h/../x%%%U", &a), Ok("/home/ann/../x%1001".into()));
        assert!(expand("jail", &a).unwrap_err().contains("absolute"));
        assert!(expand("/j/%x", &a).unwrap_err().contains("%x"));
        assert!(expand("/j/%", &a).unwrap_err().contains("trailing %"));
    }

    #[test]
    fn every_component_must_be_a_root_owned_directory_no_one_else_writes() {
        let dir = |uid, mode| Component {
            is_dir: true,
            uid,
            mode,
        };
        let tree: HashMap<&str, Component> = [
            ("/", dir(0, 0o755)),
            ("/srv", dir(0, 0o755)),
            ("/srv/jail", dir(0, 0o750)),
            ("/srv/jail/up", dir(1001, 0o755)),
            ("/srv/g", dir(0, 0o775)),
            ("/srv/g/jail", dir(0, 0o755)),
            ("/tmp", dir(0, 0o1777)),
            (
                "/srv/file",
                Component {
                    is_dir: false,
                    uid: 0,
                    mode: 0o644,
                },
            ),
        ]
        .into_iter()
        .collect();
        let stat = |p: &Path| {
            tree.get(p.to_str().unwrap())
                .copied()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        };
        assert_eq!(check_with(Path::new("/srv/jail"), stat), Ok(()));
        let e = check_with(Path::new("/srv/jail/up"), stat).unwrap_err();
        assert!(
            e.contains("/srv/jail/up") && e.contains("owned by root"),
            "{e}"
        );
        let e = check_with(Path::new("/srv/g/jail"), stat).unwrap_err();
        assert!(e.contains("/srv/g:") || e.contains("/srv/g "), "{e}");
        assert!(check_with(Path::new("/tmp"), stat).is_err());
        let e = check_with(Path::new("/srv/file"), stat).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let e = check_with(Path::new("/srv/none"), stat).unwrap_err();
        assert!(e.contains("/srv/none"), "{e}");
    }

    #[test]
    fn drop_to_round_trips() {
        let d = DropTo {
            uid: 5,
            gid: 6,
            groups: vec![6, 7],
        };
        assert_eq!(DropTo::parse(&d.to_arg()), Ok(d));
        assert_eq!(
            DropTo::parse("1:2:"),
            Ok(DropTo {
                uid: 1,
                gid: 2,
                groups: vec![]
            })
        );
        for bad in ["", "1", "1:x", "1:2:a", "-1:2:3"] {
            assert!(DropTo::parse(bad).is_err(), "{bad}");
        }
    }
}
