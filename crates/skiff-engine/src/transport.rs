//! How a connection reaches its server: a direct TCP connection, the
//! standard input and output of a `ProxyCommand`, or a `direct-tcpip`
//! channel through an SSH connection to a jump host (`ProxyJump`, which
//! may itself be reached through a proxy).
//!
//! Connections through the same jump host (with the same settings) share
//! one connection to it while any of them is open, so a fan-out to a
//! thousand hosts behind a bastion logs in to the bastion once.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll};

use russh::client::Msg;
use russh::ChannelStream;
use tokio::io::{AsyncRead, AsyncWrite, Join, ReadBuf};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::connect::Connection;
use crate::error::{ErrorKind, SkiffError};
use crate::settings::{ConnectSettings, Proxy};

/// A byte stream an SSH session can run over.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// An open way to the server.
pub struct Transport {
    pub stream: Box<dyn Stream>,
    /// The server's address, when connected to it directly (extra
    /// data-plane connections need it; through a proxy there is none).
    pub peer_addr: Option<SocketAddr>,
    /// How the server is reached, for messages: empty when directly.
    pub route: String,
    /// Warnings from connecting to jump hosts.
    pub notices: Vec<String>,
}

/// The future of [`open`], boxed: through a jump host, [`open`] calls
/// [`crate::connect::connect`], which calls [`open`] for the jump host.
pub type Opening<'a> = Pin<Box<dyn Future<Output = Result<Transport, SkiffError>> + Send + 'a>>;

/// Opens the way to `settings`' host and port.
pub fn open(settings: &ConnectSettings) -> Opening<'_> {
    Box::pin(open_now(settings))
}

async fn open_now(settings: &ConnectSettings) -> Result<Transport, SkiffError> {
    match &settings.proxy {
        None => {
            let stream = tcp_connect(settings).await?;
            Ok(Transport {
                peer_addr: stream.peer_addr().ok(),
                stream: Box::new(stream),
                route: String::new(),
                notices: Vec::new(),
            })
        }
        Some(Proxy::Command(command)) => Ok(Transport {
            stream: Box::new(spawn_command(command)?),
            peer_addr: None,
            route: format!(" (through ProxyCommand {command:?})"),
            notices: Vec::new(),
        }),
        Some(Proxy::Jump(jump)) => through_jump_host(settings, jump).await,
    }
}

async fn tcp_connect(settings: &ConnectSettings) -> Result<TcpStream, SkiffError> {
    let target = format!("{} port {}", settings.hostname, settings.port);
    let fail = |what: String| SkiffError::new(ErrorKind::Connect, what);
    let deadline = tokio::time::Instant::now() + settings.connect_timeout;
    let resolved: Vec<SocketAddr> = tokio::time::timeout_at(
        deadline,
        tokio::net::lookup_host((settings.hostname.as_str(), settings.port)),
    )
    .await
    .map_err(|_| fail(format!("cannot resolve {}: timed out", settings.hostname)))?
    .map_err(|e| fail(format!("cannot resolve {}: {e}", settings.hostname)))?
    .collect();
    let family = settings.address_family;
    let addrs: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|a| family.admits(&a.ip()))
        .collect();
    if addrs.is_empty() && !resolved.is_empty() {
        return Err(fail(format!(
            "{} has no address of the family AddressFamily asks for ({family:?})",
            settings.hostname
        )));
    }
    let sources = local_sources(settings).map_err(fail)?;
    let mut last = None;
    for addr in addrs {
        let source = match &sources {
            None => None,
            Some(list) => match list.iter().find(|s| s.is_ipv4() == addr.is_ipv4()) {
                Some(ip) => Some(*ip),
                None => {
                    last = Some(format!(
                        "connect to {target}: no local address of {addr}'s family to bind to"
                    ));
                    continue;
                }
            },
        };
        match tokio::time::timeout_at(deadline, connect_from(source, addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(format!("connect to {target}: {e}")),
            Err(_) => {
                last = Some(format!(
                    "connect to {target}: timed out after {}s (ConnectTimeout)",
                    settings.connect_timeout.as_secs()
                ));
                break;
            }
        }
    }
    Err(fail(last.unwrap_or_else(|| {
        format!("cannot resolve {}: no addresses", settings.hostname)
    })))
}

/// The local addresses a connection may come from: `BindAddress`, else
/// those of `BindInterface`; `None` when neither is set.
fn local_sources(settings: &ConnectSettings) -> Result<Option<Vec<IpAddr>>, String> {
    if let Some(ip) = settings.bind_address {
        return Ok(Some(vec![ip]));
    }
    let Some(name) = &settings.bind_interface else {
        return Ok(None);
    };
    let addrs: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("cannot list network interfaces: {e}"))?
        .filter(|i| &i.interface_name == name)
        .filter_map(|i| i.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect();
    if addrs.is_empty() {
        return Err(format!(
            "BindInterface {name}: no such interface, or it has no address"
        ));
    }
    Ok(Some(addrs))
}

/// Connects to `addr`, from `source` (any port) when given.
async fn connect_from(source: Option<IpAddr>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let Some(ip) = source else {
        return TcpStream::connect(addr).await;
    };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket
        .bind(SocketAddr::new(ip, 0))
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot bind to {ip}: {e}")))?;
    socket.connect(addr).await
}

