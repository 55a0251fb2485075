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

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A remote command that connects to 127.0.0.1:`port`, sends two lines
/// and prints the two lines that come back.
fn talk_to(port: u16) -> String {
    format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} || exit 7; printf \"one\\ntwo\\n\" >&3; head -n 2 <&3'"
    )
}

/// skiffd with `config` lines, serving the fixture's keys plus one key per
/// `(name, options)`.
fn skiffd_with<const N: usize>(
    config: &str,
    specs: [(&str, &str); N],
) -> Option<(Fixture, [Key; N], Skiffd)> {
    skiffd_configured(Some(config), specs)
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

// ---------------------------------------------------------------------------
// skiff ssh -L, -R, -D, -N against sshd and skiffd
// ---------------------------------------------------------------------------

/// A home whose `~/.ssh/config` names the server `box`, trusted.
fn client_home(server: &dyn Daemon, fx: &Fixture) -> ClientHome {
    let home = ClientHome::new();
    name_server_box(&home, server, fx);
    home
}

/// `skiff ssh ARGS...` run with `home`, directly (no agent).
fn skiff_ssh(home: &ClientHome, args: &[&str]) -> Run {
    Run::new(skiff_bin())
        .env("HOME", home.path())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .arg("ssh")
        .args(args)
}

/// `skiff ssh` with `home`, directly (no agent), as a process to start
/// and leave running.
fn skiff_ssh_process(home: &ClientHome) -> std::process::Command {
    let mut cmd = std::process::Command::new(skiff_bin());
    cmd.env("HOME", home.path())
        .env("SKIFF_AGENT", "off")
        .env_remove("SSH_AUTH_SOCK")
        .arg("ssh");
    cmd
}

/// A stock sshd and a skiffd serving the same fixture.
fn both_servers() -> Option<(Fixture, Vec<Box<dyn Daemon>>)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let sshd = Sshd::start(&fx.host_key, &fx.authorized_keys, &[]);
    let skiffd = Skiffd::start(&fx.host_key, &fx.authorized_keys);
    Some((fx, vec![Box::new(sshd), Box::new(skiffd)]))
}

#[test]
fn skiff_ssh_local_and_remote_forwarding() {
    let Some((fx, servers)) = both_servers() else {
        return;
    };
    let echo = echo_server();
    for server in &servers {
        let server = server.as_ref();
        let home = client_home(server, &fx);
        let c = || ctx(server, "skiff ssh -L/-R");
        let local = free_port();
        let spec = format!("{local}:127.0.0.1:{}", echo.port);
        skiff_ssh(&home, &["-L", &spec, "box", &talk_to(local)])
            .run()
            .expect_code(0, &c())
            .expect_stdout(TWO_ECHOES, &c());

        let remote = free_port();
        let spec = format!("{remote}:127.0.0.1:{}", echo.port);
        skiff_ssh(&home, &["-R", &spec, "box", &talk_to(remote)])
            .run()
            .expect_code(0, &c())
            .expect_stdout(TWO_ECHOES, &c());

        // A port already taken: a warning, and the command runs anyway;
        // with ExitOnForwardFailure, an error and nothing runs.
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = format!(
            "127.0.0.1:{}:127.0.0.1:{}",
            taken.local_addr().unwrap().port(),
            echo.port
        );
        let out = skiff_ssh(&home, &["-L", &busy, "box", "echo ran"]).run();
        out.expect_code(0, &c()).expect_stdout("ran\n", &c());
        assert!(
            out.stderr.contains("warning") && out.stderr.contains("cannot listen"),
            "{}\n{out}",
            c()
        );
        let out = skiff_ssh(
            &home,
            &[
                "-o",
                "ExitOnForwardFailure=yes",
                "-L",
                &busy,
                "box",
                "echo ran",
            ],
        )
        .run();
        out.expect_code(255, &c()).expect_stdout("", &c());
        assert!(out.stderr.contains("cannot listen"), "{}\n{out}", c());
    }
    // One connection per server for -L and one for -R.
    assert_eq!(echo.connections(), 2 * servers.len());
}

