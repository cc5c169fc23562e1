//! The CONNECT → CONNACK decision without sockets: which CONNECT is refused and with which code,
//! which enhanced-authentication answer is acceptable, and the CONNACK an accepted client gets.
//!
//! `connection::handshake` does the I/O (reading, the AUTH exchange, writing, the lingering
//! close) and attaches the session; every rule it applies lives here, as plain functions of the
//! packet and the broker's configuration, so the same code can be driven by a fuzzer or a test
//! from bytes alone ([`decide`]).
//!
//! Must not: do I/O, attach sessions or run authenticators.

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;

use crate::auth::AuthRegistry;
use crate::codec::{
    self, topic, ConnAck, ConnAckProperties, Connect, DecodeError, Packet, ProtocolVersion, QoS,
    ReasonCode,
};
use crate::config::{MqttConfig, BRIDGE_SESSION_PREFIX};

/// Why a handshake step refused the client: the CONNACK reason and an explanation for v5
/// clients that accept problem information.
pub type Refusal = (ReasonCode, &'static str);

/// What the broker's side of the handshake depends on besides the CONNECT: its `[mqtt]`
/// section, whether anonymous clients may connect, and the enhanced-authentication methods on
/// offer. Borrowed from the `Broker` by the handshake; built by hand by a fuzzer or a test.
#[derive(Clone, Copy, Debug)]
pub struct Policy<'a> {
    /// The `[mqtt]` section in force.
    pub config: &'a MqttConfig,
    /// Whether a client without a user name may connect (the listener's `allow_anonymous`,
    /// else `auth.allow_anonymous`).
    pub allow_anonymous: bool,
    /// Whether a password file checks user names and passwords (after these checks, in the
    /// handshake); without one and with anonymous access off, a user name alone is refused.
    pub password_file: bool,
    /// Whether a password may be a JWT (`[auth.jwt]`, checked in the handshake): a client
    /// that sends a password without a user name is then not anonymous.
    pub jwt: bool,
    /// Whether the user name comes from a verified TLS client certificate
    /// (`tls.use_identity_as_username`): the client is authenticated, not anonymous.
    pub certified: bool,
    /// The enhanced-authentication methods offered.
    pub authenticators: &'a AuthRegistry,
}

/// The refusal of a client without a user name where anonymous access is off (the handshake
/// counts these in `postbox_auth_failures_total{reason="anonymous"}`).
pub const ANONYMOUS_REFUSED: Refusal = (
    ReasonCode::NOT_AUTHORIZED,
    "anonymous access is not allowed",
);

/// The refusal of a client id starting with `$bridge/` ([`BRIDGE_SESSION_PREFIX`]): those name
/// the bridges' local sessions, which only the bridges may hold.
pub const BRIDGE_ID_REFUSED: Refusal = (
    ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
    "client identifiers starting with $bridge/ are reserved for bridges",
);

/// A CONNECT that passed the checks made before authentication.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    /// The client id in force (the client's, or one the broker assigned).
    pub client_id: ByteString,
    /// Whether the broker assigned `client_id` (v5: sent back as Assigned Client Identifier).
    pub assigned: bool,
    /// The v5 Authentication Method to run before CONNACK, if the client named one (the
    /// method is offered: an unknown one is a refusal).
    pub auth_method: Option<ByteString>,
}

/// What the broker answers an accepted client, once authentication (if any) succeeded.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Send this CONNACK (Session Present still to be filled in when the session attaches).
    Accept {
        /// The CONNACK, properties included (boxed: the other answers are a few bytes).
        connack: Box<ConnAck>,
        /// Keep-alive in force (the broker's maximum may lower it).
        keep_alive: u16,
        /// Session Expiry Interval in force, in seconds.
        expiry_interval: u32,
    },
    /// Refuse with this CONNACK code. `explain` is false where the refusal carries no Reason
    /// String and ignores the client's Maximum Packet Size (the 3.x keep-alive refusal).
    Refuse {
        /// Code and reason.
        refusal: Refusal,
        /// Whether the refusal may explain itself to the client.
        explain: bool,
    },
    /// MQTT-3.1.2-24 (list: -27): no CONNACK fits the client's Maximum Packet Size; close
    /// unanswered, before attaching.
    CloseUnanswered,
}

