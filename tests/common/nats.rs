//! A real `nats-server` with JetStream (`apt-get install nats-server`, 2.9) as the cluster's
//! engine in tests (issue 17): its own store and log directory, a loopback port; stopped
//! gracefully (SIGTERM) or killed (SIGKILL), and started again on the same port and store.
//! Blocking (std processes), bounded by `WAIT`; call it from `block_in_place` in async tests.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::mosquitto_broker::hold_port;
use super::process::free_port;
use super::WAIT;

/// A running `nats-server -js`; killed on drop.
pub struct NatsServer {
    child: Option<Child>,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its directory: JetStream store (`js/`) and one log file per start (`nats-<n>.log`).
    pub dir: tempfile::TempDir,
    /// Starts so far (names the log file).
    starts: u32,
    /// A config file (`-c`), for what has no command-line flag (users and permissions).
    config: Option<PathBuf>,
    /// The port, bound but not listening, from before each start until the server is ready
    /// and while it is stopped: a test running in parallel cannot take it (nats-server binds
    /// with `SO_REUSEADDR`, as the hold does, so it binds beside the hold).
    held: Option<tokio::net::TcpSocket>,
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl NatsServer {
    /// Starts `nats-server -js -sd <dir>/js -a 127.0.0.1 -p <free port>` and waits (bounded)
    /// until it logs "Server is ready".
    pub fn start() -> NatsServer {
        NatsServer::start_with_config(None)
    }

    /// [`NatsServer::start`] with `config` (nats-server's config syntax) as its config file
    /// too; the command-line flags (JetStream, store, address, port, log) still apply.
    pub fn start_with_config(config: Option<&str>) -> NatsServer {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config.map(|text| {
            let path = dir.path().join("nats.conf");
            std::fs::write(&path, text).expect("write nats.conf");
            path
        });
        let mut server = NatsServer {
            child: None,
            port,
            dir,
            starts: 0,
            config,
            held: Some(hold_port(port)),
        };
        server.spawn();
        server
    }

    /// The URL nodes connect to (`[cluster] servers`).
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The log of the current (or last) start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("nats-{}.log", self.starts))
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "nats-server is already running");
        self.starts += 1;
        let store = self.dir.path().join("js");
        let mut command = Command::new("nats-server");
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        let child = command
            .args(["-js", "-sd"])
            .arg(&store)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-l"])
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("nats-server is not installed: apt-get install nats-server")
            }
            Err(e) => panic!("cannot start nats-server: {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        loop {
            if self.log().contains("Server is ready") {
                break;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("nats-server exited ({status}); log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server not ready within {WAIT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.held = None;
    }

    /// Stops it with SIGTERM (graceful: JetStream flushes its store) and waits for the exit.
    pub fn stop(&mut self) {
        self.end(libc::SIGTERM);
    }

    /// Kills it with SIGKILL and waits for the exit.
    pub fn kill(&mut self) {
        self.end(libc::SIGKILL);
    }

    fn end(&mut self, signal: i32) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on our own child's pid, not reaped yet.
            unsafe {
                libc::kill(pid, signal);
            }
        }
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                // Its listener is closed now; keep the port from parallel tests.
                self.held = Some(hold_port(self.port));
                return;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("nats-server did not exit within {WAIT:?} of signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts it again (after [`NatsServer::stop`] or [`NatsServer::kill`]) on the same port
    /// and store, and waits until it is ready.
    pub fn start_again(&mut self) {
        self.spawn();
    }
}
