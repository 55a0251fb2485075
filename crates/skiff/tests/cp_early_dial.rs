//! `skiff cp` dials a skiffd's data-plane streams while its request is on
//! the way (docs/data-plane.md, section 2), so the TCP handshake's round
//! trip overlaps the request's: every stream dialed early is used (none
//! left for skiffd to close unused), the bytes arrive intact in both
//! directions, and a server that is not a skiffd (a stock sshd, reached
//! over SFTP) is never sent a data-plane stream at all.
//!
//! Run as root (as CI does), the remote side is the `skiff-test` account.

use std::path::Path;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const MIB: usize = 1 << 20;

/// What the client says about a stream it dialed before the tokens came
/// (its debug log).
const DIALED_EARLY: &str = "dialed while the request was on its way";

/// What skiffd logs for a data-plane connection that never gave a token.
const NO_TOKEN: [&str; 2] = [
    "data-plane connection closed before its token",
    "data-plane connection closed: no token",
];

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// `skiff cp` with the engine's debug log on stderr.
fn cp_logged(port: u16, key: &Key, args: &[&str]) -> CmdOutput {
    skiff_cp_env(port, key, &[("SKIFF_LOG", "skiff_engine=debug")], args)
}

/// skiffd with the transfer subsystem runnable by the test account.
fn skiffd(fx: &Fixture) -> Skiffd {
    let mut opts = SkiffdOptions::new(&fx.host_key, &fx.authorized_keys);
    if let Some(config) = transfer_subsystem_config() {
        opts = opts.config(&config);
    }
    Skiffd::start_with(opts)
}

#[test]
fn every_stream_dialed_early_carries_the_copy_both_ways() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let local = tempdir();
    let src = local.path().join("payload");
    let sum = random_file(&src, 24 * MIB + 5);
    let rdir = account_dir();
    for streams in ["1", "4"] {
        let c = format!("{streams} streams");
        let up = cp_logged(
            d.port(),
            &fx.client_key,
            &[
                "--streams",
                streams,
                src.to_str().unwrap(),
                &remote(rdir.path()),
            ],
        );
        up.expect_code(0, &ctx(&d, &format!("{c}: upload")));
        let landed = rdir.path().join("payload");
        assert_eq!(sha256(&landed), sum, "{c}: the upload differs");
        assert_eq!(
            up.stderr.matches(DIALED_EARLY).count(),
            streams.parse::<usize>().unwrap(),
            "{c}: every upload stream should go out on a connection dialed early\n{}",
            up.stderr
        );

        let back = tempdir();
        let down = cp_logged(
            d.port(),
            &fx.client_key,
            &[
                "--streams",
                streams,
                &remote(&landed),
                back.path().to_str().unwrap(),
            ],
        );
        down.expect_code(0, &ctx(&d, &format!("{c}: download")));
        assert_eq!(
            sha256(&back.path().join("payload")),
            sum,
            "{c}: the download differs"
        );
        assert_eq!(
            down.stderr.matches(DIALED_EARLY).count(),
            streams.parse::<usize>().unwrap(),
            "{c}: every download stream should come on a connection dialed early\n{}",
            down.stderr
        );
    }
    let log = d.log();
    for line in NO_TOKEN {
        assert!(
            !log.contains(line),
            "{}",
            ctx(&d, "a stream dialed early was left without its token")
        );
    }
}

#[test]
fn a_server_that_is_not_skiffd_is_sent_no_stream() {
    let Some((fx, sshd)) = sshd_setup(&["Subsystem sftp internal-sftp"]) else {
        return;
    };
    let local = tempdir();
    let src = local.path().join("payload");
    let sum = random_file(&src, 3 * MIB);
    let rdir = account_dir();
    // Only what the copy makes sshd log (not the harness's probe at start).
    let before = sshd.log().len();
    cp_logged(
        sshd.port(),
        &fx.client_key,
        &[src.to_str().unwrap(), &remote(rdir.path())],
    )
    .expect_code(0, &ctx(&sshd, "upload to sshd"));
    assert_eq!(sha256(&rdir.path().join("payload")), sum, "upload differs");
    let log = sshd.log()[before..].to_string();
    // sshd (LogLevel VERBOSE) logs every connection it accepts, and a
    // data-plane magic as a bad identification line.
    assert_eq!(
        log.matches("Connection from 127.0.0.1").count(),
        1,
        "{}",
        ctx(&sshd, "skiff cp should make one connection to sshd")
    );
    assert!(
        !log.contains("banner exchange") && !log.contains("SKIFFDP"),
        "{}",
        ctx(&sshd, "sshd was sent something that is not SSH")
    );
}

#[test]
fn a_copy_through_the_agent_dials_early_too() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let home = AgentHome::new();
    write_file(
        &home.home.ssh_dir().join("config"),
        format!(
            "Host target\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  StrictHostKeyChecking accept-new\n",
            d.port(),
            user(),
            fx.client_key.private.display()
        ),
        0o600,
    );
    let local = tempdir();
    let src = local.path().join("payload");
    let sum = random_file(&src, 6 * MIB + 3);
    let rdir = account_dir();
    let target = format!("target:{}", rdir.path().display());
    // The first copy starts the agent and its connection; the second finds
    // both warm. Both go through the agent.
    for round in ["cold agent", "warm agent"] {
        let out = Run::new(skiff_bin())
            .env("HOME", home.home.path())
            .env_remove("SSH_AUTH_SOCK")
            .env("SKIFF_AGENT", "on")
            .env("SKIFF_LOG", "skiff_engine=debug")
            .env("XDG_RUNTIME_DIR", home.runtime.path())
            .env("XDG_STATE_HOME", home.home.path().join("state"))
            .args(["cp", "--streams", "3"])
            .arg(&src)
            .arg(&target)
            .timeout(BULK_TIMEOUT)
            .run();
        out.expect_code(0, &ctx(&d, round));
        assert_eq!(
            sha256(&rdir.path().join("payload")),
            sum,
            "{round}: differs"
        );
        assert_eq!(
            out.stderr.matches(DIALED_EARLY).count(),
            3,
            "{round}: every stream should go out on a connection dialed early\n{}",
            out.stderr
        );
    }
    // One login for both: the agent's connection carried them.
    assert_eq!(
        d.log().matches("Accepted publickey").count(),
        1,
        "{}",
        ctx(
            &d,
            "both copies should have gone through the agent's connection"
        )
    );
}
