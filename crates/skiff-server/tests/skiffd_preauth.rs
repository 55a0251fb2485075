//! Every connection skiffd has not authenticated counts, data-plane
//! streams included until their token checks out, and descriptors are kept
//! for the work skiffd has already taken on. Seen from outside with raw TCP
//! connections from the test (the data-plane magic and nothing else, or a
//! bad token), real logins (`skiff exec`, `ssh` through a ControlMaster),
//! a real `skiff cp`, and skiffd started with a low open-file limit.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// The data-plane magic a stream starts with (docs/data-plane.md).
const MAGIC: &[u8; 8] = b"SKIFFDP\x01";

/// skiffd's wait for a data-plane token once the magic is in (see
/// `TOKEN_WAIT` in crates/skiff-server/src/stream_relay.rs).
const TOKEN_WAIT: Duration = Duration::from_secs(3);

/// How long one flood connection may wait for skiffd's first byte before
/// the flood stops waiting on each (skiffd stalled).
const PACE_WAIT: Duration = Duration::from_secs(5);

/// The open-file limit skiffd runs with in the flood tests: low enough that
/// 500 held connections would exhaust it.
const SKIFFD_OPEN_FILES: u64 = 128;

/// Raises this test process's own soft open-file limit so that it can hold
/// its ends of the floods (only this process is affected).
fn allow_open_files(at_least: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur >= at_least {
            return;
        }
        assert!(
            lim.rlim_max >= at_least,
            "this test needs {at_least} open files; the hard limit is {}",
            lim.rlim_max
        );
        lim.rlim_cur = lim.rlim_max.min(at_least * 4);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// Connections opened by a flood, held (all closed when dropped).
struct Flood {
    /// Got skiffd's identification line (or its first byte).
    admitted: Vec<TcpStream>,
    /// Closed (or reset) by skiffd before it wrote anything.
    dropped: Vec<TcpStream>,
    /// Neither, within [`PACE_WAIT`]; later ones were not waited on.
    unanswered: Vec<TcpStream>,
    took: Duration,
}

/// Opens `n` connections to 127.0.0.1:`port`, each sending `hello` and
/// waiting for skiffd's first byte or close before the next opens (so each
/// is seen by skiffd as a peer would be, one after the other, quickly).
fn flood(port: u16, n: usize, hello: &[u8]) -> Flood {
    let start = Instant::now();
    let mut f = Flood {
        admitted: Vec::new(),
        dropped: Vec::new(),
        unanswered: Vec::new(),
        took: Duration::ZERO,
    };
    for _ in 0..n {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect for the flood");
        // The server may already have closed it; what it did is read below.
        let _ = s.write_all(hello);
        if !f.unanswered.is_empty() {
            f.unanswered.push(s);
            continue;
        }
        s.set_read_timeout(Some(PACE_WAIT)).expect("read timeout");
        let mut b = [0u8; 1];
        // A signal cuts a read with a timeout short (it is never
        // restarted): read again.
        let read = loop {
            match s.read(&mut b) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match read {
            Ok(1) => f.admitted.push(s),
            Ok(_) => f.dropped.push(s),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                f.unanswered.push(s)
            }
            Err(_) => f.dropped.push(s),
        }
    }
    f.took = start.elapsed();
    f
}

impl Flood {
    fn summary(&self) -> String {
        format!(
            "flood: {} admitted, {} dropped, {} unanswered, in {:.2}s",
            self.admitted.len(),
            self.dropped.len(),
            self.unanswered.len(),
            self.took.as_secs_f64()
        )
    }

    /// Closes every connection of the flood (from our side).
    fn close(self) {
        for s in self
            .admitted
            .iter()
            .chain(&self.dropped)
            .chain(&self.unanswered)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// How many connections skiffd logged dropping for `MaxStartups`.
fn max_startups_drops(d: &Skiffd) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains("dropping connection") && l.contains("(MaxStartups)"))
        .count()
}

fn flood_skiffd(fx: &Fixture, config: &str) -> Skiffd {
    Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config(config)
            .open_files(SKIFFD_OPEN_FILES, SKIFFD_OPEN_FILES),
    )
}

