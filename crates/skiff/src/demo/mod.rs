//! `skiff demo`: a self-contained tour. Starts the `skiffd` beside this
//! `skiff` (`skiffd.rs`) on a free loopback port with throwaway host and
//! client keys in a private temporary directory, then runs a few commands
//! through the real client path, times cold connections and copies a file
//! up and back over the data plane. Nothing in ~/.ssh is read or changed.

mod skiffd;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, PrivateKey};
use skiff_engine::{Destination, ExecRequest};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How many cold connections to time.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
}

pub fn run(args: DemoArgs) -> i32 {
    crate::logging::init(0, None);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skiff demo: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(demo(args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("skiff demo: {e:#}");
            1
        }
    }
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("skiff-demo-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    let host_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)?;
    let host_key_path = dir.path().join("host_ed25519");
    write_private(&host_key_path, &host_key.to_openssh(LineEnding::LF)?)?;
    let client_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)?;
    let client_key_path = dir.path().join("client_ed25519");
    write_private(&client_key_path, &client_key.to_openssh(LineEnding::LF)?)?;
    let authorized = dir.path().join("authorized_keys");
    write_private(
        &authorized,
        &format!("{}\n", client_key.public_key().to_openssh()?),
    )?;

    let server = skiffd::DemoSkiffd::start(dir.path(), &host_key_path, &authorized).await?;
    let toured = tour(args, dir.path(), server.port(), client_key_path).await;
    let log = server.log();
    drop(server);
    if !log.trim().is_empty() {
        eprint!("skiffd's log:\n{log}");
    }
    toured
}

/// The tour itself, against the skiffd on 127.0.0.1:`port`.
async fn tour(
    args: DemoArgs,
    dir: &Path,
    port: u16,
    client_key_path: PathBuf,
) -> anyhow::Result<()> {
    let user = skiff_engine::settings::local_user();
    println!(
        "skiffd listening on 127.0.0.1:{port} (throwaway keys in {})",
        dir.display()
    );
    let dest = Destination {
        host: "127.0.0.1".into(),
        user: Some(user.clone()),
        port: Some(port),
        identity_files: vec![client_key_path],
        config_file: Some("none".into()),
        options: vec![
            format!("UserKnownHostsFile={}", dir.join("known_hosts").display()),
            "StrictHostKeyChecking=accept-new".into(),
            "IdentityAgent=none".into(),
            "BatchMode=yes".into(),
        ],
    };
    let settings = skiff_engine::settings::resolve(&dest)?;

    for command in [
        "echo hello from $(hostname) as $(id -un)",
        "uname -sr",
        "sh -c 'echo to stderr >&2; exit 3'",
    ] {
        let conn = skiff_engine::connect(&settings).await?;
        let mut out = Vec::new();
        let mut err = Vec::new();
        let req = ExecRequest {
            command: command.into(),
            ..Default::default()
        };
        let outcome = skiff_engine::exec(
            &conn,
            &req,
            None::<tokio::io::Empty>,
            &mut out,
            &mut err,
            None,
        )
        .await?;
        println!("$ skiff exec {user}@127.0.0.1 -- {command}");
        print!("{}", String::from_utf8_lossy(&out));
        if !err.is_empty() {
            print!("[stderr] {}", String::from_utf8_lossy(&err));
        }
        println!("[exit {}]", outcome.exit_code());
    }

    let mut cold = Vec::with_capacity(args.rounds);
    for _ in 0..args.rounds {
        let t = Instant::now();
        let conn = skiff_engine::connect(&settings).await?;
        let req = ExecRequest {
            command: "true".into(),
            ..Default::default()
        };
        let outcome = skiff_engine::exec(
            &conn,
            &req,
            None::<tokio::io::Empty>,
            tokio::io::sink(),
            tokio::io::sink(),
            None,
        )
        .await?;
        anyhow::ensure!(
            outcome.exit_code() == 0,
            "`true` exited {}",
            outcome.exit_code()
        );
        cold.push(t.elapsed());
    }
    cold.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if let (Some(min), Some(max)) = (cold.first(), cold.last()) {
        println!(
            "cold connect + authenticate + exec `true`, {} rounds: median {:.2} ms, min {:.2} ms, max {:.2} ms",
            cold.len(),
            ms(cold[cold.len() / 2]),
            ms(*min),
            ms(*max)
        );
    }
    // The remote command runs through the account's login shell, as sshd does;
    // time that shell alone so the reader can see what is skiff and what is not.
    let shell = skiff_engine::settings::login_shell();
    let mut shell_times: Vec<Duration> = (0..5)
        .filter_map(|_| {
            let t = Instant::now();
            let ok = std::process::Command::new(&shell)
                .args(["-c", "true"])
                // The environment skiffd gives a session (a clean one, no SHLVL).
                .env_clear()
                .env("HOME", skiff_engine::settings::home_dir())
                .env("USER", &user)
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("SSH_CLIENT", format!("127.0.0.1 1 {port}"))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ok.then(|| t.elapsed())
        })
        .collect();
    shell_times.sort();
    if let Some(shell_median) = shell_times.get(shell_times.len() / 2) {
        println!(
            "of which your login shell ({shell}) takes {:.2} ms to run `true` as an SSH command (it reads its startup files);",
            ms(*shell_median)
        );
        let rest = ms(cold[cold.len() / 2]) - ms(*shell_median);
        if rest > 0.0 {
            println!(
                "skiff's part (connect, key exchange, authentication, session) is about {rest:.2} ms; an account whose shell is /bin/sh shows it best"
            );
        } else {
            println!(
                "the shell's start-up varied more than skiff's whole part in this run (the machine is busy), so that part cannot be told apart here; an account whose shell is /bin/sh shows it best"
            );
        }
    }
    copy_demo(&settings, dir).await
}

