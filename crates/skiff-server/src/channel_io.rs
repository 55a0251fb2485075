//! Moving bytes between a channel and what serves it (a command's stdin,
//! stdout, stderr or terminal; a forwarding's socket), with every byte
//! skiffd holds on the way counted in its connection's queue
//! ([`crate::queue_budget`]).
//!
//! Input: [`spawn_input`] takes each packet off russh at once, so that a
//! consumer that stops reading (a command that never reads its stdin, a
//! destination that stops reading) never stops the connection by filling
//! russh's per-channel queue; what it takes waits in a queue of its own,
//! each chunk counted until its consumer wrote it on. The connection's
//! handler, which sees every packet first, keeps that count within budget
//! by closing windows and pacing or stopping its reading.
//!
//! Output: [`forward_output`] reads a command's output (or a destination's
//! data) into one buffer per stream, allocated only while there is
//! something to read and counted while it exists, and writes it to the
//! channel, which waits for the client's window. Output is never held back
//! for the budget: a command may be waiting for its output to go before it
//! reads the input that fills the budget.

use std::sync::Arc;

use bytes::Bytes;
use russh::{ChannelMsg, ChannelReadHalf};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::channel_idle::ChannelClock;
use crate::queue_budget::ChannelQueue;

/// An input chunk and the receipt that counts it.
pub type InputChunk = (Bytes, InputReceipt);

/// Held while an input chunk waits for its consumer; dropped once it is
/// written (or given up), which gives its bytes back to the connection's
/// queue and, for a session, counts them as read by the command.
pub struct InputReceipt {
    queue: Arc<ChannelQueue>,
    len: usize,
    consumed: Option<Arc<watch::Sender<u64>>>,
}

impl Drop for InputReceipt {
    fn drop(&mut self) {
        self.queue.release_packet(self.len);
        if let Some(consumed) = &self.consumed {
            let len = self.len as u64;
            consumed.send_modify(|total| *total += len);
        }
    }
}

/// Drains the channel's messages as they come and hands its data to
/// `feed` (which writes it on and drops each receipt once written). End of
/// input ends the queue; the client's close, the connection's end, or the
/// channel's idle timeout (`clock`) ends the task, which returns once
/// `feed` has returned too. Extended data, and
/// data after `feed` stopped taking it, are dropped at once. `consumed`
/// counts the bytes `feed` wrote (a session's input reports). Every
/// packet counts as traffic on `clock`.
pub fn spawn_input<F, Fut>(
    mut reader: ChannelReadHalf,
    queue: Arc<ChannelQueue>,
    consumed: Option<Arc<watch::Sender<u64>>>,
    clock: Arc<ChannelClock>,
    feed: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnOnce(mpsc::UnboundedReceiver<InputChunk>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(feed(rx));
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let expired = clock.expired();
        tokio::pin!(expired);
        loop {
            let msg = tokio::select! {
                msg = reader.wait() => msg,
                () = &mut expired => None,
            };
            let Some(msg) = msg else { break };
            if matches!(
                msg,
                ChannelMsg::Data { .. } | ChannelMsg::ExtendedData { .. }
            ) {
                clock.touch();
            }
            match msg {
                ChannelMsg::Data { data } => {
                    let receipt = InputReceipt {
                        queue: queue.clone(),
                        len: data.len(),
                        consumed: consumed.clone(),
                    };
                    let Some(sender) = tx.as_ref() else {
                        continue; // the receipt gives the bytes back
                    };
                    if sender.send((data, receipt)).is_err() {
                        tx = None; // the consumer stopped; keep draining
                    }
                }
                ChannelMsg::ExtendedData { data, .. } => queue.release_packet(data.len()),
                ChannelMsg::Eof => tx = None,
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        drop(tx);
        let _ = writer.await;
    })
}

/// Where output is read from: a pipe, a terminal's master side (which reads
/// 0 once every holder of the terminal closed it), or a socket.
pub trait OutputSource: Send {
    /// Waits until a read would not wait (data, end of file, or an error).
    fn ready(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send + '_;
    fn read_some<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a;
}

impl OutputSource for Arc<crate::process::PtyMaster> {
    fn ready(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send + '_ {
        crate::process::PtyMaster::readable(self)
    }

    fn read_some<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a {
        crate::process::PtyMaster::read(self, buf)
    }
}

/// A pipe or a socket's read half: ready when readable, read as an
/// `AsyncRead`.
macro_rules! readable_output_source {
    ($($half:ty),+) => {$(
        impl OutputSource for $half {
            fn ready(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send + '_ {
                self.readable()
            }

            fn read_some<'a>(
                &'a mut self,
                buf: &'a mut [u8],
            ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a {
                self.read(buf)
            }
        }
    )+};
}

readable_output_source!(
    tokio::net::unix::pipe::Receiver,
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::unix::OwnedReadHalf
);

/// The size of a stream's output buffer.
pub const OUTPUT_CHUNK: usize = 32 * 1024;

/// Copies output (`from`) to the channel (`to`) until it ends or the
/// channel does, reading nothing while `paused` is set (a skiff client's
/// `pause-output@skiff`: the command then blocks on its full pipe, as it
/// would writing to a slow local reader). The buffer exists, counted in
/// `queue`, only from the moment there is something to read until a read
/// no longer fills it. Every write counts as traffic on `clock`; the
/// copy stops when the channel is closed for idleness.
pub async fn forward_output<R, W>(
    from: &mut R,
    to: &mut W,
    mut paused: Option<watch::Receiver<bool>>,
    queue: &Arc<ChannelQueue>,
    clock: &ChannelClock,
) where
    R: OutputSource,
    W: AsyncWrite + Unpin,
{
    let mut buffer: Option<(Vec<u8>, crate::queue_budget::Held)> = None;
    let copy = async {
        loop {
            if let Some(paused) = paused.as_mut() {
                // An error means the sender is gone, and then nothing pauses.
                let _ = paused.wait_for(|p| !*p).await;
            }
            if buffer.is_none() {
                if from.ready().await.is_err() {
                    break;
                }
                buffer = Some((vec![0u8; OUTPUT_CHUNK], queue.hold(OUTPUT_CHUNK)));
            }
            let (buf, _) = buffer.as_mut().expect("just made");
            match from.read_some(buf).await {
                Ok(n @ 1..) => {
                    clock.touch();
                    if to.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    clock.touch();
                    if n < buf.len() {
                        // Probably drained: give the buffer back until more comes.
                        buffer = None;
                    }
                }
                _ => break,
            }
        }
    };
    // A channel closed for idleness reads no more: the source sees its
    // reader gone, as when sshd closes a timed-out channel's descriptors.
    tokio::select! {
        () = copy => {}
        () = clock.expired() => {}
    }
    drop(buffer);
    let _ = to.flush().await;
}
