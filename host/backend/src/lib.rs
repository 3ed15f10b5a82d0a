//! Named backends: a pooled HTTP/1.1 (or HTTP/2) client per origin, over
//! TCP or TLS ([`tls`]), with the connect, first-byte and between-bytes
//! timeouts and the connection cap of its config; directors over them
//! ([`director`]), picked by name as a backend is ([`Backends::pick`]).

pub mod component;
pub mod director;
pub mod probe;
mod timeout_body;
pub mod tls;

use std::collections::HashMap;
use std::sync::Arc;

use http::{Request, Response, Uri, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use inlay_core::ProxyError;
use inlay_core::body::{self, ProxyBody};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use inlay_config::{BackendConfig, Config};
use inlay_metrics::{BackendMetrics, Metrics};
use inlay_runtime::http_component::HttpComponent;
pub use timeout_body::TimeoutBody;

/// One configured origin.
#[derive(Debug)]
pub struct Backend {
    config: BackendConfig,
    /// Its name, shared by the bodies it sends (for their errors).
    name: Arc<str>,
    /// Its TLS, files read, for an `https://` address.
    tls: Option<tls::BackendTls>,
    client: Client<tls::Connector, ProxyBody>,
    slots: Option<Arc<Semaphore>>,
    metrics: Arc<BackendMetrics>,
    health: Arc<probe::Health>,
    /// Stops the health probe when the backend goes.
    _probe: Option<probe::ProbeTask>,
    /// The `wasi:http` component that serves it in-process, for a
    /// component backend (`client` is then unused).
    component: Option<HttpComponent>,
}

/// Every configured backend and director, by name. Cheap to clone (one
/// reference count: a component backend's requests each hold the
/// backends, and a count shared by every thread costs each clone a
/// cache-line transfer).
#[derive(Debug, Clone)]
pub struct Backends {
    inner: Arc<BackendsInner>,
}

/// What the clones of a [`Backends`] share.
#[derive(Debug)]
struct BackendsInner {
    by_name: HashMap<String, Arc<Backend>>,
    directors: HashMap<String, Arc<director::Director>>,
    /// The default backend's name.
    default: String,
    /// The component backends' components, which the next generation
    /// keeps where their files did not change.
    components: component::ComponentSet,
}

/// Where a request goes: the backend picked for it, and when it was
/// picked through a director, the director (for one retry elsewhere).
#[derive(Debug, Clone)]
pub struct Picked {
    backend: Arc<Backend>,
    director: Option<(Arc<director::Director>, u64)>,
    /// The backends a component backend's outgoing requests may go to.
    outbound: Option<Backends>,
}

impl Backends {
    /// Build a client per configured backend, over TLS for those in
    /// `tls` (the resolve step's), and the component backends over their
    /// `components` (loaded by [`component::ComponentSet::load`]),
    /// counting in `metrics`.
    pub fn new(
        config: &Config,
        tls: &tls::BackendTlsSet,
        components: &component::ComponentSet,
        metrics: &Metrics,
    ) -> Self {
        let by_name = config
            .backends
            .iter()
            .map(|(name, b)| {
                let counted = metrics.backend(name);
                let tls = tls.get(name).cloned();
                let component = components.get(name).cloned();
                (
                    name.clone(),
                    Arc::new(Backend::new(b.clone(), tls, component, counted, None)),
                )
            })
            .collect();
        Self::with_directors(by_name, config, components)
    }

    /// The backends of `config`, keeping the clients (connection pools and
    /// connection caps) and probes of those whose settings are the same as
    /// here; a changed backend at the same address starts with the health
    /// its probe had seen.
    pub fn renewed(
        &self,
        config: &Config,
        tls: &tls::BackendTlsSet,
        components: &component::ComponentSet,
        metrics: &Metrics,
    ) -> Self {
        let by_name = config
            .backends
            .iter()
            .map(|(name, b)| {
                let tls = tls.get(name).cloned();
                let component = components.get(name).cloned();
                // The TLS files' digest is in its `Debug` text: a changed
                // file renews the backend; so does a component loaded anew.
                let kept = self.inner.by_name.get(name).filter(|old| {
                    format!("{:?}{:?}", old.config, old.tls) == format!("{b:?}{tls:?}")
                        && match (&old.component, &component) {
                            (Some(a), Some(b)) => a.same(b),
                            (None, None) => true,
                            _ => false,
                        }
                });
                let backend = match kept {
                    Some(old) => Arc::clone(old),
                    None => {
                        let seen = self
                            .inner
                            .by_name
                            .get(name)
                            .filter(|old| old.config.address == b.address)
                            .map(|old| old.health.as_ref());
                        Arc::new(Backend::new(
                            b.clone(),
                            tls,
                            component,
                            metrics.backend(name),
                            seen,
                        ))
                    }
                };
                (name.clone(), backend)
            })
            .collect();
        Self::with_directors(by_name, config, components)
    }

    /// `by_name` and `config`'s directors over them.
    fn with_directors(
        by_name: HashMap<String, Arc<Backend>>,
        config: &Config,
        components: &component::ComponentSet,
    ) -> Self {
        let directors = config
            .directors
            .iter()
            .map(|(name, d)| {
                // Validation guarantees every member is a configured backend.
                let members = d
                    .backends
                    .iter()
                    .filter_map(|m| Some((Arc::clone(by_name.get(&m.backend)?), m.weight)))
                    .collect();
                (
                    name.clone(),
                    Arc::new(director::Director::new(d.clone(), members)),
                )
            })
            .collect();
        Self {
            inner: Arc::new(BackendsInner {
                by_name,
                directors,
                default: config.default_backend.clone(),
                components: components.clone(),
            }),
        }
    }

    /// The component backends' components, for the next generation's
    /// [`component::ComponentSet::load`].
    pub fn components(&self) -> &component::ComponentSet {
        &self.inner.components
    }

    /// Whether `name` is a backend or a director (what a policy's
    /// `set-backend` may name).
    pub fn exists(&self, name: &str) -> bool {
        self.inner.by_name.contains_key(name) || self.inner.directors.contains_key(name)
    }

    /// Where a request for backend or director `name` goes; `key` gives
    /// the hash of its cache key ([`director::key_hash`]), asked for only
    /// by a `shard` director.
    pub fn pick(&self, name: &str, key: impl FnOnce() -> u64) -> Option<Picked> {
        if let Some(backend) = self.inner.by_name.get(name) {
            return Some(Picked {
                backend: Arc::clone(backend),
                director: None,
                outbound: self.outbound_of(backend),
            });
        }
        let director = self.inner.directors.get(name)?;
        let key = match director.config().kind {
            inlay_config::DirectorKind::Shard => key(),
            _ => 0,
        };
        let backend = director.pick(key, None)?;
        Some(Picked {
            outbound: self.outbound_of(&backend).or_else(|| {
                // A retry may go to another member, which may be a component.
                (!self.inner.components.is_empty()).then(|| self.clone())
            }),
            backend,
            director: Some((Arc::clone(director), key)),
        })
    }

    /// The backends a request to `backend` may send requests to: all of
    /// them, for a component backend.
    fn outbound_of(&self, backend: &Backend) -> Option<Backends> {
        backend.component.is_some().then(|| self.clone())
    }

    /// A backend by name.
    pub fn get(&self, name: &str) -> Option<&Arc<Backend>> {
        self.inner.by_name.get(name)
    }

    /// The default backend's name.
    pub fn default_name(&self) -> &str {
        &self.inner.default
    }

    /// Every backend.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Backend>> {
        self.inner.by_name.values()
    }

    /// Each backend's health and each director's healthy backends, by
    /// name (the admin API's `GET /stats`): `{"backends": {..},
    /// "directors": {..}}`.
    pub fn health_json(&self) -> serde_json::Value {
        let mut names: Vec<_> = self.inner.by_name.keys().collect();
        names.sort();
        let backends: serde_json::Map<_, _> = names
            .into_iter()
            .map(|n| (n.clone(), self.inner.by_name[n].health.json()))
            .collect();
        let mut names: Vec<_> = self.inner.directors.keys().collect();
        names.sort();
        let directors: serde_json::Map<_, _> = names
            .into_iter()
            .map(|n| (n.clone(), self.inner.directors[n].health_json()))
            .collect();
        serde_json::json!({ "backends": backends, "directors": directors })
    }
}

