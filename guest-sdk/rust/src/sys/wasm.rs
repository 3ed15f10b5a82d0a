//! Capability calls to the host, converting between the SDK's types and the
//! generated bindings.

use crate::bindings::inlay::policy as wit;
use crate::cache::{CacheError, CachedObject, NewObject};
use crate::fetch::{FetchError, FetchRequest, FetchResponse};
use crate::kv::KvError;
use crate::log::Level;

pub(crate) fn log_write(level: Level, message: &str) {
    use wit::log::Level as W;
    let level = match level {
        Level::Trace => W::Trace,
        Level::Debug => W::Debug,
        Level::Info => W::Info,
        Level::Warn => W::Warn,
        Level::Error => W::Error,
    };
    wit::log::write(level, message);
}

pub(crate) fn config_get(key: &str) -> Option<String> {
    wit::config::get(key)
}

pub(crate) fn config_all() -> Vec<(String, String)> {
    wit::config::all()
}

fn cache_error(err: wit::cache::CacheError) -> CacheError {
    use wit::cache::CacheError as W;
    match err {
        W::Storage(msg) => CacheError::Storage(msg),
        W::Invalid(msg) => CacheError::Invalid(msg),
        W::LimitExceeded => CacheError::LimitExceeded,
    }
}

pub(crate) fn cache_lookup(host: &str, url: &str) -> Result<Option<CachedObject>, CacheError> {
    let found = wit::cache::lookup(host, url).map_err(cache_error)?;
    Ok(found.map(|o| CachedObject {
        status: o.status,
        headers: o.headers,
        body: o.body,
        age: o.age,
        ttl_left: o.ttl_left,
    }))
}

pub(crate) fn cache_insert(host: &str, url: &str, obj: &NewObject) -> Result<(), CacheError> {
    let obj = wit::cache::NewObject {
        status: obj.status,
        headers: obj.headers.clone(),
        body: obj.body.clone(),
        ttl: obj.ttl,
        grace: obj.grace,
        surrogate_keys: obj.surrogate_keys.clone(),
    };
    wit::cache::insert(host, url, &obj).map_err(cache_error)
}

pub(crate) fn cache_purge_url(host: &str, url: &str, soft: bool) -> Result<u32, CacheError> {
    wit::cache::purge_url(host, url, soft).map_err(cache_error)
}

pub(crate) fn cache_purge_key(key: &str, soft: bool) -> Result<u32, CacheError> {
    wit::cache::purge_key(key, soft).map_err(cache_error)
}

fn kv_error(err: wit::kv::KvError) -> KvError {
    use wit::kv::KvError as W;
    match err {
        W::Storage(msg) => KvError::Storage(msg),
        W::TooLarge => KvError::TooLarge,
        W::LimitExceeded => KvError::LimitExceeded,
    }
}

pub(crate) fn kv_get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    wit::kv::get(key).map_err(kv_error)
}

pub(crate) fn kv_set(key: &str, value: &[u8]) -> Result<(), KvError> {
    wit::kv::set(key, value).map_err(kv_error)
}

pub(crate) fn kv_delete(key: &str) -> Result<bool, KvError> {
    wit::kv::delete(key).map_err(kv_error)
}

fn fetch_request(req: &FetchRequest) -> wit::fetch::FetchRequest {
    wit::fetch::FetchRequest {
        backend: req.backend.clone(),
        method: req.method.clone(),
        url: req.url.clone(),
        headers: req.headers.clone(),
        body: req.body.clone(),
    }
}

fn fetch_result(
    result: Result<wit::fetch::FetchResponse, wit::fetch::FetchError>,
) -> Result<FetchResponse, FetchError> {
    use wit::fetch::FetchError as W;
    match result {
        Ok(r) => Ok(FetchResponse {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }),
        Err(W::UnknownBackend(msg)) => Err(FetchError::UnknownBackend(msg)),
        Err(W::InvalidRequest(msg)) => Err(FetchError::InvalidRequest(msg)),
        Err(W::ConnectFailed(msg)) => Err(FetchError::ConnectFailed(msg)),
        Err(W::Timeout) => Err(FetchError::Timeout),
        Err(W::BodyTooLarge) => Err(FetchError::BodyTooLarge),
        Err(W::LimitExceeded) => Err(FetchError::LimitExceeded),
    }
}

pub(crate) fn fetch_send(req: &FetchRequest) -> Result<FetchResponse, FetchError> {
    fetch_result(wit::fetch::send(&fetch_request(req)))
}

pub(crate) fn fetch_send_many(reqs: &[FetchRequest]) -> Vec<Result<FetchResponse, FetchError>> {
    let reqs: Vec<_> = reqs.iter().map(fetch_request).collect();
    wit::fetch::send_many(&reqs)
        .into_iter()
        .map(fetch_result)
        .collect()
}

pub(crate) fn esi_set_enabled(enabled: bool) {
    wit::esi::set_enabled(enabled);
}

pub(crate) fn esi_set_var(name: &str, value: &str) {
    wit::esi::set_var(name, value);
}

pub(crate) fn clock_now_unix_ms() -> u64 {
    wit::clock::now_unix_ms()
}

/// Tells the host that `hook` is the SDK's default (see `Policy`).
pub(crate) fn default_hook(hook: super::Hook) {
    use wit::sdk::Hook as W;
    wit::sdk::default_hook(match hook {
        super::Hook::OnRequest => W::OnRequest,
        super::Hook::OnBackendResponse => W::OnBackendResponse,
        super::Hook::OnDeliver => W::OnDeliver,
    });
}
