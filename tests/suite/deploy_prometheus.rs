//! A real Prometheus (`apt-get install prometheus`), started on loopback with deploy/prometheus's
//! config and alert rules, scrapes the `postbox` binary: its HTTP API returns the series the
//! traffic made, with the right values; the rule groups are loaded and healthy; the "messages
//! dropped" alert goes pending on a real drop and "broker down" once the broker is killed; every
//! dashboard query is one Prometheus accepts.
//!
//! Prometheus scrapes and evaluates on its own schedule (every second here): there is no event
//! to await, so the test polls its API, 100 ms apart and bounded by `PROMETHEUS_WAIT`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use rumqttc::QoS;
use serde_json::Value;

use super::deploy_checks::{dashboard_queries, read, repo_path, yaml};
use crate::common::async_process::{free_port, BrokerProcess};
use crate::common::rumq::V4;

/// Bound on each wait for Prometheus (start, a scrape, an evaluation): generous for a loaded
/// 2-core machine.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);

/// `GET path` from 127.0.0.1:`port` over HTTP/1.0 (so Prometheus' Go server sends the body
/// plain, not chunked), as JSON; `None` while nothing listens or the answer is not JSON.
fn get_json(port: u16, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (_, body) = out.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A running Prometheus with the deploy files' config, pointed at one broker.
struct Prometheus {
    port: u16,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// deploy/prometheus/prometheus.yml with three changes only: the target is the broker's
    /// metrics port, scrapes and evaluations are every second, and the rule file is named by
    /// its absolute path (the config is written elsewhere).
    async fn start(metrics_port: u16) -> Prometheus {
        let deployed = read("deploy/prometheus/prometheus.yml");
        let mut config = deployed.clone();
        for (from, to) in [
            (
                "\"localhost:9883\"",
                format!("\"127.0.0.1:{metrics_port}\""),
            ),
            ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
            (
                "evaluation_interval: 15s",
                "evaluation_interval: 1s".to_owned(),
            ),
            (
                "- postbox-rules.yml",
                format!(
                    "- {}",
                    repo_path("deploy/prometheus/postbox-rules.yml").display()
                ),
            ),
        ] {
            assert!(config.contains(from), "prometheus.yml has {from}");
            config = config.replace(from, &to);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("prometheus.yml");
        std::fs::write(&path, config).expect("write config");
        let port = free_port();
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("prometheus is installed (apt-get install prometheus)");
        Prometheus {
            port,
            _child: child,
            _dir: dir,
        }
    }

    /// One API call; `None` until Prometheus answers.
    async fn api(&self, path: &str) -> Option<Value> {
        let port = self.port;
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || get_json(port, &path))
            .await
            .expect("join")
    }

    /// Polls the API at `path` until `ok` accepts the answer (bounded); returns it.
    async fn until(&self, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + PROMETHEUS_WAIT;
        let mut last = None;
        loop {
            if let Some(answer) = self.api(path).await {
                if ok(&answer) {
                    return answer;
                }
                last = Some(answer);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus never showed {what}; last answer of {path}: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls an instant query until it has a sample whose value `ok` accepts.
    async fn until_value(&self, query: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let path = format!("/api/v1/query?query={}", encode(query));
        let answer = self
            .until(&path, query, |a| sample(a).is_some_and(&ok))
            .await;
        sample(&answer).expect("sample")
    }

    /// The alerts of `name` (pending or firing) as `/api/v1/alerts` lists them.
    async fn until_alert(&self, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let answer = self
            .until("/api/v1/alerts", name, |a| {
                alerts(a)
                    .iter()
                    .any(|x| x["labels"]["alertname"] == name && ok(x))
            })
            .await;
        alerts(&answer)
            .into_iter()
            .find(|x| x["labels"]["alertname"] == name)
            .expect("alert")
    }
}

/// The value of the first sample of an instant-query answer.
fn sample(answer: &Value) -> Option<f64> {
    if answer["status"] != "success" {
        return None;
    }
    answer["data"]["result"][0]["value"][1]
        .as_str()?
        .parse()
        .ok()
}

fn alerts(answer: &Value) -> Vec<Value> {
    answer["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_with_the_deploy_rules_scrapes_the_broker() {
    let data = tempfile::tempdir().expect("tempdir");
    // A durable store (its series), and queues of 2 so an offline session drops.
    let broker = BrokerProcess::spawn_sections(
        &["name = \"plain\""],
        &format!(
            "[storage]\ndir = {:?}\n[mqtt]\nmax_queued_messages = 2\n",
            data.path()
        ),
    )
    .await;
    let prometheus = Prometheus::start(broker.metrics_port).await;
    let instance = format!("127.0.0.1:{}", broker.metrics_port);

    // The target is up, and its first scrape (all counters at 0) is in, before the traffic:
    // `rate()` in the drop alert needs a sample from before the drops.
    prometheus
        .until_value(r#"up{job="postbox"}"#, |v| v == 1.0)
        .await;
    prometheus
        .until_value(
            r#"postbox_messages_dropped_total{reason="queue_full",qos="1"}"#,
            |v| v == 0.0,
        )
        .await;

    // 5 QoS 1 messages to a connected subscriber; 5 to an offline persistent session with a
    // queue of 2: 2 queued, 3 dropped (queue_overflow = "drop-new").
    let mut offline = V4::connect(broker.addr, "offline", false).await;
    offline.subscribe("d/#", QoS::AtLeastOnce).await;
    offline.disconnect().await;
    let mut sub = V4::connect(broker.addr, "sub", true).await;
    let mut publ = V4::connect(broker.addr, "pub", true).await;
    sub.subscribe("m/#", QoS::AtLeastOnce).await;
    for i in 0..5 {
        publ.publish(&format!("m/{i}"), QoS::AtLeastOnce, false, b"x")
            .await;
        sub.next_publish().await;
        publ.publish(&format!("d/{i}"), QoS::AtLeastOnce, false, b"y")
            .await;
    }

    // The series, as Prometheus stored them, with the values the traffic made.
    for (query, expected) in [
        (r#"postbox_messages_received_total{qos="1"}"#, 10.0),
        (r#"postbox_messages_sent_total{qos="1"}"#, 5.0),
        (
            r#"postbox_messages_dropped_total{reason="queue_full",qos="1"}"#,
            3.0,
        ),
        ("postbox_connections_current", 2.0),
        ("postbox_sessions_current", 3.0),
        ("postbox_subscriptions_current", 2.0),
    ] {
        let got = prometheus.until_value(query, |v| v == expected).await;
        assert_eq!(got, expected, "{query}");
    }
    // The two queued messages were committed to the store (one commit at least).
    prometheus
        .until_value("postbox_store_commits_total", |v| v >= 1.0)
        .await;

    // The rule groups of postbox-rules.yml, loaded, evaluated, healthy.
    let rule_file = &yaml("deploy/prometheus/postbox-rules.yml")[0];
    let groups: BTreeSet<String> = rule_file["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .map(|g| g["name"].as_str().expect("name").to_owned())
        .collect();
    let rules = prometheus
        .until("/api/v1/rules", "healthy rule groups", |a| {
            let loaded = a["data"]["groups"].as_array().cloned().unwrap_or_default();
            loaded.len() == groups.len()
                && loaded.iter().all(|g| {
                    g["rules"]
                        .as_array()
                        .is_some_and(|r| r.iter().all(|r| r["health"] == "ok"))
                })
        })
        .await;
    let loaded: BTreeSet<String> = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(loaded, groups);

    // The drop alert matched the real series: pending (its `for` is 5m) for the right reason.
    let dropped = prometheus
        .until_alert("PostboxMessagesDropped", |_| true)
        .await;
    assert_eq!(dropped["labels"]["reason"], "queue_full", "{dropped}");
    assert_eq!(
        dropped["labels"]["instance"],
        instance.as_str(),
        "{dropped}"
    );

    // Every dashboard query is PromQL Prometheus accepts (Grafana's variables filled in).
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/postbox-dashboard.json")).expect("JSON");
    for query in dashboard_queries(&dashboard) {
        let query = query
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*");
        let query = if query.starts_with("label_values(") {
            // A Grafana function, not PromQL: its series selector is what Prometheus sees.
            let inner = query.trim_start_matches("label_values(");
            inner.split(',').next().expect("selector").to_owned()
        } else {
            query
        };
        let path = format!("/api/v1/query?query={}", encode(&query));
        let answer = prometheus.until(&path, &query, |_| true).await;
        assert_eq!(answer["status"], "success", "{query}: {answer}");
    }

    // The broker goes away: "broker down" matches (pending for its 1m) on that target.
    broker.kill().await;
    let down = prometheus
        .until_alert("PostboxDown", |a| {
            a["labels"]["instance"] == instance.as_str()
        })
        .await;
    assert_eq!(down["labels"]["severity"], "critical", "{down}");
    drop(publ);
    drop(sub);
}
