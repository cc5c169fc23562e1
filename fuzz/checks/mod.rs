//! The bodies of the fuzz targets, one function per target, shared by the cargo-fuzz binaries
//! (`fuzz/fuzz_targets/*.rs`, nightly) and the stable test that replays the committed corpus
//! (`tests/suite/fuzz_corpus.rs`), so the corpus is checked on every `cargo test` through the very
//! code the fuzzer ran. Each function panics on a finding and returns quietly otherwise.
//!
//! Included with `#[path]` (not a crate): it needs nothing but `postbox`'s public API, `bytes`
//! and `tempfile`, which both sides already depend on.

#![allow(dead_code)] // each fuzz binary uses one of the functions

use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use postbox::codec::{
    decode, decode_fixed_header, decode_with, encode, encode_within, topic, DecodeRules, Packet,
    ProtocolVersion, ReasonCode, ReasonContext,
};
use postbox::config::MqttConfig;
use postbox::test_support::auth::{AuthRegistry, AuthState, AuthStep, Authenticator};
use postbox::test_support::connection::admission::{self, Answer, Decision, Policy};
use postbox::test_support::storage::log_store::STORE_DIR;
use postbox::test_support::storage::{FsyncPolicy, LogOptions, LogStore, StorageError, Store};

/// A target's body: panics on a finding.
pub(crate) type Check = fn(&[u8]);

/// The targets, by the name of their corpus directory (`fuzz/corpus/<name>/`).
pub(crate) const TARGETS: [(&str, Check); 4] = [
    ("decode", decode_roundtrip),
    ("decode_rules", decode_rules),
    ("connect", connect),
    ("recovery", recovery),
];

const LEVELS: [Option<ProtocolVersion>; 4] = [
    None,
    Some(ProtocolVersion::V3_1),
    Some(ProtocolVersion::V3_1_1),
    Some(ProtocolVersion::V5),
];

/// Target `decode`: arbitrary bytes at every protocol level (and before the handshake).
/// Decoding must never panic, and every packet it accepts must survive encode → decode
/// unchanged at the level it was decoded at.
pub(crate) fn decode_roundtrip(data: &[u8]) {
    // The first byte picks the size limit, so PacketTooLarge paths get exercised too.
    let max = match data.first() {
        Some(&b) if b & 1 == 1 => usize::from(b),
        _ => usize::MAX,
    };
    let _ = decode_fixed_header(data, max);
    for version in LEVELS {
        let mut buf = BytesMut::from(data);
        while let Ok(Some(packet)) = decode(&mut buf, version, max) {
            let level = level_of(&packet, version);
            let mut out = BytesMut::new();
            encode(&packet, level, &mut out).expect("a decoded packet is encodable");
            let again = decode(&mut out, Some(level), usize::MAX);
            assert_eq!(again, Ok(Some(packet)), "re-encoding changed the packet");
            assert!(out.is_empty(), "re-encoding left trailing bytes");
        }
    }
}

/// The level a packet decoded at `version` is encoded at (a CONNECT names its own).
fn level_of(packet: &Packet, version: Option<ProtocolVersion>) -> ProtocolVersion {
    match (packet, version) {
        (Packet::Connect(c), _) => c.protocol,
        (_, Some(v)) => v,
        (_, None) => panic!("only CONNECT decodes before the handshake"),
    }
}

