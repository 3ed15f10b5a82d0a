//! Inlay's HTTP cache: RFC 9111 and Surrogate-Control rules, keys and Vary,
//! request coalescing, hit-for-miss, grace and revalidation, and purge,
//! over `inlay-storage`.
//!
//! - [`rules`]: what is cacheable and for how long ([`rules::decide`]).
//! - [`PrimaryKey`]: the key of a request; Vary selects a variant under it.
//! - [`HttpCache::lookup`] starts the state machine of [`lookup`]: a fresh
//!   hit, a stale hit refreshed in the background, or a [`CacheFetch`]
//!   whose backend response is revalidated, served stale on failure, or
//!   stored while it streams ([`NewResponse::store`]).
//! - [`CacheStore`]: the one async door to storage; nothing here calls a
//!   store that may block on a reactor thread.
//!
//! The crate knows nothing of backends, policies or the server: the
//! caller fetches, and tells the cache what came back.

mod fill;
mod flight;
mod hit_for_miss;
mod key;
pub mod lookup;
mod object;
pub mod rules;
mod store;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use inlay_storage::{ObjectMeta, StoreError, StoredObject};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Weighter};

pub use fill::FillError;
pub use flight::Flight;
pub use key::{PrimaryKey, vary_names};
pub use lookup::{
    CacheFetch, Fetched, JoinedFill, Lookup, NewResponse, fresh_status, stale_status,
};
pub use object::{ESI_MARK, object_meta, refreshed_meta, stored_headers, validators};
pub use rules::Defaults;
pub use store::CacheStore;

use flight::{Flights, Waited};
use hit_for_miss::HitForMiss;

/// What the cache is configured with (`[cache]`).
#[derive(Clone, Copy, Debug)]
pub struct CacheRules {
    /// TTL, grace and keep for responses that say nothing.
    pub defaults: Defaults,
    /// Bodies larger than this stream through without being stored.
    pub max_object_size: u64,
}

/// Bytes of Vary names kept in memory, by primary key (each entry costs
/// its key and names plus about 64 bytes).
const VARY_MEMORY: u64 = 16 << 20;
/// The kv namespace where the Vary header names of each primary key live.
const VARY_NS: &str = "inlay.vary";

#[derive(Clone)]
struct VaryWeighter;

impl Weighter<PrimaryKey, Arc<Vec<String>>> for VaryWeighter {
    fn weight(&self, key: &PrimaryKey, names: &Arc<Vec<String>>) -> u64 {
        let names: usize = names.iter().map(|n| n.len() + 24).sum();
        (key.as_str().len() + names + 64) as u64
    }
}

struct Inner {
    store: CacheStore,
    rules: CacheRules,
    flights: Flights,
    hit_for_miss: HitForMiss,
    /// The Vary names of recently seen primary keys (the kv store has all).
    vary: Cache<PrimaryKey, Arc<Vec<String>>, VaryWeighter, DefaultHashBuilder>,
}

/// The host's HTTP cache. Cloning is cheap (one shared cache).
#[derive(Clone)]
pub struct HttpCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("rules", &self.inner.rules)
            .finish_non_exhaustive()
    }
}

impl HttpCache {
    /// A cache over `store` with `rules`.
    pub fn new(store: CacheStore, rules: CacheRules) -> Self {
        let vary = Cache::with(
            16_384,
            VARY_MEMORY,
            VaryWeighter,
            DefaultHashBuilder::default(),
            Default::default(),
        );
        Self {
            inner: Arc::new(Inner {
                store,
                rules,
                flights: Flights::default(),
                hit_for_miss: HitForMiss::default(),
                vary,
            }),
        }
    }

    /// The store under the cache.
    pub fn store(&self) -> &CacheStore {
        &self.inner.store
    }

    /// What the cache is configured with.
    pub fn rules(&self) -> &CacheRules {
        &self.inner.rules
    }

    pub(crate) fn max_object_size(&self) -> u64 {
        self.inner.rules.max_object_size
    }

