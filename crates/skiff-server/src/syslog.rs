//! skiffd's log sent to the local syslog daemon, as sshd sends its own:
//! one datagram per line to the `/dev/log` socket, RFC 3164-style
//! (`<PRI>Mmm dd hh:mm:ss skiffd[PID]: MESSAGE`), with the facility of
//! `SyslogFacility` and the severity of the line's level. Also the rule
//! that decides where skiffd logs (syslog, stderr or the `-E` file) from
//! its command line.
//!
//! [`Facility`], [`destination`] and [`datagram`] are pure. [`SyslogSender`]
//! does the I/O, and never holds skiffd up: it sends without blocking, and
//! a line it cannot send (no syslog daemon, or one too far behind) is
//! dropped and counted, said once on stderr, and the count is sent once
//! syslog takes lines again. It reconnects by itself when syslog restarts.
//! [`SyslogWriter`] hands it `tracing`'s lines.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// The local syslog socket.
pub const DEV_LOG: &str = "/dev/log";

/// The tag every line carries (`skiffd[PID]:`).
const TAG: &str = "skiffd";

/// The longest datagram sent; a longer line is cut (at a character
/// boundary) and ends with `...`.
pub const MAX_DATAGRAM: usize = 8192;

/// `SyslogFacility`: the facilities sshd accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Facility {
    Daemon,
    User,
    Auth,
    AuthPriv,
    /// `LOCAL0` to `LOCAL7`.
    Local(u8),
}

impl Default for Facility {
    /// sshd's default.
    fn default() -> Self {
        Facility::Auth
    }
}

impl Facility {
    /// Reads sshd's names, in any case.
    pub fn parse(value: &str) -> Result<Facility, String> {
        let upper = value.to_ascii_uppercase();
        Ok(match upper.as_str() {
            "DAEMON" => Facility::Daemon,
            "USER" => Facility::User,
            "AUTH" => Facility::Auth,
            "AUTHPRIV" => Facility::AuthPriv,
            _ => match upper
                .strip_prefix("LOCAL")
                .and_then(|n| n.parse::<u8>().ok())
            {
                Some(n) if n <= 7 && upper.len() == 6 => Facility::Local(n),
                _ => {
                    return Err(format!(
                        "SyslogFacility must be DAEMON, USER, AUTH, AUTHPRIV or LOCAL0 to \
                         LOCAL7, not {value:?}"
                    ))
                }
            },
        })
    }

    /// The name `sshd -T` prints for it.
    pub fn name(self) -> String {
        match self {
            Facility::Daemon => "DAEMON".into(),
            Facility::User => "USER".into(),
            Facility::Auth => "AUTH".into(),
            Facility::AuthPriv => "AUTHPRIV".into(),
            Facility::Local(n) => format!("LOCAL{n}"),
        }
    }

    /// Its number in syslog's PRI (RFC 3164's table).
    pub fn code(self) -> u8 {
        match self {
            Facility::User => 1,
            Facility::Daemon => 3,
            Facility::Auth => 4,
            Facility::AuthPriv => 10,
            Facility::Local(n) => 16 + n.min(7),
        }
    }

    fn from_code(code: u8) -> Facility {
        match code {
            1 => Facility::User,
            3 => Facility::Daemon,
            10 => Facility::AuthPriv,
            16..=23 => Facility::Local(code - 16),
            _ => Facility::Auth,
        }
    }
}

/// A line's severity, from its `tracing` level: errors are `err`,
/// warnings `warning`, info `info`, debug and trace `debug`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Err = 3,
    Warning = 4,
    Info = 6,
    Debug = 7,
}

impl Severity {
    pub fn from_level(level: &tracing::Level) -> Severity {
        match *level {
            tracing::Level::ERROR => Severity::Err,
            tracing::Level::WARN => Severity::Warning,
            tracing::Level::INFO => Severity::Info,
            _ => Severity::Debug,
        }
    }
}

