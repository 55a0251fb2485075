//! Logging for every `skiff` command: tracing to stderr, or appended to the
//! file `-E` names (as ssh's -E), at the level `-v` (repeatable) or
//! `SKIFF_LOG` asks for (`skiff cp` quiets the SFTP client's own warnings).
//! The one-line error a command ends with is its own and still goes to
//! stderr. Nothing else lives here.

use std::path::Path;

use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// Where diagnostics go: stderr, or the `-E` file (appended; created 0600,
/// since a debug log names hosts, users and key files). A file that cannot
/// be opened is said on stderr, which is then used.
fn writer(log_file: Option<&Path>) -> (BoxMakeWriter, bool) {
    let Some(path) = log_file else {
        return (BoxMakeWriter::new(std::io::stderr), true);
    };
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => (BoxMakeWriter::new(std::sync::Mutex::new(file)), false),
        Err(e) => {
            eprintln!("skiff: cannot open log file {}: {e}", path.display());
            (BoxMakeWriter::new(std::io::stderr), true)
        }
    }
}

/// Sets up logging on stderr, or in `log_file`. Without `-v` or
/// `SKIFF_LOG`, only warnings (e.g. a malformed known_hosts line, named by
/// file:line) and errors show, through a plain level filter that costs
/// nothing to build.
pub(crate) fn init(verbose: u8, log_file: Option<&Path>) {
    let (to, terminal) = writer(log_file);
    let builder = tracing_subscriber::fmt()
        .with_writer(to)
        .with_ansi(terminal)
        .with_target(false)
        .without_time();
    if verbose == 0 && std::env::var_os("SKIFF_LOG").is_none() {
        let _ = builder.with_max_level(tracing::Level::WARN).try_init();
        return;
    }
    let level = if verbose <= 1 { "debug" } else { "trace" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG").unwrap_or_else(|_| {
        let russh = if verbose >= 3 { "debug" } else { "warn" };
        tracing_subscriber::EnvFilter::new(format!(
            "warn,skiff={level},skiff_engine={level},russh={russh}"
        ))
    });
    let _ = builder.with_env_filter(filter).try_init();
}

/// `skiff cp`'s logging: as for every command, except that without `-v` the SFTP
/// client's own warnings stay quiet: when its channel closes under it,
/// skiff says so itself, in one line.
pub(crate) fn init_for_copy(verbose: u8, log_file: Option<&Path>) {
    if verbose == 0 && std::env::var_os("SKIFF_LOG").is_none() {
        let (to, terminal) = writer(log_file);
        let _ = tracing_subscriber::fmt()
            .with_writer(to)
            .with_ansi(terminal)
            .with_target(false)
            .without_time()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn,russh_sftp=error"))
            .try_init();
        return;
    }
    init(verbose, log_file);
}
