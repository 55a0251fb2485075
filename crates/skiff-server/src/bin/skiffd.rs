//! `skiffd`: the skiff SSH server. Serves stock OpenSSH clients and skiff.
//!
//! Options given on the command line override the `--config` file; see
//! docs/skiffd-config.md for the file format.

use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser};
use skiff_server::config::{apply_config_with, parse_listen, read_included, CommandLine, Settings};
use skiff_server::config_dump::{self, ConnectionSpec};
use skiff_server::hostkey;
use skiff_server::sftp_options::ServerOptions;
use skiff_server::syslog;

/// skiffd's options, with sshd's single-letter spellings beside its own
/// long ones so that scripts written for sshd run it.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "skiffd",
    version,
    about = "skiff SSH server",
    disable_help_flag = true
)]
struct Args {
    /// Print help.
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Address to listen on, ADDR:PORT (repeatable; replaces the
    /// configuration's). Default 127.0.0.1:2222.
    #[arg(long = "listen", value_name = "ADDR:PORT", value_parser = parse_listen)]
    listen: Vec<std::net::SocketAddr>,
    /// Port to listen on (repeatable), as sshd's -p: it replaces the
    /// configuration's Port lines.
    #[arg(short = 'p', value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    ports: Vec<u16>,
    /// A configuration line, `Keyword value` or `Keyword=value`
    /// (repeatable); it wins over the file's, as in sshd.
    #[arg(short = 'o', value_name = "OPTION")]
    options: Vec<String>,
    /// Configuration file (sshd_config-like keywords; see docs/skiffd-config.md).
    #[arg(long = "config", short = 'f', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Host private key (repeatable; replaces the configuration's HostKey
    /// lines). Default: an ed25519 key created on first start in
    /// $XDG_STATE_HOME/skiffd (else ~/.local/state/skiffd).
    #[arg(long = "host-key", short = 'h', value_name = "FILE")]
    host_keys: Vec<PathBuf>,
    /// Host certificate (repeatable), as the HostCertificate keyword.
    #[arg(short = 'c', value_name = "CERT")]
    host_certificates: Vec<PathBuf>,
    /// authorized_keys path for every account; `%h` is the home directory and
    /// `%u` the user name. Default %h/.ssh/authorized_keys.
    #[arg(long = "authorized-keys", value_name = "PATH")]
    authorized_keys: Option<String>,
    /// Listen on IPv4 addresses only (AddressFamily inet).
    #[arg(short = '4', conflicts_with = "inet6")]
    inet4: bool,
    /// Listen on IPv6 addresses only (AddressFamily inet6).
    #[arg(short = '6')]
    inet6: bool,
    /// Time to authenticate in (LoginGraceTime).
    #[arg(short = 'g', value_name = "SECONDS")]
    login_grace_time: Option<String>,
    /// Check the configuration and the host keys, then exit: 0 when skiffd
    /// would start with them, as `sshd -t` does (nothing is created or
    /// listened on).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Check the configuration and the host keys, then print the
    /// effective configuration as `sshd -T` does.
    #[arg(short = 'T')]
    dump: bool,
    /// Print the effective configuration as -T, without checking host keys.
    #[arg(short = 'G', conflicts_with = "dump")]
    dump_unchecked: bool,
    /// With -T or -G: apply the Match blocks for this connection,
    /// user=USER,host=HOST,addr=ADDR[,laddr=ADDR,lport=PORT,rdomain=NAME]
    /// (repeatable).
    #[arg(short = 'C', value_name = "SPEC")]
    connection: Vec<String>,
    /// inetd mode: serve one connection on stdin/stdout, then exit (for
    /// inetd, systemd socket activation with Accept=yes, or ProxyCommand).
    #[arg(short = 'i', conflicts_with_all = ["listen", "ports", "test", "dump", "dump_unchecked"])]
    inetd: bool,
    /// More logging (-v: debug, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// As -v (sshd's debug mode; skiffd still serves every connection).
    #[arg(short = 'd', action = clap::ArgAction::Count)]
    debug: u8,
    /// Log errors only.
    #[arg(short = 'q')]
    quiet: bool,
    /// Append the log to FILE instead of stderr (created 0600).
    #[arg(short = 'E', value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Started as sshd is by a service manager: log to syslog (unless -e,
    /// -d or -E). skiffd never detaches.
    #[arg(short = 'D')]
    no_detach: bool,
    /// With -D: log to stderr instead of syslog.
    #[arg(short = 'e')]
    stderr: bool,
    /// sshd's utmp host-name length: skiffd writes no utmp and looks up no
    /// names, so it changes nothing (accepted for sshd's sake).
    #[arg(short = 'u', value_name = "LEN", hide = true)]
    utmp_len: Option<u32>,
    /// sshd's "no re-exec": not supported.
    #[arg(short = 'r', hide = true)]
    no_reexec: bool,
    /// Old sshd's key regeneration time and server key bits: not supported.
    #[arg(short = 'k', hide = true, value_name = "TIME")]
    key_regeneration: Option<String>,
    #[arg(short = 'b', hide = true, value_name = "BITS")]
    server_key_bits: Option<String>,
    /// Hold one connection's PAM session and start its commands, serving
    /// skiffd on fd 3 (`UsePAM yes`; see skiff_server::pam_session).
    #[arg(long = "pam-session", hide = true)]
    pam_session: bool,
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
    /// With --sftp-server: the `internal-sftp` options of the session
    /// (read-only, umask, refused requests, start directory), as skiffd
    /// encodes them.
    #[arg(long = "sftp-options", hide = true, requires = "sftp_server")]
    sftp_options: Option<String>,
    /// With --sftp-server: print what the server supports and exit, as
    /// `sftp-server -Q requests` does (the names -P and -p take).
    #[arg(
        short = 'Q',
        hide = true,
        requires = "sftp_server",
        value_name = "FEATURE"
    )]
    sftp_query: Option<String>,
    /// Serve the skiff data plane (stdin/stdout plus the socket skiffd
    /// passes as fd 3): what skiffd runs, as the account, for the
    /// `transfer@skiff` subsystem.
    #[arg(long = "transfer-server", hide = true)]
    transfer_server: bool,
    /// Read the configuration and fork a process for each connection the
    /// listener hands over, serving the listener on fd 3 (what the
    /// listener starts; see skiff_server::zygote).
    #[arg(long = "zygote", hide = true)]
    zygote: bool,
}

