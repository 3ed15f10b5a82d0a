//! The admin API: a listener of its own (`[admin] listen`, off by default)
//! that speaks JSON, for operators and load balancers; [`client`] is its
//! command-line client, `inlay admin`.
//!
//! | Route          | What it does                                             |
//! |----------------|----------------------------------------------------------|
//! | `GET /healthz` | 200 while the process lives (no token asked)             |
//! | `GET /readyz`  | 200 once the cache is open and the policy loaded; 503 before, and from the shutdown signal on (no token asked) |
//! | `GET /stats`   | store stats per tier, policy, backends' health, uptime, version |
//! | `POST /purge`  | `{"url": …}` or `{"surrogate_keys": […]}`, `"soft"`      |
//! | `GET /config`  | the running config, secrets redacted                     |
//! | `GET /metrics` | Prometheus text ([`AdminHooks::metrics`])                |
//! | `POST /ban`, `GET /bans` | bans (through [`Invalidator`], [`AdminHooks::bans`]) |
//! | `POST /reload` | a full reload ([`AdminHooks::reload`])                   |
//!
//! With `admin.token_file`, every route but the two probes needs
//! `Authorization: Bearer <token>`. Every route but the probes refuses
//! what a web page could send: a request with an `Origin` field
//! (`admin.allowed_origins` lists the ones served), a Host that is not an
//! IP address, `localhost` or in `admin.allowed_hosts` (DNS rebinding),
//! and a POST whose body is not `application/json` (`application/wasm`
//! for a pushed policy). Errors are JSON: `{"error": "..."}`.

pub mod client;
mod purge_request;
mod server;
mod token;
mod view;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use inlay_cache::HttpCache;
use inlay_core::body::BoxError;
use inlay_runtime::LoadedPolicy;
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{AdminAccess, Config};
use crate::pipeline::Invalidator;

use purge_request::{PurgeRequest, truncated};
pub use server::{AdminServer, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT};
pub use token::{AdminToken, Readiness};
pub use view::config_json;

/// The media type of a policy pushed to `POST /policy/push` (what `inlay
/// admin policy push` sends).
pub const WASM_MEDIA_TYPE: &str = "application/wasm";
/// The media type of the JSON bodies the other POST routes read.
pub const JSON_MEDIA_TYPE: &str = "application/json";

/// Largest request body the admin API reads; past it the answer is 413.
pub const MAX_BODY: usize = 64 << 10;
/// A client must send its request body within this time.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET /metrics`: the Prometheus text.
pub type MetricsHook = Arc<dyn Fn() -> BoxFuture<'static, String> + Send + Sync>;
/// `GET /bans`: the ban list.
pub type BansHook = Arc<dyn Fn() -> Value + Send + Sync>;
/// `POST /reload`: reload the config; what changed, or every error.
pub type ReloadHook = Arc<dyn Fn() -> BoxFuture<'static, Result<Value, Vec<String>>> + Send + Sync>;
/// `GET /config`: the configuration of the current generation.
pub type ConfigHook = Arc<dyn Fn() -> Arc<Config> + Send + Sync>;
/// `GET /stats`: the policy of the current generation, if any.
pub type PolicyHook = Arc<dyn Fn() -> Option<LoadedPolicy> + Send + Sync>;
/// `GET /policy`, `POST /policy/push` and `POST /policy/rollback`: the
/// cluster's policy rollout (`[cluster]`), or with `?component=NAME` that
/// component backend's (the name is the second argument); a JSON answer
/// or why it failed.
pub type RolloutHook = Arc<
    dyn Fn(RolloutCall, Option<String>) -> BoxFuture<'static, Result<Value, String>> + Send + Sync,
>;

/// What the admin API asks of the cluster's policy rollout.
#[derive(Debug)]
pub enum RolloutCall {
    /// `GET /policy`: the version this node runs and the cluster's current.
    Status,
    /// `POST /policy/push`: the component (the request body).
    Push(Bytes),
    /// `POST /policy/rollback`.
    Rollback,
}

/// `POST /purge` and `GET /stats`: the cache new requests use.
pub type CacheHook = Arc<dyn Fn() -> HttpCache + Send + Sync>;
/// `GET /stats`: the health of each backend and director in the current
/// generation, as `{"backends": {..}, "directors": {..}}`.
pub type BackendsHook = Arc<dyn Fn() -> Value + Send + Sync>;

