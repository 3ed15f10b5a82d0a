//! The accept loop: listeners, admission, the PROXY header and the TLS
//! handshake, up to the connection handed to `serve`; and the
//! server that runs the loops and drains at shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use inlay_core::BoxError;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::activity::{Activity, TrackedIo};
use crate::admission::{Admission, ConnectionSlot};
use crate::limits::Limits;
use crate::per_client::ClientSlot;
use crate::proxy_protocol::proxy_header;
use crate::serve::{Serving, Speaks};
use crate::stats::ConnectionStats;
use crate::tls::{Tls, handshake};
use crate::{CLIENT_WARNINGS, SHED_WARNINGS, socket};

/// A listening socket and what its clients speak: plain HTTP, or TLS
/// (then HTTP/1.1 or h2, as ALPN chose).
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Arc<Tls>>,
    /// Plain HTTP/2 with prior knowledge only.
    h2c_only: bool,
}

impl Listener {
    /// A plain HTTP listener (HTTP/1.1 and h2c).
    pub fn plain(tcp: TcpListener) -> Self {
        Self {
            tcp,
            tls: None,
            h2c_only: false,
        }
    }

    /// A plain listener that speaks HTTP/2 with prior knowledge only: a
    /// connection that does not open with the preface is closed (RFC 9113
    /// 3.4), not answered in HTTP/1.1. For a load balancer that speaks
    /// h2c to its targets.
    pub fn h2c(tcp: TcpListener) -> Self {
        Self {
            tcp,
            tls: None,
            h2c_only: true,
        }
    }

    /// A TLS listener serving `tls`'s certificates.
    pub fn tls(tcp: TcpListener, tls: Arc<Tls>) -> Self {
        Self {
            tcp,
            tls: Some(tls),
            h2c_only: false,
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

/// Set on every request that came over TLS (a request extension), by the
/// service that reads [`Connection::tls`]: the access log reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverTls;

/// What a connection is, for the service that answers its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// The client's address: the one its PROXY header gave, if the
    /// listener reads one; else the peer's.
    pub peer: SocketAddr,
    /// Whether it came over TLS.
    pub tls: bool,
    /// The address of the listener that accepted it.
    pub local: SocketAddr,
}

/// What makes the service of each connection: a function of the
/// [`Connection`] returning a hyper service of requests with a body of
/// `ReqBody` (hyper's [`Incoming`] on TCP, [`QuicBody`] on QUIC) whose
/// responses have a body of `Bytes`. Implemented for every such `Fn`.
///
/// [`QuicBody`]: crate::QuicBody
pub trait MakeService<ReqBody = Incoming>: Send + Sync + 'static {
    /// The service one connection's requests go to.
    type Service: Service<
            Request<ReqBody>,
            Response = Response<Self::Body>,
            Error = Infallible,
            Future = Self::Future,
        > + Send
        + 'static;
    /// A request being answered.
    type Future: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;
    /// Its responses' body.
    type Body: http_body::Body<Data = Bytes, Error = Self::BodyError> + Send + 'static;
    /// The body's error.
    type BodyError: Into<BoxError> + Send;

    /// The service for `conn`.
    fn make(&self, conn: &Connection) -> Self::Service;
}

impl<M, S, B, ReqBody> MakeService<ReqBody> for M
where
    M: Fn(&Connection) -> S + Send + Sync + 'static,
    S: Service<Request<ReqBody>, Response = Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    type Service = S;
    type Future = S::Future;
    type Body = B;
    type BodyError = B::Error;

    fn make(&self, conn: &Connection) -> S {
        self(conn)
    }
}

/// Serves listeners with a service made per connection, within limits
/// that follow a watch ([`Limits`]).
pub struct Server<M> {
    make: M,
    limits: watch::Receiver<Arc<Limits>>,
    stats: Arc<ConnectionStats>,
}

impl<M> std::fmt::Debug for Server<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("limits", &*self.limits.borrow())
            .finish_non_exhaustive()
    }
}

/// What every accept loop and connection of a server shares.
struct Shared<M> {
    make: M,
    admission: Admission,
    stats: Arc<ConnectionStats>,
    connections: TaskTracker,
    stop: CancellationToken,
    /// Cancelled when the drain reaches `shutdown_timeout`: tunnels close.
    tunnels_close: CancellationToken,
}

