//! The environment of the programs skiffd starts, decided here and nowhere
//! else. Two rules, both as data.
//!
//! Who gets the session's environment ([`exec_environment`]). The session's
//! variables (the client's `env` requests that `AcceptEnv` lets in, the
//! server's `SetEnv`, authorized_keys `environment=`, and what skiffd sets
//! itself: `USER`, `HOME`, `SSH_CONNECTION`, ...) go only to a program that
//! is the account by the time it is executed: the credentials are taken in
//! the child before `execve` (or skiffd is not root, and so already the
//! account). A program skiffd starts with its own privileges, to drop them
//! itself or run as a helper user (the jailed SFTP server, which enters the
//! jail and becomes the account only after it started;
//! `AuthorizedKeysCommand`, `AuthorizedPrincipalsCommand`), starts with
//! [`FIXED`] and nothing else. The dynamic loader and the C library read the
//! environment at `execve`, before a program can drop anything, so a
//! variable handed to such a start would act with root's rights. The jailed
//! SFTP server runs no other program after it drops, so it takes none of
//! the session's environment at all (it needs none: `~` is the directory it
//! starts in).
//!
//! Which names no client and no user-writable file may set ([`refusal`]),
//! whatever `AcceptEnv` or `PermitUserEnvironment` say: variables that make
//! the dynamic loader, the C library or libraries most programs link load
//! code or trusted data from elsewhere, that change what a standard shell
//! runs or how it parses, that make a language runtime load modules or take
//! options, and the `SSH_*` names with which skiffd describes the login.
//! Whatever the command is, a forced one or a jailed one included, such a
//! variable would let the client run code the command did not name. The
//! rule covers the client's `env` requests (`ssh -o SendEnv`, `SetEnv`) and
//! `environment=` options; the server's own `SetEnv` is the administrator's
//! and is not checked. Program-specific hooks (`GIT_*`, `LESSOPEN`,
//! `PAGER`, `EDITOR`, ...) are not on the list: an `AcceptEnv` should name
//! what it needs rather than `*`.

use std::borrow::Cow;

/// The whole environment of a program skiffd starts before it is the
/// account.
pub const FIXED: &[(&str, &str)] = &[("PATH", "/usr/local/bin:/usr/bin:/bin")];

/// Who a program is when it is executed, which decides its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The account: it took the account's credentials before `execve` (or
    /// skiffd is not root).
    AsAccount,
    /// Still skiffd's privileges (it drops them itself later), or a helper
    /// user skiffd picked for a lookup command.
    Privileged,
}

impl Start {
    /// How a session program starts: `takes_credentials` when the child
    /// becomes the account before `execve`.
    pub fn for_session(takes_credentials: bool) -> Start {
        if takes_credentials || !nix::unistd::Uid::effective().is_root() {
            Start::AsAccount
        } else {
            Start::Privileged
        }
    }
}

/// The environment a program started as `start` is executed with: the
/// session's variables for the account, [`FIXED`] otherwise.
pub fn exec_environment(start: Start, session: &[(String, String)]) -> Vec<(&str, &str)> {
    match start {
        Start::AsAccount => session
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        Start::Privileged => FIXED.to_vec(),
    }
}

/// Why a variable may not come from a client or an authorized_keys line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The dynamic loader and the C library's start-up: they load code
    /// (`LD_PRELOAD`, `GCONV_PATH`) or change how every program allocates
    /// and behaves (`GLIBC_TUNABLES`, `MALLOC_*`).
    Loader,
    /// Files the C library and widely linked libraries read as trusted:
    /// locales, message catalogs, terminal descriptions, and OpenSSL's
    /// configuration, which can load modules.
    LibraryFiles,
    /// What a standard shell reads before or while it runs a command:
    /// start-up files, exported functions, options, word splitting, trace
    /// prompts, search paths.
    Shell,
    /// Module paths and start-up options of language runtimes.
    Interpreter,
    /// A name skiffd sets itself to describe the login, which a program
    /// must be able to trust.
    LoginRecord,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Loader => "a dynamic loader or C library variable",
            Refusal::LibraryFiles => "it points libraries at files they trust",
            Refusal::Shell => "it changes what a shell runs",
            Refusal::Interpreter => "it makes a language runtime load code",
            Refusal::LoginRecord => "skiffd sets it to describe the login",
        })
    }
}

