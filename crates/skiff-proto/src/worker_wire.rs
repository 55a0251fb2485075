//! The messages between skiffd's listener and the processes that serve its
//! connections (see skiff-server's `worker_pool`, `zygote` and `worker`):
//!
//! - the listener asks a *zygote* (a process that has read the
//!   configuration and host keys, and forks) for a new connection process,
//!   passing the socket that process will be reached on;
//! - the listener hands a *worker* (one connection's process) the accepted
//!   TCP connection, and hears back when the client has authenticated (its
//!   place among the unauthenticated is given back) and how the
//!   connection's unauthenticated part ended (for `PerSourcePenalties`);
//! - any skiffd process that receives a data-plane stream hands it to the
//!   worker whose transfer issued the stream's token. The token names that
//!   worker: its first four bytes are the worker's pid ([`token_owner`]).
//!
//! Descriptors travel beside the messages as `SCM_RIGHTS`. The encoding is
//! `wire_codec`'s. Pure: encoding and bounds-checked decoding, no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::dataplane::TOKEN_LEN;
pub use crate::wire_codec::WireError;
use crate::wire_codec::{Reader, Writer};

/// The largest message any side sends or accepts.
pub const MAX_MESSAGE: usize = 16 * 1024;

/// The listener to a zygote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToZygote {
    /// Fork one connection process; beside the message, the socket it is
    /// to serve the listener on.
    Spawn,
}

/// A zygote to the listener: first `Ready` or `Failed` (then it exits),
/// then one `Spawned` or `NotSpawned` per `Spawn`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromZygote {
    Ready,
    /// The configuration or the host keys could not be loaded.
    Failed(String),
    Spawned {
        pid: i32,
    },
    NotSpawned(String),
}

/// The listener to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToWorker {
    /// Serve this connection (the accepted socket is beside the message).
    /// `ident_sent`: how many bytes of the server's identification line
    /// the listener already wrote on it (the process writes the rest).
    Serve {
        peer: SocketAddr,
        local: SocketAddr,
        ident_sent: u32,
    },
}

/// A worker to the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromWorker {
    /// Started: it may be handed a connection.
    Ready,
    /// The client authenticated (or the connection turned out to be a
    /// data-plane stream): its place among the unauthenticated is free.
    Authenticated,
    /// The connection is over; how its unauthenticated part ended.
    Ended(Verdict),
}

/// How a connection's unauthenticated part ended, for `PerSourcePenalties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, or not a login at all: no penalty.
    Clean,
    /// Ended before any authentication attempt.
    NoAuth,
    /// Ended after refused authentication attempts.
    AuthFail,
    /// Ended after a refused password.
    PasswordFail,
    /// `LoginGraceTime` ran out.
    GraceExceeded,
}

/// A data-plane stream handed to the worker that owns its token; its
/// socket is beside the message. The token was read off the stream and is
/// checked (once, with `peer`) by the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHandoff {
    pub token: [u8; TOKEN_LEN],
    pub peer: SocketAddr,
}

/// The pid of the worker that issued `token`.
pub fn token_owner(token: &[u8; TOKEN_LEN]) -> u32 {
    u32::from_be_bytes([token[0], token[1], token[2], token[3]])
}

/// Marks a freshly drawn random `token` as issued by the worker `pid`.
/// What is left random (28 bytes) is what makes it unguessable.
pub fn mark_token(token: &mut [u8; TOKEN_LEN], pid: u32) {
    token[..4].copy_from_slice(&pid.to_be_bytes());
}

fn checked(bytes: &[u8]) -> Result<Reader<'_>, WireError> {
    Reader::checked(bytes, MAX_MESSAGE)
}

fn put_addr(w: &mut Writer, addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            w.u8(4);
            w.0.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.u8(6);
            w.0.extend_from_slice(&ip.octets());
        }
    }
    w.0.extend_from_slice(&addr.port().to_be_bytes());
}

fn get_addr(r: &mut Reader<'_>) -> Result<SocketAddr, WireError> {
    let ip = match r.u8()? {
        4 => {
            let b: [u8; 4] = r.take(4)?.try_into().map_err(|_| WireError::Short)?;
            IpAddr::V4(Ipv4Addr::from(b))
        }
        6 => {
            let b: [u8; 16] = r.take(16)?.try_into().map_err(|_| WireError::Short)?;
            IpAddr::V6(Ipv6Addr::from(b))
        }
        t => return Err(WireError::Tag(t)),
    };
    let p = r.take(2)?;
    Ok(SocketAddr::new(ip, u16::from_be_bytes([p[0], p[1]])))
}

