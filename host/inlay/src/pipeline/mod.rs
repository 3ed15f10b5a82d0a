//! The request's way through the host, one phase per file, in the order
//! they run (see `docs/ARCHITECTURE.md`):
//!
//! 1. [`recv`]: normalise the request; the policy may rewrite it, answer it,
//!    pick a backend, or choose pass / lookup.
//! 2. [`lookup`]: the cache key and what the cache holds (coalescing, grace),
//!    and the fetch for the cache on a miss (revalidation, stale-if-error).
//! 3. [`fetch`]: the backend request, with Via / X-Forwarded-For.
//! 4. [`backend_response`]: the policy decides how a response is cached.
//! 5. [`esi`]: pages that opted in are assembled, includes in parallel.
//! 6. [`deliver`]: the response headers for the client, conditional and Range.
//! 7. [`log`]: always runs: one access-log line when the body is done.
//!
//! [`purge`] answers the PURGE method; [`invalidate`] drops what a passed
//! unsafe request (POST, PUT, DELETE...) changed. This file only sequences
//! the phases.

pub mod backend_response;
pub mod deliver;
pub mod esi;
pub mod fetch;
pub mod invalidate;
pub mod log;
pub mod lookup;
pub mod purge;
pub mod recv;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use inlay_cache::HttpCache;
use inlay_cluster::kv::SharedKv;
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError, RequestHead};
use inlay_esi::ParsedTemplates;
use inlay_runtime::{LoadedPolicy, PolicyCall, PolicyServices, PolicySlot};
use inlay_storage::StoredObject;
use tracing::{Instrument, debug_span};

use crate::access_log::{AccessLog, AccessRecord};
use crate::backend::director::key_hash;
use crate::backend::{Backends, Picked};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::policy_services::HostServices;
use crate::request_id::RequestIds;
use crate::server_timing::{self, IncludeTimings};

/// Gives the request's policy instance back to the pool before the
/// request waits on I/O (the backend, another request's fill), so that
/// slow requests do not keep policy requests, hits included, from getting
/// one; the next hook catches a new instance up (`PolicyCall::release`).
fn release_while_waiting(policy: Option<&mut PolicyCall>) {
    if let Some(call) = policy {
        call.release();
    }
}

/// What a generation's policies reach the host through: its cache and
/// backends, request ids on subrequests, and the shared kv if any.
fn host_services(
    cache: &HttpCache,
    backends: &Backends,
    request_ids: &RequestIds,
    shared_kv: Option<SharedKv>,
) -> Arc<dyn PolicyServices> {
    Arc::new(
        HostServices::new(cache.clone(), backends.clone())
            .with_request_id(request_ids.header().cloned())
            .with_shared_kv(shared_kv),
    )
}

/// What recv decided.
#[derive(Debug)]
pub enum Route {
    /// Use the cache.
    Lookup,
    /// Go to the backend; do not use the cache.
    Pass,
    /// Answer at once.
    Synthetic(Response<ProxyBody>),
}

/// Everything a request needs, shared by all connections.
pub struct Pipeline {
    config: Arc<Config>,
    backends: Backends,
    cache: HttpCache,
    access_log: AccessLog,
    policy: Option<Arc<PolicySlot>>,
    /// The slot's policy when this generation was built: its requests
    /// keep it while the slot is reloaded for the next generation.
    pinned: Option<LoadedPolicy>,
    services: Arc<dyn PolicyServices>,
    /// Cached ESI templates, parsed once.
    templates: ParsedTemplates,
    /// The process's counters, shared with later generations.
    metrics: Arc<Metrics>,
    /// Accepts or mints each request's id.
    request_ids: RequestIds,
    /// The cluster's shared policy kv, carried to later generations.
    shared_kv: Option<SharedKv>,
    /// `[cluster] shard = true`: misses go to their key's owner.
    shard: Option<Arc<inlay_cluster::shard::Shard>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("backends", &self.backends)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// A response on its way to deliver, with what deliver must know about it.
pub struct Outcome {
    resp: Response<ProxyBody>,
    /// How it was served.
    status: CacheStatus,
    /// The complete cached object the response was made from (for
    /// conditional and Range answers, and the template of an ESI page).
    object: Option<StoredObject>,
    /// The body is an ESI template to assemble.
    esi: bool,
    /// The backend's time to the response head, when this request fetched.
    fetched: Option<Duration>,
}

impl Outcome {
    fn new(resp: Response<ProxyBody>, status: CacheStatus) -> Self {
        Self {
            resp,
            status,
            object: None,
            esi: false,
            fetched: None,
        }
    }

