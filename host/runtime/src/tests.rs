//! End-to-end tests of the runtime with real components: the probe guest in
//! `testdata/` (every import, every failure mode, chosen by request path)
//! and the example policies from `policies/` (built by `make policies`
//! into `target/policies/`, or `$INLAY_POLICY_DIR`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use inlay_core::{
    CacheSettings, EsiOverrides, RequestAction, RequestHead, ResponseHead, SyntheticResponse,
};
use parking_lot::Mutex;

use super::*;

/// In-memory services that record what the policy did.
#[derive(Default)]
pub(crate) struct FakeServices {
    kv: Mutex<HashMap<(String, String), Vec<u8>>>,
    cache: Mutex<HashMap<(String, String), NewObject>>,
    /// Paths fetched, in order of arrival.
    fetched: Mutex<Vec<String>>,
    /// How long each fetch takes.
    fetch_delay: Duration,
    in_flight: Arc<AtomicUsize>,
    /// The most fetches seen in flight at once.
    max_in_flight: Arc<AtomicUsize>,
}

impl FakeServices {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn with_fetch_delay(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            fetch_delay: delay,
            ..Self::default()
        })
    }
}

impl PolicyServices for FakeServices {
    fn backend_exists(&self, name: &str) -> bool {
        matches!(name, "origin" | "second")
    }

    fn cache_lookup(
        &self,
        host: &str,
        url: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>> {
        let found = self
            .cache
            .lock()
            .get(&(host.to_string(), url.to_string()))
            .map(|o| CachedObject {
                status: o.status,
                headers: o.headers.clone(),
                body: o.body.clone(),
                age: Duration::from_secs(1),
                ttl_left: o.ttl,
            });
        Box::pin(async move { Ok(found) })
    }

    fn cache_insert(
        &self,
        host: &str,
        url: &str,
        object: NewObject,
    ) -> BoxFuture<'static, Result<(), String>> {
        self.cache
            .lock()
            .insert((host.to_string(), url.to_string()), object);
        Box::pin(async { Ok(()) })
    }

    fn cache_purge_url(
        &self,
        host: &str,
        url: &str,
        _soft: bool,
    ) -> BoxFuture<'static, Result<u32, String>> {
        let removed = self
            .cache
            .lock()
            .remove(&(host.to_string(), url.to_string()))
            .is_some();
        Box::pin(async move { Ok(u32::from(removed)) })
    }

    fn cache_purge_key(&self, key: &str, _soft: bool) -> BoxFuture<'static, Result<u32, String>> {
        let mut cache = self.cache.lock();
        let before = cache.len();
        cache.retain(|_, o| !o.surrogate_keys.iter().any(|k| k == key));
        let n = u32::try_from(before - cache.len()).unwrap_or(u32::MAX);
        Box::pin(async move { Ok(n) })
    }

    fn kv_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>> {
        let found = self
            .kv
            .lock()
            .get(&(namespace.to_string(), key.to_string()))
            .cloned();
        Box::pin(async move { Ok(found) })
    }

    fn kv_set(
        &self,
        namespace: &str,
        key: &str,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), String>> {
        self.kv
            .lock()
            .insert((namespace.to_string(), key.to_string()), value);
        Box::pin(async { Ok(()) })
    }

    fn kv_delete(&self, namespace: &str, key: &str) -> BoxFuture<'static, Result<bool, String>> {
        let existed = self
            .kv
            .lock()
            .remove(&(namespace.to_string(), key.to_string()))
            .is_some();
        Box::pin(async move { Ok(existed) })
    }

    fn fetch(
        &self,
        req: SubRequest,
        default_backend: &str,
    ) -> BoxFuture<'static, Result<SubResponse, FetchError>> {
        let backend = req
            .backend
            .clone()
            .unwrap_or_else(|| default_backend.to_string());
        let path = req.uri.path().to_string();
        self.fetched.lock().push(path.clone());
        let delay = self.fetch_delay;
        let in_flight = Arc::clone(&self.in_flight);
        let max_in_flight = Arc::clone(&self.max_in_flight);
        Box::pin(async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            max_in_flight.fetch_max(now, Ordering::SeqCst);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(SubResponse {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::from(format!("{backend}{path}")),
            })
        })
    }
}

/// One engine for the whole test binary: a small pool keeps the address
/// space reservation modest when tests run in parallel.
fn engine() -> &'static PolicyEngine {
    static ENGINE: OnceLock<PolicyEngine> = OnceLock::new();
    ENGINE.get_or_init(|| PolicyEngine::new(&test_limits()).expect("engine"))
}

/// Limits for tests that are not about time: the CPU budget is measured
/// in wall time while the guest runs, and parallel tests on a small machine
/// deschedule each other, so give them room. The pool is [`engine`]'s, so
/// that a slot reloaded with these limits keeps it (another size would
/// make a pool of its own, 8 GiB of address space per instance).
fn test_limits() -> PolicyLimits {
    PolicyLimits {
        cpu_time_ms: 2000,
        max_instances: 100,
        ..PolicyLimits::default()
    }
}

