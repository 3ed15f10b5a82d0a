//! Body types shared by the pipeline: one boxed streaming body, and the
//! wrappers that bound how long a body may stall.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};

/// Errors carried inside bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request and response inside Inlay: streaming, boxed.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body of the given bytes.
pub fn full(data: impl Into<Bytes>) -> ProxyBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Box any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

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
    /// A body that fails when no frame arrives within `timeout`, and that holds
    /// `guard` (for example a backend connection permit) until it is dropped.
    pub struct TimeoutBody<B, G> {
        #[pin]
        inner: B,
        #[pin]
        sleep: tokio::time::Sleep,
        timeout: Duration,
        backend: String,
        guard: G,
    }
}

impl<B, G> TimeoutBody<B, G> {
    /// Wrap `inner`.
    pub fn new(inner: B, timeout: Duration, backend: String, guard: G) -> Self {
        Self {
            inner,
            sleep: tokio::time::sleep(timeout),
            timeout,
            backend,
            guard,
        }
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
                let deadline = tokio::time::Instant::now() + *this.timeout;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                if this.sleep.poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Box::new(BetweenBytesTimeout {
                        backend: this.backend.clone(),
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
