//! `inlay:policy/esi`: the policy's ESI choices for the current response,
//! collected in [`EsiOverrides`](super::EsiOverrides) for the host's ESI
//! processor.

use super::bindings::inlay::policy::esi::Host;
use super::state::StoreState;

impl Host for StoreState {
    fn set_enabled(&mut self, enabled: bool) -> wasmtime::Result<()> {
        let _span = self.hostcall("esi.set-enabled")?;
        self.esi.enabled = Some(enabled);
        Ok(())
    }

    fn set_var(&mut self, name: String, value: String) -> wasmtime::Result<()> {
        let _span = self.hostcall("esi.set-var")?;
        // Setting a variable twice replaces it, as an assignment would.
        match self.esi.vars.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.esi.vars.push((name, value)),
        }
        Ok(())
    }
}
