//! The real `postbox` binary as a child process: the one place the tests start it. A config
//! file, the start (waiting until it says it is running, or until it exits), its log lines,
//! signals and a bounded wait for its exit. [`Broker`] is the core, blocking or `async` as
//! the test is; `async_process::BrokerProcess` (a config of its own in a temporary
//! directory) and `cluster::Node` (a cluster node kept across restarts) are built on it.
//! Every wait is on an event (a log line, the exit), bounded by `WAIT`; nothing sleeps to
//! synchronise.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::WAIT;

/// The broker binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_postbox");

/// A free port (bound, then released: another process may take it in between, which the
/// broker's start then reports), never one handed out before in this process: the kernel
/// gives a released port out again, and two parallel tests got the same metrics port. Bound
/// on every address, not only loopback: a test whose broker listens on `0.0.0.0` failed with
/// "Address already in use" on a port another process held on 127.0.0.1. The one copy every
/// harness and test uses.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..256 {
        let port = TcpListener::bind("0.0.0.0:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        if GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port)
        {
            return port;
        }
    }
    panic!("no port not handed out before in 256 tries");
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

/// The line the broker logs once it serves (its store restored).
fn running(line: &str) -> bool {
    line.contains("postbox running")
}

/// The lines a child process writes (stdout and stderr, in arrival order), kept by the
/// threads that read its pipes, so that it never blocks on a full pipe and a test can wait
/// for a line: blocking tests on a condition variable, `async` ones on a watch channel.
#[derive(Clone)]
pub struct Output(Arc<Shared>);

struct Shared {
    state: Mutex<Lines>,
    changed: Condvar,
    /// Moves with every line and with each pipe's close, for `async` waiters.
    count: tokio::sync::watch::Sender<usize>,
}

struct Lines {
    lines: Vec<String>,
    /// Pipes still open: none once the process has exited (or closed both).
    open: usize,
}

