//! Per-request cost of a policy: a fresh instance from the pool, the three
//! hooks, and dropping the instance; and (`<name>/replayed`) the same
//! request answered from the paths recorded by earlier ones
//! (`runtime::memo`), as repeated requests are.
//!
//! Run: `cargo bench -p inlay-runtime --bench policy_call`
//! Policies: `headers` from `target/policies/` (`make policies`) or
//! `$INLAY_POLICY_DIR`, plus the runtime's probe guest; set
//! `INLAY_BENCH_POLICIES=headers,headers-js,headers-py` for others.
//! After criterion's report it prints p50/p90/p99 of single requests
//! (`INLAY_BENCH_ROUNDS` of them, default 500 or 20000 by speed): `live`
//! instantiates on the request's path; `spare` starts from an instance
//! made ahead (`pre_instantiate`), refilled between requests as a server's
//! idle moments do; `released` gives the instance back after on-request
//! (as the pipeline does before a miss waits on the backend) and
//! on-backend-response catches a new one up. Criterion's back-to-back loop leaves no such moments,
//! so its figures are the whole CPU cost of a request either way.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use inlay_core::{CacheSettings, RequestHead, ResponseHead};
use inlay_runtime::{
    CachedObject, FetchError, LoadedPolicy, NewObject, PolicyEngine, PolicyHandle, PolicyLimits,
    PolicyServices, PolicySource, SubRequest, SubResponse,
};

/// Services that are never called by the benchmarked hooks.
struct NullServices;

impl PolicyServices for NullServices {
    fn backend_exists(&self, name: &str) -> bool {
        name == "origin"
    }
    fn cache_lookup(
        &self,
        _: &str,
        _: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>> {
        Box::pin(async { Ok(None) })
    }
    fn cache_insert(
        &self,
        _: &str,
        _: &str,
        _: NewObject,
    ) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn cache_purge_url(
        &self,
        _: &str,
        _: &str,
        _: bool,
    ) -> BoxFuture<'static, Result<u32, String>> {
        Box::pin(async { Ok(0) })
    }
    fn cache_purge_key(&self, _: &str, _: bool) -> BoxFuture<'static, Result<u32, String>> {
        Box::pin(async { Ok(0) })
    }
    fn kv_get(&self, _: &str, _: &str) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>> {
        Box::pin(async { Ok(None) })
    }
    fn kv_set(&self, _: &str, _: &str, _: Vec<u8>) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn kv_delete(&self, _: &str, _: &str) -> BoxFuture<'static, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }
    fn fetch(&self, _: SubRequest, _: &str) -> BoxFuture<'static, Result<SubResponse, FetchError>> {
        Box::pin(async { Err(FetchError::Timeout) })
    }
}

fn request() -> RequestHead {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("host", "www.example.com"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64) bench"),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-language", "en-GB,en;q=0.9"),
        ("accept-encoding", "gzip, br"),
        ("cookie", "session=abc123"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    RequestHead {
        method: Method::GET,
        uri: "/articles/42?utm_source=news&page=2".parse().expect("uri"),
        headers,
        client_ip: "192.0.2.1".parse().expect("ip"),
        backend: "origin".into(),
        cache_key_extra: Vec::new(),
    }
}

fn response() -> ResponseHead {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "text/html; charset=utf-8"),
        ("cache-control", "public, max-age=60"),
        ("server", "origin/1.0"),
        ("x-powered-by", "php"),
        ("etag", "\"abc\""),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    ResponseHead {
        status: StatusCode::OK,
        headers,
    }
}

/// One whole request through the policy (a miss: all three hooks).
async fn one_request(handle: &Arc<PolicyHandle>) {
    request_releasing(handle, false).await;
}

/// One whole request; with `release`, the instance goes back to the pool
/// before the backend would be waited on, as the pipeline does, and
/// `on-backend-response` catches a new one up.
async fn request_releasing(handle: &Arc<PolicyHandle>, release: bool) {
    let mut call = handle.start().await.expect("start");
    let mut req = request();
    call.on_request(&mut req).await.expect("on_request");
    if release {
        call.release();
    }
    let mut resp = response();
    let defaults = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        ..CacheSettings::default()
    };
    call.on_backend_response(&mut req, &mut resp, defaults)
        .await
        .expect("on_backend_response");
    call.on_deliver(&mut req, &mut resp)
        .await
        .expect("on_deliver");
    drop(call);
}

