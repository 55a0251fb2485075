//! The messages between skiffd and a connection's PAM session process
//! (`skiffd --pam-session`, see skiff-server's `pam_session`): open the session,
//! start a process in it (its descriptors travel beside the message as
//! `SCM_RIGHTS`), signal one, and the answers. One message per datagram of
//! a `SOCK_SEQPACKET` socket: a tag byte, then the fields in order
//! (numbers big-endian, strings and byte strings with a 32-bit length,
//! lists with a 32-bit count). Pure: encoding and bounds-checked decoding,
//! no I/O.

/// The largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// What to run in the session: `crate::spawn::Plan` without its
/// descriptors, which go beside the message (stdin, stdout, stderr and,
/// when `extra`, the one that becomes fd 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnPlan {
    pub program: Vec<u8>,
    pub args: Vec<Vec<u8>>,
    pub env: Vec<(String, String)>,
    pub cwd: Vec<u8>,
    pub root: Option<Vec<u8>>,
    pub controlling_tty: bool,
    /// uid, gid, supplementary groups; `None` keeps root's.
    pub credentials: Option<(u32, u32, Vec<u32>)>,
    pub extra: bool,
}

/// skiffd to the session process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToSession {
    /// Must come first, once: `pam_start`, `pam_setcred`,
    /// `pam_open_session`.
    Open {
        service: String,
        user: String,
        rhost: Option<String>,
        tty: String,
    },
    Spawn(SpawnPlan),
    Signal {
        pid: i32,
        signal: i32,
        group: bool,
    },
}

/// The session process to skiffd. Each `Open` and `Spawn` gets one
/// answer, in order; `Exited` comes when a started process ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromSession {
    Opened {
        env: Vec<(String, String)>,
        /// What PAM's modules said while opening (pam_motd, pam_mail).
        messages: Vec<String>,
    },
    Refused(String),
    Started {
        pid: i32,
    },
    NotStarted(String),
    /// A raw wait status.
    Exited {
        pid: i32,
        status: i32,
    },
}

pub use crate::wire_codec::WireError;
use crate::wire_codec::{Reader, Writer};

fn checked(bytes: &[u8]) -> Result<Reader<'_>, WireError> {
    Reader::checked(bytes, MAX_MESSAGE)
}

