//! The cache, in process against the test origin: freshness rules, Vary,
//! coalescing, grace, stale-if-error, revalidation, Range, purge.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin, get, request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        // `max-age=0` is stored for grace: the second request may be
        // served stale while a background refresh goes to the origin, so
        // wait (bounded) for that refresh before counting.
        let path = format!("/bytes/{n}");
        for _ in 0..100 {
            if origin.count(&path).await >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(origin.count(&path).await, 2, "{q} must not be cached");
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
    // Served from the object being stored: a hit, with its Age.
    assert!(resp.headers().contains_key("age"), "{:?}", resp.headers());
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
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("between_bytes_timeout = \"1s\"")
        .start_in_process()
        .await;
    // 1000 bytes, then a stall longer than between_bytes_timeout.
    let url = inlay.url("/slow-body?n=20000&first=1000&after_ms=3000&cc=max-age%3D60");
    let fetch = |url: String| async move { whole_body(&url).await.map(|b| b.len()) };
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
async fn a_body_without_length_that_outgrows_max_object_size_reaches_every_joined_request_whole() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\nmax_object_size = \"10000\"")
        .start_in_process()
        .await;
    // No Content-Length: 1000 bytes, a stall, then 19000 more, past the
    // 10000 an object may have; the joined requests join during the stall.
    let url = inlay.url("/slow-body?n=20000&first=1000&after_ms=1500&cl=0&cc=max-age%3D60");
    let fetch = |url: String| async move { whole_body(&url).await };
    let first = tokio::spawn(fetch(url.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joined: Vec<_> = (0..3).map(|_| tokio::spawn(fetch(url.clone()))).collect();
    let first = first.await.unwrap().expect("the first request was cut");
    assert_eq!(first.len(), 20000);
    for j in joined {
        let body = j.await.unwrap().expect("a joined request was cut");
        assert_eq!(body, first);
    }
    assert_eq!(origin.count("/slow-body").await, 1);
    // Not stored: the next request fetches again.
    assert_eq!(fetch(url).await.unwrap().len(), 20000);
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
async fn a_request_after_a_response_stale_on_arrival_is_not_served_from_its_fill() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Two hours old on arrival, fresh for one: never fresh. Its body stalls,
    // so it is still being stored when the second request comes.
    // The second request is sent once the first's head has come back, so
    // it comes after the response did (one that waited while the response
    // was fetched shares it, whatever its age: collapsed forwarding).
    let path = "/slow-body?n=5000&first=1000&after_ms=1000&cc=max-age%3D3600&h=Age:7200";
    let mut first = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    let host = inlay.addr;
    let ask = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    first.write_all(ask.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), first.read(&mut buf))
            .await
            .expect("the first response's head within 10 s")
            .unwrap();
        assert!(n > 0, "the first response ended before its head");
        got.extend_from_slice(&buf[..n]);
    }
    let second = get(&inlay.url(path)).await;
    assert_eq!(second.body.len(), 5000);
    first.read_to_end(&mut got).await.unwrap();
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(got.len() - head_end, 5000, "the first response's body");
    assert_eq!(
        origin.count("/slow-body").await,
        2,
        "a response stale on arrival was served from its fill as a hit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_requests_that_join_a_fetch_get_their_part_as_the_body_comes() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // 1000 bytes, a stall while the range requests join, then the rest.
    let path = "/slow-body?n=20000&first=1000&after_ms=1000&cc=max-age%3D60";
    let first = tokio::spawn(get_url(inlay.url(path)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ranged = |range: &'static str| {
        let url = inlay.url(path);
        tokio::spawn(async move { request("GET", &url, &[("range", range)], Bytes::new()).await })
    };
    let (inside, tail, across, beyond) = (
        ranged("bytes=10-19"),
        ranged("bytes=-5"),
        ranged("bytes=900-15099"),
        ranged("bytes=20000-"),
    );
    let full = first.await.unwrap().body;
    assert_eq!(full.len(), 20000);
    let r = inside.await.unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/20000"));
    assert_eq!(r.body, full.slice(10..20));
    let r = tail.await.unwrap();
    assert_eq!((r.status, r.body.clone()), (206, full.slice(19995..)));
    let r = across.await.unwrap();
    assert_eq!(r.header("content-range"), Some("bytes 900-15099/20000"));
    assert_eq!(r.body, full.slice(900..15100));
    assert_eq!(beyond.await.unwrap().status, 416);
    // They all joined the one fetch.
    assert_eq!(origin.count("/slow-body").await, 1);

    // Without a declared length the part cannot be cut before the end: the
    // whole body (RFC 9110 lets a server ignore Range).
    let path = "/slow-body?n=3000&first=1000&after_ms=1000&cl=0&cc=max-age%3D60";
    let first = tokio::spawn(get_url(inlay.url(path)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = request(
        "GET",
        &inlay.url(path),
        &[("range", "bytes=10-19")],
        Bytes::new(),
    )
    .await;
    assert_eq!((r.status, r.body.len()), (200, 3000));
    assert_eq!(first.await.unwrap().body, r.body);
}

/// The body of a GET of `url`, or the error that cut it (where `get`
/// would panic).
async fn whole_body(url: &str) -> Result<Bytes, hyper::Error> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(url)
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    resp.into_body().collect().await.map(|b| b.to_bytes())
}

async fn get_url(url: String) -> common::Reply {
    get(&url).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ban_method_bans_older_matching_objects() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let json = inlay.url("/bytes/101?cc=max-age%3D60&ct=application%2Fjson");
    let html = inlay.url("/bytes/102?cc=max-age%3D60&ct=text%2Fhtml");
    get(&json).await;
    get(&html).await;
    let ban = "req.url ~ ^/bytes/10 && obj.http.content-type ~ json";
    let r = request("BAN", &inlay.url("/"), &[("ban", ban)], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"id\":1"), "{}", r.text());
    get(&json).await;
    get(&html).await;
    assert_eq!(origin.count("/bytes/101").await, 2, "banned: fetched again");
    assert_eq!(
        origin.count("/bytes/102").await,
        1,
        "not json: still cached"
    );
    // The object cached after the ban is not covered by it.
    get(&json).await;
    assert_eq!(origin.count("/bytes/101").await, 2);

    let r = request(
        "BAN",
        &inlay.url("/"),
        &[("ban", "req.url = /x")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("at byte 8"), "{}", r.text());
    let r = request("BAN", &inlay.url("/"), &[], Bytes::new()).await;
    assert_eq!(r.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ban_is_refused_from_other_addresses() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\npurge_allow = [\"10.0.0.0/8\"]")
        .start_in_process()
        .await;
    let url = inlay.url("/bytes/103?cc=max-age%3D60");
    get(&url).await;
    let r = request("BAN", &url, &[("ban", "req.url ~ .")], Bytes::new()).await;
    assert_eq!(r.status, 405);
    get(&url).await;
    assert_eq!(origin.count("/bytes/103").await, 1, "still cached");
}

async fn post(inlay: &Harness, path: &str) -> common::Reply {
    request("POST", &inlay.url(path), &[], Bytes::from_static(b"x")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_methods_invalidate_the_url_and_same_host_locations() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let fresh = |n: u32| format!("/bytes/{n}?cc=max-age%3D60");
    for n in 41..=45 {
        twice(&inlay, &fresh(n)).await;
        assert_eq!(origin.count(&format!("/bytes/{n}")).await, 1, "{n} cached");
    }
    // POST, PUT, DELETE and unknown methods to the URL itself.
    for (method, n) in [("POST", 41), ("PUT", 42), ("M-SEARCH", 43)] {
        let r = request(method, &inlay.url(&fresh(n)), &[], Bytes::new()).await;
        assert_eq!(r.status, 200, "{method}");
        get(&inlay.url(&fresh(n))).await;
        assert_eq!(
            origin.count(&format!("/bytes/{n}")).await,
            3,
            "{method} invalidated /bytes/{n}"
        );
    }
    // Location on our host is invalidated; another host's is not ours to drop.
    assert_eq!(
        post(
            &inlay,
            "/bytes/50?h=Location:/bytes/44%3Fcc%3Dmax-age%253D60"
        )
        .await
        .status,
        200
    );
    post(
        &inlay,
        "/bytes/51?h=Content-Location:http://elsewhere.example/bytes/45%3Fcc%3Dmax-age%253D60",
    )
    .await;
    // An error response invalidates nothing.
    post(
        &inlay,
        "/bytes/52?status=500&h=Content-Location:/bytes/45%3Fcc%3Dmax-age%253D60",
    )
    .await;
    for n in [44, 45] {
        get(&inlay.url(&fresh(n))).await;
    }
    assert_eq!(origin.count("/bytes/44").await, 2, "Location invalidated");
    assert_eq!(origin.count("/bytes/45").await, 1, "still cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_client_evicts_with_delete_or_an_unknown_method_unless_turned_off() {
    let origin = Origin::start();
    let fresh = |n: u32| format!("/bytes/{n}?cc=max-age%3D60");
    // RFC 9111 4.4, the default: `Purge` is not PURGE (methods are
    // case-sensitive) but an unknown method, so it evicts as DELETE does,
    // from any address.
    let rfc = Harness::builder().backend(&origin).start_in_process().await;
    for (method, n) in [("DELETE", 61), ("FOO", 62), ("Purge", 63)] {
        twice(&rfc, &fresh(n)).await;
        let r = request(method, &rfc.url(&fresh(n)), &[], Bytes::new()).await;
        assert_eq!(r.status, 200, "{method}: {}", r.text());
        get(&rfc.url(&fresh(n))).await;
        assert_eq!(
            origin.count(&format!("/bytes/{n}")).await,
            3,
            "{method} evicts by default"
        );
    }
    // Turned off: the same requests reach the origin and evict nothing.
    let off = Harness::builder()
        .backend(&origin)
        .toml("[cache]\ninvalidate_on_unsafe = false")
        .start_in_process()
        .await;
    for (method, n) in [("DELETE", 64), ("FOO", 65), ("Purge", 66), ("POST", 67)] {
        twice(&off, &fresh(n)).await;
        let r = request(method, &off.url(&fresh(n)), &[], Bytes::new()).await;
        assert_eq!(r.status, 200, "{method}: {}", r.text());
        get(&off.url(&fresh(n))).await;
        assert_eq!(
            origin.count(&format!("/bytes/{n}")).await,
            2,
            "{method} evicted /bytes/{n} with invalidate_on_unsafe = false"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_age_counts_and_targeted_cache_control_wins() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // An Age from upstream is part of the object's age on every hit.
    let (_, b) = twice(&inlay, "/bytes/61?cc=max-age%3D60&h=Age:30").await;
    assert!(b.header("cache-status").unwrap().contains("hit"));
    let age: u64 = b.header("age").unwrap().parse().unwrap();
    assert!((30..60).contains(&age), "Age {age}");
    // `Age: 7200, 0` is two hours old: never fresh for a max-age of an hour.
    // The second request may be served the stale object while a background
    // refresh asks the origin again (not in line with it, so wait for it).
    let (_, b) = twice(&inlay, "/bytes/62?cc=max-age%3D3600&h=Age:7200,%200").await;
    let status = b.header("cache-status").unwrap();
    assert!(
        !status.contains("hit") || status.contains("ttl=-"),
        "{status}"
    );
    let asked_again = async {
        while origin.count("/bytes/62").await < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), asked_again)
        .await
        .expect("the origin is asked again");
    // Inlay-Cache-Control and CDN-Cache-Control win over Cache-Control;
    // Inlay-Cache-Control is ours alone, CDN-Cache-Control goes on.
    let (_, b) = twice(
        &inlay,
        "/bytes/63?cc=no-store&h=Inlay-Cache-Control:max-age%3D60&h=CDN-Cache-Control:no-store",
    )
    .await;
    assert_eq!(origin.count("/bytes/63").await, 1);
    assert!(b.header("inlay-cache-control").is_none());
    assert_eq!(b.header("cdn-cache-control"), Some("no-store"));
    twice(
        &inlay,
        "/bytes/64?cc=max-age%3D60&h=CDN-Cache-Control:no-cache",
    )
    .await;
    assert_eq!(origin.count("/bytes/64").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_preferred_coding_is_a_variant_and_the_fill_asks_for_exactly_it() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // The origin varies on Accept-Encoding; `/echo` shows what it was asked.
    let url = inlay.url("/echo?cc=max-age%3D60&vary=Accept-Encoding");
    // (the client's Accept-Encoding, what the client must be served)
    let cases: [(&[&str], &str); 9] = [
        (&["br"], "br"),
        // Neither a client without Accept-Encoding nor a gzip-only one may
        // get the brotli variant.
        (&[], "identity"),
        (&["gzip"], "gzip"),
        // A browser's long list must not poison the gzip variant.
        (&["gzip, deflate, br, zstd"], "br"),
        (&["GZIP ,  x-custom"], "gzip"),
        (&["br;q=0, gzip"], "gzip"),
        (&["deflate"], "identity"),
        (&["*;q=0, identity;q=0"], "identity"),
        (&["x-a", "br"], "br"),
    ];
    for (values, want) in cases {
        let h: Vec<(&str, &str)> = values.iter().map(|v| ("accept-encoding", *v)).collect();
        let r = request("GET", &url, &h, Bytes::new()).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            common::echoed(&r, "accept-encoding").as_deref(),
            Some(want),
            "{values:?}"
        );
    }
    assert_eq!(origin.count("/echo").await, 3, "one fill per coding");
    // A pass is not cached: the origin sees the client's own list.
    let r = request(
        "POST",
        &url,
        &[("accept-encoding", "gzip, deflate, br, zstd")],
        Bytes::new(),
    )
    .await;
    assert_eq!(
        common::echoed(&r, "accept-encoding").as_deref(),
        Some("gzip, deflate, br, zstd")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_codings_decide_the_variants() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\naccept_encoding = [\"gzip\"]")
        .start_in_process()
        .await;
    let url = inlay.url("/echo?cc=max-age%3D60&vary=Accept-Encoding");
    for (ae, want) in [("br", "identity"), ("br, gzip", "gzip"), ("gzip", "gzip")] {
        let r = request("GET", &url, &[("accept-encoding", ae)], Bytes::new()).await;
        assert_eq!(common::echoed(&r, "accept-encoding").as_deref(), Some(want));
    }
    assert_eq!(origin.count("/echo").await, 2);
}

/// Fields an origin may trust to build links and redirects, none of them
/// in the key.
const UNKEYED: [(&str, &str); 7] = [
    ("x-forwarded-host", "evil.example"),
    ("x-original-url", "/admin"),
    ("x-rewrite-url", "/admin"),
    ("x-http-method-override", "DELETE"),
    ("forwarded", "host=evil.example;proto=http"),
    ("x-forwarded-proto", "http"),
    ("x-forwarded-scheme", "http"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_forwarding_fields_do_not_reach_the_origin_on_fills() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let mut sent: Vec<(&str, &str)> = UNKEYED.to_vec();
    sent.push(("x-kept", "1"));
    let r = request(
        "GET",
        &inlay.url("/echo?cc=max-age%3D60"),
        &sent,
        Bytes::new(),
    )
    .await;
    for (name, _) in UNKEYED {
        assert_eq!(common::echoed(&r, name), None, "{name} reached the origin");
    }
    assert_eq!(common::echoed(&r, "x-kept").as_deref(), Some("1"));
    assert_eq!(
        common::echoed(&r, "x-forwarded-for").as_deref(),
        Some("127.0.0.1")
    );
    // A pass is not cached: the origin sees them.
    let r = request("POST", &inlay.url("/echo"), &sent, Bytes::new()).await;
    for (name, value) in UNKEYED {
        assert_eq!(common::echoed(&r, name).as_deref(), Some(value), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripped_fields_are_configurable() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[cache]\nstrip_request_headers = [\"x-kept\"]")
        .start_in_process()
        .await;
    let mut sent: Vec<(&str, &str)> = UNKEYED.to_vec();
    sent.push(("x-kept", "1"));
    let r = request(
        "GET",
        &inlay.url("/echo?cc=max-age%3D60"),
        &sent,
        Bytes::new(),
    )
    .await;
    assert_eq!(common::echoed(&r, "x-kept"), None);
    assert_eq!(
        common::echoed(&r, "x-forwarded-host").as_deref(),
        Some("evil.example")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spelling_of_a_vary_header_does_not_make_variants() {
    // cache-tests vary-normalise-combine, -space, -lang-order, -lang-case,
    // -lang-space.
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/echo?cc=max-age%3D60&vary=Accept-Language,Foo");
    let first = request(
        "GET",
        &url,
        &[("accept-language", "en, de"), ("foo", "1, 2")],
        Bytes::new(),
    )
    .await;
    assert_eq!(first.status, 200);
    let same: [&[(&str, &str)]; 5] = [
        &[("accept-language", "de, en"), ("foo", "1,2")],
        &[("accept-language", "eN, De"), ("foo", " 1, 2 ")],
        &[
            ("accept-language", " en ,   de"),
            ("foo", "1"),
            ("foo", "2"),
        ],
        &[
            ("accept-language", "en"),
            ("accept-language", "de"),
            ("foo", "1 ,2"),
        ],
        &[("accept-language", "DE,EN"), ("foo", "1,,2")],
    ];
    for headers in same {
        let r = request("GET", &url, headers, Bytes::new()).await;
        assert!(
            r.header("cache-status").unwrap().contains("hit"),
            "{headers:?}: {:?}",
            r.headers
        );
        assert_eq!(r.body, first.body, "{headers:?}");
    }
    assert_eq!(origin.count("/echo").await, 1);
    // Different values are still different variants.
    request(
        "GET",
        &url,
        &[("accept-language", "en, fr"), ("foo", "1, 2")],
        Bytes::new(),
    )
    .await;
    request(
        "GET",
        &url,
        &[("accept-language", "en, de"), ("foo", "2, 1")],
        Bytes::new(),
    )
    .await;
    assert_eq!(origin.count("/echo").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_joined_to_a_fill_gets_its_304() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // The first bytes, then the origin stalls for 3 s before the rest.
    let url =
        inlay.url("/slow-body?n=20000&first=1000&after_ms=3000&cc=max-age%3D60&h=ETag:%22v1%22");
    let first = {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Joined while the body is still coming: the validator matches.
    let r = request("GET", &url, &[("if-none-match", "\"v1\"")], Bytes::new()).await;
    assert_eq!(r.status, 304, "{:?}", r.headers);
    assert!(r.body.is_empty());
    assert!(r.header("cache-status").unwrap().contains("hit"));
    // A validator that does not match gets the whole body.
    let r = request("GET", &url, &[("if-none-match", "\"v0\"")], Bytes::new()).await;
    assert_eq!((r.status, r.body.len()), (200, 20000));
    assert_eq!(first.await.unwrap().body.len(), 20000);
    assert_eq!(origin.count("/slow-body").await, 1);
}
