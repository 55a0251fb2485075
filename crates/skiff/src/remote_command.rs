//! One command (or login shell, or subsystem) on one host, however the
//! command line spelled it (`skiff exec`, or ssh's syntax in `skiff ssh`):
//! the [`Invocation`], where it connects, the session settings ssh applies
//! (`SessionType`, `RemoteCommand`, `StdinNull`, `RequestTTY`), the agent
//! or a connection of its own, and the exit status to leave with.

use std::io::IsTerminal;

use skiff_engine::{Destination, ExecRequest, PtyRequest, SkiffError, WindowSize};
use skiff_proto::agent_wire::ExecWire;
use skiff_proto::terminal_text::one_line;

use crate::cli_connect::ConnectArgs;
pub use crate::ssh_args::TtyFlag;
use crate::{escape_input, terminal};

/// Splits `[user@]host` (the last `@` separates, as in ssh).
pub fn split_destination(dest: &str) -> (Option<String>, String) {
    match dest.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() => (Some(u.to_string()), h.to_string()),
        _ => (None, dest.to_string()),
    }
}

/// One command (or login shell, or subsystem) on one host, however the
/// command line spelled it: `skiff exec`, or ssh's syntax (`skiff ssh`).
#[derive(Debug, Clone)]
pub struct Invocation {
    pub conn: ConnectArgs,
    /// The port asked for (ssh's `-p`).
    pub port: Option<u16>,
    /// `[user@]host`.
    pub destination: String,
    /// The command line; empty asks for a login shell, as with ssh.
    pub command: String,
    /// `command` names a subsystem (`ssh -s`).
    pub subsystem: bool,
    pub no_stdin: bool,
    pub tty: TtyFlag,
}

/// Runs `args` and returns the exit status to leave with.
pub fn run_invocation(args: Invocation) -> i32 {
    crate::logging::init(args.conn.verbose, args.conn.log_file.as_deref());
    // Resolved once, for both paths: a bad config fails fast, and the
    // environment to send is the CLI's own (SendEnv/SetEnv).
    match skiff_engine::settings::resolve(&destination(&args)) {
        Ok(settings) => run_resolved(args, settings),
        Err(e) => {
            eprintln!("skiff: {e}");
            255
        }
    }
}

/// [`run_invocation`] with the settings already resolved (and logging set up).
pub fn run_resolved(mut args: Invocation, settings: skiff_engine::ConnectSettings) -> i32 {
    let dest = destination(&args);
    if let Err(e) = apply_session_settings(&mut args, &settings) {
        eprintln!("skiff: {e}");
        return 255;
    }
    let pty = pty_request(&args, &settings);
    // A LocalCommand runs once this session's connection is up, which
    // only a connection of its own can tell.
    if settings.local_command.is_none() {
        if let Some(code) = via_agent(&args, &dest, &settings, pty.clone()) {
            return code;
        }
    }
    on_one_thread(exec_main(args, settings, pty))
}

/// Runs `work` on a single-threaded runtime and returns the exit status it
/// gives; an error is printed and gives 255.
pub fn on_one_thread(work: impl std::future::Future<Output = Result<i32, SkiffError>>) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skiff: cannot start the async runtime: {e}");
            return 255;
        }
    };
    let result = runtime.block_on(work);
    // A read of a terminal stdin may still be blocked in tokio's blocking
    // pool; waiting for it would hang until the user pressed a key.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("skiff: {e}");
            255
        }
    }
}

/// The destination as the command line gives it.
pub fn destination(args: &Invocation) -> Destination {
    let (user, host) = split_destination(&args.destination);
    let base = args.conn.destination(args.port);
    Destination {
        host,
        user: base.user.or(user),
        ..base
    }
}

async fn exec_main(
    args: Invocation,
    settings: skiff_engine::ConnectSettings,
    pty: Option<PtyRequest>,
) -> Result<i32, SkiffError> {
    tracing::debug!(
        "connecting to {}@{} port {} (StrictHostKeyChecking={})",
        settings.user,
        settings.hostname,
        settings.port,
        skiff_engine::hostkeys::policy_name(settings.strict_host_key_checking)
    );
    let conn = skiff_engine::connect(&settings).await?;
    for notice in &conn.notices {
        eprintln!("{}", skiff_proto::terminal_text::lines(notice));
    }
    run_local_command(&settings).await;
    let status = exec_on(&conn, args, &settings, pty).await;
    conn.goodbye().await;
    status
}

