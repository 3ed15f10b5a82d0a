//! The disk tier: object layout, verification, indexes and bounds on top of
//! a [`DiskEngine`].
//!
//! Write order of a put (each step a single atomic engine write):
//! 1. `pending[id] = key`, so a crash before step 5 is cleaned up at the
//!    next open;
//! 2. the body chunks under `(key, id, index)`;
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

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard};

use crate::codec::{Reader, Writer};
use crate::engine::{DiskEngine, TreeId, Value};
use crate::error::from_io;
use crate::{ObjectMeta, StoreError, StoredObject};

const RECORD_MAGIC: [u8; 2] = *b"IR";
const RECORD_VERSION: u8 = 1;
/// Bytes before the metadata in a record: magic, version, crc, id, seq, chunk size.
const RECORD_HEADER: usize = 2 + 1 + 4 + 8 + 8 + 4;
/// Per-entry overhead charged to the disk bound for each engine entry.
const ENTRY_OVERHEAD: u64 = 64;
const STRIPES: usize = 64;
/// Index entries handled per batch when sweeping or evicting.
const BATCH: usize = 256;

/// The metadata record of one object on disk.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// Chunk set id: a fresh engine id per put, so an overwrite never mixes
    /// old and new chunks.
    pub(crate) id: u64,
    /// Position in the FIFO eviction order.
    pub(crate) seq: u64,
    pub(crate) chunk_size: u32,
    pub(crate) meta: ObjectMeta,
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let meta = self.meta.encode();
        let mut w = Writer::with_capacity(RECORD_HEADER + meta.len());
        w.buf.extend_from_slice(&RECORD_MAGIC);
        w.u8(RECORD_VERSION);
        w.u32(0); // crc placeholder
        w.u64(self.id);
        w.u64(self.seq);
        w.u32(self.chunk_size);
        w.buf.extend_from_slice(&meta);
        let crc = crc32fast::hash(&w.buf[7..]);
        w.buf[3..7].copy_from_slice(&crc.to_be_bytes());
        w.buf
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Record, StoreError> {
        let mut r = Reader::new(buf);
        if r.take(2, "magic")? != RECORD_MAGIC {
            return Err(StoreError::Corrupt("bad record magic".into()));
        }
        let version = r.u8("record version")?;
        if version != RECORD_VERSION {
            return Err(StoreError::Corrupt(format!(
                "unknown record version {version}"
            )));
        }
        let crc = r.u32("record crc")?;
        if crc32fast::hash(&buf[7..]) != crc {
            return Err(StoreError::Corrupt("record checksum mismatch".into()));
        }
        let id = r.u64("chunk id")?;
        let seq = r.u64("seq")?;
        let chunk_size = r.u32("chunk size")?;
        if chunk_size == 0 {
            return Err(StoreError::Corrupt("zero chunk size".into()));
        }
        let meta = ObjectMeta::decode(r.take(r.remaining(), "metadata")?)?;
        Ok(Record {
            id,
            seq,
            chunk_size,
            meta,
        })
    }

    fn chunk_count(&self) -> u64 {
        self.meta.body_len.div_ceil(u64::from(self.chunk_size))
    }

    /// Logical bytes this object occupies in the engine (charged to the bound).
    fn footprint(&self, key: &str, record_len: usize) -> u64 {
        let k = key.len() as u64;
        let chunks = self.chunk_count();
        let skeys: u64 = self
            .meta
            .surrogate_keys
            .iter()
            .map(|s| 4 + s.len() as u64 + k + ENTRY_OVERHEAD)
            .sum();
        (k + record_len as u64 + ENTRY_OVERHEAD)
            + self.meta.body_len
            + chunks * (4 + k + 12 + ENTRY_OVERHEAD)
            + 2 * (8 + k + ENTRY_OVERHEAD)
            + skeys
    }
}

fn len_prefixed(a: &[u8], extra: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + a.len() + extra);
    v.extend_from_slice(&u32::try_from(a.len()).unwrap_or(u32::MAX).to_be_bytes());
    v.extend_from_slice(a);
    v
}

fn chunk_prefix(key: &str) -> Vec<u8> {
    len_prefixed(key.as_bytes(), 12)
}

fn chunk_set_prefix(key: &str, id: u64) -> Vec<u8> {
    let mut v = chunk_prefix(key);
    v.extend_from_slice(&id.to_be_bytes());
    v
}

fn chunk_key(key: &str, id: u64, index: u32) -> Vec<u8> {
    let mut v = chunk_set_prefix(key, id);
    v.extend_from_slice(&index.to_be_bytes());
    v
}

