//! fetch: the backend request made from the client's request head.

use http::{HeaderMap, HeaderName, Method, Request, header};
use inlay_cache::ContentCodings;
use inlay_core::{ProxyBody, ProxyError, RequestHead, headers};

use crate::backend::Picked;

/// Client fields that would make the backend answer with less than a whole
/// object; a fetch for the cache drops them (and adds its own validators).
const PARTIAL_FIELDS: [header::HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::RANGE,
];

/// How a fetch for the cache differs from the client's request.
pub struct ForCache<'a> {
    /// The cache's own validators, sent instead of the client's
    /// conditional and Range fields.
    pub validators: HeaderMap,
    /// Accept-Encoding becomes the coding the cache key selects.
    pub codings: &'a ContentCodings,
    /// Fields the origin may trust that are not in the key
    /// (`cache.strip_request_headers`).
    pub strip: &'a [HeaderName],
}

/// Send `head` to `backend` with `method` and `body`, adding `Via` and
/// `X-Forwarded-For`. `for_cache` is set when the response is meant for the
/// cache: the client's conditional and Range fields are then replaced by the
/// cache's own validators, Accept-Encoding by the value the key used, and
/// the unkeyed fields the origin may trust are removed, so what the origin
/// answers is what every request with this key may be served.
pub async fn send(
    backend: &Picked,
    head: &RequestHead,
    method: Method,
    body: ProxyBody,
    for_cache: Option<ForCache<'_>>,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    let req = request(head, method, body, for_cache);
    tracing::debug!(backend = backend.name(), method = %req.method(), uri = %req.uri(), "backend fetch");
    backend.send(req).await
}

/// The request [`send`] sends (a key's owner in the cluster gets it too).
pub fn request(
    head: &RequestHead,
    method: Method,
    body: ProxyBody,
    for_cache: Option<ForCache<'_>>,
) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = head.uri.clone();
    let h = req.headers_mut();
    h.clone_from(&head.headers);
    if let Some(fill) = for_cache {
        for f in PARTIAL_FIELDS.iter().chain(fill.strip) {
            h.remove(f);
        }
        h.remove(header::CONTENT_LENGTH);
        fill.codings.normalise(h);
        h.extend(fill.validators);
    }
    // Tell the origin we process ESI (Edge Architecture Specification).
    h.insert(
        "surrogate-capability",
        http::HeaderValue::from_static("inlay=\"Surrogate/1.0 ESI/1.0\""),
    );
    // A peer's hop token is for this node, not for the origin.
    h.remove(inlay_cluster::shard::HOP);
    headers::add_via(h);
    headers::add_forwarded_for(h, head.client_ip);
    req
}
