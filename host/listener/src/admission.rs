//! Who may open a connection now: `max_connections` slots shared by every
//! listener of a server, the per-address share, and the tarpit for those
//! refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::info;

use crate::limits::Limits;
use crate::per_client::PerClient;
use crate::tarpit::Tarpit;

/// `max_connections` slots shared by every listener, and
/// `max_connections_per_client` per client address. Both follow the
/// limits' watch ([`Admission::follow`]): a raised limit admits more at
/// once; a lowered one admits no one new until enough connections have
/// closed (open ones are never cut).
pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    /// The `max_connections` the slots are sized to; the accept loop that
    /// moves it applies the change.
    size: AtomicUsize,
    /// Slots a shrink could not take back at once (they were in use):
    /// the connections holding them give them up when they close.
    owed: Arc<AtomicUsize>,
    pub(crate) per_client: PerClient,
    /// Connections refused for their address's share, held unread.
    pub(crate) tarpit: Tarpit,
}

impl Admission {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            size: AtomicUsize::new(limits.max_connections),
            owed: Arc::default(),
            per_client: PerClient::new(limits.max_connections_per_client),
            tarpit: Tarpit::new(tarpit_bound(limits)),
        }
    }

    /// Take `limits`, if they changed.
    pub(crate) fn follow(&self, limits: &Limits) {
        self.per_client.set_limit(limits.max_connections_per_client);
        self.tarpit
            .max
            .store(tarpit_bound(limits), Ordering::Relaxed);
        let want = limits.max_connections;
        // Two listeners may see a change at once: the one whose exchange
        // wins applies the change from the size it replaced.
        let Ok(was) = self
            .size
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n != want).then_some(want)
            })
        else {
            return;
        };
        if want > was {
            let more = want - was;
            // Slots still owed from an earlier shrink are forgiven first.
            let owed = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                    Some(o.saturating_sub(more))
                })
                .unwrap_or(0);
            self.slots.add_permits(more - owed.min(more));
        } else {
            let fewer = was - want;
            let taken = self.slots.forget_permits(fewer);
            self.owed.fetch_add(fewer - taken, Ordering::AcqRel);
        }
        info!(
            from = was,
            to = want,
            "{}max_connections applied to the open listeners",
            limits.setting_prefix
        );
    }

    /// A connection slot, when one is free.
    pub(crate) async fn slot(&self) -> ConnectionSlot {
        match Arc::clone(&self.slots).acquire_owned().await {
            Ok(permit) => ConnectionSlot {
                permit: Some(permit),
                owed: Arc::clone(&self.owed),
            },
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// Slots free now.
    pub(crate) fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

/// The tarpit's bound under the open-file limit.
fn tarpit_bound(limits: &Limits) -> usize {
    crate::open_files::tarpit_bound(limits.max_connections, limits.tarpit_max)
}

/// One of the `max_connections` slots, held for a connection's life.
pub(crate) struct ConnectionSlot {
    permit: Option<OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
}

impl ConnectionSlot {
    /// Give the slot up to what a lowered limit owes, if it owes any:
    /// `None` when it was taken. The accept loop holds a slot while it
    /// waits for a client; one that a change lowered the limit under must
    /// not admit the next client.
    pub(crate) fn unless_owed(mut self) -> Option<Self> {
        let owed = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| o.checked_sub(1))
            .is_ok();
        if !owed {
            return Some(self);
        }
        if let Some(permit) = self.permit.take() {
            permit.forget();
        }
        None
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let pays = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| o.checked_sub(1))
            .is_ok();
        if pays {
            // The slot goes away with the limit that was lowered.
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(total: usize) -> Limits {
        Limits {
            max_connections: total,
            ..crate::tests::limits()
        }
    }

    /// `n` slots, taken now (each must be free).
    async fn take(a: &Admission, n: usize) -> Vec<ConnectionSlot> {
        let mut slots = Vec::new();
        for _ in 0..n {
            let slot = tokio::time::timeout(Duration::from_secs(5), a.slot());
            slots.push(slot.await.expect("a free slot"));
        }
        slots
    }

    #[tokio::test]
    async fn a_raised_connection_limit_frees_slots_at_once() {
        let a = Admission::new(&limits(2));
        let held = take(&a, 2).await;
        assert_eq!(a.free(), 0);
        a.follow(&limits(5));
        assert_eq!(a.free(), 3);
        drop(held);
        assert_eq!(a.free(), 5);
    }

    #[tokio::test]
    async fn a_lowered_connection_limit_is_paid_by_the_connections_that_close() {
        let a = Admission::new(&limits(4));
        let mut held = take(&a, 3).await;
        // One free slot goes at once; two more are owed by open connections.
        a.follow(&limits(1));
        assert_eq!(a.free(), 0);
        held.pop();
        held.pop();
        assert_eq!(a.free(), 0, "the first two closes pay what is owed");
        held.pop();
        assert_eq!(a.free(), 1);
        // Raised while slots are owed: the debt is forgiven first.
        let mut held = take(&a, 1).await;
        a.follow(&limits(3));
        held.extend(take(&a, 2).await);
        a.follow(&limits(1));
        assert_eq!(a.owed.load(Ordering::Relaxed), 2);
        a.follow(&limits(2));
        assert_eq!(a.owed.load(Ordering::Relaxed), 1);
        assert_eq!(a.free(), 0);
        held.pop();
        assert_eq!(a.free(), 0);
        held.pop();
        assert_eq!(a.free(), 1);
        held.pop();
        assert_eq!(a.free(), 2);
    }

    #[tokio::test]
    async fn the_slot_the_accept_loop_holds_goes_to_a_lowered_limit_first() {
        let a = Admission::new(&limits(3));
        let mut open = take(&a, 2).await;
        let waiting = take(&a, 1).await.pop().unwrap();
        a.follow(&limits(2));
        assert!(waiting.unless_owed().is_none(), "two are open: no third");
        assert_eq!(a.free(), 0);
        open.pop();
        let next = take(&a, 1).await.pop().unwrap();
        assert!(next.unless_owed().is_some());
    }

    #[test]
    fn a_changed_share_per_address_applies_to_the_open_listeners() {
        let a = Admission::new(&limits(10));
        let ip: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let _first = a.per_client.take(ip).expect("no limit");
        a.follow(&Limits {
            max_connections_per_client: 1,
            ..limits(10)
        });
        assert!(a.per_client.take(ip).is_none());
    }
}
