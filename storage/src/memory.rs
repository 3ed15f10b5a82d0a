//! The memory tier, and [`MemoryStore`]: the memory tier used on its own.
//!
//! Bodies live in a `quick_cache` weighted by bytes. Beside it, one mutex
//! guards the indexes the cache cannot answer: keys in order (prefix purge),
//! surrogate key to object keys, and removable-at time (sweeping). Writers
//! take that mutex around their cache insert or remove and process the
//! evictions the insert caused while still holding it, so the indexes never
//! miss a key the cache holds. Readers only touch the cache.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};

use crate::{
    KvStore, ObjectMeta, ObjectStore, Peek, StoreError, StoreStats, StoredObject, check_key,
    check_kv, check_meta, now_ms, seal,
};

/// Fixed per-object overhead charged to the memory budget (cache slot and
/// index entries), so many tiny objects cannot exceed the budget unseen.
const ENTRY_OVERHEAD: u64 = 256;

/// Per-record overhead charged to the kv budget.
pub(crate) const KV_OVERHEAD: u64 = 32;

/// Shard size we aim for: large shards keep the largest cacheable object big.
const MIN_SHARD_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Clone)]
struct MemEntry {
    obj: StoredObject,
    /// Computed once: quick_cache requires an entry's weight never to change.
    weight: u64,
}

#[derive(Clone)]
struct EntryWeighter;

impl Weighter<Arc<str>, MemEntry> for EntryWeighter {
    fn weight(&self, _key: &Arc<str>, val: &MemEntry) -> u64 {
        val.weight
    }
}

/// Hands the entries an insert evicted back to the inserting thread.
#[derive(Clone)]
struct EvictionLog;

impl Lifecycle<Arc<str>, MemEntry> for EvictionLog {
    type RequestState = Vec<(Arc<str>, MemEntry)>;

    fn begin_request(&self) -> Self::RequestState {
        Vec::new()
    }

    fn on_evict(&self, state: &mut Self::RequestState, key: Arc<str>, val: MemEntry) {
        state.push((key, val));
    }
}

#[derive(Default)]
struct MemIndex {
    keys: BTreeSet<Arc<str>>,
    expiry: BTreeSet<(u64, Arc<str>)>,
    surrogate: HashMap<String, HashSet<Arc<str>>>,
}

impl MemIndex {
    fn add(&mut self, key: &Arc<str>, meta: &ObjectMeta) {
        self.keys.insert(key.clone());
        self.expiry.insert((meta.removable_at_ms(), key.clone()));
        for sk in &meta.surrogate_keys {
            self.surrogate
                .entry(sk.clone())
                .or_default()
                .insert(key.clone());
        }
    }

    fn drop_entry(&mut self, key: &Arc<str>, meta: &ObjectMeta) {
        self.keys.remove(key);
        self.expiry.remove(&(meta.removable_at_ms(), key.clone()));
        for sk in &meta.surrogate_keys {
            if let Some(set) = self.surrogate.get_mut(sk.as_str()) {
                set.remove(key);
                if set.is_empty() {
                    self.surrogate.remove(sk.as_str());
                }
            }
        }
    }
}

/// The bounded memory tier shared by [`MemoryStore`] and the tiered store.
pub(crate) struct MemTier {
    cache: Cache<Arc<str>, MemEntry, EntryWeighter, DefaultHashBuilder, EvictionLog>,
    index: Mutex<MemIndex>,
    /// Changed by [`MemTier::set_capacity`] (a reload); the shard count stays.
    capacity: AtomicU64,
    max_entry_weight: AtomicU64,
    shards: u64,
    evicted: AtomicU64,
}

