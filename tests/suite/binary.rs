//! The `postbox` binary as users run it: flags, config errors, metrics endpoint, signals.

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::common::http::http_get;
use crate::common::nats::NatsServer;
use crate::common::process::{free_port, Broker};

const BIN: &str = crate::common::process::BIN;
const WAIT: Duration = Duration::from_secs(15);

/// Starts the binary and waits (bounded) until it logs that it is running.
fn spawn_broker(args: &[&str]) -> Broker {
    Broker::start_args(args, &[])
}

/// The flags that run the embedded default config (no file) with MQTT on port `mqtt`, metrics
/// on `metrics` and its store in `dir`: how the tests start a broker from flags alone.
fn default_config_flags(mqtt: u16, metrics: u16, dir: &std::path::Path) -> [String; 6] {
    [
        "-p".into(),
        mqtt.to_string(),
        "--metrics-port".into(),
        metrics.to_string(),
        "--data-dir".into(),
        dir.to_str().expect("utf8").into(),
    ]
}

/// SIGTERM, as systemd and container runtimes send it; the exit (bounded).
fn terminate(broker: Broker) -> std::process::ExitStatus {
    broker.terminate()
}

/// A `postbox.toml` in `dir`: one listener on 127.0.0.1:`mqtt`, metrics on 127.0.0.1:`metrics`,
/// and `storage` as the `[storage]` section's keys.
fn config_file(
    dir: &std::path::Path,
    mqtt: u16,
    metrics: u16,
    storage: &str,
) -> std::path::PathBuf {
    let path = dir.join("postbox.toml");
    std::fs::write(
        &path,
        format!(
            "[listener]\nbind = \"127.0.0.1:{mqtt}\"\n[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [storage]\n{storage}\n"
        ),
    )
    .expect("write config");
    path
}

#[test]
fn runs_from_config_file_serves_mqtt_and_metrics_and_stops_on_sigterm() {
    let (mqtt, metrics) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let data = format!("dir = {:?}", dir.path().join("data"));
    let path = config_file(dir.path(), mqtt, metrics, &data);
    let child = spawn_broker(&["-c", path.to_str().expect("utf8 path")]);
    // Issue 37, item 2: the start-up lines say which file was read, where the durable state
    // lives, and what each listener is and whom it admits.
    let running = child.wait_log(|l| l.contains("postbox running"));
    assert!(
        running.contains(&format!("config={}", path.display()))
            && running.contains(&format!("data={}", dir.path().join("data").display())),
        "{running}"
    );
    let up = child.wait_log(|l| l.contains("MQTT listener up"));
    assert!(
        up.contains("kind=tcp") && up.contains("admits=anyone (no authentication method)"),
        "{up}"
    );

    let status = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &mqtt.to_string(),
            "-t",
            "sensors/t1",
            "-m",
            "21.5",
            "-q",
            "1",
        ])
        .status()
        .expect("mosquitto_pub installed");
    assert!(status.success());

    let body = http_get(metrics, "/metrics");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("postbox_messages_received_total{qos=\"1\"} 1"),
        "{body}"
    );
    assert!(body.contains("postbox_connections_total"), "{body}");
    assert!(http_get(metrics, "/health").contains("OK"));

    let status = terminate(child);
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}

#[test]
fn port_flag_overrides_the_config() {
    let (mqtt, metrics) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    // The file's listener port (1) is not the one the broker must listen on.
    let path = config_file(dir.path(), 1, metrics, "persistence = false");
    let child = spawn_broker(&[
        "-c",
        path.to_str().expect("utf8"),
        "-p",
        &mqtt.to_string(),
        "-v",
    ]);
    TcpStream::connect(("127.0.0.1", mqtt)).expect("listening on the -p port");
    terminate(child);
}

/// Runs the binary on a config file with `contents` (in a temporary directory of its own); it
/// must refuse to start. Returns its stderr and the file's path (for the `file:line` the error
/// must name).
fn refused_config(contents: &str) -> (String, String) {
    refused_config_with(contents, &[])
}

/// [`refused_config`] with `env` set for the binary.
fn refused_config_with(contents: &str, env: &[(&str, &str)]) -> (String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, contents).expect("write config");
    let out = Command::new(BIN)
        .args(["-c", path.to_str().expect("utf8")])
        .envs(env.iter().copied())
        .output()
        .expect("run");
    assert!(!out.status.success(), "a bad config must stop the broker");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (err, path.display().to_string())
}

