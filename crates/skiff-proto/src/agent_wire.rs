//! Wire codec for the local protocol between the `skiff` CLI and the per-user
//! `skiff agent` daemon.
//!
//! This module is sans-IO: it only turns messages into bytes and bytes into
//! messages. The transport (a Unix socket, with file descriptors passed
//! alongside `Exec`) lives elsewhere.
//!
//! # Framing
//!
//! A frame is a `u32` big-endian body length followed by the body. The body is
//! a `u8` tag naming the message, then its fields in declaration order:
//!
//! * integers (`u16`, `u32`, `i32`) are big-endian;
//! * `bool` is one byte, `0` or `1` (anything else is [`WireError::BadValue`]);
//! * strings are a `u32` byte length followed by that many bytes of UTF-8;
//! * `Option<T>` is one byte, `0` (absent) or `1` (present, then `T`);
//! * `Vec<T>` is a `u32` item count followed by the items;
//! * a pair `(A, B)` is `A` then `B`;
//! * `bytes` are a `u32` length followed by that many raw bytes; `u64` is
//!   big-endian.
//!
//! A body longer than [`MAX_FRAME`] is refused with [`WireError::TooLarge`] as
//! soon as the length prefix is seen, before waiting for the rest, so a
//! hostile peer cannot make a reader buffer gigabytes. Inside a frame every
//! length and count is checked against the bytes actually left in the frame,
//! so a bogus count never causes a large allocation.
//!
//! The encoding is canonical: decoding a frame and encoding the result gives
//! back exactly the same bytes.
//!
//! Request tags: `1` Hello, `2` Exec, `3` WindowChange, `4` Status, `5` Stop,
//! `6` Forget, `7` Run, `8` Forward, `9` Subsystem, `10` Control, `11` SubsystemOn,
//! `12` SubsystemKind, `13` SubsystemServer. Reply tags: `1` Hello, `2` Exit, `3` Failed,
//! `4` NeedsUser, `5` Status, `6` Done, `7` RunOutput, `8` RunNotice, `9` RunDone, `10` Opened,
//! `11` Controlled, `12` OpenedOn, `13` OpenedKind, `14` OpenedServer. A [`ServerKind`] is one
//! byte: `0` other, `1` skiffd,
//! `2` OpenSSH (anything else is [`WireError::BadValue`]).
//!
//! A `Run` is answered by any number of `RunOutput`/`RunNotice` frames and
//! one `RunDone` per host (hosts numbered in the order the node set expands
//! to), then `Done`.
//!
//! A `Subsystem` is answered by `Opened` as soon as the channel is open (the
//! CLI then speaks the subsystem's protocol, knowing the round trip), then by
//! the final `Exit`, `Failed` or `NeedsUser`; `Failed` or `NeedsUser` may
//! also come instead of `Opened`, when no channel could be opened.

pub use crate::frame::WireError;
pub use crate::frame::MAX_FRAME;
use crate::frame::{split_frame, Reader, Writer};

/// The protocol version exchanged in `Hello`.
pub const PROTOCOL_VERSION: u32 = 10;

/// The first version that takes `Forward`.
pub const FORWARD_SINCE: u32 = 3;

/// The first version that takes `Subsystem` (and answers `Opened`).
pub const SUBSYSTEM_SINCE: u32 = 5;

/// The first version whose `Failed` says `refused` (kind 9) for a
/// subsystem the server would not start, which `skiff cp` needs to tell a
/// server without the data plane from a failure. `skiff cp` connects
/// directly rather than use an older agent.
pub const REFUSED_KIND_SINCE: u32 = 6;

/// The first version that takes `Control` (and answers `Controlled`).
pub const CONTROL_SINCE: u32 = 7;

/// The first version that takes `SubsystemOn` (and answers `OpenedOn`).
pub const SUBSYSTEM_ON_SINCE: u32 = 8;

/// The first version that takes `SubsystemKind` (and answers `OpenedKind`).
pub const SUBSYSTEM_KIND_SINCE: u32 = 9;

/// The first version that takes `SubsystemServer` (and answers
/// `OpenedServer`).
pub const SUBSYSTEM_SERVER_SINCE: u32 = 10;

/// What software the server of a connection runs, as far as a copy needs
/// to know: a skiffd serves the data plane; an OpenSSH sshd's and a
/// skiffd's SFTP servers answer a request sent before `VERSION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// Neither, as far as its identification line says.
    Other,
    Skiffd,
    OpenSsh,
}

impl ServerKind {
    fn to_byte(self) -> u8 {
        match self {
            ServerKind::Other => 0,
            ServerKind::Skiffd => 1,
            ServerKind::OpenSsh => 2,
        }
    }

    fn from_byte(b: u8) -> Result<ServerKind, WireError> {
        match b {
            0 => Ok(ServerKind::Other),
            1 => Ok(ServerKind::Skiffd),
            2 => Ok(ServerKind::OpenSsh),
            _ => Err(WireError::BadValue("server software")),
        }
    }
}

/// What `ssh -O` asks of the agent about one destination's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlAction {
    /// Whether it holds a live connection (`-O check`).
    Check,
    /// Forget them: commands running on them finish, new commands connect
    /// anew (`-O stop`, `-O exit`).
    Stop,
}

/// `ssh -O` through the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlWire {
    /// The destination, as for `Exec`; `command`, `env`, `pty` and
    /// `subsystem` are unused.
    pub base: ExecWire,
    pub action: ControlAction,
}

/// Everything the agent needs to run one command on a remote host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecWire {
    /// The host as typed on the command line (before config resolution).
    pub host: String,
    /// `-l` / `user@`.
    pub user: Option<String>,
    /// `-p`.
    pub port: Option<u16>,
    /// `-i`, in order.
    pub identity_files: Vec<String>,
    /// `-F`.
    pub config_file: Option<String>,
    /// `-o Keyword=Value`, in order.
    pub options: Vec<String>,
    /// The remote command line.
    pub command: String,
    /// Variables to send to the remote side.
    pub env: Vec<(String, String)>,
    /// The CLI's HOME, SSH_AUTH_SOCK, USER, ... for config resolution.
    pub client_env: Vec<(String, String)>,
    /// A pseudo-terminal request, if any.
    pub pty: Option<PtyWire>,
    /// `-n`: do not read stdin.
    pub no_stdin: bool,
    /// `command` names a subsystem (`sftp`, `transfer@skiff`) to start
    /// instead of a command: how `skiff cp` uses the agent's connection.
    pub subsystem: bool,
}

