//! Store recovery on the real binary, real files and real clients (issue 11, items 2 and 3).
//!
//! README, durability promise: "A damaged store never stops the broker: every frame that
//! passes its checksums is kept, what was lost is logged and counted"; an I/O error is not
//! damage: "the broker refuses to start, naming the path and the fix, and leaves the store as
//! it was". docs/durability.md, "Recovery" and "Damage".

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::http::{http_get, sample};
use common::process::{write_config, Broker, BrokerConfig};
use common::rumq::V4;
use rumqttc::QoS;

const RETAINED: usize = 50;
const QUEUED: usize = 200;

fn retained_payload(i: usize) -> String {
    format!("retained-{i:04}-{}", "r".repeat(40))
}

fn queued_payload(i: usize) -> String {
    format!("queued-{i:04}-{}", "q".repeat(40))
}

/// Starts the broker on `config`, leaves `RETAINED` retained messages and `QUEUED` messages
/// queued for the offline persistent subscriber `sub` (one QoS 1 publish, so one commit, at
/// a time), and stops it.
async fn populate(config: &BrokerConfig) {
    let broker = Broker::start(config);
    let mut sub = V4::connect(config.mqtt, "sub", false).await;
    sub.subscribe("q/#", QoS::AtLeastOnce).await;
    sub.disconnect().await;
    let mut publisher = V4::connect(config.mqtt, "pub", true).await;
    // The retained ones first, then the queued ones.
    let retained = (0..RETAINED).map(|i| (format!("r/{i}"), retained_payload(i), true));
    let queued = (0..QUEUED).map(|i| (format!("q/{i}"), queued_payload(i), false));
    for (topic, payload, retain) in retained.chain(queued) {
        publisher
            .publish(&topic, QoS::AtLeastOnce, retain, payload.as_bytes())
            .await;
    }
    publisher.disconnect().await;
    assert!(broker.terminate().success(), "clean exit on SIGTERM");
}

/// A store [`populate`]d in a fresh work directory: the directory (to live as long as the
/// test), the data directory, the config.
async fn populated() -> (tempfile::TempDir, PathBuf, BrokerConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &data);
    populate(&config).await;
    (dir, data, config)
}

