//! `ssh -W host:port`: joins standard input and output to a TCP connection
//! that the server opens to `host:port` (a `direct-tcpip` channel), so that
//! skiff can serve as another SSH client's `ProxyCommand`.

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
    mut input: I,
    mut output: O,
) -> Result<(), SkiffError>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
{
    let name = &conn.settings.hostname;
    let channel = conn
        .handle
        .channel_open_direct_tcpip(host, u32::from(port), "127.0.0.1", 0)
        .await
        .map_err(|e| {
            SkiffError::new(
                ErrorKind::Connect,
                format!("{name} could not open a connection to {host} port {port}: {e}"),
            )
        })?;
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
