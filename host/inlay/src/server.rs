//! The accept loop: client connections (HTTP/1.1 and h2c) with their limits,
//! and graceful shutdown. The request itself is handled by
//! [`crate::pipeline::Pipeline`].

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
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use inlay_core::body::ProxyBody;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::config::ServerConfig;
use crate::pipeline::Pipeline;

/// Serve `listeners` until `shutdown` resolves, then stop accepting, let
/// in-flight requests finish for up to `shutdown_timeout`, and return.
pub async fn run(
    listeners: Vec<TcpListener>,
    pipeline: Arc<Pipeline>,
    limits: ServerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    let accept_tasks: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            tokio::spawn(accept_loop(
                listener,
                pipeline.clone(),
                limits.clone(),
                slots.clone(),
                connections.clone(),
                stop.clone(),
            ))
        })
        .collect();
    shutdown.await;
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
    match tokio::time::timeout(limits.shutdown_timeout, connections.wait()).await {
        Ok(()) => info!("all connections drained"),
        Err(_) => warn!(
            connections = connections.len(),
            "shutdown deadline reached; closing remaining connections"
        ),
    }
}

async fn accept_loop(
    listener: TcpListener,
    pipeline: Arc<Pipeline>,
    limits: Arc<ServerConfig>,
    slots: Arc<Semaphore>,
    connections: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        // Wait for a free slot before accepting: excess clients wait in the
        // kernel's backlog instead of costing us memory.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let pipeline = pipeline.clone();
        let limits = limits.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            serve_connection(stream, peer, pipeline, &limits, stop).await;
            drop(permit);
        });
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    pipeline: Arc<Pipeline>,
    limits: &ServerConfig,
    stop: CancellationToken,
) {
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(TrackedIo {
        inner: stream,
        activity: activity.clone(),
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_size.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_size as u32)
        .max_concurrent_streams(256);
    let act = activity.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let pipeline = pipeline.clone();
        let act = act.clone();
        async move {
            let guard = InFlight::new(act);
            let resp = pipeline.handle(req, peer).await;
            Ok::<_, std::convert::Infallible>(resp.map(|b| guard.attach(b)))
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    let mut tick = tokio::time::interval(
        idle.min(Duration::from_secs(1))
            .max(Duration::from_millis(10)),
    );
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
            _ = tick.tick(), if !closing => {
                if activity.idle_for() >= idle {
                    debug!(%peer, "closing idle connection");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

fn log_connection_error(peer: SocketAddr, e: &(dyn std::error::Error + 'static)) {
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_timeout() {
            warn!(%peer, "client sent no complete request head in time (header_read_timeout); connection closed");
            return;
        }
        if h.is_parse() || h.is_parse_too_large() {
            warn!(%peer, error = %h, "malformed request; answered 400 and closed the connection");
            return;
        }
        if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
            debug!(%peer, error = %h, "client went away");
            return;
        }
    }
    let text = e.to_string();
    if text.contains("connection reset") || text.contains("broken pipe") {
        debug!(%peer, error = %text, "client went away");
    } else {
        warn!(%peer, error = %text, "connection error");
    }
}

/// When the connection last moved bytes, and how many requests are open on it.
#[derive(Debug)]
struct Activity {
    born: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            born: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
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

    fn attach(self, body: ProxyBody) -> ProxyBody {
        inlay_core::body::boxed(GuardedBody {
            inner: body,
            held_error: None,
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
        _guard: InFlight,
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
        if let Some(e) = this.held_error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                *this.held_error = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
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
        let r = this.inner.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        r
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
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

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
                Ok::<_, std::convert::Infallible>(hyper::Response::new(guard.attach(body)))
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
    fn pipeline_to(origin: SocketAddr, shutdown_timeout: &str) -> (Arc<Pipeline>, ServerConfig) {
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
        let server = cfg.server.clone();
        let cache = inlay_cache::HttpCache::new(
            inlay_cache::CacheStore::from_store(Arc::new(store)),
            cfg.cache.rules(),
        );
        let pipeline = Pipeline::new(Arc::new(cfg), cache, None, access_log);
        (Arc::new(pipeline), server)
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
        let (pipeline, limits) = pipeline_to(slow_origin(origin_delay).await, shutdown_timeout);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(vec![listener], pipeline, limits, async {
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
