//! The `inlay` command line: varnishd-style quick flags over a TOML file.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use inlay_cache::{CacheStore, HttpCache};
use inlay_runtime::{PolicyEngine, PolicyLimits, PolicySlot, PolicySource};
use inlay_storage::{StoreConfig, StoreError, TieredStore};
use tracing::{error, info, warn};

use crate::access_log::AccessLog;
use crate::admin::{Admin, AdminHooks, AdminServer, AdminToken, PolicyHook};
use crate::cluster::Cluster;
use crate::config::{Config, Overrides, PolicyConfig};
use crate::listeners::{Listener, Tls};
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::reload::{Reloader, log_replay_stats};

/// Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
#[derive(Debug, Parser)]
#[command(name = "inlay", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTP in front of the configured backends.
    Serve(ServeArgs),
    /// Validate a configuration file and exit (0 when valid).
    Check {
        /// The TOML file to check.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the embedded default configuration.
    DefaultConfig,
    /// Ask a running inlay's admin API (stats, purge, ban, reload, ...).
    Admin(crate::admin::client::AdminArgs),
    /// Write the man pages into DIR (the Debian package's build step).
    #[command(hide = true)]
    Manpages {
        /// An existing directory.
        dir: PathBuf,
    },
}

/// Flags of `inlay serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Listen address (repeatable), e.g. `-a 127.0.0.1:6081` or `-a :6081`;
    /// `-a https://:6443` listens for TLS (with `--tls-cert`/`--tls-key` or
    /// `[[server.tls]]`).
    #[arg(short = 'a', long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// The default backend, e.g. `-b http://127.0.0.1:8080` (or `https://` for TLS, verified against the system roots).
    #[arg(short = 'b', long = "backend", value_name = "URL")]
    pub backend: Option<String>,
    /// TOML configuration file; the embedded default is used without it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Policy component (`.wasm`).
    #[arg(long, value_name = "FILE.wasm")]
    pub policy: Option<PathBuf>,
    /// Directory of the persistent cache tier.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Admin API listen address.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// The TLS listeners' certificate chain (PEM), for every name: replaces
    /// `[[server.tls]]`. Needs `--tls-key`.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ServeArgs {
    /// Load the config (file or embedded) and apply the quick flags.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut cfg = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::embedded_default(),
        };
        cfg.apply_overrides(&self.overrides())?;
        Ok(cfg)
    }

    /// The quick flags, as overrides of the file (applied again at every reload).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            backend: self.backend.clone(),
            policy: self.policy.clone(),
            no_policy: false,
            cache_dir: self.cache_dir.clone(),
            admin: self.admin.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
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

