//! A reload that changes `max_instances` brings a new instance pool: new
//! requests get the new size, requests in flight finish on the old pool,
//! and the old engine goes once nothing of its generation is left.

use super::*;

/// The probe with a pool of `max_instances`, refusing at once when full,
/// without spares (a spare would hold a slot).
fn sized(max_instances: u32) -> PolicySource {
    PolicySource {
        pre_instantiate: false,
        ..probe_source(PolicyLimits {
            max_instances,
            instance_wait_ms: 0,
            ..test_limits()
        })
    }
}

async fn slot_of(max_instances: u32) -> PolicySlot {
    let source = sized(max_instances);
    let engine = PolicyEngine::new(&source.limits).expect("engine");
    PolicySlot::load(&engine, source).await.expect("load")
}

/// `n` calls of `policy` started and held, each past `on_request`.
async fn hold(policy: &LoadedPolicy, n: u32) -> Vec<PolicyCall> {
    let mut calls = Vec::new();
    for i in 0..n {
        let mut call = policy
            .start(FakeServices::new())
            .await
            .unwrap_or_else(|e| panic!("call {i} of {n}: {e}"));
        call.on_request(&mut request(&format!("/held/{i}")))
            .await
            .expect("on_request");
        calls.push(call);
    }
    calls
}

/// The pool size a refused start reports, failing if it was not refused.
async fn refused_at(policy: &LoadedPolicy) -> u32 {
    match policy.start(FakeServices::new()).await {
        Err(PolicyError::PoolExhausted { max_instances, .. }) => max_instances,
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("started although the pool should be full"),
    }
}

/// Runs the rest of a held call's hooks, as a request in flight does.
async fn finish(mut call: PolicyCall) {
    let mut req = request("/held");
    let mut resp = ResponseHead::default();
    call.on_backend_response(&mut req, &mut resp, CacheSettings::default())
        .await
        .expect("on_backend_response");
    call.on_deliver(&mut req, &mut resp)
        .await
        .expect("on_deliver");
    assert_eq!(header(&resp.headers, "x-deliver"), Some("GET"));
}

