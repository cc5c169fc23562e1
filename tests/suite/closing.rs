//! How the broker ends a connection, over real sockets: a client that is still writing when
//! the broker closes still reads the reason (the final DISCONNECT or the refusing CONNACK),
//! and a CONNECT that no CONNACK can answer is closed instead of left silent.
//!
//! Statement ids follow the OASIS MQTT 5.0 text; "list:" gives the id in
//! `shared/spec/mqtt-5.0-normative-statements.txt` where it differs.
//!
//! Why a still-writing client needs care: closing a TCP socket with unread input makes Linux
//! answer with a reset instead of a FIN, and a reset can destroy the final packet before the
//! client reads it. The flood in these tests leaves exactly that unread input behind.

use crate::common;

use std::net::SocketAddr;
use std::os::fd::AsFd;

use bytes::BytesMut;
use common::{v5, RawClient};
use postbox::codec::{self, Packet, ProtocolVersion, PubResponse, QoS, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

/// Starts writing `bytes` to `c`'s socket from another task (through a second descriptor of
/// the same socket), so the test can read while the client is still writing. Write errors
/// end the task quietly: the broker closing is what the tests provoke.
fn keep_writing(c: &RawClient, bytes: BytesMut) -> JoinHandle<()> {
    let fd = c
        .stream
        .as_fd()
        .try_clone_to_owned()
        .expect("duplicate the socket");
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).expect("non-blocking");
    let mut writer = TcpStream::from_std(std).expect("register with the runtime");
    tokio::spawn(async move {
        for chunk in bytes.chunks(64 * 1024) {
            if writer.write_all(chunk).await.is_err() {
                return;
            }
        }
    })
}

/// Appends `packet` encoded for `version`.
fn put(buf: &mut BytesMut, packet: &Packet, version: ProtocolVersion) {
    codec::encode(packet, version, buf).expect("encode");
}

/// 65,536 QoS 2 PUBLISHes (packet ids 1..=65535, then 1 again), then a PUBREL for every id:
/// what a client with a long backlog sends when it ignores the Receive Maximum.
fn qos2_flood(version: ProtocolVersion) -> BytesMut {
    let mut flood = BytesMut::new();
    for i in 0..65_536u32 {
        let id = u16::try_from(i % 65_535 + 1).expect("in range");
        let publish = v5::publish_packet("flood", QoS::ExactlyOnce, b"x", id);
        put(&mut flood, &Packet::Publish(publish), version);
    }
    for id in 1..=u16::MAX {
        put(&mut flood, &Packet::PubRel(PubResponse::new(id)), version);
    }
    flood
}

/// A CONNECT for `version` followed by about 1 MiB of QoS 0 PUBLISHes: a client that does
/// not wait for CONNACK before publishing.
fn connect_then_publishes(connect: &[u8], version: ProtocolVersion) -> BytesMut {
    let mut bytes = BytesMut::from(connect);
    let publish = v5::publish_packet("early", QoS::AtMostOnce, &[b'p'; 100], 0);
    while bytes.len() < 1 << 20 {
        put(&mut bytes, &Packet::Publish(publish.clone()), version);
    }
    bytes
}

/// Opens a connection whose receive buffer is as small as the kernel allows, so a client that
/// writes without reading fills its receive window with a few KiB of the broker's answers
/// (with the default buffer it would take more than the broker sends before it closes).
async fn open_small_window(addr: SocketAddr) -> RawClient {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(1024).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("tcp connect");
    stream.set_nodelay(true).expect("nodelay");
    RawClient::over(stream, v5::V)
}

