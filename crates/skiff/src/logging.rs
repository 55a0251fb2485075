//! Logging for every `skiff` command: tracing to stderr, at the level `-v`
//! (repeatable) or `SKIFF_LOG` asks for (`skiff cp` quiets the SFTP
//! client's own warnings). Nothing else lives here.

/// Sets up logging on stderr. Without `-v` or `SKIFF_LOG`, only warnings
/// (e.g. a malformed known_hosts line, named by file:line) and errors show,
/// through a plain level filter that costs nothing to build.
pub(crate) fn init(verbose: u8) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
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
pub(crate) fn init_for_copy(verbose: u8) {
    if verbose == 0 && std::env::var_os("SKIFF_LOG").is_none() {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_target(false)
            .without_time()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn,russh_sftp=error"))
            .try_init();
        return;
    }
    init(verbose);
}
