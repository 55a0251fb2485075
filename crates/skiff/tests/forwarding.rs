//! skiffd's TCP forwarding, driven by stock OpenSSH: `ssh -W` and jump
//! hosts (ProxyCommand, and skiff's own `-J`), `ssh -L` and `ssh -R`, and
//! every rule that can refuse them (AllowTcpForwarding, PermitOpen,
//! PermitListen, the key's no-port-forwarding, permitopen and
//! permitlisten, ports below 1024).
//!
//! Everything runs on this machine, so the remote command can play the
//! application at the far end of a forwarding: it connects (with bash's
//! /dev/tcp) to the port that ssh or skiffd listens on, and a line echo
//! server that the test owns answers at the other end.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use common::server_context as ctx;
use common::*;

/// A TCP server on 127.0.0.1 that answers every line with `echo: LINE`
/// until the client ends its side, then closes. It serves until the test
/// process ends.
struct Echo {
    port: u16,
    connections: Arc<AtomicUsize>,
}

fn echo_server() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let mut out = stream.try_clone().expect("clone the stream");
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if writeln!(out, "echo: {line}").is_err() {
                        break;
                    }
                }
            });
        }
    });
    Echo { port, connections }
}

impl Echo {
    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A remote command that connects to 127.0.0.1:`port`, sends two lines
/// and prints the two lines that come back.
fn talk_to(port: u16) -> String {
    format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} || exit 7; printf \"one\\ntwo\\n\" >&3; head -n 2 <&3'"
    )
}

const TWO_ECHOES: &str = "echo: one\necho: two\n";

/// skiffd with `config` lines, serving the fixture's keys plus one key per
/// `(name, options)`.
fn skiffd_with<const N: usize>(
    config: &str,
    specs: [(&str, &str); N],
) -> Option<(Fixture, [Key; N], Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let keys = fx.keys_with_options(specs);
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config));
    Some((fx, keys, d))
}

/// `ssh -W 127.0.0.1:PORT` through the server on `server_port`, with two
/// lines of input.
fn ssh_w(server_port: u16, key: &Key, target_port: u16) -> CmdOutput {
    ssh(server_port, user(), key)
        .log_level("INFO")
        .flag("-W")
        .flag(&format!("127.0.0.1:{target_port}"))
        .input(Input::Bytes(b"one\ntwo\n".to_vec()))
        .run()
}

#[test]
fn ssh_w_relays_both_ways_and_passes_end_of_file_on() {
    let Some((fx, [], d)) = skiffd_with("", []) else {
        return;
    };
    let echo = echo_server();
    let c = || ctx(&d, "ssh -W through skiffd");
    // The echo server answers until ssh's end of input reaches it, and ssh
    // exits only once the server's close comes back: both ends of file
    // went through.
    ssh_w(d.port(), &fx.client_key, echo.port)
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
    assert_eq!(echo.connections(), 1, "{}", c());

    // A destination that refuses: the channel is refused, ssh says so.
    let closed = free_port();
    let out = ssh_w(d.port(), &fx.client_key, closed);
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(out.stderr.contains("open failed"), "{}\n{out}", c());
    assert!(
        d.log()
            .contains(&format!("forwarding to 127.0.0.1 port {closed} failed")),
        "{}",
        ctx(&d, "the failed connection is logged")
    );
}

