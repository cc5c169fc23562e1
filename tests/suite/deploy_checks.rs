//! deploy/ checked by the tools that consume it, and against a running broker: `promtool`
//! accepts the Prometheus config, the alert rules and their unit tests; `systemd-analyze`
//! verifies the unit (where it exists: skipped with a reason elsewhere); the Kubernetes
//! manifests parse and hold what running one broker on a volume needs; the Containerfile is read
//! (no container engine here); and every metric the dashboard and the rules name is in a real
//! broker's `/metrics`, which `promtool check metrics` accepts. The real Prometheus loading
//! these files is `deploy_prometheus.rs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rumqttc::QoS;
use tokio::io::AsyncWriteExt;
use yaml_rust2::{Yaml, YamlLoader};

use postbox::config::{ClusterNode, Config, Overrides};

use crate::common::async_process::BrokerProcess;
use crate::common::rumq::V4;

/// How long the broker's shutdown may take after SIGTERM (`server::SHUTDOWN_BOUND`, after
/// which the binary exits by itself). The unit's `TimeoutStopSec` and the pod's
/// `terminationGracePeriodSeconds` must exceed it, or systemd / the kubelet kills the broker
/// before its final commit.
#[allow(clippy::cast_possible_wrap)]
const SHUTDOWN_BOUND_SECS: i64 = postbox::server::SHUTDOWN_BOUND.as_secs() as i64;

/// The alerts issue 14 asks for by name.
const REQUIRED_ALERTS: [&str; 6] = [
    "PostboxDown",
    "PostboxMessagesDropped",
    "PostboxBacklogGrowing",
    "PostboxStoreNearBudget",
    "PostboxStoreOutOfSpace",
    "PostboxCertificateExpiring",
];

