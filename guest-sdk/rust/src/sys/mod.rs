//! Where capability calls go: the host's imports on wasm32, the thread-local
//! test double of [`crate::testing`] everywhere else (so policies unit-test
//! natively with `cargo test`).

#[cfg(target_arch = "wasm32")]
mod wasm;
#[cfg(target_arch = "wasm32")]
pub(crate) use wasm::*;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use crate::testing::backend::*;
