//! The accept loop: client connections (HTTP/1.1 and h2c, and both over
//! TLS on the `https://` listeners) with their limits, and graceful
//! shutdown. The request itself is handled by [`crate::pipeline::Pipeline`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use inlay_core::body::ProxyBody;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::config::{Config, ServerConfig};
use crate::tls::Tls;

/// A listening socket on `addr` whose kernel queue of connections not yet
/// accepted holds `backlog` (`server.listen_backlog`; Linux caps it at
/// `net.core.somaxconn`). tokio's own `TcpListener::bind` asks for 128, as
/// the standard library does: under a connection flood that queue filled
/// between two turns of the accept loop and the kernel dropped the SYNs of
/// normal clients, who then waited a whole second for their retransmit.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The pipeline generation new requests get; a config reload swaps it.
pub use crate::pipeline::Generations;

/// A listening socket and what its clients speak: plain HTTP, or TLS
/// (then HTTP/1.1 or h2, as ALPN chose).
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Arc<Tls>>,
}

impl Listener {
    /// A plain HTTP listener (HTTP/1.1 and h2c).
    pub fn plain(tcp: TcpListener) -> Self {
        Self { tcp, tls: None }
    }

    /// A TLS listener serving `tls`'s certificates.
    pub fn tls(tcp: TcpListener, tls: Arc<Tls>) -> Self {
        Self {
            tcp,
            tls: Some(tls),
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Whether its clients speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl From<TcpListener> for Listener {
    fn from(tcp: TcpListener) -> Self {
        Self::plain(tcp)
    }
}

/// Set on every request that came over TLS (a request extension): the
/// access log and the pipeline read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverTls;

/// Serve `listeners` until `shutdown` resolves, then stop accepting, let
/// in-flight requests finish for up to `shutdown_timeout`, and return.
///
/// Each request runs on the generation current when it starts, to its end.
/// A connection takes its limits (`[server]` timeouts and sizes) from the
/// generation current when it is accepted. `max_connections`,
/// `max_connections_per_client` and `defer_accept` follow the current
/// generation too (`Admission`): a reload changes them for the listeners
/// already open; connections open beyond a lowered limit finish.
pub async fn run(
    listeners: impl IntoIterator<Item = impl Into<Listener>>,
    current: Arc<Generations>,
    shutdown: impl Future<Output = ()>,
) {
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let admission = Arc::new(Admission::new(&current.load().config().server));
    let accept_tasks: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            tokio::spawn(accept_loop(
                listener.into(),
                current.clone(),
                admission.clone(),
                connections.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let sweeper = tokio::spawn({
        let admission = admission.clone();
        async move {
            let mut tick = tokio::time::interval(TARPIT_SWEEP);
            loop {
                tick.tick().await;
                admission.tarpit.sweep(Instant::now());
            }
        }
    });
    shutdown.await;
    sweeper.abort();
    admission.tarpit.clear();
    info!(
        connections = connections.len(),
        "shutting down: no new connections, draining in-flight requests"
    );
    // Closing the listeners first means no connection starts after the drain does.
    for t in accept_tasks {
        t.abort();
        let _ = t.await;
    }
    stop.cancel();
    connections.close();
    let shutdown_timeout = current.load().config().server.shutdown_timeout;
    match tokio::time::timeout(shutdown_timeout, connections.wait()).await {
        Ok(()) => info!("all connections drained"),
        Err(_) => warn!(
            connections = connections.len(),
            "shutdown deadline reached; closing remaining connections"
        ),
    }
}

/// Connections an accept loop takes before it lets other tasks run.
const ACCEPTS_PER_TURN: u32 = 8;

/// How often the connections held in the tarpit are looked at. Often: the
/// clients closed by one sweep come back at once, and every 250 ms that
/// was a burst of a few hundred connections for the accept loop, milliseconds
/// during which a normal client's new connection waited behind them.
const TARPIT_SWEEP: Duration = Duration::from_millis(10);

/// How often an accept loop that waits for a free connection slot looks
/// whether a reload raised `max_connections`.
const FULL_RECHECK: Duration = Duration::from_millis(250);

/// A free connection slot, taking the current limits while it waits.
async fn free_slot(
    admission: &Admission,
    follow: &mut impl FnMut() -> Arc<Config>,
) -> ConnectionSlot {
    loop {
        follow();
        tokio::select! {
            biased;
            permit = admission.slot() => return permit,
            () = tokio::time::sleep(FULL_RECHECK) => {}
        }
    }
}

async fn accept_loop(
    listener: Listener,
    current: Arc<Generations>,
    admission: Arc<Admission>,
    connections: TaskTracker,
    stop: CancellationToken,
) {
    let Listener { tcp, tls } = listener;
    // Accepted here without tokio's `accept`, which registers every new
    // connection with the reactor: a refused one never is (it went in and
    // out again, two `epoll_ctl` calls for each connection of a flood).
    let registered = tcp.into_std().and_then(|l| {
        // SAFETY: a std listener owns its descriptor: it stays open, the
        // same one, until the AsyncFd drops the listener with it.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) };
        fd.map_err(io::Error::from)
    });
    let listener = match registered {
        Ok(l) => l,
        Err(error) => {
            warn!(%error, "cannot watch the listener; it accepts nothing");
            return;
        }
    };
    let mut deferred = None;
    let mut backlog = None;
    // The limits are read again after each wait: a reload may come while
    // this loop waits for a slot or for a client.
    let mut follow = || {
        let config = Arc::clone(current.load().shared_config());
        admission.follow(&config.server);
        if deferred != Some(config.server.defer_accept) {
            deferred = Some(config.server.defer_accept);
            defer_accept(listener.get_ref(), config.server.defer_accept);
        }
        if backlog != Some(config.server.listen_backlog) {
            // The first time, the listener already has it (`bind`).
            if backlog.is_some() {
                relisten(listener.get_ref(), config.server.listen_backlog);
            }
            backlog = Some(config.server.listen_backlog);
        }
        config
    };
    let mut accepted = 0u32;
    loop {
        // A flood of connections keeps the listener ready: every few
        // accepts, the connections already accepted get their turn (a
        // normal client's request waited for a hundred refusals).
        accepted = accepted.wrapping_add(1);
        if accepted.is_multiple_of(ACCEPTS_PER_TURN) {
            tokio::task::yield_now().await;
        }
        // Wait for a free slot before accepting: excess clients wait in the
        // kernel's backlog instead of costing us memory.
        let permit = free_slot(&admission, &mut follow).await;
        let (stream, peer) = match accept(&listener).await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors: refused connections give theirs back
                // first, so that they never keep a client out.
                if out_of_descriptors(&e) {
                    let shed = admission.tarpit.shed(SHED_ON_EMFILE);
                    if shed > 0 {
                        if let Some(more) = SHED_WARNINGS.admit() {
                            warn!(
                                closed = shed,
                                suppressed = more,
                                "out of descriptors: refused connections held in the tarpit closed early"
                            );
                        }
                        continue;
                    }
                }
                // Otherwise back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let config = follow();
        let mut permit = permit;
        let permit = loop {
            match permit.unless_owed() {
                Some(p) => break p,
                None => permit = free_slot(&admission, &mut follow).await,
            }
        };
        // Behind the PROXY protocol the client is known once its header
        // is read (in the connection's task); the peer is the load balancer.
        let proxied = config.server.proxy_protocol;
        let from = &config.server.proxy_protocol_from;
        if proxied && !from.is_empty() && !from.iter().any(|n| n.contains(peer.ip())) {
            // Anyone else could claim any address (and pass purge_allow).
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "peer not in server.proxy_protocol_from; connection closed");
            }
            continue;
        }
        let client_slot = if proxied {
            None
        } else {
            let Some(slot) = admission.per_client.take(peer.ip()) else {
                over_client_share(peer);
                let until = Instant::now() + config.server.header_read_timeout;
                admission.tarpit.hold(stream, until);
                continue;
            };
            Some(slot)
        };
        // Admitted: now it joins the reactor.
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream))
        {
            Ok(s) => s,
            Err(error) => {
                debug!(%peer, %error, "cannot register an accepted connection; closed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        notsent_lowat(&stream, config.server.tcp_notsent_lowat);
        let current = current.clone();
        let stop = stop.clone();
        let admission = admission.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let _open = current.load().metrics().connection_opened();
            let limits = &config.server;
            let mut stream = stream;
            let mut peer = peer;
            let mut rest = bytes::Bytes::new();
            if proxied {
                let Some(header) = proxy_header(&mut stream, peer, limits, &stop).await else {
                    return;
                };
                peer = header.source.unwrap_or(peer);
                rest = header.rest;
            }
            let client_slot = match client_slot {
                Some(slot) => slot,
                None => match admission.per_client.take(peer.ip()) {
                    Some(slot) => slot,
                    None => return over_client_share(peer),
                },
            };
            let activity = Arc::new(Activity::default());
            let tracked = TrackedIo {
                inner: stream,
                activity: activity.clone(),
                rest,
                sniffed: false,
            };
            match tls {
                None => {
                    let conn = Conn {
                        io: TokioIo::new(tracked),
                        activity,
                        peer,
                        tls: false,
                    };
                    serve_connection(conn, current, limits, &admission, stop).await;
                }
                Some(tls) => {
                    let Some(io) = handshake(&tls, tracked, peer, limits, &stop).await else {
                        return;
                    };
                    if io.get_ref().1.alpn_protocol() == Some(b"h2") {
                        activity.set_h2();
                    }
                    let conn = Conn {
                        io: TokioIo::new(io),
                        activity,
                        peer,
                        tls: true,
                    };
                    serve_connection(conn, current, limits, &admission, stop).await;
                }
            }
            drop(client_slot);
            drop(permit);
        });
    }
}

/// One connection from `listener`, as a std stream in blocking mode: not
/// registered with the reactor, and not to be read before it is.
async fn accept(
    listener: &AsyncFd<std::net::TcpListener>,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    loop {
        let mut ready = listener.readable().await?;
        if let Ok(accepted) = ready.try_io(|l| l.get_ref().accept()) {
            return accepted;
        }
    }
}

/// Held connections closed at once when an accept finds no descriptor
/// left (then the accept is tried again).
const SHED_ON_EMFILE: usize = 64;

/// The process (EMFILE) or the system (ENFILE) has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

fn over_client_share(peer: SocketAddr) {
    // One address holding its share already: refused, so that one client
    // cannot take every slot.
    if let Some(more) = CLIENT_WARNINGS.admit() {
        warn!(%peer, suppressed = more, "client at max_connections_per_client; connection refused");
    }
}

/// The PROXY protocol header of a connection (`server.proxy_protocol`),
/// within `header_read_timeout`; `None` (the connection closed, a
/// rate-limited warning logged) when it is missing, malformed, too long,
/// late, or the server stops.
async fn proxy_header(
    stream: &mut TcpStream,
    peer: SocketAddr,
    limits: &ServerConfig,
    stop: &CancellationToken,
) -> Option<crate::proxy_protocol::ProxyHeader> {
    let read = tokio::time::timeout(
        limits.header_read_timeout,
        crate::proxy_protocol::read_header(stream),
    );
    let result = tokio::select! {
        r = read => r,
        () = stop.cancelled() => return None,
    };
    match result {
        Ok(Ok(header)) => Some(header),
        Ok(Err(crate::proxy_protocol::HeaderError::Closed)) => {
            debug!(%peer, "connection closed before its PROXY header");
            None
        }
        Ok(Err(e)) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, error = %e, suppressed = more, "no valid PROXY protocol header (server.proxy_protocol); connection closed");
            }
            None
        }
        Err(_) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "no PROXY protocol header within header_read_timeout; connection closed");
            }
            None
        }
    }
}

