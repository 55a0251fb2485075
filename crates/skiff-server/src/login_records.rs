//! Login records as sshd keeps them for a session with a terminal (its
//! loginrec.c and session.c's login messages): what goes in each field of
//! the utmp/wtmp entry written when the session starts and ends, and of the
//! btmp entry of a login as an unknown user, the lastlog file's record
//! (its layout, read and written), and what an
//! interactive login is shown first (`PrintLastLog`'s "Last login:" line
//! and `PrintMotd`'s /etc/motd, both hushed by `~/.hushlogin`). Pure: the
//! files and glibc's utmpx calls are [`crate::login_writer`]'s.

#![forbid(unsafe_code)]

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Sizes of the text fields of glibc's `struct utmpx` (and of lastlog's).
pub const LINE_SIZE: usize = 32;
pub const USER_SIZE: usize = 32;
pub const HOST_SIZE: usize = 256;
/// `ut_id`: the line's last characters.
pub const ID_SIZE: usize = 4;

/// A lastlog record: `int32_t ll_time; char ll_line[32]; char ll_host[256]`,
/// the one for uid N at offset N times its size.
pub const LASTLOG_RECORD: usize = 4 + LINE_SIZE + HOST_SIZE;

/// Which record a session writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `USER_PROCESS`, when the session's process starts.
    Login,
    /// `DEAD_PROCESS` for the same line, when it has ended.
    Logout,
    /// `LOGIN_PROCESS` in btmp: a failed login.
    Failed,
}

/// The line btmp entries name, as sshd's do.
pub const FAILED_LINE: &str = "ssh:notty";

/// What is known of a session with a terminal when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    /// The terminal's path (`/dev/pts/3`).
    pub tty: String,
    pub user: String,
    /// The client's address (skiffd looks up no names), `None` when the
    /// connection is not a socket.
    pub addr: Option<IpAddr>,
    /// The session's process.
    pub pid: i32,
}

/// The fields of one utmpx entry, each at its size (NUL-padded; a value
/// that fills its field has no NUL, as with strncpy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UtmpFields {
    pub kind: Kind,
    pub pid: i32,
    pub line: [u8; LINE_SIZE],
    pub id: [u8; ID_SIZE],
    pub user: [u8; USER_SIZE],
    pub host: [u8; HOST_SIZE],
    /// Seconds and microseconds since the epoch.
    pub seconds: i64,
    pub micros: i32,
    /// `ut_addr_v6` as bytes in network order: an IPv4 address fills the
    /// first four.
    pub addr: [u8; 16],
}

/// The terminal's name in utmp: its path without `/dev/` (`pts/3`).
pub fn line_of(tty: &str) -> &str {
    tty.strip_prefix("/dev/").unwrap_or(tty)
}

/// `ut_id`: the last [`ID_SIZE`] bytes of the line (`ts/3` for `pts/3`).
pub fn id_of(line: &str) -> [u8; ID_SIZE] {
    let bytes = line.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(ID_SIZE)..];
    fixed(tail)
}

/// The client as utmp and lastlog name it: its address, an IPv4 one
/// mapped into IPv6 written as IPv4 (as sshd does); empty when unknown.
pub fn host_of(addr: Option<IpAddr>) -> String {
    addr.map(|a| a.to_canonical().to_string())
        .unwrap_or_default()
}

/// `bytes` in a field of `N` bytes: cut to fit, NUL-padded.
pub fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut field = [0u8; N];
    let n = bytes.len().min(N);
    field[..n].copy_from_slice(&bytes[..n]);
    field
}

/// A field's text: up to its first NUL, invalid UTF-8 replaced.
pub fn text_of(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn since_epoch(time: SystemTime) -> (i64, i32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_micros() as i32,
        ),
        Err(_) => (0, 0),
    }
}

