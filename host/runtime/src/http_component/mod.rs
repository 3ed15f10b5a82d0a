//! Standard `wasi:http/proxy` 0.2 and `wasi:http/service` 0.3 components
//! served in-process: a backend that
//! is an application rather than a socket. The pipeline sends it the
//! requests it would send an origin, and what it answers goes through the
//! cache, ESI, purge and the access log as an origin's answer does.
//!
//! ```text
//! HttpComponent (one per component backend and generation: its settings)
//!   ├─ Loaded (compiled, linked, pre-instantiated; kept by a reload of
//!   │    │     the same file and pool size; its own engine and pool)
//!   │    └─ serve (0.2: one request, a fresh store and instance from the
//!   │              pool, `wasi:http/incoming-handler.handle` in a task of
//!   │              its own)
//!   └─ P3Pool (0.3, one per generation: instances reused as `wasmtime
//!        serve` reuses them, `handler.handle` in each one's event loop)
//! ```
//!
//! The guest's world is bounded as a policy's is: outgoing HTTP only to
//! the configured backends, through the host's fetcher and within
//! `max_subrequests` and `max_subrequest_bytes` ([`outbound`]); clocks and
//! random; the environment of its settings; no files unless a read-only
//! directory is configured; no sockets. Each request has a CPU budget
//! (epoch interruption, host waits excluded), a memory cap, a wall-clock
//! cap (`request_timeout`) and an instance from a pool of `max_instances`;
//! a trap or a limit fails that request alone, with one log line.
//!
//! A 0.2 request gets a fresh instance (as `wasmtime serve` gives it):
//! nothing a request does is seen by the next. A 0.3 instance serves up
//! to `requests_per_instance` requests, `concurrent_requests_per_instance`
//! at once, as `wasmtime serve` does (`p3.rs`); `requests_per_instance = 1`
//! gives each a fresh one.

mod error;
mod outbound;
mod p3;
mod state;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use inlay_core::LogLimit;
use inlay_core::body::{self, ProxyBody};
use tokio::sync::oneshot;
use wasmtime::component::{Component, Linker};
use wasmtime::{CallHook, Store};
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme as WasiScheme;
use wasmtime_wasi_http::{Error as HttpError, WasiHttpView};

pub use error::ComponentError;
pub use inlay_core::component::{
    ComponentSettings, P3_CONCURRENT_REQUESTS_PER_INSTANCE, P3_REQUESTS_PER_INSTANCE,
};
pub use outbound::{ComponentOutbound, Depth, MAX_DEPTH};
pub use p3::IDLE_INSTANCE_TIMEOUT;

use crate::engine::{EPOCH_TICK, PolicyEngine};
use crate::limits::PolicyLimits;
use outbound::{OutboundHooks, Route};
use state::{AppState, Parked};

/// CPU time the load check's instantiation may take (a cold start of a
/// large guest on a busy machine; requests get `cpu_time`).
const LOAD_CHECK_CPU: std::time::Duration = std::time::Duration::from_secs(2);

/// Guests' output is logged at most this often.
static OUTPUT_LOG: LogLimit = LogLimit::per_second(20);

/// Requests that fail after their response head are logged at most this
/// often.
static FAILURE_LOG: LogLimit = LogLimit::per_second(20);

/// A `wasi:http` component loaded for one component backend, with the
/// settings its requests run with. Cheap to clone.
#[derive(Clone)]
pub struct HttpComponent {
    loaded: Arc<Loaded>,
    settings: Arc<ComponentSettings>,
    /// The backend's name, for logs and errors.
    name: Arc<str>,
    /// A 0.3 component's instances of this generation (none in the
    /// clone the pool itself keeps).
    p3: Option<Arc<p3::P3Pool>>,
}

/// The compiled component, its engine (pool and epoch ticker) and its
/// pre-instantiation.
struct Loaded {
    engine: PolicyEngine,
    pre: Pre,
    path: PathBuf,
}

/// The pre-instantiated component, by the world it serves.
#[derive(Clone)]
enum Pre {
    /// `wasi:http/proxy` 0.2: `incoming-handler.handle` sets the response
    /// through an out-parameter.
    P2(ProxyPre<AppState>),
    /// `wasi:http/service` 0.3: `handler.handle` is async and returns it.
    P3(wasmtime_wasi_http::p3::bindings::ServicePre<AppState>),
}

