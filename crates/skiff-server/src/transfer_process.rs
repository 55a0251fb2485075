//! The transfer process: what skiffd runs as the account for the
//! `transfer@skiff` subsystem (`skiffd --transfer-server`). Control messages
//! come and go on stdin/stdout (the SSH channel); fd 3 is a socket to
//! skiffd, which applies the server's policy, issues stream tokens, and
//! passes each data-plane stream's socket once its token checks out. A
//! small upload may come on the channel alone (version 2: `Data`
//! messages, no streams), and a small download may go back on it
//! (version 3: the process reads the request before it answers, and
//! chooses). All file I/O and record crypto happen here, with the
//! account's rights.
//! When the transfer ends, however it ends, the process tells skiffd what
//! it moved ([`Tally`]), for the audit log.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{self, ControlMessageOwned, MsgFlags};
use skiff_dataplane::{
    offer_tree, read_small_tree, source_path, Accepted, Accepting, ChunkQueue, FileTable, Offered,
    RecordReader, RecordWriter, Settled, SmallLimits, SmallTree,
};
use skiff_proto::dataplane::{
    self as dp, ClientMsg, InlineLimits, Keys, Mode, RelayMsg, ServerMsg, Side, TransferDirection,
    TransferReport, INLINE_DOWNLOAD_SINCE, INLINE_UPLOAD_SINCE, OLDEST_VERSION, SECRET_LEN,
    VERSION,
};

/// The descriptor skiffd gives the transfer process.
const RELAY_FD: RawFd = 3;

/// How long the process waits for the client's streams to arrive.
const STREAM_WAIT: Duration = Duration::from_secs(30);

/// Chunks queued ahead of the senders.
const QUEUE_CHUNKS: usize = 64;

/// The most a download sent on the channel alone may hold, whatever the
/// client asks: what one request can make the process read ahead of time.
const INLINE_DOWNLOAD_MAX: SmallLimits = SmallLimits {
    bytes: 1 << 20,
    entries: 64,
};

/// How long a process whose client has gone waits for its transfer's own
/// ending (the senders finishing) before it reports what it has and exits.
const ENDING_WAIT: Duration = Duration::from_secs(5);

/// What the transfer moved, counted as it goes and reported to skiffd once
/// ([`RelayMsg::Report`]) by whichever path ends the process: the
/// transfer's end, a fatal error, the client leaving, a signal.
struct Tally {
    relay: Arc<Relay>,
    direction: TransferDirection,
    files: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
    /// Whether the report is out, for waiters.
    reported: Mutex<bool>,
    changed: Condvar,
}

/// The process's one transfer, once it has begun.
static TALLY: OnceLock<Arc<Tally>> = OnceLock::new();

impl Tally {
    fn begin(relay: Arc<Relay>, direction: TransferDirection) -> Arc<Tally> {
        TALLY
            .get_or_init(|| {
                Arc::new(Tally {
                    relay,
                    direction,
                    files: AtomicU64::new(0),
                    bytes: AtomicU64::new(0),
                    failed: AtomicU64::new(0),
                    reported: Mutex::new(false),
                    changed: Condvar::new(),
                })
            })
            .clone()
    }

    fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    fn add_file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    fn add_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends the report, the first time only. `completed` is also false
    /// whenever a file failed.
    fn report(&self, completed: bool) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        if *reported {
            return;
        }
        *reported = true;
        let failed = self.failed.load(Ordering::Relaxed);
        let _ = self.relay.send(&RelayMsg::Report(TransferReport {
            direction: self.direction,
            files: self.files.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            failed,
            completed: completed && failed == 0,
        }));
        self.changed.notify_all();
    }

    /// Waits up to `limit` for the report to be out.
    fn wait_reported(&self, limit: Duration) {
        let reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(reported, limit, |r| !*r)
            .map_err(|p| p.into_inner());
    }
}

/// A client that read a whole download leaves as soon as it has it, and
/// skiffd then hangs the process up: both can come before the main thread,
/// which wakes once the last sender thread has noted that it is done, has
/// reported. Gives a download [`ENDING_WAIT`] to report on its own. (An
/// upload reports before its `Done`, which the client waits for.)
fn let_a_download_report() {
    if let Some(tally) = TALLY
        .get()
        .filter(|t| t.direction == TransferDirection::Download)
    {
        tally.wait_reported(ENDING_WAIT);
    }
}

