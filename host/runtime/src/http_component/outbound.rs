//! A component's outgoing HTTP (`wasi:http/outgoing-handler`): only to the
//! configured backends, through the host's fetcher ([`ComponentOutbound`],
//! which `inlay-backend` implements over its backends), within the
//! request's caps. There is no other way out: the `wasi:http` crate's own
//! client is not compiled in, and sockets are denied.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use inlay_core::body::{BoxError, ProxyBody};
use inlay_core::{LogLimit, ProxyError};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

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

/// The `wasi:http` hooks of one request's store: its outgoing requests,
/// counted and sent through the host.
pub(crate) struct OutboundHooks {
    pub(crate) outbound: Arc<dyn ComponentOutbound>,
    /// The component backend's name, for the log.
    pub(crate) component: Arc<str>,
    /// How deep the request being served is.
    pub(crate) depth: u8,
    /// Outgoing requests made so far, and the cap.
    pub(crate) sent: u32,
    pub(crate) max: u32,
    /// Response body bytes the request's outgoing requests may still read.
    pub(crate) budget: BodyBudget,
}

impl OutboundHooks {
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
        if self.depth >= MAX_DEPTH {
            self.refuse(&authority, "components call each other too deep");
            return refused(HttpError::LoopDetected);
        }
        if self.sent >= self.max {
            self.refuse(&authority, "max_subrequests reached");
            return refused(HttpError::HttpRequestDenied);
        }
        let Some(backend) = self.outbound.backend_for(&authority) else {
            self.refuse(&authority, "not a configured backend");
            return refused(HttpError::HttpRequestDenied);
        };
        self.sent += 1;
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
        parts.extensions.insert(Depth(self.depth + 1));
        let body = body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync();
        let sent = self
            .outbound
            .send(&backend, Request::from_parts(parts, body));
        let budget = self.budget.clone();
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
