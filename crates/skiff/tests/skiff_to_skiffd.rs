//! skiff client -> skiffd server.
//!
//! The same client cases as `skiff_to_sshd.rs`, against our own server,
//! plus server-side behaviour seen through skiff: forced commands, `from=`
//! rejection and many concurrent execs, and a server that stops answering.

mod skiff_cases;

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use skiff_cases::trusted_home;
use skiff_testkit::*;

skiff_client_tests!(skiffd_setup);

/// `command="..."` replaces the requested command, which is available as
/// SSH_ORIGINAL_COMMAND.
#[test]
fn forced_command() {
    let Some((fx, [forced], d)) = skiffd_with_keys([("forced", FORCED_ECHO)]) else {
        return;
    };
    let home = trusted_home(&d, &fx);

    let out = skiff_exec(&home, d.port(), user(), Some(&forced))
        .opt("IdentitiesOnly=yes")
        .cmd("hello world")
        .run();
    out.expect_code(0, &server_context(&d, "forced command"))
        .expect_stdout("forced hello world\n", "forced command");

    // The forced command's exit status is what the client gets, whatever
    // was asked for.
    let out = skiff_exec(&home, d.port(), user(), Some(&forced))
        .opt("IdentitiesOnly=yes")
        .cmd("exit 9")
        .run();
    out.expect_code(
        0,
        &server_context(&d, "forced command ignores requested exit"),
    )
    .expect_stdout("forced exit 9\n", "forced command ignores requested exit");
}

/// A key restricted with `from="10.9.9.9"` cannot log in from 127.0.0.1,
/// while an unrestricted key on the same server can.
#[test]
fn from_restriction_rejected() {
    let Some((fx, [limited, loopback], d)) = skiffd_with_keys(FROM_LIMITED_AND_LOOPBACK) else {
        return;
    };
    let home = trusted_home(&d, &fx);

    let out = skiff_exec(&home, d.port(), user(), Some(&limited))
        .opt("IdentitiesOnly=yes")
        .cmd("echo should-not-run")
        .run();
    out.expect_skiff_failure(&["authentication"], &server_context(&d, "from=10.9.9.9"));

    let out = skiff_exec(&home, d.port(), user(), Some(&loopback))
        .opt("IdentitiesOnly=yes")
        .cmd("echo loopback-ok")
        .run();
    out.expect_code(0, &server_context(&d, "from=127.0.0.1"))
        .expect_stdout("loopback-ok\n", "from=127.0.0.1");
}

/// 20 skiff processes at once, each with its own connection, all get their
/// own output and exit code.
#[test]
fn concurrent_execs() {
    if !require_openssh() {
        return;
    }
    const N: usize = 20;
    let fx = Fixture::new();
    // Keep skiffd from shedding unauthenticated connections on purpose.
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("MaxStartups 100\n"),
    );
    let home = trusted_home(&d, &fx);
    let results: Vec<CmdOutput> = thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let (home, fx, port) = (&home, &fx, d.port());
                s.spawn(move || {
                    skiff_exec(home, port, user(), Some(&fx.client_key))
                        .cmd(&format!(
                            "echo start-{i}; sleep 1; head -c 100000 /dev/zero | wc -c; exit {}",
                            i % 5
                        ))
                        .run()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("skiff thread panicked"))
            .collect()
    });
    for (i, out) in results.iter().enumerate() {
        let what = format!("concurrent exec #{i}");
        out.expect_code((i % 5) as i32, &server_context(&d, &what))
            .expect_stdout(&format!("start-{i}\n100000\n"), &what);
    }
}

/// A TCP relay from 127.0.0.1:`port` to a server that can be frozen: it
/// then passes no more bytes either way but keeps both connections open,
/// like a peer that vanished without closing anything. Everything stops
/// on drop.
struct FreezableRelay {
    port: u16,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<thread::JoinHandle<()>>>>,
}

impl FreezableRelay {
    fn start(upstream: u16) -> FreezableRelay {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().expect("local addr").port();
        let relay = FreezableRelay {
            port,
            frozen: Arc::new(AtomicBool::new(false)),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Arc::new(Mutex::new(Vec::new())),
        };
        let (frozen, stop, threads) = (
            relay.frozen.clone(),
            relay.stop.clone(),
            relay.threads.clone(),
        );
        let acceptor = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let server = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream))
                    .expect("relay: connect upstream");
                let pumps = [
                    pump(&client, &server, &frozen, &stop),
                    pump(&server, &client, &frozen, &stop),
                ];
                threads.lock().unwrap().extend(pumps);
            }
        });
        relay.threads.lock().unwrap().push(acceptor);
        relay
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until EOF or `stop`; while `frozen`, holds
/// everything.
fn pump(
    from: &TcpStream,
    to: &TcpStream,
    frozen: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let mut from = from.try_clone().expect("clone relay socket");
    let mut to = to.try_clone().expect("clone relay socket");
    let (frozen, stop) = (frozen.clone(), stop.clone());
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("read timeout");
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let deadline = Instant::now() + Duration::from_secs(120);
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            if frozen.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    })
}