/// The process is ending early: reports the transfer (if one began) as not
/// completed. A no-op once the transfer has reported.
fn report_unfinished() {
    if let Some(tally) = TALLY.get() {
        tally.report(false);
    }
}

/// Control messages to the client, from any thread.
#[derive(Clone)]
struct Control(Arc<Mutex<io::Stdout>>);

impl Control {
    fn send(&self, msg: &ServerMsg) {
        self.write(&dp::encode_server(msg));
    }

    /// Sends `msgs` in one write, so that they leave in one flight.
    fn send_all(&self, msgs: impl IntoIterator<Item = ServerMsg>) {
        let mut bytes = Vec::new();
        for msg in msgs {
            bytes.extend_from_slice(&dp::encode_server(&msg));
        }
        self.write(&bytes);
    }

    fn write(&self, bytes: &[u8]) {
        let out = self.0.lock().expect("control lock");
        let mut out = out.lock();
        // If the client is gone, the next read of stdin ends the process.
        let _ = out.write_all(bytes).and_then(|_| out.flush());
    }

    fn fail(&self, id: u32, message: impl Into<String>) {
        self.send(&ServerMsg::Failed {
            id,
            message: message.into(),
        });
    }
}

/// Client messages from stdin.
struct Input {
    stdin: io::Stdin,
    buf: Vec<u8>,
}

