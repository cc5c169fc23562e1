//! One Postbox cluster node (issue 17) as the real binary: its config (`[cluster] node = id`,
//! one NATS server), its own data directory kept across restarts, start and `kill -9`, and
//! bounded waits on its metrics (`postbox_cluster_up`) and on the cluster's delivery between
//! two nodes. Blocking (std processes and sockets) like `process`; the `async` helpers run the
//! blocking parts in `block_in_place` (multi-thread runtime only).
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::http::{http_get, sample};
use super::process::{free_port, Broker, BrokerConfig, Exited};
use super::WAIT;

/// A cluster node: config and data directory (kept for restarts), and the running process.
pub struct Node {
    /// Its node id (`[cluster] node`).
    pub id: String,
    /// Its config file and ports (the same for every start).
    pub config: BrokerConfig,
    /// The running binary; `None` after [`Node::kill9`].
    broker: Option<Broker>,
    /// Config file and data directory (`data/`).
    pub dir: tempfile::TempDir,
}

/// Writes `<dir>/postbox.toml` for node `id`: MQTT listener and metrics on free loopback
/// ports, storage in `<dir>/data`, `[cluster] node = id, servers = [nats]`. `extra` is TOML
/// appended right after the `servers` line: bare `key = value` lines are more `[cluster]`
/// keys, a `[table]` header starts another section.
pub fn write_node_config(dir: &std::path::Path, id: &str, nats: &str, extra: &str) -> BrokerConfig {
    let (mqtt, metrics) = (free_port(), free_port());
    let data = dir.join("data");
    let path = dir.join("postbox.toml");
    // An `extra` that starts with `[storage]` adds its keys (up to the next table) to the
    // node's own `[storage]` table: TOML has one table of a name.
    let (storage, extra) = match extra.strip_prefix("[storage]\n") {
        Some(rest) => rest.split_at(rest.find("\n[").map_or(rest.len(), |i| i + 1)),
        None => ("", extra),
    };
    std::fs::write(
        &path,
        format!(
            "[listener]\nbind = \"127.0.0.1:{mqtt}\"\n\
             [metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [storage]\ndir = {data:?}\n{storage}\n\
             [cluster]\nnode = \"{id}\"\nservers = [\"{nats}\"]\n{extra}\n"
        ),
    )
    .expect("write node config");
    BrokerConfig {
        path,
        mqtt: SocketAddr::from(([127, 0, 0, 1], mqtt)),
        metrics,
    }
}

impl Drop for Node {
    /// A failed test shows what its nodes logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- node {} log ---\n{}", self.id, self.log().join("\n"));
        }
    }
}

impl Node {
    /// Writes node `id`'s config (see [`write_node_config`]), starts the binary and waits
    /// (bounded) until it runs and its metrics show `postbox_cluster_up 1`.
    pub fn start(id: &str, nats: &str, extra: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = write_node_config(dir.path(), id, nats, extra);
        let mut node = Node {
            id: id.to_owned(),
            config,
            broker: None,
            dir,
        };
        node.restart();
        node
    }

    /// [`Node::start`] from an async test (multi-thread runtime).
    pub async fn start_async(id: &str, nats: &str, extra: &str) -> Node {
        tokio::task::block_in_place(|| Node::start(id, nats, extra))
    }

    /// Starts the binary again on the same config and data directory (after
    /// [`Node::kill9`]) and waits until the cluster is up.
    pub fn restart(&mut self) {
        assert!(self.broker.is_none(), "node {} is running", self.id);
        self.broker = Some(Broker::start(&self.config));
        self.wait_up(true);
    }

    /// Starts the binary and returns how it ended if it exited before running.
    pub fn try_start(&self) -> Result<Broker, Exited> {
        Broker::try_start(&self.config)
    }

    /// Its process id (it must be running).
    pub fn pid(&self) -> u32 {
        self.broker.as_ref().expect("node running").pid()
    }

    /// Its MQTT listener.
    pub fn mqtt(&self) -> SocketAddr {
        self.config.mqtt
    }

    /// One scrape of its metrics endpoint.
    pub fn scrape(&self) -> String {
        http_get(self.config.metrics, "/metrics")
    }