#[test]
fn invalid_config_names_key_and_line() {
    let (err, _) = refused_config("[listener]\nbind = \"127.0.0.1:1883\"\n\n[mqtt]\nmax_qos = 7\n");
    assert!(
        err.contains("mqtt.max_qos") && err.contains(":5"),
        "error names key and line: {err}"
    );

    let (err, _) = refused_config("[mqtt]\nmax_inflight = 3\n");
    assert!(
        err.contains("max_inflight") && err.contains(":2"),
        "unknown key is named with its line: {err}"
    );
}

/// Issue 37, item 4: a typo gets the nearest key, not the table's forty; a wrong type is
/// named in words with what the key means and takes (quoted from the default config's
/// comment); a duplicated table is named; and `RUST_BACKTRACE=1` in the environment adds no
/// backtrace (only `-v` does).
#[test]
fn config_errors_say_what_to_do_without_a_backtrace() {
    let refused_with_backtrace_env = |contents: &str| {
        let (err, _) = refused_config_with(contents, &[("RUST_BACKTRACE", "1")]);
        assert!(!err.contains("backtrace"), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        err
    };
    let err = refused_with_backtrace_env("[mqtt]\nmax_packet_sise = 5\n");
    assert!(err.contains("did you mean `max_packet_size`?"), "{err}");
    assert!(
        !err.contains("max_inflight_messages"),
        "not the whole list: {err}"
    );
    let err = refused_with_backtrace_env("[mqtt]\nmax_packet_size = \"1MB\"\n");
    assert!(
        err.contains(":2:") && err.contains("mqtt.max_packet_size"),
        "{err}"
    );
    assert!(
        err.contains("a whole number") && err.contains("Range 20..="),
        "{err}"
    );
    let err = refused_with_backtrace_env("[mqtt]\nmax_qos = 1\n[mqtt]\n");
    assert!(
        err.contains(":3:") && err.contains("duplicate key `mqtt`"),
        "{err}"
    );
}

/// Issue 37, item 4: a certificate that cannot be read stops the start before the durable
/// store opens (no data directory is made), and the error says the file's problem once.
#[test]
fn a_missing_certificate_stops_the_start_before_the_store_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let contents = format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\nkind = \"tls\"\n[listener.tls]\n\
         cert = \"nope/server.pem\"\nkey = \"nope/server.key\"\n\
         [metrics]\nenabled = false\n[storage]\ndir = {data:?}\n"
    );
    let (err, _) = refused_config(&contents);
    assert_eq!(
        err.matches("nope/server.pem").count(),
        1,
        "said once: {err}"
    );
    assert!(!data.exists(), "the store was opened: {err}");
}

#[test]
fn version_and_help() {
    let out = Command::new(BIN).arg("--version").output().expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    let out = Command::new(BIN).arg("--help").output().expect("run");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--port",
        "--metrics-port",
        "--data-dir",
        "--cluster-node",
        "POSTBOX_CLUSTER_NODE",
        "--verbose",
    ] {
        assert!(help.contains(flag), "{help}");
    }
}

/// The goal of `--metrics-port`: two brokers side by side on one machine, from the embedded
/// default config, told apart only by flags.
#[test]
fn metrics_port_flag_lets_two_brokers_run_side_by_side() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let mut brokers = Vec::new();
    for dir in &dirs {
        let (mqtt, metrics) = (free_port(), free_port());
        let flags = default_config_flags(mqtt, metrics, dir.path());
        let child = spawn_broker(&flags.each_ref().map(String::as_str));
        brokers.push((child, mqtt, metrics));
    }
    for (_, mqtt, metrics) in &brokers {
        TcpStream::connect(("127.0.0.1", *mqtt)).expect("MQTT on the -p port");
        let body = http_get(*metrics, "/metrics");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("postbox_connections_total"), "{body}");
    }
    for (child, _, _) in brokers {
        assert!(terminate(child).success());
    }
}

#[test]
fn metrics_port_zero_turns_the_endpoint_off() {
    let (mqtt, metrics) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_file(dir.path(), mqtt, metrics, "persistence = false");
    let child = spawn_broker(&["-c", path.to_str().expect("utf8"), "--metrics-port", "0"]);
    // Running (it logged so) and serving MQTT, but nothing on the configured metrics port.
    TcpStream::connect(("127.0.0.1", mqtt)).expect("MQTT listening");
    assert!(
        TcpStream::connect(("127.0.0.1", metrics)).is_err(),
        "metrics endpoint is off"
    );
    assert!(terminate(child).success());
}

