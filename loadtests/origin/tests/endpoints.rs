//! End-to-end checks of every endpoint against the real binary.
//!
//! Run: `cargo test -p inlay-origin`

mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::BodyExt;
use support::{Generated, Origin, empty, full, pattern};

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

#[test]
fn prints_one_listening_line_and_exits_cleanly_on_signals() {
    for signal in ["-TERM", "-INT"] {
        let mut origin = Origin::start();
        assert!(
            origin.base.starts_with("http://127.0.0.1:"),
            "{}",
            origin.base
        );
        let port: u16 = origin
            .base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        assert_ne!(port, 0);
        let status = std::process::Command::new("kill")
            .args([signal, &origin.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        let exit = loop {
            if let Some(exit) = origin.child.try_wait().expect("try_wait") {
                break exit;
            }
            assert!(Instant::now() < deadline, "no exit after {signal}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(exit.success(), "exit after {signal}: {exit}");
        let mut rest = String::new();
        origin
            .stdout
            .read_to_string(&mut rest)
            .expect("read stdout");
        assert_eq!(rest, "", "nothing printed after the listening line");
    }
}

#[tokio::test]
async fn sigterm_with_a_hanging_request_exits_after_a_short_grace() {
    let mut origin = Origin::start();
    let pending = origin.send_raw(origin.get_req("/hang").body(empty()).expect("req"));
    // Let the request reach the origin before signalling.
    let early = tokio::time::timeout(Duration::from_millis(300), pending).await;
    assert!(early.is_err(), "/hang answered early");
    assert_eq!(origin.count("/hang").await, 1);
    let start = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &origin.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let exit = loop {
        if let Some(exit) = origin.child.try_wait().expect("try_wait") {
            break exit;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn static_objects_are_cacheable_pattern_bytes() {
    let origin = Origin::start();
    let r = origin.get("/static/177").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, pattern(177));
    assert_eq!(r.header("content-length"), "177");
    assert_eq!(r.header("cache-control"), "public, max-age=3600");
    assert_eq!(r.header("etag"), "\"static-177\"");
    assert_eq!(r.header("content-type"), "application/octet-stream");

    // Larger than one static frame: streamed, still with a Content-Length.
    let n = 3 * 1024 * 1024 + 5;
    let r = origin.get(&format!("/static/{n}")).await;
    assert_eq!(r.header("content-length"), n.to_string());
    assert_eq!(r.body, pattern(n));

    let r = origin
        .send(
            origin
                .get_req("/static/177")
                .header("if-none-match", "\"static-177\"")
                .body(empty())
                .expect("req"),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), "\"static-177\"");
    assert_eq!(r.header("cache-control"), "public, max-age=3600");

    assert_eq!(
        origin
            .get(&format!("/static/{}", 64 * 1024 * 1024 + 1))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        origin.get("/static/abc").await.status,
        StatusCode::BAD_REQUEST
    );

    let head = origin
        .send(
            Request::head(origin.url("/static/100"))
                .body(empty())
                .expect("req"),
        )
        .await;
    assert_eq!(head.header("content-length"), "100");
    assert!(head.body.is_empty());
}

#[tokio::test]
async fn bytes_sends_content_length_unless_cl_0() {
    let origin = Origin::start();
    let r = origin.get("/bytes/1000").await;
    assert_eq!(r.body, pattern(1000));
    assert_eq!(r.header("content-length"), "1000");
    assert_eq!(r.header("transfer-encoding"), "");

    let r = origin.get("/bytes/1000?cl=0").await;
    assert_eq!(r.body, pattern(1000));
    assert_eq!(r.header("content-length"), "");
    assert_eq!(r.header("transfer-encoding"), "chunked");

    let r = origin.get("/bytes/0").await;
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-length"), "0");

    for bad in [
        "/bytes/-1",
        "/bytes/1?chunk=0",
        "/bytes/1?delay_ms=x",
        "/bytes/1?cl=maybe",
    ] {
        let r = origin.get(bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(!r.body.is_empty(), "{bad} says why");
    }
}

#[tokio::test]
async fn bytes_delay_holds_the_headers() {
    let origin = Origin::start();
    let start = Instant::now();
    let resp = origin
        .send_raw(
            origin
                .get_req("/bytes/10?delay_ms=300")
                .body(empty())
                .expect("req"),
        )
        .await;
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn bytes_chunks_stream_before_the_body_is_complete() {
    let origin = Origin::start();
    let start = Instant::now();
    let resp = origin
        .send_raw(
            origin
                .get_req("/bytes/50?chunk=10&chunk_delay_ms=300")
                .body(empty())
                .expect("req"),
        )
        .await;
    assert_eq!(resp.headers()["content-length"], "50");
    let mut body = resp.into_body();
    let first = body
        .frame()
        .await
        .expect("a frame")
        .expect("ok")
        .into_data()
        .expect("data");
    let first_at = start.elapsed();
    assert_eq!(&first[..], b"abcdefghij");
    let mut all = first.to_vec();
    while let Some(frame) = body.frame().await {
        all.extend_from_slice(&frame.expect("ok").into_data().unwrap_or_default());
    }
    let total = start.elapsed();
    assert_eq!(all, pattern(50));
    assert!(
        total >= Duration::from_millis(1200),
        "4 pauses of 300 ms, took {total:?}"
    );
    // Relative, so a loaded machine cannot fail it: had the origin buffered
    // the body, the first chunk would arrive with the last.
    assert!(
        total - first_at >= Duration::from_millis(900),
        "first chunk at {first_at:?}, body done at {total:?}"
    );
}

#[tokio::test]
async fn query_knobs_set_headers_and_status() {
    let origin = Origin::start();
    let r = origin
        .get(
            "/resp?status=203&cc=max-age%3D5%2C%20public&sc=max-age%3D30&sk=a%20b&etag=v1&lm=0\
             &vary=Accept-Encoding&expires=Thu,%2001%20Jan%201970%2000:00:00%20GMT\
             &set_cookie=a%3D1&set_cookie=b%3D2&ct=text/x-test&h=X-One:1&h=X-One:2&h=Via:%201.1%20up",
        )
        .await;
    assert_eq!(r.status, StatusCode::NON_AUTHORITATIVE_INFORMATION);
    assert_eq!(r.text(), "ok\n");
    assert_eq!(r.header("cache-control"), "max-age=5, public");
    assert_eq!(r.header("surrogate-control"), "max-age=30");
    assert_eq!(r.header("surrogate-key"), "a b");
    assert_eq!(r.header("etag"), "\"v1\"");
    assert_eq!(r.header("last-modified"), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(r.header("vary"), "Accept-Encoding");
    assert_eq!(r.header("expires"), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(r.header_all("set-cookie"), ["a=1", "b=2"]);
    assert_eq!(r.header("content-type"), "text/x-test");
    assert_eq!(r.header_all("x-one"), ["1", "2"]);
    assert_eq!(r.header("via"), "1.1 up");

    let r = origin.get("/resp?body=hello%20world&status=404").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.text(), "hello world");

    // Knobs work on every endpoint, not only /resp.
    let r = origin.get("/bytes/3?cc=no-cache&h=X-Test:yes").await;
    assert_eq!(r.header("cache-control"), "no-cache");
    assert_eq!(r.header("x-test"), "yes");

    for bad in [
        "/resp?status=1000",
        "/resp?status=42",
        "/resp?h=nocolon",
        "/resp?h=bad%20name:1",
        "/resp?cc=%0Aa",
    ] {
        assert_eq!(
            origin.get(bad).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
}

#[tokio::test]
async fn conditional_requests_get_304_with_validators() {
    let origin = Origin::start();
    let path = "/resp?etag=v7&cc=max-age%3D60&lm=784111777";
    let cond = |name: &str, value: &str| {
        origin
            .get_req(path)
            .header(name, value)
            .body(empty())
            .expect("req")
    };
    let r = origin.send(cond("if-none-match", "\"v6\", \"v7\"")).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), "\"v7\"");
    assert_eq!(r.header("cache-control"), "max-age=60");
    assert_eq!(r.header("last-modified"), "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(r.header("content-type"), "");

    assert_eq!(
        origin.send(cond("if-none-match", "\"v6\"")).await.status,
        StatusCode::OK
    );
    let r = origin
        .send(cond("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    let r = origin
        .send(cond("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT"))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "ok\n");

    // No validator configured: never 304.
    let r = origin
        .send(
            origin
                .get_req("/resp")
                .header("if-none-match", "*")
                .body(empty())
                .expect("req"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn esi_page_and_fragments() {
    let origin = Origin::start();
    let r = origin
        .get("/esi/page?n=3&delay_ms=20&delays=200,0&cacheable=0")
        .await;
    assert_eq!(r.header("surrogate-control"), "content=\"ESI/1.0\"");
    assert_eq!(r.header("cache-control"), "no-store, private");
    let html = r.text();
    let srcs: Vec<&str> = html
        .match_indices("<esi:include src=\"")
        .map(|(i, m)| {
            let rest = &html[i + m.len()..];
            &rest[..rest.find('"').expect("closing quote")]
        })
        .collect();
    assert_eq!(
        srcs,
        [
            "/esi/fragment/0?delay_ms=200&nested=0&cacheable=0",
            "/esi/fragment/1?delay_ms=0&nested=0&cacheable=0",
            "/esi/fragment/2?delay_ms=20&nested=0&cacheable=0",
        ]
    );

    // Fetching the includes as an ESI processor would: they finish out of order.
    let start = Instant::now();
    let slow = origin.get(srcs[0]).await;
    let slow_took = start.elapsed();
    let start = Instant::now();
    let fast = origin.get(srcs[1]).await;
    let fast_took = start.elapsed();
    assert!(slow_took >= Duration::from_millis(200), "{slow_took:?}");
    assert!(fast_took < slow_took, "{fast_took:?} vs {slow_took:?}");
    assert_eq!(
        slow.text(),
        "<div class=\"fragment\" data-id=\"0\">fragment 0</div>\n"
    );
    assert_eq!(fast.header("cache-control"), "no-store, private");
    assert_eq!(fast.header("surrogate-control"), "");

    let nested = origin.get("/esi/fragment/5?nested=1&cacheable=1").await;
    assert_eq!(nested.header("cache-control"), "max-age=60");
    assert_eq!(nested.header("surrogate-control"), "content=\"ESI/1.0\"");
    assert!(
        nested
            .text()
            .contains("<esi:include src=\"/esi/fragment/5.0?delay_ms=0&nested=0&cacheable=1\"/>")
    );
    let leaf = origin.get("/esi/fragment/5.0?nested=0").await;
    assert!(leaf.text().contains("fragment 5.0"));

    let failing = origin.get("/esi/page?n=2&fail=1").await.text();
    assert!(failing.contains("/esi/fragment/1?delay_ms=0&nested=0&cacheable=1&status=500"));
    assert_eq!(
        origin.get("/esi/fragment/1?status=500").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );

    // The page's own delay is page_delay_ms; delay_ms is the fragments'.
    let start = Instant::now();
    origin.get("/esi/page?n=1&delay_ms=5000").await;
    assert!(start.elapsed() < Duration::from_millis(2000));
    let start = Instant::now();
    origin.get("/esi/page?n=1&page_delay_ms=250").await;
    assert!(start.elapsed() >= Duration::from_millis(250));

    let jittered = origin
        .get("/esi/fragment/2?delay_ms=0&jitter_ms=400&n=2")
        .await;
    assert_eq!(jittered.status, StatusCode::OK);
    assert_eq!(
        origin.get("/esi/fragment/..%2Fx").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn gzip_on_any_endpoint() {
    let origin = Origin::start();
    let r = origin.get("/gzip/resp?body=hello").await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&r.body), b"hello");

    let r = origin.get("/resp?gzip=1").await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&r.body), b"ok\n");

    let page = origin.get("/gzip/esi/page?n=2").await;
    assert_eq!(page.header("content-encoding"), "gzip");
    assert_eq!(page.header("surrogate-control"), "content=\"ESI/1.0\"");
    let plain = origin.get("/esi/page?n=2").await;
    assert_eq!(gunzip(&page.body), plain.body);

    // Streamed bodies are gzipped frame by frame.
    let r = origin.get("/bytes/300000?gzip=1").await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert!(r.body.len() < 300000 / 10);
    assert_eq!(gunzip(&r.body), pattern(300000));
    let r = origin
        .get("/bytes/100?gzip=1&chunk=7&chunk_delay_ms=1")
        .await;
    assert_eq!(gunzip(&r.body), pattern(100));

    let r = origin.get("/resp").await;
    assert_eq!(r.header("content-encoding"), "");
}

#[tokio::test]
async fn counters_count_paths_and_reset() {
    let origin = Origin::start();
    origin.get("/resp?x=1").await;
    origin.get("/resp?x=2").await;
    origin.get("/static/3").await;
    origin.get("/nope").await;
    assert_eq!(origin.count("/resp").await, 2);
    assert_eq!(origin.count("/static/3").await, 1);
    assert_eq!(origin.count("/never").await, 0);
    let counts = origin.get("/__counts").await.json();
    assert_eq!(
        counts,
        serde_json::json!({"/resp": 2, "/static/3": 1, "/nope": 1})
    );

    let r = origin
        .send(
            Request::post(origin.url("/__reset"))
                .body(empty())
                .expect("req"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.get("/__counts").await.json(), serde_json::json!({}));
    origin.get("/__reset").await;
    assert_eq!(origin.get("/__count").await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn not_found_is_404_and_counted() {
    let origin = Origin::start();
    let r = origin.get("/no/such/thing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(origin.count("/no/such/thing").await, 1);
}

#[tokio::test]
async fn echo_reports_the_request() {
    let origin = Origin::start();
    let req = Request::builder()
        .method(Method::PATCH)
        .uri(origin.url("/echo?a=1&b=two"))
        .header("x-forwarded-for", "10.0.0.1")
        .header("via", "1.1 inlay")
        .header("x-multi", "1")
        .header("x-multi", "2")
        .body(full("twelve bytes"))
        .expect("req");
    let echo = origin.send(req).await.json();
    assert_eq!(echo["method"], "PATCH");
    assert_eq!(echo["path"], "/echo");
    assert_eq!(echo["query"], "a=1&b=two");
    assert_eq!(echo["body_len"], 12);
    assert_eq!(echo["version"], "HTTP/1.1");
    let headers: Vec<(String, String)> = echo["headers"]
        .as_array()
        .expect("headers list")
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap_or("").to_string(),
                pair[1].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let has = |n: &str, v: &str| headers.iter().any(|(hn, hv)| hn == n && hv == v);
    assert!(has("x-forwarded-for", "10.0.0.1"), "{headers:?}");
    assert!(has("via", "1.1 inlay"));
    assert!(has("x-multi", "1") && has("x-multi", "2"));
    assert!(headers.iter().any(|(n, _)| n == "host"));

    let echo = origin.get("/echo").await.json();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["query"], serde_json::Value::Null);
    assert_eq!(echo["body_len"], 0);
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn upload_streams_and_checksums_large_bodies() {
    let origin = Origin::start();
    let frame: Bytes = (0..64 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let body = Generated {
        left: 96 * 1024 * 1024 + 123,
        frame,
    };
    let (left, crc) = (body.left, body.crc32());
    let req = Request::put(origin.url("/upload"))
        .body(body.map_err(|e| e).boxed())
        .expect("req");
    let r = origin.send(req).await;
    assert_eq!(r.status, StatusCode::OK);
    let json = r.json();
    assert_eq!(json["bytes"], left);
    assert_eq!(json["crc32"], crc);
    // Had the origin kept the body, its peak memory would exceed 96 MiB.
    let peak = peak_rss_kib(origin.child.id());
    assert!(peak < 48 * 1024, "origin peak RSS {peak} KiB");

    let r = origin
        .send(
            Request::post(origin.url("/upload"))
                .body(full("abc"))
                .expect("req"),
        )
        .await;
    assert_eq!(
        r.json(),
        serde_json::json!({"bytes": 3, "crc32": crc32fast::hash(b"abc")})
    );
    let r = origin.get("/upload").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.header("allow"), "POST, PUT");
}

#[tokio::test]
async fn hang_never_answers_within_its_cap() {
    let origin = Origin::start();
    let pending = origin.send_raw(origin.get_req("/hang").body(empty()).expect("req"));
    assert!(
        tokio::time::timeout(Duration::from_millis(800), pending)
            .await
            .is_err()
    );
    let start = Instant::now();
    let r = origin.get("/hang?max_ms=300").await;
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.text(), "hang over\n");
    assert_eq!(origin.count("/hang").await, 2);
}

#[tokio::test]
async fn slow_body_sends_headers_then_stalls() {
    let origin = Origin::start();
    let start = Instant::now();
    let resp = origin
        .send_raw(
            origin
                .get_req("/slow-body?n=100&first=10&after_ms=600")
                .body(empty())
                .expect("req"),
        )
        .await;
    let headers_at = start.elapsed();
    assert_eq!(resp.headers()["content-length"], "100");
    let mut body = resp.into_body();
    let first = body
        .frame()
        .await
        .expect("frame")
        .expect("ok")
        .into_data()
        .expect("data");
    assert_eq!(&first[..], b"abcdefghij");
    let first_at = start.elapsed();
    let mut all = first.to_vec();
    while let Some(frame) = body.frame().await {
        all.extend_from_slice(&frame.expect("ok").into_data().unwrap_or_default());
    }
    assert_eq!(all, pattern(100));
    let total = start.elapsed();
    assert!(total >= Duration::from_millis(600), "{total:?}");
    // Headers and the first bytes come before the stall, not after it.
    assert!(
        total - headers_at >= Duration::from_millis(500),
        "headers at {headers_at:?}, body done at {total:?}"
    );
    assert!(
        total - first_at >= Duration::from_millis(500),
        "first bytes at {first_at:?}, body done at {total:?}"
    );
}

#[tokio::test]
async fn dynamic_is_slow_and_uncacheable() {
    let origin = Origin::start();
    let start = Instant::now();
    let a = origin.get("/dynamic").await;
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(a.header("cache-control"), "no-store");
    let b = origin.get("/dynamic?delay_ms=0&size=4096").await;
    assert_ne!(a.body, b.body, "each render differs");
    assert_eq!(b.body.len(), 4096);
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let origin = Origin::start();
    let r = origin
        .send_h2(origin.get_req("/static/177").body(empty()).expect("req"))
        .await;
    assert_eq!(r.version, Version::HTTP_2);
    assert_eq!(r.body, pattern(177));
    assert_eq!(r.header("etag"), "\"static-177\"");

    // Many concurrent streams on one connection, each delayed.
    let start = Instant::now();
    let replies = futures_join(&origin, 50).await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == StatusCode::OK && r.version == Version::HTTP_2)
    );
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "streams ran concurrently: {:?}",
        start.elapsed()
    );

    let echo = origin
        .send_h2(origin.get_req("/echo").body(empty()).expect("req"))
        .await
        .json();
    assert_eq!(echo["version"], "HTTP/2.0");
}

async fn futures_join(origin: &Origin, n: usize) -> Vec<support::Reply> {
    let requests = (0..n).map(|i| {
        let req = origin
            .get_req(&format!("/bytes/{i}?delay_ms=200"))
            .body(empty());
        origin.send_h2(req.expect("req"))
    });
    futures_util::future::join_all(requests).await
}

#[tokio::test]
async fn keep_alive_serves_many_requests_on_one_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::start();
    let addr = origin.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let expected_tail = "\r\n\r\nabcde";
    for round in 0..3 {
        conn.write_all(b"GET /static/5 HTTP/1.1\r\nHost: origin\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).ends_with(expected_tail) {
            let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
                .await
                .expect("response in time")
                .expect("read");
            assert!(n > 0, "connection closed after {round} responses");
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            !text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    assert_eq!(origin.count("/static/5").await, 3);
}
