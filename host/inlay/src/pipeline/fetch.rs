//! fetch: the backend request made from the client's request head.

use http::{HeaderMap, Method, Request, header};
use inlay_core::{ProxyBody, ProxyError, RequestHead, headers};

use crate::backend::Backend;

/// Client fields that would make the backend answer with less than a whole
/// object; a fetch for the cache drops them (and adds its own validators).
const PARTIAL_FIELDS: [header::HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::RANGE,
];

/// Send `head` to `backend` with `method` and `body`, adding `Via` and
/// `X-Forwarded-For`. `for_cache` is `Some(validators)` when the response is
/// meant for the cache: the client's conditional and Range fields are then
/// replaced by the cache's own validators.
pub async fn send(
    backend: &Backend,
    head: &RequestHead,
    method: Method,
    body: ProxyBody,
    for_cache: Option<HeaderMap>,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = head.uri.clone();
    let h = req.headers_mut();
    h.clone_from(&head.headers);
    if let Some(validators) = for_cache {
        for f in &PARTIAL_FIELDS {
            h.remove(f);
        }
        h.remove(header::CONTENT_LENGTH);
        h.extend(validators);
    }
    // Tell the origin we process ESI (Edge Architecture Specification).
    h.insert(
        "surrogate-capability",
        http::HeaderValue::from_static("inlay=\"Surrogate/1.0 ESI/1.0\""),
    );
    headers::add_via(h);
    headers::add_forwarded_for(h, head.client_ip);
    tracing::debug!(backend = backend.name(), method = %req.method(), uri = %req.uri(), "backend fetch");
    backend.send(req).await
}
