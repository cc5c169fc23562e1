//! The `postbox` binary: command line in Mosquitto's habit, then the library does the work.

use std::path::PathBuf;

/// jemalloc instead of glibc's malloc, measured with `postbox-bench` on the same machine: RSS
/// per idle connection 1,885 -> 1,639 B (tokio's per-connection task and I/O blocks are
/// 128-byte aligned, which glibc pads), p2p QoS 1 +37% msg/s, fan-in QoS 1 +12-20%, fan-out
/// QoS 1 even, fan-in QoS 0 -4%. mimalloc was tried too: more memory per connection than glibc.
#[cfg(unix)]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use anyhow::Context;
use clap::Parser;
use postbox::config::{ClusterNode, Config, Overrides, CLUSTER_NODE_ENV};

/// Postbox: an MQTT 3.1 / 3.1.1 / 5.0 broker for IoT fleets.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// A tool instead of the broker (none: run the broker).
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML). Without it, the embedded default config is used.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Port of the first MQTT listener only (overrides its port in the config file; other
    /// listeners keep theirs).
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    port: Option<u16>,
    /// Port of the metrics endpoint (overrides `metrics.bind`'s port); 0 turns it off.
    #[arg(long = "metrics-port", value_name = "PORT")]
    metrics_port: Option<u16>,
    /// Directory for durable state (overrides `storage.dir` and turns persistence on).
    #[arg(long = "data-dir", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// This node's id in a cluster (overrides `cluster.node`; needs a `[cluster]` section), so
    /// one config file serves every node. Without the flag, `POSTBOX_CLUSTER_NODE` if set.
    #[arg(long = "cluster-node", value_name = "ID")]
    cluster_node: Option<String>,
    /// Log at debug level (overrides `log.level`).
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
}

/// Tools that share the binary.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Manage a password file (`auth.password_file`), like `mosquitto_passwd`.
    Passwd(PasswdArgs),
    /// Bridges to other brokers (`[[bridge]]`).
    #[command(subcommand)]
    Bridge(BridgeCommand),
}

/// `postbox bridge ...`.
#[derive(Debug, clap::Subcommand)]
enum BridgeCommand {
    /// Print `[[bridge]]` TOML for the `connection` stanzas of a mosquitto.conf on stdout;
    /// what does not map exactly is listed on stderr.
    Import {
        /// The Mosquitto configuration file.
        #[arg(value_name = "MOSQUITTO_CONF")]
        file: PathBuf,
    },
}

/// `postbox passwd`: the same flags as `mosquitto_passwd`.
///
/// Writes `$7$` (PBKDF2-HMAC-SHA512) by default because Mosquitto 2.0 (Debian, Ubuntu) reads
/// only `$6$` and `$7$`, so the file stays usable by both brokers; with 210,000 iterations
/// rather than Mosquitto 2.0's 101, which offer little against a stolen file. `--argon2id`
/// writes argon2id (Mosquitto 2.1 and Postbox read it).
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "postbox passwd [-c] FILE USER\n       postbox passwd [-c] -b FILE USER PASSWORD\n       postbox passwd -D FILE USER\n       postbox passwd -U FILE"
)]
struct PasswdArgs {
    /// Create a new file (overwrites an existing one).
    #[arg(short = 'c')]
    create: bool,
    /// Batch mode: the password is the third argument.
    #[arg(short = 'b', conflicts_with_all = ["delete", "update"])]
    batch: bool,
    /// Delete USER.
    #[arg(short = 'D', conflicts_with_all = ["create", "update"])]
    delete: bool,
    /// Hash a plaintext `user:password` file in place.
    #[arg(short = 'U', conflicts_with_all = ["create", "batch"])]
    update: bool,
    /// Write argon2id hashes instead of `$7$` (Mosquitto 2.0 cannot read them).
    #[arg(long = "argon2id")]
    argon2id: bool,
    /// PBKDF2 iterations of `$7$` hashes (and of SCRAM credentials with `--scram`).
    #[arg(long = "iterations", default_value_t = postbox::tools::password::DEFAULT_PBKDF2_ITERATIONS)]
    iterations: u32,
    /// Edit a SCRAM credentials file (`auth.scram_file`) instead: write (or with -D remove)
    /// the user's `sha-256` or `sha-512` line.
    #[arg(long = "scram", value_name = "sha-256|sha-512", conflicts_with_all = ["update", "argon2id"])]
    scram: Option<String>,
    /// The password file.
    file: PathBuf,
    /// The user name (not with -U).
    user: Option<String>,
    /// The password (with -b only).
    password: Option<String>,
}

