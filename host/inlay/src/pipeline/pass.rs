//! pass: the request goes to its backend with the client's body, and the
//! response to the client; nothing is looked up or stored. A non-error
//! answer to an unsafe method drops what it changed from the cache
//! ([`invalidate`](super::invalidate), unless `cache.invalidate_on_unsafe`
//! is off); the policy's `on-backend-response`
//! still sees the response (and may turn ESI on).

use std::sync::Arc;

use http_body::Body as _;
use http_body_util::BodyExt;
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError};

use super::{Outcome, Pipeline, RequestCtx, backend_response, fetch, invalidate};
use crate::metrics::Metrics;

/// pass: fetch, invalidate after an unsafe method, backend response.
pub(super) async fn run(p: &Pipeline, ctx: &mut RequestCtx) -> Result<Outcome, ProxyError> {
    ctx.release_policy();
    let routed = ctx.timing.now();
    let backend = p.through.upstreams().for_pass(&ctx.head)?;
    let mut body = ctx.body.take().unwrap_or_else(body::empty);
    if ctx.http1 {
        // Chunk sizes are HTTP/1's: the first is read, and checked, before
        // the backend is asked.
        let wait = p.config.server.header_read_timeout;
        body = super::recv::body_started(body, wait).await?;
    }
    let body = counted_body(body, &p.metrics);
    let resp = fetch::pass(&backend, &ctx.head, body).await?;
    ctx.timing.phase("fetch", routed);
    answered(p, ctx, resp).await
}

/// What follows the backend's answer to a passed request: the cache
/// invalidated after an unsafe method, the policy's `on-backend-response`.
pub(super) async fn answered(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    mut resp: http::Response<ProxyBody>,
) -> Result<Outcome, ProxyError> {
    if p.config.cache.invalidate_on_unsafe {
        invalidate::after_unsafe(&p.cache, &ctx.head, resp.status(), resp.headers()).await;
    }
    // Without a policy to show them to, a passed response's cache settings
    // come to whether it asks for ESI.
    let esi = match ctx.policy.as_mut() {
        None => inlay_cache::rules::SurrogateControl::parse(resp.headers()).esi,
        Some(policy) => {
            let defaults = backend_response::default_settings(&resp, &p.cache.rules().defaults);
            let settings = backend_response::run_policy(
                Some(policy),
                &mut ctx.head,
                &mut resp,
                defaults,
                &p.metrics,
            )
            .await?;
            settings.esi
        }
    };
    Ok(Outcome::new(resp, CacheStatus::Pass).with_esi(esi))
}

/// The request body, its bytes counted in `metrics` as they are read (a
/// passed request's body; the cache never reads one).
fn counted_body(body: ProxyBody, metrics: &Arc<Metrics>) -> ProxyBody {
    if !metrics.enabled() || body.is_end_stream() {
        return body;
    }
    let metrics = Arc::clone(metrics);
    body::boxed(body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            metrics.request_body_bytes(data.len() as u64);
        }
        frame
    }))
}
