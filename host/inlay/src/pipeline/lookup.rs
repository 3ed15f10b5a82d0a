//! hash / lookup: the cache key, and what the cache holds for it. Fresh hits
//! go to deliver; stale hits within grace are delivered while one background
//! fetch refreshes them; misses join a single in-flight fetch per key, and
//! the request that holds it fetches for the cache; the others stream its
//! response from the object being filled (see `inlay_cache::lookup`
//! for the states).
//!
//! [`ThroughCache`] is the cache in front of the upstreams, as the lookup
//! phase and ESI includes both use it: all an include needs of a
//! generation, and nothing else.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use inlay_cache::stored_headers;
use inlay_cache::{CacheFetch, Fetched, HttpCache, Lookup, PrimaryKey, fresh_status, stale_status};
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError, RequestHead, StaleReason};
use inlay_runtime::PolicyCall;
use inlay_storage::StoredObject;
use tracing::{debug, warn};

use super::fetch::Upstreams;
use super::{Outcome, Pipeline, RequestCtx, backend_response};
use crate::metrics::Metrics;

/// lookup: the request through the cache (the client's body is not sent).
pub(super) async fn run(p: &Pipeline, ctx: &mut RequestCtx) -> Result<Outcome, ProxyError> {
    ctx.body = None;
    let routed = ctx.timing.now();
    let out = p.through.serve(&mut ctx.head, ctx.policy.as_mut()).await?;
    ctx.timing.phase("lookup", routed);
    if let (true, Some(took)) = (ctx.timing.on, out.fetched) {
        ctx.timing.head.phase("fetch", took);
    }
    Ok(out)
}

/// The cache in front of one generation's upstreams.
#[derive(Clone)]
pub struct ThroughCache {
    cache: HttpCache,
    upstreams: Upstreams,
    metrics: Arc<Metrics>,
}

impl ThroughCache {
    /// `cache` in front of `upstreams`, counting in `metrics`.
    pub fn new(cache: HttpCache, upstreams: Upstreams, metrics: Arc<Metrics>) -> Self {
        Self {
            cache,
            upstreams,
            metrics,
        }
    }

    /// The upstreams misses go to.
    pub fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }

    /// The counters includes are counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A fresh object for `head` already in memory, without waiting.
    pub fn get_fresh(&self, head: &RequestHead) -> Option<StoredObject> {
        self.cache.get_fresh(&PrimaryKey::of(head), &head.headers)
    }

    /// Looks `head` up and, when the cache has nothing to serve, fetches
    /// it for the cache; `policy` (none for an ESI include) decides how a
    /// new response is cached.
    pub async fn serve(
        &self,
        head: &mut RequestHead,
        mut policy: Option<&mut PolicyCall>,
    ) -> Result<Outcome, ProxyError> {
        let primary = PrimaryKey::of(head);
        let now = inlay_storage::now_ms();
        // A hit in memory is ready at once and keeps the policy's instance
        // to on-deliver; a lookup that waits (the disk, another request's
        // fill) gives it back first.
        let found = {
            let mut lookup = std::pin::pin!(self.cache.lookup(&primary, &head.headers));
            match std::future::poll_fn(|cx| Poll::Ready(lookup.as_mut().poll(cx))).await {
                Poll::Ready(found) => found,
                Poll::Pending => {
                    release(policy.as_deref_mut());
                    lookup.await
                }
            }
        };
        match found {
            Lookup::Fresh(object) => {
                let status = fresh_status(&object, now);
                Ok(hit(object, status))
            }
            Lookup::Stale { object, refresh } => {
                if let Some(fetch) = refresh {
                    self.refresh_in_background(head, fetch);
                }
                let status = stale_status(&object, now, StaleReason::Grace);
                Ok(hit(object, status))
            }
            Lookup::Joined(joined) => {
                let status = joined.status(now);
                let esi = joined.esi();
                let age = joined.age_secs(now);
                let mut resp = joined.into_response();
                // A hit carries its Age, as one from a stored object does.
                resp.headers_mut()
                    .insert(header::AGE, HeaderValue::from(age));
                let mut out = Outcome::new(resp, status).with_esi(esi);
                out.joined = true;
                Ok(out)
            }
            Lookup::Fetch(fetch) => {
                release(policy.as_deref_mut());
                self.fetch_for_cache(head, fetch, policy).await
            }
        }
    }

    /// Fetches from the backend for the cache (conditionally when an
    /// expired object has validators); the policy decides how the new
    /// response is cached, and it is stored while it streams.
    async fn fetch_for_cache(
        &self,
        head: &mut RequestHead,
        fetch: CacheFetch,
        policy: Option<&mut PolicyCall>,
    ) -> Result<Outcome, ProxyError> {
        let upstream = self.upstreams.for_cache(head, fetch.primary())?;
        let sent = std::time::Instant::now();
        let fetched = upstream.fetch(head, fetch.validators()).await;
        let took = sent.elapsed();
        match fetch.on_response(fetched).await? {
            Fetched::Cached { object, status } => Ok(hit(object, status).with_fetch_time(took)),
            Fetched::New(mut new) => {
                let defaults = new.defaults().clone();
                let settings = backend_response::run_policy(
                    policy,
                    head,
                    new.response_mut(),
                    defaults,
                    &self.metrics,
                )
                .await?;
                let (resp, status) = new.store(&settings);
                Ok(Outcome::new(resp, status)
                    .with_esi(settings.esi)
                    .with_fetch_time(took))
            }
        }
    }

    /// Refreshes a stale object while it is served: the same fetch for the
    /// cache as a miss, with the host's default settings (no policy: the
    /// request it would run for is already answered).
    fn refresh_in_background(&self, head: &RequestHead, fetch: CacheFetch) {
        let Ok(upstream) = self.upstreams.for_cache(head, fetch.primary()) else {
            return;
        };
        // A sick backend is not asked: the stale object is served in its
        // grace (dropping the fetch lets a later request try again).
        if !upstream.is_healthy() {
            return;
        }
        let head = head.clone();
        let cache = self.cache.clone();
        tokio::spawn(async move {
            debug!(key = fetch.primary().as_str(), "background refresh");
            let fetched = upstream.fetch(&head, fetch.validators()).await;
            match fetch.on_response(fetched).await {
                Ok(Fetched::New(new)) => {
                    let settings = new.defaults().clone();
                    let (resp, _) = new.store(&settings);
                    // Nobody reads this body: drain it so the store completes,
                    // frame by frame, and no further than an object can be.
                    drain(resp.into_body(), cache.rules().max_object_size).await;
                }
                // Revalidated, or the backend failed and the stale object stays.
                Ok(Fetched::Cached { .. }) => {}
                Err(e) => warn!(error = %e, "background refresh failed; the stale object stays"),
            }
        });
    }
}

