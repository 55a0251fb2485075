//! The environment of what skiffd starts, driven by stock OpenSSH (`ssh`,
//! `sftp`) and skiff: a program skiffd starts with root's privileges (the
//! jailed SFTP server, before it enters the jail and drops;
//! `AuthorizedKeysCommand`, `AuthorizedPrincipalsCommand`) sees only the
//! fixed environment, never a client's variable; and loader, shell and
//! interpreter variables never reach a session, whatever `AcceptEnv *` or
//! `PermitUserEnvironment yes` say, while ordinary accepted ones still do.
//! The jail tests need root (as CI runs them).

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skiff_server::session_env::FIXED;
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A jail (root's, 0755) with an `upload` directory the account owns.
fn make_jail(base: &Path) -> tempfile::TempDir {
    let jail = tempfile::Builder::new()
        .prefix("skiff-envjail-")
        .tempdir_in(base)
        .expect("make a jail");
    fs::set_permissions(jail.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let upload = jail.path().join("upload");
    fs::create_dir(&upload).unwrap();
    let acct = account();
    std::os::unix::fs::chown(&upload, Some(acct.uid), Some(acct.gid)).unwrap();
    jail
}

/// `Match User` block jailing the test account with `internal-sftp`.
fn jail_block(jail: &Path) -> String {
    format!(
        "Match User {}\n  ChrootDirectory {}\n  ForceCommand internal-sftp\n",
        user(),
        jail.display()
    )
}

/// The arguments of a stock `sftp` run against `port` with `key` and `-o`
/// `options`, up to the batch file and destination.
fn sftp_args(port: u16, key: &Key, options: &[&str]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
    ]
    .iter()
    .map(Into::into)
    .collect();
    for o in options {
        args.push("-o".into());
        args.push(o.into());
    }
    args.push("-i".into());
    args.push(key.private.clone().into());
    args.push("-P".into());
    args.push(port.to_string().into());
    args
}

/// Stock `sftp -b` with `commands` and `-o` `options`.
fn sftp(d: &Skiffd, key: &Key, options: &[&str], commands: &[String]) -> CmdOutput {
    let batch = tempdir();
    let file = batch.path().join("batch");
    write_file(&file, commands.join("\n") + "\n", 0o644);
    Run::new("sftp")
        .args(sftp_args(d.port(), key, options))
        .arg("-b")
        .arg(&file)
        .arg(format!("{}@127.0.0.1", user()))
        .run()
}

/// A shared object whose constructor writes the uid it runs as to a new
/// file in `marker_dir`: the proof that a program loaded it.
fn build_preload(dir: &Path, marker_dir: &Path) -> PathBuf {
    let source = dir.join("preload.c");
    write_file(
        &source,
        format!(
            r#"#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void skiff_preload_marker(void) {{
    char path[4096];
    snprintf(path, sizeof path, "%s/uid-%d", "{}", (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) {{ fprintf(f, "%d\n", (int)getuid()); fclose(f); }}
}}
"#,
            marker_dir.display()
        ),
        0o644,
    );
    let object = dir.join("preload.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&object)
        .arg(&source)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    object
}

/// The files in `dir` (with what they hold), for the marker checks.
fn markers(dir: &Path) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = fs::read_dir(dir)
        .expect("read the marker directory")
        .map(|e| {
            let e = e.unwrap();
            let text = fs::read_to_string(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), text)
        })
        .collect();
    found.sort();
    found
}

/// The environment a process started with (`/proc/PID/environ`, as root),
/// sorted `NAME=VALUE` lines.
fn environ_of(pid: u32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).expect("read environ");
    let mut vars: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    vars.sort();
    vars
}

/// [`FIXED`] as sorted `NAME=VALUE` lines.
fn fixed_lines() -> Vec<String> {
    let mut lines: Vec<String> = FIXED.iter().map(|(k, v)| format!("{k}={v}")).collect();
    lines.sort();
    lines
}

