//! One admitted connection served: HTTP/1.1 or HTTP/2 (hyper), its
//! timeouts (header read, idle, busy idle, send, idle send, the
//! connection's deadline), and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto;
use inlay_core::BoxError;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::CLIENT_WARNINGS;
use crate::activity::{Activity, GuardedBody, InFlight};
use crate::admission::Admission;
use crate::limits::Limits;
use crate::send_clock::{STREAM_CLOCK, SendClock, SendLimits, StreamExecutor};
use crate::tunnel::TunnelTicket;

/// Which HTTP a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// Plain TCP: HTTP/1.1, or h2c when it starts with the HTTP/2 preface
    /// (and `Limits::http2` is on).
    Detect,
    /// TLS whose ALPN chose `h2`, or an h2c-only listener: HTTP/2 only, so
    /// that a connection that does not start with the preface is closed
    /// (RFC 9113 3.4), not answered in HTTP/1.1.
    Http2,
    /// TLS without `h2` in ALPN: HTTP/1 only (HTTP/2 over TLS needs ALPN,
    /// RFC 9113 3.3).
    Http1,
}

/// What serving one admitted connection reads: the connection's
/// activity and address, the limits it was accepted with, the server's
/// admission (its free slots), and what stops it.
pub(crate) struct Serving<'a> {
    pub(crate) activity: Arc<Activity>,
    pub(crate) peer: SocketAddr,
    pub(crate) limits: &'a Limits,
    pub(crate) admission: &'a Admission,
    /// Asks for a graceful close (the drain).
    pub(crate) stop: CancellationToken,
    /// Closes the connection's tunnels (the end of the drain).
    pub(crate) tunnels_close: CancellationToken,
}

/// The HTTP/1 settings of `limits`, on hyper-util's builder or hyper's.
macro_rules! http1_settings {
    ($builder:expr, $limits:expr) => {
        $builder
            .timer(TokioTimer::new())
            .header_read_timeout($limits.header_read_timeout)
            .max_buf_size($limits.max_header_size.max(8192))
            .keep_alive($limits.keep_alive)
    };
}

