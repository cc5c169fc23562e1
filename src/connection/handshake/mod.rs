//! CONNECT → CONNACK: protocol version, client id rules, authentication, session attach.
//! Its deadline and its reads that wait for the client are in `wait`.

mod wait;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::io::Io;
use crate::auth::{self, AuthStep, Authenticator, StepInput};
use crate::broker::{Attached, Broker, SessionRequest};
use crate::codec::{
    self, topic, Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, DecodeError, Packet,
    ProtocolVersion, QoS, ReasonCode, ReasonContext,
};
use crate::transport::{ConnectedSlot, ConnectionInfo, HandshakeSlot};
use tokio::time::Instant;
use wait::{connect_deadline, connect_timed_out, read_more, Exchange, ReadMore};

/// A client that passed the handshake.
pub(super) struct Accepted {
    pub connect: Box<Connect>,
    pub attached: Attached,
    /// Keep-alive in force (may be lowered by the broker's maximum).
    pub keep_alive: u16,
    /// The enhanced authentication method the client used, kept for re-authentication.
    pub auth: Option<EnhancedAuth>,
}

/// The enhanced authentication method of a connection (MQTT 5 §4.12).
pub(super) struct EnhancedAuth {
    /// The Authentication Method property, which every later AUTH must repeat (MQTT-4.12.0-5).
    pub method: ByteString,
    /// The method's implementation.
    pub authenticator: Arc<dyn Authenticator>,
}

