//! The per-message checker of the cluster operations suite: a publisher that numbers its
//! messages (each number published once, never again: a retry takes the next number, so a
//! number that arrives twice was duplicated by the brokers) and records every number it got
//! PUBACK / PUBCOMP for, and a persistent subscriber that follows the nodes it is told to
//! use, answers as an MQTT 5 client does (QoS 2: a PUBLISH under a packet id it holds is the
//! same message sent again, MQTT-4.3.3-9 / 4.4.0-1) and records every number it took, the
//! QoS 2 ones taken twice, and every reconnect that did not find its session.
//!
//! Both run as tasks while the test operates the cluster; every loop is bounded in count and
//! in time ([`RUN_LIMIT`]); the test awaits events (acknowledgements, CONNACKs), not time.

use crate::common::{v5, RawClient, WAIT};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postbox::codec::{Packet, PubResponse, QoS};
use tokio::sync::watch;

/// Longest a publisher or subscriber task runs.
pub(super) const RUN_LIMIT: Duration = Duration::from_secs(240);
/// Longest a CONNECT waits for its CONNACK (a paused node accepts and never answers).
const CONNECT_LIMIT: Duration = Duration::from_secs(5);
/// Most messages one publisher sends.
const MAX_MESSAGES: u32 = 200_000;
/// The publisher's pace: at most one message per this (about 500 a second), so a paused
/// node's sessions and the shared machine are not flooded; a pace, not a synchronisation.
const PACE: Duration = Duration::from_millis(2);
/// Pause between two connection attempts when no node accepted (a node down, NATS down:
/// nothing to await but the refusal going away).
const RETRY_PACE: Duration = Duration::from_millis(100);

/// Tries `nodes` in order; the first successful CONNACK wins: the client, its node, and
/// session present.
async fn connect_first(
    nodes: &[SocketAddr],
    connect: &postbox::codec::Connect,
) -> Option<(RawClient, SocketAddr, bool)> {
    for &addr in nodes {
        let attempt = tokio::time::timeout(CONNECT_LIMIT, async {
            // A node down refuses the TCP connection: that is an answer, not a failure.
            let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
            stream.set_nodelay(true).ok()?;
            let mut c = RawClient::over(stream, v5::V);
            c.send(&Packet::Connect(Box::new(connect.clone()))).await;
            let first = c.recv_within(CONNECT_LIMIT).await;
            Some((c, first))
        })
        .await;
        if let Ok(Some((c, Ok(Some(Packet::ConnAck(ack)))))) = attempt {
            if !ack.reason_code.is_error() {
                return Some((c, addr, ack.session_present));
            }
        }
    }
    None
}

/// What a publisher did.
#[derive(Debug, Default, Clone)]
pub(super) struct Published {
    /// Numbers acknowledged with success (PUBACK, or PUBREC then PUBCOMP).
    pub acked: BTreeSet<u32>,
    /// Refusals (PUBACK / PUBREC with an error code, such as 0x97 while NATS is down).
    pub refused: u64,
    /// Messages whose connection closed or timed out before their acknowledgement.
    pub failed: u64,
}

/// A publisher task: numbered messages on `topic`, one at a time, through the first of its
/// nodes that accepts it, until stopped.
pub(super) struct Publisher {
    stop: Arc<AtomicBool>,
    nodes: Arc<Mutex<Vec<SocketAddr>>>,
    progress: watch::Receiver<Published>,
    task: tokio::task::JoinHandle<Published>,
}

