//! Request coalescing: one fetch per key at a time. Other requests for the
//! key wait for it: once its response is being stored they stream it from
//! the object being filled ([`Filling`]); otherwise they look the key up
//! again when the fetch ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::debug;

use super::Filling;
use crate::key::PrimaryKey;

/// How long a waiter waits for another request's fetch before fetching itself.
const MAX_WAIT: Duration = Duration::from_secs(120);

/// What a flight shows its waiters: nothing yet, or the object being filled.
type Published = Option<Arc<Filling>>;

/// The fetches in flight, by key.
#[derive(Clone, Default)]
pub(crate) struct Flights {
    map: Arc<Mutex<HashMap<PrimaryKey, watch::Receiver<Published>>>>,
}

/// The right to fetch a key while other requests for it wait. Dropping it
/// (after storing, or on failure) wakes the waiters that have not joined
/// the object being filled; they look the key up again.
pub struct Flight {
    flights: Flights,
    primary: PrimaryKey,
    filling: watch::Sender<Published>,
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

    /// Lets waiters stream the response from the object being filled.
    pub(crate) fn publish(&self, filling: Arc<Filling>) {
        self.filling.send_replace(Some(filling));
    }
}

/// How a wait for another request's fetch ended.
pub(crate) enum Waited {
    /// No fetch of the key was in flight.
    NoFlight,
    /// The fetch ended (stored, failed, or the wait timed out): look again.
    Ended,
    /// The fetch is storing a response this request accepts: stream it.
    Joined(Arc<Filling>),
}

impl Flights {
    /// The flight of `primary`, unless another request holds it.
    pub(crate) fn try_fly(&self, primary: &PrimaryKey) -> Option<Flight> {
        let mut map = self.map.lock();
        if map.contains_key(primary) {
            return None;
        }
        let (tx, rx) = watch::channel(None);
        map.insert(primary.clone(), rx);
        Some(Flight {
            flights: self.clone(),
            primary: primary.clone(),
            filling: tx,
        })
    }

    /// Whether the fetch of `primary` in flight has its whole body and is
    /// only storing it: its flight ends once the object is stored.
    pub(crate) fn is_storing(&self, primary: &PrimaryKey) -> bool {
        let map = self.map.lock();
        map.get(primary)
            .is_some_and(|rx| rx.borrow().as_deref().is_some_and(Filling::is_complete))
    }

    /// Waits, up to [`MAX_WAIT`], for the fetch of `primary` in flight to
    /// publish an object being filled that `accept` takes (the variant the
    /// request selects), or to end.
    ///
    /// One published before the wait began is taken only when it is fresh:
    /// the request came after the response did, so it is a hit on the
    /// object being filled, and a response stale on arrival (an upstream
    /// `Age` past its max-age, `max-age=0`) must be revalidated, not served.
    /// A request that waited while it was fetched shares it (collapsed
    /// forwarding, as Varnish and nginx's `proxy_cache_lock` do).
    pub(crate) async fn wait(
        &self,
        primary: &PrimaryKey,
        accept: impl Fn(&Filling) -> bool,
    ) -> Waited {
        let Some(mut rx) = self.map.lock().get(primary).cloned() else {
            return Waited::NoFlight;
        };
        debug!(key = primary.as_str(), "joining in-flight fetch");
        let mut first_look = true;
        let joined = rx.wait_for(|p| {
            let usable = p.as_deref().is_some_and(|f| {
                accept(f) && (!first_look || f.meta().is_fresh(inlay_storage::now_ms()))
            });
            first_look = false;
            usable
        });
        match tokio::time::timeout(MAX_WAIT, joined).await {
            Ok(Ok(published)) => match published.as_ref() {
                Some(filling) => Waited::Joined(filling.clone()),
                None => Waited::Ended,
            },
            // The flight ended without a response this request can use.
            Ok(Err(_)) | Err(_) => Waited::Ended,
        }
    }
}