/// A pseudo-terminal request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtyWire {
    /// The `TERM` value.
    pub term: String,
    /// Width in characters.
    pub cols: u32,
    /// Height in characters.
    pub rows: u32,
    /// `-tt`: fail rather than run without a pty.
    pub required: bool,
}

/// A fan-out (`skiff run`): one command on every host of a node set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunWire {
    /// Everything but the host: user, port, identities, config, options,
    /// command, environment. `host` is empty; `pty` is None; `no_stdin` true.
    pub base: ExecWire,
    /// The hosts as one folded node set (with `user@`/`:port` per host).
    pub hosts: String,
    /// Hosts in progress at once.
    pub parallel: u32,
    /// New connections per second, in thousandths (0: unlimited).
    pub rate_milli: u32,
    /// Per-command time limit in milliseconds (0: none).
    pub timeout_ms: u64,
}

/// `ssh -W host:port` through the agent: a connection from the destination
/// to `to_host:to_port`, joined to the CLI's stdin and stdout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForwardWire {
    /// The destination, as for `Exec`; `command`, `env`, `pty` and
    /// `subsystem` are unused.
    pub base: ExecWire,
    pub to_host: String,
    pub to_port: u16,
}

/// How one host of a fan-out ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEnd {
    /// The command exited with this status.
    Status(u32),
    /// The command was killed by this signal (name without SIG).
    Signal(String),
    /// The channel closed without a status.
    Unknown,
    /// skiff-level failure, with the same kinds as [`Reply::Failed`].
    Failed { kind: u8, message: String },
    /// A failure a person could settle (a passphrase the agent may not ask
    /// for), as [`Reply::NeedsUser`] is for one command: the CLI may try
    /// the host itself.
    NeedsUser { kind: u8, message: String },
}

/// CLI -> agent. `Exec` travels with three file descriptors (stdin, stdout, stderr) attached by the transport.
// `Exec` is much bigger than the rest, but requests are few and short-lived;
// boxing it would only make every construction and match noisier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Version handshake.
    Hello { version: u32 },
    /// Run a command.
    Exec(ExecWire),
    /// The CLI's terminal was resized.
    WindowChange { cols: u32, rows: u32 },
    /// Ask for a human-readable status report.
    Status,
    /// Ask the agent to exit.
    Stop,
    /// Drop any cached connection to `host`.
    Forget { host: String },
    /// Run a command on many hosts; the answer streams back.
    Run(RunWire),
    /// Join stdin and stdout (two file descriptors attached) to a
    /// connection the destination opens; answered with `Exit` when it ends.
    Forward(ForwardWire),
    /// Start the subsystem `command` (`subsystem` set) with the same three
    /// file descriptors as `Exec`; answered with `Opened` once the channel
    /// is open, then as `Exec` is.
    Subsystem(ExecWire),
    /// `Subsystem`, answered with `OpenedOn`, which also says whether the
    /// server is a skiffd (so `skiff cp` may dial its data-plane streams
    /// before their tokens come).
    SubsystemOn(ExecWire),
    /// `Subsystem`, answered with `OpenedKind`, which says what software
    /// the server runs (so `skiff cp` may also ask an sshd's SFTP server
    /// for its limits before it has answered `INIT`).
    SubsystemKind(ExecWire),
    /// `Subsystem`, answered with `OpenedServer`, which also says which
    /// data-plane version a skiffd speaks (so `skiff cp` may offer it a
    /// download on the channel alone).
    SubsystemServer(ExecWire),
    /// `ssh -O check|stop|exit` for one destination; answered with
    /// `Controlled` (or `Failed`, when the destination does not resolve).
    Control(ControlWire),
}

/// agent -> CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Version handshake answer.
    Hello { version: u32, pid: u32 },
    /// The command ended: the exit code the CLI should exit with (already 128+N for signals).
    Exit { code: i32 },
    /// skiff-level failure. kind: 1 config, 2 connect, 3 host key, 4 auth, 5 protocol, 6 channel refused, 7 timeout,
    /// 8 busy (the server closed the connection before authentication), 9 refused (a subsystem,
    /// shell or command the server would not start; older agents send 5 for it), 10 closed
    /// before start (the server closed the channel without answering the request; nothing ran).
    /// A CLI takes kinds it does not know for 5.
    Failed { kind: u8, message: String },
    /// A person must decide (unknown host key under `ask`, a passphrase): the CLI should connect directly.
    NeedsUser { message: String },
    /// Answer to `Request::Status`.
    Status { text: String },
    /// Answer to `Request::Stop` / `Request::Forget`, and the end of a `Run`.
    Done,
    /// Output of host number `host` of a `Run`; `stream` 1 stdout, 2 stderr.
    RunOutput {
        host: u32,
        stream: u8,
        data: Vec<u8>,
    },
    /// A message for the person about host number `host`.
    RunNotice { host: u32, text: String },
    /// Host number `host` of a `Run` has finished.
    RunDone {
        host: u32,
        end: HostEnd,
        duration_us: u64,
    },
    /// The channel of a `Subsystem` request is open; opening it took
    /// `rtt_us` microseconds, one round trip to the server.
    Opened { rtt_us: u64 },
    /// `Opened` for a `SubsystemOn` request; `skiffd`: the server
    /// identified itself as a skiffd.
    OpenedOn { rtt_us: u64, skiffd: bool },
    /// `Opened` for a `SubsystemKind` request; `server`: what the server's
    /// identification line says it is.
    OpenedKind { rtt_us: u64, server: ServerKind },
    /// `Opened` for a `SubsystemServer` request: what the server is, and
    /// the newest data-plane version its identification line says it
    /// speaks (0 when it is not a skiffd).
    OpenedServer {
        rtt_us: u64,
        server: ServerKind,
        data_plane: u32,
    },
    /// Answer to `Request::Control`: how many live connections the
    /// destination had (before a `Stop` forgot them).
    Controlled { live: u32 },
}

