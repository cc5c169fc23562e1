//! The status page shows the fleet (issue 37, item 5): `GET /api/v1/clients` paged and
//! searched by the broker with every column the page shows, `GET /api/v1/listeners`, the
//! overview's retained count under the API's rule, a bridge's last error with when it
//! happened; and the page itself rendered by a headless Chromium, with screenshots at a
//! desktop's and a phone's width.
//!
//! One broker in this process with three listeners (two TCP, one WebSocket), real MQTT
//! clients over TCP (v5 and 3.1.1, from raw packets), and two bridges that never connect by
//! themselves (`start = "lazy"` to a closed port): the tests report their link events on the
//! bridges' status, as the engine does (see `bridge_observe`).
//!
//! Normative statements: MQTT-4.7.2-1 (`#` does not match topics starting with `$`: the rule
//! the retained count follows), MQTT-3.3.4-9 / MQTT 5 §4.9 (a server sends no more QoS 1/2
//! PUBLISHes than the client's Receive Maximum before their acks: how the backlog is made).

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use postbox::codec::{ProtocolVersion, QoS, ReasonCode};
use postbox::config::Config;
use postbox::server::RunningServer;
use serde_json::Value;

use crate::common;
use crate::common::http::{get_async as get, get_json_async as get_json};
use crate::common::process::free_port;
use crate::common::{v5, RawClient};

/// The clients every test connects: `dev-00` .. `dev-11` on `plant-a` (users `alice` and
/// `bob` in turn), `gw-1` on `plant-b` as `Carol` with two subscriptions, `slow` (Receive
/// Maximum 1, one QoS 1 message in flight and three queued), `old-1` (3.1.1, no user) and
/// the publisher `pub`.
struct Fleet {
    server: RunningServer,
    http: u16,
    /// Kept open: their connections are the fleet.
    _clients: Vec<RawClient>,
    /// `gw-1`'s own address, as the broker sees it.
    gw_address: SocketAddr,
    /// Unix ms before the first and after the last CONNECT.
    connected_between: (u64, u64),
}

