//! PURGE: invalidation by URL or surrogate key, soft or hard, allowed only
//! from `[cache] purge_allow` addresses.
//!
//! - `PURGE /path` purges every variant of that URL on that Host.
//! - `PURGE` with `Surrogate-Key: k1 k2` purges every object tagged k1 or k2.
//! - `Soft-Purge: 1` (or Fastly's `Fastly-Soft-Purge: 1`) marks objects
//!   stale instead of removing them, so they are served in grace while refreshed.

use http::{Response, StatusCode, header};
use inlay_cache::{HttpCache, PrimaryKey};
use inlay_core::body::{self, ProxyBody};
use inlay_core::{ProxyError, RequestHead};

use crate::config::CacheConfig;
use crate::metrics::Metrics;

/// Handle a PURGE request.
pub async fn purge(
    cache: &HttpCache,
    cfg: &CacheConfig,
    head: &RequestHead,
    metrics: &Metrics,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !cfg
        .purge_allow
        .iter()
        .any(|net| net.contains(head.client_ip))
    {
        return Err(ProxyError::MethodNotAllowed(format!(
            "PURGE from {} (not in cache.purge_allow)",
            head.client_ip
        )));
    }
    let soft = ["soft-purge", "fastly-soft-purge"]
        .iter()
        .any(|h| head.headers.get(*h).is_some_and(|v| v.as_bytes() == b"1"));
    let keys: Vec<String> = inlay_cache::rules::surrogate_keys_of(&head.headers, "surrogate-key");
    let failed = |e: inlay_storage::StoreError| ProxyError::Internal(format!("purge failed: {e}"));
    let (what, count) = if keys.is_empty() {
        let n = cache
            .purge_url(&PrimaryKey::of(head), soft)
            .await
            .map_err(failed)?;
        (format!("url {}", head.uri), n)
    } else {
        let mut n = 0;
        for k in &keys {
            n += cache.purge_key(k, soft).await.map_err(failed)?;
        }
        (format!("keys {}", keys.join(" ")), n)
    };
    metrics.purged(count);
    tracing::info!(soft, purged = count, "purge {what}");
    let body = serde_json::json!({ "status": "ok", "purged": count, "soft": soft, "what": what });
    let mut resp = Response::new(body::full(format!("{body}\n")));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
