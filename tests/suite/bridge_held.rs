//! A bridge whose remote sends more than this broker has room for (issue 35): a real
//! Mosquitto as the remote, a stranger publishing there, verified clients here.
//!
//! The guarantees under test: what the remote sends past the room here is left with the
//! remote (never acknowledged, never lost) and fetched again once there is room, and while
//! it waits the bridge's `out` direction keeps flowing.

use std::net::SocketAddr;

use postbox::codec::{Packet, QoS, ReasonCode};

use crate::common::async_process::BrokerProcess;
use crate::common::mosquitto_broker::MosquittoBroker;
use crate::common::{v5, RawClient, WAIT};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// An 8 MiB budget (a 1 MiB anonymous share), the example password file (so identities are
/// told apart and the remote's publishers are strangers here), anonymous clients let in if
/// `strangers`, and a v5 bridge `cloud` to `remote`: `inbox/#` in, `sensors/#` out under
/// `site1/`, at QoS 1.
async fn bridged_broker(remote: u16, dir: &std::path::Path, strangers: bool) -> BrokerProcess {
    let broker = BrokerProcess::spawn_file(
        &format!(
            "[storage]\npersistence = false\n[mqtt]\nmax_memory = {}\n\
             [auth]\nallow_anonymous = {strangers}\npassword_file = {:?}\n\
             [[bridge]]\nname = \"cloud\"\naddresses = [\"127.0.0.1:{remote}\"]\n\
             protocol = \"5\"\nrestart_timeout = [1, 1]\n\
             [[bridge.topic]]\npattern = \"inbox/#\"\ndirection = \"in\"\nqos = 1\n\
             [[bridge.topic]]\npattern = \"sensors/#\"\ndirection = \"out\"\nqos = 1\n\
             remote_prefix = \"site1/\"\n",
            8 << 20,
            crate::common::fast_example_passwords(dir)
        ),
        &[],
    )
    .await;
    // Subscribed, not only connected: a stranger's message published on the remote before
    // the remote had the bridge's subscription was answered 0x10 No matching subscribers.
    broker
        .wait_log(|l| l.contains("bridge: subscribed on the remote"))
        .await;
    broker
}

/// sensor1 (a password user) connected to `broker` and subscribed to `filter` at QoS 1.
async fn sensor1_reading(broker: &BrokerProcess, filter: &str) -> RawClient {
    let (mut sensor1, _) = v5::connect(
        broker.addr,
        v5::as_user(v5::connect_packet("sensor1"), "sensor1"),
    )
    .await;
    v5::subscribe(&mut sensor1, filter, QoS::AtLeastOnce).await;
    sensor1
}

/// A client of `port` publishing `count` QoS 1 messages of `size` bytes to `topic(i)`,
/// retained when `retain`, each acknowledged as accepted.
async fn publish_many(
    port: u16,
    id: &str,
    count: usize,
    size: usize,
    retain: bool,
    topic: impl Fn(usize) -> String,
) {
    let mut c = v5::connect_id(addr(port), id).await;
    for i in 0..count {
        let mut payload = format!("{i:04}").into_bytes();
        payload.resize(size.max(4), b'.');
        let mut p = v5::publish_packet(&topic(i), QoS::AtLeastOnce, &payload, (i + 1) as u16);
        p.retain = retain;
        let code = v5::publish(&mut c, p).await;
        assert_eq!(code, ReasonCode::SUCCESS, "{id}: PUBACK for message {i}");
    }
    v5::disconnect(c).await;
}

/// A stranger on the remote (`port`) retains twelve messages of 100 KB on `inbox/r/<i>`:
/// more than the bridge's 1 MiB share, so the bridge holds the last ones and `broker`
/// counts it as a paused publisher.
async fn fill_the_share(port: u16, broker: &BrokerProcess) {
    publish_many(port, "stranger-r", 12, 100_000, true, |i| {
        format!("inbox/r/{i}")
    })
    .await;
    broker
        .wait_metric("postbox_publishers_paused", |n| n >= 1.0)
        .await;
}

