//! `skiff cp` to and from skiffd over the skiff data plane: round trips in
//! every mode and both directions, trees with `-p`, tampering with a stream
//! (through a proxy in the test), skiffd killed mid-transfer, and the
//! unencrypted modes refused where policy forbids them.
//!
//! Run as root (as CI does), the remote side is the `skiff-test` account
//! and its files land in a directory it owns.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use skiff_testkit::server_context as ctx;
use skiff_testkit::skiff_cp as cp;
use skiff_testkit::*;

const MIB: usize = 1 << 20;

/// The data-plane magic a stream starts with (docs/data-plane.md).
const MAGIC: &[u8; 8] = b"SKIFFDP\x01";

/// skiffd with the transfer subsystem runnable by the test account.
fn skiffd(fx: &Fixture, extra_config: &str) -> Skiffd {
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str(extra_config);
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if !config.is_empty() {
        opts = opts.config(&config);
    }
    Skiffd::start_with(opts)
}

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// Temporaries (`.NAME.skiff-XXXX`) anywhere under `dir`.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().contains(".skiff-") {
                found.push(p.clone());
            }
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    found
}

fn used_data_plane(d: &Skiffd, mode: &str, c: &str) {
    let log = d.log();
    assert!(
        log.contains(&format!("mode {mode}")),
        "{}",
        ctx(d, &format!("{c}: no {mode} data plane in the server log"))
    );
}

/// Random files of the sizes the issue names: 0, 1, 1 MiB - 1, 1 MiB + 1, 100 MiB.
fn sample_files(dir: &Path) -> Vec<(PathBuf, String)> {
    [0, 1, MIB - 1, MIB + 1, 100 * MIB]
        .iter()
        .map(|&size| {
            let p = dir.join(format!("f{size}"));
            let sum = random_file(&p, size);
            (p, sum)
        })
        .collect()
}

#[test]
fn round_trips_in_every_mode_and_both_directions() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "");
    let local = tempdir();
    let files = sample_files(local.path());
    for mode in ["aead", "integrity", "none"] {
        let c = format!("mode {mode}");
        let rdir = account_dir();
        let mut args = vec!["--cipher", mode];
        let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
        args.extend(names.iter().map(String::as_str));
        let target = remote(rdir.path());
        args.push(&target);
        cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, &format!("{c}: upload")));
        used_data_plane(&d, mode, &c);
        for (p, sum) in &files {
            let up = rdir.path().join(p.file_name().unwrap());
            assert_eq!(&sha256(&up), sum, "{c}: uploaded {} differs", up.display());
            if is_root() {
                assert_eq!(
                    fs::metadata(&up).unwrap().uid(),
                    account().uid,
                    "{c}: owner"
                );
            }
        }
        let back = tempdir();
        let mut args = vec!["--cipher".to_string(), mode.to_string()];
        for (p, _) in &files {
            args.push(remote(&rdir.path().join(p.file_name().unwrap())));
        }
        args.push(back.path().display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, &format!("{c}: download")));
        for (p, sum) in &files {
            let down = back.path().join(p.file_name().unwrap());
            assert_eq!(
                &sha256(&down),
                sum,
                "{c}: downloaded {} differs",
                down.display()
            );
        }
        assert!(
            temporaries(rdir.path()).is_empty() && temporaries(back.path()).is_empty(),
            "{c}: temporaries left"
        );
    }
}

