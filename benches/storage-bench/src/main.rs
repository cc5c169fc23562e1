//! Group-commit throughput of QoS 1 persistence: each message is `PutMessage` (256-byte
//! payload) + `Enqueue` for one offline subscriber, fsynced every batch.
//!
//! * `fixed` mode: one thread commits batches of exactly B messages (engine cost per batch).
//! * `group` mode: P publisher threads each submit one message and wait for its durability
//!   (what a PUBACK waits for); one writer batches whatever is queued (real group commit).
//!
//! Engines: `log` = postbox's `LogStore` through the public `Store` API; `redb` = redb
//! 4.x, one write transaction with `Durability::Immediate` per batch, keys laid out as the
//! store would (message id -> body, client id + seq -> entry), behind an identical
//! group-commit writer thread.
//!
//! Usage: storage-bench [seconds-per-case] [all|fixed|group] [dir]   (dir: a temp dir by default)

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use bytestring::ByteString;
use postbox::codec::{PublishProperties, QoS};
use postbox::test_support::storage::{
    EntryStage, LogOptions, LogStore, Op, QueueEntry, SessionMeta, Store, StoredMessage,
};
use redb::{Database, Durability, TableDefinition};

const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
const QUEUE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("queue");
const PAYLOAD: usize = 256;

fn stored(n: u64) -> StoredMessage {
    let mut payload = vec![(n % 251) as u8; PAYLOAD];
    payload[..8].copy_from_slice(&n.to_le_bytes());
    StoredMessage {
        topic: ByteString::from_static("fleet/device-0042/telemetry"),
        payload: Bytes::from(payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: PublishProperties::default(),
        received_at_unix_ms: 1_700_000_000_000 + n,
        expires_at_unix_ms: None,
        // A verified publisher's message: not charged to the anonymous share.
        from_anonymous: false,
    }
}

fn ops_for(store: &dyn Store, n: u64) -> Vec<Op> {
    let id = store.next_message_id();
    vec![
        Op::PutMessage {
            id,
            message: stored(n),
        },
        Op::Enqueue {
            client_id: ByteString::from_static("subscriber-1"),
            seq: n,
            entry: QueueEntry::queued(id, QoS::AtLeastOnce),
        },
    ]
}

/// redb rows for message `n`: the same bytes the log would hold, in two tables.
fn redb_commit(db: &Database, batch: &[u64]) {
    let mut tx = db.begin_write().expect("begin");
    tx.set_durability(Durability::Immediate)
        .expect("durability");
    {
        let mut messages = tx.open_table(MESSAGES).expect("messages table");
        let mut queue = tx.open_table(QUEUE).expect("queue table");
        for &n in batch {
            let m = stored(n);
            let mut body = Vec::with_capacity(PAYLOAD + 64);
            body.extend_from_slice(m.topic.as_bytes());
            body.extend_from_slice(&m.payload);
            body.extend_from_slice(&m.received_at_unix_ms.to_le_bytes());
            messages.insert(n, body.as_slice()).expect("insert message");
            let mut key = b"subscriber-1".to_vec();
            key.extend_from_slice(&n.to_be_bytes());
            queue
                .insert(key.as_slice(), &[1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..])
                .expect("insert entry");
        }
    }
    tx.commit().expect("commit");
}

struct Result {
    msgs: u64,
    commits: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Result {
    fn print(&self, engine: &str, case: &str) {
        let secs = self.elapsed.as_secs_f64();
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        println!(
            "{engine:5} {case:14} {:>9.0} msg/s {:>7.0} commits/s {:>7.1} msg/commit  p50 {:>6.2} ms  p99 {:>6.2} ms",
            self.msgs as f64 / secs,
            self.commits as f64 / secs,
            self.msgs as f64 / self.commits.max(1) as f64,
            pct(0.50),
            pct(0.99),
        );
    }
}

fn open_log(dir: &Path) -> LogStore {
    let store = LogStore::open(dir, LogOptions::default()).expect("open store");
    let t = store
        .submit(vec![Op::PutSession(SessionMeta {
            client_id: ByteString::from_static("subscriber-1"),
            protocol: postbox::codec::ProtocolVersion::V5,
            expiry_interval: u32::MAX,
            disconnected_at_unix_ms: Some(0),
            owner: postbox::test_support::storage::SessionOwner::Unbound,
        })])
        .expect("session");
    block_on((&store as &dyn Store).wait_durable(t.ticket));
    store
}

fn block_on<
    F: std::future::Future<Output = std::result::Result<(), postbox::test_support::storage::StorageError>>,
>(
    f: F,
) {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
        .expect("durable");
}

fn log_fixed(dir: &Path, batch: usize, secs: f64) -> Result {
    let store = open_log(dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let mut n = 0u64;
    let mut latencies = Vec::new();
    let before = store.stats().commits;
    while start.elapsed().as_secs_f64() < secs {
        let mut ops = Vec::with_capacity(batch * 2);
        for _ in 0..batch {
            ops.extend(ops_for(&store, n));
            n += 1;
        }
        let t0 = Instant::now();
        let t = store.submit(ops).expect("submit").ticket;
        rt.block_on((&store as &dyn Store).wait_durable(t))
            .expect("durable");
        latencies.push(t0.elapsed());
    }
    let elapsed = start.elapsed();
    let commits = store.stats().commits - before;
    Result {
        msgs: n,
        commits,
        elapsed,
        latencies,
    }
}

fn redb_fixed(dir: &Path, batch: usize, secs: f64) -> Result {
    let db = Database::create(dir.join("bench.redb")).expect("create redb");
    let start = Instant::now();
    let mut n = 0u64;
    let mut commits = 0;
    let mut latencies = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let ids: Vec<u64> = (n..n + batch as u64).collect();
        n += batch as u64;
        let t0 = Instant::now();
        redb_commit(&db, &ids);
        latencies.push(t0.elapsed());
        commits += 1;
    }
    Result {
        msgs: n,
        commits,
        elapsed: start.elapsed(),
        latencies,
    }
}

/// P publisher threads, each: build message, hand it to the engine, wait until durable.
fn run_publishers(
    publishers: usize,
    secs: f64,
    publish: Arc<dyn Fn(u64) + Send + Sync>,
) -> (u64, Duration, Vec<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..publishers)
        .map(|_| {
            let stop = Arc::clone(&stop);
            let counter = Arc::clone(&counter);
            let publish = Arc::clone(&publish);
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let t0 = Instant::now();
                    publish(n);
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for t in threads {
        latencies.extend(t.join().expect("publisher"));
    }
    (latencies.len() as u64, start.elapsed(), latencies)
}

fn log_group(dir: &Path, publishers: usize, secs: f64) -> Result {
    let store: Arc<dyn Store> = Arc::new(open_log(dir));
    let before = store.stats().commits;
    let s = Arc::clone(&store);
    let publish = Arc::new(move |n: u64| {
        thread_local! {
            static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
        }
        let submitted = s.submit(ops_for(&*s, n)).expect("submit");
        RT.with(|rt| rt.block_on(submitted.durable).expect("durable"));
    });
    let (msgs, elapsed, latencies) = run_publishers(publishers, secs, publish);
    Result {
        msgs,
        commits: store.stats().commits - before,
        elapsed,
        latencies,
    }
}

fn redb_group(dir: &Path, publishers: usize, secs: f64) -> Result {
    let db = Database::create(dir.join("bench.redb")).expect("create redb");
    let (tx, rx) = mpsc::channel::<(u64, mpsc::SyncSender<()>)>();
    let commits = Arc::new(AtomicU64::new(0));
    let writer_commits = Arc::clone(&commits);
    let writer = std::thread::spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < 2048 {
                match rx.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
            let ids: Vec<u64> = batch.iter().map(|(n, _)| *n).collect();
            redb_commit(&db, &ids);
            writer_commits.fetch_add(1, Ordering::Relaxed);
            for (_, reply) in batch {
                let _ = reply.send(());
            }
        }
    });
    let tx = Arc::new(parking_lot_free_sender(tx));
    let publish = Arc::new(move |n: u64| {
        let (reply, done) = mpsc::sync_channel(1);
        tx.send(n, reply);
        let _ = done.recv();
    });
    let (msgs, elapsed, latencies) = run_publishers(publishers, secs, publish);
    let result = Result {
        msgs,
        commits: commits.load(Ordering::Relaxed),
        elapsed,
        latencies,
    };
    drop(writer); // detached: the channel closes when `publish` is dropped
    result
}

/// `mpsc::Sender` is `Send + Sync` since Rust 1.72; wrapped for a uniform `send`.
struct SharedSender(mpsc::Sender<(u64, mpsc::SyncSender<()>)>);
impl SharedSender {
    fn send(&self, n: u64, reply: mpsc::SyncSender<()>) {
        let _ = self.0.send((n, reply));
    }
}
fn parking_lot_free_sender(tx: mpsc::Sender<(u64, mpsc::SyncSender<()>)>) -> SharedSender {
    SharedSender(tx)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let only = args.next().unwrap_or_else(|| "all".to_owned());
    let base: Option<PathBuf> = args.next().map(PathBuf::from);
    let fresh = || match &base {
        Some(b) => tempfile::tempdir_in(b).expect("tempdir"),
        None => tempfile::tempdir().expect("tempdir"),
    };
    println!("# {PAYLOAD}-byte QoS 1 messages, PutMessage + Enqueue each, fdatasync/fsync every commit, {secs} s per case");
    if only != "group" {
        let sizes = [1, 16, 128, 1024];
        run_cases("fixed B", &sizes, &fresh, secs, (log_fixed, redb_fixed));
    }
    if only != "fixed" {
        run_cases(
            "group P",
            &[1, 16, 128],
            &fresh,
            secs,
            (log_group, redb_group),
        );
    }
}

/// One kind of case (fixed batches, group commit): for each size in `sizes` (batch size,
/// publishers), the log's and redb's runs, each in a fresh directory, printed as
/// `<label>=<size>`.
fn run_cases(
    label: &str,
    sizes: &[usize],
    fresh: &dyn Fn() -> tempfile::TempDir,
    secs: f64,
    (log, redb): (Engine, Engine),
) {
    for &size in sizes {
        let case = format!("{label}={size}");
        let d = fresh();
        log(d.path(), size, secs).print("log", &case);
        let d = fresh();
        redb(d.path(), size, secs).print("redb", &case);
    }
}

/// One engine's run of a case: its directory, the case's size, the seconds to run.
type Engine = fn(&Path, usize, f64) -> Result;
