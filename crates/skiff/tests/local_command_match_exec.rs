//! `LocalCommand`/`PermitLocalCommand` and `Match exec`, against a real
//! OpenSSH sshd: a LocalCommand runs locally once the session is connected,
//! with its `%`-tokens expanded, only under `PermitLocalCommand yes`; a
//! `Match exec` block applies when its command exits 0, which `skiff ssh -G`
//! shows and a real connection follows.

use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

/// `skiff ssh ARGS` with `home`, directly (no agent).
fn skiff_ssh(home: &ClientHome, args: &[&str]) -> Run {
    Run::new(skiff_bin())
        .env("HOME", home.path())
        .env("SKIFF_AGENT", "off")
        .env("SHELL", "/bin/sh")
        .env_remove("SSH_AUTH_SOCK")
        .arg("ssh")
        .args(args)
}

#[test]
fn local_command_runs_only_when_permitted() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let home = ClientHome::new();
    name_server_box(&home, &sshd, &fx);
    let c = ctx(&sshd, "LocalCommand");
    let out_file = home.path().join("local-command-out");
    let local = format!("LocalCommand=echo %h %p %r %n %% > {}", out_file.display());

    // PermitLocalCommand yes: run once connected, tokens expanded; the
    // session goes on as usual.
    skiff_ssh(
        &home,
        &[
            "-o",
            "PermitLocalCommand=yes",
            "-o",
            &local,
            "box",
            "echo remote",
        ],
    )
    .run()
    .expect_code(0, &c)
    .expect_stdout("remote\n", &c);
    let written = std::fs::read_to_string(&out_file).expect("LocalCommand wrote its file");
    assert_eq!(
        written,
        format!("127.0.0.1 {} {} box %\n", sshd.port(), user()),
        "{c}"
    );

    // PermitLocalCommand no (the default, and said): nothing runs.
    std::fs::remove_file(&out_file).unwrap();
    for permit in [None, Some("PermitLocalCommand=no")] {
        let mut args = vec!["-o", &local];
        if let Some(p) = permit {
            args.extend(["-o", p]);
        }
        args.extend(["box", "echo remote"]);
        skiff_ssh(&home, &args).run().expect_code(0, &c);
        assert!(!out_file.exists(), "{c}: LocalCommand ran under {permit:?}");
    }

    // -G shows both, LocalCommand as written.
    let g = skiff_ssh(
        &home,
        &["-G", "-o", "PermitLocalCommand=yes", "-o", &local, "box"],
    )
    .run();
    g.expect_code(0, &c);
    let text = g.stdout_str();
    assert!(text.contains("\npermitlocalcommand yes\n"), "{text}");
    assert!(
        text.contains(&format!(
            "\nlocalcommand echo %h %p %r %n %% > {}\n",
            out_file.display()
        )),
        "{text}"
    );
}

#[test]
fn match_exec_switches_the_port_when_its_command_succeeds() {
    let Some((fx, sshd)) = sshd_setup(&[]) else {
        return;
    };
    let home = ClientHome::new();
    home.trust(sshd.port(), &fx.host_key);
    let c = ctx(&sshd, "Match exec");
    // The flag is named after %h and %p as Match exec sees them.
    let flags = home.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    let flag = flags.join("127.0.0.1-22");
    let config = home.ssh_dir().join("config");
    write_file(
        &config,
        format!(
            "Host box\n  HostName 127.0.0.1\n\
             Match host 127.0.0.1 exec \"test -e {dir}/%h-%p\"\n  Port {port}\n\
             Match !exec \"test -e {dir}/%h-%p\"\n  Port 9\n\
             Host *\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  \
             BatchMode yes\n  ConnectTimeout 10\n",
            dir = flags.display(),
            port = sshd.port(),
            user = user(),
            key = fx.client_key.private.display()
        ),
        0o600,
    );
    let port_of = |home: &ClientHome| {
        let g = skiff_ssh(home, &["-G", "box"]).run();
        g.expect_code(0, &c);
        g.stdout_str()
            .lines()
            .find_map(|l| l.strip_prefix("port ").map(str::to_string))
            .expect("-G prints the port")
    };

    // No flag: the !exec block applies.
    assert_eq!(port_of(&home), "9", "{c}");
    // The flag: the exec block applies, and the connection uses it.
    write_file(&flag, "", 0o600);
    assert_eq!(port_of(&home), sshd.port().to_string(), "{c}");
    skiff_ssh(&home, &["box", "echo matched"])
        .run()
        .expect_code(0, &c)
        .expect_stdout("matched\n", &c);

    // A host name that would be shell syntax in the command is refused,
    // and nothing runs.
    let pwned = home.path().join("pwned");
    let evil = format!("box;touch {}", pwned.display());
    let out = skiff_ssh(&home, &["-G", &evil]).run();
    out.expect_code(255, &c);
    assert!(out.stderr.contains("refusing"), "{c}\n{out}");
    assert!(!pwned.exists(), "{c}: the host name ran as a command");

    // OpenSSH's ssh reads the same configuration the same way.
    if require_tool("ssh", "openssh-client") {
        let ssh = Run::new("ssh")
            .env("HOME", home.path())
            .args(["-F"])
            .arg(&config)
            .args(["-G", "box"])
            .run();
        ssh.expect_code(0, &c);
        assert!(
            ssh.stdout_str()
                .contains(&format!("\nport {}\n", sshd.port())),
            "{c}: ssh -G disagrees\n{ssh}"
        );
    }
}