/// The index each of the next `count` PUBLISHes on `c` starts with (each acknowledged).
async fn indices(c: &mut RawClient, count: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let p = v5::receive(c).await;
        let index = std::str::from_utf8(&p.payload[..4])
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("a numbered payload");
        out.push(index);
    }
    out
}

/// Issue 35, seventeenth adversarial pass, D7: a stranger on the remote fills this broker's
/// anonymous share with retained messages, then sends 25 more of 100 KB: the bridge holds a
/// MiB of them unacknowledged and leaves the rest with the remote. While they wait, the
/// bridge still reads the remote's acknowledgements, so all 40 messages a verified client
/// publishes `out` reach the remote (Mosquitto lets the bridge have 20 unacknowledged).
/// Once the retained messages are cleared, every one of the 25 arrives here, in order
/// (MQTT-4.6.0-2: the remote's order), the skipped ones sent again by the remote after the
/// bridge reconnects (MQTT-4.4.0-1), and a retained message cleared here is not fetched
/// again by those reconnects. Before, the bridge stopped reading past a held MiB:
/// 20 of 40 reached the remote and the rest waited for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_remote_sends_past_the_room_waits_there_and_out_keeps_flowing() {
    let remote = MosquittoBroker::start("").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = bridged_broker(remote.port, dir.path(), false).await;
    let mut sensor1 = sensor1_reading(&broker, "inbox/h/#").await;
    let mut remote_sub = v5::connect_id(addr(remote.port), "remote-sub").await;
    v5::subscribe(&mut remote_sub, "site1/#", QoS::AtLeastOnce).await;

    // The share full of retained messages, then more than a held MiB.
    fill_the_share(remote.port, &broker).await;
    // What the remote's retained messages hold here is the bridge's share, shown per bridge.
    let share = broker
        .metric("postbox_bridge_share_bytes{bridge=\"cloud\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        (900_000.0..=f64::from(1u32 << 20)).contains(&share),
        "postbox_bridge_share_bytes {share} with about ten of 100 KB kept in a 1 MiB share"
    );
    publish_many(remote.port, "stranger-h", 25, 100_000, false, |_| {
        "inbox/h/x".to_owned()
    })
    .await;
    broker
        .wait_metric("postbox_publishers_paused", |n| n >= 1.0)
        .await;

    // Out keeps flowing past Mosquitto's window of 20.
    let (mut sensor2, _) = v5::connect(
        broker.addr,
        v5::as_user(v5::connect_packet("sensor2"), "sensor2"),
    )
    .await;
    for i in 0..40u16 {
        let code = v5::publish_qos1(
            &mut sensor2,
            "sensors/a",
            format!("{i:04}").as_bytes(),
            i + 1,
        )
        .await;
        assert_eq!(code, ReasonCode::SUCCESS, "sensor2's PUBLISH {i}");
    }
    assert_eq!(
        indices(&mut remote_sub, 40).await,
        (0..40).collect::<Vec<_>>(),
        "what goes out while the remote's messages wait"
    );
    broker
        .wait_log(|l| l.contains("no room for more of the remote's messages"))
        .await;

    // Room again: every one of the 25 arrives, in order.
    for i in 0..12u16 {
        let mut clear = v5::publish_packet(&format!("inbox/r/{i}"), QoS::AtLeastOnce, b"", i + 100);
        clear.retain = true;
        let code = v5::publish(&mut sensor2, clear).await;
        assert!(!code.is_error(), "clearing inbox/r/{i}: {code:?}");
    }
    let got = tokio::time::timeout(WAIT * 2, indices(&mut sensor1, 25))
        .await
        .expect("the 25 within twice WAIT");
    assert_eq!(got, (0..25).collect::<Vec<_>>(), "the remote's messages");
    v5::expect_silence(&mut sensor1, std::time::Duration::from_millis(300)).await;

    // The reconnects fetched what was skipped, not the remote's retained messages again
    // (MQTT-3.3.1-9 sends them on every SUBSCRIBE): the remote's next message arrives, and
    // inbox/r/0, stored here before sensor2 cleared it, stays cleared. Before, each
    // reconnect subscribed again: the retained messages came back and filled the share
    // for good, and the next message was held behind them.
    the_remotes_next_arrives_and_nothing_is_retained(&remote, &broker, &mut sensor1, "inbox/r/0")
        .await;
}