impl MemTier {
    pub(crate) fn new(capacity: u64) -> MemTier {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        let mut shards = (cores * 4).next_power_of_two().min(64);
        while shards > 1 && capacity / shards < MIN_SHARD_BYTES {
            shards /= 2;
        }
        let estimated_items = usize::try_from((capacity / 8192).clamp(64, 1 << 20)).unwrap_or(64);
        let options = OptionsBuilder::new()
            .shards(usize::try_from(shards).unwrap_or(1))
            .estimated_items_capacity(estimated_items)
            .weight_capacity(capacity)
            .build();
        let cache = match options {
            Ok(o) => {
                Cache::with_options(o, EntryWeighter, DefaultHashBuilder::default(), EvictionLog)
            }
            // The builder only fails on missing fields, which are all set.
            Err(_) => Cache::with(
                estimated_items,
                capacity,
                EntryWeighter,
                DefaultHashBuilder::default(),
                EvictionLog,
            ),
        };
        MemTier {
            cache,
            index: Mutex::new(MemIndex::default()),
            capacity: AtomicU64::new(capacity),
            max_entry_weight: AtomicU64::new(Self::entry_limit(capacity, shards)),
            shards,
            evicted: AtomicU64::new(0),
        }
    }

    /// A quarter shard: one object must not flush a whole shard.
    fn entry_limit(capacity: u64, shards: u64) -> u64 {
        (capacity / shards / 4).max(ENTRY_OVERHEAD + 1)
    }

    fn max_entry_weight(&self) -> u64 {
        self.max_entry_weight.load(Ordering::Relaxed)
    }

    /// Largest body that fits in the memory tier (roughly: metadata counts).
    pub(crate) fn max_body(&self) -> u64 {
        self.max_entry_weight() - ENTRY_OVERHEAD
    }

    /// Changes the budget in place; a smaller one evicts at once, down to
    /// it. Objects held stay unless evicted, even above the new largest
    /// size; the shard count stays what `new` chose.
    pub(crate) fn set_capacity(&self, capacity: u64) {
        let mut index = self.index.lock();
        self.capacity.store(capacity, Ordering::Relaxed);
        self.max_entry_weight
            .store(Self::entry_limit(capacity, self.shards), Ordering::Relaxed);
        self.cache.set_capacity(capacity);
        // quick_cache drops the evictions of `set_capacity` without handing
        // them back (unlike an insert's): drop what the index names and the
        // cache no longer holds. Writers hold `index`, so nothing else moved.
        let gone: HashSet<Arc<str>> = index
            .keys
            .iter()
            .filter(|k| !self.cache.contains_key(&***k))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        let MemIndex {
            keys,
            expiry,
            surrogate,
        } = &mut *index;
        keys.retain(|k| !gone.contains(k));
        expiry.retain(|(_, k)| !gone.contains(k));
        surrogate.retain(|_, set| {
            set.retain(|k| !gone.contains(k));
            !set.is_empty()
        });
        self.evicted.fetch_add(gone.len() as u64, Ordering::Relaxed);
    }

    fn weigh(key: &str, obj: &StoredObject) -> u64 {
        ENTRY_OVERHEAD + key.len() as u64 + obj.body.len() as u64 + obj.meta.approx_size() as u64
    }

    /// Returns the object unless it is absent or past its keep window (then
    /// it is dropped).
    pub(crate) fn get(&self, key: &str, now: u64) -> Option<StoredObject> {
        let entry = self.cache.get(key)?;
        if entry.obj.meta.is_removable(now) {
            self.remove(key);
            return None;
        }
        Some(entry.obj)
    }

    /// Inserts or replaces; returns false when the object is too large for
    /// the memory tier (any older copy under `key` is then removed, so a
    /// stale body is never served after a newer put).
    pub(crate) fn insert(&self, key: &str, obj: StoredObject) -> bool {
        let weight = Self::weigh(key, &obj);
        let mut index = self.index.lock();
        if weight > self.max_entry_weight() {
            self.remove_locked(&mut index, key);
            return false;
        }
        self.insert_locked(&mut index, key.into(), MemEntry { obj, weight })
    }

