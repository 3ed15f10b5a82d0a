//! What the process tells its operator on stderr when something goes wrong.
//! The behaviour itself (statuses, closed connections, truncated pages,
//! the access log's error field) is tested in process, in the area's file;
//! the tracing subscriber is process-global, so only a process shows these.

use std::time::Duration;

use bytes::Bytes;

use crate::common::{Inlay, Origin, esi_page, get, policy, raw, request, unused_port};

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
    ] {
        let inlay = Inlay::builder()
            .backend(&origin)
            .arg("--policy")
            .arg(policy(fixture).display().to_string())
            .spawn_process();
        assert!(get(&inlay.url(path)).await.status >= 500);
        inlay.expect_log(said, Duration::from_secs(5));
    }
}
