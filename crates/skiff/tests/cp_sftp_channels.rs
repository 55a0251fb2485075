//! `skiff cp` uploads to a real OpenSSH `sshd` spread over several SFTP
//! channels of one connection (issue 25).
//!
//! Each test's sshd runs `Subsystem sftp WRAPPER`, a script that appends
//! a line to a counter file and then becomes the real `sftp-server`: the
//! count is the number of SFTP channels the copy opened. Server and client
//! share this machine, so the remote files are checked on disk: contents
//! (sha256), and that no `.skiff-` temporary is left.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;
use tempfile::TempDir;

const MIB: usize = 1024 * 1024;

/// A private sshd whose sftp subsystem counts its starts, a client HOME
/// that trusts it, and a scratch directory.
struct Env {
    fx: Fixture,
    sshd: Sshd,
    home: ClientHome,
    root: TempDir,
    counter: PathBuf,
    /// Holds the wrapper script and the counter.
    _wrapping: TempDir,
}

impl Env {
    /// With `extra` sshd_config lines besides the counting subsystem.
    fn new(extra: &[&str]) -> Option<Env> {
        let scripted = sshd_with_sftp_script(
            |dir, real| {
                let counter = dir.join("count");
                write_file(&counter, "", 0o666);
                format!(
                    "echo started >> '{}'\nexec '{real}' \"$@\"\n",
                    counter.display()
                )
            },
            extra,
        )?;
        Some(Env {
            counter: scripted.dir.path().join("count"),
            fx: scripted.fx,
            sshd: scripted.sshd,
            home: scripted.home,
            root: tempdir(),
            _wrapping: scripted.dir,
        })
    }

    /// SFTP channels started so far.
    fn channels(&self) -> usize {
        fs::read_to_string(&self.counter)
            .expect("read the counter")
            .lines()
            .count()
    }

    /// Forgets the channels counted so far.
    fn reset_count(&self) {
        fs::write(&self.counter, "").expect("reset the counter");
    }

    fn local_dir(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        fs::create_dir_all(&p).expect("mkdir local");
        p
    }

    /// A fresh directory the remote account owns.
    fn remote_dir(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        fs::create_dir_all(&p).expect("mkdir remote");
        let acct = account();
        std::os::unix::fs::chown(&p, Some(acct.uid), Some(acct.gid)).expect("chown remote dir");
        p
    }

    fn remote(&self, path: &Path) -> String {
        format!("{}@127.0.0.1:{}", user(), path.display())
    }

    /// `skiff cp` without the agent.
    fn cp(&self, args: &[&str]) -> CmdOutput {
        self.skiff_cp(Run::new(skiff_bin()).env("SKIFF_AGENT", "off"), args)
    }

    fn skiff_cp(&self, run: Run, args: &[&str]) -> CmdOutput {
        run.env_remove("SSH_AUTH_SOCK")
            .env_remove("SSH_ASKPASS")
            .env_remove("DISPLAY")
            .env("HOME", self.home.path())
            .arg("cp")
            .args(["-q", "-F", "/dev/null", "-o", "BatchMode=yes", "-P"])
            .arg(self.sshd.port().to_string())
            .arg("-i")
            .arg(&self.fx.client_key.private)
            .args(args)
            .timeout(BULK_TIMEOUT)
            .run()
    }

    fn ctx(&self, what: &str) -> String {
        format!(
            "{}\nSFTP channels started: {}",
            ctx(&self.sshd, what),
            self.channels()
        )
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// Every path under `dir` whose name holds skiff's temporary marker.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().contains(".skiff-") {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(temporaries(&path));
        }
    }
    found
}

fn assert_no_temporaries(dir: &Path, c: &str) {
    let left = temporaries(dir);
    assert!(left.is_empty(), "{c}: temporaries left behind: {left:?}");
}

