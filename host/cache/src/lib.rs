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
//! - [`ban`]: bans by expression ([`HttpCache::ban`]), tested at lookup
//!   and by a background lurker, persisted with the disk tier.
//!
//! The crate knows nothing of backends, policies or the server: the
//! caller fetches, and tells the cache what came back.

pub mod ban;
pub mod coding;
mod fill;
mod hit_for_miss;
mod key;
pub mod lookup;
mod object;
pub mod rules;
mod store;

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::HeaderMap;
use inlay_storage::{ObjectMeta, StoreError, StoredObject};

pub use ban::lurker::{BanLurker, LurkReport};
pub use ban::{
    BanCounts, BanError, BanExpression, BanInfo, BanStats, DEFAULT_BAN_MEMORY,
    MAX_BAN_EXPRESSION_LEN, MAX_BANS,
};
pub use fill::FillError;
pub use fill::flight::Flight;
pub use key::{ContentCodings, PrimaryKey, vary_names};
pub use lookup::{
    CacheFetch, Fetched, JoinedFill, Lookup, NewResponse, fresh_status, stale_status,
};
pub use object::{ESI_MARK, object_meta, refreshed_meta, stored_headers, validators};
pub use rules::Defaults;
pub use store::CacheStore;

use ban::{BanList, BanSubject, FillTicket, FillTickets};
use fill::flight::{Flights, Waited};
use hit_for_miss::HitForMiss;

/// A purge or ban made on this cache through its public methods.
#[derive(Debug, Clone, Copy)]
pub enum Invalidation<'a> {
    /// [`HttpCache::purge_url`]: every variant of the key.
    Url {
        /// The primary key purged.
        key: &'a PrimaryKey,
        /// Marked stale rather than removed.
        soft: bool,
    },
    /// [`HttpCache::purge_key`]: every object tagged with the surrogate key.
    SurrogateKey {
        /// The surrogate key.
        key: &'a str,
        /// Marked stale rather than removed.
        soft: bool,
    },
    /// [`HttpCache::ban`]: a ban now in effect.
    Ban {
        /// The expression as given.
        expression: &'a str,
    },
}

/// Told of every [`Invalidation`] made through the cache's public purge and
/// ban methods, after it applied here: how the host sends them to other
/// nodes without this crate knowing how. Called on the purging task: it
/// must not block (queue and return).
pub trait InvalidationSink: Send + Sync {
    /// One purge or ban was applied here.
    fn invalidated(&self, inv: Invalidation<'_>);
}

/// What the cache is configured with (`[cache]`).
#[derive(Clone, Debug)]
pub struct CacheRules {
    /// TTL, grace and keep for responses that say nothing.
    pub defaults: Defaults,
    /// Bodies larger than this stream through without being stored.
    pub max_object_size: u64,
    /// The content codings that are variants of their own
    /// (`cache.accept_encoding`).
    pub accept_encoding: ContentCodings,
    /// Most memory the bans in effect may take together, bytes
    /// ([`BanExpression::memory`]; `cache.ban_memory`): a ban past it is
    /// refused ([`BanError::OverBudget`]), whether made here or applied
    /// from another node, until the lurker drops older ones.
    pub ban_memory: usize,
    /// What a fill compresses and stores in several codings
    /// (`[compression]`); `None`: nothing.
    pub compression: Option<coding::CompressionRules>,
}

/// Where the Vary names of a URL live, and why.
///
/// The object stored under a primary key's base key (`primary` + the
/// variant separator, with no variant part) is either the response itself
/// (its `vary` is empty) or, when the response varies, a *variants header*:
/// an empty record whose `vary` lists the names, which the variants are
/// stored beside (`base` + `name=value`...). A lookup reads the base key,
/// and only when it is a header, the one variant it selects: at most two
/// store reads, O(1) whatever the number of URLs. The header is an object
/// like the others, so it is purged with its variants (same prefix),
/// evicted under the same memory and disk bounds, and expires after them;
/// nothing about Vary lives outside the objects, so no index can grow
/// apart from what is cached. An old cache's `inlay.vary` kv records
/// (before this layout) are deleted when the disk tier opens.
mod variants {
    use inlay_storage::ObjectMeta;

    /// Whether an object read at a base key is a variants header.
    pub(crate) fn is_header(meta: &ObjectMeta) -> bool {
        !meta.vary.is_empty()
    }