/// Every packet until the broker ends the connection, and how it ended: `Ok` for an orderly
/// close (FIN), `Err` for a reset. Panics after `WAIT`.
async fn read_until_end(c: &mut RawClient) -> (Vec<Packet>, std::io::Result<()>) {
    let mut seen = Vec::new();
    let end = tokio::time::timeout(common::WAIT, async {
        loop {
            while let Some(p) = codec::decode(&mut c.buf, Some(c.version), 1 << 28)
                .expect("the broker sends decodable packets")
            {
                seen.push(p);
            }
            match c.stream.read_buf(&mut c.buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("timed out waiting for the close");
    (seen, end)
}

/// Waits (bounded) for a writer started by [`keep_writing`].
async fn writer_ends(writer: JoinHandle<()>) {
    tokio::time::timeout(common::WAIT, writer)
        .await
        .expect("the writer ends once the broker has read or refused its bytes")
        .expect("writer task");
}

#[tokio::test]
async fn a_client_still_writing_reads_disconnect_0x93() {
    // v5 §3.3.4: a Server that receives more than Receive Maximum unacknowledged QoS 1/2
    // PUBLISHes uses DISCONNECT 0x93 (the client broke MQTT-3.3.4-7); MQTT-3.14.4-2: after
    // sending DISCONNECT the sender closes. The client writes its whole backlog before it
    // reads, so when the broker closes, its PUBLISHes and PUBRELs are still arriving and the
    // broker's answers still wait for room in the client's receive window: a reset then would
    // throw away the DISCONNECT unsent.
    let server = common::start().await;
    let mut c = open_small_window(server.mqtt_addr).await;
    c.send(&Packet::Connect(Box::new(v5::connect_packet("flood-rm"))))
        .await;
    let receive_maximum = match c.recv().await {
        Some(Packet::ConnAck(ack)) if ack.reason_code == ReasonCode::SUCCESS => {
            ack.properties.receive_maximum.map_or(65_535, usize::from)
        }
        other => panic!("expected CONNACK, got {other:?}"),
    };
    assert!(receive_maximum < 65_536, "the flood must exceed it");
    writer_ends(keep_writing(&c, qos2_flood(v5::V))).await;
    let (seen, end) = read_until_end(&mut c).await;
    match seen.last() {
        Some(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, ReasonCode::RECEIVE_MAXIMUM_EXCEEDED);
            assert!(d.properties.reason_string.is_some(), "the reason in words");
        }
        other => panic!(
            "expected DISCONNECT 0x93 last, got {other:?} after {} packets, end {end:?}",
            seen.len()
        ),
    }
    end.expect("an orderly close after the DISCONNECT");
}

#[tokio::test]
async fn a_client_still_writing_reads_the_refusing_connack() {
    // MQTT-3.1.2-2 (3.1.1): an unacceptable protocol level gets CONNACK 0x01, then the close;
    // MQTT-3.2.2-7 (5.0): after a refusing CONNACK the Server closes. The client pipelines
    // PUBLISHes behind its CONNECT; it must read the CONNACK and then an orderly close, not a
    // reset (which a client's stack may take as leave to drop the CONNACK unread).
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, ProtocolVersion::V3_1_1).await;
    let level_7 = [
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x07, 0x02, 0x00, 0x0A, 0x00, 0x01, b'x',
    ];
    let writer = keep_writing(
        &c,
        connect_then_publishes(&level_7, ProtocolVersion::V3_1_1),
    );
    assert_eq!(c.recv_bytes(4).await, [0x20, 0x02, 0x00, 0x01]);
    let (seen, end) = read_until_end(&mut c).await;
    assert!(seen.is_empty(), "{seen:?}");
    end.expect("an orderly close after the CONNACK");
    writer_ends(writer).await;

    // v5, refused by authentication (MQTT-3.1.4-2, CONNACK 0x87 Not authorized).
    let mut config = common::test_config();
    config.auth.allow_anonymous = false;
    let server = common::start_with(config).await;
    let mut c = RawClient::open(server.mqtt_addr, v5::V).await;
    let mut connect = BytesMut::new();
    put(
        &mut connect,
        &Packet::Connect(Box::new(v5::connect_packet("anon-flood"))),
        v5::V,
    );
    let writer = keep_writing(&c, connect_then_publishes(&connect, v5::V));
    let (seen, end) = read_until_end(&mut c).await;
    match &seen[..] {
        [Packet::ConnAck(ack)] => {
            assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED);
            assert!(
                ack.properties.reason_string.is_some(),
                "the reason in words"
            );
        }
        other => panic!("expected the refusing CONNACK alone, got {other:?}"),
    }
    end.expect("an orderly close after the CONNACK");
    writer_ends(writer).await;
}

#[tokio::test]
async fn connect_no_connack_fits_is_closed() {
    // MQTT-3.1.2-24 (list: -27): the Server must not send a packet above the client's Maximum
    // Packet Size. When even the CONNACK does not fit, nothing can be sent: the connection
    // is closed (not left open and silent), and nothing about the session changes.
    let server = common::start().await;
    // The CONNACK this client id gets, to go one byte below it.
    let (mut first, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("mps")).await;
    let mut encoded = BytesMut::new();
    put(&mut encoded, &Packet::ConnAck(ack), v5::V);
    for max in [2, u32::try_from(encoded.len() - 1).expect("small")] {
        let mut connect = v5::connect_packet("mps");
        connect.properties.maximum_packet_size = Some(max);
        let mut c = RawClient::open(server.mqtt_addr, v5::V).await;
        c.send(&Packet::Connect(Box::new(connect))).await;
        let seen = c.expect_close().await;
        assert!(seen.is_empty(), "Maximum Packet Size {max}: {seen:?}");
    }
    // The refused CONNECT did not take the session over (MQTT-3.1.4-3 applies only to a
    // CONNECT the Server accepts): the first connection still works.
    first.send(&Packet::PingReq).await;
    assert!(matches!(first.recv().await, Some(Packet::PingResp)));
}
