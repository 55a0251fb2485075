//! `internal-sftp` options (sftp-server's `-d`, `-u`, `-R`, `-P`, `-p`,
//! `-l`, `-f`, `-e`) in `ForceCommand internal-sftp ...` and `Subsystem
//! sftp internal-sftp ...`, driven by stock OpenSSH `sftp -b` (and `skiff
//! cp`): refused requests get "Permission denied" and change nothing, the
//! session starts where `-d` says and creates files under `-u`'s umask, and
//! a bad option fails `skiffd -t` at its line. Run as root (as CI does),
//! the remote side is the `skiff-test` account, in directories it owns.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A skiffd whose configuration is `config` (after the line the harness
/// may need to serve SFTP at all).
fn skiffd_with(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let text = format!("{}{config}", sftp_subsystem_config().unwrap_or_default());
    let d = Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&text));
    Some((fx, d))
}

/// Stock `sftp -b` running `commands` (stopping at the first that fails).
fn sftp(d: &Skiffd, fx: &Fixture, commands: &[String]) -> CmdOutput {
    let batch = tempdir();
    let file = batch.path().join("batch");
    write_file(&file, commands.join("\n") + "\n", 0o644);
    stock_sftp_batch(d.port(), &fx.client_key, &file)
}

/// The directory `sftp`'s `pwd` reports.
fn remote_pwd(out: &CmdOutput) -> Option<String> {
    out.stdout_str().lines().find_map(|l| {
        l.strip_prefix("Remote working directory: ")
            .map(str::to_string)
    })
}

/// `sftp` failed one command because the server refused it.
fn assert_refused(out: &CmdOutput, c: &str) {
    assert_ne!(out.code, 0, "{c}: the request went through\n{out}");
    assert!(
        out.stderr.contains("Permission denied"),
        "{c}: not refused as permission denied\n{out}"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mode()
        & 0o7777
}

/// A directory the account owns holding `pub.txt` (0644) and `keep/`.
fn account_files() -> tempfile::TempDir {
    let dir = account_dir();
    let acct = account();
    write_file(&dir.path().join("pub.txt"), "public\n", 0o644);
    std::fs::create_dir(dir.path().join("keep")).unwrap();
    for p in ["pub.txt", "keep"] {
        std::os::unix::fs::chown(dir.path().join(p), Some(acct.uid), Some(acct.gid)).unwrap();
    }
    dir
}

#[test]
fn read_only_serves_reads_and_refuses_every_change() {
    let remote = account_files();
    let r = remote.path();
    let config = format!("ForceCommand internal-sftp -R -d {}\n", r.display());
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = |what: &str| ctx(&d, &format!("ForceCommand internal-sftp -R: {what}"));
    let local = tempdir();
    let (got, sent) = (local.path().join("got"), local.path().join("sent"));
    write_file(&sent, "uploaded\n", 0o644);

    let out = sftp(
        &d,
        &fx,
        &[
            "pwd".into(),
            "ls".into(),
            format!("get pub.txt {}", got.display()),
        ],
    );
    out.expect_code(0, &c("reads"));
    assert_eq!(remote_pwd(&out).as_deref(), r.to_str(), "{}", c("-d"));
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "public\n");

    let before = std::fs::metadata(r.join("pub.txt")).unwrap();
    for (what, command) in [
        ("put", format!("put {} up.txt", sent.display())),
        ("put over a file", format!("put {} pub.txt", sent.display())),
        ("mkdir", "mkdir made".into()),
        ("rmdir", "rmdir keep".into()),
        ("rm", "rm pub.txt".into()),
        ("rename", "rename pub.txt moved.txt".into()),
        ("chmod", "chmod 600 pub.txt".into()),
        ("symlink", "symlink pub.txt link".into()),
        ("hardlink", "ln pub.txt hard".into()),
    ] {
        let out = sftp(&d, &fx, &[command]);
        assert_refused(&out, &c(what));
    }
    let mut left: Vec<String> = std::fs::read_dir(r)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["keep", "pub.txt"], "{}: something changed", c("all"));
    let after = std::fs::metadata(r.join("pub.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(r.join("pub.txt")).unwrap(),
        "public\n"
    );
    assert_eq!(
        (after.mode(), after.mtime(), after.ino()),
        (before.mode(), before.mtime(), before.ino()),
        "{}: pub.txt was touched",
        c("all")
    );
}

