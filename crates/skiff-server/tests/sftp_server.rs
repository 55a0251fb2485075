//! Stock OpenSSH `sftp` and `scp` (SFTP mode) -> skiffd's `sftp` subsystem.
//!
//! Every test starts its own skiffd and drives it with the real clients
//! (`-F /dev/null`, BatchMode, IdentitiesOnly), then checks the real files:
//! contents (sha256), modes, times and owners. Run as root (as CI does),
//! the account is `skiff-test` and its files must carry its uid; remote
//! files go to a fresh directory owned by the account.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// sftp and scp come with ssh in openssh-client; under CI a missing one
/// fails the test, elsewhere it is skipped with a notice.
fn require_clients() -> bool {
    require_openssh()
        && require_tool("sftp", "openssh-client")
        && require_tool("scp", "openssh-client")
}

/// A fixture and a skiffd serving SFTP (plus `extra` config lines).
fn setup_with(extra: &str) -> Option<(Fixture, Skiffd)> {
    if !require_clients() {
        return None;
    }
    let fx = Fixture::new();
    let config = format!("{}{extra}", sftp_subsystem_config().unwrap_or_default());
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if !config.is_empty() {
        opts = opts.config(&config);
    }
    let d = Skiffd::start_with(opts);
    Some((fx, d))
}

fn setup() -> Option<(Fixture, Skiffd)> {
    setup_with("")
}

/// `prog` (sftp or scp) with the hermetic options the harness's `ssh` uses,
/// logging in as the test account with `key`.
fn client(prog: &str, port: u16, key: &Key, scratch: &Path) -> Run {
    Run::new(prog)
        .env_remove("SSH_AUTH_SOCK")
        .env("HOME", scratch)
        .args(["-F", "/dev/null"])
        .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
        .args(["-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"])
        .args(["-o", "StrictHostKeyChecking=no"])
        .arg(format!(
            "-oUserKnownHostsFile={}",
            scratch.join("known_hosts").display()
        ))
        .arg("-i")
        .arg(&key.private)
        .args(["-P", &port.to_string()])
        .timeout(BULK_TIMEOUT)
}

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// `sftp -b BATCH` with `commands` (a line each; a leading `-` lets a
/// command fail without ending the batch).
fn sftp_batch(port: u16, key: &Key, commands: &[&str]) -> CmdOutput {
    let scratch = tempdir();
    let batch = scratch.path().join("batch");
    write_file(&batch, commands.join("\n") + "\n", 0o644);
    client("sftp", port, key, scratch.path())
        .arg("-b")
        .arg(&batch)
        .arg(format!("{}@127.0.0.1", user()))
        .run()
}

/// `scp -s` (SFTP, which OpenSSH 9 uses by default anyway) with `args`.
fn scp(port: u16, key: &Key, args: &[&str]) -> CmdOutput {
    let scratch = tempdir();
    client("scp", port, key, scratch.path())
        .arg("-s")
        .args(args)
        .run()
}

fn mtime(path: &Path) -> i64 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mtime()
}

/// Asserts that `path` belongs to the test account (when that is another
/// account, i.e. the tests run as root).
fn expect_account_owns(path: &Path, c: &str) {
    let m =
        fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{c}: stat {}: {e}", path.display()));
    let acct = account();
    assert_eq!(m.uid(), acct.uid, "{c}: owner of {}", path.display());
    assert_eq!(m.gid(), acct.gid, "{c}: group of {}", path.display());
}

/// The subsystem really was SFTP served by skiffd (and not, say, a legacy
/// scp run through exec).
fn expect_sftp_subsystem(d: &Skiffd, c: &str) {
    assert!(
        d.log().contains("subsystem sftp"),
        "{}",
        ctx(d, &format!("{c}: no sftp subsystem in the log"))
    );
}

