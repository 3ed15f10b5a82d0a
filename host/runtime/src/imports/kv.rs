//! `inlay:policy/kv`: the policy's persistent key-value store. The
//! namespace is the policy's name, so policies cannot read each other's
//! keys. Storage is awaited, never called on the guest's thread.

use super::StorageError;
use crate::bindings::inlay::policy::kv::{Host, KvError};
use crate::policy::state::StoreState;

impl StorageError for KvError {
    fn limit_exceeded() -> Self {
        KvError::LimitExceeded
    }
    fn storage(message: String) -> Self {
        KvError::Storage(message)
    }
}

impl StoreState {
    /// Refuses keys longer than the policy's limit.
    fn kv_check(&self, key: &str) -> Result<(), KvError> {
        if key.len() > self.policy().limits.kv_max_key {
            return Err(KvError::TooLarge);
        }
        Ok(())
    }
}

impl Host for StoreState {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        let check = self.kv_check(&key);
        self.storage_call("kv.get", check, |s| {
            Ok(s.services().kv_get(&s.policy().name, &key))
        })
        .await
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), KvError>> {
        let check = self.kv_check(&key);
        self.storage_call("kv.set", check, |s| {
            if value.len() > s.policy().limits.kv_max_value {
                return Err(KvError::TooLarge);
            }
            Ok(s.services().kv_set(&s.policy().name, &key, value))
        })
        .await
    }

    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<bool, KvError>> {
        let check = self.kv_check(&key);
        self.storage_call("kv.delete", check, |s| {
            Ok(s.services().kv_delete(&s.policy().name, &key))
        })
        .await
    }
}
