//! backend response: how a backend response is cached. The cache's rules
//! (RFC 9111, Surrogate-Control, the configured defaults) propose; the
//! policy's `on-backend-response` decides. Storing is the cache's
//! (`inlay_cache::NewResponse::store`).

use std::time::SystemTime;

use http::{Response, header};
use inlay_cache::rules::{self, Defaults};
use inlay_core::{CacheSettings, ProxyBody, ProxyError, RequestHead, ResponseHead, headers};
use inlay_runtime::{Hook, PolicyCall};

use crate::metrics::Metrics;

/// The host's default cache settings for a response.
pub fn default_settings(resp: &Response<ProxyBody>, defaults: &Defaults) -> CacheSettings {
    rules::decide(resp.status(), resp.headers(), defaults, SystemTime::now())
}

/// The policy's `on-backend-response`: it may edit the response's status and
/// headers and change how it is cached, starting from `defaults`.
pub async fn run_policy(
    policy: Option<&mut PolicyCall>,
    head: &mut RequestHead,
    resp: &mut Response<ProxyBody>,
    defaults: CacheSettings,
    metrics: &Metrics,
) -> Result<CacheSettings, ProxyError> {
    let Some(call) = policy else {
        return Ok(defaults);
    };
    let mut rh = ResponseHead {
        status: resp.status(),
        headers: std::mem::take(resp.headers_mut()),
    };
    let length = rh.headers.get(header::CONTENT_LENGTH).cloned();
    let started = metrics.hook_start();
    // Boxed, as every hook call is (`recv::route` says why).
    let result = Box::pin(call.on_backend_response(head, &mut rh, defaults)).await;
    metrics.hook_done(Hook::OnBackendResponse, started, &result);
    // What goes to the client and the store is framed by the backend's
    // body, not by the policy.
    headers::restore_framing(&mut rh.headers, length);
    *resp.status_mut() = rh.status;
    *resp.headers_mut() = rh.headers;
    Ok(result?)
}
