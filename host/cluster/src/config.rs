//! The `[cluster]` settings, as plain data: the host's config reader
//! (`inlay`'s `config/cluster.rs`) reads and checks them; the key names
//! in these docs are its.

use std::path::PathBuf;
use std::time::Duration;

/// `[cluster]`: one cache fabric over NATS with JetStream.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// `nats_urls`: the NATS servers (`nats://host:port`, `tls://host:port`);
    /// the client connects to one and fails over to the others.
    pub nats_urls: Vec<String>,
    /// `node_name`: this node's name, unique in the cluster (default: the
    /// host name). Letters, digits, `-` and `_`: it is part of NATS subjects.
    pub node_name: String,
    /// `subject_prefix`: the first token of every subject, stream, bucket
    /// and object store name the cluster uses (default `inlay`), so several
    /// clusters can share NATS servers.
    pub subject_prefix: String,
    /// `shard`: each key has one owner node; others fetch misses from it.
    pub shard: bool,
    /// How this node proves who it is to NATS.
    pub auth: ClusterAuth,
    /// `tls`: TLS to the NATS servers (`ca_file`, `client_cert`, `client_key`).
    pub tls: Option<ClusterTls>,
    /// `connect_timeout`: how long one connection attempt to a NATS server
    /// may take (default 2 s). A node whose NATS servers are all down at
    /// start does not start.
    pub connect_timeout: Duration,
    /// Purge and ban fan-out (`invalidation_*`): the stream's retention
    /// and the queue of purges waiting for NATS.
    pub invalidations: InvalidationConfig,
    /// `kv`: where the policies' kv lives (`"local"` or `"nats"`).
    pub kv: ClusterKv,
    /// `kv_max_bytes`: bound on the shared kv bucket and on each node's
    /// copy of it (default 64 MiB, the local kv's budget).
    pub kv_max_bytes: u64,
    /// `policy_max_size`: largest policy component `inlay admin policy
    /// push` stores and a node fetches (default 64 MiB).
    pub policy_max_size: u64,
    /// Sharding by key (`shard = true`): membership and the owner fetch.
    pub sharding: ShardConfig,
}

/// How long the cluster keeps purges and bans for nodes that were away,
/// and how many a node queues while NATS is unreachable.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidationConfig {
    /// `invalidation_max_age`: the stream drops purges older than this
    /// (default 24 h). A node away for longer starts with an empty cache.
    pub max_age: Duration,
    /// `invalidation_max_messages`: the stream keeps at most this many
    /// purges (default 1 000 000); older ones go first.
    pub max_messages: u64,
    /// `invalidation_queue`: purges and bans made here that wait for NATS
    /// (default 10 000); past it, new ones are applied here only, and
    /// logged and counted as lost to the cluster.
    pub queue: usize,
    /// `max_disconnected`: how long the node serves from its cache without
    /// confirming that it has read every purge in the stream (NATS
    /// unreachable, its reader stalled); past it the cache is not read
    /// until it has caught up. Zero (the default): no limit.
    pub max_disconnected: Duration,
}

impl Default for InvalidationConfig {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(24 * 3600),
            max_messages: 1_000_000,
            queue: 10_000,
            max_disconnected: Duration::ZERO,
        }
    }
}

/// `cluster.kv`: where the policies' kv lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterKv {
    /// `"local"`: each node's own store (the default).
    #[default]
    Local,
    /// `"nats"`: a JetStream KV bucket shared by the cluster, read from a
    /// local copy its watch keeps (eventually consistent).
    Nats,
}

/// The `[cluster]` keys of sharding by key (read with or without `shard`).
#[derive(Debug, Clone, PartialEq)]
pub struct ShardConfig {
    /// `advertise`: the `HOST:PORT` peers use to reach this node over HTTP
    /// (default: the first `server.listen` address, which must then not be
    /// `0.0.0.0` or `[::]`).
    pub advertise: Option<std::net::SocketAddr>,
    /// `heartbeat_interval`: how often a node says it is alive (default 1 s).
    pub heartbeat_interval: Duration,
    /// `dead_after`: a node not heard from for this long has left (default
    /// 3 heartbeat intervals; more than one interval).
    pub dead_after: Duration,
    /// `peer_connect_timeout`: how long a connection to a key's owner may
    /// take before the node fetches from the origin instead (default 500 ms).
    pub peer_connect_timeout: Duration,
}

/// The credentials a node shows the NATS servers (at most one kind).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ClusterAuth {
    /// No credentials.
    #[default]
    None,
    /// `token_file`: a file holding the server's authorization token.
    Token(PathBuf),
    /// `nkey_seed_file`: a file holding an NKey user seed (`SU...`).
    NKey(PathBuf),
    /// `credentials_file`: a `.creds` file (a user JWT and its NKey seed).
    Credentials(PathBuf),
}

/// `[cluster.tls]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterTls {
    /// `ca_file`: PEM certificates the NATS servers' certificate must chain
    /// to (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// `client_cert` and `client_key`: a client certificate for servers that
    /// require one (both or neither).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}
