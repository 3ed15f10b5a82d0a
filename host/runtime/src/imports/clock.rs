//! `inlay:policy/clock`: the wall clock. Policies get no WASI, so this is
//! their only time source.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::bindings::inlay::policy::clock::Host;
use crate::policy::state::StoreState;

impl Host for StoreState {
    fn now_unix_ms(&mut self) -> wasmtime::Result<u64> {
        // The time is not a reply a later request would get again.
        if !self.count_unrepeatable() {
            return Err(wasmtime::format_err!(
                "clock.now-unix-ms: host call limit reached or the policy did not repeat itself"
            ));
        }
        let _span = tracing::debug_span!("hostcall", call = "clock.now-unix-ms").entered();
        // A clock set before 1970 reads as the epoch rather than trapping.
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}