/// The TLS handshake of a connection on a TLS listener, within
/// `tls_handshake_timeout`; `None` (the connection closed, a rate-limited
/// warning logged) when it fails, takes too long, or the server stops.
async fn handshake(
    tls: &Tls,
    tcp: TrackedIo,
    peer: SocketAddr,
    limits: &ServerConfig,
    stop: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<TrackedIo>> {
    let accept = tokio::time::timeout(limits.tls_handshake_timeout, tls.acceptor().accept(tcp));
    let result = tokio::select! {
        r = accept => r,
        () = stop.cancelled() => return None,
    };
    match result {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            if e.kind() == io::ErrorKind::UnexpectedEof
                || e.kind() == io::ErrorKind::ConnectionReset
            {
                debug!(%peer, error = %e, "client went away during the TLS handshake");
            } else if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, error = %e, suppressed = more, "TLS handshake failed; connection closed");
            }
            None
        }
        Err(_) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "TLS handshake not complete within tls_handshake_timeout; connection closed");
            }
            None
        }
    }
}

/// An accepted connection, ready for HTTP: its (perhaps TLS) stream and
/// what the accept loop knows about it.
struct Conn<I> {
    io: I,
    activity: Arc<Activity>,
    peer: SocketAddr,
    tls: bool,
}