    /// The variants header for a variant stored with `meta`: it lives as
    /// long as the variant and as long again, so that storing variants one
    /// after another rewrites it at most every half of their lifetime.
    pub(crate) fn header_for(meta: &ObjectMeta) -> ObjectMeta {
        let life = meta.removable_at_ms().saturating_sub(meta.stored_at_ms);
        ObjectMeta {
            status: 200,
            stored_at_ms: meta.stored_at_ms,
            ttl_ms: meta.ttl_ms,
            grace_ms: meta.grace_ms,
            keep_ms: meta.keep_ms.saturating_add(life),
            vary: meta.vary.clone(),
            ..ObjectMeta::default()
        }
    }

    /// Whether `header` (what the base key holds, if anything) already
    /// serves a variant stored with `meta`.
    pub(crate) fn header_covers(header: Option<&ObjectMeta>, meta: &ObjectMeta) -> bool {
        header.is_some_and(|h| {
            is_header(h) && h.vary == meta.vary && h.removable_at_ms() >= meta.removable_at_ms()
        })
    }
}

/// Storage keys for keys of any length. The store takes keys up to
/// `inlay_storage::MAX_KEY_LEN` (8 KiB), and a URL (or a Vary'd header
/// value) may be longer: a part longer than [`long_keys::PLAIN_MAX`] is
/// stored as its first bytes, an unforgeable marker (a control character,
/// which neither a URL, a Host nor policy key data can hold: `PrimaryKey`
/// escapes them and Vary values blank them) and its SHA-256. The primary
/// part and the variant part are shortened apart, so every variant of a
/// URL still shares one prefix and a purge by URL still finds them all.
/// Two keys that differ share a stored key only if SHA-256 collides, so no
/// full key is kept to compare.
mod long_keys {
    use sha2::{Digest, Sha256};

    use crate::key::{PrimaryKey, VARIANT_SEP};

    /// Longest part kept as it is, in bytes.
    pub(crate) const PLAIN_MAX: usize = 2048;
    /// Bytes of a long part kept readable before its hash.
    const KEPT: usize = 256;
    /// Marks a shortened part.
    pub(crate) const MARK: char = '\u{3}';

    fn part(p: &str, out: &mut String) {
        if p.len() <= PLAIN_MAX {
            out.push_str(p);
            return;
        }
        let mut end = KEPT;
        while !p.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&p[..end]);
        out.push(MARK);
        for b in Sha256::digest(p.as_bytes()) {
            out.push_str(&format!("{b:02x}"));
        }
    }

    /// The stored key shared by every variant of `primary` (and the key of
    /// its base object).
    pub(crate) fn base(primary: &PrimaryKey) -> String {
        let mut k = String::with_capacity(primary.as_str().len().min(PLAIN_MAX) + 80);
        part(primary.as_str(), &mut k);
        k.push(VARIANT_SEP);
        k
    }

    /// The stored key of the variant `full` (a `PrimaryKey::storage_key`).
    pub(crate) fn variant(primary: &PrimaryKey, full: &str) -> String {
        let mut k = base(primary);
        let variant = full
            .get(primary.as_str().len() + VARIANT_SEP.len_utf8()..)
            .unwrap_or_default();
        part(variant, &mut k);
        k
    }
}

/// The cache's state, shared by every cache made [`HttpCache::with_rules`]
/// from this one, so that a reload neither forgets nor doubles the fetches
/// in flight, the hit-for-miss marks or the bans.
struct Inner {
    store: CacheStore,
    flights: Flights,
    hit_for_miss: HitForMiss,
    bans: BanList,
    tickets: FillTickets,
    lurker: parking_lot::Mutex<BanLurker>,
    lurker_running: AtomicBool,
    /// Told of the purges and bans made through the public methods.
    sink: parking_lot::RwLock<Option<Arc<dyn InvalidationSink>>>,
    /// Reads answer nothing (see [`HttpCache::set_reads_suspended`]).
    reads_suspended: AtomicBool,
    /// Fills compressing for the store at once: no more than the cores.
    compressing: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").finish_non_exhaustive()
    }
}

/// The host's HTTP cache. Cloning is cheap (one shared cache).
#[derive(Clone)]
pub struct HttpCache {
    inner: Arc<Inner>,
    rules: Arc<CacheRules>,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

/// A handle on an [`HttpCache`] that does not keep it (nor its store)
/// open: for what may outlive the generation that uses the cache.
#[derive(Clone)]
pub struct WeakHttpCache {
    inner: std::sync::Weak<Inner>,
    rules: Arc<CacheRules>,
}

impl std::fmt::Debug for WeakHttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakHttpCache").finish_non_exhaustive()
    }
}

