//! Clients other than OpenSSH's against skiffd: dropbear's `dbclient` and
//! PuTTY's `plink`, `pscp` and `psftp`. Each checks skiffd's host key its
//! own way (dbclient against a known_hosts line, PuTTY against the pinned
//! fingerprint `-hostkey`), logs in with the fixture's client key converted
//! to its own format, and runs commands or moves files as a user would
//! (SFTP, and the old SCP protocol), on terminals, with forwardings and a
//! forwarded agent.
//!
//! Run as root (as CI does), the remote side is the `skiff-test` account.

use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

/// Longest a client here may take.
const LIMIT: Duration = Duration::from_secs(60);

/// A HOME for the client, and the client key in its format.
struct Client {
    home: TempDir,
    key: PathBuf,
}

/// dbclient with a HOME whose known_hosts holds `host_key` for 127.0.0.1
/// (so the key is checked, never accepted blindly) and the client key
/// converted. dbclient (2022.83) looks a host up by name alone, whatever
/// the port: no `[127.0.0.1]:PORT` entry.
fn dbclient_home(fx: &Fixture, host_key: &Key) -> Client {
    let home = tempdir();
    let dot_ssh = home.path().join(".ssh");
    std::fs::create_dir(&dot_ssh).expect("mkdir .ssh");
    write_file(
        &dot_ssh.join("known_hosts"),
        format!("127.0.0.1 {}\n", host_key.key_material()),
        0o600,
    );
    let key = home.path().join("id.dropbear");
    dropbear_key(&fx.client_key, &key);
    Client { home, key }
}

/// `dbclient` with the key of `c`, to skiffd, with `options` before the
/// destination and then `command`.
fn dbclient_with(c: &Client, d: &Skiffd, options: &[&str], command: &str) -> Run {
    Run::new("dbclient")
        .env("HOME", c.home.path())
        .arg("-i")
        .arg(&c.key)
        .args(["-p", &d.port().to_string()])
        .args(options)
        .arg(format!("{}@127.0.0.1", user()))
        .arg(command)
        .timeout(LIMIT)
}

fn dbclient(c: &Client, d: &Skiffd, command: &str) -> Run {
    dbclient_with(c, d, &[], command)
}

#[test]
fn dbclient_runs_commands_with_their_status_output_and_input() {
    if !require_dropbear() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let client = dbclient_home(&fx, &fx.host_key);
    check_commands("dbclient", &d, |command| dbclient(&client, &d, command));
}

#[test]
fn dbclient_refuses_skiffd_under_another_host_key() {
    if !require_dropbear() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let client = dbclient_home(&fx, &fx.stranger_key);
    let c = ctx(&d, "dbclient expecting another host key");
    let out = dbclient(&client, &d, "echo ran").run();
    check_refused(&out, &c);
    assert!(out.stderr.contains("mismatch"), "{c}\n{out}");
}

/// A client that refused the server ran nothing.
fn check_refused(out: &CmdOutput, c: &str) {
    assert_ne!(out.code, 0, "{c}\n{out}");
    assert!(out.stdout.is_empty(), "{c}: nothing ran\n{out}");
}

/// What `client` (whose command line for a remote command `run` builds)
/// must do against skiffd: a command's status, output and error output,
/// its input, and an output larger than any window.
fn check_commands(client: &str, d: &Skiffd, run: impl Fn(&str) -> Run) {
    let c = ctx(
        d,
        &format!("{client}: a command that writes both ways and exits 4"),
    );
    let out = run("echo out; echo err >&2; exit 4").run();
    out.expect_code(4, &c).expect_stdout("out\n", &c);
    assert!(out.stderr.contains("err\n"), "{c}\n{out}");

    // Outputs of more than a pipe's worth go into a file: dbclient 2022.83
    // sometimes never exits after a large output into a pipe read slowly
    // (the test's reader, on a loaded machine), though the channel was
    // closed both ways and every byte written out; it does so against
    // OpenSSH's sshd too.
    let scratch = tempdir();
    let into = scratch.path().join("out");

    let c = ctx(d, &format!("{client}: input through cat"));
    let input: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_be_bytes()).collect();
    let out = run("cat")
        .input(Input::Bytes(input.clone()))
        .stdout_to(&into)
        .run();
    out.expect_code(0, &c);
    let back = std::fs::read(&into).expect("read the output");
    assert!(back == input, "{c}: {} bytes back", back.len());

    let c = ctx(d, &format!("{client}: a large output"));
    let out = run("head -c 20000000 /dev/zero").stdout_to(&into).run();
    out.expect_code(0, &c);
    let written = std::fs::read(&into).expect("read the output");
    assert_eq!(written.len(), 20_000_000, "{c}");
    assert!(written.iter().all(|&b| b == 0), "{c}: only zeros");
}

