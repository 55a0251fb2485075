//! A copy through the agent that meets the race a spare channel can lose.
//!
//! The agent keeps a session channel open ahead on each connection (a
//! spare). A server may time out an unused channel (skiffd's
//! `ChannelTimeout session=`), and may do so while a copy's request is on
//! its way to the spare: the server closes the channel without answering,
//! nothing starts. The agent cannot send the copy again (it has read the
//! copy's bytes), so it says so (`ClosedBeforeStart`), and the copy, which
//! holds what it sent, sends it again, once, on a channel of its own.
//!
//! The path is a relay with 1 s each way, so the window is wide: the spare
//! is parked about 1 s after skiffd opened it, the copy is sent 1.8 s
//! later, skiffd closes the spare at 3 s, the request reaches it at 3.8 s
//! and the close reaches the agent at 4 s (0.8 s of margin each side, as
//! in the pool's own test of the race).
//!
//! Run as root (as CI does), the remote side is the `skiff-test` account.

use std::path::Path;
use std::time::{Duration, Instant};

use skiff_testkit::*;

fn remote(path: &Path) -> String {
    format!("{}@127.0.0.1:{}", user(), path.display())
}

/// Waits (at most a minute) until the agent shows a spare parked.
fn wait_for_a_spare(ah: &AgentHome, c: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = ah.agent_cmd(&["status"]);
        if String::from_utf8_lossy(&status.stdout).contains("(+1 spare)") {
            return;
        }
        assert!(Instant::now() < deadline, "{c}: no spare parked\n{status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_copy_whose_spare_was_closed_on_the_way_is_sent_again_on_its_own_channel() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let mut config = transfer_subsystem_config().unwrap_or_default();
    config.push_str("ChannelTimeout session=3s\n");
    let d =
        Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config));
    let relay = DelayRelay::start(d.port(), Duration::from_secs(1));
    let ah = AgentHome::new();
    let sources = account_dir();
    let (first, second) = (sources.path().join("first"), sources.path().join("second"));
    let first_sum = random_file(&first, 5000);
    let second_sum = random_file(&second, 5000);
    let into = account_dir();
    let c = server_context(&d, "a copy through the agent behind a 1 s relay");

    // The first copy opens the agent's connection; a spare is opened
    // beside its channel.
    skiff_cp_via_agent(
        &ah,
        relay.port(),
        &fx.client_key,
        &[first.to_str().unwrap(), &remote(into.path())],
    )
    .expect_code(0, &c);
    wait_for_a_spare(&ah, &c);
    // Into the window where skiffd has closed the spare and the agent
    // cannot know yet.
    std::thread::sleep(Duration::from_millis(1800));
    let copied = skiff_cp_via_agent_env(
        &ah,
        relay.port(),
        &fx.client_key,
        &[("SKIFF_LOG", "skiff=debug")],
        &[second.to_str().unwrap(), &remote(into.path())],
    );
    let c = server_context(&d, &c);
    copied.expect_code(0, &c);
    assert_eq!(sha256(&into.path().join("first")), first_sum, "{c}");
    assert_eq!(sha256(&into.path().join("second")), second_sum, "{c}");
    assert!(
        copied
            .stderr
            .contains("closed the channel before the copy started; sending it again"),
        "{c}: the copy met the closed spare and was sent again\n{copied}"
    );
    assert!(
        d.log().contains("without traffic (ChannelTimeout)"),
        "{c}: skiffd closed the spare"
    );
    assert_eq!(
        ah.agent_pids().len(),
        1,
        "{c}: the agent carried the copies"
    );
}
