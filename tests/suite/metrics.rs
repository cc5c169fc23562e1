//! Metrics: each broker counts in its own registry (read in-process here) and serves it on
//! `/metrics`; traffic through real sockets shows up in the series ops-names.md defines.

use std::net::TcpListener;

use postbox::test_support::metrics::names;

use crate::common::{self, http::http_get, http::sample};

/// The endpoint serves this broker's registry (every name of `names::ALL`, the traffic
/// counted), `/health` answers, and a taken port is a start error naming the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_serves_the_brokers_registry() {
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_addr = busy.local_addr().expect("addr");
    let mut config = common::test_config();
    config.metrics.enabled = true;
    config.metrics.bind = busy_addr;
    let error = postbox::server::start(config)
        .await
        .expect_err("metrics port in use");
    assert!(
        error.to_string().contains(&busy_addr.to_string()),
        "{error}"
    );
    drop(busy);

    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut config = common::test_config();
    config.metrics.enabled = true;
    config.metrics.bind = format!("127.0.0.1:{port}").parse().expect("addr");
    let server = common::start_with(config).await;
    server.broker.metrics.connections_total.increment(2);
    let scrape = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .expect("scrape");
    assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
    for name in names::ALL {
        assert!(
            scrape.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{scrape}"
        );
    }
    assert_eq!(sample(&scrape, "postbox_connections_total"), Some(2.0));
    let health = tokio::task::spawn_blocking(move || http_get(port, "/health"))
        .await
        .expect("health");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("OK"),
        "{health}"
    );
    server.shutdown().await;
}

