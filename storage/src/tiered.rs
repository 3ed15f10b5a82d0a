//! [`TieredStore`]: the memory tier in front of the optional disk tier, and
//! the maintenance thread (crash cleanup, recount, sweeping, disk bound).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::disk::DiskTier;
#[cfg(test)]
use crate::engine::DiskEngine;
use crate::engine::{RecordCache, Wait, open_sled};
use crate::memory::Counters;
use crate::{
    BanRecord, KvStore, MemoryStore, ObjectMeta, ObjectStore, Peek, StoreConfig, StoreError,
    StoreStats, StoredObject, check_key, check_kv, check_meta, now_ms, seal,
};

struct Inner {
    memory: MemoryStore,
    disk: Option<DiskTier>,
    counters: Counters,
    stopping: AtomicBool,
}

/// The object store the host uses: a bounded memory tier in front of an
/// optional sled disk tier (see the crate docs).
///
/// Dropping the store stops its maintenance thread and flushes the disk.
pub struct TieredStore {
    inner: Arc<Inner>,
    stop: Option<mpsc::Sender<()>>,
    maintenance: Option<JoinHandle<()>>,
}

impl TieredStore {
    /// Opens the store. With `config.dir`, opens (or creates) the sled
    /// database there; a corrupt database is moved aside and replaced by an
    /// empty one. Fails, touching nothing, on an invalid config, a directory
    /// locked by another process, a full disk or an error of the system
    /// ([`StoreError::Open`]: permissions, file descriptors, a file where
    /// the directory should be); fails when not even a fresh database can
    /// be created.
    pub fn open(config: StoreConfig) -> Result<TieredStore, StoreError> {
        config.validate()?;
        tracing::debug!(dir = ?config.dir, memory_bytes = config.memory_bytes, disk_bytes = config.disk_bytes, "opening object store");
        let disk = match &config.dir {
            Some(dir) => {
                let opened = open_sled(dir, &config)?;
                Some(DiskTier::new(
                    Arc::new(RecordCache::new(
                        Arc::new(opened.engine),
                        config.record_cache_bytes(),
                    )),
                    &config,
                    opened.moved_aside,
                )?)
            }
            None => None,
        };
        Ok(Self::start(config, disk))
    }

    /// Opens the store on a given engine (tests inject faulty engines).
    #[cfg(test)]
    pub(crate) fn with_engine(
        config: StoreConfig,
        engine: Arc<dyn DiskEngine>,
    ) -> Result<TieredStore, StoreError> {
        config.validate()?;
        let engine = Arc::new(RecordCache::new(engine, config.record_cache_bytes()));
        let disk = DiskTier::new(engine, &config, None)?;
        Ok(Self::start(config, Some(disk)))
    }

    fn start(config: StoreConfig, disk: Option<DiskTier>) -> TieredStore {
        let inner = Arc::new(Inner {
            memory: MemoryStore::new(config.memory_bytes, config.kv_bytes),
            disk,
            counters: Counters::default(),
            stopping: AtomicBool::new(false),
        });
        let (stop, stopped) = mpsc::channel();
        let worker = inner.clone();
        let interval = config.sweep_interval;
        let maintenance = std::thread::Builder::new()
            .name("inlay-store-maint".into())
            .spawn(move || worker.maintain(&stopped, interval))
            .map_err(|e| tracing::error!(error = %e, "could not start the store maintenance thread; expired objects are removed on access only"))
            .ok();
        TieredStore {
            inner,
            stop: Some(stop),
            maintenance,
        }
    }

    /// The disk tier, for white-box tests.
    #[cfg(test)]
    pub(crate) fn disk(&self) -> Option<&DiskTier> {
        self.inner.disk.as_ref()
    }

    /// The memory tier, for white-box tests.
    #[cfg(test)]
    pub(crate) fn memory(&self) -> &MemoryStore {
        &self.inner.memory
    }

    /// Evicts disk objects now if the disk tier is over its bound (the put
    /// path and the maintenance thread do this on their own). Returns how
    /// many objects were evicted.
    pub fn enforce_disk_bound(&self) -> Result<u64, StoreError> {
        match &self.inner.disk {
            Some(d) => d.evict_to_bound(),
            None => Ok(0),
        }
    }