/// A HOME for PuTTY's tools (they keep a random seed there) and the key
/// as a `.ppk`.
fn putty_home(fx: &Fixture) -> Client {
    let home = tempdir();
    let key = home.path().join("id.ppk");
    putty_key(&fx.client_key, &key);
    Client { home, key }
}

/// `tool -batch` (never a prompt) with `pinned` as the only host key it
/// accepts, to skiffd's port (`-P` for all three), no key of its own.
fn putty_pinned(tool: &str, c: &Client, pinned: &Key, d: &Skiffd) -> Run {
    Run::new(tool)
        .env("HOME", c.home.path())
        .args(["-batch", "-P", &d.port().to_string()])
        .args(["-hostkey", &pinned.fingerprint()])
        .timeout(LIMIT)
}

/// [`putty_pinned`] with skiffd's own host key, logging in with the key.
fn putty(tool: &str, c: &Client, fx: &Fixture, d: &Skiffd) -> Run {
    putty_pinned(tool, c, &fx.host_key, d).arg("-i").arg(&c.key)
}

#[test]
fn plink_runs_commands_with_their_status_output_and_input() {
    if !require_putty() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let client = putty_home(&fx);
    let dest = format!("{}@127.0.0.1", user());
    check_commands("plink", &d, |command| {
        putty("plink", &client, &fx, &d).args(["-ssh", &dest, command])
    });
}

#[test]
fn plink_refuses_skiffd_under_another_host_key() {
    if !require_putty() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let client = putty_home(&fx);
    let c = ctx(&d, "plink pinned to another host key");
    let out = putty_pinned("plink", &client, &fx.stranger_key, &d)
        .arg("-i")
        .arg(&client.key)
        .args(["-ssh", &format!("{}@127.0.0.1", user()), "echo ran"])
        .run();
    check_refused(&out, &c);
}

#[test]
fn pscp_and_psftp_move_files_both_ways() {
    if !require_putty() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let client = putty_home(&fx);
    let work = tempdir();
    let src = work.path().join("src");
    let sum = random_file(&src, 3_000_000);
    let remote_dir = account_dir();
    let remote = |p: &Path| format!("{}@127.0.0.1:{}", user(), p.display());

    // SFTP (pscp's default), then the old SCP protocol (`scp -t`/`scp -f`
    // run as commands), each both ways.
    for (protocol, flags) in [("sftp", &[][..]), ("scp", &["-scp"][..])] {
        let up = remote_dir.path().join(format!("up-{protocol}"));
        let c = ctx(&d, &format!("pscp ({protocol}): upload"));
        putty("pscp", &client, &fx, &d)
            .args(flags)
            .arg(&src)
            .arg(remote(&up))
            .run()
            .expect_code(0, &c);
        assert_eq!(sha256(&up), sum, "{c}");
        let down = work.path().join(format!("down-{protocol}"));
        let c = ctx(&d, &format!("pscp ({protocol}): download"));
        putty("pscp", &client, &fx, &d)
            .args(flags)
            .arg(remote(&up))
            .arg(&down)
            .run()
            .expect_code(0, &c);
        assert_eq!(sha256(&down), sum, "{c}");
    }

    // A session of psftp's commands: a directory made, a file put, renamed,
    // got back, a transfer resumed each way, the files and the directory
    // removed.
    let back = work.path().join("back");
    let dir = remote_dir.path().join("d");
    // Resumed transfers (`reput`, `reget`): the first 100,000 bytes are
    // there, the rest is written from that offset.
    let (part, partial) = (work.path().join("part"), work.path().join("partial"));
    let first = std::fs::read(&src).expect("read the source")[..100_000].to_vec();
    std::fs::write(&part, &first).expect("write part");
    std::fs::write(&partial, &first).expect("write partial");
    let script = work.path().join("script");
    write_file(
        &script,
        format!(
            "mkdir {dir}\nput {src} {dir}/a\nmv {dir}/a {dir}/b\nls {dir}\nget {dir}/b {back}\n\
             put {part} {dir}/c\nreput {src} {dir}/c\nreget {dir}/c {partial}\n\
             rm {dir}/b\nrm {dir}/c\nrmdir {dir}\nquit\n",
            dir = dir.display(),
            src = src.display(),
            back = back.display(),
            part = part.display(),
            partial = partial.display(),
        ),
        0o644,
    );
    let c = ctx(&d, "psftp: a session");
    let out = putty("psftp", &client, &fx, &d)
        .arg("-b")
        .arg(&script)
        .arg(format!("{}@127.0.0.1", user()))
        .run();
    out.expect_code(0, &c);
    assert!(out.stdout_str().contains(" b\n"), "{c}: ls shows b\n{out}");
    assert_eq!(sha256(&back), sum, "{c}");
    assert_eq!(
        sha256(&partial),
        sum,
        "{c}: reput, then reget, completed it"
    );
    assert!(!dir.exists(), "{c}: the directory was removed");
}

