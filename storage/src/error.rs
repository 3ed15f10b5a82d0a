//! The one error type of the store.

use std::path::PathBuf;

/// Why a store operation failed.
///
/// A corrupt or torn object is never an error on the read path: it is a miss
/// (and is removed). Errors are for writes that could not be made durable,
/// for inputs the store refuses, and for an engine that stopped working.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk is full (ENOSPC/EDQUOT) or a byte budget (kv) is exhausted.
    #[error("storage is full")]
    Full,
    /// The disk engine reported an I/O error.
    #[error("storage I/O error: {0}")]
    Io(#[source] std::io::Error),
    /// Stored bytes failed verification (checksum, length or format).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A body, key or value is larger than the store accepts.
    #[error("{what} of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was too large ("body", "key", "kv value", ...).
        what: &'static str,
        /// Its length in bytes.
        len: u64,
        /// The limit it exceeded.
        limit: u64,
    },
    /// A key or namespace the store cannot use (empty, or contains a NUL).
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The database directory is locked by another process or store.
    #[error("storage directory {0} is in use by another process")]
    Locked(PathBuf),
    /// The database directory could not be opened for a reason of the
    /// system, not of its contents (permissions, file descriptors, a file
    /// where the directory should be); it was left untouched.
    #[error("cannot open the storage directory {dir}: {error}")]
    Open {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("invalid storage configuration: {0}")]
    Config(String),
    /// A read asked not to wait would have waited for the disk device (the
    /// bytes are not in the page cache). Only the no-wait read path
    /// ([`ObjectStore::get_nowait`](crate::ObjectStore::get_nowait)) meets
    /// it, and it answers `NotResident` instead.
    #[error("the read would wait for the disk")]
    WouldBlock,
    /// The disk engine failed in another way (a bug or an unsupported use).
    #[error("storage engine error: {0}")]
    Engine(String),
    /// The disk tier stopped accepting writes after an earlier write error;
    /// reads still work and a restart clears it.
    #[error("disk tier is read-only after an earlier write error: {0}")]
    Degraded(String),
}

impl StoreError {
    /// Whether the error means "no space": the caller should serve uncached.
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Full)
    }
}

/// Maps an I/O error, turning "no space" and "quota exceeded" into [`StoreError::Full`].
pub(crate) fn from_io(e: std::io::Error) -> StoreError {
    match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => StoreError::Full,
        _ => StoreError::Io(e),
    }
}
