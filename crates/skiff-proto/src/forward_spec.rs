//! ssh's port-forwarding specifications, parsed without I/O: `-L`
//! (`[bind:]port:host:hostport`), `-R` (the same, the listening done by the
//! server) and `-D` (`[bind:]port`, a SOCKS proxy). IPv6 addresses go in
//! brackets (`[::1]:8080:[fe80::1]:80`). Unix-socket forms are recognised
//! and refused with a clear error, as is `-R` without a destination (a
//! remote SOCKS proxy).

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
        return Err(unsupported("Unix-socket forwarding"));
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
            ("/tmp/s:db:1", false, "Unix-socket"),
            ("8080:/run/docker.sock", false, "Unix-socket"),
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
