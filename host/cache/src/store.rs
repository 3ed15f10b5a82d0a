//! The one async door to `inlay-storage`: every store call that may wait
//! for the disk runs on tokio's blocking pool, never on a reactor thread.
//! A read first asks the store without waiting (`get_nowait`: the memory
//! tier, then the disk tier's bytes only if the page cache holds them), so
//! a hit costs no thread hop unless the device must be read: a hop costs
//! about 17 µs of CPU here, more than the disk-tier hit itself.

use std::sync::Arc;

use bytes::Bytes;
use inlay_storage::{
    BanRecord, KvStore, ObjectMeta, ObjectStore, Peek, StoreError, StoreStats, StoredObject,
    TieredStore,
};
use tracing::debug;

/// The object store and the kv store, called from async code.
#[derive(Clone)]
pub struct CacheStore {
    objects: Arc<dyn ObjectStore>,
    kv: Arc<dyn KvStore>,
    /// The tiered store, when built on one: its bounds can change.
    tiered: Option<Arc<TieredStore>>,
}

impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStore").finish_non_exhaustive()
    }
}

/// Runs a store call on the blocking pool. A task that could not run (the
/// runtime is shutting down) is an I/O error like any other.
async fn blocking<T, F>(call: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|e| Err(StoreError::Io(std::io::Error::other(e.to_string()))))
}

impl CacheStore {
    /// Objects and kv records in two stores (often the same one).
    pub fn new(objects: Arc<dyn ObjectStore>, kv: Arc<dyn KvStore>) -> Self {
        Self {
            objects,
            kv,
            tiered: None,
        }
    }

