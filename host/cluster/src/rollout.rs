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
//!
//! A component backend's file (`[backends.NAME] component`) rolls out the
//! same way ([`Target::Component`]): its pointer is the key
//! `component.NAME` of the same bucket, its versions are stored as
//! `component.NAME.SEQ-HASH`, and every node with that component backend
//! swaps the file in as a reload does (the backend's other settings stay
//! the node's). Requests in flight finish on the component they started
//! with; none is dropped.

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

/// How the rollout changes the policy or a component backend a node runs:
/// the host loads the component as a reload does, and on any error
/// changes nothing.
pub trait PolicySwap: Send + Sync + 'static {
    /// Run the component at `path` instead of the node's own
    /// `policy.path` (same name, config and limits), or `policy.path`'s
    /// again with `None`: the generation now serving, or every reason it
    /// was refused.
    fn swap_policy(
        &self,
        path: Option<PathBuf>,
    ) -> impl Future<Output = Result<u64, Vec<String>>> + Send;

    /// Serve component backend `backend` from the component at `path`
    /// instead of its configured file (same settings), or from that file
    /// again with `None`.
    fn swap_component(
        &self,
        backend: &str,
        path: Option<PathBuf>,
    ) -> impl Future<Output = Result<u64, Vec<String>>> + Send;
}

/// What a rollout replaces on the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The policy (`policy.path`).
    Policy,
    /// The file of component backend NAME (`backends.NAME.component`).
    Component(String),
}

impl Target {
    /// Component backend `name`'s file, if `name` is a backend name a KV
    /// key can carry (1 to 64 letters, digits, `-`, `_`).
    pub fn component(name: &str) -> anyhow::Result<Self> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            bail!("{name:?} is not a component backend's name");
        }
        Ok(Self::Component(name.to_owned()))
    }

    /// Its key in the pointer bucket.
    fn key(&self) -> String {
        match self {
            Self::Policy => "current".to_owned(),
            Self::Component(name) => format!("component.{name}"),
        }
    }

    /// The object (and file) name of `version`.
    fn object(&self, version: &str) -> String {
        match self {
            Self::Policy => version.to_owned(),
            Self::Component(name) => format!("component.{name}.{version}"),
        }
    }

    /// What it is, for the log.
    fn label(&self) -> String {
        match self {
            Self::Policy => "policy".to_owned(),
            Self::Component(name) => format!("component {name}"),
        }
    }
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

/// The cluster's store and pointer of one target.
#[derive(Clone)]
pub struct Rollout {
    target: Target,
    store: object_store::ObjectStore,
    pointer: kv::Store,
    max_size: u64,
    status: Arc<RolloutStatus>,
    metrics: Arc<ClusterMetrics>,
}