fn probe_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/testdata/probe.core.wasm")
}

fn probe_source(limits: PolicyLimits) -> PolicySource {
    PolicySource {
        path: probe_path(),
        config: BTreeMap::from([
            ("greeting".to_string(), "hello".to_string()),
            ("mode".to_string(), "test".to_string()),
        ]),
        limits,
        name: "probe".to_string(),
        prewarm: false,
        pre_instantiate: true,
        // Every call below runs the guest; replay has its own tests.
        memo_bytes: 0,
        replay_measured: false,
        requests_per_instance: test_requests_per_instance(),
        instance_lifetime: Duration::from_secs(60),
    }
}

/// One request through the probe's three hooks (`on-request` looks the
/// request up); its `x-hooks`, which lists every hook its instance has run
/// so far: an instance that served another request shows it.
pub(crate) async fn hooks_seen(handle: &Arc<PolicyHandle>, path: &str) -> String {
    let mut call = handle.start().await.expect("start");
    let mut req = request(path);
    let action = call.on_request(&mut req).await.expect("on_request");
    assert_eq!(action, RequestAction::Lookup);
    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
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
    header(&resp.headers, "x-hooks")
        .expect("x-hooks")
        .to_string()
}

/// Requests per instance for tests that work in both modes: reused (the
/// default) unless `INLAY_TEST_REQUESTS_PER_INSTANCE` says otherwise (1
/// runs them with a fresh instance per request).
pub(crate) fn test_requests_per_instance() -> u32 {
    std::env::var("INLAY_TEST_REQUESTS_PER_INSTANCE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// The probe compiled once per test binary with default limits; tests that
/// need other limits re-wrap it with [`LoadedPolicy::reconfigured`].
fn probe() -> LoadedPolicy {
    static PROBE: OnceLock<LoadedPolicy> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            LoadedPolicy::compile(engine(), probe_source(test_limits())).expect("probe")
        })
        .clone()
}

fn probe_with(limits: PolicyLimits) -> LoadedPolicy {
    let source = probe_source(limits);
    probe()
        .reconfigured(source.name, source.config, source.limits)
        .expect("valid limits")
}

fn request(path: &str) -> RequestHead {
    let mut headers = HeaderMap::new();
    headers.insert("accept-language", HeaderValue::from_static("fr"));
    headers.insert("cookie", HeaderValue::from_static("session=1"));
    RequestHead {
        method: Method::GET,
        uri: path.parse().expect("valid path"),
        headers,
        client_ip: "192.0.2.7".parse().expect("ip"),
        backend: "origin".to_string(),
        cache_key_extra: Vec::new(),
    }
}

fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.get(name).and_then(|v| v.to_str().ok())
}

fn synthetic(action: RequestAction) -> SyntheticResponse {
    match action {
        RequestAction::Synthetic(s) => s,
        other => panic!("expected a synthetic response, got {other:?}"),
    }
}

async fn run_path(
    policy: &LoadedPolicy,
    services: Arc<FakeServices>,
    path: &str,
) -> Result<RequestAction, PolicyError> {
    let mut call = policy.start(services).await?;
    let mut req = request(path);
    call.on_request(&mut req).await
}

#[tokio::test]
async fn probe_hooks_round_trip_and_edit_the_heads() {
    let policy = probe();
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request("/page?x=1");
    req.headers
        .insert("x-set-method", HeaderValue::from_static("POST"));
    let action = call.on_request(&mut req).await.expect("on_request");
    assert_eq!(action, RequestAction::Lookup);
    assert_eq!(
        header(&req.headers, "x-seen"),
        Some("GET /page?x=1 192.0.2.7 origin")
    );
    assert_eq!(header(&req.headers, "x-multi-read"), Some("a|b"));
    assert!(req.headers.get("cookie").is_none(), "cookie removed");
    assert_eq!(req.cache_key_extra, vec!["fr".to_string()]);
    assert_eq!(req.method, Method::POST);

    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
    resp.headers
        .insert("server", HeaderValue::from_static("origin/1.0"));
    let defaults = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        grace: Duration::from_secs(1),
        keep: Duration::ZERO,
        surrogate_keys: vec!["a".into()],
        esi: false,
    };
    let settings = call
        .on_backend_response(&mut req, &mut resp, defaults)
        .await
        .expect("on_backend_response");
    assert_eq!(
        settings,
        CacheSettings {
            cacheable: true,
            ttl: Duration::from_secs(120),
            grace: Duration::from_secs(7),
            keep: Duration::from_secs(11),
            surrogate_keys: vec!["a".into(), "probe".into()],
            esi: false,
        }
    );
    assert_eq!(header(&resp.headers, "x-bres-url"), Some("/page?x=1"));
    assert_eq!(header(&resp.headers, "x-bres-status"), Some("200"));
    assert_eq!(header(&resp.headers, "x-bad-status-refused"), Some("true"));

    call.on_deliver(&mut req, &mut resp)
        .await
        .expect("on_deliver");
    assert_eq!(header(&resp.headers, "x-deliver"), Some("POST"));
    assert!(resp.headers.get("server").is_none(), "server removed");
    assert_eq!(
        header(&resp.headers, "x-names"),
        Some("x-deliver,x-hooks,x-bres-url,x-bres-status,x-bad-status-refused")
    );
    // One instance ran the three hooks, in order.
    assert_eq!(
        header(&resp.headers, "x-hooks"),
        Some("request /page?x=1,backend-response 60,deliver")
    );
    assert_eq!(header(&resp.headers, "x-via-count"), Some("1"));
    // The backend was chosen long ago: a late set-backend is refused.
    assert_eq!(header(&resp.headers, "x-late-backend"), Some("refused"));
    // The request survived three trips into the store unchanged otherwise.
    assert_eq!(req.backend, "origin");
    assert_eq!(req.uri.path(), "/page");
}