/// Waits (a bounded while) for `engine` to be dropped.
async fn gone(engine: &crate::engine::WeakEngine) -> bool {
    for _ in 0..500 {
        if !engine.is_alive() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_larger_max_instances_applies_on_reload() {
    let slot = slot_of(2).await;
    let old = slot.current();
    let old_engine = old.engine().downgrade();
    let in_flight = hold(&old, 2).await;
    assert_eq!(refused_at(&old).await, 2);

    let new = slot.reload(sized(5)).await.expect("reload");
    assert_eq!(new.engine().max_instances(), 5);
    assert_eq!(slot.current().generation(), new.generation());
    // Five at once, although the old pool's two are still in use.
    let held = hold(&new, 5).await;
    assert_eq!(refused_at(&new).await, 5);
    // The old generation is still full and still serves its requests.
    assert_eq!(refused_at(&old).await, 2);
    for call in in_flight {
        finish(call).await;
    }
    drop(held);
    assert!(old_engine.is_alive(), "`old` still holds it");
    drop(old);
    assert!(
        gone(&old_engine).await,
        "the old engine outlived its policy"
    );
    assert!(new.engine().downgrade().is_alive());
}

#[tokio::test]
async fn a_smaller_max_instances_limits_new_requests_while_old_ones_finish() {
    let slot = slot_of(4).await;
    let old_engine = slot.current().engine().downgrade();
    let in_flight = hold(&slot.current(), 3).await;

    let new = slot.reload(sized(1)).await.expect("reload");
    let _one = hold(&new, 1).await;
    assert_eq!(refused_at(&new).await, 1);
    assert!(
        old_engine.is_alive(),
        "requests in flight hold the old pool"
    );
    for call in in_flight {
        finish(call).await;
    }
    assert!(
        gone(&old_engine).await,
        "the old engine outlived its last request"
    );
    assert_eq!(refused_at(&slot.current()).await, 1);
}

#[tokio::test]
async fn the_same_max_instances_keeps_the_engine() {
    let slot = slot_of(3).await;
    let old = slot.current();
    let new = slot.reload(sized(3)).await.expect("reload");
    assert_ne!(old.generation(), new.generation());
    assert!(old.engine().same(new.engine()));
    // One pool: the old generation's calls count against the new one's.
    let _held = hold(&old, 3).await;
    assert_eq!(refused_at(&new).await, 3);
}

#[tokio::test]
async fn a_pool_that_cannot_be_made_refuses_the_reload_and_changes_nothing() {
    let slot = slot_of(2).await;
    let before = slot.current();
    // 100 000 slots of two memories reserve far more address space than
    // a 47-bit process has.
    let err = slot
        .reload(sized(100_000))
        .await
        .expect_err("a pool too large for the address space");
    assert!(
        matches!(
            err,
            PolicyError::Engine {
                max_instances: 100_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("cannot make a pool of 100000 policy instances: "),
        "{err}"
    );
    // A file that does not load on a new pool is refused too.
    let err = slot
        .reload(PolicySource {
            path: PathBuf::from("/nonexistent/policy.wasm"),
            ..sized(3)
        })
        .await
        .expect_err("missing file");
    assert!(matches!(err, PolicyError::Io { .. }), "{err}");
    let after = slot.current();
    assert_eq!(after.generation(), before.generation());
    assert!(after.engine().same(before.engine()));
    let _held = hold(&after, 2).await;
    assert_eq!(refused_at(&after).await, 2);
}

/// wasmtime keys its on-disk cache of compiled code by the wasm and the
/// compiler's settings: a resized engine must find the policy compiled,
/// or a reload of a large JS or Python policy would take seconds.
#[test]
fn a_resized_engine_finds_the_policy_compiled_in_the_cache() {
    let compile = |max_instances: u32| {
        let source = sized(max_instances);
        let engine = PolicyEngine::new(&source.limits).expect("engine");
        LoadedPolicy::compile(&engine, source).expect("compile");
        engine.cache_hits()
    };
    // The first compile fills the cache if nothing did before.
    compile(2);
    assert_eq!(compile(7), 1, "the probe was compiled again");
}

/// Worker threads cache the handle of the generation they served last; a
/// replaced generation must still go (its engine, pool and ticker) when
/// its requests end, even on a thread that serves no more requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_resizing_reloads_leave_no_old_engine_behind() {
    let services: Arc<dyn PolicyServices> = FakeServices::new();
    let spares = |max_instances| PolicySource {
        // Spares made ahead hold pool slots too.
        pre_instantiate: true,
        ..sized(max_instances)
    };
    let slot = Arc::new({
        let source = spares(2);
        let engine = PolicyEngine::new(&source.limits).expect("engine");
        PolicySlot::load(&engine, source).await.expect("load")
    });
    let mut engines = Vec::new();
    for n in 0..20u32 {
        let policy = slot.reload(spares(3 + n % 2)).await.expect("reload");
        assert!(
            engines
                .last()
                .is_none_or(|(_, size)| *size != policy.engine().max_instances()),
            "each reload resizes"
        );
        engines.push((policy.engine().downgrade(), policy.engine().max_instances()));
        drop(policy);
        // Requests on both worker threads, as the server's are.
        let requests: Vec<_> = (0..4)
            .map(|i| {
                let slot = Arc::clone(&slot);
                let services = Arc::clone(&services);
                tokio::spawn(async move {
                    let handle = slot.handle(&services);
                    let mut call = handle.start().await.expect("start");
                    call.on_request(&mut request(&format!("/r/{n}/{i}")))
                        .await
                        .expect("on_request");
                })
            })
            .collect();
        for r in requests {
            r.await.expect("request");
        }
    }
    let (current, _) = engines.pop().expect("twenty engines");
    for (i, (engine, _)) in engines.iter().enumerate() {
        assert!(
            gone(engine).await,
            "the engine of reload {i} is still alive"
        );
    }
    assert!(current.is_alive());
    drop(slot);
    assert!(gone(&current).await, "the slot's engine outlived the slot");
}
