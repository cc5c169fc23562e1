//! Disks that misbehave on purpose: a small tmpfs of its own (root only) to fill up with a
//! file and free again, and what the store's files take on it. Blocking, like `process`.

use std::path::Path;
use std::time::{Duration, Instant};

use super::http::{http_get, sample};
use super::WAIT;

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
        // Lazy: a broker still holding files open must not keep the mount (and the test) busy.
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

/// Scrapes `/metrics` until `series` reads `want` (bounded by `WAIT`): for a state the broker
/// reaches on its own (a write failing), which no client packet announces. Returns the scrape.
pub fn await_metric(port: u16, series: &str, want: f64) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let scrape = http_get(port, "/metrics");
        if sample(&scrape, series) == Some(want) {
            return scrape;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never read {want}; last scrape:\n{scrape}"
        );
        std::thread::sleep(Duration::from_millis(20)); // polling a gauge, bounded
    }
}