impl WeakHttpCache {
    /// The cache, while something else still holds it.
    pub fn upgrade(&self) -> Option<HttpCache> {
        Some(HttpCache {
            inner: self.inner.upgrade()?,
            rules: Arc::clone(&self.rules),
        })
    }
}

impl HttpCache {
    /// A handle that does not keep this cache open.
    pub fn downgrade(&self) -> WeakHttpCache {
        WeakHttpCache {
            inner: Arc::downgrade(&self.inner),
            rules: Arc::clone(&self.rules),
        }
    }

    /// A cache over `store` with `rules`, with the bans persisted in the
    /// store in effect (reading them blocks on the disk tier once). Bans
    /// that cannot be read at all are logged at `error` and the cache starts
    /// without them; one record that cannot be read bans everything older.
    /// Inside a tokio runtime the ban lurker starts if there are bans.
    pub fn new(store: CacheStore, rules: CacheRules) -> Self {
        let now = inlay_storage::now_ms();
        let bans = match store.ban_records_blocking() {
            Ok(records) => BanList::from_records(&records, now),
            Err(e) => {
                tracing::error!(error = %e, "could not read the persisted bans");
                BanList::default()
            }
        };
        Self::started(store, bans, BanLurker::default(), rules)
    }

    /// A cache over `store` with `bans` in effect, nothing in flight; the
    /// lurker starts if there are bans.
    fn started(store: CacheStore, bans: BanList, lurker: BanLurker, rules: CacheRules) -> Self {
        let cache = Self {
            inner: Arc::new(Inner {
                store,
                flights: Flights::default(),
                hit_for_miss: HitForMiss::default(),
                tickets: FillTickets::after(bans.newest_ms()),
                bans,
                lurker: parking_lot::Mutex::new(lurker),
                lurker_running: AtomicBool::new(false),
                sink: parking_lot::RwLock::new(None),
                reads_suspended: AtomicBool::new(false),
                compressing: tokio::sync::Semaphore::new(
                    std::thread::available_parallelism().map_or(2, |n| n.get()),
                ),
            }),
            rules: Arc::new(rules),
        };
        cache.wake_lurker();
        cache
    }

