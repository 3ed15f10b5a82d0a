//! `wasi:http/service` 0.3 components: `handle` is an async export that
//! returns the response, whose body the guest writes to a stream
//! afterwards, and an instance may serve several requests, one after
//! another and at once. Instances are reused as `wasmtime serve` reuses
//! them, by the same code: wasmtime-wasi-http's [`ProxyHandler`] (workers,
//! each an instance whose store's event loop accepts requests while its
//! [`WorkerState`] says so), with Inlay's bounds:
//!
//! - at most `requests_per_instance` requests per instance, at most
//!   `concurrent_requests_per_instance` of them at once, an instance
//!   younger than `instance_lifetime`, and idle for at most
//!   [`IDLE_INSTANCE_TIMEOUT`] (`wasmtime serve`'s default);
//! - an instance that failed (a trap, its CPU time, its memory) ends
//!   (`ProxyHandler` drops its store) and its slot returns to the pool;
//! - instances belong to one generation's [`P3Pool`]: when the generation
//!   goes (a reload), its instances accept nothing more and idle ones
//!   end, so a reload never serves from an old instance.
//!
//! An instance is one store: its memory cap is the instance's, and its CPU
//! clock gives the guest `cpu_time` from the start of its latest request
//! for each request it then runs. Outgoing requests are counted to the
//! request whose task made them ([`OutboundHooks`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::BodyExt;
use inlay_core::body::{self, ProxyBody};
use inlay_core::component::{P3_CONCURRENT_REQUESTS_PER_INSTANCE, P3_REQUESTS_PER_INSTANCE};
use wasmtime::component::GuestTaskId;
use wasmtime::{Store, StoreContextMut};
use wasmtime_wasi_http::handler::{
    ExpirationError, HandlerState, Instance, InstantiationError, Proxy, ProxyHandler, ShouldAccept,
    WorkerExpiration, WorkerState, WorkerStatus,
};
use wasmtime_wasi_http::p3::bindings::ServicePre;
use wasmtime_wasi_http::p3::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error as HttpError, WasiHttpView};

use super::outbound::Route;
use super::state::{AppState, Parked, Parks};
use super::{ComponentError, HttpComponent, NoOutbound, classify};
use crate::engine::PolicyEngine;

/// How long an instance with no request is kept for the next one (as
/// `wasmtime serve --idle-instance-timeout` by default).
pub const IDLE_INSTANCE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a request whose instance failed waits for the instance's
/// store to say why (its worker ends right after the failure).
const FAILURE_WAIT: Duration = Duration::from_secs(1);

/// The 0.3 instances of one generation of a component backend.
pub(super) struct P3Pool {
    handler: ProxyHandler<Instances>,
    /// Set when the generation goes: its instances accept no more.
    retired: Arc<AtomicBool>,
}

impl Drop for P3Pool {
    fn drop(&mut self) {
        self.retired.store(true, Ordering::Relaxed);
    }
}

/// What makes a pool's instances: the component, its settings, and the
/// generation's token.
struct Instances {
    component: HttpComponent,
    pre: ServicePre<AppState>,
    retired: Arc<AtomicBool>,
    /// Instances made, for tests and the log.
    made: AtomicU64,
}

/// One request's part in its instance: where its outgoing requests go and
/// how its failure is told.
struct Ticket {
    route: Arc<Route>,
    /// When the request's response head is due (`first_byte_timeout`
    /// after it was handed to the pool; none for a timeout too large to
    /// add).
    head_by: Option<Instant>,
    /// The instance's failure, once its worker has ended on one.
    failure: Arc<FailureCell>,
}

/// The failure of the instance that served a request: its store's
/// classification, told when the worker ends.
#[derive(Default)]
pub(super) struct FailureCell {
    error: OnceLock<ComponentError>,
    told: tokio::sync::Notify,
}

impl FailureCell {
    fn tell(&self, error: ComponentError) {
        let _ = self.error.set(error);
        self.told.notify_waiters();
        self.told.notify_one();
    }

    /// The failure, waiting up to [`FAILURE_WAIT`] for it.
    async fn wait(&self) -> Option<ComponentError> {
        if let Some(e) = self.error.get() {
            return Some(e.clone());
        }
        let _ = tokio::time::timeout(FAILURE_WAIT, self.told.notified()).await;
        self.error.get().cloned()
    }
}

impl P3Pool {
    pub(super) fn new(component: HttpComponent, pre: ServicePre<AppState>) -> Self {
        let retired = Arc::new(AtomicBool::new(false));
        Self {
            handler: ProxyHandler::new(Instances {
                component,
                pre,
                retired: Arc::clone(&retired),
                made: AtomicU64::new(0),
            }),
            retired,
        }
    }

    /// Instances made so far by this generation.
    pub(super) fn instances_made(&self) -> u64 {
        self.handler.state().made.load(Ordering::Relaxed)
    }

