//! Proptest strategies for arbitrary valid v5 packets, and the normalisation that strips what a
//! lower protocol level cannot carry.

use bytes::Bytes;
use bytestring::ByteString;
use proptest::collection::vec;
use proptest::option::of as opt;
use proptest::prelude::*;
use proptest::sample::select;
use smallvec::SmallVec;

use super::super::codes::connack_from_v3;
use super::super::*;
use super::{V3, V4, V5};

const MAX_SUB_ID: u32 = 0x0FFF_FFFF;

/// Any UTF-8 string the spec allows (no U+0000), including multi-byte characters.
fn text() -> impl Strategy<Value = ByteString> {
    "[^\\x00]{0,6}".prop_map(ByteString::from)
}

/// A topic filter the decoder lets through to the broker: any non-empty text (too short to be
/// a `$share/{group}` prefix with nothing after it, which is malformed, MQTT-4.8.2-2).
fn filter() -> impl Strategy<Value = ByteString> {
    "[^\\x00]{1,6}".prop_map(ByteString::from)
}

/// A valid, non-empty topic name: no wildcards.
fn topic() -> impl Strategy<Value = ByteString> {
    "[a-z0-9/ $é€😀]{1,8}".prop_map(ByteString::from)
}

fn bytes() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..8).prop_map(Bytes::from)
}

fn user() -> impl Strategy<Value = UserProperties> {
    vec((text(), text()), 0..3)
}

fn qos() -> impl Strategy<Value = QoS> {
    select(vec![QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce])
}

fn code(pool: &[u8]) -> impl Strategy<Value = ReasonCode> {
    select(pool.to_vec()).prop_map(ReasonCode)
}

fn packet_id() -> impl Strategy<Value = u16> {
    1..=u16::MAX
}

const CONNACK_CODES: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
];
const PUBACK_CODES: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const PUBREL_CODES: &[u8] = &[0x00, 0x92];
const SUBACK_CODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
];
const UNSUBACK_CODES: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const DISCONNECT_CODES: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
const AUTH_CODES: &[u8] = &[0x00, 0x18, 0x19];

fn connect_properties() -> impl Strategy<Value = ConnectProperties> {
    (
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(1..=u32::MAX),
        opt(any::<u16>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(text()),
        opt(bytes()),
        user(),
    )
        .prop_map(
            |(sei, rm, mps, tam, rri, rpi, am, ad, user)| ConnectProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_packet_size: mps,
                topic_alias_maximum: tam,
                request_response_information: rri,
                request_problem_information: rpi,
                // Authentication Data needs a method (5.0 §3.1.2.11.10).
                authentication_data: if am.is_some() { ad } else { None },
                authentication_method: am,
                user_properties: user,
            },
        )
}

fn will() -> impl Strategy<Value = LastWill> {
    let properties = (
        opt(any::<u32>()),
        opt(0u8..=1),
        opt(any::<u32>()),
        opt(text()),
        opt(topic()),
        opt(bytes()),
        user(),
    )
        .prop_map(|(wdi, pfi, mei, ct, rt, cd, user)| WillProperties {
            will_delay_interval: wdi,
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            content_type: ct,
            response_topic: rt,
            correlation_data: cd,
            user_properties: user,
        });
    (topic(), bytes(), qos(), any::<bool>(), properties).prop_map(
        |(topic, payload, qos, retain, properties)| LastWill {
            topic,
            payload,
            qos,
            retain,
            properties,
        },
    )
}

prop_compose! {
    /// A v5 CONNECT: each field drawn beside its name.
    fn connect()(
        clean_start in any::<bool>(),
        keep_alive in any::<u16>(),
        client_id in text(),
        will in opt(will()),
        username in opt(text()),
        password in opt(bytes()),
        properties in connect_properties(),
        bridge in any::<bool>(),
    ) -> Packet {
        Packet::Connect(Box::new(Connect {
            protocol: V5,
            clean_start,
            keep_alive,
            client_id,
            will,
            username,
            password,
            properties,
            bridge,
        }))
    }
}

