//! Small copies on the data plane's SSH channel alone.
//!
//! - Uploads (data plane version 2): a copy small enough goes whole behind
//!   its request, with no data stream, whatever mode was asked (it stays
//!   inside the session's encryption).
//! - Downloads (version 3): a skiff that knows the skiffd speaks version 3
//!   offers, with its `Get`, to take a small download on the channel; the
//!   transfer process reads the request before it answers, and sends such
//!   a download whole behind a `Welcome` that grants no stream.
//! - A larger copy, or one that names a stream count, takes streams as
//!   before, either way.
//! - A skiffd that refuses the newer version (played by the
//!   `version_one_transfer` test peer, which refuses any `Hello` but
//!   version 1, as a skiffd from before version 2 did, and hands a
//!   version-1 one to the real transfer process) gets the copy again with
//!   streams, on the copy's own connection and through the agent.
//!
//! skiffd's audit log tells them apart from the server's side: a copy on
//! the channel alone is recorded with `mode: "channel"` and no streams
//! granted.
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

/// The most a copy may hold to go on the channel alone on loopback
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
    assert_transfer(r, "upload", files, bytes, c)
}

/// A completed download record of `files` files and `bytes` bytes.
fn assert_download(r: &Value, files: u64, bytes: u64, c: &str) {
    assert_transfer(r, "download", files, bytes, c)
}

/// A completed `direction` record of `files` files and `bytes` bytes.
fn assert_transfer(r: &Value, direction: &str, files: u64, bytes: u64, c: &str) {
    assert_eq!(r["direction"], direction, "{c}: {r}");
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

/// `copy` holds what `original` holds, file by file, with its modes and
/// modification times.
fn assert_same_tree(original: &Path, copy: &Path, c: &str) {
    for rel in ["empty", "run.sh", "sub/blob", "sub"] {
        let (o, k) = (original.join(rel), copy.join(rel));
        let (om, km) = (fs::metadata(&o).unwrap(), fs::metadata(&k).unwrap());
        if om.is_file() {
            assert_eq!(sha256(&o), sha256(&k), "{c}: {rel}");
        }
        assert_eq!(om.mode() & 0o7777, km.mode() & 0o7777, "{c}: mode of {rel}");
        assert_eq!(om.mtime(), km.mtime(), "{c}: mtime of {rel}");
    }
}

/// Hands `path` and everything under it to the test account, so that its
/// transfer process may read it (times are kept: chown changes none).
fn give_to_account(path: &Path) {
    if !is_root() {
        return;
    }
    let acct = account();
    std::os::unix::fs::lchown(path, Some(acct.uid), Some(acct.gid)).unwrap();
    if fs::symlink_metadata(path).unwrap().is_dir() {
        for e in fs::read_dir(path).unwrap() {
            give_to_account(&e.unwrap().path());
        }
    }
}

/// The two ways a copy runs: on its own connection, and through the agent
/// of `ah`, with a label for messages.
fn both_ways(ah: &AgentHome) -> [(&'static str, Option<&AgentHome>); 2] {
    [("own connection", None), ("through the agent", Some(ah))]
}

/// `skiff cp` on its own connection, or through the agent of `ah`.
fn cp_via(ah: Option<&AgentHome>, d: &Skiffd, fx: &Fixture, args: &[&str]) -> CmdOutput {
    match ah {
        None => cp(d.port(), &fx.client_key, args),
        Some(ah) => skiff_cp_via_agent(ah, d.port(), &fx.client_key, args),
    }
}

/// The `Subsystem` line that makes the `version_one_transfer` peer skiffd's
/// transfer process, logging each `Hello`'s version to `seen`.
fn version_one_transfer(seen: &Path) -> String {
    format!(
        "Subsystem transfer@skiff '{}' '{}' '{}'\n",
        account_test_peer(env!("CARGO_MANIFEST_DIR"), "skiff", "version_one_transfer").display(),
        account_skiffd().display(),
        seen.display()
    )
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
/// the command line, and a copy takes streams as before, either way.
#[test]
fn a_larger_copy_or_a_named_stream_count_takes_streams() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit, None, "");
    let sources = account_dir();
    let big = sources.path().join("big");
    let big_sum = random_file(&big, INLINE_BYTES + 1);
    let small = sources.path().join("small");
    let small_sum = random_file(&small, 1000);
    give_to_account(sources.path());
    let cases: [(&[&str], &Path, &str); 2] = [
        (&[], &big, &big_sum),
        (&["--streams", "2"], &small, &small_sum),
    ];
    let mut copies = 0;
    for (options, src, sum) in cases {
        for direction in ["upload", "download"] {
            let c = format!("{direction} {options:?} {}", src.display());
            let into = account_dir();
            let (from, to) = match direction {
                "upload" => (src.display().to_string(), remote(into.path())),
                _ => (remote(src), into.path().display().to_string()),
            };
            let mut args = options.to_vec();
            args.extend([from.as_str(), to.as_str()]);
            cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, &c));
            let name = src.file_name().unwrap();
            assert_eq!(&sha256(&into.path().join(name)), sum, "{c}");
            copies += 1;
            let r = &transfers(&audit, copies, &d)[copies - 1];
            assert_eq!(r["mode"], "aead", "{c}: {r}");
            assert!(r["streams"].as_u64().is_some_and(|n| n >= 1), "{c}: {r}");
            let size = fs::metadata(src).unwrap().len();
            assert_transfer(r, direction, 1, size, &c);
        }
    }
}