fn release(policy: Option<&mut PolicyCall>) {
    if let Some(call) = policy {
        call.release();
    }
}

/// The outcome of a hit: the response made from the stored object.
fn hit(object: StoredObject, status: CacheStatus) -> Outcome {
    let (resp, esi) = from_object(&object, inlay_storage::now_ms());
    let mut out = Outcome::new(resp, status).with_esi(esi);
    out.object = Some(object);
    out
}

/// The response for a cached object (its identity body), and whether its
/// body is an ESI template.
fn from_object(obj: &StoredObject, now_ms: u64) -> (Response<ProxyBody>, bool) {
    // Identity: deliver picks the coding the client is sent.
    let identity = inlay_cache::coding::identity_body(obj);
    let len = identity.len();
    let mut resp = Response::new(body::full(identity));
    *resp.status_mut() = StatusCode::from_u16(obj.meta.status).unwrap_or(StatusCode::OK);
    let (stored, esi) = stored_headers(&obj.meta);
    *resp.headers_mut() = stored;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        header::AGE,
        HeaderValue::from(obj.meta.age_ms(now_ms) / 1000),
    );
    (resp, esi)
}

/// Reads `body` to its end without keeping it, stopping (and dropping the
/// rest, which aborts the fetch) once more than `limit` bytes have come:
/// past `limit` the cache stores nothing anyway. Returns the bytes read.
async fn drain(mut body: ProxyBody, limit: u64) -> u64 {
    let mut read = 0u64;
    while read <= limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read = read.saturating_add(data.len() as u64);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use bytes::Bytes;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use inlay_core::body::BoxError;

    use super::*;

    #[tokio::test]
    async fn a_background_refresh_reads_no_further_than_an_object_can_be() {
        // An endless body, counting what is pulled from it.
        let pulled = Arc::new(AtomicU64::new(0));
        let counter = pulled.clone();
        let frames = stream::repeat_with(move || {
            counter.fetch_add(64 << 10, Ordering::Relaxed);
            Ok::<_, BoxError>(Frame::data(Bytes::from(vec![0u8; 64 << 10])))
        });
        let endless = body::boxed(StreamBody::new(frames));
        let read = drain(endless, 1 << 20).await;
        assert!(read > 1 << 20);
        assert!(pulled.load(Ordering::Relaxed) <= (1 << 20) + (64 << 10));
        // A body within the limit is read to its end.
        assert_eq!(drain(body::full(vec![1u8; 1000]), 1 << 20).await, 1000);
    }
}