    fn insert_locked(&self, index: &mut MemIndex, key: Arc<str>, entry: MemEntry) -> bool {
        if let Some(old) = self.cache.peek(&*key) {
            index.drop_entry(&key, &old.obj.meta);
        }
        let meta = entry.obj.meta.clone();
        let evicted = self.cache.insert_with_lifecycle(key.clone(), entry);
        for (k, v) in evicted {
            index.drop_entry(&k, &v.obj.meta);
            if k != key {
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        // The cache may refuse an entry (weight over its shard's capacity);
        // only index what it holds.
        let present = self.cache.contains_key(&*key);
        if present {
            index.add(&key, &meta);
        }
        present
    }

    pub(crate) fn remove(&self, key: &str) -> Option<StoredObject> {
        let mut index = self.index.lock();
        self.remove_locked(&mut index, key)
    }

    fn remove_locked(&self, index: &mut MemIndex, key: &str) -> Option<StoredObject> {
        let (k, v) = self.cache.remove(key)?;
        index.drop_entry(&k, &v.obj.meta);
        Some(v.obj)
    }

    /// Removes the object under `key` if `pred` holds for its metadata.
    pub(crate) fn remove_if(&self, key: &str, pred: impl FnOnce(&ObjectMeta) -> bool) -> bool {
        let mut index = self.index.lock();
        match self.cache.peek(key) {
            Some(e) if pred(&e.obj.meta) => self.remove_locked(&mut index, key).is_some(),
            _ => false,
        }
    }

    /// Replaces the metadata of a held object with `f(old)`; the body, its
    /// length and checksum stay. Returns the new metadata if the key was held.
    pub(crate) fn update(
        &self,
        key: &str,
        f: impl FnOnce(&ObjectMeta) -> ObjectMeta,
    ) -> Option<Arc<ObjectMeta>> {
        let mut index = self.index.lock();
        let old = self.cache.peek(key)?;
        let mut meta = f(&old.obj.meta);
        meta.body_len = old.obj.meta.body_len;
        meta.checksum = old.obj.meta.checksum;
        // The codings describe the body, which stays.
        meta.codings.clone_from(&old.obj.meta.codings);
        let meta = Arc::new(meta);
        let obj = StoredObject {
            meta: meta.clone(),
            body: old.obj.body.clone(),
        };
        let weight = Self::weigh(key, &obj);
        if weight > self.max_entry_weight() {
            self.remove_locked(&mut index, key);
            return Some(meta);
        }
        self.insert_locked(&mut index, key.into(), MemEntry { obj, weight });
        Some(meta)
    }

    pub(crate) fn keys_with_prefix(&self, prefix: &str) -> Vec<Arc<str>> {
        let index = self.index.lock();
        index
            .keys
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Up to `limit` held objects with keys after `after`, in key order,
    /// with their metadata (without touching their recency).
    pub(crate) fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<(String, Arc<ObjectMeta>)> {
        let index = self.index.lock();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        index
            .keys
            .range::<str, _>((start, Bound::Unbounded))
            .filter_map(|k| Some((k.to_string(), self.cache.peek(&**k)?.obj.meta)))
            .take(limit)
            .collect()
    }

    pub(crate) fn keys_for_surrogate(&self, skey: &str) -> Vec<Arc<str>> {
        let index = self.index.lock();
        index
            .surrogate
            .get(skey)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Removes every object removable at `now`; returns how many.
    pub(crate) fn sweep(&self, now: u64) -> u64 {
        let mut index = self.index.lock();
        let due: Vec<Arc<str>> = index
            .expiry
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, k)| k.clone())
            .collect();
        let mut n = 0;
        for k in due {
            if self.remove_locked(&mut index, &k).is_some() {
                n += 1;
            }
        }
        n
    }

    pub(crate) fn weight(&self) -> u64 {
        self.cache.weight()
    }

    pub(crate) fn len(&self) -> u64 {
        self.cache.len() as u64
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Drops everything (tests use it to force reads from disk).
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        let mut index = self.index.lock();
        self.cache.clear();
        *index = MemIndex::default();
    }
}

/// Counters shared by the store front ends.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) hits_memory: AtomicU64,
    pub(crate) hits_disk: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) corrupt_dropped: AtomicU64,
    pub(crate) expired_removed: AtomicU64,
    pub(crate) write_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Copies the counters into `s`.
    pub(crate) fn fill(&self, s: &mut StoreStats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        s.hits_memory = get(&self.hits_memory);
        s.hits_disk = get(&self.hits_disk);
        s.misses = get(&self.misses);
        s.corrupt_dropped = get(&self.corrupt_dropped);
        s.expired_removed = get(&self.expired_removed);
        s.write_errors = get(&self.write_errors);
    }
}

