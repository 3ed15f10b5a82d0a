//! Releasing a request's instance while it waits (`PolicyCall::release`):
//! the next hook runs in a new instance brought to the same point, so the
//! request sees exactly what one instance would have given it; and a full
//! pool queues requests for a bounded time rather than failing them.

use super::*;

/// What a request's three hooks decided and left in the heads.
#[derive(Debug, PartialEq)]
struct Seen {
    action: RequestAction,
    settings: CacheSettings,
    /// Method, URL, headers, backend and cache-key extras.
    req: (Method, String, HeaderMap, String, Vec<String>),
    status: StatusCode,
    resp_headers: HeaderMap,
    esi: EsiOverrides,
}

/// One request through the three hooks; with `release`, the instance is
/// given back to the pool after each of the first two (as the pipeline
/// does before it waits), and the test checks the slot came back.
async fn three_hooks(policy: &LoadedPolicy, path: &str, release: bool) -> Seen {
    let engine = policy.engine();
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request(path);
    req.headers
        .insert("x-set-method", HeaderValue::from_static("POST"));
    let action = call.on_request(&mut req).await.expect("on_request");
    let released = |call: &mut PolicyCall| {
        if release {
            // A request answered from recorded paths so far has none.
            let had_one = call.is_live();
            let free = engine.free_instances();
            assert_eq!(call.release(), had_one, "a live instance is released");
            assert_eq!(
                engine.free_instances(),
                free + usize::from(had_one),
                "its slot came back"
            );
            assert!(!call.is_live());
            assert!(!call.release(), "nothing left to release");
        }
    };
    released(&mut call);
    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
    resp.headers
        .insert("server", HeaderValue::from_static("origin/1.0"));
    let defaults = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        ..CacheSettings::default()
    };
    let settings = call
        .on_backend_response(&mut req, &mut resp, defaults)
        .await
        .expect("on_backend_response");
    released(&mut call);
    call.on_deliver(&mut req, &mut resp)
        .await
        .expect("on_deliver");
    Seen {
        action,
        settings,
        req: (
            req.method,
            req.uri.to_string(),
            req.headers,
            req.backend,
            req.cache_key_extra,
        ),
        status: resp.status,
        resp_headers: resp.headers,
        esi: call.esi_overrides().clone(),
    }
}

/// The probe on an engine of its own, so that its free slots count only
/// this test's instances.
fn probe_alone(limits: PolicyLimits) -> LoadedPolicy {
    probe_alone_replaying(limits, 0)
}

/// [`probe_alone`] with `memo_bytes` of recorded paths.
fn probe_alone_replaying(limits: PolicyLimits, memo_bytes: usize) -> LoadedPolicy {
    let engine = PolicyEngine::new(&PolicyLimits {
        max_instances: 2,
        ..PolicyLimits::default()
    })
    .expect("engine");
    LoadedPolicy::compile(
        &engine,
        PolicySource {
            pre_instantiate: false,
            memo_bytes,
            ..probe_source(limits)
        },
    )
    .expect("compile")
}

#[tokio::test]
async fn a_released_request_sees_what_one_instance_would_have_given_it() {
    let policy = probe_alone(test_limits());
    for path in ["/page?x=1", "/esi", "/log"] {
        let kept = three_hooks(&policy, path, false).await;
        let released = three_hooks(&policy, path, true).await;
        assert_eq!(released, kept, "{path}");
    }
    // The probe's globals list every hook its instance ran: each hook ran
    // once as far as the request can tell, in order, in one guest state.
    let seen = three_hooks(&policy, "/page?x=1", true).await;
    assert_eq!(
        header(&seen.resp_headers, "x-hooks"),
        Some("request /page?x=1,backend-response 60,deliver")
    );
    assert_eq!(header(&seen.resp_headers, "x-via-count"), Some("1"));
}

#[tokio::test]
async fn released_requests_record_their_paths_and_replay_like_any_other() {
    let live = probe_alone(test_limits());
    let replaying = probe_alone_replaying(test_limits(), 1 << 20);
    let paths = ["/page?x=1", "/esi", "/page?x=2"];
    for round in 0..2 {
        for path in paths {
            let kept = three_hooks(&live, path, false).await;
            let released = three_hooks(&replaying, path, true).await;
            assert_eq!(released, kept, "round {round}: {path}");
        }
    }
    // The first round ran live, released after each of the first two
    // hooks, and still recorded every hook; the second replays them all.
    let stats = replaying.memo_stats().expect("replay is on");
    assert_eq!(
        (stats.replayed, stats.live),
        (9, 9),
        "replayed {}, live {}",
        stats.replayed,
        stats.live
    );
}

#[tokio::test]
async fn a_request_that_read_the_clock_keeps_its_instance() {
    let policy = probe();
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request("/clock");
    call.on_request(&mut req).await.expect("clock");
    assert!(!call.release(), "the clock's reply cannot be given again");
    assert!(call.is_live());
}

#[tokio::test]
async fn a_full_pool_queues_a_request_until_a_slot_is_returned() {
    let policy = probe_alone(PolicyLimits {
        instance_wait_ms: 600_000,
        ..test_limits()
    });
    let _first = policy.start(FakeServices::new()).await.expect("first");
    let second = policy.start(FakeServices::new()).await.expect("second");
    let queued = {
        let policy = policy.clone();
        tokio::spawn(async move { policy.start(FakeServices::new()).await.map(drop) })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!queued.is_finished(), "it waits while the pool is full");
    drop(second);
    queued
        .await
        .expect("task")
        .expect("served once a slot came back");
}

#[tokio::test]
async fn a_request_waits_no_longer_than_instance_wait_for_a_full_pool() {
    let policy = probe_alone(PolicyLimits {
        instance_wait_ms: 20,
        ..test_limits()
    });
    let _held = (
        policy.start(FakeServices::new()).await.expect("first"),
        policy.start(FakeServices::new()).await.expect("second"),
    );
    let err = policy
        .start(FakeServices::new())
        .await
        .expect_err("the pool stays full");
    assert!(
        matches!(err, PolicyError::PoolExhausted { max_instances: 2, waited } if waited == Duration::from_millis(20)),
        "{err}"
    );
    assert_eq!(err.client_status(), StatusCode::SERVICE_UNAVAILABLE);
}
