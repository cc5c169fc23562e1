//! TLS and mTLS listeners (`kind = "tls"`), against the real `postbox` binary with
//! `mosquitto_pub`/`mosquitto_sub` and `openssl s_client`.
//!
//! MQTT 5.0 §5.4.9 / 3.1.1 §5.4.9 (TLS; a client certificate may authenticate the client);
//! MQTT 5.0 §4.13.2 / 3.1.1 §4.8 (a failed handshake closes the network connection).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::http::{http_get, sample};
use crate::common::process::{free_port, Broker, BrokerConfig};
use crate::common::{openssl, self_signed_p256, WAIT};

fn certs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("certs")
}

fn cert(name: &str) -> String {
    certs().join(name).display().to_string()
}

/// A broker with one TLS listener whose `[listener.tls]` keys are `tls` (besides cert/key).
fn start(dir: &Path, cert_file: &str, key_file: &str, tls: &str) -> (Broker, BrokerConfig) {
    let (port, metrics) = (free_port(), free_port());
    let path = dir.join("postbox.toml");
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nname = \"tls\"\nbind = \"127.0.0.1:{port}\"\nkind = \"tls\"\n\
             [listener.tls]\ncert = {cert_file:?}\nkey = {key_file:?}\n{tls}\n\
             [metrics]\nbind = \"127.0.0.1:{metrics}\"\n[storage]\ndir = {:?}\n",
            dir.join("data")
        ),
    )
    .expect("write config");
    let config = BrokerConfig {
        path,
        mqtt: ([127, 0, 0, 1], port).into(),
        metrics,
    };
    (Broker::start(&config), config)
}

/// [`start`] with copies of the dev server key and certificate in `dir` (the tests overwrite
/// them to reload): the broker, its config and the copies' paths (key, certificate).
fn start_with_copies(dir: &Path) -> (Broker, BrokerConfig, (PathBuf, PathBuf)) {
    let (key, pem) = (dir.join("srv.key"), dir.join("srv.pem"));
    std::fs::copy(certs().join("server.key"), &key).unwrap();
    std::fs::copy(certs().join("server.pem"), &pem).unwrap();
    let (broker, config) = start(dir, pem.to_str().unwrap(), key.to_str().unwrap(), "");
    (broker, config, (key, pem))
}

/// A new dev-CA-signed key and certificate `CN=<cn>` made in `dir`/new and copied over the
/// served `key` and `pem`: the certificate's path.
fn renew(dir: &Path, name: &str, cn: &str, (key, pem): (&Path, &Path)) -> String {
    let new = dir.join("new");
    std::fs::create_dir(&new).unwrap();
    let (nk, np) = make_cert(&new, name, cn, Some((&cert("ca.pem"), &cert("ca.key"))));
    std::fs::copy(&nk, key).unwrap();
    std::fs::copy(&np, pem).unwrap();
    np
}

/// `mosquitto_sub` over TLS with the dev CA to the listener on `port` (more arguments to add).
fn subscriber(port: u16) -> Command {
    let mut sub = Command::new("mosquitto_sub");
    sub.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--cafile",
        &cert("ca.pem"),
    ]);
    sub
}

fn start_server_cert(dir: &Path, tls: &str) -> (Broker, BrokerConfig) {
    start(dir, &cert("server.pem"), &cert("server.key"), tls)
}

/// [`start_server_cert`] trusting the dev CA for client certificates, with the listener's
/// `client_cert` settings (its mode, identity, ...) as given.
fn start_mtls(dir: &Path, client_cert: &str) -> (Broker, BrokerConfig) {
    let tls = format!("client_ca = {:?}\n{client_cert}", cert("ca.pem"));
    start_server_cert(dir, &tls)
}

/// `mosquitto_pub` of one message to `t` presenting the dev CA's certificate `name` (`<name>.pem`,
/// `<name>.key`).
fn publish_as(port: u16, name: &str) -> Output {
    let (pem, key) = (cert(&format!("{name}.pem")), cert(&format!("{name}.key")));
    publish(port, &["-t", "t", "-m", "x", "--cert", &pem, "--key", &key])
}

/// `mosquitto_pub` over TLS with the dev CA, plus `extra` arguments.
fn publish(port: u16, extra: &[&str]) -> Output {
    let ca = cert("ca.pem");
    let port = port.to_string();
    let mut args = vec!["-h", "127.0.0.1", "-p", &port, "--cafile", &ca, "-q", "1"];
    args.extend_from_slice(extra);
    Command::new("mosquitto_pub")
        .args(&args)
        .output()
        .expect("mosquitto_pub")
}

