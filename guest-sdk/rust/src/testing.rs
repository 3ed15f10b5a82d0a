//! A test double of the host for native unit tests (not built for wasm32).
//!
//! On non-wasm targets every capability ([`config`](crate::config),
//! [`log`](crate::log), [`kv`](crate::kv), [`cache`](crate::cache),
//! [`fetch`](crate::fetch), [`esi`](crate::esi), [`clock`](crate::clock))
//! talks to thread-local state kept here. `cargo test` runs each test on its
//! own thread, so tests do not see each other's state; call [`reset`] to
//! start over within one test. Build requests and responses with
//! [`Request::builder`](crate::Request::builder) and
//! [`Response::builder`](crate::Response::builder).
//!
//! ```
//! use inlay_policy::{testing, Action, Policy, Request, config};
//!
//! #[derive(Default)]
//! struct Maintenance;
//!
//! impl Policy for Maintenance {
//!     fn on_request(&self, req: &Request) -> Action {
//!         if config::flag("maintenance") {
//!             return Action::synthetic(503).body("back soon").into();
//!         }
//!         inlay_policy::builtin::recv(req)
//!     }
//! }
//!
//! let req = Request::new_local("GET", "/");
//! assert_eq!(Maintenance.on_request(&req), Action::Lookup);
//! testing::set_config("maintenance", "on");
//! assert!(matches!(Maintenance.on_request(&req), Action::Synthetic(r) if r.status == 503));
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::cache::{CacheError, NewObject};
use crate::fetch::{FetchError, FetchRequest, FetchResponse};
use crate::kv::KvError;
use crate::log::Level;

type FetchHandler = dyn FnMut(&FetchRequest) -> Result<FetchResponse, FetchError>;

#[derive(Default)]
struct State {
    config: Vec<(String, String)>,
    logs: Vec<(Level, String)>,
    kv: BTreeMap<String, Vec<u8>>,
    kv_error: Option<KvError>,
    cache: BTreeMap<(String, String), Stored>,
    cache_error: Option<CacheError>,
    fetch_handler: Option<Rc<RefCell<FetchHandler>>>,
    fetched: Vec<FetchRequest>,
    esi_enabled: Option<bool>,
    esi_vars: Vec<(String, String)>,
    now_ms: Option<u64>,
    default_hooks: Vec<&'static str>,
}

struct Stored {
    object: NewObject,
    stored_ms: u64,
    fresh_until_ms: u64,
    usable_until_ms: u64,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|state| f(&mut state.borrow_mut()))
}

/// Forget all state of this thread: config, logs, kv, cache, fetch
/// handler and log, ESI state and the fixed clock.
pub fn reset() {
    with(|s| *s = State::default());
}

/// Set a policy config value (replacing an earlier one).
pub fn set_config(key: &str, value: &str) {
    with(|s| {
        s.config.retain(|(k, _)| k != key);
        s.config.push((key.to_owned(), value.to_owned()));
    });
}

/// Remove a policy config value.
pub fn remove_config(key: &str) {
    with(|s| s.config.retain(|(k, _)| k != key));
}

/// Every log line written so far, oldest first.
pub fn logs() -> Vec<(Level, String)> {
    with(|s| s.logs.clone())
}

/// Fix the clock at `ms` milliseconds since the Unix epoch (by default the
/// test double uses the system clock).
pub fn set_now_unix_ms(ms: u64) {
    with(|s| s.now_ms = Some(ms));
}

/// Answer subrequests with `handler`. Without one, every subrequest fails
/// with [`FetchError::ConnectFailed`].
pub fn on_fetch(handler: impl FnMut(&FetchRequest) -> Result<FetchResponse, FetchError> + 'static) {
    with(|s| s.fetch_handler = Some(Rc::new(RefCell::new(handler))));
}

/// Every subrequest sent so far, in order.
pub fn fetched() -> Vec<FetchRequest> {
    with(|s| s.fetched.clone())
}

/// What [`esi::set_enabled`](crate::esi::set_enabled) last set, if called.
pub fn esi_enabled() -> Option<bool> {
    with(|s| s.esi_enabled)
}

/// The ESI variables set so far, in the order first set.
pub fn esi_vars() -> Vec<(String, String)> {
    with(|s| s.esi_vars.clone())
}

/// The hooks whose SDK default ran so far (`"on-request"`,
/// `"on-backend-response"`, `"on-deliver"`), each once: the hooks the host
/// would run itself, since the policy does not implement them.
pub fn default_hooks() -> Vec<&'static str> {
    with(|s| s.default_hooks.clone())
}

