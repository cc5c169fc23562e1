//! What one client, an anonymous one included, can pin in the broker (issue 35, finding 6),
//! over real sockets against the `postbox` binary with its default limits: at most 1,000
//! subscriptions and 256 KiB of filters per client, subscriptions counted against
//! `mqtt.max_memory`, and sessions of clients no method authenticated capped at one day.
//!
//! Normative statements: MQTT-3.8.4-6 / MQTT-3.8.4-7 (a Reason Code per filter, the granted
//! QoS or a failure), MQTT-3.9.3-1 (in the order of the filters), MQTT-3.9.3-2 (one of Table
//! 3-10's codes: 0x97 Quota exceeded; MQTT 3.1.1 §3.9.3: 0x80 Failure), MQTT-4.1.0-2 (the
//! session is discarded once its expiry interval passed); MQTT 5 §3.2.2.3.2 (CONNACK's Session
//! Expiry Interval tells the client the value the server uses instead of its own).

use postbox::codec::{Packet, ProtocolVersion, ReasonCode, SubAck, Subscribe, SubscriptionOptions};

use crate::common;
use common::async_process::BrokerProcess;
use common::{v5, RawClient};

/// SUBSCRIBE of `filters` at QoS 0 in one packet; the SUBACK's codes.
async fn subscribe_all(c: &mut RawClient, id: u16, filters: &[String]) -> Vec<ReasonCode> {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: id,
        filters: filters
            .iter()
            .map(|f| (f.as_str().into(), SubscriptionOptions::default()))
            .collect(),
        ..Default::default()
    }))
    .await;
    loop {
        match c.recv().await {
            Some(Packet::SubAck(SubAck {
                packet_id,
                reason_codes,
                ..
            })) if packet_id == id => return reason_codes,
            Some(_) => {}
            None => panic!("closed before SUBACK {id}"),
        }
    }
}

const GRANTED: ReasonCode = ReasonCode(0);

/// The 1,001st subscription of a client gets 0x97 (3.1.1: 0x80), while a filter it holds may
/// be subscribed to again; the same bound for every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holds_at_most_a_thousand_subscriptions_by_default() {
    let broker = BrokerProcess::spawn("", "").await;
    for version in [ProtocolVersion::V5, ProtocolVersion::V3_1_1] {
        let mut c =
            RawClient::connect(broker.addr, version, &format!("many-{version:?}"), true).await;
        for batch in 0..10u16 {
            let filters: Vec<String> = (0..100).map(|i| format!("fleet/{batch}/{i}/cmd")).collect();
            let codes = subscribe_all(&mut c, batch + 1, &filters).await;
            assert!(
                codes.iter().all(|c| *c == GRANTED),
                "{version:?} batch {batch}"
            );
        }
        let codes = subscribe_all(
            &mut c,
            11,
            &["fleet/one/more".to_owned(), "fleet/0/0/cmd".to_owned()],
        )
        .await;
        let refused = if version == ProtocolVersion::V5 {
            ReasonCode::QUOTA_EXCEEDED
        } else {
            ReasonCode(0x80)
        };
        assert_eq!(codes, [refused, GRANTED], "{version:?}: one over, one held");
    }
}

/// Filters of 10,000 bytes (under `max_topic_length`): 26 fit a client's 256 KiB, the 27th
/// is refused with 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holds_at_most_256_kib_of_filters_by_default() {
    let broker = BrokerProcess::spawn("", "").await;
    let mut c = v5::connect_id(broker.addr, "long-filters").await;
    let filters: Vec<String> = (0..30)
        .map(|i| format!("{i:05}/{}", "x".repeat(9_994)))
        .collect();
    assert_eq!(filters[0].len(), 10_000);
    let codes = subscribe_all(&mut c, 1, &filters).await;
    let granted = codes.iter().take_while(|c| **c == GRANTED).count();
    assert_eq!(
        granted, 26,
        "262,144 bytes hold 26 filters of 10,000: {codes:?}"
    );
    assert!(
        codes[26..].iter().all(|c| *c == ReasonCode::QUOTA_EXCEEDED),
        "{codes:?}"
    );
}

