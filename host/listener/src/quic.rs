//! HTTP/3 on the QUIC listeners: quinn for QUIC (over the same rustls and
//! certificates as the TLS listeners, [`Tls`]), hyperium's h3 for HTTP/3
//! over it, each request handed to the service the caller makes per
//! connection, as on TCP.
//!
//! Bounded like the TCP listeners, by the same [`Limits`]:
//!
//! - `max_connections` QUIC connections at once (counted apart from the TCP
//!   ones), `max_connections_per_client` per address: past either, a new
//!   connection is refused (a CONNECTION_REFUSED close, one packet);
//! - address validation: while more than [`RETRY_ABOVE`] handshakes are
//!   under way, an Initial from an address not yet validated is answered
//!   with a Retry (one packet, no state kept), so a flood of Initials from
//!   spoofed or silent addresses costs no handshakes; a real client
//!   answers the Retry and is served. An address over its share is sent a
//!   Retry too before it is refused, so that spoofed packets cannot use up
//!   another address's share;
//! - `tls_handshake_timeout` for the handshake and HTTP/3's SETTINGS,
//!   `idle_timeout` as QUIC's idle timeout (no packet from the client for
//!   that long), `h2_max_concurrent_streams` request streams at once per
//!   connection, `max_header_size` for a request's field section,
//!   `header_read_timeout` for a request's head, `send_timeout` for a
//!   response and `idle_send_timeout` for each of its writes;
//! - the drain: at shutdown no connection is accepted, every open one is
//!   sent a GOAWAY and its requests finish for up to `shutdown_timeout`;
//!   then the endpoint closes.
//!
//! A change of the limits (a reload) applies to connections accepted from
//! then on; new certificates ([`Tls::install`]) to new handshakes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame};
use hyper::service::Service;
use inlay_core::BoxError;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::CLIENT_WARNINGS;
use crate::accept::{Connection, MakeService};
use crate::limits::Limits;
use crate::per_client::{ClientSlot, PerClient};
use crate::tls::Tls;

/// Handshakes under way past which an address not yet validated is sent
/// a Retry before it gets one (RFC 9000 8.1.2). Below it a client
/// connects in one round trip less.
pub const RETRY_ABOVE: usize = 64;

/// Initials quinn holds before the accept loop takes them up; more are
/// dropped (the client sends its Initial again).
const MAX_INCOMING: usize = 4096;

/// Unidirectional streams a client may open: HTTP/3's control stream and
/// QPACK's two, and room for a few the client may add (RFC 9114 6.2).
const MAX_UNI_STREAMS: u32 = 8;

/// The least a draining connection waits, after its last response, for
/// the client to acknowledge it before the connection is closed.
const CLOSE_AFTER_DRAIN_MIN: Duration = Duration::from_millis(50);

/// How long the endpoint waits, after the drain, for its closes to be
/// sent.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Why a QUIC listener could not be made.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    /// The UDP socket could not be bound.
    #[error("cannot bind UDP {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// rustls's config has no cipher suite QUIC's Initial packets can use.
    #[error("the TLS config cannot serve QUIC: {0}")]
    Crypto(String),
}

/// A bound QUIC listener (UDP), serving HTTP/3 with the certificates of
/// a [`Tls`].
#[derive(Debug)]
pub struct QuicListener {
    endpoint: quinn::Endpoint,
    config: quinn::ServerConfig,
    local: SocketAddr,
}

