//! skiffd's `Match version` (sshd_config has it from OpenSSH 10.0): the
//! patterns are matched against skiffd's own version, the one its
//! identification string carries (`skiffd_X.Y.Z`), so a block written for
//! `OpenSSH_10.*` does not apply to skiffd. Driven by stock `ssh`.

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

#[test]
fn match_version_is_skiffds_own_version() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = "Match version OpenSSH_*\n  ForceCommand echo openssh\n\
                  Match version skiffd_*\n  ForceCommand echo skiffd\n";
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(config));
    let c = ctx(&d, "Match version");
    let out = ssh(d.port(), user(), &fx.client_key)
        .log_level("DEBUG1")
        .args(&["echo", "asked"])
        .run();
    out.expect_code(0, &c).expect_stdout("skiffd\n", &c);
    // The version matched is the one the client was told.
    assert!(
        out.stderr.contains("remote software version skiffd_"),
        "{c}\n{out}"
    );
}
