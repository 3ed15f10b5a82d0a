//! Accept loop: HTTP/1.1 with keep-alive and h2c (prior knowledge) on one
//! port, one task per connection, graceful shutdown.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

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
    let graceful = GracefulShutdown::new();
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
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client resetting its connection is routine in load tests.
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}
