//! In-process exec rate through the engine's connection pool: `--concurrency`
//! commands in flight at once on warm connections, `--total` commands in all.
//! Used by bench/exec-rate; prints one line of figures. Not a test.
//!
//! cargo run --release -p skiff --example exec_rate -- \
//!     --port P --user U --key KEY --known-hosts KH [--concurrency 64] [--total 20000] [--command true]

use std::sync::Arc;
use std::time::Instant;

use skiff_engine::{Destination, ExecRequest, ExitOutcome, Pool};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let need = |n: &str| arg(&args, n).ok_or_else(|| anyhow::anyhow!("missing {n}"));
    let port: u16 = need("--port")?.parse()?;
    let concurrency: usize = arg(&args, "--concurrency").map_or(Ok(64), |v| v.parse())?;
    let total: usize = arg(&args, "--total").map_or(Ok(20_000), |v| v.parse())?;
    let command = arg(&args, "--command").unwrap_or_else(|| "true".into());
    let dest = Destination {
        host: arg(&args, "--host").unwrap_or_else(|| "127.0.0.1".into()),
        user: Some(need("--user")?),
        port: Some(port),
        identity_files: vec![need("--key")?.into()],
        config_file: Some("none".into()),
        options: vec![
            format!("UserKnownHostsFile={}", need("--known-hosts")?),
            "StrictHostKeyChecking=yes".into(),
            "IdentityAgent=none".into(),
            "BatchMode=yes".into(),
        ],
    };
    let settings = Arc::new(skiff_engine::settings::resolve(&dest)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let pool = Arc::new(Pool::new());
        let req = Arc::new(ExecRequest { command, ..Default::default() });
        // Warm up: one connection and one command before timing.
        let warm = pool.exec(&settings, &req, None::<tokio::io::Empty>, tokio::io::sink(), tokio::io::sink(), None).await?;
        anyhow::ensure!(warm == ExitOutcome::Status(0), "warm-up command failed: {warm:?}");
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..concurrency {
            let (pool, settings, req, next) = (pool.clone(), settings.clone(), req.clone(), next.clone());
            workers.push(tokio::spawn(async move {
                let mut failures = 0usize;
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                    let r = pool.exec(&settings, &req, None::<tokio::io::Empty>, tokio::io::sink(), tokio::io::sink(), None).await;
                    if !matches!(r, Ok(ExitOutcome::Status(0))) {
                        failures += 1;
                    }
                }
                failures
            }));
        }
        let mut failures = 0;
        for w in workers {
            failures += w.await?;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "exec_rate: {total} commands, {concurrency} concurrent, {:.2} s, {:.0} execs/s, {} connection(s), {failures} failed",
            secs,
            total as f64 / secs,
            pool.connection_count(&settings)
        );
        anyhow::Ok(())
    })
}
