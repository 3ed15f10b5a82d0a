//! Hit-for-miss: keys whose last response was uncacheable, so that
//! requests for them fetch at once instead of queueing behind each other
//! (Varnish's hit-for-miss).
//!
//! The marks live in a bounded, sharded cache (`quick_cache`): a flood of
//! uncacheable URLs evicts the least useful marks in O(1) per insert
//! instead of growing a map or scanning it under one lock.

use std::time::{Duration, Instant};

use quick_cache::sync::Cache;

use crate::key::PrimaryKey;

/// Marks kept at most; past it, older and colder marks are evicted (an
/// evicted mark only means that key's next requests coalesce again).
const CAPACITY: usize = 100_000;

/// Keys marked hit-for-miss, with when the mark ends.
pub(crate) struct HitForMiss {
    marks: Cache<PrimaryKey, Instant>,
}

impl Default for HitForMiss {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl HitForMiss {
    /// At most `capacity` marks.
    fn with_capacity(capacity: usize) -> Self {
        Self {
            marks: Cache::new(capacity),
        }
    }

    /// Whether `primary` is marked now.
    pub(crate) fn contains(&self, primary: &PrimaryKey) -> bool {
        match self.marks.get(primary) {
            Some(until) if until > Instant::now() => true,
            Some(_) => {
                self.marks.remove(primary);
                false
            }
            None => false,
        }
    }

    /// Marks `primary` for `ttl` (a TTL past what `Instant` can hold
    /// marks it for about a century).
    pub(crate) fn mark(&self, primary: &PrimaryKey, ttl: Duration) {
        let now = Instant::now();
        let until = now
            .checked_add(ttl)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
            .unwrap_or(now);
        self.marks.insert(primary.clone(), until);
    }

    /// Removes the mark (the key was stored or purged).
    pub(crate) fn clear(&self, primary: &PrimaryKey) {
        self.marks.remove(primary);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> PrimaryKey {
        PrimaryKey::new("example.com", &format!("/p?{i}"), &[])
    }

    #[test]
    fn marks_are_bounded_and_recent_ones_kept() {
        let hfm = HitForMiss::with_capacity(1_000);
        for i in 0..10_000 {
            hfm.mark(&key(i), Duration::from_secs(3600));
        }
        // Unexpired marks cannot grow the map past its capacity.
        assert!(hfm.len() <= 1_000, "{} marks kept", hfm.len());
        assert!(hfm.contains(&key(9_999)));
        hfm.clear(&key(9_999));
        assert!(!hfm.contains(&key(9_999)));
    }

    #[test]
    fn expired_marks_do_not_count() {
        let hfm = HitForMiss::with_capacity(10);
        hfm.mark(&key(1), Duration::ZERO);
        assert!(!hfm.contains(&key(1)));
        // A TTL too large for `Instant` does not panic.
        hfm.mark(&key(2), Duration::MAX);
        assert!(hfm.contains(&key(2)));
    }
}