#[test]
fn trees_keep_modes_and_times_with_p() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "");
    let local = tempdir();
    let top = local.path().join("tree");
    fs::create_dir_all(top.join("sub/deeper")).unwrap();
    let files = [
        ("tree/a.txt", 0o640, 1_000_000_000),
        ("tree/sub/b.bin", 0o600, 1_100_000_000),
        ("tree/sub/deeper/c", 0o755, 1_200_000_000),
        ("tree/sub/empty", 0o444, 1_300_000_000),
    ];
    for (rel, mode, mtime) in files {
        let p = local.path().join(rel);
        random_file(&p, if rel.ends_with("empty") { 0 } else { 70_000 });
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        set_mtime(&p, mtime);
    }
    fs::set_permissions(top.join("sub"), fs::Permissions::from_mode(0o711)).unwrap();
    set_mtime(&top.join("sub"), 900_000_000);
    // A tree this small goes on the SSH channel alone, both ways; with a
    // stream count named, on streams.
    for streams in [None, Some("2")] {
        let c = format!("streams {streams:?}");
        let mut options = vec!["-r", "-p"];
        options.extend(streams.iter().flat_map(|n| ["--streams", *n]));
        let rdir = account_dir();
        let up_args = [top.display().to_string(), remote(rdir.path())];
        let up = cp(
            d.port(),
            &fx.client_key,
            &[&options[..], &up_args.each_ref().map(String::as_str)].concat(),
        );
        up.expect_code(0, &ctx(&d, &format!("{c}: upload tree")));
        let back = tempdir();
        let down_args = [
            remote(&rdir.path().join("tree")),
            back.path().display().to_string(),
        ];
        let down = cp(
            d.port(),
            &fx.client_key,
            &[&options[..], &down_args.each_ref().map(String::as_str)].concat(),
        );
        down.expect_code(0, &ctx(&d, &format!("{c}: download tree")));
        for root in [rdir.path(), back.path()] {
            for (rel, mode, mtime) in files {
                let (src, dst) = (local.path().join(rel), root.join(rel));
                assert_eq!(sha256(&dst), sha256(&src), "{c}: {}", dst.display());
                let m = fs::metadata(&dst).unwrap();
                assert_eq!(m.mode() & 0o7777, mode, "{c}: mode of {}", dst.display());
                assert_eq!(m.mtime(), mtime, "{c}: mtime of {}", dst.display());
            }
            let sub = fs::metadata(root.join("tree/sub")).unwrap();
            assert_eq!(
                sub.mode() & 0o7777,
                0o711,
                "{c}: directory mode under {}",
                root.display()
            );
            assert_eq!(
                sub.mtime(),
                900_000_000,
                "{c}: directory mtime under {}",
                root.display()
            );
        }
    }
}

fn set_mtime(p: &Path, secs: i64) {
    let f = fs::File::options()
        .read(true)
        .open(p)
        .or_else(|_| fs::File::open(p))
        .unwrap();
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs as u64);
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

#[test]
fn per_file_errors_do_not_stop_the_rest() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "");
    let local = tempdir();
    let good = local.path().join("good");
    let sum = random_file(&good, 3 * MIB + 5);
    let missing = local.path().join("missing");
    let rdir = account_dir();
    let out = cp(
        d.port(),
        &fx.client_key,
        &[
            &missing.display().to_string(),
            &good.display().to_string(),
            &remote(rdir.path()),
        ],
    );
    out.expect_code(1, &ctx(&d, "one missing source"));
    assert!(out.stderr.contains("missing"), "{out}");
    assert_eq!(sha256(&rdir.path().join("good")), sum);
    // A target the server refuses (two sources into a file). The request
    // went out with the data-plane opening and the streams were dialed
    // alongside; the copy fails with the server's reason and does not sit
    // out the streams' 15 s acknowledgement timeout.
    let good_arg = good.display().to_string();
    let started = Instant::now();
    let out = cp(
        d.port(),
        &fx.client_key,
        &[&good_arg, &good_arg, &remote(&rdir.path().join("good"))],
    );
    out.expect_code(1, &ctx(&d, "two sources into a file"));
    assert!(out.stderr.contains("Not a directory"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the refused copy took {:?}: {out}",
        started.elapsed()
    );
    assert_eq!(sha256(&rdir.path().join("good")), sum);
    // A remote file the account cannot replace: that file fails, exit 1.
    if is_root() {
        let locked = rdir.path().join("locked");
        fs::create_dir(&locked).unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).unwrap();
        let out = cp(
            d.port(),
            &fx.client_key,
            &[&good.display().to_string(), &remote(&locked.join("x"))],
        );
        out.expect_code(1, &ctx(&d, "read-only directory"));
        assert!(out.stderr.contains("Permission denied"), "{out}");
        assert!(!locked.join("x").exists());
    }
}