/// Why a handshake step refused the client: the CONNACK reason and an explanation for v5
/// clients that accept problem information.
type Refusal = (ReasonCode, &'static str);

/// Reads CONNECT, validates it, attaches the session and queues CONNACK. `None` when the
/// client was rejected (the rejection CONNACK is flushed) or vanished. `info` is what the
/// transport knows of the connection (for authentication to use later).
///
/// `slot` is the connection's place in its listener: it takes a pending slot the first time
/// the handshake has to wait for the client (none free: the connection is closed at once,
/// see [`read_more`]), and becomes the returned connected slot just before the session is
/// attached, or the CONNECT is refused with 0x89 Server busy (3.x: 0x03 Server unavailable)
/// when the listener has its `max_connections` clients.
///
/// The whole handshake, enhanced-authentication exchanges included, must be done within
/// `mqtt.connect_timeout` of the listener accepting the socket: the one deadline of a
/// connection that is not connected yet, whether it sends nothing, a CONNECT slowly, or
/// answers AUTH challenges slowly.
pub(super) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Arc<Broker>,
    shutdown: &CancellationToken,
    info: &ConnectionInfo,
    mut slot: HandshakeSlot,
) -> Option<(Accepted, ConnectedSlot)> {
    let peer = info.peer;
    let rules = super::decode_rules(broker.config());
    let deadline = connect_deadline(broker, &slot);
    let connect = loop {
        // Read before decoding: a failed decode may already have consumed the bytes.
        let sniffed = codec::peek_connect_version(&io.rbuf);
        match codec::decode_with(&mut io.rbuf, None, rules) {
            Ok(Some(Packet::Connect(connect))) => break connect,
            Ok(Some(other)) => {
                // The decoder rejects these already; belt and braces (MQTT-3.1.0-1).
                tracing::debug!(%peer, packet = other.name(), "first packet is not CONNECT");
                return None;
            }
            Ok(None) => {
                // Counted in `postbox_partial_packet_bytes` while it arrives; its deadline is
                // this handshake's.
                io.check_partial(std::time::Instant::now(), true, broker.config());
            }
            Err(error) => {
                broker.metrics.malformed_packets.increment(1);
                tracing::info!(%peer, %error, "rejecting CONNECT");
                reject_undecodable(io, &error, sniffed).await;
                return None;
            }
        }
        match read_more(io, &mut slot, deadline, shutdown).await {
            ReadMore::Data => {}
            ReadMore::Gone => return None,
            ReadMore::TimedOut => {
                connect_timed_out(broker, info, io.rbuf.len());
                return None;
            }
            ReadMore::Refused(refused) => {
                tracing::debug!(%peer, listener = %info.listener, ?refused, "closing: no pending slot for a handshake that waits");
                return None;
            }
        }
    };

    let version = connect.protocol;
    let mut connack = ConnAck::default();
    let (client_id, assigned) = match client_identifier(&connect, broker) {
        Ok(v) => v,
        Err(code) => {
            let why = "client identifier not valid";
            return reject(io, version, code, Some((why, &connect))).await;
        }
    };
    if let Err((code, why)) = check_connect(&connect, broker) {
        return reject(io, version, code, Some((why, &connect))).await;
    }
    let (auth, auth_data) = match &connect.properties.authentication_method {
        Some(method) if version.is_v5() => {
            let Some(authenticator) = broker.authenticators().get(method) else {
                // MQTT-4.12.0-1
                let why = "authentication method not supported";
                let code = ReasonCode::BAD_AUTHENTICATION_METHOD;
                return reject(io, version, code, Some((why, &connect))).await;
            };
            let auth = EnhancedAuth {
                method: method.clone(),
                authenticator,
            };
            let exchange = Exchange {
                slot: &mut slot,
                deadline,
            };
            match authenticate(io, broker, shutdown, &connect, &client_id, &auth, exchange).await {
                Ok(data) => (Some(auth), data),
                Err(Some((code, why))) => {
                    tracing::info!(%peer, client = %client_id, method = %auth.method, reason = ?code, "authentication failed");
                    return reject(io, version, code, Some((why, &connect))).await;
                }
                Err(None) => {
                    if Instant::now() >= deadline {
                        connect_timed_out(broker, info, io.rbuf.len());
                    }
                    return None;
                }
            }
        }
        _ => (None, None),
    };

    let config = broker.config();
    // 0 asks for no keep-alive at all, which is longer than any maximum.
    let too_long = connect.keep_alive == 0 || connect.keep_alive > config.max_keepalive;
    let keep_alive = match (too_long, version.is_v5()) {
        (false, _) => connect.keep_alive,
        // v5: the broker imposes its maximum through Server Keep Alive (MQTT-3.2.2-21), also
        // at the default 65535: the client then knows the broker will time it out.
        (true, true) => config.max_keepalive,
        // 3.x has no way to be told. At the default maximum it keeps what it asked for (0
        // stays "none", as every 3.x client without keep-alive expects); below it, refuse, as
        // Mosquitto does.
        (true, false) if config.max_keepalive == u16::MAX => connect.keep_alive,
        (true, false) => {
            return reject(io, version, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID, None).await
        }
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

    if version.is_v5() {
        connack.properties = connack_properties(
            broker,
            &connect,
            keep_alive,
            assigned.then(|| client_id.clone()),
            expiry_interval,
        );
        if let Some(auth) = &auth {
            connack.properties.authentication_method = Some(auth.method.clone()); // MQTT-4.12.0-5
            connack.properties.authentication_data = auth_data;
        }
    }
    let client_max = client_max_packet(&connect);
    if !connack_fits(&connack, version, client_max) {
        // MQTT-3.1.2-24 (list: -27): nothing above the client's Maximum Packet Size may be
        // sent, and the smallest CONNACK is above it. With no way to answer, close; before
        // attaching, so neither the session nor a connection holding it is touched.
        tracing::info!(%peer, client = %client_id, max = client_max, "closing: no CONNACK fits the client's Maximum Packet Size");
        return None;
    }
    // Only now does the connection take one of the listener's `max_connections` slots: until
    // here it held a pending one, so sockets that never get this far cannot keep finished
    // clients out. At the limit, a client taking over its own connection is still let in.
    let connected = match slot.promote(|| broker.is_connected(&client_id)) {
        Ok(connected) => connected,
        Err(_pending) => {
            // `_pending` is held through the refusal's lingering close.
            broker.metrics.connections_refused_max.increment(1);
            tracing::info!(%peer, listener = %info.listener, client = %client_id, "refusing CONNECT: the listener has max_connections clients");
            let why = "the listener has its maximum number of connections";
            return reject(io, version, ReasonCode::SERVER_BUSY, Some((why, &connect))).await;
        }
    };
    let attached = broker.connect(SessionRequest {
        client_id,
        clean_start: connect.clean_start,
        expiry_interval,
        protocol: version,
    });
    // Session Present is 0 whenever the session was started clean (MQTT-3.2.2-2). The flag
    // does not change the CONNACK's size, so the check above still holds.
    connack.session_present = attached.session_present;
    io.queue_within(&Packet::ConnAck(connack), version, client_max);
    tracing::debug!(%peer, client = %attached.handle.client_id(), ?version, "connected");
    Some((
        Accepted {
            connect,
            attached,
            keep_alive,
            auth,
        },
        connected,
    ))
}

/// Whether the client lets us send Reason Strings and User Properties (v5 Request Problem
/// Information, default 1; MQTT-3.1.2-29). Always false for 3.x, which has neither.
pub(super) fn wants_problem_info(connect: &Connect) -> bool {
    connect.protocol.is_v5() && connect.properties.request_problem_information != Some(false)
}

/// The largest packet the client accepts (v5 Maximum Packet Size; unlimited otherwise).
pub(super) fn client_max_packet(connect: &Connect) -> usize {
    connect
        .properties
        .maximum_packet_size
        .map_or(usize::MAX, |m| m as usize)
}

/// Whether `connack` can be sent within the client's Maximum Packet Size `max`, leaving out
/// its Reason String and User Properties if need be (as `Io::queue_within` will). Measured
/// only when the client set a maximum (a scratch encoding of a few dozen bytes, once per
/// CONNECT): otherwise it always fits. A CONNACK the codec cannot encode at all counts as
/// not fitting, since it could not be sent either.
fn connack_fits(connack: &ConnAck, version: ProtocolVersion, max: usize) -> bool {
    if max == usize::MAX {
        return true;
    }
    let packet = Packet::ConnAck(connack.clone());
    matches!(
        codec::encode_within(&packet, version, max, &mut BytesMut::new()),
        Ok(true)
    )
}

/// Runs the enhanced authentication exchange: CONNECT → (AUTH 0x18 ⇄ AUTH 0x18)* → verdict,
/// all before the handshake's `deadline`. `Ok` carries the Authentication Data for CONNACK;
/// `Err(None)` means the client left or the deadline passed.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Arc<Broker>,
    shutdown: &CancellationToken,
    connect: &Connect,
    client_id: &ByteString,
    auth: &EnhancedAuth,
    exchange: Exchange<'_>,
) -> Result<Option<Bytes>, Option<Refusal>> {
    let Exchange { slot, deadline } = exchange;
    let client_max = client_max_packet(connect);
    let mut step = auth::run_step(
        Arc::clone(&auth.authenticator),
        StepInput::Start(client_id.to_string()),
        connect.properties.authentication_data.clone(),
    )
    .await;
    loop {
        let state = match step {
            AuthStep::Success(data) => return Ok(data),
            AuthStep::Fail(code) => {
                return Err(Some((connack_failure(code), "authentication failed")))
            }
            AuthStep::Continue { data, state } => {
                let challenge = Auth {
                    reason_code: ReasonCode::CONTINUE_AUTHENTICATION, // MQTT-4.12.0-2
                    properties: AuthProperties {
                        authentication_method: Some(auth.method.clone()),
                        authentication_data: data,
                        ..Default::default()
                    },
                };
                io.queue_within(&Packet::Auth(challenge), ProtocolVersion::V5, client_max);
                match tokio::time::timeout_at(deadline, io.flush()).await {
                    Ok(Ok(())) => {}
                    _ => return Err(None),
                }
                state
            }
        };
        let answer = match next_packet(io, broker, shutdown, slot, deadline).await {
            Ok(Some(p)) => p,
            Ok(None) => return Err(None),
            Err(refusal) => return Err(Some(refusal)),
        };
        let data = match answer {
            Packet::Auth(a)
                if a.reason_code == ReasonCode::CONTINUE_AUTHENTICATION
                    && a.properties.authentication_method.as_ref() == Some(&auth.method) =>
            {
                a.properties.authentication_data // MQTT-4.12.0-3
            }
            Packet::Auth(_) => {
                let why = "AUTH must be 0x18 with the method of CONNECT";
                return Err(Some((ReasonCode::PROTOCOL_ERROR, why)));
            }
            Packet::Disconnect(_) => return Err(None),
            _ => {
                // MQTT-3.1.2-30 (list: -33): only AUTH or DISCONNECT before CONNACK.
                let why = "only AUTH or DISCONNECT may follow CONNECT before CONNACK";
                return Err(Some((ReasonCode::PROTOCOL_ERROR, why)));
            }
        };
        step = auth::run_step(
            Arc::clone(&auth.authenticator),
            StepInput::Continue(state),
            data,
        )
        .await;
    }
}

