//! The in-process link drives a session through the same session API as a socket client:
//! subscribe, receive QoS 1 and QoS 2 from a real MQTT client, acknowledge, and resume the
//! session after a broker restart on the same data directory with what was not acknowledged
//! (MQTT-4.4.0-1: unacknowledged PUBLISHes are sent again with DUP=1, MQTT-3.3.1-1).

use crate::common;

use std::path::Path;

use bytes::Bytes;
use common::rumq::V4;
use common::WAIT;
use postbox::codec::QoS;
use postbox::config::Config;
use postbox::test_support::broker::link::{Link, LinkDelivery, LinkError, LinkOptions};

fn durable_config(dir: &Path) -> Config {
    let mut config = common::test_config();
    config.storage.persistence = true;
    config.storage.dir = Some(dir.to_path_buf());
    config
}

async fn next(link: &mut Link) -> LinkDelivery {
    tokio::time::timeout(WAIT, link.recv())
        .await
        .expect("a delivery within the wait")
        .expect("store ok")
        .expect("link still attached")
}

/// Publishes the first `(topic, payload)` at QoS 1 and the second at QoS 2 (neither
/// retained), each once the broker has acknowledged it (PUBACK / PUBCOMP).
async fn publish_at_1_and_2(publisher: &mut V4, [(qos1, one), (qos2, two)]: [(&str, &str); 2]) {
    publisher
        .publish(qos1, rumqttc::QoS::AtLeastOnce, false, one.as_bytes())
        .await;
    publisher
        .publish(qos2, rumqttc::QoS::ExactlyOnce, false, two.as_bytes())
        .await;
}

#[tokio::test]
async fn a_link_receives_acks_and_resumes_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = common::start_with(durable_config(dir.path())).await;
    let mut link = Link::connect(&server.broker, LinkOptions::persistent("bridge-1"));
    assert!(!link.session_present());
    link.subscribe("plant/#", QoS::ExactlyOnce)
        .expect("valid filter");

    // A real client publishes at QoS 1 and 2; its PUBACK / PUBCOMP mean the link's session
    // holds the message durably.
    let mut publisher = V4::connect(server.mqtt_addr, "sensor", true).await;
    publish_at_1_and_2(&mut publisher, [("plant/a", "one"), ("plant/b", "two")]).await;

    let first = next(&mut link).await;
    assert_eq!(
        (&*first.message.topic, first.qos),
        ("plant/a", QoS::AtLeastOnce)
    );
    assert!(!first.dup);
    let second = next(&mut link).await;
    assert_eq!(
        (&*second.message.topic, second.qos),
        ("plant/b", QoS::ExactlyOnce)
    );
    assert_eq!(second.message.payload, Bytes::from_static(b"two"));
    link.ack(&first).await.expect("ack QoS 1");
    link.ack(&second)
        .await
        .expect("ack QoS 2 (PUBREC, then PUBCOMP)");

    // Two more: the link receives both but acknowledges neither; one more stays queued.
    publish_at_1_and_2(&mut publisher, [("plant/c", "three"), ("plant/d", "four")]).await;
    let third = next(&mut link).await;
    let fourth = next(&mut link).await;
    assert_eq!(&*third.message.topic, "plant/c");
    assert_eq!(&*fourth.message.topic, "plant/d");
    link.disconnect();
    publisher
        .publish("plant/e", rumqttc::QoS::AtLeastOnce, false, b"five")
        .await;
    publisher.disconnect().await;
    server.shutdown().await;

    // Restart on the same directory: the session, its inflight window and its queue are back.
    let server = common::start_with(durable_config(dir.path())).await;
    let mut link = Link::connect(&server.broker, LinkOptions::persistent("bridge-1"));
    assert!(link.session_present(), "session resumed (MQTT-3.2.2-2)");
    let again_c = next(&mut link).await;
    let again_d = next(&mut link).await;
    assert_eq!((&*again_c.message.topic, again_c.dup), ("plant/c", true));
    assert_eq!((&*again_d.message.topic, again_d.dup), ("plant/d", true));
    assert_eq!(again_d.qos, QoS::ExactlyOnce);
    let queued = next(&mut link).await;
    assert_eq!((&*queued.message.topic, queued.dup), ("plant/e", false));
    for d in [&again_c, &again_d, &queued] {
        link.ack(d).await.expect("ack");
    }
    // Nothing acknowledged comes back: plant/a and plant/b were done before the restart.
    assert!(link.try_recv().is_none());
    link.disconnect();
    server.shutdown().await;

    // And after one more restart the window is empty: every ack was stored.
    let server = common::start_with(durable_config(dir.path())).await;
    let mut link = Link::connect(&server.broker, LinkOptions::persistent("bridge-1"));
    assert!(link.session_present());
    assert!(
        link.try_recv().is_none(),
        "acknowledged messages stay acknowledged"
    );
    link.disconnect();
    server.shutdown().await;
}

