//! What the host lends a policy: the cache, the kv store and the fetcher.
//!
//! The runtime validates the guest's arguments (header names, URLs, sizes,
//! caps) before calling these, so an implementation sees only well-formed
//! input and reports only its own failures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, StatusCode, Uri};

/// A cached object as a policy sees it (`cache.lookup`).
#[derive(Clone, Debug)]
pub struct CachedObject {
    /// Status code.
    pub status: StatusCode,
    /// Stored header fields.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// Time since it was stored.
    pub age: Duration,
    /// Freshness left (zero when stale, in grace).
    pub ttl_left: Duration,
}

/// An object a policy inserts into the cache (`cache.insert`).
#[derive(Clone, Debug)]
pub struct NewObject {
    /// Status code.
    pub status: StatusCode,
    /// Header fields.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// Time fresh.
    pub ttl: Duration,
    /// Grace after expiry.
    pub grace: Duration,
    /// Surrogate keys for purging.
    pub surrogate_keys: Vec<String>,
}

/// The bytes of subrequest bodies one request may still buffer, shared by
/// all its subrequests (clones share the same budget).
#[derive(Clone, Debug)]
pub struct BodyBudget(Arc<AtomicU64>);

impl BodyBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Self(Arc::new(AtomicU64::new(bytes)))
    }

    /// Takes `n` bytes; `false` (and nothing taken) when fewer are left.
    pub fn take(&self, n: u64) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    /// Bytes left.
    pub fn left(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A subrequest made by a policy (`fetch.send`, `fetch.send-many`).
#[derive(Clone, Debug)]
pub struct SubRequest {
    /// A configured backend; `None` means the request's own backend.
    pub backend: Option<String>,
    /// The method.
    pub method: Method,
    /// Path and query (no scheme or authority).
    pub uri: Uri,
    /// Header fields to send.
    pub headers: HeaderMap,
    /// Request body.
    pub body: Bytes,
    /// What the request's subrequests may still buffer of response bodies.
    pub body_budget: BodyBudget,
    /// The header fields of the request the policy is handling, from which
    /// the host may carry some onto the subrequest (its request id).
    pub parent_headers: HeaderMap,
}

/// A subrequest's response.
#[derive(Clone, Debug)]
pub struct SubResponse {
    /// Status code.
    pub status: StatusCode,
    /// Header fields.
    pub headers: HeaderMap,
    /// The body, buffered.
    pub body: Bytes,
}

/// Why a subrequest failed (mirrors the WIT `fetch-error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No backend of that name is configured.
    #[error("unknown backend `{0}`")]
    UnknownBackend(String),
    /// The request was malformed.
    #[error("invalid subrequest: {0}")]
    InvalidRequest(String),
    /// Connecting to the backend failed.
    #[error("connect failed: {0}")]
    ConnectFailed(String),
    /// The backend did not answer in time.
    #[error("subrequest timed out")]
    Timeout,
    /// The body was larger than a policy may buffer.
    #[error("subrequest body too large")]
    BodyTooLarge,
}

/// The host's capabilities, as the runtime calls them for a policy.
///
/// One value serves many requests at once (it is shared by `Arc`), so
/// implementations hold handles (cache, kv database, HTTP client), not
/// per-request state. Errors are plain messages: the runtime hands them to
/// the guest as the WIT `storage(..)` variants.
pub trait PolicyServices: Send + Sync + 'static {
    /// Whether a backend of this name is configured (`set-backend`).
    fn backend_exists(&self, name: &str) -> bool;

    /// Looks up a fresh or in-grace object by host and path+query.
    fn cache_lookup(
        &self,
        host: &str,
        url: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>>;

    /// Inserts or replaces an object under host and path+query.
    fn cache_insert(
        &self,
        host: &str,
        url: &str,
        object: NewObject,
    ) -> BoxFuture<'static, Result<(), String>>;

    /// Purges one URL (all variants); `soft` marks stale instead of removing.
    /// Returns how many objects were affected.
    fn cache_purge_url(
        &self,
        host: &str,
        url: &str,
        soft: bool,
    ) -> BoxFuture<'static, Result<u32, String>>;

    /// Purges every object tagged with a surrogate key.
    fn cache_purge_key(&self, key: &str, soft: bool) -> BoxFuture<'static, Result<u32, String>>;

    /// Reads a value from the policy's kv namespace.
    fn kv_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>>;

    /// Writes a value to the policy's kv namespace.
    fn kv_set(
        &self,
        namespace: &str,
        key: &str,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), String>>;

    /// Deletes a value; returns whether it existed.
    fn kv_delete(&self, namespace: &str, key: &str) -> BoxFuture<'static, Result<bool, String>>;

    /// Sends one subrequest; `default_backend` is the request's backend,
    /// used when `req.backend` is `None`.
    fn fetch(
        &self,
        req: SubRequest,
        default_backend: &str,
    ) -> BoxFuture<'static, Result<SubResponse, FetchError>>;

    /// Sends several subrequests in parallel; results in the same order.
    /// The default runs [`PolicyServices::fetch`] for each, concurrently.
    fn fetch_many(
        &self,
        reqs: Vec<SubRequest>,
        default_backend: &str,
    ) -> BoxFuture<'static, Vec<Result<SubResponse, FetchError>>> {
        let futures: Vec<_> = reqs
            .into_iter()
            .map(|req| self.fetch(req, default_backend))
            .collect();
        Box::pin(futures_util::future::join_all(futures))
    }
}

/// Services that refuse everything: used to instantiate a policy once at
/// load time, when no request exists.
pub(crate) struct NoServices;

impl PolicyServices for NoServices {
    fn backend_exists(&self, _name: &str) -> bool {
        false
    }

    fn cache_lookup(
        &self,
        _host: &str,
        _url: &str,
    ) -> BoxFuture<'static, Result<Option<CachedObject>, String>> {
        Box::pin(async { Err("no cache while loading".to_string()) })
    }

    fn cache_insert(
        &self,
        _host: &str,
        _url: &str,
        _object: NewObject,
    ) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Err("no cache while loading".to_string()) })
    }

    fn cache_purge_url(
        &self,
        _host: &str,
        _url: &str,
        _soft: bool,
    ) -> BoxFuture<'static, Result<u32, String>> {
        Box::pin(async { Err("no cache while loading".to_string()) })
    }

    fn cache_purge_key(&self, _key: &str, _soft: bool) -> BoxFuture<'static, Result<u32, String>> {
        Box::pin(async { Err("no cache while loading".to_string()) })
    }

    fn kv_get(
        &self,
        _namespace: &str,
        _key: &str,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>> {
        Box::pin(async { Err("no kv while loading".to_string()) })
    }

    fn kv_set(
        &self,
        _namespace: &str,
        _key: &str,
        _value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Err("no kv while loading".to_string()) })
    }

    fn kv_delete(&self, _namespace: &str, _key: &str) -> BoxFuture<'static, Result<bool, String>> {
        Box::pin(async { Err("no kv while loading".to_string()) })
    }

    fn fetch(
        &self,
        _req: SubRequest,
        _default_backend: &str,
    ) -> BoxFuture<'static, Result<SubResponse, FetchError>> {
        Box::pin(async { Err(FetchError::ConnectFailed("no fetch while loading".into())) })
    }
}