/// 500 connections that send the data-plane magic and nothing else, held,
/// against `MaxStartups 10`: skiffd lets no more than ten wait at once
/// (each until the short token wait is over), drops the rest before a
/// word, and a real login still gets in. Before, each was released as soon
/// as its magic was seen and held two descriptors for 10 s: the flood was
/// let in until skiffd ran out of descriptors.
#[test]
fn magic_only_flood_is_held_to_max_startups() {
    if !require_openssh() {
        return;
    }
    allow_open_files(2048);
    let fx = Fixture::new();
    let d = flood_skiffd(&fx, "MaxStartups 10\n");
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);

    let f = flood(d.port(), 500, MAGIC);
    eprintln!("{}", f.summary());
    let c = ctx(&d, &f.summary());
    // A waiting place frees up at the latest TOKEN_WAIT after it was taken.
    let rounds = 1 + (f.took.as_secs_f64() / TOKEN_WAIT.as_secs_f64()) as usize;
    assert!(
        f.admitted.len() <= 10 * rounds && !f.dropped.is_empty(),
        "at most 10 magic-only connections may wait at once\n{c}"
    );

    // A login gets in once a place is free: tried again while skiffd turns
    // it away before authentication, as a fan-out would.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tries = 0;
    loop {
        tries += 1;
        let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
            .opt("ConnectTimeout=10")
            .cmd("echo in")
            .timeout(Duration::from_secs(40))
            .run();
        if out.code == 0 {
            out.expect_stdout("in\n", &c);
            break;
        }
        assert!(
            out.stderr.contains("before authentication") && Instant::now() < deadline,
            "login during the flood (try {tries}): {out}\n{}",
            ctx(&d, &f.summary())
        );
        thread::sleep(Duration::from_millis(200));
    }
    eprintln!("logged in at try {tries}");
    assert!(
        max_startups_drops(&d) >= f.dropped.len(),
        "{}",
        ctx(&d, "the drops are logged")
    );
    f.close();
}

/// The same flood from 127.0.0.1 with `PerSourceMaxStartups 10`: a login
/// from another source (127.0.0.2) gets in at the first try. Before, the
/// flood took every descriptor and that login was closed at once.
#[test]
fn magic_only_flood_from_one_source_leaves_others_served() {
    if !require_openssh() {
        return;
    }
    allow_open_files(2048);
    let fx = Fixture::new();
    let d = flood_skiffd(&fx, "PerSourceMaxStartups 10\n");
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);

    let f = flood(d.port(), 500, MAGIC);
    eprintln!("{}", f.summary());
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
        .opt("BindAddress=127.0.0.2")
        .opt("ConnectTimeout=10")
        .cmd("echo in")
        .timeout(Duration::from_secs(40))
        .run();
    let c = ctx(&d, &f.summary());
    out.expect_code(0, &c).expect_stdout("in\n", &c);
    let rounds = 1 + (f.took.as_secs_f64() / TOKEN_WAIT.as_secs_f64()) as usize;
    assert!(f.admitted.len() <= 10 * rounds, "{c}");
    assert!(
        d.log().contains("(PerSourceMaxStartups)"),
        "{}",
        ctx(&d, "per-source drops are logged")
    );
    f.close();
}

/// Reads skiffd's identification line (`SSH-...\n`) from `s`.
fn read_identification(s: &mut TcpStream, c: &str) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") {
        match s.read(&mut b) {
            Ok(1) => line.push(b[0]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            other => panic!(
                "{c}: no identification line ({other:?} after {:?})",
                String::from_utf8_lossy(&line)
            ),
        }
        assert!(line.len() <= 255, "{c}: identification line too long");
    }
    assert!(line.starts_with(b"SSH-2.0-"), "{c}: {line:?}");
}

/// Waits (at most `limit`) for skiffd to close `s`; returns how long it
/// took. Anything sent (there should be nothing) is an error. A read cut
/// short by a signal (another test's handler, in this process, may take
/// one) is made again for the time left.
fn closed_within(s: &mut TcpStream, limit: Duration, c: &str) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        let left = limit
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => break,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) if e.kind() == ErrorKind::Interrupted && start.elapsed() < limit => continue,
            other => panic!(
                "{c}: not closed within {limit:?}: {other:?} after {:?}",
                start.elapsed()
            ),
        }
    }
    start.elapsed()
}