/// The entry `kind` writes for `login` at `time`. A logout keeps the line,
/// its id and the pid and empties the rest, as logout(3) does, so readers
/// (`who`, `last`) see the line free.
pub fn fields(login: &Login, kind: Kind, time: SystemTime) -> UtmpFields {
    let line = line_of(&login.tty);
    let (seconds, micros) = since_epoch(time);
    let mut entry = UtmpFields {
        kind,
        pid: login.pid,
        line: fixed(line.as_bytes()),
        id: id_of(line),
        user: [0; USER_SIZE],
        host: [0; HOST_SIZE],
        seconds,
        micros,
        addr: [0; 16],
    };
    if kind == Kind::Login {
        entry.user = fixed(login.user.as_bytes());
        entry.host = fixed(host_of(login.addr).as_bytes());
        entry.addr = match login.addr.map(|a| a.to_canonical()) {
            Some(IpAddr::V4(v4)) => fixed(&v4.octets()),
            Some(IpAddr::V6(v6)) => v6.octets(),
            None => [0; 16],
        };
    }
    entry
}

/// The btmp entry of a login as `user` that failed, from `addr`, seen by
/// the server process `pid`: no terminal, so the line is
/// [`FAILED_LINE`] and the id empty.
pub fn failed_fields(user: &str, addr: Option<IpAddr>, pid: i32, time: SystemTime) -> UtmpFields {
    let mut entry = fields(
        &Login {
            tty: FAILED_LINE.into(),
            user: user.into(),
            addr,
            pid,
        },
        Kind::Login,
        time,
    );
    entry.kind = Kind::Failed;
    entry.id = [0; ID_SIZE];
    entry
}

/// Whether a btmp file with this owner and mode may be written: it holds
/// what people typed as their name (sometimes a password), so, as sshd
/// insists, it must be root's and closed to others (and not executable).
pub fn btmp_private(owner: u32, mode: u32) -> bool {
    owner == 0 && mode & 0o017 == 0
}

/// One lastlog record: when, on which line and from where the account
/// last logged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastLog {
    /// Seconds since the epoch (the file's field has 32 bits).
    pub time: u32,
    pub line: String,
    pub host: String,
}

/// Reads a record; `None` when it is short or says no login (time 0).
pub fn parse_lastlog(record: &[u8]) -> Option<LastLog> {
    let record = record.get(..LASTLOG_RECORD)?;
    let time = u32::from_ne_bytes(record[..4].try_into().ok()?);
    if time == 0 {
        return None;
    }
    Some(LastLog {
        time,
        line: text_of(&record[4..4 + LINE_SIZE]),
        host: text_of(&record[4 + LINE_SIZE..]),
    })
}

/// The record a login at `time` on `line` from `host` leaves.
pub fn lastlog_record(time: SystemTime, line: &str, host: &str) -> [u8; LASTLOG_RECORD] {
    let (seconds, _) = since_epoch(time);
    let mut record = [0u8; LASTLOG_RECORD];
    let seconds = u32::try_from(seconds).unwrap_or(u32::MAX);
    record[..4].copy_from_slice(&seconds.to_ne_bytes());
    record[4..4 + LINE_SIZE].copy_from_slice(&fixed::<LINE_SIZE>(line.as_bytes()));
    record[4 + LINE_SIZE..].copy_from_slice(&fixed::<HOST_SIZE>(host.as_bytes()));
    record
}

/// Where uid's record starts in the lastlog file.
pub fn lastlog_offset(uid: u32) -> u64 {
    u64::from(uid) * LASTLOG_RECORD as u64
}

/// A time broken down in the local time zone (as `struct tm` has it:
/// weekday 0 is Sunday, month 0 January).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub weekday: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// ctime(3)'s text without its newline: `Thu Nov 26 06:17:14 2026`, the
/// day of the month padded with a space.
pub fn ctime_text(t: &LocalTime) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS.get(t.weekday as usize).unwrap_or(&"???"),
        MONTHS.get(t.month as usize).unwrap_or(&"???"),
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.year
    )
}

/// Whether an interactive login shows anything first: only a shell with a
/// terminal (a command, forced or asked for, runs quietly, as in sshd),
/// and not for an account with `~/.hushlogin` (`hushed`, asked last).
pub fn greets(pty: bool, command: bool, hushed: impl FnOnce() -> bool) -> bool {
    pty && !command && !hushed()
}

/// What the settings want shown first in an interactive login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    /// `PrintLastLog`.
    pub last_login: bool,
    /// `PrintMotd`.
    pub motd: bool,
}