async fn serve_connection<I>(
    conn: Conn<I>,
    current: Arc<Generations>,
    limits: &ServerConfig,
    admission: &Admission,
    stop: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let Conn {
        io,
        activity,
        peer,
        tls,
    } = conn;
    let send_limits = SendLimits::of(limits);
    let mut builder = auto::Builder::new(StreamExecutor(send_limits));
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_size.max(8192))
        .keep_alive(true);
    let keep_alive = Some(limits.h2_keep_alive_interval).filter(|d| !d.is_zero());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.h2_max_header_list_size)
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.h2_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(limits.h2_max_local_error_reset_streams)
        .keep_alive_interval(keep_alive)
        .keep_alive_timeout(limits.h2_keep_alive_timeout);
    // HTTP/1 sends one response at a time: its clock is the connection's.
    // An HTTP/2 stream gets its own from `StreamExecutor`.
    let h1_clock = Arc::new(SendClock::new(send_limits, false));
    let act = activity.clone();
    let clock = h1_clock.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        // Read once: the request finishes on this generation.
        let pipeline = current.load_full();
        let act = act.clone();
        let h1_clock = clock.clone();
        let mut req = req;
        if tls {
            req.extensions_mut().insert(OverTls);
            // What the client claimed is replaced by what Inlay knows.
            req.headers_mut().insert(
                http::HeaderName::from_static("x-forwarded-proto"),
                http::HeaderValue::from_static("https"),
            );
        }
        async move {
            let clock = STREAM_CLOCK.try_with(Arc::clone).unwrap_or(h1_clock);
            let guard = InFlight::new(act);
            // Boxed: the request's future is about 10 KB, and hyper moves
            // the service's future (into a task of its own per HTTP/2
            // stream); a box moves as a pointer.
            let resp = Box::pin(pipeline.handle(req, peer)).await;
            Ok::<_, std::convert::Infallible>(resp.map(|b| guard.attach(b, Some(clock))))
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    let busy_idle = idle.min(limits.busy_idle_timeout);
    // Fewer free slots than this: idle connections go after `busy_idle`.
    let reserve = (limits.max_connections / 10).max(1);
    let period = busy_idle
        .min(limits.idle_send_timeout)
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(10));
    // Each connection checks at a phase of its own: connections accepted
    // in one burst (a flood) ticked in the same millisecond, a few
    // thousand wake-ups at once on the thread that also accepts and
    // answers everyone.
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + phase(peer, period), period);
    let mut closing = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    log_connection_error(peer, &*e);
                }
                return;
            }
            _ = stop.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            why = h1_clock.expired() => {
                info!(%peer, "response not sent within {why}; connection closed");
                return;
            }
            _ = tick.tick() => {
                // Checked while closing too: a graceful shutdown waits for
                // writes that a client which reads nothing never lets finish.
                if activity.write_blocked_for() >= limits.idle_send_timeout {
                    info!(%peer, "client read nothing for idle_send_timeout; connection closed");
                    return;
                }
                let idle = if admission.free() < reserve {
                    busy_idle
                } else {
                    idle
                };
                if !closing && activity.idle_for() >= idle {
                    debug!(%peer, "closing idle connection");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A point within `period` that differs from one connection to the next.
fn phase(peer: SocketAddr, period: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    // Each `RandomState` has keys of its own.
    let h = RandomState::new().hash_one(peer);
    let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX).max(1);
    Duration::from_micros(h % period_us)
}

/// `server.send_timeout` and `server.idle_send_timeout`.
#[derive(Debug, Clone, Copy)]
struct SendLimits {
    total: Duration,
    idle: Duration,
}

impl SendLimits {
    fn of(limits: &ServerConfig) -> Self {
        Self {
            total: limits.send_timeout,
            idle: limits.idle_send_timeout,
        }
    }
}

tokio::task_local! {
    /// The send clock of the HTTP/2 stream whose task is running.
    static STREAM_CLOCK: Arc<SendClock>;
}

/// Runs each HTTP/2 stream (hyper spawns one task per stream) with a send
/// clock of its own, and drops the stream when the clock expires: h2 then
/// resets that stream (RST_STREAM) and the connection goes on for the others.
#[derive(Clone, Copy)]
struct StreamExecutor(SendLimits);

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let clock = Arc::new(SendClock::new(self.0, true));
        tokio::spawn(STREAM_CLOCK.scope(clock.clone(), async move {
            tokio::select! {
                () = fut => {}
                why = clock.expired() => {
                    info!("HTTP/2 response not sent within {why}; stream reset");
                }
            }
        }));
    }
}

/// The deadlines of the response being sent on an HTTP/1 connection or an
/// HTTP/2 stream: `send_timeout` from its start, and (for HTTP/2, where
/// the socket may be busy with other streams) `idle_send_timeout` from the
/// moment a body chunk was handed over until the stream asks for the next.
/// An HTTP/1 connection's idle sending is watched on its socket instead
/// ([`Activity::write_blocked_for`]).
struct SendClock {
    born: Instant,
    limits: SendLimits,
    /// Whether a body that is not asked for its next chunk counts as idle.
    watch_handover: bool,
    /// When the response started, in ms since `born` plus one; 0: none.
    started: AtomicU64,
    /// When a chunk was handed over and not yet followed by a request for
    /// the next, as `started`; 0: the body is being asked.
    handed: AtomicU64,
    armed: tokio::sync::Notify,
}

impl SendClock {
    fn new(limits: SendLimits, watch_handover: bool) -> Self {
        Self {
            born: Instant::now(),
            limits,
            watch_handover,
            started: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            armed: tokio::sync::Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// A response starts: its head is handed to hyper.
    fn arm(&self) {
        let now = self.now();
        self.handed.store(now, Ordering::Relaxed);
        self.started.store(now, Ordering::Relaxed);
        self.armed.notify_one();
    }

    /// The body is asked for its next chunk.
    fn asked(&self) {
        self.handed.store(0, Ordering::Relaxed);
    }

    /// The body handed over a chunk.
    fn handed(&self) {
        self.handed.store(self.now(), Ordering::Relaxed);
    }

    /// The response is done (sent, failed, or dropped).
    fn disarm(&self) {
        self.started.store(0, Ordering::Relaxed);
        self.handed.store(0, Ordering::Relaxed);
    }

    /// Resolves when the armed response has taken too long, with the
    /// setting that expired.
    async fn expired(&self) -> &'static str {
        loop {
            let started = self.started.load(Ordering::Relaxed);
            if started == 0 {
                self.armed.notified().await;
                continue;
            }
            let now = self.now();
            let total = started + self.limits.total.as_millis() as u64;
            if now >= total {
                return "send_timeout";
            }
            let idle_ms = self.limits.idle.as_millis() as u64;
            let handed = self.handed.load(Ordering::Relaxed);
            let mut next = total;
            if self.watch_handover && handed != 0 {
                if now >= handed + idle_ms {
                    return "idle_send_timeout";
                }
                next = next.min(handed + idle_ms);
            } else if self.watch_handover {
                // A chunk handed over from now on expires after this at the earliest.
                next = next.min(now + idle_ms);
            }
            let wait = Duration::from_millis(next - now);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.armed.notified() => {}
            }
        }
    }
}