/// The remote's next message on `inbox/h/x` reaches `sensor1` (everything the remote sent
/// before it was taken here), and a new subscriber of `retained` here gets no retained
/// message.
async fn the_remotes_next_arrives_and_nothing_is_retained(
    remote: &MosquittoBroker,
    broker: &BrokerProcess,
    sensor1: &mut RawClient,
    retained: &str,
) {
    publish_many(remote.port, "stranger-h", 1, 100, false, |_| {
        "inbox/h/x".to_owned()
    })
    .await;
    let next = tokio::time::timeout(WAIT, indices(sensor1, 1))
        .await
        .expect("the remote's next message within WAIT");
    assert_eq!(next, vec![0], "the remote's next message");
    let (mut late, _) = v5::connect(
        broker.addr,
        v5::as_user(v5::connect_packet("sensor1-late"), "sensor1"),
    )
    .await;
    v5::subscribe(&mut late, retained, QoS::AtLeastOnce).await;
    v5::expect_silence(&mut late, std::time::Duration::from_millis(300)).await;
}

/// Issue 35, eighteenth adversarial pass, E3: a stranger on the remote fills the bridge's
/// share with retained messages, so the remote's next 25 messages wait (held, or left with
/// the remote); then the stranger clears its retained messages the way users do
/// (`mosquitto_pub -r -n`, QoS 1 here). Each clear of a message the share holds passes what
/// waits on other topics (MQTT-4.6.0-6 keeps order per topic: the two clears whose topics
/// wait behind come after them), frees the share, and all 25 arrive in order; in the end
/// nothing of the stranger's is retained here and the share is empty. Before, the clears
/// queued behind what waited for the room they would make: nothing more came in from the
/// remote for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_strangers_clears_empty_the_share_its_retained_messages_filled() {
    let remote = MosquittoBroker::start("").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = bridged_broker(remote.port, dir.path(), false).await;
    let mut sensor1 = sensor1_reading(&broker, "inbox/h/#").await;

    fill_the_share(remote.port, &broker).await;
    publish_many(remote.port, "stranger-h", 25, 100_000, false, |_| {
        "inbox/h/x".to_owned()
    })
    .await;
    broker
        .wait_log(|l| l.contains("no room for more of the remote's messages"))
        .await;

    for i in 0..12 {
        let topic = format!("inbox/r/{i}");
        crate::common::mosquitto::mosquitto_pub(
            remote.port,
            &["-q", "1", "-r", "-n", "-t", &topic],
        )
        .await;
    }
    let got = tokio::time::timeout(WAIT * 2, indices(&mut sensor1, 25))
        .await
        .expect("the 25 within twice WAIT once the stranger cleared its retained messages");
    assert_eq!(got, (0..25).collect::<Vec<_>>(), "the remote's messages");

    // The remote's next message comes after every clear (the remote's order): once it is
    // here, nothing of the stranger's is retained and the share holds nothing.
    the_remotes_next_arrives_and_nothing_is_retained(&remote, &broker, &mut sensor1, "inbox/r/#")
        .await;
    broker
        .wait_metric("postbox_bridge_share_bytes{bridge=\"cloud\"}", |n| {
            n < 1000.0
        })
        .await;
}

