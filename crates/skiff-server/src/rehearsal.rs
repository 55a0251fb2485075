//! A key exchange the zygote (`crate::zygote`) runs once against itself,
//! over an in-memory pipe, before it forks any connection process: russh's
//! server and client with the server's own algorithms and host keys, up to
//! an accepted `none` login, so that both ends have sent and read
//! encrypted packets.
//!
//! Everything a process does only the first time it takes these paths is
//! then done once, in the zygote, and every process it forks inherits the
//! result: the crypto crates' CPU-feature probes (each a `CPUID`, which
//! traps to the hypervisor on a virtual machine), lazily built tables, the
//! allocator's first growth. Without it each connection process paid for
//! them during its client's key exchange.
//!
//! Nothing leaves the process: the "client" is this process, the pipe is
//! memory, the signature is over a throwaway exchange, and the login
//! handler accepts only this pipe's `none` request. The runtime is a
//! single-threaded one, dropped before the zygote forks: the zygote must
//! still have one thread when it does ([`threads`] checks it).

use std::sync::Arc;
use std::time::Duration;

use russh::keys::PublicKeyOrCertificate;
use russh::server::Auth;

use crate::config::Settings;
use crate::hostkey::HostIdentity;

/// How long the rehearsal may take before it is abandoned: it is in memory
/// and takes about a millisecond, so this bounds only a fault.
const WITHIN: Duration = Duration::from_secs(5);

/// Why the rehearsal did not complete (the zygote goes on without it: its
/// connection processes are only slower to their first key exchange).
#[derive(Debug, thiserror::Error)]
pub enum RehearsalError {
    #[error("cannot start a runtime for it: {0}")]
    Runtime(std::io::Error),
    #[error("it took longer than {}s", WITHIN.as_secs())]
    Timeout,
    #[error("the key exchange failed: {0}")]
    Exchange(russh::Error),
    #[error("the login was not accepted")]
    NotAccepted,
}

/// Runs the rehearsal; returns once both ends are done and the runtime is
/// gone.
pub fn rehearse(settings: &Settings, host: &HostIdentity) -> Result<(), RehearsalError> {
    let mut server = crate::listener::russh_config(settings, host.clone());
    // Only this pipe's own login is answered, at once.
    server.auth_rejection_time = Duration::ZERO;
    server.auth_rejection_time_initial = Some(Duration::ZERO);
    let client = russh::client::Config {
        preferred: server.preferred.clone(),
        ..Default::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RehearsalError::Runtime)?;
    let outcome = runtime.block_on(async {
        let (server_end, client_end) = tokio::io::duplex(256 * 1024);
        let exchange = async {
            let (served, connected) = tokio::join!(
                russh::server::run_stream(Arc::new(server), server_end, Stage),
                russh::client::connect_stream(Arc::new(client), client_end, Audience),
            );
            let mut handle = connected.map_err(RehearsalError::Exchange)?;
            let accepted = handle
                .authenticate_none("rehearsal")
                .await
                .map_err(RehearsalError::Exchange)?;
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, "", "")
                .await;
            drop(handle);
            if let Ok(session) = served {
                let _ = session.await;
            }
            if accepted.success() {
                Ok(())
            } else {
                Err(RehearsalError::NotAccepted)
            }
        };
        tokio::time::timeout(WITHIN, exchange)
            .await
            .unwrap_or(Err(RehearsalError::Timeout))
    });
    // Every task of the rehearsal ends with its runtime, here.
    drop(runtime);
    outcome
}

/// How many threads this process has (`/proc/self/status`), if known.
pub fn threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// The rehearsal's server side: accepts the `none` login of its own
/// client (russh's defaults refuse everything else: channels, other
/// methods).
struct Stage;

impl russh::server::Handler for Stage {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }
}

/// The rehearsal's client side: the server is this process.
struct Audience;

impl russh::client::Handler for Audience {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh::keys::{Algorithm, EcdsaCurve, PrivateKey};

    fn host(algorithms: &[Algorithm]) -> HostIdentity {
        algorithms
            .iter()
            .map(|a| PrivateKey::random(&mut rand::rng(), a.clone()).expect("a host key"))
            .collect::<Vec<_>>()
            .into()
    }

    #[test]
    fn a_rehearsal_with_the_defaults_completes() {
        rehearse(&Settings::default(), &host(&[Algorithm::Ed25519])).expect("rehearsal");
    }

    /// The rehearsal's client offers the server's own lists, so it agrees
    /// whatever the configuration narrows them to.
    #[test]
    fn a_rehearsal_follows_the_configured_algorithms() {
        for text in [
            "KexAlgorithms curve25519-sha256\nCiphers aes256-ctr\nMACs hmac-sha2-256-etm@openssh.com\n",
            "KexAlgorithms ecdh-sha2-nistp256\nCiphers chacha20-poly1305@openssh.com\nHostKeyAlgorithms ecdsa-sha2-nistp256\n",
        ] {
            let mut settings = Settings::default();
            crate::config::apply_config_text(&mut settings, "test", text).expect("config");
            let keys = host(&[
                Algorithm::Ed25519,
                Algorithm::Ecdsa {
                    curve: EcdsaCurve::NistP256,
                },
            ]);
            rehearse(&settings, &keys).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
    }

    #[test]
    fn this_process_s_threads_are_counted() {
        assert!(threads().is_some_and(|n| n >= 1));
    }
}
