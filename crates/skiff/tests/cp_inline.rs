//! Small uploads on the data plane's SSH channel alone (data plane version
//! 2): a copy small enough goes whole behind its request, with no data
//! stream, whatever mode was asked (it stays inside the session's
//! encryption); a larger one, or one that names a stream count, takes
//! streams as before; and a skiffd from before version 2 (played by the
//! `version_one_transfer` test peer, which refuses a version-2 `Hello` as
//! such a skiffd did and hands a version-1 one to the real transfer
//! process) gets the copy again with streams, on the copy's own connection
//! and through the agent.
//!
//! skiffd's audit log tells the two apart from the server's side: an
//! upload on the channel alone is recorded with `mode: "channel"` and no
//! streams granted.
//!
//! Run as root (as CI does), the remote side is the `skiff-test` account.

use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use skiff_testkit::server_context as ctx;
use skiff_testkit::skiff_cp as cp;
use skiff_testkit::*;

/// The most an upload may hold to go on the channel alone on loopback
/// (`skiff_engine::copy::dataplane::INLINE_NEAR`).
const INLINE_BYTES: usize = 512 << 10;

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// skiffd with an audit log at `audit` and `extra` config; the data plane's
/// transfer process is `transfer` (a `Subsystem transfer@skiff` line), or
/// skiffd's own.
fn skiffd_with_audit(fx: &Fixture, audit: &Path, transfer: Option<String>, extra: &str) -> Skiffd {
    let mut config = transfer.unwrap_or_else(|| transfer_subsystem_config().unwrap_or_default());
    config.push_str(&format!("AuditLog {}\n{extra}", audit.display()));
    Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config))
}

/// The audit log's `transfer` records once there are `want` of them.
fn transfers(path: &Path, want: usize, d: &Skiffd) -> Vec<Value> {
    audit_events(path, "transfer", want, d)
}

/// A completed upload record of `files` files and `bytes` bytes.
fn assert_upload(r: &Value, files: u64, bytes: u64, c: &str) {
    assert_eq!(r["direction"], "upload", "{c}: {r}");
    assert_eq!(r["files"], files, "{c}: {r}");
    assert_eq!(r["bytes"], bytes, "{c}: {r}");
    assert_eq!(r["failed"], 0, "{c}: {r}");
    assert_eq!(r["completed"], true, "{c}: {r}");
}

fn set_times(p: &Path, secs: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    File::options()
        .write(true)
        .open(p)
        .or_else(|_| File::open(p))
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

/// A small tree: a directory with an empty file, a file of a few bytes with
/// mode 0750 and a subdirectory holding a file of 100 000 bytes (more than
/// one `Data` message). Within what the channel takes alone on any path
/// (`INLINE_FAR_BYTES`), so the test does not hang on the round trip a
/// debug build on a loaded machine measures. Returns its root and the
/// file bytes it holds.
fn small_tree(dir: &Path) -> (PathBuf, u64) {
    let root = dir.join("conf");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o750)).unwrap();
    random_file(&root.join("sub/blob"), 100_000);
    for (p, secs) in [
        ("empty", 1_500_000_000),
        ("run.sh", 1_500_000_100),
        ("sub/blob", 1_500_000_200),
    ] {
        set_times(&root.join(p), secs);
    }
    set_times(&root.join("sub"), 1_500_000_300);
    (root, 18 + 100_000)
}

/// `remote` holds what `local` holds, file by file, with its modes and
/// modification times.
fn assert_same_tree(local: &Path, remote: &Path, c: &str) {
    for rel in ["empty", "run.sh", "sub/blob", "sub"] {
        let (l, r) = (local.join(rel), remote.join(rel));
        let (lm, rm) = (fs::metadata(&l).unwrap(), fs::metadata(&r).unwrap());
        if lm.is_file() {
            assert_eq!(sha256(&l), sha256(&r), "{c}: {rel}");
        }
        assert_eq!(lm.mode() & 0o7777, rm.mode() & 0o7777, "{c}: mode of {rel}");
        assert_eq!(lm.mtime(), rm.mtime(), "{c}: mtime of {rel}");
    }
}

