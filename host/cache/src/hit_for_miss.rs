//! Hit-for-miss: keys whose last response was uncacheable, so that
//! requests for them fetch at once instead of queueing behind each other
//! (Varnish's hit-for-miss).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::key::PrimaryKey;

/// Entries kept before expired ones are swept out on insert.
const SWEEP_ABOVE: usize = 100_000;

/// Keys marked hit-for-miss, with when the mark ends.
#[derive(Clone, Default)]
pub(crate) struct HitForMiss {
    map: Arc<Mutex<HashMap<PrimaryKey, Instant>>>,
}

impl HitForMiss {
    /// Whether `primary` is marked now.
    pub(crate) fn contains(&self, primary: &PrimaryKey) -> bool {
        let mut map = self.map.lock();
        match map.get(primary) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                map.remove(primary);
                false
            }
            None => false,
        }
    }

    /// Marks `primary` for `ttl`.
    pub(crate) fn mark(&self, primary: &PrimaryKey, ttl: Duration) {
        let mut map = self.map.lock();
        if map.len() > SWEEP_ABOVE {
            let now = Instant::now();
            map.retain(|_, until| *until > now);
        }
        map.insert(primary.clone(), Instant::now() + ttl);
    }

    /// Removes the mark (the key was stored or purged).
    pub(crate) fn clear(&self, primary: &PrimaryKey) {
        self.map.lock().remove(primary);
    }
}
