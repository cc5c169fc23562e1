//! The PROXY protocol (`HAProxy`'s, versions 1 and 2), for listeners behind a load balancer:
//! the balancer opens the TCP connection, so the socket's peer is the balancer; the header it
//! sends first names the real client, which then reaches logs, per-address limits and ACL
//! patterns in place of the balancer's address.
//!
//! The header is read in the connection's task (bounded by the CONNECT deadline), byte-exact:
//! nothing after it is consumed, so the MQTT stream (or the TLS handshake) follows untouched.
//! Parsing is the `ppp` crate's. A listener with `proxy_protocol = true` requires the header:
//! a connection without one is closed, because trusting a client-supplied address would let
//! anyone pose as anyone.
//!
//! Must not: consume a byte past the header; accept a connection without one.

use std::net::SocketAddr;

use ppp::{v1, v2, HeaderResult};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest version 1 header (the spec's 107 bytes, CRLF included).
const V1_MAX: usize = 107;
/// The version 2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2 headers longer than this (their TLVs) are refused: a balancer's are far smaller.
const V2_MAX: usize = 4096;

/// Why a connection's PROXY header was not accepted; the connection is closed.
#[derive(Debug, Error)]
pub(crate) enum ProxyError {
    /// The socket failed or closed before the header was complete.
    #[error("reading the PROXY header: {0}")]
    Io(#[from] std::io::Error),
    /// The first bytes are not a PROXY header (a client that bypassed the balancer).
    #[error("no PROXY protocol header")]
    Missing,
    /// A header that does not parse.
    #[error("malformed PROXY header: {0}")]
    Malformed(String),
}

/// Reads one PROXY header from `stream`. The real client's address, or `None` when the header
/// names none (v1 `UNKNOWN`, v2 `LOCAL`: the balancer's own health checks), when the socket's
/// peer stands.
///
/// # Errors
///
/// [`ProxyError`] when the header is missing, malformed or cut short.
pub(crate) async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<Option<SocketAddr>, ProxyError> {
    // 16 bytes: all of a v2 fixed header, and more than any v1 header's shortest form
    // ("PROXY UNKNOWN\r\n" is 15) would need, so read 8 first and decide.
    let mut buf = vec![0u8; 8];
    stream.read_exact(&mut buf).await?;
    if buf.starts_with(b"PROXY ") {
        // v1: up to CRLF, a byte at a time so nothing after it is taken.
        while !buf.ends_with(b"\r\n") {
            if buf.len() >= V1_MAX {
                return Err(ProxyError::Malformed("v1 header without CRLF".to_owned()));
            }
            buf.push(stream.read_u8().await?);
        }
    } else if V2_SIGNATURE.starts_with(&buf) {
        buf.resize(16, 0);
        stream.read_exact(&mut buf[8..]).await?;
        if &buf[..12] != V2_SIGNATURE {
            return Err(ProxyError::Missing);
        }
        let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
        if len > V2_MAX {
            return Err(ProxyError::Malformed(format!("v2 header of {len} bytes")));
        }
        buf.resize(16 + len, 0);
        stream.read_exact(&mut buf[16..]).await?;
    } else {
        return Err(ProxyError::Missing);
    }
    parse(&buf)
}

/// The client address in a complete header.
fn parse(header: &[u8]) -> Result<Option<SocketAddr>, ProxyError> {
    match HeaderResult::parse(header) {
        HeaderResult::V1(Ok(h)) => Ok(match h.addresses {
            v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            v1::Addresses::Unknown => None,
        }),
        HeaderResult::V2(Ok(h)) => Ok(match (h.command, h.addresses) {
            (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            // LOCAL (the balancer's own check), or no IP address to name.
            _ => None,
        }),
        HeaderResult::V1(Err(e)) => Err(ProxyError::Malformed(format!("{e:?}"))),
        HeaderResult::V2(Err(e)) => Err(ProxyError::Malformed(format!("{e:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Writes `bytes` into a pipe and reads a header from its other end; returns it with the
    /// bytes left behind it.
    async fn read_from(bytes: &[u8]) -> (Result<Option<SocketAddr>, ProxyError>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(8192);
        client.write_all(bytes).await.expect("write");
        drop(client);
        let header = read_header(&mut server).await;
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
        (header, rest)
    }

    #[tokio::test]
    async fn v1_names_the_client_and_leaves_the_mqtt_bytes() {
        let (addr, rest) =
            read_from(b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 1883\r\n\x10\x0c\x00\x04MQTT").await;
        assert_eq!(
            addr.expect("parsed"),
            Some("203.0.113.7:51234".parse().expect("addr"))
        );
        assert_eq!(rest, b"\x10\x0c\x00\x04MQTT");
        let (addr, _) = read_from(b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 1883\r\n").await;
        assert_eq!(
            addr.expect("parsed"),
            Some("[2001:db8::1]:4000".parse().expect("addr"))
        );
        let (addr, _) = read_from(b"PROXY UNKNOWN\r\nrest").await;
        assert_eq!(addr.expect("parsed"), None);
    }

    #[tokio::test]
    async fn v2_names_the_client_and_local_names_none() {
        let header = v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Proxy,
            v2::Protocol::Stream,
            (
                "198.51.100.9:40000".parse::<SocketAddr>().expect("addr"),
                "192.0.2.1:1883".parse::<SocketAddr>().expect("addr"),
            ),
        )
        .build()
        .expect("build");
        let mut bytes = header.clone();
        bytes.extend_from_slice(b"MQTT");
        let (addr, rest) = read_from(&bytes).await;
        assert_eq!(
            addr.expect("parsed"),
            Some("198.51.100.9:40000".parse().expect("addr"))
        );
        assert_eq!(rest, b"MQTT");
        let local = v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Local,
            v2::Protocol::Unspecified,
            v2::Addresses::Unspecified,
        )
        .build()
        .expect("build");
        assert_eq!(read_from(&local).await.0.expect("parsed"), None);
    }

    #[tokio::test]
    async fn no_header_or_a_broken_one_is_refused() {
        // A plain MQTT CONNECT: a client that did not come through the balancer.
        let (r, _) = read_from(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00").await;
        assert!(matches!(r, Err(ProxyError::Missing)), "{r:?}");
        let (r, _) = read_from(b"PROXY TCP4 not-an-address 192.0.2.1 1 2\r\n").await;
        assert!(matches!(r, Err(ProxyError::Malformed(_))), "{r:?}");
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(120));
        let (r, _) = read_from(long.as_bytes()).await;
        assert!(matches!(r, Err(ProxyError::Malformed(_))), "{r:?}");
        let (r, _) = read_from(b"PROXY TC").await;
        assert!(matches!(r, Err(ProxyError::Io(_))), "cut short: {r:?}");
    }
}
