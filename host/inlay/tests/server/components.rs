//! Component backends: standard `wasi:http` components served in-process
//! (`[backends.NAME] component = "app.wasm"`, `inlay serve --component`),
//! behind the cache and ESI as an origin is, bounded as a policy is. The
//! example components of `policies/components/` (built by `make
//! components`), in the test process.
//!
//! Run: `cargo test -p inlay --test server -- components::`

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, ask, component, esi_page, get, request, urlencode};

/// Inlay with `name` as the default backend, as `inlay serve --component`
/// (which replaces the file's default backend, as it does the embedded
/// default config's).
async fn serving(name: &str) -> Harness {
    Harness::builder()
        .toml("[backends.default]\naddress = \"http://127.0.0.1:9\"")
        .arg("--component")
        .arg(component(name).display().to_string())
        .toml("[log]\naccess_log_format = \"json\"")
        .start_in_process()
        .await
}

/// Inlay with a `[backends.default]` component of `name` and these extra
/// lines in its table, then `rest`.
async fn with_settings(name: &str, settings: &str, rest: &str) -> Harness {
    Harness::builder()
        .toml(&format!(
            "[backends.default]\ncomponent = {:?}\n{settings}\n{rest}\n\
             [log]\naccess_log_format = \"json\"",
            component(name).display().to_string()
        ))
        .start_in_process()
        .await
}

