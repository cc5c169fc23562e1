//! [`WsStream`]: a WebSocket seen as the byte stream MQTT expects, framed and unframed as the
//! bytes pass (`frames`), with nothing buffered below the connection.
//!
//! Reads land in the caller's buffer and are decoded there: headers taken out, payloads
//! unmasked in place. A ping is answered from the read side when no data frame is being
//! written, else right after that frame (a control frame cannot cut one). A write is one
//! binary frame: its header, then the caller's bytes as they are (vectored when the socket
//! can).
//!
//! Must not: allocate per frame or per message; hold a data payload; start a frame before
//! the one being written is complete; return `Ok(0)` for a non-empty write.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frames::{self, ControlFrame, Inbound, CLOSE, PONG};

/// Reads whose bytes were all headers or control frames one poll goes through before it
/// yields: a client sending nothing but pings cannot hold the worker.
const READS_PER_POLL: usize = 16;

/// A WebSocket as the byte stream MQTT runs over: reads yield the payloads of binary frames
/// in order (packets may span frames, or several share one [MQTT-6.0.0-2]); one write
/// becomes one binary frame (the connection batches its packets into one write). A text frame
/// or a protocol error fails the read (the connection closes) [MQTT-6.0.0-1]; the client's
/// close frame is answered and reads as the end of the stream.
#[derive(Debug)]
pub(crate) struct WsStream<S> {
    stream: S,
    /// What came behind the upgrade request in its read: the start of the frame stream, read
    /// before the socket (and let go once read).
    early: Bytes,
    inbound: Inbound,
    /// The data frame being written: its header (and how much of it is out), and how many
    /// of its payload bytes are still to come from the caller.
    header: [u8; 10],
    header_len: u8,
    header_sent: u8,
    payload_left: usize,
    /// A pong or close frame being written.
    control: ControlFrame,
    /// A close frame is due: ours (shutdown) or the answer to the client's.
    close_wanted: bool,
    /// Our close frame was started: no frame may follow it (RFC 6455 §5.5.1).
    close_sent: bool,
    /// A control frame went out since the socket was last flushed (a TLS stream may hold it).
    flush_wanted: bool,
    /// The client's frames failed the connection, with this close code (RFC 6455 §7.1.7).
    failed: Option<u16>,
}

impl<S> WsStream<S> {
    /// The stream after a completed upgrade; `early` is what came behind the request.
    pub(super) fn new(stream: S, early: Bytes) -> WsStream<S> {
        WsStream {
            stream,
            early,
            inbound: Inbound::default(),
            header: [0; 10],
            header_len: 0,
            header_sent: 0,
            payload_left: 0,
            control: ControlFrame::default(),
            close_wanted: false,
            close_sent: false,
            flush_wanted: false,
            failed: None,
        }
    }

    /// No data frame is being written: a control frame may go out.
    fn between_frames(&self) -> bool {
        self.payload_left == 0 && self.header_sent == self.header_len
    }

