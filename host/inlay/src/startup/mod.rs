//! Start-up: the one module that sees the whole process and wires it.
//! [`main`] turns `inlay serve`'s config source into a running server:
//! the config read and checked, the diagnostic log, the async runtime;
//! [`Proxy`] loads what may refuse the start (the access log, the policy,
//! the admin token, the listeners' certificates, the cluster) before
//! anything listens, then opens the cache and runs the listeners, the
//! admin API, reloads (SIGHUP) and the cluster until the shutdown signal,
//! drains and flushes. [`check`] is `inlay check`.

mod cluster;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use inlay_cache::{CacheStore, HttpCache};
use inlay_cluster::Cluster;
use inlay_runtime::PolicySlot;
use inlay_storage::{StoreConfig, StoreError, TieredStore};
use tracing::{error, info, warn};

use crate::access_log::AccessLog;
use crate::admin::{Admin, AdminHooks, AdminServer, PolicyHook};
use crate::backend::component::ComponentSet;
use crate::config::{Config, ConfigError, ConfigSource};
use crate::listeners::{Listener, QuicListener, Tls};
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::reload::{Reloader, load_policy, log_replay_stats};
pub use crate::resolve::{Resolved, resolve};

/// `inlay serve`: read the config from `source` (a bad one exits with 2),
/// set up the diagnostic log and the runtime, and serve until SIGTERM or
/// SIGINT; SIGHUP reloads from `source`.
pub fn main(source: ConfigSource) -> std::process::ExitCode {
    let cfg = match source.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inlay: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    crate::diagnostics::init_tracing(&cfg.log.level);
    return_large_buffers_to_the_kernel();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inlay: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(cfg, source)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("inlay: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `inlay check`: whether the config at `path` would start a server (every
/// error with its key path, the admin token and the certificates read as
/// a start would); 0 when it would, 2 when not.
pub fn check(path: &Path) -> std::process::ExitCode {
    let fail = |errors: Vec<String>| {
        for e in errors {
            eprintln!("{}: {e}", path.display());
        }
        std::process::ExitCode::from(2)
    };
    match Config::from_file(path).and_then(resolve) {
        Ok(settings) => {
            // Component backends compile and instantiate as at a start.
            if let Err(errors) = check_components(&settings.config) {
                return fail(errors);
            }
        }
        Err(ConfigError::Invalid(issues)) => {
            return fail(
                issues
                    .iter()
                    .map(|i| format!("{}: {}", i.path, i.message))
                    .collect(),
            );
        }
        Err(e) => return fail(vec![e.to_string()]),
    }
    println!("{}: ok", path.display());
    std::process::ExitCode::SUCCESS
}

/// The components of `cfg`'s component backends, loaded: a file that
/// does not load stops start-up here, with its key path.
async fn load_components(cfg: &Config) -> anyhow::Result<ComponentSet> {
    ComponentSet::load(cfg, &ComponentSet::new())
        .await
        .map_err(|issues| ConfigError::Invalid(issues).into())
}

/// `inlay check`'s load of the component backends; every error.
fn check_components(cfg: &Config) -> Result<(), Vec<String>> {
    if cfg.backends.values().all(|b| b.component.is_none()) {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            vec![format!(
                "cannot start a runtime to load the components: {e}"
            )]
        })?;
    rt.block_on(ComponentSet::load(cfg, &ComponentSet::new()))
        .map(|_| ())
        .map_err(|issues| {
            issues
                .iter()
                .map(|i| format!("{}: {}", i.path, i.message))
                .collect()
        })
}

/// Serves buffers of 256 KiB and more (origin bodies on their way to the
/// cache) from their own mappings, returned to the kernel when freed.
///
/// glibc raises its mmap threshold to the largest buffer freed so far (up
/// to 32 MiB), so 1 MiB bodies ended up in its arenas, which keep freed
/// memory: the VOD scenario's cold run went 6 MiB over its resident
/// memory allowance (now 82 MiB under it). A fixed threshold stops that. Disk-tier reads are
/// mapped from their files and no longer allocate, so the page faults a
/// fresh mapping costs now fall only on fetches from the origin.
#[allow(unsafe_code)]
fn return_large_buffers_to_the_kernel() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called
    // before the runtime starts its threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// Bind, serve until SIGTERM/SIGINT, drain; SIGHUP reloads the config
/// from `source` as a new generation.
async fn serve(cfg: Config, source: ConfigSource) -> anyhow::Result<()> {
    // The policy is compiled before we listen: a bad one stops start-up here.
    let proxy = Proxy::load(cfg).await?.reloading(source)?;
    if let Some(warning) = crate::listeners::raise_open_files(&proxy.config().server) {
        warn!("{warning}");
    }
    let mut listeners = Vec::new();
    let backlog = proxy.config().server.listen_backlog;
    for addr in &proxy.config().server.listen {
        let l = inlay_listener::bind(*addr, backlog)
            .with_context(|| format!("cannot listen on {addr}"))?;
        // Tests and scripts read this line to learn the port of `-a 127.0.0.1:0`.
        info!("listening on http://{}", l.local_addr()?);
        listeners.push(Listener::plain(l));
    }
    for addr in &proxy.config().server.listen_tls {
        let l = inlay_listener::bind(*addr, backlog)
            .with_context(|| format!("cannot listen on https://{addr}"))?;
        info!("listening on https://{}", l.local_addr()?);
        listeners.push(Listener::tls(l, proxy.tls().clone()));
    }
    for addr in &proxy.config().server.listen_h2c {
        let l = inlay_listener::bind(*addr, backlog)
            .with_context(|| format!("cannot listen on h2c://{addr}"))?;
        info!("listening on h2c://{}", l.local_addr()?);
        listeners.push(Listener::h2c(l));
    }
    let mut quic = Vec::new();
    for addr in &proxy.config().server.listen_quic {
        let l = QuicListener::bind(*addr, proxy.tls())
            .with_context(|| format!("cannot listen on quic://{addr}"))?;
        info!("listening on quic://{}", l.local_addr());
        quic.push(l);
    }
    let proxy = proxy.with_quic(quic);
    let admin = match proxy.config().admin {
        Some(addr) => Some(AdminServer::bind(addr, proxy.admin().clone()).await?),
        None => None,
    };
    let served = proxy.run(listeners, shutdown_signal()).await;
    if let Some(admin) = admin {
        admin.shutdown().await;
    }
    served
}

/// The proxy before it serves: the access log open and the policy loaded,
/// so that a bad policy stops start-up before anything listens.
#[derive(Debug)]
pub struct Proxy {
    /// The config, its files read.
    settings: Resolved,
    access_log: AccessLog,
    policy: Option<Arc<PolicySlot>>,
    admin: Admin,
    /// The config source SIGHUP reads again, and the SIGHUP stream
    /// (installed before anything listens); `None`: no SIGHUP handler.
    reload_source: Option<(ConfigSource, tokio::signal::unix::Signal)>,
    metrics: Arc<Metrics>,
    /// The TLS listeners' certificates (none without `[[server.tls]]`).
    tls: Arc<Tls>,
    /// The NATS connection of `[cluster]`, made before anything listens.
    cluster: Option<Cluster>,
    /// The component backends' components, loaded before anything listens.
    components: ComponentSet,
    /// The QUIC (HTTP/3) listeners, bound ([`with_quic`](Self::with_quic)).
    quic: Vec<QuicListener>,
}

impl Proxy {
    /// Open the access log and load the configured policy.
    pub async fn load(cfg: Config) -> anyhow::Result<Self> {
        // The files the config names (TLS, the admin token): a bad one
        // stops start-up here, with its key path.
        let mut settings = resolve(cfg)?;
        let cfg = Arc::clone(&settings.config);
        let access_log = AccessLog::open(&cfg.log).context("opening the access log")?;
        let policy = load_policy(&cfg).await?;
        let components = load_components(&cfg).await?;
        let admin = admin_of(&settings, policy.as_ref());
        let metrics = Metrics::new(cfg.metrics.enabled);
        let cluster_metrics = cluster::metrics(&metrics);
        // A certificate or key that does not load stops start-up here.
        let tls = crate::listeners::tls(std::mem::take(&mut settings.certificates))?;
        // A node that cannot reach its cluster does not serve: it would
        // miss the purges of the others.
        let cluster = match &cfg.cluster {
            Some(c) => {
                let cluster = Cluster::connect(c, cluster_metrics).await?;
                info!(node = %c.node_name, servers = %c.nats_urls.join(", "), "cluster: joined");
                Some(cluster)
            }
            None => None,
        };
        Ok(Self {
            settings,
            access_log,
            policy,
            admin,
            reload_source: None,
            metrics,
            tls: Arc::new(tls),
            cluster,
            components,
            quic: Vec::new(),
        })
    }

    /// Serve HTTP/3 on `quic` too (bound with [`tls`](Self::tls)'s
    /// certificates), beside the listeners [`run`](Self::run) takes.
    #[must_use]
    pub fn with_quic(mut self, quic: Vec<QuicListener>) -> Self {
        self.quic = quic;
        self
    }

    /// What the admin API serves: its readiness turns ready once [`run`](Self::run)
    /// has opened the cache, and stopping when its `shutdown` resolves.
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    /// Reload on SIGHUP: read the config from `source` again.
    pub fn reloading(mut self, source: ConfigSource) -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        self.reload_source = Some((source, hup));
        Ok(self)
    }

    /// The configuration it serves with.
    pub fn config(&self) -> &Config {
        &self.settings.config
    }

    /// The process's metrics, for `GET /metrics` ([`Metrics::render`]).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The TLS side of the listeners, for [`Listener::tls`]; a reload
    /// swaps its certificates.
    pub fn tls(&self) -> &Arc<Tls> {
        &self.tls
    }

    /// The node's cluster connection, if `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The policy slot (reloaded in place by SIGHUP), if a policy is configured.
    pub fn policy(&self) -> Option<&Arc<PolicySlot>> {
        self.policy.as_ref()
    }

    /// Open the cache and serve `listeners` until `shutdown` resolves; then
    /// drain in-flight requests, write out the access log and flush the cache.
    pub async fn run(
        self,
        listeners: impl IntoIterator<Item = impl Into<Listener>>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Self {
            settings,
            access_log,
            policy,
            admin,
            reload_source,
            metrics,
            tls,
            cluster,
            components,
            quic,
        } = self;
        let cfg = Arc::clone(&settings.config);
        let store = open_store(&cfg)?;
        let shared_kv = inlay_cluster::kv::open_if_configured(cluster.as_ref()).await?;
        let listeners: Vec<Listener> = listeners.into_iter().map(Into::into).collect();
        let listening = listeners.iter().find(|l| !l.is_tls());
        let listening = listening.and_then(|l| l.local_addr().ok());
        let shard = inlay_cluster::shard::start(cluster.as_ref(), listening).await?;
        let connections = crate::listeners::ListenerStats {
            tcp: metrics.connections().clone(),
            quic: metrics.quic().clone(),
        };
        let pipeline = Pipeline::first(
            Arc::clone(&settings.config),
            &settings.backend_tls,
            &components,
            HttpCache::new(store, cfg.cache_rules()),
            policy.clone(),
            access_log,
            metrics,
        )
        .with_shared_kv(shared_kv)
        .with_shard(shard.clone());
        let (source, hup) = reload_source.unzip();
        let limits = crate::listeners::limits(&cfg.server);
        let (listener_limits, limits) = tokio::sync::watch::channel(Arc::new(limits));
        let reloader = Arc::new(
            Reloader::new(pipeline, policy, source)
                .with_admin(admin.clone())
                .with_tls(tls)
                .with_listener_limits(listener_limits),
        );
        // Other nodes' purges this one missed are applied before it serves,
        // and the admin API's purges are published from the first.
        let fanout = match &cluster {
            Some(c) => Some(cluster::start_fanout(c, &reloader).await?),
            None => None,
        };
        wire_admin(&admin, &reloader);
        // The cluster's current policy version applies before the node serves.
        cluster::start_rollout(cluster.as_ref(), &reloader, &admin).await;
        // The cache is open (the admin API asks the reloader for it).
        admin.readiness().set_ready();
        let on_hup = hup.map(|hup| tokio::spawn(reload_on_sighup(Arc::clone(&reloader), hup)));
        // Not ready from the signal on, before the drain: load balancers stop sending.
        let shutdown = async {
            shutdown.await;
            admin.readiness().set_stopping();
            if let Some(shard) = &shard {
                shard.leave().await;
            }
        };
        let generations = reloader.generations();
        crate::listeners::serve(listeners, quic, generations, limits, connections, shutdown).await;
        if let Some(task) = on_hup {
            task.abort();
        }
        if let Some(fanout) = fanout {
            fanout.stop(std::time::Duration::from_secs(5)).await;
        }
        if let Some(cluster) = &cluster {
            // What this node published (purges, bans) reaches NATS before it exits.
            if let Err(e) = cluster.client().flush().await {
                error!(error = %e, "cluster: flushing the NATS connection at shutdown failed");
            }
        }
        let last = reloader.current();
        flush_access_log(last.access_log().clone()).await;
        if let Some(policy) = last.policy() {
            log_replay_stats(policy);
        }
        // sled fsyncs periodically: flush so a clean stop loses nothing.
        match last.cache().store().flush().await {
            Ok(()) => info!("cache flushed"),
            Err(e) => error!(error = %e, "flushing the cache at shutdown failed"),
        }
        Ok(())
    }
}

