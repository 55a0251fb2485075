//! A stream that shows what it reads to an observer ([`Tap`]) while passing
//! every byte through unchanged, both ways. The connection records the
//! server's identification line with one ([`crate::server_id`]); an SFTP
//! copy counts what the server sends with another (the copy's watchdog).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Sees the bytes a [`ReadTap`] reads, in order.
pub trait Tap: Unpin {
    fn saw(&mut self, bytes: &[u8]);
}

/// `inner`, with what it reads shown to `tap`.
pub struct ReadTap<S, T> {
    inner: S,
    tap: T,
}

impl<S, T> ReadTap<S, T> {
    pub fn new(inner: S, tap: T) -> Self {
        ReadTap { inner, tap }
    }
}

impl<S: AsyncRead + Unpin, T: Tap> AsyncRead for ReadTap<S, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.tap.saw(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, T: Unpin> AsyncWrite for ReadTap<S, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Collect(Vec<u8>);

    impl Tap for Collect {
        fn saw(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
    }

    #[tokio::test]
    async fn the_tap_sees_what_is_read_and_writes_pass_through() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut tapped = ReadTap::new(ours, Collect(Vec::new()));
        theirs.write_all(b"hello ").await.unwrap();
        theirs.write_all(b"world").await.unwrap();
        let mut got = [0u8; 11];
        tapped.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
        assert_eq!(tapped.tap.0, b"hello world");
        tapped.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        theirs.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
    }
}
