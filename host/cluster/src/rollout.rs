//! Policy rollout over the cluster: `inlay admin policy push FILE.wasm`
//! stores a component in the JetStream object store `PREFIX_POLICIES` and
//! points the key `current` of the KV bucket `PREFIX_ROLLOUT` at it; every
//! node watches that key, fetches the component, and swaps it in as a
//! reload does (through the host's [`PolicySwap`]). `rollback` points
//! `current` back at the version pushed before it.
//!
//! A version is `SEQ-HASH`: the push's sequence number and the first 16
//! hex digits of the component's SHA-256, which a node checks on the bytes
//! it fetched. The pointer keeps the last [`MAX_HISTORY`] versions (older
//! components are deleted from the store). A pushed component replaces
//! `policy.path`'s file only: the policy's name (its kv namespace), config
//! and limits stay the node's `[policy]`, and a node without `[policy]`
//! refuses rollouts. A node that starts applies the current version before
//! it serves; one that does not compile is refused (logged, visible in
//! `GET /policy`) and the node keeps the policy it runs.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::jetstream::{kv, object_store};
use bytes::Bytes;
use futures_util::StreamExt as _;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncReadExt as _;
use tracing::{debug, error, info, warn};

use crate::{Cluster, ClusterMetrics};

/// How the rollout changes the policy a node runs: the host loads the
/// component as a reload does, and on any error changes nothing.
pub trait PolicySwap: Send + Sync + 'static {
    /// Run the component at `path` instead of the node's own
    /// `policy.path` (same name, config and limits), or `policy.path`'s
    /// again with `None`: the generation now serving, or every reason it
    /// was refused.
    fn swap_policy(
        &self,
        path: Option<PathBuf>,
    ) -> impl Future<Output = Result<u64, Vec<String>>> + Send;
}

/// Versions the pointer remembers (rollback goes back this far).
pub const MAX_HISTORY: usize = 16;

/// Largest pointer record: a version is at most 40 bytes.
const MAX_POINTER: usize = 4096;

/// The value of the key `current`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Pointer {
    /// The version nodes run; empty: each node its own `policy.path`
    /// (after the first pushed version was rolled back).
    current: String,
    /// Versions pushed, oldest first; the last is `current` (after a
    /// rollback, the versions after it are gone).
    history: Vec<String>,
    /// The highest sequence number given out.
    seq: u64,
}

/// What this node runs, for `GET /policy`, the log and the metrics.
#[derive(Debug, Default)]
pub struct RolloutStatus {
    running: RwLock<Option<String>>,
    refused: RwLock<Option<(String, String)>>,
}

impl RolloutStatus {
    /// The pushed version this node runs (`None`: its `policy.path`).
    pub fn running(&self) -> Option<String> {
        self.running.read().clone()
    }

    /// The last version this node refused, and why.
    pub fn refused(&self) -> Option<(String, String)> {
        self.refused.read().clone()
    }
}

/// The cluster's policy store and pointer.
#[derive(Clone)]
pub struct Rollout {
    store: object_store::ObjectStore,
    pointer: kv::Store,
    max_size: u64,
    status: Arc<RolloutStatus>,
    metrics: Arc<ClusterMetrics>,
}

impl std::fmt::Debug for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// `SEQ-HASH` with the hash of `bytes`.
fn version_of(seq: u64, bytes: &[u8]) -> String {
    format!("{seq}-{}", &hex::encode(Sha256::digest(bytes))[..16])
}

/// The hash part of a well-formed version.
fn hash_of(version: &str) -> Option<&str> {
    let (seq, hash) = version.split_once('-')?;
    let ok = !seq.is_empty()
        && seq.len() <= 20
        && seq.bytes().all(|b| b.is_ascii_digit())
        && hash.len() == 16
        && hash
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    ok.then_some(hash)
}

