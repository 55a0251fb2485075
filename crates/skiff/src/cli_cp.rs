//! `skiff cp`: copy files and directories to or from one host, with scp's
//! syntax (`[user@]host:path`, `-r`, `-p`, `-P PORT`), or to every host of
//! a node set (`web[01-20]:path`, see [`crate::cli_cp_fanout`]). Exit
//! status: 0 when every file was copied, 1 when any failed (each named on
//! stderr), 255 when skiff could not connect or authenticate.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use skiff_engine::copy::{CopyJob, CopyReport, Direction, NoProgress, Progress};
use skiff_engine::{prompt_screen, Connection, Destination, ErrorKind, SkiffError};
use skiff_proto::terminal_text::one_line;

#[derive(Args, Debug, Clone)]
#[command(override_usage = "skiff cp [OPTIONS] SRC... DST")]
pub struct CpArgs {
    /// Copy directories and their contents.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Keep modes and access/modification times.
    #[arg(short = 'p')]
    pub preserve: bool,
    /// Port to connect to (scp's -P).
    #[arg(short = 'P', value_name = "PORT")]
    pub port: Option<u16>,
    /// Identity (private key) file; repeatable, tried in order.
    #[arg(short = 'i', value_name = "KEY")]
    pub identity: Vec<PathBuf>,
    /// User to log in as (a `user@` in the remote path wins).
    #[arg(short = 'l', value_name = "USER")]
    pub login: Option<String>,
    /// Client configuration file instead of ~/.ssh/config (system config is then skipped).
    #[arg(short = 'F', value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// ssh_config option, e.g. -o StrictHostKeyChecking=yes; repeatable.
    #[arg(short = 'o', value_name = "Keyword=Value")]
    pub options: Vec<String>,
    /// Connect through these jump hosts, first to last (ProxyJump).
    #[arg(short = 'J', value_name = "[user@]host[:port],...")]
    pub jump: Option<String>,
    /// More diagnostics on stderr (repeatable).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No progress bar.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Parallel data-plane streams, 1 to 16 (skiffd only). Default: 2, 4 or
    /// 8 for round trips up to 2 ms, up to 20 ms, or longer.
    #[arg(long = "streams", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub streams: Option<u16>,
    /// Data-plane protection (skiffd only; integrity and none need the server's consent).
    #[arg(long = "cipher", value_enum, default_value_t = CipherMode::Aead)]
    pub cipher: CipherMode,
    /// Connect directly instead of through the agent (also SKIFF_AGENT=off).
    #[arg(long = "no-agent")]
    pub no_agent: bool,
    /// Copying to a node set: hosts in progress at once.
    #[arg(short = 'j', long = "parallel", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: u16,
    /// Groups file for @name in a node set (default: $XDG_CONFIG_HOME/skiff/groups, else ~/.config/skiff/groups).
    #[arg(long = "groups", value_name = "FILE")]
    pub groups_file: Option<PathBuf>,
    /// SRC... DST: sources, then the target; one side is `[user@]host:path`
    /// (a target's host may be a node set: `web[01-20]:path`, `@group:path`).
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
}

/// How data-plane records are protected (`--cipher`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherMode {
    /// Encrypted and authenticated (AES-GCM).
    Aead,
    /// Authenticated, not encrypted.
    Integrity,
    /// Neither (loopback or trusted networks, when the server allows it).
    None,
}

/// The data-plane parameters of one copy.
#[derive(Debug, Clone)]
pub struct PlaneOptions {
    pub streams: Option<u16>,
    pub cipher: CipherMode,
}

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
enum Planned {
    One(Plan),
    Many(crate::cli_cp_fanout::FanoutPlan),
}

/// Whether a target's host field is a node set rather than one host.
fn is_node_set(host: &str) -> bool {
    host.starts_with('@') || host.contains('[') || host.contains(',')
}

