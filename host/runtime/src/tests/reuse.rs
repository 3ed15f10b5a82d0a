//! Instance reuse (`requests_per_instance`, `instance_lifetime`): a worker
//! thread's requests take the instance the previous one finished with, so
//! N requests cost one instantiation and a request sees what earlier ones
//! left in the guest's globals; a failure, a bound or a new generation
//! starts again from the snapshot; with 1 request per instance nothing of
//! one request is seen by another.

use super::*;

/// The probe reusing each instance for up to `requests` requests, with
/// nothing made ahead (so every instantiation is a request's).
fn reusing(requests: u32, lifetime: Duration) -> LoadedPolicy {
    LoadedPolicy::compile(
        engine(),
        PolicySource {
            pre_instantiate: false,
            requests_per_instance: requests,
            instance_lifetime: lifetime,
            ..probe_source(test_limits())
        },
    )
    .expect("probe")
}

/// An engine of `max_instances` (a request waits `wait_ms` for a slot)
/// and the probe on it, reusing instances, nothing made ahead.
fn reusing_in_a_pool(max_instances: u32, wait_ms: u64) -> (PolicyEngine, LoadedPolicy) {
    let engine = PolicyEngine::new(&PolicyLimits {
        max_instances,
        instance_wait_ms: wait_ms,
        ..test_limits()
    })
    .expect("engine");
    let policy = LoadedPolicy::compile(
        &engine,
        PolicySource {
            pre_instantiate: false,
            requests_per_instance: 1000,
            ..probe_source(test_limits())
        },
    )
    .expect("probe");
    (engine, policy)
}

/// What a request on `path` alone leaves in `x-hooks`.
fn alone(path: &str) -> String {
    format!("request {path},backend-response 60,deliver")
}

#[tokio::test]
async fn n_requests_on_a_thread_cost_one_instantiation() {
    let policy = reusing(1000, Duration::from_secs(60));
    let loaded = policy.instance_stats();
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let mut expected = Vec::new();
    for i in 0..10 {
        let path = format!("/r{i}");
        expected.push(alone(&path));
        // The instance ran every earlier request's hooks: what a request
        // can observe of the ones before it.
        assert_eq!(hooks_seen(&handle, &path).await, expected.join(","));
    }
    let stats = policy.instance_stats();
    assert_eq!(stats.instantiated - loaded.instantiated, 1);
    assert_eq!(stats.reused, 9);
    assert_eq!(stats.requests, 10);
    assert_eq!(stats.ran_guest, 10);
    assert_eq!(handle.ready_count(), 1, "kept for the next request");
}

#[tokio::test]
async fn with_one_request_per_instance_no_request_sees_another() {
    let policy = reusing(1, Duration::from_secs(60));
    let loaded = policy.instance_stats();
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    for i in 0..5 {
        let path = format!("/r{i}");
        assert_eq!(hooks_seen(&handle, &path).await, alone(&path));
    }
    let stats = policy.instance_stats();
    assert_eq!(stats.instantiated - loaded.instantiated, 5);
    assert_eq!(stats.reused, 0);
    assert_eq!(handle.ready_count(), 0);
}

#[tokio::test]
async fn after_a_trap_the_next_request_starts_from_the_snapshot() {
    let policy = reusing(1000, Duration::from_secs(60));
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    assert_eq!(hooks_seen(&handle, "/one").await, alone("/one"));
    let mut call = handle.start().await.expect("start");
    let err = call
        .on_request(&mut request("/trap"))
        .await
        .expect_err("trap");
    assert!(matches!(err, PolicyError::Trap { .. }), "{err}");
    drop(call);
    assert_eq!(handle.ready_count(), 0, "the trapped instance is gone");
    assert_eq!(hooks_seen(&handle, "/two").await, alone("/two"));
}

#[tokio::test]
async fn an_instance_that_hit_a_limit_or_was_cut_short_is_not_reused() {
    let policy = reusing(1000, Duration::from_secs(60));
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    // The guest got `limit-exceeded` from kv and carried on: the request
    // succeeds, but the instance is at its limits.
    let mut call = handle.start().await.expect("start");
    let action = call
        .on_request(&mut request("/kv-cap"))
        .await
        .expect("on_request");
    assert!(matches!(action, RequestAction::Synthetic(_)), "{action:?}");
    drop(call);
    assert_eq!(handle.ready_count(), 0, "an instance over a cap is dropped");
    // A hook whose future is dropped mid-call (a client went away).
    assert_eq!(hooks_seen(&handle, "/one").await, alone("/one"));
    let mut call = handle.start().await.expect("start");
    let mut req = request("/loop");
    let cut = tokio::time::timeout(Duration::from_millis(30), call.on_request(&mut req)).await;
    assert!(cut.is_err(), "the loop was still running");
    drop(call);
    assert_eq!(handle.ready_count(), 0, "a cut-short instance is dropped");
    assert_eq!(hooks_seen(&handle, "/two").await, alone("/two"));
}

