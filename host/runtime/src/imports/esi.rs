//! `inlay:policy/esi`: the policy's ESI choices for the current response,
//! collected in [`EsiOverrides`](inlay_core::EsiOverrides) for the host's ESI
//! processor.

use crate::bindings::inlay::policy::esi::Host;
use crate::policy::state::StoreState;

impl Host for StoreState {
    fn set_enabled(&mut self, enabled: bool) -> wasmtime::Result<()> {
        self.call("esi.set-enabled", move |s| {
            s.esi.enabled = Some(enabled);
            Ok(())
        })
    }

    fn set_var(&mut self, name: String, value: String) -> wasmtime::Result<()> {
        self.call("esi.set-var", move |s| {
            // Setting a variable twice replaces it, as an assignment would.
            match s.esi.vars.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value.clone(),
                None => s.esi.vars.push((name.clone(), value.clone())),
            }
            Ok(())
        })
    }
}