    /// The same cache (store, fetches in flight, hit-for-miss marks, bans
    /// and their lurker) with other rules: what a config reload makes, so
    /// that requests on the old rules and on the new still coalesce with
    /// each other and every generation honours every ban.
    pub fn with_rules(&self, rules: CacheRules) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            rules: Arc::new(rules),
        }
    }

    /// A cache over another store (a reload that changed the cache's
    /// directory) with `rules`: its own fetches in flight and hit-for-miss
    /// marks, the ban lurker's settings of this one, and the bans of both
    /// in effect with their times (so that an object the new store holds
    /// from before a ban made here stays banned); the ban records are
    /// written to the new store. A store without bans takes ours with
    /// their ids; when it has bans of its own, every ban is numbered anew
    /// after the ids either side used. Blocks on the new store's
    /// disk tier: call it on a blocking thread. Fails when the store's bans
    /// cannot be read or written; the new store should then not be used.
    pub fn with_store(&self, store: CacheStore, rules: CacheRules) -> Result<Self, StoreError> {
        let records = store.ban_records_blocking()?;
        let carried = self
            .inner
            .bans
            .carried_to(&records, inlay_storage::now_ms());
        for (id, data) in &carried.write {
            store.ban_put_blocking(*id, data)?;
        }
        if !carried.remove.is_empty() {
            store.ban_remove_blocking(&carried.remove)?;
        }
        let lurker = self.inner.lurker.lock().clone();
        let cache = Self::started(store, carried.list, lurker, rules);
        *cache.inner.sink.write() = self.inner.sink.read().clone();
        cache.set_reads_suspended(self.reads_suspended());
        Ok(cache)
    }

    /// Tell `sink` of every purge and ban made from now on through
    /// [`purge_url`](Self::purge_url), [`purge_key`](Self::purge_key) and
    /// [`ban`](Self::ban) (not their `_local` forms), on this cache and
    /// every cache made from it. Replaces the sink set before.
    pub fn set_invalidation_sink(&self, sink: Arc<dyn InvalidationSink>) {
        *self.inner.sink.write() = Some(sink);
    }

    /// While `on`, every read of the cache ([`get`](Self::get),
    /// [`get_fresh`](Self::get_fresh), so lookups, ESI includes and
    /// policies alike) finds nothing: requests go to the backend (still
    /// coalesced) and what they fetch is stored, but nothing stored is
    /// served. For a cache that may hold objects purged elsewhere and not
    /// yet applied here (a cluster node cut off from the others' purges).
    pub fn set_reads_suspended(&self, on: bool) {
        self.inner.reads_suspended.store(on, Ordering::Relaxed);
    }

    /// Whether reads are suspended ([`set_reads_suspended`](Self::set_reads_suspended)).
    pub fn reads_suspended(&self) -> bool {
        self.inner.reads_suspended.load(Ordering::Relaxed)
    }

    fn tell_sink(&self, inv: Invalidation<'_>) {
        let sink = self.inner.sink.read().clone();
        if let Some(sink) = sink {
            sink.invalidated(inv);
        }
    }

    /// Adds a ban (see [`ban`]): every object cached before it that
    /// matches `expression` is removed at its next lookup or by the
    /// lurker. With a disk tier the ban is written and flushed before this
    /// returns. Fails on a bad expression, past [`MAX_BANS`] or
    /// [`CacheRules::ban_memory`], or when it cannot be persisted (then it
    /// is not in effect). A ban in effect is told to the
    /// [`InvalidationSink`].
    pub async fn ban(&self, expression: &str) -> Result<BanInfo, BanError> {
        let info = self.ban_local(expression).await?;
        self.tell_sink(Invalidation::Ban { expression });
        Ok(info)
    }

    /// [`ban`](Self::ban) on this node only, not told to the sink: for a
    /// ban another node made (the cluster's fan-out). It is refused as
    /// [`ban`](Self::ban)'s are, past this cache's budget too.
    pub async fn ban_local(&self, expression: &str) -> Result<BanInfo, BanError> {
        let expr = BanExpression::parse(expression)?;
        let bans = &self.inner.bans;
        let info = {
            let _one_at_a_time = bans.adding.lock().await;
            let budget = self.rules.ban_memory;
            let ban = self
                .inner
                .tickets
                .date_ban(|now| bans.next(expr, now, budget))?;
            self.inner
                .store
                .ban_put(ban.id, ban.record())
                .await
                .map_err(|e| BanError::Store(e.to_string()))?;
            bans.push(ban)
        };
        tracing::info!(id = info.id, expression = %info.expression, "ban added");
        self.wake_lurker();
        Ok(info)
    }

    /// The bans in effect, oldest first.
    pub fn bans(&self) -> Vec<BanInfo> {
        self.inner.bans.infos()
    }

    /// The ban counters now, with the number of bans in effect and the
    /// memory they take.
    pub fn ban_counts(&self) -> BanCounts {
        let bans = &self.inner.bans;
        bans.stats.snapshot(bans.len() as u64, bans.memory() as u64)
    }

    /// Counters of bans (atomics), for metrics. The number of bans in
    /// effect is `bans().len()`.
    pub fn ban_stats(&self) -> &BanStats {
        &self.inner.bans.stats
    }

    /// The id of a ban covering `obj`, found under `primary`.
    fn banned(&self, primary: &PrimaryKey, meta: &ObjectMeta) -> Option<u64> {
        if !self.inner.bans.may_cover(meta.created_ms) {
            return None;
        }
        let (host, url) = ban::host_and_url(primary.as_str());
        self.inner.bans.check(&BanSubject {
            url: Some(url),
            host: Some(host),
            meta,
        })
    }

    /// `obj`, read under `key`, unless a ban covers it: then it is removed
    /// and the answer is none.
    async fn unless_banned(
        &self,
        primary: &PrimaryKey,
        key: &str,
        obj: StoredObject,
    ) -> Option<StoredObject> {
        let Some(id) = self.banned(primary, &obj.meta) else {
            return Some(obj);
        };
        // Not an object a concurrent fetch stored since.
        let this = vec![(key.to_owned(), obj.meta.created_ms)];
        match self.inner.store.remove_created_by(this).await {
            Ok(n) => {
                ban::BanStats::bump(&self.inner.bans.stats.removed_at_lookup, n);
            }
            // Still banned while the ban is kept: tested again next time.
            Err(e) => tracing::warn!(error = %e, "could not remove a banned object"),
        }
        tracing::debug!(ban = id, key = %key.escape_debug(), "object banned");
        None
    }

    /// The store under the cache.
    pub fn store(&self) -> &CacheStore {
        &self.inner.store
    }

    /// What the cache is configured with.
    pub fn rules(&self) -> &CacheRules {
        &self.rules
    }

    /// The permits of fills compressing for the store.
    pub(crate) fn compressing(&self) -> &tokio::sync::Semaphore {
        &self.inner.compressing
    }

    pub(crate) fn max_object_size(&self) -> u64 {
        self.rules.max_object_size
    }

    /// What the base key of `primary` holds: the response itself, or the
    /// variants header (see [`variants`]).
    async fn base_of(&self, primary: &PrimaryKey) -> Option<StoredObject> {
        self.inner.store.get(&long_keys::base(primary)).await
    }

    /// The stored key of the variant of `primary` that a request with
    /// `req_headers` selects, when it varies on `vary`.
    fn variant_key(
        &self,
        primary: &PrimaryKey,
        vary: &[String],
        req_headers: &HeaderMap,
    ) -> String {
        let codings = &self.rules.accept_encoding;
        long_keys::variant(primary, &primary.storage_key(vary, req_headers, codings))
    }

    /// The storage key the request selects among the variants of `primary`.
    async fn storage_key(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> String {
        match self.base_of(primary).await {
            Some(base) => self.variant_key(primary, &base.meta.vary, req_headers),
            None => long_keys::base(primary),
        }
    }

    /// The object a request selects, when it is fresh and in memory; no
    /// coalescing, no waiting, no I/O. For callers that have a slower path
    /// for everything else.
    pub fn get_fresh(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Option<StoredObject> {
        if self.reads_suspended() {
            return None;
        }
        let mut obj = self.inner.store.get_resident(&long_keys::base(primary))?;
        if variants::is_header(&obj.meta) {
            let key = self.variant_key(primary, &obj.meta.vary, req_headers);
            obj = self.inner.store.get_resident(&key)?;
        }
        // A banned object is left to the slower path, which removes it.
        if self.banned(primary, &obj.meta).is_some() {
            return None;
        }
        obj.meta.is_fresh(inlay_storage::now_ms()).then_some(obj)
    }

    /// The object a request selects, fresh or not (the caller decides).
    /// An object a ban covers is removed, and is none.
    pub async fn get(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Option<StoredObject> {
        if self.reads_suspended() {
            return None;
        }
        let base_key = long_keys::base(primary);
        let base = self.inner.store.get(&base_key).await?;
        if !variants::is_header(&base.meta) {
            return self.unless_banned(primary, &base_key, base).await;
        }
        let key = self.variant_key(primary, &base.meta.vary, req_headers);
        let obj = self.inner.store.get(&key).await?;
        self.unless_banned(primary, &key, obj).await
    }

    /// What the cache holds for a request, joining an in-flight fetch of
    /// the same key if there is one (request coalescing). See [`lookup`].
    pub async fn lookup(&self, primary: &PrimaryKey, req_headers: &HeaderMap) -> Lookup {
        let mut waited = false;
        let codings = &self.rules.accept_encoding;
        let selects = |f: &fill::Filling| f.serves(primary, req_headers, codings);
        loop {
            let found = self.get(primary, req_headers).await;
            let now = inlay_storage::now_ms();
            let mut expired = None;
            if let Some(obj) = found {
                if obj.meta.is_fresh(now) {
                    return Lookup::Fresh(obj);
                }
                if obj.meta.in_grace(now) {
                    let flight = self.inner.flights.try_fly(primary);
                    // A fetch in flight that has its whole body is storing
                    // it, not refreshing: the object found may be the one it
                    // just stored (its flight ends right after), or the one
                    // it replaces. Without this wait the object would be
                    // served stale and nobody refresh it. A fresh response
                    // is joined; otherwise look again once it is stored.
                    if flight.is_none() && !waited && self.inner.flights.is_storing(primary) {
                        waited = true;
                        match self.inner.flights.wait(primary, selects).await {
                            Waited::Joined(filling) => {
                                return Lookup::Joined(JoinedFill { filling });
                            }
                            Waited::Ended | Waited::NoFlight => continue,
                        }
                    }
                    let refresh = flight.map(|flight| {
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
    /// request selects; a response with Vary first (re)writes the variants
    /// header when it does not already cover it. The object counts as
    /// cached now for bans (`created_ms`).
    pub async fn insert(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        mut meta: ObjectMeta,
        body: Bytes,
    ) -> Result<(), StoreError> {
        let ticket = self.fill_ticket();
        meta.created_ms = ticket.since_ms;
        self.insert_filled(primary, req_headers, meta, body, &ticket)
            .await
    }

    /// A ticket for a fill starting now; its time is the object's
    /// `created_ms`. Hold it until the object is stored or abandoned.
    pub(crate) fn fill_ticket(&self) -> FillTicket {
        FillTickets::open(&self.inner)
    }

    /// [`insert`](Self::insert) for a fill holding `_ticket` since its
    /// response arrived (`meta.created_ms` is the ticket's time).
    pub(crate) async fn insert_filled(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        mut meta: ObjectMeta,
        body: Bytes,
        _ticket: &FillTicket,
    ) -> Result<(), StoreError> {
        // A digest key hides the URL from the lurker: keep the full key.
        if primary.as_str().len() > long_keys::PLAIN_MAX
            && primary.as_str().len() <= inlay_storage::MAX_KEY_LEN
        {
            meta.full_key = Some(primary.as_str().to_owned());
        }
        let key = self.variant_key(primary, &meta.vary, req_headers);
        if !meta.vary.is_empty() {
            self.ensure_header(primary, &meta).await?;
        }
        self.inner.store.put(key, meta, body).await?;
        self.inner.hit_for_miss.clear(primary);
        Ok(())
    }

    /// Makes the variants header of `primary` list `meta.vary` and outlive
    /// a variant stored with `meta`.
    async fn ensure_header(
        &self,
        primary: &PrimaryKey,
        meta: &ObjectMeta,
    ) -> Result<(), StoreError> {
        let base = self.base_of(primary).await;
        if variants::header_covers(base.as_ref().map(|b| &*b.meta), meta) {
            return Ok(());
        }
        self.inner
            .store
            .put(
                long_keys::base(primary),
                variants::header_for(meta),
                Bytes::new(),
            )
            .await
    }

    /// Replaces the metadata of the stored variant (after a 304).
    async fn refresh(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        meta: ObjectMeta,
    ) -> Result<bool, StoreError> {
        let key = self.storage_key(primary, req_headers).await;
        if !meta.vary.is_empty() {
            self.ensure_header(primary, &meta).await?;
        }
        self.inner.store.update_meta(key, meta).await
    }

    /// Purges every variant of a URL; `soft` marks them stale instead.
    /// Returns how many objects were affected. The purge is told to the
    /// [`InvalidationSink`], even when the store failed here.
    pub async fn purge_url(&self, primary: &PrimaryKey, soft: bool) -> Result<u64, StoreError> {
        let purged = self.purge_url_local(primary, soft).await;
        self.tell_sink(Invalidation::Url { key: primary, soft });
        purged
    }

    /// [`purge_url`](Self::purge_url) on this node only, not told to the
    /// sink: for a purge another node made, or one only this cache should
    /// see (an unsafe method's invalidation).
    pub async fn purge_url_local(
        &self,
        primary: &PrimaryKey,
        soft: bool,
    ) -> Result<u64, StoreError> {
        self.inner.hit_for_miss.clear(primary);
        let header = self
            .base_of(primary)
            .await
            .is_some_and(|b| variants::is_header(&b.meta));
        let purged = self
            .inner
            .store
            .purge_prefix(long_keys::base(primary), soft)
            .await?;
        // The variants header goes with its variants but is no response.
        Ok(purged.saturating_sub(u64::from(header)))
    }

    /// Purges every object tagged with a surrogate key. The purge is told
    /// to the [`InvalidationSink`], even when the store failed here.
    pub async fn purge_key(&self, key: &str, soft: bool) -> Result<u64, StoreError> {
        let purged = self.purge_key_local(key, soft).await;
        self.tell_sink(Invalidation::SurrogateKey { key, soft });
        purged
    }

    /// [`purge_key`](Self::purge_key) on this node only, not told to the sink.
    pub async fn purge_key_local(&self, key: &str, soft: bool) -> Result<u64, StoreError> {
        self.inner.store.purge_surrogate(key.to_owned(), soft).await
    }

    /// Removes every object of both tiers (the bans and kv stay): what a
    /// node does when it cannot know what it missed. Flushed before it
    /// returns; the number of objects removed.
    pub async fn purge_all(&self) -> Result<u64, StoreError> {
        self.inner.store.purge_prefix(String::new(), false).await
    }
}