/// `LocalCommand` (under `PermitLocalCommand yes`), once the session's
/// connection is up and before its command starts, as ssh runs it.
pub async fn run_local_command(settings: &skiff_engine::ConnectSettings) {
    if let Some(command) = &settings.local_command {
        skiff_engine::local_command::run_local_command(command).await;
    }
}

/// Runs the command (or login shell, or subsystem) of `args` on an open
/// connection, with the terminal and input handling of `skiff exec`.
pub async fn exec_on(
    conn: &skiff_engine::Connection,
    args: Invocation,
    settings: &skiff_engine::ConnectSettings,
    pty: Option<PtyRequest>,
) -> Result<i32, SkiffError> {
    let command = args.command.clone();
    let env = remote_env(settings);

    let stdin_tty = std::io::stdin().is_terminal();
    // Raw mode while a remote terminal is attached; restored on drop.
    let _raw = if pty.is_some() && stdin_tty {
        terminal::RawMode::enter()
    } else {
        None
    };
    let resize = if pty.is_some() {
        terminal::watch_resize()
    } else {
        None
    };
    let req = ExecRequest {
        command,
        env,
        pty,
        timeout: None,
        subsystem: args.subsystem,
    };
    // With escapes on, the session reads what is typed through the
    // escape thread, which sends `~.` and `~R` here.
    let (requests, mut requested) = tokio::sync::mpsc::unbounded_channel();
    let stdin: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = if args.no_stdin {
        None
    } else {
        let remote_terminal = req.pty.is_some() && stdin_tty;
        let typed = escape_input::filtered_stdin(
            settings.escape_char,
            remote_terminal,
            _raw.as_ref(),
            Some(requests),
        )
        .and_then(|fd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                .inspect_err(|e| eprintln!("skiff: warning: escape sequences are off: {e}"))
                .ok()
        });
        match typed {
            Some(typed) => Some(Box::new(typed)),
            None => Some(Box::new(tokio::io::stdin())),
        }
    };
    let session = skiff_engine::exec(
        conn,
        &req,
        stdin,
        tokio::io::stdout(),
        tokio::io::stderr(),
        resize.map(|rx: tokio::sync::mpsc::Receiver<WindowSize>| rx),
    );
    tokio::pin!(session);
    let outcome = loop {
        tokio::select! {
            outcome = &mut session => break outcome?,
            Some(request) = requested.recv() => match request {
                escape_input::Request::Disconnect => {
                    drop(_raw);
                    eprintln!("Connection to {} closed.", settings.original_host);
                    return Ok(255);
                }
                escape_input::Request::Rekey => {
                    if let Err(e) = conn.rekey().await {
                        eprint!("skiff: {e}\r\n");
                    }
                }
            },
        }
    };
    if let skiff_engine::ExitOutcome::Signal {
        name, core_dumped, ..
    } = &outcome
    {
        tracing::debug!(
            "remote command killed by signal {}{}",
            one_line(name),
            if *core_dumped { " (core dumped)" } else { "" }
        );
    }
    Ok(outcome.exit_code())
}

/// Runs the command through the agent (starting one if needed). `None`
/// means: do it directly (no agent, or a person has to decide something).
fn via_agent(
    args: &Invocation,
    dest: &Destination,
    settings: &skiff_engine::ConnectSettings,
    pty: Option<PtyRequest>,
) -> Option<i32> {
    if !args.conn.agent_enabled() {
        return None;
    }
    if settings.forward_agent.is_some() {
        // The agent's connections are shared: a forwarded agent belongs
        // to a connection of this command's own.
        tracing::debug!("ForwardAgent is on: connecting directly");
        return None;
    }
    let wire = ExecWire {
        command: args.command.clone(),
        env: remote_env(settings),
        pty: pty.map(|p| skiff_proto::agent_wire::PtyWire {
            term: p.term,
            cols: p.cols,
            rows: p.rows,
            required: p.required,
        }),
        no_stdin: args.no_stdin,
        subsystem: args.subsystem,
        ..crate::route::agent_destination(dest)
    };
    // Raw mode while a remote terminal is attached; restored on drop.
    let stdin_tty = std::io::stdin().is_terminal();
    let _raw = if wire.pty.is_some() && stdin_tty {
        terminal::RawMode::enter()
    } else {
        None
    };
    // Escapes are read here; the agent reads the rest from a pipe. `~.`
    // ends this process, and with it the agent's channel.
    let remote_terminal = wire.pty.is_some() && stdin_tty && !args.no_stdin;
    let typed =
        escape_input::filtered_stdin(settings.escape_char, remote_terminal, _raw.as_ref(), None);
    let mut poll_resize: Box<dyn FnMut() -> Option<(u32, u32)>> = if wire.pty.is_some() {
        Box::new(terminal::install_winch_flag())
    } else {
        Box::new(|| None)
    };
    let input = typed.as_ref().map(std::os::fd::AsFd::as_fd);
    crate::route::exit_status(skiff_agent::client::exec(
        wire,
        true,
        input,
        &mut *poll_resize,
    ))
}

