//! This host's side of the cluster (`[cluster]`, crate `inlay-cluster`):
//! what the crate asks of a node, implemented on the reloader (the cache
//! new requests use, the policy it runs), the cluster's figures added to
//! `GET /metrics`, and the rollout served on the admin API.

use std::path::PathBuf;
use std::sync::Arc;

use inlay_cache::HttpCache;
use inlay_cluster::fanout::{Fanout, FanoutHost};
use inlay_cluster::rollout::{PolicySwap, Rollout};
use inlay_cluster::{Cluster, ClusterMetrics};

use crate::admin::{Admin, RolloutCall, RolloutHook};
use crate::metrics::Metrics;
use crate::reload::Reloader;

/// The cluster's figures, counted while `metrics` counts and written with
/// its text (at zero on a node without `[cluster]`).
pub fn metrics(metrics: &Metrics) -> Arc<ClusterMetrics> {
    let cluster = Arc::new(ClusterMetrics::new(metrics.enabled_flag()));
    metrics.register_collector(Box::new(Arc::clone(&cluster)));
    cluster
}

/// Other nodes' purges go to the cache of the generation serving when
/// they arrive, and count with this node's purges.
impl FanoutHost for Reloader {
    fn cache(&self) -> HttpCache {
        self.current().cache().clone()
    }

    fn purged(&self, objects: u64) {
        self.current().metrics().purged(objects);
    }
}

/// A pushed version is loaded as a reload loads `policy.path`.
impl PolicySwap for Reloader {
    async fn swap_policy(&self, path: Option<PathBuf>) -> Result<u64, Vec<String>> {
        self.roll_out_policy(path)
            .await
            .map(|report| report.generation)
    }
}

/// Start the purge fan-out for the node `reloader` serves: the purges of
/// other nodes that it missed are applied before this returns.
pub async fn start_fanout(cluster: &Cluster, reloader: &Arc<Reloader>) -> anyhow::Result<Fanout> {
    Fanout::start(cluster, Arc::clone(reloader) as Arc<dyn FanoutHost>).await
}

/// With `[cluster]`, the policy rollout: on a node with a `[policy]` the
/// current version applies before this returns; `GET /policy`, `POST
/// /policy/push` and `POST /policy/rollback` are served on `admin`.
pub async fn start_rollout(cluster: Option<&Cluster>, reloader: &Arc<Reloader>, admin: &Admin) {
    let cfg = reloader.current_config();
    let swap = cfg.policy.is_some().then(|| Arc::clone(reloader));
    let rollout = inlay_cluster::rollout::start(cluster, swap, cfg.cache.dir.as_deref()).await;
    wire_admin(admin, rollout);
}

/// The admin API's rollout calls, when this node has the rollout.
fn wire_admin(admin: &Admin, rollout: Option<Rollout>) {
    let Some(rollout) = rollout else { return };
    let max = usize::try_from(rollout.max_size()).unwrap_or(usize::MAX);
    admin.set_hooks(|h| {
        let hook: RolloutHook = Arc::new(move |call| {
            let rollout = rollout.clone();
            Box::pin(async move {
                match call {
                    RolloutCall::Status => {
                        let status = rollout.status();
                        let refused = status.refused().map(
                            |(version, error)| serde_json::json!({"version": version, "error": error}),
                        );
                        Ok(serde_json::json!({
                            "version": status.running(),
                            "refused": refused,
                            "cluster": rollout.pointer_json().await,
                        }))
                    }
                    RolloutCall::Push(bytes) => rollout
                        .push(bytes)
                        .await
                        .map(|v| serde_json::json!({"pushed": v}))
                        .map_err(|e| format!("policy push refused: {e:#}")),
                    RolloutCall::Rollback => rollout
                        .rollback()
                        .await
                        .map(|v| serde_json::json!({"current": v}))
                        .map_err(|e| format!("policy rollback refused: {e:#}")),
                }
            })
        });
        h.rollout = Some((hook, max));
    });
}