/// The chunk set id in a chunk key of `key`.
fn chunk_id_of(chunk_key: &[u8], key: &str) -> Option<u64> {
    let start = 4 + key.len();
    let bytes = chunk_key.get(start..start + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(bytes);
    Some(u64::from_be_bytes(a))
}

fn expiry_key(at: u64, key: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + key.len());
    v.extend_from_slice(&at.to_be_bytes());
    v.extend_from_slice(key.as_bytes());
    v
}

fn surrogate_prefix(skey: &str) -> Vec<u8> {
    len_prefixed(skey.as_bytes(), 0)
}

fn surrogate_key(skey: &str, key: &str) -> Vec<u8> {
    let mut v = len_prefixed(skey.as_bytes(), key.len());
    v.extend_from_slice(key.as_bytes());
    v
}

fn kv_key(ns: &str, key: &str) -> Vec<u8> {
    let mut v = len_prefixed(ns.as_bytes(), key.len());
    v.extend_from_slice(key.as_bytes());
    v
}

fn be_u64(b: &[u8]) -> Option<u64> {
    let mut a = [0u8; 8];
    a.copy_from_slice(b.get(..8)?);
    Some(u64::from_be_bytes(a))
}

fn utf8(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}

/// Why a body could not be read.
enum BodyError {
    /// The stored bytes are wrong (missing chunk, bad length or checksum).
    Corrupt(String),
    /// The engine failed (an I/O error: not evidence of corruption).
    Engine(StoreError),
}

impl From<StoreError> for BodyError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt(why) => BodyError::Corrupt(why),
            other => BodyError::Engine(other),
        }
    }
}

/// Proof that the caller holds the stripe lock of a key.
pub(crate) struct KeyGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

