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

use axum::http::{header, HeaderMap, Uri};

/// The host a request names, for [`AllowedHosts::allows`], or why the request is refused
/// with 400 Bad Request (issue 35, third adversarial pass).
///
/// Why: the check must see the host the server acts for, not one of several. RFC 9112 §3.2:
/// "A server MUST respond with a 400 (Bad Request) status code to any HTTP/1.1 request
/// message that … contains more than one Host header field line"; before, the first was
/// checked while a proxy in front may route by the last. §3.2.2: a server receiving the
/// absolute-form (`GET http://name/path`) "MUST ignore the received Host header field (if
/// any) and instead use the host information of the request-target"; before, the Host
/// header was checked and the URI's authority ignored, so a request for
/// `http://attacker.example/` with `Host: localhost` passed. A userinfo part in that
/// authority (`http://localhost@attacker.example/`) is refused: RFC 9110 §4.2.4 deprecates
/// it for http URIs precisely because it disguises the host.
pub(crate) fn request_host<'r>(
    headers: &'r HeaderMap,
    uri: &'r Uri,
) -> Result<Option<&'r [u8]>, &'static str> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    match uri.authority() {
        Some(authority) if authority.as_str().contains('@') => {
            Err("a user name in the request's authority")
        }
        Some(authority) => Ok(Some(authority.as_str().as_bytes())),
        None => Ok(first.map(axum::http::HeaderValue::as_bytes)),
    }
}

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
    fn one_host_header_or_the_absolute_forms_authority() {
        let mut headers = HeaderMap::new();
        headers.append(header::HOST, "localhost".parse().expect("value"));
        let origin: Uri = "/api/v1/sessions".parse().expect("uri");
        assert_eq!(request_host(&headers, &origin), Ok(Some(&b"localhost"[..])));
        let absolute: Uri = "http://attacker.example:9883/api/v1/sessions"
            .parse()
            .expect("uri");
        assert_eq!(
            request_host(&headers, &absolute),
            Ok(Some(&b"attacker.example:9883"[..])),
            "the authority, not the Host header"
        );
        let userinfo: Uri = "http://localhost@attacker.example/x".parse().expect("uri");
        assert!(request_host(&headers, &userinfo).is_err());
        headers.append(header::HOST, "attacker.example".parse().expect("value"));
        assert!(request_host(&headers, &origin).is_err(), "two Host headers");
        assert_eq!(request_host(&HeaderMap::new(), &origin), Ok(None));
    }

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