#[test]
fn start_directory_expands_tokens_and_is_relative_to_home() {
    if !require_openssh() {
        return;
    }
    let acct = account();
    let under_home = tempfile::Builder::new()
        .prefix("skiff-sftp-start-")
        .tempdir_in(&acct.home)
        .expect("a directory in the account's home");
    let name = under_home.path().file_name().unwrap().to_str().unwrap();
    let inner = under_home.path().join(&acct.name);
    std::fs::create_dir(&inner).unwrap();
    for p in [under_home.path(), &inner] {
        std::os::unix::fs::chown(p, Some(acct.uid), Some(acct.gid)).unwrap();
    }
    for (option, want) in [
        (format!("%d/{name}/%u"), inner.clone()),
        (name.to_string(), under_home.path().to_path_buf()),
        (format!("'%d/{name}'"), under_home.path().to_path_buf()),
    ] {
        let config = format!("ForceCommand internal-sftp -d {option} -e -l VERBOSE -f AUTH\n");
        let Some((fx, d)) = skiffd_with(&config) else {
            return;
        };
        let c = ctx(&d, &format!("internal-sftp -d {option}"));
        let out = sftp(&d, &fx, &["pwd".into()]);
        out.expect_code(0, &c);
        assert_eq!(remote_pwd(&out).as_deref(), want.to_str(), "{c}\n{out}");
    }
    // A start directory that is not there: the session starts at home.
    let config = "ForceCommand internal-sftp -d %d/no-such-skiff-dir\n";
    let Some((fx, d)) = skiffd_with(config) else {
        return;
    };
    let c = ctx(&d, "internal-sftp -d (missing)");
    let out = sftp(&d, &fx, &["pwd".into()]);
    out.expect_code(0, &c);
    assert_eq!(
        remote_pwd(&out).as_deref(),
        acct.home.to_str(),
        "{c}\n{out}"
    );
}

#[test]
fn umask_applies_to_what_the_session_creates() {
    let local = tempdir();
    let sent = local.path().join("sent");
    write_file(&sent, "uploaded\n", 0o644);
    let forced = account_dir();
    let config = format!(
        "ForceCommand internal-sftp -u 077 -d {}\n",
        forced.path().display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = ctx(&d, "ForceCommand internal-sftp -u 077");
    let out = sftp(
        &d,
        &fx,
        &[format!("put {} f.txt", sent.display()), "mkdir dir".into()],
    );
    out.expect_code(0, &c);
    assert_eq!(mode(&forced.path().join("f.txt")), 0o600, "{c}");
    assert_eq!(mode(&forced.path().join("dir")), 0o700, "{c}");
    drop(d);

    // The same through `Subsystem sftp internal-sftp ...` (skiffd's own
    // executable serves it, through the account's shell: started from a
    // copy the account can run).
    let subsystem = account_dir();
    let config = format!(
        "Subsystem sftp internal-sftp -u 027 -d {}\n",
        subsystem.path().display()
    );
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config(&config)
            .account_runnable(),
    );
    let c = ctx(&d, "Subsystem sftp internal-sftp -u 027");
    let out = sftp(
        &d,
        &fx,
        &[format!("put {} f.txt", sent.display()), "mkdir dir".into()],
    );
    out.expect_code(0, &c);
    assert_eq!(mode(&subsystem.path().join("f.txt")), 0o640, "{c}");
    assert_eq!(mode(&subsystem.path().join("dir")), 0o750, "{c}");
}

#[test]
fn denied_and_allowed_request_lists() {
    let local = tempdir();
    let sent = local.path().join("sent");
    write_file(&sent, "uploaded\n", 0o644);

    // -P remove: uploads go through, removing does not.
    let remote = account_files();
    let r = remote.path();
    let config = format!(
        "ForceCommand internal-sftp -P remove,rmdir -d {}\n",
        r.display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = |what: &str| ctx(&d, &format!("internal-sftp -P remove,rmdir: {what}"));
    let out = sftp(
        &d,
        &fx,
        &[
            format!("put {} up.txt", sent.display()),
            "mkdir made".into(),
        ],
    );
    out.expect_code(0, &c("put, mkdir"));
    assert_eq!(
        std::fs::read_to_string(r.join("up.txt")).unwrap(),
        "uploaded\n"
    );
    assert_refused(&sftp(&d, &fx, &["rm up.txt".into()]), &c("rm"));
    assert_refused(&sftp(&d, &fx, &["rmdir made".into()]), &c("rmdir"));
    assert!(
        r.join("up.txt").exists() && r.join("made").is_dir(),
        "{}",
        c("left")
    );
    drop(d);

    // -p: only what is listed; a -P on top still refuses.
    let remote = account_files();
    let r = remote.path();
    let config = format!(
        "ForceCommand internal-sftp -p realpath,stat,lstat,fstat,opendir,readdir,open,read,close,remove -P remove -d {}\n",
        r.display()
    );
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&format!(
            "{}{config}",
            sftp_subsystem_config().unwrap_or_default()
        )),
    );
    let c = |what: &str| ctx(&d, &format!("internal-sftp -p ...: {what}"));
    let got = local.path().join("got");
    let out = sftp(
        &d,
        &fx,
        &["ls".into(), format!("get pub.txt {}", got.display())],
    );
    out.expect_code(0, &c("ls, get"));
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "public\n");
    assert_refused(&sftp(&d, &fx, &["mkdir made".into()]), &c("mkdir"));
    assert_refused(&sftp(&d, &fx, &["rm pub.txt".into()]), &c("rm"));
    assert_refused(&sftp(&d, &fx, &["rename pub.txt x".into()]), &c("rename"));
    assert!(r.join("pub.txt").exists() && !r.join("made").exists() && !r.join("x").exists());
}

