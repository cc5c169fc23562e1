use super::*;

#[test]
fn handles_are_readable_and_clones_share_them() {
    let m = Metrics::register();
    m.connections_total.increment(1);
    m.messages_received[2].increment(1);
    m.connections_current.decrement(1.0);
    let clone = m.clone();
    clone.bytes_sent.increment(10);
    assert_eq!(m.bytes_sent.get(), 10);
    assert_eq!(m.connections_total.get(), 1);
    assert_eq!(m.connections_current.get(), -1.0);
    // Another broker's registry is independent.
    assert_eq!(Metrics::register().bytes_sent.get(), 0);
}

#[test]
fn every_metric_is_exported_with_help_and_labels() {
    let m = Metrics::register();
    let tcp = m.listener("tcp");
    tcp.connected(2);
    tcp.connected(1);
    tcp.disconnected(1);
    m.connack_refused(0x86);

    m.connections_total.increment(3);
    m.connections_current.increment(2.0);
    m.messages_received[1].increment(5);
    m.messages_sent[2].increment(7);
    m.messages_dropped_queue_full[1].increment(1);
    m.messages_dropped_qos0_offline.increment(4);
    m.bytes_received.increment(1234);
    m.delivery_latency.record(0.000_2);

    let out = m.render();
    // The owners' groups (storage, guarantees) are registered and tested by their owners.
    assert_described(&out, names::CORE);
    let expected = [
        "postbox_connections_total 3",
        "postbox_connections_current 2",
        "postbox_messages_received_total{qos=\"1\"} 5",
        "postbox_messages_received_total{qos=\"0\"} 0",
        "postbox_messages_sent_total{qos=\"2\"} 7",
        "postbox_messages_dropped_total{qos=\"1\",reason=\"queue_full\"} 1",
        "postbox_messages_dropped_total{qos=\"0\",reason=\"qos0_offline\"} 4",
        "postbox_bytes_received_total 1234",
        "postbox_clients_connected{listener=\"tcp\",protocol=\"5.0\"} 1",
        "postbox_clients_connected{listener=\"tcp\",protocol=\"3.1.1\"} 0",
        "postbox_client_connects_total{listener=\"tcp\",protocol=\"3.1.1\"} 1",
        "postbox_clients_peak 2",
        "postbox_connack_refusals_total{reason=\"bad_credentials\"} 1",
        "postbox_delivery_latency_seconds_bucket{le=\"0.00025\"} 1",
        "postbox_delivery_latency_seconds_count 1",
        "postbox_build_info{version=\"0.1.0\"} 1",
    ];
    assert_has_lines(&out, expected);
    #[cfg(target_os = "linux")]
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
    ] {
        assert!(out.contains(&format!("\n{name} ")), "no {name}:\n{out}");
    }
    let snapshot = m.snapshot();
    assert_eq!(snapshot.clients_connected, 1);
    assert_eq!(snapshot.clients_total, 2);
    assert_eq!(snapshot.clients_peak, 2);
    assert_eq!(snapshot.messages_received, 5);
    assert_eq!(snapshot.messages_dropped, 5);
    assert_eq!(snapshot.bytes_received, 1234);
}

#[test]
fn connack_refusals_name_the_reason() {
    let m = Metrics::register();
    for code in [0x86, 0x87, 0x85, 0x89, 0x97, 0x84, 0x81, 0x8A, 0x8C, 0x80] {
        m.connack_refused(code);
    }
    for reason in ConnackRefusal::ALL {
        assert_eq!(m.connack_refusals(reason), 1, "{reason:?}");
    }
}

