//! The options of sshd's `internal-sftp` (those of OpenSSH's sftp-server),
//! as `ForceCommand internal-sftp ARGS` and `Subsystem sftp internal-sftp
//! ARGS` give them: pure parsing and policy, no I/O.
//!
//! [`internal_sftp_command`] recognises such a command line and parses its
//! options ([`SftpOptions`], checked when skiffd reads its configuration,
//! so a bad one is a `file:line` error, never a surprise at login). At
//! login [`SftpOptions::for_login`] expands the `-d` tokens for the account
//! into [`ServerOptions`], which skiffd hands to its SFTP server process as
//! one hidden argument ([`ServerOptions::to_arg`], read back with
//! [`ServerOptions::from_arg`]). The server asks [`ServerOptions::refuses`]
//! before every request.
//!
//! `-l`, `-f` and `-e` are checked and otherwise have no effect: skiffd's
//! SFTP server logs nothing of its own (skiffd logs the session).
#![forbid(unsafe_code)]

use std::fmt;

/// The name sshd gives its built-in SFTP server.
pub const INTERNAL_SFTP: &str = "internal-sftp";

/// An SFTP request, by the name sftp-server's `-Q requests` lists it under
/// (and `-P`/`-p` take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Request {
    Open,
    Close,
    Read,
    Write,
    Lstat,
    Fstat,
    Setstat,
    Fsetstat,
    Opendir,
    Readdir,
    Remove,
    Mkdir,
    Rmdir,
    Realpath,
    Stat,
    Rename,
    Readlink,
    Symlink,
    PosixRename,
    Statvfs,
    Fstatvfs,
    Hardlink,
    Fsync,
    Lsetstat,
    Limits,
    ExpandPath,
    CopyData,
    HomeDirectory,
    UsersGroupsById,
}

impl Request {
    /// Every request, in `-Q requests` order.
    pub const ALL: [Request; 29] = [
        Request::Open,
        Request::Close,
        Request::Read,
        Request::Write,
        Request::Lstat,
        Request::Fstat,
        Request::Setstat,
        Request::Fsetstat,
        Request::Opendir,
        Request::Readdir,
        Request::Remove,
        Request::Mkdir,
        Request::Rmdir,
        Request::Realpath,
        Request::Stat,
        Request::Rename,
        Request::Readlink,
        Request::Symlink,
        Request::PosixRename,
        Request::Statvfs,
        Request::Fstatvfs,
        Request::Hardlink,
        Request::Fsync,
        Request::Lsetstat,
        Request::Limits,
        Request::ExpandPath,
        Request::CopyData,
        Request::HomeDirectory,
        Request::UsersGroupsById,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Request::Open => "open",
            Request::Close => "close",
            Request::Read => "read",
            Request::Write => "write",
            Request::Lstat => "lstat",
            Request::Fstat => "fstat",
            Request::Setstat => "setstat",
            Request::Fsetstat => "fsetstat",
            Request::Opendir => "opendir",
            Request::Readdir => "readdir",
            Request::Remove => "remove",
            Request::Mkdir => "mkdir",
            Request::Rmdir => "rmdir",
            Request::Realpath => "realpath",
            Request::Stat => "stat",
            Request::Rename => "rename",
            Request::Readlink => "readlink",
            Request::Symlink => "symlink",
            Request::PosixRename => "posix-rename",
            Request::Statvfs => "statvfs",
            Request::Fstatvfs => "fstatvfs",
            Request::Hardlink => "hardlink",
            Request::Fsync => "fsync",
            Request::Lsetstat => "lsetstat",
            Request::Limits => "limits",
            Request::ExpandPath => "expand-path",
            Request::CopyData => "copy-data",
            Request::HomeDirectory => "home-directory",
            Request::UsersGroupsById => "users-groups-by-id",
        }
    }

    pub fn from_name(name: &str) -> Option<Request> {
        Request::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The request an `SSH_FXP_EXTENDED` name stands for.
    pub fn from_extension(extension: &str) -> Option<Request> {
        let name = extension.strip_suffix("@openssh.com").unwrap_or(extension);
        Request::from_name(name).filter(|r| r.is_extension())
    }

    fn is_extension(self) -> bool {
        self >= Request::PosixRename
    }

    /// Whether the request can change the file system (refused by `-R`;
    /// `open` is decided by its flags, see [`ServerOptions::refuses_open`]).
    pub fn modifies(self) -> bool {
        matches!(
            self,
            Request::Write
                | Request::Setstat
                | Request::Fsetstat
                | Request::Remove
                | Request::Mkdir
                | Request::Rmdir
                | Request::Rename
                | Request::Symlink
                | Request::PosixRename
                | Request::Hardlink
                | Request::Fsync
                | Request::Lsetstat
                | Request::CopyData
        )
    }
}