impl Backend {
    fn new(
        config: BackendConfig,
        tls: Option<tls::BackendTls>,
        component: Option<HttpComponent>,
        metrics: BackendMetrics,
        seen: Option<&probe::Health>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        // The scheme is checked by the HTTPS connector around it.
        connector.enforce_http(false);
        let connector = match &tls {
            Some(t) => t.connector(connector, config.connect_timeout),
            None => tls::BackendTls::plain_connector(connector, config.connect_timeout),
        };
        let client = Client::builder(TokioExecutor::new())
            // `http2` on an `http://` backend: h2c with prior knowledge
            // (over TLS, ALPN decides).
            .http2_only(config.http2 && tls.is_none())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.keepalive_timeout)
            .pool_max_idle_per_host(config.max_idle_connections)
            .build(connector);
        let slots =
            (config.max_connections > 0).then(|| Arc::new(Semaphore::new(config.max_connections)));
        let health = Arc::new(match &config.probe {
            Some(p) => probe::Health::probed(p, seen),
            None => probe::Health::unprobed(),
        });
        metrics.set_healthy(health.is_healthy());
        let probe = config.probe.as_ref().and_then(|p| {
            let via = match &component {
                Some(c) => probe::ProbeVia::Component(c.clone()),
                None => probe::ProbeVia::Client(Box::new(client.clone())),
            };
            probe::start(&config, p, via, Arc::clone(&health), metrics.clone())
        });
        Self {
            name: config.name.as_str().into(),
            config,
            tls,
            client,
            slots,
            metrics: Arc::new(metrics),
            health,
            _probe: probe,
            component,
        }
    }

    /// The component serving it, for a component backend.
    pub fn component(&self) -> Option<&HttpComponent> {
        self.component.as_ref()
    }

    /// Whether the backend may get requests: always, without a probe;
    /// with one, while enough of its latest probes were good.
    pub fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }

    /// The backend's health, shared with its probe.
    pub fn health(&self) -> &Arc<probe::Health> {
        &self.health
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The backend's config.
    pub fn config(&self) -> &BackendConfig {
        &self.config
    }

    /// Whether `authority` (`host[:port]`) names this backend's address or Host override.
    pub fn serves_authority(&self, authority: &str) -> bool {
        let own = self.config.authority();
        authority.eq_ignore_ascii_case(&own)
            || self
                .config
                .host_header
                .as_deref()
                .is_some_and(|h| h.eq_ignore_ascii_case(authority))
    }

    /// Send a request whose URI is a path and query (see [`Backend::send`]);
    /// the error says whether the request is known not to have reached the
    /// origin's application (a connection that failed, or was reset before
    /// any byte of a response), so that it may be sent elsewhere.
    async fn send_once(
        &self,
        req: Request<ProxyBody>,
        outbound: Option<&Backends>,
    ) -> Result<Response<ProxyBody>, (ProxyError, bool)> {
        if !self.is_healthy() {
            self.metrics.not_sent_sick();
            return Err((self.sick(), true));
        }
        let started = self.metrics.start();
        let result = self.send_counted(req, outbound).await;
        let retryable = matches!(&result, Err(e) if e.retryable);
        let result = result.map_err(|e| e.error);
        self.metrics.finished(started, &result);
        result.map_err(|e| (e, retryable))
    }

    fn sick(&self) -> ProxyError {
        ProxyError::BackendDown {
            backend: self.config.name.clone(),
            reason: "sick (its health probe fails)".into(),
        }
    }

    /// Send a request whose URI is a path and query. The `Host` header is the
    /// caller's, replaced by the backend's `host_header` when configured; set
    /// to the backend's address when absent. The response body fails if it
    /// stalls longer than `between_bytes_timeout`. A sick backend gets
    /// nothing: the request fails as one to a down backend does (503).
    /// A component backend sent a request this way has no way out: its
    /// outgoing requests fail ([`Picked::send`] gives it the backends).
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<ProxyBody>, ProxyError> {
        self.send_once(req, None).await.map_err(|(e, _)| e)
    }

    async fn send_counted(
        &self,
        mut req: Request<ProxyBody>,
        outbound: Option<&Backends>,
    ) -> Result<Response<ProxyBody>, Failed> {
        let permit: Option<OwnedSemaphorePermit> = match &self.slots {
            Some(s) => Some(s.clone().try_acquire_owned().map_err(|_| Failed {
                error: ProxyError::BackendBusy {
                    backend: self.config.name.clone(),
                },
                retryable: true,
            })?),
            None => None,
        };
        if let Some(c) = &self.component {
            return self.serve_component(c, req, permit, outbound).await;
        }
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_owned();
        let mut parts = self.config.address.clone().into_parts();
        parts.path_and_query =
            Some(pq.parse().map_err(|_| {
                Failed::not_sent(ProxyError::BadRequest(format!("bad path {pq:?}")))
            })?);
        *req.uri_mut() = Uri::from_parts(parts)
            .map_err(|e| Failed::not_sent(ProxyError::Internal(e.to_string())))?;
        // Backends get HTTP/1.1 whatever the client spoke.
        *req.version_mut() = http::Version::HTTP_11;
        let headers = req.headers_mut();
        if let Some(h) = &self.config.host_header {
            if let Ok(v) = header::HeaderValue::from_str(h) {
                headers.insert(header::HOST, v);
            }
        } else if !headers.contains_key(header::HOST)
            && let Ok(v) = header::HeaderValue::from_str(&self.config.authority())
        {
            headers.insert(header::HOST, v);
        }
        let timeout = self.config.first_byte_timeout;
        let resp = match tokio::time::timeout(timeout, self.client.request(req)).await {
            // The origin may be working on it: not sent again.
            Err(_) => return Err(self.timed_out()),
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(resp)) => resp,
        };
        Ok(self.between_bytes(resp, permit))
    }

    /// A component backend's request, served in-process: within
    /// `first_byte_timeout` for the head, `between_bytes_timeout` between
    /// body chunks, as an origin's.
    async fn serve_component(
        &self,
        c: &HttpComponent,
        mut req: Request<ProxyBody>,
        permit: Option<OwnedSemaphorePermit>,
        outbound: Option<&Backends>,
    ) -> Result<Response<ProxyBody>, Failed> {
        component::prepare(
            &mut req,
            &self.config.name,
            self.config.host_header.as_deref(),
        );
        // The component times the head itself (its instance's worker
        // holds a timer for the request already).
        let timeout = self.config.first_byte_timeout;
        let resp = match component::serve(c, req, outbound.cloned(), timeout).await {
            Err(error) => {
                // A full instance pool never ran the request.
                let retryable = matches!(error, ProxyError::BackendBusy { .. });
                return Err(Failed { error, retryable });
            }
            Ok(resp) => resp,
        };
        Ok(self.between_bytes(resp, permit))
    }

    /// No response head within `first_byte_timeout`.
    fn timed_out(&self) -> Failed {
        Failed {
            error: ProxyError::BackendTimeout {
                backend: self.config.name.clone(),
                timeout: self.config.first_byte_timeout,
            },
            retryable: false,
        }
    }

    /// `resp` with its body bounded by `between_bytes_timeout` (and its
    /// stalls counted), holding `permit` until the body is done.
    fn between_bytes<B>(
        &self,
        resp: Response<B>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<inlay_core::BoxError>,
    {
        let (parts, incoming) = resp.into_parts();
        let body = TimeoutBody::new(
            incoming,
            self.config.between_bytes_timeout,
            Arc::clone(&self.name),
            permit,
        )
        .counting_stalls(self.metrics.enabled().then(|| Arc::clone(&self.metrics)));
        Response::from_parts(parts, body::boxed(body))
    }

    fn classify(&self, e: hyper_util::client::legacy::Error) -> Failed {
        let backend = self.config.name.clone();
        // The source chain says more than the top-level message.
        let mut reason = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            reason.push_str(": ");
            reason.push_str(&s.to_string());
            src = s.source();
        }
        // A connect timeout is a down backend (503), as in Varnish; only a
        // backend that accepted the request and then stalled is a 504.
        let retryable = e.is_connect() || reset_before_response(&e);
        let error = if e.is_connect() {
            ProxyError::BackendDown { backend, reason }
        } else {
            ProxyError::BackendProtocol { backend, reason }
        };
        Failed { error, retryable }
    }
}

