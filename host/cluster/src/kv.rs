//! The policies' kv shared by the cluster (`cluster.kv = "nats"`): a
//! JetStream KV bucket `PREFIX_KV`, read from a local copy its watch keeps.
//!
//! Like Workers KV it is eventually consistent: a node reads its own writes
//! at once (a write goes through to the bucket, then updates the copy), and
//! the others' writes once the watch delivers them (milliseconds on a LAN).
//! The last write to a key wins, in the bucket's order.
//!
//! Bounds: keys and values as the local kv's (`inlay_storage`'s
//! [`MAX_KV_KEY_LEN`], [`MAX_KV_VALUE_LEN`]); the bucket and each node's copy
//! hold at most `cluster.kv_max_bytes`. A write past the bound is refused
//! (`full`); an entry the watch delivers that does not fit (another node
//! configured with a larger bound, or a message not written by a node) is
//! left out of the copy, logged and counted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use inlay_storage::{MAX_KV_KEY_LEN, MAX_KV_VALUE_LEN};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::Cluster;

/// Bytes charged per entry of the copy besides its key and value (the
/// local kv charges the same).
const ENTRY_OVERHEAD: u64 = 64;

/// How long a node waits at start for its copy to catch up with the bucket.
const CATCH_UP: Duration = Duration::from_secs(10);

/// The cluster's shared kv: cheap to clone.
#[derive(Clone)]
pub struct SharedKv {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKv")
            .field("bucket", &self.inner.bucket)
            .finish_non_exhaustive()
    }
}

struct Inner {
    bucket: String,
    store: kv::Store,
    js: jetstream::Context,
    copy: Mutex<Copy>,
    limit: u64,
    /// Entries the watch delivered that the copy left out.
    dropped: AtomicU64,
}

/// The node's copy of the bucket.
#[derive(Default)]
struct Copy {
    entries: HashMap<String, Bytes>,
    bytes: u64,
    /// The bucket revision the watch has applied up to (the watch delivers
    /// in revision order).
    applied: u64,
    /// This node's writes the watch has not delivered yet, by key: their
    /// revision. An older change the watch delivers for such a key must not
    /// undo them.
    pending: HashMap<String, u64>,
}

/// Most writes of this node awaiting their echo from the watch (it clears
/// them; past this, say with the watch down, a write is read once the
/// watch delivers it).
const MAX_PENDING: usize = 65_536;

impl Copy {
    fn charge(key: &str, value: &[u8]) -> u64 {
        ENTRY_OVERHEAD + (key.len() + value.len()) as u64
    }

    /// Whether `value` would fit under `key` in `limit`.
    fn fits(&self, key: &str, value: &[u8], limit: u64) -> bool {
        let old = self.entries.get(key).map_or(0, |v| Self::charge(key, v));
        self.bytes - old + Self::charge(key, value) <= limit
    }

    /// Puts `value` under `key` if it fits in `limit`.
    fn put(&mut self, key: &str, value: Bytes, limit: u64) -> bool {
        if !self.fits(key, &value, limit) {
            return false;
        }
        self.remove(key);
        self.bytes += Self::charge(key, &value);
        self.entries.insert(key.to_owned(), value);
        true
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.entries.remove(key) {
            Some(v) => {
                self.bytes -= Self::charge(key, &v);
                true
            }
            None => false,
        }
    }

    /// Whether a change of `key` at `revision` the watch delivers is
    /// newer than this node's own write of the key (and clears that write
    /// once the watch has reached it).
    fn watch_delivers(&mut self, key: &str, revision: u64) -> bool {
        self.applied = self.applied.max(revision);
        match self.pending.get(key) {
            Some(&mine) if mine > revision => false,
            Some(_) => {
                self.pending.remove(key);
                true
            }
            None => true,
        }
    }

    /// Whether this node's own write of `key` at `revision` goes into the
    /// copy now: not when the watch is already past it (the copy holds it
    /// or something newer).
    fn own_write(&mut self, key: &str, revision: u64) -> bool {
        if revision <= self.applied {
            return false;
        }
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(key) {
            return false;
        }
        let mine = self.pending.entry(key.to_owned()).or_default();
        *mine = (*mine).max(revision);
        true
    }
}

/// The bucket key of a policy's kv key: both hex-encoded (a bucket key
/// allows few characters), `NS.kKEY` (`k` so an empty key is a token).
fn bucket_key(namespace: &str, key: &str) -> String {
    format!("{}.k{}", hex::encode(namespace), hex::encode(key))
}