/// Why an `internal-sftp` command line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("cannot split the command line: {0}")]
    Split(String),
    #[error("unknown option -{0}")]
    Unknown(char),
    #[error("option -{0} needs a value")]
    MissingValue(char),
    #[error("option -{0} is given twice")]
    Twice(char),
    #[error("-Q only queries a standalone server; it cannot serve a session")]
    Query,
    #[error("unexpected argument {0:?} (options only)")]
    Stray(String),
    #[error("-u {0:?}: expected an octal umask from 0 to 0777")]
    Umask(String),
    #[error(
        "-l {0:?}: expected QUIET, FATAL, ERROR, INFO, VERBOSE, DEBUG, DEBUG1, DEBUG2 or DEBUG3"
    )]
    Level(String),
    #[error("-f {0:?}: expected DAEMON, USER, AUTH, AUTHPRIV or LOCAL0 to LOCAL7")]
    Facility(String),
    #[error("unknown SFTP request {0:?} (sftp-server -Q requests lists them)")]
    UnknownRequest(String),
    #[error("-d {0:?}: {1}")]
    StartDir(String, String),
    #[error("malformed --sftp-options value {0:?}")]
    Encoded(String),
}

/// `internal-sftp`'s options as configured (the start directory's tokens
/// unexpanded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SftpOptions {
    /// `-d`: `%d` (home), `%u` (user) and `%%` tokens.
    pub start_dir: Option<String>,
    /// `-u`: the umask for files and directories the session creates.
    pub umask: Option<u32>,
    /// `-R`: every request that could change the file system is refused.
    pub read_only: bool,
    /// `-P`: requests refused.
    pub denied: Vec<Request>,
    /// `-p`: the only requests served (less those `-P` refuses).
    pub allowed: Option<Vec<Request>>,
    /// `-l`, `-f` (upper case) and `-e`: checked, without effect.
    pub log_level: Option<String>,
    pub log_facility: Option<String>,
    pub log_stderr: bool,
}

const LEVELS: &[&str] = &[
    "QUIET", "FATAL", "ERROR", "INFO", "VERBOSE", "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3",
];
const FACILITIES: &[&str] = &[
    "DAEMON", "USER", "AUTH", "AUTHPRIV", "LOCAL0", "LOCAL1", "LOCAL2", "LOCAL3", "LOCAL4",
    "LOCAL5", "LOCAL6", "LOCAL7",
];

/// The options of `command` when it runs sshd's built-in server
/// (`internal-sftp` as its first word); `None` for any other command.
pub fn internal_sftp_command(command: &str) -> Option<Result<SftpOptions, OptionsError>> {
    let first = command.split_whitespace().next()?;
    if first != INTERNAL_SFTP {
        return None;
    }
    Some(
        skiff_proto::ssh_config::split_args(command)
            .map_err(OptionsError::Split)
            .and_then(|words| SftpOptions::parse(&words[1..])),
    )
}

