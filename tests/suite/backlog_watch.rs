//! Backlog watch (issue 16): per session, queued messages, bytes and the age of the oldest;
//! per shared-subscription group, its backlog and members; read over HTTP from `/metrics`
//! (aggregates only) and the admin API (`/api/v1/sessions/{id}`, `/api/v1/clients`,
//! `/api/v1/shared`), with real MQTT clients on a real broker.
//!
//! Requirements checked: issue 16 "Backlog watch. Per session: queued messages, bytes, and age
//! of the oldest queued message; per shared-subscription group: backlog and members. Metrics
//! (aggregates, not per-client labels), the admin API" and its test "the backlog metrics
//! follow a stalled consumer". The stall itself is MQTT's flow control: the server must not
//! send more unacknowledged QoS 1/2 PUBLISHes than the client's Receive Maximum
//! (MQTT-3.3.4-9), so everything past it waits in the session's queue; and a shared
//! subscription's message goes to one member of the group (MQTT 5 §4.8.2).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use postbox::codec::QoS;
use postbox::server::RunningServer;
use serde_json::Value;

use crate::common::http::{get_async as get, get_json_async as get_json, sample};
use crate::common::process::free_port;
use crate::common::{self, v5, RawClient, WAIT};

/// A broker on loopback with its HTTP listener (metrics and admin API) on a port of its own;
/// with that port and the MQTT listener's address.
async fn start() -> (RunningServer, u16, SocketAddr) {
    let port = free_port();
    let mut config = common::test_config();
    config.metrics.enabled = true;
    config.metrics.bind = SocketAddr::from(([127, 0, 0, 1], port));
    let server = common::start_with(config).await;
    let addr = server.listeners[0].addr;
    (server, port, addr)
}