/// The process whose command line holds `needle` as one argument after
/// `flag` (bounded wait: 30 s).
fn wait_for_process(flag: &str, needle: &str, c: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if args
                .windows(2)
                .any(|w| w[0] == flag.as_bytes() && w[1] == needle.as_bytes())
            {
                return pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{c}: no process with {flag} {needle} after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client process killed and reaped on drop.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The exploit from the review, set up: a jailed, SFTP-only account
/// (`ForceCommand internal-sftp`, with `AcceptEnv *` and
/// `PermitUserEnvironment yes`) has uploaded a shared object into its jail,
/// and `env_key` sets `LD_PRELOAD` to it with `environment=`. The SFTP
/// server starts as root outside the jail: it must never load the object.
struct PlantedObject {
    fx: Fixture,
    env_key: Key,
    d: Skiffd,
    /// The object, as seen from outside the jail.
    planted: PathBuf,
    /// Only root can write here (0700, root's); outside the jail.
    marker_dir: tempfile::TempDir,
    _jail: tempfile::TempDir,
}

impl PlantedObject {
    fn new() -> Option<PlantedObject> {
        let base = jail_base()?;
        if !require_openssh() || !require_tool("cc", "build-essential") {
            return None;
        }
        let jail = make_jail(&base);
        let marker_dir = tempfile::tempdir().expect("marker directory");
        let build = tempdir();
        let object = build_preload(build.path(), marker_dir.path());
        let fx = Fixture::new();
        let planted = jail.path().join("upload/preload.so");
        let [env_key] = fx.keys_with_options([(
            "env_key",
            &format!("environment=\"LD_PRELOAD={}\"", planted.display()),
        )]);
        let config = format!(
            "{}AcceptEnv *\nPermitUserEnvironment yes\n{}",
            sftp_subsystem_config().unwrap_or_default(),
            jail_block(jail.path())
        );
        let d = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config),
        );
        let c = |what: &str| ctx(&d, what);

        // The account uploads the object into the jail.
        sftp(
            &d,
            &fx.client_key,
            &[],
            &[format!("put {} /upload/preload.so", object.display())],
        )
        .expect_code(0, &c("upload"));
        assert!(planted.is_file(), "{}", c("the object landed in the jail"));

        // The object works: a program root starts with it preloaded records
        // uid 0. (So no marker later means it was never loaded.)
        let st = Command::new("/bin/true")
            .env("LD_PRELOAD", &planted)
            .status()
            .expect("run /bin/true");
        assert!(st.success());
        let control = markers(marker_dir.path());
        assert_eq!(control.len(), 1, "the preload control run left no marker");
        assert_eq!(control[0].1, "0\n", "the control run was root");
        fs::remove_file(marker_dir.path().join(&control[0].0)).unwrap();
        Some(PlantedObject {
            fx,
            env_key,
            d,
            planted,
            marker_dir,
            _jail: jail,
        })
    }

    /// Logs in with `key` and `-o` `options`, runs `pwd`, and checks that
    /// nothing loaded the object and that the log names the refusal.
    fn login_loads_nothing(&self, key: &Key, options: &[&str], refusal: &str, what: &str) {
        let c = ctx(&self.d, what);
        sftp(&self.d, key, options, &["pwd".into()]).expect_code(0, &c);
        assert_eq!(
            markers(self.marker_dir.path()),
            [],
            "{c}: the object was loaded (the uid it ran as is in each marker)"
        );
        assert!(self.d.log().contains(refusal), "{c}: no {refusal:?}");
    }
}

#[test]
fn a_jailed_sftp_login_cannot_preload_code_into_the_root_started_server_by_sending_it() {
    let Some(p) = PlantedObject::new() else {
        return;
    };
    let preload = format!("SetEnv=LD_PRELOAD={}", p.planted.display());
    p.login_loads_nothing(
        &p.fx.client_key,
        &[&preload],
        "refusing environment variable LD_PRELOAD sent by the client",
        "LD_PRELOAD sent by the client (AcceptEnv *)",
    );
}

#[test]
fn a_jailed_sftp_login_cannot_preload_code_into_the_root_started_server_by_its_key() {
    let Some(p) = PlantedObject::new() else {
        return;
    };
    p.login_loads_nothing(
        &p.env_key,
        &[],
        "refusing environment variable LD_PRELOAD from an environment= option",
        "LD_PRELOAD from environment= (PermitUserEnvironment yes)",
    );
}

