//! The deployment files refer to the broker by metric names and ports; keep them in step with
//! the code so a rename cannot silently break a dashboard or a probe.

use std::path::PathBuf;

use postbox::config::Config;
use postbox::test_support::metrics::names;

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `postbox_...` identifier in `text`.
fn metric_names(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("postbox_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

/// Metrics registered outside [`names::ALL`] (by the password store, or at the first failure of
/// a listener, whose name is a label), which the dashboard may still show. Spelled out rather
/// than imported: `deploy_checks.rs` checks them against a running broker's `/metrics`.
const OUTSIDE_ALL: [&str; 5] = [
    "postbox_tls_certificate_expiry_timestamp_seconds",
    "postbox_auth_failures_total",
    "postbox_auth_successes_total",
    "postbox_ws_upgrade_failures_total",
    "postbox_tls_handshake_failures_total",
];

/// A histogram's series (`_bucket`, `_sum`, `_count`) count as its name.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| {
            name.strip_suffix(suffix)
                .filter(|base| names::ALL.contains(base))
        })
        .unwrap_or(name)
}

/// The static half of the check; `deploy_checks.rs` checks the same names (and the alert
/// rules') against a running broker's `/metrics`.
#[test]
fn dashboard_uses_only_existing_metrics_and_all_of_them() {
    let dashboard = read("deploy/grafana/postbox-dashboard.json");
    let used: Vec<&str> = metric_names(&dashboard)
        .into_iter()
        .map(base_name)
        .collect();
    for name in &used {
        assert!(
            names::ALL.contains(name)
                || names::BRIDGE.contains(name)
                || names::CLUSTER.contains(name)
                || OUTSIDE_ALL.contains(name),
            "dashboard uses unknown metric {name}"
        );
    }
    // The per-bridge series exist only with a `[[bridge]]`, the cluster's only with
    // `[cluster]`; the dashboard shows them all.
    for name in names::ALL
        .into_iter()
        .chain(names::BRIDGE)
        .chain(names::CLUSTER)
    {
        assert!(used.contains(&name), "dashboard does not show {name}");
    }
}

#[test]
fn ports_match_the_default_config() {
    let c = Config::default();
    let mqtt = c.listeners[0].bind.port().to_string();
    let metrics = c.metrics.bind.port().to_string();

    let prometheus = read("deploy/prometheus/prometheus.yml");
    assert!(
        prometheus.contains(&format!("localhost:{metrics}")),
        "prometheus.yml target"
    );

    let containerfile = read("deploy/container/Containerfile");
    assert!(
        containerfile.contains(&format!("EXPOSE {mqtt} {metrics}")),
        "Containerfile EXPOSE"
    );

    let statefulset = read("deploy/kubernetes/statefulset.yaml");
    assert!(statefulset.contains(&format!("containerPort: {mqtt}")));
    assert!(statefulset.contains(&format!("containerPort: {metrics}")));
    assert!(statefulset.contains(&format!("prometheus.io/port: \"{metrics}\"")));
}

/// The container and the systemd unit keep durable state on their volume / state directory.
#[test]
fn deployments_put_durable_state_in_var_lib() {
    let containerfile = read("deploy/container/Containerfile");
    assert!(containerfile.contains("\"--data-dir\", \"/var/lib/postbox\""));
    assert!(containerfile.contains("VOLUME [\"/var/lib/postbox\"]"));
    let unit = read("deploy/systemd/postbox.service");
    assert!(unit.contains("--data-dir /var/lib/postbox"));
    assert!(unit.contains("StateDirectory=postbox"));
}
