//! The typed host configuration: read from TOML, validated at start-up.
//!
//! Parsing walks the TOML tree by hand instead of using serde derive so that
//! *every* error is reported at once, each with its key path and the value
//! that was wrong (serde stops at the first). A serde version that converts
//! each field on its own (this file's history, "serde-derived raw sections")
//! reported the same errors in more lines and without the list of known
//! keys. Every setting and its default is listed in `host/inlay/CONFIG.md`; keep
//! the two in step.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;

use crate::backend::tls::{BackendTls, TlsSettings};

mod cluster;
pub use cluster::{
    ClusterAuth, ClusterConfig, ClusterKv, ClusterTls, InvalidationConfig, ShardConfig,
};

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
    /// `[esi]`: Edge Side Includes limits.
    pub esi: EsiConfig,
    /// `[policy]`: the WebAssembly policy, if any.
    pub policy: Option<PolicyConfig>,
    /// `[admin]`: the admin listener, if any.
    pub admin: Option<SocketAddr>,
    /// `[admin] token_file`: the file holding the admin API's bearer token;
    /// without it the admin API asks for none (loopback only).
    pub admin_token_file: Option<PathBuf>,
    /// `[metrics]`: the Prometheus counters.
    pub metrics: MetricsConfig,
    /// `[cluster]`: the NATS cluster this node joins, if any.
    pub cluster: Option<ClusterConfig>,
}

/// `[metrics]`.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Count requests for `GET /metrics` (default true; false counts nothing).
    pub enabled: bool,
}

/// Longest duration accepted for any key: beyond it, `Instant::now() + d`
/// may overflow (and panic) at run time, and no timeout or TTL means it.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses to listen on for plain HTTP (HTTP/1.1 and h2c).
    pub listen: Vec<SocketAddr>,
    /// Addresses to listen on for TLS (`https://ADDR` in `server.listen`).
    pub listen_tls: Vec<SocketAddr>,
    /// `[[server.tls]]`: the certificates the TLS listeners serve.
    pub tls: Vec<TlsCertConfig>,
    /// A TLS client must complete its handshake within this time.
    pub tls_handshake_timeout: Duration,
    /// Every connection starts with a PROXY protocol header (v1 or v2)
    /// naming the real client; one without is closed.
    pub proxy_protocol: bool,
    /// With `proxy_protocol`: the peers (load balancers) allowed to send
    /// the header; a connection from elsewhere is closed unread. Empty:
    /// any peer (the port must then be reachable by the proxies only).
    pub proxy_protocol_from: Vec<IpNet>,
    /// Maximum concurrent client connections; more wait in the accept queue.
    pub max_connections: usize,
    /// Maximum concurrent connections from one client IP address (`0`: no
    /// limit); past it a new connection from that address is refused (held
    /// unanswered for `header_read_timeout`, then closed).
    pub max_connections_per_client: usize,
    /// Connections refused for `max_connections_per_client` held unread at
    /// most (each for `header_read_timeout`, the oldest closed first for a
    /// new one); zero closes them at once. Fewer when the open-file limit
    /// has no room for them beside `max_connections` ([`crate::listeners::raise_open_files`]).
    pub tarpit_max: usize,
    /// The kernel's queue of connections not yet accepted, per listener
    /// (`listen(2)`'s backlog; Linux caps it at `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// A client must send its whole request head within this time.
    pub header_read_timeout: Duration,
    /// A connection with no traffic and no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// The idle timeout while fewer than a tenth of `max_connections` are
    /// free, so that idle clients cannot hold every slot.
    pub busy_idle_timeout: Duration,
    /// `defer_accept`: a connection reaches Inlay once its first bytes have
    /// come (TCP_DEFER_ACCEPT), or after this; zero turns it off.
    pub defer_accept: Duration,
    /// `tcp_notsent_lowat`: bytes a client connection's socket may hold
    /// written by Inlay but not yet sent (Linux `TCP_NOTSENT_LOWAT`); zero
    /// leaves the kernel's default (as much as the send buffer takes).
    pub tcp_notsent_lowat: u64,
    /// Longest time to send one response (head and body); the connection
    /// (HTTP/1) or the stream (HTTP/2) is then cut.
    pub send_timeout: Duration,
    /// Longest time a response may make no progress towards the client: a
    /// socket write that does not complete, or an HTTP/2 stream whose
    /// flow-control window keeps it from taking its next chunk.
    pub idle_send_timeout: Duration,
    /// Largest request head accepted, in bytes.
    pub max_header_size: usize,
    /// HTTP/2 (h2c and h2 over TLS): streams a client may have open at once.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list (decoded) a client may send, in bytes.
    pub h2_max_header_list_size: u32,
    /// HTTP/2: streams a client may reset before the server took them up
    /// (the rapid-reset attack) before the connection gets a GOAWAY.
    pub h2_max_pending_accept_reset_streams: usize,
    /// HTTP/2: streams the server may reset for the client's errors before
    /// the connection gets a GOAWAY.
    pub h2_max_local_error_reset_streams: usize,
    /// HTTP/2: a PING is sent this often (zero: never) ...
    pub h2_keep_alive_interval: Duration,
    /// ... and the connection closed when its ACK is not back within this.
    pub h2_keep_alive_timeout: Duration,
    /// Largest request body accepted, in bytes; larger ones get 413.
    pub max_request_body: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_timeout: Duration,
    /// The request-id field (`X-Request-Id`): accepted or minted, sent to
    /// backends and ESI includes, logged and returned. `None`: off.
    pub request_id_header: Option<http::HeaderName>,
    /// Keep a sane request id the client sent; false: always mint one.
    pub trust_request_id: bool,
    /// Add `Server-Timing` to every response (a policy can also turn it on
    /// for one request).
    pub server_timing: bool,
}

/// One `[[server.tls]]` entry: a certificate chain and its key, for the
/// SNI names it lists (none: the default, for clients that send no name or
/// one no entry lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsCertConfig {
    /// PEM file: the certificate, then its intermediates.
    pub cert: PathBuf,
    /// PEM file: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Lower-case host names (`*.example.com` covers one label).
    pub names: Vec<String>,
}

/// `[backends.NAME]`.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// The backend's name (the table key).
    pub name: String,
    /// `http://host:port` of the origin.
    pub address: Uri,
    /// Host header sent to the backend instead of the client's.
    pub host_header: Option<String>,
    /// Time allowed to open a TCP connection.
    pub connect_timeout: Duration,
    /// Time allowed from sending the request to receiving the response head.
    pub first_byte_timeout: Duration,
    /// Longest pause allowed between two body chunks of the response.
    pub between_bytes_timeout: Duration,
    /// Maximum concurrent requests to this backend (0 = unlimited).
    pub max_connections: usize,
    /// `https://` backends: roots, SNI name, client certificate (`ca_file`,
    /// `client_cert`, `client_key`), read and checked with the config.
    pub tls: Option<crate::backend::tls::BackendTls>,
    /// `http2`: HTTP/2 to the origin (offered in ALPN over TLS; prior
    /// knowledge over `http://`).
    pub http2: bool,
    /// `[backends.NAME.probe]`: the health probe, if any.
    pub probe: Option<ProbeConfig>,
    /// How long an idle kept-alive connection stays in the pool.
    pub keepalive_timeout: Duration,
    /// Idle connections kept for reuse (0: a connection per request).
    pub max_idle_connections: usize,
}

/// `[directors.NAME]`: a group of backends, as Varnish's directors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectorConfig {
    /// The director's name (the table key).
    pub name: String,
    /// How it picks.
    pub kind: DirectorKind,
    /// Its backends, in order.
    pub backends: Vec<DirectorMember>,
}

/// `directors.NAME.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectorKind {
    /// `round_robin`: each healthy backend in turn.
    RoundRobin,
    /// `random`: a healthy backend at random, by weight.
    Random,
    /// `fallback`: the first healthy backend in order.
    Fallback,
    /// `shard`: consistent hashing on the cache key.
    Shard,
}

impl DirectorKind {
    /// The `type` that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
            Self::Fallback => "fallback",
            Self::Shard => "shard",
        }
    }
}

/// One backend of a director.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectorMember {
    /// The backend's name.
    pub backend: String,
    /// Its weight (`random` only; 1 otherwise).
    pub weight: u32,
}

/// `[backends.NAME.probe]`: a health probe, as Varnish's `.probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Path and query requested (`GET`), e.g. `/health`.
    pub url: http::uri::PathAndQuery,
    /// Time between the starts of two probes.
    pub interval: Duration,
    /// A probe without a response head within this is bad.
    pub timeout: Duration,
    /// How many of the latest probes count.
    pub window: u32,
    /// Good probes in the window for the backend to be healthy.
    pub threshold: u32,
    /// Probes counted good at start (`threshold - 1`: sick until the
    /// first probe answers).
    pub initial: u32,
    /// The status a good probe answers with.
    pub expected_status: u16,
}

/// Access-log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// NCSA combined log format, as Apache and varnishncsa write it.
    Combined,
    /// One JSON object per line.
    Json,
}

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// Appended to a file.
    File(PathBuf),
    /// No access log.
    Off,
}

/// `[log]`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `tracing` filter for the diagnostic log (stderr), e.g. `info` or `inlay=debug`.
    pub level: String,
    /// Where access-log lines go.
    pub access_log: AccessLogTarget,
    /// The access-log line format.
    pub access_log_format: AccessLogFormat,
}