/// How many requests the backend `name` was sent (its metric).
async fn backend_requests(inlay: &Harness, name: &str) -> u64 {
    let text = inlay.metrics.render().await;
    let key = format!("inlay_backend_requests_total{{backend=\"{name}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_answers_are_cached_and_concurrent_misses_run_it_once() {
    let inlay = serving("hello-rs").await;
    let url = inlay.url("/hello");
    let replies = futures_util::future::join_all((0..20).map(|_| get(&url))).await;
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), "hello from a Rust component\n");
    }
    assert_eq!(
        backend_requests(&inlay, "default").await,
        1,
        "twenty concurrent misses are one request to the component"
    );
    let hit = get(&url).await;
    assert!(
        hit.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        hit.headers
    );
    assert_eq!(backend_requests(&inlay, "default").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_page_includes_its_fragment_through_the_cache() {
    let inlay = serving("hello-rs").await;
    for _ in 0..3 {
        let r = get(&inlay.url("/")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        assert!(
            text.contains("<p>fragment from a Rust component</p>") && !text.contains("esi:"),
            "{text}"
        );
    }
    // The page and its fragment, each once; later pages from the cache.
    assert_eq!(backend_requests(&inlay, "default").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origins_page_includes_a_fragment_from_a_component_backend() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[backends.app]\ncomponent = {:?}",
            component("hello-rs").display().to_string()
        ))
        .start_in_process()
        .await;
    let page = esi_page(
        "<main><esi:include src=\"http://app/fragment\"/></main>",
        true,
    );
    let r = get(&inlay.url(&page)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "<main><p>fragment from a Rust component</p></main>"
    );
    assert_eq!(backend_requests(&inlay, "app").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_fails_its_request_alone_with_a_502() {
    let inlay = serving("hello-rs").await;
    let (trap, hello) = (inlay.url("/trap"), inlay.url("/hello"));
    let (trapped, fine) = tokio::join!(get(&trap), get(&hello));
    assert_eq!(trapped.status, 502, "{}", trapped.text());
    assert_eq!(fine.status, 200, "{}", fine.text());
    let line = inlay.access.json_for("/trap", Duration::from_secs(5)).await;
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.contains("component trapped"), "{line}");
    // The next request gets a fresh instance.
    assert_eq!(get(&inlay.url("/hello?again")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_over_its_cpu_time_or_memory_fails_with_a_502() {
    let inlay = with_settings("hello-rs", "cpu_time = \"100ms\"\nmemory = \"16MiB\"", "").await;
    let started = Instant::now();
    let spin = get(&inlay.url("/spin")).await;
    assert_eq!(spin.status, 502, "{}", spin.text());
    // 100 ms of CPU, on a machine that may be busy: far below the
    // request's 60 s cap all the same.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let grow = get(&inlay.url("/grow")).await;
    assert_eq!(grow.status, 502, "{}", grow.text());
    let spin = inlay.access.json_for("/spin", Duration::from_secs(5)).await;
    assert!(
        spin["error"]
            .as_str()
            .unwrap_or_default()
            .contains("CPU time"),
        "{spin}"
    );
    let grow = inlay.access.json_for("/grow", Duration::from_secs(5)).await;
    assert!(
        grow["error"]
            .as_str()
            .unwrap_or_default()
            .contains("out of memory (16777216 bytes)"),
        "{grow}"
    );
    assert_eq!(get(&inlay.url("/hello")).await.status, 200);
}

/// A guest blocked in a call into the host (a 0.2 component's
/// `pollable.block` on an outgoing request) waits on the host: the wait
/// is not CPU time, however longer than `cpu_time` it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_waiting_on_the_host_past_its_cpu_time_is_not_stopped() {
    let origin = Origin::start();
    let inlay = with_settings(
        "hello-rs",
        "cpu_time = \"100ms\"",
        &format!("[backends.api]\naddress = {:?}", origin.url()),
    )
    .await;
    let url = urlencode("http://api/resp?body=late&delay_ms=600");
    let r = get(&inlay.url(&format!("/fetch?url={url}"))).await;
    assert_eq!((r.status, r.text()), (200, "200 late".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_instance_pool_answers_503_once_instance_wait_is_over() {
    let inlay = with_settings(
        "hello-rs",
        "cpu_time = \"2s\"\nmax_instances = 1\ninstance_wait = \"0s\"",
        "",
    )
    .await;
    let spin = inlay.url("/spin");
    let spinning = tokio::spawn(async move { get(&spin).await });
    // The one instance is busy spinning until its CPU time is up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    let busy = loop {
        n += 1;
        let r = get(&inlay.url(&format!("/hello?n={n}"))).await;
        if r.status == 503 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert_eq!(spinning.await.unwrap().status, 502);
    assert_eq!(get(&inlay.url("/hello")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_requests_reach_only_configured_backends() {
    let origin = Origin::start();
    let authority = origin.url().trim_start_matches("http://").to_owned();
    let inlay = with_settings(
        "hello-rs",
        "",
        &format!("[backends.api]\naddress = {:?}", origin.url()),
    )
    .await;
    let fetch = |url: String| {
        let inlay_url = inlay.url(&format!("/fetch?url={}", urlencode(&url)));
        async move { get(&inlay_url).await.text() }
    };
    // By the backend's name, and by its address.
    let by_name = fetch("http://api/resp?body=from-origin".into()).await;
    assert_eq!(by_name, "200 from-origin");
    let by_address = fetch(format!("http://{authority}/resp?body=again")).await;
    assert_eq!(by_address, "200 again");
    assert_eq!(origin.count("/resp").await, 2);
    // Anything else is refused before it leaves: no open SSRF.
    let other = common::unused_port();
    for url in [
        "http://example.com/".to_owned(),
        format!("http://127.0.0.1:{other}/"),
        "http://localhost/".to_owned(),
    ] {
        let answer = fetch(url.clone()).await;
        assert!(answer.contains("HttpRequestDenied"), "{url}: {answer}");
    }
    assert_eq!(origin.count("/resp").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_requests_stop_at_max_subrequests() {
    let origin = Origin::start();
    let inlay = with_settings(
        "hello-rs",
        "max_subrequests = 0",
        &format!("[backends.api]\naddress = {:?}", origin.url()),
    )
    .await;
    let url = inlay.url(&format!("/fetch?url={}", urlencode("http://api/resp")));
    let answer = get(&url).await.text();
    assert!(answer.contains("HttpRequestDenied"), "{answer}");
    assert_eq!(origin.count("/resp").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_sees_its_environment_and_only_its_read_only_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), "read from the directory").unwrap();
    let inlay = with_settings(
        "hello-rs",
        &format!(
            "read_only_dir = {:?}\nenv = {{ GREETING = \"hello\" }}",
            dir.path().display().to_string()
        ),
        "",
    )
    .await;
    assert_eq!(get(&inlay.url("/env?name=GREETING")).await.text(), "hello");
    assert_eq!(get(&inlay.url("/env?name=HOME")).await.status, 404);
    assert_eq!(
        get(&inlay.url("/file?path=note.txt")).await.text(),
        "read from the directory"
    );
    // Nothing above it.
    let up = get(&inlay.url("/file?path=../etc%2Fpasswd")).await.text();
    assert!(up.starts_with("error:"), "{up}");

    let bare = serving("hello-rs").await;
    assert_eq!(
        get(&bare.url("/file?path=note.txt")).await.text(),
        "error: no directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_a_changed_component_file_without_dropping_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app.wasm");
    std::fs::copy(component("hello-rs"), &app).unwrap();
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.default]\ncomponent = {:?}\n[admin]\nlisten = \"127.0.0.1:0\"",
            app.display().to_string()
        ))
        .start_in_process()
        .await;
    assert_eq!(
        get(&inlay.url("/hello?before")).await.text(),
        "hello from a Rust component\n"
    );
    // Requests run all through the reload.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = std::sync::Arc::clone(&stop);
        let url = inlay.url("/big?kb=4");
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Not cached: every one runs the component of its generation.
                statuses.push(get(&format!("{url}&n={}", statuses.len())).await.status);
            }
            statuses
        })
    };
    // A cold compile of the 13 MB JavaScript component in a debug build
    // can take longer than the admin call may: compiled once here, the
    // reload finds it in wasmtime's code cache.
    let js = component("hello-js");
    tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&js).unwrap();
        let settings = inlay_runtime::http_component::ComponentSettings::default();
        inlay_runtime::http_component::HttpComponent::load("warm", &js, &bytes, settings)
            .expect("the JavaScript example loads");
    })
    .await
    .unwrap();
    // Written aside and renamed, as a deploy does.
    let next = dir.path().join("app.wasm.new");
    std::fs::copy(component("hello-js"), &next).unwrap();
    std::fs::rename(&next, &app).unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        get(&inlay.url("/hello?after")).await.text(),
        "hello from a JavaScript component\n"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = load.await.unwrap();
    assert!(!statuses.is_empty());
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    // A file that is not a component is refused; the running one stays.
    std::fs::write(&app, b"not wasm").unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_ne!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("backends.default.component"),
        "{}",
        r.text()
    );
    assert_eq!(
        get(&inlay.url("/hello?still")).await.text(),
        "hello from a JavaScript component\n"
    );
}