#[derive(Default)]
struct KvMap {
    records: HashMap<(String, String), Bytes>,
    bytes: u64,
}

/// Bounded in-memory kv records.
pub(crate) struct MemKv {
    map: Mutex<KvMap>,
    limit: u64,
}

fn kv_record_size(ns: &str, key: &str, value_len: usize) -> u64 {
    KV_OVERHEAD + (ns.len() + key.len() + value_len) as u64
}

impl MemKv {
    pub(crate) fn new(limit: u64) -> MemKv {
        MemKv {
            map: Mutex::new(KvMap::default()),
            limit,
        }
    }

    pub(crate) fn get(&self, ns: &str, key: &str) -> Option<Bytes> {
        let map = self.map.lock();
        map.records.get(&(ns.to_string(), key.to_string())).cloned()
    }

    pub(crate) fn set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut guard = self.map.lock();
        let KvMap {
            records: map,
            bytes,
        } = &mut *guard;
        let k = (ns.to_string(), key.to_string());
        let old = map.get(&k).map_or(0, |v| kv_record_size(ns, key, v.len()));
        let new = kv_record_size(ns, key, value.len());
        if *bytes - old + new > self.limit {
            return Err(StoreError::Full);
        }
        map.insert(k, Bytes::copy_from_slice(value));
        *bytes = *bytes - old + new;
        Ok(())
    }

    pub(crate) fn delete(&self, ns: &str, key: &str) -> bool {
        let mut guard = self.map.lock();
        let KvMap {
            records: map,
            bytes,
        } = &mut *guard;
        match map.remove(&(ns.to_string(), key.to_string())) {
            Some(v) => {
                *bytes -= kv_record_size(ns, key, v.len());
                true
            }
            None => false,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.map.lock().bytes
    }
}

/// The memory tier on its own: a complete, bounded, non-persistent
/// [`ObjectStore`] (also the reference implementation the tiered store is
/// tested against).
pub struct MemoryStore {
    pub(crate) tier: MemTier,
    kv: MemKv,
    counters: Counters,
}

impl MemoryStore {
    /// A store holding at most about `memory_bytes` of objects and
    /// `kv_bytes` of kv records.
    pub fn new(memory_bytes: u64, kv_bytes: u64) -> MemoryStore {
        MemoryStore {
            tier: MemTier::new(memory_bytes),
            kv: MemKv::new(kv_bytes),
            counters: Counters::default(),
        }
    }

    fn purge_keys(&self, keys: Vec<Arc<str>>, soft: bool) -> u64 {
        let now = now_ms();
        let mut n = 0;
        for k in keys {
            let hit = if soft {
                self.tier.update(&k, |m| m.made_stale(now)).is_some()
            } else {
                self.tier.remove(&k).is_some()
            };
            n += u64::from(hit);
        }
        n
    }
}