/// Many clients each under their own bounds: the filters' memory counts against
/// `mqtt.max_memory` (4 MiB here), so the flood is refused (v5 0x97, 3.1.1 0x80) once
/// subscriptions hold half of it, instead of growing without bound; what ended sessions held
/// is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_filters_is_refused_once_the_memory_budget_is_near() {
    let broker = BrokerProcess::spawn("", "max_memory = 4194304").await;
    let mut clients = Vec::new();
    let mut refused_at = None;
    for n in 0..40u16 {
        let version = if n % 2 == 0 {
            ProtocolVersion::V5
        } else {
            ProtocolVersion::V3_1_1
        };
        let mut c = RawClient::connect(broker.addr, version, &format!("flood-{n}"), true).await;
        let filters: Vec<String> = (0..20)
            .map(|i| format!("{n:03}/{i:03}/{}", "y".repeat(9_992)))
            .collect();
        let codes = subscribe_all(&mut c, 1, &filters).await;
        clients.push(c);
        if let Some(i) = codes.iter().position(|c| *c != GRANTED) {
            let expected = if version == ProtocolVersion::V5 {
                ReasonCode::QUOTA_EXCEEDED
            } else {
                ReasonCode(0x80)
            };
            assert_eq!(codes[i], expected, "{version:?} client {n}: {codes:?}");
            refused_at = Some(n);
            // The next client, of the other version, is refused too.
            let other = if version == ProtocolVersion::V5 {
                ProtocolVersion::V3_1_1
            } else {
                ProtocolVersion::V5
            };
            let mut c = RawClient::connect(broker.addr, other, "flood-next", true).await;
            let codes = subscribe_all(&mut c, 1, &filters).await;
            let expected = if other == ProtocolVersion::V5 {
                ReasonCode::QUOTA_EXCEEDED
            } else {
                ReasonCode(0x80)
            };
            assert!(
                codes.iter().all(|c| *c == expected),
                "{other:?} after the budget filled: {codes:?}"
            );
            break;
        }
    }
    let n = refused_at.expect("40 clients of 200 KB of filters each were all granted");
    // Half of 4 MiB at ~20 KB per filter (twice its bytes and 256): about 5 clients of 20.
    assert!((4..=6).contains(&n), "refused at client {n}");
    // Clean sessions end with their connections: their filters are uncounted.
    for c in clients {
        drop(c);
    }
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        let mut c = v5::connect_id(broker.addr, "after-flood").await;
        let filters = vec![format!("after/{}", "z".repeat(9_994))];
        if subscribe_all(&mut c, 1, &filters).await == [GRANTED] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the budget was never given back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// An anonymous v5 client asking for a session that never expires is told one day