fn log_connection_error(peer: SocketAddr, e: &(dyn std::error::Error + 'static)) {
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_timeout() {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "client sent no complete request head in time (header_read_timeout); connection closed");
            }
            return;
        }
        if h.is_parse() || h.is_parse_too_large() {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, error = %h, suppressed = more, "malformed request; answered 400 and closed the connection");
            }
            return;
        }
        if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
            debug!(%peer, error = %h, "client went away");
            return;
        }
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>()
        && io.kind() == std::io::ErrorKind::Interrupted
    {
        // hyper-util's answer to a graceful close before the first byte:
        // a connection we closed because it stayed idle.
        debug!(%peer, "idle connection closed before its first request");
        return;
    }
    let text = e.to_string();
    if went_away(e) || text.contains("connection reset") || text.contains("broken pipe") {
        debug!(%peer, error = %text, "client went away");
    } else if let Some(more) = CLIENT_WARNINGS.admit() {
        warn!(%peer, error = %text, suppressed = more, "connection error");
    }
}

/// Whether `e` (or what caused it) is the client leaving: a reset, a write
/// to a closed socket, or (over TLS) the end of the stream without a
/// close_notify. A TLS client that resets after its handshake, before any
/// HTTP byte, is as common as one that leaves a plain connection.
fn went_away(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
            ) {
                return true;
            }
            // An io::Error wrapping another error: its source is the
            // inner one's source, so look at the inner one itself.
            if let Some(inner) = io.get_ref() {
                cause = Some(inner);
                continue;
            }
        }
        cause = c.source();
    }
    false
}

/// Who may open a connection now: `max_connections` slots shared by every
/// listener, and `max_connections_per_client` per client address. Both
/// follow the current generation's `[server]` ([`Admission::follow`]): a
/// raised limit admits more at once; a lowered one admits no one new until
/// enough connections have closed (open ones are never cut).
struct Admission {
    slots: Arc<Semaphore>,
    /// The `max_connections` the slots are sized to. Read at every accept
    /// without a lock; the accept loop that moves it applies the change.
    size: AtomicUsize,
    /// Slots a shrink could not take back at once (they were in use):
    /// the connections holding them give them up when they close.
    owed: Arc<AtomicUsize>,
    per_client: PerClient,
    /// Connections refused for their address's share, held unread.
    tarpit: Tarpit,
}

impl Admission {
    fn new(server: &ServerConfig) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(server.max_connections)),
            size: AtomicUsize::new(server.max_connections),
            owed: Arc::default(),
            per_client: PerClient::new(server.max_connections_per_client),
            tarpit: Tarpit::new(crate::open_files::tarpit_bound(server)),
        }
    }

    /// Take `server`'s limits, if they changed.
    fn follow(&self, server: &ServerConfig) {
        self.per_client
            .limit
            .store(server.max_connections_per_client, Ordering::Relaxed);
        self.tarpit
            .max
            .store(crate::open_files::tarpit_bound(server), Ordering::Relaxed);
        let want = server.max_connections;
        // Two listeners may see a reload at once: the one whose exchange
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
            "server.max_connections applied to the open listeners"
        );
    }

    /// A connection slot, when one is free.
    async fn slot(&self) -> ConnectionSlot {
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
    fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

/// Connections refused because their address holds its
/// `max_connections_per_client` already. Closed at once, they came back at
/// once: an attacker that reconnects whatever is closed made Inlay accept
/// and close tens of thousands a second, and that churn was the CPU its
/// other clients waited for. Held unread for `header_read_timeout`
/// instead, a refused connection costs one descriptor and no work until
/// it is closed. At most `server.tarpit_max` are held (the oldest is
/// closed for a new one; zero closes refused connections at once), so the
/// descriptors it takes stay bounded.
///
/// Held connections are out of the reactor (nothing is read from them),
/// and they are closed by a thread of their own ([`Closer`]): on loopback
/// a `close` also runs the peer's side of the FIN, and the sweep closed a
/// few hundred at a time on the thread that accepts and answers everyone,
/// a stall of milliseconds four times a second.
struct Tarpit {
    held: std::sync::Mutex<std::collections::VecDeque<(Instant, std::net::TcpStream)>>,
    /// `server.tarpit_max`, followed at every accept.
    max: AtomicUsize,
    closer: Closer,
}

impl Tarpit {
    fn new(max: usize) -> Self {
        Self {
            held: std::sync::Mutex::default(),
            max: AtomicUsize::new(max),
            closer: Closer::start(),
        }
    }

    /// Hold `stream` until `until` (or until it is the oldest of a full
    /// tarpit).
    fn hold(&self, stream: std::net::TcpStream, until: Instant) {
        let max = self.max.load(Ordering::Relaxed);
        let mut gone = Vec::new();
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            // A lowered bound is applied here, oldest first.
            while !held.is_empty() && held.len() >= max {
                gone.extend(held.pop_front().map(|(_, s)| s));
            }
            if max > 0 {
                held.push_back((until, stream));
            } else {
                gone.push(stream);
            }
        }
        self.closer.close(gone);
    }

    /// Close the connections held past their time.
    fn sweep(&self, now: Instant) {
        let mut gone = Vec::new();
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            while held.front().is_some_and(|(until, _)| *until <= now) {
                gone.extend(held.pop_front().map(|(_, s)| s));
            }
        }
        self.closer.close(gone);
    }

    /// Close the `n` oldest connections held, and those waiting for the
    /// closing thread, here and now (the process is out of descriptors);
    /// how many were closed.
    fn shed(&self, n: usize) -> usize {
        let oldest: Vec<_> = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let n = n.min(held.len());
            held.drain(..n).map(|(_, s)| s).collect()
        };
        oldest.len() + self.closer.take_pending().len()
    }

    /// Close every connection held (at shutdown).
    fn clear(&self) {
        let gone = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        self.closer
            .close(gone.into_iter().map(|(_, s)| s).collect());
    }
}

/// Closes connections on a thread of its own, off the runtime's workers,
/// at the lowest priority (nice 19): it runs when the workers wait.
/// What it has not closed yet is bounded ([`CLOSER_BACKLOG`]); past that
/// (or if the thread could not start) the caller closes them itself, so
/// descriptors never pile up.
struct Closer {
    shared: Option<Arc<CloserQueue>>,
}

