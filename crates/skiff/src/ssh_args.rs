//! OpenSSH's `ssh` command line, parsed without I/O: what `skiff ssh` (and
//! skiff run under the name `ssh` or `skiff-ssh`) accepts so that programs
//! which run `ssh` — rsync, git, distcc, scp/sftp `-S`, monitoring checks —
//! can run skiff instead.
//!
//! The rules follow ssh's: single-letter options may be grouped (`-Tn`), an
//! option's value may be attached (`-p2222`, `-oBatchMode=yes`) or be the next
//! word, options may also follow the destination (`ssh host -l bob cmd`),
//! and the first word after the destination and its options starts the
//! command, whose words are joined with spaces. Options that ask for
//! something skiff does not do (port forwarding, control sockets, ...) are
//! errors rather than silently dropped; options that only turn such things
//! off are accepted.

use std::path::PathBuf;

use skiff_proto::forward_spec::{self, ForwardSpec};

/// What `-t`/`-T` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TtyFlag {
    /// Neither: `RequestTTY` from the configuration decides.
    #[default]
    Unset,
    /// `-T`.
    Disable,
    /// `-t` (1) or `-tt` (2 or more).
    Request(u8),
}

/// `-O ctl_cmd`: what ssh would ask of a control master, asked of skiff's
/// agent instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlCommand {
    Check,
    Stop,
    Exit,
}

/// A parsed `ssh` command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SshCommandLine {
    /// `[user@]host`, with any `ssh://` form already split into
    /// `login`/`port`.
    pub destination: String,
    pub login: Option<String>,
    pub port: Option<u16>,
    pub identity: Vec<PathBuf>,
    pub config: Option<PathBuf>,
    /// `-o` options, with the options other flags stand for (`-c`, `-m`,
    /// `-4`, `-6`, `-q`) in command-line order.
    pub options: Vec<String>,
    pub jump: Option<String>,
    pub verbose: u8,
    /// `-E FILE`: diagnostics appended there instead of stderr.
    pub log_file: Option<PathBuf>,
    pub no_stdin: bool,
    pub tty: TtyFlag,
    /// `-s`: the command names a subsystem.
    pub subsystem: bool,
    /// `-W host:port`: connect standard input and output to that address,
    /// reached from the destination.
    pub forward_stdio: Option<(String, u16)>,
    /// `-L`, `-R`, `-D`, in command-line order.
    pub forwards: Vec<ForwardSpec>,
    /// `-N`: run no command (forwarding only).
    pub no_command: bool,
    /// `-f`: go to the background once connected.
    pub background: bool,
    /// `-G`: print the resolved configuration and exit.
    pub print_config: bool,
    /// `-V`: print the version and exit.
    pub version: bool,
    /// `-Q QUERY`: list the algorithms supported for `QUERY` and exit.
    pub query: Option<String>,
    /// `-O ctl_cmd`.
    pub control: Option<ControlCommand>,
    /// The command's words (empty: a login shell).
    pub command: Vec<String>,
    /// Accepted options skiff cannot honour, for one warning each
    /// (agent and X11 forwarding).
    pub warnings: Vec<String>,
}

/// Why a command line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshArgsError {
    #[error("option -{0} needs a value")]
    MissingValue(char),
    #[error("unknown option -{0}")]
    Unknown(char),
    #[error("-{flag} ({what}) is not supported by skiff")]
    Unsupported { flag: char, what: &'static str },
    #[error("bad port {0:?}")]
    BadPort(String),
    #[error("bad -W value {0:?} (expected host:port)")]
    BadForward(String),
    #[error("bad destination {0:?}")]
    BadDestination(String),
    #[error("no destination given")]
    NoDestination,
    #[error("-W cannot be used with a command")]
    ForwardWithCommand,
    #[error("{0}")]
    BadForwardSpec(String),
    #[error("-N cannot be used with a command")]
    NoCommandWithCommand,
    #[error("invalid control command {0:?} (expected check, stop or exit)")]
    BadControlCommand(String),
}