/// Uploads a 48 MiB random file (and one of an odd size) to `env` and
/// checks both byte for byte; returns the channels the copy started.
fn upload_large(env: &Env, name: &str) -> usize {
    let src = env.local_dir(&format!("{name}-src"));
    let up = env.remote_dir(&format!("{name}-up"));
    let big = src.join("big");
    let odd = src.join("odd");
    let sums = [
        random_file(&big, 48 * MIB),
        random_file(&odd, 13 * MIB + 12345),
    ];
    env.reset_count();
    let out = env.cp(&[s(&big), s(&odd), &format!("{}/", env.remote(&up))]);
    let c = env.ctx(&format!("{name}: upload of 48 MiB and 13 MiB"));
    out.expect_code(0, &c);
    let c = env.ctx(&format!("{name}: after the upload"));
    assert_eq!(sha256(&up.join("big")), sums[0], "{c}: big differs");
    assert_eq!(sha256(&up.join("odd")), sums[1], "{c}: odd differs");
    assert_no_temporaries(&up, &c);
    env.channels()
}

/// A large file goes up byte-identical over several channels.
#[test]
fn a_large_upload_uses_several_channels() {
    let Some(env) = Env::new(&[]) else { return };
    let n = upload_large(&env, "default");
    assert!(
        (2..=8).contains(&n),
        "{}",
        env.ctx(&format!("expected 2 to 8 SFTP channels, saw {n}"))
    );

    // `--streams 1` keeps it to one.
    let src = env.local_dir("one-src");
    let up = env.remote_dir("one-up");
    let big = src.join("big");
    let sum = random_file(&big, 24 * MIB);
    env.reset_count();
    let out = env.cp(&["--streams", "1", s(&big), &env.remote(&up.join("big"))]);
    let c = env.ctx("--streams 1");
    out.expect_code(0, &c);
    assert_eq!(sha256(&up.join("big")), sum, "{c}");
    assert_eq!(env.channels(), 1, "{}", env.ctx("--streams 1: one channel"));
}

/// sshd's `MaxSessions` refuses the extra channels: the copy goes on with
/// those it has, silently.
#[test]
fn refused_channels_fall_back_to_those_that_opened() {
    for (limit, expected) in [(1, 1), (2, 2)] {
        let line = format!("MaxSessions {limit}");
        let Some(env) = Env::new(&[&line]) else {
            return;
        };
        let n = upload_large(&env, &format!("max{limit}"));
        assert_eq!(
            n,
            expected,
            "{}",
            env.ctx(&format!("MaxSessions {limit}: channels"))
        );
    }
}

/// Refusals are not the user's business: nothing on stderr.
#[test]
fn a_refused_channel_says_nothing() {
    let Some(env) = Env::new(&["MaxSessions 1"]) else {
        return;
    };
    let src = env.local_dir("src");
    let up = env.remote_dir("up");
    let big = src.join("big");
    let sum = random_file(&big, 32 * MIB);
    let out = env.cp(&[s(&big), &env.remote(&up.join("big"))]);
    let c = env.ctx("MaxSessions 1, quiet");
    out.expect_code(0, &c);
    assert_eq!(sha256(&up.join("big")), sum, "{c}");
    assert!(out.stderr.trim().is_empty(), "{c}: stderr: {}", out.stderr);
}

/// Many small files are spread over more than one channel.
#[test]
fn many_files_spread_over_channels() {
    let Some(env) = Env::new(&[]) else { return };
    let src = env.local_dir("tree");
    let up = env.remote_dir("up");
    let mut sums = Vec::new();
    for i in 0..96 {
        let p = src.join(format!("f{i:03}"));
        sums.push((
            p.file_name().unwrap().to_owned(),
            random_file(&p, 1000 + i * 517),
        ));
    }
    let out = env.cp(&["-r", s(&src), &format!("{}/", env.remote(&up))]);
    let c = env.ctx("upload of 96 files");
    out.expect_code(0, &c);
    for (name, sum) in &sums {
        assert_eq!(&sha256(&up.join("tree").join(name)), sum, "{c}: {name:?}");
    }
    assert_no_temporaries(&up, &c);
    assert!(env.channels() > 1, "{c}: expected several channels");
}

