//! deliver: the last edits before the response goes to the client:
//! the representation it is sent in (`compress.rs`: the coding a stored
//! object holds, or one made as it streams), conditional requests and
//! Range answered from a cached object (or cut from a body still being
//! stored), `Cache-Status`, `Via`, the removal of
//! what is only for us, the policy's `on-deliver`; then, on every response
//! (failures included), the request id and `Server-Timing`.

use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError, RequestHead, ResponseHead, headers};
use inlay_runtime::{Hook, PolicyCall};

use super::compress::{self, Compressor};
use super::context::BodyFault;
use super::{Outcome, Pipeline, RequestCtx};
use crate::metrics::Metrics;
use inlay_core::server_timing;

/// deliver: the response for `out`.
pub(super) async fn run(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    out: Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    let delivering = ctx.timing.now();
    ctx.record.cache = out.status;
    let head = &ctx.head;
    // A peer stores the identity response and compresses for itself.
    let compressor = (!ctx.for_peer).then_some(&p.compressor);
    // An ESI page's validators and bytes are not its template's.
    let resp = match (out.esi, &out.object, compressor) {
        (false, Some(obj), Some(c)) => {
            let (resp, whole) = c.stored(head, out.resp, obj);
            conditional_and_range(head, resp, whole)
        }
        (false, Some(obj), None) => {
            conditional_and_range(head, out.resp, inlay_cache::coding::identity_body(obj))
        }
        (_, _, Some(c)) => streaming(c, head, out.resp, out.joined && !out.esi),
        (false, None, None) if out.joined => conditional_and_range_of_stream(head, out.resp),
        (_, _, None) => out.resp,
    };
    let edge_fields = ctx
        .for_peer
        .then(|| inlay_cluster::shard::edge_fields(resp.headers()));
    let mut resp = finish(resp, out.status);
    // A peer stores what the origin said to edges (TTL, ESI, surrogate keys).
    if let Some(fields) = edge_fields {
        resp.headers_mut().extend(fields);
    }
    let resp = run_policy(ctx.policy.as_mut(), &mut ctx.head, resp, &p.metrics).await;
    ctx.timing.phase("deliver", delivering);
    resp
}

