//! Sessions belong to their identity across cluster nodes (issue 35, finding 2): the owner is
//! carried in the session's record in `pb_sessions`, so another identity naming the client id
//! on any node is refused (CONNACK 0x87) before its claim can close the owner's connection on
//! another node or move the owner's queue to itself. Real `nats-server -js`, real nodes, the
//! shipped example password file (`sensor1`, `sensor2`, `dashboard`, passwords
//! `<user>-secret`).

use crate::common;

use common::{v5, WAIT};
use postbox::codec::{Connect, Packet, QoS, ReasonCode};

fn auth() -> String {
    let passwd = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example");
    format!("[auth]\nallow_anonymous = true\npassword_file = {passwd:?}\n")
}

fn persistent(client: &str, user: Option<&str>) -> Connect {
    let mut c = v5::persistent_connect(client, 3600);
    c.username = user.map(Into::into);
    c.password = user.map(|u| bytes::Bytes::from(format!("{u}-secret")));
    c
}

async fn code_of(addr: std::net::SocketAddr, connect: Connect) -> ReasonCode {
    match v5::open(addr, connect).await {
        (_, Some(Packet::ConnAck(ack))) => ack.reason_code,
        (_, other) => panic!("expected CONNACK, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_is_refused_on_every_node() {
    let (_nats, nodes) = common::cluster::start_cluster(2, &auth()).await;
    let (a, b) = (nodes[0].mqtt(), nodes[1].mqtt());
    let (mut sensor1, _) = v5::connect(a, persistent("sensor1", Some("sensor1"))).await;
    v5::subscribe(&mut sensor1, "commands/sensor1/#", QoS::AtLeastOnce).await;
    // Connected on a: another user, or an anonymous client, on b is refused and does not
    // take the connection over (MQTT-3.1.4-2 is for the owner).
    for user in [Some("sensor2"), None] {
        assert_eq!(
            code_of(b, persistent("sensor1", user)).await,
            ReasonCode::NOT_AUTHORIZED,
            "{user:?}"
        );
    }
    let (mut dashboard, _) = v5::connect(b, persistent("dash", Some("dashboard"))).await;
    let ping = v5::publish_packet("commands/sensor1/ping", QoS::AtLeastOnce, b"1", 1);
    assert!(!v5::publish(&mut dashboard, ping).await.is_error());
    let p = tokio::time::timeout(WAIT, v5::receive(&mut sensor1))
        .await
        .expect("still connected on a");
    assert_eq!(&*p.topic, "commands/sensor1/ping");
    // Offline with a command queued: still refused on b, and the owner resumes it there.
    v5::disconnect(sensor1).await;
    let reboot = v5::publish_packet("commands/sensor1/reboot", QoS::AtLeastOnce, b"now", 2);
    assert!(!v5::publish(&mut dashboard, reboot).await.is_error());
    assert_eq!(
        code_of(b, persistent("sensor1", Some("sensor2"))).await,
        ReasonCode::NOT_AUTHORIZED
    );
    let (mut sensor1, ack) = v5::connect(b, persistent("sensor1", Some("sensor1"))).await;
    assert!(
        ack.session_present,
        "MQTT-3.2.2-3: moved to b with its queue"
    );
    let p = tokio::time::timeout(WAIT, v5::receive(&mut sensor1))
        .await
        .expect("the queued command");
    assert_eq!(&*p.topic, "commands/sensor1/reboot");
}