impl<M: MakeService> Server<M> {
    /// A server within `limits` (the latest value sent on the channel
    /// applies), whose connections' requests go to the service `make`
    /// returns for each.
    pub fn new(limits: watch::Receiver<Arc<Limits>>, make: M) -> Self {
        Self {
            make,
            limits,
            stats: Arc::default(),
        }
    }

    /// Count connections in `stats` (a collector the caller registers).
    #[must_use]
    pub fn with_stats(mut self, stats: Arc<ConnectionStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Serve `listeners` until `shutdown` resolves, then stop accepting,
    /// let in-flight requests finish for up to `shutdown_timeout`, and
    /// return.
    ///
    /// A connection keeps the limits current when it was accepted.
    /// `max_connections`, `max_connections_per_client`, `tarpit_max`,
    /// `defer_accept` and `listen_backlog` follow the watch: a change
    /// applies to the listeners already open; connections open beyond a
    /// lowered limit finish.
    pub async fn serve(
        self,
        listeners: impl IntoIterator<Item = impl Into<Listener>>,
        shutdown: impl Future<Output = ()>,
    ) {
        let Self {
            make,
            limits,
            stats,
        } = self;
        let shared = Arc::new(Shared {
            make,
            admission: Admission::new(&limits.borrow()),
            stats,
            connections: TaskTracker::new(),
            stop: CancellationToken::new(),
            tunnels_close: CancellationToken::new(),
        });
        let accept_tasks: Vec<_> = listeners
            .into_iter()
            .map(|listener| {
                tokio::spawn(accept_loop(listener.into(), limits.clone(), shared.clone()))
            })
            .collect();
        let sweeper = tokio::spawn({
            let shared = shared.clone();
            async move { shared.admission.tarpit.sweep_forever().await }
        });
        shutdown.await;
        sweeper.abort();
        shared.admission.tarpit.clear();
        let connections = &shared.connections;
        info!(
            connections = connections.len(),
            "shutting down: no new connections, draining in-flight requests"
        );
        // Closing the listeners first means no connection starts after the drain does.
        for t in accept_tasks {
            t.abort();
            let _ = t.await;
        }
        shared.stop.cancel();
        connections.close();
        let shutdown_timeout = limits.borrow().shutdown_timeout;
        match tokio::time::timeout(shutdown_timeout, connections.wait()).await {
            Ok(()) => info!("all connections drained"),
            Err(_) => {
                warn!(
                    connections = connections.len(),
                    "shutdown deadline reached; closing remaining connections"
                );
                // Tunnels (WebSockets) were left open until now; they close
                // themselves, and get a moment to say so (their log lines).
                shared.tunnels_close.cancel();
                let _ = tokio::time::timeout(TUNNELS_CLOSE_GRACE, connections.wait()).await;
            }
        }
    }
}

/// How long tunnels told to close at the end of a drain get to do so.
const TUNNELS_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Connections an accept loop takes before it lets other tasks run.
const ACCEPTS_PER_TURN: u32 = 8;

/// Held connections closed at once when an accept finds no descriptor
/// left (then the accept is tried again).
const SHED_ON_EMFILE: usize = 64;

/// One listener's view of the limits: the latest value, and what of it
/// was applied to the listening socket.
struct Follow {
    limits: watch::Receiver<Arc<Limits>>,
    /// Closed: the sender is gone and the limits stay as they are.
    watching: bool,
    current: Arc<Limits>,
    defer_accept: Duration,
    backlog: u32,
    notsent_lowat: u64,
    /// The listener's socket options changed: connections queued before
    /// have the old ones.
    options_changed: bool,
}

impl Follow {
    /// The limits as they are, applied to `listener` (whose backlog `bind`
    /// set) and to `admission`.
    fn start(
        mut limits: watch::Receiver<Arc<Limits>>,
        listener: &std::net::TcpListener,
        admission: &Admission,
    ) -> Self {
        let current = limits.borrow_and_update().clone();
        admission.follow(&current);
        socket::defer_accept(listener, current.defer_accept);
        socket::listener_options(listener, current.tcp_notsent_lowat);
        Self {
            limits,
            watching: true,
            defer_accept: current.defer_accept,
            backlog: current.listen_backlog,
            notsent_lowat: current.tcp_notsent_lowat,
            options_changed: false,
            current,
        }
    }

    /// Take the latest limits, if they changed since they were last taken.
    fn update(&mut self, listener: &std::net::TcpListener, admission: &Admission) {
        if self.limits.has_changed().unwrap_or(false) {
            self.take(listener, admission);
        }
    }