fn connack() -> impl Strategy<Value = Packet> {
    let first = (
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(select(vec![QoS::AtMostOnce, QoS::AtLeastOnce])),
        opt(any::<bool>()),
        opt(1..=u32::MAX),
        opt(text()),
        opt(any::<u16>()),
        opt(text()),
        user(),
    );
    let second = (
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<u16>()),
        opt(text()),
        opt(text()),
        opt(text()),
        opt(bytes()),
    );
    (any::<bool>(), code(CONNACK_CODES), first, second).prop_map(
        |(sp, reason_code, (sei, rm, mq, ra, mps, aci, tam, rs, user), second)| {
            let (wsa, sia, ssa, ska, ri, sr, am, ad) = second;
            Packet::ConnAck(ConnAck {
                // Session Present only on success (MQTT-3.2.2-6).
                session_present: sp && reason_code == ReasonCode::SUCCESS,
                reason_code,
                properties: ConnAckProperties {
                    session_expiry_interval: sei,
                    receive_maximum: rm,
                    maximum_qos: mq,
                    retain_available: ra,
                    maximum_packet_size: mps,
                    assigned_client_identifier: aci,
                    topic_alias_maximum: tam,
                    reason_string: rs,
                    user_properties: user,
                    wildcard_subscription_available: wsa,
                    subscription_identifiers_available: sia,
                    shared_subscription_available: ssa,
                    server_keep_alive: ska,
                    response_information: ri,
                    server_reference: sr,
                    authentication_method: am,
                    authentication_data: ad,
                },
            })
        },
    )
}

fn publish() -> impl Strategy<Value = Packet> {
    let properties = (
        opt(0u8..=1),
        opt(any::<u32>()),
        opt(any::<u16>()),
        opt(topic()),
        opt(bytes()),
        user(),
        vec(1..=MAX_SUB_ID, 0..3),
        opt(text()),
    )
        .prop_map(|(pfi, mei, ta, rt, cd, user, ids, ct)| PublishProperties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            topic_alias: ta,
            response_topic: rt,
            correlation_data: cd,
            user_properties: user,
            subscription_identifiers: SmallVec::from_vec(ids),
            content_type: ct,
        });
    (
        any::<bool>(),
        qos(),
        any::<bool>(),
        topic(),
        packet_id(),
        vec(any::<u8>(), 0..64),
        properties,
    )
        .prop_map(|(dup, qos, retain, topic, id, payload, properties)| {
            let at_most_once = qos == QoS::AtMostOnce;
            Packet::Publish(Publish {
                dup: dup && !at_most_once, // MQTT-3.3.1-2
                qos,
                retain,
                topic,
                packet_id: if at_most_once { 0 } else { id },
                payload: Bytes::from(payload),
                properties,
            })
        })
}

fn ack_properties() -> impl Strategy<Value = AckProperties> {
    (opt(text()), user()).prop_map(|(reason_string, user_properties)| AckProperties {
        reason_string,
        user_properties,
    })
}

fn pub_response(pool: &'static [u8]) -> impl Strategy<Value = PubResponse> {
    (packet_id(), code(pool), ack_properties()).prop_map(|(packet_id, reason_code, properties)| {
        PubResponse {
            packet_id,
            reason_code,
            properties,
        }
    })
}

fn subscribe() -> impl Strategy<Value = Packet> {
    let options = (qos(), any::<bool>(), any::<bool>(), 0u8..=2).prop_map(
        |(qos, no_local, retain_as_published, retain_handling)| SubscriptionOptions {
            qos,
            no_local,
            retain_as_published,
            retain_handling,
        },
    );
    (
        packet_id(),
        opt(1..=MAX_SUB_ID),
        user(),
        vec((filter(), options), 1..4),
    )
        .prop_map(
            |(packet_id, subscription_identifier, user_properties, filters)| {
                Packet::Subscribe(Subscribe {
                    packet_id,
                    subscription_identifier,
                    user_properties,
                    filters,
                })
            },
        )
}

fn suback() -> impl Strategy<Value = Packet> {
    (packet_id(), ack_properties(), vec(code(SUBACK_CODES), 1..4)).prop_map(
        |(packet_id, properties, reason_codes)| {
            Packet::SubAck(SubAck {
                packet_id,
                properties,
                reason_codes,
            })
        },
    )
}

fn unsubscribe() -> impl Strategy<Value = Packet> {
    (packet_id(), user(), vec(filter(), 1..4)).prop_map(|(packet_id, user_properties, filters)| {
        Packet::Unsubscribe(Unsubscribe {
            packet_id,
            user_properties,
            filters,
        })
    })
}

fn unsuback() -> impl Strategy<Value = Packet> {
    (
        packet_id(),
        ack_properties(),
        vec(code(UNSUBACK_CODES), 1..4),
    )
        .prop_map(|(packet_id, properties, reason_codes)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                properties,
                reason_codes,
            })
        })
}

