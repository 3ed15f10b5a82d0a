//! Inlay's object store: a bounded memory tier in front of an optional disk
//! tier on sled.
//!
//! # Model
//!
//! An object is a response body plus its [`ObjectMeta`], stored under a
//! string key the host builds as `<primary>\u{1}<variant>` (primary: hash of
//! host, URL and policy additions; variant: the Vary values). Beside the
//! objects, [`KvStore`] keeps small records (policy state) by namespace.
//!
//! Both traits are synchronous and safe to call from many threads. Every
//! call that may reach the disk tier blocks on I/O, so async code runs it
//! on a blocking thread (`spawn_blocking`); [`ObjectStore::peek`] answers
//! from memory alone, never touching the disk, and
//! [`ObjectStore::get_nowait`] also from the disk tier when its bytes are
//! in the page cache (`RWF_NOWAIT`), so a reactor thread serves those hits
//! itself and sends only the rest ([`Peek::NotResident`]) to `get` on a
//! blocking thread (a hop costs more CPU than a disk-tier hit from the page
//! cache). Each trait's docs list its blocking calls.
//!
//! * **Memory tier** ([`MemoryStore`]): a `quick_cache` (CLOCK-PRO style,
//!   weighted by bytes) plus ordered indexes for prefix purge, surrogate keys
//!   and expiry. Used alone it is the memory-only store.
//! * **Disk tier** (inside [`TieredStore`]): sled 0.34, behind the internal
//!   `DiskEngine` trait so the engine can be swapped. A small body (up to
//!   `inline_body_bytes`, 4 KiB by default) is stored inside its metadata
//!   record: one sled read per hit, no file per object. Larger bodies are
//!   split in chunks (1 MiB by default), each a file of its own under
//!   `<dir>/chunks/` with a pointer in sled's `chunks` tree (sled keeps
//!   what it reads in memory and replays its log at open, so bulk bytes stay
//!   out of it; files of 256 KiB or more are memory-mapped when read, so
//!   the body reaches the socket with one copy); the metadata record is written last, so a torn write leaves no record or a record whose chunks
//!   fail verification. Every body carries a CRC-32 and every record carries
//!   its own: a corrupt, torn or partial object is a miss, is removed and is
//!   logged at `warn`. Objects load lazily (no scan at open); byte counters
//!   are recomputed, and chunk files a crash left without a pointer are
//!   deleted, by a background thread after the open (so the time to the
//!   first hit does not grow with the number of objects). A database that will not open is
//!   moved aside to `<dir>.corrupt-<unix_ts>` and a fresh one is created.
//!
//! # Disk layout (sled trees)
//!
//! | tree | key | value |
//! |---|---|---|
//! | `meta` | object key | record version 1: magic, CRC, chunk id, FIFO seq, chunk size, [`ObjectMeta`]; version 2: magic, CRC, id, FIFO seq, length of the [`ObjectMeta`], the [`ObjectMeta`], the inline body |
//! | `chunks` | len(key) · key · chunk id · index | pointer: file id, length (the bytes are in `chunks/<xx>/<file id>`) |
//! | `fifo` | seq | object key (eviction order) |
//! | `expiry` | removable_at · object key | empty |
//! | `surrogate` | len(tag) · tag · object key | empty |
//! | `kv` | len(ns) · ns · key | CRC · value |
//! | `pending` | chunk id | object key (writes in flight, cleaned after a crash) |
//! | `bans` | ban id | CRC · ban record (the cache's bans, outside the kv budget) |
//!
//! # sled's limits and what we do about them
//!
//! * sled keeps about what it has read or written in memory, whatever
//!   `cache_capacity` says, and replays its log at open: with bodies inline
//!   the VOD benchmark measured 1.6 GiB resident above the memory tier and
//!   1.4 s from a restart to the first hit. Chunk files keep sled to small
//!   records and pointers; only bodies up to `inline_body_bytes` (4 KiB,
//!   at most 16 KiB) go inline, and a tier of small objects then takes far
//!   less disk than with a file per body (1.1 GiB instead of 5.2 GiB for
//!   1M objects of 200 B, `loadtests/reports/scale.md`);
//! * any log item over a quarter of a segment (a big value, or a whole leaf
//!   node of ~17 values) becomes a blob file of its own, and a blob write
//!   that fails with ENOSPC leaks a reservation that hangs every later
//!   `flush` forever. Hence 4 MiB segments and 32 KiB limits on metadata
//!   and kv values: no node comes near the 1 MiB threshold;
//! * sled's files grow to a multiple of its live data: `disk_bytes` bounds
//!   the logical data (keys, records, bodies), and bodies, now in their own
//!   files, take their size (plus the file system's block rounding);
//! * fsync is periodic (`flush_every_ms`): the last window of writes can be
//!   lost in a crash (they come back as misses, never as damaged objects);
//!   purges and removals flush before returning, so a purged object never
//!   comes back;
//! * after ENOSPC sled refuses writes until reopened: the disk tier turns
//!   read-only ([`StoreError::Degraded`]), `put` fails fast, reads keep
//!   working and the host serves uncached; a restart with space available
//!   recovers. A flush that does not finish within 10 s marks the tier
//!   degraded too, instead of hanging the caller;
//! * a database sled cannot open (corruption, even a panic inside sled) is
//!   moved aside; a locked one ([`StoreError::Locked`], after waiting 2 s
//!   for a lock being released), a full disk ([`StoreError::Full`]) or an
//!   error of the system ([`StoreError::Open`]: EACCES, EMFILE, ENOTDIR, a
//!   file where the directory should be...) is not, and `open` fails,
//!   leaving the directory as it was.
//!
//! # Cost (criterion, `cargo bench -p inlay-storage --bench store`, 2 shared cores; measured with the chunks inside sled, before chunk files)
//!
//! | operation | 16 KiB | 1 MiB |
//! |---|---|---|
//! | memory hit | ~0.2 µs | ~0.2 µs |
//! | disk hit (read, verify, copy) | ~4 µs | ~80 µs |
//! | put, memory only | ~3 µs | ~50 µs |
//! | put with disk (no fsync) | ~100 µs | ~10 ms |
//!
//! Disk paths block: call them from `spawn_blocking` in async code; a hit
//! through [`ObjectStore::peek`] or [`ObjectStore::get_nowait`] does not.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use inlay_storage::{ObjectMeta, ObjectStore, Peek, StoreConfig, TieredStore, now_ms};
//!
//! let store = TieredStore::open(StoreConfig::memory_only(64 << 20))?;
//! let meta = ObjectMeta {
//!     status: 200,
//!     stored_at_ms: now_ms(),
//!     ttl_ms: 60_000,
//!     surrogate_keys: vec!["product-42".into()],
//!     ..ObjectMeta::default()
//! };
//! store.put("3f9a\u{1}gzip", meta, Bytes::from_static(b"hello"))?;
//! // On a reactor thread: memory answers; only `NotResident` needs `get`.
//! let Peek::Hit(hit) = store.peek("3f9a\u{1}gzip") else {
//!     unreachable!("just stored, and memory-only");
//! };
//! assert_eq!(hit.body, "hello");
//! assert!(hit.meta.is_fresh(now_ms()));
//! assert_eq!(store.purge_surrogate("product-42", false)?, 1);
//! assert!(store.get("3f9a\u{1}gzip")?.is_none());
//! # Ok::<(), inlay_storage::StoreError>(())
//! ```