impl SftpOptions {
    /// Parses sftp-server's options, getopt style (`-R -u 022`, `-Ru022`,
    /// `--` ends them). Each may be given once, except `-P`, whose lists
    /// add up.
    pub fn parse(args: &[String]) -> Result<SftpOptions, OptionsError> {
        let mut o = SftpOptions::default();
        let mut seen: Vec<char> = Vec::new();
        let mut words = args.iter();
        while let Some(word) = words.next() {
            if word == "--" {
                if let Some(stray) = words.next() {
                    return Err(OptionsError::Stray(stray.clone()));
                }
                break;
            }
            let Some(flags) = word.strip_prefix('-').filter(|f| !f.is_empty()) else {
                return Err(OptionsError::Stray(word.clone()));
            };
            for (i, flag) in flags.char_indices() {
                if seen.contains(&flag) && flag != 'P' {
                    return Err(OptionsError::Twice(flag));
                }
                seen.push(flag);
                match flag {
                    'R' => {
                        o.read_only = true;
                        continue;
                    }
                    'e' => {
                        o.log_stderr = true;
                        continue;
                    }
                    'Q' => return Err(OptionsError::Query),
                    'd' | 'u' | 'l' | 'f' | 'P' | 'p' => {}
                    other => return Err(OptionsError::Unknown(other)),
                }
                // The rest of this word, else the next one, is the value.
                let rest = &flags[i + flag.len_utf8()..];
                let value = if rest.is_empty() {
                    words
                        .next()
                        .ok_or(OptionsError::MissingValue(flag))?
                        .clone()
                } else {
                    rest.to_string()
                };
                o.set(flag, value)?;
                break;
            }
        }
        Ok(o)
    }

    fn set(&mut self, flag: char, value: String) -> Result<(), OptionsError> {
        match flag {
            'd' => {
                // Checked now, expanded at login.
                expand_start_dir(&value, "/home", "user")?;
                self.start_dir = Some(value);
            }
            'u' => self.umask = Some(parse_umask(&value)?),
            'l' => {
                let up = value.to_ascii_uppercase();
                if !LEVELS.contains(&up.as_str()) {
                    return Err(OptionsError::Level(value));
                }
                self.log_level = Some(up);
            }
            'f' => {
                let up = value.to_ascii_uppercase();
                if !FACILITIES.contains(&up.as_str()) {
                    return Err(OptionsError::Facility(value));
                }
                self.log_facility = Some(up);
            }
            'P' => {
                for r in parse_requests(&value)? {
                    if !self.denied.contains(&r) {
                        self.denied.push(r);
                    }
                }
            }
            'p' => self.allowed = Some(parse_requests(&value)?),
            _ => unreachable!("only flags with values get here"),
        }
        Ok(())
    }

    /// Whether the options change what a session may do or how it makes
    /// files (all but the logging ones). skiff's data plane, which would
    /// bypass them, is then refused, and skiff clients use SFTP.
    pub fn shape_files(&self) -> bool {
        self.read_only
            || self.umask.is_some()
            || self.start_dir.is_some()
            || !self.denied.is_empty()
            || self.allowed.is_some()
    }

    /// What the server of one login applies: `-d`'s tokens expanded with
    /// the account's home and name.
    pub fn for_login(&self, home: &str, user: &str) -> Result<ServerOptions, OptionsError> {
        let start_dir = self
            .start_dir
            .as_deref()
            .map(|d| expand_start_dir(d, home, user))
            .transpose()?;
        let refused = Request::ALL
            .into_iter()
            .filter(|r| {
                self.denied.contains(r) || self.allowed.as_ref().is_some_and(|a| !a.contains(r))
            })
            .collect();
        Ok(ServerOptions {
            start_dir,
            umask: self.umask,
            read_only: self.read_only,
            refused,
        })
    }
}

fn expand_start_dir(template: &str, home: &str, user: &str) -> Result<String, OptionsError> {
    if template.is_empty() {
        return Err(OptionsError::StartDir(String::new(), "empty path".into()));
    }
    skiff_proto::ssh_config::expand_late_tokens(template, &[('d', home), ('u', user)])
        .map_err(|why| OptionsError::StartDir(template.to_string(), why))
}

fn parse_umask(value: &str) -> Result<u32, OptionsError> {
    let bad = || OptionsError::Umask(value.to_string());
    if value.is_empty() || !value.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(bad());
    }
    u32::from_str_radix(value, 8)
        .ok()
        .filter(|&m| m <= 0o777)
        .ok_or_else(bad)
}

fn parse_requests(list: &str) -> Result<Vec<Request>, OptionsError> {
    list.split(',')
        .map(|name| {
            Request::from_name(name).ok_or_else(|| OptionsError::UnknownRequest(name.into()))
        })
        .collect()
}

