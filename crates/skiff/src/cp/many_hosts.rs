//! `skiff cp SRC... NODESET:PATH`: the same upload to every host of a node
//! set (`web[01-20]:/srv/app/`, `a,b:dir`, `@group:dir`), from one process,
//! at most `-j` hosts at a time, each over the data plane (skiffd) or SFTP
//! (any sshd), through the agent's warm connections when there is one.
//! `skiff cp NODESET:PATH... DIR` gathers from every host instead, each
//! host's files into `DIR/HOST/` (created), as `clush --rcopy` keeps them
//! apart; `HOST` is the host's label made one file name
//! ([`skiff_files::label_file_name`]: a host named `..` gets `DIR/%2E%2E/`).
//!
//! On a terminal (unless `-q`) one progress bar adds up every host's bytes.
//! Each host that finishes prints one line on stdout (`host: N files, B
//! bytes`); its failures go to stderr, named by host. A summary on stderr
//! folds the hosts by outcome. Exit status: 0 when every host got every
//! file, 1 when some files failed, 255 when a host could not be reached or
//! authenticated.
//!
//! The hosts are scheduled by the engine's fan-out
//! ([`skiff_engine::fanout`]), as `skiff run`'s are: so many at once, a
//! connection closed before authentication tried again. This module says
//! what one host's copy is ([`CopyToHosts`]) and prints what comes of it.

use std::io::IsTerminal;
use std::sync::Arc;

use skiff_engine::copy::{CopyJob, CopyReport, Direction, NoProgress, Progress, Temporaries};
use skiff_engine::fanout::{self, FanoutOptions, HostWork, Pace, RunEvent, Target};
use skiff_engine::{prompt_screen, ConnectSettings, Destination, SkiffError};
use skiff_proto::{nodeset, terminal_text};
use tokio::sync::mpsc::Sender;

use super::plan::Plan;
use super::{CpArgs, PlaneOptions};

/// An upload to, or a download from, several hosts.
#[derive(Debug)]
pub struct FanoutPlan {
    pub job: CopyJob,
    pub hosts: Vec<nodeset::Target>,
    /// The `user@` in front of the node set, for hosts that name none.
    pub user: Option<String>,
}

/// The hosts `set` names (groups from `--groups` or the default file).
pub(crate) fn plan(
    args: &CpArgs,
    direction: Direction,
    user: Option<String>,
    set: &str,
) -> Result<FanoutPlan, String> {
    let groups = args.groups.load()?;
    let lookup = |name: &str| groups.get(name).map(str::to_string);
    let mut hosts = nodeset::parse(set, &lookup).map_err(|e| e.to_string())?;
    nodeset::sort_canonical(&mut hosts);
    hosts.dedup();
    if hosts.is_empty() {
        return Err(format!("{set}: the host set is empty"));
    }
    Ok(FanoutPlan {
        job: super::plan::job(args, direction),
        hosts,
        user,
    })
}

/// How one host's copy ended: what it copied (perhaps with file
/// failures), or why nothing could be.
type HostOutcome = Result<CopyReport, SkiffError>;

