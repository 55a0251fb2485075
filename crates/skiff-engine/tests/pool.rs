//! The engine's connection pool against real servers: many concurrent
//! commands share warm connections; OpenSSH's `MaxSessions 10` refusals move
//! commands to more connections transparently; a restarted server is
//! reconnected to. Every command's own output and exit status are checked.

use std::sync::Arc;
use std::time::Duration;

use skiff_engine::{ConnectSettings, Destination, ExecRequest, ExitOutcome, Pool};
use skiff_testkit::*;

/// Client settings for the fixture's key, with a private known_hosts that
/// accepts the server's key on first use.
fn settings(port: u16, fx: &Fixture, kh: &std::path::Path) -> ConnectSettings {
    let dest = Destination {
        host: "127.0.0.1".into(),
        user: Some(user().to_string()),
        port: Some(port),
        identity_files: vec![fx.client_key.private.clone()],
        config_file: Some("none".into()),
        options: vec![
            format!("UserKnownHostsFile={}", kh.display()),
            "GlobalKnownHostsFile=none".into(),
            "StrictHostKeyChecking=accept-new".into(),
            "IdentityAgent=none".into(),
            "IdentitiesOnly=yes".into(),
            "BatchMode=yes".into(),
        ],
    };
    skiff_engine::settings::resolve(&dest).expect("settings resolve")
}

