//! The byte side of a connection: read buffer, batched write buffer, and the split stream.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::codec::{self, Packet, ProtocolVersion};

/// Removes the Reason String and User Properties of a packet.
fn strip_problem_info(packet: &mut Packet) {
    let (reason, users) = match packet {
        Packet::ConnAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::SubAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::UnsubAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::Disconnect(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::Auth(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        _ => return,
    };
    *reason = None;
    users.clear();
}

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

    /// Appends a control packet that must fit the peer's Maximum Packet Size: if it does not,
    /// its Reason String and User Properties are dropped (they are the only optional parts
    /// the spec lets a sender leave out, MQTT-3.2.2-19/20 and alike); if it still does not,
    /// it is not sent.
    pub fn queue_within(&mut self, packet: &Packet, version: ProtocolVersion, max: usize) {
        let start = self.wbuf.len();
        self.queue(packet, version);
        if self.wbuf.len() - start <= max {
            return;
        }
        self.wbuf.truncate(start);
        let mut slim = packet.clone();
        strip_problem_info(&mut slim);
        self.queue(&slim, version);
        if self.wbuf.len() - start > max {
            self.wbuf.truncate(start);
            tracing::debug!(
                packet = packet.name(),
                max,
                "packet above the peer's maximum size not sent"
            );
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