/// Each language's example: its page with the fragment included, cached.
async fn check_page(name: &str, language: &str) {
    let inlay = serving(name).await;
    let r = get(&inlay.url("/")).await;
    assert_eq!(r.status, 200, "{name}: {}", r.text());
    let fragment = format!("<p>fragment from a {language} component</p>");
    assert!(r.text().contains(&fragment), "{name}: {}", r.text());
    let hello = get(&inlay.url("/hello")).await;
    assert_eq!(hello.text(), format!("hello from a {language} component\n"));
    let again = get(&inlay.url("/hello")).await;
    assert!(again.header("cache-status").unwrap().contains("hit"));
    // Its outgoing requests are refused too.
    let url = inlay.url(&format!("/fetch?url={}", urlencode("http://example.com/")));
    let answer = get(&url).await.text();
    assert!(answer.starts_with("error"), "{name}: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_example_answers_its_page_and_fragment() {
    check_page("hello-js", "JavaScript").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_answers_its_page_and_fragment() {
    check_page("hello-py", "Python").await;
}

#[tokio::test]
async fn a_file_that_is_not_a_component_stops_the_start_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm not really").unwrap();
    let text = format!(
        "[backends.default]\ncomponent = {:?}\n",
        bad.display().to_string()
    );
    let cfg = inlay::config::Config::from_toml(&text).unwrap();
    let err = inlay::startup::Proxy::load(cfg).await.unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("backends.default.component") && err.contains("cannot compile"),
        "{err}"
    );
    let missing = text.replace("bad.wasm", "missing.wasm");
    let err = inlay::startup::Proxy::load(inlay::config::Config::from_toml(&missing).unwrap())
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_calling_itself_stops_at_the_depth_limit() {
    let inlay = serving("hello-rs").await;
    // /fetch of /fetch of /fetch ... of /hello, through its own backend.
    let mut url = "http://default/hello".to_owned();
    for _ in 0..6 {
        url = format!("http://default/fetch?url={}", urlencode(&url));
    }
    let answer = get(&inlay.url(&format!("/fetch?url={}", urlencode(&url)))).await;
    let text = answer.text();
    assert!(
        text.starts_with("200 200 200 200 error") && text.contains("LoopDetected"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_response_bodies_stop_at_max_subrequest_bytes() {
    let origin = Origin::start();
    let inlay = with_settings(
        "hello-rs",
        "max_subrequest_bytes = \"1KiB\"",
        &format!("[backends.api]\naddress = {:?}", origin.url()),
    )
    .await;
    let fetch = |path: &str| {
        let url = inlay.url(&format!(
            "/fetch?url={}",
            urlencode(&format!("http://api{path}"))
        ));
        async move { get(&url).await.text() }
    };
    // Under the budget: the whole body; over it: the body fails at the
    // chunk that crosses it (the example answers what it read before).
    assert_eq!(fetch("/resp?body=small").await, "200 small");
    let cut = fetch("/static/4096").await;
    assert!(
        cut.starts_with("200 ") && cut.len() < 1024 + 4,
        "{} bytes",
        cut.len()
    );
}

/// wasi:http/service 0.3: the page, its fragment, caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_component_answers_its_page_and_fragment() {
    let inlay = serving("hello-p3-rs").await;
    let r = get(&inlay.url("/")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .contains("<p>fragment from a Rust 0.3 component</p>"),
        "{}",
        r.text()
    );
    let hello = get(&inlay.url("/hello")).await;
    assert_eq!(hello.text(), "hello from a Rust 0.3 component\n");
    let again = get(&inlay.url("/hello")).await;
    assert!(again.header("cache-status").unwrap().contains("hit"));
    let urls: Vec<String> = (0..20).map(|i| inlay.url(&format!("/hello?{i}"))).collect();
    let replies = futures_util::future::join_all(urls.iter().map(|u| get(u))).await;
    assert!(replies.iter().all(|r| r.status == 200));
}

/// What `/count` answers `n` times in a row: how many requests the
/// instance that served each had served, that one included.
async fn counts(inlay: &Harness, n: usize) -> Vec<u64> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let r = get(&inlay.url("/count")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        seen.push(r.text().parse().expect("a count"));
    }
    seen
}

/// A 0.3 instance serves request after request, as `wasmtime serve`'s
/// do, up to `requests_per_instance`; `1` gives each request a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_instance_serves_many_requests_up_to_requests_per_instance() {
    let reused = serving("hello-p3-rs").await;
    assert_eq!(counts(&reused, 5).await, [1, 2, 3, 4, 5]);
    let three = with_settings("hello-p3-rs", "requests_per_instance = 3", "").await;
    assert_eq!(counts(&three, 7).await, [1, 2, 3, 1, 2, 3, 1]);
    let fresh = with_settings("hello-p3-rs", "requests_per_instance = 1", "").await;
    assert_eq!(counts(&fresh, 4).await, [1, 1, 1, 1]);
}

/// The bodies of requests for `paths`, sent 150 ms apart (so that each
/// arrives while the ones before it wait, and an instance's event loop is
/// free to take it), all running at once.
async fn staggered(inlay: &Harness, paths: impl Iterator<Item = String>) -> Vec<String> {
    let requests = paths.enumerate().map(|(i, path)| {
        let url = inlay.url(&path);
        async move {
            tokio::time::sleep(Duration::from_millis(150 * i as u64)).await;
            let r = get(&url).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            r.text()
        }
    });
    futures_util::future::join_all(requests).await
}

/// Requests that wait (a timer) share an instance, up to
/// `concurrent_requests_per_instance` of them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_0_3_requests_share_an_instance_up_to_the_concurrent_bound() {
    async fn four_at_once(inlay: &Harness) -> Vec<u64> {
        let mut seen: Vec<u64> = staggered(inlay, (0..4).map(|i| format!("/slow?ms=1200&n={i}")))
            .await
            .into_iter()
            .map(|text| text.parse().expect("a count"))
            .collect();
        seen.sort_unstable();
        seen
    }
    let shared = serving("hello-p3-rs").await;
    assert_eq!(four_at_once(&shared).await, [1, 2, 3, 4]);
    let alone = with_settings("hello-p3-rs", "concurrent_requests_per_instance = 1", "").await;
    assert_eq!(four_at_once(&alone).await, [1, 1, 1, 1]);
}

