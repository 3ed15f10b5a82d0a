//! recv: the first phase. The host normalises the request (Host, URI form,
//! hop-by-hop fields); then the route is decided.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use inlay_core::body::{BoxError, ProxyBody};
use inlay_core::{ProxyError, RequestAction, RequestHead, body, headers};
use inlay_runtime::{Hook, PolicyCall};

use super::Route;
use crate::metrics::Metrics;

/// The request body, its bytes counted in `metrics` as they are read (a
/// passed request's body; the cache never reads one).
pub fn counted_body(body: ProxyBody, metrics: &Arc<Metrics>) -> ProxyBody {
    if !metrics.enabled() {
        return body;
    }
    let metrics = Arc::clone(metrics);
    body::boxed(body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            metrics.request_body_bytes(data.len() as u64);
        }
        frame
    }))
}

/// Refuses a request whose declared `Content-Length` is over `limit`
/// bytes, before anything is sent to a backend.
pub fn check_declared_length(headers: &HeaderMap, limit: u64) -> Result<(), ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > limit => Err(ProxyError::RequestTooLarge { limit }),
        _ => Ok(()),
    }
}

/// The request body, failing once more than `limit` bytes have come (a
/// chunked body can claim any chunk size, so the stream itself is
/// counted); `over` is set when it did, so the failure is the client's 413
/// and not the backend's 502.
pub fn capped_body(body: ProxyBody, limit: u64, over: Arc<AtomicBool>) -> ProxyBody {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    inlay_core::body::boxed(CappedBody {
        inner: Limited::new(body, limit),
        over,
    })
}

struct CappedBody {
    inner: Limited<ProxyBody>,
    over: Arc<AtomicBool>,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &polled
            && e.downcast_ref::<LengthLimitError>().is_some()
        {
            self.over.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Turn the client's request head into the form every later phase relies on:
/// a `Host` header (taken from the URI authority for HTTP/2 and absolute-form
/// requests), a URI of path and query only, and no hop-by-hop fields.
pub fn normalise(
    parts: http::request::Parts,
    peer: SocketAddr,
    default_backend: &str,
) -> Result<RequestHead, ProxyError> {
    let mut headers = parts.headers;
    if let Some(auth) = parts.uri.authority() {
        let v = HeaderValue::from_str(auth.as_str())
            .map_err(|_| ProxyError::BadRequest("bad authority".into()))?;
        headers.insert(header::HOST, v);
    }
    match headers.get_all(header::HOST).iter().count() {
        0 if parts.version == http::Version::HTTP_11 => {
            return Err(ProxyError::BadRequest(
                "HTTP/1.1 request without Host".into(),
            ));
        }
        0 | 1 => {}
        _ => return Err(ProxyError::BadRequest("more than one Host header".into())),
    }
    // A host name is visible ASCII (RFC 3986 reg-name, IP literals, port);
    // anything else would reach the key and the backend as bytes nobody
    // can read back.
    if let Some(host) = headers.get(header::HOST)
        && !host.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(ProxyError::BadRequest(
            "Host is not a host name (visible ASCII only)".into(),
        ));
    }
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if !pq.starts_with('/') {
        // `OPTIONS *` and friends are not proxied.
        return Err(ProxyError::BadRequest(format!(
            "unsupported request target {pq:?}"
        )));
    }
    let uri: Uri = pq
        .parse()
        .map_err(|_| ProxyError::BadRequest(format!("bad request target {pq:?}")))?;
    headers::strip_hop_by_hop(&mut headers);
    Ok(RequestHead {
        method: parts.method,
        uri,
        headers,
        client_ip: peer.ip(),
        backend: default_backend.to_owned(),
        cache_key_extra: Vec::new(),
    })
}

/// The route: the policy's `on-request` decides when there is a policy (it
/// may also rewrite `head`); otherwise the built-in rules.
pub async fn route(
    head: &mut RequestHead,
    policy: Option<&mut PolicyCall>,
    metrics: &Metrics,
) -> Result<Route, ProxyError> {
    let Some(call) = policy else {
        return Ok(builtin(head));
    };
    // The client's body goes on as it came: the policy cannot reframe it.
    let length = head.headers.get(header::CONTENT_LENGTH).cloned();
    let started = metrics.hook_start();
    let action = call.on_request(head).await;
    metrics.hook_done(Hook::OnRequest, started, &action);
    headers::restore_framing(&mut head.headers, length);
    Ok(match action? {
        RequestAction::Lookup => Route::Lookup,
        RequestAction::Pass => Route::Pass,
        RequestAction::Synthetic(s) => {
            let mut resp = Response::new(body::full(s.body));
            *resp.status_mut() = s.status;
            *resp.headers_mut() = s.headers;
            // The server frames the policy's body from its length.
            headers::restore_framing(resp.headers_mut(), None);
            Route::Synthetic(resp)
        }
    })
}

/// Varnish's built-in `vcl_recv` decision.
pub fn builtin(head: &RequestHead) -> Route {
    let cacheable_method = head.method == http::Method::GET || head.method == http::Method::HEAD;
    if !cacheable_method
        || head.headers.contains_key(header::AUTHORIZATION)
        || head.headers.contains_key(header::COOKIE)
    {
        Route::Pass
    } else {
        Route::Lookup
    }
}