impl Publisher {
    /// Starts publishing `first`, `first + 1`, ... at `qos` through `nodes` (preferred
    /// first) as the clean session `client_id`.
    pub(super) fn start(
        client_id: &str,
        topic: &str,
        qos: QoS,
        first: u32,
        nodes: Vec<SocketAddr>,
    ) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let nodes = Arc::new(Mutex::new(nodes));
        let (tx, progress) = watch::channel(Published::default());
        let task = tokio::spawn(publish(
            client_id.to_owned(),
            topic.to_owned(),
            qos,
            first,
            nodes.clone(),
            stop.clone(),
            tx,
        ));
        Publisher {
            stop,
            nodes,
            progress,
            task,
        }
    }

    /// Publishes through `nodes` from the next connection on.
    pub(super) fn set_nodes(&self, nodes: Vec<SocketAddr>) {
        *self.nodes.lock().expect("nodes") = nodes;
    }

    /// How many messages were acknowledged so far.
    pub(super) fn acked(&self) -> usize {
        self.progress.borrow().acked.len()
    }

    /// Waits (bounded by `limit`) until `more` messages beyond those acknowledged now are.
    pub(super) async fn wait_acked(&mut self, more: usize, limit: Duration) {
        let want = self.acked() + more;
        let waited = matches!(
            tokio::time::timeout(limit, self.progress.wait_for(|p| p.acked.len() >= want)).await,
            Ok(Ok(_))
        );
        let p = self.progress.borrow().clone();
        assert!(
            waited,
            "the publisher did not get {want} acknowledgements within {limit:?}: {} acked, \
             {} refused, {} failed",
            p.acked.len(),
            p.refused,
            p.failed
        );
    }

    /// Waits (bounded by `limit`) until the nodes refused a message (0x97) or closed on one.
    pub(super) async fn wait_refused(&mut self, limit: Duration) {
        let (refused, failed) = {
            let p = self.progress.borrow();
            (p.refused, p.failed)
        };
        let waited = matches!(
            tokio::time::timeout(
                limit,
                self.progress
                    .wait_for(|p| p.refused > refused || p.failed > failed),
            )
            .await,
            Ok(Ok(_))
        );
        assert!(waited, "no message was refused within {limit:?}");
    }

    /// Stops it and returns what it did.
    pub(super) async fn stop(self) -> Published {
        self.stop.store(true, Ordering::Release);
        self.task.await.expect("publisher task")
    }
}

/// The publisher's loop (see [`Publisher`]).
async fn publish(
    client_id: String,
    topic: String,
    qos: QoS,
    first: u32,
    nodes: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    progress: watch::Sender<Published>,
) -> Published {
    let deadline = tokio::time::Instant::now() + RUN_LIMIT;
    let connect = v5::connect_packet(&client_id);
    let mut client: Option<RawClient> = None;
    let mut n = first;
    while n < first + MAX_MESSAGES
        && !stop.load(Ordering::Acquire)
        && tokio::time::Instant::now() < deadline
    {
        let Some(c) = client.as_mut() else {
            let candidates = nodes.lock().expect("nodes").clone();
            match connect_first(&candidates, &connect).await {
                Some((c, _, _)) => client = Some(c),
                None => tokio::time::sleep(RETRY_PACE).await,
            }
            continue;
        };
        let id = u16::try_from(n % 60_000 + 1).expect("packet id");
        c.send(&Packet::Publish(v5::publish_packet(
            &topic,
            qos,
            n.to_string().as_bytes(),
            id,
        )))
        .await;
        // Each number is published once: whatever happens, the next one is new.
        let outcome = answer(c, qos, id).await;
        n += 1;
        match outcome {
            Outcome::Acked => {
                progress.send_modify(|p| {
                    p.acked.insert(n - 1);
                });
                tokio::time::sleep(PACE).await;
            }
            Outcome::Refused => {
                progress.send_modify(|p| p.refused += 1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Outcome::Failed => {
                progress.send_modify(|p| p.failed += 1);
                client = None;
            }
        }
    }
    if let Some(c) = client {
        v5::disconnect(c).await;
    }
    let done = progress.borrow().clone();
    done
}

/// How one PUBLISH ended.
enum Outcome {
    Acked,
    Refused,
    Failed,
}

/// Waits for the acknowledgement of PUBLISH `id` (and completes QoS 2).
async fn answer(c: &mut RawClient, qos: QoS, id: u16) -> Outcome {
    // A QoS 1 PUBACK or QoS 2 PUBREC, then for QoS 2 the PUBCOMP; other packets skipped
    // (at most 16, then the connection is taken for broken).
    let mut released = false;
    for _ in 0..16 {
        match c.recv_within(WAIT).await {
            Ok(Some(Packet::PubAck(a))) if qos == QoS::AtLeastOnce && a.packet_id == id => {
                return if a.reason_code.is_error() {
                    Outcome::Refused
                } else {
                    Outcome::Acked
                };
            }
            Ok(Some(Packet::PubRec(r))) if qos == QoS::ExactlyOnce && r.packet_id == id => {
                if r.reason_code.is_error() {
                    return Outcome::Refused;
                }
                c.send(&Packet::PubRel(PubResponse::new(id))).await;
                released = true;
            }
            Ok(Some(Packet::PubComp(p))) if released && p.packet_id == id => {
                return Outcome::Acked;
            }
            Ok(Some(Packet::Disconnect(_)) | None) | Err(()) => return Outcome::Failed,
            Ok(Some(_)) => {}
        }
    }
    Outcome::Failed
}

/// What a subscriber took.
#[derive(Debug, Default, Clone)]
pub(super) struct Received {
    /// Each number taken, and how many times (a QoS 2 PUBLISH sent again under a packet id
    /// the subscriber holds is not taken again).
    pub got: BTreeMap<u32, u32>,
    /// Numbers taken twice at QoS 2 (each one a broken exactly-once).
    pub qos2_duplicates: Vec<u32>,
    /// QoS 2 packet ids this client holds (PUBREC sent, no PUBREL yet), with the number.
    held: HashMap<u16, u32>,
    /// A packet id the client holds reused for another number before its PUBREL.
    pub reused_ids: Vec<(u16, u32, u32)>,
    /// Connections (after the first) whose CONNACK said session present 0, by node.
    pub sessions_lost: Vec<SocketAddr>,
    /// Connections made, and the node of the current one.
    pub connections: u32,
    pub node: Option<SocketAddr>,
}

impl Received {
    /// Takes one PUBLISH; the answer to send.
    fn take(&mut self, p: &postbox::codec::Publish) -> Option<Packet> {
        let n: u32 = String::from_utf8_lossy(&p.payload).parse().ok()?;
        match p.qos {
            QoS::AtMostOnce => {
                *self.got.entry(n).or_default() += 1;
                None
            }
            QoS::AtLeastOnce => {
                *self.got.entry(n).or_default() += 1;
                Some(Packet::PubAck(PubResponse::new(p.packet_id)))
            }
            QoS::ExactlyOnce => {
                match self.held.get(&p.packet_id) {
                    Some(&held) if held == n => {} // sent again: the same message
                    Some(&held) => self.reused_ids.push((p.packet_id, held, n)),
                    None => {
                        let count = self.got.entry(n).or_default();
                        *count += 1;
                        if *count > 1 {
                            self.qos2_duplicates.push(n);
                        }
                        self.held.insert(p.packet_id, n);
                    }
                }
                Some(Packet::PubRec(PubResponse::new(p.packet_id)))
            }
        }
    }

    /// The numbers of `acked` never taken.
    pub(super) fn lost<'a>(&self, acked: &'a BTreeSet<u32>) -> Vec<&'a u32> {
        acked.iter().filter(|n| !self.got.contains_key(n)).collect()
    }
}