/// The jailed SFTP server, started as root, starts with the fixed
/// environment and nothing else: none of the client's accepted variables,
/// the server's SetEnv, or the variables that describe the login.
#[test]
fn the_jailed_sftp_server_starts_with_only_the_fixed_environment() {
    let Some(base) = jail_base() else {
        return;
    };
    if !require_openssh() {
        return;
    }
    let jail = make_jail(&base);
    let fx = Fixture::new();
    let config = format!(
        "{}AcceptEnv SKIFF_TEST_*\nSetEnv SKIFF_SERVER_SET=1\n{}",
        sftp_subsystem_config().unwrap_or_default(),
        jail_block(jail.path())
    );
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let c = ctx(&d, "the jailed SFTP server's environment");

    // An SFTP session kept open (its batch comes from our pipe).
    let child = Command::new("sftp")
        .args(sftp_args(
            d.port(),
            &fx.client_key,
            &["SetEnv=SKIFF_TEST_VAR=client"],
        ))
        .arg("-b")
        .arg("-")
        .arg(format!("{}@127.0.0.1", user()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sftp");
    let mut client = Client(child);
    let pid = wait_for_process("--chroot", &jail.path().to_string_lossy(), &c);
    assert_eq!(environ_of(pid), fixed_lines(), "{c}");

    // The session works: it answers, and ends with its input.
    let mut stdin = client.0.stdin.take().unwrap();
    stdin.write_all(b"pwd\n").unwrap();
    drop(stdin);
    let out = wait_output(client, &c);
    assert!(out.contains("Remote working directory: /"), "{c}\n{out}");
}

/// Waits (60 s at most) for `client` to end; its standard output.
fn wait_output(mut client: Client, c: &str) -> String {
    use std::io::Read;
    let mut stdout = client.0.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let text = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{c}: sftp did not finish within 60 s"));
    let st = client.0.wait().expect("wait for sftp");
    assert!(st.success(), "{c}: sftp failed ({st})\n{text}");
    text
}

/// A lookup program that copies the environment it started with into
/// `dump` and prints `output` lines.
fn env_dumping_program(dir: &Path, name: &str, dump: &Path, output: &str) -> PathBuf {
    let program = dir.join(name);
    write_file(
        &program,
        format!(
            "#!/bin/sh\ntr '\\000' '\\n' < /proc/$$/environ > '{}'\ncat <<'EOF'\n{output}\nEOF\n",
            dump.display()
        ),
        0o755,
    );
    program
}

fn sorted_lines(path: &Path, c: &str) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{c}: {}: {e}", path.display()));
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// `AuthorizedKeysCommand` and `AuthorizedPrincipalsCommand` start with
/// the fixed environment: no client variable, none of skiffd's own.
#[test]
fn lookup_commands_see_only_the_fixed_environment() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let programs = tempdir();
    fs::set_permissions(programs.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dumps = account_dir();
    let (keys_env, principals_env) = (
        dumps.path().join("keys-env"),
        dumps.path().join("principals-env"),
    );
    let keys = env_dumping_program(
        programs.path(),
        "keys",
        &keys_env,
        &fx.stranger_key.pub_line(),
    );
    let principals =
        env_dumping_program(programs.path(), "principals", &principals_env, "ops-team");
    let config = format!(
        "AcceptEnv *\nSetEnv SKIFF_SERVER_SET=1\n\
         AuthorizedKeysCommand {} %u\nAuthorizedKeysCommandUser {u}\n\
         TrustedUserCAKeys {}\n\
         AuthorizedPrincipalsCommand {} %u\nAuthorizedPrincipalsCommandUser {u}\n",
        keys.display(),
        ca.public.display(),
        principals.display(),
        u = user()
    );
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let c = |what: &str| ctx(&d, what);
    let send = "SetEnv=SKIFF_TEST_VAR=client LANG=C.UTF-8";

    // A key only the keys command vouches for.
    ssh(d.port(), user(), &fx.stranger_key)
        .opt(send)
        .args(&["echo", "in"])
        .run()
        .expect_code(0, &c("AuthorizedKeysCommand login"))
        .expect_stdout("in\n", "AuthorizedKeysCommand login");
    assert_eq!(
        sorted_lines(&keys_env, &c("keys command")),
        fixed_lines(),
        "{}",
        c("AuthorizedKeysCommand's environment")
    );

    // A certificate whose principal only the principals command prints.
    // (A key of its own: the keys command vouches for the stranger's, and
    // ssh offers the plain key before the certificate.)
    let cert_source = fx.keygen("cert_source", KeyType::Ed25519, None);
    let cert_key = user_certificate_copy(
        &fx,
        &ca,
        &cert_source,
        "cert-source-cert",
        ("laptop", "ops-team"),
        &[],
    );
    ssh(d.port(), user(), &cert_key)
        .opt(send)
        .args(&["echo", "in"])
        .run()
        .expect_code(0, &c("AuthorizedPrincipalsCommand login"))
        .expect_stdout("in\n", "AuthorizedPrincipalsCommand login");
    assert_eq!(
        sorted_lines(&principals_env, &c("principals command")),
        fixed_lines(),
        "{}",
        c("AuthorizedPrincipalsCommand's environment")
    );
}

/// What a session sees of the variables a client sends and a key sets:
/// one line, `|`-separated, `-` for unset.
const SHOW_ENV: &str = r#"printf '%s|%s|%s|%s|%s|%s|%s|%s\n' "${SKIFF_TEST_VAR--}" "${LANG--}" "${SKIFF_KEY_VAR--}" "${LD_PRELOAD--}" "${BASH_ENV--}" "${PYTHONPATH--}" "${SSH_ORIGINAL_COMMAND--}" "${LD_LIBRARY_PATH--}""#;

/// `AcceptEnv *` and `PermitUserEnvironment yes`: an ordinary variable
/// still reaches exec, pty and skiff sessions; loader, shell, interpreter
/// and login-record variables never do, and the log says so.
#[test]
fn accepted_variables_reach_sessions_and_refused_ones_never_do() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let [env_key] = fx.keys_with_options([(
        "env_key",
        "environment=\"SKIFF_KEY_VAR=from-key\",environment=\"LD_LIBRARY_PATH=/nonexistent/lib\"",
    )]);
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config("AcceptEnv *\nPermitUserEnvironment yes\n"),
    );
    let c = |what: &str| ctx(&d, what);
    let send = "SetEnv=SKIFF_TEST_VAR=hello LANG=C.UTF-8 LD_PRELOAD=/nonexistent/x.so \
                BASH_ENV=/nonexistent/rc PYTHONPATH=/nonexistent SSH_ORIGINAL_COMMAND=forged";
    let expected = "hello|C.UTF-8|from-key|-|-|-|-|-";

    // exec, through stock ssh.
    let out = ssh(d.port(), user(), &env_key)
        .opt(send)
        .args(&[SHOW_ENV])
        .run();
    out.expect_code(0, &c("exec"))
        .expect_stdout(&format!("{expected}\n"), &c("exec"));

    // With a pseudo-terminal.
    let out = ssh(d.port(), user(), &env_key)
        .flag("-tt")
        .opt(send)
        .args(&[SHOW_ENV])
        .run();
    out.expect_code(0, &c("pty"));
    assert_eq!(out.stdout_str().trim_end(), expected, "{}\n{out}", c("pty"));

    // Through skiff.
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let out = skiff_exec(&home, d.port(), user(), Some(&env_key))
        .opt(send)
        .cmd(SHOW_ENV)
        .run();
    out.expect_code(0, &c("skiff exec"))
        .expect_stdout(&format!("{expected}\n"), &c("skiff exec"));

    let log = d.log();
    for name in [
        "LD_PRELOAD",
        "BASH_ENV",
        "PYTHONPATH",
        "SSH_ORIGINAL_COMMAND",
    ] {
        assert!(
            log.contains(&format!(
                "refusing environment variable {name} sent by the client"
            )),
            "{}",
            c(name)
        );
    }
    assert!(
        log.contains("refusing environment variable LD_LIBRARY_PATH from an environment= option"),
        "{}",
        c("LD_LIBRARY_PATH from environment=")
    );
    assert!(
        !log.contains("/nonexistent"),
        "{}",
        c("values are never logged")
    );
}

/// A client may send any number of refused variables: the first eight get
/// a warning line each, then one line says the rest are not logged, and
/// the session runs. Before, every request wrote its own warning.
#[test]
fn refused_variables_flood_the_log_no_further_than_a_few_lines() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("AcceptEnv *\n"),
    );
    let vars: Vec<String> = (0..40).map(|i| format!("LD_FLOOD_{i}=x")).collect();
    let send = format!("SetEnv={}", vars.join(" "));
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt(&send)
        .args(&["echo ran"])
        .run();
    let c = ctx(&d, "40 refused variables");
    out.expect_code(0, &c).expect_stdout("ran\n", &c);
    let log = d.log();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("refusing environment variable LD_FLOOD_"))
        .count();
    assert_eq!(warned, 8, "{c}");
    assert!(log.contains("no longer logged one by one"), "{c}");
}
