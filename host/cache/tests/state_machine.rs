//! The cache's state machine through its public API, over an in-memory
//! store: fresh and stale hits, coalesced misses, hit-for-miss,
//! revalidation, stale-if-error, Vary, purge, and every store call but the
//! memory peek made off the reactor thread.
//!
//! Run: `cargo test -p inlay-cache --test state_machine`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use inlay_cache::{
    CacheFetch, CacheRules, CacheStore, Defaults, Fetched, HttpCache, Lookup, PrimaryKey,
    object_meta,
};
use inlay_core::{CacheSettings, CacheStatus, ProxyBody, ProxyError, StaleReason, body};
use inlay_storage::{
    KvStore, MemoryStore, ObjectMeta, ObjectStore, Peek, StoreError, StoreStats, StoredObject,
};
use parking_lot::Mutex;

/// A memory store that remembers the thread of every call that may block.
struct Recording {
    inner: MemoryStore,
    threads: Mutex<Vec<(&'static str, ThreadId)>>,
    gets: AtomicUsize,
    /// When set, the next put stores its object (lookups see it), then
    /// returns only once the test sends or drops the other end.
    hold_next_put: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Recording {
    fn note(&self, call: &'static str) {
        self.threads
            .lock()
            .push((call, std::thread::current().id()));
    }
}

impl ObjectStore for Recording {
    fn peek(&self, key: &str) -> Peek {
        self.inner.peek(key)
    }
    fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        self.note("get");
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key)
    }
    fn put(&self, key: &str, meta: ObjectMeta, body: Bytes) -> Result<Arc<ObjectMeta>, StoreError> {
        self.note("put");
        let stored = self.inner.put(key, meta, body);
        let hold = self.hold_next_put.lock().take();
        if let Some(release) = hold {
            let _ = release.recv();
        }
        stored
    }
    fn update_meta(&self, key: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        self.note("update_meta");
        self.inner.update_meta(key, meta)
    }
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        self.note("remove");
        self.inner.remove(key)
    }
    fn remove_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.note("remove_prefix");
        self.inner.remove_prefix(prefix)
    }
    fn soft_purge_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.note("soft_purge_prefix");
        self.inner.soft_purge_prefix(prefix)
    }
    fn keys_for_surrogate(&self, skey: &str) -> Result<Vec<String>, StoreError> {
        self.note("keys_for_surrogate");
        self.inner.keys_for_surrogate(skey)
    }
    fn purge_surrogate(&self, skey: &str, soft: bool) -> Result<u64, StoreError> {
        self.note("purge_surrogate");
        self.inner.purge_surrogate(skey, soft)
    }
    fn sweep_expired(&self, now_ms: u64) -> Result<u64, StoreError> {
        self.note("sweep_expired");
        self.inner.sweep_expired(now_ms)
    }
    fn scan_meta(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Arc<ObjectMeta>)>, StoreError> {
        self.note("scan_meta");
        self.inner.scan_meta(after, limit)
    }
    fn max_object_bytes(&self) -> u64 {
        self.inner.max_object_bytes()
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.note("flush");
        self.inner.flush()
    }
}

impl KvStore for Recording {
    fn kv_get(&self, ns: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        self.note("kv_get");
        self.inner.kv_get(ns, key)
    }
    fn kv_set(&self, ns: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.note("kv_set");
        self.inner.kv_set(ns, key, value)
    }
    fn kv_delete(&self, ns: &str, key: &str) -> Result<bool, StoreError> {
        self.note("kv_delete");
        self.inner.kv_delete(ns, key)
    }
}

struct Fixture {
    cache: HttpCache,
    store: Arc<Recording>,
}

fn fixture() -> Fixture {
    fixture_with_kv(1 << 20)
}

