//! `ssh -W host:port`: joins standard input and output to a TCP connection
//! that the server opens to `host:port` (a `direct-tcpip` channel), so that
//! skiff can serve as another SSH client's `ProxyCommand`. Directly, or on
//! a pooled connection (see [`crate::pool::Pool::forward_stdio`]).

use russh::client::Msg;
use russh::Channel;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::{Connection, ErrorKind, SkiffError};

/// Copies `input` to `host:port` through `conn` and what comes back to
/// `output`, until the server closes the connection. The end of `input`
/// is passed on as end-of-file; the server's close ends the forward even if
/// `input` is still open (as ssh -W does).
pub async fn forward_stdio<I, O>(
    conn: &Connection,
    host: &str,
    port: u16,
    input: I,
    output: O,
) -> Result<(), SkiffError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
{
    let channel = open_direct(conn, host, port).await?;
    relay_stdio(channel, &conn.settings.hostname, host, port, input, output).await
}

/// Opens a `direct-tcpip` channel to `host:port`. A refusal by the server
/// is [`ErrorKind::Protocol`] (another connection would fare no better); a
/// connection that is gone is [`ErrorKind::Connect`].
pub async fn open_direct(
    conn: &Connection,
    host: &str,
    port: u16,
) -> Result<Channel<Msg>, SkiffError> {
    let name = &conn.settings.hostname;
    conn.handle
        .channel_open_direct_tcpip(host, u32::from(port), "127.0.0.1", 0)
        .await
        .map_err(|e| match e {
            russh::Error::ChannelOpenFailure(reason) => SkiffError::new(
                ErrorKind::Protocol,
                format!(
                    "{name} could not open a connection to {host} port {port}: {}",
                    refusal_text(&reason)
                ),
            ),
            other => SkiffError::new(
                ErrorKind::Connect,
                format!("{name}: connection lost while opening a forward to {host} port {port}: {other}"),
            ),
        })
}

/// The reason a server gave for refusing a channel, as ssh words it.
pub(crate) fn refusal_text(reason: &russh::ChannelOpenFailure) -> &'static str {
    use russh::ChannelOpenFailure as Why;
    match reason {
        Why::AdministrativelyProhibited => "administratively prohibited",
        Why::ConnectFailed => "connect failed",
        Why::UnknownChannelType => "unknown channel type",
        Why::ResourceShortage => "resource shortage",
        _ => "refused",
    }
}

/// The copying half of [`forward_stdio`], on a channel already open.
pub async fn relay_stdio<I, O>(
    channel: Channel<Msg>,
    name: &str,
    host: &str,
    port: u16,
    mut input: I,
    mut output: O,
) -> Result<(), SkiffError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
{
    let (mut from_server, mut to_server) = tokio::io::split(channel.into_stream());
    let upload = tokio::spawn(async move {
        let copied = tokio::io::copy(&mut input, &mut to_server).await;
        let _ = to_server.shutdown().await;
        copied
    });
    let downloaded = tokio::io::copy(&mut from_server, &mut output).await;
    let _ = output.flush().await;
    upload.abort();
    downloaded.map(drop).map_err(|e| {
        SkiffError::new(
            ErrorKind::Connect,
            format!("{name}: forwarding to {host} port {port} failed: {e}"),
        )
    })
}
