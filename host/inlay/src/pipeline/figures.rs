//! The figures of the generation serving, read at each scrape: its store's
//! sizes and counters, its cache's ban list, and its policy runtime's
//! counts. The reloader, which owns the generations, registers this
//! collector once; it follows every reload (a new `cache.dir`, a policy
//! loaded where there was none).

use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;

use super::Generations;
use crate::metrics::{Figures, Metrics};

/// Collects the current generation's store, ban and policy figures.
pub struct GenerationFigures {
    /// Weak: the metrics outlive the server (a test keeps them to read
    /// after a stop), and must not keep its store open.
    current: Weak<Generations>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for GenerationFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerationFigures").finish_non_exhaustive()
    }
}

impl GenerationFigures {
    /// The figures of `current`'s generation, written while `metrics`
    /// counts (zero while counting is off, the names still there).
    pub fn new(current: &Arc<Generations>, metrics: Arc<Metrics>) -> Self {
        Self {
            current: Arc::downgrade(current),
            metrics,
        }
    }
}

impl Collector for GenerationFigures {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        let generation = self.current.upgrade().map(|g| g.load_full());
        // Zero while counting is off, and once the server has stopped.
        let generation = generation.filter(|_| self.metrics.enabled());
        let mut f = Figures::new(encoder);
        // The store's figures may ask the file system: this runs on the
        // blocking pool (`Metrics::render`).
        let s = match &generation {
            Some(g) => g.cache.store().stats_blocking(),
            None => Default::default(),
        };
        let tiers = |with_disk: &[(&'static str, u64); 2]| match s.disk_enabled {
            true => with_disk.to_vec(),
            // A memory-only store: no disk figures, rather than zeros that
            // read as an empty disk tier.
            false => with_disk[..1].to_vec(),
        };
        f.gauges_by(
            "store_objects",
            "Objects in the cache per tier (MAIN.n_object)",
            None,
            "tier",
            &tiers(&[("memory", s.memory_objects), ("disk", s.disk_objects)]),
        )?;
        f.gauges_by(
            "store",
            "Bytes held per tier (SMA.s0.g_bytes / SMF g_bytes)",
            Some(Unit::Bytes),
            "tier",
            &tiers(&[("memory", s.memory_bytes), ("disk", s.disk_bytes)]),
        )?;
        f.gauges_by(
            "store_capacity",
            "Budget per tier (g_bytes + g_space)",
            Some(Unit::Bytes),
            "tier",
            &tiers(&[("memory", s.memory_capacity), ("disk", s.disk_capacity)]),
        )?;
        f.counters_by(
            "store_evictions",
            "Objects evicted to respect a tier's budget (MAIN.n_lru_nuked)",
            "tier",
            &tiers(&[("memory", s.evicted_memory), ("disk", s.evicted_disk)]),
        )?;
        f.counter(
            "store_expired",
            "Objects removed past their keep window (MAIN.n_expired)",
            s.expired_removed,
        )?;
        f.counter(
            "store_write_errors",
            "Store writes that failed (SMF c_fail)",
            s.write_errors,
        )?;
        f.gauge(
            "store_disk_index_records",
            "Disk-tier records held in memory (cache.disk_index_cache)",
            None,
            s.disk_index_records,
        )?;
        f.gauge(
            "store_disk_index_bytes",
            "Bytes of the disk-tier records held in memory",
            None,
            s.disk_index_bytes,
        )?;
        let bans = match &generation {
            Some(g) => g.cache.ban_counts(),
            None => Default::default(),
        };
        f.gauge(
            "bans",
            "Bans in the ban list now (MAIN.bans)",
            None,
            bans.active,
        )?;
        f.counter(
            "bans_added",
            "Bans added, by the admin API or the BAN method (MAIN.bans_added)",
            bans.added,
        )?;
        let (mut replayed, mut live, mut size, mut in_use) = (0, 0, 0, 0);
        if let Some(slot) = generation.as_ref().and_then(|g| g.policy.as_ref()) {
            let policy = slot.current();
            let memo = policy.memo_stats().unwrap_or_default();
            (replayed, live) = (memo.replayed, memo.live);
            let engine = policy.engine();
            size = u64::from(engine.max_instances());
            in_use = size.saturating_sub(engine.free_instances() as u64);
        }
        f.counter(
            "policy_replayed_calls",
            "Policy hooks answered from recorded paths, without an instance (this policy generation)",
            replayed,
        )?;
        f.counter(
            "policy_live_calls",
            "Policy hooks that ran in an instance (this policy generation)",
            live,
        )?;
        f.gauge(
            "policy_pool_in_use",
            "Policy instance slots checked out now",
            None,
            in_use,
        )?;
        f.gauge(
            "policy_pool_size",
            "Policy instance slots in the pool",
            None,
            size,
        )
    }
}