/// Runs `command` through the pool and returns (outcome, stdout, stderr).
async fn run(pool: &Pool, s: &ConnectSettings, command: String) -> (ExitOutcome, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let req = ExecRequest {
        command,
        ..Default::default()
    };
    let outcome = pool
        .exec(s, &req, None::<tokio::io::Empty>, &mut out, &mut err, None)
        .await
        .unwrap_or_else(|e| panic!("pooled exec failed: {e}"));
    (
        outcome,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// `n` concurrent commands, each printing its own number and exiting with
/// n % 7. Each holds its session until all `n` have started (a file per
/// command in a shared directory; at most 30 s), so that all are open at
/// once however slowly a loaded machine starts them.
async fn concurrent(pool: Arc<Pool>, s: Arc<ConnectSettings>, n: usize) {
    let started = account_dir();
    let dir = started.path().display().to_string();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (pool, s) = (pool.clone(), s.clone());
        let cmd = format!(
            "echo job-{i}; touch '{dir}/{i}'; w=0; \
             while [ \"$(ls '{dir}' | wc -l)\" -lt {n} ] && [ $w -lt 600 ]; do sleep 0.05; w=$((w+1)); done; \
             exit {}",
            i % 7
        );
        tasks.push(tokio::spawn(async move { (i, run(&pool, &s, cmd).await) }));
    }
    for t in tasks {
        let (i, (outcome, out, err)) = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("pooled commands finish in bounded time")
            .expect("task did not panic");
        assert_eq!(out, format!("job-{i}\n"), "job {i} stdout (stderr: {err})");
        assert_eq!(
            outcome,
            ExitOutcome::Status((i % 7) as u32),
            "job {i} exit status"
        );
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn fifty_concurrent_commands_through_sshd_max_sessions_10() {
    let Some((fx, sshd)) = sshd_setup(&["MaxSessions 10", "MaxStartups 100"]) else {
        return;
    };
    let kh = fx.path().join("pool_known_hosts");
    let s = Arc::new(settings(sshd.port(), &fx, &kh));
    let pool = Arc::new(Pool::new());
    runtime().block_on(concurrent(pool.clone(), s.clone(), 50));
    // 50 commands held open together need at least 5 connections of 10 sessions,
    // and the pool must not have opened one per command.
    let conns = pool.connection_count(&s);
    assert!(
        (5..=25).contains(&conns),
        "sshd MaxSessions 10, 50 concurrent: {conns} connections"
    );
    // The known_hosts file got exactly one entry despite the burst of connects.
    let text = std::fs::read_to_string(&kh).expect("known_hosts written");
    assert_eq!(
        text.lines().count(),
        1,
        "one known_hosts line, got:\n{text}"
    );
}

/// A skiffd, client settings for it and an empty pool.
struct PoolSetup {
    s: Arc<ConnectSettings>,
    pool: Arc<Pool>,
    rt: tokio::runtime::Runtime,
    _skiffd: Skiffd,
    _fx: Fixture,
}

fn skiffd_pool() -> Option<PoolSetup> {
    let (fx, skiffd) = skiffd_setup()?;
    let kh = fx.path().join("pool_known_hosts");
    Some(PoolSetup {
        s: Arc::new(settings(skiffd.port(), &fx, &kh)),
        pool: Arc::new(Pool::new()),
        rt: runtime(),
        _skiffd: skiffd,
        _fx: fx,
    })
}

#[test]
fn commands_share_one_connection_to_skiffd() {
    let Some(setup) = skiffd_pool() else {
        return;
    };
    let (s, pool, rt) = (setup.s.clone(), setup.pool.clone(), &setup.rt);
    rt.block_on(concurrent(pool.clone(), s.clone(), 64));
    assert_eq!(
        pool.connection_count(&s),
        1,
        "skiffd allows 256 sessions: one connection suffices"
    );
    rt.block_on(async {
        for i in 0..50 {
            let (outcome, out, _) = run(&pool, &s, format!("echo seq-{i}")).await;
            assert_eq!(
                (outcome, out),
                (ExitOutcome::Status(0), format!("seq-{i}\n"))
            );
        }
    });
    assert_eq!(
        pool.connection_count(&s),
        1,
        "sequential commands reuse the warm connection"
    );
    let info = pool.connections();
    assert_eq!(info.len(), 1);
    assert_eq!(
        info[0].open_channels, 0,
        "finished commands release their channel slots"
    );
}

#[test]
fn pool_reconnects_after_the_server_restarts() {
    let Some((fx, mut skiffd)) = skiffd_setup() else {
        return;
    };
    let kh = fx.path().join("pool_known_hosts");
    let s = settings(skiffd.port(), &fx, &kh);
    let pool = Pool::new();
    let rt = runtime();
    rt.block_on(async {
        let (outcome, out, _) = run(&pool, &s, "echo before".into()).await;
        assert_eq!(
            (outcome, out.as_str()),
            (ExitOutcome::Status(0), "before\n")
        );
    });
    skiffd.restart();
    // The pooled connection died with the server. Opening a channel on it fails
    // before anything runs, so the pool reconnects and the command runs once.
    rt.block_on(async {
        let (outcome, out, _) = run(&pool, &s, "echo after".into()).await;
        assert_eq!((outcome, out.as_str()), (ExitOutcome::Status(0), "after\n"));
    });
    assert_eq!(
        pool.connection_count(&s),
        1,
        "the dead connection was replaced, not kept"
    );
}

/// Starts `sleep 2; echo still-here` through a pool on a skiffd, then,
/// once that holds a channel, the command `stuck` starts (one that cannot
/// make progress), and checks that the first still finishes, on the same
/// connection, while `stuck` runs on.
fn finishes_beside<F, Fut>(stuck: F)
where
    F: FnOnce(Arc<Pool>, Arc<ConnectSettings>) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let Some(setup) = skiffd_pool() else {
        return;
    };
    let (s, pool, rt) = (setup.s.clone(), setup.pool.clone(), &setup.rt);
    rt.block_on(async {
        let patient = {
            let (pool, s) = (pool.clone(), s.clone());
            tokio::spawn(async move { run(&pool, &s, "sleep 2; echo still-here".into()).await })
        };
        for _ in 0..200 {
            if pool.connections().iter().any(|c| c.open_channels == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let stuck = tokio::spawn(stuck(pool.clone(), s.clone()));
        let (outcome, out, err) = tokio::time::timeout(Duration::from_secs(30), patient)
            .await
            .expect("the other command finishes while this one is stuck")
            .expect("task did not panic");
        assert_eq!(
            (outcome, out.as_str()),
            (ExitOutcome::Status(0), "still-here\n"),
            "stderr: {err}"
        );
        assert_eq!(
            pool.connection_count(&s),
            1,
            "both commands ran on the one connection"
        );
        assert!(!stuck.is_finished(), "the stuck command cannot have ended");
        stuck.abort();
    });
}

/// A command whose output nobody reads does not hold up another command on
/// the same connection: skiff queues the output and asks skiffd to pause the
/// command's output meanwhile, so the connection keeps moving. (A stock sshd
/// cannot be asked; there a reader that stays behind still holds up its
/// connection once 8 MiB are queued.)
#[test]
fn a_stopped_reader_does_not_hold_up_its_connection_to_skiffd() {
    finishes_beside(|pool, s| async move {
        // 256 MiB into a pipe whose reading end is kept but never read.
        let (stuck, _unread) = tokio::io::duplex(64 * 1024);
        let req = ExecRequest {
            command: "head -c 268435456 /dev/zero".into(),
            ..Default::default()
        };
        pool.exec(
            &s,
            &req,
            None::<tokio::io::Empty>,
            stuck,
            tokio::io::sink(),
            None,
        )
        .await
    });
}

/// A command that does not read its input does not hold up another command
/// on the same connection: skiffd reports how much input each command has
/// read, and skiff keeps at most 48 MiB ahead of that, below skiffd's
/// 64 MiB input backlog (past which skiffd's connection would wait).
#[test]
fn an_unread_input_does_not_hold_up_its_connection_to_skiffd() {
    finishes_beside(|pool, s| async move {
        use tokio::io::AsyncReadExt;
        // 1 GiB offered to a command that never reads it.
        let req = ExecRequest {
            command: "sleep 60".into(),
            ..Default::default()
        };
        let input = tokio::io::repeat(b'a').take(1 << 30);
        pool.exec(
            &s,
            &req,
            Some(input),
            tokio::io::sink(),
            tokio::io::sink(),
            None,
        )
        .await
    });
}

// Spare session channels (`Pool::with_spare_sessions`, the agent's pool):
// a channel opened ahead for the next command on each connection.

/// A spare lifetime no test waits out.
const LONG_LIFE: Duration = Duration::from_secs(3600);

/// Runs `echo NAME` and checks that it printed NAME and exited 0.
async fn echo(pool: &Pool, s: &ConnectSettings, name: &str) {
    let (outcome, out, err) = run(pool, s, format!("echo {name}")).await;
    assert_eq!(
        (outcome, out.as_str()),
        (ExitOutcome::Status(0), format!("{name}\n").as_str()),
        "echo {name} (stderr: {err})"
    );
}

/// The single pooled connection's status.
fn only_connection(pool: &Pool) -> skiff_engine::pool::ConnectionInfo {
    let mut info = pool.connections();
    assert_eq!(info.len(), 1, "one pooled connection: {info:?}");
    info.remove(0)
}

/// Settings for a server on `port` and a pool whose spares live `lifetime`.
fn spare_pool(port: u16, fx: &Fixture, lifetime: Duration) -> (ConnectSettings, Pool) {
    let kh = fx.path().join("pool_known_hosts");
    (settings(port, fx, &kh), Pool::with_spare_sessions(lifetime))
}

/// Runs a first command, which opens its own channel and a spare beside
/// it, and waits for the spare to be parked.
async fn first_command_parks_a_spare(pool: &Pool, s: &ConnectSettings) {
    echo(pool, s, "first").await;
    assert!(
        within_a_minute("the spare settles", pool.spare_settled(s)).await,
        "a spare is parked after the first command"
    );
}

/// Waits (at most 60 s) for `what` to happen.
async fn within_a_minute<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} within a minute"))
}

#[test]
fn warm_commands_start_on_channels_opened_ahead_to_skiffd() {
    let Some((fx, skiffd)) = skiffd_setup() else {
        return;
    };
    let (s, pool) = spare_pool(skiffd.port(), &fx, LONG_LIFE);
    runtime().block_on(async {
        first_command_parks_a_spare(&pool, &s).await;
        assert_eq!(only_connection(&pool).spares_taken, 0);
        for i in 0..5 {
            echo(&pool, &s, &format!("warm-{i}")).await;
            assert!(
                within_a_minute("the next spare settles", pool.spare_settled(&s)).await,
                "a new spare is parked after warm command {i}"
            );
        }
    });
    let info = only_connection(&pool);
    assert_eq!(
        info.spares_taken, 5,
        "each warm command started on the spare: {info:?}"
    );
    assert!(info.spare, "{info:?}");
    assert_eq!(info.open_channels, 0, "{info:?}");
}

/// Spares and OpenSSH's `MaxSessions 10`: a spare counts against the limit,
/// so 50 concurrent commands still spread over connections as they would
/// without spares, each with its own output and status.
#[test]
fn fifty_concurrent_commands_with_spares_through_sshd_max_sessions_10() {
    let Some((fx, sshd)) = sshd_setup(&["MaxSessions 10", "MaxStartups 100"]) else {
        return;
    };
    let kh = fx.path().join("pool_known_hosts");
    let s = Arc::new(settings(sshd.port(), &fx, &kh));
    let pool = Arc::new(Pool::with_spare_sessions(LONG_LIFE));
    let rt = runtime();
    rt.block_on(concurrent(pool.clone(), s.clone(), 50));
    let conns = pool.connection_count(&s);
    assert!(
        (5..=25).contains(&conns),
        "sshd MaxSessions 10, 50 concurrent: {conns} connections"
    );
    // And sequential commands afterwards run, on the connections there are.
    rt.block_on(async {
        for i in 0..3 {
            echo(&pool, &s, &format!("after-{i}")).await;
        }
    });
    assert_eq!(pool.connection_count(&s), conns, "no connection added");
}

/// A server that allows one session per connection refuses the spare: the
/// pool learns the limit from that refusal, asks for no more spares, and
/// the next command opens its channel on the same connection.
#[test]
fn a_refused_spare_teaches_the_limit_and_is_not_asked_again() {
    let Some((fx, sshd)) = sshd_setup(&["MaxSessions 1"]) else {
        return;
    };
    let kh = fx.path().join("pool_known_hosts");
    let s = Arc::new(settings(sshd.port(), &fx, &kh));
    let pool = Arc::new(Pool::with_spare_sessions(LONG_LIFE));
    let marks = account_dir();
    let (running, release) = (marks.path().join("running"), marks.path().join("release"));
    runtime().block_on(async {
        // A command that holds its session until the test releases it (at
        // most 30 s), so the spare is asked for while it is open.
        let held = tokio::spawn({
            let (pool, s) = (pool.clone(), s.clone());
            let cmd = format!(
                "touch '{}'; w=0; while [ ! -e '{}' ] && [ $w -lt 600 ]; do sleep 0.05; w=$((w+1)); done; echo held",
                running.display(),
                release.display()
            );
            async move { run(&pool, &s, cmd).await }
        });
        within_a_minute("the held command starts", async {
            while !running.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            !within_a_minute("the spare settles", pool.spare_settled(&s)).await,
            "sshd refused the spare"
        );
        assert_eq!(only_connection(&pool).learned_limit, Some(1));
        std::fs::write(&release, "").expect("release the held command");
        let (outcome, out, err) = within_a_minute("the held command ends", held)
            .await
            .expect("task");
        assert_eq!(
            (outcome, out.as_str()),
            (ExitOutcome::Status(0), "held\n"),
            "{err}"
        );
        echo(&pool, &s, "next").await;
        assert!(
            !pool.spare_settled(&s).await,
            "no spare asked for at the learned limit"
        );
    });
    assert_eq!(pool.connection_count(&s), 1, "one connection sufficed");
    assert_eq!(only_connection(&pool).spares_taken, 0);
}

/// A skiffd that closes a session channel after `secs` seconds without
/// traffic (`ChannelTimeout session=`), counted from its open.
fn skiffd_timing_out_sessions(secs: u32) -> (Fixture, Skiffd) {
    let fx = Fixture::new();
    let config = format!("ChannelTimeout session={secs}s\n");
    let skiffd =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    (fx, skiffd)
}

/// A spare the server closes (skiffd's `ChannelTimeout`, which counts a
/// session channel that never carried data as idle; OpenSSH 9.2's does not
/// time such a channel out) is let go, and not replaced until a command
/// needs a channel; that command opens its own. The pool learns from the
/// close how long skiffd keeps an unused channel (4 s here) and lets the
/// next spare go itself half a second and a round trip before that, so
/// skiffd times out no other channel.
#[test]
fn a_spare_the_server_times_out_is_let_go_and_the_next_one_sooner() {
    let (fx, skiffd) = skiffd_timing_out_sessions(4);
    let timeouts = || {
        skiffd
            .log()
            .matches("without traffic (ChannelTimeout)")
            .count()
    };
    let (s, pool) = spare_pool(skiffd.port(), &fx, LONG_LIFE);
    runtime().block_on(async {
        first_command_parks_a_spare(&pool, &s).await;
        within_a_minute("skiffd closes the idle spare", pool.spare_gone(&s)).await;
        assert!(!only_connection(&pool).spare);
        echo(&pool, &s, "second").await;
        assert!(
            within_a_minute("the next spare settles", pool.spare_settled(&s)).await,
            "a command that opened its own channel opens a spare beside it"
        );
        // The pool lets this one go before skiffd would.
        within_a_minute("the pool lets the next spare go", pool.spare_gone(&s)).await;
        // skiffd reads the close before this command's request.
        echo(&pool, &s, "third").await;
    });
    assert_eq!(
        timeouts(),
        1,
        "skiffd timed out the first spare alone:\n{}",
        skiffd.log()
    );
    let info = only_connection(&pool);
    assert_eq!(info.spares_taken, 0, "{info:?}");
}

/// A spare not used within its lifetime is closed by the pool itself, so a
/// server's `UnusedConnectionTimeout` still sees an unused connection.
#[test]
fn a_spare_past_its_lifetime_is_closed() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let (s, pool) = spare_pool(sshd.port(), &fx, Duration::from_millis(500));
    runtime().block_on(async {
        echo(&pool, &s, "first").await;
        // Whether the spare was parked before it expired depends on the
        // machine's speed; either way it is gone within its lifetime.
        within_a_minute("the spare settles", pool.spare_settled(&s)).await;
        within_a_minute("the spare expires", pool.spare_gone(&s)).await;
        // sshd saw the client close it: two sessions closed, the first
        // command's and the spare's, before any other command.
        within_a_minute("sshd logs the spare's close", async {
            while sshd.log().matches("Close session:").count() < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        echo(&pool, &s, "second").await;
    });
    assert_eq!(only_connection(&pool).spares_taken, 0);
}

/// A connection the pool forgets (`ssh -O stop`) closes even with a spare
/// parked on it: the spare's keeper lets the channel go with its slot.
#[test]
fn a_forgotten_connection_with_a_spare_closes() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let (s, pool) = spare_pool(sshd.port(), &fx, LONG_LIFE);
    let rt = runtime();
    rt.block_on(async {
        first_command_parks_a_spare(&pool, &s).await;
        assert_eq!(pool.forget_destination(&s), 1);
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !sshd.log().contains("Closing connection to") {
        assert!(
            std::time::Instant::now() < deadline,
            "sshd saw the forgotten connection close:\n{}",
            sshd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The race a spare can lose: the server times the spare out while a
/// command's request is on its way. Through a relay with 1 s each way, to
/// a skiffd with `ChannelTimeout session=3s` (a fresh channel's request
/// arrives 2 s after its open, in time): the spare is parked 1 s after
/// skiffd opened it, the second command is sent 1.8 s later, skiffd closes
/// the spare at 3 s, the request arrives at 3.8 s and the close reaches the
/// client at 4 s. Nothing ran, so the command runs on a channel of its
/// own, once, with its output and status.
#[test]
fn a_command_whose_spare_was_closed_on_the_way_runs_on_its_own_channel() {
    let (fx, skiffd) = skiffd_timing_out_sessions(3);
    let marks = account_dir();
    let ran = marks.path().join("ran");
    let relay = DelayRelay::start(skiffd.port(), Duration::from_secs(1));
    runtime().block_on(async {
        let (s, pool) = spare_pool(relay.port(), &fx, LONG_LIFE);
        first_command_parks_a_spare(&pool, &s).await;
        // Into the window where skiffd has closed the spare and the client
        // cannot know yet (0.8 s of margin each side).
        tokio::time::sleep(Duration::from_millis(1800)).await;
        // Appends a line each time it runs.
        let (outcome, out, err) = within_a_minute(
            "the second command",
            run(
                &pool,
                &s,
                format!("echo once >> '{}'; echo second", ran.display()),
            ),
        )
        .await;
        assert_eq!(
            (outcome, out.as_str()),
            (ExitOutcome::Status(0), "second\n"),
            "{err}"
        );
        assert_eq!(only_connection(&pool).spares_taken, 1, "it took the spare");
    });
    assert_eq!(
        std::fs::read_to_string(&ran).expect("the command ran"),
        "once\n",
        "the command ran exactly once"
    );
    let log = skiffd.log();
    assert!(
        log.contains("without traffic (ChannelTimeout)"),
        "skiffd closed the spare before the request reached it:\n{log}"
    );
}
