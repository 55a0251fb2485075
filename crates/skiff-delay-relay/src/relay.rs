//! The relay's I/O: accept, connect to the target when the model says so,
//! and move bytes each way at the times [`crate::model`] computes, with its
//! budget. One task per connection; each direction is a reader and a writer
//! sharing a [`Pipe`].

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::model::{Delivery, DeliveryLog, Direction, Link, Pipe};

/// The most one read takes from a socket.
const MAX_READ: usize = 256 << 10;
/// How often coalesced deliveries are logged after the detailed ones.
const BATCH_INTERVAL: Duration = Duration::from_millis(100);

/// What the relay does.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to connect each accepted connection (host:port).
    pub target: String,
    pub link: Link,
    /// Bytes in flight per direction of each connection.
    pub in_flight: usize,
    /// Deliveries per direction logged one line each before coalescing.
    pub detailed_chunks: u64,
    /// Exit when no connection has been open for this long.
    pub exit_after_idle: Option<Duration>,
}

/// The per-connection event log: JSON lines, each written whole and flushed
/// (the bench may kill the relay at any time). Times are seconds since the
/// Unix epoch ("t", the clock a benchmark script reads too) and milliseconds
/// since the relay accepted the connection ("ms").
pub struct EventLog {
    file: Option<Mutex<std::fs::File>>,
    wall: SystemTime,
    mono: Instant,
}

impl EventLog {
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("cannot open the event log {}", p.display()))?,
            )),
            None => None,
        };
        Ok(EventLog {
            file,
            wall: SystemTime::now(),
            mono: Instant::now(),
        })
    }

    fn enabled(&self) -> bool {
        self.file.is_some()
    }

    fn unix(&self, at: Instant) -> f64 {
        let wall = self.wall + at.saturating_duration_since(self.mono);
        wall.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    }

    /// Writes `{"conn":N,"ev":EV,"t":..,"ms":..<rest>}`.
    fn event(&self, conn: u64, ev: &str, accepted: Instant, at: Instant, rest: &str) {
        let Some(file) = &self.file else { return };
        let line = format!(
            "{{\"conn\":{conn},\"ev\":\"{ev}\",\"t\":{:.6},\"ms\":{:.3}{rest}}}\n",
            self.unix(at),
            at.saturating_duration_since(accepted).as_secs_f64() * 1e3
        );
        if let Ok(mut f) = file.lock() {
            // A full disk must not stop the relay; the log is best effort.
            let _ = f.write_all(line.as_bytes());
        }
    }

    fn delivery(&self, conn: u64, dir: Direction, accepted: Instant, d: Delivery) {
        let ms = |x: Duration| x.as_secs_f64() * 1e3;
        match d {
            Delivery::Chunk { at, len, total } => self.event(
                conn,
                "chunk",
                accepted,
                accepted + at,
                &format!(",\"dir\":\"{}\",\"len\":{len},\"total\":{total}", dir.name()),
            ),
            Delivery::Batch {
                from,
                to,
                chunks,
                bytes,
                total,
            } => self.event(
                conn,
                "batch",
                accepted,
                accepted + from,
                &format!(
                    ",\"dir\":\"{}\",\"to_ms\":{:.3},\"chunks\":{chunks},\"bytes\":{bytes},\"total\":{total}",
                    dir.name(),
                    ms(to)
                ),
            ),
        }
    }
}

/// Escapes a string for a JSON value (error messages, addresses).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

enum Chunk {
    /// A buffer and how many of its bytes were read.
    Data(Vec<u8>, usize),
    Eof,
}

/// One direction: the pipe and the two wake-ups (data queued, room freed).
/// Each has one waiter (the writer, the reader), so `notify_one`'s stored
/// permit makes a wake-up sent before the wait is not lost.
struct Shared {
    pipe: Mutex<Pipe<Chunk>>,
    data: Notify,
    room: Notify,
    /// Buffers the writer is done with, for the reader to fill again: a
    /// fresh 256 KiB allocation per read would be mapped, faulted in page by
    /// page and unmapped each time (glibc serves that size with mmap). The
    /// budget bounds how many exist.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Shared {
            pipe: Mutex::new(Pipe::new(capacity)),
            data: Notify::new(),
            room: Notify::new(),
            spare: Mutex::new(Vec::new()),
        })
    }

    fn pipe(&self) -> std::sync::MutexGuard<'_, Pipe<Chunk>> {
        // The lock is never held across an await or a panic point.
        self.pipe.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_buffer(&self) -> Vec<u8> {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.unwrap_or_else(|| vec![0; MAX_READ])
    }

    fn give_back(&self, buf: Vec<u8>) {
        self.spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf);
    }
}

/// Reads `src` into the pipe while the budget allows; a read error ends the
/// direction as an EOF would.
async fn read_side(
    mut src: OwnedReadHalf,
    shared: Arc<Shared>,
    dir: Direction,
    link: Link,
    accepted: Instant,
) -> std::io::Result<()> {
    loop {
        let room = shared.pipe().room();
        if room == 0 {
            shared.room.notified().await;
            continue;
        }
        let mut buf = shared.take_buffer();
        let n = src.read(&mut buf[..room.min(MAX_READ)]).await.unwrap_or(0);
        let due = link.due(dir, accepted.elapsed());
        let chunk = if n == 0 {
            Chunk::Eof
        } else {
            Chunk::Data(buf, n)
        };
        shared.pipe().push(due, n, chunk);
        shared.data.notify_one();
        if n == 0 {
            return Ok(());
        }
    }
}

