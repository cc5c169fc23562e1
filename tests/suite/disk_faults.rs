//! The store's disk misbehaving, with the real binary on real files (issue 11, items 1 and 4):
//! two brokers on one data directory, and a filesystem that fills up and frees space again.
//!
//! The full-disk tests mount a small tmpfs (root only) and fill it with a file; where mounting
//! is not permitted they skip, saying why. Checked against the README's durability promise:
//! "Once Postbox has acknowledged a QoS 1 or QoS 2 PUBLISH (PUBACK / PUBREC), the message is
//! stored for every persistent session that subscribed to it, and no crash loses it", and its
//! full-disk paragraph: refused while full (MQTT 5 0x97, MQTT 3 disconnected), QoS 0 and
//! deliveries carry on, recovered by itself once space is freed.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use common::disk::{dir_bytes, fill_disk, Tmpfs};
use common::http::sample as metric;
use common::process::{write_config, write_config_with, Broker, BrokerConfig};
use common::{v5, RawClient};
use postbox::codec::{Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode};

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const OUT_OF_SPACE: &str = "postbox_store_out_of_space";
const REJECTED_NO_SPACE: &str = "postbox_store_rejected_total{reason=\"no_space\"}";
const REJECTED_QUEUE_FULL: &str = "postbox_store_rejected_total{reason=\"queue_full\"}";
const DISK_BYTES: &str = "postbox_store_disk_bytes";
/// A tmpfs this small fills in a moment.
const TMPFS_BYTES: u64 = 16 << 20;

// The process helpers block (std threads and pipes); a worker of these multi-threaded
// runtimes may, while the clients' tasks run on the other.

fn start(config: &BrokerConfig) -> Broker {
    tokio::task::block_in_place(|| Broker::start(config))
}

fn scrape_metrics(config: &BrokerConfig) -> String {
    tokio::task::block_in_place(|| common::http::http_get(config.metrics, "/metrics"))
}

fn await_metric(config: &BrokerConfig, series: &str, want: f64) -> String {
    tokio::task::block_in_place(|| common::disk::await_metric(config.metrics, series, want))
}

/// A payload larger than two pages: after [`fill_disk`] no write of it can find room.
fn big_payload(tag: &str) -> Vec<u8> {
    format!("{tag}:{}", "x".repeat(9000)).into_bytes()
}

fn text(p: &Publish) -> String {
    String::from_utf8_lossy(&p.payload).into_owned()
}

/// The start of each payload, for failure messages (the big ones are 9 kB).
fn heads(texts: &[String]) -> Vec<&str> {
    texts.iter().map(|t| &t[..t.len().min(12)]).collect()
}

/// Mounts the test's tmpfs, or says why this machine cannot and returns `None` (skip).
fn tmpfs_or_skip(test: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(TMPFS_BYTES) {
        Ok(t) => Some(t),
        Err(why) => {
            eprintln!("SKIPPED {test}: needs a tmpfs of its own (run as root): {why}");
            None
        }
    }
}

/// The config of a broker whose data directory (`data`) is on the test's tmpfs
/// ([`tmpfs_or_skip`]), with the `storage` keys added: the tmpfs, the work directory that
/// holds the config file (to live as long as the test), the config; `None` (skip) where no
/// tmpfs can be mounted.
fn config_on_tmpfs(test: &str, storage: &str) -> Option<(Tmpfs, tempfile::TempDir, BrokerConfig)> {
    let tmpfs = tmpfs_or_skip(test)?;
    let work = tempfile::tempdir().expect("tempdir");
    let config = write_config_with(work.path(), &tmpfs.path().join("data"), storage);
    Some((tmpfs, work, config))
}

/// A 3.1.1 persistent subscriber to `filter` at QoS 1, left offline.
async fn offline_v3_subscriber(addr: SocketAddr, id: &str, filter: &str) {
    let c = RawClient::connect(addr, V3, id, false).await;
    common::subscribe_and_leave(c, filter, QoS::AtLeastOnce).await;
}