#[test]
fn port_clash_from_flags_is_a_config_error_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["-p", "9000", "--metrics-port", "9000", "--data-dir"])
        .arg(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("clashes"), "{err}");
    assert!(
        err.contains("metrics.bind") && err.contains("listener[0].bind"),
        "both keys named: {err}"
    );
    assert!(
        err.contains("`-p 9000`") && err.contains("`--metrics-port 9000`"),
        "both flags named: {err}"
    );
    assert!(!err.contains("cannot listen"), "not a bind failure: {err}");
}

#[test]
fn duplicate_listener_names_name_file_line_and_key() {
    let (err, path) = refused_config(
        "[[listener]]\nname = \"mqtt\"\nbind = \"127.0.0.1:0\"\n\n[[listener]]\nname = \"mqtt\"\nbind = \"127.0.0.1:0\"\n",
    );
    assert!(
        err.contains(&format!("{path}:6:")) && err.contains("`listener[1].name`"),
        "error names file, line and key: {err}"
    );
}

/// A store of `count` retained messages in `data`, written through the library's own store so
/// that recovering it takes the broker a while.
fn write_large_store(data: &std::path::Path, count: usize) {
    use postbox::test_support::storage::{FsyncPolicy, Op, StorageConfig, StoredMessage};
    let config = StorageConfig {
        dir: Some(data.to_path_buf()),
        fsync: FsyncPolicy::Never,
        ..StorageConfig::default()
    };
    let store = postbox::test_support::storage::open(&config).expect("open the store");
    let payload = bytes::Bytes::from(vec![b'x'; 64]);
    for chunk in 0..count.div_ceil(1000) {
        let ops = (chunk * 1000..count.min((chunk + 1) * 1000))
            .map(|i| {
                let topic = bytestring::ByteString::from(format!("sensors/{i}/temperature"));
                Op::PutRetained {
                    topic: topic.clone(),
                    message: StoredMessage {
                        topic,
                        payload: payload.clone(),
                        qos: postbox::codec::QoS::AtLeastOnce,
                        retain: true,
                        properties: postbox::codec::PublishProperties::default(),
                        received_at_unix_ms: postbox::test_support::storage::now_unix_ms(),
                        expires_at_unix_ms: None,
                        from_anonymous: false,
                    },
                }
            })
            .collect();
        // Not refused for a full queue: the writer catches up instead.
        assert!(store.submit_awaited(ops).is_ok(), "store refused the ops");
    }
    // Returns once everything submitted is written; dropping the store closes it.
    store.load().expect("load");
}

/// systemd, Docker and Kubernetes send SIGTERM whenever they stop a unit, also while it is
/// still starting. The broker must take it as a graceful stop (exit 0, store closed), not die
/// by the signal's default action: the handlers are installed before the store is opened.
/// Here the signal arrives while a store of 200,000 retained messages is being recovered
/// (the broker's warning about a stray file there comes before the recovery work).
#[test]
fn sigterm_while_starting_is_a_graceful_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    write_large_store(&data, 200_000);
    let store_dir = data.join(postbox::test_support::storage::log_store::STORE_DIR);
    std::fs::write(store_dir.join("stray.txt"), b"not the store's").expect("stray file");
    let config = crate::common::process::write_config(dir.path(), &data);
    let mut broker = Broker::spawn(&["-c", config.path.to_str().expect("utf8 path")], &[]);
    broker.wait_log(|l| l.contains("ignoring unknown file"));
    broker.signal(libc::SIGTERM);
    let status = broker
        .wait_exit(WAIT)
        .expect("the broker exits after SIGTERM");
    let lines = broker.log();
    assert!(status.success(), "graceful exit, not the signal: {status}");
    assert!(
        lines.iter().any(|l| l.contains("shutting down")),
        "{lines:#?}"
    );
}

/// A `[cluster]` section naming the node `file-node`, on the NATS server at `nats` (a URL).
fn cluster_file(dir: &std::path::Path, nats: &str) -> std::path::PathBuf {
    let path = dir.join("cluster.toml");
    std::fs::write(
        &path,
        format!(
            "[listener]\nbind = \"127.0.0.1:0\"\n[metrics]\nenabled = false\n[storage]\npersistence = false\n\
             [cluster]\nnode = \"file-node\"\nservers = [\"{nats}\"]\n"
        ),
    )
    .expect("write config");
    path
}

/// Runs the binary with `args` and `env`; it must refuse to start (within [`WAIT`]: one that
/// starts instead is killed). Returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut broker = Broker::spawn(args, env);
    let Some(status) = broker.wait_exit(WAIT) else {
        panic!("started instead of refusing: {args:?} {env:?}");
    };
    assert!(!status.success(), "must refuse to start: {args:?} {env:?}");
    broker.log().join("\n")
}

