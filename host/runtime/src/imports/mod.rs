//! The host side of the WIT interfaces a policy imports, one file per
//! interface; each implements that interface's `Host` trait on the
//! request's [`StoreState`](crate::policy::state::StoreState).

mod cache;
mod clock;
mod config;
mod esi;
mod fetch;
mod kv;
pub(crate) mod log;
mod sdk;
pub(crate) mod types;

use std::time::Instant;

use futures_util::future::BoxFuture;
use tracing::Instrument;

use crate::policy::state::StoreState;

/// How an interface that awaits the host's storage reports its failures.
trait StorageError {
    /// The request's host-call cap is reached.
    fn limit_exceeded() -> Self;
    /// The storage failed; the message says how.
    fn storage(message: String) -> Self;
}

impl StoreState {
    /// Runs one storage call (cache, kv) for the guest: counts it (its
    /// reply depends on the world, so it ends a recorded path), returns
    /// `check`'s refusal if any, else awaits what `op` starts, with the
    /// time not charged to the guest, and maps the storage's failures.
    async fn storage_call<T, E: StorageError>(
        &mut self,
        name: &'static str,
        check: Result<(), E>,
        op: impl FnOnce(&StoreState) -> Result<BoxFuture<'static, Result<T, String>>, E>,
    ) -> wasmtime::Result<Result<T, E>> {
        let span = tracing::debug_span!("hostcall", call = name);
        if !self.count_unrepeatable() {
            return Ok(Err(E::limit_exceeded()));
        }
        if let Err(e) = check {
            return Ok(Err(e));
        }
        let future = match op(self) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        self.clock.host_call_starts();
        let started = Instant::now();
        let result = self.bounded(future.instrument(span)).await;
        self.clock.exclude(started.elapsed());
        match result {
            Some(result) => Ok(result.map_err(E::storage)),
            None => Ok(Err(E::storage(format!(
                "{name} timed out: the hook waited {:?} on the host",
                self.policy().limits.host_wait()
            )))),
        }
    }
}
