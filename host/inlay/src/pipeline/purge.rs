//! PURGE: invalidation by URL or surrogate key, soft or hard, allowed only
//! from `[cache] purge_allow` addresses.
//!
//! - `PURGE /path` purges every variant of that URL on that Host.
//! - `PURGE` with `Surrogate-Key: k1 k2` purges every object tagged k1 or k2.
//! - `Soft-Purge: 1` (or Fastly's `Fastly-Soft-Purge: 1`) marks objects
//!   stale instead of removing them, so they are served in grace while refreshed.
//!
//! BAN (from the same addresses) adds the ban expression of its `Ban`
//! header (`Ban: req.url ~ ^/products/ && obj.http.content-type ~ json`),
//! as Varnish users do from VCL; see `inlay_cache::ban`.

use http::{Response, StatusCode, header};
use inlay_cache::{BanError, HttpCache, PrimaryKey};
use inlay_core::body::{self, ProxyBody};
use inlay_core::{ProxyError, RequestHead};

use crate::config::CacheConfig;
use crate::metrics::Metrics;

/// Refuses `method` from a client outside `cache.purge_allow`.
fn check_allowed(cfg: &CacheConfig, head: &RequestHead, method: &str) -> Result<(), ProxyError> {
    if cfg
        .purge_allow
        .iter()
        .any(|net| net.contains(head.client_ip))
    {
        return Ok(());
    }
    Err(ProxyError::MethodNotAllowed(format!(
        "{method} from {} (not in cache.purge_allow)",
        head.client_ip
    )))
}

fn json(body: serde_json::Value) -> Response<ProxyBody> {
    json_with(StatusCode::OK, body)
}

fn json_with(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(body::full(format!("{body}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Handle a BAN request: the expression is the `Ban` header's value.
pub async fn ban(
    cache: &HttpCache,
    cfg: &CacheConfig,
    head: &RequestHead,
) -> Result<Response<ProxyBody>, ProxyError> {
    check_allowed(cfg, head, "BAN")?;
    let expr = head.headers.get("ban").ok_or_else(|| {
        ProxyError::BadRequest("BAN needs a Ban header with the expression".into())
    })?;
    let expr = std::str::from_utf8(expr.as_bytes())
        .map_err(|_| ProxyError::BadRequest("the Ban header is not UTF-8".into()))?;
    match cache.ban(expr).await {
        Ok(info) => Ok(json(serde_json::json!({ "status": "ok", "ban": info }))),
        Err(e @ BanError::Store(_)) => Err(ProxyError::Internal(e.to_string())),
        // The operator needs to see what is wrong with the expression.
        Err(e) => Ok(json_with(
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "status": "error", "error": e.to_string() }),
        )),
    }
}

/// Handle a PURGE request.
pub async fn purge(
    cache: &HttpCache,
    cfg: &CacheConfig,
    head: &RequestHead,
    metrics: &Metrics,
) -> Result<Response<ProxyBody>, ProxyError> {
    check_allowed(cfg, head, "PURGE")?;
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
    Ok(json(
        serde_json::json!({ "status": "ok", "purged": count, "soft": soft, "what": what }),
    ))
}
