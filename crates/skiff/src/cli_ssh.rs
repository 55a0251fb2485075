//! `skiff ssh`: ssh's own command line, for programs that run `ssh` (rsync
//! `-e`, `GIT_SSH`, `DISTCC_SSH`, scp/sftp `-S`, monitoring checks). skiff
//! also answers to it when run under the name `ssh` or `skiff-ssh` (a
//! symlink), so such programs get the agent's warm connections without
//! learning a new syntax. Parsing is in [`crate::ssh_args`].

use std::ffi::OsString;

use std::sync::Arc;

use skiff_engine::{port_forward, ConnectSettings};
use skiff_proto::forward_spec::ForwardSpec;
use skiff_proto::ssh_config::SessionType;

use crate::cli_connect::ConnectArgs;
use crate::remote_command::{self, Invocation};
use crate::ssh_args::{self, ControlCommand, SshCommandLine};

mod describe;

const USAGE: &str =
    "usage: skiff ssh [-46qnsTtvV] [-b bind_address] [-B bind_interface] [-c ciphers] [-F config] [-i identity] [-J jump] \
[-l user] [-m macs] [-O ctl_cmd] [-o option] [-p port] [-Q query] [-W host:port] [-L [bind:]port:host:hostport] \
[-R [bind:]port:host:hostport] [-D [bind:]port] [-fgGN] destination [command [argument ...]]";

/// Runs ssh's command line `args` (without the program name); returns the
/// exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args: Vec<String> = match args.into_iter().map(OsString::into_string).collect() {
        Ok(a) => a,
        Err(bad) => {
            eprintln!("skiff ssh: argument {bad:?} is not valid UTF-8");
            return 255;
        }
    };
    let line = match ssh_args::parse(&args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skiff ssh: {e}\n{USAGE}");
            return 255;
        }
    };
    if line.version {
        eprintln!(
            "skiff {} (ssh command line; SSH protocol 2.0)",
            env!("CARGO_PKG_VERSION")
        );
        return 0;
    }
    if let Some(query) = &line.query {
        return print_query(query);
    }
    if line.print_config {
        return print_config(line);
    }
    if let Some(command) = line.control {
        return control(line, command);
    }
    let (forward, warnings) = (line.forward_stdio.clone(), line.warnings.clone());
    let (mut forwards, no_command) = (line.forwards.clone(), line.no_command);
    let background = line.background;
    let ready = if background {
        match crate::background::take_ready_signal() {
            Some(signal) => Some(signal),
            None if line.command.is_empty() && !no_command => {
                eprintln!("skiff ssh: -f needs a command to run, or -N");
                return 255;
            }
            // The first process: the same command line again, detached.
            None => return crate::background::go(&args),
        }
    } else {
        None
    };
    let mut inv = invocation(line);
    // In the background, input is /dev/null (as -f implies -n).
    inv.no_stdin |= background;
    crate::logging::init(inv.conn.verbose, inv.conn.log_file.as_deref());
    let settings = match skiff_engine::settings::resolve(&remote_command::destination(&inv)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skiff: {e}");
            return 255;
        }
    };
    if settings.show_notices {
        for w in &warnings {
            eprintln!("skiff: warning: {w}");
        }
    }
    if let Some((host, port)) = forward {
        if let Some(code) = forward_via_agent(&inv, &host, port) {
            return code;
        }
        return forward_stdio(&settings, &host, port);
    }
    for f in &settings.forwards {
        if !forwards.contains(f) {
            forwards.push(f.clone());
        }
    }
    if settings.clear_all_forwardings {
        forwards.clear();
    }
    let no_command = no_command || settings.session_type == SessionType::None;
    if forwards.is_empty() && !no_command && ready.is_none() {
        return remote_command::run_resolved(inv, settings);
    }
    forwarding_session(inv, settings, forwards, no_command, ready)
}

/// A session with port forwarding (`-L`, `-R`, `-D`, or the same from the
/// configuration), over a connection of its own: the forwardings are set
/// up, then the command runs (none with `-N`), then skiff waits for the
/// forwarded connections still open, as ssh does. With `-f` (`ready`),
/// the first process is told once all that is set up.
fn forwarding_session(
    mut inv: Invocation,
    settings: ConnectSettings,
    forwards: Vec<ForwardSpec>,
    no_command: bool,
    ready: Option<crate::background::ReadySignal>,
) -> i32 {
    let host = settings.original_host.clone();
    let pty = if no_command {
        if !inv.command.is_empty() {
            eprintln!("skiff: no session is asked for (-N or SessionType none), yet a command was given for {host}");
            return 255;
        }
        None
    } else {
        if let Err(e) = remote_command::apply_session_settings(&mut inv, &settings) {
            eprintln!("skiff: {e}");
            return 255;
        }
        remote_command::pty_request(&inv, &settings)
    };
    remote_command::on_one_thread(async move {
        let conn = Arc::new(skiff_engine::connect(&settings).await?);
        for notice in &conn.notices {
            eprintln!("{}", skiff_proto::terminal_text::lines(notice));
        }
        let (forwarding, mut failures, notices) = port_forward::start(
            &conn,
            &forwards,
            port_forward::ListenOptions::from_settings(&settings),
        )
        .await;
        if settings.show_notices {
            for n in &notices {
                eprintln!("{}", skiff_proto::terminal_text::lines(n));
            }
        }
        if settings.exit_on_forward_failure && !failures.is_empty() {
            let first = failures.remove(0);
            for f in &failures {
                eprintln!("skiff: {f}");
            }
            return Err(first);
        }
        for f in &failures {
            eprintln!("skiff: warning: {f}");
        }
        remote_command::run_local_command(&settings).await;
        if let Some(signal) = ready {
            signal.ready();
        }
        let code = if no_command {
            // Until the connection ends, or skiff is told to stop: then the
            // forwardings' sockets are removed (dropping them) on the way out.
            tokio::select! {
                _ = conn.closed() => {
                    eprintln!("skiff: connection to {host} closed by the server");
                }
                _ = stop_requested() => {
                    drop(forwarding);
                    conn.goodbye().await;
                    return Ok(255);
                }
            }
            255
        } else {
            remote_command::exec_on(&conn, inv, &settings, pty).await?
        };
        forwarding.finish().await;
        conn.goodbye().await;
        Ok(code)
    })
}