impl Rollout {
    /// Opens (creating if need be) the cluster's policy store and pointer.
    pub async fn open(cluster: &Cluster) -> anyhow::Result<Self> {
        let js = cluster.jetstream();
        let max_size = cluster.config().policy_max_size;
        let store_name = cluster.name("POLICIES");
        let store = match js.get_object_store(&store_name).await {
            Ok(s) => s,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: store_name.clone(),
                    description: Some("inlay policy components".into()),
                    // The versions kept, and room for a push in flight.
                    max_bytes: i64::try_from(max_size.saturating_mul(MAX_HISTORY as u64 + 2))
                        .unwrap_or(i64::MAX),
                    ..Default::default()
                })
                .await
                .with_context(|| format!("policy rollout: creating object store {store_name}"))?,
        };
        let bucket = cluster.name("ROLLOUT");
        // By hand, as the shared kv's: nats-server 2.9.
        js.get_or_create_stream(crate::kv_bucket_stream(&bucket, -1, MAX_POINTER as i32))
            .await
            .with_context(|| format!("policy rollout: creating bucket {bucket}"))?;
        let pointer = js
            .get_key_value(&bucket)
            .await
            .with_context(|| format!("policy rollout: opening bucket {bucket}"))?;
        Ok(Self {
            store,
            pointer,
            max_size,
            status: Arc::default(),
            metrics: Arc::clone(cluster.metrics()),
        })
    }

    /// What this node runs.
    pub fn status(&self) -> &Arc<RolloutStatus> {
        &self.status
    }

    /// The largest component a push takes (`cluster.policy_max_size`).
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    async fn read_pointer(&self) -> anyhow::Result<(Option<Pointer>, u64)> {
        match self.pointer.entry("current").await? {
            Some(e) if e.operation == kv::Operation::Put => {
                Ok((Some(parse_pointer(&e.value)?), e.revision))
            }
            Some(e) => Ok((None, e.revision)),
            None => Ok((None, 0)),
        }
    }

    /// Writes the pointer if nobody changed it since `revision`.
    async fn write_pointer(&self, p: &Pointer, revision: u64) -> anyhow::Result<()> {
        let value = Bytes::from(serde_json::to_vec(p)?);
        if revision == 0 {
            self.pointer
                .create("current", value)
                .await
                .context("another push changed the current version meanwhile; try again")?;
        } else {
            self.pointer
                .update("current", value, revision)
                .await
                .context("another push changed the current version meanwhile; try again")?;
        }
        Ok(())
    }

    /// Stores `bytes` as a new version and makes it current; the version.
    pub async fn push(&self, bytes: Bytes) -> anyhow::Result<String> {
        if bytes.len() as u64 > self.max_size {
            bail!(
                "the component is {} bytes, over cluster.policy_max_size ({})",
                bytes.len(),
                self.max_size
            );
        }
        if !bytes.starts_with(b"\0asm") {
            bail!("not a WebAssembly component (no \\0asm header)");
        }
        let (old, revision) = self.read_pointer().await?;
        let mut p = old.unwrap_or_default();
        p.seq += 1;
        let version = version_of(p.seq, &bytes);
        self.store
            .put(version.as_str(), &mut bytes.as_ref())
            .await
            .with_context(|| format!("storing version {version}"))?;
        p.current.clone_from(&version);
        p.history.push(version.clone());
        let gone: Vec<String> = if p.history.len() > MAX_HISTORY {
            p.history.drain(..p.history.len() - MAX_HISTORY).collect()
        } else {
            Vec::new()
        };
        self.write_pointer(&p, revision).await?;
        for v in gone {
            if let Err(e) = self.store.delete(&v).await {
                warn!(version = %v, error = %e, "policy rollout: deleting an old version failed");
            }
        }
        info!(%version, size = bytes.len(), "policy rollout: pushed; every node loads it");
        Ok(version)
    }

    /// Points `current` back at the version pushed before it, or, when
    /// none is left, at each node's own `policy.path` (`None`).
    pub async fn rollback(&self) -> anyhow::Result<Option<String>> {
        let (p, revision) = self.read_pointer().await?;
        let Some(mut p) = p.filter(|p| !p.history.is_empty()) else {
            bail!("nothing to roll back: every node runs its own policy.path");
        };
        let dropped = p.history.pop().unwrap_or_default();
        p.current = p.history.last().cloned().unwrap_or_default();
        self.write_pointer(&p, revision).await?;
        if let Err(e) = self.store.delete(&dropped).await {
            warn!(version = %dropped, error = %e, "policy rollout: deleting the rolled-back version failed");
        }
        let current = (!p.current.is_empty()).then_some(p.current);
        match &current {
            Some(v) => {
                info!(version = %v, replaced = %dropped, "policy rollout: rolled back; every node loads it")
            }
            None => {
                info!(replaced = %dropped, "policy rollout: rolled back; every node returns to its own policy.path")
            }
        }
        Ok(current)
    }

    /// The current version and the history, for `GET /policy`.
    pub async fn pointer_json(&self) -> serde_json::Value {
        match self.read_pointer().await {
            Ok((Some(p), _)) => {
                let current = (!p.current.is_empty()).then_some(p.current);
                serde_json::json!({"current": current, "history": p.history})
            }
            Ok((None, _)) => serde_json::Value::Null,
            Err(e) => serde_json::json!({"error": e.to_string()}),
        }
    }

    /// The component of `version`, checked against its size bound and hash.
    async fn fetch(&self, version: &str) -> anyhow::Result<Vec<u8>> {
        let hash = hash_of(version).context("malformed version")?;
        let mut object = self.store.get(version).await.context("fetching")?;
        if object.info().size as u64 > self.max_size {
            bail!(
                "{} bytes, over cluster.policy_max_size ({})",
                object.info().size,
                self.max_size
            );
        }
        let mut bytes = Vec::new();
        (&mut object)
            .take(self.max_size + 1)
            .read_to_end(&mut bytes)
            .await
            .context("reading")?;
        if bytes.len() as u64 > self.max_size {
            bail!("over cluster.policy_max_size ({})", self.max_size);
        }
        if !hex::encode(Sha256::digest(&bytes)).starts_with(hash) {
            bail!("its bytes do not match its hash");
        }
        Ok(bytes)
    }

    /// Loads `version` into this node's policy slot through `swap`.
    async fn apply<P: PolicySwap>(&self, version: &str, swap: &P, dir: &Path) {
        if version.is_empty() {
            return self.apply_own(swap, dir).await;
        }
        if self.status.running().as_deref() == Some(version) {
            return;
        }
        let result = async {
            let bytes = self.fetch(version).await?;
            tokio::fs::create_dir_all(dir)
                .await
                .with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{version}.wasm"));
            tokio::fs::write(&path, &bytes)
                .await
                .with_context(|| format!("writing {}", path.display()))?;
            match swap.swap_policy(Some(path.clone())).await {
                Ok(generation) => Ok((path, generation)),
                Err(errors) => {
                    let _ = std::fs::remove_file(&path);
                    Err(anyhow::anyhow!(errors.join("; ")))
                }
            }
        }
        .await;
        match result {
            Ok((path, generation)) => {
                let previous = self.status.running.write().replace(version.to_owned());
                self.metrics.set_policy_version(version);
                info!(%version, generation, "policy rollout: this node runs policy version {version}");
                // The file of the version it replaced is no longer read.
                if let Some(old) = previous
                    && old != version
                {
                    let _ = std::fs::remove_file(dir.join(format!("{old}.wasm")));
                }
                debug!(path = %path.display(), "policy rollout: component written");
            }
            Err(e) => {
                error!(%version, error = %format!("{e:#}"), "policy rollout: version {version} refused; this node keeps its policy");
                *self.status.refused.write() = Some((version.to_owned(), format!("{e:#}")));
            }
        }
    }

    /// Returns this node to its own `policy.path` (every pushed version
    /// was rolled back).
    async fn apply_own<P: PolicySwap>(&self, swap: &P, dir: &Path) {
        let Some(old) = self.status.running() else {
            return;
        };
        match swap.swap_policy(None).await {
            Ok(generation) => {
                *self.status.running.write() = None;
                self.metrics.clear_policy_version();
                info!(
                    generation,
                    "policy rollout: this node runs its own policy.path again"
                );
                let _ = std::fs::remove_file(dir.join(format!("{old}.wasm")));
            }
            Err(errors) => {
                let e = errors.join("; ");
                error!(error = %e, "policy rollout: returning to policy.path refused; this node keeps version {old}");
                *self.status.refused.write() = Some(("policy.path".to_owned(), e));
            }
        }
    }

    /// Applies the current version now (before the node serves, up to
    /// `wait`), then follows `current` in the background.
    ///
    /// `temporary` is `dir` when it is a temporary directory: it goes
    /// with the task.
    pub async fn follow<P: PolicySwap>(
        self,
        swap: Arc<P>,
        dir: PathBuf,
        temporary: Option<tempfile::TempDir>,
        wait: Duration,
    ) {
        let mut watch = match self.pointer.watch_with_history("current").await {
            Ok(w) => w,
            Err(e) => {
                error!(error = %e, "policy rollout: cannot watch the current version; this node will not follow pushes");
                return;
            }
        };
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let this = self.clone();
        tokio::spawn(async move {
            let _temporary = temporary;
            // Nothing pushed yet: nothing to wait for.
            if matches!(this.read_pointer().await, Ok((None, _))) {
                tx.send_replace(true);
            }
            while let Some(entry) = watch.next().await {
                match entry {
                    Ok(e) if e.operation == kv::Operation::Put => match parse_pointer(&e.value) {
                        Ok(p) => this.apply(&p.current, swap.as_ref(), &dir).await,
                        Err(err) => {
                            warn!(error = %format!("{err:#}"), "policy rollout: ignoring a malformed pointer");
                        }
                    },
                    Ok(_) => {}
                    Err(err) => warn!(error = %err, "policy rollout: watch error"),
                }
                tx.send_replace(true);
            }
            warn!("policy rollout: the watch ended; this node no longer follows pushes");
        });
        if tokio::time::timeout(wait, rx.wait_for(|applied| *applied))
            .await
            .is_err()
        {
            warn!(
                "policy rollout: the current version is not applied after {wait:?}; serving, it applies when it arrives"
            );
        }
    }
}

