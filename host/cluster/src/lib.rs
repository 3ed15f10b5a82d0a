//! One cache fabric over NATS with JetStream (`[cluster]`): the connection
//! every cluster feature shares, and the names it uses.
//!
//! Without `[cluster]` none of this runs. With it, a node connects to its
//! NATS servers before it serves (a node that cannot reach any of them does
//! not start: it would serve objects other nodes purged), and keeps
//! reconnecting in the background if the connection drops later.
//!
//! Every subject starts with `subject_prefix` and every stream, KV bucket
//! and object store name with its upper-case form, so several clusters can
//! share NATS servers.
//!
//! The parts, each started by the host once it has what it needs:
//!
//! - [`fanout`]: the cache's [`InvalidationSink`](inlay_cache::InvalidationSink):
//!   purges and bans published to the others and theirs applied here,
//!   through [`fanout::FanoutHost`];
//! - [`kv`]: the policies' kv shared by the cluster;
//! - [`rollout`]: policy versions pushed to every node, swapped in through
//!   [`rollout::PolicySwap`];
//! - [`shard`]: each key's owner node, the upstream a miss goes to;
//! - [`ClusterMetrics`]: what all of them count, a collector the host
//!   registers for `GET /metrics`.
//!
//! This crate imports nothing of the `inlay` crate: the host implements the
//! traits above and reads [`config`]'s types from its config file.

pub mod config;
pub mod fanout;
pub mod kv;
mod metrics;
pub mod rollout;
pub mod shard;

use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream;
use tracing::{info, warn};

pub use config::{
    ClusterAuth, ClusterConfig, ClusterKv, ClusterTls, InvalidationConfig, ShardConfig,
};
pub use metrics::ClusterMetrics;

/// This node's connection to the cluster.
#[derive(Clone)]
pub struct Cluster {
    client: async_nats::Client,
    js: jetstream::Context,
    cfg: Arc<ClusterConfig>,
    /// Sharding by key, once it runs (`shard = true`).
    shard: Arc<std::sync::OnceLock<Arc<shard::Shard>>>,
    metrics: Arc<ClusterMetrics>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.cfg.node_name)
            .field("prefix", &self.cfg.subject_prefix)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connect to the configured NATS servers: one attempt per server
    /// within `connect_timeout` each; an error names the servers tried.
    /// What the cluster's parts count goes to `metrics`.
    pub async fn connect(
        cfg: &ClusterConfig,
        metrics: Arc<ClusterMetrics>,
    ) -> anyhow::Result<Self> {
        let mut options = match &cfg.auth {
            ClusterAuth::None => async_nats::ConnectOptions::new(),
            ClusterAuth::Token(path) => {
                let token = read_secret(path, "cluster.token_file")?;
                async_nats::ConnectOptions::with_token(token)
            }
            ClusterAuth::NKey(path) => {
                let seed = read_secret(path, "cluster.nkey_seed_file")?;
                async_nats::ConnectOptions::with_nkey(seed)
            }
            ClusterAuth::Credentials(path) => {
                async_nats::ConnectOptions::with_credentials_file(path)
                    .await
                    .with_context(|| {
                        format!("cluster.credentials_file: cannot read {}", path.display())
                    })?
            }
        };
        if let Some(tls) = &cfg.tls {
            options = options.require_tls(true);
            if let Some(ca) = &tls.ca_file {
                options = options.add_root_certificates(ca.clone());
            }
            if let Some((cert, key)) = &tls.client_cert {
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
        }
        let node = cfg.node_name.clone();
        options = options
            .name(format!("inlay {node}"))
            .connection_timeout(cfg.connect_timeout)
            .event_callback(move |event| {
                let node = node.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => info!(%node, "cluster: connected to NATS"),
                        async_nats::Event::Disconnected => {
                            warn!(%node, "cluster: disconnected from NATS; reconnecting")
                        }
                        other => info!(%node, event = %other, "cluster: NATS event"),
                    }
                }
            });
        let addrs = cfg
            .nats_urls
            .iter()
            .map(|u| u.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .context("cluster.nats_urls")?;
        let client = options.connect(addrs).await.with_context(|| {
            format!(
                "cluster: cannot connect to NATS at {}",
                cfg.nats_urls.join(", ")
            )
        })?;
        let js = jetstream::new(client.clone());
        Ok(Self {
            client,
            js,
            cfg: Arc::new(cfg.clone()),
            shard: Arc::default(),
            metrics,
        })
    }

    /// The core NATS client (subjects, request/reply).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context (streams, KV, object store).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The `[cluster]` settings this connection was made with.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// Sharding by key, once the node serves with `shard = true`.
    pub fn shard(&self) -> Option<&Arc<shard::Shard>> {
        self.shard.get()
    }

    /// What the cluster's parts count on this node.
    pub fn metrics(&self) -> &Arc<ClusterMetrics> {
        &self.metrics
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.cfg.node_name
    }

    /// `PREFIX.suffix`: a subject of this cluster.
    pub fn subject(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.cfg.subject_prefix)
    }

    /// `PREFIX_SUFFIX` in upper case: a stream, bucket or object store name
    /// of this cluster (JetStream names allow no `.`).
    pub fn name(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.cfg.subject_prefix).to_ascii_uppercase()
    }
}

/// A one-line secret from a file, trimmed; an empty file is an error.
fn read_secret(path: &std::path::Path, key: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{key}: cannot read {}", path.display()))?;
    let secret = text.trim();
    anyhow::ensure!(!secret.is_empty(), "{key}: {} is empty", path.display());
    Ok(secret.to_owned())
}

/// The stream of a JetStream KV bucket holding the latest value of each
/// key, made by hand: `create_key_value` reads account fields that
/// nats-server 2.9 (Debian's) does not send. The settings are the ones a
/// KV bucket gets; `max_bytes` `-1` is no bound.
fn kv_bucket_stream(
    bucket: &str,
    max_bytes: i64,
    max_message_size: i32,
) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_bytes,
        max_message_size,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    }
}