/// Make every kv call fail with `error` (or work again with `None`).
pub fn fail_kv(error: Option<KvError>) {
    with(|s| s.kv_error = error);
}

/// Make every cache call fail with `error` (or work again with `None`).
pub fn fail_cache(error: Option<CacheError>) {
    with(|s| s.cache_error = error);
}

/// The capability calls of [`crate::sys`] on native targets.
pub(crate) mod backend {
    use super::*;
    use crate::cache::CachedObject;

    pub(crate) fn log_write(level: Level, message: &str) {
        // Shown by the test harness when a test fails.
        eprintln!("[policy {level:?}] {message}");
        with(|s| s.logs.push((level, message.to_owned())));
    }

    pub(crate) fn config_get(key: &str) -> Option<String> {
        with(|s| {
            s.config
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        })
    }

    pub(crate) fn config_all() -> Vec<(String, String)> {
        with(|s| s.config.clone())
    }

    pub(crate) fn clock_now_unix_ms() -> u64 {
        with(|s| current_ms(s))
    }

    /// The fixed time if set, else the system clock.
    fn current_ms(s: &State) -> u64 {
        s.now_ms.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }

    fn secs(ms: u64) -> u32 {
        u32::try_from(ms / 1000).unwrap_or(u32::MAX)
    }

    pub(crate) fn cache_lookup(host: &str, url: &str) -> Result<Option<CachedObject>, CacheError> {
        with(|s| {
            if let Some(err) = &s.cache_error {
                return Err(err.clone());
            }
            let now = current_ms(s);
            Ok(s.cache
                .get(&(host.to_owned(), url.to_owned()))
                .filter(|st| now < st.usable_until_ms)
                .map(|st| CachedObject {
                    status: st.object.status,
                    headers: st.object.headers.clone(),
                    body: st.object.body.clone(),
                    age: secs(now.saturating_sub(st.stored_ms)),
                    ttl_left: secs(st.fresh_until_ms.saturating_sub(now)),
                }))
        })
    }

    pub(crate) fn cache_insert(host: &str, url: &str, obj: &NewObject) -> Result<(), CacheError> {
        if host.is_empty() || !url.starts_with('/') {
            return Err(CacheError::Invalid(format!(
                "bad host or url: {host:?} {url:?}"
            )));
        }
        with(|s| {
            if let Some(err) = &s.cache_error {
                return Err(err.clone());
            }
            let now = current_ms(s);
            let fresh_until_ms = now.saturating_add(u64::from(obj.ttl) * 1000);
            s.cache.insert(
                (host.to_owned(), url.to_owned()),
                Stored {
                    object: obj.clone(),
                    stored_ms: now,
                    fresh_until_ms,
                    usable_until_ms: fresh_until_ms.saturating_add(u64::from(obj.grace) * 1000),
                },
            );
            Ok(())
        })
    }

    fn purge(
        s: &mut State,
        soft: bool,
        matches: impl Fn(&(String, String), &Stored) -> bool,
    ) -> Result<u32, CacheError> {
        if let Some(err) = &s.cache_error {
            return Err(err.clone());
        }
        let now = current_ms(s);
        let mut count = 0u32;
        s.cache.retain(|key, st| {
            if !matches(key, st) {
                return true;
            }
            count = count.saturating_add(1);
            if soft {
                // Stale now, still usable for its grace.
                st.fresh_until_ms = now;
                st.usable_until_ms = now.saturating_add(u64::from(st.object.grace) * 1000);
            }
            soft
        });
        Ok(count)
    }

    pub(crate) fn cache_purge_url(host: &str, url: &str, soft: bool) -> Result<u32, CacheError> {
        with(|s| purge(s, soft, |(h, u), _| h == host && u == url))
    }

    pub(crate) fn cache_purge_key(key: &str, soft: bool) -> Result<u32, CacheError> {
        with(|s| {
            purge(s, soft, |_, st| {
                st.object.surrogate_keys.iter().any(|k| k == key)
            })
        })
    }

