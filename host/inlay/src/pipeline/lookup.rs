//! hash / lookup: the cache key, and what the cache holds for it. Fresh hits
//! go to deliver; stale hits within grace are delivered while one background
//! fetch refreshes them; misses join a single in-flight fetch per key, and
//! the request that holds it fetches for the cache (see `inlay_cache::lookup`
//! for the states).

use std::future::Future;
use std::task::Poll;

use http::Method;
use inlay_cache::{CacheFetch, Fetched, Lookup, PrimaryKey, fresh_status, stale_status};
use inlay_core::{CacheStatus, ProxyError, RequestHead, StaleReason, body};
use inlay_runtime::PolicyCall;
use inlay_storage::StoredObject;
use tracing::{debug, warn};

use super::{Outcome, Pipeline, backend_response, deliver, fetch};

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
        let backend = self.backend(head)?;
        let validators = fetch.validators();
        let fetched =
            fetch::send(backend, head, Method::GET, body::empty(), Some(validators)).await;
        match fetch.on_response(fetched).await? {
            Fetched::Cached { object, status } => Ok(self.hit(object, status)),
            Fetched::New(mut new) => {
                let defaults = new.defaults().clone();
                let settings =
                    backend_response::run_policy(policy, head, new.response_mut(), defaults)
                        .await?;
                let (resp, status) = new.store(&settings);
                Ok(Outcome::new(resp, status).with_esi(settings.esi))
            }
        }
    }

    /// Refreshes a stale object while it is served: the same fetch for the
    /// cache as a miss, with the host's default settings (no policy: the
    /// request it would run for is already answered).
    fn refresh_in_background(&self, head: &RequestHead, fetch: CacheFetch) {
        let Some(backend) = self.backends.get(&head.backend).cloned() else {
            return;
        };
        let head = head.clone();
        tokio::spawn(async move {
            debug!(key = fetch.primary().as_str(), "background refresh");
            let validators = fetch.validators();
            let fetched = fetch::send(
                &backend,
                &head,
                Method::GET,
                body::empty(),
                Some(validators),
            )
            .await;
            match fetch.on_response(fetched).await {
                Ok(Fetched::New(new)) => {
                    let settings = new.defaults().clone();
                    let (resp, _) = new.store(&settings);
                    // Nobody reads this body: drain it so the store completes.
                    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                }
                // Revalidated, or the backend failed and the stale object stays.
                Ok(Fetched::Cached { .. }) => {}
                Err(e) => warn!(error = %e, "background refresh failed; the stale object stays"),
            }
        });
    }
}
