//! Every example policy through the host, in process against the test
//! origin, and the sandbox fixtures. `headers` and `ab-test` run unchanged
//! for every language's port.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, auth_token as token, get, policy, request, urlencode};

async fn with_policy(origin: &Origin, name: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .arg("--policy")
        .arg(policy(name).display().to_string())
        .start_in_process()
        .await
}

/// The `headers` policy (any language): tracking parameters stripped before
/// lookup, `Server`/`X-Powered-By` removed, `x-inlay-policy` added.
async fn check_headers(name: &str) {
    if name.ends_with("-go") && !common::go_policy_built(name) {
        return;
    }
    let origin = Origin::start();
    let inlay = with_policy(&origin, name).await;
    // Every language's port is snapshot after a warm-up request at load.
    assert!(inlay.policy().prewarmed(), "{name} was not pre-warmed");
    // Its SDK said at load which hooks it leaves to the built-in rules.
    assert_eq!(
        inlay.policy().implemented_hooks(),
        ["on-request", "on-deliver"],
        "{name}"
    );
    let url = inlay.url(
        "/echo?b=2&utm_source=x&a=1&fbclid=f&cc=max-age%3D60&h=Server:Apache&h=X-Powered-By:PHP",
    );
    let r = get(&url).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["query"],
        "b=2&a=1&cc=max-age%3D60&h=Server:Apache&h=X-Powered-By:PHP"
    );
    assert_eq!(r.header("x-inlay-policy"), Some("headers"));
    assert_eq!(r.header("server"), None);
    assert_eq!(r.header("x-powered-by"), None);
    // Other tracking values map to the same cache object.
    let r = get(&inlay.url(
        "/echo?b=2&utm_campaign=y&a=1&gclid=g&cc=max-age%3D60&h=Server:Apache&h=X-Powered-By:PHP",
    ))
    .await;
    assert!(
        r.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        r.headers
    );
    assert_eq!(
        r.header("x-inlay-policy"),
        Some("headers"),
        "on_deliver runs on hits too"
    );
    assert_eq!(origin.count("/echo").await, 1);
}

/// The `ab-test` policy (any language): sticky bucket, exposed to the
/// origin, cached per bucket.
async fn check_ab_test(name: &str) {
    if name.ends_with("-go") && !common::go_policy_built(name) {
        return;
    }
    let origin = Origin::start();
    let inlay = with_policy(&origin, name).await;
    let url = inlay.url("/echo?cc=max-age%3D60");
    let first = get(&url).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let cookie = first
        .header("set-cookie")
        .expect("a new client gets a bucket cookie")
        .to_owned();
    assert!(
        cookie.starts_with("inlay_ab=a;") || cookie.starts_with("inlay_ab=b;"),
        "{cookie}"
    );
    assert!(cookie.contains("Path=/"), "{cookie}");
    let bucket = &cookie["inlay_ab=".len().."inlay_ab=".len() + 1];
    assert_eq!(
        common::echoed(&first, "x-ab-bucket").as_deref(),
        Some(bucket)
    );
    assert_eq!(
        common::echoed(&first, "cookie"),
        None,
        "the bucket cookie does not reach the origin"
    );
    // Same bucket: a hit, and no new cookie.
    let again = request(
        "GET",
        &url,
        &[("cookie", &format!("inlay_ab={bucket}"))],
        Bytes::new(),
    )
    .await;
    assert!(
        again.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        again.headers
    );
    assert_eq!(again.header("set-cookie"), None);
    assert_eq!(
        common::echoed(&again, "x-ab-bucket").as_deref(),
        Some(bucket)
    );
    // The other bucket is its own cache object.
    let other = if bucket == "a" { "b" } else { "a" };
    let r = request(
        "GET",
        &url,
        &[("cookie", &format!("inlay_ab={other}"))],
        Bytes::new(),
    )
    .await;
    assert_eq!(common::echoed(&r, "x-ab-bucket").as_deref(), Some(other));
    assert_eq!(origin.count("/echo").await, 2);
    // Any other cookie still passes, as in the built-in rules.
    let r = request(
        "GET",
        &url,
        &[("cookie", &format!("inlay_ab={other}; session=1"))],
        Bytes::new(),
    )
    .await;
    assert!(
        r.header("cache-status").unwrap().contains("bypass"),
        "{:?}",
        r.headers
    );
    // Sticky: the same client without a cookie gets the same bucket again.
    let r = get(&inlay.url("/echo?cc=max-age%3D60&again=1")).await;
    assert!(
        r.header("set-cookie")
            .unwrap()
            .starts_with(&format!("inlay_ab={bucket};"))
    );
}

