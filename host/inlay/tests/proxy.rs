//! The reverse proxy, through the real binary against the real test origin:
//! headers, streaming, HEAD, chunked, large bodies, failures, shutdown.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Inlay, Origin, get, raw, request};
use http_body_util::BodyExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_with_via_and_x_forwarded_for_and_drops_hop_by_hop_fields() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    let r = request(
        "GET",
        &inlay.url("/echo?x=1"),
        &[
            ("connection", "x-private"),
            ("x-private", "secret"),
            ("x-kept", "yes"),
            ("x-forwarded-for", "10.1.1.1"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("via").unwrap_or("").contains("inlay"),
        "{:?}",
        r.headers
    );
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let get_h = |n: &str| common::echoed(&r, n);
    assert_eq!(get_h("x-kept").as_deref(), Some("yes"));
    assert_eq!(
        get_h("x-private"),
        None,
        "field named in Connection must not be forwarded"
    );
    assert_eq!(
        get_h("x-forwarded-for").as_deref(),
        Some("10.1.1.1, 127.0.0.1")
    );
    assert!(get_h("via").unwrap_or_default().contains("inlay"));
    assert_eq!(
        get_h("host").as_deref(),
        Some(inlay.addr.to_string().as_str()),
        "client Host is kept"
    );
    assert_eq!(echo["query"].as_str(), Some("x=1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_host_header_override() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\nhost_header = \"www.example.com\"",
            origin.url()
        ))
        .start();
    let r = get(&inlay.url("/echo")).await;
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let host = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[0] == "host")
        .unwrap()[1]
        .clone();
    assert_eq!(host, "www.example.com");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_bytes_reach_the_client_before_the_origin_finishes() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    // 5 chunks, 300 ms apart: the whole body takes >= 1.2 s at the origin.
    let url = inlay.url("/bytes/5000?chunk=1000&chunk_delay_ms=300&cl=0");
    let started = Instant::now();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(url)
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp: http::Response<hyper::body::Incoming> = client.request(req).await.unwrap();
    let mut total = 0usize;
    let mut first = None;
    while let Some(f) = resp.body_mut().frame().await {
        let n = f.unwrap().data_ref().map(|d| d.len()).unwrap_or(0);
        if n > 0 && first.is_none() {
            first = Some(started.elapsed());
        }
        total += n;
    }
    let first = first.expect("some body data");
    let all = started.elapsed();
    assert!(total >= 5000, "got {total} bytes");
    assert!(
        all >= Duration::from_millis(1100),
        "origin is slow by design: {all:?}"
    );
    assert!(
        first < Duration::from_millis(600),
        "first bytes took {first:?} of {all:?}: not streamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_chunked_and_content_length_bodies() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    let head = request("HEAD", &inlay.url("/bytes/1234"), &[], Bytes::new()).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), Some("1234"));
    let chunked = get(&inlay.url("/bytes/100000?cl=0")).await;
    assert_eq!(chunked.body.len(), 100000);
    assert_eq!(chunked.header("content-length"), None);
    let sized = get(&inlay.url("/bytes/777")).await;
    assert_eq!(sized.header("content-length"), Some("777"));
    assert_eq!(sized.body.len(), 777);
    let no_content = get(&inlay.url("/resp?status=204")).await;
    assert_eq!(no_content.status, 204);
    assert!(no_content.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = http::Request::get(inlay.url("/bytes/10"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_body_streams_through_with_bounded_memory() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    let before = inlay.rss_kib();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(inlay.url("/bytes/1073741824?chunk=65536"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    let mut total: u64 = 0;
    let mut peak = before;
    let mut frames = 0u64;
    while let Some(f) = resp.body_mut().frame().await {
        total += f.unwrap().data_ref().map(|d| d.len() as u64).unwrap_or(0);
        frames += 1;
        if frames.is_multiple_of(2048) {
            peak = peak.max(inlay.rss_kib());
        }
    }
    assert_eq!(total, 1 << 30);
    let growth_mib = (peak.saturating_sub(before)) / 1024;
    assert!(
        growth_mib <= 16,
        "inlay grew by {growth_mib} MiB while streaming 1 GiB (rss {before} -> {peak} KiB)"
    );

    // And a 256 MiB request body streams to the origin the same way.
    let (tx, body) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        for _ in 0..256 {
            if tx
                .send(Ok(http_body::Frame::data(chunk.clone())))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let mut rx = body;
    let body =
        http_body_util::StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let up = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::post(inlay.url("/upload"))
        .body(body)
        .unwrap();
    let resp = up.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let j: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(j["bytes"], 256u64 << 20);
    let after = inlay.rss_kib();
    assert!(
        (after.saturating_sub(before)) / 1024 <= 16,
        "rss {before} -> {after} KiB after upload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_backend_is_503_slow_backend_is_504() {
    // A port nobody listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{port}\""
        ))
        .start();
    let r = get(&dead.url("/x")).await;
    assert_eq!(r.status, 503);
    assert!(
        dead.log.wait_for("unreachable", Duration::from_secs(5)),
        "{}",
        dead.log.text()
    );

    let origin = Origin::start();
    let slow = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"500ms\"",
            origin.url()
        ))
        .start();
    let started = Instant::now();
    let r = get(&slow.url("/hang")).await;
    assert_eq!(r.status, 504);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        slow.log
            .wait_for("first_byte_timeout", Duration::from_secs(5)),
        "{}",
        slow.log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_and_the_connection_is_closed() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    let (resp, closed) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp:?}");
    assert!(closed, "connection must be closed after a 400");
    let (resp, _) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(resp.starts_with("HTTP/1.1 400"), "missing Host: {resp:?}");
    assert!(
        inlay
            .log
            .wait_for("malformed request", Duration::from_secs(5)),
        "{}",
        inlay.log.text()
    );
    // The server is still fine.
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .server("header_read_timeout = \"1s\"")
        .start();
    let started = Instant::now();
    let (_, closed) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow:",
        Duration::from_secs(10),
    );
    assert!(closed, "connection should be closed by the server");
    let t = started.elapsed();
    assert!(
        t >= Duration::from_millis(900) && t < Duration::from_secs(5),
        "closed after {t:?}"
    );
    assert!(
        inlay
            .log
            .wait_for("header_read_timeout", Duration::from_secs(5)),
        "{}",
        inlay.log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_0() {
    let origin = Origin::start();
    let mut inlay = Inlay::builder().backend(&origin).start();
    let url = inlay.url("/bytes/100?delay_ms=1500");
    let slow = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    inlay.signal("TERM");
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100);
    let st =
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(10))).expect("inlay exited");
    assert!(st.success(), "exit status {st:?}\n{}", inlay.log.text());
    assert!(
        std::net::TcpStream::connect(inlay.addr).is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_access_log_line() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).start();
    get(&inlay.url("/resp?x=1")).await;
    assert!(
        inlay
            .access
            .wait_for("\"GET /resp?x=1 HTTP/1.1\" 200", Duration::from_secs(5)),
        "{}",
        inlay.access.text()
    );
    let json = Inlay::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start();
    get(&json.url("/resp?y=2")).await;
    assert!(
        json.access
            .wait_for("\"url\":\"/resp?y=2\"", Duration::from_secs(5)),
        "{}",
        json.access.text()
    );
}
