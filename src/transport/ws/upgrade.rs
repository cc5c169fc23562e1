//! The server side of the WebSocket opening handshake (RFC 6455 §4.2): reads the client's HTTP
//! request (bounded), checks it against the listener's rules and answers it, 101 or a refusal.
//!
//! The request is parsed by `httparse`; what an answer needs (the accept key, the
//! subprotocol) is computed here. Bytes that arrive behind the request in the same read are
//! the start of the frame stream (a client may send its CONNECT frame right behind the
//! request) and are handed on, not dropped.
//!
//! Must not: read past `MAX_REQUEST` bytes for the request; keep its buffer beyond the
//! upgrade; hold a large buffer inside the future (every WebSocket connection's task would
//! keep its size for its whole life).

use base64::Engine as _;
use bytes::Bytes;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{UpgradeError, WsSettings};

/// Subprotocols a client may ask for: `mqtt` (MQTT 3.1.1 and 5.0 [MQTT-6.0.0-3]) and
/// `mqttv3.1` (MQTT 3.1 clients; Mosquitto accepts it too). The answer is the one asked for.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// The largest upgrade request read: browsers send well under 2 KiB (cookies of a large
/// site can take more); a longer request is refused with 431, so a client cannot make the
/// broker buffer an unbounded header before any MQTT.
const MAX_REQUEST: usize = 8 * 1024;

/// Header lines parsed at most (httparse needs a fixed array).
const MAX_HEADERS: usize = 64;

/// The GUID of RFC 6455 §1.3 the accept key is derived with.
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// An HTTP status for a refused upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Status(u16, &'static str);

const BAD_REQUEST: Status = Status(400, "Bad Request");
const FORBIDDEN: Status = Status(403, "Forbidden");
const NOT_FOUND: Status = Status(404, "Not Found");
const UPGRADE_REQUIRED: Status = Status(426, "Upgrade Required");
const TOO_LARGE: Status = Status(431, "Request Header Fields Too Large");

/// Reads the upgrade request from `stream`, answers it, and returns what came behind it.
///
/// # Errors
///
/// [`UpgradeError`] when the request is refused (the HTTP refusal has been sent) or the
/// stream failed or ended first.
pub(super) async fn handshake<S>(
    stream: &mut S,
    settings: &WsSettings,
) -> Result<Bytes, UpgradeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // On the heap: see the header's "must not".
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut filled = 0;
    loop {
        let n = stream
            .read(&mut buf[filled..])
            .await
            .map_err(UpgradeError::Io)?;
        if n == 0 {
            return Err(UpgradeError::Handshake(
                "the peer closed before its request ended",
            ));
        }
        filled += n;
        let verdict = match answer(&buf[..filled], settings) {
            Ok(Some(answered)) => Ok(answered),
            Ok(None) if filled < MAX_REQUEST => continue,
            Ok(None) => Err((
                UpgradeError::Handshake("upgrade request above 8 KiB"),
                TOO_LARGE,
            )),
            Err(refused) => Err(refused),
        };
        return match verdict {
            Ok((head_len, response)) => {
                write_all(stream, response.as_bytes()).await?;
                Ok(Bytes::copy_from_slice(&buf[head_len..filled]))
            }
            Err((error, status)) => {
                // A line a person reads in a browser or curl: what listens here and why this
                // request is not served.
                let body = format!(
                    "This is an MQTT over WebSocket listener: connect an MQTT client to path {} \
                     (subprotocol mqtt). Refused: {error}.\n",
                    settings.path
                );
                let mut response = format!(
                    "HTTP/1.1 {} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\n",
                    status.0,
                    status.1,
                    body.len()
                );
                if status == UPGRADE_REQUIRED {
                    response.push_str("Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n");
                }
                response.push_str("\r\n");
                response.push_str(&body);
                // The refusal is a courtesy: the error is what is reported.
                let _ = write_all(stream, response.as_bytes()).await;
                Err(error)
            }
        };
    }
}

/// Writes and flushes `bytes`.
async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    bytes: &[u8],
) -> Result<(), UpgradeError> {
    stream.write_all(bytes).await.map_err(UpgradeError::Io)?;
    stream.flush().await.map_err(UpgradeError::Io)
}

/// The answer to the request at the front of `bytes`: the request's length and the 101
/// response, `None` while the request is not complete, or why it is refused and with which
/// status.
fn answer(
    bytes: &[u8],
    settings: &WsSettings,
) -> Result<Option<(usize, String)>, (UpgradeError, Status)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((UpgradeError::Handshake("too many header lines"), TOO_LARGE))
        }
        Err(_) => return Err((UpgradeError::Handshake("not an HTTP request"), BAD_REQUEST)),
    };
    let key = check_request(&request)?;
    let chosen = check_rules(&request, settings)?;
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: {chosen}\r\n\r\n",
        accept_key(key)
    );
    Ok(Some((head_len, response)))
}

