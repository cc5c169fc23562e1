//! Plain HTTP/1.1 against the broker's HTTP listener (metrics, health, the admin API) and a
//! Prometheus scrape's samples: the one copy of what the process, metrics, admin and bridge
//! tests each had their own of. Blocking std sockets bounded by `WAIT`, with `async` forms
//! that run them off the runtime's worker (`spawn_blocking`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use serde_json::Value;

use super::WAIT;

/// One request to `addr` with `Host: host` (`Connection: close`, extra `headers` as
/// CRLF-ended lines): the raw response, status line and headers included; an error where the
/// connection or the read fails (nothing listening yet, a timeout after `WAIT`).
pub fn try_request(
    addr: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &str,
) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, WAIT)?;
    s.set_read_timeout(Some(WAIT))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    Ok(raw)
}

/// [`try_request`] with `Host: addr`, which must be answered: status and body.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let raw = try_request(addr, &addr.to_string(), method, path, headers)
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"));
    status_and_body(&raw)
}

/// The raw response (status line and headers included) to `GET path` on 127.0.0.1:`port`
/// (`Host: localhost`).
pub fn http_get(port: u16, path: &str) -> String {
    try_request(loopback(port), "localhost", "GET", path, "")
        .unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"))
}

/// `GET path` on 127.0.0.1:`port`: status and body.
pub fn get(port: u16, path: &str) -> (u16, String) {
    status_and_body(&http_get(port, path))
}

/// `GET path` on 127.0.0.1:`port`, which must answer 200 with JSON.
pub fn get_json(port: u16, path: &str) -> Value {
    json_body(path, get(port, path))
}

/// [`get`] from an async test.
pub async fn get_async(port: u16, path: &str) -> (u16, String) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || get(port, &path))
        .await
        .expect("HTTP request")
}

/// [`get_json`] from an async test.
pub async fn get_json_async(port: u16, path: &str) -> Value {
    json_body(path, get_async(port, path).await)
}

/// Writes the raw `request` on an open connection (of any transport) and reads until the
/// broker closes it (bounded by `WAIT`): the whole answer as text.
pub async fn exchange(
    stream: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin),
    request: &[u8],
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed within WAIT")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A 200 answer's JSON body.
fn json_body(path: &str, (status, body): (u16, String)) -> Value {
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// 127.0.0.1:`port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A raw HTTP/1.1 response's status code and body.
pub fn status_and_body(raw: &str) -> (u16, String) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample `series` (name and labels, as exported) in a scrape, if present.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.trim().parse().ok()
    })
}

/// The DOM of the page at `url` after its script ran for `budget_ms` of virtual time, from a
/// headless Chromium (`apt-get install chromium`), which must exit 0: the one copy of the
/// browser's flags for the status page tests (`admin`, `bridge_observe`, `status_page`).
/// `timeout` bounds the browser and kills it if it hangs; `--dump-dom` prints the DOM after
/// the virtual time budget, in which the page may refresh several times.
pub async fn rendered_dom(url: &str, budget_ms: u32) -> String {
    let output = chromium(url, budget_ms, vec!["--dump-dom".to_owned()]).await;
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A PNG of the page at `url` in a `width` x `height` window after its script ran for
/// `budget_ms` of virtual time, written to `path` (headless Chromium, as
/// [`rendered_dom`]); returns the file's size. For a person to look at (the status page
/// at a desktop's and a phone's width) as well as for the test's own checks.
pub async fn screenshot(
    url: &str,
    (width, height): (u32, u32),
    budget_ms: u32,
    path: &std::path::Path,
) -> u64 {
    let flags = vec![
        format!("--window-size={width},{height}"),
        "--hide-scrollbars".to_owned(),
        format!("--screenshot={}", path.display()),
    ];
    chromium(url, budget_ms, flags).await;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}", path.display()))
        .len()
}

/// Runs headless Chromium on `url` with the common flags and `extra` ones; it must exit 0.
async fn chromium(url: &str, budget_ms: u32, extra: Vec<String>) -> std::process::Output {
    let url = url.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        let profile = tempfile::tempdir().expect("profile dir");
        std::process::Command::new("timeout")
            .args(["-k", "5", "60", "chromium"])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .args(&extra)
            .arg(format!("--virtual-time-budget={budget_ms}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(&url)
            .output()
            .expect("run chromium (apt-get install chromium)")
    })
    .await
    .expect("chromium task");
    assert!(
        output.status.success(),
        "chromium failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The table row of a rendered DOM that starts at `marker` (an attribute such as
/// `data-client="slow-sub"`), up to its `</tr>`; `None` when no row has it.
pub fn table_row<'a>(dom: &'a str, marker: &str) -> Option<&'a str> {
    let row = &dom[dom.find(marker)?..];
    Some(&row[..row.find("</tr>").expect("row end")])
}