/// What the request's task sends once the guest has given the response
/// head, or why there is none.
type Head = Result<Response<ProxyBody>, ComponentError>;

impl std::fmt::Debug for HttpComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpComponent")
            .field("name", &self.name)
            .field("path", &self.loaded.path)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl HttpComponent {
    /// Compiles `bytes` (read from `path`) for backend `name`, links it
    /// against WASI 0.2 and `wasi:http` 0.2, and pre-instantiates it on an
    /// engine of its own with a pool of `settings.max_instances`. Compiling
    /// takes seconds for a large guest: call it off the reactor. Compiled
    /// code is cached on disk, as a policy's is.
    pub fn load(
        name: &str,
        path: &Path,
        bytes: &[u8],
        settings: ComponentSettings,
    ) -> Result<Self, ComponentError> {
        let limits = PolicyLimits {
            max_instances: settings.max_instances,
            ..PolicyLimits::default()
        };
        let engine = |async_components| {
            PolicyEngine::with_async(&limits, async_components).map_err(|e| {
                ComponentError::Engine {
                    max_instances: settings.max_instances,
                    message: e.to_string(),
                }
            })
        };
        let compile_error = |e: wasmtime::Error| ComponentError::Compile {
            path: path.to_owned(),
            message: format!("{e:#}"),
        };
        // A 0.2 component runs on an engine without component-model async
        // (no state for it in its stores); a 0.3 one, which validation
        // refuses there, gets one with it.
        let plain = engine(false)?;
        let (engine, component) = match Component::new(plain.engine(), bytes) {
            Ok(component) => (plain, component),
            Err(e) if format!("{e:#}").contains("component model async") => {
                drop(plain);
                let with_async = engine(true)?;
                let component =
                    Component::new(with_async.engine(), bytes).map_err(compile_error)?;
                (with_async, component)
            }
            Err(e) => return Err(compile_error(e)),
        };
        let mismatch = |e: wasmtime::Error| ComponentError::WorldMismatch {
            path: path.to_owned(),
            message: format!("{e:#}"),
        };
        let mut linker = Linker::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(mismatch)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(mismatch)?;
        let concurrent = engine.engine().get_concurrency_support();
        if concurrent {
            wasmtime_wasi::p3::add_to_linker(&mut linker).map_err(mismatch)?;
            wasmtime_wasi_http::p3::add_to_linker(&mut linker).map_err(mismatch)?;
        }
        let pre = linker.instantiate_pre(&component).map_err(mismatch)?;
        let pre = match wasmtime_wasi_http::p3::bindings::ServicePre::new(pre.clone()) {
            Ok(service) if concurrent => Pre::P3(service),
            _ => Pre::P2(ProxyPre::new(pre).map_err(mismatch)?),
        };
        Self::loaded(name, path, engine, pre, settings)
    }

    fn loaded(
        name: &str,
        path: &Path,
        engine: PolicyEngine,
        pre: Pre,
        settings: ComponentSettings,
    ) -> Result<Self, ComponentError> {
        let loaded = Arc::new(Loaded {
            engine,
            pre,
            path: path.to_owned(),
        });
        Self::generation(loaded, name, settings)
    }

    /// The component `loaded` with `settings`, for backend `name`: for a
    /// 0.3 component, with a pool of instances of its own.
    fn generation(
        loaded: Arc<Loaded>,
        name: &str,
        settings: ComponentSettings,
    ) -> Result<Self, ComponentError> {
        let p3_only = settings.requests_per_instance.is_some_and(|n| n > 1)
            || settings
                .concurrent_requests_per_instance
                .is_some_and(|n| n > 1);
        if p3_only && matches!(loaded.pre, Pre::P2(_)) {
            return Err(ComponentError::NoReuse {
                path: loaded.path.clone(),
            });
        }
        let mut this = Self {
            loaded,
            settings: Arc::new(settings),
            name: name.into(),
            p3: None,
        };
        if let Pre::P3(pre) = &this.loaded.pre {
            let pool = p3::P3Pool::new(this.clone(), pre.clone());
            this.p3 = Some(Arc::new(pool));
        }
        Ok(this)
    }

    /// The same compiled component with other settings (a reload that
    /// changed only limits or the environment), and for a 0.3 component
    /// new instances: a new generation never serves from the old one's.
    /// The pool's size stays the loaded one's: a new `max_instances` needs
    /// [`load`](Self::load). A 0.2 component refuses instance reuse.
    pub fn with_settings(
        &self,
        name: &str,
        settings: ComponentSettings,
    ) -> Result<Self, ComponentError> {
        Self::generation(Arc::clone(&self.loaded), name, settings)
    }

    /// Instances this generation made so far: `None` for a 0.2 component,
    /// whose every request makes one.
    pub fn instances_made(&self) -> Option<u64> {
        self.p3.as_ref().map(|p| p.instances_made())
    }

    /// Whether it is a `wasi:http/service` 0.3 component.
    pub fn is_p3(&self) -> bool {
        matches!(self.loaded.pre, Pre::P3(_))
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings its requests run with.
    pub fn settings(&self) -> &ComponentSettings {
        &self.settings
    }

    /// The pool size it was loaded with.
    pub fn max_instances(&self) -> u32 {
        self.loaded.engine.max_instances()
    }

    /// Whether `self` and `other` are the same compiled component and
    /// settings (a reload kept both) and, for a 0.3 component, the same
    /// instances: never true across a reload, whose generation has its
    /// own.
    pub fn same(&self, other: &HttpComponent) -> bool {
        let same_instances = match (&self.p3, &other.p3) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        Arc::ptr_eq(&self.loaded, &other.loaded)
            && self.settings == other.settings
            && same_instances
    }

    /// Instantiates it once, as a request would, to find at load what
    /// would fail every request: a start function that traps, an instance
    /// the pool cannot hold, a `read_only_dir` that does not open.
    pub async fn check(&self) -> Result<(), ComponentError> {
        let slot = self.slot().await?;
        let settings = ComponentSettings {
            cpu_time: LOAD_CHECK_CPU,
            ..(*self.settings).clone()
        };
        let route = Route::new(Arc::new(NoOutbound), 0, &settings);
        let mut store = self.store(&settings, route)?;
        let parks = Arc::clone(&store.data().parks);
        let result = match &self.loaded.pre {
            Pre::P2(pre) => Parked::new(Box::pin(pre.instantiate_async(&mut store)), parks)
                .await
                .map(drop),
            Pre::P3(pre) => Parked::new(Box::pin(pre.instantiate_async(&mut store)), parks)
                .await
                .map(drop),
        };
        drop(slot);
        match result {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(store.data(), &settings, e)),
        }
    }

    /// Serves `req` (its URI a path and query, its `Host` the client's)
    /// with a fresh instance (0.2) or one of the generation's (0.3),
    /// sending the component's outgoing requests through `outbound`.
    /// Returns once the guest has set the response head, within
    /// `first_byte` ([`ComponentError::FirstByteTimeout`] after it,
    /// waiting for an instance included); the body streams from the guest
    /// as it writes it. A failure before the head is the error; one after
    /// it cuts the body.
    pub async fn serve(
        &self,
        req: Request<ProxyBody>,
        outbound: Arc<dyn ComponentOutbound>,
        first_byte: std::time::Duration,
    ) -> Result<Response<ProxyBody>, ComponentError> {
        let depth = req.extensions().get::<Depth>().map_or(0, |d| d.0);
        let route = Route::new(outbound, depth, &self.settings);
        let req = self.with_authority(req);
        match (&self.loaded.pre, &self.p3) {
            (Pre::P2(pre), _) => {
                let serving = self.serve_p2(pre.clone(), req, route);
                tokio::time::timeout(first_byte, serving)
                    .await
                    .unwrap_or(Err(ComponentError::FirstByteTimeout {
                        timeout: first_byte,
                    }))
            }
            // The instance's worker times the head (no timer of its own
            // here: a request's timers are most of what it costs beyond
            // the guest).
            (Pre::P3(_), Some(pool)) => pool.serve(req, route, first_byte).await,
            (Pre::P3(_), None) => Err(ComponentError::Trap {
                message: "a 0.3 component without its instances".into(),
            }),
        }
    }

    /// A 0.2 request: a fresh instance, in a task of its own.
    async fn serve_p2(
        &self,
        pre: ProxyPre<AppState>,
        req: Request<ProxyBody>,
        route: Arc<Route>,
    ) -> Result<Response<ProxyBody>, ComponentError> {
        let slot = self.slot().await?;
        let mut store = self.store(&self.settings, route)?;
        let (tx, rx) = oneshot::channel();
        // Set once the guest has given the head: a failure after it is
        // logged by the task (the request has its response), one before
        // it is the request's error, which the pipeline logs.
        let answered = Arc::new(AtomicBool::new(false));
        let run = p2_handle(pre, &mut store, req, tx, Arc::clone(&answered))?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let _slot = slot;
            let timeout = this.settings.request_timeout;
            let parks = Arc::clone(&store.data().parks);
            let outcome = tokio::time::timeout(timeout, Parked::new(run(&mut store), parks)).await;
            let result = match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(classify(store.data(), &this.settings, e)),
                Err(_) => Err(ComponentError::RequestTimeout { timeout }),
            };
            if let Err(e) = &result
                && answered.load(Ordering::Acquire)
            {
                this.log_failure(e);
            }
            this.log_output(&store.data().output.text());
            result
        });
        // A request that goes away before the head stops its guest.
        let task = AbortOnDrop(Some(task));
        match rx.await {
            Ok(head) => {
                task.detach();
                head
            }
            Err(_) => match task.join().await {
                Some(Ok(())) => Err(ComponentError::NoResponse {
                    message: "handle returned without a response".into(),
                }),
                Some(Err(e)) => Err(e),
                None => Err(ComponentError::Trap {
                    message: "the request's task ended abnormally".into(),
                }),
            },
        }
    }

    /// A slot of the pool, waiting up to `instance_wait` for one.
    async fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ComponentError> {
        let wait = self.settings.instance_wait;
        self.loaded
            .engine
            .slot(wait)
            .await
            .map_err(|_| ComponentError::PoolExhausted {
                waited: wait,
                max_instances: self.loaded.engine.max_instances(),
            })
    }

    /// A store for one request, its limits and clock set.
    fn store(
        &self,
        settings: &ComponentSettings,
        route: Arc<Route>,
    ) -> Result<Store<AppState>, ComponentError> {
        let hooks = OutboundHooks::new(Arc::clone(&self.name), route);
        let state = AppState::new(settings, hooks, EPOCH_TICK)
            .map_err(|message| ComponentError::Trap { message })?;
        let mut store = Store::new(self.loaded.engine.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_callback(|mut ctx| Ok(ctx.data_mut().clock.on_deadline()));
        let ticks = store.data_mut().clock.restart(std::time::Instant::now());
        store.set_epoch_deadline(ticks);
        // The CPU clock runs while the guest does, calls into the host
        // included: not while it waits on the host (its task parked in a
        // call), nor while no guest code runs at all (a 0.3 guest's tasks
        // waiting in the store's event loop). See `state.rs`.
        store.call_hook(|mut ctx, hook| {
            match hook {
                CallHook::CallingHost => {
                    // A 0.3 instance serving several requests: which one
                    // calls (for its outgoing requests' route and caps).
                    if ctx.data_mut().hooks_mut().needs_task() {
                        let root = ctx.async_call_stack().ok().and_then(|s| s.last());
                        ctx.data_mut().hooks_mut().entering_host(root);
                    }
                    ctx.data_mut().host_call_starts()
                }
                CallHook::ReturningFromWasm => ctx.data_mut().guest_returns(),
                CallHook::CallingWasm => {
                    // The deadline is re-armed at each entry of an idle
                    // guest: it measures the guest's runs, not the time a
                    // reused 0.3 instance waits for its next request.
                    if let Some(ticks) = ctx.data_mut().guest_enters() {
                        ctx.set_epoch_deadline(ticks);
                    }
                }
                CallHook::ReturningFromHost => ctx.data_mut().host_call_ends(),
            }
            Ok(())
        });
        Ok(store)
    }

    /// `req` with an absolute URI, which `wasi:http` gives the guest as
    /// its scheme, authority and path: the authority is the client's Host
    /// (or the backend's name).
    fn with_authority(&self, mut req: Request<ProxyBody>) -> Request<ProxyBody> {
        let authority = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .or_else(|| Authority::try_from(&*self.name).ok());
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        // No authority to give (neither a Host nor a name that is one): the
        // path alone, as it came.
        parts.scheme = authority.is_some().then_some(Scheme::HTTP);
        parts.authority = authority;
        parts.path_and_query = parts
            .path_and_query
            .or_else(|| Some(PathAndQuery::from_static("/")));
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        req
    }

    /// What the request's guest wrote to stdout and stderr, if anything.
    fn log_output(&self, text: &str) {
        if !text.is_empty()
            && let Some(left_out) = OUTPUT_LOG.admit()
        {
            tracing::info!(component = %self.name, left_out, "component output: {text}");
        }
    }

    /// A request that had its response head failed while the guest wrote
    /// the body (which is cut).
    fn log_failure(&self, e: &ComponentError) {
        if let Some(left_out) = FAILURE_LOG.admit() {
            tracing::warn!(
                component = %self.name,
                limit = e.is_limit(),
                left_out,
                "component failed after its response head: {e}"
            );
        }
    }
}

