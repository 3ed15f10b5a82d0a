//! Per-request cost of a policy, in the modes a server runs it.
//!
//! Run: `cargo bench -p inlay-runtime --bench policy_call`
//! Policies: `headers` from `target/policies/` (`make policies`) or
//! `$INLAY_POLICY_DIR`, plus the runtime's probe guest; set
//! `INLAY_BENCH_POLICIES=headers,headers-c,headers-js,headers-py` for
//! others. Each request is a whole miss (the three hooks; a hook the
//! policy does not implement runs in the host) through a handle kept like
//! a worker thread's (`PolicyHandle::keeping_instances`):
//!
//! * `new path`: the default configuration (instances reused,
//!   `requests_per_instance` 1000; replay on, 16 MiB), a URL no request
//!   had before, so the policy runs and its path is recorded: what a
//!   request the policy has not seen costs;
//! * `new path, replay always`: the same with `replay_always`: every
//!   request walks the trees first (by default a thread runs its requests
//!   live while that costs less, as on new paths);
//! * `new path, fresh`: the same with `requests_per_instance = 1`: a fresh
//!   instance of the snapshot per request (one made ahead between
//!   requests, `pre_instantiate`, as a server's idle moments allow);
//! * `live` / `live, fresh`: replay off (`memo_size = 0`), the same URL;
//! * `replayed`: the same URL again and again, answered from its path;
//! * `released`: replay off, the instance given back after on-request (as
//!   the pipeline does before a miss waits on the backend) and caught up
//!   at on-backend-response.
//!
//! Criterion measures each mode's back-to-back loop (the whole CPU cost of
//! a request: a fresh instance made ahead still costs its instantiation;
//! making the request's heads is not counted, a server has them anyway);
//! after its report the bench prints p50/p90/p99 of single requests
//! (`INLAY_BENCH_ROUNDS` of them, default 500 or 20000 by speed), each
//! after a yield that lets the spare be made, and how many instances each
//! mode made per request.
//!
//! To profile one mode alone: `INLAY_BENCH_PROFILE="headers/new path"`
//! runs only its requests, back to back, for 10 s (under `perf record`,
//! with `INLAY_PERF_MAP=1` for the guest's function names).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

fn request(n: Option<u64>) -> RequestHead {
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
        uri: match n {
            Some(n) => format!("/articles/{n}?utm_source=news&page=2"),
            None => "/articles/42?utm_source=news&page=2".to_string(),
        }
        .parse()
        .expect("uri"),
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

/// One whole request (a miss: the three hooks) with the heads given (a
/// server has them before the policy runs); with `release`, the instance
/// goes back after on-request, as the pipeline does before it waits on the
/// backend.
async fn one_request(
    handle: &Arc<PolicyHandle>,
    (mut req, mut resp): (RequestHead, ResponseHead),
    release: bool,
) {
    let mut call = handle.start().await.expect("start");
    call.on_request(&mut req).await.expect("on_request");
    if release {
        call.release();
    }
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

/// A way of running the policy.
struct Mode {
    name: &'static str,
    /// Requests per instance.
    reuse: u32,
    /// Replay trees' size.
    memo: usize,
    /// Each request on a URL of its own.
    new_paths: bool,
    release: bool,
    /// Walk the trees for every request (`replay_always`), not only while
    /// that costs less than running live.
    always: bool,
}

const MODES: &[Mode] = &[
    Mode {
        name: "new path",
        reuse: 1000,
        memo: 16 << 20,
        new_paths: true,
        release: false,
        always: false,
    },
    Mode {
        name: "new path, replay always",
        reuse: 1000,
        memo: 16 << 20,
        new_paths: true,
        release: false,
        always: true,
    },
    Mode {
        name: "new path, fresh",
        reuse: 1,
        memo: 16 << 20,
        new_paths: true,
        release: false,
        always: false,
    },
    Mode {
        name: "live",
        reuse: 1000,
        memo: 0,
        new_paths: false,
        release: false,
        always: false,
    },
    Mode {
        name: "live, fresh",
        reuse: 1,
        memo: 0,
        new_paths: false,
        release: false,
        always: false,
    },
    Mode {
        name: "replayed",
        reuse: 1000,
        memo: 16 << 20,
        new_paths: false,
        release: false,
        always: false,
    },
    Mode {
        name: "released",
        reuse: 1000,
        memo: 0,
        new_paths: false,
        release: true,
        always: false,
    },
    Mode {
        name: "released, fresh",
        reuse: 1,
        memo: 0,
        new_paths: false,
        release: true,
        always: false,
    },
];

/// The policies to measure, by name and file.
fn policy_files() -> Vec<(String, PathBuf)> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var_os("INLAY_POLICY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../target/policies"));
    let wanted = std::env::var("INLAY_BENCH_POLICIES").unwrap_or_else(|_| "headers".into());
    let mut files: Vec<(String, PathBuf)> = wanted
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_string(), dir.join(format!("{n}.wasm"))))
        .collect();
    files.push((
        "probe".into(),
        manifest.join("src/testdata/probe.core.wasm"),
    ));
    files.retain(|(name, path)| {
        let found = path.exists();
        if !found {
            eprintln!(
                "skipping {name}: {} not found (run `make policies`)",
                path.display()
            );
        }
        found
    });
    files
}