/// The values of every `name` header line.
fn values<'r>(
    request: &'r httparse::Request<'_, '_>,
    name: &'r str,
) -> impl Iterator<Item = &'r [u8]> {
    request
        .headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// The comma-separated tokens of every `name` header line, trimmed.
fn tokens<'r>(
    request: &'r httparse::Request<'_, '_>,
    name: &'r str,
) -> impl Iterator<Item = &'r str> {
    values(request, name)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// RFC 6455 §4.2.1: a GET over HTTP/1.1 asking to upgrade to `websocket`, version 13, with a
/// key; the key is returned.
fn check_request<'b>(
    request: &httparse::Request<'_, 'b>,
) -> Result<&'b [u8], (UpgradeError, Status)> {
    let refuse = |why| Err((UpgradeError::Handshake(why), BAD_REQUEST));
    if request.method != Some("GET") {
        return refuse("not a GET request");
    }
    if request.version != Some(1) {
        return refuse("not HTTP/1.1");
    }
    if !tokens(request, "upgrade").any(|t| t.eq_ignore_ascii_case("websocket")) {
        // A browser or curl pointed at the port: 426 names the upgrade it needs (RFC 9110
        // §15.5.22), and the body says what listens here (issue 37, item 4: an empty reply).
        return Err((
            UpgradeError::Handshake("no Upgrade: websocket"),
            UPGRADE_REQUIRED,
        ));
    }
    if !tokens(request, "connection").any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return refuse("no Connection: Upgrade");
    }
    if !values(request, "sec-websocket-version").any(|v| v.trim_ascii() == b"13") {
        return Err((
            UpgradeError::Handshake("not WebSocket version 13"),
            UPGRADE_REQUIRED,
        ));
    }
    let key = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("sec-websocket-key"))
        .map(|h| h.value.trim_ascii());
    match key {
        Some(key) if !key.is_empty() => Ok(key),
        _ => refuse("no Sec-WebSocket-Key"),
    }
}

/// What a refusal quotes of the client's path or origin: at most [`QUOTED`] characters, so a
/// refused upgrade logs a line, not the 8 KiB the request may carry (issue 35, thirteenth
/// adversarial pass, F4: 3,000 refused upgrades added 24.6 MB to the log in 0.2 s).
fn clipped(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

/// How much of a client's path or origin a refusal quotes.
const QUOTED: usize = 64;

/// The listener's rules: its path (404), the allowed origins (403), and the `mqtt`
/// subprotocol [MQTT-6.0.0-3] (400); the subprotocol the answer names is returned.
fn check_rules(
    request: &httparse::Request<'_, '_>,
    settings: &WsSettings,
) -> Result<&'static str, (UpgradeError, Status)> {
    let path = path_of(request.path.unwrap_or("/"));
    if path != settings.path {
        return Err((UpgradeError::Path(clipped(path)), NOT_FOUND));
    }
    if let Some(origin) = values(request, "origin").next() {
        let origin = String::from_utf8_lossy(origin);
        if !settings.allowed_origins.is_empty()
            && !settings.allowed_origins.iter().any(|o| *o == origin)
        {
            return Err((UpgradeError::Origin(clipped(&origin)), FORBIDDEN));
        }
    }
    let asked: Vec<&str> = tokens(request, "sec-websocket-protocol").collect();
    // The first of ours in our order of preference: `mqtt` when offered [MQTT-6.0.0-4].
    match SUBPROTOCOLS.iter().find(|p| asked.contains(p)) {
        Some(chosen) => Ok(chosen),
        None => Err((UpgradeError::Subprotocol(asked.join(",")), BAD_REQUEST)),
    }
}

