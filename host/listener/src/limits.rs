//! What a listener is told: its limits and timeouts, one value the caller
//! publishes through a `tokio::sync::watch` channel and replaces whenever
//! they change (a config reload).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// A listener's limits and timeouts. The listeners follow the latest value
/// of their watch: `max_connections`, `max_connections_per_client`,
/// `tarpit_max`, `defer_accept` and `listen_backlog` apply to the open
/// listeners at once; the rest applies to connections accepted from then
/// on (a connection keeps the limits it was accepted with).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once, over every listener of a
    /// [`Server`](crate::Server); more wait in the kernel's queue.
    pub max_connections: usize,
    /// Connections one client address may hold (`0`: no limit); past it a
    /// new one is refused: held unread in the tarpit for
    /// `header_read_timeout`, then closed.
    pub max_connections_per_client: usize,
    /// Refused connections held at most (the oldest closed first for a
    /// new one; zero closes them at once). Fewer when the open-file limit
    /// has no room for them ([`crate::open_files`]).
    pub tarpit_max: usize,
    /// The kernel's queue of connections not yet accepted, per listener.
    pub listen_backlog: u32,
    /// A connection reaches the accept loop once its first bytes have come
    /// (Linux `TCP_DEFER_ACCEPT`), or after this; zero turns it off.
    pub defer_accept: Duration,
    /// Bytes a connection's socket may hold written but not yet sent
    /// (Linux `TCP_NOTSENT_LOWAT`); zero leaves the kernel's default.
    pub tcp_notsent_lowat: u64,
    /// `Some(peers)`: every connection starts with a PROXY protocol header
    /// (v1 or v2) naming the real client, sent by one of `peers` (the load
    /// balancers); a connection from another peer is closed unread, one
    /// without a valid header is closed. Until its header is read, a
    /// connection counts against its peer's `max_connections_per_client`,
    /// then against the client the header names. To trust any peer, say
    /// so: `PeerFilter::new(|_| true)`.
    pub proxy_protocol: Option<PeerFilter>,
    /// A client must send its PROXY header, and its whole request head,
    /// within this time.
    pub header_read_timeout: Duration,
    /// A TLS client must complete its handshake within this time.
    pub tls_handshake_timeout: Duration,
    /// A connection with no traffic and no request in flight is closed
    /// after this.
    pub idle_timeout: Duration,
    /// The idle timeout while fewer than a tenth of `max_connections` are
    /// free.
    pub busy_idle_timeout: Duration,
    /// Longest time to send one response; the connection (HTTP/1) or the
    /// stream (HTTP/2) is then cut.
    pub send_timeout: Duration,
    /// Longest time a response may make no progress towards the client.
    pub idle_send_timeout: Duration,
    /// Longest time a connection may stay open, whatever it does (`None`:
    /// no bound).
    pub connection_deadline: Option<Duration>,
    /// Largest request head read, in bytes.
    pub max_header_size: usize,
    /// HTTP/1.1 connections serve more than one request.
    pub keep_alive: bool,
    /// HTTP/2 is served (h2c with prior knowledge; over TLS as ALPN chose);
    /// false: HTTP/1 only.
    pub http2: bool,
    /// Connections may be handed to the service for a tunnel: an HTTP/1.1
    /// request with `Upgrade` answered 101, an HTTP/2 CONNECT (extended
    /// CONNECT, RFC 8441, announced in SETTINGS) answered 2xx; the request
    /// carries a [`TunnelTicket`](crate::TunnelTicket).
    pub upgrades: bool,
    /// HTTP/2: streams a client may have open at once.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list a client may send, in bytes.
    pub h2_max_header_list_size: u32,
    /// HTTP/2: streams a client may reset before the server took them up.
    pub h2_max_pending_accept_reset_streams: usize,
    /// HTTP/2: streams the server may reset for the client's errors.
    pub h2_max_local_error_reset_streams: usize,
    /// HTTP/2: a PING is sent this often (zero: never) ...
    pub h2_keep_alive_interval: Duration,
    /// ... and the connection closed when its ACK is not back within this.
    pub h2_keep_alive_timeout: Duration,
    /// When the server stops, in-flight requests get this long to finish.
    pub shutdown_timeout: Duration,
    /// What the caller's configuration puts before these fields' names,
    /// for log lines that name a setting (`"server."`: a change is logged
    /// as `server.max_connections applied ...`).
    pub setting_prefix: &'static str,
}

/// Which peers may do something (send a PROXY header): a test on the
/// peer's address, made by the caller (from its own list of networks).
#[derive(Clone)]
pub struct PeerFilter(Arc<dyn Fn(IpAddr) -> bool + Send + Sync>);

impl PeerFilter {
    /// The peers for which `allows` is true.
    pub fn new(allows: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(allows))
    }

    /// Whether `ip` may.
    pub fn allows(&self, ip: IpAddr) -> bool {
        (self.0)(ip)
    }
}

impl fmt::Debug for PeerFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerFilter").finish_non_exhaustive()
    }
}