    fn with_esi(mut self, esi: bool) -> Self {
        self.esi = esi;
        self
    }

    fn with_fetch_time(mut self, took: Duration) -> Self {
        self.fetched = Some(took);
        self
    }
}

/// `Server-Timing` for one request: whether it is on (config, or the
/// policy's request flag), the head's entries, and an ESI page's include
/// entries for the trailer.
#[derive(Debug, Default)]
struct RequestTiming {
    on: bool,
    /// The client can take a trailer (HTTP/2, or HTTP/1.1 with `TE: trailers`).
    trailers: bool,
    head: server_timing::Timing,
    includes: Option<Arc<IncludeTimings>>,
}

impl RequestTiming {
    /// `Some(now)` when timing is on, so that requests without it do not
    /// read the clock.
    fn now(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    fn phase(&mut self, name: &str, since: Option<Instant>) {
        if let Some(since) = since {
            self.head.phase(name, since.elapsed());
        }
    }
}

impl Pipeline {
    /// Build the pipeline from a validated config, an open cache and the
    /// policy slot (if a policy is configured), with metrics of its own
    /// (`[metrics] enabled`).
    pub fn new(
        config: Arc<Config>,
        cache: HttpCache,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
    ) -> Self {
        let metrics = Metrics::new(config.metrics.enabled);
        Self::with_metrics(config, cache, policy, access_log, metrics)
    }

    /// [`Pipeline::new`] counting in `metrics`.
    pub fn with_metrics(
        config: Arc<Config>,
        cache: HttpCache,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
        metrics: Arc<Metrics>,
    ) -> Self {
        let backends = Backends::new(&config, &metrics);
        Self::build(config, cache, policy, access_log, backends, metrics)
    }

    /// The next generation, for a config reload: `config` with the same
    /// cache state under `config.cache`'s rules, the slot's current policy
    /// and `access_log`, counting in the same metrics (counts go on); the
    /// backends whose settings did not change keep their connection pools
    /// (and their `max_connections` slots).
    pub fn next_generation(
        &self,
        config: Arc<Config>,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
    ) -> Self {
        let cache = self.cache.with_rules(config.cache.rules());
        self.next_generation_on(config, policy, access_log, cache)
    }

    /// [`next_generation`](Self::next_generation) on another cache (a
    /// reload that moved `cache.dir`): `cache` as given, rules included.
    pub fn next_generation_on(
        &self,
        config: Arc<Config>,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
        cache: HttpCache,
    ) -> Self {
        let backends = self.backends.renewed(&config, &self.metrics);
        Self::build(
            config,
            cache,
            policy,
            access_log,
            backends,
            self.metrics.clone(),
        )
        .with_shared_kv(self.shared_kv.clone())
        .with_shard(self.shard.clone())
    }

    /// Its policies' kv in the cluster's shared kv (`cluster.kv = "nats"`)
    /// instead of the cache store; later generations keep it.
    pub fn with_shared_kv(mut self, kv: Option<SharedKv>) -> Self {
        self.services = host_services(&self.cache, &self.backends, &self.request_ids, kv.clone());
        self.shared_kv = kv;
        self
    }

    /// This pipeline fetching misses from their key's owner (`[cluster]
    /// shard = true`); later generations keep it.
    pub fn with_shard(mut self, shard: Option<Arc<inlay_cluster::shard::Shard>>) -> Self {
        self.shard = shard;
        self
    }

    fn build(
        config: Arc<Config>,
        cache: HttpCache,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
        backends: Backends,
        metrics: Arc<Metrics>,
    ) -> Self {
        let request_ids = RequestIds::new(&config.server);
        let services = host_services(&cache, &backends, &request_ids, None);
        Self {
            config,
            backends,
            cache,
            access_log,
            pinned: policy.as_ref().map(|slot| slot.current()),
            policy,
            services,
            templates: ParsedTemplates::default(),
            metrics,
            request_ids,
            shared_kv: None,
            shard: None,
        }
    }

