//! ssh's port-forwarding specifications, parsed without I/O: `-L`
//! (`[bind:]port:host:hostport`), `-R` (the same, the listening done by the
//! server; without a destination, `[bind:]port`, a SOCKS proxy whose
//! connections skiff makes) and `-D` (`[bind:]port`, a SOCKS proxy). IPv6
//! addresses go in brackets (`[::1]:8080:[fe80::1]:80`). `-L` and `-R` also
//! take Unix sockets at either end (a field that starts with `/`); with
//! `-D` they are refused with a clear error. `StreamLocalBindMask` values
//! are parsed here too.

use std::fmt;

/// Where a forwarding listens: `bind` as written (`None`: the default,
/// loopback; `Some("")` or `Some("*")`: every address), and the port (0:
/// any free port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub bind: Option<String>,
    pub port: u16,
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bind.as_deref() {
            None => write!(f, "{}", self.port),
            Some(b) if b.contains(':') => write!(f, "[{b}]:{}", self.port),
            Some(b) => write!(f, "{b}:{}", self.port),
        }
    }
}

/// One forwarding asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardSpec {
    /// `-L`: listen here, connect from the server to `host:port`.
    Local {
        listen: Listen,
        host: String,
        port: u16,
    },
    /// `-R`: the server listens, we connect to `host:port`.
    Remote {
        listen: Listen,
        host: String,
        port: u16,
    },
    /// `-D`: listen here as a SOCKS 4/5 proxy whose connections the server
    /// makes.
    Dynamic { listen: Listen },
    /// `-L` with a Unix socket at either end (`port:/remote/path`,
    /// `/local/path:host:hostport`, `/local/path:/remote/path`): skiff
    /// listens at `from`, the server connects to `to`.
    LocalUnix { from: ListenEnd, to: ConnectEnd },
    /// `-R` with a Unix socket at either end (`port:/local/path`,
    /// `/remote/path:host:hostport`, `/remote/path:/local/path`): the
    /// server listens at `from`, skiff connects to `to`.
    RemoteUnix { from: ListenEnd, to: ConnectEnd },
    /// `-R [bind:]port` with no destination: the server listens, and each
    /// connection is a SOCKS 4/5 client whose destination skiff connects to.
    RemoteDynamic { listen: Listen },
}

/// Where a forwarding listens: a TCP port or a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenEnd {
    Tcp(Listen),
    /// A Unix socket, made for the forwarding and removed at its end.
    Unix(String),
}

/// Where a forwarding's connections go: a TCP host and port or a Unix
/// socket (on the server for `-L`, here for `-R`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectEnd {
    Tcp(String, u16),
    Unix(String),
}

impl fmt::Display for ListenEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenEnd::Tcp(listen) => write!(f, "{listen}"),
            ListenEnd::Unix(path) => write!(f, "{path}"),
        }
    }
}

impl fmt::Display for ConnectEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectEnd::Tcp(host, port) if host.contains(':') => write!(f, "[{host}]:{port}"),
            ConnectEnd::Tcp(host, port) => write!(f, "{host}:{port}"),
            ConnectEnd::Unix(path) => write!(f, "{path}"),
        }
    }
}

impl fmt::Display for ForwardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = |h: &str| {
            if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_string()
            }
        };
        match self {
            ForwardSpec::Local {
                listen,
                host: h,
                port,
            } => {
                write!(f, "-L {listen}:{}:{port}", host(h))
            }
            ForwardSpec::Remote {
                listen,
                host: h,
                port,
            } => {
                write!(f, "-R {listen}:{}:{port}", host(h))
            }
            ForwardSpec::Dynamic { listen } => write!(f, "-D {listen}"),
            ForwardSpec::LocalUnix { from, to } => write!(f, "-L {from}:{to}"),
            ForwardSpec::RemoteUnix { from, to } => write!(f, "-R {from}:{to}"),
            ForwardSpec::RemoteDynamic { listen } => write!(f, "-R {listen}"),
        }
    }
}

