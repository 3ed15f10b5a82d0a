//! The host side of Inlay policies: loading WebAssembly components that
//! implement `inlay:policy@0.1.0` and running their hooks for a request.
//!
//! ```text
//! PolicyEngine (one per pool size: pooling allocator, epoch ticker)
//!   └─ PolicySlot (the current policy, swapped by reload)
//!        └─ LoadedPolicy (compiled + pre-instantiated; cheap to clone)
//!             └─ PolicyCall (one request: a fresh store and instance)
//!                  on_request → on_backend_response → on_deliver
//! ```
//!
//! The guest gets the host's capabilities through [`PolicyServices`]; each
//! imported WIT interface is implemented in its own file under `imports/`
//! (`types`, `log`, `config`, `cache`, `kv`, `fetch`, `esi`, `clock`,
//! `sdk`). Every request is bounded by
//! [`PolicyLimits`]: CPU time per hook (epoch interruption), memory, host
//! calls and subrequests. A policy that traps, loops or runs out of memory
//! fails its request with a [`PolicyError`] whose
//! [`client_status`](PolicyError::client_status) is the response to send;
//! the process and other requests are unaffected.
//!
//! How the limits behave:
//!
//! * CPU time is checked by epoch interruption (a 1 ms ticker thread). It
//!   is wall time while the guest runs, minus time awaiting the host
//!   (cache, kv, fetch) and time yielded to the executor: a policy waiting
//!   on a subrequest is not charged, but on an overloaded machine being
//!   descheduled is. A running guest yields to tokio every 5 ms, so a busy
//!   policy shares its worker; at the budget the hook fails with
//!   [`PolicyError::Timeout`].
//! * Memory is capped per request across all of the component's memories;
//!   a refused `memory.grow` followed by a trap is
//!   [`PolicyError::OutOfMemory`].
//! * Host calls and subrequests are counted per request across all hooks.
//!   Interfaces with a `limit-exceeded` error variant (cache, kv, fetch)
//!   return it; the others trap ([`PolicyError::LimitExceeded`]).
//! * Invalid input from the guest (a bad header name, a relative URL, an
//!   unknown backend) comes back as the WIT error; an invalid handle or a
//!   call with no way to report an error (`set-method` with a bad token)
//!   traps.
//!
//! Cancellation: dropping a hook's future (a client went away) is safe;
//! the request or response head passed in is then left empty and the
//! [`PolicyCall`] refuses further hooks.

mod bindings;
mod call;
mod compact;
mod convert;
mod engine;
mod errors;
pub mod http_component;
mod imports;
mod limits;
mod load;
mod memo;
mod policy;
mod prewarm;
mod replay;
mod services;

#[cfg(test)]
mod tests;

pub use call::PolicyCall;
pub use engine::{EPOCH_TICK, PolicyEngine};
pub use errors::{Hook, PolicyError};
pub use limits::PolicyLimits;
pub use load::PolicySlot;
pub use memo::MemoStats;
pub use policy::{LoadedPolicy, PolicyHandle, PolicySource};
pub use prewarm::warm_request;
pub use services::{
    BodyBudget, CachedObject, FetchError, NewObject, PolicyServices, SubRequest, SubResponse,
};
