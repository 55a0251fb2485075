//! Which modes received files and directories get, by who sent them. One
//! place decides, for the data plane and SFTP alike.
//!
//! A download takes nothing from the server that the client did not ask
//! for: never a set-user-ID, set-group-ID or sticky bit, and never a change
//! to a directory that was there before the copy (`-p` applies to what the
//! copy created). An upload is the account writing its own files with its
//! own rights, as scp does: `-p` keeps every permission bit, existing
//! directories included.
//!
//! Either way a file that replaces one of the same name keeps the old
//! file's permission bits unless `-p` is given, as `scp` and `cp` do when
//! they write into an existing file; without `-p` a new file gets the
//! sender's permission bits less the umask.

use crate::atomic::apply_umask;

/// Who sent what is being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceivePolicy {
    /// `skiff cp host:...`: a server we do not trust with our files.
    Download,
    /// skiffd's end of an upload: the account's own client.
    Upload,
}

impl ReceivePolicy {
    /// The permission bits the sender may set with `-p`.
    fn allowed(self) -> u32 {
        match self {
            ReceivePolicy::Download => 0o777,
            ReceivePolicy::Upload => 0o7777,
        }
    }

    /// The mode a received file is committed with: `sent` is the sender's
    /// mode, `replaced` the mode of the file it replaces, if any.
    pub fn file_mode(self, sent: u32, preserve: bool, replaced: Option<u32>) -> u32 {
        if preserve {
            sent & self.allowed()
        } else if let Some(old) = replaced {
            old & 0o777
        } else {
            apply_umask(sent & 0o777)
        }
    }

    /// The mode a directory the copy creates is made with; with `-p` it is
    /// set exactly by [`crate::finish_dir`] once its contents are in.
    pub fn dir_mode(self, sent: u32, preserve: bool) -> u32 {
        if preserve {
            sent & self.allowed()
        } else {
            apply_umask(sent & 0o777)
        }
    }

    /// Whether `-p` also sets the mode and times of a directory that was
    /// there before the copy.
    pub fn finishes_existing_dirs(self) -> bool {
        self == ReceivePolicy::Upload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_never_bring_special_bits() {
        let d = ReceivePolicy::Download;
        assert_eq!(d.file_mode(0o6755, true, None), 0o755);
        assert_eq!(d.file_mode(0o6755, false, None), apply_umask(0o755));
        assert_eq!(d.dir_mode(0o1777, true), 0o777);
        assert_eq!(d.file_mode(0o4777, false, Some(0o4750)), 0o750);
        assert!(!d.finishes_existing_dirs());
    }

    #[test]
    fn uploads_keep_scp_rules() {
        let u = ReceivePolicy::Upload;
        assert_eq!(u.file_mode(0o2755, true, None), 0o2755);
        assert_eq!(u.dir_mode(0o1777, true), 0o1777);
        assert_eq!(u.file_mode(0o2755, false, None), apply_umask(0o755));
        assert!(u.finishes_existing_dirs());
    }

    #[test]
    fn a_replaced_file_keeps_its_mode_without_p() {
        for p in [ReceivePolicy::Download, ReceivePolicy::Upload] {
            assert_eq!(p.file_mode(0o777, false, Some(0o600)), 0o600);
            assert_eq!(p.file_mode(0o700, true, Some(0o644)), 0o700);
        }
    }
}