fn main() {
    // `skiffd --generate-docs DIR` (hidden): the manual page and shell
    // completions, for packaging/build-deb.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = skiff_docgen::generate_if_asked(&argv, Args::command, "8") {
        std::process::exit(code);
    }
    let args = Args::parse();
    if args.pam_session {
        std::process::exit(skiff_server::pam_session::serve());
    }
    if let Some(feature) = &args.sftp_query {
        if feature != "requests" {
            eprintln!("skiffd --sftp-server -Q: unknown feature {feature:?} (requests)");
            std::process::exit(1);
        }
        for request in skiff_server::sftp_options::Request::ALL {
            println!("{request}");
        }
        return;
    }
    if args.sftp_server {
        // No logging: stderr goes to the client's terminal.
        let options = match args.sftp_options.as_deref().map(ServerOptions::from_arg) {
            None => ServerOptions::default(),
            Some(Ok(options)) => options,
            Some(Err(e)) => {
                eprintln!("skiffd --sftp-server: {e}");
                std::process::exit(1);
            }
        };
        if let (Some(jail), Some(who), Some(home)) = (&args.chroot, &args.drop_to, &args.home) {
            let entered = skiff_server::chroot::DropTo::parse(who)
                .map_err(std::io::Error::other)
                .and_then(|who| skiff_server::chroot::enter(jail, home, &who));
            if let Err(e) = entered {
                eprintln!("skiffd --sftp-server: cannot enter {}: {e}", jail.display());
                std::process::exit(1);
            }
        }
        if let Err(e) = skiff_server::sftp::serve_stdio(options) {
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
    let logging = match args.inetd && args.log_file.is_none() && stderr_is_stdin() {
        true => Ok(LogControl::default()),
        false => init_logging(&args),
    };
    let log = match refuse_unsupported(&args).and(logging) {
        Ok(log) => log,
        Err(e) if args.zygote => {
            let control = skiff_server::zygote::control_socket();
            std::process::exit(skiff_server::zygote::refuse(control, &format!("{e:#}")));
        }
        Err(e) => {
            eprintln!("skiffd: {e:#}");
            std::process::exit(1);
        }
    };
    if args.zygote {
        std::process::exit(zygote(&args, &log));
    }
    if let Err(e) = run(args, log) {
        eprintln!("skiffd: {e:#}");
        std::process::exit(1);
    }
}

/// sshd options skiffd does not have: a clear error rather than a quiet
/// difference.
fn refuse_unsupported(args: &Args) -> Result<()> {
    if args.no_reexec {
        bail!("-r (sshd's no re-execution mode) is not supported");
    }
    if args.key_regeneration.is_some() || args.server_key_bits.is_some() {
        bail!("-k and -b (SSH protocol 1 server keys) are not supported");
    }
    let dumping = args.dump || args.dump_unchecked;
    if !args.connection.is_empty() && !dumping {
        bail!("-C needs -T or -G");
    }
    Ok(())
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

/// Changes the level logged at, once the configuration's `LogLevel` is
/// known.
type SetLevel = Box<dyn Fn(&str) -> Result<()>>;

/// What the configuration may still change about logging.
#[derive(Default)]
struct LogControl {
    /// `LogLevel`, unless the command line set the level.
    set_level: Option<SetLevel>,
    /// Logging to syslog: `SyslogFacility`.
    syslog: Option<std::sync::Arc<syslog::SyslogSender>>,
}

/// The filter that logs skiffd's own lines at `level`.
fn level_filter(level: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::new(format!(
        "skiffd={level},skiff_server={level},skiff_dataplane={level},russh=warn"
    ))
}

/// The subscriber every output is layered on: the (reloadable) filter.
type Filtered = tracing_subscriber::layer::Layered<
    tracing_subscriber::reload::Layer<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
    tracing_subscriber::Registry,
>;

/// Logging to stderr, the -E file or syslog ([`syslog::destination`]
/// decides), at the level -v/-d (more) or -q (errors only) ask for;
/// `SKIFF_LOG` overrides it. Without either, the configuration's
/// `LogLevel` may change it later, and when logging to syslog its
/// `SyslogFacility` sets the facility: the [`LogControl`] returned does.
fn init_logging(args: &Args) -> Result<LogControl> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let more = args.verbose.saturating_add(args.debug);
    let level = match (args.quiet, more) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        _ => "trace",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG").ok();
    let settable = !args.quiet && more == 0 && from_env.is_none();
    let filter = from_env.unwrap_or_else(|| level_filter(level));
    let destination = syslog::destination(&syslog::LogFlags {
        no_detach: args.no_detach,
        stderr: args.stderr,
        debug: args.debug > 0,
        log_file: args.log_file.clone(),
    });
    let mut sender = None;
    let output: Box<dyn Layer<Filtered> + Send + Sync> = match destination {
        syslog::Destination::Stderr => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_writer(std::io::stderr)
            .boxed(),
        syslog::Destination::File(path) => {
            let file = skiff_server::log_file::open_append(&path)?;
            tracing_subscriber::fmt::layer()
                .with_target(false)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .boxed()
        }
        // Syslog stamps the time and the severity itself.
        syslog::Destination::Syslog => {
            let to = std::sync::Arc::new(syslog::SyslogSender::new(std::path::Path::new(
                syslog::DEV_LOG,
            )));
            sender = Some(to.clone());
            tracing_subscriber::fmt::layer()
                .with_target(false)
                .with_ansi(false)
                .without_time()
                .with_level(false)
                .with_writer(syslog::SyslogWriter(to))
                .boxed()
        }
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .try_init()
        .context("cannot start logging")?;
    let set_level = settable.then(|| {
        Box::new(move |level: &str| {
            handle
                .reload(level_filter(level))
                .context("cannot change the log level")
        }) as SetLevel
    });
    Ok(LogControl {
        set_level,
        syslog: sender,
    })
}

/// The command line's settings lines: the options that stand for a
/// keyword, then the -o lines.
fn command_line(args: &Args) -> CommandLine {
    let mut lines = Vec::new();
    if args.inet4 {
        lines.push("AddressFamily inet".to_string());
    }
    if args.inet6 {
        lines.push("AddressFamily inet6".to_string());
    }
    if let Some(time) = &args.login_grace_time {
        lines.push(format!("LoginGraceTime {time}"));
    }
    lines.extend(args.options.iter().cloned());
    CommandLine {
        lines,
        ports: args.ports.clone(),
    }
}

/// The settings from the command line and the configuration file, the
/// configuration's logging applied; `announce`: its warnings logged (at
/// start, not again by the zygote or a reload). The host keys are left to
/// [`with_host_keys`].
fn read_settings(args: &Args, log: &LogControl, announce: bool) -> Result<Settings> {
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
            if settings.sftp_command.is_none() && announce {
                tracing::warn!(
                    "{} is not UTF-8: sftp needs a Subsystem line in the config",
                    exe.display()
                );
            }
        }
        Err(e) if announce => tracing::warn!(
            "cannot find skiffd's own executable ({e}): sftp needs a Subsystem line in the config"
        ),
        Err(_) => {}
    }
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            Some((path.display().to_string(), text))
        }
        None => None,
    };
    apply_config_with(
        &mut settings,
        &command_line(args),
        file.as_ref()
            .map(|(label, text)| (label.as_str(), text.as_str())),
        &mut read_included,
    )?;
    // The command line's -d, -v, -q (and SKIFF_LOG) win over LogLevel.
    if let (Some(level), Some(set_level)) = (settings.log_level, &log.set_level) {
        set_level(level.tracing_level())?;
    }
    if let Some(sender) = &log.syslog {
        sender.set_facility(settings.syslog_facility);
    }
    let notes = std::mem::take(&mut settings.config_notes);
    if announce {
        for note in notes {
            tracing::warn!("{note}");
        }
        if let Some(note) = skiff_server::pam::missing_service_note(&settings.pam) {
            tracing::warn!("{note}");
        }
    }
    if !args.listen.is_empty() {
        settings.listen = args.listen.clone();
    }
    if settings.listen.is_empty() {
        settings
            .listen
            .push("127.0.0.1:2222".parse().expect("valid default"));
    }
    if !args.host_keys.is_empty() {
        settings.host_keys = args.host_keys.clone();
    }
    settings
        .host_certificates
        .extend(args.host_certificates.iter().cloned());
    if let Some(ak) = &args.authorized_keys {
        settings.authorized_keys = ak.clone();
    }
    Ok(settings)
}

