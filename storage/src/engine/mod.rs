//! The disk engine seam: a few ordered byte-trees, ids and flush.
//!
//! Everything about the layout (chunks, records, checksums, indexes) lives
//! in `disk/` on top of this trait, so replacing sled means writing one
//! small adapter. Tests wrap the sled engine to inject write failures.

mod chunk_files;
mod record_cache;
mod sled_engine;

use std::ops::Deref;

pub(crate) use record_cache::{RecordCache, RecordCacheStats};
pub(crate) use sled_engine::open_sled;

use crate::StoreError;

/// The trees of the layout (see the crate docs for their keys and values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TreeId {
    Meta,
    Chunks,
    Fifo,
    Expiry,
    Surrogate,
    Kv,
    Pending,
    Bans,
}

impl TreeId {
    pub(crate) const ALL: [TreeId; 8] = [
        TreeId::Meta,
        TreeId::Chunks,
        TreeId::Fifo,
        TreeId::Expiry,
        TreeId::Surrogate,
        TreeId::Kv,
        TreeId::Pending,
        TreeId::Bans,
    ];

    /// The on-disk name; stable, the layout depends on it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TreeId::Meta => "meta",
            TreeId::Chunks => "chunks",
            TreeId::Fifo => "fifo",
            TreeId::Expiry => "expiry",
            TreeId::Surrogate => "surrogate",
            TreeId::Kv => "kv",
            TreeId::Pending => "pending",
            TreeId::Bans => "bans",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A value read from an engine, without copying where the engine allows.
#[derive(Debug)]
pub(crate) enum Value {
    Sled(sled::IVec),
    /// Read from a file (chunks).
    Owned(Vec<u8>),
    /// A file mapped into memory (large chunks).
    Mapped(memmap2::Mmap),
}

impl Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Value::Sled(v) => v,
            Value::Owned(v) => v,
            Value::Mapped(m) => m,
        }
    }
}

impl Value {
    /// The bytes as `Bytes`, without a copy where the value owns them.
    pub(crate) fn into_bytes(self) -> bytes::Bytes {
        match self {
            Value::Sled(v) => bytes::Bytes::copy_from_slice(&v),
            Value::Owned(v) => bytes::Bytes::from(v),
            Value::Mapped(m) => bytes::Bytes::from_owner(m),
        }
    }
}

impl Value {
    /// The bytes from `at` to the end (empty if `at` is past it) as
    /// `Bytes`, sharing sled's buffer instead of copying it.
    pub(crate) fn slice_bytes(&self, at: usize) -> bytes::Bytes {
        match self {
            Value::Sled(v) if at <= v.len() => bytes::Bytes::from_owner(v.clone()).slice(at..),
            other => bytes::Bytes::copy_from_slice(other.get(at..).unwrap_or_default()),
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        **self == **other
    }
}

/// Whether a read may wait for the disk device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Read as usual.
    Block,
    /// Only what the page cache already holds; else [`StoreError::WouldBlock`].
    NoWait,
}

/// Key-value pairs from a scan.
pub(crate) type Entries<'a> = Box<dyn Iterator<Item = Result<(Value, Value), StoreError>> + 'a>;

/// An ordered key-value engine with named trees.
///
/// Single-key operations are atomic. There is no cross-key atomicity: the
/// layout orders its writes so any prefix of them is detectable.
///
/// The `chunks` tree holds bulk bytes an engine may keep outside its tree
/// (sled's keeps them in files): there `insert` and `remove` need not return
/// the previous value (`None`), and `compare_and_swap` may be refused.
pub(crate) trait DiskEngine: Send + Sync {
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError>;
    fn insert(&self, tree: TreeId, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError>;
    fn remove(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError>;
    /// Atomically replaces `old` (None: absent) by `new` (None: remove).
    /// Returns false, changing nothing, if the current value is not `old`.
    fn compare_and_swap(
        &self,
        tree: TreeId,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError>;
    /// Entries whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, tree: TreeId, prefix: &[u8]) -> Entries<'_>;
    /// The `chunks` tree's entries under `prefix`, in key order, their
    /// bytes read as `wait` allows. An engine that cannot read without
    /// waiting answers [`StoreError::WouldBlock`] to `NoWait`.
    fn scan_chunks(&self, prefix: &[u8], wait: Wait) -> Entries<'_> {
        match wait {
            Wait::Block => self.scan_prefix(TreeId::Chunks, prefix),
            Wait::NoWait => Box::new(std::iter::once(Err(StoreError::WouldBlock))),
        }
    }
    /// Entries with key >= `start`, in key order.
    fn range_from(&self, tree: TreeId, start: &[u8]) -> Entries<'_>;
    /// A new id, larger than every id handed out before (also across restarts).
    fn generate_id(&self) -> Result<u64, StoreError>;
    /// Deletes what a crash left behind that the trees do not name (for
    /// sled: chunk files without a pointer). Runs in the background after
    /// the open, concurrently with reads and writes; returns early when
    /// `stop` is set. Returns how many leftovers it deleted.
    fn sweep_orphans(&self, _stop: &std::sync::atomic::AtomicBool) -> Result<u64, StoreError> {
        Ok(0)
    }
    /// Every record of the `meta` tree has been read once through this
    /// engine since it was opened (the recount after the open): an engine
    /// that holds records in memory ([`RecordCache`]) then holds them all.
    fn all_records_read(&self) {}
    /// How an engine that holds records in memory is doing.
    fn record_cache(&self) -> Option<RecordCacheStats> {
        None
    }
    /// Makes all completed writes durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// Bytes of the engine's files.
    fn size_on_disk(&self) -> Result<u64, StoreError>;
}