/// The path of a request target (origin form `/p?q`, or absolute form `http://h/p?q`),
/// without its query.
fn path_of(target: &str) -> &str {
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    target.split(['?', '#']).next().unwrap_or("/")
}

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2): base64 of the SHA-1 of the key and
/// the GUID.
fn accept_key(key: &[u8]) -> String {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(ACCEPT_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> WsSettings {
        WsSettings {
            path: "/mqtt".into(),
            allowed_origins: vec!["http://good.example".into()],
        }
    }

    const REQUEST: &str = "GET /mqtt?token=1 HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\n\
        Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat, mqttv3.1, mqtt\r\n\r\n";

    /// RFC 6455 §1.3's example key and answer; `mqtt` is preferred when both are offered
    /// [MQTT-6.0.0-4]; the request's length excludes what follows it.
    #[test]
    fn a_good_request_is_answered() {
        let mut bytes = REQUEST.as_bytes().to_vec();
        bytes.extend_from_slice(&[0x82, 0x80]);
        let (len, response) = answer(&bytes, &settings())
            .expect("accepted")
            .expect("complete");
        assert_eq!(len, REQUEST.len());
        assert!(response.starts_with("HTTP/1.1 101 "), "{response}");
        assert!(response.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(response.contains("Sec-WebSocket-Protocol: mqtt\r\n"));
        assert_eq!(
            answer(&bytes[..40], &settings()).expect("so far fine"),
            None
        );
    }

    /// Each refusal comes with its status and metric reason.
    #[test]
    fn bad_requests_are_refused() {
        let cases = [
            ("GET /other HTTP/1.1", "", 404, "path"),
            (
                "GET /mqtt HTTP/1.1",
                "Origin: http://evil.example\r\n",
                403,
                "origin",
            ),
            ("GET /mqtt HTTP/1.1", "X: y\r\n", 200, ""),
            ("POST /mqtt HTTP/1.1", "", 400, "handshake"),
            ("GET /mqtt HTTP/1.0", "", 400, "handshake"),
        ];
        for (line, extra, status, reason) in cases {
            let request = REQUEST.replacen("GET /mqtt?token=1 HTTP/1.1", line, 1);
            let request = request.replacen("\r\n\r\n", &format!("\r\n{extra}\r\n"), 1);
            match answer(request.as_bytes(), &settings()) {
                Ok(Some(_)) => assert_eq!(status, 200, "{line} {extra}"),
                Ok(None) => panic!("{line}: incomplete"),
                Err((error, got)) => {
                    assert_eq!((got.0, error.reason()), (status, reason), "{line} {extra}");
                }
            }
        }
        let no_mqtt = REQUEST.replace("chat, mqttv3.1, mqtt", "chat");
        let (error, status) = answer(no_mqtt.as_bytes(), &settings()).expect_err("refused");
        assert_eq!((status, error.reason()), (BAD_REQUEST, "subprotocol"));
        // A browser or curl: no Upgrade header at all (issue 37, item 4).
        let plain = "GET /mqtt HTTP/1.1\r\nHost: localhost\r\n\r\n";
        let (error, status) = answer(plain.as_bytes(), &settings()).expect_err("refused");
        assert_eq!((status, error.reason()), (UPGRADE_REQUIRED, "handshake"));
        // A long path is quoted in part (thirteenth pass, F4).
        let long = REQUEST.replacen("/mqtt?token=1", &format!("/{}", "p".repeat(4000)), 1);
        let (error, _) = answer(long.as_bytes(), &settings()).expect_err("refused");
        assert!(error.to_string().len() < 200, "{error}");
        let version = REQUEST.replace("Version: 13", "Version: 8");
        let (error, status) = answer(version.as_bytes(), &settings()).expect_err("refused");
        assert_eq!((status, error.reason()), (UPGRADE_REQUIRED, "handshake"));
        let no_key = REQUEST.replace("Sec-WebSocket-Key", "X-Key");
        let (_, status) = answer(no_key.as_bytes(), &settings()).expect_err("refused");
        assert_eq!(status, BAD_REQUEST);
        let plain_mqtt = [0x10, 0x0c, 0x00, 0x04, b'M', b'Q', b'T', b'T'];
        let (_, status) = answer(&plain_mqtt, &settings()).expect_err("refused");
        assert_eq!(status, BAD_REQUEST);
    }

    /// Over a stream: what follows the request in the same write is handed on; a request
    /// that does not end within 8 KiB gets 431 and is not read further.
    #[tokio::test]
    async fn the_request_is_read_within_its_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut ours, mut peer) = tokio::io::duplex(64 * 1024);
        let mut bytes = REQUEST.as_bytes().to_vec();
        bytes.extend_from_slice(&[0x82, 0x80, 1, 2, 3, 4]);
        peer.write_all(&bytes).await.expect("write");
        let early = handshake(&mut ours, &settings()).await.expect("upgraded");
        assert_eq!(early[..], [0x82, 0x80, 1, 2, 3, 4]);

        let (mut ours, mut peer) = tokio::io::duplex(64 * 1024);
        let long = format!("GET /mqtt HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_REQUEST));
        peer.write_all(long.as_bytes()).await.expect("write");
        let error = handshake(&mut ours, &settings())
            .await
            .expect_err("refused");
        assert_eq!(error.reason(), "handshake");
        drop(ours);
        let mut answer = String::new();
        peer.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    #[test]
    fn paths_lose_their_query() {
        assert_eq!(path_of("/mqtt?x=1"), "/mqtt");
        assert_eq!(path_of("http://host:1883/mqtt?x"), "/mqtt");
        assert_eq!(path_of("http://host"), "/");
        assert_eq!(path_of("/"), "/");
    }
}