    /// The Vary names of `primary`, read from the kv store when they are
    /// not in memory.
    async fn vary_of(&self, primary: &PrimaryKey) -> Arc<Vec<String>> {
        if let Some(names) = self.inner.vary.get(primary) {
            return names;
        }
        let stored = self
            .inner
            .store
            .kv_get(VARY_NS.to_owned(), primary.as_str().to_owned())
            .await;
        let names: Vec<String> = match stored {
            Ok(Some(b)) => String::from_utf8_lossy(&b)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let names = Arc::new(names);
        self.inner.vary.insert(primary.clone(), names.clone());
        names
    }

    /// The storage key the request selects among the variants of `primary`.
    async fn storage_key(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> String {
        primary.storage_key(&self.vary_of(primary).await, req_headers)
    }

    /// The object a request selects, when it is fresh and in memory; no
    /// coalescing, no waiting, no I/O. For callers that have a slower path
    /// for everything else.
    pub fn get_fresh(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Option<StoredObject> {
        let vary = self.inner.vary.get(primary)?;
        let obj = self
            .inner
            .store
            .get_resident(&primary.storage_key(&vary, req_headers))?;
        obj.meta.is_fresh(inlay_storage::now_ms()).then_some(obj)
    }

    /// The object a request selects, fresh or not (the caller decides).
    pub async fn get(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Option<StoredObject> {
        let key = self.storage_key(primary, req_headers).await;
        self.inner.store.get(&key).await
    }

    /// What the cache holds for a request, joining an in-flight fetch of
    /// the same key if there is one (request coalescing). See [`lookup`].
    pub async fn lookup(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Lookup {
        let mut waited = false;
        loop {
            let found = self.get(primary, req_headers).await;
            let now = inlay_storage::now_ms();
            let mut expired = None;
            if let Some(obj) = found {
                if obj.meta.is_fresh(now) {
                    return Lookup::Fresh(obj);
                }
                if obj.meta.in_grace(now) {
                    let refresh = self.inner.flights.try_fly(primary).map(|flight| {
                        CacheFetch::new(
                            self.clone(),
                            primary,
                            req_headers,
                            Some(flight),
                            Some(obj.clone()),
                        )
                    });
                    return Lookup::Stale {
                        object: obj,
                        refresh,
                    };
                }
                expired = Some(obj);
            }
            let fetch = |flight| {
                Lookup::Fetch(CacheFetch::new(
                    self.clone(),
                    primary,
                    req_headers,
                    flight,
                    expired.clone(),
                ))
            };
            if self.inner.hit_for_miss.contains(primary) {
                return fetch(None);
            }
            if !waited {
                let selects = |f: &fill::Filling| f.serves(primary, req_headers);
                match self.inner.flights.wait(primary, selects).await {
                    Waited::Joined(filling) => return Lookup::Joined(JoinedFill { filling }),
                    Waited::Ended => {
                        waited = true;
                        continue;
                    }
                    Waited::NoFlight => {}
                }
            }
            if let Some(flight) = self.inner.flights.try_fly(primary) {
                return fetch(Some(flight));
            }
            // Someone took the flight between our checks: wait for them
            // once, then fetch without waiting again.
            if waited {
                return fetch(None);
            }
        }
    }

    /// Remember that `primary` is uncacheable for `ttl`, so later requests
    /// for it do not queue behind each other (Varnish's hit-for-miss).
    pub fn mark_hit_for_miss(&self, primary: &PrimaryKey, ttl: Duration) {
        self.inner.hit_for_miss.mark(primary, ttl);
    }

    /// Stores a complete response for `primary` under the variant the
    /// request selects, recording the response's Vary names first.
    pub async fn insert(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        meta: ObjectMeta,
        body: Bytes,
    ) -> Result<(), StoreError> {
        let vary = meta.vary.clone();
        if *self.vary_of(primary).await != vary {
            self.inner
                .store
                .kv_set(
                    VARY_NS.to_owned(),
                    primary.as_str().to_owned(),
                    vary.join(",").into_bytes(),
                )
                .await?;
            self.inner
                .vary
                .insert(primary.clone(), Arc::new(vary.clone()));
        }
        let key = primary.storage_key(&vary, req_headers);
        self.inner.store.put(key, meta, body).await?;
        self.inner.hit_for_miss.clear(primary);
        Ok(())
    }

    /// Replaces the metadata of the stored variant (after a 304).
    async fn refresh(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        meta: ObjectMeta,
    ) -> Result<bool, StoreError> {
        let key = self.storage_key(primary, req_headers).await;
        self.inner.store.update_meta(key, meta).await
    }

    /// Purges every variant of a URL; `soft` marks them stale instead.
    /// Returns how many objects were affected.
    pub async fn purge_url(&self, primary: &PrimaryKey, soft: bool) -> Result<u64, StoreError> {
        self.inner.hit_for_miss.clear(primary);
        self.inner
            .store
            .purge_prefix(primary.variants_prefix(), soft)
            .await
    }

    /// Purges every object tagged with a surrogate key.
    pub async fn purge_key(&self, key: &str, soft: bool) -> Result<u64, StoreError> {
        self.inner.store.purge_surrogate(key.to_owned(), soft).await
    }
}
