//! A component's outgoing HTTP (`wasi:http/outgoing-handler`): only to the
//! configured backends, through the host's fetcher ([`ComponentOutbound`],
//! which `inlay-backend` implements over its backends), within the
//! request's caps. There is no other way out: the `wasi:http` crate's own
//! client is not compiled in, and sockets are denied.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use inlay_core::body::{BoxError, ProxyBody};
use inlay_core::{ComponentSettings, LogLimit, ProxyError};
use wasmtime::component::GuestTaskId;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use crate::services::BodyBudget;

/// How deep components may call components through outgoing requests
/// (a component that calls its own backend would otherwise recurse until
/// the pool is full).
pub const MAX_DEPTH: u8 = 4;

/// The host's side of a component's outgoing requests.
pub trait ComponentOutbound: Send + Sync {
    /// The configured backend or director an outgoing request to
    /// `authority` (`host[:port]`) goes to: one of that name, or one whose
    /// address or `host_header` it is; `None` refuses the request.
    fn backend_for(&self, authority: &str) -> Option<String>;

    /// Send `req` (its URI a path and query; `Host` set only when the
    /// component named the backend's own authority) to `backend`.
    fn send(
        &self,
        backend: &str,
        req: Request<ProxyBody>,
    ) -> BoxFuture<'static, Result<Response<ProxyBody>, ProxyError>>;
}

/// How many components deep a request is: carried in the extensions of
/// the requests a component sends, read by the component that serves one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Depth(pub u8);

/// Refused outgoing requests are logged at most this often, whatever the
/// number of requests of misbehaving guests.
static REFUSED_LOG: LogLimit = LogLimit::per_second(5);

/// Where one request's outgoing requests go, and its caps.
pub(crate) struct Route {
    outbound: Arc<dyn ComponentOutbound>,
    /// How deep the request being served is.
    depth: u8,
    /// Outgoing requests made so far, and the cap.
    sent: AtomicU32,
    max: u32,
    /// Response body bytes the request's outgoing requests may read, and
    /// what is left of them, made at its first outgoing request (most
    /// requests make none).
    max_bytes: u64,
    budget: OnceLock<BodyBudget>,
}

impl Route {
    /// A request `depth` components deep, sending through `outbound`
    /// within `settings`' caps.
    pub(crate) fn new(
        outbound: Arc<dyn ComponentOutbound>,
        depth: u8,
        settings: &ComponentSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            outbound,
            depth,
            sent: AtomicU32::new(0),
            max: settings.max_subrequests,
            max_bytes: settings.max_subrequest_bytes,
            budget: OnceLock::new(),
        })
    }
}

/// The `wasi:http` hooks of a store: its outgoing requests, counted to
/// the request they are made for and sent through the host. A 0.2 store
/// serves one request; a 0.3 instance may serve several, whose guest
/// tasks are told apart by the root of the async call stack at every call
/// into the host while more than one waits for its response
/// ([`OutboundHooks::entering_host`]).
pub(crate) struct OutboundHooks {
    /// The latest request to start, whose guest code calls the host now
    /// unless `current_task` says another's does.
    current: Arc<Route>,
    /// The task of the request whose guest code called the host last,
    /// told apart while several run: only the task is kept at each call
    /// (every call into the host comes through the store's hook); its
    /// route is looked up when the guest sends a request.
    current_task: Option<GuestTaskId>,
    /// A 0.3 instance's requests, by the guest task `handle` runs in
    /// (task ids are the store's: a fast hash, no SipHash keys needed).
    by_task: HashMap<GuestTaskId, Arc<Route>, foldhash::fast::FixedState>,
    /// A 0.3 instance's count of the requests waiting for their response
    /// (`None` for a 0.2 store, which serves one).
    pub(crate) running: Option<Arc<AtomicUsize>>,
    /// The component backend's name, for the log.
    pub(crate) component: Arc<str>,
}

impl OutboundHooks {
    pub(crate) fn new(component: Arc<str>, route: Arc<Route>) -> Self {
        Self {
            current: route,
            current_task: None,
            by_task: HashMap::default(),
            running: None,
            component,
        }
    }

    /// A 0.3 request starts in `task`.
    pub(crate) fn start(&mut self, task: GuestTaskId, route: Arc<Route>) {
        self.current = Arc::clone(&route);
        self.current_task = None;
        self.by_task.insert(task, route);
    }