    /// Take the latest limits.
    fn take(&mut self, listener: &std::net::TcpListener, admission: &Admission) {
        self.current = self.limits.borrow_and_update().clone();
        admission.follow(&self.current);
        if self.defer_accept != self.current.defer_accept {
            self.defer_accept = self.current.defer_accept;
            socket::defer_accept(listener, self.defer_accept);
        }
        if self.backlog != self.current.listen_backlog {
            self.backlog = self.current.listen_backlog;
            socket::relisten(listener, self.backlog, self.current.setting_prefix);
        }
        if self.notsent_lowat != self.current.tcp_notsent_lowat {
            self.notsent_lowat = self.current.tcp_notsent_lowat;
            socket::listener_options(listener, self.notsent_lowat);
            self.options_changed = true;
        }
    }

    /// Resolves when the limits change (never once the sender is gone);
    /// [`take`](Self::take) them then.
    async fn changed(&mut self) {
        if self.watching && self.limits.changed().await.is_ok() {
            return;
        }
        self.watching = false;
        std::future::pending().await
    }
}

/// A free connection slot, taking new limits while it waits.
async fn free_slot(
    admission: &Admission,
    follow: &mut Follow,
    listener: &std::net::TcpListener,
) -> ConnectionSlot {
    loop {
        tokio::select! {
            biased;
            permit = admission.slot() => return permit,
            () = follow.changed() => follow.take(listener, admission),
        }
    }
}

async fn accept_loop<M: MakeService>(
    listener: Listener,
    limits: watch::Receiver<Arc<Limits>>,
    shared: Arc<Shared<M>>,
) {
    let Listener { tcp, tls, h2c_only } = listener;
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
    let (listener, local) = match registered.and_then(|l| {
        let local = l.get_ref().local_addr()?;
        Ok((l, local))
    }) {
        Ok(l) => l,
        Err(error) => {
            warn!(%error, "cannot watch the listener; it accepts nothing");
            return;
        }
    };
    let admission = &shared.admission;
    let mut follow = Follow::start(limits, listener.get_ref(), admission);
    // Connections queued before the listener had its options (it may have
    // been bound a while ago) do not have them; those queued after do.
    let mut drained = false;
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
        let permit = free_slot(admission, &mut follow, listener.get_ref()).await;
        let result = tokio::select! {
            biased;
            a = accept(&listener, &mut drained) => a,
            () = follow.changed() => {
                follow.take(listener.get_ref(), admission);
                continue;
            }
        };
        let (stream, peer) = match result {
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
        follow.update(listener.get_ref(), admission);
        if std::mem::take(&mut follow.options_changed) {
            drained = false;
        }
        let mut permit = permit;
        let permit = loop {
            match permit.unless_owed() {
                Some(p) => break p,
                None => permit = free_slot(admission, &mut follow, listener.get_ref()).await,
            }
        };
        let limits = follow.current.clone();
        // Behind the PROXY protocol the client is known once its header
        // is read (in the connection's task); the peer is the load balancer.
        if let Some(from) = &limits.proxy_protocol
            && !from.allows(peer.ip())
        {
            // Anyone else could claim any address (and pass purge_allow).
            if let Some(more) = CLIENT_WARNINGS.admit() {
                let prefix = limits.setting_prefix;
                warn!(%peer, suppressed = more, "peer not in {prefix}proxy_protocol_from; connection closed");
            }
            continue;
        }
        // The peer's share, PROXY header or not: until a header names
        // another client, the connection is the peer's (one that sends
        // `P` and waits holds its own share, not every slot).
        let Some(client_slot) = admission.per_client.take(peer.ip()) else {
            over_client_share(peer);
            let until = Instant::now() + limits.header_read_timeout;
            admission.tarpit.hold(stream, until);
            continue;
        };
        let admitted = Admitted {
            stream,
            options_inherited: drained,
            peer,
            local,
            tls: tls.clone(),
            h2c_only,
            limits,
            client_slot,
            permit,
        };
        shared
            .connections
            .spawn(connection(Arc::clone(&shared), admitted));
    }
}

/// A connection the accept loop let in, with what it holds.
struct Admitted {
    /// Not registered with the reactor yet.
    stream: std::net::TcpStream,
    /// Whether it took its socket options from the listener.
    options_inherited: bool,
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<Arc<Tls>>,
    /// From an h2c-only listener.
    h2c_only: bool,
    /// The limits when it was accepted, for its whole life.
    limits: Arc<Limits>,
    /// Its peer's share; behind the PROXY protocol, exchanged for the
    /// share of the client its header names.
    client_slot: ClientSlot,
    permit: ConnectionSlot,
}

/// One admitted connection's task: its PROXY header, its address's
/// share, its TLS handshake, then HTTP.
async fn connection<M: MakeService>(shared: Arc<Shared<M>>, admitted: Admitted) {
    let Admitted {
        stream,
        options_inherited,
        mut peer,
        local,
        tls,
        h2c_only,
        limits,
        mut client_slot,
        permit,
    } = admitted;
    let _open = shared.stats.opened();
    let stop = shared.stop.clone();
    // The client spoke first (TCP_DEFER_ACCEPT): its first bytes are read
    // before the connection joins the reactor, which would have them
    // only after one more turn of its event loop.
    let mut rest = match socket::read_arrived(&stream) {
        Ok(Some(first)) => first,
        Ok(None) => Bytes::new(),
        Err(error) => {
            debug!(%peer, %error, "connection closed before its first bytes");
            return;
        }
    };
    let mut stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(error) => {
            debug!(%peer, %error, "cannot register an accepted connection; closed");
            return;
        }
    };
    socket::admitted(&stream, limits.tcp_notsent_lowat, options_inherited);
    if limits.proxy_protocol.is_some() {
        let Some(header) = proxy_header(rest, &mut stream, peer, &limits, &stop).await else {
            return;
        };
        rest = header.rest;
        if let Some(client) = header.source
            && client.ip() != peer.ip()
        {
            // The load balancer's share goes back once the client's is taken.
            client_slot = match shared.admission.per_client.take(client.ip()) {
                Some(slot) => slot,
                None => return over_client_share(client),
            };
        }
        peer = header.source.unwrap_or(peer);
    }
    let activity = Arc::new(Activity::default());
    let tracked = TrackedIo::new(stream, activity.clone(), rest);
    let conn = Connection {
        peer,
        tls: tls.is_some(),
        local,
    };
    let service = shared.make.make(&conn);
    let serving = |stop| Serving {
        activity: activity.clone(),
        peer,
        limits: &limits,
        admission: &shared.admission,
        stop,
        tunnels_close: shared.tunnels_close.clone(),
    };
    match tls {
        None => {
            let speaks = if h2c_only {
                Speaks::Http2
            } else {
                Speaks::Detect
            };
            serving(stop)
                .serve(TokioIo::new(tracked), speaks, service)
                .await;
        }
        Some(tls) => {
            let Some(io) = handshake(&tls, tracked, peer, &limits, &stop).await else {
                return;
            };
            let speaks = if io.get_ref().1.alpn_protocol() == Some(b"h2") {
                activity.set_h2();
                Speaks::Http2
            } else {
                Speaks::Http1
            };
            serving(stop).serve(TokioIo::new(io), speaks, service).await;
        }
    }
    drop(client_slot);
    drop(permit);
}