/// Scrapes `/metrics` until `ok` holds (bounded by `WAIT`); the last scrape.
async fn scrape_until(port: u16, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, text) = get(port, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        if ok(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} never held:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET path` until `ok(json)` holds (bounded by `WAIT`); the last answer.
async fn json_until(port: u16, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let json = get_json(port, path).await;
        if ok(&json) {
            return json;
        }
        assert!(Instant::now() < deadline, "GET {path} never held: {json}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
}

/// A persistent v5 session that accepts one unacknowledged QoS 1/2 message at a time
/// (Receive Maximum 1), subscribed to `filter` at QoS 1: once it stops acknowledging, every
/// further message for it waits in its queue (MQTT-3.3.4-9).
async fn narrow_subscriber(addr: SocketAddr, id: &str, filter: &str) -> RawClient {
    let mut connect = v5::persistent_connect(id, 3600);
    connect.properties.receive_maximum = Some(1);
    let (mut c, _) = v5::connect(addr, connect).await;
    v5::subscribe(&mut c, filter, QoS::AtLeastOnce).await;
    c
}

/// Publishes `n` QoS 1 messages of `size` bytes on `topic`, each acknowledged.
async fn publish_n(c: &mut RawClient, topic: &str, n: u16, size: usize) {
    let payload = vec![b'x'; size];
    for id in 1..=n {
        let code = v5::publish(c, v5::publish_packet(topic, QoS::AtLeastOnce, &payload, id)).await;
        assert!(!code.is_error(), "PUBLISH {id}: {code:?}");
    }
}

/// A subscriber that stops acknowledging: its queued messages, their bytes and the oldest one's
/// age rise in `/metrics` and in the admin API; once it reads and acknowledges again, they fall
/// back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_metrics_follow_a_stalled_consumer() {
    const SENT: u16 = 6;
    const SIZE: usize = 100;
    // What a queued message counts: its topic and payload (no properties here).
    const HELD: usize = SIZE + "watch/t".len();
    let (server, port, addr) = start().await;
    let mut consumer = narrow_subscriber(addr, "stalled", "watch/#").await;
    let mut publisher = v5::connect_id(addr, "producer").await;
    publish_n(&mut publisher, "watch/t", SENT, SIZE).await;

    // One message in flight (unacknowledged), the rest queued.
    let queued = f64::from(SENT - 1);
    let first = scrape_until(port, "the stalled consumer's backlog", |t| {
        sample(t, "postbox_messages_queued") == Some(queued)
    })
    .await;
    assert_eq!(
        value(&first, "postbox_messages_queued_bytes"),
        queued * HELD as f64
    );
    assert_eq!(value(&first, "postbox_sessions_backlogged"), 1.0);
    assert_eq!(value(&first, "postbox_session_backlog_max"), queued);
    let age = value(&first, "postbox_session_backlog_oldest_seconds");
    assert!(age > 0.0, "oldest age {age}");
    assert!(
        !first.contains("stalled\"") && !first.contains("client_id="),
        "no per-client series:\n{first}"
    );
    // While it stays stalled, the oldest message only gets older.
    scrape_until(port, "the oldest queued message ageing", |t| {
        sample(t, "postbox_session_backlog_oldest_seconds").is_some_and(|a| a > age + 0.05)
    })
    .await;

    let session = get_json(port, "/api/v1/sessions/stalled").await;
    assert_stalled_backlog(&session, ["backlog", "backlog_bytes"], (SENT - 1, HELD));
    let clients = get_json(port, "/api/v1/clients").await;
    let listed = clients["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .find(|c| c["client_id"] == "stalled")
        .unwrap_or_else(|| panic!("stalled not listed: {clients}"));
    assert_stalled_backlog(listed, ["queued", "queued_bytes"], (SENT - 1, HELD));
    let overview = get_json(port, "/api/v1/overview").await;
    assert_eq!(
        overview["sessions"]["queued_bytes"],
        usize::from(SENT - 1) * HELD,
        "{overview}"
    );
    assert_eq!(overview["largest_backlogs"][0]["client_id"], "stalled");
    assert_eq!(
        overview["largest_backlogs"][0]["backlog_bytes"],
        usize::from(SENT - 1) * HELD
    );

    // It resumes: reads and acknowledges everything, and the backlog drains.
    for _ in 0..SENT {
        let p = v5::expect_publish(&mut consumer).await;
        assert_eq!(p.payload.len(), SIZE);
        v5::ack(&mut consumer, &p).await;
    }
    let drained = scrape_until(port, "the backlog drained", |t| {
        sample(t, "postbox_messages_queued") == Some(0.0)
    })
    .await;
    assert_eq!(value(&drained, "postbox_messages_queued_bytes"), 0.0);
    assert_eq!(value(&drained, "postbox_sessions_backlogged"), 0.0);
    assert_eq!(
        value(&drained, "postbox_session_backlog_oldest_seconds"),
        0.0
    );
    let session = get_json(port, "/api/v1/sessions/stalled").await;
    assert_eq!(session["backlog"], 0, "{session}");
    assert_eq!(session["backlog_bytes"], 0, "{session}");
    assert!(session["oldest_queued_secs"].is_null(), "{session}");

    v5::disconnect(consumer).await;
    v5::disconnect(publisher).await;
    server.shutdown().await;
}

/// Asserts the stalled consumer's backlog as one admin API object shows it: `queued` messages
/// under the key `count`, their bytes (`held` each) under `bytes`, and an oldest queued
/// message older than 0 s. The session and the client list name the first two keys
/// differently.
fn assert_stalled_backlog(object: &Value, [count, bytes]: [&str; 2], (queued, held): (u16, usize)) {
    assert_eq!(object[count], queued, "{object}");
    assert_eq!(object[bytes], usize::from(queued) * held, "{object}");
    assert!(
        object["oldest_queued_secs"]
            .as_f64()
            .is_some_and(|a| a > 0.0),
        "{object}"
    );
}

/// The group named `name` in a `/api/v1/shared` answer.
fn group<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["group"] == name)
        .unwrap_or_else(|| panic!("group {name} not listed: {list}"))
}

/// A shared group's backlog (what is queued for it across its members, and only that) and its
/// members, connected and not, in `GET /api/v1/shared` and in the aggregate metrics; a group
/// whose members all went offline with a backlog counts as unserved. The list is bounded by
/// `limit` and refuses unknown parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_group_backlog_and_members_in_the_api_and_the_metrics() {
    const SENT: u16 = 7;
    const SIZE: usize = 10;
    // What a queued message counts: its topic and payload (no properties here).
    const HELD: usize = SIZE + "jobs/build".len();
    let (server, port, addr) = start().await;
    // Two stalled members of one group (round-robin, the default strategy), a stalled plain
    // subscriber of the same topics whose queue must not count for any group, an idle group,
    // and an offline session that is both the only member of group `solo` and a plain
    // subscriber of the same topics: only its `solo` deliveries count for `solo`.
    let w1 = narrow_subscriber(addr, "worker-1", "$share/workers/jobs/#").await;
    let w2 = narrow_subscriber(addr, "worker-2", "$share/workers/jobs/#").await;
    let plain = narrow_subscriber(addr, "auditor", "jobs/#").await;
    let idle = narrow_subscriber(addr, "archiver", "$share/archive/archive/#").await;
    let mut mixed = narrow_subscriber(addr, "mixed", "$share/solo/jobs/#").await;
    v5::subscribe(&mut mixed, "jobs/#", QoS::AtLeastOnce).await;
    v5::disconnect(mixed).await;
    json_until(port, "/api/v1/sessions/mixed", |j| j["connected"] == false).await;
    let mut publisher = v5::connect_id(addr, "producer").await;
    publish_n(&mut publisher, "jobs/build", SENT, SIZE).await;

    // Each member holds one in flight; the group's other five are queued across them. The
    // plain subscriber has one in flight and six queued; `mixed`, offline, all seven of each.
    let group_queued = usize::from(SENT) - 2;
    let plain_queued = usize::from(SENT) - 1;
    let solo_queued = usize::from(SENT);
    let list = json_until(port, "/api/v1/shared", |j| {
        j["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|g| g["group"] == "workers"))
            .is_some_and(|g| g["backlog"] == group_queued)
    })
    .await;
    assert_eq!(list["truncated"], false, "{list}");
    let workers = group(&list, "workers");
    assert_eq!(workers["filter"], "jobs/#", "{workers}");
    assert_eq!(workers["members"], 2, "{workers}");
    assert_eq!(workers["connected_members"], 2, "{workers}");
    assert_eq!(workers["backlog_bytes"], group_queued * HELD, "{workers}");
    assert!(
        workers["oldest_queued_secs"]
            .as_f64()
            .is_some_and(|a| a > 0.0),
        "{workers}"
    );
    let archive = group(&list, "archive");
    assert_eq!(archive["filter"], "archive/#");
    assert_eq!(archive["members"], 1);
    assert_eq!(archive["backlog"], 0);
    assert!(archive["oldest_queued_secs"].is_null(), "{archive}");
    let solo = group(&list, "solo");
    assert_eq!(solo["members"], 1, "{solo}");
    assert_eq!(solo["connected_members"], 0, "{solo}");
    assert_eq!(
        solo["backlog"], solo_queued,
        "only its group's deliveries: {solo}"
    );
    assert_eq!(solo["backlog_bytes"], solo_queued * HELD, "{solo}");

    let text = scrape_until(port, "the shared backlog", |t| {
        sample(t, "postbox_shared_messages_queued") == Some((group_queued + solo_queued) as f64)
    })
    .await;
    assert_eq!(value(&text, "postbox_shared_groups"), 3.0);
    assert_eq!(value(&text, "postbox_shared_group_members"), 4.0);
    assert_eq!(value(&text, "postbox_shared_group_members_connected"), 3.0);
    assert_eq!(
        value(&text, "postbox_shared_group_backlog_max"),
        solo_queued as f64
    );
    assert!(value(&text, "postbox_shared_group_backlog_oldest_seconds") > 0.0);
    assert_eq!(value(&text, "postbox_shared_groups_unserved"), 1.0, "solo");
    assert_eq!(
        value(&text, "postbox_messages_queued"),
        (group_queued + plain_queued + 2 * solo_queued) as f64
    );
    assert!(!text.contains("workers"), "no per-group series:\n{text}");

    // Bounded and strict: the first group by `$share/...` only, and 400 on what it does not know.
    let first = get_json(port, "/api/v1/shared?limit=1").await;
    assert_eq!(first["truncated"], true, "{first}");
    assert_eq!(first["groups"].as_array().map(Vec::len), Some(1), "{first}");
    assert_eq!(first["groups"][0]["group"], "archive", "{first}");
    for bad in [
        "/api/v1/shared?group=workers",
        "/api/v1/shared?limit=0",
        "/api/v1/shared?limit=1001",
    ] {
        let (status, body) = get(port, bad).await;
        assert_eq!(status, 400, "GET {bad}: {body}");
    }

    // Both members go away (their sessions stay): the group keeps its backlog with nobody
    // connected to take it.
    drop(w1);
    drop(w2);
    let list = json_until(port, "/api/v1/shared", |j| {
        j["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|g| g["group"] == "workers"))
            .is_some_and(|g| g["connected_members"] == 0)
    })
    .await;
    let workers = group(&list, "workers");
    assert_eq!(workers["members"], 2, "{workers}");
    assert!(
        workers["backlog"]
            .as_u64()
            .is_some_and(|b| b >= group_queued as u64),
        "{workers}"
    );
    let text = scrape_until(port, "the unserved groups", |t| {
        sample(t, "postbox_shared_groups_unserved") == Some(2.0)
    })
    .await;
    assert_eq!(value(&text, "postbox_shared_group_members_connected"), 1.0);

    v5::disconnect(publisher).await;
    v5::disconnect(plain).await;
    v5::disconnect(idle).await;
    server.shutdown().await;
}
