//! The cache's state machine for one request: what a lookup finds, what a
//! fetch for the cache brings back, and how the request is served from it.
//!
//! ```text
//! lookup ─┬─ Fresh ──────────────────────────────────────────── hit
//!         ├─ Stale (in grace) ── served ───────────────────────  stale (grace)
//!         │        └─ refresh: one CacheFetch in the background ─┐
//!         └─ Fetch (miss, or hit-for-miss) ──────────────────────┤
//!                                                                 ▼
//!            the backend's answer ── CacheFetch::on_response ─┬─ 304: revalidated
//!                                                             ├─ failed, expired object
//!                                                             │  still in keep: stale (stale-if-error)
//!                                                             └─ NewResponse: the policy
//!                                                                decides; store(settings):
//!                                                                miss (stored or not) or
//!                                                                hit-for-miss
//! ```
//!
//! The request that holds a key's [`Flight`] fetches it; other requests
//! for the key wait for that fetch (coalescing): once its response is being
//! stored they stream it as it comes in ([`Lookup::Joined`]), otherwise
//! they look again when it ends. A refresh
//! in the background follows the same path with the host's default
//! settings.

use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, Response, StatusCode};
use inlay_core::{CacheSettings, CacheStatus, ProxyBody, ProxyError, StaleReason};
use inlay_storage::StoredObject;
use tracing::warn;

use crate::HttpCache;
use crate::fill::flight::Flight;
use crate::fill::{FillTarget, Filling, fill};
use crate::key::PrimaryKey;
use crate::object::{refreshed_meta, stored_headers, validators};
use crate::rules;

/// What the cache holds for a request.
pub enum Lookup {
    /// A fresh object: serve it.
    Fresh(StoredObject),
    /// An expired object within grace: serve it. `refresh` is the right to
    /// refresh it in the background (none if another request already is).
    Stale {
        /// The stale object.
        object: StoredObject,
        /// Held by the one request that refreshes the object.
        refresh: Option<CacheFetch>,
    },
    /// Another request is fetching and storing the variant this request
    /// selects: stream it from the object being filled.
    Joined(JoinedFill),
    /// Nothing usable: fetch from the backend (see [`CacheFetch`]).
    Fetch(CacheFetch),
}

/// A response another request is storing, joined while it streams in: the
/// body is read from the object being filled, at this client's own pace.
pub struct JoinedFill {
    pub(crate) filling: Arc<Filling>,
}

impl JoinedFill {
    /// How it is served at `now_ms`: a hit on the object being stored.
    pub fn status(&self, now_ms: u64) -> CacheStatus {
        CacheStatus::Hit {
            ttl_left: self.filling.meta().expires_at_ms().saturating_sub(now_ms) / 1000,
        }
    }

    /// Whether the body is an ESI template to assemble.
    pub fn esi(&self) -> bool {
        self.filling.esi()
    }

    /// The object's age at `now_ms`, in seconds (the `Age` a hit carries).
    pub fn age_secs(&self, now_ms: u64) -> u64 {
        self.filling.meta().age_ms(now_ms) / 1000
    }

    /// The response as the fetching client got it, its body streamed from
    /// the object being filled. A body that the backend cuts, or that
    /// outgrows `max_object_size`, ends with an error ([`crate::FillError`]).
    pub fn into_response(self) -> Response<ProxyBody> {
        self.filling.response()
    }
}

/// A fetch from the backend for the cache: a miss (other requests for the
/// key wait for it), a hit-for-miss (nobody waits), or a refresh.
pub struct CacheFetch {
    cache: HttpCache,
    primary: PrimaryKey,
    req_headers: HeaderMap,
    /// Other requests wait for this one; `None` for hit-for-miss.
    flight: Option<Flight>,
    /// An object past its freshness that may be revalidated, or served if
    /// the backend fails (stale-if-error).
    expired: Option<StoredObject>,
}

/// What a backend's answer to a [`CacheFetch`] means.
pub enum Fetched {
    /// The request is served from the cache after all: the object the
    /// backend confirmed (304), or the expired one because the backend
    /// failed.
    Cached {
        /// The object to serve.
        object: StoredObject,
        /// How.
        status: CacheStatus,
    },
    /// A new response: the policy may change how it is cached, then
    /// [`NewResponse::store`] stores it while it streams.
    New(Box<NewResponse>),
}

/// A backend response on its way into the cache.
pub struct NewResponse {
    resp: Response<ProxyBody>,
    defaults: CacheSettings,
    target: FillTarget,
    hit_for_miss: bool,
}

impl CacheFetch {
    pub(crate) fn new(
        cache: HttpCache,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        flight: Option<Flight>,
        expired: Option<StoredObject>,
    ) -> Self {
        Self {
            cache,
            primary: primary.clone(),
            req_headers: req_headers.clone(),
            flight,
            expired,
        }
    }

