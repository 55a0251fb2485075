//! skiffd with `UsePAM yes`, driven by stock OpenSSH `ssh` (and skiff)
//! through the real PAM library and real modules: each test writes a PAM
//! service of its own (`PamService`, a file in /etc/pam.d) and makes a
//! throwaway account with a known password (`TempAccount`), as root.
//!
//! Covered: a password through pam_unix logs in and a wrong one is refused
//! with sshd's log lines; keyboard-interactive relays PAM's messages and
//! questions (pam_echo's text, pam_unix's "Password: "); PAM's account
//! stack refuses a public-key login; `AuthenticationMethods
//! publickey,password` needs both; an account that may not log in is
//! refused even where PAM would let anyone in, and so is root unless
//! `PermitRootLogin yes`; empty passwords need
//! `PermitEmptyPasswords yes`; without `UsePAM` no password is asked; a
//! module that hangs holds up only its own login, which `LoginGraceTime`
//! ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const PASSWORD: &str = "Tr0ub4dorAnd3";
const WRONG: &str = "notThePassword";

/// pam_unix for authentication and accounts (the usual stack).
const UNIX_STACK: &str = "auth required pam_unix.so\naccount required pam_unix.so\n";

fn can_run() -> bool {
    if !is_root() {
        let msg = "PAM services and test accounts need root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return false;
    }
    require_openssh() && require_tool("chpasswd", "passwd")
}

/// A test's world: its PAM service, an account with [`PASSWORD`], and a
/// skiffd using both.
struct World {
    fx: Fixture,
    d: Skiffd,
    acct: TempAccount,
    scratch: tempfile::TempDir,
    _service: PamService,
}

impl World {
    fn new(stack: &str, config: &str) -> World {
        let service = PamService::new("pam", stack);
        let acct = TempAccount::with_password("pam", "/bin/sh", PASSWORD);
        let fx = Fixture::new();
        let config = format!(
            "UsePAM yes\nPAMServiceName {}\nLogLevel VERBOSE\n{config}",
            service.name()
        );
        let d = Skiffd::start_with(
            SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config),
        );
        World {
            fx,
            d,
            acct,
            scratch: tempdir(),
            _service: service,
        }
    }

    fn name(&self) -> &str {
        self.acct.name()
    }

    /// An askpass program answering `answer` and the file its questions go
    /// to.
    fn askpass(&self, answer: &str) -> (PathBuf, PathBuf) {
        askpass_in(self.scratch.path(), answer)
    }

    /// [`by_answers`] as the account with `method`, `answer` for its
    /// questions; and the questions asked.
    fn login(&self, method: &str, answer: &str) -> (CmdOutput, Vec<String>) {
        let (script, marker) = self.askpass(answer);
        let out = self.by_answers(self.name(), method, &script).run();
        (out, questions(&marker))
    }

    fn by_answers(&self, user: &str, methods: &str, script: &Path) -> Ssh {
        by_answers(self.d.port(), user, &self.fx.client_key, methods, script)
    }

    fn ctx(&self, what: &str) -> String {
        ctx(&self.d, what)
    }

    /// Waits (bounded) until skiffd has logged a line holding every needle.
    fn logged(&self, needles: &[&str], what: &str) {
        let found = wait_until(Duration::from_secs(20), || {
            self.d
                .log()
                .lines()
                .any(|l| needles.iter().all(|n| l.contains(n)))
        });
        assert!(
            found,
            "{}",
            self.ctx(&format!("{what}: no line with {needles:?}"))
        );
    }
}

/// Stock ssh to `port` as `user` with `methods` only (no key offered, one
/// try), `script` answering its questions, running `id -un`. (LogLevel
/// INFO: ssh shows a keyboard-interactive instruction at that level.)
fn by_answers(port: u16, user: &str, key: &Key, methods: &str, script: &Path) -> Ssh {
    ssh(port, user, key)
        .log_level("INFO")
        .askpass(script)
        .opt("PubkeyAuthentication=no")
        .opt(&format!("PreferredAuthentications={methods}"))
        .opt("NumberOfPasswordPrompts=1")
        .args(&["id -un"])
}

