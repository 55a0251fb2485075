//! A test peer: an SSH client that opens many sessions on many connections
//! and sends each command as much input as the server lets it, for the
//! tests and the benchmark of skiffd's memory (`tests/skiffd_memory.rs`,
//! `bench/server-memory`).
//!
//! `stdin_flood port=P user=U key=FILE [connections=N] [sessions=N]
//! [command=CMD] [flood=0|1] [linger0=0|1]` connects N times to 127.0.0.1:P
//! as U with the private key FILE (any host key is accepted: loopback test
//! servers only), opens `sessions` session channels on each, runs CMD
//! (default `sleep 3600`) in each and, with `flood=1` (the default), writes
//! input to every channel as fast as its window allows, never reading what
//! the server sends beyond draining it. `linger0=1` makes the connections
//! reset (RST) rather than close when the process dies, as a crashed client
//! would.
//!
//! It prints, one a line on stdout: `connected N` once every connection
//! is authenticated, then `sent BYTES` (input the server's windows took,
//! all channels) every 200 ms, and `ready N` once every command has
//! started (a server whose budget is full may hold later sessions back). It
//! runs until its stdin ends or it is killed. Errors go to stderr, exit 1.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use russh::client;
use russh::keys::{load_secret_key, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::ChannelMsg;
use tokio::io::AsyncWriteExt;

struct Options {
    port: u16,
    user: String,
    key: String,
    connections: usize,
    sessions: usize,
    command: String,
    flood: bool,
    linger0: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        port: 0,
        user: String::new(),
        key: String::new(),
        connections: 1,
        sessions: 1,
        command: "sleep 3600".into(),
        flood: true,
        linger0: false,
    };
    for arg in std::env::args().skip(1) {
        let (k, v) = arg
            .split_once('=')
            .ok_or_else(|| format!("not KEY=VALUE: {arg}"))?;
        let number = |v: &str| v.parse::<usize>().map_err(|e| format!("{k}: {e}"));
        match k {
            "port" => o.port = v.parse().map_err(|e| format!("port: {e}"))?,
            "user" => o.user = v.into(),
            "key" => o.key = v.into(),
            "connections" => o.connections = number(v)?,
            "sessions" => o.sessions = number(v)?,
            "command" => o.command = v.into(),
            "flood" => o.flood = v == "1",
            "linger0" => o.linger0 = v == "1",
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if o.port == 0 || o.user.is_empty() || o.key.is_empty() {
        return Err("port=, user= and key= are required".into());
    }
    Ok(o)
}

struct AnyHost;

impl client::Handler for AnyHost {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn connect(o: &Options) -> Result<client::Handle<AnyHost>, String> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", o.port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    if o.linger0 {
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &reset)
            .map_err(|e| format!("SO_LINGER: {e}"))?;
    }
    let config = Arc::new(client::Config::default());
    let mut handle = client::connect_stream(config, stream, AnyHost)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let key = load_secret_key(&o.key, None).map_err(|e| format!("key: {e}"))?;
    let auth = handle
        .authenticate_publickey(&o.user, PrivateKeyWithHashAlg::new(Arc::new(key), None))
        .await
        .map_err(|e| format!("authenticate: {e}"))?;
    if !auth.success() {
        return Err("authentication refused".into());
    }
    Ok(handle)
}

/// Opens a session, starts the command and returns once it has started;
/// then floods its input (when asked) until the channel ends.
async fn session(
    handle: Arc<client::Handle<AnyHost>>,
    command: String,
    flood: bool,
    sent: Arc<AtomicU64>,
    started: tokio::sync::mpsc::Sender<Result<(), String>>,
) {
    let channel = match handle.channel_open_session().await {
        Ok(c) => c,
        Err(e) => {
            let _ = started.send(Err(format!("open session: {e}"))).await;
            return;
        }
    };
    if let Err(e) = channel.exec(true, command.as_bytes()).await {
        let _ = started.send(Err(format!("exec: {e}"))).await;
        return;
    }
    let (mut reader, writer) = channel.split();
    let mut started = Some(started);
    // Wait for the answer to exec, then drain whatever comes.
    let drain = tokio::spawn(async move {
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Success => {
                    if let Some(s) = started.take() {
                        let _ = s.send(Ok(())).await;
                    }
                }
                ChannelMsg::Failure => {
                    if let Some(s) = started.take() {
                        let _ = s.send(Err("exec refused".into())).await;
                    }
                }
                _ => {}
            }
        }
    });
    if flood {
        let chunk = vec![b'x'; 32 * 1024];
        let mut tx = writer.make_writer();
        while tx.write_all(&chunk).await.is_ok() {
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
    let _ = drain.await;
}

async fn run(o: Options) -> Result<(), String> {
    let o = Arc::new(o);
    let mut connecting = tokio::task::JoinSet::new();
    for _ in 0..o.connections {
        let o = o.clone();
        connecting.spawn(async move { connect(&o).await });
    }
    let mut handles = Vec::new();
    while let Some(joined) = connecting.join_next().await {
        handles.push(Arc::new(joined.map_err(|e| e.to_string())??));
    }
    say(format!("connected {}", handles.len()));
    let sent = Arc::new(AtomicU64::new(0));
    let total = o.connections * o.sessions;
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel(total.max(1));
    for handle in &handles {
        for _ in 0..o.sessions {
            tokio::spawn(session(
                handle.clone(),
                o.command.clone(),
                o.flood,
                sent.clone(),
                started_tx.clone(),
            ));
        }
    }
    drop(started_tx);
    let ticks = sent.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_millis(200));
        loop {
            ticker.tick().await;
            say(format!("sent {}", ticks.load(Ordering::Relaxed)));
        }
    });
    for _ in 0..total {
        match started_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => return Err("a session ended before its command started".into()),
        }
    }
    say(format!("ready {total}"));
    std::future::pending::<()>().await;
    Ok(())
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("stdin_flood: {e}");
            std::process::exit(2);
        }
    };
    // The process ends when its stdin does.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(o)) {
        eprintln!("stdin_flood: {e}");
        std::process::exit(1);
    }
}
