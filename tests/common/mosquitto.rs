//! Mosquitto's command-line clients as test peers (`apt-get install mosquitto-clients`).
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::WAIT;

/// A running `mosquitto_sub -d` whose output lines (debug and messages) arrive on a channel.
pub struct MosquittoSub {
    pub child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line the waits have read so far, in order.
    consumed: Vec<String>,
}

impl MosquittoSub {
    /// Starts `mosquitto_sub -d ARGS` against 127.0.0.1:`port`.
    pub fn spawn(port: u16, args: &[&str]) -> MosquittoSub {
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
        MosquittoSub {
            child,
            lines,
            consumed: Vec::new(),
        }
    }

    /// Starts `mosquitto_sub -d -V VERSION -t TOPIC ARGS` against 127.0.0.1:`port`: one filter
    /// at one protocol version (`mqttv5`, `mqttv311`, `mqttv31`), the way most tests use it.
    pub fn spawn_at(port: u16, version: &str, topic: &str, args: &[&str]) -> MosquittoSub {
        let mut all = vec!["-V", version, "-t", topic];
        all.extend_from_slice(args);
        MosquittoSub::spawn(port, &all)
    }

    /// Waits for a line containing `needle`; panics after `WAIT`.
    pub async fn wait_for(&mut self, needle: &str) -> String {
        tokio::time::timeout(WAIT, async {
            loop {
                match self.lines.recv().await {
                    Some(line) => {
                        self.consumed.push(line.clone());
                        if line.contains(needle) {
                            return line;
                        }
                    }
                    None => panic!("mosquitto_sub ended before printing {needle:?}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {needle:?}"))
    }

    /// Waits until the latest `-v` line `TOPIC PAYLOAD` of `topic` (read now or earlier) has a
    /// payload that `accept`s; returns the payload. Panics after `WAIT`.
    pub async fn wait_for_value(&mut self, topic: &str, accept: impl Fn(&str) -> bool) -> String {
        let prefix = format!("{topic} ");
        // The latest value read so far counts: a retained value may have come in while the
        // caller waited for another topic, and it is only sent again when it changes.
        let latest = self
            .consumed
            .iter()
            .rev()
            .find_map(|line| line.strip_prefix(&prefix));
        if let Some(payload) = latest.filter(|p| accept(p)) {
            return payload.to_owned();
        }
        let mut seen = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                match self.lines.recv().await {
                    Some(line) => {
                        self.consumed.push(line.clone());
                        if let Some(payload) = line.strip_prefix(&prefix) {
                            if accept(payload) {
                                return payload.to_owned();
                            }
                            seen.push(payload.to_owned());
                        }
                    }
                    None => panic!("mosquitto_sub ended before printing {topic}"),
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("timed out waiting for {topic}; values seen: {seen:?}"))
    }

    /// Every output line the waits have read so far.
    pub fn consumed(&self) -> &[String] {
        &self.consumed
    }

    /// Waits for the process to exit by itself and asserts success.
    pub async fn exit_ok(mut self) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("mosquitto_sub exits")
            .expect("wait");
        assert!(status.success(), "mosquitto_sub failed: {status}");
    }
}

/// Runs `mosquitto_pub ARGS` against 127.0.0.1:`port` to completion and asserts success.
pub async fn mosquitto_pub(port: u16, args: &[&str]) {
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
