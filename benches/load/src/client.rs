//! A minimal MQTT client for load generation, built on the broker's own codec.
//!
//! One TCP socket, `TCP_NODELAY`, one read buffer and one write buffer: callers append many
//! packets to `wbuf` and send them with one write, and decode every complete packet a read
//! brings. No background task, no channel, no per-message allocation on the publish path, so
//! the generator stays cheaper per message than the broker it measures.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::BytesMut;
use postbox::codec::{
    self, Connect, Disconnect, Packet, ProtocolVersion, PublishHeader, PublishProperties, QoS,
    ReasonCode, Subscribe, SubscriptionOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::transport::{Stream, TlsClient};

/// Largest packet the client accepts from a broker (the protocol maximum): the generator
/// never refuses what a broker sends, it only counts it.
const MAX_PACKET: usize = 268_435_460;
/// How long a handshake (CONNACK, SUBACK) may take before the run is declared broken.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes reserved before each read; large enough that a busy subscriber drains the socket in
/// few system calls.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes reserved before reading a control packet (CONNACK, SUBACK, PINGRESP): reserving
/// `READ_CHUNK` for every handshake made the `connections` scenario fault in a fresh page per
/// client, generator CPU that has nothing to do with the broker.
const CONTROL_READ_CHUNK: usize = 256;

/// How to open a session.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Client identifier; unique per run so runs never take over each other's sessions.
    pub client_id: String,
    /// Clean session (3.x) / clean start (5.0); false for persistent-session scenarios.
    pub clean: bool,
    /// Protocol level spoken on this connection.
    pub version: ProtocolVersion,
    /// Seconds; longer than any bounded run so idle clients need not ping.
    pub keep_alive: u16,
    /// Local address to bind before connecting. Many-connection runs give every socket its
    /// own 127.0.0.x address and port, so neither a source address runs out of ports nor the
    /// kernel spends the run searching for free ones.
    pub source: Option<SocketAddr>,
    /// Set `TCP_NODELAY` (every scenario that sends after the handshake). Idle clients skip the
    /// system call: in the `connections` scenario the generator's core is the bottleneck.
    pub nodelay: bool,
    /// Set `SO_REUSEADDR` before binding `source`, so a source port still in `TIME_WAIT` can be
    /// bound again. The `connections` scenario skips it: its tuples are fresh each run and
    /// closed with a reset, and a tuple in use just moves it on to the next one.
    pub reuse_source: bool,
    /// v5 Session Expiry Interval to request (ignored for 3.x).
    pub session_expiry: Option<u32>,
    /// Speak TLS (the `--tls-ca` runs): the handshake happens before CONNECT.
    pub tls: Option<Arc<TlsClient>>,
}

impl ConnectOptions {
    /// Clean, short-lived session defaults for `client_id`.
    pub fn new(client_id: String, version: ProtocolVersion) -> ConnectOptions {
        ConnectOptions {
            client_id,
            clean: true,
            version,
            keep_alive: 600,
            source: None,
            nodelay: true,
            reuse_source: true,
            session_expiry: None,
            tls: None,
        }
    }
}

/// One connected client.
#[derive(Debug)]
pub struct Conn {
    /// The socket (plain or TLS); the plain-TCP publisher uses its readiness API directly.
    pub stream: Stream,
    /// Bytes read but not yet decoded.
    pub rbuf: BytesMut,
    /// Packets queued but not yet written.
    pub wbuf: BytesMut,
    /// Protocol level agreed at CONNECT.
    pub version: ProtocolVersion,
    /// CONNACK's session-present flag.
    pub session_present: bool,
}

/// Refuses any broker address off this machine: load is only ever aimed at loopback.
///
/// # Errors
///
/// When `addr` is not a loopback address.
pub fn ensure_loopback(addr: SocketAddr) -> Result<()> {
    if !addr.ip().is_loopback() {
        bail!("refusing to load {addr}: the generator only targets loopback (127.0.0.0/8, ::1)");
    }
    Ok(())
}

/// With a source address but no port: lets the kernel pick the local port at `connect`
/// (per destination) rather than at `bind` (free for every destination). Best effort.
fn defer_port_choice(socket: &TcpSocket) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: valid socket fd, option value points to a c_int of the stated size.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The CONNECT for `opts`.
pub fn connect_packet(opts: &ConnectOptions) -> Packet {
    let mut properties = codec::ConnectProperties::default();
    if opts.version.is_v5() {
        properties.session_expiry_interval = opts.session_expiry;
    }
    Packet::Connect(Box::new(Connect {
        protocol: opts.version,
        clean_start: opts.clean,
        keep_alive: opts.keep_alive,
        client_id: opts.client_id.as_str().into(),
        will: None,
        username: None,
        password: None,
        properties,
        bridge: false,
    }))
}