/// dbclient's `-B` and plink's `-nc` (a direct-tcpip channel, as `ssh -W`)
/// and both clients' `-R` (skiffd listens, the client connects what comes
/// in), to a line echo server.
#[test]
fn dbclient_and_plink_forward_both_ways_through_skiffd() {
    if !require_dropbear() || !require_putty() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let echo = echo_server();
    let target = format!("127.0.0.1:{}", echo.port);
    let lines = || Input::Bytes(b"one\ntwo\n".to_vec());
    let db = dbclient_home(&fx, &fx.host_key);
    let putty_client = putty_home(&fx);
    let dest = format!("{}@127.0.0.1", user());

    let c = ctx(&d, "dbclient -B through skiffd");
    Run::new("dbclient")
        .env("HOME", db.home.path())
        .arg("-i")
        .arg(&db.key)
        .args(["-p", &d.port().to_string(), "-B", &target, &dest])
        .input(lines())
        .timeout(LIMIT)
        .run()
        .expect_code(0, &c)
        .expect_stdout(TWO_ECHOES, &c);

    let c = ctx(&d, "plink -nc through skiffd");
    putty("plink", &putty_client, &fx, &d)
        .args(["-ssh", "-nc", &target, &dest])
        .input(lines())
        .run()
        .expect_code(0, &c)
        .expect_stdout(TWO_ECHOES, &c);

    let remote = free_port();
    let c = ctx(&d, "dbclient -R through skiffd");
    let forward = format!("127.0.0.1:{remote}:{target}");
    dbclient_with(&db, &d, &["-R", &forward], &talk_to_command(remote))
        .run()
        .expect_code(0, &c)
        .expect_stdout(TWO_ECHOES, &c);

    let remote = free_port();
    let c = ctx(&d, "plink -R through skiffd");
    putty("plink", &putty_client, &fx, &d)
        .args(["-ssh", "-R", &format!("127.0.0.1:{remote}:{target}"), &dest])
        .arg(talk_to_command(remote))
        .run()
        .expect_code(0, &c)
        .expect_stdout(TWO_ECHOES, &c);
    assert_eq!(echo.connections(), 4, "{c}");
}

/// dbclient and plink, each on a terminal of its own, ask skiffd for one
/// (`-t`): the command runs on a pseudo-terminal, what is typed reaches
/// it, and its status comes back.
#[test]
fn dbclient_and_plink_get_a_terminal() {
    if !require_dropbear() || !require_putty() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let db = dbclient_home(&fx, &fx.host_key);
    let putty_client = putty_home(&fx);
    let dest = format!("{}@127.0.0.1", user());
    let remote = "tty; echo ready; read x; echo \"got:$x\"; exit 3";
    let mut dbclient = std::process::Command::new("dbclient");
    dbclient
        .env("HOME", db.home.path())
        .arg("-t")
        .arg("-i")
        .arg(&db.key)
        .args(["-p", &d.port().to_string(), &dest, remote]);
    let mut plink = std::process::Command::new("plink");
    plink
        .env("HOME", putty_client.home.path())
        .args(["-batch", "-t", "-ssh", "-P", &d.port().to_string(), "-i"])
        .arg(&putty_client.key)
        .args(["-hostkey", &fx.host_key.fingerprint(), &dest, remote]);
    for (client, cmd) in [("dbclient", dbclient), ("plink", plink)] {
        let c = ctx(&d, &format!("{client} -t on a terminal"));
        let mut term = OnTerminal::spawn(cmd);
        term.wait_for("ready", LIMIT);
        term.type_line("hello");
        term.wait_for("got:hello", LIMIT);
        let status = term.wait(LIMIT);
        assert_eq!(status.code(), Some(3), "{c}\n{}", term.output());
        assert!(
            term.output().contains("/dev/pts/"),
            "{c}\n{}",
            term.output()
        );
    }
}