macro_rules! per_language {
    ($($lang:ident => $suffix:literal),* $(,)?) => {$(
        mod $lang {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn headers() {
                super::check_headers(concat!("headers", $suffix)).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ab_test() {
                super::check_ab_test(concat!("ab-test", $suffix)).await;
            }
        }
    )*};
}

per_language!(rust => "", javascript => "-js", python => "-py", c => "-c", go => "-go");

/// Go's runtime in a policy instance (the `runtime-go` fixture, on
/// Inlay's WASI preview 1 adapter): its standard library's clock, sleep,
/// goroutines and collector work within a hook, and a panic fails its
/// request alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_runtime_in_a_policy() {
    if !common::go_policy_built("runtime-go") {
        return;
    }
    let origin = Origin::start();
    let inlay = with_policy(&origin, "runtime-go").await;
    assert!(inlay.policy().prewarmed());
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let started = Instant::now();
    let r = get(&inlay.url("/go/time")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let field = |name: &str| -> u128 {
        text.split(' ')
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    // time.Now is the host's clock; time.Sleep(2s) passed in virtual time.
    assert!((before..before + 60_000).contains(&field("now=")), "{text}");
    assert!(
        (2_000_000_000..3_000_000_000).contains(&field("slept=")),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the sleep waited"
    );
    assert_eq!(get(&inlay.url("/go/goroutines")).await.text(), "5050");
    // 8 MiB of garbage a request, 40 requests in instances reused up to
    // 1000 times, a 64 MiB cap: the collector must keep up.
    for i in 0..40 {
        let r = get(&inlay.url(&format!("/go/alloc?i={i}"))).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "allocated"),
            "request {i}"
        );
    }
    // (With INLAY_TEST_REQUESTS_PER_INSTANCE=1 every request has a fresh
    // instance: nothing is reused, and the collector is not exercised.)
    if inlay.policy().requests_per_instance() > 1 {
        assert!(inlay.policy().instance_stats().reused >= 30);
    }
    assert_eq!(get(&inlay.url("/go/print")).await.text(), "printed");
    drop(inlay);
    let inlay = isolated("runtime-go", "", "/go/panic", Duration::from_secs(2)).await;
    let why = failure_of(&inlay, "/go/panic").await;
    assert!(why.contains("policy trapped in on-request"), "{why}");
}

