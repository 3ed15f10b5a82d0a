//! Directors: named groups of backends a request may be sent to by name,
//! as Varnish's directors. Each pick skips sick backends; when every
//! backend of the group is sick, the pick is one of them anyway, so that
//! the request fails as one to a sick backend does (503, or a stale
//! object in grace) instead of with an error of its own.
//!
//! - `round_robin`: each healthy backend in turn.
//! - `random`: a healthy backend at random, in proportion to its weight.
//! - `fallback`: the first healthy backend in the listed order.
//! - `shard`: consistent hashing on the cache key (rendezvous hashing: the
//!   backend with the highest hash of key and name), so that a backend
//!   that leaves (sick, or removed from the list) remaps only its own keys.
//!   The hash is [`inlay_core::rendezvous`]'s, the cluster's shard's too:
//!   specified, so a key keeps its backend across releases.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use inlay_core::LogLimit;

use inlay_core::rendezvous;

use inlay_config::{DirectorConfig, DirectorKind};

use super::Backend;

/// One configured director, over the backends of its generation.
#[derive(Debug)]
pub struct Director {
    config: DirectorConfig,
    members: Vec<(Arc<Backend>, u32)>,
    next: AtomicUsize,
    /// The retry warnings of this director, at most one a second: an
    /// outage retries every request, and must not turn into a line for each.
    retry_log: LogLimit,
}

/// The retries a line stands for: its own and those left out before it.
fn retries_in_line(left_out: Option<u64>) -> Option<u64> {
    left_out.map(|n| n + 1)
}

impl Director {
    /// The director of `config` over `members` (the backends it names,
    /// with their weights, in its order).
    pub(crate) fn new(config: DirectorConfig, members: Vec<(Arc<Backend>, u32)>) -> Self {
        Self {
            config,
            members,
            next: AtomicUsize::new(0),
            retry_log: LogLimit::per_second(1),
        }
    }

    /// A retry happened: `Some(how many since the last line)` when it
    /// may be logged (at most once a second).
    pub fn log_retry(&self) -> Option<u64> {
        retries_in_line(self.retry_log.admit())
    }

    /// The director's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The director's config.
    pub fn config(&self) -> &DirectorConfig {
        &self.config
    }

    /// Its type and backends, and how many of them are healthy.
    pub fn health_json(&self) -> serde_json::Value {
        let healthy = self.members.iter().filter(|(b, _)| b.is_healthy()).count();
        serde_json::json!({
            "type": self.config.kind.as_str(),
            "backends": self.members.iter().map(|(b, _)| b.name()).collect::<Vec<_>>(),
            "healthy": healthy,
        })
    }

    /// The backend for a request whose cache key hashes to `key` (read by
    /// `shard` only), other than `except` (a backend that just failed);
    /// `None` when there is no other.
    pub fn pick(&self, key: u64, except: Option<&Backend>) -> Option<Arc<Backend>> {
        let candidates: Vec<&(Arc<Backend>, u32)> = self
            .members
            .iter()
            .filter(|(b, _)| except.is_none_or(|e| !std::ptr::eq(b.as_ref(), e)))
            .collect();
        let healthy: Vec<&(Arc<Backend>, u32)> = candidates
            .iter()
            .copied()
            .filter(|(b, _)| b.is_healthy())
            .collect();
        // Every one sick: one of them, to fail as a sick backend does.
        let pool = if healthy.is_empty() {
            if except.is_some() {
                return None;
            }
            candidates
        } else {
            healthy
        };
        let chosen = match self.config.kind {
            DirectorKind::Fallback => pool.first()?,
            DirectorKind::RoundRobin => {
                // A retry's pick does not move the turn on.
                let n = match except {
                    None => self.next.fetch_add(1, Ordering::Relaxed),
                    Some(_) => self.next.load(Ordering::Relaxed),
                };
                pool.get(n % pool.len().max(1))?
            }
            DirectorKind::Random => {
                let total: u64 = pool.iter().map(|(_, w)| u64::from(*w)).sum();
                let mut at = rand::random_range(0..total.max(1));
                pool.iter()
                    .find(|(_, w)| {
                        let w = u64::from(*w);
                        if at < w {
                            true
                        } else {
                            at -= w;
                            false
                        }
                    })
                    .or(pool.last())?
            }
            DirectorKind::Shard => rendezvous::owner(
                key,
                pool.iter()
                    .map(|m| (m.0.name(), rendezvous::hash(m.0.name()), *m)),
            )?,
        };
        Some(Arc::clone(&chosen.0))
    }
}

/// The hash of a cache key, for `shard`.
pub use inlay_core::rendezvous::hash as key_hash;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backends;
    use inlay_config::Config;
    use inlay_metrics::Metrics;

    /// A `shard` director over backends named `names`.
    fn shard(names: &[&str]) -> Backends {
        let mut toml = String::from("default_backend = \"pool\"\n");
        for (i, n) in names.iter().enumerate() {
            toml.push_str(&format!(
                "[backends.{n}]\naddress = \"http://127.0.0.1:{}\"\n",
                i + 1
            ));
        }
        let members: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        toml.push_str(&format!(
            "[directors.pool]\ntype = \"shard\"\nbackends = [{}]\n",
            members.join(", ")
        ));
        Backends::new(
            &Config::from_toml(&toml).expect("valid"),
            &Default::default(),
            &Default::default(),
            &Metrics::new(true),
        )
    }

    fn pick(backends: &Backends, key: &str) -> String {
        let picked = backends.pick("pool", || key_hash(key)).expect("picked");
        picked.name().to_owned()
    }

    #[test]
    fn retries_are_logged_once_a_second_with_their_count() {
        let log = LogLimit::per_second(1);
        let line = |second: u64| retries_in_line(log.admit_at(second * 1000));
        let first: Vec<u64> = (0..1000).filter_map(|_| line(100)).collect();
        assert_eq!(first, [1], "one line in the first second");
        let next: Vec<u64> = (0..10).filter_map(|_| line(101)).collect();
        assert_eq!(
            next,
            [1000],
            "the next second's line counts what was left out"
        );
    }

    /// The vectors pinned in `inlay_core::rendezvous` (where the spread
    /// and the keys a leaving node moves are tested): a director maps a key
    /// as the cluster's shard does, and as the last release did.
    #[test]
    fn a_shard_director_maps_keys_with_the_pinned_rendezvous_hash() {
        let backends = shard(&["edge-3", "edge-1", "edge-2"]);
        for (key, owner) in [
            ("www.example.com/", "edge-1"),
            ("www.example.com/about", "edge-2"),
            ("shop.example.com/cart?id=42", "edge-3"),
        ] {
            assert_eq!(pick(&backends, key), owner, "{key}");
        }
    }

    #[test]
    fn a_backend_that_leaves_the_shard_remaps_only_its_own_keys() {
        let keys: Vec<String> = (0..2000)
            .map(|i| format!("www.example.com/page/{i}"))
            .collect();
        let all = shard(&["a", "b", "c", "d"]);
        let without_c = shard(&["a", "b", "d"]);
        for key in &keys {
            let (before, after) = (pick(&all, key), pick(&without_c, key));
            if before == "c" {
                assert_ne!(after, "c");
            } else {
                assert_eq!(before, after, "a key of another backend moved");
            }
        }
    }
}
