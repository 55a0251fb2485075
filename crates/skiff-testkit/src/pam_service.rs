//! A PAM service of a test's own: a file in /etc/pam.d with a unique name
//! (`skiff-test-TAG-PID-N`), which skiffd is pointed at with
//! `PAMServiceName`, removed when dropped. Needs root. Tests write the
//! stack they need from the modules every Debian system has (pam_unix,
//! pam_permit, pam_deny, pam_echo, pam_exec, pam_succeed_if), so they run
//! the real PAM library and real modules.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::files::write_file;

pub struct PamService {
    name: String,
    path: PathBuf,
}

impl PamService {
    /// A service whose file holds `stack` (PAM's configuration lines).
    pub fn new(tag: &str, stack: &str) -> PamService {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "skiff-test-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = PathBuf::from("/etc/pam.d").join(&name);
        assert!(!path.exists(), "{} exists already", path.display());
        write_file(&path, stack, 0o644);
        PamService { name, path }
    }

    /// The name for `PAMServiceName`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PamService {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