/// Options that take a value (OpenSSH 9's set).
const WITH_VALUE: &str = "bcDeEFIiJLlmOoPpQRSwWB";
/// Options without a value.
const FLAGS: &str = "1246aACfgGkKMnNqsTtvVxXy";

/// Parses ssh's arguments (without the program name).
pub fn parse(args: &[String]) -> Result<SshCommandLine, SshArgsError> {
    let mut out = SshCommandLine::default();
    let mut destination = None;
    let mut i = 0;
    loop {
        let mut terminated = false;
        while i < args.len() {
            let arg = &args[i];
            if arg == "--" {
                i += 1;
                terminated = true;
                break;
            }
            if !arg.starts_with('-') || arg.len() == 1 {
                break;
            }
            let cluster: Vec<char> = arg[1..].chars().collect();
            let mut k = 0;
            while k < cluster.len() {
                let flag = cluster[k];
                if WITH_VALUE.contains(flag) {
                    let attached: String = cluster[k + 1..].iter().collect();
                    let value = if !attached.is_empty() {
                        attached
                    } else {
                        i += 1;
                        args.get(i)
                            .cloned()
                            .ok_or(SshArgsError::MissingValue(flag))?
                    };
                    apply_value(&mut out, flag, value)?;
                    if out.query.is_some() {
                        // As ssh does, a query is answered at once: what
                        // follows is not looked at.
                        return Ok(out);
                    }
                    break;
                }
                if !FLAGS.contains(flag) {
                    return Err(SshArgsError::Unknown(flag));
                }
                apply_flag(&mut out, flag)?;
                k += 1;
            }
            i += 1;
        }
        if destination.is_some() || out.version {
            break;
        }
        let Some(dest) = args.get(i) else {
            return Err(SshArgsError::NoDestination);
        };
        destination = Some(dest.clone());
        i += 1;
        // As ssh does, options may follow the destination, until `--` or
        // the first word of the command.
        if terminated {
            break;
        }
    }
    if let Some(dest) = destination {
        set_destination(&mut out, &dest)?;
    }
    out.command = args[i.min(args.len())..].to_vec();
    if out.forward_stdio.is_some() && !out.command.is_empty() {
        return Err(SshArgsError::ForwardWithCommand);
    }
    if out.no_command && !out.command.is_empty() {
        return Err(SshArgsError::NoCommandWithCommand);
    }
    Ok(out)
}

fn apply_flag(out: &mut SshCommandLine, flag: char) -> Result<(), SshArgsError> {
    let unsupported = |what| Err(SshArgsError::Unsupported { flag, what });
    match flag {
        '1' => return unsupported("SSH protocol version 1"),
        '4' => out.options.push("AddressFamily=inet".into()),
        '6' => out.options.push("AddressFamily=inet6".into()),
        'A' => out.options.push("ForwardAgent=yes".into()),
        'a' => out.options.push("ForwardAgent=no".into()),
        'X' | 'Y' => out.warnings.push(format!(
            "X11 forwarding (-{flag}) is not supported; continuing without it"
        )),
        // Protocol 2 is the only one; -x -k -K -C -y turn off or tune
        // things skiff does not do (X11 forwarding, GSSAPI, compression,
        // syslog).
        'C' => out.options.push("Compression=yes".into()),
        '2' | 'x' | 'k' | 'K' | 'y' => {}
        'g' => out.options.push("GatewayPorts=yes".into()),
        'f' => out.background = true,
        'G' => out.print_config = true,
        'M' => {
            return unsupported("connection sharing as a master; skiff's agent shares connections")
        }
        'N' => out.no_command = true,
        'n' => out.no_stdin = true,
        'q' => out.options.push("LogLevel=QUIET".into()),
        's' => out.subsystem = true,
        'T' => out.tty = TtyFlag::Disable,
        't' => {
            out.tty = match out.tty {
                TtyFlag::Request(n) => TtyFlag::Request(n.saturating_add(1)),
                _ => TtyFlag::Request(1),
            }
        }
        'v' => out.verbose = out.verbose.saturating_add(1),
        'V' => out.version = true,
        _ => return Err(SshArgsError::Unknown(flag)),
    }
    Ok(())
}