/// What the admin API asks of other parts of the process. A route whose
/// hook is missing answers 501 `{"error": "... not available"}`.
#[derive(Clone, Default)]
pub struct AdminHooks {
    /// `GET /metrics`.
    pub metrics: Option<MetricsHook>,
    /// `POST /purge` and `POST /ban`: the purge path the PURGE and BAN
    /// methods take.
    pub invalidator: Option<Arc<Invalidator>>,
    /// `GET /bans`.
    pub bans: Option<BansHook>,
    /// `POST /reload`: `Ok` answers 200 with its value, `Err` 500 with
    /// `{"error": "reload refused", "errors": [...]}`.
    pub reload: Option<ReloadHook>,
    /// `GET /config`.
    pub config: Option<ConfigHook>,
    /// The policy named in `GET /stats`.
    pub policy: Option<PolicyHook>,
    /// The cache purges and `GET /stats` reach, asked at each request (it
    /// follows a reload that moves `cache.dir`, and holds no old store
    /// open); without it, the one given to [`Admin::cache_opened`].
    pub cache: Option<CacheHook>,
    /// The backends' health in `GET /stats`.
    pub backends: Option<BackendsHook>,
    /// The cluster's policy rollout, and the largest component
    /// `POST /policy/push` reads (`cluster.policy_max_size`).
    pub rollout: Option<(RolloutHook, usize)>,
}

impl std::fmt::Debug for AdminHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminHooks")
            .field("metrics", &self.metrics.is_some())
            .field("invalidator", &self.invalidator.is_some())
            .field("bans", &self.bans.is_some())
            .field("reload", &self.reload.is_some())
            .field("config", &self.config.is_some())
            .field("policy", &self.policy.is_some())
            .field("cache", &self.cache.is_some())
            .field("backends", &self.backends.is_some())
            .field("rollout", &self.rollout.is_some())
            .finish()
    }
}

/// An [`Admin`] held without keeping it alive ([`Admin::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakAdmin(std::sync::Weak<AdminState>);

impl WeakAdmin {
    /// The admin API, while something else holds it.
    pub fn upgrade(&self) -> Option<Admin> {
        self.0.upgrade().map(Admin)
    }
}

/// What the admin API serves: readiness, the cache once open, the token
/// and the hooks. Clones share one state.
#[derive(Clone, Debug)]
pub struct Admin(Arc<AdminState>);

#[derive(Debug)]
struct AdminState {
    readiness: Readiness,
    cache: RwLock<Option<HttpCache>>,
    hooks: RwLock<AdminHooks>,
    token: RwLock<Option<AdminToken>>,
    started: Instant,
    /// One policy push read at a time: each buffers up to
    /// `cluster.policy_max_size`.
    pushing: tokio::sync::Semaphore,
}

impl Admin {
    /// An admin API that asks for `token` (none: no token asked), not ready
    /// until [`cache_opened`](Self::cache_opened).
    pub fn new(token: Option<AdminToken>, hooks: AdminHooks) -> Self {
        Self(Arc::new(AdminState {
            readiness: Readiness::new(),
            cache: RwLock::new(None),
            hooks: RwLock::new(hooks),
            token: RwLock::new(token),
            started: Instant::now(),
            pushing: tokio::sync::Semaphore::new(1),
        }))
    }

    /// The readiness `/readyz` reports.
    pub fn readiness(&self) -> &Readiness {
        &self.0.readiness
    }

    /// The cache is open: purges and stats go to `cache`, and the process
    /// is ready (unless already stopping). Called again, it replaces the cache.
    pub fn cache_opened(&self, cache: HttpCache) {
        *self.0.cache.write() = Some(cache);
        self.0.readiness.set_ready();
    }

    /// A handle that does not keep the admin API's state alive (the
    /// reloader holds one: the admin's hooks hold the reloader).
    pub fn downgrade(&self) -> WeakAdmin {
        WeakAdmin(Arc::downgrade(&self.0))
    }

    /// Ask for `token` from the next request on (a reload read
    /// `admin.token_file` again); `None`: ask for none.
    pub fn set_token(&self, token: Option<AdminToken>) {
        *self.0.token.write() = token;
    }

    /// Change the hooks (the routes see the change at their next request).
    pub fn set_hooks(&self, change: impl FnOnce(&mut AdminHooks)) {
        change(&mut self.0.hooks.write());
    }

    fn hooks(&self) -> AdminHooks {
        self.0.hooks.read().clone()
    }

    fn cache(&self) -> Option<HttpCache> {
        if let Some(current) = &self.0.hooks.read().cache {
            return Some(current());
        }
        self.0.cache.read().clone()
    }

