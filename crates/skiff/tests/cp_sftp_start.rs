//! How `skiff cp` starts an SFTP session with a stock OpenSSH sshd: the
//! `limits@openssh.com` question, and the copy's first `stat`, go out
//! right behind `INIT`, in the same flight, not one round trip later once
//! `VERSION` has come back; and an upload into a `dir/` target asks for its
//! first temporary right behind the target's `stat`, not once the answer
//! has come.
//!
//! The sshd's sftp subsystem is OpenSSH's `sftp-server` behind a small
//! perl filter on its input. The filter passes packets on until the first
//! of one type (`INIT`, or `STAT`), holds it and looks whether another one
//! (of a given type, or any) arrives while it holds it (within 10 s): only
//! a client that sent it without waiting for the answer can have sent it,
//! since the server cannot answer a packet that has not reached it. It
//! writes down `early` or `late`, then passes everything on in order, so
//! the copy itself goes on either way. And the sshd is not asked for the
//! skiff data plane, which only skiffd serves.

use std::fs;
use std::path::{Path, PathBuf};

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

/// How long the filter holds a packet waiting for another.
const HOLD_SECS: u32 = 10;

/// SFTP packet types the filter can hold.
const SSH_FXP_INIT: u8 = 1;
const SSH_FXP_STAT: u8 = 17;

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
    /// An sshd whose filter holds the first packet of type `hold` and
    /// looks for any other.
    fn holding(hold: u8) -> Option<Env> {
        Self::holding_until(hold, None)
    }

    /// An sshd whose filter holds the first packet of type `hold` and looks
    /// for one of type `want` (any type: `None`) behind it.
    fn holding_until(hold: u8, want: Option<u8>) -> Option<Env> {
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
my ($len, $body);
while (1) {{ $len = rd(4); $body = rd(unpack("N", $len)); last if ord($body) == {hold}; syswrite(STDOUT, $len . $body) or exit 0; }}
my $rin = ""; vec($rin, fileno(STDIN), 1) = 1;
my ($verdict, @later, $left) = ("late");
my $until = time + {HOLD_SECS};
while (($left = $until - time) > 0) {{ my $ready = select(my $rout = $rin, undef, undef, $left); last unless $ready > 0; my $l = rd(4); my $b = rd(unpack("N", $l)); push @later, $l . $b; if ({want} < 0 || ord($b) == {want}) {{ $verdict = "early"; last; }} }}
open(my $log, ">>", "{verdicts}") or die; print $log "$verdict\n"; close $log;
syswrite(STDOUT, $len . $body) or exit 0;
for my $p (@later) {{ syswrite(STDOUT, $p) or exit 0; }}
while (sysread(STDIN, my $b, 65536)) {{ syswrite(STDOUT, $b) or exit 0; }}"#,
                    verdicts = verdicts.display(),
                    want = want.map_or(-1, i32::from),
                );
                let filter_file = dir.join("hold.pl");
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

