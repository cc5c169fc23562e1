//! Several MQTT listeners in one broker, over real sockets: `[[listener]]` entries serve one
//! broker, the old single `[listener]` table still works, and shutdown stops every listener
//! before telling the clients on all of them.

use crate::common;

use common::{v5, RawClient, WAIT};
use postbox::codec::{Packet, ProtocolVersion, QoS, ReasonCode};
use postbox::config::Config;
use postbox::server::RunningServer;

/// Starts a broker from TOML text (the listener sections), in memory and without metrics.
async fn start_from(listeners: &str) -> RunningServer {
    let text = format!("{listeners}\n[metrics]\nenabled = false\n[storage]\npersistence = false\n");
    let config = Config::from_toml_str(&text, "listeners.toml").expect("config parses");
    common::start_with(config).await
}

#[tokio::test]
async fn two_listeners_serve_one_broker() {
    let server = start_from(
        "[[listener]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listener]]\nname = \"b\"\nbind = \"127.0.0.1:0\"\n",
    )
    .await;
    let names: Vec<&str> = server.listeners.iter().map(|l| &*l.name).collect();
    assert_eq!(names, ["a", "b"]);
    let a = server.listener_addr("a").expect("listener a");
    let b = server.listener_addr("b").expect("listener b");
    assert_ne!(a, b, "two sockets");
    assert_eq!(server.mqtt_addr, a, "mqtt_addr is the first listener");

    let mut sub = v5::connect_id(a, "sub-on-a").await;
    v5::subscribe(&mut sub, "across/#", QoS::AtLeastOnce).await;
    let mut publisher = v5::connect_id(b, "pub-on-b").await;
    assert_eq!(
        v5::publish_qos1(&mut publisher, "across/listeners", b"hello", 1).await,
        ReasonCode::SUCCESS
    );
    let got = v5::expect_publish(&mut sub).await;
    assert_eq!(&got.topic[..], "across/listeners");
    assert_eq!(&got.payload[..], b"hello");

    server.shutdown().await;
}

#[tokio::test]
async fn single_listener_table_still_works() {
    let server = start_from("[listener]\nbind = \"127.0.0.1:0\"\nmax_connections = 10\n").await;
    assert_eq!(server.listeners.len(), 1);
    assert_eq!(&*server.listeners[0].name, "tcp");
    assert_eq!(server.listeners[0].addr, server.mqtt_addr);
    let mut sub = v5::connect_id(server.mqtt_addr, "old-form").await;
    v5::subscribe(&mut sub, "t", QoS::AtMostOnce).await;
    let mut publisher = v5::connect_id(server.mqtt_addr, "old-form-pub").await;
    v5::publish(
        &mut publisher,
        v5::publish_packet("t", QoS::AtMostOnce, b"x", 0),
    )
    .await;
    assert_eq!(&v5::expect_publish(&mut sub).await.payload[..], b"x");
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_every_listener_and_tells_clients_on_each() {
    let server = start_from(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n[[listener]]\nname = \"second\"\nbind = \"127.0.0.1:0\"\n",
    )
    .await;
    let addrs: Vec<_> = server.listeners.iter().map(|l| l.addr).collect();
    let mut clients = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let mut c = RawClient::connect(*addr, ProtocolVersion::V5, &format!("c{i}"), true).await;
        c.connected().await; // the shutdown tells connected clients
        clients.push(c);
    }
    tokio::time::timeout(WAIT, server.shutdown())
        .await
        .expect("shutdown completes");
    for mut c in clients {
        match c.expect_close().await.as_slice() {
            [Packet::Disconnect(d)] => {
                assert_eq!(d.reason_code, ReasonCode::SERVER_SHUTTING_DOWN);
            }
            other => panic!("expected DISCONNECT 0x8B, got {other:?}"),
        }
    }
    for addr in addrs {
        let refused = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect attempt is answered");
        assert!(refused.is_err(), "{addr} still accepts after shutdown");
    }
}