/// Runs the command line; an error is printed for a person: one line with its causes
/// ([`describe`]), and the backtrace `RUST_BACKTRACE` asks for only with `-v` (issue 37: every
/// config error printed 30 frames of it where `RUST_BACKTRACE=1` was set).
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            if verbose {
                eprintln!("Error: {error:?}");
            } else {
                eprintln!("Error: {}", describe(&error));
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// `error` and its causes on one line, each cause once: most errors here already quote their
/// source in their own message, and printing the chain repeated it ("Caused by" with the same
/// words, issue 37).
fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Passwd(args)) => return passwd(&args),
        Some(Command::Bridge(BridgeCommand::Import { file })) => return bridge_import(&file),
        None => {}
    }
    // Overrides are applied before validation, so they are checked like the file is.
    let overrides = Overrides {
        port: cli.port,
        metrics_port: cli.metrics_port,
        data_dir: cli.data_dir.clone(),
        cluster_node: cluster_node(cli.cluster_node.clone())?,
    };
    let (config, notes) = Config::load_noting(cli.config.as_deref(), &overrides)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let log = postbox::logging::init(&config.log, cli.verbose)?;
    for note in &notes {
        tracing::warn!("{note}");
    }
    // `-p` moves the first listener only: say so where it could surprise (issue 37, item 3).
    if let (Some(port), [first, _, ..]) = (cli.port, config.listeners.as_slice()) {
        let listener = first.effective_name(0);
        tracing::info!(%port, %listener, "-p set the port of the first listener only; the others keep the ports the config file gives");
    }
    // Said once the broker runs: which file it read, and where its durable state lives.
    let config_source = cli.config.as_deref().map_or_else(
        || "embedded default (postbox -c FILE to use another)".to_owned(),
        |path| path.display().to_string(),
    );
    let data = match config.storage.persistence_dir() {
        Some(dir) => std::path::absolute(dir)
            .unwrap_or_else(|_| dir.to_path_buf())
            .display()
            .to_string(),
        None => "memory only (storage.persistence = false)".to_owned(),
    };

    // Before the runtime's threads exist: growing the descriptor table is free now and stalls
    // accepts later (see `transport::fd_table`).
    match postbox::fd_table::prepare() {
        Some(fds) => tracing::debug!(
            open_file_limit = fds.soft_limit,
            pregrown = fds.pregrown,
            "descriptor table ready"
        ),
        None => tracing::debug!("open-file limit left as it is"),
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // Before the broker starts and says it is running: a SIGTERM from then on (systemd,
        // a container runtime, a test) is a graceful shutdown, never the default action.
        let mut signals = Signals::install().context("cannot install the signal handlers")?;
        let server = postbox::server::start(config).await?;
        tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %config_source, data = %data, "postbox running");
        while signals.next().await == Signal::Reload {
            reload(&server, cli.config.as_deref(), &overrides, &log);
        }
        tracing::info!(
            grace_seconds = SHUTDOWN_BOUND.as_secs(),
            "shutting down (a second SIGTERM or Ctrl-C exits at once)"
        );
        let started = std::time::Instant::now();
        let stopped = tokio::select! {
            finished = tokio::time::timeout(SHUTDOWN_BOUND, server.shutdown()) => finished.is_ok(),
            () = signals.next_stop() => {
                tracing::error!("second stop signal during shutdown: exiting at once, without closing the store");
                std::process::exit(EXIT_INTERRUPTED_SHUTDOWN);
            }
        };
        if !stopped {
            tracing::error!(bound_seconds = SHUTDOWN_BOUND.as_secs(), "shutdown did not finish in time: exiting without closing the store");
            std::process::exit(EXIT_INTERRUPTED_SHUTDOWN);
        }
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "stopped");
        anyhow::Ok(())
    })
}

use postbox::server::SHUTDOWN_BOUND;

/// `--cluster-node`, else `POSTBOX_CLUSTER_NODE` (an empty variable counts as unset, as a pod
/// spec may leave it so); the id is validated with the file in `Config::load_with`.
fn cluster_node(flag: Option<String>) -> anyhow::Result<Option<ClusterNode>> {
    if let Some(id) = flag {
        return Ok(Some(ClusterNode::Flag(id)));
    }
    match std::env::var(CLUSTER_NODE_ENV) {
        Ok(id) if id.is_empty() => Ok(None),
        Ok(id) => Ok(Some(ClusterNode::Env(id))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("{CLUSTER_NODE_ENV} is not valid UTF-8 (a node id is A-Z a-z 0-9 _ -)")
        }
    }
}

/// Exit status when a shutdown did not finish (second signal, or [`SHUTDOWN_BOUND`] passed):
/// not 0, so a supervisor sees the store may not have been closed cleanly (recovery replays
/// the log at the next start; nothing acknowledged is lost with `fsync = "always"`).
const EXIT_INTERRUPTED_SHUTDOWN: i32 = 2;