/// Target `decode_rules`: the decoder with the receiver's `DecodeRules` (src/codec/rules.rs).
/// Byte 0 picks the level (bits 0-1) and whether control characters are allowed (bit 2);
/// byte 1, when bit 3 is set, a small maximum packet size. The rest is the stream.
///
/// Checks: the rules only ever narrow `decode` (what `decode_with` accepts, plain `decode`
/// accepts identically, and the whole stream decodes the same until the rules refuse);
/// an accepted packet was within the maximum size as sent, carries no control character in a topic
/// name or filter when they are refused (5.0 §1.5.4 as `DecodeRules` documents it), and its
/// re-encoding decodes to itself under the same character rules.
pub(crate) fn decode_rules(data: &[u8]) {
    let (Some(&b0), Some(&b1)) = (data.first(), data.get(1)) else {
        return;
    };
    let version = LEVELS[usize::from(b0 & 3)];
    let rules = DecodeRules {
        max_packet_size: if b0 & 8 != 0 {
            usize::from(b1) + 2
        } else {
            usize::MAX
        },
        allow_control_characters: b0 & 4 != 0,
    };
    let stream = &data[2..];
    let mut strict = BytesMut::from(stream);
    let mut lenient = BytesMut::from(stream);
    // Bounded: every accepted packet consumes at least 2 bytes.
    loop {
        let before = strict.len();
        let narrow = decode_with(&mut strict, version, rules);
        let wide = decode(&mut lenient, version, rules.max_packet_size);
        let packet = match narrow {
            Ok(Some(packet)) => packet,
            Ok(None) => {
                assert!(matches!(wide, Ok(None)), "rules made a packet incomplete");
                return;
            }
            Err(_) => return, // a refusal the spec does not make is what the rules are for
        };
        assert_eq!(
            wide.as_ref(),
            Ok(&Some(packet.clone())),
            "the rules changed an accepted packet"
        );
        // The packet as sent, not its re-encoding: the encoder may spell it longer (an AUTH or
        // DISCONNECT with Remaining Length 1 gets its Property Length written out).
        assert!(
            before - strict.len() <= rules.max_packet_size,
            "accepted a packet above the maximum packet size"
        );
        let level = level_of(&packet, version);
        let mut out = BytesMut::new();
        encode(&packet, level, &mut out).expect("a decoded packet is encodable");
        if !rules.allow_control_characters {
            for name in topics(&packet) {
                assert!(
                    !topic::has_disallowed_code_points(name),
                    "control character accepted in {name:?}"
                );
            }
        }
        let unlimited = DecodeRules {
            max_packet_size: usize::MAX,
            ..rules
        };
        let again = decode_with(&mut out, Some(level), unlimited);
        assert_eq!(again, Ok(Some(packet)), "re-encoding changed the packet");
        assert!(out.is_empty(), "re-encoding left trailing bytes");
    }
}

/// Topic names and filters a packet carries (the strings `allow_control_characters` governs).
fn topics(packet: &Packet) -> Vec<&str> {
    match packet {
        Packet::Publish(p) => vec![&*p.topic],
        Packet::Subscribe(s) => s.filters.iter().map(|(f, _)| &**f).collect(),
        Packet::Unsubscribe(u) => u.filters.iter().map(|f| &**f).collect(),
        Packet::Connect(c) => c.will.iter().map(|w| &*w.topic).collect(),
        _ => Vec::new(),
    }
}

/// An authenticator that is only ever looked up: `admission::decide` runs no steps.
struct Offered;

impl Authenticator for Offered {
    fn method(&self) -> &str {
        "fuzz"
    }
    fn start(&self, _client_id: &str, _data: Option<Bytes>) -> AuthStep {
        AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)
    }
    fn continue_(&self, _state: AuthState, _data: Option<Bytes>) -> AuthStep {
        AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)
    }
}