/// put, get, ls, mkdir, rename, chmod, symlink, rm and rmdir through
/// `sftp -b`, each checked on the real files.
#[test]
fn sftp_batch_operations() {
    let Some((fx, d)) = setup() else { return };
    let local = tempdir();
    let src = local.path().join("src.bin");
    let want = random_file(&src, 300 * 1024 + 17);
    let back = local.path().join("back.bin");
    let rdir = account_dir();
    let r = rdir.path();
    let (up, sub, moved, link) = (
        r.join("up.bin"),
        r.join("sub"),
        r.join("sub/moved.bin"),
        r.join("link"),
    );
    let script = [
        "pwd".to_string(),
        format!("put {} {}", src.display(), up.display()),
        format!("get {} {}", up.display(), back.display()),
        format!("mkdir {}", sub.display()),
        format!("chmod 640 {}", up.display()),
        format!("rename {} {}", up.display(), moved.display()),
        format!("symlink {} {}", moved.display(), link.display()),
        format!("ls -l {}", sub.display()),
        format!("ls -la {}", r.display()),
    ];
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let out = sftp_batch(d.port(), &fx.client_key, &script);
    let c = ctx(&d, "sftp batch");
    out.expect_code(0, &c);
    expect_sftp_subsystem(&d, "sftp batch");
    let text = out.stdout_str();

    // pwd: relative paths start at the account's home.
    let home = account().home.display().to_string();
    assert!(
        text.contains(&format!("Remote working directory: {home}\n")),
        "{c}\n{out}"
    );
    // put and get keep the bytes.
    assert_eq!(sha256(&back), want, "{c}: get returned other bytes");
    assert_eq!(sha256(&moved), want, "{c}: put stored other bytes");
    // mkdir, rename, chmod.
    assert!(sub.is_dir(), "{c}: mkdir");
    assert!(!up.exists(), "{c}: rename left the old name");
    assert_eq!(file_mode(&moved), 0o640, "{c}: chmod 640");
    expect_account_owns(&moved, &c);
    expect_account_owns(&sub, &c);
    // symlink: OpenSSH sends (target, link); the link points at the target.
    assert_eq!(
        fs::read_link(&link).expect("readlink"),
        moved,
        "{c}: symlink"
    );
    // ls -l shows long names (mode, owner name, size) and ls -a the dots.
    // (sftp echoes each batch command as `sftp> ...`; the listing is the rest.)
    let listing: Vec<&str> = text.lines().filter(|l| !l.starts_with("sftp>")).collect();
    let line = listing
        .iter()
        .find(|l| l.ends_with(" moved.bin"))
        .unwrap_or_else(|| panic!("{c}: no ls line for moved.bin\n{out}"));
    assert!(line.starts_with("-rw-r-----"), "{c}: {line:?}");
    assert!(line.contains(&format!(" {} ", user())), "{c}: {line:?}");
    assert!(
        line.contains(&format!(" {} ", 300 * 1024 + 17)),
        "{c}: {line:?}"
    );
    let link_line = listing.iter().find(|l| l.contains(" link")).unwrap_or(&"");
    assert!(link_line.starts_with('l'), "{c}: symlink in ls -la\n{out}");
    assert!(
        text.lines()
            .any(|l| l.starts_with('d') && l.ends_with(" ..")),
        "{c}: ls -la shows ..\n{out}"
    );

    // rm and rmdir (a non-empty directory is refused first).
    let script = [
        format!("-rmdir {}", sub.display()),
        format!("rm {}", moved.display()),
        format!("rm {}", link.display()),
        format!("rmdir {}", sub.display()),
    ];
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let out = sftp_batch(d.port(), &fx.client_key, &script);
    let c = ctx(&d, "sftp rm/rmdir");
    out.expect_code(0, &c);
    assert!(
        out.stderr.contains("Failure") || out.stderr.contains("remove"),
        "{c}: rmdir of a non-empty directory must fail\n{out}"
    );
    assert!(
        !moved.exists() && fs::symlink_metadata(&link).is_err(),
        "{c}: rm"
    );
    assert!(!sub.exists(), "{c}: rmdir");
}

/// A relative name lands in the home directory, owned by the account.
#[test]
fn relative_paths_start_at_home_and_files_belong_to_the_account() {
    let Some((fx, d)) = setup() else { return };
    let local = tempdir();
    let src = local.path().join("f.txt");
    write_file(&src, "hello home\n", 0o644);
    let name = format!("skiff-sftp-test-{}-{}", std::process::id(), d.port());
    let in_home = account().home.join(&name);
    let _ = fs::remove_file(&in_home);
    let put = format!("put {} {name}", src.display());
    let out = sftp_batch(d.port(), &fx.client_key, &[&put]);
    let result = fs::read_to_string(&in_home);
    let owner = fs::metadata(&in_home).map(|m| (m.uid(), m.gid()));
    let _ = fs::remove_file(&in_home);
    let c = ctx(&d, "relative put");
    out.expect_code(0, &c);
    assert_eq!(result.expect("file in home"), "hello home\n", "{c}");
    let acct = account();
    assert_eq!(owner.expect("stat"), (acct.uid, acct.gid), "{c}: owner");
}