/// What a 0.2 request's task runs in its store: instantiation and the
/// call.
type Run =
    Box<dyn for<'a> FnOnce(&'a mut Store<AppState>) -> BoxFuture<'a, wasmtime::Result<()>> + Send>;

/// A `wasi:http/proxy` 0.2 request: the request and the response
/// out-parameter in the store's table; the head is sent on `tx` when the
/// guest sets it.
fn p2_handle(
    pre: ProxyPre<AppState>,
    store: &mut Store<AppState>,
    req: Request<ProxyBody>,
    tx: oneshot::Sender<Head>,
    answered: Arc<AtomicBool>,
) -> Result<Run, ComponentError> {
    let mut http = store.data_mut().http();
    let bad = |e: wasmtime::Error| ComponentError::BadRequest {
        message: format!("{e:#}"),
    };
    let req = req.map(|b| b.map_err(|e| HttpError::InternalError(Some(e.to_string()))));
    let incoming = http
        .new_incoming_request(WasiScheme::Http, req)
        .map_err(bad)?;
    let out = http
        .new_response_outparam_from_callback(move |resp| {
            answered.store(true, Ordering::Release);
            let _ = tx.send(match resp {
                Ok(resp) => Ok(resp.map(body::boxed)),
                Err(code) => Err(ComponentError::NoResponse {
                    message: format!("it answered with the error {code:?}"),
                }),
            });
        })
        .map_err(bad)?;
    Ok(Box::new(move |store| {
        Box::pin(async move {
            let proxy = pre.instantiate_async(&mut *store).await?;
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut *store, incoming, out)
                .await
        })
    }))
}

