//! The SOCKS 4, 4a and 5 handshakes that `skiff ssh -D` answers, parsed
//! without I/O: CONNECT only, SOCKS 5 without authentication. Each parser
//! takes the bytes received so far and says "need more", gives the parsed
//! message and how many bytes it used, or refuses the input.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The most a handshake message may take (SOCKS 4 user ids and host names
/// are NUL-terminated, so a bound is needed).
pub const MAX_MESSAGE: usize = 1024;

/// Where the client wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// 4 or 5: the version to answer in.
    pub version: u8,
    /// A name or an address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

/// The first message of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opening {
    /// SOCKS 4 or 4a: the request itself.
    Socks4(Request),
    /// SOCKS 5: the client's method list; whether "no authentication" is in
    /// it. Answer with [`method_reply`], then read a [`parse_socks5_request`].
    Socks5 { no_auth_offered: bool },
}

/// Why a handshake was refused; the reply to send, if any, comes from
/// [`failure_reply`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    #[error("not a SOCKS 4 or 5 handshake (first byte {0:#04x})")]
    Version(u8),
    #[error("only CONNECT is supported (command {0})")]
    Command(u8),
    #[error("unsupported address type {0}")]
    AddressType(u8),
    #[error("handshake longer than {MAX_MESSAGE} bytes")]
    TooLong,
    #[error("malformed handshake: {0}")]
    Malformed(&'static str),
}

/// Parsed value and bytes used, or `None` when more bytes are needed.
pub type Parsed<T> = Result<Option<(T, usize)>, SocksError>;

/// A NUL-terminated string starting at `at`: its bytes and the index after
/// the NUL.
fn c_string(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, SocksError> {
    match buf
        .get(at..)
        .and_then(|rest| rest.iter().position(|&b| b == 0))
    {
        Some(n) => Ok(Some((&buf[at..at + n], at + n + 1))),
        None if buf.len() >= MAX_MESSAGE => Err(SocksError::TooLong),
        None => Ok(None),
    }
}

/// Parses the first message of a SOCKS connection.
pub fn parse_opening(buf: &[u8]) -> Parsed<Opening> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    match version {
        4 => parse_socks4(buf).map(|o| o.map(|(r, n)| (Opening::Socks4(r), n))),
        5 => {
            let Some(&count) = buf.get(1) else {
                return Ok(None);
            };
            let end = 2 + usize::from(count);
            if buf.len() < end {
                return Ok(None);
            }
            let no_auth_offered = buf[2..end].contains(&0);
            Ok(Some((Opening::Socks5 { no_auth_offered }, end)))
        }
        v => Err(SocksError::Version(v)),
    }
}

fn parse_socks4(buf: &[u8]) -> Parsed<Request> {
    if buf.len() < 8 {
        return Ok(None);
    }
    if buf[1] != 1 {
        return Err(SocksError::Command(buf[1]));
    }
    let port = u16::from_be_bytes([buf[2], buf[3]]);
    let ip = Ipv4Addr::new(buf[4], buf[5], buf[6], buf[7]);
    let Some((_user, after_user)) = c_string(buf, 8)? else {
        return Ok(None);
    };
    // SOCKS 4a: 0.0.0.x (x != 0) means a host name follows the user id.
    let [a, b, c, d] = ip.octets();
    if a == 0 && b == 0 && c == 0 && d != 0 {
        let Some((name, end)) = c_string(buf, after_user)? else {
            return Ok(None);
        };
        let host = std::str::from_utf8(name)
            .ok()
            .filter(|h| !h.is_empty())
            .ok_or(SocksError::Malformed("bad host name"))?;
        return Ok(Some((
            Request {
                version: 4,
                host: host.to_string(),
                port,
            },
            end,
        )));
    }
    Ok(Some((
        Request {
            version: 4,
            host: ip.to_string(),
            port,
        },
        after_user,
    )))
}

/// The SOCKS 5 answer to the method list: "no authentication" (0) when it
/// was offered, else "no acceptable method" (0xff, after which the client
/// closes).
pub fn method_reply(no_auth_offered: bool) -> [u8; 2] {
    [5, if no_auth_offered { 0 } else { 0xff }]
}

/// Parses a SOCKS 5 request (after the method exchange).
pub fn parse_socks5_request(buf: &[u8]) -> Parsed<Request> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] != 5 {
        return Err(SocksError::Version(buf[0]));
    }
    if buf[1] != 1 {
        return Err(SocksError::Command(buf[1]));
    }
    let (host, at) = match buf[3] {
        1 => {
            if buf.len() < 4 + 4 + 2 {
                return Ok(None);
            }
            let o: [u8; 4] = buf[4..8].try_into().expect("4 bytes");
            (Ipv4Addr::from(o).to_string(), 8)
        }
        3 => {
            let len = usize::from(buf[4]);
            if buf.len() < 5 + len + 2 {
                return Ok(None);
            }
            let name = std::str::from_utf8(&buf[5..5 + len])
                .ok()
                .filter(|h| !h.is_empty())
                .ok_or(SocksError::Malformed("bad host name"))?;
            (name.to_string(), 5 + len)
        }
        4 => {
            if buf.len() < 4 + 16 + 2 {
                return Ok(None);
            }
            let o: [u8; 16] = buf[4..20].try_into().expect("16 bytes");
            (Ipv6Addr::from(o).to_string(), 20)
        }
        t => return Err(SocksError::AddressType(t)),
    };
    let port = u16::from_be_bytes([buf[at], buf[at + 1]]);
    Ok(Some((
        Request {
            version: 5,
            host,
            port,
        },
        at + 2,
    )))
}

