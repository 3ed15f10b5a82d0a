//! `inlay:policy/config`: the policy's own settings, from the host config
//! (`PolicySource::config`).

use super::bindings::inlay::policy::config::Host;
use super::state::StoreState;

impl Host for StoreState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        let _span = self.hostcall("config.get")?;
        Ok(self.policy.config.get(&key).cloned())
    }

    fn all(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        let _span = self.hostcall("config.all")?;
        Ok(self
            .policy
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