impl Output {
    /// Takes `child`'s stdout and stderr (both piped) and reads them into the lines.
    pub fn read(child: &mut Child) -> Output {
        let output = Output(Arc::new(Shared {
            state: Mutex::new(Lines {
                lines: Vec::new(),
                open: 2,
            }),
            changed: Condvar::new(),
            count: tokio::sync::watch::channel(0).0,
        }));
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout piped")),
            Box::new(child.stderr.take().expect("stderr piped")),
        ];
        for stream in streams {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    output.update(|state| state.lines.push(line));
                }
                output.update(|state| state.open -= 1);
            });
        }
        output
    }

    fn update(&self, change: impl FnOnce(&mut Lines)) {
        let mut state = self.0.state.lock().expect("output lock");
        change(&mut state);
        self.0.changed.notify_all();
        self.0.count.send_modify(|n| *n += 1);
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.state.lock().expect("output lock").lines.clone()
    }

    /// The first line from the `skip`th on that satisfies `ok`, or where it is not, whether
    /// more can come (some pipe is still open).
    fn find(&self, skip: usize, ok: &impl Fn(&str) -> bool) -> Result<String, bool> {
        let state = self.0.state.lock().expect("output lock");
        match state.lines.iter().skip(skip).find(|l| ok(l)) {
            Some(line) => Ok(line.clone()),
            None => Err(state.open > 0),
        }
    }

    /// Waits (blocking, at most `limit`) for a line from the `skip`th on that satisfies `ok`,
    /// already written or still to come; `None` when the pipes closed or the time ran out
    /// without one.
    pub fn wait(&self, skip: usize, limit: Duration, ok: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + limit;
        let mut state = self.0.state.lock().expect("output lock");
        loop {
            if let Some(line) = state.lines.iter().skip(skip).find(|l| ok(l)) {
                return Some(line.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if state.open == 0 || left.is_zero() {
                return None;
            }
            state = self
                .0
                .changed
                .wait_timeout(state, left)
                .expect("output lock")
                .0;
        }
    }

    /// Waits (blocking, at most `limit`) until both pipes are closed: every line is read.
    pub fn wait_closed(&self, limit: Duration) {
        let state = self.0.state.lock().expect("output lock");
        let (state, _) = self
            .0
            .changed
            .wait_timeout_while(state, limit, |state| state.open > 0)
            .expect("output lock");
        assert_eq!(state.open, 0, "output still open {limit:?} after the exit");
    }

    /// [`Output::wait`] from an async test.
    pub async fn wait_async(
        &self,
        skip: usize,
        limit: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let mut changed = self.0.count.subscribe();
        let found = tokio::time::timeout(limit, async {
            loop {
                changed.borrow_and_update();
                match self.find(skip, &ok) {
                    Ok(line) => return Some(line),
                    Err(false) => return None,
                    Err(true) => {}
                }
                // The sender lives in `self`: `changed` fails only if it is dropped.
                let _ = changed.changed().await;
            }
        })
        .await;
        found.ok().flatten()
    }
}

/// A running broker binary and every line it wrote (stdout and stderr, in arrival order).
/// Killed (and reaped) when dropped while still running (a failed test).
pub struct Broker {
    /// `None` once it has been killed, terminated or has exited and been reaped.
    child: Option<Child>,
    output: Output,
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
    /// Spawns the binary with `args`, `NO_COLOR=1`, `RUST_LOG` unset and then the `env`
    /// variables (an empty value removes one), its output read into [`Broker::log`]; does
    /// not wait for anything.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::spawn_from(None, args, env)
    }

    /// [`Broker::spawn`] with `cwd` as the working directory, for what depends on it.
    pub fn spawn_in(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::spawn_from(Some(cwd), args, env)
    }

    fn spawn_from(cwd: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Broker {
        let mut command = Command::new(BIN);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        command
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG");
        for (key, value) in env {
            if value.is_empty() {
                command.env_remove(key);
            } else {
                command.env(key, value);
            }
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn postbox");
        let output = Output::read(&mut child);
        Broker {
            child: Some(child),
            output,
        }
    }

    /// Starts the binary with `config` and waits (bounded) until it logs that it is running.
    pub fn start(config: &BrokerConfig) -> Broker {
        Broker::try_start(config).unwrap_or_else(|e| panic!("postbox did not start: {e:?}"))
    }

    /// Starts the binary with `config`; `Err` with its exit status and output if it exits
    /// before running.
    pub fn try_start(config: &BrokerConfig) -> Result<Broker, Exited> {
        Broker::try_start_args(&["-c", config.path.to_str().expect("utf8 path")], &[])
    }

    /// [`Broker::spawn`], then waits (bounded by `WAIT`) until it logs "postbox running";
    /// `Err` with its exit status and output if it exits first. Panics (killing it) if it
    /// does neither in time.
    pub fn try_start_args(args: &[&str], env: &[(&str, &str)]) -> Result<Broker, Exited> {
        let mut broker = Broker::spawn(args, env);
        if broker.output.wait(0, WAIT, running).is_some() {
            return Ok(broker);
        }
        let exit = broker.wait_exit(WAIT);
        broker.not_running(exit)
    }

    /// [`Broker::try_start_args`] from an async test.
    pub async fn try_start_args_async(
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Broker, Exited> {
        let mut broker = Broker::spawn(args, env);
        if broker.output.wait_async(0, WAIT, running).await.is_some() {
            return Ok(broker);
        }
        let exit = broker.wait_exit_async(WAIT).await;
        broker.not_running(exit)
    }

    /// The end of a start that saw no "postbox running": how it exited, or a panic if it
    /// is still running.
    fn not_running(self, exit: Option<ExitStatus>) -> Result<Broker, Exited> {
        match exit {
            Some(status) => Err(Exited {
                status,
                output: self.log().join("\n"),
            }),
            None => panic!(
                "postbox neither ran nor exited within {WAIT:?}:\n{}",
                self.log().join("\n")
            ),
        }
    }

    /// [`Broker::try_start_args`], which must start.
    pub fn start_args(args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::try_start_args(args, env).unwrap_or_else(|e| panic!("postbox did not start: {e:?}"))
    }

    /// [`Broker::start_args`] from an async test.
    pub async fn start_args_async(args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::try_start_args_async(args, env)
            .await
            .unwrap_or_else(|e| panic!("postbox did not start: {e:?}"))
    }

    /// Every line written so far.
    pub fn log(&self) -> Vec<String> {
        self.output.lines()
    }

    /// Its output, for waits of other bounds than `WAIT`.
    pub fn output(&self) -> &Output {
        &self.output
    }

    /// Waits (bounded by `WAIT`) for a line from the `skip`th on that satisfies `ok`,
    /// already written or still to come, and returns it. Panics with the log when none comes.
    pub fn wait_log_after(&self, skip: usize, ok: impl Fn(&str) -> bool) -> String {
        self.output
            .wait(skip, WAIT, ok)
            .unwrap_or_else(|| self.no_such_line())
    }

    /// [`Broker::wait_log_after`] over the whole log.
    pub fn wait_log(&self, ok: impl Fn(&str) -> bool) -> String {
        self.wait_log_after(0, ok)
    }

    /// [`Broker::wait_log`] from an async test.
    pub async fn wait_log_async(&self, ok: impl Fn(&str) -> bool) -> String {
        match self.output.wait_async(0, WAIT, ok).await {
            Some(line) => line,
            None => self.no_such_line(),
        }
    }

    fn no_such_line(&self) -> ! {
        panic!(
            "no such line in the broker's output within {WAIT:?}:\n{}",
            self.log().join("\n")
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends the process `signal` (`libc::SIGTERM`, `libc::SIGHUP`, `libc::SIGSTOP`, ...).
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.pid()).expect("pid");
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet (`child` is `Some`
        // until `Child::wait` has reaped it), so the pid is still ours.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// SIGKILL (a crash), and waits for the process to be gone.
    pub fn kill(mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }

    /// SIGTERM, as systemd and container runtimes send it; waits (bounded by `WAIT`) for the
    /// exit and returns its status.
    pub fn terminate(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit(WAIT)
            .unwrap_or_else(|| panic!("postbox did not stop on SIGTERM"))
    }

    /// Waits (blocking, at most `limit`) for the process to exit and reaps it; `None` if it
    /// is still running then.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let (tx, rx) = mpsc::channel();
        self.on_exit(move || {
            let _ = tx.send(());
        });
        rx.recv_timeout(limit).ok().map(|()| self.reap())
    }

    /// [`Broker::wait_exit`] from an async test.
    pub async fn wait_exit_async(&mut self, limit: Duration) -> Option<ExitStatus> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.on_exit(move || {
            let _ = tx.send(());
        });
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(())) => Some(self.reap()),
            _ => None,
        }
    }

    /// Calls `exited` on a thread of its own once the process has exited. It waits with
    /// `waitid(WNOWAIT)`, which leaves the process unreaped (its pid stays ours for a
    /// `kill` meanwhile) until [`Broker::reap`]; a process still running when the test gives
    /// up is killed on drop, which ends the thread.
    fn on_exit(&self, exited: impl FnOnce() + Send + 'static) {
        let pid = libc::id_t::from(self.pid());
        std::thread::spawn(move || {
            loop {
                // SAFETY: waitid(2) on our own child with a zeroed siginfo_t it fills in.
                let rc = unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    libc::waitid(
                        libc::P_PID,
                        pid,
                        &raw mut info,
                        libc::WEXITED | libc::WNOWAIT,
                    )
                };
                if rc == 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    break;
                }
            }
            exited();
        });
    }

    /// Reaps the process, which has exited, and waits (bounded) until its output is read to
    /// the end, so that [`Broker::log`] has every line it wrote.
    fn reap(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = child.wait().expect("wait");
        self.output.wait_closed(WAIT);
        status
    }
}

/// The resident set of process `pid` in bytes (Linux `/proc`).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}