/// Without a HostKey line, skiffd's own key, made at first start (not by a
/// check, which creates nothing): its path added to `settings`. True when
/// it is skiffd's own key.
fn own_host_key(settings: &mut Settings, checking: bool) -> Result<bool> {
    let own_key = settings.host_keys.is_empty();
    if own_key {
        match (checking, hostkey::default_state_dir()) {
            (true, Ok(dir)) => settings.host_keys.push(hostkey::default_host_key(&dir)),
            // No state directory: no key to check or print.
            (true, Err(_)) => {}
            (false, dir) => settings
                .host_keys
                .push(hostkey::ensure_default_host_key(&dir?)?),
        }
    }
    Ok(own_key)
}

/// The settings and the host identity they name, as a server starts with
/// them (the listener at start and on `SIGHUP`, and the zygote).
fn with_host_keys(
    args: &Args,
    log: &LogControl,
    announce: bool,
) -> Result<(Settings, hostkey::HostIdentity)> {
    let mut settings = read_settings(args, log, announce)?;
    own_host_key(&mut settings, false)?;
    let keys = hostkey::load_host_keys(&settings.host_keys)?;
    let certificates = hostkey::load_host_certificates(&settings.host_certificates, &keys)?;
    let host = hostkey::HostIdentity { keys, certificates };
    skiff_server::check(&settings, &host)?;
    Ok((settings, host))
}