fn ok(out: &Output) -> bool {
    out.status.success()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits (bounded by `WAIT`) for a log line containing `needle`.
fn wait_log(broker: &Broker, needle: &str) -> String {
    broker.wait_log(|l| l.contains(needle))
}

/// The subject of the certificate the listener presents, as `openssl s_client` prints it,
/// and the whole output (for the ALPN line).
fn s_client(port: u16, alpn: Option<&str>) -> String {
    let connect = format!("127.0.0.1:{port}");
    let mut args = vec!["s_client", "-connect", &connect, "-servername", "localhost"];
    if let Some(alpn) = alpn {
        args.extend_from_slice(&["-alpn", alpn]);
    }
    let out = Command::new("openssl")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    text(&out)
}

/// The `subject=` line of the listener's certificate, spaces removed.
fn subject_cn(port: u16) -> String {
    let out = s_client(port, None);
    out.lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no subject: {out}"))
        .replace(' ', "")
}

/// A key and certificate `CN=<cn>` for 127.0.0.1 signed by `ca`/`ca_key` (or self-signed).
fn make_cert(dir: &Path, name: &str, cn: &str, ca: Option<(&str, &str)>) -> (String, String) {
    let key = dir.join(format!("{name}.key"));
    let pem = dir.join(format!("{name}.pem"));
    let (k, p) = (key.to_str().unwrap(), pem.to_str().unwrap());
    self_signed_p256(
        k,
        p,
        cn,
        30,
        &[
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ],
    );
    if let Some((ca, ca_key)) = ca {
        let csr = dir.join(format!("{name}.csr"));
        let ext = dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n",
        )
        .unwrap();
        let c = csr.to_str().unwrap();
        openssl(&[
            "req",
            "-new",
            "-key",
            k,
            "-subj",
            &format!("/CN={cn}"),
            "-out",
            c,
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            c,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-CAserial",
            dir.join("ca.srl").to_str().unwrap(),
            "-days",
            "30",
            "-extfile",
            ext.to_str().unwrap(),
            "-out",
            p,
        ]);
    }
    (k.to_owned(), p.to_owned())
}

#[test]
fn qos1_round_trip_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, config) = start_server_cert(dir.path(), "");
    let port = config.mqtt.port();
    let out = publish(port, &["-t", "tls/a", "-m", "over-tls", "-r"]);
    assert!(ok(&out), "{}", text(&out));
    let out = subscriber(port)
        .args(["-t", "tls/a", "-q", "1", "-C", "1", "-W", "10"])
        .output()
        .expect("mosquitto_sub");
    assert!(ok(&out), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "over-tls");
}

#[test]
fn alpn_mqtt_is_negotiated() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, config) = start_server_cert(dir.path(), "");
    let out = s_client(config.mqtt.port(), Some("mqtt"));
    assert!(out.contains("ALPN protocol: mqtt"), "{out}");
}

#[test]
fn mtls_required_refuses_missing_or_foreign_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, config) = start_mtls(dir.path(), "client_cert = \"required\"");
    let port = config.mqtt.port();
    let out = publish_as(port, "sensor1");
    assert!(ok(&out), "with a CA-signed cert: {}", text(&out));
    let out = publish(port, &["-t", "t", "-m", "x"]);
    assert!(
        !ok(&out),
        "without a cert the handshake must fail: {}",
        text(&out)
    );
    let (key, pem) = make_cert(dir.path(), "foreign", "sensor1", None);
    let out = publish(port, &["-t", "t", "-m", "x", "--cert", &pem, "--key", &key]);
    assert!(!ok(&out), "a cert of another CA must fail: {}", text(&out));
    let scrape = http_get(config.metrics, "/metrics");
    let failures = sample(
        &scrape,
        "postbox_tls_handshake_failures_total{listener=\"tls\",reason=\"certificate\"}",
    );
    assert!(failures.is_some_and(|n| n >= 1.0), "{scrape}");
}

#[test]
fn mtls_optional_accepts_both_and_cn_becomes_the_user_name() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, config) = start_mtls(
        dir.path(),
        "client_cert = \"optional\"\nidentity = \"cn\"\nuse_identity_as_username = true",
    );
    let port = config.mqtt.port();
    // Its start-up line says whom it admits: a client certificate, nothing else (issue 35,
    // twenty-fourth adversarial pass, J2: it said "credentials, or none").
    let up = wait_log(&broker, "MQTT listener up");
    assert!(up.contains("a client certificate only"), "{up}");
    let (s2, s2k) = (cert("sensor2.pem"), cert("sensor2.key"));
    let out = publish(
        port,
        &[
            "-t",
            "t",
            "-m",
            "x",
            "-u",
            "someone-else",
            "--cert",
            &s2,
            "--key",
            &s2k,
        ],
    );
    assert!(ok(&out), "{}", text(&out));
    // The certificate's CN, not the CONNECT's user name, is the user name.
    let line = wait_log(&broker, "user name from the TLS certificate");
    assert!(line.contains("\"sensor2\""), "{line}");
    // Without a certificate the TLS handshake succeeds, but CONNECT is refused: there is
    // no identity to take the user name from (CONNACK 0x87 / 3.1.1 0x05).
    for extra in [
        ["-u", "sensor2", "-V", "mqttv5"].as_slice(),
        &["-V", "mqttv311"],
    ] {
        let out = publish(port, &[&["-t", "t", "-m", "x"], extra].concat());
        assert!(!ok(&out), "{}", text(&out));
        assert!(
            text(&out).to_lowercase().contains("not authori"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn mtls_optional_without_identity_accepts_clients_without_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, config) = start_mtls(dir.path(), "client_cert = \"optional\"");
    let port = config.mqtt.port();
    assert!(ok(&publish(port, &["-t", "t", "-m", "x"])));
    assert!(ok(&publish_as(port, "sensor1")));
}

#[test]
fn plaintext_on_the_tls_port_is_closed_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, config) = start_server_cert(dir.path(), "");
    let mut plain = TcpStream::connect(config.mqtt).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    // A v3.1.1 CONNECT, client id "p".
    plain
        .write_all(&[
            0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'p',
        ])
        .unwrap();
    let mut buf = Vec::new();
    // No CONNACK: the socket is closed (possibly after a TLS alert).
    let _ = plain.read_to_end(&mut buf);
    assert!(!buf.starts_with(&[0x20]), "got a CONNACK: {buf:?}");
    let out = publish(config.mqtt.port(), &["-t", "t", "-m", "x"]);
    assert!(ok(&out), "{}", text(&out));
    let scrape = http_get(config.metrics, "/metrics");
    let failures = sample(
        &scrape,
        "postbox_tls_handshake_failures_total{listener=\"tls\",reason=\"protocol\"}",
    );
    assert_eq!(failures, Some(1.0), "{scrape}");
    // Said in words an operator can act on (issue 37, item 4), not rustls's
    // "received corrupt message of type InvalidContentType".
    wait_log(&broker, "the client did not speak TLS");
}