    /// Answer one admin request.
    pub async fn respond<B>(&self, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = req.into_parts();
        let Some(route) = Route::of(parts.uri.path()) else {
            return error(
                StatusCode::NOT_FOUND,
                format!("no such route: {}", parts.uri.path()),
            );
        };
        let method = if parts.method == Method::HEAD {
            Method::GET
        } else {
            parts.method.clone()
        };
        if method != route.method() {
            let mut resp = error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{} takes {}", route.path(), route.method()),
            );
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static(match route.method() {
                    Method::POST => "POST",
                    _ => "GET, HEAD",
                }),
            );
            return resp;
        }
        if !route.is_probe()
            && let Err(refusal) = self.refuse_web_page_requests(&parts)
        {
            return refusal.into();
        }
        if !route.is_probe()
            && let Some(token) = &*self.0.token.read()
            && !token.admits(&parts.headers)
        {
            let mut resp = error(StatusCode::UNAUTHORIZED, "a bearer token is required");
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"inlay admin\""),
            );
            return resp;
        }
        let limit = match (route, &self.hooks().rollout) {
            (Route::PolicyPush, Some((_, max))) => *max,
            _ => MAX_BODY,
        };
        let _pushing = match route {
            Route::PolicyPush => match self.0.pushing.try_acquire() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    return error(
                        StatusCode::CONFLICT,
                        "another policy push is in progress on this node",
                    );
                }
            },
            _ => None,
        };
        if method == Method::POST
            && let Err(refusal) = route.check_content_type(&parts.headers)
        {
            return refusal.into();
        }
        let body = if method == Method::POST {
            match read_body(&parts.headers, body, limit).await {
                Ok(b) => b,
                Err(refusal) => return refusal.into(),
            }
        } else {
            Bytes::new()
        };
        let mut resp = match route {
            Route::Healthz => ok(json!({ "status": "alive" })),
            Route::Readyz => {
                let state = self.0.readiness.state();
                let status = match self.0.readiness.is_ready() {
                    true => StatusCode::OK,
                    false => StatusCode::SERVICE_UNAVAILABLE,
                };
                answer(status, json!({ "status": state }))
            }
            Route::Stats => self.stats().await,
            Route::Purge => self.purge(&body).await,
            Route::Config => match self.hooks().config {
                Some(config) => ok(config_json(&config())),
                None => not_available("the configuration"),
            },
            Route::Metrics => match self.hooks().metrics {
                Some(metrics) => {
                    let mut resp = Response::new(Full::new(Bytes::from(metrics().await)));
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
                    );
                    resp
                }
                None => not_available("metrics"),
            },
            Route::Ban => self.ban(&body).await,
            Route::Bans => match self.hooks().bans {
                Some(bans) => ok(bans()),
                None => not_available("bans"),
            },
            Route::Reload => match self.hooks().reload {
                Some(reload) => match reload().await {
                    Ok(v) => ok(v),
                    Err(errors) => answer(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({ "error": "reload refused", "errors": errors }),
                    ),
                },
                None => not_available("reload"),
            },
            Route::Policy | Route::PolicyPush | Route::PolicyRollback => {
                let component = parts.uri.query().and_then(|q| {
                    q.split('&')
                        .find_map(|kv| kv.strip_prefix("component="))
                        .map(str::to_owned)
                });
                self.rollout(route, body, component).await
            }
        };
        if parts.method == Method::HEAD {
            *resp.body_mut() = Full::new(Bytes::new());
        }
        resp
    }

    /// Refuses what a web page could send: a request with an `Origin`
    /// field not in `admin.allowed_origins` (a browser adds it to every
    /// cross-site POST, and a simple one needs no preflight), and a Host
    /// (or request-target authority) that is not an IP address,
    /// `localhost` or in `admin.allowed_hosts` (a page whose name is
    /// rebound to this address sends its own name). The rules are the
    /// current generation's config ([`AdminHooks::config`]); without
    /// one, no origin and no other name is served.
    fn refuse_web_page_requests(&self, parts: &http::request::Parts) -> Result<(), Refusal> {
        let config = self.hooks().config.map(|config| config());
        let default = AdminAccess::default();
        let access = config.as_ref().map_or(&default, |c| &c.admin_access);
        let host = match parts.uri.authority() {
            Some(authority) => Some(authority.as_str()),
            None => parts
                .headers
                .get(header::HOST)
                .map(|h| h.to_str().unwrap_or("\u{fffd}")),
        };
        if let Some(host) = host
            && !access.admits_host(host)
        {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                format!(
                    "Host {:?} is not served: the admin API answers IP addresses, localhost and the names in admin.allowed_hosts (a page on another name could read it through DNS rebinding)",
                    truncated(host)
                ),
            ));
        }
        if let Some(origin) = parts.headers.get(header::ORIGIN)
            && !access.admits_origin(origin.as_bytes())
        {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                format!(
                    "requests from web pages are refused (Origin: {:?}); list the origin in admin.allowed_origins to serve it",
                    truncated(&String::from_utf8_lossy(origin.as_bytes()))
                ),
            ));
        }
        Ok(())
    }

    async fn rollout(
        &self,
        route: Route,
        body: Bytes,
        component: Option<String>,
    ) -> Response<Full<Bytes>> {
        let Some((hook, _)) = self.hooks().rollout else {
            return error(
                StatusCode::NOT_IMPLEMENTED,
                "policy rollout needs [cluster] (and the node to be serving)",
            );
        };
        let call = match route {
            Route::PolicyPush => RolloutCall::Push(body),
            Route::PolicyRollback => RolloutCall::Rollback,
            _ => RolloutCall::Status,
        };
        match hook(call, component).await {
            Ok(v) => ok(v),
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        }
    }

    async fn stats(&self) -> Response<Full<Bytes>> {
        let store = match self.cache() {
            Some(cache) => match cache.store().stats().await {
                Ok(s) => view::store_json(&s),
                Err(e) => {
                    return error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("store stats: {e}"),
                    );
                }
            },
            None => Value::Null,
        };
        let policy =
            self.hooks().policy.and_then(|p| p()).map(
                |p| json!({ "name": p.name(), "generation": p.generation(), "path": p.path() }),
            );
        let mut health = self.hooks().backends.map(|b| b()).unwrap_or_default();
        ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": self.0.started.elapsed().as_secs(),
            "state": self.0.readiness.state(),
            "policy": policy,
            "store": store,
            "backends": health["backends"].take(),
            "directors": health["directors"].take(),
        }))
    }

    async fn purge(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let req: PurgeRequest = match parse(body) {
            Ok(r) => r,
            Err(refusal) => return refusal.into(),
        };
        let (target, what) = match req.target() {
            Ok(t) => t,
            Err(m) => return error(StatusCode::BAD_REQUEST, m),
        };
        let Some(invalidator) = self.hooks().invalidator else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the cache is not open yet");
        };
        match invalidator.purge(&target, req.soft).await {
            Ok(n) => ok(json!({ "status": "ok", "purged": n, "soft": req.soft, "what": what })),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("purge failed: {e}"),
            ),
        }
    }

    async fn ban(&self, body: &[u8]) -> Response<Full<Bytes>> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BanRequest {
            expression: String,
        }
        let Some(invalidator) = self.hooks().invalidator else {
            return not_available("bans");
        };
        let req: BanRequest = match parse(body) {
            Ok(r) => r,
            Err(refusal) => return refusal.into(),
        };
        match invalidator.ban(&req.expression).await {
            Ok(info) => ok(json!({ "ban": info })),
            Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
        }
    }
}

