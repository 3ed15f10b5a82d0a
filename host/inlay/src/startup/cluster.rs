//! This host's side of the cluster (`[cluster]`, crate `inlay-cluster`):
//! what the crate asks of a node, implemented on the reloader (the cache
//! new requests use, the policy it runs), the cluster's figures added to
//! `GET /metrics`, and the rollout served on the admin API.

use std::path::PathBuf;
use std::sync::Arc;

use inlay_cache::HttpCache;
use inlay_cluster::fanout::{Fanout, FanoutHost};
use inlay_cluster::rollout::{PolicySwap, Rollout, Rollouts};
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

    async fn swap_component(
        &self,
        backend: &str,
        path: Option<PathBuf>,
    ) -> Result<u64, Vec<String>> {
        self.roll_out_component(backend, path)
            .await
            .map(|report| report.generation)
    }
}

/// Start the purge fan-out for the node `reloader` serves: the purges of
/// other nodes that it missed are applied before this returns.
pub async fn start_fanout(cluster: &Cluster, reloader: &Arc<Reloader>) -> anyhow::Result<Fanout> {
    Fanout::start(cluster, Arc::clone(reloader) as Arc<dyn FanoutHost>).await
}

/// With `[cluster]`, the rollouts: on a node with a `[policy]` the
/// policy's current version applies before this returns, and so does each
/// component backend's; `GET /policy`, `POST /policy/push` and `POST
/// /policy/rollback` are served on `admin` (with `?component=NAME`, for
/// that component backend's file).
pub async fn start_rollout(cluster: Option<&Cluster>, reloader: &Arc<Reloader>, admin: &Admin) {
    let cfg = reloader.current_config();
    let components: Vec<String> = cfg
        .backends
        .iter()
        .filter(|(_, b)| b.component.is_some())
        .map(|(name, _)| name.clone())
        .collect();
    let rollouts = inlay_cluster::rollout::start(
        cluster,
        Arc::clone(reloader),
        cfg.policy.is_some(),
        &components,
        cfg.cache.dir.as_deref(),
    )
    .await;
    wire_admin(admin, rollouts);
}

/// The admin API's rollout calls, when this node has the rollout.
fn wire_admin(admin: &Admin, rollouts: Option<Rollouts>) {
    let Some(rollouts) = rollouts else { return };
    let max = usize::try_from(rollouts.policy.max_size()).unwrap_or(usize::MAX);
    admin.set_hooks(|h| {
        let hook: RolloutHook = Arc::new(move |call, component| {
            let rollout: Result<Rollout, String> = match component {
                None => Ok(rollouts.policy.clone()),
                Some(name) => rollouts.component(&name).map_err(|e| format!("{e:#}")),
            };
            Box::pin(async move {
                let rollout = rollout?;
                let what = match rollout.target() {
                    inlay_cluster::rollout::Target::Policy => "policy".to_owned(),
                    inlay_cluster::rollout::Target::Component(name) => format!("component {name}"),
                };
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
                        .map_err(|e| format!("{what} push refused: {e:#}")),
                    RolloutCall::Rollback => rollout
                        .rollback()
                        .await
                        .map(|v| serde_json::json!({"current": v}))
                        .map_err(|e| format!("{what} rollback refused: {e:#}")),
                }
            })
        });
        h.rollout = Some((hook, max));
    });
}
