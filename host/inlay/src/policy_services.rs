//! What the host lends policies ([`PolicyServices`]): the HTTP cache, the
//! kv store (one namespace per policy, in the store's kv records) and the
//! backend fetcher, the same one requests and ESI includes use. Every
//! storage call goes through the cache's async door (`inlay_cache::CacheStore`).

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use inlay_cache::{HttpCache, PrimaryKey, WeakHttpCache, object_meta, stored_headers};
use inlay_cluster::kv::SharedKv;
use inlay_core::{CacheSettings, ProxyError, body, headers};
use inlay_runtime::{
    BodyBudget, CachedObject, FetchError, NewObject, PolicyServices, SubRequest, SubResponse,
};

use crate::backend::director::key_hash;
use crate::backend::{Backends, Picked};

/// Largest subrequest response body a policy may buffer.
pub const MAX_SUBREQUEST_BODY: usize = 8 << 20;

/// The host's services for policies.
pub struct HostServices {
    /// Weak: the runtime may keep these services (a thread's policy handle)
    /// after their generation is gone, and must not keep its store open
    /// (a reload that moved `cache.dir` closes the old one). The generation
    /// holds the cache while its requests run.
    cache: WeakHttpCache,
    backends: Backends,
    /// The request-id header carried from a request onto its policy's
    /// subrequests (`server.request_id_header`), if ids are on.
    request_id: Option<http::HeaderName>,
    /// The cluster's shared kv (`cluster.kv = "nats"`) instead of the store's.
    shared_kv: Option<SharedKv>,
}

impl HostServices {
    /// Services over the host's cache and backends.
    pub fn new(cache: HttpCache, backends: Backends) -> Self {
        Self {
            cache: cache.downgrade(),
            backends,
            request_id: None,
            shared_kv: None,
        }
    }

    /// The generation's cache; gone only once no request of it runs.
    fn cache(&self) -> Result<HttpCache, String> {
        self.cache
            .upgrade()
            .ok_or_else(|| "the cache of this generation is closed".to_owned())
    }

    /// Subrequests carry the request's id in `header` unless the policy
    /// set one itself.
    pub fn with_request_id(mut self, header: Option<http::HeaderName>) -> Self {
        self.request_id = header;
        self
    }

    /// Policies' kv calls go to the cluster's shared kv, if given.
    pub fn with_shared_kv(mut self, kv: Option<SharedKv>) -> Self {
        self.shared_kv = kv;
        self
    }
}

fn kv_namespace(ns: &str) -> String {
    format!("policy.{ns}")
}

impl PolicyServices for HostServices {
    fn backend_exists(&self, name: &str) -> bool {
        self.backends.exists(name)
    }