/// Target `connect`: the CONNECT handshake's decision (`connection::admission::decide`).
/// Bytes 0-1 pick the broker's policy (anonymous access, control characters, zero-length
/// client ids, maximum QoS, retain, will payload validation, a low keep-alive maximum,
/// response information, a small maximum packet size, an offered "fuzz" auth method); the
/// rest is what the client sent.
///
/// Checks: every CONNACK the broker would send carries a code allowed in CONNACK (v5
/// §3.2.2.2), encodes at the client's level within the client's Maximum Packet Size
/// (MQTT-3.1.2-24) and decodes back; an accepted client gets 0x00 with a keep-alive within the
/// broker's maximum (v5: MQTT-3.2.2-21) and a session expiry within its maximum.
pub(crate) fn connect(data: &[u8]) {
    let (Some(&b0), Some(&b1)) = (data.first(), data.get(1)) else {
        return;
    };
    let config = MqttConfig {
        allow_control_characters: b0 & 1 != 0,
        allow_zero_length_clientid: b0 & 2 == 0,
        max_qos: (b0 >> 2) % 3,
        retain_available: b0 & 0x10 == 0,
        validate_utf8_payload: b0 & 0x20 != 0,
        max_keepalive: if b0 & 0x40 != 0 { 60 } else { u16::MAX },
        response_information: (b0 & 0x80 != 0).then(|| "fuzz/response".to_owned()),
        max_packet_size: if b1 & 1 != 0 { 64 } else { 1_048_576 },
        session_expiry_interval_max: if b1 & 2 != 0 { 300 } else { u32::MAX },
        topic_alias_maximum: u16::from(b1 & 4 != 0) * 10,
        ..MqttConfig::default()
    };
    let authenticators = AuthRegistry::new();
    if b1 & 8 != 0 {
        authenticators
            .register(Arc::new(Offered))
            .expect("one method, a valid name");
    }
    let policy = Policy {
        config: &config,
        allow_anonymous: b1 & 0x10 == 0,
        password_file: false,
        jwt: false,
        certified: false,
        authenticators: &authenticators,
    };
    match admission::decide(&data[2..], &policy) {
        Decision::Incomplete | Decision::NotConnect => {}
        Decision::Undecodable { answer, .. } => {
            if let Some((version, code)) = answer {
                let connack = admission::refusal_connack(code, None, None);
                check_connack(&connack, version, usize::MAX, false);
            }
        }
        Decision::Judged {
            version,
            client_max,
            answer,
        } => match answer {
            Answer::Refuse {
                refusal: (code, why),
                explain,
            } => {
                // `decide` has no Connect to hand out; a reason string is the longest a
                // refusal gets, and `encode_within` drops it when it does not fit.
                let connack = if explain && version.is_v5() {
                    let mut c = admission::refusal_connack(code, None, None);
                    c.properties.reason_string = Some(why.into());
                    c
                } else {
                    admission::refusal_connack(code, None, None)
                };
                let max = if explain { client_max } else { usize::MAX };
                check_connack(&connack, version, max, false);
            }
            Answer::Accept {
                connack,
                keep_alive,
                expiry_interval,
            } => {
                assert_eq!(connack.reason_code, ReasonCode::SUCCESS);
                if version.is_v5() {
                    assert!(keep_alive != 0 && keep_alive <= config.max_keepalive);
                    assert!(expiry_interval <= config.session_expiry_interval_max);
                }
                check_connack(&connack, version, client_max, true);
            }
            Answer::CloseUnanswered => assert!(client_max != usize::MAX),
        },
    }
}

/// `connack` carries a CONNACK code, encodes, is never sent above `max` (and when `whole`, an
/// accepting CONNACK, fits whole), and decodes back to itself at `version`.
fn check_connack(
    connack: &postbox::codec::ConnAck,
    version: ProtocolVersion,
    max: usize,
    whole: bool,
) {
    assert!(
        connack.reason_code.allowed_in(ReasonContext::ConnAck),
        "{:?} is not a CONNACK code",
        connack.reason_code
    );
    let packet = Packet::ConnAck(connack.clone());
    let mut out = BytesMut::new();
    let fits = encode_within(&packet, version, max, &mut out).expect("the CONNACK encodes");
    // A refusal that does not fit even without its Reason String is not sent (the handshake
    // closes without it); an acceptance that does not fit is `CloseUnanswered`, never this.
    assert!(
        fits || !whole,
        "an accepting CONNACK does not fit the client's maximum"
    );
    assert!(out.len() <= max);
    let mut full = BytesMut::new();
    encode(&packet, version, &mut full).expect("the CONNACK encodes");
    if whole {
        assert_eq!(full.len(), out.len(), "an accepting CONNACK was cut down");
    }
    let back = decode(&mut full, Some(version), usize::MAX);
    let expected = if version.is_v5() {
        packet
    } else {
        // 3.x carries only the return code (and Session Present).
        let mut c = connack.clone();
        c.properties = Default::default();
        Packet::ConnAck(c)
    };
    if let Ok(Some(Packet::ConnAck(got))) = &back {
        if !version.is_v5() {
            // 3.x return codes are the v3 equivalent; compare what survives.
            assert_eq!(got.session_present, connack.session_present);
            return;
        }
    }
    assert_eq!(back, Ok(Some(expected)), "the CONNACK does not decode back");
}

/// The store's file names for generation 1 (`format::log_name`, `format::snapshot_name`).
const LOG_1: &str = "log-00000000000000000001.pbl";
/// Snapshot 1 holds the state at the end of log 0: it is read with log 1.
const SNAPSHOT_1: &str = "snapshot-00000000000000000001.pbs";