    /// Changes the memory budget and the disk bound in place, as
    /// [`StoreConfig`]'s `memory_bytes` and `disk_bytes` (the disk bound is
    /// ignored without a disk tier). A smaller bound evicts at once, down
    /// to it; nothing else is lost. Bounds that [`StoreConfig::validate`]
    /// would refuse change nothing ([`StoreError::Config`]). Blocks while
    /// the disk tier evicts. Returns how many objects the disk tier evicted.
    pub fn set_bounds(&self, memory_bytes: u64, disk_bytes: u64) -> Result<u64, StoreError> {
        let disk = self.inner.disk.as_ref();
        let problems = crate::config::bound_problems(memory_bytes, disk_bytes, disk.is_some());
        if !problems.is_empty() {
            return Err(StoreError::Config(problems.join("; ")));
        }
        tracing::debug!(memory_bytes, disk_bytes, "changing the store's bounds");
        self.inner.memory.tier.set_capacity(memory_bytes);
        match disk {
            Some(d) => d.set_capacity(disk_bytes),
            None => Ok(0),
        }
    }

    /// Whether the store has a disk tier (what it holds survives a restart).
    pub fn has_disk(&self) -> bool {
        self.inner.disk.is_some()
    }

    /// Whether the background count of the disk tier has finished (stats are
    /// exact from then on). Always true without a disk tier.
    pub fn disk_counted(&self) -> bool {
        self.inner.disk.as_ref().is_none_or(|d| d.usage().counted)
    }
}

impl Drop for TieredStore {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        drop(self.stop.take());
        if let Some(h) = self.maintenance.take()
            && h.join().is_err()
        {
            tracing::error!("store maintenance thread panicked");
        }
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "flushing the cache database on close failed");
        }
    }
}

impl Inner {
    fn maintain(&self, stopped: &mpsc::Receiver<()>, interval: std::time::Duration) {
        if let Some(disk) = &self.disk {
            if let Err(e) = disk.recover_pending() {
                tracing::warn!(error = %e, "cleaning up interrupted writes failed");
            }
            match disk.recount(&self.stopping) {
                Ok(()) => {
                    let u = disk.usage();
                    tracing::info!(objects = u.objects, bytes = u.bytes, "disk tier counted");
                }
                Err(e) => tracing::warn!(error = %e, "counting the disk tier failed"),
            }
            if let Err(e) = disk.evict_to_bound() {
                tracing::warn!(error = %e, "disk eviction failed");
            }
            // Orphans are harmless until then (nothing names them): last.
            if let Err(e) = disk.sweep_orphans(&self.stopping) {
                tracing::warn!(error = %e, "deleting orphaned chunk files failed");
            }
        }
        loop {
            match stopped.recv_timeout(interval) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // A message or a dropped sender both mean stop.
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            match self.sweep(now_ms()) {
                Ok(n) if n > 0 => tracing::debug!(removed = n, "swept expired objects"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "sweeping expired objects failed"),
            }
            if let Some(disk) = &self.disk
                && let Err(e) = disk.evict_to_bound()
            {
                tracing::warn!(error = %e, "disk eviction failed");
            }
        }
    }

    fn sweep(&self, now: u64) -> Result<u64, StoreError> {
        let in_memory = self.memory.tier.sweep(now);
        let n = match &self.disk {
            Some(d) => d.sweep_expired(now)?,
            None => in_memory,
        };
        Counters::add(&self.counters.expired_removed, n);
        Ok(n)
    }

    /// Removes one object from both tiers (not flushed).
    fn remove_one(&self, key: &str) -> Result<bool, StoreError> {
        match &self.disk {
            None => Ok(self.memory.tier.remove(key).is_some()),
            Some(disk) => {
                let g = disk.lock_key(key);
                // Memory first: even if the disk fails, the purge takes effect
                // here, and holding the stripe stops a re-promotion.
                let in_memory = self.memory.tier.remove(key).is_some();
                let on_disk = disk.remove_locked(&g, key)?;
                Ok(in_memory || on_disk)
            }
        }
    }