/// `path` loaded in `mode` (pre-warmed unless `INLAY_BENCH_COLD=1`).
fn load(engine: &PolicyEngine, name: &str, path: &Path, mode: &Mode) -> LoadedPolicy {
    let source = PolicySource {
        path: path.to_path_buf(),
        config: BTreeMap::new(),
        // Interpreted guests (JS, Python) need more than the default.
        limits: PolicyLimits {
            cpu_time_ms: 1000,
            ..PolicyLimits::default()
        },
        name: name.to_string(),
        prewarm: std::env::var_os("INLAY_BENCH_COLD").is_none(),
        pre_instantiate: true,
        memo_bytes: mode.memo,
        replay_measured: !mode.always,
        requests_per_instance: mode.reuse,
        instance_lifetime: Duration::from_secs(3600),
    };
    let started = Instant::now();
    let policy = LoadedPolicy::compile(engine, source).expect("compile");
    eprintln!(
        "compiled {name} for {} in {:?} (pre-warmed: {}; implements {:?})",
        mode.name,
        started.elapsed(),
        policy.prewarmed(),
        policy.implemented_hooks()
    );
    policy
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let engine = PolicyEngine::new(&PolicyLimits::default()).expect("engine");
    let services: Arc<dyn PolicyServices> = Arc::new(NullServices);
    let mut loaded = Vec::new();
    for (name, path) in policy_files() {
        for mode in MODES {
            loaded.push((name.clone(), mode, load(&engine, &name, &path, mode)));
        }
    }
    let next_url = std::sync::atomic::AtomicU64::new(0);
    // The heads of a request in `mode`: on a URL of its own when it is
    // about new paths.
    let heads = |mode: &Mode| {
        let n = mode
            .new_paths
            .then(|| next_url.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        (request(n), response())
    };

    if let Ok(only) = std::env::var("INLAY_BENCH_PROFILE") {
        let (_, mode, policy) = loaded
            .iter()
            .find(|(name, mode, _)| format!("{name}/{}", mode.name) == only)
            .unwrap_or_else(|| panic!("no policy and mode {only:?}"));
        let handle = PolicyHandle::keeping_instances(policy.clone(), Arc::clone(&services));
        let started = Instant::now();
        let mut requests = 0u64;
        runtime.block_on(async {
            while started.elapsed() < Duration::from_secs(10) {
                one_request(&handle, heads(mode), mode.release).await;
                requests += 1;
            }
        });
        println!("{only}: {requests} requests in 10 s");
        return;
    }

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("policy_call");
        for (name, mode, policy) in &loaded {
            let handle = PolicyHandle::keeping_instances(policy.clone(), Arc::clone(&services));
            group.bench_function(format!("{name}/{}", mode.name), |b| {
                b.to_async(&runtime).iter_batched(
                    || heads(mode),
                    |heads| one_request(&handle, heads, mode.release),
                    criterion::BatchSize::SmallInput,
                );
            });
        }
        group.finish();
    }
    criterion.final_summary();

    // Criterion reports means; the target is a median, so measure that too.
    for (name, mode, policy) in &loaded {
        let handle = PolicyHandle::keeping_instances(policy.clone(), Arc::clone(&services));
        // Fewer rounds for slow (interpreted) guests.
        let probe_started = Instant::now();
        runtime.block_on(one_request(&handle, heads(mode), mode.release));
        let rounds = match std::env::var("INLAY_BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
        {
            Some(rounds) => rounds,
            None if probe_started.elapsed() > Duration::from_millis(1) => 500,
            None => 20_000,
        };
        let before = policy.instance_stats();
        let samples = runtime.block_on(async {
            let mut samples = Vec::with_capacity(rounds);
            for _ in 0..rounds / 10 {
                one_request(&handle, heads(mode), mode.release).await;
                tokio::task::yield_now().await;
            }
            for _ in 0..rounds {
                // Let the spare be made, as it is between requests.
                tokio::task::yield_now().await;
                let request = heads(mode);
                let started = Instant::now();
                one_request(&handle, request, mode.release).await;
                samples.push(started.elapsed());
            }
            samples
        });
        let after = policy.instance_stats();
        let per_request = (after.instantiated - before.instantiated) as f64
            / (after.requests - before.requests).max(1) as f64;
        report(&format!("{name} {}", mode.name), samples, per_request);
    }
}

fn report(name: &str, mut samples: Vec<Duration>, instances_per_request: f64) {
    samples.sort();
    let pct = |p: usize| samples[samples.len() * p / 100];
    println!(
        "policy_call/{name}: p50 {:?}  p90 {:?}  p99 {:?}  ({} requests, {instances_per_request:.3} instances each)",
        pct(50),
        pct(90),
        pct(99),
        samples.len()
    );
}