/// `skiffd ... --zygote`: reads what the listener read, then forks a
/// connection process whenever asked. Returns the exit code (in the
/// zygote, and in each connection process once it is done).
fn zygote(args: &Args, log: &LogControl) -> i32 {
    let control = skiff_server::zygote::control_socket();
    if let Some(syslog) = &log.syslog {
        syslog.leave_outage_notice_to_the_listener();
    }
    match with_host_keys(args, log, false) {
        Ok((settings, host)) => skiff_server::zygote::serve(control, settings, host),
        Err(e) => skiff_server::zygote::refuse(control, &format!("{e:#}")),
    }
}

fn run(args: Args, log: LogControl) -> Result<()> {
    let checking = args.test || args.dump || args.dump_unchecked;
    if !checking && !args.inetd {
        let (settings, _host) = with_host_keys(&args, &log, true)?;
        let runtime = runtime()?;
        let log = std::rc::Rc::new(log);
        let reload: skiff_server::Reload =
            Box::new(move || with_host_keys(&args, &log, false).map(|(settings, _)| settings));
        return runtime.block_on(skiff_server::serve(settings, reload));
    }
    let mut settings = read_settings(&args, &log, true)?;
    let own_key = own_host_key(&mut settings, checking)?;
    if args.dump_unchecked {
        return dump(&settings, &args.connection);
    }
    let loadable: Vec<PathBuf> = settings
        .host_keys
        .iter()
        .filter(|p| !(own_key && checking && !p.exists()))
        .cloned()
        .collect();
    let keys = hostkey::load_host_keys(&loadable)?;
    let certificates = hostkey::load_host_certificates(&settings.host_certificates, &keys)?;
    if args.dump {
        return dump(&settings, &args.connection);
    }
    if args.test {
        return Ok(());
    }
    let host = hostkey::HostIdentity { keys, certificates };
    let runtime = runtime()?;
    let served = runtime.block_on(skiff_server::serve_inetd(settings, host));
    // A read of stdin may still wait in a blocking thread: not for it.
    runtime.shutdown_background();
    served
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Prints the configuration as `sshd -T` does; with -C specs, that of a
/// login with those details (the user's groups looked up as at a login).
fn dump(settings: &Settings, specs: &[String]) -> Result<()> {
    let context = if specs.is_empty() {
        None
    } else {
        let mut spec = ConnectionSpec::default();
        for s in specs {
            spec.add(s).map_err(anyhow::Error::msg)?;
        }
        let groups = spec
            .user
            .as_deref()
            .and_then(|user| skiff_server::account::lookup(user).ok())
            .map(|account| account.group_names())
            .unwrap_or_default();
        Some(spec.context(groups))
    };
    let effective = config_dump::settings_for(settings, context.as_ref());
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(config_dump::render(&effective).as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write the configuration")
}
