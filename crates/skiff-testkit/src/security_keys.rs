//! Security keys without hardware: the software key library
//! (`crates/skiff-soft-sk`, a dependency of this harness so that building
//! the tests builds it), `ed25519-sk`/`ecdsa-sk` keys made with it by stock
//! `ssh-keygen -w`, and a private `ssh-agent` allowed to load it.
//!
//! The library's signatures carry the flags their key asks for (a touch,
//! unless the key was made `no-touch-required`), or those of
//! [`SOFT_SK_FLAGS`] in the environment of the program that loads it
//! (`ssh`, or the `ssh-agent` that signs); with [`SOFT_SK_LOG`] there, it
//! notes each signature in that file.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::environment::profile_dir;
use super::keys::{Key, KeyType};
use super::ssh_client::Agent;

/// The environment variable that sets the flags of every signature the
/// software key makes (`0x00`: no touch; `0x05`: touch and PIN).
pub const SOFT_SK_FLAGS: &str = "SKIFF_SOFT_SK_FLAGS";

/// The environment variable naming a file to which the software key
/// appends a line (`signed FLAGS COUNTER`) for each signature it makes.
pub const SOFT_SK_LOG: &str = "SKIFF_SOFT_SK_LOG";

/// The software key library (`libskiff_soft_sk.so`), as OpenSSH's
/// `SecurityKeyProvider` / `ssh-keygen -w` / `ssh-add -S` take it.
pub fn soft_sk_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = profile_dir().join("deps").join("libskiff_soft_sk.so");
        assert!(
            lib.is_file(),
            "{} is missing: building the tests builds it (the harness depends on \
             skiff-soft-sk), or `cargo build -p skiff-soft-sk`",
            lib.display()
        );
        lib
    })
}

/// A security key of `kind` (`Ed25519Sk` or `EcdsaSk`) made by
/// `ssh-keygen -t KIND -w LIB` at `dir/name`, unencrypted, with the
/// `ssh-keygen -O` options `options` (`no-touch-required`,
/// `verify-required`).
pub fn sk_keygen(dir: &Path, name: &str, kind: KeyType, options: &[&str]) -> Key {
    assert!(
        matches!(kind, KeyType::Ed25519Sk | KeyType::EcdsaSk),
        "{kind:?} is not a security key type"
    );
    let private = dir.join(name);
    let mut cmd = Command::new("ssh-keygen");
    cmd.args(["-q", "-N", "", "-t", kind.keygen_name(), "-w"])
        .arg(soft_sk_library())
        .args(["-C", &format!("skiff-test-{name}"), "-f"])
        .arg(&private)
        .env_remove("SSH_SK_PROVIDER")
        .stdin(Stdio::null());
    for option in options {
        cmd.args(["-O", option]);
    }
    let out = cmd.output().expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen -t {} -w {} -f {} failed: {}",
        kind.keygen_name(),
        soft_sk_library().display(),
        private.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Key {
        public: dir.join(format!("{name}.pub")),
        private,
        kind,
    }
}

/// A private ssh-agent that may load the software key library (`-P`),
/// whose signatures then carry `flags` ([`SOFT_SK_FLAGS`]) when given.
pub fn sk_agent(flags: Option<&str>) -> Agent {
    let allowed = soft_sk_library().display().to_string();
    let env: Vec<(&str, &str)> = flags.map(|f| (SOFT_SK_FLAGS, f)).into_iter().collect();
    Agent::start_with(&["-P", &allowed], &env)
}