#[test]
fn sighup_swaps_the_certificate_and_keeps_it_on_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, config, (key, pem)) = start_with_copies(dir.path());
    let port = config.mqtt.port();
    assert!(subject_cn(port).contains("localhost"));

    // An established subscriber, known to be subscribed once it has the retained message.
    assert!(ok(&publish(port, &["-t", "r/x", "-m", "first", "-r"])));
    let mut sub = subscriber(port)
        .args(["-t", "r/x", "-q", "1", "-C", "2", "-W", "20"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub");
    let mut lines = BufReader::new(sub.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");

    renew(dir.path(), "srv2", "reloaded.example", (&key, &pem));
    let hup = |n: usize| {
        Command::new("kill")
            .args(["-HUP", &broker.pid().to_string()])
            .status()
            .unwrap();
        let deadline = std::time::Instant::now() + WAIT;
        while broker.log().iter().filter(|l| l.contains("SIGHUP")).count() < n {
            assert!(std::time::Instant::now() < deadline, "no SIGHUP log");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    hup(1);
    wait_log(&broker, "reloaded");
    assert!(subject_cn(port).contains("reloaded.example"));
    // The established subscriber is untouched and still receives.
    assert!(ok(&publish(port, &["-t", "r/x", "-m", "second"])));
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(sub.wait().unwrap().success());

    // A bad certificate file keeps the running one.
    std::fs::write(&pem, "not a certificate\n").unwrap();
    hup(2);
    wait_log(&broker, "reload failed");
    assert!(subject_cn(port).contains("reloaded.example"));
}

#[test]
fn tls_listener_without_cert_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("postbox.toml");
    std::fs::write(
        &path,
        format!(
            "[[listener]]\nbind = \"127.0.0.1:{}\"\nkind = \"tls\"\n[listener.tls]\nkey = \"k\"\n",
            free_port()
        ),
    )
    .unwrap();
    let out = Command::new(crate::common::process::BIN)
        .args(["-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("tls.cert") && t.contains("postbox.toml:4"),
        "{t}"
    );
}

#[test]
fn changed_certificate_files_are_reloaded_without_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, config, (key, pem)) = start_with_copies(dir.path());
    renew(dir.path(), "srv3", "watched.example", (&key, &pem));
    // The 5 s modification-time poll, within WAIT (10 s).
    wait_log(&broker, "files changed; reloaded");
    assert!(subject_cn(config.mqtt.port()).contains("watched.example"));
}

/// A certificate's notAfter as Unix seconds, by `openssl x509 -enddate` and GNU `date`.
fn openssl_not_after(pem: &str) -> f64 {
    let out = Command::new("openssl")
        .args(["x509", "-enddate", "-noout", "-in", pem])
        .output()
        .expect("openssl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let date = stdout.trim().strip_prefix("notAfter=").expect("notAfter=");
    let out = Command::new("date")
        .args(["-u", "-d", date, "+%s"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("seconds")
}

#[test]
fn certificate_expiry_is_exported_and_follows_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, config, (key, pem)) = start_with_copies(dir.path());
    let series = "postbox_tls_certificate_expiry_timestamp_seconds{listener=\"tls\"}";
    let scrape = http_get(config.metrics, "/metrics");
    assert_eq!(
        sample(&scrape, series),
        Some(openssl_not_after(&cert("server.pem"))),
        "{scrape}"
    );
    // A new certificate (30 days): the gauge follows the reload, so the alert sees it.
    let np = renew(dir.path(), "srv4", "renewed.example", (&key, &pem));
    wait_log(&broker, "files changed; reloaded");
    let scrape = http_get(config.metrics, "/metrics");
    assert_eq!(
        sample(&scrape, series),
        Some(openssl_not_after(&np)),
        "{scrape}"
    );
}