fn apply_value(out: &mut SshCommandLine, flag: char, value: String) -> Result<(), SshArgsError> {
    let unsupported = |what| Err(SshArgsError::Unsupported { flag, what });
    match flag {
        'b' => out.options.push(format!("BindAddress={value}")),
        'B' => out.options.push(format!("BindInterface={value}")),
        'c' => out.options.push(format!("Ciphers={value}")),
        'm' => out.options.push(format!("MACs={value}")),
        'D' => out.forwards.push(
            forward_spec::parse_dynamic(&value)
                .map_err(|e| SshArgsError::BadForwardSpec(e.message))?,
        ),
        'L' | 'R' => out.forwards.push(
            forward_spec::parse_forward(&value, flag == 'R')
                .map_err(|e| SshArgsError::BadForwardSpec(e.message))?,
        ),
        'w' => return unsupported("tunnel devices"),
        'I' => return unsupported("PKCS#11"),
        'O' => {
            out.control = Some(match value.as_str() {
                "check" => ControlCommand::Check,
                "stop" => ControlCommand::Stop,
                "exit" => ControlCommand::Exit,
                "forward" | "cancel" | "proxy" => {
                    return unsupported(
                        "forward, cancel and proxy control commands; skiff's agent shares connections without a control master",
                    )
                }
                _ => return Err(SshArgsError::BadControlCommand(value)),
            })
        }
        'Q' => out.query = Some(value),
        // `-S none` turns connection sharing off, which is all it can mean here.
        'S' if value == "none" => {}
        'S' => return unsupported("control sockets; skiff's agent shares connections"),
        'e' => out.options.push(format!("EscapeChar={value}")),
        'E' => out.log_file = Some(PathBuf::from(value)),
        // A tag only selects `Match tagged`, which skiff does not read.
        'P' => {}
        'F' => out.config = Some(PathBuf::from(value)),
        'i' => out.identity.push(PathBuf::from(value)),
        'J' => out.jump = Some(value),
        // As in ssh, the first of -l and -o User (and of -p and -o Port)
        // wins, and either wins over the destination's user@ and :port.
        'l' => {
            out.login.get_or_insert(value);
        }
        'o' => {
            if let Some(user) = option_value(&value, "User") {
                out.login.get_or_insert_with(|| user.to_string());
            }
            // A bad port is the configuration parser's to report.
            if let Some(Ok(port)) = option_value(&value, "Port").map(parse_port) {
                out.port.get_or_insert(port);
            }
            out.options.push(value)
        }
        'p' => {
            let port = parse_port(&value)?;
            out.port.get_or_insert(port);
        }
        'W' => out.forward_stdio = Some(parse_forward(&value)?),
        _ => return Err(SshArgsError::Unknown(flag)),
    }
    Ok(())
}

fn parse_port(value: &str) -> Result<u16, SshArgsError> {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(SshArgsError::BadPort(value.to_owned())),
    }
}

/// `host:port`, `[v6addr]:port` (as ssh's -W takes them).
fn parse_forward(value: &str) -> Result<(String, u16), SshArgsError> {
    let bad = || SshArgsError::BadForward(value.to_owned());
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':').ok_or_else(bad)?)
    } else {
        value.rsplit_once(':').ok_or_else(bad)?
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = parse_port(port).map_err(|_| bad())?;
    Ok((host.to_owned(), port))
}

/// The value of `-o` `option` when it sets `keyword` (`Keyword=Value` or
/// `Keyword Value`, the keyword in any case).
fn option_value<'a>(option: &'a str, keyword: &str) -> Option<&'a str> {
    let (name, value) = option
        .trim_start()
        .split_once(|c: char| c == '=' || c.is_whitespace())?;
    let value = value.trim_start_matches(|c: char| c == '=' || c.is_whitespace());
    (name.eq_ignore_ascii_case(keyword) && !value.is_empty()).then_some(value.trim_end())
}