/// Writes the pipe's chunks to `dst`, each at its time; passes the EOF on.
async fn write_side(
    mut dst: OwnedWriteHalf,
    shared: Arc<Shared>,
    dir: Direction,
    accepted: Instant,
    conn: u64,
    cfg: &Config,
    log: &EventLog,
) -> std::io::Result<()> {
    let mut dlog = DeliveryLog::new(cfg.detailed_chunks, BATCH_INTERVAL);
    let result = loop {
        let next = shared.pipe().next_due();
        let Some(due) = next else {
            shared.data.notified().await;
            continue;
        };
        // Sleep only when the chunk is not due yet: a sleep whose deadline
        // has passed still waits for the timer's next tick (1 ms), which
        // would cap a direction at one chunk per millisecond.
        if due > accepted.elapsed() {
            tokio::time::sleep_until((accepted + due).into()).await;
        }
        let popped = shared.pipe().pop_due(accepted.elapsed());
        let Some(p) = popped else { continue };
        match p.item {
            Chunk::Data(buf, n) => {
                if let Err(e) = dst.write_all(&buf[..n]).await {
                    break Err(e);
                }
                shared.give_back(buf);
                shared.pipe().release(p.len);
                shared.room.notify_one();
                if log.enabled() {
                    if let Some(d) = dlog.delivered(accepted.elapsed(), p.len) {
                        log.delivery(conn, dir, accepted, d);
                    }
                }
            }
            Chunk::Eof => {
                let _ = dst.shutdown().await;
                break Ok(());
            }
        }
    };
    if let Some(d) = dlog.finish() {
        log.delivery(conn, dir, accepted, d);
    }
    let end = Instant::now();
    log.event(
        conn,
        if result.is_ok() { "eof" } else { "error" },
        accepted,
        end,
        &format!(",\"dir\":\"{}\",\"total\":{}", dir.name(), dlog.total()),
    );
    result
}

async fn serve(client: TcpStream, peer: SocketAddr, conn: u64, cfg: &Config, log: &EventLog) {
    let accepted = Instant::now();
    log.event(
        conn,
        "accept",
        accepted,
        accepted,
        &format!(",\"peer\":{}", json_str(&peer.to_string())),
    );
    let _ = client.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let up = Shared::new(cfg.in_flight);
    let down = Shared::new(cfg.in_flight);
    let link = cfg.link;
    let to_server = read_side(cr, up.clone(), Direction::ToServer, link, accepted);
    let rest = async {
        tokio::time::sleep_until((accepted + link.upstream_connect_at()).into()).await;
        let upstream = match TcpStream::connect(&cfg.target).await {
            Ok(s) => s,
            Err(e) => {
                log.event(
                    conn,
                    "connect_failed",
                    accepted,
                    Instant::now(),
                    &format!(",\"error\":{}", json_str(&e.to_string())),
                );
                return Err(e);
            }
        };
        log.event(conn, "connect", accepted, Instant::now(), "");
        let _ = upstream.set_nodelay(true);
        let (ur, uw) = upstream.into_split();
        tokio::try_join!(
            write_side(
                uw,
                up.clone(),
                Direction::ToServer,
                accepted,
                conn,
                cfg,
                log
            ),
            read_side(ur, down.clone(), Direction::ToClient, link, accepted),
            write_side(
                cw,
                down.clone(),
                Direction::ToClient,
                accepted,
                conn,
                cfg,
                log
            ),
        )
        .map(|_| ())
    };
    // The first error (a peer gone) drops both sockets: both peers see the
    // connection end, as through a real path.
    let _ = tokio::try_join!(to_server, rest);
    log.event(conn, "close", accepted, Instant::now(), "");
}

/// Serves `listener` until the idle limit (if any) passes with no
/// connection open.
pub async fn run(listener: TcpListener, cfg: Config, log: EventLog) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let log = Arc::new(log);
    let open = Arc::new(AtomicUsize::new(0));
    let next_id = AtomicU64::new(1);
    // Bumped when a connection ends; the idle clock runs from the last one.
    let ended = Arc::new(Notify::new());
    loop {
        let idle = async {
            match cfg.exit_after_idle {
                Some(limit) => loop {
                    if open.load(Ordering::SeqCst) == 0 {
                        tokio::time::sleep(limit).await;
                        if open.load(Ordering::SeqCst) == 0 {
                            return;
                        }
                    } else {
                        ended.notified().await;
                    }
                },
                None => std::future::pending().await,
            }
        };
        let (sock, peer) = tokio::select! {
            r = listener.accept() => r.context("accept")?,
            () = idle => return Ok(()),
        };
        let conn = next_id.fetch_add(1, Ordering::Relaxed);
        open.fetch_add(1, Ordering::SeqCst);
        let (cfg, log, open, ended) = (cfg.clone(), log.clone(), open.clone(), ended.clone());
        tokio::spawn(async move {
            serve(sock, peer, conn, &cfg, &log).await;
            open.fetch_sub(1, Ordering::SeqCst);
            ended.notify_one();
        });
    }
}