/// A small upload costs no extra channel.
#[test]
fn a_small_upload_opens_one_channel() {
    let Some(env) = Env::new(&[]) else { return };
    let src = env.local_dir("src");
    let up = env.remote_dir("up");
    let f = src.join("small");
    let sum = random_file(&f, 3 * MIB);
    let out = env.cp(&[s(&f), &env.remote(&up.join("small"))]);
    let c = env.ctx("upload of 3 MiB");
    out.expect_code(0, &c);
    assert_eq!(sha256(&up.join("small")), sum, "{c}");
    assert_eq!(env.channels(), 1, "{}", env.ctx("3 MiB: one channel"));
}

/// A tmpfs of `mib` MiB mounted on `dir`, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, mib: usize) -> SmallDisk {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0755")])
            .arg("tmpfs")
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount tmpfs: {out:?}");
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A disk that fills up half-way through a file written over several
/// channels: the copy fails naming the file, the good file under the final
/// name is left as it was, and no temporary remains.
#[test]
fn a_failure_mid_way_leaves_the_old_file() {
    if !is_root() {
        if in_ci() {
            panic!("this test mounts a small tmpfs and must run as root under CI");
        }
        eprintln!("NOTICE: skipping test: mounting a tmpfs needs root");
        return;
    }
    let Some(env) = Env::new(&[]) else { return };
    let src = env.local_dir("src");
    let big = src.join("big");
    random_file(&big, 48 * MIB);
    let disk_dir = env.local_dir("small-disk");
    let _disk = SmallDisk::mount(&disk_dir, 24);
    let acct = account();
    std::os::unix::fs::chown(&disk_dir, Some(acct.uid), Some(acct.gid)).expect("chown");
    let target = disk_dir.join("big");
    let old = random_file(&target, 64 * 1024);
    std::os::unix::fs::chown(&target, Some(acct.uid), Some(acct.gid)).expect("chown");
    fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).expect("chmod");

    env.reset_count();
    let out = env.cp(&[s(&big), &env.remote(&target)]);
    let c = env.ctx("upload of 48 MiB onto a 24 MiB disk");
    assert_ne!(out.code, 0, "{c}: the copy cannot have succeeded");
    assert!(
        out.stderr.contains("big"),
        "{c}: the failure names the file"
    );
    let c = env.ctx("after the failed upload");
    assert!(env.channels() > 1, "{c}: written over several channels");
    assert_eq!(sha256(&target), old, "{c}: the old file was replaced");
    assert_no_temporaries(&disk_dir, &c);

    // And where nothing was there, nothing is.
    let fresh = disk_dir.join("fresh");
    let out = env.cp(&[s(&big), &env.remote(&fresh)]);
    assert_ne!(out.code, 0, "{c}: the second copy cannot have succeeded");
    assert!(!fresh.exists(), "{c}: a partial file under the final name");
    assert_no_temporaries(&disk_dir, &c);
}

/// Through the agent, the extra channels are asked of the agent as the
/// first is, and the file arrives whole.
#[test]
fn through_the_agent_too() {
    let Some(env) = Env::new(&[]) else { return };
    let ah = AgentHome::new();
    let src = env.local_dir("src");
    let up = env.remote_dir("up");
    let big = src.join("big");
    let sum = random_file(&big, 48 * MIB);
    let run = Run::new(skiff_bin())
        .env("SKIFF_AGENT", "on")
        .env("XDG_RUNTIME_DIR", ah.runtime.path())
        .env("XDG_STATE_HOME", ah.home.path().join("state"));
    let out = env.skiff_cp(run, &[s(&big), &env.remote(&up.join("big"))]);
    let c = env.ctx("upload of 48 MiB through the agent");
    out.expect_code(0, &c);
    let c = env.ctx("after the upload through the agent");
    assert_eq!(sha256(&up.join("big")), sum, "{c}");
    assert_no_temporaries(&up, &c);
    assert_eq!(ah.agent_pids().len(), 1, "{c}: the agent carried the copy");
    assert!(env.channels() > 1, "{c}: expected several channels");
    let log = env.sshd.log();
    assert_eq!(
        log.matches("Accepted publickey for").count(),
        1,
        "{c}: the channels share one connection"
    );
}