/// `[user@]host` as given, or `ssh://[user@]host[:port]`, whose user and
/// port fill `-l`/`-p` when those are not given (command-line options win,
/// as in ssh).
fn set_destination(out: &mut SshCommandLine, dest: &str) -> Result<(), SshArgsError> {
    let bad = || SshArgsError::BadDestination(dest.to_owned());
    let Some(rest) = dest.strip_prefix("ssh://") else {
        if dest.is_empty() {
            return Err(bad());
        }
        out.destination = dest.to_owned();
        return Ok(());
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(bad());
    }
    let (user, hostport) = match rest.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() => (Some(u), h),
        Some(_) => return Err(bad()),
        None => (None, rest),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    if let Some(p) = port {
        let p = parse_port(p).map_err(|_| bad())?;
        out.port.get_or_insert(p);
    }
    if let Some(u) = user {
        out.login.get_or_insert_with(|| u.to_owned());
    }
    out.destination = host.to_owned();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Result<SshCommandLine, SshArgsError> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse(&args)
    }

    #[test]
    fn the_first_user_and_port_on_the_command_line_win_as_in_ssh() {
        let user_port = |line: &str| {
            let c = p(line).unwrap();
            (c.login, c.port)
        };
        let some = |u: &str, port: u16| (Some(u.to_string()), Some(port));
        assert_eq!(user_port("-o User=foo -l bar -p 1 h"), some("foo", 1));
        assert_eq!(
            user_port("-l bar -o user=foo -oPort=2 -p3 h"),
            some("bar", 2)
        );
        assert_eq!(user_port("-l bar -p 4 ssh://foo@h:5"), some("bar", 4));
        assert_eq!(
            user_port("-o User=foo -l x baz@h").0.as_deref(),
            Some("foo")
        );
        // A plain user@host is split later, under the command line's user.
        assert_eq!(p("baz@h").unwrap().destination, "baz@h");
        // The options still reach the configuration as given.
        assert_eq!(p("-o User=foo h").unwrap().options, ["User=foo"]);
    }

    #[test]
    fn rsync_style_invocation() {
        let c = p("-l bob host rsync --server -vlogDtpre.iLsfxCIvu . /dst").unwrap();
        assert_eq!(c.login.as_deref(), Some("bob"));
        assert_eq!(c.destination, "host");
        assert_eq!(
            c.command,
            ["rsync", "--server", "-vlogDtpre.iLsfxCIvu", ".", "/dst"]
        );
    }

    #[test]
    fn grouped_and_attached_values() {
        let c =
            p("-Tnp2222 -oBatchMode=yes -o StrictHostKeyChecking=no -i k1 -ik2 h true").unwrap();
        assert_eq!(c.tty, TtyFlag::Disable);
        assert!(c.no_stdin);
        assert_eq!(c.port, Some(2222));
        assert_eq!(c.options, ["BatchMode=yes", "StrictHostKeyChecking=no"]);
        assert_eq!(c.identity, [PathBuf::from("k1"), PathBuf::from("k2")]);
        assert_eq!(c.command, ["true"]);
    }

    #[test]
    fn options_after_the_destination_then_the_command() {
        let c = p("host -p 22 -v ls -l /tmp").unwrap();
        assert_eq!(c.port, Some(22));
        assert_eq!(c.verbose, 1);
        assert_eq!(c.command, ["ls", "-l", "/tmp"]);
        // `--` after the destination ends the options.
        let c = p("host -- -p 22").unwrap();
        assert_eq!(c.port, None);
        assert_eq!(c.command, ["-p", "22"]);
        // `--` before it ends them too: what follows the host is the command.
        let c = p("-- host -v").unwrap();
        assert_eq!(c.verbose, 0);
        assert_eq!(c.command, ["-v"]);
    }

    #[test]
    fn sftp_and_scp_style_invocation() {
        // What OpenSSH's sftp runs with -S PROGRAM.
        let c = p("-oForwardX11=no -oPermitLocalCommand=no -oClearAllForwardings=yes -oForwardAgent=no -l bob -s -- host sftp").unwrap();
        assert!(c.subsystem);
        assert_eq!(c.destination, "host");
        assert_eq!(c.command, ["sftp"]);
        assert_eq!(c.options.len(), 4);
    }

    #[test]
    fn tty_flags_count_and_disable() {
        assert_eq!(p("-t h").unwrap().tty, TtyFlag::Request(1));
        assert_eq!(p("-tt h").unwrap().tty, TtyFlag::Request(2));
        assert_eq!(p("-t -t h").unwrap().tty, TtyFlag::Request(2));
        assert_eq!(p("h").unwrap().tty, TtyFlag::Unset);
        assert!(p("h").unwrap().command.is_empty());
    }

    #[test]
    fn flags_that_stand_for_options() {
        let c = p("-4 -q -c aes256-gcm@openssh.com -m hmac-sha2-256 h").unwrap();
        assert_eq!(
            c.options,
            [
                "AddressFamily=inet",
                "LogLevel=QUIET",
                "Ciphers=aes256-gcm@openssh.com",
                "MACs=hmac-sha2-256"
            ]
        );
    }

    #[test]
    fn port_forwarding_options() {
        let c = p("-N -L 8080:db:5432 -R0:localhost:80 -D1080 -g h").unwrap();
        let shown: Vec<String> = c.forwards.iter().map(ForwardSpec::to_string).collect();
        assert_eq!(shown, ["-L 8080:db:5432", "-R 0:localhost:80", "-D 1080"]);
        assert!(c.no_command && c.command.is_empty());
        assert_eq!(c.options, ["GatewayPorts=yes"]);
        assert!(p("-fN -L 1:a:2 h").unwrap().background);
        let c = p("-b 127.0.0.2 -B lo h").unwrap();
        assert_eq!(c.options, ["BindAddress=127.0.0.2", "BindInterface=lo"]);
        // Options after the destination count too.
        let c = p("h -L 1:a:2 echo hi").unwrap();
        assert_eq!(c.forwards.len(), 1);
        assert_eq!(c.command, ["echo", "hi"]);
        assert_eq!(p("-N h true"), Err(SshArgsError::NoCommandWithCommand));
        let c = p("-R /tmp/s:db:1 -R 1080 h").unwrap();
        let shown: Vec<String> = c.forwards.iter().map(ForwardSpec::to_string).collect();
        assert_eq!(shown, ["-R /tmp/s:db:1", "-R 1080"]);
        for bad in [
            "-L 8080 h",
            "-R /tmp/s h",
            "-R 1:/x:2 h",
            "-D x h",
            "-D /tmp/s h",
        ] {
            assert!(
                matches!(p(bad), Err(SshArgsError::BadForwardSpec(_))),
                "{bad}: {:?}",
                p(bad)
            );
        }
    }

    #[test]
    fn control_commands_are_parsed_with_the_destination_as_usual() {
        let c = p("-O check -p 2222 -l bob h").unwrap();
        assert_eq!(c.control, Some(ControlCommand::Check));
        assert_eq!(
            (c.destination.as_str(), c.port, c.login.as_deref()),
            ("h", Some(2222), Some("bob"))
        );
        assert_eq!(p("-Ostop u@h").unwrap().control, Some(ControlCommand::Stop));
        assert_eq!(p("h -O exit").unwrap().control, Some(ControlCommand::Exit));
        assert_eq!(
            p("-O nope h"),
            Err(SshArgsError::BadControlCommand("nope".into()))
        );
        assert_eq!(p("h").unwrap().control, None);
    }

    #[test]
    fn unsupported_features_are_errors_and_harmless_ones_pass() {
        for (line, flag) in [
            ("-M h", 'M'),
            ("-S /tmp/ctl h", 'S'),
            ("-O forward h", 'O'),
            ("-O proxy h", 'O'),
            ("-1 h", '1'),
        ] {
            match p(line) {
                Err(SshArgsError::Unsupported { flag: f, .. }) => assert_eq!(f, flag, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        let c = p("-2 -x -k -S none -e none -E /tmp/log h true").unwrap();
        assert!(c.warnings.is_empty());
        assert_eq!(c.options, ["EscapeChar=none"]);
        assert_eq!(
            p("-E /tmp/log h").unwrap().log_file.as_deref(),
            Some(std::path::Path::new("/tmp/log"))
        );
        // -C asks for compression, as `Compression yes` does.
        assert_eq!(p("-C h").unwrap().options, ["Compression=yes"]);
        let c = p("-A -X h true").unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert_eq!(c.options, ["ForwardAgent=yes"]);
        assert_eq!(p("-a h").unwrap().options, ["ForwardAgent=no"]);
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert_eq!(p("-Z h"), Err(SshArgsError::Unknown('Z')));
        assert_eq!(p("h -p"), Err(SshArgsError::MissingValue('p')));
        assert_eq!(p("-p 0 h"), Err(SshArgsError::BadPort("0".into())));
        assert_eq!(p("-p 70000 h"), Err(SshArgsError::BadPort("70000".into())));
        assert_eq!(p("-v"), Err(SshArgsError::NoDestination));
        assert_eq!(p(""), Err(SshArgsError::NoDestination));
        assert_eq!(p("-W host h"), Err(SshArgsError::BadForward("host".into())));
        assert_eq!(p("-W h:22 j true"), Err(SshArgsError::ForwardWithCommand));
        assert!(matches!(p("ssh://"), Err(SshArgsError::BadDestination(_))));
        assert!(matches!(
            p("ssh://h:x"),
            Err(SshArgsError::BadDestination(_))
        ));
        assert!(matches!(
            p("ssh://h/path"),
            Err(SshArgsError::BadDestination(_))
        ));
    }

    #[test]
    fn forward_stdio_targets() {
        assert_eq!(
            p("-W db:5432 bastion").unwrap().forward_stdio,
            Some(("db".into(), 5432))
        );
        assert_eq!(
            p("-W [::1]:22 bastion").unwrap().forward_stdio,
            Some(("::1".into(), 22))
        );
    }

    #[test]
    fn ssh_urls_fill_user_and_port_unless_given() {
        let c = p("ssh://bob@host:2222 true").unwrap();
        assert_eq!(
            (c.login.as_deref(), c.destination.as_str(), c.port),
            (Some("bob"), "host", Some(2222))
        );
        let c = p("-p 22 -l al ssh://bob@host:2222").unwrap();
        assert_eq!((c.login.as_deref(), c.port), (Some("al"), Some(22)));
        let c = p("ssh://[::1]:2200/").unwrap();
        assert_eq!((c.destination.as_str(), c.port), ("::1", Some(2200)));
        // A plain destination keeps its user@ for the caller to split.
        assert_eq!(p("bob@host").unwrap().destination, "bob@host");
    }

    #[test]
    fn version_and_queries_need_no_destination() {
        assert!(p("-V").unwrap().version);
        assert_eq!(p("-Q cipher").unwrap().query.as_deref(), Some("cipher"));
        assert_eq!(
            p("-QHostKeyAlgorithms").unwrap().query.as_deref(),
            Some("HostKeyAlgorithms")
        );
        assert_eq!(p("h -Q mac").unwrap().query.as_deref(), Some("mac"));
        assert_eq!(p("-Q kex -Z -w x").unwrap().query.as_deref(), Some("kex"));
        assert_eq!(p("-Q").unwrap_err(), SshArgsError::MissingValue('Q'));
    }
}
