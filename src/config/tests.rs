//! Unit tests of parsing, positioned errors and the range rules (the listener rules are
//! tested in `listener.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::error::line_col;
use super::*;

/// `text` parsed as a config file named `test.toml`: the config module's tests (here, the
/// listener's and the bridge's) all parse through this one.
pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, "test.toml")
}

/// The `Invalid` error's key, line and message, or a panic naming what came instead: how the
/// rule tests check that a rule refuses with the key and the line of the offending value.
pub(super) fn invalid_at(text: &str) -> (String, Option<usize>, String) {
    match parse(text) {
        Err(ConfigError::Invalid {
            key, line, message, ..
        }) => (key, line, message),
        other => panic!("{text}\nexpected Invalid, got {other:?}"),
    }
}

/// Checks that `text` is refused as `Invalid` at `key` on `line` (`None`: a key the text does
/// not hold), with a message containing each of `parts`: a rule test's whole check in one call.
pub(super) fn invalid_with(text: &str, key: &str, line: Option<usize>, parts: &[&str]) {
    let (k, l, message) = invalid_at(text);
    assert_eq!((k.as_str(), l), (key, line), "{message}");
    for part in parts {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
}

/// `text` written to a file `name` in a fresh directory (dropped with the returned guard):
/// for the tests that load a config from a file rather than from a string.
pub(super) fn config_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write");
    (dir, path)
}

/// The message `text` is refused with (a panic if it parses): for the tests that look only
/// at the words.
pub(super) fn refusal(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("{text}\nparsed, expected a refusal"),
        Err(err) => err.to_string(),
    }
}

/// Checks that `text` is refused with a message naming its place (`test.toml:{line}:`) and
/// containing each of `parts` (the key, words of the value): the positioned parse errors here.
fn refused_at(text: &str, line: usize, parts: &[&str]) {
    let msg = refusal(text);
    assert!(msg.contains(&format!("test.toml:{line}:")), "{msg}");
    for part in parts {
        assert!(msg.contains(part), "{msg}");
    }
}

#[test]
fn embedded_default_matches_default() {
    assert_eq!(Config::embedded_default(), Config::default());
}

#[test]
fn default_is_valid() {
    Config::default().validate().expect("defaults validate");
}

#[test]
fn empty_text_is_default() {
    assert_eq!(parse("").expect("empty parses"), Config::default());
}

#[test]
fn partial_file_keeps_other_defaults() {
    let c = parse("[mqtt]\nmax_inflight_messages = 5\nqueue_overflow = \"drop-oldest\"\n")
        .expect("parses");
    assert_eq!(c.mqtt.max_inflight_messages, 5);
    assert_eq!(c.mqtt.queue_overflow, OverflowPolicy::DropOldest);
    assert_eq!(c.mqtt.max_queued_messages, 1000);
    assert_eq!(c.listeners, vec![ListenerConfig::default()]);
}

#[test]
fn storage_dir_and_bind_parse() {
    let c = parse("[storage]\ndir = \"/var/lib/postbox\"\n[listener]\nbind = \"127.0.0.1:1884\"\n")
        .expect("parses");
    assert_eq!(c.storage.dir, Some(PathBuf::from("/var/lib/postbox")));
    assert_eq!(
        c.listeners[0].bind,
        SocketAddr::from(([127, 0, 0, 1], 1884))
    );
}

