//! The HTTP cache of the host: keys and Vary, request coalescing, hit-for-miss,
//! over an [`inlay_storage::ObjectStore`]. The caching *rules* (what is
//! cacheable, for how long) are in [`rules`].

pub mod rules;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use inlay_storage::{ObjectMeta, ObjectStore, StoreError, StoredObject};
use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::debug;

/// Separates the primary key from the Vary variant in a storage key.
const VARIANT_SEP: char = '\u{1}';
/// Separates the parts of a primary key.
const PART_SEP: char = '\u{2}';
/// The kv namespace where the Vary header names of each primary key live.
const VARY_NS: &str = "inlay.vary";
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

/// The cache key of a request before Vary: host, path and query, and what
/// the policy added (Varnish's `hash_data`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrimaryKey(String);

impl PrimaryKey {
    /// Build the key. Control characters in policy data are escaped so they
    /// cannot forge the separators.
    pub fn new(host: &str, path_and_query: &str, extra: &[String]) -> Self {
        let mut k = String::with_capacity(host.len() + path_and_query.len() + 8);
        k.push_str(&host.to_ascii_lowercase());
        k.push(PART_SEP);
        k.push_str(path_and_query);
        for e in extra {
            k.push(PART_SEP);
            for c in e.chars() {
                if c.is_control() {
                    k.push_str(&format!("\\x{:02x}", c as u32));
                } else {
                    k.push(c);
                }
            }
        }
        Self(k)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Prefix shared by every variant of this key in the store.
    fn variants_prefix(&self) -> String {
        let mut k = String::with_capacity(self.0.len() + 16);
        k.push_str(&self.0);
        k.push(VARIANT_SEP);
        k
    }

    /// The storage key of the variant a request with `headers` selects.
    fn storage_key(&self, vary: &[String], headers: &HeaderMap) -> String {
        let mut k = self.variants_prefix();
        for (i, name) in vary.iter().enumerate() {
            if i > 0 {
                k.push(PART_SEP);
            }
            k.push_str(name);
            k.push('=');
            k.push_str(&vary_value(name, headers));
        }
        k
    }
}

/// The value of a request header as Vary compares it. Accept-Encoding is
/// normalised to `gzip` or nothing, as Varnish does, so that every browser's
/// slightly different list does not make a variant of its own.
fn vary_value(name: &str, headers: &HeaderMap) -> String {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if name == "accept-encoding" {
        let gzip = values.iter().flat_map(|v| v.split(',')).any(|e| {
            e.split(';')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("gzip"))
        });
        return if gzip { "gzip".into() } else { String::new() };
    }
    values
        .join(", ")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The lower-case header names a response varies on (sorted, deduplicated).
pub fn vary_names(headers: &HeaderMap) -> Vec<String> {
    let mut names: Vec<String> = headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty() && n != "*")
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What a lookup found.
pub enum Lookup {
    /// A fresh object.
    Fresh(StoredObject),
    /// An expired object within grace: deliver it; `refresh` is the right to
    /// refresh it in the background (none if another request already is).
    Stale {
        /// The stale object.
        object: StoredObject,
        /// Held by the one request that refreshes the object.
        refresh: Option<Flight>,
    },
    /// No usable object: this request fetches, and others wait for it.
    /// `expired` is an object past grace that may still be revalidated or
    /// served if the backend fails (`stale-if-error`, keep).
    Miss {
        /// The fetch slot other requests for the key wait on.
        flight: Flight,
        /// An object beyond grace, kept for revalidation or stale-if-error.
        expired: Option<StoredObject>,
    },
    /// The key is hit-for-miss (recently uncacheable): fetch without waiting.
    /// `expired` as for `Miss`.
    HitForMiss {
        /// An object beyond grace, if any.
        expired: Option<StoredObject>,
    },
}

/// The right to fetch a key while other requests for it wait. Dropping it
/// (after storing, or on failure) wakes them; they look the key up again.
pub struct Flight {
    cache: Arc<HttpCacheInner>,
    primary: PrimaryKey,
    _done: watch::Sender<()>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.cache.flights.lock().remove(&self.primary);
    }
}

