//! `skiffd`: the skiff SSH server. Serves stock OpenSSH clients and skiff.
//!
//! Options given on the command line override the `--config` file; see
//! docs/skiffd-config.md for the file format.

use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use skiff_server::config::{apply_config_text, parse_listen, Settings};
use skiff_server::hostkey;

#[derive(Parser, Debug)]
#[command(name = "skiffd", version, about = "skiff SSH server")]
struct Args {
    /// Address to listen on, ADDR:PORT (repeatable). Default 127.0.0.1:2222.
    #[arg(long = "listen", value_name = "ADDR:PORT", value_parser = parse_listen)]
    listen: Vec<std::net::SocketAddr>,
    /// Configuration file (sshd_config-like keywords; see docs/skiffd-config.md).
    #[arg(long = "config", short = 'f', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Host private key (repeatable). Default: an ed25519 key created on first
    /// start in $XDG_STATE_HOME/skiffd (else ~/.local/state/skiffd).
    #[arg(long = "host-key", value_name = "FILE")]
    host_keys: Vec<PathBuf>,
    /// authorized_keys path for every account; `%h` is the home directory and
    /// `%u` the user name. Default %h/.ssh/authorized_keys.
    #[arg(long = "authorized-keys", value_name = "PATH")]
    authorized_keys: Option<String>,
    /// Check the configuration and the host keys, then exit: 0 when skiffd
    /// would start with them, as `sshd -t` does (nothing is created or
    /// listened on).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// inetd mode: serve one connection on stdin/stdout, then exit (for
    /// inetd, systemd socket activation with Accept=yes, or ProxyCommand).
    #[arg(short = 'i', conflicts_with = "listen")]
    inetd: bool,
    /// More logging (-v: debug, -vv: trace). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Serve SFTP on stdin/stdout and exit at end of input: what skiffd runs,
    /// as the account, for the `sftp` subsystem.
    #[arg(long = "sftp-server", hide = true)]
    sftp_server: bool,
    /// With --sftp-server, started as root for a `ChrootDirectory` login:
    /// the jail to enter before serving.
    #[arg(long = "chroot", hide = true, requires_all = ["drop_to", "home"])]
    chroot: Option<PathBuf>,
    /// With --chroot: who to become once inside, UID:GID:GROUPS.
    #[arg(long = "drop-to", hide = true)]
    drop_to: Option<String>,
    /// With --chroot: the home directory to start in, inside the jail.
    #[arg(long = "home", hide = true)]
    home: Option<PathBuf>,
    /// Serve the skiff data plane (stdin/stdout plus the socket skiffd
    /// passes as fd 3): what skiffd runs, as the account, for the
    /// `transfer@skiff` subsystem.
    #[arg(long = "transfer-server", hide = true)]
    transfer_server: bool,
}

fn main() {
    let args = Args::parse();
    if args.sftp_server {
        // No logging: stderr goes to the client's terminal.
        if let (Some(jail), Some(who), Some(home)) = (&args.chroot, &args.drop_to, &args.home) {
            let entered = skiff_server::chroot::DropTo::parse(who)
                .map_err(std::io::Error::other)
                .and_then(|who| skiff_server::chroot::enter(jail, home, &who));
            if let Err(e) = entered {
                eprintln!("skiffd --sftp-server: cannot enter {}: {e}", jail.display());
                std::process::exit(1);
            }
        }
        if let Err(e) = skiff_server::sftp::serve_stdio() {
            eprintln!("skiffd --sftp-server: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.transfer_server {
        if let Err(e) = skiff_server::transfer_process::serve_stdio() {
            eprintln!("skiffd --transfer-server: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    // inetd hands the connection over as stderr too: a log line there
    // would be bytes in the SSH stream.
    if !(args.inetd && stderr_is_stdin()) {
        init_logging(args.verbose);
    }
    if let Err(e) = run(args) {
        eprintln!("skiffd: {e:#}");
        std::process::exit(1);
    }
}

/// Whether stderr is the same file as stdin (inetd's socket on all three).
fn stderr_is_stdin() -> bool {
    use std::os::unix::fs::MetadataExt;
    let same = |a: &std::fs::File, b: &std::fs::File| match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    let (Ok(stdin), Ok(stderr)) = (
        std::io::stdin().as_fd().try_clone_to_owned(),
        std::io::stderr().as_fd().try_clone_to_owned(),
    ) else {
        return false;
    };
    same(&stdin.into(), &stderr.into())
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "skiffd={level},skiff_server={level},skiff_dataplane={level},russh=warn"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn run(args: Args) -> Result<()> {
    let mut settings = Settings::default();
    // The sftp subsystem runs this executable as the account, unless the
    // config file names another command (`Subsystem sftp ...`).
    match std::env::current_exe() {
        Ok(exe) => {
            settings.sftp_command = skiff_server::sftp::subsystem_command(&exe);
            settings.server_exe = Some(exe.clone());
            settings.transfer_command = exe
                .to_str()
                .map(|e| format!("{} --transfer-server", skiff_server::sftp::shell_quote(e)));
            if settings.sftp_command.is_none() {
                tracing::warn!(
                    "{} is not UTF-8: sftp needs a Subsystem line in the config",
                    exe.display()
                );
            }
        }
        Err(e) => tracing::warn!(
            "cannot find skiffd's own executable ({e}): sftp needs a Subsystem line in the config"
        ),
    }
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        apply_config_text(&mut settings, &path.display().to_string(), &text)?;
        for note in std::mem::take(&mut settings.config_notes) {
            tracing::warn!("{note}");
        }
    }
    if !args.listen.is_empty() {
        settings.listen = args.listen;
    }
    if settings.listen.is_empty() {
        settings
            .listen
            .push("127.0.0.1:2222".parse().expect("valid default"));
    }
    if !args.host_keys.is_empty() {
        settings.host_keys = args.host_keys;
    }
    if settings.host_keys.is_empty() && !args.test {
        let dir = hostkey::default_state_dir()?;
        settings
            .host_keys
            .push(hostkey::ensure_default_host_key(&dir)?);
    }
    if let Some(ak) = args.authorized_keys {
        settings.authorized_keys = ak;
    }
    let keys = hostkey::load_host_keys(&settings.host_keys)?;
    let certificates = hostkey::load_host_certificates(&settings.host_certificates, &keys)?;
    if args.test {
        // Without a HostKey line, the default key is made at first start.
        return Ok(());
    }
    let host = hostkey::HostIdentity { keys, certificates };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if args.inetd {
        let served = runtime.block_on(skiff_server::serve_inetd(settings, host));
        // A read of stdin may still wait in a blocking thread: not for it.
        runtime.shutdown_background();
        return served;
    }
    runtime.block_on(skiff_server::serve(settings, host))
}