/// Reads the next packet during the handshake, before its `deadline`.
async fn next_packet<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Broker,
    shutdown: &CancellationToken,
    slot: &mut HandshakeSlot,
    deadline: Instant,
) -> Result<Option<Packet>, Refusal> {
    let rules = super::decode_rules(broker.config());
    loop {
        match codec::decode_with(&mut io.rbuf, Some(ProtocolVersion::V5), rules) {
            Ok(Some(packet)) => return Ok(Some(packet)),
            Ok(None) => {
                io.check_partial(std::time::Instant::now(), true, broker.config());
            }
            Err(error) => {
                broker.metrics.malformed_packets.increment(1);
                return Err((error.reason_code(), "malformed packet"));
            }
        }
        match read_more(io, slot, deadline, shutdown).await {
            ReadMore::Data => {}
            // A timeout is counted by the caller, which sees the deadline passed.
            ReadMore::Gone | ReadMore::TimedOut | ReadMore::Refused(_) => return Ok(None),
        }
    }
}

/// A failure reason an authenticator gave, as a code CONNACK may carry (0x87 otherwise).
fn connack_failure(code: ReasonCode) -> ReasonCode {
    code.or_if_not_allowed(ReasonContext::ConnAck, ReasonCode::NOT_AUTHORIZED)
}