/// Byte and object counters, with the bookkeeping that lets a background
/// recount replace them without losing the changes made meanwhile.
#[derive(Default)]
struct Usage {
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
    /// Counts a change to the object `key`; callers hold its stripe lock.
    fn adjust(&self, key: &str, bytes: i64, objects: i64) {
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

    fn adjust_kv(&self, bytes: i64) {
        self.kv_bytes.fetch_add(bytes, Ordering::Relaxed);
        if self.recounting.load(Ordering::Relaxed) {
            self.delta_kv.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

fn signed(n: u64) -> i64 {
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

/// How long a flush may take before the disk tier is declared stuck.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct DiskTier {
    engine: Arc<dyn DiskEngine>,
    chunk_size: usize,
    capacity: u64,
    max_body: u64,
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
        let usage = Usage::default();
        usage.recounting.store(true, Ordering::Relaxed);
        Ok(DiskTier {
            engine,
            chunk_size: config.chunk_size,
            capacity: config.disk_bytes,
            // A quarter of the bound: one object must not empty the tier.
            max_body: config.disk_bytes / 4,
            kv_limit: config.kv_bytes,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: RandomState::new(),
            usage,
            evict_lock: Mutex::new(()),
            evicted: AtomicU64::new(0),
            corrupt_dropped: AtomicU64::new(0),
            session_first_id,
            degraded: Mutex::new(None),
            stuck: AtomicBool::new(false),
            moved_aside,
        })
    }

    pub(crate) fn max_body(&self) -> u64 {
        self.max_body
    }

    pub(crate) fn lock_key(&self, key: &str) -> KeyGuard<'_> {
        let i = (self.hasher.hash_one(key) as usize) % STRIPES;
        KeyGuard(self.stripes[i].lock())
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &dyn DiskEngine {
        &*self.engine
    }

    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.lock().is_some()
    }

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

    pub(crate) fn size_on_disk(&self) -> u64 {
        self.engine.size_on_disk().unwrap_or(0)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        match &*self.degraded.lock() {
            Some(why) => Err(StoreError::Degraded(why.clone())),
            None => Ok(()),
        }
    }

    /// Records a failed write. sled stops accepting writes for good after an
    /// I/O error in its log; remember that so later writes fail fast.
    fn note_write_error(&self, e: &StoreError) {
        if matches!(e, StoreError::Full | StoreError::Io(_)) {
            // A probe write tells a transient failure from a poisoned engine.
            let probe = self.engine.insert(TreeId::Pending, b"", b"");
            match probe {
                Ok(_) => {
                    let _ = self.engine.remove(TreeId::Pending, b"");
                }
                Err(_) => self.mark_degraded(&e.to_string()),
            }
        }
    }

    // ---- reads ----

    /// Reads and verifies an object. Returns the object and its raw record
    /// (to detect a concurrent change before promoting it to memory).
    /// A corrupt object is dropped and reported as a miss.
    pub(crate) fn get(&self, key: &str) -> Result<Option<(StoredObject, Value)>, StoreError> {
        // A concurrent put or remove can replace the record while we read its
        // chunks; then we read again instead of calling the object corrupt.
        for _ in 0..3 {
            let raw = match self.engine.get(TreeId::Meta, key.as_bytes()) {
                Ok(Some(raw)) => raw,
                Ok(None) => return Ok(None),
                Err(StoreError::Corrupt(why)) => {
                    self.drop_corrupt(key, None, &why);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            let rec = match Record::decode(&raw) {
                Ok(rec) => rec,
                Err(e) => {
                    self.drop_corrupt(key, Some(&raw), &e.to_string());
                    return Ok(None);
                }
            };
            match self.read_body(key, &rec) {
                Ok(body) => {
                    let obj = StoredObject {
                        meta: Arc::new(rec.meta),
                        body,
                    };
                    return Ok(Some((obj, raw)));
                }
                Err(BodyError::Engine(e)) => return Err(e),
                Err(BodyError::Corrupt(why)) => {
                    if self.current_record(key)?.as_ref() != Some(&raw) {
                        continue;
                    }
                    self.drop_corrupt(key, Some(&raw), &why);
                    return Ok(None);
                }
            }
        }
        Ok(None)
    }

    /// The raw record under `key` now.
    pub(crate) fn current_record(&self, key: &str) -> Result<Option<Value>, StoreError> {
        self.engine.get(TreeId::Meta, key.as_bytes())
    }

    fn read_body(&self, key: &str, rec: &Record) -> Result<Bytes, BodyError> {
        let body_len = rec.meta.body_len;
        if body_len > self.max_body.max(self.capacity) {
            return Err(BodyError::Corrupt(format!(
                "body length {body_len} is implausible"
            )));
        }
        let n = rec.chunk_count();
        let chunk_size = u64::from(rec.chunk_size);
        let prefix = chunk_set_prefix(key, rec.id);
        let mut chunks = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut next: u64 = 0;
        for item in self.engine.scan_prefix(TreeId::Chunks, &prefix) {
            let (k, v) = item?;
            let index = k
                .get(prefix.len()..)
                .filter(|s| s.len() == 4)
                .map(|s| u64::from(u32::from_be_bytes([s[0], s[1], s[2], s[3]])));
            if index != Some(next) {
                return Err(BodyError::Corrupt(format!(
                    "chunk {next} of {n} missing or out of order"
                )));
            }
            let expected = if next + 1 < n {
                chunk_size
            } else {
                body_len - chunk_size * next
            };
            if v.len() as u64 != expected {
                return Err(BodyError::Corrupt(format!(
                    "chunk {next} has {} bytes, expected {expected}",
                    v.len()
                )));
            }
            chunks.push(v);
            next += 1;
        }
        if next != n {
            return Err(BodyError::Corrupt(format!(
                "only {next} of {n} chunks present"
            )));
        }
        // A body in one chunk is used as read; more are joined.
        let body = match <[Value; 1]>::try_from(chunks) {
            Ok([only]) => only.into_bytes(),
            Err(chunks) => {
                let mut body = BytesMut::with_capacity(usize::try_from(body_len).unwrap_or(0));
                chunks.iter().for_each(|c| body.extend_from_slice(c));
                body.freeze()
            }
        };
        if crc32fast::hash(&body) != rec.meta.checksum {
            return Err(BodyError::Corrupt("body checksum mismatch".into()));
        }
        Ok(body)
    }

    /// Drops an object that failed verification: logs it, removes the record
    /// if it is still the one read (`raw`; `None`: unreadable) and its chunks.
    fn drop_corrupt(&self, key: &str, raw: Option<&Value>, why: &str) {
        let g = self.lock_key(key);
        self.drop_corrupt_locked(&g, key, raw, why);
    }

    fn drop_corrupt_locked(&self, g: &KeyGuard<'_>, key: &str, raw: Option<&Value>, why: &str) {
        tracing::warn!(key = %key.escape_debug(), reason = %why, "dropping corrupt cache object");
        self.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
        let removed = match raw {
            Some(raw) => self
                .engine
                .compare_and_swap(TreeId::Meta, key.as_bytes(), Some(raw), None)
                .unwrap_or(false),
            None => self.engine.remove(TreeId::Meta, key.as_bytes()).is_ok(),
        };
        if !removed {
            return;
        }
        let rec = raw.and_then(|r| Record::decode(r).ok());
        match rec {
            Some(rec) => {
                let len = raw.map_or(0, |r| r.len());
                if let Err(e) = self.delete_object_parts(g, key, &rec, None) {
                    tracing::warn!(key = %key.escape_debug(), error = %e, "could not delete parts of a corrupt object");
                }
                self.usage.adjust(key, -signed(rec.footprint(key, len)), -1);
            }
            None => {
                // Unknown id: delete every chunk set of the key (no other
                // writer runs: we hold the key's stripe).
                let freed = self.delete_chunks_except(g, key, None).unwrap_or(0);
                let len = raw.map_or(0, |r| r.len()) as u64;
                self.usage
                    .adjust(key, -signed(freed + len + key.len() as u64), -1);
            }
        }
    }

    // ---- writes (caller holds the key's stripe) ----

    /// Stores a sealed object (body_len and checksum filled).
    pub(crate) fn put_locked(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        meta: &ObjectMeta,
        body: &[u8],
    ) -> Result<(), StoreError> {
        self.check_writable()?;
        if body.len() as u64 > self.max_body {
            return Err(StoreError::TooLarge {
                what: "body",
                len: body.len() as u64,
                limit: self.max_body,
            });
        }
        let result = self.put_inner(g, key, meta, body);
        if let Err(e) = &result {
            self.note_write_error(e);
        }
        result
    }

    fn put_inner(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        meta: &ObjectMeta,
        body: &[u8],
    ) -> Result<(), StoreError> {
        let id = self.engine.generate_id()?;
        let pending = id.to_be_bytes();
        self.engine
            .insert(TreeId::Pending, &pending, key.as_bytes())?;
        match self.write_object(g, key, id, meta, body) {
            Ok(clean) => {
                if clean {
                    // Left in place when cleanup failed: the next open finishes it.
                    let _ = self.engine.remove(TreeId::Pending, &pending);
                }
                Ok(())
            }
            Err(e) => {
                // Best effort: on a full disk deletes can fail too; the
                // pending entry then lets the next open clean up.
                let prefix = chunk_set_prefix(key, id);
                let mut cleaned = true;
                let keys: Vec<Value> = self
                    .engine
                    .scan_prefix(TreeId::Chunks, &prefix)
                    .map_while(Result::ok)
                    .map(|(k, _)| k)
                    .collect();
                for k in keys {
                    cleaned &= self.engine.remove(TreeId::Chunks, &k).is_ok();
                }
                if cleaned {
                    let _ = self.engine.remove(TreeId::Pending, &pending);
                }
                Err(e)
            }
        }
    }

    /// Steps 2-5 of a put. Returns whether the replaced object was fully
    /// cleaned up.
    fn write_object(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        id: u64,
        meta: &ObjectMeta,
        body: &[u8],
    ) -> Result<bool, StoreError> {
        for (i, chunk) in body.chunks(self.chunk_size).enumerate() {
            let index = u32::try_from(i).map_err(|_| StoreError::TooLarge {
                what: "body",
                len: body.len() as u64,
                limit: self.max_body,
            })?;
            self.engine
                .insert(TreeId::Chunks, &chunk_key(key, id, index), chunk)?;
        }
        let rec = Record {
            id,
            seq: 0,
            chunk_size: u32::try_from(self.chunk_size).unwrap_or(u32::MAX),
            meta: meta.clone(),
        };
        self.commit_record(g, key, rec, None)
    }

    /// Writes the index entries of `rec` (with a fresh FIFO seq), then the
    /// record (atomically replacing `expect` if given, else whatever is
    /// there), then cleans up after the replaced record. Returns whether the
    /// cleanup was complete. Fails with `Ok(false)`-free semantics: a lost
    /// compare-and-swap is reported as [`StoreError::Engine`].
    fn commit_record(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        mut rec: Record,
        expect: Option<&Value>,
    ) -> Result<bool, StoreError> {
        rec.seq = self.engine.generate_id()?;
        self.engine
            .insert(TreeId::Fifo, &rec.seq.to_be_bytes(), key.as_bytes())?;
        self.engine.insert(
            TreeId::Expiry,
            &expiry_key(rec.meta.removable_at_ms(), key),
            &[],
        )?;
        for sk in &rec.meta.surrogate_keys {
            self.engine
                .insert(TreeId::Surrogate, &surrogate_key(sk, key), &[])?;
        }
        let raw = rec.encode();
        let inserted;
        let old = match expect {
            None => {
                inserted = self.engine.insert(TreeId::Meta, key.as_bytes(), &raw)?;
                inserted.as_ref()
            }
            Some(old) => {
                if !self.engine.compare_and_swap(
                    TreeId::Meta,
                    key.as_bytes(),
                    Some(old),
                    Some(&raw),
                )? {
                    let _ = self.engine.remove(TreeId::Fifo, &rec.seq.to_be_bytes());
                    return Err(StoreError::Engine("record changed during an update".into()));
                }
                Some(old)
            }
        };
        self.usage
            .adjust(key, signed(rec.footprint(key, raw.len())), 1);
        let Some(old) = old else {
            return Ok(true);
        };
        Ok(self.cleanup_replaced(g, key, old, &rec))
    }

    /// Deletes what the replaced record `old` had and `new` does not.
    fn cleanup_replaced(&self, g: &KeyGuard<'_>, key: &str, old: &Value, new: &Record) -> bool {
        match Record::decode(old) {
            Ok(old_rec) => {
                self.usage
                    .adjust(key, -signed(old_rec.footprint(key, old.len())), -1);
                self.delete_object_parts(g, key, &old_rec, Some(new))
                    .is_ok()
            }
            Err(_) => {
                let freed = self.delete_chunks_except(g, key, Some(new.id));
                self.usage.adjust(key, -signed(old.len() as u64), -1);
                freed.is_ok()
            }
        }
    }

    /// Deletes the chunks and index entries of `rec`, except those shared
    /// with `keep` (the record replacing it).
    fn delete_object_parts(
        &self,
        _g: &KeyGuard<'_>,
        key: &str,
        rec: &Record,
        keep: Option<&Record>,
    ) -> Result<(), StoreError> {
        if keep.is_none_or(|k| k.id != rec.id) {
            for i in 0..rec.chunk_count() {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                self.engine
                    .remove(TreeId::Chunks, &chunk_key(key, rec.id, index))?;
            }
        }
        if keep.is_none_or(|k| k.seq != rec.seq) {
            self.engine.remove(TreeId::Fifo, &rec.seq.to_be_bytes())?;
        }
        let at = rec.meta.removable_at_ms();
        if keep.is_none_or(|k| k.meta.removable_at_ms() != at) {
            self.engine.remove(TreeId::Expiry, &expiry_key(at, key))?;
        }
        let kept: HashSet<&str> = keep
            .map(|k| k.meta.surrogate_keys.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for sk in &rec.meta.surrogate_keys {
            if !kept.contains(sk.as_str()) {
                self.engine
                    .remove(TreeId::Surrogate, &surrogate_key(sk, key))?;
            }
        }
        Ok(())
    }

    /// Deletes every chunk of `key` whose set id is not `keep`; returns the
    /// bytes freed.
    fn delete_chunks_except(
        &self,
        _g: &KeyGuard<'_>,
        key: &str,
        keep: Option<u64>,
    ) -> Result<u64, StoreError> {
        let mut doomed = Vec::new();
        for item in self.engine.scan_prefix(TreeId::Chunks, &chunk_prefix(key)) {
            let (k, v) = item?;
            if chunk_id_of(&k, key) != keep || keep.is_none() {
                doomed.push((k, v.len() as u64));
            }
        }
        let mut freed = 0;
        for (k, len) in doomed {
            self.engine.remove(TreeId::Chunks, &k)?;
            freed += len + k.len() as u64 + ENTRY_OVERHEAD;
        }
        Ok(freed)
    }

    /// Replaces the metadata of a stored object, keeping its body. Returns
    /// the new metadata, or `None` if the key is not on disk.
    pub(crate) fn update_meta_locked(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        f: impl FnOnce(&ObjectMeta) -> ObjectMeta,
    ) -> Result<Option<Arc<ObjectMeta>>, StoreError> {
        self.check_writable()?;
        let Some(raw) = self.engine.get(TreeId::Meta, key.as_bytes())? else {
            return Ok(None);
        };
        let old = match Record::decode(&raw) {
            Ok(r) => r,
            Err(e) => {
                self.drop_corrupt_locked(g, key, Some(&raw), &e.to_string());
                return Ok(None);
            }
        };
        let mut meta = f(&old.meta);
        meta.body_len = old.meta.body_len;
        meta.checksum = old.meta.checksum;
        let rec = Record {
            id: old.id,
            seq: 0,
            chunk_size: old.chunk_size,
            meta: meta.clone(),
        };
        // A refresh moves the object to the back of the FIFO: it is in use.
        let result = self.commit_record(g, key, rec, Some(&raw));
        if let Err(e) = &result {
            self.note_write_error(e);
        }
        result?;
        Ok(Some(Arc::new(meta)))
    }

    /// Removes an object. Returns whether it existed. Not flushed.
    pub(crate) fn remove_locked(&self, g: &KeyGuard<'_>, key: &str) -> Result<bool, StoreError> {
        // Removal is allowed in degraded mode: it may still succeed, and a
        // purge must try.
        let Some(raw) = self.engine.remove(TreeId::Meta, key.as_bytes())? else {
            return Ok(false);
        };
        match Record::decode(&raw) {
            Ok(rec) => {
                self.usage
                    .adjust(key, -signed(rec.footprint(key, raw.len())), -1);
                if let Err(e) = self.delete_object_parts(g, key, &rec, None) {
                    self.remember_orphans(key);
                    return Err(e);
                }
            }
            Err(_) => {
                let freed = self.delete_chunks_except(g, key, None).unwrap_or(0);
                self.usage.adjust(
                    key,
                    -signed(freed + raw.len() as u64 + key.len() as u64),
                    -1,
                );
            }
        }
        Ok(true)
    }

    /// After a partly failed removal: a pending entry makes the next open
    /// delete the remaining chunks.
    fn remember_orphans(&self, key: &str) {
        if let Ok(id) = self.engine.generate_id() {
            let _ = self
                .engine
                .insert(TreeId::Pending, &id.to_be_bytes(), key.as_bytes());
        }
    }

    // ---- queries ----

    /// Keys of objects whose key starts with `prefix`.
    pub(crate) fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for item in self.engine.scan_prefix(TreeId::Meta, prefix.as_bytes()) {
            let (k, _) = item?;
            if let Some(k) = utf8(&k) {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Keys of objects tagged `skey`. Stale index entries (their object is
    /// gone or no longer tagged) are dropped on the way.
    pub(crate) fn keys_for_surrogate(&self, skey: &str) -> Result<Vec<String>, StoreError> {
        let prefix = surrogate_prefix(skey);
        let entries: Vec<Value> = self
            .engine
            .scan_prefix(TreeId::Surrogate, &prefix)
            .map(|r| r.map(|(k, _)| k))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::new();
        for entry in entries {
            let Some(key) = entry.get(prefix.len()..).and_then(utf8) else {
                let _ = self.engine.remove(TreeId::Surrogate, &entry);
                continue;
            };
            let tagged = match self.engine.get(TreeId::Meta, key.as_bytes())? {
                Some(raw) => Record::decode(&raw)
                    .map(|r| r.meta.surrogate_keys.iter().any(|s| s == skey))
                    .unwrap_or(false),
                None => false,
            };
            if tagged {
                out.push(key);
            } else {
                let g = self.lock_key(&key);
                // Re-check under the lock: a put may have just tagged it.
                let still_stale = match self.engine.get(TreeId::Meta, key.as_bytes())? {
                    Some(raw) => !Record::decode(&raw)
                        .map(|r| r.meta.surrogate_keys.iter().any(|s| s == skey))
                        .unwrap_or(false),
                    None => true,
                };
                if still_stale {
                    let _ = self.engine.remove(TreeId::Surrogate, &entry);
                } else {
                    out.push(key);
                }
                drop(g);
            }
        }
        Ok(out)
    }

    // ---- maintenance ----

    /// Removes objects removable at `now`; returns how many.
    pub(crate) fn sweep_expired(&self, now: u64) -> Result<u64, StoreError> {
        let mut removed = 0;
        let mut start = Vec::new();
        loop {
            let batch: Vec<Value> = self
                .engine
                .range_from(TreeId::Expiry, &start)
                .take(BATCH)
                .map(|r| r.map(|(k, _)| k))
                .collect::<Result<_, _>>()?;
            let Some(last) = batch.last() else { break };
            start = last.to_vec();
            start.push(0);
            let mut done = false;
            for entry in &batch {
                let Some(at) = be_u64(entry) else {
                    let _ = self.engine.remove(TreeId::Expiry, entry);
                    continue;
                };
                if at > now {
                    done = true;
                    break;
                }
                let Some(key) = entry.get(8..).and_then(utf8) else {
                    let _ = self.engine.remove(TreeId::Expiry, entry);
                    continue;
                };
                let g = self.lock_key(&key);
                let current = self.engine.get(TreeId::Meta, key.as_bytes())?;
                let due = current
                    .as_ref()
                    .and_then(|raw| Record::decode(raw).ok())
                    .map(|r| r.meta.removable_at_ms() <= now);
                match due {
                    Some(true) => removed += u64::from(self.remove_locked(&g, &key)?),
                    // Unreadable: a corrupt record is removable at any time.
                    None if current.is_some() => {
                        self.drop_corrupt_locked(
                            &g,
                            &key,
                            current.as_ref(),
                            "unreadable record found by the sweeper",
                        );
                    }
                    _ => {}
                }
                // Stale entry (object gone or refreshed) or already removed.
                self.engine.remove(TreeId::Expiry, entry)?;
            }
            if done {
                break;
            }
        }
        Ok(removed)
    }

    /// Evicts objects in FIFO order while the tier is over its bound, down to
    /// 90 % of it. Only one thread evicts at a time; others return at once.
    pub(crate) fn evict_to_bound(&self) -> Result<u64, StoreError> {
        if unsigned(&self.usage.bytes) <= self.capacity {
            return Ok(0);
        }
        let Some(_evicting) = self.evict_lock.try_lock() else {
            return Ok(0);
        };
        let target = self.capacity / 10 * 9;
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

    /// After a crash: deletes the chunks of writes that never completed (and
    /// leftovers of replaced objects), as recorded in the pending tree.
    pub(crate) fn recover_pending(&self) -> Result<u64, StoreError> {
        let entries: Vec<(Value, Value)> = self
            .engine
            .range_from(TreeId::Pending, &[])
            .collect::<Result<_, _>>()?;
        let mut cleaned = 0;
        for (idk, key) in entries {
            let Some(id) = be_u64(&idk) else {
                let _ = self.engine.remove(TreeId::Pending, &idk);
                continue;
            };
            if id >= self.session_first_id {
                continue; // a write of this session, maybe in flight
            }
            let Some(key) = utf8(&key) else {
                self.engine.remove(TreeId::Pending, &idk)?;
                continue;
            };
            let g = self.lock_key(&key);
            let current = self
                .engine
                .get(TreeId::Meta, key.as_bytes())?
                .and_then(|raw| Record::decode(&raw).ok())
                .map(|r| r.id);
            let freed = self.delete_chunks_except(&g, &key, current)?;
            if freed > 0 {
                cleaned += 1;
            }
            self.engine.remove(TreeId::Pending, &idk)?;
        }
        if cleaned > 0 {
            tracing::info!(cleaned, "removed chunks of writes interrupted by a crash");
        }
        Ok(cleaned)
    }

    /// Recomputes the byte and object counters from the trees (run in the
    /// background after open; changes made meanwhile are kept).
    pub(crate) fn recount(&self, stop: &AtomicBool) -> Result<(), StoreError> {
        let u = &self.usage;
        {
            let mut scanned = u.scanned.lock();
            *scanned = Scanned::Nothing;
            u.delta_bytes.store(0, Ordering::Relaxed);
            u.delta_objects.store(0, Ordering::Relaxed);
            u.delta_kv.store(0, Ordering::Relaxed);
            u.recounting.store(true, Ordering::Relaxed);
        }
        let mut bytes = 0u64;
        let mut objects = 0u64;
        // A fresh iterator for every key: one opened earlier may not see a
        // key inserted just ahead of it, which the deltas do not count.
        let mut from = Vec::new();
        loop {
            let Some(item) = self.engine.range_from(TreeId::Meta, &from).next() else {
                break;
            };
            let (k, _) = item?;
            from = k.to_vec();
            from.push(0);
            // Checked now and then so a store dropped during a long count
            // does not wait for it.
            if objects.is_multiple_of(1024) && stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            // Under the key's lock, no write of it is between its change
            // and its `adjust`: counted here or in the deltas, never both.
            let key = String::from_utf8_lossy(&k).into_owned();
            let _g = self.lock_key(&key);
            if let Some(raw) = self.engine.get(TreeId::Meta, &k)? {
                objects += 1;
                bytes += match Record::decode(&raw) {
                    Ok(rec) => rec.footprint(&key, raw.len()),
                    Err(_) => (k.len() + raw.len()) as u64,
                };
            }
            *u.scanned.lock() = Scanned::UpTo(k.to_vec());
        }
        *u.scanned.lock() = Scanned::All;
        let mut kv = 0u64;
        for item in self.engine.range_from(TreeId::Kv, &[]) {
            let (k, v) = item?;
            kv += KV_ENTRY_OVERHEAD + (k.len() + v.len()) as u64;
        }
        let _scanned = u.scanned.lock();
        u.bytes.store(
            signed(bytes) + u.delta_bytes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        u.objects.store(
            signed(objects) + u.delta_objects.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        u.kv_bytes.store(
            signed(kv) + u.delta_kv.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        u.recounting.store(false, Ordering::Relaxed);
        u.counted.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Makes completed writes durable. sled's flush can block forever after
    /// some write failures, so it runs on a helper thread with a timeout;
    /// on timeout the tier is marked degraded and later flushes are skipped.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.check_writable()?;
        let (tx, rx) = mpsc::channel();
        let engine = self.engine.clone();
        std::thread::Builder::new()
            .name("inlay-store-flush".into())
            .spawn(move || {
                let result = engine.flush();
                // Release the engine before answering: once the caller has
                // the answer, dropping the store must really close it (and
                // free its file lock for a reopen).
                drop(engine);
                let _ = tx.send(result);
            })
            .map_err(from_io)?;
        match rx.recv_timeout(FLUSH_TIMEOUT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.note_write_error(&e);
                Err(e)
            }
            Err(_) => {
                let why = format!("flush did not complete within {FLUSH_TIMEOUT:?}");
                self.stuck.store(true, Ordering::Relaxed);
                self.mark_degraded(&why);
                Err(StoreError::Degraded(why))
            }
        }
    }

    fn mark_degraded(&self, why: &str) {
        let mut d = self.degraded.lock();
        if d.is_none() {
            tracing::error!(
                reason = why,
                "disk tier refuses writes until restart; serving without disk writes"
            );
            *d = Some(why.to_string());
        }
    }

    // ---- kv ----

    pub(crate) fn kv_get(&self, ns: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        let k = kv_key(ns, key);
        let Some(v) = self.engine.get(TreeId::Kv, &k)? else {
            return Ok(None);
        };
        match decode_kv(&v) {
            Some(value) => Ok(Some(Bytes::copy_from_slice(value))),
            None => {
                tracing::warn!(ns, key, "dropping corrupt kv record");
                self.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
                if self
                    .engine
                    .compare_and_swap(TreeId::Kv, &k, Some(&v), None)?
                {
                    self.usage.adjust_kv(-signed(kv_stored_size(&k, &v)));
                }
                Ok(None)
            }
        }
    }

    pub(crate) fn kv_set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.check_writable()?;
        let k = kv_key(ns, key);
        let mut v = Vec::with_capacity(4 + value.len());
        v.extend_from_slice(&crc32fast::hash(value).to_be_bytes());
        v.extend_from_slice(value);
        let old = self.engine.get(TreeId::Kv, &k)?;
        let old_size = old.as_ref().map_or(0, |o| kv_stored_size(&k, o));
        if unsigned(&self.usage.kv_bytes) + kv_stored_size(&k, &v) > self.kv_limit + old_size {
            return Err(StoreError::Full);
        }
        match self.engine.insert(TreeId::Kv, &k, &v) {
            Ok(replaced) => {
                let replaced = replaced.map_or(0, |r| kv_stored_size(&k, &r));
                self.usage
                    .adjust_kv(signed(kv_stored_size(&k, &v)) - signed(replaced));
                Ok(())
            }
            Err(e) => {
                self.note_write_error(&e);
                Err(e)
            }
        }
    }

    pub(crate) fn kv_delete(&self, ns: &str, key: &str) -> Result<bool, StoreError> {
        let k = kv_key(ns, key);
        match self.engine.remove(TreeId::Kv, &k)? {
            Some(v) => {
                self.usage.adjust_kv(-signed(kv_stored_size(&k, &v)));
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Overhead charged per kv entry on disk (same as in memory).
const KV_ENTRY_OVERHEAD: u64 = crate::memory::KV_OVERHEAD;

/// Size charged for a stored kv entry.
fn kv_stored_size(k: &[u8], v: &[u8]) -> u64 {
    KV_ENTRY_OVERHEAD + (k.len() + v.len()) as u64
}

fn decode_kv(v: &[u8]) -> Option<&[u8]> {
    let (crc, value) = (v.get(..4)?, v.get(4..)?);
    (crc32fast::hash(value).to_be_bytes() == crc).then_some(value)
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        if self.stuck.load(Ordering::Relaxed) {
            // sled's own drop flushes and would block forever on the stuck
            // log; leaking the engine lets the process shut down.
            std::mem::forget(self.engine.clone());
        }
    }
}