/// Entry point of the binary: parse flags, run, map errors to exit codes.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match Config::from_file(&config) {
            Ok(cfg) => match cfg.admin_token_file.as_deref().map(AdminToken::read) {
                Some(Err(e)) => {
                    eprintln!("{}: {e:#}", config.display());
                    std::process::ExitCode::from(2)
                }
                // The TLS certificates and keys are read as a start would.
                _ => match crate::listeners::load_certificates(&cfg.server.tls) {
                    Err(errors) => {
                        for e in errors {
                            eprintln!("{}: {e}", config.display());
                        }
                        std::process::ExitCode::from(2)
                    }
                    Ok(_) => {
                        println!("{}: ok", config.display());
                        std::process::ExitCode::SUCCESS
                    }
                },
            },
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                std::process::ExitCode::from(2)
            }
        },
        Command::DefaultConfig => {
            print!("{}", crate::config::EMBEDDED_DEFAULT);
            std::process::ExitCode::SUCCESS
        }
        Command::Admin(args) => crate::admin::client::main(args),
        Command::Manpages { dir } => match crate::manpage::write_manpages(&dir) {
            Ok(_) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "inlay: cannot write the man pages into {}: {e}",
                    dir.display()
                );
                std::process::ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            let cfg = match args.load_config() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("inlay: {e:#}");
                    return std::process::ExitCode::from(2);
                }
            };
            init_tracing(&cfg.log.level);
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
            match rt.block_on(serve(cfg, args)) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e:#}");
                    eprintln!("inlay: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

/// Libraries whose warnings a client triggers at will, kept at error level
/// unless `log.level` names them: h2 warns once per connection that resets
/// too many streams (rapid reset), and an attacker reconnects at will;
/// rustls warns per handshake about what a client sent (an IP address as
/// SNI, as wrk does). The filter (`log.level` or `INLAY_LOG`) keeps them
/// when it names them. Inlay's own line for such a connection is
/// rate-limited (inlay-listener).
const QUIET_LIBRARIES: &[(&str, &str)] = &[("h2", "h2=error"), ("rustls", "rustls=error")];

/// `log.level` (or `INLAY_LOG`) with [`QUIET_LIBRARIES`] added where it does not set them.
fn log_directives(level: &str) -> String {
    let mut directives = level.to_string();
    for (target, directive) in QUIET_LIBRARIES {
        let named = level
            .split(',')
            .any(|d| d.trim().split(['=', '[']).next() == Some(*target));
        if !named {
            directives.push(',');
            directives.push_str(directive);
        }
    }
    directives
}

/// The diagnostic log's filter, replaceable by a reload (`log.level`).
type LogFilter =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set by [`init_tracing`]; `None` inside: `INLAY_LOG` chose the filter.
static LOG_FILTER: std::sync::OnceLock<Option<LogFilter>> = std::sync::OnceLock::new();

fn init_tracing(level: &str) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // INLAY_LOG, when set and valid, replaces `log.level`.
    let from_env = std::env::var("INLAY_LOG")
        .ok()
        .and_then(|env| EnvFilter::try_new(log_directives(&env)).ok());
    let (filter, from_env) = match from_env {
        Some(f) => (f, true),
        None => (
            EnvFilter::try_new(log_directives(level)).unwrap_or_else(|_| EnvFilter::new("info")),
            false,
        ),
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init()
        .is_ok();
    if installed {
        let _ = LOG_FILTER.set((!from_env).then_some(handle));
    }
}

/// Apply a new `log.level` to the diagnostic log; `Err` says why it was
/// not (`INLAY_LOG` is set, or no log of ours is installed).
pub fn set_log_level(level: &str) -> Result<(), String> {
    match LOG_FILTER.get() {
        Some(Some(handle)) => {
            let filter = tracing_subscriber::EnvFilter::try_new(log_directives(level))
                .map_err(|e| format!("log.level: {e}"))?;
            handle
                .reload(filter)
                .map_err(|e| format!("log.level: cannot apply it: {e}"))
        }
        Some(None) => Err("log.level changed: INLAY_LOG is set and chooses the filter".into()),
        None => Err("log.level changed: the diagnostic log is not inlay's own".into()),
    }
}

/// Bind, serve until SIGTERM/SIGINT, drain; SIGHUP reloads the config
/// (the file and flags of `args`) as a new generation.
pub async fn serve(cfg: Config, args: ServeArgs) -> anyhow::Result<()> {
    // The policy is compiled before we listen: a bad one stops start-up here.
    let proxy = Proxy::load(cfg).await?.reloading(args)?;
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

/// Serve `listeners` until `shutdown` resolves, then drain and flush: what
/// `inlay serve` does once it has bound its addresses, without signals.
/// `cfg.server.listen` is not read; the listeners are the caller's.
pub async fn run(
    cfg: Config,
    listeners: impl IntoIterator<Item = impl Into<Listener>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    Proxy::load(cfg).await?.run(listeners, shutdown).await
}

/// The proxy before it serves: the access log open and the policy loaded,
/// so that a bad policy stops start-up before anything listens.
#[derive(Debug)]
pub struct Proxy {
    cfg: Arc<Config>,
    access_log: AccessLog,
    policy: Option<Arc<PolicySlot>>,
    admin: Admin,
    /// The command line SIGHUP reads again, and the SIGHUP stream
    /// (installed before anything listens); `None`: no SIGHUP handler.
    reload_source: Option<(ServeArgs, tokio::signal::unix::Signal)>,
    metrics: Arc<Metrics>,
    /// The TLS listeners' certificates (none without `[[server.tls]]`).
    tls: Arc<Tls>,
    /// The NATS connection of `[cluster]`, made before anything listens.
    cluster: Option<Cluster>,
}

impl Proxy {
    /// Open the access log and load the configured policy.
    pub async fn load(cfg: Config) -> anyhow::Result<Self> {
        let cfg = Arc::new(cfg);
        let access_log = AccessLog::open(&cfg.log).context("opening the access log")?;
        let policy = load_policy(&cfg).await?;
        let admin = admin_of(&cfg, policy.as_ref())?;
        let metrics = Metrics::new(cfg.metrics.enabled);
        // A certificate or key that does not load stops start-up here.
        let tls = crate::listeners::tls(&cfg.server.tls).map_err(|errors| {
            anyhow::anyhow!("TLS certificates do not load:\n  {}", errors.join("\n  "))
        })?;
        // A node that cannot reach its cluster does not serve: it would
        // miss the purges of the others.
        let cluster = match &cfg.cluster {
            Some(c) => {
                let cluster = Cluster::connect(c).await?;
                info!(node = %c.node_name, servers = %c.nats_urls.join(", "), "cluster: joined");
                Some(cluster)
            }
            None => None,
        };
        Ok(Self {
            cfg,
            access_log,
            policy,
            admin,
            reload_source: None,
            metrics,
            tls: Arc::new(tls),
            cluster,
        })
    }

    /// What the admin API serves: its readiness turns ready once [`run`](Self::run)
    /// has opened the cache, and stopping when its `shutdown` resolves.
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    /// Reload on SIGHUP: read `args`' config file and flags again.
    pub fn reloading(mut self, args: ServeArgs) -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        self.reload_source = Some((args, hup));
        Ok(self)
    }

    /// The configuration it serves with.
    pub fn config(&self) -> &Config {
        &self.cfg
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
            cfg,
            access_log,
            policy,
            admin,
            reload_source,
            metrics,
            tls,
            cluster,
        } = self;
        let store = open_store(&cfg)?;
        let shared_kv = crate::cluster::kv::open_if_configured(cluster.as_ref()).await?;
        let listeners: Vec<Listener> = listeners.into_iter().map(Into::into).collect();
        let listening = listeners.iter().find(|l| !l.is_tls());
        let listening = listening.and_then(|l| l.local_addr().ok());
        let shard = crate::cluster::shard::start(cluster.as_ref(), listening).await?;
        let connections = metrics.connections().clone();
        let pipeline = Pipeline::with_metrics(
            cfg.clone(),
            HttpCache::new(store, cfg.cache.rules()),
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
            Some(c) => Some(crate::cluster::fanout::Fanout::start_for(c, &reloader).await?),
            None => None,
        };
        wire_admin(&admin, &reloader);
        // The cluster's current policy version applies before the node serves.
        let rollout = crate::cluster::rollout::start(cluster.as_ref(), &reloader).await;
        crate::cluster::rollout::wire_admin(&admin, rollout);
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
        crate::listeners::serve(listeners, generations, limits, connections, shutdown).await;
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

/// The admin API's state: its token (read now, so that a bad token file
/// stops start-up) and the hooks this crate fills itself.
fn admin_of(cfg: &Arc<Config>, policy: Option<&Arc<PolicySlot>>) -> anyhow::Result<Admin> {
    let token = crate::reload::admin_token(cfg).map_err(|e| anyhow::anyhow!(e.join("\n")))?;
    let config = cfg.clone();
    let policy = policy.cloned();
    Ok(Admin::new(
        token,
        AdminHooks {
            config: Some(Arc::new(move || config.clone())),
            policy: policy.map(|slot| -> PolicyHook { Arc::new(move || Some(slot.current())) }),
            ..AdminHooks::default()
        },
    ))
}

/// Point the admin API at the running proxy: the current generation's
/// config, policy and cache (purges, stats and bans follow a reload that
/// moves `cache.dir`), and reloads.
fn wire_admin(admin: &Admin, reloader: &Arc<Reloader>) {
    let config = Arc::clone(reloader);
    let policy = Arc::clone(reloader);
    let reload = Arc::clone(reloader);
    let metrics = Arc::clone(reloader);
    let (ban, bans, cache) = (
        Arc::clone(reloader),
        Arc::clone(reloader),
        Arc::clone(reloader),
    );
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
        h.ban = Some(Arc::new(move |expression: String| {
            let reloader = Arc::clone(&ban);
            Box::pin(async move {
                let info = reloader.ban(&expression).await.map_err(|e| e.to_string())?;
                Ok(serde_json::json!({ "ban": info }))
            })
        }));
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

/// What the runtime needs to load the configured policy.
pub fn policy_source(pc: &PolicyConfig) -> PolicySource {
    PolicySource {
        path: pc.path.clone(),
        config: pc.config.clone(),
        limits: PolicyLimits {
            cpu_time_ms: pc.cpu_time.as_millis().max(1) as u64,
            memory: pc.memory,
            max_host_calls: pc.max_host_calls,
            max_subrequests: pc.max_subrequests,
            max_subrequest_bytes: pc.max_subrequest_bytes,
            max_instances: pc.max_instances,
            instance_wait_ms: u64::try_from(pc.instance_wait.as_millis()).unwrap_or(u64::MAX),
            host_wait_ms: u64::try_from(pc.host_wait.as_millis()).unwrap_or(u64::MAX),
            ..PolicyLimits::default()
        },
        prewarm: pc.prewarm,
        pre_instantiate: pc.pre_instantiate,
        memo_bytes: usize::try_from(pc.memo_size).unwrap_or(usize::MAX),
        name: pc
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "policy".into()),
    }
}

pub(crate) async fn load_policy(cfg: &Config) -> anyhow::Result<Option<Arc<PolicySlot>>> {
    let Some(pc) = &cfg.policy else {
        info!("no policy: built-in rules (as Varnish's built-in VCL)");
        return Ok(None);
    };
    let source = policy_source(pc);
    let engine = PolicyEngine::new(&source.limits)
        .with_context(|| format!("cannot set up the policy runtime for {}", pc.path.display()))?;
    let slot = PolicySlot::load(&engine, source)
        .await
        .with_context(|| format!("cannot load policy {}", pc.path.display()))?;
    Ok(Some(Arc::new(slot)))
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

/// The store `cfg.cache` describes (its directory and sizes).
pub(crate) fn store_config(cfg: &Config) -> StoreConfig {
    let mut sc = match &cfg.cache.dir {
        Some(dir) => StoreConfig::on_disk(dir),
        None => StoreConfig::memory_only(cfg.cache.memory_size),
    };
    sc.memory_bytes = cfg.cache.memory_size;
    sc.disk_bytes = cfg.cache.disk_size;
    if let Some(bytes) = cfg.cache.disk_index_cache {
        sc.disk_cache_bytes = bytes;
    }
    sc
}

/// Open the object store: memory only, or memory in front of sled on disk.
fn open_store(cfg: &Config) -> anyhow::Result<CacheStore> {
    let store = match TieredStore::open(store_config(cfg)) {
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

#[cfg(test)]
mod tests {
    use super::log_directives;

    #[test]
    fn client_triggered_library_warnings_are_quiet_unless_the_level_names_the_library() {
        assert_eq!(log_directives("info"), "info,h2=error,rustls=error");
        assert_eq!(
            log_directives("warn,inlay=debug"),
            "warn,inlay=debug,h2=error,rustls=error"
        );
        // An operator who asks for h2's lines gets them.
        assert_eq!(
            log_directives("info,h2=debug"),
            "info,h2=debug,rustls=error"
        );
        assert_eq!(
            log_directives("h2[conn]=trace,rustls=warn"),
            "h2[conn]=trace,rustls=warn"
        );
        // A target that only starts with "h2" does not count.
        assert_eq!(log_directives("h2x=info"), "h2x=info,h2=error,rustls=error");
    }
}