fn plan(args: &CpArgs) -> Result<Planned, String> {
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
                return crate::cli_cp_fanout::plan(args, direction, user, &host).map(Planned::Many);
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
                return crate::cli_cp_fanout::plan(args, direction, user, &host).map(Planned::Many);
            }
            (direction, user, host)
        }
    };
    Ok(Planned::One(Plan {
        job: job(args, direction),
        destination: Destination {
            host,
            user: user.or_else(|| args.login.clone()),
            ..base_destination(args)
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

/// Everything about where to connect that the command line gives, but the
/// host and user.
pub(crate) fn base_destination(args: &CpArgs) -> Destination {
    Destination {
        host: String::new(),
        user: None,
        port: args.port,
        identity_files: args.identity.clone(),
        config_file: args.config.clone(),
        options: crate::cli_connect::with_jump(args.jump.as_deref(), &args.options),
    }
}

/// Logging as for every command, except that without `-v` the SFTP
/// client's own warnings stay quiet: when its channel closes under it,
/// skiff says so itself, in one line.
pub(crate) fn init_logging(verbose: u8) {
    if verbose == 0 && std::env::var_os("SKIFF_LOG").is_none() {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_target(false)
            .without_time()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn,russh_sftp=error"))
            .try_init();
        return;
    }
    crate::init_logging(verbose);
}

pub fn run(args: CpArgs) -> i32 {
    init_logging(args.verbose);
    let plan = match plan(&args) {
        Ok(Planned::One(p)) => p,
        Ok(Planned::Many(many)) => return crate::cli_cp_fanout::run(&args, many),
        Err(message) => {
            eprintln!("skiff: {message}");
            return 255;
        }
    };
    let settings = match skiff_engine::settings::resolve(&plan.destination) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skiff: {e}");
            return 255;
        }
    };
    let Some(runtime) = copy_runtime() else {
        return 255;
    };
    let plane = plane_of(&args);
    let show_bar = !args.quiet && std::io::stderr().is_terminal();
    let use_agent = agent_wanted(&args);
    let result = runtime.block_on(cp_main(&plan, settings, &plane, show_bar, use_agent));
    runtime.shutdown_background();
    match result {
        Ok(Finish::Interrupted(signal)) => {
            // Files not complete were never renamed into place, and their
            // local temporaries are gone; remote ones may remain.
            eprintln!("skiff: interrupted; files not yet complete were not written");
            128 + signal
        }
        Ok(Finish::Done(report)) => {
            tracing::debug!(
                "copied {} files and {} directories, {} bytes; {} failed",
                report.files,
                report.dirs,
                report.bytes,
                report.failures.len()
            );
            // Each names a path (perhaps one the server listed) and may
            // carry the server's own words.
            for failure in &report.failures {
                eprintln!("skiff: {}", one_line(failure));
            }
            if report.failures.is_empty() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("skiff: {e}");
            255
        }
    }
}

/// The runtime copies run on: two workers, so that the SSH session's
/// crypto runs beside the copy loop. `None` (said on stderr) if it cannot
/// start.
pub(crate) fn copy_runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("skiff: cannot start the async runtime: {e}"))
        .ok()
}

/// The data-plane options `args` ask for.
pub(crate) fn plane_of(args: &CpArgs) -> PlaneOptions {
    PlaneOptions {
        streams: args.streams,
        cipher: args.cipher,
    }
}

/// Whether to copy through the agent: not with `--no-agent` or SKIFF_AGENT=off.
pub(crate) fn agent_wanted(args: &CpArgs) -> bool {
    !args.no_agent
        && !std::env::var("SKIFF_AGENT").is_ok_and(|v| matches!(v.as_str(), "off" | "no" | "0"))
}

/// How a copy ended, short of an error.
enum Finish {
    Done(CopyReport),
    /// Stopped by this signal (INT, TERM or HUP).
    Interrupted(i32),
}

/// Waits for SIGINT, SIGTERM or SIGHUP and returns its number.
pub(crate) async fn interrupted() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => libc::SIGINT,
        _ = term.recv() => libc::SIGTERM,
        _ = hup.recv() => libc::SIGHUP,
    }
}

