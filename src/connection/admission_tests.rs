//! Unit tests of `connection::admission` (kept apart so the module stays a readable size).

/// v5 §3.2.2.3.6: at the protocol's own maximum no Maximum Packet Size is announced;
/// below it, never more than 268,435,455 (what clients accept: paho dropped the
/// connection on 268,435,460); a bound below both as it is.
#[test]
fn the_announced_packet_size_is_one_clients_accept() {
    use super::announced_packet_size;
    use crate::config::MAX_PACKET_SIZE_LIMIT;
    assert_eq!(announced_packet_size(MAX_PACKET_SIZE_LIMIT), None);
    assert_eq!(
        announced_packet_size(MAX_PACKET_SIZE_LIMIT - 1),
        Some(268_435_455)
    );
    assert_eq!(announced_packet_size(1_048_576), Some(1_048_576));
}
use bytes::{Bytes, BytesMut};

use super::{decide, Answer, Decision, Policy};
use crate::auth::AuthRegistry;
use crate::codec::{
    encode, Auth, AuthProperties, Connect, ConnectProperties, Packet, ProtocolVersion, ReasonCode,
};
use crate::config::MqttConfig;

fn connect(protocol: ProtocolVersion, client_id: &str, clean_start: bool) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive: 60,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: false,
    }
}

fn bytes_of(packets: &[Packet], version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    for p in packets {
        encode(p, version, &mut out).expect("encodable");
    }
    out.to_vec()
}

fn judge(bytes: &[u8]) -> Decision {
    let config = MqttConfig::default();
    let authenticators = AuthRegistry::new();
    decide(
        bytes,
        &Policy {
            config: &config,
            allow_anonymous: true,
            password_file: false,
            jwt: false,
            certified: false,
            authenticators: &authenticators,
        },
    )
}

fn refused_with(decision: &Decision) -> Option<ReasonCode> {
    match decision {
        Decision::Judged {
            answer: Answer::Refuse {
                refusal: (code, _), ..
            },
            ..
        } => Some(*code),
        _ => None,
    }
}

/// MQTT-3.1.3-8: a 3.1.1 client with an empty client id and Clean Session 0 is refused
/// with "identifier rejected".
#[test]
fn empty_client_id_without_clean_session_is_refused() {
    let c = connect(ProtocolVersion::V3_1_1, "", false);
    let d = judge(&bytes_of(
        &[Packet::Connect(Box::new(c))],
        ProtocolVersion::V3_1_1,
    ));
    assert_eq!(
        refused_with(&d),
        Some(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID)
    );
}

/// MQTT-3.1.3-6: a v5 client with an empty client id gets one assigned, in CONNACK.
#[test]
fn empty_v5_client_id_is_assigned() {
    let c = connect(ProtocolVersion::V5, "", true);
    let d = judge(&bytes_of(
        &[Packet::Connect(Box::new(c))],
        ProtocolVersion::V5,
    ));
    let Decision::Judged {
        answer: Answer::Accept { connack, .. },
        ..
    } = d
    else {
        panic!("not accepted: {d:?}");
    };
    assert!(connack.properties.assigned_client_identifier.is_some());
    assert_eq!(connack.reason_code, ReasonCode::SUCCESS);
}

/// `$bridge/` ids are the bridges' sessions: refused with 0x85 (3.x: return code 2),
/// at every level; a look-alike outside the prefix is an ordinary id.
#[test]
fn bridge_session_ids_are_reserved() {
    for v in [
        ProtocolVersion::V3_1,
        ProtocolVersion::V3_1_1,
        ProtocolVersion::V5,
    ] {
        let c = connect(v, "$bridge/cloud", true);
        let d = judge(&bytes_of(&[Packet::Connect(Box::new(c))], v));
        assert_eq!(
            refused_with(&d),
            Some(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID),
            "{v:?}"
        );
        let c = connect(v, "$bridgecloud", true);
        let d = judge(&bytes_of(&[Packet::Connect(Box::new(c))], v));
        assert_eq!(refused_with(&d), None, "{v:?}");
    }
    assert_eq!(super::BRIDGE_ID_REFUSED.0.to_v3_connack(), 2);
}

/// MQTT-3.1.2-24: no CONNACK above the client's Maximum Packet Size; when even the
/// smallest one is above it, the broker closes without answering.
#[test]
fn no_connack_fits_closes_unanswered() {
    let mut c = connect(ProtocolVersion::V5, "small", true);
    c.properties.maximum_packet_size = Some(8);
    let d = judge(&bytes_of(
        &[Packet::Connect(Box::new(c))],
        ProtocolVersion::V5,
    ));
    assert!(
        matches!(
            d,
            Decision::Judged {
                answer: Answer::CloseUnanswered,
                client_max: 8,
                ..
            }
        ),
        "{d:?}"
    );
}

/// MQTT-4.12.0-1: an Authentication Method the broker does not offer is refused with 0x8C.
#[test]
fn unknown_auth_method_is_refused() {
    let mut c = connect(ProtocolVersion::V5, "a", true);
    c.properties.authentication_method = Some("nope".into());
    let after = Packet::Auth(Auth {
        reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
        properties: AuthProperties {
            authentication_method: Some("nope".into()),
            authentication_data: Some(Bytes::from_static(b"x")),
            ..Default::default()
        },
    });
    let bytes = bytes_of(&[Packet::Connect(Box::new(c)), after], ProtocolVersion::V5);
    assert_eq!(
        refused_with(&judge(&bytes)),
        Some(ReasonCode::BAD_AUTHENTICATION_METHOD)
    );
}

/// MQTT-3.1.2-2: an unknown protocol level is answered with 0x01 in the 3.1.1 layout.
#[test]
fn unknown_protocol_level_gets_return_code_1() {
    let mut bytes = bytes_of(
        &[Packet::Connect(Box::new(connect(
            ProtocolVersion::V3_1_1,
            "x",
            true,
        )))],
        ProtocolVersion::V3_1_1,
    );
    bytes[8] = 6; // the protocol level byte after "\0\x04MQTT"
    let d = judge(&bytes);
    assert!(
        matches!(
            d,
            Decision::Undecodable {
                answer: Some((
                    ProtocolVersion::V3_1_1,
                    ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
                )),
                ..
            }
        ),
        "{d:?}"
    );
}
