//! What `skiff cp`'s paths ask for: each argument read as scp reads it
//! (local, `[user@]host:path`, `[v6addr]:path`), then one [`Plan`] (the
//! copy job and where to connect) or a node-set plan for [`super::many_hosts`].
//! Nothing here connects or touches a file.

use std::path::PathBuf;

use skiff_engine::copy::{CopyJob, Direction};
use skiff_engine::Destination;

use super::CpArgs;

/// One side of a copy as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Local(PathBuf),
    Remote {
        user: Option<String>,
        host: String,
        path: String,
    },
}

/// Where the colon separating host and path is, with scp's rule: none when
/// the argument starts with `:` or has a `/` before any colon (so `./a:b`
/// is local); `[v6addr]:path` and `user@[v6addr]:path` are remote.
fn remote_colon(arg: &str) -> Option<usize> {
    let b = arg.as_bytes();
    if b.first() == Some(&b':') {
        return None;
    }
    let mut bracket = b.first() == Some(&b'[');
    for (i, &c) in b.iter().enumerate() {
        let next = b.get(i + 1).copied();
        if c == b'@' && next == Some(b'[') {
            bracket = true;
        }
        if c == b']' && next == Some(b':') && bracket {
            return Some(i + 1);
        }
        if c == b':' && !bracket {
            return Some(i);
        }
        if c == b'/' {
            return None;
        }
    }
    None
}

fn parse_endpoint(arg: &str) -> Result<Endpoint, String> {
    let Some(colon) = remote_colon(arg) else {
        return Ok(Endpoint::Local(PathBuf::from(arg)));
    };
    let (user_host, path) = (&arg[..colon], &arg[colon + 1..]);
    let (user, host) = match user_host.rsplit_once('@') {
        // `@group:path`: a node-set group, not an empty user.
        Some(("", group)) if !group.is_empty() => (None, user_host),
        Some((u, h)) => ((!u.is_empty()).then(|| u.to_string()), h),
        None => (None, user_host),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(format!("{arg}: no host before the `:`"));
    }
    Ok(Endpoint::Remote {
        user,
        host: host.to_string(),
        path: path.to_string(),
    })
}

/// What the command line asks for: the job and where to connect.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub job: CopyJob,
    pub destination: Destination,
}

/// One host, or a node set of them (uploads only).
#[derive(Debug)]
pub(super) enum Planned {
    One(Plan),
    Many(super::many_hosts::FanoutPlan),
}

/// Whether a target's host field is a node set rather than one host.
fn is_node_set(host: &str) -> bool {
    host.starts_with('@') || host.contains('[') || host.contains(',')
}

pub(super) fn plan(args: &CpArgs) -> Result<Planned, String> {
    let (target, sources) = args.paths.split_last().ok_or("no target given")?;
    if sources.is_empty() {
        return Err("usage: skiff cp [options] SRC... DST".into());
    }
    let target = parse_endpoint(target)?;
    let sources: Vec<Endpoint> = sources
        .iter()
        .map(|s| parse_endpoint(s))
        .collect::<Result<_, _>>()?;
    let any_remote_source = sources.iter().any(|s| matches!(s, Endpoint::Remote { .. }));
    let (direction, user, host) = match target {
        Endpoint::Remote { user, host, path } => {
            let many = is_node_set(&host);
            if any_remote_source {
                return Err(
                    "copying between two remote paths is not supported; one side must be local"
                        .into(),
                );
            }
            let local = sources
                .into_iter()
                .map(|s| match s {
                    Endpoint::Local(p) => p,
                    Endpoint::Remote { .. } => unreachable!("checked above"),
                })
                .collect();
            let direction = Direction::Upload {
                sources: local,
                target: path,
            };
            if many {
                return super::many_hosts::plan(args, direction, user, &host).map(Planned::Many);
            }
            (direction, user, host)
        }
        Endpoint::Local(target) => {
            if !any_remote_source {
                return Err("all paths are local; use cp(1) to copy local files".into());
            }
            let mut remote: Option<(Option<String>, String)> = None;
            let mut paths = Vec::new();
            for s in sources {
                match s {
                    Endpoint::Local(p) => {
                        return Err(format!(
                            "{}: a local source cannot be copied together with remote ones",
                            p.display()
                        ))
                    }
                    Endpoint::Remote { user, host, path } => {
                        match &remote {
                            Some((u, h)) if *u != user || *h != host => {
                                return Err(
                                    "all remote sources must be on the same host (and user)".into(),
                                )
                            }
                            Some(_) => {}
                            None => remote = Some((user, host)),
                        }
                        paths.push(path);
                    }
                }
            }
            let (user, host) = remote.expect("at least one remote source");
            let direction = Direction::Download {
                sources: paths,
                target,
            };
            if is_node_set(&host) {
                return super::many_hosts::plan(args, direction, user, &host).map(Planned::Many);
            }
            (direction, user, host)
        }
    };
    // A `user@` wins over -l.
    let base = args.conn.destination(args.port);
    Ok(Planned::One(Plan {
        job: job(args, direction),
        destination: Destination {
            host,
            user: user.or(base.user),
            ..base
        },
    }))
}

