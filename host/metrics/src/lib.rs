//! Prometheus metrics: one [`Metrics`] per process, shared by every
//! generation of the pipeline, rendered in the OpenMetrics text format for
//! `GET /metrics` on the admin listener.
//!
//! A passive registry: the counters the request path adds to, and their
//! handles, resolved once when a pipeline is built, never per request (the
//! histograms are lock-free, [`Timing`]). Figures their owners keep (the
//! store and the policy runtime of the generation serving, the listeners,
//! the cluster) are read at scrape time by collectors the owners register
//! ([`Metrics::register_collector`]); this module imports nothing else of
//! the crate. With `[metrics] enabled = false` nothing is counted.
//!
//! The names follow Varnish's counters so that a varnish_exporter
//! dashboard can be mapped over; docs/metrics.md has the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use inlay_core::CacheStatus;
use inlay_runtime::{Hook, PolicyError};
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of [`Metrics::render`]'s text (OpenMetrics 1.0,
/// which Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the backend response-time and ESI include
/// histograms: 1 ms to 10 s.
const NETWORK_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds (seconds) of the policy hook-time histogram: 10 µs to 1 s
/// (a hook's CPU budget is milliseconds).
const HOOK_BUCKETS: [f64; 13] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25,
    1.0,
];

/// A histogram of durations whose `observe` is a few relaxed atomic adds.
///
/// prometheus-client's own `Histogram` takes a write lock per observation;
/// policy hooks are timed on every cache hit, so the buckets here are
/// atomics and the text is made from them at scrape time.
#[derive(Clone, Debug)]
pub struct Timing {
    inner: Arc<TimingInner>,
}

#[derive(Debug)]
struct TimingInner {
    /// Upper bounds in seconds, as rendered.
    bounds: &'static [f64],
    /// The same bounds in nanoseconds, for the bucket search.
    bounds_ns: Vec<u64>,
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: Vec<AtomicU64>,
    /// Sum of all observations in nanoseconds.
    sum_ns: AtomicU64,
}

impl Timing {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            inner: Arc::new(TimingInner {
                bounds,
                bounds_ns: bounds.iter().map(|b| (b * 1e9) as u64).collect(),
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_ns: AtomicU64::new(0),
            }),
        }
    }

    /// Counts one duration.
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.inner.bounds_ns.partition_point(|&b| b < ns);
        self.inner.counts[i].fetch_add(1, Ordering::Relaxed);
        self.inner.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for Timing {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Timing {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self
            .inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let mut buckets: Vec<(f64, u64)> = self
            .inner
            .bounds
            .iter()
            .copied()
            .zip(counts.iter().copied())
            .collect();
        // The encoder writes `le="+Inf"` for f64::MAX.
        buckets.push((f64::MAX, counts.last().copied().unwrap_or(0)));
        let sum = self.inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A count kept elsewhere (the store's, the policy runtime's), written
/// as a counter by a collector at scrape time.
#[derive(Clone, Copy, Debug, Default)]
struct CopiedCounter(u64);

impl TypedMetric for CopiedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for CopiedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.0, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// What a collector writes at a scrape: figures read now, each a gauge or
/// a counter, alone or by one label.
pub struct Figures<'a>(DescriptorEncoder<'a>);

impl std::fmt::Debug for Figures<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Figures")
    }
}

impl<'a> Figures<'a> {
    /// Figures written through `encoder` (the one a collector is given).
    pub fn new(encoder: DescriptorEncoder<'a>) -> Self {
        Self(encoder)
    }