mod codec;
mod config;
mod disk;
mod engine;
mod error;
mod memory;
mod meta;
mod tiered;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;

pub use config::{MAX_CHUNK_SIZE, MAX_INLINE_BODY, MIN_CHUNK_SIZE, StoreConfig};
pub use error::StoreError;
pub use memory::MemoryStore;
pub use meta::{ObjectMeta, StoredObject};
pub use tiered::TieredStore;

/// Longest accepted object key in bytes.
pub const MAX_KEY_LEN: usize = 8 * 1024;
/// Longest accepted surrogate key in bytes.
pub const MAX_SURROGATE_KEY_LEN: usize = 1024;
/// Most surrogate keys accepted on one object.
pub const MAX_SURROGATE_KEYS: usize = 1024;
/// Longest accepted kv namespace or kv key in bytes.
pub const MAX_KV_KEY_LEN: usize = 1024;
/// Largest accepted kv value in bytes (at most the chunk size, so kv nodes
/// stay under sled's blob threshold too).
pub const MAX_KV_VALUE_LEN: usize = 32 * 1024;
/// Largest accepted metadata (headers, keys) of one object, for the same
/// reason.
pub const MAX_META_LEN: usize = 32 * 1024;

/// The operations the host needs from an object store.
///
/// Reads never return corrupt data: anything that fails verification is a
/// miss. Writes either complete or return an error and leave the previous
/// object (if any) readable.
///
/// # Blocking
///
/// With a disk tier, every method that may reach it blocks on file and
/// sled I/O: `get` (after a memory miss), `put`, `update_meta`, `remove`,
/// `remove_prefix`, `soft_purge_prefix`, `keys_for_surrogate`,
/// `purge_surrogate`, `sweep_expired`, `flush`, and `stats` (it reads the
/// size of sled's files). Async code calls them on a blocking thread
/// (`spawn_blocking`). [`peek`](ObjectStore::peek) and `max_object_bytes`
/// never touch the disk, and [`get_nowait`](ObjectStore::get_nowait)
/// never waits for it, so they may run on a reactor thread; without a disk
/// tier no method does I/O.
pub trait ObjectStore: Send + Sync {
    /// Looks up an object: memory first, then disk (promoting it to memory).
    /// Objects past their keep window are misses. May block on disk I/O.
    fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError>;

