//! hash / lookup: the cache key, and what the cache holds for it. Fresh hits
//! go to deliver; stale hits within grace are delivered while one background
//! fetch refreshes them; misses join a single in-flight fetch per key.

use http::header;

use super::RequestHead;
use crate::cache::{HttpCache, Lookup, PrimaryKey};

/// The cache key of a request: Host, path and query, and the policy's additions.
pub fn primary_key(head: &RequestHead) -> PrimaryKey {
    let host = head
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let pq = head.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    PrimaryKey::new(host, pq, &head.cache_key_extra)
}

/// Look the request up, waiting for an in-flight fetch of the same key.
pub async fn lookup(cache: &HttpCache, primary: &PrimaryKey, head: &RequestHead) -> Lookup {
    cache.lookup(primary, &head.headers).await
}
