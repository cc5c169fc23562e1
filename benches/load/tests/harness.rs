//! The load generator works: a tiny fan-in and point-to-point run at QoS 1 against the real
//! broker in-process, with every message accounted for. This checks the measuring tool, not
//! the broker's speed (no timing assertions).

use std::time::Duration;

use loadgen::scenarios::{self, BrokerSettings, Params, Scenario};
use postbox::codec::QoS;
use postbox::config::Config;
use postbox::server::{self, RunningServer};

/// The broker with the test suite's config (tests/common/mod.rs at the root): loopback, port 0,
/// no metrics exporter (it is process-global), in memory.
async fn start(tune: impl FnOnce(&mut Config)) -> RunningServer {
    let mut config = Config::default();
    config.listeners[0].bind = "127.0.0.1:0".parse().expect("literal address");
    config.metrics.enabled = false;
    config.storage.persistence = false;
    tune(&mut config);
    server::start(config).await.expect("broker starts")
}

async fn run_small(
    scenario: Scenario,
    configure: impl FnOnce(&mut Params),
) -> loadgen::report::Report {
    run_small_on(scenario, |_| {}, configure).await
}

async fn run_small_on(
    scenario: Scenario,
    tune: impl FnOnce(&mut Config),
    configure: impl FnOnce(&mut Params),
) -> loadgen::report::Report {
    let server = start(tune).await;
    let mut params = Params::defaults(scenario, server.mqtt_addr);
    params.broker = "postbox-in-process".into();
    params.qos = QoS::AtLeastOnce;
    params.timeout = Duration::from_secs(30);
    params.broker_pid = Some(std::process::id());
    configure(&mut params);
    let report = scenarios::run(scenario, &params)
        .await
        .expect("scenario runs");
    server.shutdown().await;
    report
}

/// A run of `scenario` with 4 clients (the count `clients` names: publishers, pairs) of 250
/// QoS 1 messages each, asserted to lose none of the 1,000 ([`assert_nothing_lost`]).
async fn four_clients_lose_none_of_1000(
    scenario: Scenario,
    clients: impl FnOnce(&mut Params) -> &mut usize,
) -> loadgen::report::Report {
    let report = run_small(scenario, |p| {
        *clients(p) = 4;
        p.messages = 250;
    })
    .await;
    assert_nothing_lost(&report, 1000);
    report
}