impl Input {
    fn next(&mut self) -> Result<Option<ClientMsg>> {
        loop {
            if let Some((msg, used)) =
                dp::decode_client(&self.buf).context("bad control message from the client")?
            {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stdin.lock().read(&mut chunk)?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                bail!("the client closed the channel in the middle of a message");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Once the client has said everything it will say, its channel closing
/// means the SSH session is gone (the client quit, or skiffd died): the
/// transfer stops with it. `on_leave` runs first (dropping temporaries);
/// after `finished` is set, the process just exits normally.
fn stop_when_client_leaves(
    mut input: Input,
    finished: Arc<std::sync::atomic::AtomicBool>,
    on_leave: impl FnOnce() + Send + 'static,
) {
    std::thread::spawn(move || {
        let _ = input.next(); // anything more, or the end
        let_a_download_report();
        if finished.load(std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(0);
        }
        on_leave();
        report_unfinished();
        std::process::exit(1);
    });
}

/// The socket to skiffd (fd 3), used blockingly.
struct Relay(OwnedFd);

impl Relay {
    fn open() -> Result<Relay> {
        // SAFETY: borrowed only for this fstat, which fails cleanly (EBADF)
        // if fd 3 is not open; nothing is read or closed through it.
        let st = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(RELAY_FD) })
            .map_err(|_| {
                anyhow::anyhow!(
                    "fd 3 is not open: this mode is run by skiffd for the {} subsystem",
                    dp::SUBSYSTEM
                )
            })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            bail!(
                "fd 3 is not skiffd's socket: this mode is run by skiffd for the {} subsystem",
                dp::SUBSYSTEM
            );
        }
        // SAFETY: fd 3 is open (checked) and nothing else in this process owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(RELAY_FD) };
        set_blocking(fd.as_raw_fd())?;
        Ok(Relay(fd))
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

    /// The next message, with the socket passed alongside (if any).
    fn recv(&self) -> Result<(RelayMsg, Option<OwnedFd>)> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let (n, fd) = {
            let mut iov = [io::IoSliceMut::new(&mut buf)];
            let msg = socket::recvmsg::<()>(
                self.0.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .context("cannot hear from skiffd")?;
            let mut fd = None;
            for c in msg.cmsgs().context("bad control data from skiffd")? {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    for raw in fds {
                        // SAFETY: the kernel just gave us this descriptor.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
            (msg.bytes, fd)
        };
        if n == 0 {
            bail!("skiffd closed the relay");
        }
        Ok((
            dp::decode_relay(&buf[..n]).context("bad message from skiffd")?,
            fd,
        ))
    }
}

fn set_blocking(fd: RawFd) -> Result<()> {
    // SAFETY: plain fcntl on a descriptor we hold.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// What to undo when skiffd hangs up on the process (its session's
/// connection is gone) or it is told to stop: an upload's temporaries.
type OnHangup = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// Takes SIGHUP, SIGTERM and SIGINT on a thread of their own, so that they
/// run the registered cleanup before the process ends instead of killing it
/// with its temporaries in place. Must run before any other thread starts
/// (they inherit the blocked signals).
fn handle_hangups() -> Result<OnHangup> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGHUP, Signal::SIGTERM, Signal::SIGINT] {
        set.add(sig);
    }
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .context("blocking signals")?;
    let cleanup: OnHangup = Arc::new(Mutex::new(None));
    let on_signal = cleanup.clone();
    std::thread::spawn(move || {
        if let Ok(sig) = set.wait() {
            let_a_download_report();
            if let Some(undo) = on_signal.lock().expect("cleanup lock").take() {
                undo();
            }
            report_unfinished();
            std::process::exit(128 + sig as i32);
        }
    });
    Ok(cleanup)
}

/// Runs the transfer process on stdin/stdout and fd 3. Returns when the
/// transfer is over; an error is a transfer that failed as a whole.
pub fn serve_stdio() -> Result<()> {
    let on_hangup = handle_hangups()?;
    let relay = Arc::new(Relay::open()?);
    let control = Control(Arc::new(Mutex::new(io::stdout())));
    let mut input = Input {
        stdin: io::stdin(),
        buf: Vec::new(),
    };
    let Some(ClientMsg::Hello {
        version,
        mode,
        streams,
        secret,
    }) = input.next()?
    else {
        bail!("the client did not start with Hello");
    };
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        control.send(&ServerMsg::Refused {
            reason: format!(
                "data plane version {version} is not supported (this skiffd speaks {OLDEST_VERSION} to {VERSION})"
            ),
        });
        return Ok(());
    }
    if streams == 0 && version < INLINE_UPLOAD_SINCE {
        control.send(&ServerMsg::Refused {
            reason: "a transfer without data streams needs data plane version 2".into(),
        });
        return Ok(());
    }
    // From version 3 the request comes right behind `Hello`: it is read
    // first, so that a small download can be answered on this channel.
    let early_request = match version >= INLINE_DOWNLOAD_SINCE {
        true => Some(input.next()?),
        false => None,
    };
    let small = match &early_request {
        Some(Some(ClientMsg::Get {
            sources,
            recursive,
            inline: Some(limits),
            ..
        })) => read_small_download(sources, *recursive, *limits),
        _ => None,
    };
    // No streams: the files come, or go, on this channel; skiffd still
    // hears of the transfer, for its audit record.
    let streams = match small {
        Some(_) => 0,
        None => streams,
    };
    relay.send(&RelayMsg::Request { mode, streams })?;
    let tokens = match relay.recv()?.0 {
        RelayMsg::Granted { tokens } => tokens,
        RelayMsg::Denied { reason } => {
            control.send(&ServerMsg::Refused { reason });
            return Ok(());
        }
        other => bail!("unexpected message from skiffd: {other:?}"),
    };
    let mut server_secret = [0u8; SECRET_LEN];
    rand::fill(&mut server_secret);
    let welcome = ServerMsg::Welcome {
        version,
        mode,
        secret: server_secret,
        tokens: tokens.clone(),
    };
    if let Some(tree) = small {
        get_inline(
            &control,
            welcome,
            tree,
            Tally::begin(relay, TransferDirection::Download),
        );
        return Ok(());
    }
    control.send(&welcome);
    let plane = Plane {
        relay,
        keys: Arc::new(dp::derive_keys(&secret, &server_secret, mode)),
        mode,
        streams: tokens.len() as u32,
        control: control.clone(),
    };
    let request = match early_request {
        Some(request) => request,
        None => input.next()?,
    };
    let result = match request {
        Some(ClientMsg::Put {
            target,
            sources,
            recursive: _,
            preserve,
            streams,
        }) => put(
            plane.opening(streams),
            input,
            &target,
            sources,
            preserve,
            &on_hangup,
        ),
        Some(ClientMsg::Get {
            inline: Some(_), ..
        }) if version < INLINE_DOWNLOAD_SINCE => {
            bail!("a download on the channel needs data plane version {INLINE_DOWNLOAD_SINCE}")
        }
        Some(ClientMsg::Get { streams, .. }) if streams.min(plane.streams) == 0 => {
            // Only a small download goes on the channel, and only when the
            // server chose so (above).
            control.fail(u32::MAX, "a download needs a data stream");
            control.send(&ServerMsg::Done);
            Ok(())
        }
        Some(ClientMsg::Get {
            sources,
            recursive,
            preserve,
            streams,
            inline: _,
        }) => get(plane.opening(streams), input, &sources, recursive, preserve),
        Some(other) => bail!("unexpected control message {other:?}"),
        None => Ok(()),
    };
    // A transfer that ended in an error has not reported yet.
    report_unfinished();
    result
}

/// What every transfer needs once the data plane is set up.
struct Plane {
    relay: Arc<Relay>,
    keys: Arc<Keys>,
    mode: Mode,
    streams: u32,
    control: Control,
}

impl Plane {
    /// The client opens `streams` of the granted streams: none when it
    /// carries everything on the channel.
    fn opening(mut self, streams: u32) -> Plane {
        self.streams = streams.min(self.streams);
        self
    }

    /// Takes the streams skiffd passes over, acknowledges each (proving we
    /// hold the keys) and runs `serve` on a thread per stream. Returns the
    /// threads once all streams arrived, or an error if they did not in time.
    /// `on_error` runs if the streams cannot be taken, so the transfer
    /// stops instead of waiting for bytes that will never come.
    fn accept_streams<F, E>(self, serve: F, on_error: E) -> std::thread::JoinHandle<Result<()>>
    where
        F: Fn(RecordWriter, RecordReader) + Send + Sync + 'static,
        E: FnOnce(&anyhow::Error) + Send + 'static,
    {
        let serve = Arc::new(serve);
        std::thread::spawn(move || {
            let result = self.take_streams(&serve);
            if let Err(e) = &result {
                on_error(e);
            }
            result
        })
    }

    fn take_streams<F>(&self, serve: &Arc<F>) -> Result<()>
    where
        F: Fn(RecordWriter, RecordReader) + Send + Sync + 'static,
    {
        {
            let timeout = nix::sys::time::TimeVal::new(STREAM_WAIT.as_secs() as i64, 0);
            let _ = socket::setsockopt(&self.relay.0, socket::sockopt::ReceiveTimeout, &timeout);
            let mut threads = Vec::new();
            for _ in 0..self.streams {
                let (msg, fd) = self
                    .relay
                    .recv()
                    .context("waiting for the client's data streams")?;
                let (RelayMsg::Stream { index }, Some(fd)) = (msg, fd) else {
                    bail!("skiffd sent something other than a stream");
                };
                set_blocking(fd.as_raw_fd())?;
                let sock = TcpStream::from(fd);
                let mut writer = RecordWriter::new(
                    sock.try_clone()?,
                    &self.keys,
                    Side::Server,
                    self.mode,
                    index,
                );
                writer.send_ack()?;
                let reader = RecordReader::new(sock, &self.keys, Side::Client, self.mode, index);
                let serve = serve.clone();
                threads.push(std::thread::spawn(move || serve(writer, reader)));
            }
            for t in threads {
                let _ = t.join();
            }
            Ok(())
        }
    }
}

/// An upload: announce-then-bytes for each entry, files committed as they
/// complete, directories finished (with -p) once everything is in.
fn put(
    plane: Plane,
    mut input: Input,
    target: &str,
    sources: u32,
    preserve: bool,
    on_hangup: &OnHangup,
) -> Result<()> {
    let control = plane.control.clone();
    let on_channel_alone = plane.streams == 0;
    let tally = Tally::begin(plane.relay.clone(), TransferDirection::Upload);
    let target = if target.is_empty() { "." } else { target };
    let placement = match skiff_files::resolve_target(Path::new(target), sources as usize) {
        Ok(p) => p,
        Err(e) => {
            control.fail(u32::MAX, e.to_string());
            tally.report(false);
            control.send(&ServerMsg::Done);
            return Ok(());
        }
    };
    let (reporter, counter) = (control.clone(), tally.clone());
    let table = FileTable::new(move |s| match s {
        Settled::Stored(id) => {
            counter.add_file();
            reporter.send(&ServerMsg::Stored { id })
        }
        Settled::Failed(id, message) => {
            counter.add_failed();
            reporter.fail(id, message)
        }
    });
    *on_hangup.lock().expect("cleanup lock") = Some(Box::new({
        let table = table.clone();
        move || table.abort_and_wait()
    }));
    control.send(&ServerMsg::Ready);
    let receivers = {
        let on_error = {
            let (table, control) = (table.clone(), control.clone());
            move |e: &anyhow::Error| {
                table.abort();
                control.fail(u32::MAX, format!("{e:#}"));
            }
        };
        let (table, control, tally) = (table.clone(), control.clone(), tally.clone());
        let serve = move |_writer, reader| {
            if let Err(e) = table.run_receiver(reader, &|n| tally.add_bytes(n)) {
                // A stream stopped by another one's failure reports that failure.
                let reason = table.abort_reason().unwrap_or_else(|| e.to_string());
                fatal(&control, &table, reason);
            }
        };
        plane.accept_streams(serve, on_error)
    };
    let mut accepting = Accepting::upload(&table, &placement, preserve);
    loop {
        match input.next() {
            Ok(Some(ClientMsg::Entry(e))) => match accepting.entry(&e) {
                Ok(Accepted::Failed(message)) => {
                    tally.add_failed();
                    control.fail(e.id, message)
                }
                Ok(_) => {}
                Err(broke) => fatal(&control, &table, broke.to_string()),
            },
            Ok(Some(ClientMsg::Data { id, offset, bytes })) => {
                if let Err(e) = table.write_inline(id, offset, &bytes, &|n| tally.add_bytes(n)) {
                    let reason = table.abort_reason().unwrap_or_else(|| e.to_string());
                    fatal(&control, &table, reason);
                }
            }
            Ok(Some(ClientMsg::PutEnd)) => {
                table.close_announcements();
                break;
            }
            Ok(Some(other)) => {
                table.abort_and_wait();
                bail!("unexpected control message {other:?} during an upload");
            }
            Ok(None) => {
                table.abort_and_wait();
                bail!("the client went away during the upload");
            }
            Err(e) => {
                table.abort_and_wait();
                return Err(e);
            }
        }
    }
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // With streams, bytes may still be on their way: a client that leaves
    // now takes the transfer with it. On the channel alone every byte is
    // in, and a client that has closed its side (as `ssh -s` does at the
    // end of its input) still gets what it sent; a connection that is
    // gone hangs the process up (`handle_hangups`).
    if !on_channel_alone {
        stop_when_client_leaves(input, finished.clone(), {
            let table = table.clone();
            move || table.abort_and_wait()
        });
    }
    // Each stream reads up to its end record; a file still short then will
    // not be completed.
    match receivers.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => bail!("{e:#}"),
        Err(_) => bail!("a receiver thread panicked"),
    }
    for short in table.incomplete() {
        tally.add_failed();
        control.fail(
            u32::MAX,
            format!("the upload ended before all of {short} arrived"),
        );
    }
    if !table.wait_settled() {
        let reason = table
            .abort_reason()
            .unwrap_or_else(|| "upload aborted".into());
        fatal(&control, &table, reason);
    }
    let unfinished = accepting.finish();
    for message in &unfinished {
        control.fail(u32::MAX, message.clone());
    }
    // Reported before `Done`: the client leaves once it has that.
    tally.report(unfinished.is_empty());
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    control.send(&ServerMsg::Done);
    Ok(())
}

/// Ends a failed upload, once, from whichever thread sees it first: the
/// temporaries go, the client hears why, and the process exits.
fn fatal(control: &Control, table: &FileTable, reason: String) -> ! {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        table.abort_and_wait();
        control.fail(u32::MAX, reason);
        report_unfinished();
        std::process::exit(1);
    });
    unreachable!("the first caller exits the process")
}

