//! Codec micro-benchmarks: PUBLISH decode and encode, MQTT 3.1.1 and 5.0, 64 B and 4 KiB
//! payloads. Decoding runs over a read buffer holding many packets, as a busy connection's
//! does; encoding appends to a reused buffer, as the broker's write path does.
//!
//! Run: `cargo bench --bench codec` (filter: `cargo bench --bench codec -- decode/v5`).

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput};
use postbox::codec::{
    self, Packet, ProtocolVersion, Publish, PublishHeader, PublishProperties, QoS,
};

#[macro_use]
mod common;

/// Packets per decode batch: one iteration decodes a whole buffer of them.
const BATCH: usize = 256;
const MAX_PACKET: usize = 1 << 20;

/// A QoS 1 PUBLISH with a realistic device topic; `props` adds the v5 properties a typical
/// client sends (ignored by the 3.1.1 encoder).
fn publish(payload: usize, props: bool) -> Publish {
    let mut properties = PublishProperties::default();
    if props {
        properties.message_expiry_interval = Some(3600);
        properties.content_type = Some("application/json".into());
        properties.payload_format_indicator = Some(1);
    }
    Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "fleet/site-042/device-12345/telemetry".into(),
        packet_id: 4242,
        payload: vec![0xA5; payload].into(),
        properties,
    }
}

/// (name, version, with v5 properties)
const VARIANTS: [(&str, ProtocolVersion, bool); 3] = [
    ("v311", ProtocolVersion::V3_1_1, false),
    ("v5", ProtocolVersion::V5, false),
    ("v5-props", ProtocolVersion::V5, true),
];
const SIZES: [(&str, usize); 2] = [("64B", 64), ("4KiB", 4096)];

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    for (name, version, props) in VARIANTS {
        for (size_name, size) in SIZES {
            let mut one = BytesMut::new();
            codec::encode(&Packet::Publish(publish(size, props)), version, &mut one)
                .expect("benchmark packet encodes");
            let batch: Vec<u8> = one
                .iter()
                .copied()
                .cycle()
                .take(one.len() * BATCH)
                .collect();
            group.throughput(Throughput::Elements(BATCH as u64));
            group.bench_function(format!("{name}/{size_name}"), |b| {
                b.iter_batched_ref(
                    || BytesMut::from(&batch[..]),
                    |buf| {
                        while let Some(packet) =
                            codec::decode(buf, Some(version), MAX_PACKET).expect("decodes")
                        {
                            black_box(packet);
                        }
                    },
                    BatchSize::SmallInput,
                );
            });
        }
    }
    group.finish();
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (name, version, props) in VARIANTS {
        for (size_name, size) in SIZES {
            let p = publish(size, props);
            let header = PublishHeader {
                dup: false,
                qos: p.qos,
                retain: false,
                topic: &p.topic,
                packet_id: p.packet_id,
                properties: Some(&p.properties),
            };
            let mut buf = BytesMut::with_capacity(size + 256);
            group.throughput(Throughput::Elements(1));
            group.bench_function(format!("{name}/{size_name}"), |b| {
                b.iter(|| {
                    buf.clear();
                    codec::encode_publish(black_box(&header), &p.payload, version, &mut buf)
                        .expect("encodes");
                    black_box(&buf);
                });
            });
        }
    }
    group.finish();
}

short_benches!(30; decode, encode);