/// A directory holding `small.txt`, which holds `text`.
fn small_file(text: &str) -> (TempDir, PathBuf) {
    let local = tempdir();
    let src = local.path().join("small.txt");
    write_file(&src, text, 0o644);
    (local, src)
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|d| {
            d.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Uploads `src` into `dir/` on the sshd, and checks it arrived.
fn upload_into(env: &Env, agent: Option<&AgentHome>, src: &Path, dir: &Path, c: &str) {
    env.cp(
        agent,
        &[s(src), &format!("{}@127.0.0.1:{}/", user(), dir.display())],
    )
    .expect_code(0, c);
    let name = src.file_name().expect("a file name");
    assert_eq!(
        fs::read(dir.join(name)).expect("read the upload"),
        fs::read(src).expect("read the source"),
        "{c}"
    );
}

/// Uploads a small file holding `text` to the sshd and downloads it back,
/// through the agent in `agent` or `--no-agent`: each copy's `limits`
/// question came with `INIT`, and the sshd was not asked for the data
/// plane.
fn upload_and_back(env: &Env, agent: Option<&AgentHome>, text: &str) {
    let (local, src) = small_file(text);
    let remote = account_dir();
    let how = if agent.is_some() {
        "through the agent"
    } else {
        "directly"
    };

    let c = ctx(&env.sshd, &format!("upload of one small file {how}"));
    upload_into(env, agent, &src, remote.path(), &c);
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
    let Some(env) = Env::holding(SSH_FXP_INIT) else {
        return;
    };
    upload_and_back(&env, None, "one flight\n");
}

/// Through the agent, sshd is not asked for the data plane either (the
/// agent refuses it on a connection to a server that is not a skiffd,
/// before opening a channel), and the limits question goes out with
/// `INIT` as on a direct copy: the agent says what software the server
/// runs when it hands the channel over.
#[test]
fn through_the_agent_limits_go_with_init_and_sshd_is_not_asked_for_the_data_plane() {
    let Some(env) = Env::holding(SSH_FXP_INIT) else {
        return;
    };
    let ah = AgentHome::new();
    upload_and_back(&env, Some(&ah), "through the agent\n");
    assert_eq!(ah.agent_pids().len(), 1, "the agent carried both copies");
}

/// The copy's first request, the `stat` of the upload's target or of the
/// download's source, goes out behind `INIT` without waiting for
/// `VERSION` (OpenSSH's sftp-server reads requests in order, so `INIT` is
/// read first), directly and through the agent.
#[test]
fn the_first_stat_goes_out_with_init() {
    let Some(env) = Env::holding_until(SSH_FXP_INIT, Some(SSH_FXP_STAT)) else {
        return;
    };
    let ah = AgentHome::new();
    let mut expected = Vec::new();
    for agent in [None, Some(&ah)] {
        let (local, src) = small_file("stat with init\n");
        let remote = account_dir();
        let c = ctx(&env.sshd, &format!("upload, agent: {}", agent.is_some()));
        let target = format!("{}@127.0.0.1:{}/named.txt", user(), remote.path().display());
        env.cp(agent, &[s(&src), &target]).expect_code(0, &c);
        expected.push("early");
        assert_eq!(env.verdicts(), expected, "{c}");
        let back = local.path().join("back.txt");
        let c = ctx(&env.sshd, &format!("download, agent: {}", agent.is_some()));
        env.cp(agent, &[&target, s(&back)]).expect_code(0, &c);
        assert_eq!(
            fs::read_to_string(&back).expect("read the download"),
            "stat with init\n",
            "{c}"
        );
        expected.push("early");
        assert_eq!(env.verdicts(), expected, "{c}");
    }
}

/// An upload into `dir/` (which can only be a directory) asks for the
/// temporary inside it right behind the target's `stat`.
#[test]
fn an_upload_into_dir_slash_opens_its_temporary_with_the_stat() {
    let Some(env) = Env::holding(SSH_FXP_STAT) else {
        return;
    };
    let (_local, src) = small_file("with the stat\n");
    let remote = account_dir();
    let c = ctx(&env.sshd, "upload into dir/");
    upload_into(&env, None, &src, remote.path(), &c);
    assert_eq!(env.verdicts(), ["early"], "{c}");
}

/// One file to a name: its temporary is asked for beside the name, right
/// behind the name's `stat`. When the name turns out to be a directory,
/// that temporary is removed and the file goes into the directory.
#[test]
fn one_file_to_a_name_opens_its_temporary_with_the_stat() {
    let Some(env) = Env::holding(SSH_FXP_STAT) else {
        return;
    };
    let (_local, src) = small_file("named\n");
    let remote = account_dir();
    let c = ctx(&env.sshd, "upload to a new name");
    env.cp(
        None,
        &[
            s(&src),
            &format!("{}@127.0.0.1:{}/named.txt", user(), remote.path().display()),
        ],
    )
    .expect_code(0, &c);
    assert_eq!(
        fs::read_to_string(remote.path().join("named.txt")).expect("read the upload"),
        "named\n",
        "{c}"
    );
    assert_eq!(env.verdicts(), ["early"], "{c}");

    let inner = remote.path().join("inner");
    fs::create_dir(&inner).expect("make inner");
    fs::set_permissions(&inner, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod inner");
    let c = ctx(&env.sshd, "upload to a name that is a directory");
    env.cp(
        None,
        &[
            s(&src),
            &format!("{}@127.0.0.1:{}", user(), inner.display()),
        ],
    )
    .expect_code(0, &c);
    assert_eq!(
        fs::read_to_string(inner.join("small.txt")).expect("read the upload"),
        "named\n",
        "{c}"
    );
    assert_eq!(env.verdicts(), ["early", "early"], "{c}");
    let left = names_in(remote.path());
    assert_eq!(left, ["inner", "named.txt"], "{c}: no temporary left");
}

/// A `dir/` target that is a file, or nothing, fails as it did when the
/// copy looked before it leapt, and leaves nothing behind; the temporary
/// was still asked for with the `stat`. (sftp-server cannot `stat`
/// `file/`, so both say the directory is not there.)
#[test]
fn an_upload_into_a_slash_target_that_is_no_directory_fails_as_before() {
    let Some(env) = Env::holding(SSH_FXP_STAT) else {
        return;
    };
    let (_local, src) = small_file("nowhere\n");
    let remote = account_dir();
    let plain = remote.path().join("plain");
    write_file(&plain, "stays\n", 0o644);
    for (target, says) in [
        ("plain/", "No such directory"),
        ("missing/", "No such directory"),
    ] {
        let c = ctx(&env.sshd, &format!("upload into {target}"));
        let out = env.cp(
            None,
            &[
                s(&src),
                &format!("{}@127.0.0.1:{}/{target}", user(), remote.path().display()),
            ],
        );
        out.expect_code(1, &c);
        assert!(out.stderr.contains(says), "{c}: says {says:?}\n{out}");
        assert_eq!(
            out.stderr.lines().filter(|l| !l.trim().is_empty()).count(),
            1,
            "{c}: one line, the target's\n{out}"
        );
        assert_eq!(
            env.verdicts().last().map(String::as_str),
            Some("early"),
            "{c}"
        );
        let left = names_in(remote.path());
        assert_eq!(left, ["plain"], "{c}: nothing else there");
        assert_eq!(
            fs::read_to_string(&plain).expect("read plain"),
            "stays\n",
            "{c}"
        );
    }
}