/// A Go policy's hooks make no host call of their own (the runtime's
/// monotonic clock is the adapter's, not the host's), so requests it has
/// seen are replayed like any other language's.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn go_policies_are_replayed() {
    if !common::go_policy_built("headers-go") {
        return;
    }
    let origin = Origin::start();
    let mut inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\nmemo_size = \"4MiB\"\nreplay_always = true",
            policy("headers-go").display().to_string()
        ))
        .start_in_process()
        .await;
    for _round in 0..2 {
        for i in 0..10 {
            let r = get(&inlay.url(&format!("/echo?n={i}&utm_source=x&cc=max-age%3D60"))).await;
            assert_eq!(r.header("x-inlay-policy"), Some("headers"));
        }
    }
    inlay.stop().await;
    let stats = inlay
        .policy()
        .memo_stats()
        .expect("memo_size > 0 records paths");
    // The first round's 10 new URLs run live (on-request and on-deliver);
    // the second round walks their paths.
    assert_eq!((stats.replayed, stats.live), (20, 20), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_policy_passes_cookies_unless_configured() {
    let origin = Origin::start();
    let inlay = with_policy(&origin, "default").await;
    for _ in 0..2 {
        request(
            "GET",
            &inlay.url("/bytes/11?cc=max-age%3D60"),
            &[("cookie", "s=1")],
            Bytes::new(),
        )
        .await;
        get(&inlay.url("/bytes/12?cc=max-age%3D60")).await;
    }
    assert_eq!(origin.count("/bytes/11").await, 2, "cookie requests pass");
    assert_eq!(origin.count("/bytes/12").await, 1, "others are cached");
    let configured = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = \"{}\"\n[policy.config]\ncache_cookies = \"true\"",
            policy("default").display()
        ))
        .start_in_process()
        .await;
    for _ in 0..2 {
        request(
            "GET",
            &configured.url("/bytes/13?cc=max-age%3D60"),
            &[("cookie", "s=1")],
            Bytes::new(),
        )
        .await;
    }
    assert_eq!(origin.count("/bytes/13").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_policy_checks_signed_expiring_tokens() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = \"{}\"\n[policy.config]\nkey = \"s3cret\"",
            policy("auth").display()
        ))
        .start_in_process()
        .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good = token("s3cret", "/bytes/10", now + 600);
    let r = request(
        "GET",
        &inlay.url("/bytes/10"),
        &[("authorization", &format!("Bearer {good}"))],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        get(&inlay.url(&format!("/bytes/10?token={good}")))
            .await
            .status,
        200
    );
    for bad in [
        token("wrong", "/bytes/10", now + 600),
        token("s3cret", "/bytes/10", now - 10),
        token("s3cret", "/bytes/99", now + 600),
        "garbage".to_string(),
    ] {
        let r = request(
            "GET",
            &inlay.url("/bytes/10"),
            &[("authorization", &format!("Bearer {bad}"))],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 403, "{bad}");
    }
    assert_eq!(get(&inlay.url("/bytes/10")).await.status, 403);
    assert_eq!(
        origin.count("/bytes/10").await,
        2,
        "refused requests never reach the origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_policy_answers_at_the_edge() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = \"{}\"\n[policy.config]\n\"/old\" = \"301 /new\"\n\"/blog/*\" = \"308 /news/*\"",
            policy("redirects").display()
        ))
        .start_in_process()
        .await;
    let r = get(&inlay.url("/old?x=1")).await;
    assert_eq!((r.status, r.header("location")), (301, Some("/new?x=1")));
    let r = get(&inlay.url("/blog/2024/post")).await;
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some("/news/2024/post"))
    );
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
    assert_eq!(origin.count("/old").await, 0);
}

/// Run `bad` requests while good ones run on other connections; the bad ones
/// fail with a 5xx within `deadline`, the good ones all succeed. `settings`
/// go into the `[policy]` table; the access log is JSON, so that the test
/// can read why the bad request failed.
async fn isolated(name: &str, settings: &str, bad_path: &str, deadline: Duration) -> Harness {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\n{settings}\n[log]\naccess_log_format = \"json\"",
            policy(name).display().to_string()
        ))
        .start_in_process()
        .await;
    let bad_url = inlay.url(bad_path);
    let bad = tokio::spawn(async move {
        let started = Instant::now();
        let r = get(&bad_url).await;
        (r.status, started.elapsed())
    });
    let mut good = Vec::new();
    for i in 0..20 {
        let u = inlay.url(&format!("/bytes/{}", i + 1));
        good.push(tokio::spawn(async move { get(&u).await.status }));
    }
    for g in good {
        assert_eq!(g.await.unwrap(), 200);
    }
    let (status, took) = bad.await.unwrap();
    assert!((500..600).contains(&status), "{name}: got {status}");
    assert!(took < deadline, "{name}: took {took:?}");
    // Still serving after it.
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
    drop(origin);
    inlay
}