    /// A store that keeps both objects and kv records.
    pub fn from_store<S: ObjectStore + KvStore + 'static>(store: Arc<S>) -> Self {
        Self {
            objects: store.clone(),
            kv: store,
            tiered: None,
        }
    }

    /// The tiered store, whose bounds [`set_bounds`](Self::set_bounds) can change.
    pub fn from_tiered(store: Arc<TieredStore>) -> Self {
        Self {
            objects: store.clone(),
            kv: store.clone(),
            tiered: Some(store),
        }
    }

    /// The tiered store under this one, when it was made
    /// [`from_tiered`](Self::from_tiered): whoever drops its last handle
    /// closes it (flushes the disk tier and joins its maintenance thread),
    /// which must not happen on a reactor thread.
    pub fn tiered(&self) -> Option<&Arc<TieredStore>> {
        self.tiered.as_ref()
    }

    /// Changes the memory budget and the disk bound in place
    /// ([`TieredStore::set_bounds`]: a smaller bound evicts down to it now,
    /// on a blocking thread). Bounds the store refuses change nothing; a
    /// store not made [`from_tiered`](Self::from_tiered) refuses every change.
    pub async fn set_bounds(&self, memory_bytes: u64, disk_bytes: u64) -> Result<(), StoreError> {
        let Some(store) = self.tiered.clone() else {
            return Err(StoreError::Config(
                "this store's bounds cannot change".into(),
            ));
        };
        blocking(move || store.set_bounds(memory_bytes, disk_bytes).map(drop)).await
    }

    /// The object under `key` from memory only, without waiting: `None`
    /// when it is not in memory (it may still be on disk).
    pub fn get_resident(&self, key: &str) -> Option<StoredObject> {
        match self.objects.peek(key) {
            Peek::Hit(obj) => Some(obj),
            Peek::Absent | Peek::NotResident => None,
        }
    }

    /// The object under `key`: from memory, or from disk when the page
    /// cache holds it, at once; else from disk on a blocking thread. Read
    /// errors are logged and count as misses.
    pub async fn get(&self, key: &str) -> Option<StoredObject> {
        match self.objects.get_nowait(key) {
            Peek::Hit(obj) => return Some(obj),
            Peek::Absent => return None,
            Peek::NotResident => {}
        }
        let (objects, key) = (self.objects.clone(), key.to_owned());
        match blocking(move || objects.get(&key)).await {
            Ok(found) => found,
            Err(e) => {
                debug!(error = %e, "cache read failed; treating as a miss");
                None
            }
        }
    }

    /// Stores an object under `key`, replacing any previous one.
    pub async fn put(&self, key: String, meta: ObjectMeta, body: Bytes) -> Result<(), StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.put(&key, meta, body).map(drop)).await
    }

    /// Replaces the metadata of the object under `key`, keeping its body.
    pub async fn update_meta(&self, key: String, meta: ObjectMeta) -> Result<bool, StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.update_meta(&key, meta)).await
    }

    /// Whether the store keeps objects across restarts (a disk tier).
    pub fn has_disk(&self) -> bool {
        self.tiered().is_some_and(|t| t.has_disk())
    }

    /// Removes (or with `soft`, marks stale) every object under `prefix`.
    pub async fn purge_prefix(&self, prefix: String, soft: bool) -> Result<u64, StoreError> {
        let objects = self.objects.clone();
        blocking(move || {
            if soft {
                objects.soft_purge_prefix(&prefix)
            } else {
                objects.remove_prefix(&prefix)
            }
        })
        .await
    }

    /// Removes (or with `soft`, marks stale) every object tagged `skey`.
    pub async fn purge_surrogate(&self, skey: String, soft: bool) -> Result<u64, StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.purge_surrogate(&skey, soft)).await
    }

    /// Up to `limit` objects after `after`, in key order, with their
    /// metadata (a walk over the store).
    pub async fn scan_meta(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(String, Arc<ObjectMeta>)>, StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.scan_meta(after.as_deref(), limit)).await
    }

    /// Removes the objects under the keys that were created at or before
    /// the time given with each (not one stored since), durably; how many
    /// were removed.
    pub async fn remove_created_by(&self, keys: Vec<(String, u64)>) -> Result<u64, StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.remove_created_by(&keys)).await
    }

    /// The persisted ban records. Blocks on the disk: called once, when
    /// the cache is built.
    pub(crate) fn ban_records_blocking(&self) -> Result<Vec<BanRecord>, StoreError> {
        self.objects.ban_records()
    }

    /// Persists a ban record, durably, on this thread.
    pub(crate) fn ban_put_blocking(&self, id: u64, data: &[u8]) -> Result<(), StoreError> {
        self.objects.ban_put(id, data)
    }

    /// Deletes ban records, on this thread.
    pub(crate) fn ban_remove_blocking(&self, ids: &[u64]) -> Result<(), StoreError> {
        self.objects.ban_remove(ids)
    }

    /// Persists a ban record, durably.
    pub(crate) async fn ban_put(&self, id: u64, data: Vec<u8>) -> Result<(), StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.ban_put(id, &data)).await
    }

    /// Deletes ban records.
    pub(crate) async fn ban_remove(&self, ids: Vec<u64>) -> Result<(), StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.ban_remove(&ids)).await
    }

    /// Reads a kv record.
    pub async fn kv_get(&self, ns: String, key: String) -> Result<Option<Bytes>, StoreError> {
        let kv = self.kv.clone();
        blocking(move || kv.kv_get(&ns, &key)).await
    }

    /// Writes a kv record.
    pub async fn kv_set(&self, ns: String, key: String, value: Vec<u8>) -> Result<(), StoreError> {
        let kv = self.kv.clone();
        blocking(move || kv.kv_set(&ns, &key, &value)).await
    }

    /// Deletes a kv record; whether it existed.
    pub async fn kv_delete(&self, ns: String, key: String) -> Result<bool, StoreError> {
        let kv = self.kv.clone();
        blocking(move || kv.kv_delete(&ns, &key)).await
    }

    /// Makes every completed write durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let objects = self.objects.clone();
        blocking(move || objects.flush()).await
    }

    /// Sizes and counters of the object store (with a disk tier, reading
    /// them asks the file system for sled's size).
    pub async fn stats(&self) -> Result<StoreStats, StoreError> {
        let objects = self.objects.clone();
        blocking(move || Ok(objects.stats())).await
    }

    /// [`stats`](Self::stats) on this thread, for a caller already where
    /// blocking is allowed (a metrics scrape runs on the blocking pool).
    pub fn stats_blocking(&self) -> StoreStats {
        self.objects.stats()
    }
}