    /// The key being fetched.
    pub fn primary(&self) -> &PrimaryKey {
        &self.primary
    }

    /// Whether the key is hit-for-miss: nobody waits for this fetch.
    pub fn is_hit_for_miss(&self) -> bool {
        self.flight.is_none()
    }

    /// Conditional request fields that revalidate the expired object, if
    /// there is one with validators; to send instead of the client's.
    pub fn validators(&self) -> HeaderMap {
        self.expired.as_ref().map(validators).unwrap_or_default()
    }

    /// What the backend's answer means for the cache: a 304 refreshes the
    /// expired object; a failure (an error or a 5xx) serves the expired
    /// object if it is still within grace or keep; anything else is a new
    /// response.
    pub async fn on_response(
        self,
        fetched: Result<Response<ProxyBody>, ProxyError>,
    ) -> Result<Fetched, ProxyError> {
        let resp = match fetched {
            Ok(resp) if resp.status().is_server_error() && self.expired.is_some() => {
                let why = format!("status {}", resp.status());
                match self.stale_if_error(&why) {
                    Some(stale) => return Ok(stale),
                    None => resp,
                }
            }
            Ok(resp) => resp,
            Err(e) => return self.stale_if_error(&e.to_string()).ok_or(e),
        };
        let defaults = rules::decide(
            resp.status(),
            resp.headers(),
            &self.cache.rules().defaults,
            SystemTime::now(),
        );
        if resp.status() == StatusCode::NOT_MODIFIED
            && let Some(old) = &self.expired
        {
            let meta = refreshed_meta(&old.meta, resp.headers(), &defaults);
            if let Err(e) = self
                .cache
                .refresh(&self.primary, &self.req_headers, meta.clone())
                .await
            {
                warn!(error = %e, "could not refresh the cached object after a 304");
            }
            return Ok(Fetched::Cached {
                object: StoredObject {
                    meta: Arc::new(meta),
                    body: old.body.clone(),
                },
                status: CacheStatus::Revalidated,
            });
        }
        let hit_for_miss = self.is_hit_for_miss();
        Ok(Fetched::New(Box::new(NewResponse {
            resp,
            defaults,
            target: FillTarget {
                cache: self.cache,
                primary: self.primary,
                req_headers: self.req_headers,
                flight: self.flight,
            },
            hit_for_miss,
        })))
    }

    /// The expired object, when the backend failed and it is still within
    /// its grace or keep time (stale-if-error).
    fn stale_if_error(&self, why: &str) -> Option<Fetched> {
        let object = self.expired.clone()?;
        let now = inlay_storage::now_ms();
        if !object.meta.in_keep(now) && !object.meta.in_grace(now) {
            return None;
        }
        // must-revalidate, proxy-revalidate, s-maxage: an error, never stale.
        if rules::forbids_stale(&stored_headers(&object.meta).0) {
            return None;
        }
        warn!(error = %why, "backend failed; serving stale object (stale-if-error)");
        let status = stale_status(&object, now, StaleReason::StaleIfError);
        Some(Fetched::Cached { object, status })
    }
}

impl NewResponse {
    /// The response, for the policy to edit before it is stored.
    pub fn response_mut(&mut self) -> &mut Response<ProxyBody> {
        &mut self.resp
    }

    /// How the host's rules (RFC 9111, Surrogate-Control, the configured
    /// defaults) would cache the response as the backend sent it.
    pub fn defaults(&self) -> &CacheSettings {
        &self.defaults
    }

    /// Stores the response as `settings` say while it streams, or marks
    /// the key hit-for-miss when it is uncacheable. Returns the response
    /// to send and how it was served.
    pub fn store(self: Box<Self>, settings: &CacheSettings) -> (Response<ProxyBody>, CacheStatus) {
        let (resp, stored) = fill(self.resp, settings, self.target);
        let status = if self.hit_for_miss {
            CacheStatus::HitForMiss { stored }
        } else {
            CacheStatus::Miss { stored }
        };
        (resp, status)
    }
}

/// How a fresh object is served at `now_ms`.
pub fn fresh_status(object: &StoredObject, now_ms: u64) -> CacheStatus {
    CacheStatus::Hit {
        ttl_left: object.meta.expires_at_ms().saturating_sub(now_ms) / 1000,
    }
}

/// How an expired object is served at `now_ms`.
pub fn stale_status(object: &StoredObject, now_ms: u64, reason: StaleReason) -> CacheStatus {
    CacheStatus::Stale {
        stale_for: now_ms.saturating_sub(object.meta.expires_at_ms()) / 1000,
        reason,
    }
}