/// 5 MiB of random bytes up and down with `scp -s`.
#[test]
fn scp_big_file_round_trip() {
    let Some((fx, d)) = setup() else { return };
    let local = tempdir();
    let src = local.path().join("big.bin");
    let want = random_file(&src, 5 * 1024 * 1024);
    let rdir = account_dir();
    let up = rdir.path().join("big.bin");
    let down = local.path().join("down.bin");

    let src_arg = src.display().to_string();
    let out = scp(d.port(), &fx.client_key, &[&src_arg, &remote(&up)]);
    out.expect_code(0, &ctx(&d, "scp upload"));
    assert_eq!(sha256(&up), want, "uploaded bytes differ");
    expect_account_owns(&up, "scp upload");

    let down_arg = down.display().to_string();
    let out = scp(d.port(), &fx.client_key, &[&remote(&up), &down_arg]);
    out.expect_code(0, &ctx(&d, "scp download"));
    assert_eq!(sha256(&down), want, "downloaded bytes differ");
    expect_sftp_subsystem(&d, "scp");
}

/// The tree [`scp_recursive_preserve`] copies: (relative path, mode, mtime).
const TREE: [(&str, u32, i64); 5] = [
    ("tree/a.bin", 0o600, 1_500_000_000),
    ("tree/sub", 0o750, 1_400_000_000),
    ("tree/sub/b.txt", 0o644, 1_300_000_000),
    ("tree/sub/deep", 0o700, 1_200_000_000),
    ("tree/sub/deep/c.sh", 0o755, 1_100_000_000),
];

fn set_mtime(path: &Path, t: i64) {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t as u64);
    let f = fs::File::options()
        .read(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.set_times(fs::FileTimes::new().set_accessed(time).set_modified(time))
        .unwrap_or_else(|e| panic!("set times of {}: {e}", path.display()));
}

/// Checks every entry of [`TREE`] under `root` against the original under
/// `orig`: same mode, same mtime, same bytes.
fn check_tree(root: &Path, orig: &Path, c: &str) {
    for (rel, mode, t) in TREE {
        let (got, want) = (root.join(rel), orig.join(rel));
        assert_eq!(file_mode(&got), mode, "{c}: mode of {rel}");
        assert_eq!(mtime(&got), t, "{c}: mtime of {rel}");
        if want.is_file() {
            assert_eq!(sha256(&got), sha256(&want), "{c}: bytes of {rel}");
        }
    }
}

/// `scp -r -p` up and down: contents, modes and mtimes kept.
#[test]
fn scp_recursive_preserve() {
    let Some((fx, d)) = setup() else { return };
    let local = tempdir();
    let base = local.path();
    fs::create_dir(base.join("tree")).expect("mkdir tree");
    for (rel, mode, _) in TREE {
        let p = base.join(rel);
        if rel.ends_with("sub") || rel.ends_with("deep") {
            fs::create_dir(&p).expect("mkdir");
        } else {
            random_file(&p, 70_000 + rel.len() * 1000);
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
    }
    // Deepest first, so that filling a directory does not touch its time again.
    for (rel, _, t) in TREE.iter().rev() {
        set_mtime(&base.join(rel), *t);
    }

    let rdir = account_dir();
    let tree_arg = base.join("tree").display().to_string();
    let out = scp(
        d.port(),
        &fx.client_key,
        &["-r", "-p", &tree_arg, &remote(rdir.path())],
    );
    out.expect_code(0, &ctx(&d, "scp -r -p upload"));
    check_tree(rdir.path(), base, "scp -r -p upload");
    for (rel, _, _) in TREE {
        expect_account_owns(&rdir.path().join(rel), "scp -r -p upload");
    }

    let back = tempdir();
    let back_arg = back.path().display().to_string();
    let out = scp(
        d.port(),
        &fx.client_key,
        &["-r", "-p", &remote(&rdir.path().join("tree")), &back_arg],
    );
    out.expect_code(0, &ctx(&d, "scp -r -p download"));
    check_tree(back.path(), base, "scp -r -p download");
}

/// Writing where the account may not gives "Permission denied"; the same
/// session goes on, and so does the server.
#[test]
fn permission_denied_keeps_serving() {
    let Some((fx, d)) = setup() else { return };
    let local = tempdir();
    let src = local.path().join("f.txt");
    write_file(&src, "data\n", 0o644);
    // Read-only for everyone, and (run as root) owned by root.
    let rdir = tempdir();
    let locked = rdir.path().join("locked");
    fs::create_dir(&locked).expect("mkdir locked");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).expect("chmod locked");
    let target = locked.join("f.txt");
    let ok_dir = account_dir();
    let fine = ok_dir.path().join("fine.txt");

    let script = [
        format!("-put {} {}", src.display(), target.display()),
        format!("-mkdir {}", locked.join("d").display()),
        format!("put {} {}", src.display(), fine.display()),
    ];
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let out = sftp_batch(d.port(), &fx.client_key, &script);
    let c = ctx(&d, "write into a read-only directory");
    out.expect_code(0, &c);
    assert!(
        out.stderr.matches("Permission denied").count() >= 2,
        "{c}: both refusals reported\n{out}"
    );
    assert!(!target.exists() && !locked.join("d").exists(), "{c}");
    assert_eq!(
        fs::read_to_string(&fine).expect("fine.txt"),
        "data\n",
        "{c}"
    );

    // Without the leading '-' the batch stops at the refusal.
    let put = format!("put {} {}", src.display(), target.display());
    let out = sftp_batch(d.port(), &fx.client_key, &[&put]);
    assert_ne!(out.code, 0, "{c}\n{out}");
    assert!(out.stderr.contains("Permission denied"), "{c}\n{out}");

    // The server still serves new sessions.
    let out = sftp_batch(d.port(), &fx.client_key, &["pwd"]);
    out.expect_code(0, &ctx(&d, "sftp after refusals"));
}

