//! fetch: the backend request made from the client's request head.

use http::Request;

use super::RequestHead;
use crate::backend::Backend;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::headers;

/// Send `head` with `body` to `backend`, adding `Via` and `X-Forwarded-For`.
pub async fn send(
    backend: &Backend,
    head: &RequestHead,
    body: ProxyBody,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    let mut req = Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = head.uri.clone();
    let h = req.headers_mut();
    h.clone_from(&head.headers);
    headers::add_via(h);
    headers::add_forwarded_for(h, head.client_ip);
    backend.send(req).await
}
