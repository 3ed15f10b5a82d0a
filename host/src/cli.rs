//! The `inlay` command line: varnishd-style quick flags over a TOML file.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;
use tracing::{error, info};

use inlay_storage::{ObjectStore, StoreConfig, TieredStore};

use crate::access_log::AccessLog;
use crate::cache::HttpCache;
use crate::config::{Config, Overrides};
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
        Command::Serve(args) => {
            let cfg = match args.load_config() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("inlay: {e:#}");
                    return std::process::ExitCode::from(2);
                }
            };
            init_tracing(&cfg.log.level);
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

/// Bind, serve until SIGTERM/SIGINT, drain.
pub async fn serve(cfg: Config) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let access_log = AccessLog::open(&cfg.log).context("opening the access log")?;
    let mut listeners = Vec::new();
    for addr in &cfg.server.listen {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        // Tests and scripts read this line to learn the port of `-a 127.0.0.1:0`.
        info!("listening on http://{}", l.local_addr()?);
        listeners.push(l);
    }
    let store = open_store(&cfg)?;
    let pipeline = Arc::new(Pipeline::new(
        cfg.clone(),
        HttpCache::new(store),
        access_log,
    ));
    crate::server::run(listeners, pipeline, cfg.server.clone(), shutdown_signal()).await;
    Ok(())
}

/// Open the object store: memory only, or memory in front of sled on disk.
fn open_store(cfg: &Config) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let mut sc = match &cfg.cache.dir {
        Some(dir) => StoreConfig::on_disk(dir),
        None => StoreConfig::memory_only(cfg.cache.memory_size),
    };
    sc.memory_bytes = cfg.cache.memory_size;
    sc.disk_bytes = cfg.cache.disk_size;
    let store = TieredStore::open(sc).context("opening the cache")?;
    match &cfg.cache.dir {
        Some(d) => info!(dir = %d.display(), "persistent cache open"),
        None => info!("memory-only cache (no cache.dir / --cache-dir)"),
    }
    Ok(Arc::new(store))
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
