//! Start-up and shutdown of a whole broker: listeners, metrics, broker state.
//!
//! Used by the binary and by the integration tests, which run the real broker in-process on
//! an ephemeral port.
//!
//! The server owns the lifecycle: it binds every configured listener (through
//! [`transport::bind`], whatever their kind) and the metrics endpoint, and at shutdown stops
//! all listeners, then tells the broker once (`Broker::begin_shutdown`), then waits for the
//! connections, closes the store and finally stops the metrics endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bridge::BridgeStatus;
use crate::broker::Broker;
use crate::config::Config;
use crate::metrics::{self, Metrics};
use crate::reload::{ReloadReport, Reloaders};
use crate::transport;

/// Why the broker could not start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("cannot listen on {addr} (listener `{listener}`): {source}")]
    /// A listener's address could not be bound.
    Bind {
        /// Name of the listener in the config.
        listener: String,
        /// Address it was to bind.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The JWT keys (`[auth.jwt]`) could not be read or hold no usable key.
    #[error("cannot use the JWT keys: {0}")]
    Jwt(#[from] crate::auth::jwt::JwtError),
    #[error("cannot use the password file: {0}")]
    /// The password file (`auth.password_file`) could not be read or has a bad line.
    Passwords(#[from] crate::auth::credential_file::CredentialFileError),
    #[error("cannot start the metrics endpoint: {0}")]
    /// The Prometheus exporter could not start.
    Metrics(String),
    #[error("cannot load the ACL: {0}")]
    /// `auth.acl_file` could not be read or has a bad line (file and line named).
    Acl(#[from] crate::auth::acl::AclError),
    #[error("cannot open the durable store: {0}")]
    /// The durable store could not be opened or recovered.
    Storage(#[from] crate::storage::StorageError),
    #[error("{0}")]
    /// The SCRAM credentials file (`auth.scram_file`) could not be loaded.
    Scram(#[from] crate::auth::scram_file::ScramFileError),
    /// `admin.token_file` could not be read or is empty.
    #[error("cannot use the admin token: {0}")]
    AdminToken(#[from] crate::admin::TokenError),
    /// A `[[schema]]` file could not be read or compiled.
    #[error("cannot load a schema: {0}")]
    Schema(#[from] crate::guarantees::schema::SchemaError),
    /// The NATS password (`cluster.password_file`) could not be read.
    #[error("cannot connect the cluster: {0}")]
    Cluster(#[from] crate::cluster::CredentialsError),
    /// A bridge's TLS files (`[bridge.tls]`) could not be loaded.
    #[error("cannot start a bridge: {0}")]
    Bridge(#[from] crate::bridge::BridgeStartError),
}

/// Opens the store, restores what it holds into a new broker (blocking I/O, off the runtime).
async fn open_broker(
    config: &Config,
    mut parts: crate::broker::Parts,
) -> Result<Arc<Broker>, StartError> {
    let storage_config = config.storage.clone();
    let (store, snapshot) = tokio::task::spawn_blocking(move || {
        let store = crate::storage::open(&storage_config)?;
        let snapshot = store.load()?;
        Ok::<_, crate::storage::StorageError>((store, snapshot))
    })
    .await
    .map_err(|e| StartError::Storage(crate::storage::StorageError::Failed(e.to_string())))??;
    let persistence = store.survives_restart();
    parts.store = Some(store);
    // Built with its guarantees: the restore hands the dedup window its stored keys.
    let broker = Broker::new(parts);
    if persistence {
        let mut snapshot = snapshot;
        if config.cluster.is_some() {
            // Clustered, a delayed will belongs to its session's record in the cluster,
            // whichever node fires it (`cluster::orphans`): published from here too, it
            // would go out twice. The store's copies are dropped with the first compaction.
            for will in std::mem::take(&mut snapshot.wills) {
                broker.forget_will_of(&will.client_id);
            }
        }
        let summary = broker.restore(snapshot);
        // Sessions whose expiry passed while the broker was down expired all the same.
        broker
            .metrics
            .sessions_expired
            .increment(summary.expired_sessions as u64);
        tracing::info!(
            sessions = summary.sessions,
            expired_sessions = summary.expired_sessions,
            queued = summary.queued,
            inflight = summary.inflight,
            retained = summary.retained,
            wills = summary.wills,
            "restored durable state"
        );
    }
    Ok(broker)
}

/// Where one listener listens, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundListener {
    /// The listener's name (`[[listener]] name`, or its default).
    pub name: Arc<str>,
    /// Its actual address (port 0 resolved).
    pub addr: SocketAddr,
}

/// A broker that is up and serving.
#[derive(Debug)]
pub struct RunningServer {
    /// Where the first MQTT listener actually listens (resolves port 0); the same as
    /// `listeners[0].addr`.
    pub mqtt_addr: SocketAddr,
    /// Every MQTT listener, in config order.
    pub listeners: Vec<BoundListener>,
    /// The broker state, for tests and embedding (sessions, metrics).
    pub broker: Arc<Broker>,
    /// One status per `[[bridge]]`, in config order: what the bridge engine reports and the
    /// metrics, `$SYS` and the admin API read.
    pub bridges: Vec<Arc<BridgeStatus>>,
    shutdown: CancellationToken,
    /// Waits for the token, stops every listener, then begins the broker's shutdown.
    stopping: JoinHandle<()>,
    /// Every connection task, so shutdown can wait for their last store updates.
    connections: TaskTracker,
    /// The HTTP listeners' tasks (metrics, probes, admin API, status page; the API on a
    /// listener of its own with `admin.bind`) and the tokens that end them (last, after the
    /// store closed).
    http: Vec<(CancellationToken, JoinHandle<()>)>,
    /// The file-backed parts SIGHUP re-reads (certificates, password file, ACL).
    reloaders: Reloaders,
    /// The config in force: the start-up one with the keys reloads applied
    /// ([`RunningServer::reload_config`]); locked only by a reload.
    running_config: parking_lot::Mutex<Config>,
    /// The bound of all listeners together, which a reload of `mqtt.max_connections` sets.
    server_slots: Arc<transport::ServerSlots>,
}

/// How long a graceful shutdown may take in all (connections told and drained, wills routed,
/// the store's final commit) before the binary exits anyway, with a non-zero status. The
/// connections get [`SHUTDOWN_GRACE`] of it; the rest is for the store's final fsync. Below
/// systemd's `TimeoutStopSec` (30 s in `deploy/systemd`) and Kubernetes'
/// `terminationGracePeriodSeconds` (30 s in `deploy/kubernetes`), so the broker ends itself
/// before it is killed (`tests/suite/deploy_checks.rs` keeps the files above it).
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(20);

/// How long shutdown waits for connection tasks to send their DISCONNECTs and finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long shutdown waits for HTTP requests in progress (a scrape, an API call).
const HTTP_GRACE: Duration = Duration::from_secs(2);

/// Binds every configured listener and starts serving.
///
/// # Errors
///
/// A `StartError` when a listener cannot bind, the metrics endpoint cannot start, or the
/// durable store cannot be opened. Nothing is left running then.
pub async fn start(config: Config) -> Result<RunningServer, StartError> {
    // Bound first, so a taken port stops the start before the store opens; served below.
    let exporter = if config.metrics.enabled {
        Some(
            metrics::start_exporter(config.metrics.bind)
                .map_err(|e| StartError::Metrics(e.to_string()))?,
        )
    } else {
        None
    };
    // The API's own listener (`admin.bind`), bound as early and for the same reason.
    let api_exporter = match config.admin.bind {
        Some(bind) => Some(
            metrics::start_exporter(bind)
                .map_err(|e| StartError::Metrics(format!("admin.bind: {e}")))?,
        ),
        None => None,
    };
    let api_served = config.metrics.enabled || api_exporter.is_some();
    // Validation checked the file; read now, before anything runs.
    let admin_token = match &config.admin.token_file {
        Some(path) if api_served => Some(crate::admin::Token::load(path)?),
        _ => None,
    };
    // Before the broker opens: a bad ACL must stop the start, not leave it open to everyone.
    let acl = match &config.auth.acl_file {
        Some(path) => Some(Arc::new(crate::auth::acl_slot::AclSlot::load(
            path.clone(),
        )?)),
        None => None,
    };
    // Before the store opens: a bridge's bad TLS file must stop the start.
    let bridge_tls = crate::bridge::load_tls(&config.bridges)?;
    // Before the store opens: a schema that does not compile must stop the start.
    let guarantees = crate::guarantees::Guarantees::from_config(&config)?;
    let schemas = guarantees.schemas.clone();
    let jwt = match &config.auth.jwt {
        Some(settings) => Some(Arc::new(crate::auth::jwt::JwtVerifier::load(
            settings.clone(),
        )?)),
        None => None,
    };
    let metrics = Metrics::register();
    let logins = crate::auth::login::Logins::from_config(&config, &metrics)?.with_jwt(jwt.clone());
    let passwords = logins.passwords().cloned();
    if let Some(store) = &passwords {
        tracing::info!(users = store.users(), "password file loaded");
    }
    if logins.binds_sessions() {
        // A listener that takes the user name from the client certificate admits no client
        // without one (twenty-fifth adversarial pass, K4).
        let certificate_only: Vec<String> = config
            .listeners
            .iter()
            .zip(config.listener_names())
            .filter(|(l, _)| l.certificate_only())
            .map(|(_, name)| name)
            .collect();
        let mut open = logins.anonymous_listeners();
        open.retain(|name| !certificate_only.iter().any(|c| **c == **name));
        if !open.is_empty() {
            let listeners = open.join(", ");
            tracing::warn!(%listeners, "an authentication method is set but clients without credentials are still let in on these listeners; set allow_anonymous = false to refuse them");
        }
    } else {
        // No authentication method: say so when anyone on the network may connect (the
        // default listens on loopback only, as Mosquitto 2.x without a config; issue 35,
        // fifth adversarial pass; issue 37, item 2).
        let exposed: Vec<String> = config
            .listeners
            .iter()
            .zip(config.listener_names())
            .filter(|(l, name)| !l.bind.ip().is_loopback() && logins.anonymous_allowed(name))
            .map(|(l, _)| l.bind.to_string())
            .collect();
        if !exposed.is_empty() {
            let listeners = exposed.join(", ");
            tracing::warn!(%listeners, "no authentication method is configured: any client that reaches these addresses may connect, publish and subscribe; see docs/security.md (allow_anonymous = false and a password_file)");
        }
    }
    // What each listener asks of its clients, for the start-up lines (issue 37, item 2).
    // A listener that takes the user name from the client certificate admits no one without
    // one, whatever else is set (issue 35, twenty-fourth adversarial pass, J2).
    let admits: Vec<(&'static str, bool)> = config
        .listeners
        .iter()
        .zip(config.listener_names())
        .map(|(listener, name)| {
            if listener.certificate_only() {
                return (
                    "a client certificate only (its identity is the user name; CONNECT credentials are ignored)",
                    false,
                );
            }
            match (logins.binds_sessions(), logins.anonymous_allowed(&name)) {
                (false, _) => ("anyone (no authentication method)", true),
                (true, true) => ("credentials, or none (anonymous allowed)", true),
                (true, false) => ("credentials only", false),
            }
        })
        .collect();
    let cluster = config
        .cluster
        .as_ref()
        .map(|cluster| crate::cluster::Cluster::new(cluster, &metrics))
        .transpose()?;
    // Bound (and their certificates loaded) before the store opens, like the metrics
    // endpoint: a taken port or a missing certificate stops the start before the data
    // directory is made (issue 37). Nothing is accepted until the listeners run, below.
    let mut bound = Vec::with_capacity(config.listeners.len());
    for (listener, name) in config.listeners.iter().zip(config.listener_names()) {
        let l =
            transport::bind(name.as_str().into(), listener).map_err(|source| StartError::Bind {
                listener: name.clone(),
                addr: listener.bind,
                source,
            })?;
        bound.push(l);
    }
    let mut parts = crate::broker::Parts::bare(config.mqtt.clone(), config.auth.clone(), metrics);
    parts.logins = Some(logins);
    parts.acl = acl.clone();
    parts.guarantees = Some(guarantees);
    parts.cluster = cluster
        .clone()
        .map(|cluster| cluster as Arc<dyn crate::broker::ClusterSeam>);
    let broker = open_broker(&config, parts).await?;
    let mut reloaders = Reloaders::default();
    if let Some(path) = &config.auth.scram_file {
        // The decoy key in the data directory: one node's own (a cluster's nodes must
        // answer an unknown name alike, so they derive it from the file).
        let key_dir = config
            .storage
            .persistence_dir()
            .filter(|_| config.cluster.is_none());
        let store = crate::auth::scram_file::register(broker.authenticators(), path, key_dir)?;
        reloaders.register(store);
    }
    if let Some(schemas) = schemas {
        reloaders.register(schemas);
    }
    let tls_reloaders: Vec<_> = bound.iter().filter_map(|l| l.reloader()).collect();
    let listeners: Vec<BoundListener> = bound
        .iter()
        .map(|l| BoundListener {
            name: Arc::clone(l.name()),
            addr: l.local_addr(),
        })
        .collect();
    // Validation guarantees at least one listener.
    let mqtt_addr = listeners[0].addr;

    let shutdown = CancellationToken::new();
    let connections = TaskTracker::new();
    let readiness = Arc::new(crate::admin::Readiness::default());
    // The store's own metric group, declared against the broker's registry before anything
    // serves it.
    let store_metrics = crate::storage::StoreMetrics::register(&broker.metrics);
    store_metrics
        .budget_bytes
        .set(config.storage.max_disk_bytes as f64);
    if let Some(store) = broker.store().cloned() {
        store.observe_commits(store_metrics.commit_seconds.clone());
        // Publishers paused while the writer's queue was long resume as it drains.
        let weak = Arc::downgrade(&broker);
        store.after_commits(Box::new(move || {
            if let Some(broker) = weak.upgrade() {
                broker.flow().on_drained();
            }
        }));
        // Copied at each reading, so a scrape or snapshot shows the store as it is (no
        // periodic copy); what recovery lost is there from the first scrape on.
        broker
            .metrics
            .on_scrape(move |_| store_metrics.update(&store.stats()));
    }
    // One status per `[[bridge]]`, in config order, made once the broker holds its restored
    // state (a status publishes its `$SYS` state `0` now and registers its metrics).
    // `bridge::start` (once the listeners run) drives them.
    let bridges: Vec<Arc<BridgeStatus>> = config
        .bridges
        .iter()
        .enumerate()
        .map(|(index, bridge)| {
            let share = crate::broker::stranger_share::StrangerShare::of_bridge(index);
            BridgeStatus::new(bridge, share, &broker)
        })
        .collect();
    // Clustered: installed before the listeners run, so no PUBLISH can miss the cluster; it
    // connects to NATS in the background and refuses QoS 1/2 until NATS is reached.
    if let Some(cluster) = &cluster {
        cluster.run(&broker);
    }
    tokio::spawn(sweep_keep_alives(Arc::clone(&broker), shutdown.clone()));
    if config.mqtt.sys_interval > 0 {
        let interval = Duration::from_secs(u64::from(config.mqtt.sys_interval));
        tokio::spawn(crate::broker::sys::run(
            Arc::clone(&broker),
            interval,
            shutdown.clone(),
        ));
    }
    let handoff =
        transport::Handoff::new(Arc::clone(&broker), shutdown.clone(), connections.clone());
    let server_slots = Arc::clone(handoff.server_slots());
    let accepting: Vec<JoinHandle<()>> = bound
        .into_iter()
        .map(|listener| tokio::spawn(listener.run(handoff.clone(), shutdown.clone())))
        .collect();
    // The status page's Listeners table: what the start-up lines below say, per listener.
    let listener_infos: Vec<crate::admin::ListenerInfo> = listeners
        .iter()
        .zip(&config.listeners)
        .zip(&admits)
        .map(|((l, listener), (admits, anonymous))| {
            crate::admin::ListenerInfo::new(&l.name, l.addr, listener, admits, *anonymous)
        })
        .collect();
    for ((l, config), (admits, _)) in listeners.iter().zip(&config.listeners).zip(&admits) {
        let kind = config.kind.as_str();
        // Loopback is the default (as Mosquitto 2 without a config): say so, since a client
        // on another machine is then refused with nothing in the log (issue 37, item 2).
        let reach = if l.addr.ip().is_loopback() {
            "this machine only (loopback; set bind to serve the network)"
        } else {
            "the network"
        };
        tracing::info!(listener = %l.name, addr = %l.addr, %kind, %admits, %reach, "MQTT listener up");
    }
    readiness.listeners_up();
    crate::bridge::start(
        &broker,
        &config.bridges,
        bridge_tls,
        &bridges,
        &connections,
        &shutdown,
    );
    let stopping = tokio::spawn(stop_listeners_then_broker(
        accepting,
        Arc::clone(&broker),
        shutdown.clone(),
    ));
    let mut http = Vec::new();
    let broker_metrics = broker.metrics.clone();
    let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || broker_metrics.render());
    let state = crate::admin::AdminState::new(
        Arc::clone(&broker),
        render,
        Arc::clone(&readiness),
        admin_token,
    )
    .with_rules(
        &config.admin.allowed_hosts,
        config.admin.require_token_on_loopback,
    )
    .with_store_budget(config.storage.max_disk_bytes)
    .with_bridges(bridges.clone())
    .with_listeners(listener_infos);
    let apart = api_exporter.is_some();
    // One set of bounds for both HTTP listeners: together they take at most
    // `metrics.max_connections` file descriptors.
    let http_bounds = crate::admin::HttpBounds::new(&config.metrics);
    for (endpoint, serves) in [
        exporter.map(|e| {
            let serves = if apart {
                crate::admin::Serves::MetricsAndProbes
            } else {
                crate::admin::Serves::All
            };
            (e, serves)
        }),
        api_exporter.map(|e| (e, crate::admin::Serves::Api)),
    ]
    .into_iter()
    .flatten()
    {
        let listener = endpoint.into_listener();
        let addr = listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        let stop = CancellationToken::new();
        let state = state.clone().serving(serves);
        let bounds = Arc::clone(&http_bounds);
        let task = tokio::spawn(crate::admin::serve(listener, state, bounds, stop.clone()));
        match serves {
            crate::admin::Serves::All => {
                tracing::info!(addr = %addr, "HTTP endpoint up: /metrics, /healthz, /readyz, /api/v1, status page /");
            }
            crate::admin::Serves::MetricsAndProbes => {
                tracing::info!(addr = %addr, "HTTP endpoint up: /metrics, /healthz, /readyz");
            }
            crate::admin::Serves::Api => {
                tracing::info!(addr = %addr, "admin HTTP endpoint up: /api/v1, status page /");
            }
        }
        http.push((stop, task));
    }
    if let Some(jwt) = jwt {
        reloaders.register(Arc::new(JwtReload {
            jwt,
            broker: Arc::downgrade(&broker),
        }));
    }
    if let Some(store) = passwords {
        reloaders.register(store);
    }
    for part in tls_reloaders {
        reloaders.register(part);
    }
    if let Some(acl) = acl {
        reloaders.register(acl);
    }
    Ok(RunningServer {
        mqtt_addr,
        listeners,
        broker,
        bridges,
        shutdown,
        stopping,
        connections,
        http,
        reloaders,
        running_config: parking_lot::Mutex::new(config),
        server_slots,
    })
}

/// The one place shutdown begins, however it is triggered ([`RunningServer::shutdown`] or
/// the token): no listener accepts any more by the time the broker is told, so every client
/// that got in is told too.
async fn stop_listeners_then_broker(
    accepting: Vec<JoinHandle<()>>,
    broker: Arc<Broker>,
    shutdown: CancellationToken,
) {
    shutdown.cancelled().await;
    for listener in accepting {
        let _ = listener.await;
    }
    // Connections do not watch the token themselves (one less future each).
    broker.begin_shutdown();
}

/// Wakes connections whose keep-alive (or partial packet's deadline) ran out, every
/// [`crate::broker::KEEP_ALIVE_SWEEP`], until shutdown: one task for all connections instead
/// of a timer in each. Also copies the bytes held by partial packets and the flow-control
/// figures (paused publishers, memory used) into their metrics.
async fn sweep_keep_alives(broker: Arc<Broker>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(crate::broker::KEEP_ALIVE_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                broker.wake_expired_keep_alives();
                let partial = crate::connection::partial_packet_bytes();
                broker.metrics.partial_packet_bytes.set(partial as f64);
                broker.update_flow_metrics(
                    crate::connection::budgeted_partial_bytes(),
                    crate::connection::anonymous_partial_bytes(),
                );
            }
            () = shutdown.cancelled() => return,
        }
    }
}

impl RunningServer {
    /// Stops every listener, tells every client the server is going away (v5 0x8B), waits
    /// (bounded) for the connections, closes the store, then stops the metrics endpoint.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.stopping.await;
        self.connections.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the shutdown grace period");
        }
        if let Some(store) = self.broker.store().cloned() {
            // Final commit and sync; blocking file I/O, so off the runtime's workers.
            match tokio::task::spawn_blocking(move || store.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "durable store did not close cleanly"),
                Err(error) => tracing::error!(%error, "durable store close panicked"),
            }
        }
        for (stop, task) in self.http {
            stop.cancel();
            // Requests in progress finish; a client holding one open does not hold the exit.
            if tokio::time::timeout(HTTP_GRACE, task).await.is_err() {
                tracing::warn!("HTTP requests still open after the shutdown grace period");
            }
        }
    }

    /// Re-reads every file-backed part (SIGHUP): certificates, password file, ACL. A part
    /// whose new files are bad keeps its running state; connections are not touched.
    pub fn reload(&self) -> ReloadReport {
        if self.reloaders.is_empty() {
            tracing::info!("reload: no file-backed parts configured");
        }
        self.reloaders.reload_all()
    }

    /// Applies a reloaded config file (SIGHUP; already read and validated by the caller): the
    /// keys of [`crate::reload::config::RUNTIME_KEYS`] take effect for new connections and
    /// SUBSCRIBEs (`log.level` is the caller's to apply, see `logging`); every other changed
    /// key is logged as needing a restart and keeps its running value.
    pub fn reload_config(&self, new: &Config) -> crate::reload::config::ConfigChanges {
        let mut running = self.running_config.lock();
        let mut changes = crate::reload::config::compare(&running, new);
        self.reload_schemas(&running, &mut changes);
        self.broker
            .runtime_limits()
            .set(crate::config::RuntimeLimits::from_config(
                &changes.running.mqtt,
            ));
        self.server_slots
            .set_max(changes.running.mqtt.max_connections);
        for key in &changes.applied {
            tracing::info!(%key, "reload: applied {key}");
        }
        for key in &changes.needs_restart {
            tracing::warn!(%key, "reload: needs a restart: {key}");
        }
        if changes.applied.is_empty() && changes.needs_restart.is_empty() {
            tracing::info!("reload: the config file did not change");
        }
        running.clone_from(&changes.running);
        changes
    }

    /// A changed `[[schema]]` list (keys `schema`, `schema[i].*`): compiled and swapped into
    /// the running slot. A file that does not compile keeps the running schemas (logged; the
    /// next reload tries again); a broker started without any `[[schema]]` has no slot (its
    /// publish path pays nothing for schemas), so there the list needs a restart.
    fn reload_schemas(&self, running: &Config, changes: &mut crate::reload::config::ConfigChanges) {
        let is_schema = |k: &String| k == "schema" || k.starts_with("schema[");
        if !changes.applied.iter().any(is_schema) {
            return;
        }
        let slot = self.broker.guarantees().and_then(|g| g.schemas.as_ref());
        let outcome = match slot {
            Some(slot) => slot.replace(&changes.running.schemas).map_err(Some),
            None => Err(None),
        };
        let Err(error) = outcome else {
            return;
        };
        changes.running.schemas.clone_from(&running.schemas);
        let keys: Vec<String> = changes
            .applied
            .iter()
            .filter(|k| is_schema(k))
            .cloned()
            .collect();
        changes.applied.retain(|k| !is_schema(k));
        match error {
            Some(error) => {
                tracing::error!(%error, "reload: [[schema]] not applied; keeping the running schemas");
            }
            None => {
                changes.needs_restart.extend(keys);
                changes.needs_restart.sort();
            }
        }
    }

    /// The address of the listener called `name`, if there is one.
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|l| &*l.name == name)
            .map(|l| l.addr)
    }
}

/// The JWT keys' reload, then a wake-up of every connection: each client that logged in with
/// a token checks it against the new keys and is disconnected (v5 0x87) when they refuse it
/// (issue 35, seventh pass, N7: a key rotation revoked no connected client).
struct JwtReload {
    jwt: Arc<crate::auth::jwt::JwtVerifier>,
    broker: std::sync::Weak<Broker>,
}

impl crate::reload::Reload for JwtReload {
    fn what(&self) -> String {
        self.jwt.what()
    }

    fn reload(&self) -> Result<(), String> {
        self.jwt.reload()?;
        if let Some(broker) = self.broker.upgrade() {
            broker.wake_connections();
        }
        Ok(())
    }
}
