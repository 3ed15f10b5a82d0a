//! Small kv records for policies, each stored with a CRC of its value and
//! charged to the kv budget.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::DiskTier;
use super::layout::kv_key;
use super::usage::signed;
use crate::StoreError;
use crate::engine::TreeId;

impl DiskTier {
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
        if self.usage.kv_bytes() + kv_stored_size(&k, &v) > self.kv_limit + old_size {
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
pub(super) fn kv_stored_size(k: &[u8], v: &[u8]) -> u64 {
    KV_ENTRY_OVERHEAD + (k.len() + v.len()) as u64
}

fn decode_kv(v: &[u8]) -> Option<&[u8]> {
    let (crc, value) = (v.get(..4)?, v.get(4..)?);
    (crc32fast::hash(value).to_be_bytes() == crc).then_some(value)
}
