//! The TOML `bridge import` prints, written by hand rather than serialized: each bridge
//! carries a comment naming the line it came from, and keys whose Mosquitto default differs
//! say so.

use std::fmt::Write as _;

use super::Stanza;
use crate::config::{BridgeConfig, BridgeProtocol, Direction, StartMode};

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One `[[bridge]]` section: the keys whose value is not Postbox's default, plus `name`,
/// `addresses` and `protocol` always (Mosquitto's and Postbox's default protocol differ).
pub(super) fn write_bridge(out: &mut String, origin: &str, stanza: &Stanza) {
    let c = &stanza.config;
    let d = BridgeConfig::default();
    let _ = writeln!(out, "\n# {origin}:{}: connection {}", stanza.line, c.name);
    let _ = writeln!(out, "[[bridge]]");
    let _ = writeln!(out, "name = {}", quoted(&c.name));
    let addresses: Vec<String> = c.addresses.iter().map(|a| quoted(a)).collect();
    let _ = writeln!(out, "addresses = [{}]", addresses.join(", "));
    if c.round_robin {
        let _ = writeln!(out, "round_robin = true");
    }
    match c.protocol {
        BridgeProtocol::V3_1_1 => {
            let _ = writeln!(
                out,
                "protocol = \"3.1.1\"  # \"5\" adds No Local, properties and the hop count"
            );
        }
        BridgeProtocol::V5 => {
            let _ = writeln!(out, "protocol = \"5\"");
        }
    }
    for (key, value) in [
        ("client_id", &c.client_id),
        ("username", &c.username),
        ("password", &c.password),
    ] {
        if let Some(v) = value {
            let _ = writeln!(out, "{key} = {}", quoted(v));
        }
    }
    if c.keep_alive != d.keep_alive {
        let _ = writeln!(out, "keep_alive = {}", c.keep_alive);
    }
    if c.clean_start {
        let _ = writeln!(out, "clean_start = true");
    }
    if c.protocol == BridgeProtocol::V5 {
        let _ = writeln!(out, "session_expiry = {}", c.session_expiry);
    }
    if c.restart_timeout != d.restart_timeout {
        let [base, cap] = c.restart_timeout;
        let _ = writeln!(out, "restart_timeout = [{base}, {cap}]");
    }
    if c.start == StartMode::Lazy {
        let _ = writeln!(out, "start = \"lazy\"");
    }
    if c.threshold != d.threshold {
        let _ = writeln!(out, "threshold = {}", c.threshold);
    }
    if c.idle_timeout != d.idle_timeout {
        let _ = writeln!(out, "idle_timeout = {}", c.idle_timeout);
    }
    for (key, value, default) in [
        ("keep_retain", c.keep_retain, d.keep_retain),
        ("try_private", c.try_private, d.try_private),
        ("notifications", c.notifications, d.notifications),
    ] {
        if value != default {
            let _ = writeln!(out, "{key} = {value}");
        }
    }
    if let (Some(tls), true) = (&c.tls, stanza.tls) {
        let _ = writeln!(out, "\n[bridge.tls]");
        for (key, path) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
            if let Some(p) = path {
                let _ = writeln!(out, "{key} = {}", quoted(&p.display().to_string()));
            }
        }
        if tls.ca.is_none() {
            let _ = writeln!(
                out,
                "# no `ca`: the system's trust store verifies the remote"
            );
        }
        if !tls.alpn.is_empty() {
            let alpn: Vec<String> = tls.alpn.iter().map(|a| quoted(a)).collect();
            let _ = writeln!(out, "alpn = [{}]", alpn.join(", "));
        }
    }
    for rule in &c.topics {
        let _ = writeln!(out, "\n[[bridge.topic]]");
        let _ = writeln!(out, "pattern = {}", quoted(&rule.pattern));
        let direction = match rule.direction {
            Direction::Out => "out",
            Direction::In => "in",
            Direction::Both => "both",
        };
        let _ = writeln!(out, "direction = \"{direction}\"");
        let _ = writeln!(out, "qos = {}", rule.qos);
        for (key, value) in [
            ("local_prefix", &rule.local_prefix),
            ("remote_prefix", &rule.remote_prefix),
        ] {
            if !value.is_empty() {
                let _ = writeln!(out, "{key} = {}", quoted(value));
            }
        }
    }
}