/// Why a send failed, and whether the request may go to another backend.
struct Failed {
    error: ProxyError,
    retryable: bool,
}

impl Failed {
    /// A request that cannot be sent anywhere.
    fn not_sent(error: ProxyError) -> Self {
        Self {
            error,
            retryable: false,
        }
    }
}

/// A connection closed or reset before any byte of the response head: the
/// request was not answered, and an idempotent one may be sent again.
fn reset_before_response(e: &hyper_util::client::legacy::Error) -> bool {
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        src = s.source();
    }
    false
}

impl Picked {
    /// The backend picked.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        self.backend.name()
    }

    /// Send `req` to the backend picked ([`Backend::send`]). Through a
    /// director, an idempotent request without a body whose connection
    /// failed, or was reset before any response byte, is sent once more,
    /// to another backend of the director.
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<ProxyBody>, ProxyError> {
        let again = match &self.director {
            Some(_) if replayable(&req) => {
                let mut copy = Request::new(body::empty());
                *copy.method_mut() = req.method().clone();
                *copy.uri_mut() = req.uri().clone();
                *copy.version_mut() = req.version();
                *copy.headers_mut() = req.headers().clone();
                Some(copy)
            }
            _ => None,
        };
        match self.backend.send_once(req, self.outbound.as_ref()).await {
            Err((error, true)) => {
                let (Some(again), Some((director, key))) = (again, &self.director) else {
                    return Err(error);
                };
                let Some(other) = director.pick(*key, Some(&self.backend)) else {
                    return Err(error);
                };
                self.backend.metrics.retried_elsewhere();
                if let Some(retries) = director.log_retry() {
                    tracing::warn!(
                        director = director.name(),
                        failed = self.backend.name(),
                        retry = other.name(),
                        retries,
                        "{error}; sending the request once more, to another backend ({retries} retries since the last such line)"
                    );
                }
                other
                    .send_once(again, self.outbound.as_ref())
                    .await
                    .map_err(|(e, _)| e)
            }
            result => result.map_err(|(e, _)| e),
        }
    }
}