#[tokio::test]
async fn reuse_ends_at_its_request_count_and_its_lifetime() {
    let policy = reusing(3, Duration::from_secs(60));
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let seen: Vec<String> = {
        let mut seen = Vec::new();
        for i in 0..7 {
            seen.push(hooks_seen(&handle, &format!("/r{i}")).await);
        }
        seen
    };
    // Instances serve /r0-/r2, /r3-/r5, /r6.
    assert_eq!(
        seen[2],
        [alone("/r0"), alone("/r1"), alone("/r2")].join(",")
    );
    assert_eq!(seen[3], alone("/r3"));
    assert_eq!(seen[6], alone("/r6"));

    let short = reusing(1000, Duration::from_millis(100));
    let handle = PolicyHandle::keeping_instances(short.clone(), FakeServices::new());
    hooks_seen(&handle, "/a").await;
    assert_eq!(
        hooks_seen(&handle, "/b").await,
        [alone("/a"), alone("/b")].join(",")
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(hooks_seen(&handle, "/c").await, alone("/c"), "too old");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_serves_from_an_old_instance() {
    let source = PolicySource {
        pre_instantiate: false,
        requests_per_instance: 1000,
        ..probe_source(test_limits())
    };
    let slot = PolicySlot::load(engine(), source.clone())
        .await
        .expect("load");
    let services: Arc<dyn PolicyServices> = FakeServices::new();
    // One thread's requests: the handle keeps the instance between them.
    let before = slot.handle(&services);
    assert_eq!(hooks_seen(&before, "/one").await, alone("/one"));
    assert_eq!(
        hooks_seen(&slot.handle(&services), "/two").await,
        [alone("/one"), alone("/two")].join(",")
    );
    let old = before.policy().clone();
    let old_handle = Arc::downgrade(&before);
    drop(before);
    // The same file again: a new generation, with instances of its own.
    slot.reload(source).await.expect("reload");
    let after = slot.handle(&services);
    assert_ne!(after.policy().generation(), old.generation());
    assert_eq!(hooks_seen(&after, "/three").await, alone("/three"));
    assert!(
        old_handle.upgrade().is_none(),
        "the old generation's handle, and the instance it kept, are gone"
    );
    assert_eq!(old.instance_stats().requests, 2);
}

#[tokio::test]
async fn a_released_instance_serves_the_threads_next_request_meanwhile() {
    let policy = reusing(1000, Duration::from_secs(60));
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let loaded = policy.instance_stats();
    // A miss: on-request, then the request waits on the backend.
    let mut waiting = handle.start().await.expect("start");
    let mut req = request("/slow");
    waiting.on_request(&mut req).await.expect("on_request");
    assert!(waiting.release());
    assert_eq!(handle.ready_count(), 1, "given back while it waits");
    // Another request runs in it meanwhile.
    assert_eq!(
        hooks_seen(&handle, "/fast").await,
        ["request /slow".to_string(), alone("/fast"),].join(",")
    );
    // The backend answered: the instance (kept for reuse) catches up with
    // the waiting request's on-request, answered from its journal.
    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
    let defaults = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        ..CacheSettings::default()
    };
    waiting
        .on_backend_response(&mut req, &mut resp, defaults)
        .await
        .expect("on_backend_response");
    assert_eq!(
        header(&resp.headers, "x-hooks"),
        Some(
            [
                "request /slow".to_string(),
                alone("/fast"),
                "request /slow".to_string(),
                "backend-response 60".to_string(),
            ]
            .join(",")
            .as_str()
        )
    );
    drop(waiting);
    assert_eq!(
        policy.instance_stats().instantiated - loaded.instantiated,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_instances_give_their_slots_to_a_request_that_finds_the_pool_full() {
    let (small, policy) = reusing_in_a_pool(2, 0);
    // Two threads' handles each keep the instance their request used.
    let a = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let b = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let held = a.start().await.expect("a");
    let held_too = b.start().await.expect("b");
    drop((held, held_too));
    assert_eq!(a.ready_count() + b.ready_count(), 2);
    assert_eq!(small.free_instances(), 2, "kept instances count as free");
    // Requests of a third handle take their slots instead of failing.
    let c = PolicyHandle::new(policy.clone(), FakeServices::new());
    let one = c.start().await.expect("a kept instance's slot");
    let two = c.start().await.expect("the other's");
    assert_eq!(a.ready_count() + b.ready_count(), 0);
    let err = c.start().await.expect_err("the pool is full");
    assert_eq!(err.client_status(), StatusCode::SERVICE_UNAVAILABLE);
    drop((one, two));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_goes_back_to_the_pool_when_a_request_waits_in_line() {
    let (small, policy) = reusing_in_a_pool(1, 5_000);
    let a = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let running = a.start().await.expect("the only slot");
    let other = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let queued = tokio::spawn(async move { other.start().await.map(drop) });
    while !small.has_waiters() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Finished while a request waits: the slot goes to it, not to `a`.
    drop(running);
    queued
        .await
        .expect("join")
        .expect("the waiting request got the slot");
    assert_eq!(a.ready_count(), 0);
}