/// `Subsystem sftp COMMAND` in the config file: that command (through the
/// account's shell) serves SFTP.
#[test]
fn configured_sftp_command() {
    if !require_clients() {
        return;
    }
    let marker_dir = account_dir();
    let marker = marker_dir.path().join("marker");
    let line = format!(
        "Subsystem sftp echo configured > '{}'; exec '{}' --sftp-server\n",
        marker.display(),
        account_skiffd().display()
    );
    let fx = Fixture::new();
    let d = Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&line));
    let out = sftp_batch(d.port(), &fx.client_key, &["pwd"]);
    let c = ctx(&d, "configured sftp command");
    out.expect_code(0, &c);
    assert_eq!(
        fs::read_to_string(&marker).unwrap_or_default(),
        "configured\n",
        "{c}: the configured command did not run\n{out}"
    );
}

/// Only the sftp subsystem exists; `Subsystem sftp none` removes it too.
#[test]
fn other_subsystems_are_refused() {
    let Some((fx, d)) = setup() else { return };
    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-s")
        .args(&["not-sftp"])
        .run();
    let c = ctx(&d, "ssh -s not-sftp");
    out.expect_code(255, &c);
    assert!(
        out.stderr.contains("subsystem request failed"),
        "{c}\n{out}"
    );

    let Some((fx, d)) = setup_with("Subsystem sftp none\n") else {
        return;
    };
    let out = sftp_batch(d.port(), &fx.client_key, &["pwd"]);
    let c = ctx(&d, "Subsystem sftp none");
    assert_ne!(out.code, 0, "{c}\n{out}");
    assert!(
        out.stderr.contains("subsystem request failed"),
        "{c}\n{out}"
    );
}

/// A key with a forced command runs that command instead of the SFTP
/// server, with the subsystem's command in SSH_ORIGINAL_COMMAND (as sshd).
#[test]
fn forced_command_replaces_the_subsystem() {
    if !require_clients() {
        return;
    }
    let fx = Fixture::new();
    let marker_dir = account_dir();
    let marker = marker_dir.path().join("marker");
    let forced = format!(
        "command=\"echo $SSH_ORIGINAL_COMMAND > {}\"",
        marker.display()
    );
    let [key] = fx.keys_with_options([("forced", forced.as_str())]);
    let config = sftp_subsystem_config().unwrap_or_default();
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if !config.is_empty() {
        opts = opts.config(&config);
    }
    let d = Skiffd::start_with(opts);
    let out = sftp_batch(d.port(), &key, &["pwd"]);
    let c = ctx(&d, "sftp with a forced-command key");
    assert_ne!(
        out.code, 0,
        "{c}: the forced command is no SFTP server\n{out}"
    );
    let seen = fs::read_to_string(&marker).unwrap_or_else(|e| panic!("{c}: marker: {e}\n{out}"));
    assert!(
        seen.trim_end().ends_with("--sftp-server"),
        "{c}: SSH_ORIGINAL_COMMAND={seen:?}"
    );
}
