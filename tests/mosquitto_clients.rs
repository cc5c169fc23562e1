//! Interop with the real Mosquitto command-line clients (`apt-get install mosquitto-clients`)
//! at every protocol level: what users try first.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::WAIT;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const VERSIONS: [&str; 3] = ["mqttv31", "mqttv311", "mqttv5"];

/// A running `mosquitto_sub` whose output lines (debug and messages) arrive on a channel.
struct Sub {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Sub {
    /// Starts `mosquitto_sub -d` with `args`, printing messages as `MSG|topic|qos|retain|payload`.
    fn spawn(port: u16, args: &[&str]) -> Sub {
        // stdbuf: line-buffered stdout, so debug lines (SUBACK) arrive when they happen.
        let mut child = Command::new("stdbuf")
            .args([
                "-oL",
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-d",
                "-F",
                "MSG|%t|%q|%r|%p",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub is installed (apt-get install mosquitto-clients)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Sub { child, lines }
    }

    /// Waits for a line containing `needle`; panics after `WAIT`.
    async fn wait_for(&mut self, needle: &str) -> String {
        tokio::time::timeout(WAIT, async {
            loop {
                match self.lines.recv().await {
                    Some(line) if line.contains(needle) => return line,
                    Some(_) => {}
                    None => panic!("mosquitto_sub ended before printing {needle:?}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {needle:?}"))
    }

    /// The next `n` message lines, then waits for the process to exit by itself.
    async fn messages(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            out.push(self.wait_for("MSG|").await);
        }
        out
    }

    async fn exit_ok(mut self) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("mosquitto_sub exits")
            .expect("wait");
        assert!(status.success(), "mosquitto_sub failed: {status}");
    }
}

/// Runs `mosquitto_pub` to completion and asserts success.
async fn mosquitto_pub(port: u16, args: &[&str]) {
    let status = tokio::time::timeout(
        WAIT,
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status(),
    )
    .await
    .expect("mosquitto_pub finishes")
    .expect("mosquitto_pub is installed (apt-get install mosquitto-clients)");
    assert!(status.success(), "mosquitto_pub {args:?} failed: {status}");
}

#[tokio::test]
async fn pub_sub_every_version_and_qos() {
    let server = common::start().await;
    let port = server.mqtt_addr.port();
    for version in VERSIONS {
        let mut sub = Sub::spawn(
            port,
            &["-V", version, "-t", "sensors/#", "-q", "2", "-C", "3"],
        );
        sub.wait_for("SUBACK").await;
        for qos in ["0", "1", "2"] {
            let payload = format!("{version}-q{qos}");
            mosquitto_pub(
                port,
                &["-V", version, "-t", "sensors/t1", "-m", &payload, "-q", qos],
            )
            .await;
            let line = sub.wait_for("MSG|").await;
            assert_eq!(line, format!("MSG|sensors/t1|{qos}|0|{payload}"));
        }
        sub.exit_ok().await;
    }
}

#[tokio::test]
async fn retained_message_reaches_later_subscriber() {
    let server = common::start().await;
    let port = server.mqtt_addr.port();
    for version in VERSIONS {
        let topic = format!("status/{version}");
        mosquitto_pub(
            port,
            &["-V", version, "-t", &topic, "-m", "online", "-q", "1", "-r"],
        )
        .await;
        let mut sub = Sub::spawn(
            port,
            &["-V", version, "-t", "status/#", "-q", "1", "-C", "1"],
        );
        let line = sub.wait_for(&format!("MSG|{topic}|")).await;
        assert_eq!(
            line,
            format!("MSG|{topic}|1|1|online"),
            "delivered with RETAIN=1"
        );
        sub.exit_ok().await;
        // Clear it again so the next version's subscriber sees only its own.
        mosquitto_pub(port, &["-V", version, "-t", &topic, "-n", "-r"]).await;
    }
}

#[tokio::test]
async fn persistent_session_receives_what_it_missed() {
    // The README's quick start: `mosquitto_sub -c -i dash` keeps its session while offline.
    let server = common::start().await;
    let port = server.mqtt_addr.port();
    for version in VERSIONS {
        let id = format!("dash-{version}");
        // Create the session and its subscription, then leave.
        let sub = Sub::spawn(
            port,
            &[
                "-V",
                version,
                "-t",
                "sensors/#",
                "-q",
                "2",
                "-c",
                "-i",
                &id,
                "-E",
            ],
        );
        sub.exit_ok().await;
        for i in 0..3 {
            let payload = format!("{version}-{i}");
            mosquitto_pub(
                port,
                &["-V", version, "-t", "sensors/t1", "-m", &payload, "-q", "2"],
            )
            .await;
        }
        let mut sub = Sub::spawn(
            port,
            &[
                "-V",
                version,
                "-t",
                "sensors/#",
                "-q",
                "2",
                "-c",
                "-i",
                &id,
                "-C",
                "3",
            ],
        );
        let got = sub.messages(3).await;
        let expected: Vec<String> = (0..3)
            .map(|i| format!("MSG|sensors/t1|2|0|{version}-{i}"))
            .collect();
        assert_eq!(got, expected, "queued messages, in order, exactly once");
        sub.exit_ok().await;
    }
    let _ = Duration::ZERO;
}