/// A skiffd whose transfer process speaks only version 1 of the data
/// plane refuses a small upload's version-2 `Hello`, and a download's
/// version-3 one (its identification line says 0.2.0, so the download
/// offers the channel); each copy goes again with streams, and lands, on
/// the copy's own connection and through the agent's.
#[test]
fn a_skiffd_that_refuses_the_newer_version_gets_the_copy_with_streams() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let seen_dir = account_dir();
    let seen = seen_dir.path().join("hellos");
    let d = skiffd_with_audit(&fx, &audit, Some(version_one_transfer(&seen)), "");
    let sources = account_dir();
    let src = sources.path().join("f");
    let sum = random_file(&src, 5000);
    give_to_account(&src);
    let ah = AgentHome::new();
    let mut copies = 0;
    for (direction, refused) in [("upload", 2), ("download", 3)] {
        for (c, via_agent) in both_ways(&ah) {
            let c = format!("{direction}, {c}");
            let into = account_dir();
            let args = match direction {
                "upload" => [src.display().to_string(), remote(into.path())],
                _ => [remote(&src), into.path().display().to_string()],
            };
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cp_via(via_agent, &d, &fx, &args).expect_code(0, &ctx(&d, &c));
            assert_eq!(sha256(&into.path().join("f")), sum, "{c}");
            let hellos = fs::read_to_string(&seen).unwrap_or_default();
            assert!(
                hellos.ends_with(&format!("{refused}\n1\n")),
                "{c}: the Hellos the server saw: {hellos:?}"
            );
            copies += 1;
            assert_eq!(hellos.lines().count(), 2 * copies, "{c}: {hellos:?}");
            // Only the copy with streams was granted anything.
            let r = &transfers(&audit, copies, &d)[copies - 1];
            assert_eq!(r["mode"], "aead", "{c}: {r}");
            assert_transfer(r, direction, 1, 5000, &c);
        }
    }
    assert_eq!(ah.agent_pids().len(), 1, "an agent carried the copies");
}

/// A small tree comes back on the channel alone, with `-p`, even with
/// `--cipher none` under a policy that refuses unencrypted streams (the
/// bytes never leave the SSH session), on the copy's own connection and
/// through the agent (whose `OpenedServer` says the skiffd speaks version
/// 3). A missing source among them fails alone, with the server's reason.
#[test]
fn a_small_download_comes_on_the_channel_alone_whatever_mode_was_asked() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let work = tempdir();
    let audit = work.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit, None, "DataPlaneUnencrypted no\n");
    let rdir = account_dir();
    let (tree, bytes) = small_tree(rdir.path());
    give_to_account(&tree);
    let ah = AgentHome::new();
    for (i, (c, via_agent)) in both_ways(&ah).into_iter().enumerate() {
        let into = tempdir();
        let out = cp_via(
            via_agent,
            &d,
            &fx,
            &[
                "--cipher",
                "none",
                "-r",
                "-p",
                &remote(&tree),
                &into.path().display().to_string(),
            ],
        );
        out.expect_code(0, &ctx(&d, c));
        assert_same_tree(&tree, &into.path().join("conf"), c);
        let r = &transfers(&audit, i + 1, &d)[i];
        assert_eq!(r["mode"], "channel", "{c}: {r}");
        assert_eq!(r["streams"], 0, "{c}: {r}");
        assert_download(r, 3, bytes, c);
    }
    assert_eq!(ah.agent_pids().len(), 1, "an agent carried the second copy");

    // One source missing: the other comes, the missing one is named.
    let into = tempdir();
    let missing = rdir.path().join("missing");
    let out = cp(
        d.port(),
        &fx.client_key,
        &[
            &remote(&tree.join("run.sh")),
            &remote(&missing),
            &into.path().display().to_string(),
        ],
    );
    assert_ne!(out.code, 0, "{}", ctx(&d, "a source missing"));
    assert!(out.stderr.contains("missing"), "{}", out.stderr);
    assert_eq!(
        sha256(&into.path().join("run.sh")),
        sha256(&tree.join("run.sh"))
    );
    let r = &transfers(&audit, 3, &d)[2];
    assert_eq!(r["mode"], "channel", "{r}");
    assert_eq!((&r["files"], &r["failed"]), (&1.into(), &1.into()), "{r}");
}
