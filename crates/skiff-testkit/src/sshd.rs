//! A private OpenSSH `sshd` on 127.0.0.1 (`Sshd`), and `sshd_setup`: a
//! [`Fixture`] and an sshd serving its keys.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::daemon::{Daemon, DaemonCore, Launch};
use super::environment::{is_root, require_openssh, SSHD};
use super::files::write_file;
use super::keys::{Fixture, Key};

/// A private OpenSSH `sshd` on 127.0.0.1, killed on drop.
pub struct Sshd {
    core: DaemonCore,
    host_key: PathBuf,
    authorized_keys: PathBuf,
    extra: Vec<String>,
}

impl Sshd {
    /// Starts sshd with one host key, an AuthorizedKeysFile and extra
    /// sshd_config lines (e.g. `"AcceptEnv LC_*"`). The harness's `UsePAM
    /// no`, `PasswordAuthentication no` and `KbdInteractiveAuthentication
    /// no` give way to an `extra` line setting the same keyword.
    pub fn start(host_key: &Key, authorized_keys: &Path, extra: &[&str]) -> Sshd {
        let mut sshd = Sshd {
            core: DaemonCore::new("sshd"),
            host_key: host_key.private.clone(),
            authorized_keys: authorized_keys.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        privsep_dir();
        sshd.start_on_free_port();
        sshd
    }

    pub fn config_path(&self) -> PathBuf {
        self.core.dir.path().join("sshd_config")
    }
}

impl Launch for Sshd {
    fn core(&self) -> &DaemonCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut DaemonCore {
        &mut self.core
    }

    fn set_only_host_key(&mut self, key: &Key) {
        self.host_key = key.private.clone();
    }

    fn launch(&mut self) -> Result<(), String> {
        let port = self.core.port;
        let mut cfg = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nStrictModes no\n\
             AuthorizedKeysFile {}\nPidFile none\nLogLevel VERBOSE\n",
            self.host_key.display(),
            self.authorized_keys.display()
        );
        // Defaults a test may replace with a line of its own in `extra`
        // (sshd takes a keyword's first value, so the test's must come first).
        for default in [
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
        ] {
            if !replaced_by(default, &self.extra) {
                cfg.push_str(default);
                cfg.push('\n');
            }
        }
        for l in &self.extra {
            cfg.push_str(l);
            cfg.push('\n');
        }
        let cfg_path = self.config_path();
        write_file(&cfg_path, cfg, 0o644);
        let mut cmd = Command::new(SSHD);
        cmd.arg("-D").arg("-e").arg("-f").arg(&cfg_path);
        let marker = format!("Server listening on 127.0.0.1 port {port}.");
        self.core.spawn(cmd, Some(&marker))
    }
}

/// Whether the global part of `extra` (before any `Match`) sets the
/// keyword of the sshd_config line `default`.
fn replaced_by(default: &str, extra: &[String]) -> bool {
    let keyword = |line: &str| {
        line.split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let wanted = keyword(default);
    extra
        .iter()
        .flat_map(|l| l.lines())
        .take_while(|l| keyword(l) != "match")
        .any(|l| keyword(l) == wanted)
}

/// Makes sshd's privilege separation directory, which a root sshd wants
/// even for `sshd -t` and `-T`, when the tests run as root.
pub fn privsep_dir() {
    if is_root() {
        fs::create_dir_all("/run/sshd").expect("mkdir -p /run/sshd");
        fs::set_permissions("/run/sshd", fs::Permissions::from_mode(0o755))
            .expect("chmod /run/sshd");
    }
}

/// A [`Fixture`] and a private sshd serving its keys (plus `extra`
/// sshd_config lines), or `None` as for [`skiffd_setup`].
pub fn sshd_setup(extra: &[&str]) -> Option<(Fixture, Sshd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, extra);
    Some((fx, sshd))
}

/// A private sshd whose `sftp` subsystem is a `/bin/sh` script of the
/// test's own around OpenSSH's `sftp-server`, and a client home that
/// trusts it.
pub struct SftpScripted {
    pub fx: Fixture,
    pub sshd: Sshd,
    pub home: super::skiff_client::ClientHome,
    /// Holds the script and whatever files `script` made beside it.
    pub dir: tempfile::TempDir,
}

/// Starts an [`SftpScripted`]: `script(dir, real)` gives the script's
/// lines after `#!/bin/sh` (`dir`: where the script lives, for files the
/// test reads back; `real`: the path of OpenSSH's `sftp-server`), `extra`
/// more sshd_config lines. `None` (a failure under CI) without sshd or
/// `sftp-server`.
pub fn sshd_with_sftp_script(
    script: impl FnOnce(&Path, &str) -> String,
    extra: &[&str],
) -> Option<SftpScripted> {
    if !require_openssh() {
        return None;
    }
    let real = super::environment::openssh_sftp_server()?;
    let dir = super::files::tempdir();
    let body = script(dir.path(), real);
    let wrapper = dir.path().join("wrapped-sftp-server");
    write_file(&wrapper, format!("#!/bin/sh\n{body}"), 0o755);
    let subsystem = format!("Subsystem sftp {}", wrapper.display());
    let mut lines: Vec<&str> = vec![&subsystem];
    lines.extend_from_slice(extra);
    let (fx, sshd) = sshd_setup(&lines)?;
    let home = super::skiff_client::ClientHome::new();
    home.trust(sshd.port(), &fx.host_key);
    Some(SftpScripted {
        fx,
        sshd,
        home,
        dir,
    })
}
