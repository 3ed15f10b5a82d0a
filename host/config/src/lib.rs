//! The typed host configuration: read from TOML, validated at start-up.
//!
//! One file per section (`server.rs`, `backends.rs`, `log.rs`, `cache.rs`,
//! `compression.rs`, `esi.rs`, `policy.rs`, `admin.rs`, `cluster.rs`, `websocket.rs`), each the section's
//! types and the code that reads them; `read.rs` is the reader they share,
//! `overrides.rs` the quick flags. Parsing walks the TOML tree by hand
//! instead of using serde derive so that *every* error is reported at once,
//! each with its key path and the value that was wrong (serde stops at the
//! first). A section's known keys are the keys its code reads (the reader
//! notes each one), so an unknown key is reported without a second list to
//! keep in step. Every setting and its default is listed in
//! `host/config/CONFIG.md`; a test checks that each one listed there is read.

mod admin;
mod backends;
mod cache;
mod cluster;
mod component;
mod compression;
mod esi;
mod log;
mod overrides;
mod policy;
mod read;
mod server;
mod websocket;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use admin::{AdminAccess, MetricsConfig};
pub use backends::{
    BackendConfig, DirectorConfig, DirectorKind, DirectorMember, ProbeConfig, TlsSettings,
};
pub use cache::{CacheConfig, STRIP_REQUEST_HEADERS};
pub use cluster::{
    ClusterAuth, ClusterConfig, ClusterKv, ClusterTls, InvalidationConfig, ShardConfig,
};
pub use component::ComponentConfig;
pub use compression::CompressionConfig;
pub use esi::EsiConfig;
pub use log::{AccessLogFormat, AccessLogTarget, LogConfig};
pub use overrides::Overrides;
pub use policy::PolicyConfig;
pub use read::{IpNet, parse_size};
pub use server::{REQUEST_ID_RESERVED, ServerConfig, TlsCertConfig};
pub use websocket::WebSocketConfig;

pub use admin::unguarded_admin;
use read::{Reader, Table};

/// The configuration embedded in the binary, used when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../default.toml");

/// The whole host configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[server]`: listeners and client-side limits.
    pub server: ServerConfig,
    /// `[backends.NAME]`: the origins requests and includes may go to.
    pub backends: BTreeMap<String, BackendConfig>,
    /// Name of the backend used when the policy does not choose one.
    pub default_backend: String,
    /// `[directors.NAME]`: groups of backends, picked by name as a backend is.
    pub directors: BTreeMap<String, DirectorConfig>,
    /// `[log]`: logging and the access log.
    pub log: LogConfig,
    /// `[cache]`: the object store and caching defaults.
    pub cache: CacheConfig,
    /// `[compression]`: compression at the edge.
    pub compression: CompressionConfig,
    /// `[esi]`: Edge Side Includes limits.
    pub esi: EsiConfig,
    /// `[policy]`: the WebAssembly policy, if any.
    pub policy: Option<PolicyConfig>,
    /// `[admin]`: the admin listener, if any.
    pub admin: Option<SocketAddr>,
    /// `[admin] token_file`: the file holding the admin API's bearer token;
    /// without it the admin API asks for none (loopback only).
    pub admin_token_file: Option<PathBuf>,
    /// `[admin] allowed_origins` and `allowed_hosts`: the browsers' requests
    /// the admin API serves.
    pub admin_access: AdminAccess,
    /// `[metrics]`: the Prometheus counters.
    pub metrics: MetricsConfig,
    /// `[cluster]`: the NATS cluster this node joins, if any.
    pub cluster: Option<ClusterConfig>,
    /// `[websocket]`: upgrades tunnelled to the backend, and their bounds.
    pub websocket: WebSocketConfig,
}

/// One thing wrong with a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `backends.api.connect_timeout`.
    pub path: String,
    /// What is wrong, including the offending value.
    pub message: String,
}

/// A configuration that could not be used: every problem found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    /// The TOML is valid but some settings are wrong.
    #[error("{}", format_issues(.0))]
    Invalid(Vec<ConfigIssue>),
}

fn format_issues(issues: &[ConfigIssue]) -> String {
    let mut out = format!("{} error(s) in config:", issues.len());
    for i in issues {
        out.push_str(&format!("\n  {}: {}", i.path, i.message));
    }
    out
}

/// Where the config comes from: a file (or, without one, the embedded
/// default) and the quick flags over it. Read at start and again at every
/// reload.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// The TOML file; `None`: the embedded default.
    pub file: Option<PathBuf>,
    /// The command line's quick flags.
    pub overrides: Overrides,
}

impl ConfigSource {
    /// Read the file (or take the embedded default) and apply the flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.file {
            Some(p) => Config::from_file(p)?,
            None => Config::embedded_default(),
        };
        cfg.apply_overrides(&self.overrides)?;
        Ok(cfg)
    }
}

impl Config {
    /// Read and validate a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// The embedded default configuration.
    pub fn embedded_default() -> Self {
        // A unit test proves the embedded file is valid.
        Self::from_toml(EMBEDDED_DEFAULT).expect("embedded default config is valid")
    }

    /// Parse and validate TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        let mut r = Reader::default();
        let cfg = r.config(&table);
        if r.issues.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid(r.issues))
        }
    }

    /// What the cache is configured with: `[cache]`, and `[compression]`
    /// for the codings a fill stores.
    pub fn cache_rules(&self) -> inlay_cache::CacheRules {
        inlay_cache::CacheRules {
            compression: self.compression.rules(),
            ..self.cache.rules()
        }
    }

    /// The backend a request goes to when the policy chose none (when
    /// `default_backend` names a director, its first backend).
    pub fn default_backend(&self) -> &BackendConfig {
        // Validation guarantees the default backend (or director) exists.
        let name = match self.directors.get(&self.default_backend) {
            Some(d) => &d.backends[0].backend,
            None => &self.default_backend,
        };
        &self.backends[name]
    }
}

impl Reader {
    /// The whole file: each section read by its own file, then the checks
    /// that span sections.
    fn config(&mut self, root: &Table) -> Config {
        let empty = Table::new();
        let section = |r: &mut Self, key: &str| r.table(root, "", key).unwrap_or(&empty);
        let t = section(self, "server");
        let server = self.server(t);
        let (backends, default_backend, directors) = self.backends(root);
        let t = section(self, "log");
        let log = self.log(t);
        let t = section(self, "cache");
        let cache = self.cache(t);
        let t = section(self, "compression");
        let compression = self.compression(t);
        let t = section(self, "esi");
        let esi = self.esi(t);
        let policy = self.table(root, "", "policy").and_then(|t| self.policy(t));
        let (admin, admin_token_file, admin_access) = self.admin(root);
        let t = section(self, "metrics");
        let metrics = self.metrics(t);
        let cluster = self
            .table(root, "", "cluster")
            .and_then(|t| self.cluster(t));
        self.cluster_advertised(cluster.as_ref(), &server.listen);
        let t = section(self, "websocket");
        let websocket = self.websocket(t);
        self.unknown_keys(root, "");
        Config {
            server,
            backends,
            default_backend,
            directors,
            log,
            cache,
            compression,
            esi,
            policy,
            admin,
            admin_token_file,
            admin_access,
            metrics,
            cluster,
            websocket,
        }
    }
}

#[cfg(test)]
mod tests;