/// PRI: the facility times 8 plus the severity.
pub fn pri(facility: Facility, severity: Severity) -> u8 {
    facility.code() * 8 + severity as u8
}

/// Where skiffd logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Stderr,
    /// `-E FILE`.
    File(PathBuf),
    Syslog,
}

/// The command-line flags that decide the [`Destination`].
#[derive(Debug, Clone, Default)]
pub struct LogFlags {
    /// `-D`: started as sshd is by a service manager.
    pub no_detach: bool,
    /// `-e`.
    pub stderr: bool,
    /// `-d` (any number).
    pub debug: bool,
    /// `-E FILE`.
    pub log_file: Option<PathBuf>,
}

/// Where skiffd logs: the `-E` file when given; else syslog when started
/// as sshd is under a service manager (`-D`) without `-e` or `-d`; else
/// stderr (skiffd's own command line, which never says `-D`, included).
pub fn destination(flags: &LogFlags) -> Destination {
    match &flags.log_file {
        Some(path) => Destination::File(path.clone()),
        None if flags.no_detach && !flags.stderr && !flags.debug => Destination::Syslog,
        None => Destination::Stderr,
    }
}

/// The RFC 3164 timestamp of a local time (`Nov  6 07:01:02`).
pub fn timestamp(local: &chrono::NaiveDateTime) -> String {
    local.format("%b %e %H:%M:%S").to_string()
}

/// One datagram: `<PRI>TIMESTAMP skiffd[PID]: MESSAGE`, the message being
/// `line` without its trailing newline, control characters escaped (so a
/// line is always one message and no text can forge another), cut to
/// [`MAX_DATAGRAM`] bytes.
pub fn datagram(pri: u8, timestamp: &str, pid: u32, line: &str) -> Vec<u8> {
    let message = crate::auth_log::printable(line.trim_end_matches(['\n', '\r']));
    let mut out = format!("<{pri}>{timestamp} {TAG}[{pid}]: ");
    let room = MAX_DATAGRAM.saturating_sub(out.len());
    if message.len() <= room {
        out.push_str(&message);
    } else {
        let mut end = room.saturating_sub(3);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&message[..end]);
        out.push_str("...");
    }
    out.into_bytes()
}

/// What the sender keeps between lines.
#[derive(Debug, Default)]
struct SenderState {
    socket: Option<UnixDatagram>,
    /// Lines dropped since syslog last took one.
    unreported: u64,
    /// Lines dropped in all.
    dropped: u64,
    /// Whether stderr has been told about this outage.
    said: bool,
    /// Never tell stderr (another process does).
    quiet: bool,
}

/// Sends lines to the syslog socket (see the module's rules).
#[derive(Debug)]
pub struct SyslogSender {
    path: PathBuf,
    facility: AtomicU8,
    state: Mutex<SenderState>,
}

impl SyslogSender {
    /// A sender to the socket at `path` ([`DEV_LOG`]), with the default
    /// facility until [`Self::set_facility`]. Nothing is connected yet.
    pub fn new(path: &Path) -> SyslogSender {
        SyslogSender {
            path: path.to_path_buf(),
            facility: AtomicU8::new(Facility::default().code()),
            state: Mutex::new(SenderState::default()),
        }
    }

    /// Leaves telling stderr about an outage to another process (skiffd's
    /// listener does; its connection processes, forked from the zygote
    /// that calls this, count what they drop and report it to syslog
    /// once it takes their lines again).
    pub fn leave_outage_notice_to_the_listener(&self) {
        self.lock().quiet = true;
    }

    /// The configuration's `SyslogFacility`, for the lines to come.
    pub fn set_facility(&self, facility: Facility) {
        self.facility.store(facility.code(), Ordering::Relaxed);
    }

