//! The `inlay` command line: varnishd-style quick flags over a TOML file.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use inlay_cache::{CacheStore, HttpCache};
use inlay_runtime::{LoadedPolicy, PolicyEngine, PolicyLimits, PolicySlot, PolicySource};
use inlay_storage::{StoreConfig, StoreError, TieredStore};
use tokio::net::TcpListener;
use tracing::{error, info};

use crate::access_log::AccessLog;
use crate::config::{Config, Overrides, PolicyConfig};
use crate::pipeline::Pipeline;

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
    /// Listen address (repeatable), e.g. `-a 127.0.0.1:6081` or `-a :6081`.
    #[arg(short = 'a', long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// The default backend, e.g. `-b http://127.0.0.1:8080`.
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
}

impl ServeArgs {
    /// Load the config (file or embedded) and apply the quick flags.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut cfg = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::embedded_default(),
        };
        cfg.apply_overrides(&Overrides {
            listen: self.listen.clone(),
            backend: self.backend.clone(),
            policy: self.policy.clone(),
            no_policy: false,
            cache_dir: self.cache_dir.clone(),
            admin: self.admin.clone(),
        })?;
        Ok(cfg)
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
            Ok(_) => {
                println!("{}: ok", config.display());
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                std::process::ExitCode::from(2)
            }
        },
        Command::DefaultConfig => {
            print!("{}", crate::config::EMBEDDED_DEFAULT);
            std::process::ExitCode::SUCCESS
        }
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
            match rt.block_on(serve(cfg)) {
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

fn init_tracing(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INLAY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Bind, serve until SIGTERM/SIGINT, drain; SIGHUP reloads the policy.
pub async fn serve(cfg: Config) -> anyhow::Result<()> {
    // The policy is compiled before we listen: a bad one stops start-up here.
    let proxy = Proxy::load(cfg).await?;
    let mut listeners = Vec::new();
    for addr in &proxy.config().server.listen {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        // Tests and scripts read this line to learn the port of `-a 127.0.0.1:0`.
        info!("listening on http://{}", l.local_addr()?);
        listeners.push(l);
    }
    if let (Some(slot), Some(pc)) = (proxy.policy().cloned(), proxy.config().policy.clone()) {
        tokio::spawn(reload_on_sighup(slot, pc));
    }
    proxy.run(listeners, shutdown_signal()).await
}

/// Serve `listeners` until `shutdown` resolves, then drain and flush: what
/// `inlay serve` does once it has bound its addresses, without signals.
/// `cfg.server.listen` is not read; the listeners are the caller's.
pub async fn run(
    cfg: Config,
    listeners: Vec<TcpListener>,
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
}

impl Proxy {
    /// Open the access log and load the configured policy.
    pub async fn load(cfg: Config) -> anyhow::Result<Self> {
        let cfg = Arc::new(cfg);
        let access_log = AccessLog::open(&cfg.log).context("opening the access log")?;
        let policy = load_policy(&cfg).await?;
        if cfg.admin.is_some() {
            tracing::warn!("admin.listen is reserved: the admin API is not built yet; ignoring it");
        }
        Ok(Self {
            cfg,
            access_log,
            policy,
        })
    }

    /// The configuration it serves with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The policy slot (reloaded in place by SIGHUP), if a policy is configured.
    pub fn policy(&self) -> Option<&Arc<PolicySlot>> {
        self.policy.as_ref()
    }

    /// Open the cache and serve `listeners` until `shutdown` resolves; then
    /// drain in-flight requests, write out the access log and flush the cache.
    pub async fn run(
        self,
        listeners: Vec<TcpListener>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Self {
            cfg,
            access_log,
            policy,
        } = self;
        let store = open_store(&cfg)?;
        let pipeline = Arc::new(Pipeline::new(
            cfg.clone(),
            HttpCache::new(store, cfg.cache.rules()),
            policy.clone(),
            access_log.clone(),
        ));
        let cache = pipeline.cache().clone();
        crate::server::run(listeners, pipeline, cfg.server.clone(), shutdown).await;
        flush_access_log(access_log).await;
        if let Some(slot) = &policy {
            log_replay_stats(&slot.current());
        }
        // sled fsyncs periodically: flush so a clean stop loses nothing.
        match cache.store().flush().await {
            Ok(()) => info!("cache flushed"),
            Err(e) => error!(error = %e, "flushing the cache at shutdown failed"),
        }
        Ok(())
    }
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

/// How a policy generation's hooks were answered: from recorded paths
/// (`replayed`) or by instances (`live`).
fn log_replay_stats(policy: &LoadedPolicy) {
    if let Some(stats) = policy.memo_stats() {
        info!(
            policy = %policy.name(),
            generation = policy.generation(),
            replayed = stats.replayed,
            live = stats.live,
            resets = stats.resets,
            bytes = stats.bytes,
            "policy hooks replayed from recorded paths"
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

async fn load_policy(cfg: &Config) -> anyhow::Result<Option<Arc<PolicySlot>>> {
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

/// SIGHUP loads the policy file again: new requests get the new policy,
/// requests in flight finish on the old one; a file that does not load is
/// refused and the old policy stays.
async fn reload_on_sighup(slot: Arc<PolicySlot>, pc: PolicyConfig) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        error!("cannot install the SIGHUP handler: policy reload is unavailable");
        return;
    };
    while hup.recv().await.is_some() {
        info!(path = %pc.path.display(), "SIGHUP: reloading the policy");
        let outgoing = slot.current();
        // Success and refusal are both logged by the slot.
        if slot.reload(policy_source(&pc)).await.is_ok() {
            log_replay_stats(&outgoing);
        }
    }
}

/// Open the object store: memory only, or memory in front of sled on disk.
fn open_store(cfg: &Config) -> anyhow::Result<CacheStore> {
    let mut sc = match &cfg.cache.dir {
        Some(dir) => StoreConfig::on_disk(dir),
        None => StoreConfig::memory_only(cfg.cache.memory_size),
    };
    sc.memory_bytes = cfg.cache.memory_size;
    sc.disk_bytes = cfg.cache.disk_size;
    let store = match TieredStore::open(sc) {
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
    Ok(CacheStore::from_store(Arc::new(store)))
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