/// Sends a QoS 1 PUBLISH of `payload` on `topic` (packet id `id`) without waiting for its
/// answer: what follows (a PUBACK, or the close of a 3.1.1 connection) is the caller's check.
async fn send_qos1(c: &mut RawClient, topic: &str, payload: &[u8], id: u16) {
    let publish = v5::publish_packet(topic, QoS::AtLeastOnce, payload, id);
    c.send(&Packet::Publish(publish)).await;
}

/// Reconnects a 3.1.1 persistent QoS 1 subscriber and takes what is queued for it, acking
/// each, until every one of `expected` has arrived; returns everything received. Queues are
/// delivered in order, so anything stored between the expected ones shows up too.
async fn collect_v3(addr: SocketAddr, id: &str, expected: &[String]) -> Vec<String> {
    let mut c = RawClient::connect(addr, V3, id, false).await;
    let mut missing: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    let mut got = Vec::new();
    for _ in 0..10_000 {
        if missing.is_empty() {
            return got;
        }
        match c.recv().await {
            Some(Packet::Publish(p)) => {
                c.send(&Packet::PubAck(PubResponse::new(p.packet_id))).await;
                let t = text(&p);
                missing.remove(t.as_str());
                got.push(t);
            }
            other => panic!(
                "{id}: {} acknowledged messages missing, got {other:?} after {} messages",
                missing.len(),
                got.len()
            ),
        }
    }
    panic!("{id}: more than 10000 packets");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_the_same_data_dir_is_refused_and_the_first_keeps_its_messages() {
    let work = tempfile::tempdir().expect("tempdir");
    let data = work.path().join("data");
    let (dir_a, dir_b) = (work.path().join("a"), work.path().join("b"));
    std::fs::create_dir_all(&dir_a).expect("mkdir");
    std::fs::create_dir_all(&dir_b).expect("mkdir");
    let config_a = write_config(&dir_a, &data);
    let config_b = write_config(&dir_b, &data);
    let a = start(&config_a);
    let pid_a = a.pid();

    // Issue 11: B started on A's directory, acknowledged 30 retained QoS 1 messages, A
    // compacted, and after a restart all 30 were gone. B must not start at all.
    let Err(exited) = tokio::task::block_in_place(|| Broker::try_start(&config_b)) else {
        panic!("a second broker started on the same data directory");
    };
    let (status, output) = (exited.status, exited.output);
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("in use by another postbox") && output.contains(&format!("pid {pid_a}")),
        "the refusal names the holder's pid {pid_a}: {output}"
    );
    assert!(
        output.contains(&data.display().to_string()),
        "the refusal names the directory: {output}"
    );

    // A keeps working: the 30 retained QoS 1 messages are acknowledged by A...
    let mut p = v5::connect_id(config_a.mqtt, "pub").await;
    for i in 0..30u16 {
        let mut publish = v5::publish_packet(
            &format!("keep/{i}"),
            QoS::AtLeastOnce,
            format!("m{i}").as_bytes(),
            i + 1,
        );
        publish.retain = true;
        let code = v5::publish(&mut p, publish).await;
        assert!(!code.is_error(), "retained message {i}: {code:?}");
    }
    // ...and survive A's death: the lock goes with the process (kill -9 included), so the same
    // directory opens again, with a stale lock file naming a pid that is gone.
    a.kill();
    let _b = start(&config_b);
    let mut s = v5::connect_id(config_b.mqtt, "check").await;
    v5::subscribe(&mut s, "keep/#", QoS::AtLeastOnce).await;
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        let publish = v5::receive(&mut s).await;
        assert!(publish.retain, "MQTT-3.3.1-6: sent as retained");
        seen.insert(text(&publish));
    }
    assert_eq!(seen, (0..30).map(|i| format!("m{i}")).collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_what_needs_the_store_and_recovers_without_a_restart() {
    // The default config (storage.write_retry_ms = 1000) but for where things are.
    let Some((tmpfs, _work, config)) = config_on_tmpfs("full-disk recovery", "") else {
        return;
    };
    let store_dir = tmpfs.path().join("data").join("store");
    let broker = start(&config);
    let addr = config.mqtt;

    // Every QoS 1 message to t/# must be stored for this offline persistent subscriber...
    offline_v3_subscriber(addr, "sub", "t/#").await;
    // ...while this one (clean session, QoS 0) only sees what is routed.
    let mut live = v5::connect_id(addr, "live").await;
    v5::subscribe(&mut live, "t/#", QoS::AtMostOnce).await;
    let mut p5 = v5::connect_id(addr, "p5").await;
    let mut acked = Vec::new();
    for i in 0..5u16 {
        let payload = format!("before-{i}");
        let publish = v5::publish_packet("t/a", QoS::AtLeastOnce, payload.as_bytes(), i + 1);
        assert_eq!(v5::publish(&mut p5, publish).await, ReasonCode::SUCCESS);
        acked.push(payload);
    }

    let filler = tmpfs.path().join("filler");
    let filled = fill_disk(&filler);
    // Bigger than any room left: the writer's next commit finds no space and is kept.
    let mut trigger = v5::connect_id(addr, "trigger").await;
    let stalled = big_payload("stalled");
    trigger
        .send(&Packet::Publish(v5::publish_packet(
            "t/big",
            QoS::AtLeastOnce,
            &stalled,
            1,
        )))
        .await;
    await_metric(&config, OUT_OF_SPACE, 1.0);
    // Not acknowledged while it is not stored: PINGRESP is not queued behind acks, so a PUBACK
    // written already would arrive first.
    trigger.send(&Packet::PingReq).await;
    assert!(
        matches!(trigger.recv().await, Some(Packet::PingResp)),
        "PUBACK for a message the full disk did not take"
    );

    // MQTT 5: PUBACK / PUBREC 0x97 Quota exceeded (v5 §3.4.2.1, §3.5.2.1), at once.
    let refused_1 = v5::publish_packet("t/b", QoS::AtLeastOnce, b"refused-1", 10);
    assert_eq!(
        v5::publish(&mut p5, refused_1).await,
        ReasonCode::QUOTA_EXCEEDED
    );
    let refused_2 = v5::publish_packet("t/b", QoS::ExactlyOnce, b"refused-2", 11);
    assert_eq!(
        v5::publish(&mut p5, refused_2).await,
        ReasonCode::QUOTA_EXCEEDED
    );
    // MQTT 3.1.1 has no negative PUBACK: the publisher is disconnected without one.
    let mut p3 = RawClient::connect(addr, V3, "p3", true).await;
    send_qos1(&mut p3, "t/b", b"refused-3", 1).await;
    assert!(
        p3.expect_close().await.is_empty(),
        "3.1.1: closed without PUBACK"
    );
    // What needs no store still goes: QoS 1 nobody stores for (0x10, v5 §3.4.2.1), and QoS 0.
    let unstored = v5::publish_packet("nobody/x", QoS::AtLeastOnce, b"unstored", 12);
    assert_eq!(
        v5::publish(&mut p5, unstored).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    v5::publish(
        &mut p5,
        v5::publish_packet("t/zero", QoS::AtMostOnce, b"zero", 0),
    )
    .await;
    let mut routed = Vec::new();
    for _ in 0..20 {
        let publish = v5::expect_publish(&mut live).await;
        routed.push(text(&publish));
        if routed.last().is_some_and(|t| t == "zero") {
            break;
        }
    }
    assert_eq!(
        routed.last().map(String::as_str),
        Some("zero"),
        "QoS 0 flows"
    );
    assert!(
        !routed.iter().any(|t| t.starts_with("refused")),
        "a refused message reached a subscriber: {:?}",
        heads(&routed)
    );

    // The metrics at this very moment: the state, each refusal, the real size of the files.
    let scrape = scrape_metrics(&config);
    assert_eq!(metric(&scrape, OUT_OF_SPACE), Some(1.0), "{scrape}");
    assert_eq!(metric(&scrape, REJECTED_NO_SPACE), Some(3.0), "{scrape}");
    let on_disk = dir_bytes(&store_dir);
    assert_eq!(
        metric(&scrape, DISK_BYTES),
        Some(on_disk as f64),
        "{scrape}"
    );

    // Space returns: the kept commit is written on the next retry, its PUBACK follows by
    // itself, and the broker takes persistent messages again. No restart.
    std::fs::remove_file(&filler).expect("remove filler");
    let freed = std::time::Instant::now();
    match trigger.recv().await {
        Some(Packet::PubAck(a)) if a.packet_id == 1 => {
            assert_eq!(a.reason_code, ReasonCode::SUCCESS);
        }
        other => panic!("expected the held PUBACK, got {other:?}"),
    }
    let recovered_in = freed.elapsed();
    acked.push(String::from_utf8_lossy(&stalled).into_owned());
    let scrape = scrape_metrics(&config);
    assert_eq!(metric(&scrape, OUT_OF_SPACE), Some(0.0), "{scrape}");
    assert_eq!(metric(&scrape, REJECTED_NO_SPACE), Some(3.0), "{scrape}");
    assert_eq!(
        metric(&scrape, DISK_BYTES),
        Some(dir_bytes(&store_dir) as f64),
        "{scrape}"
    );
    let after = v5::publish_packet("t/c", QoS::AtLeastOnce, b"after-v5", 13);
    assert_eq!(v5::publish(&mut p5, after).await, ReasonCode::SUCCESS);
    acked.push("after-v5".to_owned());
    let mut p3 = RawClient::connect(addr, V3, "p3", true).await;
    send_qos1(&mut p3, "t/c", b"after-v3", 2).await;
    assert!(
        matches!(p3.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 2),
        "3.1.1 publisher acknowledged again"
    );
    acked.push("after-v3".to_owned());

    // Nothing acknowledged is lost, nothing refused was kept: kill -9, restart, count.
    broker.kill();
    let _broker = start(&config);
    // (collect_v3 panics, naming how many, if an acknowledged one never arrives.)
    let got = collect_v3(addr, "sub", &acked).await;
    assert!(
        !got.iter().any(|t| t.starts_with("refused")),
        "a refused message was stored: {:?}",
        heads(&got)
    );
    eprintln!(
        "filler {filled} B; store files while full {on_disk} B; held PUBACK {recovered_in:?} after the space was freed; {} acknowledged, {} delivered after restart",
        acked.len(),
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubrel_waits_for_its_stage_even_when_the_store_queue_is_full() {
    // A tiny writer queue, so that a short stall fills it (updates that add no data get four
    // times queue_capacity_ops: 16 here).
    let tiny_queue = "max_batch_ops = 4\nqueue_capacity_ops = 4\n";
    let Some((tmpfs, _work, config)) = config_on_tmpfs("PUBREL behind a full queue", tiny_queue)
    else {
        return;
    };
    let _broker = start(&config);
    let addr = config.mqtt;

    // A persistent QoS 2 subscriber gets a stored message and holds its PUBREC.
    let (mut s2, _) = v5::connect(addr, v5::persistent_connect("s2", 3600)).await;
    v5::subscribe(&mut s2, "q/#", QoS::ExactlyOnce).await;
    let mut p = v5::connect_id(addr, "p").await;
    let one = v5::publish_packet("q/1", QoS::ExactlyOnce, b"one", 1);
    assert_eq!(v5::publish(&mut p, one).await, ReasonCode::SUCCESS);
    let delivered = v5::expect_publish(&mut s2).await;
    assert_eq!(text(&delivered), "one");

    // Fill the disk; a retained message bigger than any room left stalls the writer.
    let filler = tmpfs.path().join("filler");
    fill_disk(&filler);
    let mut trigger = v5::connect_id(addr, "trigger").await;
    let mut big = v5::publish_packet("big", QoS::AtLeastOnce, &big_payload("retained"), 1);
    big.retain = true;
    trigger.send(&Packet::Publish(big)).await;
    await_metric(&config, OUT_OF_SPACE, 1.0);
    // Sessions coming and going fill the writer's queue with updates that wait for space.
    for _ in 0..12 {
        let (churn, _) = v5::connect(addr, v5::persistent_connect("churn", 3600)).await;
        v5::disconnect(churn).await;
    }
    let scrape = scrape_metrics(&config);
    assert!(
        metric(&scrape, REJECTED_QUEUE_FULL).is_some_and(|n| n > 0.0),
        "the queue is full (else this test proves nothing): {scrape}"
    );

    // durability.md, "When an ack may be sent": PUBREL waits for UpdateEntry{AwaitPubComp}, else
    // a crash re-sends the PUBLISH after the receiver released the id (MQTT-4.3.3-4/-9: the
    // receiver then takes it as new). A full queue must delay the PUBREL, never let it out
    // unstored. PINGRESP is not queued behind gated writes: it comes first.
    s2.send(&Packet::PubRec(PubResponse::new(delivered.packet_id)))
        .await;
    s2.send(&Packet::PingReq).await;
    match s2.recv().await {
        Some(Packet::PingResp) => {}
        other => panic!("PUBREL before its stage was stored: {other:?}"),
    }
    std::fs::remove_file(&filler).expect("remove filler");
    match s2.recv().await {
        Some(Packet::PubRel(r)) if r.packet_id == delivered.packet_id => {}
        other => panic!("expected PUBREL once the stage is stored, got {other:?}"),
    }
    s2.send(&Packet::PubComp(PubResponse::new(delivered.packet_id)))
        .await;
    assert!(
        // 0x10: retained, but nobody subscribes to it (v5 §3.4.2.1), a success code.
        matches!(trigger.recv().await, Some(Packet::PubAck(a)) if !a.reason_code.is_error()),
        "the held retained message is acknowledged once written"
    );
    await_metric(&config, OUT_OF_SPACE, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_stopped_while_the_disk_is_full_exits_and_keeps_what_it_acknowledged() {
    let Some((tmpfs, _work, config)) = config_on_tmpfs("stop while the disk is full", "") else {
        return;
    };
    let broker = start(&config);
    let addr = config.mqtt;
    offline_v3_subscriber(addr, "sub", "t/#").await;
    let mut p = v5::connect_id(addr, "p").await;
    let kept = v5::publish_packet("t/a", QoS::AtLeastOnce, b"kept", 1);
    assert_eq!(v5::publish(&mut p, kept).await, ReasonCode::SUCCESS);

    let filler = tmpfs.path().join("filler");
    fill_disk(&filler);
    p.send(&Packet::Publish(v5::publish_packet(
        "t/big",
        QoS::AtLeastOnce,
        &big_payload("never-acked"),
        2,
    )))
    .await;
    await_metric(&config, OUT_OF_SPACE, 1.0);

    // SIGTERM (systemd, containers) with the commit still held: the broker must not wait for
    // space that may never come. It tells the client it is going away (v5 0x8B) without the
    // PUBACK, gives the held commit up and exits.
    // (`terminate` panics if the process is still there after WAIT.)
    let exited = tokio::task::block_in_place(|| broker.terminate());
    assert!(exited.success(), "{exited}");
    let seen = p.expect_close().await;
    assert!(
        !seen
            .iter()
            .any(|packet| matches!(packet, Packet::PubAck(_))),
        "PUBACK for a commit that was never written: {seen:?}"
    );

    // Space freed, started again: what was acknowledged is there.
    std::fs::remove_file(&filler).expect("remove filler");
    let _broker = start(&config);
    let got = collect_v3(addr, "sub", &["kept".to_owned()]).await;
    assert_eq!(heads(&got), ["kept"]);
}