/// A client that has neither AEAD cipher (played by dbclient limited to
/// `aes128-ctr` and `hmac-sha2-256`, as a dropbear before 2020.79 was) is
/// refused by skiffd's defaults, and served once the configuration adds
/// the two, as the README says.
#[test]
fn a_client_without_aead_ciphers_needs_them_added() {
    if !require_dropbear() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let old_algorithms = ["-c", "aes128-ctr", "-m", "hmac-sha2-256"];
    let client = dbclient_home(&fx, &fx.host_key);
    let c = ctx(&d, "dbclient with aes128-ctr alone, default skiffd");
    let out = dbclient_with(&client, &d, &old_algorithms, "echo ran").run();
    check_refused(&out, &c);
    assert!(out.stderr.contains("No matching algo"), "{c}\n{out}");

    let added = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config("Ciphers +aes128-ctr\nMACs +hmac-sha2-256\n"),
    );
    let c = ctx(&added, "dbclient with aes128-ctr alone, both added");
    dbclient_with(&client, &added, &old_algorithms, "echo ran")
        .run()
        .expect_code(0, &c)
        .expect_stdout("ran\n", &c);
}

/// dbclient's `-A`: skiffd makes the account a socket for the forwarded
/// agent, and what the client's ssh-agent holds is listed through it.
#[test]
fn dbclient_forwards_its_agent_through_skiffd() {
    if !require_dropbear() {
        return;
    }
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let agent = Agent::start();
    agent.add(&fx.rsa_key);
    let client = dbclient_home(&fx, &fx.host_key);
    let c = ctx(&d, "dbclient -A");
    let out = dbclient_with(&client, &d, &["-A"], "ssh-add -L")
        .env("SSH_AUTH_SOCK", &agent.sock)
        .run();
    out.expect_code(0, &c);
    assert!(
        out.stdout_str().contains(&fx.rsa_key.key_material()),
        "{c}: the agent's key is listed\n{out}"
    );
    // Without -A, nothing is forwarded.
    let out = dbclient(&client, &d, "echo \"[$SSH_AUTH_SOCK]\"")
        .env("SSH_AUTH_SOCK", &agent.sock)
        .run();
    out.expect_code(0, &c).expect_stdout("[]\n", &c);
}

/// Password logins from dbclient (`DROPBEAR_PASSWORD`) and plink (`-pw`,
/// which tries keyboard-interactive first) to skiffd with `UsePAM yes`
/// (pam_unix; skiffd checks passwords only through PAM): the right
/// password logs in, a wrong one is refused and runs nothing.
#[test]
fn dbclient_and_plink_log_in_with_a_password() {
    if !require_dropbear() || !require_putty() || !require_tool("chpasswd", "passwd") {
        return;
    }
    const PASSWORD: &str = "Corr3ctHorseBattery";
    let acct = TempAccount::with_password("opw", "/bin/sh", PASSWORD);
    let service = PamService::new(
        "opw",
        "auth required pam_unix.so\naccount required pam_unix.so\n",
    );
    let fx = Fixture::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config(&format!("UsePAM yes\nPAMServiceName {}\n", service.name())),
    );
    let db = dbclient_home(&fx, &fx.host_key);
    let putty_client = putty_home(&fx);
    let dest = format!("{}@127.0.0.1", acct.name());
    for (password, code) in [(PASSWORD, 0), ("wrongPassword", 1)] {
        let c = ctx(&d, &format!("dbclient with a password, expecting {code}"));
        let out = Run::new("dbclient")
            .env("HOME", db.home.path())
            .env("DROPBEAR_PASSWORD", password)
            .args(["-p", &d.port().to_string(), &dest, "id -un"])
            .timeout(LIMIT)
            .run();
        match code {
            0 => {
                out.expect_code(0, &c)
                    .expect_stdout(&format!("{}\n", acct.name()), &c);
            }
            // dbclient exits 0 when the server disconnects it after the
            // tries it allows ("Disconnect received"): what counts is that
            // nothing ran.
            _ => assert!(out.stdout.is_empty(), "{c}: nothing ran\n{out}"),
        }

        let c = ctx(&d, &format!("plink -pw, expecting {code}"));
        let out = putty_pinned("plink", &putty_client, &fx.host_key, &d)
            .args(["-ssh", "-pw", password, &dest, "id -un"])
            .run();
        match code {
            0 => {
                out.expect_code(0, &c)
                    .expect_stdout(&format!("{}\n", acct.name()), &c);
            }
            _ => check_refused(&out, &c),
        }
    }
    let log = d.log();
    assert!(
        log.contains(&format!("Failed password for {}", acct.name()))
            || log.contains(&format!(
                "Failed keyboard-interactive/pam for {}",
                acct.name()
            )),
        "{}",
        ctx(&d, "the wrong passwords are logged")
    );
}
