//! The NATS connection of one node: connect (in the background, forever), follow its state,
//! make sure of the streams and buckets at every connect, and run the node's tasks.
//!
//! Must not: refuse to start the broker when NATS is down (the node starts and refuses QoS 1/2
//! instead).

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use tokio::sync::mpsc;

use super::credentials::{self, NatsCredentials};
use super::{
    inbound, outbound, Cluster, NODES_BUCKET, REGROUP_STREAM, REGROUP_SUBJECTS, RETAINED_BUCKET,
    SESSIONS_BUCKET, STREAM, STREAM_SUBJECTS,
};
use crate::broker::Broker;
use crate::config::ClusterConfig;

/// How long a message may wait in the stream for a duplicate publish to be recognised
/// (`Nats-Msg-Id`); capped by the server to `max_age`.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long a heartbeat stays in `pb_nodes` (cleanup only: liveness is judged by each node).
const NODES_MAX_AGE: Duration = Duration::from_secs(60);

/// Starts the link's task.
pub(super) fn spawn(
    config: ClusterConfig,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    outgoing: mpsc::UnboundedReceiver<outbound::Queued>,
) {
    tokio::spawn(run(config, cluster, broker, outgoing));
}

async fn run(
    config: ClusterConfig,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    outgoing: mpsc::UnboundedReceiver<outbound::Queued>,
) {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let options = async_nats::ConnectOptions::new()
        .name(format!("postbox-{}", config.node))
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let events_tx = events_tx.clone();
            async move {
                let _ = events_tx.send(event);
            }
        });
    // `[cluster] user` and `password_file`, or what a server's URL holds: the client takes
    // them only as options.
    let options = match cluster.credentials.clone() {
        Some(NatsCredentials::UserPassword { user, password }) => {
            options.user_and_password(user, password)
        }
        Some(NatsCredentials::Token(token)) => options.token(token),
        None => options,
    };
    // The client is handed the URLs without them: it logs each server's URL at debug
    // level, password included (issue 37, seventh pass N8).
    let servers = config
        .servers
        .iter()
        .map(|s| credentials::without_credentials(s))
        .collect::<Vec<_>>()
        .join(",");
    let client = options.connect(servers.as_str()).await;
    // What the log shows: no password.
    let servers = config
        .servers
        .iter()
        .map(|s| crate::config::redact_server(s))
        .collect::<Vec<_>>()
        .join(",");
    let client = match client {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, servers = %servers, "cluster: cannot start the NATS client; this node refuses QoS 1/2 PUBLISHes");
            return;
        }
    };
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(config.publish_timeout))
        .build(client.clone());
    outbound::spawn(
        client.clone(),
        js.clone(),
        Arc::clone(&cluster),
        broker.clone(),
        Duration::from_secs(config.publish_timeout),
        outgoing,
    );
    let mut inbound_started = false;
    let mut connects = 0u64;
    while let Some(event) = events.recv().await {
        match event {
            async_nats::Event::Connected => {
                connects += 1;
                if connects > 1 {
                    cluster.metrics.reconnects.increment(1);
                }
                tracing::info!(servers = %servers, node = %config.node, "cluster: connected to NATS");
                if !ensure_state(&js, &config, &client).await {
                    continue; // logged; the next connect tries again
                }
                match js.get_key_value(SESSIONS_BUCKET).await {
                    Ok(bucket) => cluster.sessions.set_bucket(bucket),
                    Err(error) => {
                        tracing::error!(%error, bucket = SESSIONS_BUCKET, "cluster: cannot open the session bucket");
                        continue;
                    }
                }
                match inbound::node_consumer(&js, &config).await {
                    Ok(consumer) => {
                        // Where its delivery starts (a new consumer: the stream's end).
                        let delivered = consumer.cached_info().delivered.stream_sequence;
                        cluster
                            .consumer_floor
                            .fetch_max(delivered + 1, std::sync::atomic::Ordering::AcqRel);
                    }
                    Err(error) => {
                        tracing::error!(%error, "cluster: cannot make this node's consumer");
                        continue;
                    }
                }
                let _ = cluster.js.set(js.clone());
                // Heartbeats missed while the link was down say nothing of the other nodes.
                cluster.liveness.listening();
                cluster.set_up(true);
                if !inbound_started {
                    inbound_started = true;
                    match js.get_key_value(NODES_BUCKET).await {
                        Ok(bucket) => {
                            tokio::spawn(super::nodes::run(
                                Arc::clone(&cluster),
                                bucket,
                                broker.clone(),
                            ));
                        }
                        Err(error) => {
                            tracing::error!(%error, bucket = NODES_BUCKET, "cluster: cannot open the heartbeat bucket");
                        }
                    }
                    tokio::spawn(super::sessions::watch_claims(
                        Arc::clone(&cluster),
                        broker.clone(),
                    ));
                    tokio::spawn(super::shared::run(
                        js.clone(),
                        client.clone(),
                        Arc::clone(&cluster),
                        broker.clone(),
                        Duration::from_secs(config.retention),
                    ));
                    tokio::spawn(super::sessions::keep_records(
                        Arc::clone(&cluster),
                        broker.clone(),
                    ));
                    inbound::spawn(
                        client.clone(),
                        js.clone(),
                        Arc::clone(&cluster),
                        broker.clone(),
                        config.clone(),
                    );
                }
            }
            async_nats::Event::Disconnected => {
                cluster.set_up(false);
                tracing::warn!(servers = %servers, "cluster: lost NATS; QoS 1/2 PUBLISHes are refused until it is back");
            }
            other => tracing::debug!(event = %other, "cluster: NATS client event"),
        }
        if broker.strong_count() == 0 {
            break;
        }
    }
}

