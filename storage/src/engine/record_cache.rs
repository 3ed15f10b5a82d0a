//! The disk tier's records held in memory: a hash map in front of the
//! engine's `meta` tree, so that a lookup costs the same with a million
//! objects as with a thousand.
//!
//! sled answers a `get` by walking its tree: at 1M records that walk, and
//! paging in the nodes its cache no longer holds, cost 4-7x what it costs at
//! 1k even with every node cached (`loadtests/reports/scale.md`). Varnish
//! keeps every object's header in a hash table in memory for the same
//! reason. [`RecordCache`] wraps any [`DiskEngine`] and keeps the `meta`
//! tree's values (a record, with a small body inline) in a `quick_cache`
//! weighted by bytes; the other trees pass through.
//!
//! * **Filled** by every read of a record (the background recount after an
//!   open reads them all) and by every write: a write puts the new record
//!   in, a remove takes it out.
//! * **Bounded** by its byte budget; past it, the least used records are
//!   evicted and read from the engine again when asked.
//! * **Complete** while it holds every record of the tree: the recount has
//!   read them all, nothing was evicted, and no write failed (whose outcome
//!   in the engine is then unknown). A key it does not hold is then absent,
//!   answered without asking the engine.
//!
//! **Never stale.** A write of a record and the cache's update happen under
//! the key's stripe lock, in engine order; a read that fills the cache does
//! so under the same lock and only if no write to the stripe happened since
//! it started to read (a per-stripe epoch), so a record read before a write
//! can never replace what that write put in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use quick_cache::Lifecycle;
use quick_cache::sync::Cache;

use super::{DiskEngine, Entries, TreeId, Value, Wait};
use crate::StoreError;

/// Stripes of the write lock and epoch (a power of two).
const STRIPES: usize = 256;

/// Reads of a record a write in its stripe may interrupt before the cache
/// gives up holding it.
const FILL_TRIES: usize = 4;

/// What one cached record costs beside its key and value bytes: the
/// cache's slot, the key's and value's allocations.
const ENTRY_OVERHEAD: u64 = 96;

/// A record's weight: the bytes it holds in memory.
#[derive(Clone)]
struct RecordWeight;

impl quick_cache::Weighter<Box<[u8]>, sled::IVec> for RecordWeight {
    fn weight(&self, key: &Box<[u8]>, val: &sled::IVec) -> u64 {
        key.len() as u64 + val.len() as u64 + ENTRY_OVERHEAD
    }
}

/// Notes an eviction: the cache no longer holds every record.
#[derive(Clone)]
struct EvictionFlag(Arc<AtomicBool>);

impl Lifecycle<Box<[u8]>, sled::IVec> for EvictionFlag {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, _state: &mut (), _key: Box<[u8]>, _val: sled::IVec) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Stripe {
    /// Held across a write of a key in the stripe and the cache's update,
    /// and by a read while it fills the cache.
    write: Mutex<()>,
    /// Bumped by every write in the stripe (under `write`).
    epoch: AtomicU64,
}

/// A [`DiskEngine`] whose `meta` tree is held in memory (see the module
/// docs).
pub(crate) struct RecordCache {
    inner: Arc<dyn DiskEngine>,
    records:
        Cache<Box<[u8]>, sled::IVec, RecordWeight, quick_cache::DefaultHashBuilder, EvictionFlag>,
    stripes: Box<[Stripe]>,
    /// Set by an eviction (quick_cache also reports a record too heavy to
    /// hold as one) or a write that failed: the cache may miss a record the
    /// engine has.
    incomplete: Arc<AtomicBool>,
    /// Set once the recount has read every record through this cache.
    filled: AtomicBool,
    /// Lookups that went to the engine (the slow path only: the hits cost
    /// no shared write).
    misses: AtomicU64,
}

/// How the record cache is doing (for tests and the scale report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordCacheStats {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) misses: u64,
    pub(crate) complete: bool,
}

