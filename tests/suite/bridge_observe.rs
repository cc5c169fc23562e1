//! Bridge observability (issue 15): what a `[[bridge]]`'s status reports reaches operators
//! through real sockets: the retained `$SYS/broker/connection/<name>/state` notification (read
//! with `mosquitto_sub`), the `postbox_bridge_*` series on `/metrics`, `GET /api/v1/bridges`
//! and the overview, and the status page rendered by a headless Chromium.
//!
//! The bridge points at a closed port with `start = "lazy"` and a threshold nobody reaches, so
//! its engine never connects and the calls the tests make on its status (what the engine calls
//! at each event) are the only events. Its queue figures come from its real local session
//! `$bridge/<name>`, filled through the in-process `Link` and a real MQTT publisher.
//!
//! Normative statements (MQTT 3.1.1, which `mosquitto_sub` speaks by default): MQTT-3.3.1-8
//! (a retained message sent for a new subscription has RETAIN 1), MQTT-3.3.1-9 (one sent to an
//! established subscription has RETAIN 0), MQTT-3.3.5-1 (delivered at the lower of the
//! message's and the subscription's QoS).

use std::time::Instant;

use postbox::codec::QoS;
use postbox::config::Config;
use postbox::server::RunningServer;
use postbox::test_support::bridge::{BridgeStatus, Flow};
use postbox::test_support::broker::link::{Link, LinkOptions};
use serde_json::Value;

use crate::common;
use crate::common::http::{get_async as get, get_json_async as get_json, sample};
use crate::common::mosquitto::MosquittoSub;
use crate::common::process::free_port;
use crate::common::rumq::V4;

const BRIDGE: &str = "cloud";
const STATE_TOPIC: &str = "$SYS/broker/connection/cloud/state";

/// A broker in memory on loopback with its HTTP listener on a free port (returned with it) and
/// one bridge `cloud` (`notifications` as given) that never connects by itself.
async fn start(notifications: bool) -> (RunningServer, u16) {
    let http = free_port();
    let text = format!(
        r#"
[listener]
bind = "127.0.0.1:0"
[metrics]
bind = "127.0.0.1:{http}"
[storage]
persistence = false

[[bridge]]
name = "{BRIDGE}"
addresses = ["127.0.0.1:1"]
start = "lazy"
threshold = 1000000
notifications = {notifications}
[[bridge.topic]]
pattern = "sensors/#"
direction = "out"
qos = 1
"#
    );
    let config = Config::from_toml_str(&text, "bridge_observe.toml").expect("valid config");
    (common::start_with(config).await, http)
}

fn status(server: &RunningServer) -> &BridgeStatus {
    assert_eq!(server.bridges.len(), 1, "one status per [[bridge]]");
    let status = &server.bridges[0];
    assert_eq!(status.name(), BRIDGE);
    assert_eq!(status.local_session(), "$bridge/cloud");
    status
}

