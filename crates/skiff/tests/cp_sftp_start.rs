//! How `skiff cp` starts an SFTP session with a stock OpenSSH sshd: the
//! `limits@openssh.com` question goes out right behind `INIT`, in the same
//! flight, not one round trip later once `VERSION` has come back.
//!
//! The sshd's sftp subsystem is OpenSSH's `sftp-server` behind a small
//! perl filter on its input. The filter holds the client's first packet
//! (`INIT`) and looks whether a second one arrives while it holds it
//! (within 10 s): only a client that sent it without waiting for
//! `VERSION` can have sent it, since `VERSION` cannot come before `INIT`
//! has reached the server. It writes down `early` or `late`, then passes
//! everything on, so the copy itself goes on either way. And the sshd is
//! not asked for the skiff data plane, which only skiffd serves.

use std::fs;
use std::path::{Path, PathBuf};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

/// How long the filter holds `INIT` waiting for a second packet.
const HOLD_SECS: u32 = 10;

struct Env {
    fx: Fixture,
    sshd: Sshd,
    home: ClientHome,
    /// The filter's verdicts, one line per SFTP session.
    verdicts: PathBuf,
    /// Holds the wrapper and `verdicts`.
    _wrapping: TempDir,
}

impl Env {
    fn new() -> Option<Env> {
        if !require_openssh() || !require_tool("perl", "perl-base") {
            return None;
        }
        let scripted = sshd_with_sftp_script(
            |dir, real| {
                let verdicts = dir.join("verdicts");
                write_file(&verdicts, "", 0o666);
                // Reads exactly n bytes of stdin (or dies at its end).
                let filter = format!(
                    r#"sub rd {{ my ($n) = @_; my $b = ""; while (length($b) < $n) {{ my $r = sysread(STDIN, $b, $n - length($b), length($b)); exit 0 unless $r; }} return $b; }}
my $len = rd(4); my $body = rd(unpack("N", $len));
my $rin = ""; vec($rin, fileno(STDIN), 1) = 1;
my $ready = select(my $rout = $rin, undef, undef, {HOLD_SECS});
open(my $log, ">>", "{verdicts}") or die; print $log ($ready > 0 ? "early\n" : "late\n"); close $log;
syswrite(STDOUT, $len . $body) or exit 0;
while (sysread(STDIN, my $b, 65536)) {{ syswrite(STDOUT, $b) or exit 0; }}"#,
                    verdicts = verdicts.display()
                );
                let filter_file = dir.join("hold-init.pl");
                write_file(&filter_file, filter, 0o644);
                format!("perl '{}' | '{real}' \"$@\"\n", filter_file.display())
            },
            &[],
        )?;
        Some(Env {
            verdicts: scripted.dir.path().join("verdicts"),
            fx: scripted.fx,
            sshd: scripted.sshd,
            home: scripted.home,
            _wrapping: scripted.dir,
        })
    }

    /// `skiff cp` to or from this sshd: through the agent that lives in
    /// `agent` (spawned by the first such copy), else `--no-agent`.
    fn cp(&self, agent: Option<&AgentHome>, args: &[&str]) -> CmdOutput {
        let run = match agent {
            Some(ah) => Run::new(skiff_bin())
                .env("SKIFF_AGENT", "on")
                .env("XDG_RUNTIME_DIR", ah.runtime.path())
                .env("XDG_STATE_HOME", ah.home.path().join("state")),
            None => Run::new(skiff_bin()).env("SKIFF_AGENT", "off"),
        };
        run.env_remove("SSH_AUTH_SOCK")
            .env("HOME", self.home.path())
            .arg("cp")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
            .arg(self.sshd.port().to_string())
            .arg("-i")
            .arg(&self.fx.client_key.private)
            .args(args)
            .timeout(BULK_TIMEOUT)
            .run()
    }

    fn verdicts(&self) -> Vec<String> {
        fs::read_to_string(&self.verdicts)
            .expect("read the verdicts")
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Uploads a small file holding `text` to the sshd and downloads it back,
/// through the agent in `agent` or `--no-agent`: each copy's `limits`
/// question came with `INIT`, and the sshd was not asked for the data
/// plane.
fn upload_and_back(env: &Env, agent: Option<&AgentHome>, text: &str) {
    let local = tempdir();
    let remote = account_dir();
    let src = local.path().join("small.txt");
    write_file(&src, text, 0o644);
    let how = if agent.is_some() {
        "through the agent"
    } else {
        "directly"
    };

    let c = ctx(&env.sshd, &format!("upload of one small file {how}"));
    env.cp(
        agent,
        &[
            s(&src),
            &format!("{}@127.0.0.1:{}/", user(), remote.path().display()),
        ],
    )
    .expect_code(0, &c);
    assert_eq!(
        fs::read_to_string(remote.path().join("small.txt")).expect("read the upload"),
        text,
        "{c}"
    );
    assert_eq!(env.verdicts(), ["early"], "{c}");
    // A stock sshd has no skiff data plane: it is not asked for one (a
    // channel and a refused request, two round trips). Its log names the
    // subsystems it starts and those it refuses.
    let log = env.sshd.log();
    assert!(log.contains("subsystem 'sftp'"), "{c}\n{log}");
    assert!(!log.contains("transfer@skiff"), "{c}\n{log}");

    let back = local.path().join("back.txt");
    let c = ctx(&env.sshd, &format!("download of the same file {how}"));
    env.cp(
        agent,
        &[
            &format!("{}@127.0.0.1:{}/small.txt", user(), remote.path().display()),
            s(&back),
        ],
    )
    .expect_code(0, &c);
    assert_eq!(
        fs::read_to_string(&back).expect("read the download"),
        text,
        "{c}"
    );
    assert_eq!(env.verdicts(), ["early", "early"], "{c}");
}

#[test]
fn a_copy_with_sshd_asks_limits_with_init_and_no_data_plane() {
    let Some(env) = Env::new() else { return };
    upload_and_back(&env, None, "one flight\n");
}

/// Through the agent, sshd is not asked for the data plane either (the
/// agent refuses it on a connection to a server that is not a skiffd,
/// before opening a channel), and the limits question goes out with
/// `INIT` as on a direct copy: the agent says what software the server
/// runs when it hands the channel over.
#[test]
fn through_the_agent_limits_go_with_init_and_sshd_is_not_asked_for_the_data_plane() {
    let Some(env) = Env::new() else { return };
    let ah = AgentHome::new();
    upload_and_back(&env, Some(&ah), "through the agent\n");
    assert_eq!(ah.agent_pids().len(), 1, "the agent carried both copies");
}
