//! `AuthorizedKeysCommand` and `AuthorizedPrincipalsCommand`: programs that
//! print authorized_keys lines, or certificate principals, for an account
//! (from LDAP, a cloud metadata service, ...). The keys command is asked
//! when the account's authorized_keys file does not admit the offered key;
//! the principals command for every user certificate, next to
//! `AuthorizedPrincipalsFile`.
//!
//! As in sshd, the program must be given by absolute path and may only be
//! run from a file and directories that nobody but root (or the user skiffd
//! runs as) can change. skiffd checks that before every run and refuses to
//! use it otherwise. One difference: a world-writable directory with the
//! sticky bit (`/tmp`) is accepted, since nobody else can replace an entry
//! in it. As root, skiffd runs the program as the command's user
//! (`AuthorizedKeysCommandUser`, `AuthorizedPrincipalsCommandUser`), never
//! as root. It runs with the fixed environment of every program skiffd
//! starts before it is the account (only `PATH`: see
//! [`crate::session_env`]), never a client's variable, with
//! `/` as working directory and no input, and gets at most 10 seconds and
//! 1 MiB of output. Output from a run that fails is not used.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use skiff_proto::authorized_keys::{self, AuthorizedKey, AuthorizedPrincipal};
use tokio::io::AsyncReadExt;

use crate::account::Account;
use crate::session_env;

/// Longest a run may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Most output read from a run.
const MAX_OUTPUT: u64 = 1 << 20;

/// How a list is read: a label for messages and the text, to the items
/// and warnings for bad lines (`authorized_keys::parse`, `parse_principals`).
pub(crate) type Parser<T> = fn(&str, &str) -> (Vec<T>, Vec<authorized_keys::ParseWarning>);

/// Tokens `AuthorizedKeysCommand` takes.
pub const KEYS_TOKENS: &str = "%uhUtkf";
/// Tokens `AuthorizedPrincipalsCommand` takes: those, and the certificate's.
pub const PRINCIPALS_TOKENS: &str = "%uhUtkfisTKF";

/// A configured command: the program and its argument templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupCommand {
    /// `AuthorizedKeysCommand` or `AuthorizedPrincipalsCommand`.
    pub keyword: &'static str,
    pub argv: Vec<String>,
    /// Who runs it: the command user's uid and gid; `None` runs it as
    /// skiffd's own user (only when skiffd is not root).
    pub run_as: Option<(u32, u32)>,
}

/// What the tokens stand for in one run.
pub struct Tokens<'a> {
    pub user: &'a str,
    pub home: &'a str,
    pub uid: u32,
    /// Key type, e.g. `ssh-ed25519` (for a certificate, its type).
    pub key_type: &'a str,
    /// The key (or certificate), base64 as in authorized_keys.
    pub key_base64: &'a str,
    /// `SHA256:...` of the key (for a certificate, of the key it certifies).
    pub fingerprint: &'a str,
    /// For a certificate: what `%i %s %T %K %F` stand for.
    pub certificate: Option<CertificateTokens<'a>>,
}

/// A certificate's tokens.
pub struct CertificateTokens<'a> {
    pub key_id: &'a str,
    pub serial: u64,
    /// The CA key's type, base64 and fingerprint.
    pub ca_type: &'a str,
    pub ca_base64: &'a str,
    pub ca_fingerprint: &'a str,
}

