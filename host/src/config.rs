//! The typed host configuration: read from TOML, validated at start-up.
//!
//! Each section is deserialized into a raw struct whose every field is a
//! [`Setting`], converted on its own, so that one bad value does not stop
//! the rest (serde stops at the first error); one validation pass then
//! applies defaults and limits and reports every issue with its key path.
//! Every setting and its default is listed in `host/CONFIG.md`; keep the
//! two in step.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use toml::Value;

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
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Maximum concurrent client connections; more wait in the accept queue.
    pub max_connections: usize,
    /// A client must send its whole request head within this time.
    pub header_read_timeout: Duration,
    /// A connection with no traffic and no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// Largest request head accepted, in bytes.
    pub max_header_size: usize,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_timeout: Duration,
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
}

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
    /// Concurrent policy instances (requests running a policy at once).
    pub max_instances: u32,
    /// Start requests from a snapshot taken after one synthetic request.
    pub prewarm: bool,
    /// Keep one instance per worker thread made ahead of the request that
    /// needs it, so that requests do not wait for instantiation.
    pub pre_instantiate: bool,
    /// Bytes of recorded policy paths kept to answer repeated requests
    /// without an instance; 0 runs every request's policy live.
    pub memo_size: u64,
}

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
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let mut check = Check::default();
        let cfg = check.config(raw);
        if check.issues.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid(check.issues))
        }
    }

    /// Apply `-a`, `-b`, `--policy`, `--cache-dir` overrides, then validate again.
    pub fn apply_overrides(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        let mut issues = Vec::new();
        if !o.listen.is_empty() {
            self.server.listen.clear();
            for a in &o.listen {
                match parse_listen(a) {
                    Ok(addr) => self.server.listen.push(addr),
                    Err(m) => issues.push(issue("-a", m)),
                }
            }
        }
        if let Some(b) = &o.backend {
            match parse_backend_uri(b) {
                Ok(address) => {
                    let name = self.default_backend.clone();
                    let entry = self
                        .backends
                        .entry(name.clone())
                        .or_insert_with(|| BackendConfig::with_defaults(name, address.clone()));
                    entry.address = address;
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
                Ok(addr) => self.admin = Some(addr),
                Err(m) => issues.push(issue("--admin", m)),
            }
        }
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues))
        }
    }

    /// The backend a request goes to when the policy chose none.
    pub fn default_backend(&self) -> &BackendConfig {
        // Validation guarantees the default backend exists.
        &self.backends[&self.default_backend]
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
            max_instances: 1000,
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
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "only http:// backends are supported (TLS to origins is not built yet): {s:?}"
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

/// One setting as written, converted on its own: a bad value becomes an
/// issue without stopping the settings after it, as serde would.
#[derive(Debug, Default)]
enum Setting<T> {
    #[default]
    Absent,
    Given(T),
    Bad(String),
}

impl<T: DeserializeOwned> Setting<T> {
    fn from_value(v: Value) -> Self {
        match v.try_into() {
            Ok(t) => Self::Given(t),
            Err(e) => Self::Bad(e.message().to_owned()),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Setting<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Self::from_value)
    }
}

/// A list, or one item alone; each item converted on its own.
#[derive(Debug)]
struct List<T>(Vec<Setting<T>>);

impl<'de, T: DeserializeOwned> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(List(match Value::deserialize(d)? {
            Value::Array(items) => items.into_iter().map(Setting::from_value).collect(),
            one => vec![Setting::from_value(one)],
        }))
    }
}

/// A duration: `"500ms"`, `"30s"`, `"5m"`, or an integer of seconds.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Value")]
struct Secs(Duration);

impl TryFrom<Value> for Secs {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => humantime::parse_duration(&s)
                .map(Secs)
                .map_err(|e| format!("{e} in {s:?} (use e.g. \"500ms\", \"30s\", \"5m\")")),
            Value::Integer(i) if i >= 0 => Ok(Secs(Duration::from_secs(i as u64))),
            v => Err(format!("expected a duration like \"30s\", got {v}")),
        }
    }
}

impl From<Secs> for Duration {
    fn from(s: Secs) -> Self {
        s.0
    }
}

impl From<Size> for u64 {
    fn from(s: Size) -> Self {
        s.0
    }
}

/// A size: an integer of bytes or a string like `"64MiB"`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Value")]
struct Size(u64);

impl TryFrom<Value> for Size {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::Integer(i) if i >= 0 => Ok(Size(i as u64)),
            Value::String(s) => parse_size(&s).map(Size),
            v => Err(format!("expected a size like \"64MiB\", got {v}")),
        }
    }
}