/// The routes, by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Healthz,
    Readyz,
    Stats,
    Purge,
    Config,
    Metrics,
    Ban,
    Bans,
    Reload,
    Policy,
    PolicyPush,
    PolicyRollback,
}

impl Route {
    const ALL: [Route; 12] = [
        Route::Healthz,
        Route::Readyz,
        Route::Stats,
        Route::Purge,
        Route::Config,
        Route::Metrics,
        Route::Ban,
        Route::Bans,
        Route::Reload,
        Route::Policy,
        Route::PolicyPush,
        Route::PolicyRollback,
    ];

    fn of(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.path() == path)
    }

    fn path(self) -> &'static str {
        match self {
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Stats => "/stats",
            Route::Purge => "/purge",
            Route::Config => "/config",
            Route::Metrics => "/metrics",
            Route::Ban => "/ban",
            Route::Bans => "/bans",
            Route::Reload => "/reload",
            Route::Policy => "/policy",
            Route::PolicyPush => "/policy/push",
            Route::PolicyRollback => "/policy/rollback",
        }
    }

    fn method(self) -> Method {
        match self {
            Route::Purge
            | Route::Ban
            | Route::Reload
            | Route::PolicyPush
            | Route::PolicyRollback => Method::POST,
            _ => Method::GET,
        }
    }

    /// Load balancers probe without a token, by whatever name they know
    /// the node, and the probes say only whether it is alive or ready:
    /// they are served whatever the token, Host and Origin.
    fn is_probe(self) -> bool {
        matches!(self, Route::Healthz | Route::Readyz)
    }

    /// The media type a POST to this route must carry: JSON for the
    /// routes that read JSON, `application/wasm` for a pushed policy, and
    /// none or JSON for those without a body. A web page can send
    /// `text/plain`, a form or `multipart/form-data` without a preflight;
    /// none of them is accepted.
    fn check_content_type(self, headers: &HeaderMap) -> Result<(), Refusal> {
        let given = headers
            .get(header::CONTENT_TYPE)
            .map(|v| media_type(v.as_bytes()));
        let (wanted, ok) = match self {
            Route::PolicyPush => (WASM_MEDIA_TYPE, given.as_deref() == Some(WASM_MEDIA_TYPE)),
            Route::Reload | Route::PolicyRollback => (
                "no Content-Type or application/json",
                given.as_deref().is_none_or(|t| t == JSON_MEDIA_TYPE),
            ),
            _ => (JSON_MEDIA_TYPE, given.as_deref() == Some(JSON_MEDIA_TYPE)),
        };
        if ok {
            return Ok(());
        }
        let given = match &given {
            Some(t) => format!("Content-Type {}", truncated(t)),
            None => "no Content-Type".into(),
        };
        Err(Refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("{} takes {wanted}, not {given}", self.path()),
        ))
    }
}