/// The whole decision for the first bytes a client sent, for fuzzing and tests: what
/// `handshake::accept` would do with them, short of I/O and the session attach. The enhanced
/// authentication exchange is judged as far as the bytes go: every packet after CONNECT is read
/// as a v5 answer to a challenge (an authenticator that always continues), and the CONNACK is
/// built as if it then succeeded.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The bytes hold no complete CONNECT yet.
    Incomplete,
    /// The first packet is not a CONNECT (the decoder refuses this already): close.
    NotConnect,
    /// The CONNECT could not be decoded: answer with this CONNACK (version, code), or close
    /// without one.
    Undecodable {
        /// The decoder's error.
        error: DecodeError,
        /// The CONNACK to send, if any.
        answer: Option<(ProtocolVersion, ReasonCode)>,
    },
    /// The CONNECT was decoded and judged.
    Judged {
        /// The protocol level of the CONNECT.
        version: ProtocolVersion,
        /// The client's Maximum Packet Size (`usize::MAX` when none).
        client_max: usize,
        /// The answer, and the CONNACK it sends (if any).
        answer: Answer,
    },
}

/// Runs the handshake's rules on `bytes` (see [`Decision`]): the same decode rules, checks and
/// CONNACK construction the handshake uses, with no socket, no session and no authenticator.
pub fn decide(bytes: &[u8], policy: &Policy<'_>) -> Decision {
    let rules = super::decode_rules(policy.config);
    let sniffed = codec::peek_connect_version(bytes);
    let mut buf = BytesMut::from(bytes);
    let connect = match codec::decode_with(&mut buf, None, rules) {
        Ok(Some(Packet::Connect(connect))) => connect,
        Ok(Some(_)) => return Decision::NotConnect,
        Ok(None) => return Decision::Incomplete,
        Err(error) => {
            let answer = undecodable_answer(&error, sniffed);
            return Decision::Undecodable { error, answer };
        }
    };
    let version = connect.protocol;
    let client_max = client_max_packet(&connect);
    let judged = |answer| Decision::Judged {
        version,
        client_max,
        answer,
    };
    let admitted = match admit(&connect, policy) {
        Ok(admitted) => admitted,
        Err(refusal) => {
            return judged(Answer::Refuse {
                refusal,
                explain: true,
            })
        }
    };
    let mut auth_data = None;
    if let Some(method) = &admitted.auth_method {
        // What follows CONNECT: answers to challenges, until the bytes run out.
        loop {
            match codec::decode_with(&mut buf, Some(ProtocolVersion::V5), rules) {
                Ok(Some(packet)) => match auth_answer(packet, method) {
                    Ok(Some(data)) => auth_data = data,
                    Ok(None) => return Decision::Incomplete, // the client left
                    Err(refusal) => {
                        return judged(Answer::Refuse {
                            refusal,
                            explain: true,
                        })
                    }
                },
                Ok(None) => break,
                Err(error) => {
                    let refusal = (error.reason_code(), "malformed packet");
                    return judged(Answer::Refuse {
                        refusal,
                        explain: true,
                    });
                }
            }
        }
    }
    judged(answer(&connect, policy.config, &admitted, auth_data))
}

