//! skiffd's `Match` blocks, `ForceCommand` and `PermitTTY`, driven by stock
//! OpenSSH: a block chosen by the address the client reached (skiffd also
//! listens on 127.0.0.2), by user and by group; the first matching block
//! to set a keyword wins; `ForceCommand internal-sftp`; configuration
//! errors that name the file and line.

use std::net::Ipv4Addr;

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

const SECOND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn skiffd_with(config: &str) -> Option<(Fixture, Skiffd)> {
    if !require_openssh() {
        return None;
    }
    let fx = Fixture::new();
    let mut text = config.to_string();
    if let Some(sftp) = sftp_subsystem_config() {
        // Global lines go before the first Match.
        text = format!("{sftp}\n{text}");
    }
    let d = Skiffd::start_with(
        SkiffdOptions::new(&fx.host_key, &fx.authorized_keys)
            .also_listen([SECOND])
            .config(&text),
    );
    Some((fx, d))
}

/// `ssh` to skiffd on `address`.
fn ssh_to(d: &Skiffd, fx: &Fixture, address: Ipv4Addr) -> Ssh {
    ssh(d.port(), user(), &fx.client_key).opt(&format!("HostName={address}"))
}

#[test]
fn the_first_matching_block_wins_per_keyword() {
    let config = "Match LocalAddress 127.0.0.2\n  \
                  ForceCommand echo forced \"$SSH_ORIGINAL_COMMAND\"\n  \
                  AllowTcpForwarding yes\n\
                  Match all\n  \
                  AllowTcpForwarding no\n  \
                  ForceCommand echo never\n";
    let Some((fx, d)) = skiffd_with(config) else {
        return;
    };
    let c = || ctx(&d, "Match LocalAddress, Match all");
    // 127.0.0.2: the first block's ForceCommand, with the asked-for
    // command in SSH_ORIGINAL_COMMAND.
    ssh_to(&d, &fx, SECOND)
        .args(&["echo", "asked"])
        .run()
        .expect_code(0, &c())
        .expect_stdout("forced echo asked\n", &c());
    // 127.0.0.1: only `Match all` applies.
    ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .args(&["echo", "asked"])
        .run()
        .expect_code(0, &c())
        .expect_stdout("never\n", &c());
    // AllowTcpForwarding: the first block's `yes` wins on 127.0.0.2, the
    // second block's `no` applies on 127.0.0.1.
    let forward = |address| {
        ssh_to(&d, &fx, address)
            .log_level("INFO")
            .flag("-W")
            .flag(&format!("127.0.0.1:{}", d.port()))
            .run()
    };
    let out = forward(SECOND);
    assert!(out.stdout_str().starts_with("SSH-2.0-"), "{}\n{out}", c());
    let out = forward(Ipv4Addr::LOCALHOST);
    assert!(out.stdout.is_empty(), "{}\n{out}", c());
    assert!(
        d.log().contains("AllowTcpForwarding does not allow"),
        "{}",
        c()
    );
}

#[test]
fn user_and_group_blocks() {
    let account = account();
    let group = std::process::Command::new("id")
        .args(["-gn", &account.name])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .expect("id -gn");
    let config = format!(
        "Match User nobody-else,{}\n  PermitTTY no\n\
         Match Group {group}\n  ForceCommand tty\n\
         Match Group !{group},*\n  ForceCommand echo wrong group\n",
        account.name
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "Match User, Match Group");
    // The user block refuses the terminal that -tt asks for (ssh then
    // gives up, as it does whenever a forced terminal is refused).
    let out = ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .flag("-tt")
        .args(&["true"])
        .run();
    assert!(
        out.stderr.contains("PTY allocation request failed"),
        "{}: PermitTTY no\n{out}",
        c()
    );
    // The group block forces `tty` (no terminal asked for here); the
    // negated group block does not match.
    let out = ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .args(&["echo", "asked"])
        .run();
    out.expect_code(1, &c()).expect_stdout("not a tty\n", &c());
}

#[test]
fn force_command_internal_sftp() {
    let Some((fx, d)) = skiffd_with("Match all\n  ForceCommand internal-sftp\n") else {
        return;
    };
    let c = || ctx(&d, "ForceCommand internal-sftp");
    let batch = fx.path().join("batch");
    write_file(&batch, "pwd\n", 0o644);
    let out = stock_sftp_batch(d.port(), &fx.client_key, &batch);
    out.expect_code(0, &c());
    assert!(
        out.stdout_str().contains("Remote working directory"),
        "{}\n{out}",
        c()
    );
    // A command gets the SFTP server instead, which does not run it.
    let out = ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .args(&["echo", "ran"])
        .run();
    assert!(!out.stdout_str().contains("ran"), "{}\n{out}", c());
}

#[test]
fn bad_match_configuration_names_the_line() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("skiffd.conf");
    for (text, line, needle) in [
        (
            "PermitTTY yes\nMatch Tagged x\n",
            2,
            "unsupported Match criterion",
        ),
        (
            "Match User a\n  PermitTTY yes\n  ListenAddress 127.0.0.1:1\n",
            3,
            "cannot be used inside a Match block",
        ),
        (
            "Match User a\n  AllowTcpForwarding sometimes\n",
            2,
            "AllowTcpForwarding",
        ),
        ("Match Address 10.0.0.0/40\n", 1, "CIDR"),
        ("ForceCommand\n", 1, "ForceCommand"),
    ] {
        write_file(&config, text, 0o644);
        let out = skiffd_with_bad_config(&fx.host_key, &config);
        assert_ne!(out.code, 0, "{text:?}\n{out}");
        assert!(
            out.stderr.contains(&format!("{}:{line}", config.display()))
                && out.stderr.contains(needle),
            "{text:?}: skiffd names the file, the line and the problem\n{out}"
        );
    }
}

