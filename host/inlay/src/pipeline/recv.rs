//! recv: the first phase, in one place. The request is counted, given its
//! id, bounded (its declared and streamed body), normalised (Host, URI
//! form, hop-by-hop fields) and checked for the cluster's hop; then the
//! route is decided: PURGE and BAN go to their handlers, the policy's
//! `on-request` (or the built-in rules) chooses lookup, pass or an answer;
//! an upgrade Inlay tunnels (a WebSocket, found here) goes to the tunnel
//! unless the policy answered it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use inlay_core::body::{BoxError, ProxyBody};
use inlay_core::{ProxyError, RequestAction, RequestHead, body, headers};
use inlay_runtime::{Hook, PolicyCall};

use super::context::BodyFault;
use super::{Pipeline, RequestCtx};
use crate::metrics::Metrics;
use inlay_core::server_timing;

/// What recv decided.
#[derive(Debug)]
pub enum Route {
    /// Use the cache.
    Lookup,
    /// Go to the backend; do not use the cache.
    Pass,
    /// Answer at once: the policy's synthetic response.
    Synthetic(Response<ProxyBody>),
    /// Answer at once, as it is (a peer's fetch that came back to this node).
    Answer(Response<ProxyBody>),
    /// The PURGE method.
    Purge,
    /// The BAN method.
    Ban,
    /// Open a tunnel (a WebSocket) to the backend: never cached.
    Tunnel,
}

/// recv: from the request as it came to the route, with `ctx` holding the
/// normalised head, the bounded body and the policy instance.
pub(super) async fn run(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    req: Request<ProxyBody>,
) -> Result<Route, ProxyError> {
    let (mut parts, body) = req.into_parts();
    p.metrics.client_request(parts.version);
    // The request id and the cluster's hop are read before the hop-by-hop
    // fields go: a Connection option may not name them either.
    let hop = inlay_cluster::shard::HOP;
    let request_id = p.request_ids.header().unwrap_or(&hop);
    refuse_protected_options(&parts.headers, &[&hop, request_id])?;
    if let Some(shard) = &p.shard {
        shard.accept_hop(&mut parts.headers);
    }
    ctx.request_id = p.request_ids.assign(&mut parts.headers);
    // The record's copies are made only for a line to write.
    let logged = p.access_log.is_on();
    if logged {
        ctx.record.request_id = ctx
            .request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
    }
    // Only the policy may turn Server-Timing on for one request.
    parts.headers.remove(server_timing::REQUEST_FLAG);
    let limit = p.config.server.max_request_body;
    ctx.body_limit = limit;
    check_declared_length(&parts.headers, limit)?;
    ctx.body = Some(match body.is_end_stream() {
        // No body (a GET's): nothing to count nor to fail.
        true => body,
        false => {
            let fault = Arc::new(OnceLock::new());
            ctx.body_fault = Some(Arc::clone(&fault));
            capped_body(body, limit, fault)
        }
    });
    let upgrade = super::tunnel::requested(&mut parts, &p.config.websocket)?;
    ctx.head = normalise(parts, ctx.peer, p.backends.default_name())?;
    if let Some(up) = &upgrade {
        // The policy sees the upgrade as its client asked for it.
        ctx.head
            .headers
            .insert(header::UPGRADE, up.protocol().clone());
    }
    ctx.upgrade = upgrade;
    ctx.for_peer = p.shard.is_some() && ctx.head.headers.contains_key(hop);
    if p.shard
        .as_ref()
        .is_some_and(|s| s.is_own_hop(&ctx.head.headers))
    {
        ctx.body = None;
        return Ok(Route::Answer(inlay_cluster::shard::loop_response()));
    }
    match ctx.head.method.as_str() {
        "PURGE" => return Ok(Route::Purge),
        "BAN" => return Ok(Route::Ban),
        _ => {}
    }
    ctx.policy = p.start_policy().await?;
    let route = match route(&mut ctx.head, ctx.policy.as_mut(), &p.metrics).await? {
        // Whether the policy said lookup or pass: a tunnel is never cached.
        Route::Lookup | Route::Pass if ctx.upgrade.is_some() => Route::Tunnel,
        route => route,
    };
    // Whatever the policy set, the flag goes no further (the client's
    // was removed above).
    if ctx.policy.is_some() {
        ctx.timing.on |= server_timing::take_request_flag(&mut ctx.head.headers);
    }
    ctx.timing.phase("recv", ctx.started);
    if logged {
        ctx.record.backend = Some(ctx.head.backend.clone());
    }
    Ok(route)
}

/// A request body as a listener hands it over: hyper's (HTTP/1.1, h2) or
/// an HTTP/3 request stream's.
pub trait ClientBody {
    /// The body boxed, failing past `limit` bytes as early as its framing
    /// tells (recv counts the bytes too).
    fn bounded(self, limit: u64) -> ProxyBody;
}

impl ClientBody for Incoming {
    fn bounded(mut self, limit: u64) -> ProxyBody {
        if self.is_end_stream() {
            // No body: one that costs no allocation.
            return body::empty();
        }
        // A chunk whose declared size cannot fit fails the body before its
        // data (a patched hyper: vendor/hyper/PATCHES.md).
        self.limit_declared_length(limit);
        body::boxed(self)
    }
}

impl ClientBody for inlay_listener::QuicBody {
    fn bounded(self, _limit: u64) -> ProxyBody {
        // Its DATA frames come whole from h3: recv's count bounds them.
        body::boxed(self)
    }
}

