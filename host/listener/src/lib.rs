//! Inlay's listeners: accepting client connections and serving HTTP on
//! them, within limits, in front of a service the caller gives.
//!
//! A [`Server`] runs one accept loop per [`Listener`] (plain, or TLS with
//! certificates chosen by SNI and swapped on reload: [`Tls`]) and serves
//! each admitted connection with HTTP/1.1 or HTTP/2 (hyper), through the
//! service its factory makes for that [`Connection`]. Its [`Limits`] come
//! from a `tokio::sync::watch` channel: the caller publishes new ones (a
//! config reload) and the open listeners follow.
//!
//! The way of a connection, one module each:
//!
//! - [`socket`](bind): binding with a backlog, the socket options of
//!   listeners and connections (`TCP_DEFER_ACCEPT`, `TCP_NOTSENT_LOWAT`);
//! - `accept`: the accept loop, taking a connection slot before it
//!   accepts; the PROXY header ([`proxy_protocol`]) and the TLS handshake;
//! - `admission`: `max_connections` slots with the ones a lowered limit
//!   is owed, the per-address share ([`PerClient`]), and `tarpit`, where
//!   refused connections are held unread and closed by a thread of their own;
//! - `serve`: hyper's HTTP/1.1 and HTTP/2 with the timeouts (header read,
//!   idle, busy idle, send and idle send, in `send_clock` per response
//!   and per HTTP/2 stream), over a socket that records its `activity`;
//! - `tunnel`: connections the service turns into tunnels (an HTTP/1.1
//!   upgrade, an HTTP/2 extended CONNECT), held open and counted until
//!   the tunnel ends ([`TunnelTicket`], [`TunnelGuard`]), and the bytes
//!   of a tunnel copied both ways with no buffer held while nothing moves
//!   ([`copy_both_ways`]);
//! - [`quic`]: HTTP/3 on the QUIC listeners (quinn and h3), with the same
//!   certificates and limits, handing requests to a service as `serve` does
//!   ([`QuicServer`]);
//! - [`open_files`]: the open-file limit the limits need;
//! - [`ConnectionStats`]: what is counted, a Prometheus collector.
//!
//! It knows nothing of config files or of what the service does.

mod accept;
mod activity;
mod admission;
mod coarse;
mod copy;
mod limits;
pub mod open_files;
mod per_client;
pub mod proxy_protocol;
pub mod quic;
mod send_clock;
mod serve;
mod socket;
mod stats;
mod tarpit;
mod tls;
mod tunnel;

use inlay_core::LogLimit;

pub use accept::{Connection, Listener, MakeService, OverTls, Server};
pub use copy::both_ways as copy_both_ways;
pub use limits::{Limits, PeerFilter};
pub use per_client::{ClientSlot, PerClient};
pub use quic::{MakeQuicService, QuicBody, QuicListener, QuicServer, QuicStats};
pub use socket::bind;
pub use stats::{ConnectionStats, OpenConnection};
pub use tls::{CertificateSet, Tls, TlsError, ocsp_response_problem};
pub use tunnel::{TunnelGuard, TunnelTicket};

/// Warnings about what one client did wrong, at most 20 a second: a flood
/// of bad connections must not turn into a flood of log lines. The next
/// line written says how many were left out.
static CLIENT_WARNINGS: LogLimit = LogLimit::per_second(20);

/// The warnings of a tarpit that sheds (not to be lost among the refusals
/// that filled it).
static SHED_WARNINGS: LogLimit = LogLimit::per_second(20);

#[cfg(test)]
mod tests;