// Request tags.
const RQ_HELLO: u8 = 1;
const RQ_EXEC: u8 = 2;
const RQ_WINDOW_CHANGE: u8 = 3;
const RQ_STATUS: u8 = 4;
const RQ_STOP: u8 = 5;
const RQ_FORGET: u8 = 6;
const RQ_RUN: u8 = 7;
const RQ_FORWARD: u8 = 8;
const RQ_SUBSYSTEM: u8 = 9;
const RQ_CONTROL: u8 = 10;
const RQ_SUBSYSTEM_ON: u8 = 11;
const RQ_SUBSYSTEM_KIND: u8 = 12;
const RQ_SUBSYSTEM_SERVER: u8 = 13;

// Reply tags.
const RP_HELLO: u8 = 1;
const RP_EXIT: u8 = 2;
const RP_FAILED: u8 = 3;
const RP_NEEDS_USER: u8 = 4;
const RP_STATUS: u8 = 5;
const RP_DONE: u8 = 6;
const RP_RUN_OUTPUT: u8 = 7;
const RP_RUN_NOTICE: u8 = 8;
const RP_RUN_DONE: u8 = 9;
const RP_OPENED: u8 = 10;
const RP_CONTROLLED: u8 = 11;
const RP_OPENED_ON: u8 = 12;
const RP_OPENED_KIND: u8 = 13;
const RP_OPENED_SERVER: u8 = 14;

// HostEnd tags.
const END_STATUS: u8 = 0;
const END_SIGNAL: u8 = 1;
const END_UNKNOWN: u8 = 2;
const END_FAILED: u8 = 3;
const END_NEEDS_USER: u8 = 4;

// ---------------------------------------------------------------------------
// Encoding

/// Encodes a request as a whole frame (length prefix included).
///
/// A request whose body exceeds [`MAX_FRAME`] (only possible with absurdly
/// long strings) is still encoded, but the peer will refuse it with
/// [`WireError::TooLarge`].
pub fn encode_request(req: &Request) -> Vec<u8> {
    match req {
        Request::Hello { version } => {
            let mut w = Writer::new(RQ_HELLO);
            w.u32(*version);
            w.finish()
        }
        Request::Exec(e) => {
            let mut w = Writer::new(RQ_EXEC);
            encode_exec(&mut w, e);
            w.finish()
        }
        Request::Subsystem(e) => {
            let mut w = Writer::new(RQ_SUBSYSTEM);
            encode_exec(&mut w, e);
            w.finish()
        }
        Request::SubsystemOn(e) => {
            let mut w = Writer::new(RQ_SUBSYSTEM_ON);
            encode_exec(&mut w, e);
            w.finish()
        }
        Request::SubsystemKind(e) => {
            let mut w = Writer::new(RQ_SUBSYSTEM_KIND);
            encode_exec(&mut w, e);
            w.finish()
        }
        Request::SubsystemServer(e) => {
            let mut w = Writer::new(RQ_SUBSYSTEM_SERVER);
            encode_exec(&mut w, e);
            w.finish()
        }
        Request::Run(r) => {
            let mut w = Writer::new(RQ_RUN);
            encode_exec(&mut w, &r.base);
            w.str(&r.hosts);
            w.u32(r.parallel);
            w.u32(r.rate_milli);
            w.u64(r.timeout_ms);
            w.finish()
        }
        Request::Forward(f) => {
            let mut w = Writer::new(RQ_FORWARD);
            encode_exec(&mut w, &f.base);
            w.str(&f.to_host);
            w.u16(f.to_port);
            w.finish()
        }
        Request::WindowChange { cols, rows } => {
            let mut w = Writer::new(RQ_WINDOW_CHANGE);
            w.u32(*cols);
            w.u32(*rows);
            w.finish()
        }
        Request::Control(c) => {
            let mut w = Writer::new(RQ_CONTROL);
            encode_exec(&mut w, &c.base);
            w.u8(match c.action {
                ControlAction::Check => 0,
                ControlAction::Stop => 1,
            });
            w.finish()
        }
        Request::Status => Writer::new(RQ_STATUS).finish(),
        Request::Stop => Writer::new(RQ_STOP).finish(),
        Request::Forget { host } => {
            let mut w = Writer::new(RQ_FORGET);
            w.str(host);
            w.finish()
        }
    }
}

/// The fields of an [`ExecWire`], in order.
fn encode_exec(w: &mut Writer, e: &ExecWire) {
    w.str(&e.host);
    w.opt_str(e.user.as_deref());
    match e.port {
        None => w.u8(0),
        Some(p) => {
            w.u8(1);
            w.u16(p);
        }
    }
    w.strs(&e.identity_files);
    w.opt_str(e.config_file.as_deref());
    w.strs(&e.options);
    w.str(&e.command);
    w.pairs(&e.env);
    w.pairs(&e.client_env);
    match &e.pty {
        None => w.u8(0),
        Some(p) => {
            w.u8(1);
            w.str(&p.term);
            w.u32(p.cols);
            w.u32(p.rows);
            w.bool(p.required);
        }
    }
    w.bool(e.no_stdin);
    w.bool(e.subsystem);
}

