//! The cache, in process against the test origin: freshness rules, Vary,
//! coalescing, grace, stale-if-error, revalidation, Range, purge.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin, get, request};

async fn twice(inlay: &Harness, path: &str) -> (common::Reply, common::Reply) {
    let a = get(&inlay.url(path)).await;
    let b = get(&inlay.url(path)).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freshness_headers_decide_what_is_cached() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Cacheable: each of these is fetched once for two requests.
    let cached = [
        (1, "cc=max-age%3D60"),
        (2, "cc=s-maxage%3D60"),
        (3, "sc=max-age%3D60"),
        (4, "expires=Thu,%2001%20Jan%202099%2000:00:00%20GMT"),
        (5, ""),                           // nothing said: default_ttl
        (6, "cc=private&sc=max-age%3D60"), // Surrogate-Control speaks to us
    ];
    for (n, q) in cached {
        let path = format!("/bytes/{n}?{q}");
        let (a, b) = twice(&inlay, &path).await;
        assert_eq!((a.status, b.status), (200, 200));
        assert_eq!(
            origin.count(&format!("/bytes/{n}")).await,
            1,
            "{q} should be cached"
        );
        assert!(
            b.header("cache-status").unwrap().contains("hit"),
            "{q}: {:?}",
            b.headers
        );
        assert!(b.header("age").is_some());
        assert!(
            b.header("surrogate-control").is_none(),
            "Surrogate-Control is for the edge only"
        );
    }
    // Not cacheable: fetched every time.
    let uncached = [
        (11, "cc=no-store"),
        (12, "cc=private"),
        (13, "set_cookie=a%3Db"),
        (14, "cc=max-age%3D0"),
        (15, "status=500"),
        (16, "sc=no-store&cc=max-age%3D60"),
    ];
    for (n, q) in uncached {
        twice(&inlay, &format!("/bytes/{n}?{q}")).await;
        assert_eq!(
            origin.count(&format!("/bytes/{n}")).await,
            2,
            "{q} must not be cached"
        );
    }
    // Requests with cookies or Authorization pass, as in Varnish's built-in VCL.
    for _ in 0..2 {
        request(
            "GET",
            &inlay.url("/bytes/21?cc=max-age%3D60"),
            &[("cookie", "s=1")],
            Bytes::new(),
        )
        .await;
    }
    assert_eq!(origin.count("/bytes/21").await, 2);
    // POST passes.
    for _ in 0..2 {
        request(
            "POST",
            &inlay.url("/bytes/22?cc=max-age%3D60"),
            &[],
            Bytes::new(),
        )
        .await;
    }
    assert_eq!(origin.count("/bytes/22").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_counts_and_objects_expire() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\ndefault_grace = \"0s\"")
        .start_in_process()
        .await;
    get(&inlay.url("/bytes/31?cc=max-age%3D2")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = get(&inlay.url("/bytes/31?cc=max-age%3D2")).await;
    assert_eq!(r.header("age"), Some("1"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    get(&inlay.url("/bytes/31?cc=max-age%3D2")).await;
    assert_eq!(
        origin.count("/bytes/31").await,
        2,
        "expired object refetched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_one_variant_per_header_value() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/echo?cc=max-age%3D60&vary=X-Lang");
    for lang in ["en", "fr", "en", "fr", "de"] {
        let r = request("GET", &url, &[("x-lang", lang)], Bytes::new()).await;
        // The echoed request proves which variant was served.
        assert!(
            r.text().contains(&format!("\"{lang}\"")),
            "{lang}: {}",
            r.text()
        );
    }
    assert_eq!(origin.count("/echo").await, 3, "one fetch per variant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_varied_urls_cache() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Past the old Vary index's 1 KiB kv key, and past the store's 8 KiB key.
    for pad in [1_500, 12_000] {
        let url = inlay.url(&format!(
            "/echo?cc=max-age%3D60&vary=X-Lang&pad={}",
            "p".repeat(pad)
        ));
        for lang in ["en", "fr", "en", "fr"] {
            let r = request("GET", &url, &[("x-lang", lang)], Bytes::new()).await;
            assert_eq!(r.status, 200);
            assert!(r.text().contains(&format!("\"{lang}\"")), "{lang}");
        }
    }
    assert_eq!(
        origin.count("/echo").await,
        4,
        "one fetch per URL and variant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_misses_cost_one_origin_request() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/bytes/5000?delay_ms=500&cc=max-age%3D60");
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let u = url.clone();
        tasks.push(tokio::spawn(async move { get(&u).await }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), 5000);
    }
    assert_eq!(origin.count("/bytes/5000").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncacheable_keys_do_not_queue_behind_each_other() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Learn that the key is uncacheable (hit-for-miss) ...
    get(&inlay.url("/bytes/41?cc=no-store")).await;
    // ... then 10 concurrent slow requests run in parallel, not one after another.
    let url = inlay.url("/bytes/41?cc=no-store&delay_ms=400");
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let u = url.clone();
            tokio::spawn(async move { get(&u).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(origin.count("/bytes/41").await, 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_serves_stale_while_exactly_one_background_fetch_refreshes() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/bytes/51?cc=max-age%3D1,%20stale-while-revalidate%3D30&delay_ms=300");
    get(&url).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Stale now: 20 concurrent requests are answered at once from grace.
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let u = url.clone();
            tokio::spawn(async move { get(&u).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(
            r.header("cache-status").unwrap().contains("hit"),
            "{:?}",
            r.headers
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "grace hits must not wait for the origin"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        origin.count("/bytes/51").await,
        2,
        "exactly one background refresh"
    );
    let r = get(&url).await;
    assert!(
        r.header("cache-status").unwrap().contains("ttl="),
        "fresh again: {:?}",
        r.headers
    );
    assert!(
        !r.header("cache-status").unwrap().contains("ttl=-"),
        "fresh again: {:?}",
        r.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_the_old_object_when_the_origin_fails() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\n[cache]\ndefault_grace = \"0s\"",
            origin.url()
        ))
        .start_in_process()
        .await;
    // The query is part of the key, so the "failing" request must have the same URL:
    // a first good response, then the origin is gone.
    let r = get(&inlay.url("/bytes/61?cc=max-age%3D1,%20stale-if-error%3D60")).await;
    assert_eq!(r.status, 200);
    origin.stop().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = get(&inlay.url("/bytes/61?cc=max-age%3D1,%20stale-if-error%3D60")).await;
    assert_eq!(r.status, 200, "stale object expected, got {}", r.text());
    assert!(
        r.header("cache-status").unwrap().contains("stale-if-error"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.body.len(), 61);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_objects_are_revalidated_with_304() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\ndefault_grace = \"0s\"\ndefault_keep = \"60s\"")
        .start_in_process()
        .await;
    let url = inlay.url("/bytes/71?cc=max-age%3D1&etag=v1");
    let first = get(&url).await;
    assert_eq!(first.header("etag"), Some("\"v1\""));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, first.body);
    assert!(
        r.header("cache-status").unwrap().contains("fwd-status=304"),
        "{:?}",
        r.headers
    );
    // Refreshed: the next one is a plain hit.
    let r = get(&url).await;
    assert!(r.header("cache-status").unwrap().contains("hit"));
    assert_eq!(origin.count("/bytes/71").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_conditional_head_and_range_requests_are_answered_from_cache() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/bytes/1000?cc=max-age%3D60&etag=abc");
    get(&url).await;
    let r = request("GET", &url, &[("if-none-match", "\"abc\"")], Bytes::new()).await;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    let r = request("HEAD", &url, &[], Bytes::new()).await;
    assert_eq!((r.status, r.header("content-length")), (200, Some("1000")));
    let full = get(&url).await.body;
    let r = request("GET", &url, &[("range", "bytes=10-19")], Bytes::new()).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/1000"));
    assert_eq!(r.body, full.slice(10..20));
    let r = request("GET", &url, &[("range", "bytes=-5")], Bytes::new()).await;
    assert_eq!(r.body, full.slice(995..));
    let r = request("GET", &url, &[("range", "bytes=5000-")], Bytes::new()).await;
    assert_eq!(r.status, 416);
    assert_eq!(origin.count("/bytes/1000").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_url_by_key_and_soft() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let a = inlay.url("/bytes/81?cc=max-age%3D60&sk=product-1%20all");
    let b = inlay.url("/bytes/82?cc=max-age%3D60&sk=product-2%20all");
    get(&a).await;
    get(&b).await;
    // By URL.
    let r = request("PURGE", &a, &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"purged\":1"), "{}", r.text());
    get(&a).await;
    assert_eq!(origin.count("/bytes/81").await, 2);
    // By surrogate key: both tagged "all".
    let r = request(
        "PURGE",
        &inlay.url("/"),
        &[("surrogate-key", "all")],
        Bytes::new(),
    )
    .await;
    assert!(r.text().contains("\"purged\":2"), "{}", r.text());
    get(&a).await;
    get(&b).await;
    assert_eq!(origin.count("/bytes/81").await, 3);
    assert_eq!(origin.count("/bytes/82").await, 2);
    // Soft: the object is served stale (grace) while refreshed, not refetched in line.
    let r = request("PURGE", &b, &[("soft-purge", "1")], Bytes::new()).await;
    assert!(r.text().contains("\"soft\":true"), "{}", r.text());
    let r = get(&b).await;
    assert!(
        r.header("cache-status").unwrap().contains("ttl=-"),
        "stale after soft purge: {:?}",
        r.headers
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.count("/bytes/82").await, 3, "one background refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_refused_from_other_addresses() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\npurge_allow = [\"10.0.0.0/8\"]")
        .start_in_process()
        .await;
    get(&inlay.url("/bytes/91?cc=max-age%3D60")).await;
    let r = request(
        "PURGE",
        &inlay.url("/bytes/91?cc=max-age%3D60"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 405);
    get(&inlay.url("/bytes/91?cc=max-age%3D60")).await;
    assert_eq!(origin.count("/bytes/91").await, 1, "still cached");
}