/// Issue 35, seventeenth adversarial pass, D5: a bridge's remote has a share of its own,
/// apart from local strangers'. An anonymous client here fills the anonymous share with
/// retained messages (refused 0x97 at it); then an application on the remote sends five
/// QoS 1 commands for sensor1, who reads them at once: the remote's messages count in the
/// bridge's share, which the local stranger did not touch. Before, both shared one share:
/// the commands were held unacknowledged for as long as the stranger's retained messages
/// stayed, i.e. for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_stranger_does_not_spend_the_share_a_bridges_remote_needs() {
    let remote = MosquittoBroker::start("").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = bridged_broker(remote.port, dir.path(), true).await;
    let mut sensor1 = sensor1_reading(&broker, "inbox/#").await;

    let mut stranger = v5::connect_id(broker.addr, "local-stranger").await;
    let kept = crate::client_bounds::retain_until_refused(
        &mut stranger,
        "public/r",
        &vec![b'r'; 100_000],
        20,
    )
    .await;
    assert!(
        kept >= 8,
        "the local stranger kept {kept} of 100 KB in a 1 MiB share"
    );

    publish_many(remote.port, "remote-app", 5, 50_000, false, |_| {
        "inbox/sensor1/cmd".to_owned()
    })
    .await;
    assert_eq!(
        indices(&mut sensor1, 5).await,
        (0..5).collect::<Vec<_>>(),
        "the remote's commands while a local stranger holds the anonymous share"
    );
}

/// Issue 35, eighteenth adversarial pass, E4: a client on the remote takes the bridge's
/// client id with a fresh session that outlives it (Clean Start 1, Session Expiry Interval
/// an hour) and leaves; the bridge reconnects to that session (Session Present 1, no
/// subscriptions) and subscribes again (MQTT 5, Retain Handling 1: a subscription the
/// remote still held would bring no retained message again), so the remote's next command
/// reaches sensor1. Before, a bridge that had subscribed once in its run did not ask again
/// on a resumed session, and nothing more came in until Postbox restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_taken_at_the_remote_is_subscribed_again() {
    let remote = MosquittoBroker::start("").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = bridged_broker(remote.port, dir.path(), false).await;
    let mut sensor1 = sensor1_reading(&broker, "inbox/#").await;
    publish_until_received(remote.port, &mut sensor1).await;

    // The bridge's client id with a fresh session, kept after it leaves.
    let mut fresh = v5::persistent_connect("postbox-bridge-cloud", 3600);
    fresh.clean_start = true;
    let (imposter, _) = v5::connect(addr(remote.port), fresh).await;
    broker
        .wait_log(|l| l.contains("bridge: connection to the remote lost"))
        .await;
    v5::disconnect(imposter).await;
    broker
        .wait_metric("postbox_bridge_reconnects_total{bridge=\"cloud\"}", |n| {
            n >= 1.0
        })
        .await;
    publish_until_received(remote.port, &mut sensor1).await;
}

/// Publishes a numbered QoS 1 command on the remote every 200 ms (at most 50) until `c`
/// receives one: a SUBSCRIBE of the bridge still on its way when one was sent does not
/// make the wait fail, a bridge with no subscription on the remote does.
async fn publish_until_received(port: u16, c: &mut RawClient) {
    let mut app = v5::connect_id(addr(port), "remote-app").await;
    for i in 0..50u16 {
        let code =
            v5::publish_qos1(&mut app, "inbox/cmd", format!("{i:04}").as_bytes(), i + 1).await;
        // 0x10 No matching subscribers: the bridge holds no subscription there (yet).
        assert!(!code.is_error(), "Mosquitto took command {i}: {code:?}");
        if let Ok(Some(Packet::Publish(_))) =
            c.recv_within(std::time::Duration::from_millis(200)).await
        {
            v5::disconnect(app).await;
            return;
        }
    }
    panic!("none of 50 commands sent on the remote over 10 s came in through the bridge");
}
