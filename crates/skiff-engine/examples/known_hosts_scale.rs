//! Host-key verification cost at fan-out scale.
//!
//! Builds a known_hosts file with N plain and N hashed unrelated entries plus
//! 1,000 target hosts (half plain, half hashed, a quarter on port 2222), then
//! verifies every target the way `connect` does (`KnownHosts::load`,
//! `known_key_types`, `verify`) twice: the first round is cold (first lookup of
//! each name in this process), the second warm (what the long-lived agent
//! sees). Times are thread CPU time.
//!
//! ```text
//! cargo run --release -p skiff-engine --example known_hosts_scale [-- --sizes 500,10000,50000 --hosts 1000]
//! ```

use std::time::Duration;

use russh::keys::ssh_key::public::Ed25519PublicKey;
use russh::keys::PublicKey;
use skiff_engine::hostkeys::KnownHosts;
use skiff_engine::settings::{resolve_for, ClientEnv};
use skiff_engine::{ConnectSettings, Destination};
use skiff_proto::known_hosts::{self, format_entry, HostField};

const TARGETS: usize = 1000;

/// xorshift64*: deterministic filler, no need for real randomness here.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes<const L: usize>(&mut self) -> [u8; L] {
        let mut out = [0u8; L];
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        out
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn ed25519_blob(payload: &[u8; 32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(51);
    b.extend_from_slice(&11u32.to_be_bytes());
    b.extend_from_slice(b"ssh-ed25519");
    b.extend_from_slice(&32u32.to_be_bytes());
    b.extend_from_slice(payload);
    b
}

struct Target {
    settings: ConnectSettings,
    key: PublicKey,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn verify_all(targets: &[Target]) -> Duration {
    let start = thread_cpu();
    for t in targets {
        let kh = KnownHosts::load(&t.settings);
        let types = kh.known_key_types(&t.settings.hostname, t.settings.port);
        assert_eq!(types, ["ssh-ed25519"], "{}", t.settings.hostname);
        kh.verify(&t.settings, &t.key)
            .unwrap_or_else(|e| panic!("{}: {}", t.settings.hostname, e.message));
    }
    thread_cpu() - start
}

fn run(n: usize, hosts: usize, rng: &mut Rng) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("known_hosts");
    let mut lines: Vec<String> = Vec::with_capacity(2 * n + TARGETS);
    for i in 0..n {
        let key = ed25519_blob(&rng.bytes());
        let host = format!(
            "noise-{i}.dc{}.example.net,10.{}.{}.{}",
            i % 7,
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        );
        lines.push(format_entry(&host, 22, "ssh-ed25519", &key, None));
        let key = ed25519_blob(&rng.bytes());
        let salt: [u8; 20] = rng.bytes();
        let hidden = format!("hidden-{i}.corp.example.org");
        lines.push(format_entry(&hidden, 22, "ssh-ed25519", &key, Some(&salt)));
    }
    let env = ClientEnv {
        vars: vec![("HOME".into(), dir.path().display().to_string())],
    };
    let mut targets = Vec::with_capacity(TARGETS);
    for i in 0..TARGETS {
        let payload: [u8; 32] = rng.bytes();
        let blob = ed25519_blob(&payload);
        let host = format!("web-{i:04}.fleet.example.com");
        let port = if i % 4 == 3 { 2222 } else { 22 };
        let salt: [u8; 20] = rng.bytes();
        let hashed = i % 2 == 1;
        lines.push(format_entry(
            &host,
            port,
            "ssh-ed25519",
            &blob,
            hashed.then_some(&salt),
        ));
        let dest = Destination {
            host: host.clone(),
            port: Some(port),
            config_file: Some("none".into()),
            options: vec![
                format!("UserKnownHostsFile={}", path.display()),
                "GlobalKnownHostsFile=none".into(),
                "StrictHostKeyChecking=yes".into(),
            ],
            ..Destination::default()
        };
        let settings = resolve_for(&dest, &env).expect("settings");
        let key = PublicKey::from(Ed25519PublicKey(payload));
        targets.push(Target { settings, key });
    }
    // Shuffle so targets are spread through the file.
    for i in (1..lines.len()).rev() {
        lines.swap(i, rng.below(i + 1));
    }
    let text: String = lines.concat();
    std::fs::write(&path, &text).expect("write known_hosts");
    // Let the file's timestamps age past any "just modified" window.
    std::thread::sleep(Duration::from_millis(100));

    // Order of verification differs from file order.
    for i in (1..targets.len()).rev() {
        targets.swap(i, rng.below(i + 1));
    }
    let timed = &targets[..hosts.min(targets.len())];

    let start = thread_cpu();
    drop(KnownHosts::load(&timed[0].settings));
    let first_load = thread_cpu() - start;
    let cold = verify_all(timed);
    let warm = verify_all(timed);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / timed.len() as f64;

    // Reference: what the scan cost before, one full HMAC-SHA1 (key setup
    // included) per hashed line, for a few names.
    let (parsed, _) = known_hosts::parse("reference", &text);
    let hashed: Vec<&HostField> = parsed
        .entries
        .iter()
        .map(|e| &e.hosts)
        .filter(|h| matches!(h, HostField::Hashed { .. }))
        .collect();
    let sample = &timed[..timed.len().min(20)];
    let start = thread_cpu();
    let mut found = 0;
    for t in sample {
        let name = known_hosts::host_port_name(&t.settings.hostname, t.settings.port);
        found += hashed.iter().filter(|h| h.matches(&name)).count();
    }
    let full_hmac = thread_cpu() - start;
    assert!(found <= sample.len());
    let ns_per_line =
        |d: Duration, names: usize| d.as_secs_f64() * 1e9 / (names * hashed.len()) as f64;
    println!(
        "N={n:>6}: {:>6} entries ({:>6} hashed), {:>5.1} MB, {} hosts\n  \
         first load (read + parse + index) {:>8.1} ms\n  \
         cold {:>8.1} µs/host ({:>8.1} with the first load spread over the hosts)\n  \
         warm {:>8.1} µs/host\n  \
         hashed scan {:>5.1} ns/line (cold, all per-host costs included); \
         one full HMAC per line would cost {:>5.1} ns/line",
        2 * n + TARGETS,
        hashed.len(),
        text.len() as f64 / 1e6,
        timed.len(),
        first_load.as_secs_f64() * 1e3,
        per(cold),
        per(cold + first_load),
        per(warm),
        ns_per_line(cold, timed.len()),
        ns_per_line(full_hmac, sample.len()),
    );
}

fn main() {
    let mut sizes = vec![500, 10_000, 50_000];
    let mut hosts = TARGETS;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--sizes" => {
                sizes = value
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes N,N,..."))
                    .collect()
            }
            "--hosts" => hosts = value.parse().expect("--hosts N"),
            other => panic!("unknown argument {other:?}"),
        }
    }
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    for n in sizes {
        run(n, hosts.max(1), &mut rng);
    }
}