/// The admin API's state: its token and the hooks this crate fills itself.
fn admin_of(settings: &Resolved, policy: Option<&Arc<PolicySlot>>) -> Admin {
    let config = Arc::clone(&settings.config);
    let policy = policy.cloned();
    Admin::new(
        settings.admin_token.clone(),
        AdminHooks {
            config: Some(Arc::new(move || config.clone())),
            policy: policy.map(|slot| -> PolicyHook { Arc::new(move || Some(slot.current())) }),
            ..AdminHooks::default()
        },
    )
}

/// Point the admin API at the running proxy: the current generation's
/// config, policy and cache (purges, stats and bans follow a reload that
/// moves `cache.dir`), and reloads.
fn wire_admin(admin: &Admin, reloader: &Arc<Reloader>) {
    let config = Arc::clone(reloader);
    let policy = Arc::clone(reloader);
    let reload = Arc::clone(reloader);
    let metrics = Arc::clone(reloader);
    let (bans, cache) = (Arc::clone(reloader), Arc::clone(reloader));
    let invalidator = Arc::clone(reloader.current().invalidator());
    let backends = Arc::clone(reloader);
    admin.set_hooks(|h| {
        h.cache = Some(Arc::new(move || cache.current().cache().clone()));
        h.config = Some(Arc::new(move || config.current_config()));
        h.policy = Some(Arc::new(move || policy.current().policy().cloned()));
        h.backends = Some(Arc::new(move || {
            backends.current().backends().health_json()
        }));
        h.reload = Some(Arc::new(move || {
            let reload = Arc::clone(&reload);
            Box::pin(async move {
                let report = reload.reload().await?;
                serde_json::to_value(report).map_err(|e| vec![e.to_string()])
            })
        }));
        h.invalidator = Some(invalidator);
        h.bans = Some(Arc::new(move || {
            let current = bans.current();
            let cache = current.cache();
            serde_json::json!({ "bans": cache.bans(), "counts": cache.ban_counts() })
        }));
        h.metrics = Some(Arc::new(move || {
            // The generation serving now: its store and policy figures.
            let current = metrics.current();
            Box::pin(async move { current.metrics().render().await })
        }));
    });
}