/// Bad options are configuration errors at their line, for `skiffd -t`
/// as for a starting skiffd; good ones pass.
#[test]
fn bad_options_fail_the_configuration_at_their_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("opts.conf");
    let check = || {
        Run::new(skiffd_bin())
            .args(["-t", "-f"])
            .arg(&config)
            .arg("--host-key")
            .arg(&fx.host_key.private)
            .run()
    };
    write_file(
        &config,
        "Subsystem sftp internal-sftp -u 022 -l INFO -f LOCAL0 -e\n\
         ForceCommand internal-sftp -R -d %d/pub -P remove,posix-rename\n\
         Match User nobody\n  ForceCommand internal-sftp -p open,read,close\n",
        0o644,
    );
    check().expect_code(0, "good internal-sftp options");
    for (text, line, needle) in [
        ("# x\n\nForceCommand internal-sftp -u 9x\n", 3, "9x"),
        ("Subsystem sftp internal-sftp -P remove,erase\n", 1, "erase"),
        ("ForceCommand internal-sftp -x\n", 1, "-x"),
        ("ForceCommand internal-sftp -l LOUD\n", 1, "LOUD"),
        (
            "Match User nobody\n  ForceCommand internal-sftp -d\n",
            2,
            "-d",
        ),
    ] {
        write_file(&config, text, 0o644);
        let out = check();
        assert_eq!(out.code, 1, "{text:?}\n{out}");
        assert!(
            out.stderr.contains(&format!("opts.conf:{line}")) && out.stderr.contains(needle),
            "{text:?}: the error names the line and the option\n{out}"
        );
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_eq!(out.code, 1, "{text:?}: skiffd starts anyway\n{out}");
    }
}

/// Inside a `ChrootDirectory` jail, `-d` is a path in the jail and `-R`
/// still refuses writes where the account could otherwise write.
#[test]
fn options_apply_inside_a_jail() {
    let Some(base) = jail_base() else {
        return;
    };
    let jail = tempfile::Builder::new()
        .prefix("skiff-jail-")
        .tempdir_in(&base)
        .expect("make a jail");
    std::fs::set_permissions(jail.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let upload = jail.path().join("upload");
    std::fs::create_dir(&upload).unwrap();
    write_file(&upload.join("hello.txt"), "hello from the jail\n", 0o644);
    let acct = account();
    for p in [&upload, &upload.join("hello.txt")] {
        std::os::unix::fs::chown(p, Some(acct.uid), Some(acct.gid)).unwrap();
    }
    let config = format!(
        "ChrootDirectory {}\nForceCommand internal-sftp -R -d /upload\n",
        jail.path().display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = |what: &str| ctx(&d, &format!("jailed internal-sftp -R -d /upload: {what}"));
    let local = tempdir();
    let (got, sent) = (local.path().join("got"), local.path().join("sent"));
    write_file(&sent, "uploaded\n", 0o644);
    let out = sftp(
        &d,
        &fx,
        &["pwd".into(), format!("get hello.txt {}", got.display())],
    );
    out.expect_code(0, &c("reads"));
    assert_eq!(remote_pwd(&out).as_deref(), Some("/upload"), "{}", c("pwd"));
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "hello from the jail\n"
    );
    assert_refused(
        &sftp(&d, &fx, &[format!("put {} sent.txt", sent.display())]),
        &c("put"),
    );
    assert_refused(&sftp(&d, &fx, &["rm hello.txt".into()]), &c("rm"));
    assert!(!upload.join("sent.txt").exists() && upload.join("hello.txt").exists());
}

/// `skiff cp` to a read-only account fails with the server's reason and
/// leaves nothing behind, whether `-R` is forced (the data plane is then
/// refused) or on the `sftp` subsystem (skiffd refuses the data plane too,
/// which could not honour it).
#[test]
fn skiff_cp_to_a_read_only_account_fails_cleanly() {
    let local = tempdir();
    let sent = local.path().join("sent.bin");
    random_file(&sent, 256 * 1024);
    if !require_openssh() {
        return;
    }
    for config in [
        "ForceCommand internal-sftp -R\n",
        "Subsystem sftp internal-sftp -R\n",
    ] {
        let remote = account_dir();
        let fx = Fixture::new();
        // skiffd's own executable serves the subsystem as the account:
        // started from a copy the account can run.
        let d = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
                .config(config)
                .account_runnable(),
        );
        let c = ctx(&d, &format!("skiff cp to {}", config.trim()));
        let home = ClientHome::new();
        home.trust(d.port(), &fx.host_key);
        let target = remote.path().join("sent.bin");
        let out = Run::new(skiff_bin())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
            .env("HOME", home.path())
            .arg("cp")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
            .arg(d.port().to_string())
            .arg("-i")
            .arg(&fx.client_key.private)
            .arg(&sent)
            .arg(format!("{}@127.0.0.1:{}", user(), target.display()))
            .run();
        assert_ne!(out.code, 0, "{c}: the copy went through\n{out}");
        let said = out.stderr.to_lowercase();
        assert!(
            said.contains("permission denied") && said.contains("read-only"),
            "{c}: the error says why\n{out}"
        );
        let left: Vec<_> = std::fs::read_dir(remote.path()).unwrap().collect();
        assert!(left.is_empty(), "{c}: left behind: {left:?}");
    }
}

