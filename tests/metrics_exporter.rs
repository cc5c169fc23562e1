//! The exporter really serves the registered metrics over HTTP. A separate test binary because
//! it installs the process-wide recorder, which can happen only once per process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use postbox::metrics::{install_exporter, names, Metrics, MetricsError};

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind ephemeral");
    l.local_addr().expect("local addr")
}

/// A bare HTTP/1.1 GET; retried briefly because the server task starts asynchronously.
fn get(addr: SocketAddr, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5)))
                    .expect("timeout");
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                )
                .expect("write request");
                let mut out = String::new();
                s.read_to_string(&mut out).expect("read response");
                return out;
            }
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot connect to metrics endpoint {addr}: {e}"),
        }
    }
}

#[test]
fn exporter_serves_registered_metrics() {
    // A port already in use is reported as a bind error naming the address.
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_addr = busy.local_addr().expect("addr");
    match install_exporter(busy_addr) {
        Err(e @ MetricsError::Bind { .. }) => {
            assert!(e.to_string().contains(&busy_addr.to_string()), "{e}");
        }
        other => panic!("expected Bind error, got {other:?}"),
    }
    drop(busy);

    let addr = free_port();
    install_exporter(addr).expect("exporter installs");
    let m = Metrics::register();
    let _store = postbox::metrics::StoreMetrics::register();
    m.connections_total.increment(2);
    m.messages_sent[0].increment(9);

    let response = get(addr, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    for name in names::ALL {
        assert!(
            response.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{response}"
        );
    }
    assert!(
        response.contains("\npostbox_connections_total 2"),
        "{response}"
    );
    assert!(
        response.contains("\npostbox_messages_sent_total{qos=\"0\"} 9"),
        "{response}"
    );

    let health = get(addr, "/health");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("OK"),
        "{health}"
    );

    // Only one global recorder per process.
    assert!(matches!(
        install_exporter(free_port()),
        Err(MetricsError::Install(_))
    ));
}
