//! The host's wall clock: policies have no other time source (no WASI).
//!
//! ```
//! use inlay_policy::{clock, testing};
//!
//! testing::set_now_unix_ms(1_700_000_000_123);
//! assert_eq!(clock::now_unix_secs(), 1_700_000_000);
//! ```

/// Milliseconds since the Unix epoch (UTC).
pub fn now_unix_ms() -> u64 {
    crate::sys::clock_now_unix_ms()
}

/// Whole seconds since the Unix epoch (UTC).
pub fn now_unix_secs() -> u64 {
    now_unix_ms() / 1000
}