#[tokio::test]
async fn a_link_publishes_to_socket_subscribers_and_other_links() {
    let server = common::start().await;
    let mut subscriber = V4::connect(server.mqtt_addr, "dash", true).await;
    subscriber
        .subscribe("cmd/+", rumqttc::QoS::AtLeastOnce)
        .await;
    let mut other = Link::connect(&server.broker, LinkOptions::persistent("sys"));
    other
        .subscribe("cmd/#", QoS::AtLeastOnce)
        .expect("valid filter");

    let mut link = Link::connect(&server.broker, LinkOptions::persistent("ops"));
    link.publish("cmd/reboot", &b"now"[..], QoS::ExactlyOnce, false)
        .await
        .expect("accepted");
    let got = subscriber.next_publish().await;
    assert_eq!(got.topic, "cmd/reboot");
    assert_eq!(&got.payload[..], b"now");
    let d = next(&mut other).await;
    assert_eq!(&*d.message.topic, "cmd/reboot");
    assert_eq!(d.qos, QoS::AtLeastOnce, "min(published, granted)");
    assert!(link.subscribe("bad/#/x", QoS::AtMostOnce).is_err());
    assert!(link
        .publish("bad/+", &b""[..], QoS::AtMostOnce, false)
        .await
        .is_err());
    server.shutdown().await;
}

/// `Link::ack` sends the ack the delivery's QoS calls for (MQTT-4.3.2-4, MQTT-4.3.3-8); a
/// delivery acknowledged as another QoS than the one in flight under its packet id (a stale
/// or altered `LinkDelivery`) is refused as a socket client's would be (a Protocol Error,
/// v5 §4.13.1) and changes nothing: the right ack still finishes it.
#[tokio::test]
async fn a_link_ack_of_the_wrong_kind_is_refused() {
    let server = common::start().await;
    let mut link = Link::connect(&server.broker, LinkOptions::persistent("acker"));
    link.subscribe("k/#", QoS::ExactlyOnce)
        .expect("valid filter");
    let mut publisher = Link::connect(&server.broker, LinkOptions::persistent("k-pub"));
    publisher
        .publish("k/1", &b"one"[..], QoS::AtLeastOnce, false)
        .await
        .expect("accepted");
    publisher
        .publish("k/2", &b"two"[..], QoS::ExactlyOnce, false)
        .await
        .expect("accepted");
    let qos1 = next(&mut link).await;
    let qos2 = next(&mut link).await;
    assert_eq!((qos1.qos, qos2.qos), (QoS::AtLeastOnce, QoS::ExactlyOnce));

    // The QoS 1 delivery acknowledged as a QoS 2 one, and the other way round.
    for (delivery, wrong_qos) in [(&qos1, QoS::ExactlyOnce), (&qos2, QoS::AtLeastOnce)] {
        let wrong_kind = LinkDelivery {
            qos: wrong_qos,
            ..delivery.clone()
        };
        assert!(matches!(
            link.ack(&wrong_kind).await,
            Err(LinkError::AckMismatch(_))
        ));
    }
    link.ack(&qos1).await.expect("PUBACK fits");
    link.ack(&qos2).await.expect("PUBREC, PUBCOMP fit");
    // Acknowledged twice: nothing in flight under those ids any more, ignored.
    link.ack(&qos1).await.expect("unknown id ignored");
    link.ack(&qos2).await.expect("unknown id ignored");
    assert!(link.try_recv().is_none());
    server.shutdown().await;
}
