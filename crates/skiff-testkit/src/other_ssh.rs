//! SSH implementations other than OpenSSH that skiff and skiffd must work
//! with: dropbear's server (`dropbear`) and client (`dbclient`), and
//! PuTTY's command-line tools (`plink`, `pscp`, `psftp`). Each reads keys
//! in a format of its own, converted here from the OpenSSH keys of the
//! [`crate::Fixture`] with the tools' own converters (`dropbearconvert`,
//! `puttygen`). Missing tools fail a test under CI and skip it elsewhere
//! ([`crate::require_tool`]).

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::accounts::Account;
use super::daemon::{DaemonCore, Launch};
use super::environment::require_tool;
use super::files::write_file;
use super::keys::Key;

/// Converts the OpenSSH private key `key` to dropbear's format at `to`.
pub fn dropbear_key(key: &Key, to: &Path) {
    convert(
        Command::new("dropbearconvert")
            .args(["openssh", "dropbear"])
            .arg(&key.private)
            .arg(to),
        key,
    );
}

/// Converts the OpenSSH private key `key` to PuTTY's `.ppk` at `to`.
pub fn putty_key(key: &Key, to: &Path) {
    convert(
        Command::new("puttygen")
            .arg(&key.private)
            .args(["-O", "private", "-o"])
            .arg(to),
        key,
    );
}

/// Runs a key converter on `key`, which must succeed.
fn convert(command: &mut Command, key: &Key) {
    let out = command.output().expect("run a key converter");
    assert!(
        out.status.success(),
        "{command:?} on {}: {}",
        key.private.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether dropbear's server, client and key converter are here (see the
/// top for what a missing one does).
pub fn require_dropbear() -> bool {
    ["dropbear", "dbclient", "dropbearconvert"]
        .iter()
        .all(|tool| require_tool(tool, "dropbear-bin"))
}

/// Whether PuTTY's command-line tools are here.
pub fn require_putty() -> bool {
    ["plink", "pscp", "psftp", "puttygen"]
        .iter()
        .all(|tool| require_tool(tool, "putty-tools"))
}

/// Writes `lines` as `account`'s `~/.ssh/authorized_keys`, owned by the
/// account, with the modes dropbear (which has no `AuthorizedKeysFile`)
/// insists on.
pub fn authorize_in_home(account: &Account, lines: &[String]) {
    let dot_ssh = account.home.join(".ssh");
    fs::create_dir_all(&dot_ssh).expect("create ~/.ssh");
    fs::set_permissions(&dot_ssh, fs::Permissions::from_mode(0o700)).expect("chmod ~/.ssh");
    let file = dot_ssh.join("authorized_keys");
    write_file(&file, lines.join("\n") + "\n", 0o600);
    for path in [&dot_ssh, &file] {
        chown(path, Some(account.uid), Some(account.gid)).expect("chown ~/.ssh");
    }
}

/// A private dropbear server on 127.0.0.1 (password logins off), killed
/// when dropped. It reads each account's `~/.ssh/authorized_keys`.
pub struct Dropbear {
    core: DaemonCore,
    /// The host key, in dropbear's format.
    host_key: PathBuf,
}

impl Dropbear {
    /// Starts dropbear on a free port with `host_key` (an OpenSSH key) as
    /// its only host key.
    pub fn start(host_key: &Key) -> Dropbear {
        let core = DaemonCore::new("dropbear");
        let mut d = Dropbear {
            host_key: core.dir.path().join("host_key.dropbear"),
            core,
        };
        d.set_only_host_key(host_key);
        d.start_on_free_port();
        d
    }
}

impl Launch for Dropbear {
    fn core(&self) -> &DaemonCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DaemonCore {
        &mut self.core
    }

    fn set_only_host_key(&mut self, key: &Key) {
        let _ = fs::remove_file(&self.host_key);
        dropbear_key(key, &self.host_key);
    }

    fn launch(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("dropbear");
        // In the foreground, logging to stderr, no password logins.
        cmd.args(["-F", "-E", "-s", "-p"])
            .arg(format!("127.0.0.1:{}", self.core.port))
            .arg("-r")
            .arg(&self.host_key);
        self.core.spawn(cmd, None)
    }
}
