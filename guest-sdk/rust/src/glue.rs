//! The generated `handler` export, forwarding to a [`Policy`].

use std::any::Any;
use std::cell::OnceCell;
use std::marker::PhantomData;

use crate::bindings::exports::inlay::policy::handler::Guest;
use crate::bindings::inlay::policy::types as wit;
use crate::{Action, CacheSettings, Policy, Request, Response};

/// Implements the generated `Guest` trait for `P`; named by [`crate::export!`].
pub struct Glue<P>(PhantomData<P>);

thread_local! {
    /// The policy value of this instance, made on the first hook call.
    static POLICY: OnceCell<Box<dyn Any>> = const { OnceCell::new() };
}

fn with_policy<P: Policy, R>(f: impl FnOnce(&P) -> R) -> R {
    POLICY.with(|cell| {
        let policy = cell.get_or_init(|| {
            install_panic_hook();
            Box::new(P::default())
        });
        match policy.downcast_ref::<P>() {
            Some(policy) => f(policy),
            // Only one policy type is exported per component, so this is
            // unreachable; a fresh value is still the correct behaviour.
            None => f(&P::default()),
        }
    })
}

/// Send panic messages to the host's log before the instance traps
/// (wasm32-unknown-unknown has no stderr).
#[cfg(target_arch = "wasm32")]
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        crate::log::error(format_args!("policy panicked: {info}"));
    }));
}

/// Native tests keep the test harness's panic output.
#[cfg(not(target_arch = "wasm32"))]
fn install_panic_hook() {}

impl<P: Policy> Guest for Glue<P> {
    fn on_request(req: &wit::Request) -> wit::RequestAction {
        let req = Request::from_host(req);
        match with_policy(|p: &P| p.on_request(&req)) {
            Action::Lookup => wit::RequestAction::Lookup,
            Action::Pass => wit::RequestAction::Pass,
            Action::Synthetic(r) => wit::RequestAction::Synthetic(wit::SyntheticResponse {
                status: r.status,
                headers: r.headers,
                body: r.body,
            }),
        }
    }

    fn on_backend_response(
        req: &wit::Request,
        resp: &wit::Response,
        settings: wit::CacheSettings,
    ) -> wit::CacheSettings {
        let req = Request::from_host(req);
        let resp = Response::from_host(resp);
        let settings = CacheSettings {
            cacheable: settings.cacheable,
            ttl: settings.ttl,
            grace: settings.grace,
            keep: settings.keep,
            surrogate_keys: settings.surrogate_keys,
            esi: settings.esi,
        };
        let s = with_policy(|p: &P| p.on_backend_response(&req, &resp, settings));
        wit::CacheSettings {
            cacheable: s.cacheable,
            ttl: s.ttl,
            grace: s.grace,
            keep: s.keep,
            surrogate_keys: s.surrogate_keys,
            esi: s.esi,
        }
    }

    fn on_deliver(req: &wit::Request, resp: &wit::Response) {
        let req = Request::from_host(req);
        let resp = Response::from_host(resp);
        with_policy(|p: &P| p.on_deliver(&req, &resp));
    }
}