/// One connection from `listener`, non-blocking and not registered with
/// the reactor. `drained` is set once the listener's queue was found
/// empty.
async fn accept(
    listener: &AsyncFd<std::net::TcpListener>,
    drained: &mut bool,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    loop {
        let mut ready = listener.readable().await?;
        match ready.try_io(|l| socket::accept(l.get_ref())) {
            Ok(accepted) => return accepted,
            Err(_would_block) => *drained = true,
        }
    }
}

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
#[cfg(test)]
mod tests {
    use super::*;

    /// The admin listener drops its sender at once: its accept loops must
    /// wait for connections, not spin on a closed channel.
    #[tokio::test]
    async fn limits_whose_sender_is_gone_stay_as_they_are() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let limits = crate::tests::limits();
        let admission = Admission::new(&limits);
        let (tx, rx) = watch::channel(Arc::new(limits));
        let mut follow = Follow::start(rx, &listener, &admission);
        tx.send_replace(Arc::new(Limits {
            max_connections: 5,
            ..crate::tests::limits()
        }));
        let changed = tokio::time::timeout(Duration::from_secs(1), follow.changed()).await;
        assert!(changed.is_ok(), "a change is seen");
        follow.take(&listener, &admission);
        assert_eq!(follow.current.max_connections, 5);
        drop(tx);
        let changed = tokio::time::timeout(Duration::from_millis(100), follow.changed()).await;
        assert!(changed.is_err(), "no change comes from a closed channel");
        assert_eq!(follow.current.max_connections, 5);
    }
}
