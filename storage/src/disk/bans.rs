//! The cache's ban records and the walk over stored objects that a ban
//! lurker needs. Ban records are opaque bytes to the store, each with a CRC
//! of its own, outside the kv budget.

use std::sync::Arc;

use bytes::Bytes;

use super::DiskTier;
use super::record::Record;
use crate::engine::TreeId;
use crate::{BanRecord, ObjectMeta, StoreError};

impl DiskTier {
    /// Every ban record, in id order; one that fails its checksum has no
    /// data.
    pub(crate) fn ban_records(&self) -> Result<Vec<BanRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.engine.range_from(TreeId::Bans, &[]) {
            let (k, v) = item?;
            let Ok(id) = <[u8; 8]>::try_from(&*k).map(u64::from_be_bytes) else {
                tracing::warn!("ignoring a ban record with a malformed id");
                continue;
            };
            let data = match (v.get(..4), v.get(4..)) {
                (Some(crc), Some(data)) if crc32fast::hash(data).to_be_bytes() == crc => {
                    Some(Bytes::copy_from_slice(data))
                }
                _ => None,
            };
            out.push(BanRecord { id, data });
        }
        Ok(out)
    }

    /// Writes one ban record and flushes: it is durable when this returns.
    pub(crate) fn ban_put(&self, id: u64, data: &[u8]) -> Result<(), StoreError> {
        self.check_writable()?;
        let mut v = Vec::with_capacity(4 + data.len());
        v.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
        v.extend_from_slice(data);
        if let Err(e) = self.engine.insert(TreeId::Bans, &id.to_be_bytes(), &v) {
            self.note_write_error(&e);
            return Err(e);
        }
        self.flush()
    }

    /// Deletes ban records (not flushed: a dropped ban that comes back
    /// after a crash only costs checks).
    pub(crate) fn ban_remove(&self, ids: &[u64]) -> Result<(), StoreError> {
        for id in ids {
            self.engine.remove(TreeId::Bans, &id.to_be_bytes())?;
        }
        Ok(())
    }

    /// The creation time of the object under `key` on disk, if any (an
    /// undecodable record has none).
    pub(crate) fn created_ms_of(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self
            .current_record(key)?
            .and_then(|raw| Record::decode(&raw).ok())
            .map(|r| r.meta.created_ms))
    }

    /// Up to `limit` objects with keys after `after`, in key order, with
    /// their metadata. Records that do not decode are skipped (a read drops
    /// them).
    pub(crate) fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Arc<ObjectMeta>)>, StoreError> {
        let start = after.map(str::as_bytes).unwrap_or_default();
        let mut out = Vec::new();
        for item in self.engine.range_from(TreeId::Meta, start) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            if Some(&*k) == after.map(str::as_bytes) {
                continue;
            }
            let (Ok(key), Ok(rec)) = (std::str::from_utf8(&k), Record::decode(&v)) else {
                continue;
            };
            out.push((key.to_owned(), Arc::new(rec.meta)));
        }
        Ok(out)
    }
}
