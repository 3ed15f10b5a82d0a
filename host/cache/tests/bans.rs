//! Bans through the cache's public API: what a ban removes at lookup, what
//! it leaves, the lurker shrinking the list, a 304 that must not bring a
//! banned object back, and bans surviving a kill -9 of a process that
//! holds the disk tier.
//!
//! Run: `cargo test -p inlay-cache --test bans`

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use inlay_cache::{
    BanError, BanLurker, CacheFetch, CacheRules, CacheStore, Defaults, Fetched, HttpCache, Lookup,
    MAX_BAN_EXPRESSION_LEN, PrimaryKey, object_meta,
};
use inlay_core::{CacheSettings, CacheStatus, ProxyBody, body};
use inlay_storage::{MemoryStore, StoreConfig, TieredStore};

fn rules() -> CacheRules {
    CacheRules {
        defaults: Defaults {
            ttl: Duration::from_secs(120),
            grace: Duration::from_secs(10),
            keep: Duration::ZERO,
        },
        max_object_size: 1 << 20,
        accept_encoding: Default::default(),
        ban_memory: inlay_cache::DEFAULT_BAN_MEMORY,
        compression: None,
    }
}

/// A cache without the background lurker: tests walk with `lurk()`.
fn quiet(cache: HttpCache) -> HttpCache {
    cache.set_ban_lurker(BanLurker {
        enabled: false,
        ..BanLurker::default()
    });
    cache
}

fn memory_cache() -> HttpCache {
    let store = Arc::new(MemoryStore::new(64 << 20, 1 << 20));
    quiet(HttpCache::new(CacheStore::from_store(store), rules()))
}

fn disk_config(dir: &Path) -> StoreConfig {
    StoreConfig {
        dir: Some(dir.to_path_buf()),
        memory_bytes: 8 << 20,
        disk_bytes: 64 << 20,
        flush_every_ms: 10_000,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    }
}

fn disk_cache(dir: &Path) -> HttpCache {
    let store = Arc::new(TieredStore::open(disk_config(dir)).expect("open"));
    quiet(HttpCache::new(CacheStore::from_store(store), rules()))
}

fn key(path: &str) -> PrimaryKey {
    PrimaryKey::new("example.com", path, &[])
}

