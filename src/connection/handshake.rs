//! CONNECT → CONNACK: protocol version, client id rules, authentication, session attach.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::io::Io;
use crate::broker::{Attached, Broker, SessionRequest};
use crate::codec::{
    self, topic, ConnAck, ConnAckProperties, Connect, DecodeError, Packet, ProtocolVersion, QoS,
    ReasonCode,
};

/// How long a client may take to send CONNECT after the socket opens.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Topic Alias Maximum advertised to v5 clients (aliases they may use towards us).
pub const TOPIC_ALIAS_MAXIMUM: u16 = 10;

/// A client that passed the handshake.
pub struct Accepted {
    pub connect: Box<Connect>,
    pub attached: Attached,
    /// Keep-alive in force (may be lowered by the broker's maximum).
    pub keep_alive: u16,
}

/// Reads CONNECT, validates it, attaches the session and queues CONNACK. `None` when the
/// client was rejected (the rejection CONNACK is flushed) or vanished.
pub async fn accept<S: AsyncRead + AsyncWrite>(
    io: &mut Io<S>,
    broker: &Arc<Broker>,
    shutdown: &CancellationToken,
    peer: SocketAddr,
) -> Option<Accepted> {
    let max_packet = broker.config().max_packet_size as usize;
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let connect = loop {
        // Read before decoding: a failed decode may already have consumed the bytes.
        let sniffed = codec::peek_connect_version(&io.rbuf);
        match codec::decode(&mut io.rbuf, None, max_packet) {
            Ok(Some(Packet::Connect(connect))) => break connect,
            Ok(Some(other)) => {
                // The decoder rejects these already; belt and braces (MQTT-3.1.0-1).
                tracing::debug!(%peer, packet = other.name(), "first packet is not CONNECT");
                return None;
            }
            Ok(None) => {}
            Err(error) => {
                broker.metrics.malformed_packets.increment(1);
                tracing::info!(%peer, %error, "rejecting CONNECT");
                reject_undecodable(io, &error, sniffed).await;
                return None;
            }
        }
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline, io.read_some()) => r,
            _ = shutdown.cancelled() => return None,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None, // closed, failed, or too slow
        }
    };

    let version = connect.protocol;
    let mut connack = ConnAck::default();
    let (client_id, assigned) = match client_identifier(&connect, broker) {
        Ok(v) => v,
        Err(code) => return reject(io, version, code).await,
    };
    if let Err(code) = check_connect(&connect, broker) {
        return reject(io, version, code).await;
    }

    let config = broker.config();
    let too_long = connect.keep_alive == 0 || connect.keep_alive > config.max_keepalive;
    let keep_alive = match (too_long && config.max_keepalive < u16::MAX, version.is_v5()) {
        (false, _) => connect.keep_alive,
        // v5: the broker imposes its maximum through Server Keep Alive (MQTT-3.2.2-21).
        (true, true) => config.max_keepalive,
        // 3.x has no way to say so; refuse, as Mosquitto does.
        (true, false) => return reject(io, version, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID).await,
    };
    let expiry_interval = if version.is_v5() {
        connect
            .properties
            .session_expiry_interval
            .unwrap_or(0)
            .min(config.session_expiry_interval_max)
    } else if connect.clean_start {
        0
    } else {
        config.session_expiry_interval_max
    };

    let attached = broker.connect(SessionRequest {
        client_id: client_id.clone(),
        clean_start: connect.clean_start,
        expiry_interval,
        protocol: version,
    });
    // Session Present is 0 whenever the session was started clean (MQTT-3.2.2-2).
    connack.session_present = attached.session_present;
    if version.is_v5() {
        connack.properties = connack_properties(
            broker,
            &connect,
            keep_alive,
            assigned.then_some(client_id),
            expiry_interval,
        );
    }
    io.queue(&Packet::ConnAck(connack), version);
    tracing::debug!(%peer, client = %attached.session.client_id, ?version, "connected");
    Some(Accepted {
        connect,
        attached,
        keep_alive,
    })
}