/// The checks made before authentication: client id, user name, anonymous access, will, and
/// whether the Authentication Method is offered.
///
/// # Errors
///
/// The CONNACK code and reason to refuse the client with.
pub fn admit(connect: &Connect, policy: &Policy<'_>) -> Result<Admitted, Refusal> {
    let (client_id, assigned) = client_identifier(connect, policy.config)
        .map_err(|code| (code, "client identifier not valid"))?;
    if client_id.starts_with(BRIDGE_SESSION_PREFIX) {
        // The bridges' own sessions (`$bridge/<name>`, driven in-process by `broker::link`):
        // a client taking one over would take a bridge's queue and its unacknowledged
        // messages. v5 0x85, 3.x return code 2; counted as `client_id_invalid`.
        return Err(BRIDGE_ID_REFUSED);
    }
    check_connect(connect, policy)?;
    let auth_method = match &connect.properties.authentication_method {
        Some(method) if connect.protocol.is_v5() => {
            if policy.authenticators.get(method).is_none() {
                // MQTT-4.12.0-1
                return Err((
                    ReasonCode::BAD_AUTHENTICATION_METHOD,
                    "authentication method not supported",
                ));
            }
            Some(method.clone())
        }
        _ => None,
    };
    Ok(Admitted {
        client_id,
        assigned,
        auth_method,
    })
}

/// Judges a packet read while a challenge of `method` is outstanding: `Ok(Some(data))` is the
/// Authentication Data to hand to the authenticator, `Ok(None)` a DISCONNECT (the client left).
///
/// # Errors
///
/// A Protocol Error refusal for any other packet, or an AUTH that is not 0x18 with `method`.
pub fn auth_answer(packet: Packet, method: &ByteString) -> Result<Option<Option<Bytes>>, Refusal> {
    match packet {
        Packet::Auth(a)
            if a.reason_code == ReasonCode::CONTINUE_AUTHENTICATION
                && a.properties.authentication_method.as_ref() == Some(method) =>
        {
            Ok(Some(a.properties.authentication_data)) // MQTT-4.12.0-3
        }
        Packet::Auth(_) => Err((
            ReasonCode::PROTOCOL_ERROR,
            "AUTH must be 0x18 with the method of CONNECT",
        )),
        Packet::Disconnect(_) => Ok(None),
        // MQTT-3.1.2-30 (list: -33): only AUTH or DISCONNECT before CONNACK.
        _ => Err((
            ReasonCode::PROTOCOL_ERROR,
            "only AUTH or DISCONNECT may follow CONNECT before CONNACK",
        )),
    }
}

/// The answer to an admitted client after authentication succeeded with `auth_data` (or when
/// none ran): keep-alive, session expiry and the CONNACK, or a refusal, or no answer at all.
pub fn answer(
    connect: &Connect,
    config: &MqttConfig,
    admitted: &Admitted,
    auth_data: Option<Bytes>,
) -> Answer {
    let version = connect.protocol;
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
            return Answer::Refuse {
                refusal: (
                    ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
                    "keep-alive too long",
                ),
                explain: false,
            }
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
    let mut connack = ConnAck::default();
    if version.is_v5() {
        connack.properties = connack_properties(
            config,
            connect,
            keep_alive,
            admitted.assigned.then(|| admitted.client_id.clone()),
            expiry_interval,
        );
        if let Some(method) = &admitted.auth_method {
            connack.properties.authentication_method = Some(method.clone()); // MQTT-4.12.0-5
            connack.properties.authentication_data = auth_data;
        }
    }
    if !connack_fits(&connack, version, client_max_packet(connect)) {
        return Answer::CloseUnanswered;
    }
    Answer::Accept {
        connack: Box::new(connack),
        keep_alive,
        expiry_interval,
    }
}

/// The CONNACK a refusal sends: `code`, and `why` as the Reason String when the client accepts
/// problem information (v5).
pub fn refusal_connack(code: ReasonCode, why: Option<&str>, connect: Option<&Connect>) -> ConnAck {
    let reason_string = match (why, connect) {
        (Some(why), Some(connect)) if wants_problem_info(connect) => {
            Some(ByteString::from(why.to_owned()))
        }
        _ => None,
    };
    ConnAck {
        session_present: false,
        reason_code: code,
        properties: ConnAckProperties {
            reason_string,
            ..Default::default()
        },
    }
}

