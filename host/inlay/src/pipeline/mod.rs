//! The request's way through the host, one phase per file, in the order
//! they run (see `docs/ARCHITECTURE.md`). Every phase takes the generation
//! and the request's context ([`RequestCtx`]), and is entered once:
//!
//! 1. [`recv`]: count, bound and normalise the request; the policy may
//!    rewrite it, answer it, pick a backend, or choose pass / lookup.
//! 2. [`lookup`]: the cache key and what the cache holds (coalescing, grace),
//!    and the fetch for the cache on a miss (revalidation, stale-if-error);
//!    or [`pass`]: the backend, not the cache. Both send through [`fetch`],
//!    the one place an upstream is chosen, and let the policy decide on the
//!    response in [`backend_response`].
//! 3. [`esi`]: pages that opted in are assembled, includes in parallel.
//! 4. [`deliver`]: the response headers for the client, conditional and Range.
//! 5. [`log`]: always runs: one access-log line when the body is done.
//!
//! [`purge`] answers the PURGE and BAN methods (and holds the purge path the
//! admin API shares); [`invalidate`] drops what a passed unsafe request
//! (POST, PUT, DELETE...) changed; [`tunnel`] opens a WebSocket (or another
//! upgrade) to the backend instead of [`lookup`] or [`pass`]. This file
//! holds the generation and sequences the phases, nothing else.

mod backend_response;
mod compress;
mod context;
mod deliver;
mod esi;
mod fetch;
mod figures;
mod invalidate;
mod log;
mod lookup;
mod pass;
pub mod purge;
pub mod recv;
mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use inlay_cache::HttpCache;
use inlay_core::ProxyError;
use inlay_core::body::ProxyBody;
use inlay_esi::ParsedTemplates;
use inlay_runtime::{LoadedPolicy, PolicyCall, PolicyServices, PolicySlot};
use tracing::{Instrument, debug_span};

use crate::access_log::AccessLog;
use crate::backend::Backends;
use crate::backend::component::ComponentSet;
use crate::backend::tls::BackendTlsSet;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::policy_services::HostServices;
use crate::request_id::RequestIds;
use crate::tunnels::Tunnels;
pub use context::{Outcome, RequestCtx};
pub use figures::GenerationFigures;
use inlay_cluster::kv::SharedKv;
use lookup::ThroughCache;
pub use purge::{Invalidator, PurgeTarget};
pub use recv::ClientBody;
use recv::Route;

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

/// The generation new requests get, swapped by a reload; a request reads
/// it once and finishes on the one it read.
pub type Generations = arc_swap::ArcSwap<Pipeline>;

/// The cache in front of a generation's upstreams.
fn through_cache(
    config: &Config,
    cache: &HttpCache,
    backends: &Backends,
    shard: Option<Arc<inlay_cluster::shard::Shard>>,
    metrics: &Arc<Metrics>,
) -> ThroughCache {
    let upstreams = fetch::Upstreams::new(
        backends.clone(),
        shard,
        cache.rules().accept_encoding.clone(),
        &config.cache.strip_request_headers,
    );
    ThroughCache::new(cache.clone(), upstreams, Arc::clone(metrics))
}

/// One generation: everything a request needs, shared by all connections
/// until a reload makes the next one.
pub struct Pipeline {
    config: Arc<Config>,
    backends: Backends,
    cache: HttpCache,
    /// The cache in front of the upstreams (lookups and ESI includes).
    through: ThroughCache,
    /// Purges and bans, shared by every generation and the admin API.
    invalidator: Arc<Invalidator>,
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
    /// The tunnels open (WebSockets), shared by every generation.
    tunnels: Arc<Tunnels>,
    /// Cancelled `server.shutdown_timeout` after a reload replaced this
    /// generation: the tunnels it opened close then.
    retired: tokio_util::sync::CancellationToken,
    /// The representation each client is sent (`[compression]`).
    compressor: compress::Compressor,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("backends", &self.backends)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// The first generation: `config` (its backends' TLS resolved in
    /// `backend_tls`) serving from `cache`, with the slot's policy (if one
    /// is configured), writing to `access_log` and counting in `metrics`.
    pub fn first(
        config: Arc<Config>,
        backend_tls: &BackendTlsSet,
        components: &ComponentSet,
        cache: HttpCache,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
        metrics: Arc<Metrics>,
    ) -> Self {
        let backends = Backends::new(&config, backend_tls, components, &metrics);
        let invalidator = Arc::new(Invalidator::new(cache.clone(), Arc::clone(&metrics)));
        let tunnels = Arc::new(Tunnels::default());
        metrics.register_collector(tunnels.figures(&metrics));
        Self::build(
            config,
            cache,
            policy,
            access_log,
            backends,
            metrics,
            (invalidator, tunnels),
        )
    }