/// The shared kv when `cluster.kv = "nats"`, opened and caught up.
pub async fn open_if_configured(cluster: Option<&Cluster>) -> anyhow::Result<Option<SharedKv>> {
    match cluster {
        Some(c) if c.config().kv == crate::config::ClusterKv::Nats => {
            SharedKv::open(c).await.map(Some)
        }
        _ => Ok(None),
    }
}

impl SharedKv {
    /// Opens (creating if need be) the cluster's kv bucket and fills this
    /// node's copy from it before returning (up to 10 s; later entries
    /// arrive as the watch delivers them), then keeps the copy current.
    pub async fn open(cluster: &Cluster) -> anyhow::Result<Self> {
        let bucket = cluster.name("KV");
        let limit = cluster.config().kv_max_bytes;
        let js = cluster.jetstream().clone();
        // By hand: `create_key_value` reads account fields nats-server 2.9
        // does not send. The same settings a KV bucket gets.
        let max_bytes = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stream = js
            .get_or_create_stream(crate::kv_bucket_stream(
                &bucket,
                max_bytes,
                (MAX_KV_VALUE_LEN + 4 * MAX_KV_KEY_LEN) as i32,
            ))
            .await
            .with_context(|| format!("cluster.kv: creating the stream of bucket {bucket}"))?;
        let pending = stream
            .info()
            .await
            .context("cluster.kv: reading the bucket's state")?
            .state
            .messages;
        let store = js
            .get_key_value(&bucket)
            .await
            .with_context(|| format!("cluster.kv: opening bucket {bucket}"))?;
        let watch = store
            .watch_with_history(">")
            .await
            .with_context(|| format!("cluster.kv: watching bucket {bucket}"))?;
        let kv = Self {
            inner: Arc::new(Inner {
                bucket: bucket.clone(),
                store,
                js,
                copy: Mutex::new(Copy::default()),
                limit,
                dropped: AtomicU64::new(0),
            }),
        };
        cluster.metrics().observe_kv(&kv);
        let (caught_up, mut ready) = tokio::sync::watch::channel(pending == 0);
        tokio::spawn(kv.clone().follow(watch, caught_up));
        if tokio::time::timeout(CATCH_UP, ready.wait_for(|r| *r))
            .await
            .is_err()
        {
            warn!(%bucket, "cluster.kv: the copy has not caught up with the bucket after {CATCH_UP:?}; serving, the rest arrives as the watch delivers it");
        }
        let copy = kv.inner.copy.lock();
        info!(%bucket, keys = copy.entries.len(), bytes = copy.bytes, "cluster.kv: shared policy kv open");
        drop(copy);
        Ok(kv)
    }

    /// Applies the bucket's changes to the copy as the watch delivers them.
    async fn follow(self, mut watch: kv::Watch, caught_up: tokio::sync::watch::Sender<bool>) {
        while let Some(entry) = watch.next().await {
            match entry {
                Ok(entry) => {
                    self.apply(&entry);
                    if entry.delta == 0 {
                        caught_up.send_replace(true);
                    }
                }
                Err(e) => warn!(bucket = %self.inner.bucket, error = %e, "cluster.kv: watch error"),
            }
        }
        warn!(bucket = %self.inner.bucket, "cluster.kv: the watch ended; the copy no longer follows the bucket");
    }

    fn apply(&self, entry: &kv::Entry) {
        let mut copy = self.inner.copy.lock();
        if !copy.watch_delivers(&entry.key, entry.revision) {
            return;
        }
        match entry.operation {
            kv::Operation::Put => {
                if entry.value.len() > MAX_KV_VALUE_LEN
                    || !copy.put(&entry.key, entry.value.clone(), self.inner.limit)
                {
                    copy.remove(&entry.key);
                    drop(copy);
                    let n = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                    warn!(bucket = %self.inner.bucket, key = %entry.key, len = entry.value.len(), dropped = n,
                        "cluster.kv: an entry does not fit this node's copy (cluster.kv_max_bytes); left out");
                    return;
                }
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                copy.remove(&entry.key);
            }
        }
        debug!(key = %entry.key, revision = entry.revision, "cluster.kv: applied");
    }

    /// Keys in this node's copy, and the bytes charged for them.
    pub fn usage(&self) -> (u64, u64) {
        let copy = self.inner.copy.lock();
        (copy.entries.len() as u64, copy.bytes)
    }

    /// Entries the watch delivered that this node's copy left out.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// A policy's value, from this node's copy.
    pub fn get(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        let k = bucket_key(namespace, key);
        self.inner.copy.lock().entries.get(&k).map(|v| v.to_vec())
    }

