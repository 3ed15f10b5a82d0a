//! The reverse proxy, in process against the test origin: headers,
//! streaming, HEAD, chunked, h2c, failures, malformed and slow clients, the
//! access log.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, ask, get, get_resp_from, raw, request};
use http_body_util::BodyExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_with_via_and_x_forwarded_for_and_drops_hop_by_hop_fields() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
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
async fn a_connection_option_naming_a_field_inlay_relies_on_is_a_400() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/bytes/71?cc=max-age%3D60");
    for (options, extra) in [
        // Host, checked and then removed: the origin got the backend's
        // address and the object was stored under a Host-less key.
        ("keep-alive, host", None),
        ("Host", None),
        // A pass (Cookie, Authorization) turned into a lookup.
        ("cookie", Some(("cookie", "session=1"))),
        ("close, authorization", Some(("authorization", "Bearer x"))),
        // The request id, minted or kept, then dropped.
        ("x-request-id", Some(("x-request-id", "abc-123"))),
        // Framing.
        ("content-length", None),
    ] {
        let mut headers = vec![("connection", options)];
        headers.extend(extra);
        let r = request("GET", &url, &headers, Bytes::new()).await;
        assert_eq!(r.status, 400, "Connection: {options}: {}", r.text());
    }
    assert_eq!(
        origin.count("/bytes/71").await,
        0,
        "nothing reached the origin"
    );
    // Other options still name fields that are removed.
    let r = request(
        "GET",
        &inlay.url("/echo"),
        &[
            ("connection", "keep-alive, x-private, te"),
            ("x-private", "1"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(common::echoed(&r, "x-private"), None);
    assert!(common::echoed(&r, "x-request-id").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_rfc_3986_does_not_allow_is_a_400() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    for request in [
        &b"GET http://u@a.example/echo HTTP/1.1\r\nHost: a.example\r\n\r\n"[..],
        b"GET http://u:p@a.example/echo HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: u@a.example\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: a/b\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: a\\b\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: a.example:80:80\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: a.example:http\r\n\r\n",
    ] {
        let (resp, _) = raw(inlay.addr, request, Duration::from_secs(5)).await;
        let shown = String::from_utf8_lossy(request);
        assert!(resp.starts_with("HTTP/1.1 400"), "{shown:?}: {resp:?}");
    }
    assert_eq!(origin.count("/echo").await, 0, "nothing reached the origin");
    for (request, host) in [
        (
            &b"GET http://a.example/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
            "a.example",
        ),
        (
            b"GET /echo HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n",
            "[::1]:8080",
        ),
        (
            b"GET /echo HTTP/1.1\r\nHost: a-b.example:81\r\nConnection: close\r\n\r\n",
            "a-b.example:81",
        ),
    ] {
        let (resp, _) = raw(inlay.addr, request, Duration::from_secs(5)).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp:?}");
        assert!(resp.contains(&format!("\"{host}\"")), "{host}: {resp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_host_header_override() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\nhost_header = \"www.example.com\"",
            origin.url()
        ))
        .start_in_process()
        .await;
    let r = get(&inlay.url("/echo")).await;
    assert_eq!(
        common::echoed(&r, "host").as_deref(),
        Some("www.example.com")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_bytes_reach_the_client_before_the_origin_finishes() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
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
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
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
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
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
async fn dead_backend_is_503_slow_backend_is_504() {
    let port = common::unused_port();
    let dead = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{port}\"\n[log]\naccess_log_format = \"json\""
        ))
        .start_in_process()
        .await;
    let r = get(&dead.url("/x")).await;
    assert_eq!(r.status, 503);
    // Why, for the operator: the access log's error field.
    let line = dead.access.json_for("/x", Duration::from_secs(5)).await;
    assert_eq!(line["status"], 503, "{line}");
    assert!(
        line["error"].as_str().unwrap_or("").contains("unreachable"),
        "{line}"
    );

    let origin = Origin::start();
    let slow = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"500ms\"\n[log]\naccess_log_format = \"json\"",
            origin.url()
        ))
        .start_in_process()
        .await;
    let started = Instant::now();
    let r = get(&slow.url("/hang")).await;
    assert_eq!(r.status, 504);
    assert!(started.elapsed() < Duration::from_secs(5));
    let line = slow.access.json_for("/hang", Duration::from_secs(5)).await;
    assert!(
        line["error"]
            .as_str()
            .unwrap_or("")
            .contains("first_byte_timeout"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_and_the_connection_is_closed() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let (resp, closed) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp:?}");
    assert!(closed, "connection must be closed after a 400");
    // The 400s Inlay decides itself close the connection too, even when
    // the client asked to keep it.
    for request in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \xc3\xa9.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
    ] {
        let (resp, closed) = raw(inlay.addr, request, Duration::from_secs(5)).await;
        let shown = String::from_utf8_lossy(request);
        assert!(resp.starts_with("HTTP/1.1 400"), "{shown:?}: {resp:?}");
        assert!(
            resp.to_ascii_lowercase().contains("connection: close"),
            "{shown:?}: {resp:?}"
        );
        assert!(closed, "{shown:?}: connection must be closed after a 400");
    }
    // The server is still fine. (The stderr line for an operator:
    // process::diagnostics.)
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("header_read_timeout = \"1s\"")
        .start_in_process()
        .await;
    let started = Instant::now();
    let (_, closed) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow:",
        Duration::from_secs(10),
    )
    .await;
    assert!(closed, "connection should be closed by the server");
    let t = started.elapsed();
    assert!(
        t >= Duration::from_millis(900) && t < Duration::from_secs(5),
        "closed after {t:?}"
    );
}