/// A tree of small files goes on the channel alone, even with `--cipher
/// none` under a policy that refuses unencrypted streams: the files never
/// leave the SSH session's encryption. Modes and times come with `-p`.
#[test]
fn a_small_upload_goes_on_the_channel_alone_whatever_mode_was_asked() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit, None, "DataPlaneUnencrypted no\n");
    let (tree, bytes) = small_tree(work.path());
    let rdir = account_dir();
    let out = cp(
        d.port(),
        &fx.client_key,
        &[
            "--cipher",
            "none",
            "-r",
            "-p",
            &tree.display().to_string(),
            &remote(rdir.path()),
        ],
    );
    out.expect_code(0, &ctx(&d, "small tree, mode none"));
    assert_same_tree(&tree, &rdir.path().join("conf"), "small tree");
    let r = &transfers(&audit, 1, &d)[0];
    assert_eq!(r["mode"], "channel", "{r}");
    assert_eq!(r["streams"], 0, "{r}");
    assert_upload(r, 3, bytes, "small tree");
}

/// One byte more than the channel takes alone, or a stream count named on
/// the command line, and the copy takes streams as before.
#[test]
fn a_larger_upload_or_a_named_stream_count_takes_streams() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit, None, "");
    let big = work.path().join("big");
    let big_sum = random_file(&big, INLINE_BYTES + 1);
    let small = work.path().join("small");
    let small_sum = random_file(&small, 1000);
    let rdir = account_dir();
    let cases: [(&[&str], &Path, &str); 2] = [
        (&[], &big, &big_sum),
        (&["--streams", "2"], &small, &small_sum),
    ];
    for (i, (options, src, sum)) in cases.into_iter().enumerate() {
        let c = format!("{options:?} {}", src.display());
        let mut args = options.to_vec();
        let (from, to) = (src.display().to_string(), remote(rdir.path()));
        args.extend([from.as_str(), to.as_str()]);
        cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, &c));
        let name = src.file_name().unwrap();
        assert_eq!(&sha256(&rdir.path().join(name)), sum, "{c}");
        let r = &transfers(&audit, i + 1, &d)[i];
        assert_eq!(r["mode"], "aead", "{c}: {r}");
        assert!(r["streams"].as_u64().is_some_and(|n| n >= 1), "{c}: {r}");
        let size = fs::metadata(src).unwrap().len();
        assert_upload(r, 1, size, &c);
    }
}

/// A skiffd that speaks only version 1 of the data plane refuses the small
/// upload's `Hello`; the copy goes again with streams, and lands, on the
/// copy's own connection and through the agent's.
#[test]
fn a_skiffd_older_than_version_two_gets_the_copy_with_streams() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let seen_dir = account_dir();
    let seen = seen_dir.path().join("hellos");
    let old_transfer = format!(
        "Subsystem transfer@skiff '{}' '{}' '{}'\n",
        account_test_peer(env!("CARGO_MANIFEST_DIR"), "skiff", "version_one_transfer").display(),
        account_skiffd().display(),
        seen.display()
    );
    let d = skiffd_with_audit(&fx, &audit, Some(old_transfer), "");
    let src = work.path().join("f");
    let sum = random_file(&src, 5000);
    let ah = AgentHome::new();
    for (i, via_agent) in [false, true].into_iter().enumerate() {
        let c = if via_agent {
            "through the agent"
        } else {
            "own connection"
        };
        let rdir = account_dir();
        let args = [src.display().to_string(), remote(rdir.path())];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = match via_agent {
            false => cp(d.port(), &fx.client_key, &args),
            true => skiff_cp_via_agent(&ah, d.port(), &fx.client_key, &args),
        };
        out.expect_code(0, &ctx(&d, c));
        assert_eq!(sha256(&rdir.path().join("f")), sum, "{c}");
        let hellos = fs::read_to_string(&seen).unwrap_or_default();
        assert_eq!(
            hellos,
            "2\n1\n".repeat(i + 1),
            "{c}: the Hellos the server saw"
        );
        // Only the copy with streams was granted anything.
        let r = &transfers(&audit, i + 1, &d)[i];
        assert_eq!(r["mode"], "aead", "{c}: {r}");
        assert_upload(r, 1, 5000, c);
    }
    assert_eq!(ah.agent_pids().len(), 1, "an agent carried the second copy");
}
