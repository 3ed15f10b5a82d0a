//! The ban lurker: a background walk over the stored objects (both tiers,
//! in batches, with a pause between batches so it does not compete with
//! traffic) that removes the objects a ban covers and then drops the bans
//! it has tested every older object against.
//!
//! A ban can be dropped after a walk that started once it existed, when
//! every fill that started before the ban had been stored or abandoned by
//! the walk's start: every object older than the ban was then either in
//! the store for the walk to test, or is tested at lookup by a newer ban
//! only. Objects need their URL and host for that: the storage key holds
//! them, or `ObjectMeta::full_key` when the key is a digest; an object
//! with neither is treated as matching any condition on them.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use inlay_storage::{ObjectMeta, StoreError};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::{BanStats, BanSubject, host_and_url};
use crate::key::VARIANT_SEP;
use crate::{HttpCache, Inner, long_keys, variants};

/// How the lurker walks ([`HttpCache::set_ban_lurker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanLurker {
    /// Whether it runs in the background whenever there are bans (off: the
    /// list shrinks only through [`HttpCache::lurk`]).
    pub enabled: bool,
    /// Objects read per batch.
    pub batch: usize,
    /// Pause after each batch: with the defaults at most about 5,000
    /// objects a second.
    pub pause: Duration,
    /// Pause between two walks.
    pub between_walks: Duration,
}

impl Default for BanLurker {
    fn default() -> Self {
        Self {
            enabled: true,
            batch: 100,
            pause: Duration::from_millis(20),
            between_walks: Duration::from_secs(1),
        }
    }
}

/// What one walk did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LurkReport {
    /// Objects tested.
    pub checked: u64,
    /// Objects removed because a ban matched.
    pub removed: u64,
    /// Ids of the bans dropped from the list after the walk.
    pub dropped: Vec<u64>,
}

/// The ban subject of an object read by a walk: its URL and host from
/// the storage key, or from `full_key` when the key is a digest.
fn subject_of<'a>(key: &'a str, meta: &'a ObjectMeta) -> BanSubject<'a> {
    let primary = match &meta.full_key {
        Some(full) => Some(full.as_str()),
        None => {
            let p = key.split(VARIANT_SEP).next().unwrap_or_default();
            (!p.contains(long_keys::MARK)).then_some(p)
        }
    };
    let (host, url) = match primary.map(host_and_url) {
        Some((h, u)) => (Some(h), Some(u)),
        None => (None, None),
    };
    BanSubject { url, host, meta }
}

/// Whether the object under `key` is a variants header (not a response).
fn is_variants_header(key: &str, meta: &ObjectMeta) -> bool {
    key.ends_with(VARIANT_SEP) && variants::is_header(meta)
}

