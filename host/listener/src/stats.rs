//! What a server counts of its connections, read at scrape time: a
//! Prometheus [`Collector`] the caller registers in its own registry.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Connections accepted and open now. Rendered as `connections_open` and
/// `connections_accepted_total` (under the registry's prefix). While
/// counting is off nothing is counted (the figures stay at zero, as
/// every metric of a registry that counts nothing).
#[derive(Debug)]
pub struct ConnectionStats {
    counting: AtomicBool,
    accepted: AtomicU64,
    open: AtomicI64,
}

impl ConnectionStats {
    /// At zero; counting or not.
    pub fn new(counting: bool) -> Self {
        Self {
            counting: AtomicBool::new(counting),
            accepted: AtomicU64::new(0),
            open: AtomicI64::new(0),
        }
    }

    /// Count from now on, or stop counting (a connection counted as open
    /// is still counted out when it closes).
    pub fn set_counting(&self, counting: bool) {
        self.counting.store(counting, Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    /// A connection accepted; it counts as open until the guard drops.
    pub fn opened(self: &Arc<Self>) -> OpenConnection {
        if !self.counting.load(Ordering::Relaxed) {
            return OpenConnection(None);
        }
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(Some(Arc::clone(self)))
    }
}

impl Default for ConnectionStats {
    /// Counting.
    fn default() -> Self {
        Self::new(true)
    }
}

/// A connection counted as open until dropped ([`ConnectionStats::opened`]).
#[derive(Debug)]
pub struct OpenConnection(Option<Arc<ConnectionStats>>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(stats) = &self.0 {
            stats.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Collector for ConnectionStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let open = ConstGauge::new(self.open());
        open.encode(encoder.encode_descriptor(
            "connections_open",
            // With the period `Registry::register` adds to its metrics' help.
            "Client connections open now.",
            None,
            open.metric_type(),
        )?)?;
        let accepted = ConstCounter::new(self.accepted());
        accepted.encode(encoder.encode_descriptor(
            "connections_accepted",
            "Client connections accepted (MAIN.sess_conn).",
            None,
            accepted.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    fn render(stats: &Arc<ConnectionStats>) -> String {
        let mut r = Registry::with_prefix("inlay");
        r.register_collector(Box::new(Arc::clone(stats)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        text
    }

    #[test]
    fn connections_show_under_the_registry_prefix_and_uncounted_ones_stay_at_zero() {
        let stats = Arc::new(ConnectionStats::new(true));
        let open = stats.opened();
        let text = render(&stats);
        assert!(
            text.contains("# HELP inlay_connections_open Client connections open now.\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE inlay_connections_open gauge\ninlay_connections_open 1\n"));
        assert!(text.contains("# TYPE inlay_connections_accepted counter\n"));
        assert!(
            text.contains("inlay_connections_accepted_total 1\n"),
            "{text}"
        );
        stats.set_counting(false);
        drop(open);
        let _uncounted = stats.opened();
        assert_eq!((stats.accepted(), stats.open()), (1, 0));
    }
}
