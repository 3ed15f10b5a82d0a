//! `wasi:http/service` 0.3 components (cargo feature `p3`): `handle` is an
//! async export that returns the response, whose body the guest writes to
//! a stream afterwards. The store's event loop (`run_concurrent`) runs
//! until the body is read or dropped, so that the guest's tasks writing it
//! make progress. A fresh instance per request, as for 0.2.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use inlay_core::body::{self, ProxyBody};
use tokio::sync::oneshot;
use wasmtime_wasi_http::p3::bindings::ServicePre;
use wasmtime_wasi_http::{Error as HttpError, WasiHttpView};

use super::state::AppState;
use super::{ComponentError, Head, Run};

/// A 0.3 request: instantiate, call `handle`, send the head on `tx`, and
/// drive the store until the body is done.
pub(super) fn handle(
    pre: ServicePre<AppState>,
    req: Request<ProxyBody>,
    tx: oneshot::Sender<Head>,
    answered: Arc<AtomicBool>,
) -> Run {
    Box::new(move |store| {
        Box::pin(async move {
            let service = pre.instantiate_async(&mut *store).await?;
            store
                .run_concurrent(async move |accessor| -> wasmtime::Result<()> {
                    let req =
                        req.map(|b| b.map_err(|e| HttpError::InternalError(Some(e.to_string()))));
                    let (request, io) = accessor.with(|mut access| {
                        let http = access.get().http();
                        let (request, io) =
                            wasmtime_wasi_http::p3::Request::from_http(http.hooks, req);
                        // `'static`: boxed, it no longer borrows the store.
                        let io: RequestIo = Box::pin(io);
                        (request, io)
                    });
                    match service.handle(accessor, request).await? {
                        Ok(response) => {
                            let resp =
                                accessor.with(|mut access| response.into_http(&mut access, io))?;
                            let (done, body_done) = oneshot::channel();
                            let resp = resp.map(|b| {
                                body::boxed(UntilDone {
                                    inner: b,
                                    done: Some(done),
                                })
                            });
                            answered.store(true, Ordering::Release);
                            let _ = tx.send(Ok(resp));
                            // The guest's tasks write the body while this
                            // waits: it is read to its end, or dropped.
                            let _ = body_done.await;
                        }
                        Err(code) => {
                            let _ = tx.send(Err(ComponentError::NoResponse {
                                message: format!("it answered with the error {code:?}"),
                            }));
                        }
                    }
                    Ok(())
                })
                .await?
        })
    })
}

/// What reports the request body's failure to the guest.
type RequestIo = Pin<Box<dyn Future<Output = Result<(), HttpError>> + Send>>;

/// A response body that says when it is done: read to its end, failed, or
/// dropped.
struct UntilDone<B> {
    inner: B,
    done: Option<oneshot::Sender<()>>,
}

impl<B> Body for UntilDone<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.done.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