/// A trap fails its request and ends its instance: the next request gets
/// a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_discards_the_0_3_instance() {
    let inlay = serving("hello-p3-rs").await;
    assert_eq!(counts(&inlay, 2).await, [1, 2]);
    let r = get(&inlay.url("/trap")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let line = inlay.access.json_for("/trap", Duration::from_secs(5)).await;
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.contains("component trapped"), "{line}");
    assert_eq!(counts(&inlay, 2).await, [1, 2]);
}

/// A 0.3 request over its CPU time fails alone, and its instance is not
/// used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_request_over_its_cpu_time_fails_and_discards_its_instance() {
    let inlay = with_settings("hello-p3-rs", "cpu_time = \"100ms\"", "").await;
    assert_eq!(counts(&inlay, 2).await, [1, 2]);
    let started = Instant::now();
    let r = get(&inlay.url("/spin")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(5));
    let line = inlay.access.json_for("/spin", Duration::from_secs(5)).await;
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.contains("CPU time"), "{line}");
    assert_eq!(counts(&inlay, 1).await, [1]);
}

/// A 0.3 request's head is due within the backend's `first_byte_timeout`
/// (a 504, as an origin's) and its run within `request_timeout` (a 502
/// naming it): each fails alone, and the next request gets an instance
/// that is not the late one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_request_past_its_timeouts_fails_alone() {
    for (setting, status, says) in [
        ("first_byte_timeout = \"300ms\"", 504, "first_byte_timeout"),
        ("request_timeout = \"300ms\"", 502, "request_timeout"),
    ] {
        let inlay = with_settings("hello-p3-rs", setting, "").await;
        assert_eq!(counts(&inlay, 2).await, [1, 2]);
        let started = Instant::now();
        let r = get(&inlay.url("/slow?ms=3000")).await;
        assert_eq!(r.status, status, "{setting}: {}", r.text());
        let took = started.elapsed();
        assert!(took < Duration::from_millis(2500), "{setting}: {took:?}");
        let line = inlay
            .access
            .json_for("/slow?ms=3000", Duration::from_secs(5))
            .await;
        let error = line["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{setting}: {line}");
        assert_eq!(counts(&inlay, 1).await, [1], "{setting}");
    }
}