/// Issue 17's deployment: `--cluster-node` (else `POSTBOX_CLUSTER_NODE`) sets `[cluster] node`
/// and is held to the file's rules (1 to 32 of A-Z a-z 0-9 _ -); the error names the flag or
/// the variable. Without a `[cluster]` section the flag is an error, not a silent single node.
#[test]
fn cluster_node_flag_is_validated_like_the_file_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = cluster_file(dir.path(), "nats://127.0.0.1:4222");
    let path = path.to_str().expect("utf8");
    let err = refused(&["-c", path, "--cluster-node", "pod.0"], &[]);
    assert!(
        err.contains("cluster.node") && err.contains("from `--cluster-node`"),
        "{err}"
    );
    let err = refused(&["-c", path], &[("POSTBOX_CLUSTER_NODE", "pod 0")]);
    assert!(
        err.contains("cluster.node") && err.contains("from `POSTBOX_CLUSTER_NODE`"),
        "{err}"
    );
    let single = dir.path().join("single.toml");
    std::fs::write(&single, "[storage]\npersistence = false\n").expect("write");
    let err = refused(
        &["-c", single.to_str().expect("utf8"), "--cluster-node", "a"],
        &[],
    );
    assert!(
        err.contains("--cluster-node needs a [cluster] section"),
        "{err}"
    );
}

/// Starts the binary and waits (bounded) for a line containing `wanted`; returns it.
fn spawn_until(args: &[&str], env: &[(&str, &str)], wanted: &'static str) -> (Broker, String) {
    let broker = Broker::spawn(args, env);
    let line = broker.wait_log(|l| l.contains(wanted));
    (broker, line)
}

/// What the flag is for (issue 17, one ConfigMap for every pod of a StatefulSet): two nodes run
/// from one file, told apart by `--cluster-node` and by `POSTBOX_CLUSTER_NODE`, each connects
/// to NATS under its own id (its `cluster: connected to NATS ... node=<id>` line); the flag
/// wins over the variable, and either wins over the file's `node`.
#[test]
fn one_file_serves_two_nodes_named_by_flag_and_environment() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = cluster_file(dir.path(), &nats.url());
    let path = path.to_str().expect("utf8");
    let connected = "cluster: connected to NATS";
    let (first, line) = spawn_until(
        &["-c", path, "--cluster-node", "pod-0"],
        &[("POSTBOX_CLUSTER_NODE", "ignored")],
        connected,
    );
    assert!(line.contains("node=pod-0"), "{line}");
    let (second, line) = spawn_until(
        &["-c", path],
        &[("POSTBOX_CLUSTER_NODE", "pod-1")],
        connected,
    );
    assert!(line.contains("node=pod-1"), "{line}");
    assert!(terminate(first).success());
    assert!(terminate(second).success());
    drop(nats);
}

/// An address of this machine other than loopback (the source address of its route towards
/// a documentation address, RFC 5737; a UDP `connect` sends nothing), if it has one.
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// With no config the broker listens on loopback only, MQTT and metrics alike, as Mosquitto
/// 2.x does without a config ("Starting in local only mode"), and its start-up line says so;
/// this machine's other addresses are refused. Before, the embedded default listened on
/// 0.0.0.0 and let anyone who reached the port in (issue 35, fifth adversarial pass; issue
/// 37, item 2).
#[test]
fn the_default_listens_on_loopback_only_and_says_so() {
    let (mqtt, metrics) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = default_config_flags(mqtt, metrics, dir.path());
    let (child, line) = spawn_until(
        &flags.each_ref().map(String::as_str),
        &[],
        "MQTT listener up",
    );
    assert!(line.contains(&format!("127.0.0.1:{mqtt}")), "{line}");
    assert!(line.contains("this machine only (loopback"), "{line}");
    match non_loopback_address() {
        Some(ip) => {
            for port in [mqtt, metrics] {
                let refused = TcpStream::connect_timeout(
                    &std::net::SocketAddr::new(ip, port),
                    Duration::from_secs(5),
                );
                assert!(refused.is_err(), "{ip}:{port} accepted a connection");
            }
        }
        None => eprintln!("skipped the non-loopback check: this machine has no other address"),
    }
    let logs = child.log().join("\n");
    assert!(
        !logs.contains("no authentication method is configured"),
        "{logs}"
    );
    terminate(child);
}