/// SIGHUP: the config file again (when one was given: the embedded default cannot change),
/// then the file-backed parts (certificates, password file, SCRAM file, JWT keys, ACL). A
/// config file that does not load is rejected whole and the running config kept; the
/// file-backed parts are re-read either way (each keeps its own state when its files are bad).
fn reload(
    server: &postbox::server::RunningServer,
    path: Option<&std::path::Path>,
    overrides: &Overrides,
    log: &postbox::logging::LogHandle,
) {
    tracing::info!("SIGHUP: reloading the config file, certificates, password file and ACL");
    if let Some(path) = path {
        match Config::load_noting(Some(path), overrides) {
            Ok((new, notes)) => {
                for note in &notes {
                    tracing::warn!("{note}");
                }
                // The filter first, so the server's "reload: applied log.level" line is true
                // by the time anyone reads it (an unchanged level sets the same filter again).
                let level = log.set_level(&new.log.level);
                let changes = server.reload_config(&new);
                if changes.applied.iter().any(|k| k == "log.level") {
                    match level {
                        Ok(true) => {}
                        Ok(false) => tracing::warn!(
                            source = log.source().as_str(),
                            "log.level changed but RUST_LOG or -v chose the filter; it stays"
                        ),
                        Err(error) => tracing::error!(%error, "log.level not applied"),
                    }
                }
            }
            Err(error) => tracing::error!(
                file = %path.display(),
                %error,
                "config file rejected; keeping the running config"
            ),
        }
    }
    server.reload();
}

/// What a signal asks of the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM or Ctrl-C: a graceful stop.
    Stop,
    /// SIGHUP: re-read certificates, password file and ACL (Mosquitto's habit).
    Reload,
}

/// Ctrl-C, SIGTERM (systemd, containers) and SIGHUP, registered up front: a signal that
/// arrives before [`Signals::next`] is awaited is kept, not lost to the default action
/// (which for SIGHUP and SIGTERM would end the process).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
                hangup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves on the next SIGTERM or Ctrl-C (SIGHUPs meanwhile are ignored): during
    /// shutdown, when only a stop means anything.
    async fn next_stop(&mut self) {
        while self.next().await != Signal::Stop {
            tracing::info!("SIGHUP during shutdown: ignored");
        }
    }

    /// Resolves on the next signal.
    async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => Signal::Stop,
            _ = self.interrupt.recv() => Signal::Stop,
            _ = self.hangup.recv() => Signal::Reload,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }
}

/// `postbox bridge import`: the TOML on stdout (ready to redirect into a file), the notes on
/// stderr, then whether the TOML loads as it is (a TLS file missing on this machine, a stanza
/// without topics): said as a warning, since the user is expected to edit the result anyway.
fn bridge_import(file: &std::path::Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    // mosquitto.conf files are often Latin-1 in their comments; option values are ASCII.
    let text = String::from_utf8_lossy(&bytes);
    let origin = file.display().to_string();
    let result = postbox::tools::import_bridge(&text, &origin);
    // One line ending at the end, so `>> postbox.toml` appends cleanly.
    if result.toml.ends_with('\n') {
        print!("{}", result.toml);
    } else {
        println!("{}", result.toml);
    }
    for note in &result.notes {
        eprintln!("note: {note}");
    }
    if let Err(error) = Config::from_toml_str(&result.toml, "<imported TOML>") {
        eprintln!("warning: the imported TOML does not load as it is: {error}");
    }
    Ok(())
}

