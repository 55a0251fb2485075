//! skiffd's `transfer` audit record for data-plane copies, driven by
//! `skiff cp` up and down: written when the transfer ends, with its
//! direction, the files and file bytes the transfer process reports, the
//! mode and streams skiffd granted, its duration and whether it completed;
//! a download with a missing source, and an upload into a directory that
//! is not there, are recorded as not completed.

use std::path::{Path, PathBuf};

use serde_json::Value;
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// The audit log's `transfer` records once there are `want` of them.
fn transfers(path: &Path, want: usize, d: &Skiffd) -> Vec<Value> {
    audit_events(path, "transfer", want, d)
}

fn skiffd_with_audit(fx: &Fixture, audit: &Path) -> Skiffd {
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str(&format!("AuditLog {}\n", audit.display()));
    Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config))
}

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// The fields every finished transfer record has, whichever way it went.
fn assert_reported(r: &Value, mode: &str, c: &str) {
    assert_eq!(r["user"], user(), "{c}: {r}");
    assert_eq!(r["mode"], mode, "{c}: {r}");
    assert!(r["streams"].as_u64().is_some_and(|n| n >= 1), "{c}: {r}");
    assert!(r["duration_ms"].as_u64().is_some(), "{c}: {r}");
    assert_eq!(r["counted_by"], "transfer_process", "{c}: {r}");
}

#[test]
fn uploads_and_downloads_are_recorded_with_direction_files_and_bytes() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit);
    // An empty file, a small one, and one of several chunks.
    let sizes = [0usize, 1, (1 << 20) + 1, 300_000];
    let local: Vec<PathBuf> = sizes
        .iter()
        .map(|size| {
            let p = dir.path().join(format!("f{size}"));
            random_file(&p, *size);
            p
        })
        .collect();
    let total: u64 = sizes.iter().map(|s| *s as u64).sum();

    let rdir = account_dir();
    let mut args: Vec<String> = ["--cipher", "integrity", "--streams", "2"]
        .map(String::from)
        .to_vec();
    args.extend(local.iter().map(|p| p.display().to_string()));
    args.push(remote(rdir.path()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    skiff_cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, "upload"));
    let up = &transfers(&audit, 1, &d)[0];
    assert_reported(up, "integrity", "upload");
    assert_eq!(up["direction"], "upload", "{up}");
    assert_eq!(up["files"], sizes.len() as u64, "{up}");
    assert_eq!(up["bytes"], total, "{up}");
    assert_eq!(up["failed"], 0, "{up}");
    assert_eq!(up["completed"], true, "{up}");

    let back = tempdir();
    let mut args: Vec<String> = vec!["--cipher".into(), "aead".into()];
    args.extend(
        local
            .iter()
            .map(|p| remote(&rdir.path().join(p.file_name().unwrap()))),
    );
    args.push(back.path().display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    skiff_cp(d.port(), &fx.client_key, &args).expect_code(0, &ctx(&d, "download"));
    for (p, size) in local.iter().zip(sizes) {
        let got = std::fs::metadata(back.path().join(p.file_name().unwrap())).unwrap();
        assert_eq!(got.len(), size as u64, "downloaded {}", p.display());
    }
    let all = transfers(&audit, 2, &d);
    let down = &all[1];
    assert_reported(down, "aead", "download");
    assert_eq!(down["direction"], "download", "{down}");
    assert_eq!(down["files"], sizes.len() as u64, "{down}");
    assert_eq!(down["bytes"], total, "{down}");
    assert_eq!(down["failed"], 0, "{down}");
    assert_eq!(down["completed"], true, "{down}");
    // Two connections, one transfer each.
    assert_ne!(all[0]["conn"], all[1]["conn"]);
}

#[test]
fn a_download_with_a_missing_source_is_recorded_as_not_completed() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit);
    let rdir = account_dir();
    let present = rdir.path().join("present");
    random_file(&present, 70_000);
    if is_root() {
        let acct = account();
        std::os::unix::fs::chown(&present, Some(acct.uid), Some(acct.gid)).unwrap();
    }
    let back = tempdir();
    // Streams, so that the mode is the one asked for: a download this
    // small would otherwise come on the channel alone.
    let args = [
        "--cipher".to_string(),
        "integrity".to_string(),
        "--streams".to_string(),
        "1".to_string(),
        remote(&present),
        remote(&rdir.path().join("absent")),
        back.path().display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = skiff_cp(d.port(), &fx.client_key, &args);
    assert_ne!(
        out.code,
        0,
        "{}",
        ctx(&d, &format!("a missing source fails: {}", out.stderr))
    );
    let r = &transfers(&audit, 1, &d)[0];
    assert_reported(r, "integrity", "partial download");
    assert_eq!(r["direction"], "download", "{r}");
    assert_eq!(r["files"], 1, "{r}");
    assert_eq!(r["bytes"], 70_000, "{r}");
    assert_eq!(r["failed"], 1, "{r}");
    assert_eq!(r["completed"], false, "{r}");
}

#[test]
fn an_upload_to_a_missing_directory_is_recorded_as_not_completed() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let dir = tempdir();
    let audit = dir.path().join("audit.jsonl");
    let d = skiffd_with_audit(&fx, &audit);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    random_file(&a, 10);
    random_file(&b, 20);
    let rdir = account_dir();
    let args = [
        "--cipher".to_string(),
        "integrity".to_string(),
        "--streams".to_string(),
        "1".to_string(),
        a.display().to_string(),
        b.display().to_string(),
        remote(&rdir.path().join("no-such-directory")),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = skiff_cp(d.port(), &fx.client_key, &args);
    assert_ne!(
        out.code,
        0,
        "{}",
        ctx(
            &d,
            &format!("two files into a missing directory: {}", out.stderr)
        )
    );
    let r = &transfers(&audit, 1, &d)[0];
    assert_reported(r, "integrity", "refused upload");
    assert_eq!(r["direction"], "upload", "{r}");
    assert_eq!(r["files"], 0, "{r}");
    assert_eq!(r["bytes"], 0, "{r}");
    assert_eq!(r["completed"], false, "{r}");
}