/// A program left running in the background, its stderr in a file; killed
/// on drop.
struct Background {
    child: std::process::Child,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Background {
    fn start(mut cmd: std::process::Command) -> Background {
        let dir = tempdir();
        let stderr = dir.path().join("stderr");
        let file = std::fs::File::create(&stderr).unwrap();
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(file);
        let child = cmd.spawn().expect("spawn");
        Background {
            child,
            stderr,
            _dir: dir,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Polls (at most 20 s) until `found` finds something in stderr.
    fn wait_for<T>(&mut self, what: &str, found: impl Fn(&str) -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(v) = found(&self.stderr()) {
                return v;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "exited ({status}) before {what}; stderr:\n{}",
                    self.stderr()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; stderr:\n{}",
                self.stderr()
            );
            thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP or Unix stream the echo checks can use.
trait EchoPeer: std::io::Read + Write {
    fn limit_reads(&self);
    fn end_writing(&self);
}

impl EchoPeer for TcpStream {
    fn limit_reads(&self) {
        self.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
    }
    fn end_writing(&self) {
        self.shutdown(std::net::Shutdown::Write).unwrap();
    }
}

impl EchoPeer for std::os::unix::net::UnixStream {
    fn limit_reads(&self) {
        self.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
    }
    fn end_writing(&self) {
        self.shutdown(std::net::Shutdown::Write).unwrap();
    }
}

/// Sends two lines on `stream` (after its handshake) and checks the echoes.
fn check_echoes(mut stream: impl EchoPeer, context: &str) {
    stream.limit_reads();
    stream.write_all(b"one\ntwo\n").unwrap();
    stream.end_writing();
    let mut back = String::new();
    stream.read_to_string(&mut back).unwrap();
    assert_eq!(back, TWO_ECHOES, "{context}");
}

/// Connects to `port`, retrying (at most 20 s) until something listens.
fn connect_when_listening(port: u16) -> TcpStream {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "port {port}: {e}");
                thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// Asks the SOCKS proxy on `proxy_port` (SOCKS 5, the destination by
/// name, as curl --socks5-hostname does) for 127.0.0.1:`port`; returns
/// the stream once the proxy says it is connected.
fn socks5_by_name(proxy_port: u16, port: u16, context: &str) -> TcpStream {
    let mut s = connect_when_listening(proxy_port);
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut reply = [0u8; 2];
    std::io::Read::read_exact(&mut s, &mut reply).unwrap();
    assert_eq!(reply, [5, 0], "SOCKS 5 method: {context}");
    let mut request = vec![5, 1, 0, 3, 9];
    request.extend_from_slice(b"127.0.0.1");
    request.extend_from_slice(&port.to_be_bytes());
    s.write_all(&request).unwrap();
    let mut reply = [0u8; 10];
    std::io::Read::read_exact(&mut s, &mut reply).unwrap();
    assert_eq!(reply[..2], [5, 0], "SOCKS 5 connect: {context}");
    s
}

#[test]
fn skiff_ssh_n_with_a_socks_proxy_and_a_remote_port_the_server_picks() {
    let Some((fx, servers)) = both_servers() else {
        return;
    };
    let echo = echo_server();
    for server in &servers {
        let server = server.as_ref();
        let home = client_home(server, &fx);
        let socks_port = free_port();
        let mut cmd = skiff_ssh_process(&home);
        cmd.args(["-N", "-D", &socks_port.to_string(), "-R"])
            .arg(format!("0:127.0.0.1:{}", echo.port))
            .arg("box");
        let mut skiff = Background::start(cmd);
        let c = |what: &str, skiff: &Background| {
            format!("{}\nskiff stderr:\n{}", ctx(server, what), skiff.stderr())
        };
        let allocated: u16 = skiff.wait_for("the allocated port", |text| {
            let rest = text.split("Allocated port ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        });

        // The server listens on the port it picked; connections come back
        // through skiff to the echo server.
        check_echoes(connect_when_listening(allocated), &c("-R 0", &skiff));

        // SOCKS 5 with a host name, the way curl --socks5-hostname asks.
        let s = socks5_by_name(socks_port, echo.port, &c("SOCKS 5", &skiff));
        check_echoes(s, &c("SOCKS 5", &skiff));

        // SOCKS 4 with an address.
        let mut s = connect_when_listening(socks_port);
        let mut request = vec![4, 1];
        request.extend_from_slice(&echo.port.to_be_bytes());
        request.extend_from_slice(&[127, 0, 0, 1, 0]);
        s.write_all(&request).unwrap();
        let mut reply = [0u8; 8];
        std::io::Read::read_exact(&mut s, &mut reply).unwrap();
        assert_eq!(reply[..2], [0, 0x5a], "{}", c("SOCKS 4", &skiff));
        check_echoes(s, &c("SOCKS 4", &skiff));

        // A destination that refuses: the SOCKS client hears so.
        let mut s = connect_when_listening(socks_port);
        let closed = free_port();
        let mut request = vec![5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1];
        request.extend_from_slice(&closed.to_be_bytes());
        s.write_all(&request).unwrap();
        let mut reply = [0u8; 12];
        std::io::Read::read_exact(&mut s, &mut reply).unwrap();
        assert_eq!(reply[..2], [5, 0], "{}", c("SOCKS 5 method", &skiff));
        assert_eq!(reply[2..4], [5, 5], "{}", c("SOCKS 5 refused", &skiff));
        drop(s);

        // -N runs nothing and stays until stopped.
        assert!(
            skiff.child.try_wait().unwrap().is_none(),
            "{}",
            c("-N", &skiff)
        );
    }
    assert_eq!(echo.connections(), 3 * servers.len());
}

#[test]
fn skiff_ssh_reports_forwardings_the_server_refuses() {
    let Some((fx, [], d)) = skiffd_with("AllowTcpForwarding no\n", []) else {
        return;
    };
    let echo = echo_server();
    let home = client_home(&d, &fx);
    let c = || ctx(&d, "AllowTcpForwarding no");
    // The local listener takes the connection; the server refuses the
    // channel, so the remote command reads nothing back (its connection
    // is closed, or reset if its lines were still unread).
    let local = free_port();
    let spec = format!("{local}:127.0.0.1:{}", echo.port);
    let out = skiff_ssh(&home, &["-L", &spec, "box", &talk_to(local)]).run();
    out.expect_stdout("", &c());
    assert!(
        out.stderr.contains("administratively prohibited"),
        "{}\n{out}",
        c()
    );
    let spec = format!("{}:127.0.0.1:{}", free_port(), echo.port);
    let out = skiff_ssh(
        &home,
        &[
            "-o",
            "ExitOnForwardFailure=yes",
            "-R",
            &spec,
            "box",
            "echo ran",
        ],
    )
    .run();
    out.expect_code(255, &c()).expect_stdout("", &c());
    assert!(out.stderr.contains("refused to listen"), "{}\n{out}", c());
    assert_eq!(echo.connections(), 0, "{}", c());
}

#[test]
fn forwardings_from_the_configuration_apply_to_skiff_ssh() {
    let Some((fx, [], d)) = skiffd_with("", []) else {
        return;
    };
    let echo = echo_server();
    let home = client_home(&d, &fx);
    let local = free_port();
    let config = home.ssh_dir().join("config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replace(
        "Host box\n",
        &format!(
            "Host box\n  LocalForward {local} 127.0.0.1:{}\n  ExitOnForwardFailure yes\n",
            echo.port
        ),
    );
    write_file(&config, &text, 0o600);
    let c = || ctx(&d, "LocalForward in ~/.ssh/config");

    let out = skiff_ssh(&home, &["-G", "box"]).run();
    out.expect_code(0, &c());
    let shown = out.stdout_str();
    assert!(
        shown.contains(&format!("localforward {local} [127.0.0.1]:{}\n", echo.port)),
        "{shown}"
    );
    assert!(shown.contains("exitonforwardfailure yes\n"), "{shown}");

    skiff_ssh(&home, &["box", &talk_to(local)])
        .run()
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
    // ClearAllForwardings turns it off: nothing listens, bash cannot connect.
    let out = skiff_ssh(
        &home,
        &["-o", "ClearAllForwardings=yes", "box", &talk_to(local)],
    )
    .run();
    out.expect_code(7, &c());
    // skiff exec never forwards.
    let out = Run::new(skiff_bin())
        .env("HOME", home.path())
        .env("SKIFF_AGENT", "off")
        .args(["exec", "box", &talk_to(local)])
        .run();
    out.expect_code(7, &c());
    assert_eq!(echo.connections(), 1, "{}", c());
}

// ---------------------------------------------------------------------------
// Agent forwarding
// ---------------------------------------------------------------------------

/// A remote command that shows the forwarded agent: its socket's owner and
/// mode, its directory's mode, and the keys it holds.
const SHOW_AGENT: &str =
    "stat -c '%U %a' \"$SSH_AUTH_SOCK\" \"$(dirname \"$SSH_AUTH_SOCK\")\"; ssh-add -L";

#[test]
fn stock_ssh_forwards_its_agent_through_skiffd() {
    let Some((fx, [restricted], d)) = skiffd_with("", [("restricted", "no-agent-forwarding")])
    else {
        return;
    };
    let agent = Agent::start();
    agent.add(&fx.rsa_key);
    let c = || ctx(&d, "ssh -A");
    let out = ssh(d.port(), user(), &fx.client_key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .flag("-A")
        .args(&[SHOW_AGENT])
        .run();
    out.expect_code(0, &c());
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("{} 600", user()).as_str()),
        "{}\n{out}",
        c()
    );
    assert_eq!(
        lines.get(1).copied(),
        Some(format!("{} 700", user()).as_str()),
        "{}\n{out}",
        c()
    );
    let rsa = fx.rsa_key.pub_line();
    let rsa_material = rsa.split_whitespace().nth(1).unwrap();
    assert!(
        text.contains(rsa_material),
        "{}: the agent's key is listed\n{out}",
        c()
    );

    // The socket and its directory go with the connection.
    let out_path = ssh(d.port(), user(), &fx.client_key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .flag("-A")
        .args(&["echo $SSH_AUTH_SOCK"])
        .run();
    let socket = out_path.stdout_str().trim().to_string();
    assert!(
        socket.starts_with("/tmp/skiff-agent-"),
        "{}\n{out_path}",
        c()
    );
    let dir = std::path::Path::new(&socket)
        .parent()
        .unwrap()
        .to_path_buf();
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dir.exists() {
        assert!(
            std::time::Instant::now() < gone,
            "{}: {socket} outlived its connection",
            c()
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }

    // Without -A, or with a key that may not forward, there is no agent.
    let out = ssh(d.port(), user(), &fx.client_key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .args(&["echo \"[$SSH_AUTH_SOCK]\""])
        .run();
    out.expect_stdout("[]\n", &c());
    let out = ssh(d.port(), user(), &restricted)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .flag("-A")
        .args(&["echo \"[$SSH_AUTH_SOCK]\""])
        .run();
    out.expect_stdout("[]\n", &c());
    assert!(d.log().contains("refusing agent forwarding"), "{}", c());
}

#[test]
fn skiff_forwards_the_agent_to_sshd_and_skiffd() {
    let Some((fx, servers)) = both_servers() else {
        return;
    };
    let agent = Agent::start();
    agent.add(&fx.rsa_key);
    let rsa = fx.rsa_key.pub_line();
    let rsa_material = rsa.split_whitespace().nth(1).unwrap().to_string();
    for server in &servers {
        let server = server.as_ref();
        let home = client_home(server, &fx);
        let c = || ctx(server, "skiff -A");
        let with_agent = |args: &[&str]| {
            skiff_ssh(&home, args)
                .env("SSH_AUTH_SOCK", &agent.sock)
                .run()
        };
        let out = with_agent(&["-A", "box", "ssh-add -L"]);
        out.expect_code(0, &c());
        assert!(out.stdout_str().contains(&rsa_material), "{}\n{out}", c());
        // ForwardAgent in the configuration, and skiff exec too.
        let out = Run::new(skiff_bin())
            .env("HOME", home.path())
            .env("SKIFF_AGENT", "off")
            .env("SSH_AUTH_SOCK", &agent.sock)
            .args(["exec", "-o", "ForwardAgent=yes", "box", "ssh-add -L"])
            .run();
        out.expect_code(0, &c());
        assert!(out.stdout_str().contains(&rsa_material), "{}\n{out}", c());
        // Without it, nothing is forwarded.
        let out = with_agent(&["box", "echo \"[$SSH_AUTH_SOCK]\""]);
        out.expect_code(0, &c()).expect_stdout("[]\n", &c());
        // -a wins over a later ForwardAgent.
        let out = with_agent(&[
            "-a",
            "-o",
            "ForwardAgent=yes",
            "box",
            "echo \"[$SSH_AUTH_SOCK]\"",
        ]);
        out.expect_code(0, &c()).expect_stdout("[]\n", &c());
    }
}

// ---------------------------------------------------------------------------
// -f: to the background once connected
// ---------------------------------------------------------------------------

/// Runs `skiff ssh ARGS` with its output in files (a background skiff
/// keeps them open) and waits, at most 30 s, for the first process only.
fn skiff_ssh_f(home: &ClientHome, dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let err_path = dir.join("stderr");
    let mut child = skiff_ssh_process(home)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn skiff");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("skiff ssh -f did not return within 30 s");
        }
        thread::sleep(std::time::Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(err_path).unwrap_or_default(),
    )
}

/// Kills the processes whose command line contains `marker` (bounded).
fn kill_matching(marker: &str) {
    let _ = std::process::Command::new("pkill")
        .args(["-f", marker])
        .status();
}

#[test]
fn dash_f_goes_to_the_background_once_connected() {
    let Some((fx, [], d)) = skiffd_with("", []) else {
        return;
    };
    let echo = echo_server();
    let home = client_home(&d, &fx);
    let scratch = tempdir();
    let c = || ctx(&d, "skiff ssh -f");

    // -f -N -L: back at once with 0, the forwarding keeps working.
    let local = free_port();
    let spec = format!("{local}:127.0.0.1:{}", echo.port);
    let (code, stderr) = skiff_ssh_f(&home, scratch.path(), &["-f", "-N", "-L", &spec, "box"]);
    assert_eq!(code, 0, "{}\n{stderr}", c());
    check_echoes(connect_when_listening(local), &c());
    kill_matching(&spec);

    // -f with a command: it runs after skiff has returned.
    let out_dir = account_dir();
    let marker = out_dir.path().join("done");
    let command = format!("sleep 0.3; echo done > {}", marker.display());
    let (code, stderr) = skiff_ssh_f(&home, scratch.path(), &["-f", "box", &command]);
    assert_eq!(code, 0, "{}\n{stderr}", c());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}: the command never ran",
            c()
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }

    // Nothing to run: an error at once. A failed connection: its status.
    let (code, stderr) = skiff_ssh_f(&home, scratch.path(), &["-f", "box"]);
    assert_eq!(code, 255, "{stderr}");
    assert!(stderr.contains("-f needs a command"), "{stderr}");
    let closed = free_port().to_string();
    let (code, stderr) = skiff_ssh_f(&home, scratch.path(), &["-f", "-N", "-p", &closed, "box"]);
    assert_eq!(code, 255, "{stderr}");
    assert!(stderr.contains("connect"), "{stderr}");
}

// ---------------------------------------------------------------------------
// -L with Unix sockets
// ---------------------------------------------------------------------------

/// A line echo server on a Unix socket at `path` (mode 0666, so that the
/// test account's sshd session can connect).
fn unix_echo_server(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind the Unix echo server");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let out = stream.try_clone().expect("clone the stream");
            thread::spawn(move || echo_lines(stream, out));
        }
    });
}

#[test]
fn skiff_ssh_forwards_to_and_from_unix_sockets() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let echo = echo_server();
    let home = client_home(&sshd, &fx);
    let c = || ctx(&sshd, "-L with Unix sockets");

    // TCP here, a Unix socket on the server (the docker.sock case).
    let remote_dir = account_dir();
    let remote_socket = remote_dir.path().join("echo.sock");
    unix_echo_server(&remote_socket);
    let local = free_port();
    let spec = format!("{local}:{}", remote_socket.display());
    skiff_ssh(&home, &["-L", &spec, "box", &talk_to(local)])
        .run()
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());

    // A Unix socket here (0600, removed when skiff stops), TCP there.
    let local_dir = tempdir();
    let local_socket = local_dir.path().join("fwd.sock");
    let mut cmd = skiff_ssh_process(&home);
    cmd.args(["-N", "-L"])
        .arg(format!(
            "{}:127.0.0.1:{}",
            local_socket.display(),
            echo.port
        ))
        .arg("box");
    let mut skiff = Background::start(cmd);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !local_socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}\n{}",
            c(),
            skiff.stderr()
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(file_mode(&local_socket) & 0o777, 0o600, "{}", c());
    let stream = std::os::unix::net::UnixStream::connect(&local_socket).unwrap();
    check_echoes(stream, &format!("{}\n{}", c(), skiff.stderr()));
    // SIGTERM: skiff removes its socket on the way out.
    // SAFETY: kill(2) on the child this test started and has not reaped.
    unsafe { libc::kill(skiff.child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while skiff.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "skiff did not stop on SIGTERM"
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!local_socket.exists(), "{}: the socket outlived skiff", c());
}

// ---------------------------------------------------------------------------
// Unix-socket forwarding: skiffd serving stock ssh, and skiff ssh -R
// ---------------------------------------------------------------------------

/// Polls (at most 20 s) until `path` exists or stops existing.
fn wait_for_path(path: &std::path::Path, exists: bool, context: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while path.exists() != exists {
        assert!(
            std::time::Instant::now() < deadline,
            "{context}: {} {}",
            path.display(),
            if exists {
                "never appeared"
            } else {
                "is still there"
            }
        );
        thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Connects to the Unix socket at `path`, retrying (at most 20 s) until
/// something listens there.
fn connect_unix_when_listening(
    path: &std::path::Path,
    context: &str,
) -> std::os::unix::net::UnixStream {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => return s,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{context}: {e}");
                thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// A remote command that waits (at most 30 s) until `file` exists.
fn wait_for_file_command(file: &std::path::Path) -> String {
    format!(
        "for i in $(seq 300); do [ -e {} ] && exit 0; sleep 0.1; done; exit 3",
        file.display()
    )
}

#[test]
fn skiffd_forwards_unix_sockets_as_the_account() {
    let Some((fx, [no_forwarding], d)) = skiffd_with("", [("noforward", "no-port-forwarding")])
    else {
        return;
    };
    let echo = echo_server();
    let c = || ctx(&d, "Unix-socket forwarding through skiffd");
    let dir = account_dir();

    // ssh -L to a socket on the server.
    let echo_socket = dir.path().join("echo.sock");
    unix_echo_server(&echo_socket);
    let to_socket = |key: &Key, local: u16, socket: &std::path::Path| {
        ssh(d.port(), user(), key)
            .flag("-L")
            .flag(&format!("127.0.0.1:{local}:{}", socket.display()))
            .args(&[&talk_to(local)])
            .run()
    };
    to_socket(&fx.client_key, free_port(), &echo_socket)
        .expect_code(0, &c())
        .expect_stdout(TWO_ECHOES, &c());
    assert!(
        d.log().contains(&format!(
            "forwarding to socket {:?}",
            echo_socket.display().to_string()
        )),
        "{}",
        c()
    );
    // The key's no-port-forwarding covers sockets.
    let out = to_socket(&no_forwarding, free_port(), &echo_socket);
    assert_eq!(out.stdout_str(), "", "{}\n{out}", c());
    assert!(d.log().contains("refusing forwarding to socket"), "{}", c());

    // A socket only root may use stays out of the account's reach: skiffd
    // connects with the account's rights, not its own.
    if is_root() && account().uid != 0 {
        let private = tempdir();
        let socket = private.path().join("root-only.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        listener.set_nonblocking(true).unwrap();
        let out = to_socket(&fx.client_key, free_port(), &socket);
        assert_eq!(out.stdout_str(), "", "{}\n{out}", c());
        assert!(d.log().contains("failed: Permission denied"), "{}", c());
        assert!(
            listener.accept().is_err(),
            "{}: the root-only socket was reached",
            c()
        );
    }

    // ssh -R from a socket skiffd makes (0600, the account's) to the echo
    // server here; removed when the connection ends.
    let made = dir.path().join("made.sock");
    let done = dir.path().join("done");
    let forward = {
        let (port, key, made, done) = (d.port(), fx.client_key.clone(), made.clone(), done.clone());
        thread::spawn(move || {
            ssh(port, user(), &key)
                .opt("ExitOnForwardFailure=yes")
                .flag("-R")
                .flag(&format!("{}:127.0.0.1:{}", made.display(), echo.port))
                .args(&[&wait_for_file_command(&done)])
                .run()
        })
    };
    wait_for_path(&made, true, &c());
    assert_eq!(file_mode(&made) & 0o777, 0o600, "{}", c());
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&made).unwrap().uid(),
            account().uid,
            "{}",
            c()
        );
    }
    let stream = std::os::unix::net::UnixStream::connect(&made).unwrap();
    check_echoes(stream, &c());
    write_file(&done, "", 0o644);
    forward.join().unwrap().expect_code(0, &c());
    wait_for_path(&made, false, &c());

    // An existing file at the path: refused without StreamLocalBindUnlink.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = ssh(d.port(), user(), &fx.client_key)
        .opt("ExitOnForwardFailure=yes")
        .flag("-R")
        .flag(&format!("{}:127.0.0.1:{}", stale.display(), echo.port))
        .args(&["echo should not run"])
        .run();
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(d.log().contains("cannot listen on"), "{}", c());
}

#[test]
fn skiffd_socket_settings_and_refusals() {
    let config =
        "AllowStreamLocalForwarding local\nMatch User *\n  AllowStreamLocalForwarding all\n";
    let Some((fx, [], d)) = skiffd_with(config, []) else {
        return;
    };
    let echo = echo_server();
    let c = || ctx(&d, "Match sets AllowStreamLocalForwarding");
    let dir = account_dir();
    let made = dir.path().join("m.sock");
    let r = |d: &Skiffd, key: &Key, path: &std::path::Path| {
        ssh(d.port(), user(), key)
            .opt("ExitOnForwardFailure=yes")
            .flag("-R")
            .flag(&format!("{}:127.0.0.1:{}", path.display(), echo.port))
            .args(&["echo listening"])
            .run()
    };
    // The Match block wins over the global `local`.
    r(&d, &fx.client_key, &made)
        .expect_code(0, &c())
        .expect_stdout("listening\n", &c());
    drop(d);

    let config = "AllowStreamLocalForwarding local\n";
    let Some((fx, [], d)) = skiffd_with(config, []) else {
        return;
    };
    let out = r(&d, &fx.client_key, &made);
    assert_eq!(out.code, 255, "{}\n{out}", ctx(&d, "local only"));
    assert!(
        d.log()
            .contains("AllowStreamLocalForwarding does not allow remote forwarding"),
        "{}",
        ctx(&d, "local only")
    );
    drop(d);

    // StreamLocalBindUnlink replaces a stale socket; the mask sets the mode.
    let config = "StreamLocalBindUnlink yes\nStreamLocalBindMask 0111\n";
    let Some((fx, [], d)) = skiffd_with(config, []) else {
        return;
    };
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let done = dir.path().join("done");
    let forward = {
        let (port, key, stale, done) =
            (d.port(), fx.client_key.clone(), stale.clone(), done.clone());
        thread::spawn(move || {
            ssh(port, user(), &key)
                .opt("ExitOnForwardFailure=yes")
                .flag("-R")
                .flag(&format!("{}:127.0.0.1:{}", stale.display(), echo.port))
                .args(&[&wait_for_file_command(&done)])
                .run()
        })
    };
    let c = || ctx(&d, "StreamLocalBindUnlink yes");
    // The new socket answers (the stale one never could).
    let stream = connect_unix_when_listening(&stale, &c());
    assert_eq!(file_mode(&stale) & 0o777, 0o666, "{}", c());
    check_echoes(stream, &c());
    write_file(&done, "", 0o644);
    forward.join().unwrap().expect_code(0, &c());
}

#[test]
fn skiff_ssh_remote_forwarding_with_sockets_and_a_remote_socks_proxy() {
    let Some((fx, servers)) = both_servers() else {
        return;
    };
    let echo = echo_server();
    let local_dir = tempdir();
    let local_socket = local_dir.path().join("echo.sock");
    unix_echo_server(&local_socket);
    for server in &servers {
        let server = server.as_ref();
        let home = client_home(server, &fx);
        let remote_dir = account_dir();
        let remote_socket = remote_dir.path().join("r.sock");
        let mut cmd = skiff_ssh_process(&home);
        cmd.args(["-N", "-R"])
            .arg(format!(
                "{}:127.0.0.1:{}",
                remote_socket.display(),
                echo.port
            ))
            .args(["-R", &format!("0:{}", local_socket.display())])
            .args(["-R", "0", "box"]);
        let mut skiff = Background::start(cmd);
        let c = |what: &str, skiff: &Background| {
            format!("{}\nskiff stderr:\n{}", ctx(server, what), skiff.stderr())
        };
        let allocated = |skiff: &mut Background, to: &str| -> u16 {
            let marker = format!(" for remote {to}");
            skiff.wait_for(&marker.clone(), move |text| {
                text.lines().find(|l| l.contains(&marker)).and_then(|l| {
                    let rest = l.split("Allocated port ").nth(1)?;
                    rest.split_whitespace().next()?.parse().ok()
                })
            })
        };
        let to_local_socket = allocated(
            &mut skiff,
            &format!("forward to {}", local_socket.display()),
        );
        let socks = allocated(&mut skiff, "SOCKS proxy");

        // A socket on the server, connected here to TCP.
        wait_for_path(&remote_socket, true, &c("-R /path:host:port", &skiff));
        let stream = std::os::unix::net::UnixStream::connect(&remote_socket).unwrap();
        check_echoes(stream, &c("-R /path:host:port", &skiff));

        // A port on the server, connected here to a Unix socket.
        check_echoes(
            connect_when_listening(to_local_socket),
            &c("-R 0:/path", &skiff),
        );

        // A SOCKS proxy on the server whose connections skiff makes here.
        let s = socks5_by_name(socks, echo.port, &c("-R 0 (SOCKS)", &skiff));
        check_echoes(s, &c("-R 0 (SOCKS)", &skiff));
        assert!(
            skiff.child.try_wait().unwrap().is_none(),
            "{}",
            c("-N", &skiff)
        );
    }
    assert_eq!(echo.connections(), 2 * servers.len());
}

#[test]
fn skiff_ssh_local_sockets_follow_stream_local_bind_settings() {
    let Some((fx, [], d)) = skiffd_with("", []) else {
        return;
    };
    let echo = echo_server();
    let home = client_home(&d, &fx);
    let c = || ctx(&d, "StreamLocalBindMask and StreamLocalBindUnlink");
    let settings = [
        "-o",
        "StreamLocalBindMask=0117",
        "-o",
        "StreamLocalBindUnlink=yes",
    ];
    let shown = skiff_ssh(&home, &[&["-G"], &settings[..], &["box"]].concat()).run();
    shown.expect_code(0, &c());
    for line in ["streamlocalbindmask 0117", "streamlocalbindunlink yes"] {
        assert!(
            shown.stdout_str().lines().any(|l| l == line),
            "{line}\n{shown}"
        );
    }

    // A stale socket where the forwarding listens: refused by default ...
    let dir = tempdir();
    let path = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let spec = format!("{}:127.0.0.1:{}", path.display(), echo.port);
    let out = skiff_ssh(
        &home,
        &["-o", "ExitOnForwardFailure=yes", "-L", &spec, "box", "true"],
    )
    .run();
    assert_eq!(out.code, 255, "{}\n{out}", c());
    assert!(out.stderr.contains("cannot listen on"), "{}\n{out}", c());

    // ... replaced under StreamLocalBindUnlink, with the mask's mode.
    let mut cmd = skiff_ssh_process(&home);
    cmd.args(settings).args(["-N", "-L", &spec, "box"]);
    let skiff = Background::start(cmd);
    let stream = connect_unix_when_listening(&path, &format!("{}\n{}", c(), skiff.stderr()));
    assert_eq!(file_mode(&path) & 0o777, 0o660, "{}", c());
    check_echoes(stream, &c());
}

// ---------------------------------------------------------------------------
// A changed host key let through by StrictHostKeyChecking=no
// ---------------------------------------------------------------------------

/// As ssh does, a server whose host key is not the known one, let through
/// by `StrictHostKeyChecking=no`, is trusted with nothing: no agent is
/// forwarded to it (even asked for with `-A`), no port is forwarded
/// through it (a warning; with `ExitOnForwardFailure` the end), and the
/// new key is not recorded. The command itself still runs (a key login).
#[test]
fn a_changed_host_key_let_through_by_no_gets_no_agent_and_no_forwarding() {
    let Some((fx, mut sshd)) = sshd_setup(&[]) else {
        return;
    };
    let home = client_home(&sshd, &fx);
    let rotated = fx.keygen("host_rotated", KeyType::Ed25519, None);
    sshd.restart_with_host_key(&rotated);
    let known_before = std::fs::read(home.known_hosts()).expect("read known_hosts");
    let agent = Agent::start();
    agent.add(&fx.rsa_key);
    let echo = echo_server();
    let local = free_port();
    let forward = format!("127.0.0.1:{local}:127.0.0.1:{}", echo.port);
    let c = || {
        ctx(
            &sshd,
            "a changed key let through by StrictHostKeyChecking=no",
        )
    };
    let run = |more: &[&str]| {
        let mut args = vec!["-o", "StrictHostKeyChecking=no", "-A", "-L", &forward];
        args.extend_from_slice(more);
        args.extend_from_slice(&["box", "echo \"[$SSH_AUTH_SOCK]\""]);
        skiff_ssh(&home, &args)
            .env("SSH_AUTH_SOCK", &agent.sock)
            .run()
    };
    let out = run(&[]);
    out.expect_code(0, &c()).expect_stdout("[]\n", &c());
    for said in [
        "HAS CHANGED",
        "Agent forwarding is disabled to avoid man-in-the-middle attacks.",
        "port forwarding is disabled to avoid man-in-the-middle attacks",
    ] {
        assert!(out.stderr.contains(said), "{}: says {said:?}\n{out}", c());
    }
    assert_eq!(echo.connections(), 0, "{}", c());

    let out = run(&["-o", "ExitOnForwardFailure=yes"]);
    assert_eq!(out.code, 255, "{}: ExitOnForwardFailure\n{out}", c());
    assert!(out.stdout.is_empty(), "{}: nothing ran\n{out}", c());
    assert_eq!(
        std::fs::read(home.known_hosts()).expect("read known_hosts"),
        known_before,
        "{}: the new key is not recorded",
        c()
    );
}
