//! `AuthorizedKeysCommand`: a program that prints authorized_keys lines for
//! an account (from LDAP, a cloud metadata service, ...), consulted when the
//! account's authorized_keys file does not admit the offered key.
//!
//! As in sshd, the program must be given by absolute path and may only be
//! run from a file and directories that nobody but root (or the user skiffd
//! runs as) can change. skiffd checks that before every run and refuses to
//! use it otherwise. One difference: a world-writable directory with the
//! sticky bit (`/tmp`) is accepted, since nobody else can replace an entry
//! in it. As root, skiffd runs the program as `AuthorizedKeysCommandUser`,
//! never as root. It runs with an empty environment but for `PATH`, with
//! `/` as working directory and no input, and gets at most 10 seconds and
//! 1 MiB of output. Output from a run that fails is not used.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use skiff_proto::authorized_keys::{self, AuthorizedKey};
use tokio::io::AsyncReadExt;

use crate::account::Account;

/// Longest a run may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Most output read from a run.
const MAX_OUTPUT: u64 = 1 << 20;

/// The configured command: the program and its argument templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysCommand {
    pub argv: Vec<String>,
    /// Who runs it: `AuthorizedKeysCommandUser`'s uid and gid; `None` runs
    /// it as skiffd's own user (only when skiffd is not root).
    pub run_as: Option<(u32, u32)>,
}

/// What the tokens stand for in one run.
pub struct Tokens<'a> {
    pub user: &'a str,
    pub home: &'a str,
    pub uid: u32,
    /// Key type, e.g. `ssh-ed25519`.
    pub key_type: &'a str,
    /// The key, base64 as in authorized_keys.
    pub key_base64: &'a str,
    /// `SHA256:...`.
    pub fingerprint: &'a str,
}

/// Splits the configured value into the program and its arguments. The
/// program must be an absolute path; every `%` must start a known token
/// (`%% %u %h %U %t %k %f`). Without arguments, the user name is passed (as
/// sshd does).
pub fn parse_command_line(value: &str) -> Result<Vec<String>, String> {
    let mut argv: Vec<String> = value.split_whitespace().map(str::to_owned).collect();
    let Some(program) = argv.first() else {
        return Err("AuthorizedKeysCommand needs a program".into());
    };
    if !program.starts_with('/') {
        return Err(format!(
            "AuthorizedKeysCommand {program:?} must be an absolute path"
        ));
    }
    if argv.len() == 1 {
        argv.push("%u".into());
    }
    for arg in &argv {
        check_tokens(arg)?;
    }
    Ok(argv)
}