/// A `ProxyCommand` run by the shell, as ssh runs it; its standard error
/// stays ours. It is killed when the connection is dropped.
fn spawn_command(command: &str) -> Result<CommandStream, SkiffError> {
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec {command}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            SkiffError::new(
                ErrorKind::Connect,
                format!("cannot run ProxyCommand {command:?}: {e}"),
            )
        })?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(SkiffError::new(
            ErrorKind::Connect,
            format!("ProxyCommand {command:?}: no pipes to it"),
        ));
    };
    Ok(CommandStream {
        io: tokio::io::join(stdout, stdin),
        _child: child,
    })
}

/// A channel from `jump` to `settings`' host and port.
async fn through_jump_host(
    settings: &ConnectSettings,
    jump: &ConnectSettings,
) -> Result<Transport, SkiffError> {
    let name = jump_name(jump);
    let (connection, fresh) = shared_jump_connection(jump).await.map_err(|e| SkiffError {
        message: format!("jump host {name}: {}", e.message),
        ..e
    })?;
    let channel = connection
        .handle
        .channel_open_direct_tcpip(
            settings.hostname.as_str(),
            u32::from(settings.port),
            "127.0.0.1",
            0,
        )
        .await
        .map_err(|e| {
            SkiffError::new(
                ErrorKind::Connect,
                format!(
                    "jump host {name} could not open a connection to {} port {}: {e}",
                    settings.hostname, settings.port
                ),
            )
        })?;
    // Warnings from logging in to the jump host, once.
    let notices = if fresh {
        connection.notices.clone()
    } else {
        Vec::new()
    };
    Ok(Transport {
        stream: Box::new(JumpStream {
            channel: channel.into_stream(),
            _jump: connection,
        }),
        peer_addr: None,
        route: format!(" (through jump host {name})"),
        notices,
    })
}

/// Jump-host connections in use, by their settings. An entry is the slot
/// for one jump host: held while connecting, so that many connections
/// starting at once log in to it once.
type JumpSlots = HashMap<String, Arc<tokio::sync::Mutex<JumpSlot>>>;

#[derive(Default)]
enum JumpSlot {
    #[default]
    Empty,
    /// The connection, while some connection through it is open.
    Open(Weak<Connection>),
    /// The last attempt failed, at this time: connections that waited for
    /// it fail the same way instead of each trying (and perhaps timing
    /// out) again in turn. Not for a drop before authentication
    /// ([`ErrorKind::Busy`]), which the next try may get past.
    Failed(SkiffError, std::time::Instant),
}

/// How long a failure to reach a jump host answers for it.
const JUMP_FAILURE_HOLDS: std::time::Duration = std::time::Duration::from_secs(2);

/// The open connection to `jump` that other connections use, or a new one
/// (then `true`). It closes when the last connection through it is
/// dropped.
async fn shared_jump_connection(
    jump: &ConnectSettings,
) -> Result<(Arc<Connection>, bool), SkiffError> {
    static SLOTS: OnceLock<Mutex<JumpSlots>> = OnceLock::new();
    let key = format!("{jump:?}");
    let slot = {
        let mut slots = SLOTS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Forget the slots nobody uses: no one waiting on them, nothing open.
        slots.retain(|_, s| {
            Arc::strong_count(s) > 1
                || s.try_lock().map_or(
                    true,
                    |state| matches!(&*state, JumpSlot::Open(w) if w.strong_count() > 0),
                )
        });
        slots.entry(key).or_default().clone()
    };
    let mut state = slot.lock().await;
    match &*state {
        JumpSlot::Open(weak) => {
            if let Some(open) = weak.upgrade().filter(|c| !c.handle.is_closed()) {
                return Ok((open, false));
            }
        }
        JumpSlot::Failed(e, at) if at.elapsed() < JUMP_FAILURE_HOLDS => return Err(e.clone()),
        _ => {}
    }
    match crate::connect::connect(jump).await {
        Ok(connection) => {
            let fresh = Arc::new(connection);
            *state = JumpSlot::Open(Arc::downgrade(&fresh));
            Ok((fresh, true))
        }
        // A busy jump host may let the next try in: each waiter tries it
        // (one at a time, holding the slot) instead of sharing this drop.
        Err(e) if e.kind == ErrorKind::Busy => {
            *state = JumpSlot::Empty;
            Err(e)
        }
        Err(e) => {
            *state = JumpSlot::Failed(e.clone(), std::time::Instant::now());
            Err(e)
        }
    }
}

/// `user@host:port` of a jump host, for messages.
fn jump_name(jump: &ConnectSettings) -> String {
    if jump.port == 22 {
        format!("{}@{}", jump.user, jump.hostname)
    } else {
        format!("{}@{}:{}", jump.user, jump.hostname, jump.port)
    }
}

/// A `ProxyCommand`'s output and input, with the process they belong to.
struct CommandStream {
    io: Join<ChildStdout, ChildStdin>,
    _child: Child,
}

/// A channel through a jump host, with the connection it runs in.
struct JumpStream {
    channel: ChannelStream<Msg>,
    _jump: Arc<Connection>,
}

/// Reading and writing go to the inner stream.
macro_rules! delegate_io {
    ($ty:ty, $field:ident) => {
        impl AsyncRead for $ty {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.$field).poll_read(cx, buf)
            }
        }

        impl AsyncWrite for $ty {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                Pin::new(&mut self.$field).poll_write(cx, buf)
            }

            fn poll_flush(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.$field).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.$field).poll_shutdown(cx)
            }
        }
    };
}

delegate_io!(CommandStream, io);
delegate_io!(JumpStream, channel);
