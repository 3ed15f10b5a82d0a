//! Prometheus metrics (`inlay::metrics`): what `GET /metrics` renders after
//! known traffic, checked against the access log the same requests wrote.
//!
//! `cargo test -p inlay --test server -- metrics::`

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin, esi_page, get, policy, request, unused_port};

/// The exposition text as `name{labels}` -> value, after checking that
/// every line is a comment or a sample and that the text ends with `# EOF`.
fn parse(text: &str) -> HashMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "no EOF marker:\n{text}");
    let mut samples = HashMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not `name value`: {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name in {line:?}"
        );
        let labels = &series[name_end..];
        let series = match labels {
            "" => name.to_owned(),
            _ => format!("{name}{{{}}}", sorted_labels(labels, line)),
        };
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        assert!(
            samples.insert(series.clone(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

/// `{b="2",a="1"}` as `a="1",b="2"`: the encoder puts `le` first, the
/// tests name labels in a fixed order.
fn sorted_labels(labels: &str, line: &str) -> String {
    let inner = labels
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("bad labels in {line:?}"));
    let mut pairs: Vec<&str> = inner.split("\",").collect();
    for p in &mut pairs {
        *p = p.trim_end_matches('"');
        let (k, v) = p
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad label name in {line:?}"
        );
        assert!(!v.contains('"'), "unescaped quote in {line:?}");
    }
    pairs.sort_unstable();
    pairs
        .iter()
        .map(|p| format!("{p}\""))
        .collect::<Vec<_>>()
        .join(",")
}

/// The value of one series (0 when absent: a labelled series appears once counted).
fn value(samples: &HashMap<String, f64>, series: &str) -> u64 {
    samples.get(series).copied().unwrap_or(0.0) as u64
}

/// Waits until the access log has `n` lines (a line is written when its
/// response body ends, after the client has read it) and returns them.
async fn access_lines(inlay: &Harness, n: usize) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lines = inlay.access.lines();
        if lines.len() >= n || tokio::time::Instant::now() >= deadline {
            assert_eq!(lines.len(), n, "{}", inlay.access.text());
            return lines
                .iter()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn count_cache(lines: &[serde_json::Value], cache: &str) -> u64 {
    lines.iter().filter(|l| l["cache"] == cache).count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_after_known_traffic_agree_with_the_access_log() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    let cacheable = |i: usize| format!("/resp?cc=max-age%3D600&body=object{i}");
    // 3 misses, then 6 hits.
    for i in 0..3 {
        assert_eq!(get(&inlay.url(&cacheable(i))).await.status, 200);
    }
    for _ in 0..2 {
        for i in 0..3 {
            let r = get(&inlay.url(&cacheable(i))).await;
            assert!(r.header("cache-status").unwrap().contains("hit"), "{r:?}");
        }
    }
    // 2 passes with a 5-byte body each.
    for _ in 0..2 {
        let r = request(
            "POST",
            &inlay.url("/upload"),
            &[],
            Bytes::from_static(b"hello"),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // An ESI page with two includes, one of them failing (left out).
    let markup = "<esi:include src=\"/resp?body=frag\"/>|<esi:include src=\"/resp?status=500\"/>";
    let r = get(&inlay.url(&esi_page(markup, true))).await;
    assert_eq!(r.text(), "frag|");
    // A purge of one object.
    let r = request("PURGE", &inlay.url(&cacheable(0)), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A bad request: an error page.
    let r = request(
        "GET",
        &inlay.url("/resp"),
        &[("host", "bad host")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400);

    let lines = access_lines(&inlay, 14).await;
    let m = parse(&inlay.metrics.render().await);

    // The cache's counts, each as the access log has it.
    for (series, cache, expected) in [
        ("inlay_cache_hits_total", "hit", 6),
        ("inlay_cache_misses_total", "miss", 4),
        ("inlay_cache_passes_total", "pass", 2),
        ("inlay_purge_requests_total", "purge", 1),
        ("inlay_request_errors_total", "error", 1),
    ] {
        assert_eq!(value(&m, series), expected, "{series}");
        assert_eq!(count_cache(&lines, cache), expected, "access log: {cache}");
    }
    assert_eq!(value(&m, "inlay_cache_grace_hits_total"), 0);
    assert_eq!(value(&m, "inlay_purged_objects_total"), 1);
    let requests = value(&m, "inlay_client_requests_total{protocol=\"http/1.1\"}");
    assert_eq!(requests, lines.len() as u64);
    let bytes_out: u64 = lines.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        value(&m, "inlay_client_response_body_bytes_total"),
        bytes_out
    );
    assert_eq!(value(&m, "inlay_client_request_body_bytes_total"), 10);
    assert!(value(&m, "inlay_connections_accepted_total") >= 1);

    // ESI: one page, two includes, one left out (as its log line says).
    let omitted: u64 = lines.iter().filter_map(|l| l["esi_omitted"].as_u64()).sum();
    assert_eq!(omitted, 1);
    assert_eq!(value(&m, "inlay_esi_pages_total"), 1);
    assert_eq!(value(&m, "inlay_esi_includes_total"), 2);
    assert_eq!(
        value(&m, "inlay_esi_include_errors_total{kind=\"omitted\"}"),
        omitted
    );
    assert_eq!(value(&m, "inlay_esi_include_time_seconds_count"), 2);

    // The backend: the misses, passes, the page and its includes, all answered.
    let fetched = value(&m, "inlay_backend_requests_total{backend=\"default\"}");
    assert_eq!(fetched, 4 + 2 + 2);
    assert_eq!(
        value(&m, "inlay_backend_failures_total{backend=\"default\"}"),
        0
    );
    assert_eq!(
        value(
            &m,
            "inlay_backend_response_time_seconds_count{backend=\"default\"}"
        ),
        fetched
    );
    assert_eq!(
        value(
            &m,
            "inlay_backend_response_time_seconds_bucket{backend=\"default\",le=\"+Inf\"}"
        ),
        fetched
    );

    // Read from the store at scrape time: the 3 objects and the include
    // (cacheable by default), less the purged one.
    assert_eq!(value(&m, "inlay_store_objects{tier=\"memory\"}"), 3);
    assert!(value(&m, "inlay_store_bytes{tier=\"memory\"}") > 0);
    assert!(value(&m, "inlay_store_capacity_bytes{tier=\"memory\"}") > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_concurrent_load_every_cache_status_agrees_with_the_access_log() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await;
    // 32 clients at once over 8 URLs: misses, coalesced requests and hits
    // in whatever mix the scheduling gives, plus some passes.
    let mut tasks = Vec::new();
    for c in 0..32 {
        let base = inlay.url("");
        tasks.push(tokio::spawn(async move {
            for i in 0..6 {
                let path = match (c + i) % 9 {
                    8 => "/resp?body=p".to_owned(),
                    n => format!("/static/177?id={n}"),
                };
                let r = match (c + i) % 9 {
                    8 => {
                        request(
                            "POST",
                            &format!("{base}{path}"),
                            &[],
                            Bytes::from_static(b"x"),
                        )
                        .await
                    }
                    _ => get(&format!("{base}{path}")).await,
                };
                assert_eq!(r.status, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let lines = access_lines(&inlay, 32 * 6).await;
    let m = parse(&inlay.metrics.render().await);
    let mut seen = 0;
    for (series, cache) in [
        ("inlay_cache_hits_total", "hit"),
        ("inlay_cache_misses_total", "miss"),
        ("inlay_cache_hit_for_miss_total", "hitmiss"),
        ("inlay_cache_passes_total", "pass"),
        ("inlay_request_errors_total", "error"),
    ] {
        assert_eq!(value(&m, series), count_cache(&lines, cache), "{series}");
        seen += count_cache(&lines, cache);
    }
    assert_eq!(seen, lines.len() as u64, "a status the test does not know");
    assert_eq!(
        value(&m, "inlay_client_requests_total{protocol=\"http/1.1\"}"),
        lines.len() as u64
    );
    let bytes_out: u64 = lines.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        value(&m, "inlay_client_response_body_bytes_total"),
        bytes_out
    );
    assert_eq!(
        value(&m, "inlay_client_request_body_bytes_total"),
        count_cache(&lines, "pass")
    );
    assert!(value(&m, "inlay_cache_hits_total") > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_connections_is_counted_per_backend() {
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.down]\naddress = \"http://127.0.0.1:{}\"\nconnect_timeout = \"2s\"\n[log]\naccess_log_format = \"json\"",
            unused_port()
        ))
        .start_in_process()
        .await;
    for _ in 0..2 {
        assert_eq!(get(&inlay.url("/resp")).await.status, 503);
    }
    let lines = access_lines(&inlay, 2).await;
    let m = parse(&inlay.metrics.render().await);
    assert_eq!(count_cache(&lines, "error"), 2);
    assert_eq!(value(&m, "inlay_request_errors_total"), 2);
    for series in [
        "inlay_backend_requests_total{backend=\"down\"}",
        "inlay_backend_failures_total{backend=\"down\"}",
        "inlay_backend_connect_errors_total{backend=\"down\"}",
    ] {
        assert_eq!(value(&m, series), 2, "{series}");
    }
    assert_eq!(
        value(&m, "inlay_backend_timeouts_total{backend=\"down\"}"),
        0
    );
    // No answer, no response time.
    assert_eq!(
        value(
            &m,
            "inlay_backend_response_time_seconds_count{backend=\"down\"}"
        ),
        0
    );
    // Another server's registry is its own.
    assert_eq!(value(&m, "inlay_cache_hits_total"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_byte_and_between_bytes_timeouts_are_counted() {
    use http_body_util::BodyExt;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.slow]\naddress = \"{}\"\nfirst_byte_timeout = \"300ms\"\nbetween_bytes_timeout = \"300ms\"\n[log]\naccess_log_format = \"json\"",
            origin.url()
        ))
        .start_in_process()
        .await;
    // No response head in time: a 504.
    assert_eq!(get(&inlay.url("/resp?delay_ms=3000")).await.status, 504);
    // A head, 100 bytes, then a stall: the body is cut.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(inlay.url("/slow-body?n=2000&first=100&after_ms=3000"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert!(
        resp.into_body().collect().await.is_err(),
        "the body was not cut"
    );
    access_lines(&inlay, 2).await;
    let m = parse(&inlay.metrics.render().await);
    assert_eq!(
        value(&m, "inlay_backend_requests_total{backend=\"slow\"}"),
        2
    );
    assert_eq!(
        value(&m, "inlay_backend_timeouts_total{backend=\"slow\"}"),
        2
    );
    assert_eq!(
        value(&m, "inlay_backend_failures_total{backend=\"slow\"}"),
        2
    );
    assert_eq!(
        value(&m, "inlay_backend_connect_errors_total{backend=\"slow\"}"),
        0
    );
    // Only the stalled one had a response head.
    assert_eq!(
        value(
            &m,
            "inlay_backend_response_time_seconds_count{backend=\"slow\"}"
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_include_that_ends_its_page_is_counted_as_failed() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"\n[esi]\non_include_error = \"fail\"")
        .start_in_process()
        .await;
    let markup = "<esi:include src=\"/resp?status=500\"/>after";
    assert_eq!(get(&inlay.url(&esi_page(markup, true))).await.status, 502);
    let lines = access_lines(&inlay, 1).await;
    let m = parse(&inlay.metrics.render().await);
    assert_eq!(count_cache(&lines, "error"), 1);
    assert_eq!(value(&m, "inlay_request_errors_total"), 1);
    assert_eq!(value(&m, "inlay_esi_pages_total"), 1);
    assert_eq!(
        value(&m, "inlay_esi_include_errors_total{kind=\"failed\"}"),
        1
    );
    assert_eq!(
        value(&m, "inlay_esi_include_errors_total{kind=\"omitted\"}"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_hooks_are_timed_and_traps_counted() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\n[log]\naccess_log_format = \"json\"",
            policy("trap").display().to_string()
        ))
        .start_in_process()
        .await;
    assert_eq!(get(&inlay.url("/trap")).await.status, 500);
    for _ in 0..2 {
        assert_eq!(get(&inlay.url("/resp?cc=max-age%3D60")).await.status, 200);
    }
    access_lines(&inlay, 3).await;
    let m = parse(&inlay.metrics.render().await);
    assert_eq!(value(&m, "inlay_policy_traps_total"), 1);
    assert_eq!(value(&m, "inlay_policy_timeouts_total"), 0);
    let hook = |h: &str| {
        value(
            &m,
            &format!("inlay_policy_hook_time_seconds_count{{hook=\"{h}\"}}"),
        )
    };
    assert_eq!(hook("on_request"), 3);
    assert_eq!(hook("on_backend_response"), 1, "the miss only");
    assert_eq!(hook("on_deliver"), 2, "not the trapped request");
    // Read from the runtime at scrape time.
    assert!(value(&m, "inlay_policy_pool_size") > 0);
    let calls =
        value(&m, "inlay_policy_replayed_calls_total") + value(&m, "inlay_policy_live_calls_total");
    assert!(calls > 0, "replayed and live calls of the generation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_metrics_disabled_nothing_is_counted() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[metrics]\nenabled = false")
        .start_in_process()
        .await;
    for _ in 0..3 {
        assert_eq!(get(&inlay.url("/resp?cc=max-age%3D60")).await.status, 200);
    }
    let m = parse(&inlay.metrics.render().await);
    for series in [
        "inlay_client_requests_total{protocol=\"http/1.1\"}",
        "inlay_cache_hits_total",
        "inlay_cache_misses_total",
        "inlay_backend_requests_total{backend=\"default\"}",
        "inlay_connections_accepted_total",
    ] {
        assert_eq!(value(&m, series), 0, "{series}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_are_counted_from_the_cache_at_scrape_time() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    get(&inlay.url("/resp?cc=max-age%3D600")).await;
    for expression in ["req.url ~ ^/resp", "obj.status == 404"] {
        let r = request("BAN", &inlay.url("/"), &[("ban", expression)], Bytes::new()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = request(
        "BAN",
        &inlay.url("/"),
        &[("ban", "req.url ~ (")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400);
    let samples = parse(&inlay.metrics.render().await);
    assert_eq!(value(&samples, "inlay_bans_added_total"), 2);
    assert!(value(&samples, "inlay_bans") <= 2);
}