/// The copy job `args` ask for, in `direction`.
pub(crate) fn job(args: &CpArgs, direction: Direction) -> CopyJob {
    CopyJob {
        direction,
        recursive: args.recursive,
        preserve: args.preserve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli_connect::ConnectArgs;
    use crate::cp::CipherMode;
    use crate::groups::GroupsArgs;

    fn remote(user: Option<&str>, host: &str, path: &str) -> Endpoint {
        Endpoint::Remote {
            user: user.map(str::to_string),
            host: host.into(),
            path: path.into(),
        }
    }

    #[test]
    fn endpoints_follow_scp() {
        let p = |s: &str| parse_endpoint(s).unwrap();
        assert_eq!(p("host:path"), remote(None, "host", "path"));
        assert_eq!(p("bob@host:/abs"), remote(Some("bob"), "host", "/abs"));
        assert_eq!(p("host:"), remote(None, "host", ""));
        assert_eq!(p("a@b@host:x"), remote(Some("a@b"), "host", "x"));
        assert_eq!(p("[::1]:dir/f"), remote(None, "::1", "dir/f"));
        assert_eq!(p("bob@[fe80::1]:f"), remote(Some("bob"), "fe80::1", "f"));
        assert_eq!(p("host:a:b"), remote(None, "host", "a:b"));
        assert_eq!(p("./a:b"), Endpoint::Local("./a:b".into()));
        assert_eq!(p("/tmp/x:y"), Endpoint::Local("/tmp/x:y".into()));
        assert_eq!(p(":odd"), Endpoint::Local(":odd".into()));
        assert_eq!(p("plain"), Endpoint::Local("plain".into()));
        assert!(parse_endpoint("@:x").is_err());
    }

    fn args(paths: &[&str]) -> CpArgs {
        CpArgs {
            recursive: true,
            preserve: false,
            port: Some(2222),
            conn: ConnectArgs {
                login: Some("dflt".into()),
                identity: vec![],
                config: None,
                options: vec![],
                jump: None,
                verbose: 0,
                log_file: None,
                no_agent: false,
            },
            quiet: false,
            streams: None,
            cipher: CipherMode::Aead,
            parallel: 16,
            groups: GroupsArgs::default(),
            paths: paths.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn one(planned: Result<Planned, String>) -> Plan {
        match planned {
            Ok(Planned::One(p)) => p,
            other => panic!("one host: {other:?}"),
        }
    }

    #[test]
    fn plans_uploads_and_downloads() {
        let up = one(plan(&args(&["a", "b/", "bob@h:dst"])));
        assert_eq!(
            up.job.direction,
            Direction::Upload {
                sources: vec!["a".into(), "b/".into()],
                target: "dst".into()
            }
        );
        assert_eq!(up.destination.user.as_deref(), Some("bob"));
        assert_eq!(up.destination.port, Some(2222));
        assert!(up.job.recursive);

        let down = one(plan(&args(&["h:x", "h:y/z", "."])));
        assert_eq!(
            down.job.direction,
            Direction::Download {
                sources: vec!["x".into(), "y/z".into()],
                target: ".".into()
            }
        );
        // -l applies when the path names no user.
        assert_eq!(down.destination.user.as_deref(), Some("dflt"));
        assert_eq!(down.destination.host, "h");
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let e = plan(&args(&["a", "b"])).unwrap_err();
        assert!(e.contains("use cp"), "{e}");
        let e = plan(&args(&["h:a", "g:b"])).unwrap_err();
        assert!(e.contains("remote"), "{e}");
        let e = plan(&args(&["h:a", "g:b", "dst"])).unwrap_err();
        assert!(e.contains("same host"), "{e}");
        let e = plan(&args(&["h:a", "local", "dst"])).unwrap_err();
        assert!(e.contains("local source"), "{e}");
    }

    #[test]
    fn node_set_targets_fan_out() {
        assert_eq!(
            parse_endpoint("@web:/srv").unwrap(),
            remote(None, "@web", "/srv"),
            "a group, not an empty user"
        );
        match plan(&args(&["f", "ops@web[1-3],db:/srv/"])) {
            Ok(Planned::Many(many)) => {
                let hosts: Vec<String> = many.hosts.iter().map(|h| h.to_string()).collect();
                assert_eq!(hosts, ["db", "web1", "web2", "web3"]);
                assert_eq!(many.user.as_deref(), Some("ops"));
            }
            other => panic!("{other:?}"),
        }
        let e = plan(&args(&["f", "web[3-1:/srv"])).unwrap_err();
        assert!(e.contains("web[3-1"), "{e}");
        // From a node set: every source on the same set.
        assert!(matches!(
            plan(&args(&[
                "web[1-3]:/var/log/app.log",
                "web[1-3]:/etc/app.conf",
                "dst"
            ])),
            Ok(Planned::Many(_))
        ));
        let e = plan(&args(&["web[1-3]:a", "web[1-4]:b", "dst"])).unwrap_err();
        assert!(e.contains("same host"), "{e}");
    }
}