/// The Maximum Packet Size CONNACK announces for a bound of `max` bytes: none at the
/// protocol's own maximum (v5 §3.2.2.3.6: absent, the protocol's limits apply), else at most
/// 268,435,455, the largest value clients accept (paho refused 268,435,460, the protocol's
/// largest whole packet, and dropped the connection: issue 37's "auto" default reached it).
pub fn announced_packet_size(max: u32) -> Option<u32> {
    (max < crate::config::MAX_PACKET_SIZE_LIMIT).then_some(max.min(268_435_455))
}

/// The CONNACK for a CONNECT that could not be decoded, in the client's version when it can be
/// read (v5: the reason code; 3.x: only "unacceptable protocol version" has a return code);
/// `None`: close without one (MQTT-3.1.4-1).
pub fn undecodable_answer(
    error: &DecodeError,
    sniffed: Option<ProtocolVersion>,
) -> Option<(ProtocolVersion, ReasonCode)> {
    match (error, sniffed) {
        // MQTT-3.1.2-2: return code 0x01 in the 3.1.1 layout, which every level reads.
        (DecodeError::UnsupportedProtocol(_), _) => Some((
            ProtocolVersion::V3_1_1,
            ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        )),
        (_, Some(ProtocolVersion::V5)) => Some((ProtocolVersion::V5, error.reason_code())),
        (DecodeError::ClientIdNotValid, Some(v)) => {
            Some((v, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID))
        }
        _ => None,
    }
}

/// Whether the client lets us send Reason Strings and User Properties (v5 Request Problem
/// Information, default 1; MQTT-3.1.2-29). Always false for 3.x, which has neither.
pub fn wants_problem_info(connect: &Connect) -> bool {
    connect.protocol.is_v5() && connect.properties.request_problem_information != Some(false)
}