/// Creates or converges the stream and buckets; false (logged) if JetStream refused.
async fn ensure_state(
    js: &jetstream::Context,
    config: &ClusterConfig,
    client: &async_nats::Client,
) -> bool {
    let messages = stream::Config {
        name: STREAM.to_owned(),
        subjects: vec![format!("{STREAM_SUBJECTS}.>")],
        retention: stream::RetentionPolicy::Limits,
        max_age: Duration::from_secs(config.retention),
        storage: stream::StorageType::File,
        num_replicas: config.replicas,
        duplicate_window: DUPLICATE_WINDOW.min(Duration::from_secs(config.retention)),
        max_message_size: i32::try_from(client.server_info().max_payload).unwrap_or(i32::MAX),
        // A full stream refuses new messages (their publishers get 0x97) rather than
        // dropping the oldest, which may be a session's or a shared group's, acknowledged.
        max_bytes: match config.max_stream_bytes {
            0 => -1,
            bound => i64::try_from(bound).unwrap_or(i64::MAX),
        },
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    let regroup = stream::Config {
        name: REGROUP_STREAM.to_owned(),
        subjects: vec![format!("{REGROUP_SUBJECTS}.>")],
        ..messages.clone()
    };
    for (config, name) in [(messages, STREAM), (regroup, REGROUP_STREAM)] {
        if let Err(error) = js.create_or_update_stream(config).await {
            tracing::error!(%error, stream = name, "cluster: cannot create or update a message stream");
            return false;
        }
    }
    for (bucket, max_age) in [
        (RETAINED_BUCKET, Duration::ZERO),
        (SESSIONS_BUCKET, Duration::ZERO),
        (NODES_BUCKET, NODES_MAX_AGE),
    ] {
        if let Err(error) = ensure_bucket(js, bucket, max_age, config.replicas).await {
            tracing::error!(%error, bucket, "cluster: cannot create a bucket");
            return false;
        }
    }
    true
}

/// Makes sure KV bucket `bucket` exists, shaped as `async-nats` makes buckets (stream
/// `KV_<bucket>`, subjects `$KV.<bucket>.>`, one value per key (`max_age` 0: kept), rollups,
/// direct gets, discard new). Made here because 0.51's `create_key_value` first asks for the
/// account's info, whose 2.9 answer it cannot decode.
async fn ensure_bucket(
    js: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<(), async_nats::Error> {
    if js.get_key_value(bucket).await.is_ok() {
        return Ok(());
    }
    js.create_stream(stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: replicas,
        discard: stream::DiscardPolicy::New,
        duplicate_window: if max_age.is_zero() {
            DUPLICATE_WINDOW
        } else {
            DUPLICATE_WINDOW.min(max_age)
        },
        ..Default::default()
    })
    .await?;
    Ok(())
}