/// Why a specification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SpecError {
    pub message: String,
    /// A valid form that skiff does not do (a Unix socket for `-D`), as
    /// opposed to a malformed one.
    pub unsupported: bool,
}

/// Splits at `:` outside brackets; brackets are removed from a field.
fn fields(spec: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut in_brackets = false;
    let mut bracketed = false;
    for c in spec.chars() {
        match c {
            '[' if !in_brackets && field.is_empty() && !bracketed => {
                in_brackets = true;
                bracketed = true;
            }
            ']' if in_brackets => in_brackets = false,
            ':' if !in_brackets => {
                out.push(std::mem::take(&mut field));
                bracketed = false;
            }
            '[' | ']' => return Err(format!("misplaced {c:?}")),
            _ if bracketed && !in_brackets => {
                return Err("an address in brackets must be a whole field".into())
            }
            _ => field.push(c),
        }
    }
    if in_brackets {
        return Err("unclosed '['".into());
    }
    out.push(field);
    Ok(out)
}

fn port(field: &str, what: &str, zero_ok: bool) -> Result<u16, String> {
    match field.parse::<u16>() {
        Ok(0) if !zero_ok => Err(format!("{what} 0 is not a port")),
        Ok(p) if field.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("bad {what} {field:?}")),
    }
}

fn listen(fields: &[String]) -> Result<Listen, String> {
    let (bind, p) = match fields {
        [p] => (None, p),
        [b, p] => (Some(b.clone()), p),
        _ => unreachable!("one or two fields"),
    };
    Ok(Listen {
        bind,
        port: port(p, "listen port", true)?,
    })
}

fn target(host: &str, p: &str) -> Result<(String, u16), String> {
    if host.is_empty() {
        return Err("no destination host".into());
    }
    Ok((host.to_string(), port(p, "destination port", false)?))
}

/// True when a field (bracketed or not: `-R 4301:[/path]`, `-L [/a]:[/b]`,
/// as ssh takes them) is a socket path.
fn socket_form(spec: &str) -> bool {
    match fields(spec) {
        Ok(f) => f.iter().any(|f| f.starts_with('/')),
        Err(_) => spec.split(':').any(|f| f.starts_with('/')),
    }
}

/// Parses the value of `-L` or `-R` (`remote` true).
pub fn parse_forward(spec: &str, remote: bool) -> Result<ForwardSpec, SpecError> {
    let flag = if remote { 'R' } else { 'L' };
    let bad = |why: String| SpecError {
        message: format!("bad -{flag} {spec:?}: {why}"),
        unsupported: false,
    };
    if socket_form(spec) {
        let (from, to) = parse_unix_form(spec).map_err(bad)?;
        return Ok(if remote {
            ForwardSpec::RemoteUnix { from, to }
        } else {
            ForwardSpec::LocalUnix { from, to }
        });
    }
    let f = fields(spec).map_err(bad)?;
    let (listen_fields, host, p) = match f.as_slice() {
        [_] | [_, _] if remote => {
            return Ok(ForwardSpec::RemoteDynamic {
                listen: listen(&f).map_err(bad)?,
            })
        }
        [lp, h, p] => (std::slice::from_ref(lp), h, p),
        [_, _, h, p] => (&f[..2], h, p),
        _ => {
            return Err(bad(format!(
                "expected [bind_address:]port:host:hostport, got {} fields",
                f.len()
            )))
        }
    };
    let listen = listen(listen_fields).map_err(bad)?;
    let (host, port) = target(host, p).map_err(bad)?;
    Ok(if remote {
        ForwardSpec::Remote { listen, host, port }
    } else {
        ForwardSpec::Local { listen, host, port }
    })
}