    /// Looks up an object in the memory tier alone, never touching the
    /// disk, so a reactor thread can serve memory hits itself and send only
    /// [`Peek::NotResident`] keys to `get` on a blocking thread.
    ///
    /// Counts in [`StoreStats`] as `get` would: a hit is a memory hit,
    /// [`Peek::Absent`] a miss; [`Peek::NotResident`] counts nothing, the
    /// `get` that follows counts the outcome.
    fn peek(&self, key: &str) -> Peek;

    /// Looks up an object without waiting for the disk device: memory
    /// first, then the disk tier if its bytes are in the page cache
    /// (`preadv2` with `RWF_NOWAIT`; the record and chunk pointers come
    /// from sled, which keeps what it has read in memory). A hit from disk
    /// is promoted to memory as by `get`. [`Peek::NotResident`] means the
    /// read would wait (or failed): call `get` on a blocking thread, which
    /// counts the lookup; the other answers count as `get` would.
    ///
    /// The default is [`peek`](ObjectStore::peek): memory alone.
    fn get_nowait(&self, key: &str) -> Peek {
        self.peek(key)
    }

    /// Stores an object, replacing any previous one under `key`. Fills
    /// `body_len` and `checksum` and returns the stored metadata.
    fn put(
        &self,
        key: &str,
        meta: ObjectMeta,
        body: Bytes,
    ) -> Result<std::sync::Arc<ObjectMeta>, StoreError>;

    /// Replaces the metadata of a stored object and keeps its body (for a
    /// 304 revalidation). `body_len` and `checksum` of `meta` are ignored.
    /// Returns whether the object existed.
    fn update_meta(&self, key: &str, meta: ObjectMeta) -> Result<bool, StoreError>;

    /// Removes one object durably. Returns whether it existed.
    fn remove(&self, key: &str) -> Result<bool, StoreError>;

    /// Removes every object whose key starts with `prefix` (all variants of
    /// a URL: `<primary>\u{1}`), durably. Returns how many were removed.
    fn remove_prefix(&self, prefix: &str) -> Result<u64, StoreError>;

    /// Marks every object whose key starts with `prefix` stale (expired now,
    /// grace and keep kept). Returns how many were marked.
    fn soft_purge_prefix(&self, prefix: &str) -> Result<u64, StoreError>;

    /// Keys of the objects tagged with surrogate key `skey`.
    fn keys_for_surrogate(&self, skey: &str) -> Result<Vec<String>, StoreError>;

    /// Removes (or with `soft`, marks stale) every object tagged with
    /// `skey`. Returns how many objects were affected.
    fn purge_surrogate(&self, skey: &str, soft: bool) -> Result<u64, StoreError>;

    /// Removes every object removable at `now_ms`; returns how many.
    fn sweep_expired(&self, now_ms: u64) -> Result<u64, StoreError>;