/// The download whole, when it holds no more than the client's `limits`
/// (and [`INLINE_DOWNLOAD_MAX`]): it then goes on the channel alone.
fn read_small_download(
    sources: &[String],
    recursive: bool,
    limits: InlineLimits,
) -> Option<SmallTree> {
    let limits = SmallLimits {
        bytes: limits.bytes.min(INLINE_DOWNLOAD_MAX.bytes),
        entries: (limits.entries as usize).min(INLINE_DOWNLOAD_MAX.entries),
    };
    let sources: Vec<_> = sources.iter().map(|s| source_path(s).to_owned()).collect();
    read_small_tree(&sources, recursive, limits)
}

/// A download read whole, sent on the channel behind `welcome` (which
/// grants no streams) in one write: each entry followed by its file's
/// bytes, what could not be sent, then `Done`.
fn get_inline(control: &Control, welcome: ServerMsg, tree: SmallTree, tally: Arc<Tally>) {
    let mut msgs = vec![welcome];
    for entry in tree.entries {
        let id = entry.wire.id;
        if !entry.wire.is_dir {
            tally.add_file();
            tally.add_bytes(entry.wire.size);
        }
        msgs.push(ServerMsg::Entry(entry.wire));
        msgs.extend(
            dp::inline_pieces(&entry.bytes).map(|(offset, piece)| ServerMsg::Data {
                id,
                offset,
                bytes: piece.to_vec(),
            }),
        );
    }
    for why in tree.unsendable {
        tally.add_failed();
        msgs.push(ServerMsg::Failed {
            id: u32::MAX,
            message: why,
        });
    }
    // Reported before `Done`: the client leaves once it has that.
    tally.report(true);
    msgs.push(ServerMsg::Done);
    control.send_all(msgs);
}

