//! `import` on realistic mosquitto.conf files: the TOML loads as a Postbox config with the
//! meaning of the stanzas, and every option that does not map exactly leaves a note with its
//! line.

use super::*;
use crate::config::{Config, Direction, OverflowPolicy};

/// Parses and validates the imported TOML as the broker would.
fn load(result: &ImportResult) -> Config {
    match Config::from_toml_str(&result.toml, "imported.toml") {
        Ok(c) => c,
        Err(e) => panic!("{e}\n{}", result.toml),
    }
}

/// The note about `line`, or a panic listing the notes.
fn note_at<'a>(result: &'a ImportResult, line: usize, needle: &str) -> &'a str {
    let prefix = format!("mosquitto.conf:{line}: ");
    result
        .notes
        .iter()
        .find(|n| n.starts_with(&prefix) && n.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "no note at line {line} with {needle:?}: {:#?}",
                result.notes
            )
        })
}

/// [`note_at`] for each `(line, needle)`: a test's expected notes as one table.
fn notes_at(result: &ImportResult, expected: &[(usize, &str)]) {
    for &(line, needle) in expected {
        note_at(result, line, needle);
    }
}

const GATEWAY: &str = "\
# A gateway's mosquitto.conf
per_listener_settings false
listener 1883
persistence true
persistence_location /var/lib/mosquitto/

connection cloud
address cloud1.example.com:8883 cloud2.example.com  # the backup
round_robin true
bridge_protocol_version mqttv50
remote_clientid gw-17
remote_username gw17
remote_password s3cret with spaces
keepalive_interval 30
cleansession false
restart_timeout 2 120
topic sensors/# out 1 \"\" site1/
topic commands/# in 2 site1/ \"\"
topic \"\" out 1 local/status remote/gw17/status
topic alarms both
bridge_outgoing_retain false
try_private false

log_type all
connection backup
addresses 10.0.0.5 ::1:1884
start_type lazy
threshold 50
idle_timeout 300
restart_timeout 10
notifications false
topic # in 0 from-backup/ backup/
";

#[test]
fn stanzas_map_to_bridges() {
    let result = import(GATEWAY, "mosquitto.conf");
    let config = load(&result);
    assert_eq!(config.bridges.len(), 2, "{}", result.toml);

    let cloud = &config.bridges[0];
    assert_eq!(cloud.name, "cloud");
    assert_eq!(
        cloud.addresses,
        ["cloud1.example.com:8883", "cloud2.example.com:1883"]
    );
    assert!(cloud.round_robin);
    assert_eq!(cloud.protocol, BridgeProtocol::V5);
    assert_eq!(cloud.client_id.as_deref(), Some("gw-17"));
    assert_eq!(cloud.username.as_deref(), Some("gw17"));
    assert_eq!(cloud.password.as_deref(), Some("s3cret with spaces"));
    assert_eq!(cloud.keep_alive, 30);
    assert!(!cloud.clean_start);
    assert_eq!(
        cloud.session_expiry, 0,
        "Mosquitto's default for v5 bridges"
    );
    assert_eq!(cloud.restart_timeout, [2, 120]);
    assert!(!cloud.keep_retain);
    assert!(!cloud.try_private);
    assert_eq!(cloud.topics.len(), 4);
    let out = &cloud.topics[0];
    assert_eq!(
        (out.pattern.as_str(), out.direction, out.qos),
        ("sensors/#", Direction::Out, 1)
    );
    assert_eq!(
        (out.local_prefix.as_str(), out.remote_prefix.as_str()),
        ("", "site1/")
    );
    let inbound = &cloud.topics[1];
    assert_eq!((inbound.direction, inbound.qos), (Direction::In, 2));
    assert_eq!(
        (
            inbound.local_prefix.as_str(),
            inbound.remote_prefix.as_str()
        ),
        ("site1/", "")
    );
    let single = &cloud.topics[2];
    assert_eq!(single.pattern, "");
    assert_eq!(single.local_filter(), "local/status");
    assert_eq!(single.remote_filter(), "remote/gw17/status");
    let both = &cloud.topics[3];
    assert_eq!(
        (both.direction, both.qos),
        (Direction::Both, 0),
        "Mosquitto's default QoS"
    );

    let backup = &config.bridges[1];
    assert_eq!(backup.addresses, ["10.0.0.5:1883", "[::1]:1884"]);
    assert_eq!(
        backup.protocol,
        BridgeProtocol::V3_1_1,
        "Mosquitto's default"
    );
    assert_eq!(backup.start, StartMode::Lazy);
    assert_eq!((backup.threshold, backup.idle_timeout), (50, 300));
    assert_eq!(backup.restart_timeout, [10, 10], "a constant delay");
    assert!(!backup.notifications);
    assert_eq!(backup.topics[0].remote_filter(), "backup/#");
    // Untouched keys keep Postbox's defaults.
    assert_eq!(backup.queue_overflow, OverflowPolicy::Refuse);
    assert!(backup.tls.is_none());
}