/// The 24-byte file header of the store's format (docs/durability.md, "Files"): magic,
/// format version 1, generation, CRC32 of the 20 bytes before it.
fn file_header(magic: [u8; 8], gen: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(24);
    h.extend_from_slice(&magic);
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&gen.to_le_bytes());
    let crc = crc32(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// CRC-32 (IEEE), bitwise: the fuzz side needs no crc crate for a few hundred bytes.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Frames `body` as the store does (`len | crc32(body) | crc32(len, crc) | body`).
fn push_frame(out: &mut Vec<u8>, body: &[u8]) {
    let len = body.len() as u32;
    let mut head = Vec::with_capacity(8);
    head.extend_from_slice(&len.to_le_bytes());
    head.extend_from_slice(&crc32(body).to_le_bytes());
    let hcrc = crc32(&head);
    out.extend_from_slice(&head);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(body);
}

/// Target `recovery`: arbitrary bytes as a store file, opened through the store's public entry
/// point (`LogStore::open` on a directory, the path `storage::open` takes at start-up).
///
/// Byte 0: bit 0 puts the bytes in `snapshot-1.pbs` (beside an empty `log-1.pbl`) instead of
/// `log-1.pbl`; bit 1 "framed": the rest is chunks (`len: u16` LE, then `len` bytes) that get a
/// valid header and valid frame checksums (so the fuzzer reaches the op decoder), where the
/// last chunk may be cut short; otherwise the bytes are the file as they are.
///
/// Checks (docs/durability.md, "Recovery" and "Damage"): opening never panics whatever
/// the file holds, and never fails ("`open` fails only when the directory cannot be created,
/// written or renamed") except on a store holding the last message id; what it recovers loads, and a second open of the same directory
/// recovers the same state (a torn tail or a corrupt store moved aside leaves a store that
/// opens cleanly).
pub(crate) fn recovery(data: &[u8]) {
    let Some(&mode) = data.first() else {
        return;
    };
    let rest = &data[1..];
    let snapshot = mode & 1 != 0;
    let (magic, name): ([u8; 8], &str) = if snapshot {
        (*b"PBXSNAP\x01", SNAPSHOT_1)
    } else {
        (*b"PBXLOG\0\x01", LOG_1)
    };
    let file = if mode & 2 != 0 {
        let mut f = file_header(magic, 1);
        let mut chunks = rest;
        while let [lo, hi, tail @ ..] = chunks {
            let len = usize::from(u16::from_le_bytes([*lo, *hi]));
            if len > tail.len() {
                // A torn last frame: the header promises more than was written.
                let mut body = tail.to_vec();
                body.resize(len, 0);
                let mut whole = Vec::new();
                push_frame(&mut whole, &body);
                f.extend_from_slice(&whole[..12 + tail.len()]);
                break;
            }
            push_frame(&mut f, &tail[..len]);
            chunks = &tail[len..];
        }
        f
    } else {
        rest.to_vec()
    };
    let tmp = scratch_dir();
    let store_dir = tmp.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("creating the store directory");
    std::fs::write(store_dir.join(name), &file).expect("writing the fuzzed file");
    if snapshot {
        std::fs::write(store_dir.join(LOG_1), file_header(*b"PBXLOG\0\x01", 1))
            .expect("writing the log");
    }
    let first = open_and_load(tmp.path());
    let second = open_and_load(tmp.path());
    assert_eq!(first, second, "a second open recovered a different state");
}

/// Opens the store in `dir` (no fsync beyond what recovery always does), loads and closes it.
/// `None`: the one refusal `LogStore::open` makes on file contents, a store holding message
/// id `u64::MAX` (no id left to allocate; found by this target).
fn open_and_load(dir: &Path) -> Option<postbox::test_support::storage::Snapshot> {
    let opts = LogOptions {
        fsync: FsyncPolicy::Never,
        ..LogOptions::from_config(&postbox::test_support::storage::StorageConfig::default())
    };
    // The lock the previous open released may still be held by a copy of its descriptor in
    // a child process another test of the same process is spawning (a `flock` belongs to the
    // open file, not the descriptor; the copy goes at the child's exec). Nothing signals
    // that exec, so an open refused for a lock this process holds is tried again, at most 50
    // times 20 ms apart, as `tests/common::start_with` does.
    let ours = format!("pid {},", std::process::id());
    let mut tries = 0;
    let store = loop {
        match LogStore::open(dir, opts.clone()) {
            Ok(store) => break store,
            Err(StorageError::Corrupt(why)) if why.contains("no id is left") => return None,
            Err(StorageError::Locked { holder, .. }) if holder.starts_with(&ours) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("open failed on file contents: {e}"),
        }
    };
    let snapshot = store.load().expect("a recovered store loads");
    store.close().expect("a recovered store closes");
    Some(snapshot)
}

/// A temporary directory, in memory when the machine has /dev/shm (recovery fsyncs).
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("creating a temporary directory")
}
