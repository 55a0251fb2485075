//! skiffd's `AuthenticationMethods` with the same method more than once,
//! driven by stock OpenSSH `ssh`: `publickey,publickey` needs two different
//! keys (partial success after the first, which `ssh -v` reports); a
//! certificate of a key already used does not count again; of several
//! lists any one is enough; a `Match` block can require it for some
//! connections only.

use std::net::Ipv4Addr;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const SECOND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn skiffd_with(fx: &Fixture, config: &str) -> Skiffd {
    Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .also_listen([SECOND])
            .config(config),
    )
}

/// `ssh -v` to `address` with `keys` (in this order), running `echo in`.
fn login(d: &Skiffd, address: Ipv4Addr, keys: &[&Key]) -> CmdOutput {
    let mut s = ssh(d.port(), user(), keys[0])
        .opt(&format!("HostName={address}"))
        .flag("-v");
    for k in &keys[1..] {
        s = s.flag("-i").flag(&k.private.display().to_string());
    }
    s.args(&["echo", "in"]).run()
}

/// ssh's words for a `USERAUTH_FAILURE` with partial success.
fn partial(out: &CmdOutput) -> bool {
    out.stderr.contains("partial success")
}

#[test]
fn two_different_keys_are_required() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd_with(&fx, "AuthenticationMethods publickey,publickey\n");
    let c = |what: &str| ctx(&d, &format!("publickey,publickey: {what}"));
    // Two authorized keys: in.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key, &fx.rsa_key]);
    out.expect_code(0, &c("two keys"))
        .expect_stdout("in\n", &c("two keys"));
    assert!(partial(&out), "{}\n{out}", c("two keys"));
    // One key: partial success, then nothing more to offer.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key]);
    assert_eq!(out.code, 255, "{}\n{out}", c("one key"));
    assert!(partial(&out), "{}\n{out}", c("one key"));
    assert!(out.stdout.is_empty(), "{}\n{out}", c("one key"));
    assert!(d.log().contains("partial authentication"), "{}", c("log"));
    // The same key twice (given twice on the command line) is one key.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key, &fx.client_key]);
    assert_eq!(out.code, 255, "{}\n{out}", c("same key twice"));
    // A key that is not authorized does not complete it either.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key, &fx.stranger_key]);
    assert_eq!(out.code, 255, "{}\n{out}", c("stranger second"));
}

#[test]
fn a_certificate_of_a_key_already_used_does_not_count_again() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let ca = fx.keygen("user_ca", KeyType::Ed25519, None);
    let cert_of_client = user_certificate_copy(
        &fx,
        &ca,
        &fx.client_key,
        "client_certified",
        ("id", user()),
        &[],
    );
    let cert_of_rsa =
        user_certificate_copy(&fx, &ca, &fx.rsa_key, "rsa_certified", ("id", user()), &[]);
    let config = format!(
        "TrustedUserCAKeys {}\nAuthenticationMethods publickey,publickey\n",
        ca.public.display()
    );
    let d = skiffd_with(&fx, &config);
    let c = |what: &str| {
        ctx(
            &d,
            &format!("publickey,publickey with certificates: {what}"),
        )
    };
    // The key, then its certificate (and the key again): one key only.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key, &cert_of_client]);
    assert_eq!(out.code, 255, "{}\n{out}", c("key and its certificate"));
    assert!(partial(&out), "{}\n{out}", c("key and its certificate"));
    assert!(
        d.log().contains("already been used"),
        "{}",
        c("key and its certificate")
    );
    // The certificate first, then the key: the same.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&cert_of_client, &fx.client_key]);
    assert_eq!(out.code, 255, "{}\n{out}", c("certificate and its key"));
    // A certificate of another key is a second key.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key, &cert_of_rsa]);
    out.expect_code(0, &c("key and another key's certificate"))
        .expect_stdout("in\n", &c("key and another key's certificate"));
}

#[test]
fn any_one_list_is_enough_and_match_blocks_can_require_two_keys() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = "AuthenticationMethods publickey,publickey publickey\n\
                  Match LocalAddress 127.0.0.2\n  \
                  AuthenticationMethods publickey,publickey\n";
    let d = skiffd_with(&fx, config);
    let c = |what: &str| ctx(&d, &format!("lists and Match: {what}"));
    // 127.0.0.1: the second list needs one key only.
    let out = login(&d, Ipv4Addr::LOCALHOST, &[&fx.client_key]);
    out.expect_code(0, &c("one key, two lists"))
        .expect_stdout("in\n", &c("one key, two lists"));
    assert!(!partial(&out), "{}\n{out}", c("one key, two lists"));
    // 127.0.0.2: the Match block wants two.
    let out = login(&d, SECOND, &[&fx.client_key]);
    assert_eq!(out.code, 255, "{}\n{out}", c("one key in Match"));
    assert!(partial(&out), "{}\n{out}", c("one key in Match"));
    let out = login(&d, SECOND, &[&fx.client_key, &fx.ecdsa_key]);
    out.expect_code(0, &c("two keys in Match"))
        .expect_stdout("in\n", &c("two keys in Match"));
}

#[test]
fn methods_skiffd_does_not_offer_are_refused_naming_the_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("sshd_config");
    write_file(
        &config,
        "# two factors\nAuthenticationMethods publickey,hostbased\n",
        0o644,
    );
    let out = skiffd_with_bad_config(&fx.host_key, &config);
    assert_ne!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains("sshd_config:2") && out.stderr.contains("cannot require hostbased"),
        "{out}"
    );
}