#[test]
fn unknown_key_names_key_and_line() {
    let text = "[listener]\nbind = \"0.0.0.0:1883\"\n\n[mqtt]\nmax_inflight = 10\n";
    let err = parse(text).expect_err("unknown key rejected");
    match &err {
        ConfigError::Parse {
            origin, line, key, ..
        } => {
            assert_eq!(origin, "test.toml");
            assert_eq!(*line, 5);
            assert_eq!(key.as_deref(), Some("mqtt.max_inflight"));
        }
        other => panic!("expected Parse, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("test.toml:5:"), "{msg}");
    assert!(msg.contains("mqtt.max_inflight"), "{msg}");
    assert!(msg.contains("unknown key `max_inflight`"), "{msg}");
}

#[test]
fn unknown_table_names_key_and_line() {
    refused_at("# hi\n[tls]\ncert = \"x\"\n", 2, &["`tls`"]);
}

#[test]
fn table_given_as_value_says_table() {
    let msg = refusal("mqtt = 5\n");
    assert!(msg.ends_with("expected a table"), "{msg}");
    let msg = refusal("listener = 5\n");
    assert!(
        msg.ends_with("expected a table or an array of tables"),
        "{msg}"
    );
}

#[test]
fn wrong_type_names_key_and_line() {
    let text = "[mqtt]\nmax_qos = 1\nmax_inflight_messages = \"twenty\"\n";
    let err = parse(text).expect_err("wrong type rejected");
    match &err {
        ConfigError::Parse {
            line, column, key, ..
        } => {
            assert_eq!(*line, 3);
            assert_eq!(*column, 25);
            assert_eq!(key.as_deref(), Some("mqtt.max_inflight_messages"));
        }
        other => panic!("expected Parse, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("test.toml:3:25: key `mqtt.max_inflight_messages`"),
        "{msg}"
    );
}

#[test]
fn integer_overflow_for_type_names_key_and_line() {
    refused_at(
        "[mqtt]\nmax_inflight_messages = 70000\n",
        2,
        &["mqtt.max_inflight_messages"],
    );
}

#[test]
fn bad_socket_address_names_key_and_line() {
    refused_at(
        "[metrics]\nenabled = true\nbind = \"localhost\"\n",
        3,
        &["metrics.bind"],
    );
}

#[test]
fn bad_enum_value_names_key_and_line() {
    refused_at(
        "[mqtt]\nqueue_overflow = \"drop-all\"\n",
        2,
        &["mqtt.queue_overflow", "drop-oldest"],
    );
}

#[test]
fn max_memory_is_auto_or_bytes() {
    let auto = parse("[mqtt]\nmax_memory = \"auto\"\n").expect("auto");
    assert_eq!(auto.mqtt.max_memory, MemoryLimit::Auto);
    let bytes = parse("[mqtt]\nmax_memory = 536870912\n").expect("bytes");
    assert_eq!(bytes.mqtt.max_memory, MemoryLimit::Bytes(512 << 20));
    refused_at("[mqtt]\nmax_memory = \"lots\"\n", 2, &["mqtt.max_memory"]);
}

#[test]
fn syntax_error_names_line() {
    let err = parse("[mqtt]\nmax_qos = = 1\n").expect_err("syntax error");
    match &err {
        ConfigError::Parse { line, .. } => assert_eq!(*line, 2),
        other => panic!("expected Parse, got {other:?}"),
    }
    assert!(err.to_string().starts_with("test.toml:2:"), "{err}");
}

#[test]
fn out_of_range_names_key_and_line() {
    let text = "[mqtt]\nmax_qos = 2\n\nmax_inflight_messages = 0\n";
    let err = parse(text).expect_err("0 inflight rejected");
    match &err {
        ConfigError::Invalid {
            origin, key, line, ..
        } => {
            assert_eq!(origin.as_deref(), Some("test.toml"));
            assert_eq!(key, "mqtt.max_inflight_messages");
            assert_eq!(*line, Some(4));
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("test.toml:4: invalid value for key `mqtt.max_inflight_messages`"),
        "{msg}"
    );
}

#[test]
fn out_of_range_found_in_dotted_and_inline_keys() {
    let msg = refusal("mqtt.max_qos = 3\n");
    assert!(msg.starts_with("test.toml:1: "), "{msg}");
    assert!(msg.contains("mqtt.max_qos"), "{msg}");
    let msg = refusal("\n\nmqtt = { max_queued_messages = 0 }\n");
    assert!(msg.starts_with("test.toml:3: "), "{msg}");
    assert!(msg.contains("mqtt.max_queued_messages"), "{msg}");
}

#[test]
fn connection_bounds_parse_and_a_listener_bound_above_the_global_one_is_an_error() {
    let c = parse("[mqtt]\nmax_connections = 1000\n").expect("parses");
    assert_eq!(c.mqtt.max_connections, 1000);
    assert_eq!(parse("").expect("default").mqtt.max_connections, 0);
    let msg = refusal("[mqtt]\nmax_connections = -1\n");
    assert!(msg.contains("mqtt.max_connections"), "{msg}");
    for (listener_key, line) in [("max_connections", 3), ("max_connections_per_ip", 3)] {
        let text = format!(
            "[[listener]]\nbind = \"127.0.0.1:1883\"\n{listener_key} = 11\n\
             [mqtt]\nmax_connections = 10\n"
        );
        let err = parse(&text).expect_err("above the global bound");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("test.toml:{line}: ")), "{msg}");
        assert!(
            msg.contains(&format!("listener[0].{listener_key}")),
            "{msg}"
        );
        assert!(msg.contains("mqtt.max_connections (10)"), "{msg}");
    }
}

#[test]
fn each_range_rule_is_enforced() {
    let cases = [
        (
            "[mqtt]\nmax_packet_size = 268435461",
            "mqtt.max_packet_size",
        ),
        ("[mqtt]\nmax_keepalive = 0", "mqtt.max_keepalive"),
        (
            "[mqtt]\nmax_inflight_messages = 0",
            "mqtt.max_inflight_messages",
        ),
        (
            "[mqtt]\nmax_queued_messages = 0",
            "mqtt.max_queued_messages",
        ),
        ("[mqtt]\nmax_qos = 3", "mqtt.max_qos"),
        ("[mqtt]\nstalled_after = 0", "mqtt.stalled_after"),
        ("[mqtt]\nstalled_after = 3601", "mqtt.stalled_after"),
        ("[mqtt]\nsys_interval = 86401", "mqtt.sys_interval"),
        ("[mqtt]\nmax_memory = 0", "mqtt.max_memory"),
        ("[mqtt]\nmax_client_id_len = 22", "mqtt.max_client_id_len"),
        (
            "[mqtt]\nmax_client_id_len = 65536",
            "mqtt.max_client_id_len",
        ),
        ("[mqtt]\nreceive_maximum = 0", "mqtt.receive_maximum"),
        ("[mqtt]\nconnect_timeout = 0", "mqtt.connect_timeout"),
        ("[mqtt]\nconnect_timeout = 65536", "mqtt.connect_timeout"),
        ("[mqtt]\npacket_timeout = 0", "mqtt.packet_timeout"),
        ("[mqtt]\nmin_packet_rate = 0", "mqtt.min_packet_rate"),
        (
            "[mqtt]\nresponse_information = \"\"",
            "mqtt.response_information",
        ),
        (
            "[mqtt]\nresponse_information = \"a/#\"",
            "mqtt.response_information",
        ),
        ("[log]\nlevel = \"verbose\"", "log.level"),
        ("[log]\nlevel = \"info,postbox=loud\"", "log.level"),
        ("[log]\nlevel = \"\"", "log.level"),
        ("[storage]\ndir = \"\"", "storage.dir"),
        (
            "[storage]\nfsync_interval_ms = 0",
            "storage.fsync_interval_ms",
        ),
        (
            "[storage]\nfsync_interval_ms = 60001",
            "storage.fsync_interval_ms",
        ),
        ("[storage]\nmax_batch_ops = 0", "storage.max_batch_ops"),
        (
            "[storage]\ncommit_window_us = 100001",
            "storage.commit_window_us",
        ),
        (
            "[storage]\nqueue_capacity_ops = 10",
            "storage.queue_capacity_ops",
        ),
        ("[storage]\nmax_disk_bytes = 1000", "storage.max_disk_bytes"),
        ("[storage]\nwrite_retry_ms = 9", "storage.write_retry_ms"),
        (
            "[storage]\nwrite_retry_ms = 60001",
            "storage.write_retry_ms",
        ),
        ("[metrics]\nbind = \"127.0.0.1:1883\"", "metrics.bind"),
    ];
    for (text, want) in cases {
        match parse(text) {
            Err(ConfigError::Invalid { key, line, .. }) => {
                assert_eq!(key, want, "{text}");
                assert_eq!(line, Some(2), "{text}");
            }
            other => panic!("{text}: expected Invalid for {want}, got {other:?}"),
        }
    }
}

#[test]
fn boundary_values_are_accepted() {
    let text = "[mqtt]\nmax_packet_size = 268435460\nmax_qos = 0\nmax_client_id_len = 23\n\
                max_inflight_messages = 65535\nsession_expiry_interval_max = 0\n\
                connect_timeout = 65535\npacket_timeout = 1\nmin_packet_rate = 1\n\
                [metrics]\nenabled = false\nbind = \"0.0.0.0:1883\"\n\
                [log]\nlevel = \"warn,postbox::broker=DEBUG\"\n";
    let c = parse(text).expect("boundaries accepted");
    assert_eq!(c.mqtt.max_packet_size, MAX_PACKET_SIZE_LIMIT);
    assert!(!c.metrics.enabled);
}

#[test]
fn validate_without_text_has_no_position() {
    let mut c = Config::default();
    c.mqtt.max_qos = 7;
    let err = c.validate().expect_err("max_qos 7");
    assert_eq!(
        err.to_string(),
        "invalid value for key `mqtt.max_qos`: must be 0, 1 or 2, got 7"
    );
}

#[test]
fn load_names_missing_file() {
    let err = Config::load(Path::new("/nonexistent/postbox.toml")).expect_err("missing");
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().contains("/nonexistent/postbox.toml"),
        "{err}"
    );
}

#[test]
fn load_reads_file_and_names_it_in_errors() {
    let (_dir, path) = config_file("bad.toml", "[auth]\nallow_anonymous = \"yes\"\n");
    let err = Config::load(&path).expect_err("wrong type");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
    assert!(msg.contains("auth.allow_anonymous"), "{msg}");
}

#[test]
fn serialize_round_trips() {
    let mut c = Config::default();
    c.storage.dir = Some(PathBuf::from("/data"));
    c.mqtt.queue_overflow = OverflowPolicy::DropOldest;
    let text = toml::to_string(&c).expect("serializes");
    assert_eq!(parse(&text).expect("reparses"), c);
}

#[test]
fn storage_policies_parse() {
    let c = parse(
        "[storage]\nfsync = \"interval\"\nfsync_interval_ms = 5\nmax_disk_bytes = 1048576\n\
         disk_full = \"keep-in-memory\"\n",
    )
    .expect("parses");
    assert_eq!(c.storage.fsync, FsyncPolicy::Interval);
    assert_eq!(c.storage.fsync_interval_ms, 5);
    assert_eq!(c.storage.max_disk_bytes, MIN_DISK_BYTES);
    assert_eq!(c.storage.disk_full, DiskFullPolicy::KeepInMemory);
    let msg = refusal("[storage]\nfsync = \"always\"\n");
    assert!(msg.contains("every-batch"), "{msg}");
}

#[test]
fn mqtt5_feature_options_parse() {
    let c = parse(
        "[mqtt]\nreceive_maximum = 65535\ntopic_alias_maximum = 0\n\
         outbound_topic_aliases = \"lru\"\nwildcard_subscription_available = false\n\
         subscription_identifier_available = false\nshared_subscription_available = false\n\
         shared_subscription_strategy = \"hash\"\nresponse_information = \"replies/\"\n\
         validate_utf8_payload = true\n",
    )
    .expect("parses");
    assert_eq!(c.mqtt.receive_maximum, 65535);
    assert_eq!(c.mqtt.topic_alias_maximum, 0);
    assert_eq!(c.mqtt.outbound_topic_aliases, OutboundTopicAliases::Lru);
    assert!(!c.mqtt.wildcard_subscription_available);
    assert!(!c.mqtt.subscription_identifier_available);
    assert!(!c.mqtt.shared_subscription_available);
    assert_eq!(c.mqtt.shared_subscription_strategy, SharedStrategy::Hash);
    assert_eq!(c.mqtt.response_information.as_deref(), Some("replies/"));
    assert!(c.mqtt.validate_utf8_payload);
    for strategy in ["round-robin", "random"] {
        parse(&format!(
            "[mqtt]\nshared_subscription_strategy = \"{strategy}\"\n"
        ))
        .expect("strategy parses");
    }
    let err = parse("[mqtt]\nshared_subscription_strategy = \"sticky\"\n").expect_err("bad");
    assert!(err.to_string().contains("round-robin"), "{err}");
    let err = parse("[mqtt]\noutbound_topic_aliases = \"always\"\n").expect_err("bad");
    assert!(err.to_string().contains("lru"), "{err}");
    let text = toml::to_string(&c).expect("serializes");
    assert_eq!(parse(&text).expect("reparses"), c);
}

/// `mqtt.allow_control_characters`: off by default (MQTT's SHOULD NOT enforced, as Mosquitto),
/// a plain bool with no range to check, reported by key when mistyped.
#[test]
fn allow_control_characters_parses() {
    assert!(!Config::default().mqtt.allow_control_characters);
    let c = parse("[mqtt]\nallow_control_characters = true\n").expect("parses");
    assert!(c.mqtt.allow_control_characters);
    c.validate().expect("either value is valid");
    let err = parse("[mqtt]\nallow_control_characters = \"yes\"\n").expect_err("not a bool");
    assert!(
        err.to_string().contains("mqtt.allow_control_characters"),
        "{err}"
    );
    let text = toml::to_string(&c).expect("serializes");
    assert_eq!(parse(&text).expect("reparses"), c);
}

#[test]
fn line_col_counts_characters() {
    assert_eq!(line_col("ab\ncé=x", 6), (2, 3));
    assert_eq!(line_col("ab\ncé=x", 7), (2, 4));
    assert_eq!(line_col("", 10), (1, 1));
}

/// `config/postbox.toml` documents `[[bridge]]` in a commented block (so the default has no
/// bridge) whose keys, uncommented, are a valid bridge.
#[test]
fn default_file_documents_bridges_in_a_comment() {
    let text = Config::embedded_default_text();
    let start = text
        .find("\n# [[bridge]]\n")
        .expect("a commented [[bridge]] block");
    let block: String = text[start..]
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.starts_with('[')
                || l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                })
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let mut config = Config::parse_unvalidated(&block, "block").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.bridges.len(), 1, "{block}");
    let bridge = &mut config.bridges[0];
    assert_eq!(bridge.topics.len(), 2, "{block}");
    // The block shows the defaults of every key it does not need to set.
    let defaults = BridgeConfig {
        name: bridge.name.clone(),
        addresses: bridge.addresses.clone(),
        client_id: bridge.client_id.clone(),
        username: bridge.username.clone(),
        password: bridge.password.clone(),
        tls: bridge.tls.clone(),
        topics: bridge.topics.clone(),
        ..BridgeConfig::default()
    };
    assert_eq!(*bridge, defaults, "a documented default differs");
    // Its TLS files are examples; the rest validates.
    bridge.tls = None;
    config.validate().unwrap_or_else(|e| panic!("{e}"));
}

