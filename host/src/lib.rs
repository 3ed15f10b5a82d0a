//! Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
//!
//! One `inlay` process sits in front of origin servers, as Varnish does. The
//! request's path through the host is [`pipeline`], one phase per file; the
//! accept loop and connection limits are in [`server`]; configuration in
//! [`config`].

pub mod access_log;
pub mod backend;
pub mod body;
pub mod cache;
pub mod cli;
pub mod codec;
pub mod config;
pub mod error;
pub mod esi;
pub mod headers;
pub mod pipeline;
pub mod policy_services;
pub mod runtime;
pub mod server;
