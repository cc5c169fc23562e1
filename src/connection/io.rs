//! The byte side of a connection: read buffer, batched write buffer, and the split stream.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::codec::{self, Packet, ProtocolVersion};

/// Bytes reserved before each socket read. Small, so idle connections stay cheap; a busy
/// connection's reads still fill whole chunks because the buffer grows to what arrives.
pub const READ_CHUNK: usize = 4096;
/// Stop moving queued messages into the write buffer beyond this many bytes; the socket
/// (and so the client) sets the pace, the session queue absorbs the rest.
pub const WRITE_HIGH_WATER: usize = 64 * 1024;

/// One client's transport, split so reads and writes proceed concurrently in one task.
pub struct Io<S> {
    pub rd: ReadHalf<S>,
    pub wr: WriteHalf<S>,
    pub rbuf: BytesMut,
    /// Everything to send, batched: many packets go out in one write.
    pub wbuf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite> Io<S> {
    /// Wraps a connected stream.
    pub fn new(stream: S) -> Io<S> {
        let (rd, wr) = tokio::io::split(stream);
        Io {
            rd,
            wr,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
        }
    }

    /// Makes room for the next read.
    #[inline]
    pub fn prepare_read(&mut self) {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
    }

    /// Reads once; 0 means the peer closed.
    pub async fn read_some(&mut self) -> std::io::Result<usize> {
        self.prepare_read();
        self.rd.read_buf(&mut self.rbuf).await
    }

    /// Appends a control packet to the write batch.
    pub fn queue(&mut self, packet: &Packet, version: ProtocolVersion) {
        if let Err(e) = codec::encode(packet, version, &mut self.wbuf) {
            tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet");
        }
    }

    /// Writes out everything batched so far.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        if !self.wbuf.is_empty() {
            self.wr.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        self.wr.flush().await
    }
}
