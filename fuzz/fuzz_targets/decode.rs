//! Feeds arbitrary bytes to the decoder at every protocol level (and before the handshake).
//! Decoding must never panic, and every packet it accepts must survive encode → decode
//! unchanged at the level it was decoded at.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use postbox::codec::{decode, decode_fixed_header, encode, Packet, ProtocolVersion};

const LEVELS: [Option<ProtocolVersion>; 4] = [
    None,
    Some(ProtocolVersion::V3_1),
    Some(ProtocolVersion::V3_1_1),
    Some(ProtocolVersion::V5),
];

fuzz_target!(|data: &[u8]| {
    // The first byte picks the size limit, so PacketTooLarge paths get exercised too.
    let max = match data.first() {
        Some(&b) if b & 1 == 1 => usize::from(b),
        _ => usize::MAX,
    };
    let _ = decode_fixed_header(data, max);
    for version in LEVELS {
        let mut buf = BytesMut::from(data);
        while let Ok(Some(packet)) = decode(&mut buf, version, max) {
            let level = match (&packet, version) {
                (Packet::Connect(c), _) => c.protocol,
                (_, Some(v)) => v,
                (_, None) => unreachable!("only CONNECT decodes before the handshake"),
            };
            let mut out = BytesMut::new();
            encode(&packet, level, &mut out).expect("a decoded packet is encodable");
            let again = decode(&mut out, Some(level), usize::MAX);
            assert_eq!(again, Ok(Some(packet)), "re-encoding changed the packet");
            assert!(out.is_empty(), "re-encoding left trailing bytes");
        }
    }
});
