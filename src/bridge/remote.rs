//! The bridge's MQTT connection to its remote broker, spoken with the project's own codec.
//!
//! Why not `rumqttc`: it keeps the in-flight window in its own memory, picks packet ids
//! itself and reconnects on its own schedule, so after a crash it cannot re-send what the
//! bridge's durable session says is unacknowledged, under the ids the remote knows; and its
//! open collision / unsolicited-PUBREL bugs would break the guarantee. Driving the link with
//! our codec, the durable session decides every packet id, every re-send and every ack.
//!
//! [`RemoteIo`] owns the two halves of the stream and the two buffers; it does no waiting of
//! its own beyond what the engine's `select!` polls (reads into the read buffer and single
//! writes from the write buffer are both cancel-safe).
//!
//! Must not: decide what to send.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::codec::{
    self, ConnAck, Connect, DecodeError, EncodeError, Packet, ProtocolVersion, ReasonCode,
};

/// Largest packet accepted from the remote unless configured lower (the codec's ceiling).
const MAX_INCOMING_PACKET: usize = 268_435_460;

/// Why the remote connection failed or ended.
#[derive(Debug, Error)]
pub(crate) enum RemoteError {
    /// Connecting (resolve, TCP, TLS) failed.
    #[error("{0}")]
    Connect(String),
    /// Reading or writing the socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The remote closed the connection.
    #[error("the remote closed the connection")]
    Closed,
    /// The remote sent bytes that are not a valid packet.
    #[error("malformed packet from the remote: {0}")]
    Decode(#[from] DecodeError),
    /// A packet could not be encoded (a field over its wire limit).
    #[error("cannot encode a packet for the remote: {0}")]
    Encode(#[from] EncodeError),
    /// CONNACK with a failure code.
    #[error("the remote refused the connection: {0}")]
    Refused(String),
    /// No CONNACK in time.
    #[error("no CONNACK from the remote within {0:?}")]
    HandshakeTimeout(Duration),
    /// The remote broke the protocol (an unexpected packet, an ack for an unknown stage).
    #[error("protocol error from the remote: {0}")]
    Protocol(String),
    /// The remote sent DISCONNECT.
    #[error("the remote disconnected (reason {0:#04x})")]
    Disconnected(u8),
    /// Nothing came back for a keep-alive period after a PINGREQ.
    #[error("keep-alive: no answer from the remote within {0:?}")]
    KeepAlive(Duration),
    /// The durable store failed while a stage was being stored.
    #[error("durable store: {0}")]
    Storage(#[from] crate::storage::StorageError),
    /// The local session was taken over (an operator discarded or kicked it).
    #[error("the bridge's local session was taken over")]
    TakenOver,
}

/// The read side of a connected remote: its half of the stream and the read buffer.
pub(crate) struct RemoteReader<S> {
    reader: ReadHalf<S>,
    version: ProtocolVersion,
    rbuf: BytesMut,
}

/// The write side of a connected remote: its half of the stream and the bytes waiting for it.
pub(crate) struct RemoteWriter<S> {
    writer: WriteHalf<S>,
    version: ProtocolVersion,
    /// Encoded packets waiting to be written, in order.
    pub wbuf: BytesMut,
}

/// One connected remote, as two halves a `select!` can poll at once (reads into the read
/// buffer and single writes from the write buffer are both cancel-safe).
pub(crate) struct RemoteIo<S> {
    /// Reading packets from the remote.
    pub rx: RemoteReader<S>,
    /// Writing packets to the remote.
    pub tx: RemoteWriter<S>,
}

impl<S> std::fmt::Debug for RemoteReader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteReader")
            .field("buffered", &self.rbuf.len())
            .finish()
    }
}

impl<S> std::fmt::Debug for RemoteWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWriter")
            .field("pending", &self.wbuf.len())
            .finish()
    }
}