    /// Serves `req` with an instance that has room for it (one of this
    /// generation's, or a new one). Returns the response head; the body
    /// streams from the guest, which the instance's worker drives.
    /// The head is due within `first_byte`: the request's expiration (see
    /// [`Worker::on_request_start`]) is the earlier of that and its
    /// `request_timeout`.
    pub(super) async fn serve(
        &self,
        req: Request<ProxyBody>,
        route: Arc<Route>,
        first_byte: Duration,
    ) -> Result<Response<ProxyBody>, ComponentError> {
        let failure = Arc::new(FailureCell::default());
        let head_by = Instant::now().checked_add(first_byte);
        let ticket = Ticket {
            route,
            head_by,
            failure: Arc::clone(&failure),
        };
        let req = req.map(|b| {
            // An empty body (a GET's) is a boxed zero-sized value: no
            // allocation.
            if http_body::Body::is_end_stream(&b) {
                return http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync();
            }
            b.map_err(|e| HttpError::InternalError(Some(e.to_string())))
                .boxed_unsync()
        });
        match self.handler.handle(ticket, req).await {
            Ok(resp) => Ok(resp.map(body::boxed)),
            Err(e)
                if e.downcast_ref::<ExpirationError>().is_some()
                    && head_by.is_some_and(|t| Instant::now() >= t) =>
            {
                Err(ComponentError::FirstByteTimeout {
                    timeout: first_byte,
                })
            }
            Err(e) => Err(self.failed(e, &failure).await),
        }
    }

    /// What a request that got no response head failed with.
    async fn failed(&self, e: wasmtime::Error, failure: &FailureCell) -> ComponentError {
        if let Some(e) = e.downcast_ref::<InstantiationError<Ticket>>() {
            return match e.error.downcast_ref::<ComponentError>() {
                Some(e) => e.clone(),
                None => ComponentError::Trap {
                    message: format!("{:?}", e.error),
                },
            };
        }
        if e.downcast_ref::<ExpirationError>().is_some() {
            return ComponentError::RequestTimeout {
                timeout: self.handler.state().component.settings.request_timeout,
            };
        }
        if let Some(code) = e.downcast_ref::<ErrorCode>() {
            return ComponentError::NoResponse {
                message: format!("it answered with the error {code:?}"),
            };
        }
        // A trap (its own, or another request's in the same instance): the
        // instance's worker ends and says why.
        match failure.wait().await {
            Some(e) => e,
            None => ComponentError::Trap {
                message: format!("{e:?}"),
            },
        }
    }
}

impl HandlerState for Instances {
    type StoreData = AppState;
    type WorkerExpiration = Expiration;
    type WorkerState = Worker;

    async fn instantiate(&self) -> wasmtime::Result<Instance<AppState, Expiration, Worker>> {
        let c = &self.component;
        let slot = c.slot().await?;
        let settings = &c.settings;
        // Routes are set per request (`on_request_start`).
        let mut store = c.store(settings, Route::new(Arc::new(NoOutbound), 0, settings))?;
        let running = Arc::new(AtomicUsize::new(0));
        store.data_mut().hooks_mut().running = Some(Arc::clone(&running));
        let parks = Arc::clone(&store.data().parks);
        let instantiating = Parked::new(
            Box::pin(self.pre.instantiate_async(&mut store)),
            Arc::clone(&parks),
        );
        let service = match instantiating.await {
            Ok(service) => service,
            Err(e) => return Err(classify(store.data(), settings, e).into()),
        };
        self.made.fetch_add(1, Ordering::Relaxed);
        let born = Instant::now();
        let engine = c.loaded.engine.clone();
        let ends = engine.coarse_now() + settings.instance_lifetime;
        Ok(Instance {
            store,
            proxy: Proxy::P3(service),
            view: WasiHttpView::http,
            expiration: Expiration {
                idle: IDLE_INSTANCE_TIMEOUT,
                request_timeout: settings.request_timeout,
                born,
                lifetime: settings.instance_lifetime,
                sleep: Box::pin(tokio::time::sleep(Duration::MAX)),
                retired: Arc::clone(&self.retired),
                parks,
            },
            state: Worker {
                max_requests: settings
                    .requests_per_instance
                    .unwrap_or(P3_REQUESTS_PER_INSTANCE) as usize,
                max_concurrent: settings
                    .concurrent_requests_per_instance
                    .unwrap_or(P3_CONCURRENT_REQUESTS_PER_INSTANCE)
                    as usize,
                engine,
                ends,
                retired: Arc::clone(&self.retired),
                running,
                cpu_time: settings.cpu_time,
                request_timeout: settings.request_timeout,
                component: c.clone(),
                _slot: slot,
            },
        })
    }
}