#[tokio::test]
async fn synthetic_pass_and_backend_choice() {
    let policy = probe();
    let s = synthetic(
        run_path(&policy, FakeServices::new(), "/synth")
            .await
            .expect("synth"),
    );
    assert_eq!(s.status, StatusCode::IM_A_TEAPOT);
    assert_eq!(header(&s.headers, "x-synth"), Some("1"));
    assert_eq!(s.body, Bytes::from_static(b"short and stout"));
    assert_eq!(
        run_path(&policy, FakeServices::new(), "/pass")
            .await
            .expect("pass"),
        RequestAction::Pass
    );

    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request("/bad-input");
    let s = synthetic(call.on_request(&mut req).await.expect("bad-input"));
    // Invalid name, invalid value, relative url, empty name, unknown backend.
    assert_eq!(header(&s.headers, "x-results"), Some("err,err,err,err,err"));
    assert_eq!(header(&s.headers, "x-second"), Some("Ok(())"));
    assert_eq!(header(&s.headers, "x-backend"), Some("second"));
    assert_eq!(req.backend, "second");
}

#[tokio::test]
async fn config_kv_clock_and_esi_imports() {
    let policy = probe();
    let services = FakeServices::new();
    let s = synthetic(
        run_path(&policy, services.clone(), "/config")
            .await
            .expect("config"),
    );
    assert_eq!(s.body, Bytes::from_static(b"greeting=hello;mode=test"));
    assert_eq!(header(&s.headers, "x-greeting"), Some("hello"));
    assert_eq!(header(&s.headers, "x-missing-is-none"), Some("true"));

    for expected in ["1", "2", "3"] {
        let s = synthetic(
            run_path(&policy, services.clone(), "/kv")
                .await
                .expect("kv"),
        );
        assert_eq!(s.status, StatusCode::OK, "{:?}", s.body);
        assert_eq!(s.body, Bytes::from(expected));
        assert_eq!(header(&s.headers, "x-deleted-missing"), Some("Ok(false)"));
    }
    // The namespace is the policy's name.
    assert_eq!(
        services.kv_get("probe", "count").await.expect("kv"),
        Some(b"3".to_vec())
    );

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let s = synthetic(
        run_path(&policy, services.clone(), "/clock")
            .await
            .expect("clock"),
    );
    let now: u128 = std::str::from_utf8(&s.body)
        .expect("utf8")
        .parse()
        .expect("number");
    assert!(now >= before && now < before + 60_000, "{now} vs {before}");

    let mut call = policy.start(services.clone()).await.expect("start");
    let mut req = request("/esi");
    call.on_request(&mut req).await.expect("esi");
    assert_eq!(
        call.esi_overrides(),
        &EsiOverrides {
            enabled: Some(true),
            vars: vec![("region".into(), "eu".into()), ("lang".into(), "fr".into())],
        }
    );
    run_path(&policy, services, "/log").await.expect("log");
}

#[tokio::test]
async fn kv_refuses_oversized_keys_and_values() {
    let services = FakeServices::new();
    let s = synthetic(
        run_path(&probe(), services.clone(), "/kv-big")
            .await
            .expect("kv-big"),
    );
    assert_eq!(
        header(&s.headers, "x-big-value"),
        Some("Err(KvError::TooLarge)")
    );
    assert_eq!(
        header(&s.headers, "x-big-key"),
        Some("Err(KvError::TooLarge)")
    );
    assert!(services.kv.lock().is_empty(), "nothing reached the store");
}