/// The reply granting a request.
pub fn success_reply(version: u8) -> Vec<u8> {
    match version {
        4 => vec![0, 0x5a, 0, 0, 0, 0, 0, 0],
        _ => vec![5, 0, 0, 1, 0, 0, 0, 0, 0, 0],
    }
}

/// The reply refusing a request: `refused` when the destination could not
/// be reached, else the reason the handshake was refused.
pub fn failure_reply(version: u8, error: Option<&SocksError>) -> Vec<u8> {
    match version {
        4 => vec![0, 0x5b, 0, 0, 0, 0, 0, 0],
        _ => {
            let code = match error {
                None => 5,                             // connection refused
                Some(SocksError::Command(_)) => 7,     // command not supported
                Some(SocksError::AddressType(_)) => 8, // address type not supported
                Some(_) => 1,                          // general failure
            };
            vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every proper prefix needs more; the whole parses and uses it all.
    fn whole<T: std::fmt::Debug>(buf: &[u8], parse: fn(&[u8]) -> Parsed<T>) -> T {
        for n in 0..buf.len() {
            assert_eq!(
                parse(&buf[..n]).map(|o| o.is_none()),
                Ok(true),
                "prefix {n}"
            );
        }
        let mut longer = buf.to_vec();
        longer.extend_from_slice(b"payload");
        let (value, used) = parse(&longer).unwrap().unwrap();
        assert_eq!(used, buf.len());
        value
    }

    #[test]
    fn socks4_and_4a() {
        let msg = [4, 1, 0x1f, 0x90, 10, 0, 0, 7, b'u', 0];
        assert_eq!(
            whole(&msg, parse_opening),
            Opening::Socks4(Request {
                version: 4,
                host: "10.0.0.7".into(),
                port: 8080
            })
        );
        let mut msg = vec![4, 1, 0, 80, 0, 0, 0, 1, 0];
        msg.extend_from_slice(b"example.org\0");
        assert_eq!(
            whole(&msg, parse_opening),
            Opening::Socks4(Request {
                version: 4,
                host: "example.org".into(),
                port: 80
            })
        );
        assert_eq!(
            parse_opening(&[4, 2, 0, 80, 1, 2, 3, 4, 0]),
            Err(SocksError::Command(2))
        );
        assert_eq!(
            parse_opening(&[4, 1, 0, 80, 0, 0, 0, 1, 0, 0]).unwrap_err(),
            SocksError::Malformed("bad host name")
        );
        let endless = [4u8, 1, 0, 80, 1, 2, 3, 4]
            .into_iter()
            .chain(std::iter::repeat_n(b'x', MAX_MESSAGE))
            .collect::<Vec<u8>>();
        assert_eq!(parse_opening(&endless), Err(SocksError::TooLong));
    }

    #[test]
    fn socks5() {
        assert_eq!(
            whole(&[5, 2, 2, 0], parse_opening),
            Opening::Socks5 {
                no_auth_offered: true
            }
        );
        assert_eq!(
            whole(&[5, 1, 2], parse_opening),
            Opening::Socks5 {
                no_auth_offered: false
            }
        );
        assert_eq!(method_reply(false), [5, 0xff]);
        let v4 = [5, 1, 0, 1, 127, 0, 0, 1, 0, 22];
        assert_eq!(whole(&v4, parse_socks5_request).host, "127.0.0.1");
        let mut name = vec![5, 1, 0, 3, 2];
        name.extend_from_slice(b"db\x15\x38");
        let r = whole(&name, parse_socks5_request);
        assert_eq!((r.host.as_str(), r.port), ("db", 5432));
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0, 80]);
        assert_eq!(whole(&v6, parse_socks5_request).host, "::1");

        let bind = [5, 2, 0, 1, 127, 0, 0, 1, 0, 22];
        let e = parse_socks5_request(&bind).unwrap_err();
        assert_eq!(failure_reply(5, Some(&e))[1], 7);
        let e = parse_socks5_request(&[5, 1, 0, 9, 0, 0]).unwrap_err();
        assert_eq!(failure_reply(5, Some(&e))[1], 8);
        assert_eq!(failure_reply(5, None)[1], 5);
        assert_eq!(parse_opening(&[0x16, 3, 1]), Err(SocksError::Version(0x16)));
    }

    #[test]
    fn no_input_panics() {
        // Every short or odd input is either "need more" or an error.
        for first in [4u8, 5] {
            for len in 0..40 {
                for fill in [0u8, 1, 3, 4, 0xff] {
                    let mut buf = vec![fill; len];
                    if let Some(b) = buf.first_mut() {
                        *b = first;
                    }
                    let _ = parse_opening(&buf);
                    let _ = parse_socks5_request(&buf);
                }
            }
        }
    }
}
