//! `skiff run`: one command on many hosts from one process. Hosts come as
//! node sets (`web[01-20]`, `@group`, `-f FILE`, minus `-x SET`); output is
//! streamed as `host: line`, folded by identical output (`-b`), or one JSON
//! object per host (`--json`); a summary goes to stderr.
//!
//! Exit code: 0 when every host ran the command successfully; 255 when any
//! host could not be reached or refused us (connection, host key,
//! authentication); otherwise the highest remote exit code, a timed-out
//! host counting as 124.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use skiff_engine::fanout::{self, FanoutOptions, RunEvent, Stream, Target};
use skiff_engine::{Destination, ExecRequest};
use skiff_proto::nodeset;

use crate::cli_connect::ConnectArgs;
use crate::groups::GroupsArgs;
use crate::run_output::{self, HostRecord, LineSplitter};

#[derive(Args, Debug, Clone)]
#[command(
    trailing_var_arg = true,
    override_usage = "skiff run [OPTIONS] HOSTS [--] COMMAND [ARGS]...\n       \
                      skiff run [OPTIONS] {-w SET | -f FILE}... [--] COMMAND [ARGS]..."
)]
pub struct RunArgs {
    /// Port to connect to (a host's own `:port` wins).
    #[arg(short = 'p', value_name = "PORT")]
    pub port: Option<u16>,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Hosts (a node set); repeatable. With -w or -f, no HOSTS argument is taken.
    #[arg(short = 'w', value_name = "SET")]
    pub with: Vec<String>,
    /// Read hosts from FILE: one host or node set per line, # comments.
    #[arg(short = 'f', value_name = "FILE")]
    pub hosts_file: Vec<PathBuf>,
    /// Leave out these hosts (a node set); repeatable.
    #[arg(short = 'x', value_name = "SET")]
    pub exclude: Vec<String>,
    /// Hosts in progress at once.
    #[arg(
        short = 'j',
        long = "parallel",
        value_name = "N",
        default_value_t = 256
    )]
    pub parallel: usize,
    /// Seconds to wait for each connection (ConnectTimeout).
    #[arg(long = "connect-timeout", value_name = "SECS")]
    pub connect_timeout: Option<u64>,
    /// Seconds each command may run; then it is sent TERM and its channel closed.
    #[arg(long = "timeout", value_name = "SECS")]
    pub timeout: Option<f64>,
    /// New connections per second at most (spares the local CPU).
    #[arg(long = "rate", value_name = "N")]
    pub rate: Option<f64>,
    /// Gather output and show hosts with identical output once, under a folded node set.
    #[arg(short = 'b', long = "group")]
    pub group: bool,
    /// One JSON object per host on stdout (host, exit_code, signal, error, stdout, stderr, duration_ms).
    #[arg(long = "json", conflicts_with = "group")]
    pub json: bool,
    /// Also write each host's output to DIR/HOST.out and DIR/HOST.err.
    #[arg(long = "outdir", value_name = "DIR")]
    pub outdir: Option<PathBuf>,
    #[command(flatten)]
    pub groups: GroupsArgs,
    /// No summary on stderr.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// HOSTS (unless -w or -f is given) then the command and its arguments.
    #[arg(
        required = true,
        allow_hyphen_values = true,
        value_name = "HOSTS|COMMAND"
    )]
    pub rest: Vec<String>,
}

pub fn run(args: RunArgs) -> i32 {
    crate::logging::init(args.conn.verbose, args.conn.log_file.as_deref());
    match plan(&args) {
        Ok((targets, command)) => execute(&args, targets, command),
        Err(msg) => {
            eprintln!("skiff run: {msg}");
            255
        }
    }
}