/// An idempotent request (RFC 9110) with no body: it can be sent again.
fn replayable(req: &Request<ProxyBody>) -> bool {
    use http_body::Body as _;
    req.method().is_idempotent() && req.body().size_hint().exact() == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_tls() -> tls::BackendTlsSet {
        tls::BackendTlsSet::new()
    }

    fn none() -> component::ComponentSet {
        component::ComponentSet::new()
    }

    fn ca_pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_director_is_a_name_set_backend_and_default_backend_may_use() {
        let config = Config::from_toml(
            "default_backend = \"pool\"\n\
             [backends.a]\naddress = \"http://127.0.0.1:1\"\n\
             [backends.b]\naddress = \"http://127.0.0.1:2\"\n\
             [directors.pool]\ntype = \"fallback\"\nbackends = [\"b\", \"a\"]\n",
        )
        .expect("valid");
        let backends = Backends::new(&config, &no_tls(), &none(), &Metrics::new(true));
        // What the policy's set-backend checks, and what the pipeline picks.
        assert!(backends.exists("pool") && backends.exists("a"));
        assert!(!backends.exists("nope"));
        assert_eq!(backends.default_name(), "pool");
        let picked = backends.pick("pool", || unreachable!("only shard hashes"));
        assert_eq!(picked.expect("picked").name(), "b");
        assert_eq!(backends.pick("a", || 0).expect("a backend").name(), "a");
        assert!(backends.pick("nope", || 0).is_none());
    }

    #[test]
    fn a_reload_renews_a_tls_backend_whose_files_or_settings_changed() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem("one")).unwrap();
        let text = format!(
            "[backends.default]\naddress = \"https://127.0.0.1:8443\"\nca_file = {:?}\n",
            ca.display().to_string()
        );
        let config = |t: &str| Config::from_toml(t).expect("valid");
        let metrics = Metrics::new(true);
        // Each generation resolves its files anew, as a reload does.
        let renewed = |old: &Backends, t: &str| {
            let c = config(t);
            old.renewed(
                &c,
                &tls::load_all(&c).expect("files load"),
                &none(),
                &metrics,
            )
        };
        let first = config(&text);
        let old = Backends::new(&first, &tls::load_all(&first).unwrap(), &none(), &metrics);
        let same =
            |new: &Backends| Arc::ptr_eq(old.get("default").unwrap(), new.get("default").unwrap());
        assert!(same(&renewed(&old, &text)), "nothing changed: pool kept");
        let http2 = format!("{text}http2 = true\n");
        assert!(!same(&renewed(&old, &http2)));
        // Same path, new contents: the file is read again and the client renewed.
        std::fs::write(&ca, ca_pem("two")).unwrap();
        assert!(!same(&renewed(&old, &text)));
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    fn no_tls() -> tls::BackendTlsSet {
        tls::BackendTlsSet::new()
    }

    fn none() -> component::ComponentSet {
        component::ComponentSet::new()
    }

    /// A config whose backend `default` is probed at `/health` on a port
    /// nobody listens on (`port` varies it, so each is a changed backend).
    fn probed(port: u16) -> Config {
        Config::from_toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{port}\"\n\
             [backends.default.probe]\nurl = \"/health\"\ninterval = \"50ms\"\n"
        ))
        .expect("valid")
    }

    #[tokio::test]
    async fn a_probe_stops_when_its_backend_is_dropped_after_twenty_reloads() {
        let metrics = Metrics::new(true);
        let mut current = Backends::new(&probed(1), &no_tls(), &none(), &metrics);
        let mut gone = Vec::new();
        for i in 0..20 {
            let next = current.renewed(&probed(2 + i), &no_tls(), &none(), &metrics);
            // The probe task holds the health; nothing else does once the
            // generation's backends are dropped.
            gone.push(Arc::downgrade(current.get("default").unwrap().health()));
            current = next;
        }
        let kept = current.renewed(&probed(21), &no_tls(), &none(), &metrics);
        assert!(
            Arc::ptr_eq(
                kept.get("default").unwrap(),
                current.get("default").unwrap()
            ),
            "an unchanged probed backend keeps its probe"
        );
        for _ in 0..200 {
            if gone.iter().all(|w| w.upgrade().is_none()) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let alive = gone.iter().filter(|w| w.upgrade().is_some()).count();
        assert_eq!(alive, 0, "probe tasks of dropped backends still run");
        assert!(current.get("default").unwrap().health().json()["probe"] == true);
    }
}
