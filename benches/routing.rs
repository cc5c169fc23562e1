//! Routing one PUBLISH through the real broker state to 1, 100 and 10,000 subscribers of its
//! topic: subscription match, per-session enqueue, wake-up. Queues are drained between timed
//! batches (untimed), so every publish takes the normal path, never the queue-full one.
//!
//! `route_publish_bridged` is the same with one bridge's session given queue limits of its own
//! (`Broker::set_queue_limits`, not a subscriber here): what every other session's admission
//! then pays for the lookup of its bounds.
//!
//! Run: `cargo bench --bench routing`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use criterion::{BenchmarkId, Criterion, Throughput};
use postbox::codec::{ProtocolVersion, Publish, QoS, SubscriptionOptions};
use postbox::config::Config;
use postbox::test_support::broker::{
    Attached, Broker, Message, Parts, SessionQueueLimits, SessionRequest,
};
use postbox::test_support::metrics::Metrics;

#[macro_use]
mod common;

const TOPIC: &str = "fleet/site-042/device-12345/telemetry";

struct Setup {
    broker: Arc<Broker>,
    sessions: Vec<Attached>,
    message: Arc<Message>,
}

fn setup(subscribers: usize, qos: QoS) -> Setup {
    let config = Config::default();
    let broker = Broker::new(Parts::bare(config.mqtt, config.auth, Metrics::register()));
    let filter = ByteString::from(TOPIC);
    let sessions: Vec<Attached> = (0..subscribers)
        .map(|i| {
            let attached = broker.connect(SessionRequest {
                client_id: format!("sub-{i}").into(),
                clean_start: true,
                expiry_interval: 0,
                protocol: ProtocolVersion::V3_1_1,
                client_max_packet: 0,
            });
            let options = SubscriptionOptions {
                qos,
                ..Default::default()
            };
            attached.handle.subscribe(&filter, options, None);
            attached
        })
        .collect();
    let message = Arc::new(Message::from_publish(
        Publish {
            qos,
            topic: TOPIC.into(),
            payload: vec![0x5A; 64].into(),
            ..Default::default()
        },
        None,
    ));
    Setup {
        broker,
        sessions,
        message,
    }
}

fn drain(sessions: &[Attached]) {
    for attached in sessions {
        attached.handle.purge_queue();
    }
}

fn routing(c: &mut Criterion) {
    route(c, "route_publish", false);
    route(c, "route_publish_bridged", true);
}

fn route(c: &mut Criterion, name: &str, bridged: bool) {
    let mut group = c.benchmark_group(name);
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
        for subscribers in [1usize, 100, 10_000] {
            let s = setup(subscribers, qos);
            if bridged {
                s.broker.set_queue_limits(
                    "$bridge/cloud",
                    SessionQueueLimits {
                        max_messages: 100_000,
                        max_bytes: 0,
                        overflow: postbox::config::OverflowPolicy::Refuse,
                    },
                );
            }
            // Stay well under the default 1,000-message queue and bound memory.
            let batch = (200_000 / subscribers).clamp(1, 500) as u64;
            group.throughput(Throughput::Elements(subscribers as u64));
            let id = BenchmarkId::new(format!("qos{}", qos as u8), subscribers);
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    let mut done = 0;
                    while done < iters {
                        let n = batch.min(iters - done);
                        let started = Instant::now();
                        for _ in 0..n {
                            let _ = black_box(s.broker.publish(Arc::clone(&s.message), None));
                        }
                        timed += started.elapsed();
                        drain(&s.sessions);
                        done += n;
                    }
                    timed
                });
            });
        }
    }
    group.finish();
}

short_benches!(20; routing);