impl QuicListener {
    /// Bind `addr` (UDP) for HTTP/3 with `tls`'s certificates (swapped by
    /// [`Tls::install`]). It accepts nothing until [`QuicServer::serve`].
    pub fn bind(addr: SocketAddr, tls: &Tls) -> Result<Self, QuicError> {
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls.quic_config())
            .map_err(|e| QuicError::Crypto(e.to_string()))?;
        let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let bind = |source| QuicError::Bind { addr, source };
        let socket = std::net::UdpSocket::bind(addr).map_err(bind)?;
        // No server config until it serves: Initials before then are ignored.
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(bind)?;
        let local = endpoint.local_addr().map_err(bind)?;
        Ok(Self {
            endpoint,
            config,
            local,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Its server config under `limits`; the token key stays the same, so
    /// that Retry tokens issued before a reload are still good.
    fn config_for(&self, limits: &Limits) -> quinn::ServerConfig {
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(limits.h2_max_concurrent_streams.into())
            .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
            .max_idle_timeout(quinn::IdleTimeout::try_from(limits.idle_timeout).ok());
        let mut config = self.config.clone();
        config
            .transport_config(Arc::new(transport))
            .max_incoming(MAX_INCOMING);
        config
    }
}

/// What the QUIC listeners count, read at scrape time: a Prometheus
/// [`Collector`] the caller registers. While counting is off nothing is
/// counted.
#[derive(Debug)]
pub struct QuicStats {
    counting: AtomicBool,
    accepted: AtomicU64,
    open: AtomicUsize,
    retries: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

impl QuicStats {
    /// At zero; counting or not.
    pub fn new(counting: bool) -> Self {
        Self {
            counting: AtomicBool::new(counting),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// Count from now on, or stop counting.
    pub fn set_counting(&self, counting: bool) {
        self.counting.store(counting, Ordering::Relaxed);
    }

    fn add(&self, counter: &AtomicU64) {
        if self.counting.load(Ordering::Relaxed) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Connections whose handshake completed.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now, handshakes under way included.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Initials answered with a Retry.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Connections refused: over `max_connections` or the address's share.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Handshakes that failed or took longer than `tls_handshake_timeout`.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

impl Default for QuicStats {
    /// Counting.
    fn default() -> Self {
        Self::new(true)
    }
}

impl Collector for QuicStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let open = ConstGauge::new(i64::try_from(self.open.load(Ordering::Relaxed)).unwrap_or(0));
        open.encode(encoder.encode_descriptor(
            "quic_connections_open",
            "QUIC (HTTP/3) client connections open now, handshakes under way included.",
            None,
            open.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "quic_connections_accepted",
                "QUIC (HTTP/3) connections whose handshake completed.",
                self.accepted(),
            ),
            (
                "quic_retries",
                "QUIC Initials answered with a Retry (address validation).",
                self.retries(),
            ),
            (
                "quic_refused",
                "QUIC connections refused: over max_connections or the client's share.",
                self.refused(),
            ),
            (
                "quic_handshakes_failed",
                "QUIC handshakes that failed or passed tls_handshake_timeout.",
                self.failed(),
            ),
        ] {
            let c = ConstCounter::new(value);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

/// A connection counted open (handshake or not) until dropped.
struct Counted(Arc<QuicStats>);

impl Counted {
    fn new(stats: &Arc<QuicStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(stats))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A handshake under way, counted until dropped.
struct Handshaking(Arc<AtomicUsize>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The body of a request that came over HTTP/3: the request stream's
/// DATA frames, then its trailers.
pub struct QuicBody {
    stream: h3::server::RequestStream<h3_quinn::RecvStream, Bytes>,
    data_done: bool,
    done: bool,
}

impl std::fmt::Debug for QuicBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicBody")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Drop for QuicBody {
    fn drop(&mut self) {
        // Answered without the rest of the body (a GET, a 413): the client
        // is told to stop sending with H3_NO_ERROR (RFC 9114 4.1), not the
        // transport's bare 0.
        if !self.data_done {
            self.stream.stop_sending(h3::error::Code::H3_NO_ERROR);
        }
    }
}

impl Body for QuicBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match this.stream.poll_recv_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(mut buf))) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Ok(None)) => this.data_done = true,
                Poll::Ready(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
        let trailers = this.stream.poll_recv_trailers(cx);
        match trailers {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                this.done = true;
                match result {
                    Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                    Ok(None) => Poll::Ready(None),
                    Err(e) => Poll::Ready(Some(Err(e.into()))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// What makes the service of each QUIC connection: a [`MakeService`] of
/// requests with a [`QuicBody`], whose service is shared by the tasks of
/// the connection's request streams (hence `Sync`). Implemented for every
/// such `MakeService`.
pub trait MakeQuicService: MakeService<QuicBody, Service: Sync> {}

impl<M: MakeService<QuicBody, Service: Sync>> MakeQuicService for M {}

/// Serves QUIC listeners with HTTP/3, a service made per connection,
/// within limits that follow a watch ([`Limits`]).
pub struct QuicServer<M> {
    make: M,
    limits: watch::Receiver<Arc<Limits>>,
    stats: Arc<QuicStats>,
}

impl<M> std::fmt::Debug for QuicServer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicServer").finish_non_exhaustive()
    }
}

/// What every accept loop and connection of a QUIC server shares.
struct Shared<M> {
    make: M,
    stats: Arc<QuicStats>,
    per_client: PerClient,
    handshaking: Arc<AtomicUsize>,
    connections: TaskTracker,
    stop: CancellationToken,
}

impl<M: MakeQuicService> QuicServer<M> {
    /// A server within `limits`, whose connections' requests go to the
    /// service `make` returns for each.
    pub fn new(limits: watch::Receiver<Arc<Limits>>, make: M) -> Self {
        Self {
            make,
            limits,
            stats: Arc::default(),
        }
    }

    /// Count connections in `stats` (a collector the caller registers).
    #[must_use]
    pub fn with_stats(mut self, stats: Arc<QuicStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Serve `listeners` until `shutdown` resolves, then accept no more,
    /// send every connection a GOAWAY, let in-flight requests finish for
    /// up to `shutdown_timeout`, close the endpoints and return.
    pub async fn serve(self, listeners: Vec<QuicListener>, shutdown: impl Future<Output = ()>) {
        let Self {
            make,
            limits,
            stats,
        } = self;
        if listeners.is_empty() {
            return shutdown.await;
        }
        let shared = Arc::new(Shared {
            make,
            stats,
            per_client: PerClient::new(limits.borrow().max_connections_per_client),
            handshaking: Arc::default(),
            connections: TaskTracker::new(),
            stop: CancellationToken::new(),
        });
        let endpoints: Vec<quinn::Endpoint> =
            listeners.iter().map(|l| l.endpoint.clone()).collect();
        let loops: Vec<_> = listeners
            .into_iter()
            .map(|l| tokio::spawn(accept_loop(l, limits.clone(), Arc::clone(&shared))))
            .collect();
        shutdown.await;
        for l in loops {
            l.abort();
            let _ = l.await;
        }
        for e in &endpoints {
            // New connections are refused from here on.
            e.set_server_config(None);
        }
        let connections = &shared.connections;
        info!(
            connections = connections.len(),
            "QUIC: shutting down, GOAWAY sent, draining in-flight requests"
        );
        shared.stop.cancel();
        connections.close();
        let shutdown_timeout = limits.borrow().shutdown_timeout;
        if tokio::time::timeout(shutdown_timeout, connections.wait())
            .await
            .is_err()
        {
            warn!(
                connections = connections.len(),
                "QUIC: shutdown deadline reached; closing remaining connections"
            );
        }
        for e in &endpoints {
            e.close(0u32.into(), b"shutting down");
        }
        for e in &endpoints {
            let _ = tokio::time::timeout(CLOSE_GRACE, e.wait_idle()).await;
        }
    }
}

/// One listener's loop: each Initial admitted, sent a Retry or refused.
async fn accept_loop<M: MakeQuicService>(
    listener: QuicListener,
    mut limits: watch::Receiver<Arc<Limits>>,
    shared: Arc<Shared<M>>,
) {
    let local = listener.local;
    let mut current = limits.borrow_and_update().clone();
    listener
        .endpoint
        .set_server_config(Some(listener.config_for(&current)));
    let mut watching = true;
    loop {
        let incoming = tokio::select! {
            biased;
            changed = limits.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                current = limits.borrow_and_update().clone();
                shared.per_client.set_limit(current.max_connections_per_client);
                listener.endpoint.set_server_config(Some(listener.config_for(&current)));
                continue;
            }
            incoming = listener.endpoint.accept() => match incoming {
                Some(i) => i,
                None => return,
            },
        };
        admit(&shared, incoming, &current, local);
    }
}

/// An Initial's fate: a handshake, a Retry, or a refusal.
fn admit<M: MakeQuicService>(
    shared: &Arc<Shared<M>>,
    incoming: quinn::Incoming,
    limits: &Arc<Limits>,
    local: SocketAddr,
) {
    let stats = &shared.stats;
    let peer = incoming.remote_address();
    let validated = incoming.remote_address_validated();
    let retry = |incoming: quinn::Incoming| {
        stats.add(&stats.retries);
        if incoming.retry().is_err() {
            debug!(%peer, "QUIC: cannot send a Retry; Initial ignored");
        }
    };
    if !validated && shared.handshaking.load(Ordering::Relaxed) >= RETRY_ABOVE {
        return retry(incoming);
    }
    if stats.open.load(Ordering::Relaxed) >= limits.max_connections {
        stats.add(&stats.refused);
        return incoming.refuse();
    }
    let Some(slot) = shared.per_client.take(peer.ip()) else {
        // A spoofed source could use up the share of the address it
        // claims: the address is proven first.
        if !validated {
            return retry(incoming);
        }
        stats.add(&stats.refused);
        if let Some(more) = CLIENT_WARNINGS.admit() {
            warn!(%peer, suppressed = more, "QUIC: client at max_connections_per_client; connection refused");
        }
        return incoming.refuse();
    };
    shared.handshaking.fetch_add(1, Ordering::Relaxed);
    let handshaking = Handshaking(Arc::clone(&shared.handshaking));
    let counted = Counted::new(stats);
    let limits = Arc::clone(limits);
    shared.connections.spawn(connection(
        Arc::clone(shared),
        Admitted {
            incoming,
            limits,
            local,
            handshaking,
            _slot: slot,
            _counted: counted,
        },
    ));
}

/// An Initial let in, with what it holds until its connection ends.
struct Admitted {
    incoming: quinn::Incoming,
    limits: Arc<Limits>,
    local: SocketAddr,
    handshaking: Handshaking,
    _slot: ClientSlot,
    _counted: Counted,
}

/// One connection: its handshake and HTTP/3 SETTINGS within
/// `tls_handshake_timeout`, then its requests until it closes or the
/// drain's GOAWAY has let its requests finish.
async fn connection<M: MakeQuicService>(shared: Arc<Shared<M>>, admitted: Admitted) {
    let Admitted {
        incoming,
        limits,
        local,
        handshaking,
        _slot,
        _counted,
    } = admitted;
    let stats = &shared.stats;
    let peer = incoming.remote_address();
    let handshake = async {
        let conn = incoming.accept()?.await?;
        let h3 = h3::server::builder()
            .max_field_section_size(limits.max_header_size as u64)
            .build::<_, Bytes>(h3_quinn::Connection::new(conn.clone()))
            .await?;
        Ok::<_, BoxError>((conn, h3))
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(limits.tls_handshake_timeout, handshake) => r,
        () = shared.stop.cancelled() => return,
    };
    let (quic, mut h3) = match outcome {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            stats.add(&stats.failed);
            debug!(%peer, error = %e, "QUIC handshake failed");
            return;
        }
        Err(_) => {
            stats.add(&stats.failed);
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "QUIC handshake not complete within tls_handshake_timeout; connection closed");
            }
            return;
        }
    };
    drop(handshaking);
    stats.add(&stats.accepted);
    let conn = Connection {
        peer,
        tls: true,
        local,
    };
    let service = Arc::new(shared.make.make(&conn));
    let streams = TaskTracker::new();
    let deadline = async {
        match limits.connection_deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut closing = false;
    loop {
        tokio::select! {
            // After the GOAWAY, the connection ends with its last request
            // (h3 would wait for the client's own GOAWAY).
            () = streams.wait(), if closing => {
                // The last response's bytes get a few round trips to be
                // acknowledged before the close discards what is unsent.
                tokio::time::sleep((quic.rtt() * 3).max(CLOSE_AFTER_DRAIN_MIN)).await;
                // H3_NO_ERROR (RFC 9114 8.1).
                quic.close(quinn::VarInt::from_u32(0x100), b"");
                break;
            }
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    streams.spawn(request(resolver, Arc::clone(&service), Arc::clone(&limits), peer));
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        debug!(%peer, error = %e, "HTTP/3 connection closed");
                    }
                    break;
                }
            },
            () = shared.stop.cancelled(), if !closing => {
                closing = true;
                // GOAWAY: the requests it has go on, no new one starts.
                if let Err(e) = h3.shutdown(0).await {
                    debug!(%peer, error = %e, "HTTP/3 GOAWAY not sent");
                }
                streams.close();
            }
            () = &mut deadline, if !closing => {
                closing = true;
                let _ = h3.shutdown(0).await;
                streams.close();
            }
        }
    }
    streams.close();
    streams.wait().await;
}

/// One request stream: its head within `header_read_timeout`, the
/// service's response sent within `send_timeout` (each write within
/// `idle_send_timeout`).
async fn request<S, B>(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    service: Arc<S>,
    limits: Arc<Limits>,
    peer: SocketAddr,
) where
    S: Service<Request<QuicBody>, Response = Response<B>, Error = Infallible>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let head = tokio::time::timeout(limits.header_read_timeout, resolver.resolve_request()).await;
    let (req, stream) = match head {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "HTTP/3 request head refused");
            return;
        }
        Err(_) => {
            debug!(%peer, "HTTP/3 request head not complete within header_read_timeout");
            return;
        }
    };
    let (mut send, recv) = stream.split();
    // Over TLS, as `Connection::tls` tells the service (it marks the request).
    let req = req.map(|()| QuicBody {
        stream: recv,
        data_done: false,
        done: false,
    });
    let Ok(resp) = service.call(req).await;
    let (parts, body) = resp.into_parts();
    let sent = tokio::time::timeout(
        limits.send_timeout,
        respond(&mut send, parts, body, limits.idle_send_timeout),
    )
    .await;
    let failed = match sent {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(_) => "not sent within send_timeout".into(),
    };
    debug!(%peer, error = %failed, "HTTP/3 response cut");
    send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
}

/// Send a response's head, body and trailers on `send`, each write within
/// `idle_send`.
async fn respond<B>(
    send: &mut h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>,
    parts: http::response::Parts,
    body: B,
    idle_send: Duration,
) -> Result<(), BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    write(
        idle_send,
        send.send_response(Response::from_parts(parts, ())),
    )
    .await?;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(data) => {
                if !data.is_empty() {
                    write(idle_send, send.send_data(data)).await?;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    write(idle_send, send.send_trailers(trailers)).await?;
                    break;
                }
            }
        }
    }
    write(idle_send, send.finish()).await
}

/// One write of a response, within `idle_send`.
async fn write(
    idle_send: Duration,
    f: impl Future<Output = Result<(), h3::error::StreamError>>,
) -> Result<(), BoxError> {
    match tokio::time::timeout(idle_send, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err("no progress within idle_send_timeout".into()),
    }
}
