//! The request's way through the host, one phase per file, in the order
//! they run (see DESIGN.md):
//!
//! 1. [`recv`]: normalise the request; the policy may rewrite it, answer it,
//!    pick a backend, or choose pass / lookup.
//! 2. [`lookup`]: the cache key and what the cache holds (coalescing, grace).
//! 3. [`fetch`]: the backend request, with Via / X-Forwarded-For.
//! 4. [`backend_response`]: cacheability, TTL, grace; storing while streaming.
//! 5. [`esi`]: pages that opted in are assembled, includes in parallel.
//! 6. [`deliver`]: the response headers for the client, conditional and Range.
//! 7. [`log`]: always runs: one access-log line when the body is done.
//!
//! [`purge`] answers the PURGE method. This file only sequences the phases.

pub mod backend_response;
pub mod deliver;
pub mod esi;
pub mod fetch;
pub mod log;
pub mod lookup;
pub mod purge;
pub mod recv;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use inlay_storage::StoredObject;
use tracing::{Instrument, debug, debug_span, warn};

use crate::access_log::{AccessLog, AccessRecord};
use crate::backend::Backends;
use crate::body::{self, ProxyBody};
use crate::cache::rules::Defaults;
use crate::cache::{Flight, HttpCache, Lookup, PrimaryKey};
use crate::config::Config;
use crate::error::ProxyError;
use crate::esi::ParsedTemplates;
use crate::policy_services::HostServices;
use crate::runtime::{PolicyCall, PolicyServices, PolicySlot};

use backend_response::StoreTarget;

/// The client request as the phases (and the policy) see it: the head only;
/// the body travels separately.
pub use crate::runtime::RequestHead;

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
    defaults: Defaults,
    access_log: AccessLog,
    policy: Option<Arc<PolicySlot>>,
    services: Arc<dyn PolicyServices>,
    /// Cached ESI templates, parsed once.
    templates: ParsedTemplates,
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
    /// RFC 9211 Cache-Status value.
    cache_status: String,
    /// Short form for the access log.
    log: &'static str,
    /// The complete cached object the response was made from (for
    /// conditional and Range answers, and the template of an ESI page).
    object: Option<StoredObject>,
    /// The body is an ESI template to assemble.
    esi: bool,
}

impl Outcome {
    fn new(resp: Response<ProxyBody>, cache_status: String, log: &'static str) -> Self {
        Self {
            resp,
            cache_status,
            log,
            object: None,
            esi: false,
        }
    }

    fn with_esi(mut self, esi: bool) -> Self {
        self.esi = esi;
        self
    }
}

impl Pipeline {
    /// Build the pipeline from a validated config, an open cache and the
    /// policy slot (if a policy is configured).
    pub fn new(
        config: Arc<Config>,
        cache: HttpCache,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
    ) -> Self {
        let backends = Backends::new(&config);
        let services: Arc<dyn PolicyServices> =
            Arc::new(HostServices::new(cache.clone(), backends.clone()));
        let defaults = Defaults {
            ttl: config.cache.default_ttl,
            grace: config.cache.default_grace,
            keep: config.cache.default_keep,
        };
        Self {
            config,
            backends,
            cache,
            defaults,
            access_log,
            policy,
            services,
            templates: ParsedTemplates::default(),
        }
    }

