//! What the process tells its operator on stderr when something goes wrong.
//! The behaviour itself (statuses, closed connections, truncated pages,
//! the access log's error field) is tested in process, in the area's file;
//! the tracing subscriber is process-global, so only a process shows these.

use std::time::Duration;

use bytes::Bytes;

use crate::common::{
    Inlay, Origin, TestCa, TlsOrigin, esi_page, get, policy, raw, request, unused_port,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_explained_on_stderr() {
    let port = unused_port();
    let dead = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{port}\""
        ))
        .spawn_process();
    assert_eq!(get(&dead.url("/x")).await.status, 503);
    dead.expect_log("unreachable", Duration::from_secs(5));

    let origin = Origin::start();
    let slow = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"500ms\"",
            origin.url()
        ))
        .spawn_process();
    assert_eq!(get(&slow.url("/hang")).await.status, 504);
    slow.expect_log("first_byte_timeout", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_origin_certificate_says_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("the origin's CA");
    let origin = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), None).await;
    let other = TestCa::new("another CA").write(dir.path(), "other.pem");
    let inlay = Inlay::builder()
        .toml(&format!(
            "[backends.api]\naddress = \"{}\"\nca_file = {:?}",
            origin.url(),
            other.display().to_string()
        ))
        .spawn_process();
    assert_eq!(get(&inlay.url("/x")).await.status, 503);
    inlay.expect_log(
        "set backends.api.ca_file to the PEM of the CA that did",
        Duration::from_secs(5),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_slow_clients_are_explained_on_stderr() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .server("header_read_timeout = \"1s\"")
        .spawn_process();
    let (resp, _) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp:?}");
    inlay.expect_log("malformed request", Duration::from_secs(5));
    let (_, closed) = raw(
        inlay.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow:",
        Duration::from_secs(10),
    )
    .await;
    assert!(closed);
    inlay.expect_log("header_read_timeout", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn esi_failures_are_explained_on_stderr() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml("[esi]\nmax_depth = 3\nmax_includes = 5")
        .spawn_process();
    // An include that fails without a fallback ends the page.
    let failed = "before<esi:include src=\"/resp?status=500\"/>after";
    let _ = request(
        "GET",
        &inlay.url(&esi_page(failed, true)),
        &[],
        Bytes::new(),
    )
    .await;
    inlay.expect_log("/resp?status=500", Duration::from_secs(5));
    // An include to a host that is not a configured backend is refused.
    let refused =
        "<esi:include src=\"http://169.254.169.254/latest/meta-data\" onerror=\"continue\"/>ok";
    assert_eq!(get(&inlay.url(&esi_page(refused, true))).await.text(), "ok");
    inlay.expect_log("not a configured backend", Duration::from_secs(5));
    // Nesting deeper than max_depth.
    let _ = get(&inlay.url("/esi/page?n=1&nested=5&cacheable=0")).await;
    inlay.expect_log("depth", Duration::from_secs(5));
    // More includes than max_includes.
    let many: String = (0..8)
        .map(|i| {
            format!(
                "<esi:include src=\"/bytes/{}\" onerror=\"continue\"/>",
                i + 1
            )
        })
        .collect();
    assert_eq!(get(&inlay.url(&esi_page(&many, true))).await.status, 200);
    inlay.expect_log("includes per page", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_policies_are_explained_on_stderr() {
    let origin = Origin::start();
    for (fixture, path, said) in [
        ("loop", "/loop", "CPU time"),
        ("trap", "/trap", "trap fixture"),
        // A Go panic: the SDK logs it (and the stack) as one line.
        (
            "runtime-go",
            "/go/panic",
            "policy on-request panicked: go fixture: refusing /go/panic",
        ),
        // Go's standard output is the policy's log too.
        (
            "runtime-go",
            "/go/print",
            "go fixture says hello to /go/print",
        ),
    ] {
        if fixture.ends_with("-go") && !crate::common::go_policy_built(fixture) {
            continue;
        }
        let inlay = Inlay::builder()
            .backend(&origin)
            .arg("--policy")
            .arg(policy(fixture).display().to_string())
            .spawn_process();
        let status = get(&inlay.url(path)).await.status;
        assert_eq!(status >= 500, path != "/go/print", "{path}: {status}");
        inlay.expect_log(said, Duration::from_secs(5));
    }
}

/// HTTP/2 rapid reset (CVE-2023-44487): the h2 library answers a
/// connection that cancels too many streams with GOAWAY and logs a warning
/// for each such connection. An attacker reconnects at will, so those lines
/// would be theirs to write: the default log filter keeps the h2 library's
/// lines at error level (one line per connection is what flooded the log
/// in the hostile-traffic run). Inlay's own line for a failed connection
/// stays, rate-limited (20 a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_resets_do_not_write_to_the_log() {
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).spawn_process();
    let mut goaways = 0;
    for _ in 0..3 {
        let tcp = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
        let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
        let driver = tokio::spawn(conn);
        let mut send = h2;
        let mut closed = false;
        for _ in 0..5000 {
            let ready = tokio::time::timeout(Duration::from_secs(5), send.clone().ready()).await;
            let Ok(Ok(mut s)) = ready else {
                closed = true;
                break;
            };
            let req = http::Request::get("http://a/bytes/10").body(()).unwrap();
            match s.send_request(req, true) {
                // Dropping both halves resets the stream (RST_STREAM CANCEL).
                Ok(both) => drop(both),
                Err(_) => {
                    closed = true;
                    break;
                }
            }
            send = s;
        }
        driver.abort();
        goaways += usize::from(closed);
    }
    assert!(goaways > 0, "no connection was closed for its resets");
    // The server still answers, and said nothing about the resets.
    assert_eq!(get(&inlay.url("/bytes/10")).await.status, 200);
    std::thread::sleep(Duration::from_millis(300));
    let log = inlay.log.text();
    assert!(!log.contains("recv_reset"), "{log}");
}
