//! deliver: the last edits before the response goes to the client.

use http::{Response, StatusCode};

use super::RequestHead;
use crate::body::ProxyBody;
use crate::headers;

/// Drop hop-by-hop fields and add `Via`.
pub fn finish(
    mut resp: Response<ProxyBody>,
    _head: &RequestHead,
    _ok: StatusCode,
) -> Response<ProxyBody> {
    // The backend's HTTP version is not the client's: let the server choose.
    *resp.version_mut() = http::Version::HTTP_11;
    let h = resp.headers_mut();
    headers::strip_hop_by_hop(h);
    headers::add_via(h);
    resp
}