/// Polls `ok` on the broker's metrics (a disconnect is counted when the broker has handled
/// it, after the client's socket closed), bounded by `common::WAIT`.
async fn eventually(
    server: &postbox::server::RunningServer,
    what: &str,
    ok: impl Fn(&str) -> bool,
) {
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        let text = server.broker.metrics.render();
        if ok(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never held:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Traffic through two listeners with a 3.1.1 and a v5 client, read back from the broker's
/// own registry: clients by listener and protocol and their peak, a refused CONNACK by
/// reason (MQTT-3.2.2-5: a 3.1.1 server answers return code 2 to an empty client id with
/// `CleanSession` 0), `no_subscribers` drops of QoS 1 only, the delivery latency histogram's
/// count equal to the deliveries written, the backlog of an offline persistent session
/// (count, largest, age > 0), process metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_shows_in_the_brokers_registry() {
    use postbox::codec::{Packet, ProtocolVersion, QoS};
    use postbox::test_support::metrics::ConnackRefusal;

    use crate::common::{v5, RawClient};

    let text = "[[listener]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n\n\
                [[listener]]\nname = \"b\"\nbind = \"127.0.0.1:0\"\n\
                [metrics]\nenabled = false\n[storage]\npersistence = false\n";
    let config = postbox::config::Config::from_toml_str(text, "metrics.toml").expect("config");
    let server = common::start_with(config).await;
    let (a, b) = (server.listeners[0].addr, server.listeners[1].addr);
    let m = &server.broker.metrics;

    let mut publisher = RawClient::connect(a, ProtocolVersion::V3_1_1, "pub", true).await;
    let mut subscriber = v5::connect_id(b, "sub").await;
    v5::subscribe(&mut subscriber, "t/#", QoS::AtLeastOnce).await;
    // An offline persistent session with a queue: subscribes, goes away.
    let mut connect = v5::connect_packet("offline");
    connect.clean_start = false;
    connect.properties.session_expiry_interval = Some(3600);
    let (mut offline, _) = v5::connect(a, connect).await;
    v5::subscribe(&mut offline, "q/#", QoS::AtLeastOnce).await;
    v5::disconnect(offline).await;
    eventually(&server, "the offline client counted out", |t| {
        sample(
            t,
            "postbox_clients_connected{listener=\"a\",protocol=\"5.0\"}",
        ) == Some(0.0)
    })
    .await;

    // A refusing CONNACK: 3.1.1, empty client id, CleanSession 0 -> return code 2.
    let mut refused = RawClient::open(a, ProtocolVersion::V3_1_1).await;
    let mut bad = v5::connect_packet("");
    bad.protocol = ProtocolVersion::V3_1_1;
    bad.clean_start = false;
    refused.send(&Packet::Connect(Box::new(bad))).await;
    match refused.recv().await {
        Some(Packet::ConnAck(ack)) => assert_ne!(ack.reason_code.0, 0, "{ack:?}"),
        other => panic!("expected a refusing CONNACK, got {other:?}"),
    }

    const DELIVERED: u16 = 5;
    for id in 1..=DELIVERED {
        v5::publish(
            &mut publisher,
            v5::publish_packet("t/x", QoS::AtLeastOnce, b"m", id),
        )
        .await;
    }
    for _ in 0..DELIVERED {
        let p = v5::expect_publish(&mut subscriber).await;
        v5::ack(&mut subscriber, &p).await;
    }
    // Matches nobody: QoS 1 counted, QoS 0 not.
    v5::publish(
        &mut publisher,
        v5::publish_packet("none/x", QoS::AtLeastOnce, b"n", 20),
    )
    .await;
    v5::publish(
        &mut publisher,
        v5::publish_packet("none/x", QoS::AtMostOnce, b"n", 0),
    )
    .await;
    // Queued for the offline session.
    for id in 30..33 {
        v5::publish(
            &mut publisher,
            v5::publish_packet("q/1", QoS::AtLeastOnce, b"q", id),
        )
        .await;
    }

    assert_eq!(m.delivery_latency.count(), u64::from(DELIVERED));
    assert!(m.delivery_latency.sum() > 0.0);
    assert_eq!(m.messages_dropped_no_subscribers[1].get(), 1);
    assert_eq!(m.messages_dropped_no_subscribers[0].get(), 0);
    assert_eq!(m.connack_refusals(ConnackRefusal::ClientIdInvalid), 1);

    let out = m.render();
    let value =
        |series: &str| sample(&out, series).unwrap_or_else(|| panic!("no {series}:\n{out}"));
    assert_eq!(
        value("postbox_clients_connected{listener=\"a\",protocol=\"3.1.1\"}"),
        1.0
    );
    assert_eq!(
        value("postbox_clients_connected{listener=\"b\",protocol=\"5.0\"}"),
        1.0
    );
    assert_eq!(
        value("postbox_clients_connected{listener=\"a\",protocol=\"5.0\"}"),
        0.0
    );
    assert_eq!(
        value("postbox_client_connects_total{listener=\"a\",protocol=\"5.0\"}"),
        1.0
    );
    assert_eq!(
        value("postbox_client_connects_total{listener=\"b\",protocol=\"3.1.1\"}"),
        0.0
    );
    assert_eq!(value("postbox_clients_peak"), 3.0);
    assert_eq!(
        value("postbox_connack_refusals_total{reason=\"client_id_invalid\"}"),
        1.0
    );
    assert_eq!(
        value("postbox_messages_dropped_total{qos=\"1\",reason=\"no_subscribers\"}"),
        1.0
    );
    assert_eq!(
        value("postbox_delivery_latency_seconds_count"),
        f64::from(DELIVERED)
    );
    assert_eq!(value("postbox_messages_queued"), 3.0);
    assert_eq!(value("postbox_sessions_backlogged"), 1.0);
    assert_eq!(value("postbox_session_backlog_max"), 3.0);
    assert!(value("postbox_session_backlog_oldest_seconds") > 0.0);
    #[cfg(target_os = "linux")]
    {
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_open_fds") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }
    let snapshot = m.snapshot();
    assert_eq!(snapshot.clients_connected, 2);
    assert_eq!(snapshot.clients_peak, 3);
    assert_eq!(snapshot.messages_queued, 3);
    server.shutdown().await;
}