    /// Up to `limit` objects of both tiers whose keys sort after `after`
    /// (from the first with `None`), in key order, with their metadata:
    /// a walk over the whole store in batches (the cache's ban lurker).
    /// Objects stored or removed during a walk may or may not be seen;
    /// every object present for the whole walk is. Blocks on the disk.
    fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, std::sync::Arc<ObjectMeta>)>, StoreError>;

    /// Removes each object under its key if it was created (`created_ms`)
    /// at or before the time given with it, durably (one flush for all):
    /// an object stored under the key since then stays. Returns how many
    /// were removed. The default reads, then removes (not atomic); the
    /// stores of this crate check and remove under the key's lock.
    fn remove_created_by(&self, keys: &[(String, u64)]) -> Result<u64, StoreError> {
        let mut n = 0;
        for (k, by) in keys {
            if self.get(k)?.is_some_and(|o| o.meta.created_ms <= *by) {
                n += u64::from(self.remove(k)?);
            }
        }
        Ok(n)
    }

    /// The ban records persisted beside the objects, in id order (see
    /// [`ban_put`](ObjectStore::ban_put)). A store without a disk tier
    /// persists none.
    fn ban_records(&self) -> Result<Vec<BanRecord>, StoreError> {
        Ok(Vec::new())
    }

    /// Persists a ban record (opaque bytes, at most [`MAX_KV_VALUE_LEN`]),
    /// durably before returning, outside the kv budget. A store without a
    /// disk tier keeps nothing (the cache holds its bans in memory).
    fn ban_put(&self, _id: u64, _data: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }

    /// Deletes ban records that are no longer needed.
    fn ban_remove(&self, _ids: &[u64]) -> Result<(), StoreError> {
        Ok(())
    }

    /// The largest body `put` accepts, so the host can stop buffering a
    /// response that will not be stored.
    fn max_object_bytes(&self) -> u64;

    /// A snapshot of sizes and counters.
    fn stats(&self) -> StoreStats;

    /// Makes every completed write durable (fsync).
    fn flush(&self) -> Result<(), StoreError>;
}

/// A ban record read back from the disk tier ([`ObjectStore::ban_records`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanRecord {
    /// The id it was written under.
    pub id: u64,
    /// Its bytes; `None` when they failed their checksum.
    pub data: Option<Bytes>,
}

/// What the memory tier alone says about a key ([`ObjectStore::peek`]).
#[derive(Debug, Clone)]
pub enum Peek {
    /// The object, from memory (same checks as `get`: keep window, etc.).
    Hit(StoredObject),
    /// Definitely absent: no disk tier could hold it either.
    Absent,
    /// Not in memory; the disk tier may have it: call `get` (on a blocking
    /// thread). An invalid key is `NotResident` too, so `get` reports it.
    NotResident,
}

/// Small persistent records by namespace and key: policies' state (one
/// namespace per policy). The cache keeps nothing here (a URL's Vary names
/// live in a variants-header object beside its variants), so `kv_bytes`
/// is the policies' own budget.
///
/// Records are bounded by `kv_bytes` of the config. With a disk tier they
/// live on disk only (the memory tier holds no copy): every call reads or
/// writes sled and may block, so async code calls them on a blocking
/// thread (`spawn_blocking`). Without a disk tier they are held in memory
/// and no call does I/O.
pub trait KvStore: Send + Sync {
    /// Reads a small record from namespace `ns`. A record on disk that fails
    /// its checksum is dropped and reads as absent.
    fn kv_get(&self, ns: &str, key: &str) -> Result<Option<Bytes>, StoreError>;

    /// Writes a small record to namespace `ns` (at most
    /// [`MAX_KV_VALUE_LEN`] bytes; [`StoreError::Full`] past the kv budget).
    fn kv_set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// Deletes a small record; returns whether it existed.
    fn kv_delete(&self, ns: &str, key: &str) -> Result<bool, StoreError>;
}