/// With `MaxStartups 1`, a connection that sent the magic and half a
/// token holds the only place (another connection is turned away before a
/// word) until the short token wait is over, then is closed; a garbage
/// token is closed at once, after the identification line. Before, the
/// magic gave the place back at once and the token was waited for 10 s.
#[test]
fn data_plane_token_wait_is_short_and_counted() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config("MaxStartups 1\n"),
    );
    let port = d.port();
    let connect = || TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");

    let mut slow = connect();
    slow.write_all(MAGIC).unwrap();
    slow.write_all(b"half a token").unwrap();
    read_identification(&mut slow, &ctx(&d, "magic and half a token"));
    let waiting_since = Instant::now();

    // The only place is taken: turned away before skiffd says anything.
    let mut other = connect();
    let took = closed_within(
        &mut other,
        Duration::from_secs(20),
        &ctx(
            &d,
            "a second connection while the first waits for its token",
        ),
    );
    assert!(
        took < Duration::from_secs(5),
        "{}",
        ctx(&d, "dropped at once")
    );

    // Closed once the token wait is over, not sooner and not much later.
    let limit = TOKEN_WAIT + Duration::from_secs(4);
    closed_within(&mut slow, limit, &ctx(&d, "half a token"));
    let waited = waiting_since.elapsed();
    assert!(
        waited >= TOKEN_WAIT - Duration::from_millis(500) && waited < limit,
        "{}",
        ctx(&d, &format!("closed after {waited:?}"))
    );
    assert!(
        d.log().contains("no token within 3s"),
        "{}",
        ctx(&d, "the close is logged")
    );

    // The place is free again (the connection's process tells the
    // listener as it closes it, so a moment later at most): a whole
    // garbage token is read and refused at once, after the identification
    // line (so a client can tell it from a drop), and gives the place back.
    let c = ctx(&d, "magic and a garbage token");
    let mut garbage = admitted(&connect, &c, |s| {
        let _ = s.write_all(MAGIC);
        let _ = s.write_all(&[0x5a; 32]);
    });
    let took = closed_within(&mut garbage, Duration::from_secs(20), &c);
    assert!(took < TOKEN_WAIT, "{c}: refused after {took:?}");
    assert!(
        d.log()
            .contains("data-plane connection refused: unknown or already used token"),
        "{c}"
    );
    admitted(&connect, &ctx(&d, "after the refused token"), |_| {});
}

/// A connection skiffd answers with its identification line, once a place
/// among the unauthenticated is free (retried for 10 s while skiffd closes
/// the connections it makes unanswered); `first` is what the client sends
/// at once.
fn admitted(connect: &dyn Fn() -> TcpStream, c: &str, first: impl Fn(&mut TcpStream)) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect();
        first(&mut s);
        let mut head = [0u8; 8];
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        match s.read_exact(&mut head) {
            Ok(()) => {
                assert_eq!(&head, b"SSH-2.0-", "{c}");
                let mut rest = Vec::new();
                let mut b = [0u8; 1];
                while !rest.ends_with(b"\n") {
                    assert_eq!(
                        s.read(&mut b).unwrap_or(0),
                        1,
                        "{c}: identification line cut"
                    );
                    rest.push(b[0]);
                    assert!(rest.len() <= 255, "{c}: identification line too long");
                }
                return s;
            }
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.kind(),
                        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
                    ) =>
            {
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{c}: no identification line: {e}"),
        }
    }
}

/// `skiff cp` over the data plane with `MaxStartups 4`, while another
/// connection waits with the magic and no token: its SSH connection and
/// both streams fit in the places left, and nothing is dropped.
#[test]
fn data_plane_copy_fits_a_low_max_startups() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str("MaxStartups 4\n");
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let mut waiting = TcpStream::connect((Ipv4Addr::LOCALHOST, d.port())).unwrap();
    waiting.write_all(MAGIC).unwrap();
    read_identification(&mut waiting, &ctx(&d, "a connection that waits"));

    let local = tempdir();
    let src = local.path().join("payload");
    let sum = random_file(&src, 3 << 20);
    let rdir = account_dir();
    let remote = format!("{}@127.0.0.1:{}", user(), rdir.path().display());
    let cp = |args: &[&str]| {
        let args: Vec<&str> = ["--streams", "2"].iter().chain(args).copied().collect();
        skiff_cp(d.port(), &fx.client_key, &args)
    };
    cp(&[src.to_str().unwrap(), &remote]).expect_code(0, &ctx(&d, "upload"));
    assert_eq!(sha256(&rdir.path().join("payload")), sum, "uploaded copy");
    let back = tempdir();
    cp(&[&format!("{remote}/payload"), back.path().to_str().unwrap()])
        .expect_code(0, &ctx(&d, "download"));
    assert_eq!(sha256(&back.path().join("payload")), sum, "downloaded copy");
    let log = d.log();
    assert!(
        log.matches("data plane: 2 streams, mode aead").count() == 2
            && !log.contains("dropping connection"),
        "{}",
        ctx(&d, "both copies on the data plane, nothing dropped")
    );
}

