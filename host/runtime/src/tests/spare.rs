//! Instances made ahead (`pre_instantiate`): a request that finds one runs
//! exactly as one that instantiates, sees nothing of earlier requests, and
//! a spare holds one pool slot, given back when its handle goes.

use super::*;

/// Waits (a bounded while) for the handle's spare to be made.
async fn spare_made(handle: &PolicyHandle) -> bool {
    for _ in 0..500 {
        if handle.has_spare() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn compiled(engine: &PolicyEngine, pre_instantiate: bool) -> LoadedPolicy {
    LoadedPolicy::compile(
        engine,
        PolicySource {
            pre_instantiate,
            // A spare is a fresh instance; reuse has its own tests.
            requests_per_instance: 1,
            ..probe_source(test_limits())
        },
    )
    .expect("probe")
}

#[tokio::test]
async fn a_request_starts_from_the_instance_made_ahead_and_sees_nothing_before_it() {
    let policy = compiled(engine(), true);
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    assert_eq!(
        hooks_seen(&handle, "/one").await,
        "request /one,backend-response 60,deliver"
    );
    assert_eq!(policy.instances_started_ahead(), 0, "nothing was ready yet");
    for (n, path) in ["/two", "/three"].into_iter().enumerate() {
        assert!(
            spare_made(&handle).await,
            "a spare is made after {n} requests"
        );
        assert_eq!(
            hooks_seen(&handle, path).await,
            format!("request {path},backend-response 60,deliver"),
            "the spare's instance ran this request's hooks only"
        );
        assert_eq!(policy.instances_started_ahead(), n as u64 + 1);
    }
}

#[tokio::test]
async fn no_instance_is_made_ahead_when_turned_off_or_for_one_off_handles() {
    let off = compiled(engine(), false);
    let handle = PolicyHandle::keeping_instances(off.clone(), FakeServices::new());
    let on = compiled(engine(), true);
    // `LoadedPolicy::start` makes a handle for one request: a spare would
    // be thrown away.
    let one_off = PolicyHandle::new(on.clone(), FakeServices::new());
    for path in ["/a", "/b"] {
        hooks_seen(&handle, path).await;
        hooks_seen(&one_off, path).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!handle.has_spare() && !one_off.has_spare());
    assert_eq!(off.instances_started_ahead(), 0);
    assert_eq!(on.instances_started_ahead(), 0);
}

#[tokio::test]
async fn a_spare_holds_a_pool_slot_until_a_request_needs_it_or_its_handle_goes() {
    let small = PolicyEngine::new(&PolicyLimits {
        max_instances: 2,
        instance_wait_ms: 0,
        ..PolicyLimits::default()
    })
    .expect("engine");
    let policy = compiled(&small, true);
    let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
    let running = handle.start().await.expect("first slot");
    assert!(spare_made(&handle).await, "the spare takes the second slot");
    assert_eq!(
        small.free_instances(),
        1,
        "a spare's slot is there for the taking"
    );
    // A request of another handle finds the pool full: the spare gives
    // its slot up rather than the request failing.
    let other = policy
        .start(FakeServices::new())
        .await
        .expect("the spare's slot");
    assert!(!handle.has_spare());
    assert_eq!(small.free_instances(), 0);
    let err = policy
        .start(FakeServices::new())
        .await
        .expect_err("the pool is full");
    assert_eq!(err.client_status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(other);
    // The handle's next request makes a spare again once a slot is free.
    let second = handle.start().await.expect("a slot");
    drop((running, second));
    assert_eq!(
        hooks_seen(&handle, "/after").await,
        "request /after,backend-response 60,deliver"
    );
    // Dropping the handle drops its spare and returns its slot.
    assert!(spare_made(&handle).await);
    drop(handle);
    let _a = policy.start(FakeServices::new()).await.expect("slot one");
    let _b = policy.start(FakeServices::new()).await.expect("slot two");
}
