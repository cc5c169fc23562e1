//! The byte side of a connection: read buffer, batched write buffer, the stream, and how it
//! ends (the lingering close).
//!
//! Must not: know packet fields.

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::held::OverShare;
use super::partial::{HeldClass, PartialCheck, PartialPacket};
use super::write_queue::WriteQueue;
use crate::codec::{self, Packet, ProtocolVersion};
use crate::config::MqttConfig;

/// Bytes handled out of the read buffer past which a partial packet left behind them is moved
/// to a buffer of its own ([`Io::release_read_buffer`]): a connection's partial packet then
/// keeps at most this much beyond its own (counted) bytes alive, one read chunk. A busy
/// connection whose reads end inside a packet pays one small copy per read, not per packet.
pub(super) const COMPACT_AFTER: usize = READ_CHUNK;
/// A read that finds the buffer with less spare room than this goes through the worker's
/// scratch buffer instead of reserving: an idle connection then holds no read buffer at all.
pub(super) const READ_CHUNK: usize = 4096;
/// Size of the per-worker-thread scratch buffer reads land in before they are copied into the
/// connection's own buffer (exactly as many bytes as arrived). Large, so a busy publisher still
/// gets many packets per system call; shared, so it costs nothing per connection.
const SCRATCH: usize = 16 * 1024;
/// Stop moving queued messages into the write buffer beyond this many bytes; the socket
/// (and so the client) sets the pace, the session queue absorbs the rest.
pub(super) const WRITE_HIGH_WATER: usize = 64 * 1024;
/// Read the client's packets, however much output waits, until the answers to them queued
/// behind it (PINGRESPs, PUBACKs, SUBACKs) reach this many bytes: a client that sends
/// without reading is read no further. A subscriber that reads, slowly, behind a large
/// backlog still has its PINGREQs read, so it is not closed for keep-alive
/// (MQTT-3.1.2-24): reads held back behind the backlog closed it (issue 35, twenty-first
/// adversarial pass, G2); whether it reads at all is the socket's progress
/// ([`WriteQueue::stalled_since`]).
pub(super) const ANSWERS_WHILE_BEHIND: usize = WRITE_HIGH_WATER;

/// How long the last writes of a closing connection (its final packet, then the FIN) may
/// take: a client that does not read cannot hold the task longer.
const FINAL_WRITE_LIMIT: Duration = Duration::from_secs(1);
/// The lingering close reads and discards a still-writing client's input for at most this
/// long after the FIN ([`Io::linger`]), so the socket is not closed on unread input.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// ... and stops earlier once nothing has arrived for this long: a client that got the FIN
/// and neither writes nor closes has nothing left for a reset to spoil, so it need not hold
/// the task (or the server's shutdown) for the whole [`LINGER_TIME`].
const LINGER_IDLE: Duration = Duration::from_millis(500);
/// ... and after discarding this many bytes: a client writing faster than that is not
/// reading either, and does not get to keep the task busy.
const LINGER_BYTES: usize = 4 << 20;

thread_local! {
    /// One read scratch buffer per worker thread, borrowed only inside a synchronous `poll_read`.
    static READ_SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH].into_boxed_slice());
}

/// Polls one read of at most `max` bytes into the worker's scratch buffer and hands what
/// arrived to `take` (not called on error or `Pending`). The scratch buffer is borrowed only inside this synchronous
/// poll; re-entry (impossible with the plain streams used here) falls back to a small buffer
/// on the stack.
fn poll_read_scratch<S: AsyncRead + Unpin>(
    stream: &mut S,
    cx: &mut Context<'_>,
    max: usize,
    take: impl FnOnce(&[u8]),
) -> Poll<std::io::Result<usize>> {
    fn poll_into<S: AsyncRead + Unpin>(
        stream: &mut S,
        cx: &mut Context<'_>,
        scratch: &mut [u8],
        take: impl FnOnce(&[u8]),
    ) -> Poll<std::io::Result<usize>> {
        let mut buf = ReadBuf::new(scratch);
        ready!(Pin::new(stream).poll_read(cx, &mut buf))?;
        let filled = buf.filled();
        take(filled);
        Poll::Ready(Ok(filled.len()))
    }
    READ_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => {
            let max = max.min(scratch.len());
            poll_into(stream, cx, &mut scratch[..max], take)
        }
        Err(_) => poll_into(stream, cx, &mut [0u8; 512][..max.min(512)], take),
    })
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
    /// Everything to send, batched: many packets go out in one write, a large payload from
    /// its message ([`WriteQueue`]). Its allocation is released once all is written.
    pub out: WriteQueue,
    /// The partial packet at the front of `rbuf`, while there is one ([`Io::check_partial`]):
    /// its deadline and the bytes it counts. Boxed: 8 bytes on an idle connection.
    partial: Option<Box<PartialPacket>>,
}