    /// Writes through to the bucket, then into the copy.
    pub fn set(
        &self,
        namespace: &str,
        key: &str,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), String>> {
        let checked = check(namespace, key, Some(value.len()));
        let k = bucket_key(namespace, key);
        let this = self.clone();
        Box::pin(async move {
            checked?;
            let value = Bytes::from(value);
            // Refuse what the copy cannot hold before the bucket takes it.
            if !this.inner.copy.lock().fits(&k, &value, this.inner.limit) {
                return Err(full(this.inner.limit));
            }
            let revision = this
                .inner
                .store
                .put(&k, value.clone())
                .await
                .map_err(|e| write_error(&e, this.inner.limit))?;
            let mut copy = this.inner.copy.lock();
            if copy.own_write(&k, revision) && !copy.put(&k, value, this.inner.limit) {
                // Others filled the copy meanwhile; the bucket has it.
                copy.remove(&k);
            }
            Ok(())
        })
    }

    /// Deletes in the bucket (a delete marker), then from the copy;
    /// whether the copy held the key.
    pub fn delete(&self, namespace: &str, key: &str) -> BoxFuture<'static, Result<bool, String>> {
        let checked = check(namespace, key, None);
        let k = bucket_key(namespace, key);
        let this = self.clone();
        Box::pin(async move {
            checked?;
            // Before the write: the watch may deliver it before its ack.
            let existed = this.inner.copy.lock().entries.contains_key(&k);
            // As `kv::Store::delete` does, keeping the revision the bucket
            // gave the marker.
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("KV-Operation", "DEL");
            let subject = format!("$KV.{}.{k}", this.inner.bucket);
            let ack = this
                .inner
                .js
                .publish_with_headers(subject, headers, Bytes::new())
                .await
                .map_err(|e| format!("shared kv: {e}"))?
                .await
                .map_err(|e| format!("shared kv: {e}"))?;
            let mut copy = this.inner.copy.lock();
            if copy.own_write(&k, ack.sequence) {
                copy.remove(&k);
            }
            Ok(existed)
        })
    }
}

/// The local kv's limits, so a policy behaves the same on either backend.
fn check(namespace: &str, key: &str, value: Option<usize>) -> Result<(), String> {
    if namespace.is_empty() {
        return Err("empty kv namespace".to_owned());
    }
    if namespace.len() > MAX_KV_KEY_LEN || key.len() > MAX_KV_KEY_LEN {
        return Err(format!("kv key longer than {MAX_KV_KEY_LEN} bytes"));
    }
    if let Some(len) = value
        && len > MAX_KV_VALUE_LEN
    {
        return Err(format!("kv value of {len} bytes, over {MAX_KV_VALUE_LEN}"));
    }
    Ok(())
}

fn full(limit: u64) -> String {
    format!("shared kv full (cluster.kv_max_bytes = {limit})")
}

fn write_error(e: &kv::PutError, limit: u64) -> String {
    let text = e.to_string();
    // The stream refuses a write past max_bytes (discard: new).
    if text.contains("maximum bytes") || text.contains("10047") {
        full(limit)
    } else {
        format!("shared kv: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_keys_are_valid_whatever_the_policy_key() {
        for (ns, key) in [("p", ""), ("p", "a b/c.*>"), ("ns", "é\u{0}")] {
            let k = bucket_key(ns, key);
            assert!(
                k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
                "{k}"
            );
            assert!(!k.starts_with('.') && !k.ends_with('.'), "{k}");
        }
        assert_ne!(bucket_key("a", "bc"), bucket_key("ab", "c"));
    }

    #[test]
    fn the_copy_stays_within_its_bound() {
        let mut copy = Copy::default();
        let limit = Copy::charge("a", &[0; 100]) * 2;
        assert!(copy.put("a", Bytes::from(vec![0; 100]), limit));
        assert!(copy.put("b", Bytes::from(vec![0; 100]), limit));
        assert!(!copy.put("c", Bytes::from(vec![0; 100]), limit));
        // Replacing a value is charged the difference.
        assert!(copy.put("a", Bytes::from(vec![1; 100]), limit));
        assert!(copy.remove("b"));
        assert!(copy.put("c", Bytes::from(vec![0; 100]), limit));
        assert_eq!(copy.bytes, limit);
    }

    #[test]
    fn an_older_change_from_the_watch_does_not_undo_this_nodes_write() {
        let mut copy = Copy::default();
        // This node wrote revision 5; the watch then delivers another
        // node's revision 4, then the echo of 5.
        assert!(copy.own_write("k", 5));
        assert!(!copy.watch_delivers("k", 4));
        assert!(copy.watch_delivers("k", 5));
        assert!(copy.pending.is_empty());
        // A write the watch is already past is not applied again.
        assert!(copy.watch_delivers("k", 9));
        assert!(!copy.own_write("k", 7));
    }
}
