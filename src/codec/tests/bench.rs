//! Rough timing of the hot paths, ignored by default. Run in release:
//! `cargo test --release --lib codec::tests::bench -- --ignored --nocapture`.

use std::hint::black_box;
use std::time::Instant;

use bytes::BytesMut;

use super::super::*;
use super::{V4, V5};

const N: usize = 200_000;

/// The payload of the PUBLISH every timing here decodes or encodes.
const PAYLOAD: [u8; 20] = [0x55; 20];

/// The header of that PUBLISH: QoS 1 with a realistic device topic.
fn header() -> PublishHeader<'static> {
    PublishHeader {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "sensors/building-7/floor-3/temperature",
        packet_id: 42,
        properties: None,
    }
}

fn publish_bytes(version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let _ = encode_publish(&header(), &PAYLOAD, version, &mut buf);
    buf.to_vec()
}

/// A read buffer holding `N` copies of the packet `one`, as a busy connection's does.
fn n_copies(one: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(one.len() * N);
    for _ in 0..N {
        buf.extend_from_slice(one);
    }
    buf
}

/// The best of 15 runs, in ns per operation: each run takes a state from `fresh` (not timed),
/// times `op` on it `N` times, then hands it to `check`. One loop for every timing here.
fn best_ns_per_op<T>(
    mut fresh: impl FnMut() -> T,
    mut op: impl FnMut(&mut T),
    mut check: impl FnMut(&T),
) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..15 {
        let mut state = fresh();
        let start = Instant::now();
        for _ in 0..N {
            op(&mut state);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / N as f64);
        check(&state);
    }
    best
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
        let best_decode = best_ns_per_op(
            || n_copies(&one),
            |buf| {
                let p = decode(buf, Some(version), 1 << 20);
                black_box(&p);
            },
            |buf| assert!(buf.is_empty()),
        );
        let header = header();
        let best_encode = best_ns_per_op(
            || BytesMut::with_capacity(one.len() * N),
            |out| {
                let r = encode_publish(black_box(&header), black_box(&PAYLOAD), version, out);
                black_box(&r);
            },
            |_| {},
        );
        // Floor set by the zero-copy design: split the packet off and take one more handle.
        let floor = best_ns_per_op(
            || n_copies(&one),
            |buf| {
                let packet = buf.split_to(one.len()).freeze();
                let topic = packet.slice(4..40);
                black_box((&packet, &topic));
            },
            |_| {},
        );
        println!("  split_to + freeze + one slice (the floor): {floor:.1} ns");
        println!(
            "{version:?} {}-byte PUBLISH: decode {best_decode:.1} ns, encode {best_encode:.1} ns",
            one.len()
        );
    }
}