/// `[cache]`.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Directory of the persistent (sled) tier; none means memory only.
    pub dir: Option<PathBuf>,
    /// Bound of the memory tier, bytes.
    pub memory_size: u64,
    /// Bound of the disk tier, bytes.
    pub disk_size: u64,
    /// sled's cache of the disk tier's records, bytes; `None`: the store's
    /// default (`disk_size` within 32 MiB..=1 GiB). Read when the store
    /// opens.
    pub disk_index_cache: Option<u64>,
    /// TTL when the response says nothing (Varnish's `default_ttl`).
    pub default_ttl: Duration,
    /// Grace when the response says nothing (Varnish's `default_grace`).
    pub default_grace: Duration,
    /// Keep after TTL + grace, for revalidation (Varnish's `default_keep`).
    pub default_keep: Duration,
    /// Responses with bodies larger than this are streamed but not stored.
    pub max_object_size: u64,
    /// Client addresses (CIDR) allowed to send `PURGE`.
    pub purge_allow: Vec<IpNet>,
    /// Content codings that are variants of their own, most preferred
    /// first; a fetch for the cache asks for exactly one of them or
    /// `identity`.
    pub accept_encoding: Vec<String>,
    /// Request fields removed from fetches for the cache: the origin may
    /// trust them, and they are not in the key.
    pub strip_request_headers: Vec<http::HeaderName>,
}

/// The default of `cache.strip_request_headers`: fields frameworks trust to
/// build absolute links and redirects, or to rewrite the URL or method,
/// none of them in the cache key (see the README's "Forwarding headers").
pub const STRIP_REQUEST_HEADERS: [&str; 13] = [
    "forwarded",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-host",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// `[esi]`.
#[derive(Debug, Clone)]
pub struct EsiConfig {
    /// Deepest nesting of includes.
    pub max_depth: u32,
    /// Most includes in one page, nested ones counted.
    pub max_includes: usize,
    /// Concurrent include fetches per page; 1 is serial ESI, as Varnish does.
    pub max_concurrency: usize,
    /// Time allowed for one include.
    pub include_timeout: Duration,
    /// Time allowed for the whole page.
    pub page_deadline: Duration,
    /// Client request headers forwarded to include requests (lower-case).
    pub forward_headers: Vec<String>,
    /// A failed include nothing handles is left out (`"omit"`) or ends the
    /// page (`"fail"`, ESI 1.0).
    pub on_include_error: inlay_esi::OnIncludeError,
    /// Include output held per page before its turn (and `esi:attempt`
    /// content); a fragment that is ahead waits for room.
    pub max_buffered_bytes: usize,
}

/// `[policy]`.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// Path of the policy `.wasm` (component or core module with a component-type section).
    pub path: PathBuf,
    /// The policy's own settings, read through the `config` interface.
    pub config: BTreeMap<String, String>,
    /// CPU time allowed per hook call.
    pub cpu_time: Duration,
    /// Linear memory cap per request, bytes.
    pub memory: u64,
    /// Host calls allowed per request.
    pub max_host_calls: u32,
    /// Subrequests allowed per request.
    pub max_subrequests: u32,
    /// Bytes of subrequest response bodies one request may buffer.
    pub max_subrequest_bytes: u64,
    /// Concurrent policy instances (requests running a policy at once).
    pub max_instances: u32,
    /// How long a request waits for a free instance of a full pool.
    pub instance_wait: Duration,
    /// How long one hook may wait in all on the host's I/O (cache, kv, fetch).
    pub host_wait: Duration,
    /// Start requests from a snapshot taken after one synthetic request.
    pub prewarm: bool,
    /// Keep one instance per worker thread made ahead of the request that
    /// needs it, so that requests do not wait for instantiation.
    pub pre_instantiate: bool,
    /// Bytes of recorded policy paths kept to answer repeated requests
    /// without an instance; 0 runs every request's policy live.
    pub memo_size: u64,
}

/// The longest a request may be told to wait for a policy instance: a
/// client waiting longer has usually given up.
const MAX_INSTANCE_WAIT: Duration = Duration::from_secs(60);

/// The longest a policy hook may be told to wait on the host's I/O.
const MAX_HOST_WAIT: Duration = Duration::from_secs(600);

/// An IPv4 or IPv6 network in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parse `addr/prefix` or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("not an IP address: {addr:?}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix must be 0..={max}: {p:?}"))?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses match IPv4 nets).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr::*;
        let ip = match ip {
            V6(v6) => v6.to_ipv4_mapped().map(V4).unwrap_or(V6(v6)),
            v4 => v4,
        };
        match (self.addr, ip) {
            (V4(net), V4(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            (V6(net), V6(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn mask_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rem = prefix % 8;
    if rem == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rem);
    (a[full] & mask) == (b[full] & mask)
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
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

    /// Apply `-a`, `-b`, `--policy`, `--cache-dir` overrides, then validate again.
    pub fn apply_overrides(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        let mut issues = Vec::new();
        if !o.listen.is_empty() {
            self.server.listen.clear();
            self.server.listen_tls.clear();
            for a in &o.listen {
                match parse_listener(a) {
                    Ok((addr, false)) => self.server.listen.push(addr),
                    Ok((addr, true)) => self.server.listen_tls.push(addr),
                    Err(m) => issues.push(issue("-a", m)),
                }
            }
        }
        match (&o.tls_cert, &o.tls_key) {
            (Some(cert), Some(key)) => {
                self.server.tls = vec![TlsCertConfig {
                    cert: cert.clone(),
                    key: key.clone(),
                    names: Vec::new(),
                }];
            }
            (Some(_), None) => issues.push(issue("--tls-cert", "needs --tls-key too")),
            (None, Some(_)) => issues.push(issue("--tls-key", "needs --tls-cert too")),
            (None, None) => {}
        }
        if let Some(m) = tls_listeners_without_certificate(&self.server) {
            issues.push(issue("-a", m));
        }
        if o.backend.is_some() && self.directors.contains_key(&self.default_backend) {
            issues.push(issue(
                "-b",
                format!(
                    "default_backend {:?} is a director: set its backends' addresses in the file",
                    self.default_backend
                ),
            ));
        } else if let Some(b) = &o.backend {
            match parse_backend_uri(b) {
                Ok(address) => {
                    let name = self.default_backend.clone();
                    let entry = self
                        .backends
                        .entry(name.clone())
                        .or_insert_with(|| BackendConfig::with_defaults(name, address.clone()));
                    entry.address = address;
                    if let Err(m) = entry.load_tls(entry.tls.as_ref().map(|t| t.settings().clone()))
                    {
                        issues.push(issue("-b", m));
                    }
                }
                Err(m) => issues.push(issue("-b", m)),
            }
        }
        if let Some(p) = &o.policy {
            match &mut self.policy {
                Some(pc) => pc.path = p.clone(),
                None => self.policy = Some(PolicyConfig::with_defaults(p.clone())),
            }
        }
        if o.no_policy {
            self.policy = None;
        }
        if let Some(d) = &o.cache_dir {
            self.cache.dir = Some(d.clone());
        }
        if let Some(a) = &o.admin {
            match parse_listen(a) {
                Ok(addr) => match unguarded_admin(addr, self.admin_token_file.as_deref()) {
                    Some(m) => issues.push(issue("--admin", m)),
                    None => self.admin = Some(addr),
                },
                Err(m) => issues.push(issue("--admin", m)),
            }
        }
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues))
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

/// Command-line settings that override the file (varnishd-style quick flags).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `-a ADDR`, repeatable.
    pub listen: Vec<String>,
    /// `-b URL`: the default backend's address.
    pub backend: Option<String>,
    /// `--policy FILE.wasm`.
    pub policy: Option<PathBuf>,
    /// `--no-policy`: run without a policy even if the config names one.
    pub no_policy: bool,
    /// `--cache-dir DIR`.
    pub cache_dir: Option<PathBuf>,
    /// `--admin ADDR`.
    pub admin: Option<String>,
    /// `--tls-cert FILE`: with `tls_key`, replaces `[[server.tls]]` by one
    /// default certificate.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key FILE`.
    pub tls_key: Option<PathBuf>,
}

impl CacheConfig {
    /// What the cache needs of this section.
    pub fn rules(&self) -> inlay_cache::CacheRules {
        inlay_cache::CacheRules {
            defaults: inlay_cache::Defaults {
                ttl: self.default_ttl,
                grace: self.default_grace,
                keep: self.default_keep,
            },
            max_object_size: self.max_object_size,
            accept_encoding: inlay_cache::ContentCodings::new(&self.accept_encoding),
        }
    }
}

impl BackendConfig {
    fn with_defaults(name: String, address: Uri) -> Self {
        Self {
            name,
            address,
            host_header: None,
            connect_timeout: Duration::from_millis(3500),
            first_byte_timeout: Duration::from_secs(60),
            between_bytes_timeout: Duration::from_secs(60),
            max_connections: 0,
            tls: None,
            http2: false,
            probe: None,
            keepalive_timeout: Duration::from_secs(30),
            max_idle_connections: 1024,
        }
    }

    /// Read the TLS files of an `https://` address (with `settings`, or
    /// the system roots and no client certificate); none for `http://`.
    fn load_tls(&mut self, settings: Option<TlsSettings>) -> Result<(), String> {
        self.tls = None;
        if self.address.scheme_str() != Some("https") {
            return Ok(());
        }
        let settings = settings.unwrap_or(TlsSettings {
            http2: self.http2,
            ..TlsSettings::default()
        });
        match BackendTls::load(&self.address, self.host_header.as_deref(), settings) {
            Ok(t) => {
                self.tls = Some(t);
                Ok(())
            }
            Err(issues) => Err(issues
                .into_iter()
                .map(|(k, m)| format!("{k}: {m}"))
                .collect::<Vec<_>>()
                .join("; ")),
        }
    }

    /// `host:port` of the backend, for logs and the Host header fallback.
    pub fn authority(&self) -> String {
        self.address
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

impl PolicyConfig {
    fn with_defaults(path: PathBuf) -> Self {
        Self {
            path,
            config: BTreeMap::new(),
            cpu_time: Duration::from_millis(50),
            memory: 64 << 20,
            max_host_calls: 10_000,
            max_subrequests: 32,
            max_subrequest_bytes: 16 << 20,
            max_instances: 1000,
            instance_wait: Duration::from_secs(1),
            host_wait: Duration::from_secs(10),
            prewarm: true,
            pre_instantiate: true,
            memo_size: 16 << 20,
        }
    }
}

fn issue(path: &str, message: impl Into<String>) -> ConfigIssue {
    ConfigIssue {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Why the admin API may not listen on `addr` as configured: anyone who
/// can reach a non-loopback address could purge, ban and reload without a
/// token.
pub(crate) fn unguarded_admin(addr: SocketAddr, token_file: Option<&Path>) -> Option<String> {
    (token_file.is_none() && !addr.ip().is_loopback()).then(|| {
        format!(
            "{addr} is not a loopback address: set admin.token_file so that the admin API asks for a bearer token"
        )
    })
}

/// A `server.listen` entry: `ADDR` or `http://ADDR` (plain HTTP) or
/// `https://ADDR` (TLS); whether it is TLS.
fn parse_listener(s: &str) -> Result<(SocketAddr, bool), String> {
    if let Some(addr) = s.strip_prefix("https://") {
        return parse_listen(addr).map(|a| (a, true));
    }
    if s.contains("://") && !s.starts_with("http://") {
        return Err(format!(
            "unknown scheme in {s:?} (use ADDR, http://ADDR or https://ADDR)"
        ));
    }
    parse_listen(s.strip_prefix("http://").unwrap_or(s)).map(|a| (a, false))
}

/// Why `server` cannot serve its TLS listeners: none of them has a certificate.
fn tls_listeners_without_certificate(server: &ServerConfig) -> Option<String> {
    let first = server.listen_tls.first()?;
    server.tls.is_empty().then(|| {
        format!(
            "https://{first} needs a certificate: add a [[server.tls]] entry (or pass --tls-cert and --tls-key)"
        )
    })
}

/// A host name `[[server.tls]]` may list: lower-case letters, digits, `-`
/// and dots, optionally `*.` in front.
fn valid_sni_name(name: &str) -> bool {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    // Accept varnishd's `:6081` shorthand for all interfaces.
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map_err(|_| format!("not an address like 127.0.0.1:6081: {s:?}"))
}

fn parse_backend_uri(s: &str) -> Result<Uri, String> {
    let with_scheme = if s.contains("://") {
        s.to_owned()
    } else {
        format!("http://{s}")
    };
    let uri: Uri = with_scheme
        .parse()
        .map_err(|_| format!("not a URL like http://127.0.0.1:8080: {s:?}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "a backend URL is http:// or https:// (TLS), got {s:?}"
        ));
    }
    if uri.host().is_none() {
        return Err(format!("backend URL has no host: {s:?}"));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("backend URL must not have a path: {s:?}"));
    }
    Ok(uri)
}

/// Parse a size: an integer of bytes, or a string like `64KiB`, `256MiB`, `1GiB`, `10MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("not a size like 64MiB: {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("unknown size unit in {s:?} (use B, KiB, MiB, GiB)")),
    };
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("size out of range: {s:?}"));
    }
    Ok(v as u64)
}