const DEVICES: usize = 12;
/// The devices, `gw-1`, `slow`, `old-1` and `pub`.
const CONNECTED: usize = DEVICES + 4;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A v5 CONNECT for `id` as `user` (no password: no authentication method is configured,
/// so the user name is taken as given, as Mosquitto does).
fn as_user(id: &str, user: &str) -> postbox::codec::Connect {
    let mut connect = v5::connect_packet(id);
    connect.username = Some(user.into());
    connect
}

async fn start_fleet() -> Fleet {
    let http = free_port();
    // Two lazy bridges, the same but for their names.
    let bridges: String = ["cloud", "backup"]
        .map(|name| {
            format!(
                r#"
[[bridge]]
name = "{name}"
addresses = ["127.0.0.1:1"]
start = "lazy"
threshold = 1000000
[[bridge.topic]]
pattern = "up/#"
direction = "out"
"#
            )
        })
        .concat();
    let text = format!(
        r#"
[[listener]]
name = "plant-a"
bind = "127.0.0.1:0"
[[listener]]
name = "plant-b"
bind = "127.0.0.1:0"
[[listener]]
name = "browsers"
bind = "127.0.0.1:0"
kind = "ws"
[mqtt]
sys_interval = 0
[metrics]
bind = "127.0.0.1:{http}"
[storage]
persistence = false
{bridges}"#
    );
    let config = Config::from_toml_str(&text, "status_page.toml").expect("valid config");
    let server = common::start_with(config).await;
    let (plant_a, plant_b) = (server.listeners[0].addr, server.listeners[1].addr);
    let before = unix_ms();
    let mut clients = Vec::new();
    for i in 0..DEVICES {
        let user = if i % 2 == 0 { "alice" } else { "bob" };
        let (c, _) = v5::connect(plant_a, as_user(&format!("dev-{i:02}"), user)).await;
        clients.push(c);
    }
    let (mut gw, _) = v5::connect(plant_b, as_user("gw-1", "Carol")).await;
    v5::subscribe(&mut gw, "plant/+/temp", QoS::AtMostOnce).await;
    v5::subscribe(&mut gw, "plant/+/alarm", QoS::AtLeastOnce).await;
    let gw_address = gw.stream.local_addr().expect("gw-1's address");
    // `slow` takes one QoS 1 message at a time and acknowledges none: one in flight, the
    // rest queued (its backlog).
    let mut connect = v5::connect_packet("slow");
    connect.properties.receive_maximum = Some(1);
    let (mut slow, _) = v5::connect(plant_a, connect).await;
    v5::subscribe(&mut slow, "q/#", QoS::AtLeastOnce).await;
    let old = RawClient::connect(plant_a, ProtocolVersion::V3_1_1, "old-1", true).await;
    let mut publisher = v5::connect_id(plant_a, "pub").await;
    let after = unix_ms();
    for id in 1..=4u16 {
        let p = v5::publish_packet("q/x", QoS::AtLeastOnce, b"21.5", id);
        assert_eq!(v5::publish(&mut publisher, p).await, ReasonCode::SUCCESS);
    }
    // The first is in flight once it arrived; the other three wait behind it.
    let first = v5::expect_publish(&mut slow).await;
    assert_eq!(first.topic, "q/x");
    // Two retained messages a client can list, beside the bridges' `$SYS` states.
    for (i, topic) in ["r/1", "r/2"].into_iter().enumerate() {
        let mut p = v5::publish_packet(topic, QoS::AtLeastOnce, b"x", 10 + i as u16);
        p.retain = true;
        assert_eq!(
            v5::publish(&mut publisher, p).await,
            ReasonCode::NO_MATCHING_SUBSCRIBERS
        );
    }
    clients.extend([gw, slow, old, publisher]);
    Fleet {
        server,
        http,
        _clients: clients,
        gw_address,
        connected_between: (before, after),
    }
}

fn client_ids(page: &Value) -> Vec<String> {
    page["clients"]
        .as_array()
        .expect("clients array")
        .iter()
        .map(|c| c["client_id"].as_str().expect("client_id").to_owned())
        .collect()
}

/// Follows `next` from `path` (which has `limit` and maybe a search) to the last page: the
/// ids of each page. Bounded: at most 50 pages.
async fn all_pages(http: u16, path: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..50 {
        let url = match &next {
            None => path.to_owned(),
            Some(after) => format!("{path}&after={after}"),
        };
        let page = get_json(http, &url).await;
        assert_eq!(page["connected"], CONNECTED, "{page}");
        pages.push(client_ids(&page));
        match page["next"].as_str() {
            Some(after) => {
                assert_eq!(page["truncated"], true, "{page}");
                next = Some(after.to_owned());
            }
            None => {
                assert_eq!(page["truncated"], false, "{page}");
                return pages;
            }
        }
    }
    panic!("more than 50 pages from {path}");
}

/// The one client `id` of `GET /api/v1/clients?search=id`.
async fn one_client(http: u16, id: &str) -> Value {
    let page = get_json(http, &format!("/api/v1/clients?prefix={id}&limit=1")).await;
    assert_eq!(client_ids(&page), [id], "{page}");
    page["clients"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_api_pages_searches_and_shows_each_column() {
    let fleet = start_fleet().await;
    let http = fleet.http;

    // Every client once, in client id order, five at a time.
    let pages = all_pages(http, "/api/v1/clients?limit=5").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5, 5, 1]);
    let mut want: Vec<String> = (0..DEVICES).map(|i| format!("dev-{i:02}")).collect();
    want.extend(["gw-1", "old-1", "pub", "slow"].map(String::from));
    assert_eq!(pages.concat(), want);

    // A prefix; a search in client ids, case ignored, paged too; a search that finds a user
    // name; a user exactly.
    let json = get_json(http, "/api/v1/clients?prefix=dev-1").await;
    assert_eq!(client_ids(&json), ["dev-10", "dev-11"], "{json}");
    let pages = all_pages(http, "/api/v1/clients?search=EV-0&limit=4").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);
    assert_eq!(pages.concat(), want[..10]);
    let json = get_json(http, "/api/v1/clients?search=carol").await;
    assert_eq!(client_ids(&json), ["gw-1"], "by user name: {json}");
    let json = get_json(http, "/api/v1/clients?user=bob").await;
    let bobs: Vec<String> = (1..DEVICES)
        .step_by(2)
        .map(|i| format!("dev-{i:02}"))
        .collect();
    assert_eq!(client_ids(&json), bobs, "{json}");
    let json = get_json(http, "/api/v1/clients?user=Bob").await;
    assert_eq!(
        client_ids(&json),
        Vec::<String>::new(),
        "user is exact: {json}"
    );
    assert_eq!(json["next"], Value::Null, "{json}");

    // Each column of one client.
    let gw = one_client(http, "gw-1").await;
    assert_eq!(gw["user"], "Carol", "{gw}");
    assert_eq!(gw["address"], fleet.gw_address.to_string(), "{gw}");
    assert_eq!(gw["listener"], "plant-b", "{gw}");
    assert_eq!(gw["protocol"], "5.0", "{gw}");
    assert_eq!(gw["subscriptions"], 2, "{gw}");
    assert_eq!(gw["queued"], 0, "{gw}");
    let since = gw["connected_since_unix_ms"].as_u64().expect("since");
    let (before, after) = fleet.connected_between;
    assert!(
        (before..=after).contains(&since),
        "{since} not in {before}..={after}"
    );
    let slow = one_client(http, "slow").await;
    assert_eq!(slow["queued"], 3, "the backlog: {slow}");
    assert_eq!(slow["inflight"], 1, "Receive Maximum 1: {slow}");
    assert_eq!(slow["subscriptions"], 1, "{slow}");
    assert_eq!(slow["user"], Value::Null, "{slow}");
    let old = one_client(http, "old-1").await;
    assert_eq!(old["protocol"], "3.1.1", "{old}");
    assert_eq!(old["listener"], "plant-a", "{old}");

    // A cursor may be as long as a client id (up to 65,535 bytes): no length bound on it.
    let json = get_json(http, &format!("/api/v1/clients?after={}", "z".repeat(300))).await;
    assert_eq!(client_ids(&json), Vec::<String>::new(), "{json}");
    for bad in [
        "/api/v1/clients?limit=0".to_owned(),
        "/api/v1/clients?q=dev".to_owned(),
        format!("/api/v1/clients?search={}", "x".repeat(257)),
    ] {
        let (status, body) = get(http, &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }

    // The listeners, with the clients each holds now: they add up to the list's total.
    let json = get_json(http, "/api/v1/listeners").await;
    let listeners = json["listeners"].as_array().expect("listeners");
    let seen: Vec<(&str, &str, u64)> = listeners
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap_or(""),
                l["kind"].as_str().unwrap_or(""),
                l["clients_connected"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    let on_a = (CONNECTED - 1) as u64;
    assert_eq!(
        seen,
        [
            ("plant-a", "tcp", on_a),
            ("plant-b", "tcp", 1),
            ("browsers", "ws", 0)
        ],
        "{json}"
    );
    for (l, bound) in listeners.iter().zip(&fleet.server.listeners) {
        assert_eq!(l["address"], bound.addr.to_string(), "{l}");
        assert_eq!(l["admits"], "anyone (no authentication method)", "{l}");
        assert_eq!(l["anonymous"], true, "{l}");
        assert_eq!(l["loopback_only"], true, "{l}");
    }
    assert_eq!(get(http, "/api/v1/listeners?limit=1").await.0, 400);

    // Retained: the overview counts what the API lists (MQTT-4.7.2-1: not `$` topics), and
    // says how many `$SYS` ones it left out (the bridges' states).
    let overview = get_json(http, "/api/v1/overview").await;
    for (list, counted_as) in [
        ("/api/v1/retained", "retained"),
        ("/api/v1/retained?prefix=$SYS", "retained_system"),
    ] {
        let listed = get_json(http, list).await;
        assert_eq!(
            listed["retained"].as_array().map(Vec::len),
            Some(2),
            "{listed}"
        );
        assert_eq!(overview[counted_as], 2, "{overview}");
    }
    assert_eq!(overview["clients_connected"], CONNECTED, "{overview}");
    fleet.server.shutdown().await;
}

/// Reports link events on the bridges, as the engine does: `cloud` failed once and is up
/// again (its error is history), `backup` is down with its error (its state now).
fn bridge_events(server: &RunningServer) {
    let (cloud, backup) = (&server.bridges[0], &server.bridges[1]);
    assert_eq!((cloud.name(), backup.name()), ("cloud", "backup"));
    cloud.disconnected(Some("connection refused".into()));
    cloud.connected("127.0.0.1:1", true);
    backup.disconnected(Some("remote closed the connection".into()));
}

/// The text of the first `<td>` in `row` whose class attribute is `class`.
fn cell<'a>(row: &'a str, class: &str) -> &'a str {
    text_of(row, &format!("class=\"{class}\""))
        .unwrap_or_else(|| panic!("no cell of class {class:?} in {row}"))
}