/// A client's byte stream, with the TCP socket under it where there is one: how much of
/// what was sent the peer has acknowledged is the socket's to tell ([`Io::bytes_acked`]).
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin {
    /// The descriptor of the TCP socket this stream runs over, if it runs over one.
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd>;
}

impl Socket for tokio::net::TcpStream {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.as_raw_fd())
    }
}

impl<S: Socket> Socket for tokio_rustls::server::TlsStream<S> {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        self.get_ref().0.tcp_fd()
    }
}

/// Bytes the peer of TCP socket `fd` has acknowledged so far (Linux's `tcpi_bytes_acked`);
/// `None` where the system does not tell.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tcp_bytes_acked(fd: std::os::fd::RawFd) -> Option<u64> {
    // SAFETY: `info` is a plain C struct valid when zeroed, and `len` is its size; the
    // kernel writes at most `len` bytes into it and says how many.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    let done = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::from_mut(&mut info).cast(),
            &raw mut len,
        )
    };
    let through_acked = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + size_of::<u64>();
    (done == 0 && len as usize >= through_acked).then_some(info.tcpi_bytes_acked)
}

/// See the Linux version: not told here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tcp_bytes_acked(_fd: std::os::fd::RawFd) -> Option<u64> {
    None
}

impl<S: Socket> Io<S> {
    /// Bytes the client's TCP stack has acknowledged so far, if the stream runs over TCP and
    /// the system tells: it grows as the client reads what the broker sent, whether or not
    /// the kernel has woken the writer since (it does so only once a third of its buffer
    /// has drained, seconds apart behind a slow reader).
    pub(super) fn bytes_acked(&self) -> Option<u64> {
        self.stream.tcp_fd().and_then(tcp_bytes_acked)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Io<S> {
    /// Wraps a connected stream.
    pub(super) fn new(stream: S) -> Io<S> {
        Io {
            stream,
            rbuf: BytesMut::new(),
            out: WriteQueue::default(),
            partial: None,
        }
    }

    /// Polls one read into `rbuf`: straight into its spare capacity when it has some (a
    /// partial packet being completed), otherwise through the worker's scratch buffer, so no
    /// per-connection buffer is reserved before data actually arrives.
    pub(super) fn poll_read_some(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let read = if self.rbuf.capacity() - self.rbuf.len() >= READ_CHUNK {
            poll_read_buf(&mut self.stream, cx, &mut self.rbuf)
        } else {
            let rbuf = &mut self.rbuf;
            poll_read_scratch(&mut self.stream, cx, SCRATCH, |arrived| {
                rbuf.extend_from_slice(arrived);
            })
        };
        if let (Poll::Ready(Ok(n)), Some(partial)) = (&read, self.partial.as_deref_mut()) {
            partial.read_since += *n;
        }
        read
    }

    /// Whether the read buffer holds the start of a packet, or a partial packet is still
    /// counted: what [`Io::check_partial`] has to look at.
    #[inline]
    pub(super) fn holds_partial(&self) -> bool {
        !self.rbuf.is_empty() || self.partial.is_some()
    }

    /// Looks at what is left in `rbuf` once every complete packet in it was handled: the
    /// start of one packet, whose deadline is set when it is new and checked when it is not
    /// (see [`PartialPacket::check`] for `reading`). Cheap when the buffer is empty, which is
    /// where most reads end.
    ///
    /// `anonymous` with the anonymous clients' share of the budget: the client is anonymous,
    /// and its partial packet counts in that share too ([`HeldClass::Anonymous`]); one that
    /// would take it past the share gives [`PartialCheck::OverShare`], and the read buffer
    /// (a packet the connection will not finish) is let go at once.
    #[inline]
    pub(super) fn check_partial(
        &mut self,
        now: std::time::Instant,
        reading: bool,
        anonymous: Option<u64>,
        config: &MqttConfig,
    ) -> PartialCheck {
        if self.rbuf.is_empty() && self.partial.is_none() {
            return PartialCheck::Clear;
        }
        let class = match anonymous {
            Some(share) => (HeldClass::Anonymous, share),
            None => (HeldClass::Connected, 0),
        };
        let check =
            PartialPacket::check(&mut self.partial, &self.rbuf, now, reading, class, config);
        if check == PartialCheck::OverShare {
            self.rbuf = BytesMut::new();
        }
        check
    }

    /// [`Io::check_partial`] for a CONNECT still arriving: its bytes are counted apart, out of
    /// the memory budget publishers pause for (`partial::budgeted_partial_bytes`), in a
    /// share of their own and its address's part of it (`class`, from
    /// `partial::before_connect`); one past either gives [`PartialCheck::OverShare`] (the
    /// caller refuses the connection) and its bytes are let go at once.
    pub(super) fn check_partial_before_connect(
        &mut self,
        now: std::time::Instant,
        class: (HeldClass, u64),
        config: &MqttConfig,
    ) -> PartialCheck {
        let check = PartialPacket::check(&mut self.partial, &self.rbuf, now, true, class, config);
        if check == PartialCheck::OverShare {
            self.rbuf = BytesMut::new();
        }
        check
    }

    /// Stops counting the partial packet the read buffer held: the CONNECT it was is decoded,
    /// and the handshake counts what it holds now (the decoded CONNECT and what followed it)
    /// in one figure of its own. Left as it was, the CONNECT's bytes counted twice while its
    /// login verdict was due.
    pub(super) fn forget_partial(&mut self) {
        self.partial = None;
    }

    /// When the partial packet in `rbuf` must be complete, if one is held.
    pub(super) fn partial_deadline(&self) -> Option<std::time::Instant> {
        self.partial.as_deref().map(PartialPacket::deadline)
    }

    /// Drops the read buffer once every packet has been taken from it (what is kept of a
    /// packet is a copy of its own, `codec::decode`), so an idle connection holds none,
    /// whatever size a large packet made the buffer grow to. When the start of a packet is
    /// left behind the `taken` bytes just handled, and those were [`COMPACT_AFTER`] or more,
    /// what is left moves to a buffer of its own size: left in place it kept the whole
    /// allocation of what was taken alive while it counted as its own few bytes (issue 35,
    /// twelfth adversarial pass, U1: a 1 MB PUBLISH followed by the 4-byte header of the
    /// next pinned 1.06 MB per connection for the packet's deadline, counted as 4 B; 1,500
    /// anonymous connections took 1.6 GB).
    #[inline]
    pub(super) fn release_read_buffer(&mut self, taken: usize) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
            // The CONNECT's partial-packet count, if it was ever partial, goes with it.
            self.partial = None;
        } else if taken >= COMPACT_AFTER {
            self.rbuf = BytesMut::from(&self.rbuf[..]);
        }
    }

