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

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use inlay_core::LogLimit;

use crate::config::{DirectorConfig, DirectorKind};

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
            DirectorKind::Shard => pool.iter().max_by_key(|(b, _)| rendezvous(key, b.name()))?,
        };
        Some(Arc::clone(&chosen.0))
    }
}

/// The hash of a cache key, for `shard`.
pub fn key_hash(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The score of backend `name` for `key`: the highest wins the key.
fn rendezvous(key: u64, name: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `names` shard gives each of 10,000 keys.
    fn shard(names: &[&str]) -> Vec<String> {
        (0..10_000)
            .map(|i| {
                let key = key_hash(&format!("www.example.com/page/{i}"));
                names
                    .iter()
                    .max_by_key(|n| rendezvous(key, n))
                    .unwrap()
                    .to_string()
            })
            .collect()
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

    #[test]
    fn a_backend_that_leaves_the_shard_remaps_only_its_own_keys() {
        let all = shard(&["a", "b", "c", "d"]);
        let without_c = shard(&["a", "b", "d"]);
        let mut moved = 0;
        for (before, after) in all.iter().zip(&without_c) {
            if before == "c" {
                moved += 1;
                assert_ne!(after, "c");
            } else {
                assert_eq!(before, after, "a key of another backend moved");
            }
        }
        // And the keys spread: each of four has a fair share.
        for name in ["a", "b", "c", "d"] {
            let n = all.iter().filter(|b| *b == name).count();
            assert!((2000..3000).contains(&n), "{name}: {n} of 10000");
        }
        assert_eq!(moved, all.iter().filter(|b| *b == "c").count());
    }
}
