//! The disk tier: object layout, verification, indexes and bounds on top of
//! a [`DiskEngine`].
//!
//! Write order of a put (each step a single atomic engine write):
//! 1. `pending[id] = key`, so a crash before step 5 is cleaned up at the
//!    next open;
//! 2. the body chunks under `(key, id, index)` (none for a body small enough
//!    to go inline in the record: see [`record`]);
//! 3. the FIFO, expiry and surrogate index entries;
//! 4. the metadata record, LAST: before it exists the object does not, and
//!    a record whose chunks were lost fails verification;
//! 5. the replaced object's chunks and index entries are deleted, then the
//!    pending entry.
//!
//! Index entries (FIFO, expiry, surrogate) may outlive their object after a
//! crash; every use checks them against the record and drops stale ones.
//!
//! All writers of one key hold that key's stripe lock; readers take no lock
//! and re-check the record when what they read does not verify.
//!
//! One submodule per concern: [`layout`] (key encodings of the
//! trees), [`record`] (the record codec), [`usage`] (accounting against the
//! bound, eviction), [`read`] and [`write`](mod@write) (the object paths), [`kv`], and
//! [`maintenance`] (crash cleanup, recount, sweeps, degraded mode).

mod bans;
mod kv;
mod layout;
mod maintenance;
mod read;
mod record;
mod usage;
mod write;

use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::StoreError;
use crate::engine::DiskEngine;
use usage::Usage;

const STRIPES: usize = 64;
/// Index entries handled per batch when sweeping or evicting.
const BATCH: usize = 256;

/// Proof that the caller holds the stripe lock of a key.
pub(crate) struct KeyGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

/// The disk tier: objects, their indexes and kv records on a [`DiskEngine`],
/// within a size bound.
pub(crate) struct DiskTier {
    engine: Arc<dyn DiskEngine>,
    chunk_size: usize,
    /// Bodies up to this size go inline in their record.
    inline_body: usize,
    /// The bound, and the largest body accepted (a quarter of it); both
    /// change with [`DiskTier::set_capacity`] (a reload).
    capacity: AtomicU64,
    max_body: AtomicU64,
    /// The largest bound this tier has had: a body longer than that is
    /// corrupt, not merely stored before a shrink.
    largest_capacity: AtomicU64,
    kv_limit: u64,
    stripes: Box<[Mutex<()>]>,
    hasher: RandomState,
    usage: Usage,
    evict_lock: Mutex<()>,
    evicted: AtomicU64,
    corrupt_dropped: AtomicU64,
    /// Ids below this were handed out before this open: their pending
    /// entries belong to writes a crash interrupted.
    session_first_id: u64,
    /// Set after a write failed because the engine refuses all writes.
    degraded: Mutex<Option<String>>,
    /// Set when a flush timed out: the engine may block in its own drop.
    stuck: AtomicBool,
    pub(crate) moved_aside: Option<PathBuf>,
}

impl DiskTier {
    pub(crate) fn new(
        engine: Arc<dyn DiskEngine>,
        config: &crate::StoreConfig,
        moved_aside: Option<PathBuf>,
    ) -> Result<DiskTier, StoreError> {
        let session_first_id = engine.generate_id()?;
        Ok(DiskTier {
            engine,
            chunk_size: config.chunk_size,
            inline_body: config.inline_body_bytes.min(crate::MAX_INLINE_BODY),
            capacity: AtomicU64::new(config.disk_bytes),
            max_body: AtomicU64::new(Self::body_limit(config.disk_bytes)),
            largest_capacity: AtomicU64::new(config.disk_bytes),
            kv_limit: config.kv_bytes,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: RandomState::new(),
            usage: Usage::uncounted(),
            evict_lock: Mutex::new(()),
            evicted: AtomicU64::new(0),
            corrupt_dropped: AtomicU64::new(0),
            session_first_id,
            degraded: Mutex::new(None),
            stuck: AtomicBool::new(false),
            moved_aside,
        })
    }

    /// A quarter of the bound: one object must not empty the tier.
    fn body_limit(capacity: u64) -> u64 {
        capacity / 4
    }

    pub(crate) fn max_body(&self) -> u64 {
        self.max_body.load(Ordering::Relaxed)
    }

    /// The longest body a record can plausibly describe.
    pub(crate) fn plausible_body(&self) -> u64 {
        self.largest_capacity.load(Ordering::Relaxed)
    }

    /// Changes the bound in place; a smaller one evicts down to it now
    /// (waiting for an eviction in progress). Returns how many objects
    /// were evicted.
    pub(crate) fn set_capacity(&self, capacity: u64) -> Result<u64, StoreError> {
        self.largest_capacity.fetch_max(capacity, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Relaxed);
        self.max_body
            .store(Self::body_limit(capacity), Ordering::Relaxed);
        self.evict_to_bound_waiting()
    }

    pub(crate) fn lock_key(&self, key: &str) -> KeyGuard<'_> {
        let i = (self.hasher.hash_one(key) as usize) % STRIPES;
        KeyGuard(self.stripes[i].lock())
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &dyn DiskEngine {
        &*self.engine
    }

    pub(crate) fn size_on_disk(&self) -> u64 {
        self.engine.size_on_disk().unwrap_or(0)
    }

    /// How the engine's in-memory record index is doing, if it has one.
    pub(crate) fn index_stats(&self) -> Option<crate::engine::RecordCacheStats> {
        self.engine.record_cache()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }
}
