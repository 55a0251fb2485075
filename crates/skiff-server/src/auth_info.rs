//! `ExposeAuthInfo`: a private file that tells a session how its login
//! authenticated (`publickey KEYTYPE BASE64`, as sshd writes it), named by
//! `SSH_USER_AUTH`. Shared accounts use it to tell which key logged in.
//! The file is made in /tmp with a random name (never following a link),
//! belongs to the account, mode 0600, and is removed with the connection.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file, removed when dropped.
#[derive(Debug)]
pub struct AuthInfoFile {
    path: PathBuf,
}

impl AuthInfoFile {
    /// Writes `text` to a new file owned by `uid`/`gid` (when the server
    /// is root; otherwise it is the server's own account already).
    pub fn create(text: &str, uid: u32, gid: u32) -> io::Result<AuthInfoFile> {
        let (fd, path) = nix::unistd::mkstemp("/tmp/skiff-auth.XXXXXXXXXX")?;
        let mut file = std::fs::File::from(fd);
        let made = AuthInfoFile { path };
        if nix::unistd::geteuid().is_root() {
            nix::unistd::fchown(
                &file,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )?;
        }
        file.write_all(text.as_bytes())?;
        Ok(made)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for AuthInfoFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn private_file_removed_on_drop() {
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let info = AuthInfoFile::create("publickey ssh-ed25519 AAAA\n", me.0, me.1).unwrap();
        let path = info.path().to_path_buf();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), me.0);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "publickey ssh-ed25519 AAAA\n"
        );
        drop(info);
        assert!(!path.exists());
    }
}