async fn cp_main(
    plan: &Plan,
    settings: skiff_engine::ConnectSettings,
    plane: &PlaneOptions,
    show_bar: bool,
    use_agent: bool,
) -> Result<Finish, SkiffError> {
    let bar = show_bar.then(Bar::new);
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let finish = |report: Result<CopyReport, SkiffError>| {
        if let Some(b) = &bar {
            b.0.finish();
        }
        report.map(Finish::Done)
    };
    if use_agent {
        // Stopping the copy drops it, which removes the temporaries of
        // files not complete and closes the agent's channel.
        let through_agent = tokio::select! {
            r = via_agent(plan, &settings, plane, progress) => r,
            signal = interrupted() => return Ok(Finish::Interrupted(signal)),
        };
        if let Some(report) = through_agent {
            return finish(report);
        }
    }
    tracing::debug!(
        "connecting to {}@{} port {}",
        settings.user,
        settings.hostname,
        settings.port
    );
    let conn = skiff_engine::connect(&settings).await?;
    for notice in &conn.notices {
        eprintln!("{}", skiff_proto::terminal_text::lines(notice));
    }
    // Only once connected: a passphrase prompt keeps the default signal
    // handling (and so its terminal restored).
    tokio::select! {
        report = copy_over(&conn, &settings, &plan.job, plane, progress) => finish(report),
        signal = interrupted() => Ok(Finish::Interrupted(signal)),
    }
}

/// The data-plane mode `--cipher` asks for, and the host's progress budget.
fn plane_options(
    plane: &PlaneOptions,
    settings: &skiff_engine::ConnectSettings,
) -> skiff_engine::copy::dataplane::PlaneOptions {
    let mode = match plane.cipher {
        CipherMode::Aead => skiff_proto::dataplane::Mode::Aead,
        CipherMode::Integrity => skiff_proto::dataplane::Mode::Integrity,
        CipherMode::None => skiff_proto::dataplane::Mode::None,
    };
    skiff_engine::copy::dataplane::PlaneOptions {
        mode,
        streams: plane.streams.map(u32::from),
        stall: settings.progress_budget(),
        gate: settings.pre_auth_gate(),
    }
}