impl RecordCache {
    /// Wraps `inner`, holding up to `budget` bytes of records (0: none;
    /// every call then goes to `inner`).
    pub(crate) fn new(inner: Arc<dyn DiskEngine>, budget: u64) -> RecordCache {
        let incomplete = Arc::new(AtomicBool::new(budget == 0));
        let estimated = usize::try_from(budget / 512).unwrap_or(usize::MAX).max(16);
        RecordCache {
            inner,
            records: Cache::with(
                estimated,
                budget.max(1),
                RecordWeight,
                quick_cache::DefaultHashBuilder::default(),
                EvictionFlag(incomplete.clone()),
            ),
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    write: Mutex::new(()),
                    epoch: AtomicU64::new(0),
                })
                .collect(),
            incomplete,
            filled: AtomicBool::new(false),
            misses: AtomicU64::new(0),
        }
    }

    fn stripe(&self, key: &[u8]) -> &Stripe {
        &self.stripes[stripe_of(key)]
    }

    /// Whether a key the cache does not hold is absent from the engine.
    fn complete(&self) -> bool {
        self.filled.load(Ordering::Acquire) && !self.incomplete.load(Ordering::Relaxed)
    }

    /// Holds `value` under `key`. A record heavier than quick_cache admits
    /// replaces nothing: quick_cache drops the key's old value and reports
    /// both as evicted, which clears complete mode.
    fn hold(&self, key: &[u8], value: sled::IVec) {
        self.records.insert(key.into(), value);
    }

    /// Runs `write` on a record under its stripe's lock and brings the
    /// cache in line with what it says the key holds after it; on failure
    /// the cache forgets the key.
    fn write<T>(
        &self,
        key: &[u8],
        write: impl FnOnce() -> Result<(T, After), StoreError>,
    ) -> Result<T, StoreError> {
        let stripe = self.stripe(key);
        let _g = stripe.write.lock();
        let r = write();
        stripe.epoch.fetch_add(1, Ordering::AcqRel);
        match r {
            Ok((out, After::Holds(value))) => {
                self.hold(key, value);
                Ok(out)
            }
            Ok((out, After::Gone)) => {
                self.records.remove(key);
                Ok(out)
            }
            Ok((out, After::Unchanged)) => Ok(out),
            Err(e) => {
                // The engine may or may not hold the write.
                self.records.remove(key);
                self.incomplete.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn get_record(&self, key: &[u8]) -> Result<Option<Value>, StoreError> {
        if let Some(v) = self.records.get(key) {
            return Ok(Some(Value::Sled(v)));
        }
        if self.complete() {
            return Ok(None);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let stripe = self.stripe(key);
        let mut read = None;
        for _ in 0..FILL_TRIES {
            let before = stripe.epoch.load(Ordering::Acquire);
            let v = self.inner.get(TreeId::Meta, key)?;
            let Some(Value::Sled(record)) = &v else {
                if v.is_some() {
                    // Not a record the cache can hold (no engine gives one).
                    self.incomplete.store(true, Ordering::Relaxed);
                }
                return Ok(v);
            };
            {
                let _g = stripe.write.lock();
                // A write in the stripe since our read may have changed this
                // record: it put its own value in, which ours must not
                // replace. (Or it wrote another key: read again.)
                if stripe.epoch.load(Ordering::Acquire) == before {
                    self.hold(key, record.clone());
                    return Ok(v);
                }
            }
            read = Some(v);
        }
        // Writes kept coming: the record is not held, so the cache can no
        // longer say that a key it lacks is absent.
        self.incomplete.store(true, Ordering::Relaxed);
        Ok(read.flatten())
    }
}

/// The stripe of `key`. FNV-1a: cheap, and the stripe only spreads lock
/// contention.
fn stripe_of(key: &[u8]) -> usize {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h as usize) & (STRIPES - 1)
}

/// What a write of a record leaves under its key.
enum After {
    Holds(sled::IVec),
    Gone,
    /// Nothing was written (a refused compare-and-swap).
    Unchanged,
}

impl DiskEngine for RecordCache {
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        if tree == TreeId::Meta {
            return self.get_record(key);
        }
        self.inner.get(tree, key)
    }

    fn insert(&self, tree: TreeId, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError> {
        if tree != TreeId::Meta {
            return self.inner.insert(tree, key, value);
        }
        self.write(key, || {
            let old = self.inner.insert(tree, key, value)?;
            Ok((old, After::Holds(value.into())))
        })
    }

    fn remove(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        if tree != TreeId::Meta {
            return self.inner.remove(tree, key);
        }
        self.write(key, || {
            let old = self.inner.remove(tree, key)?;
            Ok((old, After::Gone))
        })
    }

    fn compare_and_swap(
        &self,
        tree: TreeId,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        if tree != TreeId::Meta {
            return self.inner.compare_and_swap(tree, key, old, new);
        }
        self.write(key, || {
            let swapped = self.inner.compare_and_swap(tree, key, old, new)?;
            let after = match (swapped, new) {
                // Refused: the engine is unchanged, and so is the cache.
                (false, _) => After::Unchanged,
                (true, Some(new)) => After::Holds(new.into()),
                (true, None) => After::Gone,
            };
            Ok((swapped, after))
        })
    }

    fn scan_prefix(&self, tree: TreeId, prefix: &[u8]) -> Entries<'_> {
        self.inner.scan_prefix(tree, prefix)
    }

    fn scan_chunks(&self, prefix: &[u8], wait: Wait) -> Entries<'_> {
        self.inner.scan_chunks(prefix, wait)
    }

    fn range_from(&self, tree: TreeId, start: &[u8]) -> Entries<'_> {
        self.inner.range_from(tree, start)
    }

    fn generate_id(&self) -> Result<u64, StoreError> {
        self.inner.generate_id()
    }

    fn sweep_orphans(&self, stop: &AtomicBool) -> Result<u64, StoreError> {
        self.inner.sweep_orphans(stop)
    }

    /// Each read filled the cache, or a write since did.
    fn all_records_read(&self) {
        self.filled.store(true, Ordering::Release);
    }

    fn record_cache(&self) -> Option<RecordCacheStats> {
        Some(RecordCacheStats {
            records: self.records.len() as u64,
            bytes: self.records.weight(),
            misses: self.misses.load(Ordering::Relaxed),
            complete: self.complete(),
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// An engine of ordered maps that counts reads of `meta` and can fail
    /// its writes; its reads yield the thread between reading and
    /// answering, to widen the window a racing write can fall in.
    /// Every tree's entries, by (tree, key).
    type Trees = BTreeMap<(usize, Vec<u8>), Vec<u8>>;
    /// Says "read", then waits for "go".
    type Pause = (
        std::sync::mpsc::SyncSender<()>,
        std::sync::mpsc::Receiver<()>,
    );

    #[derive(Default)]
    struct MapEngine {
        trees: Mutex<Trees>,
        meta_reads: AtomicUsize,
        fail_writes: AtomicBool,
        /// When set, the next read of `meta` says it has read, then waits
        /// to be let go before it answers.
        pause: Mutex<Option<Pause>>,
    }

    impl MapEngine {
        fn failing(&self) -> Result<(), StoreError> {
            if self.fail_writes.load(Ordering::Relaxed) {
                return Err(StoreError::Engine("injected".into()));
            }
            Ok(())
        }
    }

    fn val(v: Option<Vec<u8>>) -> Option<Value> {
        v.map(|v| Value::Sled(v.into()))
    }

    impl DiskEngine for MapEngine {
        fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
            if tree == TreeId::Meta {
                self.meta_reads.fetch_add(1, Ordering::Relaxed);
            }
            let v = self
                .trees
                .lock()
                .get(&(tree.index(), key.to_vec()))
                .cloned();
            let pause = if tree == TreeId::Meta {
                self.pause.lock().take()
            } else {
                None
            };
            if let Some((read, go)) = &pause {
                read.send(()).unwrap();
                go.recv().unwrap();
            }
            std::thread::yield_now();
            Ok(val(v))
        }
        fn insert(
            &self,
            tree: TreeId,
            key: &[u8],
            value: &[u8],
        ) -> Result<Option<Value>, StoreError> {
            self.failing()?;
            let old = self
                .trees
                .lock()
                .insert((tree.index(), key.to_vec()), value.to_vec());
            Ok(val(old))
        }
        fn remove(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
            self.failing()?;
            Ok(val(self.trees.lock().remove(&(tree.index(), key.to_vec()))))
        }
        fn compare_and_swap(
            &self,
            tree: TreeId,
            key: &[u8],
            old: Option<&[u8]>,
            new: Option<&[u8]>,
        ) -> Result<bool, StoreError> {
            self.failing()?;
            let mut t = self.trees.lock();
            let k = (tree.index(), key.to_vec());
            if t.get(&k).map(Vec::as_slice) != old {
                return Ok(false);
            }
            match new {
                Some(n) => t.insert(k, n.to_vec()),
                None => t.remove(&k),
            };
            Ok(true)
        }
        fn scan_prefix(&self, _tree: TreeId, _prefix: &[u8]) -> Entries<'_> {
            Box::new(std::iter::empty())
        }
        fn range_from(&self, _tree: TreeId, _start: &[u8]) -> Entries<'_> {
            Box::new(std::iter::empty())
        }
        fn generate_id(&self) -> Result<u64, StoreError> {
            Ok(0)
        }
        fn flush(&self) -> Result<(), StoreError> {
            Ok(())
        }
        fn size_on_disk(&self) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    fn cached(budget: u64) -> (Arc<MapEngine>, RecordCache) {
        let inner = Arc::new(MapEngine::default());
        let cache = RecordCache::new(inner.clone(), budget);
        (inner, cache)
    }

    fn read(c: &RecordCache, key: &[u8]) -> Option<Vec<u8>> {
        c.get(TreeId::Meta, key).unwrap().map(|v| v.to_vec())
    }

    #[test]
    fn a_record_is_read_from_the_engine_once_then_from_memory_and_follows_every_write() {
        let (inner, c) = cached(1 << 20);
        inner
            .trees
            .lock()
            .insert((TreeId::Meta.index(), b"k".to_vec()), b"v1".to_vec());
        assert_eq!(read(&c, b"k").as_deref(), Some(&b"v1"[..]));
        assert_eq!(read(&c, b"k").as_deref(), Some(&b"v1"[..]));
        assert_eq!(
            inner.meta_reads.load(Ordering::Relaxed),
            1,
            "the second read came from memory"
        );

        c.insert(TreeId::Meta, b"k", b"v2").unwrap();
        assert_eq!(read(&c, b"k").as_deref(), Some(&b"v2"[..]));
        assert!(
            !c.compare_and_swap(TreeId::Meta, b"k", Some(b"v1"), Some(b"v3"))
                .unwrap()
        );
        assert_eq!(
            read(&c, b"k").as_deref(),
            Some(&b"v2"[..]),
            "a refused swap changes nothing"
        );
        assert!(
            c.compare_and_swap(TreeId::Meta, b"k", Some(b"v2"), Some(b"v3"))
                .unwrap()
        );
        assert_eq!(read(&c, b"k").as_deref(), Some(&b"v3"[..]));
        c.remove(TreeId::Meta, b"k").unwrap();
        assert_eq!(read(&c, b"k"), None);
        assert!(
            c.compare_and_swap(TreeId::Meta, b"k", None, Some(b"v4"))
                .unwrap()
        );
        assert_eq!(read(&c, b"k").as_deref(), Some(&b"v4"[..]));
        assert_eq!(
            inner.meta_reads.load(Ordering::Relaxed),
            2,
            "only the read after the remove went to the engine"
        );

        // Other trees are not held.
        c.insert(TreeId::Kv, b"k", b"x").unwrap();
        c.get(TreeId::Kv, b"k").unwrap();
        assert_eq!(c.record_cache().unwrap().records, 1);
    }

    #[test]
    fn once_every_record_was_read_an_absent_key_is_answered_from_memory_until_an_eviction() {
        let (inner, c) = cached(1 << 20);
        for i in 0..100u32 {
            inner.trees.lock().insert(
                (TreeId::Meta.index(), i.to_be_bytes().to_vec()),
                vec![1; 100],
            );
        }
        assert_eq!(read(&c, b"absent"), None);
        for i in 0..100u32 {
            assert!(read(&c, &i.to_be_bytes()).is_some());
        }
        c.all_records_read();
        assert!(c.record_cache().unwrap().complete);
        let reads = inner.meta_reads.load(Ordering::Relaxed);
        assert_eq!(read(&c, b"absent"), None);
        c.insert(TreeId::Meta, b"new", b"n").unwrap();
        assert_eq!(read(&c, b"new").as_deref(), Some(&b"n"[..]));
        assert_eq!(
            inner.meta_reads.load(Ordering::Relaxed),
            reads,
            "answered from memory"
        );

        // A write that fails: the engine may hold it, so the cache no longer
        // claims to hold every record, and the next read asks the engine.
        inner.fail_writes.store(true, Ordering::Relaxed);
        assert!(c.insert(TreeId::Meta, b"new", b"m").is_err());
        inner.fail_writes.store(false, Ordering::Relaxed);
        assert!(!c.record_cache().unwrap().complete);
        assert_eq!(read(&c, b"new").as_deref(), Some(&b"n"[..]));
        assert_eq!(inner.meta_reads.load(Ordering::Relaxed), reads + 1);
    }

    #[test]
    fn the_budget_bounds_the_records_held_and_an_evicted_record_is_read_again() {
        let budget = 256 * 1024;
        let (inner, c) = cached(budget);
        for i in 0..5000u32 {
            c.insert(TreeId::Meta, &i.to_be_bytes(), &[7; 200]).unwrap();
        }
        c.all_records_read();
        let s = c.record_cache().unwrap();
        assert!(s.bytes <= budget, "{s:?}");
        assert!(s.records < 5000, "{s:?}");
        assert!(!s.complete, "evicted records are not held: {s:?}");
        for i in 0..5000u32 {
            assert_eq!(read(&c, &i.to_be_bytes()), Some(vec![7; 200]), "record {i}");
        }
        assert!(inner.meta_reads.load(Ordering::Relaxed) > 0);
        // A record heavier than the whole budget is read, never held.
        let (_inner, tiny) = cached(64);
        tiny.insert(TreeId::Meta, b"big", &[1; 1000]).unwrap();
        assert_eq!(read(&tiny, b"big"), Some(vec![1; 1000]));
        assert_eq!(tiny.record_cache().unwrap().records, 0);
    }

    #[test]
    fn a_record_read_before_a_write_does_not_replace_what_the_write_put_in() {
        let (inner, c) = cached(1 << 20);
        inner
            .trees
            .lock()
            .insert((TreeId::Meta.index(), b"k".to_vec()), b"old".to_vec());
        let (read_tx, read_rx) = std::sync::mpsc::sync_channel(0);
        let (go_tx, go_rx) = std::sync::mpsc::sync_channel(0);
        *inner.pause.lock() = Some((read_tx, go_rx));
        std::thread::scope(|s| {
            let reader = s.spawn(|| read(&c, b"k"));
            // The reader has the old record in hand; a write lands now.
            read_rx.recv().unwrap();
            c.insert(TreeId::Meta, b"k", b"new").unwrap();
            go_tx.send(()).unwrap();
            assert_eq!(
                reader.join().unwrap().as_deref(),
                Some(&b"new"[..]),
                "read again"
            );
        });
        assert_eq!(
            read(&c, b"k").as_deref(),
            Some(&b"new"[..]),
            "the old record stayed in the cache"
        );
    }

    /// While the recount reads every record, a write to another key of the
    /// same stripe must not leave the record it interrupted out of a cache
    /// that then says it holds them all.
    #[test]
    fn a_read_interrupted_by_a_write_to_its_stripe_still_fills_the_cache() {
        let (inner, c) = cached(1 << 20);
        let a = b"a".to_vec();
        let b = (0u32..)
            .map(|i| format!("b{i}").into_bytes())
            .find(|k| stripe_of(k) == stripe_of(&a))
            .unwrap();
        inner
            .trees
            .lock()
            .insert((TreeId::Meta.index(), a.clone()), b"A".to_vec());
        let (read_tx, read_rx) = std::sync::mpsc::sync_channel(0);
        let (go_tx, go_rx) = std::sync::mpsc::sync_channel(0);
        *inner.pause.lock() = Some((read_tx, go_rx));
        std::thread::scope(|s| {
            let reader = s.spawn(|| read(&c, &a));
            read_rx.recv().unwrap();
            c.insert(TreeId::Meta, &b, b"B").unwrap();
            go_tx.send(()).unwrap();
            assert_eq!(reader.join().unwrap().as_deref(), Some(&b"A"[..]));
        });
        c.all_records_read();
        assert!(c.record_cache().unwrap().complete);
        assert_eq!(
            read(&c, &a).as_deref(),
            Some(&b"A"[..]),
            "a stored record answered as absent"
        );
    }

    /// Readers race writers on a few keys: a record read before a write
    /// must never stay in the cache after it.
    #[test]
    fn racing_reads_and_writes_leave_the_cache_equal_to_the_engine() {
        let (inner, c) = cached(1 << 20);
        let c = Arc::new(c);
        let keys: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'k', i]).collect();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (c, keys) = (c.clone(), keys.clone());
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for n in 0..20_000u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = &keys[(x % 8) as usize];
                        match x % 5 {
                            0 => {
                                c.insert(TreeId::Meta, key, &n.to_be_bytes()).unwrap();
                            }
                            1 => {
                                c.remove(TreeId::Meta, key).unwrap();
                            }
                            2 => {
                                let now = read(&c, key);
                                let _ = c.compare_and_swap(
                                    TreeId::Meta,
                                    key,
                                    now.as_deref(),
                                    Some(&n.to_le_bytes()),
                                );
                            }
                            _ => {
                                read(&c, key);
                            }
                        }
                    }
                });
            }
        });
        for key in &keys {
            let engine = inner
                .trees
                .lock()
                .get(&(TreeId::Meta.index(), key.clone()))
                .cloned();
            let held = c.records.get(key.as_slice()).map(|v| v.to_vec());
            if let Some(held) = held {
                assert_eq!(Some(held), engine, "key {key:?}");
            }
            assert_eq!(read(&c, key), engine, "key {key:?}");
        }
    }
}
