//! One host's copy: through the agent's warm connection when there is one
//! (the agent opens the subsystem, the data plane's streams go straight to
//! the server), else on a connection of its own; Ctrl-C and friends stop
//! it with the temporaries of files not complete removed (the local ones
//! as the copy is dropped, the remote ones through the engine's
//! [`Temporaries`] while the connection is still open).

use skiff_engine::copy::dataplane::Attempted;
use skiff_engine::copy::{CopyJob, CopyReport, NoProgress, Progress, Temporaries};
use skiff_engine::{Connection, Destination, ErrorKind, SkiffError};

use super::plan::Plan;
use super::progress::Bar;
use super::{interrupted, stopped, CipherMode, Finish, PlaneOptions};

pub(super) async fn cp_main(
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
    // A stopped copy's bar goes, so that what is said next starts its line.
    let clear = || {
        if let Some(b) = &bar {
            b.0.finish_and_clear();
        }
    };
    let temps = Temporaries::new();
    if use_agent {
        // Stopping the copy drops it, which removes the local temporaries
        // of files not complete; the remote ones are removed over the
        // agent's channels, which stay open until then.
        let through_agent = tokio::select! {
            r = via_agent(plan, &settings, plane, progress, &temps) => r,
            signal = interrupted() => {
                clear();
                return Ok(stopped(signal, &temps).await);
            }
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
    let copied = tokio::select! {
        report = copy_over(&conn, &settings, &plan.job, plane, progress, &temps) => report,
        signal = interrupted() => {
            clear();
            return Ok(stopped(signal, &temps).await);
        }
    };
    conn.goodbye().await;
    finish(copied)
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
        inline: true,
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
    temps: &Temporaries,
) -> Option<Result<CopyReport, SkiffError>> {
    let host = settings.original_host.clone();
    // A small upload goes on the data plane's channel alone; a skiffd that
    // refuses that gets the copy again with streams, on a new channel.
    let mut inline = true;
    // A spare channel the server closed as the request met it (its own
    // timeout for idle channels) started nothing: the copy is sent again,
    // once, on a channel of its own.
    let mut sent_again = false;
    let mut names = std::collections::VecDeque::from([skiff_proto::dataplane::SUBSYSTEM, "sftp"]);
    while let Some(name) = names.pop_front() {
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
                &mut |opened| {
                    if let Some(t) = opened_tx.take() {
                        let _ = t.send(opened);
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
            Ok(opened) if name == "sftp" => {
                let mode = plane_options(plane, settings).mode;
                if let Some(line) = skiff_engine::copy::sftp_fallback_notice(&host, mode) {
                    eprintln!("skiff: {line}");
                }
                let more = AgentChannels(agent_wire(&plan.destination, "sftp"));
                skiff_engine::copy::sftp::copy_on(
                    ours,
                    &host,
                    opened.server,
                    &plan.job,
                    settings.progress_budget(),
                    Some(&more),
                    plane.streams.map(usize::from),
                    progress,
                    temps,
                )
                .await
            }
            Ok(opened) => match server_address(settings).await {
                Ok(addr) => {
                    let options = skiff_engine::copy::dataplane::PlaneOptions {
                        inline,
                        ..plane_options(plane, settings)
                    };
                    match skiff_engine::copy::dataplane::copy_on(
                        ours, &host, addr, &plan.job, &options, opened, progress,
                    )
                    .await
                    {
                        Ok(Attempted::Copied(report)) => Ok(report),
                        Ok(Attempted::InlineRefused) => {
                            tracing::debug!(
                                "{host}: the server refused a copy on the channel alone; copying with streams"
                            );
                            // The refused channel ends with our end; the
                            // agent's answer for it says nothing new.
                            let _ = rx.await;
                            inline = false;
                            names.push_front(name);
                            continue;
                        }
                        Err(e) => Err(e),
                    }
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
        use crate::route::{self, Answer};
        use skiff_proto::agent_wire::Reply;
        match (copied, route::answer(outcome)) {
            (Ok(report), _) => return Some(Ok(report)),
            (Err(_), Answer::Direct) => return None,
            (Err(_), Answer::Agent(Reply::Failed { kind, .. }))
                if route::refused(kind) && name != "sftp" =>
            {
                tracing::debug!("{host}: no skiff data plane through the agent; using SFTP");
                continue;
            }
            (Err(_), Answer::Agent(Reply::Failed { kind, .. }))
                if route::closed_before_start(kind) && !sent_again =>
            {
                tracing::debug!("{host}: the server closed the channel before the copy started; sending it again");
                sent_again = true;
                names.push_front(name);
                continue;
            }
            (Err(e), Answer::Agent(Reply::Failed { message, kind }))
                if e.kind == ErrorKind::Connect || route::refused(kind) =>
            {
                // Our end is the agent's channel: when it gave out, or the
                // server refused to start the subsystem, the agent knows why.
                return Some(Err(route::failure(kind, message)));
            }
            (Err(e), _) => return Some(Err(e)),
        }
    }
    None
}

/// More SFTP channels on the agent's connection, for an upload spread over
/// several: each is asked for as the first was (the agent opens it and
/// hands it over a socket pair); one the server refuses is done without.
struct AgentChannels(skiff_proto::agent_wire::ExecWire);

impl skiff_engine::copy::sftp::MoreChannels for AgentChannels {
    fn open(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<Box<dyn skiff_engine::copy::sftp::SftpStream>, String>>
    {
        let wire = self.0.clone();
        Box::pin(async move {
            let (ours, theirs) =
                std::os::unix::net::UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
            let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            // The thread holds the agent's request until the channel ends
            // (our end closed), as the first channel's does.
            std::thread::spawn(move || {
                let mut opened_tx = Some(opened_tx);
                let outcome = skiff_agent::client::subsystem_announced(
                    wire,
                    std::os::fd::AsFd::as_fd(&theirs),
                    &mut |_opened| {
                        if let Some(t) = opened_tx.take() {
                            let _ = t.send(());
                        }
                    },
                );
                drop(theirs);
                let _ = done_tx.send(outcome);
            });
            if opened_rx.await.is_err() {
                return Err(match done_rx.await {
                    Ok(outcome) => format!("the agent did not open it: {outcome:?}"),
                    Err(_) => "the agent thread ended".into(),
                });
            }
            ours.set_nonblocking(true)
                .and_then(|_| tokio::net::UnixStream::from_std(ours))
                .map(|s| Box::new(s) as Box<dyn skiff_engine::copy::sftp::SftpStream>)
                .map_err(|e| format!("socket pair: {e}"))
        })
    }
}

/// The agent request that starts `subsystem` at the destination.
fn agent_wire(dest: &Destination, subsystem: &str) -> skiff_proto::agent_wire::ExecWire {
    skiff_proto::agent_wire::ExecWire {
        command: subsystem.to_string(),
        subsystem: true,
        ..crate::route::agent_destination(dest)
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
    temps: &Temporaries,
) -> Result<CopyReport, SkiffError> {
    let options = plane_options(plane, settings);
    skiff_engine::copy::copy(
        conn,
        job,
        &options,
        progress,
        &|line| eprintln!("skiff: {line}"),
        temps,
    )
    .await
}
