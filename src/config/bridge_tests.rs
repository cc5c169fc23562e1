//! `[[bridge]]` rules: every rule refuses with the key and the line of the offending value
//! (or of the `[[bridge]]` entry missing it), and the boundary values pass.

use super::*;
use crate::config::tests::{invalid_at, parse};
use crate::config::{Config, ConfigError};

/// A valid bridge whose line 4 is `extra` (a key of `[[bridge]]`), topic rule on line 7+.
fn bridge_with(extra: &str) -> String {
    format!(
        "[[bridge]]\nname = \"cloud\"\naddresses = [\"127.0.0.1:1884\"]\n{extra}\n\n\
         [[bridge.topic]]\npattern = \"sensors/#\"\n"
    )
}

/// A valid bridge whose topic rule has `extra` on line 6.
fn rule_with(extra: &str) -> String {
    format!(
        "[[bridge]]\nname = \"cloud\"\naddresses = [\"127.0.0.1:1884\"]\n\
         [[bridge.topic]]\npattern = \"sensors/#\"\n{extra}\n"
    )
}

fn assert_invalid(text: &str, key: &str, line: usize, needle: &str) {
    let (k, l, message) = invalid_at(text);
    assert_eq!((k.as_str(), l), (key, Some(line)), "{text}\n{message}");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    let shown = parse(text).expect_err("invalid").to_string();
    assert!(
        shown.starts_with(&format!("test.toml:{line}: invalid value for key `{key}`")),
        "{shown}"
    );
}

#[test]
fn a_minimal_bridge_loads_with_the_defaults() {
    let c = parse(&bridge_with("")).expect("valid");
    let b = &c.bridges[0];
    assert_eq!(b.name, "cloud");
    assert_eq!(b.topics[0].qos, 1);
    assert_eq!(b.topics[0].direction, Direction::Out);
    assert_eq!(b.local_session_id(), "$bridge/cloud");
    assert_eq!(b.remote_client_id(), "postbox-bridge-cloud");
    assert_eq!(b.topics[0].local_filter(), "sensors/#");
}

#[test]
fn name_rules() {
    assert_invalid(
        "[[bridge]]\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"a\"\n",
        "bridge[0].name",
        1,
        "needs a `name`",
    );
    for bad in ["a/b", "a+", "#", "tab\there", "x\u{7f}"] {
        let text = format!(
            "[[bridge]]\nname = {}\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"a\"\n",
            toml::Value::String(bad.to_owned())
        );
        assert_invalid(&text, "bridge[0].name", 2, "may not contain");
    }
    let long = "n".repeat(MAX_BRIDGE_NAME_LEN + 1);
    let text = format!(
        "[[bridge]]\nname = \"{long}\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"a\"\n"
    );
    assert_invalid(&text, "bridge[0].name", 2, "longer than");
    let ok = "n".repeat(MAX_BRIDGE_NAME_LEN);
    parse(&format!(
        "[[bridge]]\nname = \"{ok}\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"a\"\n"
    ))
    .expect("64 bytes is fine");
}

#[test]
fn names_are_unique() {
    let one =
        "[[bridge]]\nname = \"cloud\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"a\"\n";
    let text = format!("{one}{one}");
    assert_invalid(&text, "bridge[1].name", 7, "already the name of bridge[0]");
    let other = one.replace("cloud", "backup");
    let c = parse(&format!("{one}{other}")).expect("two names");
    assert_eq!(c.bridges.len(), 2);
}

#[test]
fn address_rules() {
    assert_invalid(
        "[[bridge]]\nname = \"cloud\"\n[[bridge.topic]]\npattern = \"a\"\n",
        "bridge[0].addresses",
        1,
        "at least one",
    );
    assert_invalid(
        "[[bridge]]\nname = \"c\"\naddresses = []\n[[bridge.topic]]\npattern = \"a\"\n",
        "bridge[0].addresses",
        3,
        "at least one",
    );
    for (bad, needle) in [
        ("broker", "has no port"),
        ("broker:0", "1 to 65535"),
        ("broker:65536", "1 to 65535"),
        ("broker:x", "1 to 65535"),
        (":1883", "host is empty"),
        ("::1:1883", "needs brackets"),
        ("[::1]", "not an address"),
        ("[nope]:1883", "not an IPv6 address"),
        ("a b:1883", "not a host name"),
    ] {
        let text = format!(
            "[[bridge]]\nname = \"c\"\naddresses = [\n  \"ok:1883\",\n  \"{bad}\",\n]\n\
             [[bridge.topic]]\npattern = \"a\"\n"
        );
        assert_invalid(&text, "bridge[0].addresses[1]", 5, needle);
    }
    let c = parse(
        "[[bridge]]\nname = \"c\"\naddresses = [\"a.example:8883\", \"10.0.0.1:1\", \
         \"[2001:db8::1]:65535\"]\n[[bridge.topic]]\npattern = \"a\"\n",
    )
    .expect("valid addresses");
    assert_eq!(c.bridges[0].addresses.len(), 3);
}