/// `postbox passwd`: edits the file and replaces it atomically.
fn passwd(args: &PasswdArgs) -> anyhow::Result<()> {
    use postbox::tools::password::{file, PasswordHash};
    let hash = |password: &str| -> anyhow::Result<PasswordHash> {
        if args.argon2id {
            PasswordHash::new_argon2id(password.as_bytes()).map_err(|e| anyhow::anyhow!(e))
        } else {
            Ok(PasswordHash::new_pbkdf2(
                password.as_bytes(),
                args.iterations,
            ))
        }
    };
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    if args.update {
        anyhow::ensure!(args.user.is_none(), "-U takes only the file");
        let text = read(&args.file)?;
        let mut out = String::with_capacity(text.len() * 2);
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            let (user, password) = line.split_once(':').with_context(|| {
                format!("{}:{}: not `user:password`", args.file.display(), i + 1)
            })?;
            // Already hashed lines stay as they are (running -U twice is harmless).
            let hashed = PasswordHash::parse(password).is_ok();
            let value = if hashed {
                password.to_owned()
            } else {
                hash(password)?.encode()
            };
            out.push_str(&format!("{user}:{value}\n"));
        }
        file::write_atomically(&args.file, &out)?;
        return Ok(());
    }
    let user = args.user.as_deref().context("a user name is needed")?;
    anyhow::ensure!(
        !user.is_empty() && !user.contains(':'),
        "a user name must be non-empty and must not contain ':'"
    );
    let existing = if args.create {
        String::new()
    } else {
        read(&args.file)?
    };
    if args.delete && args.scram.is_some() {
        let kind = scram_kind(args.scram.as_deref().unwrap_or_default())?;
        let text = scram_edit(&existing, user, kind, None);
        anyhow::ensure!(
            text != existing,
            "user {user} has no {} line in {}",
            kind.method(),
            args.file.display()
        );
        file::write_atomically(&args.file, &text)?;
        return Ok(());
    }
    if args.delete {
        anyhow::ensure!(args.password.is_none(), "-D takes a file and a user");
        let (text, found) = file::edit(&existing, &file::Edit::Delete(user));
        anyhow::ensure!(found, "user {user} not in {}", args.file.display());
        file::write_atomically(&args.file, &text)?;
        return Ok(());
    }
    let password = match (&args.password, args.batch) {
        (Some(password), true) => password.clone(),
        (None, true) => anyhow::bail!("-b needs a password"),
        (Some(_), false) => anyhow::bail!("a password on the command line needs -b"),
        (None, false) => read_password()?,
    };
    // `$7$` cannot tell `pw` from `pw\0` (HMAC pads keys with zeros) and the broker refuses
    // passwords ending in NUL for it: none is written, so the broker's refusal is exact.
    anyhow::ensure!(!password.contains('\0'), "a password must not contain NUL");
    if let Some(kind) = &args.scram {
        let kind = scram_kind(kind)?;
        let line =
            postbox::tools::scram::scram_credential_line(kind, user, &password, args.iterations);
        let text = scram_edit(&existing, user, kind, Some(&line));
        file::write_atomically(&args.file, &text)?;
        return Ok(());
    }
    let hash = hash(&password)?;
    let (text, _) = file::edit(&existing, &file::Edit::Set(user, &hash));
    file::write_atomically(&args.file, &text)?;
    Ok(())
}

/// The password: prompted twice without echo on a terminal, else the first line of stdin.
fn read_password() -> anyhow::Result<String> {
    use std::io::{BufRead, IsTerminal, Write};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        let password = line.trim_end_matches(['\r', '\n']).to_owned();
        anyhow::ensure!(!password.is_empty(), "no password on stdin");
        return Ok(password);
    }
    let prompt = |text: &str| -> anyhow::Result<String> {
        eprint!("{text}");
        std::io::stderr().flush()?;
        let _echo = EchoOff::new();
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        eprintln!();
        Ok(line.trim_end_matches(['\r', '\n']).to_owned())
    };
    let first = prompt("Password: ")?;
    let second = prompt("Reenter password: ")?;
    anyhow::ensure!(first == second, "passwords do not match");
    anyhow::ensure!(!first.is_empty(), "empty password");
    Ok(first)
}

/// Turns the terminal's echo off while it lives.
struct EchoOff {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl EchoOff {
    fn new() -> EchoOff {
        #[cfg(unix)]
        {
            // SAFETY: tcgetattr/tcsetattr on stdin with a zeroed termios they fill in.
            unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(libc::STDIN_FILENO, &raw mut t) != 0 {
                    return EchoOff { saved: None };
                }
                let saved = t;
                t.c_lflag &= !libc::ECHO;
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw const t);
                EchoOff { saved: Some(saved) }
            }
        }
        #[cfg(not(unix))]
        EchoOff {}
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(saved) = &self.saved {
            // SAFETY: restores the attributes read in `new`.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
            }
        }
    }
}

/// The `--scram` argument.
fn scram_kind(name: &str) -> anyhow::Result<postbox::tools::scram::ScramKind> {
    use postbox::tools::scram::ScramKind;
    match name.to_ascii_lowercase().as_str() {
        "sha-256" | "sha256" | "scram-sha-256" => Ok(ScramKind::Sha256),
        "sha-512" | "sha512" | "scram-sha-512" => Ok(ScramKind::Sha512),
        other => anyhow::bail!("--scram takes sha-256 or sha-512, not {other:?}"),
    }
}

/// `text` with `user`'s line of `kind` replaced by `line` (appended if it had none), or
/// removed when `line` is `None`; every other line as it was.
fn scram_edit(
    text: &str,
    user: &str,
    kind: postbox::tools::scram::ScramKind,
    line: Option<&str>,
) -> String {
    let prefix = format!("{user}:${}$", kind.method().to_ascii_lowercase());
    let mut out = String::with_capacity(text.len() + 200);
    let mut placed = false;
    for existing in text.lines() {
        if existing.starts_with(&prefix) {
            if let (Some(line), false) = (line, placed) {
                out.push_str(line);
                out.push('\n');
                placed = true;
            }
            continue;
        }
        out.push_str(existing);
        out.push('\n');
    }
    if let (Some(line), false) = (line, placed) {
        out.push_str(line);
        out.push('\n');
    }
    out
}