/// The response for a request that failed: its status, decided once
/// ([`ProxyError::status`]), and one diagnostic line at the level of whose
/// fault it is.
pub(super) fn failure(ctx: &mut RequestCtx, e: ProxyError) -> Response<ProxyBody> {
    // A backend fetch that failed because the client's body did is the
    // client's error.
    let e = match ctx.body_fault.as_deref().and_then(OnceLock::get) {
        Some(BodyFault::TooLarge) => ProxyError::RequestTooLarge {
            limit: ctx.body_limit,
        },
        Some(BodyFault::Broken(why)) => ProxyError::BadRequest(format!("request body: {why}")),
        None => e,
    };
    super::log::failure(&e, &ctx.record);
    ctx.record.error = Some(e.to_string());
    ctx.record.cache = CacheStatus::Error;
    let mut resp = finish(e.to_response(), CacheStatus::Error);
    // After a malformed request nothing on the connection can be trusted
    // (Varnish and nginx close too); HTTP/2 has no such field.
    if ctx.http1 && matches!(e, ProxyError::BadRequest(_)) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// What every response gets, answered or failed: the request's id, and
/// `Server-Timing` (the head's entries; an ESI page's includes in a trailer).
pub(super) fn stamp(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    mut resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    if let (Some(name), Some(id)) = (p.request_ids.header(), ctx.request_id.clone()) {
        resp.headers_mut().insert(name.clone(), id);
    }
    let timing = &mut ctx.timing;
    if timing.on {
        timing.head.cache(ctx.record.cache.log_name());
        if let Some(v) = timing.head.header_value() {
            resp.headers_mut().append(server_timing::SERVER_TIMING, v);
        }
        if let Some(includes) = timing.includes.take() {
            resp.headers_mut()
                .insert(header::TRAILER, HeaderValue::from_static("server-timing"));
            resp = resp.map(|b| server_timing::with_trailer(b, includes));
        }
    }
    resp
}

/// A response whose body streams (a pass, a miss, a joined fill, an ESI
/// page) in the representation the client is to get: compressed as it
/// streams when it may be; a joined fill (`stored`) also answers
/// conditional requests, and Range when it goes uncompressed.
fn streaming(
    c: &Compressor,
    head: &RequestHead,
    mut resp: Response<ProxyBody>,
    stored: bool,
) -> Response<ProxyBody> {
    let chosen = c.choose(head, &mut resp);
    if !stored {
        return compress::encoded(head, resp, chosen);
    }
    match chosen {
        Some(chosen) => compress::encoded(head, conditional(head, resp), Some(chosen)),
        // Ranges of a body made as it streams are not answered (RFC 9110
        // lets a server ignore Range): only of the body as it is stored.
        None => conditional_and_range_of_stream(head, resp),
    }
}

/// Answer a client's conditional request (If-None-Match, If-Modified-Since)
/// from the headers alone (for a response whose body is still coming, one
/// joined while another request stores it).
fn conditional(head: &RequestHead, resp: Response<ProxyBody>) -> Response<ProxyBody> {
    if resp.status() != StatusCode::OK || !not_modified(&head.headers, resp.headers()) {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    parts.status = StatusCode::NOT_MODIFIED;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_ENCODING);
    Response::from_parts(parts, body::empty())
}

/// Answer a client's conditional request and single-range request for a
/// response whose body is still coming (joined while another request
/// stores it): the range is cut from the body as it streams, when the
/// length is declared; without one the whole body is sent, which RFC 9110
/// allows.
fn conditional_and_range_of_stream(
    head: &RequestHead,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let resp = conditional(head, resp);
    let Some(len) = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return resp;
    };
    with_range(head, resp, len, slice_of_stream)
}

/// Answer a client's conditional request (If-None-Match, If-Modified-Since)
/// and single-range request from a complete object, `whole` being the
/// representation sent (ranges are of its bytes, coded or not). Multi-range
/// requests get the whole object, which RFC 9110 allows.
fn conditional_and_range(
    head: &RequestHead,
    resp: Response<ProxyBody>,
    whole: Bytes,
) -> Response<ProxyBody> {
    let resp = conditional(head, resp);
    with_range(head, resp, whole.len() as u64, move |_, start, end| {
        body::full(whole.slice(start as usize..=end as usize))
    })
}

/// The 206 or 416 for the request's `Range` over a 200 of `len` bytes, the
/// part cut by `slice(body, first, last)`; the response as it is when there
/// is no single range to answer.
fn with_range(
    head: &RequestHead,
    resp: Response<ProxyBody>,
    len: u64,
    slice: impl FnOnce(ProxyBody, u64, u64) -> ProxyBody,
) -> Response<ProxyBody> {
    if resp.status() != StatusCode::OK || head.method != Method::GET {
        return resp;
    }
    let Some(range) = head
        .headers
        .get(header::RANGE)
        .and_then(|r| r.to_str().ok())
    else {
        return resp;
    };
    // If-Range with a validator that does not match means: send it all.
    // An entity tag matches only strongly (RFC 9110 section 13.1.5): a
    // weak one, as a compressed representation has, never does.
    if let Some(if_range) = head
        .headers
        .get(header::IF_RANGE)
        .and_then(|v| v.to_str().ok())
    {
        let etag = resp
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .filter(|e| !e.starts_with("W/"));
        let lm = resp
            .headers()
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok());
        if Some(if_range) != etag && Some(if_range) != lm {
            return resp;
        }
    }
    let (mut parts, body) = resp.into_parts();
    parts
        .headers
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    match parse_range(range, len) {
        RangeSpec::Whole => Response::from_parts(parts, body),
        RangeSpec::Unsatisfiable => {
            parts.status = StatusCode::RANGE_NOT_SATISFIABLE;
            parts
                .headers
                .insert(header::CONTENT_RANGE, content_range(None, len));
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(0));
            Response::from_parts(parts, body::empty())
        }
        RangeSpec::Part(start, end) => {
            parts.status = StatusCode::PARTIAL_CONTENT;
            parts.headers.insert(
                header::CONTENT_RANGE,
                content_range(Some((start, end)), len),
            );
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(end - start + 1));
            Response::from_parts(parts, slice(body, start, end))
        }
    }
}