/// A download: walk each source, announce each entry, queue file chunks
/// for the sender threads.
fn get(
    plane: Plane,
    input: Input,
    sources: &[String],
    recursive: bool,
    _preserve: bool,
) -> Result<()> {
    let control = plane.control.clone();
    let tally = Tally::begin(plane.relay.clone(), TransferDirection::Download);
    let queue = ChunkQueue::new(QUEUE_CHUNKS);
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    stop_when_client_leaves(input, finished.clone(), || {});
    let senders = {
        let on_error = {
            let (queue, control) = (queue.clone(), control.clone());
            move |e: &anyhow::Error| {
                queue.abort();
                control.fail(u32::MAX, format!("{e:#}"));
            }
        };
        let (queue, control, tally) = (queue.clone(), control.clone(), tally.clone());
        let serve = move |writer, _reader| {
            let failed = |id: u32, e: io::Error| {
                tally.add_failed();
                control.fail(id, format!("read failed: {e}"))
            };
            if let Err(e) = queue.run_sender(writer, &|n| tally.add_bytes(n), &failed) {
                control.fail(u32::MAX, e.to_string());
            }
        };
        plane.accept_streams(serve, on_error)
    };
    let sources: Vec<_> = sources.iter().map(|s| source_path(s).to_owned()).collect();
    // Files announced: once every sender has finished, each of them that did
    // not fail was sent in full.
    let (mut announced, mut unsendable) = (0u64, 0u64);
    offer_tree(&sources, recursive, &queue, &mut |offered| {
        match offered {
            Offered::Entry { wire, .. } => {
                announced += u64::from(!wire.is_dir);
                control.send(&ServerMsg::Entry(wire))
            }
            Offered::Unsendable(why) => {
                unsendable += 1;
                tally.add_failed();
                control.fail(u32::MAX, why)
            }
        }
        // A client that went away ends the process (stop_when_client_leaves).
        true
    });
    control.send(&ServerMsg::Done);
    let joined = senders.join();
    // With every sender done, each announced file whose reading did not
    // fail went out in full.
    let sent_all = matches!(joined, Ok(Ok(())));
    if sent_all {
        let unreadable = tally.failed.load(Ordering::Relaxed) - unsendable;
        tally
            .files
            .store(announced.saturating_sub(unreadable), Ordering::Relaxed);
    }
    tally.report(sent_all);
    // A download that failed still ends the process with a failure when
    // its client leaves first.
    finished.store(sent_all, std::sync::atomic::Ordering::SeqCst);
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            queue.abort();
            Err(e)
        }
        Err(_) => bail!("a sender thread panicked"),
    }
}