/// A listen address; `:6081` means all interfaces.
#[derive(Debug, Deserialize)]
#[serde(try_from = "String")]
struct Listen(SocketAddr);

impl TryFrom<String> for Listen {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        parse_listen(&s).map(Listen)
    }
}

/// A backend's `http://host:port`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "String")]
struct BackendUri(Uri);

impl TryFrom<String> for BackendUri {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        parse_backend_uri(&s).map(BackendUri)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IpNet::parse(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A value of `[policy.config]`: strings, numbers and booleans, as text.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Value")]
struct PolicyValue(String);

impl TryFrom<Value> for PolicyValue {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(PolicyValue(s)),
            Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => {
                Ok(PolicyValue(v.to_string()))
            }
            v => Err(format!("expected a string, number or boolean, got {v}")),
        }
    }
}

/// Keys no section knows, kept to be reported.
type Unknown = BTreeMap<String, Value>;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawConfig {
    server: Setting<RawServer>,
    backends: Setting<BTreeMap<String, Setting<RawBackend>>>,
    default_backend: Setting<String>,
    log: Setting<RawLog>,
    cache: Setting<RawCache>,
    esi: Setting<RawEsi>,
    policy: Setting<RawPolicy>,
    admin: Setting<RawAdmin>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawServer {
    listen: Option<List<Listen>>,
    max_connections: Setting<i64>,
    header_read_timeout: Setting<Secs>,
    idle_timeout: Setting<Secs>,
    max_header_size: Setting<Size>,
    shutdown_timeout: Setting<Secs>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawBackend {
    address: Setting<BackendUri>,
    host_header: Setting<String>,
    connect_timeout: Setting<Secs>,
    first_byte_timeout: Setting<Secs>,
    between_bytes_timeout: Setting<Secs>,
    max_connections: Setting<i64>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawLog {
    level: Setting<String>,
    access_log: Setting<String>,
    access_log_format: Setting<String>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawCache {
    dir: Setting<PathBuf>,
    memory_size: Setting<Size>,
    disk_size: Setting<Size>,
    default_ttl: Setting<Secs>,
    default_grace: Setting<Secs>,
    default_keep: Setting<Secs>,
    max_object_size: Setting<Size>,
    purge_allow: Option<List<IpNet>>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawEsi {
    max_depth: Setting<i64>,
    max_includes: Setting<i64>,
    max_concurrency: Setting<i64>,
    include_timeout: Setting<Secs>,
    page_deadline: Setting<Secs>,
    forward_headers: Option<List<String>>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawPolicy {
    path: Setting<PathBuf>,
    config: Setting<BTreeMap<String, Setting<PolicyValue>>>,
    cpu_time: Setting<Secs>,
    memory: Setting<Size>,
    max_host_calls: Setting<i64>,
    max_subrequests: Setting<i64>,
    max_instances: Setting<i64>,
    prewarm: Setting<bool>,
    pre_instantiate: Setting<bool>,
    memo_size: Setting<Size>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a table")]
struct RawAdmin {
    listen: Setting<Listen>,
    #[serde(flatten)]
    unknown: Unknown,
}

/// The validation pass: turns raw settings into a [`Config`], collecting
/// every issue with its key path.
#[derive(Default)]
struct Check {
    issues: Vec<ConfigIssue>,
}

impl Check {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue {
            path: path.into(),
            message: message.into(),
        });
    }

    /// The setting's value if given and good; a bad one is reported.
    fn opt<T>(&mut self, path: &str, s: Setting<T>) -> Option<T> {
        match s {
            Setting::Absent => None,
            Setting::Given(t) => Some(t),
            Setting::Bad(m) => {
                self.err(path, m);
                None
            }
        }
    }

    fn get<T, U: From<T>>(&mut self, path: &str, s: Setting<T>, default: U) -> U {
        self.opt(path, s).map_or(default, U::from)
    }

    fn int(&mut self, path: &str, s: Setting<i64>, default: u64, min: u64, max: u64) -> u64 {
        match self.opt(path, s) {
            None => default,
            Some(n) if n >= min as i64 && n as u64 <= max => n as u64,
            Some(n) => {
                self.err(
                    path,
                    format!("expected an integer in {min}..={max}, got {n}"),
                );
                default
            }
        }
    }

    fn list<T>(&mut self, path: &str, l: Option<List<T>>, default: Vec<T>) -> Vec<T> {
        let Some(List(items)) = l else { return default };
        let mut out = Vec::new();
        for (i, s) in items.into_iter().enumerate() {
            out.extend(self.opt(&format!("{path}[{i}]"), s));
        }
        out
    }

    fn unknown(&mut self, prefix: &str, keys: Unknown) {
        for k in keys.into_keys() {
            self.err(join(prefix, &k), "unknown setting");
        }
    }

    fn config(&mut self, raw: RawConfig) -> Config {
        self.unknown("", raw.unknown);
        let server = self.get("server", raw.server, RawServer::default());
        let server = self.server(server);
        let mut backends = BTreeMap::new();
        for (name, b) in self.get("backends", raw.backends, BTreeMap::new()) {
            let path = format!("backends.{name}");
            if !valid_name(&name) {
                self.err(&path, "backend names use letters, digits, '-' and '_'");
            }
            if let Some(b) = self
                .opt(&path, b)
                .and_then(|b| self.backend(b, &path, &name))
            {
                backends.insert(name, b);
            }
        }
        let default_backend = self
            .opt("default_backend", raw.default_backend)
            .or_else(|| {
                (backends.len() == 1)
                    .then(|| backends.keys().next().cloned())
                    .flatten()
            })
            .unwrap_or_else(|| "default".to_owned());
        if !backends.contains_key(&default_backend) {
            if backends.is_empty() {
                self.err(
                    "backends",
                    "at least one backend is required (or pass -b URL)",
                );
            } else {
                self.err(
                    "default_backend",
                    format!(
                        "{default_backend:?} is not a configured backend (have: {})",
                        backends.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
        let log = self.get("log", raw.log, RawLog::default());
        let cache = self.get("cache", raw.cache, RawCache::default());
        let esi = self.get("esi", raw.esi, RawEsi::default());
        let policy = self.opt("policy", raw.policy);
        let admin = self.opt("admin", raw.admin).and_then(|a| {
            self.unknown("admin", a.unknown);
            self.opt("admin.listen", a.listen).map(|l| l.0)
        });
        Config {
            server,
            backends,
            default_backend,
            log: self.log(log),
            cache: self.cache(cache),
            esi: self.esi(esi),
            policy: policy.and_then(|p| self.policy(p)),
            admin,
        }
    }

    fn server(&mut self, s: RawServer) -> ServerConfig {
        self.unknown("server", s.unknown);
        let default_listen = vec![Listen(([127, 0, 0, 1], 6081).into())];
        let listen = self.list("server.listen", s.listen, default_listen);
        let max_header_size = self.get("server.max_header_size", s.max_header_size, 64 << 10);
        if !(8192..=1 << 24).contains(&max_header_size) {
            self.err(
                "server.max_header_size",
                format!("must be between 8KiB and 16MiB, got {max_header_size}"),
            );
        }
        ServerConfig {
            listen: listen.into_iter().map(|l| l.0).collect(),
            max_connections: self.int(
                "server.max_connections",
                s.max_connections,
                10_000,
                1,
                1_000_000,
            ) as usize,
            header_read_timeout: self.get(
                "server.header_read_timeout",
                s.header_read_timeout,
                Duration::from_secs(10),
            ),
            idle_timeout: self.get(
                "server.idle_timeout",
                s.idle_timeout,
                Duration::from_secs(60),
            ),
            max_header_size: max_header_size as usize,
            shutdown_timeout: self.get(
                "server.shutdown_timeout",
                s.shutdown_timeout,
                Duration::from_secs(30),
            ),
        }
    }

    fn backend(&mut self, b: RawBackend, p: &str, name: &str) -> Option<BackendConfig> {
        self.unknown(p, b.unknown);
        let address = &join(p, "address");
        if matches!(b.address, Setting::Absent) {
            self.err(
                address,
                "missing (e.g. address = \"http://127.0.0.1:8080\")",
            );
        }
        let address = self.opt(address, b.address);
        let d = BackendConfig::with_defaults(name.to_owned(), Uri::from_static("http://x"));
        let b = BackendConfig {
            host_header: self.opt(&join(p, "host_header"), b.host_header),
            connect_timeout: self.get(
                &join(p, "connect_timeout"),
                b.connect_timeout,
                d.connect_timeout,
            ),
            first_byte_timeout: self.get(
                &join(p, "first_byte_timeout"),
                b.first_byte_timeout,
                d.first_byte_timeout,
            ),
            between_bytes_timeout: self.get(
                &join(p, "between_bytes_timeout"),
                b.between_bytes_timeout,
                d.between_bytes_timeout,
            ),
            max_connections: self.int(
                &join(p, "max_connections"),
                b.max_connections,
                0,
                0,
                1_000_000,
            ) as usize,
            ..d
        };
        address.map(|a| BackendConfig { address: a.0, ..b })
    }

    fn log(&mut self, l: RawLog) -> LogConfig {
        self.unknown("log", l.unknown);
        let level = self.get("log.level", l.level, "info".into());
        if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
            self.err(
                "log.level",
                format!("not a log filter like \"info\" or \"inlay=debug\": {level:?}"),
            );
        }
        let access_log = match self.opt("log.access_log", l.access_log).as_deref() {
            None | Some("stdout") => AccessLogTarget::Stdout,
            Some("stderr") => AccessLogTarget::Stderr,
            Some("off") | Some("") => AccessLogTarget::Off,
            Some(path) => AccessLogTarget::File(PathBuf::from(path)),
        };
        let access_log_format = match self
            .opt("log.access_log_format", l.access_log_format)
            .as_deref()
        {
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

    fn cache(&mut self, c: RawCache) -> CacheConfig {
        self.unknown("cache", c.unknown);
        let local = ["127.0.0.1/32", "::1/128"]
            .map(|n| IpNet::parse(n).expect("valid"))
            .to_vec();
        let memory_size = self.get("cache.memory_size", c.memory_size, 256 << 20);
        if memory_size < 1 << 20 {
            self.err(
                "cache.memory_size",
                format!("must be at least 1MiB, got {memory_size}"),
            );
        }
        CacheConfig {
            dir: self.opt("cache.dir", c.dir),
            memory_size,
            disk_size: self.get("cache.disk_size", c.disk_size, 1 << 30),
            default_ttl: self.get("cache.default_ttl", c.default_ttl, Duration::from_secs(120)),
            default_grace: self.get(
                "cache.default_grace",
                c.default_grace,
                Duration::from_secs(10),
            ),
            default_keep: self.get("cache.default_keep", c.default_keep, Duration::ZERO),
            max_object_size: self.get("cache.max_object_size", c.max_object_size, 64 << 20),
            purge_allow: self.list("cache.purge_allow", c.purge_allow, local),
        }
    }

    fn esi(&mut self, e: RawEsi) -> EsiConfig {
        self.unknown("esi", e.unknown);
        let forward = ["accept-language", "user-agent", "accept"]
            .map(String::from)
            .to_vec();
        let forward_headers = self.list("esi.forward_headers", e.forward_headers, forward);
        EsiConfig {
            max_depth: self.int("esi.max_depth", e.max_depth, 5, 0, 64) as u32,
            max_includes: self.int("esi.max_includes", e.max_includes, 256, 1, 100_000) as usize,
            max_concurrency: self.int("esi.max_concurrency", e.max_concurrency, 64, 1, 10_000)
                as usize,
            include_timeout: self.get(
                "esi.include_timeout",
                e.include_timeout,
                Duration::from_secs(10),
            ),
            page_deadline: self.get(
                "esi.page_deadline",
                e.page_deadline,
                Duration::from_secs(30),
            ),
            forward_headers: forward_headers
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }

    fn policy(&mut self, p: RawPolicy) -> Option<PolicyConfig> {
        self.unknown("policy", p.unknown);
        if matches!(p.path, Setting::Absent) {
            self.err("policy.path", "missing: the policy's .wasm file");
        }
        let path = self.opt("policy.path", p.path);
        let d = PolicyConfig::with_defaults(PathBuf::new());
        let mut config = BTreeMap::new();
        for (k, v) in self.get("policy.config", p.config, BTreeMap::new()) {
            if let Some(v) = self.opt(&format!("policy.config.{k}"), v) {
                config.insert(k, v.0);
            }
        }
        let pc = PolicyConfig {
            config,
            cpu_time: self.get("policy.cpu_time", p.cpu_time, d.cpu_time),
            memory: self.get("policy.memory", p.memory, d.memory),
            max_host_calls: self.int(
                "policy.max_host_calls",
                p.max_host_calls,
                d.max_host_calls.into(),
                1,
                u32::MAX.into(),
            ) as u32,
            max_subrequests: self.int(
                "policy.max_subrequests",
                p.max_subrequests,
                d.max_subrequests.into(),
                0,
                10_000,
            ) as u32,
            max_instances: self.int(
                "policy.max_instances",
                p.max_instances,
                d.max_instances.into(),
                1,
                100_000,
            ) as u32,
            prewarm: self.get("policy.prewarm", p.prewarm, d.prewarm),
            pre_instantiate: self.get(
                "policy.pre_instantiate",
                p.pre_instantiate,
                d.pre_instantiate,
            ),
            memo_size: self.get("policy.memo_size", p.memo_size, d.memo_size),
            ..d
        };
        path.map(|path| PolicyConfig { path, ..pc })
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
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
}
