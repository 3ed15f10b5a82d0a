//! The host side of Inlay policies: loading WebAssembly components that
//! implement `inlay:policy@0.1.0` and running their hooks for a request.
//!
//! ```text
//! PolicyEngine (one per process: pooling allocator, epoch ticker)
//!   └─ PolicySlot (the current policy, swapped by reload)
//!        └─ LoadedPolicy (compiled + pre-instantiated; cheap to clone)
//!             └─ PolicyCall (one request: a fresh store and instance)
//!                  on_request → on_backend_response → on_deliver
//! ```
//!
//! The guest gets the host's capabilities through [`PolicyServices`]; each
//! imported WIT interface is implemented in its own file (`types`, `log`,
//! `config`, `cache`, `kv`, `fetch`, `esi`, `clock`). Every request is bounded by
//! [`PolicyLimits`]: CPU time per hook (epoch interruption), memory, host
//! calls and subrequests. A policy that traps, loops or runs out of memory
//! fails its request with a [`PolicyError`] whose
//! [`client_status`](PolicyError::client_status) is the response to send;
//! the process and other requests are unaffected.

mod bindings;
mod cache;
mod call;
mod clock;
mod config;
mod engine;
mod errors;
mod esi;
mod fetch;
mod kv;
mod limits;
mod log;
mod policy;
mod services;
mod state;
mod types;

#[cfg(test)]
mod tests;

pub use call::{CacheSettings, EsiOverrides, PolicyCall, RequestAction, SyntheticResponse};
pub use engine::{EPOCH_TICK, PolicyEngine};
pub use errors::{Hook, PolicyError};
pub use limits::PolicyLimits;
pub use policy::{LoadedPolicy, PolicySlot, PolicySource};
pub use services::{CachedObject, FetchError, NewObject, PolicyServices, SubRequest, SubResponse};
pub use types::{RequestHead, ResponseHead};
