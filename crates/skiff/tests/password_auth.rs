//! skiff's password and keyboard-interactive authentication against real
//! OpenSSH sshd, as root: each test makes a throwaway account (unique name,
//! removed afterwards) with a known password set through `chpasswd`, and
//! gives skiff the password through an SSH_ASKPASS script
//! (`SSH_ASKPASS_REQUIRE=force`) that writes each question it is asked to
//! a marker file, so that a test can tell whether and how often skiff
//! asked.
//!
//! Covered: the right password logs in, a wrong one is refused after
//! `NumberOfPasswordPrompts` tries with an error naming the methods tried;
//! BatchMode and `PasswordAuthentication no` never ask; sshd's
//! `AuthenticationMethods publickey,password` needs both;
//! `PreferredAuthentications` puts a password before a working key;
//! keyboard-interactive through sshd's PAM (`UsePAM yes`); skiff's agent
//! hands a password login back to the command; a fan-out asks nobody (not
//! yet). A hostile server's keyboard-interactive text is shown escaped
//! (`tests/peers/hostile_kbd.rs`).
//!
//! Those against sshd need root, as CI has: elsewhere they skip with a
//! notice.

use std::path::{Path, PathBuf};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// The password of the test accounts (shell-safe, as `askpass_script`
/// wants).
const PASSWORD: &str = "Corr3ctHorseBattery";
const WRONG: &str = "wrongPassword";

/// Whether the test can run: root (to make accounts and set a password)
/// and OpenSSH. Under CI a missing piece is a failure.
fn can_run() -> bool {
    if !is_root() {
        let msg = "making test accounts needs root";
        assert!(!in_ci(), "{msg}; CI=true so this test refuses to skip");
        eprintln!("NOTICE: skipping test: {msg}");
        return false;
    }
    require_openssh() && require_tool("chpasswd", "passwd")
}

/// A throwaway account whose password is [`PASSWORD`].
fn account_with_password() -> TempAccount {
    TempAccount::with_password("pw", "/bin/sh", PASSWORD)
}

/// One test's world: an sshd with `extra` config lines, a client HOME that
/// trusts its host key, and an account with a password.
struct World {
    fx: Fixture,
    sshd: Sshd,
    home: ClientHome,
    acct: TempAccount,
}

impl World {
    fn new(extra: &[&str]) -> World {
        let acct = account_with_password();
        let (fx, sshd) = sshd_setup(extra).expect("OpenSSH was checked");
        let home = ClientHome::new();
        home.trust(sshd.port(), &fx.host_key);
        World {
            fx,
            sshd,
            home,
            acct,
        }
    }

    /// An askpass script answering `answer`, and the marker file it logs
    /// its questions to.
    fn askpass(&self, answer: &str) -> (PathBuf, PathBuf) {
        askpass_in(self.home.path(), answer)
    }

    /// `skiff exec` as the account, no key, not in BatchMode, with the
    /// password from an askpass program answering `answer`.
    fn exec(&self, answer: &str) -> (SkiffExec, PathBuf) {
        let (script, marker) = self.askpass(answer);
        let exec = skiff_exec(&self.home, self.sshd.port(), self.acct.name(), None)
            .interactive()
            .askpass(&script)
            .cmd("id -un");
        (exec, marker)
    }

    fn ctx(&self, what: &str) -> String {
        ctx(&self.sshd, what)
    }
}

/// skiff failed (255, nothing on stdout) with an error, its last stderr
/// line, naming every needle (after any "Permission denied, please try
/// again." between tries).
trait FailsWith {
    fn fails_with(&self, needles: &[&str], context: &str) -> &Self;
}

impl FailsWith for CmdOutput {
    fn fails_with(&self, needles: &[&str], context: &str) -> &Self {
        self.expect_code(255, context);
        assert!(self.stdout.is_empty(), "{context}: stdout\n{self}");
        let lines = self.stderr_lines();
        let last = lines.last().copied().unwrap_or("");
        assert!(last.starts_with("skiff: "), "{context}\n{self}");
        for l in &lines[..lines.len().saturating_sub(1)] {
            assert_eq!(
                *l, "Permission denied, please try again.",
                "{context}\n{self}"
            );
        }
        for n in needles {
            assert!(
                last.contains(n),
                "{context}: the error should say {n:?}\n{self}"
            );
        }
        self
    }
}

/// The questions the askpass program was asked, one a line (none when it
/// was never run).
fn questions(marker: &Path) -> Vec<String> {
    askpass_questions(marker)
}

