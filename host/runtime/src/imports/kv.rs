//! `inlay:policy/kv`: the policy's persistent key-value store. The
//! namespace is the policy's name, so policies cannot read each other's
//! keys. Storage is awaited, never called on the guest's thread.

use std::time::Instant;

use futures_util::future::BoxFuture;

use crate::bindings::inlay::policy::kv::{Host, KvError};
use crate::state::StoreState;

impl StoreState {
    /// Runs one kv operation: counts the call, checks the key size, awaits
    /// the storage (time not charged to the guest) and maps its errors.
    async fn kv_call<T>(
        &mut self,
        name: &'static str,
        key: &str,
        op: impl FnOnce(&StoreState) -> Result<BoxFuture<'static, Result<T, String>>, KvError>,
    ) -> wasmtime::Result<Result<T, KvError>> {
        use tracing::Instrument;
        let span = tracing::debug_span!("hostcall", call = name);
        if !self.count_unrepeatable() {
            return Ok(Err(KvError::LimitExceeded));
        }
        if key.len() > self.policy().limits.kv_max_key {
            return Ok(Err(KvError::TooLarge));
        }
        let future = match op(self) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let started = Instant::now();
        let result = future.instrument(span).await;
        self.clock.exclude(started.elapsed());
        Ok(result.map_err(KvError::Storage))
    }
}

impl Host for StoreState {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        self.kv_call("kv.get", &key, |s| {
            Ok(s.services().kv_get(&s.policy().name, &key))
        })
        .await
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), KvError>> {
        self.kv_call("kv.set", &key, |s| {
            if value.len() > s.policy().limits.kv_max_value {
                return Err(KvError::TooLarge);
            }
            Ok(s.services().kv_set(&s.policy().name, &key, value))
        })
        .await
    }

    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<bool, KvError>> {
        self.kv_call("kv.delete", &key, |s| {
            Ok(s.services().kv_delete(&s.policy().name, &key))
        })
        .await
    }
}
