//! Maintenance of the disk tier: cleanup of writes a crash interrupted
//! (the pending tree), the background recount after open, expiry sweeps, and
//! degraded mode (a tier that refuses writes after the engine failed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::kv::kv_stored_size;
use super::layout::{be_u64, kv_key, utf8};
use super::record::Record;
use super::{BATCH, DiskTier};
use crate::StoreError;
use crate::engine::{TreeId, Value};
use crate::error::from_io;

/// The kv namespace where caches before the variants-header layout kept
/// one record of Vary names per URL (inlay-cache now keeps them in the
/// objects); its records only took kv budget, so the count drops them.
const LEGACY_VARY_NS: &str = "inlay.vary";

/// How long a flush may take before the disk tier is declared stuck.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

impl DiskTier {
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

    /// Deletes what crashes left in the engine that no tree names (chunk
    /// files without a pointer); run in the background after open.
    pub(crate) fn sweep_orphans(&self, stop: &AtomicBool) -> Result<u64, StoreError> {
        self.engine.sweep_orphans(stop)
    }

    /// After a partly failed removal: a pending entry makes the next open
    /// delete the remaining chunks.
    pub(super) fn remember_orphans(&self, key: &str) {
        if let Ok(id) = self.engine.generate_id() {
            let _ = self
                .engine
                .insert(TreeId::Pending, &id.to_be_bytes(), key.as_bytes());
        }
    }

    /// Recomputes the byte and object counters from the trees (run in the
    /// background after open; changes made meanwhile are kept).
    pub(crate) fn recount(&self, stop: &AtomicBool) -> Result<(), StoreError> {
        self.usage.begin_recount();
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
            self.usage.scanned_up_to(&k);
        }
        self.usage.scanned_all();
        self.engine.all_records_read();
        let mut kv = 0u64;
        let legacy = kv_key(LEGACY_VARY_NS, "");
        let mut dropped = 0u64;
        for item in self.engine.range_from(TreeId::Kv, &[]) {
            let (k, v) = item?;
            if k.starts_with(&legacy) {
                // Not counted: removed, or left to the next open's count.
                if self.engine.remove(TreeId::Kv, &k).is_ok() {
                    dropped += 1;
                }
                continue;
            }
            kv += kv_stored_size(&k, &v);
        }
        if dropped > 0 {
            tracing::info!(dropped, "removed the old Vary index from the kv records");
        }
        self.usage.finish_recount(bytes, objects, kv);
        Ok(())
    }

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

    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.lock().is_some()
    }

    pub(super) fn check_writable(&self) -> Result<(), StoreError> {
        match &*self.degraded.lock() {
            Some(why) => Err(StoreError::Degraded(why.clone())),
            None => Ok(()),
        }
    }

    /// Records a failed write. sled stops accepting writes for good after an
    /// I/O error in its log; remember that so later writes fail fast.
    pub(super) fn note_write_error(&self, e: &StoreError) {
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