    /// A fresh instance of the current policy for one request, if any.
    async fn start_policy(&self) -> Result<Option<PolicyCall>, ProxyError> {
        match &self.policy {
            Some(slot) => Ok(Some(slot.handle(&self.services).start().await?)),
            None => Ok(None),
        }
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

    /// Serve one request. Never fails: errors become responses here.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        let mut record = log::start(&parts, peer);
        let span = debug_span!("request", method = %parts.method, uri = %parts.uri, client = %peer);
        let result = self
            .process(parts, body::boxed(body), peer, &mut record)
            .instrument(span)
            .await;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                log::failure(&e, &record);
                record.error = Some(e.to_string());
                record.cache = "error";
                deliver::finish(e.to_response(), "inlay; detail=error")
            }
        };
        log::finish(resp, record, started, self.access_log.clone())
    }

    async fn process(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: ProxyBody,
        peer: SocketAddr,
        record: &mut AccessRecord,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut head = recv::normalise(parts, peer, self.backends.default_name())?;
        if head.method.as_str() == "PURGE" {
            record.cache = "purge";
            return purge::purge(&self.cache, &self.config.cache, &head);
        }
        let mut policy = self.start_policy().await?;
        let route = recv::route(&mut head, policy.as_mut()).await?;
        record.backend = Some(head.backend.clone());
        let mut out = match route {
            Route::Synthetic(resp) => Outcome::new(resp, "inlay; detail=synthetic".into(), "synth"),
            Route::Pass => {
                let mut resp =
                    fetch::send(self.backend(&head)?, &head, head.method.clone(), body, None)
                        .await?;
                let defaults = backend_response::default_settings(&resp, &self.defaults);
                let settings =
                    backend_response::run_policy(policy.as_mut(), &mut head, &mut resp, defaults)
                        .await?;
                Outcome::new(resp, "inlay; fwd=bypass".into(), "pass").with_esi(settings.esi)
            }
            Route::Lookup => {
                drop(body);
                self.lookup_and_fetch(&mut head, policy.as_mut()).await?
            }
        };
        let mut esi_vars = Vec::new();
        if let Some(call) = &policy {
            let o = call.esi_overrides();
            if let Some(enabled) = o.enabled {
                out.esi = enabled;
            }
            esi_vars = o.vars.clone();
        }
        record.cache = out.log;
        let resp = match (&out.object, out.esi) {
            (_, true) if head.method == Method::HEAD => {
                // The assembled length is unknown without assembling.
                let mut resp = out.resp;
                resp.headers_mut().remove(header::CONTENT_LENGTH);
                resp
            }
            (obj, true) => {
                let template = obj.as_ref().map(|o| &o.body);
                esi::process(self, &head, out.resp, template, &esi_vars)
            }
            (Some(obj), false) => deliver::conditional_and_range(&head, out.resp, obj),
            (None, false) => out.resp,
        };
        let resp = deliver::finish(resp, &out.cache_status);
        deliver::run_policy(policy.as_mut(), &mut head, resp).await
    }

    fn backend(&self, head: &RequestHead) -> Result<&crate::backend::Backend, ProxyError> {
        self.backends
            .get(&head.backend)
            .map(|b| b.as_ref())
            .ok_or_else(|| {
                ProxyError::Internal(format!("backend {} is not configured", head.backend))
            })
    }

    async fn lookup_and_fetch(
        &self,
        head: &mut RequestHead,
        policy: Option<&mut PolicyCall>,
    ) -> Result<Outcome, ProxyError> {
        let primary = lookup::primary_key(head);
        let now = inlay_storage::now_ms();
        match lookup::lookup(&self.cache, &primary, head).await {
            Lookup::Fresh(obj) => {
                let ttl = obj.meta.expires_at_ms().saturating_sub(now) / 1000;
                Ok(self.hit(obj, format!("inlay; hit; ttl={ttl}"), "hit", now))
            }
            Lookup::Stale { object, refresh } => {
                if let Some(flight) = refresh {
                    self.refresh_in_background(head, primary, flight, object.clone());
                }
                let stale_for = now.saturating_sub(object.meta.expires_at_ms()) / 1000;
                Ok(self.hit(
                    object,
                    format!("inlay; hit; ttl=-{stale_for}; detail=grace"),
                    "stale",
                    now,
                ))
            }
            Lookup::Miss { flight, expired } => {
                self.miss(head, primary, Some(flight), expired, policy)
                    .await
            }
            Lookup::HitForMiss { expired } => self.miss(head, primary, None, expired, policy).await,
        }
    }

    /// An ESI include: through the cache, without the client's conditional
    /// or Range fields (they are not forwarded to includes).
    pub async fn fetch_for_include(&self, head: &RequestHead) -> Result<Outcome, ProxyError> {
        let mut head = head.clone();
        self.lookup_and_fetch(&mut head, None).await
    }

    fn hit(&self, obj: StoredObject, cache_status: String, log: &'static str, now: u64) -> Outcome {
        let (resp, esi) = deliver::from_object(&obj, now);
        Outcome {
            resp,
            cache_status,
            log,
            object: Some(obj),
            esi,
        }
    }

    /// Fetch from the backend for the cache (conditionally when an expired
    /// object has validators), store, and stream.
    async fn miss(
        &self,
        head: &mut RequestHead,
        primary: PrimaryKey,
        flight: Option<Flight>,
        expired: Option<StoredObject>,
        policy: Option<&mut PolicyCall>,
    ) -> Result<Outcome, ProxyError> {
        let backend = self.backend(head)?;
        let validators = expired.as_ref().map(validators).unwrap_or_default();
        let fetched =
            fetch::send(backend, head, Method::GET, body::empty(), Some(validators)).await;
        let now = inlay_storage::now_ms();
        let resp = match fetched {
            Ok(resp) if resp.status().is_server_error() && expired.is_some() => {
                return Ok(self
                    .stale_if_error(expired, now, format!("status {}", resp.status()))
                    .unwrap_or_else(|| Outcome::new(resp, "inlay; fwd=miss".into(), "miss")));
            }
            Ok(resp) => resp,
            Err(e) => return self.stale_if_error(expired, now, e.to_string()).ok_or(e),
        };
        let mut resp = resp;
        let defaults = backend_response::default_settings(&resp, &self.defaults);
        if resp.status() == StatusCode::NOT_MODIFIED
            && let Some(old) = expired
        {
            let meta = backend_response::refreshed_meta(&old.meta, resp.headers(), &defaults);
            if let Err(e) = self.cache.refresh(&primary, &head.headers, meta.clone()) {
                warn!(error = %e, "could not refresh the cached object after a 304");
            }
            drop(flight);
            let obj = StoredObject {
                meta: Arc::new(meta),
                body: old.body,
            };
            return Ok(self.hit(
                obj,
                "inlay; fwd=stale; fwd-status=304".into(),
                "revalidated",
                now,
            ));
        }

        let settings = backend_response::run_policy(policy, head, &mut resp, defaults).await?;
        let stored = settings.cacheable;
        let resp = backend_response::store_while_streaming(
            resp,
            &settings,
            StoreTarget {
                cache: self.cache.clone(),
                primary,
                req_headers: head.headers.clone(),
                max_object_size: self.config.cache.max_object_size,
                flight,
            },
        );
        let status = if stored {
            "inlay; fwd=miss; stored"
        } else {
            "inlay; fwd=miss"
        };
        Ok(Outcome::new(resp, status.into(), "miss").with_esi(settings.esi))
    }

    /// Serve an expired object when the backend failed, if it is still within
    /// its keep window (stale-if-error).
    fn stale_if_error(
        &self,
        expired: Option<StoredObject>,
        now: u64,
        why: String,
    ) -> Option<Outcome> {
        let obj = expired?;
        if !obj.meta.in_keep(now) && !obj.meta.in_grace(now) {
            return None;
        }
        warn!(error = %why, "backend failed; serving stale object (stale-if-error)");
        let stale_for = now.saturating_sub(obj.meta.expires_at_ms()) / 1000;
        Some(self.hit(
            obj,
            format!("inlay; hit; ttl=-{stale_for}; detail=stale-if-error"),
            "stale",
            now,
        ))
    }

    fn refresh_in_background(
        &self,
        head: &RequestHead,
        primary: PrimaryKey,
        flight: Flight,
        old: StoredObject,
    ) {
        let Some(backend) = self.backends.get(&head.backend).cloned() else {
            return;
        };
        let head = head.clone();
        let cache = self.cache.clone();
        let defaults = self.defaults;
        let max = self.config.cache.max_object_size;
        tokio::spawn(async move {
            debug!(key = primary.as_str(), "background refresh");
            let v = validators(&old);
            let resp = match fetch::send(&backend, &head, Method::GET, body::empty(), Some(v)).await
            {
                Ok(r) => r,
                Err(e) => {
                    warn!(error = %e, "background refresh failed; the stale object stays");
                    return;
                }
            };
            let settings = backend_response::default_settings(&resp, &defaults);
            if resp.status() == StatusCode::NOT_MODIFIED {
                let meta = backend_response::refreshed_meta(&old.meta, resp.headers(), &settings);
                if let Err(e) = cache.refresh(&primary, &head.headers, meta) {
                    warn!(error = %e, "could not refresh the cached object after a 304");
                }
                drop(flight);
                return;
            }
            if resp.status().is_server_error() {
                warn!(status = %resp.status(), "background refresh got a server error; the stale object stays");
                return;
            }
            let resp = backend_response::store_while_streaming(
                resp,
                &settings,
                StoreTarget {
                    cache,
                    primary,
                    req_headers: head.headers.clone(),
                    max_object_size: max,
                    flight: Some(flight),
                },
            );
            // Nobody reads this body: drain it so the store task completes.
            let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        });
    }
}

/// Conditional request headers that revalidate `obj` with its origin.
fn validators(obj: &StoredObject) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(v) = obj.meta.etag.as_deref().and_then(|e| e.parse().ok()) {
        h.insert(header::IF_NONE_MATCH, v);
    }
    if let Some(v) = obj
        .meta
        .last_modified
        .as_deref()
        .and_then(|e| e.parse().ok())
    {
        h.insert(header::IF_MODIFIED_SINCE, v);
    }
    h
}