/// What the configuration says about the session, as ssh applies it:
/// `SessionType`, `RemoteCommand` (when the command line gives none; both
/// is an error) and `StdinNull`.
pub fn apply_session_settings(
    args: &mut Invocation,
    settings: &skiff_engine::ConnectSettings,
) -> Result<(), String> {
    use skiff_proto::ssh_config::SessionType;
    match settings.session_type {
        SessionType::None => {
            return Err("SessionType none (no session, for forwarding only) needs skiff ssh".into())
        }
        SessionType::Subsystem => args.subsystem = true,
        SessionType::Default => {}
    }
    if let Some(remote) = &settings.remote_command {
        if !args.command.is_empty() {
            return Err(format!(
                "a command was given and RemoteCommand is set for {}: use one or the other (RemoteCommand=none on the command line)",
                settings.original_host
            ));
        }
        args.command = remote.clone();
    }
    if args.subsystem && args.command.is_empty() {
        return Err("a subsystem was asked for without its name".into());
    }
    args.no_stdin |= settings.stdin_null;
    Ok(())
}

/// The terminal to ask for. `-t`/`-T` win over `RequestTTY`; `auto` (the
/// default) asks for one for a login shell run from a terminal, `yes` when
/// stdin is a terminal, `force` always.
pub fn pty_request(
    args: &Invocation,
    settings: &skiff_engine::ConnectSettings,
) -> Option<PtyRequest> {
    use skiff_proto::ssh_config::RequestTty;
    let mode = match args.tty {
        TtyFlag::Unset => settings.request_tty,
        TtyFlag::Disable => RequestTty::No,
        TtyFlag::Request(1) => RequestTty::Yes,
        TtyFlag::Request(_) => RequestTty::Force,
    };
    let stdin_tty = std::io::stdin().is_terminal();
    let wanted = match mode {
        RequestTty::No => false,
        RequestTty::Auto => args.command.is_empty() && !args.subsystem && stdin_tty,
        RequestTty::Yes if !stdin_tty => {
            if settings.show_notices {
                eprintln!("Pseudo-terminal will not be allocated because stdin is not a terminal.");
            }
            false
        }
        RequestTty::Yes | RequestTty::Force => true,
    };
    if !wanted {
        return None;
    }
    let (cols, rows) = terminal::window_size().unwrap_or((80, 24));
    Some(PtyRequest {
        term: std::env::var("TERM").unwrap_or_else(|_| "xterm".into()),
        cols,
        rows,
        required: mode == RequestTty::Force,
    })
}

/// Variables to pass to the remote command: SendEnv matches from this
/// process's environment, then SetEnv.
fn remote_env(settings: &skiff_engine::ConnectSettings) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| {
            settings
                .send_env
                .iter()
                .any(|p| skiff_proto::pattern::wildcard_match(p, name))
        })
        .collect();
    env.extend(settings.set_env.iter().cloned());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_split_on_the_last_at() {
        assert_eq!(split_destination("host"), (None, "host".into()));
        assert_eq!(
            split_destination("bob@host"),
            (Some("bob".into()), "host".into())
        );
        assert_eq!(
            split_destination("a@b@host"),
            (Some("a@b".into()), "host".into())
        );
        assert_eq!(split_destination("@host"), (None, "@host".into()));
    }
}
