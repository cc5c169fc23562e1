//! `config/secure.toml` (issue 13, "Ready to run") works as shipped: the same file, with only
//! its ports moved to free ones and its relative paths made absolute, starts, and the
//! README's client lines work: TLS + password on the `tls` listener, mTLS with the
//! certificate's CN as user name on `mtls`, and a wrong password is refused.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use crate::common::process::{free_port, Broker, BrokerConfig};
use crate::common::run_ok;

#[test]
fn the_shipped_secure_config_serves_tls_passwords_and_mtls() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/secure.toml")).expect("secure.toml");
    let dir = tempfile::tempdir().expect("dir");
    // Five distinct ports (the kernel may hand the same free port out twice in a row).
    let mut ports: Vec<u16> = Vec::with_capacity(5);
    for _ in 0..100 {
        let port = free_port();
        if !ports.contains(&port) {
            ports.push(port);
        }
        if ports.len() == 5 {
            break;
        }
    }
    assert_eq!(ports.len(), 5, "five free ports");
    let text = text
        .replace("0.0.0.0:8883", &format!("127.0.0.1:{}", ports[0]))
        .replace("0.0.0.0:8884", &format!("127.0.0.1:{}", ports[1]))
        .replace("0.0.0.0:9001", &format!("127.0.0.1:{}", ports[2]))
        .replace("0.0.0.0:9002", &format!("127.0.0.1:{}", ports[3]))
        .replace("127.0.0.1:9883", &format!("127.0.0.1:{}", ports[4]))
        .replace("\"../certs/", &format!("\"{}/certs/", root.display()))
        .replace(
            "\"passwd.example",
            &format!("\"{}/config/passwd.example", root.display()),
        )
        .replace(
            "\"acl.example",
            &format!("\"{}/config/acl.example", root.display()),
        )
        .replace("\"data-secure\"", &format!("{:?}", dir.path().join("data")));
    let path = dir.path().join("secure.toml");
    std::fs::write(&path, text).expect("write");
    let _broker = Broker::start(&BrokerConfig {
        path,
        mqtt: SocketAddr::from(([127, 0, 0, 1], ports[0])),
        metrics: ports[4],
    });
    let ca = root.join("certs/ca.pem");
    // `mosquitto_pub` over TLS (trusting the CA) to `port`, with `extra` arguments.
    let publish = |port: u16, extra: &[&str]| {
        let mut command = Command::new("mosquitto_pub");
        command
            .args(["-h", "localhost", "-p", &port.to_string(), "--cafile"])
            .arg(&ca)
            .args(["-q", "1", "-m", "21.5"])
            .args(extra);
        command
    };
    run_ok(&mut publish(
        ports[0],
        &[
            "-u",
            "sensor1",
            "-P",
            "sensor1-secret",
            "-t",
            "sensors/sensor1/t",
        ],
    ));
    let wrong = publish(
        ports[0],
        &["-u", "sensor1", "-P", "wrong", "-t", "sensors/sensor1/t"],
    )
    .output()
    .expect("mosquitto_pub is installed");
    assert!(!wrong.status.success(), "a wrong password is refused");
    let cert = root.join("certs/sensor1.pem");
    let key = root.join("certs/sensor1.key");
    run_ok(&mut publish(
        ports[1],
        &[
            "--cert",
            cert.to_str().expect("utf8"),
            "--key",
            key.to_str().expect("utf8"),
            "-t",
            "sensors/sensor1/t",
        ],
    ));
}