impl ToSession {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            ToSession::Open {
                service,
                user,
                rhost,
                tty,
            } => {
                w.u8(1);
                w.bytes(service.as_bytes());
                w.bytes(user.as_bytes());
                w.u8(rhost.is_some() as u8);
                w.bytes(rhost.as_deref().unwrap_or("").as_bytes());
                w.bytes(tty.as_bytes());
            }
            ToSession::Spawn(p) => {
                w.u8(2);
                w.bytes(&p.program);
                w.u32(p.args.len() as u32);
                for a in &p.args {
                    w.bytes(a);
                }
                w.pairs(&p.env);
                w.bytes(&p.cwd);
                w.u8(p.root.is_some() as u8);
                w.bytes(p.root.as_deref().unwrap_or(b""));
                w.u8(p.controlling_tty as u8);
                match &p.credentials {
                    None => w.u8(0),
                    Some((uid, gid, groups)) => {
                        w.u8(1);
                        w.u32(*uid);
                        w.u32(*gid);
                        w.u32(groups.len() as u32);
                        for g in groups {
                            w.u32(*g);
                        }
                    }
                }
                w.u8(p.extra as u8);
            }
            ToSession::Signal { pid, signal, group } => {
                w.u8(3);
                w.i32(*pid);
                w.i32(*signal);
                w.u8(*group as u8);
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<ToSession, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => {
                let service = r.string()?;
                let user = r.string()?;
                let has_rhost = r.bool()?;
                let rhost = r.string()?;
                let tty = r.string()?;
                ToSession::Open {
                    service,
                    user,
                    rhost: has_rhost.then_some(rhost),
                    tty,
                }
            }
            2 => {
                let program = r.bytes()?;
                let n = r.count(4)?;
                let args = (0..n).map(|_| r.bytes()).collect::<Result<_, _>>()?;
                let env = r.pairs()?;
                let cwd = r.bytes()?;
                let has_root = r.bool()?;
                let root = r.bytes()?;
                let controlling_tty = r.bool()?;
                let credentials = match r.bool()? {
                    false => None,
                    true => {
                        let uid = r.u32()?;
                        let gid = r.u32()?;
                        let n = r.count(4)?;
                        let groups = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
                        Some((uid, gid, groups))
                    }
                };
                let extra = r.bool()?;
                ToSession::Spawn(SpawnPlan {
                    program,
                    args,
                    env,
                    cwd,
                    root: has_root.then_some(root),
                    controlling_tty,
                    credentials,
                    extra,
                })
            }
            3 => ToSession::Signal {
                pid: r.i32()?,
                signal: r.i32()?,
                group: r.bool()?,
            },
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl FromSession {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            FromSession::Opened { env, messages } => {
                w.u8(1);
                w.pairs(env);
                w.strings(messages);
            }
            FromSession::Refused(why) => {
                w.u8(2);
                w.bytes(why.as_bytes());
            }
            FromSession::Started { pid } => {
                w.u8(3);
                w.i32(*pid);
            }
            FromSession::NotStarted(why) => {
                w.u8(4);
                w.bytes(why.as_bytes());
            }
            FromSession::Exited { pid, status } => {
                w.u8(5);
                w.i32(*pid);
                w.i32(*status);
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<FromSession, WireError> {
        let mut r = checked(bytes)?;
        let msg = match r.u8()? {
            1 => FromSession::Opened {
                env: r.pairs()?,
                messages: r.strings()?,
            },
            2 => FromSession::Refused(r.string()?),
            3 => FromSession::Started { pid: r.i32()? },
            4 => FromSession::NotStarted(r.string()?),
            5 => FromSession::Exited {
                pid: r.i32()?,
                status: r.i32()?,
            },
            t => return Err(WireError::Tag(t)),
        };
        r.end()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SpawnPlan {
        SpawnPlan {
            program: b"/bin/sh".to_vec(),
            args: vec![b"-sh".to_vec(), b"-c".to_vec(), b"echo \xff".to_vec()],
            env: vec![
                ("HOME".into(), "/home/a".into()),
                ("E".into(), String::new()),
            ],
            cwd: b"/home/a".to_vec(),
            root: Some(b"/jail".to_vec()),
            controlling_tty: true,
            credentials: Some((1000, 1000, vec![4, 24, 1000])),
            extra: true,
        }
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let to = [
            ToSession::Open {
                service: "skiffd".into(),
                user: "alice".into(),
                rhost: Some("192.0.2.1".into()),
                tty: "ssh".into(),
            },
            ToSession::Open {
                service: "s".into(),
                user: "u".into(),
                rhost: None,
                tty: "/dev/pts/3".into(),
            },
            ToSession::Spawn(plan()),
            ToSession::Spawn(SpawnPlan {
                root: None,
                credentials: None,
                ..plan()
            }),
            ToSession::Signal {
                pid: 42,
                signal: 15,
                group: true,
            },
        ];
        for m in to {
            assert_eq!(ToSession::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
        let from = [
            FromSession::Opened {
                env: vec![("XDG_RUNTIME_DIR".into(), "/run/user/1000".into())],
                messages: vec!["Welcome".into()],
            },
            FromSession::Refused("Permission denied".into()),
            FromSession::Started { pid: 7 },
            FromSession::NotStarted("no such file".into()),
            FromSession::Exited {
                pid: 7,
                status: 256,
            },
        ];
        for m in from {
            assert_eq!(FromSession::decode(&m.encode()), Ok(m.clone()), "{m:?}");
        }
    }

    #[test]
    fn damaged_messages_are_errors() {
        let good = ToSession::Spawn(plan()).encode();
        for cut in 0..good.len() {
            assert!(ToSession::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(ToSession::decode(&long), Err(WireError::Trailing(1)));
        assert_eq!(FromSession::decode(&[9]), Err(WireError::Tag(9)));
        // A count far beyond the message allocates nothing.
        let mut huge = vec![1u8];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(FromSession::decode(&huge), Err(WireError::Short));
        assert_eq!(
            FromSession::decode(&vec![0; MAX_MESSAGE + 1]),
            Err(WireError::TooLong(MAX_MESSAGE + 1, MAX_MESSAGE))
        );
    }
}