impl Serving<'_> {
    /// Serve `io` (the admitted connection, perhaps TLS), which `speaks`
    /// HTTP/1, HTTP/2 or either, with `service` until it ends, a timeout
    /// closes it, or `stop` asks for a graceful close.
    pub(crate) async fn serve<I, S, B>(self, io: I, speaks: Speaks, service: S)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible> + Send + 'static,
        S::Future: Send + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError> + Send,
    {
        let limits = self.limits;
        let send_limits = SendLimits::of(limits);
        let mut builder = auto::Builder::new(StreamExecutor(send_limits));
        let speaks = match speaks {
            Speaks::Detect if !limits.http2 => Speaks::Http1,
            speaks => speaks,
        };
        builder = match speaks {
            Speaks::Http2 => builder.http2_only(),
            Speaks::Http1 => builder.http1_only(),
            Speaks::Detect => builder,
        };
        http1_settings!(builder.http1(), limits);
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
        let upgrades = limits.upgrades;
        if upgrades {
            // SETTINGS_ENABLE_CONNECT_PROTOCOL: WebSockets over HTTP/2 (RFC 8441).
            builder.http2().enable_connect_protocol();
        }
        // HTTP/1 sends one response at a time: its clock is the connection's.
        // An HTTP/2 stream gets its own from `StreamExecutor`.
        let h1_clock = Arc::new(SendClock::new(send_limits, false));
        let service = Tracked {
            inner: service,
            activity: self.activity.clone(),
            h1_clock: h1_clock.clone(),
            tunnels_close: upgrades.then(|| self.tunnels_close.clone()),
        };
        match (speaks, upgrades) {
            // hyper-util's upgradable connection reads the version itself
            // (it ignores http1_only and http2_only): plain TCP only.
            (Speaks::Detect, true) => {
                let conn = builder.serve_connection_with_upgrades(io, service);
                self.drive(conn, |c| c.graceful_shutdown(), h1_clock).await;
            }
            // HTTP/1 only, upgradable: hyper's own HTTP/1 connection.
            (Speaks::Http1, true) => {
                let mut http1 = hyper::server::conn::http1::Builder::new();
                http1_settings!(http1, limits);
                let conn = http1.serve_connection(io, service).with_upgrades();
                self.drive(conn, |c| c.graceful_shutdown(), h1_clock).await;
            }
            // HTTP/2 serves extended CONNECT on any of its connections.
            _ => {
                let conn = builder.serve_connection(io, service);
                self.drive(conn, |c| c.graceful_shutdown(), h1_clock).await;
            }
        }
    }

    /// Drive `conn` (hyper's connection, closed gracefully by `shutdown`;
    /// its HTTP/1 responses timed by `h1_clock`) until it ends or a
    /// timeout closes it; a connection handed to a tunnel (an HTTP/1.1
    /// upgrade) ends when its tunnel does.
    async fn drive<C, E>(self, conn: C, shutdown: impl Fn(Pin<&mut C>), h1_clock: Arc<SendClock>)
    where
        C: Future<Output = Result<(), E>>,
        E: Into<BoxError>,
    {
        let Self {
            activity,
            peer,
            limits,
            admission,
            stop,
            ..
        } = self;
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
        let deadline = async {
            match limits.connection_deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        let expired = h1_clock.expired();
        tokio::pin!(expired);
        let mut closing = false;
        loop {
            // The drain, the deadline and the idle tick, polled only when
            // one of them woke the task: most wake-ups are the
            // connection's (a request, a response), and polling the
            // drain's token takes a lock every connection shares. The
            // send clock is not behind the gate: the response arms it as
            // the connection is polled, and nothing wakes it.
            let cancelled = stop.cancelled();
            tokio::pin!(cancelled);
            let watch = Gated::new(std::future::poll_fn(|cx| {
                if !closing && cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Watch::Stop);
                }
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Watch::Deadline);
                }
                tick.poll_tick(cx).map(|_| Watch::Tick)
            }));
            let event = tokio::select! {
                // The connection first: the response it polls arms the send clock.
                biased;
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        log_connection_error(peer, &*e.into());
                    }
                    // An upgraded HTTP/1.1 connection: hyper handed its
                    // socket to the tunnel, which it stays with.
                    activity.tunnels_closed().await;
                    return;
                }
                why = &mut expired => Watch::Expired(why),
                event = watch => event,
            };
            match event {
                Watch::Stop => {
                    closing = true;
                    shutdown(conn.as_mut());
                }
                Watch::Expired(why) => {
                    info!(%peer, "response not sent within {why}; connection closed");
                    return;
                }
                Watch::Deadline => {
                    info!(%peer, "connection open longer than its deadline; closed");
                    return;
                }
                Watch::Tick => {
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
                        shutdown(conn.as_mut());
                    }
                }
            }
        }
    }
}

/// What ended a turn of a connection's loop: the drain, its send clock,
/// its deadline, or its periodic check.
enum Watch<W> {
    Stop,
    Expired(W),
    Deadline,
    Tick,
}

/// A future polled only when its own waker fired since its last poll (and
/// at its first): the task's other wake-ups pass it by with two atomic
/// operations on a line of its own.
struct Gated<F> {
    inner: F,
    gate: Arc<Gate>,
    waker: std::task::Waker,
}

/// Whether a [`Gated`] future's waker fired, and the task to wake then.
struct Gate {
    woken: std::sync::atomic::AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::Release);
        self.task.wake();
    }
}

impl<F> Gated<F> {
    fn new(inner: F) -> Self {
        let gate = Arc::new(Gate {
            woken: std::sync::atomic::AtomicBool::new(true),
            task: futures_util::task::AtomicWaker::new(),
        });
        Self {
            inner,
            waker: std::task::Waker::from(Arc::clone(&gate)),
            gate,
        }
    }
}

