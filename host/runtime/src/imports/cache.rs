//! `inlay:policy/cache`: look up, insert and purge objects in the host's
//! HTTP cache. Arguments are validated here; storage failures come back
//! as `cache-error.storage`.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use crate::bindings::inlay::policy::cache::{CacheError, CachedObject, Host, NewObject};
use crate::convert::{headers_from_list, headers_to_list};
use crate::policy::state::StoreState;
use crate::services;

use super::StorageError;

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

fn check_target(host: &str, url: &str) -> Result<(), CacheError> {
    if host.is_empty() {
        return Err(CacheError::Invalid("host is empty".into()));
    }
    if !url.starts_with('/') {
        return Err(CacheError::Invalid(format!(
            "url must start with `/`: {url:?}"
        )));
    }
    Ok(())
}

fn to_new_object(obj: NewObject) -> Result<services::NewObject, CacheError> {
    let status = StatusCode::from_u16(obj.status)
        .map_err(|_| CacheError::Invalid(format!("invalid status {}", obj.status)))?;
    let headers = headers_from_list(obj.headers).map_err(CacheError::Invalid)?;
    Ok(services::NewObject {
        status,
        headers,
        body: Bytes::from(obj.body),
        ttl: Duration::from_secs(obj.ttl.into()),
        grace: Duration::from_secs(obj.grace.into()),
        surrogate_keys: obj.surrogate_keys,
    })
}

fn from_cached(obj: services::CachedObject) -> CachedObject {
    CachedObject {
        status: obj.status.as_u16(),
        headers: headers_to_list(&obj.headers),
        body: obj.body.to_vec(),
        age: secs(obj.age),
        ttl_left: secs(obj.ttl_left),
    }
}

impl StorageError for CacheError {
    fn limit_exceeded() -> Self {
        CacheError::LimitExceeded
    }
    fn storage(message: String) -> Self {
        CacheError::Storage(message)
    }
}

impl Host for StoreState {
    async fn lookup(
        &mut self,
        host: String,
        url: String,
    ) -> wasmtime::Result<Result<Option<CachedObject>, CacheError>> {
        let check = check_target(&host, &url);
        let found = self
            .storage_call("cache.lookup", check, |s| {
                Ok(s.services().cache_lookup(&host, &url))
            })
            .await?;
        Ok(found.map(|o| o.map(from_cached)))
    }

    async fn insert(
        &mut self,
        host: String,
        url: String,
        obj: NewObject,
    ) -> wasmtime::Result<Result<(), CacheError>> {
        let check = check_target(&host, &url);
        self.storage_call("cache.insert", check, |s| {
            let obj = to_new_object(obj)?;
            Ok(s.services().cache_insert(&host, &url, obj))
        })
        .await
    }

    async fn purge_url(
        &mut self,
        host: String,
        url: String,
        soft: bool,
    ) -> wasmtime::Result<Result<u32, CacheError>> {
        let check = check_target(&host, &url);
        self.storage_call("cache.purge-url", check, |s| {
            Ok(s.services().cache_purge_url(&host, &url, soft))
        })
        .await
    }

    async fn purge_key(
        &mut self,
        key: String,
        soft: bool,
    ) -> wasmtime::Result<Result<u32, CacheError>> {
        let check = if key.is_empty() {
            Err(CacheError::Invalid("surrogate key is empty".into()))
        } else {
            Ok(())
        };
        self.storage_call("cache.purge-key", check, |s| {
            Ok(s.services().cache_purge_key(&key, soft))
        })
        .await
    }
}