/// Bytes `first..=last` of a streaming body: what comes before is read and
/// dropped, the body ends after `last`. A body that ends early is cut
/// (an error), so the client never takes a short part for the whole.
fn slice_of_stream(body: ProxyBody, first: u64, last: u64) -> ProxyBody {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;
    struct Cut {
        body: ProxyBody,
        skip: u64,
        left: u64,
    }
    let start = Cut {
        body,
        skip: first,
        left: last - first + 1,
    };
    let stream = futures_util::stream::unfold(start, |mut c| async move {
        while c.left > 0 {
            let data = match c.body.frame().await {
                None => {
                    c.left = 0;
                    let err: body::BoxError = "the body ended before the requested range".into();
                    return Some((Err(err), c));
                }
                Some(Err(e)) => {
                    c.left = 0;
                    return Some((Err(e), c));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
            let n = data.len() as u64;
            if c.skip >= n {
                c.skip -= n;
                continue;
            }
            let from = c.skip as usize;
            let to = (c.skip + c.left).min(n) as usize;
            c.skip = 0;
            c.left -= (to - from) as u64;
            return Some((Ok(data.slice(from..to)), c));
        }
        None
    });
    body::boxed(http_body_util::StreamBody::new(
        stream.map(|r| r.map(http_body::Frame::data)),
    ))
}

fn content_range(part: Option<(u64, u64)>, len: u64) -> HeaderValue {
    let s = match part {
        Some((a, b)) => format!("bytes {a}-{b}/{len}"),
        None => format!("bytes */{len}"),
    };
    HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("bytes */0"))
}

/// A parsed `Range` header against a body of known length.
#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// Ignore the header: serve the whole body.
    Whole,
    /// 416.
    Unsatisfiable,
    /// 206 with these inclusive offsets.
    Part(u64, u64),
}

fn parse_range(v: &str, len: u64) -> RangeSpec {
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return RangeSpec::Whole;
    };
    if spec.contains(',') {
        return RangeSpec::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeSpec::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.is_empty(), b.is_empty()) {
        (true, true) => return RangeSpec::Whole,
        (true, false) => match b.parse::<u64>() {
            Ok(0) => return RangeSpec::Unsatisfiable,
            Ok(n) if len > 0 => Some((len.saturating_sub(n), len - 1)),
            Ok(_) => return RangeSpec::Unsatisfiable,
            Err(_) => None,
        },
        (false, _) => match (
            a.parse::<u64>(),
            if b.is_empty() {
                Ok(u64::MAX)
            } else {
                b.parse::<u64>()
            },
        ) {
            (Ok(s), Ok(e)) if s <= e => {
                if s >= len {
                    return RangeSpec::Unsatisfiable;
                }
                Some((s, e.min(len - 1)))
            }
            _ => None,
        },
    };
    match parsed {
        Some((s, e)) => RangeSpec::Part(s, e),
        None => RangeSpec::Whole,
    }
}

