//! What the cluster counts, for `GET /metrics`: one [`ClusterMetrics`] per
//! process, given to [`Cluster::connect`](crate::Cluster::connect) and
//! registered once with the host's registry as a [`Collector`].
//!
//! The fan-out counts its purges and bans as they happen; the rollout sets
//! the version it runs; sharding's figures and the shared kv's usage are
//! read from the shard and the kv when the text is made. Every series is
//! rendered (at zero) whether or not the node is in a cluster, as before
//! they moved here. With the host's counting off (`[metrics] enabled =
//! false`, the flag given to [`ClusterMetrics::new`]) nothing is counted
//! or read; the policy version is state and is set regardless.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::kv::SharedKv;
use crate::shard::Shard;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

/// The cluster's series (`inlay_cluster_*` and `inlay_policy_info`).
#[derive(Debug)]
pub struct ClusterMetrics {
    /// The host's `[metrics] enabled`.
    enabled: Arc<AtomicBool>,
    invalidations: Family<KindLabel, Counter>,
    /// `inlay_policy_info{version}`: the pushed policy version running.
    policy_version: Family<VersionLabel, Gauge>,
    /// Read at scrape time, once sharding runs.
    shard: Mutex<Weak<Shard>>,
    members: Gauge,
    forwarded: Counter,
    fallbacks: Counter,
    bad_heartbeats: Counter,
    refused_members: Counter,
    forged_hops: Counter,
    /// Read at scrape time, once the shared kv is open.
    kv: Mutex<Option<SharedKv>>,
    kv_keys: Gauge,
    kv_bytes: Gauge,
    kv_dropped: Counter,
}

impl Default for ClusterMetrics {
    /// Counting always (for a cluster outside a host, as in tests).
    fn default() -> Self {
        Self::new(Arc::new(AtomicBool::new(true)))
    }
}