impl Flight {
    /// The key this flight fetches.
    pub fn primary(&self) -> &PrimaryKey {
        &self.primary
    }
}

struct HttpCacheInner {
    store: Arc<dyn ObjectStore>,
    flights: Mutex<HashMap<PrimaryKey, watch::Receiver<()>>>,
    hit_for_miss: Mutex<HashMap<PrimaryKey, Instant>>,
    vary: Mutex<HashMap<PrimaryKey, Arc<Vec<String>>>>,
}

/// The host's HTTP cache.
#[derive(Clone)]
pub struct HttpCache {
    inner: Arc<HttpCacheInner>,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache").finish_non_exhaustive()
    }
}

/// How long a waiter waits for another request's fetch before fetching itself.
const MAX_WAIT: Duration = Duration::from_secs(120);
/// Entries kept in the in-memory Vary map before it is cleared.
const MAX_VARY_ENTRIES: usize = 100_000;

impl HttpCache {
    /// A cache over `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner: Arc::new(HttpCacheInner {
                store,
                flights: Mutex::new(HashMap::new()),
                hit_for_miss: Mutex::new(HashMap::new()),
                vary: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    fn vary_of(&self, primary: &PrimaryKey) -> Arc<Vec<String>> {
        if let Some(v) = self.inner.vary.lock().get(primary) {
            return v.clone();
        }
        let names: Vec<String> = match self.inner.store.kv_get(VARY_NS, primary.as_str()) {
            Ok(Some(b)) => String::from_utf8_lossy(&b)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let names = Arc::new(names);
        let mut map = self.inner.vary.lock();
        if map.len() >= MAX_VARY_ENTRIES {
            map.clear();
        }
        map.insert(primary.clone(), names.clone());
        names
    }

    /// The storage key the request selects among the variants of `primary`.
    pub fn storage_key(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> String {
        primary.storage_key(&self.vary_of(primary), req_headers)
    }

    /// The object a request selects, when it is fresh; no coalescing, no
    /// waiting. For callers that have a slower path for everything else.
    pub fn get_fresh(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Option<StoredObject> {
        let obj = self.get(&self.storage_key(primary, req_headers))?;
        obj.meta.is_fresh(inlay_storage::now_ms()).then_some(obj)
    }

    /// Find what the cache holds for a request, joining an in-flight fetch of
    /// the same key if there is one (request coalescing).
    pub async fn lookup(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Lookup {
        let mut waited = false;
        loop {
            let key = self.storage_key(primary, req_headers);
            let now = inlay_storage::now_ms();
            let found = self.get(&key);
            let mut expired = None;
            if let Some(obj) = found {
                if obj.meta.is_fresh(now) {
                    return Lookup::Fresh(obj);
                }
                if obj.meta.in_grace(now) {
                    let refresh = self.try_fly(primary);
                    return Lookup::Stale {
                        object: obj,
                        refresh,
                    };
                }
                expired = Some(obj);
            }
            if self.is_hit_for_miss(primary) {
                return Lookup::HitForMiss { expired };
            }
            let waiting = self.inner.flights.lock().get(primary).cloned();
            match waiting {
                Some(mut rx) if !waited => {
                    debug!(key = primary.as_str(), "joining in-flight fetch");
                    // The sender never sends: `changed` returns when it is dropped.
                    let _ = tokio::time::timeout(MAX_WAIT, rx.changed()).await;
                    waited = true;
                    continue;
                }
                _ => {}
            }
            if let Some(flight) = self.try_fly(primary) {
                return Lookup::Miss { flight, expired };
            }
            // Someone took the flight between our checks: wait for them once more.
            if waited {
                return Lookup::HitForMiss { expired };
            }
        }
    }

    fn try_fly(&self, primary: &PrimaryKey) -> Option<Flight> {
        let mut flights = self.inner.flights.lock();
        if flights.contains_key(primary) {
            return None;
        }
        let (tx, rx) = watch::channel(());
        flights.insert(primary.clone(), rx);
        Some(Flight {
            cache: self.inner.clone(),
            primary: primary.clone(),
            _done: tx,
        })
    }

    /// A storage read; errors are logged by the store and count as misses.
    pub fn get(&self, key: &str) -> Option<StoredObject> {
        match self.inner.store.get(key) {
            Ok(o) => o,
            Err(e) => {
                debug!(error = %e, "cache read failed; treating as a miss");
                None
            }
        }
    }

    fn is_hit_for_miss(&self, primary: &PrimaryKey) -> bool {
        let mut hfm = self.inner.hit_for_miss.lock();
        match hfm.get(primary) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                hfm.remove(primary);
                false
            }
            None => false,
        }
    }

    /// Remember that `primary` is uncacheable for `ttl`, so later requests
    /// for it do not queue behind each other (Varnish's hit-for-miss).
    pub fn mark_hit_for_miss(&self, primary: &PrimaryKey, ttl: Duration) {
        let mut hfm = self.inner.hit_for_miss.lock();
        if hfm.len() > MAX_VARY_ENTRIES {
            let now = Instant::now();
            hfm.retain(|_, until| *until > now);
        }
        hfm.insert(primary.clone(), Instant::now() + ttl);
    }

    /// Store a complete response for `primary` under the variant the request
    /// selects, recording the response's Vary names first.
    pub fn insert(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        meta: ObjectMeta,
        body: bytes::Bytes,
    ) -> Result<(), StoreError> {
        let vary = meta.vary.clone();
        if *self.vary_of(primary) != vary {
            self.inner
                .store
                .kv_set(VARY_NS, primary.as_str(), vary.join(",").as_bytes())?;
            self.inner
                .vary
                .lock()
                .insert(primary.clone(), Arc::new(vary.clone()));
        }
        let key = primary.storage_key(&vary, req_headers);
        self.inner.store.put(&key, meta, body)?;
        self.inner.hit_for_miss.lock().remove(primary);
        Ok(())
    }

    /// Replace the metadata of the stored variant (after a 304).
    pub fn refresh(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        meta: ObjectMeta,
    ) -> Result<bool, StoreError> {
        let key = self.storage_key(primary, req_headers);
        self.inner.store.update_meta(&key, meta)
    }

    /// Purge every variant of a URL; `soft` marks them stale instead.
    pub fn purge_url(&self, primary: &PrimaryKey, soft: bool) -> Result<u64, StoreError> {
        self.inner.hit_for_miss.lock().remove(primary);
        let prefix = primary.variants_prefix();
        if soft {
            self.inner.store.soft_purge_prefix(&prefix)
        } else {
            self.inner.store.remove_prefix(&prefix)
        }
    }

    /// Purge every object tagged with a surrogate key.
    pub fn purge_key(&self, key: &str, soft: bool) -> Result<u64, StoreError> {
        self.inner.store.purge_surrogate(key, soft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn keys_separate_hosts_urls_extras_and_variants() {
        let a = PrimaryKey::new("Example.com", "/x?a=1", &[]);
        assert_eq!(a, PrimaryKey::new("example.com", "/x?a=1", &[]));
        assert_ne!(a, PrimaryKey::new("example.org", "/x?a=1", &[]));
        assert_ne!(a, PrimaryKey::new("example.com", "/x?a=2", &[]));
        assert_ne!(a, PrimaryKey::new("example.com", "/x?a=1", &["b".into()]));
        // Policy data cannot forge a separator.
        let forged = PrimaryKey::new("h", "/", &["a\u{1}b".into()]);
        assert!(!forged.as_str().contains(VARIANT_SEP));
        let vary = vec!["accept-encoding".to_string(), "x-ab".to_string()];
        let gz = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "br, gzip;q=1"), ("x-ab", "a")]),
        );
        let gz2 = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "gzip"), ("x-ab", "a")]),
        );
        let b = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "gzip"), ("x-ab", "b")]),
        );
        assert_eq!(gz, gz2);
        assert_ne!(gz, b);
        assert!(gz.starts_with(&a.variants_prefix()));
    }

    #[test]
    fn vary_names_are_normalised() {
        let h = headers(&[
            ("vary", "Accept-Encoding, X-AB"),
            ("vary", "accept-encoding"),
        ]);
        assert_eq!(vary_names(&h), ["accept-encoding", "x-ab"]);
    }
}