fn questions(marker: &Path) -> Vec<String> {
    askpass_questions(marker)
}

/// Polls `cond` every 50 ms until it holds or `limit` passes.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_password_through_pam_logs_in_and_a_wrong_one_is_refused() {
    if !can_run() {
        return;
    }
    let w = World::new(UNIX_STACK, "");
    let name = w.name().to_string();

    let (out, asked) = w.login("password", PASSWORD);
    let c = w.ctx(&format!("right password\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(asked.len(), 1, "{c}: asked once: {asked:?}");
    w.logged(&["Accepted password for", &name, "ssh2"], "right password");

    let (out, _) = w.login("password", WRONG);
    let c = w.ctx(&format!("wrong password\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied"), "{c}");
    w.logged(&["Failed password for", &name], "wrong password");
    // The refusal lists what the login may still try.
    assert!(
        out.stderr
            .contains("publickey,password,keyboard-interactive"),
        "{c}"
    );
}

#[test]
fn keyboard_interactive_relays_pams_messages_and_questions() {
    if !can_run() {
        return;
    }
    let banner = "Authorised use only";
    let stack = format!("auth required pam_echo.so {banner}\n{UNIX_STACK}");
    let w = World::new(&stack, "");
    let name = w.name().to_string();

    let (out, asked) = w.login("keyboard-interactive", PASSWORD);
    let c = w.ctx(&format!("keyboard-interactive\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(asked.len(), 1, "{c}: one question: {asked:?}");
    assert!(
        asked[0].contains("Password"),
        "{c}: pam_unix's question: {asked:?}"
    );
    assert!(
        out.stderr.contains(banner),
        "{c}: pam_echo's text is the instruction"
    );
    w.logged(
        &["Accepted keyboard-interactive/pam for", &name],
        "keyboard-interactive",
    );

    let (out, _) = w.login("keyboard-interactive", WRONG);
    let c = w.ctx(&format!("keyboard-interactive, wrong answer\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    w.logged(
        &["Failed keyboard-interactive/pam for", &name],
        "wrong answer",
    );
}

#[test]
fn skiff_answers_skiffds_keyboard_interactive_questions() {
    if !can_run() {
        return;
    }
    let w = World::new(UNIX_STACK, "PasswordAuthentication no\n");
    let name = w.name().to_string();
    let home = ClientHome::new();
    home.trust(w.d.port(), &w.fx.host_key);
    let (script, marker) = w.askpass(PASSWORD);
    let out = skiff_exec(&home, w.d.port(), &name, None)
        .interactive()
        .askpass(&script)
        .cmd("id -un")
        .run();
    let c = w.ctx(&format!("skiff, keyboard-interactive\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(questions(&marker).len(), 1, "{c}");
    w.logged(&["Accepted keyboard-interactive/pam for", &name], "skiff");
}

#[test]
fn pams_account_stack_refuses_a_key_login() {
    if !can_run() {
        return;
    }
    let w = World::new(
        "auth required pam_unix.so\naccount required pam_deny.so\n",
        "",
    );
    let name = w.name().to_string();
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["id -un"])
        .run();
    let c = w.ctx(&format!("key login, PAM account denies\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied"), "{c}");
    w.logged(
        &[
            "Access denied for user",
            &name,
            "by PAM account configuration",
        ],
        "account denied",
    );

    // The same key and account with an account stack that agrees.
    let w = World::new(
        "auth required pam_unix.so\naccount required pam_permit.so\n",
        "",
    );
    let name = w.name().to_string();
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["id -un"])
        .run();
    let c = w.ctx(&format!("key login, PAM account permits\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
}

#[test]
fn publickey_then_password_needs_both() {
    if !can_run() {
        return;
    }
    let w = World::new(UNIX_STACK, "AuthenticationMethods publickey,password\n");
    let name = w.name().to_string();

    // A key alone is a partial success that leads nowhere in BatchMode.
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["id -un"])
        .run();
    let c = w.ctx(&format!("key only\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    w.logged(&["Partial publickey for", &name], "key only");

    // A password alone is not offered first.
    let (out, asked) = w.login("password", PASSWORD);
    let c = w.ctx(&format!("password only\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(asked.is_empty(), "{c}: nothing to ask: {asked:?}");

    // Both, in order.
    let (script, _) = w.askpass(PASSWORD);
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .askpass(&script)
        .opt("PreferredAuthentications=publickey,password")
        .args(&["id -un"])
        .run();
    let c = w.ctx(&format!("key then password\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    w.logged(&["Accepted password for", &name], "key then password");
}

#[test]
fn an_account_that_may_not_log_in_is_refused_whatever_pam_says() {
    if !can_run() {
        return;
    }
    // pam_permit lets anyone in, with any password.
    let w = World::new(
        "auth required pam_permit.so\naccount required pam_permit.so\n",
        // Two failing connections in a row: no penalty in between.
        "DenyUsers skt-pam-*\nPerSourcePenalties no\n",
    );
    let name = w.name().to_string();
    let (out, _) = w.login("password", PASSWORD);
    let c = w.ctx(&format!("denied account\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    w.logged(&["Failed password for", &name], "denied account");

    let ghost = "skt-nosuch-account";
    assert!(no_such_account(ghost));
    let (script, _) = w.askpass(PASSWORD);
    let out = by_answers(w.d.port(), ghost, &w.fx.client_key, "password", &script).run();
    let c = w.ctx(&format!("no such account\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    w.logged(
        &["Failed password for invalid user", ghost],
        "no such account",
    );
}

#[test]
fn a_source_that_guesses_passwords_is_turned_away_for_a_while() {
    if !can_run() {
        return;
    }
    for (config, penalised) in [
        ("", true),
        ("PerSourcePenaltyExemptList 127.0.0.1\n", false),
    ] {
        let w = World::new(UNIX_STACK, config);
        let name = w.name().to_string();
        let (out, _) = w.login("password", WRONG);
        out.expect_code(255, &w.ctx(&format!("a wrong password\n{out}")));
        if penalised {
            // skiffd judges a connection once it has ended.
            w.logged(&["penalty recorded: PasswordFail"], "the penalty");
        } else {
            w.logged(&["Failed password for", &name], "the wrong password");
        }
        // The next connection from the same address, even with a good key.
        let out = ssh(w.d.port(), &name, &w.fx.client_key)
            .args(&["id -un"])
            .run();
        let c = w.ctx(&format!("the next login ({config:?})\n{out}"));
        if penalised {
            out.expect_code(255, &c).expect_stdout("", &c);
            w.logged(
                &["refusing connections from", "PerSourcePenalties"],
                "penalty",
            );
        } else {
            out.expect_code(0, &c)
                .expect_stdout(&format!("{name}\n"), &c);
        }
    }
}

#[test]
fn an_expired_password_is_changed_through_keyboard_interactive() {
    if !can_run() || !require_tool("chage", "passwd") {
        return;
    }
    let stack = format!("{UNIX_STACK}password required pam_unix.so\n");
    let w = World::new(&stack, "");
    let name = w.name().to_string();
    // Expired: the last change was on day 0.
    w.acct.admin(&["chage", "-d", "0", &name], || {
        shadow_fields(&name).is_some_and(|f| f.get(2).is_some_and(|d| d == "0"))
    });
    // The password method cannot change it: refused, with the reason logged.
    let (out, _) = w.login("password", PASSWORD);
    let c = w.ctx(&format!("password method, expired\n{out}"));
    out.expect_code(255, &c);
    w.logged(
        &["Access denied for user", &name, "password has expired"],
        "expired",
    );

    // keyboard-interactive asks for the old and the new one, as sshd.
    const NEW: &str = "Fresh4Start99x";
    let dir = w.scratch.path().join("change");
    std::fs::create_dir_all(&dir).unwrap();
    let asked = dir.join("questions");
    let script = dir.join("askpass.sh");
    write_file(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$*\" in\n  *[Nn]ew*) echo {NEW} ;;\n  *) echo {PASSWORD} ;;\nesac\n",
            asked.display()
        ),
        0o755,
    );
    let out = by_answers(
        w.d.port(),
        &name,
        &w.fx.client_key,
        "keyboard-interactive",
        &script,
    )
    .run();
    let c = w.ctx(&format!(
        "keyboard-interactive, expired\n{out}\nasked: {:?}",
        questions(&asked)
    ));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    let questions = questions(&asked);
    assert!(
        questions
            .iter()
            .filter(|q| q.to_lowercase().contains("new"))
            .count()
            >= 2,
        "{c}: the new password, twice"
    );
    // The new password is the account's now.
    let (out, _) = w.login("password", NEW);
    let c = w.ctx(&format!("the new password\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
}

#[test]
fn root_needs_permit_root_login_yes_for_a_password() {
    if !can_run() {
        return;
    }
    // pam_permit takes any password: only PermitRootLogin stands between.
    let stack = "auth required pam_permit.so\naccount required pam_permit.so\n";
    for (permit, logs_in) in [("prohibit-password", false), ("yes", true)] {
        let w = World::new(stack, &format!("PermitRootLogin {permit}\n"));
        let (script, _) = w.askpass(WRONG);
        let out = by_answers(w.d.port(), "root", &w.fx.client_key, "password", &script).run();
        let c = w.ctx(&format!(
            "root by password, PermitRootLogin {permit}\n{out}"
        ));
        if logs_in {
            out.expect_code(0, &c).expect_stdout("root\n", &c);
        } else {
            out.expect_code(255, &c).expect_stdout("", &c);
            w.logged(&["refusing root's password"], "prohibit-password");
        }
    }
}

#[test]
fn empty_passwords_need_permit_empty_passwords() {
    if !can_run() {
        return;
    }
    let stack = "auth required pam_unix.so nullok\naccount required pam_unix.so\n";
    for (permit, logs_in) in [("no", false), ("yes", true)] {
        let w = World::new(stack, &format!("PermitEmptyPasswords {permit}\n"));
        let name = w.name().to_string();
        w.acct.admin(&["passwd", "-d", &name], || {
            shadow_fields(&name).is_some_and(|f| f.get(1).is_some_and(|p| p.is_empty()))
        });
        // askpass_script prints its answer: an empty line is an empty
        // password.
        let dir = w.scratch.path().join(format!("empty-{permit}"));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("askpass.sh");
        write_file(&script, "#!/bin/sh\necho\n", 0o755);
        let out = by_answers(w.d.port(), &name, &w.fx.client_key, "password", &script).run();
        let c = w.ctx(&format!(
            "empty password, PermitEmptyPasswords {permit}\n{out}"
        ));
        if logs_in {
            out.expect_code(0, &c)
                .expect_stdout(&format!("{name}\n"), &c);
        } else {
            out.expect_code(255, &c).expect_stdout("", &c);
        }
    }
}

#[test]
fn without_use_pam_no_password_is_asked() {
    if !can_run() {
        return;
    }
    let w = World::new(UNIX_STACK, "");
    // A second skiffd on the same keys, without UsePAM.
    let plain = Skiffd::start(&w.fx.host_key, &w.fx.authorized_keys);
    let (script, marker) = w.askpass(PASSWORD);
    let out = by_answers(
        plain.port(),
        w.name(),
        &w.fx.client_key,
        "password,keyboard-interactive",
        &script,
    )
    .run();
    let c = ctx(&plain, &format!("no UsePAM\n{out}"));
    out.expect_code(255, &c).expect_stdout("", &c);
    assert!(out.stderr.contains("Permission denied (publickey)"), "{c}");
    assert!(questions(&marker).is_empty(), "{c}: nothing asked");
}

#[test]
fn a_hung_module_holds_up_only_its_own_login() {
    if !can_run() {
        return;
    }
    // pam_exec waits for its program: this login hangs in PAM until
    // LoginGraceTime ends the connection.
    let stack = format!("auth required pam_exec.so /bin/sleep 40\n{UNIX_STACK}");
    let w = World::new(&stack, "LoginGraceTime 8\n");
    let name = w.name().to_string();
    let (script, _) = w.askpass(PASSWORD);
    let hung = {
        let (port, name, key) = (w.d.port(), name.clone(), w.fx.client_key.clone());
        std::thread::spawn(move || {
            by_answers(port, &name, &key, "password", &script)
                .timeout(Duration::from_secs(60))
                .run()
        })
    };
    // skiffd is inside PAM for that login once pam_exec's sleep runs.
    let sleeping = wait_until(Duration::from_secs(20), || {
        std::process::Command::new("pgrep")
            .args(["-f", "^/bin/sleep 40$"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        sleeping,
        "{}",
        w.ctx("the hung login never reached pam_exec")
    );
    // Meanwhile a key login on another connection goes through.
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["id -un"])
        .run();
    let c = w.ctx(&format!("key login while PAM hangs\n{out}"));
    out.expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    // The hung one ends with the grace time, long before its module.
    let hung = hung.join().expect("the hung login's thread");
    let c = w.ctx(&format!("hung login\n{hung}"));
    hung.expect_code(255, &c);
    w.logged(&["login grace time (8s) expired"], "grace time");
}

/// A pam_exec script that appends `PAM_TYPE PAM_USER PAM_RHOST` to `log`.
fn pam_exec_logger(dir: &Path, log: &Path) -> PathBuf {
    let script = dir.join("pam-log.sh");
    write_file(
        &script,
        format!(
            "#!/bin/sh\necho \"$PAM_TYPE $PAM_USER $PAM_RHOST\" >> '{}'\n",
            log.display()
        ),
        0o755,
    );
    script
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn pams_session_wraps_the_connections_commands() {
    if !can_run() {
        return;
    }
    let dir = tempdir();
    let log = dir.path().join("pam.log");
    let script = pam_exec_logger(dir.path(), &log);
    let stack = format!(
        "{UNIX_STACK}session required pam_exec.so {}\n",
        script.display()
    );
    let w = World::new(&stack, "");
    let name = w.name().to_string();
    // The command's parent is the connection's PAM session process, and
    // its exit status comes back through it.
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["tr '\\0' ' ' < /proc/$PPID/cmdline; echo; exit 7"])
        .run();
    let c = w.ctx(&format!("a command in PAM's session\n{out}"));
    out.expect_code(7, &c);
    assert!(
        out.stdout_str().contains("--pam-session"),
        "{c}: the command's parent"
    );
    // Opened before the command, closed once the connection ended.
    let closed = wait_until(Duration::from_secs(20), || {
        lines_of(&log)
            .iter()
            .any(|l| l.starts_with("close_session"))
    });
    assert!(closed, "{c}: {:?}", lines_of(&log));
    assert_eq!(
        lines_of(&log),
        [
            format!("open_session {name} 127.0.0.1"),
            format!("close_session {name} 127.0.0.1")
        ],
        "{c}"
    );
}

#[test]
fn pams_environment_and_limits_reach_the_commands_only() {
    if !can_run() {
        return;
    }
    let dir = tempdir();
    let envfile = dir.path().join("environment");
    write_file(&envfile, "SKIFF_PAM_VAR=from-pam\n", 0o644);
    let limits = dir.path().join("limits.conf");
    let stack = format!(
        "{UNIX_STACK}session required pam_env.so readenv=1 user_readenv=0 envfile={}\n\
         session required pam_limits.so conf={}\n",
        envfile.display(),
        limits.display()
    );
    let w = World::new(&stack, "");
    // PAM reads the limits when the session opens, at the first command.
    write_file(
        &limits,
        format!("{0} soft nofile 123\n{0} hard nofile 123\n", w.name()),
        0o644,
    );
    let out = ssh(w.d.port(), w.name(), &w.fx.client_key)
        .args(&["echo \"$SKIFF_PAM_VAR\"; ulimit -n"])
        .run();
    let c = w.ctx(&format!("PAM's environment and limits\n{out}"));
    out.expect_code(0, &c).expect_stdout("from-pam\n123\n", &c);
    // skiffd itself keeps its own limit.
    let limits_of_skiffd =
        std::fs::read_to_string(format!("/proc/{}/limits", w.d.pid())).unwrap_or_default();
    let open_files = limits_of_skiffd
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default()
        .to_string();
    assert!(
        !open_files.split_whitespace().any(|f| f == "123"),
        "{c}: skiffd's own limit changed: {open_files}"
    );
}

#[test]
fn a_session_pam_refuses_runs_nothing() {
    if !can_run() {
        return;
    }
    let w = World::new(&format!("{UNIX_STACK}session required pam_deny.so\n"), "");
    let out = ssh(w.d.port(), w.name(), &w.fx.client_key)
        .args(&["echo ran"])
        .run();
    let c = w.ctx(&format!("PAM session refused\n{out}"));
    assert_ne!(out.code, 0, "{c}");
    assert!(!out.stdout_str().contains("ran"), "{c}");
    w.logged(&["PAM session setup failed"], "session refused");
}

#[test]
fn transfers_and_sftp_run_in_pams_session() {
    if !can_run() {
        return;
    }
    let dir = tempdir();
    let log = dir.path().join("pam.log");
    let script = pam_exec_logger(dir.path(), &log);
    let service = PamService::new(
        "pam",
        &format!(
            "auth required pam_permit.so\naccount required pam_permit.so\n\
             session required pam_exec.so {}\n",
            script.display()
        ),
    );
    let fx = Fixture::new();
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str(&format!("UsePAM yes\nPAMServiceName {}\n", service.name()));
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    // skiff cp over the data plane: its transfer process starts in the
    // session.
    let local = dir.path().join("payload");
    random_file(&local, 300_000);
    let rdir = account_dir();
    let target = format!("{}@127.0.0.1:{}", user(), rdir.path().display());
    let out = skiff_cp(
        d.port(),
        &fx.client_key,
        &[
            "--cipher",
            "integrity",
            &local.display().to_string(),
            &target,
        ],
    );
    let c = ctx(&d, &format!("skiff cp in PAM's session\n{out}"));
    out.expect_code(0, &c);
    assert_eq!(
        std::fs::read(rdir.path().join("payload")).ok(),
        std::fs::read(&local).ok(),
        "{c}: the copy"
    );
    // Stock sftp: the SFTP server starts in the session too.
    let batch = dir.path().join("batch");
    write_file(&batch, format!("ls {}\n", rdir.path().display()), 0o644);
    let out = stock_sftp_batch(d.port(), &fx.client_key, &batch);
    let c = ctx(&d, &format!("sftp in PAM's session\n{out}"));
    out.expect_code(0, &c);
    assert!(out.stdout_str().contains("payload"), "{c}");
    // Each connection opened and closed its own session.
    let both = wait_until(Duration::from_secs(20), || {
        lines_of(&log)
            .iter()
            .filter(|l| l.starts_with("close_session"))
            .count()
            == 2
    });
    let me = user();
    assert!(both, "{c}: {:?}", lines_of(&log));
    assert_eq!(
        lines_of(&log)
            .iter()
            .filter(|l| **l == format!("open_session {me} 127.0.0.1"))
            .count(),
        2,
        "{c}: {:?}",
        lines_of(&log)
    );
}

#[test]
fn what_pams_session_says_is_shown_to_an_interactive_login() {
    if !can_run() {
        return;
    }
    let w = World::new(
        &format!("{UNIX_STACK}session optional pam_echo.so Hello-from-PAM-session\n"),
        "PrintMotd no\nPrintLastLog no\n",
    );
    let name = w.name().to_string();
    let shell = ssh(w.d.port(), &name, &w.fx.client_key)
        .flag("-tt")
        .input(Input::Bytes(b"exit 0\n".to_vec()))
        .run();
    let c = w.ctx(&format!("interactive login\n{shell}"));
    shell.expect_code(0, &c);
    assert!(shell.stdout_str().contains("Hello-from-PAM-session"), "{c}");
    // A command is not greeted.
    let out = ssh(w.d.port(), &name, &w.fx.client_key)
        .args(&["echo done"])
        .run();
    let c = w.ctx(&format!("command\n{out}"));
    out.expect_code(0, &c).expect_stdout("done\n", &c);
}
