//! Interop with the real Mosquitto command-line clients (`apt-get install mosquitto-clients`)
//! at every protocol level: what users try first.

use crate::common;

use common::mosquitto::{mosquitto_pub, MosquittoSub};

const VERSIONS: [&str; 3] = ["mqttv31", "mqttv311", "mqttv5"];

/// `mosquitto_sub` printing messages as `MSG|topic|qos|retain|payload`.
struct Sub(MosquittoSub);

impl Sub {
    fn spawn(port: u16, version: &str, topic: &str, args: &[&str]) -> Sub {
        let mut all = vec!["-F", "MSG|%t|%q|%r|%p"];
        all.extend_from_slice(args);
        Sub(MosquittoSub::spawn_at(port, version, topic, &all))
    }

    async fn wait_for(&mut self, needle: &str) -> String {
        self.0.wait_for(needle).await
    }

    /// The next `n` message lines.
    async fn messages(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            out.push(self.wait_for("MSG|").await);
        }
        out
    }

    async fn exit_ok(self) {
        self.0.exit_ok().await;
    }
}

#[tokio::test]
async fn pub_sub_every_version_and_qos() {
    let server = common::start().await;
    let port = server.mqtt_addr.port();
    for version in VERSIONS {
        let mut sub = Sub::spawn(port, version, "sensors/#", &["-q", "2", "-C", "3"]);
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
        let mut sub = Sub::spawn(port, version, "status/#", &["-q", "1", "-C", "1"]);
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
            version,
            "sensors/#",
            &["-q", "2", "-c", "-i", &id, "-E"],
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
            version,
            "sensors/#",
            &["-q", "2", "-c", "-i", &id, "-C", "3"],
        );
        let got = sub.messages(3).await;
        let expected: Vec<String> = (0..3)
            .map(|i| format!("MSG|sensors/t1|2|0|{version}-{i}"))
            .collect();
        assert_eq!(got, expected, "queued messages, in order, exactly once");
        sub.exit_ok().await;
    }
}
