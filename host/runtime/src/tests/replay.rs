//! Requests answered from recorded paths (`runtime::memo`) must be what a
//! live instance would have done: same heads, same results, same side
//! effects, each exactly once, whichever hook a request leaves the paths at.

use super::*;

/// The probe with its own tree of recorded paths of `bytes`.
fn replaying_probe(bytes: usize) -> LoadedPolicy {
    LoadedPolicy::compile(
        engine(),
        PolicySource {
            memo_bytes: bytes,
            ..probe_source(test_limits())
        },
    )
    .expect("probe")
}

/// Everything a request's policy decided, to compare a replayed request
/// with a live one.
#[derive(Debug, PartialEq)]
struct Outcome {
    action: RequestAction,
    settings: Option<CacheSettings>,
    method: Method,
    uri: String,
    req_headers: Vec<(String, String)>,
    cache_key_extra: Vec<String>,
    status: StatusCode,
    resp_headers: Vec<(String, String)>,
    esi: EsiOverrides,
}

fn pairs(map: &HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Runs a request through the hooks: `on-request`, `on-backend-response`
/// when `miss`, and `on-deliver`. Returns what it decided and whether it
/// ended with an instance of its own.
async fn run(policy: &LoadedPolicy, path: &str, lang: &str, miss: bool) -> (Outcome, bool) {
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request(path);
    req.headers.insert(
        "accept-language",
        HeaderValue::from_str(lang).expect("lang"),
    );
    let action = call.on_request(&mut req).await.expect("on_request");
    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
    resp.headers
        .insert("server", HeaderValue::from_static("origin/1.0"));
    let settings = if miss {
        let defaults = CacheSettings {
            cacheable: true,
            ttl: Duration::from_secs(60),
            ..CacheSettings::default()
        };
        Some(
            call.on_backend_response(&mut req, &mut resp, defaults)
                .await
                .expect("on_backend_response"),
        )
    } else {
        None
    };
    call.on_deliver(&mut req, &mut resp)
        .await
        .expect("on_deliver");
    let outcome = Outcome {
        action,
        settings,
        method: req.method.clone(),
        uri: req.uri.to_string(),
        req_headers: pairs(&req.headers),
        cache_key_extra: req.cache_key_extra.clone(),
        status: resp.status,
        resp_headers: pairs(&resp.headers),
        esi: call.esi_overrides().clone(),
    };
    (outcome, call.is_live())
}

#[tokio::test]
async fn a_repeated_request_is_answered_from_its_recorded_path() {
    let policy = replaying_probe(1 << 20);
    let live = replaying_probe(0);
    let (expected, _) = run(&live, "/page?x=1", "fr", true).await;

    let (first, first_live) = run(&policy, "/page?x=1", "fr", true).await;
    assert!(
        first_live,
        "nothing recorded yet: the first request runs the guest"
    );
    let (second, second_live) = run(&policy, "/page?x=1", "fr", true).await;
    assert!(!second_live, "the same inputs replay without an instance");
    assert_eq!(first, expected);
    assert_eq!(second, expected);
    let stats = policy.memo_stats().expect("replay is on");
    assert_eq!((stats.live, stats.replayed), (3, 3), "{stats:?}");
    assert!(stats.bytes > 0);
}

#[tokio::test]
async fn an_instance_taking_over_at_a_new_hook_runs_each_hook_once() {
    let policy = replaying_probe(1 << 20);
    // A hit: on-request and on-deliver only.
    let (_, _) = run(&policy, "/page", "fr", false).await;
    let (hit, hit_live) = run(&policy, "/page", "fr", false).await;
    assert!(!hit_live);

    // A miss replays on-request, then needs on-backend-response, which no
    // request has called from there: an instance is brought up, re-runs
    // on-request from the tape, then runs the new hook.
    let (miss, miss_live) = run(&policy, "/page", "fr", true).await;
    assert!(miss_live);
    let (expected, _) = run(&replaying_probe(0), "/page", "fr", true).await;
    assert_eq!(miss, expected);
    assert_eq!(
        header_of(&miss.resp_headers, "x-hooks"),
        Some("request /page,backend-response 60,deliver")
    );
    // Appends made during replay were not made again by the instance.
    assert_eq!(header_of(&miss.req_headers, "x-multi-read"), Some("a|b"));
    assert_eq!(
        miss.req_headers
            .iter()
            .filter(|(k, _)| k == "x-multi")
            .count(),
        2
    );
    // The miss has on-backend-response's three headers on top.
    assert_eq!(hit.resp_headers.len() + 3, miss.resp_headers.len());

    // The new branch was recorded: the next miss replays all three hooks.
    let (again, again_live) = run(&policy, "/page", "fr", true).await;
    assert!(!again_live);
    assert_eq!(again, expected);
}

#[tokio::test]
async fn a_new_reply_mid_hook_hands_over_without_doing_anything_twice() {
    let policy = replaying_probe(1 << 20);
    run(&policy, "/page", "fr", true).await;
    // `accept-language` is read after several calls with side effects
    // (set-header, two appends, remove-header): the reply differs, the
    // instance takes over there.
    let (de, de_live) = run(&policy, "/page", "de", true).await;
    assert!(de_live);
    let (expected, _) = run(&replaying_probe(0), "/page", "de", true).await;
    assert_eq!(de, expected);
    assert_eq!(de.cache_key_extra, vec!["de".to_string()]);
    assert_eq!(
        de.req_headers
            .iter()
            .filter(|(k, _)| k == "x-multi")
            .count(),
        2
    );
    // Both branches replay now.
    for lang in ["fr", "de"] {
        let (outcome, live) = run(&policy, "/page", lang, true).await;
        assert!(!live, "{lang}");
        assert_eq!(outcome.cache_key_extra, vec![lang.to_string()]);
    }
}

#[tokio::test]
async fn calls_that_depend_on_the_world_always_run_live() {
    let policy = replaying_probe(1 << 20);
    for _ in 0..3 {
        let mut call = policy.start(FakeServices::new()).await.expect("start");
        let s = synthetic(
            call.on_request(&mut request("/clock"))
                .await
                .expect("clock"),
        );
        assert!(call.is_live());
        let ms: u64 = std::str::from_utf8(&s.body)
            .expect("utf-8")
            .parse()
            .expect("a time");
        assert!(ms > 1_600_000_000_000);
    }
    // kv replies depend on what other requests stored.
    let services = FakeServices::new();
    for _ in 0..2 {
        let mut call = policy.start(services.clone()).await.expect("start");
        call.on_request(&mut request("/kv")).await.expect("kv");
        assert!(call.is_live());
    }
    let stats = policy.memo_stats().expect("on");
    assert_eq!(stats.replayed, 0, "{stats:?}");
}

#[tokio::test]
async fn failures_are_not_recorded() {
    let policy = replaying_probe(1 << 20);
    for _ in 0..2 {
        let err = run_path(&policy, FakeServices::new(), "/trap")
            .await
            .expect_err("traps");
        assert!(matches!(err, PolicyError::Trap { .. }), "{err}");
        let err = run_path(&policy, FakeServices::new(), "/hostcall-cap")
            .await
            .expect_err("cap");
        assert!(matches!(err, PolicyError::LimitExceeded { .. }), "{err}");
    }
    assert_eq!(policy.memo_stats().expect("on").replayed, 0);
}

#[tokio::test]
async fn full_trees_turn_over_and_answers_stay_right() {
    // A few paths' worth of bytes.
    let policy = replaying_probe(4 << 10);
    let live = replaying_probe(0);
    for round in 0..2 {
        for i in 0..20 {
            let path = format!("/page/{i}");
            let (outcome, _) = run(&policy, &path, "fr", i % 2 == 0).await;
            let (expected, _) = run(&live, &path, "fr", i % 2 == 0).await;
            assert_eq!(outcome, expected, "round {round}, {path}");
        }
    }
    let stats = policy.memo_stats().expect("on");
    assert!(stats.resets > 0, "{stats:?}");
    assert!(stats.bytes <= 4 << 10, "{stats:?}");
}

#[tokio::test]
async fn full_trees_keep_the_paths_requests_walk() {
    // Trees that hold about four paths each.
    let sizing = replaying_probe(1 << 20);
    run(&sizing, "/page/sizing", "fr", false).await;
    let path_bytes = sizing.memo_stats().expect("on").bytes;
    let policy = replaying_probe(path_bytes * 4 * 2 * crate::memo::shard_count());
    assert!(run(&policy, "/page/hot", "fr", false).await.1, "recorded");
    for i in 0..40 {
        // Twice: once the trees have filled, a path is recorded the
        // second time it is taken.
        assert!(run(&policy, &format!("/page/{i}"), "fr", false).await.1);
        run(&policy, &format!("/page/{i}"), "fr", false).await;
        let (outcome, live) = run(&policy, "/page/hot", "fr", false).await;
        assert!(!live, "the popular path was dropped after {i} others");
        assert_eq!(outcome, run(&sizing, "/page/hot", "fr", false).await.0);
    }
    let stats = policy.memo_stats().expect("on");
    assert!(stats.resets >= 5, "{stats:?}");
    // A path walked once, many turns ago, is gone.
    assert!(run(&policy, "/page/0", "fr", false).await.1);
}

#[tokio::test]
async fn once_the_trees_are_full_a_path_is_recorded_the_second_time_it_is_taken() {
    let sizing = replaying_probe(1 << 20);
    run(&sizing, "/page/sizing", "fr", false).await;
    let path_bytes = sizing.memo_stats().expect("on").bytes;
    // Trees that hold about four paths each, filled.
    let policy = replaying_probe(path_bytes * 4 * 2 * crate::memo::shard_count());
    let mut i = 0;
    while policy.memo_stats().expect("on").resets == 0 {
        run(&policy, &format!("/page/{i}"), "fr", false).await;
        i += 1;
        assert!(i < 100, "the trees never filled");
    }
    assert_eq!(policy.memo_stats().expect("on").first_sightings, 0);
    let expected = run(&sizing, "/page/new", "fr", false).await.0;
    for n in 1..=3 {
        let before = policy.memo_stats().expect("on");
        let (outcome, live) = run(&policy, "/page/new", "fr", false).await;
        assert_eq!(outcome, expected, "request {n}");
        let after = policy.memo_stats().expect("on");
        // The first runs live and is remembered; the second runs live and
        // records; the third replays.
        assert_eq!(live, n < 3, "request {n}: {after:?}");
        assert_eq!(
            after.first_sightings - before.first_sightings,
            u64::from(n == 1),
            "request {n}: {after:?}"
        );
    }
}

#[tokio::test]
async fn a_reconfigured_policy_starts_with_no_paths() {
    let policy = replaying_probe(1 << 20);
    run(&policy, "/config", "fr", false).await;
    assert!(!run(&policy, "/config", "fr", false).await.1);
    let source = probe_source(test_limits());
    let changed = policy
        .reconfigured(
            source.name,
            BTreeMap::from([("greeting".to_string(), "bonjour".to_string())]),
            source.limits,
        )
        .expect("valid");
    let (outcome, live) = run(&changed, "/config", "fr", false).await;
    assert!(
        live,
        "config replies of the old generation must not be replayed"
    );
    let RequestAction::Synthetic(s) = outcome.action else {
        panic!("expected a synthetic response");
    };
    assert!(
        String::from_utf8_lossy(&s.body).contains("bonjour"),
        "{:?}",
        s.body
    );
}

fn header_of<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