/// The text a greeted login is shown (on its terminal, so lines end in
/// CR LF): sshd's "Last login: DATE from HOST" line when there is a
/// previous login (`when` is its date as [`ctime_text`] gives it), then
/// the message of the day.
pub fn greeting_text(
    wanted: Greeting,
    last: Option<(&LastLog, &str)>,
    motd: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::new();
    if let (true, Some((last, when))) = (wanted.last_login, last) {
        let line = match last.host.as_str() {
            "" => format!("Last login: {when}\r\n"),
            host => format!("Last login: {when} from {host}\r\n"),
        };
        out.extend_from_slice(line.as_bytes());
    }
    if let (true, Some(motd)) = (wanted.motd, motd) {
        out.extend_from_slice(&on_terminal(motd));
    }
    out
}

/// Text as a terminal that turns newlines into CR LF shows it.
pub fn on_terminal(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 16);
    let mut previous = 0u8;
    for &b in text {
        if b == b'\n' && previous != b'\r' {
            out.push(b'\r');
        }
        out.push(b);
        previous = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    fn login(addr: Option<IpAddr>) -> Login {
        Login {
            tty: "/dev/pts/17".into(),
            user: "alice".into(),
            addr,
            pid: 4242,
        }
    }

    #[test]
    fn a_login_entry_names_line_user_host_and_address() {
        let at = UNIX_EPOCH + Duration::new(1_764_000_000, 123_456_789);
        let e = fields(
            &login(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)))),
            Kind::Login,
            at,
        );
        assert_eq!(e.kind, Kind::Login);
        assert_eq!(e.pid, 4242);
        assert_eq!(text_of(&e.line), "pts/17");
        assert_eq!(&e.id, b"s/17");
        assert_eq!(text_of(&e.user), "alice");
        assert_eq!(text_of(&e.host), "192.0.2.7");
        assert_eq!((e.seconds, e.micros), (1_764_000_000, 123_456));
        assert_eq!(e.addr[..4], [192, 0, 2, 7]);
        assert_eq!(e.addr[4..], [0; 12]);
    }

    #[test]
    fn a_logout_entry_keeps_the_line_and_empties_the_rest() {
        let e = fields(
            &login(Some(IpAddr::V6(Ipv6Addr::LOCALHOST))),
            Kind::Logout,
            UNIX_EPOCH + Duration::from_secs(5),
        );
        assert_eq!(e.kind, Kind::Logout);
        assert_eq!(text_of(&e.line), "pts/17");
        assert_eq!(&e.id, b"s/17");
        assert_eq!(e.pid, 4242);
        assert_eq!(e.user, [0; USER_SIZE]);
        assert_eq!(e.host, [0; HOST_SIZE]);
        assert_eq!(e.addr, [0; 16]);
        assert_eq!(e.seconds, 5);
    }

    #[test]
    fn addresses_and_short_lines() {
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        let e = fields(&login(Some(mapped)), Kind::Login, UNIX_EPOCH);
        assert_eq!(text_of(&e.host), "10.1.2.3");
        assert_eq!(e.addr[..4], [10, 1, 2, 3]);
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let e = fields(&login(Some(v6)), Kind::Login, UNIX_EPOCH);
        assert_eq!(text_of(&e.host), "2001:db8::1");
        assert_eq!(e.addr[..2], [0x20, 0x01]);
        let e = fields(&login(None), Kind::Login, UNIX_EPOCH);
        assert_eq!(e.host, [0; HOST_SIZE]);
        assert_eq!(&id_of("tty1"), b"tty1");
        assert_eq!(&id_of("p1"), b"p1\0\0");
        assert_eq!(line_of("pts/0"), "pts/0");
    }

    #[test]
    fn long_values_are_cut_to_their_field_without_a_nul() {
        let mut l = login(None);
        l.user = "u".repeat(40);
        l.tty = format!("/dev/{}", "x".repeat(40));
        let e = fields(&l, Kind::Login, UNIX_EPOCH);
        assert_eq!(e.user, [b'u'; USER_SIZE]);
        assert_eq!(text_of(&e.user).len(), USER_SIZE);
        assert_eq!(e.line, [b'x'; LINE_SIZE]);
        let host: [u8; HOST_SIZE] = fixed("h".repeat(300).as_bytes());
        assert_eq!(text_of(&host).len(), HOST_SIZE);
    }

    #[test]
    fn a_failed_login_names_no_terminal_and_needs_a_private_btmp() {
        let e = failed_fields(
            "mallory",
            Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9))),
            77,
            UNIX_EPOCH + Duration::from_secs(9),
        );
        assert_eq!(e.kind, Kind::Failed);
        assert_eq!(text_of(&e.line), "ssh:notty");
        assert_eq!(e.id, [0; ID_SIZE]);
        assert_eq!(text_of(&e.user), "mallory");
        assert_eq!(text_of(&e.host), "192.0.2.9");
        assert_eq!((e.pid, e.seconds), (77, 9));
        assert!(btmp_private(0, 0o100660));
        assert!(btmp_private(0, 0o600));
        assert!(!btmp_private(0, 0o664), "readable by others");
        assert!(!btmp_private(0, 0o670), "executable by the group");
        assert!(!btmp_private(1000, 0o600), "not root's");
    }

    #[test]
    fn lastlog_records_round_trip_at_their_offset() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let record = lastlog_record(at, "pts/3", "192.0.2.1");
        assert_eq!(record.len(), 292);
        assert_eq!(
            parse_lastlog(&record),
            Some(LastLog {
                time: 1_700_000_000,
                line: "pts/3".into(),
                host: "192.0.2.1".into()
            })
        );
        assert_eq!(parse_lastlog(&[0u8; LASTLOG_RECORD]), None);
        assert_eq!(parse_lastlog(&record[..100]), None);
        assert_eq!(lastlog_offset(0), 0);
        assert_eq!(lastlog_offset(1000), 292_000);
        // A host as long as the field has no NUL, and reads back whole.
        let long = "h".repeat(HOST_SIZE + 10);
        let record = lastlog_record(at, "pts/3", &long);
        assert_eq!(parse_lastlog(&record).unwrap().host.len(), HOST_SIZE);
    }

    #[test]
    fn ctime_style_dates() {
        let t = LocalTime {
            year: 2026,
            month: 10,
            day: 6,
            weekday: 5,
            hour: 7,
            minute: 5,
            second: 9,
        };
        assert_eq!(ctime_text(&t), "Fri Nov  6 07:05:09 2026");
        let t = LocalTime { day: 26, ..t };
        assert_eq!(ctime_text(&t), "Fri Nov 26 07:05:09 2026");
    }

    #[test]
    fn only_a_shell_on_a_terminal_without_hushlogin_is_greeted() {
        assert!(greets(true, false, || false));
        assert!(!greets(true, false, || true));
        let not_asked = || -> bool { panic!("~/.hushlogin looked up for a command") };
        assert!(!greets(true, true, not_asked));
        assert!(!greets(false, false, not_asked));
    }

    #[test]
    fn the_greeting_has_what_the_settings_ask_for() {
        let last = LastLog {
            time: 1,
            line: "pts/1".into(),
            host: "192.0.2.9".into(),
        };
        let when = "Thu Nov 26 06:17:14 2026";
        let both = Greeting {
            last_login: true,
            motd: true,
        };
        let text = greeting_text(both, Some((&last, when)), Some(b"Hello\nthere\r\n"));
        assert_eq!(
            text,
            b"Last login: Thu Nov 26 06:17:14 2026 from 192.0.2.9\r\nHello\r\nthere\r\n"
        );
        // No earlier login, no line; no motd file, nothing of it.
        assert_eq!(greeting_text(both, None, None), b"");
        let nowhere = LastLog {
            host: String::new(),
            ..last.clone()
        };
        assert_eq!(
            greeting_text(both, Some((&nowhere, when)), None),
            b"Last login: Thu Nov 26 06:17:14 2026\r\n"
        );
        let motd_only = Greeting {
            last_login: false,
            motd: true,
        };
        assert_eq!(
            greeting_text(motd_only, Some((&last, when)), Some(b"m\n")),
            b"m\r\n"
        );
        let last_only = Greeting {
            last_login: true,
            motd: false,
        };
        assert!(greeting_text(last_only, Some((&last, when)), Some(b"m\n"))
            .starts_with(b"Last login: "));
        assert!(!greeting_text(last_only, Some((&last, when)), Some(b"m\n")).ends_with(b"m\r\n"));
    }
}