/// `[auth] login_*` (issue 35, finding 4): a limit whose delay is 0, or whose cap is below its
/// first delay, would hold nobody back, so it does not load; 0 failures turns a limit off.
#[test]
fn login_limits_that_would_never_hold_are_refused() {
    let err = parse("[auth]\nlogin_delay_ms = 0\n").expect_err("no delay");
    assert!(err.to_string().contains("auth.login_delay_ms"), "{err}");
    let err = parse("[auth]\nlogin_delay_ms = 5000\nlogin_delay_max_ms = 1000\n")
        .expect_err("cap below delay");
    assert!(err.to_string().contains("auth.login_delay_max_ms"), "{err}");
    let off = "[auth]\nlogin_failures_per_address = 0\nlogin_failures_per_user = 0\n\
               login_delay_ms = 0\nlogin_delay_max_ms = 0\n";
    let c = parse(off).expect("limits off");
    assert_eq!(c.auth.login_failures_per_address, 0);
}

/// The NATS credentials of `[cluster]` come as a pair, and in one place only (issue 35,
/// seventh adversarial pass N2).
#[test]
fn cluster_credentials_come_as_a_pair_in_one_place() {
    let base = "[cluster]\nnode = \"a\"\n";
    let cases = [
        (format!("{base}user = \"postbox\"\n"), "cluster.user"),
        (
            format!("{base}password_file = \"/run/secrets/nats\"\n"),
            "cluster.password_file",
        ),
        (
            format!(
                "{base}servers = [\"nats://u:p@nats:4222\"]\nuser = \"postbox\"\npassword_file = \"/p\"\n"
            ),
            "cluster.user",
        ),
    ];
    for (text, want) in cases {
        match parse(&text) {
            Err(ConfigError::Invalid { key, line, .. }) => {
                assert_eq!(key, want, "{text}");
                assert!(line.is_some(), "{text}: the line is named");
            }
            other => panic!("{text}: expected Invalid for {want}, got {other:?}"),
        }
    }
    let config = parse(&format!(
        "{base}user = \"postbox\"\npassword_file = \"/run/secrets/nats\"\n"
    ))
    .expect("a user with its password file");
    let cluster = config.cluster.expect("cluster");
    assert_eq!(cluster.user.as_deref(), Some("postbox"));
}

