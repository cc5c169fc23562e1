//! Any cutting of a client's bytes gets the same answers (issue 34, finding 1): the core
//! flows of 3.1.1 and 5.0 (subscribe, QoS 0/1/2 in and out, unsubscribe, ping, a will left
//! unpublished by DISCONNECT, a persistent session resumed with queued messages, retained
//! messages, a password check) replayed in one write, a write per packet, a byte per write and
//! at seeded random cuts, over tcp, tls, ws, wss and tcp with a PROXY header, each against the
//! expected answers (`common::cutting`). The same scenarios against a real Mosquitto check
//! that the expected answers are what users know. A proptest cuts the core conversation at
//! arbitrary offsets.
//!
//! 5.0 and 3.1.1 §3.1.4: "Clients are allowed to send further MQTT Control Packets
//! immediately after sending a CONNECT packet; Clients need not wait for a CONNACK packet to
//! arrive from the Server." Before the fix every packet read together with the CONNECT (or
//! while the handshake ran) was left unhandled until the client's next write, which a
//! pipelining client may never make: the transport replays, the proptest and the login
//! replays all failed, waiting out their limit for answers that never came.

use crate::common;

use common::cutting::{self, Conversation, Scenario, TcpTarget, Transport};
use common::mosquitto_broker::MosquittoBroker;
use common::v5;
use postbox::codec::{
    Disconnect, LastWill, Packet, ProtocolVersion, PubResponse, QoS, Unsubscribe,
};
use postbox::server::RunningServer;
use proptest::prelude::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// Random cuttings per scenario and transport, besides the three fixed ones.
const SEEDS: u64 = 4;

/// A broker with a listener of every transport (in-process, in memory), the example
/// password file (anonymous clients still allowed). The failed-login limits are off: the
/// wrong-password conversation is replayed under every cutting from one address, and each
/// replay must be checked, not throttled (those limits are `login_limits`'s subject).
async fn broker() -> RunningServer {
    let root = env!("CARGO_MANIFEST_DIR");
    let listeners: String = Transport::ALL
        .iter()
        .map(|t| {
            format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\n{}\n",
                t.listener_keys()
            )
        })
        .collect();
    let text = format!(
        "{listeners}\n[metrics]\nenabled = false\n[storage]\npersistence = false\n\
         [auth]\nallow_anonymous = true\npassword_file = \"{root}/config/passwd.example\"\n\
         login_failures_per_address = 0\nlogin_failures_per_user = 0\n"
    );
    let config = postbox::config::Config::from_toml_str(&text, "cuttings").expect("config");
    common::start_with(config).await
}

fn connect(version: ProtocolVersion, id: &str, clean: bool) -> Packet {
    let mut connect = v5::connect_packet(id);
    connect.protocol = version;
    connect.clean_start = clean;
    if version == V5 && !clean {
        connect.properties.session_expiry_interval = Some(300);
    }
    Packet::Connect(Box::new(connect))
}

fn with_will(packet: Packet, topic: &str) -> Packet {
    let Packet::Connect(mut connect) = packet else {
        unreachable!("a CONNECT")
    };
    connect.will = Some(LastWill {
        topic: topic.into(),
        payload: "gone".into(),
        qos: QoS::AtLeastOnce,
        ..Default::default()
    });
    Packet::Connect(connect)
}

fn with_login(packet: Packet, user: &str, password: &str) -> Packet {
    let Packet::Connect(mut connect) = packet else {
        unreachable!("a CONNECT")
    };
    connect.username = Some(user.into());
    connect.password = Some(password.as_bytes().to_vec().into());
    Packet::Connect(connect)
}

fn subscribe(id: u16, filter: &str, qos: QoS) -> Packet {
    Packet::Subscribe(v5::subscribe_packet(id, filter, qos))
}

fn unsubscribe(id: u16, filter: &str) -> Packet {
    Packet::Unsubscribe(Unsubscribe {
        packet_id: id,
        filters: vec![filter.into()],
        ..Default::default()
    })
}

fn publish(topic: &str, qos: QoS, id: u16, payload: &str, retain: bool) -> Packet {
    let mut publish = v5::publish_packet(topic, qos, payload.as_bytes(), id);
    publish.retain = retain;
    Packet::Publish(publish)
}

fn pubrel(id: u16) -> Packet {
    Packet::PubRel(PubResponse {
        packet_id: id,
        ..Default::default()
    })
}

fn disconnect() -> Packet {
    Packet::Disconnect(Disconnect::default())
}

fn lines(answers: &[&str]) -> Vec<String> {
    answers.iter().map(|a| (*a).to_owned()).collect()
}