/// A keep-alive connection's later heads are timed as its first is, also
/// after a response that took longer than `header_read_timeout` (hyper's
/// head timer is kept from one request to the next, and fires unpolled
/// while that response is made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_head_that_never_finishes_is_cut_off_too() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("header_read_timeout = \"1s\"")
        .start_in_process()
        .await;
    let mut s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    for (path, body) in [
        ("/resp?delay_ms=1500&cc=no-store&body=first", "first"),
        ("/resp?cc=no-store&body=second", "second"),
    ] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n");
        ask(&mut s, &head, body.as_bytes()).await;
    }
    let started = Instant::now();
    s.write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\nX-Slow:")
        .await
        .unwrap();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    assert!(closed, "the third head was never cut off");
    let t = started.elapsed();
    assert!(
        t >= Duration::from_millis(900) && t < Duration::from_secs(5),
        "closed after {t:?}"
    );
}

/// Reads until the server closes the connection or `timeout`: how many
/// bytes came, and whether the server closed.
async fn read_until_closed(s: &mut tokio::net::TcpStream, timeout: Duration) -> (usize, bool) {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut total = 0;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (total, true),
            Ok(Ok(n)) => total += n,
            Err(_) => return (total, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_cut_after_idle_send_timeout() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("idle_send_timeout = \"500ms\"")
        .start_in_process()
        .await;
    let size = 32 << 20;
    let mut s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    let req = format!("GET /bytes/{size}?cc=no-store HTTP/1.1\r\nHost: a\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    // Read nothing: the socket buffers fill and the proxy's writes block.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(30)).await;
    assert!(closed, "the connection stayed open after {got} bytes");
    assert!(
        got < size,
        "the whole body was sent to a client that read nothing"
    );
    // The server is still fine.
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_takes_longer_than_send_timeout_is_cut() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("send_timeout = \"1s\"")
        .start_in_process()
        .await;
    // 10 chunks 300 ms apart: about 3 s at the origin, read at once by the client.
    let started = std::time::Instant::now();
    let (got, closed) = raw(
        inlay.addr,
        b"GET /bytes/10000?chunk=1000&chunk_delay_ms=300&cc=no-store HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(20),
    )
    .await;
    let took = started.elapsed();
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(closed, "the connection stayed open");
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    assert!(
        body.len() < 10000,
        "the whole body was sent: {} bytes",
        body.len()
    );
    assert!(took < Duration::from_millis(2500), "cut after {took:?}");
}

/// The send clock of a keep-alive connection's second response runs from
/// its first poll: a `send_timeout` shorter than the connection's
/// periodic check (a second) cuts it on time, not at the next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_response_on_a_connection_is_cut_at_its_send_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("send_timeout = \"300ms\"")
        .start_in_process()
        .await;
    let mut s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    s.write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    for _ in 0..10 {
        // A second request at several points of the connection's check.
        tokio::time::sleep(Duration::from_millis(170)).await;
        let started = std::time::Instant::now();
        s.write_all(
            b"GET /bytes/10000?chunk=1000&chunk_delay_ms=100&cc=no-store HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
        let took = started.elapsed();
        assert!(closed, "the connection stayed open");
        assert!(took < Duration::from_millis(650), "cut after {took:?}");
        s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
        s.write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_with_a_closed_window_is_reset_and_the_connection_goes_on() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("idle_send_timeout = \"500ms\"")
        .start_in_process()
        .await;
    let tcp = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    // Every stream's window is zero: the server may send headers, no data.
    let (h2, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let req = http::Request::get("http://a/bytes/100000?cc=no-store")
        .body(())
        .unwrap();
    let (resp, _) = h2.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("response head")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let data = tokio::time::timeout(Duration::from_secs(10), body.data())
        .await
        .expect("the stream was left hanging instead of being reset");
    assert!(matches!(data, Some(Err(_))), "{data:?}");
    // The other streams of the connection go on.
    let mut h2 = h2.ready().await.unwrap();
    let req = http::Request::get("http://a/bytes/0").body(()).unwrap();
    let (resp, _) = h2.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("second response head")
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_access_log_line() {
    let origin = Origin::start();
    let mut inlay = Harness::builder().backend(&origin).start_in_process().await;
    get(&inlay.url("/resp?x=1")).await;
    let line = "\"GET /resp?x=1 HTTP/1.1\" 200";
    assert!(
        inlay
            .access
            .wait_for(&[line], Duration::from_secs(5))
            .await
            .is_some(),
        "{}",
        inlay.access.text()
    );
    let mut json = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    get(&json.url("/resp?y=2")).await;
    let line = json
        .access
        .json_for("/resp?y=2", Duration::from_secs(5))
        .await;
    assert_eq!(
        (line["method"].as_str(), line["status"].as_u64()),
        (Some("GET"), Some(200)),
        "{line}"
    );
    // One line per request, and no more once the server has stopped.
    inlay.stop().await;
    json.stop().await;
    assert_eq!(inlay.access.lines().len(), 1, "{}", inlay.access.text());
    assert_eq!(json.access.lines().len(), 1, "{}", json.access.text());
}

/// A User-Agent made to end its field early (issue 29: `curl -A 'x\" 500 1
/// "-" "forged'`) stays one field of the NCSA line: its backslash and its
/// quotes are escaped, so a log parser reads the line as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_user_agent_stays_one_field_of_the_access_log() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let (resp, _) = raw(
        inlay.addr,
        b"GET /resp?ua HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\
          User-Agent: x\\\" 500 1 \"-\" \"forged\r\nReferer: a\tb\\\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp:?}");
    let line = inlay
        .access
        .wait_for(&["/resp?ua"], Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no line: {}", inlay.access.text()));
    assert!(
        line.contains(r#" "a\x09b\\" "x\\\" 500 1 \"-\" \"forged" request_id="#),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_max_request_body_gets_413() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("max_request_body = \"1KiB\"")
        .start_in_process()
        .await;
    // A declared length over the limit: 413 before the origin is asked.
    let (resp, _) = raw(
        inlay.addr,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 1048576\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp:?}");
    assert_eq!(origin.count("/upload").await, 0);
    // A chunked body that claims a chunk of 2^64-19 bytes and then streams:
    // cut at the limit, answered 413.
    let mut chunked =
        b"POST /upload HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffed\r\n"
            .to_vec();
    chunked.extend(std::iter::repeat_n(b'x', 64 << 10));
    let (resp, closed) = raw(inlay.addr, &chunked, Duration::from_secs(10)).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp:?}");
    assert!(closed);
    // Within the limit, bodies pass whole.
    let r = request(
        "POST",
        &inlay.url("/upload"),
        &[],
        Bytes::from(vec![7u8; 1024]),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"bytes\":1024"), "{}", r.text());
}

/// A chunk whose declared size cannot fit `max_request_body` is a 413 as
/// soon as its size line comes, though the client sends only four of its
/// bytes and waits: for the first chunk before the origin is asked; for a
/// later one as soon as it comes (whether the origin got the request by
/// then is a race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_chunk_over_max_request_body_gets_413_at_once() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("max_request_body = \"1KiB\"")
        .start_in_process()
        .await;
    let head = "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (chunks, origin_asked) in [
        ("FFFFFFFFFFFFFFED\r\nAAAA", Some(0)),
        ("401\r\nAAAA", Some(0)),
        ("200\r\n", Some(0)),
        ("5\r\nAAAAA\r\n3FC\r\nAAAA", None),
    ] {
        // The client keeps its side open: only the 413 ends the wait.
        let (resp, closed) = raw(
            inlay.addr,
            format!("{head}{chunks}").as_bytes(),
            Duration::from_secs(3),
        )
        .await;
        if chunks == "200\r\n" {
            // 512 bytes fit: the body is awaited, nothing is answered.
            assert_eq!((resp.as_str(), closed), ("", false), "{chunks:?}");
            continue;
        }
        assert!(resp.starts_with("HTTP/1.1 413"), "{chunks:?}: {resp:?}");
        assert!(closed, "{chunks:?}");
        // Counted from the first case on.
        if let Some(asked) = origin_asked {
            assert_eq!(origin.count("/upload").await, asked, "{chunks:?}");
        }
    }
}

/// Chunk lines ended by a bare LF are the client's malformed framing
/// (hyper refuses them, RFC 9112 7.1 wants CRLF): a 400 and the connection
/// closed, never a 502 that blames the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_with_bare_lf_lines_is_the_client_s_400() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let (resp, closed) = raw(
        inlay.addr,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nAAAAA\n0\n\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp:?}");
    assert!(closed, "{resp:?}");
    assert_eq!(origin.count("/upload").await, 0, "the origin was asked");
    let line = inlay
        .access
        .wait_for(&["/upload"], Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no line: {}", inlay.access.text()));
    assert!(line.contains(" 400 "), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_cannot_hold_every_connection_slot() {
    // Every slot taken by a connection that sends nothing: when the slots
    // run short, idle connections go after `busy_idle_timeout` instead of
    // the minute of `idle_timeout`, so a real client gets in.
    const SLOTS: usize = 20;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server(&format!(
            "max_connections = {SLOTS}\nidle_timeout = \"60s\"\nbusy_idle_timeout = \"200ms\"\n\
             defer_accept = \"0s\""
        ))
        .start_in_process()
        .await;
    let mut idle = Vec::new();
    for _ in 0..SLOTS {
        idle.push(tokio::net::TcpStream::connect(inlay.addr).await.unwrap());
    }
    // Far less than idle_timeout: only the busy timeout can let it in.
    let served = tokio::time::timeout(Duration::from_secs(20), get(&inlay.url("/resp"))).await;
    assert_eq!(
        served.expect("a client waited for idle_timeout").status,
        200
    );
    // With free slots, an idle connection is left alone (idle_timeout).
    drop(idle);
    let mut lone = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut buf = [0u8; 1];
    use tokio::io::AsyncReadExt;
    let still_open = tokio::time::timeout(Duration::from_millis(200), lone.read(&mut buf))
        .await
        .is_err();
    assert!(
        still_open,
        "an idle connection was closed while slots were free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_nothing_do_not_take_the_slots_of_requests() {
    use tokio::io::AsyncReadExt;
    let origin = Origin::start();
    // defer_accept on (the default): the kernel hands Inlay a connection
    // once it has sent something, so an idle flood from one address does
    // not take that address's share, nor cost an accept and a close each.
    let inlay = Harness::builder()
        .backend(&origin)
        .server("max_connections_per_client = 5")
        .start_in_process()
        .await;
    // The listener gets the option when the server starts serving, which
    // may come after `start_in_process` returns: one request first.
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(tokio::net::TcpStream::connect(inlay.addr).await.unwrap());
    }
    for _ in 0..3 {
        let answer = get_resp_from(
            "127.0.0.1",
            inlay.addr,
            Duration::from_secs(3),
            "beside the idle flood",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
    // None of the idle ones was accepted and closed for being over the share.
    let mut buf = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_millis(300), idle[40].read(&mut buf)).await;
    assert!(
        closed.is_err(),
        "an idle connection was accepted and closed: {closed:?}"
    );
}

/// Bytes the kernel holds for Inlay's side of the connection from
/// `client` (written, not yet acknowledged): `tx_queue` in /proc/net/tcp.
#[cfg(target_os = "linux")]
fn server_send_queue(server: std::net::SocketAddr, client: std::net::SocketAddr) -> Option<u64> {
    let hex = |a: std::net::SocketAddr| match a {
        std::net::SocketAddr::V4(a) => Some(format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        )),
        std::net::SocketAddr::V6(_) => None,
    };
    let (local, remote) = (hex(server)?, hex(client)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&local.as_str()) || f.get(2) != Some(&remote.as_str()) {
            return None;
        }
        u64::from_str_radix(f.get(4)?.split(':').next()?, 16).ok()
    })
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_gets_no_more_than_tcp_notsent_lowat_written_ahead() {
    use tokio::io::AsyncWriteExt;
    // A slow reader: a tiny receive window, a large object, nothing read.
    // Without TCP_NOTSENT_LOWAT the kernel takes what the send buffer
    // holds, megabytes on a fast path, and Inlay copies all of it at once.
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("tcp_notsent_lowat = \"64KiB\"")
        .start_in_process()
        .await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(inlay.addr).await.unwrap();
    s.write_all(b"GET /static/16777216 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let client = s.local_addr().unwrap();
    // Inlay writes until the kernel takes no more; then the queue stays as
    // it is, since the client reads nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    let mut unchanged = 0;
    while unchanged < 5 {
        assert!(
            Instant::now() < deadline,
            "the send queue never settled: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let q = server_send_queue(inlay.addr, client);
        if q.is_some_and(|q| q > 0) && q == last {
            unchanged += 1;
        } else {
            unchanged = 0;
        }
        last = q;
    }
    let queued = last.unwrap_or(0);
    // 64 KiB unsent, what the client's window took, and a segment of slack.
    assert!(
        queued < 512 << 10,
        "{queued} bytes written ahead for a client that reads nothing"
    );
    // Once the client reads, Inlay writes the rest.
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut answer))
        .await
        .expect("the whole response within a minute")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert!(answer.len() > 16 << 20, "{} bytes", answer.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_cannot_take_every_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        // Connections that send nothing reach Inlay only without defer_accept.
        .server(
            "max_connections_per_client = 5\ndefer_accept = \"0s\"\nheader_read_timeout = \"2s\"",
        )
        .start_in_process()
        .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(tokio::net::TcpStream::connect(inlay.addr).await.unwrap());
    }
    // The sixth from the same address is refused: held unanswered (so that
    // it does not come back at once) and closed after header_read_timeout.
    let mut sixth = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    let _ = sixth
        .write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), sixth.read(&mut buf))
        .await
        .expect("the sixth connection was kept open past header_read_timeout");
    assert!(matches!(n, Ok(0) | Err(_)), "answered: {n:?}");
    // Another address is served while this one holds its share.
    let answer = get_resp_from(
        "127.0.0.2",
        inlay.addr,
        Duration::from_secs(10),
        "another address",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // A connection given back is a slot for the same address again (once
    // the server has seen it close).
    drop(held.pop());
    let mut served = false;
    for _ in 0..100 {
        let mut s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
        let _ = s
            .write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        if answer.starts_with(b"HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "the address got no slot back");
}

/// The access log's JSON line for `url`, from a harness logging JSON.
async fn logged(inlay: &Harness, url: &str) -> serde_json::Value {
    inlay.access.json_for(url, Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_is_kept_when_sane_and_reaches_the_backend_the_log_and_the_client() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    let r = request(
        "GET",
        &inlay.url("/echo?kept"),
        &[("x-request-id", "edge-42:abc")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("edge-42:abc"));
    assert_eq!(
        common::echoed(&r, "x-request-id").as_deref(),
        Some("edge-42:abc")
    );
    assert_eq!(
        logged(&inlay, "/echo?kept").await["request_id"],
        "edge-42:abc"
    );

    // None sent: one is minted, and it is the same everywhere.
    let r = get(&inlay.url("/echo?minted")).await;
    let id = r.header("x-request-id").expect("a minted id").to_owned();
    assert!(id.len() > 16, "{id}");
    assert_eq!(common::echoed(&r, "x-request-id"), Some(id.clone()));
    assert_eq!(logged(&inlay, "/echo?minted").await["request_id"], id);
    let next = get(&inlay.url("/echo?next")).await;
    assert_ne!(
        next.header("x-request-id"),
        Some(id.as_str()),
        "ids are unique"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_request_ids_are_replaced_and_never_logged() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    let huge = "h".repeat(300);
    let cases: [(&str, &[(&str, &str)]); 4] = [
        ("/echo?space", &[("x-request-id", "evil id")]),
        ("/echo?quote", &[("x-request-id", "evil\"id")]),
        ("/echo?huge", &[("x-request-id", &huge)]),
        ("/echo?comma", &[("x-request-id", "evil,id")]),
    ];
    for (url, headers) in cases {
        let r = request("GET", &inlay.url(url), headers, Bytes::new()).await;
        let id = r.header("x-request-id").unwrap().to_owned();
        assert!(
            !id.contains("evil") && !id.contains("hhh"),
            "{url}: kept {id}"
        );
        let sent: Vec<_> = common::echo_headers(&r)
            .into_iter()
            .filter(|(k, _)| k == "x-request-id")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            sent,
            [id.as_str()],
            "{url}: the backend gets only the new id"
        );
        let line = logged(&inlay, url).await;
        assert_eq!(line["request_id"], id.as_str());
        assert!(!line.to_string().contains("evil"), "{line}");
    }
    // Several: the first sane one wins, and only it goes on.
    let r = request(
        "GET",
        &inlay.url("/echo?several"),
        &[
            ("x-request-id", "bad one"),
            ("x-request-id", "good-1"),
            ("x-request-id", "good-2"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("good-1"));
    assert_eq!(
        common::echo_headers(&r)
            .into_iter()
            .filter(|(k, _)| k == "x-request-id")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_can_be_untrusted_renamed_or_off() {
    let origin = Origin::start();
    let untrusted = Harness::builder()
        .backend(&origin)
        .server("trust_request_id = false")
        .start_in_process()
        .await;
    let r = request(
        "GET",
        &untrusted.url("/echo"),
        &[("x-request-id", "mine")],
        Bytes::new(),
    )
    .await;
    let id = r.header("x-request-id").unwrap();
    assert_ne!(id, "mine");
    assert_eq!(common::echoed(&r, "x-request-id").as_deref(), Some(id));

    let renamed = Harness::builder()
        .backend(&origin)
        .server("request_id_header = \"X-Trace-Id\"")
        .start_in_process()
        .await;
    let r = request(
        "GET",
        &renamed.url("/echo"),
        &[("x-trace-id", "t-1")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("x-trace-id"), Some("t-1"));
    assert_eq!(r.header("x-request-id"), None);
    assert_eq!(common::echoed(&r, "x-trace-id").as_deref(), Some("t-1"));

    let off = Harness::builder()
        .backend(&origin)
        .server("request_id_header = \"\"")
        .start_in_process()
        .await;
    let r = get(&off.url("/echo")).await;
    assert_eq!(r.header("x-request-id"), None);
    assert_eq!(common::echoed(&r, "x-request-id"), None);
}

/// The `Server-Timing` entries of a response head, by name.
fn timing_names(r: &common::Reply) -> Vec<String> {
    r.headers
        .get_all("server-timing")
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(", "))
        .map(|e| e.to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timing_is_off_by_default_and_a_client_cannot_turn_it_on() {
    let origin = Origin::start();
    let plain = Harness::builder().backend(&origin).start_in_process().await;
    // With a policy too: the client's flag is gone before the policy runs.
    let with_policy = Harness::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(common::policy("headers").display().to_string())
        .start_in_process()
        .await;
    for inlay in [&plain, &with_policy] {
        let r = request(
            "GET",
            &inlay.url("/echo"),
            &[("inlay-server-timing", "1")],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("server-timing"), None);
        assert_eq!(
            common::echoed(&r, "inlay-server-timing"),
            None,
            "never forwarded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_turns_server_timing_on_for_one_request() {
    let origin = Origin::start();
    // The fixture's /cap/timing sets the flag, then goes to the origin's /echo.
    let inlay = Harness::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(common::policy("capabilities").display().to_string())
        .start_in_process()
        .await;
    let r = get(&inlay.url("/cap/timing")).await;
    assert_eq!(r.status, 200);
    let entries = timing_names(&r);
    assert!(
        entries.iter().any(|e| e.starts_with("recv;dur=")),
        "{entries:?}"
    );
    assert_eq!(
        common::echoed(&r, "inlay-server-timing"),
        None,
        "the flag is the host's, never the backend's"
    );
    // Other requests of the same policy: off (the config leaves it off).
    let r = get(&inlay.url("/echo")).await;
    assert_eq!(r.header("server-timing"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timing_from_the_config_names_the_phases_and_the_cache_status() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("server_timing = true")
        .start_in_process()
        .await;
    let miss = get(&inlay.url("/static/10")).await;
    let entries = timing_names(&miss);
    for phase in ["recv;dur=", "lookup;dur=", "fetch;dur=", "deliver;dur="] {
        assert!(
            entries.iter().any(|e| e.starts_with(phase)),
            "{phase} missing: {entries:?}"
        );
    }
    assert!(
        entries.contains(&"cache;desc=\"miss\"".to_owned()),
        "{entries:?}"
    );
    let hit = get(&inlay.url("/static/10")).await;
    let entries = timing_names(&hit);
    assert!(
        entries.contains(&"cache;desc=\"hit\"".to_owned()),
        "{entries:?}"
    );
    assert!(
        !entries.iter().any(|e| e.starts_with("fetch;")),
        "a hit fetched nothing: {entries:?}"
    );
    let pass = request(
        "GET",
        &inlay.url("/echo"),
        &[("cookie", "a=1")],
        Bytes::new(),
    )
    .await;
    let entries = timing_names(&pass);
    assert!(
        entries.contains(&"cache;desc=\"pass\"".to_owned()),
        "{entries:?}"
    );
    assert!(
        entries.iter().any(|e| e.starts_with("fetch;dur=")),
        "{entries:?}"
    );
}
