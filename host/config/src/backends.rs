//! `[backends.NAME]`, their probes and TLS settings, and `[directors.NAME]`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::component::ComponentConfig;
use super::read::{Reader, Table, Value, join};

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
    /// `https://` backends: roots and client certificate (`ca_file`,
    /// `client_cert`, `client_key`); the resolve step reads the files.
    pub tls: Option<TlsSettings>,
    /// `http2`: HTTP/2 to the origin (offered in ALPN over TLS; prior
    /// knowledge over `http://`).
    pub http2: bool,
    /// `[backends.NAME.probe]`: the health probe, if any.
    pub probe: Option<ProbeConfig>,
    /// How long an idle kept-alive connection stays in the pool.
    pub keepalive_timeout: Duration,
    /// Idle connections kept for reuse (0: a connection per request).
    pub max_idle_connections: usize,
    /// `component = "app.wasm"`: the backend is a `wasi:http` component
    /// served in-process (its `address` is then `http://NAME`, which is
    /// what an absolute ESI include or an outgoing request names it by).
    pub component: Option<ComponentConfig>,
}

/// What `[backends.NAME]` says about TLS, as written in the file (the
/// resolve step reads the files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ca_file`: PEM certificates to trust instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// `client_cert`: PEM certificate chain presented to the origin.
    pub client_cert: Option<PathBuf>,
    /// `client_key`: PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// `http2`: offer `h2` in ALPN.
    pub http2: bool,
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

impl BackendConfig {
    pub(super) fn with_defaults(name: String, address: Uri) -> Self {
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
            component: None,
        }
    }

    /// Backend `name` served by `component`.
    pub fn component(name: String, component: ComponentConfig) -> Self {
        Self {
            address: component_address(&name),
            component: Some(component),
            ..Self::with_defaults(name, Uri::from_static("http://x"))
        }
    }

    /// TLS for an `https://` address (the settings it has, or the system
    /// roots and no client certificate); none for `http://`. The files are
    /// read by the resolve step, not here.
    pub(super) fn tls_for_scheme(&mut self) {
        self.tls = match self.address.scheme_str() {
            Some("https") => Some(self.tls.take().unwrap_or(TlsSettings {
                http2: self.http2,
                ..TlsSettings::default()
            })),
            _ => None,
        };
    }

    /// `host:port` of the backend, for logs and the Host header fallback.
    pub fn authority(&self) -> String {
        self.address
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

/// The address of component backend `name`: `http://NAME`.
fn component_address(name: &str) -> Uri {
    format!("http://{name}")
        .parse()
        .unwrap_or_else(|_| Uri::from_static("http://component"))
}

pub(super) fn parse_backend_uri(s: &str) -> Result<Uri, String> {
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

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Reader {
    /// `[backends.NAME]`, `default_backend` and `[directors.NAME]`: the
    /// backends, the default's name (the only backend when there is one)
    /// and the directors, which must not shadow a backend.
    pub(super) fn backends(
        &mut self,
        root: &Table,
    ) -> (
        BTreeMap<String, BackendConfig>,
        String,
        BTreeMap<String, DirectorConfig>,
    ) {
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
        (backends, default_backend, directors)
    }

    fn backend(&mut self, t: &Table, p: &str, name: &str) -> Option<BackendConfig> {
        if let Some(component) = self.component(t, p) {
            return Some(self.component_backend(t, p, name, component));
        }
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
                    "missing (e.g. address = \"http://127.0.0.1:8080\", or component = \"app.wasm\")",
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
            component: None,
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
        self.no_component_keys(t, p);
        self.unknown_keys(t, p);
        address.map(|_| BackendConfig { tls, ..b })
    }

    /// A component backend: the settings an origin shares with it
    /// (`host_header`, the response timeouts, `max_connections`, `probe`).
    fn component_backend(
        &mut self,
        t: &Table,
        p: &str,
        name: &str,
        component: ComponentConfig,
    ) -> BackendConfig {
        let d = BackendConfig::component(name.to_owned(), component);
        let b = BackendConfig {
            host_header: self.string(t, p, "host_header"),
            first_byte_timeout: self.duration(t, p, "first_byte_timeout", d.first_byte_timeout),
            between_bytes_timeout: self.duration(
                t,
                p,
                "between_bytes_timeout",
                d.between_bytes_timeout,
            ),
            max_connections: self.uint(t, p, "max_connections", 0, 0, 1_000_000) as usize,
            // Probed in-process: the probe's request is served by the
            // component as any other.
            probe: self
                .table(t, p, "probe")
                .and_then(|pt| self.probe(pt, &join(p, "probe"))),
            ..d
        };
        self.unknown_keys(t, p);
        b
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
            self.unknown_keys(t, &p);
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
        let items = match self.get(t, p, "backends") {
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
                    let weight = self.uint(m, &at, "weight", 1, 1, 1_000_000) as u32;
                    if m.contains_key("weight") && kind != Some(DirectorKind::Random) {
                        self.err(
                            join(&at, "weight"),
                            "weights are for type = \"random\" only",
                        );
                    }
                    let backend = self.string(m, &at, "backend");
                    self.unknown_keys(m, &at);
                    match backend {
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
        self.unknown_keys(t, p);
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
    fn backend_tls(&mut self, t: &Table, p: &str, b: &BackendConfig) -> Option<TlsSettings> {
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
        Some(settings)
    }
}