/// Why the request for `url` failed, as its access-log line says.
async fn failure_of(inlay: &Harness, url: &str) -> String {
    let line = inlay.access.json_for(url, Duration::from_secs(5)).await;
    line["error"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_policy_fails_its_request_alone_within_its_deadline() {
    let inlay = isolated("loop", "", "/loop", Duration::from_secs(2)).await;
    let why = failure_of(&inlay, "/loop").await;
    assert!(why.contains("CPU time"), "{why}");
}

/// The `[policy]` CPU budget of the `oom` fixture's tests.
const OOM_CPU_TIME: &str = "cpu_time = \"3s\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_out_of_memory_fails_its_request_alone() {
    // The process's resident memory over many of them: process::memory.
    // A CPU budget the 64 MiB of allocations cannot use up, even on a
    // loaded machine: the memory cap, not the deadline, must stop it.
    let inlay = isolated("oom", OOM_CPU_TIME, "/oom", Duration::from_secs(5)).await;
    let why = failure_of(&inlay, "/oom").await;
    assert!(why.contains("out of memory"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_policy_fails_its_request_alone() {
    let inlay = isolated("trap", "", "/trap", Duration::from_secs(2)).await;
    let why = failure_of(&inlay, "/trap").await;
    // The guest's own panic message goes to the process's stderr:
    // process::diagnostics.
    assert!(why.contains("policy trapped in on-request"), "{why}");
}

/// `capabilities` with `[policy]` settings `settings`.
async fn capabilities(origin: &Origin, settings: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .toml(&format!(
            "[policy]\npath = {:?}\n{settings}",
            policy("capabilities").display().to_string()
        ))
        .start_in_process()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_request_per_instance_no_request_sees_the_state_another_left() {
    // The capabilities fixture keeps every URL it handled in a global and
    // answers `/cap/state` with them. Each request must start from the
    // load-time snapshot: it sees the warm-up request and nothing else.
    let origin = Origin::start();
    let inlay = capabilities(&origin, "requests_per_instance = 1").await;
    assert_eq!(inlay.policy().requests_per_instance(), 1);
    let mut answers = Vec::new();
    for round in 0..4 {
        let urls: Vec<String> = (0..16)
            .map(|i| inlay.url(&format!("/cap/state?secret={round}-{i}")))
            .collect();
        answers.extend(futures_util::future::join_all(urls.iter().map(|u| get(u))).await);
    }
    for r in &answers {
        assert_eq!(r.status, 200);
        assert_eq!(
            r.text(),
            inlay_runtime::warm_request().uri.to_string(),
            "a request saw state left by another"
        );
    }
    // Without pre-warming, a request sees nothing at all.
    let cold = capabilities(&origin, "prewarm = false\nrequests_per_instance = 1").await;
    for i in 0..4 {
        let r = get(&cold.url(&format!("/cap/state?secret={i}"))).await;
        assert_eq!(r.text(), "", "a request saw state left by another");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_worker_threads_requests_share_one_instance_from_the_snapshot() {
    // What the README's policy section says a request can see when
    // instances are reused: what earlier requests served by the same
    // instance left, starting from the warm-up request; and one
    // instantiation serves many requests.
    let origin = Origin::start();
    let inlay = capabilities(&origin, "requests_per_instance = 1000").await;
    let policy = inlay.policy();
    assert_eq!(policy.requests_per_instance(), 1000);
    let before = policy.instance_stats();
    let warm = inlay_runtime::warm_request().uri.to_string();
    let mut saw_another = false;
    for i in 0..40 {
        let r = get(&inlay.url(&format!("/cap/state?n={i}"))).await;
        assert_eq!(r.status, 200);
        let text = r.text();
        let seen: Vec<&str> = text.lines().collect();
        assert_eq!(seen.first(), Some(&warm.as_str()), "{seen:?}");
        // Only earlier requests of this test, in order.
        for (k, url) in seen.iter().skip(1).enumerate() {
            assert!(url.starts_with("/cap/state?n="), "{url}");
            if k > 0 {
                let n = |u: &str| u.rsplit('=').next().unwrap().parse::<u32>().unwrap();
                assert!(n(url) > n(seen[k]), "{seen:?}");
            }
        }
        saw_another |= seen.len() > 1;
    }
    assert!(
        saw_another,
        "no request ran in an instance an earlier one used"
    );
    let used = policy.instance_stats();
    // An instance per worker thread, and a spare made ahead for each.
    assert!(
        used.instantiated - before.instantiated <= 6,
        "{} instances for 40 requests",
        used.instantiated - before.instantiated
    );
    assert!(used.reused >= 30, "{used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_use_kv_cache_fetch_many_and_esi_host_functions() {
    // That kv survives a restart: process::persistence.
    let origin = Origin::start();
    let inlay = with_policy(&origin, "capabilities").await;
    // kv: a counter.
    assert_eq!(get(&inlay.url("/cap/kv")).await.text(), "1");
    assert_eq!(get(&inlay.url("/cap/kv")).await.text(), "2");
    // cache: insert and look up through the host's HTTP cache.
    assert_eq!(get(&inlay.url("/cap/cache-get")).await.status, 404);
    assert_eq!(get(&inlay.url("/cap/cache-put")).await.status, 201);
    assert_eq!(
        get(&inlay.url("/cap/cache-get")).await.text(),
        "from the policy"
    );
    // fetch.send-many: two 300 ms subrequests in parallel.
    let started = Instant::now();
    let r = get(&inlay.url("/cap/compose")).await;
    assert_eq!(r.text(), "abcabcde");
    assert!(
        started.elapsed() < Duration::from_millis(550),
        "not parallel: {:?}",
        started.elapsed()
    );
    // esi: turned on by the policy for a page that did not opt in, with a variable.
    let markup = "<esi:vars>hello $(WHO)</esi:vars><esi:include src=\"/bytes/2\"/>";
    let r = get(&inlay.url(&format!("/cap/esi?ct=text/html&body={}", urlencode(markup)))).await;
    assert_eq!(r.text(), "hello policyab");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn repeated_requests_replay_the_policy_and_clients_see_the_same_responses() {
    // Without instances for requests a policy has seen before, what every
    // client gets must be what a live instance gives: the same headers,
    // the same tracking parameters stripped, on hits and misses alike.
    //
    // One worker thread (the runtime's flavor above), so one tree of
    // recorded paths: which requests replay does not depend on which
    // thread a connection lands on.
    //
    // `replaying` walks the trees for every request (`replay_always`), so
    // that which hooks replay is known; `measured` is the default, where
    // the thread sends some requests live without walking (the 32nd at
    // least, to measure that way's cost): its clients must see the same
    // too.
    let origin = Origin::start();
    let start = |memo: &str, always: bool| {
        Harness::builder()
            .backend(&origin)
            .toml(&format!(
                "[policy]\npath = {:?}\nmemo_size = {memo:?}\nreplay_always = {always}",
                policy("headers").display().to_string()
            ))
            .start_in_process()
    };
    let mut replaying = start("4MiB", true).await;
    let live = start("0", false).await;
    let mut measured = start("4MiB", false).await;
    let paths: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "/echo?n={}&utm_source=s{i}&cc=max-age%3D60&h=Server:Apache&h=X-Powered-By:PHP",
                i % 4
            )
        })
        .collect();
    let hosts = [
        replaying.addr.to_string(),
        live.addr.to_string(),
        measured.addr.to_string(),
    ];
    // What a client sees, without what differs by time or by server port
    // (the origin echoes the Host header).
    let seen = |r: &common::Reply| {
        let mut h: Vec<(String, String)> = r
            .headers
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "date" | "age"))
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        h.sort();
        let body = hosts
            .iter()
            .fold(r.text(), |body, host| body.replace(host.as_str(), "HOST"));
        (r.status, h, body)
    };
    for round in 0..2 {
        for path in &paths {
            // One id for both: a minted one differs by server.
            let id = [("x-request-id", "same-id")];
            let a = request("GET", &replaying.url(path), &id, Bytes::new()).await;
            let b = request("GET", &live.url(path), &id, Bytes::new()).await;
            let c = request("GET", &measured.url(path), &id, Bytes::new()).await;
            assert_eq!(a.header("x-inlay-policy"), Some("headers"), "{path}");
            assert_eq!(a.header("server"), None, "{path}");
            assert_eq!(seen(&a), seen(&b), "round {round}, {path}");
            assert_eq!(seen(&c), seen(&b), "round {round}, {path}");
        }
    }
    measured.stop().await;
    let stats = measured.policy().memo_stats().expect("memo_size > 0");
    assert!(stats.unreplayed >= 1, "{stats:?}");
    assert_eq!(stats.replayed + stats.live, 160, "{stats:?}");
    replaying.stop().await;
    let stats = replaying
        .policy()
        .memo_stats()
        .expect("memo_size > 0 records paths");
    // 80 requests, on-request and on-deliver each (`headers` does not
    // implement on-backend-response: the host runs the built-in rules for
    // it, so a miss and a hit take the same path). The policy reads the
    // whole URL, so the first round (40 new URLs) runs live and records;
    // the second replays all of it.
    assert_eq!(
        (stats.replayed, stats.live),
        (80, 80),
        "replayed {}, live {}",
        stats.replayed,
        stats.live
    );
}

/// A hostile policy (`tests/fixtures/framing-guest`) sets Content-Length,
/// Transfer-Encoding, Connection, Upgrade and Keep-Alive in every hook, none
/// of them true. The host frames every body itself: the backend request,
/// the response stored and delivered, and the policy's synthetic answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_cannot_change_how_bodies_are_framed() {
    let origin = Origin::start();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/framing.core.wasm");
    let inlay = Harness::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(fixture.display().to_string())
        .start_in_process()
        .await;
    let hop_by_hop = ["transfer-encoding", "connection", "upgrade", "keep-alive"];
    // A miss (stored while it streams), then a hit from the store.
    for round in ["miss", "hit"] {
        let r = get(&inlay.url("/bytes/100?cc=max-age%3D60")).await;
        assert_eq!(r.status, 200, "{round}");
        assert_eq!(r.body.len(), 100, "{round}");
        assert_eq!(r.header("content-length"), Some("100"), "{round}");
        assert_eq!(r.header("x-policy"), Some("delivered"), "{round}");
        for name in hop_by_hop {
            assert_eq!(r.header(name), None, "{round}: {name}");
        }
    }
    assert_eq!(origin.count("/bytes/100").await, 1);
    // The client's body reaches the origin as the client framed it.
    let r = request(
        "POST",
        &inlay.url("/echo"),
        &[],
        Bytes::from_static(b"hello"),
    )
    .await;
    assert_eq!(r.status, 200);
    let seen: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(seen["body_len"], 5, "{seen}");
    assert_eq!(common::echoed(&r, "content-length").as_deref(), Some("5"));
    assert_eq!(common::echoed(&r, "transfer-encoding"), None);
    assert_eq!(common::echoed(&r, "connection"), None);
    // A synthetic answer is framed by its own body.
    let r = get(&inlay.url("/framing/synthetic")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "synthetic body");
    assert_eq!(r.header("content-length"), Some("14"));
    for name in hop_by_hop {
        assert_eq!(r.header(name), None, "synthetic: {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_a_slow_backend_hold_no_policy_instance() {
    // A pool of two instances and four requests stuck on a backend that
    // does not answer: a cache hit through the policy must still be served.
    // Replay and spares are off, so every request needs an instance of its
    // own (a spare would hold a slot, a replayed hit none).
    const SLOW: usize = 4;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\nmax_instances = 2\nmemo_size = 0\npre_instantiate = false",
            policy("headers").display().to_string()
        ))
        .start_in_process()
        .await;
    let cached = inlay.url("/echo?cc=max-age%3D60");
    assert_eq!(get(&cached).await.status, 200);
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let u = inlay.url(&format!("/hang?max_ms=60000&n={i}"));
        slow.push(tokio::spawn(async move { get(&u).await.status }));
    }
    // Every slow request has passed its policy's on-request and waits on
    // the origin (or one was refused an instance: it ends at once).
    while origin.count("/hang").await < SLOW as u64 {
        if let Some(done) = slow.iter_mut().find(|s| s.is_finished()) {
            let status = done.await.unwrap();
            panic!("a request for the slow backend ended early with {status}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hit = get(&cached).await;
    assert_eq!(hit.status, 200, "{}", hit.text());
    assert!(hit.header("cache-status").unwrap().contains("hit"));
    assert_eq!(hit.header("x-inlay-policy"), Some("headers"));
    assert!(
        slow.iter().all(|s| !s.is_finished()),
        "the hit was answered only after the slow requests"
    );
    for s in slow {
        s.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_in_line_for_a_full_pool_instead_of_failing() {
    // One instance, held by a hook that waits on its own subrequests
    // (300 ms at the origin): another request waits for it, up to
    // `instance_wait`, rather than getting a 503 at once.
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\nmax_instances = 1\nmemo_size = 0\npre_instantiate = false\ninstance_wait = \"60s\"",
            policy("capabilities").display().to_string()
        ))
        .start_in_process()
        .await;
    let compose_url = inlay.url("/cap/compose");
    let compose = tokio::spawn(async move { get(&compose_url).await });
    // The hook is running: its subrequests reached the origin.
    while origin.count("/bytes/3").await < 1 {
        assert!(
            !compose.is_finished(),
            "compose ended before its subrequest"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = get(&inlay.url("/cap/state")).await;
    assert_eq!(queued.status, 200, "{}", queued.text());
    let compose = compose.await.unwrap();
    assert_eq!(compose.text(), "abcabcde");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_another_requests_fetch_hold_no_policy_instance() {
    // Four requests for one object: one fetches it from a backend that
    // does not answer, three wait for that fetch in the cache. None of
    // them may hold one of the pool's two instances meanwhile.
    const WAITING: usize = 4;
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\nmax_instances = 2\nmemo_size = 0\npre_instantiate = false",
            policy("headers").display().to_string()
        ))
        .start_in_process()
        .await;
    let cached = inlay.url("/echo?cc=max-age%3D60");
    assert_eq!(get(&cached).await.status, 200);
    let engine = inlay.policy().engine().clone();
    let mut waiting = Vec::new();
    for _ in 0..WAITING {
        let u = inlay.url("/hang?max_ms=60000&cc=max-age%3D60");
        waiting.push(tokio::spawn(async move { get(&u).await.status }));
    }
    // One reached the origin and every instance is back in the pool: the
    // others passed on-request and wait in the cache (or one was refused
    // an instance and ended).
    while origin.count("/hang").await < 1 || engine.free_instances() < 2 {
        if let Some(done) = waiting.iter_mut().find(|s| s.is_finished()) {
            let status = done.await.unwrap();
            panic!("a waiting request ended early with {status}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hit = get(&cached).await;
    assert_eq!(hit.status, 200, "{}", hit.text());
    assert_eq!(hit.header("x-inlay-policy"), Some("headers"));
    assert!(waiting.iter().all(|s| !s.is_finished()));
    assert_eq!(
        origin.count("/hang").await,
        1,
        "the others waited on its fetch"
    );
    for s in waiting {
        s.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_subrequest_carries_the_request_id() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(policy("capabilities").display().to_string())
        .start_in_process()
        .await;
    // The fixture answers with what its subrequest to /echo carried.
    let r = request(
        "GET",
        &inlay.url("/cap/fetch-echo"),
        &[("x-request-id", "trace-42")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        common::echoed(&r, "x-request-id").as_deref(),
        Some("trace-42")
    );
    // A minted id, too: the one the client gets back.
    let r = get(&inlay.url("/cap/fetch-echo")).await;
    let id = r.header("x-request-id").expect("minted").to_owned();
    assert_eq!(common::echoed(&r, "x-request-id"), Some(id));
}