/// A name, or every name that starts with a prefix.
#[derive(Debug, Clone, Copy)]
enum Name {
    Exact(&'static str),
    Prefix(&'static str),
}

use Name::{Exact, Prefix};

/// The refused names and why. Names are compared as they are spelt (the
/// environment is case-sensitive, and so are the programs that read it).
const REFUSED: &[(Name, Refusal)] = &[
    // glibc's dynamic loader and C library.
    (Prefix("LD_"), Refusal::Loader),
    (Prefix("MALLOC_"), Refusal::Loader),
    (Exact("GLIBC_TUNABLES"), Refusal::Loader),
    (Exact("GCONV_PATH"), Refusal::Loader),
    (Exact("GETCONF_DIR"), Refusal::Loader),
    // Data that libraries parse as trusted, or that loads modules.
    (Exact("LOCPATH"), Refusal::LibraryFiles),
    (Exact("NLSPATH"), Refusal::LibraryFiles),
    (Exact("TERMINFO"), Refusal::LibraryFiles),
    (Exact("TERMINFO_DIRS"), Refusal::LibraryFiles),
    (Exact("TERMCAP"), Refusal::LibraryFiles),
    (Exact("OPENSSL_CONF"), Refusal::LibraryFiles),
    (Exact("OPENSSL_ENGINES"), Refusal::LibraryFiles),
    (Exact("OPENSSL_MODULES"), Refusal::LibraryFiles),
    // sh, bash, ksh, zsh.
    (Exact("BASH_ENV"), Refusal::Shell),
    (Exact("ENV"), Refusal::Shell),
    (Prefix("BASH_FUNC_"), Refusal::Shell),
    (Exact("SHELLOPTS"), Refusal::Shell),
    (Exact("BASHOPTS"), Refusal::Shell),
    (Exact("IFS"), Refusal::Shell),
    (Exact("PS4"), Refusal::Shell),
    (Exact("PROMPT_COMMAND"), Refusal::Shell),
    (Exact("CDPATH"), Refusal::Shell),
    (Exact("GLOBIGNORE"), Refusal::Shell),
    (Exact("FPATH"), Refusal::Shell),
    (Exact("ZDOTDIR"), Refusal::Shell),
    // Language runtimes.
    (Prefix("PYTHON"), Refusal::Interpreter),
    (Exact("PERL5LIB"), Refusal::Interpreter),
    (Exact("PERL5OPT"), Refusal::Interpreter),
    (Exact("PERLLIB"), Refusal::Interpreter),
    (Exact("PERL5DB"), Refusal::Interpreter),
    (Prefix("RUBY"), Refusal::Interpreter),
    (Exact("GEM_HOME"), Refusal::Interpreter),
    (Exact("GEM_PATH"), Refusal::Interpreter),
    (Exact("NODE_OPTIONS"), Refusal::Interpreter),
    (Exact("NODE_PATH"), Refusal::Interpreter),
    (Exact("JAVA_TOOL_OPTIONS"), Refusal::Interpreter),
    (Exact("_JAVA_OPTIONS"), Refusal::Interpreter),
    (Exact("JDK_JAVA_OPTIONS"), Refusal::Interpreter),
    (Exact("CLASSPATH"), Refusal::Interpreter),
    (Exact("PHPRC"), Refusal::Interpreter),
    (Exact("PHP_INI_SCAN_DIR"), Refusal::Interpreter),
    (Prefix("LUA_"), Refusal::Interpreter),
    (Exact("TCLLIBPATH"), Refusal::Interpreter),
    // What skiffd says about the login.
    (Exact("SSH_ORIGINAL_COMMAND"), Refusal::LoginRecord),
    (Exact("SSH_CONNECTION"), Refusal::LoginRecord),
    (Exact("SSH_CLIENT"), Refusal::LoginRecord),
    (Exact("SSH_TTY"), Refusal::LoginRecord),
    (Exact("SSH_AUTH_SOCK"), Refusal::LoginRecord),
    (Exact("SSH_USER_AUTH"), Refusal::LoginRecord),
];

/// Why `name` may not be set by a client or an authorized_keys line, or
/// `None` when it may (as far as this rule goes: `AcceptEnv` and
/// `PermitUserEnvironment` still decide).
pub fn refusal(name: &str) -> Option<Refusal> {
    REFUSED.iter().find_map(|(n, why)| {
        let hit = match n {
            Exact(e) => name == *e,
            Prefix(p) => name.starts_with(p),
        };
        hit.then_some(*why)
    })
}

/// Where a refused variable came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// An `env` request (`ssh -o SendEnv`/`SetEnv`, skiff's alike).
    Client,
    /// An `environment=` option on the key's authorized_keys line (or
    /// from `AuthorizedKeysCommand`, or a principals line).
    KeyOption,
}

/// Longest part of a refused name that a log line shows.
const SHOWN: usize = 64;

/// The log line for a refused variable: its name (shortened, and escaped
/// so that it cannot steer a terminal or forge a line), where it came
/// from and why. Never the value.
pub fn refused_message(source: Source, name: &str, why: Refusal) -> String {
    let shown: Cow<'_, str> = match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => Cow::Owned(format!("{}...", &name[..cut])),
        None => Cow::Borrowed(name),
    };
    let from = match source {
        Source::Client => "sent by the client",
        Source::KeyOption => "from an environment= option",
    };
    format!(
        "refusing environment variable {} {from}: {why}; skiffd never passes it, whatever the configuration says",
        skiff_proto::terminal_text::one_line(&shown)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_shell_and_interpreter_variables_are_refused() {
        for (name, why) in [
            ("LD_PRELOAD", Refusal::Loader),
            ("LD_LIBRARY_PATH", Refusal::Loader),
            ("LD_AUDIT", Refusal::Loader),
            ("LD_", Refusal::Loader),
            ("MALLOC_CHECK_", Refusal::Loader),
            ("GLIBC_TUNABLES", Refusal::Loader),
            ("GCONV_PATH", Refusal::Loader),
            ("LOCPATH", Refusal::LibraryFiles),
            ("NLSPATH", Refusal::LibraryFiles),
            ("OPENSSL_CONF", Refusal::LibraryFiles),
            ("BASH_ENV", Refusal::Shell),
            ("ENV", Refusal::Shell),
            ("BASH_FUNC_ls%%", Refusal::Shell),
            ("IFS", Refusal::Shell),
            ("PS4", Refusal::Shell),
            ("SHELLOPTS", Refusal::Shell),
            ("PYTHONPATH", Refusal::Interpreter),
            ("PYTHONSTARTUP", Refusal::Interpreter),
            ("PERL5OPT", Refusal::Interpreter),
            ("RUBYOPT", Refusal::Interpreter),
            ("NODE_OPTIONS", Refusal::Interpreter),
            ("LUA_INIT", Refusal::Interpreter),
            ("SSH_ORIGINAL_COMMAND", Refusal::LoginRecord),
            ("SSH_USER_AUTH", Refusal::LoginRecord),
        ] {
            assert_eq!(refusal(name), Some(why), "{name}");
        }
    }

    #[test]
    fn ordinary_variables_pass() {
        for name in [
            "LANG",
            "LC_ALL",
            "LC_CTYPE",
            "TZ",
            "TERM",
            "GIT_PROTOCOL",
            "SKIFF_TEST_VAR",
            "COLORTERM",
            // Case matters: the loader reads LD_PRELOAD, not this.
            "ld_preload",
            "XLD_PRELOAD",
            "MY_ENV",
            "SSH_SOMETHING_ELSE",
        ] {
            assert_eq!(refusal(name), None, "{name}");
        }
    }

    #[test]
    fn privileged_starts_get_only_the_fixed_environment() {
        let session = vec![
            ("HOME".to_string(), "/home/ann".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        assert_eq!(exec_environment(Start::Privileged, &session), FIXED);
        assert_eq!(
            exec_environment(Start::AsAccount, &session),
            [("HOME", "/home/ann"), ("LANG", "C.UTF-8")]
        );
        // Nothing in the fixed list is a variable a client could not set
        // safely either.
        for (name, _) in FIXED {
            assert_eq!(refusal(name), None, "{name}");
        }
        assert_eq!(Start::for_session(true), Start::AsAccount);
    }

    #[test]
    fn the_log_line_names_the_variable_escaped_and_short_never_the_value() {
        let line = refused_message(Source::Client, "LD_PRELOAD", Refusal::Loader);
        assert!(line.contains("LD_PRELOAD sent by the client"), "{line}");
        assert!(line.contains("dynamic loader"), "{line}");
        let line = refused_message(Source::KeyOption, "LD_\u{1b}[2K\nX", Refusal::Loader);
        assert!(!line.contains('\u{1b}') && !line.contains('\n'), "{line}");
        assert!(
            line.contains(r"\u{1b}") && line.contains("environment="),
            "{line}"
        );
        let long = format!("LD_{}", "A".repeat(500));
        let line = refused_message(Source::Client, &long, Refusal::Loader);
        assert!(line.len() < 250, "{line}");
        assert!(line.contains("AAA..."), "{line}");
    }
}