fn disconnect() -> impl Strategy<Value = Packet> {
    let properties =
        (opt(any::<u32>()), opt(text()), user(), opt(text())).prop_map(|(sei, rs, user, sr)| {
            DisconnectProperties {
                session_expiry_interval: sei,
                reason_string: rs,
                user_properties: user,
                server_reference: sr,
            }
        });
    (code(DISCONNECT_CODES), properties).prop_map(|(reason_code, properties)| {
        Packet::Disconnect(Disconnect {
            reason_code,
            properties,
        })
    })
}

fn auth() -> impl Strategy<Value = Packet> {
    let properties =
        (opt(text()), opt(bytes()), opt(text()), user()).prop_map(|(am, ad, rs, user)| {
            AuthProperties {
                authentication_method: am,
                authentication_data: ad,
                reason_string: rs,
                user_properties: user,
            }
        });
    (code(AUTH_CODES), properties).prop_map(|(reason_code, properties)| {
        Packet::Auth(Auth {
            reason_code,
            properties,
        })
    })
}

/// Any packet that is valid in MQTT 5.0, with arbitrary properties.
pub(super) fn packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        connect(),
        connack(),
        publish(),
        pub_response(PUBACK_CODES).prop_map(Packet::PubAck),
        pub_response(PUBACK_CODES).prop_map(Packet::PubRec),
        pub_response(PUBREL_CODES).prop_map(Packet::PubRel),
        pub_response(PUBREL_CODES).prop_map(Packet::PubComp),
        subscribe(),
        suback(),
        unsubscribe(),
        unsuback(),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect(),
        auth(),
    ]
}

/// A protocol level to encode and decode at.
pub(super) fn version() -> impl Strategy<Value = ProtocolVersion> {
    select(vec![V3, V4, V5])
}

/// What `p` becomes after a trip through `version`: 3.x drops properties, v5-only fields
/// and reason codes, and maps CONNACK/SUBACK codes to their 3.x return codes and back.
pub(super) fn for_version(p: Packet, version: ProtocolVersion) -> Packet {
    if let Packet::Connect(mut c) = p {
        c.protocol = version;
        if version.is_v5() {
            c.bridge = false; // the bridge bit exists at 3.x only: not encoded at 5.0
        } else {
            c.properties = ConnectProperties::default();
            if let Some(w) = &mut c.will {
                w.properties = WillProperties::default();
            }
            if c.username.is_none() {
                c.password = None; // MQTT-3.1.2-22 (3.1.1)
            }
        }
        return Packet::Connect(c);
    }
    if version.is_v5() {
        return p;
    }
    let ack = |p: PubResponse| PubResponse::new(p.packet_id);
    match p {
        Packet::ConnAck(c) => Packet::ConnAck(ConnAck {
            session_present: c.session_present,
            reason_code: connack_from_v3(c.reason_code.to_v3_connack())
                .unwrap_or(ReasonCode::NOT_AUTHORIZED),
            properties: ConnAckProperties::default(),
        }),
        Packet::Publish(mut p) => {
            p.properties = PublishProperties::default();
            Packet::Publish(p)
        }
        Packet::PubAck(p) => Packet::PubAck(ack(p)),
        Packet::PubRec(p) => Packet::PubRec(ack(p)),
        Packet::PubRel(p) => Packet::PubRel(ack(p)),
        Packet::PubComp(p) => Packet::PubComp(ack(p)),
        Packet::Subscribe(s) => Packet::Subscribe(Subscribe {
            packet_id: s.packet_id,
            subscription_identifier: None,
            user_properties: vec![],
            filters: s
                .filters
                .into_iter()
                .map(|(f, o)| {
                    let options = SubscriptionOptions {
                        qos: o.qos,
                        ..Default::default()
                    };
                    (f, options)
                })
                .collect(),
        }),
        Packet::SubAck(s) => Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            properties: AckProperties::default(),
            reason_codes: s
                .reason_codes
                .iter()
                .map(|c| ReasonCode(c.to_v3_suback()))
                .collect(),
        }),
        Packet::Unsubscribe(u) => Packet::Unsubscribe(Unsubscribe {
            user_properties: vec![],
            ..u
        }),
        Packet::UnsubAck(u) => Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            ..Default::default()
        }),
        Packet::Disconnect(_) => Packet::Disconnect(Disconnect::default()),
        other => other,
    }
}
