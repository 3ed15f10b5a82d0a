//! Hooks a policy does not implement: once its SDK said so
//! (`inlay:policy/sdk`, `default-hook`), the host runs the built-in rules
//! for them itself, and a request that meets no other hook needs no
//! instance. The probe predates the `sdk` interface, so these tests tell
//! the policy what an SDK would; the example policies show the SDKs do.

use super::*;

fn probe_with_memo(memo_bytes: usize) -> LoadedPolicy {
    LoadedPolicy::compile(
        engine(),
        PolicySource {
            pre_instantiate: false,
            memo_bytes,
            ..probe_source(test_limits())
        },
    )
    .expect("probe")
}

fn miss_settings() -> CacheSettings {
    CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(60),
        surrogate_keys: vec!["k".into()],
        ..CacheSettings::default()
    }
}

#[tokio::test]
async fn a_policy_implementing_no_hook_costs_no_instance_and_follows_the_builtin_rules() {
    for memo_bytes in [0, 1 << 20] {
        let policy = probe_with_memo(memo_bytes);
        assert_eq!(
            policy.implemented_hooks(),
            ["on-request", "on-backend-response", "on-deliver"],
            "until its SDK says otherwise"
        );
        for hook in [Hook::OnRequest, Hook::OnBackendResponse, Hook::OnDeliver] {
            policy.learn_builtin(hook);
        }
        assert!(policy.implemented_hooks().is_empty());
        let before = policy.instance_stats();
        let handle = PolicyHandle::keeping_instances(policy.clone(), FakeServices::new());
        for (method, cookie, expected) in [
            (Method::GET, false, RequestAction::Lookup),
            (Method::HEAD, false, RequestAction::Lookup),
            (Method::GET, true, RequestAction::Pass),
            (Method::POST, false, RequestAction::Pass),
        ] {
            let mut call = handle.start().await.expect("start");
            let mut req = request("/trap");
            req.method = method;
            if !cookie {
                req.headers.remove("cookie");
            }
            assert_eq!(
                call.on_request(&mut req).await.expect("on_request"),
                expected
            );
            let mut resp = ResponseHead {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
            };
            let settings = call
                .on_backend_response(&mut req, &mut resp, miss_settings())
                .await
                .expect("on_backend_response");
            assert_eq!(settings, miss_settings());
            call.on_deliver(&mut req, &mut resp)
                .await
                .expect("on_deliver");
            assert!(resp.headers.is_empty(), "nothing ran in the guest");
            assert!(!call.is_live());
        }
        let after = policy.instance_stats();
        assert_eq!(after.instantiated, before.instantiated, "no instance");
        assert_eq!(after.requests - before.requests, 4);
        assert_eq!(after.ran_guest, 0);
    }
}

#[tokio::test]
async fn an_implemented_hook_after_a_builtin_one_gets_the_instance() {
    let policy = probe_with_memo(0);
    policy.learn_builtin(Hook::OnRequest);
    assert_eq!(
        policy.implemented_hooks(),
        ["on-backend-response", "on-deliver"]
    );
    let mut call = policy.start(FakeServices::new()).await.expect("start");
    let mut req = request("/trap");
    req.headers.remove("cookie");
    // The probe's own on-request would trap on this path.
    assert_eq!(
        call.on_request(&mut req).await.expect("on_request"),
        RequestAction::Lookup
    );
    assert!(!call.is_live());
    let mut resp = ResponseHead {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
    };
    call.on_backend_response(&mut req, &mut resp, miss_settings())
        .await
        .expect("on_backend_response");
    assert!(call.is_live());
    assert_eq!(
        header(&resp.headers, "x-hooks"),
        Some("backend-response 60"),
        "the instance ran only the hooks the policy implements"
    );
    drop(call);
    assert_eq!(policy.instance_stats().ran_guest, 1);
}