fn parse_pointer(value: &[u8]) -> anyhow::Result<Pointer> {
    if value.len() > MAX_POINTER {
        bail!("pointer of {} bytes", value.len());
    }
    let p: Pointer = serde_json::from_slice(value).context("pointer")?;
    let own = p.current.is_empty() && p.history.is_empty();
    if (!own && hash_of(&p.current).is_none()) || p.history.len() > MAX_HISTORY {
        bail!("malformed pointer");
    }
    Ok(p)
}

/// With `[cluster]`, open the rollout; on a node with a `[policy]` (whose
/// policy `swap` changes), apply the current version before the node
/// serves and follow it. Pushed components are kept in `cache_dir`'s
/// `rollout` folder when the cache is on disk, else in a temporary
/// directory. The rollout, for the admin API.
pub async fn start<P: PolicySwap>(
    cluster: Option<&Cluster>,
    swap: Option<Arc<P>>,
    cache_dir: Option<&Path>,
) -> Option<Rollout> {
    let cluster = cluster?;
    let rollout = match Rollout::open(cluster).await {
        Ok(r) => r,
        Err(e) => {
            error!(error = %format!("{e:#}"), "policy rollout unavailable on this node");
            return None;
        }
    };
    let Some(swap) = swap else {
        info!("policy rollout: this node has no [policy]; it does not load pushed versions");
        return Some(rollout);
    };
    // Beside the cache when it is on disk; else in a temporary directory
    // of its own, removed with the follow task.
    let (dir, temporary) = match cache_dir {
        Some(d) => (d.join("rollout"), None),
        None => match tempfile::Builder::new().prefix("inlay-rollout-").tempdir() {
            Ok(t) => (t.path().to_owned(), Some(t)),
            Err(e) => {
                error!(error = %e, "policy rollout: no temporary directory for pushed components; this node will not follow pushes");
                return Some(rollout);
            }
        },
    };
    rollout
        .clone()
        .follow(swap, dir, temporary, Duration::from_secs(30))
        .await;
    Some(rollout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_carry_their_hash_and_only_well_formed_ones_parse() {
        let v = version_of(7, b"\0asm");
        assert!(v.starts_with("7-"));
        assert_eq!(hash_of(&v).map(str::len), Some(16));
        for bad in [
            "",
            "7",
            "-0123456789abcdef",
            "7-0123",
            "x-0123456789abcdef",
            "7-0123456789ABCDEF",
            "7-../../etc/passw",
        ] {
            assert_eq!(hash_of(bad), None, "{bad}");
        }
        assert!(parse_pointer(b"{\"current\":\"../x\",\"history\":[],\"seq\":1}").is_err());
        assert!(parse_pointer(&vec![b' '; MAX_POINTER + 1]).is_err());
    }
}