pub(crate) fn run(args: &CpArgs, plan: FanoutPlan) -> i32 {
    // A host's own `user@` wins, then the one in front of the set, then -l.
    let base = args.conn.destination(args.port);
    let base = Destination {
        user: plan.user.clone().or(base.user),
        ..base
    };
    let env = skiff_engine::settings::ClientEnv::from_process();
    // As in `skiff run`: no host-key questions, a passphrase asked for once.
    let resolver = match skiff_engine::settings::Resolver::new(
        base.config_file.as_deref(),
        &base.options,
        &env,
    ) {
        Ok(r) => r.for_fan_out(),
        Err(e) => {
            eprintln!("skiff: {e}");
            return 255;
        }
    };
    let Some(runtime) = super::copy_runtime() else {
        return 255;
    };
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = super::progress::Bar::new();
        bar.0.set_message(format!("0/{} hosts", plan.hosts.len()));
        Arc::new(HostsBar(bar))
    });
    let (targets, plans): (Vec<Target>, Vec<Plan>) = plan
        .hosts
        .iter()
        .map(|host| {
            let destination = fanout::host_destination(host, &base);
            let label = host.to_string();
            let target = Target {
                settings: resolver.resolve(&destination),
                label: label.clone(),
            };
            let job = plan.job.for_host(&label);
            (target, Plan { job, destination })
        })
        .unzip();
    let labels: Vec<String> = targets.iter().map(|t| t.label.clone()).collect();
    let temps = Temporaries::new();
    let work = Arc::new(CopyToHosts {
        temps: temps.clone(),
        plans,
        plane: super::plane_of(args),
        progress: match &bar {
            Some(b) => b.clone(),
            None => Arc::new(NoProgress),
        },
        use_agent: super::agent_wanted(args),
    });
    let options = FanoutOptions {
        parallel: usize::from(args.parallel),
        connect_rate: None,
        spread: Vec::new(),
    };
    let results = runtime.block_on(async {
        let (events, mut received) = tokio::sync::mpsc::channel(64);
        // Stopped by a signal, listened for from the start so that one
        // between two hosts counts; the copies in progress are then dropped,
        // which removes the local temporaries of files not complete, and
        // the remote ones are removed over the channels still open.
        let copies = fanout::fan_out(targets, options, work, events, super::interrupted());
        tokio::pin!(copies);
        let mut results = Vec::new();
        let mut on_event = |event: RunEvent<CopyReport>| match event {
            RunEvent::Done { host, result, .. } => {
                let report = HostReport::of(&labels[host], &result);
                results.push((labels[host].clone(), result));
                print_outside_bar_and_questions(&bar, move || report.print());
                if let Some(b) = &bar {
                    b.0 .0
                        .set_message(format!("{}/{} hosts", results.len(), labels.len()));
                }
            }
            RunEvent::Notice { host, text } => {
                let line = format!("{}: {}", labels[host], terminal_text::lines(&text));
                print_outside_bar_and_questions(&bar, move || eprintln!("{line}"));
            }
            RunEvent::Output { .. } => {}
        };
        let stopped = loop {
            tokio::select! {
                stopped = &mut copies => break stopped,
                Some(event) = received.recv() => on_event(event),
            }
        };
        if let Some(signal) = stopped {
            return Err((signal, super::remove_temporaries(&temps).await));
        }
        // Every host is done: what they said last is still queued.
        while let Some(event) = received.recv().await {
            on_event(event);
        }
        Ok(results)
    });
    if let Some(b) = &bar {
        b.0 .0.finish_and_clear();
    }
    runtime.shutdown_background();
    match results {
        Ok(results) => summarize(&plan.job.direction, &plan.hosts, &results),
        Err((signal, removal)) => super::report_stop(signal, &removal),
    }
}

/// Runs `print` with the bar out of the way, and not over a passphrase
/// question another host's connection may have open.
fn print_outside_bar_and_questions(
    bar: &Option<Arc<HostsBar>>,
    print: impl FnOnce() + Send + 'static,
) {
    let shown = bar.as_ref().map(|b| b.0 .0.clone());
    prompt_screen::print_outside_questions(move || match shown {
        Some(b) => b.suspend(print),
        None => print(),
    });
}

/// The copy to or from each host of a node set: through the agent when it
/// can, else directly.
struct CopyToHosts {
    /// Each host's job and destination, by its number in the fan-out.
    plans: Vec<Plan>,
    plane: PlaneOptions,
    progress: Arc<dyn Progress>,
    use_agent: bool,
    /// Every host's remote temporaries in progress.
    temps: Temporaries,
}

impl HostWork for CopyToHosts {
    type Output = CopyReport;

    async fn run(
        &self,
        host: usize,
        settings: ConnectSettings,
        pace: &Pace,
        events: &Sender<RunEvent<CopyReport>>,
    ) -> HostOutcome {
        let plan = &self.plans[host];
        let progress = &*self.progress;
        if let Direction::Download { target, .. } = &plan.job.direction {
            if let Err(e) = std::fs::create_dir_all(target) {
                return Ok(CopyReport {
                    failures: vec![format!("cannot create {}: {e}", target.display())],
                    ..CopyReport::default()
                });
            }
        }
        if self.use_agent {
            if let Some(result) =
                super::one_host::via_agent(plan, &settings, &self.plane, progress, &self.temps)
                    .await
            {
                return result;
            }
        }
        pace.new_connection().await;
        let mut conn = skiff_engine::connect(&settings).await?;
        for text in conn.notices.drain(..) {
            let _ = events.send(RunEvent::Notice { host, text }).await;
        }
        let copied = super::one_host::copy_over(
            &conn,
            &settings,
            &plan.job,
            &self.plane,
            progress,
            &self.temps,
        )
        .await;
        conn.goodbye().await;
        copied
    }
}