/// One instance's bounds and its slot of the pool.
struct Worker {
    max_requests: usize,
    max_concurrent: usize,
    /// The engine, whose epoch ticker's clock says when the instance's
    /// lifetime `ends` (asked at every turn of the worker's loop: a clock
    /// read each time would cost more than the rest of the check).
    engine: PolicyEngine,
    ends: Duration,
    retired: Arc<AtomicBool>,
    /// Requests waiting for their response now (as the worker last
    /// counted them), shared with the store's hooks: while one runs
    /// alone, its guest calls need not be told apart.
    running: Arc<AtomicUsize>,
    cpu_time: Duration,
    request_timeout: Duration,
    component: HttpComponent,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl WorkerState for Worker {
    type StoreData = AppState;
    type RequestData = Ticket;

    fn should_accept_request(&self, concurrent: usize, total: usize) -> ShouldAccept {
        // Asked at every turn of the worker's loop: the count is current.
        self.running.store(concurrent, Ordering::Relaxed);
        if total >= self.max_requests
            || self.retired.load(Ordering::Relaxed)
            || self.engine.coarse_now() >= self.ends
        {
            ShouldAccept::Never
        } else if concurrent >= self.max_concurrent {
            ShouldAccept::No
        } else {
            ShouldAccept::Yes
        }
    }

    fn on_request_start(
        &self,
        mut store: StoreContextMut<'_, AppState>,
        ticket: Ticket,
        task: GuestTaskId,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
        let running = self.running.fetch_add(1, Ordering::Relaxed) + 1;
        let state = store.data_mut();
        // One clock read for the CPU budget and the timer.
        let now = Instant::now();
        // The guest may now run `cpu_time` for each request it runs.
        state.extend_cpu(
            self.cpu_time
                .saturating_mul(u32::try_from(running).unwrap_or(u32::MAX)),
            now,
        );
        state.hooks_mut().start(task, ticket.route);
        state.failures.push(ticket.failure);
        // One timer for both bounds: the head is due by `head_by` (time in
        // the queue counted), the request's run ends at `request_timeout`.
        let head_in = ticket
            .head_by
            .map_or(Duration::MAX, |t| t.saturating_duration_since(now));
        let expires_in = self.request_timeout.min(head_in);
        match tokio::time::Instant::from_std(now).checked_add(expires_in) {
            Some(at) => Box::pin(tokio::time::sleep_until(at)),
            // Too far to add: tokio's own far future.
            None => Box::pin(tokio::time::sleep(expires_in)),
        }
    }

    fn drop(&self, store: Store<AppState>, result: wasmtime::Result<()>) {
        let state = store.data();
        // A failure ends the worker (the store is not used again): its
        // requests are told why.
        if let Err(e) = result {
            let error = if stopped(&e) {
                tracing::debug!(
                    component = %self.component.name,
                    "a 0.3 instance's worker stopped with the runtime"
                );
                ComponentError::Stopped
            } else {
                let error = classify(state, &self.component.settings, e);
                self.component.log_failure(&error);
                error
            };
            for cell in &state.failures {
                cell.tell(error.clone());
            }
        }
        self.component.log_output(&state.output.text());
    }
}

/// What wasmtime-wasi-http's worker ends with when its task is dropped
/// before it finishes (`handler.rs`, `Dropper`).
const WORKER_DROPPED: &str = "worker panicked";

/// Whether `e` is a worker's task dropped unfinished, not a failure of
/// the guest: the runtime ending at shutdown drops every task, and an
/// instance kept for reuse is one. wasmtime-wasi-http says "worker
/// panicked" both then and when the worker panics, which unwinds through
/// here.
fn stopped(e: &wasmtime::Error) -> bool {
    !std::thread::panicking() && e.to_string() == WORKER_DROPPED
}

/// When an instance ends: idle too long, past its lifetime while idle,
/// its generation gone, or its requests past `request_timeout` (checked
/// from outside the store's event loop, which a guest in a loop holds).
struct Expiration {
    idle: Duration,
    request_timeout: Duration,
    born: Instant,
    lifetime: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// An idle instance of a generation that went ends at its next poll
    /// (at the latest when it has been idle for `idle`).
    retired: Arc<AtomicBool>,
    /// Polled each time the store's event loop is pending, before the
    /// worker's task parks: the store's CPU clock is told.
    parks: Arc<Parks>,
}

impl WorkerExpiration for Expiration {
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        status: WorkerStatus,
        start: Instant,
    ) -> Poll<()> {
        self.parks.parked();
        let deadline = match status {
            WorkerStatus::Idle => {
                if self.retired.load(Ordering::Relaxed) {
                    return Poll::Ready(());
                }
                (start + self.idle).min(self.born + self.lifetime)
            }
            WorkerStatus::Requests | WorkerStatus::PostReturn => start + self.request_timeout,
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        // The timer moves only to an earlier deadline: the deadline moves
        // with every request (its start), and a timer reset locks the timer
        // wheel. A timer that fires before the current deadline is set to
        // it then.
        if deadline < self.sleep.deadline() {
            self.sleep.as_mut().reset(deadline);
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if tokio::time::Instant::now() >= deadline {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }
}
