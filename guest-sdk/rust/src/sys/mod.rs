//! Where capability calls go: the host's imports on wasm32, the thread-local
//! test double of [`crate::testing`] everywhere else (so policies unit-test
//! natively with `cargo test`).

#[cfg(target_arch = "wasm32")]
mod wasm;
#[cfg(target_arch = "wasm32")]
pub(crate) use wasm::*;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use crate::testing::backend::*;

/// A hook of the `handler` interface, for [`default_hook`] (named as the
/// WIT and the host name them).
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    OnRequest,
    OnBackendResponse,
    OnDeliver,
}

impl Hook {
    /// The hook's name in the WIT (for the native test harness, `testing`).
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Hook::OnRequest => "on-request",
            Hook::OnBackendResponse => "on-backend-response",
            Hook::OnDeliver => "on-deliver",
        }
    }
}