    /// The value of `series` in a fresh scrape (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        sample(&self.scrape(), series).unwrap_or(0.0)
    }

    /// Waits (bounded) until `postbox_cluster_up` is 1 (`up`) or 0.
    pub fn wait_up(&self, up: bool) {
        let want = if up { 1.0 } else { 0.0 };
        let deadline = Instant::now() + WAIT;
        loop {
            if sample(&self.scrape(), "postbox_cluster_up") == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: postbox_cluster_up never became {want} within {WAIT:?}; log:\n{}",
                self.id,
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`Node::wait_up`] from an async test.
    pub async fn wait_up_async(&self, up: bool) {
        tokio::task::block_in_place(|| self.wait_up(up));
    }

    /// Its log so far (empty once killed).
    pub fn log(&self) -> Vec<String> {
        self.broker.as_ref().map(Broker::log).unwrap_or_default()
    }

    /// `kill -9` (a crash); the data directory stays for [`Node::restart`].
    pub fn kill9(&mut self) {
        if let Some(broker) = self.broker.take() {
            broker.kill();
        }
    }

    /// SIGTERM (a graceful stop, as a rolling upgrade or systemd does it) and waits
    /// (bounded) for the exit, which must be a success; the data directory stays for
    /// [`Node::restart`]. The log of the run that ended is returned.
    pub fn terminate(&mut self) -> Vec<String> {
        let broker = self.broker.take().expect("node is running");
        let log = broker.log();
        let status = broker.terminate();
        assert!(
            status.success(),
            "node {} exited with {status} on SIGTERM; log:\n{}",
            self.id,
            log.join("\n")
        );
        log
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`, ...) to the running process.
    pub fn signal(&self, signal: i32) {
        self.running().signal(signal);
    }

    /// Waits (bounded by `WAIT`) until a line of this run's log satisfies `ok`, already
    /// written or still to come, and returns it.
    pub fn wait_log(&self, ok: impl Fn(&str) -> bool) -> String {
        self.running().wait_log(ok)
    }

    /// [`Node::wait_log`] from an async test.
    pub async fn wait_log_async(&self, ok: impl Fn(&str) -> bool) -> String {
        self.running().wait_log_async(ok).await
    }

    /// [`Node::wait_log_async`] bounded by `limit` instead of `WAIT`.
    pub async fn wait_log_within(&self, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        match self.running().output().wait_async(0, limit, ok).await {
            Some(line) => line,
            None => panic!(
                "node {}: no such line within {limit:?}; log:\n{}",
                self.id,
                self.log().join("\n")
            ),
        }
    }

    fn running(&self) -> &Broker {
        self.broker
            .as_ref()
            .unwrap_or_else(|| panic!("node {} is not running", self.id))
    }
}

/// Waits (bounded) until node `to` delivers what is published on node `from`, at QoS 0 and
/// at QoS 1: `postbox_cluster_up 1` says NATS is reached, not that a node's consumer and
/// core subscription exist yet, and a new node's consumer takes only what is published
/// after it exists. Probes on `probe/<from>/<to>` every 200 ms until one of each QoS arrives.
pub async fn wait_linked(from: &Node, to: &Node) {
    use super::v5;
    use postbox::codec::QoS;

    let topic = format!("probe/{}/{}", from.id, to.id);
    let mut sub = v5::connect_id(to.mqtt(), &format!("probe-sub-{}-{}", from.id, to.id)).await;
    v5::subscribe(&mut sub, &topic, QoS::AtLeastOnce).await;
    let mut publisher =
        v5::connect_id(from.mqtt(), &format!("probe-pub-{}-{}", from.id, to.id)).await;
    let what = format!(
        "node {} never delivered what node {} published",
        to.id, from.id
    );
    probe_until_both_qos(&mut publisher, &topic, &mut sub, &mut [], &what).await;
    v5::disconnect(publisher).await;
    v5::disconnect(sub).await;
}

/// Publishes on `publisher` to `topic` a QoS 1 probe (payload `1`, which must be accepted)
/// and a QoS 0 one (payload `0`) every 200 ms until `sub` has received one of each
/// (acknowledging what it gets), within `WAIT`, else fails saying `what`. After each round
/// what reached `others` (members of the same shared group, say) is taken and acknowledged.
/// For waiting until a path across the cluster carries both QoS.
pub async fn probe_until_both_qos(
    publisher: &mut super::RawClient,
    topic: &str,
    sub: &mut super::RawClient,
    others: &mut [&mut super::RawClient],
    what: &str,
) {
    use super::v5;
    use postbox::codec::{Packet, QoS};

    let deadline = tokio::time::Instant::now() + WAIT;
    let (mut qos0, mut qos1) = (false, false);
    let mut id = 0u16;
    while !(qos0 && qos1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} (QoS 0 {qos0}, QoS 1 {qos1})"
        );
        id = id % 60_000 + 1;
        let code = v5::publish(
            publisher,
            v5::publish_packet(topic, QoS::AtLeastOnce, b"1", id),
        )
        .await;
        assert!(!code.is_error(), "probe refused: {code:?}");
        v5::publish(
            publisher,
            v5::publish_packet(topic, QoS::AtMostOnce, b"0", 0),
        )
        .await;
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Some(Packet::Publish(p))) = sub
            .recv_within(until.saturating_duration_since(tokio::time::Instant::now()))
            .await
        {
            v5::ack(sub, &p).await;
            match &p.payload[..] {
                b"0" => qos0 = true,
                _ => qos1 = true,
            }
        }
        for other in others.iter_mut() {
            while let Ok(Some(Packet::Publish(p))) =
                other.recv_within(Duration::from_millis(10)).await
            {
                v5::ack(other, &p).await;
            }
        }
    }
}

/// NATS and `count` linked nodes (`a`, `b`, `c`, ...; at most five) with `extra` config
/// lines each (see [`write_node_config`]), from an async test (multi-thread runtime).
pub async fn start_cluster(count: usize, extra: &str) -> (super::nats::NatsServer, Vec<Node>) {
    let nats = tokio::task::block_in_place(super::nats::NatsServer::start);
    let mut nodes = Vec::new();
    for id in ["a", "b", "c", "d", "e"].into_iter().take(count) {
        nodes.push(Node::start_async(id, &nats.url(), extra).await);
    }
    for from in &nodes {
        for to in &nodes {
            if from.id != to.id {
                wait_linked(from, to).await;
            }
        }
    }
    (nats, nodes)
}