pub(crate) fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub(crate) fn read(rel: &str) -> String {
    let path = repo_path(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of a file.
pub(crate) fn yaml(rel: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `promtool` (Debian's `prometheus` package, which CI installs: a missing one fails).
fn promtool(args: &[&str]) -> Output {
    Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool is installed (apt-get install prometheus)")
}

/// `promtool COMMAND` (e.g. "check rules") on the repository file `rel`, which must succeed:
/// what it said (stdout and stderr), for the checks that look further into it.
fn promtool_on(command: &str, rel: &str) -> String {
    let path = repo_path(rel);
    let mut args: Vec<&str> = command.split(' ').collect();
    args.push(path.to_str().expect("utf8"));
    let out = promtool(&args);
    let said = text(&out);
    assert!(out.status.success(), "promtool {command}: {said}");
    said
}

/// The alerting rules of `deploy/prometheus/postbox-rules.yml`, every group's.
pub(crate) fn alert_rules() -> Vec<Yaml> {
    let docs = yaml("deploy/prometheus/postbox-rules.yml");
    let groups = docs[0]["groups"].as_vec().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules").iter().cloned())
        .collect()
}

/// Every metric name in a Prometheus query: identifiers starting `postbox_` or `process_`
/// (the process collector's), not inside a longer identifier, not a label value.
pub(crate) fn metric_names(expr: &str, out: &mut BTreeSet<String>) {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for prefix in ["postbox_", "process_"] {
        let mut from = 0;
        while let Some(i) = expr[from..].find(prefix) {
            let start = from + i;
            let tail = &expr[start..];
            let end = tail.find(|c: char| !ident(c)).unwrap_or(tail.len());
            let before = expr[..start].chars().next_back();
            if !before.is_some_and(|c| ident(c) || c == '"') {
                out.insert(tail[..end].to_owned());
            }
            from = start + end;
        }
    }
}

/// The metrics the alert rules and the Grafana dashboard's queries name.
pub(crate) fn deploy_metric_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for rule in alert_rules() {
        metric_names(rule["expr"].as_str().expect("expr"), &mut names);
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/postbox-dashboard.json")).expect("JSON");
    for expr in dashboard_queries(&dashboard) {
        metric_names(&expr, &mut names);
    }
    names
}

/// Every Prometheus query of the dashboard: the panels' targets and the template variables'.
pub(crate) fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(q) = var["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

#[test]
fn promtool_accepts_the_config_and_its_rule_file() {
    let said = promtool_on("check config", "deploy/prometheus/prometheus.yml");
    // The config loads the rules (`rule_files`), and check config checked them too.
    assert!(said.contains("SUCCESS: 1 rule files found"), "{said}");
    assert!(said.contains("postbox-rules.yml"), "{said}");

    promtool_on("check rules", "deploy/prometheus/postbox-rules.yml");
}

/// Each alert fires on a series that should fire it and not on a normal one
/// (deploy/prometheus/postbox-rules.test.yml, promtool's rule unit tests).
#[test]
fn promtool_rule_unit_tests_pass() {
    let said = promtool_on("test rules", "deploy/prometheus/postbox-rules.test.yml");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// What an operator's alert routing needs of every rule, and every alert has a unit test that
/// expects it to fire.
#[test]
fn every_alert_has_a_duration_severity_annotations_and_a_unit_test() {
    let tests = yaml("deploy/prometheus/postbox-rules.test.yml");
    let mut tested = BTreeSet::new();
    for case in tests[0]["tests"].as_vec().expect("tests") {
        for check in case["alert_rule_test"].as_vec().into_iter().flatten() {
            if check["exp_alerts"].as_vec().is_some_and(|a| !a.is_empty()) {
                tested.insert(check["alertname"].as_str().expect("alertname").to_owned());
            }
        }
    }
    let mut alerts = BTreeSet::new();
    for rule in alert_rules() {
        let name = rule["alert"]
            .as_str()
            .expect("only alerting rules")
            .to_owned();
        assert!(rule["for"].as_str().is_some(), "{name}: no `for`");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name}: no {key}"
            );
        }
        assert!(tested.contains(&name), "{name}: no unit test fires it");
        assert!(alerts.insert(name.clone()), "{name} twice");
    }
    for name in REQUIRED_ALERTS {
        assert!(alerts.contains(name), "missing alert {name}");
    }
    // QoS 0 for an offline session is dropped by design: not an alert.
    let dropped = alert_rules()
        .into_iter()
        .find(|r| r["alert"].as_str() == Some("PostboxMessagesDropped"))
        .expect("PostboxMessagesDropped");
    assert!(dropped["expr"]
        .as_str()
        .expect("expr")
        .contains(r#"reason!="qos0_offline""#));
}

/// The unit as installed, but with `ExecStart` pointing at the binary under test:
/// `systemd-analyze verify` checks that the executable exists.
fn unit_for_this_build(dir: &Path) -> PathBuf {
    let unit = read("deploy/systemd/postbox.service");
    assert!(unit.contains("ExecStart=/usr/local/bin/postbox "));
    let unit = unit.replace(
        "ExecStart=/usr/local/bin/postbox ",
        &format!("ExecStart={} ", crate::common::process::BIN),
    );
    let path = dir.join("postbox.service");
    std::fs::write(&path, unit).expect("write unit");
    path
}

#[test]
fn systemd_analyze_verifies_the_unit_and_rates_its_sandbox() {
    let unit = read("deploy/systemd/postbox.service");
    assert!(
        unit.lines()
            .any(|l| l.trim() == "ExecReload=/bin/kill -HUP $MAINPID"),
        "SIGHUP reload through systemctl reload"
    );
    let stop = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.strip_suffix('s'))
        .and_then(|v| v.parse::<i64>().ok())
        .expect("TimeoutStopSec=<n>s");
    assert!(
        stop > SHUTDOWN_BOUND_SECS,
        "TimeoutStopSec={stop}s must exceed the broker's shutdown bound ({SHUTDOWN_BOUND_SECS} s)"
    );

    if Command::new("systemd-analyze")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed (Debian package `systemd`)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = unit_for_this_build(dir.path());
    let path_text = path.to_str().expect("utf8");
    let out = Command::new("systemd-analyze")
        .args(["verify", path_text])
        .output()
        .expect("systemd-analyze runs");
    let said = text(&out);
    // verify exits 0 on unknown keys and bad values too: it only warns, naming the file.
    let warnings: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("postbox.service"))
        .collect();
    assert!(
        out.status.success() && warnings.is_empty(),
        "systemd-analyze verify: {said}"
    );

    // The sandbox's exposure (0 = fully sandboxed, 10 = none): at most 2.0 ("OK").
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=20", path_text])
        .output()
        .expect("systemd-analyze runs");
    assert!(
        out.status.success(),
        "systemd-analyze security: {}",
        text(&out)
    );
}

/// The Kubernetes objects of the kustomization, by kind.
fn kubernetes_objects() -> Vec<Yaml> {
    kustomization_objects("deploy/kubernetes")
}

/// The objects of the kustomization in `dir` (its `resources` files, every document).
fn kustomization_objects(dir: &str) -> Vec<Yaml> {
    let kustomization = yaml(&format!("{dir}/kustomization.yaml"));
    let mut objects = Vec::new();
    for file in kustomization[0]["resources"].as_vec().expect("resources") {
        let file = file.as_str().expect("file name");
        objects.extend(
            yaml(&format!("{dir}/{file}"))
                .into_iter()
                .filter(|d| !d.is_null()),
        );
    }
    objects
}

/// The name of the one Secret a kustomization generates (`secretGenerator`), with its one
/// key `password` (the Secret is made from a file the user creates, so it is not among the
/// resources).
fn kustomization_secret(dir: &str) -> String {
    let kustomization = yaml(&format!("{dir}/kustomization.yaml"));
    let generators = kustomization[0]["secretGenerator"]
        .as_vec()
        .expect("secretGenerator");
    assert_eq!(generators.len(), 1, "one generated Secret");
    let files = generators[0]["files"].as_vec().expect("files");
    assert!(
        files
            .iter()
            .all(|f| f.as_str().is_some_and(|f| f.starts_with("password="))),
        "{files:?}"
    );
    generators[0]["name"].as_str().expect("name").to_owned()
}

/// True when `container` has `var` from the key `password` of the Secret `secret`.
fn env_from_secret(container: &Yaml, var: &str, secret: &str) -> bool {
    container["env"].as_vec().is_some_and(|env| {
        env.iter().any(|e| {
            let key = &e["valueFrom"]["secretKeyRef"];
            e["name"].as_str() == Some(var)
                && key["name"].as_str() == Some(secret)
                && key["key"].as_str() == Some("password")
        })
    })
}

/// True when `container` of `set` mounts the Secret `secret` (read-only) at `path`.
fn secret_mounted_at(set: &Yaml, container: &Yaml, secret: &str, path: &str) -> bool {
    let volumes = set["spec"]["template"]["spec"]["volumes"]
        .as_vec()
        .expect("volumes");
    let Some(volume) = volumes
        .iter()
        .find(|v| v["secret"]["secretName"].as_str() == Some(secret))
        .and_then(|v| v["name"].as_str())
    else {
        return false;
    };
    container["volumeMounts"].as_vec().is_some_and(|mounts| {
        mounts.iter().any(|m| {
            m["name"].as_str() == Some(volume)
                && m["mountPath"].as_str() == Some(path)
                && m["readOnly"].as_bool() == Some(true)
        })
    })
}

fn of_kind<'a>(objects: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some(kind))
        .collect()
}

/// The container port a probe or Service names (by name or number).
fn container_port(container: &Yaml, port: &Yaml) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let name = port.as_str().expect("port name or number");
    container["ports"]
        .as_vec()
        .expect("ports")
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

#[test]
fn kubernetes_statefulset_services_and_config_fit_together() {
    let objects = kubernetes_objects();
    let sets = of_kind(&objects, "StatefulSet");
    assert_eq!(sets.len(), 1, "one StatefulSet");
    let set = sets[0];
    let spec = &set["spec"];
    assert_eq!(
        spec["replicas"].as_i64(),
        Some(1),
        "one broker per data dir"
    );
    let pod = &spec["template"]["spec"];
    let containers = pod["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    // The broker's config comes from the ConfigMap, and its store lives on the claimed volume.
    let maps = of_kind(&objects, "ConfigMap");
    assert_eq!(maps.len(), 1);
    let toml_text = maps[0]["data"]["postbox.toml"]
        .as_str()
        .expect("postbox.toml");
    let config: toml::Table = toml::from_str(toml_text).expect("the embedded config is TOML");
    let data_dir = config["storage"]["dir"].as_str().expect("storage.dir");
    let claims = spec["volumeClaimTemplates"]
        .as_vec()
        .expect("volumeClaimTemplates");
    assert_eq!(claims.len(), 1);
    let claim = claims[0]["metadata"]["name"].as_str().expect("claim name");
    let mounts = c["volumeMounts"].as_vec().expect("volumeMounts");
    let data_mount = mounts
        .iter()
        .find(|m| m["name"].as_str() == Some(claim))
        .expect("the claim is mounted");
    assert_eq!(data_mount["mountPath"].as_str(), Some(data_dir));
    assert_ne!(data_mount["readOnly"].as_bool(), Some(true));
    // Every other mount is read-only: the data volume is the only writable path.
    for m in mounts.iter().filter(|m| m["name"].as_str() != Some(claim)) {
        assert_eq!(m["readOnly"].as_bool(), Some(true), "{m:?} read-only");
    }
    let config_volume = pod["volumes"]
        .as_vec()
        .expect("volumes")
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("a ConfigMap volume");
    assert_eq!(maps[0]["metadata"]["name"].as_str(), Some(config_volume));

    // Non-root, read-only root filesystem, no capabilities, no privilege escalation.
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert!(pod["securityContext"]["runAsUser"]
        .as_i64()
        .is_some_and(|u| u > 0));
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    let drop: Vec<&str> = sc["capabilities"]["drop"]
        .as_vec()
        .expect("capabilities.drop")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(drop, ["ALL"]);
    assert!(!c["resources"]["requests"]["memory"].is_badvalue());
    assert!(!c["resources"]["limits"]["memory"].is_badvalue());

    // Probes on the metrics listener: liveness /healthz, readiness /readyz.
    let metrics_port: i64 = config["metrics"]["bind"]
        .as_str()
        .and_then(|b| b.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("metrics.bind port");
    let mqtt_port: i64 = config["listener"]["bind"]
        .as_str()
        .and_then(|b| b.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("listener.bind port");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(container_port(c, &get["port"]), metrics_port, "{probe}");
    }

    // Time for the graceful shutdown before the kubelet's SIGKILL.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds");
    assert!(grace > SHUTDOWN_BOUND_SECS, "grace {grace} s");

    // A Service with both ports, and the headless governing Service of the StatefulSet.
    let pod_labels = spec["template"]["metadata"]["labels"]
        .as_hash()
        .expect("pod labels");
    let services = of_kind(&objects, "Service");
    for service in &services {
        for (k, v) in service["spec"]["selector"].as_hash().expect("selector") {
            assert_eq!(pod_labels.get(k), Some(v), "selector selects the pod");
        }
        for port in service["spec"]["ports"].as_vec().expect("ports") {
            let target = &port["targetPort"];
            assert_eq!(
                container_port(c, target),
                port["port"].as_i64().expect("port")
            );
        }
    }
    let service_ports = |s: &Yaml| -> BTreeSet<i64> {
        s["spec"]["ports"]
            .as_vec()
            .expect("ports")
            .iter()
            .filter_map(|p| p["port"].as_i64())
            .collect()
    };
    assert!(services
        .iter()
        .any(|s| s["spec"]["clusterIP"].as_str() != Some("None")
            && service_ports(s) == BTreeSet::from([mqtt_port, metrics_port])));
    let governing = spec["serviceName"].as_str().expect("serviceName");
    let headless = services
        .iter()
        .find(|s| s["metadata"]["name"].as_str() == Some(governing))
        .expect("the governing service exists");
    assert_eq!(headless["spec"]["clusterIP"].as_str(), Some("None"));
}

/// The one `StatefulSet` of `objects` named `name`.
fn stateful_set<'a>(objects: &'a [Yaml], name: &str) -> &'a Yaml {
    of_kind(objects, "StatefulSet")
        .into_iter()
        .find(|s| s["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("a StatefulSet named {name}"))
}

/// The one Service of `objects` named `name`.
fn service<'a>(objects: &'a [Yaml], name: &str) -> &'a Yaml {
    of_kind(objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("a Service named {name}"))
}

/// The `data` entry `key` of the ConfigMap named `name`.
fn config_map_entry<'a>(objects: &'a [Yaml], name: &str, key: &str) -> &'a str {
    of_kind(objects, "ConfigMap")
        .into_iter()
        .find(|m| m["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("a ConfigMap named {name}"))["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has {key}"))
}

/// What the single node's pod has and every pod of the cluster variant keeps: non-root, no
/// capabilities, read-only root filesystem, the claimed volume the only writable mount (at
/// `data_dir`, where the server keeps its state), the ConfigMap mounted read-only, a grace
/// period. Returns the first container.
fn hardened_pod_with_volume<'a>(set: &'a Yaml, data_dir: &str, config_map: &str) -> &'a Yaml {
    let name = set["metadata"]["name"].as_str().expect("name");
    let pod = &set["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true),
        "{name}"
    );
    assert!(
        pod["securityContext"]["runAsUser"]
            .as_i64()
            .is_some_and(|u| u > 0),
        "{name}"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{name}");
    assert_eq!(
        sc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{name}"
    );
    assert_eq!(
        sc["capabilities"]["drop"][0].as_str(),
        Some("ALL"),
        "{name}"
    );
    assert!(!c["resources"]["limits"]["memory"].is_badvalue(), "{name}");
    assert!(
        pod["terminationGracePeriodSeconds"]
            .as_i64()
            .is_some_and(|g| g > SHUTDOWN_BOUND_SECS),
        "{name}: grace period"
    );
    let claims = set["spec"]["volumeClaimTemplates"]
        .as_vec()
        .unwrap_or_else(|| panic!("{name}: volumeClaimTemplates"));
    assert_eq!(claims.len(), 1, "{name}");
    assert_eq!(
        claims[0]["spec"]["accessModes"][0].as_str(),
        Some("ReadWriteOnce"),
        "{name}"
    );
    let claim = claims[0]["metadata"]["name"].as_str().expect("claim name");
    let mounts = c["volumeMounts"].as_vec().expect("volumeMounts");
    let data = mounts
        .iter()
        .find(|m| m["name"].as_str() == Some(claim))
        .unwrap_or_else(|| panic!("{name}: the claim is mounted"));
    let mount_path = data["mountPath"].as_str().expect("mountPath");
    assert!(
        Path::new(data_dir).starts_with(mount_path),
        "{name}: state in {data_dir}, volume at {mount_path}"
    );
    for m in mounts.iter().filter(|m| m["name"].as_str() != Some(claim)) {
        assert_eq!(
            m["readOnly"].as_bool(),
            Some(true),
            "{name}: {m:?} read-only"
        );
    }
    let volumes = pod["volumes"].as_vec().expect("volumes");
    assert!(
        volumes
            .iter()
            .any(|v| v["configMap"]["name"].as_str() == Some(config_map)),
        "{name} mounts {config_map}"
    );
    c
}

/// A container's `args`, and the value after the first of them that is one of `flags`
/// (`--flag VALUE`): how both the NATS and the Postbox pods are checked for their flags.
fn flag_value<'a>(container: &'a Yaml, flags: &[&str]) -> (Vec<&'a str>, Option<&'a str>) {
    let args: Vec<&str> = container["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let value = args
        .iter()
        .position(|a| flags.contains(a))
        .and_then(|i| args.get(i + 1))
        .copied();
    (args, value)
}

/// Whether the container's `env` sets `var` from the pod's name (the downward API).
fn env_from_pod_name(container: &Yaml, var: &str) -> bool {
    container["env"].as_vec().is_some_and(|env| {
        env.iter().any(|e| {
            e["name"].as_str() == Some(var)
                && e["valueFrom"]["fieldRef"]["fieldPath"].as_str() == Some("metadata.name")
        })
    })
}

/// Issue 17's deployment: deploy/kubernetes/cluster/ runs three Postbox nodes on a
/// three-server NATS JetStream cluster. NATS: 3 replicas routed to each other through the
/// headless Service (a route per pod), a `server_name` per pod, JetStream on the claimed
/// volume, `/healthz` probes on the monitoring port, a client Service on 4222, and a config
/// `nats-server -t` accepts. Postbox: 3 replicas, `--cluster-node $(POD_NAME)` from the
/// downward API, the single node's probes and hardening, and a ConfigMap whose TOML loads with
/// every pod's name as the node (and not without one) and names the NATS client Service.
#[test]
fn kubernetes_cluster_variant_runs_three_nodes_on_nats_jetstream() {
    let objects = kustomization_objects("deploy/kubernetes/cluster");
    assert_eq!(
        of_kind(&objects, "StatefulSet").len(),
        2,
        "NATS and Postbox"
    );

    // NATS.
    let nats = stateful_set(&objects, "nats");
    let spec = &nats["spec"];
    let nats_replicas = spec["replicas"].as_i64().expect("replicas");
    assert_eq!(nats_replicas, 3, "three NATS servers");
    let headless = spec["serviceName"].as_str().expect("serviceName");
    assert_eq!(
        service(&objects, headless)["spec"]["clusterIP"].as_str(),
        Some("None")
    );
    let conf = config_map_entry(&objects, "nats-config", "nats.conf");
    let store_dir = conf
        .lines()
        .find_map(|l| l.trim().strip_prefix("store_dir:"))
        .map(str::trim)
        .expect("jetstream { store_dir: ... }");
    assert!(conf.contains("jetstream {"), "{conf}");
    let c = hardened_pod_with_volume(nats, store_dir, "nats-config");
    assert!(
        c["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("nats:2.")),
        "{:?}",
        c["image"]
    );
    let (_, conf_path) = flag_value(c, &["--config", "-c"]);
    let conf_path = conf_path.expect("nats-server --config <file>");
    let conf_mount = c["volumeMounts"]
        .as_vec()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .and_then(|m| m["mountPath"].as_str())
        .expect("config mounted");
    assert_eq!(conf_path, format!("{conf_mount}/nats.conf"));
    // One stable server_name per pod: the pod's name through the environment.
    assert!(conf.contains("server_name: $SERVER_NAME"), "{conf}");
    assert!(
        env_from_pod_name(c, "SERVER_NAME"),
        "SERVER_NAME from the pod name"
    );
    // A route to every pod through the headless Service, on the port it publishes.
    for i in 0..nats_replicas {
        let route = format!("nats://nats-{i}.{headless}:6222");
        assert!(conf.contains(&route), "route {route}: {conf}");
    }
    assert_eq!(container_port(c, &Yaml::String("cluster".into())), 6222);
    // Probes on the monitoring port (`http:` in the config), /healthz.
    assert!(conf.contains("http: 0.0.0.0:8222"), "{conf}");
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let get = &c[probe]["httpGet"];
        assert!(
            get["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/healthz")),
            "{probe}"
        );
        assert_eq!(container_port(c, &get["port"]), 8222, "{probe}");
    }
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    // Only the Postbox pods (and the NATS pods) reach NATS's client port: the nodes trust
    // what comes over NATS (seventh pass N2).
    let policy = of_kind(&objects, "NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"].as_str() == Some("nats"))
        .expect("a NetworkPolicy for NATS");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("nats")
    );
    let rules = policy["spec"]["ingress"].as_vec().expect("ingress rules");
    for rule in rules {
        let from = rule["from"].as_vec().expect("from");
        assert!(
            from.iter().all(|f| matches!(
                f["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
                Some("postbox" | "nats")
            )),
            "NATS admits only Postbox and NATS pods: {rule:?}"
        );
    }
    // The client Service.
    let client = service(&objects, "nats");
    assert_ne!(client["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(client["spec"]["ports"][0]["port"].as_i64(), Some(4222));
    assert_eq!(
        container_port(c, &client["spec"]["ports"][0]["targetPort"]),
        4222
    );
    // Clients log in with the password of the generated Secret, given as an environment
    // variable (N2: a pod that only carries Postbox's label is not a peer).
    let secret = kustomization_secret("deploy/kubernetes/cluster");
    assert!(
        conf.contains("authorization {") && conf.contains("password: $POSTBOX_NATS_PASSWORD"),
        "{conf}"
    );
    let nats_user = conf
        .lines()
        .find_map(|l| l.trim().strip_prefix("{ user: "))
        .and_then(|rest| rest.split(',').next())
        .expect("{ user: <name>, password: ... }");
    assert!(
        env_from_secret(c, "POSTBOX_NATS_PASSWORD", &secret),
        "POSTBOX_NATS_PASSWORD from the Secret {secret:?}"
    );
    // The real nats-server accepts the file, with SERVER_NAME and the password set as in
    // the pod (a password as the kustomization's comment makes it).
    let dir = tempfile::tempdir().expect("tempdir");
    let conf_file = dir.path().join("nats.conf");
    std::fs::write(&conf_file, conf).expect("write nats.conf");
    let out = Command::new("nats-server")
        .arg("-t")
        .arg("-c")
        .arg(&conf_file)
        .env("SERVER_NAME", "nats-0")
        .env(
            "POSTBOX_NATS_PASSWORD",
            "q3ZkR0xv9Yw2LmTnB8sPa4DfHjU6cEgK1oViWyXz7Q",
        )
        .output()
        .expect("nats-server is installed (apt-get install nats-server)");
    assert!(out.status.success(), "nats-server -t: {}", text(&out));

    // Postbox.
    let postbox = stateful_set(&objects, "postbox");
    let spec = &postbox["spec"];
    assert_eq!(spec["replicas"].as_i64(), Some(3), "three Postbox nodes");
    let toml_text = config_map_entry(&objects, "postbox-config", "postbox.toml");
    let raw: toml::Table = toml::from_str(toml_text).expect("the embedded config is TOML");
    let data_dir = raw["storage"]["dir"].as_str().expect("storage.dir");
    let c = hardened_pod_with_volume(postbox, data_dir, "postbox-config");
    let (args, node_arg) = flag_value(c, &["--cluster-node"]);
    assert_eq!(
        node_arg.expect("--cluster-node <ID>"),
        "$(POD_NAME)",
        "{args:?}"
    );
    assert!(
        env_from_pod_name(c, "POD_NAME"),
        "POD_NAME from the pod name"
    );
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(container_port(c, &get["port"]), 9883, "{probe}");
    }
    // The TOML loads as every pod runs it (the pod's name as the node: a valid id), and not
    // without the flag: a forgotten flag stops the pod rather than giving all one id.
    let path = dir.path().join("postbox.toml");
    std::fs::write(&path, toml_text).expect("write postbox.toml");
    let set_name = postbox["metadata"]["name"].as_str().expect("name");
    for i in 0..3 {
        let pod_name = format!("{set_name}-{i}");
        // Without reading the files it names: its password file is the Secret mounted in
        // the pod.
        let config = Config::from_toml_str_with(
            toml_text,
            &path.display().to_string(),
            &Overrides {
                cluster_node: Some(ClusterNode::Flag(pod_name.clone())),
                ..Overrides::default()
            },
        )
        .unwrap_or_else(|e| panic!("{pod_name}: {e}"));
        let cluster = config.cluster.expect("[cluster]");
        assert_eq!(cluster.node, pod_name);
        assert_eq!(
            cluster.replicas, 3,
            "every stream on the three NATS servers"
        );
        assert!(i64::try_from(cluster.replicas).is_ok_and(|r| r <= nats_replicas));
        assert_eq!(cluster.servers, ["nats://nats:4222"], "the client Service");
        assert_eq!(config.storage.persistence_dir(), Some(Path::new(data_dir)));
        // The NATS user of nats.conf, its password from the Secret's volume.
        assert_eq!(cluster.user.as_deref(), Some(nats_user));
        let password_file = cluster.password_file.expect("cluster.password_file");
        let (mount, key) = (
            password_file.parent().and_then(Path::to_str).expect("dir"),
            password_file
                .file_name()
                .and_then(|f| f.to_str())
                .expect("key"),
        );
        assert!(
            secret_mounted_at(postbox, c, &secret, mount),
            "the Secret {secret:?} is mounted at {mount}"
        );
        assert_eq!(key, "password", "the Secret's key");
    }
    let err = Config::load(&path).expect_err("no node without the flag");
    assert!(err.to_string().contains("cluster.node"), "{err}");
    // The servers name the client Service, on its port.
    let url = format!(
        "nats://{}:{}",
        client["metadata"]["name"].as_str().expect("name"),
        client["spec"]["ports"][0]["port"].as_i64().expect("port")
    );
    assert!(
        toml_text.contains(&format!("servers = [\"{url}\"]")),
        "{url}"
    );

    // MQTT in front of every Postbox pod, and the governing Service; neither selects NATS.
    let pod_labels = spec["template"]["metadata"]["labels"]
        .as_hash()
        .expect("pod labels");
    let nats_labels = nats["spec"]["template"]["metadata"]["labels"]
        .as_hash()
        .expect("nats labels");
    let mqtt = service(&objects, "postbox");
    assert_ne!(mqtt["spec"]["clusterIP"].as_str(), Some("None"));
    for s in [
        mqtt,
        service(&objects, spec["serviceName"].as_str().expect("serviceName")),
    ] {
        let selector = s["spec"]["selector"].as_hash().expect("selector");
        for (k, v) in selector {
            assert_eq!(pod_labels.get(k), Some(v), "selects the Postbox pods");
        }
        assert!(
            selector.iter().any(|(k, v)| nats_labels.get(k) != Some(v)),
            "does not select the NATS pods"
        );
        for port in s["spec"]["ports"].as_vec().expect("ports") {
            assert_eq!(
                container_port(c, &port["targetPort"]),
                port["port"].as_i64().expect("port")
            );
        }
    }
    assert!(mqtt["spec"]["ports"]
        .as_vec()
        .expect("ports")
        .iter()
        .any(|p| p["port"].as_i64() == Some(1883)));
}

/// The Containerfile, read (no container engine in the test environment): two stages, the
/// runtime one on a small base, as a non-root user, with the probe note.
#[test]
fn containerfile_is_multi_stage_small_and_non_root() {
    let file = read("deploy/container/Containerfile");
    let lines: Vec<&str> = file
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "a build stage and a runtime stage");
    let runtime = &lines[*froms.last().expect("FROM")..];
    let base = runtime[0].split_whitespace().nth(1).expect("base image");
    assert!(
        ["distroless", "-slim", "alpine", "scratch"]
            .iter()
            .any(|small| base.contains(small)),
        "small runtime base, not {base}"
    );
    assert!(runtime.iter().any(|l| l.starts_with("COPY --from=")));
    assert!(
        !runtime.iter().any(|l| l.contains("cargo")),
        "no toolchain in the runtime stage"
    );
    let user = runtime
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the runtime stage");
    let uid = user.split(':').next().expect("uid").trim();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u > 0),
        "numeric non-root user, not {uid}"
    );
    // The same user the StatefulSet runs as.
    let set = yaml("deploy/kubernetes/statefulset.yaml");
    let run_as = set[0]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        .as_i64()
        .expect("runAsUser");
    assert_eq!(uid, run_as.to_string());
    assert!(runtime.contains(&"STOPSIGNAL SIGTERM"));
    // Health: a HEALTHCHECK, or the note that says where to probe.
    assert!(
        runtime.iter().any(|l| l.starts_with("HEALTHCHECK"))
            || (file.contains("/healthz") && file.contains("/readyz")),
        "health check or probe note"
    );
}