/// Encodes a reply as a whole frame (length prefix included).
///
/// As with [`encode_request`], an oversized body is encoded but will be
/// refused by the peer.
pub fn encode_reply(rep: &Reply) -> Vec<u8> {
    match rep {
        Reply::Hello { version, pid } => {
            let mut w = Writer::new(RP_HELLO);
            w.u32(*version);
            w.u32(*pid);
            w.finish()
        }
        Reply::Exit { code } => {
            let mut w = Writer::new(RP_EXIT);
            w.i32(*code);
            w.finish()
        }
        Reply::Failed { kind, message } => {
            let mut w = Writer::new(RP_FAILED);
            w.u8(*kind);
            w.str(message);
            w.finish()
        }
        Reply::NeedsUser { message } => {
            let mut w = Writer::new(RP_NEEDS_USER);
            w.str(message);
            w.finish()
        }
        Reply::Status { text } => {
            let mut w = Writer::new(RP_STATUS);
            w.str(text);
            w.finish()
        }
        Reply::Done => Writer::new(RP_DONE).finish(),
        Reply::Controlled { live } => {
            let mut w = Writer::new(RP_CONTROLLED);
            w.u32(*live);
            w.finish()
        }
        Reply::OpenedOn { rtt_us, skiffd } => {
            let mut w = Writer::new(RP_OPENED_ON);
            w.u64(*rtt_us);
            w.bool(*skiffd);
            w.finish()
        }
        Reply::OpenedKind { rtt_us, server } => {
            let mut w = Writer::new(RP_OPENED_KIND);
            w.u64(*rtt_us);
            w.u8(server.to_byte());
            w.finish()
        }
        Reply::OpenedServer {
            rtt_us,
            server,
            data_plane,
        } => {
            let mut w = Writer::new(RP_OPENED_SERVER);
            w.u64(*rtt_us);
            w.u8(server.to_byte());
            w.u32(*data_plane);
            w.finish()
        }
        Reply::Opened { rtt_us } => {
            let mut w = Writer::new(RP_OPENED);
            w.u64(*rtt_us);
            w.finish()
        }
        Reply::RunOutput { host, stream, data } => {
            let mut w = Writer::new(RP_RUN_OUTPUT);
            w.u32(*host);
            w.u8(*stream);
            w.bytes(data);
            w.finish()
        }
        Reply::RunNotice { host, text } => {
            let mut w = Writer::new(RP_RUN_NOTICE);
            w.u32(*host);
            w.str(text);
            w.finish()
        }
        Reply::RunDone {
            host,
            end,
            duration_us,
        } => {
            let mut w = Writer::new(RP_RUN_DONE);
            w.u32(*host);
            match end {
                HostEnd::Status(code) => {
                    w.u8(END_STATUS);
                    w.u32(*code);
                }
                HostEnd::Signal(name) => {
                    w.u8(END_SIGNAL);
                    w.str(name);
                }
                HostEnd::Unknown => w.u8(END_UNKNOWN),
                HostEnd::Failed { kind, message } => {
                    w.u8(END_FAILED);
                    w.u8(*kind);
                    w.str(message);
                }
                HostEnd::NeedsUser { kind, message } => {
                    w.u8(END_NEEDS_USER);
                    w.u8(*kind);
                    w.str(message);
                }
            }
            w.u64(*duration_us);
            w.finish()
        }
    }
}

// ---------------------------------------------------------------------------
// Decoding

/// Decodes one request from the front of `buf`, which may hold a partial
/// frame or several frames.
///
/// `Ok(None)`: need more bytes. `Ok(Some((req, consumed)))`: one request and
/// how many bytes of `buf` it used. An error means the stream is corrupt.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Request, usize)>, WireError> {
    let Some((body, consumed)) = split_frame(buf)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let req = match r.u8()? {
        RQ_HELLO => Request::Hello { version: r.u32()? },
        RQ_EXEC => Request::Exec(decode_exec(&mut r)?),
        RQ_SUBSYSTEM => Request::Subsystem(decode_exec(&mut r)?),
        RQ_SUBSYSTEM_ON => Request::SubsystemOn(decode_exec(&mut r)?),
        RQ_SUBSYSTEM_KIND => Request::SubsystemKind(decode_exec(&mut r)?),
        RQ_SUBSYSTEM_SERVER => Request::SubsystemServer(decode_exec(&mut r)?),
        RQ_WINDOW_CHANGE => Request::WindowChange {
            cols: r.u32()?,
            rows: r.u32()?,
        },
        RQ_STATUS => Request::Status,
        RQ_STOP => Request::Stop,
        RQ_FORGET => Request::Forget { host: r.str()? },
        RQ_RUN => Request::Run(RunWire {
            base: decode_exec(&mut r)?,
            hosts: r.str()?,
            parallel: r.u32()?,
            rate_milli: r.u32()?,
            timeout_ms: r.u64()?,
        }),
        RQ_FORWARD => Request::Forward(ForwardWire {
            base: decode_exec(&mut r)?,
            to_host: r.str()?,
            to_port: r.u16()?,
        }),
        RQ_CONTROL => Request::Control(ControlWire {
            base: decode_exec(&mut r)?,
            action: match r.u8()? {
                0 => ControlAction::Check,
                1 => ControlAction::Stop,
                _ => return Err(WireError::BadValue("control action")),
            },
        }),
        tag => return Err(WireError::UnknownTag(tag)),
    };
    r.end()?;
    Ok(Some((req, consumed)))
}

fn decode_exec(r: &mut Reader<'_>) -> Result<ExecWire, WireError> {
    let host = r.str()?;
    let user = r.opt_str("user presence flag")?;
    let port = if r.present("port presence flag")? {
        Some(r.u16()?)
    } else {
        None
    };
    let identity_files = r.strs()?;
    let config_file = r.opt_str("config_file presence flag")?;
    let options = r.strs()?;
    let command = r.str()?;
    let env = r.pairs()?;
    let client_env = r.pairs()?;
    let pty = if r.present("pty presence flag")? {
        Some(PtyWire {
            term: r.str()?,
            cols: r.u32()?,
            rows: r.u32()?,
            required: r.bool("pty required flag")?,
        })
    } else {
        None
    };
    let no_stdin = r.bool("no_stdin flag")?;
    let subsystem = r.bool("subsystem flag")?;
    Ok(ExecWire {
        host,
        user,
        port,
        identity_files,
        config_file,
        options,
        command,
        env,
        client_env,
        pty,
        no_stdin,
        subsystem,
    })
}

