//! Local shell commands the client configuration asks for: `Match exec`
//! (while the configuration is resolved) and `LocalCommand` (once
//! connected, under `PermitLocalCommand yes`). Both run through the user's
//! shell (`$SHELL`, else `/bin/sh`) with `-c`, as ssh runs them. What to
//! run and when is decided elsewhere (`skiff_proto::ssh_config` and its
//! callers); this is only the running.

use std::process::{Command, Stdio};

/// The shell commands run through: `$SHELL`, else `/bin/sh`.
fn shell() -> String {
    std::env::var("SHELL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// Runs a `Match exec` command (tokens already expanded): `Ok(true)` when
/// it exits 0. Its input and output are /dev/null (it answers with its
/// status alone); its errors go to stderr. `Err` when it could not be run.
pub fn match_exec(command: &str) -> Result<bool, String> {
    let shell = shell();
    tracing::debug!("Match exec: running {command:?} with {shell}");
    let status = Command::new(&shell)
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {shell}: {e}"))?;
    tracing::debug!("Match exec {command:?}: {status}");
    Ok(status.success())
}

/// Runs a `LocalCommand` (tokens already expanded) with this process's
/// standard input, output and error, and waits for it. How it ended is
/// logged; it does not change how the session goes, as with ssh.
pub async fn run_local_command(command: &str) {
    let shell = shell();
    tracing::debug!("LocalCommand: running {command:?} with {shell}");
    let status = tokio::process::Command::new(&shell)
        .arg("-c")
        .arg(command)
        .status()
        .await;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::debug!("LocalCommand {command:?}: {s}"),
        Err(e) => eprintln!("skiff: cannot run LocalCommand with {shell}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_exec_answers_with_the_exit_status() {
        assert_eq!(match_exec("exit 0"), Ok(true));
        assert_eq!(match_exec("exit 3"), Ok(false));
        assert_eq!(match_exec("test -n \"$0\""), Ok(true));
    }
}
