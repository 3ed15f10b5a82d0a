//! Log lines from the policy, written by the host's logger (with the
//! policy's name and the request it was handling).
//!
//! ```
//! use inlay_policy::log;
//!
//! log::info(format_args!("rewrote {} to {}", "/a", "/b"));
//! log::write(log::Level::Warn, "no key configured");
//! ```

use std::fmt::Display;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the policy handled.
    Warn,
    /// Something failed.
    Error,
}

/// Write one log line.
pub fn write(level: Level, message: impl Display) {
    crate::sys::log_write(level, &message.to_string());
}

/// Write a line at [`Level::Trace`].
pub fn trace(message: impl Display) {
    write(Level::Trace, message);
}

/// Write a line at [`Level::Debug`].
pub fn debug(message: impl Display) {
    write(Level::Debug, message);
}

/// Write a line at [`Level::Info`].
pub fn info(message: impl Display) {
    write(Level::Info, message);
}

/// Write a line at [`Level::Warn`].
pub fn warn(message: impl Display) {
    write(Level::Warn, message);
}

/// Write a line at [`Level::Error`].
pub fn error(message: impl Display) {
    write(Level::Error, message);
}