/// Decodes one reply from the front of `buf`, which may hold a partial frame
/// or several frames.
///
/// `Ok(None)`: need more bytes. `Ok(Some((reply, consumed)))`: one reply and
/// how many bytes of `buf` it used. An error means the stream is corrupt.
pub fn decode_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, WireError> {
    let Some((body, consumed)) = split_frame(buf)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let rep = match r.u8()? {
        RP_HELLO => Reply::Hello {
            version: r.u32()?,
            pid: r.u32()?,
        },
        RP_EXIT => Reply::Exit { code: r.i32()? },
        RP_FAILED => Reply::Failed {
            kind: r.u8()?,
            message: r.str()?,
        },
        RP_NEEDS_USER => Reply::NeedsUser { message: r.str()? },
        RP_STATUS => Reply::Status { text: r.str()? },
        RP_DONE => Reply::Done,
        RP_OPENED => Reply::Opened { rtt_us: r.u64()? },
        RP_OPENED_ON => Reply::OpenedOn {
            rtt_us: r.u64()?,
            skiffd: r.bool("server kind")?,
        },
        RP_OPENED_KIND => Reply::OpenedKind {
            rtt_us: r.u64()?,
            server: ServerKind::from_byte(r.u8()?)?,
        },
        RP_OPENED_SERVER => Reply::OpenedServer {
            rtt_us: r.u64()?,
            server: ServerKind::from_byte(r.u8()?)?,
            data_plane: r.u32()?,
        },
        RP_CONTROLLED => Reply::Controlled { live: r.u32()? },
        RP_RUN_OUTPUT => Reply::RunOutput {
            host: r.u32()?,
            stream: r.u8()?,
            data: r.bytes()?,
        },
        RP_RUN_NOTICE => Reply::RunNotice {
            host: r.u32()?,
            text: r.str()?,
        },
        RP_RUN_DONE => Reply::RunDone {
            host: r.u32()?,
            end: match r.u8()? {
                END_STATUS => HostEnd::Status(r.u32()?),
                END_SIGNAL => HostEnd::Signal(r.str()?),
                END_UNKNOWN => HostEnd::Unknown,
                END_FAILED => HostEnd::Failed {
                    kind: r.u8()?,
                    message: r.str()?,
                },
                END_NEEDS_USER => HostEnd::NeedsUser {
                    kind: r.u8()?,
                    message: r.str()?,
                },
                _ => return Err(WireError::BadValue("host end tag")),
            },
            duration_us: r.u64()?,
        },
        tag => return Err(WireError::UnknownTag(tag)),
    };
    r.end()?;
    Ok(Some((rep, consumed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_exec() -> ExecWire {
        ExecWire {
            host: "példa.example".into(),
            user: Some("ünïcødé 🚀".into()),
            port: Some(65535),
            identity_files: vec!["~/.ssh/id_ed25519".into(), String::new()],
            config_file: Some("/etc/skiff/config".into()),
            options: vec!["StrictHostKeyChecking=accept-new".into(), "Port=22".into()],
            command: "echo 'hi' && ls -la /tmp".into(),
            env: vec![
                ("LANG".into(), "C.UTF-8".into()),
                (String::new(), String::new()),
            ],
            client_env: vec![
                ("HOME".into(), "/home/me".into()),
                ("SSH_AUTH_SOCK".into(), "/run/user/1000/agent".into()),
                ("USER".into(), "me".into()),
            ],
            pty: Some(PtyWire {
                term: "xterm-256color".into(),
                cols: 80,
                rows: 24,
                required: true,
            }),
            no_stdin: true,
            subsystem: false,
        }
    }

    fn all_requests() -> Vec<Request> {
        let big: Vec<String> = (0..5000).map(|i| format!("Opt{i}=value{i}")).collect();
        let big_env: Vec<(String, String)> = (0..2000)
            .map(|i| (format!("K{i}"), "v".repeat(i % 17)))
            .collect();
        vec![
            Request::Hello { version: 0 },
            Request::Hello {
                version: PROTOCOL_VERSION,
            },
            Request::Hello { version: u32::MAX },
            Request::Exec(ExecWire::default()),
            Request::Exec(full_exec()),
            Request::Exec(ExecWire {
                port: Some(0),
                pty: Some(PtyWire {
                    term: String::new(),
                    cols: 0,
                    rows: u32::MAX,
                    required: false,
                }),
                ..ExecWire::default()
            }),
            Request::Exec(ExecWire {
                host: "h".into(),
                options: big.clone(),
                identity_files: big,
                env: big_env.clone(),
                client_env: big_env,
                command: "x".repeat(100_000),
                ..ExecWire::default()
            }),
            Request::WindowChange { cols: 0, rows: 0 },
            Request::WindowChange {
                cols: 300,
                rows: u32::MAX,
            },
            Request::Status,
            Request::Stop,
            Request::Forget {
                host: String::new(),
            },
            Request::Run(RunWire::default()),
            Request::Forward(ForwardWire {
                base: ExecWire {
                    host: "bastion".into(),
                    port: Some(2222),
                    ..Default::default()
                },
                to_host: "db.internal".into(),
                to_port: 5432,
            }),
            Request::Run(RunWire {
                base: full_exec(),
                hosts: "root@web[01-20]:2222,db1".into(),
                parallel: 256,
                rate_milli: 2500,
                timeout_ms: u64::MAX,
            }),
            Request::Forget {
                host: "日本.example:2222".into(),
            },
            Request::Subsystem(ExecWire {
                host: "files".into(),
                command: "transfer@skiff".into(),
                subsystem: true,
                ..Default::default()
            }),
            Request::SubsystemOn(ExecWire {
                host: "files".into(),
                command: "transfer@skiff".into(),
                subsystem: true,
                ..Default::default()
            }),
            Request::SubsystemKind(ExecWire {
                host: "files".into(),
                command: "sftp".into(),
                subsystem: true,
                ..Default::default()
            }),
            Request::SubsystemKind(full_exec()),
            Request::SubsystemServer(full_exec()),
            Request::Control(ControlWire {
                base: full_exec(),
                action: ControlAction::Check,
            }),
            Request::Control(ControlWire {
                base: ExecWire::default(),
                action: ControlAction::Stop,
            }),
        ]
    }

    fn all_replies() -> Vec<Reply> {
        vec![
            Reply::Hello {
                version: PROTOCOL_VERSION,
                pid: 4242,
            },
            Reply::Hello {
                version: u32::MAX,
                pid: 0,
            },
            Reply::Controlled { live: 0 },
            Reply::Controlled { live: u32::MAX },
            Reply::Exit { code: 0 },
            Reply::Exit { code: 130 },
            Reply::Exit { code: -1 },
            Reply::Exit { code: i32::MIN },
            Reply::Exit { code: i32::MAX },
            Reply::Failed {
                kind: 2,
                message: "connect to host example.com port 22: Connection refused".into(),
            },
            Reply::Failed {
                kind: 0,
                message: String::new(),
            },
            Reply::Failed {
                kind: 255,
                message: "ünï 🚀".into(),
            },
            Reply::NeedsUser {
                message: "unknown host key".into(),
            },
            Reply::NeedsUser {
                message: String::new(),
            },
            Reply::Status {
                text: "connections:\n  a@b:22 (2 channels)\n".repeat(1000),
            },
            Reply::Status {
                text: String::new(),
            },
            Reply::Done,
            Reply::Opened { rtt_us: 0 },
            Reply::Opened { rtt_us: u64::MAX },
            Reply::OpenedOn {
                rtt_us: 41_000,
                skiffd: true,
            },
            Reply::OpenedOn {
                rtt_us: 0,
                skiffd: false,
            },
            Reply::OpenedKind {
                rtt_us: 0,
                server: ServerKind::Other,
            },
            Reply::OpenedKind {
                rtt_us: 41_000,
                server: ServerKind::Skiffd,
            },
            Reply::OpenedKind {
                rtt_us: u64::MAX,
                server: ServerKind::OpenSsh,
            },
            Reply::OpenedServer {
                rtt_us: 41_000,
                server: ServerKind::Skiffd,
                data_plane: 3,
            },
            Reply::OpenedServer {
                rtt_us: 0,
                server: ServerKind::Other,
                data_plane: 0,
            },
            Reply::RunOutput {
                host: 0,
                stream: 1,
                data: Vec::new(),
            },
            Reply::RunOutput {
                host: u32::MAX,
                stream: 2,
                data: vec![0, 0xff, b'\n', 0x80],
            },
            Reply::RunNotice {
                host: 7,
                text: "Warning: Permanently added 'x'".into(),
            },
            Reply::RunDone {
                host: 1,
                end: HostEnd::Status(3),
                duration_us: 12_345,
            },
            Reply::RunDone {
                host: 2,
                end: HostEnd::Signal("KILL".into()),
                duration_us: 0,
            },
            Reply::RunDone {
                host: 3,
                end: HostEnd::Unknown,
                duration_us: u64::MAX,
            },
            Reply::RunDone {
                host: 4,
                end: HostEnd::Failed {
                    kind: 7,
                    message: "timed out".into(),
                },
                duration_us: 1,
            },
            Reply::RunDone {
                host: 5,
                end: HostEnd::NeedsUser {
                    kind: 3,
                    message: "needs a passphrase".into(),
                },
                duration_us: 2,
            },
        ]
    }

    /// A frame with the given body.
    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn request_round_trip() {
        for req in all_requests() {
            let f = encode_request(&req);
            assert_eq!(
                u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
                f.len() - 4
            );
            assert_eq!(decode_request(&f), Ok(Some((req.clone(), f.len()))));
        }
    }

    #[test]
    fn reply_round_trip() {
        for rep in all_replies() {
            let f = encode_reply(&rep);
            assert_eq!(
                u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
                f.len() - 4
            );
            assert_eq!(decode_reply(&f), Ok(Some((rep.clone(), f.len()))));
        }
    }

    #[test]
    fn known_encodings() {
        assert_eq!(
            encode_request(&Request::Hello { version: 1 }),
            [0, 0, 0, 5, 1, 0, 0, 0, 1]
        );
        assert_eq!(encode_request(&Request::Status), [0, 0, 0, 1, 4]);
        assert_eq!(encode_request(&Request::Stop), [0, 0, 0, 1, 5]);
        assert_eq!(
            encode_request(&Request::Forget { host: "ab".into() }),
            [0, 0, 0, 7, 6, 0, 0, 0, 2, b'a', b'b']
        );
        assert_eq!(
            encode_request(&Request::WindowChange { cols: 80, rows: 24 }),
            [0, 0, 0, 9, 3, 0, 0, 0, 80, 0, 0, 0, 24]
        );
        // Default Exec: host "", user None, port None, ids [], config None,
        // options [], command "", env [], client_env [], pty None, no_stdin false,
        // subsystem false.
        assert_eq!(
            encode_request(&Request::Exec(ExecWire::default())),
            // tag, then 4+1+1+4+1+4+4+4+4+1+1+1 = 30 zero bytes.
            frame(&[[RQ_EXEC].as_slice(), &[0; 30]].concat())
        );
        assert_eq!(
            encode_reply(&Reply::Exit { code: -2 }),
            [0, 0, 0, 5, 2, 0xff, 0xff, 0xff, 0xfe]
        );
        assert_eq!(
            encode_reply(&Reply::Hello {
                version: 1,
                pid: 258
            }),
            [0, 0, 0, 9, 1, 0, 0, 0, 1, 0, 0, 1, 2]
        );
        assert_eq!(
            encode_reply(&Reply::Failed {
                kind: 3,
                message: "x".into()
            }),
            [0, 0, 0, 7, 3, 3, 0, 0, 0, 1, b'x']
        );
        assert_eq!(encode_reply(&Reply::Done), [0, 0, 0, 1, 6]);
        assert_eq!(
            encode_reply(&Reply::Opened { rtt_us: 0x0102 }),
            [0, 0, 0, 9, 10, 0, 0, 0, 0, 0, 0, 1, 2]
        );
    }

    #[test]
    fn partial_request_frames_need_more_bytes() {
        for req in all_requests() {
            let f = encode_request(&req);
            // Every prefix of a big frame would be slow; check the ends and a stride.
            let step = if f.len() > 4096 { 997 } else { 1 };
            let mut cut = 0;
            while cut < f.len() {
                assert_eq!(decode_request(&f[..cut]), Ok(None), "cut {cut} of {req:?}");
                cut += if cut < 16 || f.len() - cut < 16 {
                    1
                } else {
                    step
                };
            }
        }
    }

    #[test]
    fn partial_reply_frames_need_more_bytes() {
        for rep in all_replies() {
            let f = encode_reply(&rep);
            let step = if f.len() > 4096 { 997 } else { 1 };
            let mut cut = 0;
            while cut < f.len() {
                assert_eq!(decode_reply(&f[..cut]), Ok(None), "cut {cut} of {rep:?}");
                cut += if cut < 16 || f.len() - cut < 16 {
                    1
                } else {
                    step
                };
            }
        }
    }

    #[test]
    fn exec_every_split_point() {
        let f = encode_request(&Request::Exec(full_exec()));
        for cut in 0..f.len() {
            assert_eq!(decode_request(&f[..cut]), Ok(None), "cut {cut}");
        }
        assert!(decode_request(&f).unwrap().is_some());
    }

    #[test]
    fn frames_back_to_back() {
        let reqs = all_requests();
        let mut buf = Vec::new();
        for r in &reqs {
            buf.extend(encode_request(r));
        }
        let mut pos = 0;
        let mut got = Vec::new();
        while let Some((r, n)) = decode_request(&buf[pos..]).unwrap() {
            got.push(r);
            pos += n;
        }
        assert_eq!(pos, buf.len());
        assert_eq!(got, reqs);

        let reps = all_replies();
        let mut buf = Vec::new();
        for r in &reps {
            buf.extend(encode_reply(r));
        }
        // Plus a partial frame at the end.
        let partial = encode_reply(&Reply::Done);
        buf.extend_from_slice(&partial[..3]);
        let mut pos = 0;
        let mut got = Vec::new();
        while let Some((r, n)) = decode_reply(&buf[pos..]).unwrap() {
            got.push(r);
            pos += n;
        }
        assert_eq!(pos, buf.len() - 3);
        assert_eq!(got, reps);
    }

    #[test]
    fn two_frames_in_one_buffer_consumed_is_first_only() {
        let a = encode_request(&Request::Hello { version: 1 });
        let b = encode_request(&Request::Stop);
        let mut buf = a.clone();
        buf.extend_from_slice(&b);
        let (r, n) = decode_request(&buf).unwrap().unwrap();
        assert_eq!(r, Request::Hello { version: 1 });
        assert_eq!(n, a.len());
        assert_eq!(
            decode_request(&buf[n..]),
            Ok(Some((Request::Stop, b.len())))
        );
    }

    #[test]
    fn too_large_is_refused_before_the_body_arrives() {
        let len = (MAX_FRAME + 1) as u32;
        let buf = len.to_be_bytes();
        assert_eq!(
            decode_request(&buf),
            Err(WireError::TooLarge(MAX_FRAME + 1))
        );
        assert_eq!(decode_reply(&buf), Err(WireError::TooLarge(MAX_FRAME + 1)));
        let buf = u32::MAX.to_be_bytes();
        assert_eq!(
            decode_request(&buf),
            Err(WireError::TooLarge(u32::MAX as usize))
        );
        // Exactly MAX_FRAME is allowed: just waits for the bytes.
        let buf = (MAX_FRAME as u32).to_be_bytes();
        assert_eq!(decode_request(&buf), Ok(None));
        assert_eq!(decode_reply(&buf), Ok(None));
    }

    #[test]
    fn max_frame_body_is_accepted() {
        // Status { text } body: tag (1) + length (4) + text.
        let text = "s".repeat(MAX_FRAME - 5);
        let f = encode_reply(&Reply::Status { text: text.clone() });
        assert_eq!(f.len(), MAX_FRAME + 4);
        assert_eq!(
            decode_reply(&f),
            Ok(Some((Reply::Status { text }, f.len())))
        );
        // One more byte is too much.
        let f = encode_reply(&Reply::Status {
            text: "s".repeat(MAX_FRAME - 4),
        });
        assert_eq!(decode_reply(&f), Err(WireError::TooLarge(MAX_FRAME + 1)));
    }

    #[test]
    fn unknown_tags() {
        for tag in [0u8, 15, 200, 255] {
            assert_eq!(
                decode_request(&frame(&[tag])),
                Err(WireError::UnknownTag(tag))
            );
            assert_eq!(
                decode_reply(&frame(&[tag])),
                Err(WireError::UnknownTag(tag))
            );
        }
        assert_eq!(
            decode_request(&frame(&[14])),
            Err(WireError::UnknownTag(14))
        );
    }

    #[test]
    fn bad_host_end_tag_is_refused() {
        let mut body = vec![RP_RUN_DONE];
        body.extend_from_slice(&1u32.to_be_bytes());
        body.push(9);
        assert_eq!(
            decode_reply(&frame(&body)),
            Err(WireError::BadValue("host end tag"))
        );
    }

    #[test]
    fn a_server_kind_other_than_0_or_1_is_refused() {
        let mut body = vec![RP_OPENED_ON];
        body.extend_from_slice(&7u64.to_be_bytes());
        body.push(2);
        assert_eq!(
            decode_reply(&frame(&body)),
            Err(WireError::BadValue("server kind"))
        );
    }

    #[test]
    fn a_server_software_other_than_0_to_2_is_refused() {
        for bad in [3u8, 0x80, 255] {
            let mut body = vec![RP_OPENED_KIND];
            body.extend_from_slice(&7u64.to_be_bytes());
            body.push(bad);
            assert_eq!(
                decode_reply(&frame(&body)),
                Err(WireError::BadValue("server software"))
            );
        }
    }

    #[test]
    fn opened_kind_encoding() {
        assert_eq!(
            encode_reply(&Reply::OpenedKind {
                rtt_us: 0x0102,
                server: ServerKind::OpenSsh
            }),
            [0, 0, 0, 10, 13, 0, 0, 0, 0, 0, 0, 1, 2, 2]
        );
        // One byte more than the reply has is refused, not ignored.
        let mut long = encode_reply(&Reply::OpenedKind {
            rtt_us: 1,
            server: ServerKind::Skiffd,
        });
        long[3] += 1;
        long.push(0);
        assert_eq!(decode_reply(&long), Err(WireError::Trailing(1)));
        // A frame that says it is larger than any reply may be is refused
        // from its header, whatever its tag.
        let mut huge = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        huge.push(RP_OPENED_KIND);
        assert_eq!(decode_reply(&huge), Err(WireError::TooLarge(MAX_FRAME + 1)));
    }

    #[test]
    fn empty_body_is_truncated() {
        assert_eq!(decode_request(&frame(&[])), Err(WireError::Truncated));
        assert_eq!(decode_reply(&frame(&[])), Err(WireError::Truncated));
    }

    #[test]
    fn fields_past_the_end_of_the_frame_are_truncated() {
        // Hello with a 3-byte version.
        assert_eq!(
            decode_request(&frame(&[RQ_HELLO, 0, 0, 1])),
            Err(WireError::Truncated)
        );
        // Every proper prefix of a body, reframed, is Truncated.
        for req in all_requests() {
            let f = encode_request(&req);
            let body = &f[4..];
            let step = if body.len() > 4096 { 997 } else { 1 };
            for cut in (0..body.len()).step_by(step) {
                assert_eq!(
                    decode_request(&frame(&body[..cut])),
                    Err(WireError::Truncated),
                    "cut {cut} of {req:?}"
                );
            }
        }
        for rep in all_replies() {
            let f = encode_reply(&rep);
            let body = &f[4..];
            let step = if body.len() > 4096 { 997 } else { 1 };
            for cut in (0..body.len()).step_by(step) {
                assert_eq!(
                    decode_reply(&frame(&body[..cut])),
                    Err(WireError::Truncated),
                    "cut {cut} of {rep:?}"
                );
            }
        }
        // A string whose declared length overruns the frame.
        assert_eq!(
            decode_reply(&frame(&[RP_STATUS, 0, 0, 0, 10, b'a'])),
            Err(WireError::Truncated)
        );
        assert_eq!(
            decode_request(&frame(&[RQ_FORGET, 0xff, 0xff, 0xff, 0xff])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn trailing_bytes() {
        let mut f = encode_request(&Request::Stop);
        f.extend_from_slice(&[9, 9]);
        // The extra bytes are outside the frame: not our business.
        assert_eq!(decode_request(&f), Ok(Some((Request::Stop, 5))));
        // Inside the frame they are an error.
        assert_eq!(
            decode_request(&frame(&[RQ_STOP, 9, 9])),
            Err(WireError::Trailing(2))
        );
        assert_eq!(
            decode_reply(&frame(&[RP_DONE, 0])),
            Err(WireError::Trailing(1))
        );
        let mut body = encode_request(&Request::Exec(full_exec()))[4..].to_vec();
        body.extend_from_slice(&[0, 0, 0]);
        assert_eq!(decode_request(&frame(&body)), Err(WireError::Trailing(3)));
        let mut body = encode_reply(&Reply::Exit { code: 1 })[4..].to_vec();
        body.push(0);
        assert_eq!(decode_reply(&frame(&body)), Err(WireError::Trailing(1)));
    }

    #[test]
    fn bad_utf8() {
        assert_eq!(
            decode_request(&frame(&[RQ_FORGET, 0, 0, 0, 2, 0xc3, 0x28])),
            Err(WireError::BadUtf8)
        );
        assert_eq!(
            decode_reply(&frame(&[RP_NEEDS_USER, 0, 0, 0, 1, 0xff])),
            Err(WireError::BadUtf8)
        );
        assert_eq!(
            decode_reply(&frame(&[RP_FAILED, 4, 0, 0, 0, 3, 0xe2, 0x82, b'x'])),
            Err(WireError::BadUtf8)
        );
        // Bad UTF-8 deep inside an Exec (in client_env).
        let mut e = ExecWire::default();
        e.client_env.push(("K".into(), "V".into()));
        let mut f = encode_request(&Request::Exec(e));
        let v = f.iter().rposition(|&b| b == b'V').unwrap();
        f[v] = 0x80;
        assert_eq!(decode_request(&f), Err(WireError::BadUtf8));
    }

    /// The body (tag and fields, no length prefix) of a default Exec.
    fn default_exec_body() -> Vec<u8> {
        encode_request(&Request::Exec(ExecWire::default()))[4..].to_vec()
    }

    #[test]
    fn bad_flags() {
        // Default Exec body layout: tag(1) host(4) user(1) port(1) ids(4)
        // config(1) options(4) command(4) env(4) client_env(4) pty(1) no_stdin(1)
        // subsystem(1).
        let cases: [(usize, &str); 6] = [
            (5, "user presence flag"),
            (6, "port presence flag"),
            (11, "config_file presence flag"),
            (28, "pty presence flag"),
            (29, "no_stdin flag"),
            (30, "subsystem flag"),
        ];
        for (at, what) in cases {
            for bad in [2u8, 0xff] {
                let mut body = default_exec_body();
                assert_eq!(body.len(), 31);
                body[at] = bad;
                assert_eq!(
                    decode_request(&frame(&body)),
                    Err(WireError::BadValue(what)),
                    "byte {at} = {bad}"
                );
            }
        }
        // pty.required.
        let e = ExecWire {
            pty: Some(PtyWire {
                term: String::new(),
                cols: 1,
                rows: 1,
                required: false,
            }),
            ..ExecWire::default()
        };
        let mut f = encode_request(&Request::Exec(e));
        let n = f.len();
        // ... required, no_stdin, subsystem.
        f[n - 3] = 7;
        assert_eq!(
            decode_request(&f),
            Err(WireError::BadValue("pty required flag"))
        );
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        // identity_files count = u32::MAX with nothing after it.
        let mut body = default_exec_body();
        body[7..11].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_request(&frame(&body)), Err(WireError::Truncated));
        // env count just above what the remaining bytes could hold.
        let mut body = default_exec_body();
        // env count at 20..24; 7 bytes remain after it (client_env 4, pty 1,
        // no_stdin 1, subsystem 1): too few for one pair.
        body[20..24].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(decode_request(&frame(&body)), Err(WireError::Truncated));
        // options count plausible but the items are missing.
        let mut body = default_exec_body();
        body[12..16].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(decode_request(&frame(&body)), Err(WireError::Truncated));
    }

    #[test]
    fn canonical_reencoding() {
        for req in all_requests() {
            let f = encode_request(&req);
            let (d, _) = decode_request(&f).unwrap().unwrap();
            assert_eq!(encode_request(&d), f);
        }
        for rep in all_replies() {
            let f = encode_reply(&rep);
            let (d, _) = decode_reply(&f).unwrap().unwrap();
            assert_eq!(encode_reply(&d), f);
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            WireError::TooLarge(5_000_000).to_string(),
            "frame too large: 5000000 bytes (limit 1048576)"
        );
        assert_eq!(
            WireError::UnknownTag(9).to_string(),
            "unknown message tag 9"
        );
        assert_eq!(
            WireError::Trailing(2).to_string(),
            "frame has 2 trailing bytes after its fields"
        );
        assert_eq!(
            WireError::BadValue("no_stdin flag").to_string(),
            "frame holds an invalid no_stdin flag"
        );
        assert!(WireError::Truncated.to_string().contains("past the end"));
        assert!(WireError::BadUtf8.to_string().contains("UTF-8"));
    }
}
