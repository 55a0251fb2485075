//! The process-wide known_hosts cache behind `KnownHosts::load`: it answers
//! like a fresh read of the file, sees our own appends without reading the
//! file again, and notices every other change.
//!
//! Each test uses its own files, so the shared cache and its parse counters
//! do not interfere between tests running at once.

use std::path::{Path, PathBuf};

use russh::keys::ssh_key::public::Ed25519PublicKey;
use russh::keys::PublicKey;
use skiff_engine::hostkeys::{known_hosts_parses, HostKeyTrust, KnownHosts, RACY_WINDOW};
use skiff_engine::settings::{resolve_for, ClientEnv};
use skiff_engine::{ConnectSettings, Destination};
use skiff_proto::known_hosts::{self, format_entry, HostKeyStatus};

fn key(n: u8) -> PublicKey {
    PublicKey::from(Ed25519PublicKey([n; 32]))
}

fn blob(n: u8) -> Vec<u8> {
    key(n).to_bytes().unwrap()
}

fn settings(home: &Path, files: &[&Path], host: &str, port: u16, opts: &[&str]) -> ConnectSettings {
    let list = |paths: &[&Path]| {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut options = vec![
        format!("UserKnownHostsFile={}", list(files)),
        "GlobalKnownHostsFile=none".to_string(),
    ];
    options.extend(opts.iter().map(|o| o.to_string()));
    let dest = Destination {
        host: host.to_string(),
        port: Some(port),
        config_file: Some("none".into()),
        options,
        ..Destination::default()
    };
    let env = ClientEnv {
        vars: vec![("HOME".into(), home.display().to_string())],
    };
    resolve_for(&dest, &env).unwrap()
}

/// Lines for `{prefix}{i}.example` (i < `count`) with key `i % 100`,
/// every `hash_every`-th hashed.
fn seed_lines(prefix: &str, count: u32, hash_every: u32) -> String {
    let mut text = String::new();
    for i in 0..count {
        let salt = [(i % 256) as u8; 20];
        text.push_str(&format_entry(
            &format!("{prefix}{i}.example"),
            22,
            "ssh-ed25519",
            &blob((i % 100) as u8),
            (i % hash_every == 0).then_some(&salt),
        ));
    }
    text
}

/// Waits until a file written now is no longer "just changed" for the cache.
fn settle() {
    std::thread::sleep(RACY_WINDOW * 2);
}

/// What `KnownHosts` answers for `host`/`port` offering key `n`:
/// known key types, and Ok or the refusal.
fn ask(s: &ConnectSettings, n: u8) -> (Vec<String>, Result<(), String>) {
    let kh = KnownHosts::load(s);
    let types = kh.known_key_types(&s.hostname, s.port);
    let verdict = kh
        .verify(s, &key(n))
        .map_err(|e| e.message)
        .and_then(|trust| match trust {
            HostKeyTrust::Verified => Ok(()),
            HostKeyTrust::Mismatched => Err("let through with a changed key".to_string()),
        });
    (types, verdict)
}

fn strict(home: &Path, path: &Path, host: &str, port: u16) -> ConnectSettings {
    settings(home, &[path], host, port, &["StrictHostKeyChecking=yes"])
}

#[test]
fn cache_answers_like_a_fresh_parse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("known_hosts");
    let b64 = |n: u8| {
        let line = format_entry("x", 22, "ssh-ed25519", &blob(n), None);
        line.split_whitespace().nth(2).unwrap().to_string()
    };
    let mut text = String::new();
    text.push_str(&format!("plain.example,10.0.0.1 ssh-ed25519 {}\n", b64(1)));
    text.push_str(&format_entry(
        "hashed.example",
        22,
        "ssh-ed25519",
        &blob(2),
        Some(&[9; 20]),
    ));
    text.push_str(&format_entry(
        "hashed.example",
        2222,
        "ssh-ed25519",
        &blob(3),
        Some(&[8; 20]),
    ));
    text.push_str(&format!(
        "*.wild.example,!no.wild.example ssh-ed25519 {}\n",
        b64(4)
    ));
    text.push_str(&format!("@revoked * ssh-ed25519 {}\n", b64(5)));
    text.push_str(&format!(
        "@cert-authority *.example ssh-ed25519 {}\n",
        b64(6)
    ));
    text.push_str("this line is not valid\n");
    text.push_str(&format!("[plain.example]:2200 ssh-ed25519 {}\n", b64(7)));
    text.push_str(&format_entry(
        "twice.example",
        22,
        "ssh-ed25519",
        &blob(8),
        Some(&[7; 20]),
    ));
    text.push_str(&format_entry(
        "twice.example",
        22,
        "ssh-ed25519",
        &blob(9),
        None,
    ));
    std::fs::write(&path, &text).unwrap();
    settle();
    let label = path.display().to_string();
    let (fresh, _) = known_hosts::parse(&label, &text);
    let fresh = [fresh];
    let hosts = [
        ("plain.example", 22),
        ("PLAIN.example", 22),
        ("10.0.0.1", 22),
        ("plain.example", 2200),
        ("hashed.example", 22),
        ("hashed.example", 2222),
        ("hashed.example", 2200),
        ("a.wild.example", 22),
        ("no.wild.example", 22),
        ("twice.example", 22),
        ("unknown.example", 22),
    ];
    for round in 0..2 {
        for (host, port) in hosts {
            let s = strict(dir.path(), &path, host, port);
            for n in 1..=9 {
                let (types, verdict) = ask(&s, n);
                let mut expected_types: Vec<String> = Vec::new();
                for f in known_hosts::lookup(&fresh, host, port) {
                    if f.entry.marker.is_none() && !expected_types.contains(&f.entry.key_type) {
                        expected_types.push(f.entry.key_type.clone());
                    }
                }
                assert_eq!(types, expected_types, "{host}:{port} round {round}");
                let status = known_hosts::check(&fresh, host, port, "ssh-ed25519", &blob(n));
                let what = format!("{host}:{port} key {n} round {round}: {verdict:?}");
                match &status {
                    HostKeyStatus::Known(_) => assert!(verdict.is_ok(), "{what}"),
                    HostKeyStatus::Revoked(found) => {
                        let msg = verdict.as_ref().expect_err(&what);
                        assert!(msg.contains(&found.to_string()), "{what}");
                    }
                    HostKeyStatus::Changed { old } => {
                        let msg = verdict.as_ref().expect_err(&what);
                        for found in old {
                            assert!(msg.contains(&found.to_string()), "{what}");
                        }
                    }
                    _ => assert!(verdict.is_err(), "{what}"),
                }
            }
        }
    }
    assert_eq!(known_hosts_parses(&path), 1);
}

