//! Pre-warming: the policy as it is after serving one request, taken once
//! at load, so every request's fresh instance starts warm.
//!
//! Interpreted guests do most of their work on the first call into a new
//! instance: SpiderMonkey compiles the JavaScript functions it meets,
//! CPython fills its type and method caches. Measured on `headers`: the
//! first `on-request` of a fresh JavaScript instance takes 270-350 us, the
//! second 55 us; Python 300 us, then 15 us. A fresh instance per request
//! would pay that first call every time.
//!
//! So at load the host instruments the component with `wasmtime-wizer`,
//! instantiates it with the host's imports, runs each hook once on a
//! synthetic request ([`warm_request`], with the header
//! `inlay-prewarm: 1`) and snapshots the instance's memories and globals
//! into a new component. Requests then get a fresh instance of that
//! snapshot: nothing of one real request can be seen by the next, as
//! before; what every request can see is the state the synthetic request
//! left. During the warm-up the policy has no cache, kv or fetch (the calls
//! fail) and no backend exists.
//!
//! A component that wizer cannot snapshot (it mutates tables, has nested
//! components) or whose hooks fail on the synthetic request is used as it
//! is, with one log line: pre-warming is an optimisation, never a reason to
//! refuse a policy.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use inlay_core::{CacheSettings, RequestHead, ResponseHead};
use wasmtime::component::{ComponentType, Lift, WasmList};
use wasmtime_wizer::{ComponentInstanceState, Wizer};

use crate::call::PolicyCall;
use crate::engine::PolicyEngine;
use crate::policy::instance::LiveCall;
use crate::policy::{LOAD_CHECK_CPU, LoadedPolicy, PolicySource};
use crate::services::NoServices;

/// The warm-up request: an ordinary page view, so that the usual paths
/// (query strings, cookies, headers) are the ones compiled and cached.
pub fn warm_request() -> RequestHead {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("host", "prewarm.inlay.invalid"),
        ("user-agent", "inlay-prewarm"),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-language", "en"),
        ("accept-encoding", "gzip"),
        ("cookie", "inlay-prewarm=1"),
        ("inlay-prewarm", "1"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    RequestHead {
        method: Method::GET,
        uri: Uri::from_static("/?utm_source=inlay-prewarm&page=1"),
        headers,
        ..RequestHead::default()
    }
}

/// The warm-up response for `on-backend-response` and `on-deliver`.
fn warm_response() -> ResponseHead {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "text/html; charset=utf-8"),
        ("cache-control", "public, max-age=60"),
        ("server", "inlay-prewarm"),
        ("etag", "\"prewarm\""),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    ResponseHead {
        status: StatusCode::OK,
        headers,
    }
}

/// Snapshots `component` (a component binary) after one warm-up request;
/// with the snapshot, the hooks whose SDK default ran in it (see
/// [`LoadedPolicy::runs_builtin`]). Blocking (it compiles the instrumented
/// component): call it from a blocking thread.
pub(crate) fn snapshot(
    engine: &PolicyEngine,
    source: &PolicySource,
    component: &[u8],
) -> Result<(Vec<u8>, u8), String> {
    let wizer = Wizer::new();
    let (cx, instrumented) = wizer
        .instrument_component(component)
        .map_err(|e| format!("cannot instrument the component: {e:#}"))?;
    // Not a request: on a machine busy building or deploying, the cold
    // instrumented instance may be descheduled for longer than a request's
    // budget (a busy 2-core machine timed CPython's out at 50 ms).
    let mut limits = source.limits.clone();
    limits.cpu_time_ms = limits
        .cpu_time_ms
        .max(u64::try_from(LOAD_CHECK_CPU.as_millis()).unwrap_or(u64::MAX));
    let warming = PolicySource {
        limits,
        ..source.clone()
    };
    let probe = LoadedPolicy::compile_component(engine, warming, &instrumented, false, 0)
        .map_err(|e| format!("cannot compile the instrumented component: {e}"))?;
    // The hooks are async; run them on a runtime of their own, on a thread
    // of their own, so that this works whether or not the caller is inside
    // a runtime.
    std::thread::scope(|scope| {
        scope
            .spawn(|| warm_and_snapshot(&wizer, &cx, &probe).map(|s| (s, probe.builtin_hooks())))
            .join()
            .unwrap_or_else(|payload| {
                Err(match payload.downcast::<AccessorFailed>() {
                    Ok(failed) => format!("cannot snapshot: {}", failed.0),
                    Err(_) => "the snapshot tool panicked".to_string(),
                })
            })
    })
}

fn warm_and_snapshot(
    wizer: &Wizer,
    cx: &wasmtime_wizer::ComponentContext<'_>,
    probe: &LoadedPolicy,
) -> Result<Vec<u8>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the warm-up runtime: {e}"))?;
    runtime.block_on(async {
        let mut call = probe
            .start_live(Arc::new(NoServices))
            .await
            .map_err(|e| format!("cannot instantiate: {e}"))?;
        warm_up(&mut call).await?;
        let live = call
            .live_mut()
            .ok_or_else(|| "the warm-up request ran without an instance".to_string())?;
        let mut state = SnapshotSource { call: live };
        wizer
            .snapshot_component(cx, &mut state)
            .await
            .map_err(|e| format!("cannot snapshot: {e:#}"))
    })
}

/// Runs the three hooks once, as a cacheable request would.
async fn warm_up(call: &mut PolicyCall) -> Result<(), String> {
    let mut req = warm_request();
    call.on_request(&mut req)
        .await
        .map_err(|e| format!("warm-up request: {e}"))?;
    let mut resp = warm_response();
    let defaults = CacheSettings {
        cacheable: true,
        ttl: std::time::Duration::from_secs(60),
        ..CacheSettings::default()
    };
    call.on_backend_response(&mut req, &mut resp, defaults)
        .await
        .map_err(|e| format!("warm-up request: {e}"))?;
    call.on_deliver(&mut req, &mut resp)
        .await
        .map_err(|e| format!("warm-up request: {e}"))?;
    Ok(())
}

/// Lets wizer read the instance's state through the accessor functions
/// its instrumentation exported (`wasmtime:wizer/access`).
///
/// Wizer's trait has no error path. An accessor it added itself can only
/// fail if something is badly wrong; the snapshot is then abandoned by
/// unwinding (without the panic hook's report) to [`snapshot`], which
/// turns it back into an error.
struct SnapshotSource<'a> {
    call: &'a mut LiveCall,
}

/// What a failed accessor unwinds with.
struct AccessorFailed(String);

impl SnapshotSource<'_> {
    async fn read<R>(&mut self, instance: &str, func: &str) -> R
    where
        R: ComponentType + Lift + Send + Sync + 'static,
    {
        match self.call.call_accessor::<R>(instance, func).await {
            Ok(value) => value,
            Err(e) => std::panic::resume_unwind(Box::new(AccessorFailed(format!(
                "reading {instance}#{func}: {e:#}"
            )))),
        }
    }
}

impl ComponentInstanceState for SnapshotSource<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        let list = self.read::<WasmList<u8>>(instance, func).await;
        contents(list.as_le_slice(self.call.store()));
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.read(instance, func).await
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.read(instance, func).await
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.read::<f32>(instance, func).await.to_bits()
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.read::<f64>(instance, func).await.to_bits()
    }
}