/// A Debian-style sshd_config: drop-ins included first win over the main
/// file, sshd keywords for what skiffd never offers are accepted (and the
/// ones that ask for it logged), and the server serves.
#[test]
fn a_stock_sshd_config_with_drop_ins_is_served() {
    let drop_ins = tempdir();
    write_file(
        &drop_ins.path().join("50-local.conf"),
        "PermitTTY no\nAcceptEnv SKIFF_DROP_IN\n",
        0o644,
    );
    // Not matched by the pattern: never read.
    write_file(
        &drop_ins.path().join("README"),
        "NoSuchKeyword here\n",
        0o644,
    );
    let config = format!(
        "Include {}/*.conf\nKbdInteractiveAuthentication no\nUsePAM yes\nX11Forwarding yes\n\
         PrintMotd no\nPermitTTY yes\nAcceptEnv LANG LC_*\n",
        drop_ins.path().display()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "a Debian-style sshd_config");
    // PermitTTY no from the drop-in, though the main file says yes.
    let out = ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .flag("-tt")
        .args(&["tty"])
        .run();
    assert!(
        out.stderr.contains("PTY allocation request failed"),
        "{}\n{out}",
        c()
    );
    // AcceptEnv lines add up across the files.
    ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .env("SKIFF_DROP_IN", "seen")
        .opt("SendEnv=SKIFF_DROP_IN")
        .args(&["echo $SKIFF_DROP_IN"])
        .run()
        .expect_code(0, &c())
        .expect_stdout("seen\n", &c());
    let log = d.log();
    assert!(
        log.contains("X11Forwarding: skiffd does not offer X11"),
        "{}",
        c()
    );
}

/// `SetEnv` reaches every session, over what the client sends; a `Match`
/// block's wins over the global one.
#[test]
fn set_env_reaches_sessions() {
    let config = format!(
        "SetEnv SKIFF_A=global \"SKIFF_B=two words\"\nAcceptEnv SKIFF_*\n\
         Match User {}\n  SetEnv SKIFF_A=matched\n",
        user()
    );
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "SetEnv");
    // The Match block's SetEnv replaces the global list for this user.
    ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .env("SKIFF_A", "client")
        .opt("SendEnv=SKIFF_A")
        .args(&["echo \"$SKIFF_A/${SKIFF_B-unset}\""])
        .run()
        .expect_code(0, &c())
        .expect_stdout("matched/unset\n", &c());
}

/// `skiffd -t` checks a configuration and its host keys without serving,
/// as `sshd -t` does for config management tools.
#[test]
fn dash_t_checks_the_configuration_and_exits() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let config = fx.path().join("check.conf");
    let check = || {
        Run::new(skiffd_bin())
            .args(["-t", "-f"])
            .arg(&config)
            .arg("--host-key")
            .arg(&fx.host_key.private)
            .run()
    };
    write_file(
        &config,
        "X11Forwarding yes\nPort 2022\nMatch User x\n  PermitTTY no\n",
        0o644,
    );
    let out = check();
    out.expect_code(0, "a good configuration");
    assert!(
        out.stderr.contains("X11Forwarding"),
        "the note is shown\n{out}"
    );
    write_file(&config, "PermitTTY yes\nMatch User x\n  Port 22\n", 0o644);
    let out = check();
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("check.conf:3"), "{out}");
    // A host key that cannot be read fails the check too.
    write_file(&config, "HostKey /nonexistent/key\n", 0o644);
    let out = Run::new(skiffd_bin()).args(["-t", "-f"]).arg(&config).run();
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("/nonexistent/key"), "{out}");
}

/// `ExposeAuthInfo`: the session finds, in the file `SSH_USER_AUTH` names,
/// the key that logged in; the file is the account's, 0600, and goes with
/// the connection.
#[test]
fn expose_auth_info_names_the_key_that_logged_in() {
    let config = format!("Match User {}\n  ExposeAuthInfo yes\n", user());
    let Some((fx, d)) = skiffd_with(&config) else {
        return;
    };
    let c = || ctx(&d, "ExposeAuthInfo");
    let out = ssh_to(&d, &fx, Ipv4Addr::LOCALHOST)
        .args(&[
            "echo \"$SSH_USER_AUTH\"; cat \"$SSH_USER_AUTH\"; stat -c '%U %a' \"$SSH_USER_AUTH\"",
        ])
        .run();
    out.expect_code(0, &c());
    let stdout = out.stdout_str();
    let lines: Vec<&str> = stdout.lines().collect();
    let material = fx.client_key.pub_line();
    let mut fields = material.split_whitespace();
    let expected = format!(
        "publickey {} {}",
        fields.next().unwrap(),
        fields.next().unwrap()
    );
    assert_eq!(lines.len(), 3, "{}\n{out}", c());
    assert_eq!(lines[1], expected, "{}", c());
    assert_eq!(lines[2], format!("{} 600", user()), "{}", c());
    let path = std::path::PathBuf::from(lines[0]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}: {} outlived the connection",
            c(),
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