/// Copies a file up and back over the skiff data plane (AES-256-GCM
/// records on extra TCP streams, keyed inside the SSH session) and checks
/// that the bytes came back the same.
async fn copy_demo(settings: &skiff_engine::ConnectSettings, dir: &Path) -> anyhow::Result<()> {
    use skiff_engine::copy::{dataplane, CopyJob, Direction, NoProgress};
    const SIZE: usize = 256 << 20;
    let src = dir.join("payload");
    let mut bytes = vec![0u8; SIZE];
    rand::fill(&mut bytes[..]);
    std::fs::write(&src, &bytes)?;
    let conn = skiff_engine::connect(settings).await?;
    let options = dataplane::PlaneOptions {
        mode: skiff_proto::dataplane::Mode::Aead,
        streams: None,
        stall: settings.progress_budget(),
        gate: None,
        inline: true,
    };
    let remote = dir.join("uploaded");
    let back = dir.join("downloaded");
    let jobs = [
        (
            "up",
            Direction::Upload {
                sources: vec![src.clone()],
                target: remote.display().to_string(),
            },
        ),
        (
            "down",
            Direction::Download {
                sources: vec![remote.display().to_string()],
                target: back.clone(),
            },
        ),
    ];
    for (way, direction) in jobs {
        let job = CopyJob {
            direction,
            recursive: false,
            preserve: false,
        };
        let t = Instant::now();
        let report = dataplane::copy(&conn, &job, &options, &NoProgress)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the demo's skiffd did not offer the data plane"))?;
        let secs = t.elapsed().as_secs_f64();
        anyhow::ensure!(
            report.failures.is_empty(),
            "copy failed: {:?}",
            report.failures
        );
        println!(
            "$ skiff cp ({way}, data plane, aead): {} MiB in {:.2} s = {:.0} MB/s",
            SIZE >> 20,
            secs,
            SIZE as f64 / secs / 1e6
        );
    }
    anyhow::ensure!(
        std::fs::read(&back)? == bytes,
        "the copy came back different"
    );
    println!("the file came back byte for byte");
    Ok(())
}