/// A persistent subscriber task (Session Expiry 3600 s): connected to the first of its
/// nodes that accepts it; reconnects when its connection ends (a node stopped, killed, or
/// taking the session over elsewhere) or when told to move.
pub(super) struct Subscriber {
    shared: Arc<SubShared>,
    state: watch::Receiver<Received>,
    task: tokio::task::JoinHandle<()>,
}

struct SubShared {
    nodes: Mutex<Vec<SocketAddr>>,
    /// Bumped by [`Subscriber::move_to`]: the task drops its connection and connects again.
    moves: AtomicU64,
    stop: AtomicBool,
}

impl Subscriber {
    /// Connects `client_id` to `nodes[0]` (waits for it) and subscribes to `filter` at
    /// `qos`; then the task takes what comes.
    pub(super) async fn start(
        client_id: &str,
        filter: &str,
        qos: QoS,
        nodes: Vec<SocketAddr>,
    ) -> Subscriber {
        let (mut c, _) = v5::connect(nodes[0], v5::persistent_connect(client_id, 3600)).await;
        v5::subscribe(&mut c, filter, qos).await;
        let shared = Arc::new(SubShared {
            nodes: Mutex::new(nodes.clone()),
            moves: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let (tx, state) = watch::channel(Received {
            connections: 1,
            node: Some(nodes[0]),
            ..Received::default()
        });
        let task = tokio::spawn(follow(client_id.to_owned(), c, shared.clone(), tx));
        Subscriber {
            shared,
            state,
            task,
        }
    }

    /// Reconnects to `nodes[0]` (then the others, in order, if it refuses) and waits
    /// (bounded) until connected there.
    pub(super) async fn move_to(&mut self, nodes: Vec<SocketAddr>) {
        let target = nodes[0];
        let before = self.state.borrow().connections;
        *self.shared.nodes.lock().expect("nodes") = nodes;
        self.shared.moves.fetch_add(1, Ordering::AcqRel);
        self.wait_connected(target, before).await;
    }

    /// Waits (bounded by `WAIT` × 3) until a connection after the `before`-th one is up on
    /// `node`.
    pub(super) async fn wait_connected(&mut self, node: SocketAddr, before: u32) {
        let waited = matches!(
            tokio::time::timeout(
                WAIT * 3,
                self.state
                    .wait_for(|r| r.connections > before && r.node == Some(node)),
            )
            .await,
            Ok(Ok(_))
        );
        let r = self.state.borrow().clone();
        assert!(
            waited,
            "the subscriber never connected to {node} (connections {}, now on {:?})",
            r.connections, r.node
        );
    }

    /// Connections made so far.
    pub(super) fn connections(&self) -> u32 {
        self.state.borrow().connections
    }

    /// Waits (bounded by `limit`) until every number of `acked` was taken; then stops the
    /// task and returns what it took.
    pub(super) async fn finish(mut self, acked: &BTreeSet<u32>, limit: Duration) -> Received {
        let _ = matches!(
            tokio::time::timeout(
                limit,
                self.state
                    .wait_for(|r| acked.iter().all(|n| r.got.contains_key(n))),
            )
            .await,
            Ok(Ok(_))
        );
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.task.await;
        let r = self.state.borrow().clone();
        r
    }
}

/// The subscriber's loop (see [`Subscriber`]).
async fn follow(
    client_id: String,
    first: RawClient,
    shared: Arc<SubShared>,
    state: watch::Sender<Received>,
) {
    let deadline = tokio::time::Instant::now() + RUN_LIMIT;
    let connect = v5::persistent_connect(&client_id, 3600);
    let mut client = Some(first);
    let mut moves = shared.moves.load(Ordering::Acquire);
    // Bounded: at most this many packets and reconnects.
    for _ in 0..2_000_000u32 {
        if shared.stop.load(Ordering::Acquire) || tokio::time::Instant::now() >= deadline {
            break;
        }
        let Some(c) = client.as_mut() else {
            let nodes = shared.nodes.lock().expect("nodes").clone();
            match connect_first(&nodes, &connect).await {
                Some((c, node, present)) => {
                    state.send_modify(|r| {
                        if !present {
                            r.sessions_lost.push(node);
                        }
                        r.connections += 1;
                        r.node = Some(node);
                    });
                    client = Some(c);
                }
                None => tokio::time::sleep(RETRY_PACE).await,
            }
            continue;
        };
        let now = shared.moves.load(Ordering::Acquire);
        if now != moves {
            moves = now;
            // Dropped without DISCONNECT, as a client that lost its network: the session
            // stays, and so do its QoS 2 packet ids held here.
            client = None;
            state.send_modify(|r| r.node = None);
            continue;
        }
        match c.recv_within(Duration::from_millis(100)).await {
            Ok(Some(Packet::Publish(p))) => {
                let mut reply = None;
                state.send_modify(|r| reply = r.take(&p));
                if let Some(reply) = reply {
                    c.send(&reply).await;
                }
            }
            Ok(Some(Packet::PubRel(r))) => {
                state.send_modify(|s| {
                    s.held.remove(&r.packet_id);
                });
                c.send(&Packet::PubComp(PubResponse::new(r.packet_id)))
                    .await;
            }
            Ok(Some(Packet::Disconnect(_)) | None) => {
                client = None;
                state.send_modify(|r| r.node = None);
            }
            Err(()) | Ok(Some(_)) => {}
        }
    }
}

/// Asserts what the checker promises: every acknowledged number arrived, no QoS 2 number
/// arrived twice, no packet id was reused while held, and no reconnect lost the session.
pub(super) fn assert_exact(what: &str, published: &Published, received: &Received, qos2: bool) {
    let lost = received.lost(&published.acked);
    assert!(
        !published.acked.is_empty(),
        "{what}: nothing was acknowledged"
    );
    assert!(
        lost.is_empty(),
        "{what}: {} of {} acknowledged messages never arrived: {lost:?}",
        lost.len(),
        published.acked.len()
    );
    if qos2 {
        assert!(
            received.qos2_duplicates.is_empty(),
            "{what}: QoS 2 messages taken twice: {:?}",
            received.qos2_duplicates
        );
        assert!(
            received.reused_ids.is_empty(),
            "{what}: packet ids reused while the client held them (id, held, new): {:?}",
            received.reused_ids
        );
    }
    assert!(
        received.sessions_lost.is_empty(),
        "{what}: reconnects that found no session (session present 0) on {:?}",
        received.sessions_lost
    );
    eprintln!(
        "{what}: {} acknowledged, {} refused, {} failed; {} taken ({} connections), \
         0 lost, 0 QoS 2 duplicates",
        published.acked.len(),
        published.refused,
        published.failed,
        received.got.len(),
        received.connections
    );
}