fn not_modified(req: &HeaderMap, resp: &HeaderMap) -> bool {
    if let Some(inm) = req.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let Some(etag) = resp.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let weak = |t: &str| t.trim().trim_start_matches("W/").to_owned();
        return inm
            .split(',')
            .any(|t| t.trim() == "*" || weak(t) == weak(etag));
    }
    if let Some(ims) = req
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
    {
        // Without Last-Modified, the stored Date stands in (RFC 9111 4.3.2).
        let lm = resp
            .get(header::LAST_MODIFIED)
            .or_else(|| resp.get(header::DATE))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok());
        if let (Ok(ims), Some(lm)) = (httpdate::parse_http_date(ims), lm) {
            return lm <= ims;
        }
    }
    false
}

/// The policy's `on-deliver`: the last edits of status and headers.
async fn run_policy(
    policy: Option<&mut PolicyCall>,
    head: &mut RequestHead,
    mut resp: Response<ProxyBody>,
    metrics: &Metrics,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Some(call) = policy else {
        return Ok(resp);
    };
    let mut rh = ResponseHead {
        status: resp.status(),
        headers: std::mem::take(resp.headers_mut()),
    };
    let length = rh.headers.get(header::CONTENT_LENGTH).cloned();
    let started = metrics.hook_start();
    // Boxed, as every hook call is (`recv::route` says why).
    let result = Box::pin(call.on_deliver(head, &mut rh)).await;
    metrics.hook_done(Hook::OnDeliver, started, &result);
    headers::restore_framing(&mut rh.headers, length);
    *resp.status_mut() = rh.status;
    *resp.headers_mut() = rh.headers;
    result?;
    Ok(resp)
}

/// Final edits for every response: our own fields out, hop-by-hop fields
/// out, `Via` and `Cache-Status` in.
fn finish(mut resp: Response<ProxyBody>, status: CacheStatus) -> Response<ProxyBody> {
    // The backend's HTTP version is not the client's: let the server choose.
    *resp.version_mut() = http::Version::HTTP_11;
    let h = resp.headers_mut();
    headers::strip_hop_by_hop(h);
    // Surrogate-Control and Surrogate-Key speak to the edge only, and
    // Inlay-Cache-Control to us alone (CDN-Cache-Control goes on, for the
    // CDNs in front of us: RFC 9213 makes it end-to-end).
    headers::remove_each(h, &EDGE_ONLY);
    headers::add_via(h);
    h.insert(inlay_core::CACHE_STATUS, status.field());
    resp
}

/// Response fields for the edge alone, never sent to clients.
static EDGE_ONLY: [HeaderName; 3] = [
    HeaderName::from_static("surrogate-control"),
    HeaderName::from_static("surrogate-key"),
    HeaderName::from_static("inlay-cache-control"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeSpec::Part(0, 9));
        assert_eq!(parse_range("bytes=90-", 100), RangeSpec::Part(90, 99));
        assert_eq!(parse_range("bytes=-10", 100), RangeSpec::Part(90, 99));
        assert_eq!(parse_range("bytes=50-500", 100), RangeSpec::Part(50, 99));
        assert_eq!(parse_range("bytes=100-", 100), RangeSpec::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeSpec::Whole);
        assert_eq!(parse_range("items=0-1", 100), RangeSpec::Whole);
        assert_eq!(parse_range("bytes=9-1", 100), RangeSpec::Whole);
    }

    #[test]
    fn validators() {
        let mut resp = HeaderMap::new();
        resp.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        resp.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        let mut req = HeaderMap::new();
        req.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"v0\", W/\"v1\""),
        );
        assert!(not_modified(&req, &resp));
        req.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"v2\""));
        assert!(!not_modified(&req, &resp));
        let mut req = HeaderMap::new();
        req.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert!(not_modified(&req, &resp));
        // No Last-Modified: the stored response's Date stands in.
        let mut resp = HeaderMap::new();
        resp.insert(
            header::DATE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert!(not_modified(&req, &resp));
        req.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Sat, 05 Nov 1994 08:49:37 GMT"),
        );
        assert!(!not_modified(&req, &resp));
        assert!(!not_modified(&req, &HeaderMap::new()));
    }
}
