//! fetch: where a request goes upstream, and the request it gets there.
//! The choice is made here alone: the backend the request names (or its
//! director's pick, hashed on the cache key for a `shard` director), or,
//! for a fetch for the cache with `[cluster] shard = true`, the node that
//! owns the key (which fetches from the origin once for the cluster), the
//! backend then being the fallback.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, Request, header};
use inlay_cache::{ContentCodings, PrimaryKey};
use inlay_core::{ProxyBody, ProxyError, RequestHead, body, headers};

use inlay_cluster::shard::{HOP, Peer, Shard};

use crate::backend::TimeoutBody;
use crate::backend::director::key_hash;
use crate::backend::{Backends, Picked};

/// Client fields that would make the backend answer with less than a whole
/// object; a fetch for the cache drops them (and adds its own validators).
static PARTIAL_FIELDS: [header::HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::RANGE,
];

/// Sent on every backend request (a name made once: inserting by a string
/// makes a new one each time).
const SURROGATE_CAPABILITY: HeaderName = HeaderName::from_static("surrogate-capability");

/// The upstreams of one generation: its backends and directors, and the
/// cluster's key owners when it shards.
#[derive(Clone)]
pub struct Upstreams {
    backends: Backends,
    shard: Option<Arc<Shard>>,
    /// Accept-Encoding of a fetch for the cache: the coding its key selects.
    codings: ContentCodings,
    /// Fields the origin may trust that are not in the key
    /// (`cache.strip_request_headers`); a fetch for the cache drops them.
    strip: Arc<[HeaderName]>,
}

impl Upstreams {
    /// Over `backends`, sharding by key with `shard`.
    pub fn new(
        backends: Backends,
        shard: Option<Arc<Shard>>,
        codings: ContentCodings,
        strip: &[HeaderName],
    ) -> Self {
        Self {
            backends,
            shard,
            codings,
            strip: strip.into(),
        }
    }

    /// The backend of a passed request: the one it names, or its
    /// director's pick (a `shard` director hashes the cache key).
    pub fn for_pass(&self, head: &RequestHead) -> Result<Picked, ProxyError> {
        self.backend(head, || key_hash(PrimaryKey::of(head).as_str()))
    }

    /// Where a fetch for the cache of `key` goes: the key's owner in the
    /// cluster when it is another node and `head` is not already a peer's
    /// fetch, else the request's backend.
    pub fn for_cache(&self, head: &RequestHead, key: &PrimaryKey) -> Result<Upstream, ProxyError> {
        let backend = self.backend(head, || key_hash(key.as_str()))?;
        let owner = self
            .shard
            .as_ref()
            .filter(|_| !head.headers.contains_key(HOP))
            .and_then(|shard| Some((Arc::clone(shard), shard.owner(key.as_str())?)));
        Ok(Upstream {
            backend,
            owner,
            codings: self.codings.clone(),
            strip: Arc::clone(&self.strip),
        })
    }

    /// The backend whose address or `host_header` is `authority` (an
    /// absolute ESI include may name only a configured backend).
    pub fn backend_serving(&self, authority: &str) -> Option<String> {
        self.backends
            .iter()
            .find(|b| b.serves_authority(authority))
            .map(|b| b.name().to_owned())
    }

    fn backend(&self, head: &RequestHead, key: impl FnOnce() -> u64) -> Result<Picked, ProxyError> {
        self.backends.pick(&head.backend, key).ok_or_else(|| {
            ProxyError::Internal(format!("backend {} is not configured", head.backend))
        })
    }
}

/// Where one fetch for the cache goes.
pub struct Upstream {
    backend: Picked,
    /// The key's owner, when another node owns it.
    owner: Option<(Arc<Shard>, Arc<Peer>)>,
    codings: ContentCodings,
    strip: Arc<[HeaderName]>,
}

impl Upstream {
    /// Whether the backend may be asked now (a background refresh does not
    /// ask a sick one: the stale object is served in its grace).
    pub fn is_healthy(&self) -> bool {
        self.backend.backend().is_healthy()
    }

    /// GET `head` for the cache, with the cache's `validators` instead of
    /// the client's conditional and Range fields.
    pub async fn fetch(
        &self,
        head: &RequestHead,
        validators: HeaderMap,
    ) -> Result<http::Response<ProxyBody>, ProxyError> {
        let fill = ForCache {
            validators,
            codings: &self.codings,
            strip: &self.strip,
        };
        let (parts, _) = request(head, Method::GET, body::empty(), Some(fill)).into_parts();
        if let Some((shard, owner)) = &self.owner {
            let timeouts = self.backend.backend().config();
            // Unreachable, the owner says to fall back: the backend, as if no
            // node owned the key.
            if let Ok(resp) = shard
                .fetch(owner, &parts, timeouts.first_byte_timeout)
                .await
            {
                return Ok(resp.map(|incoming| {
                    let name = format!("cluster node {}", owner.name());
                    body::boxed(TimeoutBody::new(
                        incoming,
                        timeouts.between_bytes_timeout,
                        name.into(),
                        (),
                    ))
                }));
            }
        }
        send(&self.backend, Request::from_parts(parts, body::empty())).await
    }
}

/// Send a passed request: `head` with the client's `body` to `backend`.
pub async fn pass(
    backend: &Picked,
    head: &RequestHead,
    body: ProxyBody,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    send(backend, request(head, head.method.clone(), body, None)).await
}

async fn send(
    backend: &Picked,
    req: Request<ProxyBody>,
) -> Result<http::Response<ProxyBody>, ProxyError> {
    tracing::debug!(backend = backend.name(), method = %req.method(), uri = %req.uri(), "backend fetch");
    backend.send(req).await
}

/// How a fetch for the cache differs from the client's request.
struct ForCache<'a> {
    /// The cache's own validators, sent instead of the client's
    /// conditional and Range fields.
    validators: HeaderMap,
    /// Accept-Encoding becomes the coding the cache key selects.
    codings: &'a ContentCodings,
    /// Fields the origin may trust that are not in the key.
    strip: &'a [HeaderName],
}

/// The backend request made from `head`, with `Via` and `X-Forwarded-For`.
/// `for_cache` is set when the response is meant for the cache: the
/// client's conditional and Range fields are then replaced by the cache's
/// own validators, Accept-Encoding by the value the key used, and the
/// unkeyed fields the origin may trust are removed, so what the origin
/// answers is what every request with this key may be served.
fn request(
    head: &RequestHead,
    method: Method,
    body: ProxyBody,
    for_cache: Option<ForCache<'_>>,
) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = head.uri.clone();
    let h = req.headers_mut();
    h.clone_from(&head.headers);
    if let Some(fill) = for_cache {
        for f in PARTIAL_FIELDS.iter().chain(fill.strip) {
            h.remove(f);
        }
        h.remove(header::CONTENT_LENGTH);
        fill.codings.normalise(h);
        h.extend(fill.validators);
    }
    // Tell the origin we process ESI (Edge Architecture Specification).
    h.insert(
        SURROGATE_CAPABILITY,
        http::HeaderValue::from_static("inlay=\"Surrogate/1.0 ESI/1.0\""),
    );
    // A peer's hop token is for this node, not for the origin.
    h.remove(inlay_cluster::shard::HOP);
    headers::add_via(h);
    headers::add_forwarded_for(h, head.client_ip);
    req
}