/// The hosts and the command, from the command line and files.
fn plan(args: &RunArgs) -> Result<(Vec<nodeset::Target>, String), String> {
    let groups = args.groups.load()?;
    let lookup = |name: &str| groups.get(name).map(str::to_string);
    let mut rest = args.rest.iter();
    let mut sets: Vec<(String, String)> = args
        .with
        .iter()
        .map(|s| ("-w".to_string(), s.clone()))
        .collect();
    if args.with.is_empty() && args.hosts_file.is_empty() {
        let hosts = rest.next().ok_or("no hosts given")?;
        sets.push(("HOSTS".to_string(), hosts.clone()));
    }
    let mut targets = Vec::new();
    for (what, set) in &sets {
        targets.extend(nodeset::parse(set, &lookup).map_err(|e| format!("{what}: {e}"))?);
    }
    for file in &args.hosts_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        targets.extend(
            nodeset::parse_hosts_file(&text, &file.display().to_string(), &lookup)
                .map_err(|e| e.to_string())?,
        );
    }
    let mut excluded = Vec::new();
    for set in &args.exclude {
        excluded.extend(nodeset::parse(set, &lookup).map_err(|e| format!("-x: {e}"))?);
    }
    let targets = nodeset::exclude(dedup(targets), &excluded);
    if targets.is_empty() {
        return Err("the host set is empty".into());
    }
    let words: Vec<&str> = rest
        .as_slice()
        .iter()
        .map(String::as_str)
        .skip_while(|w| *w == "--")
        .collect();
    if words.is_empty() {
        return Err("no command given".into());
    }
    Ok((targets, words.join(" ")))
}

/// Duplicates removed, in the canonical order (the order folding prints).
fn dedup(targets: Vec<nodeset::Target>) -> Vec<nodeset::Target> {
    let mut seen = HashSet::new();
    let mut unique: Vec<nodeset::Target> = targets
        .into_iter()
        .filter(|t| seen.insert(t.to_string()))
        .collect();
    nodeset::sort_canonical(&mut unique);
    unique
}

/// Where to connect as the command line says, but the host (each host's
/// own `user@` and `:port` win).
fn base_destination(args: &RunArgs) -> Destination {
    let mut base = args.conn.destination(args.port);
    if let Some(secs) = args.connect_timeout {
        base.options.insert(0, format!("ConnectTimeout={secs}"));
    }
    base
}

/// Settings for each host; a host whose settings fail is reported as failed.
/// The configuration files are read once for all of them.
fn resolve_targets(args: &RunArgs, hosts: &[nodeset::Target]) -> Result<Vec<Target>, String> {
    let base = base_destination(args);
    let env = skiff_engine::settings::ClientEnv::from_process();
    // A fan-out cannot ask a person hundreds of host-key questions; a key's
    // passphrase it asks for once, for every host (unless BatchMode).
    let resolver =
        skiff_engine::settings::Resolver::new(base.config_file.as_deref(), &base.options, &env)
            .map_err(|e| e.to_string())?
            .for_fan_out();
    Ok(fanout::targets(hosts, &base, &resolver))
}

fn execute(args: &RunArgs, hosts: Vec<nodeset::Target>, command: String) -> i32 {
    if let Some(dir) = &args.outdir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("skiff run: cannot create {}: {e}", dir.display());
            return 255;
        }
    }
    let timeout = match args.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            eprintln!("skiff run: --timeout must be a positive number of seconds");
            return 255;
        }
        t => t.map(Duration::from_secs_f64),
    };
    // This thread's runtime writes the output and, running directly, takes
    // its share of the hosts (see run_threads).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skiff run: cannot start the async runtime: {e}");
            return 255;
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let mut workers = None;
    let labels = match through_agent(args, &hosts, &command, timeout, tx.clone()) {
        Some(labels) => {
            drop(tx); // the relay thread holds the only sender now
            labels
        }
        None => {
            match start_directly(args, &hosts, command, timeout, runtime.handle(), tx) {
                Ok(w) => workers = Some(w),
                Err(e) => {
                    eprintln!("skiff run: {e}");
                    return 255;
                }
            }
            hosts.iter().map(ToString::to_string).collect()
        }
    };
    let mode = if args.json {
        Mode::Json
    } else if args.group {
        Mode::Grouped
    } else {
        Mode::Streamed
    };
    let result = runtime.block_on(collect(rx, &labels, mode, args.outdir.as_deref()));
    runtime.shutdown_background();
    drop(workers);
    let records = match result {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return 141,
        Err(e) => {
            eprintln!("skiff run: cannot write output: {e}");
            return 255;
        }
    };
    if mode == Mode::Grouped {
        let (out, err) = run_output::grouped(&records);
        if write_all(&mut std::io::stdout(), &out).is_err() {
            return 141;
        }
        let _ = write_all(&mut std::io::stderr(), &err);
    }
    if !args.quiet {
        eprint!("{}", run_output::summary(&records));
    }
    fanout::overall_exit_code(records.iter().map(|r| &r.result))
}

