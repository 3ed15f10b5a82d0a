//! Connections open per client address, for `max_connections_per_client`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Connections open per client address, against a limit (0: no limit;
/// connections are counted anyway, so that a limit set later counts the
/// ones already open). Clones share their counts.
#[derive(Clone, Debug, Default)]
pub struct PerClient {
    inner: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    limit: AtomicUsize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerClient {
    /// At most `limit` connections per address (0: no limit).
    pub fn new(limit: usize) -> Self {
        let per_client = Self::default();
        per_client.set_limit(limit);
        per_client
    }

    /// A new limit, for the connections that come from now on.
    pub fn set_limit(&self, limit: usize) {
        self.inner.limit.store(limit, Ordering::Relaxed);
    }

    fn open(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.inner.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection counted for `ip`, or `None` when it holds the limit
    /// already.
    pub fn take(&self, ip: IpAddr) -> Option<ClientSlot> {
        let limit = self.inner.limit.load(Ordering::Relaxed);
        let mut open = self.open();
        let n = open.entry(ip).or_insert(0);
        if limit != 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(ClientSlot(self.clone(), ip))
    }

    /// Addresses with a connection open.
    pub fn addresses(&self) -> usize {
        self.open().len()
    }
}

/// One connection counted against its address until dropped.
#[derive(Debug)]
pub struct ClientSlot(PerClient, IpAddr);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.0.open();
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_share_per_address_counts_the_connections_already_open() {
        let per_client = PerClient::new(0);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        // No limit: counted anyway.
        let first = per_client.take(ip).expect("no limit");
        let second = per_client.take(ip).expect("no limit");
        per_client.set_limit(2);
        assert!(per_client.take(ip).is_none(), "two are open already");
        let other = per_client.take("192.0.2.2".parse().unwrap());
        assert!(other.is_some(), "another address has its own share");
        drop(first);
        let third = per_client.take(ip).expect("one closed");
        per_client.set_limit(3);
        let fourth = per_client.take(ip).expect("raised");
        assert!(per_client.take(ip).is_none());
        drop((second, third, fourth, other));
        assert_eq!(per_client.addresses(), 0);
    }
}