#[derive(Default)]
struct CloserQueue {
    pending: std::sync::Mutex<Pending>,
    ready: std::sync::Condvar,
}

#[derive(Default)]
struct Pending {
    streams: Vec<std::net::TcpStream>,
    /// Set when the tarpit is dropped: the thread closes what is left and ends.
    done: bool,
}

/// Connections waiting for the closing thread at most: refused
/// connections take at most `server.tarpit_max` and this many descriptors
/// (counted in [`crate::open_files::needed`]).
pub(crate) const CLOSER_BACKLOG: usize = 1024;

impl CloserQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The closing thread: closes what is queued until the tarpit is gone.
    fn run(&self) {
        idle_priority();
        loop {
            let (batch, done) = {
                let mut pending = self.lock();
                while pending.streams.is_empty() && !pending.done {
                    pending = self.ready.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                (std::mem::take(&mut pending.streams), pending.done)
            };
            drop(batch);
            if done {
                return;
            }
        }
    }
}

impl Closer {
    fn start() -> Self {
        let shared = Arc::new(CloserQueue::default());
        let queue = shared.clone();
        let started = std::thread::Builder::new()
            .name("inlay-closer".into())
            .spawn(move || queue.run());
        match started {
            Ok(_) => Self {
                shared: Some(shared),
            },
            Err(error) => {
                warn!(%error, "cannot start the thread that closes refused connections; the accept loop closes them");
                Self { shared: None }
            }
        }
    }

    /// What waits for the closing thread, taken back (the caller drops it).
    fn take_pending(&self) -> Vec<std::net::TcpStream> {
        self.shared
            .as_ref()
            .map(|queue| std::mem::take(&mut queue.lock().streams))
            .unwrap_or_default()
    }

    /// Closes `batch` on the closing thread, or here when it is too far
    /// behind (or missing).
    fn close(&self, batch: Vec<std::net::TcpStream>) {
        let Some(queue) = self.shared.as_ref().filter(|_| !batch.is_empty()) else {
            return;
        };
        let mut pending = queue.lock();
        if pending.streams.len() + batch.len() > CLOSER_BACKLOG {
            // Closed here as `batch` drops, after the lock: the thread is
            // that far behind.
            return;
        }
        let was_empty = pending.streams.is_empty();
        pending.streams.extend(batch);
        drop(pending);
        if was_empty {
            queue.ready.notify_one();
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some(queue) = &self.shared {
            queue.lock().done = true;
            queue.ready.notify_one();
        }
    }
}

/// One of the `max_connections` slots, held for a connection's life.
struct ConnectionSlot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
}

impl ConnectionSlot {
    /// Give the slot up to what a lowered limit owes, if it owes any:
    /// `None` when it was taken. The accept loop holds a slot while it
    /// waits for a client; one that a reload lowered the limit under must
    /// not admit the next client.
    fn unless_owed(mut self) -> Option<Self> {
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
            // The slot goes away with the limit a reload lowered.
            permit.forget();
        }
    }
}

