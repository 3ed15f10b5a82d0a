//! recv: the first phase. The host normalises the request (Host, URI form,
//! hop-by-hop fields); then the route is decided.

use std::net::SocketAddr;

use http::{HeaderValue, Response, Uri, header};
use inlay_core::{ProxyError, RequestAction, RequestHead, body, headers};
use inlay_runtime::PolicyCall;

use super::Route;

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
) -> Result<Route, ProxyError> {
    let Some(call) = policy else {
        return Ok(builtin(head));
    };
    // The client's body goes on as it came: the policy cannot reframe it.
    let length = head.headers.get(header::CONTENT_LENGTH).cloned();
    let action = call.on_request(head).await;
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