/// The largest packet the client accepts (v5 Maximum Packet Size; unlimited otherwise).
pub fn client_max_packet(connect: &Connect) -> usize {
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

/// The client id to use, and whether the broker assigned it (MQTT-3.1.3-6, MQTT-3.1.3-8).
///
/// A client id with a control character (5.0 §1.5.4: SHOULD NOT appear) is refused unless
/// `mqtt.allow_control_characters`, with the code MQTT has for a client id the Server rejects
/// (MQTT-3.1.3-8: 0x85 Client Identifier not valid; 3.x 0x02 identifier rejected) rather than
/// 0x81: the client can tell its id is the problem, as it could for one too long.
fn client_identifier(
    connect: &Connect,
    config: &MqttConfig,
) -> Result<(ByteString, bool), ReasonCode> {
    if connect.client_id.len() > config.max_client_id_len
        || (!config.allow_control_characters
            && topic::has_disallowed_code_points(&connect.client_id))
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

/// A user name about to become the client id (`use_username_as_clientid`): it gets the
/// checks a client id gets (length, control characters, not empty), and the bridges'
/// reserved prefix, since [`admit`] checked the client id the CONNECT carried, not this one
/// (the third adversarial pass of issue 35: a user named `$bridge/<name>` took that
/// bridge's session).
///
/// # Errors
///
/// The CONNACK code (0x85 Client Identifier not valid) and reason to refuse the client with.
pub fn user_as_client_id(user: &str, config: &MqttConfig) -> Result<(), Refusal> {
    if user.starts_with(BRIDGE_SESSION_PREFIX) {
        return Err(BRIDGE_ID_REFUSED);
    }
    if user.is_empty()
        || user.len() > config.max_client_id_len
        || (!config.allow_control_characters && topic::has_disallowed_code_points(user))
    {
        return Err((
            ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            "the user name cannot be the client identifier",
        ));
    }
    Ok(())
}

/// Longest user name accepted, in bytes: a connection keeps its user name for its life (its
/// log lines, the admin API's client list, the ACL), and nothing else bounds it when no
/// password file checks it (the default): 2,000 connections with 65,535-byte names held
/// 292 MB, 4.4 times a 64 MiB budget, while the budget counted 2 MB, and a client looping
/// connect/close wrote 3.5 GB of log in 10 s (issue 35, fifteenth adversarial pass, B4). User
/// names in use (device ids, cloud hub paths with query strings, certificate names) stay far
/// below it; tokens go in the password.
const MAX_USER_NAME_LEN: usize = 1024;

/// Authentication and will checks that can refuse the connection.
///
/// A user name with a control character (5.0 §1.5.4: SHOULD NOT appear) is refused unless
/// `mqtt.allow_control_characters`, with 0x86 Bad User Name or Password (3.x 0x04), whose
/// meaning in the spec's CONNACK table is "The data in the user name or password is
/// malformed": the precise code, where 0x81 would not say which field. Checked before
/// anything consults the user name. (Will topics are topic names: the decoder refuses those.)
fn check_connect(connect: &Connect, policy: &Policy<'_>) -> Result<(), Refusal> {
    let config = policy.config;
    if connect
        .username
        .as_deref()
        .is_some_and(|user| user.len() > MAX_USER_NAME_LEN)
    {
        return Err((
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "user name longer than 1024 bytes",
        ));
    }
    if !config.allow_control_characters
        && connect
            .username
            .as_deref()
            .is_some_and(topic::has_disallowed_code_points)
    {
        return Err((
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "control character in the user name",
        ));
    }
    // With anonymous access off, a client is authenticated by enhanced authentication or by
    // the password file (both run after these checks); without a password file a user name
    // proves nothing.
    let enhanced = connect.protocol.is_v5() && connect.properties.authentication_method.is_some();
    if !policy.allow_anonymous && !enhanced && !policy.certified {
        match (&connect.username, policy.password_file) {
            (Some(_), true) => {}
            // A token names its user; the handshake verifies it.
            _ if policy.jwt && connect.password.is_some() => {}
            (Some(_), false) => {
                return Err((
                    ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                    "bad user name or password",
                ))
            }
            (None, _) => return Err(ANONYMOUS_REFUSED),
        }
    }
    if let Some(will) = &connect.will {
        if topic::topic_name_error(&will.topic).is_some() {
            return Err((
                ReasonCode::TOPIC_NAME_INVALID,
                "will topic is not a valid topic name",
            ));
        }
        if topic::exceeds_limits(
            &will.topic,
            config.max_topic_length,
            config.max_topic_levels,
        ) {
            return Err((
                ReasonCode::TOPIC_NAME_INVALID,
                "will topic over mqtt.max_topic_length or max_topic_levels",
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

/// Caps the Session Expiry Interval of a client no configured method authenticated at
/// `mqtt.max_session_expiry_anonymous`: a stranger's session must not outlive it for ever
/// (issue 35, finding 6). A v5 client is told the value in CONNACK's Session Expiry Interval
/// (MQTT 5 §3.2.2.3.2: the server says so when it uses another value than requested); a 3.x
/// client with clean session 0 gets a session that ends this long after it disconnects.
pub fn cap_unauthenticated_expiry(
    connect: &Connect,
    config: &MqttConfig,
    connack: &mut ConnAck,
    expiry_interval: &mut u32,
) {
    let cap = config.max_session_expiry_anonymous;
    if *expiry_interval <= cap {
        return;
    }
    *expiry_interval = cap;
    if connect.protocol.is_v5() {
        let requested = connect.properties.session_expiry_interval.unwrap_or(0);
        connack.properties.session_expiry_interval = (cap != requested).then_some(cap);
    }
}

/// v5 CONNACK properties: tell the client every limit the broker enforces.
fn connack_properties(
    config: &MqttConfig,
    connect: &Connect,
    keep_alive: u16,
    assigned_client_id: Option<ByteString>,
    expiry_interval: u32,
) -> ConnAckProperties {
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
        maximum_packet_size: announced_packet_size(config.max_packet_size),
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

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
