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
async fn a_client_that_reads_nothing_slows_neither_the_fill_nor_the_requests_that_join_it() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start();
    // Room for a 16 MiB object (an object may take a quarter of a shard).
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\nmemory_size = \"1GiB\"")
        .start_in_process()
        .await;
    // Far more than the socket buffers between the proxy and a client.
    let size = 16 << 20;
    let path = format!("/bytes/{size}?cc=max-age%3D60");
    let mut first = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    // The same Host as `get` sends: the same cache key.
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", inlay.addr);
    first.write_all(req.as_bytes()).await.unwrap();
    // The first client holds the fetch and reads nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = tokio::time::timeout(Duration::from_secs(30), get(&inlay.url(&path)))
        .await
        .expect("the coalesced request waited for the client that reads nothing");
    assert_eq!(second.status, 200);
    assert_eq!(second.body.len(), size);
    // Stored, though the first client has read nothing yet.
    let third = get(&inlay.url(&path)).await;
    assert!(
        third.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        third.header("cache-status")
    );
    assert_eq!(third.body.len(), size);
    assert_eq!(origin.count(&format!("/bytes/{size}")).await, 1);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_request_streams_the_body_while_it_is_being_fetched() {
    use http_body_util::BodyExt;
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // 1000 bytes, then the origin stalls for 4 s before the rest.
    let url = inlay.url("/slow-body?n=20000&first=1000&after_ms=4000&cc=max-age%3D60");
    let first = {
        let url = url.clone();
        tokio::spawn(async move {
            let r = get(&url).await;
            (r, std::time::Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(&url)
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp: http::Response<hyper::body::Incoming> = client.request(req).await.unwrap();
    let mut total = 0;
    let mut first_bytes = None;
    while let Some(frame) = resp.body_mut().frame().await {
        let n = frame.unwrap().data_ref().map_or(0, |d| d.len());
        if n > 0 && first_bytes.is_none() {
            first_bytes = Some(std::time::Instant::now());
        }
        total += n;
    }
    assert_eq!(total, 20000);
    let (first, first_done) = first.await.unwrap();
    assert_eq!(first.body.len(), 20000);
    assert!(
        first_bytes.unwrap() < first_done,
        "the coalesced request got its first bytes only after the fetch ended"
    );
    assert_eq!(origin.count("/slow-body").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_body_that_fails_midway_cuts_every_reader_and_is_not_stored() {
    use http_body_util::BodyExt;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("between_bytes_timeout = \"1s\"")
        .start_in_process()
        .await;
    // 1000 bytes, then a stall longer than between_bytes_timeout.
    let url = inlay.url("/slow-body?n=20000&first=1000&after_ms=3000&cc=max-age%3D60");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let fetch = |url: String| {
        let client = client.clone();
        async move {
            let req = http::Request::get(url)
                .body(http_body_util::Full::new(Bytes::new()))
                .unwrap();
            let resp = client.request(req).await.unwrap();
            resp.into_body().collect().await.map(|b| b.to_bytes().len())
        }
    };
    let first = tokio::spawn(fetch(url.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joined = fetch(url.clone()).await;
    assert!(
        joined.is_err(),
        "the joined request got a whole body: {joined:?}"
    );
    let first = first.await.unwrap();
    assert!(
        first.is_err(),
        "the first request got a whole body: {first:?}"
    );
    // Nothing partial was stored: the next request fetches again.
    tokio::spawn(fetch(url));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.count("/slow-body").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_request_of_another_variant_does_not_get_the_one_being_fetched() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Headers at once, then a stall: the second request comes while the
    // first variant is being filled.
    let url = inlay.url("/slow-body?n=2000&first=100&after_ms=1500&vary=x-ab&cc=max-age%3D60");
    let a = {
        let url = url.clone();
        tokio::spawn(async move { request("GET", &url, &[("x-ab", "a")], Bytes::new()).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = request("GET", &url, &[("x-ab", "b")], Bytes::new()).await;
    let a = a.await.unwrap();
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(
        origin.count("/slow-body").await,
        2,
        "variant b was served the body of variant a"
    );
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