/// The one log file of a store that was never compacted.
fn only_log(data: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(data.join("store"))
        .expect("store dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pbl"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs.into_iter().next().expect("one log")
}

fn copies(data: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data)
        .expect("data dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("store.corrupt-"))
        .collect()
}

/// Every file and directory under `dir`, with the bytes of each file.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.insert(path.clone(), None);
                todo.push(path);
            } else {
                out.insert(path.clone(), Some(std::fs::read(&path).expect("read")));
            }
        }
    }
    out
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_flipped_byte_loses_only_the_records_of_its_frame() {
    let (_dir, data, config) = populated().await;

    // One byte flipped inside the payload of queued message 100, in the middle of the log.
    const DAMAGED: usize = 100;
    let log = only_log(&data);
    let mut bytes = std::fs::read(&log).expect("read log");
    let needle = queued_payload(DAMAGED);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("payload in the log")
        + 20;
    bytes[at] ^= 0x01;
    std::fs::write(&log, &bytes).expect("write log");

    let broker = Broker::start(&config);
    // Every retained message is back ...
    let mut reader = V4::connect(config.mqtt, "reader", true).await;
    reader.subscribe("r/#", QoS::AtLeastOnce).await;
    let mut retained = BTreeSet::new();
    while retained.len() < RETAINED {
        let p = reader.next_publish().await;
        assert!(p.retain, "{p:?}");
        assert_eq!(
            p.payload,
            retained_payload(p.topic[2..].parse().expect("n"))
        );
        retained.insert(p.topic);
    }
    // ... and every queued one but the one in the damaged frame, in order.
    let mut sub = V4::connect(config.mqtt, "sub", false).await;
    assert!(sub.session_present, "the session survived (MQTT-3.2.2-2)");
    let mut got = Vec::new();
    while got.len() < QUEUED - 1 {
        let p = sub.next_publish().await;
        let n: usize = p.topic[2..].parse().expect("n");
        assert_eq!(p.payload, queued_payload(n));
        got.push(n);
    }
    let want: Vec<usize> = (0..QUEUED).filter(|n| *n != DAMAGED).collect();
    assert_eq!(got, want);

    // What was lost is counted and logged.
    let scrape = http_get(config.metrics, "/metrics");
    let lost = |kind: &str| {
        sample(
            &scrape,
            &format!("postbox_store_recovery_lost_records_total{{kind=\"{kind}\"}}"),
        )
    };
    assert_eq!(
        sample(&scrape, "postbox_store_recovery_lost_frames_total"),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(lost("put_message"), Some(1.0));
    assert_eq!(lost("enqueue"), Some(1.0));
    assert_eq!(lost("put_retained"), Some(0.0));
    assert_eq!(lost("unknown"), Some(0.0));
    let log_lines = broker.log();
    assert!(
        log_lines.iter().any(|l| l.contains("STORE DAMAGED")
            && l.contains("lost_records=put_message=1 enqueue=1 (exact)")),
        "{log_lines:#?}"
    );
    // A copy of the damaged file is kept as it was.
    let kept = copies(&data);
    assert_eq!(kept.len(), 1);
    let name = log.file_name().expect("name");
    assert_eq!(std::fs::read(kept[0].join(name)).expect("copy"), bytes);
    drop(reader);
    sub.disconnect().await;
    assert!(broker.terminate().success());

    // The store was rewritten: the next start finds nothing damaged.
    let broker = Broker::start(&config);
    let scrape = http_get(config.metrics, "/metrics");
    assert_eq!(
        sample(&scrape, "postbox_store_recovery_lost_frames_total"),
        Some(0.0)
    );
    assert_eq!(copies(&data).len(), 1);
    let mut reader = V4::connect(config.mqtt, "reader2", true).await;
    reader.subscribe("r/#", QoS::AtLeastOnce).await;
    let mut retained = BTreeSet::new();
    while retained.len() < RETAINED {
        retained.insert(reader.next_publish().await.topic);
    }
    assert!(broker.terminate().success());
}

/// A read-only bind mount of `path` onto itself, undone on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(path: &Path) -> Result<ReadOnly, String> {
        let p = path.to_str().expect("utf8");
        run("mount", &["--bind", p, p])?;
        let guard = ReadOnly(path.to_path_buf());
        run("mount", &["-o", "remount,ro,bind", p])?;
        Ok(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if let Err(e) = run("umount", &[self.0.to_str().expect("utf8")]) {
            eprintln!("cannot unmount {}: {e}", self.0.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_stops_the_broker_and_is_left_untouched() {
    let (_dir, data, config) = populated().await;
    let before = tree(&data);
    // chmod does not stop root; a read-only mount stops everyone.
    let guard = match ReadOnly::mount(&data) {
        Ok(guard) => guard,
        Err(why) => {
            eprintln!("SKIPPED a_read_only_store_stops_the_broker: cannot mount read-only ({why})");
            return;
        }
    };
    let out = &refused_start(&config, guard, "the broker started on a read-only store");
    assert!(
        out.contains(&data.join("store").display().to_string()),
        "{out}"
    );
    assert!(
        out.contains("mounted read-only: remount it read-write"),
        "{out}"
    );
    assert_eq!(tree(&data), before, "the store is byte-for-byte as it was");
}

/// Starts the broker on `config`, whose store `guard` made unusable: it must exit with a
/// failure (`started`: the message if it ran instead), and must not call the I/O error
/// corruption. The guard is dropped (the store restored) once it has exited; what it printed.
fn refused_start(config: &BrokerConfig, guard: impl Sized, started: &str) -> String {
    let Err(exited) = Broker::try_start(config) else {
        panic!("{started}");
    };
    drop(guard);
    assert!(!exited.status.success(), "{exited:?}");
    let out = exited.output;
    assert!(
        !out.contains("corrupt"),
        "an I/O error is not corruption: {out}"
    );
    out
}

/// The store's files made unwritable for whoever runs the test (`chattr +i`, which also stops
/// root; else `chmod a-w`), restored on drop.
struct Unwritable(Vec<PathBuf>, bool);

impl Unwritable {
    fn make(files: Vec<PathBuf>) -> Result<Unwritable, String> {
        let names: Vec<&str> = files.iter().map(|f| f.to_str().expect("utf8")).collect();
        let mut args = vec!["+i"];
        args.extend(&names);
        if run("chattr", &args).is_ok() {
            return Ok(Unwritable(files, true));
        }
        let mut args = vec!["a-w"];
        args.extend(&names);
        run("chmod", &args)?;
        let guard = Unwritable(files, false);
        if std::fs::OpenOptions::new()
            .append(true)
            .open(&guard.0[0])
            .is_ok()
        {
            return Err("chattr failed and chmod does not stop this user (root)".to_owned());
        }
        Ok(guard)
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        let names: Vec<&str> = self.0.iter().map(|f| f.to_str().expect("utf8")).collect();
        let mut args = vec![if self.1 { "-i" } else { "u+w" }];
        args.extend(&names);
        let _ = run(if self.1 { "chattr" } else { "chmod" }, &args);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_store_files_stop_the_broker_instead_of_an_empty_start() {
    let (_dir, data, config) = populated().await;
    let before = tree(&data);
    let files: Vec<PathBuf> = before
        .iter()
        .filter(|(_, bytes)| bytes.is_some())
        .map(|(p, _)| p.clone())
        .collect();
    let guard = match Unwritable::make(files) {
        Ok(guard) => guard,
        Err(why) => {
            eprintln!("SKIPPED unwritable_store_files_stop_the_broker: {why}");
            return;
        }
    };
    let out = &refused_start(
        &config,
        guard,
        "the broker started (empty?) on a store it cannot write",
    );
    assert!(
        out.contains(&only_log(&data).display().to_string()),
        "{out}"
    );
    assert!(out.contains("read and write access"), "{out}");
    assert_eq!(tree(&data), before, "the store is byte-for-byte as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_truncated_to_five_bytes_is_warned_about() {
    let (_dir, data, config) = populated().await;
    let log = only_log(&data);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(5))
        .expect("truncate");
    let broker = Broker::start(&config);
    let lines = broker.log();
    assert!(
        lines.iter().any(|l| l.contains("WARN")
            && l.contains("shorter than its header")
            && l.contains(&log.display().to_string())),
        "{lines:#?}"
    );
    assert!(broker.terminate().success());
}

/// The mode bits of `path`.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

/// Every regular file under `dir` (recursively) with its mode.
fn file_modes(dir: &Path) -> BTreeMap<PathBuf, u32> {
    tree(dir)
        .into_iter()
        .filter(|(_, bytes)| bytes.is_some())
        .map(|(path, _)| {
            let m = mode(&path);
            (path, m)
        })
        .collect()
}

/// The store holds every client's queued messages, retained messages and wills: other local
/// accounts must not read it, whatever the umask the broker was started with (issue 35, sixth
/// adversarial pass, finding 9: under umask 0022 the data directory was 0755 and every file
/// 0644). A directory the operator made keeps its mode (one WARN names it); the store's own
/// files written by an older version lose their group and other access.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_private_whatever_the_umask() {
    // The usual umask, which lets others read what is created: the broker inherits it. (The
    // test process's own, set to the value it has on most systems anyway.)
    // SAFETY: umask only swaps the process's file mode mask.
    unsafe { libc::umask(0o022) };
    let (_dir, data, config) = populated().await;
    assert_eq!(mode(&data), 0o700, "the data directory");
    assert_eq!(mode(&data.join("store")), 0o700, "store/");
    let files = file_modes(&data);
    assert!(
        files.keys().any(|p| p.ends_with("postbox.lock"))
            && files
                .keys()
                .any(|p| p.extension().is_some_and(|e| e == "pbl")),
        "{files:?}"
    );
    for (path, m) in &files {
        assert_eq!(*m, 0o600, "{}", path.display());
    }

    // As an older version left it: everything readable by everyone.
    let chmod = |m: u32, path: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).expect("chmod");
    };
    chmod(0o755, &data);
    for path in files.keys() {
        chmod(0o644, path);
    }
    let broker = Broker::start(&config);
    let warned = broker.log().join("\n");
    assert_eq!(
        mode(&data),
        0o755,
        "the operator's directory is left as it is"
    );
    let data_name = data.display().to_string();
    let warnings = broker
        .log()
        .iter()
        .filter(|l| l.contains("WARN") && l.contains(&data_name) && l.contains("other local users"))
        .count();
    assert_eq!(warnings, 1, "one WARN naming the directory: {warned}");
    for (path, m) in file_modes(&data) {
        assert_eq!(m, 0o600, "{}", path.display());
    }
    assert!(broker.terminate().success(), "clean exit on SIGTERM");
}
