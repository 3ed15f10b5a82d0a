//! `inlay:policy/sdk`: what a policy's SDK tells the host about it. The
//! SDKs call `default-hook` from their default hooks; the host then runs
//! the built-in rules for that hook itself (see `call.rs`), so a request
//! needs no instance for a hook the policy does not implement.
//!
//! `default-hook` is not a reply the guest depends on: it is neither
//! counted against the host-call cap nor recorded, so replay and catch-up
//! see the same calls whether or not the host knew the hook yet.
//! `builtin-recv-lookup` is a request accessor like `header`: counted,
//! recorded and replayed.

use inlay_core::RequestHead;
use wasmtime::component::Resource;

use crate::bindings::inlay::policy::sdk::{Hook as WitHook, Host};
use crate::errors::Hook;
use crate::policy::state::StoreState;

impl Host for StoreState {
    fn default_hook(&mut self, hook: WitHook) -> wasmtime::Result<()> {
        let hook = match hook {
            WitHook::OnRequest => Hook::OnRequest,
            WitHook::OnBackendResponse => Hook::OnBackendResponse,
            WitHook::OnDeliver => Hook::OnDeliver,
        };
        self.handle().policy().learn_builtin(hook);
        Ok(())
    }

    fn builtin_recv_lookup(&mut self, req: Resource<RequestHead>) -> wasmtime::Result<bool> {
        let rep = req.rep();
        self.call("sdk.builtin-recv-lookup", move |s| {
            Ok(s.request(rep)?.builtin_lookup())
        })
    }
}