impl std::fmt::Debug for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout")
            .field("target", &self.target)
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
            target: Target::Policy,
            store,
            pointer,
            max_size,
            status: Arc::default(),
            metrics: Arc::clone(cluster.metrics()),
        })
    }

    /// The same store and pointer bucket for `target`, its status its own.
    pub fn for_target(&self, target: Target) -> Self {
        Self {
            target,
            status: Arc::default(),
            ..self.clone()
        }
    }

    /// What it replaces.
    pub fn target(&self) -> &Target {
        &self.target
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
        match self.pointer.entry(self.target.key()).await? {
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
                .create(self.target.key(), value)
                .await
                .context("another push changed the current version meanwhile; try again")?;
        } else {
            self.pointer
                .update(self.target.key(), value, revision)
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
            .put(self.target.object(&version).as_str(), &mut bytes.as_ref())
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
            if let Err(e) = self.store.delete(self.target.object(&v)).await {
                warn!(version = %v, error = %e, "{} rollout: deleting an old version failed", self.target.label());
            }
        }
        info!(%version, size = bytes.len(), "{} rollout: pushed; every node loads it", self.target.label());
        Ok(version)
    }

    /// Points `current` back at the version pushed before it, or, when
    /// none is left, at each node's own `policy.path` (`None`).
    pub async fn rollback(&self) -> anyhow::Result<Option<String>> {
        let (p, revision) = self.read_pointer().await?;
        let Some(mut p) = p.filter(|p| !p.history.is_empty()) else {
            match &self.target {
                Target::Policy => {
                    bail!("nothing to roll back: every node runs its own policy.path")
                }
                Target::Component(name) => {
                    bail!("nothing to roll back: every node runs its own backends.{name}.component")
                }
            }
        };
        let dropped = p.history.pop().unwrap_or_default();
        p.current = p.history.last().cloned().unwrap_or_default();
        self.write_pointer(&p, revision).await?;
        if let Err(e) = self.store.delete(self.target.object(&dropped)).await {
            warn!(version = %dropped, error = %e, "{} rollout: deleting the rolled-back version failed", self.target.label());
        }
        let current = (!p.current.is_empty()).then_some(p.current);
        match &current {
            Some(v) => {
                info!(version = %v, replaced = %dropped, "{} rollout: rolled back; every node loads it", self.target.label())
            }
            None => {
                info!(replaced = %dropped, "{} rollout: rolled back; every node returns to its own file", self.target.label())
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
        let mut object = self
            .store
            .get(self.target.object(version))
            .await
            .context("fetching")?;
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
            let path = dir.join(format!("{}.wasm", self.target.object(version)));
            // Written aside and renamed: a reload never reads half of it.
            let aside = path.with_extension("wasm.part");
            tokio::fs::write(&aside, &bytes)
                .await
                .with_context(|| format!("writing {}", aside.display()))?;
            tokio::fs::rename(&aside, &path)
                .await
                .with_context(|| format!("writing {}", path.display()))?;
            match self.swap(swap, Some(path.clone())).await {
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
                if self.target == Target::Policy {
                    self.metrics.set_policy_version(version);
                }
                let what = self.target.label();
                info!(%version, generation, "{what} rollout: this node runs {what} version {version}");
                // The file of the version it replaced is no longer read.
                if let Some(old) = previous
                    && old != version
                {
                    let _ = std::fs::remove_file(
                        dir.join(format!("{}.wasm", self.target.object(&old))),
                    );
                }
                debug!(path = %path.display(), "{what} rollout: component written");
            }
            Err(e) => {
                let what = self.target.label();
                error!(%version, error = %format!("{e:#}"), "{what} rollout: version {version} refused; this node keeps its {what}");
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
        let own = match &self.target {
            Target::Policy => "policy.path".to_owned(),
            Target::Component(name) => format!("backends.{name}.component"),
        };
        match self.swap(swap, None).await {
            Ok(generation) => {
                *self.status.running.write() = None;
                if self.target == Target::Policy {
                    self.metrics.clear_policy_version();
                }
                info!(
                    generation,
                    "{} rollout: this node runs its own {own} again",
                    self.target.label()
                );
                let _ =
                    std::fs::remove_file(dir.join(format!("{}.wasm", self.target.object(&old))));
            }
            Err(errors) => {
                let e = errors.join("; ");
                error!(error = %e, "{} rollout: returning to {own} refused; this node keeps version {old}", self.target.label());
                *self.status.refused.write() = Some((own, e));
            }
        }
    }

    /// Swaps `path` in for the target (its own file with `None`).
    async fn swap<P: PolicySwap>(
        &self,
        swap: &P,
        path: Option<PathBuf>,
    ) -> Result<u64, Vec<String>> {
        match &self.target {
            Target::Policy => swap.swap_policy(path).await,
            Target::Component(name) => swap.swap_component(name, path).await,
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
        temporary: Option<Arc<tempfile::TempDir>>,
        wait: Duration,
    ) {
        let what = self.target.label();
        let mut watch = match self.pointer.watch_with_history(self.target.key()).await {
            Ok(w) => w,
            Err(e) => {
                error!(error = %e, "{what} rollout: cannot watch the current version; this node will not follow pushes");
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
                            warn!(error = %format!("{err:#}"), "{} rollout: ignoring a malformed pointer", this.target.label());
                        }
                    },
                    Ok(_) => {}
                    Err(err) => warn!(error = %err, "{} rollout: watch error", this.target.label()),
                }
                tx.send_replace(true);
            }
            warn!(
                "{} rollout: the watch ended; this node no longer follows pushes",
                this.target.label()
            );
        });
        if tokio::time::timeout(wait, rx.wait_for(|applied| *applied))
            .await
            .is_err()
        {
            warn!(
                "{what} rollout: the current version is not applied after {wait:?}; serving, it applies when it arrives"
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

/// The rollouts of a node: the policy's, and those of the component
/// backends it follows.
#[derive(Debug, Clone)]
pub struct Rollouts {
    /// The policy's.
    pub policy: Rollout,
    /// Each component backend's this node follows, by backend name.
    pub components: Vec<Rollout>,
}

impl Rollouts {
    /// The rollout of component backend `name` (this node's, if it has
    /// that backend; else one that pushes and reports only).
    pub fn component(&self, name: &str) -> anyhow::Result<Rollout> {
        let target = Target::component(name)?;
        Ok(self
            .components
            .iter()
            .find(|r| r.target == target)
            .cloned()
            .unwrap_or_else(|| self.policy.for_target(target)))
    }
}

/// With `[cluster]`, open the rollouts; on a node with a `[policy]`
/// (`has_policy`), apply the policy's current version before the node
/// serves and follow it, and the same for each of its `components`
/// (component backend names), all through `swap`. Pushed components are
/// kept in `cache_dir`'s `rollout` folder when the cache is on disk, else
/// in a temporary directory. The rollouts, for the admin API.
pub async fn start<P: PolicySwap>(
    cluster: Option<&Cluster>,
    swap: Arc<P>,
    has_policy: bool,
    components: &[String],
    cache_dir: Option<&Path>,
) -> Option<Rollouts> {
    let cluster = cluster?;
    let rollout = match Rollout::open(cluster).await {
        Ok(r) => r,
        Err(e) => {
            error!(error = %format!("{e:#}"), "policy rollout unavailable on this node");
            return None;
        }
    };
    let mut targets = Vec::new();
    if has_policy {
        targets.push(rollout.clone());
    } else {
        info!("policy rollout: this node has no [policy]; it does not load pushed versions");
    }
    let mut followed = Vec::new();
    for name in components {
        match Target::component(name) {
            Ok(target) => {
                let r = rollout.for_target(target);
                followed.push(r.clone());
                targets.push(r);
            }
            Err(e) => warn!(error = %e, "component rollout: not followed"),
        }
    }
    let rollouts = Rollouts {
        policy: rollout,
        components: followed,
    };
    if targets.is_empty() {
        return Some(rollouts);
    }
    // Beside the cache when it is on disk; else in a temporary directory
    // of its own, removed with the follow tasks.
    let (dir, temporary) = match cache_dir {
        Some(d) => (d.join("rollout"), None),
        None => match tempfile::Builder::new().prefix("inlay-rollout-").tempdir() {
            Ok(t) => (t.path().to_owned(), Some(Arc::new(t))),
            Err(e) => {
                error!(error = %e, "policy rollout: no temporary directory for pushed components; this node will not follow pushes");
                return Some(rollouts);
            }
        },
    };
    for r in targets {
        r.follow(
            Arc::clone(&swap),
            dir.clone(),
            temporary.clone(),
            Duration::from_secs(30),
        )
        .await;
    }
    Some(rollouts)
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

    #[test]
    fn a_component_target_has_its_own_key_and_object_names() {
        let t = Target::component("app_2-x").expect("a backend name");
        assert_eq!(t.key(), "component.app_2-x");
        assert_eq!(
            t.object("3-0123456789abcdef"),
            "component.app_2-x.3-0123456789abcdef"
        );
        assert_eq!(Target::Policy.key(), "current");
        assert_eq!(
            Target::Policy.object("3-0123456789abcdef"),
            "3-0123456789abcdef"
        );
        for bad in ["", "a.b", "a b", "../x", "*", &"x".repeat(65)] {
            assert!(Target::component(bad).is_err(), "{bad:?}");
        }
    }
}