/// `-L` and `-R` forms with a socket path (a field starting with `/`):
/// where the forwarding listens, and where its connections go.
fn parse_unix_form(spec: &str) -> Result<(ListenEnd, ConnectEnd), String> {
    let f = fields(spec)?;
    let is_path = |field: &String| field.starts_with('/');
    let (from, to_fields) = match f.as_slice() {
        [listen_path, rest @ ..] if is_path(listen_path) => {
            (ListenEnd::Unix(listen_path.clone()), rest)
        }
        [lp, path] if is_path(path) => (ListenEnd::Tcp(listen(std::slice::from_ref(lp))?), &f[1..]),
        [_, _, path] if is_path(path) => (ListenEnd::Tcp(listen(&f[..2])?), &f[2..]),
        _ => return Err("expected [bind:]port:/path, /path:host:hostport or /path:/path".into()),
    };
    let to = match to_fields {
        [path] if is_path(path) => ConnectEnd::Unix(path.clone()),
        [h, p] => {
            let (host, port) = target(h, p)?;
            ConnectEnd::Tcp(host, port)
        }
        _ => return Err("expected host:hostport or a /path after the listening end".into()),
    };
    Ok((from, to))
}

/// Parses `StreamLocalBindMask` (ssh and sshd): an octal mask of up to four digits.
pub fn parse_bind_mask(value: &str) -> Result<u32, String> {
    u32::from_str_radix(value, 8)
        .ok()
        .filter(|m| *m <= 0o7777 && !value.is_empty() && value.len() <= 5)
        .ok_or_else(|| {
            format!("StreamLocalBindMask: expected an octal mask such as 0177, got {value:?}")
        })
}