/// A reload gives a 0.3 component new instances, even of an unchanged
/// file: no request of the new generation is served by an old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_serves_from_an_old_0_3_instance() {
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.default]\ncomponent = {:?}\n[admin]\nlisten = \"127.0.0.1:0\"",
            component("hello-p3-rs").display().to_string()
        ))
        .start_in_process()
        .await;
    assert_eq!(counts(&inlay, 3).await, [1, 2, 3]);
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(counts(&inlay, 2).await, [1, 2]);
}

/// Outgoing requests count to the request that made them, also when
/// requests share an instance: each may make `max_subrequests`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_requests_of_0_3_requests_sharing_an_instance_count_to_each() {
    let origin = Origin::start();
    let inlay = with_settings(
        "hello-p3-rs",
        "max_subrequests = 1",
        &format!("[backends.api]\naddress = {:?}", origin.url()),
    )
    .await;
    let fetch = |i: u32| {
        let url = format!("http://api/resp?body=from-origin&delay_ms=800&n={i}");
        format!("/fetch?url={}", urlencode(&url))
    };
    // The first makes its request last, after the others started theirs:
    // it is still counted to itself.
    let first = format!("{}&after_ms=600", fetch(0));
    let paths = std::iter::once(first).chain((1..3).map(fetch));
    for text in staggered(&inlay, paths).await {
        assert_eq!(text, "200 from-origin");
    }
    assert_eq!(origin.count("/resp").await, 3);
    // The instance served them together: the next request is its fourth.
    assert_eq!(counts(&inlay, 1).await, [4]);
}

