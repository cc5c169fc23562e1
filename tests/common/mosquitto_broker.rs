//! A real Mosquitto broker (`apt-get install mosquitto`) as a test peer: the remote of a
//! bridge, or a broker bridging into Postbox. Its own config file and persistence directory,
//! on a loopback port; stopped with SIGTERM (so it saves its persistence file) and started
//! again on the same port and directory.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::async_process::free_port;
use super::WAIT;

/// A running `mosquitto -c <dir>/mosquitto.conf`; killed on drop.
pub struct MosquittoBroker {
    child: Option<Child>,
    /// Its listener's port on 127.0.0.1.
    pub port: u16,
    /// Its directory: config, persistence, log.
    pub dir: tempfile::TempDir,
    /// While stopped, the port stays bound here (not listening: connects are refused), so a
    /// test running in parallel cannot take it and be taken for this broker.
    held: Option<tokio::net::TcpSocket>,
}

/// Binds `127.0.0.1:port` without listening: connections to it are refused, and no other
/// process can listen on it while the socket lives.
pub fn hold_port(port: u16) -> tokio::net::TcpSocket {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    // Accepted connections of the broker that listened there may linger in TIME_WAIT.
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .expect("hold the stopped broker's port");
    socket
}

/// A loopback port nothing listens on, held for as long as the socket lives.
pub fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let port = free_port();
    (hold_port(port), port)
}

impl MosquittoBroker {
    /// Starts Mosquitto on a free port with anonymous access, persistence in its own
    /// directory, and `extra` config lines (more listeners, `connection` stanzas, ...), and
    /// waits (bounded) until it accepts connections.
    pub async fn start(extra: &str) -> MosquittoBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        MosquittoBroker::start_at(free_port(), dir, extra).await
    }

    /// Like [`MosquittoBroker::start`], on a port chosen beforehand (a bridge's address).
    pub async fn start_on(port: u16, extra: &str) -> MosquittoBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        MosquittoBroker::start_at(port, dir, extra).await
    }

    async fn start_at(port: u16, dir: tempfile::TempDir, extra: &str) -> MosquittoBroker {
        let path = dir.path().join("mosquitto.conf");
        let persistence = dir.path().join("data");
        std::fs::create_dir_all(&persistence).expect("persistence dir");
        std::fs::write(
            &path,
            format!(
                // Run as root (CI containers), Mosquitto would switch to the `mosquitto` user,
                // which cannot write the test's directory; `user root` keeps it (ignored when
                // not started as root).
                "user root\n\
                 per_listener_settings false\n\
                 allow_anonymous true\n\
                 persistence true\n\
                 persistence_location {}/\n\
                 autosave_interval 0\n\
                 log_dest file {}\n\
                 log_type all\n\
                 listener {port} 127.0.0.1\n\
                 {extra}\n",
                persistence.display(),
                dir.path().join("mosquitto.log").display(),
            ),
        )
        .expect("write mosquitto.conf");
        let broker = MosquittoBroker {
            child: Some(spawn(&path)),
            held: None,
            port,
            dir,
        };
        broker.wait_accepting().await;
        broker
    }

    /// Waits until the listener accepts a TCP connection (bounded by `WAIT`).
    async fn wait_accepting(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "mosquitto did not listen on {} within {WAIT:?}; log:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Waits (bounded) until its log holds a line containing `needle`.
    pub async fn wait_log(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "mosquitto never logged {needle:?} within {WAIT:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops it with SIGTERM (it saves its persistence file) and waits for the exit.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                // SAFETY: kill(2) on our own child's pid, which is still running (not reaped).
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let _ = tokio::time::timeout(WAIT, child.wait()).await;
            self.held = Some(hold_port(self.port));
        }
    }

    /// Starts it again on the same port, directory and config (after [`MosquittoBroker::stop`]).
    pub async fn restart(&mut self) {
        self.stop().await;
        let path: PathBuf = self.dir.path().join("mosquitto.conf");
        self.held = None; // released just before Mosquitto binds it again
        self.child = Some(spawn(&path));
        self.wait_accepting().await;
    }
}

/// `mosquitto -c path`, killed on drop.
fn spawn(path: &std::path::Path) -> Child {
    Command::new("mosquitto")
        .args(["-c", path.to_str().expect("utf8 path")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto is installed (apt-get install mosquitto)")
}
