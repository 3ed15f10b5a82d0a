//! What a stored object is made of and made into: the metadata a response
//! is stored with, the header map it is delivered with, the validators that
//! revalidate it, and its metadata refreshed by a 304.

use http::{HeaderMap, header};
use inlay_core::{CacheSettings, headers};
use inlay_storage::{ObjectMeta, StoredObject};

use crate::key::vary_names;
use crate::rules;

/// Stored pseudo-header marking an object whose body is an ESI template.
pub const ESI_MARK: &str = "inlay-internal-esi";

/// The stored header fields of an object as a header map, and whether the
/// object is an ESI template (the internal mark is not returned).
pub fn stored_headers(meta: &ObjectMeta) -> (HeaderMap, bool) {
    // Room for what delivery adds (length, age, via, cache status, a
    // policy's headers) without growing the map on every hit.
    let mut headers = HeaderMap::with_capacity(meta.headers.len() + 8);
    let mut esi = false;
    for (name, value) in &meta.headers {
        if name == ESI_MARK {
            esi = true;
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    (headers, esi)
}

/// Response fields never stored: hop-by-hop ones and what is computed on delivery.
fn storable_headers(h: &HeaderMap, esi: bool) -> Vec<(String, Vec<u8>)> {
    let mut copy = h.clone();
    headers::strip_hop_by_hop(&mut copy);
    copy.remove(header::AGE);
    let mut out: Vec<(String, Vec<u8>)> = copy
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    if esi {
        out.push((ESI_MARK.to_owned(), b"1".to_vec()));
    }
    out
}

/// The metadata an object is stored with.
///
/// The `Age` the response arrived with counts (RFC 9111 section 4.2.3): the
/// object is dated back by it, so the `Age` delivered on hits starts there
/// and grows; `s.ttl` stays the freshness left from now.
pub fn object_meta(status: u16, h: &HeaderMap, s: &CacheSettings) -> ObjectMeta {
    let text =
        |name: header::HeaderName| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let now = inlay_storage::now_ms();
    let age_ms = (rules::age(h) * 1000).min(now);
    ObjectMeta {
        status,
        headers: storable_headers(h, s.esi),
        stored_at_ms: now - age_ms,
        ttl_ms: (s.ttl.as_millis() as u64).saturating_add(age_ms),
        grace_ms: s.grace.as_millis() as u64,
        keep_ms: s.keep.as_millis() as u64,
        surrogate_keys: s.surrogate_keys.clone(),
        vary: vary_names(h),
        etag: text(header::ETAG),
        last_modified: text(header::LAST_MODIFIED),
        body_len: 0,
        checksum: 0,
        created_ms: now,
        full_key: None,
        codings: Vec::new(),
    }
}

/// Apply a 304's headers to the stored metadata (RFC 9111 section 4.3.4) and
/// restart its freshness.
pub fn refreshed_meta(old: &ObjectMeta, not_modified: &HeaderMap, s: &CacheSettings) -> ObjectMeta {
    let mut meta = old.clone();
    for name in not_modified.keys() {
        if matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        meta.headers.retain(|(k, _)| k != name.as_str());
    }
    for (name, value) in not_modified {
        if matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        meta.headers
            .push((name.as_str().to_owned(), value.as_bytes().to_vec()));
    }
    let now = inlay_storage::now_ms();
    let age_ms = (rules::age(not_modified) * 1000).min(now);
    meta.stored_at_ms = now - age_ms;
    meta.ttl_ms = (s.ttl.as_millis() as u64).saturating_add(age_ms);
    meta.grace_ms = s.grace.as_millis() as u64;
    meta.keep_ms = s.keep.as_millis() as u64;
    if let Some(e) = not_modified.get(header::ETAG).and_then(|v| v.to_str().ok()) {
        meta.etag = Some(e.to_owned());
    }
    meta
}

/// Conditional request headers that revalidate `obj` with its origin.
pub fn validators(obj: &StoredObject) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(v) = obj.meta.etag.as_deref().and_then(|e| e.parse().ok()) {
        h.insert(header::IF_NONE_MATCH, v);
    }
    if let Some(v) = obj
        .meta
        .last_modified
        .as_deref()
        .and_then(|e| e.parse().ok())
    {
        h.insert(header::IF_MODIFIED_SINCE, v);
    }
    h
}
