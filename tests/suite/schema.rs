//! Schema contracts (`[[schema]]`, issue 16): payloads checked against JSON Schemas before
//! fan-out, against the real broker over real sockets (raw v5 / 3.1.1 clients for the ack
//! codes, rumqttc as subscriber and 3.1.1 publisher, `mosquitto_pub`, the binary for a bad
//! file at start).
//!
//! Normative statements: v5 §3.4.2.1 / §3.5.2.1 (PUBACK / PUBREC 0x99 Payload format invalid,
//! and a Reason String, MQTT-3.4.2-2 only when the client accepts problem information), v5
//! §3.3.2.3.9 (Content Type, here the schema version), MQTT-4.3.3-9 (a refused QoS 2 id is
//! not kept). The issue's requirements: an invalid payload is not delivered; the Content Type
//! selects the version and its absence the default; 3.x `on_invalid_v3`; `dead-letter` gives
//! one dead letter with reason `schema_invalid`; a bad file stops the start naming the file;
//! a reload with a broken file keeps the running schemas.

use std::path::{Path, PathBuf};

use postbox::codec::{Packet, ProtocolVersion, PubResponse, PublishProperties, QoS, ReasonCode};
use postbox::config::{Config, InvalidV3, SchemaAction, SchemaConfig};
use postbox::server::RunningServer;

use crate::common::rumq::{V4, V5};
use crate::common::{self, v5, RawClient, WAIT};

const ORDER_V1: &str = r#"{"type":"object","required":["id","qty"],
    "properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}}"#;
/// v2: `items` instead of `qty`.
const ORDER_V2: &str = r#"{"type":"object","required":["id","items"],
    "properties":{"id":{"type":"string"},"items":{"type":"array","minItems":1}}}"#;

const VALID_V1: &[u8] = br#"{"id":"o-1","qty":2}"#;
const INVALID_V1: &[u8] = br#"{"id":"o-1","qty":0}"#;
const VALID_V2: &[u8] = br#"{"id":"o-2","items":["a"]}"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write schema");
    path
}

/// A broker with `order/v1` (the default) and `order/v2` on `orders/#`, configured by `edit`.
async fn start(dir: &Path, edit: impl FnOnce(&mut Config)) -> RunningServer {
    let v1 = write(dir, "v1.json", ORDER_V1);
    let v2 = write(dir, "v2.json", ORDER_V2);
    let mut config = common::test_config();
    config.schemas = vec![
        SchemaConfig::new("order/v1", "orders/#", &v1),
        SchemaConfig::new("order/v2", "orders/#", &v2),
    ];
    edit(&mut config);
    common::start_with(config).await
}

/// [`start`] in a fresh temporary directory (returned, to live as long as the server).
async fn start_fresh(edit: impl FnOnce(&mut Config)) -> (tempfile::TempDir, RunningServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), edit).await;
    (dir, server)
}