#[test]
fn differences_and_ignored_lines_are_noted() {
    let result = import(GATEWAY, "mosquitto.conf");
    notes_at(
        &result,
        &[
            (7, "Postbox's default is 86400"),
            (7, "topic rules without a QoS are QoS 0"),
            (7, "$SYS/broker/connection/cloud/state"),
            (25, "no remote_clientid"),
        ],
    );
    let summary = result
        .notes
        .iter()
        .find(|n| n.contains("not bridge options were ignored"))
        .expect("summary note");
    // How many lines, which, and what they were.
    for part in ["5 line(s)", "lines 2-5, 24", "listener", "log_type"] {
        assert!(summary.contains(part), "{summary}");
    }
    // The imported config says where each bridge came from.
    assert!(
        result
            .toml
            .contains("# mosquitto.conf:25: connection backup"),
        "{}",
        result.toml
    );
}

/// A certificate-looking file `name` in `dir` (a `tempfile` directory, removed when dropped),
/// by the path the imported config names it with.
fn pem_in(dir: &tempfile::TempDir, name: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, "-----BEGIN CERTIFICATE-----\n").expect("write");
    path.display().to_string()
}

#[test]
fn tls_options() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = (
        pem_in(&dir, "ca.pem"),
        pem_in(&dir, "c.pem"),
        pem_in(&dir, "k.pem"),
    );
    let text = format!(
        "connection secure\naddress broker.example:8883\nbridge_cafile {ca}\n\
         bridge_certfile {cert}\nbridge_keyfile {key}\nbridge_alpn x-amzn-mqtt-ca\n\
         bridge_insecure true\nbridge_tls_version tlsv1.3\ntopic a/# out 1\n\
         connection os\naddress other:8883\nbridge_tls_use_os_certs true\ntopic b in 1\n\
         connection capath\naddress third:8883\nbridge_capath /etc/ssl/certs\n\
         bridge_identity me\nbridge_psk 0a0b\ntopic c out 1\n\
         connection plain\naddress fourth\nbridge_alpn mqtt\ntopic d out 1\n"
    );
    let result = import(&text, "mosquitto.conf");
    let config = load(&result);
    let tls = config.bridges[0].tls.as_ref().expect("tls");
    assert_eq!(tls.ca.as_ref().map(|p| p.display().to_string()), Some(ca));
    assert_eq!(
        tls.cert.as_ref().map(|p| p.display().to_string()),
        Some(cert)
    );
    assert_eq!(tls.key.as_ref().map(|p| p.display().to_string()), Some(key));
    assert_eq!(tls.alpn, ["x-amzn-mqtt-ca"]);
    assert!(
        !tls.insecure,
        "bridge_insecure only skipped the host name check"
    );
    note_at(&result, 7, "skips only the host name check");
    note_at(&result, 8, "TLS 1.2 or 1.3");
    let os = config.bridges[1].tls.as_ref().expect("os certs: TLS on");
    assert!(os.ca.is_none());
    assert!(config.bridges[2].tls.is_some(), "capath still means TLS");
    notes_at(
        &result,
        &[
            (16, "concatenate"),
            (17, "TLS-PSK is not supported"),
            (18, "TLS-PSK is not supported"),
        ],
    );
    assert!(
        config.bridges[3].tls.is_none(),
        "ALPN alone is plain TCP in Mosquitto"
    );
    note_at(&result, 20, "plain TCP");
}

#[test]
fn topic_line_forms() {
    let text = "connection t\naddress h\n\
                topic a\n\
                topic b IN\n\
                topic c both 2\n\
                topic d out 1 l/ r/\n\
                topic \"with space/#\" in 1 \"\" \"\"\n\
                topic e out 1 l/\n\
                topic \"\" out 1 only-local \"\"\n\
                topic f sideways 1\n\
                topic g out 3\n\
                topic h out 1 l/ r/ extra\n";
    let result = import(text, "mosquitto.conf");
    let config = load(&result);
    let rules: Vec<(String, Direction, u8, String, String)> = config.bridges[0]
        .topics
        .iter()
        .map(|t| {
            (
                t.pattern.clone(),
                t.direction,
                t.qos,
                t.local_prefix.clone(),
                t.remote_prefix.clone(),
            )
        })
        .collect();
    let r = |p: &str, d, q, l: &str, rp: &str| (p.to_owned(), d, q, l.to_owned(), rp.to_owned());
    assert_eq!(
        rules,
        [
            r("a", Direction::Out, 0, "", ""),
            r("b", Direction::In, 0, "", ""),
            r("c", Direction::Both, 2, "", ""),
            r("d", Direction::Out, 1, "l/", "r/"),
            r("with space/#", Direction::In, 1, "", ""),
            r("e", Direction::Out, 1, "l/", ""),
            r("h", Direction::Out, 1, "l/", "r/"),
        ]
    );
    notes_at(
        &result,
        &[
            (9, "needs both a local and a remote prefix"),
            (10, "unknown direction `sideways`"),
            (11, "QoS `3` is not 0, 1 or 2"),
            (12, "words after the remote prefix ignored: extra"),
        ],
    );
}