/// Splits the configured value of `keyword` into the program and its
/// arguments. The program must be an absolute path; every `%` must start
/// one of the `tokens` ([`KEYS_TOKENS`], [`PRINCIPALS_TOKENS`]). Without
/// arguments, the user name is passed (as sshd does).
pub fn parse_command_line(keyword: &str, value: &str, tokens: &str) -> Result<Vec<String>, String> {
    let mut argv: Vec<String> = value.split_whitespace().map(str::to_owned).collect();
    let Some(program) = argv.first() else {
        return Err(format!("{keyword} needs a program"));
    };
    if !program.starts_with('/') {
        return Err(format!("{keyword} {program:?} must be an absolute path"));
    }
    if argv.len() == 1 {
        argv.push("%u".into());
    }
    for arg in &argv {
        let mut chars = arg.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                continue;
            }
            match chars.next() {
                Some(t) if tokens.contains(t) => {}
                Some(other) => return Err(format!("{keyword}: unknown token %{other} in {arg:?}")),
                None => return Err(format!("{keyword}: lone % at the end of {arg:?}")),
            }
        }
    }
    Ok(argv)
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
            Some(c @ ('i' | 's' | 'T' | 'K' | 'F')) => {
                if let Some(cert) = &t.certificate {
                    match c {
                        'i' => out.push_str(cert.key_id),
                        's' => out.push_str(&cert.serial.to_string()),
                        'T' => out.push_str(cert.ca_type),
                        'K' => out.push_str(cert.ca_base64),
                        _ => out.push_str(cert.ca_fingerprint),
                    }
                }
            }
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
/// documentation): what skiffd requires of any program it runs as root.
pub(crate) fn check_program(program: &Path) -> Result<(), String> {
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

impl LookupCommand {
    /// The command `keyword` configures (`argv`, run by `user`), checked
    /// before skiffd serves anyone: as root, the command user must name an
    /// account other than root; otherwise it may only name skiffd's own
    /// user.
    pub fn new(
        keyword: &'static str,
        argv: Option<&Vec<String>>,
        user: Option<&String>,
    ) -> Result<Option<LookupCommand>, String> {
        let Some(argv) = argv else {
            return Ok(None);
        };
        let me = nix::unistd::Uid::effective();
        let user = match user {
            Some(name) => Some(
                nix::unistd::User::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| format!("{keyword}User {name:?}: no such user"))?,
            ),
            None => None,
        };
        let run_as = match (me.is_root(), user) {
            (true, None) => {
                return Err(format!(
                    "{keyword} needs {keyword}User when skiffd runs as root"
                ))
            }
            (true, Some(u)) if u.uid.is_root() => {
                return Err(format!(
                    "{keyword}User may not be root: name an account that does nothing else"
                ))
            }
            (true, Some(u)) => Some((u.uid.as_raw(), u.gid.as_raw())),
            (false, Some(u)) if u.uid != me => {
                return Err(format!(
                "{keyword}User {}: skiffd is not root, so it can only run the command as itself",
                u.name
            ))
            }
            (false, _) => None,
        };
        Ok(Some(LookupCommand {
            keyword,
            argv: argv.clone(),
            run_as,
        }))
    }

    /// Runs the command for `account` and returns the authorized_keys
    /// entries it printed (none if it could not be run or failed; the
    /// reason is logged).
    pub async fn keys(&self, account: &Account, tokens: &Tokens<'_>) -> Vec<AuthorizedKey> {
        self.parsed(account, tokens, authorized_keys::parse).await
    }

    /// Runs the command for `account` and returns the principals it
    /// printed, with their options (as in `AuthorizedPrincipalsFile`).
    pub async fn principals(
        &self,
        account: &Account,
        tokens: &Tokens<'_>,
    ) -> Vec<AuthorizedPrincipal> {
        self.parsed(account, tokens, authorized_keys::parse_principals)
            .await
    }

    async fn parsed<T>(&self, account: &Account, tokens: &Tokens<'_>, parse: Parser<T>) -> Vec<T> {
        match self.run(tokens).await {
            Ok(text) => {
                let label = format!("{} output for {}", self.keyword, account.name);
                let (items, warnings) = parse(&label, &text);
                for w in warnings {
                    tracing::warn!("{w}");
                }
                items
            }
            Err(why) => {
                tracing::warn!(user = %account.name, "{} not used: {why}", self.keyword);
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
            .envs(session_env::exec_environment(
                session_env::Start::Privileged,
                &[],
            ))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(lim) = crate::descriptors::child_open_file_limit() {
            // SAFETY: the closure only makes one system call
            // (async-signal-safe) on a value copied in before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                    Ok(())
                });
            }
        }
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
        let keys = |v| parse_command_line("AuthorizedKeysCommand", v, KEYS_TOKENS);
        assert_eq!(keys("/usr/bin/keys").unwrap(), ["/usr/bin/keys", "%u"]);
        assert_eq!(
            keys("/k  --user=%u   %t %k").unwrap(),
            ["/k", "--user=%u", "%t", "%k"]
        );
        assert!(keys("keys %u").is_err());
        assert!(keys("").is_err());
        assert!(keys("/k %x").is_err());
        assert!(keys("/k 100%").is_err());
        // Certificate tokens only for the principals command.
        assert!(keys("/k %i").is_err());
        assert!(parse_command_line("P", "/p %u %i %s %T %K %F", PRINCIPALS_TOKENS).is_ok());
        let mut t = Tokens {
            user: "alice",
            home: "/home/alice",
            uid: 1000,
            key_type: "ssh-ed25519",
            key_base64: "AAAA",
            fingerprint: "SHA256:abc",
            certificate: None,
        };
        assert_eq!(
            expand("%u:%h:%U:%t:%k:%f:%%", &t),
            "alice:/home/alice:1000:ssh-ed25519:AAAA:SHA256:abc:%"
        );
        t.certificate = Some(CertificateTokens {
            key_id: "laptop",
            serial: 42,
            ca_type: "ssh-ed25519",
            ca_base64: "BBBB",
            ca_fingerprint: "SHA256:ca",
        });
        assert_eq!(
            expand("%i %s %T %K %F", &t),
            "laptop 42 ssh-ed25519 BBBB SHA256:ca"
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