#[test]
fn topic_rules_are_needed_and_checked() {
    assert_invalid(
        "\n[[bridge]]\nname = \"cloud\"\naddresses = [\"h:1\"]\n",
        "bridge[0].topic",
        2,
        "at least one topic rule",
    );
    // The second rule of the second bridge: the key names both indexes and the line is the
    // rule's own.
    let text = "[[bridge]]\nname = \"a\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"x\"\n\
                [[bridge]]\nname = \"b\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"x\"\n\
                [[bridge.topic]]\npattern = \"x/#/y\"\n";
    assert_invalid(
        text,
        "bridge[1].topic[1].pattern",
        12,
        "not a valid topic filter",
    );
    assert_invalid(
        &rule_with("qos = 3"),
        "bridge[0].topic[0].qos",
        6,
        "0, 1 or 2",
    );
    for bad in ["a+b", "#/a", "a/#/b"] {
        let text = rule_with("").replace("sensors/#", bad);
        assert_invalid(
            &text,
            "bridge[0].topic[0].pattern",
            5,
            "not a valid topic filter",
        );
    }
    for (field, bad) in [("local_prefix", "a/+/"), ("remote_prefix", "#")] {
        let text = rule_with(&format!("{field} = \"{bad}\""));
        assert_invalid(
            &text,
            &format!("bridge[0].topic[0].{field}"),
            6,
            "plain topic prefix",
        );
    }
    // prefix + pattern must be a filter: `site1` + `sensors/#` is `site1sensors/#`... valid,
    // but `site1` + `#` is not.
    let text = rule_with("remote_prefix = \"site1\"").replace("sensors/#", "#");
    assert_invalid(
        &text,
        "bridge[0].topic[0].remote_prefix",
        6,
        "usually ends with `/`",
    );
    let text = rule_with("local_prefix = \"$share/g/\"");
    assert_invalid(
        &text,
        "bridge[0].topic[0].local_prefix",
        6,
        "shared subscription",
    );
    for text in [
        rule_with("qos = 0\ndirection = \"both\"\nlocal_prefix = \"\"\nremote_prefix = \"site1/\""),
        rule_with("qos = 2\ndirection = \"in\""),
    ] {
        parse(&text).expect("valid rule");
    }
}

#[test]
fn an_empty_pattern_needs_both_prefixes() {
    // Mosquitto's remapping table: `topic "" out 0 local remote` maps one topic to another.
    let base =
        "[[bridge]]\nname = \"c\"\naddresses = [\"h:1\"]\n[[bridge.topic]]\npattern = \"\"\n";
    let c = parse(&format!(
        "{base}local_prefix = \"here/t\"\nremote_prefix = \"there/t\"\n"
    ))
    .expect("both prefixes");
    assert_eq!(c.bridges[0].topics[0].remote_filter(), "there/t");
    for prefixes in ["local_prefix = \"l\"", "remote_prefix = \"r\"", ""] {
        assert_invalid(
            &format!("{base}{prefixes}\n"),
            "bridge[0].topic[0].pattern",
            5,
            "needs both",
        );
    }
}

#[test]
fn keep_alive_is_zero_or_at_least_five() {
    assert_invalid(
        &bridge_with("keep_alive = 4"),
        "bridge[0].keep_alive",
        4,
        "below 5",
    );
    assert_invalid(
        &bridge_with("keep_alive = 1"),
        "bridge[0].keep_alive",
        4,
        "reconnects",
    );
    parse(&bridge_with("keep_alive = 0")).expect("0 = no keep-alive");
    parse(&bridge_with("keep_alive = 5")).expect("5 is the minimum");
}

#[test]
fn numeric_ranges() {
    for (extra, key, needle) in [
        (
            "restart_timeout = [0, 30]",
            "restart_timeout",
            "at least 1 second",
        ),
        (
            "restart_timeout = [31, 30]",
            "restart_timeout",
            "above the cap",
        ),
        ("inflight = 0", "inflight", "1..=65535"),
        (
            "max_queued_messages = 0",
            "max_queued_messages",
            "at least 1",
        ),
        ("threshold = 0", "threshold", "at least 1"),
        (
            "start = \"lazy\"\nidle_timeout = 0",
            "idle_timeout",
            "as soon as it connected",
        ),
    ] {
        let line = if key == "idle_timeout" { 5 } else { 4 };
        assert_invalid(
            &bridge_with(extra),
            &format!("bridge[0].{key}"),
            line,
            needle,
        );
    }
    for extra in [
        "restart_timeout = [1, 1]",
        "inflight = 65535",
        "max_queued_messages = 1\nmax_queued_bytes = 0",
        "threshold = 1",
        "idle_timeout = 0",
    ] {
        parse(&bridge_with(extra)).expect(extra);
    }
}

