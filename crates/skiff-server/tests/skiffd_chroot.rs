//! skiffd's `ChrootDirectory`, driven by stock OpenSSH: an SFTP-only login
//! (`ForceCommand internal-sftp`) sees the jail as `/` and nothing outside
//! it; a command runs inside the jail or not at all; a jail the account
//! could tamper with is refused. Jailing needs root, so these tests run
//! only as root (as CI does).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// A jail (mode 0755, root's) holding `pub/hello.txt` and an `upload`
/// directory the account owns.
fn make_jail(base: &Path) -> tempfile::TempDir {
    let jail = tempfile::Builder::new()
        .prefix("skiff-jail-")
        .tempdir_in(base)
        .expect("make a jail");
    std::fs::set_permissions(jail.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(jail.path().join("pub")).unwrap();
    write_file(
        &jail.path().join("pub/hello.txt"),
        "hello from the jail\n",
        0o644,
    );
    let upload = jail.path().join("upload");
    std::fs::create_dir(&upload).unwrap();
    let acct = account();
    std::os::unix::fs::chown(&upload, Some(acct.uid), Some(acct.gid)).unwrap();
    jail
}

fn skiffd_with(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let text = format!("{}{config}", sftp_subsystem_config().unwrap_or_default());
    let d = Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&text));
    Some((fx, d))
}

/// Stock `sftp -b` with `commands` against `d`.
fn sftp(d: &Skiffd, fx: &Fixture, commands: &[String]) -> CmdOutput {
    let batch = fx.path().join("batch");
    write_file(&batch, commands.join("\n") + "\n", 0o644);
    stock_sftp_batch(d.port(), &fx.client_key, &batch)
}

#[test]
fn an_sftp_only_login_sees_the_jail_as_its_root() {
    let Some(base) = jail_base() else {
        return;
    };
    let jail = make_jail(&base);
    let config = format!(
        "Match User {}\n  ChrootDirectory {}\n  ForceCommand internal-sftp\n",
        user(),
        jail.path().display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "ChrootDirectory with internal-sftp");
    let local = tempdir();
    let (got, sent) = (local.path().join("got.txt"), local.path().join("sent.txt"));
    write_file(&sent, "uploaded\n", 0o644);
    let out = sftp(
        &d,
        &fx,
        &[
            "ls -1 /".into(),
            format!("get /pub/hello.txt {}", got.display()),
            format!("put {} /upload/sent.txt", sent.display()),
        ],
    );
    out.expect_code(0, &c());
    let stdout = out.stdout_str();
    let listed: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("sftp>"))
        .map(|l| l.trim().trim_start_matches('/'))
        .collect();
    assert_eq!(listed, ["pub", "upload"], "{}\n{out}", c());
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "hello from the jail\n",
        "{}",
        c()
    );
    let landed = jail.path().join("upload/sent.txt");
    assert_eq!(
        std::fs::read_to_string(&landed).unwrap(),
        "uploaded\n",
        "{}",
        c()
    );
    assert_eq!(
        std::fs::metadata(&landed).unwrap().uid(),
        account().uid,
        "{}: the server dropped to the account",
        c()
    );

    // Nothing outside the jail is there to read, or to write.
    let leaked = local.path().join("passwd");
    let out = sftp(&d, &fx, &[format!("get /etc/passwd {}", leaked.display())]);
    assert_ne!(out.code, 0, "{}\n{out}", c());
    assert!(
        !leaked.exists(),
        "{}: /etc/passwd came out of the jail",
        c()
    );
    let out = sftp(&d, &fx, &[format!("put {} /pub/x", sent.display())]);
    assert_ne!(
        out.code,
        0,
        "{}: root's directory in the jail took a file\n{out}",
        c()
    );
}

#[test]
fn commands_run_inside_the_jail_and_unsafe_jails_are_refused() {
    let Some(base) = jail_base() else {
        return;
    };
    let jail = make_jail(&base);
    let config = format!("ChrootDirectory {}\n", jail.path().display());
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "ChrootDirectory without ForceCommand");
    // The jail has no shell: the command cannot start, and nothing runs
    // outside the jail instead.
    let marker = tempdir();
    let escaped = marker.path().join("escaped");
    let out = ssh(d.port(), user(), &fx.client_key)
        .args(&[&format!("touch {}", escaped.display())])
        .run();
    assert_ne!(out.code, 0, "{}\n{out}", c());
    assert!(
        !escaped.exists(),
        "{}: the command ran outside the jail",
        c()
    );
    assert!(d.log().contains("cannot start session command"), "{}", c());
    drop(d);

    // A jail the group may write to is refused outright.
    std::fs::set_permissions(jail.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
    let config = format!(
        "ChrootDirectory {}\nForceCommand internal-sftp\n",
        jail.path().display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let out = sftp(&d, &fx, &["pwd".into()]);
    assert_ne!(out.code, 0, "{}\n{out}", ctx(&d, "a group-writable jail"));
    assert!(
        d.log().contains("bad ownership or modes"),
        "{}",
        ctx(&d, "a group-writable jail")
    );
}