/// One bar for every host's bytes; its message counts finished hosts
/// (file names from many hosts at once would only flicker).
struct HostsBar(super::progress::Bar);

impl Progress for HostsBar {
    fn add_total(&self, bytes: u64) {
        self.0.add_total(bytes);
    }

    fn advance(&self, bytes: u64) {
        self.0.advance(bytes);
    }

    fn file_done(&self, _path: &str) {}
}

/// What a finished host prints: its line on stdout, its failures on stderr.
struct HostReport {
    stdout: Option<String>,
    stderr: Vec<String>,
}

impl HostReport {
    fn of(label: &str, outcome: &HostOutcome) -> HostReport {
        match outcome {
            Ok(r) => {
                let failed = if r.failures.is_empty() {
                    String::new()
                } else {
                    format!(", {} failed", r.failures.len())
                };
                HostReport {
                    stdout: Some(format!(
                        "{label}: {} files, {} bytes{failed}",
                        r.files, r.bytes
                    )),
                    // A failure names a path (perhaps one the server
                    // listed) and may carry the server's own words.
                    stderr: r
                        .failures
                        .iter()
                        .map(|f| format!("skiff: {label}: {}", terminal_text::one_line(f)))
                        .collect(),
                }
            }
            Err(e) => HostReport {
                stdout: None,
                stderr: vec![format!("skiff: {label}: {e}")],
            },
        }
    }

    fn print(&self) {
        if let Some(line) = &self.stdout {
            println!("{line}");
        }
        for line in &self.stderr {
            eprintln!("{line}");
        }
    }
}

/// The summary on stderr, and the exit status.
fn summarize(
    direction: &Direction,
    hosts: &[nodeset::Target],
    results: &[(String, HostOutcome)],
) -> i32 {
    let mut ok = Vec::new();
    let mut partial = Vec::new();
    let mut failed = Vec::new();
    for (label, outcome) in results {
        match outcome {
            Ok(r) if r.failures.is_empty() => ok.push(label.clone()),
            Ok(_) => partial.push(label.clone()),
            Err(_) => failed.push(label.clone()),
        }
    }
    let line = |what: &str, labels: &[String]| {
        if !labels.is_empty() {
            eprintln!(
                "skiff: {what} ({}): {}",
                labels.len(),
                nodeset::fold(labels)
            );
        }
    };
    let way = match direction {
        Direction::Upload { .. } => "to",
        Direction::Download { .. } => "from",
    };
    eprintln!("skiff: copied {way} {} of {} hosts", ok.len(), hosts.len());
    line("some files failed", &partial);
    line("not copied (no connection, host key or login)", &failed);
    if !failed.is_empty() {
        255
    } else if !partial.is_empty() {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_engine::ErrorKind;

    #[test]
    fn a_hosts_report_shows_the_servers_words_escaped() {
        let report = CopyReport {
            files: 1,
            bytes: 3,
            failures: vec!["no-such-\u{1b}[2Jfile: No such file\r".into()],
            ..CopyReport::default()
        };
        let shown = HostReport::of("h1", &Ok(report));
        assert_eq!(
            shown.stdout.as_deref(),
            Some("h1: 1 files, 3 bytes, 1 failed")
        );
        assert_eq!(
            shown.stderr,
            ["skiff: h1: no-such-\\u{1b}[2Jfile: No such file\\r"]
        );
        let failed = Err(SkiffError::new(
            ErrorKind::Protocol,
            "bye\u{1b}[1A\u{1b}[2K",
        ));
        let shown = HostReport::of("h2", &failed);
        assert_eq!(shown.stderr, ["skiff: h2: bye\\u{1b}[1A\\u{1b}[2K"]);
    }
}