#[test]
fn password_needs_a_user_name_on_3_1_1() {
    assert_invalid(
        &bridge_with("protocol = \"3.1.1\"\npassword = \"p\""),
        "bridge[0].password",
        5,
        "MQTT-3.1.2-22",
    );
    parse(&bridge_with(
        "protocol = \"3.1.1\"\nusername = \"u\"\npassword = \"p\"",
    ))
    .expect("both");
    // MQTT 5 allows a password without a user name (3.1.2.9).
    parse(&bridge_with("protocol = \"5\"\npassword = \"p\"")).expect("v5");
}

#[test]
fn client_id_shape() {
    assert_invalid(
        &bridge_with("client_id = \"\""),
        "bridge[0].client_id",
        4,
        "not be empty",
    );
    assert_invalid(
        &bridge_with("client_id = \"a\\u0000b\""),
        "bridge[0].client_id",
        4,
        "NUL",
    );
    let long = "x".repeat(MAX_CLIENT_ID_LEN + 1);
    assert_invalid(
        &bridge_with(&format!("client_id = \"{long}\"")),
        "bridge[0].client_id",
        4,
        "at most 65535",
    );
    // Its own prefix is irrelevant on the remote.
    parse(&bridge_with("client_id = \"$bridge/gw1\"")).expect("remote id");
}

/// `content` written to `name` in `dir` (a `tempfile` directory, removed when dropped), by the
/// path a config names it with.
fn file_in(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write");
    path.display().to_string()
}

#[test]
fn tls_files_go_together_and_must_be_readable() {
    let files = tempfile::tempdir().expect("temp dir");
    let ca = file_in(&files, "ca.pem", "pem");
    let cert = file_in(&files, "cert.pem", "pem");
    let key = file_in(&files, "key.pem", "pem");
    let empty = file_in(&files, "empty.pem", "");
    let tls = |body: &str| bridge_with(&format!("[bridge.tls]\n{body}"));
    assert_invalid(
        &tls(&format!("ca = \"{ca}\"\ncert = \"{cert}\"")),
        "bridge[0].tls.cert",
        6,
        "set `key` too",
    );
    assert_invalid(
        &tls(&format!("key = \"{key}\"")),
        "bridge[0].tls.key",
        5,
        "both or neither",
    );
    assert_invalid(
        &tls("ca = \"/nonexistent/ca.pem\""),
        "bridge[0].tls.ca",
        5,
        "cannot read",
    );
    assert_invalid(
        &tls(&format!("ca = \"{empty}\"")),
        "bridge[0].tls.ca",
        5,
        "is empty",
    );
    assert_invalid(
        &tls(&format!(
            "cert = \"{cert}\"\nkey = \"/nonexistent/key.pem\""
        )),
        "bridge[0].tls.key",
        6,
        "cannot read",
    );
    assert_invalid(
        &tls("server_name = \"not a name\""),
        "bridge[0].tls.server_name",
        5,
        "DNS",
    );
    assert_invalid(
        &tls("alpn = [\"mqtt\", \"\"]"),
        "bridge[0].tls.alpn[1]",
        5,
        "1 to 255",
    );
    let c = parse(&tls(&format!(
        "ca = \"{ca}\"\ncert = \"{cert}\"\nkey = \"{key}\"\nserver_name = \"broker.example\"\n\
         alpn = [\"mqtt\"]"
    )))
    .expect("complete TLS");
    assert!(c.bridges[0].tls.as_ref().is_some_and(|t| t.key.is_some()));
    parse(&tls("insecure = true")).expect("system trust store, no files");
}

#[test]
fn validate_without_text_names_the_key() {
    let mut config = Config::default();
    config.bridges.push(BridgeConfig {
        name: "x".to_owned(),
        addresses: vec!["h:1".to_owned()],
        ..BridgeConfig::default()
    });
    match config.validate() {
        Err(ConfigError::Invalid { key, line, .. }) => {
            assert_eq!((key.as_str(), line), ("bridge[0].topic", None));
        }
        other => panic!("{other:?}"),
    }
}