/// `skiffd --sftp-server -Q requests` lists the names `-P` and `-p` take,
/// the same as OpenSSH's sftp-server where it is installed.
#[test]
fn the_server_lists_its_request_names() {
    let out = Run::new(skiffd_bin())
        .args(["--sftp-server", "-Q", "requests"])
        .run();
    out.expect_code(0, "skiffd --sftp-server -Q requests");
    let ours = out.stdout_str();
    assert!(
        ours.lines().any(|l| l == "posix-rename") && ours.lines().count() == 29,
        "{out}"
    );
    let out = Run::new(skiffd_bin())
        .args(["--sftp-server", "-Q", "nonsense"])
        .run();
    assert_eq!(out.code, 1, "{out}");
    let openssh = Path::new("/usr/lib/openssh/sftp-server");
    if openssh.exists() {
        let theirs = Run::new(openssh).args(["-Q", "requests"]).run();
        theirs.expect_code(0, "sftp-server -Q requests");
        assert_eq!(ours, theirs.stdout_str(), "the names differ from OpenSSH's");
    }
}

/// A key's `command="internal-sftp -R -d DIR"` is skiffd's own server with
/// those options, as in sshd; a key's internal-sftp with an option the
/// server does not take serves nothing (it is no looser server).
#[test]
fn a_keys_command_internal_sftp_is_the_internal_server() {
    let remote = account_files();
    let r = remote.path();
    let Some((fx, d)) = skiffd_with("") else {
        return;
    };
    let [read_only, bad] = fx.keys_with_options([
        (
            "read_only",
            &format!("command=\"internal-sftp -R -d {}\"", r.display()),
        ),
        ("bad", "command=\"internal-sftp -Z\""),
    ]);
    let c = ctx(&d, "authorized_keys command=\"internal-sftp -R -d DIR\"");
    let batch = tempdir();
    let file = batch.path().join("batch");
    let local = tempdir();
    let (got, sent) = (local.path().join("got"), local.path().join("sent"));
    write_file(&sent, "uploaded\n", 0o644);
    write_file(
        &file,
        format!("pwd\nget pub.txt {}\n", got.display()),
        0o644,
    );
    let out = stock_sftp_batch(d.port(), &read_only, &file);
    out.expect_code(0, &c);
    assert_eq!(remote_pwd(&out).as_deref(), r.to_str(), "{c}\n{out}");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "public\n");
    write_file(&file, format!("put {} up.txt\n", sent.display()), 0o644);
    assert_refused(&stock_sftp_batch(d.port(), &read_only, &file), &c);
    assert!(!r.join("up.txt").exists(), "{c}: the upload went through");

    let c = ctx(&d, "authorized_keys command=\"internal-sftp -Z\"");
    write_file(&file, "pwd\n", 0o644);
    let out = stock_sftp_batch(d.port(), &bad, &file);
    assert_ne!(out.code, 0, "{c}: served\n{out}");
}