/// Instance reuse is for 0.3 components: asking it of a 0.2 one is an
/// error at its key.
#[tokio::test]
async fn requests_per_instance_on_a_0_2_component_is_refused() {
    let text = format!(
        "[backends.default]\ncomponent = {:?}\nrequests_per_instance = 8\n",
        component("hello-rs").display().to_string()
    );
    let cfg = inlay::config::Config::from_toml(&text).unwrap();
    let err = inlay::startup::Proxy::load(cfg).await.unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("backends.default.component") && err.contains("fresh instance"),
        "{err}"
    );
}

/// A component backend's health probe is served by the component
/// in-process and drives the director as an origin's does: a component
/// whose probe fails gets no requests, its director's next member does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_backends_probe_drives_its_director() {
    let probe = |url: &str| {
        format!(
            "[backends.{{}}.probe]\nurl = {url:?}\ninterval = \"50ms\"\ntimeout = \"2s\"\nwindow = 2\nthreshold = 1\ninitial = 0\n"
        )
    };
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.broken]\ncomponent = {:?}\n{}\
             [backends.app]\ncomponent = {:?}\n{}\
             [directors.default]\ntype = \"fallback\"\nbackends = [\"broken\", \"app\"]\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            component("hello-rs").display().to_string(),
            probe("/trap").replace("{}", "broken"),
            component("hello-p3-rs").display().to_string(),
            probe("/hello").replace("{}", "app"),
        ))
        .start_in_process()
        .await;
    // Until its first probe answers, a backend is sick (initial = 0).
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let r = get(&inlay.admin_url("/stats")).await;
        let stats: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let backends = &stats["backends"];
        if backends["app"]["healthy"] == true && backends["broken"]["last"].is_string() {
            break stats;
        }
        assert!(Instant::now() < deadline, "no probe result: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let broken = &stats["backends"]["broken"];
    assert_eq!(broken["healthy"], false, "{stats}");
    assert!(
        broken["last"]
            .as_str()
            .unwrap()
            .contains("component trapped"),
        "{stats}"
    );
    // The fallback director skips the sick component.
    for i in 0..3 {
        let r = get(&inlay.url(&format!("/hello?{i}"))).await;
        assert_eq!(r.text(), "hello from a Rust 0.3 component\n");
    }
}

/// A component backend whose probe fails is sick: its requests fail at
/// once with a 503, as a sick origin's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_backend_whose_probe_fails_gets_no_requests() {
    let inlay = with_settings(
        "hello-rs",
        "",
        "[backends.default.probe]\nurl = \"/no-such-page\"\ninterval = \"50ms\"\ninitial = 0\n",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = get(&inlay.url("/hello")).await;
    assert_eq!(r.status, 503, "{}", r.text());
    let line = inlay
        .access
        .json_for("/hello", Duration::from_secs(5))
        .await;
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.contains("sick"), "{line}");
}

/// A response without a `Date` of its own (a component's) gets one, and
/// the date is the time of the response: two answers on one keep-alive
/// connection 1.5 s apart carry dates at least a second apart (hyper's
/// cached date is brought up to date where it is written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_without_its_own_date_gets_the_current_one() {
    let inlay = serving("hello-p3-rs").await;
    let mut s = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    let mut dates = Vec::new();
    for i in 0..2 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        // The cookie makes it a pass: each answer is the component's.
        let head = "GET /hello HTTP/1.1\r\nHost: a\r\nCookie: s=1\r\n\r\n";
        let text = ask(&mut s, head, b"hello from a Rust 0.3 component\n").await;
        let date = text
            .lines()
            .find_map(|l| l.strip_prefix("date: "))
            .unwrap_or_else(|| panic!("no date: {text}"));
        let date = httpdate::parse_http_date(date.trim()).expect("an HTTP date");
        let now = std::time::SystemTime::now();
        let off = now.duration_since(date).unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(3), "date {date:?}, now {now:?}");
        dates.push(date);
    }
    let apart = dates[1].duration_since(dates[0]).unwrap_or_default();
    assert!(apart >= Duration::from_secs(1), "dates {dates:?}");
}
