//! skiffd's `AuthorizedKeysCommand`: a program that prints authorized_keys
//! lines for the account, run as `AuthorizedKeysCommandUser` with the
//! offered key in its arguments; stock OpenSSH `ssh` logs in with keys
//! that only the program knows.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::*;

/// A keys program in its own directory: it appends `RUNNER ARGS` to
/// `calls`, fails after printing when `fail` exists, and prints `keys` when
/// asked about the test account.
struct KeysProgram {
    dir: tempfile::TempDir,
    /// Written by the program (as the command user).
    log: tempfile::TempDir,
}

impl KeysProgram {
    fn new() -> KeysProgram {
        let dir = tempdir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let log = account_dir();
        let p = KeysProgram { dir, log };
        write_file(&p.keys(), "", 0o644);
        write_file(
            &p.program(),
            format!(
                "#!/bin/sh\necho \"$(id -un) $*\" >> '{calls}'\n[ \"$1\" = '{user}' ] || exit 0\ncat '{keys}'\n\
                 [ -e '{fail}' ] && exit 1\nexit 0\n",
                calls = p.calls().display(),
                user = user(),
                keys = p.keys().display(),
                fail = p.log.path().join("fail").display(),
            ),
            0o755,
        );
        p
    }

    fn program(&self) -> PathBuf {
        self.dir.path().join("keys-for")
    }

    fn keys(&self) -> PathBuf {
        self.dir.path().join("keys")
    }

    fn calls(&self) -> PathBuf {
        self.log.path().join("calls")
    }

    fn call_lines(&self) -> Vec<String> {
        fs::read_to_string(self.calls())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn config(&self) -> String {
        format!(
            "AuthorizedKeysCommand {} %u %t %k %f\nAuthorizedKeysCommandUser {}\n",
            self.program().display(),
            user()
        )
    }
}

#[test]
fn keys_from_the_command_let_their_holders_in() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let program = KeysProgram::new();
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&program.config()),
    );
    let c = server_context(&d, "AuthorizedKeysCommand");
    let login = |key: &Key| ssh(d.port(), user(), key).args(&["echo", "in"]).run();

    // Nothing printed: the stranger's key is refused, after asking.
    login(&fx.stranger_key).expect_code(255, &c);
    assert!(!program.call_lines().is_empty(), "{c}: the program ran");

    // Printed: it lets the stranger in. The program ran as the command
    // user and was told the account, the key type, the key and its
    // fingerprint.
    write_file(
        &program.keys(),
        format!("{}\n", fx.stranger_key.pub_line()),
        0o644,
    );
    login(&fx.stranger_key)
        .expect_code(0, &c)
        .expect_stdout("in\n", &c);
    let material = fx.stranger_key.key_material();
    let expected = format!(
        "{runner} {user} {material} {fp}",
        runner = user(),
        user = user(),
        fp = fx.stranger_key.fingerprint()
    );
    assert!(
        program.call_lines().contains(&expected),
        "{c}: expected a call {expected:?} in {:?}",
        program.call_lines()
    );

    // Options on the printed line apply.
    write_file(
        &program.keys(),
        format!("command=\"echo forced\" {}\n", fx.stranger_key.pub_line()),
        0o644,
    );
    login(&fx.stranger_key)
        .expect_code(0, &c)
        .expect_stdout("forced\n", &c);

    // A key in the account's own file is found there: no call for it.
    let before = program.call_lines().len();
    login(&fx.client_key)
        .expect_code(0, &c)
        .expect_stdout("in\n", &c);
    assert_eq!(
        program.call_lines().len(),
        before,
        "{c}: no call for a listed key"
    );

    // A failing run's output is not used.
    write_file(&program.log.path().join("fail"), "", 0o644);
    login(&fx.stranger_key).expect_code(255, &c);
    fs::remove_file(program.log.path().join("fail")).unwrap();
    assert!(d.log().contains("it exited with"), "{c}");

    // A program others could change is not run.
    fs::set_permissions(program.program(), fs::Permissions::from_mode(0o777)).unwrap();
    let before = program.call_lines().len();
    login(&fx.stranger_key).expect_code(255, &c);
    assert_eq!(program.call_lines().len(), before, "{c}: not run");
    assert!(d.log().contains("not writable by group or others"), "{c}");
    fs::set_permissions(program.program(), fs::Permissions::from_mode(0o755)).unwrap();
    login(&fx.stranger_key).expect_code(0, &c);
}

#[test]
fn bad_command_settings_stop_skiffd() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let program = KeysProgram::new();
    let config = fx.path().join("skiffd.conf");
    let mut cases = vec![
        (
            "AuthorizedKeysCommand keys-for %u\n".to_string(),
            "must be an absolute path",
        ),
        (
            format!("AuthorizedKeysCommand {} %z\n", program.program().display()),
            "unknown token %z",
        ),
        (
            format!(
                "AuthorizedKeysCommand {}\nAuthorizedKeysCommandUser no-such-user-skiff\n",
                program.program().display()
            ),
            "no such user",
        ),
    ];
    if is_root() {
        cases.push((
            format!("AuthorizedKeysCommand {}\n", program.program().display()),
            "needs AuthorizedKeysCommandUser",
        ));
        cases.push((
            format!(
                "AuthorizedKeysCommand {}\nAuthorizedKeysCommandUser root\n",
                program.program().display()
            ),
            "may not be root",
        ));
    }
    for (text, needle) in cases {
        write_file(&config, &text, 0o644);
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{text:?} must stop skiffd\n{out}");
        assert!(
            out.stderr.contains(needle),
            "{text:?}: expected {needle:?}\n{out}"
        );
    }
}