async fn scrape(http: u16) -> String {
    let (code, body) = get(http, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of `series` in a scrape, which must be there.
fn value(scrape: &str, series: &str) -> f64 {
    sample(scrape, series).unwrap_or_else(|| panic!("no `{series}` in:\n{scrape}"))
}

/// The bridge's `postbox_bridge_up` and `postbox_bridge_reconnects_total` in a scrape now.
async fn assert_up_and_reconnects(http: u16, up: f64, reconnects: f64) {
    let metrics = scrape(http).await;
    assert_eq!(value(&metrics, r#"postbox_bridge_up{bridge="cloud"}"#), up);
    assert_eq!(
        value(
            &metrics,
            r#"postbox_bridge_reconnects_total{bridge="cloud"}"#
        ),
        reconnects
    );
}

/// What a new subscriber to the state topic gets first: `QOS RETAIN PAYLOAD` of the retained
/// value (a fresh `mosquitto_sub -q 1 -C 1`).
async fn retained_state(port: u16) -> String {
    let mut sub = MosquittoSub::spawn(
        port,
        &["-q", "1", "-C", "1", "-F", "%t %q %r %p", "-t", STATE_TOPIC],
    );
    let got = sub.wait_for_value(STATE_TOPIC, |_| true).await;
    sub.exit_ok().await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_state_is_published_counted_and_listed() {
    let (server, http) = start(true).await;
    let port = server.mqtt_addr.port();
    let bridge = status(&server);

    // At creation: down, retained `0` (QoS 1, RETAIN 1 for a new subscription: MQTT-3.3.1-8).
    assert_eq!(retained_state(port).await, "1 1 0");
    assert_up_and_reconnects(http, 0.0, 0.0).await;
    // A watcher on an established QoS 1 subscription sees every change after the retained
    // value, with RETAIN 0 (MQTT-3.3.1-9), at QoS 1 (MQTT-3.3.5-1: both are 1).
    let mut watcher = MosquittoSub::spawn(
        port,
        &[
            "-q",
            "1",
            "-F",
            "%t %q %r %p",
            "-t",
            "$SYS/broker/connection/#",
        ],
    );
    watcher.wait_for_value(STATE_TOPIC, |v| v == "1 1 0").await;

    // Up: `1`.
    bridge.connected("127.0.0.1:1", false);
    watcher.wait_for_value(STATE_TOPIC, |v| v == "1 0 1").await;
    assert_eq!(retained_state(port).await, "1 1 1");
    bridge.forwarded(Flow::Out);
    bridge.forwarded(Flow::Out);
    bridge.forwarded(Flow::In);
    bridge.dropped(Flow::Out, "max_hops");
    bridge.dropped(Flow::In, "refused");
    bridge.dropped(Flow::In, "refused");
    let metrics = scrape(http).await;
    for (series, want) in [
        (r#"postbox_bridge_up{bridge="cloud"}"#, 1.0),
        (r#"postbox_bridge_reconnects_total{bridge="cloud"}"#, 0.0),
        (
            r#"postbox_bridge_forwarded_total{bridge="cloud",direction="out"}"#,
            2.0,
        ),
        (
            r#"postbox_bridge_forwarded_total{bridge="cloud",direction="in"}"#,
            1.0,
        ),
        (
            r#"postbox_bridge_dropped_total{bridge="cloud",direction="out",reason="max_hops"}"#,
            1.0,
        ),
        (
            r#"postbox_bridge_dropped_total{bridge="cloud",direction="in",reason="refused"}"#,
            2.0,
        ),
        (
            r#"postbox_bridge_dropped_total{bridge="cloud",direction="in",reason="too_large"}"#,
            0.0,
        ),
        (r#"postbox_bridge_queued_messages{bridge="cloud"}"#, 0.0),
        (r#"postbox_bridge_queued_bytes{bridge="cloud"}"#, 0.0),
        (
            r#"postbox_bridge_oldest_queued_seconds{bridge="cloud"}"#,
            0.0,
        ),
    ] {
        assert_eq!(value(&metrics, series), want, "{series}");
    }
    let list = get_json(http, "/api/v1/bridges").await;
    let b = &list["bridges"][0];
    assert_eq!(list["bridges"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(b["name"], BRIDGE, "{b}");
    assert_eq!(b["up"], true, "{b}");
    assert_eq!(b["address"], "127.0.0.1:1", "{b}");
    assert_eq!(b["forwarded"]["out"], 2, "{b}");
    assert_eq!(b["forwarded"]["in"], 1, "{b}");
    assert_eq!(b["dropped"]["out"]["total"], 1, "{b}");
    assert_eq!(b["dropped"]["out"]["by_reason"]["max_hops"], 1, "{b}");
    assert_eq!(b["dropped"]["in"]["total"], 2, "{b}");
    assert_eq!(b["dropped"]["in"]["by_reason"]["refused"], 2, "{b}");
    assert_eq!(b["local_session"], "$bridge/cloud", "{b}");
    let overview = get_json(http, "/api/v1/overview").await;
    assert_eq!(overview["bridges"]["configured"], 1, "{overview}");
    assert_eq!(overview["bridges"]["up"], 1, "{overview}");

    // Down with an error: `0`; a second report of the same state publishes nothing, so the
    // next value the watcher sees is the reconnect's `1`.
    bridge.disconnected(Some("remote closed the connection".into()));
    watcher.wait_for_value(STATE_TOPIC, |v| v == "1 0 0").await;
    assert_eq!(retained_state(port).await, "1 1 0");
    bridge.disconnected(None);
    bridge.connected("127.0.0.1:2", true);
    watcher.wait_for_value(STATE_TOPIC, |v| v == "1 0 1").await;
    let seen: Vec<&str> = watcher
        .consumed()
        .iter()
        .filter_map(|l| l.strip_prefix(STATE_TOPIC))
        .map(str::trim)
        .collect();
    assert_eq!(
        seen,
        ["1 1 0", "1 0 1", "1 0 0", "1 0 1"],
        "0 -> 1 -> 0 -> 1"
    );
    assert_up_and_reconnects(http, 1.0, 1.0).await;
    bridge.disconnected(Some("keep-alive timeout".into()));
    watcher.wait_for_value(STATE_TOPIC, |v| v == "1 0 0").await;
    let metrics = scrape(http).await;
    assert_eq!(value(&metrics, r#"postbox_bridge_up{bridge="cloud"}"#), 0.0);
    let b = get_json(http, "/api/v1/bridges").await["bridges"][0].clone();
    assert_eq!(b["up"], false, "{b}");
    assert_eq!(b["address"], Value::Null, "{b}");
    assert_eq!(b["last_error"], "keep-alive timeout", "{b}");
    assert_eq!(b["reconnects"], 1, "{b}");
    assert_eq!(get(http, "/api/v1/bridges?limit=5").await.0, 400);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notifications_nothing_is_published() {
    let (server, http) = start(false).await;
    let port = server.mqtt_addr.port();
    let bridge = status(&server);
    // One SUBSCRIBE for both filters: a retained state would come right after the SUBACK,
    // before the marker published later.
    let mut watcher = MosquittoSub::spawn(
        port,
        &[
            "-q",
            "1",
            "-v",
            "-t",
            "$SYS/broker/connection/#",
            "-t",
            "marker",
        ],
    );
    watcher.wait_for("SUBACK").await;
    bridge.connected("127.0.0.1:1", false);
    bridge.disconnected(Some("gone".into()));
    // Routed after the events, to the same session: it arrives after anything they published.
    common::mosquitto::mosquitto_pub(port, &["-q", "1", "-t", "marker", "-m", "done"]).await;
    watcher.wait_for("marker done").await;
    let states: Vec<&String> = watcher
        .consumed()
        .iter()
        .filter(|l| l.starts_with("$SYS/broker/connection/"))
        .collect();
    assert!(states.is_empty(), "notifications = false: {states:?}");
    // The metrics count all the same.
    let metrics = scrape(http).await;
    assert_eq!(value(&metrics, r#"postbox_bridge_up{bridge="cloud"}"#), 0.0);
    server.shutdown().await;
}

/// The bridge's local session holds messages (offline, as while the remote is down): the
/// queue gauges, the API and the status page show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_gauges_read_the_local_session_and_the_page_shows_the_bridge() {
    let (server, http) = start(true).await;
    let link = Link::connect(&server.broker, LinkOptions::persistent("$bridge/cloud"));
    link.subscribe("sensors/#", QoS::AtLeastOnce)
        .expect("valid filter");
    link.disconnect();
    let first_published = Instant::now();
    let mut publisher = V4::connect(server.mqtt_addr, "sensor-1", true).await;
    for payload in ["12.5", "13.25", "14"] {
        // PUBACK: queued for the offline session.
        publisher
            .publish(
                "sensors/t",
                rumqttc::QoS::AtLeastOnce,
                false,
                payload.as_bytes(),
            )
            .await;
    }
    let metrics = scrape(http).await;
    let oldest_bound = first_published.elapsed().as_secs_f64();
    assert_eq!(
        value(
            &metrics,
            r#"postbox_bridge_queued_messages{bridge="cloud"}"#
        ),
        3.0
    );
    assert_eq!(
        value(&metrics, r#"postbox_bridge_queued_bytes{bridge="cloud"}"#),
        // Each message's topic (`sensors/t`) and payload: what the session holds.
        f64::from(3 * 9 + 4 + 5 + 2)
    );
    let oldest = value(
        &metrics,
        r#"postbox_bridge_oldest_queued_seconds{bridge="cloud"}"#,
    );
    assert!(
        oldest > 0.0 && oldest <= oldest_bound,
        "oldest {oldest} s, published {oldest_bound} s ago"
    );
    let b = get_json(http, "/api/v1/bridges").await["bridges"][0].clone();
    assert_eq!(b["queued_messages"], 3, "{b}");
    assert_eq!(b["queued_bytes"], 3 * 9 + 11, "{b}");
    assert!(
        b["oldest_queued_secs"].as_f64().is_some_and(|s| s > 0.0),
        "{b}"
    );
    let overview = get_json(http, "/api/v1/overview").await;
    assert_eq!(overview["bridges"]["queued_messages"], 3, "{overview}");
    server.bridges[0].forwarded(Flow::Out);

    let dom = render_page(http).await;
    let row = common::http::table_row(&dom, "data-bridge=\"cloud\"")
        .unwrap_or_else(|| panic!("no bridge row in the status page:\n{dom}"));
    assert!(row.contains("<td class=\"num queued\">3</td>"), "{row}");
    assert!(row.contains("<td class=\"link bad\">down</td>"), "{row}");
    assert!(
        row.contains("<td class=\"num forwarded-out\">1</td>"),
        "{row}"
    );
    assert!(!dom.contains("id=\"bridges-section\" hidden"), "{dom}");
    server.shutdown().await;
}

/// Without bridges the status page keeps its Bridges section hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_hides_bridges_when_none_are_configured() {
    let http = free_port();
    let mut config = common::test_config();
    config.metrics.enabled = true;
    config.metrics.bind = format!("127.0.0.1:{http}").parse().expect("addr");
    let server = common::start_with(config).await;
    assert!(server.bridges.is_empty());
    let overview = get_json(http, "/api/v1/overview").await;
    assert_eq!(overview["bridges"]["configured"], 0, "{overview}");
    assert_eq!(
        get_json(http, "/api/v1/bridges").await["bridges"],
        serde_json::json!([])
    );
    let dom = render_page(http).await;
    // The page ran (the overview's numbers are in) and left the section hidden.
    assert!(dom.contains("id=\"clients-connected\">0<"), "{dom}");
    assert!(dom.contains("id=\"bridges-section\" hidden"), "{dom}");
    assert!(!dom.contains("data-bridge="), "{dom}");
    server.shutdown().await;
}

/// The status page's DOM after its script ran (`common::http::rendered_dom`), which must not
/// show an error.
async fn render_page(http: u16) -> String {
    let dom = common::http::rendered_dom(&format!("http://127.0.0.1:{http}/"), 5000).await;
    assert!(
        dom.contains("id=\"error\"></span>"),
        "the page reported an error:\n{dom}"
    );
    dom
}
