//! Usage accounting and eviction: what each object is charged against the
//! disk bound, the byte and object counters (kept exact across a background
//! recount), and FIFO eviction back under the bound.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::layout::{be_u64, utf8};
use super::record::Record;
use super::{BATCH, DiskTier};
use crate::StoreError;
use crate::engine::{TreeId, Value};

/// Per-entry overhead charged to the disk bound for each engine entry.
pub(super) const ENTRY_OVERHEAD: u64 = 64;

impl Record {
    /// Logical bytes this object occupies in the engine (charged to the bound).
    pub(super) fn footprint(&self, key: &str, record_len: usize) -> u64 {
        let k = key.len() as u64;
        let chunks = self.chunk_count();
        let skeys: u64 = self
            .meta
            .surrogate_keys
            .iter()
            .map(|s| 4 + s.len() as u64 + k + ENTRY_OVERHEAD)
            .sum();
        // An inline body is part of `record_len`.
        let chunked_body = if chunks > 0 { self.meta.body_len } else { 0 };
        (k + record_len as u64 + ENTRY_OVERHEAD)
            + chunked_body
            + chunks * (4 + k + 12 + ENTRY_OVERHEAD)
            + 2 * (8 + k + ENTRY_OVERHEAD)
            + skeys
    }
}

/// Byte and object counters, with the bookkeeping that lets a background
/// recount replace them without losing the changes made meanwhile.
#[derive(Default)]
pub(super) struct Usage {
    bytes: AtomicI64,
    objects: AtomicI64,
    kv_bytes: AtomicI64,
    recounting: AtomicBool,
    delta_bytes: AtomicI64,
    delta_objects: AtomicI64,
    delta_kv: AtomicI64,
    counted: AtomicBool,
    /// While recounting: how far the scan of records has come. A change to
    /// an object the scan has already counted goes to the deltas; a change
    /// ahead of it is not, the scan will see it.
    scanned: Mutex<Scanned>,
}

#[derive(Default)]
enum Scanned {
    #[default]
    Nothing,
    UpTo(Vec<u8>),
    All,
}

impl Scanned {
    fn passed(&self, key: &str) -> bool {
        match self {
            Scanned::Nothing => false,
            Scanned::UpTo(k) => key.as_bytes() <= k.as_slice(),
            Scanned::All => true,
        }
    }
}

impl Usage {
    /// Counters of a tier just opened: zero until the first recount
    /// finishes, changes made meanwhile kept for it.
    pub(super) fn uncounted() -> Usage {
        let usage = Usage::default();
        usage.recounting.store(true, Ordering::Relaxed);
        usage
    }

    /// Counts a change to the object `key`; callers hold its stripe lock.
    pub(super) fn adjust(&self, key: &str, bytes: i64, objects: i64) {
        if !self.recounting.load(Ordering::Relaxed) {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
            self.objects.fetch_add(objects, Ordering::Relaxed);
            return;
        }
        let scanned = self.scanned.lock();
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.objects.fetch_add(objects, Ordering::Relaxed);
        if scanned.passed(key) {
            self.delta_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.delta_objects.fetch_add(objects, Ordering::Relaxed);
        }
    }

