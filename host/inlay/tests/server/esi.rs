//! ESI, in process against the test origin: opt-in, parallel fetch, order,
//! limits, failures, safety, gzip.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, esi_page as page, get, request, urlencode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_opt_in_tags_pass_through_and_nothing_is_fetched() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let markup = "a<esi:include src=\"/bytes/7\"/>b";
    let r = get(&inlay.url(&page(markup, false))).await;
    assert_eq!(r.text(), markup);
    assert_eq!(origin.count("/bytes/7").await, 0);
    let r = get(&inlay.url(&page(markup, true))).await;
    assert_eq!(r.text(), "aabcdefgb");
    assert_eq!(origin.count("/bytes/7").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn includes_are_fetched_at_once_and_written_in_document_order() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // Fragment 0 is the slowest: order must still be 0, 1, 2, 3.
    let started = Instant::now();
    let r = get(&inlay.url("/esi/page?n=4&delays=600,100,300,200&cacheable=0")).await;
    let took = started.elapsed();
    let text = r.text();
    let pos: Vec<usize> = (0..4)
        .map(|i| {
            text.find(&format!("data-id=\"{i}\""))
                .unwrap_or_else(|| panic!("fragment {i} missing: {text}"))
        })
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "out of order: {text}");
    // Serial would be 1200 ms; parallel is the slowest fragment.
    assert!(took < Duration::from_millis(1100), "took {took:?}");
    assert!(!text.contains("<esi:"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_mode_takes_the_sum_of_the_delays() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[esi]\nmax_concurrency = 1")
        .start_in_process()
        .await;
    let started = Instant::now();
    let r = get(&inlay.url("/esi/page?n=4&delay_ms=150&cacheable=0")).await;
    assert_eq!(r.status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "serial: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alt_and_onerror_continue() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let markup = "[<esi:include src=\"/resp?status=500\" alt=\"/bytes/3\"/>]\
                  [<esi:include src=\"/resp?status=404\" onerror=\"continue\"/>]\
                  [<esi:try><esi:attempt><esi:include src=\"/resp?status=503\"/></esi:attempt><esi:except>fallback</esi:except></esi:try>]";
    let r = get(&inlay.url(&page(markup, true))).await;
    assert_eq!(r.text(), "[abc][][fallback]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_include_without_fallback_is_left_out_and_counted() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    // One fails by status, one is refused while the page is parsed (not a
    // backend), one is at the very start of the page.
    let markup = "<esi:include src=\"/resp?status=503\"/>before\
                  <esi:include src=\"/resp?status=500\"/>\
                  <esi:include src=\"http://169.254.169.254/x\"/>after";
    let r = get(&inlay.url(&page(markup, true))).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "beforeafter",
        "the whole page, without the failed includes"
    );
    let line = inlay
        .access
        .json_for(&page(markup, true), Duration::from_secs(5))
        .await;
    assert_eq!(line["esi_omitted"], 3, "{line}");
    assert!(line["error"].is_null(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_include_error_fail_a_failed_include_ends_the_page() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"\n[esi]\non_include_error = \"fail\"")
        .start_in_process()
        .await;
    // Nothing sent yet: an error status instead of an empty 200.
    for markup in [
        "<esi:include src=\"http://169.254.169.254/x\"/>after",
        "<esi:include src=\"/resp?status=500\"/>after",
    ] {
        let r = get(&inlay.url(&page(markup, true))).await;
        assert_eq!(r.status, 502, "{markup}");
        assert!(!r.text().contains("after"), "{}", r.text());
    }
    // Part of the page already sent: the body is cut.
    let markup = "before<esi:include src=\"/resp?status=500\"/>after";
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(inlay.url(&page(markup, true)))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(
        resp.status(),
        200,
        "headers were sent before the include failed"
    );
    let body = http_body_util::BodyExt::collect(resp.into_body()).await;
    assert!(
        body.is_err(),
        "the client must see a truncated page, not a silently broken one"
    );
    // The access log says which include ended it.
    let line = inlay
        .access
        .json_for(&page(markup, true), Duration::from_secs(5))
        .await;
    assert!(
        line["error"]
            .as_str()
            .unwrap_or("")
            .contains("/resp?status=500"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn includes_to_unknown_hosts_are_refused() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // A server that is not a configured backend must never be asked.
    let elsewhere = Origin::start();
    let markup = format!(
        "<esi:include src=\"http://169.254.169.254/latest/meta-data\" onerror=\"continue\"/>\
         <esi:include src=\"https://example.com/\" onerror=\"continue\"/>\
         <esi:include src=\"{}/bytes/3\" onerror=\"continue\"/>ok",
        elsewhere.url()
    );
    let r = get(&inlay.url(&page(&markup, true))).await;
    assert_eq!(r.text(), "ok");
    assert_eq!(elsewhere.count("/bytes/3").await, 0);
    // An absolute URL naming the configured backend is allowed.
    let markup = format!("<esi:include src=\"{}/bytes/2\"/>", origin.url());
    assert_eq!(get(&inlay.url(&page(&markup, true))).await.text(), "ab");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_and_authorization_are_not_forwarded_to_includes() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let markup = "<esi:include src=\"/echo?cc=no-store\"/>";
    let r = request(
        "GET",
        &inlay.url(&page(markup, true)),
        &[
            ("cookie", "session=secret"),
            ("authorization", "Bearer x"),
            ("accept-language", "fr"),
        ],
        Bytes::new(),
    )
    .await;
    let text = r.text().to_lowercase();
    assert!(
        text.contains("accept-language"),
        "forwarded header missing: {text}"
    );
    assert!(
        !text.contains("session=secret"),
        "cookie leaked to include: {text}"
    );
    assert!(!text.contains("bearer"), "authorization leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragments_are_cached_by_their_own_headers() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    // The page is not cacheable; its fragments are (max-age=60).
    for _ in 0..3 {
        let r = get(&inlay.url("/esi/page?n=3&cacheable=1&x=nocache")).await;
        assert!(r.text().contains("data-id=\"2\""));
    }
    assert_eq!(origin.count("/esi/fragment/0").await, 1);
    assert_eq!(origin.count("/esi/fragment/2").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_includes_and_the_depth_limit() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[esi]\nmax_depth = 3\n[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    let ok = get(&inlay.url("/esi/page?n=2&nested=2&cacheable=0")).await;
    assert!(ok.text().contains("data-id=\"1.1.0\""), "{}", ok.text());
    // Nested 5 deep exceeds max_depth 3: the include at depth 4 is left out
    // (as Varnish does), the rest of the page is whole.
    let deep = get(&inlay.url("/esi/page?n=1&nested=5&cacheable=0")).await;
    assert_eq!(deep.status, 200);
    let text = deep.text();
    assert!(text.contains("data-id=\"0.4.3\""), "{text}");
    assert!(!text.contains("data-id=\"0.4.3.2\""), "{text}");
    assert!(!text.contains("<esi:"), "{text}");
    let line = inlay
        .access
        .json_for("/esi/page?n=1&nested=5&cacheable=0", Duration::from_secs(5))
        .await;
    assert_eq!(line["esi_omitted"], 1, "{line}");
    assert!(line["error"].is_null(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_count_cap_and_include_timeout() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[esi]\nmax_includes = 5\ninclude_timeout = \"300ms\"")
        .start_in_process()
        .await;
    let markup: String = (0..8)
        .map(|i| {
            format!(
                "<esi:include src=\"/bytes/{}\" onerror=\"continue\"/>",
                i + 1
            )
        })
        .collect();
    let r = get(&inlay.url(&page(&markup, true))).await;
    // 5 included, 3 refused by the cap: each fragment is a run starting with 'a'.
    assert_eq!(r.text().matches('a').count(), 5, "{}", r.text());
    let mut fetched = 0;
    for i in 1..=8 {
        fetched += origin.count(&format!("/bytes/{i}")).await;
    }
    assert_eq!(fetched, 5, "includes over the cap are not fetched");
    let started = Instant::now();
    let markup = "x<esi:include src=\"/bytes/5?delay_ms=3000\" onerror=\"continue\"/>y";
    let r = get(&inlay.url(&page(markup, true))).await;
    assert_eq!(r.text(), "xy");
    assert!(started.elapsed() < Duration::from_millis(2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_pages_are_decoded_and_re_encoded_for_gzip_clients() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/gzip/esi/page?n=2&cacheable=0");
    let plain = get(&url).await;
    assert_eq!(plain.header("content-encoding"), None);
    assert!(plain.text().contains("data-id=\"1\""), "{}", plain.text());
    let zipped = request("GET", &url, &[("accept-encoding", "gzip")], Bytes::new()).await;
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    let mut out = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&zipped.body[..]),
        &mut out,
    )
    .unwrap();
    assert_eq!(out, plain.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_bytes_do_not_wait_for_includes() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let started = Instant::now();
    let req = http::Request::get(inlay.url("/esi/page?n=3&delay_ms=800&cacheable=0"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    let f = http_body_util::BodyExt::frame(resp.body_mut())
        .await
        .unwrap()
        .unwrap();
    let ttfb = started.elapsed();
    assert!(
        f.data_ref()
            .is_some_and(|d| String::from_utf8_lossy(d).contains("<html"))
    );
    assert!(
        ttfb < Duration::from_millis(400),
        "first bytes after {ttfb:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_page_shows_what_the_cache_holds_for_its_template_and_fragments() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let frag = "/dynamic?cc=max-age%3D60&delay_ms=0";
    let cached_page = |markup: &str| {
        format!(
            "/resp?ct=text/html&cc=max-age%3D60&sc=content%3D%22ESI/1.0%22&body={}",
            urlencode(markup)
        )
    };
    let a = cached_page(&format!("<p><esi:include src=\"{frag}\"/></p>"));
    let b = cached_page(&format!("<div><esi:include src=\"{frag}\"/></div>"));
    let first = get(&inlay.url(&a)).await.text();
    assert!(
        first.starts_with("<p>") && first.contains("render #1"),
        "{first}"
    );
    // Both pages and the fragment now come from the cache, each template its own.
    for _ in 0..3 {
        assert_eq!(get(&inlay.url(&a)).await.text(), first);
        let other = get(&inlay.url(&b)).await.text();
        assert!(
            other.starts_with("<div>") && other.contains("render #1"),
            "{other}"
        );
    }
    assert_eq!(origin.count("/dynamic").await, 1);
    assert_eq!(origin.count("/resp").await, 2);
    // A purged fragment is fetched again, and every page shows the new one.
    let r = request("PURGE", &inlay.url(frag), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let second = get(&inlay.url(&a)).await.text();
    assert!(second.contains("render #2"), "{second}");
    assert!(get(&inlay.url(&b)).await.text().contains("render #2"));
    assert_eq!(origin.count("/dynamic").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_buffer_budget_still_assembles_the_whole_page() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[esi]\nmax_buffered_bytes = \"64KiB\"\nmax_concurrency = 2")
        .start_in_process()
        .await;
    // A slow first include, then fragments larger than the budget that are
    // ready long before their turn, then an attempt larger than the budget.
    let mut markup = String::from("<esi:include src=\"/bytes/10?delay_ms=300\"/>");
    for i in 0..4 {
        markup.push_str(&format!("<esi:include src=\"/bytes/200000?id={i}\"/>"));
    }
    markup.push_str(
        "<esi:try><esi:attempt><esi:include src=\"/bytes/100000?id=9\"/></esi:attempt>\
         <esi:except>E</esi:except></esi:try>end",
    );
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        get(&inlay.url(&page(&markup, true))),
    )
    .await
    .expect("the page hangs");
    assert_eq!(r.status, 200);
    let text = r.text();
    assert_eq!(text.len(), 10 + 4 * 200_000 + "Eend".len());
    assert!(
        text.ends_with("Eend"),
        "the attempt over the budget fell back"
    );
    assert!(!text.contains("<esi:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_include_carries_the_page_request_id() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let markup = "[<esi:include src=\"/echo?a\"/>][<esi:include src=\"/echo?b\"/>]";
    let r = request(
        "GET",
        &inlay.url(&page(markup, true)),
        &[("x-request-id", "page-7")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("page-7"));
    let text = r.text();
    assert_eq!(
        text.matches("[\"x-request-id\",\"page-7\"]").count(),
        2,
        "{text}"
    );
    // A minted id goes to the includes the same way (new URLs: the first
    // ones may be cached).
    let markup = "[<esi:include src=\"/echo?c\"/>][<esi:include src=\"/echo?d\"/>]";
    let r = get(&inlay.url(&page(markup, true))).await;
    let id = r.header("x-request-id").unwrap();
    let text = r.text();
    assert_eq!(
        text.matches(&format!("[\"x-request-id\",\"{id}\"]"))
            .count(),
        2,
        "{text}"
    );
}

/// A page with one include that is served, one that fails and is left out.
const TIMED_PAGE: &str =
    "a<esi:include src=\"/bytes/3?secret=1\"/>b<esi:include src=\"/resp?status=404\"/>c";

fn check_include_entries(trailer: &str) {
    assert!(
        trailer.contains("esi-inc;dur=") && trailer.contains("desc=\"/bytes/3 miss\""),
        "{trailer}"
    );
    assert!(
        !trailer.contains("secret"),
        "queries are not shown: {trailer}"
    );
    assert!(
        trailer.contains("esi-omit;desc=\"/resp status 404\""),
        "{trailer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timing_puts_each_include_in_a_trailer_over_h2() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("server_timing = true")
        .start_in_process()
        .await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = http::Request::get(inlay.url(&page(TIMED_PAGE, true)))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let head = resp.headers()["server-timing"].to_str().unwrap().to_owned();
    assert!(head.contains("recv;dur="), "{head}");
    assert_eq!(resp.headers()["trailer"], "server-timing");
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let trailer = body
        .trailers()
        .expect("a trailer")
        .get("server-timing")
        .expect("Server-Timing in the trailer")
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(body.to_bytes(), "aabcbc");
    check_include_entries(&trailer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_timing_trailer_over_http1_only_with_te_trailers() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("server_timing = true")
        .start_in_process()
        .await;
    let path = page(TIMED_PAGE, true);
    let ask = |te: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{te}Connection: close\r\n\r\n").into_bytes()
    };
    let (with_te, _) = common::raw(
        inlay.addr,
        &ask("TE: trailers\r\n"),
        Duration::from_secs(10),
    )
    .await;
    let (head, body) = with_te.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\ntrailer: server-timing"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let trailer = body
        .split("\r\n0\r\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no last chunk: {body:?}"));
    assert!(trailer.starts_with("server-timing: "), "{trailer:?}");
    check_include_entries(trailer);

    // Without TE: trailers the head keeps its phases and declares no trailer.
    let (without, _) = common::raw(inlay.addr, &ask(""), Duration::from_secs(10)).await;
    let (head, body) = without.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.contains("server-timing: recv;dur="), "{head}");
    assert!(!head.contains("\r\ntrailer:"), "{head}");
    assert!(body.ends_with("\r\n0\r\n\r\n"), "{body:?}");
}