/// One connection through every flow: SUBSCRIBE, PUBLISH at QoS 0/1/2 to itself (the QoS 2
/// one released), PINGREQ, UNSUBSCRIBE, a PUBLISH nobody takes any more, PINGREQ, and a
/// DISCONNECT that must keep its will unpublished (a lost DISCONNECT leaves the connection
/// open, and the replay ends without the close it waits for).
fn core(version: ProtocolVersion, tag: &str) -> Scenario {
    let t = |leaf: &str| format!("t/{tag}/{leaf}");
    let filter = format!("t/{tag}/#");
    let packets = vec![
        with_will(connect(version, &format!("c-{tag}"), true), &t("will")),
        subscribe(1, &filter, QoS::AtLeastOnce),
        publish(&t("a"), QoS::AtMostOnce, 0, "zero", false),
        publish(&t("b"), QoS::AtLeastOnce, 2, "one", false),
        publish(&t("c"), QoS::ExactlyOnce, 3, "two", false),
        pubrel(3),
        Packet::PingReq,
        unsubscribe(4, &filter),
        publish(&t("d"), QoS::AtLeastOnce, 5, "after", false),
        Packet::PingReq,
        disconnect(),
    ];
    let answers = vec![
        "CONNACK sp=0 rc=0x00".into(),
        "SUBACK id=1 0x01".into(),
        format!("PUBLISH {} q0 r0 zero", t("a")),
        "PUBACK id=2 rc=0x00".into(),
        format!("PUBLISH {} q1 r0 one", t("b")),
        "PUBREC id=3 rc=0x00".into(),
        "PUBCOMP id=3 rc=0x00".into(),
        format!("PUBLISH {} q1 r0 two", t("c")),
        "PINGRESP".into(),
        "UNSUBACK id=4".into(),
        // 5.0 §3.4.2.1: 0x10 No matching subscribers (Mosquitto says so too).
        if version == V5 {
            "PUBACK id=5 rc=0x10".into()
        } else {
            "PUBACK id=5 rc=0x00".into()
        },
        "PINGRESP".into(),
    ];
    vec![Conversation {
        version,
        packets,
        answers,
    }]
}

/// A persistent session over four connections: it subscribes and leaves; another client
/// publishes a retained QoS 1 and a QoS 2 message to it; it comes back (session present) to
/// both, queued; a clean start then discards the session, subscribes again (the retained
/// message, flagged retained) and clears the retained message, which it receives too.
fn session(version: ProtocolVersion, tag: &str) -> Scenario {
    let id = format!("s-{tag}");
    let r = format!("s/{tag}/r");
    let q = format!("s/{tag}/q");
    vec![
        Conversation {
            version,
            packets: vec![
                connect(version, &id, false),
                subscribe(1, &format!("s/{tag}/#"), QoS::AtLeastOnce),
                disconnect(),
            ],
            answers: lines(&["CONNACK sp=0 rc=0x00", "SUBACK id=1 0x01"]),
        },
        Conversation {
            version,
            packets: vec![
                connect(version, &format!("p-{tag}"), true),
                publish(&r, QoS::AtLeastOnce, 7, "kept", true),
                publish(&q, QoS::ExactlyOnce, 8, "queued", false),
                pubrel(8),
                disconnect(),
            ],
            answers: lines(&[
                "CONNACK sp=0 rc=0x00",
                "PUBACK id=7 rc=0x00",
                "PUBREC id=8 rc=0x00",
                "PUBCOMP id=8 rc=0x00",
            ]),
        },
        Conversation {
            version,
            packets: vec![connect(version, &id, false), disconnect()],
            answers: vec![
                "CONNACK sp=1 rc=0x00".into(),
                format!("PUBLISH {r} q1 r0 kept"),
                format!("PUBLISH {q} q1 r0 queued"),
            ],
        },
        Conversation {
            version,
            packets: vec![
                connect(version, &id, true),
                subscribe(2, &r, QoS::AtLeastOnce),
                publish(&r, QoS::AtMostOnce, 0, "", true),
                disconnect(),
            ],
            answers: vec![
                "CONNACK sp=0 rc=0x00".into(),
                "SUBACK id=2 0x01".into(),
                format!("PUBLISH {r} q1 r1 kept"),
                // The empty retained message clears it, and reaches the subscriber like any
                // message (retain flag 0 through a subscription, MQTT-3.3.1-9).
                format!("PUBLISH {r} q0 r0 "),
            ],
        },
    ]
}

