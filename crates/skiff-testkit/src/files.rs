//! Temporary directories and files: a temporary directory the test
//! account can read, files written with a mode, random content and its
//! SHA-256.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use tempfile::TempDir;

/// A fresh temporary directory with mode 0755, so that files in it can be
/// read by the test account (sshd reads authorized_keys as that user).
pub fn tempdir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("skiff-it-")
        .tempdir()
        .expect("create temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    dir
}

/// Writes `contents` to `path` and sets its mode.
pub fn write_file(path: &Path, contents: impl AsRef<[u8]>, mode: u32) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Mode bits (permission part) of a file.
pub fn file_mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Writes `size` bytes from /dev/urandom to `path` and returns their
/// SHA-256 (hex), computed by the local `sha256sum`.
pub fn random_file(path: &Path, size: usize) -> String {
    let mut src = File::open("/dev/urandom").expect("open /dev/urandom");
    let mut dst = File::create(path).expect("create random file");
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len());
        src.read_exact(&mut buf[..n]).expect("read /dev/urandom");
        dst.write_all(&buf[..n]).expect("write random file");
        left -= n;
    }
    dst.sync_all().ok();
    drop(dst);
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum failed");
    first_token(&out.stdout)
}

/// SHA-256 (hex) of a file, by the local `sha256sum`.
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    first_token(&out.stdout)
}

/// First whitespace-separated token of some output, e.g. a sha256sum hash.
pub fn first_token(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}
