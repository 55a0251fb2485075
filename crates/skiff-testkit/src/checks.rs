//! Checks shared by the test files: what a login's environment holds
//! (`USER_ENV_SCRIPT`, `check_user_env`, `check_ssh_connection`), and
//! whether a `tty` line names a pseudo-terminal.

use super::accounts::account;
use super::run::CmdOutput;

/// A remote command that prints the login environment, one item a line:
/// USER, LOGNAME, HOME, SHELL, SSH_CONNECTION, SSH_CLIENT, `id -un`,
/// `id -u`, and `path-set` when PATH is set. See [`check_user_env`].
pub const USER_ENV_SCRIPT: &str = r#"printf '%s\n' "$USER" "$LOGNAME" "$HOME" "$SHELL" "$SSH_CONNECTION" "$SSH_CLIENT"; id -un; id -u; test -n "$PATH" && echo path-set"#;

/// Checks the output of [`USER_ENV_SCRIPT`] run as [`account`] over a
/// connection to 127.0.0.1:`port`: exit 0 and every item as expected.
pub fn check_user_env(out: &CmdOutput, port: u16, c: &str) {
    let acct = account();
    out.expect_code(0, c);
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 9, "{c}: unexpected output\n{out}");
    assert_eq!(lines[0], acct.name, "{c}: USER\n{out}");
    assert_eq!(lines[1], acct.name, "{c}: LOGNAME\n{out}");
    assert_eq!(lines[2], acct.home.to_string_lossy(), "{c}: HOME\n{out}");
    assert_eq!(lines[3], acct.shell, "{c}: SHELL\n{out}");
    check_ssh_connection(lines[4], lines[5], port, c);
    assert_eq!(lines[6], acct.name, "{c}: id -un\n{out}");
    assert_eq!(lines[7], acct.uid.to_string(), "{c}: id -u\n{out}");
    assert_eq!(lines[8], "path-set", "{c}: PATH\n{out}");
}

/// Checks `SSH_CONNECTION` ("cip cport sip sport") and `SSH_CLIENT`
/// ("cip cport sport") for a loopback connection to `port`.
pub fn check_ssh_connection(conn: &str, client: &str, port: u16, c: &str) {
    let f: Vec<&str> = conn.split(' ').collect();
    assert_eq!(f.len(), 4, "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[0], "127.0.0.1", "{c}: SSH_CONNECTION={conn:?}");
    let cport: u16 = f[1]
        .parse()
        .unwrap_or_else(|_| panic!("{c}: SSH_CONNECTION client port {conn:?}"));
    assert_ne!(cport, 0, "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[2], "127.0.0.1", "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(f[3], port.to_string(), "{c}: SSH_CONNECTION={conn:?}");
    assert_eq!(
        client,
        format!("127.0.0.1 {cport} {port}"),
        "{c}: SSH_CLIENT must match SSH_CONNECTION ({conn:?})"
    );
}

/// True when `line` (a `tty` output line, `\r` allowed at the end) is a
/// pseudo-terminal path `/dev/pts/N`.
pub fn is_pts_path(line: &str) -> bool {
    let n = line
        .trim_end_matches('\r')
        .strip_prefix("/dev/pts/")
        .unwrap_or("");
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
}
