//! Inlay's HTTP model: the types every layer of the host shares.
//!
//! The pipeline, the cache, the ESI processor and the policy runtime all
//! speak in these terms, so none of them has to import another to talk
//! about a request:
//!
//! - [`RequestHead`] and [`ResponseHead`]: what a request and a response
//!   are while they pass through the phases (and what a policy edits);
//! - [`CacheSettings`], [`RequestAction`], [`SyntheticResponse`] and
//!   [`EsiOverrides`]: what a policy decides;
//! - [`CacheStatus`]: how a response was served, for `Cache-Status` and the
//!   access log;
//! - [`ProxyError`]: every failure of a request, and the one place where it
//!   becomes an HTTP status;
//! - [`body`]: the one body type ([`ProxyBody`]) every layer streams;
//! - [`headers`]: header rules every phase applies (hop-by-hop, `Via`,
//!   `X-Forwarded-For`);
//! - [`rendezvous`]: the one hash that picks a key's backend in a `shard`
//!   director and a key's owner node in a sharded cluster.
//! - [`LogLimit`]: the one budget of log lines for warnings a client or an
//!   origin can cause at will.
//! - [`ComponentSettings`]: what a component backend's requests may use,
//!   read by the config and run by the runtime.
//!
//! This crate depends on neither tokio nor wasmtime.

pub mod body;
pub mod component;
mod error;
mod head;
pub mod headers;
pub mod log_limit;
mod policy;
pub mod rendezvous;
pub mod server_timing;
mod status;

pub use body::{BoxError, ProxyBody};
pub use component::ComponentSettings;
pub use error::{Blame, ProxyError};
pub use head::{RequestHead, ResponseHead, path_and_query};
pub use log_limit::LogLimit;
pub use policy::{CacheSettings, EsiOverrides, RequestAction, SyntheticResponse};
pub use status::{CACHE_STATUS, CacheStatus, StaleReason};