#[test]
fn own_appends_are_seen_without_reading_the_file_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("known_hosts");
    let text = seed_lines("old", 200, 2);
    // No newline at the end: the append must add one.
    std::fs::write(&path, text.trim_end()).unwrap();
    settle();
    let home = dir.path();
    for (i, (host, port, hashed)) in [
        ("new-hashed.example", 22, true),
        ("new-plain.example", 22, false),
        ("new-port.example", 2222, true),
    ]
    .into_iter()
    .enumerate()
    {
        let n = 210 + i as u8;
        // Looked up (and remembered as unknown) before it is recorded.
        assert!(ask(&strict(home, &path, host, port), n).1.is_err());
        let hash = if hashed { "yes" } else { "no" };
        let accept = settings(
            home,
            &[&path],
            host,
            port,
            &[
                "StrictHostKeyChecking=accept-new",
                &format!("HashKnownHosts={hash}"),
            ],
        );
        let kh = KnownHosts::load(&accept);
        kh.verify(&accept, &key(n)).unwrap();
        let notices = kh.take_notices();
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].contains("Permanently added"), "{notices:?}");

        let s = strict(home, &path, host, port);
        let (types, verdict) = ask(&s, n);
        assert_eq!(types, ["ssh-ed25519"], "{host}");
        assert_eq!(verdict, Ok(()), "{host}");
        // Another key for it is a change, reported at the new line's number.
        let line = 201 + i;
        let msg = ask(&s, n + 10).1.unwrap_err();
        assert!(msg.contains(&format!("{}:{line}", path.display())), "{msg}");
    }
    assert_eq!(known_hosts_parses(&path), 1);
    // The file says the same.
    let on_disk = std::fs::read_to_string(&path).unwrap();
    let (fresh, warnings) = known_hosts::parse("kh", &on_disk);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(fresh.entries.len(), 203);
    assert!(on_disk.contains("\nnew-plain.example ssh-ed25519 "));
    assert!(!on_disk.contains("new-hashed"));
}

#[test]
fn a_missing_file_is_created_and_extended_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/known_hosts");
    let home = dir.path();
    assert_eq!(ask(&strict(home, &path, "a.example", 22), 1).0.len(), 0);
    for (i, host) in ["a.example", "b.example", "c.example"].iter().enumerate() {
        let s = settings(
            home,
            &[&path],
            host,
            22,
            &["StrictHostKeyChecking=accept-new", "HashKnownHosts=yes"],
        );
        let kh = KnownHosts::load(&s);
        kh.verify(&s, &key(i as u8)).unwrap();
    }
    for (i, host) in ["a.example", "b.example", "c.example"].iter().enumerate() {
        assert_eq!(ask(&strict(home, &path, host, 22), i as u8).1, Ok(()));
    }
    assert_eq!(known_hosts_parses(&path), 0);
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
}

/// A known_hosts file in a new directory with one plain line, `host` with
/// key `n`, and settings for `host` that use it with strict checking.
fn one_host_file(host: &str, n: u8) -> (tempfile::TempDir, PathBuf, ConnectSettings) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("known_hosts");
    std::fs::write(&path, format_entry(host, 22, "ssh-ed25519", &blob(n), None)).unwrap();
    let s = strict(dir.path(), &path, host, 22);
    (dir, path, s)
}