/// Asserts a completed message-flow run in which all `expected` messages arrived: counted as
/// expected, delivered, none lost.
fn assert_nothing_lost(report: &loadgen::report::Report, expected: u64) {
    assert_eq!(report.expected, expected);
    assert_eq!(report.delivered, expected, "{report:?}");
    assert_eq!(report.lost, 0);
    assert!(report.completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_in_qos1_loses_nothing() {
    let report = four_clients_lose_none_of_1000(Scenario::FanIn, |p| &mut p.publishers).await;
    assert_eq!(report.sent, 1000);
    assert_eq!(report.duplicates, 0);
    assert!(report.p50_us.is_some() && report.p999_us.is_some());
    assert!(report.broker_peak_rss_kib.is_some_and(|kib| kib > 0));
    assert!(report.broker_cpu_pct.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_to_point_qos1_loses_nothing() {
    let report = four_clients_lose_none_of_1000(Scenario::P2p, |p| &mut p.pairs).await;
    assert_eq!(report.reordered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_line_round_trips_into_the_summary() {
    let report = run_small(Scenario::P2p, |p| {
        p.pairs = 2;
        p.messages = 100;
        p.case = Some("p2p-small".into());
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("results.jsonl");
    report.append_json(&path).expect("append");
    report.append_json(&path).expect("append again");
    let rows = loadgen::summary::load(&path).expect("load");
    assert_eq!(rows.len(), 2);
    let table = loadgen::summary::render(&rows);
    assert!(table.contains("p2p-small"), "{table}");
    assert!(table.contains("delivered msg/s"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_all_served() {
    // The timed part is a raw epoll loop (src/burst.rs): every client must get its
    // CONNACK and later answer a PINGREQ.
    let report = run_small(Scenario::Connections, |p| {
        p.connections = 200;
    })
    .await;
    assert_eq!(report.expected, 200);
    assert_eq!(report.delivered, 200, "{report:?}");
    assert!(report.completed);
    assert!(report.connect_per_s.is_some_and(|r| r > 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_also_subscribe_are_all_served() {
    // The other path: one task per client, each also subscribing.
    let report = run_small(Scenario::Connections, |p| {
        p.connections = 100;
        p.subscribe_each = true;
    })
    .await;
    assert_eq!(report.delivered, 100, "{report:?}");
    assert!(report.completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_on_a_broker_that_drops_is_measured_not_failed() {
    // compare.sh's defaults set (benches/README.md, "Defaults set"): a broker whose queues
    // overflow loses messages, and the generator must count them (lost, lost %), label the
    // run, and not fail it; the same report under tuned settings fails. Postbox pauses
    // publishers instead of dropping (broker::flow), except QoS 0 with
    // `mqtt.backpressure_qos0 = false`: with a queue of 1 message, 8,000 unthrottled QoS 0
    // messages against one subscriber make the overflow certain.
    let report = run_small_on(
        Scenario::FanIn,
        |c| {
            c.mqtt.max_queued_messages = 1;
            c.mqtt.max_inflight_messages = 1;
            c.mqtt.backpressure_qos0 = false;
        },
        |p| {
            p.publishers = 4;
            p.messages = 2000;
            p.idle = Duration::from_millis(500);
            p.settings = BrokerSettings::Defaults;
            p.qos = QoS::AtMostOnce;
            p.case = Some("defaults-fan-in-q0".into());
            // The summary's defaults section is about the reference broker.
            p.broker = loadgen::summary::REFERENCE.into();
        },
    )
    .await;
    assert_eq!(report.expected, 8000);
    assert_eq!(
        report.sent, 8000,
        "every PUBLISH is acknowledged: {report:?}"
    );
    assert!(
        report.lost > 0,
        "the broker's queue of 1 must overflow: {report:?}"
    );
    assert_eq!(report.lost + report.delivered, report.expected);
    let pct = report.lost_pct.expect("message-flow runs carry lost %");
    assert!(
        (pct - report.lost as f64 * 100.0 / 8000.0).abs() < 1e-9,
        "{report:?}"
    );
    assert_eq!(report.settings, "defaults");
    assert!(report.broker_peak_rss_kib.is_some_and(|kib| kib > 0));
    assert!(!scenarios::run_failed(
        Scenario::FanIn,
        BrokerSettings::Defaults,
        &report
    ));
    // Under tuned settings the same loss fails a run once it carries a promise (QoS 1).
    let mut promised = report.clone();
    promised.qos = 1;
    assert!(scenarios::run_failed(
        Scenario::FanIn,
        BrokerSettings::Tuned,
        &promised
    ));

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("results.jsonl");
    report.append_json(&path).expect("append");
    let table = loadgen::summary::render(&loadgen::summary::load(&path).expect("load"));
    assert!(table.contains("lost % (worst run)"), "{table}");
    assert!(
        table.contains("Postbox on its defaults vs tuned"),
        "{table}"
    );
    assert!(table.contains("missed: loss"), "{table}");
}

/// The repository's development certificates (certs/, as compare.sh's `tls-*` cases use).
fn certs() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../certs")
}

/// The broker's only listener speaks TLS with certs/server.pem (issue 13's `tls-*` cases).
fn tls_listener(config: &mut Config) {
    use postbox::config::{ListenerKind, TlsConfig};
    let listener = &mut config.listeners[0];
    listener.kind = ListenerKind::Tls;
    listener.tls = Some(TlsConfig {
        cert: Some(certs().join("server.pem")),
        key: Some(certs().join("server.key")),
        ..TlsConfig::default()
    });
}

/// [`run_small_on`] over TLS: the broker's listener is TLS ([`tls_listener`]) and every
/// client speaks TLS ([`tls_client`]).
async fn run_over_tls(
    scenario: Scenario,
    configure: impl FnOnce(&mut Params),
) -> loadgen::report::Report {
    run_small_on(scenario, tls_listener, |p| {
        tls_client(p);
        configure(p);
    })
    .await
}

/// Every client of the run speaks TLS, trusting certs/ca.pem.
fn tls_client(p: &mut Params) {
    let client = loadgen::transport::TlsClient::new(&certs().join("ca.pem"), None, "localhost")
        .expect("TLS client config");
    p.tls = Some(std::sync::Arc::new(client));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_fan_in_qos1_loses_nothing() {
    // The TLS publisher has its own loop (no readiness API under rustls): every message must
    // still be sent, acknowledged and delivered.
    let report = run_over_tls(Scenario::FanIn, |p| {
        p.publishers = 4;
        p.messages = 300;
        p.inflight = 16;
    })
    .await;
    assert_eq!(report.expected, 1_200);
    assert_eq!(report.delivered, 1_200, "{report:?}");
    assert_eq!(report.sent, 1_200, "{report:?}");
    assert!(report.completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_handshakes_and_idle_clients_are_all_served() {
    // `handshakes`: every client connects over TLS, gets its CONNACK and sees the broker close.
    let report = run_over_tls(Scenario::Handshakes, |p| {
        p.connections = 60;
        p.connect_concurrency = 8;
    })
    .await;
    assert_eq!(report.delivered, 60, "{report:?}");
    assert!(report.completed);
    assert!(report.connect_per_s.is_some_and(|r| r > 0.0));
    assert!(report.broker_cpu_us_per_msg.is_some());
    // `connections` over TLS (the task path, not the plain-TCP burst): all answer PINGREQ.
    let report = run_over_tls(Scenario::Connections, |p| {
        p.connections = 40;
    })
    .await;
    assert_eq!(report.delivered, 40, "{report:?}");
    assert!(report.completed);
}