/// Copies through the agent's warm connection: the agent starts the
/// subsystem (the data plane, else SFTP) on its connection and hands the
/// channel over a socket pair; data-plane streams go straight to the
/// server. `None`: no agent, or it defers to a direct connection (a person
/// must confirm a host key or type a passphrase).
pub(crate) async fn via_agent(
    plan: &Plan,
    settings: &skiff_engine::ConnectSettings,
    plane: &PlaneOptions,
    progress: &dyn Progress,
) -> Option<Result<CopyReport, SkiffError>> {
    let host = settings.original_host.clone();
    for name in [skiff_proto::dataplane::SUBSYSTEM, "sftp"] {
        let (ours, theirs) = match std::os::unix::net::UnixStream::pair() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("not using the agent: socket pair: {e}");
                return None;
            }
        };
        let wire = agent_wire(&plan.destination, name);
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The copy starts once the channel is open: for the data plane the
        // round trip the agent measured opening it picks the stream count,
        // and the request then goes out with `Hello`.
        let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
        let mut opened_tx = Some(opened_tx);
        std::thread::spawn(move || {
            let outcome = skiff_agent::client::subsystem_announced(
                wire,
                std::os::fd::AsFd::as_fd(&theirs),
                &mut |rtt| {
                    if let Some(t) = opened_tx.take() {
                        let _ = t.send(rtt);
                    }
                },
            );
            drop(theirs);
            let _ = tx.send(outcome);
        });
        let ours = match ours
            .set_nonblocking(true)
            .and_then(|_| tokio::net::UnixStream::from_std(ours))
        {
            Ok(s) => s,
            Err(e) => {
                return Some(Err(SkiffError::new(
                    skiff_engine::ErrorKind::Protocol,
                    format!("socket pair: {e}"),
                )))
            }
        };
        let copied = match opened_rx.await {
            // No channel: the agent's reply says why.
            Err(_) => Err(SkiffError::new(
                skiff_engine::ErrorKind::Connect,
                format!("{host}: the agent's channel lost before it opened"),
            )),
            Ok(_) if name == "sftp" => {
                if plane.cipher != CipherMode::Aead {
                    eprintln!(
                        "skiff: {host} has no skiff data plane; copying over SFTP (encrypted)"
                    );
                }
                skiff_engine::copy::sftp::copy_on(
                    ours,
                    &host,
                    &plan.job,
                    settings.progress_budget(),
                    progress,
                )
                .await
            }
            Ok(rtt) => match server_address(settings).await {
                Ok(addr) => {
                    skiff_engine::copy::dataplane::copy_on(
                        ours,
                        &host,
                        addr,
                        &plan.job,
                        &plane_options(plane, settings),
                        rtt,
                        progress,
                    )
                    .await
                }
                Err(e) => Err(e),
            },
        };
        // Our end is closed now: the channel ends and the agent answers.
        let outcome = rx
            .await
            .unwrap_or(skiff_agent::client::Outcome::Unavailable(
                "agent thread ended".into(),
            ));
        use skiff_agent::client::Outcome;
        use skiff_proto::agent_wire::Reply;
        match (copied, outcome) {
            (Ok(report), _) => return Some(Ok(report)),
            (Err(_), Outcome::Reply(Reply::NeedsUser { message })) => {
                tracing::debug!(
                    "agent defers to a direct connection: {}",
                    one_line(&message)
                );
                return None;
            }
            (Err(_), Outcome::Unavailable(why)) => {
                tracing::debug!("not using the agent: {why}");
                return None;
            }
            (Err(_), Outcome::Reply(Reply::Failed { kind, .. }))
                if skiff_agent::kind_from_wire(kind) == ErrorKind::Refused && name != "sftp" =>
            {
                tracing::debug!("{host}: no skiff data plane through the agent; using SFTP");
                continue;
            }
            (Err(e), Outcome::Reply(Reply::Failed { message, kind }))
                if e.kind == ErrorKind::Connect
                    || skiff_agent::kind_from_wire(kind) == ErrorKind::Refused =>
            {
                // Our end is the agent's channel: when it gave out, or the
                // server refused to start the subsystem, the agent knows why.
                let kind = skiff_agent::kind_from_wire(kind);
                return Some(Err(SkiffError::new(kind, message)));
            }
            (Err(e), _) => return Some(Err(e)),
        }
    }
    None
}

/// What the agent needs to reach the destination as this process would.
fn agent_wire(dest: &Destination, subsystem: &str) -> skiff_proto::agent_wire::ExecWire {
    let absolute = |p: &std::path::Path| {
        if p.as_os_str() == "none" {
            return "none".to_string();
        }
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    };
    skiff_proto::agent_wire::ExecWire {
        host: dest.host.clone(),
        user: dest.user.clone(),
        port: dest.port,
        identity_files: dest.identity_files.iter().map(|p| absolute(p)).collect(),
        config_file: dest.config_file.as_deref().map(absolute),
        options: dest.options.clone(),
        command: subsystem.to_string(),
        client_env: skiff_engine::settings::ClientEnv::from_process().vars,
        subsystem: true,
        ..Default::default()
    }
}

/// Where data-plane streams go when the agent holds the SSH connection: the
/// server's address, resolved here.
async fn server_address(
    settings: &skiff_engine::ConnectSettings,
) -> Result<std::net::SocketAddr, SkiffError> {
    let fail = |why: String| {
        SkiffError::new(
            skiff_engine::ErrorKind::Connect,
            format!("cannot resolve {}: {why}", settings.hostname),
        )
    };
    tokio::net::lookup_host((settings.hostname.as_str(), settings.port))
        .await
        .map_err(|e| fail(e.to_string()))?
        .next()
        .ok_or_else(|| fail("no addresses".into()))
}

