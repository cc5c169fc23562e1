//! Metrics: each broker counts in its own registry (read in-process here) and serves it on
//! `/metrics`; traffic through real sockets shows up in the series ops-names.md defines.

use std::net::TcpListener;

use postbox::metrics::names;

use crate::common::{self, process::http_get, process::sample};

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