/// A listener on every interface without an authentication method lets anyone who reaches
/// its port in (as Mosquitto with `allow_anonymous true`): the start-up log warns, naming
/// the exposed address (issue 35, fifth adversarial pass).
#[test]
fn an_open_listener_on_the_network_warns_that_anyone_may_connect() {
    let (mqtt, metrics) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("open.toml");
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nbind = \"0.0.0.0:{mqtt}\"\n[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [storage]\npersistence = false\n"
        ),
    )
    .expect("write config");
    let (child, line) = spawn_until(
        &["-c", path.to_str().expect("utf8")],
        &[],
        "no authentication method is configured",
    );
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("0.0.0.0:{mqtt}")), "{line}");
    terminate(child);
}

/// Files a config names are read from the config file's directory, so a config with its files
/// beside it runs from any working directory (issue 37, item 3: the examples ran only from the
/// repository root); a missing one stops the start with an error naming the file, line and
/// key, and the path it looked at, before anything is created on disk (here, the store's
/// directory). Before, it said `cannot load the ACL: acl: cannot read`, naming neither.
#[test]
fn files_a_config_names_are_read_beside_it_from_any_directory() {
    let (configs, elsewhere) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        root.join("config/passwd.example"),
        configs.path().join("passwd"),
    )
    .expect("copy passwd");
    std::fs::copy(root.join("config/acl.example"), configs.path().join("acl")).expect("copy acl");
    let (mqtt, metrics) = (free_port(), free_port());
    let data = elsewhere.path().join("data");
    let text = |acl: &str| {
        format!(
            "[[listener]]\nbind = \"127.0.0.1:{mqtt}\"\n[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [storage]\ndir = {:?}\n[auth]\npassword_file = \"passwd\"\n\
             acl_file = \"{acl}\"\nallow_anonymous = false\n",
            data.display().to_string()
        )
    };
    let path = configs.path().join("postbox.toml");
    let args = ["-c", path.to_str().expect("utf8")];
    // A file that is not there: refused whole, with where to look.
    std::fs::write(&path, text("acl.missing")).expect("write config");
    let mut broker = Broker::spawn_in(elsewhere.path(), &args, &[]);
    let status = broker.wait_exit(WAIT).expect("exits");
    assert!(!status.success());
    let out = broker.log().join("\n");
    let missing = configs.path().join("acl.missing");
    for needed in [
        format!("{}:", path.display()),
        "auth.acl_file".to_owned(),
        missing.display().to_string(),
        "no such file".to_owned(),
    ] {
        assert!(out.contains(&needed), "{needed:?} not in: {out}");
    }
    assert!(!data.exists(), "the store's directory was created: {out}");
    // The files beside the config, from another directory: it runs and checks the password.
    std::fs::write(&path, text("acl")).expect("write config");
    let broker = Broker::spawn_in(elsewhere.path(), &args, &[]);
    broker.wait_log(|l| l.contains("postbox running"));
    let publish = |password: &str| {
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-q", "1"])
            .args([
                "-u",
                "sensor1",
                "-P",
                password,
                "-t",
                "sensors/sensor1/t",
                "-m",
                "1",
            ])
            .output()
            .expect("mosquitto_pub")
            .status
            .success()
    };
    assert!(
        publish("sensor1-secret"),
        "the password file beside the config was not read"
    );
    assert!(!publish("wrong"));
    terminate(broker);
}

/// `-p` moves the first listener only; with several, the start-up log says so, naming it, and
/// the second keeps its port (issue 37, item 3: `-p`'s reach was undocumented).
#[test]
fn the_port_flag_says_it_moved_the_first_listener_only() {
    let (first, second, moved, metrics) = (free_port(), free_port(), free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("two.toml");
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nname = \"devices\"\nbind = \"127.0.0.1:{first}\"\n\
             [[listener]]\nname = \"local\"\nbind = \"127.0.0.1:{second}\"\n\
             [metrics]\nbind = \"127.0.0.1:{metrics}\"\n[storage]\npersistence = false\n"
        ),
    )
    .expect("write config");
    let args = ["-c", path.to_str().expect("utf8"), "-p", &moved.to_string()];
    let broker = Broker::spawn(&args, &[]);
    let line = broker.wait_log(|l| l.contains("-p set the port"));
    assert!(
        line.contains("devices") && line.contains(&moved.to_string()),
        "{line}"
    );
    broker.wait_log(|l| l.contains("MQTT listener up") && l.contains("local"));
    for port in [moved, second] {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_ok(),
            "port {port}"
        );
    }
    terminate(broker);
}