    /// Applies `f` to the metadata of one object in both tiers.
    fn modify_one(
        &self,
        key: &str,
        f: &dyn Fn(&ObjectMeta) -> ObjectMeta,
    ) -> Result<bool, StoreError> {
        match &self.disk {
            None => Ok(self.memory.tier.update(key, f).is_some()),
            Some(disk) => {
                let g = disk.lock_key(key);
                let on_disk = match disk.update_meta_locked(&g, key, f) {
                    Ok(m) => m.is_some(),
                    Err(e) => {
                        // Never leave memory newer than disk.
                        self.memory.tier.remove(key);
                        return Err(e);
                    }
                };
                let in_memory = self.memory.tier.update(key, f).is_some();
                Ok(on_disk || in_memory)
            }
        }
    }

    /// Removes or marks stale every key in `keys`, then flushes. Every key
    /// is attempted; the first error is returned after the others ran.
    fn purge(&self, keys: BTreeSet<String>, soft: bool) -> Result<u64, StoreError> {
        let now = now_ms();
        let stale = |m: &ObjectMeta| m.made_stale(now);
        let mut n = 0;
        let mut first_err = None;
        for k in &keys {
            let r = if soft {
                self.modify_one(k, &stale)
            } else {
                self.remove_one(k)
            };
            match r {
                Ok(hit) => n += u64::from(hit),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(disk) = &self.disk {
            // Purged objects must not come back after a crash.
            if let Err(e) = disk.flush() {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    fn keys_with_prefix(&self, prefix: &str) -> Result<BTreeSet<String>, StoreError> {
        self.keys_in_both(self.memory.tier.keys_with_prefix(prefix), |d| {
            d.keys_with_prefix(prefix)
        })
    }

    fn keys_for_surrogate(&self, skey: &str) -> Result<BTreeSet<String>, StoreError> {
        self.keys_in_both(self.memory.tier.keys_for_surrogate(skey), |d| {
            d.keys_for_surrogate(skey)
        })
    }

    /// The keys the memory tier found, with those the disk tier finds.
    fn keys_in_both(
        &self,
        memory: Vec<Arc<str>>,
        disk: impl FnOnce(&DiskTier) -> Result<Vec<String>, StoreError>,
    ) -> Result<BTreeSet<String>, StoreError> {
        let mut keys: BTreeSet<String> = memory.iter().map(|k| k.to_string()).collect();
        if let Some(d) = &self.disk {
            keys.extend(disk(d)?);
        }
        Ok(keys)
    }
}

impl TieredStore {
    /// `get`, with the disk tier's chunk reads as `wait` allows. A no-wait
    /// read that would wait returns [`StoreError::WouldBlock`] and counts
    /// nothing: the blocking `get` that follows counts the lookup.
    fn get_with(&self, key: &str, wait: Wait) -> Result<Option<StoredObject>, StoreError> {
        check_key(key)?;
        let inner = &*self.inner;
        let now = now_ms();
        if let Some(obj) = inner.memory.tier.get(key, now) {
            Counters::bump(&inner.counters.hits_memory);
            return Ok(Some(obj));
        }
        let Some(disk) = &inner.disk else {
            Counters::bump(&inner.counters.misses);
            return Ok(None);
        };
        let found = match disk.get(key, wait) {
            Ok(found) => found,
            Err(StoreError::WouldBlock) => return Err(StoreError::WouldBlock),
            Err(e) => {
                Counters::bump(&inner.counters.misses);
                if disk.is_degraded() {
                    // After a write failure sled cannot read what it had not
                    // yet written out; that is a miss, served uncached.
                    tracing::debug!(error = %e, "disk read failed on a degraded disk tier");
                    return Ok(None);
                }
                return Err(e);
            }
        };
        let Some((obj, raw)) = found else {
            Counters::bump(&inner.counters.misses);
            return Ok(None);
        };
        if obj.meta.is_removable(now) {
            // The sweeper deletes it; until then it is a miss.
            Counters::bump(&inner.counters.misses);
            return Ok(None);
        }
        {
            // Promote only if no writer replaced the object since we read
            // it, or memory would keep serving the older version.
            let _g = disk.lock_key(key);
            if disk.current_record(key).ok().flatten().as_ref() == Some(&raw) {
                inner.memory.tier.insert(key, obj.clone());
            }
        }
        Counters::bump(&inner.counters.hits_disk);
        Ok(Some(obj))
    }
}

impl ObjectStore for TieredStore {
    fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        self.get_with(key, Wait::Block)
    }

    fn get_nowait(&self, key: &str) -> Peek {
        match self.get_with(key, Wait::NoWait) {
            Ok(Some(obj)) => Peek::Hit(obj),
            Ok(None) => Peek::Absent,
            // Would wait for the device, or failed: the caller's `get`
            // reads it, or reports the error.
            Err(_) => Peek::NotResident,
        }
    }

    fn peek(&self, key: &str) -> Peek {
        if check_key(key).is_err() {
            return Peek::NotResident;
        }
        let inner = &*self.inner;
        if let Some(obj) = inner.memory.tier.get(key, now_ms()) {
            Counters::bump(&inner.counters.hits_memory);
            return Peek::Hit(obj);
        }
        if inner.disk.is_some() {
            // Counted by the `get` the caller makes next.
            return Peek::NotResident;
        }
        Counters::bump(&inner.counters.misses);
        Peek::Absent
    }

    fn put(&self, key: &str, meta: ObjectMeta, body: Bytes) -> Result<Arc<ObjectMeta>, StoreError> {
        check_key(key)?;
        check_meta(&meta)?;
        let inner = &*self.inner;
        let Some(disk) = &inner.disk else {
            return inner.memory.put(key, meta, body);
        };
        let meta = Arc::new(seal(meta, &body));
        {
            let g = disk.lock_key(key);
            if let Err(e) = disk.put_locked(&g, key, &meta, &body) {
                if matches!(
                    e,
                    StoreError::Full | StoreError::Io(_) | StoreError::Degraded(_)
                ) {
                    Counters::bump(&inner.counters.write_errors);
                }
                return Err(e);
            }
            // Too large for memory is fine: it is served from disk.
            inner.memory.tier.insert(
                key,
                StoredObject {
                    meta: meta.clone(),
                    body,
                },
            );
        }
        if let Err(e) = disk.evict_to_bound() {
            tracing::warn!(error = %e, "disk eviction failed");
        }
        Ok(meta)
    }

    fn update_meta(&self, key: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        check_key(key)?;
        check_meta(&meta)?;
        self.inner.modify_one(key, &|_| meta.clone())
    }

    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        check_key(key)?;
        let removed = self.inner.remove_one(key)?;
        self.flush()?;
        Ok(removed)
    }

    fn remove_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let keys = self.inner.keys_with_prefix(prefix)?;
        let n = self.inner.purge(keys, false)?;
        tracing::debug!(prefix = %prefix.escape_debug(), removed = n, "purged by prefix");
        Ok(n)
    }

    fn soft_purge_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let keys = self.inner.keys_with_prefix(prefix)?;
        let n = self.inner.purge(keys, true)?;
        tracing::debug!(prefix = %prefix.escape_debug(), marked = n, "soft-purged by prefix");
        Ok(n)
    }

    fn keys_for_surrogate(&self, skey: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.inner.keys_for_surrogate(skey)?.into_iter().collect())
    }

