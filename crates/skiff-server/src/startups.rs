//! Connections that have not authenticated yet, counted in all (for
//! `MaxStartups`) and per source network (for `PerSourceMaxStartups`, with
//! `PerSourceNetBlockSize` saying how many leading address bits make a
//! network). A connection is admitted or refused when accepted, and its
//! counts are given back once, when it authenticates or ends.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// How many leading bits of a source address count as one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetBlock {
    pub v4_bits: u8,
    pub v6_bits: u8,
}

impl Default for NetBlock {
    /// sshd's default, `32:128`: every address on its own.
    fn default() -> Self {
        NetBlock {
            v4_bits: 32,
            v6_bits: 128,
        }
    }
}

impl NetBlock {
    /// Parses `V4` or `V4:V6` (`PerSourceNetBlockSize`).
    pub fn parse(value: &str) -> Result<NetBlock, String> {
        let bits = |s: &str, max: u8| {
            s.parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("PerSourceNetBlockSize {value:?}: expected 0-32 bits for IPv4, optionally :0-128 for IPv6"))
        };
        match value.split_once(':') {
            None => Ok(NetBlock {
                v4_bits: bits(value, 32)?,
                ..NetBlock::default()
            }),
            Some((v4, v6)) => Ok(NetBlock {
                v4_bits: bits(v4, 32)?,
                v6_bits: bits(v6, 128)?,
            }),
        }
    }

    /// The network `addr` belongs to: its leading bits, the rest zero. An
    /// IPv4 address carried in IPv6 (`::ffff:a.b.c.d`) counts as IPv4.
    pub fn network(&self, addr: IpAddr) -> IpAddr {
        match addr {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                self.network(IpAddr::V4(v6.to_ipv4_mapped().expect("checked")))
            }
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.v4_bits))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.v6_bits))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }
}

/// The counts, shared by every listener.
#[derive(Debug, Default)]
pub struct Startups {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_network: HashMap<IpAddr, usize>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `MaxStartups`: this many were authenticating in all.
    Total(usize),
    /// `PerSourceMaxStartups`: this many from the same network.
    Source { network: IpAddr, waiting: usize },
}

/// A connection's place in the counts, given back once.
pub struct Pending {
    give_back: Option<GiveBack>,
}

/// How a [`Pending`] place is given back.
enum GiveBack {
    /// The counts are in this process.
    Counted {
        startups: Arc<Startups>,
        network: IpAddr,
    },
    /// They are the listener's, and this connection's process tells it.
    Tell(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.give_back {
            Some(GiveBack::Counted { network, .. }) => write!(f, "Pending({network})"),
            Some(GiveBack::Tell(_)) => f.write_str("Pending(counted by the listener)"),
            None => f.write_str("Pending(given back)"),
        }
    }
}

impl Startups {
    /// Counts a connection from `peer`, or refuses it. `drop_total` says,
    /// from the number already waiting in all, whether `MaxStartups`
    /// drops it; `per_source` is `PerSourceMaxStartups`.
    pub fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        block: NetBlock,
        per_source: Option<usize>,
        drop_total: impl FnOnce(usize) -> bool,
    ) -> Result<Pending, Refusal> {
        let network = block.network(peer);
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if drop_total(counts.total) {
            return Err(Refusal::Total(counts.total));
        }
        let from_network = counts.by_network.get(&network).copied().unwrap_or(0);
        if per_source.is_some_and(|limit| from_network >= limit) {
            return Err(Refusal::Source {
                network,
                waiting: from_network,
            });
        }
        counts.total += 1;
        *counts.by_network.entry(network).or_default() += 1;
        Ok(Pending {
            give_back: Some(GiveBack::Counted {
                startups: self.clone(),
                network,
            }),
        })
    }
}

impl Pending {
    /// A place counted by another process (skiffd's listener, for a
    /// connection served in its own process): giving it back calls `tell`.
    pub fn counted_elsewhere(tell: impl FnOnce() + Send + 'static) -> Pending {
        Pending {
            give_back: Some(GiveBack::Tell(Box::new(tell))),
        }
    }

    /// Gives the connection's counts back (once; later calls do nothing).
    pub fn release(&mut self) {
        let (startups, network) = match self.give_back.take() {
            None => return,
            Some(GiveBack::Tell(tell)) => return tell(),
            Some(GiveBack::Counted { startups, network }) => (startups, network),
        };
        let mut counts = startups.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total -= 1;
        if let Some(n) = counts.by_network.get_mut(&network) {
            *n -= 1;
            if *n == 0 {
                counts.by_network.remove(&network);
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(s: &Startups) -> usize {
        s.counts.lock().unwrap().total
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn net_blocks_parse_and_mask() {
        assert_eq!(NetBlock::parse("32").unwrap(), NetBlock::default());
        let b = NetBlock::parse("24:56").unwrap();
        assert_eq!((b.v4_bits, b.v6_bits), (24, 56));
        for bad in ["33", "24:129", "x", "24:", ":56", "-1"] {
            assert!(NetBlock::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(b.network(ip("10.1.2.3")), ip("10.1.2.0"));
        assert_eq!(
            b.network(ip("2001:db8:aa:bbcc::1")),
            ip("2001:db8:aa:bb00::")
        );
        assert_eq!(b.network(ip("::ffff:10.1.2.3")), ip("10.1.2.0"));
        let all = NetBlock::parse("0:0").unwrap();
        assert_eq!(all.network(ip("192.0.2.7")), ip("0.0.0.0"));
        assert_eq!(all.network(ip("2001:db8::7")), ip("::"));
        let exact = NetBlock::default();
        assert_eq!(exact.network(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(exact.network(ip("2001:db8::7")), ip("2001:db8::7"));
    }

    #[test]
    fn per_source_and_total_limits_apply_and_release_once() {
        let s = Arc::new(Startups::default());
        let block = NetBlock::parse("24").unwrap();
        let never = |_: usize| false;
        let a1 = s.admit(ip("10.0.0.1"), block, Some(2), never).unwrap();
        let mut a2 = s.admit(ip("10.0.0.2"), block, Some(2), never).unwrap();
        // A third from 10.0.0.0/24 is refused; another network is not.
        assert_eq!(
            s.admit(ip("10.0.0.3"), block, Some(2), never).unwrap_err(),
            Refusal::Source {
                network: ip("10.0.0.0"),
                waiting: 2
            }
        );
        let b1 = s.admit(ip("10.0.1.1"), block, Some(2), never).unwrap();
        assert_eq!(total(&s), 3);
        // Releasing twice gives back one place.
        a2.release();
        a2.release();
        assert_eq!(total(&s), 2);
        let a3 = s.admit(ip("10.0.0.3"), block, Some(2), never).unwrap();
        // No per-source limit: only the total decides.
        let c = s.admit(ip("10.0.0.4"), block, None, |n| n >= 4).unwrap();
        assert_eq!(
            s.admit(ip("10.0.9.9"), block, None, |n| n >= 4)
                .unwrap_err(),
            Refusal::Total(4)
        );
        drop((a1, a3, b1, c));
        assert_eq!(total(&s), 0);
        assert!(s.counts.lock().unwrap().by_network.is_empty());
    }
}