/// Starts the fan-out to `hosts` from this process, on `handle`'s runtime
/// and one more thread per core; events go to `tx`, numbered as `hosts`.
fn start_directly(
    args: &RunArgs,
    hosts: &[nodeset::Target],
    command: String,
    timeout: Option<Duration>,
    handle: &tokio::runtime::Handle,
    tx: tokio::sync::mpsc::Sender<RunEvent>,
) -> Result<crate::run_threads::Workers, String> {
    let targets = resolve_targets(args, hosts)?;
    // One thread per core (the caller's included), no more than there are
    // hosts to run at once.
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(args.parallel.max(1))
        .min(targets.len())
        .min(MAX_THREADS);
    let workers = crate::run_threads::Workers::start(threads.saturating_sub(1))
        .map_err(|e| format!("cannot start threads: {e}"))?;
    let mut spread = vec![handle.clone()];
    spread.extend(workers.handles().iter().cloned());
    let opts = FanoutOptions {
        parallel: args.parallel.max(1),
        connect_rate: args.rate,
        spread,
    };
    let request = ExecRequest {
        command,
        timeout,
        ..Default::default()
    };
    handle.spawn(fanout::run_command(targets, opts, request, None, tx));
    Ok(workers)
}

/// Most threads a direct fan-out runs connections on.
const MAX_THREADS: usize = 64;

/// Largest folded host set sent to the agent in one request.
const MAX_AGENT_HOST_SET: usize = 256 * 1024;

/// Starts the fan-out in the agent (starting one if needed) with events
/// relayed to `tx` from a thread, and returns the host labels in the
/// agent's numbering. `None`: run directly (agent off or unavailable).
fn through_agent(
    args: &RunArgs,
    hosts: &[nodeset::Target],
    command: &str,
    timeout: Option<Duration>,
    tx: tokio::sync::mpsc::Sender<RunEvent>,
) -> Option<Vec<String>> {
    use skiff_proto::agent_wire::{ExecWire, RunWire};
    if !args.conn.agent_enabled() {
        return None;
    }
    // The agent numbers hosts in the order the folded set expands to.
    let labels: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    let folded = nodeset::fold(&labels);
    if folded.len() > MAX_AGENT_HOST_SET {
        tracing::debug!("host set too large to hand to the agent; running directly");
        return None;
    }
    let order: Vec<nodeset::Target> = match nodeset::parse(&folded, &|_| None) {
        Ok(t) if t.len() == labels.len() => t,
        _ => {
            tracing::debug!("host set does not fold losslessly; running directly");
            return None;
        }
    };
    let stream = crate::route::agent_connection()?;
    let wire = RunWire {
        base: ExecWire {
            command: command.to_string(),
            no_stdin: true,
            ..crate::route::agent_destination(&base_destination(args))
        },
        hosts: folded,
        parallel: u32::try_from(args.parallel.max(1)).unwrap_or(u32::MAX),
        rate_milli: args
            .rate
            .map_or(0, |r| (r * 1000.0).clamp(1.0, u32::MAX as f64) as u32),
        timeout_ms: timeout.map_or(0, |t| {
            u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
        }),
    };
    let labels = order.iter().map(ToString::to_string).collect();
    let retry = Retry {
        args: args.clone(),
        command: command.to_string(),
        timeout,
    };
    std::thread::spawn(move || relay_agent_run(stream, wire, order, retry, tx));
    Some(labels)
}

/// What is needed to run hosts directly that the agent could not.
struct Retry {
    args: RunArgs,
    command: String,
    timeout: Option<Duration>,
}