/// Collects issues while reading the TOML tree.
#[derive(Default)]
struct Reader {
    issues: Vec<ConfigIssue>,
}

type Table = toml::Table;
type Value = toml::Value;

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

impl Reader {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue {
            path: path.into(),
            message: message.into(),
        });
    }

    fn known_keys(&mut self, t: &Table, prefix: &str, known: &[&str]) {
        for k in t.keys() {
            if !known.contains(&k.as_str()) {
                self.err(
                    join(prefix, k),
                    format!("unknown setting (known here: {})", known.join(", ")),
                );
            }
        }
    }

    fn table<'a>(&mut self, t: &'a Table, prefix: &str, key: &str) -> Option<&'a Table> {
        match t.get(key) {
            None => None,
            Some(Value::Table(inner)) => Some(inner),
            Some(v) => {
                self.err(join(prefix, key), format!("expected a table, got {v}"));
                None
            }
        }
    }

    fn string(&mut self, t: &Table, prefix: &str, key: &str) -> Option<String> {
        match t.get(key)? {
            Value::String(s) => Some(s.clone()),
            v => {
                self.err(join(prefix, key), format!("expected a string, got {v}"));
                None
            }
        }
    }

    fn boolean(&mut self, t: &Table, prefix: &str, key: &str, default: bool) -> bool {
        match t.get(key) {
            None => default,
            Some(Value::Boolean(b)) => *b,
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected true or false, got {v}"),
                );
                default
            }
        }
    }

    fn uint(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> u64 {
        match t.get(key) {
            None => default,
            Some(Value::Integer(i)) if *i >= min as i64 && (*i as u64) <= max => *i as u64,
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected an integer in {min}..={max}, got {v}"),
                );
                default
            }
        }
    }

    fn duration(&mut self, t: &Table, prefix: &str, key: &str, default: Duration) -> Duration {
        let d = self.any_duration(t, prefix, key, default);
        if d > MAX_DURATION {
            self.err(
                join(prefix, key),
                format!(
                    "too long: at most \"{}d\" (100 years), got {}s",
                    MAX_DURATION.as_secs() / 86_400,
                    d.as_secs()
                ),
            );
            return default;
        }
        d
    }

    fn any_duration(&mut self, t: &Table, prefix: &str, key: &str, default: Duration) -> Duration {
        match t.get(key) {
            None => default,
            Some(Value::String(s)) => match humantime::parse_duration(s) {
                Ok(d) => d,
                Err(e) => {
                    self.err(
                        join(prefix, key),
                        format!("{e} in {s:?} (use e.g. \"500ms\", \"30s\", \"5m\")"),
                    );
                    default
                }
            },
            Some(Value::Integer(i)) if *i >= 0 => Duration::from_secs(*i as u64),
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected a duration like \"30s\", got {v}"),
                );
                default
            }
        }
    }

    /// A duration that must not be zero (a zero timeout would cut everything).
    fn positive_duration(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: Duration,
    ) -> Duration {
        let d = self.duration(t, prefix, key, default);
        if d.is_zero() {
            self.err(join(prefix, key), "must be more than zero".to_string());
            return default;
        }
        d
    }

    fn size(&mut self, t: &Table, prefix: &str, key: &str, default: u64) -> u64 {
        match t.get(key) {
            None => default,
            Some(Value::Integer(i)) if *i >= 0 => *i as u64,
            Some(Value::String(s)) => match parse_size(s) {
                Ok(n) => n,
                Err(m) => {
                    self.err(join(prefix, key), m);
                    default
                }
            },
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected a size like \"64MiB\", got {v}"),
                );
                default
            }
        }
    }

    fn strings(&mut self, t: &Table, prefix: &str, key: &str) -> Option<Vec<String>> {
        match t.get(key)? {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, v) in items.iter().enumerate() {
                    match v {
                        Value::String(s) => out.push(s.clone()),
                        v => self.err(
                            format!("{}[{i}]", join(prefix, key)),
                            format!("expected a string, got {v}"),
                        ),
                    }
                }
                Some(out)
            }
            v => {
                self.err(
                    join(prefix, key),
                    format!("expected a list of strings, got {v}"),
                );
                None
            }
        }
    }

    fn config(&mut self, root: &Table) -> Config {
        self.known_keys(
            root,
            "",
            &[
                "server",
                "backends",
                "default_backend",
                "directors",
                "log",
                "cache",
                "esi",
                "policy",
                "admin",
                "metrics",
                "cluster",
            ],
        );
        let empty = Table::new();
        let t = self.table(root, "", "server").unwrap_or(&empty);
        let server = self.server(t);
        let mut backends = BTreeMap::new();
        if let Some(bt) = self.table(root, "", "backends") {
            for (name, v) in bt {
                let path = format!("backends.{name}");
                if !valid_name(name) {
                    self.err(&path, "backend names use letters, digits, '-' and '_'");
                }
                match v {
                    Value::Table(t) => {
                        if let Some(b) = self.backend(t, &path, name) {
                            backends.insert(name.clone(), b);
                        }
                    }
                    v => self.err(&path, format!("expected a table, got {v}")),
                }
            }
        }
        let default_backend = self
            .string(root, "", "default_backend")
            .or_else(|| {
                (backends.len() == 1)
                    .then(|| backends.keys().next().cloned())
                    .flatten()
            })
            .unwrap_or_else(|| "default".to_owned());
        let directors = self.directors(root, &backends);
        if !backends.contains_key(&default_backend) && !directors.contains_key(&default_backend) {
            if backends.is_empty() {
                self.err(
                    "backends",
                    "at least one backend is required (or pass -b URL)",
                );
            } else {
                self.err(
                    "default_backend",
                    format!(
                        "{default_backend:?} is not a configured backend or director (have: {})",
                        backends
                            .keys()
                            .chain(directors.keys())
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
        }
        let t = self.table(root, "", "log").unwrap_or(&empty);
        let log = self.log(t);
        let t = self.table(root, "", "cache").unwrap_or(&empty);
        let cache = self.cache(t);
        let t = self.table(root, "", "esi").unwrap_or(&empty);
        let esi = self.esi(t);
        let policy = self.table(root, "", "policy").and_then(|t| self.policy(t));
        let admin_token_file = self
            .table(root, "", "admin")
            .and_then(|t| self.string(t, "admin", "token_file"))
            .map(PathBuf::from);
        let admin = self.table(root, "", "admin").and_then(|t| {
            self.known_keys(t, "admin", &["listen", "token_file"]);
            let s = self.string(t, "admin", "listen")?;
            match parse_listen(&s) {
                Ok(a) => Some(a),
                Err(m) => {
                    self.err("admin.listen", m);
                    None
                }
            }
        });
        if let Some(m) = admin.and_then(|a| unguarded_admin(a, admin_token_file.as_deref())) {
            self.err("admin.listen", m);
        }
        if admin_token_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            self.err("admin.token_file", "must name a file");
        }
        let t = self.table(root, "", "metrics").unwrap_or(&empty);
        self.known_keys(t, "metrics", &["enabled"]);
        let metrics = MetricsConfig {
            enabled: self.boolean(t, "metrics", "enabled", true),
        };
        let cluster = self
            .table(root, "", "cluster")
            .and_then(|t| self.cluster(t));
        self.cluster_advertised(cluster.as_ref(), &server.listen);
        Config {
            server,
            backends,
            default_backend,
            directors,
            log,
            cache,
            esi,
            policy,
            admin,
            admin_token_file,
            metrics,
            cluster,
        }
    }

    fn server(&mut self, t: &Table) -> ServerConfig {
        let p = "server";
        self.known_keys(
            t,
            p,
            &[
                "listen",
                "tls",
                "tls_handshake_timeout",
                "proxy_protocol",
                "proxy_protocol_from",
                "max_connections",
                "max_connections_per_client",
                "tarpit_max",
                "listen_backlog",
                "header_read_timeout",
                "idle_timeout",
                "busy_idle_timeout",
                "defer_accept",
                "tcp_notsent_lowat",
                "send_timeout",
                "idle_send_timeout",
                "max_header_size",
                "h2_max_concurrent_streams",
                "h2_max_header_list_size",
                "h2_max_pending_accept_reset_streams",
                "h2_max_local_error_reset_streams",
                "h2_keep_alive_interval",
                "h2_keep_alive_timeout",
                "max_request_body",
                "shutdown_timeout",
                "request_id_header",
                "trust_request_id",
                "server_timing",
            ],
        );
        let mut listen = Vec::new();
        let mut listen_tls = Vec::new();
        for (i, a) in self
            .strings(t, p, "listen")
            .unwrap_or_else(|| vec!["127.0.0.1:6081".into()])
            .iter()
            .enumerate()
        {
            match parse_listener(a) {
                Ok((addr, false)) => listen.push(addr),
                Ok((addr, true)) => listen_tls.push(addr),
                Err(m) => self.err(format!("server.listen[{i}]"), m),
            }
        }
        let tls = self.tls(t);
        let max_header_size = self.size(t, p, "max_header_size", 64 << 10);
        if !(8192..=1 << 24).contains(&max_header_size) {
            self.err(
                "server.max_header_size",
                format!("must be between 8KiB and 16MiB, got {max_header_size}"),
            );
        }
        let h2_max_header_list_size = self.size(
            t,
            p,
            "h2_max_header_list_size",
            max_header_size.clamp(8192, 1 << 24),
        );
        if !(8192..=1 << 24).contains(&h2_max_header_list_size) {
            self.err(
                "server.h2_max_header_list_size",
                format!("must be between 8KiB and 16MiB, got {h2_max_header_list_size}"),
            );
        }
        let tcp_notsent_lowat = self.size(t, p, "tcp_notsent_lowat", 128 << 10);
        if tcp_notsent_lowat > 1 << 30 {
            self.err(
                "server.tcp_notsent_lowat",
                format!("must be at most 1GiB, got {tcp_notsent_lowat}"),
            );
        }
        let server = ServerConfig {
            listen,
            listen_tls,
            tls,
            tls_handshake_timeout: self.positive_duration(
                t,
                p,
                "tls_handshake_timeout",
                Duration::from_secs(10),
            ),
            proxy_protocol: self.boolean(t, p, "proxy_protocol", false),
            proxy_protocol_from: self.networks(t, p, "proxy_protocol_from"),
            max_connections: self.uint(t, p, "max_connections", 10_000, 1, 1_000_000) as usize,
            max_connections_per_client: self.uint(
                t,
                p,
                "max_connections_per_client",
                1_000,
                0,
                1_000_000,
            ) as usize,
            tarpit_max: self.uint(t, p, "tarpit_max", 10_000, 0, 1_000_000) as usize,
            listen_backlog: self.uint(t, p, "listen_backlog", 1024, 1, 65_535) as u32,
            header_read_timeout: self.duration(
                t,
                p,
                "header_read_timeout",
                Duration::from_secs(10),
            ),
            idle_timeout: self.duration(t, p, "idle_timeout", Duration::from_secs(60)),
            busy_idle_timeout: self.positive_duration(
                t,
                p,
                "busy_idle_timeout",
                Duration::from_secs(1),
            ),
            defer_accept: self.duration(t, p, "defer_accept", Duration::from_secs(3)),
            tcp_notsent_lowat,
            send_timeout: self.positive_duration(t, p, "send_timeout", Duration::from_secs(600)),
            idle_send_timeout: self.positive_duration(
                t,
                p,
                "idle_send_timeout",
                Duration::from_secs(60),
            ),
            max_header_size: max_header_size as usize,
            h2_max_concurrent_streams: self.uint(t, p, "h2_max_concurrent_streams", 256, 1, 10_000)
                as u32,
            h2_max_header_list_size: h2_max_header_list_size.min(1 << 24) as u32,
            h2_max_pending_accept_reset_streams: self.uint(
                t,
                p,
                "h2_max_pending_accept_reset_streams",
                20,
                1,
                10_000,
            ) as usize,
            h2_max_local_error_reset_streams: self.uint(
                t,
                p,
                "h2_max_local_error_reset_streams",
                1024,
                1,
                100_000,
            ) as usize,
            h2_keep_alive_interval: self.duration(t, p, "h2_keep_alive_interval", Duration::ZERO),
            h2_keep_alive_timeout: self.positive_duration(
                t,
                p,
                "h2_keep_alive_timeout",
                Duration::from_secs(20),
            ),
            max_request_body: self.size(t, p, "max_request_body", 64 << 20),
            shutdown_timeout: self.duration(t, p, "shutdown_timeout", Duration::from_secs(30)),
            request_id_header: self.request_id_header(t),
            trust_request_id: self.boolean(t, p, "trust_request_id", true),
            server_timing: self.boolean(t, p, "server_timing", false),
        };
        if let Some(m) = tls_listeners_without_certificate(&server) {
            self.err("server.listen", m);
        }
        if !server.proxy_protocol && !server.proxy_protocol_from.is_empty() {
            self.err(
                "server.proxy_protocol_from",
                "set, but server.proxy_protocol is off: no header is read",
            );
        }
        server
    }

    /// A list of networks (`"10.0.0.0/8"`, `"2001:db8::1"`); none when absent.
    fn networks(&mut self, t: &Table, prefix: &str, key: &str) -> Vec<IpNet> {
        let mut out = Vec::new();
        for (i, s) in self
            .strings(t, prefix, key)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            match IpNet::parse(s) {
                Ok(n) => out.push(n),
                Err(m) => self.err(format!("{}[{i}]", join(prefix, key)), m),
            }
        }
        out
    }

    /// `[[server.tls]]`: each entry's files and names; at most one entry
    /// without names (the default), no name in two entries.
    fn tls(&mut self, t: &Table) -> Vec<TlsCertConfig> {
        let items = match t.get("tls") {
            None => return Vec::new(),
            Some(Value::Array(items)) => items,
            Some(v) => {
                self.err(
                    "server.tls",
                    format!("expected [[server.tls]] entries (tables), got {v}"),
                );
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut default_at = None;
        for (i, item) in items.iter().enumerate() {
            let p = format!("server.tls[{i}]");
            let Value::Table(e) = item else {
                self.err(&p, format!("expected a table, got {item}"));
                continue;
            };
            self.known_keys(e, &p, &["cert", "key", "names"]);
            let file = |r: &mut Self, key: &str| match r.string(e, &p, key) {
                Some(f) if !f.is_empty() => Some(PathBuf::from(f)),
                Some(_) => {
                    r.err(join(&p, key), "must name a PEM file");
                    None
                }
                None if !e.contains_key(key) => {
                    r.err(join(&p, key), "missing: the PEM file is required");
                    None
                }
                None => None,
            };
            let cert = file(self, "cert");
            let key = file(self, "key");
            let names = self.strings(e, &p, "names").unwrap_or_default();
            for (j, n) in names.iter().enumerate() {
                if !valid_sni_name(n) {
                    self.err(
                        format!("{p}.names[{j}]"),
                        format!(
                            "not a lower-case host name like \"www.example.com\" or \"*.example.com\": {n:?}"
                        ),
                    );
                } else if !seen.insert(n.clone()) {
                    self.err(
                        format!("{p}.names[{j}]"),
                        format!("{n:?} is listed by an earlier entry"),
                    );
                }
            }
            if names.is_empty() && e.contains_key("names") {
                self.err(
                    format!("{p}.names"),
                    "empty: leave it out for the default entry",
                );
            }
            if !e.contains_key("names") {
                match default_at {
                    Some(d) => self.err(
                        format!("{p}.names"),
                        format!(
                            "missing: server.tls[{d}] is the default already (one entry may go without names)"
                        ),
                    ),
                    None => default_at = Some(i),
                }
            }
            if let (Some(cert), Some(key)) = (cert, key) {
                out.push(TlsCertConfig { cert, key, names });
            }
        }
        out
    }

    /// `server.request_id_header`: a field name (default `X-Request-Id`),
    /// or `""` for off. Fields that frame or route the message are refused.
    fn request_id_header(&mut self, t: &Table) -> Option<http::HeaderName> {
        let name = self
            .string(t, "server", "request_id_header")
            .unwrap_or_else(|| "x-request-id".into());
        if name.is_empty() {
            return None;
        }
        match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) if !crate::request_id::RESERVED.contains(&n.as_str()) => Some(n),
            Ok(n) => {
                self.err(
                    "server.request_id_header",
                    format!("{n} is a field Inlay or HTTP itself gives meaning to"),
                );
                None
            }
            Err(_) => {
                self.err(
                    "server.request_id_header",
                    format!("{name:?} is not a header field name"),
                );
                None
            }
        }
    }

    fn backend(&mut self, t: &Table, p: &str, name: &str) -> Option<BackendConfig> {
        self.known_keys(
            t,
            p,
            &[
                "address",
                "host_header",
                "connect_timeout",
                "first_byte_timeout",
                "between_bytes_timeout",
                "max_connections",
                "http2",
                "ca_file",
                "client_cert",
                "client_key",
                "probe",
                "keepalive_timeout",
                "max_idle_connections",
            ],
        );
        let address = match self.string(t, p, "address") {
            Some(a) => match parse_backend_uri(&a) {
                Ok(u) => Some(u),
                Err(m) => {
                    self.err(join(p, "address"), m);
                    None
                }
            },
            None => {
                self.err(
                    join(p, "address"),
                    "missing (e.g. address = \"http://127.0.0.1:8080\")",
                );
                None
            }
        };
        let d = BackendConfig::with_defaults(name.to_owned(), Uri::from_static("http://x"));
        let b = BackendConfig {
            name: name.to_owned(),
            address: address.clone().unwrap_or(d.address),
            host_header: self.string(t, p, "host_header"),
            connect_timeout: self.duration(t, p, "connect_timeout", d.connect_timeout),
            first_byte_timeout: self.duration(t, p, "first_byte_timeout", d.first_byte_timeout),
            between_bytes_timeout: self.duration(
                t,
                p,
                "between_bytes_timeout",
                d.between_bytes_timeout,
            ),
            max_connections: self.uint(t, p, "max_connections", 0, 0, 1_000_000) as usize,
            tls: None,
            http2: self.boolean(t, p, "http2", false),
            probe: self
                .table(t, p, "probe")
                .and_then(|pt| self.probe(pt, &join(p, "probe"))),
            keepalive_timeout: self.positive_duration(
                t,
                p,
                "keepalive_timeout",
                d.keepalive_timeout,
            ),
            max_idle_connections: 0,
        };
        let max_connections = b.max_connections as u64;
        let default_idle = if max_connections > 0 {
            max_connections
        } else {
            d.max_idle_connections as u64
        };
        let b = BackendConfig {
            max_idle_connections: self.uint(
                t,
                p,
                "max_idle_connections",
                default_idle,
                0,
                1_000_000,
            ) as usize,
            ..b
        };
        let tls = self.backend_tls(t, p, &b);
        address.map(|_| BackendConfig { tls, ..b })
    }

    /// `[directors.NAME]`: each names existing backends (not directors),
    /// and no director is named as a backend is.
    fn directors(
        &mut self,
        root: &Table,
        backends: &BTreeMap<String, BackendConfig>,
    ) -> BTreeMap<String, DirectorConfig> {
        let mut directors = BTreeMap::new();
        let Some(dt) = self.table(root, "", "directors") else {
            return directors;
        };
        for (name, v) in dt {
            let p = format!("directors.{name}");
            if !valid_name(name) {
                self.err(&p, "director names use letters, digits, '-' and '_'");
            }
            if backends.contains_key(name) {
                self.err(
                    &p,
                    format!("{name:?} is also a backend: a name is one or the other"),
                );
            }
            let Value::Table(t) = v else {
                self.err(&p, format!("expected a table, got {v}"));
                continue;
            };
            self.known_keys(t, &p, &["type", "backends"]);
            let kind = match self.string(t, &p, "type").as_deref() {
                Some("round_robin") => Some(DirectorKind::RoundRobin),
                Some("random") => Some(DirectorKind::Random),
                Some("fallback") => Some(DirectorKind::Fallback),
                Some("shard") => Some(DirectorKind::Shard),
                other => {
                    self.err(
                        join(&p, "type"),
                        format!(
                            "expected \"round_robin\", \"random\", \"fallback\" or \"shard\", got {}",
                            other.map_or("nothing".into(), |o| format!("{o:?}"))
                        ),
                    );
                    None
                }
            };
            let members = self.director_members(t, &p, kind, backends);
            if let (Some(kind), Some(backends)) = (kind, members) {
                directors.insert(
                    name.clone(),
                    DirectorConfig {
                        name: name.clone(),
                        kind,
                        backends,
                    },
                );
            }
        }
        directors
    }

    /// `directors.NAME.backends`: names, or `{ backend = "a", weight = 3 }`
    /// tables (weights for `random`).
    fn director_members(
        &mut self,
        t: &Table,
        p: &str,
        kind: Option<DirectorKind>,
        backends: &BTreeMap<String, BackendConfig>,
    ) -> Option<Vec<DirectorMember>> {
        let key = join(p, "backends");
        let items = match t.get("backends") {
            Some(Value::Array(items)) if !items.is_empty() => items,
            other => {
                self.err(
                    &key,
                    format!(
                        "expected a list of backend names like [\"a\", \"b\"], got {}",
                        other.map_or("nothing".into(), |v| v.to_string())
                    ),
                );
                return None;
            }
        };
        let mut out: Vec<DirectorMember> = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let at = format!("{key}[{i}]");
            let member = match item {
                Value::String(s) => Some(DirectorMember {
                    backend: s.clone(),
                    weight: 1,
                }),
                Value::Table(m) => {
                    self.known_keys(m, &at, &["backend", "weight"]);
                    let weight = self.uint(m, &at, "weight", 1, 1, 1_000_000) as u32;
                    if m.contains_key("weight") && kind != Some(DirectorKind::Random) {
                        self.err(
                            join(&at, "weight"),
                            "weights are for type = \"random\" only",
                        );
                    }
                    match self.string(m, &at, "backend") {
                        Some(b) => Some(DirectorMember { backend: b, weight }),
                        None => {
                            self.err(join(&at, "backend"), "missing: the backend's name");
                            None
                        }
                    }
                }
                v => {
                    self.err(&at, format!("expected a backend name, got {v}"));
                    None
                }
            };
            let Some(member) = member else {
                ok = false;
                continue;
            };
            if !backends.contains_key(&member.backend) {
                self.err(
                    &at,
                    format!(
                        "{:?} is not a configured backend (directors group backends, not directors)",
                        member.backend
                    ),
                );
                ok = false;
            } else if out.iter().any(|m| m.backend == member.backend) {
                self.err(&at, format!("{:?} is listed twice", member.backend));
                ok = false;
            }
            out.push(member);
        }
        ok.then_some(out)
    }

    /// `[backends.NAME.probe]`, with Varnish's defaults.
    fn probe(&mut self, t: &Table, p: &str) -> Option<ProbeConfig> {
        self.known_keys(
            t,
            p,
            &[
                "url",
                "interval",
                "timeout",
                "window",
                "threshold",
                "initial",
                "expected_status",
            ],
        );
        let url = self.string(t, p, "url").unwrap_or_else(|| "/".into());
        let url = match url.parse::<http::uri::PathAndQuery>() {
            Ok(u) if url.starts_with('/') => Some(u),
            _ => {
                self.err(
                    join(p, "url"),
                    format!("expected a path like \"/health\", got {url:?}"),
                );
                None
            }
        };
        let window = self.uint(t, p, "window", 8, 1, 64) as u32;
        let threshold = self.uint(t, p, "threshold", 3.min(window as u64), 1, 64) as u32;
        if threshold > window {
            self.err(
                join(p, "threshold"),
                format!("at most window ({window}), got {threshold}"),
            );
        }
        let initial = self.uint(t, p, "initial", threshold.saturating_sub(1) as u64, 0, 64) as u32;
        if initial > window {
            self.err(
                join(p, "initial"),
                format!("at most window ({window}), got {initial}"),
            );
        }
        let interval = self.positive_duration(t, p, "interval", Duration::from_secs(5));
        let timeout = self.positive_duration(t, p, "timeout", Duration::from_secs(2));
        let expected_status = self.uint(t, p, "expected_status", 200, 100, 599) as u16;
        Some(ProbeConfig {
            url: url?,
            interval,
            timeout,
            window,
            threshold: threshold.min(window),
            initial: initial.min(window),
            expected_status,
        })
    }

    /// The TLS files of an `https://` backend, read and checked; on an
    /// `http://` one, the TLS keys are a mistake.
    fn backend_tls(&mut self, t: &Table, p: &str, b: &BackendConfig) -> Option<BackendTls> {
        let path = |r: &mut Self, key| r.string(t, p, key).map(PathBuf::from);
        let settings = TlsSettings {
            ca_file: path(self, "ca_file"),
            client_cert: path(self, "client_cert"),
            client_key: path(self, "client_key"),
            http2: b.http2,
        };
        if b.address.scheme_str() != Some("https") {
            for (key, set) in [
                ("ca_file", &settings.ca_file),
                ("client_cert", &settings.client_cert),
                ("client_key", &settings.client_key),
            ] {
                if set.is_some() {
                    self.err(join(p, key), "only for https:// backends");
                }
            }
            return None;
        }
        match BackendTls::load(&b.address, b.host_header.as_deref(), settings) {
            Ok(tls) => Some(tls),
            Err(issues) => {
                for (key, m) in issues {
                    self.err(join(p, key), m);
                }
                None
            }
        }
    }

    fn log(&mut self, t: &Table) -> LogConfig {
        let p = "log";
        self.known_keys(t, p, &["level", "access_log", "access_log_format"]);
        let level = self.string(t, p, "level").unwrap_or_else(|| "info".into());
        if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
            self.err(
                "log.level",
                format!("not a log filter like \"info\" or \"inlay=debug\": {level:?}"),
            );
        }
        let access_log = match self.string(t, p, "access_log").as_deref() {
            None | Some("stdout") => AccessLogTarget::Stdout,
            Some("stderr") => AccessLogTarget::Stderr,
            Some("off") | Some("") => AccessLogTarget::Off,
            Some(path) => AccessLogTarget::File(PathBuf::from(path)),
        };
        let access_log_format = match self.string(t, p, "access_log_format").as_deref() {
            None | Some("combined") => AccessLogFormat::Combined,
            Some("json") => AccessLogFormat::Json,
            Some(other) => {
                self.err(
                    "log.access_log_format",
                    format!("expected \"combined\" or \"json\", got {other:?}"),
                );
                AccessLogFormat::Combined
            }
        };
        LogConfig {
            level,
            access_log,
            access_log_format,
        }
    }

    fn cache(&mut self, t: &Table) -> CacheConfig {
        let p = "cache";
        self.known_keys(
            t,
            p,
            &[
                "dir",
                "memory_size",
                "disk_size",
                "disk_index_cache",
                "default_ttl",
                "default_grace",
                "default_keep",
                "max_object_size",
                "purge_allow",
                "accept_encoding",
                "strip_request_headers",
            ],
        );
        let mut purge_allow = Vec::new();
        for (i, s) in self
            .strings(t, p, "purge_allow")
            .unwrap_or_else(|| vec!["127.0.0.1/32".into(), "::1/128".into()])
            .iter()
            .enumerate()
        {
            match IpNet::parse(s) {
                Ok(n) => purge_allow.push(n),
                Err(m) => self.err(format!("cache.purge_allow[{i}]"), m),
            }
        }
        let accept_encoding = self.accept_encoding(t);
        let strip_request_headers = self.strip_request_headers(t);
        let memory_size = self.size(t, p, "memory_size", 256 << 20);
        if memory_size < 1 << 20 {
            self.err(
                "cache.memory_size",
                format!("must be at least 1MiB, got {memory_size}"),
            );
        }
        let disk_index_cache = t
            .contains_key("disk_index_cache")
            .then(|| self.size(t, p, "disk_index_cache", 32 << 20));
        if let Some(n) = disk_index_cache.filter(|n| *n < 1 << 20) {
            self.err(
                "cache.disk_index_cache",
                format!("must be at least 1MiB, got {n}"),
            );
        }
        CacheConfig {
            dir: self.string(t, p, "dir").map(PathBuf::from),
            memory_size,
            disk_size: self.size(t, p, "disk_size", 1 << 30),
            disk_index_cache,
            default_ttl: self.duration(t, p, "default_ttl", Duration::from_secs(120)),
            default_grace: self.duration(t, p, "default_grace", Duration::from_secs(10)),
            default_keep: self.duration(t, p, "default_keep", Duration::ZERO),
            max_object_size: self.size(t, p, "max_object_size", 64 << 20),
            purge_allow,
            accept_encoding,
            strip_request_headers,
        }
    }

    /// `cache.accept_encoding`: content-coding tokens, each once; not
    /// `identity` or `*` (identity is what is left when none matches).
    fn accept_encoding(&mut self, t: &Table) -> Vec<String> {
        let Some(list) = self.strings(t, "cache", "accept_encoding") else {
            return vec!["br".into(), "gzip".into()];
        };
        let mut out: Vec<String> = Vec::new();
        for (i, c) in list.iter().enumerate() {
            let path = format!("cache.accept_encoding[{i}]");
            let lower = c.to_ascii_lowercase();
            if lower == "identity" || lower == "*" {
                self.err(path, format!("{c:?} is not a coding to prefer: identity is what is sent when no listed coding is accepted"));
            } else if lower.is_empty()
                || !lower
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.+!".contains(ch))
            {
                self.err(path, format!("{c:?} is not a content-coding name"));
            } else if out.contains(&lower) {
                self.err(path, format!("{c:?} is listed twice"));
            } else {
                out.push(lower);
            }
        }
        out
    }

    /// `cache.strip_request_headers`: header names; Host cannot be one.
    fn strip_request_headers(&mut self, t: &Table) -> Vec<http::HeaderName> {
        let list = self
            .strings(t, "cache", "strip_request_headers")
            .unwrap_or_else(|| STRIP_REQUEST_HEADERS.map(String::from).to_vec());
        let mut out = Vec::new();
        for (i, name) in list.iter().enumerate() {
            let path = format!("cache.strip_request_headers[{i}]");
            match http::HeaderName::from_bytes(name.trim().as_bytes()) {
                Ok(n) if n == http::header::HOST => {
                    self.err(path, "Host is part of the cache key and cannot be stripped")
                }
                Ok(n) => out.push(n),
                Err(_) => self.err(path, format!("{name:?} is not a header name")),
            }
        }
        out
    }

    fn esi(&mut self, t: &Table) -> EsiConfig {
        let p = "esi";
        self.known_keys(
            t,
            p,
            &[
                "max_depth",
                "max_includes",
                "max_concurrency",
                "include_timeout",
                "page_deadline",
                "forward_headers",
                "on_include_error",
                "max_buffered_bytes",
            ],
        );
        let max_buffered_bytes = self.size(t, p, "max_buffered_bytes", 16 << 20);
        if max_buffered_bytes < 64 << 10 {
            self.err(
                "esi.max_buffered_bytes",
                format!("must be at least 64KiB, got {max_buffered_bytes}"),
            );
        }
        let forward_headers = self
            .strings(t, p, "forward_headers")
            .unwrap_or_else(|| {
                ["accept-language", "user-agent", "accept"]
                    .map(String::from)
                    .to_vec()
            })
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let on_include_error = match self.string(t, p, "on_include_error").as_deref() {
            None | Some("omit") => inlay_esi::OnIncludeError::Omit,
            Some("fail") => inlay_esi::OnIncludeError::Fail,
            Some(other) => {
                self.err(
                    "esi.on_include_error",
                    format!("expected \"omit\" or \"fail\", got {other:?}"),
                );
                inlay_esi::OnIncludeError::Omit
            }
        };
        EsiConfig {
            max_depth: self.uint(t, p, "max_depth", 5, 0, 64) as u32,
            max_includes: self.uint(t, p, "max_includes", 256, 1, 100_000) as usize,
            max_concurrency: self.uint(t, p, "max_concurrency", 64, 1, 10_000) as usize,
            include_timeout: self.duration(t, p, "include_timeout", Duration::from_secs(10)),
            page_deadline: self.duration(t, p, "page_deadline", Duration::from_secs(30)),
            forward_headers,
            on_include_error,
            max_buffered_bytes: usize::try_from(max_buffered_bytes).unwrap_or(usize::MAX),
        }
    }

    fn policy(&mut self, t: &Table) -> Option<PolicyConfig> {
        let p = "policy";
        self.known_keys(
            t,
            p,
            &[
                "path",
                "config",
                "cpu_time",
                "memory",
                "max_host_calls",
                "max_subrequests",
                "max_subrequest_bytes",
                "max_instances",
                "instance_wait",
                "host_wait",
                "prewarm",
                "pre_instantiate",
                "memo_size",
            ],
        );
        let path = self.string(t, p, "path");
        if path.is_none() {
            self.err("policy.path", "missing: the policy's .wasm file");
        }
        let d = PolicyConfig::with_defaults(PathBuf::new());
        let mut config = BTreeMap::new();
        if let Some(ct) = self.table(t, p, "config") {
            for (k, v) in ct {
                let val = match v {
                    Value::String(s) => s.clone(),
                    Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => v.to_string(),
                    v => {
                        self.err(
                            format!("policy.config.{k}"),
                            format!("expected a string, number or boolean, got {v}"),
                        );
                        continue;
                    }
                };
                config.insert(k.clone(), val);
            }
        }
        let instance_wait = self.duration(t, p, "instance_wait", d.instance_wait);
        if instance_wait > MAX_INSTANCE_WAIT {
            self.err(
                "policy.instance_wait",
                format!("{instance_wait:?} is above the limit of {MAX_INSTANCE_WAIT:?}"),
            );
        }
        let host_wait = self.duration(t, p, "host_wait", d.host_wait);
        if host_wait < Duration::from_millis(1) || host_wait > MAX_HOST_WAIT {
            self.err(
                "policy.host_wait",
                format!("{host_wait:?} is not between 1ms and {MAX_HOST_WAIT:?}"),
            );
        }
        let pc = PolicyConfig {
            path: PathBuf::from(path.clone().unwrap_or_default()),
            config,
            cpu_time: self.duration(t, p, "cpu_time", d.cpu_time),
            memory: self.size(t, p, "memory", d.memory),
            max_host_calls: self.uint(
                t,
                p,
                "max_host_calls",
                d.max_host_calls.into(),
                1,
                u32::MAX.into(),
            ) as u32,
            max_subrequests: self.uint(t, p, "max_subrequests", d.max_subrequests.into(), 0, 10_000)
                as u32,
            max_subrequest_bytes: self.size(t, p, "max_subrequest_bytes", d.max_subrequest_bytes),
            max_instances: self.uint(t, p, "max_instances", d.max_instances.into(), 1, 100_000)
                as u32,
            instance_wait: instance_wait.min(MAX_INSTANCE_WAIT),
            host_wait: host_wait.clamp(Duration::from_millis(1), MAX_HOST_WAIT),
            prewarm: self.boolean(t, p, "prewarm", d.prewarm),
            pre_instantiate: self.boolean(t, p, "pre_instantiate", d.pre_instantiate),
            memo_size: self.size(t, p, "memo_size", d.memo_size),
        };
        path.map(|_| pc)
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(c.default_backend().name, "default");
    }

    #[test]
    fn metrics_are_on_by_default_and_can_be_turned_off() {
        let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";
        assert!(Config::from_toml(backend).unwrap().metrics.enabled);
        let off = Config::from_toml(&format!("{backend}[metrics]\nenabled = false")).unwrap();
        assert!(!off.metrics.enabled);
        let err =
            Config::from_toml(&format!("{backend}[metrics]\nenabled = 1\nport = 9")).unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("expected Invalid, got {err:?}")
        };
        let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["metrics.port", "metrics.enabled"], "{issues:#?}");
    }

    #[test]
    fn disk_index_cache_is_optional_and_at_least_a_mib() {
        let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";
        assert_eq!(
            Config::from_toml(backend).unwrap().cache.disk_index_cache,
            None
        );
        let set = Config::from_toml(&format!("{backend}[cache]\ndisk_index_cache = \"64MiB\""));
        assert_eq!(set.unwrap().cache.disk_index_cache, Some(64 << 20));
        for bad in ["0", "1000", "\"lots\""] {
            let err = Config::from_toml(&format!("{backend}[cache]\ndisk_index_cache = {bad}"))
                .unwrap_err();
            let ConfigError::Invalid(issues) = err else {
                panic!("expected Invalid, got {err:?}")
            };
            let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
            assert_eq!(paths, ["cache.disk_index_cache"], "{bad}: {issues:#?}");
        }
    }

    #[test]
    fn request_and_subrequest_body_bounds_parse() {
        let c = Config::from_toml(
            "[server]\nmax_request_body = \"1KiB\"\n[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[policy]\npath = \"p.wasm\"\nmax_subrequest_bytes = \"2MiB\"",
        )
        .unwrap();
        assert_eq!(c.server.max_request_body, 1024);
        let pc = c.policy.as_ref().expect("policy");
        assert_eq!(pc.max_subrequest_bytes, 2 << 20);
        assert_eq!(
            crate::cli::policy_source(pc).limits.max_subrequest_bytes,
            2 << 20
        );
        let d = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(d.server.max_request_body, 64 << 20);
    }

    #[test]
    fn request_id_and_server_timing_settings() {
        let d = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(
            d.server.request_id_header.as_ref().map(|h| h.as_str()),
            Some("x-request-id")
        );
        assert!(d.server.trust_request_id);
        assert!(!d.server.server_timing);
        let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"";
        let c = Config::from_toml(&format!(
            "[server]\nrequest_id_header = \"\"\ntrust_request_id = false\nserver_timing = true\n{backend}"
        ))
        .unwrap();
        assert!(c.server.request_id_header.is_none());
        assert!(!c.server.trust_request_id);
        assert!(c.server.server_timing);
        for bad in ["Host", "bad name", "Content-Length"] {
            let err =
                Config::from_toml(&format!("[server]\nrequest_id_header = {bad:?}\n{backend}"))
                    .unwrap_err();
            let ConfigError::Invalid(issues) = err else {
                panic!("expected Invalid, got {err:?}")
            };
            assert_eq!(issues[0].path, "server.request_id_header", "{issues:#?}");
        }
    }

    #[test]
    fn absurd_durations_are_rejected_with_their_path() {
        let text = r#"
            [server]
            idle_timeout = "1000000000000d"
            shutdown_timeout = 9223372036854775807
            [cache]
            default_ttl = "36500d"
            [backends.default]
            address = "http://127.0.0.1:8080"
        "#;
        let err = Config::from_toml(text).unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("expected Invalid, got {err:?}")
        };
        let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            ["server.idle_timeout", "server.shutdown_timeout"],
            "{issues:#?}"
        );
        assert!(issues[0].message.contains("at most"), "{issues:#?}");
        // A century is accepted (a TTL of years is legitimate).
        let c = Config::from_toml(
            "[cache]\ndefault_ttl = \"36500d\"\n[backends.default]\naddress = \"http://127.0.0.1:8080\"",
        )
        .unwrap();
        assert_eq!(c.cache.default_ttl, Duration::from_secs(36_500 * 86_400));
    }

    #[test]
    fn send_timeouts_have_defaults_and_must_not_be_zero() {
        let c = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(c.server.send_timeout, Duration::from_secs(600));
        assert_eq!(c.server.idle_send_timeout, Duration::from_secs(60));
        let text = "[server]\nsend_timeout = \"0s\"\nidle_send_timeout = 0\n";
        let ConfigError::Invalid(issues) = Config::from_toml(text).unwrap_err() else {
            panic!("expected Invalid")
        };
        let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
        assert!(paths.contains(&"server.send_timeout"), "{issues:#?}");
        assert!(paths.contains(&"server.idle_send_timeout"), "{issues:#?}");
    }

    #[test]
    fn every_error_is_reported_with_its_path_and_value() {
        let text = r#"
            [server]
            listen = ["nonsense"]
            idle_timeout = "forever"
            [backends.api]
            address = "ftp://x"
            connect_timeout = 3.5
            colour = "red"
        "#;
        let err = Config::from_toml(text).unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("expected Invalid, got {err:?}")
        };
        let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
        for want in [
            "server.listen[0]",
            "server.idle_timeout",
            "backends.api.address",
            "backends.api.connect_timeout",
            "backends.api.colour",
        ] {
            assert!(paths.contains(&want), "missing {want} in {issues:#?}");
        }
        let text = format!("{}", ConfigError::Invalid(issues));
        assert!(text.contains("\"nonsense\""), "{text}");
        assert!(text.contains("forever"), "{text}");
    }

    #[test]
    fn policy_replay_size_parses_and_bad_ones_are_named() {
        let base =
            "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.policy.unwrap().memo_size, 16 << 20);
        let c = Config::from_toml(&format!("{base}memo_size = \"1MiB\"")).unwrap();
        assert_eq!(c.policy.unwrap().memo_size, 1 << 20);
        let c = Config::from_toml(&format!("{base}memo_size = 0")).unwrap();
        assert_eq!(c.policy.unwrap().memo_size, 0);
        let err = Config::from_toml(&format!("{base}memo_size = \"lots\"")).unwrap_err();
        assert!(err.to_string().contains("policy.memo_size"), "{err}");
    }

    #[test]
    fn policy_instance_wait_parses_and_is_bounded() {
        let base =
            "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.policy.unwrap().instance_wait, Duration::from_secs(1));
        let c = Config::from_toml(&format!("{base}instance_wait = \"250ms\"")).unwrap();
        assert_eq!(c.policy.unwrap().instance_wait, Duration::from_millis(250));
        let c = Config::from_toml(&format!("{base}instance_wait = 0")).unwrap();
        assert_eq!(c.policy.unwrap().instance_wait, Duration::ZERO);
        for bad in ["\"2h\"", "\"soon\""] {
            let err = Config::from_toml(&format!("{base}instance_wait = {bad}")).unwrap_err();
            assert!(
                err.to_string().contains("policy.instance_wait"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn policy_host_wait_parses_and_is_bounded() {
        let base =
            "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.policy.unwrap().host_wait, Duration::from_secs(10));
        let c = Config::from_toml(&format!("{base}host_wait = \"2s\"")).unwrap();
        assert_eq!(c.policy.unwrap().host_wait, Duration::from_secs(2));
        for bad in ["0", "\"1h\"", "\"soon\""] {
            let err = Config::from_toml(&format!("{base}host_wait = {bad}")).unwrap_err();
            assert!(err.to_string().contains("policy.host_wait"), "{bad}: {err}");
        }
    }

    #[test]
    fn pre_instantiation_is_on_unless_turned_off() {
        let base =
            "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
        assert!(
            Config::from_toml(base)
                .unwrap()
                .policy
                .unwrap()
                .pre_instantiate
        );
        let c = Config::from_toml(&format!("{base}pre_instantiate = false")).unwrap();
        assert!(!c.policy.unwrap().pre_instantiate);
        let err = Config::from_toml(&format!("{base}pre_instantiate = \"no\"")).unwrap_err();
        assert!(err.to_string().contains("policy.pre_instantiate"), "{err}");
    }

    #[test]
    fn esi_failures_are_left_out_unless_fail_is_asked_for() {
        let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[esi]\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.esi.on_include_error, inlay_esi::OnIncludeError::Omit);
        let c = Config::from_toml(&format!("{base}on_include_error = \"fail\"")).unwrap();
        assert_eq!(c.esi.on_include_error, inlay_esi::OnIncludeError::Fail);
        let err = Config::from_toml(&format!("{base}on_include_error = \"cut\"")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("esi.on_include_error"), "{text}");
        assert!(text.contains("\"cut\""), "{text}");
    }

    #[test]
    fn esi_buffered_bytes_has_a_default_and_a_floor() {
        let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[esi]\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.esi.max_buffered_bytes, 16 << 20);
        let c = Config::from_toml(&format!("{base}max_buffered_bytes = \"1MiB\"")).unwrap();
        assert_eq!(c.esi.max_buffered_bytes, 1 << 20);
        let err = Config::from_toml(&format!("{base}max_buffered_bytes = 10")).unwrap_err();
        assert!(err.to_string().contains("esi.max_buffered_bytes"), "{err}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = Config::from_toml("[server\nlisten=").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax(_)));
    }

    #[test]
    fn quick_flags_override_the_file() {
        let mut c = Config::embedded_default();
        c.apply_overrides(&Overrides {
            listen: vec![":7000".into()],
            backend: Some("127.0.0.1:9000".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.server.listen, vec!["0.0.0.0:7000".parse().unwrap()]);
        assert_eq!(c.default_backend().authority(), "127.0.0.1:9000");
    }

    #[test]
    fn tls_listeners_and_certificates_parse_and_bad_ones_are_named() {
        let c = Config::from_toml(
            "[server]\nlisten = [\"127.0.0.1:6081\", \"https://127.0.0.1:6443\", \"http://:80\"]\n\
             [[server.tls]]\ncert = \"a.pem\"\nkey = \"a.key\"\nnames = [\"a.example\", \"*.b.example\"]\n\
             [[server.tls]]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
             [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
        )
        .unwrap();
        let s = &c.server;
        assert_eq!(s.listen.len(), 2);
        assert_eq!(s.listen_tls, vec!["127.0.0.1:6443".parse().unwrap()]);
        assert_eq!(s.tls.len(), 2);
        assert_eq!(s.tls[0].names, ["a.example", "*.b.example"]);
        assert!(s.tls[1].names.is_empty());

        let Err(ConfigError::Invalid(issues)) = Config::from_toml(
            "[server]\nlisten = [\"https://127.0.0.1:6443\", \"ftp://:1\"]\n\
             [[server.tls]]\ncert = \"a.pem\"\nnames = [\"A.example\"]\n\
             [[server.tls]]\ncert = \"b.pem\"\nkey = \"\"\nnames = [\"a.example\", \"a.example\"]\n\
             [[server.tls]]\ncert = \"c.pem\"\nkey = \"c.key\"\n\
             [[server.tls]]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
             [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
        ) else {
            panic!("accepted")
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "server.listen[1]",
                "server.tls[0].key",
                "server.tls[0].names[0]",
                "server.tls[1].key",
                "server.tls[1].names[1]",
                "server.tls[3].names",
            ],
            "{issues:?}"
        );
        let Err(ConfigError::Invalid(issues)) = Config::from_toml(
            "[server]\nlisten = [\"https://127.0.0.1:6443\"]\n\
             [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
        ) else {
            panic!("an https listener without a certificate was accepted")
        };
        assert_eq!(issues[0].path, "server.listen");
    }

    #[test]
    fn h2_limits_have_defaults_and_bounds() {
        let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
        let s = Config::embedded_default().server;
        assert_eq!(s.h2_max_concurrent_streams, 256);
        assert_eq!(s.h2_max_header_list_size as usize, s.max_header_size);
        assert_eq!(s.h2_max_pending_accept_reset_streams, 20);
        assert_eq!(s.h2_max_local_error_reset_streams, 1024);
        assert!(s.h2_keep_alive_interval.is_zero());
        assert_eq!(s.h2_keep_alive_timeout, Duration::from_secs(20));
        let s = Config::from_toml(&format!(
            "[server]\nmax_header_size = \"32KiB\"\nh2_keep_alive_interval = \"30s\"\n{backend}"
        ))
        .unwrap()
        .server;
        assert_eq!(
            s.h2_max_header_list_size,
            32 << 10,
            "follows max_header_size"
        );
        assert_eq!(s.h2_keep_alive_interval, Duration::from_secs(30));
        let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
            "[server]\nh2_max_concurrent_streams = 0\nh2_max_header_list_size = \"1KiB\"\n\
             h2_max_pending_accept_reset_streams = -1\nh2_max_local_error_reset_streams = 0\n\
             h2_keep_alive_timeout = \"0s\"\n{backend}"
        )) else {
            panic!("accepted")
        };
        let mut paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                "server.h2_keep_alive_timeout",
                "server.h2_max_concurrent_streams",
                "server.h2_max_header_list_size",
                "server.h2_max_local_error_reset_streams",
                "server.h2_max_pending_accept_reset_streams",
            ],
            "{issues:?}"
        );
    }

    #[test]
    fn tcp_notsent_lowat_has_a_default_and_a_bound() {
        let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
        let s = Config::embedded_default().server;
        assert_eq!(s.tcp_notsent_lowat, 128 << 10);
        let s = Config::from_toml(&format!("[server]\ntcp_notsent_lowat = 0\n{backend}"))
            .unwrap()
            .server;
        assert_eq!(s.tcp_notsent_lowat, 0, "zero leaves the kernel's default");
        let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
            "[server]\ntcp_notsent_lowat = \"2GiB\"\n{backend}"
        )) else {
            panic!("accepted")
        };
        assert_eq!(issues[0].path, "server.tcp_notsent_lowat", "{issues:?}");
    }

    #[test]
    fn listen_backlog_has_a_default_and_bounds() {
        let backend = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n";
        assert_eq!(Config::embedded_default().server.listen_backlog, 1024);
        for bad in ["0", "65536", "\"big\""] {
            let err = Config::from_toml(&format!("[server]\nlisten_backlog = {bad}\n{backend}"))
                .unwrap_err();
            let ConfigError::Invalid(issues) = err else {
                panic!("{bad}: {err:?}");
            };
            assert_eq!(issues[0].path, "server.listen_backlog", "{bad}: {issues:?}");
        }
    }

    #[test]
    fn tarpit_max_has_a_default_and_a_bound() {
        let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
        assert_eq!(Config::embedded_default().server.tarpit_max, 10_000);
        let s = Config::from_toml(&format!("[server]\ntarpit_max = 0\n{backend}"))
            .unwrap()
            .server;
        assert_eq!(s.tarpit_max, 0, "zero: refused connections closed at once");
        let Err(ConfigError::Invalid(issues)) =
            Config::from_toml(&format!("[server]\ntarpit_max = -1\n{backend}"))
        else {
            panic!("accepted")
        };
        assert_eq!(issues[0].path, "server.tarpit_max", "{issues:?}");
    }

    #[test]
    fn proxy_protocol_peers_parse_and_need_proxy_protocol() {
        let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
        let c = Config::from_toml(&format!(
            "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"10.0.0.0/8\", \"::1\"]\n{backend}"
        ))
        .unwrap();
        assert!(c.server.proxy_protocol);
        assert!(c.server.proxy_protocol_from[0].contains("10.1.2.3".parse().unwrap()));
        assert!(!Config::embedded_default().server.proxy_protocol);
        let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
            "[server]\nproxy_protocol = \"yes\"\nproxy_protocol_from = [\"10.0.0.0/33\"]\n{backend}"
        )) else {
            panic!("accepted")
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            ["server.proxy_protocol", "server.proxy_protocol_from[0]"],
            "{issues:?}"
        );
        let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
            "[server]\nproxy_protocol_from = [\"10.0.0.0/8\"]\n{backend}"
        )) else {
            panic!("accepted")
        };
        assert_eq!(issues[0].path, "server.proxy_protocol_from");
    }

    #[test]
    fn the_tls_quick_flags_make_one_default_certificate() {
        let mut c = Config::embedded_default();
        let mut o = Overrides {
            listen: vec!["https://127.0.0.1:0".into()],
            ..Default::default()
        };
        let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
            panic!("https without a certificate")
        };
        assert_eq!(issues[0].path, "-a");
        o.tls_cert = Some("c.pem".into());
        let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
            panic!("a certificate without a key")
        };
        assert_eq!(issues[0].path, "--tls-cert");
        o.tls_key = Some("k.pem".into());
        c.apply_overrides(&o).unwrap();
        assert!(c.server.listen.is_empty());
        assert_eq!(c.server.listen_tls, vec!["127.0.0.1:0".parse().unwrap()]);
        assert_eq!(c.server.tls[0].cert, PathBuf::from("c.pem"));
        assert!(c.server.tls[0].names.is_empty());
    }

    #[test]
    fn sizes_and_networks_parse() {
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("12").unwrap(), 12);
        assert!(parse_size("12 parsecs").is_err());
        let n = IpNet::parse("10.0.0.0/8").unwrap();
        assert!(n.contains("10.2.3.4".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        assert!(
            IpNet::parse("127.0.0.1")
                .unwrap()
                .contains("::ffff:127.0.0.1".parse().unwrap())
        );
        assert!(IpNet::parse("1.2.3.4/33").is_err());
    }

    #[test]
    fn cache_codings_and_stripped_fields_parse_and_bad_ones_are_named() {
        let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.cache.accept_encoding, ["br", "gzip"]);
        assert_eq!(
            c.cache.strip_request_headers.len(),
            STRIP_REQUEST_HEADERS.len()
        );
        let c = Config::from_toml(&format!(
            "{base}[cache]\naccept_encoding = [\"ZSTD\", \"gzip\"]\nstrip_request_headers = []\n"
        ))
        .unwrap();
        assert_eq!(c.cache.accept_encoding, ["zstd", "gzip"]);
        assert!(c.cache.strip_request_headers.is_empty());
        let err = Config::from_toml(&format!(
            "{base}[cache]\naccept_encoding = [\"gzip\", \"identity\", \"GZIP\", \"a b\"]\nstrip_request_headers = [\"x-ok\", \"bad name\", \"Host\"]\n"
        ))
        .unwrap_err();
        let text = err.to_string();
        for want in [
            "cache.accept_encoding[1]",
            "cache.accept_encoding[2]",
            "cache.accept_encoding[3]",
            "cache.strip_request_headers[1]",
            "cache.strip_request_headers[2]",
        ] {
            assert!(text.contains(want), "missing {want} in {text}");
        }
        assert!(!text.contains("accept_encoding[0]"), "{text}");
        assert!(!text.contains("strip_request_headers[0]"), "{text}");
    }

    fn admin_issues(admin: &str) -> Vec<ConfigIssue> {
        let text =
            format!("[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[admin]\n{admin}");
        match Config::from_toml(&text) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(issues)) => issues,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_non_loopback_admin_listener_needs_a_token_file() {
        let issues = admin_issues("listen = \"0.0.0.0:6082\"");
        assert_eq!(issues.len(), 1, "{issues:#?}");
        assert_eq!(issues[0].path, "admin.listen");
        assert!(issues[0].message.contains("token_file"), "{issues:#?}");
        assert!(admin_issues("listen = \"[::]:6082\"")[0].path == "admin.listen");
        // Loopback without a token, and anything with one, are fine.
        assert!(admin_issues("listen = \"127.0.0.1:6082\"").is_empty());
        assert!(admin_issues("listen = \"[::1]:6082\"").is_empty());
        let c = Config::from_toml(
            "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[admin]\nlisten = \":6082\"\ntoken_file = \"/etc/inlay/admin.token\"",
        )
        .unwrap();
        assert_eq!(c.admin, Some("0.0.0.0:6082".parse().unwrap()));
        assert_eq!(
            c.admin_token_file.as_deref(),
            Some(Path::new("/etc/inlay/admin.token"))
        );
        assert_eq!(
            admin_issues("token_file = \"\"")[0].path,
            "admin.token_file"
        );
        assert_eq!(admin_issues("tokenfile = \"x\"")[0].path, "admin.tokenfile");
    }

    #[test]
    fn the_admin_flag_is_refused_on_a_public_address_without_a_token_file() {
        let mut c = Config::embedded_default();
        let mut o = Overrides {
            admin: Some(":6082".into()),
            ..Overrides::default()
        };
        let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
            panic!("accepted a public admin address without a token")
        };
        assert_eq!(issues[0].path, "--admin");
        assert_eq!(c.admin, None);
        o.admin = Some("127.0.0.1:0".into());
        c.apply_overrides(&o).unwrap();
        assert_eq!(c.admin, Some("127.0.0.1:0".parse().unwrap()));
        c.admin_token_file = Some("t".into());
        o.admin = Some(":6082".into());
        c.apply_overrides(&o).unwrap();
    }
}
