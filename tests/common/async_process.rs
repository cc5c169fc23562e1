//! The `postbox` binary as a real process in a config of its own (a temporary directory),
//! for `async` tests that need what only a whole process shows (its metrics endpoint, its
//! log, signals, its exit), plus raw sockets from chosen loopback source addresses. A thin
//! layer on `process::Broker`, the one way the tests start the binary.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

pub use super::process::free_port;
use super::process::Broker;
use super::WAIT;

/// A running broker binary: MQTT on `addr`, metrics on `metrics_port`, in memory. Killed on
/// drop.
pub struct BrokerProcess {
    broker: Broker,
    /// Where its (first) MQTT listener listens.
    pub addr: SocketAddr,
    /// Where each of its listeners listens, in file order.
    pub addrs: Vec<SocketAddr>,
    /// Its metrics endpoint's port.
    pub metrics_port: u16,
    /// The config file it was started with (`-c`): rewrite it, then [`BrokerProcess::signal`]
    /// `SIGHUP`, to test a reload.
    pub config_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl BrokerProcess {
    /// Starts the binary with one listener on loopback (plus the `listener` keys given, TOML
    /// lines) and the `mqtt` keys given, and waits (bounded) until it logs that it runs.
    pub async fn spawn(listener: &str, mqtt: &str) -> BrokerProcess {
        let port = free_port();
        let listeners = format!("[listener]\nbind = \"127.0.0.1:{port}\"\n{listener}\n");
        BrokerProcess::start(&listeners, vec![port], &in_memory(mqtt)).await
    }

    /// Like [`BrokerProcess::spawn`], with one `[[listener]]` entry (on a port of its own) per
    /// element of `listeners`, each with those keys; `addr` is the first one's, `addrs` all.
    pub async fn spawn_listeners(listeners: &[&str], mqtt: &str) -> BrokerProcess {
        BrokerProcess::spawn_sections(listeners, &in_memory(mqtt)).await
    }

    /// Like [`BrokerProcess::spawn_listeners`], with `sections` (TOML tables after the
    /// listeners and `[metrics]`: `[storage]`, `[mqtt]`, `[auth]`, …) instead of an in-memory
    /// store and `mqtt` keys: for tests that need the durable store or other sections.
    pub async fn spawn_sections(listeners: &[&str], sections: &str) -> BrokerProcess {
        let ports: Vec<u16> = listeners.iter().map(|_| free_port()).collect();
        BrokerProcess::spawn_sections_on(ports, listeners, sections).await
    }

    /// Like [`BrokerProcess::spawn_sections`], on the given `ports` (one per listener): to
    /// start a broker again on the addresses its clients know (a restart on the same data
    /// directory).
    pub async fn spawn_sections_on(
        ports: Vec<u16>,
        listeners: &[&str],
        sections: &str,
    ) -> BrokerProcess {
        let text: String = listeners
            .iter()
            .zip(&ports)
            .map(|(keys, port)| format!("[[listener]]\nbind = \"127.0.0.1:{port}\"\n{keys}\n"))
            .collect();
        BrokerProcess::start(&text, ports, sections).await
    }

    async fn start(listeners: &str, ports: Vec<u16>, sections: &str) -> BrokerProcess {
        BrokerProcess::start_file(listeners, ports, sections, &[]).await
    }

    /// Starts the binary with one listener on loopback and `rest` as the remainder of its
    /// config file (any sections but `[listener]` and `[metrics]`: `[storage]`, `[mqtt]`,
    /// `[log]`, `[auth]`, ...), with the environment variables `env` set; the output is
    /// kept ([`BrokerProcess::logs`]).
    pub async fn spawn_file(rest: &str, env: &[(&str, &str)]) -> BrokerProcess {
        let port = free_port();
        let listeners = format!("[listener]\nbind = \"127.0.0.1:{port}\"\n");
        BrokerProcess::start_file(&listeners, vec![port], rest, env).await
    }

    async fn start_file(
        listeners: &str,
        ports: Vec<u16>,
        rest: &str,
        env: &[(&str, &str)],
    ) -> BrokerProcess {
        let metrics_port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("postbox.toml");
        std::fs::write(
            &path,
            format!(
                "{listeners}\
                 [metrics]\nbind = \"127.0.0.1:{metrics_port}\"\n\
                 {rest}\n"
            ),
        )
        .expect("write config");
        let broker =
            Broker::start_args_async(&["-c", path.to_str().expect("utf8 path")], env).await;
        let addrs: Vec<SocketAddr> = ports
            .into_iter()
            .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .collect();
        BrokerProcess {
            broker,
            addr: addrs[0],
            addrs,
            metrics_port,
            config_path: path,
            _dir: dir,
        }
    }

    /// Every line the broker has written so far (stdout and stderr).
    pub fn logs(&self) -> Vec<String> {
        self.broker.log()
    }

    /// Waits (bounded by `WAIT`) for a line of its output that satisfies `ok`, already
    /// written or still to come, and returns it. Panics with the output when none comes.
    pub async fn wait_log(&self, ok: impl Fn(&str) -> bool) -> String {
        self.broker.wait_log_async(ok).await
    }

    /// Sends the process `signal` (`libc::SIGTERM`, `libc::SIGHUP`, ...).
    pub fn signal(&self, signal: i32) {
        self.broker.signal(signal);
    }

    /// A graceful stop: SIGTERM, then waits (bounded by `WAIT`) for the process to exit
    /// successfully (what it stores at shutdown, e.g. delayed wills, is on disk then).
    pub async fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let (status, _) = self.wait_exit(WAIT).await;
        assert!(status.success(), "{status}");
    }