    /// Lines dropped so far because syslog could not take them.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SenderState> {
        // A panic while sending leaves nothing half-done worth refusing.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connect(&self) -> io::Result<UnixDatagram> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(&self.path)?;
        socket.set_nonblocking(true)?;
        Ok(socket)
    }

    /// Sends `line` at `severity`, or drops and counts it.
    pub fn send(&self, severity: Severity, line: &str) {
        let facility = Facility::from_code(self.facility.load(Ordering::Relaxed));
        let now = timestamp(&chrono::Local::now().naive_local());
        // Read at each line: a connection process forked from the one
        // that made the sender logs under its own pid, as sshd's do.
        let pid = std::process::id();
        let message = datagram(pri(facility, severity), &now, pid, line);
        let mut state = self.lock();
        if state.unreported > 0 {
            let note = format!(
                "{} log lines were dropped while syslog could not take them",
                state.unreported
            );
            let note = datagram(pri(facility, Severity::Warning), &now, pid, &note);
            if self.try_send(&mut state, &note).is_ok() {
                state.unreported = 0;
                state.said = false;
            }
        }
        if let Err(e) = self.try_send(&mut state, &message) {
            state.unreported += 1;
            state.dropped += 1;
            if !state.said && !state.quiet {
                state.said = true;
                eprintln!(
                    "skiffd: cannot log to syslog at {}: {e}; log lines are dropped (and \
                     counted) until it takes them again",
                    self.path.display()
                );
            }
        }
    }

    /// One send, connecting first when need be, and once more on a fresh
    /// connection when the old one is gone (syslog restarted).
    fn try_send(&self, state: &mut SenderState, message: &[u8]) -> io::Result<()> {
        for fresh in [false, true] {
            let socket = match state.socket.take() {
                Some(socket) if !fresh => socket,
                _ => self.connect()?,
            };
            match socket.send(message) {
                Ok(_) => {
                    state.socket = Some(socket);
                    return Ok(());
                }
                // Syslog is behind: this line is dropped, the socket kept.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    state.socket = Some(socket);
                    return Err(e);
                }
                Err(e) if fresh => return Err(e),
                Err(_) => {}
            }
        }
        unreachable!("the second attempt returns")
    }
}

