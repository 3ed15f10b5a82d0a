//! The policy's own settings, from `[policy.config]` in the host config.
//! Read them once when the policy is constructed (its `Default`).
//!
//! ```
//! use inlay_policy::{config, testing};
//!
//! testing::set_config("cache_cookies", "true");
//! assert!(config::flag("cache_cookies"));
//! assert_eq!(config::get("missing"), None);
//! assert_eq!(config::get_or("greeting", "hello"), "hello");
//! ```

/// One setting, if present.
pub fn get(key: &str) -> Option<String> {
    crate::sys::config_get(key)
}

/// One setting, or `default` when absent.
pub fn get_or(key: &str, default: &str) -> String {
    get(key).unwrap_or_else(|| default.to_owned())
}

/// Whether a setting is on: `true`, `yes`, `on` or `1` (any case).
/// Absent or anything else is off.
pub fn flag(key: &str) -> bool {
    get(key).is_some_and(|v| {
        ["true", "yes", "on", "1"]
            .iter()
            .any(|on| v.trim().eq_ignore_ascii_case(on))
    })
}

/// Every setting, as `(key, value)` pairs.
pub fn all() -> Vec<(String, String)> {
    crate::sys::config_all()
}