#[test]
fn options_without_an_equivalent_are_noted() {
    let text = "connection c\naddress h:1883\ntopic a out 1\nremote_clientid c\n\
                start_type once\nnotification_topic gw/state\nlocal_clientid x\n\
                bridge_max_packet_size 1000\nbridge_receive_maximum 5\n\
                restart_timeout 1 10 30\nbridge_protocol_version mqttv31\n\
                local_cleansession true\nnotifications_local_only true\n\
                bridge_attempt_unsubscribe false\nbridge_bind_address 10.0.0.1\n\
                include_dir /etc/mosquitto/conf.d\nkeepalive_interval 2\n\
                bridge_session_expiry_interval 3600\n";
    let result = import(text, "mosquitto.conf");
    let config = load(&result);
    let b = &config.bridges[0];
    assert_eq!(b.start, StartMode::Automatic);
    assert_eq!(b.restart_timeout, [1, 10]);
    assert_eq!(b.protocol, BridgeProtocol::V3_1_1);
    assert_eq!(b.keep_alive, 60, "an invalid line is not used");
    notes_at(
        &result,
        &[
            (5, "imported as `automatic`"),
            (6, "$SYS/broker/connection/<name>/state only"),
            (7, "`$bridge/<name>`"),
            (8, "not mapped"),
            (9, "not mapped"),
            (10, "stable = 30 s"),
            (11, "`mqttv31` imported as 3.1.1"),
            (12, "always durable"),
            (13, "not mapped"),
            (14, "not mapped"),
            (15, "not mapped"),
            (16, "were not read"),
            (17, "minimum is 5 seconds; line ignored"),
        ],
    );
    // v3.1.1 sends no session expiry, so no note about it; the one given is kept for v5.
    assert!(
        !result.notes.iter().any(|n| n.contains("86400")),
        "{:#?}",
        result.notes
    );
}

#[test]
fn names_are_made_safe_and_unique() {
    let text = "topic early\nconnection site/a+b\naddress h\ntopic a\n\
                connection site_a_b\naddress h\ntopic a\nconnection\naddress h\ntopic a\n";
    let result = import(text, "mosquitto.conf");
    let config = load(&result);
    let names: Vec<&str> = config.bridges.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["site_a_b", "site_a_b-2", "bridge3"]);
    notes_at(
        &result,
        &[
            (1, "before any `connection` line"),
            (2, "replaced"),
            (5, "appears twice"),
            (8, "without a name"),
        ],
    );
}

#[test]
fn missing_addresses_and_topics_are_noted() {
    let result = import("connection lonely\naddress h:99999\n", "mosquitto.conf");
    notes_at(
        &result,
        &[
            (2, "not a port"),
            (1, "has no address"),
            (1, "has no topic line"),
        ],
    );
    // The TOML parses; it does not validate until the user completes it.
    let err = Config::from_toml_str(&result.toml, "x").expect_err("incomplete");
    assert!(err.to_string().contains("bridge[0].addresses"), "{err}");
}

#[test]
fn a_file_without_bridges_imports_to_nothing() {
    let result = import("listener 1883\nallow_anonymous true\n", "mosquitto.conf");
    assert_eq!(load(&result), Config::default());
    assert!(result
        .notes
        .iter()
        .any(|n| n.contains("no `connection` stanza")));
}

#[test]
fn strings_are_quoted_for_toml() {
    let text = "connection q\naddress h\ntopic a\nremote_username \u{e9}\u{1}\n\
                remote_password a\"b\\c\tend \n";
    let result = import(text, "mosquitto.conf");
    let config = load(&result);
    assert_eq!(config.bridges[0].password.as_deref(), Some("a\"b\\c\tend "));
    assert_eq!(config.bridges[0].username.as_deref(), Some("\u{e9}\u{1}"));
}

#[test]
fn a_password_without_a_user_name_is_noted() {
    let result = import(
        "connection q\naddress h\ntopic a\npassword p\n",
        "mosquitto.conf",
    );
    note_at(&result, 1, "remote_password without remote_username");
}
