//! Cluster metrics (`[cluster]`, issue 17): declared here by their owner against the broker's
//! registry when the cluster layer starts, so a single node exports none of them and
//! `metrics` stays a leaf (issue 36).

use crate::metrics::{names, Counter, Gauge, Metrics};

/// The handles the cluster layer updates.
#[derive(Clone, Debug)]
pub(crate) struct ClusterMetrics {
    /// 1 while the link to NATS is up and the streams and buckets are ready, else 0.
    pub up: Gauge,
    /// Connects to NATS after the first.
    pub reconnects: Counter,
    /// Messages sent to NATS (`[0]`) and received from other nodes (`[1]`).
    pub messages: [Counter; 2],
    /// Bytes of those frames, same order.
    pub bytes: [Counter; 2],
    /// Messages sent to NATS whose acknowledgement has not come yet.
    pub pending: Gauge,
    /// QoS 1/2 PUBLISHes refused because the cluster could not take them.
    pub refused: Counter,
    /// QoS 0 messages not forwarded: the link was down (`[0]`) or `max_pending` reached (`[1]`).
    pub dropped: [Counter; 2],
    /// Messages from other nodes this node has not taken yet (its consumer's pending count).
    pub lag: Gauge,
    /// Shared groups' messages pulled here and not yet settled with JetStream (held by a
    /// member until it acknowledges them).
    pub shared_unsettled: Gauge,
    /// Frames from NATS that were not Postbox messages of this version (skipped).
    pub bad_frames: Counter,
    /// Nodes whose heartbeat this node heard recently (itself included).
    pub nodes: Gauge,
}

impl ClusterMetrics {
    /// Declares the families in `metrics`' registry (once per broker, when the cluster
    /// layer starts: a second call panics on the duplicate names).
    pub(crate) fn register(metrics: &Metrics) -> ClusterMetrics {
        use names::*;
        let r = metrics.registrar();
        ClusterMetrics {
            up: r.gauge(
                CLUSTER_UP,
                "1 while the link to NATS is up and the cluster's streams and buckets are ready, else 0.",
            ),
            reconnects: r.counter(
                CLUSTER_RECONNECTS_TOTAL,
                "Connects to NATS after the first.",
            ),
            messages: r.counter_family(
                CLUSTER_MESSAGES_TOTAL,
                "Messages exchanged with the cluster over NATS, by direction (out: sent by this node, in: taken from other nodes).",
                "direction",
            )
            .counters(["out", "in"]),
            bytes: r.counter_family(
                CLUSTER_BYTES_TOTAL,
                "Bytes of the messages exchanged with the cluster, by direction.",
                "direction",
            )
            .counters(["out", "in"]),
            pending: r.gauge(
                CLUSTER_PENDING,
                "Messages sent to NATS whose JetStream acknowledgement has not come yet.",
            ),
            refused: r.counter(
                CLUSTER_REFUSED_TOTAL,
                "QoS 1/2 PUBLISHes refused (v5 0x97) because the cluster could not make them durable: NATS unreachable or max_pending reached.",
            ),
            dropped: r.counter_family(
                CLUSTER_DROPPED_TOTAL,
                "QoS 0 messages not forwarded to the other nodes, by reason (link_down, max_pending).",
                "reason",
            )
            .counters(["link_down", "max_pending"]),
            lag: r.gauge(
                CLUSTER_LAG_MESSAGES,
                "Messages of other nodes in the stream that this node has not taken yet (replication lag).",
            ),
            shared_unsettled: r.gauge(
                CLUSTER_SHARED_UNSETTLED,
                "Shared groups' messages this node pulled and has not settled with JetStream yet (held by a member until it acknowledges them; a node that dies has them delivered elsewhere).",
            ),
            nodes: r.gauge(
                CLUSTER_NODES,
                "Cluster nodes whose heartbeat this node heard within the last 7 s (itself included).",
            ),
            bad_frames: r.counter(
                CLUSTER_BAD_FRAMES_TOTAL,
                "Messages on the cluster's subjects that were not Postbox frames of this version (skipped).",
            ),
        }
    }
}
