//! The byte side of a connection: read buffer, batched write buffer, and the stream.

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::codec::{self, Packet, ProtocolVersion};

/// A read that finds the buffer with less spare room than this goes through the worker's
/// scratch buffer instead of reserving: an idle connection then holds no read buffer at all.
pub const READ_CHUNK: usize = 4096;
/// Size of the per-worker-thread scratch buffer reads land in before they are copied into the
/// connection's own buffer (exactly as many bytes as arrived). Large, so a busy publisher still
/// gets many packets per system call; shared, so it costs nothing per connection.
const SCRATCH: usize = 16 * 1024;
/// Stop moving queued messages into the write buffer beyond this many bytes; the socket
/// (and so the client) sets the pace, the session queue absorbs the rest.
pub const WRITE_HIGH_WATER: usize = 64 * 1024;

thread_local! {
    /// One read scratch buffer per worker thread, borrowed only inside a synchronous `poll_read`.
    static READ_SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH].into_boxed_slice());
}

/// Polls one read into the spare capacity of `buf`. The `read_buf` future holds no state
/// before it completes, so building a fresh one per poll is sound and costs nothing.
fn poll_read_buf<S: AsyncRead + Unpin>(
    stream: &mut S,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    std::pin::pin!(stream.read_buf(buf)).poll(cx)
}

/// What one poll of the socket produced (see [`Io::poll_io`]).
pub(super) enum IoEvent {
    /// A write completed: bytes written (0 means the peer is gone).
    Written(std::io::Result<usize>),
    /// A read completed: bytes read (0 means the peer closed).
    Read(std::io::Result<usize>),
}

/// One client's transport. The stream is not split: reads and writes are polled together by
/// [`Io::poll_io`], which avoids `tokio::io::split`'s shared allocation and lock per connection.
pub(super) struct Io<S> {
    /// The connected stream (TCP today; anything `AsyncRead + AsyncWrite + Unpin`).
    pub stream: S,
    /// Unparsed input; empty with no capacity while the connection is idle.
    pub rbuf: BytesMut,
    /// Everything to send, batched: many packets go out in one write. Released once written.
    pub wbuf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Io<S> {
    /// Wraps a connected stream.
    pub(super) fn new(stream: S) -> Io<S> {
        Io {
            stream,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
        }
    }

    /// Polls one read into `rbuf`: straight into its spare capacity when it has some (a
    /// partial packet being completed), otherwise through the worker's scratch buffer, so no
    /// per-connection buffer is reserved before data actually arrives.
    pub(super) fn poll_read_some(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() >= READ_CHUNK {
            return poll_read_buf(&mut self.stream, cx, &mut self.rbuf);
        }
        let stream = &mut self.stream;
        let rbuf = &mut self.rbuf;
        READ_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => {
                let mut buf = ReadBuf::new(&mut scratch[..]);
                match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) => {
                        let filled = buf.filled();
                        rbuf.extend_from_slice(filled);
                        Poll::Ready(Ok(filled.len()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }
            // Re-entered (cannot happen with the plain streams used here): reserve instead.
            Err(_) => {
                rbuf.reserve(READ_CHUNK);
                poll_read_buf(stream, cx, rbuf)
            }
        })
    }

    /// Drops the read buffer once every packet has been taken from it (their payloads keep the
    /// bytes they need alive), so an idle connection holds none. Even an empty buffer with no
    /// spare capacity still shares the allocation its packets were split from, so it is
    /// replaced whenever it is empty, not only when it has capacity left.
    #[inline]
    pub(super) fn release_read_buffer(&mut self) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        }
    }

    /// Polls one write of the batch. The emptied buffer keeps its capacity for the next batch;
    /// [`Io::release_write_buffer`] gives it back once there is nothing more to send.
    pub(super) fn poll_write_some(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.wbuf))?;
        if n == self.wbuf.len() {
            self.wbuf.clear();
        } else {
            self.wbuf.advance(n);
        }
        Poll::Ready(Ok(n))
    }

    /// Drops the write buffer's allocation when it holds nothing: called when the connection
    /// found nothing more to send, so an idle connection holds no write buffer. A busy one
    /// refills the buffer before it gets here and keeps reusing it.
    #[inline]
    pub(super) fn release_write_buffer(&mut self) {
        if self.wbuf.is_empty() && self.wbuf.capacity() > 0 {
            self.wbuf = BytesMut::new();
        }
    }

    /// Polls a write of the batch (when `write` and there is one), then a read (when `read`).
    pub(super) fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        write: bool,
        read: bool,
    ) -> Poll<IoEvent> {
        if write && !self.wbuf.is_empty() {
            if let Poll::Ready(r) = self.poll_write_some(cx) {
                return Poll::Ready(IoEvent::Written(r));
            }
        }
        if read {
            if let Poll::Ready(r) = self.poll_read_some(cx) {
                return Poll::Ready(IoEvent::Read(r));
            }
        }
        Poll::Pending
    }

    /// Reads once; 0 means the peer closed.
    pub(super) async fn read_some(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_some(cx)).await
    }

    /// Appends a control packet to the write batch.
    pub(super) fn queue(&mut self, packet: &Packet, version: ProtocolVersion) {
        if let Err(e) = codec::encode(packet, version, &mut self.wbuf) {
            tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet");
        }
    }

    /// Appends a control packet that must fit the peer's Maximum Packet Size, leaving out
    /// what the spec lets a sender leave out ([`codec::encode_within`]), or nothing at all.
    pub(super) fn queue_within(&mut self, packet: &Packet, version: ProtocolVersion, max: usize) {
        match codec::encode_within(packet, version, max, &mut self.wbuf) {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                packet = packet.name(),
                max,
                "packet above the peer's maximum size not sent"
            ),
            Err(e) => tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet"),
        }
    }

    /// Writes out everything batched so far.
    pub(super) async fn flush(&mut self) -> std::io::Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf = BytesMut::new();
        }
        self.stream.flush().await
    }
}