/// Sizes and counters of a store, for metrics and the admin endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Bytes held by the memory tier (its weight).
    pub memory_bytes: u64,
    /// The memory tier's budget (`memory_bytes` of the config, or of the
    /// last [`TieredStore::set_bounds`]).
    pub memory_capacity: u64,
    /// Objects held by the memory tier.
    pub memory_objects: u64,
    /// Whether a disk tier is configured and open.
    pub disk_enabled: bool,
    /// Logical bytes on disk (keys, records, bodies); approximate until
    /// `disk_counted` is true.
    pub disk_bytes: u64,
    /// The disk bound (`disk_bytes` of the config, or of the last
    /// [`TieredStore::set_bounds`]).
    pub disk_capacity: u64,
    /// Objects on disk; approximate until `disk_counted` is true.
    pub disk_objects: u64,
    /// Size of sled's files, as sled reports it, plus the chunk files;
    /// the chunk files of earlier runs are counted by the background sweep
    /// after open (approximate until it finishes).
    pub disk_file_bytes: u64,
    /// Whether the background count of the disk tier after open finished.
    pub disk_counted: bool,
    /// Disk-tier records held in memory (the record index; see
    /// [`StoreConfig::index_bytes`]).
    pub disk_index_records: u64,
    /// Bytes those records take in memory, as the index weighs them.
    pub disk_index_bytes: u64,
    /// Whether the index holds every record of the disk tier (absent keys
    /// are then answered from memory too).
    pub disk_index_complete: bool,
    /// Whether the disk tier refuses writes after a write error.
    pub disk_degraded: bool,
    /// Whether the database was moved aside at open because it was corrupt.
    pub disk_recreated: bool,
    /// Gets served from memory.
    pub hits_memory: u64,
    /// Gets served from disk.
    pub hits_disk: u64,
    /// Gets that found nothing usable.
    pub misses: u64,
    /// Objects dropped because they failed verification.
    pub corrupt_dropped: u64,
    /// Objects evicted from memory to respect the memory budget.
    pub evicted_memory: u64,
    /// Objects evicted from disk to respect the disk bound.
    pub evicted_disk: u64,
    /// Objects removed because they were past their keep window.
    pub expired_removed: u64,
    /// Writes that failed (disk full, I/O error).
    pub write_errors: u64,
    /// Bytes of kv records.
    pub kv_bytes: u64,
}

/// Current unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Checks an object key.
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey("empty object key".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::TooLarge {
            what: "object key",
            len: key.len() as u64,
            limit: MAX_KEY_LEN as u64,
        });
    }
    Ok(())
}

/// Checks the metadata of an object about to be stored: its size and its
/// surrogate keys.
pub(crate) fn check_meta(meta: &ObjectMeta) -> Result<(), StoreError> {
    let size = meta.approx_size();
    if size > MAX_META_LEN {
        return Err(StoreError::TooLarge {
            what: "metadata",
            len: size as u64,
            limit: MAX_META_LEN as u64,
        });
    }
    if meta.surrogate_keys.len() > MAX_SURROGATE_KEYS {
        return Err(StoreError::TooLarge {
            what: "surrogate key list",
            len: meta.surrogate_keys.len() as u64,
            limit: MAX_SURROGATE_KEYS as u64,
        });
    }
    for k in &meta.surrogate_keys {
        if k.is_empty() {
            return Err(StoreError::InvalidKey("empty surrogate key".into()));
        }
        if k.len() > MAX_SURROGATE_KEY_LEN {
            return Err(StoreError::TooLarge {
                what: "surrogate key",
                len: k.len() as u64,
                limit: MAX_SURROGATE_KEY_LEN as u64,
            });
        }
    }
    Ok(())
}

/// Checks a kv namespace, key and optionally value.
pub(crate) fn check_kv(ns: &str, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
    if ns.is_empty() {
        return Err(StoreError::InvalidKey("empty kv namespace".into()));
    }
    for (what, s) in [("kv namespace", ns), ("kv key", key)] {
        if s.len() > MAX_KV_KEY_LEN {
            return Err(StoreError::TooLarge {
                what,
                len: s.len() as u64,
                limit: MAX_KV_KEY_LEN as u64,
            });
        }
    }
    if let Some(v) = value
        && v.len() > MAX_KV_VALUE_LEN
    {
        return Err(StoreError::TooLarge {
            what: "kv value",
            len: v.len() as u64,
            limit: MAX_KV_VALUE_LEN as u64,
        });
    }
    Ok(())
}

/// Fills `body_len` and `checksum` of `meta` from `body`.
pub(crate) fn seal(mut meta: ObjectMeta, body: &[u8]) -> ObjectMeta {
    meta.body_len = body.len() as u64;
    meta.checksum = crc32fast::hash(body);
    meta
}