#[test]
fn names_follow_prometheus_conventions() {
    let counters = [
        names::CONNECTIONS_TOTAL,
        names::MESSAGES_RECEIVED_TOTAL,
        names::MESSAGES_SENT_TOTAL,
        names::BYTES_RECEIVED_TOTAL,
        names::BYTES_SENT_TOTAL,
        names::MESSAGES_DROPPED_TOTAL,
        names::MESSAGES_REFUSED_TOTAL,
        names::SESSION_STALLS_TOTAL,
        names::PUBLISHER_PAUSE_SECONDS_TOTAL,
        names::PUBLISH_RATE_PAUSES_TOTAL,
        names::MALFORMED_PACKETS_TOTAL,
        names::PROTOCOL_ERRORS_TOTAL,
        names::KEEPALIVE_TIMEOUTS_TOTAL,
        names::CREDENTIALS_EXPIRED_TOTAL,
        names::WILL_MESSAGES_PUBLISHED_TOTAL,
        names::AUTHZ_DENIED_TOTAL,
        names::SESSION_TAKEOVERS_TOTAL,
        names::SESSION_BINDING_TOTAL,
        names::CONNECTIONS_REFUSED_TOTAL,
        names::HTTP_CONNECTIONS_REFUSED_TOTAL,
        names::CONNECT_TIMEOUTS_TOTAL,
        names::PACKET_TIMEOUTS_TOTAL,
        names::ANONYMOUS_SHARE_CLOSES_TOTAL,
        names::STORE_COMMITS_TOTAL,
        names::STORE_FSYNCS_TOTAL,
        names::STORE_COMPACTIONS_TOTAL,
        names::STORE_REJECTED_TOTAL,
        names::STORE_RECOVERY_LOST_FRAMES_TOTAL,
        names::STORE_RECOVERY_LOST_RECORDS_TOTAL,
        names::CLIENT_CONNECTS_TOTAL,
        names::CONNACK_REFUSALS_TOTAL,
        names::SESSIONS_EXPIRED_TOTAL,
        names::DEAD_LETTERS_TOTAL,
        names::DEAD_LETTERS_DROPPED_TOTAL,
        names::PACKETS_TOO_LARGE_TOTAL,
        names::DEDUP_DUPLICATES_TOTAL,
        names::DEDUP_EVICTED_TOTAL,
        names::BRIDGE_RECONNECTS_TOTAL,
        names::BRIDGE_FORWARDED_TOTAL,
        names::BRIDGE_DROPPED_TOTAL,
    ];
    for name in names::ALL.into_iter().chain(names::BRIDGE) {
        assert!(name.starts_with("postbox_"), "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{name}"
        );
        assert_eq!(name.ends_with("_total"), counters.contains(&name), "{name}");
    }
}

/// Every metric is documented: the README and the pages of `docs/` together (issue 37 moved
/// the tables to `docs/metrics.md` and `docs/cluster.md`).
#[test]
fn the_docs_list_every_metric() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for entry in std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "md") {
            docs.push_str(&std::fs::read_to_string(entry.path()).expect("docs page"));
        }
    }
    for name in names::ALL
        .into_iter()
        .chain(names::BRIDGE)
        .chain(names::CLUSTER)
    {
        assert!(
            docs.contains(&format!("`{name}`")),
            "neither README.md nor docs/*.md lists `{name}`"
        );
    }
}

/// The per-bridge families have no series until a bridge takes its handles; from then on
/// every name of `names::BRIDGE` is exported for it, at 0, and the handles move them.
#[test]
fn bridge_series_appear_with_a_bridge_and_follow_its_handles() {
    let m = Metrics::register();
    let bare = m.render();
    for name in names::BRIDGE {
        assert!(!bare.contains(name), "{name} without a bridge:\n{bare}");
    }
    let b = m.bridge("cloud");
    b.up.set(1.0);
    b.reconnects.increment(2);
    b.forwarded(1).increment(3);
    b.dropped(0, "too_large")
        .expect("a known reason")
        .increment(4);
    assert!(b.dropped(0, "no-such-reason").is_none());
    m.on_scrape(move |_| b.queued_messages.set(5.0));
    let out = m.render();
    for name in names::BRIDGE {
        assert!(
            out.contains(&format!("# HELP {name} ")),
            "no HELP for {name}:\n{out}"
        );
    }
    let expected = [
        "postbox_bridge_up{bridge=\"cloud\"} 1",
        "postbox_bridge_reconnects_total{bridge=\"cloud\"} 2",
        "postbox_bridge_forwarded_total{bridge=\"cloud\",direction=\"in\"} 3",
        "postbox_bridge_forwarded_total{bridge=\"cloud\",direction=\"out\"} 0",
        "postbox_bridge_dropped_total{bridge=\"cloud\",direction=\"out\",reason=\"too_large\"} 4",
        "postbox_bridge_dropped_total{bridge=\"cloud\",direction=\"in\",reason=\"max_hops\"} 0",
        "postbox_bridge_queued_messages{bridge=\"cloud\"} 5",
        "postbox_bridge_queued_bytes{bridge=\"cloud\"} 0",
        "postbox_bridge_share_bytes{bridge=\"cloud\"} 0",
        "postbox_bridge_oldest_queued_seconds{bridge=\"cloud\"} 0",
    ];
    assert_has_lines(&out, expected);
}
