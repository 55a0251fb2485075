//! A long path on loopback for a test: skiff-delay-relay (the benchmarks'
//! relay) run in the test's own process, on a runtime of its own, in front
//! of one server port. Every byte waits the given delay each way; the
//! relay stops when it is dropped.

use std::time::Duration;

use skiff_delay_relay::model::{default_in_flight, Link};
use skiff_delay_relay::relay::{run, Config, EventLog};

/// A relay on 127.0.0.1 with a fixed one-way delay, to one port.
pub struct DelayRelay {
    port: u16,
    /// Runs the relay; dropping it ends every relayed connection.
    _runtime: tokio::runtime::Runtime,
}

impl DelayRelay {
    /// Starts a relay to 127.0.0.1:`target` that delays every byte by
    /// `one_way` in each direction.
    pub fn start(target: u16, one_way: Duration) -> DelayRelay {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the relay's runtime");
        let port = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("the relay listens");
            let port = listener.local_addr().expect("the relay's address").port();
            let link = Link::new(one_way);
            let config = Config {
                target: format!("127.0.0.1:{target}"),
                in_flight: default_in_flight(&link),
                link,
                detailed_chunks: 0,
                exit_after_idle: None,
            };
            let log = EventLog::open(None).expect("no event log");
            tokio::spawn(async move {
                let _ = run(listener, config, log).await;
            });
            port
        });
        DelayRelay {
            port,
            _runtime: runtime,
        }
    }

    /// The port a client connects to.
    pub fn port(&self) -> u16 {
        self.port
    }
}