impl ClusterMetrics {
    /// Every series at zero; nothing is counted while `enabled` is false.
    pub fn new(enabled: Arc<AtomicBool>) -> Self {
        Self {
            enabled,
            invalidations: Family::default(),
            policy_version: Family::default(),
            shard: Mutex::new(Weak::new()),
            members: Gauge::default(),
            forwarded: Counter::default(),
            fallbacks: Counter::default(),
            bad_heartbeats: Counter::default(),
            refused_members: Counter::default(),
            forged_hops: Counter::default(),
            kv: Mutex::new(None),
            kv_keys: Gauge::default(),
            kv_bytes: Gauge::default(),
            kv_dropped: Counter::default(),
        }
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Counts `n` events of the purge fan-out
    /// (`inlay_cluster_invalidations_total{kind}`, see
    /// [`fanout::kind`](crate::fanout::kind)).
    pub(crate) fn invalidation(&self, kind: &'static str, n: u64) {
        if self.enabled() && n > 0 {
            self.invalidations
                .get_or_create(&KindLabel { kind })
                .inc_by(n);
        }
    }

    /// The count of one kind of the fan-out's events
    /// ([`fanout::kind`](crate::fanout::kind)).
    pub fn invalidations(&self, kind: &'static str) -> u64 {
        self.invalidations
            .get(&KindLabel { kind })
            .map_or(0, |c| c.get())
    }

    /// This node now runs the pushed policy `version`.
    pub(crate) fn set_policy_version(&self, version: &str) {
        self.policy_version.clear();
        self.policy_version
            .get_or_create(&VersionLabel {
                version: version.to_owned(),
            })
            .set(1);
    }

    /// This node runs its own `policy.path` again: no pushed version.
    pub(crate) fn clear_policy_version(&self) {
        self.policy_version.clear();
    }

    /// Read `shard`'s figures at each scrape from now on.
    pub(crate) fn observe_shard(&self, shard: &Arc<Shard>) {
        *self.shard.lock() = Arc::downgrade(shard);
    }

    /// Read `kv`'s usage at each scrape from now on.
    pub(crate) fn observe_kv(&self, kv: &SharedKv) {
        *self.kv.lock() = Some(kv.clone());
    }

    /// Copies the shard's and the kv's figures (when counting is on).
    fn observe(&self) {
        if !self.enabled() {
            return;
        }
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(shard) = self.shard.lock().upgrade() {
            let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
            let c = shard.counts();
            self.members.set(gauge(shard.live().peers.len() as u64));
            for (to, from) in [
                (&self.forwarded, &c.forwarded),
                (&self.fallbacks, &c.fallbacks),
                (&self.bad_heartbeats, &c.bad_heartbeats),
                (&self.refused_members, &c.refused_members),
                (&self.forged_hops, &c.forged_hops),
            ] {
                to.inner().store(load(from), Ordering::Relaxed);
            }
        }
        if let Some(kv) = self.kv.lock().as_ref() {
            let (keys, bytes) = kv.usage();
            self.kv_keys.set(gauge(keys));
            self.kv_bytes.set(gauge(bytes));
            self.kv_dropped
                .inner()
                .store(kv.dropped(), Ordering::Relaxed);
        }
    }
}

impl ClusterMetrics {
    /// Every series: its name (after the host's `inlay_` prefix), its
    /// help, and its figures, in the order they are written.
    fn series(&self) -> [(&'static str, &'static str, &dyn EncodeMetric); 11] {
        [
            (
                "cluster_members",
                "Live members of the shard as this node sees them, itself included",
                &self.members,
            ),
            (
                "cluster_owner_fetches",
                "Misses and refreshes fetched from their key's owner node",
                &self.forwarded,
            ),
            (
                "cluster_owner_fallbacks",
                "Misses whose owner node could not be reached, fetched from the origin",
                &self.fallbacks,
            ),
            (
                "cluster_bad_heartbeats",
                "Heartbeats dropped: too large, not JSON, or bad fields",
                &self.bad_heartbeats,
            ),
            (
                "cluster_refused_members",
                "Heartbeats of new nodes dropped because the member table was full",
                &self.refused_members,
            ),
            (
                "cluster_forged_hops",
                "Requests whose Inlay-Cluster-Hop field named no member's token (removed)",
                &self.forged_hops,
            ),
            (
                "cluster_invalidations",
                "Purges and bans of the cluster's fan-out, by kind: published, publish_failed, lost, applied, replayed, duplicate, malformed, apply_failed, refused, cache_cleared",
                &self.invalidations,
            ),
            (
                "policy_info",
                "The policy version pushed to the cluster this node runs (value 1)",
                &self.policy_version,
            ),
            (
                "cluster_kv_keys",
                "Keys in this node's copy of the shared policy kv",
                &self.kv_keys,
            ),
            (
                "cluster_kv_bytes",
                "Bytes charged to this node's copy of the shared policy kv",
                &self.kv_bytes,
            ),
            (
                "cluster_kv_dropped",
                "Shared kv entries left out of this node's copy (past cluster.kv_max_bytes)",
                &self.kv_dropped,
            ),
        ]
    }
}

impl Collector for ClusterMetrics {
    /// Each series as `Registry::register` writes it (its help gets a full
    /// stop; an empty family is left out), with the registry's prefix.
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.observe();
        for (name, help, metric) in self.series() {
            if metric.is_empty() {
                continue;
            }
            let help = format!("{help}.");
            metric.encode(encoder.encode_descriptor(name, &help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    /// The text is what the host rendered when these series were its own
    /// (`Registry::register` in its `metrics.rs`): the same names, types,
    /// help and labels, byte for byte.
    #[test]
    fn the_collector_writes_what_the_host_rendered() {
        let m = Arc::new(ClusterMetrics::default());
        m.invalidation(crate::fanout::kind::APPLIED, 2);
        m.set_policy_version("3-0123456789abcdef");
        let mut registry = Registry::with_prefix("inlay");
        registry.register_collector(Box::new(Arc::clone(&m)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let expected = "\
             # HELP inlay_cluster_members Live members of the shard as this node sees them, itself included.\n\
             # TYPE inlay_cluster_members gauge\n\
             inlay_cluster_members 0\n\
             # HELP inlay_cluster_owner_fetches Misses and refreshes fetched from their key's owner node.\n\
             # TYPE inlay_cluster_owner_fetches counter\n\
             inlay_cluster_owner_fetches_total 0\n\
             # HELP inlay_cluster_owner_fallbacks Misses whose owner node could not be reached, fetched from the origin.\n\
             # TYPE inlay_cluster_owner_fallbacks counter\n\
             inlay_cluster_owner_fallbacks_total 0\n\
             # HELP inlay_cluster_bad_heartbeats Heartbeats dropped: too large, not JSON, or bad fields.\n\
             # TYPE inlay_cluster_bad_heartbeats counter\n\
             inlay_cluster_bad_heartbeats_total 0\n\
             # HELP inlay_cluster_refused_members Heartbeats of new nodes dropped because the member table was full.\n\
             # TYPE inlay_cluster_refused_members counter\n\
             inlay_cluster_refused_members_total 0\n\
             # HELP inlay_cluster_forged_hops Requests whose Inlay-Cluster-Hop field named no member's token (removed).\n\
             # TYPE inlay_cluster_forged_hops counter\n\
             inlay_cluster_forged_hops_total 0\n\
             # HELP inlay_cluster_invalidations Purges and bans of the cluster's fan-out, by kind: published, publish_failed, lost, applied, replayed, duplicate, malformed, apply_failed, refused, cache_cleared.\n\
             # TYPE inlay_cluster_invalidations counter\n\
             inlay_cluster_invalidations_total{kind=\"applied\"} 2\n\
             # HELP inlay_policy_info The policy version pushed to the cluster this node runs (value 1).\n\
             # TYPE inlay_policy_info gauge\n\
             inlay_policy_info{version=\"3-0123456789abcdef\"} 1\n\
             # HELP inlay_cluster_kv_keys Keys in this node's copy of the shared policy kv.\n\
             # TYPE inlay_cluster_kv_keys gauge\n\
             inlay_cluster_kv_keys 0\n\
             # HELP inlay_cluster_kv_bytes Bytes charged to this node's copy of the shared policy kv.\n\
             # TYPE inlay_cluster_kv_bytes gauge\n\
             inlay_cluster_kv_bytes 0\n\
             # HELP inlay_cluster_kv_dropped Shared kv entries left out of this node's copy (past cluster.kv_max_bytes).\n\
             # TYPE inlay_cluster_kv_dropped counter\n\
             inlay_cluster_kv_dropped_total 0\n\
             # EOF\n\
        ";
        assert_eq!(text, expected);
    }

    #[test]
    fn nothing_is_counted_while_counting_is_off_but_the_policy_version_is_set() {
        let on = Arc::new(AtomicBool::new(false));
        let m = ClusterMetrics::new(Arc::clone(&on));
        m.invalidation(crate::fanout::kind::PUBLISHED, 1);
        m.set_policy_version("1-0123456789abcdef");
        assert_eq!(m.invalidations(crate::fanout::kind::PUBLISHED), 0);
        assert!(!EncodeMetric::is_empty(&m.policy_version));
        on.store(true, Ordering::Relaxed);
        m.invalidation(crate::fanout::kind::PUBLISHED, 1);
        assert_eq!(m.invalidations(crate::fanout::kind::PUBLISHED), 1);
        m.clear_policy_version();
        assert!(EncodeMetric::is_empty(&m.policy_version));
    }
}