/// The client id to use, and whether the broker assigned it (MQTT-3.1.3-6, MQTT-3.1.3-8).
fn client_identifier(connect: &Connect, broker: &Broker) -> Result<(ByteString, bool), ReasonCode> {
    let config = broker.config();
    if connect.client_id.len() > config.max_client_id_len {
        return Err(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    }
    if !connect.client_id.is_empty() {
        return Ok((connect.client_id.clone(), false));
    }
    let allowed = config.allow_zero_length_clientid
        && match connect.protocol {
            ProtocolVersion::V3_1 => false,
            // 3.1.1: only with Clean Session = 1 (MQTT-3.1.3-8).
            ProtocolVersion::V3_1_1 => connect.clean_start,
            ProtocolVersion::V5 => true,
        };
    if !allowed {
        return Err(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    }
    Ok((
        ByteString::from(format!("postbox-{:016x}", rand::random::<u64>())),
        true,
    ))
}

/// Authentication and will checks that can refuse the connection.
fn check_connect(connect: &Connect, broker: &Broker) -> Result<(), ReasonCode> {
    let config = broker.config();
    if connect.properties.authentication_method.is_some() {
        // No enhanced authentication method is offered yet (MQTT-4.12.0-1).
        return Err(ReasonCode::BAD_AUTHENTICATION_METHOD);
    }
    // No user store yet: with anonymous access off, nobody can be authenticated.
    if !broker.allow_anonymous() {
        return Err(if connect.username.is_some() {
            ReasonCode::BAD_USER_NAME_OR_PASSWORD
        } else {
            ReasonCode::NOT_AUTHORIZED
        });
    }
    if let Some(will) = &connect.will {
        if topic::topic_name_error(&will.topic).is_some() {
            return Err(ReasonCode::TOPIC_NAME_INVALID);
        }
        if will.qos as u8 > config.max_qos {
            return Err(ReasonCode::QOS_NOT_SUPPORTED); // MQTT-3.2.2-12
        }
        if will.retain && !config.retain_available {
            return Err(ReasonCode::RETAIN_NOT_SUPPORTED); // MQTT-3.2.2-13
        }
    }
    Ok(())
}

/// v5 CONNACK properties: tell the client every limit the broker enforces.
fn connack_properties(
    broker: &Broker,
    connect: &Connect,
    keep_alive: u16,
    assigned_client_id: Option<ByteString>,
    expiry_interval: u32,
) -> ConnAckProperties {
    let config = broker.config();
    let requested_expiry = connect.properties.session_expiry_interval.unwrap_or(0);
    ConnAckProperties {
        assigned_client_identifier: assigned_client_id,
        session_expiry_interval: (expiry_interval != requested_expiry).then_some(expiry_interval),
        server_keep_alive: (keep_alive != connect.keep_alive).then_some(keep_alive),
        maximum_qos: (config.max_qos < 2)
            .then(|| QoS::from_u8(config.max_qos).unwrap_or(QoS::AtMostOnce)),
        retain_available: (!config.retain_available).then_some(false),
        maximum_packet_size: Some(config.max_packet_size),
        topic_alias_maximum: Some(TOPIC_ALIAS_MAXIMUM),
        shared_subscription_available: Some(false),
        ..Default::default()
    }
}

/// Sends a rejection CONNACK (MQTT-3.2.2-6: session present 0) and lets the caller close.
async fn reject<S: AsyncRead + AsyncWrite>(
    io: &mut Io<S>,
    version: ProtocolVersion,
    code: ReasonCode,
) -> Option<Accepted> {
    tracing::info!(?version, reason = ?code, "connection refused");
    let connack = ConnAck {
        session_present: false,
        reason_code: code,
        properties: ConnAckProperties::default(),
    };
    io.queue(&Packet::ConnAck(connack), version);
    let _ = tokio::time::timeout(Duration::from_secs(1), io.flush()).await;
    None
}

/// A CONNECT that could not be decoded: answer in the client's version when it can be read
/// (v5: the reason code; 3.x: only "unacceptable protocol version" has a return code).
async fn reject_undecodable<S: AsyncRead + AsyncWrite>(
    io: &mut Io<S>,
    error: &DecodeError,
    sniffed: Option<ProtocolVersion>,
) {
    match (error, sniffed) {
        (DecodeError::UnsupportedProtocol(_), _) => {
            // MQTT-3.1.2-2: return code 0x01 in the 3.1.1 layout, which every level reads.
            reject(
                io,
                ProtocolVersion::V3_1_1,
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
            )
            .await;
        }
        (_, Some(ProtocolVersion::V5)) => {
            reject(io, ProtocolVersion::V5, error.reason_code()).await;
        }
        (DecodeError::ClientIdNotValid, Some(v)) => {
            reject(io, v, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID).await;
        }
        _ => {} // 3.x malformed CONNECT: close without CONNACK (MQTT-3.1.4-1)
    }
}
