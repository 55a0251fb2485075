//! Who owns a session's terminal. A root server opens the pseudo-terminal,
//! so the kernel makes its slave device (`/dev/pts/N`) root's, with the
//! group and mode of the devpts mount (often root 0600). Programs that
//! work with their own terminal need it to be the account's: `mesg` and
//! `write` (group `tty` may write to it), screen and tmux, GnuPG's
//! pinentry (which opens the terminal by name). As sshd does, the device
//! is handed to the account, group `tty` and mode 0620 (group write, for
//! `write` and `wall`), or the account's own group and 0600 where there is
//! no `tty` group. When the session ends it gets back the owner, group and
//! mode it had (sshd, which also serves systems with static ptys, gives
//! them to root with mode 0666; devpts makes each device anew, so "as
//! found" is the kernel's own choice), before the terminal is closed, so
//! that the device number, which the next terminal may reuse, is still
//! this session's.
//!
//! [`grant`] is the rule; [`Lease`] applies it to a device and gives it
//! back.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Who a terminal belongs to, and its permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// The ownership of the terminal of a session of the account `uid`
/// (primary group `gid`), given the system's `tty` group.
pub fn grant(uid: u32, gid: u32, tty_group: Option<u32>) -> Ownership {
    match tty_group {
        Some(tty) => Ownership {
            uid,
            gid: tty,
            mode: 0o620,
        },
        None => Ownership {
            uid,
            gid,
            mode: 0o600,
        },
    }
}

/// The id of the `tty` group, if the system has one.
pub fn tty_group() -> Option<u32> {
    nix::unistd::Group::from_name("tty")
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw())
}

/// A terminal handed to an account, given back on [`Lease::give_back`] (or
/// when dropped).
#[derive(Debug)]
pub struct Lease {
    /// The slave device's path.
    path: PathBuf,
    /// Its device number, to know it is still this terminal.
    rdev: u64,
    found: Ownership,
    given_back: AtomicBool,
}

/// Gives the terminal whose slave side is `slave` to `to`.
pub fn hand_over(slave: impl AsFd, to: Ownership) -> io::Result<Lease> {
    let slave = slave.as_fd();
    let path = nix::unistd::ttyname(slave).map_err(io::Error::from)?;
    let st = nix::sys::stat::fstat(slave).map_err(io::Error::from)?;
    let found = Ownership {
        uid: st.st_uid,
        gid: st.st_gid,
        mode: st.st_mode & 0o7777,
    };
    let lease = Lease {
        path,
        rdev: st.st_rdev,
        found,
        given_back: AtomicBool::new(false),
    };
    let given = nix::unistd::fchown(
        slave,
        Some(nix::unistd::Uid::from_raw(to.uid)),
        Some(nix::unistd::Gid::from_raw(to.gid)),
    )
    .and_then(|()| {
        nix::sys::stat::fchmod(slave, nix::sys::stat::Mode::from_bits_truncate(to.mode))
    });
    match given {
        Ok(()) => Ok(lease),
        // Dropping the lease puts back whatever was changed.
        Err(e) => Err(io::Error::from(e)),
    }
}

impl Lease {
    /// Restores the terminal's owner, group and mode as they were found.
    /// Must run while the terminal's master side is still open (the device
    /// then still names it); only the first call acts.
    pub fn give_back(&self) {
        if self.given_back.swap(true, Ordering::SeqCst) {
            return;
        }
        // Only the kernel makes entries in /dev/pts, and this one exists
        // while the master is open: the path cannot name anything else.
        // The device number is checked all the same.
        let result = std::fs::symlink_metadata(&self.path).and_then(|meta| {
            if !meta.file_type().is_char_device() || meta.rdev() != self.rdev {
                return Err(io::Error::other("it is no longer this session's terminal"));
            }
            std::os::unix::fs::lchown(&self.path, Some(self.found.uid), Some(self.found.gid))?;
            std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(self.found.mode))
        });
        if let Err(e) = result {
            tracing::warn!("cannot give the terminal {} back: {e}", self.path.display());
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tty_group_may_write_else_the_account_alone() {
        assert_eq!(
            grant(1000, 1000, Some(5)),
            Ownership {
                uid: 1000,
                gid: 5,
                mode: 0o620
            }
        );
        assert_eq!(
            grant(1000, 1001, None),
            Ownership {
                uid: 1000,
                gid: 1001,
                mode: 0o600
            }
        );
        assert_eq!(grant(0, 0, Some(5)).mode, 0o620);
    }

    #[test]
    fn hands_a_terminal_over_and_gets_it_back_as_found() {
        if !nix::unistd::geteuid().is_root() {
            return; // only root may give a file away
        }
        let pair = nix::pty::openpty(None, None).unwrap();
        let path = nix::unistd::ttyname(&pair.slave).unwrap();
        let before = std::fs::metadata(&path).unwrap();
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        let to = grant(nobody.uid.as_raw(), nobody.gid.as_raw(), tty_group());
        let lease = hand_over(&pair.slave, to).unwrap();
        let during = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (during.uid(), during.gid(), during.mode() & 0o7777),
            (to.uid, to.gid, to.mode)
        );
        lease.give_back();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (after.uid(), after.gid(), after.mode() & 0o7777),
            (before.uid(), before.gid(), before.mode() & 0o7777)
        );
        // Once only: a second give-back (or the drop) changes nothing.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        drop(lease);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    }
}