    /// A gauge: a value that goes up and down (a size, a state).
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        value: u64,
    ) -> std::fmt::Result {
        let g: Gauge = Gauge::default();
        g.set(i64::try_from(value).unwrap_or(i64::MAX));
        g.encode(
            self.0
                .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?,
        )
    }

    /// A counter kept by the owner: a total that only grows.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> std::fmt::Result {
        CopiedCounter(value).encode(self.0.encode_descriptor(
            name,
            help,
            None,
            MetricType::Counter,
        )?)
    }

    /// Gauges by one label, `label="value"` for each of `values`.
    pub fn gauges_by(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        label: &'static str,
        values: &[(&'static str, u64)],
    ) -> std::fmt::Result {
        let family: Family<Vec<(&'static str, &'static str)>, Gauge> = Family::default();
        for (v, n) in values {
            family
                .get_or_create(&vec![(label, *v)])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        family.encode(
            self.0
                .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?,
        )
    }

    /// Counters by one label, `label="value"` for each of `values`.
    pub fn counters_by(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        values: &[(&'static str, u64)],
    ) -> std::fmt::Result {
        let family: Family<Vec<(&'static str, &'static str)>, Counter> = Family::default();
        for (v, n) in values {
            family.get_or_create(&vec![(label, *v)]).inc_by(*n);
        }
        family.encode(
            self.0
                .encode_descriptor(name, help, None, MetricType::Counter)?,
        )
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: &'static str,
}

/// A family of timings, each made with `bounds`.
type TimingFamily<L> = Family<L, Timing, fn() -> Timing>;

fn network_timing() -> Timing {
    Timing::new(&NETWORK_BUCKETS)
}

fn hook_timing() -> Timing {
    Timing::new(&HOOK_BUCKETS)
}

/// Counters of one backend, resolved once per pipeline (see
/// [`Metrics::backend`]) so a fetch never looks its labels up.
#[derive(Clone, Debug)]
pub struct BackendMetrics {
    enabled: Arc<AtomicBool>,
    requests: Counter,
    failures: Counter,
    connect_errors: Counter,
    timeouts: Counter,
    response_time: Timing,
    healthy: Gauge,
    unhealthy: Counter,
    retries: Counter,
}

impl BackendMetrics {
    /// Whether anything is counted.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The start of a fetch, when counting is on.
    pub fn start(&self) -> Option<Instant> {
        self.enabled().then(Instant::now)
    }

    /// A fetch's outcome: `started` is [`BackendMetrics::start`]'s, and
    /// the time to the response head is recorded for answers.
    pub fn finished<T>(
        &self,
        started: Option<Instant>,
        result: &Result<T, inlay_core::ProxyError>,
    ) {
        let Some(started) = started else { return };
        self.requests.inc();
        match result {
            Ok(_) => self.response_time.observe(started.elapsed()),
            Err(e) => {
                self.failures.inc();
                match e {
                    inlay_core::ProxyError::BackendDown { .. } => {
                        self.connect_errors.inc();
                    }
                    inlay_core::ProxyError::BackendTimeout { .. } => {
                        self.timeouts.inc();
                    }
                    _ => {}
                }
            }
        }
    }

    /// The backend's health (probes; a backend without one is healthy):
    /// the gauge is set whether or not counting is on, as it is a state.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.set(i64::from(healthy));
    }

    /// A request not sent because the backend is sick.
    pub fn not_sent_sick(&self) {
        if self.enabled() {
            self.unhealthy.inc();
        }
    }

    /// A request sent again, to another backend of its director, after
    /// this backend failed it.
    pub fn retried_elsewhere(&self) {
        if self.enabled() {
            self.retries.inc();
        }
    }

    /// A response body that stalled past `between_bytes_timeout`.
    pub fn body_timeout(&self) {
        if self.enabled() {
            self.timeouts.inc();
            self.failures.inc();
        }
    }
}

/// Every metric of the process. Create one with [`Metrics::new`] and give
/// the same `Arc` to every pipeline generation
/// (`Pipeline::with_metrics`), so counts survive a reload.
#[derive(Debug)]
pub struct Metrics {
    /// `[metrics] enabled` of the current generation (a reload sets it).
    enabled: Arc<AtomicBool>,
    /// Locked to add a collector and to write the text.
    registry: Mutex<Registry>,

    requests: [Counter; 4],
    /// The client listeners' connections, counted by `inlay-listener`
    /// and read at scrape time (a collector in the registry).
    connections: Arc<inlay_listener::ConnectionStats>,
    /// The QUIC listeners' connections, Retries and refusals (a collector).
    quic: Arc<inlay_listener::QuicStats>,
    request_bytes: Counter,
    response_bytes: Counter,

    hits: Counter,
    grace_hits: Counter,
    stale_if_error_hits: Counter,
    revalidations: Counter,
    misses: Counter,
    hit_for_miss: Counter,
    passes: Counter,
    synthetic: Counter,
    errors: Counter,
    purge_requests: Counter,
    purged_objects: Counter,

    backend_requests: Family<BackendLabel, Counter>,
    backend_failures: Family<BackendLabel, Counter>,
    backend_connect_errors: Family<BackendLabel, Counter>,
    backend_timeouts: Family<BackendLabel, Counter>,
    backend_response_time: TimingFamily<BackendLabel>,
    backend_healthy: Family<BackendLabel, Gauge>,
    backend_unhealthy: Family<BackendLabel, Counter>,
    backend_retries: Family<BackendLabel, Counter>,

    esi_pages: Counter,
    esi_includes: Counter,
    esi_include_errors: Family<KindLabel, Counter>,
    esi_omitted: Counter,
    esi_failed: Counter,
    esi_include_time: Timing,

    hook_time: [Timing; 3],
    policy_traps: Counter,
    policy_timeouts: Counter,
    policy_oom: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The protocols of `inlay_client_requests_total`, in label order.
const PROTOCOLS: [&str; 4] = ["http/1.0", "http/1.1", "http/2", "http/3"];

/// The hooks of `inlay_policy_hook_time_seconds`, in label order.
const HOOKS: [&str; 3] = ["on_request", "on_backend_response", "on_deliver"];

impl Metrics {
    /// All metrics at zero; with `enabled` false nothing is ever counted
    /// (the names are still rendered, at zero).
    pub fn new(enabled: bool) -> Arc<Self> {
        let c = Counter::default;
        let requests: Family<ProtocolLabel, Counter> = Family::default();
        let esi_include_errors: Family<KindLabel, Counter> = Family::default();
        let hook_time: TimingFamily<HookLabel> = Family::new_with_constructor(hook_timing);
        let mut m = Self {
            enabled: Arc::new(AtomicBool::new(enabled)),
            registry: Mutex::new(Registry::with_prefix("inlay")),
            requests: PROTOCOLS
                .map(|protocol| requests.get_or_create(&ProtocolLabel { protocol }).clone()),
            connections: Arc::new(inlay_listener::ConnectionStats::new(enabled)),
            quic: Arc::new(inlay_listener::QuicStats::new(enabled)),
            request_bytes: c(),
            response_bytes: c(),
            hits: c(),
            grace_hits: c(),
            stale_if_error_hits: c(),
            revalidations: c(),
            misses: c(),
            hit_for_miss: c(),
            passes: c(),
            synthetic: c(),
            errors: c(),
            purge_requests: c(),
            purged_objects: c(),
            backend_requests: Family::default(),
            backend_failures: Family::default(),
            backend_connect_errors: Family::default(),
            backend_timeouts: Family::default(),
            backend_response_time: Family::new_with_constructor(network_timing),
            backend_healthy: Family::default(),
            backend_unhealthy: Family::default(),
            backend_retries: Family::default(),
            esi_pages: c(),
            esi_includes: c(),
            esi_omitted: esi_include_errors.get_or_create_owned(&KindLabel { kind: "omitted" }),
            esi_failed: esi_include_errors.get_or_create_owned(&KindLabel { kind: "failed" }),
            esi_include_errors: esi_include_errors.clone(),
            esi_include_time: network_timing(),
            hook_time: HOOKS.map(|hook| hook_time.get_or_create(&HookLabel { hook }).clone()),
            policy_traps: c(),
            policy_timeouts: c(),
            policy_oom: c(),
        };
        let mut r = Registry::with_prefix("inlay");
        r.register(
            "client_requests",
            "Client requests received (Varnish MAIN.client_req)",
            requests,
        );
        r.register_with_unit(
            "policy_hook_time",
            "Time in a policy hook, replayed or live",
            Unit::Seconds,
            hook_time,
        );
        m.register_all(&mut r);
        m.registry = Mutex::new(r);
        Arc::new(m)
    }

    fn register_all(&self, r: &mut Registry) {
        // `inlay_connections_open`, `inlay_connections_accepted_total`.
        r.register_collector(Box::new(Arc::clone(&self.connections)));
        // `inlay_quic_connections_open`, `inlay_quic_retries_total`, ...
        r.register_collector(Box::new(Arc::clone(&self.quic)));
        r.register_with_unit(
            "client_request_body",
            "Request body bytes read from clients (MAIN.s_req_bodybytes)",
            Unit::Bytes,
            self.request_bytes.clone(),
        );
        r.register_with_unit(
            "client_response_body",
            "Response body bytes written to clients (MAIN.s_resp_bodybytes)",
            Unit::Bytes,
            self.response_bytes.clone(),
        );
        let counters: [(&str, &str, &Counter); 13] = [
            (
                "cache_hits",
                "Requests served from the cache, stale ones included (MAIN.cache_hit)",
                &self.hits,
            ),
            (
                "cache_grace_hits",
                "Stale objects served within grace while refreshed (MAIN.cache_hit_grace)",
                &self.grace_hits,
            ),
            (
                "cache_stale_if_error_hits",
                "Stale objects served because the backend failed (stale-if-error)",
                &self.stale_if_error_hits,
            ),
            (
                "cache_revalidations",
                "Expired objects the backend confirmed unchanged (304) and served",
                &self.revalidations,
            ),
            (
                "cache_misses",
                "Requests fetched from the backend for the cache (MAIN.cache_miss)",
                &self.misses,
            ),
            (
                "cache_hit_for_miss",
                "Requests fetched without coalescing: the key was recently uncacheable (MAIN.cache_hitmiss)",
                &self.hit_for_miss,
            ),
            (
                "cache_passes",
                "Requests passed to the backend without the cache (MAIN.s_pass)",
                &self.passes,
            ),
            (
                "cache_synthetic",
                "Responses the policy made itself (MAIN.s_synth)",
                &self.synthetic,
            ),
            (
                "request_errors",
                "Requests answered with an error page (MAIN.client_req_400 and friends, summed)",
                &self.errors,
            ),
            (
                "purge_requests",
                "PURGE and BAN requests accepted",
                &self.purge_requests,
            ),
            (
                "purged_objects",
                "Objects purged, by URL or surrogate key (MAIN.n_obj_purged)",
                &self.purged_objects,
            ),
            (
                "esi_pages",
                "Pages assembled by ESI (MAIN.esi_req)",
                &self.esi_pages,
            ),
            ("esi_includes", "ESI includes fetched", &self.esi_includes),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        r.register(
            "esi_include_errors",
            "ESI includes that failed: kind=omitted left out of the page, kind=failed ended it (MAIN.esi_errors)",
            self.esi_include_errors.clone(),
        );
        r.register_with_unit(
            "esi_include_time",
            "Time to fetch an ESI include through the cache",
            Unit::Seconds,
            self.esi_include_time.clone(),
        );
        r.register(
            "backend_requests",
            "Backend fetches (VBE.*.req)",
            self.backend_requests.clone(),
        );
        r.register(
            "backend_failures",
            "Backend fetches that failed: connect errors, timeouts, protocol errors, a full connection pool (MAIN.backend_fail)",
            self.backend_failures.clone(),
        );
        r.register(
            "backend_connect_errors",
            "Backend connections that could not be made (MAIN.backend_unhealthy, VBE.*.fail)",
            self.backend_connect_errors.clone(),
        );
        r.register(
            "backend_timeouts",
            "Backend first-byte and between-bytes timeouts",
            self.backend_timeouts.clone(),
        );
        r.register_with_unit(
            "backend_response_time",
            "Time from sending a backend request to its response head",
            Unit::Seconds,
            self.backend_response_time.clone(),
        );
        r.register(
            "backend_healthy",
            "1 while the backend is healthy (its probe's window; always 1 without a probe), 0 while sick (VBE.*.happy)",
            self.backend_healthy.clone(),
        );
        r.register(
            "backend_unhealthy",
            "Requests not sent because the backend was sick (VBE.*.unhealthy)",
            self.backend_unhealthy.clone(),
        );
        r.register(
            "backend_retries",
            "Requests sent once more, to another backend of the director, after this backend failed them (MAIN.backend_retry)",
            self.backend_retries.clone(),
        );
        r.register(
            "policy_traps",
            "Policy hooks that trapped",
            self.policy_traps.clone(),
        );
        r.register(
            "policy_timeouts",
            "Policy hooks stopped at their CPU budget",
            self.policy_timeouts.clone(),
        );
        r.register(
            "policy_out_of_memory",
            "Policy hooks that ran out of memory",
            self.policy_oom.clone(),
        );
    }
}

impl Metrics {
    /// Whether anything is counted (`[metrics] enabled`).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turn counting on or off (a reload applies `[metrics] enabled`):
    /// counts so far stay; nothing is counted while it is off.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
        self.connections.set_counting(on);
        self.quic.set_counting(on);
    }

    /// The flag [`Metrics::enabled`] reads, for counters kept elsewhere
    /// that count only while these do (the cluster's).
    pub fn enabled_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.enabled)
    }

    /// Figures their owner keeps and writes itself at each scrape, after
    /// these (the cluster's: `inlay_cluster_*`, `inlay_policy_info`).
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry.lock().register_collector(collector);
    }

    /// The text of every metric for `GET /metrics` (OpenMetrics, served as
    /// [`CONTENT_TYPE`]), the collectors' figures read now. On the blocking
    /// pool: a collector may ask the file system (the disk tier's size).
    pub async fn render(self: &Arc<Self>) -> String {
        let metrics = Arc::clone(self);
        tokio::task::spawn_blocking(move || metrics.encode())
            .await
            .unwrap_or_default()
    }

    /// The text of every metric, the collectors' figures read on this
    /// thread (which may block: see [`Metrics::render`]).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry.lock());
        out
    }

    /// A client request, by the protocol it came in.
    pub fn client_request(&self, version: http::Version) {
        if !self.enabled() {
            return;
        }
        let i = match version {
            http::Version::HTTP_09 | http::Version::HTTP_10 => 0,
            http::Version::HTTP_11 => 1,
            http::Version::HTTP_3 => 3,
            _ => 2,
        };
        self.requests[i].inc();
    }

    /// What the client listeners count of their connections (they count
    /// only while counting is on).
    pub fn connections(&self) -> &Arc<inlay_listener::ConnectionStats> {
        &self.connections
    }

    /// What the QUIC listeners count (only while counting is on).
    pub fn quic(&self) -> &Arc<inlay_listener::QuicStats> {
        &self.quic
    }

    /// Request body bytes read from a client.
    pub fn request_body_bytes(&self, n: u64) {
        if self.enabled() {
            self.request_bytes.inc_by(n);
        }
    }

    /// Response body bytes written to a client.
    pub fn response_body_bytes(&self, n: u64) {
        if self.enabled() {
            self.response_bytes.inc_by(n);
        }
    }

    /// How a client request was served: the status of its access-log line.
    pub fn served(&self, status: &CacheStatus) {
        if !self.enabled() {
            return;
        }
        match status {
            CacheStatus::Hit { .. } => self.hits.inc(),
            CacheStatus::Stale { reason, .. } => {
                self.hits.inc();
                match reason {
                    inlay_core::StaleReason::Grace => self.grace_hits.inc(),
                    inlay_core::StaleReason::StaleIfError => self.stale_if_error_hits.inc(),
                }
            }
            CacheStatus::Revalidated => self.revalidations.inc(),
            CacheStatus::Miss { .. } => self.misses.inc(),
            CacheStatus::HitForMiss { .. } => self.hit_for_miss.inc(),
            CacheStatus::Pass => self.passes.inc(),
            CacheStatus::Synthetic => self.synthetic.inc(),
            CacheStatus::Purge => self.purge_requests.inc(),
            CacheStatus::Error => self.errors.inc(),
        };
    }

    /// Objects removed or marked stale by a purge (PURGE or the admin API).
    pub fn purged(&self, objects: u64) {
        if self.enabled() {
            self.purged_objects.inc_by(objects);
        }
    }

    /// The counters of backend `name`: resolve once per pipeline, not per
    /// request (a label lookup takes a lock).
    pub fn backend(&self, name: &str) -> BackendMetrics {
        let label = BackendLabel {
            backend: name.to_owned(),
        };
        BackendMetrics {
            enabled: Arc::clone(&self.enabled),
            requests: self.backend_requests.get_or_create(&label).clone(),
            failures: self.backend_failures.get_or_create(&label).clone(),
            connect_errors: self.backend_connect_errors.get_or_create(&label).clone(),
            timeouts: self.backend_timeouts.get_or_create(&label).clone(),
            response_time: self.backend_response_time.get_or_create(&label).clone(),
            healthy: self.backend_healthy.get_or_create(&label).clone(),
            unhealthy: self.backend_unhealthy.get_or_create(&label).clone(),
            retries: self.backend_retries.get_or_create(&label).clone(),
        }
    }

    /// A page whose assembly starts.
    pub fn esi_page(&self) {
        if self.enabled() {
            self.esi_pages.inc();
        }
    }

    /// An include whose fetch starts; give the instant to
    /// [`Metrics::esi_include_done`].
    pub fn esi_include(&self) -> Option<Instant> {
        self.enabled().then(|| {
            self.esi_includes.inc();
            Instant::now()
        })
    }

    /// An include's fetch ended (answered or failed).
    pub fn esi_include_done(&self, started: Option<Instant>) {
        if let Some(started) = started {
            self.esi_include_time.observe(started.elapsed());
        }
    }

    /// An include left out of its page (`on_include_error = "omit"`).
    pub fn esi_include_omitted(&self) {
        if self.enabled() {
            self.esi_omitted.inc();
        }
    }

    /// A page ended by a failed include (`on_include_error = "fail"`).
    pub fn esi_include_failed(&self) {
        if self.enabled() {
            self.esi_failed.inc();
        }
    }

    /// The start of a policy hook, when counting is on.
    pub fn hook_start(&self) -> Option<Instant> {
        self.enabled().then(Instant::now)
    }

    /// A policy hook ended: its time, and whether it trapped, timed out or
    /// ran out of memory.
    pub fn hook_done<T>(
        &self,
        hook: Hook,
        started: Option<Instant>,
        result: &Result<T, PolicyError>,
    ) {
        let Some(started) = started else { return };
        let i = match hook {
            Hook::OnRequest => 0,
            Hook::OnBackendResponse => 1,
            Hook::OnDeliver => 2,
            Hook::Instantiate => return,
        };
        self.hook_time[i].observe(started.elapsed());
        match result {
            Err(PolicyError::Trap { .. }) => self.policy_traps.inc(),
            Err(PolicyError::Timeout { .. }) => self.policy_timeouts.inc(),
            Err(PolicyError::OutOfMemory { .. }) => self.policy_oom.inc(),
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, series: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn a_timing_puts_each_duration_in_the_first_bucket_that_holds_it() {
        let t = Timing::new(&NETWORK_BUCKETS);
        t.observe(Duration::from_micros(500)); // <= 1 ms
        t.observe(Duration::from_millis(1)); // on the bound: <= 1 ms
        t.observe(Duration::from_millis(7)); // <= 10 ms
        t.observe(Duration::from_secs(3600)); // +Inf only
        assert_eq!(t.count(), 4);
        let mut r = Registry::default();
        r.register_with_unit("t", "test", Unit::Seconds, t);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        // Cumulative, as the format wants.
        assert_eq!(sample(&text, "t_seconds_bucket{le=\"0.001\"}"), "2");
        assert_eq!(sample(&text, "t_seconds_bucket{le=\"0.005\"}"), "2");
        assert_eq!(sample(&text, "t_seconds_bucket{le=\"0.01\"}"), "3");
        assert_eq!(sample(&text, "t_seconds_bucket{le=\"30.0\"}"), "3");
        assert_eq!(sample(&text, "t_seconds_bucket{le=\"+Inf\"}"), "4");
        assert_eq!(sample(&text, "t_seconds_count"), "4");
        let sum: f64 = sample(&text, "t_seconds_sum").parse().unwrap();
        assert!((sum - 3600.0085).abs() < 1e-6, "{sum}");
        assert!(text.contains("# TYPE t_seconds histogram"), "{text}");
    }

    #[test]
    fn counts_show_in_the_text_and_a_disabled_registry_stays_at_zero() {
        for enabled in [true, false] {
            let m = Metrics::new(enabled);
            m.client_request(http::Version::HTTP_2);
            m.served(&CacheStatus::Stale {
                stale_for: 3,
                reason: inlay_core::StaleReason::Grace,
            });
            m.purged(5);
            let b = m.backend("origin-1");
            b.finished::<()>(b.start(), &Ok(()));
            {
                let _open = m.connections().opened();
                assert_eq!(
                    sample(&m.encode(), "inlay_connections_open"),
                    if enabled { "1" } else { "0" }
                );
            }
            let text = m.encode();
            let n = if enabled { "1" } else { "0" };
            assert_eq!(sample(&text, "inlay_connections_open"), "0");
            assert_eq!(
                sample(&text, "inlay_client_requests_total{protocol=\"http/2\"}"),
                n
            );
            assert_eq!(sample(&text, "inlay_cache_hits_total"), n);
            assert_eq!(sample(&text, "inlay_cache_grace_hits_total"), n);
            assert_eq!(
                sample(&text, "inlay_purged_objects_total"),
                if enabled { "5" } else { "0" }
            );
            assert_eq!(
                sample(&text, "inlay_backend_requests_total{backend=\"origin-1\"}"),
                n
            );
            assert!(text.ends_with("# EOF\n"));
        }
    }

    /// A collector's figures, written with the registry's prefix.
    #[derive(Debug)]
    struct Owned;

    impl Collector for Owned {
        fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
            let mut f = Figures::new(encoder);
            f.gauge("owned_size", "A size", Some(Unit::Bytes), 7)?;
            f.counter("owned_events", "Events", 3)?;
            f.gauges_by("owned_by", "By tier", None, "tier", &[("a", 1), ("b", 2)])
        }
    }

    #[test]
    fn collectors_write_their_owners_figures_at_each_scrape() {
        let m = Metrics::new(true);
        m.register_collector(Box::new(Owned));
        let text = m.encode();
        assert_eq!(sample(&text, "inlay_owned_size_bytes"), "7");
        assert_eq!(sample(&text, "inlay_owned_events_total"), "3");
        assert_eq!(sample(&text, "inlay_owned_by{tier=\"b\"}"), "2");
        assert!(text.contains("# TYPE inlay_owned_events counter"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn render_can_run_on_any_worker_thread() {
        fn send<T: Send>(_: &T) {}
        let m = Metrics::new(true);
        send(&m.render());
    }
}
