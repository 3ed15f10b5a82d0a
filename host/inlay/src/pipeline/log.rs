//! log: always runs. The access-log line is written when the response body
//! has been sent (or abandoned), so it carries the real byte count and time.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use inlay_core::body::{self, BoxError, ProxyBody};
use inlay_core::{Blame, ProxyError};
use tracing::{error, info, warn};

use super::{Pipeline, RequestCtx};
use crate::access_log::{AccessLog, AccessRecord};
use crate::metrics::Metrics;
use crate::tunnels::Moved;
use tokio::sync::oneshot;

/// The time since `started`; none when the request was not timed (no
/// line to write it in).
fn elapsed(started: Option<Instant>) -> std::time::Duration {
    started.map(|s| s.elapsed()).unwrap_or_default()
}

/// Start the record from the request head as received. Without a log line
/// to write (`logged` false) only what diagnostics name is copied: the
/// method and the URL.
pub(super) fn start(parts: &http::request::Parts, peer: SocketAddr, logged: bool) -> AccessRecord {
    // Looked up only for a line that is written.
    let get = |name: http::header::HeaderName| {
        logged
            .then(|| parts.headers.get(name))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    AccessRecord {
        client: Some(peer.ip()),
        method: parts.method.as_str().to_owned(),
        url: parts
            .uri
            .path_and_query()
            .map_or_else(|| "/".into(), |p| p.as_str().to_owned()),
        protocol: match logged {
            true => format!("{:?}", parts.version),
            false => String::new(),
        },
        tls: parts.extensions.get::<inlay_listener::OverTls>().is_some(),
        referer: get(http::header::REFERER),
        user_agent: get(http::header::USER_AGENT),
        host: get(http::header::HOST).or_else(|| {
            parts
                .uri
                .authority()
                .filter(|_| logged)
                .map(|a| a.to_string())
        }),
        // Until the pipeline says otherwise, the request failed.
        cache: inlay_core::CacheStatus::Error,
        ..Default::default()
    }
}

/// One diagnostic line for a failed request, at a level that says whose fault it is.
pub(super) fn failure(e: &ProxyError, r: &AccessRecord) {
    match e.blame() {
        Blame::Client => {
            info!(method = %r.method, url = %r.url, status = e.status().as_u16(), "{e}")
        }
        Blame::Origin | Blame::Policy => {
            warn!(method = %r.method, url = %r.url, status = e.status().as_u16(), "{e}")
        }
        Blame::Inlay => {
            error!(method = %r.method, url = %r.url, status = e.status().as_u16(), "{e}")
        }
    }
}

/// log: the request's record goes with the response body; its line is
/// written when the body ends (or is dropped), with the bytes sent and the
/// time taken.
pub(super) fn run(
    p: &Pipeline,
    ctx: RequestCtx,
    mut resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let (log, metrics) = (p.access_log.clone(), &p.metrics);
    let (mut record, started) = (ctx.record, ctx.started);
    record.status = resp.status().as_u16();
    metrics.served(&record.cache);
    // Only when counting: an Arc clone per request otherwise saved.
    let metrics = metrics.enabled().then(|| Arc::clone(metrics));
    if let Some(tunnel) = resp.extensions_mut().remove::<TunnelLog>() {
        // A tunnel's line is written when the tunnel ends.
        tunnel.hand_over(PendingLine {
            record,
            started,
            log,
            metrics,
        });
        return resp;
    }
    resp.map(|b| {
        body::boxed(LoggedBody {
            inner: b,
            pending: Some((record, started, log)),
            bytes: 0,
            metrics,
        })
    })
}

/// Put on a response that opens a tunnel: the request's access-log line
/// goes to the tunnel, which writes it when it ends.
#[derive(Clone)]
pub(super) struct TunnelLog(Arc<parking_lot::Mutex<Option<oneshot::Sender<PendingLine>>>>);

impl TunnelLog {
    /// The mark, and where the tunnel receives the line.
    pub(super) fn new() -> (Self, oneshot::Receiver<PendingLine>) {
        let (tx, rx) = oneshot::channel();
        (Self(Arc::new(parking_lot::Mutex::new(Some(tx)))), rx)
    }

    fn hand_over(self, line: PendingLine) {
        if let Some(tx) = self.0.lock().take() {
            let _ = tx.send(line);
        }
    }
}

/// An access-log line waiting for the end of its tunnel.
pub(super) struct PendingLine {
    record: AccessRecord,
    started: Option<Instant>,
    log: AccessLog,
    metrics: Option<Arc<Metrics>>,
}

impl PendingLine {
    /// Write the line of a tunnel that carried `moved` and ended with
    /// `error` (none: both sides closed): its bytes are those sent to the
    /// client, and `received` those it sent; its time, the tunnel's life.
    pub(super) fn tunnel_done(self, moved: Moved, error: Option<String>) {
        let Self {
            mut record,
            started,
            log,
            metrics,
        } = self;
        record.bytes = moved.to_client;
        record.received = Some(moved.to_backend);
        record.duration = elapsed(started);
        record.error = error;
        if let Some(m) = metrics {
            m.response_body_bytes(moved.to_client);
            m.request_body_bytes(moved.to_backend);
        }
        log.write(&record);
    }
}

pin_project_lite::pin_project! {
    struct LoggedBody {
        #[pin]
        inner: ProxyBody,
        pending: Option<(AccessRecord, Option<Instant>, AccessLog)>,
        bytes: u64,
        metrics: Option<Arc<Metrics>>,
    }
    impl PinnedDrop for LoggedBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some((mut r, started, log)) = this.pending.take() {
                r.bytes = *this.bytes;
                r.duration = elapsed(started);
                if r.error.is_none() && !this.inner.is_end_stream() {
                    // Dropped before the end: the client went away or the stream failed.
                    r.error = Some("response not completed".into());
                }
                if let Some(m) = this.metrics {
                    m.response_body_bytes(r.bytes);
                }
                log.write(&r);
            }
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let res = this.inner.poll_frame(cx);
        match &res {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    *this.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => {
                if let Some((mut r, started, log)) = this.pending.take() {
                    r.bytes = *this.bytes;
                    r.duration = elapsed(started);
                    if let Some(m) = this.metrics {
                        m.response_body_bytes(r.bytes);
                    }
                    log.write(&r);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some((r, _, _)) = this.pending.as_mut() {
                    warn!(url = %r.url, error = %e, "response body failed mid-stream; connection will be closed");
                    r.error = Some(e.to_string());
                }
            }
            Poll::Pending => {}
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