impl Conn {
    /// Wraps a non-blocking socket that finished its MQTT handshake elsewhere (the
    /// `connections` scenario's burst); must be called inside the runtime.
    ///
    /// # Errors
    ///
    /// When tokio cannot register the socket (no runtime, or the reactor refuses it).
    pub fn from_connected(stream: std::net::TcpStream, version: ProtocolVersion) -> Result<Conn> {
        Ok(Conn {
            stream: Stream::Tcp(tokio::net::TcpStream::from_std(stream)?),
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            version,
            session_present: false,
        })
    }

    /// Opens a TCP connection (and TLS over it when `opts.tls` is set), sends CONNECT and waits for a successful CONNACK.
    ///
    /// # Errors
    ///
    /// A non-loopback `addr`, a socket or connect failure, or a CONNACK that is missing, late or
    /// refuses the connection.
    pub async fn connect(addr: SocketAddr, opts: &ConnectOptions) -> Result<Conn> {
        ensure_loopback(addr)?;
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(source) = opts.source {
            if source.port() == 0 {
                defer_port_choice(&socket);
            } else if opts.reuse_source {
                // Lets a port whose last connection is in TIME_WAIT be bound again.
                socket.set_reuseaddr(true)?;
            }
            socket
                .bind(source)
                .with_context(|| format!("bind source address {source}"))?;
        }
        let stream = socket
            .connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
        if opts.nodelay {
            stream.set_nodelay(true)?;
        }
        let stream = match &opts.tls {
            Some(tls) => tls.handshake(stream).await?,
            None => Stream::Tcp(stream),
        };
        let mut conn = Conn {
            stream,
            // Grown on demand: idle clients (the `connections` scenario) never need more.
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            version: opts.version,
            session_present: false,
        };
        conn.queue(&connect_packet(opts))?;
        conn.flush().await?;
        match conn.recv_within(HANDSHAKE_TIMEOUT).await? {
            Packet::ConnAck(ack) if ack.reason_code == ReasonCode::SUCCESS => {
                conn.session_present = ack.session_present;
                Ok(conn)
            }
            Packet::ConnAck(ack) => bail!("CONNACK refused: reason {:#04x}", ack.reason_code.0),
            other => bail!("expected CONNACK, got {}", other.name()),
        }
    }

    /// Appends an encoded packet to the write buffer.
    ///
    /// # Errors
    ///
    /// When the packet cannot be encoded.
    pub fn queue(&mut self, packet: &Packet) -> Result<()> {
        codec::encode(packet, self.version, &mut self.wbuf)
            .map_err(|e| anyhow!("encode {}: {e}", packet.name()))
    }

    /// Appends a PUBLISH without building a `Publish` (the hot path of every publisher), with
    /// v5 `properties` if any (`--content-type`; ignored by 3.x).
    ///
    /// # Errors
    ///
    /// When the PUBLISH cannot be encoded.
    #[inline]
    pub fn queue_publish(
        &mut self,
        topic: &str,
        qos: QoS,
        packet_id: u16,
        retain: bool,
        payload: &[u8],
        properties: Option<&PublishProperties>,
    ) -> Result<()> {
        let header = PublishHeader {
            dup: false,
            qos,
            retain,
            topic,
            packet_id,
            properties,
        };
        codec::encode_publish(&header, payload, self.version, &mut self.wbuf)
            .map(|_| ())
            .map_err(|e| anyhow!("encode PUBLISH: {e}"))
    }