impl ToZygote {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ToZygote::Spawn => vec![1],
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<ToZygote, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => ToZygote::Spawn,
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl FromZygote {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            FromZygote::Ready => w.u8(1),
            FromZygote::Failed(why) => {
                w.u8(2);
                w.bytes(why.as_bytes());
            }
            FromZygote::Spawned { pid } => {
                w.u8(3);
                w.i32(*pid);
            }
            FromZygote::NotSpawned(why) => {
                w.u8(4);
                w.bytes(why.as_bytes());
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<FromZygote, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => FromZygote::Ready,
            2 => FromZygote::Failed(r.string()?),
            3 => FromZygote::Spawned { pid: r.i32()? },
            4 => FromZygote::NotSpawned(r.string()?),
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl ToWorker {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            ToWorker::Serve {
                peer,
                local,
                ident_sent,
            } => {
                w.u8(1);
                put_addr(&mut w, peer);
                put_addr(&mut w, local);
                w.u32(*ident_sent);
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<ToWorker, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => ToWorker::Serve {
                peer: get_addr(&mut r)?,
                local: get_addr(&mut r)?,
                ident_sent: r.u32()?,
            },
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl Verdict {
    const ALL: [Verdict; 5] = [
        Verdict::Clean,
        Verdict::NoAuth,
        Verdict::AuthFail,
        Verdict::PasswordFail,
        Verdict::GraceExceeded,
    ];

    fn code(self) -> u8 {
        Verdict::ALL
            .iter()
            .position(|v| *v == self)
            .expect("every verdict is listed") as u8
    }
}

impl FromWorker {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            FromWorker::Ready => vec![1],
            FromWorker::Authenticated => vec![2],
            FromWorker::Ended(v) => vec![3, v.code()],
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<FromWorker, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => FromWorker::Ready,
            2 => FromWorker::Authenticated,
            3 => {
                let code = r.u8()?;
                match Verdict::ALL.get(usize::from(code)) {
                    Some(v) => FromWorker::Ended(*v),
                    None => return Err(WireError::Tag(code)),
                }
            }
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl StreamHandoff {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(1);
        w.0.extend_from_slice(&self.token);
        put_addr(&mut w, &self.peer);
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<StreamHandoff, WireError> {
        let mut r = checked(bytes)?;
        match r.u8()? {
            1 => {}
            t => return Err(WireError::Tag(t)),
        }
        let token: [u8; TOKEN_LEN] = r
            .take(TOKEN_LEN)?
            .try_into()
            .map_err(|_| WireError::Short)?;
        let peer = get_addr(&mut r)?;
        r.end()?;
        Ok(StreamHandoff { token, peer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> SocketAddr {
        "192.0.2.7:40022".parse().unwrap()
    }

    fn v6() -> SocketAddr {
        "[2001:db8::1]:22".parse().unwrap()
    }

    #[test]
    fn every_message_reads_back_as_written() {
        assert_eq!(
            ToZygote::decode(&ToZygote::Spawn.encode()),
            Ok(ToZygote::Spawn)
        );
        for m in [
            FromZygote::Ready,
            FromZygote::Failed("/etc/skiffd/skiffd_config line 3: unknown keyword".into()),
            FromZygote::Spawned { pid: 4242 },
            FromZygote::NotSpawned("fork: out of memory".into()),
        ] {
            assert_eq!(FromZygote::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
        for m in [
            ToWorker::Serve {
                peer: v4(),
                local: v6(),
                ident_sent: 0,
            },
            ToWorker::Serve {
                peer: v6(),
                local: v4(),
                ident_sent: 22,
            },
        ] {
            assert_eq!(ToWorker::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
        let mut all = vec![FromWorker::Ready, FromWorker::Authenticated];
        all.extend(Verdict::ALL.map(FromWorker::Ended));
        for m in all {
            assert_eq!(FromWorker::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
        let h = StreamHandoff {
            token: [7; TOKEN_LEN],
            peer: v6(),
        };
        assert_eq!(StreamHandoff::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn damaged_messages_are_errors() {
        let good = ToWorker::Serve {
            peer: v6(),
            local: v4(),
            ident_sent: 22,
        }
        .encode();
        for cut in 0..good.len() {
            assert!(ToWorker::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(ToWorker::decode(&long), Err(WireError::Trailing(1)));
        let mut family = good.clone();
        family[1] = 5;
        assert_eq!(ToWorker::decode(&family), Err(WireError::Tag(5)));
        assert_eq!(FromWorker::decode(&[3, 9]), Err(WireError::Tag(9)));
        assert_eq!(FromZygote::decode(&[0]), Err(WireError::Tag(0)));
        assert_eq!(
            FromZygote::decode(&vec![2; MAX_MESSAGE + 1]),
            Err(WireError::TooLong(MAX_MESSAGE + 1, MAX_MESSAGE))
        );
        let h = StreamHandoff {
            token: [1; TOKEN_LEN],
            peer: v4(),
        }
        .encode();
        for cut in 0..h.len() {
            assert!(StreamHandoff::decode(&h[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_token_names_the_worker_that_issued_it() {
        let mut token = [0xa5; TOKEN_LEN];
        mark_token(&mut token, 123_456);
        assert_eq!(token_owner(&token), 123_456);
        assert!(token[4..].iter().all(|b| *b == 0xa5), "the rest is kept");
    }
}