    pub(super) fn adjust_kv(&self, bytes: i64) {
        self.kv_bytes.fetch_add(bytes, Ordering::Relaxed);
        if self.recounting.load(Ordering::Relaxed) {
            self.delta_kv.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes of kv records now.
    pub(super) fn kv_bytes(&self) -> u64 {
        unsigned(&self.kv_bytes)
    }

    /// Starts a recount: from now on a change to a key the scan has passed
    /// is also kept in the deltas.
    pub(super) fn begin_recount(&self) {
        let mut scanned = self.scanned.lock();
        *scanned = Scanned::Nothing;
        self.delta_bytes.store(0, Ordering::Relaxed);
        self.delta_objects.store(0, Ordering::Relaxed);
        self.delta_kv.store(0, Ordering::Relaxed);
        self.recounting.store(true, Ordering::Relaxed);
    }

    /// The recount has counted every record up to and including `key`.
    pub(super) fn scanned_up_to(&self, key: &[u8]) {
        *self.scanned.lock() = Scanned::UpTo(key.to_vec());
    }

    /// The recount has counted every record.
    pub(super) fn scanned_all(&self) {
        *self.scanned.lock() = Scanned::All;
    }

    /// Ends a recount: what the scan counted plus the changes made to what
    /// it had passed become the counters.
    pub(super) fn finish_recount(&self, bytes: u64, objects: u64, kv: u64) {
        let _scanned = self.scanned.lock();
        self.bytes.store(
            signed(bytes) + self.delta_bytes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.objects.store(
            signed(objects) + self.delta_objects.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.kv_bytes.store(
            signed(kv) + self.delta_kv.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.recounting.store(false, Ordering::Relaxed);
        self.counted.store(true, Ordering::Relaxed);
    }
}

pub(super) fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unsigned(n: &AtomicI64) -> u64 {
    u64::try_from(n.load(Ordering::Relaxed)).unwrap_or(0)
}

/// What the disk tier reports for stats.
pub(crate) struct DiskUsage {
    pub(crate) bytes: u64,
    pub(crate) objects: u64,
    pub(crate) kv_bytes: u64,
    pub(crate) counted: bool,
    pub(crate) evicted: u64,
    pub(crate) corrupt_dropped: u64,
    pub(crate) degraded: bool,
}

impl DiskTier {
    pub(crate) fn usage(&self) -> DiskUsage {
        DiskUsage {
            bytes: unsigned(&self.usage.bytes),
            objects: unsigned(&self.usage.objects),
            kv_bytes: unsigned(&self.usage.kv_bytes),
            counted: self.usage.counted.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            corrupt_dropped: self.corrupt_dropped.load(Ordering::Relaxed),
            degraded: self.degraded.lock().is_some(),
        }
    }

    /// Evicts objects in FIFO order while the tier is over its bound, down to
    /// 90 % of it. Only one thread evicts at a time; others return at once.
    pub(crate) fn evict_to_bound(&self) -> Result<u64, StoreError> {
        if unsigned(&self.usage.bytes) <= self.capacity() {
            return Ok(0);
        }
        let Some(evicting) = self.evict_lock.try_lock() else {
            return Ok(0);
        };
        self.evict_locked(&evicting)
    }

    /// [`evict_to_bound`](Self::evict_to_bound), waiting for an eviction
    /// in progress (which may have aimed at an older, larger bound).
    pub(crate) fn evict_to_bound_waiting(&self) -> Result<u64, StoreError> {
        let evicting = self.evict_lock.lock();
        if unsigned(&self.usage.bytes) <= self.capacity() {
            return Ok(0);
        }
        self.evict_locked(&evicting)
    }

    fn evict_locked(&self, _evicting: &MutexGuard<'_, ()>) -> Result<u64, StoreError> {
        let target = self.capacity() / 10 * 9;
        let mut evicted = 0;
        let mut start = Vec::new();
        while unsigned(&self.usage.bytes) > target {
            let batch: Vec<(Value, Value)> = self
                .engine
                .range_from(TreeId::Fifo, &start)
                .take(BATCH)
                .collect::<Result<_, _>>()?;
            let Some((last, _)) = batch.last() else { break };
            start = last.to_vec();
            start.push(0);
            for (seq_key, key) in &batch {
                if unsigned(&self.usage.bytes) <= target {
                    break;
                }
                let (Some(seq), Some(key)) = (be_u64(seq_key), utf8(key)) else {
                    self.engine.remove(TreeId::Fifo, seq_key)?;
                    continue;
                };
                let g = self.lock_key(&key);
                let current = self
                    .engine
                    .get(TreeId::Meta, key.as_bytes())?
                    .and_then(|raw| Record::decode(&raw).ok());
                if current.is_some_and(|r| r.seq == seq) && self.remove_locked(&g, &key)? {
                    evicted += 1;
                } else {
                    self.engine.remove(TreeId::Fifo, seq_key)?;
                }
            }
        }
        self.evicted.fetch_add(evicted, Ordering::Relaxed);
        if evicted > 0 {
            tracing::debug!(
                evicted,
                bytes = unsigned(&self.usage.bytes),
                "disk tier evicted objects"
            );
        }
        Ok(evicted)
    }
}
