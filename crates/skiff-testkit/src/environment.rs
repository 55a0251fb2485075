//! What the tests need from the machine they run on: the `skiff` and
//! `skiffd` binaries under test and the test peers (found in the cargo
//! target directory the test runs from), the OpenSSH programs and other tools
//! (`require_openssh`, `require_tool`: a failure instead of a skip under
//! CI), whether the tests run as root, and a base directory for chroot
//! jails.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Path of the OpenSSH server binary.
pub const SSHD: &str = "/usr/sbin/sshd";

/// Path of the `skiff` client binary under test.
pub fn skiff_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("skiff"))
}

/// Path of the `skiffd` server binary under test.
pub fn skiffd_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("skiffd"))
}

/// The directory of the running test's build profile: a test runs from
/// `target/<profile>/deps/`, and the workspace's binaries and examples are
/// in `target/<profile>/`.
pub fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        exe.parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("{} is not in target/<profile>/deps", exe.display()))
            .to_path_buf()
    })
}

/// The `cargo build` options that build for the running test's profile.
fn profile_flag() -> String {
    match profile_dir().file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => String::new(),
        Some("release") => " --release".to_string(),
        Some(other) => format!(" --profile {other}"),
    }
}

/// `name`, a binary of this workspace, built for the running test's
/// profile. A test can only name its own package's binaries with
/// `CARGO_BIN_EXE_*`, and skiff's tests need skiffd (and skiffd's some
/// skiff): `cargo test --workspace` builds every binary first; a run of
/// one package's tests may not, which this says.
fn workspace_bin(name: &str) -> String {
    let bin = profile_dir().join(name);
    assert!(
        bin.is_file(),
        "{} is missing: the tests run the workspace's binaries, built by `cargo test --workspace` \
         or `cargo build{} --bin {name}` (run that, then the tests again)",
        bin.display(),
        profile_flag()
    );
    bin.into_os_string()
        .into_string()
        .unwrap_or_else(|p| panic!("{} is not UTF-8", p.display()))
}

/// A test peer: the example `name` (source `tests/peers/<name>.rs` under
/// `manifest_dir`, the test's `CARGO_MANIFEST_DIR`) of the package
/// `package`, which `cargo test` builds with that package's tests.
/// Panics, saying how to build it, when it is missing or older than its
/// source.
pub fn test_peer(manifest_dir: &str, package: &str, name: &str) -> PathBuf {
    let built = profile_dir().join("examples").join(name);
    let build = format!("cargo build{} -p {package} --examples", profile_flag());
    assert!(
        built.is_file(),
        "test peer {} is missing: `cargo test -p {package}` builds it, or `{build}`",
        built.display()
    );
    let source = Path::new(manifest_dir)
        .join("tests/peers")
        .join(format!("{name}.rs"));
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    assert!(
        modified(&built) >= modified(&source),
        "test peer {} is older than {}: rebuild it (`{build}`)",
        built.display(),
        source.display()
    );
    built
}

/// util-linux's `prlimit`, which starts skiffd with a chosen open-file
/// limit.
pub fn prlimit_bin() -> &'static str {
    assert!(
        on_path("prlimit"),
        "test needs prlimit (apt-get install -y util-linux)"
    );
    "prlimit"
}

/// True when running under CI (`CI=true`, as set by most CI systems).
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "true" || v == "1" || v == "yes"
        })
        .unwrap_or(false)
}

fn on_path(tool: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        fs::metadata(dir.join(tool))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Checks that the OpenSSH programs the tests need are installed.
///
/// Returns `true` when they are. When something is missing: panics under CI
/// (a skipped interoperability test must never look like a pass there),
/// otherwise prints a notice and returns `false` so the caller can return.
pub fn require_openssh() -> bool {
    let mut missing = Vec::new();
    if !Path::new(SSHD).is_file() {
        missing.push(SSHD.to_string());
    }
    for tool in ["ssh", "ssh-keygen", "ssh-agent", "ssh-add", "sha256sum"] {
        if !on_path(tool) {
            missing.push(tool.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "OpenSSH interoperability test needs {} (install openssh-server, openssh-client, coreutils)",
        missing.join(", ")
    );
    if in_ci() {
        panic!("{msg}; CI=true so this test refuses to skip");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    false
}

/// Whether `tool` is on PATH. Under CI a missing tool is a failure (the
/// test would otherwise pass without testing anything); elsewhere it prints
/// a notice and returns `false` so the caller can return.
pub fn require_tool(tool: &str, package: &str) -> bool {
    if on_path(tool) {
        return true;
    }
    let msg = format!("test needs {tool} (apt-get install -y {package})");
    if in_ci() {
        panic!("{msg}; CI=true so this test refuses to skip");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    false
}

/// Where distributions put OpenSSH's `sftp-server`.
const SFTP_SERVERS: &[&str] = &[
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
];

/// OpenSSH's `sftp-server` (for tests that wrap it in a `Subsystem sftp`
/// script of their own), or `None` when it is missing: a failure under CI,
/// elsewhere a notice, and the caller returns.
pub fn openssh_sftp_server() -> Option<&'static str> {
    if let Some(p) = SFTP_SERVERS.iter().find(|p| Path::new(p).is_file()) {
        return Some(p);
    }
    let msg = format!("test needs OpenSSH's sftp-server (one of {SFTP_SERVERS:?})");
    if in_ci() {
        panic!("{msg}; CI=true so this test refuses to skip");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    None
}

/// True when the tests run as root (uid 0).
pub fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        let out = Command::new("id").arg("-u").output().expect("run `id -u`");
        String::from_utf8_lossy(&out.stdout).trim() == "0"
    })
}

/// A directory to make `ChrootDirectory` jails in: every component
/// root-owned and writable by no one else, as a jail's must be (this test
/// binary's temporary directory under target/, else `/run` or `/srv`).
/// `None` when not root.
pub fn jail_base() -> Option<PathBuf> {
    if !is_root() {
        return None;
    }
    // Cargo's CARGO_TARGET_TMPDIR: `tmp` beside the profile directories.
    let target_tmp = profile_dir()
        .parent()
        .expect("the target directory")
        .join("tmp");
    let _ = fs::create_dir_all(&target_tmp);
    let candidates = [&*target_tmp, Path::new("/run"), Path::new("/srv")];
    let base = candidates
        .iter()
        .find(|b| skiff_server::chroot::check(b).is_ok())
        .unwrap_or_else(|| panic!("no root-owned, non-writable directory among {candidates:?}"));
    Some(base.to_path_buf())
}
