//! PURGE and BAN: invalidation by URL or surrogate key, soft or hard, and
//! bans; the methods (allowed only from `[cache] purge_allow` addresses)
//! and the admin API go through the one [`Invalidator`].
//!
//! - `PURGE /path` purges every variant of that URL on that Host.
//! - `PURGE` with `Surrogate-Key: k1 k2` purges every object tagged k1 or k2.
//! - `Soft-Purge: 1` (or Fastly's `Fastly-Soft-Purge: 1`) marks objects
//!   stale instead of removing them, so they are served in grace while refreshed.
//!
//! BAN (from the same addresses) adds the ban expression of its `Ban`
//! header (`Ban: req.url ~ ^/products/ && obj.http.content-type ~ json`),
//! as Varnish users do from VCL; see `inlay_cache::ban`.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use inlay_cache::{BanError, BanInfo, HttpCache, PrimaryKey};
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError, RequestHead};
use inlay_storage::StoreError;
use serde_json::{Value, json};
use tokio::sync::{RwLock, RwLockWriteGuard};

use super::{Pipeline, RequestCtx};
use crate::metrics::Metrics;

/// What a purge removes (or marks stale).
#[derive(Debug, Clone)]
pub enum PurgeTarget {
    /// Every variant of one URL (its key as a client's request has it).
    Url(PrimaryKey),
    /// Every object tagged with one of these surrogate keys.
    Keys(Vec<String>),
}

impl PurgeTarget {
    /// For the log and the answer: `url KEY` or `keys K1 K2`.
    pub fn describe(&self) -> String {
        match self {
            PurgeTarget::Url(key) => format!("url {}", key.as_str()),
            PurgeTarget::Keys(keys) => format!("keys {}", keys.join(" ")),
        }
    }
}

/// The one way purges and bans reach the cache: the PURGE and BAN methods
/// and the admin API alike, counted in `inlay_purged_objects`.
///
/// It holds the cache new requests use. A reload that moves `cache.dir`
/// takes it for writing ([`Invalidator::moving`]) from the moment it
/// carries the bans over to the new cache until that cache is the one
/// requests use, so that no purge or ban made meanwhile lands on the cache
/// being left.
pub struct Invalidator {
    cache: RwLock<HttpCache>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Invalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invalidator").finish_non_exhaustive()
    }
}

impl Invalidator {
    /// Purges and bans on `cache`, counted in `metrics`.
    pub fn new(cache: HttpCache, metrics: Arc<Metrics>) -> Self {
        Self {
            cache: RwLock::new(cache),
            metrics,
        }
    }

    /// Purge `target` (mark it stale with `soft`); how many objects it hit.
    pub async fn purge(&self, target: &PurgeTarget, soft: bool) -> Result<u64, StoreError> {
        let cache = self.cache.read().await;
        let n = match target {
            PurgeTarget::Url(key) => cache.purge_url(key, soft).await?,
            PurgeTarget::Keys(keys) => {
                let mut n = 0;
                for k in keys {
                    n += cache.purge_key(k, soft).await?;
                }
                n
            }
        };
        self.metrics.purged(n);
        tracing::info!(soft, purged = n, "purge {}", target.describe());
        Ok(n)
    }

    /// Add a ban (see [`HttpCache::ban`]).
    pub async fn ban(&self, expression: &str) -> Result<BanInfo, BanError> {
        self.cache.read().await.ban(expression).await
    }

    /// The cache purges and bans apply to now.
    pub async fn cache(&self) -> HttpCache {
        self.cache.read().await.clone()
    }

    /// Holds purges and bans off while a reload moves the cache: the
    /// reload carries the bans over to the new cache and stores it in the
    /// guard once requests use it.
    pub async fn moving(&self) -> RwLockWriteGuard<'_, HttpCache> {
        self.cache.write().await
    }
}

/// The PURGE method.
pub(super) async fn purge_method(
    p: &Pipeline,
    ctx: &mut RequestCtx,
) -> Result<Response<ProxyBody>, ProxyError> {
    ctx.record.cache = CacheStatus::Purge;
    let head = &ctx.head;
    check_allowed(p, head, "PURGE")?;
    let soft = ["soft-purge", "fastly-soft-purge"]
        .iter()
        .any(|h| head.headers.get(*h).is_some_and(|v| v.as_bytes() == b"1"));
    let keys = inlay_cache::rules::surrogate_keys_of(&head.headers, "surrogate-key");
    let (target, what) = match keys.is_empty() {
        true => (
            PurgeTarget::Url(PrimaryKey::of(head)),
            format!("url {}", head.uri),
        ),
        false => {
            let what = format!("keys {}", keys.join(" "));
            (PurgeTarget::Keys(keys), what)
        }
    };
    let count = p
        .invalidator
        .purge(&target, soft)
        .await
        .map_err(|e| ProxyError::Internal(format!("purge failed: {e}")))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "status": "ok", "purged": count, "soft": soft, "what": what }),
    )
    .map(body::full))
}

/// The BAN method: the expression is the `Ban` header's value.
pub(super) async fn ban_method(
    p: &Pipeline,
    ctx: &mut RequestCtx,
) -> Result<Response<ProxyBody>, ProxyError> {
    ctx.record.cache = CacheStatus::Purge;
    let head = &ctx.head;
    check_allowed(p, head, "BAN")?;
    let expr = head.headers.get("ban").ok_or_else(|| {
        ProxyError::BadRequest("BAN needs a Ban header with the expression".into())
    })?;
    let expr = std::str::from_utf8(expr.as_bytes())
        .map_err(|_| ProxyError::BadRequest("the Ban header is not UTF-8".into()))?;
    let (status, answer) = match p.invalidator.ban(expr).await {
        Ok(info) => (StatusCode::OK, json!({ "status": "ok", "ban": info })),
        Err(e @ BanError::Store(_)) => return Err(ProxyError::Internal(e.to_string())),
        // The operator needs to see what is wrong with the expression.
        Err(e) => (
            StatusCode::BAD_REQUEST,
            json!({ "status": "error", "error": e.to_string() }),
        ),
    };
    Ok(json_response(status, &answer).map(body::full))
}

/// Refuses `method` from a client outside `cache.purge_allow`.
fn check_allowed(p: &Pipeline, head: &RequestHead, method: &str) -> Result<(), ProxyError> {
    let allowed = &p.config.cache.purge_allow;
    if allowed.iter().any(|net| net.contains(head.client_ip)) {
        return Ok(());
    }
    Err(ProxyError::MethodNotAllowed(format!(
        "{method} from {} (not in cache.purge_allow)",
        head.client_ip
    )))
}

/// A JSON answer (the PURGE and BAN methods', the admin API's): the value
/// on one line, never stored by a cache in front.
pub fn json_response(status: StatusCode, value: &Value) -> Response<Bytes> {
    let mut text = serde_json::to_vec(value).unwrap_or_default();
    text.push(b'\n');
    let mut resp = Response::new(Bytes::from(text));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}