/// A rumqttc v5 subscriber to `filter` at QoS 1.
async fn subscriber(server: &RunningServer, id: &str, filter: &str) -> V5 {
    let mut sub = V5::connect(server.mqtt_addr, id).await;
    sub.subscribe(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await;
    sub
}

fn content_type(ct: &str) -> PublishProperties {
    PublishProperties {
        content_type: Some(ct.into()),
        ..Default::default()
    }
}

/// Publishes and returns the PUBACK / PUBREC packet itself (reason code and properties).
async fn publish_raw(
    c: &mut RawClient,
    topic: &str,
    qos: QoS,
    payload: &[u8],
    properties: PublishProperties,
    id: u16,
) -> PubResponse {
    let mut p = v5::publish_packet(topic, qos, payload, id);
    p.properties = properties;
    c.send(&Packet::Publish(p)).await;
    loop {
        match c.recv().await {
            Some(Packet::PubAck(a) | Packet::PubRec(a)) if a.packet_id == id => return a,
            Some(_) => {}
            None => panic!("closed before the ack of {id}"),
        }
    }
}

/// An invalid order (`INVALID_V1`) on `orders/eu`, QoS 1, no properties: its PUBACK.
async fn invalid_order(c: &mut RawClient, packet_id: u16) -> PubResponse {
    publish_raw(
        c,
        "orders/eu",
        QoS::AtLeastOnce,
        INVALID_V1,
        Default::default(),
        packet_id,
    )
    .await
}

#[tokio::test]
async fn invalid_order_gets_0x99_with_a_reason_and_is_not_delivered_valid_one_is() {
    let (_dir, server) = start_fresh(|_| {}).await;
    let mut sub = subscriber(&server, "schema-sub", "orders/#").await;
    let mut publisher = v5::connect_id(server.mqtt_addr, "schema-pub").await;
    for (qos, id) in [(QoS::AtLeastOnce, 1), (QoS::ExactlyOnce, 2)] {
        // v5 §3.4.2.1 / §3.5.2.1: 0x99 Payload format invalid.
        let ack = publish_raw(
            &mut publisher,
            "orders/eu",
            qos,
            INVALID_V1,
            Default::default(),
            id,
        )
        .await;
        assert_eq!(
            ack.reason_code,
            ReasonCode::PAYLOAD_FORMAT_INVALID,
            "{qos:?}"
        );
        let why = ack.properties.reason_string.expect("a Reason String");
        assert!(why.contains("/qty"), "names the failing field: {why}");
        assert!(why.len() <= 200, "bounded: {why}");
    }
    // Not a JSON document at all, QoS 0: dropped (no answer), not routed.
    v5::publish(
        &mut publisher,
        v5::publish_packet("orders/eu", QoS::AtMostOnce, b"\xff", 0),
    )
    .await;
    // The valid one is the first the subscriber gets: none of the invalid ones was routed.
    assert_eq!(
        v5::publish_qos1(&mut publisher, "orders/eu", VALID_V1, 3).await,
        ReasonCode::SUCCESS
    );
    let got = sub.next_publish().await;
    assert_eq!(&got.payload[..], VALID_V1);
    // A QoS 2 id refused with 0x99 is not kept (MQTT-4.3.3-9): the id is free again.
    let code = v5::publish(
        &mut publisher,
        v5::publish_packet("orders/eu", QoS::ExactlyOnce, VALID_V1, 2),
    )
    .await;
    assert_eq!(code, ReasonCode::SUCCESS);
    assert_eq!(&sub.next_publish().await.payload[..], VALID_V1);
    // Topics no schema covers take anything.
    assert_eq!(
        v5::publish_qos1(&mut publisher, "other", b"\xff", 4).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    let m = &server.broker.metrics;
    assert_eq!(m.messages_refused_schema_invalid[1].get(), 1);
    assert_eq!(m.messages_refused_schema_invalid[2].get(), 1);
    assert_eq!(m.messages_dropped_schema_invalid[0].get(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn no_reason_string_without_problem_information() {
    // MQTT-3.4.2-2 via Request Problem Information = 0 (v5 §3.1.2.11.7).
    let (_dir, server) = start_fresh(|_| {}).await;
    let mut connect = v5::connect_packet("schema-quiet");
    connect.properties.request_problem_information = Some(false);
    let (mut c, _) = v5::connect(server.mqtt_addr, connect).await;
    let ack = invalid_order(&mut c, 1).await;
    assert_eq!(ack.reason_code, ReasonCode::PAYLOAD_FORMAT_INVALID);
    assert_eq!(ack.properties.reason_string, None);
    server.shutdown().await;
}

#[tokio::test]
async fn content_type_selects_the_version_and_none_the_default() {
    let (_dir, server) = start_fresh(|_| {}).await;
    let mut sub = subscriber(&server, "ct-sub", "orders/#").await;
    let mut c = v5::connect_id(server.mqtt_addr, "ct-pub").await;
    let q1 = QoS::AtLeastOnce;
    let invalid = ReasonCode::PAYLOAD_FORMAT_INVALID;
    let cases = [
        // A v2 order is invalid under the default (v1) and valid as `order/v2`.
        (VALID_V2, None, invalid, "no Content Type: v1"),
        (VALID_V2, Some("order/v2"), ReasonCode::SUCCESS, "order/v2"),
        // And a v1 order is invalid as `order/v2`.
        (
            VALID_V1,
            Some("order/v2"),
            invalid,
            "v1 payload as order/v2",
        ),
        // An unknown Content Type falls back to the default.
        (
            VALID_V1,
            Some("text/json"),
            ReasonCode::SUCCESS,
            "unknown type: v1",
        ),
    ];
    for ((payload, ct, expected, why), id) in cases.into_iter().zip(1u16..) {
        let properties = ct.map(content_type).unwrap_or_default();
        let ack = publish_raw(&mut c, "orders/eu", q1, payload, properties, id).await;
        assert_eq!(ack.reason_code, expected, "{why}");
        // An accepted one is delivered.
        if expected == ReasonCode::SUCCESS {
            assert_eq!(&sub.next_publish().await.payload[..], payload);
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn v3_ack_acknowledges_and_drops() {
    let (_dir, server) = start_fresh(|_| {}).await;
    let mut sub = subscriber(&server, "v3-ack-sub", "orders/#").await;
    // rumqttc 3.1.1: `publish` waits for PUBACK / PUBCOMP, so both invalid ones were answered.
    let mut p = V4::connect(server.mqtt_addr, "v3-ack-pub", true).await;
    p.publish("orders/eu", rumqttc::QoS::AtLeastOnce, false, INVALID_V1)
        .await;
    p.publish("orders/eu", rumqttc::QoS::ExactlyOnce, false, INVALID_V1)
        .await;
    p.publish("orders/eu", rumqttc::QoS::AtLeastOnce, false, VALID_V1)
        .await;
    assert_eq!(
        &sub.next_publish().await.payload[..],
        VALID_V1,
        "the invalid ones were dropped"
    );
    let m = &server.broker.metrics;
    assert_eq!(m.messages_dropped_schema_invalid[1].get(), 1);
    assert_eq!(m.messages_dropped_schema_invalid[2].get(), 1);
    p.disconnect().await;
    server.shutdown().await;
}

#[tokio::test]
async fn v3_disconnect_closes_without_an_ack() {
    let (_dir, server) = start_fresh(|c| c.schemas[0].on_invalid_v3 = InvalidV3::Disconnect).await;
    let mut c = RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "v3-dis", true).await;
    c.send(&Packet::Publish(v5::publish_packet(
        "orders/eu",
        QoS::AtLeastOnce,
        INVALID_V1,
        7,
    )))
    .await;
    let seen = c.expect_close().await;
    assert!(seen.is_empty(), "closed without PUBACK: {seen:?}");
    assert_eq!(
        server.broker.metrics.messages_refused_schema_invalid[1].get(),
        1
    );
    // A valid one on a new connection is acknowledged as usual.
    let mut c = RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "v3-dis", true).await;
    assert_eq!(
        v5::publish_qos1(&mut c, "orders/eu", VALID_V1, 8).await,
        ReasonCode::SUCCESS
    );
    server.shutdown().await;
}

#[tokio::test]
async fn dead_letter_action_gives_one_dead_letter_with_reason_schema_invalid() {
    let (_dir, server) = start_fresh(|c| c.schemas[0].action = SchemaAction::DeadLetter).await;
    let mut orders = subscriber(&server, "dl-orders", "orders/#").await;
    let mut dlq = subscriber(&server, "dl-dlq", "$dlq/#").await;
    let mut c = v5::connect_id(server.mqtt_addr, "dl-pub").await;
    // Accepted: success (the dead letter is the message's new home), not 0x99.
    let ack = invalid_order(&mut c, 1).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    let letter = dlq.next_publish().await;
    assert_eq!(&letter.topic[..], b"$dlq/orders/eu");
    assert_eq!(&letter.payload[..], INVALID_V1);
    let props = letter.properties.expect("v5 properties");
    let user = |k: &str| {
        props
            .user_properties
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(user("reason"), ["schema_invalid"]);
    assert_eq!(user("publisher"), ["dl-pub"]);
    // Not routed to its own topic: the next message there is the valid one.
    assert_eq!(
        v5::publish_qos1(&mut c, "orders/eu", VALID_V1, 2).await,
        ReasonCode::SUCCESS
    );
    assert_eq!(&orders.next_publish().await.payload[..], VALID_V1);
    // And only one dead letter: a second invalid one is the next on `$dlq/#`.
    let ack = publish_raw(
        &mut c,
        "orders/us",
        QoS::AtLeastOnce,
        INVALID_V1,
        Default::default(),
        3,
    )
    .await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    assert_eq!(&dlq.next_publish().await.topic[..], b"$dlq/orders/us");
    assert_eq!(
        server.broker.metrics.messages_dropped_schema_invalid[1].get(),
        2
    );
    server.shutdown().await;
}

#[tokio::test]
async fn mosquitto_pub_is_told_the_payload_is_invalid() {
    // A real v5 client: mosquitto_pub reports the failed PUBACK (exit status non-zero).
    let (_dir, server) = start_fresh(|_| {}).await;
    let port = server.mqtt_addr.port().to_string();
    let run = |payload: &'static str| {
        let port = port.clone();
        async move {
            tokio::time::timeout(
                WAIT,
                tokio::process::Command::new("mosquitto_pub")
                    .args(["-h", "127.0.0.1", "-p", &port, "-V", "5", "-q", "1"])
                    .args(["-t", "orders/eu", "-m", payload])
                    .output(),
            )
            .await
            .expect("mosquitto_pub finishes")
            .expect("mosquitto_pub is installed")
        }
    };
    let bad = run(r#"{"id":"o-1","qty":0}"#).await;
    let said = String::from_utf8_lossy(&bad.stderr).to_lowercase();
    assert!(
        said.contains("payload format invalid"),
        "mosquitto_pub said: {said}"
    );
    let good = run(r#"{"id":"o-1","qty":1}"#).await;
    assert!(good.status.success(), "{good:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_bad_schema_file_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(dir.path(), "broken.schema.json", r#"{"type": "objekt"}"#);
    let data = dir.path().join("data");
    let config = common::process::write_config_with(
        dir.path(),
        &data,
        &format!("[[schema]]\nid = \"order/v1\"\nfilter = \"orders/#\"\nfile = {bad:?}\n"),
    );
    let Err(exited) = common::process::Broker::try_start(&config) else {
        panic!("started with a broken schema");
    };
    assert!(!exited.status.success());
    assert!(
        exited.output.contains("broken.schema.json") && exited.output.contains("order/v1"),
        "{}",
        exited.output
    );
    // In-process too: the start is refused before anything listens.
    let missing = dir.path().join("missing.json");
    let mut config = common::test_config();
    config.schemas = vec![SchemaConfig::new("order/v1", "orders/#", &missing)];
    let error = postbox::server::start(config).await.expect_err("no start");
    assert!(error.to_string().contains("missing.json"), "{error}");
}

#[tokio::test]
async fn reload_with_a_broken_file_keeps_the_running_schema() {
    let (dir, server) = start_fresh(|_| {}).await;
    let mut c = v5::connect_id(server.mqtt_addr, "reload-pub").await;
    let q1 = QoS::AtLeastOnce;
    std::fs::write(dir.path().join("v1.json"), "{ not json").expect("break the file");
    let report = server.reload();
    let kept = report.kept.iter().find(|(what, _)| what == "schemas");
    let (_, why) = kept.expect("the schemas kept their running state");
    assert!(why.contains("v1.json"), "{why}");
    let ack = publish_raw(&mut c, "orders/eu", q1, INVALID_V1, Default::default(), 1).await;
    assert_eq!(
        ack.reason_code,
        ReasonCode::PAYLOAD_FORMAT_INVALID,
        "old schema in force"
    );
    // A good file is taken.
    std::fs::write(dir.path().join("v1.json"), r#"{"type":"object"}"#).expect("fix the file");
    assert!(server.reload().reloaded.iter().any(|w| w == "schemas"));
    let ack = publish_raw(&mut c, "orders/eu", q1, INVALID_V1, Default::default(), 2).await;
    assert_eq!(
        ack.reason_code,
        ReasonCode::NO_MATCHING_SUBSCRIBERS,
        "new schema in force"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_changed_schema_list_applies_on_config_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = None;
    let server = start(dir.path(), |c| running = Some(c.clone())).await;
    let running = running.expect("config");
    let mut c = v5::connect_id(server.mqtt_addr, "cfg-pub").await;
    let q1 = QoS::AtLeastOnce;
    // The list now covers `invoices/#` only.
    let mut new = running.clone();
    new.schemas.truncate(1);
    new.schemas[0].filter = "invoices/#".into();
    let changes = server.reload_config(&new);
    assert_eq!(changes.applied, ["schema"]);
    let ack = publish_raw(&mut c, "orders/eu", q1, INVALID_V1, Default::default(), 1).await;
    assert_eq!(ack.reason_code, ReasonCode::NO_MATCHING_SUBSCRIBERS);
    let ack = publish_raw(&mut c, "invoices/1", q1, INVALID_V1, Default::default(), 2).await;
    assert_eq!(ack.reason_code, ReasonCode::PAYLOAD_FORMAT_INVALID);
    // A list naming a file that does not compile is not applied; the running one stays.
    let mut broken = new.clone();
    broken.schemas[0].file = dir.path().join("missing.json");
    let changes = server.reload_config(&broken);
    assert!(changes.applied.is_empty(), "{changes:?}");
    assert_eq!(changes.running.schemas, new.schemas);
    let ack = publish_raw(&mut c, "invoices/1", q1, INVALID_V1, Default::default(), 3).await;
    assert_eq!(ack.reason_code, ReasonCode::PAYLOAD_FORMAT_INVALID);
    server.shutdown().await;
}

#[tokio::test]
async fn without_schemas_at_start_a_new_list_needs_a_restart() {
    let server = common::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut new = common::test_config();
    new.schemas = vec![SchemaConfig::new(
        "o",
        "orders/#",
        write(dir.path(), "o.json", ORDER_V1),
    )];
    let changes = server.reload_config(&new);
    assert!(changes.applied.is_empty());
    assert_eq!(changes.needs_restart, ["schema"]);
    assert!(server
        .broker
        .guarantees()
        .is_some_and(|g| g.schemas.is_none()));
    server.shutdown().await;
}

#[test]
fn the_guarantees_example_loads_and_its_schema_compiles_from_the_repo_root() {
    // The README walk-through runs from the repository root, as cargo runs this test.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(std::env::current_dir().expect("cwd"), root);
    let config = Config::load(&root.join("config/examples/guarantees.toml")).expect("loads");
    assert_eq!(config.mqtt.max_queued_messages, 5);
    assert_eq!(config.mqtt.max_deliveries, 3);
    assert_eq!(config.dead_letter.prefix, "$dlq/");
    assert_eq!(config.dedup.property, "message-id");
    assert_eq!(config.dedup.window, 60);
    assert_eq!(config.schemas.len(), 1);
    assert_eq!(config.schemas[0].filter, "orders/#");
    assert_eq!(config.schemas[0].action, SchemaAction::Reject);
    let g = postbox::test_support::guarantees::Guarantees::from_config(&config)
        .expect("schema compiles");
    let registry = g.schemas.expect("schemas").current();
    use postbox::test_support::guarantees::Verdict;
    assert!(matches!(
        registry.check("orders/1", None, VALID_V1),
        Verdict::Pass
    ));
    assert!(matches!(
        registry.check("orders/1", None, INVALID_V1),
        Verdict::Invalid { .. }
    ));
    assert!(matches!(
        registry.check("orders/1", None, br#"{"qty":1}"#),
        Verdict::Invalid { .. }
    ));
    assert!(matches!(
        registry.check("orders/1", None, br#"{"id":"a","qty":1.5}"#),
        Verdict::Invalid { .. }
    ));
}