    fn purge_surrogate(&self, skey: &str, soft: bool) -> Result<u64, StoreError> {
        let keys = self.inner.keys_for_surrogate(skey)?;
        let n = self.inner.purge(keys, soft)?;
        tracing::debug!(
            surrogate_key = skey,
            soft,
            objects = n,
            "purged by surrogate key"
        );
        Ok(n)
    }

    fn sweep_expired(&self, now_ms: u64) -> Result<u64, StoreError> {
        self.inner.sweep(now_ms)
    }

    fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Arc<ObjectMeta>)>, StoreError> {
        let inner = &*self.inner;
        let mut found: std::collections::BTreeMap<String, Arc<ObjectMeta>> = inner
            .memory
            .tier
            .scan_meta(after, limit)
            .into_iter()
            .collect();
        if let Some(disk) = &inner.disk {
            for (k, m) in disk.scan_meta(after, limit)? {
                // Memory holds the newer copy when both do.
                found.entry(k).or_insert(m);
            }
        }
        Ok(found.into_iter().take(limit).collect())
    }

    fn remove_created_by(&self, keys: &[(String, u64)]) -> Result<u64, StoreError> {
        let inner = &*self.inner;
        let mut n = 0;
        for (key, by) in keys {
            check_key(key)?;
            let older = |m: &ObjectMeta| m.created_ms <= *by;
            let Some(disk) = &inner.disk else {
                n += u64::from(inner.memory.tier.remove_if(key, older));
                continue;
            };
            let g = disk.lock_key(key);
            // Under the key's lock memory and disk hold the same object.
            let created = match disk.created_ms_of(key)? {
                Some(c) => Some(c),
                None => inner.memory.tier.get(key, 0).map(|o| o.meta.created_ms),
            };
            if created.is_some_and(|c| c <= *by) {
                let in_memory = inner.memory.tier.remove(key).is_some();
                let on_disk = disk.remove_locked(&g, key)?;
                n += u64::from(in_memory || on_disk);
            }
        }
        if let Some(disk) = &inner.disk
            && n > 0
        {
            // Removed objects must not come back after a crash.
            disk.flush()?;
        }
        Ok(n)
    }

    fn ban_records(&self) -> Result<Vec<BanRecord>, StoreError> {
        match &self.inner.disk {
            Some(d) => d.ban_records(),
            None => Ok(Vec::new()),
        }
    }

    fn ban_put(&self, id: u64, data: &[u8]) -> Result<(), StoreError> {
        match &self.inner.disk {
            Some(d) => d.ban_put(id, data),
            None => Ok(()),
        }
    }

    fn ban_remove(&self, ids: &[u64]) -> Result<(), StoreError> {
        match &self.inner.disk {
            Some(d) => d.ban_remove(ids),
            None => Ok(()),
        }
    }

    fn max_object_bytes(&self) -> u64 {
        match &self.inner.disk {
            Some(d) => d.max_body(),
            None => self.inner.memory.max_object_bytes(),
        }
    }

    fn stats(&self) -> StoreStats {
        let inner = &*self.inner;
        let mem = inner.memory.stats();
        let mut s = StoreStats {
            memory_bytes: mem.memory_bytes,
            memory_capacity: mem.memory_capacity,
            memory_objects: mem.memory_objects,
            evicted_memory: mem.evicted_memory,
            kv_bytes: mem.kv_bytes,
            disk_counted: true,
            ..StoreStats::default()
        };
        inner.counters.fill(&mut s);
        if let Some(d) = &inner.disk {
            let u = d.usage();
            s.disk_enabled = true;
            s.disk_bytes = u.bytes;
            s.disk_objects = u.objects;
            s.disk_capacity = d.capacity();
            s.disk_file_bytes = d.size_on_disk();
            s.disk_counted = u.counted;
            if let Some(index) = d.index_stats() {
                s.disk_index_records = index.records;
                s.disk_index_bytes = index.bytes;
                s.disk_index_complete = index.complete;
            }
            s.disk_degraded = u.degraded;
            s.disk_recreated = d.moved_aside.is_some();
            s.evicted_disk = u.evicted;
            s.corrupt_dropped += u.corrupt_dropped;
            s.kv_bytes = u.kv_bytes;
        }
        s
    }

    fn flush(&self) -> Result<(), StoreError> {
        match &self.inner.disk {
            Some(d) => d.flush(),
            None => Ok(()),
        }
    }
}

impl KvStore for TieredStore {
    fn kv_get(&self, ns: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        check_kv(ns, key, None)?;
        match &self.inner.disk {
            Some(d) => d.kv_get(ns, key),
            None => self.inner.memory.kv_get(ns, key),
        }
    }

    fn kv_set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_kv(ns, key, Some(value))?;
        match &self.inner.disk {
            Some(d) => d.kv_set(ns, key, value),
            None => self.inner.memory.kv_set(ns, key, value),
        }
    }

    fn kv_delete(&self, ns: &str, key: &str) -> Result<bool, StoreError> {
        check_kv(ns, key, None)?;
        match &self.inner.disk {
            Some(d) => d.kv_delete(ns, key),
            None => self.inner.memory.kv_delete(ns, key),
        }
    }
}

#[cfg(test)]
#[path = "tiered_tests.rs"]
mod tests;
