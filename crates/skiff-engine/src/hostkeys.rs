//! Host-key verification against OpenSSH known_hosts files: lookup through the
//! sans-IO index in skiff-proto, the StrictHostKeyChecking policy, the
//! interactive question for `ask`, and safe appends of newly accepted keys.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use russh::keys::PublicKey;
use skiff_proto::known_hosts::{
    self, Decision, HostKeyStatus, KnownHostsFile, StrictHostKeyChecking,
};

use crate::error::{ErrorKind, SkiffError};
use crate::settings::ConnectSettings;

/// Loaded known_hosts files for one connection attempt.
pub struct KnownHosts {
    files: Vec<KnownHostsFile>,
    /// Where new keys are recorded: the first user file.
    record_to: Option<PathBuf>,
    /// Warnings for the person who ran the command ("Permanently added ...").
    /// Collected rather than printed: the agent and the fan-out runner
    /// deliver them to the right terminal or host record.
    notices: std::sync::Mutex<Vec<String>>,
}

impl KnownHosts {
    /// Reads every configured file; missing files count as empty, malformed
    /// lines are skipped with a warning naming file:line.
    pub fn load(settings: &ConnectSettings) -> Self {
        let mut files = Vec::new();
        for path in settings
            .user_known_hosts
            .iter()
            .chain(&settings.global_known_hosts)
        {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let (file, warnings) = known_hosts::parse(&path.display().to_string(), &text);
                    for w in warnings {
                        tracing::warn!("{w}");
                    }
                    files.push(file);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot read {}: {e}", path.display()),
            }
        }
        KnownHosts {
            files,
            record_to: settings.user_known_hosts.first().cloned(),
            notices: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The warnings gathered so far, emptying the list.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().expect("not poisoned"))
    }

    fn notice(&self, text: String) {
        self.notices.lock().expect("not poisoned").push(text);
    }

    /// Key types already recorded for this host, most trusted first, so the
    /// key exchange can prefer a host key we can verify (as ssh does).
    pub fn known_key_types(&self, host: &str, port: u16) -> Vec<String> {
        let mut types: Vec<String> = Vec::new();
        for found in known_hosts::lookup(&self.files, host, port) {
            if found.entry.marker.is_none() && !types.contains(&found.entry.key_type) {
                types.push(found.entry.key_type.clone());
            }
        }
        types
    }

    /// Applies the policy to the key the server presented.
    pub fn verify(&self, settings: &ConnectSettings, key: &PublicKey) -> Result<(), SkiffError> {
        let blob = key.to_bytes().map_err(|e| {
            SkiffError::new(
                ErrorKind::Protocol,
                format!("server sent an unusable host key: {e}"),
            )
        })?;
        let key_type = key.algorithm().as_str().to_string();
        let (host, port) = (settings.hostname.as_str(), settings.port);
        let status = known_hosts::check(&self.files, host, port, &key_type, &blob);
        let refuse = |msg: String| SkiffError::new(ErrorKind::HostKey, msg);
        match known_hosts::decide(
            &status,
            settings.strict_host_key_checking,
            host,
            port,
            &key_type,
            &blob,
        ) {
            Decision::Accept => Ok(()),
            Decision::AcceptWithWarning(w) => {
                self.notice(w);
                Ok(())
            }
            Decision::Refuse(detail) => {
                tracing::debug!("{detail}");
                Err(refuse(one_line_refusal(
                    &status, settings, &key_type, &blob,
                )))
            }
            Decision::AcceptAndRecord => self.record(settings, &key_type, &blob),
            Decision::AskUser => {
                if settings.batch_mode {
                    return Err(refuse(format!(
                        "host key for {} is not known and BatchMode is on ({}); add it to known_hosts or use -o StrictHostKeyChecking=accept-new",
                        known_hosts::host_port_name(host, port),
                        known_hosts::fingerprint_sha256(&blob)
                    ))
                    .needing_person());
                }
                let prompt = known_hosts::ask_prompt(&status, host, port, &key_type, &blob);
                if ask_on_terminal(&prompt, &blob)? {
                    self.record(settings, &key_type, &blob)
                } else {
                    Err(refuse(format!(
                        "host key verification failed: you declined the key of {host}"
                    )))
                }
            }
        }
    }

    fn record(
        &self,
        settings: &ConnectSettings,
        key_type: &str,
        blob: &[u8],
    ) -> Result<(), SkiffError> {
        let Some(path) = &self.record_to else {
            return Ok(());
        };
        let salt = settings.hash_known_hosts.then(|| {
            let mut s = [0u8; 20];
            rand::fill(&mut s);
            s
        });
        let line = known_hosts::format_entry(
            &settings.hostname,
            settings.port,
            key_type,
            blob,
            salt.as_ref(),
        );
        match append_line(path, &line) {
            Ok(()) => self.notice(format!(
                "Warning: Permanently added '{}' ({}) to the list of known hosts.",
                known_hosts::host_port_name(&settings.hostname, settings.port),
                known_hosts::key_type_label(key_type)
            )),
            // Not being able to record is not a reason to refuse a key the policy accepts.
            Err(e) => self.notice(format!(
                "skiff: warning: could not add the host key to {}: {e}",
                path.display()
            )),
        }
        Ok(())
    }
}