/// `tracing`'s writer for syslog: each formatted line, with the severity
/// of its level, becomes one datagram.
#[derive(Debug, Clone)]
pub struct SyslogWriter(pub Arc<SyslogSender>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SyslogWriter {
    type Writer = SyslogLine<'a>;

    fn make_writer(&'a self) -> SyslogLine<'a> {
        SyslogLine {
            sender: &self.0,
            severity: Severity::Info,
            buf: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> SyslogLine<'a> {
        SyslogLine {
            sender: &self.0,
            severity: Severity::from_level(meta.level()),
            buf: Vec::new(),
        }
    }
}

/// One line being formatted; sent when dropped.
pub struct SyslogLine<'a> {
    sender: &'a SyslogSender,
    severity: Severity,
    buf: Vec<u8>,
}

impl io::Write for SyslogLine<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for SyslogLine<'_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.sender
                .send(self.severity, &String::from_utf8_lossy(&self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facilities_read_and_print_as_sshd() {
        for (name, code) in [
            ("DAEMON", 3),
            ("USER", 1),
            ("AUTH", 4),
            ("AUTHPRIV", 10),
            ("LOCAL0", 16),
            ("LOCAL7", 23),
        ] {
            let f = Facility::parse(&name.to_ascii_lowercase()).unwrap();
            assert_eq!((f.name().as_str(), f.code()), (name, code));
            assert_eq!(Facility::from_code(code), f);
        }
        for bad in ["LOCAL8", "LOCAL", "LOCAL01", "KERN", "mail", ""] {
            let e = Facility::parse(bad).unwrap_err();
            assert!(e.contains("SyslogFacility"), "{bad}: {e}");
        }
        assert_eq!(Facility::default(), Facility::Auth);
    }

    #[test]
    fn pri_is_facility_and_severity() {
        assert_eq!(pri(Facility::Auth, Severity::Info), 38);
        assert_eq!(pri(Facility::Local(3), Severity::Info), 158);
        assert_eq!(pri(Facility::AuthPriv, Severity::Err), 83);
        assert_eq!(
            Severity::from_level(&tracing::Level::TRACE),
            Severity::Debug
        );
        assert_eq!(
            Severity::from_level(&tracing::Level::WARN),
            Severity::Warning
        );
    }

    #[test]
    fn the_destination_follows_sshds_flags() {
        let flags = |no_detach, stderr, debug, file: Option<&str>| LogFlags {
            no_detach,
            stderr,
            debug,
            log_file: file.map(PathBuf::from),
        };
        assert_eq!(
            destination(&flags(true, false, false, None)),
            Destination::Syslog
        );
        for f in [
            flags(false, false, false, None),
            flags(true, true, false, None),
            flags(true, false, true, None),
            flags(false, true, false, None),
        ] {
            assert_eq!(destination(&f), Destination::Stderr, "{f:?}");
        }
        assert_eq!(
            destination(&flags(true, true, true, Some("/l"))),
            Destination::File("/l".into())
        );
    }

    #[test]
    fn datagrams_are_one_escaped_line() {
        let at = chrono::NaiveDate::from_ymd_opt(2026, 11, 6)
            .unwrap()
            .and_hms_opt(7, 1, 2)
            .unwrap();
        assert_eq!(timestamp(&at), "Nov  6 07:01:02");
        let d = datagram(38, "Nov  6 07:01:02", 42, "Accepted publickey\n");
        assert_eq!(d, b"<38>Nov  6 07:01:02 skiffd[42]: Accepted publickey");
        let d = datagram(38, "T", 1, "a\nb\x1b[2J\n");
        assert_eq!(d, b"<38>T skiffd[1]: a\\nb\\u{1b}[2J");
        let long = "\u{e9}".repeat(MAX_DATAGRAM);
        let d = String::from_utf8(datagram(38, "T", 1, &long)).unwrap();
        assert!(d.len() <= MAX_DATAGRAM && d.ends_with("..."), "{}", d.len());
    }

    #[test]
    fn lines_are_dropped_and_counted_until_syslog_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let sender = SyslogSender::new(&path);
        sender.set_facility(Facility::Local(3));
        sender.send(Severity::Info, "nobody listens");
        sender.send(Severity::Info, "still nobody");
        assert_eq!(sender.dropped(), 2);

        let syslog = UnixDatagram::bind(&path).unwrap();
        syslog.set_nonblocking(true).unwrap();
        sender.send(Severity::Err, "back");
        let mut buf = [0u8; 1024];
        let mut next = || {
            let n = syslog.recv(&mut buf).expect("a datagram");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        let note = next();
        assert!(note.starts_with("<156>"), "{note}");
        assert!(note.ends_with(": 2 log lines were dropped while syslog could not take them"));
        let line = next();
        assert!(line.starts_with("<155>"), "{line}");
        assert!(
            line.ends_with(&format!(" skiffd[{}]: back", std::process::id())),
            "{line}"
        );

        // Syslog restarts: a new socket at the same path.
        drop(syslog);
        std::fs::remove_file(&path).unwrap();
        let syslog = UnixDatagram::bind(&path).unwrap();
        sender.send(Severity::Info, "after the restart");
        let n = syslog.recv(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with(": after the restart"));
        assert_eq!(sender.dropped(), 2);
    }

    #[test]
    fn a_full_queue_drops_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let _syslog = UnixDatagram::bind(&path).unwrap();
        let sender = SyslogSender::new(&path);
        let line = "x".repeat(4000);
        // Nobody reads: the queue fills, and sending returns each time.
        for _ in 0..10_000 {
            sender.send(Severity::Info, &line);
            if sender.dropped() > 0 {
                return;
            }
        }
        panic!("10000 lines of 4 KB queued with nobody reading");
    }
}