#[test]
fn the_right_password_logs_in_and_a_wrong_one_is_refused_after_the_prompts() {
    if !can_run() {
        return;
    }
    let w = World::new(&["PasswordAuthentication yes"]);
    let name = w.acct.name();

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("right password");
    exec.run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(
        questions(&marker),
        [format!("askpass called: {name}@127.0.0.1's password: ")],
        "{c}"
    );

    // Wrong: asked NumberOfPasswordPrompts times (default 3), then a
    // clear error naming what was tried.
    let (exec, marker) = w.exec(WRONG);
    let c = w.ctx("wrong password");
    let out = exec.run();
    out.fails_with(
        &[
            "authentication failed (publickey,password)",
            "password refused 3 times",
        ],
        &c,
    );
    assert_eq!(questions(&marker).len(), 3, "{c}\n{out}");
    assert!(
        out.stderr.contains("Permission denied, please try again."),
        "{c}\n{out}"
    );
    assert!(
        !out.stderr.contains(WRONG),
        "the password is never shown\n{out}"
    );

    let (exec, marker) = w.exec(WRONG);
    let c = w.ctx("wrong password, one prompt");
    exec.opt("NumberOfPasswordPrompts=1")
        .run()
        .expect_code(255, &c)
        .fails_with(&["password refused once"], &c);
    assert_eq!(questions(&marker).len(), 1, "{c}");
}