/// Issue 37, item 6: `max_packet_size` defaults to "auto", an eighth of `max_memory`, at
/// least 1 MiB and at most the protocol's maximum; written "auto" it is the same; a number is taken as it is; 0 and a
/// word other than "auto" are refused with the key named.
#[test]
fn max_packet_size_auto_is_an_eighth_of_the_budget() {
    let c = parse("[mqtt]\nmax_memory = 83886080\n").expect("parses");
    assert_eq!(c.mqtt.max_packet_size, 10_485_760);
    let c = parse("[mqtt]\nmax_memory = 83886080\nmax_packet_size = \"auto\"\n").expect("parses");
    assert_eq!(c.mqtt.max_packet_size, 10_485_760);
    let c = parse("[mqtt]\nmax_memory = 128\n").expect("parses");
    assert_eq!(
        c.mqtt.max_packet_size, 1_048_576,
        "never below the old fixed 1 MiB"
    );
    let c = parse("[mqtt]\nmax_memory = 100000000000\n").expect("parses");
    assert_eq!(c.mqtt.max_packet_size, MAX_PACKET_SIZE_LIMIT);
    let c = parse("[mqtt]\nmax_packet_size = 4096\n").expect("parses");
    assert_eq!(c.mqtt.max_packet_size, 4096);
    for bad in ["0", "\"1MB\""] {
        let msg = parse(&format!("[mqtt]\nmax_packet_size = {bad}\n"))
            .expect_err("refused")
            .to_string();
        assert!(
            msg.contains("mqtt.max_packet_size") && msg.contains(":2"),
            "{msg}"
        );
    }
}