#[tokio::test]
async fn invalid_synthetic_responses_are_refused() {
    for path in ["/bad-synth-status", "/bad-synth-header"] {
        let err = run_path(&probe(), FakeServices::new(), path)
            .await
            .expect_err(path);
        assert!(
            matches!(
                err,
                PolicyError::InvalidResult {
                    hook: Hook::OnRequest,
                    ..
                }
            ),
            "{path}: {err}"
        );
        assert_eq!(err.client_status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}

#[tokio::test]
async fn a_full_pool_refuses_new_instances_until_one_is_dropped() {
    let small = PolicyEngine::new(&PolicyLimits {
        max_instances: 2,
        ..PolicyLimits::default()
    })
    .expect("engine");
    // No waiting in line: refused at once.
    let limits = PolicyLimits {
        instance_wait_ms: 0,
        ..test_limits()
    };
    let policy = LoadedPolicy::compile(&small, probe_source(limits)).expect("compile");
    let first = policy.start(FakeServices::new()).await.expect("first");
    let _second = policy.start(FakeServices::new()).await.expect("second");
    let err = policy
        .start(FakeServices::new())
        .await
        .expect_err("pool is full");
    assert!(matches!(err, PolicyError::PoolExhausted { .. }), "{err}");
    assert_eq!(err.client_status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(first);
    policy
        .start(FakeServices::new())
        .await
        .expect("a slot was returned");
}

#[tokio::test]
async fn cache_imports_validate_and_reach_the_services() {
    let services = FakeServices::new();
    let s = synthetic(
        run_path(&probe(), services.clone(), "/cache")
            .await
            .expect("cache"),
    );
    assert_eq!(s.body, Bytes::from_static(b"203:cached body"));
    assert_eq!(header(&s.headers, "x-insert"), Some("Ok(())"));
    assert_eq!(header(&s.headers, "x-miss"), Some("true"));
    assert_eq!(header(&s.headers, "x-purge-url"), Some("Ok(1)"));
    // Purged by URL already, so the key finds nothing.
    assert_eq!(header(&s.headers, "x-purge-key"), Some("Ok(0)"));
    assert_eq!(header(&s.headers, "x-bad"), Some("true"));
}

#[tokio::test]
async fn a_hook_waits_on_the_host_no_longer_than_host_wait() {
    // Subrequests that would take an hour: the hook holds its instance
    // while it waits, so the wait is cut at `host_wait_ms` and the guest
    // gets timeouts it can handle.
    let services = FakeServices::with_fetch_delay(Duration::from_secs(3600));
    let policy = probe_with(PolicyLimits {
        host_wait_ms: 20,
        ..test_limits()
    });
    let s = synthetic(
        run_path(&policy, services.clone(), "/fetch-many?n=2")
            .await
            .expect("fetch-many"),
    );
    assert_eq!(
        s.body,
        Bytes::from_static(b"err:FetchError::Timeout,err:FetchError::Timeout")
    );
    let s = synthetic(run_path(&policy, services, "/fetch").await.expect("fetch"));
    assert_eq!(s.body, Bytes::from_static(b"err:FetchError::Timeout"));
    let mut bad = test_limits();
    bad.host_wait_ms = 0;
    assert!(bad.validate().unwrap_err().contains("host_wait_ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_many_runs_in_parallel_and_waiting_is_not_cpu_time() {
    let delay = Duration::from_millis(200);
    let services = FakeServices::with_fetch_delay(delay);
    // 50 ms of CPU, but each fetch waits 200 ms: waiting must not count.
    let policy = probe_with(PolicyLimits {
        cpu_time_ms: 50,
        ..test_limits()
    });
    let started = Instant::now();
    let s = synthetic(
        run_path(&policy, services.clone(), "/fetch-many?n=4")
            .await
            .expect("fetch-many"),
    );
    let took = started.elapsed();
    assert_eq!(
        s.body,
        Bytes::from_static(b"200:origin/sub/0,200:origin/sub/1,200:origin/sub/2,200:origin/sub/3")
    );
    assert_eq!(services.max_in_flight.load(Ordering::SeqCst), 4);
    assert!(took < delay * 3, "four fetches in parallel took {took:?}");

    let s = synthetic(
        run_path(&policy, services.clone(), "/fetch")
            .await
            .expect("fetch"),
    );
    assert_eq!(s.body, Bytes::from_static(b"200:origin/sub/one"));
    assert_eq!(
        header(&s.headers, "x-unknown"),
        Some("unknown-backend:nope")
    );
    // The unknown backend never reached the services.
    assert!(!services.fetched.lock().contains(&"/sub/two".to_string()));
}

#[tokio::test]
async fn subrequest_and_host_call_caps() {
    let policy = probe_with(PolicyLimits {
        max_subrequests: 4,
        max_host_calls: 50,
        ..test_limits()
    });
    let services = FakeServices::new();
    let s = synthetic(
        run_path(&policy, services.clone(), "/fetch-many?n=6")
            .await
            .expect("fetch-many"),
    );
    assert_eq!(
        s.body,
        Bytes::from_static(
            b"200:origin/sub/0,200:origin/sub/1,200:origin/sub/2,200:origin/sub/3,limit,limit"
        )
    );
    assert_eq!(services.fetched.lock().len(), 4);

    // kv has an error variant: url() and set-header, then 48 gets, then
    // refused.
    let s = synthetic(
        run_path(&policy, services.clone(), "/kv-cap")
            .await
            .expect("kv-cap"),
    );
    assert_eq!(s.body, Bytes::from_static(b"48"));

    // Resource methods have none: the guest traps and the caller is told why.
    let err = run_path(&policy, services, "/hostcall-cap")
        .await
        .expect_err("cap");
    assert!(
        matches!(
            err,
            PolicyError::LimitExceeded {
                hook: Hook::OnRequest,
                what: "host calls",
                limit: 50
            }
        ),
        "{err}"
    );
    assert_eq!(err.client_status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// Runs `/loop` beside 20 ordinary requests on the test's runtime and
/// checks that the loop times out, that the others all succeed, and that
/// they did not wait for the loop to end.
async fn loop_beside_ordinary_requests() {
    let budget = Duration::from_millis(50);
    let looping_policy = probe_with(PolicyLimits {
        cpu_time_ms: 50,
        ..test_limits()
    });
    let looping = tokio::spawn(async move {
        let started = Instant::now();
        let result = run_path(&looping_policy, FakeServices::new(), "/loop").await;
        (result, started.elapsed(), Instant::now())
    });
    let mut others = Vec::new();
    for _ in 0..20 {
        let policy = probe();
        others.push(tokio::spawn(async move {
            let result = run_path(&policy, FakeServices::new(), "/synth").await;
            (result, Instant::now())
        }));
    }
    let mut first_done = None::<Instant>;
    for other in others {
        let (result, done) = other.await.expect("join");
        let action = result.expect("ordinary request");
        assert_eq!(synthetic(action).status, StatusCode::IM_A_TEAPOT);
        first_done = Some(first_done.map_or(done, |d| d.min(done)));
    }
    let (result, took, loop_done) = looping.await.expect("join");
    let err = result.expect_err("the loop must be stopped");
    assert!(
        matches!(err, PolicyError::Timeout { hook: Hook::OnRequest, budget: b } if b == budget),
        "{err}"
    );
    assert_eq!(err.client_status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        first_done.is_some_and(|d| d < loop_done),
        "no ordinary request finished before the loop was stopped"
    );
    // The budget is CPU time; allow generous slack for a loaded 2-core box.
    assert!(took >= budget, "stopped early: {took:?}");
    assert!(took < budget + Duration::from_millis(1000), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_policy_times_out_while_other_requests_go_on() {
    loop_beside_ordinary_requests().await;
}

/// On one thread the others can only run because the loop yields.
#[tokio::test(flavor = "current_thread")]
async fn a_looping_policy_yields_its_thread() {
    loop_beside_ordinary_requests().await;
}

/// Resident set size of this process, in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss field");
    pages * 4096
}

#[tokio::test]
async fn out_of_memory_is_reported_and_memory_is_returned() {
    let cap = 16u64 << 20;
    let policy = probe_with(PolicyLimits {
        memory: cap,
        ..test_limits()
    });
    // Warm up once so the baseline includes the slot and code mappings.
    let _ = run_path(&policy, FakeServices::new(), "/oom").await;
    let before = rss_bytes();
    for _ in 0..20 {
        let err = run_path(&policy, FakeServices::new(), "/oom")
            .await
            .expect_err("oom");
        assert!(
            matches!(
                err,
                PolicyError::OutOfMemory {
                    hook: Hook::OnRequest,
                    limit
                } if limit == cap
            ),
            "{err}"
        );
    }
    let after = rss_bytes();
    // Twenty instances each filled 16 MiB; the pool must have given the
    // memory back rather than keep 320 MiB resident.
    assert!(
        after < before + (3 * cap),
        "rss grew from {before} to {after}"
    );
    // And the policy still serves ordinary requests.
    run_path(&policy, FakeServices::new(), "/synth")
        .await
        .expect("after oom");
}

#[tokio::test]
async fn a_trap_fails_the_request_and_the_instance() {
    let policy = probe();
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request("/trap");
    let err = call.on_request(&mut req).await.expect_err("trap");
    match &err {
        PolicyError::Trap { hook, message } => {
            assert_eq!(*hook, Hook::OnRequest);
            assert!(message.contains("unreachable"), "{message}");
        }
        other => panic!("expected a trap, got {other}"),
    }
    // The request head came back even though the guest trapped.
    assert_eq!(req.uri.path(), "/trap");
    let mut resp = ResponseHead::default();
    let again = call
        .on_deliver(&mut req, &mut resp)
        .await
        .expect_err("unusable");
    assert!(matches!(
        again,
        PolicyError::AlreadyFailed {
            hook: Hook::OnDeliver
        }
    ));
}

#[tokio::test]
async fn a_cancelled_hook_leaves_the_call_unusable_but_harmless() {
    let policy = probe();
    // Cancelled while the guest spins, and while it awaits a subrequest.
    for (path, services) in [
        ("/loop", FakeServices::new()),
        (
            "/fetch",
            FakeServices::with_fetch_delay(Duration::from_secs(5)),
        ),
    ] {
        let mut call = policy.start(services).await.expect("start");
        let mut req = request(path);
        let cancelled =
            tokio::time::timeout(Duration::from_millis(30), call.on_request(&mut req)).await;
        assert!(cancelled.is_err(), "{path}: the hook was still running");
        let mut resp = ResponseHead::default();
        let err = call
            .on_deliver(&mut req, &mut resp)
            .await
            .expect_err("unusable after cancellation");
        assert!(matches!(err, PolicyError::AlreadyFailed { .. }), "{err}");
        drop(call);
    }
    run_path(&policy, FakeServices::new(), "/synth")
        .await
        .expect("the policy still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_the_policy_without_failing_requests_in_flight() {
    let slot = Arc::new(
        PolicySlot::load(engine(), probe_source(test_limits()))
            .await
            .expect("load"),
    );
    let first = slot.current().generation();
    let services: Arc<dyn PolicyServices> = FakeServices::new();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let task_slot = Arc::clone(&slot);
        let services = Arc::clone(&services);
        tasks.push(tokio::spawn(async move {
            // As the server does: the worker thread's handle of the
            // current generation.
            let handle = task_slot.handle(&services);
            let policy = handle.policy().clone();
            let mut call = handle.start().await?;
            let mut req = request(&format!("/page/{i}"));
            call.on_request(&mut req).await?;
            // Stay in flight across a reload.
            tokio::time::sleep(Duration::from_millis(5 * (i % 8))).await;
            let mut resp = ResponseHead::default();
            call.on_backend_response(&mut req, &mut resp, CacheSettings::default())
                .await?;
            call.on_deliver(&mut req, &mut resp).await?;
            Ok::<_, PolicyError>((
                policy.generation(),
                header(&resp.headers, "x-deliver").map(str::to_owned),
            ))
        }));
        if i % 10 == 5 {
            slot.reload(probe_source(test_limits()))
                .await
                .expect("reload");
        }
    }
    let mut generations = std::collections::BTreeSet::new();
    for task in tasks {
        let (generation, delivered) = task.await.expect("join").expect("request");
        assert_eq!(delivered.as_deref(), Some("GET"));
        generations.insert(generation);
    }
    assert!(
        generations.contains(&first),
        "some requests ran the first policy"
    );
    assert!(
        generations.len() >= 3,
        "requests ran several generations: {generations:?}"
    );
    assert_ne!(slot.current().generation(), first);
}

#[tokio::test]
async fn a_thread_shares_one_handle_per_generation_and_services() {
    let slot = PolicySlot::load(engine(), probe_source(test_limits()))
        .await
        .expect("load");
    let services: Arc<dyn PolicyServices> = FakeServices::new();
    let a = slot.handle(&services);
    assert!(Arc::ptr_eq(&a, &slot.handle(&services)));
    assert_eq!(a.policy().generation(), slot.current().generation());
    // Other services (another server in the process) get their own.
    let other: Arc<dyn PolicyServices> = FakeServices::new();
    assert!(!Arc::ptr_eq(&a, &slot.handle(&other)));
    // After a reload, new requests get the new generation; a request
    // holding the old handle keeps it.
    slot.reload(probe_source(test_limits()))
        .await
        .expect("reload");
    let b = slot.handle(&services);
    assert_ne!(b.policy().generation(), a.policy().generation());
    assert_eq!(b.policy().generation(), slot.current().generation());
    let mut call = a.start().await.expect("old generation still starts");
    call.on_request(&mut request("/old"))
        .await
        .expect("old generation still runs");
}

/// A caller that pinned a generation (the host's config generations)
/// gets that generation's handle after the slot moved on, and the new one
/// for the new generation.
#[tokio::test]
async fn a_pinned_generation_keeps_its_policy_after_a_reload() {
    let slot = PolicySlot::load(engine(), probe_source(test_limits()))
        .await
        .expect("load");
    let services: Arc<dyn PolicyServices> = FakeServices::new();
    let old = slot.current();
    let new = slot
        .reload(probe_source(test_limits()))
        .await
        .expect("reload");
    assert_ne!(old.generation(), new.generation());
    let pinned = slot.handle_of(&old, &services);
    assert_eq!(pinned.policy().generation(), old.generation());
    assert!(Arc::ptr_eq(&pinned, &slot.handle_of(&old, &services)));
    let mut call = pinned.start().await.expect("the pinned generation starts");
    call.on_request(&mut request("/pinned"))
        .await
        .expect("the pinned generation runs");
    assert_eq!(
        slot.handle_of(&new, &services).policy().generation(),
        new.generation()
    );
}

#[tokio::test]
async fn bad_files_are_refused_and_the_old_policy_stays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slot = PolicySlot::load(engine(), probe_source(test_limits()))
        .await
        .expect("load");
    let good = slot.current().generation();
    let source = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        PolicySource {
            path,
            ..probe_source(test_limits())
        }
    };

    let err = slot
        .reload(source("garbage.wasm", b"this is not wasm at all"))
        .await
        .expect_err("garbage");
    assert!(matches!(err, PolicyError::Compile { .. }), "{err}");
    assert!(err.to_string().contains("not a WebAssembly file"), "{err}");

    // An empty component: valid wasm, but not the inlay:policy world.
    let err = slot
        .reload(source("empty.wasm", b"\0asm\x0d\0\x01\0"))
        .await
        .expect_err("empty component");
    assert!(matches!(err, PolicyError::WorldMismatch { .. }), "{err}");
    assert!(err.to_string().contains("inlay:policy"), "{err}");

    // A core module without wit-bindgen's component-type section becomes
    // an empty component, which exports no handler.
    let err = slot
        .reload(source("plain.wasm", b"\0asm\x01\0\0\0"))
        .await
        .expect_err("plain module");
    assert!(matches!(err, PolicyError::WorldMismatch { .. }), "{err}");
    assert!(err.to_string().contains("inlay:policy/handler"), "{err}");

    let err = slot
        .reload(PolicySource {
            path: dir.path().join("missing.wasm"),
            ..probe_source(test_limits())
        })
        .await
        .expect_err("missing");
    assert!(matches!(err, PolicyError::Io { .. }), "{err}");

    let err = slot
        .reload(probe_source(PolicyLimits {
            cpu_time_ms: 0,
            ..test_limits()
        }))
        .await
        .expect_err("bad limits");
    assert!(matches!(err, PolicyError::InvalidLimits(_)), "{err}");

    assert_eq!(slot.current().generation(), good);
    run_path(&slot.current(), FakeServices::new(), "/synth")
        .await
        .expect("old policy still serves");
}

#[tokio::test]
async fn a_ready_made_component_loads_too() {
    // The probe is a core module; componentize it here to exercise the
    // "already a component" path with the same guest.
    let core = std::fs::read(probe_path()).expect("probe");
    let component = wit_component::ComponentEncoder::default()
        .module(&core)
        .expect("module")
        .encode()
        .expect("encode");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("probe.component.wasm");
    std::fs::write(&path, component).expect("write");
    let policy = LoadedPolicy::load(
        engine(),
        PolicySource {
            path,
            ..probe_source(test_limits())
        },
    )
    .await
    .expect("load component");
    let s = synthetic(
        run_path(&policy, FakeServices::new(), "/synth")
            .await
            .expect("synth"),
    );
    assert_eq!(s.status, StatusCode::IM_A_TEAPOT);
}

/// The example policies, built by `make policies`.
mod example_policies {
    use super::*;

    fn policy_dir() -> PathBuf {
        std::env::var_os("INLAY_POLICY_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/policies")
            })
    }

    async fn load(name: &str, limits: PolicyLimits) -> LoadedPolicy {
        let path = policy_dir().join(format!("{name}.wasm"));
        assert!(
            path.exists(),
            "{} is missing: build the example policies first (`make policies`), \
             or point INLAY_POLICY_DIR at them",
            path.display()
        );
        LoadedPolicy::load(
            engine(),
            PolicySource {
                path,
                config: BTreeMap::new(),
                limits,
                name: name.to_string(),
                prewarm: true,
                pre_instantiate: true,
                memo_bytes: 0,
                replay_measured: false,
                requests_per_instance: test_requests_per_instance(),
                instance_lifetime: Duration::from_secs(60),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
    }

    #[tokio::test]
    async fn headers_policy_round_trip() {
        let policy = load("headers", test_limits()).await;
        let mut call = policy.start(FakeServices::new()).await.expect("start");
        let mut req = request("/article?id=7&utm_source=news&fbclid=x");
        // The built-in recv passes requests with credentials.
        req.headers.remove("cookie");
        let action = call.on_request(&mut req).await.expect("on_request");
        assert_eq!(action, RequestAction::Lookup);
        assert_eq!(req.uri.to_string(), "/article?id=7");

        let mut resp = ResponseHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
        };
        resp.headers
            .insert("server", HeaderValue::from_static("origin"));
        resp.headers
            .insert("x-powered-by", HeaderValue::from_static("php"));
        let defaults = CacheSettings {
            cacheable: true,
            ttl: Duration::from_secs(30),
            ..CacheSettings::default()
        };
        let settings = call
            .on_backend_response(&mut req, &mut resp, defaults.clone())
            .await
            .expect("on_backend_response");
        assert!(settings.cacheable);
        call.on_deliver(&mut req, &mut resp)
            .await
            .expect("on_deliver");
        assert!(resp.headers.get("server").is_none());
        assert!(resp.headers.get("x-powered-by").is_none());
        assert_eq!(header(&resp.headers, "x-inlay-policy"), Some("headers"));
    }

    /// Every SDK's `builtin` recv is the host's decision, asked in one
    /// call (`sdk.builtin-recv-lookup`), recorded and replayed like any
    /// request accessor: a request with credentials or another method
    /// passes, the same whether the policy ran or its path was walked.
    #[tokio::test]
    async fn the_sdks_builtin_recv_is_the_hosts_and_is_replayed() {
        for name in [
            "headers",
            "headers-c",
            "headers-js",
            "headers-py",
            "headers-go",
        ] {
            let path = policy_dir().join(format!("{name}.wasm"));
            assert!(
                path.exists(),
                "{} is missing: make policies",
                path.display()
            );
            let policy = LoadedPolicy::load(
                engine(),
                PolicySource {
                    path,
                    config: BTreeMap::new(),
                    limits: test_limits(),
                    name: name.to_string(),
                    prewarm: true,
                    pre_instantiate: false,
                    memo_bytes: 1 << 20,
                    replay_measured: false,
                    requests_per_instance: test_requests_per_instance(),
                    instance_lifetime: Duration::from_secs(60),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("loading {name}: {e}"));
            let handle = PolicyHandle::new(policy.clone(), FakeServices::new());
            for (method, header, expected) in [
                (Method::GET, None, RequestAction::Lookup),
                (Method::HEAD, None, RequestAction::Lookup),
                (Method::GET, Some("cookie"), RequestAction::Pass),
                (Method::GET, Some("authorization"), RequestAction::Pass),
                (Method::POST, None, RequestAction::Pass),
            ] {
                // Twice: the second request walks the path the first recorded.
                for round in 0..2 {
                    let mut req = request("/builtin?utm_source=x");
                    req.headers.remove("cookie");
                    req.method = method.clone();
                    if let Some(name) = header {
                        req.headers.insert(name, HeaderValue::from_static("secret"));
                    }
                    let mut call = handle.start().await.expect("start");
                    let action = call.on_request(&mut req).await.expect("on_request");
                    assert_eq!(action, expected, "{name} {method} {header:?} round {round}");
                    assert_eq!(req.uri.to_string(), "/builtin", "{name}");
                }
            }
            let stats = policy.memo_stats().expect("replay is on");
            assert!(stats.replayed >= 5, "{name}: {stats:?}");
        }
    }

    /// The SDKs say which hooks a policy leaves to its default: the
    /// host learns it from the warm-up request at load.
    #[tokio::test]
    async fn the_hooks_a_policy_implements_are_known_at_load() {
        for (name, hooks) in [
            ("headers", &["on-request", "on-deliver"][..]),
            ("default", &["on-request"][..]),
            ("trap", &["on-request"][..]),
        ] {
            let policy = load(name, test_limits()).await;
            assert!(policy.prewarmed(), "{name}");
            assert_eq!(policy.implemented_hooks(), hooks, "{name}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn loop_policy_times_out_while_headers_keeps_serving() {
        let looping = load(
            "loop",
            PolicyLimits {
                cpu_time_ms: 50,
                ..test_limits()
            },
        )
        .await;
        let headers = load("headers", test_limits()).await;
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let result = run_path(&looping, FakeServices::new(), "/loop").await;
            (result, started.elapsed())
        });
        for _ in 0..20 {
            run_path(&headers, FakeServices::new(), "/a?utm_x=1")
                .await
                .expect("headers keeps serving");
        }
        let (result, took) = task.await.expect("join");
        let err = result.expect_err("loop must time out");
        assert!(matches!(err, PolicyError::Timeout { .. }), "{err}");
        assert!(took < Duration::from_millis(1050), "took {took:?}");
    }

    #[tokio::test]
    async fn oom_policy_is_out_of_memory() {
        let policy = load(
            "oom",
            PolicyLimits {
                memory: 16 << 20,
                ..test_limits()
            },
        )
        .await;
        // The first request's one-off costs (its pool slot, lazily built
        // tables) are not what this bounds.
        let first = run_path(&policy, FakeServices::new(), "/oom").await;
        assert!(matches!(first, Err(PolicyError::OutOfMemory { .. })));
        let before = rss_bytes();
        for _ in 0..5 {
            let err = run_path(&policy, FakeServices::new(), "/oom")
                .await
                .expect_err("oom");
            assert!(matches!(err, PolicyError::OutOfMemory { .. }), "{err}");
        }
        let after = rss_bytes();
        assert!(
            after < before + (64 << 20),
            "rss grew {} MiB over 5 OOM requests",
            (after.saturating_sub(before)) >> 20
        );
    }

    #[tokio::test]
    async fn trap_policy_traps() {
        let policy = load("trap", test_limits()).await;
        let err = run_path(&policy, FakeServices::new(), "/trap")
            .await
            .expect_err("trap");
        assert!(matches!(err, PolicyError::Trap { .. }), "{err}");
        assert_eq!(err.client_status(), StatusCode::INTERNAL_SERVER_ERROR);
        // Elsewhere the fixture behaves (the built-in recv: cookie -> pass).
        assert_eq!(
            run_path(&policy, FakeServices::new(), "/fine")
                .await
                .expect("other paths work"),
            RequestAction::Pass
        );
    }
}

mod builtin;
mod pool;
mod release;
mod replay;
mod reuse;
mod spare;