fn policies(engine: &PolicyEngine) -> Vec<(String, LoadedPolicy)> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var_os("INLAY_POLICY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../target/policies"));
    let mut out = Vec::new();
    let wanted = std::env::var("INLAY_BENCH_POLICIES").unwrap_or_else(|_| "headers".into());
    let mut candidates: Vec<(String, PathBuf)> = wanted
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_string(), dir.join(format!("{n}.wasm"))))
        .collect();
    candidates.push((
        "probe".into(),
        manifest.join("src/testdata/probe.core.wasm"),
    ));
    for (name, path) in candidates {
        if !path.exists() {
            eprintln!(
                "skipping {name}: {} not found (run `make policies`)",
                path.display()
            );
            continue;
        }
        let source = PolicySource {
            path,
            config: BTreeMap::new(),
            // Interpreted guests (JS, Python) need more than the default.
            limits: PolicyLimits {
                cpu_time_ms: 1000,
                ..PolicyLimits::default()
            },
            name: name.clone(),
            // INLAY_BENCH_COLD=1 measures instances of the file as it is.
            prewarm: std::env::var_os("INLAY_BENCH_COLD").is_none(),
            pre_instantiate: true,
            // The instance's cost; `replayed` below measures the other path.
            memo_bytes: 0,
            requests_per_instance: 1,
            instance_lifetime: Duration::from_secs(60),
        };
        let started = Instant::now();
        let replaying = PolicySource {
            memo_bytes: 16 << 20,
            ..source.clone()
        };
        let policy = LoadedPolicy::compile(engine, source).expect("compile");
        eprintln!(
            "compiled {name} in {:?} (pre-warmed: {})",
            started.elapsed(),
            policy.prewarmed()
        );
        out.push((name.clone(), policy));
        // The same policy answering repeated requests from recorded paths.
        let policy = LoadedPolicy::compile(engine, replaying).expect("compile");
        out.push((format!("{name}/replayed"), policy));
    }
    out
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let engine = PolicyEngine::new(&PolicyLimits::default()).expect("engine");
    let services: Arc<dyn PolicyServices> = Arc::new(NullServices);
    let policies = policies(&engine);

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("policy_call");
        for (name, policy) in &policies {
            let handle = PolicyHandle::new(policy.clone(), Arc::clone(&services));
            group.bench_function(format!("{name}/request"), |b| {
                b.to_async(&runtime).iter(|| one_request(&handle));
            });
            if name.ends_with("/replayed") {
                continue;
            }
            // The floor: a fresh instance and its drop, no hook.
            group.bench_function(format!("{name}/instantiate"), |b| {
                b.to_async(&runtime).iter(|| async {
                    drop(handle.start().await.expect("start"));
                });
            });
        }
        group.finish();
    }
    criterion.final_summary();

    // Criterion reports means; the target is a median, so measure that too.
    for (name, policy) in &policies {
        let live = PolicyHandle::new(policy.clone(), Arc::clone(&services));
        let spare = PolicyHandle::keeping_instances(policy.clone(), Arc::clone(&services));
        // Fewer rounds for slow (interpreted) guests.
        let probe_started = Instant::now();
        runtime.block_on(one_request(&live));
        let rounds = match std::env::var("INLAY_BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
        {
            Some(rounds) => rounds,
            None if probe_started.elapsed() > Duration::from_millis(1) => 500,
            None => 20_000,
        };
        // Released: the instance is given back while the backend would be
        // waited on, and on-backend-response catches a new one up.
        let modes: &[(&str, &Arc<PolicyHandle>, bool)] = if name.ends_with("/replayed") {
            &[("", &live, false)]
        } else {
            &[
                (" live", &live, false),
                (" spare", &spare, false),
                (" released", &live, true),
                (" released, spare", &spare, true),
            ]
        };
        for &(mode, handle, release) in modes {
            let samples = runtime.block_on(async {
                let mut samples = Vec::with_capacity(rounds);
                for _ in 0..rounds / 10 {
                    request_releasing(handle, release).await;
                    tokio::task::yield_now().await;
                }
                for _ in 0..rounds {
                    // Let the spare be made, as it is between requests.
                    tokio::task::yield_now().await;
                    let started = Instant::now();
                    request_releasing(handle, release).await;
                    samples.push(started.elapsed());
                }
                samples
            });
            report(&format!("{name}{mode}"), samples);
        }
    }
    println!(
        "instances started ahead: {}",
        policies
            .iter()
            .map(|(_, p)| p.instances_started_ahead())
            .sum::<u64>()
    );
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pct = |p: usize| samples[samples.len() * p / 100];
    println!(
        "policy_call/{name}: p50 {:?}  p90 {:?}  p99 {:?}  ({} requests)",
        pct(50),
        pct(90),
        pct(99),
        samples.len()
    );
}
