//! Connections the service turns into tunnels (a WebSocket, or another
//! protocol upgrade): the ticket a request that may upgrade carries, and
//! the guard that keeps the connection counted while its tunnel is open.
//!
//! hyper hands an upgraded HTTP/1.1 connection's socket to the service and
//! its connection future ends; an HTTP/2 tunnel is a stream of a
//! connection that goes on. Either way the connection stays open, holds
//! its slot (`max_connections`, its client's share) and keeps a drain
//! waiting until the service drops the guard; at the end of the drain
//! (`shutdown_timeout`) the guard tells the tunnel to close.

use std::sync::Arc;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::activity::{Activity, InFlight};

/// In the extensions of every request that may take its connection over
/// (HTTP/1.1 with `Upgrade`, HTTP/2 CONNECT), when the listener serves
/// upgrades ([`Limits::upgrades`](crate::Limits::upgrades)). The service
/// that answers with a tunnel [`open`](Self::open)s it first.
#[derive(Debug, Clone)]
pub struct TunnelTicket {
    activity: Arc<Activity>,
    closing: CancellationToken,
}

impl TunnelTicket {
    pub(crate) fn new(activity: Arc<Activity>, closing: CancellationToken) -> Self {
        Self { activity, closing }
    }

    /// The connection carries a tunnel from now until the guard is
    /// dropped: it counts as open and busy (never idle), its slot is held,
    /// and a drain waits for it.
    pub fn open(self) -> TunnelGuard {
        self.activity.tunnel_opened();
        TunnelGuard {
            _busy: InFlight::new(Arc::clone(&self.activity)),
            activity: self.activity,
            closing: self.closing,
        }
    }
}

/// Held by the service while a tunnel is open on the connection.
pub struct TunnelGuard {
    _busy: InFlight,
    activity: Arc<Activity>,
    closing: CancellationToken,
}

impl TunnelGuard {
    /// Resolves when the server wants the tunnel closed: its drain has
    /// reached `shutdown_timeout`.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.closing.cancelled()
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.activity.tunnel_closed();
    }
}

impl std::fmt::Debug for TunnelGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelGuard")
            .field("closing", &self.closing.is_cancelled())
            .finish_non_exhaustive()
    }
}