/// What a request's failure was: the limit it ran into, or the trap.
fn classify(
    state: &AppState,
    settings: &ComponentSettings,
    err: wasmtime::Error,
) -> ComponentError {
    let trap = err.downcast_ref::<wasmtime::Trap>().copied();
    if state.clock.expired || trap == Some(wasmtime::Trap::Interrupt) {
        return ComponentError::CpuTime {
            budget: settings.cpu_time,
        };
    }
    if state.limiter.denied {
        return ComponentError::OutOfMemory {
            limit: settings.memory,
        };
    }
    ComponentError::Trap {
        message: format!("{err:?}"),
    }
}

/// The request's task, aborted if dropped before the response head.
struct AbortOnDrop(Option<tokio::task::JoinHandle<Result<(), ComponentError>>>);

impl AbortOnDrop {
    /// The guest goes on writing the body: the task is no longer aborted.
    fn detach(mut self) {
        self.0.take();
    }

    /// The task's result; `None` if it panicked or was cancelled.
    async fn join(mut self) -> Option<Result<(), ComponentError>> {
        let task = self.0.take()?;
        task.await.ok()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// No way out: every outgoing request is refused (the load check's, and
/// a request sent to a component backend other than through a pick).
pub struct NoOutbound;

impl ComponentOutbound for NoOutbound {
    fn backend_for(&self, _authority: &str) -> Option<String> {
        None
    }

    fn send(
        &self,
        backend: &str,
        _req: Request<ProxyBody>,
    ) -> futures_util::future::BoxFuture<'static, Result<Response<ProxyBody>, inlay_core::ProxyError>>
    {
        let backend = backend.to_owned();
        Box::pin(async move {
            Err(inlay_core::ProxyError::BackendDown {
                backend,
                reason: "no outgoing requests at load".into(),
            })
        })
    }
}
