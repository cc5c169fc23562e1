//! The `postbox` binary as a real process: spawn it on a config file, wait until it runs,
//! kill it, scrape its metrics endpoint; and a small tmpfs to fill up (root only).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// A port free right now on loopback (for a config file that must name one).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn command(config: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_postbox"));
    command
        .args(["-c", config.to_str().expect("utf8 path")])
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    command
}

/// Starts the broker binary and waits until it logs that it is running (restore included).
pub async fn spawn_broker(config: &Path) -> Child {
    let mut child = command(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn postbox");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    tokio::time::timeout(super::WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("postbox running") {
                return;
            }
        }
        panic!("postbox exited before it was running");
    })
    .await
    .expect("postbox starts");
    // Keep draining its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// Runs the broker binary expecting it to stop by itself (a refused start): its exit status
/// and everything it wrote to stdout and stderr. Panics if it is still running after `WAIT`.
pub async fn run_until_exit(config: &Path) -> (ExitStatus, String) {
    let mut child = command(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn postbox");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (mut out, mut err) = (String::new(), String::new());
    let (status, _, _) = tokio::time::timeout(super::WAIT, async {
        tokio::join!(
            child.wait(),
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        )
    })
    .await
    .expect("postbox stops by itself");
    (status.expect("wait"), out + &err)
}

/// SIGKILL, then waits for the process to be gone.
pub async fn kill9(child: &mut Child) {
    child.start_kill().expect("SIGKILL"); // tokio's kill is SIGKILL on unix
    let _ = child.wait().await;
}

/// `GET path` on 127.0.0.1:`port`: the body of a 200 answer.
pub async fn http_get(port: u16, path: &str) -> String {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
        s.set_read_timeout(Some(super::WAIT)).expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .expect("write request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read response");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default()
    })
    .await
    .expect("join")
}

/// The value of the sample `series` (name and labels exactly as exported) in a scrape.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Scrapes `/metrics` until `series` reads `want` (bounded by `WAIT`): for a state the broker
/// reaches on its own (a write failing), which no client packet announces.
pub async fn await_metric(port: u16, series: &str, want: f64) -> String {
    let deadline = tokio::time::Instant::now() + super::WAIT;
    loop {
        let scrape = http_get(port, "/metrics").await;
        if metric(&scrape, series) == Some(want) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never read {want}; last scrape:\n{scrape}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling a gauge, bounded
    }
}

/// A tmpfs of a fixed size, mounted on a temporary directory for one test and unmounted when
/// dropped. Needs the right to mount (root): [`Tmpfs::mount`] says why when it cannot.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts `bytes` of tmpfs; `Err(why)` when this machine does not let the test mount.
    pub fn mount(bytes: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a broker still holding files open must not keep the mount (and the test) alive.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the filesystem holding `path` with the file `path`, in whole pages, until a write
/// fails for lack of space; returns the bytes written. Afterwards no write that needs a new
/// page succeeds (a file's last, partly used page may still take a few bytes).
pub fn fill_disk(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("create filler");
    let mut written = 0u64;
    for chunk in [1usize << 20, 64 << 10, 4 << 10] {
        let block = vec![0xA5u8; chunk];
        // Bounded: a tmpfs of at most 1 GiB fills long before this.
        for _ in 0..(1u64 << 30) / chunk as u64 {
            match file.write(&block) {
                Ok(n) if n == chunk => written += n as u64,
                Ok(n) => {
                    // A short write: the page it ended in is allocated; keep whole pages.
                    written += n as u64;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    file.sync_all().expect("sync filler");
    written
}

/// Sum of the sizes of the files in `dir` (not recursive).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
        .sum()
}

/// Writes a broker config file into `dir`: MQTT on `port`, metrics on `metrics_port` (0: off),
/// durable state in `data`, then `extra` as it is: bare keys there are `[storage]` keys, other
/// sections need their header.
pub fn write_config(dir: &Path, port: u16, metrics_port: u16, data: &Path, extra: &str) -> PathBuf {
    let metrics = if metrics_port == 0 {
        "enabled = false".to_owned()
    } else {
        format!("enabled = true\nbind = \"127.0.0.1:{metrics_port}\"")
    };
    let path = dir.join("postbox.toml");
    std::fs::write(
        &path,
        format!(
            "[listener]\nbind = \"127.0.0.1:{port}\"\n[metrics]\n{metrics}\n[storage]\ndir = {:?}\n{extra}",
            data
        ),
    )
    .expect("write config");
    path
}