/// A TCP proxy to `upstream` that flips one byte, `at` bytes into the
/// first data-plane stream, in the chosen direction. Stops when dropped.
struct TamperProxy {
    port: u16,
    stop: Arc<AtomicBool>,
    flipped: Arc<AtomicUsize>,
}

impl TamperProxy {
    fn start(upstream: u16, at: usize, client_to_server: bool) -> TamperProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flipped = Arc::new(AtomicUsize::new(0));
        let (stop2, flipped2) = (stop.clone(), flipped.clone());
        thread::spawn(move || {
            let deadline = Instant::now() + BULK_TIMEOUT;
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (f1, f2) = (flipped2.clone(), flipped2.clone());
                let up_at = client_to_server.then_some(at);
                let down_at = (!client_to_server).then_some(at);
                // The direction's flip applies only to data-plane streams;
                // the upload side tells which connection is one.
                let is_plane = Arc::new(AtomicBool::new(false));
                let p2 = is_plane.clone();
                thread::spawn(move || pump(client, server, up_at, f1, Some(p2), None));
                thread::spawn(move || pump(s2, c2, down_at, f2, None, Some(is_plane)));
            }
        });
        TamperProxy {
            port,
            stop,
            flipped,
        }
    }
}

impl Drop for TamperProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`; on a data-plane stream flips the byte at `flip_at`
/// (once per proxy). `mark` records that this connection is a data-plane
/// stream (seen from its first bytes); `check` waits for that verdict.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    flip_at: Option<usize>,
    flipped: Arc<AtomicUsize>,
    mark: Option<Arc<AtomicBool>>,
    check: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if offset == 0 {
            if let Some(m) = &mark {
                m.store(buf[..n].starts_with(MAGIC), Ordering::SeqCst);
            }
        }
        let plane = match (&mark, &check) {
            (Some(m), _) | (_, Some(m)) => m.load(Ordering::SeqCst),
            _ => false,
        };
        if let Some(at) = flip_at {
            if plane
                && (offset..offset + n).contains(&at)
                && flipped
                    .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                buf[at - offset] ^= 0x01;
            }
        }
        offset += n;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// `skiff cp --streams 2 --cipher MODE src` to the remote `dst`.
fn upload_on_two_streams(port: u16, key: &Key, mode: &str, src: &Path, dst: &Path) -> CmdOutput {
    cp(
        port,
        key,
        &[
            "--streams",
            "2",
            "--cipher",
            mode,
            &src.display().to_string(),
            &remote(dst),
        ],
    )
}

/// The proxy flipped its byte, and the copy failed saying `why`.
fn expect_failure_after_flip(d: &Skiffd, proxy: &TamperProxy, out: &CmdOutput, c: &str, why: &str) {
    assert_eq!(
        proxy.flipped.load(Ordering::SeqCst),
        1,
        "{c}: the proxy never flipped a byte"
    );
    assert_ne!(
        out.code,
        0,
        "{}",
        ctx(d, &format!("{c}: the copy succeeded\n{out}"))
    );
    assert!(
        out.stderr.contains(why),
        "{}",
        ctx(d, &format!("{c}: the error does not say {why:?}\n{out}"))
    );
}

#[test]
fn a_flipped_byte_fails_the_transfer_and_leaves_the_destination_alone() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "");
    let local = tempdir();
    let src = local.path().join("big");
    random_file(&src, 20 * MIB);
    for (client_to_server, mode) in [(true, "aead"), (false, "aead"), (true, "integrity")] {
        let c = format!(
            "tamper {} in {mode}",
            if client_to_server {
                "upload"
            } else {
                "download"
            }
        );
        let proxy = TamperProxy::start(d.port(), 2 * MIB + MIB / 2, client_to_server);
        let rdir = account_dir();
        let out = if client_to_server {
            // An older version of the file sits under the final name.
            let dst = rdir.path().join("big");
            write_file(&dst, "old contents\n", 0o644);
            let out = upload_on_two_streams(proxy.port, &fx.client_key, mode, &src, &dst);
            assert_eq!(
                fs::read_to_string(&dst).unwrap_or_default(),
                "old contents\n",
                "{}",
                ctx(&d, &format!("{c}: destination changed\n{out}"))
            );
            out
        } else {
            fs::copy(&src, rdir.path().join("big")).unwrap();
            let back = tempdir();
            let dst = back.path().join("big");
            write_file(&dst, "old contents\n", 0o644);
            let out = cp(
                proxy.port,
                &fx.client_key,
                &[
                    "--streams",
                    "2",
                    "--cipher",
                    mode,
                    &remote(&rdir.path().join("big")),
                    &dst.display().to_string(),
                ],
            );
            assert_eq!(
                fs::read_to_string(&dst).unwrap(),
                "old contents\n",
                "{c}: destination changed"
            );
            assert!(
                temporaries(back.path()).is_empty(),
                "{c}: temporaries left locally"
            );
            out
        };
        expect_failure_after_flip(&d, &proxy, &out, &c, "integrity check failed");
        wait_until(
            || temporaries(rdir.path()).is_empty(),
            &format!("{c}: remote temporaries removed"),
        );
    }
}

fn wait_until(mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A stream whose token arrives altered (one byte flipped on the way) is
/// refused by skiffd. The copy fails at once with that refusal, both in
/// aead mode, where records follow the token without waiting for the
/// acknowledgement, and in integrity mode, which waits for it; the file
/// under the final name is never a partial one. (It keeps its old contents
/// unless the other stream happened to carry every chunk before the
/// refusal stopped the copy: in aead mode records follow the token without
/// waiting, so a sender that is slow to start may find the queue empty,
/// and the server then has the whole file, checked, and commits it.)
#[test]
fn a_refused_stream_fails_the_copy_at_once() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "");
    let local = tempdir();
    let src = local.path().join("f");
    random_file(&src, 8 * MIB);
    for mode in ["aead", "integrity"] {
        let c = format!("{mode}, token altered");
        let proxy = TamperProxy::start(d.port(), MAGIC.len() + 5, true);
        let rdir = account_dir();
        let dst = rdir.path().join("f");
        write_file(&dst, "old contents\n", 0o644);
        let started = Instant::now();
        let out = upload_on_two_streams(proxy.port, &fx.client_key, mode, &src, &dst);
        let took = started.elapsed();
        expect_failure_after_flip(&d, &proxy, &out, &c, "refused the stream");
        assert!(
            took < Duration::from_secs(10),
            "{}",
            ctx(&d, &format!("{c}: the failure took {took:?}\n{out}"))
        );
        let now = fs::read(&dst).unwrap_or_default();
        assert!(
            now == b"old contents\n" || now == fs::read(&src).unwrap(),
            "{c}: the destination is neither its old contents nor the whole source ({} bytes)",
            now.len()
        );
    }
}

#[test]
fn skiffd_killed_mid_transfer_leaves_no_truncated_file() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let local = tempdir();
    let src = local.path().join("huge");
    random_file(&src, 400 * MIB);
    for upload in [true, false] {
        let c = if upload { "upload" } else { "download" };
        let mut d = skiffd(&fx, "");
        let rdir = account_dir();
        let (from, to, watch) = if upload {
            (
                src.display().to_string(),
                remote(&rdir.path().join("huge")),
                rdir.path().to_path_buf(),
            )
        } else {
            fs::copy(&src, rdir.path().join("huge")).unwrap();
            let back = tempdir().keep();
            (
                remote(&rdir.path().join("huge")),
                back.join("huge").display().to_string(),
                back,
            )
        };
        let port = d.port();
        let key = fx.client_key.clone();
        let copier = thread::spawn(move || cp(port, &key, &["--streams", "1", &from, &to]));
        // Kill skiffd once bytes are flowing (a temporary exists).
        wait_until(
            || !temporaries(&watch).is_empty() || copier.is_finished(),
            &format!("{c}: transfer started"),
        );
        d.kill();
        let out = copier.join().unwrap();
        if out.code == 0 {
            // Too fast to interrupt on this machine: then the file must be whole.
            eprintln!("{c}: the copy finished before skiffd was killed");
            assert_eq!(sha256(&watch.join("huge")), sha256(&src), "{c}");
            continue;
        }
        assert!(!out.stderr.is_empty(), "{c}: no message\n{out}");
        assert!(
            !watch.join("huge").exists(),
            "{c}: a truncated file under the final name\n{out}"
        );
        wait_until(
            || temporaries(&watch).is_empty(),
            &format!("{c}: temporaries removed"),
        );
        if !upload {
            let _ = fs::remove_dir_all(&watch);
        }
    }
}

/// Without `DataPlaneUnencrypted`, skiffd allows `none` and `integrity`
/// only between loopback addresses; with `no`, never. (The copies here
/// name a stream count: a small upload that may go on the SSH channel
/// alone, inside the session's encryption, is not refused; see
/// `a_small_upload_goes_on_the_channel_alone_whatever_mode_was_asked`.)
#[test]
fn unencrypted_modes_follow_the_servers_policy() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx, "DataPlaneUnencrypted no\n");
    let local = tempdir();
    let src = local.path().join("f");
    random_file(&src, 1000);
    let rdir = account_dir();
    for mode in ["none", "integrity"] {
        let out = cp(
            d.port(),
            &fx.client_key,
            &[
                "--cipher",
                mode,
                "--streams",
                "1",
                &src.display().to_string(),
                &remote(rdir.path()),
            ],
        );
        assert_eq!(
            out.code,
            255,
            "{}",
            ctx(
                &d,
                &format!("{mode} allowed under DataPlaneUnencrypted no\n{out}")
            )
        );
        assert!(
            out.stderr.contains(&format!("mode {mode} refused")),
            "{out}"
        );
        assert!(!rdir.path().join("f").exists());
    }
    let out = cp(
        d.port(),
        &fx.client_key,
        &[&src.display().to_string(), &remote(rdir.path())],
    );
    out.expect_code(0, &ctx(&d, "aead under DataPlaneUnencrypted no"));
}

/// `DataPlaneUnencrypted` in a `Match` block is the login's policy: the
/// account it matches is refused `none` on loopback (which the server-wide
/// default allows), and an account-wide `DataPlane no` turns the data plane
/// off for it alone (the copy goes over SFTP). Before, the relay applied
/// the server-wide values and `none` went through.
#[test]
fn match_blocks_set_the_data_plane_policy_of_their_logins() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let local = tempdir();
    let src = local.path().join("f");
    random_file(&src, 1000);
    let user = user();
    let d = skiffd(
        &fx,
        &format!("Match User {user}\n  DataPlaneUnencrypted no\n"),
    );
    let rdir = account_dir();
    let args = [
        "--cipher",
        "none",
        "--streams",
        "1",
        &src.display().to_string(),
        &remote(rdir.path()),
    ];
    let out = cp(d.port(), &fx.client_key, &args);
    assert_eq!(
        out.code,
        255,
        "{}",
        ctx(
            &d,
            &format!("none allowed under a Match block's DataPlaneUnencrypted no\n{out}")
        )
    );
    assert!(out.stderr.contains("mode none refused"), "{out}");
    assert!(!rdir.path().join("f").exists());

    let d = skiffd(&fx, &format!("Match User {user}\n  DataPlane no\n"));
    let rdir = account_dir();
    let out = cp(
        d.port(),
        &fx.client_key,
        &[&src.display().to_string(), &remote(rdir.path())],
    );
    out.expect_code(0, &ctx(&d, "a Match block's DataPlane no"));
    assert!(rdir.path().join("f").exists());
    let log = d.log();
    assert!(
        log.contains("subsystem sftp") && !log.contains("mode aead"),
        "{}",
        ctx(&d, "the copy should have gone over SFTP")
    );
}

/// The default policy, seen from a peer that is not on loopback: in a
/// network namespace made by the test, skiffd listens on 10.77.0.1 (an
/// address outside 127/8, on the namespace's own interface) and skiff
/// connects to it from that address.
#[test]
fn none_is_refused_for_a_non_loopback_peer_by_default() {
    if !require_openssh() {
        return;
    }
    if !is_root() || !require_tool("unshare", "util-linux") || !require_tool("ip", "iproute2") {
        if in_ci() {
            panic!("this test needs root, unshare and ip under CI");
        }
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let src = work.path().join("f");
    random_file(&src, 5000);
    fs::set_permissions(work.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let kh = work.path().join("kh");
    let cp_cmd = |mode: &str, name: &str| {
        format!(
            "SKIFF_AGENT=off HOME={home} '{skiff}' cp -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile={kh} -i '{key}' -P 2222 --cipher {mode} --streams 1 '{src}' root@10.77.0.1:{dir}/{name}; echo rc=$?",
            home = work.path().display(),
            skiff = skiff_bin(),
            kh = kh.display(),
            key = fx.client_key.private.display(),
            src = src.display(),
            dir = work.path().display(),
        )
    };
    let script = format!(
        "set -u
ip link set lo up && ip addr add 10.77.0.1/24 dev lo || exit 3
'{skiffd}' --listen 10.77.0.1:2222 --host-key '{hk}' --authorized-keys '{ak}' -v 2>'{log}' &
pid=$!
i=0; while [ $i -lt 100 ] && ! grep -q listening '{log}'; do sleep 0.05; i=$((i+1)); done
{none}
{aead}
kill $pid",
        skiffd = skiffd_bin(),
        hk = fx.host_key.private.display(),
        ak = fx.authorized_keys.display(),
        log = work.path().join("log").display(),
        none = cp_cmd("none", "none.out"),
        aead = cp_cmd("aead", "aead.out"),
    );
    let out = Run::new("unshare")
        .args(["-n", "--", "sh", "-c", &script])
        .timeout(BULK_TIMEOUT)
        .run();
    let log = fs::read_to_string(work.path().join("log")).unwrap_or_default();
    let c = format!("{out}\n--- skiffd log ---\n{log}");
    let text = out.stdout_str();
    let codes: Vec<&str> = text.lines().filter(|l| l.starts_with("rc=")).collect();
    assert_eq!(codes, ["rc=255", "rc=0"], "{c}");
    assert!(out.stderr.contains("mode none refused"), "{c}");
    assert!(out.stderr.contains("10.77.0.1"), "{c}");
    assert!(!work.path().join("none.out").exists(), "{c}");
    assert_eq!(sha256(&work.path().join("aead.out")), sha256(&src), "{c}");
}

/// With an agent running, copies use its warm connection: one
/// authentication for several copies, over the data plane to skiffd and
/// over SFTP where the data plane is off.
#[test]
fn copies_go_through_the_agents_warm_connection() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let local = tempdir();
    let src = local.path().join("payload");
    let sum = random_file(&src, 5 * MIB + 3);
    for (config, plane) in [("", true), ("DataPlane no\n", false)] {
        let c = if plane {
            "data plane via agent"
        } else {
            "sftp via agent"
        };
        let d = skiffd(&fx, config);
        let ah = AgentHome::new();
        let rdir = account_dir();
        let up = skiff_cp_via_agent(
            &ah,
            d.port(),
            &fx.client_key,
            &[&src.display().to_string(), &remote(rdir.path())],
        );
        up.expect_code(0, &ctx(&d, &format!("{c}: upload")));
        assert_eq!(sha256(&rdir.path().join("payload")), sum, "{c}");
        let back = tempdir();
        let down = skiff_cp_via_agent(
            &ah,
            d.port(),
            &fx.client_key,
            &[
                &remote(&rdir.path().join("payload")),
                &back.path().display().to_string(),
            ],
        );
        down.expect_code(0, &ctx(&d, &format!("{c}: download")));
        assert_eq!(sha256(&back.path().join("payload")), sum, "{c}");
        assert_eq!(ah.agent_pids().len(), 1, "{c}: an agent carried the copies");
        let log = d.log();
        assert_eq!(
            log.matches("Accepted publickey for").count(),
            1,
            "{}",
            ctx(&d, &format!("{c}: one authentication for both copies"))
        );
        let subsystem = if plane { "mode aead" } else { "subsystem sftp" };
        assert_eq!(log.matches(subsystem).count(), 2, "{}", ctx(&d, c));
    }
}