    /// The next generation, for a config reload: `config` (with
    /// `backend_tls`) on the same cache state under its `cache` section's
    /// rules, the slot's current policy and `access_log`, counting in the
    /// same metrics (counts go on); the backends whose settings did not
    /// change keep their connection pools (and their `max_connections`
    /// slots).
    pub fn next_generation(
        &self,
        config: Arc<Config>,
        backend_tls: &BackendTlsSet,
        components: &ComponentSet,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
    ) -> Self {
        let cache = self.cache.with_rules(config.cache_rules());
        self.next_generation_on(config, backend_tls, components, policy, access_log, cache)
    }

    /// [`next_generation`](Self::next_generation) on another cache (a
    /// reload that moved `cache.dir`): `cache` as given, rules included.
    pub fn next_generation_on(
        &self,
        config: Arc<Config>,
        backend_tls: &BackendTlsSet,
        components: &ComponentSet,
        policy: Option<Arc<PolicySlot>>,
        access_log: AccessLog,
        cache: HttpCache,
    ) -> Self {
        let backends = self
            .backends
            .renewed(&config, backend_tls, components, &self.metrics);
        Self::build(
            config,
            cache,
            policy,
            access_log,
            backends,
            self.metrics.clone(),
            (Arc::clone(&self.invalidator), Arc::clone(&self.tunnels)),
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
        self.through = through_cache(
            &self.config,
            &self.cache,
            &self.backends,
            shard.clone(),
            &self.metrics,
        );
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
        (invalidator, tunnels): (Arc<Invalidator>, Arc<Tunnels>),
    ) -> Self {
        let request_ids = RequestIds::new(&config.server);
        let services = host_services(&cache, &backends, &request_ids, None);
        let through = through_cache(&config, &cache, &backends, None, &metrics);
        let compressor = compress::Compressor::new(cache.rules(), config.compression.max_streams);
        Self {
            config,
            backends,
            cache,
            through,
            invalidator,
            access_log,
            pinned: policy.as_ref().map(|slot| slot.current()),
            policy,
            services,
            templates: ParsedTemplates::default(),
            metrics,
            request_ids,
            shared_kv: None,
            shard: None,
            tunnels,
            retired: tokio_util::sync::CancellationToken::new(),
            compressor,
        }
    }

    /// This generation was replaced by a reload: the tunnels it opened
    /// close `after` (`server.shutdown_timeout`) from now, as requests in
    /// flight on it have that long to finish.
    pub fn retire(&self, after: std::time::Duration) {
        let retired = self.retired.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            retired.cancel();
        });
    }

    /// The process's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A fresh instance of this generation's policy for one request, if any.
    async fn start_policy(&self) -> Result<Option<PolicyCall>, ProxyError> {
        match (&self.policy, &self.pinned) {
            (Some(slot), Some(policy)) => {
                // Boxed, as every hook call is (`recv::route` says why).
                let handle = slot.handle_of(policy, &self.services);
                Ok(Some(Box::pin(handle.start()).await?))
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

    /// Purges and bans (shared by every generation and the admin API).
    pub fn invalidator(&self) -> &Arc<Invalidator> {
        &self.invalidator
    }

    /// The validated config this pipeline runs.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Serve one request. Never fails: errors become responses here.
    pub async fn handle(
        &self,
        req: Request<impl ClientBody>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let (parts, body) = req.into_parts();
        let body = body.bounded(self.config.server.max_request_body);
        let mut ctx = RequestCtx::new(
            &parts,
            peer,
            self.config.server.server_timing,
            self.policy.is_some(),
            self.access_log.is_on(),
        );
        let span = debug_span!("request", method = %parts.method, uri = %parts.uri, client = %peer);
        let req = Request::from_parts(parts, body);
        let resp = match self.phases(&mut ctx, req).instrument(span).await {
            Ok(resp) => resp,
            Err(e) => deliver::failure(&mut ctx, e),
        };
        let resp = deliver::stamp(self, &mut ctx, resp);
        log::run(self, ctx, resp)
    }

    /// The phases in order, from the request to the response.
    async fn phases(
        &self,
        ctx: &mut RequestCtx,
        req: Request<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let out = match recv::run(self, ctx, req).await? {
            Route::Answer(resp) => return Ok(resp),
            Route::Purge => return purge::purge_method(self, ctx).await,
            Route::Ban => return purge::ban_method(self, ctx).await,
            Route::Synthetic(resp) => Outcome::new(resp, inlay_core::CacheStatus::Synthetic),
            Route::Pass => pass::run(self, ctx).await?,
            Route::Lookup => lookup::run(self, ctx).await?,
            Route::Tunnel => {
                let up = ctx
                    .upgrade
                    .take()
                    .expect("recv routes only upgrades to a tunnel");
                match tunnel::run(self, ctx, up).await? {
                    tunnel::Tunnelled::Open(resp) => return Ok(resp),
                    tunnel::Tunnelled::NotSwitched(out) => out,
                }
            }
        };
        let out = esi::run(self, ctx, out).await?;
        deliver::run(self, ctx, out).await
    }
}