/// Turns the agent's replies into events. Hosts the agent never finished
/// (it failed or went away) are reported as failed with the reason. Hosts
/// it could not log in to without a person (a key's passphrase) are then
/// run directly, where the passphrase can be asked for once.
fn relay_agent_run(
    stream: std::os::unix::net::UnixStream,
    wire: skiff_proto::agent_wire::RunWire,
    order: Vec<nodeset::Target>,
    retry: Retry,
    tx: tokio::sync::mpsc::Sender<RunEvent>,
) {
    use skiff_proto::agent_wire::Reply;
    let count = order.len();
    let mut finished = vec![false; count];
    let mut for_person = Vec::new();
    let mut on_reply = |reply: Reply| {
        let event = match reply {
            Reply::RunOutput { host, stream, data } if (host as usize) < count => {
                RunEvent::Output {
                    host: host as usize,
                    stream: if stream == 2 {
                        Stream::Stderr
                    } else {
                        Stream::Stdout
                    },
                    data,
                }
            }
            Reply::RunNotice { host, text } if (host as usize) < count => RunEvent::Notice {
                host: host as usize,
                text,
            },
            Reply::RunDone {
                host,
                end,
                duration_us,
            } if (host as usize) < count && !finished[host as usize] => {
                finished[host as usize] = true;
                let Some(result) = crate::route::run_host_end(end) else {
                    for_person.push(host as usize);
                    return true;
                };
                RunEvent::Done {
                    host: host as usize,
                    result,
                    duration: Duration::from_micros(duration_us),
                }
            }
            other => {
                tracing::debug!("ignoring an unexpected agent reply: {other:?}");
                return true;
            }
        };
        tx.blocking_send(event).is_ok()
    };
    let end = skiff_agent::client::run(stream, wire, &mut on_reply);
    let unfinished = (0..count).filter(|&host| !finished[host]);
    if !fail_hosts(unfinished, &crate::route::run_failure(end), &tx) {
        return;
    }
    if !for_person.is_empty() {
        tracing::debug!(
            "{} hosts need a passphrase the agent may not ask for: running them directly",
            for_person.len()
        );
        run_directly_after_agent(&retry, &order, &for_person, &tx);
    }
}

/// Runs `hosts` (indices into `order`) directly, on a runtime of this
/// thread, with their events renumbered into `order`'s numbering.
fn run_directly_after_agent(
    retry: &Retry,
    order: &[nodeset::Target],
    hosts: &[usize],
    tx: &tokio::sync::mpsc::Sender<RunEvent>,
) {
    let subset: Vec<nodeset::Target> = hosts.iter().map(|&i| order[i].clone()).collect();
    let fail_all = |message: String| {
        let error = skiff_engine::SkiffError::new(skiff_engine::ErrorKind::Config, message);
        fail_hosts(hosts.iter().copied(), &error, tx);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail_all(format!("cannot start the async runtime: {e}")),
    };
    let (inner_tx, mut inner_rx) = tokio::sync::mpsc::channel(1024);
    let workers = match start_directly(
        &retry.args,
        &subset,
        retry.command.clone(),
        retry.timeout,
        runtime.handle(),
        inner_tx,
    ) {
        Ok(w) => w,
        Err(e) => return fail_all(e),
    };
    runtime.block_on(async {
        while let Some(event) = inner_rx.recv().await {
            if tx.send(renumbered(event, hosts)).await.is_err() {
                break;
            }
        }
    });
    runtime.shutdown_background();
    drop(workers);
}

/// Reports each of `hosts` as failed with `error`. False when the
/// receiver is gone.
fn fail_hosts(
    hosts: impl Iterator<Item = usize>,
    error: &skiff_engine::SkiffError,
    tx: &tokio::sync::mpsc::Sender<RunEvent>,
) -> bool {
    hosts.into_iter().all(|host| {
        let event = RunEvent::Done {
            host,
            result: Err(error.clone()),
            duration: Duration::ZERO,
        };
        tx.blocking_send(event).is_ok()
    })
}