    /// Writes everything queued.
    ///
    /// # Errors
    ///
    /// The socket's write error.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
            if self.stream.is_tls() {
                // rustls may hold records it could not write yet: push them to the socket.
                self.stream.flush().await?;
            }
        }
        Ok(())
    }

    /// Reads once into `rbuf`; a closed connection is an error (brokers never close first
    /// in a healthy run).
    ///
    /// # Errors
    ///
    /// The socket's read error, or the broker closed the connection.
    pub async fn read_more(&mut self) -> Result<usize> {
        self.rbuf.reserve(READ_CHUNK);
        match self.stream.read_buf(&mut self.rbuf).await? {
            0 => bail!("broker closed the connection"),
            n => Ok(n),
        }
    }

    /// Reads whatever the socket has without waiting; `Ok(0)` when nothing is there. Plain
    /// TCP only: on TLS it would read records past the decryption.
    ///
    /// # Errors
    ///
    /// The socket's read error, the broker closed the connection, or a TLS connection.
    pub fn try_read_more(&mut self) -> Result<usize> {
        if self.stream.is_tls() {
            bail!("try_read_more on a TLS connection");
        }
        self.rbuf.reserve(READ_CHUNK);
        match self.stream.tcp().try_read_buf(&mut self.rbuf) {
            Ok(0) => bail!("broker closed the connection"),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes as much of `wbuf` as the socket takes without waiting. Plain TCP only (see
    /// [`Conn::try_read_more`]).
    ///
    /// # Errors
    ///
    /// The socket's write error (not `WouldBlock`, which just stops the write), or a TLS
    /// connection.
    pub fn try_write_some(&mut self) -> Result<()> {
        if self.stream.is_tls() {
            bail!("try_write_some on a TLS connection");
        }
        if self.wbuf.is_empty() {
            return Ok(());
        }
        match self.stream.tcp().try_write(&self.wbuf) {
            Ok(n) => {
                let _ = self.wbuf.split_to(n);
                if self.wbuf.is_empty() {
                    self.wbuf.clear();
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Decodes the next complete packet from `rbuf`, if any.
    ///
    /// # Errors
    ///
    /// When the bytes are not a valid packet at the connection's protocol level.
    #[inline]
    pub fn next_packet(&mut self) -> Result<Option<Packet>> {
        codec::decode(&mut self.rbuf, Some(self.version), MAX_PACKET)
            .map_err(|e| anyhow!("undecodable packet from broker: {e}"))
    }

    /// Waits for the next packet (control traffic: reads in small chunks).
    ///
    /// # Errors
    ///
    /// A read or decode error, or the broker closed the connection.
    pub async fn recv(&mut self) -> Result<Packet> {
        loop {
            if let Some(packet) = self.next_packet()? {
                return Ok(packet);
            }
            self.rbuf.reserve(CONTROL_READ_CHUNK);
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                bail!("broker closed the connection");
            }
        }
    }

    /// Waits for the next packet, at most `limit`.
    ///
    /// # Errors
    ///
    /// As [`Conn::recv`], or no packet within `limit`.
    pub async fn recv_within(&mut self, limit: Duration) -> Result<Packet> {
        tokio::time::timeout(limit, self.recv())
            .await
            .map_err(|_| anyhow!("no packet from broker within {limit:?}"))?
    }

    /// Subscribes to `filters` and waits for the SUBACK; fails if any filter is refused.
    ///
    /// PUBLISH packets that arrive before the SUBACK (retained messages, or a persistent
    /// session's backlog) stay in `rbuf`'s place: they are handed back to the caller.
    ///
    /// # Errors
    ///
    /// A write, read or decode error, no SUBACK in time, or a refused filter.
    pub async fn subscribe(
        &mut self,
        filters: &[(String, QoS)],
        packet_id: u16,
    ) -> Result<Vec<Packet>> {
        let subscribe = Subscribe {
            packet_id,
            subscription_identifier: None,
            user_properties: Vec::new(),
            filters: filters
                .iter()
                .map(|(f, qos)| {
                    (
                        f.as_str().into(),
                        SubscriptionOptions {
                            qos: *qos,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        };
        self.queue(&Packet::Subscribe(subscribe))?;
        self.flush().await?;
        let mut early = Vec::new();
        loop {
            match self.recv_within(HANDSHAKE_TIMEOUT).await? {
                Packet::SubAck(ack) if ack.packet_id == packet_id => {
                    if let Some(bad) = ack.reason_codes.iter().find(|c| c.0 >= 0x80) {
                        bail!("SUBSCRIBE refused: reason {:#04x}", bad.0);
                    }
                    return Ok(early);
                }
                other @ Packet::Publish(_) => early.push(other),
                other => bail!("expected SUBACK, got {}", other.name()),
            }
        }
    }

    /// Closes at once with a reset (`SO_LINGER` 0): no DISCONNECT and no `TIME_WAIT` left
    /// behind, for tearing down thousands of idle clients.
    pub fn abort(self) {
        let _ = self.stream.tcp().set_zero_linger();
    }

    /// Sends DISCONNECT, closes its side, and waits (at most `limit`) until the broker has
    /// closed the connection too: a handshake is only counted once the broker is done with it.
    ///
    /// # Errors
    ///
    /// A write error, or the broker still has the connection open after `limit`.
    pub async fn disconnect_and_wait(mut self, limit: Duration) -> Result<()> {
        self.queue(&Packet::Disconnect(Disconnect::default()))?;
        self.flush().await?;
        self.stream.shutdown().await?;
        let closed = async {
            loop {
                self.rbuf.clear();
                self.rbuf.reserve(CONTROL_READ_CHUNK);
                // EOF, or a reset / a TLS close without close_notify: closed either way.
                if matches!(self.stream.read_buf(&mut self.rbuf).await, Ok(0) | Err(_)) {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, closed)
            .await
            .map_err(|_| anyhow!("broker kept the connection open {limit:?} after DISCONNECT"))
    }

    /// Sends DISCONNECT and closes; errors are ignored (the run's result is already known).
    pub async fn disconnect(mut self) {
        let _ = self.queue(&Packet::Disconnect(Disconnect::default()));
        let _ = self.flush().await;
        let _ = self.stream.shutdown().await;
    }
}
