//! Agent or direct: the one place a command learns whether it goes through
//! the per-user agent's warm connections or connects on its own, and what
//! an agent's answer means for it. Every command that can use the agent
//! (`exec`, `run`, `cp`, `ssh`'s commands and `-W`) asks here; none reads
//! `SKIFF_AGENT` or an agent's reply by itself.
//!
//! The agent is skipped with `--no-agent` or `SKIFF_AGENT=off`, and a
//! request goes direct when no agent can be reached or started, when the
//! agent is too old for it, or when a person must decide something (a host
//! key to accept, a passphrase): [`Answer::Direct`]. Anything else the
//! agent says is the command's outcome ([`Answer::Agent`]).

use std::os::unix::net::UnixStream;

use skiff_agent::client::{Outcome, RunError};
use skiff_engine::{Destination, ErrorKind, ExitOutcome, SkiffError};
use skiff_proto::agent_wire::{ExecWire, HostEnd, Reply};
use skiff_proto::terminal_text::one_line;

/// Whether to try the agent at all: not with `--no-agent`, nor with
/// `SKIFF_AGENT` set to `off`, `no` or `0`.
pub(crate) fn agent_allowed(no_agent: bool) -> bool {
    let off = std::env::var("SKIFF_AGENT").is_ok_and(|v| matches!(v.as_str(), "off" | "no" | "0"));
    !no_agent && !off
}

/// What an agent request came to.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The agent answered for the command (an exit, a failure, ...).
    Agent(Reply),
    /// Do it on a connection of its own.
    Direct,
}

/// Reads an agent request's outcome: unavailable agents and requests a
/// person must decide go direct (logged at debug level).
pub(crate) fn answer(outcome: Outcome) -> Answer {
    match outcome {
        Outcome::Reply(Reply::NeedsUser { message }) => {
            tracing::debug!(
                "agent defers to a direct connection: {}",
                one_line(&message)
            );
            Answer::Direct
        }
        Outcome::Unavailable(why) => {
            tracing::debug!("not using the agent: {why}");
            Answer::Direct
        }
        Outcome::Reply(reply) => Answer::Agent(reply),
    }
}

/// A connection to the agent (started if need be) for a request whose
/// replies stream back (`skiff run`'s), or `None` (logged) to go direct.
pub(crate) fn agent_connection() -> Option<UnixStream> {
    skiff_agent::client::connect_or_spawn(true)
        .map_err(|why| tracing::debug!("not using the agent: {why}"))
        .ok()
}

/// How one host of a run through the agent ended: its result, or `None`
/// to run it directly, when the agent could not log in without a person
/// (a key's passphrase, which a direct fan-out asks for once). A host key
/// to confirm is a failure: a fan-out asks no host-key questions.
pub(crate) fn run_host_end(end: HostEnd) -> Option<Result<ExitOutcome, SkiffError>> {
    Some(match end {
        HostEnd::Status(code) => Ok(ExitOutcome::Status(code)),
        HostEnd::Signal(name) => Ok(ExitOutcome::Signal {
            name,
            core_dumped: false,
            message: String::new(),
        }),
        HostEnd::Unknown => Ok(ExitOutcome::Unknown),
        HostEnd::NeedsUser { kind, .. } if skiff_agent::kind_from_wire(kind) == ErrorKind::Auth => {
            return None
        }
        HostEnd::Failed { kind, message } | HostEnd::NeedsUser { kind, message } => {
            Err(failure(kind, message))
        }
    })
}

/// What a run through the agent that left hosts unreported came to, for
/// those hosts: the agent's failure, or that it went away.
pub(crate) fn run_failure(end: Result<Reply, RunError>) -> SkiffError {
    match end {
        Ok(Reply::Failed { kind, message }) => failure(kind, message),
        Ok(_) => SkiffError::new(ErrorKind::Protocol, "the agent did not report this host"),
        Err(RunError::Unavailable(m) | RunError::Lost(m)) => {
            SkiffError::new(ErrorKind::Protocol, m)
        }
    }
}

/// The failure an agent's `Failed` reply carries, typed.
pub(crate) fn failure(kind: u8, message: String) -> SkiffError {
    SkiffError::new(skiff_agent::kind_from_wire(kind), message)
}

/// Whether an agent's `Failed` reply says the server refused the request
/// (a subsystem it does not offer, say).
pub(crate) fn refused(kind: u8) -> bool {
    skiff_agent::kind_from_wire(kind) == ErrorKind::Refused
}

/// Whether an agent's `Failed` reply says the server closed the channel
/// without answering the request and nothing came from it: nothing
/// started, so the request may be made again.
pub(crate) fn closed_before_start(kind: u8) -> bool {
    skiff_agent::kind_from_wire(kind) == ErrorKind::ClosedBeforeStart
}