/// What one session's SFTP server enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerOptions {
    /// The directory to start in (relative: to the home directory).
    pub start_dir: Option<String>,
    pub umask: Option<u32>,
    pub read_only: bool,
    /// Refused by `-P` or left out of `-p`, in [`Request::ALL`] order.
    pub refused: Vec<Request>,
}

impl ServerOptions {
    /// Nothing to enforce: the server as it runs without options.
    pub fn is_empty(&self) -> bool {
        *self == ServerOptions::default()
    }

    /// Whether `request` gets SSH_FX_PERMISSION_DENIED.
    pub fn refuses(&self, request: Request) -> bool {
        self.refused.contains(&request) || (self.read_only && request.modifies())
    }

    /// Whether an `open` is refused; `writes`: it asks to write, create,
    /// truncate or append.
    pub fn refuses_open(&self, writes: bool) -> bool {
        self.refuses(Request::Open) || (self.read_only && writes)
    }

    /// One command-line word for the server process: space-separated
    /// fields, the start directory (any bytes) last.
    pub fn to_arg(&self) -> String {
        let mut fields: Vec<String> = Vec::new();
        if self.read_only {
            fields.push("read-only".into());
        }
        if let Some(mask) = self.umask {
            fields.push(format!("umask={mask:o}"));
        }
        if !self.refused.is_empty() {
            let names: Vec<&str> = self.refused.iter().map(|r| r.name()).collect();
            fields.push(format!("refuse={}", names.join(",")));
        }
        if let Some(dir) = &self.start_dir {
            fields.push(format!("start={dir}"));
        }
        fields.join(" ")
    }