/// Copies `job` on `conn`: over the skiff data plane when the server offers
/// one, else over SFTP.
pub(crate) async fn copy_over(
    conn: &Connection,
    settings: &skiff_engine::ConnectSettings,
    job: &CopyJob,
    plane: &PlaneOptions,
    progress: &dyn Progress,
) -> Result<CopyReport, SkiffError> {
    let options = plane_options(plane, settings);
    if let Some(report) = skiff_engine::copy::dataplane::copy(conn, job, &options, progress).await?
    {
        return Ok(report);
    }
    tracing::debug!(
        "{}: no skiff data plane; using SFTP",
        conn.settings.hostname
    );
    if plane.cipher != CipherMode::Aead {
        eprintln!(
            "skiff: {} has no skiff data plane; copying over SFTP (encrypted)",
            conn.settings.original_host
        );
    }
    skiff_engine::copy::sftp::copy(conn, job, progress).await
}

/// A progress bar on stderr: bytes, rate and time left. It steps aside
/// whenever the engine asks a person something (a passphrase, a host key),
/// for as long as it lives. Until the first size is known its total is
/// unknown, and the bar is drawn empty (a total of 0 would draw it full).
pub(crate) struct Bar(
    pub(crate) indicatif::ProgressBar,
    // Held for its drop, which ends the stepping aside.
    #[allow(dead_code)] prompt_screen::Registration,
    /// Serialises the first sizing against other sizes added at once.
    std::sync::Mutex<()>,
);

/// How often the bar is redrawn when no bytes move, so that its rate and
/// time left stay true during a stall.
const BAR_TICK: std::time::Duration = std::time::Duration::from_millis(250);

impl Bar {
    pub(crate) fn new() -> Bar {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        let style = indicatif::ProgressStyle::with_template(
            "{wide_msg} {bytes}/{total_bytes} [{bar:24}] {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(BAR_TICK);
        let registration = prompt_screen::hide_while_prompting(Arc::new(BarOnStderr(bar.clone())));
        Bar(bar, registration, std::sync::Mutex::new(()))
    }
}

/// The bar as the engine's prompts see it.
struct BarOnStderr(indicatif::ProgressBar);

impl prompt_screen::TerminalDrawing for BarOnStderr {
    fn hide(&self) {
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::hidden());
        // The bar's last drawing is still on the line the question goes to.
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(b"\r\x1b[2K");
        let _ = stderr.flush();
    }

    fn show(&self) {
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
}

impl Progress for Bar {
    fn add_total(&self, bytes: u64) {
        let _one_at_a_time = self.2.lock().unwrap_or_else(|p| p.into_inner());
        match self.0.length() {
            None => self.0.set_length(bytes),
            Some(_) => self.0.inc_length(bytes),
        }
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }

    fn file_done(&self, path: &str) {
        // A name the server chose, for a download.
        self.0.set_message(one_line(path).into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(user: Option<&str>, host: &str, path: &str) -> Endpoint {
        Endpoint::Remote {
            user: user.map(str::to_string),
            host: host.into(),
            path: path.into(),
        }
    }

    #[test]
    fn the_bar_shows_a_servers_file_name_escaped() {
        let bar = Bar::new();
        bar.file_done("logs/\u{1b}[1A\u{1b}[2Kok\r.txt");
        assert_eq!(bar.0.message(), "logs/\\u{1b}[1A\\u{1b}[2Kok\\r.txt");
        bar.file_done("logs/plain.txt");
        assert_eq!(bar.0.message(), "logs/plain.txt");
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
            identity: vec![],
            login: Some("dflt".into()),
            config: None,
            options: vec![],
            jump: None,
            verbose: 0,
            quiet: false,
            streams: None,
            cipher: CipherMode::Aead,
            no_agent: false,
            parallel: 16,
            groups_file: None,
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
