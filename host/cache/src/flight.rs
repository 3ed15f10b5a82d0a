//! Request coalescing: one fetch per key at a time; other requests for the
//! key wait for it and then look the key up again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::debug;

use crate::key::PrimaryKey;

/// How long a waiter waits for another request's fetch before fetching itself.
const MAX_WAIT: Duration = Duration::from_secs(120);

/// The fetches in flight, by key.
#[derive(Clone, Default)]
pub(crate) struct Flights {
    map: Arc<Mutex<HashMap<PrimaryKey, watch::Receiver<()>>>>,
}

/// The right to fetch a key while other requests for it wait. Dropping it
/// (after storing, or on failure) wakes them; they look the key up again.
pub struct Flight {
    flights: Flights,
    primary: PrimaryKey,
    _done: watch::Sender<()>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.flights.map.lock().remove(&self.primary);
    }
}

impl Flight {
    /// The key this flight fetches.
    pub fn primary(&self) -> &PrimaryKey {
        &self.primary
    }
}

impl Flights {
    /// The flight of `primary`, unless another request holds it.
    pub(crate) fn try_fly(&self, primary: &PrimaryKey) -> Option<Flight> {
        let mut map = self.map.lock();
        if map.contains_key(primary) {
            return None;
        }
        let (tx, rx) = watch::channel(());
        map.insert(primary.clone(), rx);
        Some(Flight {
            flights: self.clone(),
            primary: primary.clone(),
            _done: tx,
        })
    }

    /// Waits for the fetch of `primary` in flight to end (stored or
    /// failed), up to [`MAX_WAIT`]. Returns at once and `false` when there
    /// is none.
    pub(crate) async fn wait(&self, primary: &PrimaryKey) -> bool {
        let Some(mut rx) = self.map.lock().get(primary).cloned() else {
            return false;
        };
        debug!(key = primary.as_str(), "joining in-flight fetch");
        // The sender never sends: `changed` returns when it is dropped.
        let _ = tokio::time::timeout(MAX_WAIT, rx.changed()).await;
        true
    }
}