/// The exit status of a command the agent answered for (its failure
/// printed), or `None` when it should connect directly instead.
pub(crate) fn exit_status(outcome: Outcome) -> Option<i32> {
    match answer(outcome) {
        Answer::Direct => None,
        Answer::Agent(Reply::Exit { code }) => Some(code),
        // The agent's words are often a server's.
        Answer::Agent(Reply::Failed { message, .. }) => {
            eprintln!("skiff: {}", one_line(&message));
            Some(255)
        }
        Answer::Agent(other) => {
            eprintln!("skiff: unexpected reply from the agent: {other:?}");
            Some(255)
        }
    }
}

/// The destination part of an agent request: what the agent resolves the
/// settings from, as this process would (paths made absolute, since the
/// agent runs elsewhere).
pub(crate) fn agent_destination(dest: &Destination) -> ExecWire {
    ExecWire {
        host: dest.host.clone(),
        user: dest.user.clone(),
        port: dest.port,
        identity_files: dest.identity_files.iter().map(|p| absolute(p)).collect(),
        config_file: dest.config_file.as_deref().map(absolute),
        options: dest.options.clone(),
        client_env: skiff_engine::settings::ClientEnv::from_process().vars,
        ..ExecWire::default()
    }
}

/// A path as another process (another working directory) must see it;
/// `none` stays `none`.
fn absolute(p: &std::path::Path) -> String {
    if p.as_os_str() == "none" {
        return "none".into();
    }
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn people_and_missing_agents_go_direct() {
        let needs = Outcome::Reply(Reply::NeedsUser {
            message: "host key".into(),
        });
        assert!(matches!(answer(needs), Answer::Direct));
        assert!(matches!(
            answer(Outcome::Unavailable("no agent".into())),
            Answer::Direct
        ));
        assert!(matches!(
            answer(Outcome::Reply(Reply::Exit { code: 3 })),
            Answer::Agent(Reply::Exit { code: 3 })
        ));
    }

    #[test]
    fn exit_statuses_from_the_agent() {
        assert_eq!(
            exit_status(Outcome::Reply(Reply::Exit { code: 7 })),
            Some(7)
        );
        let failed = Outcome::Reply(Reply::Failed {
            kind: 2,
            message: "down".into(),
        });
        assert_eq!(exit_status(failed), Some(255));
        assert_eq!(exit_status(Outcome::Unavailable("off".into())), None);
    }

    #[test]
    fn run_hosts_needing_a_passphrase_go_direct() {
        assert!(matches!(
            run_host_end(HostEnd::Status(3)),
            Some(Ok(ExitOutcome::Status(3)))
        ));
        let passphrase = HostEnd::NeedsUser {
            kind: 4,
            message: "passphrase".into(),
        };
        assert!(run_host_end(passphrase).is_none());
        // A fan-out asks no host-key questions: that host failed.
        let host_key = HostEnd::NeedsUser {
            kind: 3,
            message: "unknown host key".into(),
        };
        let e = run_host_end(host_key).unwrap().unwrap_err();
        assert_eq!(e.kind, ErrorKind::HostKey);
        assert_eq!(e.message, "unknown host key");
    }

    #[test]
    fn unreported_run_hosts_fail_with_the_agents_reason() {
        let failed = Ok(Reply::Failed {
            kind: 1,
            message: "bad set".into(),
        });
        assert_eq!(run_failure(failed).kind, ErrorKind::Config);
        let lost = run_failure(Err(RunError::Lost("agent gone".into())));
        assert_eq!(
            (lost.kind, lost.message.as_str()),
            (ErrorKind::Protocol, "agent gone")
        );
        let silent = run_failure(Ok(Reply::Done));
        assert_eq!(silent.message, "the agent did not report this host");
    }

    #[test]
    fn refusals_are_known_by_kind() {
        assert!(refused(9));
        assert!(!refused(5));
        let e = failure(9, "the server refused the sftp subsystem".into());
        assert_eq!(e.kind, ErrorKind::Refused);
    }

    #[test]
    fn agent_requests_carry_absolute_paths() {
        let dest = Destination {
            host: "h".into(),
            identity_files: vec!["key".into(), "none".into()],
            config_file: Some("cfg".into()),
            ..Default::default()
        };
        let wire = agent_destination(&dest);
        assert!(wire.identity_files[0].starts_with('/'), "{wire:?}");
        assert!(wire.identity_files[0].ends_with("/key"), "{wire:?}");
        assert_eq!(wire.identity_files[1], "none");
        assert!(wire.config_file.as_deref().unwrap().starts_with('/'));
    }
}