/// Appends one line with a single write, creating the file 0600 (and its
/// directory 0700) when missing and adding a newline first if the file
/// does not end with one. Existing content is never rewritten.
pub fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    let len = file.metadata()?.len();
    let mut text = String::with_capacity(line.len() + 1);
    if len > 0 {
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            text.push('\n');
        }
    }
    text.push_str(line);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

/// Asks the yes/no/fingerprint question on the controlling terminal.
fn ask_on_terminal(prompt: &str, blob: &[u8]) -> Result<bool, SkiffError> {
    let no_tty = |e: std::io::Error| {
        SkiffError::new(
            ErrorKind::HostKey,
            format!("host key is not known and there is no terminal to ask on ({e}); use -o StrictHostKeyChecking=accept-new or add it to known_hosts"),
        )
    };
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(no_tty)?;
    let mut reader = std::io::BufReader::new(tty.try_clone().map_err(no_tty)?);
    write!(tty, "{prompt}").map_err(no_tty)?;
    for _ in 0..3 {
        let mut answer = String::new();
        std::io::BufRead::read_line(&mut reader, &mut answer).map_err(no_tty)?;
        if let Some(yes) = known_hosts::ask_answer(&answer, blob) {
            return Ok(yes);
        }
        write!(tty, "Please type 'yes', 'no' or the fingerprint: ").map_err(no_tty)?;
    }
    Ok(false)
}

/// One line that says what was refused, with fingerprints and file:line, and what to do.
fn one_line_refusal(
    status: &HostKeyStatus<'_>,
    settings: &ConnectSettings,
    key_type: &str,
    blob: &[u8],
) -> String {
    let name = known_hosts::host_port_name(&settings.hostname, settings.port);
    let label = known_hosts::key_type_label(key_type);
    let fp = known_hosts::fingerprint_sha256(blob);
    match status {
        HostKeyStatus::Revoked(found) => format!(
            "{name}: host key verification failed: the {label} key {fp} is marked @revoked at {found}; refusing to connect"
        ),
        HostKeyStatus::Changed { old } => {
            let olds: Vec<String> = old.iter().map(|f| format!("{} at {f}", f.entry.fingerprint())).collect();
            let files: Vec<&str> = old.iter().map(|f| f.file).collect();
            format!(
                "{name}: host key verification failed: REMOTE HOST KEY HAS CHANGED (someone may be intercepting the connection): \
                 the server offered {label} {fp}, known_hosts has {}; if the change is expected, remove the old entry with \
                 ssh-keygen -f '{}' -R '{name}'",
                olds.join(", "),
                files.first().copied().unwrap_or("~/.ssh/known_hosts")
            )
        }
        _ => format!(
            "{name}: host key verification failed: no {label} host key is known for this host and StrictHostKeyChecking is yes \
             (the server offered {fp}); after checking the fingerprint, connect once with -o StrictHostKeyChecking=accept-new"
        ),
    }
}

/// Converts the config policy for display in -v output.
pub fn policy_name(p: StrictHostKeyChecking) -> &'static str {
    match p {
        StrictHostKeyChecking::Yes => "yes",
        StrictHostKeyChecking::AcceptNew => "accept-new",
        StrictHostKeyChecking::No => "no",
        StrictHostKeyChecking::Ask => "ask",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn append_creates_private_file_and_repairs_missing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_hosts");
        append_line(&path, "a ssh-ed25519 AAAA\n").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"b ssh-ed25519 BBBB")
            .unwrap();
        append_line(&path, "c ssh-ed25519 CCCC\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a ssh-ed25519 AAAA\nb ssh-ed25519 BBBB\nc ssh-ed25519 CCCC\n"
        );
    }
}