/// Bridge `name`'s row in the DOM and the text of its error cell (class `error_class`), after
/// asserting that its link cell has the class `link_class` and shows `link`.
fn bridge_error<'a>(
    dom: &'a str,
    name: &str,
    (link_class, link): (&str, &str),
    error_class: &str,
) -> (&'a str, &'a str) {
    let row = common::http::table_row(dom, &format!("data-bridge=\"{name}\""))
        .unwrap_or_else(|| panic!("no {name} row:\n{dom}"));
    assert_eq!(cell(row, link_class), link, "{row}");
    (row, cell(row, error_class))
}

/// The text of the element with `id` in the DOM.
fn by_id<'a>(dom: &'a str, id: &str) -> &'a str {
    text_of(dom, &format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the DOM:\n{dom}"))
}

/// The text of the first element in `html` whose opening tag holds `attribute` (up to the next
/// tag), or `None` when no tag holds it.
fn text_of<'a>(html: &'a str, attribute: &str) -> Option<&'a str> {
    let rest = &html[html.find(attribute)?..];
    let open = rest.find('>').expect("tag end") + 1;
    let close = rest[open..].find('<').expect("element end");
    Some(&rest[open..open + close])
}

/// The rendered page at `query`, which must show no error.
async fn page(http: u16, query: &str) -> String {
    let dom = common::http::rendered_dom(&format!("http://127.0.0.1:{http}/{query}"), 5000).await;
    assert!(
        dom.contains("id=\"error\"></span>"),
        "the page reported an error:\n{dom}"
    );
    dom
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_clients_the_listeners_and_a_recovered_bridge() {
    let fleet = start_fleet().await;
    let http = fleet.http;
    bridge_events(&fleet.server);
    let gw = one_client(http, "gw-1").await;

    // The page runs under its own Content Security Policy: its inline script and style by
    // hash, requests to its own origin only (the checks below see that script's work).
    let raw = tokio::task::spawn_blocking(move || common::http::http_get(http, "/"))
        .await
        .expect("GET /");
    let policy = raw
        .lines()
        .find_map(|l| l.strip_prefix("content-security-policy: "))
        .unwrap_or_else(|| panic!("no Content-Security-Policy: {raw}"));
    assert!(policy.contains("script-src 'sha256-"), "{policy}");
    assert!(policy.contains("connect-src 'self'"), "{policy}");
    assert!(!policy.contains("unsafe"), "{policy}");

    let dom = page(http, "").await;
    // Every client on the first page (50 by default), one row each.
    assert_eq!(
        dom.matches("data-connected-client=").count(),
        CONNECTED,
        "{dom}"
    );
    let row = common::http::table_row(&dom, "data-connected-client=\"gw-1\"")
        .unwrap_or_else(|| panic!("no gw-1 row:\n{dom}"));
    assert_eq!(cell(row, "user"), "Carol", "{row}");
    assert_eq!(cell(row, "address"), fleet.gw_address.to_string(), "{row}");
    assert_eq!(cell(row, "listener"), "plant-b", "{row}");
    assert_eq!(cell(row, "protocol"), "5.0", "{row}");
    assert_eq!(cell(row, "num subscriptions"), "2", "{row}");
    assert_eq!(cell(row, "num backlog"), "0", "{row}");
    assert!(cell(row, "since").ends_with(" ago"), "{row}");
    let since = gw["connected_since_unix_ms"].as_u64().expect("since");
    assert!(row.contains(&format!("data-since=\"{since}\"")), "{row}");
    let row = common::http::table_row(&dom, "data-connected-client=\"slow\"").expect("slow");
    assert_eq!(cell(row, "num backlog bad"), "3", "{row}");
    assert_eq!(cell(row, "user muted"), "\u{2013}", "no user: {row}");
    let row = common::http::table_row(&dom, "data-connected-client=\"old-1\"").expect("old-1");
    assert_eq!(cell(row, "protocol"), "3.1.1", "{row}");
    assert!(
        by_id(&dom, "clients-summary").starts_with(&format!(
            "Clients 1\u{2013}{CONNECTED} of {CONNECTED} connected"
        )),
        "{dom}"
    );

    // The listeners.
    for (name, kind, clients) in [
        ("plant-a", "tcp", CONNECTED - 1),
        ("plant-b", "tcp", 1),
        ("browsers", "ws", 0),
    ] {
        let row = common::http::table_row(&dom, &format!("data-listener=\"{name}\""))
            .unwrap_or_else(|| panic!("no listener {name}:\n{dom}"));
        assert_eq!(cell(row, "kind"), kind, "{row}");
        assert_eq!(cell(row, "num clients"), clients.to_string(), "{row}");
        assert_eq!(
            cell(row, "admits"),
            "anyone (no authentication method)",
            "{row}"
        );
        assert!(
            cell(row, "address").ends_with("(this machine only)"),
            "{row}"
        );
    }

    // The counts, as the API gives them.
    assert_eq!(by_id(&dom, "clients-connected"), CONNECTED.to_string());
    assert_eq!(by_id(&dom, "retained"), "2", "{dom}");
    assert_eq!(by_id(&dom, "retained-system"), "2", "{dom}");

    // The bridges: `cloud` up, its last error shown as recovered; `backup` down with its
    // error as its state now.
    let (row, error) = bridge_error(&dom, "cloud", ("link", "up"), "error muted");
    assert!(
        error.starts_with("connection refused \u{2013} ") && error.ends_with(" ago, recovered"),
        "{row}"
    );
    let (row, error) = bridge_error(&dom, "backup", ("link bad", "down"), "error bad");
    assert!(
        error.starts_with("remote closed the connection \u{2013} ") && error.ends_with(" ago"),
        "{row}"
    );

    // A search given in the page's address (?search=): the broker's page of matches only.
    let dom = page(http, "?search=dev-1&page_size=25").await;
    let rows: Vec<&str> = dom
        .match_indices("data-connected-client=\"")
        .map(|(i, m)| {
            let id = &dom[i + m.len()..];
            &id[..id.find('"').expect("attribute end")]
        })
        .collect();
    assert_eq!(rows, ["dev-10", "dev-11"], "{dom}");
    assert!(
        by_id(&dom, "clients-summary")
            .starts_with("Clients 1\u{2013}2 matching \u{201c}dev-1\u{201d} of"),
        "{dom}"
    );

    // Screenshots at a desktop's and a phone's width, to look at (their paths are printed).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let url = format!("http://127.0.0.1:{http}/");
    for (size, name) in [
        ((1280, 800), "desktop-1280x800.png"),
        ((1280, 2000), "desktop-1280-whole.png"),
        ((390, 844), "phone-390x844.png"),
        ((390, 2400), "phone-390-longer.png"),
    ] {
        let path = dir.join(name);
        let bytes = common::http::screenshot(&url, size, 5000, &path).await;
        assert!(bytes > 10_000, "{}: {bytes} bytes", path.display());
        eprintln!("screenshot: {}", path.display());
    }
    fleet.server.shutdown().await;
}