/// Resolves when skiff is asked to stop (SIGTERM, SIGINT or SIGHUP);
/// never, should those signals not be watchable.
async fn stop_requested() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(mut term), Ok(mut int), Ok(mut hup)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = hup.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

fn invocation(line: SshCommandLine) -> Invocation {
    Invocation {
        conn: ConnectArgs {
            login: line.login,
            identity: line.identity,
            config: line.config,
            options: line.options,
            jump: line.jump,
            verbose: line.verbose,
            log_file: line.log_file,
            no_agent: false,
        },
        port: line.port,
        destination: line.destination,
        command: line.command.join(" "),
        subsystem: line.subsystem,
        no_stdin: line.no_stdin,
        tty: line.tty,
    }
}

/// `-W host:port` on the agent's warm connection (started if need be).
/// `None`: do it directly (no agent, an agent too old to forward, or a
/// person has to decide something).
fn forward_via_agent(inv: &Invocation, host: &str, port: u16) -> Option<i32> {
    if !inv.conn.agent_enabled() {
        return None;
    }
    let wire = skiff_proto::agent_wire::ForwardWire {
        base: crate::route::agent_destination(&remote_command::destination(inv)),
        to_host: host.to_string(),
        to_port: port,
    };
    crate::route::exit_status(skiff_agent::client::forward(wire, true))
}

/// `-W host:port` on a connection of its own.
fn forward_stdio(settings: &ConnectSettings, host: &str, port: u16) -> i32 {
    remote_command::on_one_thread(async {
        let conn = skiff_engine::connect(settings).await?;
        for notice in &conn.notices {
            eprintln!("{}", skiff_proto::terminal_text::lines(notice));
        }
        let forwarded = skiff_engine::stdio_forward::forward_stdio(
            &conn,
            host,
            port,
            tokio::io::stdin(),
            tokio::io::stdout(),
        )
        .await;
        conn.goodbye().await;
        forwarded.map(|()| 0)
    })
}

/// `-Q QUERY`: the algorithms skiff supports for `QUERY`, one a line, as
/// `ssh -Q` lists OpenSSH's.
fn print_query(query: &str) -> i32 {
    match skiff_proto::algorithms::query::answer(query) {
        Some(names) => {
            for name in names {
                println!("{name}");
            }
            0
        }
        None => {
            eprintln!("skiff ssh: Unsupported query \"{query}\"");
            255
        }
    }
}

/// `-O check|stop|exit`: asked of the agent, which holds the warm
/// connections a control master would (and decides which of them are the
/// destination's). The answers and exit statuses are ssh's: 0 with a
/// connection to check or stop, 255 without one.
fn control(line: SshCommandLine, command: ControlCommand) -> i32 {
    use skiff_agent::client::Controlled;
    use skiff_proto::agent_wire::ControlAction;
    let inv = invocation(line);
    crate::logging::init(inv.conn.verbose, inv.conn.log_file.as_deref());
    let target = &inv.destination;
    if !inv.conn.agent_enabled() {
        eprintln!("skiff: no agent to ask about {target}: the agent is turned off (SKIFF_AGENT)");
        return 255;
    }
    let action = match command {
        ControlCommand::Check => ControlAction::Check,
        ControlCommand::Stop | ControlCommand::Exit => ControlAction::Stop,
    };
    let wire = crate::route::agent_destination(&remote_command::destination(&inv));
    match skiff_agent::client::control(wire, action) {
        Controlled::Answered { live: 0, .. } => {
            eprintln!("skiff: the agent holds no connection to {target}");
            255
        }
        Controlled::Answered { pid, .. } => {
            eprintln!(
                "{}",
                match command {
                    ControlCommand::Check => format!("Master running (pid={pid})"),
                    ControlCommand::Stop => "Stop listening request sent.".to_string(),
                    ControlCommand::Exit => "Exit request sent.".to_string(),
                }
            );
            0
        }
        Controlled::NoAgent(why) => {
            tracing::debug!("no agent: {why}");
            eprintln!("skiff: no agent is running, so no connection to {target}");
            255
        }
        Controlled::Failed(why) => {
            eprintln!("skiff: {}", skiff_proto::terminal_text::one_line(&why));
            255
        }
    }
}

/// `-G`: the settings skiff would use, printed as `ssh -G` prints them.
fn print_config(line: SshCommandLine) -> i32 {
    let inv = invocation(line.clone());
    crate::logging::init(inv.conn.verbose, inv.conn.log_file.as_deref());
    match skiff_engine::settings::resolve_with_config(&remote_command::destination(&inv)) {
        Ok((settings, cfg)) => {
            print!("{}", describe::describe(&settings, &cfg, &line));
            0
        }
        Err(e) => {
            eprintln!("skiff: {e}");
            255
        }
    }
}