/// Write out the access-log lines still queued, and say if any were lost.
async fn flush_access_log(log: AccessLog) {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
    let queue = log.clone();
    let flushed = tokio::task::spawn_blocking(move || queue.flush(WITHIN)).await;
    if !matches!(flushed, Ok(true)) {
        error!("the access log writer did not finish within {WITHIN:?}; its last lines are lost");
    }
    if log.dropped() > 0 {
        tracing::warn!(
            dropped = log.dropped(),
            "access log lines were dropped while serving"
        );
    }
}

/// SIGHUP reads the config again and applies it as a new generation: new
/// requests get it, requests in flight finish on the old one; a file that
/// is not valid (or whose policy does not load) changes nothing.
async fn reload_on_sighup(reloader: Arc<Reloader>, mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        info!("SIGHUP: reloading the config");
        // Success and refusal are both logged by the reloader.
        let _ = reloader.reload().await;
    }
}

/// Open the object store: memory only, or memory in front of sled on disk.
fn open_store(cfg: &Config) -> anyhow::Result<CacheStore> {
    let store = match TieredStore::open(cfg.cache.store_config()) {
        Ok(store) => store,
        // The system refused the directory (permissions, file descriptors,
        // a file in the way): the operator must fix it; the store left the
        // data as it was.
        Err(e @ StoreError::Open { .. }) => {
            return Err(e).context("opening the persistent cache (cache.dir)");
        }
        // A corrupt database is moved aside by the store itself; what is left
        // (a full disk, a directory another process holds) must not stop the
        // server: serve with a memory-only cache and say so loudly.
        Err(e) if cfg.cache.dir.is_some() => {
            error!(error = %e, "cannot open the persistent cache; serving with a memory-only cache");
            TieredStore::open(StoreConfig::memory_only(cfg.cache.memory_size))
                .context("opening a memory-only cache")?
        }
        Err(e) => return Err(e).context("opening the cache"),
    };
    match &cfg.cache.dir {
        Some(d) => info!(dir = %d.display(), "persistent cache open"),
        None => info!("memory-only cache (no cache.dir / --cache-dir)"),
    }
    Ok(CacheStore::from_tiered(Arc::new(store)))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
}