impl ObjectStore for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let hit = self.tier.get(key, now_ms());
        Counters::bump(if hit.is_some() {
            &self.counters.hits_memory
        } else {
            &self.counters.misses
        });
        Ok(hit)
    }

    fn peek(&self, key: &str) -> Peek {
        // Memory is the whole store: a miss is final. `get` counts it.
        match self.get(key) {
            Ok(Some(obj)) => Peek::Hit(obj),
            Ok(None) => Peek::Absent,
            // The caller's `get` reports the error.
            Err(_) => Peek::NotResident,
        }
    }

    fn put(&self, key: &str, meta: ObjectMeta, body: Bytes) -> Result<Arc<ObjectMeta>, StoreError> {
        check_key(key)?;
        check_meta(&meta)?;
        if body.len() as u64 > self.tier.max_body() {
            return Err(StoreError::TooLarge {
                what: "body",
                len: body.len() as u64,
                limit: self.tier.max_body(),
            });
        }
        let meta = Arc::new(seal(meta, &body));
        if !self.tier.insert(
            key,
            StoredObject {
                meta: meta.clone(),
                body,
            },
        ) {
            // Metadata pushed the entry over the limit.
            return Err(StoreError::TooLarge {
                what: "object",
                len: meta.approx_size() as u64 + meta.body_len,
                limit: self.tier.max_body(),
            });
        }
        Ok(meta)
    }

    fn update_meta(&self, key: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        check_meta(&meta)?;
        Ok(self.tier.update(key, |_| meta).is_some())
    }

    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.tier.remove(key).is_some())
    }

    fn remove_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        Ok(self.purge_keys(self.tier.keys_with_prefix(prefix), false))
    }

    fn soft_purge_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        Ok(self.purge_keys(self.tier.keys_with_prefix(prefix), true))
    }

    fn keys_for_surrogate(&self, skey: &str) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self
            .tier
            .keys_for_surrogate(skey)
            .iter()
            .map(|k| k.to_string())
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn purge_surrogate(&self, skey: &str, soft: bool) -> Result<u64, StoreError> {
        Ok(self.purge_keys(self.tier.keys_for_surrogate(skey), soft))
    }

    fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Arc<ObjectMeta>)>, StoreError> {
        Ok(self.tier.scan_meta(after, limit))
    }

    fn remove_created_by(&self, keys: &[(String, u64)]) -> Result<u64, StoreError> {
        Ok(keys
            .iter()
            .filter(|(k, by)| self.tier.remove_if(k, |m| m.created_ms <= *by))
            .count() as u64)
    }

    fn sweep_expired(&self, now_ms: u64) -> Result<u64, StoreError> {
        let n = self.tier.sweep(now_ms);
        Counters::add(&self.counters.expired_removed, n);
        Ok(n)
    }

    fn max_object_bytes(&self) -> u64 {
        self.tier.max_body()
    }

    fn stats(&self) -> StoreStats {
        let mut s = StoreStats {
            memory_bytes: self.tier.weight(),
            memory_capacity: self.tier.capacity(),
            memory_objects: self.tier.len(),
            evicted_memory: self.tier.evicted(),
            kv_bytes: self.kv.bytes(),
            ..StoreStats::default()
        };
        self.counters.fill(&mut s);
        s.evicted_memory = self.tier.evicted();
        s
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl KvStore for MemoryStore {
    fn kv_get(&self, ns: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        check_kv(ns, key, None)?;
        Ok(self.kv.get(ns, key))
    }

    fn kv_set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_kv(ns, key, Some(value))?;
        self.kv.set(ns, key, value)
    }

    fn kv_delete(&self, ns: &str, key: &str) -> Result<bool, StoreError> {
        check_kv(ns, key, None)?;
        Ok(self.kv.delete(ns, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ttl_ms: u64, skeys: &[&str]) -> ObjectMeta {
        ObjectMeta {
            status: 200,
            stored_at_ms: now_ms(),
            ttl_ms,
            surrogate_keys: skeys.iter().map(|s| s.to_string()).collect(),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn round_trip_fills_length_and_checksum() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        let body = Bytes::from_static(b"hello");
        let m = s.put("k\u{1}", meta(60_000, &[]), body.clone()).unwrap();
        assert_eq!(m.body_len, 5);
        assert_eq!(m.checksum, crc32fast::hash(b"hello"));
        let got = s.get("k\u{1}").unwrap().unwrap();
        assert_eq!(got.body, body);
        assert_eq!(*got.meta, *m);
        assert!(s.get("other").unwrap().is_none());
        let st = s.stats();
        assert_eq!((st.hits_memory, st.misses), (1, 1));
    }

    #[test]
    fn peek_answers_from_memory_and_counts_as_get() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        s.put("k", meta(60_000, &[]), Bytes::from_static(b"hello"))
            .unwrap();
        assert!(matches!(s.peek("k"), Peek::Hit(o) if o.body == "hello"));
        assert!(matches!(s.peek("other"), Peek::Absent));
        let st = s.stats();
        assert_eq!((st.hits_memory, st.misses), (1, 1));
    }

    #[test]
    fn memory_bound_holds_and_indexes_follow_evictions() {
        let cap = 1 << 20;
        let s = MemoryStore::new(cap, 1 << 20);
        let body = Bytes::from(vec![7u8; 10_000]);
        for i in 0..500 {
            s.put(
                &format!("obj{i:04}\u{1}"),
                meta(60_000, &["all"]),
                body.clone(),
            )
            .unwrap();
            assert!(s.stats().memory_bytes <= cap, "over budget after {i}");
        }
        let st = s.stats();
        assert!(st.evicted_memory > 300, "expected evictions, got {st:?}");
        assert!(st.memory_objects < 110);
        // The indexes only name what the cache holds.
        let tagged = s.keys_for_surrogate("all").unwrap();
        assert_eq!(tagged.len() as u64, st.memory_objects);
        assert_eq!(
            s.tier.keys_with_prefix("obj").len() as u64,
            st.memory_objects
        );
        for k in &tagged {
            assert!(s.get(k).unwrap().is_some(), "{k} indexed but not cached");
        }
    }

    #[test]
    fn too_large_is_refused() {
        let s = MemoryStore::new(1 << 20, 1 << 20);
        let body = Bytes::from(vec![0u8; 600 << 10]);
        assert!(matches!(
            s.put("big", meta(1000, &[]), body),
            Err(StoreError::TooLarge { .. })
        ));
    }

    #[test]
    fn prefix_and_surrogate_purge() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        let b = Bytes::from_static(b"x");
        s.put("a\u{1}gzip", meta(60_000, &["t1"]), b.clone())
            .unwrap();
        s.put("a\u{1}br", meta(60_000, &["t2"]), b.clone()).unwrap();
        s.put("ab\u{1}", meta(60_000, &["t1"]), b.clone()).unwrap();
        assert_eq!(s.remove_prefix("a\u{1}").unwrap(), 2);
        assert!(s.get("a\u{1}gzip").unwrap().is_none());
        assert!(s.get("ab\u{1}").unwrap().is_some());
        assert_eq!(
            s.keys_for_surrogate("t1").unwrap(),
            vec!["ab\u{1}".to_string()]
        );
        assert_eq!(s.purge_surrogate("t1", false).unwrap(), 1);
        assert!(s.get("ab\u{1}").unwrap().is_none());
        assert!(s.keys_for_surrogate("t1").unwrap().is_empty());
    }

    #[test]
    fn soft_purge_keeps_grace() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        let mut m = meta(600_000, &["t"]);
        m.grace_ms = 60_000;
        s.put("k", m, Bytes::from_static(b"x")).unwrap();
        assert_eq!(s.purge_surrogate("t", true).unwrap(), 1);
        let got = s.get("k").unwrap().unwrap();
        let now = now_ms();
        assert!(!got.meta.is_fresh(now));
        assert!(got.meta.in_grace(now));
        assert_eq!(got.body, Bytes::from_static(b"x"));
    }

    #[test]
    fn update_meta_keeps_body_and_checksum() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        let mut coded = meta(1000, &["old"]);
        coded.codings = vec![("identity".into(), 3), ("br".into(), 1)];
        let first = s.put("k", coded, Bytes::from_static(b"body")).unwrap();
        let mut m = meta(99_000, &["new"]);
        m.status = 203;
        m.checksum = 1;
        assert!(s.update_meta("k", m).unwrap());
        let got = s.get("k").unwrap().unwrap();
        assert_eq!(got.meta.status, 203);
        assert_eq!(got.meta.checksum, first.checksum);
        assert_eq!(got.body, Bytes::from_static(b"body"));
        // The codings describe the body, which stayed.
        assert_eq!(got.coding("br").unwrap(), Bytes::from_static(b"y"));
        assert!(s.keys_for_surrogate("old").unwrap().is_empty());
        assert_eq!(s.keys_for_surrogate("new").unwrap(), vec!["k".to_string()]);
        assert!(!s.update_meta("absent", meta(1, &[])).unwrap());
    }

    #[test]
    fn sweep_and_get_drop_removable_objects() {
        let s = MemoryStore::new(4 << 20, 1 << 20);
        let mut m = meta(0, &[]);
        m.stored_at_ms = 1_000;
        m.ttl_ms = 10;
        m.grace_ms = 10;
        m.keep_ms = 10;
        s.put("old", m.clone(), Bytes::from_static(b"x")).unwrap();
        s.put("new", meta(600_000, &[]), Bytes::from_static(b"y"))
            .unwrap();
        assert_eq!(s.sweep_expired(1_029).unwrap(), 0);
        assert_eq!(s.sweep_expired(1_030).unwrap(), 1);
        assert_eq!(s.stats().memory_objects, 1);
        // get drops an object already past keep even before a sweep.
        s.put("old2", m, Bytes::from_static(b"x")).unwrap();
        assert!(s.get("old2").unwrap().is_none());
        assert_eq!(s.stats().memory_objects, 1);
    }

    #[test]
    fn kv_round_trip_and_budget() {
        let s = MemoryStore::new(1 << 20, 200);
        s.kv_set("p1", "a", b"1").unwrap();
        s.kv_set("p2", "a", b"2").unwrap();
        assert_eq!(
            s.kv_get("p1", "a").unwrap().unwrap(),
            Bytes::from_static(b"1")
        );
        assert_eq!(
            s.kv_get("p2", "a").unwrap().unwrap(),
            Bytes::from_static(b"2")
        );
        assert!(matches!(
            s.kv_set("p1", "b", &[0u8; 200]),
            Err(StoreError::Full)
        ));
        // Overwrite is charged as a replacement, not an addition.
        s.kv_set("p1", "a", b"11").unwrap();
        assert!(s.kv_delete("p1", "a").unwrap());
        assert!(!s.kv_delete("p1", "a").unwrap());
        assert!(s.kv_get("p1", "a").unwrap().is_none());
        assert!(matches!(
            s.kv_set("", "a", b""),
            Err(StoreError::InvalidKey(_))
        ));
    }

    #[test]
    fn concurrent_inserts_keep_indexes_consistent() {
        let s = Arc::new(MemoryStore::new(512 << 10, 1 << 20));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..400 {
                        let key = format!("k{}\u{1}", (i * 7 + t) % 97);
                        let body = Bytes::from(vec![t as u8; 5_000 + i % 3_000]);
                        s.put(&key, meta(60_000, &["tag"]), body).unwrap();
                        if i % 5 == 0 {
                            s.remove(&key).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let indexed = s.tier.keys_with_prefix("k");
        assert_eq!(indexed.len() as u64, s.stats().memory_objects);
        for k in indexed {
            assert!(s.tier.get(&k, now_ms()).is_some());
        }
    }
}