    /// The reading is over: the client closed, or its frames failed the connection.
    fn read_ended(&self) -> bool {
        self.inbound.closed() || self.failed.is_some()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Writes the control frames due (the one in progress, then a close, else a pong for the
    /// latest ping) while no data frame is being written; ready once none is left.
    fn poll_control(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.between_frames() {
            return Poll::Ready(Ok(()));
        }
        loop {
            let unsent = self.control.unsent();
            if !unsent.is_empty() {
                let n = ready!(Pin::new(&mut self.stream).poll_write(cx, unsent))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.control.advance(n);
                self.flush_wanted = true;
            } else if let Some(ping) = self.inbound.take_pong().filter(|_| !self.close_sent) {
                // Pings that came before a close are still answered, none after ours.
                self.control.start(PONG, ping);
            } else if self.close_wanted && !self.close_sent {
                // Ours after a failure, else the client's echoed (RFC 6455 §5.5.1), else none.
                let code = self.failed.or(self.inbound.close_code());
                let code = code.map(u16::to_be_bytes);
                self.control
                    .start(CLOSE, code.as_ref().map_or(&[][..], |c| &c[..]));
                self.close_sent = true;
            } else if self.flush_wanted {
                ready!(Pin::new(&mut self.stream).poll_flush(cx))?;
                self.flush_wanted = false;
            } else {
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Fills `buf` with raw bytes: what came behind the upgrade request first, then the
    /// socket's.
    fn poll_raw(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.early.is_empty() {
            return Pin::new(&mut self.stream).poll_read(cx, buf);
        }
        let n = self.early.len().min(buf.remaining());
        buf.put_slice(&self.early[..n]);
        self.early.advance(n);
        if self.early.is_empty() {
            self.early = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: crate::connection::Socket> crate::connection::Socket for WsStream<S> {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        self.stream.tcp_fd()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read_ended() {
            // The answer to the client's close goes out here or at shutdown.
            let _ = this.poll_control(cx)?;
            return Poll::Ready(Ok(()));
        }
        for _ in 0..READS_PER_POLL {
            // A pong (or close) due while the connection waits to read.
            let _ = this.poll_control(cx)?;
            let start = buf.filled().len();
            ready!(this.poll_raw(cx, buf))?;
            let end = buf.filled().len();
            if end == start {
                return Poll::Ready(Ok(())); // the socket's end (or no room in `buf`)
            }
            let decoded = this.inbound.decode(&mut buf.filled_mut()[start..end]);
            let kept = match decoded {
                Ok(kept) => kept,
                Err(error) => {
                    buf.set_filled(start);
                    this.failed = Some(error.close_code());
                    // The close frame with its code, now if the socket takes it (RFC 6455
                    // §7.1.7): the connection drops the stream on this error without a
                    // shutdown (thirteenth adversarial pass: no close frame was ever sent).
                    this.close_wanted = true;
                    let _ = this.poll_control(cx);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
                }
            };
            buf.set_filled(start + kept);
            if this.inbound.closed() {
                this.close_wanted = true;
            }
            let _ = this.poll_control(cx)?;
            if kept > 0 || this.inbound.closed() {
                return Poll::Ready(Ok(()));
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    /// Writes `buf` as one binary frame: what it returns counts the payload bytes the socket
    /// took. Pending or short, the caller polls again with what is left first (as
    /// `write_all` and the connection's batch do), and the frame goes on where it stopped.
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.between_frames() {
            ready!(this.poll_control(cx))?;
            if this.close_sent {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "WebSocket closed",
                )));
            }
            this.header_len = frames::data_header(buf.len(), &mut this.header) as u8;
            this.header_sent = 0;
            this.payload_left = buf.len();
        }
        let payload = &buf[..this.payload_left.min(buf.len())];
        let taken = loop {
            let header = &this.header[usize::from(this.header_sent)..usize::from(this.header_len)];
            if header.is_empty() {
                let n = ready!(Pin::new(&mut this.stream).poll_write(cx, payload))?;
                break n;
            }
            let slices = [IoSlice::new(header), IoSlice::new(payload)];
            let n = ready!(Pin::new(&mut this.stream).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                break 0;
            }
            let of_header = n.min(header.len());
            this.header_sent += of_header as u8;
            if n > of_header {
                break n - of_header;
            }
        };
        if taken == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        this.payload_left -= taken;
        if this.between_frames() {
            // A pong waiting for this frame to end may go now; if the socket is full, the
            // next read or write sends it.
            let _ = this.poll_control(cx)?;
        }
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_control(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    /// Sends our close frame (after the data frame being written, if it is complete), then
    /// shuts the socket once the client's close frame is in, or at once when the client's
    /// frames failed the connection (RFC 6455 §7.1.1, §7.1.7). Otherwise the socket stays
    /// open for the client's answer: the lingering read that follows ends on it, and the
    /// connection is dropped then, so the server closes the TCP connection first and cleanly.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.between_frames() {
            // A frame cannot be cut short, nor a close frame put inside it.
            return Pin::new(&mut this.stream).poll_shutdown(cx);
        }
        this.close_wanted = true;
        ready!(this.poll_control(cx))?;
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        if this.read_ended() {
            Pin::new(&mut this.stream).poll_shutdown(cx)
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const MASK: [u8; 4] = [1, 2, 3, 4];

    fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0x80 | opcode, 0x80 | payload.len() as u8];
        out.extend_from_slice(&MASK);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        out
    }

    /// Bytes behind the upgrade request are read first; a ping is answered while the
    /// connection reads; the client's close is answered and ends the read; shutdown then
    /// closes the socket.
    #[tokio::test]
    async fn pings_are_answered_and_a_close_ends_the_stream() {
        let (ours, mut peer) = tokio::io::duplex(4096);
        let mut early = client_frame(0x2, b"early ");
        early.extend_from_slice(&client_frame(0x2, b"bir")[..4]);
        let mut ws = WsStream::new(ours, Bytes::from(early));
        let mut rest = client_frame(0x2, b"bir")[4..].to_vec();
        rest.extend(client_frame(0x9, b"ping!"));
        rest.extend(client_frame(0x2, b"d"));
        rest.extend(client_frame(0x8, &1000u16.to_be_bytes()));
        peer.write_all(&rest).await.expect("write");
        let mut got = Vec::new();
        ws.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"early bird");
        ws.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        peer.read_to_end(&mut answer).await.expect("read");
        assert_eq!(
            answer,
            [0x8A, 5, b'p', b'i', b'n', b'g', b'!', 0x88, 2, 0x03, 0xE8]
        );
    }

    /// A write is one binary frame; a socket that takes a few bytes at a time gets the frame
    /// continued, never a second header, and each write returns a payload count > 0.
    #[tokio::test]
    async fn a_frame_written_in_pieces_is_one_frame() {
        let (ours, mut peer) = tokio::io::duplex(3);
        let mut ws = WsStream::new(ours, Bytes::new());
        let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 4 + 300 + 2 + 2];
            peer.read_exact(&mut got).await.expect("read");
            got
        });
        ws.write_all(&payload).await.expect("write");
        ws.write_all(b"ok").await.expect("write");
        ws.flush().await.expect("flush");
        let got = reader.await.expect("task");
        assert_eq!(got[..4], [0x82, 126, 1, 44]);
        assert_eq!(got[4..304], payload[..]);
        assert_eq!(got[304..], [0x82, 2, b'o', b'k']);
    }

    /// A ping that arrives while a data frame is half written is answered right after that
    /// frame, never inside it (RFC 6455 §5.4: control frames go between frames).
    #[tokio::test]
    async fn a_pong_waits_for_the_frame_being_written() {
        let (ours, mut peer) = tokio::io::duplex(16);
        let mut ws = WsStream::new(ours, Bytes::new());
        let payload = vec![7u8; 100];
        // The socket takes 16 bytes: the 2-byte header and 14 of the payload.
        let first =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut ws).poll_write(cx, &payload)))
                .await;
        assert!(matches!(first, Poll::Ready(Ok(14))), "{first:?}");
        let mut got = vec![0u8; 16];
        peer.read_exact(&mut got).await.expect("read");
        // The socket has room again, and a ping comes in.
        peer.write_all(&client_frame(0x9, b"p"))
            .await
            .expect("write");
        let mut buf = [0u8; 16];
        let read = std::future::poll_fn(|cx| {
            let mut read_buf = ReadBuf::new(&mut buf);
            Poll::Ready(Pin::new(&mut ws).poll_read(cx, &mut read_buf).is_pending())
        })
        .await;
        assert!(read, "a ping is nothing to read");
        let reader = tokio::spawn(async move {
            got.resize(2 + 100 + 3, 0);
            peer.read_exact(&mut got[16..]).await.expect("read");
            got
        });
        ws.write_all(&payload[14..]).await.expect("write");
        ws.flush().await.expect("flush");
        let got = reader.await.expect("task");
        assert_eq!(got[..2], [0x82, 100]);
        assert_eq!(got[2..102], payload[..]);
        assert_eq!(got[102..], [0x8A, 1, b'p']);
    }

    /// RFC 6455 §7.1.1: our close goes out on shutdown, and the socket stays open until the
    /// client's close frame is read; a text frame fails the read [MQTT-6.0.0-1] and then the
    /// shutdown closes at once, with 1003 (RFC 6455 §7.4.1).
    #[tokio::test]
    async fn shutdown_waits_for_the_clients_close_unless_failed() {
        let (ours, mut peer) = tokio::io::duplex(4096);
        let mut ws = WsStream::new(ours, Bytes::new());
        ws.shutdown().await.expect("shutdown");
        let mut close = [0u8; 2];
        peer.read_exact(&mut close).await.expect("our close");
        assert_eq!(close, [0x88, 0]);
        let open = std::future::poll_fn(|cx| {
            let mut one = [0u8; 1];
            let mut read_buf = ReadBuf::new(&mut one);
            Poll::Ready(
                Pin::new(&mut peer)
                    .poll_read(cx, &mut read_buf)
                    .is_pending(),
            )
        })
        .await;
        assert!(open, "the socket stays open for the client's close frame");
        peer.write_all(&client_frame(0x9, b"late ping"))
            .await
            .expect("write");
        peer.write_all(&client_frame(0x8, b""))
            .await
            .expect("write");
        let mut rest = Vec::new();
        assert_eq!(ws.read_to_end(&mut rest).await.expect("read"), 0);
        assert!(
            ws.write(b"x").await.is_err(),
            "nothing after the close frame"
        );
        drop(ws);
        peer.read_to_end(&mut rest).await.expect("read");
        assert!(rest.is_empty(), "no pong after our close: {rest:?}");

        let (ours, mut peer) = tokio::io::duplex(4096);
        let mut ws = WsStream::new(ours, Bytes::new());
        peer.write_all(&client_frame(0x1, b"text"))
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        assert!(
            ws.read(&mut buf).await.is_err(),
            "a text frame fails the read"
        );
        ws.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        peer.read_to_end(&mut answer).await.expect("closed at once");
        assert_eq!(answer, [0x88, 2, 0x03, 0xEB]);
    }
}
