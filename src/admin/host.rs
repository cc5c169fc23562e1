//! The Host check of the admin API and the status page (issue 35, finding 5): a request must
//! name this broker, or it is answered 421 Misdirected Request.
//!
//! Why: a web page an operator opens can have its name rebound to 127.0.0.1 (DNS rebinding);
//! the browser then sends the page's requests, with its own name as Host, to the API on
//! loopback, which trusts loopback. The browser always sends the name it resolved, so
//! refusing names the broker does not answer to closes that path. An IP literal as Host is
//! not such a name (a page at `http://10.0.0.5:9883/` is the API's own origin), so the address
//! the request arrived on and the loopback addresses pass, as does `localhost` and any name
//! in `admin.allowed_hosts`. `/metrics` and the probes are not checked: Prometheus and the
//! kubelet send the pod's address or a service name, and those endpoints change nothing.

use std::net::{IpAddr, SocketAddr};

/// The Host names the API answers besides `localhost` and addresses (`admin.allowed_hosts`,
/// lower-cased, IPv6 brackets removed).
#[derive(Debug, Clone, Default)]
pub(crate) struct AllowedHosts {
    names: Box<[Box<str>]>,
}

impl AllowedHosts {
    /// The configured names (validated by `config`: no port, no wildcard).
    pub(crate) fn new(names: &[String]) -> AllowedHosts {
        AllowedHosts {
            names: names
                .iter()
                .map(|n| bare(n).to_ascii_lowercase().into_boxed_str())
                .collect(),
        }
    }

    /// Whether a request that arrived on `local` with Host value `host` (`None`: no Host
    /// header and no authority) names this broker.
    pub(crate) fn allows(&self, host: Option<&[u8]>, local: SocketAddr) -> bool {
        let Some(name) = host
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(host_part)
        else {
            return false;
        };
        let name = bare(name);
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            if ip.is_loopback() || ip == local.ip().to_canonical() {
                return true;
            }
        }
        self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// `[::1]` → `::1`; anything else as it is.
fn bare(name: &str) -> &str {
    name.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name)
}

/// The host of a Host header value (`name`, `name:port`, `[v6]`, `[v6]:port`), brackets kept;
/// `None` when the value is not shaped like one.
fn host_part(value: &str) -> Option<&str> {
    let value = value.trim();
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if value.starts_with('[') {
        let end = value.find(']')?;
        let after = &value[end + 1..];
        return (after.is_empty() || after.strip_prefix(':').is_some_and(digits))
            .then(|| &value[..=end]);
    }
    let host = match value.split_once(':') {
        None => value,
        Some((host, port)) if digits(port) => host,
        Some(_) => return None,
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_this_broker_pass_and_others_do_not() {
        let local: SocketAddr = "10.0.0.5:9883".parse().expect("addr");
        let hosts = AllowedHosts::new(&["Broker.Example".to_owned(), "[fd00::1]".to_owned()]);
        for ok in [
            "localhost",
            "LOCALHOST:9883",
            "localhost.",
            "127.0.0.1",
            "127.0.0.1:9883",
            "[::1]:9883",
            "10.0.0.5:9883",
            "10.0.0.5",
            "broker.example:80",
            "[fd00::1]:9883",
        ] {
            assert!(hosts.allows(Some(ok.as_bytes()), local), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:9883",
            "localhost.attacker.example",
            "10.0.0.6:9883",
            "broker.example:x",
            "",
            "[::1",
            "a:b:c",
        ] {
            assert!(!hosts.allows(Some(refused.as_bytes()), local), "{refused}");
        }
        assert!(!hosts.allows(None, local), "no Host at all");
        assert!(!hosts.allows(Some(b"\xff"), local), "not UTF-8");
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:9883".parse().expect("addr");
        assert!(hosts.allows(Some(b"10.0.0.5:9883"), mapped), "dual-stack");
    }
}