    /// Whether guest calls into the host must be told apart: several
    /// requests are waiting for their response in this store. (With one,
    /// its calls are its own; a guest task that goes on after its
    /// response, while a later request runs alone, counts to that one.)
    pub(crate) fn needs_task(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.load(Ordering::Relaxed) > 1)
    }

    /// The guest calls the host from the task whose root is `root`.
    pub(crate) fn entering_host(&mut self, root: Option<GuestTaskId>) {
        if let Some(task) = root.filter(|t| self.by_task.contains_key(t)) {
            self.current_task = Some(task);
        }
    }

    /// The route of the request whose guest code calls the host now.
    fn route(&self) -> &Arc<Route> {
        self.current_task
            .and_then(|t| self.by_task.get(&t))
            .unwrap_or(&self.current)
    }

    fn refuse(&self, authority: &str, why: &str) {
        if let Some(left_out) = REFUSED_LOG.admit() {
            tracing::warn!(
                component = %self.component,
                authority,
                left_out,
                "component's outgoing request refused: {why}"
            );
        }
    }
}

type SendResult = Result<
    (
        Response<WasiBody>,
        Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ),
    HttpError,
>;

impl WasiHttpHooks for OutboundHooks {
    // The defaults make a new `Arc` at each call, once per field of every
    // request and response: the forbidden fields are the default ones,
    // with a filter made once.
    fn is_forbidden_header(&mut self, name: &http::HeaderName) -> bool {
        DEFAULT_FORBIDDEN_HEADERS.contains(name)
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        static FILTER: OnceLock<ForbiddenHeaderFilter> = OnceLock::new();
        Arc::clone(FILTER.get_or_init(|| Arc::new(|name| DEFAULT_FORBIDDEN_HEADERS.contains(name))))
    }

    fn send_request(
        &mut self,
        request: Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let authority = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let refused = |e: HttpError| -> Box<dyn Future<Output = SendResult> + Send> {
            Box::new(async move { Err(e) })
        };
        let route = Arc::clone(self.route());
        if route.depth >= MAX_DEPTH {
            self.refuse(&authority, "components call each other too deep");
            return refused(HttpError::LoopDetected);
        }
        if route
            .sent
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < route.max).then_some(n + 1)
            })
            .is_err()
        {
            self.refuse(&authority, "max_subrequests reached");
            return refused(HttpError::HttpRequestDenied);
        }
        let Some(backend) = route.outbound.backend_for(&authority) else {
            self.refuse(&authority, "not a configured backend");
            return refused(HttpError::HttpRequestDenied);
        };
        let (mut parts, body) = request.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        parts.uri = match pq.parse() {
            Ok(uri) => uri,
            Err(_) => return refused(HttpError::HttpRequestUriInvalid),
        };
        parts.version = http::Version::HTTP_11;
        // A backend named by its name gets the Host of its own address
        // (or host_header), as the host's other requests do.
        if authority.eq_ignore_ascii_case(&backend) {
            parts.headers.remove(http::header::HOST);
        }
        parts.extensions.insert(Depth(route.depth + 1));
        let body = body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync();
        let sent = route
            .outbound
            .send(&backend, Request::from_parts(parts, body));
        let budget = route
            .budget
            .get_or_init(|| BodyBudget::new(route.max_bytes))
            .clone();
        Box::new(async move {
            let resp = sent.await.map_err(|e| wasi_error(&e))?;
            let resp = resp.map(|body| Budgeted { body, budget }.boxed_unsync());
            let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async { Ok(()) });
            Ok((resp, io))
        })
    }
}

/// The `wasi:http` error a guest sees for a failed outgoing request.
fn wasi_error(e: &ProxyError) -> HttpError {
    match e {
        ProxyError::BackendDown { .. } => HttpError::ConnectionRefused,
        ProxyError::BackendBusy { .. } => HttpError::ConnectionLimitReached,
        ProxyError::BackendTimeout { .. } => HttpError::HttpResponseTimeout,
        ProxyError::BadRequest(_) => HttpError::HttpRequestUriInvalid,
        other => HttpError::InternalError(Some(other.to_string())),
    }
}

/// An outgoing request's response body, its bytes taken from the
/// request's budget as they arrive.
struct Budgeted {
    body: ProxyBody,
    budget: BodyBudget,
}

impl Body for Budgeted {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if self.budget.take(n) {
                    Poll::Ready(Some(Ok(frame)))
                } else {
                    Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(None))))
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let error = if e.to_string().contains("between_bytes_timeout") {
                    HttpError::ConnectionReadTimeout
                } else {
                    HttpError::InternalError(Some(e.to_string()))
                };
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