fn check_tokens(arg: &str) -> Result<(), String> {
    let mut chars = arg.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('%' | 'u' | 'h' | 'U' | 't' | 'k' | 'f') => {}
                Some(other) => {
                    return Err(format!(
                        "AuthorizedKeysCommand: unknown token %{other} in {arg:?}"
                    ))
                }
                None => {
                    return Err(format!(
                        "AuthorizedKeysCommand: lone % at the end of {arg:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

/// `arg` with its tokens replaced (see [`parse_command_line`]).
pub fn expand(arg: &str, t: &Tokens<'_>) -> String {
    let mut out = String::new();
    let mut chars = arg.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('u') => out.push_str(t.user),
            Some('h') => out.push_str(t.home),
            Some('U') => out.push_str(&t.uid.to_string()),
            Some('t') => out.push_str(t.key_type),
            Some('k') => out.push_str(t.key_base64),
            Some('f') => out.push_str(t.fingerprint),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Whether `mode` and `uid` keep a file or directory out of reach of users
/// other than root and `trusted`.
fn safe(uid: u32, mode: u32, trusted: u32, is_dir: bool) -> bool {
    let owner_ok = uid == 0 || uid == trusted;
    let sticky = mode & 0o1000 != 0;
    owner_ok && (mode & 0o022 == 0 || (is_dir && sticky))
}

/// Checks the program and every directory above it (see the module
/// documentation).
fn check_program(program: &Path) -> Result<(), String> {
    let me = nix::unistd::Uid::effective().as_raw();
    let meta = std::fs::metadata(program).map_err(|e| format!("{}: {e}", program.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", program.display()));
    }
    if !safe(meta.uid(), meta.mode(), me, false) {
        return Err(format!(
            "{} must be owned by root and not writable by group or others",
            program.display()
        ));
    }
    for dir in program.ancestors().skip(1) {
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !safe(m.uid(), m.mode(), me, true) {
            return Err(format!(
                "directory {} above {} must be owned by root and not writable by group or others",
                dir.display(),
                program.display()
            ));
        }
    }
    Ok(())
}

impl KeysCommand {
    /// The command `settings` configure, checked before skiffd serves
    /// anyone: as root, `AuthorizedKeysCommandUser` must name an account
    /// other than root; otherwise it may only name skiffd's own user.
    pub fn from_settings(
        settings: &crate::config::Settings,
    ) -> Result<Option<KeysCommand>, String> {
        let Some(argv) = &settings.authorized_keys_command else {
            return Ok(None);
        };
        let me = nix::unistd::Uid::effective();
        let user = match &settings.authorized_keys_command_user {
            Some(name) => Some(
                nix::unistd::User::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| format!("AuthorizedKeysCommandUser {name:?}: no such user"))?,
            ),
            None => None,
        };
        let run_as = match (me.is_root(), user) {
            (true, None) => {
                return Err("AuthorizedKeysCommand needs AuthorizedKeysCommandUser when skiffd runs as root".into())
            }
            (true, Some(u)) if u.uid.is_root() => {
                return Err("AuthorizedKeysCommandUser may not be root: name an account that does nothing else".into())
            }
            (true, Some(u)) => Some((u.uid.as_raw(), u.gid.as_raw())),
            (false, Some(u)) if u.uid != me => {
                return Err(format!(
                    "AuthorizedKeysCommandUser {}: skiffd is not root, so it can only run the command as itself",
                    u.name
                ))
            }
            (false, _) => None,
        };
        Ok(Some(KeysCommand {
            argv: argv.clone(),
            run_as,
        }))
    }

    /// Runs the command for `account` and the offered key, and returns the
    /// authorized_keys entries it printed (none if it could not be run or
    /// failed; the reason is logged).
    pub async fn keys(&self, account: &Account, tokens: &Tokens<'_>) -> Vec<AuthorizedKey> {
        match self.run(tokens).await {
            Ok(text) => {
                let label = format!("AuthorizedKeysCommand output for {}", account.name);
                let (keys, warnings) = authorized_keys::parse(&label, &text);
                for w in warnings {
                    tracing::warn!("{w}");
                }
                keys
            }
            Err(why) => {
                tracing::warn!(user = %account.name, "AuthorizedKeysCommand not used: {why}");
                Vec::new()
            }
        }
    }

    async fn run(&self, tokens: &Tokens<'_>) -> Result<String, String> {
        let program = Path::new(&self.argv[0]);
        check_program(program)?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(self.argv[1..].iter().map(|a| expand(a, tokens)))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.run_as {
            // The standard library drops supplementary groups before setuid
            // when it runs as root.
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let mut stdout = child.stdout.take().ok_or("no output pipe")?;
        let work = async {
            let mut out = Vec::new();
            (&mut stdout)
                .take(MAX_OUTPUT + 1)
                .read_to_end(&mut out)
                .await
                .map_err(|e| format!("reading its output: {e}"))?;
            if out.len() as u64 > MAX_OUTPUT {
                return Err(format!("it printed more than {MAX_OUTPUT} bytes"));
            }
            let status = child.wait().await.map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(format!("it exited with {status}"));
            }
            String::from_utf8(out).map_err(|_| "its output is not UTF-8".to_string())
        };
        tokio::time::timeout(TIMEOUT, work)
            .await
            .map_err(|_| format!("it did not finish within {} s", TIMEOUT.as_secs()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_and_tokens() {
        assert_eq!(
            parse_command_line("/usr/bin/keys").unwrap(),
            ["/usr/bin/keys", "%u"]
        );
        assert_eq!(
            parse_command_line("/k  --user=%u   %t %k").unwrap(),
            ["/k", "--user=%u", "%t", "%k"]
        );
        assert!(parse_command_line("keys %u").is_err());
        assert!(parse_command_line("").is_err());
        assert!(parse_command_line("/k %x").is_err());
        assert!(parse_command_line("/k 100%").is_err());
        let t = Tokens {
            user: "alice",
            home: "/home/alice",
            uid: 1000,
            key_type: "ssh-ed25519",
            key_base64: "AAAA",
            fingerprint: "SHA256:abc",
        };
        assert_eq!(
            expand("%u:%h:%U:%t:%k:%f:%%", &t),
            "alice:/home/alice:1000:ssh-ed25519:AAAA:SHA256:abc:%"
        );
    }

    #[test]
    fn only_root_or_skiffd_may_change_the_path() {
        assert!(safe(0, 0o100755, 1000, false));
        assert!(safe(1000, 0o100700, 1000, false));
        assert!(!safe(1001, 0o100755, 1000, false));
        assert!(!safe(0, 0o100775, 1000, false));
        assert!(!safe(0, 0o100757, 1000, false));
        // /tmp: world-writable but sticky.
        assert!(safe(0, 0o41777, 1000, true));
        assert!(!safe(0, 0o40777, 1000, true));
        assert!(!safe(0, 0o101777, 1000, false));
    }
}
