//! What the host lends policies ([`PolicyServices`]): the HTTP cache, the
//! kv store (one namespace per policy, in the object store's kv trees) and
//! the backend fetcher, the same one requests and ESI includes use.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use inlay_storage::ObjectMeta;

use crate::backend::{Backend, Backends};
use crate::body;
use crate::cache::{HttpCache, PrimaryKey};
use crate::error::ProxyError;
use crate::headers;
use crate::runtime::{
    CachedObject, FetchError, NewObject, PolicyServices, SubRequest, SubResponse,
};

/// Largest subrequest response body a policy may buffer.
pub const MAX_SUBREQUEST_BODY: usize = 8 << 20;

/// The host's services for policies.
pub struct HostServices {
    cache: HttpCache,
    backends: Backends,
}

impl HostServices {
    /// Services over the host's cache and backends.
    pub fn new(cache: HttpCache, backends: Backends) -> Self {
        Self { cache, backends }
    }
}

fn kv_namespace(ns: &str) -> String {
    format!("policy.{ns}")
}

impl PolicyServices for HostServices {
    fn backend_exists(&self, name: &str) -> bool {
        self.backends.get(name).is_some()
    }

    fn cache_lookup(
        &self,
        host: &str,
        url: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>> {
        let cache = self.cache.clone();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            let key = cache.storage_key(&primary, &HeaderMap::new());
            let Some(obj) = cache.get(&key) else {
                return Ok(None);
            };
            let now = inlay_storage::now_ms();
            if !obj.meta.is_fresh(now) && !obj.meta.in_grace(now) {
                return Ok(None);
            }
            let (headers, _esi) = crate::cache::stored_headers(&obj.meta);
            Ok(Some(CachedObject {
                status: StatusCode::from_u16(obj.meta.status).unwrap_or(StatusCode::OK),
                headers,
                body: obj.body.clone(),
                age: std::time::Duration::from_millis(obj.meta.age_ms(now)),
                ttl_left: std::time::Duration::from_millis(
                    obj.meta.expires_at_ms().saturating_sub(now),
                ),
            }))
        })
    }

    fn cache_insert(
        &self,
        host: &str,
        url: &str,
        object: NewObject,
    ) -> BoxFuture<'static, Result<(), String>> {
        let cache = self.cache.clone();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            let mut h = object.headers.clone();
            headers::strip_hop_by_hop(&mut h);
            let meta = ObjectMeta {
                status: object.status.as_u16(),
                headers: h
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect(),
                stored_at_ms: inlay_storage::now_ms(),
                ttl_ms: object.ttl.as_millis() as u64,
                grace_ms: object.grace.as_millis() as u64,
                keep_ms: 0,
                surrogate_keys: object.surrogate_keys,
                vary: Vec::new(),
                etag: h
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                last_modified: h
                    .get(header::LAST_MODIFIED)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                body_len: 0,
                checksum: 0,
            };
            tokio::task::spawn_blocking(move || {
                cache.insert(&primary, &HeaderMap::new(), meta, object.body)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
        })
    }

    fn cache_purge_url(
        &self,
        host: &str,
        url: &str,
        soft: bool,
    ) -> BoxFuture<'static, Result<u32, String>> {
        let cache = self.cache.clone();
        let primary = PrimaryKey::new(host, url, &[]);
        Box::pin(async move {
            cache
                .purge_url(&primary, soft)
                .map(|n| n as u32)
                .map_err(|e| e.to_string())
        })
    }

    fn cache_purge_key(&self, key: &str, soft: bool) -> BoxFuture<'static, Result<u32, String>> {
        let cache = self.cache.clone();
        let key = key.to_owned();
        Box::pin(async move {
            cache
                .purge_key(&key, soft)
                .map(|n| n as u32)
                .map_err(|e| e.to_string())
        })
    }

    fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.cache
            .store()
            .kv_get(&kv_namespace(namespace), key)
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(|e| e.to_string())
    }

    fn kv_set(&self, namespace: &str, key: &str, value: &[u8]) -> Result<(), String> {
        self.cache
            .store()
            .kv_set(&kv_namespace(namespace), key, value)
            .map_err(|e| e.to_string())
    }

    fn kv_delete(&self, namespace: &str, key: &str) -> Result<bool, String> {
        self.cache
            .store()
            .kv_delete(&kv_namespace(namespace), key)
            .map_err(|e| e.to_string())
    }

    fn fetch(
        &self,
        req: SubRequest,
        default_backend: &str,
    ) -> BoxFuture<'static, Result<SubResponse, FetchError>> {
        let name = req
            .backend
            .clone()
            .unwrap_or_else(|| default_backend.to_owned());
        match self.backends.get(&name).cloned() {
            Some(backend) => Box::pin(subrequest(backend, req)),
            None => Box::pin(async move { Err(FetchError::UnknownBackend(name)) }),
        }
    }
}

/// One subrequest to a backend, its body buffered.
async fn subrequest(backend: Arc<Backend>, req: SubRequest) -> Result<SubResponse, FetchError> {
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
    let body = read_limited(body).await?;
    let mut headers = parts.headers;
    headers::strip_hop_by_hop(&mut headers);
    Ok(SubResponse {
        status: parts.status,
        headers,
        body,
    })
}

/// Buffer a subrequest body up to [`MAX_SUBREQUEST_BODY`].
async fn read_limited(mut body: body::ProxyBody) -> Result<Bytes, FetchError> {
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
            if buf.len() + data.len() > MAX_SUBREQUEST_BODY {
                return Err(FetchError::BodyTooLarge);
            }
            buf.extend_from_slice(data);
        }
    }
    Ok(buf.freeze())
}

/// Shared handle type the pipeline passes to each policy call.
pub type SharedServices = Arc<dyn PolicyServices>;