#[test]
fn nobody_is_asked_under_batch_mode_or_with_password_authentication_off() {
    if !can_run() {
        return;
    }
    let w = World::new(&["PasswordAuthentication yes"]);

    let (script, marker) = w.askpass(PASSWORD);
    let c = w.ctx("BatchMode=yes");
    // SkiffExec passes BatchMode=yes unless told otherwise.
    skiff_exec(&w.home, w.sshd.port(), w.acct.name(), None)
        .askpass(&script)
        .cmd("true")
        .run()
        .expect_code(255, &c)
        .fails_with(&["authentication failed", "password", "BatchMode"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("PasswordAuthentication=no");
    exec.opt("PasswordAuthentication=no")
        .run()
        .expect_code(255, &c)
        .fails_with(&["PasswordAuthentication is off"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("NumberOfPasswordPrompts=0");
    exec.opt("NumberOfPasswordPrompts=0")
        .run()
        .fails_with(&["password: NumberOfPasswordPrompts is 0"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");

    // Left out of PreferredAuthentications: not asked either.
    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("PreferredAuthentications=publickey");
    exec.opt("PreferredAuthentications=publickey")
        .run()
        .expect_code(255, &c)
        .fails_with(&["not in PreferredAuthentications"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");
}

#[test]
fn authentication_methods_publickey_then_password_needs_both() {
    if !can_run() {
        return;
    }
    let w = World::new(&[
        "PasswordAuthentication yes",
        "AuthenticationMethods publickey,password",
    ]);
    let name = w.acct.name();

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("key and password");
    exec.key(&w.fx.client_key.private)
        .run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(questions(&marker).len(), 1, "{c}");

    // The key alone is one step: a wrong password ends it.
    let (exec, marker) = w.exec(WRONG);
    let c = w.ctx("key and a wrong password");
    exec.key(&w.fx.client_key.private)
        .opt("NumberOfPasswordPrompts=2")
        .run()
        .expect_code(255, &c)
        .fails_with(
            &[
                "authentication failed (publickey,password)",
                "as one step but requires more",
                "password refused 2 times",
            ],
            &c,
        );
    assert_eq!(questions(&marker).len(), 2, "{c}");

    // No key the server takes: the password is never asked for, since
    // sshd wants a key first.
    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("password alone");
    exec.key(&w.fx.stranger_key.private)
        .run()
        .expect_code(255, &c)
        .fails_with(&["authentication failed (publickey)"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");
}

#[test]
fn preferred_authentications_puts_the_password_before_a_working_key() {
    if !can_run() {
        return;
    }
    let w = World::new(&["PasswordAuthentication yes"]);
    let name = w.acct.name();

    // Default order: the key logs in and nobody is asked.
    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("key first");
    exec.key(&w.fx.client_key.private)
        .run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("password first");
    exec.key(&w.fx.client_key.private)
        .opt("PreferredAuthentications=password,publickey")
        .run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(questions(&marker).len(), 1, "{c}");
    assert!(
        w.sshd
            .log()
            .contains(&format!("Accepted password for {name}")),
        "{c}"
    );
}

#[test]
fn keyboard_interactive_through_sshd_pam() {
    if !can_run() {
        return;
    }
    let w = World::new(&["UsePAM yes", "KbdInteractiveAuthentication yes"]);
    let name = w.acct.name();

    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("keyboard-interactive, right answer");
    exec.run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    // PAM's own prompt, as the server sent it.
    assert_eq!(questions(&marker), ["askpass called: Password: "], "{c}");
    assert!(
        w.sshd
            .log()
            .contains(&format!("Accepted keyboard-interactive/pam for {name}")),
        "{c}"
    );

    let (exec, marker) = w.exec(WRONG);
    let c = w.ctx("keyboard-interactive, wrong answer");
    exec.opt("NumberOfPasswordPrompts=2")
        .run()
        .expect_code(255, &c)
        .fails_with(
            &[
                "authentication failed (publickey,keyboard-interactive)",
                "keyboard-interactive refused 2 times",
            ],
            &c,
        );
    assert_eq!(questions(&marker).len(), 2, "{c}");

    // KbdInteractiveAuthentication no (or its old name): never asked.
    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("ChallengeResponseAuthentication=no");
    exec.opt("ChallengeResponseAuthentication=no")
        .run()
        .expect_code(255, &c)
        .fails_with(&["KbdInteractiveAuthentication is off"], &c);
    assert!(questions(&marker).is_empty(), "askpass was run\n{c}");
}

/// skiff's agent never asks (it runs under BatchMode): it hands the login
/// back, and the command connects directly and asks once.
#[test]
fn the_agent_hands_a_password_login_back_to_the_command() {
    if !can_run() {
        return;
    }
    let w = World::new(&["PasswordAuthentication yes"]);
    let name = w.acct.name();
    let ah = AgentHome::new();
    ah.home.trust(w.sshd.port(), &w.fx.host_key);
    let (script, marker) = w.askpass(PASSWORD);
    let c = w.ctx("through the agent");
    skiff_exec(&ah.home, w.sshd.port(), name, None)
        .env("SKIFF_AGENT", "on")
        .env("XDG_RUNTIME_DIR", ah.runtime.path())
        .env("XDG_STATE_HOME", ah.home.path().join("state"))
        .interactive()
        .askpass(&script)
        .cmd("id -un")
        .run()
        .expect_code(0, &c)
        .expect_stdout(&format!("{name}\n"), &c);
    assert_eq!(questions(&marker).len(), 1, "asked once\n{c}");
    assert!(
        !ah.agent_pids().is_empty(),
        "the command went to the agent first\n{c}"
    );
}

/// A fan-out (`skiff run` to 50 names) asks for the password once and
/// logs in to every host with it, as `pssh -A` does; with a wrong password
/// every host fails, and it is still asked only once.
#[test]
fn a_fan_out_asks_for_the_password_once() {
    if !can_run() {
        return;
    }
    // Fifty logins at once would meet sshd's MaxStartups early drop.
    fan_out_asks_once(&["PasswordAuthentication yes", "MaxStartups 200"]);
}

/// The same where the server asks through keyboard-interactive (PAM's one
/// hidden "Password:" prompt): the password asked once answers it.
#[test]
fn a_fan_out_answers_pams_password_prompt_with_the_password_asked_once() {
    if !can_run() {
        return;
    }
    fan_out_asks_once(&[
        "UsePAM yes",
        "KbdInteractiveAuthentication yes",
        "MaxStartups 200",
    ]);
}

fn fan_out_asks_once(sshd_config: &[&str]) {
    let w = World::new(sshd_config);
    let config = w.home.path().join("ssh_config");
    write_file(
        &config,
        format!(
            "Host pw*\n  HostName 127.0.0.1\n  Port {}\n  User {}\n",
            w.sshd.port(),
            w.acct.name()
        ),
        0o644,
    );
    let run = |answer: &str| {
        let (script, marker) = w.askpass(answer);
        let out = Run::new(skiff_bin())
            .env("SKIFF_AGENT", "off")
            .env_remove("SSH_AUTH_SOCK")
            .env("HOME", w.home.path())
            .env("XDG_CONFIG_HOME", w.home.path().join("config"))
            .env("SSH_ASKPASS", &script)
            .env("SSH_ASKPASS_REQUIRE", "force")
            .arg("run")
            .arg("-F")
            .arg(&config)
            .args(["-j", "16", "pw[1-50]", "id", "-un"])
            .timeout(std::time::Duration::from_secs(180))
            .run();
        (out, questions(&marker))
    };
    let c = w.ctx("skiff run pw[1-50], the right password");
    let (out, asked) = run(PASSWORD);
    assert_eq!(out.code, 0, "{c}\n{out}");
    let logged_in = out
        .stdout_str()
        .lines()
        .filter(|l| l.ends_with(&format!(": {}", w.acct.name())))
        .count();
    assert_eq!(logged_in, 50, "{c}\n{out}");
    assert!(out.stderr.contains("ok (50): pw[1-50]"), "{c}\n{out}");
    assert_eq!(asked.len(), 1, "{c}: asked {asked:?}");

    let c = w.ctx("skiff run pw[1-50], a wrong password");
    let (out, asked) = run(WRONG);
    assert_ne!(out.code, 0, "{c}\n{out}");
    assert!(
        out.stderr
            .contains("the password given for every host was refused")
            || out.stderr.contains("keyboard-interactive refused once"),
        "{c}\n{out}"
    );
    assert_eq!(asked.len(), 1, "{c}: asked {asked:?}");
}

/// A server's keyboard-interactive name, instruction and prompts reach the
/// person escaped: a hostile server (`tests/peers/hostile_kbd.rs`, run as
/// the ProxyCommand) cannot move the cursor, erase lines or write the
/// clipboard through them. Needs neither root nor sshd.
#[test]
fn a_servers_questions_are_shown_escaped() {
    if !require_tool("ssh-keygen", "openssh-client") {
        return;
    }
    let home = ClientHome::new();
    let dir = tempdir();
    let host_key = keygen(dir.path(), "host", KeyType::Ed25519, None);
    let port = 2222;
    home.trust(port, &host_key);
    let peer = test_peer(env!("CARGO_MANIFEST_DIR"), "skiff", "hostile_kbd");
    let marker = dir.path().join("questions");
    // printf, not echo: sh's echo would turn the escaped `\r` back into a
    // carriage return in the log.
    let script = dir.path().join("askpass.sh");
    write_file(
        &script,
        format!(
            "#!/bin/sh\nprintf 'askpass called: %s\\n' \"$*\" >> '{}'\necho answer\n",
            marker.display()
        ),
        0o755,
    );
    let out = skiff_exec(&home, port, "someone", None)
        .interactive()
        .askpass(&script)
        .opt(&format!(
            "ProxyCommand={} {}",
            peer.display(),
            host_key.private.display()
        ))
        .opt("NumberOfPasswordPrompts=1")
        .cmd("true")
        .run();
    let c = "hostile keyboard-interactive server";
    out.expect_code(255, c);
    assert!(
        out.stderr.contains("keyboard-interactive refused once"),
        "{c}\n{out}"
    );
    assert!(out.stderr.contains("Hostile\\u{1b}[1A"), "{c}\n{out}");
    assert!(
        out.stderr
            .contains("Read this\\u{1b}]52;c;aGk=\\u{7} now\\u{1b}[2K\\rfake line"),
        "{c}\n{out}"
    );
    for raw in ['\u{1b}', '\u{7}', '\r'] {
        assert!(!out.stderr.contains(raw), "{c}: {raw:?} shown\n{out}");
    }
    // The prompt as the askpass program got it, escaped.
    let asked = questions(&marker);
    assert_eq!(asked, ["askpass called: Code\\u{1b}[2K\\r: "], "{c}\n{out}");
    let log = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(!log.contains(['\u{1b}', '\r']), "{c}: {log:?}");
}

/// A server whose host key is not the known one, let through by
/// `StrictHostKeyChecking=no`, is never told a password (as in ssh): skiff
/// does not ask for one, and the login fails saying why.
#[test]
fn a_changed_host_key_let_through_by_no_is_never_told_a_password() {
    if !can_run() {
        return;
    }
    let mut w = World::new(&["PasswordAuthentication yes"]);
    let rotated = w.fx.keygen("host_rotated", KeyType::Ed25519, None);
    w.sshd.restart_with_host_key(&rotated);
    let (exec, marker) = w.exec(PASSWORD);
    let c = w.ctx("a changed host key, StrictHostKeyChecking=no, a password login");
    let out = exec.opt("StrictHostKeyChecking=no").run();
    out.expect_code(255, &c);
    assert!(out.stdout.is_empty(), "{c}\n{out}");
    assert!(
        out.stderr
            .contains("password: not sent to a host whose key is not the one known for it"),
        "{c}: says why\n{out}"
    );
    assert!(
        out.stderr
            .contains("beware: the server's host key is not the one known for it"),
        "{c}: says the key changed\n{out}"
    );
    assert_eq!(questions(&marker), Vec::<String>::new(), "{c}: never asked");
    assert!(
        !w.sshd.log().contains("Accepted password"),
        "{c}: no password reached the server"
    );
}