    /// Connects each of `connects` (each must be accepted), stops the broker gracefully while
    /// they are connected, so that their delayed wills are stored at shutdown, and starts it
    /// again on one listener with `sections` (the same data directory): how the will-delay
    /// tests get a restarted broker that owes wills.
    pub async fn restart_while_connected(
        mut self,
        connects: Vec<postbox::codec::Connect>,
        sections: &str,
    ) -> BrokerProcess {
        let mut armed = Vec::new();
        for connect in connects {
            let id = connect.client_id.clone();
            let (c, ack) = super::v5::connect(self.addr, connect).await;
            assert_eq!(ack.reason_code, postbox::codec::ReasonCode::SUCCESS, "{id}");
            armed.push(c);
        }
        // Stopped while they are connected: their delayed wills are stored for after it.
        self.stop().await;
        drop(armed);
        BrokerProcess::spawn_sections(&[""], sections).await
    }

    /// Waits (bounded by `limit`) for the process to exit and returns its status and how long
    /// it took from the call.
    pub async fn wait_exit(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let started = tokio::time::Instant::now();
        let status = self
            .broker
            .wait_exit_async(limit)
            .await
            .unwrap_or_else(|| panic!("postbox still running after {limit:?}"));
        (status, started.elapsed())
    }

    /// The value of the sample `series` (a metric name, with its labels as exported, e.g.
    /// `postbox_connections_refused_total{reason="pending_limit"}`) in one scrape; `None`
    /// when the broker does not export it (yet).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        super::http::sample(&self.scrape().await, series)
    }

    /// One scrape of `/metrics`: the HTTP response, headers included (a sample line never
    /// looks like a header).
    pub async fn scrape(&self) -> String {
        let port = self.metrics_port;
        tokio::task::spawn_blocking(move || super::http::http_get(port, "/metrics"))
            .await
            .expect("scrape")
    }

    /// Scrapes until `series` satisfies `ok` (absent counts as 0), for at most `WAIT`; returns
    /// the last value. A poll, not an event: the test is another process, and a scrape is all
    /// it can see of the broker's state. 20 ms apart, bounded.
    pub async fn wait_metric(&self, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let value = self.metric(series).await.unwrap_or(0.0);
            if ok(value) {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{series} stayed at {value}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Scrapes until `series` reads exactly `want` (absent is no reading), for at most `WAIT`;
    /// returns the last reading (`None`: absent), for the caller to compare with `want`, so
    /// that a failure shows what was read. 20 ms apart, bounded, as [`Self::wait_metric`].
    pub async fn metric_settles_at(&self, series: &str, want: f64) -> Option<f64> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let now = self.metric(series).await;
            if now == Some(want) || tokio::time::Instant::now() >= deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id (for `/proc/<pid>`).
    pub fn pid(&self) -> u32 {
        self.broker.pid()
    }

    /// Kills the process now (also done on drop).
    pub async fn kill(self) {
        self.broker.kill();
    }
}

/// The sections of a broker without a durable store, with `mqtt` keys.
fn in_memory(mqtt: &str) -> String {
    format!("[storage]\npersistence = false\n[mqtt]\n{mqtt}\n")
}

/// A TCP connection to `addr` from the loopback source address `source` (any of 127.0.0.0/8
/// is local on Linux), so tests can play several hosts.
pub async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind source address");
    let stream = tokio::time::timeout(WAIT, socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// Spawns a task that reads `stream` until the broker closes it (end of stream or a reset),
/// however long that takes, then sends `i` on `closed`: for tests that watch many connections
/// to see which ones the broker closes. Abort the task to stop watching.
pub fn report_close(
    mut stream: TcpStream,
    i: usize,
    closed: tokio::sync::mpsc::UnboundedSender<usize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        let _ = closed.send(i);
    })
}

/// How long until the broker closes `stream` (end of stream or a reset), at most `limit`:
/// `None` when it is still open then. What it sends first is read and dropped.
pub async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| started.elapsed())
}

/// Waits (bounded by `WAIT`) until the broker closes `stream`: end of stream or a reset,
/// discarding anything it sends first. Panics if it stays open.
pub async fn closed(stream: &mut TcpStream) {
    closed_within(stream, WAIT)
        .await
        .expect("the broker closes the connection");
}