    /// Polls one write of the batch. The emptied buffer keeps its capacity for the next batch;
    /// [`Io::release_write_buffer`] gives it back once there is nothing more to send.
    pub(super) fn poll_write_some(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        self.out.poll_write_to(&mut self.stream, cx)
    }

    /// Counts what the write queue holds as the connection's own (`class`, as its partial
    /// packet counts) while the socket does not take it: called when a write of the batch
    /// found the socket full. A subscriber that stops reading kept its last batch (up to a
    /// whole large message) there, counted nowhere (issue 35, twelfth adversarial pass, U5).
    /// The allocation is what is held, so its capacity is counted: from the first unwritten
    /// byte on (a part already written stays in the allocation uncounted, at most what the
    /// socket took); see [`WriteQueue::count_unwritten`] for payloads sent from their
    /// message.
    ///
    /// # Errors
    ///
    /// [`OverShare`] when the bytes of an anonymous client would take anonymous clients past
    /// their share: the connection must close, as for a partial packet.
    pub(super) fn count_unwritten(&mut self, class: (HeldClass, u64)) -> Result<(), OverShare> {
        self.out.count_unwritten(class)
    }

    /// Drops the write buffer's allocation when it holds nothing: called when the connection
    /// found nothing more to send, so an idle connection holds no write buffer. A busy one
    /// refills the buffer before it gets here and keeps reusing it.
    #[inline]
    pub(super) fn release_write_buffer(&mut self) {
        self.out.release();
    }

