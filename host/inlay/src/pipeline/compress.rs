//! The representation a client is sent (part of deliver): the coding the
//! one negotiation (`ContentCodings::negotiate_among`, `cache.accept_encoding`)
//! picks among those a stored object holds, served as stored (a hit costs
//! no compression); or, for a response that streams (pass, a miss, an ESI
//! page), a coding made as it streams, with a flush per chunk so that
//! nothing waits for the rest. A compressed representation gets a weak
//! `ETag` (RFC 9110 section 8.8.3: a strong one would have to differ per
//! coding), and every representation of a compressible response
//! `Vary: Accept-Encoding`.
//!
//! At most `compression.max_streams` responses are compressed as they
//! stream at once (each encoder holds up to about a MiB); past it a
//! response goes uncompressed, which is always correct.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method, Response, header};
use http_body_util::{BodyExt, StreamBody};
use inlay_cache::coding::{self, Coding, CompressionRules, IDENTITY, no_transform};
use inlay_cache::{CacheRules, ContentCodings};
use inlay_core::RequestHead;
use inlay_core::body::{self, ProxyBody};
use inlay_storage::StoredObject;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What one generation compresses, and how many streams it may compress
/// at once.
pub struct Compressor {
    rules: Option<CompressionRules>,
    accept_encoding: ContentCodings,
    /// The codings Inlay makes, in `cache.accept_encoding`'s order.
    made: Vec<Coding>,
    streams: Arc<Semaphore>,
}

/// A coding chosen for a streaming body, with its slot.
pub(super) struct StreamCoding {
    coding: Coding,
    level: i32,
    _slot: OwnedSemaphorePermit,
}

impl Compressor {
    /// From the cache's rules (`[compression]` and `cache.accept_encoding`)
    /// and `compression.max_streams`.
    pub fn new(rules: &CacheRules, max_streams: usize) -> Self {
        Self {
            rules: rules.compression.clone(),
            made: coding::made_codings(&rules.accept_encoding),
            accept_encoding: rules.accept_encoding.clone(),
            streams: Arc::new(Semaphore::new(max_streams)),
        }
    }

    /// The response for a hit on `obj` (its headers and identity body in
    /// `resp`) in the coding the request negotiates among those stored,
    /// and that representation's bytes (for Range).
    pub(super) fn stored(
        &self,
        head: &RequestHead,
        mut resp: Response<ProxyBody>,
        obj: &StoredObject,
    ) -> (Response<ProxyBody>, Bytes) {
        // Off (a reload may turn it off over stored codings), or the
        // client asked for the content as it is.
        if obj.meta.codings.is_empty() || self.rules.is_none() || no_transform(&head.headers) {
            return (resp, coding::identity_body(obj));
        }
        let chosen = self
            .accept_encoding
            .negotiate_among(&head.headers, |c| obj.meta.coding_range(c).is_some());
        let (name, bytes) = match obj.coding(chosen) {
            Some(b) if chosen != IDENTITY => (Some(chosen), b),
            _ => (None, coding::identity_body(obj)),
        };
        let h = resp.headers_mut();
        mark(h, name);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        *resp.body_mut() = body::full(bytes.clone());
        (resp, bytes)
    }

    /// The coding a response that streams is to be sent in, its headers
    /// set for it (`Content-Encoding`, `Vary`, a weak `ETag`, no length);
    /// `None` when it is sent as it is (not compressible, the client takes
    /// none of the codings, or every stream slot is taken: then only
    /// `Vary`). Apply it with [`encoded`] once the status is final.
    pub(super) fn choose(
        &self,
        head: &RequestHead,
        resp: &mut Response<ProxyBody>,
    ) -> Option<StreamCoding> {
        let rules = self.rules.as_ref()?;
        if !rules.applies(resp.status(), resp.headers()) || no_transform(&head.headers) {
            return None;
        }
        let chosen = self
            .accept_encoding
            .negotiate_among(&head.headers, |c| self.made.iter().any(|m| m.name() == c));
        let coding = Coding::from_name(chosen);
        // The slot is not taken for a HEAD: no body is encoded.
        let slot = match (coding, head.method == Method::HEAD) {
            (None, _) => None,
            (Some(_), true) => Arc::clone(&self.streams).try_acquire_many_owned(0).ok(),
            (Some(_), false) => Arc::clone(&self.streams).try_acquire_owned().ok(),
        };
        let (Some(coding), Some(slot)) = (coding, slot) else {
            mark(resp.headers_mut(), None);
            return None;
        };
        let h = resp.headers_mut();
        mark(h, Some(coding.name()));
        h.remove(header::CONTENT_LENGTH);
        // Ranges of a body made as it streams are not offered.
        h.remove(header::ACCEPT_RANGES);
        Some(StreamCoding {
            coding,
            level: rules.stream_levels.of(coding),
            _slot: slot,
        })
    }
}

/// `resp` with its body encoded as `chosen` says (after [`Compressor::choose`]);
/// a response with no body to send (a 304, a HEAD) is left as it is.
pub(super) fn encoded(
    head: &RequestHead,
    resp: Response<ProxyBody>,
    chosen: Option<StreamCoding>,
) -> Response<ProxyBody> {
    let Some(chosen) = chosen else {
        return resp;
    };
    if head.method == Method::HEAD || resp.status() == http::StatusCode::NOT_MODIFIED {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let StreamCoding {
        coding,
        level,
        _slot: slot,
    } = chosen;
    let input = body.into_data_stream().boxed();
    let out = coding::encode_stream(input, coding, level).map(move |r| {
        // The slot is held while the body streams.
        let _held = &slot;
        r.map(http_body::Frame::data)
    });
    Response::from_parts(parts, body::boxed(StreamBody::new(out)))
}

/// The headers of a representation of a compressible response in coding
/// `name` (`None`: identity): `Content-Encoding`, `Vary: Accept-Encoding`,
/// and the `ETag` made weak when it is coded.
fn mark(h: &mut HeaderMap, name: Option<&str>) {
    let varies = h
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|n| n.trim().eq_ignore_ascii_case("accept-encoding") || n.trim() == "*");
    if !varies {
        h.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    let Some(name) = name else {
        return;
    };
    if let Ok(v) = HeaderValue::from_str(name) {
        h.insert(header::CONTENT_ENCODING, v);
    }
    let weak = h
        .get(header::ETAG)
        .and_then(|e| e.to_str().ok())
        .filter(|e| !e.starts_with("W/"))
        .and_then(|e| HeaderValue::from_str(&format!("W/{e}")).ok());
    if let Some(weak) = weak {
        h.insert(header::ETAG, weak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coded_representation_varies_and_has_a_weak_etag() {
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        h.insert(header::VARY, HeaderValue::from_static("Cookie"));
        mark(&mut h, Some("br"));
        assert_eq!(h.get(header::ETAG).unwrap(), "W/\"v1\"");
        assert_eq!(h.get(header::CONTENT_ENCODING).unwrap(), "br");
        let vary: Vec<_> = h.get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["Cookie", "Accept-Encoding"]);
        // Marking twice changes nothing more.
        mark(&mut h, Some("br"));
        assert_eq!(h.get(header::ETAG).unwrap(), "W/\"v1\"");
        assert_eq!(h.get_all(header::VARY).iter().count(), 2);
        // Identity keeps its strong validator, and varies too.
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        mark(&mut h, None);
        assert_eq!(h.get(header::ETAG).unwrap(), "\"v1\"");
        assert_eq!(h.get(header::VARY).unwrap(), "Accept-Encoding");
        assert!(!h.contains_key(header::CONTENT_ENCODING));
    }
}