/// Connections open per client address, for `max_connections_per_client`
/// (0: no limit; connections are counted anyway, so that a limit a reload
/// sets counts the ones already open).
#[derive(Clone)]
struct PerClient {
    limit: Arc<AtomicUsize>,
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl PerClient {
    fn new(limit: usize) -> Self {
        Self {
            limit: Arc::new(AtomicUsize::new(limit)),
            open: Arc::default(),
        }
    }

    /// A connection slot for `ip`, or `None` when it holds the limit already.
    fn take(&self, ip: std::net::IpAddr) -> Option<ClientSlot> {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if limit != 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(ClientSlot(self.clone(), ip))
    }
}

/// One connection counted against its address until dropped.
struct ClientSlot(PerClient, std::net::IpAddr);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.0.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// Warnings about what one client did wrong, at most [`WARNINGS_PER_SEC`] a
/// second: a flood of bad connections must not turn into a flood of log
/// lines (each costs CPU and disk). The next line that is written says how
/// many were left out.
static CLIENT_WARNINGS: RateLimit = RateLimit::new();

/// The warnings of a tarpit that sheds (not to be lost among the refusals
/// that filled it).
static SHED_WARNINGS: RateLimit = RateLimit::new();

/// Client warnings written per second at most.
const WARNINGS_PER_SEC: u64 = 20;

/// A per-second budget of log lines.
struct RateLimit {
    /// The current second (since the Unix epoch) and lines written in it,
    /// packed as `second << 16 | count`.
    window: AtomicU64,
    /// Lines left out since the last one written.
    suppressed: AtomicU64,
}

impl RateLimit {
    const fn new() -> Self {
        Self {
            window: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines left out before this one)` when a line may be written.
    fn admit(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let admitted = self
            .window
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                if w >> 16 != now {
                    Some(now << 16 | 1)
                } else if w & 0xffff < WARNINGS_PER_SEC {
                    Some(w + 1)
                } else {
                    None
                }
            })
            .is_ok();
        if admitted {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod rate_limit_tests {
    use super::*;

    #[test]
    fn a_reset_or_an_unclosed_tls_stream_is_a_client_going_away() {
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(went_away(&reset));
        let wrapped = io::Error::other(io::Error::from(io::ErrorKind::UnexpectedEof));
        assert!(went_away(&wrapped), "found through the source chain");
        assert!(!went_away(&io::Error::from(io::ErrorKind::InvalidData)));
    }

    #[test]
    fn a_flood_of_client_warnings_is_cut_to_the_budget_and_counted() {
        let limit = RateLimit::new();
        let written: Vec<u64> = (0..1000).filter_map(|_| limit.admit()).collect();
        // Within one second (or two, at a second's edge): the budget, not 1000.
        assert!(
            (WARNINGS_PER_SEC as usize..=2 * WARNINGS_PER_SEC as usize).contains(&written.len()),
            "{} lines written",
            written.len()
        );
        // What was left out is counted, and reported by the next line.
        let left_out = limit.suppressed.load(Ordering::Relaxed) + written.iter().sum::<u64>();
        assert_eq!(left_out as usize, 1000 - written.len());
    }
}

/// When the connection last moved bytes, how many requests are open on
/// it, and since when a write has been waiting for the client to read.
#[derive(Debug)]
struct Activity {
    born: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// When a write found the socket full, in ms since `born` plus one;
    /// 0 when the last write went through.
    blocked_since: AtomicU64,
    /// HTTP/2: idle means no stream for `idle_timeout`, whatever else moves.
    h2: std::sync::atomic::AtomicBool,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            born: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            blocked_since: AtomicU64::new(0),
            h2: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Bytes moved on the socket. On an HTTP/2 connection they do not
    /// count: PINGs (`h2_keep_alive_interval`), SETTINGS and WINDOW_UPDATEs
    /// would keep it open forever; only its streams do ([`InFlight`]).
    fn touch_io(&self) {
        if !self.h2.load(Ordering::Relaxed) {
            self.touch();
        }
    }

    /// The connection speaks HTTP/2 (its preface, or ALPN `h2`).
    fn set_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    /// A write went through (`written`) or found the socket full.
    fn wrote(&self, written: bool) {
        if written {
            self.touch_io();
            self.blocked_since.store(0, Ordering::Relaxed);
        } else if self.blocked_since.load(Ordering::Relaxed) == 0 {
            let ms = self.born.elapsed().as_millis() as u64 + 1;
            self.blocked_since.store(ms, Ordering::Relaxed);
        }
    }

    /// How long the pending write has waited for the client to read.
    fn write_blocked_for(&self) -> Duration {
        let since = self.blocked_since.load(Ordering::Relaxed);
        if since == 0 {
            return Duration::ZERO;
        }
        let now = self.born.elapsed().as_millis() as u64 + 1;
        Duration::from_millis(now.saturating_sub(since))
    }

    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let now = self.born.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Counts a request as open until its response body is finished or dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(a: Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(a)
    }

    /// The response body, counted in flight and timed by `clock`.
    fn attach(self, body: ProxyBody, clock: Option<Arc<SendClock>>) -> ProxyBody {
        if let Some(c) = &clock {
            c.arm();
        }
        inlay_core::body::boxed(GuardedBody {
            inner: body,
            held_error: None,
            clock: ClockArm(clock),
            _guard: self,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A response body that counts as in flight, and that lets what was
    /// already sent reach the client before a body error aborts the response.
    ///
    /// hyper drops the connection as soon as a body yields an error, with
    /// what it still buffers: the head and the last chunks. A page whose ESI
    /// include failed at once would then reach the client as nothing at all,
    /// or as a head without its first bytes, depending on timing. So an error
    /// is held for one poll: the body answers `Pending` (and wakes itself),
    /// hyper flushes, and the next poll yields the error.
    struct GuardedBody {
        #[pin]
        inner: ProxyBody,
        held_error: Option<inlay_core::body::BoxError>,
        clock: ClockArm,
        _guard: InFlight,
    }
}

/// Disarms the response's send clock when the body is dropped.
struct ClockArm(Option<Arc<SendClock>>);

impl Drop for ClockArm {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.disarm();
        }
    }
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = inlay_core::body::BoxError;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.project();
        let clock = this.clock.0.as_deref();
        if let Some(c) = clock {
            c.asked();
        }
        if let Some(e) = this.held_error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                *this.held_error = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(c) = clock {
                    c.handed();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }
    fn is_end_stream(&self) -> bool {
        self.held_error.is_none() && self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    struct TrackedIo {
        #[pin]
        inner: TcpStream,
        activity: Arc<Activity>,
        // Read past the PROXY header: served before the socket.
        rest: bytes::Bytes,
        // Whether the first bytes were looked at for the h2c preface.
        sniffed: bool,
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = if this.rest.is_empty() {
            this.inner.poll_read(cx, buf)
        } else {
            let n = this.rest.len().min(buf.remaining());
            buf.put_slice(&this.rest.split_to(n));
            Poll::Ready(Ok(()))
        };
        let read = &buf.filled()[before..];
        if !*this.sniffed && read.len() >= H2C_PREFACE.len() {
            // The first read of a connection: an h2c client starts with its preface.
            *this.sniffed = true;
            if read.starts_with(H2C_PREFACE) {
                this.activity.set_h2();
            }
        }
        if !read.is_empty() {
            this.activity.touch_io();
        }
        r
    }
}

/// How an HTTP/2 client's first bytes start (RFC 9113, 3.4), as far as
/// it tells them from an HTTP/1 request.
const H2C_PREFACE: &[u8] = b"PRI * HTTP/2.0";

fn note_write(activity: &Activity, r: &Poll<io::Result<usize>>) {
    match r {
        Poll::Ready(Ok(n)) if *n > 0 => activity.wrote(true),
        Poll::Pending => activity.wrote(false),
        _ => {}
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write(cx, data);
        note_write(this.activity, &r);
        r
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        note_write(this.activity, &r);
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body::Frame;
    use hyper_util::rt::TokioExecutor;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn server(total: usize, per_client: usize) -> ServerConfig {
        let mut c = crate::config::Config::embedded_default().server;
        c.max_connections = total;
        c.max_connections_per_client = per_client;
        c
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
        let a = Admission::new(&server(2, 0));
        let held = take(&a, 2).await;
        assert_eq!(a.free(), 0);
        a.follow(&server(5, 0));
        assert_eq!(a.free(), 3);
        drop(held);
        assert_eq!(a.free(), 5);
    }

    #[tokio::test]
    async fn a_lowered_connection_limit_is_paid_by_the_connections_that_close() {
        let a = Admission::new(&server(4, 0));
        let mut held = take(&a, 3).await;
        // One free slot goes at once; two more are owed by open connections.
        a.follow(&server(1, 0));
        assert_eq!(a.free(), 0);
        held.pop();
        held.pop();
        assert_eq!(a.free(), 0, "the first two closes pay what is owed");
        held.pop();
        assert_eq!(a.free(), 1);
        // Raised while slots are owed: the debt is forgiven first.
        let mut held = take(&a, 1).await;
        a.follow(&server(3, 0));
        held.extend(take(&a, 2).await);
        a.follow(&server(1, 0));
        assert_eq!(a.owed.load(Ordering::Relaxed), 2);
        a.follow(&server(2, 0));
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
        let a = Admission::new(&server(3, 0));
        let mut open = take(&a, 2).await;
        let waiting = take(&a, 1).await.pop().unwrap();
        a.follow(&server(2, 0));
        assert!(waiting.unless_owed().is_none(), "two are open: no third");
        assert_eq!(a.free(), 0);
        open.pop();
        let next = take(&a, 1).await.pop().unwrap();
        assert!(next.unless_owed().is_some());
    }

    /// Connections accepted in one burst must not all wake in the same
    /// millisecond for their idle checks.
    #[test]
    fn connections_check_their_timers_at_phases_of_their_own() {
        let period = Duration::from_secs(1);
        let phases: std::collections::HashSet<Duration> = (0..64u16)
            .map(|i| phase(SocketAddr::from(([127, 0, 0, 1], 40_000 + i)), period))
            .collect();
        assert!(phases.iter().all(|p| *p < period), "{phases:?}");
        assert!(phases.len() > 48, "{} distinct phases of 64", phases.len());
    }

    /// How many of `n` connections to `listener`, none of them accepted,
    /// complete their handshake within a second each.
    async fn queued(listener: &TcpListener, n: usize) -> (usize, Vec<TcpStream>) {
        let addr = listener.local_addr().unwrap();
        let mut open = Vec::new();
        for _ in 0..n {
            match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => open.push(s),
                // A dropped SYN: the next try comes a second later.
                _ => break,
            }
        }
        (open.len(), open)
    }

    /// A flood of connections arriving faster than they are accepted waits
    /// in the kernel's queue: with tokio's default backlog (128) the SYNs
    /// past it were dropped and each such client lost a second.
    #[tokio::test]
    async fn the_listen_backlog_queues_a_burst_of_connections_and_a_reload_resizes_it() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 600).unwrap();
        let (n, held) = queued(&listener, 500).await;
        assert_eq!(n, 500, "connections queued before the first accept");
        drop(held);
        // `server.listen_backlog` lowered, then raised by reloads: a second
        // listen(2) on the open listener.
        let small = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let (n, held) = queued(&small, 100).await;
        assert!(n < 100, "a backlog of 16 queued {n} connections");
        drop(held);
        while tokio::time::timeout(Duration::from_millis(50), small.accept())
            .await
            .is_ok()
        {}
        relisten(&small, 600);
        let (n, _held) = queued(&small, 500).await;
        assert_eq!(n, 500, "after the reload");
    }

    /// A connected pair: the client's end and the server's (as the accept
    /// loop has it, out of the reactor).
    async fn pair(listener: &TcpListener) -> (TcpStream, std::net::TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, server) = tokio::join!(client, listener.accept());
        (client.unwrap(), server.unwrap().0.into_std().unwrap())
    }

    /// Whether the server closed `client` (EOF or reset; within 2 s: the tarpit's
    /// closes run on a thread of their own).
    async fn closed(client: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), client.read(&mut b));
        matches!(read.await, Ok(Ok(0) | Err(_)))
    }

    /// Whether `client` is still open 200 ms on.
    async fn open(client: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(200), client.read(&mut b));
        read.await.is_err()
    }

    #[tokio::test]
    async fn the_tarpit_holds_refused_connections_until_their_time_and_no_more_than_its_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tarpit = Tarpit::new(2);
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let (mut first, s1) = pair(&listener).await;
        let (mut second, s2) = pair(&listener).await;
        let (mut third, s3) = pair(&listener).await;
        tarpit.hold(s1, now + Duration::from_millis(1));
        tarpit.hold(s2, later);
        assert!(open(&mut first).await, "held, not closed at once");
        // Past its time, the sweep closes it; the other stays.
        tarpit.sweep(now + Duration::from_secs(1));
        assert!(closed(&mut first).await);
        assert!(open(&mut second).await);
        // Full: the oldest goes for a new one.
        tarpit.hold(s3, later);
        let (mut fourth, s4) = pair(&listener).await;
        tarpit.hold(s4, later);
        assert!(closed(&mut second).await, "the oldest of a full tarpit");
        assert!(open(&mut third).await && open(&mut fourth).await);
        // A lowered bound (`server.tarpit_max` after a reload) closes the
        // oldest at the next hold; zero holds nothing.
        tarpit.max.store(1, Ordering::Relaxed);
        let (mut fifth, s5) = pair(&listener).await;
        tarpit.hold(s5, later);
        assert!(closed(&mut third).await && closed(&mut fourth).await);
        assert!(open(&mut fifth).await);
        tarpit.max.store(0, Ordering::Relaxed);
        let (mut sixth, s6) = pair(&listener).await;
        tarpit.hold(s6, later);
        assert!(closed(&mut fifth).await && closed(&mut sixth).await);
        tarpit.max.store(2, Ordering::Relaxed);
        let (mut seventh, s7) = pair(&listener).await;
        tarpit.hold(s7, later);
        // Out of descriptors: the oldest go at once, on the caller's thread.
        let (mut eighth, s8) = pair(&listener).await;
        tarpit.hold(s8, later);
        assert_eq!(tarpit.shed(1), 1);
        assert!(closed(&mut seventh).await);
        assert!(open(&mut eighth).await);
        tarpit.clear();
        assert!(closed(&mut eighth).await);
    }

    #[test]
    fn a_changed_share_per_address_counts_the_connections_already_open() {
        let a = Admission::new(&server(10, 0));
        let ip: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        // No limit: counted anyway.
        let first = a.per_client.take(ip).expect("no limit");
        let second = a.per_client.take(ip).expect("no limit");
        a.follow(&server(10, 2));
        assert!(a.per_client.take(ip).is_none(), "two are open already");
        drop(first);
        let third = a.per_client.take(ip).expect("one closed");
        a.follow(&server(10, 3));
        let fourth = a.per_client.take(ip).expect("raised");
        assert!(a.per_client.take(ip).is_none());
        drop((second, third, fourth));
        assert!(a.per_client.open.lock().unwrap().is_empty());
    }

    /// A page whose body fails right after its first bytes (an ESI include
    /// that fails at once) must reach the client as a 200 head and those
    /// bytes, then a cut connection: never as nothing, never as a complete
    /// chunked body.
    #[tokio::test]
    async fn bytes_before_a_body_error_reach_the_client_before_the_cut() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(|_req: hyper::Request<Incoming>| async {
                let frames: Vec<Result<Frame<Bytes>, inlay_core::body::BoxError>> = vec![
                    Ok(Frame::data(Bytes::from_static(b"before"))),
                    Err("include failed".into()),
                ];
                let body = inlay_core::body::boxed(http_body_util::StreamBody::new(
                    futures_util::stream::iter(frames),
                ));
                let guard = InFlight::new(Arc::new(Activity::default()));
                Ok::<_, std::convert::Infallible>(hyper::Response::new(guard.attach(body, None)))
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let got = get_until_closed(addr, "/").await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
        assert!(got.contains("\r\n6\r\nbefore\r\n"), "{got:?}");
        assert!(
            !got.ends_with("0\r\n\r\n"),
            "the cut page looks complete: {got:?}"
        );
    }

    /// A pipeline to `origin`, with no policy and no access log.
    fn pipeline_to(origin: SocketAddr, shutdown_timeout: &str) -> Arc<Generations> {
        let cfg = crate::config::Config::from_toml(&format!(
            "[server]\nshutdown_timeout = \"{shutdown_timeout}\"\n\
             [backends.origin]\naddress = \"http://{origin}\"\n\
             [log]\naccess_log = \"off\"\n"
        ))
        .unwrap();
        let store =
            inlay_storage::TieredStore::open(inlay_storage::StoreConfig::memory_only(1 << 20))
                .unwrap();
        let access_log = crate::access_log::AccessLog::open(&cfg.log).unwrap();
        let cache = inlay_cache::HttpCache::new(
            inlay_cache::CacheStore::from_store(Arc::new(store)),
            cfg.cache.rules(),
        );
        let metrics = crate::metrics::Metrics::new(true);
        let pipeline = crate::pipeline::Pipeline::first(
            Arc::new(cfg),
            &Default::default(),
            cache,
            None,
            access_log,
            metrics,
        );
        Arc::new(Generations::from_pointee(pipeline))
    }

    /// An origin that reads one request and answers it after `delay`.
    async fn slow_origin(delay: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            tokio::time::sleep(delay).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncache-control: no-store\r\n\r\ndone",
                )
                .await;
            // Hold the connection open, as a keep-alive origin does.
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        addr
    }

    /// Serve one request to an origin that answers after `origin_delay`,
    /// stop the server 100 ms into it, and time how long `run` takes to return.
    async fn stop_during_a_request(
        origin_delay: Duration,
        shutdown_timeout: &str,
    ) -> (Duration, tokio::task::JoinHandle<String>, SocketAddr) {
        let current = pipeline_to(slow_origin(origin_delay).await, shutdown_timeout);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(vec![listener], current, async {
            let _ = stopped.await;
        }));
        let client = tokio::spawn(get_until_closed(addr, "/slow"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopping = Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("run returns within 5 s")
            .unwrap();
        (stopping.elapsed(), client, addr)
    }

    /// Send one HTTP/1.1 GET and read until the server closes the connection.
    async fn get_until_closed(addr: SocketAddr, path: &str) -> String {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn shutdown_lets_the_request_in_flight_finish_then_returns() {
        let (waited, client, addr) = stop_during_a_request(Duration::from_millis(400), "10s").await;
        assert!(
            waited >= Duration::from_millis(200),
            "returned after {waited:?}"
        );
        let got = client.await.unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
        assert!(got.ends_with("done"), "{got:?}");
        assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    }

    #[tokio::test]
    async fn shutdown_deadline_ends_a_request_that_does_not_finish() {
        let (waited, _, _) = stop_during_a_request(Duration::from_secs(60), "300ms").await;
        assert!(
            waited >= Duration::from_millis(300),
            "returned after {waited:?}"
        );
    }
}

/// `server.tcp_notsent_lowat`: the kernel takes at most `bytes` of a
/// response that it cannot send yet (Linux `TCP_NOTSENT_LOWAT`). Without
/// it a write goes on copying until the send buffer is full, and on a fast
/// path the kernel grows that buffer to megabytes: a client that announces
/// a tiny window and reads nothing (a slow reader asking for large objects)
/// made Inlay copy megabytes per connection into the kernel at once, one
/// long write after another on the thread that also accepts and answers
/// everybody else. Bytes in flight are not counted, so a client that reads
/// keeps its throughput; Inlay writes more when the unsent part falls
/// under `bytes`. Zero leaves the kernel's default.
fn notsent_lowat(stream: &TcpStream, bytes: u64) {
    #[cfg(target_os = "linux")]
    if bytes > 0 {
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        if let Err(error) = set_tcp_option(stream, libc::TCP_NOTSENT_LOWAT, value) {
            debug!(%error, "cannot set TCP_NOTSENT_LOWAT");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (stream, bytes);
}

/// `server.defer_accept`: the kernel hands a connection to the accept loop
/// once its first bytes have come (or after `wait`), so connections that
/// open and send nothing (an idle flood) cost Inlay no accept, no slot and
/// no close; an attacker that reconnects whatever Inlay closes gets
/// `wait` between its tries instead of a loop as fast as both CPUs go.
/// HTTP and TLS clients speak first, so they see no difference (nginx's
/// `deferred`, HAProxy's `defer-accept`). Zero turns it off.
///
/// Linux counts the wait in SYN-ACK retransmissions (after 1 s, 2 s, 4 s,
/// ...) and hands the connection over at the retransmission that ends
/// it. The default of 3 s ends on the 2 s timer: a wait past 3 s ends on
/// the 4 s one, which the kernel's timer wheel rounds to 256 ms (at
/// HZ=250), and an idle flood's connections then came four times a second
/// in bursts of hundreds, a new client's connection queued behind each.
fn defer_accept(listener: &impl std::os::fd::AsRawFd, wait: Duration) {
    #[cfg(target_os = "linux")]
    {
        let secs = if wait.is_zero() {
            0
        } else {
            libc::c_int::try_from(wait.as_secs().max(1)).unwrap_or(libc::c_int::MAX)
        };
        if let Err(error) = set_tcp_option(listener, libc::TCP_DEFER_ACCEPT, secs) {
            warn!(%error, "cannot set TCP_DEFER_ACCEPT; idle connections are accepted at once");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (listener, wait);
}

/// Gives the calling thread the lowest priority (nice 19): the closes it
/// makes then wait for the runtime's workers instead of taking slices of a
/// millisecond and more from the thread that accepts and answers everyone
/// (measured at a fair share), yet it still gets a little CPU when the
/// workers never rest, so what it holds is closed.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return integers only; on
        // Linux the nice value of PRIO_PROCESS with a thread id is that
        // thread's.
        #[allow(unsafe_code)]
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
        };
        if rc != 0 {
            let error = io::Error::last_os_error();
            debug!(%error, "cannot lower the closing thread's priority");
        }
    }
}

/// A new backlog for a listening socket (`server.listen_backlog` after a
/// reload): Linux applies a second `listen(2)` to the open listener.
fn relisten(listener: &impl std::os::fd::AsRawFd, backlog: u32) {
    #[cfg(target_os = "linux")]
    {
        let backlog = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
        // SAFETY: listen takes a descriptor the listener owns for the
        // duration of the call and an integer; no memory is passed.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::listen(listener.as_raw_fd(), backlog) };
        if rc == 0 {
            info!(
                backlog,
                "server.listen_backlog applied to the open listener"
            );
        } else {
            let error = io::Error::last_os_error();
            warn!(%error, "cannot apply server.listen_backlog to the open listener");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (listener, backlog);
}

/// Sets the `IPPROTO_TCP` option `option` of `socket` to `value`.
#[cfg(target_os = "linux")]
fn set_tcp_option(
    socket: &impl std::os::fd::AsRawFd,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads one c_int from our stack for a socket the
    // caller owns for the duration of the call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
