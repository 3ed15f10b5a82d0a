//! `inlay:policy/kv`: the policy's persistent key-value store. The
//! namespace is the policy's name, so policies cannot read each other's
//! keys.

use std::time::Instant;

use super::bindings::inlay::policy::kv::{Host, KvError};
use super::state::StoreState;

impl StoreState {
    /// Counts the call and checks the key size; the error to return if any.
    fn kv_enter(&mut self, key: &str) -> Option<KvError> {
        if !self.count_unrepeatable() {
            return Some(KvError::LimitExceeded);
        }
        if key.len() > self.policy().limits.kv_max_key {
            return Some(KvError::TooLarge);
        }
        None
    }
}

impl Host for StoreState {
    fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        let _span = tracing::debug_span!("hostcall", call = "kv.get").entered();
        if let Some(e) = self.kv_enter(&key) {
            return Ok(Err(e));
        }
        // Storage time is the host's, not the guest's CPU time.
        let started = Instant::now();
        let result = self.services().kv_get(&self.policy().name, &key);
        self.clock.exclude(started.elapsed());
        Ok(result.map_err(KvError::Storage))
    }

    fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), KvError>> {
        let _span = tracing::debug_span!("hostcall", call = "kv.set").entered();
        if let Some(e) = self.kv_enter(&key) {
            return Ok(Err(e));
        }
        if value.len() > self.policy().limits.kv_max_value {
            return Ok(Err(KvError::TooLarge));
        }
        // Storage time is the host's, not the guest's CPU time.
        let started = Instant::now();
        let result = self.services().kv_set(&self.policy().name, &key, &value);
        self.clock.exclude(started.elapsed());
        Ok(result.map_err(KvError::Storage))
    }

    fn delete(&mut self, key: String) -> wasmtime::Result<Result<bool, KvError>> {
        let _span = tracing::debug_span!("hostcall", call = "kv.delete").entered();
        if let Some(e) = self.kv_enter(&key) {
            return Ok(Err(e));
        }
        // Storage time is the host's, not the guest's CPU time.
        let started = Instant::now();
        let result = self.services().kv_delete(&self.policy().name, &key);
        self.clock.exclude(started.elapsed());
        Ok(result.map_err(KvError::Storage))
    }
}
