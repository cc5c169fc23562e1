//! The real `postbox` binary as a child process: a config file, start (waiting until it says
//! it is running, or until it exits), its log lines, SIGTERM, and a metrics scrape.
//! Everything blocks (std threads and pipes), bounded by `WAIT`; nothing sleeps to
//! synchronise.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};

use super::WAIT;

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Ports and a config file for one broker whose durable state is in `data`.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    pub path: PathBuf,
    pub mqtt: SocketAddr,
    pub metrics: u16,
}

/// Writes `<dir>/postbox.toml`: loopback listener and metrics on free ports, `storage.dir =
/// data`, everything else default.
pub fn write_config(dir: &Path, data: &Path) -> BrokerConfig {
    write_config_with(dir, data, "")
}

/// [`write_config`] plus `storage` keys (`key = value` lines, appended to `[storage]`).
pub fn write_config_with(dir: &Path, data: &Path, storage: &str) -> BrokerConfig {
    let (mqtt, metrics) = (free_port(), free_port());
    let path = dir.join("postbox.toml");
    std::fs::write(
        &path,
        format!(
            "[listener]\nbind = \"127.0.0.1:{mqtt}\"\n[metrics]\nbind = \"127.0.0.1:{metrics}\"\n[storage]\ndir = {data:?}\n{storage}"
        ),
    )
    .expect("write config");
    BrokerConfig {
        path,
        mqtt: SocketAddr::from(([127, 0, 0, 1], mqtt)),
        metrics,
    }
}

/// A running broker binary and every line it wrote (stdout and stderr, in arrival order).
pub struct Broker {
    /// `None` once terminated; a broker dropped while still running (a failed test) is killed.
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How a broker that never got to "postbox running" ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    /// Everything it wrote.
    pub output: String,
}

impl Broker {
    /// Starts the binary with `config` and waits (bounded) until it logs that it is running.
    pub fn start(config: &BrokerConfig) -> Broker {
        Broker::try_start(config).unwrap_or_else(|e| panic!("postbox did not start: {e:?}"))
    }

    /// Starts the binary; `Err` with its exit status and output if it exits before running.
    pub fn try_start(config: &BrokerConfig) -> Result<Broker, Exited> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_postbox"))
            .args(["-c", config.path.to_str().expect("utf8 path")])
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn postbox");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (running, started) = mpsc::channel();
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        let mut readers = Vec::new();
        for stream in streams {
            let (lines, running) = (Arc::clone(&lines), running.clone());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if line.contains("postbox running") {
                        let _ = running.send(());
                    }
                    lines.lock().expect("lines").push(line);
                }
            }));
        }
        drop(running);
        // Both pipes closing (the process exited) also ends the wait.
        match started.recv_timeout(WAIT) {
            Ok(()) => Ok(Broker {
                child: Some(child),
                lines,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().expect("wait");
                for reader in readers {
                    let _ = reader.join();
                }
                let output = lines.lock().expect("lines").join("\n");
                Err(Exited { status, output })
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("postbox neither ran nor exited within {WAIT:?}");
            }
        }
    }

    /// Every line written so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL (a crash), and waits for the process to be gone.
    pub fn kill(mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }

    /// SIGTERM, as systemd and container runtimes send it; waits (bounded) for the exit.
    pub fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(WAIT) {
            Ok(status) => status.expect("wait"),
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                panic!("postbox did not stop on SIGTERM");
            }
        }
    }
}

/// The body of `GET path` on the metrics endpoint.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body
}

/// A raw HTTP/1.1 response's status code and body (what `http_get` and the admin tests read).
pub fn status_and_body(raw: &str) -> (u16, String) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample `series` (name and labels, as exported) in a scrape, if present.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.trim().parse().ok()
    })
}