impl Drop for FreezableRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The server stops answering mid-command without closing the connection:
/// skiff's keepalives (`ServerAliveInterval 1`, `ServerAliveCountMax 2`)
/// notice within seconds and skiff exits 255 with one line saying so.
#[test]
fn dead_server_detected_by_keepalives() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let relay = FreezableRelay::start(d.port());
    let home = ClientHome::new();
    home.trust(relay.port, &fx.host_key);
    thread::scope(|s| {
        let run = s.spawn(|| {
            skiff_exec(&home, relay.port, user(), Some(&fx.client_key))
                .opt("ServerAliveInterval=1")
                .opt("ServerAliveCountMax=2")
                .cmd("echo started; sleep 60")
                .timeout(Duration::from_secs(45))
                .run()
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !d.log().contains("session started") {
            assert!(
                Instant::now() < deadline,
                "{}",
                server_context(&d, "no session")
            );
            thread::sleep(Duration::from_millis(50));
        }
        // Let "started" through, then go silent.
        thread::sleep(Duration::from_millis(500));
        relay.freeze();
        let frozen_at = Instant::now();
        let out = run.join().expect("skiff thread panicked");
        let took = frozen_at.elapsed();
        let c = server_context(&d, &format!("server frozen; skiff gave up after {took:?}"));
        assert!(took < Duration::from_secs(15), "{c}\n{out}");
        out.expect_code(255, &c).expect_stdout("started\n", &c);
        let lines = out.stderr_lines();
        assert!(
            lines.len() == 1 && lines[0].starts_with("skiff: "),
            "{c}: expected one `skiff: ` line\n{out}"
        );
    });
}

/// Host-key algorithms are ordered by the plain known_hosts entries when
/// there are some, else by the first hashed entry for the host, so that a
/// first connection need not hash the host name with every hashed entry's
/// salt. When the key the server then presents is not known but a hashed
/// entry knows another of its key types, skiff exchanges keys again with
/// every recorded type first, as ordering by all entries would have done
/// from the start.
#[test]
fn hashed_entries_key_types_are_tried_when_the_plain_ones_miss() {
    let Some((fx, _)) = skiffd_setup() else {
        return;
    };
    let dir = fx.dir.path();
    let host_rsa = keygen(dir, "host_rsa", KeyType::Rsa, None);
    let elsewhere = keygen(dir, "elsewhere_ecdsa", KeyType::Ecdsa, None);
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).host_key(&host_rsa),
    );
    let port = d.port();
    // A fresh client whose known_hosts holds `plain` and then the lines for
    // `hashed`'s keys, hashed by ssh-keygen.
    let home_with = |plain: &[&Key], hashed: &[&Key]| {
        let home = ClientHome::new();
        let kh = home.known_hosts();
        let lines = |keys: &[&Key]| -> String {
            keys.iter()
                .map(|k| format!("{}\n", known_hosts_line(port, k)))
                .collect()
        };
        write_file(&kh, lines(hashed), 0o600);
        Run::new("ssh-keygen")
            .arg("-H")
            .arg("-f")
            .arg(&kh)
            .run()
            .expect_code(0, "ssh-keygen -H");
        let hashed = fs::read_to_string(&kh).expect("read hashed known_hosts");
        assert!(hashed.starts_with("|1|"), "not hashed: {hashed:?}");
        write_file(&kh, format!("{}{hashed}", lines(plain)), 0o600);
        home
    };
    // Runs a command, which must succeed; says whether a second key exchange
    // happened.
    let exchanged_twice = |home: &ClientHome, what: &str| -> bool {
        let out = skiff_exec(home, port, user(), Some(&fx.client_key))
            .opt("StrictHostKeyChecking=yes")
            .flag("-v")
            .cmd("echo verified")
            .run();
        out.expect_code(0, &server_context(&d, what))
            .expect_stdout("verified\n", what);
        out.stderr.contains("exchanging keys again")
    };

    // Hashed: the server's RSA key. Plain, first: an ECDSA key the server
    // does not have. Its ed25519 key is in neither.
    let home = home_with(&[&elsewhere], &[&host_rsa]);
    let kh = home.known_hosts();
    let before = fs::read(&kh).expect("read known_hosts");
    assert!(
        exchanged_twice(&home, "key types from hashed entries"),
        "the second key exchange is not in the log"
    );
    assert_eq!(fs::read(&kh).expect("read known_hosts"), before);

    // The server's ed25519 key in a plain line: one exchange, no second.
    let home = home_with(&[&fx.host_key], &[&host_rsa]);
    assert!(!exchanged_twice(&home, "plain ed25519 line"));

    // Only hashed lines: the first one for the host orders the exchange.
    // There, an ECDSA key the server does not have, before its RSA key:
    // the first exchange misses and the second, by every type, succeeds.
    let home = home_with(&[], &[&elsewhere, &host_rsa]);
    assert!(
        exchanged_twice(&home, "hashed ECDSA then RSA"),
        "the second key exchange is not in the log"
    );

    // The server's RSA key on the first hashed line: one exchange, by it.
    let home = home_with(&[], &[&host_rsa]);
    assert!(!exchanged_twice(&home, "hashed RSA line"));
}

/// `AddKeysToAgent yes` hands a key read from a file to ssh-agent once it
/// has signed in; without it the agent is left alone.
#[test]
fn add_keys_to_agent_hands_the_file_key_to_ssh_agent() {
    let Some((fx, d)) = skiffd_setup() else {
        return;
    };
    let agent = Agent::start();
    let home = ClientHome::new();
    name_server_box(&home, &d, &fx);
    let c = server_context(&d, "AddKeysToAgent");
    let material = fx.client_key.pub_line();
    let material = material.split_whitespace().nth(1).unwrap().to_string();
    let skiff = |args: &[&str]| {
        Run::new(skiff_bin())
            .env("HOME", home.path())
            .env("SKIFF_AGENT", "off")
            .env("SSH_AUTH_SOCK", &agent.sock)
            .arg("ssh")
            .args(args)
            .run()
    };
    skiff(&["box", "true"]).expect_code(0, &c);
    assert!(!agent.list().contains(&material), "{c}: added unasked");
    skiff(&["-o", "AddKeysToAgent=1h", "box", "true"]).expect_code(0, &c);
    assert!(agent.list().contains(&material), "{c}: {}", agent.list());
}
