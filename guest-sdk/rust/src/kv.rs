//! A small persistent key-value store, private to this policy.
//!
//! ```
//! use inlay_policy::kv;
//!
//! # fn main() -> Result<(), kv::KvError> {
//! kv::set("hits", b"1")?;
//! assert_eq!(kv::get("hits")?.as_deref(), Some(&b"1"[..]));
//! assert!(kv::delete("hits")?);
//! assert_eq!(kv::get("hits")?, None);
//! # Ok(())
//! # }
//! ```

/// Why a kv call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The storage refused the operation.
    #[error("kv storage error: {0}")]
    Storage(String),
    /// The key or value is too large.
    #[error("kv key or value too large")]
    TooLarge,
    /// The per-request cap on host calls was reached.
    #[error("per-request host call limit reached")]
    LimitExceeded,
}

/// Read a value.
pub fn get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    crate::sys::kv_get(key)
}

/// Write a value.
pub fn set(key: &str, value: &[u8]) -> Result<(), KvError> {
    crate::sys::kv_set(key, value)
}

/// Delete a value; returns whether it existed.
pub fn delete(key: &str) -> Result<bool, KvError> {
    crate::sys::kv_delete(key)
}