fn response(status: u16, headers: &[(&str, &str)], text: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = StatusCode::from_u16(status).expect("status");
    for (name, value) in headers {
        resp.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    resp
}

/// Stores a fresh object for `primary` (status, headers, body).
async fn put(cache: &HttpCache, primary: &PrimaryKey, status: u16, headers: &[(&str, &str)]) {
    put_for(
        cache,
        primary,
        status,
        headers,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
}

async fn put_for(
    cache: &HttpCache,
    primary: &PrimaryKey,
    status: u16,
    headers: &[(&str, &str)],
    ttl: Duration,
    keep: Duration,
) {
    let resp = response(status, headers, "");
    let settings = CacheSettings {
        cacheable: true,
        ttl,
        grace: Duration::ZERO,
        keep,
        surrogate_keys: Vec::new(),
        esi: false,
    };
    let meta = object_meta(status, resp.headers(), &settings);
    cache
        .insert(primary, &HeaderMap::new(), meta, Bytes::from_static(b"old"))
        .await
        .expect("insert");
}

async fn is_hit(cache: &HttpCache, primary: &PrimaryKey) -> bool {
    matches!(
        cache.lookup(primary, &HeaderMap::new()).await,
        Lookup::Fresh(_)
    )
}

fn fetch_of(lookup: Lookup) -> CacheFetch {
    match lookup {
        Lookup::Fetch(fetch) => fetch,
        Lookup::Fresh(_) => panic!("expected a fetch, got a fresh hit"),
        Lookup::Stale { .. } => panic!("expected a fetch, got a stale hit"),
        Lookup::Joined(_) => panic!("expected a fetch, got a fill to join"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_ban_removes_older_matching_objects_and_leaves_the_rest() {
    let cache = memory_cache();
    let json = [("content-type", "application/json")];
    let html = [("content-type", "text/html")];
    put(&cache, &key("/products/1"), 200, &json).await;
    put(&cache, &key("/products/2"), 200, &html).await;
    put(&cache, &key("/about"), 200, &json).await;
    let info = cache
        .ban("req.url ~ ^/products/ && obj.http.content-type ~ json")
        .await
        .expect("ban");
    assert_eq!(info.id, 1);
    assert_eq!(cache.bans(), vec![info]);

    assert!(!is_hit(&cache, &key("/products/1")).await, "banned: a miss");
    assert!(is_hit(&cache, &key("/products/2")).await, "not json: a hit");
    assert!(is_hit(&cache, &key("/about")).await, "other URL: a hit");
    assert_eq!(
        cache.ban_stats().removed_at_lookup.load(Ordering::Relaxed),
        1
    );
    // Removed, not only hidden.
    assert!(
        cache
            .get_fresh(&key("/products/1"), &HeaderMap::new())
            .is_none()
    );

    // An object cached after the ban is not covered by it, even within
    // the same millisecond.
    put(&cache, &key("/products/1"), 200, &json).await;
    assert!(is_hit(&cache, &key("/products/1")).await);
}

#[tokio::test(flavor = "current_thread")]
async fn bans_on_status_host_and_stored_fields() {
    let cache = memory_cache();
    put(&cache, &key("/a"), 404, &[]).await;
    put(
        &cache,
        &key("/b"),
        200,
        &[("x-tag", "red"), ("x-tag", "blue")],
    )
    .await;
    put(&cache, &key("/c"), 200, &[("x-tag", "green")]).await;
    let other = PrimaryKey::new("other.example", "/a", &[]);
    put(&cache, &other, 200, &[]).await;

    cache.ban("obj.status == 404").await.expect("ban");
    assert!(!is_hit(&cache, &key("/a")).await);
    assert!(is_hit(&cache, &key("/b")).await);

    cache.ban("obj.http.x-tag == blue").await.expect("ban");
    assert!(
        !is_hit(&cache, &key("/b")).await,
        "one of its fields matches"
    );
    assert!(is_hit(&cache, &key("/c")).await);

    cache
        .ban("req.http.host == OTHER.example")
        .await
        .expect("ban");
    assert!(!is_hit(&cache, &other).await);
    assert!(is_hit(&cache, &key("/c")).await);
}

#[tokio::test(flavor = "current_thread")]
async fn the_lurker_removes_banned_objects_and_the_list_shrinks() {
    let cache = memory_cache();
    for i in 0..250 {
        let ct = if i % 5 == 0 {
            "application/json"
        } else {
            "text/html"
        };
        put(
            &cache,
            &key(&format!("/p/{i}")),
            200,
            &[("content-type", ct)],
        )
        .await;
    }
    // A Vary'd object: its variants header is walked past, not tested.
    put(
        &cache,
        &key("/p/vary"),
        200,
        &[
            ("content-type", "application/json"),
            ("vary", "accept-language"),
        ],
    )
    .await;
    cache
        .ban("req.url ~ ^/p/ && obj.http.content-type ~ json")
        .await
        .expect("ban");
    cache.ban("req.url == /p/1").await.expect("ban");
    assert_eq!(cache.bans().len(), 2);

    let report = cache.lurk().await.expect("walk");
    assert_eq!(report.checked, 251);
    assert_eq!(report.removed, 52, "51 json objects and /p/1");
    assert_eq!(report.dropped, vec![1, 2]);
    assert!(cache.bans().is_empty(), "every older object was tested");
    let counts = cache.ban_counts();
    assert_eq!(
        (
            counts.active,
            counts.added,
            counts.dropped,
            counts.lurker_walks
        ),
        (0, 2, 2, 1)
    );
    let stats = cache.ban_stats();
    assert_eq!(stats.removed_by_lurker.load(Ordering::Relaxed), 52);
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 2);
    // Removed without a lookup, and the others stay hits.
    assert!(cache.get_fresh(&key("/p/0"), &HeaderMap::new()).is_none());
    assert!(cache.get_fresh(&key("/p/1"), &HeaderMap::new()).is_none());
    assert!(is_hit(&cache, &key("/p/2")).await);
    assert_eq!(
        cache.ban_stats().removed_at_lookup.load(Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_background_lurker_empties_the_list_on_its_own() {
    let store = Arc::new(MemoryStore::new(64 << 20, 1 << 20));
    let cache = HttpCache::new(CacheStore::from_store(store), rules());
    cache.set_ban_lurker(BanLurker {
        enabled: true,
        batch: 7,
        pause: Duration::from_millis(1),
        between_walks: Duration::from_millis(1),
    });
    for i in 0..20 {
        put(&cache, &key(&format!("/bg/{i}")), 200, &[]).await;
    }
    cache.ban("req.url ~ ^/bg/1").await.expect("ban");
    for _ in 0..500 {
        if cache.bans().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(cache.bans().is_empty(), "the lurker dropped the ban");
    // /bg/1 and /bg/10../bg/19
    assert_eq!(
        cache.ban_stats().removed_by_lurker.load(Ordering::Relaxed),
        11
    );
    assert!(is_hit(&cache, &key("/bg/2")).await);
}

/// A fill whose response arrived before a ban may be stored after the
/// lurker walked past its key: the ban must outlive that fill.
#[tokio::test(flavor = "current_thread")]
async fn a_ban_outlives_the_fills_that_started_before_it() {
    let cache = memory_cache();
    let primary = key("/slow");
    let fetch = fetch_of(cache.lookup(&primary, &HeaderMap::new()).await);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(data)),
            rx,
        ))
    });
    let mut resp = Response::new(body::boxed(http_body_util::StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=60"),
    );
    let Fetched::New(new) = fetch.on_response(Ok(resp)).await.expect("answer") else {
        panic!("a new response");
    };
    let settings = new.defaults().clone();
    let (client, _) = new.store(&settings);
    let reader =
        tokio::spawn(async move { client.into_body().collect().await.map(|b| b.to_bytes()) });

    cache.ban("req.url == /slow").await.expect("ban");
    let report = cache.lurk().await.expect("walk");
    assert!(
        report.dropped.is_empty(),
        "a fill older than the ban is open"
    );
    assert_eq!(cache.bans().len(), 1);

    tx.send(Bytes::from_static(b"body")).await.expect("send");
    drop(tx);
    reader.await.expect("join").expect("body");
    // Wait for the fill to store it, then: it is older than the ban.
    for _ in 0..200 {
        if cache.ban_stats().removed_at_lookup.load(Ordering::Relaxed) > 0 {
            break;
        }
        assert!(!is_hit(&cache, &primary).await, "a banned fill was served");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        cache.ban_stats().removed_at_lookup.load(Ordering::Relaxed),
        1
    );
    // Now nothing older is left: the next walk drops it.
    assert_eq!(cache.lurk().await.expect("walk").dropped, vec![1]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_304_does_not_bring_a_banned_object_back() {
    let cache = memory_cache();
    let primary = key("/etag");
    // Expired, kept for revalidation, with a validator.
    put_for(
        &cache,
        &primary,
        200,
        &[("etag", "\"v1\"")],
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    cache.ban("req.url == /etag").await.expect("ban");
    let fetch = fetch_of(cache.lookup(&primary, &HeaderMap::new()).await);
    assert!(
        fetch.validators().is_empty(),
        "the banned object is not revalidated"
    );
    // Even an origin that answers 304 gets nothing revalidated.
    match fetch
        .on_response(Ok(response(304, &[("cache-control", "max-age=60")], "")))
        .await
        .expect("answer")
    {
        Fetched::Cached { status, .. } => panic!("served from the cache: {status:?}"),
        Fetched::New(_) => {}
    }
    assert!(!is_hit(&cache, &primary).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_refreshed_object_keeps_its_age_for_bans() {
    let cache = memory_cache();
    let primary = key("/refreshed");
    put_for(
        &cache,
        &primary,
        200,
        &[("etag", "\"v1\"")],
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let fetch = fetch_of(cache.lookup(&primary, &HeaderMap::new()).await);
    cache.ban("req.url == /refreshed").await.expect("ban");
    // The ban arrived while the revalidation was in flight; the 304 it
    // gets must not make the object newer than the ban.
    let Fetched::Cached { status, .. } = fetch
        .on_response(Ok(response(304, &[("cache-control", "max-age=60")], "")))
        .await
        .expect("answer")
    else {
        panic!("a 304");
    };
    assert_eq!(status, CacheStatus::Revalidated);
    assert!(
        !is_hit(&cache, &primary).await,
        "refreshed, but still banned"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn bad_and_oversized_bans_are_refused() {
    let cache = memory_cache();
    let err = cache.ban("req.url = /x").await.expect_err("bad operator");
    assert!(matches!(err, BanError::Syntax { pos: 8, .. }), "{err}");
    assert_eq!(cache.ban("").await.expect_err("empty"), BanError::Empty);
    let long = format!("req.url == /{}", "x".repeat(MAX_BAN_EXPRESSION_LEN));
    assert!(matches!(
        cache.ban(&long).await.expect_err("long"),
        BanError::TooLong { .. }
    ));
    assert!(cache.bans().is_empty(), "nothing refused is in effect");
}

/// The heavy ban: 16 conditions each just under the regex size
/// limit; `n` makes each ban's text its own.
fn heavy_ban(n: usize) -> String {
    (0..16)
        .map(|i| format!("obj.http.x-{n}-{i} ~ \"[a-z0-9_]{{737}}I\""))
        .collect::<Vec<_>>()
        .join(" && ")
}

#[tokio::test(flavor = "current_thread")]
async fn the_memory_of_live_bans_is_bounded_and_comes_back_when_they_go() {
    let cache = memory_cache();
    let budget = inlay_cache::DEFAULT_BAN_MEMORY;
    // 300 of these took a process from 23 to 260 MB: the budget refuses
    // one long before.
    let mut added = 0;
    let refusal = loop {
        assert!(added < 300, "300 heavy bans accepted");
        match cache.ban(&heavy_ban(added)).await {
            Ok(_) => added += 1,
            Err(e) => break e,
        }
    };
    let BanError::OverBudget {
        used,
        needed,
        limit,
    } = refusal
    else {
        panic!("{refusal}")
    };
    assert_eq!(limit, budget);
    assert!(used <= budget && used + needed > budget, "{refusal}");
    // Each such ban counts its compiled regexes, over a MiB.
    assert!(needed > 1 << 20, "{refusal}");
    assert!(added >= 16, "only {added} bans fit");
    let message = refusal.to_string();
    assert!(message.contains("cache.ban_memory"), "{message}");
    let counts = cache.ban_counts();
    assert_eq!(counts.active, added as u64);
    assert_eq!(counts.memory, used as u64);
    assert_eq!(cache.bans().len(), added, "nothing refused is in effect");
    // Refused on the cluster's path too.
    assert!(matches!(
        cache.ban_local(&heavy_ban(1000)).await,
        Err(BanError::OverBudget { .. })
    ));
    // A cheap ban still fits; once the lurker drops the bans, their
    // memory is free again.
    cache
        .ban("req.url == /cheap")
        .await
        .expect("a cheap ban fits");
    cache.lurk().await.unwrap();
    assert_eq!(cache.ban_counts().memory, 0);
    cache.ban(&heavy_ban(2000)).await.expect("room again");
    // A smaller budget refuses sooner.
    let small = cache.with_rules(CacheRules {
        ban_memory: 1 << 20,
        ..rules()
    });
    assert!(matches!(
        small.ban(&heavy_ban(3000)).await,
        Err(BanError::OverBudget { limit, .. }) if limit == 1 << 20
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_url_keeps_its_full_key_so_the_lurker_can_test_it() {
    let cache = memory_cache();
    let long = format!("/long/{}", "a".repeat(3000));
    put(&cache, &key(&long), 200, &[]).await;
    put(
        &cache,
        &key(&format!("/other/{}", "a".repeat(3000))),
        200,
        &[],
    )
    .await;
    cache.ban("req.url ~ ^/long/").await.expect("ban");
    let report = cache.lurk().await.expect("walk");
    assert_eq!((report.checked, report.removed), (2, 1));
    assert!(!is_hit(&cache, &key(&long)).await);
}

#[tokio::test(flavor = "current_thread")]
async fn bans_persist_across_a_reopen_and_the_dropped_ones_do_not() {
    let dir = tempfile::tempdir().expect("dir");
    {
        let cache = disk_cache(dir.path());
        put(&cache, &key("/kept"), 200, &[]).await;
        put(&cache, &key("/gone"), 200, &[]).await;
        cache.ban("req.url == /gone").await.expect("ban");
        cache.store().flush().await.expect("flush");
    }
    {
        let cache = disk_cache(dir.path());
        assert_eq!(cache.bans().len(), 1);
        assert!(!is_hit(&cache, &key("/gone")).await);
        assert!(is_hit(&cache, &key("/kept")).await);
        assert_eq!(cache.lurk().await.expect("walk").dropped, vec![1]);
        cache.store().flush().await.expect("flush");
    }
    let cache = disk_cache(dir.path());
    assert!(cache.bans().is_empty());
    let next = cache.ban("obj.status == 500").await.expect("ban");
    assert!(next.id >= 1);
}

// ---- kill -9 ----------------------------------------------------------

/// Set in the child: the cache directory.
const DIR_ENV: &str = "INLAY_CACHE_BAN_CRASH_DIR";

/// The child: caches objects, flushes them, bans some, says so, and waits
/// to be killed (no destructor, no flush after the ban).
#[test]
#[ignore = "child process of the kill -9 test"]
fn ban_crash_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cache = disk_cache(Path::new(&dir));
        for i in 0..20 {
            put(&cache, &key(&format!("/item/{i}")), 200, &[]).await;
        }
        cache.store().flush().await.expect("flush");
        cache.ban("req.url ~ ^/item/1").await.expect("ban");
        let mut out = std::io::stdout().lock();
        writeln!(out, "BANNED").expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
}

fn wait_for(child: &mut Child, marker: &str) {
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains(marker) => {
                std::thread::spawn(move || for _ in lines {});
                return;
            }
            Some(Ok(_)) => {}
            other => {
                let status = child.wait();
                panic!("child ended before {marker:?}: {other:?}, {status:?}");
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_ban_survives_kill_9() {
    let dir = tempfile::tempdir().expect("dir");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "ban_crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    wait_for(&mut child, "BANNED");
    // std's kill is SIGKILL on Unix.
    child.kill().expect("kill");
    child.wait().expect("wait");

    let cache = disk_cache(dir.path());
    assert_eq!(
        cache.bans().len(),
        1,
        "the ban was on disk when ban() returned"
    );
    for i in 0..20 {
        let hit = is_hit(&cache, &key(&format!("/item/{i}"))).await;
        let banned = i == 1 || i >= 10;
        assert_eq!(hit, !banned, "/item/{i}");
    }
}

/// A reload that moves the cache to another directory: the bans made on
/// the old store stay in effect on the new one, with their times, so an
/// object the new store held from before a ban stays banned, and a
/// restart on the new directory still has them.
#[tokio::test(flavor = "current_thread")]
async fn bans_follow_the_cache_to_another_store() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        // The second directory holds /old/a, /old/b and a ban of its own
        // on /mine (made after both).
        let there = disk_cache(two.path());
        put(&there, &key("/old/a"), 200, &[]).await;
        put(&there, &key("/old/b"), 200, &[]).await;
        put(&there, &key("/mine"), 200, &[]).await;
        there.ban("req.url == /mine").await.expect("ban");
    }
    let here = disk_cache(one.path());
    here.ban("req.url == /old/a").await.expect("ban");
    here.ban("req.url == /elsewhere").await.expect("ban");
    let ours = here.bans();
    let store = Arc::new(TieredStore::open(disk_config(two.path())).expect("open"));
    let moved = quiet(
        here.with_store(CacheStore::from_store(store), rules())
            .expect("moved"),
    );
    // Both stores' bans, oldest first, numbered after every id used.
    let bans = moved.bans();
    let exprs: Vec<&str> = bans.iter().map(|b| b.expression.as_str()).collect();
    assert_eq!(
        exprs,
        [
            "req.url == /mine",
            "req.url == /old/a",
            "req.url == /elsewhere"
        ]
    );
    assert_eq!(
        bans.iter().map(|b| b.id).collect::<Vec<_>>(),
        [3, 4, 5],
        "{bans:?}"
    );
    assert_eq!(bans[1].created_ms, ours[0].created_ms, "the time is kept");
    assert_eq!(moved.ban_counts().added, 2, "the counts go on");
    assert!(
        !is_hit(&moved, &key("/old/a")).await,
        "banned before the move"
    );
    assert!(is_hit(&moved, &key("/old/b")).await);
    assert!(!is_hit(&moved, &key("/mine")).await);
    // Stored after the bans: not covered.
    put(&moved, &key("/elsewhere"), 200, &[]).await;
    assert!(is_hit(&moved, &key("/elsewhere")).await);
    drop(moved);
    // A restart on the new directory reads the same bans back.
    let again = disk_cache(two.path());
    assert_eq!(again.bans(), bans);
}

#[tokio::test(flavor = "current_thread")]
async fn bans_moved_to_a_store_without_bans_keep_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let here = memory_cache();
    here.ban("req.url == /a").await.expect("ban");
    here.ban("req.url == /b").await.expect("ban");
    let store = Arc::new(TieredStore::open(disk_config(dir.path())).expect("open"));
    let moved = quiet(
        here.with_store(CacheStore::from_store(store), rules())
            .expect("moved"),
    );
    assert_eq!(moved.bans(), here.bans());
    drop(moved);
    assert_eq!(disk_cache(dir.path()).bans(), here.bans());
}