    /// The process's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Copies the store's and the policy runtime's own counts into the
    /// metrics (the store's stats may touch the disk, on a blocking thread).
    pub(crate) async fn observe_for_metrics(&self) {
        match self.cache.store().stats().await {
            Ok(stats) => self.metrics.observe_store(&stats),
            Err(e) => tracing::warn!(error = %e, "metrics: store stats unavailable"),
        }
        if let Some(slot) = &self.policy {
            self.metrics.observe_policy(slot);
        }
        let bans = self.cache.ban_counts();
        self.metrics.observe_bans(bans.added, bans.active);
    }

    /// A fresh instance of this generation's policy for one request, if any.
    async fn start_policy(&self) -> Result<Option<PolicyCall>, ProxyError> {
        match (&self.policy, &self.pinned) {
            (Some(slot), Some(policy)) => {
                Ok(Some(slot.handle_of(policy, &self.services).start().await?))
            }
            _ => Ok(None),
        }
    }

    /// This generation's policy, if it runs one.
    pub fn policy(&self) -> Option<&LoadedPolicy> {
        self.pinned.as_ref()
    }

    /// The access log this generation writes to.
    pub fn access_log(&self) -> &AccessLog {
        &self.access_log
    }

    /// The validated config this pipeline runs, shared.
    pub fn shared_config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The configured backends.
    pub fn backends(&self) -> &Backends {
        &self.backends
    }

    /// The HTTP cache.
    pub fn cache(&self) -> &HttpCache {
        &self.cache
    }

    /// The validated config this pipeline runs.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The backend a request goes to: the one it names, or one its
    /// director picks (a `shard` director hashes `key`, the cache key).
    fn backend(&self, head: &RequestHead, key: impl FnOnce() -> u64) -> Result<Picked, ProxyError> {
        self.backends.pick(&head.backend, key).ok_or_else(|| {
            ProxyError::Internal(format!("backend {} is not configured", head.backend))
        })
    }