/// The client id to use, and whether the broker assigned it (MQTT-3.1.3-6, MQTT-3.1.3-8).
///
/// A client id with a control character (5.0 §1.5.4: SHOULD NOT appear) is refused unless
/// `mqtt.allow_control_characters`, with the code MQTT has for a client id the Server rejects
/// (MQTT-3.1.3-8: 0x85 Client Identifier not valid; 3.x 0x02 identifier rejected) rather than
/// 0x81: the client can tell its id is the problem, as it could for one too long.
fn client_identifier(connect: &Connect, broker: &Broker) -> Result<(ByteString, bool), ReasonCode> {
    let config = broker.config();
    if connect.client_id.len() > config.max_client_id_len
        || (!config.allow_control_characters && topic::has_control_characters(&connect.client_id))
    {
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
///
/// A user name with a control character (5.0 §1.5.4: SHOULD NOT appear) is refused unless
/// `mqtt.allow_control_characters`, with 0x86 Bad User Name or Password (3.x 0x04), whose
/// meaning in the spec's CONNACK table is "The data in the user name or password is
/// malformed": the precise code, where 0x81 would not say which field. Checked before
/// anything consults the user name. (Will topics are topic names: the decoder refuses those.)
fn check_connect(connect: &Connect, broker: &Broker) -> Result<(), Refusal> {
    let config = broker.config();
    if !config.allow_control_characters
        && connect
            .username
            .as_deref()
            .is_some_and(topic::has_control_characters)
    {
        return Err((
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "control character in the user name",
        ));
    }
    // No user store yet: with anonymous access off, only enhanced authentication can
    // authenticate a client (the exchange runs after these checks).
    let enhanced = connect.protocol.is_v5() && connect.properties.authentication_method.is_some();
    if !broker.allow_anonymous() && !enhanced {
        return Err(if connect.username.is_some() {
            (
                ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                "bad user name or password",
            )
        } else {
            (
                ReasonCode::NOT_AUTHORIZED,
                "anonymous access is not allowed",
            )
        });
    }
    if let Some(will) = &connect.will {
        if topic::topic_name_error(&will.topic).is_some() {
            return Err((
                ReasonCode::TOPIC_NAME_INVALID,
                "will topic is not a valid topic name",
            ));
        }
        if will.qos as u8 > config.max_qos {
            // MQTT-3.2.2-12
            return Err((
                ReasonCode::QOS_NOT_SUPPORTED,
                "will QoS above the maximum QoS",
            ));
        }
        if will.retain && !config.retain_available {
            // MQTT-3.2.2-13
            return Err((
                ReasonCode::RETAIN_NOT_SUPPORTED,
                "retained messages are not available",
            ));
        }
        if config.validate_utf8_payload
            && will.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&will.payload).is_err()
        {
            // v5 §3.1.3.2.3: the Server MAY validate the will payload's format.
            return Err((
                ReasonCode::PAYLOAD_FORMAT_INVALID,
                "will payload is not valid UTF-8",
            ));
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
    // Only when asked (MQTT-3.1.2-28: a request of 0 means none) and configured.
    let response_information = config
        .response_information
        .as_ref()
        .filter(|_| connect.properties.request_response_information == Some(true))
        .map(|info| ByteString::from(info.clone()));
    ConnAckProperties {
        assigned_client_identifier: assigned_client_id,
        session_expiry_interval: (expiry_interval != requested_expiry).then_some(expiry_interval),
        server_keep_alive: (keep_alive != connect.keep_alive).then_some(keep_alive),
        // Absent means 65535 (v5 §3.2.2.3.3).
        receive_maximum: (config.receive_maximum != u16::MAX).then_some(config.receive_maximum),
        maximum_qos: (config.max_qos < 2)
            .then(|| QoS::from_u8(config.max_qos).unwrap_or(QoS::AtMostOnce)),
        retain_available: (!config.retain_available).then_some(false),
        maximum_packet_size: Some(config.max_packet_size),
        // Absent means 0: the client must not use aliases (MQTT-3.2.2-18).
        topic_alias_maximum: (config.topic_alias_maximum > 0).then_some(config.topic_alias_maximum),
        wildcard_subscription_available: (!config.wildcard_subscription_available).then_some(false),
        subscription_identifiers_available: (!config.subscription_identifier_available)
            .then_some(false),
        shared_subscription_available: (!config.shared_subscription_available).then_some(false),
        response_information,
        ..Default::default()
    }
}

/// Sends a rejection CONNACK (MQTT-3.2.2-6: session present 0), ends the stream with the
/// lingering close (`Io::finish_writing`, `Io::linger`) and lets the caller drop it.
/// With `explain = Some((why, connect))`, `why` becomes the v5 Reason String if the client
/// accepts problem information, and the CONNACK respects its Maximum Packet Size. Always
/// `None`, whatever the handshake step returns.
async fn reject<S: AsyncRead + AsyncWrite + Unpin, T>(
    io: &mut Io<S>,
    version: ProtocolVersion,
    code: ReasonCode,
    explain: Option<(&str, &Connect)>,
) -> Option<T> {
    tracing::info!(?version, reason = ?code, "connection refused");
    let (reason_string, client_max) = match explain {
        Some((why, connect)) => (
            wants_problem_info(connect).then(|| ByteString::from(why.to_owned())),
            client_max_packet(connect),
        ),
        None => (None, usize::MAX),
    };
    let connack = ConnAck {
        session_present: false,
        reason_code: code,
        properties: ConnAckProperties {
            reason_string,
            ..Default::default()
        },
    };
    io.queue_within(&Packet::ConnAck(connack), version, client_max);
    // MQTT-3.2.2-7: the close follows; lingering lets a client that is still writing (one
    // that pipelines PUBLISHes behind its CONNECT) read the CONNACK first. Nothing is
    // attached yet, so the linger holds only the socket.
    if io.finish_writing().await {
        io.linger().await;
    }
    None
}

/// A CONNECT that could not be decoded: answer in the client's version when it can be read
/// (v5: the reason code; 3.x: only "unacceptable protocol version" has a return code).
async fn reject_undecodable<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    error: &DecodeError,
    sniffed: Option<ProtocolVersion>,
) {
    match (error, sniffed) {
        (DecodeError::UnsupportedProtocol(_), _) => {
            // MQTT-3.1.2-2: return code 0x01 in the 3.1.1 layout, which every level reads.
            reject::<S, ()>(
                io,
                ProtocolVersion::V3_1_1,
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
                None,
            )
            .await;
        }
        (_, Some(ProtocolVersion::V5)) => {
            reject::<S, ()>(io, ProtocolVersion::V5, error.reason_code(), None).await;
        }
        (DecodeError::ClientIdNotValid, Some(v)) => {
            reject::<S, ()>(io, v, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID, None).await;
        }
        _ => {} // 3.x malformed CONNECT: close without CONNACK (MQTT-3.1.4-1)
    }
}