/// `connect` logging in as `sensor1` with `password`, then a subscription to `topic` (QoS 0,
/// id 1), a QoS 1 PUBLISH of `payload` to it (id 2) and DISCONNECT, all in one go.
fn sensor1_round_trip(connect: Packet, password: &str, topic: &str, payload: &str) -> Vec<Packet> {
    vec![
        with_login(connect, "sensor1", password),
        subscribe(1, topic, QoS::AtMostOnce),
        publish(topic, QoS::AtLeastOnce, 2, payload, false),
        disconnect(),
    ]
}

/// A CONNECT with a user name and password (checked against the password file, which takes
/// the hash's time while the rest of the bytes wait), then a subscription and a round trip;
/// and a wrong password, whose pipelined packets must not be handled (MQTT-3.1.4-6: nothing
/// after a refused CONNECT is processed; 3.1.1 return code 4, 5.0 0x86).
fn login(version: ProtocolVersion, tag: &str) -> Scenario {
    let topic = format!("l/{tag}");
    // 3.1.1's return code 4 decodes as its 5.0 equivalent, 0x86.
    let refused = "CONNACK sp=0 rc=0x86";
    vec![
        Conversation {
            version,
            packets: sensor1_round_trip(
                connect(version, &format!("l-{tag}"), true),
                "sensor1-secret",
                &topic,
                "signed",
            ),
            answers: vec![
                "CONNACK sp=0 rc=0x00".into(),
                "SUBACK id=1 0x00".into(),
                "PUBACK id=2 rc=0x00".into(),
                format!("PUBLISH {topic} q0 r0 signed"),
            ],
        },
        Conversation {
            version,
            packets: sensor1_round_trip(
                connect(version, &format!("x-{tag}"), true),
                "not-the-secret",
                &topic,
                "refused",
            ),
            answers: lines(&[refused]),
        },
    ]
}

fn everything(version: ProtocolVersion, tag: &str) -> Scenario {
    let mut all = core(version, tag);
    all.extend(session(version, tag));
    all
}

/// Replays every cutting (`SEEDS`) of [`everything`] in `version` over every transport
/// against a broker of its own, the client ids tagged with `prefix`.
async fn every_cutting_over_every_transport(version: ProtocolVersion, prefix: &str) {
    let broker = broker().await;
    cutting::replay_all(&broker, &Transport::ALL, SEEDS, |tag| {
        everything(version, &format!("{prefix}-{tag}"))
    })
    .await;
    broker.shutdown().await;
}

/// Every cutting of the core flows and a resumed session, over every transport, 3.1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cutting_over_every_transport_gets_the_same_answers_v311() {
    every_cutting_over_every_transport(V3, "v3").await;
}

/// The same in MQTT 5.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cutting_over_every_transport_gets_the_same_answers_v5() {
    every_cutting_over_every_transport(V5, "v5").await;
}

/// A login that takes the password hash's time, with the client's next packets already
/// behind its CONNECT; and a refused one, whose packets behind the CONNECT are not handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_behind_a_checked_connect_wait_for_the_check() {
    let broker = broker().await;
    for version in [V3, V5] {
        cutting::replay_all(&broker, &[Transport::Tcp, Transport::Tls], 2, |tag| {
            login(version, &format!("{}-{tag}", version.label()))
        })
        .await;
    }
    broker.shutdown().await;
}

/// The expected answers are Mosquitto's: the same scenarios against a real Mosquitto
/// (`apt-get install mosquitto`) over TCP, under every cutting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_gives_the_expected_answers() {
    let mosquitto = MosquittoBroker::start("").await;
    let target = TcpTarget(([127, 0, 0, 1], mosquitto.port).into());
    for version in [V3, V5] {
        cutting::replay_all(&target, &[Transport::Tcp], SEEDS, |tag| {
            everything(version, &format!("m-{}-{tag}", version.label()))
        })
        .await;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The core conversation cut at arbitrary offsets (up to 12 cuts anywhere in its
    /// bytes) over TCP gets the expected answers.
    #[test]
    fn any_cut_points_get_the_same_answers(
        v5 in any::<bool>(),
        cuts in proptest::collection::vec(0usize..400, 0..12),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let result = runtime.block_on(async {
            let broker = common::start().await;
            let target = TcpTarget(broker.mqtt_addr);
            let version = if v5 { V5 } else { V3 };
            let scenario = core(version, "prop");
            let conversation = &scenario[0];
            let writes = cutting::writes_at(&conversation.stream(Transport::Tcp), &cuts);
            let result =
                cutting::replay_writes(&target, Transport::Tcp, conversation, &writes).await;
            broker.shutdown().await;
            result
        });
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