/// Parses the value of `-D`.
pub fn parse_dynamic(spec: &str) -> Result<ForwardSpec, SpecError> {
    let bad = |why: String| SpecError {
        message: format!("bad -D {spec:?}: {why}"),
        unsupported: false,
    };
    if socket_form(spec) {
        return Err(SpecError {
            message: format!("-D {spec:?}: Unix-socket forwarding is not supported"),
            unsupported: true,
        });
    }
    let f = fields(spec).map_err(bad)?;
    if f.len() > 2 {
        return Err(bad("expected [bind_address:]port".into()));
    }
    Ok(ForwardSpec::Dynamic {
        listen: listen(&f).map_err(bad)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(bind: Option<&str>, port: u16) -> Listen {
        Listen {
            bind: bind.map(str::to_string),
            port,
        }
    }

    #[test]
    fn local_and_remote_forms() {
        assert_eq!(
            parse_forward("8080:db:5432", false),
            Ok(ForwardSpec::Local {
                listen: listen(None, 8080),
                host: "db".into(),
                port: 5432
            })
        );
        assert_eq!(
            parse_forward("*:8080:db:5432", true),
            Ok(ForwardSpec::Remote {
                listen: listen(Some("*"), 8080),
                host: "db".into(),
                port: 5432
            })
        );
        assert_eq!(
            parse_forward(":0:db:1", false),
            Ok(ForwardSpec::Local {
                listen: listen(Some(""), 0),
                host: "db".into(),
                port: 1
            })
        );
        assert_eq!(
            parse_forward("[::1]:8080:[fe80::1]:80", false),
            Ok(ForwardSpec::Local {
                listen: listen(Some("::1"), 8080),
                host: "fe80::1".into(),
                port: 80
            })
        );
        assert_eq!(
            parse_forward("[::1]:8080:[fe80::1]:80", false)
                .unwrap()
                .to_string(),
            "-L [::1]:8080:[fe80::1]:80"
        );
    }

    #[test]
    fn bad_forms_say_what_is_wrong() {
        for (spec, remote, needle) in [
            ("8080:db", false, "fields"),
            ("x", true, "listen port"),
            ("a:b:c:d:e", false, "fields"),
            ("8080:db:0", false, "not a port"),
            ("8080:db:x", false, "destination port"),
            ("99999:db:1", false, "listen port"),
            ("8080::1", false, "no destination host"),
            ("/tmp/s", false, "expected"),
            ("/tmp/s:db", false, "after the listening end"),
            ("/tmp/s:db", true, "after the listening end"),
            ("[::1:8080:db:1", false, "unclosed"),
            ("[::1]x:8080:db:1", false, "brackets"),
            ("+8080:db:1", false, "listen port"),
        ] {
            let e = parse_forward(spec, remote).unwrap_err();
            assert!(e.message.contains(needle), "{spec}: {e}");
            assert!(e.message.contains(spec), "{spec}: {e}");
            assert!(!e.unsupported, "{spec}");
        }
    }

    #[test]
    fn unix_socket_forms() {
        let p = |s: &str| parse_forward(s, false).unwrap();
        assert_eq!(
            p("2375:/var/run/docker.sock"),
            ForwardSpec::LocalUnix {
                from: ListenEnd::Tcp(listen(None, 2375)),
                to: ConnectEnd::Unix("/var/run/docker.sock".into())
            }
        );
        assert_eq!(p("*:2375:/run/x.sock").to_string(), "-L *:2375:/run/x.sock");
        assert_eq!(
            p("/tmp/db.sock:db:5432"),
            ForwardSpec::LocalUnix {
                from: ListenEnd::Unix("/tmp/db.sock".into()),
                to: ConnectEnd::Tcp("db".into(), 5432)
            }
        );
        assert_eq!(
            p("/tmp/a.sock:/run/b.sock").to_string(),
            "-L /tmp/a.sock:/run/b.sock"
        );
        let r = |s: &str| parse_forward(s, true).unwrap();
        assert_eq!(
            r("/run/user/app.sock:127.0.0.1:8080"),
            ForwardSpec::RemoteUnix {
                from: ListenEnd::Unix("/run/user/app.sock".into()),
                to: ConnectEnd::Tcp("127.0.0.1".into(), 8080)
            }
        );
        assert_eq!(
            r("localhost:2375:/var/run/docker.sock"),
            ForwardSpec::RemoteUnix {
                from: ListenEnd::Tcp(listen(Some("localhost"), 2375)),
                to: ConnectEnd::Unix("/var/run/docker.sock".into())
            }
        );
        assert_eq!(r("/a.sock:/b.sock").to_string(), "-R /a.sock:/b.sock");
        // Paths in brackets, as ssh takes them (a colon inside is kept).
        assert_eq!(
            r("4301:[/tmp/x.sock]"),
            ForwardSpec::RemoteUnix {
                from: ListenEnd::Tcp(listen(None, 4301)),
                to: ConnectEnd::Unix("/tmp/x.sock".into())
            }
        );
        assert_eq!(
            p("[/tmp/a:1.sock]:[/run/b.sock]"),
            ForwardSpec::LocalUnix {
                from: ListenEnd::Unix("/tmp/a:1.sock".into()),
                to: ConnectEnd::Unix("/run/b.sock".into())
            }
        );
    }

    #[test]
    fn remote_without_a_destination_is_a_socks_proxy() {
        assert_eq!(
            parse_forward("1080", true),
            Ok(ForwardSpec::RemoteDynamic {
                listen: listen(None, 1080)
            })
        );
        assert_eq!(
            parse_forward("[::1]:0", true).unwrap().to_string(),
            "-R [::1]:0"
        );
        // -L always needs a destination.
        assert!(parse_forward("1080", false).is_err());
    }

    #[test]
    fn bind_masks() {
        assert_eq!(parse_bind_mask("0177"), Ok(0o177));
        assert_eq!(parse_bind_mask("077"), Ok(0o77));
        assert_eq!(parse_bind_mask("0"), Ok(0));
        for bad in ["", "0888", "rw", "77777", "-1"] {
            assert!(parse_bind_mask(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dynamic_forms() {
        assert_eq!(
            parse_dynamic("1080"),
            Ok(ForwardSpec::Dynamic {
                listen: listen(None, 1080)
            })
        );
        assert_eq!(
            parse_dynamic("[::]:1080"),
            Ok(ForwardSpec::Dynamic {
                listen: listen(Some("::"), 1080)
            })
        );
        assert!(parse_dynamic("a:b:1080").is_err());
        assert!(parse_dynamic("x").is_err());
    }
}
