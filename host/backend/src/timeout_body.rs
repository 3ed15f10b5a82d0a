//! A backend body that may not stall: the between-bytes timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use inlay_core::BoxError;

use inlay_metrics::BackendMetrics;

/// The between-bytes timeout expired while streaming a backend body.
#[derive(Debug, thiserror::Error)]
#[error("backend {backend} sent no body data for {timeout:?} (between_bytes_timeout)")]
pub struct BetweenBytesTimeout {
    /// The backend's name.
    pub backend: String,
    /// The configured timeout.
    pub timeout: Duration,
}

pin_project_lite::pin_project! {
    /// A body that fails when it waits `timeout` for a frame (from its
    /// creation for the first, from when it began waiting for the next),
    /// and that holds `guard` (for example a backend connection permit)
    /// until it is dropped.
    pub struct TimeoutBody<B, G> {
        #[pin]
        inner: B,
        #[pin]
        sleep: tokio::time::Sleep,
        timeout: Duration,
        // A frame came since the timer was set: it is set again when the
        // body next waits, not at every frame (a reset locks the timer
        // wheel, twice a small response).
        moved: bool,
        backend: Arc<str>,
        guard: G,
        stalls: Option<Arc<BackendMetrics>>,
    }
}

impl<B, G> TimeoutBody<B, G> {
    /// Wrap `inner`, a body from `backend` (its name, for the error).
    pub fn new(inner: B, timeout: Duration, backend: Arc<str>, guard: G) -> Self {
        Self {
            inner,
            sleep: tokio::time::sleep(timeout),
            timeout,
            moved: false,
            backend,
            guard,
            stalls: None,
        }
    }

    /// Count a timeout in `metrics` (the backend's) when the body stalls.
    pub fn counting_stalls(mut self, metrics: Option<Arc<BackendMetrics>>) -> Self {
        self.stalls = metrics;
        self
    }
}

impl<B, G> Body for TimeoutBody<B, G>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                *this.moved = true;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                if std::mem::take(this.moved) {
                    let now = tokio::time::Instant::now();
                    // Config bounds timeouts; a checked add still never panics.
                    let deadline = now.checked_add(*this.timeout).unwrap_or(now);
                    this.sleep.as_mut().reset(deadline);
                }
                if this.sleep.poll(cx).is_ready() {
                    if let Some(m) = this.stalls.take() {
                        m.body_timeout();
                    }
                    return Poll::Ready(Some(Err(Box::new(BetweenBytesTimeout {
                        backend: this.backend.to_string(),
                        timeout: *this.timeout,
                    }))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