    /// Serve one request. Never fails: errors become responses here.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (mut parts, body) = req.into_parts();
        if let Some(shard) = &self.shard {
            shard.accept_hop(&mut parts.headers);
        }
        let request_id = self.request_ids.assign(&mut parts.headers);
        // Only the policy may turn Server-Timing on for one request.
        parts.headers.remove(server_timing::REQUEST_FLAG);
        let mut timing = RequestTiming {
            on: self.config.server.server_timing,
            trailers: server_timing::trailers_allowed(parts.version, &parts.headers),
            ..RequestTiming::default()
        };
        let http1 = parts.version < http::Version::HTTP_2;
        let mut record = log::start(&parts, peer);
        self.metrics.client_request(parts.version);
        record.request_id = request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let span = debug_span!("request", method = %parts.method, uri = %parts.uri, client = %peer);
        let limit = self.config.server.max_request_body;
        let over = Arc::new(AtomicBool::new(false));
        let result = match recv::check_declared_length(&parts.headers, limit) {
            Ok(()) => {
                let body = recv::capped_body(body::boxed(body), limit, over.clone());
                self.process(parts, body, peer, &mut record, &mut timing, started)
                    .instrument(span)
                    .await
            }
            Err(e) => Err(e),
        };
        // A backend fetch that failed because the body was cut is a 413.
        let result = result.map_err(|e| match over.load(Ordering::Relaxed) {
            true => ProxyError::RequestTooLarge { limit },
            false => e,
        });
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                log::failure(&e, &record);
                record.error = Some(e.to_string());
                record.cache = CacheStatus::Error;
                let mut resp = deliver::finish(e.to_response(), CacheStatus::Error);
                // After a malformed request nothing on the connection can be
                // trusted (Varnish and nginx close too); HTTP/2 has no such field.
                if http1 && matches!(e, ProxyError::BadRequest(_)) {
                    resp.headers_mut()
                        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
                }
                resp
            }
        };
        let mut resp = resp;
        if let (Some(name), Some(id)) = (self.request_ids.header(), request_id) {
            resp.headers_mut().insert(name.clone(), id);
        }
        if timing.on {
            timing.head.cache(record.cache.log_name());
            if let Some(v) = timing.head.header_value() {
                resp.headers_mut().append(server_timing::SERVER_TIMING, v);
            }
            if let Some(includes) = timing.includes.take() {
                resp.headers_mut().insert(
                    header::TRAILER,
                    http::HeaderValue::from_static("server-timing"),
                );
                resp = resp.map(|b| server_timing::with_trailer(b, includes));
            }
        }
        log::finish(
            resp,
            record,
            started,
            self.access_log.clone(),
            &self.metrics,
        )
    }

    async fn process(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: ProxyBody,
        peer: SocketAddr,
        record: &mut AccessRecord,
        timing: &mut RequestTiming,
        started: Instant,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut head = recv::normalise(parts, peer, self.backends.default_name())?;
        // A peer's fetch for its cache (its hop field was checked in handle).
        let for_peer = self.shard.is_some() && head.headers.contains_key(inlay_cluster::shard::HOP);
        if let Some(shard) = self.shard.as_ref().filter(|s| s.is_own_hop(&head.headers)) {
            drop((body, shard));
            return Ok(inlay_cluster::shard::loop_response());
        }
        if head.method.as_str() == "PURGE" {
            record.cache = CacheStatus::Purge;
            return purge::purge(&self.cache, &self.config.cache, &head, &self.metrics).await;
        }
        if head.method.as_str() == "BAN" {
            record.cache = CacheStatus::Purge;
            return purge::ban(&self.cache, &self.config.cache, &head).await;
        }
        let mut policy = self.start_policy().await?;
        let route = recv::route(&mut head, policy.as_mut(), &self.metrics).await?;
        // Whatever the policy set, the flag goes no further.
        timing.on |= server_timing::take_request_flag(&mut head.headers);
        timing.phase("recv", Some(started));
        let routed = timing.now();
        record.backend = Some(head.backend.clone());
        let mut out = match route {
            Route::Synthetic(resp) => Outcome::new(resp, CacheStatus::Synthetic),
            Route::Pass => {
                release_while_waiting(policy.as_mut());
                let backend = self.backend(&head, || {
                    key_hash(inlay_cache::PrimaryKey::of(&head).as_str())
                })?;
                let body = recv::counted_body(body, &self.metrics);
                let mut resp =
                    fetch::send(&backend, &head, head.method.clone(), body, None).await?;
                timing.phase("fetch", routed);
                invalidate::after_unsafe(&self.cache, &head, resp.status(), resp.headers()).await;
                let defaults =
                    backend_response::default_settings(&resp, &self.cache.rules().defaults);
                let settings = backend_response::run_policy(
                    policy.as_mut(),
                    &mut head,
                    &mut resp,
                    defaults,
                    &self.metrics,
                )
                .await?;
                Outcome::new(resp, CacheStatus::Pass).with_esi(settings.esi)
            }
            Route::Lookup => {
                drop(body);
                let out = self.lookup_and_fetch(&mut head, policy.as_mut()).await?;
                timing.phase("lookup", routed);
                if let (true, Some(took)) = (timing.on, out.fetched) {
                    timing.head.phase("fetch", took);
                }
                out
            }
        };
        let delivering = timing.now();
        let mut esi_vars = Vec::new();
        if let Some(call) = &policy {
            let o = call.esi_overrides();
            if let Some(enabled) = o.enabled {
                out.esi = enabled;
            }
            esi_vars = o.vars.clone();
        }
        record.cache = out.status;
        let resp = match (&out.object, out.esi) {
            // The peer caches the template and assembles it itself.
            (_, true) if for_peer => out.resp,
            (_, true) if head.method == Method::HEAD => {
                // The assembled length is unknown without assembling.
                let mut resp = out.resp;
                resp.headers_mut().remove(header::CONTENT_LENGTH);
                resp
            }
            (obj, true) => {
                let template = obj.as_ref().map(|o| &o.body);
                let omitted = Arc::new(AtomicU32::new(0));
                record.esi_omitted = Some(Arc::clone(&omitted));
                if timing.on && timing.trailers {
                    timing.includes = Some(Arc::default());
                }
                let includes = timing.includes.clone();
                esi::process(
                    self, &head, out.resp, template, &esi_vars, omitted, includes,
                )
                .await?
            }
            (Some(obj), false) => deliver::conditional_and_range(&head, out.resp, obj),
            (None, false) => out.resp,
        };
        let edge_fields = for_peer.then(|| inlay_cluster::shard::edge_fields(resp.headers()));
        let mut resp = deliver::finish(resp, out.status);
        // A peer stores what the origin said to edges (TTL, ESI, surrogate keys).
        if let Some(fields) = edge_fields {
            resp.headers_mut().extend(fields);
        }
        let resp = deliver::run_policy(policy.as_mut(), &mut head, resp, &self.metrics).await;
        timing.phase("deliver", delivering);
        resp
    }
}
