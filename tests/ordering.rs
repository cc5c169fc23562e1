//! Order across connections: a SUBSCRIBE that reached the broker before a PUBLISH on another
//! connection must see that PUBLISH, even when both connections were idle just before.
//!
//! Runs the real binary (its own runtime, as users run it) and drives it with blocking
//! sockets from one thread, so the gap between the two writes is what the test says.

#[path = "common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use postbox::codec::{self, Packet, ProtocolVersion, QoS};

use common::process::{free_port, Broker};

const WAIT: Duration = Duration::from_secs(15);
const V4: ProtocolVersion = ProtocolVersion::V3_1_1;

/// The binary on its defaults, metrics off, running (killed when dropped).
fn start(port: u16, dir: &std::path::Path) -> Broker {
    let dir = dir.to_str().expect("utf8 path");
    let port = port.to_string();
    Broker::start_args(
        &["--port", &port, "--metrics-port", "0", "--data-dir", dir],
        &[],
    )
}

/// A blocking MQTT 3.1.1 client.
struct Client {
    stream: TcpStream,
    buf: BytesMut,
}

impl Client {
    /// Connects to the running broker and completes CONNECT / CONNACK.
    fn connect(port: u16, id: &str) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("broker accepts");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut c = Client {
            stream,
            buf: BytesMut::new(),
        };
        c.send(&Packet::Connect(Box::new(common::connect_packet(V4, id))));
        assert!(matches!(c.recv(), Packet::ConnAck(a) if a.reason_code.0 == 0));
        c
    }

    fn encode(packet: &Packet) -> Vec<u8> {
        common::encode(packet, V4)
    }

    fn send(&mut self, packet: &Packet) {
        self.stream.write_all(&Self::encode(packet)).expect("write");
    }

    fn recv(&mut self) -> Packet {
        loop {
            if let Some(p) = codec::decode(&mut self.buf, Some(V4), 1 << 20).expect("decodable") {
                return p;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("read within the wait");
            assert!(n > 0, "broker closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn subscribe(filter: &str, id: u16) -> Packet {
    Packet::Subscribe(codec::Subscribe {
        packet_id: id,
        filters: vec![(filter.into(), codec::SubscriptionOptions::default())],
        ..Default::default()
    })
}

fn publish(topic: &str, payload: &'static [u8]) -> Packet {
    Packet::Publish(codec::Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: topic.into(),
        packet_id: 0,
        payload: bytes::Bytes::from_static(payload),
        properties: Default::default(),
    })
}

/// Busy-waits `gap`: a sleep would oversleep by far more than the gap itself.
fn spin(gap: Duration) {
    let start = Instant::now();
    while start.elapsed() < gap {
        std::hint::spin_loop();
    }
}

/// Once the broker has the SUBSCRIBE, a later PUBLISH on another connection that matches must
/// reach the new subscription (what single-threaded brokers give; the spec orders only within
/// one connection, §4.6). 50 rounds after an idle pause.
///
/// Without the ordering work 7 to 14 rounds of 50 missed; with the subscribe fence and
/// scheduler turns alone 1 to 5; with reads waiting for earlier arrivals
/// (`broker::ArrivalOrder`), none, also while other processes compete for the two cores.
#[test]
fn subscribe_that_arrived_first_sees_the_publish_after_it() {
    let port = free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let _broker = start(port, dir.path());
    let mut subscriber = Client::connect(port, "ordering-sub");
    let mut publisher = Client::connect(port, "ordering-pub");
    let rounds = 50u16;
    let mut misses = Vec::new();
    for round in 1..=rounds {
        let topic = format!("ordering/{round}");
        let subscribe = Client::encode(&subscribe(&topic, round));
        let first = Client::encode(&publish(&topic, b"first"));
        // Both connections idle, as between requests in a real app.
        std::thread::sleep(Duration::from_millis(300));
        subscriber.stream.write_all(&subscribe).expect("write");
        spin(Duration::from_micros(100));
        publisher.stream.write_all(&first).expect("write");
        assert!(matches!(subscriber.recv(), Packet::SubAck(a) if a.packet_id == round));
        // A marker after the SUBACK is certain to match: what comes before it tells.
        publisher.send(&publish(&topic, b"marker"));
        match subscriber.recv() {
            Packet::Publish(p) if p.payload.as_ref() == b"first" => {
                assert!(
                    matches!(subscriber.recv(), Packet::Publish(p) if p.payload.as_ref() == b"marker")
                );
            }
            Packet::Publish(p) if p.payload.as_ref() == b"marker" => misses.push(round),
            other => panic!("unexpected {other:?}"),
        }
    }
    println!("{} of {rounds} rounds missed: {misses:?}", misses.len());
    assert!(
        misses.is_empty(),
        "{} of {rounds} rounds lost the publish sent after the subscribe: {misses:?}",
        misses.len()
    );
}