    /// Polls a write of the batch (when `write` and there is one), then a read (when `read`).
    pub(super) fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        write: bool,
        read: bool,
    ) -> Poll<IoEvent> {
        if write && !self.out.is_empty() {
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

    /// Reads at most `max` bytes (at least one) into `rbuf` through the worker's scratch
    /// buffer: a handshake watching for the client's close while its login verdict is due
    /// reads no more of what the client sent behind its CONNECT than it has counted.
    pub(super) async fn read_at_most(&mut self, max: usize) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_at_most(cx, max)).await
    }

    /// Polls one read of at most `max` bytes (at least one) into `rbuf` through the worker's
    /// scratch buffer ([`Io::read_at_most`]; the handshake reads no further than its CONNECT
    /// this way).
    pub(super) fn poll_read_at_most(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<std::io::Result<usize>> {
        let max = max.clamp(1, SCRATCH);
        let rbuf = &mut self.rbuf;
        let read = poll_read_scratch(&mut self.stream, cx, max, |arrived| {
            rbuf.extend_from_slice(arrived);
        });
        if let (Poll::Ready(Ok(n)), Some(partial)) = (&read, self.partial.as_deref_mut()) {
            partial.read_since += *n;
        }
        read
    }

    /// Appends a control packet to the write batch.
    pub(super) fn queue(&mut self, packet: &Packet, version: ProtocolVersion) {
        let before = self.out.len();
        if let Err(e) = codec::encode(packet, version, self.out.batch()) {
            tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet");
        }
        self.count_if_behind(before);
    }

    /// Counts what was queued after `before` bytes as an answer behind a backlog, if there
    /// was one ([`ANSWERS_WHILE_BEHIND`]).
    #[inline]
    fn count_if_behind(&mut self, before: usize) {
        if before >= WRITE_HIGH_WATER {
            self.out.count_answer(self.out.len() - before);
        }
    }

    /// Appends a control packet that must fit the peer's Maximum Packet Size, leaving out
    /// what the spec lets a sender leave out ([`codec::encode_within`]), or nothing at all.
    pub(super) fn queue_within(&mut self, packet: &Packet, version: ProtocolVersion, max: usize) {
        let before = self.out.len();
        match codec::encode_within(packet, version, max, self.out.batch()) {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                packet = packet.name(),
                max,
                "packet above the peer's maximum size not sent"
            ),
            Err(e) => tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet"),
        }
        self.count_if_behind(before);
    }

    /// Writes out everything batched so far.
    pub(super) async fn flush(&mut self) -> std::io::Result<()> {
        while !self.out.is_empty() {
            let n = std::future::poll_fn(|cx| self.out.poll_write_to(&mut self.stream, cx)).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
        }
        self.out = WriteQueue::default();
        self.stream.flush().await
    }

    /// The first half of closing: writes out the batch (the final DISCONNECT or refusing
    /// CONNACK, and whatever was queued before it), then shuts down our side of the stream
    /// within [`FINAL_WRITE_LIMIT`]: a FIN after the last byte, preceded on a TLS stream by
    /// its `close_notify`; on a WebSocket, our close frame, and the FIN only once the client's
    /// close frame is in (else the lingering read ends on it and the socket is dropped then,
    /// `transport::ws::WsStream`).
    ///
    /// `true` when all of it, FIN included, was handed to the kernel: the peer then has
    /// something to read that a reset could destroy (every shutdown writes at least the FIN;
    /// a WebSocket peer also answers the close frame, and RFC 6455 §7.1.1 has it wait for
    /// the server to close the TCP connection after that answer), so [`Io::linger`] is worth
    /// its time. Before, a close with nothing queued (a client's DISCONNECT, a 3.x
    /// keep-alive timeout) dropped the socket at once: a WebSocket client's close frame then
    /// met a reset (MQTT.js: `write EPIPE` on a clean `end()`). Separate from the linger so
    /// the caller can settle the will and the session in between: nothing of the broker's
    /// state waits for it.
    pub(super) async fn finish_writing(&mut self) -> bool {
        let written = tokio::time::timeout(FINAL_WRITE_LIMIT, async {
            self.flush().await?;
            self.stream.shutdown().await
        })
        .await;
        matches!(written, Ok(Ok(())))
    }

    /// The second half of closing, after [`Io::finish_writing`]: reads and discards input
    /// until the peer closes (or fails), nothing arrives for [`LINGER_IDLE`], [`LINGER_TIME`]
    /// passes or [`LINGER_BYTES`] were read; then the caller drops the stream.
    ///
    /// Why: closing a TCP socket that still has unread input makes Linux send a reset instead
    /// of a FIN and discard what it has not transmitted yet. A client that is still writing
    /// (PUBLISHes or PUBRELs in flight) and whose receive window is full would then never see
    /// the final packet, i.e. never learn why it was closed; and a client whose stack drops
    /// unread input on a reset loses it even when it arrived. Reading until the client has
    /// seen our FIN and stopped lets the kernel deliver the final packet and close in order.
    /// Discarded input goes through the worker's scratch buffer and is not counted as
    /// received; the connection's own buffers are freed first, so a lingering connection
    /// holds nothing but its socket.
    pub(super) async fn linger(&mut self) {
        self.rbuf = BytesMut::new();
        self.partial = None;
        self.out = WriteQueue::default();
        let deadline = Instant::now() + LINGER_TIME;
        let mut discarded = 0;
        while discarded < LINGER_BYTES {
            let quiet_at = deadline.min(Instant::now() + LINGER_IDLE);
            let read =
                std::future::poll_fn(|cx| poll_read_scratch(&mut self.stream, cx, SCRATCH, |_| {}));
            match tokio::time::timeout_at(quiet_at, read).await {
                Ok(Ok(n)) if n > 0 => discarded += n,
                _ => return, // the peer closed, the socket failed, or time is up
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{DecodeRules, Publish, QoS};

    /// Twelfth adversarial pass, U1: the first bytes of a packet left behind a large one
    /// handled out of the same buffer move to a buffer of their own, so they do not keep the
    /// large one's allocation alive while they count as their own few bytes.
    #[test]
    fn a_partial_packet_behind_a_large_one_keeps_only_itself() {
        let (stream, _peer) = tokio::io::duplex(64);
        let mut io = Io::new(stream);
        let large = Packet::Publish(Publish {
            qos: QoS::AtMostOnce,
            topic: "big".into(),
            payload: vec![0; 1_000_000].into(),
            ..Publish::default()
        });
        codec::encode(&large, ProtocolVersion::V5, &mut io.rbuf).expect("encodes");
        io.rbuf.extend_from_slice(&[0x30, 0x80, 0x80, 0x01]); // the next PUBLISH's header
        let allocation = io.rbuf.as_ptr() as usize..io.rbuf.as_ptr() as usize + io.rbuf.capacity();
        let held = io.rbuf.len();
        let rules = DecodeRules::new(2_000_000);
        let decoded = codec::decode_with(&mut io.rbuf, Some(ProtocolVersion::V5), rules);
        assert!(matches!(decoded, Ok(Some(Packet::Publish(_)))));
        drop(decoded);
        io.release_read_buffer(held - io.rbuf.len());
        assert_eq!(&io.rbuf[..], [0x30, 0x80, 0x80, 0x01]);
        assert!(
            !allocation.contains(&(io.rbuf.as_ptr() as usize)),
            "the partial packet is still in the large packet's allocation"
        );
        // A few small packets taken (under one read chunk) leave the buffer where it is.
        let mut small = BytesMut::new();
        codec::encode(&Packet::PingReq, ProtocolVersion::V5, &mut small).expect("encodes");
        io.rbuf = small.clone();
        io.rbuf.extend_from_slice(&[0x30]);
        let before = io.rbuf.as_ptr() as usize;
        let held = io.rbuf.len();
        let decoded = codec::decode_with(&mut io.rbuf, Some(ProtocolVersion::V5), rules);
        assert!(matches!(decoded, Ok(Some(Packet::PingReq))));
        io.release_read_buffer(held - io.rbuf.len());
        assert_eq!(io.rbuf.as_ptr() as usize, before + small.len());
    }
}