/// The image's config (the file the Containerfile installs): the real binary on it listens on
/// every interface of the container for MQTT and metrics, since the defaults' loopback is
/// reachable from nowhere inside a container, and warns that anyone who reaches the port may
/// connect (issue 37, item 2: the defaults listen on loopback only).
#[test]
fn the_image_config_serves_the_containers_network_and_warns() {
    let file = read("deploy/container/Containerfile");
    assert!(
        file.contains("deploy/container/postbox.toml /out/etc/postbox/postbox.toml"),
        "the image installs deploy/container/postbox.toml"
    );
    let (mqtt, metrics) = (
        crate::common::process::free_port(),
        crate::common::process::free_port(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let config = repo_path("deploy/container/postbox.toml");
    let broker = crate::common::process::Broker::spawn(
        &[
            "-c",
            config.to_str().expect("utf8"),
            "-p",
            &mqtt.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--data-dir",
            dir.path().to_str().expect("utf8"),
        ],
        &[],
    );
    let warning = broker.wait_log(|l| l.contains("no authentication method is configured"));
    assert!(warning.contains(&format!("0.0.0.0:{mqtt}")), "{warning}");
    let up = broker.wait_log(|l| l.contains("MQTT listener up"));
    assert!(up.contains(&format!("0.0.0.0:{mqtt}")), "{up}");
    assert!(up.contains("the network"), "{up}");
    let http = broker.wait_log(|l| l.contains("HTTP endpoint up"));
    assert!(http.contains(&format!("0.0.0.0:{metrics}")), "{http}");
    broker.terminate();
}

/// A bridge whose series (`postbox_bridge_*`, labelled by its name) the dashboard and the rules
/// use: to a closed port, lazy with a threshold nobody reaches, so it never connects.
const BRIDGE: &str = "[[bridge]]\nname = \"cloud\"\naddresses = [\"127.0.0.1:1\"]\n\
    start = \"lazy\"\nthreshold = 1000000\n[[bridge.topic]]\npattern = \"bridged/#\"\n";

/// A broker with a durable store, a TLS, a WebSocket and a plain listener, a password file and
/// a bridge, after traffic that creates the series labelled at first use: messages both ways, a refused
/// password, a failed TLS handshake, a refused WebSocket upgrade.
async fn busy_broker(dir: &Path) -> BrokerProcess {
    let passwd = dir.join("passwd");
    let status = Command::new(crate::common::process::BIN)
        .args(["passwd", "-c", "-b", "--iterations", "1000"])
        .arg(&passwd)
        .args(["alice", "secret"])
        .stdout(Stdio::null())
        .status()
        .expect("postbox passwd");
    assert!(status.success());
    let certs = repo_path("certs");
    let tls = format!(
        "name = \"secure\"\nkind = \"tls\"\n[listener.tls]\ncert = {:?}\nkey = {:?}\n",
        certs.join("server.pem"),
        certs.join("server.key")
    );
    let broker = BrokerProcess::spawn_sections(
        &["name = \"plain\"", &tls, "name = \"web\"\nkind = \"ws\""],
        &format!(
            "[storage]\ndir = {:?}\n[auth]\npassword_file = {passwd:?}\n{BRIDGE}",
            dir.join("data")
        ),
    )
    .await;

    // A persistent subscriber: its QoS 1 deliveries go through the store (commit latency).
    let mut options = rumqttc::MqttOptions::new("sub", "127.0.0.1", broker.addr.port());
    options.set_credentials("alice", "secret");
    options.set_clean_session(false);
    let mut sub = V4::connect_with(options).await;
    let mut options = rumqttc::MqttOptions::new("pub", "127.0.0.1", broker.addr.port());
    options.set_credentials("alice", "secret");
    let mut publ = V4::connect_with(options).await;
    sub.subscribe("m/#", QoS::AtLeastOnce).await;
    for i in 0..5 {
        publ.publish(&format!("m/{i}"), QoS::AtLeastOnce, false, b"x")
            .await;
        sub.next_publish().await;
    }
    sub.disconnect().await;
    publ.disconnect().await;

    // A wrong password: CONNACK 0x04 (3.1.1), counted by reason.
    let refused = tokio::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &broker.addr.port().to_string()])
        .args(["-u", "alice", "-P", "wrong", "-t", "t", "-m", "x"])
        .output()
        .await
        .expect("mosquitto_pub");
    assert!(!refused.status.success());
    broker
        .wait_metric(
            r#"postbox_auth_failures_total{reason="bad_credentials"}"#,
            |v| v >= 1.0,
        )
        .await;

    // Plain text on the TLS port, then an HTTP request for the wrong path on the ws port.
    let mut s = tokio::net::TcpStream::connect(broker.addrs[1])
        .await
        .expect("connect tls port");
    s.write_all(b"not a TLS ClientHello\r\n\r\n")
        .await
        .expect("write");
    crate::common::async_process::closed(&mut s).await;
    let mut s = tokio::net::TcpStream::connect(broker.addrs[2])
        .await
        .expect("connect ws port");
    s.write_all(
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
          Sec-WebSocket-Protocol: mqtt\r\n\r\n",
    )
    .await
    .expect("write");
    crate::common::async_process::closed(&mut s).await;
    broker
        .wait_metric(r#"postbox_messages_received_total{qos="1"}"#, |v| v >= 5.0)
        .await;
    broker
        .wait_metric("postbox_store_commits_total", |v| v >= 1.0)
        .await;
    broker
}

/// The sample names (metric names of sample lines) of a scrape's body.
fn exported_names(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The body of an HTTP response.
fn body(response: &str) -> &str {
    response
        .split_once("\r\n\r\n")
        .map_or(response, |(_, body)| body)
}

/// Every metric the alert rules and the dashboard name is exported by a running broker (with the
/// listeners and features they describe). A rename in the code fails here, not silently on an
/// operator's dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_rules_name_is_exported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = busy_broker(dir.path()).await;
    let mut exported = exported_names(body(&broker.scrape().await));
    let used = deploy_metric_names();
    assert!(used.len() > 40, "the scan finds the names: {used:?}");
    // The cluster's families exist only with `[cluster]` (they are registered, at 0, whether
    // or not NATS is reachable): a second broker has one, towards a closed port.
    let cluster = BrokerProcess::spawn_sections(
        &["name = \"plain\""],
        "[cluster]\nnode = \"dashboard\"\nservers = [\"nats://127.0.0.1:1\"]\n",
    )
    .await;
    let clustered = exported_names(body(&cluster.scrape().await));
    assert!(
        postbox::test_support::metrics::names::CLUSTER
            .iter()
            .all(|n| !exported.contains(*n) && clustered.contains(*n)),
        "cluster families only with [cluster]"
    );
    exported.extend(clustered);
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "named by deploy/grafana or deploy/prometheus but not in /metrics: {missing:?}"
    );
}

/// `promtool check metrics` (exposition format and naming conventions: HELP text, `_total`
/// counters, base units) accepts the broker's `/metrics` after traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_check_metrics_accepts_the_broker_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = busy_broker(dir.path()).await;
    let scrape = broker.scrape().await;
    let metrics = body(&scrape);
    assert!(metrics.contains("postbox_auth_failures_total"));
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (apt-get install prometheus)");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(metrics.as_bytes()).await.expect("write");
    drop(stdin);
    let out = tokio::time::timeout(crate::common::WAIT, child.wait_with_output())
        .await
        .expect("promtool answers in time")
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics: {}",
        text(&out)
    );
}
