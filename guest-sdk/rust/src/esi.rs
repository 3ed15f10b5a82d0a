//! Edge Side Includes for the current response.
//!
//! ```
//! use inlay_policy::{esi, testing};
//!
//! esi::set_enabled(true);
//! esi::set_var("country", "NL");
//! assert_eq!(testing::esi_enabled(), Some(true));
//! assert_eq!(testing::esi_vars(), [("country".to_string(), "NL".to_string())]);
//! ```

/// Turn ESI processing of the current response on or off (overrides the
/// origin's `Surrogate-Control` opt-in).
pub fn set_enabled(enabled: bool) {
    crate::sys::esi_set_enabled(enabled);
}

/// Set an ESI variable, readable as `$(name)` in the page.
pub fn set_var(name: &str, value: &str) {
    crate::sys::esi_set_var(name, value);
}
