//! Accept loop: HTTP/1.1 with keep-alive and h2c (prior knowledge) on one
//! port, one task per connection, graceful shutdown.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::routes::{self, State};

/// How long open requests (a `/hang`, a slow body) may run on after the
/// shutdown signal before the process exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Serves `listener` until `shutdown` resolves, then drains connections for
/// at most [`SHUTDOWN_GRACE`].
pub async fn serve(listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let state = Arc::new(State::default());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Idle keep-alive connections from a proxy's pool must not be cut.
    builder.http1().header_read_timeout(None).keep_alive(true);
    // Benchmarks multiplex many streams on few h2c connections.
    builder.http2().max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    // Connections may be upgraded (`/ws`), so hyper-util's graceful
    // watcher, which takes no upgradable connection, is done by hand.
    let connections = TaskTracker::new();
    let stop = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    if !is_transient(&e) {
                        eprintln!("inlay-origin: accept failed: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small responses must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service = service_fn(move |req| routes::handle(state.clone(), req));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let stop = stop.clone();
        connections.spawn(async move {
            let mut conn = std::pin::pin!(conn);
            // A client resetting its connection is routine in load tests.
            tokio::select! {
                _ = conn.as_mut() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    stop.cancel();
    connections.close();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, connections.wait()).await;
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}
