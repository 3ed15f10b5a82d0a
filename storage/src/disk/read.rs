//! The read path: an object's record and chunks, verified before use, and
//! the queries purges run (keys by prefix, keys by surrogate key).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::DiskTier;
use super::layout::{chunk_set_prefix, surrogate_prefix, utf8};
use super::record::{BodyAt, Record};
use crate::engine::{TreeId, Value, Wait};
use crate::{StoreError, StoredObject};

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

impl DiskTier {
    /// Reads and verifies an object. Returns the object and its raw record
    /// (to detect a concurrent change before promoting it to memory).
    /// A corrupt object is dropped and reported as a miss. With
    /// [`Wait::NoWait`] the chunk bytes come only from the page cache, else
    /// [`StoreError::WouldBlock`]; the record and chunk pointers are read
    /// from sled, which keeps what it has read in memory.
    pub(crate) fn get(
        &self,
        key: &str,
        wait: Wait,
    ) -> Result<Option<(StoredObject, Value)>, StoreError> {
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
            let body = match rec.body {
                BodyAt::Inline { at } => self.inline_body(&rec, &raw, at),
                BodyAt::Chunks { chunk_size } => self.read_body(key, &rec, chunk_size, wait),
            };
            match body {
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

    /// The body inline in `raw` from `at` on, verified; shares `raw`'s
    /// bytes where the engine allows.
    fn inline_body(&self, rec: &Record, raw: &Value, at: usize) -> Result<Bytes, BodyError> {
        let body = raw.slice_bytes(at);
        if crc32fast::hash(&body) != rec.meta.checksum {
            return Err(BodyError::Corrupt("inline body checksum mismatch".into()));
        }
        Ok(body)
    }

    fn read_body(
        &self,
        key: &str,
        rec: &Record,
        chunk_size: u32,
        wait: Wait,
    ) -> Result<Bytes, BodyError> {
        let body_len = rec.meta.body_len;
        if body_len > self.plausible_body() {
            return Err(BodyError::Corrupt(format!(
                "body length {body_len} is implausible"
            )));
        }
        let n = rec.chunk_count();
        let chunk_size = u64::from(chunk_size);
        let prefix = chunk_set_prefix(key, rec.id);
        let mut chunks = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut next: u64 = 0;
        for item in self.engine.scan_chunks(&prefix, wait) {
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
}
