//! Rough timing of the hot paths, ignored by default. Run in release:
//! `cargo test --release --lib codec::tests::bench -- --ignored --nocapture`.

use std::hint::black_box;
use std::time::Instant;

use bytes::BytesMut;

use super::super::*;
use super::{V4, V5};

const N: usize = 200_000;

fn publish_bytes(version: ProtocolVersion) -> Vec<u8> {
    let header = PublishHeader {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "sensors/building-7/floor-3/temperature",
        packet_id: 42,
        properties: None,
    };
    let mut buf = BytesMut::new();
    let _ = encode_publish(&header, &[0x55; 20], version, &mut buf);
    buf.to_vec()
}

#[test]
#[ignore = "timing, run explicitly in release mode"]
fn bench_decode_and_encode_publish() {
    println!(
        "size_of: Packet {} Publish {} PublishProperties {} ConnAck {}",
        size_of::<Packet>(),
        size_of::<Publish>(),
        size_of::<PublishProperties>(),
        size_of::<ConnAck>()
    );
    for version in [V4, V5] {
        let one = publish_bytes(version);
        let mut best_decode = f64::MAX;
        for _ in 0..15 {
            let mut buf = BytesMut::with_capacity(one.len() * N);
            for _ in 0..N {
                buf.extend_from_slice(&one);
            }
            let start = Instant::now();
            for _ in 0..N {
                let p = decode(&mut buf, Some(version), 1 << 20);
                black_box(&p);
            }
            best_decode = best_decode.min(start.elapsed().as_nanos() as f64 / N as f64);
            assert!(buf.is_empty());
        }
        let header = PublishHeader {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "sensors/building-7/floor-3/temperature",
            packet_id: 42,
            properties: None,
        };
        let payload = [0x55u8; 20];
        let mut best_encode = f64::MAX;
        for _ in 0..15 {
            let mut out = BytesMut::with_capacity(one.len() * N);
            let start = Instant::now();
            for _ in 0..N {
                let r = encode_publish(black_box(&header), black_box(&payload), version, &mut out);
                black_box(&r);
            }
            best_encode = best_encode.min(start.elapsed().as_nanos() as f64 / N as f64);
        }
        // Floor set by the zero-copy design: split the packet off and take one more handle.
        let mut floor = f64::MAX;
        for _ in 0..15 {
            let mut buf = BytesMut::with_capacity(one.len() * N);
            for _ in 0..N {
                buf.extend_from_slice(&one);
            }
            let start = Instant::now();
            for _ in 0..N {
                let packet = buf.split_to(one.len()).freeze();
                let topic = packet.slice(4..40);
                black_box((&packet, &topic));
            }
            floor = floor.min(start.elapsed().as_nanos() as f64 / N as f64);
        }
        println!("  split_to + freeze + one slice (the floor): {floor:.1} ns");
        println!(
            "{version:?} {}-byte PUBLISH: decode {best_decode:.1} ns, encode {best_encode:.1} ns",
            one.len()
        );
    }
}
