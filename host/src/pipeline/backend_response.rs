//! backend response: decide how a backend response is cached (RFC 9111 and
//! Surrogate-Control defaults, then the policy), and store it while it
//! streams to the client.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, Response, header};
use http_body_util::{BodyExt, StreamBody};
use inlay_storage::ObjectMeta;
use tracing::{debug, warn};

use crate::body::{self, BoxError, ProxyBody};
use crate::cache::rules::{self, CacheSettings, Defaults};
use crate::cache::{ESI_MARK, Flight, HttpCache, PrimaryKey, vary_names};
use crate::error::ProxyError;
use crate::headers;
use crate::runtime::{PolicyCall, RequestHead, ResponseHead};

/// The host's default cache settings for a response.
pub fn default_settings(resp: &Response<ProxyBody>, defaults: &Defaults) -> CacheSettings {
    rules::decide(resp.status(), resp.headers(), defaults, SystemTime::now())
}

/// The policy's `on-backend-response`: it may edit the response's status and
/// headers and change how it is cached, starting from `defaults`.
pub async fn run_policy(
    policy: Option<&mut PolicyCall>,
    head: &mut RequestHead,
    resp: &mut Response<ProxyBody>,
    defaults: CacheSettings,
) -> Result<CacheSettings, ProxyError> {
    let Some(call) = policy else {
        return Ok(defaults);
    };
    let mut rh = ResponseHead {
        status: resp.status(),
        headers: std::mem::take(resp.headers_mut()),
    };
    let result = call.on_backend_response(head, &mut rh, defaults).await;
    *resp.status_mut() = rh.status;
    *resp.headers_mut() = rh.headers;
    Ok(result?)
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
pub fn object_meta(status: u16, h: &HeaderMap, s: &CacheSettings) -> ObjectMeta {
    let text =
        |name: header::HeaderName| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    ObjectMeta {
        status,
        headers: storable_headers(h, s.esi),
        stored_at_ms: inlay_storage::now_ms(),
        ttl_ms: s.ttl.as_millis() as u64,
        grace_ms: s.grace.as_millis() as u64,
        keep_ms: s.keep.as_millis() as u64,
        surrogate_keys: s.surrogate_keys.clone(),
        vary: vary_names(h),
        etag: text(header::ETAG),
        last_modified: text(header::LAST_MODIFIED),
        body_len: 0,
        checksum: 0,
    }
}

/// Where a fetched response goes.
pub struct StoreTarget {
    /// The cache.
    pub cache: HttpCache,
    /// The key.
    pub primary: PrimaryKey,
    /// The request's headers (they select the Vary variant).
    pub req_headers: HeaderMap,
    /// Bodies larger than this stream through without being stored.
    pub max_object_size: u64,
    /// The fetch slot other requests wait on; released after storing.
    pub flight: Option<Flight>,
}

/// Store `resp` if `settings` allow while streaming it back. The body is
/// read by a task of its own, so the object is completed and stored even if
/// the client goes away (as Varnish does); the client reads through a small
/// bounded channel, so a slow client slows the fetch instead of growing memory.
pub fn store_while_streaming(
    resp: Response<ProxyBody>,
    settings: &CacheSettings,
    target: StoreTarget,
) -> Response<ProxyBody> {
    if !settings.cacheable {
        // Later requests go straight to the backend instead of queueing.
        let hfm = if settings.ttl.is_zero() {
            Duration::from_secs(120)
        } else {
            settings.ttl
        };
        target
            .cache
            .mark_hit_for_miss(&target.primary, hfm.min(Duration::from_secs(120)));
        return resp;
    }
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > target.max_object_size) {
        debug!(
            len = declared,
            "response larger than max_object_size: streamed, not stored"
        );
        return resp;
    }
    let meta = object_meta(resp.status().as_u16(), resp.headers(), settings);
    let (parts, mut body) = resp.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, BoxError>>(8);
    tokio::spawn(async move {
        let StoreTarget {
            cache,
            primary,
            req_headers,
            max_object_size,
            flight,
        } = target;
        let mut buf =
            BytesMut::with_capacity(declared.unwrap_or(16 << 10).min(max_object_size) as usize);
        let mut storing = true;
        let mut client = Some(tx);
        loop {
            match body.frame().await {
                None => break,
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if storing {
                        if (buf.len() + data.len()) as u64 > max_object_size {
                            storing = false;
                            buf = BytesMut::new();
                        } else {
                            buf.extend_from_slice(&data);
                        }
                    }
                    if let Some(tx) = &client
                        && tx.send(Ok(data)).await.is_err()
                    {
                        client = None;
                    }
                    if !storing && client.is_none() {
                        return;
                    }
                }
                Some(Err(e)) => {
                    warn!(key = primary.as_str(), error = %e, "backend body failed; object not stored");
                    if let Some(tx) = &client {
                        let _ = tx.send(Err(e)).await;
                    }
                    return;
                }
            }
        }
        drop(client);
        if !storing {
            return;
        }
        let body = buf.freeze();
        let res = tokio::task::spawn_blocking(move || {
            let r = cache.insert(&primary, &req_headers, meta, body);
            (r, primary)
        })
        .await;
        match res {
            Ok((Err(e), primary)) if e.is_full() => {
                warn!(
                    key = primary.as_str(),
                    "cache disk is full: response served uncached"
                )
            }
            Ok((Err(e), primary)) => {
                warn!(key = primary.as_str(), error = %e, "cache write failed: response served uncached")
            }
            Ok((Ok(()), _)) => {}
            Err(e) => warn!(error = %e, "cache write task failed"),
        }
        // Waiters look the key up again once the object is in the store.
        drop(flight);
    });
    let stream = tokio_stream_from(rx).map(|r| r.map(http_body::Frame::data));
    Response::from_parts(parts, body::boxed(StreamBody::new(stream)))
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
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
    meta.stored_at_ms = inlay_storage::now_ms();
    meta.ttl_ms = s.ttl.as_millis() as u64;
    meta.grace_ms = s.grace.as_millis() as u64;
    meta.keep_ms = s.keep.as_millis() as u64;
    if let Some(e) = not_modified.get(header::ETAG).and_then(|v| v.to_str().ok()) {
        meta.etag = Some(e.to_owned());
    }
    meta
}