/// The media type of a `Content-Type` value, lower-case, without its
/// parameters (`Application/JSON; charset=utf-8` is `application/json`).
fn media_type(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let essence = text.split(';').next().unwrap_or_default();
    essence.trim().to_ascii_lowercase()
}

/// Read a request body of at most `limit` bytes ([`MAX_BODY`] but for a
/// pushed policy) within [`BODY_READ_TIMEOUT`].
async fn read_body<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, Refusal>
where
    B: Body<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, limit).collect()).await {
        Err(_) => Err(Refusal(
            StatusCode::REQUEST_TIMEOUT,
            "the body did not come in time".into(),
        )),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(Refusal(
            StatusCode::BAD_REQUEST,
            format!("reading the body: {e}"),
        )),
    }
}

/// A request refused: its status and why.
struct Refusal(StatusCode, String);

impl From<Refusal> for Response<Full<Bytes>> {
    fn from(Refusal(status, message): Refusal) -> Self {
        error(status, message)
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body)
        .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")))
}

fn answer(status: StatusCode, v: Value) -> Response<Full<Bytes>> {
    crate::pipeline::purge::json_response(status, &v).map(Full::new)
}

fn ok(v: Value) -> Response<Full<Bytes>> {
    answer(StatusCode::OK, v)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    answer(status, json!({ "error": message.into() }))
}

fn not_available(what: &str) -> Response<Full<Bytes>> {
    error(
        StatusCode::NOT_IMPLEMENTED,
        format!("{what} not available in this build"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_take_only_media_types_a_page_cannot_send_without_a_preflight() {
        let with = |t: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(t) = t {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_str(t).unwrap());
            }
            h
        };
        let simple = [
            None,
            Some("text/plain"),
            Some("text/plain; charset=utf-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonp"),
        ];
        for route in [Route::Purge, Route::Ban] {
            for json in [JSON_MEDIA_TYPE, "Application/JSON; charset=utf-8"] {
                assert!(
                    route.check_content_type(&with(Some(json))).is_ok(),
                    "{route:?} {json}"
                );
            }
            for t in simple {
                let Err(Refusal(status, why)) = route.check_content_type(&with(t)) else {
                    panic!("{route:?} took {t:?}")
                };
                assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
                assert!(why.contains("application/json"), "{why}");
            }
        }
        // What `inlay admin policy push` sends, and nothing a page can.
        assert!(
            Route::PolicyPush
                .check_content_type(&with(Some(WASM_MEDIA_TYPE)))
                .is_ok()
        );
        for t in simple.into_iter().chain([Some(JSON_MEDIA_TYPE)]) {
            assert!(
                Route::PolicyPush.check_content_type(&with(t)).is_err(),
                "push took {t:?}"
            );
        }
        // Routes without a body: none, or JSON.
        for route in [Route::Reload, Route::PolicyRollback] {
            assert!(route.check_content_type(&with(None)).is_ok());
            assert!(
                route
                    .check_content_type(&with(Some(JSON_MEDIA_TYPE)))
                    .is_ok()
            );
            for t in &simple[1..] {
                assert!(
                    route.check_content_type(&with(*t)).is_err(),
                    "{route:?} took {t:?}"
                );
            }
        }
    }
}
