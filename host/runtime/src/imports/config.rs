//! `inlay:policy/config`: the policy's own settings, from the host config
//! (`PolicySource::config`).

use crate::bindings::inlay::policy::config::Host;
use crate::policy::state::StoreState;

impl Host for StoreState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        self.call("config.get", move |s| {
            Ok(s.policy().config.get(&key).cloned())
        })
    }

    fn all(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        self.call("config.all", |s| {
            Ok(s.policy()
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        })
    }
}
