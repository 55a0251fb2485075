//! ssh's port-forwarding specifications, parsed without I/O: `-L`
//! (`[bind:]port:host:hostport`), `-R` (the same, the listening done by the
//! server) and `-D` (`[bind:]port`, a SOCKS proxy). IPv6 addresses go in
//! brackets (`[::1]:8080:[fe80::1]:80`). `-L` also takes Unix sockets at
//! either end (a field that starts with `/`); with `-R` and `-D` they are
//! refused with a clear error, as is `-R` without a destination (a remote
//! SOCKS proxy).

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
    /// `/local/path:host:hostport`, `/local/path:/remote/path`).
    LocalUnix { from: LocalEnd, to: RemoteEnd },
}

/// Where a local forwarding listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalEnd {
    Tcp(Listen),
    /// A Unix socket skiff makes (0600) and removes at the end.
    Unix(String),
}

/// Where the server connects a local forwarding's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteEnd {
    Tcp(String, u16),
    /// A Unix socket on the server (`direct-streamlocal@openssh.com`).
    Unix(String),
}

impl fmt::Display for LocalEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalEnd::Tcp(listen) => write!(f, "{listen}"),
            LocalEnd::Unix(path) => write!(f, "{path}"),
        }
    }
}

impl fmt::Display for RemoteEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteEnd::Tcp(host, port) if host.contains(':') => write!(f, "[{host}]:{port}"),
            RemoteEnd::Tcp(host, port) => write!(f, "{host}:{port}"),
            RemoteEnd::Unix(path) => write!(f, "{path}"),
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
        }
    }
}

/// Why a specification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SpecError {
    pub message: String,
    /// A valid form that skiff does not do (Unix sockets, a remote SOCKS
    /// proxy), as opposed to a malformed one.
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

fn socket_form(spec: &str) -> bool {
    spec.split(':').any(|f| f.starts_with('/'))
}

/// Parses the value of `-L` or `-R` (`remote` true).
pub fn parse_forward(spec: &str, remote: bool) -> Result<ForwardSpec, SpecError> {
    let flag = if remote { 'R' } else { 'L' };
    let bad = |why: String| SpecError {
        message: format!("bad -{flag} {spec:?}: {why}"),
        unsupported: false,
    };
    let unsupported = |why: &str| SpecError {
        message: format!("-{flag} {spec:?}: {why} is not supported"),
        unsupported: true,
    };
    if socket_form(spec) {
        if remote {
            return Err(unsupported("Unix-socket forwarding with -R"));
        }
        return parse_local_unix(spec).map_err(bad);
    }
    let f = fields(spec).map_err(bad)?;
    let (listen_fields, host, p) = match f.as_slice() {
        [_] | [_, _] if remote => {
            return Err(unsupported(
                "a remote SOCKS proxy (-R without a destination)",
            ))
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

/// `-L` forms with a socket path (a field starting with `/`).
fn parse_local_unix(spec: &str) -> Result<ForwardSpec, String> {
    let f = fields(spec)?;
    let is_path = |field: &String| field.starts_with('/');
    let (from, to_fields) = match f.as_slice() {
        [local, rest @ ..] if is_path(local) => (LocalEnd::Unix(local.clone()), rest),
        [lp, path] if is_path(path) => (LocalEnd::Tcp(listen(std::slice::from_ref(lp))?), &f[1..]),
        [_, _, path] if is_path(path) => (LocalEnd::Tcp(listen(&f[..2])?), &f[2..]),
        _ => return Err("expected [bind:]port:/remote/path, /local/path:host:hostport or /local/path:/remote/path".into()),
    };
    let to = match to_fields {
        [path] if is_path(path) => RemoteEnd::Unix(path.clone()),
        [h, p] => {
            let (host, port) = target(h, p)?;
            RemoteEnd::Tcp(host, port)
        }
        _ => return Err("expected host:hostport or /remote/path after the local end".into()),
    };
    Ok(ForwardSpec::LocalUnix { from, to })
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
            ("8080", true, "SOCKS"),
            ("localhost:8080", true, "SOCKS"),
            ("a:b:c:d:e", false, "fields"),
            ("8080:db:0", false, "not a port"),
            ("8080:db:x", false, "destination port"),
            ("99999:db:1", false, "listen port"),
            ("8080::1", false, "no destination host"),
            ("/tmp/s:db:1", true, "Unix-socket"),
            ("8080:/run/docker.sock", true, "Unix-socket"),
            ("/tmp/s", false, "expected"),
            ("/tmp/s:db", false, "after the local end"),
            ("[::1:8080:db:1", false, "unclosed"),
            ("[::1]x:8080:db:1", false, "brackets"),
            ("+8080:db:1", false, "listen port"),
        ] {
            let e = parse_forward(spec, remote).unwrap_err();
            assert!(e.message.contains(needle), "{spec}: {e}");
            assert!(e.message.contains(spec), "{spec}: {e}");
            assert_eq!(
                e.unsupported,
                ["SOCKS", "Unix-socket"].contains(&needle),
                "{spec}"
            );
        }
    }

    #[test]
    fn unix_socket_forms() {
        let p = |s: &str| parse_forward(s, false).unwrap();
        assert_eq!(
            p("2375:/var/run/docker.sock"),
            ForwardSpec::LocalUnix {
                from: LocalEnd::Tcp(listen(None, 2375)),
                to: RemoteEnd::Unix("/var/run/docker.sock".into())
            }
        );
        assert_eq!(p("*:2375:/run/x.sock").to_string(), "-L *:2375:/run/x.sock");
        assert_eq!(
            p("/tmp/db.sock:db:5432"),
            ForwardSpec::LocalUnix {
                from: LocalEnd::Unix("/tmp/db.sock".into()),
                to: RemoteEnd::Tcp("db".into(), 5432)
            }
        );
        assert_eq!(
            p("/tmp/a.sock:/run/b.sock").to_string(),
            "-L /tmp/a.sock:/run/b.sock"
        );
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
