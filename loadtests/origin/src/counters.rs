//! Per-path request counters, so tests can tell how often the proxy went to
//! the origin (cache hits, request coalescing, ESI fragment fetches).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// Distinct paths tracked before new ones are lumped under [`OVERFLOW_KEY`],
/// so a load test over random paths cannot grow the map without bound.
pub const MAX_PATHS: usize = 100_000;

/// The key that counts requests to paths beyond [`MAX_PATHS`].
pub const OVERFLOW_KEY: &str = "(other)";

/// Request counts keyed by path (without the query).
#[derive(Default)]
pub struct Counters {
    // Read lock + atomic add on the hot path; the write lock is taken only
    // the first time a path is seen.
    paths: RwLock<HashMap<Box<str>, AtomicU64>>,
}

impl Counters {
    /// Counts one request to `path`.
    pub fn hit(&self, path: &str) {
        if let Some(n) = self.paths.read().get(path) {
            n.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut paths = self.paths.write();
        let key = if paths.len() < MAX_PATHS || paths.contains_key(path) {
            path
        } else {
            OVERFLOW_KEY
        };
        paths
            .entry(key.into())
            .or_insert_with(|| AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The count for one path (0 if never requested).
    pub fn get(&self, path: &str) -> u64 {
        self.paths
            .read()
            .get(path)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Every count, sorted by path.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.paths
            .read()
            .iter()
            .map(|(path, n)| (path.to_string(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Forgets every count.
    pub fn reset(&self) {
        self.paths.write().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_path_and_resets() {
        let c = Counters::default();
        c.hit("/a");
        c.hit("/a");
        c.hit("/b");
        assert_eq!(c.get("/a"), 2);
        assert_eq!(c.get("/b"), 1);
        assert_eq!(c.get("/c"), 0);
        assert_eq!(
            c.snapshot().into_iter().collect::<Vec<_>>(),
            [("/a".to_string(), 2), ("/b".to_string(), 1)]
        );
        c.reset();
        assert_eq!(c.get("/a"), 0);
        assert!(c.snapshot().is_empty());
    }

    #[test]
    fn overflow_paths_are_lumped_together() {
        let c = Counters::default();
        for i in 0..MAX_PATHS + 3 {
            c.hit(&format!("/p/{i}"));
        }
        c.hit("/p/0");
        assert_eq!(c.get("/p/0"), 2);
        assert_eq!(c.get(OVERFLOW_KEY), 3);
        assert_eq!(c.get(&format!("/p/{}", MAX_PATHS + 1)), 0);
    }
}