/// (86,400 s) in CONNACK; an MQTT 3.1.1 client with clean session 0 gets a session of one day
/// (the admin API shows it), where before both were kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_session_lasts_at_most_a_day_by_default() {
    let broker = BrokerProcess::spawn("", "").await;
    let (c, ack) = v5::connect(broker.addr, v5::persistent_connect("anon-v5", u32::MAX)).await;
    assert_eq!(ack.properties.session_expiry_interval, Some(86_400));
    v5::disconnect(c).await;
    let (c, ack) = v5::connect(broker.addr, v5::persistent_connect("anon-short", 600)).await;
    assert_eq!(
        ack.properties.session_expiry_interval, None,
        "a shorter request stands"
    );
    v5::disconnect(c).await;

    let c = RawClient::connect(broker.addr, ProtocolVersion::V3_1_1, "anon-311", false).await;
    drop(c);
    let port = broker.metrics_port;
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        let view = common::http::get_json_async(port, "/api/v1/sessions/anon-311").await;
        if view["connected"] == false {
            assert_eq!(view["expiry_interval_secs"], 86_400, "{view}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The cap is for clients nobody authenticated: a user the password file verified keeps the
/// expiry it asked for, while a user name no method checks (no password file) does not lift
/// the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_session_keeps_its_expiry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("passwd");
    let made = std::process::Command::new(common::process::BIN)
        .args([
            "passwd",
            "-c",
            "-b",
            file.to_str().expect("utf8"),
            "sensor1",
            "s3cret",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("postbox passwd");
    assert!(made.status.success(), "{made:?}");
    let broker = BrokerProcess::spawn_file(
        &format!("[storage]\npersistence = false\n[auth]\npassword_file = {file:?}\n"),
        &[],
    )
    .await;
    let mut connect = v5::persistent_connect("sensor1", u32::MAX);
    connect.username = Some("sensor1".into());
    connect.password = Some(bytes::Bytes::from_static(b"s3cret"));
    let (c, ack) = v5::connect(broker.addr, connect).await;
    assert_eq!(
        ack.properties.session_expiry_interval, None,
        "granted as asked"
    );
    v5::disconnect(c).await;

    let unchecked = BrokerProcess::spawn("", "").await;
    let mut connect = v5::persistent_connect("named", u32::MAX);
    connect.username = Some("anyone".into());
    let (c, ack) = v5::connect(unchecked.addr, connect).await;
    assert_eq!(
        ack.properties.session_expiry_interval,
        Some(86_400),
        "an unchecked user name is anonymous"
    );
    v5::disconnect(c).await;
}

/// Where a method tells identities apart, anonymous sessions' subscriptions share an eighth of
/// `mqtt.max_memory` (4 MiB here: 512 KiB) between them: one stranger opening session after
/// session, each under the per-client bounds, is refused (0x97) within the first few, and an
/// authenticated device still gets its filters granted. Before, the flood took the
/// subscriptions' whole half and every client got 0x97 (issue 35, fourth adversarial pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_clients_cannot_take_the_subscription_budget_from_authenticated_ones() {
    let passwd = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example");
    let broker = BrokerProcess::spawn_sections(
        &[""],
        &format!(
            "[storage]\npersistence = false\n[mqtt]\nmax_memory = 4194304\n\
             [auth]\npassword_file = {passwd:?}\nallow_anonymous = true\n"
        ),
    )
    .await;
    let filters = |n: u16| -> Vec<String> {
        (0..20)
            .map(|i| format!("{n:03}/{i:03}/{}", "y".repeat(9_992)))
            .collect()
    };
    let mut strangers = Vec::new();
    let mut refused_at = None;
    for n in 0..40u16 {
        let mut c = v5::connect_id(broker.addr, &format!("stranger-{n}")).await;
        let codes = subscribe_all(&mut c, 1, &filters(n)).await;
        strangers.push(c);
        if let Some(i) = codes.iter().position(|c| *c != GRANTED) {
            assert_eq!(
                codes[i],
                ReasonCode::QUOTA_EXCEEDED,
                "client {n}: {codes:?}"
            );
            refused_at = Some(n);
            break;
        }
    }
    let n = refused_at.expect("40 anonymous clients of 200 KB of filters each were all granted");
    // 512 KiB at ~20 KB per filter: about 25 filters, in the second client of 20.
    assert!(n <= 2, "anonymous clients were refused only at client {n}");
    // The device a password verified keeps its share: all 20 granted.
    let mut connect = v5::persistent_connect("sensor1", 600);
    connect.username = Some("sensor1".into());
    connect.password = Some(bytes::Bytes::from_static(b"sensor1-secret"));
    let (mut device, _) = v5::connect(broker.addr, connect).await;
    let codes = subscribe_all(&mut device, 1, &filters(999)).await;
    assert!(
        codes.iter().all(|c| *c == GRANTED),
        "the authenticated device was refused: {codes:?}"
    );
}