/// One walk over the store; `None` when the cache went away meanwhile.
async fn walk(
    cache: &Weak<Inner>,
    batch: usize,
    pause: Duration,
) -> Option<Result<LurkReport, StoreError>> {
    let mut report = LurkReport::default();
    let (oldest_fill, top) = {
        let inner = cache.upgrade()?;
        inner.tickets.oldest_with(|| inner.bans.newest_id())
    };
    let Some(top) = top else {
        return Some(Ok(report));
    };
    let batch = batch.max(1);
    let mut cursor: Option<String> = None;
    loop {
        let inner = cache.upgrade()?;
        let found = match inner.store.scan_meta(cursor.take(), batch).await {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let Some((last, _)) = found.last() else {
            break;
        };
        cursor = Some(last.clone());
        let mut doomed = Vec::new();
        for (key, meta) in &found {
            if is_variants_header(key, meta) {
                continue;
            }
            report.checked += 1;
            if inner.bans.check(&subject_of(key, meta)).is_some() {
                // Only this object: one stored since under the key stays.
                doomed.push((key.clone(), meta.created_ms));
            }
        }
        if !doomed.is_empty() {
            match inner.store.remove_created_by(doomed).await {
                Ok(n) => {
                    report.removed += n;
                    BanStats::bump(&inner.bans.stats.removed_by_lurker, n);
                }
                Err(e) => return Some(Err(e)),
            }
        }
        let done = found.len() < batch;
        drop(inner);
        if done {
            break;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    let inner = cache.upgrade()?;
    let freed;
    (report.dropped, freed) = inner.bans.drop_walked(top, oldest_fill);
    if freed >= super::GIVE_BACK_AT {
        super::give_back_freed_heap();
    }
    BanStats::bump(&inner.bans.stats.lurker_walks, 1);
    if !report.dropped.is_empty()
        && let Err(e) = inner.store.ban_remove(report.dropped.clone()).await
    {
        // Harmless: a dropped ban read back after a restart only costs
        // tests until the next walk drops it again.
        warn!(error = %e, "could not delete dropped bans from the disk tier");
    }
    Some(Ok(report))
}

/// The background task: walks while there are bans, then ends.
async fn run(cache: Weak<Inner>) {
    loop {
        let Some(inner) = cache.upgrade() else {
            return;
        };
        let settings = inner.lurker.lock().clone();
        if !settings.enabled || inner.bans.len() == 0 {
            inner.lurker_running.store(false, Ordering::SeqCst);
            // A ban added since the check found us running: look again.
            if settings.enabled
                && inner.bans.len() > 0
                && !inner.lurker_running.swap(true, Ordering::SeqCst)
            {
                continue;
            }
            return;
        }
        drop(inner);
        match walk(&cache, settings.batch, settings.pause).await {
            None => return,
            Some(Ok(r)) => debug!(
                checked = r.checked,
                removed = r.removed,
                dropped = r.dropped.len(),
                "ban lurker walk done"
            ),
            Some(Err(e)) => warn!(error = %e, "ban lurker walk failed; retrying"),
        }
        tokio::time::sleep(settings.between_walks).await;
    }
}

impl HttpCache {
    /// Sets how the ban lurker walks; disabling it stops the background
    /// walk after its current one.
    pub fn set_ban_lurker(&self, settings: BanLurker) {
        *self.inner.lurker.lock() = settings;
        self.wake_lurker();
    }

    /// Walks the whole store once now, without pauses: removes the objects
    /// a ban covers and drops the bans no object needs any more (what the
    /// background lurker does, for tests and an operator's "now").
    pub async fn lurk(&self) -> Result<LurkReport, StoreError> {
        let batch = self.inner.lurker.lock().batch;
        let weak = std::sync::Arc::downgrade(&self.inner);
        walk(&weak, batch, Duration::ZERO)
            .await
            .unwrap_or_else(|| Ok(LurkReport::default()))
    }

    /// Starts the background lurker if it is enabled, there are bans, it
    /// is not running, and a tokio runtime is at hand.
    pub(crate) fn wake_lurker(&self) {
        let inner = &self.inner;
        if !inner.lurker.lock().enabled
            || inner.bans.len() == 0
            || inner.lurker_running.swap(true, Ordering::SeqCst)
        {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(run(std::sync::Arc::downgrade(inner)));
            }
            Err(_) => inner.lurker_running.store(false, Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_comes_from_the_key_or_the_full_key() {
        let meta = ObjectMeta::default();
        let s = subject_of("example.com\u{2}/a?b\u{1}accept-encoding=gzip", &meta);
        assert_eq!((s.host, s.url), (Some("example.com"), Some("/a?b")));
        let digest = "example.com\u{2}/aaaa\u{3}0123\u{1}";
        let s = subject_of(digest, &meta);
        assert_eq!((s.host, s.url), (None, None));
        let full = ObjectMeta {
            full_key: Some("example.com\u{2}/long".into()),
            ..ObjectMeta::default()
        };
        let s = subject_of(digest, &full);
        assert_eq!((s.host, s.url), (Some("example.com"), Some("/long")));
    }
}
