//! The records of the audit log (`AuditLog PATH`): one JSON object per
//! line, each with the time (RFC 3339, UTC), the connection's id and the
//! peer's address and port, then what happened (`event`) and its details.
//! Pure data and its encoding, no I/O: `crate::audit_writer` appends the
//! lines, the handler fills them in.
//!
//! Nothing secret goes in a record: key fingerprints, never key material;
//! environment variable names at most, never values; no channel data.
//! Strings a client chose (user names, commands, subsystem and forwarding
//! names) are JSON-escaped like any other, so no value can end a line or
//! forge a field; bytes that are not UTF-8 appear as U+FFFD ([`lossy`]).

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What happened, with its details.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A TCP connection was accepted (or inetd handed one over).
    Connect { local: Option<String> },
    /// An authentication request was judged.
    Auth(AuthRecord),
    /// A session channel's command ended.
    Session(SessionRecord),
    /// A subsystem was asked for and started.
    Subsystem { user: String, name: String },
    /// A forwarding channel was opened, or a listener set up.
    Forward(ForwardRecord),
    /// A data-plane transfer (granted streams) ended.
    Transfer(TransferRecord),
    /// The connection ended.
    Disconnect {
        user: Option<String>,
        duration_ms: u64,
        reason: String,
    },
}

/// The outcome of one authentication request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthResult {
    Success,
    /// Accepted, and `AuthenticationMethods` wants another method.
    Partial,
    Failure,
}

/// A certificate's identity, as sshd logs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CertificateInfo {
    pub key_id: String,
    pub serial: u64,
    /// The CA key's type (`ED25519`) and SHA256 fingerprint.
    pub ca_type: String,
    pub ca_fingerprint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthRecord {
    pub user: String,
    pub method: String,
    /// The key's type as sshd names it (`ED25519`, `RSA`, `ECDSA`; with
    /// `-CERT` for a certificate).
    pub key_type: Option<String>,
    pub fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateInfo>,
    pub result: AuthResult,
}

/// How a session channel was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    Exec,
    Shell,
    Subsystem,
}

/// How a session's command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// It exited with this status.
    Exit(i32),
    /// A signal (its number) ended it.
    Signal(i32),
    /// Its status could not be had (always `true`).
    StatusUnknown(bool),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionRecord {
    pub user: String,
    pub kind: SessionKind,
    /// What the client asked to run (`None` for a shell), or the
    /// subsystem's name.
    pub requested: Option<String>,
    /// What ran instead of it (`ForceCommand`, `command=`), if anything did.
    pub forced: Option<String>,
    pub pty: bool,
    #[serde(flatten)]
    pub ending: Ending,
    pub duration_ms: u64,
    /// Bytes the client sent the command, and the command sent the client.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForwardRecord {
    pub user: String,
    /// `direct-tcpip` (-L, -D), `direct-streamlocal`, `tcpip-forward` (-R),
    /// `streamlocal-forward`.
    pub kind: String,
    /// Where the connection goes (`host:port` or a socket path), or what is
    /// listened on.
    pub target: String,
}

/// A data-plane transfer, written when it ends. The server process knows
/// the mode, the streams and the duration itself; the files and their
/// bytes go between the client and the transfer process that runs as the
/// account (skiffd hands it the streams' sockets), so `direction`,
/// `files`, `bytes`, `failed` and `completed` are as that process
/// reported them (`counted_by: "transfer_process"`). A process that ended
/// without reporting leaves them `null` (`completed: false`). The
/// `session` record of its `transfer@skiff` subsystem has the control
/// channel's bytes and the process's exit status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TransferRecord {
    pub user: String,
    /// The data plane's mode: `aead`, `integrity` or `none`; `channel`
    /// when the files went on the SSH channel alone (no streams), either way.
    pub mode: String,
    /// The streams granted (0: the channel alone).
    pub streams: u32,
    /// `upload` (client to server) or `download`.
    pub direction: Option<&'static str>,
    /// Files transferred in full.
    pub files: Option<u64>,
    /// File bytes carried by the data streams or the channel.
    pub bytes: Option<u64>,
    /// Files (or sources) that failed.
    pub failed: Option<u64>,
    /// Whether the transfer ran to its end with nothing failed.
    pub completed: bool,
    /// From the grant of the streams to the transfer's end.
    pub duration_ms: u64,
    /// Who counted `files` and `bytes`: `transfer_process` (the account's
    /// process; skiffd does not see the streams' bytes), or `null`.
    pub counted_by: Option<&'static str>,
}

