//! skiffd's `AuthorizedKeysCommand` and `AuthorizedPrincipalsCommand`:
//! programs that print authorized_keys lines or certificate principals for
//! the account, run as the command user with the offered key (or
//! certificate) in their arguments; stock OpenSSH `ssh` logs in with keys
//! and certificates that only the program vouches for.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use skiff_testkit::*;

/// A lookup program in its own directory: it appends `RUNNER ARGS` to
/// `calls`, prints the file `keys` when asked about the test account, and
/// then fails when `fail` exists.
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

    /// Asserts that the program was called once as `line` (`RUNNER ARGS`).
    fn expect_call(&self, line: &str, c: &str) {
        let calls = self.call_lines();
        assert!(
            calls.iter().any(|l| l == line),
            "{c}: expected a call {line:?} in {calls:?}"
        );
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
    program.expect_call(&expected, &c);

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

/// AuthorizedPrincipalsCommand: the certificate must carry a principal the
/// program prints for the account (with that line's options); the program
/// is told the key ID, the serial and the CA's fingerprint.
#[test]
fn principals_from_the_command_admit_certificates() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let program = KeysProgram::new();
    let config = format!(
        "TrustedUserCAKeys {}\nAuthorizedPrincipalsCommand {} %u %i %s %F\n\
         AuthorizedPrincipalsCommandUser {}\n",
        ca.public.display(),
        program.program().display(),
        user()
    );
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let c = server_context(&d, "AuthorizedPrincipalsCommand");
    // A certificate for the stranger's key naming a team, not the account.
    let cert_key = user_certificate_copy(
        &fx,
        &ca,
        &fx.stranger_key,
        "stranger-cert-src",
        ("laptop-7", "ops-team"),
        &["-z", "7"],
    );
    let login = || ssh(d.port(), user(), &cert_key).args(&["echo", "in"]).run();

    // No principal printed: refused.
    login().expect_code(255, &c);
    // The team printed: in, and the program saw the certificate.
    write_file(&program.keys(), "ops-team\n", 0o644);
    login().expect_code(0, &c).expect_stdout("in\n", &c);
    let expected = format!("{u} {u} laptop-7 7 {}", ca.fingerprint(), u = user());
    program.expect_call(&expected, &c);
    // The line's options apply.
    write_file(
        &program.keys(),
        "command=\"echo via-team\" ops-team\n",
        0o644,
    );
    login().expect_code(0, &c).expect_stdout("via-team\n", &c);
    // Another team: refused.
    write_file(&program.keys(), "db-team\n", 0o644);
    login().expect_code(255, &c);
}
