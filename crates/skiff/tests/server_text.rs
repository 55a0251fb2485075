//! Text a server chooses never reaches the terminal raw: a pre-login
//! banner, and a file name in a `skiff cp` failure, are shown with their
//! escape sequences and carriage returns escaped (`\u{1b}[2J`, `\r`), by
//! `skiff exec`, `skiff run` and `skiff cp`, directly and through the agent,
//! over the data plane and over SFTP. Real skiffd, real sockets.

use std::fs;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// What a terminal would obey, as the tests write it.
const CLEAR: &str = "\x1b[2J";
/// The same, as skiff must show it.
const CLEAR_SHOWN: &str = "\\u{1b}[2J";

/// Fails unless `stderr` holds no escape byte and no carriage return, and
/// does hold `shown`.
fn shown_escaped(stderr: &str, shown: &str, c: &str) {
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\r'),
        "{c}: control characters reach the terminal:\n{stderr:?}"
    );
    assert!(
        stderr.contains(shown),
        "{c}: expected {shown:?} on stderr:\n{stderr:?}"
    );
}

fn banner_skiffd(fx: &Fixture) -> Skiffd {
    let banner = fx.path().join("banner");
    write_file(
        &banner,
        format!("Authorized use only\n{CLEAR}cleared?\rover\n"),
        0o644,
    );
    Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .config(&format!("Banner {}\n", banner.display())),
    )
}

/// A banner with an escape sequence and a carriage return is shown with
/// both escaped and its line breaks kept: by `skiff exec` directly and
/// through the agent, and by `skiff run` (as a host's notice) directly and
/// through the agent.
#[test]
fn a_banners_control_characters_are_shown_escaped() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = banner_skiffd(&fx);
    let shown = format!("Authorized use only\n{CLEAR_SHOWN}cleared?\\rover");

    let home = ClientHome::new();
    home.trust(d.port(), &fx.host_key);
    let out = skiff_exec(&home, d.port(), user(), Some(&fx.client_key))
        .cmd("echo ran")
        .run();
    let c = ctx(&d, "skiff exec");
    out.expect_code(0, &c).expect_stdout("ran\n", &c);
    shown_escaped(&out.stderr, &shown, &c);

    let ah = AgentHome::new();
    ah.home.trust(d.port(), &fx.host_key);
    let out = ah.exec(d.port(), &fx.client_key).cmd("echo ran").run();
    let c = ctx(&d, "skiff exec through the agent");
    out.expect_code(0, &c).expect_stdout("ran\n", &c);
    shown_escaped(&out.stderr, &shown, &c);

    // skiff run: the banner is a notice about the host.
    let config = home.path().join("run_config");
    write_file(
        &config,
        format!(
            "Host banner1\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  BatchMode yes\n",
            d.port(),
            user(),
            fx.client_key.private.display()
        ),
        0o644,
    );
    for agent in [false, true] {
        let runtime = if agent {
            ah.runtime.path()
        } else {
            home.path()
        };
        let run_home = if agent { ah.home.path() } else { home.path() };
        if agent {
            ah.home.trust(d.port(), &fx.host_key);
        }
        let out = Run::new(skiff_bin())
            .env("HOME", run_home)
            .env("SKIFF_AGENT", if agent { "on" } else { "off" })
            .env("XDG_RUNTIME_DIR", runtime)
            .env("XDG_STATE_HOME", run_home.join("state"))
            .env_remove("SSH_AUTH_SOCK")
            .args(["run", "-q", "-F"])
            .arg(&config)
            .args(["banner1", "echo ran"])
            .run();
        let c = ctx(&d, &format!("skiff run, through the agent: {agent}"));
        out.expect_code(0, &c).expect_stdout("banner1: ran\n", &c);
        // (Through the agent each line of a notice gets the prefix.)
        shown_escaped(&out.stderr, "banner1: Authorized use only\n", &c);
        shown_escaped(&out.stderr, &format!("{CLEAR_SHOWN}cleared?\\rover\n"), &c);
    }
}

/// A file name with an escape sequence and a carriage return in a failed
/// `skiff cp` is shown escaped: a missing source named by the server's
/// answer, and (as root, where the server side runs as the test account)
/// a file the server listed in a tree and could not read. Over the data
/// plane and over SFTP (`DataPlane no`), directly and through the agent.
#[test]
fn file_names_in_cp_failures_are_shown_escaped() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let remote = account_dir();
    let tree = remote.path().join("tree");
    fs::create_dir(&tree).unwrap();
    write_file(&tree.join("fine"), "fine\n", 0o644);
    let unreadable = format!("locked-{CLEAR}\r");
    write_file(&tree.join(&unreadable), "secret\n", 0o000);
    if is_root() {
        let acct = account();
        for p in [tree.clone(), tree.join("fine"), tree.join(&unreadable)] {
            std::os::unix::fs::chown(&p, Some(acct.uid), Some(acct.gid)).unwrap();
        }
    }
    let missing = format!("{}/no-such-{CLEAR}file\r", remote.path().display());

    let mut base = transfer_subsystem_config().unwrap_or_default();
    let plane_config = base.clone();
    base.push_str("DataPlane no\n");
    for (config, over) in [(plane_config, "data plane"), (base, "SFTP")] {
        let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
        if !config.is_empty() {
            opts = opts.config(&config);
        }
        let d = Skiffd::start_with(opts);
        let ah = AgentHome::new();
        for agent in [false, true] {
            let c = format!("{over}, through the agent: {agent}");
            let runtime = agent.then(|| ah.runtime.path());
            let home = ah.home.path();
            let local = tempdir();
            let source = format!("{}@127.0.0.1:{missing}", user());
            let out = skiff_cp_in(
                home,
                runtime,
                d.port(),
                &fx.client_key,
                &[&source, &local.path().display().to_string()],
            );
            let cc = ctx(&d, &format!("{c}: a missing source"));
            out.expect_code(1, &cc);
            shown_escaped(&out.stderr, &format!("no-such-{CLEAR_SHOWN}file\\r"), &cc);

            if is_root() {
                let source = format!("{}@127.0.0.1:{}", user(), tree.display());
                let out = skiff_cp_in(
                    home,
                    runtime,
                    d.port(),
                    &fx.client_key,
                    &["-r", &source, &local.path().display().to_string()],
                );
                let cc = ctx(&d, &format!("{c}: an unreadable file in a tree"));
                out.expect_code(1, &cc);
                shown_escaped(&out.stderr, &format!("locked-{CLEAR_SHOWN}\\r"), &cc);
                assert_eq!(
                    fs::read_to_string(local.path().join("tree/fine")).unwrap_or_default(),
                    "fine\n",
                    "{cc}: the rest is copied\n{out}"
                );
            }
        }
        let log = d.log();
        let wanted = if over == "SFTP" {
            "subsystem sftp"
        } else {
            "data plane:"
        };
        assert!(log.contains(wanted), "{}", ctx(&d, over));
    }
}