impl TransferRecord {
    /// The record of a transfer by `user` that ended as `end` says.
    pub fn ended(user: String, end: &crate::stream_relay::TransferEnd) -> TransferRecord {
        let report = end.report.as_ref();
        TransferRecord {
            user,
            mode: match end.streams {
                0 => "channel".into(),
                _ => end.mode.to_string(),
            },
            streams: end.streams,
            direction: report.map(|r| r.direction.as_str()),
            files: report.map(|r| r.files),
            bytes: report.map(|r| r.bytes),
            failed: report.map(|r| r.failed),
            completed: report.is_some_and(|r| r.completed),
            duration_ms: millis(end.duration),
            counted_by: report.map(|_| "transfer_process"),
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub time: String,
    pub conn: String,
    /// The peer's address and port (`None` when unknown: inetd on pipes).
    pub peer: Option<String>,
    pub port: Option<u16>,
    #[serde(flatten)]
    pub event: Event,
}

impl Entry {
    pub fn new(at: SystemTime, conn: &str, peer: Option<SocketAddr>, event: Event) -> Entry {
        Entry {
            time: rfc3339(at),
            conn: conn.to_string(),
            peer: peer.map(|p| p.ip().to_string()),
            port: peer.map(|p| p.port()),
            event,
        }
    }

    /// The record as one line: JSON, then `\n`. serde_json escapes every
    /// control character, so the only newline is the last byte.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|e| {
            // Serialising these types cannot fail; never write half a line.
            format!(
                "{{\"event\":\"unencodable\",\"error\":{:?}}}",
                e.to_string()
            )
            .into_bytes()
        });
        line.push(b'\n');
        line
    }
}