/// Rewrites `path` in place (same inode), keeping its size.
fn rewrite_in_place(path: &Path, text: &str) {
    use std::io::Write;
    assert_eq!(std::fs::metadata(path).unwrap().len(), text.len() as u64);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[test]
fn changes_by_others_are_noticed() {
    let (dir, path, s) = one_host_file("host.example", 1);
    let home = dir.path();
    let with = |n: u8| format_entry("host.example", 22, "ssh-ed25519", &blob(n), None);
    settle();
    assert_eq!(ask(&s, 1).1, Ok(()));
    assert_eq!(ask(&s, 1).1, Ok(()));
    assert_eq!(known_hosts_parses(&path), 1);

    // Different content of the same size, same inode, after a while.
    rewrite_in_place(&path, &with(2));
    assert_eq!(ask(&s, 2).1, Ok(()));
    assert_eq!(known_hosts_parses(&path), 2);
    assert!(ask(&s, 1).1.is_err());

    // Rewritten again at once: possibly within the same timestamp tick.
    rewrite_in_place(&path, &with(3));
    assert_eq!(ask(&s, 3).1, Ok(()));
    rewrite_in_place(&path, &with(4));
    assert_eq!(ask(&s, 4).1, Ok(()));
    settle();
    assert_eq!(ask(&s, 4).1, Ok(()));
    let parses = known_hosts_parses(&path);
    assert_eq!(ask(&s, 4).1, Ok(()));
    assert_eq!(known_hosts_parses(&path), parses, "settled: no more reads");

    // Replaced by rename, with the old times.
    let tmp: PathBuf = dir.path().join("known_hosts.new");
    std::fs::write(&tmp, with(5)).unwrap();
    let old_times = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(old_times)
        .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(ask(&s, 5).1, Ok(()));
    assert_eq!(known_hosts_parses(&path), parses + 1);

    // Appended to by someone else (say ssh).
    settle();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format_entry(
        "other.example",
        22,
        "ssh-ed25519",
        &blob(6),
        Some(&[3; 20]),
    ));
    std::fs::write(&path, &text).unwrap();
    assert_eq!(ask(&strict(home, &path, "other.example", 22), 6).1, Ok(()));
}

#[test]
fn a_removed_file_counts_as_empty() {
    let (_dir, path, s) = one_host_file("gone.example", 1);
    assert_eq!(ask(&s, 1), (vec!["ssh-ed25519".to_string()], Ok(())));
    std::fs::remove_file(&path).unwrap();
    let (types, verdict) = ask(&s, 1);
    assert!(types.is_empty());
    let msg = verdict.unwrap_err();
    assert!(msg.contains("no ED25519 host key is known"), "{msg}");
}

#[test]
fn concurrent_connections_share_one_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("known_hosts");
    let global = dir.path().join("global_known_hosts");
    let home = dir.path().to_path_buf();
    let text = seed_lines("seed", 300, 3);
    std::fs::write(&path, &text).unwrap();
    std::fs::write(
        &global,
        format_entry("g.example", 22, "ssh-ed25519", &blob(1), None),
    )
    .unwrap();
    settle();
    std::thread::scope(|scope| {
        for t in 0..6u8 {
            let (home, path, global) = (&home, &path, &global);
            scope.spawn(move || {
                for i in 0..20u8 {
                    let host = format!("new{t}-{i}.example");
                    // The same file twice, and a second file, as configuration may say.
                    let files: [&Path; 3] = [path, global, path];
                    let s = settings(
                        home,
                        &files,
                        &host,
                        22,
                        &["StrictHostKeyChecking=accept-new", "HashKnownHosts=yes"],
                    );
                    let kh = KnownHosts::load(&s);
                    assert!(kh.known_key_types(&host, 22).is_empty());
                    kh.verify(&s, &key(100 + i)).unwrap();
                    let seed = format!("seed{}.example", u32::from(t) * 20 + u32::from(i));
                    let n = ((u32::from(t) * 20 + u32::from(i)) % 100) as u8;
                    assert_eq!(ask(&strict(home, path, &seed, 22), n).1, Ok(()));
                }
            });
        }
    });
    let on_disk = std::fs::read_to_string(&path).unwrap();
    let (fresh, warnings) = known_hosts::parse("kh", &on_disk);
    assert!(warnings.is_empty());
    assert_eq!(fresh.entries.len(), 300 + 120);
    let fresh = [fresh];
    for t in 0..6u8 {
        for i in 0..20u8 {
            let host = format!("new{t}-{i}.example");
            assert_eq!(ask(&strict(&home, &path, &host, 22), 100 + i).1, Ok(()));
            assert!(matches!(
                known_hosts::check(&fresh, &host, 22, "ssh-ed25519", &blob(100 + i)),
                HostKeyStatus::Known(_)
            ));
        }
    }
    // Our own appends never count as someone else's change.
    assert_eq!(known_hosts_parses(&path), 1);
    assert_eq!(known_hosts_parses(&global), 1);
}