#[test]
fn stock_ssh_and_skiff_jump_through_skiffd() {
    let Some((fx, [], jump)) = skiffd_with("", []) else {
        return;
    };
    let target = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let c = || {
        format!(
            "{}\n{}",
            ctx(&jump, "jump host"),
            ctx(&target, "destination")
        )
    };

    // OpenSSH with skiffd as its ProxyCommand's server (what -J does).
    let proxy = format!(
        "ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no \
         -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {} -p {} -W %h:%p {}@127.0.0.1",
        fx.client_key.private.display(),
        jump.port(),
        user()
    );
    ssh(target.port(), user(), &fx.client_key)
        .opt(&format!("ProxyCommand={proxy}"))
        .args(&["echo through; echo $SSH_CONNECTION"])
        .run()
        .expect_code(0, &c());
    assert!(
        jump.log()
            .contains(&format!("forwarding to 127.0.0.1 port {}", target.port())),
        "{}: the connection did not go through skiffd",
        c()
    );

    // skiff's own -J, with skiffd as the jump host.
    let home = ClientHome::new();
    let id = home.ssh_dir().join("id_ed25519");
    std::fs::copy(&fx.client_key.private, &id).unwrap();
    std::fs::set_permissions(&id, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    home.trust(jump.port(), &fx.host_key);
    home.trust(target.port(), &fx.host_key);
    let before = target.log().matches("Accepted publickey").count();
    let out = skiff_exec(&home, target.port(), user(), Some(&fx.client_key))
        .flag("-J")
        .flag(&format!("{}@127.0.0.1:{}", user(), jump.port()))
        .opt("StrictHostKeyChecking=yes")
        .cmd("echo through; echo $SSH_CONNECTION")
        .run();
    out.expect_code(0, &c());
    assert!(
        out.stdout_str().starts_with("through\n127.0.0.1 "),
        "{}\n{out}",
        c()
    );
    assert_eq!(
        target.log().matches("Accepted publickey").count(),
        before + 1,
        "{}",
        c()
    );
}

#[test]
fn ssh_l_and_ssh_r_through_skiffd() {
    let Some((fx, [], d)) = skiffd_with("", []) else {
        return;
    };
    let echo = echo_server();
    let c = || ctx(&d, "ssh -L / -R");

    // -L: ssh listens here, the remote command connects to ssh's port,
    // skiffd connects to the echo server.
    let local = free_port();
    ssh(d.port(), user(), &fx.client_key)
        .opt("ExitOnForwardFailure=yes")
        .flag("-L")
        .flag(&format!("127.0.0.1:{local}:127.0.0.1:{}", echo.port))
        .args(&[&talk_to(local)])
        .run()
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());

    // -R: skiffd listens, the remote command connects to skiffd's port,
    // ssh connects to the echo server. Twice at once on one listener.
    let remote = free_port();
    let both = format!("{} & {}; wait", talk_to(remote), talk_to(remote));
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt("ExitOnForwardFailure=yes")
        .flag("-R")
        .flag(&format!("{remote}:127.0.0.1:{}", echo.port))
        .args(&[&both])
        .run();
    out.expect_code(0, &c());
    assert_eq!(out.stdout_str(), TWO_ECHOES.repeat(2), "{}\n{out}", c());
    assert_eq!(echo.connections(), 3, "{}", c());

    // The listener belonged to that connection and is gone with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", remote)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}: skiffd still listens on {remote} after the connection ended",
            c()
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn forwarding_rules_refuse_what_they_do_not_allow() {
    let echo = echo_server();
    let other = echo_server();
    let permit = format!("permitopen=\"127.0.0.1:{}\"", echo.port);
    let Some((fx, [restricted, no_forwarding, narrow], d)) = skiffd_with(
        "",
        [
            ("restricted", "restrict"),
            ("noforward", "no-port-forwarding"),
            ("narrow", &permit),
        ],
    ) else {
        return;
    };
    let c = || ctx(&d, "key options");
    for key in [&restricted, &no_forwarding] {
        let out = ssh_w(d.port(), key, echo.port);
        assert_eq!(out.code, 255, "{}\n{out}", c());
        assert!(
            out.stderr.contains("administratively prohibited"),
            "{}\n{out}",
            c()
        );
    }
    ssh_w(d.port(), &narrow, echo.port)
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
    let out = ssh_w(d.port(), &narrow, other.port);
    assert!(
        out.stderr.contains("administratively prohibited"),
        "{}\n{out}",
        c()
    );
    assert_eq!(other.connections(), 0, "{}", c());
    assert!(d.log().contains("permitopen does not list"), "{}", c());

    // A restricted key may not listen either; nor may anyone below 1024
    // unless root.
    let out = ssh(d.port(), user(), &restricted)
        .opt("ExitOnForwardFailure=yes")
        .flag("-R")
        .flag(&format!("{}:127.0.0.1:{}", free_port(), echo.port))
        .args(&["echo should not run"])
        .run();
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(out.stderr.contains("forwarding failed"), "{}\n{out}", c());
    if account().uid != 0 {
        let out = ssh(d.port(), user(), &fx.client_key)
            .opt("ExitOnForwardFailure=yes")
            .flag("-R")
            .flag(&format!("1000:127.0.0.1:{}", echo.port))
            .args(&["echo should not run"])
            .run();
        assert_eq!(out.code, 255, "{}\n{out}", c());
        assert!(
            d.log().contains("only root may listen on port 1000"),
            "{}",
            c()
        );
    }
    // The plain key forwards: the refusals above came from the options.
    ssh_w(d.port(), &fx.client_key, other.port)
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
}

#[test]
fn server_settings_refuse_what_they_do_not_allow() {
    let echo = echo_server();
    let other = echo_server();
    let config = format!(
        "AllowTcpForwarding local\nPermitOpen 127.0.0.1:{} localhost:*\n",
        echo.port
    );
    let Some((fx, [], d)) = skiffd_with(&config, []) else {
        return;
    };
    let c = || ctx(&d, "AllowTcpForwarding local, PermitOpen");
    ssh_w(d.port(), &fx.client_key, echo.port)
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
    let out = ssh_w(d.port(), &fx.client_key, other.port);
    assert!(
        out.stderr.contains("administratively prohibited"),
        "{}\n{out}",
        c()
    );
    assert!(d.log().contains("PermitOpen does not list"), "{}", c());
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt("ExitOnForwardFailure=yes")
        .flag("-R")
        .flag(&format!("{}:127.0.0.1:{}", free_port(), echo.port))
        .args(&["echo should not run"])
        .run();
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(
        d.log().contains("does not allow remote forwarding"),
        "{}",
        c()
    );

    let Some((fx, [], d)) = skiffd_with("DisableForwarding yes\n", []) else {
        return;
    };
    let c = || ctx(&d, "DisableForwarding");
    let out = ssh_w(d.port(), &fx.client_key, echo.port);
    assert!(
        out.stderr.contains("administratively prohibited"),
        "{}\n{out}",
        c()
    );
    // Sessions still work.
    ssh(d.port(), user(), &fx.client_key)
        .args(&["echo ok"])
        .run()
        .expect_code(0, &c())
        .expect_stdout("ok\n", &c());
}