    fn cache_lookup(
        &self,
        host: &str,
        url: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>> {
        let cache = self.cache();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            let cache = cache?;
            let Some(obj) = cache.get(&primary, &HeaderMap::new()).await else {
                return Ok(None);
            };
            let now = inlay_storage::now_ms();
            if !obj.meta.is_fresh(now) && !obj.meta.in_grace(now) {
                return Ok(None);
            }
            let (headers, _esi) = stored_headers(&obj.meta);
            Ok(Some(CachedObject {
                status: StatusCode::from_u16(obj.meta.status).unwrap_or(StatusCode::OK),
                headers,
                body: inlay_cache::coding::identity_body(&obj),
                age: Duration::from_millis(obj.meta.age_ms(now)),
                ttl_left: Duration::from_millis(obj.meta.expires_at_ms().saturating_sub(now)),
            }))
        })
    }

    fn cache_insert(
        &self,
        host: &str,
        url: &str,
        object: NewObject,
    ) -> BoxFuture<'static, Result<(), String>> {
        let cache = self.cache();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            let cache = cache?;
            let settings = CacheSettings {
                cacheable: true,
                ttl: object.ttl,
                grace: object.grace,
                keep: Duration::ZERO,
                surrogate_keys: object.surrogate_keys,
                esi: false,
            };
            let mut meta = object_meta(object.status.as_u16(), &object.headers, &settings);
            // A policy's object is one variant, found by URL alone.
            meta.vary.clear();
            cache
                .insert(&primary, &HeaderMap::new(), meta, object.body)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn cache_purge_url(
        &self,
        host: &str,
        url: &str,
        soft: bool,
    ) -> BoxFuture<'static, Result<u32, String>> {
        let cache = self.cache();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            let cache = cache?;
            cache
                .purge_url(&primary, soft)
                .await
                .map(saturating_u32)
                .map_err(|e| e.to_string())
        })
    }

    fn cache_purge_key(&self, key: &str, soft: bool) -> BoxFuture<'static, Result<u32, String>> {
        let cache = self.cache();
        let key = key.to_owned();
        Box::pin(async move {
            let cache = cache?;
            cache
                .purge_key(&key, soft)
                .await
                .map(saturating_u32)
                .map_err(|e| e.to_string())
        })
    }

    fn kv_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>> {
        if let Some(kv) = &self.shared_kv {
            let value = kv.get(namespace, key);
            return Box::pin(async move { Ok(value) });
        }
        let (store, ns, key) = (
            self.cache().map(|c| c.store().clone()),
            kv_namespace(namespace),
            key.to_owned(),
        );
        Box::pin(async move {
            store?
                .kv_get(ns, key)
                .await
                .map(|v| v.map(|b| b.to_vec()))
                .map_err(|e| e.to_string())
        })
    }

    fn kv_set(
        &self,
        namespace: &str,
        key: &str,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), String>> {
        if let Some(kv) = &self.shared_kv {
            return kv.set(namespace, key, value);
        }
        let (store, ns, key) = (
            self.cache().map(|c| c.store().clone()),
            kv_namespace(namespace),
            key.to_owned(),
        );
        Box::pin(async move {
            store?
                .kv_set(ns, key, value)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn kv_delete(&self, namespace: &str, key: &str) -> BoxFuture<'static, Result<bool, String>> {
        if let Some(kv) = &self.shared_kv {
            return kv.delete(namespace, key);
        }
        let (store, ns, key) = (
            self.cache().map(|c| c.store().clone()),
            kv_namespace(namespace),
            key.to_owned(),
        );
        Box::pin(async move { store?.kv_delete(ns, key).await.map_err(|e| e.to_string()) })
    }

    fn fetch(
        &self,
        mut req: SubRequest,
        default_backend: &str,
    ) -> BoxFuture<'static, Result<SubResponse, FetchError>> {
        if let Some(name) = &self.request_id
            && !req.headers.contains_key(name)
            && let Some(id) = req.parent_headers.get(name)
        {
            req.headers.insert(name.clone(), id.clone());
        }
        let name = req
            .backend
            .clone()
            .unwrap_or_else(|| default_backend.to_owned());
        let uri = req.uri.to_string();
        match self.backends.pick(&name, || key_hash(&uri)) {
            Some(backend) => Box::pin(subrequest(backend, req)),
            None => Box::pin(async move { Err(FetchError::UnknownBackend(name)) }),
        }
    }
}

fn saturating_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One subrequest to a backend, its body buffered.
async fn subrequest(backend: Picked, req: SubRequest) -> Result<SubResponse, FetchError> {
    let mut r = Request::new(body::full(req.body));
    *r.method_mut() = req.method;
    *r.uri_mut() = req.uri;
    *r.headers_mut() = req.headers;
    headers::add_via(r.headers_mut());
    let resp = match backend.send(r).await {
        Ok(resp) => resp,
        Err(ProxyError::BackendTimeout { .. }) => return Err(FetchError::Timeout),
        Err(ProxyError::BadRequest(m)) => return Err(FetchError::InvalidRequest(m)),
        Err(other) => return Err(FetchError::ConnectFailed(other.to_string())),
    };
    let (parts, body) = resp.into_parts();
    let body = read_limited(body, &req.body_budget).await?;
    let mut headers = parts.headers;
    headers::strip_hop_by_hop(&mut headers);
    Ok(SubResponse {
        status: parts.status,
        headers,
        body,
    })
}

/// Buffer a subrequest body up to [`MAX_SUBREQUEST_BODY`] and what is left
/// of the request's `budget` (shared by its parallel subrequests).
async fn read_limited(mut body: body::ProxyBody, budget: &BodyBudget) -> Result<Bytes, FetchError> {
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.to_string().contains("between_bytes_timeout") {
                FetchError::Timeout
            } else {
                FetchError::ConnectFailed(e.to_string())
            }
        })?;
        if let Some(data) = frame.data_ref() {
            if buf.len() + data.len() > MAX_SUBREQUEST_BODY || !budget.take(data.len() as u64) {
                return Err(FetchError::BodyTooLarge);
            }
            buf.extend_from_slice(data);
        }
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parallel_subrequests_share_one_body_budget() {
        let budget = BodyBudget::new(8 << 20);
        let six = || body::full(vec![0u8; 6 << 20]);
        // One body fits; a second of the same request does not, although
        // each is under the per-subrequest cap.
        let (a, b) = tokio::join!(read_limited(six(), &budget), read_limited(six(), &budget));
        let ok = [a.is_ok(), b.is_ok()];
        assert_eq!(ok.iter().filter(|x| **x).count(), 1, "{ok:?}");
        assert!(matches!(
            read_limited(six(), &budget).await,
            Err(FetchError::BodyTooLarge)
        ));
        // Small bodies still fit in what is left.
        assert!(
            read_limited(body::full(vec![0u8; 1024]), &budget)
                .await
                .is_ok()
        );
    }
}