    /// Reads back what [`ServerOptions::to_arg`] wrote.
    pub fn from_arg(arg: &str) -> Result<ServerOptions, OptionsError> {
        let bad = || OptionsError::Encoded(arg.to_string());
        let mut o = ServerOptions::default();
        let mut rest = arg;
        while !rest.is_empty() {
            if let Some(dir) = rest.strip_prefix("start=") {
                o.start_dir = Some(dir.to_string());
                break;
            }
            let (field, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            rest = tail;
            match field.split_once('=') {
                None if field == "read-only" => o.read_only = true,
                Some(("umask", m)) => o.umask = Some(parse_umask(m).map_err(|_| bad())?),
                Some(("refuse", list)) => o.refused = parse_requests(list).map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        Ok(o)
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<SftpOptions, OptionsError> {
        internal_sftp_command(line).expect("names internal-sftp")
    }

    #[test]
    fn only_internal_sftp_is_recognised() {
        assert!(internal_sftp_command("internal-sftpx -R").is_none());
        assert!(internal_sftp_command("/usr/lib/openssh/sftp-server -R").is_none());
        assert!(internal_sftp_command("").is_none());
        assert_eq!(parse("internal-sftp"), Ok(SftpOptions::default()));
        assert_eq!(parse("internal-sftp\t-R").map(|o| o.read_only), Ok(true));
    }

    #[test]
    fn options_parse_getopt_style() {
        let o = parse("internal-sftp -R -u 022 -d '%d/my files' -l verbose -f local5 -e").unwrap();
        assert!(o.read_only && o.log_stderr);
        assert_eq!(o.umask, Some(0o022));
        assert_eq!(o.start_dir.as_deref(), Some("%d/my files"));
        assert_eq!(o.log_level.as_deref(), Some("VERBOSE"));
        assert_eq!(o.log_facility.as_deref(), Some("LOCAL5"));
        // Clustered flags and attached values.
        let o = parse("internal-sftp -eRu077 -d/srv -Premove,rename -P remove,mkdir").unwrap();
        assert!(o.read_only && o.log_stderr);
        assert_eq!(o.umask, Some(0o077));
        assert_eq!(o.start_dir.as_deref(), Some("/srv"));
        assert_eq!(
            o.denied,
            [Request::Remove, Request::Rename, Request::Mkdir],
            "-P lists add up"
        );
        let o = parse("internal-sftp -p open,read,close,realpath,stat,lstat -- ").unwrap();
        assert_eq!(o.allowed.map(|a| a.len()), Some(6));
    }

    #[test]
    fn bad_options_are_typed_errors() {
        use OptionsError::*;
        let cases: &[(&str, OptionsError)] = &[
            ("internal-sftp -x", Unknown('x')),
            ("internal-sftp -h", Unknown('h')),
            ("internal-sftp -u", MissingValue('u')),
            ("internal-sftp -u 9x", Umask("9x".into())),
            ("internal-sftp -u 1777", Umask("1777".into())),
            ("internal-sftp -u ''", Umask("".into())),
            ("internal-sftp -l LOUD", Level("LOUD".into())),
            ("internal-sftp -f KERN", Facility("KERN".into())),
            (
                "internal-sftp -P remove,erase",
                UnknownRequest("erase".into()),
            ),
            ("internal-sftp -p read,", UnknownRequest("".into())),
            ("internal-sftp -R -R", Twice('R')),
            ("internal-sftp -u 022 -u 077", Twice('u')),
            ("internal-sftp -Q requests", Query),
            ("internal-sftp /home", Stray("/home".into())),
            ("internal-sftp -R -- extra", Stray("extra".into())),
            ("internal-sftp -", Stray("-".into())),
        ];
        for (line, want) in cases {
            assert_eq!(parse(line).as_ref(), Err(want), "{line}");
        }
        assert!(matches!(
            parse("internal-sftp -d %h/x"),
            Err(StartDir(d, _)) if d == "%h/x"
        ));
        assert!(matches!(parse("internal-sftp -d 'x"), Err(Split(_))));
    }

    #[test]
    fn login_expands_tokens_and_folds_the_request_lists() {
        let o = parse("internal-sftp -d %d/in/%u/%% -P remove").unwrap();
        let s = o.for_login("/home/ann", "ann").unwrap();
        assert_eq!(s.start_dir.as_deref(), Some("/home/ann/in/ann/%"));
        assert_eq!(s.refused, [Request::Remove]);
        // -p allows, -P still refuses; the rest is refused.
        let o = parse("internal-sftp -p open,read,remove -P remove").unwrap();
        let s = o.for_login("/h", "u").unwrap();
        assert!(!s.refuses(Request::Open) && !s.refuses(Request::Read));
        assert!(s.refuses(Request::Remove) && s.refuses(Request::Write));
        assert!(s.refuses(Request::Realpath));
        assert!(!parse("internal-sftp -e -l debug3 -f user")
            .unwrap()
            .shape_files());
        assert!(parse("internal-sftp -u 0").unwrap().shape_files());
        assert!(parse("internal-sftp")
            .unwrap()
            .for_login("/h", "u")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn read_only_refuses_what_modifies() {
        let s = parse("internal-sftp -R")
            .unwrap()
            .for_login("/h", "u")
            .unwrap();
        for r in Request::ALL {
            assert_eq!(s.refuses(r), r.modifies(), "{r}");
        }
        assert!(s.refuses_open(true));
        assert!(!s.refuses_open(false));
        assert!(!ServerOptions::default().refuses_open(true));
    }

    #[test]
    fn extensions_map_to_requests() {
        assert_eq!(
            Request::from_extension("posix-rename@openssh.com"),
            Some(Request::PosixRename)
        );
        assert_eq!(
            Request::from_extension("copy-data"),
            Some(Request::CopyData)
        );
        assert_eq!(Request::from_extension("open@openssh.com"), None);
        assert_eq!(Request::from_extension("nope@example.com"), None);
        let names: Vec<&str> = Request::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), 29);
        assert!(Request::ALL
            .iter()
            .all(|r| Request::from_name(r.name()) == Some(*r)));
    }

    #[test]
    fn the_server_argument_round_trips() {
        let all = ServerOptions {
            start_dir: Some("/home/a b/ umask=1 refuse=x".into()),
            umask: Some(0o27),
            read_only: true,
            refused: vec![Request::Remove, Request::PosixRename],
        };
        for o in [all, ServerOptions::default()] {
            assert_eq!(ServerOptions::from_arg(&o.to_arg()), Ok(o.clone()));
        }
        for bad in ["loud", "umask=9", "refuse=erase", "read-only  umask=1"] {
            assert!(ServerOptions::from_arg(bad).is_err(), "{bad}");
        }
    }
}