/// Bytes a client sent, as text: invalid UTF-8 becomes U+FFFD.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Milliseconds in `d`, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `at` as RFC 3339 in UTC with milliseconds (`2026-11-26T04:18:50.123Z`).
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard
/// Hinnant's well-known days-to-civil arithmetic).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    fn parse(line: &[u8]) -> serde_json::Value {
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(
            line.iter().filter(|b| **b == b'\n').count(),
            1,
            "one line: {}",
            String::from_utf8_lossy(line)
        );
        serde_json::from_slice(line).expect("valid JSON")
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_795_667_930, 123)), "2026-11-26T04:38:50.123Z");
        assert_eq!(rfc3339(at(4_107_542_399, 999)), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn hostile_strings_stay_inside_their_field() {
        let hostile = "a\"b\\c\nd\re\u{0}f\u{1b}[31m\u{7f}g\u{2028}";
        let command = format!("{hostile}{}", lossy(b"\xff\xfe!"));
        let entry = Entry::new(
            at(0, 0),
            "c1",
            Some("127.0.0.1:2222".parse().unwrap()),
            Event::Session(SessionRecord {
                user: hostile.to_string(),
                kind: SessionKind::Exec,
                requested: Some(command.clone()),
                forced: None,
                pty: false,
                ending: Ending::Exit(3),
                duration_ms: 12,
                bytes_in: 0,
                bytes_out: 5,
            }),
        );
        let line = entry.encode();
        // No raw control byte anywhere in the line but its end.
        assert!(line[..line.len() - 1].iter().all(|b| *b >= 0x20));
        let v = parse(&line);
        assert_eq!(v["user"], hostile);
        assert_eq!(v["requested"], command.as_str());
        assert!(v["requested"]
            .as_str()
            .unwrap()
            .ends_with("\u{fffd}\u{fffd}!"));
        assert_eq!(v["event"], "session");
        assert_eq!(v["exit"], 3);
        assert_eq!(v["peer"], "127.0.0.1");
        assert_eq!(v["port"], 2222);
        // A field name a client might try to smuggle in is not one.
        assert!(v.get("d").is_none());
    }

    #[test]
    fn each_event_encodes_its_fields() {
        let peer = Some("[::1]:40000".parse().unwrap());
        let auth = Entry::new(
            at(0, 0),
            "c2",
            peer,
            Event::Auth(AuthRecord {
                user: "alice".into(),
                method: "publickey".into(),
                key_type: Some("ED25519-CERT".into()),
                fingerprint: Some("SHA256:abc".into()),
                certificate: Some(CertificateInfo {
                    key_id: "alice@ca".into(),
                    serial: 7,
                    ca_type: "ED25519".into(),
                    ca_fingerprint: "SHA256:def".into(),
                }),
                result: AuthResult::Partial,
            }),
        );
        let v = parse(&auth.encode());
        assert_eq!(v["event"], "auth");
        assert_eq!(v["peer"], "::1");
        assert_eq!(v["result"], "partial");
        assert_eq!(v["certificate"]["serial"], 7);
        assert_eq!(v["certificate"]["ca_fingerprint"], "SHA256:def");

        let plain = Event::Auth(AuthRecord {
            user: "bob".into(),
            method: "publickey".into(),
            key_type: Some("ED25519".into()),
            fingerprint: Some("SHA256:x".into()),
            certificate: None,
            result: AuthResult::Failure,
        });
        let v = parse(&Entry::new(at(0, 0), "c", None, plain).encode());
        assert!(v.get("certificate").is_none());
        assert_eq!(v["peer"], serde_json::Value::Null);

        let signal = Event::Session(SessionRecord {
            user: "u".into(),
            kind: SessionKind::Shell,
            requested: None,
            forced: Some("/bin/true".into()),
            pty: true,
            ending: Ending::Signal(9),
            duration_ms: 1,
            bytes_in: 2,
            bytes_out: 3,
        });
        let v = parse(&Entry::new(at(0, 0), "c", peer, signal).encode());
        assert_eq!(v["kind"], "shell");
        assert_eq!(v["signal"], 9);
        assert!(v.get("exit").is_none());
        assert_eq!(v["pty"], true);

        let v = parse(
            &Entry::new(
                at(0, 0),
                "c",
                peer,
                Event::Disconnect {
                    user: None,
                    duration_ms: 5,
                    reason: "closed".into(),
                },
            )
            .encode(),
        );
        assert_eq!(v["event"], "disconnect");
        assert_eq!(v["user"], serde_json::Value::Null);
        let v = parse(
            &Entry::new(
                at(0, 0),
                "c",
                peer,
                Event::Forward(ForwardRecord {
                    user: "u".into(),
                    kind: "direct-tcpip".into(),
                    target: "127.0.0.1:80".into(),
                }),
            )
            .encode(),
        );
        assert_eq!(v["event"], "forward");
        assert_eq!(v["target"], "127.0.0.1:80");
        let v = parse(
            &Entry::new(
                at(0, 0),
                "c",
                peer,
                Event::Connect {
                    local: Some("127.0.0.1:22".into()),
                },
            )
            .encode(),
        );
        assert_eq!(v["event"], "connect");
        let v = parse(
            &Entry::new(
                at(0, 0),
                "c",
                peer,
                Event::Subsystem {
                    user: "u".into(),
                    name: "sftp".into(),
                },
            )
            .encode(),
        );
        assert_eq!(v["name"], "sftp");
        let v = parse(
            &Entry::new(
                at(0, 0),
                "c",
                peer,
                Event::Transfer(TransferRecord::ended(
                    "u".into(),
                    &crate::stream_relay::TransferEnd {
                        mode: skiff_proto::dataplane::Mode::Aead,
                        streams: 4,
                        report: Some(skiff_proto::dataplane::TransferReport {
                            direction: skiff_proto::dataplane::TransferDirection::Download,
                            files: 2,
                            bytes: 5000,
                            failed: 0,
                            completed: true,
                        }),
                        duration: Duration::from_millis(1500),
                    },
                )),
            )
            .encode(),
        );
        assert_eq!(v["event"], "transfer");
        assert_eq!(v["mode"], "aead");
        assert_eq!(v["streams"], 4);
        assert_eq!(v["direction"], "download");
        assert_eq!(v["files"], 2);
        assert_eq!(v["bytes"], 5000);
        assert_eq!(v["failed"], 0);
        assert_eq!(v["completed"], true);
        assert_eq!(v["duration_ms"], 1500);
        assert_eq!(v["counted_by"], "transfer_process");
    }

    /// A transfer process that died without reporting leaves the counts
    /// unknown, and the transfer not completed.
    #[test]
    fn an_unreported_transfer_is_not_completed() {
        let record = TransferRecord::ended(
            "u".into(),
            &crate::stream_relay::TransferEnd {
                mode: skiff_proto::dataplane::Mode::Integrity,
                streams: 1,
                report: None,
                duration: Duration::from_millis(7),
            },
        );
        let v = parse(&Entry::new(at(0, 0), "c", None, Event::Transfer(record)).encode());
        assert_eq!(v["mode"], "integrity");
        assert_eq!(v["completed"], false);
        for field in ["direction", "files", "bytes", "failed", "counted_by"] {
            assert_eq!(v[field], serde_json::Value::Null, "{field}");
        }
        assert_eq!(v["duration_ms"], 7);
    }
}