impl<F: Future + Unpin> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake between the two is
        // seen now or wakes the task again.
        self.gate.task.register(cx.waker());
        if !self
            .gate
            .woken
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Poll::Pending;
        }
        let this = &mut *self;
        Pin::new(&mut this.inner).poll(&mut Context::from_waker(&this.waker))
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

/// The caller's service, with each request counted in flight and each
/// response timed by its send clock.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    h1_clock: Arc<SendClock>,
    /// With upgrades served: what closes tunnels at the end of a drain.
    tunnels_close: Option<CancellationToken>,
}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body,
{
    type Response = Response<GuardedBody<B>>;
    type Error = Infallible;
    type Future = TrackedCall<S::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(closing) = &self.tunnels_close
            && may_upgrade(&req)
        {
            let ticket = TunnelTicket::new(self.activity.clone(), closing.clone());
            req.extensions_mut().insert(ticket);
        }
        TrackedCall {
            inner: self.inner.call(req),
            guard: Some(InFlight::new(self.activity.clone())),
            h1_clock: Some(self.h1_clock.clone()),
        }
    }
}

/// A request that may take its connection over: HTTP/1.1 with `Upgrade`
/// (hyper hands the socket over only then), or an HTTP/2 CONNECT.
fn may_upgrade<B>(req: &Request<B>) -> bool {
    match req.version() {
        http::Version::HTTP_11 => req.headers().contains_key(http::header::UPGRADE),
        http::Version::HTTP_2 => req.method() == http::Method::CONNECT,
        _ => false,
    }
}

pin_project_lite::pin_project! {
    /// A request being answered by the caller's service.
    struct TrackedCall<F> {
        #[pin]
        inner: F,
        guard: Option<InFlight>,
        h1_clock: Option<Arc<SendClock>>,
    }
}

impl<F, B> Future for TrackedCall<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: http_body::Body,
{
    type Output = Result<Response<GuardedBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(response) = std::task::ready!(this.inner.poll(cx));
        // An HTTP/2 stream's future runs in the stream's task, with the
        // stream's clock; HTTP/1 has the connection's.
        let clock = STREAM_CLOCK
            .try_with(Arc::clone)
            .ok()
            .or_else(|| this.h1_clock.take());
        let guard = this
            .guard
            .take()
            .expect("a TrackedCall is not polled after it is ready");
        Poll::Ready(Ok(response.map(|b| guard.attach(b, clock))))
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
    if let Some(io) = e.downcast_ref::<io::Error>()
        && io.kind() == io::ErrorKind::Interrupted
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
        if let Some(io) = c.downcast_ref::<io::Error>() {
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

#[cfg(test)]
mod tests {
    use http_body::Frame;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn a_reset_or_an_unclosed_tls_stream_is_a_client_going_away() {
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(went_away(&reset));
        let wrapped = io::Error::other(io::Error::from(io::ErrorKind::UnexpectedEof));
        assert!(went_away(&wrapped), "found through the source chain");
        assert!(!went_away(&io::Error::from(io::ErrorKind::InvalidData)));
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
                let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
                    Ok(Frame::data(Bytes::from_static(b"before"))),
                    Err("include failed".into()),
                ];
                let body = inlay_core::body::boxed(http_body_util::StreamBody::new(
                    futures_util::stream::iter(frames),
                ));
                let guard = InFlight::new(Arc::new(Activity::default()));
                Ok::<_, Infallible>(hyper::Response::new(guard.attach(body, None)))
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
        assert!(got.contains("\r\n6\r\nbefore\r\n"), "{got:?}");
        assert!(
            !got.ends_with("0\r\n\r\n"),
            "the cut page looks complete: {got:?}"
        );
    }
}
