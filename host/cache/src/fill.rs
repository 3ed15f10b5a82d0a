//! Filling the cache: a response is stored while it streams to the client.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, Response, header};
use http_body_util::{BodyExt, StreamBody};
use inlay_core::CacheSettings;
use inlay_core::body::{self, BoxError, ProxyBody};
use tracing::{debug, warn};

use crate::HttpCache;
use crate::flight::Flight;
use crate::key::PrimaryKey;
use crate::object::object_meta;

/// The longest an uncacheable key stays hit-for-miss.
const MAX_HIT_FOR_MISS: Duration = Duration::from_secs(120);

/// Where a fetched response is stored.
pub(crate) struct FillTarget {
    pub(crate) cache: HttpCache,
    pub(crate) primary: PrimaryKey,
    /// The request's headers (they select the Vary variant).
    pub(crate) req_headers: HeaderMap,
    /// The fetch slot other requests wait on; released after storing.
    pub(crate) flight: Option<Flight>,
}

/// Stores `resp` if `settings` allow while streaming it back; returns the
/// response to send and whether it is being stored. An uncacheable
/// response marks its key hit-for-miss instead.
///
/// The body is read by a task of its own, so the object is completed and
/// stored even if the client goes away (as Varnish does); the client reads
/// through a small bounded channel, so a slow client slows the fetch
/// instead of growing memory.
pub(crate) fn fill(
    resp: Response<ProxyBody>,
    settings: &CacheSettings,
    target: FillTarget,
) -> (Response<ProxyBody>, bool) {
    let max_object_size = target.cache.max_object_size();
    if !settings.cacheable {
        // Later requests go straight to the backend instead of queueing.
        let hfm = if settings.ttl.is_zero() {
            MAX_HIT_FOR_MISS
        } else {
            settings.ttl.min(MAX_HIT_FOR_MISS)
        };
        target.cache.mark_hit_for_miss(&target.primary, hfm);
        return (resp, false);
    }
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_object_size) {
        debug!(
            len = declared,
            "response larger than max_object_size: streamed, not stored"
        );
        return (resp, false);
    }
    let meta = object_meta(resp.status().as_u16(), resp.headers(), settings);
    let (parts, mut body) = resp.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, BoxError>>(8);
    tokio::spawn(async move {
        let FillTarget {
            cache,
            primary,
            req_headers,
            flight,
        } = target;
        let capacity = declared.unwrap_or(16 << 10).min(max_object_size);
        let mut buf = BytesMut::with_capacity(usize::try_from(capacity).unwrap_or(16 << 10));
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
        match cache
            .insert(&primary, &req_headers, meta, buf.freeze())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_full() => {
                warn!(
                    key = primary.as_str(),
                    "cache disk is full: response served uncached"
                )
            }
            Err(e) => {
                warn!(key = primary.as_str(), error = %e, "cache write failed: response served uncached")
            }
        }
        // Waiters look the key up again once the object is in the store.
        drop(flight);
    });
    let stream = receiver_stream(rx).map(|r| r.map(http_body::Frame::data));
    (
        Response::from_parts(parts, body::boxed(StreamBody::new(stream))),
        true,
    )
}

fn receiver_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