    pub(crate) fn kv_get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
        with(|s| match &s.kv_error {
            Some(err) => Err(err.clone()),
            None => Ok(s.kv.get(key).cloned()),
        })
    }

    pub(crate) fn kv_set(key: &str, value: &[u8]) -> Result<(), KvError> {
        with(|s| match &s.kv_error {
            Some(err) => Err(err.clone()),
            None => {
                s.kv.insert(key.to_owned(), value.to_vec());
                Ok(())
            }
        })
    }

    pub(crate) fn kv_delete(key: &str) -> Result<bool, KvError> {
        with(|s| match &s.kv_error {
            Some(err) => Err(err.clone()),
            None => Ok(s.kv.remove(key).is_some()),
        })
    }

    pub(crate) fn fetch_send(req: &FetchRequest) -> Result<FetchResponse, FetchError> {
        let handler = with(|s| {
            s.fetched.push(req.clone());
            s.fetch_handler.clone()
        });
        // Called with `STATE` released: the handler may use the test double.
        match handler {
            Some(handler) => (handler.borrow_mut())(req),
            None => Err(FetchError::ConnectFailed(
                "no fetch handler set (inlay_policy::testing::on_fetch)".to_owned(),
            )),
        }
    }

    pub(crate) fn fetch_send_many(reqs: &[FetchRequest]) -> Vec<Result<FetchResponse, FetchError>> {
        reqs.iter().map(fetch_send).collect()
    }

    pub(crate) fn esi_set_enabled(enabled: bool) {
        with(|s| s.esi_enabled = Some(enabled));
    }

    pub(crate) fn default_hook(hook: crate::sys::Hook) {
        with(|s| {
            if !s.default_hooks.contains(&hook.name()) {
                s.default_hooks.push(hook.name());
            }
        });
    }

    pub(crate) fn esi_set_var(name: &str, value: &str) {
        with(|s| match s.esi_vars.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => value.clone_into(v),
            None => s.esi_vars.push((name.to_owned(), value.to_owned())),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cache, kv};

    #[test]
    fn cache_double_honours_ttl_grace_and_soft_purge() {
        set_now_unix_ms(1_000_000);
        let obj = NewObject::new(200, "x").ttl(10).grace(5).surrogate_key("k");
        cache::insert("h", "/a", &obj).unwrap();
        set_now_unix_ms(1_012_000);
        let hit = cache::lookup("h", "/a").unwrap().expect("in grace");
        assert_eq!((hit.age, hit.ttl_left), (12, 0));
        set_now_unix_ms(1_016_000);
        assert_eq!(cache::lookup("h", "/a").unwrap(), None);

        set_now_unix_ms(2_000_000);
        cache::insert("h", "/a", &obj).unwrap();
        assert_eq!(cache::purge_key("k", true).unwrap(), 1);
        assert_eq!(
            cache::lookup("h", "/a").unwrap().map(|o| o.ttl_left),
            Some(0)
        );
        assert_eq!(cache::purge_url("h", "/a", false).unwrap(), 1);
        assert_eq!(cache::lookup("h", "/a").unwrap(), None);
        assert!(matches!(
            cache::insert("", "/a", &obj),
            Err(CacheError::Invalid(_))
        ));
    }

    #[test]
    fn injected_failures_and_reset() {
        kv::set("a", b"1").unwrap();
        fail_kv(Some(KvError::TooLarge));
        assert_eq!(kv::get("a"), Err(KvError::TooLarge));
        fail_kv(None);
        assert_eq!(kv::get("a").unwrap().as_deref(), Some(&b"1"[..]));
        reset();
        assert_eq!(kv::get("a").unwrap(), None);
    }

    #[test]
    fn fetch_without_handler_fails_and_is_recorded() {
        let err = crate::fetch::send(&FetchRequest::get("/x")).unwrap_err();
        assert!(matches!(err, FetchError::ConnectFailed(_)));
        assert_eq!(fetched()[0].url, "/x");
    }

    /// Only the hooks a policy leaves to its default tell the host so; a
    /// hook it wrote does not, even when it ends in the built-in rules.
    #[test]
    fn only_default_hooks_are_reported() {
        use crate::{Action, CacheSettings, Policy, Request, Response, builtin};

        #[derive(Default)]
        struct Recv;
        impl Policy for Recv {
            fn on_request(&self, req: &Request) -> Action {
                builtin::recv(req)
            }
        }

        let req = Request::new_local("GET", "/");
        let resp = Response::builder().build();
        Recv.on_request(&req);
        assert!(default_hooks().is_empty());
        Recv.on_deliver(&req, &resp);
        Recv.on_backend_response(&req, &resp, CacheSettings::default());
        Recv.on_deliver(&req, &resp);
        assert_eq!(default_hooks(), ["on-deliver", "on-backend-response"]);
        reset();
        assert!(default_hooks().is_empty());
    }
}