/// `ssh -M -S SOCK -N -f`: one authenticated connection that later
/// `ssh -S SOCK` invocations open sessions on. Stopped on drop.
struct Master {
    sock: std::path::PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Master {
    fn start(port: u16, key: &Key) -> Master {
        let dir = tempdir();
        let sock = dir.path().join("ctl");
        ssh(port, user(), key)
            .flag("-M")
            .flag("-S")
            .flag(sock.to_str().unwrap())
            .opt("ControlPersist=yes")
            .flag("-N")
            .flag("-f")
            .timeout(Duration::from_secs(30))
            .run()
            .expect_code(0, "start the ControlMaster");
        Master {
            sock,
            port,
            _dir: dir,
        }
    }

    /// A session on the master's connection. With a key skiffd does not
    /// know, so that ssh's fallback to a connection of its own fails
    /// rather than hiding a refused session.
    fn session(&self, stranger: &Key, command: &str) -> CmdOutput {
        ssh(self.port, user(), stranger)
            .flag("-S")
            .flag(self.sock.to_str().unwrap())
            .args(&[command])
            .timeout(Duration::from_secs(30))
            .run()
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = Run::new("ssh")
            .args([
                "-F",
                "/dev/null",
                "-S",
                self.sock.to_str().unwrap(),
                "-O",
                "exit",
            ])
            .args(["-p", &self.port.to_string()])
            .arg(format!("{}@127.0.0.1", user()))
            .timeout(Duration::from_secs(20))
            .run();
    }
}

/// skiffd with 128 descriptors and no MaxStartups to speak of: a flood of
/// SSH connections that never authenticate is turned away at accept once
/// few descriptors are left (logged, not once per connection), and a
/// session on a connection already made still starts. Before, the flood
/// took every descriptor and the session could not get its pipes.
#[test]
fn descriptors_are_kept_for_connections_already_served() {
    if !require_openssh() {
        return;
    }
    allow_open_files(2048);
    let fx = Fixture::new();
    let d = flood_skiffd(&fx, "MaxStartups 1000\nLoginGraceTime 120\n");
    let master = Master::start(d.port(), &fx.client_key);
    master
        .session(&fx.stranger_key, "echo before")
        .expect_code(0, &ctx(&d, "a session before the flood"));

    let f = flood(d.port(), 300, b"");
    eprintln!("{}", f.summary());
    let c = ctx(&d, &f.summary());
    let out = master.session(&fx.stranger_key, "echo during");
    out.expect_code(0, &c).expect_stdout("during\n", &c);
    assert!(!f.dropped.is_empty() && f.unanswered.is_empty(), "{c}");
    let log = d.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("dropping new connections") && l.contains("file descriptors open"))
        .count();
    assert!(
        lines >= 1 && lines < f.dropped.len(),
        "one line now and then, not one per connection ({lines})\n{c}"
    );
    f.close();
}

/// skiffd started with a soft open-file limit below its hard one raises
/// it (and says so), while the commands it runs get the limit it was
/// started with, as under sshd.
#[test]
fn the_open_file_limit_is_raised_for_skiffd_only() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).open_files(256, 4096),
    );
    let c = ctx(&d, "skiffd started with 256 of 4096");
    assert!(
        d.log()
            .contains("open-file limit raised from 256 to 4096 (hard limit 4096)"),
        "{c}"
    );
    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    skiff_cmd(
        &home,
        d.port(),
        user(),
        &fx.client_key,
        "ulimit -n; ulimit -Hn",
    )
    .expect_code(0, &c)
    .expect_stdout("256\n4096\n", &c);
}