impl<S> std::fmt::Debug for RemoteIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteIo")
            .field("version", &self.tx.version)
            .field("pending_write", &self.tx.wbuf.len())
            .finish()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RemoteIo<S> {
    /// Sends CONNECT and waits for the CONNACK, within `timeout`.
    ///
    /// # Errors
    ///
    /// I/O, a malformed answer, an answer that is not CONNACK, a refusing CONNACK, or no
    /// answer in time.
    pub(crate) async fn handshake(
        stream: S,
        connect: &Connect,
        timeout: Duration,
    ) -> Result<(RemoteIo<S>, ConnAck), RemoteError> {
        let (reader, writer) = tokio::io::split(stream);
        let version = connect.protocol;
        let mut io = RemoteIo {
            rx: RemoteReader {
                reader,
                version,
                rbuf: BytesMut::with_capacity(8 * 1024),
            },
            tx: RemoteWriter {
                writer,
                version,
                wbuf: BytesMut::with_capacity(8 * 1024),
            },
        };
        let exchange = async {
            io.tx.push(&Packet::Connect(Box::new(connect.clone())))?;
            io.tx.flush().await?;
            match io.rx.read_packet().await? {
                Packet::ConnAck(ack) if ack.reason_code.0 < 0x80 => Ok(ack),
                Packet::ConnAck(ack) => Err(RemoteError::Refused(describe_refusal(
                    ack.reason_code,
                    version,
                ))),
                other => Err(RemoteError::Protocol(format!(
                    "{} before CONNACK",
                    other.name()
                ))),
            }
        };
        let ack = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| RemoteError::HandshakeTimeout(timeout))??;
        Ok((io, ack))
    }

    /// The protocol level spoken.
    pub(crate) fn version(&self) -> ProtocolVersion {
        self.tx.version
    }

    /// Sends DISCONNECT (normal), shuts the write side and waits for the remote to close
    /// its own, best effort within a second. The wait is for a reconnect right after: a
    /// remote that saw the new CONNECT first takes the session over and may drop what it
    /// had not read of the old connection, the acknowledgements before the DISCONNECT
    /// included, and send those messages again (a duplicate here).
    pub(crate) async fn close(mut self) {
        let disconnect = Packet::Disconnect(codec::Disconnect::default());
        if self.tx.push(&disconnect).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                let _ = self.tx.flush().await;
                let _ = self.tx.writer.shutdown().await;
                // What the remote still sends is dropped unacknowledged: it keeps it.
                let mut scratch = [0u8; 4096];
                while let Ok(n) = self.rx.reader.read(&mut scratch).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

impl<S: AsyncWrite> RemoteWriter<S> {
    /// Appends a packet to the write buffer.
    ///
    /// # Errors
    ///
    /// `Encode` when the packet cannot be encoded at this protocol level.
    pub(crate) fn push(&mut self, packet: &Packet) -> Result<(), RemoteError> {
        codec::encode(packet, self.version, &mut self.wbuf)?;
        Ok(())
    }

    /// Writes the whole write buffer (for the handshake and the final DISCONNECT).
    ///
    /// # Errors
    ///
    /// The socket's write error.
    pub(crate) async fn flush(&mut self) -> Result<(), RemoteError> {
        while !self.wbuf.is_empty() {
            self.write_some().await?;
        }
        self.writer.flush().await?;
        Ok(())
    }

    /// One write from the write buffer (cancel-safe: what was written is taken off).
    ///
    /// # Errors
    ///
    /// The socket's write error; `Closed` when it takes nothing.
    pub(crate) async fn write_some(&mut self) -> Result<(), RemoteError> {
        let n = self.writer.write(&self.wbuf).await?;
        if n == 0 {
            return Err(RemoteError::Closed);
        }
        self.wbuf.advance(n);
        Ok(())
    }
}

impl<S: AsyncRead> RemoteReader<S> {
    /// Reads more bytes into the read buffer (cancel-safe).
    ///
    /// # Errors
    ///
    /// The socket's read error; `Closed` at end of stream.
    pub(crate) async fn fill_read(&mut self) -> Result<(), RemoteError> {
        let n = self.reader.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            return Err(RemoteError::Closed);
        }
        Ok(())
    }

    /// The next complete packet already in the read buffer, if any.
    ///
    /// # Errors
    ///
    /// `Decode` for bytes that are not a valid packet.
    pub(crate) fn next_packet(&mut self) -> Result<Option<Packet>, RemoteError> {
        Ok(codec::decode(
            &mut self.rbuf,
            Some(self.version),
            MAX_INCOMING_PACKET,
        )?)
    }

    /// Reads until one packet is complete.
    async fn read_packet(&mut self) -> Result<Packet, RemoteError> {
        loop {
            if let Some(packet) = self.next_packet()? {
                return Ok(packet);
            }
            self.fill_read().await?;
        }
    }
}

/// A refusing CONNACK in words (3.x return codes come decoded as their v5 equivalents).
fn describe_refusal(code: ReasonCode, version: ProtocolVersion) -> String {
    format!(
        "{} (reason {:#04x}, MQTT {})",
        code.label(),
        code.0,
        version.label()
    )
}
