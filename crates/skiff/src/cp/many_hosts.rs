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

use futures::stream::{FuturesUnordered, StreamExt};
use std::io::IsTerminal;

use skiff_engine::busy::retry_pre_auth_drops;
use skiff_engine::copy::{CopyJob, CopyReport, Direction, NoProgress, Progress};
use skiff_engine::{prompt_screen, Destination, SkiffError};
use skiff_proto::{nodeset, terminal_text};

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
    let groups = crate::cli_run::load_groups_from(args.groups_file.as_deref())?;
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
    let base = super::plan::base_destination(args);
    let env = skiff_engine::settings::ClientEnv::from_process();
    // As in `skiff run`: no host-key questions, a passphrase asked for once.
    let resolver =
        match skiff_engine::settings::Resolver::new(args.config.as_deref(), &base.options, &env) {
            Ok(r) => r.for_fan_out(),
            Err(e) => {
                eprintln!("skiff: {e}");
                return 255;
            }
        };
    let Some(runtime) = super::copy_runtime() else {
        return 255;
    };
    let plane = super::plane_of(args);
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = super::progress::Bar::new();
        bar.0.set_message(format!("0/{} hosts", plan.hosts.len()));
        HostsBar(bar)
    });
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let use_agent = super::agent_wanted(args);
    let limit = tokio::sync::Semaphore::new(usize::from(args.parallel));
    // Polled together on this thread: a host's copy starts when a slot is free.
    let mut copies: FuturesUnordered<_> = plan
        .hosts
        .iter()
        .map(|target| {
            let destination = Destination {
                host: target.host.clone(),
                user: target
                    .user
                    .clone()
                    .or_else(|| plan.user.clone())
                    .or_else(|| args.login.clone()),
                port: target.port.or(args.port),
                ..base.clone()
            };
            let settings = resolver.resolve(&destination);
            let label = target.to_string();
            let host_plan = Plan {
                job: job_for(&plan.job, &label),
                destination,
            };
            let (plane, limit) = (&plane, &limit);
            async move {
                let _slot = limit.acquire().await;
                // A server that closes the connection before authentication
                // (MaxStartups) is tried again, as in `skiff run`.
                let outcome: HostOutcome = match settings {
                    Ok(settings) => {
                        retry_pre_auth_drops(&settings, |settings| {
                            copy_one(&label, &host_plan, settings, plane, progress, use_agent)
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                (label, outcome)
            }
        })
        .collect();
    let results = runtime.block_on(async {
        let mut results = Vec::new();
        // Listening from the start, so a signal between two hosts counts.
        let interrupt = super::interrupted();
        tokio::pin!(interrupt);
        loop {
            tokio::select! {
                next = copies.next() => match next {
                    Some((label, outcome)) => {
                        results.push((label, outcome));
                        let (label, outcome) = results.last().expect("just pushed");
                        let report = HostReport::of(label, outcome);
                        let shown = bar.as_ref().map(|b| b.0 .0.clone());
                        // Not over a passphrase question another host's
                        // connection may have open, nor through the bar.
                        prompt_screen::print_outside_questions(move || match shown {
                            Some(b) => b.suspend(|| report.print()),
                            None => report.print(),
                        });
                        if let Some(b) = &bar {
                            b.0 .0.set_message(format!(
                                "{}/{} hosts",
                                results.len(),
                                plan.hosts.len()
                            ));
                        }
                    }
                    None => break Ok(results),
                },
                signal = &mut interrupt => break Err(signal),
            }
        }
    });
    drop(copies);
    if let Some(b) = &bar {
        b.0 .0.finish_and_clear();
    }
    runtime.shutdown_background();
    match results {
        Ok(results) => summarize(&plan.hosts, &results),
        Err(signal) => {
            eprintln!("skiff: interrupted; files not yet complete were not written");
            128 + signal
        }
    }
}

/// `job` for the host labelled `label`: a download goes into
/// `TARGET/NAME`, `NAME` being the label as one file name that no other
/// label shares.
fn job_for(job: &CopyJob, label: &str) -> CopyJob {
    let mut job = job.clone();
    if let Direction::Download { target, .. } = &mut job.direction {
        *target = target.join(skiff_files::label_file_name(label));
    }
    job
}

/// One host's copy: through the agent when it can, else directly.
async fn copy_one(
    label: &str,
    plan: &Plan,
    settings: skiff_engine::ConnectSettings,
    plane: &PlaneOptions,
    progress: &dyn Progress,
    use_agent: bool,
) -> Result<CopyReport, SkiffError> {
    if let Direction::Download { target, .. } = &plan.job.direction {
        if let Err(e) = std::fs::create_dir_all(target) {
            return Ok(CopyReport {
                failures: vec![format!("cannot create {}: {e}", target.display())],
                ..CopyReport::default()
            });
        }
    }
    if use_agent {
        if let Some(result) = super::one_host::via_agent(plan, &settings, plane, progress).await {
            return result;
        }
    }
    let conn = skiff_engine::connect(&settings).await?;
    let notices: Vec<String> = conn
        .notices
        .iter()
        .map(|n| format!("{label}: {}", terminal_text::lines(n)))
        .collect();
    prompt_screen::print_outside_questions(move || {
        for notice in notices {
            eprintln!("{notice}");
        }
    });
    super::one_host::copy_over(&conn, &settings, &plan.job, plane, progress).await
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
fn summarize(hosts: &[nodeset::Target], results: &[(String, HostOutcome)]) -> i32 {
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
    eprintln!("skiff: copied to {} of {} hosts", ok.len(), hosts.len());
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

    #[test]
    fn each_host_downloads_into_a_directory_of_its_own() {
        let job = CopyJob {
            direction: Direction::Download {
                sources: vec!["f".into()],
                target: "out".into(),
            },
            recursive: false,
            preserve: false,
        };
        let target = |label: &str| match job_for(&job, label).direction {
            Direction::Download { target, .. } => target,
            other => panic!("{other:?}"),
        };
        assert_eq!(target("web01"), std::path::Path::new("out/web01"));
        assert_eq!(target(".."), std::path::Path::new("out/%2E%2E"));
        assert_eq!(target("."), std::path::Path::new("out/%2E"));
        assert_eq!(target("a/b"), std::path::Path::new("out/a%2Fb"));
    }
}