/// A fixture whose kv records may take `kv_bytes` together.
fn fixture_with_kv(kv_bytes: u64) -> Fixture {
    let store = Arc::new(Recording {
        inner: MemoryStore::new(64 << 20, kv_bytes),
        threads: Mutex::new(Vec::new()),
        gets: AtomicUsize::new(0),
        hold_next_put: Mutex::new(None),
    });
    let rules = CacheRules {
        defaults: Defaults {
            ttl: Duration::from_secs(120),
            grace: Duration::from_secs(10),
            keep: Duration::ZERO,
        },
        max_object_size: 1 << 20,
        accept_encoding: Default::default(),
        ban_memory: inlay_cache::DEFAULT_BAN_MEMORY,
        compression: None,
    };
    let cache = HttpCache::new(CacheStore::from_store(store.clone()), rules);
    Fixture { cache, store }
}

fn key(path: &str) -> PrimaryKey {
    PrimaryKey::new("example.com", path, &[])
}

fn response(status: u16, headers: &[(&str, &str)], body_text: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(body::full(body_text));
    *resp.status_mut() = StatusCode::from_u16(status).expect("status");
    for (name, value) in headers {
        resp.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    resp
}

async fn read(resp: Response<ProxyBody>) -> Bytes {
    resp.into_body().collect().await.expect("body").to_bytes()
}

fn fetch_of(lookup: Lookup) -> CacheFetch {
    match lookup {
        Lookup::Fetch(fetch) => fetch,
        Lookup::Fresh(_) => panic!("expected a fetch, got a fresh hit"),
        Lookup::Stale { .. } => panic!("expected a fetch, got a stale hit"),
        Lookup::Joined(_) => panic!("expected a fetch, got a fill to join"),
    }
}

/// Answers a fetch with `resp` and the host's default settings; returns
/// the body the client got and how it was served.
async fn answer(fetch: CacheFetch, resp: Response<ProxyBody>) -> (Bytes, CacheStatus) {
    match fetch.on_response(Ok(resp)).await.expect("answered") {
        Fetched::New(new) => {
            let settings = new.defaults().clone();
            let (resp, status) = new.store(&settings);
            (read(resp).await, status)
        }
        Fetched::Cached { object, status } => (object.body, status),
    }
}

/// Waits until the fill task has stored `primary` (it stores after the
/// client has read the body).
async fn fresh_soon(cache: &HttpCache, primary: &PrimaryKey) -> StoredObject {
    for _ in 0..200 {
        if let Some(obj) = cache.get(primary, &HeaderMap::new()).await
            && obj.meta.is_fresh(inlay_storage::now_ms())
        {
            return obj;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{} was never stored", primary.as_str());
}

/// Stores an object as if it had been stored `age` ago with `ttl`, `grace`
/// and `keep`.
async fn store_aged(
    cache: &HttpCache,
    primary: &PrimaryKey,
    age: Duration,
    ttl: Duration,
    grace: Duration,
    keep: Duration,
    headers: &[(&str, &str)],
) {
    let resp = response(200, headers, "");
    let settings = CacheSettings {
        cacheable: true,
        ttl,
        grace,
        keep,
        surrogate_keys: vec!["k".into()],
        esi: false,
    };
    let mut meta = object_meta(200, resp.headers(), &settings);
    meta.stored_at_ms -= u64::try_from(age.as_millis()).expect("small");
    cache
        .insert(primary, &HeaderMap::new(), meta, Bytes::from_static(b"old"))
        .await
        .expect("insert");
}

#[tokio::test(flavor = "current_thread")]
async fn a_miss_is_stored_while_it_streams_and_then_hits() {
    let f = fixture();
    let primary = key("/a");
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    assert!(!fetch.is_hit_for_miss());
    assert!(fetch.validators().is_empty());
    let (body, status) = answer(
        fetch,
        response(200, &[("cache-control", "max-age=60")], "hello"),
    )
    .await;
    assert_eq!(body, "hello");
    assert_eq!(status, CacheStatus::Miss { stored: true });
    fresh_soon(&f.cache, &primary).await;
    match f.cache.lookup(&primary, &HeaderMap::new()).await {
        Lookup::Fresh(obj) => {
            assert_eq!(obj.body, "hello");
            let status = inlay_cache::fresh_status(&obj, inlay_storage::now_ms());
            assert!(
                matches!(status, CacheStatus::Hit { ttl_left } if (58..=60).contains(&ttl_left))
            );
        }
        _ => panic!("expected a fresh hit"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_misses_wait_for_one_fetch() {
    let f = fixture();
    let primary = key("/coalesced");
    let first = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let cache = f.cache.clone();
            let primary = primary.clone();
            tokio::spawn(async move {
                match cache.lookup(&primary, &HeaderMap::new()).await {
                    Lookup::Fresh(obj) => obj.body,
                    Lookup::Joined(joined) => read(joined.into_response()).await,
                    _ => Bytes::from_static(b"fetched again"),
                }
            })
        })
        .collect();
    // Let every waiter reach the flight before the fetch ends.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (body, _) = answer(
        first,
        response(200, &[("cache-control", "max-age=60")], "once"),
    )
    .await;
    assert_eq!(body, "once");
    for waiter in waiters {
        assert_eq!(waiter.await.expect("joined"), "once");
    }
}

/// A config reload makes a cache with new rules over the same state: a
/// request on the new rules joins the fetch a request on the old rules
/// started, finds what the old one stored, and sees its hit-for-miss marks.
#[tokio::test(flavor = "current_thread")]
async fn a_cache_with_new_rules_shares_flights_objects_and_marks() {
    let f = fixture();
    let mut rules = f.cache.rules().clone();
    rules.defaults.ttl = Duration::from_secs(5);
    let reloaded = f.cache.with_rules(rules);
    assert_eq!(reloaded.rules().defaults.ttl, Duration::from_secs(5));
    assert_eq!(f.cache.rules().defaults.ttl, Duration::from_secs(120));

    let primary = key("/across-reload");
    let first = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    let waiter = {
        let cache = reloaded.clone();
        let primary = primary.clone();
        tokio::spawn(async move {
            match cache.lookup(&primary, &HeaderMap::new()).await {
                Lookup::Joined(joined) => read(joined.into_response()).await,
                Lookup::Fresh(obj) => obj.body,
                _ => Bytes::from_static(b"fetched again"),
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (body, _) = answer(
        first,
        response(200, &[("cache-control", "max-age=60")], "once"),
    )
    .await;
    assert_eq!(body, "once");
    assert_eq!(waiter.await.expect("joined"), "once");
    assert_eq!(fresh_soon(&reloaded, &primary).await.body, "once");

    let private = key("/private-across-reload");
    reloaded.mark_hit_for_miss(&private, Duration::from_secs(60));
    assert!(fetch_of(f.cache.lookup(&private, &HeaderMap::new()).await).is_hit_for_miss());
}

#[tokio::test(flavor = "current_thread")]
async fn an_uncacheable_response_makes_its_key_hit_for_miss() {
    let f = fixture();
    let primary = key("/private");
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    let (_, status) = answer(
        fetch,
        response(200, &[("cache-control", "private")], "mine"),
    )
    .await;
    assert_eq!(status, CacheStatus::Miss { stored: false });
    // No flight is held any more, and the next request does not wait.
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    assert!(fetch.is_hit_for_miss());
    let (_, status) = answer(
        fetch,
        response(200, &[("cache-control", "private")], "mine"),
    )
    .await;
    assert_eq!(status, CacheStatus::HitForMiss { stored: false });
    // A purge forgets the mark.
    f.cache.purge_url(&primary, false).await.expect("purge");
    assert!(!fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await).is_hit_for_miss());
}

#[tokio::test(flavor = "current_thread")]
async fn a_stale_object_in_grace_is_served_and_refreshed_by_one_request() {
    let f = fixture();
    let primary = key("/grace");
    let s = Duration::from_secs;
    store_aged(&f.cache, &primary, s(5), s(1), s(60), s(0), &[]).await;
    let Lookup::Stale { object, refresh } = f.cache.lookup(&primary, &HeaderMap::new()).await
    else {
        panic!("expected a stale hit");
    };
    assert_eq!(object.body, "old");
    let status = inlay_cache::stale_status(&object, inlay_storage::now_ms(), StaleReason::Grace);
    assert!(
        matches!(status, CacheStatus::Stale { stale_for: 4, .. }),
        "{status:?}"
    );
    let refresh = refresh.expect("the first stale hit refreshes");
    // While it refreshes, other requests get the stale object and no refresh.
    let Lookup::Stale { refresh: none, .. } = f.cache.lookup(&primary, &HeaderMap::new()).await
    else {
        panic!("expected a stale hit");
    };
    assert!(none.is_none());
    answer(
        refresh,
        response(200, &[("cache-control", "max-age=60")], "new"),
    )
    .await;
    assert_eq!(fresh_soon(&f.cache, &primary).await.body, "new");
}

#[tokio::test(flavor = "current_thread")]
async fn a_response_stale_on_arrival_is_refreshed_by_the_next_request_even_before_its_fill_ends() {
    let f = fixture();
    let primary = key("/stale-on-arrival");
    let (release, held) = std::sync::mpsc::channel();
    *f.store.hold_next_put.lock() = Some(held);
    // max-age=0: stale at once, kept for the default grace. The client has
    // the whole body before the fill task stores it, and the fill's flight
    // ends only after the store returns, which the store holds here.
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    let (body, _) = answer(fetch, response(200, &[("cache-control", "max-age=0")], "a")).await;
    assert_eq!(body, "a");
    let mut stored = false;
    for _ in 0..400 {
        if f.cache.get(&primary, &HeaderMap::new()).await.is_some() {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(stored, "the fill stored the object");
    // The next request finds it stored while the flight is still held: it
    // must not be served stale with nobody refreshing it.
    let (cache, again) = (f.cache.clone(), primary.clone());
    let next = tokio::spawn(async move { cache.lookup(&again, &HeaderMap::new()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    release.send(()).expect("the put is held");
    match next.await.expect("lookup") {
        Lookup::Stale { object, refresh } => {
            assert_eq!(object.body, "a");
            assert!(refresh.is_some(), "a stale hit that nobody refreshes");
        }
        Lookup::Fetch(_) => panic!("the object is in its grace"),
        Lookup::Fresh(_) => panic!("a response stale on arrival is not fresh"),
        Lookup::Joined(_) => panic!("a response stale on arrival was joined"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_304_revalidates_the_expired_object() {
    let f = fixture();
    let primary = key("/etag");
    let s = Duration::from_secs;
    store_aged(
        &f.cache,
        &primary,
        s(100),
        s(1),
        s(0),
        s(3600),
        &[("etag", "\"v1\"")],
    )
    .await;
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    assert_eq!(
        fetch
            .validators()
            .get(header::IF_NONE_MATCH)
            .expect("validator"),
        "\"v1\""
    );
    let (body, status) = answer(
        fetch,
        response(304, &[("cache-control", "max-age=60"), ("x-new", "1")], ""),
    )
    .await;
    assert_eq!(
        (body.as_ref(), status),
        (&b"old"[..], CacheStatus::Revalidated)
    );
    let Lookup::Fresh(obj) = f.cache.lookup(&primary, &HeaderMap::new()).await else {
        panic!("expected a fresh hit after the 304");
    };
    assert_eq!(obj.body, "old");
    assert_eq!(obj.meta.header("x-new"), Some(&b"1"[..]));
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_backend_serves_the_expired_object_within_keep_only() {
    let f = fixture();
    let s = Duration::from_secs;
    let kept = key("/kept");
    store_aged(&f.cache, &kept, s(100), s(1), s(0), s(3600), &[]).await;
    let fetch = fetch_of(f.cache.lookup(&kept, &HeaderMap::new()).await);
    let down = ProxyError::BackendDown {
        backend: "origin".into(),
        reason: "refused".into(),
    };
    match fetch.on_response(Err(down)).await {
        Ok(Fetched::Cached { object, status }) => {
            assert_eq!(object.body, "old");
            assert!(matches!(
                status,
                CacheStatus::Stale {
                    reason: StaleReason::StaleIfError,
                    ..
                }
            ));
        }
        _ => panic!("expected the kept object"),
    }
    // A 5xx counts as a failure too.
    let fetch = fetch_of(f.cache.lookup(&kept, &HeaderMap::new()).await);
    let (body, _) = answer(fetch, response(503, &[], "down")).await;
    assert_eq!(body, "old");

    let gone = key("/gone");
    store_aged(&f.cache, &gone, s(100), s(1), s(0), s(1), &[]).await;
    let fetch = fetch_of(f.cache.lookup(&gone, &HeaderMap::new()).await);
    let down = ProxyError::BackendDown {
        backend: "origin".into(),
        reason: "refused".into(),
    };
    assert!(fetch.on_response(Err(down)).await.is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn vary_selects_a_variant_and_a_purge_removes_them_all() {
    let f = fixture();
    let primary = key("/lang");
    let mut en = HeaderMap::new();
    en.insert("accept-language", HeaderValue::from_static("en"));
    let mut fr = HeaderMap::new();
    fr.insert("accept-language", HeaderValue::from_static("fr"));
    for (headers, text) in [(&en, "hello"), (&fr, "bonjour")] {
        let fetch = fetch_of(f.cache.lookup(&primary, headers).await);
        let resp = response(
            200,
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
            text,
        );
        answer(fetch, resp).await;
        for _ in 0..200 {
            if f.cache.get(&primary, headers).await.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for (headers, text) in [(&en, "hello"), (&fr, "bonjour")] {
        match f.cache.lookup(&primary, headers).await {
            Lookup::Fresh(obj) => assert_eq!(obj.body, text),
            _ => panic!("expected the {text} variant"),
        }
    }
    // The count is of responses: the variants header is not one.
    assert_eq!(f.cache.purge_url(&primary, false).await.expect("purge"), 2);
    assert!(f.cache.get(&primary, &en).await.is_none());
    assert!(f.cache.get(&primary, &fr).await.is_none());
    // Nothing of the URL is left behind, not even its Vary names.
    assert_eq!(f.store.stats().memory_objects, 0);
}

/// Inserts a response for `primary` that varies on Accept-Language, as
/// the request with `lang` selects it.
async fn insert_varied(cache: &HttpCache, primary: &PrimaryKey, lang: &'static str) {
    let resp = response(
        200,
        &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
        "",
    );
    let settings = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        grace: Duration::ZERO,
        keep: Duration::ZERO,
        surrogate_keys: Vec::new(),
        esi: false,
    };
    let meta = object_meta(200, resp.headers(), &settings);
    let mut headers = HeaderMap::new();
    headers.insert("accept-language", HeaderValue::from_static(lang));
    cache
        .insert(primary, &headers, meta, Bytes::from_static(lang.as_bytes()))
        .await
        .expect("insert");
}

#[tokio::test(flavor = "current_thread")]
async fn many_varied_urls_all_cache_and_use_no_kv_quota() {
    // 16 KiB of kv: the old Vary index (one kv record per URL) was full
    // after about 200 URLs, and every later Vary'd response failed to store.
    let f = fixture_with_kv(16 << 10);
    let mut en = HeaderMap::new();
    en.insert("accept-language", HeaderValue::from_static("en"));
    for i in 0..1_000 {
        insert_varied(&f.cache, &key(&format!("/v?q={i}")), "en").await;
    }
    for i in (0..1_000).step_by(97) {
        match f.cache.lookup(&key(&format!("/v?q={i}")), &en).await {
            Lookup::Fresh(obj) => assert_eq!(obj.body, "en"),
            _ => panic!("/v?q={i} is not cached"),
        }
    }
    assert_eq!(f.store.stats().kv_bytes, 0);
    // The policies' kv budget is whole.
    f.cache
        .store()
        .kv_set("policy".into(), "k".into(), vec![0; 8 << 10])
        .await
        .expect("policy kv has its quota");
}

#[tokio::test(flavor = "current_thread")]
async fn a_varied_url_longer_than_a_kib_caches() {
    let f = fixture();
    let primary = key(&format!("/long?{}", "q".repeat(4000)));
    insert_varied(&f.cache, &primary, "en").await;
    insert_varied(&f.cache, &primary, "fr").await;
    let mut fr = HeaderMap::new();
    fr.insert("accept-language", HeaderValue::from_static("fr"));
    match f.cache.lookup(&primary, &fr).await {
        Lookup::Fresh(obj) => assert_eq!(obj.body, "fr"),
        _ => panic!("a long Vary'd URL is not cached"),
    }
    // And a fresh variant is found in memory without I/O too.
    assert!(f.cache.get_fresh(&primary, &fr).is_some());
}

#[tokio::test(flavor = "current_thread")]
async fn a_url_that_stops_varying_is_served_without_vary() {
    let f = fixture();
    let primary = key("/changes");
    insert_varied(&f.cache, &primary, "en").await;
    let s = Duration::from_secs;
    store_aged(&f.cache, &primary, s(0), s(60), s(0), s(0), &[]).await;
    match f.cache.lookup(&primary, &HeaderMap::new()).await {
        Lookup::Fresh(obj) => {
            assert!(obj.meta.vary.is_empty());
            assert_eq!(obj.body, "old");
        }
        _ => panic!("expected the response without Vary"),
    }
    // And back to varying.
    insert_varied(&f.cache, &primary, "en").await;
    let mut en = HeaderMap::new();
    en.insert("accept-language", HeaderValue::from_static("en"));
    assert!(matches!(
        f.cache.lookup(&primary, &en).await,
        Lookup::Fresh(obj) if obj.body == "en"
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn a_soft_purge_by_key_leaves_objects_stale_in_grace() {
    let f = fixture();
    let primary = key("/tagged");
    let s = Duration::from_secs;
    store_aged(&f.cache, &primary, s(0), s(60), s(60), s(0), &[]).await;
    assert_eq!(f.cache.purge_key("k", true).await.expect("purge"), 1);
    assert!(matches!(
        f.cache.lookup(&primary, &HeaderMap::new()).await,
        Lookup::Stale { .. }
    ));
    assert_eq!(f.cache.purge_key("k", false).await.expect("purge"), 1);
    assert!(matches!(
        f.cache.lookup(&primary, &HeaderMap::new()).await,
        Lookup::Fetch(_)
    ));
}

/// The reactor thread of a current-thread runtime runs the test itself:
/// no store call but `peek` may run there.
#[tokio::test(flavor = "current_thread")]
async fn no_store_call_runs_on_the_reactor_thread() {
    let f = fixture();
    let reactor = std::thread::current().id();
    let primary = key("/threads");
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    answer(
        fetch,
        response(200, &[("cache-control", "max-age=60")], "x"),
    )
    .await;
    fresh_soon(&f.cache, &primary).await;
    let gets_before = f.store.gets.load(Ordering::Relaxed);
    // A memory hit is answered by `peek`, without a thread hop.
    assert!(matches!(
        f.cache.lookup(&primary, &HeaderMap::new()).await,
        Lookup::Fresh(_)
    ));
    assert_eq!(f.store.gets.load(Ordering::Relaxed), gets_before);
    f.cache.purge_url(&primary, true).await.expect("soft purge");
    f.cache.purge_key("none", false).await.expect("purge");
    f.cache
        .store()
        .kv_set("ns".into(), "k".into(), b"v".to_vec())
        .await
        .expect("kv");
    f.cache.store().flush().await.expect("flush");
    let calls = f.store.threads.lock().clone();
    assert!(calls.iter().any(|(c, _)| *c == "put"), "{calls:?}");
    assert!(calls.iter().any(|(c, _)| *c == "kv_set"), "{calls:?}");
    let on_reactor: Vec<_> = calls.iter().filter(|(_, t)| *t == reactor).collect();
    assert!(
        on_reactor.is_empty(),
        "store calls on the reactor thread: {on_reactor:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn revalidation_directives_turn_a_failed_backend_into_an_error_not_stale() {
    let f = fixture();
    let s = Duration::from_secs;
    for cc in [
        "max-age=1, must-revalidate",
        "max-age=1, proxy-revalidate",
        "s-maxage=1",
    ] {
        let primary = key(&format!("/{cc}"));
        // Kept for an hour: revalidation may use it, a failure may not.
        store_aged(
            &f.cache,
            &primary,
            s(100),
            s(1),
            s(0),
            s(3600),
            &[("cache-control", cc), ("etag", "\"v1\"")],
        )
        .await;
        let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
        assert!(!fetch.validators().is_empty(), "{cc}: still revalidated");
        let down = ProxyError::BackendDown {
            backend: "origin".into(),
            reason: "refused".into(),
        };
        assert!(fetch.on_response(Err(down)).await.is_err(), "{cc}");
        let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
        let (body, status) = answer(fetch, response(503, &[], "down")).await;
        assert_eq!(body, "down", "{cc}");
        assert!(!matches!(status, CacheStatus::Stale { .. }), "{cc}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_age_a_response_arrives_with_counts_and_keeps_growing() {
    let f = fixture();
    let primary = key("/aged");
    let fetch = fetch_of(f.cache.lookup(&primary, &HeaderMap::new()).await);
    answer(
        fetch,
        response(200, &[("cache-control", "max-age=60"), ("age", "30")], "x"),
    )
    .await;
    let obj = fresh_soon(&f.cache, &primary).await;
    let now = inlay_storage::now_ms();
    // Delivered Age starts at the upstream Age; 30 s of freshness are left.
    assert!((30_000..35_000).contains(&obj.meta.age_ms(now)));
    let status = inlay_cache::fresh_status(&obj, now);
    assert!(matches!(status, CacheStatus::Hit { ttl_left } if (25..=30).contains(&ttl_left)));

    // `Age: 7200, 0` is two hours old: stored, but never fresh.
    let old = key("/old");
    let fetch = fetch_of(f.cache.lookup(&old, &HeaderMap::new()).await);
    answer(
        fetch,
        response(
            200,
            &[("cache-control", "max-age=3600"), ("age", "7200, 0")],
            "x",
        ),
    )
    .await;
    for _ in 0..200 {
        if f.cache.get(&old, &HeaderMap::new()).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stored = f.cache.get(&old, &HeaderMap::new()).await.expect("stored");
    assert!(!stored.meta.is_fresh(inlay_storage::now_ms()));
    assert!(stored.meta.age_ms(inlay_storage::now_ms()) >= 7_200_000);
}

#[tokio::test(flavor = "current_thread")]
async fn urls_and_variants_longer_than_the_store_allows_still_cache() {
    let f = fixture();
    // Past the store's 8 KiB key limit, with Vary and without.
    let long = key(&format!("/huge?{}", "q".repeat(20_000)));
    let other = key(&format!("/huge?{}r", "q".repeat(20_000)));
    insert_varied(&f.cache, &long, "en").await;
    let s = Duration::from_secs;
    store_aged(&f.cache, &other, s(0), s(60), s(0), s(0), &[]).await;
    let mut en = HeaderMap::new();
    en.insert("accept-language", HeaderValue::from_static("en"));
    assert!(matches!(
        f.cache.lookup(&long, &en).await,
        Lookup::Fresh(obj) if obj.body == "en"
    ));
    // Two long URLs that share their first 20,000 bytes stay apart.
    assert!(matches!(
        f.cache.lookup(&other, &HeaderMap::new()).await,
        Lookup::Fresh(obj) if obj.body == "old"
    ));
    // A long variant value (a 10 KiB Accept-Language) caches too.
    let mut big = HeaderMap::new();
    let value = HeaderValue::from_str(&"x".repeat(10_000)).expect("value");
    big.insert("accept-language", value);
    let resp = response(
        200,
        &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
        "",
    );
    let settings = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        grace: Duration::ZERO,
        keep: Duration::ZERO,
        surrogate_keys: Vec::new(),
        esi: false,
    };
    let meta = object_meta(200, resp.headers(), &settings);
    f.cache
        .insert(&long, &big, meta, Bytes::from_static(b"big"))
        .await
        .expect("a long variant stores");
    assert!(matches!(
        f.cache.lookup(&long, &big).await,
        Lookup::Fresh(obj) if obj.body == "big"
    ));
    // A purge of the long URL removes its variants, not the other URL.
    assert_eq!(f.cache.purge_url(&long, false).await.expect("purge"), 2);
    assert!(f.cache.get(&long, &en).await.is_none());
    assert!(f.cache.get(&other, &HeaderMap::new()).await.is_some());
}
