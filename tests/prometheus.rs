//! A real Prometheus (`apt-get install prometheus`) scrapes the broker's `/metrics` endpoint
//! and sees the traffic: the exporter speaks a format Prometheus actually accepts.
//! One test per file: the metrics recorder is process-global.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::rumq::V4;
use rumqttc::QoS;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// `GET path` on 127.0.0.1:`port`; the body, or `None` if the server is not up yet.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_broker_metrics() {
    let metrics_port = free_port();
    let mut config = common::test_config();
    config.metrics.enabled = true;
    config.metrics.bind = format!("127.0.0.1:{metrics_port}").parse().expect("addr");
    let server = common::start_with(config).await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("m/#", QoS::AtLeastOnce).await;
    for i in 0..5 {
        publ.publish(&format!("m/{i}"), QoS::AtLeastOnce, false, b"x")
            .await;
        sub.next_publish().await;
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let prom_port = free_port();
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(
        &config_path,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: postbox\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .expect("config");
    let mut prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus is installed (apt-get install prometheus)");

    // Poll Prometheus' query API until the scraped series shows the 5 QoS 1 messages: the
    // scrape happens on Prometheus' own schedule, so there is no event to await. Bounded.
    let query = "/api/v1/query?query=postbox_messages_received_total%7Bqos%3D%221%22%7D";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        if let Some(body) = tokio::task::spawn_blocking(move || http_get(prom_port, query))
            .await
            .expect("join")
        {
            if body.contains("\"status\":\"success\"") && body.contains("\"5\"]") {
                break;
            }
            last = Some(body);
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the metric; last answer: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let up = tokio::task::spawn_blocking(move || http_get(prom_port, "/api/v1/query?query=up"))
        .await
        .expect("join")
        .expect("answer");
    assert!(up.contains("\"1\"]"), "the scrape target is up: {up}");
    prometheus.start_kill().ok();
}