/// `event` with its host number `n` replaced by `numbers[n]`.
fn renumbered(event: RunEvent, numbers: &[usize]) -> RunEvent {
    match event {
        RunEvent::Output { host, stream, data } => RunEvent::Output {
            host: numbers[host],
            stream,
            data,
        },
        RunEvent::Notice { host, text } => RunEvent::Notice {
            host: numbers[host],
            text,
        },
        RunEvent::Done {
            host,
            result,
            duration,
        } => RunEvent::Done {
            host: numbers[host],
            result,
            duration,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Streamed,
    Grouped,
    Json,
}

/// Per-host state while the fan-out runs.
#[derive(Default)]
struct Pending {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    out_lines: LineSplitter,
    err_lines: LineSplitter,
}

/// Receives events until every host is done, printing as `mode` says, and
/// returns every host's record in the order of `labels`.
async fn collect(
    mut rx: tokio::sync::mpsc::Receiver<RunEvent>,
    labels: &[String],
    mode: Mode,
    outdir: Option<&Path>,
) -> std::io::Result<Vec<HostRecord>> {
    let keep_output = mode != Mode::Streamed || outdir.is_some();
    let mut pending: Vec<Pending> = labels.iter().map(|_| Pending::default()).collect();
    let mut done: Vec<Option<HostRecord>> = labels.iter().map(|_| None).collect();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = rx.recv().await {
        match event {
            RunEvent::Output { host, stream, data } => {
                let p = &mut pending[host];
                if mode == Mode::Streamed {
                    let (splitter, sink): (_, &mut dyn Write) = match stream {
                        Stream::Stdout => (&mut p.out_lines, &mut stdout),
                        Stream::Stderr => (&mut p.err_lines, &mut stderr),
                    };
                    for line in splitter.push(&data) {
                        write_line(sink, stream, &labels[host], &line)?;
                    }
                }
                if keep_output {
                    match stream {
                        Stream::Stdout => p.stdout.extend_from_slice(&data),
                        Stream::Stderr => p.stderr.extend_from_slice(&data),
                    }
                }
            }
            RunEvent::Notice { host, text } => {
                let _ = write_all(&mut stderr, &run_output::notice_line(&labels[host], &text));
            }
            RunEvent::Done {
                host,
                result,
                duration,
            } => {
                let mut p = std::mem::take(&mut pending[host]);
                let label = &labels[host];
                if mode == Mode::Streamed {
                    if let Some(line) = p.out_lines.finish() {
                        write_line(&mut stdout, Stream::Stdout, label, &line)?;
                    }
                    if let Some(line) = p.err_lines.finish() {
                        write_line(&mut stderr, Stream::Stderr, label, &line)?;
                    }
                }
                if let Err(e) = &result {
                    if mode != Mode::Json {
                        let _ = write_all(&mut stderr, &run_output::error_line(label, e));
                    }
                }
                let rec = HostRecord {
                    label: label.clone(),
                    stdout: p.stdout,
                    stderr: p.stderr,
                    result,
                    duration,
                };
                if let Some(dir) = outdir {
                    if let Err(e) = save_host_output(dir, &rec) {
                        eprintln!(
                            "skiff run: {label}: cannot save output in {}: {e}",
                            dir.display()
                        );
                    }
                }
                if mode == Mode::Json {
                    write_all(&mut stdout, run_output::json_line(&rec).as_bytes())?;
                }
                done[host] = Some(rec);
            }
        }
    }
    Ok(done.into_iter().flatten().collect())
}

/// Writes a line to stdout; a line for stderr that cannot be written is dropped.
fn write_line(
    sink: &mut dyn Write,
    stream: Stream,
    label: &str,
    line: &[u8],
) -> std::io::Result<()> {
    let r = write_all(sink, &run_output::prefixed_line(label, line));
    match stream {
        Stream::Stdout => r,
        Stream::Stderr => Ok(()),
    }
}

fn write_all(sink: &mut dyn Write, bytes: &[u8]) -> std::io::Result<()> {
    sink.write_all(bytes)?;
    sink.flush()
}

/// DIR/NAME.out and DIR/NAME.err, NAME being the host's label as one file
/// name that no other label shares, each written to a temporary file and
/// renamed into place, so an earlier good file is never half overwritten.
fn save_host_output(dir: &Path, rec: &HostRecord) -> std::io::Result<()> {
    let name = skiff_files::label_file_name(&rec.label);
    for (ext, bytes) in [("out", &rec.stdout), ("err", &rec.stderr)] {
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_data()?;
        tmp.persist(dir.join(format!("{name}.{ext}")))
            .map_err(|e| e.error)?;
    }
    Ok(())
}
