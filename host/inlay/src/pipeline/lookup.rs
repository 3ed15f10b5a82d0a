//! hash / lookup: the cache key, and what the cache holds for it. Fresh hits
//! go to deliver; stale hits within grace are delivered while one background
//! fetch refreshes them; misses join a single in-flight fetch per key, and
//! the request that holds it fetches for the cache; the others stream its
//! response from the object being filled (see `inlay_cache::lookup`
//! for the states).

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use http::Method;
use http_body_util::BodyExt;
use inlay_cache::{CacheFetch, Fetched, HttpCache, Lookup, PrimaryKey, fresh_status, stale_status};
use inlay_cluster::shard::{Peer, Shard};
use inlay_core::body::ProxyBody;
use inlay_core::{CacheStatus, ProxyError, RequestHead, StaleReason, body};
use inlay_runtime::PolicyCall;
use inlay_storage::StoredObject;
use tracing::{debug, warn};

use super::fetch::{self, ForCache};
use super::{Outcome, Pipeline, backend_response, deliver};
use crate::backend::Picked;
use crate::backend::director::key_hash;
use crate::body::TimeoutBody;
use crate::config::Config;

impl Pipeline {
    /// Looks the request up and, when the cache has nothing to serve,
    /// fetches it for the cache.
    pub(super) async fn lookup_and_fetch(
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
                    super::release_while_waiting(policy.as_deref_mut());
                    lookup.await
                }
            }
        };
        match found {
            Lookup::Fresh(object) => {
                let status = fresh_status(&object, now);
                Ok(self.hit(object, status))
            }
            Lookup::Stale { object, refresh } => {
                if let Some(fetch) = refresh {
                    self.refresh_in_background(head, fetch);
                }
                let status = stale_status(&object, now, StaleReason::Grace);
                Ok(self.hit(object, status))
            }
            Lookup::Joined(joined) => {
                let status = joined.status(now);
                let esi = joined.esi();
                let age = joined.age_secs(now);
                let mut resp = joined.into_response();
                // A hit carries its Age, as one from a stored object does.
                resp.headers_mut()
                    .insert(http::header::AGE, http::HeaderValue::from(age));
                // A client that has it gets a 304 now, one that asks for a
                // range gets it as the body comes; an ESI template's
                // validators and bytes are not the assembled page's.
                if !esi {
                    resp = deliver::conditional_and_range_of_stream(head, resp);
                }
                Ok(Outcome::new(resp, status).with_esi(esi))
            }
            Lookup::Fetch(fetch) => {
                super::release_while_waiting(policy.as_deref_mut());
                self.fetch_for_cache(head, fetch, policy).await
            }
        }
    }

    /// An ESI include: through the cache, without the client's conditional
    /// or Range fields (they are not forwarded to includes), and without
    /// the policy.
    pub async fn fetch_for_include(&self, head: &RequestHead) -> Result<Outcome, ProxyError> {
        let mut head = head.clone();
        self.lookup_and_fetch(&mut head, None).await
    }

    fn hit(&self, object: StoredObject, status: CacheStatus) -> Outcome {
        let (resp, esi) = deliver::from_object(&object, inlay_storage::now_ms());
        Outcome {
            resp,
            status,
            object: Some(object),
            esi,
            fetched: None,
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
        let backend = self.backend(head, || key_hash(fetch.primary().as_str()))?;
        let fill = for_cache(&self.cache, &self.config, fetch.validators());
        let sent = std::time::Instant::now();
        let owner = self.owner_of(head, fetch.primary());
        let fetched = send_for_cache(owner, &backend, head, fill).await;
        let took = sent.elapsed();
        match fetch.on_response(fetched).await? {
            Fetched::Cached { object, status } => {
                Ok(self.hit(object, status).with_fetch_time(took))
            }
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
        let Some(backend) = self
            .backends
            .pick(&head.backend, || key_hash(fetch.primary().as_str()))
        else {
            return;
        };
        // A sick backend is not asked: the stale object is served in its
        // grace (dropping the fetch lets a later request try again).
        if !backend.backend().is_healthy() {
            return;
        }
        let head = head.clone();
        let config = self.config.clone();
        let cache = self.cache.clone();
        let owner = self.owner_of(&head, fetch.primary());
        tokio::spawn(async move {
            debug!(key = fetch.primary().as_str(), "background refresh");
            let fill = for_cache(&cache, &config, fetch.validators());
            let fetched = send_for_cache(owner, &backend, &head, fill).await;
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

/// A key's owner among the cluster's nodes, and the shard that chose it.
type Owner = (Arc<Shard>, Arc<Peer>);

/// A GET for the cache (a miss or a background refresh): to the key's
/// `owner` when another node owns it (it fetches from the origin, once for
/// the cluster, and `backend` is the fallback), else to `backend`.
async fn send_for_cache(
    owner: Option<Owner>,
    backend: &Picked,
    head: &RequestHead,
    fill: ForCache<'_>,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    match owner {
        Some((shard, owner)) => {
            let (parts, _) =
                fetch::request(head, Method::GET, body::empty(), Some(fill)).into_parts();
            let timeouts = backend.backend().config();
            match shard
                .fetch(&owner, &parts, timeouts.first_byte_timeout)
                .await
            {
                Ok(resp) => Ok(resp.map(|incoming| {
                    let name = format!("cluster node {}", owner.name());
                    body::boxed(TimeoutBody::new(
                        incoming,
                        timeouts.between_bytes_timeout,
                        name,
                        (),
                    ))
                })),
                // Unreachable: the backend, as if no node owned the key.
                Err(_) => {
                    backend
                        .send(http::Request::from_parts(parts, body::empty()))
                        .await
                }
            }
        }
        None => fetch::send(backend, head, Method::GET, body::empty(), Some(fill)).await,
    }
}

impl Pipeline {
    /// With `[cluster] shard = true`, the owner of `key` when it is another
    /// node and `head` is not already a peer's fetch (the owner fetches from
    /// the origin itself).
    fn owner_of(&self, head: &RequestHead, key: &PrimaryKey) -> Option<Owner> {
        let shard = self.shard.as_ref()?;
        if head.headers.contains_key(inlay_cluster::shard::HOP) {
            return None;
        }
        Some((shard.clone(), shard.owner(key.as_str())?))
    }
}

/// What a fetch for the cache (a miss or a background refresh) changes in
/// the client's request.
fn for_cache<'a>(
    cache: &'a HttpCache,
    config: &'a Config,
    validators: http::HeaderMap,
) -> ForCache<'a> {
    ForCache {
        validators,
        codings: &cache.rules().accept_encoding,
        strip: &config.cache.strip_request_headers,
    }
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
