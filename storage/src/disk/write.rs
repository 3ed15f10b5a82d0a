//! The write path: puts (in the order the `disk` module docs give), metadata
//! updates and removals, and the removal of objects that failed
//! verification. A [`KeyGuard`] argument proves the caller holds the key's
//! stripe lock.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::layout::{
    chunk_id_of, chunk_key, chunk_prefix, chunk_set_prefix, expiry_key, surrogate_key,
};
use super::record::{BodyAt, Record};
use super::usage::{ENTRY_OVERHEAD, signed};
use super::{DiskTier, KeyGuard};
use crate::engine::{TreeId, Value};
use crate::{ObjectMeta, StoreError};

impl DiskTier {
    /// Drops an object that failed verification: logs it, removes the record
    /// if it is still the one read (`raw`; `None`: unreadable) and its chunks.
    pub(super) fn drop_corrupt(&self, key: &str, raw: Option<&Value>, why: &str) {
        let g = self.lock_key(key);
        self.drop_corrupt_locked(&g, key, raw, why);
    }

    pub(super) fn drop_corrupt_locked(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        raw: Option<&Value>,
        why: &str,
    ) {
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

    /// Stores a sealed object (body_len and checksum filled).
    pub(crate) fn put_locked(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        meta: &ObjectMeta,
        body: &[u8],
    ) -> Result<(), StoreError> {
        self.check_writable()?;
        let max_body = self.max_body();
        if body.len() as u64 > max_body {
            return Err(StoreError::TooLarge {
                what: "body",
                len: body.len() as u64,
                limit: max_body,
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
        if body.len() <= self.inline_body {
            let rec = Record {
                id,
                seq: 0,
                body: BodyAt::Inline { at: 0 },
                meta: meta.clone(),
            };
            return self.commit_record(g, key, rec, Some(body), None);
        }
        for (i, chunk) in body.chunks(self.chunk_size).enumerate() {
            let index = u32::try_from(i).map_err(|_| StoreError::TooLarge {
                what: "body",
                len: body.len() as u64,
                limit: self.max_body(),
            })?;
            self.engine
                .insert(TreeId::Chunks, &chunk_key(key, id, index), chunk)?;
        }
        let rec = Record {
            id,
            seq: 0,
            body: BodyAt::Chunks {
                chunk_size: u32::try_from(self.chunk_size).unwrap_or(u32::MAX),
            },
            meta: meta.clone(),
        };
        self.commit_record(g, key, rec, None, None)
    }

    /// Writes the index entries of `rec` (with a fresh FIFO seq), then the
    /// record (with `inline` as its body if it is an inline record;
    /// atomically replacing `expect` if given, else whatever is there),
    /// then cleans up after the replaced record. Returns whether the
    /// cleanup was complete. Fails with `Ok(false)`-free semantics: a lost
    /// compare-and-swap is reported as [`StoreError::Engine`].
    fn commit_record(
        &self,
        g: &KeyGuard<'_>,
        key: &str,
        mut rec: Record,
        inline: Option<&[u8]>,
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
        let raw = rec.encode(inline);
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
    pub(super) fn delete_chunks_except(
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
        // The codings describe the body, which stays.
        meta.codings.clone_from(&old.meta.codings);
        let rec = Record {
            id: old.id,
            seq: 0,
            body: old.body,
            meta: meta.clone(),
        };
        // A refresh moves the object to the back of the FIFO: it is in use.
        let result = self.commit_record(g, key, rec, old.inline_body(&raw), Some(&raw));
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
}