/// Refuses a request whose declared `Content-Length` is over `limit`
/// bytes, before anything is sent to a backend.
fn check_declared_length(headers: &HeaderMap, limit: u64) -> Result<(), ProxyError> {
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
/// counted); `fault` records why it failed.
fn capped_body(body: ProxyBody, limit: u64, fault: Arc<OnceLock<BodyFault>>) -> ProxyBody {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    inlay_core::body::boxed(CappedBody {
        inner: Limited::new(body, limit),
        fault,
    })
}

struct CappedBody {
    inner: Limited<ProxyBody>,
    fault: Arc<OnceLock<BodyFault>>,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &polled {
            let _ = self.fault.set(body_fault(&**e));
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

/// Why the client's body failed: past the limit (counted by [`Limited`],
/// or a chunk size hyper refused as it read it: an `io::Error` of kind
/// `FileTooLarge`), or anything else the client did.
fn body_fault(e: &(dyn std::error::Error + 'static)) -> BodyFault {
    let causes: Vec<&(dyn std::error::Error + 'static)> =
        std::iter::successors(Some(e), |e| e.source()).collect();
    let too_large = causes.iter().any(|c| {
        c.is::<LengthLimitError>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::FileTooLarge)
    });
    if too_large {
        return BodyFault::TooLarge;
    }
    // hyper's message ("error reading a body from connection") and its
    // cause ("Invalid chunk size line: Invalid Size").
    let causes: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
    BodyFault::Broken(causes.join(": "))
}

/// The body of a request on its way to a backend, once its first frame
/// has come (at most `wait`): HTTP/1 chunked framing that is malformed, or
/// a chunk that cannot fit `server.max_request_body`, fails it here (the
/// request's failure is then the client's 400 or 413, [`BodyFault`]),
/// before the backend is asked, not after the origin has a request whose
/// body never comes. A body whose length the head gave, or that has not
/// started within `wait`, goes on as it is.
pub(super) async fn body_started(
    mut body: ProxyBody,
    wait: Duration,
) -> Result<ProxyBody, ProxyError> {
    if body.is_end_stream() || body.size_hint().exact().is_some() {
        return Ok(body);
    }
    match tokio::time::timeout(wait, body.frame()).await {
        Err(_) => Ok(body),
        Ok(None) => Ok(body::empty()),
        Ok(Some(Ok(first))) => {
            let rest = http_body_util::BodyStream::new(body);
            let first = futures_util::stream::iter([Ok(first)]);
            Ok(body::boxed(http_body_util::StreamBody::new(
                first.chain(rest),
            )))
        }
        // The fault was recorded as it was read.
        Ok(Some(Err(e))) => Err(ProxyError::BadRequest(format!("request body: {e}"))),
    }
}

/// A 400 for a `Connection` option that names a field Inlay reads before
/// it removes the hop-by-hop fields, or decides with ([`CONNECTION_PROTECTED`](headers::CONNECTION_PROTECTED),
/// and `also`): removing it after the checks would let the backend and
/// the cache key see another request than the one checked.
fn refuse_protected_options(
    headers: &HeaderMap,
    also: &[&http::HeaderName],
) -> Result<(), ProxyError> {
    match headers::protected_connection_option(headers, also) {
        None => Ok(()),
        Some(name) => Err(ProxyError::BadRequest(format!(
            "Connection names {name}, an end-to-end field Inlay relies on (RFC 9110 section 7.6.1)"
        ))),
    }
}

/// Turn the client's request head into the form every later phase relies on:
/// a `Host` header (taken from the URI authority for HTTP/2 and absolute-form
/// requests) that is a host as RFC 3986 has it, a URI of path and query
/// only, and no hop-by-hop fields (a `Connection` option naming a field
/// the proxy relies on is a 400, not a removal).
pub fn normalise(
    parts: http::request::Parts,
    peer: SocketAddr,
    default_backend: &str,
) -> Result<RequestHead, ProxyError> {
    let mut headers = parts.headers;
    refuse_protected_options(&headers, &[])?;
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
    // A host as RFC 3986 has it (a name, an IP address or literal, a
    // port): userinfo, a path or a backslash would reach the key and the
    // backend as a Host nobody meant.
    if let Some(host) = headers.get(header::HOST)
        && !headers::is_host(host.as_bytes())
    {
        return Err(ProxyError::BadRequest(format!(
            "Host {:?} is not a host (RFC 3986: a name or an IP address, then a port; no userinfo, path, spaces or backslashes)",
            String::from_utf8_lossy(&host.as_bytes()[..host.len().min(100)])
        )));
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
    // The origin form as it came (no copy), or the path and query of an
    // absolute one.
    let uri = match parts.uri.scheme().is_none() && parts.uri.authority().is_none() {
        true => parts.uri,
        false => pq
            .parse()
            .map_err(|_| ProxyError::BadRequest(format!("bad request target {pq:?}")))?,
    };
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
async fn route(
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
    // Boxed, as every hook call is: a policy call's future is large, and
    // inline it would make every request's future larger (and the copy of
    // it hyper makes), with or without a policy.
    let action = Box::pin(call.on_request(head)).await;
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
fn builtin(head: &RequestHead) -> Route {
    if head.builtin_lookup() {
        Route::Lookup
    } else {
        Route::Pass
    }
}
